"""Each request's strided run of a source table row compacted into a ragged CSR: the op ``compact_csr``.

Its argument checks, its data checks (``KVDISPATCH_DEBUG``), its torch reference (the torch backend and
the semantics every backend is tested against) and its declaration (``kvdispatch.op.declare``), which makes
the public function, the custom op and the dispatch entry.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._debug import _check_csr_rows, _first_bad
from .._validate import (_INT32_MAX, _check_apart, _csr_out, _index_vector, _int32_tensor, _python_int,
                         _tensor)
from ..reference import BOUND, _csr_reads, _store
from ..op import declare

__all__ = ["create_compact_kv_indices"]

# The bound of ``max_count``: no row of any table or output comes near it.
MAX_COUNT = 2**62


def check_arguments(source, lens, kv_indptr, out, row_step=1, source_indptr=None, offset=0, step=1,
                    empty_fill=None, max_count=None, memory=True):
    """Validate ``create_compact_kv_indices`` arguments; returns the device (``memory``: False checks metadata
    only, for the fake)."""
    _int32_tensor("source", source, 2)
    device = source.device
    _tensor("lens", lens)
    batch = lens.shape[0] if lens.dim() == 1 else -1
    for name, t in (("lens", lens), ("kv_indptr", kv_indptr), ("source_indptr", source_indptr)):
        if t is not None:
            _tensor(name, t)
            if t.device != device:
                raise ValueError(f"{name} is on {t.device}, expected {device} (the device of source)")
            _index_vector(name, t, device, batch, at_least=name != "lens")
    _csr_out(out, device, "source")
    _python_int("row_step", row_step, 0, _INT32_MAX)
    _python_int("offset", offset, 0, _INT32_MAX)
    _python_int("step", step, 1, _INT32_MAX)
    if empty_fill is not None:
        _python_int("empty_fill", empty_fill, -(2**31), _INT32_MAX)
    if max_count is not None:
        _python_int("max_count", max_count, 0, MAX_COUNT)
    if memory:
        _check_apart((("out", out),), (("source", source), ("lens", lens), ("kv_indptr", kv_indptr),
                                       ("source_indptr", source_indptr)))
    return device


def _rows(source, lens, row_step, source_indptr, offset, step, max_count):
    """``(row, first, count, readable)`` of every request (int64 ``[B]`` each, ``readable`` bool): its source row
    ``b * row_step``, its first position, its entries (0 where the row is unreadable or the length ``<= 0``)."""
    rows, cols = source.shape
    row = torch.arange(lens.shape[0], device=lens.device) * row_step
    if source_indptr is None:
        first = torch.full_like(row, offset)
    else:
        first = source_indptr[: lens.shape[0]].long().clamp(-BOUND, BOUND) + offset
    readable = (row < rows) & (first >= 0) & (first < cols)
    room = torch.div(cols - first.clamp(0, cols) + (step - 1), step, rounding_mode="floor")
    count = torch.minimum(lens.long().clamp(min=0), room).clamp_(max=MAX_COUNT if max_count is None else max_count)
    return row, first, count.masked_fill_(~readable, 0), readable


def check_data(source, lens, kv_indptr, out, row_step=1, source_indptr=None, offset=0, step=1, empty_fill=None,
               max_count=None):
    """``create_compact_kv_indices``: ``lens >= 0``; a non-empty request's source row inside ``[0, R)``, its first
    position inside ``[0, C)`` and its ``lens[b]`` entries (at most ``max_count``) before column ``C``; each row
    writes inside ``out`` (a placeholder of ``empty_fill`` counts as one entry) and no two of them share one."""
    requested = lens.long().cpu()
    b = _first_bad(requested < 0)
    if b is not None:
        raise ValueError(f"request {b}: lens[{b}] = {int(requested[b])} is negative")
    row, first, count, readable = (t.cpu() for t in _rows(source, lens, row_step, source_indptr, offset, step,
                                                         max_count))
    wanted = requested if max_count is None else requested.clamp(max=max_count)
    b = _first_bad((wanted > 0) & ~readable)
    if b is not None:
        raise ValueError(f"request {b}: its source row {int(row[b])} or first position {int(first[b])} lies outside "
                         f"source's {tuple(source.shape)}")
    b = _first_bad(wanted > count)
    if b is not None:
        raise ValueError(f"request {b}: {int(wanted[b])} entries every {step} from position {int(first[b])} run past "
                         f"source's {source.shape[1]} columns")
    written = torch.where((requested == 0) & (empty_fill is not None), 1, wanted)
    _check_csr_rows(kv_indptr, written, requested, out)


def reference(source, lens, kv_indptr, out, row_step=1, source_indptr=None, offset=0, step=1, empty_fill=None,
              max_count=None, pdl=False):
    """Ragged CSR of each request's strided run of a source row; semantics of
    ``kvdispatch.create_compact_kv_indices``.

    ``out``: int32 or int64 ``[N]``. Request ``b < B`` reads row ``r_b = b * row_step`` of ``source`` from
    ``first_b = source_indptr[b] + offset`` (``offset`` without ``source_indptr``) every ``step`` positions:
    ``count_b = min(lens[b], ceil((C - first_b) / step), max_count)`` entries (0 when that is ``<= 0``, or
    ``r_b >= R``, or ``first_b`` outside ``[0, C)``), ``out[kv_indptr[b] + j] = source[r_b, first_b + j * step]``
    for those whose target lies in ``[0, N)``. With ``empty_fill``, a request with ``lens[b] == 0`` writes
    ``out[kv_indptr[b]] = empty_fill`` (where inside ``out``). Untouched: every position no request writes.
    Overlapping rows: each overlapped entry holds one covering request's value; every other entry is exact.
    """
    batch, total = lens.shape[0], out.shape[0]
    rows, cols = source.shape
    if batch == 0 or total == 0:
        return out
    row, first, count, _ = _rows(source, lens, row_step, source_indptr, offset, step, max_count)
    # A placeholder is a row of one entry whose owner is marked by row -1.
    placeholder = (lens == 0) if empty_fill is not None else torch.zeros_like(count, dtype=torch.bool)
    count = torch.where(placeholder, 1, count)
    owner = torch.where(placeholder, -1, row.clamp(max=max(rows - 1, 0)))
    most = max(-(-cols // step), 1)
    written, owner, position = _csr_reads(kv_indptr, count, most, owner, first.clamp(0, max(cols - 1, 0)), step,
                                          total, max(cols, 1))
    if rows and cols:
        values = source[owner.clamp(min=0), position].long()
    else:
        values = torch.zeros_like(position)
    if empty_fill is not None:
        values = torch.where(owner < 0, empty_fill, values)
    _store(out, written, values)
    return out


@declare("compact_csr", outputs=("out",), check=check_arguments, check_data=check_data, reference=reference)
def create_compact_kv_indices(source: Tensor, lens: Tensor, kv_indptr: Tensor, out: Tensor, *, row_step: int = 1,
                              source_indptr: Tensor | None = None, offset: int = 0, step: int = 1,
                              empty_fill: int | None = None, max_count: int | None = None,
                              backend: str | None = None, enable_pdl: bool | None = None) -> Tensor:
    """Compact each request's run of a source table row (every ``step``-th entry from its first) into the
    ragged CSR ``out``: a rectangular token table to ragged ids (``row_step``: the table rows between two
    requests), or one decode-context-parallel rank's share of a CSR (``source`` the CSR's ids as one row,
    ``row_step=0``, ``source_indptr`` its row starts, ``offset`` the rank, ``step`` the DCP size).

    For request ``b < B`` (``B = lens.shape[0]``), with ``r_b = b * row_step`` and ``first_b =
    source_indptr[b] + offset`` (``offset`` without ``source_indptr``), for ``j < min(lens[b], max_count)``::

        out[kv_indptr[b] + j] = source[r_b, first_b + j * step]

    written in ``out``'s dtype. With ``empty_fill``, a request with ``lens[b] == 0`` writes ``out[kv_indptr[b]]
    = empty_fill`` (attention kernels that refuse an empty row get one placeholder entry).

    Args:
        source: int32 ``[R, C]``, last dim contiguous, any row stride.
        lens: int32/int64 ``[B]`` entries per request.
        kv_indptr: int32/int64 ``[>= B]`` first output position per request (only ``[:B]`` is read).
        out: int32/int64 ``[N]``, contiguous. Written in place.
        row_step: int in ``[0, 2**31 - 1]``, source rows from one request to the next (0: all read row 0).
        source_indptr: optional int32/int64 ``[>= B]`` first source position per request (``[:B]`` read).
        offset: int in ``[0, 2**31 - 1]`` added to each first position; step: int in ``[1, 2**31 - 1]``.
        empty_fill: optional int32 value of an empty request's placeholder entry.
        max_count: optional int in ``[0, 2**62]``, the most entries a request writes.
        backend, enable_pdl: as for ``create_flashmla_kv_indices``.

    Left untouched: every position no request writes. No write ever lands outside ``out``, whatever
    ``kv_indptr`` says; a row ends at the source row's last column; a source row at or past ``R`` or a first
    position outside ``[0, C)`` gives an empty row, as does a length ``< 0``. Overlapping ``kv_indptr`` rows as
    for ``create_flashinfer_kv_indices``. No host sync, no device allocation on the GPU backends.
    Raises ``TypeError``/``ValueError`` naming the argument before anything is written.

    Returns:
        ``out``.
    """
