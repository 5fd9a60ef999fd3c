"""A windowed draft model's compact rows' cases, ``compact_draft_rows:BATCHxCONTEXTxBLOCK``: each request's last
``DRAFT_WINDOW`` committed tokens of a target row ``CONTEXT`` wide, then its ``BLOCK`` verify slots (DFlash's
verify step). ``build_compact_draft_rows`` against compact-rebuild-loop (SGLang's design) and plain PyTorch."""

from __future__ import annotations

import argparse
import functools

import torch

from kvdispatch import ops
import kvdispatch
from kvdispatch import grid

from .core import PLAIN_TORCH, POISON, Case, Inputs, api_backend, baseline_kernels, dimensions, page_pool, requests

COMPACT_REBUILD_LOOP = "compact-rebuild-loop"
TRITON_BASELINES, SGLANG_BASELINE, IDEAL_BASELINE = (COMPACT_REBUILD_LOOP,), COMPACT_REBUILD_LOOP, None
API_VARIANTS, PLAIN_TORCH_CASES = (), "full-length"
# The draft model's window of committed tokens (DFlash's draft_window_size).
DRAFT_WINDOW = 2048

# What ``core.legend`` says of its cases and of its baselines.
LEGEND_CASE = f"compact_draft_rows:BxCxBLOCK: a windowed draft's rows ({DRAFT_WINDOW} tokens, then BLOCK slots)"
LEGEND_IMPLS = "compact-rebuild-loop: SGLang's compact-draft rebuild design"
# Its cases in each set of ``core.case_set``.
CASES = {
    "GPU": ["compact_draft_rows:64x4096x16", "compact_draft_rows:256x8192x16", "compact_draft_rows:8x32768x64"],
    "GPU_QUICK": ["compact_draft_rows:256x8192x16"],
    "GPU_REAL": ["compact_draft_rows:256x1048576x16:len=1024-8192", "compact_draft_rows:64x131072x16:len=mix"],
    "GPU_REAL_QUICK": ["compact_draft_rows:256x1048576x16:len=1024-8192"],
    "CPU": ["compact_draft_rows:4x4096x16"],
    "CPU_QUICK": [],
}


def parse(shape: str, text: str) -> Case:
    usage = ("a compact-draft-rows case is compact_draft_rows:BATCHxCONTEXTxBLOCK, e.g. "
             f"compact_draft_rows:64x4096x16; got {text!r}")
    batch, context, block = dimensions(shape, 3, usage)
    if min(batch, context, block) < 1 or block >= context:
        raise argparse.ArgumentTypeError(usage)
    return Case(batch, context, 1, "compact_draft_rows", steps=block)


def shape_name(case: Case) -> str:
    return f"compact_draft_rows:{case.batch}x{case.context}x{case.steps}"


def make_inputs(case: Case, device: torch.device, seed: int) -> Inputs:
    """As DFlash's verify step holds a batch: a target table ``context`` wide on shuffled slots, each request
    ``BLOCK`` tokens short of its length committed, its verify slots (int64 ``[batch, BLOCK]``, ``positions``)
    those ``BLOCK`` slots; the int32 draft table ``DRAFT_WINDOW + BLOCK`` wide (``out``), the compact lengths
    (int32, ``seq_lens``) and their suffix starts (int64, ``kv_indptr``)."""
    g = torch.Generator().manual_seed(seed)
    rows, pool, lengths = requests(case, g)
    lengths = lengths.clamp(min=case.steps)
    target = page_pool(rows, case.context, 1, g, device, lengths)
    committed = (lengths[pool] - case.steps).to(device)
    pool = pool.to(device)
    compact = committed.clamp(max=DRAFT_WINDOW).to(torch.int32)
    start = committed - compact.long()
    columns = committed[:, None] + torch.arange(case.steps, device=device)
    verify = target[pool[:, None], columns].long()
    draft = torch.full((rows, DRAFT_WINDOW + case.steps), POISON, dtype=torch.int32, device=device)
    expected = ops.compact_draft_rows.reference(target, pool, start, compact, verify, draft.clone())
    return Inputs(target, pool, compact, draft, expected, kv_indptr=start, positions=verify)


def bind(impl: str, x: Inputs, case: Case):
    arguments = (x.req_to_token, x.req_pool_indices, x.kv_indptr, x.seq_lens, x.positions, x.out)
    if backend := api_backend(impl):
        return functools.partial(kvdispatch.build_compact_draft_rows, *arguments, backend=backend)
    if impl == PLAIN_TORCH:
        return functools.partial(ops.compact_draft_rows.reference, *arguments)
    return functools.partial(baseline_kernels().compact_rebuild_loop, *arguments)


def launch(case: Case, x: Inputs, budget: int | None) -> grid.Launch:
    return grid.compact_draft_rows_launch(x.req_pool_indices.shape[0], x.out.shape[1], budget=budget)
