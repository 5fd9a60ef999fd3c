"""A block table from a ragged token CSR, with its sliding-window twin: the op ``ragged_page_table``.

Its argument checks, its data checks (``KVDISPATCH_DEBUG``), its torch reference (the torch backend and the
semantics every backend is tested against) and its declaration (``kvdispatch.op.declare``), which makes the
public function, the custom op and the dispatch entry.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._debug import _check_pages_fit, _first_bad, _first_bad_entry
from .._validate import _contiguous_vector, _index_span, _index_vector, _mapping_span, _small_int, _tensor
from ..grid import MAX_PAGE_SIZE
from ..reference import _divide, _store
from ..op import declare
from .mha_page_table import check_tables, tables_apart

__all__ = ["create_ragged_page_table"]


def check_arguments(kv_indices, kv_indptr, page_table, page_size, swa_page_table=None, full_to_swa=None,
                    round_toward_zero=False, memory=True):
    """Validate ``create_ragged_page_table`` arguments; returns the device (``memory``: as for
    ``check_page_table_args``)."""
    try:  # hot path, as in check_page_table_args
        device, bounds_shape = kv_indices.device, kv_indptr.shape
        if (memory and len(bounds_shape) == 1 and bounds_shape[0] >= 1 and _small_int(page_size, 1, MAX_PAGE_SIZE)
                and (round_toward_zero is False or round_toward_zero is True)
                and (swa_page_table is None) == (full_to_swa is None)):
            tokens = _mapping_span(kv_indices, device)
            bounds = _index_span(kv_indptr, device, bounds_shape)
            if tokens and bounds and tables_apart(page_table, swa_page_table, full_to_swa, device,
                                                  bounds_shape[0] - 1, (tokens, bounds)):
                return device
    except (AttributeError, IndexError, TypeError, RuntimeError, NotImplementedError):
        pass
    _tensor("kv_indices", kv_indices)
    device = kv_indices.device
    _contiguous_vector("kv_indices", kv_indices, device)
    for name, t in (("kv_indptr", kv_indptr), ("page_table", page_table), ("swa_page_table", swa_page_table),
                    ("full_to_swa", full_to_swa)):
        if isinstance(t, torch.Tensor) and t.device != device:
            raise ValueError(f"{name} is on {t.device}, expected {device} (the device of kv_indices)")
    _index_vector("kv_indptr", kv_indptr, device, 1, at_least=True)
    return check_tables(page_table, page_size, swa_page_table, full_to_swa, round_toward_zero,
                        kv_indptr.shape[0] - 1, device, (("kv_indices", kv_indices), ("kv_indptr", kv_indptr)),
                        memory)


def check_data(kv_indices, kv_indptr, page_table, page_size, swa_page_table, full_to_swa):
    """``create_ragged_page_table``: ``kv_indptr[b] <= kv_indptr[b + 1]``; a non-empty row lies inside
    ``kv_indices``; its ``ceil(L_b / page_size)`` pages fit the width of ``page_table`` and of
    ``swa_page_table``; with the SWA table, every slot it maps (the first token of each page) inside
    ``full_to_swa``'s ``[0, M)``, where the kernels would clamp it (or, ``M == 0``, write nothing)."""
    bounds = kv_indptr.long().cpu()
    start, end, total = bounds[:-1], bounds[1:], kv_indices.shape[0]
    b = _first_bad(end < start)
    if b is not None:
        raise ValueError(f"request {b}: kv_indptr[{b + 1}] = {int(end[b])} is below kv_indptr[{b}] = "
                         f"{int(start[b])} (a negative length)")
    b = _first_bad((end > start) & ((start < 0) | (end > total)))
    if b is not None:
        raise ValueError(f"request {b}: its tokens [{int(start[b])}, {int(end[b])}) are outside kv_indices' "
                         f"{total} entries")
    lengths = end - start
    _check_pages_fit(lengths, page_size, page_table.shape[1], "page_table")
    if swa_page_table is None:
        return
    _check_pages_fit(lengths, page_size, swa_page_table.shape[1], "swa_page_table")
    columns = swa_page_table.shape[1]
    if columns == 0 or total == 0:
        return
    offsets = torch.arange(columns) * page_size
    live = offsets[None, :] < lengths[:, None]
    positions = (start[:, None] + offsets[None, :]).clamp(0, total - 1)
    slots = torch.where(live, kv_indices.cpu().long()[positions], 0)
    size = full_to_swa.shape[0]
    bad = _first_bad_entry(live & ((slots < 0) | (slots >= size)))
    if bad is not None:
        b, p = bad
        raise ValueError(f"request {b}: slot {int(slots[b, p])} at kv_indices[{int(positions[b, p])}] (page {p}) "
                         f"is outside full_to_swa's [0, {size})")


