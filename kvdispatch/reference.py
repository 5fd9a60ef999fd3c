"""The PyTorch backend: the semantic source of truth that every other backend is tested against.

Vectorised over requests, pages and output positions (no Python loop, no host sync). It allocates
temporaries through PyTorch's caching allocator, which CUDA-graph capture routes to the graph's private
pool. Arguments arrive validated (see ``kvdispatch._validate``).

Integers are exact for every int32/int64 value and every table height and width: a length is compared, not
summed (page ``p`` is live when ``p * page_size - offset < seq_lens[b]``, between int64 values), and an int64
start, CSR pointer or draft length is first clamped into a range that changes no result (no table, output or
page count comes near ``BOUND``) and leaves room for the sums below, so nothing wraps.

Each function takes few tensor operations: on a GPU each is a kernel launch and some host time, which is
what these small builds cost (``benchmarks/torch_backend_ops.py`` counts them against plain PyTorch).

Every builder takes the backends' ``pdl`` argument (programmatic dependent launch) and ignores it: PyTorch
launches its own kernels.
"""

from __future__ import annotations

import torch

from .grid import DRAFT_OFFSET_LIMIT

BOUND = 2**62
INT32_MAX = 2**31 - 1


def _clamped_pool(req_to_token, req_pool_indices):
    """``(pool, outside)``: the pool indices clamped into ``[0, R)`` (their dtype) and whether each lay outside
    (bool ``[B]``). ``R >= 1``, of any size: an int32 index is never at or past a table of more than ``2**31``
    rows, so the bound is kept within the indices' dtype rather than narrowed."""
    last = min(req_to_token.shape[0] - 1, torch.iinfo(req_pool_indices.dtype).max)
    pool = req_pool_indices.clamp(0, last)
    return pool, pool != req_pool_indices


