"""The PyTorch backend: the semantic source of truth that every other backend is tested against.

Vectorised over requests, pages and output positions (no Python loop, no host sync). It allocates
temporaries through PyTorch's caching allocator, which CUDA-graph capture routes to the graph's private
pool. Arguments arrive validated (see ``kvdispatch._validate``).

Integers are exact for every int32/int64 value: an int64 length or CSR pointer is first clamped into
``[-BOUND, BOUND]``, which changes no result (no table, output or page count comes near ``BOUND``) and
leaves room for the sums below, so nothing wraps.

Every builder takes the backends' ``pdl`` argument (programmatic dependent launch) and ignores it: PyTorch
launches its own kernels.
"""

from __future__ import annotations

import torch

from .grid import DRAFT_OFFSET_LIMIT

BOUND = 2**62


def _row_spans(req_to_token, req_pool_indices, seq_lens, kv_start_idx, lengths_offset, entry_page_size=1):
    """Per request: clamped pool row, clamped start position, length and the number of readable positions.

    A row has ``P = C * entry_page_size`` positions (each table entry stands for ``entry_page_size`` of
    them). It is readable when its pool index is in ``[0, R)`` and its start in ``[0, P)``; then it can
    read ``P - start`` positions, else none. ``lengths`` is ``seq_lens + lengths_offset`` (a 32-bit
    offset) with ``seq_lens`` clamped into ``[-BOUND, BOUND]``. Everything is int64, shape ``[B]``.
    """
    rows, cols = req_to_token.shape
    cols *= entry_page_size
    pool = req_pool_indices.long()
    lengths = seq_lens.long().clamp(-BOUND, BOUND) + lengths_offset
    start = kv_start_idx.long() if kv_start_idx is not None else torch.zeros_like(pool)
    readable = (pool >= 0) & (pool < rows) & (start >= 0) & (start < cols)
    start = start.clamp(0, max(cols - 1, 0))
    room = torch.where(readable, cols - start, 0)
    return pool.clamp(0, max(rows - 1, 0)), start, lengths, room


def _low_32_bits_of_sum(values, offset):
    """``values + offset`` (int64 ``[B]`` and a 32-bit int) cast to int32 as C does: the low 32 bits of
    the exact sum, computed from the operands' low 32 bits so that nothing overflows."""
    return ((values.long() & 0xFFFFFFFF) + (offset & 0xFFFFFFFF)).to(torch.int32)


def build_page_table(req_to_token, req_pool_indices, seq_lens, out, page_size, kv_start_idx=None,
                     seqlen_offset=0, seq_lens_out=None, fill_value=None, round_toward_zero=False, pdl=False):
    """Paged block table; semantics of ``kvdispatch.create_flashmla_kv_indices``.

    ``out``: int32 ``[>= B, W]``. Row ``b`` gets ``pages_b = min(ceil(L_b / page_size), pages that start
    inside the readable table row, W)`` pages (0 when ``L_b <= 0`` or the row is unreadable), then
    ``fill_value`` up to ``W`` when given. Untouched: rows ``>= B``; without ``fill_value``, the columns
    past each row's pages. ``seq_lens_out[:B]`` (int32) gets the low 32 bits of ``seq_lens + seqlen_offset``.
    A slot is divided by ``page_size`` rounding down, or toward zero with ``round_toward_zero``.
    """
    batch, width = req_pool_indices.shape[0], out.shape[1]
    if seq_lens_out is not None and batch:
        seq_lens_out[:batch] = _low_32_bits_of_sum(seq_lens[:batch], seqlen_offset)
    if batch == 0 or width == 0:
        return out
    pool, start, lengths, room = _row_spans(req_to_token, req_pool_indices, seq_lens, kv_start_idx, seqlen_offset)
    # ceil(x / page) for x >= 0, 0 for x <= 0: pages the request needs, and pages the table can give.
    wanted = (lengths.clamp(min=0) + page_size - 1) // page_size
    available = (room + page_size - 1) // page_size
    pages = torch.minimum(wanted, available).clamp(max=width)  # [B]

    page = torch.arange(width, device=out.device)
    written = page[None, :] < pages[:, None]  # [B, W]
    if req_to_token.numel():
        positions = torch.where(written, start[:, None] + page[None, :] * page_size, 0)
        slots = req_to_token[pool[:, None], positions]
        rounding = "trunc" if round_toward_zero else "floor"
        values = torch.div(slots, page_size, rounding_mode=rounding).to(torch.int32)
    else:  # an empty table: every row is empty
        values = torch.zeros(written.shape, dtype=torch.int32, device=out.device)
    return _store_rows(out, written, values, fill_value)


