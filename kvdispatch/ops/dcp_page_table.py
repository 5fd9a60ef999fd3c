"""One decode-context-parallel rank's paged block table: the op ``dcp_page_table``.

Its argument checks, its data checks (``KVDISPATCH_DEBUG``), its torch reference (the torch backend and
the semantics every backend is tested against) and its declaration (``kvdispatch.op.declare``), which makes
the public function, the custom op and the dispatch entry.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._debug import _check_pages_fit, _check_rows, _first_bad_entry
from .._validate import _check_apart, _check_dcp, _contiguous_vector
from ..reference import _page_reads, _store, _store_pages
from .page_table import check_arguments as page_table_check_arguments
from ..op import declare

__all__ = ["create_dcp_page_table"]


def check_arguments(req_to_token, req_pool_indices, local_seq_lens, out, page_size, dcp_size, dcp_rank,
                    fill_value=None, round_toward_zero=False, v2p=None, memory=True):
    """Validate ``create_dcp_page_table`` arguments (the page table's, then the DCP integers and ``v2p``); returns
    the device (``memory``: as for ``page_table_check_arguments``)."""
    device = page_table_check_arguments(req_to_token, req_pool_indices, local_seq_lens, out, page_size, None, 0, None,
                                   fill_value, round_toward_zero, memory, "local_seq_lens")
    _check_dcp(dcp_size, dcp_rank, round_toward_zero)
    if v2p is not None:
        _contiguous_vector("v2p", v2p, device)
        if memory:
            _check_apart((("out", out),), (("v2p", v2p),))
    return device


def check_data(req_to_token, req_pool_indices, local_seq_lens, out, page_size, dcp_size, dcp_rank,
               fill_value=None, round_toward_zero=False, v2p=None):
    """``create_dcp_page_table``: every pool index in ``[0, R)``; ``local_seq_lens >= 0``; the rank's last
    token of a non-empty row, at position ``dcp_rank + (L_b - 1) * dcp_size``, before column ``C``; its
    ``ceil(L_b / page_size)`` local pages fit ``out``'s width; with ``v2p``, every page a row reads (0 for a
    negative slot) inside ``v2p``. Takes the arguments of its validator; ``fill_value`` and
    ``round_toward_zero`` are not read."""
    lengths = _check_rows(req_to_token, req_pool_indices, local_seq_lens, None, 0, "local_seq_lens", dcp_size,
                          dcp_rank)
    _check_pages_fit(lengths, page_size, out.shape[1], "out")
    if v2p is not None:
        virtual_page = page_size * dcp_size
        pages = (lengths + page_size - 1).div(page_size, rounding_mode="floor")
        rows = req_to_token[req_pool_indices.long()].cpu().long()[:, dcp_rank::virtual_page]
        live = torch.arange(rows.shape[1])[None, :] < pages[:, None]
        read = rows.clamp(min=0).div(virtual_page, rounding_mode="floor")
        found = _first_bad_entry(live & (read >= v2p.shape[0]))
        if found is not None:
            b, p = found
            raise ValueError(f"request {b}: page {p} (slot {int(rows[b, p])}) reads page {int(read[b, p])} of v2p, "
                             f"outside its [0, {v2p.shape[0]})")


def reference(req_to_token, req_pool_indices, local_seq_lens, out, page_size, dcp_size, dcp_rank,
              fill_value=None, round_toward_zero=False, v2p=None, pdl=False):
    """Rank-local paged block table under decode context parallel; semantics of
    ``kvdispatch.create_dcp_page_table``.

    ``out``: int32 ``[>= B, W]``. With ``V = page_size * dcp_size`` (a virtual page), row ``b`` gets
    ``pages_b = min(ceil(local_seq_lens[b] / page_size), ceil((C - dcp_rank) / V), W)`` pages (0 when the
    length is ``<= 0`` or the pool index lies outside ``[0, R)``):
    ``out[b, p] = req_to_token[req_pool_indices[b], dcp_rank + p * V] // V`` (floor division; truncation
    with ``round_toward_zero``), then ``fill_value`` up to ``W`` when given. With ``v2p`` (the unified pool's
    virtual-to-physical page table) the page ``q = slot // V`` (0 for a negative slot) is translated:
    ``max(v2p[q], 0)`` for ``q`` inside ``v2p``, else 0, in its low 32 bits. Untouched: rows ``>= B``; without
    ``fill_value``, the columns past each row's pages.
    """
    batch, width = req_pool_indices.shape[0], out.shape[1]
    if batch == 0 or width == 0:
        return out
    virtual_page = page_size * dcp_size
    reads = _page_reads(req_to_token, req_pool_indices, local_seq_lens, width, page_size, first=dcp_rank,
                        step=virtual_page)
    if v2p is None:
        return _store_pages(out, batch, reads, virtual_page, fill_value, round_toward_zero)
    columns, live, slots = reads
    if fill_value is not None:
        out[:batch].fill_(fill_value)
    if columns:
        page = slots.clamp(min=0).div(virtual_page, rounding_mode="floor")
        inside = page < v2p.shape[0]
        physical = v2p[page.clamp(max=max(v2p.shape[0] - 1, 0))].long() if v2p.shape[0] else page
        _store(out[:batch, :columns], live, torch.where(inside, physical.clamp(min=0), 0))
    return out


@declare("dcp_page_table", outputs=("out",), check=check_arguments, check_data=check_data,
         reference=reference)
def create_dcp_page_table(req_to_token: Tensor, req_pool_indices: Tensor, local_seq_lens: Tensor, out: Tensor, *,
                          page_size: int, dcp_size: int, dcp_rank: int, fill_value: int | None = None,
                          round_toward_zero: bool = False, v2p: Tensor | None = None, backend: str | None = None,
                          enable_pdl: bool | None = None) -> Tensor:
    """Build one decode-context-parallel rank's paged block table (MLA backends under DCP) into ``out``.

    Token-interleaved DCP with pages: a virtual page of ``V = page_size * D`` positions (``D = dcp_size``)
    puts ``page_size`` tokens on each rank, which stores them as one local page. For request ``b < B`` and
    local page ``p < min(ceil(local_seq_lens[b] / page_size), W)``::

        out[b, p] = req_to_token[req_pool_indices[b], dcp_rank + p * V] // V

    (floor division; truncation with ``round_toward_zero``, which equals dividing by ``D`` then by
    ``page_size`` with truncation), ``W = out.shape[1]``.

    Args:
        req_to_token: int32 ``[R, C]`` virtual slot id per token, last dim contiguous, any row stride.
        req_pool_indices: int32/int64 ``[B]`` row of ``req_to_token`` per request.
        local_seq_lens: int32/int64 ``[B]`` tokens this rank holds per request (``dcp_local_lengths``).
        out: int32 ``[>= B, W]``, last dim contiguous, any row stride. Written in place.
        page_size: int in ``[1, 4096]``, tokens per local page.
        dcp_size: int in ``[1, 1024]``; dcp_rank: int in ``[0, dcp_size)``.
        fill_value: optional int; when given, columns ``[pages_b, W)`` of each row are set to it.
        round_toward_zero: bool, as for ``create_dcp_kv_indices``.
        v2p: optional int32/int64 ``[P]``, contiguous: the unified pool's virtual-to-physical page table. Each
            page ``q = slot // V`` (0 for a negative slot) is written as ``max(v2p[q], 0)`` (0, the padding page,
            for a freed entry or a page past ``P``), in its low 32 bits.
        backend, enable_pdl: as for ``create_flashmla_kv_indices``.

    Left untouched: rows ``>= B``; without ``fill_value``, every column past a row's pages. A pool index
    outside ``[0, R)`` or a length ``<= 0`` gives an empty row; the row ends at its first position at or
    past column ``C``. No host sync, no device allocation on the GPU backends.
    Raises as ``create_flashmla_kv_indices`` does, also for ``dcp_size``/``dcp_rank`` out of range.

    Returns:
        ``out``.
    """
