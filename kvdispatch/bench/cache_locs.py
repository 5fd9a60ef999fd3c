"""Speculative cache locations' cases, ``cache_locs:BATCHxCONTEXTxWIDTH[:packed]``: each request's ``WIDTH``
draft slots past its tokens (``:packed``: ragged slices of 1 to ``WIDTH`` slots, packed), the verify step's
``out_cache_loc``. ``create_cache_locs`` against extend-loop (SGLang's design) and plain PyTorch."""

from __future__ import annotations

import argparse
import functools

import torch

from kvdispatch import ops
import kvdispatch
from kvdispatch import grid

from .core import PLAIN_TORCH, POISON, Case, Inputs, api_backend, baseline_kernels, dimensions, page_pool, requests

EXTEND_LOOP = "extend-loop"
TRITON_BASELINES, SGLANG_BASELINE, IDEAL_BASELINE = (EXTEND_LOOP,), EXTEND_LOOP, None
API_VARIANTS, PLAIN_TORCH_CASES = (), "all"

# What ``core.legend`` says of its cases and of its baselines.
LEGEND_CASE = "cache_locs:BxCxWIDTH[:packed]: speculative cache locations (ragged slices, packed)"
LEGEND_IMPLS = "extend-loop: SGLang's cache-location design"
# Its cases in each set of ``core.case_set``.
CASES = {
    "GPU": ["cache_locs:64x4096x8", "cache_locs:256x4096x8:packed", "cache_locs:8x32768x64:packed"],
    "GPU_QUICK": ["cache_locs:256x4096x8:packed"],
    "GPU_REAL": ["cache_locs:256x1048576x8:packed:len=1024-8192", "cache_locs:64x131072x4:len=mix"],
    "GPU_REAL_QUICK": ["cache_locs:256x1048576x8:packed:len=1024-8192"],
    "CPU": ["cache_locs:4x2048x8:packed"],
    "CPU_QUICK": [],
}


def parse(shape: str, text: str) -> Case:
    usage = (f"a cache-locations case is cache_locs:BATCHxCONTEXTxWIDTH[:packed], e.g. cache_locs:64x4096x8; "
             f"got {text!r}")
    shape, *options = shape.split(":")
    batch, context, width = dimensions(shape, 3, usage)
    if options not in ([], ["packed"]) or min(batch, context, width) < 1:
        raise argparse.ArgumentTypeError(usage)
    return Case(batch, context, 1, "cache_locs", mapping=bool(options), steps=width)


def shape_name(case: Case) -> str:
    return f"cache_locs:{case.batch}x{case.context}x{case.steps}" + ":packed" * case.mapping


def make_inputs(case: Case, device: torch.device, seed: int) -> Inputs:
    """As SGLang's verify step holds a batch: a table ``context + WIDTH`` wide on shuffled slots, int64 pool
    indices and starts (the requests' lengths, ``seq_lens``), an int64 ``out`` of ``batch * WIDTH`` entries;
    packed, ``positions`` holds the ends (int64, ``start + 1 .. start + WIDTH``)."""
    g = torch.Generator().manual_seed(seed)
    rows, pool, lengths = requests(case, g)
    req_to_token = page_pool(rows, case.context + case.steps, 1, g, device, lengths + case.steps)
    start = lengths[pool].to(device)
    pool = pool.to(device)
    end = start + torch.randint(1, case.steps + 1, (case.batch,), generator=g).to(device) if case.mapping else None
    out = torch.full((case.batch * case.steps,), POISON, dtype=torch.int64, device=device)
    expected = ops.cache_locs.reference(req_to_token, pool, start, out.clone(), end,
                                        None if case.mapping else case.steps)
    return Inputs(req_to_token, pool, start, out, expected, positions=end)


def bind(impl: str, x: Inputs, case: Case):
    width = None if case.mapping else case.steps
    if backend := api_backend(impl):
        return functools.partial(kvdispatch.create_cache_locs, x.req_to_token, x.req_pool_indices, x.seq_lens, x.out,
                                 end_offset=x.positions, width=width, backend=backend)
    if impl == PLAIN_TORCH:
        return functools.partial(ops.cache_locs.reference, x.req_to_token, x.req_pool_indices, x.seq_lens, x.out,
                                 x.positions, width)
    end = x.positions if case.mapping else x.seq_lens + case.steps
    return functools.partial(baseline_kernels().extend_loop, x.req_to_token, x.req_pool_indices, x.seq_lens, end,
                             x.out)


def launch(case: Case, x: Inputs, budget: int | None) -> grid.Launch:
    return grid.cache_locs_launch(x.req_pool_indices.shape[0], x.req_to_token.shape[1], x.out.shape[0], budget=budget)
