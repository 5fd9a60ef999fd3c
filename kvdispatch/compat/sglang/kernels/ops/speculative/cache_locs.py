"""A drop-in for SGLang 0.5.23's ``sglang.kernels.ops.speculative.cache_locs``: the multi-step draft decode
builder, forwarding to ``kvdispatch.create_draft_decode_kv_indices``. Here the grid is read: it gives the number
of steps (``grid[0]``, unless ``NUM_STEPS`` does), the batch (``grid[1]``) and the branches (``grid[2]``), as in
SGLang.
"""

from __future__ import annotations

from kvdispatch._validate import check_flag
from kvdispatch.compat.sglang import _common
from kvdispatch.compat.sglang._common import _Launch, _as_rows, _check_int, _check_stride, _leading
from kvdispatch.grid import DRAFT_MAX_STEPS, DRAFT_MAX_TOPK, MAX_PAGE_SIZE

__all__ = ["generate_draft_decode_kv_indices"]


def _generate_draft_decode_kv_indices(launch_grid, req_pool_indices, req_to_token, paged_kernel_lens, kv_indices,
                                      kv_indptr, positions, row_stride, kv_indices_stride, kv_indptr_stride, bs_upper,
                                      iter_upper, num_tokens_upper, page_size, window_size=0, sink_size=0,
                                      NUM_STEPS=0, ENTRY_PAGE_SIZE=1, v2p=None, TRANSLATE=False):
    """Speculative multi-step draft decode indices (EAGLE): every step's token CSR in one launch.

    Launched as ``generate_draft_decode_kv_indices[(steps, num_seqs, topk)](...)``; with ``NUM_STEPS > 0`` the
    grid's first entry is ``NUM_STEPS`` times a number of token blocks, and ``NUM_STEPS`` is the step count.
    For step ``s``, request ``b < num_seqs`` and branch ``k < topk``, row ``s`` of ``kv_indices`` gets the
    request's ``paged_kernel_lens[b]`` tokens of ``req_to_token[req_pool_indices[b]]`` then the branch's
    ``s + 1`` draft slots, segments back to back (``kvdispatch.create_draft_decode_kv_indices``, with SGLang's
    draft-slot rule at ``page_size``, truncating division); ``kv_indptr[s, z]`` for ``z`` in ``1 ..
    num_seqs * topk`` is ``positions[0] + ... + positions[z - 1] + z * (s + 1)``; ``kv_indptr[s, 0]`` is left
    untouched (engines zero it once). ``window_size`` / ``sink_size``: the draft-only sliding window;
    ``TRANSLATE``: every id through ``v2p`` (pages of ``page_size``). A grid with a 0 launches nothing.

    ``row_stride``, ``kv_indices_stride`` and ``kv_indptr_stride`` are checked against the tensors' row strides
    (flat contiguous buffers are read as rows of that many entries, ``_as_rows``); ``bs_upper``, ``iter_upper``
    and ``num_tokens_upper`` (SGLang's block sizes) are accepted and not needed: sums here are exact over the
    whole batch. ``ENTRY_PAGE_SIZE`` above 1: a page-granular source table (the unified pool's read table),
    position ``q`` reading ``entry * ENTRY_PAGE_SIZE + q % ENTRY_PAGE_SIZE`` of its entry ``q // ENTRY_PAGE_SIZE``
    (``entry_page_size`` of the kvdispatch op). Returns ``kv_indices``.
    """
    if launch_grid is None:
        raise TypeError("generate_draft_decode_kv_indices takes its batch, branches and steps from the launch grid: "
                        "call it as generate_draft_decode_kv_indices[(steps, num_seqs, topk)](...)")
    _check_int("NUM_STEPS", NUM_STEPS, 0, DRAFT_MAX_STEPS)
    first, batch, topk = launch_grid
    if not NUM_STEPS:
        _check_int("grid[0]", first, 0, DRAFT_MAX_STEPS)  # the steps
    pool, lens, indptr, out = _draft_rows(launch_grid, req_pool_indices, req_to_token, paged_kernel_lens, kv_indices,
                                          kv_indptr, row_stride, kv_indices_stride, kv_indptr_stride, ENTRY_PAGE_SIZE,
                                          v2p, TRANSLATE, "")
    if topk == 0 or first == 0:
        return kv_indices  # no program launched
    _common._build_draft_decode(req_to_token, pool, lens, indptr, out, num_steps=NUM_STEPS or first, topk=topk,
                                page_size=page_size, positions=positions, window_size=window_size,
                                sink_size=sink_size, v2p=v2p if TRANSLATE else None, write_indptr_start=False,
                                round_toward_zero=True, entry_page_size=ENTRY_PAGE_SIZE)
    return kv_indices


