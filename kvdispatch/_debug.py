"""Host-side data checks for ``KVDISPATCH_DEBUG=1`` (or ``true``, ``yes``, ``on``).

Slow on purpose: they copy the index vectors to the host (a device sync) and raise ``ValueError`` naming
the request and the value that the kernels would otherwise silently turn into a safe result (an empty or
short row, a lookup answered by its documented default, a write left out). One ``check_<op>_data`` per op,
called after argument validation; each docstring says what a valid engine call may contain.
Never use them inside CUDA-graph capture.
"""

from __future__ import annotations

import torch

from . import reference
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


def _lookup_pages(values, page_size):
    """``values // page_size`` rounded down (int64 on the host)."""
    return values.long().div(page_size, rounding_mode="floor")


def check_page_table_data(req_to_token, req_pool_indices, seq_lens, out, page_size, kv_start_idx, seqlen_offset):
    """``create_flashmla_kv_indices``: every pool index in ``[0, R)``; ``seq_lens + seqlen_offset >= 0``; a
    non-empty row starts inside the table and ends at or before column ``C``; its ``ceil(L_b / page_size)``
    pages fit ``out``'s width."""
    lengths = _check_rows(req_to_token, req_pool_indices, seq_lens, kv_start_idx, seqlen_offset)
    _check_pages_fit(lengths, page_size, out.shape[1], "out")


def check_token_csr_data(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, kv_start_idx, entry_page_size=1,
                         token_mapping=None):
    """``create_flashinfer_kv_indices``: the rows as for the page table, over a row's ``C * entry_page_size``
    positions; each non-empty row writes inside ``out`` and no two of them share an entry (a row of length 0
    may point anywhere, ``out``'s end included); with ``token_mapping``, every value a token looks up inside
    its ``[0, M)``."""
    lengths = _check_rows(req_to_token, req_pool_indices, seq_lens, kv_start_idx, 0, "seq_lens",
                          entry_page_size=entry_page_size)
    _check_csr_rows(kv_indptr, lengths, seq_lens.cpu(), out)
    if token_mapping is not None:
        _check_token_lookups(req_to_token, req_pool_indices, lengths, kv_start_idx, entry_page_size,
                             token_mapping.shape[0])


def _check_token_lookups(req_to_token, req_pool_indices, lengths, kv_start_idx, entry_page_size, size):
    """Every value ``v = req_to_token[pool_b, q // E] * E + q % E`` of a token ``q`` that a row reads (rows and
    lengths already checked) inside ``[0, size)``. An entry's values are consecutive, so each entry read is
    checked at its first and last token read."""
    pool = req_pool_indices.long().cpu()
    start = kv_start_idx.long().cpu() if kv_start_idx is not None else torch.zeros_like(lengths)
    slots = _host_rows(req_to_token, pool)  # [B, C]
    entry_begin = torch.arange(slots.shape[1])[None, :] * entry_page_size
    first = torch.maximum(entry_begin, start[:, None])  # the first and last position read in each entry
    last = torch.minimum(entry_begin + entry_page_size, (start + lengths)[:, None]) - 1
    read = first <= last
    low = slots * entry_page_size + (first - entry_begin)
    bad = read & ((low < 0) | (low + (last - first) >= size))
    found = _first_bad_entry(bad)
    if found is not None:
        b, e = found
        q = int(first[b, e]) if low[b, e] < 0 else int(first[b, e]) + max(0, size - int(low[b, e]))
        value = int(slots[b, e]) * entry_page_size + q - e * entry_page_size
        raise ValueError(f"request {b}: token {q - int(start[b])} (position {q}, req_to_token[{int(pool[b])}, {e}] "
                         f"= {int(slots[b, e])}) has value {value}, outside token_mapping's [0, {size})")


def check_dcp_token_csr_data(req_to_token, req_pool_indices, local_seq_lens, kv_indptr, out, dcp_size, dcp_rank,
                             kv_start_idx=None, round_toward_zero=False):
    """``create_dcp_kv_indices``: every pool index in ``[0, R)``; ``local_seq_lens >= 0`` (0: a request with no
    token on this rank); a non-empty row's ``kv_start_idx`` inside the table and its last position
    ``first_b + (L_b - 1) * dcp_size`` before column ``C``; each non-empty row writes inside ``out`` and no
    two of them share an entry. Slot values are not checked (any int32 divides). Takes the arguments of its
    validator; ``round_toward_zero`` is not read."""
    lengths = _check_rows(req_to_token, req_pool_indices, local_seq_lens, kv_start_idx, 0, "local_seq_lens",
                          dcp_size, dcp_rank)
    _check_csr_rows(kv_indptr, lengths, local_seq_lens.cpu(), out)


