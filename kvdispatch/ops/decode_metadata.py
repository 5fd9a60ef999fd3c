"""A decode step's attention metadata in one launch: the op ``decode_metadata``.

Lengths, their prefix sums, the page table (through a page map when given), its sliding-window twin and the
sliding-window cache locations: what SGLang's TRT-LLM MHA and FlashAttention backends rebuild before each
replayed step. Its argument checks, data checks (``KVDISPATCH_DEBUG``), torch reference and declaration.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._debug import _check_pages_fit, _check_rows, _first_bad
from .._validate import (_check_apart, _check_rows_apart, _common, _contiguous_vector, _index_vector, _python_int,
                         _table_output, check_flag)
from ..grid import MAX_PAGE_SIZE
from ..reference import INT32_MAX, _page_reads, _store
from ..op import declare

__all__ = ["update_decode_metadata"]

_INT32_MIN = -(2**31)


def _sums_vector(name, t, batch, device):
    """An int32 1-D output of ``batch`` or ``batch + 1`` entries (the latter: a leading 0 is written too)."""
    _index_vector(name, t, device, 0, at_least=True)
    if t.dtype is not torch.int32:
        raise TypeError(f"{name} must have dtype torch.int32, got {t.dtype}")
    if t.shape[0] not in (batch, batch + 1):
        raise ValueError(f"{name} must have {batch} or {batch + 1} entries (the batch, with or without the leading "
                         f"0), got {t.shape[0]}")


def _distinct_entries(name, t):
    if t is not None and t.shape[0] > 1 and t.stride(0) == 0:
        raise ValueError(f"entries of {name} share memory: its stride is 0 (shape {tuple(t.shape)})")


def check_arguments(req_to_token, req_pool_indices, seq_lens, cache_seqlens, cu_seqlens_k, page_size,
                    seqlen_offset=0, page_table=None, swa_page_table=None, full_to_swa=None, full_v2p=None,
                    swa_v2p=None, zero_tail=False, cu_seqlens_q=None, qlens=None, q_stride=None, out_cache_loc=None,
                    swa_out_cache_loc=None, memory=True):
    """Validate ``update_decode_metadata`` arguments; returns the device."""
    batch, device = _common(req_to_token, req_pool_indices, seq_lens, None)
    _index_vector("cache_seqlens", cache_seqlens, device, batch, at_least=True)
    if cache_seqlens.dtype is not torch.int32:
        raise TypeError(f"cache_seqlens must have dtype torch.int32, got {cache_seqlens.dtype}")
    _sums_vector("cu_seqlens_k", cu_seqlens_k, batch, device)
    _python_int("page_size", page_size, 1, MAX_PAGE_SIZE)
    _python_int("seqlen_offset", seqlen_offset, _INT32_MIN, INT32_MAX)
    check_flag("zero_tail", zero_tail)
    if page_table is not None:
        _table_output("page_table", page_table, batch, device)
    elif full_v2p is not None or swa_page_table is not None or zero_tail:
        given = "full_v2p" if full_v2p is not None else "swa_page_table" if swa_page_table is not None else "zero_tail"
        raise ValueError(f"{given} was given without page_table")
    if swa_page_table is not None:
        _table_output("swa_page_table", swa_page_table, batch, device)
        if full_to_swa is None and swa_v2p is None:
            raise ValueError("swa_page_table needs full_to_swa (a slot map) or swa_v2p (a page map)")
    elif swa_v2p is not None:
        raise ValueError("swa_v2p was given without swa_page_table")
    if swa_out_cache_loc is not None:
        _index_vector("swa_out_cache_loc", swa_out_cache_loc, device, 0, at_least=True)
        if full_to_swa is None:
            raise ValueError("swa_out_cache_loc was given without full_to_swa")
        if out_cache_loc is not None:
            _index_vector("out_cache_loc", out_cache_loc, device, 0, at_least=True)
    elif out_cache_loc is not None:
        raise ValueError("out_cache_loc was given without swa_out_cache_loc")
    if full_to_swa is not None and swa_page_table is None and swa_out_cache_loc is None:
        raise ValueError("full_to_swa was given without swa_page_table or swa_out_cache_loc")
    for name, mapping in (("full_to_swa", full_to_swa), ("full_v2p", full_v2p), ("swa_v2p", swa_v2p)):
        if mapping is not None:
            _contiguous_vector(name, mapping, device)
    if q_stride is not None:
        _python_int("q_stride", q_stride, _INT32_MIN, INT32_MAX)
        if qlens is not None:
            raise ValueError("qlens and q_stride were both given: cu_seqlens_q is one or the other")
    if qlens is not None:
        _index_vector("qlens", qlens, device, batch)
    if cu_seqlens_q is not None:
        _sums_vector("cu_seqlens_q", cu_seqlens_q, batch, device)
        if qlens is None and q_stride is None:
            raise ValueError("cu_seqlens_q was given without qlens or q_stride")
    elif qlens is not None or q_stride is not None:
        raise ValueError(f"{'qlens' if qlens is not None else 'q_stride'} was given without cu_seqlens_q")
    if not memory:
        return device
    for name, t in (("cache_seqlens", cache_seqlens), ("cu_seqlens_k", cu_seqlens_k), ("cu_seqlens_q", cu_seqlens_q),
                    ("swa_out_cache_loc", swa_out_cache_loc)):
        _distinct_entries(name, t)
    for name, t in (("page_table", page_table), ("swa_page_table", swa_page_table)):
        if t is not None:
            _check_rows_apart(t, name)
    _check_apart((("cache_seqlens", cache_seqlens), ("cu_seqlens_k", cu_seqlens_k), ("page_table", page_table),
                  ("swa_page_table", swa_page_table), ("cu_seqlens_q", cu_seqlens_q),
                  ("swa_out_cache_loc", swa_out_cache_loc)),
                 (("req_to_token", req_to_token), ("req_pool_indices", req_pool_indices), ("seq_lens", seq_lens),
                  ("full_to_swa", full_to_swa), ("full_v2p", full_v2p), ("swa_v2p", swa_v2p), ("qlens", qlens),
                  ("out_cache_loc", out_cache_loc)))
    return device


def check_data(req_to_token, req_pool_indices, seq_lens, page_table, page_size, seqlen_offset, swa_page_table,
               full_to_swa, out_cache_loc, swa_out_cache_loc):
    """``update_decode_metadata``: every translated cache location inside ``full_to_swa``'s ``[0, M)``; with a page
    table, every pool index in ``[0, R)``, ``L_b >= 0``, a non-empty row ending at or before column ``C`` and its
    ``ceil(L_b / page_size)`` pages fitting both tables' widths."""
    if swa_out_cache_loc is not None and out_cache_loc is not None:
        locations = out_cache_loc[:swa_out_cache_loc.shape[0]].long().cpu()
        bad = _first_bad((locations < 0) | (locations >= full_to_swa.shape[0]))
        if bad is not None:
            raise ValueError(f"out_cache_loc[{bad}] = {int(locations[bad])} is outside full_to_swa's "
                             f"[0, {full_to_swa.shape[0]})")
    if page_table is None:
        return
    lengths = _check_rows(req_to_token, req_pool_indices, seq_lens, None, seqlen_offset, "seq_lens")
    for name, table in (("page_table", page_table), ("swa_page_table", swa_page_table)):
        if table is not None:
            _check_pages_fit(lengths, page_size, table.shape[1], name)


