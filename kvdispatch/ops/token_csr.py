"""Token-level CSR indices (FlashInfer, Aiter non-MLA): the op ``token_csr``.

Its argument checks, its data checks (``KVDISPATCH_DEBUG``), its torch reference (the torch backend and
the semantics every backend is tested against) and its declaration (``kvdispatch.op.declare``), which makes
the public function, the custom op and the dispatch entry.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._debug import _check_csr_rows, _check_rows, _first_bad_entry, _host_rows
from .._validate import (_NOTHING, _apart, _check_apart, _common, _contiguous_vector, _csr_out, _index_span,
                         _index_vector, _int32_span, _mapping_span, _out_vector_span, _python_int, _small_int)
from ..grid import MAX_PAGE_SIZE
from ..reference import _clamped_pool, _csr_reads, _store
from ..op import declare

__all__ = ["create_flashinfer_kv_indices"]


# ``entry_page_size`` of an ordinary call, compared by identity on the hot path (CPython keeps one object per
# small int); any other object, an equal one included, takes the options' checks.
_ENTRY_PAGE_SIZE_DEFAULT = 1


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


def _mapped(values, token_mapping):
    """``token_mapping[v]`` (int32/int64 ``[M]``) for each ``v`` of ``values`` inside ``[0, M)``, -1 elsewhere."""
    size = token_mapping.shape[0]
    if size == 0:
        return torch.full_like(values, -1)
    clamped = values.clamp(0, min(size - 1, torch.iinfo(values.dtype).max))
    return torch.where(clamped == values, token_mapping[clamped], -1)


def _page_translated(req_to_token, pool, position, v2p, page_size):
    """The unified pool's token ids at ``position`` (int64, inside the table rows ``pool``): the slot ``t`` at the
    first position of the token's page, its virtual page ``v = 0 if t < 0 else t // P`` and ``max(v2p[v], 0) * P
    + position % P`` (entry 0 for ``v >= len(v2p)``), int64 (the low 64 bits)."""
    within = torch.remainder(position, page_size)
    slots = req_to_token[pool, position - within].long()
    pages = torch.div(slots.clamp(min=0), page_size, rounding_mode="floor")
    size = v2p.shape[0]
    entries = v2p[pages.clamp(max=size - 1)].long().clamp(min=0) * (pages < size) if size else torch.zeros_like(pages)
    return torch.add(within, entries, alpha=page_size)


def _check_page_lookups(req_to_token, req_pool_indices, lengths, kv_start_idx, page_size, size):
    """Every virtual page a row's tokens read (through the slot at their page's first position) inside
    ``[0, size)``, the length of ``v2p``."""
    pool = req_pool_indices.long().cpu()
    start = kv_start_idx.long().cpu() if kv_start_idx is not None else torch.zeros_like(lengths)
    slots = _host_rows(req_to_token, pool)  # [B, C]
    position = torch.arange(slots.shape[1])[None, :]
    page_start = start - start.remainder(page_size)
    read = (position >= page_start[:, None]) & (position < (start + lengths)[:, None]) & (position % page_size == 0)
    pages = slots.clamp(min=0).div(page_size, rounding_mode="floor")
    found = _first_bad_entry(read & (pages >= size))
    if found is not None:
        b, c = found
        raise ValueError(f"request {b}: req_to_token[{int(pool[b])}, {c}] = {int(slots[b, c])} is virtual page "
                         f"{int(pages[b, c])}, outside v2p's [0, {size})")


def check_arguments(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, kv_start_idx, entry_page_size=1,
                    token_mapping=None, v2p=None, page_size=1, memory=True, lens_name="seq_lens"):
    """Validate ``create_flashinfer_kv_indices`` arguments; returns the device (``memory``, ``lens_name``: as
    for ``check_page_table_args``)."""
    try:  # hot path, as in check_page_table_args
        device, batch_shape = req_to_token.device, req_pool_indices.shape
        if memory and len(batch_shape) == 1:
            batch = batch_shape[0]
            table = _int32_span(req_to_token, device, 2)
            written = _out_vector_span(out, device)
            pool = _index_span(req_pool_indices, device, batch_shape)
            lens = _index_span(seq_lens, device, batch_shape)
            indptr_shape = kv_indptr.shape
            indptr = (_index_span(kv_indptr, device, indptr_shape)
                      if len(indptr_shape) == 1 and indptr_shape[0] >= batch else None)
            start = _NOTHING if kv_start_idx is None else _index_span(kv_start_idx, device, batch_shape)
            if (table and written and pool and lens and indptr and start
                    and _apart(written, (table, pool, lens, indptr, start))):
                if (entry_page_size is _ENTRY_PAGE_SIZE_DEFAULT and token_mapping is None and v2p is None
                        and page_size is _ENTRY_PAGE_SIZE_DEFAULT):
                    return device
                if _small_int(entry_page_size, 1, MAX_PAGE_SIZE) and v2p is None and _small_int(page_size, 1,
                                                                                                 MAX_PAGE_SIZE):
                    if token_mapping is None:
                        return device
                    mapping = _mapping_span(token_mapping, device)
                    if mapping and _apart(written, (mapping,)):
                        return device
    except (AttributeError, IndexError, TypeError, RuntimeError, NotImplementedError):
        pass
    batch, device = _common(req_to_token, req_pool_indices, seq_lens, kv_start_idx, lens_name)
    _index_vector("kv_indptr", kv_indptr, device, batch, at_least=True)
    _csr_out(out, device, "req_to_token")
    _python_int("entry_page_size", entry_page_size, 1, MAX_PAGE_SIZE)
    if token_mapping is not None:
        _contiguous_vector("token_mapping", token_mapping, device)
    _python_int("page_size", page_size, 1, MAX_PAGE_SIZE)
    if v2p is not None:
        _contiguous_vector("v2p", v2p, device)
        if entry_page_size != 1 or token_mapping is not None:
            raise ValueError(f"v2p translates the slots of a token-granular table: it takes entry_page_size 1 and no "
                             f"token_mapping, got entry_page_size={entry_page_size} and token_mapping "
                             f"{'given' if token_mapping is not None else 'None'}")
    if not memory:
        return device
    _check_apart((("out", out),),
                 (("req_to_token", req_to_token), ("req_pool_indices", req_pool_indices), (lens_name, seq_lens),
                  ("kv_indptr", kv_indptr), ("kv_start_idx", kv_start_idx), ("token_mapping", token_mapping),
                  ("v2p", v2p)))
    return device


def check_data(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, kv_start_idx, entry_page_size=1,
               token_mapping=None, v2p=None, page_size=1):
    """``create_flashinfer_kv_indices``: the rows as for the page table, over a row's ``C * entry_page_size``
    positions; each non-empty row writes inside ``out`` and no two of them share an entry (a row of length 0
    may point anywhere, ``out``'s end included); with ``token_mapping``, every value a token looks up inside
    its ``[0, M)``; with ``v2p``, every virtual page a token reads inside its ``[0, V)``."""
    lengths = _check_rows(req_to_token, req_pool_indices, seq_lens, kv_start_idx, 0, "seq_lens",
                          entry_page_size=entry_page_size)
    _check_csr_rows(kv_indptr, lengths, seq_lens.cpu(), out)
    if token_mapping is not None:
        _check_token_lookups(req_to_token, req_pool_indices, lengths, kv_start_idx, entry_page_size,
                             token_mapping.shape[0])
    if v2p is not None:
        _check_page_lookups(req_to_token, req_pool_indices, lengths, kv_start_idx, page_size, v2p.shape[0])


def reference(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, kv_start_idx=None,
              entry_page_size=1, token_mapping=None, v2p=None, page_size=1, pdl=False):
    """Token-level CSR indices; semantics of ``kvdispatch.create_flashinfer_kv_indices``.

    ``out``: int32 or int64 ``[N]``. With ``E = entry_page_size``, request ``b`` has ``count_b =
    min(seq_lens[b], C * E - start_b)`` tokens (0 when ``seq_lens[b] <= 0`` or its row is unreadable: a pool
    index outside ``[0, R)`` or a start outside ``[0, C * E)``) and writes ``out[kv_indptr[b] + j] =
    token_value(q)`` at position ``q = start_b + j`` for its tokens ``j`` whose target lies in ``[0, N)``.
    Untouched: every position no request writes.

    ``token_value(q)``: ``v = req_to_token[req_pool_indices[b], q // E] * E + q % E`` in int64 (``v`` is the
    entry itself when ``E == 1``); with ``token_mapping`` (int32/int64 ``[M]``), ``token_mapping[v]`` when
    ``0 <= v < M``, else -1. The value is then cast to ``out``'s dtype as ``Tensor.to`` does (int32: its low
    32 bits). With ``v2p`` (``[V]``; ``E`` is 1 and there is no mapping), the unified pool's translated id
    instead: ``t = req_to_token[req_pool_indices[b], q - q % P]`` (the slot at the first position of the token's
    page, ``P = page_size``), ``v = 0 if t < 0 else t // P``, ``value = max(v2p[v], 0) * P + q % P`` (entry 0
    for ``v >= V``), in int64.

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
    if v2p is not None:
        values = _page_translated(req_to_token, pool, position, v2p, page_size)
    elif entry_page_size == 1:
        values = req_to_token[pool, position]
    else:
        entry = torch.div(position, entry_page_size, rounding_mode="floor")
        values = torch.add(torch.remainder(position, entry_page_size), req_to_token[pool, entry],
                           alpha=entry_page_size)  # int64
    if token_mapping is not None:
        values = _mapped(values, token_mapping)
    _store(out, written, values)
    return out