def _store_rows(out, written, values, fill_value):
    """``out[:B]`` gets ``values`` where ``written`` (both ``[B, W]``), ``fill_value`` elsewhere when given (else
    it keeps its values); returns ``out``."""
    rows = out[: written.shape[0]]
    if fill_value is None:
        rows.copy_(torch.where(written, values, rows))
    else:
        rows.copy_(torch.where(written, values, torch.full_like(values, fill_value)))
    return out


def build_token_indices(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, kv_start_idx=None,
                        entry_page_size=1, token_mapping=None, pdl=False):
    """Token-level CSR indices; semantics of ``kvdispatch.create_flashinfer_kv_indices``.

    ``out``: int32 or int64 ``[N]``. With ``E = entry_page_size``, request ``b`` has ``count_b =
    min(seq_lens[b], C * E - start_b)`` tokens (0 when ``seq_lens[b] <= 0`` or its row is unreadable) and
    writes ``out[kv_indptr[b] + j] = token_value(q)`` at position ``q = start_b + j`` for its tokens ``j``
    whose target lies in ``[0, N)``: the target range ``[lo_b, hi_b) = [kv_indptr[b], kv_indptr[b] + count_b)
    ∩ [0, N)``. Untouched: every position no request writes.

    ``token_value(q)``: ``v = req_to_token[req_pool_indices[b], q // E] * E + q % E`` in int64 (``v`` is the
    entry itself when ``E == 1``); with ``token_mapping`` (int32/int64 ``[M]``), ``token_mapping[v]`` when
    ``0 <= v < M``, else -1. The value is then cast to ``out``'s dtype as ``Tensor.to`` does (int32: its low
    32 bits).

    Memory O(N + B), time O(N log B + B log B): each output position finds the request that writes it,
    rather than each request expanding its tokens. With the ranges sorted by ``lo_b``, a running maximum
    of their ``hi_b`` gives, for every position ``t``, the farthest end of the ranges starting at or before
    ``t`` (found by a binary search over the sorted starts); ``t`` is written iff that end lies past it,
    by the request owning that end.

    Where ranges overlap (bad ``kv_indptr``: valid CSR rows are disjoint), each covered position is
    written once, with the value of one of the requests covering it (one whose range reaches farthest);
    the GPU backends may write any of them there.
    """
    batch, total = req_pool_indices.shape[0], out.shape[0]
    if batch == 0 or total == 0 or req_to_token.numel() == 0:
        return out
    pool, start, lengths, room = _row_spans(req_to_token, req_pool_indices, seq_lens, kv_start_idx, 0,
                                            entry_page_size)
    count = torch.minimum(lengths.clamp(min=0), room)  # [B]
    written, owner, token = _csr_targets(kv_indptr, count, total)
    values = _token_values(req_to_token, pool[owner], start[owner] + token, entry_page_size, token_mapping)
    out.copy_(torch.where(written, values.to(out.dtype), out))
    return out


