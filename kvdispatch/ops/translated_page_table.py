"""A page table translated through a virtual-to-physical page map (the unified pool): the op ``translated_page_table``.

Its argument checks, its data checks (``KVDISPATCH_DEBUG``), its torch reference (the torch backend and
the semantics every backend is tested against) and its declaration (``kvdispatch.op.declare``), which makes
the public function, the custom op and the dispatch entry.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._debug import _check_pages_fit, _check_rows, _first_bad_entry, _first_slots, _lookup_pages
from .._validate import (_INT32_MAX, _INT32_MIN, _apart, _check_apart, _check_rows_apart, _common, _contiguous_vector,
                         _index_span, _int32_span, _mapping_span, _python_int, _small_int, _table_output)
from ..grid import MAX_PAGE_SIZE
from ..reference import INT32_MAX, _page_reads, _store
from ..op import declare

__all__ = ["create_translated_page_table"]


def check_arguments(req_to_token, req_pool_indices, seq_lens, v2p, out, page_size, multiplier=1,
                    max_pages=None, seq_len_delta=0, fill_value=None, memory=True):
    """Validate ``create_translated_page_table`` arguments; returns the device (``memory``: as for
    ``check_page_table_args``)."""
    try:  # hot path, as in check_page_table_args
        device, batch_shape = req_to_token.device, req_pool_indices.shape
        if (memory and len(batch_shape) == 1 and _small_int(page_size, 1, MAX_PAGE_SIZE) and _small_int(multiplier)
                and _small_int(seq_len_delta) and (fill_value is None or _small_int(fill_value))):
            batch = batch_shape[0]
            table = _int32_span(req_to_token, device, 2)
            written = _int32_span(out, device, 2, batch, True)
            pool = _index_span(req_pool_indices, device, batch_shape)
            lens = _index_span(seq_lens, device, batch_shape)
            mapping = _mapping_span(v2p, device)
            if (table and written and pool and lens and mapping
                    and (max_pages is None or _small_int(max_pages, 0, out.shape[1]))
                    and _apart(written, (table, pool, lens, mapping))):
                return device
    except (AttributeError, IndexError, TypeError, RuntimeError, NotImplementedError):
        pass
    batch, device = _common(req_to_token, req_pool_indices, seq_lens, None)
    _contiguous_vector("v2p", v2p, device)
    _table_output("out", out, batch, device)
    _python_int("page_size", page_size, 1, MAX_PAGE_SIZE)
    _python_int("multiplier", multiplier, _INT32_MIN, _INT32_MAX)
    if max_pages is not None:
        _python_int("max_pages", max_pages, 0, out.shape[1])
    _python_int("seq_len_delta", seq_len_delta, _INT32_MIN, _INT32_MAX)
    if fill_value is not None:
        _python_int("fill_value", fill_value, _INT32_MIN, _INT32_MAX)
    if not memory:
        return device
    _check_rows_apart(out)
    _check_apart((("out", out),),
                 (("req_to_token", req_to_token), ("req_pool_indices", req_pool_indices), ("seq_lens", seq_lens),
                  ("v2p", v2p)))
    return device


def check_data(req_to_token, req_pool_indices, seq_lens, v2p, out, page_size, multiplier,
               max_pages, seq_len_delta, fill_value=None):
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
    bad = _first_bad_entry(live & (physical >= 0) & ((scaled < 0) | (scaled > INT32_MAX)))
    if bad is not None:
        b, c = bad
        page = int(pages[b, c])
        raise ValueError(f"request {b}: v2p[{page}] = {int(physical[b, c])} times multiplier {multiplier} (column "
                         f"{c}) is outside [0, {INT32_MAX}]")


def reference(req_to_token, req_pool_indices, seq_lens, v2p, out, page_size, multiplier=1,
              max_pages=None, seq_len_delta=0, fill_value=None, pdl=False):
    """The unified pool's translated page table; semantics of ``kvdispatch.create_translated_page_table``.

    Request ``b`` has ``pages_b = min(ceil(L_b / P), ceil(C / P))`` live columns (0 for a bad pool index or
    ``L_b = seq_lens[b] + seq_len_delta <= 0``; at most ``max_pages``, ``W`` when None). Column ``c`` reads ``t =
    req_to_token[pool_b, c * P]``, the virtual page ``v = 0 if t < 0 else t // P`` and writes ``out[b, c] =
    min(max(v2p[v] * multiplier, 0), 2**31 - 1)`` (exact: saturated, never wrapped), or 0 when ``v >= V =
    len(v2p)``. With ``fill_value``, the columns ``[pages_b, max_pages)`` get it. Untouched: rows ``>= B``,
    columns ``>= max_pages`` and, without ``fill_value``, every column past a row's live ones.
    """
    batch = req_pool_indices.shape[0]
    width = out.shape[1] if max_pages is None else min(max_pages, out.shape[1])
    if batch == 0 or width <= 0:
        return out
    if fill_value is not None:
        out[:batch, :width].fill_(fill_value)
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


@declare("translated_page_table", outputs=("out",), check=check_arguments, check_data=check_data,
         reference=reference)
def create_translated_page_table(req_to_token: Tensor, req_pool_indices: Tensor, seq_lens: Tensor, v2p: Tensor,
                                 out: Tensor, *, page_size: int, multiplier: int = 1, max_pages: int | None = None,
                                 seq_len_delta: int = 0, fill_value: int | None = None, backend: str | None = None,
                                 enable_pdl: bool | None = None) -> Tensor:
    """Build a page table translated through a virtual-to-physical page map (SGLang's unified pool) into ``out``.

    For request ``b < B`` and column ``c < min(ceil(L_b / page_size), max_pages)``, ``L_b = seq_lens[b] +
    seq_len_delta``::

        token = req_to_token[req_pool_indices[b], c * page_size]
        page = 0 if token < 0 else token // page_size
        out[b, c] = min(max(v2p[page] * multiplier, 0), 2**31 - 1)

    computed exactly (the product saturates at ``2**31 - 1``, it never wraps); a ``page`` at or past
    ``V = len(v2p)`` gives 0, as a freed page (-1) does.

    Args:
        req_to_token: int32 ``[R, C]``, last dim contiguous, any row stride.
        req_pool_indices: int32/int64 ``[B]``.
        seq_lens: int32/int64 ``[B]``.
        v2p: int32/int64 ``[V]``, contiguous: virtual page -> physical page (-1: freed).
        out: int32 ``[>= B, W]``, last dim contiguous, any row stride. Written in place.
        page_size: int in ``[1, 4096]``.
        multiplier: 32-bit int; physical pages are scaled by it (a sub-pool's blocks per page).
        max_pages: optional int in ``[0, W]``: the columns a row may write (None: ``W``).
        seq_len_delta: 32-bit int added to every length (draft tokens in whole-sequence verify).
        fill_value: optional 32-bit int; when given, columns ``[pages_b, max_pages)`` of each row ``b < B`` are
            set to it (a table allocated with ``torch.empty`` then holds no stale column).
        backend, enable_pdl: as for ``create_trtllm_mha_page_table``.

    Left untouched: rows ``>= B``, columns ``>= max_pages`` and, without ``fill_value``, the columns past each
    row's live ones (a reused buffer keeps its stale tail). Bad data never reads or writes out of bounds: a bad
    pool index or a length ``<= 0`` gives an empty row, a row ends at its first column starting at or past
    ``C``. No host sync, no device allocation on the GPU backends.

    Raises ``TypeError``/``ValueError`` naming the argument before anything is written, also where ``out``
    shares memory with an input or its rows share memory.

    Returns:
        ``out``.
    """
