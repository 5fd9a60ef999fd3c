"""One decode-context-parallel rank's block table, ``dcp_page_table:BATCHxCONTEXTxPAGExDCP`` (rank DCP - 1 of
DCP): ``create_dcp_page_table`` against dcp-2d-grid (SGLang's design), dcptable-ideal on ``:len=`` cases, and
plain PyTorch."""

from __future__ import annotations

import functools

import torch

from kvdispatch import ops
import kvdispatch
from kvdispatch import grid

from .core import (PLAIN_TORCH, POISON, Case, Inputs, api_backend, baseline_kernels, dimensions, ideal_pages,
                   shuffled_pool)
from .dcp_token_csr import check_sizes

DCP_GRID, DCP_IDEAL = "dcp-2d-grid", "dcptable-ideal"
TRITON_BASELINES, SGLANG_BASELINE, IDEAL_BASELINE = (DCP_GRID,), DCP_GRID, DCP_IDEAL
API_VARIANTS, PLAIN_TORCH_CASES = (), "all"

# What ``core.legend`` says of its cases and of its baselines.
LEGEND_CASE = "dcp_page_table:BxCxPxD: DCP rank D-1's page table"
LEGEND_IMPLS = "dcp-2d-grid: the 2-D design for it; :len= cases: dcptable-ideal"
# Its cases in each set of ``core.case_set``.
CASES = {
    "GPU": ["dcp_page_table:64x32768x64x4", "dcp_page_table:1x131072x64x8", "dcp_page_table:256x32768x16x2",
            "dcp_page_table:64x32768x1x8"],
    "GPU_QUICK": ["dcp_page_table:64x32768x64x4"],
    "GPU_REAL": ["dcp_page_table:256x1048576x64x4:len=1024-8192", "dcp_page_table:64x131072x1x8:len=mix"],
    "GPU_REAL_QUICK": [],
    "CPU": ["dcp_page_table:8x4096x16x4"],
    "CPU_QUICK": [],
}


def parse(shape: str, text: str) -> Case:
    usage = (f"a DCP block-table case is dcp_page_table:BATCHxCONTEXTxPAGExDCP, e.g. dcp_page_table:64x32768x64x4; "
             f"got {text!r}")
    batch, context, page, dcp_size = dimensions(shape, 4, usage)
    check_sizes(batch, context, page, dcp_size, text)
    return Case(batch, context, page, "dcp_page_table", dcp_size=dcp_size)


def shape_name(case: Case) -> str:
    return f"dcp_page_table:{case.batch}x{case.context}x{case.page_size}x{case.dcp_size}"


def make_inputs(case: Case, device: torch.device, seed: int) -> Inputs:
    """A pool of virtual pages of ``page_size * dcp_size`` slots; built for the last rank (the one whose first
    position is farthest from 0), its lengths from ``dcp_local_lengths``; ``out`` int32 ``[batch, width]``."""
    _, req_to_token, pool, seq_lens = shuffled_pool(case, device, seed, case.page_size * case.dcp_size)
    rank = case.dcp_size - 1
    local = kvdispatch.dcp_local_lengths(seq_lens, case.dcp_size, rank)
    out = torch.full((case.batch, case.width), POISON, dtype=torch.int32, device=device)
    expected = ops.dcp_page_table.reference(req_to_token, pool, local, out.clone(), case.page_size, case.dcp_size,
                                              rank)
    return Inputs(req_to_token, pool, local, out, expected, dcp_rank=rank)


def plain_torch(req_to_token, req_pool_indices, local_seq_lens, out, page_size, dcp_size, dcp_rank):
    """One DCP rank's block table in the few PyTorch ops an engine would write (valid, full-length data only)."""
    pages = torch.arange(out.shape[1], device=out.device)
    slots = req_to_token[req_pool_indices[:, None].long(), dcp_rank + pages * (page_size * dcp_size)]
    valid = pages < (local_seq_lens[:, None] + page_size - 1) // page_size
    rows = out[: req_pool_indices.shape[0]]
    rows.copy_(torch.where(valid, slots // (page_size * dcp_size), rows))


def bind(impl: str, x: Inputs, case: Case):
    args = (x.req_to_token, x.req_pool_indices, x.seq_lens, x.out)
    if backend := api_backend(impl):
        return functools.partial(kvdispatch.create_dcp_page_table, *args, page_size=case.page_size,
                                 dcp_size=case.dcp_size, dcp_rank=x.dcp_rank, backend=backend)
    dcp = (case.page_size, case.dcp_size, x.dcp_rank)
    if impl == PLAIN_TORCH:
        return functools.partial(plain_torch, *args, *dcp)
    pages = ideal_pages(x, case) if impl == DCP_IDEAL else None
    return functools.partial(baseline_kernels().dcp_grid_2d, *args, *dcp, pages=pages)


def launch(case: Case, x: Inputs, budget: int | None) -> grid.Launch:
    return grid.dcp_page_table_launch(x.req_pool_indices.shape[0], x.out.shape[1], case.page_size, budget=budget)