def _csr_targets(kv_indptr, count, total):
    """Which request writes each position of a CSR output of ``total`` entries, request ``b`` writing its
    ``count[b]`` tokens (int64 ``[B]``, >= 0) from ``kv_indptr[b]`` on, cut to ``[0, total)``.

    Returns ``(written, owner, token)``, each ``[total]``: whether the position is written, by which request
    (0 where not written) and which of its tokens goes there (0 where not written).
    """
    batch, device = count.shape[0], count.device
    begin = kv_indptr[:batch].long().clamp(-BOUND, BOUND)  # beyond it, a row lands outside out either way
    lo, hi = begin.clamp(0, total), (begin + count).clamp(0, total)
    lo = torch.where(lo < hi, lo, total)  # empty rows start at N, past every position

    by_start = torch.argsort(lo)
    reach_sorted, reach_index = torch.cummax(hi[by_start], 0)  # [B]: farthest end among the first k starts
    position = torch.arange(total, device=device)
    # The number of ranges starting at or before each position, minus one: its last such range in start order.
    last = torch.searchsorted(lo[by_start], position, right=True) - 1
    last_or_0 = last.clamp(min=0)
    written = (last >= 0) & (reach_sorted[last_or_0] > position)
    owner = torch.where(written, by_start[reach_index[last_or_0]], 0)
    token = torch.where(written, position - begin[owner], 0)
    return written, owner, token


def _token_values(req_to_token, pool, position, entry_page_size, token_mapping):
    """``token_value`` of ``build_token_indices`` at the readable ``position`` of the rows ``pool`` (int64
    ``[N]`` each): int32 without options, else int64."""
    if entry_page_size == 1:
        values = req_to_token[pool, position]
    else:
        entry = torch.div(position, entry_page_size, rounding_mode="floor")
        values = req_to_token[pool, entry].long() * entry_page_size + (position - entry * entry_page_size)
    if token_mapping is None:
        return values
    size = token_mapping.shape[0]
    inside = (values >= 0) & (values < size)
    if size == 0:
        return torch.full_like(values, -1, dtype=torch.long)
    mapped = token_mapping[torch.where(inside, values, 0).long()].long()
    return torch.where(inside, mapped, -1)


def _readable_pages(req_to_token, req_pool_indices, seq_lens, page_size, lengths_offset=0):
    """Per request (int64 ``[B]``): the clamped pool row and the pages it has, ``min(ceil(L_b / P), ceil(C /
    P))`` with ``L_b = seq_lens[b] + lengths_offset``, 0 when ``L_b <= 0`` or the pool index is outside
    ``[0, R)`` (a page is there when its first position ``p * P`` lies inside the request and the row)."""
    pool, _, lengths, room = _row_spans(req_to_token, req_pool_indices, seq_lens, None, lengths_offset)
    wanted = (lengths.clamp(min=0) + page_size - 1) // page_size
    available = (room + page_size - 1) // page_size
    return pool, torch.minimum(wanted, available)


def _first_slots(req_to_token, pool, written, page_size):
    """``req_to_token[pool[b], p * page_size]`` where ``written[b, p]`` (bool ``[B, W]``), 0 elsewhere; int32."""
    if not req_to_token.numel():
        return torch.zeros(written.shape, dtype=torch.int32, device=written.device)
    page = torch.arange(written.shape[1], device=written.device)
    return req_to_token[pool[:, None], torch.where(written, page[None, :] * page_size, 0)]


def _divide(slots, divisor, round_toward_zero):
    """``slots // divisor`` rounding down, or toward zero with ``round_toward_zero``."""
    return torch.div(slots, divisor, rounding_mode="trunc" if round_toward_zero else "floor")


