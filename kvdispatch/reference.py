"""The PyTorch backend: the semantic source of truth that every other backend is tested against.

Vectorised over requests and pages (no Python loop, no host sync). It allocates temporaries through
PyTorch's caching allocator, which CUDA-graph capture routes to the graph's private pool.
Arguments arrive validated (see ``kvdispatch._validate``).
"""

from __future__ import annotations

import torch


def _row_spans(req_to_token, req_pool_indices, seq_lens, kv_start_idx, lengths_offset):
    """Per request: clamped pool row, start position, and the number of readable positions.

    A row is readable when its pool index is in ``[0, R)`` and its start in ``[0, C)``; then it can
    read ``C - start`` positions. Everything is int64, shape ``[B]``.
    """
    rows, cols = req_to_token.shape
    pool = req_pool_indices.long()
    lengths = seq_lens.long() + lengths_offset
    start = kv_start_idx.long() if kv_start_idx is not None else torch.zeros_like(pool)
    readable = (pool >= 0) & (pool < rows) & (start >= 0) & (start < cols)
    room = torch.where(readable, cols - start, torch.zeros_like(start))
    return pool.clamp(0, max(rows - 1, 0)), start.clamp(0, max(cols - 1, 0)), lengths, room


def build_page_table(req_to_token, req_pool_indices, seq_lens, out, page_size, kv_start_idx=None,
                     seqlen_offset=0, seq_lens_out=None, fill_value=None):
    """Paged block table; semantics of ``kvdispatch.create_flashmla_kv_indices``."""
    batch, width = req_pool_indices.shape[0], out.shape[1]
    if seq_lens_out is not None and batch:
        seq_lens_out[:batch] = (seq_lens[:batch].long() + seqlen_offset).to(torch.int32)
    if batch == 0 or width == 0:
        return out
    pool, start, lengths, room = _row_spans(req_to_token, req_pool_indices, seq_lens, kv_start_idx, seqlen_offset)
    # ceil(x / page) for x >= 0, 0 for x <= 0: pages the request needs, and pages the table can give.
    wanted = (lengths.clamp(min=0) + page_size - 1) // page_size
    available = (room + page_size - 1) // page_size
    pages = torch.minimum(wanted, available).clamp(max=width)  # [B]

    page = torch.arange(width, device=out.device)
    positions = start[:, None] + page[None, :] * page_size  # [B, W]
    written = page[None, :] < pages[:, None]
    positions = torch.where(written, positions, torch.zeros_like(positions))
    slots = req_to_token[pool[:, None], positions]
    values = torch.div(slots, page_size, rounding_mode="floor").to(torch.int32)
    rows = out[:batch]
    if fill_value is None:
        rows.copy_(torch.where(written, values, rows))
    else:
        rows.copy_(torch.where(written, values, torch.full_like(values, fill_value)))
    return out


def build_token_indices(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, kv_start_idx=None):
    """Token-level CSR indices; semantics of ``kvdispatch.create_flashinfer_kv_indices``."""
    batch, total = req_pool_indices.shape[0], out.shape[0]
    span = min(req_to_token.shape[1], total)
    if batch == 0 or span == 0:
        return out
    pool, start, lengths, room = _row_spans(req_to_token, req_pool_indices, seq_lens, kv_start_idx, 0)
    count = torch.minimum(lengths.clamp(min=0), room)  # [B]

    # A row writes at most ``span`` entries, from its first token that lands at or after out[0].
    begin = kv_indptr[:batch].long()
    token = (-begin).clamp(min=0)[:, None] + torch.arange(span, device=out.device)[None, :]  # [B, span]
    target = begin[:, None] + token
    written = (token < count[:, None]) & (target < total)
    positions = torch.where(written, start[:, None] + token, torch.zeros_like(target))
    slots = req_to_token[pool[:, None], positions]
    # Positions that are not written go to a scratch slot past the end, so no value is ever
    # written back over a real one.
    staged = torch.cat([out, out.new_zeros(1)])
    staged.index_put_((torch.where(written, target, torch.full_like(target, total)),), slots)
    out.copy_(staged[:total])
    return out
