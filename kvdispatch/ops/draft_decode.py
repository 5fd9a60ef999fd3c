"""The token CSR of every step of a speculative multi-step draft decode: the op ``draft_decode``.

Its argument checks, its data checks (``KVDISPATCH_DEBUG``), its torch reference (the torch backend and
the semantics every backend is tested against) and its declaration (``kvdispatch.op.declare``), which makes
the public function, the custom op and the dispatch entry.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._debug import _check_rows, _first_bad, _first_bad_entry, _host_rows, _lookup_pages
from .._validate import (_INT32_MAX, _check_apart, _common, _contiguous_vector, _index_table,
                         _index_vector, _python_int)
from ..grid import DRAFT_MAX_STEPS, DRAFT_MAX_TOPK, DRAFT_OFFSET_LIMIT, MAX_PAGE_SIZE
from ..reference import BOUND, _clamped_pool, _store, _translated, draft_prefix_cap
from ..op import declare

__all__ = ["create_draft_decode_kv_indices"]


def _check_draft_positions(positions, topk, num_steps, cap, width, step_window=0):
    """``positions`` (int64 ``[B*K]`` on the host) non-negative, and the last step's ``kv_indptr`` they give,
    ``sum(min(p[:z + 1], cap)) + (z + 1) * num_steps`` (``sum(min(p[:z + 1] + num_steps, step_window))`` with a
    step window), at or before ``width``."""
    z = _first_bad(positions < 0)
    if z is not None:
        raise ValueError(f"request {z // topk}: positions[{z}] = {int(positions[z])} (branch {z % topk}) is negative")
    ends = torch.cumsum(positions.clamp(max=cap), 0) + torch.arange(1, positions.shape[0] + 1) * num_steps
    if step_window:
        ends = torch.cumsum((positions + num_steps).clamp(max=step_window), 0)
    z = _first_bad(ends > width)
    if z is not None:
        raise ValueError(f"request {z // topk}: positions[{z}] = {int(positions[z])} (branch {z % topk}) puts "
                         f"kv_indptr[{num_steps - 1}, {z + 1}] at {int(ends[z])}, past out's {width} columns")


def _check_draft_translation(req_to_token, req_pool_indices, lengths, counts, branch_span, topk, num_steps, page_size,
                             window_size, sink_size, v2p, entry_page_size=1):
    """Every value the draft op reads (rows and lengths already checked) on a page inside ``v2p``."""
    size, cols = v2p.shape[0], req_to_token.shape[1] * entry_page_size
    pool = req_pool_indices.long().cpu()
    position = torch.arange(cols)[None, :]
    sink = counts.clamp(max=sink_size) if window_size > 0 else counts
    length, span = lengths[:, None], branch_span[:, None]
    prefix = (position < sink[:, None]) | ((position >= length - counts[:, None] + sink[:, None]) & (position < length))
    past = position - length
    draft = (past >= 0) & (past.div(span, rounding_mode="floor") < topk) & (past.remainder(span) < num_steps)
    read = prefix | draft  # [B, C]
    values = _host_rows(req_to_token, pool)
    if entry_page_size != 1:
        values = values.repeat_interleave(entry_page_size, 1) * entry_page_size + position % entry_page_size
    pages = _lookup_pages(values, page_size)
    bad = _first_bad_entry(read & ((pages < 0) | (pages >= size)))
    if bad is not None:
        b, q = bad
        read_at = f"req_to_token[{int(pool[b])}, {q}]" if entry_page_size == 1 else f"position {q}"
        raise ValueError(f"request {b}: {read_at} = {int(values[b, q])} is on page {int(pages[b, q])}, outside "
                         f"v2p's [0, {size})")


def _draft_segments(req_to_token, req_pool_indices, lengths, counts, topk, steps, page_size, window, sink_size,
                    round_toward_zero):
    """Per draft segment ``z = b * K + k``, and one more for the columns past the last segment: int64
    ``[6, B*K + 1]``, the rows ``n_b``, prefix shift, draft shift, pool row, window shift and ``sink_b`` (rows,
    not columns: a gather of whole rows of six int64 is slow on a GPU).

    An entry ``e`` of segment ``z`` reads position ``e + shift``: the prefix shift (0) for ``e < sink_b``, the
    window shift (``L_b - n_b``) for ``sink_b <= e < n_b`` and the draft shift (``start - n_b``, ``start`` of
    ``build_draft_decode_indices``) for ``e >= n_b``. A segment whose pool row lies outside ``[0, R)``, and the
    last one, get shifts of at least ``BOUND``: every position they read lies past the table.
    """
    batch, device = counts.shape[0], counts.device
    pool, outside = _clamped_pool(req_to_token, req_pool_indices)
    window_shift = (lengths - counts).masked_fill_(outside, BOUND)  # [B]
    branch = torch.arange(topk, device=device)
    if page_size == 1:  # ceil((L mod 1 + S) / 1) * 1 == S
        draft_shift = torch.add(window_shift[:, None], branch, alpha=steps)
    else:
        remainder = torch.fmod(lengths, page_size) if round_toward_zero else torch.remainder(lengths, page_size)
        branch_room = (remainder + (steps + page_size - 1)) // page_size * page_size  # ceil((L mod P + S) / P) * P
        draft_shift = torch.addcmul(window_shift[:, None], branch_room[:, None], branch)  # [B, K]
    sink = counts.clamp(max=sink_size) if window else counts
    table = torch.zeros((6, batch * topk + 1), dtype=torch.int64, device=device)
    table[2, -1].fill_(BOUND)  # not `= BOUND`: assigning to one element copies a host scalar (no CUDA graph)
    per_request = [counts, outside * BOUND, None, pool, window_shift, sink]
    rows = [draft_shift if r is None else r[:, None].expand(batch, topk) for r in per_request]
    torch.stack(rows, out=table[:, :-1].view(6, batch, topk))
    return table


def check_arguments(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, num_steps, topk, page_size,
                    positions=None, window_size=0, sink_size=0, v2p=None, write_indptr_start=True,
                    round_toward_zero=False, entry_page_size=1, step_window=0, memory=True):
    """Validate ``create_draft_decode_kv_indices`` arguments; returns the device (``memory``: as for
    ``check_page_table_args``)."""
    batch, device = _common(req_to_token, req_pool_indices, seq_lens, None)
    _python_int("num_steps", num_steps, 0, DRAFT_MAX_STEPS)
    _python_int("topk", topk, 1, DRAFT_MAX_TOPK)
    _python_int("page_size", page_size, 1, MAX_PAGE_SIZE)
    _python_int("window_size", window_size, 0, _INT32_MAX)
    _python_int("sink_size", sink_size, 0, _INT32_MAX)
    _python_int("entry_page_size", entry_page_size, 1, MAX_PAGE_SIZE)
    _python_int("step_window", step_window, 0, _INT32_MAX)
    if step_window and window_size:
        raise ValueError(f"step_window and window_size are two windows of the draft's reads: give one, got "
                         f"step_window={step_window} and window_size={window_size}")
    for name, value in (("write_indptr_start", write_indptr_start), ("round_toward_zero", round_toward_zero)):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    segments = batch * topk
    if segments > _INT32_MAX:
        raise ValueError(f"req_pool_indices.shape[0] * topk must be at most {_INT32_MAX}, got {segments}")
    _index_table("out", out, device, num_steps, 0, rows_are="num_steps")
    if out.shape[1] > DRAFT_OFFSET_LIMIT:
        raise ValueError(f"out must be at most {DRAFT_OFFSET_LIMIT} columns wide, got shape {tuple(out.shape)}")
    _index_table("kv_indptr", kv_indptr, device, num_steps, segments + 1, rows_are="num_steps",
                 cols_are="req_pool_indices.shape[0] * topk + 1")
    if positions is not None:
        _index_vector("positions", positions, device, segments, at_least=True)
    if v2p is not None:
        _contiguous_vector("v2p", v2p, device)
    if not memory:
        return device
    _check_apart((("out", out), ("kv_indptr", kv_indptr)),
                 (("req_to_token", req_to_token), ("req_pool_indices", req_pool_indices), ("seq_lens", seq_lens),
                  ("positions", positions), ("v2p", v2p)))
    return device


def check_data(req_to_token, req_pool_indices, seq_lens, out, num_steps, topk, page_size, positions,
               window_size, sink_size, v2p, round_toward_zero, entry_page_size=1, step_window=0):
    """``create_draft_decode_kv_indices``: with ``num_steps > 0``, every pool index in ``[0, R)``; ``seq_lens >=
    0`` (0: an empty prefix); every draft slot read, up to ``start(b, topk - 1) + num_steps - 1``, before
    position ``C * entry_page_size`` (the prefix lies before it); the last step's segments end at or before
    ``out``'s width ``W``; with ``v2p``, every value read (prefix and draft slots) on a page inside ``v2p``'s
    ``[0, V)`` (a negative value is outside); with ``positions``, each of ``positions[:B*K]`` non-negative and
    the last step's ``kv_indptr`` they give at or before ``W`` (a position above the window's cap is SGLang's
    rule, clamped as documented). With ``step_window``, the segments' widths are its own."""
    batch = req_pool_indices.shape[0]
    if num_steps == 0 or batch == 0:
        return
    cols = req_to_token.shape[1] * entry_page_size
    lengths = _check_rows(req_to_token, req_pool_indices, seq_lens, None, 0, "seq_lens",
                          entry_page_size=entry_page_size)
    remainder = lengths.fmod(page_size) if round_toward_zero else lengths.remainder(page_size)
    branch_span = (remainder + num_steps + page_size - 1).div(page_size, rounding_mode="floor") * page_size
    draft_end = lengths + (topk - 1) * branch_span + num_steps  # past the last draft slot read
    b = _first_bad(draft_end > cols)
    if b is not None:
        raise ValueError(f"request {b}: draft slots up to position {int(draft_end[b]) - 1} (seq_lens[{b}] = "
                         f"{int(lengths[b])}, {topk} branches of {num_steps} steps) run past the table's {cols} "
                         f"{'columns' if entry_page_size == 1 else 'positions'}")
    cap = draft_prefix_cap(window_size, sink_size)
    counts = lengths.clamp(max=cap)
    ends = topk * (torch.cumsum(counts, 0) + torch.arange(1, batch + 1) * num_steps)  # the last step's
    if step_window:
        ends = topk * torch.cumsum((counts + num_steps).clamp(max=step_window), 0)
    width = out.shape[1]
    b = _first_bad(ends > width)
    if b is not None:
        raise ValueError(f"request {b}: its segments of step {num_steps - 1} end at column {int(ends[b])}, past "
                         f"out's {width} columns")
    if positions is not None:
        _check_draft_positions(positions[: batch * topk].long().cpu(), topk, num_steps, cap, width, step_window)
    if v2p is not None and step_window:  # the first step reads the longest prefix tail, every step a draft slot
        _check_draft_translation(req_to_token, req_pool_indices, lengths, counts.clamp(max=step_window - 1),
                                 branch_span, topk, num_steps, page_size, 1, 0, v2p, entry_page_size)
    elif v2p is not None:
        _check_draft_translation(req_to_token, req_pool_indices, lengths, counts, branch_span, topk, num_steps,
                                 page_size, window_size, sink_size, v2p, entry_page_size)


