"""The ragged CSR's block table's cases, ``ragged_page_table:BATCHxCONTEXTxPAGE[:swa]`` (``:swa``: with its SWA
twin through ``full_to_swa``): ``create_ragged_page_table`` against ragged-2d-grid (SGLang's Aiter design),
ragged-ideal on ``:len=`` cases, and plain PyTorch (``kvdispatch.reference``)."""

from __future__ import annotations

import argparse
import dataclasses
import functools

import torch

from kvdispatch import ops
import kvdispatch
from kvdispatch import grid

from . import page_table
from .core import PLAIN_TORCH, POISON, Case, Inputs, api_backend, baseline_kernels, ideal_pages, shuffled_pool

RAGGED_GRID_2D, RAGGED_IDEAL = "ragged-2d-grid", "ragged-ideal"
TRITON_BASELINES, SGLANG_BASELINE, IDEAL_BASELINE = (RAGGED_GRID_2D,), RAGGED_GRID_2D, RAGGED_IDEAL
API_VARIANTS, PLAIN_TORCH_CASES = (), "all"

# What ``core.legend`` says of its cases and of its baselines.
LEGEND_CASE = "ragged_page_table:BATCHxCONTEXTxPAGE[:swa]: the block table of a ragged token CSR (its SWA twin)"
LEGEND_IMPLS = "ragged-2d-grid: SGLang's Aiter unified-table design; :len= cases: ragged-ideal"
# Its cases in each set of ``core.case_set``.
CASES = {
    "GPU": ["ragged_page_table:64x32768x16", "ragged_page_table:64x32768x16:swa", "ragged_page_table:8x131072x1"],
    "GPU_QUICK": ["ragged_page_table:64x32768x16:swa"],
    "GPU_REAL": ["ragged_page_table:256x1048576x16:swa:len=1024-8192", "ragged_page_table:64x131072x1:len=mix"],
    "GPU_REAL_QUICK": ["ragged_page_table:256x1048576x16:swa:len=1024-8192"],
    "CPU": ["ragged_page_table:4x4096x16:swa"],
    "CPU_QUICK": [],
}


def parse(shape: str, text: str) -> Case:
    shape, *options = shape.split(":")
    if options not in ([], ["swa"]):
        raise argparse.ArgumentTypeError(f"a ragged page-table case is ragged_page_table:BATCHxCONTEXTxPAGE[:swa]; "
                                         f"got {text!r}")
    return dataclasses.replace(page_table.parse(shape, text), op="ragged_page_table", mapping=bool(options))


def shape_name(case: Case) -> str:
    return f"ragged_page_table:{page_table.shape_name(case)}" + ":swa" * case.mapping


def make_inputs(case: Case, device: torch.device, seed: int) -> Inputs:
    """The shuffled pool's rows as a token CSR (int32 ``kv_indices`` in ``req_to_token``'s place, int32
    ``kv_indptr``); with SWA, an int64 ``full_to_swa`` of every slot in ``token_mapping`` and ``out`` (int32
    ``[2 * batch, width]``) the page table's rows, then the SWA table's: one poisoned buffer, the row stride
    shared, as SGLang's kernel assumes."""
    g, req_to_token, pool, seq_lens = shuffled_pool(case, device, seed, case.page_size, torch.int64)
    lengths = seq_lens.long().cpu()
    rows = req_to_token[pool.cpu()].cpu()
    kv_indices = torch.cat([rows[b, : int(lengths[b])] for b in range(case.batch)]).to(device)
    kv_indptr = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(lengths, 0)]).to(torch.int32).to(device)
    slots = (int(req_to_token.max()) // case.page_size + 1) * case.page_size
    out = torch.full((case.batch * (2 if case.mapping else 1), case.width), POISON, dtype=torch.int32,
                     device=device)
    expected = out.clone()
    lookup = torch.randint(0, slots, (slots,), generator=g).to(device) if case.mapping else None
    ops.ragged_page_table.reference(kv_indices, kv_indptr, expected[: case.batch], case.page_size,
                                    expected[case.batch:] if case.mapping else None, lookup, True)
    return Inputs(kv_indices, pool, seq_lens, out, expected, kv_indptr=kv_indptr, token_mapping=lookup)


def bind(impl: str, x: Inputs, case: Case):
    args = (x.req_to_token, x.kv_indptr)
    tables = (x.out[: case.batch], x.out[case.batch:] if case.mapping else None, x.token_mapping)
    if backend := api_backend(impl):
        return functools.partial(kvdispatch.create_ragged_page_table, *args, tables[0], page_size=case.page_size,
                                 swa_page_table=tables[1], full_to_swa=tables[2], round_toward_zero=True,
                                 backend=backend)
    if impl == PLAIN_TORCH:
        return functools.partial(ops.ragged_page_table.reference, *args, tables[0], case.page_size, *tables[1:], True)
    return functools.partial(baseline_kernels().ragged_grid_2d, *args, tables[0], case.page_size, *tables[1:],
                             pages=ideal_pages(x, case) if impl == RAGGED_IDEAL else None)


def launch(case: Case, x: Inputs, budget: int | None) -> grid.Launch:
    return grid.mapped_page_table_launch(x.kv_indptr.shape[0] - 1, x.out.shape[1], case.page_size, budget=budget)
