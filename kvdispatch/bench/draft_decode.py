"""Multi-step draft decode's cases, ``draft_decode:BATCHxCONTEXTxSTEPSxTOPK[:pP][:eE][:wN]`` (page size P, default
1; ``:eE``: a page-granular table of E tokens an entry, ``entry_page_size``; ``:wN``: the per-step sliding window
of N tokens, ``step_window``): ``create_draft_decode_kv_indices`` against draft-loop (SGLang's design; on ``:eE``
cases draft-entry-loop, on ``:wN`` cases draft-window-loop, SGLang 0.5.23's kernels for them) and one-step (the
API building step 0 only: S steps against one); no plain PyTorch."""

from __future__ import annotations

import argparse
import functools
import math

import torch

from kvdispatch import ops
import kvdispatch
from kvdispatch import grid

from .core import POISON, Case, Inputs, api_backend, baseline_kernels, dimensions, page_pool, requests

DRAFT_LOOP, ONE_STEP, DRAFT_ENTRY, DRAFT_WINDOW = "draft-loop", "one-step", "draft-entry-loop", "draft-window-loop"
TRITON_BASELINES, SGLANG_BASELINE, IDEAL_BASELINE = (DRAFT_LOOP,), DRAFT_LOOP, None
OPTION_BASELINES = (DRAFT_ENTRY, DRAFT_WINDOW)
API_VARIANTS, PLAIN_TORCH_CASES = (ONE_STEP,), "none"

# What ``core.legend`` says of its cases and of its baselines.
LEGEND_CASE = ("draft_decode:BxCxSTEPSxTOPK[:pP][:eE][:wN]: multi-step draft decode (:eE: a page-granular table of "
               "E tokens an entry; :wN: the per-step sliding window of N tokens)")
LEGEND_IMPLS = ("draft-loop (after SGLang); :eE cases: draft-entry-loop in its place, it on the page-granular "
                "table (SGLang's ENTRY_PAGE_SIZE); :wN cases: draft-window-loop, after SGLang 0.5.23's per-step "
                "window kernel; one-step: the API, step 0 only")
# Its cases in each set of ``core.case_set``.
CASES = {
    "GPU": ["draft_decode:64x4096x5x1", "draft_decode:64x4096x5x4", "draft_decode:16x4096x5x4:p16",
            "draft_decode:8x32768x3x1", "draft_decode:4x2048x5x1", "draft_decode:8x1024x3x4",
            "draft_decode:16x4096x5x4:p16:e16", "draft_decode:64x4096x5x4:w256"],
    "GPU_QUICK": ["draft_decode:64x4096x5x4"],
    "GPU_REAL": ["draft_decode:64x131072x5x4:len=1024-8192", "draft_decode:64x131072x5x4:p64:e64:len=1024-8192",
                 "draft_decode:64x131072x5x4:w4096:len=1024-8192"],
    "GPU_REAL_QUICK": ["draft_decode:64x131072x5x4:len=1024-8192"],
    "CPU": ["draft_decode:4x2048x3x2", "draft_decode:4x2048x3x2:p16:e16", "draft_decode:4x2048x3x2:w256"],
    "CPU_QUICK": [],
}


def parse(shape: str, text: str) -> Case:
    usage = (f"a draft decode case is draft_decode:BATCHxCONTEXTxSTEPSxTOPK[:pP][:eE][:wN], e.g. "
             f"draft_decode:64x4096x5x4:p16:e16 or draft_decode:64x4096x5x4:w256; got {text!r}")
    shape, *options = shape.split(":")
    batch, context, steps, topk = dimensions(shape, 4, usage)
    letters = [option[:1] for option in options]
    if len(set(letters)) < len(letters) or not set(letters) <= set("pew"):
        raise argparse.ArgumentTypeError(usage)
    try:
        page, entry, window = (int(next((o[1:] for o in options if o[:1] == letter), default))
                               for letter, default in (("p", 1), ("e", 1), ("w", 0)))
    except ValueError:
        raise argparse.ArgumentTypeError(usage) from None
    if (min(batch, context, steps, topk) < 1 or steps > 1024 or topk > 1024 or not 1 <= page <= 4096
            or not 1 <= entry <= 4096 or ("w" in letters and not 1 <= window < 2**31)):
        raise argparse.ArgumentTypeError(f"case {text!r}: batch and context >= 1, steps and topk in [1, 1024], "
                                         "P and E in [1, 4096], N in [1, 2**31 - 1]")
    return Case(batch, context, page, "draft_decode", steps=steps, topk=topk, entry_page_size=entry,
                step_window=window)