def reference(kv_indices, kv_indptr, page_table, page_size, swa_page_table=None, full_to_swa=None,
              round_toward_zero=False, pdl=False):
    """The block table of a ragged token CSR, with its SWA twin; semantics of ``kvdispatch.create_ragged_page_table``.

    Request ``b < B = kv_indptr.shape[0] - 1`` reads the tokens ``[s, e)`` of ``kv_indices`` (``N`` entries),
    ``s = kv_indptr[b]``, ``e = min(kv_indptr[b + 1], N)``: none when ``s`` lies outside ``[0, N)``. Page ``p``
    is live when ``p * P < e - s``; its slot is ``t = kv_indices[s + p * P]``. ``page_table[b, p] = t // P`` for
    live ``p < W``; with SWA (``full_to_swa`` int32/int64 ``[M]``, ``M > 0``) ``swa_page_table[b, p] =
    full_to_swa[clamp(t, 0, M - 1)] // P`` for live ``p < W2``; both the quotient's low 32 bits. ``//`` floors,
    or truncates with ``round_toward_zero``. Untouched: rows ``>= B``, the columns past each row's pages, and the
    whole SWA table when ``M == 0``.
    """
    batch, total = kv_indptr.shape[0] - 1, kv_indices.shape[0]
    width = page_table.shape[1]
    swa = swa_page_table is not None and full_to_swa.shape[0] > 0
    columns = min(max(width, swa_page_table.shape[1] if swa else 0), -(-total // page_size))
    if batch <= 0 or columns <= 0:
        return page_table
    bounds = kv_indptr.long()
    start, end = bounds[:batch], bounds[1:]
    readable = (start >= 0) & (start < total)
    first = start.clamp(0, total)
    count = end.clamp(-1, total) - first  # exact: both clamped into [-1, N]
    offsets = torch.arange(columns, device=kv_indices.device) * page_size
    live = readable[:, None] & (offsets[None, :] < count[:, None])
    slots = kv_indices[(first[:, None] + offsets[None, :]).clamp(max=total - 1)]
    kept = min(width, columns)
    if kept:
        _store(page_table[:batch, :kept], live[:, :kept], _divide(slots[:, :kept], page_size, round_toward_zero))
    if swa:
        kept = min(swa_page_table.shape[1], columns)
        mapped = full_to_swa[slots[:, :kept].long().clamp(0, full_to_swa.shape[0] - 1)]
        _store(swa_page_table[:batch, :kept], live[:, :kept], _divide(mapped, page_size, round_toward_zero))
    return page_table


@declare("ragged_page_table", outputs=("page_table", "swa_page_table"), check=check_arguments,
         check_data=check_data, reference=reference)
def create_ragged_page_table(kv_indices: Tensor, kv_indptr: Tensor, page_table: Tensor, *, page_size: int,
                             swa_page_table: Tensor | None = None, full_to_swa: Tensor | None = None,
                             round_toward_zero: bool = False, backend: str | None = None,
                             enable_pdl: bool | None = None) -> Tensor:
    """Build the block table of a ragged token CSR (and its sliding-window twin) into ``page_table``.

    For request ``b < B = kv_indptr.shape[0] - 1`` and page ``p < ceil(L_b / page_size)``, with
    ``L_b = kv_indptr[b + 1] - kv_indptr[b]``::

        slot = kv_indices[kv_indptr[b] + p * page_size]
        page_table[b, p] = slot // page_size                                   # p < W
        swa_page_table[b, p] = full_to_swa[clamp(slot, 0, M - 1)] // page_size  # p < W2, with SWA

    ``//`` floors (truncates with ``round_toward_zero``, as SGLang's kernel divides); the values are the
    quotients' low 32 bits. An empty mapping (``M == 0``) writes nothing into ``swa_page_table``.

    Args:
        kv_indices: int32/int64 ``[N]``, contiguous: the token CSR's slots.
        kv_indptr: int32/int64 ``[B + 1]``, any stride: row ``b`` is ``kv_indices[kv_indptr[b]:kv_indptr[b + 1]]``.
        page_table: int32 ``[>= B, W]``, last dim contiguous, any row stride. Written in place.
        page_size: int in ``[1, 4096]``.
        swa_page_table: optional int32 ``[>= B, W2]`` (last dim contiguous, any row stride), given together
            with ``full_to_swa``: int32/int64 ``[M]``, contiguous, the full pool's slot -> SWA pool's slot.
        round_toward_zero: bool; divide negative values rounding toward zero.
        backend: ``"triton"``, ``"cupy"``, ``"torch"``, ``"auto"`` or None (auto, or ``KVDISPATCH_BACKEND``).
        enable_pdl: programmatic dependent launch, as for ``create_flashmla_kv_indices``.

    Left untouched: rows ``>= B`` of both tables and the columns past each row's pages. Bad data never
    reads or writes out of bounds: a row starting outside ``[0, N)`` or of length ``<= 0`` is empty, and a row
    ends at the end of ``kv_indices``. No host sync and no device allocation on the GPU backends: capturable
    in a CUDA graph.

    Raises ``TypeError``/``ValueError`` naming the argument before anything is written: bad dtypes, shapes or
    devices, one of ``swa_page_table``/``full_to_swa`` without the other, outputs sharing memory with an input
    or with each other, rows of a table sharing memory.

    Returns:
        ``page_table``.
    """
