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


# The speculative cache-location builders, forwarding to ``kvdispatch.create_cache_locs``: each request's slice
# of its token-table row, packed (``end_offset``) or at a fixed width, into a new int64 tensor (allocated as
# SGLang allocates it) or the caller's.
import torch  # noqa: E402

from kvdispatch._validate import _INT32_MAX  # noqa: E402

__all__ += ["assign_draft_cache_locs_contiguous_func", "assign_extend_cache_locs_func",
            "assign_extend_cache_locs_uniform_func", "fill_front_out_cache_loc_func"]


def _requests(batch_size, **vectors):
    """The first ``batch_size`` entries of each index vector (the requests SGLang launches programs for)."""
    _check_int("batch_size", batch_size, 0, _INT32_MAX)
    return [_leading(name, t, batch_size) for name, t in vectors.items()]


def _flat(name, t, entries):
    """The first ``entries`` entries of the contiguous ``t`` as a vector (SGLang indexes it flat)."""
    if not isinstance(t, torch.Tensor) or not t.is_contiguous() or t.numel() < entries:
        raise ValueError(f"{name} must be a contiguous tensor of at least {entries} entries, got "
                         f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    return t.view(-1)[:entries]


def assign_extend_cache_locs_func(req_pool_indices, req_to_token, start_offset, end_offset, batch_size,
                                  draft_token_num, device):
    """``req_to_token[req_pool_indices[b], start_offset[b]:end_offset[b]]`` for ``b < batch_size``, packed one
    after another into a new int64 tensor of ``batch_size * draft_token_num`` entries on ``device`` (entries past
    the slices are left as allocated); returns it. A packing past the tensor's end stops there."""
    pool, start, end = _requests(batch_size, req_pool_indices=req_pool_indices, start_offset=start_offset,
                                 end_offset=end_offset)
    _check_int("draft_token_num", draft_token_num, 0, _INT32_MAX)
    out = torch.empty((batch_size * draft_token_num,), dtype=torch.int64, device=device)
    _common._build_cache_locs(req_to_token, pool, start, out, end_offset=end)
    return out


def assign_extend_cache_locs_uniform_func(req_pool_indices, req_to_token, start_offset, batch_size, draft_token_num,
                                          device, *, full_v2p=None, swa_v2p=None, full_out=None, swa_out=None,
                                          page_size=1, positions_out=None, anchor_src=None, anchor_out=None):
    """``req_to_token[req_pool_indices[b], start_offset[b] + j]`` for ``j < draft_token_num`` at ``b *
    draft_token_num + j`` of a new int64 tensor on ``device``; returns it (the virtual ids). With ``full_v2p``,
    ``full_out`` gets each id through it at ``page_size`` (``swa_out`` through ``swa_v2p`` too, when given);
    ``positions_out`` (``[batch_size, draft_token_num]``) gets ``start_offset[b] + j``; ``anchor_out[b, 0]``
    gets ``anchor_src[b]``. SGLang's asserts on the maps and outputs are ValueErrors."""
    pool, start = _requests(batch_size, req_pool_indices=req_pool_indices, start_offset=start_offset)
    _check_int("draft_token_num", draft_token_num, 0, _INT32_MAX)
    entries = batch_size * draft_token_num
    maps = {}
    if full_v2p is not None:
        if full_out is None or full_out.numel() != entries:
            raise ValueError(f"full_v2p needs full_out of batch_size * draft_token_num = {entries} entries")
        maps.update(full_v2p=full_v2p, full_out=_flat("full_out", full_out, entries))
        if swa_v2p is not None:
            if swa_out is None or swa_out.numel() != entries:
                raise ValueError(f"swa_v2p needs swa_out of as many entries as full_out ({entries})")
            maps.update(swa_v2p=swa_v2p, swa_out=_flat("swa_out", swa_out, entries))
    positions = None if positions_out is None else _flat("positions_out", positions_out, entries)
    if anchor_out is not None and anchor_src is None:
        raise ValueError("anchor_out needs anchor_src")
    out = torch.empty((entries,), dtype=torch.int64, device=device)
    _common._build_cache_locs(req_to_token, pool, start, out, width=draft_token_num, positions_out=positions,
                              page_size=page_size, **maps)
    if anchor_out is not None and batch_size:
        anchors = anchor_out if anchor_out.dim() == 1 else anchor_out.select(1, 0)
        anchors[:batch_size].copy_(_flat("anchor_src", anchor_src, batch_size))
    return out


def assign_draft_cache_locs_contiguous_func(req_pool_indices, req_to_token, seq_lens, out_cache_loc, topk, num_cols,
                                            positions=None, mrope=None):
    """Each request's ``topk * num_cols`` draft slots, ``req_to_token[req_pool_indices[b], seq_lens[b]:][:topk *
    num_cols]``, at ``b * topk * num_cols`` of ``out_cache_loc`` (``b < seq_lens.shape[0]``); with
    ``positions``, ``positions[b * topk + k] = seq_lens[b]`` for ``k < topk`` and, with ``mrope`` too, the same
    in each of its three rows of ``B * topk`` entries. Returns None, as SGLang."""
    if not isinstance(seq_lens, torch.Tensor) or seq_lens.dim() != 1:
        raise ValueError("seq_lens must be a 1-D tensor")
    batch = seq_lens.shape[0]
    _check_int("topk", topk, 0, _INT32_MAX)
    _check_int("num_cols", num_cols, 0, _INT32_MAX // max(topk, 1))
    (pool,) = _requests(batch, req_pool_indices=req_pool_indices)
    _common._build_cache_locs(req_to_token, pool, seq_lens, out_cache_loc, width=topk * num_cols)
    if positions is not None and batch * topk:
        lengths = seq_lens[:, None].expand(batch, topk)
        _flat("positions", positions, batch * topk).view(batch, topk).copy_(lengths)
        if mrope is not None:
            _flat("mrope", mrope, 3 * batch * topk).view(3, batch, topk).copy_(lengths[None].expand(3, batch, topk))


def fill_front_out_cache_loc_func(num_front, out_cache_loc, front_out_cache_loc):
    """The first ``num_front[i]`` slots of request ``i``'s window (``out_cache_loc`` read as ``num_front.numel()``
    equal rows), packed one after another into ``front_out_cache_loc``. Returns None, as SGLang."""
    batch = num_front.numel()
    window = out_cache_loc.view(batch, -1)
    rows = torch.arange(batch, device=window.device)
    _common._build_cache_locs(window, rows, torch.zeros_like(num_front), front_out_cache_loc, end_offset=num_front)


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


__all__ += ["rebuild_compact_draft_req_to_token_func"]


def rebuild_compact_draft_req_to_token_func(*, draft_req_to_token, target_req_to_token, req_pool_indices,
                                            suffix_start, draft_prefix_lens, verify_out_cache_loc_2d, batch_size,
                                            block_size):
    """DFlash's compact draft rows: for ``b < batch_size`` and ``p = req_pool_indices[b]``, draft row ``p`` gets
    ``target_req_to_token[p, suffix_start[b]:][:draft_prefix_lens[b]]`` then ``verify_out_cache_loc_2d[b,
    :block_size]`` (``kvdispatch.build_compact_draft_rows``). Returns None, as SGLang."""
    pool, start, lengths = _requests(batch_size, req_pool_indices=req_pool_indices, suffix_start=suffix_start,
                                     draft_prefix_lens=draft_prefix_lens)
    _check_int("block_size", block_size, 0, _INT32_MAX)
    verify = verify_out_cache_loc_2d
    if not isinstance(verify, torch.Tensor) or verify.dim() != 2 or verify.shape[0] < batch_size \
            or verify.shape[1] < block_size:
        raise ValueError(f"verify_out_cache_loc_2d must be a 2-D tensor of at least batch_size = {batch_size} rows "
                         f"and block_size = {block_size} columns, got "
                         f"{tuple(verify.shape) if isinstance(verify, torch.Tensor) else type(verify).__name__}")
    _common._build_compact_draft_rows(target_req_to_token, pool, start, lengths, verify[:batch_size, :block_size],
                                      draft_req_to_token)
