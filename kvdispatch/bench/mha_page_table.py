"""The TRT-LLM MHA page table's cases, ``mha_page_table:BATCHxCONTEXTxPAGE[:swa]`` (``:swa``: with its SWA twin
through ``full_to_swa``): ``create_trtllm_mha_page_table`` against mha-2d-grid (SGLang's design), mha-ideal on
``:len=`` cases, and plain PyTorch (``kvdispatch.reference``)."""

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

MHA_GRID_2D, MHA_IDEAL = "mha-2d-grid", "mha-ideal"
TRITON_BASELINES, SGLANG_BASELINE, IDEAL_BASELINE = (MHA_GRID_2D,), MHA_GRID_2D, MHA_IDEAL
API_VARIANTS, PLAIN_TORCH_CASES = (), "all"

# What ``core.legend`` says of its cases and of its baselines.
LEGEND_CASE = "mha_page_table:BATCHxCONTEXTxPAGE[:swa]: the TRT-LLM MHA page table (its SWA twin)"
LEGEND_IMPLS = "mha-2d-grid: SGLang's MHA-table design; :len= cases: mha-ideal"
# Its cases in each set of ``core.case_set``.
CASES = {
    "GPU": ["mha_page_table:64x32768x64", "mha_page_table:64x32768x64:swa", "mha_page_table:256x8192x16:swa",
            "mha_page_table:8x131072x1"],
    "GPU_QUICK": ["mha_page_table:64x32768x64:swa"],
    "GPU_REAL": ["mha_page_table:256x1048576x64:swa:len=1024-8192", "mha_page_table:64x131072x1:len=mix"],
    "GPU_REAL_QUICK": ["mha_page_table:256x1048576x64:swa:len=1024-8192"],
    "CPU": ["mha_page_table:4x4096x16:swa"],
    "CPU_QUICK": [],
}


def parse(shape: str, text: str) -> Case:
    shape, *options = shape.split(":")
    if options not in ([], ["swa"]):
        raise argparse.ArgumentTypeError(f"an MHA page-table case is mha_page_table:BATCHxCONTEXTxPAGE[:swa]; "
                                         f"got {text!r}")
    return dataclasses.replace(page_table.parse(shape, text), op="mha_page_table", mapping=bool(options))


def shape_name(case: Case) -> str:
    return f"mha_page_table:{page_table.shape_name(case)}" + ":swa" * case.mapping


def make_inputs(case: Case, device: torch.device, seed: int) -> Inputs:
    """SGLang's dtypes (int64 rows, int32 lengths); with SWA, an int64 ``full_to_swa`` of every slot in
    ``token_mapping`` and ``out`` (int32 ``[2 * batch, width]``) the page table's rows, then the SWA table's: one
    poisoned buffer, the row stride shared, as SGLang's kernel assumes."""
    g, req_to_token, pool, seq_lens = shuffled_pool(case, device, seed, case.page_size, torch.int64)
    slots = (int(req_to_token.max()) // case.page_size + 1) * case.page_size
    out = torch.full((case.batch * (2 if case.mapping else 1), case.width), POISON, dtype=torch.int32,
                     device=device)
    expected = out.clone()
    lookup = torch.randint(0, slots, (slots,), generator=g).to(device) if case.mapping else None
    ops.mha_page_table.reference(req_to_token, pool, seq_lens, expected[: case.batch], case.page_size,
                                   expected[case.batch:] if case.mapping else None, lookup, True)
    return Inputs(req_to_token, pool, seq_lens, out, expected, token_mapping=lookup)


def bind(impl: str, x: Inputs, case: Case):
    args = (x.req_to_token, x.req_pool_indices, x.seq_lens)
    tables = (x.out[: case.batch], x.out[case.batch:] if case.mapping else None, x.token_mapping)
    if backend := api_backend(impl):
        return functools.partial(kvdispatch.create_trtllm_mha_page_table, *args, tables[0], page_size=case.page_size,
                                 swa_page_table=tables[1], full_to_swa=tables[2], round_toward_zero=True,
                                 backend=backend)
    if impl == PLAIN_TORCH:
        return functools.partial(ops.mha_page_table.reference, *args, tables[0], case.page_size, *tables[1:], True)
    return functools.partial(baseline_kernels().mha_grid_2d, *args, tables[0], case.page_size, *tables[1:],
                             pages=ideal_pages(x, case) if impl == MHA_IDEAL else None)


def launch(case: Case, x: Inputs, budget: int | None) -> grid.Launch:
    return grid.mapped_page_table_launch(x.req_pool_indices.shape[0], x.out.shape[1], case.page_size, budget=budget)
