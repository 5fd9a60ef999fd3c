"""The page table's cases, ``BATCHxCONTEXTxPAGE`` (``page_table:`` in front too): ``create_flashmla_kv_indices``
against naive-loop, 2d-grid (SGLang's design), 2d-ideal on ``:len=`` cases, and plain PyTorch."""

from __future__ import annotations

import argparse
import functools

import torch

from kvdispatch import ops
import kvdispatch
from kvdispatch import grid

from .core import (NAIVE, PLAIN_TORCH, POISON, Case, Inputs, api_backend, baseline_kernels, case_modules, dimensions,
                   ideal_pages, shuffled_pool)

GRID_2D, GRID_IDEAL = "2d-grid", "2d-ideal"
TRITON_BASELINES, SGLANG_BASELINE, IDEAL_BASELINE = (NAIVE, GRID_2D), GRID_2D, GRID_IDEAL
API_VARIANTS, PLAIN_TORCH_CASES = (), "all"

# What ``core.legend`` says of its cases and of its baselines.
LEGEND_CASE = "BATCHxCONTEXTxPAGE (or page_table:...): page table (requests, tokens per request, page size)"
LEGEND_IMPLS = ("naive-loop: Triton, one program per request looping over its pages; 2d-grid: Triton on a (request, "
                "page block) grid after SGLang; :len= cases: 2d-ideal")
# Its cases in each set of ``core.case_set``.
CASES = {
    "GPU": ["1x131072x64", "64x32768x64", "1x131072x1", "256x32768x1", "1x4096x64", "1x32768x64", "8x131072x64",
            "256x8192x64", "512x4096x64", "64x32768x16"],
    "GPU_QUICK": ["1x131072x64", "64x32768x64", "1x131072x1", "256x32768x1"],
    "GPU_REAL": ["256x1048576x64:len=1024-8192", "256x1048576x64:len=mix", "1x1048576x64:len=1024-8192",
                 "64x131072x1:len=mix", "256x163840x16:len=1024-8192"],
    "GPU_REAL_QUICK": ["256x1048576x64:len=1024-8192"],
    "CPU": ["1x4096x64", "1x32768x64", "1x131072x64", "1x131072x1", "8x4096x1", "64x4096x64", "4x8192x16",
            "4x8192x16:len=mix"],
    "CPU_QUICK": ["1x4096x64", "2x4096x1", "2x16384x64:len=256-2048"],
}


def parse(shape: str, text: str) -> Case:
    ops = ", ".join(op for op in case_modules() if op != "page_table")
    usage = f"a case is BATCHxCONTEXTxPAGE, e.g. 64x32768x64, or OP:SHAPE with OP one of {ops}; got {text!r}"
    batch, context, page = dimensions(shape, 3, usage)
    if batch < 1 or context < 1 or not 1 <= page <= 4096:
        raise argparse.ArgumentTypeError(f"case {text!r}: batch and context >= 1, page in [1, 4096]")
    return Case(batch, context, page)


def shape_name(case: Case) -> str:
    return f"{case.batch}x{case.context}x{case.page_size}"


def bytes_moved(case: Case) -> int | None:
    """Page-1 cases: bytes read and written by one build (a slot read and a page id written per page, plus the
    inputs), for the GB/s column; None otherwise."""
    return case.batch * (case.width * 8 + 8) if case.page_size == 1 else None


def make_inputs(case: Case, device: torch.device, seed: int) -> Inputs:
    """int32 inputs; ``out`` int32 ``[batch, width]``."""
    _, req_to_token, pool, seq_lens = shuffled_pool(case, device, seed, case.page_size)
    out = torch.full((case.batch, case.width), POISON, dtype=torch.int32, device=device)
    expected = ops.page_table.reference(req_to_token, pool, seq_lens, out.clone(), case.page_size)
    return Inputs(req_to_token, pool, seq_lens, out, expected)


def plain_torch(req_to_token, req_pool_indices, seq_lens, out, page_size):
    """The page table in the few PyTorch ops an engine would write (valid, full-length data only)."""
    pages = torch.arange(out.shape[1], device=out.device)
    slots = req_to_token[req_pool_indices[:, None].long(), pages * page_size]
    valid = pages < (seq_lens[:, None] + page_size - 1) // page_size
    rows = out[: req_pool_indices.shape[0]]
    rows.copy_(torch.where(valid, slots // page_size, rows))


def bind(impl: str, x: Inputs, case: Case):
    args = (x.req_to_token, x.req_pool_indices, x.seq_lens, x.out)
    if backend := api_backend(impl):
        return functools.partial(kvdispatch.create_flashmla_kv_indices, *args, page_size=case.page_size,
                                 backend=backend)
    if impl == PLAIN_TORCH:
        return functools.partial(plain_torch, *args, case.page_size)
    if impl == GRID_IDEAL:
        return functools.partial(baseline_kernels().grid_2d, *args, case.page_size, pages=ideal_pages(x, case))
    function = {NAIVE: "naive_loop", GRID_2D: "grid_2d"}[impl]
    return functools.partial(getattr(baseline_kernels(), function), *args, case.page_size)


def launch(case: Case, x: Inputs, budget: int | None) -> grid.Launch:
    return grid.page_table_launch(x.req_pool_indices.shape[0], x.out.shape[1], case.page_size, budget=budget)
