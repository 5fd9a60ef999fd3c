"""The merged token CSR's cases, ``merged_token_csr:BATCHxCONTEXT:eEXTEND`` (each request's prefix of up to
CONTEXT tokens, then EXTEND new ones): ``create_merged_kv_indices`` against unified-copy (SGLang's design: a
``torch.cumsum`` for the indptr, then one program per request) and plain PyTorch (``kvdispatch.reference``)."""

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

UNIFIED_COPY = "unified-copy"
TRITON_BASELINES, SGLANG_BASELINE, IDEAL_BASELINE = (UNIFIED_COPY,), UNIFIED_COPY, None
API_VARIANTS, PLAIN_TORCH_CASES = (), "all"

# What ``core.legend`` says of its cases and of its baselines.
LEGEND_CASE = "merged_token_csr:BATCHxCONTEXT:eEXTEND: a prefix CSR and an extend CSR merged row by row"
LEGEND_IMPLS = "unified-copy: SGLang's unified-extend design (a cumsum, then one program per request)"
# Its cases in each set of ``core.case_set``.
CASES = {
    "GPU": ["merged_token_csr:64x32768:e128", "merged_token_csr:256x4096:e8"],
    "GPU_QUICK": ["merged_token_csr:64x32768:e128"],
    "GPU_REAL": ["merged_token_csr:256x131072:e8:len=1024-8192"],
    "GPU_REAL_QUICK": ["merged_token_csr:256x131072:e8:len=1024-8192"],
    "CPU": ["merged_token_csr:4x4096:e16"],
    "CPU_QUICK": [],
}


def parse(shape: str, text: str) -> Case:
    shape, *options = shape.split(":")
    if len(options) != 1 or not options[0].startswith("e") or not options[0][1:].isdigit():
        raise argparse.ArgumentTypeError(f"a merged-CSR case is merged_token_csr:BATCHxCONTEXT:eEXTEND; got {text!r}")
    return dataclasses.replace(page_table.parse(f"{shape}x1", text), op="merged_token_csr", steps=int(options[0][1:]))


def shape_name(case: Case) -> str:
    return f"merged_token_csr:{case.batch}x{case.context}:e{case.steps}"


def make_inputs(case: Case, device: torch.device, seed: int) -> Inputs:
    """The shuffled pool's rows as the prefix CSR (int32 indptr, int64 entries, in ``req_to_token``'s and
    ``kv_indptr``'s places) and ``case.steps`` new slots per request as the extend CSR (int64, its starts in
    ``req_pool_indices``, its lengths in ``seq_lens``); ``out`` int64 for both, ``positions`` its indptr."""
    g, req_to_token, pool, seq_lens = shuffled_pool(case, device, seed, 1, torch.int64)
    lengths = seq_lens.long().cpu()
    rows = req_to_token[pool.cpu()].cpu()
    prefix = torch.cat([rows[b, : int(lengths[b])] for b in range(case.batch)]).long().to(device)
    prefix_indptr = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(lengths, 0)]).to(torch.int32).to(device)
    extend_lens = torch.full((case.batch,), case.steps, dtype=torch.int32, device=device)
    extend_start = torch.arange(0, case.batch * case.steps, case.steps, dtype=torch.int32, device=device)
    extend = torch.randint(0, 1 << 30, (case.batch * case.steps,), generator=g).to(device)
    out = torch.full((prefix.shape[0] + extend.shape[0],), POISON, dtype=torch.int64, device=device)
    indptr = torch.full((case.batch + 1,), POISON, dtype=torch.int64, device=device)
    expected = out.clone()
    ops.merged_token_csr.reference(prefix_indptr, prefix, extend_start, extend_lens, extend, indptr.clone(),
                                   expected)
    return Inputs(prefix, extend_start, extend_lens, out, expected, kv_indptr=prefix_indptr, token_mapping=extend,
                  positions=indptr)


def bind(impl: str, x: Inputs, case: Case):
    args = (x.kv_indptr, x.req_to_token, x.req_pool_indices, x.seq_lens, x.token_mapping, x.positions, x.out)
    if backend := api_backend(impl):
        return functools.partial(kvdispatch.create_merged_kv_indices, *args, backend=backend)
    if impl == PLAIN_TORCH:
        return functools.partial(ops.merged_token_csr.reference, *args)
    return functools.partial(baseline_kernels().unified_copy, *args)


def launch(case: Case, x: Inputs, budget: int | None) -> grid.Launch:
    span = max(min(x.req_to_token.shape[0] + x.token_mapping.shape[0], x.out.shape[0]), 1)
    return grid.token_csr_launch(x.seq_lens.shape[0], span, span, budget=budget)