def check_dcp_page_table_data(req_to_token, req_pool_indices, local_seq_lens, out, page_size, dcp_size, dcp_rank,
                              fill_value=None, round_toward_zero=False):
    """``create_dcp_page_table``: every pool index in ``[0, R)``; ``local_seq_lens >= 0``; the rank's last
    token of a non-empty row, at position ``dcp_rank + (L_b - 1) * dcp_size``, before column ``C``; its
    ``ceil(L_b / page_size)`` local pages fit ``out``'s width. Takes the arguments of its validator;
    ``fill_value`` and ``round_toward_zero`` are not read."""
    lengths = _check_rows(req_to_token, req_pool_indices, local_seq_lens, None, 0, "local_seq_lens", dcp_size,
                          dcp_rank)
    _check_pages_fit(lengths, page_size, out.shape[1], "out")


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


def check_mha_page_table_data(req_to_token, req_pool_indices, seq_lens, page_table, page_size, swa_page_table,
                              full_to_swa):
    """``create_trtllm_mha_page_table``: every pool index in ``[0, R)``; ``seq_lens >= 0``; a non-empty row
    ends at or before column ``C``; its ``ceil(L_b / page_size)`` pages fit the width of ``page_table`` and
    of ``swa_page_table``; with the SWA table, every slot it maps (the first slot of each page) inside
    ``full_to_swa``'s ``[0, M)``, where the kernels would clamp it (or, ``M == 0``, write nothing)."""
    lengths = _check_rows(req_to_token, req_pool_indices, seq_lens, None, 0, "seq_lens")
    _check_pages_fit(lengths, page_size, page_table.shape[1], "page_table")
    if swa_page_table is None:
        return
    _check_pages_fit(lengths, page_size, swa_page_table.shape[1], "swa_page_table")
    if swa_page_table.shape[1] == 0:
        return
    size, pool = full_to_swa.shape[0], req_pool_indices.long().cpu()
    slots, live = _first_slots(req_to_token, pool, lengths, page_size, swa_page_table.shape[1])
    bad = _first_bad_entry(live & ((slots < 0) | (slots >= size)))
    if bad is not None:
        b, p = bad
        raise ValueError(f"request {b}: slot {int(slots[b, p])} at req_to_token[{int(pool[b])}, {p * page_size}] "
                         f"(page {p}) is outside full_to_swa's [0, {size})")


def check_translated_page_table_data(req_to_token, req_pool_indices, seq_lens, v2p, out, page_size, multiplier,
                                     max_pages, seq_len_delta):
    """``create_translated_page_table``: every pool index in ``[0, R)``; ``seq_lens + seq_len_delta >= 0``; a
    non-empty row ends at or before column ``C``; its ``ceil(L_b / page_size)`` pages fit the columns it may
    write (``max_pages``, else ``out``'s width); every virtual page a live column reads (``token //
    page_size``, 0 for a negative token, as documented) inside ``v2p``'s ``[0, V)``, and its physical page
    times ``multiplier`` inside ``[0, 2**31 - 1]`` (where the kernels would saturate it). A freed page (a
    negative entry of ``v2p``) is a value, not an error."""
    lengths = _check_rows(req_to_token, req_pool_indices, seq_lens, None, seq_len_delta, "seq_lens + seq_len_delta")
    columns = out.shape[1] if max_pages is None else min(max_pages, out.shape[1])
    _check_pages_fit(lengths, page_size, columns, "out", "columns" if max_pages is None
                     else f"columns (max_pages = {max_pages})")
    size, pool = v2p.shape[0], req_pool_indices.long().cpu()
    tokens, live = _first_slots(req_to_token, pool, lengths, page_size, columns)
    pages = _lookup_pages(tokens.clamp(min=0), page_size)
    bad = _first_bad_entry(live & (pages >= size))
    if bad is not None:
        b, c = bad
        raise ValueError(f"request {b}: req_to_token[{int(pool[b])}, {c * page_size}] = {int(tokens[b, c])} is "
                         f"virtual page {int(pages[b, c])} (column {c}), outside v2p's [0, {size})")
    if not live.any():
        return
    physical = v2p.cpu().long()[pages.clamp(max=size - 1)]
    scaled = physical.clamp(max=2**31) * multiplier  # exact in int64: |multiplier| <= 2**31
    bad = _first_bad_entry(live & (physical >= 0) & ((scaled < 0) | (scaled > reference.INT32_MAX)))
    if bad is not None:
        b, c = bad
        page = int(pages[b, c])
        raise ValueError(f"request {b}: v2p[{page}] = {int(physical[b, c])} times multiplier {multiplier} (column "
                         f"{c}) is outside [0, {reference.INT32_MAX}]")


