"""The PyTorch backend: the semantic source of truth that every other backend is tested against.

Vectorised over requests, pages and output positions (no Python loop, no host sync). It allocates
temporaries through PyTorch's caching allocator, which CUDA-graph capture routes to the graph's private
pool. Arguments arrive validated (see ``kvdispatch._validate``).

Integers are exact for every int32/int64 value: an int64 length or CSR pointer is first clamped into
``[-BOUND, BOUND]``, which changes no result (no table, output or page count comes near ``BOUND``) and
leaves room for the sums below, so nothing wraps.
"""

from __future__ import annotations

import torch

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
                     seqlen_offset=0, seq_lens_out=None, fill_value=None, round_toward_zero=False):
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
                        entry_page_size=1, token_mapping=None):
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

    Memory and time O(N + B): each output position finds the request that writes it, rather than each
    request expanding its tokens. Marking at each ``lo_b`` the farthest ``hi_b`` of the ranges starting
    there, a running maximum gives for every position ``t`` the farthest end of the ranges starting at
    or before ``t``; ``t`` is written iff that end lies past it, by the request owning that end.

    Where ranges overlap (bad ``kv_indptr``: valid CSR rows are disjoint), each covered position is
    written once, with the value of one of the requests covering it (the one whose range reaches
    farthest); the GPU backends may write any of them there.
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
    lo = torch.where(lo < hi, lo, total)  # empty rows mark the spare entry [N], past every position

    # Per start position: the farthest end of the ranges starting there, and a request with that range.
    farthest_end = torch.full((total + 1,), -1, dtype=torch.long, device=device)
    farthest_end.scatter_reduce_(0, lo, hi, "amax")
    requests = torch.arange(batch, device=device)
    owner_at = torch.full((total + 1,), -1, dtype=torch.long, device=device)
    owner_at.scatter_reduce_(0, lo, torch.where(hi == farthest_end[lo], requests, -1), "amax")
    # For each position t: the farthest end of the ranges starting at or before t, and where that range starts.
    reach, reach_start = torch.cummax(farthest_end[:total], 0)
    position = torch.arange(total, device=device)
    written = reach > position
    owner = torch.where(written, owner_at[reach_start], 0)
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


def _divide(slots, divisor, round_toward_zero):
    """``slots // divisor`` rounding down, or toward zero with ``round_toward_zero``."""
    return torch.div(slots, divisor, rounding_mode="trunc" if round_toward_zero else "floor")


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
                            kv_start_idx=None, round_toward_zero=False):
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
                         fill_value=None, round_toward_zero=False):
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
