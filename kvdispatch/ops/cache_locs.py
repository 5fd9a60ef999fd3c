"""Per-request slices of the token table gathered into cache locations: the op ``cache_locs``.

Its argument checks, its data checks (``KVDISPATCH_DEBUG``), its torch reference (the torch backend and
the semantics every backend is tested against) and its declaration (``kvdispatch.op.declare``), which makes
the public function, the custom op and the dispatch entry.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._debug import _first_bad, _host_rows, _lookup_pages
from .._validate import (_INT32_MAX, _check_apart, _contiguous_vector, _index_table, _index_vector, _python_int,
                         _tensor)
from ..grid import CACHE_LOCS_OFFSET_LIMIT, MAX_PAGE_SIZE
from ..reference import BOUND, _clamped_pool, _store, _translated
from ..op import declare

__all__ = ["create_cache_locs"]


def _output_vector(name, t, device, length=None):
    """An int32/int64 contiguous 1-D output on ``device``, ``length`` entries long when given."""
    _contiguous_vector(name, t, device)
    n = t.shape[0]
    if length is None and n > CACHE_LOCS_OFFSET_LIMIT:
        raise ValueError(f"{name} must have at most {CACHE_LOCS_OFFSET_LIMIT} entries, got {n}")
    if length is not None and n != length:
        raise ValueError(f"{name} must have {length} entries (out.shape[0]), got {n}")


def check_arguments(req_to_token, req_pool_indices, start_offset, out, end_offset=None, width=None,
                    positions_out=None, page_size=1, full_v2p=None, full_out=None, swa_v2p=None, swa_out=None,
                    memory=True):
    """Validate ``create_cache_locs`` arguments; returns the device (``memory``: as for
    ``check_page_table_args``)."""
    _tensor("req_to_token", req_to_token)
    device = req_to_token.device
    _index_table("req_to_token", req_to_token, device, 0, 0)  # int32 or int64: a window of cache locations too
    _tensor("req_pool_indices", req_pool_indices)
    batch = req_pool_indices.shape[0] if req_pool_indices.dim() == 1 else -1
    _index_vector("req_pool_indices", req_pool_indices, device, batch)
    if batch > _INT32_MAX:
        raise ValueError(f"req_pool_indices must have at most {_INT32_MAX} entries, got {batch}")
    _index_vector("start_offset", start_offset, device, batch)
    if (end_offset is None) == (width is None):
        raise ValueError("give exactly one of end_offset (packed slices) and width (fixed-width slices), got "
                         + ("both" if width is not None else "neither"))
    if end_offset is not None:
        _index_vector("end_offset", end_offset, device, batch)
    else:
        _python_int("width", width, 0, _INT32_MAX)
    _python_int("page_size", page_size, 1, MAX_PAGE_SIZE)
    _output_vector("out", out, device)
    if positions_out is not None:
        _output_vector("positions_out", positions_out, device, out.shape[0])
    for kind, v2p, written in (("full", full_v2p, full_out), ("swa", swa_v2p, swa_out)):
        if (v2p is None) != (written is None):
            raise ValueError(f"{kind}_v2p and {kind}_out go together: got "
                             + (f"{kind}_out without {kind}_v2p" if v2p is None else f"{kind}_v2p without {kind}_out"))
        if v2p is not None:
            _contiguous_vector(f"{kind}_v2p", v2p, device)
            _output_vector(f"{kind}_out", written, device, out.shape[0])
    if not memory:
        return device
    _check_apart((("out", out), ("positions_out", positions_out), ("full_out", full_out), ("swa_out", swa_out)),
                 (("req_to_token", req_to_token), ("req_pool_indices", req_pool_indices),
                  ("start_offset", start_offset), ("end_offset", end_offset), ("full_v2p", full_v2p),
                  ("swa_v2p", swa_v2p)))
    return device


def _slices(req_pool_indices, start_offset, end_offset, width):
    """``(start, length, ends)``, int64 ``[B]``: each request's first position (clamped into ``[-BOUND, BOUND]``),
    its length (``end - start`` or ``width``, clamped into ``[0, CACHE_LOCS_OFFSET_LIMIT]``) and the running sum
    of the lengths through it (exact: fewer than 2**31 terms of at most 2**32)."""
    batch = req_pool_indices.shape[0]
    first = start_offset[:batch].long()
    if end_offset is None:
        length = torch.full_like(first, width)
    else:
        last = end_offset[:batch].long()
        difference = last - first  # wraps past 2**63 - 1: a positive exact difference reads negative then
        length = torch.where(last > first, torch.where(difference < 0, CACHE_LOCS_OFFSET_LIMIT, difference), 0)
        length = length.clamp_(max=CACHE_LOCS_OFFSET_LIMIT)
    return first.clamp(-BOUND, BOUND), length, torch.cumsum(length, 0)


def check_data(req_to_token, req_pool_indices, start_offset, out, end_offset, width, page_size, full_v2p,
               swa_v2p):
    """``create_cache_locs``: every request with a non-empty slice has its pool index in ``[0, R)`` and its
    slice inside the row (``0 <= start`` and ``start + length <= C``); ``end_offset >= start_offset``; the
    slices end at or before ``out.shape[0]``; with ``full_v2p`` / ``swa_v2p``, every value read lies on a page
    inside the map (a negative value is outside)."""
    batch = req_pool_indices.shape[0]
    if batch == 0:
        return
    rows, cols = req_to_token.shape
    start, length, ends = (t.cpu() for t in _slices(req_pool_indices, start_offset, end_offset, width))
    if end_offset is not None:
        b = _first_bad(end_offset[:batch].long().cpu() < start_offset[:batch].long().cpu())
        if b is not None:
            raise ValueError(f"request {b}: end_offset[{b}] = {int(end_offset[b])} is before start_offset[{b}] = "
                             f"{int(start_offset[b])}")
    pool = req_pool_indices.long().cpu()
    b = _first_bad((length > 0) & ((pool < 0) | (pool >= rows)))
    if b is not None:
        raise ValueError(f"request {b}: req_pool_indices[{b}] = {int(pool[b])} is outside [0, {rows})")
    b = _first_bad((length > 0) & ((start < 0) | (start + length > cols)))
    if b is not None:
        raise ValueError(f"request {b}: its slice [{int(start[b])}, {int(start[b] + length[b])}) runs outside the "
                         f"table's {cols} columns")
    b = _first_bad(ends > out.shape[0])
    if b is not None:
        raise ValueError(f"request {b}: its slice ends at entry {int(ends[b])}, past out's {out.shape[0]} entries")
    for name, v2p in (("full_v2p", full_v2p), ("swa_v2p", swa_v2p)):
        if v2p is None or cols == 0:
            continue
        values = _host_rows(req_to_token, pool.clamp(0, rows - 1))
        position = torch.arange(cols)[None, :] - start[:, None]
        read = (position >= 0) & (position < length[:, None])
        pages = _lookup_pages(values, page_size)
        bad = read & ((values < 0) | (pages >= v2p.shape[0]))
        b = _first_bad(bad.any(1))
        if b is not None:
            q = int(bad[b].nonzero()[0, 0])
            raise ValueError(f"request {b}: req_to_token[{int(pool[b])}, {q}] = {int(values[b, q])} is on page "
                             f"{int(pages[b, q])}, outside {name}'s [0, {v2p.shape[0]})")


def reference(req_to_token, req_pool_indices, start_offset, out, end_offset=None, width=None, positions_out=None,
              page_size=1, full_v2p=None, full_out=None, swa_v2p=None, swa_out=None, pdl=False):
    """Per-request slices gathered into cache locations; semantics of ``kvdispatch.create_cache_locs``.

    Request ``b`` has ``len_b`` entries (``end_offset[b] - start_offset[b]``, or ``width``; a negative length is
    0) at ``offset_b`` (``len_0 + ... + len_{b-1}``, or ``b * width``); entry ``j`` lands at ``d = offset_b + j``
    and reads position ``q = start_offset[b] + j`` of row ``req_pool_indices[b]``. It is written where
    ``d < N`` (``out.shape[0]``), the row lies in ``[0, R)`` and ``q`` in ``[0, C)``: ``out[d]`` the value ``x``
    read, ``positions_out[d] = q``, ``full_out[d]`` / ``swa_out[d]`` ``x`` through the map (``_translated``); each
    in its output's dtype (the low bits). Every other entry is left untouched.
    """
    batch, total = req_pool_indices.shape[0], out.shape[0]
    rows, cols = req_to_token.shape
    if batch == 0 or total == 0 or rows == 0 or cols == 0:
        return out
    start, length, ends = _slices(req_pool_indices, start_offset, end_offset, width)
    column = torch.arange(total, device=out.device)
    owner = torch.searchsorted(ends, column, right=True).clamp_(max=batch - 1)  # the first slice ending past d
    position = start[owner] + column - (ends[owner] - length[owner])
    pool, outside = _clamped_pool(req_to_token, req_pool_indices)
    live = (column < ends[-1]) & ~outside[owner] & (position >= 0) & (position < cols)
    values = req_to_token[pool[owner], position.clamp(0, cols - 1)]
    _store(out, live, values)
    if positions_out is not None:
        _store(positions_out, live, position)
    for v2p, written in ((full_v2p, full_out), (swa_v2p, swa_out)):
        if v2p is not None:
            _store(written, live, _translated(values, v2p, page_size))
    return out


@declare("cache_locs", outputs=("out", "positions_out", "full_out", "swa_out"), check=check_arguments,
         check_data=check_data, reference=reference)
def create_cache_locs(req_to_token: Tensor, req_pool_indices: Tensor, start_offset: Tensor, out: Tensor, *,
                      end_offset: Tensor | None = None, width: int | None = None, positions_out: Tensor | None = None,
                      page_size: int = 1, full_v2p: Tensor | None = None, full_out: Tensor | None = None,
                      swa_v2p: Tensor | None = None, swa_out: Tensor | None = None, backend: str | None = None,
                      enable_pdl: bool | None = None) -> Tensor:
    """Gather each request's slice of its token-table row into ``out``: packed one after another (``end_offset``,
    the cache locations of a ragged extend or verify) or ``width`` entries per request (a uniform one).

    For request ``b < B`` and entry ``j < len_b``, with ``row_b = req_to_token[req_pool_indices[b]]``::

        len_b    = end_offset[b] - start_offset[b]   (packed; 0 when negative)  or  width
        offset_b = len_0 + ... + len_{b-1}           (packed)                   or  b * width
        out[offset_b + j] = row_b[start_offset[b] + j]

    The packed offsets are summed on the device: no host sync. Options, written at the same entries:
        positions_out: ``start_offset[b] + j`` (the token positions).
        full_v2p, full_out / swa_v2p, swa_out: the value ``x`` translated through the page-level map at
            ``page_size``: ``v2p[x // P] * P + x % P``, or 0 when ``x < 0``, ``x // P >= V`` or
            ``v2p[x // P] < 0`` (the physical slots of the full and sliding-window pools).

    Args:
        req_to_token: int32/int64 ``[R, C]``, last dim contiguous, any row stride.
        req_pool_indices, start_offset, end_offset: int32/int64 ``[B]``, any stride.
        out: int32/int64 ``[N]``, contiguous, ``N <= 2**32``. Written in place.
        width: int in ``[0, 2**31 - 1]``; exactly one of ``end_offset`` and ``width`` is given.
        positions_out, full_out, swa_out: int32/int64 ``[N]``, contiguous. Written in place.
        page_size: int in ``[1, 4096]`` (the maps' pages); full_v2p, swa_v2p: int32/int64 ``[V]``, contiguous.
        backend, enable_pdl: as for ``create_flashmla_kv_indices``.

    Values are stored in each output's dtype (int32: the low 32 bits). Bad data reads and writes nothing out
    of bounds: a pool index outside ``[0, R)`` leaves the request's entries untouched, a position outside
    ``[0, C)`` is not read (its entries in every output are left untouched), entries at or past ``N`` are not
    written; lengths are clamped into ``[0, 2**32]`` (a longer slice reaches past any ``out``). Left untouched:
    every entry past the last slice, everything when ``B == 0``. No host sync and no device allocation on the
    GPU backends: capturable in a CUDA graph. Raises ``TypeError``/``ValueError`` naming the argument before
    anything is written, also where an output shares memory with an input or another output.

    Returns:
        ``out``.
    """
