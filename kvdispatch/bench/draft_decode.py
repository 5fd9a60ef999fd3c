"""Multi-step draft decode's cases, ``draft_decode:BATCHxCONTEXTxSTEPSxTOPK[:pP]`` (page size P, default 1):
``create_draft_decode_kv_indices`` against draft-loop (SGLang's design) and one-step (the API building step 0
only: S steps against one); no plain PyTorch."""

from __future__ import annotations

import argparse
import functools

import torch

from kvdispatch import ops
import kvdispatch
from kvdispatch import grid

from .core import POISON, Case, Inputs, api_backend, baseline_kernels, dimensions, page_pool, requests

DRAFT_LOOP, ONE_STEP = "draft-loop", "one-step"
TRITON_BASELINES, SGLANG_BASELINE, IDEAL_BASELINE = (DRAFT_LOOP,), DRAFT_LOOP, None
API_VARIANTS, PLAIN_TORCH_CASES = (ONE_STEP,), "none"

# What ``core.legend`` says of its cases and of its baselines.
LEGEND_CASE = "draft_decode:BxCxSTEPSxTOPK[:pP]: multi-step draft decode"
LEGEND_IMPLS = "draft-loop (after SGLang); one-step: the API, step 0 only"
# Its cases in each set of ``core.case_set``.
CASES = {
    "GPU": ["draft_decode:64x4096x5x1", "draft_decode:64x4096x5x4", "draft_decode:16x4096x5x4:p16",
            "draft_decode:8x32768x3x1", "draft_decode:4x2048x5x1", "draft_decode:8x1024x3x4"],
    "GPU_QUICK": ["draft_decode:64x4096x5x4"],
    "GPU_REAL": ["draft_decode:64x131072x5x4:len=1024-8192"],
    "GPU_REAL_QUICK": ["draft_decode:64x131072x5x4:len=1024-8192"],
    "CPU": ["draft_decode:4x2048x3x2"],
    "CPU_QUICK": [],
}


def parse(shape: str, text: str) -> Case:
    usage = (f"a draft decode case is draft_decode:BATCHxCONTEXTxSTEPSxTOPK[:pP], e.g. "
             f"draft_decode:64x4096x5x4:p16; got {text!r}")
    shape, *options = shape.split(":")
    batch, context, steps, topk = dimensions(shape, 4, usage)
    try:
        page = int(options[0][1:]) if options else 1
    except ValueError:
        raise argparse.ArgumentTypeError(usage) from None
    if len(options) > 1 or (options and not options[0].startswith("p")):
        raise argparse.ArgumentTypeError(usage)
    if min(batch, context, steps, topk) < 1 or steps > 1024 or topk > 1024 or not 1 <= page <= 4096:
        raise argparse.ArgumentTypeError(f"case {text!r}: batch and context >= 1, steps and topk in [1, 1024], "
                                         "P in [1, 4096]")
    return Case(batch, context, page, "draft_decode", steps=steps, topk=topk)


def shape_name(case: Case) -> str:
    return (f"draft_decode:{case.batch}x{case.context}x{case.steps}x{case.topk}"
            + f":p{case.page_size}" * (case.page_size > 1))


def make_inputs(case: Case, device: torch.device, seed: int) -> Inputs:
    """As SGLang's draft workers hold a batch: a token-granular table on pages of ``case.page_size`` with room
    for every branch's draft pages, int64 pool indices, lengths and positions (the lengths repeated ``topk``
    times), an int64 ``out`` of ``batch * topk * (context + steps)`` columns per step, an int32 ``kv_indptr``;
    ``expected_one_step``: ``out`` after a build of step 0 only."""
    g = torch.Generator().manual_seed(seed)
    rows, pool, lengths = requests(case, g)
    owned = -(-(case.page_size - 1 + case.steps) // case.page_size) * case.page_size
    room = case.topk * owned + case.page_size  # the draft pages past a row's tokens
    req_to_token = page_pool(rows, case.context + room, case.page_size, g, device, lengths + room)
    seq_lens = lengths[pool].to(device)
    pool = pool.to(device)
    positions = seq_lens.repeat_interleave(case.topk)
    segments = case.batch * case.topk
    out = torch.full((case.steps, segments * (case.context + case.steps)), POISON, dtype=torch.int64, device=device)
    kv_indptr = torch.zeros((case.steps, segments + 1), dtype=torch.int32, device=device)
    options = dict(num_steps=case.steps, topk=case.topk, page_size=case.page_size, positions=positions)
    expected = ops.draft_decode.reference(req_to_token, pool, seq_lens, kv_indptr.clone(), out.clone(),
                                                    **options)
    one_step = ops.draft_decode.reference(req_to_token, pool, seq_lens, kv_indptr.clone(), out.clone(),
                                                    **dict(options, num_steps=1))
    return Inputs(req_to_token, pool, seq_lens, out, expected, kv_indptr, positions=positions,
                  expected_one_step=one_step)


def bind(impl: str, x: Inputs, case: Case):
    """A draft-decode build; the ``one-step`` one (the auto-selected backend, ``num_steps=1``) carries its
    own ``expected`` (only step 0 written)."""
    if impl == DRAFT_LOOP:
        return functools.partial(baseline_kernels().draft_loop, x.req_to_token, x.req_pool_indices, x.seq_lens,
                                 x.positions, x.out, x.kv_indptr, case.steps, case.topk, case.page_size)
    build = functools.partial(kvdispatch.create_draft_decode_kv_indices, x.req_to_token, x.req_pool_indices,
                              x.seq_lens, x.kv_indptr, x.out, num_steps=case.steps, topk=case.topk,
                              page_size=case.page_size, positions=x.positions, write_indptr_start=False,
                              round_toward_zero=True, backend=api_backend(impl))
    if impl == ONE_STEP:
        build = functools.partial(build, num_steps=1)
        build.expected = x.expected_one_step
    return build


def launch(case: Case, x: Inputs, budget: int | None) -> grid.Launch:
    batch, columns = x.req_pool_indices.shape[0], x.req_to_token.shape[1]
    return grid.draft_decode_launch(batch * case.topk, columns, x.out.shape[1], budget=budget)