def shape_name(case: Case) -> str:
    return (f"draft_decode:{case.batch}x{case.context}x{case.steps}x{case.topk}"
            + f":p{case.page_size}" * (case.page_size > 1) + f":e{case.entry_page_size}" * (case.entry_page_size > 1)
            + f":w{case.step_window}" * bool(case.step_window))


def option_baseline(case: Case) -> str | None:
    if case.step_window:
        return DRAFT_WINDOW
    return DRAFT_ENTRY if case.entry_page_size > 1 else None


def make_inputs(case: Case, device: torch.device, seed: int) -> Inputs:
    """As SGLang's draft workers hold a batch: a token-granular table on pages of ``case.page_size`` with room
    for every branch's draft pages, int64 pool indices, lengths and positions (the lengths repeated ``topk``
    times), an int64 ``out`` of ``batch * topk * (context + steps)`` columns per step, an int32 ``kv_indptr``;
    ``expected_one_step``: ``out`` after a build of step 0 only. ``:eE``: the table page-granular, one entry
    (the page id) per E positions of that pool, its pages then of ``lcm(P, E)`` tokens."""
    g = torch.Generator().manual_seed(seed)
    rows, pool, lengths = requests(case, g)
    owned = -(-(case.page_size - 1 + case.steps) // case.page_size) * case.page_size
    room = case.topk * owned + case.page_size  # the draft pages past a row's tokens
    entry = case.entry_page_size
    columns = -(-(case.context + room) // entry) * entry
    req_to_token = page_pool(rows, columns, math.lcm(case.page_size, entry), g, device, lengths + room)
    if entry > 1:
        req_to_token = (req_to_token[:, ::entry] // entry).contiguous()
    seq_lens = lengths[pool].to(device)
    pool = pool.to(device)
    positions = seq_lens.repeat_interleave(case.topk)
    segments = case.batch * case.topk
    out = torch.full((case.steps, segments * (case.context + case.steps)), POISON, dtype=torch.int64, device=device)
    kv_indptr = torch.zeros((case.steps, segments + 1), dtype=torch.int32, device=device)
    options = dict(num_steps=case.steps, topk=case.topk, page_size=case.page_size, positions=positions,
                   entry_page_size=entry, step_window=case.step_window)
    expected = ops.draft_decode.reference(req_to_token, pool, seq_lens, kv_indptr.clone(), out.clone(),
                                                    **options)
    one_step = ops.draft_decode.reference(req_to_token, pool, seq_lens, kv_indptr.clone(), out.clone(),
                                                    **dict(options, num_steps=1))
    return Inputs(req_to_token, pool, seq_lens, out, expected, kv_indptr, positions=positions,
                  expected_one_step=one_step)


def bind(impl: str, x: Inputs, case: Case):
    """A draft-decode build; the ``one-step`` one (the auto-selected backend, ``num_steps=1``) carries its
    own ``expected`` (only step 0 written)."""
    args = (x.req_to_token, x.req_pool_indices, x.seq_lens, x.positions, x.out, x.kv_indptr, case.steps, case.topk,
            case.page_size)
    if impl == DRAFT_LOOP:
        return functools.partial(baseline_kernels().draft_loop, *args)
    if impl == DRAFT_ENTRY:
        return functools.partial(baseline_kernels().draft_entry_loop, *args, case.entry_page_size)
    if impl == DRAFT_WINDOW:
        return functools.partial(baseline_kernels().draft_window_loop, *args, case.entry_page_size, case.step_window)
    build = functools.partial(kvdispatch.create_draft_decode_kv_indices, x.req_to_token, x.req_pool_indices,
                              x.seq_lens, x.kv_indptr, x.out, num_steps=case.steps, topk=case.topk,
                              page_size=case.page_size, positions=x.positions, write_indptr_start=False,
                              round_toward_zero=True, entry_page_size=case.entry_page_size,
                              step_window=case.step_window, backend=api_backend(impl))
    if impl == ONE_STEP:
        build = functools.partial(build, num_steps=1)
        build.expected = x.expected_one_step
    return build


def launch(case: Case, x: Inputs, budget: int | None) -> grid.Launch:
    batch, columns = x.req_pool_indices.shape[0], x.req_to_token.shape[1] * case.entry_page_size
    return grid.draft_decode_launch(batch * case.topk, columns, x.out.shape[1], budget=budget)