def _low_32_bits(values):
    """int64 values as int32 two's complement (their low 32 bits)."""
    return ((values & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000


def _store_ends(target, ends):
    """``target`` ([B] or [B + 1]) gets ``ends`` (int64 ``[B]``), low 32 bits, after a 0 when it has room."""
    if target.shape[0] > ends.shape[0]:
        target[:1].fill_(0)  # a fill, not a copy from the host: capturable in a CUDA graph
        target = target[1:]
    target.copy_(_low_32_bits(ends))


def _paged(slots, page_size, v2p):
    """A page-table entry per slot: ``slot // P``, or through the page map ``v2p`` (``min(max(v2p[v], 0),
    2**31 - 1)`` with ``v = max(slot, 0) // P``, 0 for ``v`` past the map)."""
    pages = torch.div(slots, page_size, rounding_mode="floor")
    if v2p is None:
        return pages
    size = v2p.shape[0]
    if size == 0:
        return torch.zeros_like(pages)
    virtual = pages.clamp(min=0)
    physical = v2p[virtual.clamp(max=size - 1)].clamp(0, INT32_MAX)
    return physical * (virtual < size)


def _swa_mapped(slots, full_to_swa, page_size):
    """``full_to_swa[min(slot, M - 1)] // P``, low 32 bits, -1 for a negative slot or entry (or ``M == 0``)."""
    size = full_to_swa.shape[0]
    if size == 0:
        return torch.full_like(slots, -1, dtype=torch.int64)
    mapped = full_to_swa[slots.long().clamp(0, size - 1)].long()
    mapped = mapped.masked_fill(slots < 0, -1)
    return _low_32_bits(torch.where(mapped < 0, -1, torch.div(mapped, page_size, rounding_mode="floor")))


def reference(req_to_token, req_pool_indices, seq_lens, cache_seqlens, cu_seqlens_k, page_size, seqlen_offset=0,
              page_table=None, swa_page_table=None, full_to_swa=None, full_v2p=None, swa_v2p=None, zero_tail=False,
              cu_seqlens_q=None, qlens=None, q_stride=None, out_cache_loc=None, swa_out_cache_loc=None, pdl=False):
    """One decode step's metadata; semantics of ``kvdispatch.update_decode_metadata``."""
    batch = req_pool_indices.shape[0]
    terms = _low_32_bits(seq_lens.long() + seqlen_offset)
    cache_seqlens[:batch].copy_(terms)
    _store_ends(cu_seqlens_k, torch.cumsum(terms, 0))
    if qlens is not None:
        _store_ends(cu_seqlens_q, torch.cumsum(_low_32_bits(qlens.long()), 0))
    elif cu_seqlens_q is not None:
        _store_ends(cu_seqlens_q, torch.arange(1, batch + 1, device=seq_lens.device) * q_stride)
    if swa_out_cache_loc is not None:
        total = swa_out_cache_loc.shape[0]
        real = min(total, out_cache_loc.shape[0]) if out_cache_loc is not None else 0
        swa_out_cache_loc[real:].fill_(0)
        if real:
            locs = out_cache_loc[:real].long()
            size = full_to_swa.shape[0]
            mapped = full_to_swa[locs.clamp(0, max(size - 1, 0))].long() if size else torch.full_like(locs, -1)
            swa_out_cache_loc[:real].copy_(mapped.masked_fill(locs < 0, -1))
    if page_table is None or batch == 0:
        return cache_seqlens
    for table, kind in ((page_table, "full"), (swa_page_table, "swa")):
        if table is None:
            continue
        width = table.shape[1]
        rows = table[:batch]
        if zero_tail:
            rows.fill_(0)
        columns, live, slots = _page_reads(req_to_token, req_pool_indices, seq_lens, width, page_size, seqlen_offset)
        if not columns:
            continue
        if kind == "full":
            values = _paged(slots, page_size, full_v2p)
        else:
            values = _paged(slots, page_size, swa_v2p) if swa_v2p is not None else _swa_mapped(slots, full_to_swa,
                                                                                                page_size)
        _store(rows[:, :columns], live, values)
    return cache_seqlens


@declare("decode_metadata", outputs=("cache_seqlens", "cu_seqlens_k", "page_table", "swa_page_table", "cu_seqlens_q",
                                     "swa_out_cache_loc"),
         check=check_arguments, check_data=check_data, reference=reference)
def update_decode_metadata(req_to_token: Tensor, req_pool_indices: Tensor, seq_lens: Tensor, cache_seqlens: Tensor,
                           cu_seqlens_k: Tensor, *, page_size: int, seqlen_offset: int = 0,
                           page_table: Tensor | None = None, swa_page_table: Tensor | None = None,
                           full_to_swa: Tensor | None = None, full_v2p: Tensor | None = None,
                           swa_v2p: Tensor | None = None, zero_tail: bool = False,
                           cu_seqlens_q: Tensor | None = None, qlens: Tensor | None = None,
                           q_stride: int | None = None, out_cache_loc: Tensor | None = None,
                           swa_out_cache_loc: Tensor | None = None, backend: str | None = None,
                           enable_pdl: bool | None = None) -> Tensor:
    """Write one decode step's attention metadata in one launch: lengths, prefix sums, page tables, SWA locations.

    With ``L_b = seq_lens[b] + seqlen_offset`` (exact) and ``P = page_size``, for ``b < B``::

        cache_seqlens[b] = L_b                       (its low 32 bits, as every value below)
        cu_seqlens_k: the running sums of cache_seqlens, after a 0 when it has B + 1 entries
        cu_seqlens_q: the running sums of qlens, or (b + 1) * q_stride, laid out as cu_seqlens_k
        slot = req_to_token[req_pool_indices[b], p * P]   for the row's pages p < ceil(L_b / P)
        page_table[b, p] = slot // P, or through full_v2p: min(max(full_v2p[max(slot, 0) // P], 0), 2**31 - 1)
        swa_page_table[b, p] = full_to_swa[min(slot, M - 1)] // P (-1 for a negative slot or entry), or
                               through swa_v2p as page_table through full_v2p
        swa_out_cache_loc[i] = full_to_swa[min(out_cache_loc[i], M - 1)] (-1 for a negative location)
                               for i < min(N, N2), 0 for the rest

    ``//`` rounds down; a page past ``full_v2p`` (``swa_v2p``) gives 0, an empty ``full_to_swa`` gives -1. The
    prefix sums are computed on the device, each program summing the lengths before its row: no host sync.

    Args:
        req_to_token, req_pool_indices, seq_lens: as for ``create_flashmla_kv_indices`` (int32 ``[R, C]``,
            int32/int64 ``[B]``, int32/int64 ``[B]``).
        cache_seqlens: int32 ``[>= B]``; its first ``B`` entries are written.
        cu_seqlens_k: int32 ``[B + 1]`` (entry 0 gets 0) or ``[B]`` (the running sums only).
        page_size: int in ``[1, 4096]``. seqlen_offset: int32-range int added to every length.
        page_table: optional int32 ``[>= B, W]`` (last dim contiguous, any row stride); None writes no table.
        swa_page_table: optional int32 ``[>= B, W2]``, with ``full_to_swa`` or ``swa_v2p`` (which it is read
            through when both are given).
        full_to_swa: int32/int64 ``[M]``, contiguous: the full pool's slot -> the SWA pool's slot.
        full_v2p, swa_v2p: int32/int64 contiguous page maps (virtual page -> physical page).
        zero_tail: bool; columns of rows ``< B`` past the row's pages get 0 (``[0, W)`` and ``[0, W2)``).
        cu_seqlens_q: optional int32 ``[B + 1]`` or ``[B]``, with ``qlens`` (int32/int64 ``[B]``) or
            ``q_stride`` (an int32-range int).
        out_cache_loc: optional int32/int64 ``[N]``; swa_out_cache_loc: int32/int64 ``[N2]``, with
            ``full_to_swa`` (``out_cache_loc`` None: all zeros).
        backend, enable_pdl: as for ``create_flashmla_kv_indices``.

    Left untouched: entries past ``B`` of every per-request output, rows ``>= B`` of the tables, columns past
    each row's pages (unless ``zero_tail``). Bad data never reads or writes out of bounds: a pool index outside
    ``[0, R)`` or ``L_b <= 0`` gives an empty row, a row ends at column ``C``, slots and locations are clamped
    into the map. No host sync and no device allocation on the GPU backends: capturable in a CUDA graph.

    Raises ``TypeError``/``ValueError`` naming the argument before anything is written: bad dtypes, shapes or
    devices, an option without what it needs, outputs sharing memory with an input or each other.

    Returns:
        ``cache_seqlens``.
    """