@declare("token_csr", outputs=("out",), check=check_arguments, check_data=check_data,
         reference=reference)
def create_flashinfer_kv_indices(req_to_token: Tensor, req_pool_indices: Tensor, seq_lens: Tensor, kv_indptr: Tensor,
                                 out: Tensor, *, kv_start_idx: Tensor | None = None, entry_page_size: int = 1,
                                 token_mapping: Tensor | None = None, v2p: Tensor | None = None, page_size: int = 1,
                                 backend: str | None = None, enable_pdl: bool | None = None) -> Tensor:
    """Build token-level CSR indices (FlashInfer, Aiter non-MLA) into ``out``.

    For request ``b < B`` and ``j < seq_lens[b]``, at token position ``q = start_b + j``::

        out[kv_indptr[b] + j] = req_to_token[req_pool_indices[b], q]                  # entry_page_size 1
        out[kv_indptr[b] + j] = req_to_token[req_pool_indices[b], q // E] * E + q % E  # E = entry_page_size

    the second in 64-bit integers; then, with ``token_mapping``, the value ``v`` becomes
    ``token_mapping[v]`` when ``0 <= v < M`` and -1 otherwise (negative ``v`` included). With ``v2p``, the
    unified pool's translated token stream (SGLang's packed read table)::

        t = req_to_token[req_pool_indices[b], q - q % P]           # P = page_size: the slot opening q's page
        out[kv_indptr[b] + j] = max(v2p[0 if t < 0 else t // P], 0) * P + q % P

    with entry 0 for a virtual page at or past ``len(v2p)``. The result is written in ``out``'s dtype: for
    int32, its low 32 bits (as ``Tensor.to(torch.int32)``).

    Args:
        req_to_token: int32 ``[R, C]``, last dim contiguous, any row stride.
        req_pool_indices: int32/int64 ``[B]``.
        seq_lens: int32/int64 ``[B]``.
        kv_indptr: int32/int64 ``[>= B]`` (usually ``B + 1``) first output position per request.
        out: int32/int64 ``[N]``, contiguous. Written in place.
        kv_start_idx: optional int32/int64 ``[B]`` first token position per request.
        entry_page_size: int in ``[1, 4096]``: tokens per table entry (a page-granular table of a pool whose
            slots are ``page * E + offset``); a row's readable positions are ``[0, C * E)``.
        token_mapping: optional int32/int64 ``[M]``, contiguous, on the table's device: maps each value
            (a slot) to the written one. Read only inside ``[0, M)``.
        v2p: optional int32/int64 ``[V]``, contiguous, on the table's device: virtual page -> physical page
            (-1: freed), as above; only with ``entry_page_size`` 1 and no ``token_mapping``.
        page_size: int in ``[1, 4096]``: the pages of ``v2p`` (not read without it).
        backend, enable_pdl: as for ``create_flashmla_kv_indices``.

    Left untouched: every position no request writes. No write ever lands outside ``out``, whatever
    ``kv_indptr`` says; a row ends at its last readable position; a bad pool index gives an empty row. Where
    the output ranges of two requests overlap (``kv_indptr`` rows that overlap), each overlapped entry holds
    the value one of the covering requests writes there (which one is not defined); every other entry is
    exact on every backend.
    Raises as ``create_flashmla_kv_indices`` does, also where ``out`` shares memory with an input
    (``token_mapping`` and ``v2p`` included).

    Returns:
        ``out``.
    """