def reference(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, num_steps, topk,
              page_size=1, positions=None, window_size=0, sink_size=0, v2p=None,
              write_indptr_start=True, round_toward_zero=False, entry_page_size=1, step_window=0, pdl=False):
    """Multi-step speculative draft decode indices; semantics of ``kvdispatch.create_draft_decode_kv_indices``.

    ``S = num_steps`` rows of token CSR at once, row ``s`` for ``it = s + 1`` draft tokens. With
    ``K = topk`` and segment ``z = b * K + k`` (request ``b``, branch ``k``), ``L_b = seq_lens[b]``,
    ``cap`` = ``draft_prefix_cap(window_size, sink_size)`` and ``n_b = min(max(L_b, 0), cap)`` (the
    request's prefix tokens), row ``s`` holds the segments one after another: segment ``z`` is ``n_b``
    prefix tokens then ``it`` draft slots, at ``offset(s, z) = K * sum(n[:b]) + b * K * it + k * (n_b + it)``.

    * prefix token ``i < n_b`` reads position ``q = i`` (no window) or, with a window and
      ``sink = min(sink_size, n_b)``, ``q = i`` for ``i < sink`` and ``q = L_b - n_b + i`` after them;
    * draft slot ``j < it`` reads position ``start + j``, ``start = L_b + k * ceil((L_b mod P + S) / P) * P``
      (``P = page_size``; ``mod`` floors, or truncates with ``round_toward_zero``; at ``P == 1`` or
      ``K == 1`` this is ``L_b + k * S``);
    * a position is read from row ``req_pool_indices[b]`` of ``req_to_token`` only when the row is in
      ``[0, R)`` and the position in ``[0, C * E)`` (``E = entry_page_size``); other entries, and entries at
      columns ``>= W``, are left untouched. The value read at position ``q`` is ``x = row[q]``, or with ``E``
      above 1 ``row[q // E] * E + q % E`` (int64); it becomes with ``v2p`` (``[V]``): 0 when ``x < 0`` or
      ``x // P >= V`` or ``v2p[x // P] < 0``, else ``v2p[x // P] * P + x % P``; it is stored in ``out``'s dtype
      (the low 32 / 64 bits of the exact value).

    ``kv_indptr[s, z]`` for ``z`` in ``1 .. B*K``: the offset of segment ``z`` (``z = B*K``: the row's used
    length); with ``positions`` (``[>= B*K]``), ``sum(p[:z]) + z * it`` where ``p = min(max(positions, 0),
    cap)``. ``kv_indptr[s, 0] = 0`` when ``write_indptr_start``. Offsets and sums saturate at
    ``DRAFT_OFFSET_LIMIT`` (every term is non-negative, so a saturated value is ``min(exact, limit)``), and are
    stored in ``kv_indptr``'s dtype as ``Tensor.to`` does. Lengths are clamped into ``[-BOUND, BOUND]`` first,
    which changes no position that can be read. Untouched: rows ``>= S`` of both outputs, the columns of
    ``kv_indptr`` past ``B*K`` (and column 0 without ``write_indptr_start``), everything with ``B == 0``.

    With ``step_window`` ``V > 0`` (no ``window_size``), segment ``z`` of step ``s`` is the last ``keep = min(n_b
    + it, V)`` entries of the ``n_b`` prefix tokens then the ``it`` draft slots: the prefix tail, positions
    ``L_b - p + i`` for ``i < p = keep - min(it, V)``, then draft slots ``j`` from ``it - min(it, V)`` on; the
    segments lie back to back (``offset(s, z)`` the ``keep`` of the segments before it) and ``kv_indptr[s, z]``
    is that offset, or with ``positions`` ``sum(min(p[:z] + it, V))``.

    Memory and time O(S * (W + B*K)): each output column finds its segment by a sorted search.
    """
    batch = req_pool_indices.shape[0]
    segments, steps = batch * topk, num_steps
    if segments == 0 or steps == 0:
        return out
    device = out.device
    cap = draft_prefix_cap(window_size, sink_size)
    lengths = seq_lens[:batch].long().clamp(-BOUND, BOUND)
    counts = lengths.clamp(0, cap)  # n_b, [B]
    before = (torch.cumsum(counts, 0) - counts).clamp(max=DRAFT_OFFSET_LIMIT)  # exact: < 2**31 terms of <= 2**32
    draft = torch.arange(1, steps + 1, device=device)[:, None]  # it, per step
    segment_number = torch.arange(1, segments + 1, device=device)  # z + 1
    # end(s, z) = offset(s, z) + n_b + it = K * before_b + (k + 1) * n_b + (z + 1) * it: each step's segments lie
    # back to back, segment z + 1 starting where z ends.
    first_step_part = torch.addcmul((before * topk)[:, None], counts[:, None],
                                    torch.arange(1, topk + 1, device=device)).view(-1)  # [B*K]
    ends = torch.addcmul(first_step_part, segment_number, draft).clamp_(max=DRAFT_OFFSET_LIMIT)  # [S, B*K]
    if step_window:  # exact: fewer than 2**31 widths of fewer than 2**31 entries
        keep = (counts + draft).clamp_(max=step_window)  # [S, B]
        ends = torch.cumsum(keep.repeat_interleave(topk, 1), 1).clamp_(max=DRAFT_OFFSET_LIMIT)

    indptr_rows = kv_indptr[:steps]
    if positions is None:
        indptr_values = ends
    elif step_window:
        counted = (positions[:segments].long().clamp(0, step_window) + draft).clamp_(max=step_window)
        indptr_values = torch.cumsum(counted, 1).clamp_(max=DRAFT_OFFSET_LIMIT)
    else:
        counted = positions[:segments].long().clamp(0, cap)
        through = torch.cumsum(counted, 0).clamp_(max=DRAFT_OFFSET_LIMIT)  # exact, as `before`
        indptr_values = torch.addcmul(through, segment_number, draft).clamp_(max=DRAFT_OFFSET_LIMIT)
    indptr_rows[:, 1: segments + 1] = indptr_values  # cast to kv_indptr's dtype as Tensor.to casts
    if write_indptr_start:
        indptr_rows[:, 0].fill_(0)

    rows, cols = req_to_token.shape
    width = out.shape[1]
    if width == 0 or rows == 0 or cols == 0:
        return out
    readable = cols * entry_page_size
    segment_table = _draft_segments(req_to_token, req_pool_indices[:batch], lengths, counts, topk, steps, page_size,
                                    window_size > 0, sink_size, round_toward_zero)
    column = torch.arange(width, device=device)
    owner = torch.searchsorted(ends, column.expand(steps, width).contiguous(), right=True)  # [S, W], in [0, B*K]
    # Segment z starts where z - 1 ends (segment 0 at 0); the row past the last segment starts at its end.
    entry = column - torch.nn.functional.pad(ends, (1, 0)).gather(1, owner)
    if step_window:
        chain = draft.clamp(max=step_window)
        tail = torch.nn.functional.pad((keep - chain).repeat_interleave(topk, 1), (0, 1)).gather(1, owner)
        count, _, draft_shift, pool, window_shift = segment_table[:5, owner]
        position = entry - tail + torch.where(entry < tail, window_shift + count, draft_shift + count + draft - chain)
    elif window_size > 0:
        count, prefix_shift, draft_shift, pool, window_shift, sink = segment_table[:, owner]  # [S, W] each
        prefix_shift = torch.where(entry < sink, prefix_shift, window_shift)
    else:  # the last two rows are not read
        count, prefix_shift, draft_shift, pool = segment_table[:4, owner]
    if not step_window:
        position = entry + torch.where(entry < count, prefix_shift, draft_shift)
    clamped = position.clamp(0, readable - 1)
    if entry_page_size == 1:
        values = req_to_token[pool, clamped]
    else:
        entry = torch.div(clamped, entry_page_size, rounding_mode="floor")
        values = torch.add(clamped - entry * entry_page_size, req_to_token[pool, entry], alpha=entry_page_size)
    if v2p is not None:
        values = _translated(values, v2p, page_size)
    _store(out[:steps], clamped == position, values)
    return out


