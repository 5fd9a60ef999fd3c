"""Host-side data checks for ``KVDISPATCH_DEBUG=1`` (or ``true``, ``yes``, ``on``).

Slow on purpose: they copy the index vectors to the host (a device sync) and raise ``ValueError`` naming
the request and the value that the kernels would otherwise silently turn into a safe result (an empty or
short row, a lookup answered by its documented default, a write left out). One ``check_<op>_data`` per op,
called after argument validation; each docstring says what a valid engine call may contain.
Never use them inside CUDA-graph capture.
"""

from __future__ import annotations

import torch

from ._env import flag
from .reference import BOUND


def _from_env() -> bool:
    return flag("KVDISPATCH_DEBUG")


# Read at import and by ``kvdispatch.reset()``, not per call: an environment lookup costs more host time
# than a whole argument check.
ENABLED = _from_env()


def refresh() -> None:
    global ENABLED
    ENABLED = _from_env()


def enabled() -> bool:
    return ENABLED


def _first_bad(mask):
    bad = mask.nonzero()
    return None if bad.numel() == 0 else int(bad[0, 0])


def _first_bad_entry(mask):
    """``(b, column)`` of the first true entry of the first row of ``mask`` (bool ``[B, N]``) that has one, or
    None."""
    b = _first_bad(mask.any(1))
    return None if b is None else (b, int(mask[b].nonzero()[0, 0]))


def _lookup_pages(values, page_size):
    """``values // page_size`` rounded down (int64 on the host)."""
    return values.long().div(page_size, rounding_mode="floor")


def _check_rows(req_to_token, req_pool_indices, seq_lens, kv_start_idx, lengths_offset,
                lengths_name="seq_lens + seqlen_offset", dcp_size=1, dcp_rank=0, entry_page_size=1):
    """Raise on the first request whose row reads outside the table; else return its lengths, int64 ``[B]``
    on the host, clamped like ``kvdispatch.reference`` so that no comparison here wraps (messages show the
    exact values).

    Request ``b`` reads ``L_b = seq_lens[b] + lengths_offset`` positions ``first_b + j * D`` of its row
    (``D = dcp_size``; ``first_b`` the first position at or after ``kv_start_idx[b]``, 0 when absent, that
    ``dcp_rank`` owns: ``kv_start_idx[b]`` itself when ``D == 1``), of the ``C * entry_page_size`` positions
    a row has. A pool index outside ``[0, R)`` and a negative length are errors; a row of length 0 reads
    nothing, so its start is not checked.
    """
    rows, entries = req_to_token.shape
    cols = entries * entry_page_size
    table = (f"the table's {cols} columns" if entry_page_size == 1
             else f"the row's {cols} positions ({entries} entries of {entry_page_size})")
    pool = req_pool_indices.long().cpu()
    requested = seq_lens.long().cpu()
    lengths = requested.clamp(-BOUND, BOUND) + lengths_offset
    start = kv_start_idx.long().cpu() if kv_start_idx is not None else None

    def exact_length(b):
        return int(requested[b]) + lengths_offset

    b = _first_bad((pool < 0) | (pool >= rows))
    if b is not None:
        raise ValueError(f"request {b}: req_pool_indices[{b}] = {int(pool[b])} is outside [0, {rows})")
    b = _first_bad(lengths < 0)
    if b is not None:
        raise ValueError(f"request {b}: length {exact_length(b)} ({lengths_name}) is negative")
    begin = start.clamp(-BOUND, BOUND) if start is not None else lengths * 0
    b = _first_bad((lengths > 0) & ((begin < 0) | (begin >= cols)))
    if b is not None:
        where = "the table's" if entry_page_size == 1 else "the row's positions"
        raise ValueError(f"request {b}: kv_start_idx[{b}] = {int(start[b])} is outside {where} [0, {cols})")
    first = begin + (dcp_rank - begin).remainder(dcp_size)
    room = (cols - first + dcp_size - 1).div(dcp_size, rounding_mode="floor")  # positions left from first on
    b = _first_bad((lengths > 0) & (lengths > room))  # an empty row reads nothing
    if b is not None:
        if dcp_size == 1:
            raise ValueError(f"request {b}: start {int(first[b])} + length {exact_length(b)} runs past {table}")
        raise ValueError(f"request {b}: {exact_length(b)} positions every {dcp_size} from {int(first[b])} (rank "
                         f"{dcp_rank}) run past {table}")
    return lengths


def _check_pages_fit(lengths, page_size, width, name, columns="columns"):
    """Raise on the first request whose ``ceil(lengths[b] / page_size)`` pages (``lengths``: int64 ``[B]`` >= 0
    on the host) do not fit the ``width`` columns of its row of ``name`` (the kernels would cut the row)."""
    pages = (lengths + page_size - 1).div(page_size, rounding_mode="floor")
    b = _first_bad(pages > width)
    if b is not None:
        raise ValueError(f"request {b}: its {int(pages[b])} pages (length {int(lengths[b])}, page_size {page_size}) "
                         f"do not fit {name}'s {width} {columns}")


def _check_csr_rows(kv_indptr, lengths, exact_lengths, out):
    """Raise on the first request whose CSR row (``lengths[b]`` entries, int64 ``[B]`` >= 0 on the host, from
    ``kv_indptr[b]`` on) writes outside ``out``, then on the first whose row begins inside an earlier one's
    (in the order of their starts). ``exact_lengths``: the caller's length vector, for the messages."""
    begin = kv_indptr[: lengths.shape[0]].long().cpu()
    clamped = begin.clamp(-BOUND, BOUND)
    total = out.shape[0]
    written = lengths > 0  # an empty row writes nothing, wherever it points
    b = _first_bad(written & ((clamped < 0) | (lengths > total - clamped)))
    if b is not None:
        raise ValueError(f"request {b}: kv_indptr[{b}] = {int(begin[b])} with length {int(exact_lengths[b])} "
                         f"writes outside out's {total} entries")
    rows = written.nonzero()[:, 0]
    if rows.numel() < 2:
        return
    order = rows[torch.argsort(clamped[rows], stable=True)]
    ends, reaching = torch.cummax(clamped[order] + lengths[order], 0)
    b = _first_bad(clamped[order[1:]] < ends[:-1])
    if b is not None:
        later, earlier = int(order[b + 1]), int(order[reaching[b]])
        raise ValueError(f"request {later}: kv_indptr[{later}] = {int(begin[later])} starts inside request "
                         f"{earlier}'s entries [{int(begin[earlier])}, {int(ends[b])}) of out")


def _host_rows(req_to_token, pool, step=1):
    """``req_to_token[pool[b], ::step]`` for every request (int64 ``[B, ceil(C / step)]`` on the host); ``pool``:
    the pool indices on the host, all inside the table."""
    return req_to_token[pool.to(req_to_token.device)][:, ::step].cpu().long()


def _first_slots(req_to_token, pool, lengths, page_size, columns):
    """``(slots, live)``: ``slots[b, p] = req_to_token[pool[b], p * page_size]`` (int64 ``[B, columns]``, 0
    where not ``live``) for the pages ``p < min(ceil(L_b / page_size), columns)`` of rows that
    ``_check_rows`` passed (they lie inside the table)."""
    pages = (lengths + page_size - 1).div(page_size, rounding_mode="floor")
    live = torch.arange(columns)[None, :] < pages[:, None]
    slots = torch.zeros(live.shape, dtype=torch.long)
    if live.any():
        first = _host_rows(req_to_token, pool, page_size)[:, :columns]
        slots[:, : first.shape[1]] = first
    return torch.where(live, slots, 0), live