def check_draft_decode_data(req_to_token, req_pool_indices, seq_lens, out, num_steps, topk, page_size, positions,
                            window_size, sink_size, v2p, round_toward_zero):
    """``create_draft_decode_kv_indices``: with ``num_steps > 0``, every pool index in ``[0, R)``; ``seq_lens >=
    0`` (0: an empty prefix); every draft slot read, up to ``start(b, topk - 1) + num_steps - 1``, before column
    ``C`` (the prefix lies before it); the last step's segments end at or before ``out``'s width ``W``; with
    ``v2p``, every value read (prefix and draft slots) on a page inside ``v2p``'s ``[0, V)`` (a negative value
    is outside); with ``positions``, each of ``positions[:B*K]`` non-negative and the last step's
    ``kv_indptr`` they give at or before ``W`` (a position above the window's cap is SGLang's rule, clamped as
    documented)."""
    batch = req_pool_indices.shape[0]
    if num_steps == 0 or batch == 0:
        return
    rows, cols = req_to_token.shape
    lengths = _check_rows(req_to_token, req_pool_indices, seq_lens, None, 0, "seq_lens")
    remainder = lengths.fmod(page_size) if round_toward_zero else lengths.remainder(page_size)
    branch_span = (remainder + num_steps + page_size - 1).div(page_size, rounding_mode="floor") * page_size
    draft_end = lengths + (topk - 1) * branch_span + num_steps  # past the last draft slot read
    b = _first_bad(draft_end > cols)
    if b is not None:
        raise ValueError(f"request {b}: draft slots up to position {int(draft_end[b]) - 1} (seq_lens[{b}] = "
                         f"{int(lengths[b])}, {topk} branches of {num_steps} steps) run past the table's {cols} "
                         f"columns")
    cap = reference.draft_prefix_cap(window_size, sink_size)
    counts = lengths.clamp(max=cap)
    ends = topk * (torch.cumsum(counts, 0) + torch.arange(1, batch + 1) * num_steps)  # the last step's
    width = out.shape[1]
    b = _first_bad(ends > width)
    if b is not None:
        raise ValueError(f"request {b}: its segments of step {num_steps - 1} end at column {int(ends[b])}, past "
                         f"out's {width} columns")
    if positions is not None:
        _check_draft_positions(positions[: batch * topk].long().cpu(), topk, num_steps, cap, width)
    if v2p is not None:
        _check_draft_translation(req_to_token, req_pool_indices, lengths, counts, branch_span, topk, num_steps,
                                 page_size, window_size, sink_size, v2p)


def _check_draft_positions(positions, topk, num_steps, cap, width):
    """``positions`` (int64 ``[B*K]`` on the host) non-negative, and the last step's ``kv_indptr`` they give,
    ``sum(min(p[:z + 1], cap)) + (z + 1) * num_steps``, at or before ``width``."""
    z = _first_bad(positions < 0)
    if z is not None:
        raise ValueError(f"request {z // topk}: positions[{z}] = {int(positions[z])} (branch {z % topk}) is negative")
    ends = torch.cumsum(positions.clamp(max=cap), 0) + torch.arange(1, positions.shape[0] + 1) * num_steps
    z = _first_bad(ends > width)
    if z is not None:
        raise ValueError(f"request {z // topk}: positions[{z}] = {int(positions[z])} (branch {z % topk}) puts "
                         f"kv_indptr[{num_steps - 1}, {z + 1}] at {int(ends[z])}, past out's {width} columns")


def _check_draft_translation(req_to_token, req_pool_indices, lengths, counts, branch_span, topk, num_steps, page_size,
                             window_size, sink_size, v2p):
    """Every value the draft op reads (rows and lengths already checked) on a page inside ``v2p``."""
    size, cols = v2p.shape[0], req_to_token.shape[1]
    pool = req_pool_indices.long().cpu()
    position = torch.arange(cols)[None, :]
    sink = counts.clamp(max=sink_size) if window_size > 0 else counts
    length, span = lengths[:, None], branch_span[:, None]
    prefix = (position < sink[:, None]) | ((position >= length - counts[:, None] + sink[:, None]) & (position < length))
    past = position - length
    draft = (past >= 0) & (past.div(span, rounding_mode="floor") < topk) & (past.remainder(span) < num_steps)
    read = prefix | draft  # [B, C]
    values = _host_rows(req_to_token, pool)
    pages = _lookup_pages(values, page_size)
    bad = _first_bad_entry(read & ((pages < 0) | (pages >= size)))
    if bad is not None:
        b, q = bad
        raise ValueError(f"request {b}: req_to_token[{int(pool[b])}, {q}] = {int(values[b, q])} is on page "
                         f"{int(pages[b, q])}, outside v2p's [0, {size})")