def _page_reads(req_to_token, req_pool_indices, lengths, width, page_size, lengths_offset=0, first=0, step=None,
                kv_start_idx=None):
    """What each row of a paged table reads: ``(columns, live, slots)``.

    Column ``p`` of request ``b`` reads position ``q = start_b + first + p * step`` (``step`` defaults to
    ``page_size``, ``start_b`` is ``kv_start_idx[b]``, 0 when absent) of table row ``req_pool_indices[b]``. It is
    live when ``p * page_size < L_b = lengths[b] + lengths_offset`` (``p < ceil(L_b / page_size)``), the pool index
    lies in ``[0, R)``, ``start_b >= 0`` and ``q < C``. ``columns`` (an int ``<= width``) leaves out the columns
    no row can read (``first + p * step >= C``); ``live`` is bool ``[B, columns]``, ``slots`` the entries read
    there (int32 ``[B, columns]``; another entry of the table where not live). ``columns == 0``: both None.

    Exact for every int32/int64 value: the test is ``p * page_size - lengths_offset < lengths[b]``, between
    int64 values, and no position is computed from an unclamped start.
    """
    rows, cols = req_to_token.shape
    step = page_size if step is None else step
    columns = min(width, -(-(cols - first) // step)) if rows and cols > first else 0
    if columns <= 0:
        return 0, None, None
    device = req_to_token.device
    pool, outside = _clamped_pool(req_to_token, req_pool_indices)
    positions = torch.arange(first, first + columns * step, step, device=device)  # [columns], inside [0, C)
    if first == 0 and step == page_size and lengths_offset == 0:
        keys = positions
    else:
        keys = torch.arange(-lengths_offset, columns * page_size - lengths_offset, page_size, device=device)
    if kv_start_idx is not None:  # page p must start before C: p * page_size - offset < C - start_b - offset
        start = kv_start_idx.long()
        clamped = start.clamp(0, cols - 1)
        outside = outside | (clamped != start)
        lengths = torch.minimum(lengths, (cols - lengths_offset) - clamped)
        positions = (clamped[:, None] + positions[None, :]).clamp_(max=cols - 1)
    # A row that reads nothing gets the lowest limit: every key is above it (keys >= -offset > -2**31).
    limit = lengths.masked_fill(outside, torch.iinfo(lengths.dtype).min)
    live = keys[None, :] < limit[:, None]  # [B, columns]
    slots = req_to_token[pool[:, None], positions if positions.dim() == 2 else positions[None, :]]
    return columns, live, slots


def _store(target, live, values):
    """``target`` gets ``values`` where ``live`` (all ``[B, W]`` or ``[N]``) and keeps its values elsewhere;
    ``values`` of another dtype are cast as ``Tensor.to`` casts (int32: the low 32 bits)."""
    if values.dtype == target.dtype or target.dtype == torch.int64:  # the integer values promote to target's dtype
        torch.where(live, values, target, out=target)
    else:
        target.copy_(torch.where(live, values, target))


def _divide(slots, divisor, round_toward_zero):
    """``slots // divisor`` rounding down, or toward zero with ``round_toward_zero``."""
    return torch.div(slots, divisor, rounding_mode="trunc" if round_toward_zero else "floor")


def _store_low_32_bits_of_sum(target, values, offset):
    """``target`` (int32) gets ``values + offset`` (int32/int64 ``[B]`` and a 32-bit int) as C casts it: the low
    32 bits of the exact sum, computed from the operands' low 32 bits so that nothing overflows."""
    if offset:
        values = (values.long() & 0xFFFFFFFF) + (offset & 0xFFFFFFFF)
    target.copy_(values)  # an int64 -> int32 copy keeps the low 32 bits


def build_page_table(req_to_token, req_pool_indices, seq_lens, out, page_size, kv_start_idx=None,
                     seqlen_offset=0, seq_lens_out=None, fill_value=None, round_toward_zero=False, pdl=False):
    """Paged block table; semantics of ``kvdispatch.create_flashmla_kv_indices``.

    ``out``: int32 ``[>= B, W]``. Row ``b`` gets ``pages_b = min(ceil(L_b / page_size), pages that start
    inside the readable table row, W)`` pages (0 when ``L_b <= 0`` or the row is unreadable: a pool index
    outside ``[0, R)`` or a start outside ``[0, C)``), then ``fill_value`` up to ``W`` when given. Untouched: rows
    ``>= B``; without ``fill_value``, the columns past each row's pages. ``seq_lens_out[:B]`` (int32) gets the
    low 32 bits of ``seq_lens + seqlen_offset``. A slot is divided by ``page_size`` rounding down, or toward zero
    with ``round_toward_zero``.
    """
    batch, width = req_pool_indices.shape[0], out.shape[1]
    if seq_lens_out is not None and batch:
        _store_low_32_bits_of_sum(seq_lens_out[:batch], seq_lens[:batch], seqlen_offset)
    if batch == 0 or width == 0:
        return out
    reads = _page_reads(req_to_token, req_pool_indices, seq_lens, width, page_size, seqlen_offset,
                        kv_start_idx=kv_start_idx)
    return _store_pages(out, batch, reads, page_size, fill_value, round_toward_zero)


def _store_pages(out, batch, reads, divisor, fill_value, round_toward_zero):
    """``out[:batch]`` gets ``slot // divisor`` (``_divide``) in the live columns of ``reads`` (``_page_reads``'
    result) and ``fill_value`` in every other column when given; returns ``out``."""
    columns, live, slots = reads
    rows = out[:batch]
    if fill_value is not None:
        rows.fill_(fill_value)
    if columns:
        _store(rows[:, :columns], live, _divide(slots, divisor, round_toward_zero))
    return out


def build_token_indices(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, kv_start_idx=None,
                        entry_page_size=1, token_mapping=None, pdl=False):
    """Token-level CSR indices; semantics of ``kvdispatch.create_flashinfer_kv_indices``.

    ``out``: int32 or int64 ``[N]``. With ``E = entry_page_size``, request ``b`` has ``count_b =
    min(seq_lens[b], C * E - start_b)`` tokens (0 when ``seq_lens[b] <= 0`` or its row is unreadable: a pool
    index outside ``[0, R)`` or a start outside ``[0, C * E)``) and writes ``out[kv_indptr[b] + j] =
    token_value(q)`` at position ``q = start_b + j`` for its tokens ``j`` whose target lies in ``[0, N)``.
    Untouched: every position no request writes.

    ``token_value(q)``: ``v = req_to_token[req_pool_indices[b], q // E] * E + q % E`` in int64 (``v`` is the
    entry itself when ``E == 1``); with ``token_mapping`` (int32/int64 ``[M]``), ``token_mapping[v]`` when
    ``0 <= v < M``, else -1. The value is then cast to ``out``'s dtype as ``Tensor.to`` does (int32: its low
    32 bits).

    Where the output ranges of two requests overlap (bad ``kv_indptr``: valid CSR rows are disjoint), each
    overlapped entry holds the value one of the covering requests writes there (which one is not defined: this
    backend writes each once, with the value of the row reaching farthest, ``_csr_reads``; the GPU backends
    may write any of them); every other entry is exact.
    """
    batch, total = req_pool_indices.shape[0], out.shape[0]
    if batch == 0 or total == 0 or req_to_token.numel() == 0:
        return out
    positions = req_to_token.shape[1] * entry_page_size  # readable positions per row
    pool, outside = _clamped_pool(req_to_token, req_pool_indices)
    if kv_start_idx is None:
        start = 0
        count = seq_lens.clamp(0, min(positions, torch.iinfo(seq_lens.dtype).max))
    else:
        start = kv_start_idx.long().clamp(0, positions - 1)
        outside = outside | (start != kv_start_idx)
        count = torch.minimum(seq_lens.clamp(min=0), positions - start)
    count = count.masked_fill(outside, 0)  # [B]
    written, pool, position = _csr_reads(kv_indptr, count, positions, pool, start, 1, total, positions)
    if entry_page_size == 1:
        values = req_to_token[pool, position]
    else:
        entry = torch.div(position, entry_page_size, rounding_mode="floor")
        values = torch.add(torch.remainder(position, entry_page_size), req_to_token[pool, entry],
                           alpha=entry_page_size)  # int64
    if token_mapping is not None:
        values = _mapped(values, token_mapping)
    _store(out, written, values)
    return out


def _mapped(values, token_mapping):
    """``token_mapping[v]`` (int32/int64 ``[M]``) for each ``v`` of ``values`` inside ``[0, M)``, -1 elsewhere."""
    size = token_mapping.shape[0]
    if size == 0:
        return torch.full_like(values, -1)
    clamped = values.clamp(0, min(size - 1, torch.iinfo(values.dtype).max))
    return torch.where(clamped == values, token_mapping[clamped], -1)


def _csr_reads(kv_indptr, count, max_count, pool, first, stride, total, limit):
    """Which request writes each position of a CSR output of ``total`` entries, and what it reads there.

    Request ``b`` writes its ``count[b]`` tokens (int32/int64 ``[B]``, in ``[0, max_count]``) from ``kv_indptr[b]``
    on, those landing in ``[0, total)``; its token ``j`` reads position ``first[b] + j * stride`` of table row
    ``pool[b]`` (``first``: int64 ``[B]`` or an int; ``pool``: ``[B]``, inside ``[0, R)``).

    Returns ``(written, pool, position)``, each ``[total]``: whether the position is written, the table row
    and the position it reads (clamped into ``[0, limit)``, so always a valid read; meaningful where written).

    Memory O(N + B), time O(N log B + B log B): each output position finds the request that writes it,
    rather than each request expanding its tokens. With the rows sorted by ``kv_indptr``, a running maximum
    of their ends gives, for every position ``t``, the farthest end of the rows starting at or before ``t``
    (found by a binary search over the sorted starts); ``t`` is written iff that end lies past it, by the
    row owning that end. Overlapping rows thus give each covered position once, to one of the rows covering it.
    """
    batch, device = count.shape[0], count.device
    begin = kv_indptr[:batch]
    # Exact from here on: below -max_count a row reaches no position, from total on it starts past them all.
    begin = begin.clamp(-max_count, total) if begin.dtype == torch.int64 else begin.long()
    # Token j = t - begin[b] of row b, written at t, reads first[b] + (t - begin[b]) * stride.
    if torch.is_tensor(first):
        base = torch.sub(first, begin, alpha=stride)
    else:
        base = begin * -stride + first if first else begin * -stride
    begin_sorted, by_start = torch.sort(begin)
    rows = torch.stack([begin + count, pool, base]).index_select(1, by_start)  # [3, B]: end, pool, base
    reach_at = torch.cummax(rows[0], 0).indices  # the row reaching farthest among the first k + 1 starts
    # Column k + 1: that row, for the positions after k + 1 starts; column 0 (reaching nothing) before them all.
    # (Columns, not rows: a gather of whole rows of three int64 is slow on a GPU.)
    owners = torch.zeros((3, batch + 1), dtype=torch.int64, device=device)
    torch.index_select(rows, 1, reach_at, out=owners[:, 1:])
    position = torch.arange(total, device=device)
    end, pool, base = owners.index_select(1, torch.searchsorted(begin_sorted, position, right=True))  # [N] each
    source = torch.add(base, position, alpha=stride).clamp_(0, limit - 1)
    return position < end, pool, source


def build_mha_page_table(req_to_token, req_pool_indices, seq_lens, page_table, page_size, swa_page_table=None,
                         full_to_swa=None, round_toward_zero=False, pdl=False):
    """The TRT-LLM MHA page table, with its SWA twin; semantics of ``kvdispatch.create_trtllm_mha_page_table``.

    Request ``b`` has ``pages_b = min(ceil(L_b / P), ceil(C / P))`` pages (0 for a bad pool index or a length
    ``L_b = seq_lens[b] <= 0``), each read at its first slot ``s = req_to_token[pool_b, p * P]``.
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
    columns, live, slots = _page_reads(req_to_token, req_pool_indices, seq_lens, span, page_size)
    kept = min(width, columns)
    if kept:
        _store(page_table[:batch, :kept], live[:, :kept], _divide(slots[:, :kept], page_size, round_toward_zero))
    if swa and columns:
        kept = min(swa_page_table.shape[1], columns)
        last = min(full_to_swa.shape[0] - 1, INT32_MAX)  # slots are int32
        mapped = full_to_swa[slots[:, :kept].clamp(0, last)]
        _store(swa_page_table[:batch, :kept], live[:, :kept], _divide(mapped, page_size, round_toward_zero))
    return page_table


def build_translated_page_table(req_to_token, req_pool_indices, seq_lens, v2p, out, page_size, multiplier=1,
                                max_pages=None, seq_len_delta=0, pdl=False):
    """The unified pool's translated page table; semantics of ``kvdispatch.create_translated_page_table``.

    Request ``b`` has ``pages_b = min(ceil(L_b / P), ceil(C / P))`` live columns (0 for a bad pool index or
    ``L_b = seq_lens[b] + seq_len_delta <= 0``; at most ``max_pages``, ``W`` when None). Column ``c`` reads ``t =
    req_to_token[pool_b, c * P]``, the virtual page ``v = 0 if t < 0 else t // P`` and writes ``out[b, c] =
    min(max(v2p[v] * multiplier, 0), 2**31 - 1)`` (exact: saturated, never wrapped), or 0 when ``v >= V =
    len(v2p)``. Untouched: rows ``>= B`` and every column past a row's live ones.
    """
    batch = req_pool_indices.shape[0]
    width = out.shape[1] if max_pages is None else min(max_pages, out.shape[1])
    if batch == 0 or width <= 0:
        return out
    columns, live, tokens = _page_reads(req_to_token, req_pool_indices, seq_lens, width, page_size, seq_len_delta)
    if columns == 0:
        return out
    size = v2p.shape[0]
    beyond = size * page_size  # the first token whose virtual page lies past v2p
    if size:
        virtual = torch.div(tokens.clamp(0, min(beyond - 1, INT32_MAX)), page_size, rounding_mode="floor")
        physical = v2p[virtual]
        if multiplier != 1:  # |physical| <= 2**31 and |multiplier| <= 2**31: the product is exact in int64
            physical = (physical.clamp(-(2**31), 2**31) if physical.dtype == torch.int64 else physical.long())
            physical = physical * multiplier
        values = physical.clamp(0, INT32_MAX)
        if beyond <= INT32_MAX:  # else every int32 token lies inside
            values = values * (tokens < beyond)
    else:
        values = torch.zeros_like(tokens)
    _store(out[:batch, :columns], live, values)
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
    counts = lengths.clamp(0, cap)  # n_b, [B]
    before = (torch.cumsum(counts, 0) - counts).clamp(max=DRAFT_OFFSET_LIMIT)  # exact: < 2**31 terms of <= 2**32
    draft = torch.arange(1, steps + 1, device=device)[:, None]  # it, per step
    segment_number = torch.arange(1, segments + 1, device=device)  # z + 1
    # end(s, z) = offset(s, z) + n_b + it = K * before_b + (k + 1) * n_b + (z + 1) * it: each step's segments lie
    # back to back, segment z + 1 starting where z ends.
    first_step_part = torch.addcmul((before * topk)[:, None], counts[:, None],
                                    torch.arange(1, topk + 1, device=device)).view(-1)  # [B*K]
    ends = torch.addcmul(first_step_part, segment_number, draft).clamp_(max=DRAFT_OFFSET_LIMIT)  # [S, B*K]

    indptr_rows = kv_indptr[:steps]
    if positions is None:
        indptr_values = ends
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
    segment_table = _draft_segments(req_to_token, req_pool_indices[:batch], lengths, counts, topk, steps, page_size,
                                    window_size > 0, sink_size, round_toward_zero)
    column = torch.arange(width, device=device)
    owner = torch.searchsorted(ends, column.expand(steps, width).contiguous(), right=True)  # [S, W], in [0, B*K]
    # Segment z starts where z - 1 ends (segment 0 at 0); the row past the last segment starts at its end.
    entry = column - torch.nn.functional.pad(ends, (1, 0)).gather(1, owner)
    if window_size > 0:
        count, prefix_shift, draft_shift, pool, window_shift, sink = segment_table[:, owner]  # [S, W] each
        prefix_shift = torch.where(entry < sink, prefix_shift, window_shift)
    else:  # the last two rows are not read
        count, prefix_shift, draft_shift, pool = segment_table[:4, owner]
    position = entry + torch.where(entry < count, prefix_shift, draft_shift)
    clamped = position.clamp(0, cols - 1)
    values = req_to_token[pool, clamped]
    if v2p is not None:
        values = _translated(values, v2p, page_size)
    _store(out[:steps], clamped == position, values)
    return out


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


def _translated(values, v2p, page_size):
    """``v2p[x // P] * P + x % P`` (the low 64 bits of the exact value) for ``x >= 0`` with ``x // P`` inside
    ``v2p`` and a non-negative entry there; 0 otherwise. int64, the shape of ``values``."""
    size = v2p.shape[0]
    if size == 0:
        return torch.zeros_like(values, dtype=torch.int64)
    page = torch.div(values, page_size, rounding_mode="floor")
    clamped = page.clamp(0, min(size - 1, torch.iinfo(page.dtype).max))
    mapped = v2p[clamped].long()
    translated = torch.add(torch.remainder(values, page_size), mapped, alpha=page_size)
    return translated * ((clamped == page) & (mapped >= 0))


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
    Untouched: every position no request writes. Overlapping rows (each overlapped entry holds one covering
    request's value, every other entry is exact) as in ``build_token_indices``.
    """
    batch, total = req_pool_indices.shape[0], out.shape[0]
    cols = req_to_token.shape[1]
    if batch == 0 or total == 0 or req_to_token.numel() == 0:
        return out
    pool, outside = _clamped_pool(req_to_token, req_pool_indices)
    max_count = -(-cols // dcp_size)
    if kv_start_idx is None:
        first = dcp_rank
        room = -(-(cols - dcp_rank) // dcp_size) if cols > dcp_rank else 0
        count = local_seq_lens.clamp(0, min(room, torch.iinfo(local_seq_lens.dtype).max))
    else:
        start = kv_start_idx.long().clamp(-BOUND, BOUND)
        first = start + torch.remainder(dcp_rank - start, dcp_size)
        clamped = first.clamp(0, cols - 1)
        outside = outside | (clamped != first)
        first = clamped
        count = torch.minimum(local_seq_lens.clamp(min=0), (cols - 1 - first) // dcp_size + 1)
    count = count.masked_fill(outside, 0)  # [B]
    written, pool, position = _csr_reads(kv_indptr, count, max_count, pool, first, dcp_size, total, cols)
    _store(out, written, _divide(req_to_token[pool, position], dcp_size, round_toward_zero))
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
    virtual_page = page_size * dcp_size
    reads = _page_reads(req_to_token, req_pool_indices, local_seq_lens, width, page_size, first=dcp_rank,
                        step=virtual_page)
    return _store_pages(out, batch, reads, virtual_page, fill_value, round_toward_zero)