@declare("draft_decode", outputs=("out", "kv_indptr"), check=check_arguments, check_data=check_data,
         reference=reference)
def create_draft_decode_kv_indices(req_to_token: Tensor, req_pool_indices: Tensor, seq_lens: Tensor, kv_indptr: Tensor,
                                   out: Tensor, *, num_steps: int, topk: int, page_size: int = 1,
                                   positions: Tensor | None = None, window_size: int = 0, sink_size: int = 0,
                                   v2p: Tensor | None = None, write_indptr_start: bool = True,
                                   round_toward_zero: bool = False, entry_page_size: int = 1, step_window: int = 0,
                                   backend: str | None = None, enable_pdl: bool | None = None) -> Tensor:
    """Build the token CSR of every step of a speculative multi-step draft decode (EAGLE with ``topk``
    branches per request) into ``out`` and ``kv_indptr``, all steps in one launch.

    ``B = req_pool_indices.shape[0]`` requests, ``K = topk`` branches each, ``S = num_steps`` steps; step
    ``s`` has ``it = s + 1`` draft tokens. Segment ``z = b * K + k`` (request ``b``, branch ``k``) of step
    ``s`` is the request's prefix, ``n_b = min(max(seq_lens[b], 0), cap)`` tokens (``cap`` below), then the
    branch's ``it`` draft slots; row ``s`` of ``out`` holds the segments one after another::

        offset(s, z) = K * (n_0 + ... + n_{b-1}) + b * K * it + k * (n_b + it)
        out[s, offset(s, z) + i]       = token(b, i)                       for i < n_b
        out[s, offset(s, z) + n_b + j] = row_b[start(b, k) + j]             for j < it
        kv_indptr[s, z]                = offset(s, z)                       for z in 1 .. B*K

    where ``row_b = req_to_token[req_pool_indices[b]]``, ``token(b, i) = row_b[i]`` and
    ``start(b, k) = L + k * ceil((L mod P + S) / P) * P`` with ``L = seq_lens[b]``, ``P = page_size`` (the
    draft slots each branch owns in a paged pool; ``L + k * S`` when ``P == 1`` or ``K == 1``). ``mod``
    rounds down, or toward zero with ``round_toward_zero`` (they differ for negative lengths only).
    ``kv_indptr[s, B*K]`` is the row's used length, ``K * sum(n) + B * K * it``.

    Options:
        positions: int32/int64 ``[>= B*K]``: ``kv_indptr[s, z] = p_0 + ... + p_{z-1} + z * it`` with
            ``p = min(max(positions, 0), cap)`` instead (SGLang's rule; equal to the offsets when the
            positions are the lengths repeated ``K`` times); ``out``'s layout still follows ``seq_lens``.
        window_size, sink_size: with ``window_size > 0``, a draft-only sliding window: ``cap = window_size +
            sink_size`` and the prefix is the first ``min(sink_size, n_b)`` tokens, then the last
            ``n_b - min(sink_size, n_b)`` of the ``L`` tokens (positions ``L - n_b + i``); draft slots are
            still read from ``start(b, k)`` of the full length. Without a window there is no cap.
        v2p: int32/int64 ``[V]``, contiguous: every value ``x`` read is written as
            ``v2p[x // P] * P + x % P``, or 0 when ``x < 0``, ``x // P >= V`` or ``v2p[x // P] < 0``.
        write_indptr_start: write ``kv_indptr[s, 0] = 0`` (SGLang's kernel leaves it untouched).
        entry_page_size: int in ``[1, 4096]``: ``E`` tokens per table entry (a page-granular table, such as the
            unified pool's read table): position ``q`` reads ``row_b[q // E] * E + q % E`` (64-bit) in place of
            ``row_b[q]``, and a row has ``C * E`` positions. Then ``v2p``, when given, translates that value.
        step_window: int in ``[0, 2**31 - 1]``; above 0 (without ``window_size``), a sliding window over what
            each step reads, its draft slots included (SGLang's per-step window CSR): segment ``z`` of step
            ``s`` is the last ``keep = min(n_b + it, step_window)`` entries of its prefix then its ``it`` draft
            slots (the prefix's tail, then the latest ``min(it, step_window)`` draft slots), and ``kv_indptr``
            holds the sums of those widths (with ``positions``: of ``min(p + it, step_window)``).

    Args:
        req_to_token: int32 ``[R, C]``, last dim contiguous, any row stride.
        req_pool_indices, seq_lens: int32/int64 ``[B]``, any stride.
        kv_indptr: int32/int64 ``[>= S, >= B*K + 1]``, last dim contiguous, any row stride. Written in place.
        out: int32/int64 ``[>= S, W]``, last dim contiguous, any row stride, ``W <= 2**32``. Written in place.
        num_steps: int in ``[0, 1024]``; topk: int in ``[1, 1024]``; page_size: int in ``[1, 4096]``.
        window_size, sink_size: ints in ``[0, 2**31 - 1]``.
        backend, enable_pdl: as for ``create_flashmla_kv_indices``.

    Values are stored in the output's dtype (int32: the low 32 bits). Integers are exact: offsets and sums
    saturate at ``kvdispatch.grid.DRAFT_OFFSET_LIMIT`` (``2**32``, past any ``out``), which is what
    ``kv_indptr`` then holds. Bad data reads and writes nothing out of bounds: a pool index outside
    ``[0, R)`` reads nothing (the segment keeps its place, its entries are left untouched), a length
    ``<= 0`` gives an empty prefix, a position outside ``[0, C)`` is not read (its entry is left
    untouched), and entries at columns ``>= W`` are not written. Segments never overlap (the op lays them
    out itself; ``kv_indptr`` is written, never read), so every entry is exact on every backend.

    Left untouched: rows ``>= S`` of both outputs, columns of ``kv_indptr`` past ``B*K`` (and column 0 without
    ``write_indptr_start``), every column of ``out`` no segment covers; everything when ``B == 0``.
    No host sync and no device allocation on the GPU backends: capturable in a CUDA graph; one Triton
    compilation per page size and option set, whatever the batch, widths, ``num_steps`` and ``topk``.
    Raises ``TypeError``/``ValueError`` naming the argument before anything is written, also where
    an output shares memory with an input or the other output, or rows of an output share memory.

    Returns:
        ``out``.
    """
