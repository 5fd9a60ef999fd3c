"""The speculative prefix-then-expand table's cases, ``spec_concat_page_table:BATCHxCONTEXT:dDRAFT`` (page size
1, a 5-token expand row per draft token): ``create_spec_concat_page_table`` against concat-2d-grid (SGLang's
design) and plain PyTorch (``kvdispatch.reference``)."""

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

CONCAT_GRID_2D = "concat-2d-grid"
TRITON_BASELINES, SGLANG_BASELINE, IDEAL_BASELINE = (CONCAT_GRID_2D,), CONCAT_GRID_2D, None
API_VARIANTS, PLAIN_TORCH_CASES = (), "all"
EXPAND = 5  # the expand row's width (decode_length)

# What ``core.legend`` says of its cases and of its baselines.
LEGEND_CASE = "spec_concat_page_table:BATCHxCONTEXT:dDRAFT: each draft token's prefix row then its expand row"
LEGEND_IMPLS = "concat-2d-grid: SGLang's SWA speculative page-table design"
# Its cases in each set of ``core.case_set``.
CASES = {
    "GPU": ["spec_concat_page_table:64x32768:d4", "spec_concat_page_table:256x8192:d2"],
    "GPU_QUICK": ["spec_concat_page_table:64x32768:d4"],
    "GPU_REAL": ["spec_concat_page_table:128x131072:d4:len=1024-8192"],
    "GPU_REAL_QUICK": ["spec_concat_page_table:128x131072:d4:len=1024-8192"],
    "CPU": ["spec_concat_page_table:4x4096:d2"],
    "CPU_QUICK": [],
}


def parse(shape: str, text: str) -> Case:
    shape, *options = shape.split(":")
    if len(options) != 1 or not options[0].startswith("d") or not options[0][1:].isdigit() or options[0] == "d0":
        raise argparse.ArgumentTypeError(f"a speculative concat case is spec_concat_page_table:BATCHxCONTEXT:dDRAFT; "
                                         f"got {text!r}")
    return dataclasses.replace(page_table.parse(f"{shape}x1", text), op="spec_concat_page_table",
                               steps=int(options[0][1:]))


def shape_name(case: Case) -> str:
    return f"spec_concat_page_table:{case.batch}x{case.context}:d{case.steps}"


def make_inputs(case: Case, device: torch.device, seed: int) -> Inputs:
    """The shuffled pool's rows as the prefix table (``req_to_token``'s place; its lengths in ``seq_lens``), an
    expand table of ``EXPAND`` columns per draft token (``token_mapping``; its lengths in ``positions``), ``out``
    int32 ``[batch * draft, context + EXPAND]``."""
    g, req_to_token, pool, seq_lens = shuffled_pool(case, device, seed, 1)
    prefix = req_to_token[pool.long()].contiguous()
    rows = case.batch * case.steps
    expand = torch.randint(0, 1 << 30, (rows, EXPAND), generator=g).to(torch.int32).to(device)
    expand_lens = torch.randint(1, EXPAND + 1, (rows,), generator=g).to(torch.int32).to(device)
    out = torch.full((rows, case.width + EXPAND), POISON, dtype=torch.int32, device=device)
    expected = out.clone()
    ops.spec_concat_page_table.reference(prefix, expand, seq_lens, expand_lens, expected, case.steps)
    return Inputs(prefix, pool, seq_lens, out, expected, token_mapping=expand, positions=expand_lens)


def bind(impl: str, x: Inputs, case: Case):
    args = (x.req_to_token, x.token_mapping, x.seq_lens, x.positions, x.out)
    if backend := api_backend(impl):
        return functools.partial(kvdispatch.create_spec_concat_page_table, *args, draft_tokens=case.steps,
                                 backend=backend)
    if impl == PLAIN_TORCH:
        return functools.partial(ops.spec_concat_page_table.reference, *args, case.steps)
    return functools.partial(baseline_kernels().concat_grid_2d, *args, case.steps)


def launch(case: Case, x: Inputs, budget: int | None) -> grid.Launch:
    return grid.mapped_page_table_launch(x.positions.shape[0], x.out.shape[1], 1, budget=budget)
