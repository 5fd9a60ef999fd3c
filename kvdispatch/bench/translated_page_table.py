"""The unified pool's translated page table's cases, ``translated_page_table:BATCHxCONTEXTxPAGE[:zero]``
(``:zero``: ``fill_value=0``, the columns past a row's pages zeroed, SGLang's ``zero_tail``):
``create_translated_page_table`` against v2p-sglang (SGLang's design, 256 columns per program), v2p-2d-grid (the
same on 2d-grid's page blocks), v2p-ideal on ``:len=`` cases, and plain PyTorch (``kvdispatch.reference``); a
``:zero`` case against read-table-sglang alone (SGLang 0.5.23's read-table kernel, zero tail in the launch)."""

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

V2P_SGLANG, V2P_GRID_2D, V2P_IDEAL, READ_TABLE = "v2p-sglang", "v2p-2d-grid", "v2p-ideal", "read-table-sglang"
TRITON_BASELINES, SGLANG_BASELINE, IDEAL_BASELINE = (V2P_GRID_2D, V2P_SGLANG), V2P_SGLANG, V2P_IDEAL
OPTION_BASELINES = (READ_TABLE,)
API_VARIANTS, PLAIN_TORCH_CASES = (), "all"

# What ``core.legend`` says of its cases and of its baselines.
LEGEND_CASE = ("translated_page_table:BATCHxCONTEXTxPAGE[:zero]: the unified pool's translated page table (:zero: "
               "fill_value=0, the tail past a row's pages zeroed)")
LEGEND_IMPLS = ("v2p-sglang: SGLang's translated-table design; v2p-2d-grid: it on 2d-grid's page blocks; :len= cases: "
                "v2p-ideal (v2p-sglang's); :zero cases: read-table-sglang alone, SGLang 0.5.23's read-table kernel "
                "(programs striding over a row's width, zero tail in the same launch)")
# Its cases in each set of ``core.case_set``.
CASES = {
    "GPU": ["translated_page_table:64x32768x64", "translated_page_table:256x8192x16",
            "translated_page_table:8x131072x1", "translated_page_table:64x32768x64:zero"],
    "GPU_QUICK": ["translated_page_table:64x32768x64"],
    "GPU_REAL": ["translated_page_table:256x1048576x64:len=mix", "translated_page_table:64x163840x16:len=1024-8192",
                 "translated_page_table:256x1048576x64:zero:len=mix"],
    "GPU_REAL_QUICK": ["translated_page_table:256x1048576x64:len=mix"],
    "CPU": ["translated_page_table:4x4096x16", "translated_page_table:4x4096x16:zero"],
    "CPU_QUICK": [],
}


def parse(shape: str, text: str) -> Case:
    shape, *options = shape.split(":")
    if options not in ([], ["zero"]):
        raise argparse.ArgumentTypeError(f"a translated page-table case is translated_page_table:BATCHxCONTEXTxPAGE"
                                         f"[:zero]; got {text!r}")
    return dataclasses.replace(page_table.parse(shape, text), op="translated_page_table", zero_tail=bool(options))


def shape_name(case: Case) -> str:
    return f"translated_page_table:{page_table.shape_name(case)}" + ":zero" * case.zero_tail


def option_baseline(case: Case) -> str | None:
    return READ_TABLE if case.zero_tail else None


def make_inputs(case: Case, device: torch.device, seed: int) -> Inputs:
    """SGLang's dtypes (int64 rows, int32 lengths); an int64 ``v2p`` of every virtual page in ``token_mapping``,
    one in 16 freed (-1); ``out`` int32 ``[batch, width]``; ``:zero``: ``fill_value=0``."""
    g, req_to_token, pool, seq_lens = shuffled_pool(case, device, seed, case.page_size, torch.int64)
    pages = int(req_to_token.max()) // case.page_size + 1
    out = torch.full((case.batch, case.width), POISON, dtype=torch.int32, device=device)
    lookup = torch.randint(0, pages * 4, (pages,), generator=g)
    lookup[torch.randperm(pages, generator=g)[: pages // 16]] = -1
    lookup = lookup.to(device)
    expected = ops.translated_page_table.reference(req_to_token, pool, seq_lens, lookup, out.clone(), case.page_size,
                                                   fill_value=_fill(case))
    return Inputs(req_to_token, pool, seq_lens, out, expected, token_mapping=lookup)


def _fill(case: Case) -> int | None:
    return 0 if case.zero_tail else None


def bind(impl: str, x: Inputs, case: Case):
    args = (x.req_to_token, x.req_pool_indices, x.seq_lens, x.token_mapping, x.out)
    if backend := api_backend(impl):
        return functools.partial(kvdispatch.create_translated_page_table, *args, page_size=case.page_size,
                                 fill_value=_fill(case), backend=backend)
    if impl == PLAIN_TORCH:
        return functools.partial(ops.translated_page_table.reference, *args, case.page_size, fill_value=_fill(case))
    if impl == READ_TABLE:
        return functools.partial(baseline_kernels().read_table_sglang, *args, case.page_size,
                                 zero_tail=case.zero_tail)
    columns = baseline_kernels().V2P_COLUMNS_PER_PROGRAM if impl in (V2P_SGLANG, V2P_IDEAL) else None
    return functools.partial(baseline_kernels().v2p_grid_2d, *args, case.page_size, columns_per_program=columns,
                             pages=ideal_pages(x, case) if impl == V2P_IDEAL else None)


def launch(case: Case, x: Inputs, budget: int | None) -> grid.Launch:
    return grid.mapped_page_table_launch(x.req_pool_indices.shape[0], x.out.shape[1], case.page_size, budget=budget)