def build_mha_page_table(req_to_token, req_pool_indices, seq_lens, page_table, page_size, swa_page_table=None,
                         full_to_swa=None, round_toward_zero=False, pdl=False):
    """The TRT-LLM MHA page table, with its SWA twin; semantics of ``kvdispatch.create_trtllm_mha_page_table``.

    Request ``b`` has ``pages_b`` pages (``_readable_pages``: its length, cut where the table row ends; 0 for
    a bad pool index or a length ``<= 0``), each read at its first slot ``s = req_to_token[pool_b, p * P]``.
    ``page_table[b, p] = s // P`` for ``p < min(pages_b, W)``; with SWA (``full_to_swa`` int32/int64 ``[M]``,
    ``M > 0``) ``swa_page_table[b, p] = full_to_swa[clamp(s, 0, M - 1)] // P`` for ``p < min(pages_b, W2)``, its
    low 32 bits. ``//`` floors, or truncates with ``round_toward_zero``. Untouched: rows ``>= B``, the columns
    past each row's pages, and the whole SWA table when ``M == 0``.
    """
    batch = req_pool_indices.shape[0]
    width = page_table.shape[1]
    swa = swa_page_table is not None and full_to_swa.shape[0] > 0
    span = max(width, swa_page_table.shape[1] if swa else 0)
    if batch == 0 or span == 0:
        return page_table
    pool, pages = _readable_pages(req_to_token, req_pool_indices, seq_lens, page_size)
    page = torch.arange(span, device=page_table.device)
    written = page[None, :] < pages[:, None]  # [B, span]
    slots = _first_slots(req_to_token, pool, written, page_size)
    rows = page_table[:batch]
    rows.copy_(torch.where(written[:, :width], _divide(slots[:, :width], page_size, round_toward_zero).to(torch.int32),
                           rows))
    if swa:
        swa_width = swa_page_table.shape[1]
        mapped = full_to_swa[slots[:, :swa_width].long().clamp(0, full_to_swa.shape[0] - 1)]
        values = _divide(mapped, page_size, round_toward_zero).to(torch.int32)
        swa_rows = swa_page_table[:batch]
        swa_rows.copy_(torch.where(written[:, :swa_width], values, swa_rows))
    return page_table


INT32_MAX = 2**31 - 1


