"""The prefill-aware sliding-window token table's cases, ``pa_swa_table:BATCHxCONTEXT:wWINDOW`` (page size 1):
``create_prefill_aware_swa_table`` against pa-loop (SGLang's design, one program per request) and plain PyTorch
(``kvdispatch.reference``); each request's prefill is a random share of its length."""

from __future__ import annotations

import argparse
import dataclasses
import functools

import torch

from kvdispatch import ops
import kvdispatch
from kvdispatch import grid

from . import page_table
from .core import PLAIN_TORCH, POISON, Case, Inputs, api_backend, baseline_kernels, shuffled_pool

PA_LOOP = "pa-loop"
TRITON_BASELINES, SGLANG_BASELINE, IDEAL_BASELINE = (PA_LOOP,), PA_LOOP, None
API_VARIANTS, PLAIN_TORCH_CASES = (), "all"

# What ``core.legend`` says of its cases and of its baselines.
LEGEND_CASE = "pa_swa_table:BATCHxCONTEXT:wWINDOW: the prefill-aware sliding-window token table"
LEGEND_IMPLS = "pa-loop: SGLang's prefill-aware table design (one program per request)"
# Its cases in each set of ``core.case_set``.
CASES = {
    "GPU": ["pa_swa_table:64x32768:w4096", "pa_swa_table:256x8192:w1024"],
    "GPU_QUICK": ["pa_swa_table:64x32768:w4096"],
    "GPU_REAL": ["pa_swa_table:256x131072:w4096:len=1024-8192"],
    "GPU_REAL_QUICK": ["pa_swa_table:256x131072:w4096:len=1024-8192"],
    "CPU": ["pa_swa_table:4x4096:w512"],
    "CPU_QUICK": [],
}


def parse(shape: str, text: str) -> Case:
    shape, *options = shape.split(":")
    if len(options) != 1 or not options[0].startswith("w") or not options[0][1:].isdigit():
        raise argparse.ArgumentTypeError(f"a prefill-aware table case is pa_swa_table:BATCHxCONTEXT:wWINDOW; "
                                         f"got {text!r}")
    case = page_table.parse(f"{shape}x1", text)
    return dataclasses.replace(case, op="pa_swa_table", steps=int(options[0][1:]))


def shape_name(case: Case) -> str:
    return f"pa_swa_table:{case.batch}x{case.context}:w{case.steps}"


def make_inputs(case: Case, device: torch.device, seed: int) -> Inputs:
    """SGLang's dtypes (int64 rows and lengths); ``prefill_lens`` (int32, by pool index, in ``token_mapping``) a
    random share of each row's length; ``out`` int32 ``[batch, width]``, its lengths in ``positions``."""
    g, req_to_token, pool, seq_lens = shuffled_pool(case, device, seed, 1, torch.int64)
    prefill = torch.zeros(req_to_token.shape[0], dtype=torch.int32)
    share = torch.rand(case.batch, generator=g)
    prefill[pool.cpu()] = (seq_lens.cpu().double() * share).to(torch.int32)
    prefill = prefill.to(device)
    seq_lens = seq_lens.long()
    out = torch.full((case.batch, case.width), POISON, dtype=torch.int32, device=device)
    kv_lens = torch.full((case.batch,), POISON, dtype=torch.int32, device=device)
    expected = out.clone()
    ops.pa_swa_table.reference(req_to_token, pool, seq_lens, prefill, expected, kv_lens.clone(), case.steps)
    return Inputs(req_to_token, pool, seq_lens, out, expected, token_mapping=prefill, positions=kv_lens)


def bind(impl: str, x: Inputs, case: Case):
    args = (x.req_to_token, x.req_pool_indices, x.seq_lens, x.token_mapping, x.out, x.positions)
    if backend := api_backend(impl):
        return functools.partial(kvdispatch.create_prefill_aware_swa_table, *args, window_size=case.steps,
                                 backend=backend)
    if impl == PLAIN_TORCH:
        return functools.partial(ops.pa_swa_table.reference, *args, case.steps)
    return functools.partial(baseline_kernels().pa_loop, *args, case.steps)


def launch(case: Case, x: Inputs, budget: int | None) -> grid.Launch:
    return grid.mapped_page_table_launch(x.req_pool_indices.shape[0], x.out.shape[1], 1, budget=budget)
