"""What the ops' torch references share (each op's ``reference``, in ``kvdispatch/ops/<key>.py``, is the torch
backend's kernel of the op and the semantic source of truth that every other backend is tested against).

The references are vectorised over requests, pages and output positions (no Python loop, no host sync). They
allocate temporaries through PyTorch's caching allocator, which CUDA-graph capture routes to the graph's
private pool. Arguments arrive validated (each op's ``check_arguments``).

Integers are exact for every int32/int64 value and every table height and width: a length is compared, not
summed (page ``p`` is live when ``p * page_size - offset < seq_lens[b]``, between int64 values), and an int64
start, CSR pointer or draft length is first clamped into a range that changes no result (no table, output or
page count comes near ``BOUND``) and leaves room for the sums below, so nothing wraps.

Each function takes few tensor operations: on a GPU each is a kernel launch and some host time, which is
what these small builds cost (``benchmarks/torch_backend_ops.py`` counts them against plain PyTorch).

Every reference takes the backends' ``pdl`` argument (programmatic dependent launch) and ignores it: PyTorch
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


def draft_prefix_cap(window_size, sink_size):
    """The most prefix tokens a segment holds: ``window_size + sink_size`` with a sliding window
    (``window_size > 0``), else ``DRAFT_OFFSET_LIMIT``; never above ``DRAFT_OFFSET_LIMIT``."""
    return min(window_size + sink_size, DRAFT_OFFSET_LIMIT) if window_size > 0 else DRAFT_OFFSET_LIMIT


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