def build_translated_page_table(req_to_token, req_pool_indices, seq_lens, v2p, out, page_size, multiplier=1,
                                max_pages=None, seq_len_delta=0, pdl=False):
    """The unified pool's translated page table; semantics of ``kvdispatch.create_translated_page_table``.

    Request ``b`` has ``pages_b`` live columns (``_readable_pages`` of ``L_b = seq_lens[b] + seq_len_delta``,
    at most ``max_pages``, ``W`` when None). Column ``c`` reads ``t = req_to_token[pool_b, c * P]``, the
    virtual page ``v = 0 if t < 0 else t // P`` and writes ``out[b, c] = min(max(v2p[v] * multiplier, 0),
    2**31 - 1)`` (exact: saturated, never wrapped), or 0 when ``v >= V = len(v2p)``. Untouched: rows ``>= B``
    and every column past a row's live ones.
    """
    batch = req_pool_indices.shape[0]
    columns = out.shape[1] if max_pages is None else min(max_pages, out.shape[1])
    if batch == 0 or columns == 0:
        return out
    pool, pages = _readable_pages(req_to_token, req_pool_indices, seq_lens, page_size, seq_len_delta)
    page = torch.arange(columns, device=out.device)
    live = page[None, :] < pages[:, None]  # [B, columns]
    tokens = _first_slots(req_to_token, pool, live, page_size).long()
    virtual = torch.where(tokens < 0, 0, tokens // page_size)
    size = v2p.shape[0]
    inside = virtual < size
    if size:
        physical = v2p[torch.where(inside, virtual, 0)].long()
    else:
        physical = torch.zeros_like(virtual)
    # |physical| <= 2**31 and |multiplier| <= 2**31 after the clamp: the product is exact in int64, and its
    # saturation is that of the exact product.
    product = physical.clamp(-(2**31), 2**31) * multiplier
    values = torch.where(inside, product.clamp(0, INT32_MAX), 0).to(torch.int32)
    rows = out[:batch, :columns]
    rows.copy_(torch.where(live, values, rows))
    return out


def draft_prefix_cap(window_size, sink_size):
    """The most prefix tokens a segment holds: ``window_size + sink_size`` with a sliding window
    (``window_size > 0``), else ``DRAFT_OFFSET_LIMIT``; never above ``DRAFT_OFFSET_LIMIT``."""
    return min(window_size + sink_size, DRAFT_OFFSET_LIMIT) if window_size > 0 else DRAFT_OFFSET_LIMIT


def build_draft_decode_indices(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, num_steps, topk,
                               page_size=1, positions=None, window_size=0, sink_size=0, v2p=None,
                               write_indptr_start=True, round_toward_zero=False, pdl=False):
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
      ``[0, R)`` and the position in ``[0, C)``; other entries, and entries at columns ``>= W``, are left
      untouched. The value read, ``x``, becomes with ``v2p`` (``[V]``): 0 when ``x < 0`` or ``x // P >= V``
      or ``v2p[x // P] < 0``, else ``v2p[x // P] * P + x % P``; it is stored in ``out``'s dtype (the low
      32 / 64 bits of the exact value).

    ``kv_indptr[s, z]`` for ``z`` in ``1 .. B*K``: the offset of segment ``z`` (``z = B*K``: the row's used
    length); with ``positions`` (``[>= B*K]``), ``sum(p[:z]) + z * it`` where ``p = min(max(positions, 0),
    cap)``. ``kv_indptr[s, 0] = 0`` when ``write_indptr_start``. Offsets and sums saturate at
    ``DRAFT_OFFSET_LIMIT`` (every term is non-negative, so a saturated value is ``min(exact, limit)``), and are
    stored in ``kv_indptr``'s dtype as ``Tensor.to`` does. Lengths are clamped into ``[-BOUND, BOUND]`` first,
    which changes no position that can be read. Untouched: rows ``>= S`` of both outputs, the columns of
    ``kv_indptr`` past ``B*K`` (and column 0 without ``write_indptr_start``), everything with ``B == 0``.

    Memory and time O(S * (W + B*K)): each output column finds its segment by a sorted search.
    """
    batch = req_pool_indices.shape[0]
    segments, steps = batch * topk, num_steps
    if segments == 0 or steps == 0:
        return out
    device = out.device
    cap = draft_prefix_cap(window_size, sink_size)
    lengths = seq_lens[:batch].long().clamp(-BOUND, BOUND)
    counts = lengths.clamp(0, cap)  # [B]
    request = torch.arange(segments, device=device) // topk
    branch = torch.arange(segments, device=device) % topk
    draft = torch.arange(1, steps + 1, device=device)  # it, per step
    before = (torch.cumsum(counts, 0) - counts).clamp(max=DRAFT_OFFSET_LIMIT)  # exact: < 2**31 terms of <= 2**32
    offsets = (before[request] * topk)[None, :] + (request * topk)[None, :] * draft[:, None] \
        + branch[None, :] * (counts[request][None, :] + draft[:, None])
    offsets = offsets.clamp(max=DRAFT_OFFSET_LIMIT)  # [S, B*K]
    ends = (offsets + counts[request][None, :] + draft[:, None]).clamp(max=DRAFT_OFFSET_LIMIT)

    indptr_rows = kv_indptr[:steps]
    if positions is None:
        indptr_values = ends
    else:
        counted = positions[:segments].long().clamp(0, cap)
        through = torch.cumsum(counted, 0).clamp(max=DRAFT_OFFSET_LIMIT)  # exact, as `before`
        segment_number = torch.arange(1, segments + 1, device=device)
        indptr_values = (through[None, :] + segment_number[None, :] * draft[:, None]).clamp(max=DRAFT_OFFSET_LIMIT)
    indptr_rows[:, 1: segments + 1] = indptr_values.to(kv_indptr.dtype)
    if write_indptr_start:
        indptr_rows[:, 0] = 0

    width = out.shape[1]
    if width == 0:
        return out
    column = torch.arange(width, device=device)
    owner = torch.searchsorted(ends, column[None, :].expand(steps, width).contiguous(), right=True)  # [S, W]
    inside = owner < segments
    owner = owner.clamp(max=segments - 1)
    entry = column[None, :] - torch.gather(offsets, 1, owner)  # < the segment's length where inside
    b = request[owner]
    length, count = lengths[b], counts[b]
    sink = torch.clamp(count, max=sink_size) if window_size > 0 else count
    in_prefix = entry < count
    prefix_position = torch.where(entry < sink, entry, length - count + entry)
    remainder = torch.fmod(length, page_size) if round_toward_zero else torch.remainder(length, page_size)
    pages_per_branch = torch.div(remainder + steps + page_size - 1, page_size, rounding_mode="floor")
    slot_start = length + branch[owner] * pages_per_branch * page_size
    position = torch.where(in_prefix, prefix_position, slot_start + entry - count)
    rows, cols = req_to_token.shape
    pool = req_pool_indices[:batch].long()[b]
    readable = inside & (pool >= 0) & (pool < rows) & (position >= 0) & (position < cols)
    if rows == 0 or cols == 0:
        return out
    values = req_to_token[torch.where(readable, pool, 0), torch.where(readable, position, 0)].long()
    if v2p is not None:
        values = _translated(values, v2p, page_size)
    target = out[:steps]
    target.copy_(torch.where(readable, values.to(out.dtype), target))
    return out


def _translated(values, v2p, page_size):
    """``v2p[x // P] * P + x % P`` (the low 64 bits of the exact value) for ``x >= 0`` with ``x // P`` inside
    ``v2p`` and a non-negative entry there; 0 otherwise."""
    size = v2p.shape[0]
    page = torch.div(values, page_size, rounding_mode="floor")
    inside = (values >= 0) & (page < size)
    if size == 0:
        return torch.zeros_like(values)
    mapped = v2p[torch.where(inside, page, 0)].long()
    return torch.where(inside & (mapped >= 0), mapped * page_size + (values - page * page_size), 0)


def dcp_owned_counts(seq_lens, dcp_size, dcp_rank, kv_start_idx=None):
    """Per request, how many positions of ``[start_b, start_b + seq_lens[b])`` rank ``dcp_rank`` owns (those
    with ``p mod dcp_size == dcp_rank``; ``start_b = kv_start_idx[b]``, 0 when absent); int64 ``[B]``, negative
    where the length is (``-count`` of ``[start_b + seq_lens[b], start_b)``).

    ``floor((start + len - 1 - rank) / D) - floor((start - 1 - rank) / D)``, computed from the quotients and
    remainders of ``start`` and ``len`` separately so that it is exact for every int32/int64 value.
    """
    lengths = seq_lens.long()
    start = kv_start_idx.long() if kv_start_idx is not None else torch.zeros_like(lengths)
    start_rem = torch.remainder(start, dcp_size)
    len_quot = torch.div(lengths, dcp_size, rounding_mode="floor")
    len_rem = lengths - len_quot * dcp_size
    before_end = torch.div(start_rem + len_rem - 1 - dcp_rank, dcp_size, rounding_mode="floor")
    before_start = torch.div(start_rem - 1 - dcp_rank, dcp_size, rounding_mode="floor")
    return len_quot + before_end - before_start


def build_dcp_token_indices(req_to_token, req_pool_indices, local_seq_lens, kv_indptr, out, dcp_size, dcp_rank,
                            kv_start_idx=None, round_toward_zero=False, pdl=False):
    """Token-level CSR indices of one decode-context-parallel rank; semantics of
    ``kvdispatch.create_dcp_kv_indices``.

    ``out``: int32 or int64 ``[N]``. Request ``b`` reads its table row at positions ``first_b + j * D``
    (``D = dcp_size``), where ``first_b`` is the first position ``>= start_b`` with ``first_b mod D ==
    dcp_rank``; it has ``count_b = min(local_seq_lens[b], ceil((C - first_b) / D))`` tokens (0 when that is
    ``<= 0``, when ``first_b`` lies outside ``[0, C)`` or the pool index outside ``[0, R)``) and writes
    ``out[kv_indptr[b] + j] = req_to_token[req_pool_indices[b], first_b + j * D] // D`` for those whose
    target lies in ``[0, N)`` (floor division; truncation with ``round_toward_zero``), in ``out``'s dtype.
    Untouched: every position no request writes. Overlapping rows as in ``build_token_indices``.
    """
    batch, total = req_pool_indices.shape[0], out.shape[0]
    if batch == 0 or total == 0 or req_to_token.numel() == 0:
        return out
    rows, cols = req_to_token.shape
    pool = req_pool_indices.long()
    start = kv_start_idx.long().clamp(-BOUND, BOUND) if kv_start_idx is not None else torch.zeros_like(pool)
    first = start + torch.remainder(dcp_rank - start, dcp_size)
    readable = (pool >= 0) & (pool < rows) & (first >= 0) & (first < cols)
    room = torch.where(readable, (cols - first + dcp_size - 1) // dcp_size, 0)
    count = torch.minimum(local_seq_lens.long().clamp(min=0), room)
    written, owner, token = _csr_targets(kv_indptr, count, total)
    pool, first = pool.clamp(0, rows - 1)[owner], first.clamp(0, cols - 1)[owner]
    position = torch.where(written, first + token * dcp_size, 0)
    values = _divide(req_to_token[pool, position], dcp_size, round_toward_zero)
    out.copy_(torch.where(written, values.to(out.dtype), out))
    return out


def build_dcp_page_table(req_to_token, req_pool_indices, local_seq_lens, out, page_size, dcp_size, dcp_rank,
                         fill_value=None, round_toward_zero=False, pdl=False):
    """Rank-local paged block table under decode context parallel; semantics of
    ``kvdispatch.create_dcp_page_table``.

    ``out``: int32 ``[>= B, W]``. With ``V = page_size * dcp_size`` (a virtual page), row ``b`` gets
    ``pages_b = min(ceil(local_seq_lens[b] / page_size), ceil((C - dcp_rank) / V), W)`` pages (0 when the
    length is ``<= 0`` or the pool index lies outside ``[0, R)``):
    ``out[b, p] = req_to_token[req_pool_indices[b], dcp_rank + p * V] // V`` (floor division; truncation
    with ``round_toward_zero``), then ``fill_value`` up to ``W`` when given. Untouched: rows ``>= B``;
    without ``fill_value``, the columns past each row's pages.
    """
    batch, width = req_pool_indices.shape[0], out.shape[1]
    if batch == 0 or width == 0:
        return out
    rows, cols = req_to_token.shape
    virtual_page = page_size * dcp_size
    pool = req_pool_indices.long()
    lengths = local_seq_lens.long().clamp(0, BOUND)
    wanted = (lengths + page_size - 1) // page_size
    available = -(-(cols - dcp_rank) // virtual_page) if cols > dcp_rank else 0
    pages = torch.where((pool >= 0) & (pool < rows), wanted.clamp(max=min(available, width)), 0)  # [B]

    page = torch.arange(width, device=out.device)
    written = page[None, :] < pages[:, None]  # [B, W]
    if req_to_token.numel():
        positions = torch.where(written, dcp_rank + page[None, :] * virtual_page, 0)
        slots = req_to_token[pool.clamp(0, rows - 1)[:, None], positions]
        values = _divide(slots, virtual_page, round_toward_zero).to(torch.int32)
    else:  # an empty table: every row is empty
        values = torch.zeros(written.shape, dtype=torch.int32, device=out.device)
    return _store_rows(out, written, values, fill_value)