generate_draft_decode_kv_indices = _Launch(_generate_draft_decode_kv_indices, "generate_draft_decode_kv_indices")


# -- the per-step sliding-window draft CSR ------------------------------------------------------------------

def _generate_draft_decode_window_kv_indices(launch_grid, req_pool_indices, req_to_token, paged_kernel_lens,
                                             window_kv_indices, window_kv_indptr, positions, row_stride,
                                             kv_indices_stride, kv_indptr_stride, bs_upper, iter_upper,
                                             num_tokens_upper, page_size, window, ENTRY_PAGE_SIZE=1, v2p=None,
                                             TRANSLATE=False):
    """The multi-step draft's per-step sliding-window read CSR: every step in one launch.

    Launched as ``generate_draft_decode_window_kv_indices[(steps, num_seqs, topk)](...)``. For step ``s``
    (``it = s + 1`` draft tokens), request ``b`` and branch ``k``, row ``s`` of ``window_kv_indices`` gets the
    last ``min(paged_kernel_lens[b] + it, window)`` of what the step attends: the prefix's tail, then the
    branch's draft slots (as ``generate_draft_decode_kv_indices`` places them), segments back to back;
    ``window_kv_indptr[s, z]`` for ``z`` in ``1 .. num_seqs * topk`` is ``sum(min(positions[:z] + it,
    window))``, column 0 left untouched (``kvdispatch.create_draft_decode_kv_indices`` with ``step_window``).
    Where ``positions`` differ from the lengths repeated ``topk`` times, the entries still follow
    ``paged_kernel_lens`` (SGLang places them by ``positions``). ``ENTRY_PAGE_SIZE``, ``v2p`` and ``TRANSLATE``,
    the strides and the block sizes: as for ``generate_draft_decode_kv_indices``. ``window`` at least 1. A grid
    with a 0 launches nothing. Returns ``window_kv_indices``.
    """
    if launch_grid is None:
        raise TypeError("generate_draft_decode_window_kv_indices takes its batch, branches and steps from the "
                        "launch grid: call it as generate_draft_decode_window_kv_indices[(steps, num_seqs, topk)](...)")
    _check_int("window", window, 1, 2**31 - 1)
    steps, batch, topk = launch_grid
    _check_int("grid[0]", steps, 0, DRAFT_MAX_STEPS)
    pool, lens, indptr, out = _draft_rows(launch_grid, req_pool_indices, req_to_token, paged_kernel_lens,
                                          window_kv_indices, window_kv_indptr, row_stride, kv_indices_stride,
                                          kv_indptr_stride, ENTRY_PAGE_SIZE, v2p, TRANSLATE, "window_")
    if topk == 0 or steps == 0:
        return window_kv_indices  # no program launched
    _common._build_draft_decode(req_to_token, pool, lens, indptr, out, num_steps=steps, topk=topk,
                                page_size=page_size, positions=positions, v2p=v2p if TRANSLATE else None,
                                write_indptr_start=False, round_toward_zero=True, entry_page_size=ENTRY_PAGE_SIZE,
                                step_window=window)
    return window_kv_indices


def _draft_rows(launch_grid, req_pool_indices, req_to_token, paged_kernel_lens, kv_indices, kv_indptr, row_stride,
                kv_indices_stride, kv_indptr_stride, entry_page_size, v2p, translate, prefix):
    """The draft builders' shared checks (grid, strides, ``ENTRY_PAGE_SIZE``, ``TRANSLATE``) and their tensors as
    the op takes them: ``(pool, lens, indptr, out)``; ``prefix``: what SGLang's names of the outputs start with."""
    _check_int("ENTRY_PAGE_SIZE", entry_page_size, 1, MAX_PAGE_SIZE)
    check_flag("TRANSLATE", translate)
    if translate and v2p is None:
        raise ValueError("TRANSLATE=True needs v2p")
    _check_int("grid[2]", launch_grid[2], 0, DRAFT_MAX_TOPK)
    _check_stride("row_stride", row_stride, req_to_token, "req_to_token")
    indptr = _as_rows(kv_indptr, kv_indptr_stride, f"{prefix}kv_indptr", "kv_indptr_stride")
    out = _as_rows(kv_indices, kv_indices_stride, f"{prefix}kv_indices", "kv_indices_stride")
    return (_leading("req_pool_indices", req_pool_indices, launch_grid[1]),
            _leading("paged_kernel_lens", paged_kernel_lens, launch_grid[1]), indptr, out)


generate_draft_decode_window_kv_indices = _Launch(_generate_draft_decode_window_kv_indices,
                                                  "generate_draft_decode_window_kv_indices")
__all__ += ["generate_draft_decode_window_kv_indices"]
