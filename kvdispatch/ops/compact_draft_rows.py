"""A draft model's compact token-table rows rebuilt from the target's: the op ``compact_draft_rows``.

Its argument checks, its data checks (``KVDISPATCH_DEBUG``), its torch reference (the torch backend and
the semantics every backend is tested against) and its declaration (``kvdispatch.op.declare``), which makes
the public function, the custom op and the dispatch entry.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._debug import _first_bad
from .._validate import _INT32_MAX, _check_apart, _index_table, _index_vector, _tensor
from ..reference import BOUND
from ..op import declare

__all__ = ["build_compact_draft_rows"]


def check_arguments(target_req_to_token, req_pool_indices, suffix_start, draft_prefix_lens, verify_locs,
                    draft_req_to_token, memory=True):
    """Validate ``build_compact_draft_rows`` arguments; returns the device (``memory``: as for
    ``check_page_table_args``)."""
    tensors = (("target_req_to_token", target_req_to_token), ("draft_req_to_token", draft_req_to_token),
               ("req_pool_indices", req_pool_indices), ("suffix_start", suffix_start),
               ("draft_prefix_lens", draft_prefix_lens), ("verify_locs", verify_locs))
    for name, t in tensors:
        _tensor(name, t)
        device = target_req_to_token.device
        if t.device != device:
            raise ValueError(f"{name} is on {t.device}, expected {device} (the device of target_req_to_token)")
    _index_table("target_req_to_token", target_req_to_token, device, 0, 0)
    _index_table("draft_req_to_token", draft_req_to_token, device, 0, 0)
    batch = req_pool_indices.shape[0] if req_pool_indices.dim() == 1 else -1
    _index_vector("req_pool_indices", req_pool_indices, device, batch)
    if batch > _INT32_MAX:
        raise ValueError(f"req_pool_indices must have at most {_INT32_MAX} entries, got {batch}")
    _index_vector("suffix_start", suffix_start, device, batch)
    _index_vector("draft_prefix_lens", draft_prefix_lens, device, batch)
    _index_table("verify_locs", verify_locs, device, 0, 0)
    if verify_locs.shape[0] != batch:
        raise ValueError(f"verify_locs must have {batch} rows (the batch, req_pool_indices.shape[0]), got shape "
                         f"{tuple(verify_locs.shape)}")
    if not memory:
        return device
    _check_apart((("draft_req_to_token", draft_req_to_token),),
                 (("target_req_to_token", target_req_to_token), ("req_pool_indices", req_pool_indices),
                  ("suffix_start", suffix_start), ("draft_prefix_lens", draft_prefix_lens),
                  ("verify_locs", verify_locs)))
    return device


def check_data(target_req_to_token, req_pool_indices, suffix_start, draft_prefix_lens, verify_locs,
               draft_req_to_token):
    """``build_compact_draft_rows``: every request's pool index in ``[0, min(R_draft, R_target))`` and no two
    alike; its prefix length non-negative, the prefix inside the target row (``0 <= suffix_start`` and
    ``suffix_start + draft_prefix_lens <= C_target``) and the rebuilt row inside the draft row
    (``draft_prefix_lens + K <= C_draft``)."""
    batch = req_pool_indices.shape[0]
    if batch == 0:
        return
    rows = min(draft_req_to_token.shape[0], target_req_to_token.shape[0])
    pool = req_pool_indices.long().cpu()
    start, length = suffix_start.long().cpu(), draft_prefix_lens.long().cpu()
    b = _first_bad((pool < 0) | (pool >= rows))
    if b is not None:
        raise ValueError(f"request {b}: req_pool_indices[{b}] = {int(pool[b])} is outside [0, {rows}) (the rows of "
                         "both tables)")
    earlier = (pool[:, None] == pool[None, :]).tril(-1).any(1)
    b = _first_bad(earlier)
    if b is not None:
        raise ValueError(f"request {b}: req_pool_indices[{b}] = {int(pool[b])} is an earlier request's row too")
    b = _first_bad(length < 0)
    if b is not None:
        raise ValueError(f"request {b}: draft_prefix_lens[{b}] = {int(length[b])} is negative")
    b = _first_bad((start < 0) | (start + length > target_req_to_token.shape[1]))
    if b is not None:
        raise ValueError(f"request {b}: its suffix [{int(start[b])}, {int(start[b] + length[b])}) runs outside the "
                         f"target table's {target_req_to_token.shape[1]} columns")
    b = _first_bad(length + verify_locs.shape[1] > draft_req_to_token.shape[1])
    if b is not None:
        raise ValueError(f"request {b}: its rebuilt row of {int(length[b]) + verify_locs.shape[1]} entries is wider "
                         f"than the draft table's {draft_req_to_token.shape[1]} columns")


def reference(target_req_to_token, req_pool_indices, suffix_start, draft_prefix_lens, verify_locs,
              draft_req_to_token, pdl=False):
    """A draft model's compact token-table rows; semantics of ``kvdispatch.build_compact_draft_rows``.

    Request ``b`` with pool index ``p`` in ``[0, min(R_draft, R_target))`` and ``n = draft_prefix_lens[b] >= 0``
    writes column ``j < C_draft`` of draft row ``p``: ``target[p, suffix_start[b] + j]`` for ``j < n`` where that
    position lies in ``[0, C_target)``, and ``verify_locs[b, j - n]`` for ``n <= j < n + K``; each in the draft
    table's dtype (the low bits). Every other entry is left untouched.
    """
    batch = req_pool_indices.shape[0]
    rows = min(draft_req_to_token.shape[0], target_req_to_token.shape[0])
    cols, target_cols, width = draft_req_to_token.shape[1], target_req_to_token.shape[1], verify_locs.shape[1]
    if batch == 0 or rows == 0 or cols == 0:
        return draft_req_to_token
    pool = req_pool_indices.long()
    length = draft_prefix_lens.long()
    valid = (pool >= 0) & (pool < rows) & (length >= 0)
    pool, length = pool.clamp(0, rows - 1), length.clamp(0, cols)
    start = suffix_start.long().clamp(-BOUND, BOUND)
    column = torch.arange(cols, device=draft_req_to_token.device)[None, :]
    in_prefix = column < length[:, None]
    position = start[:, None] + column
    read = in_prefix & (position >= 0) & (position < target_cols)
    if target_cols:
        values = target_req_to_token[pool[:, None], position.clamp(0, target_cols - 1)].long()
    else:
        values = torch.zeros(column.shape, dtype=torch.int64, device=column.device).expand(batch, cols)
    if width:
        slot = (column - length[:, None]).clamp(0, width - 1)
        values = torch.where(in_prefix, values, verify_locs.gather(1, slot).long())
    live = valid[:, None] & (read | ((column >= length[:, None]) & (column < length[:, None] + width)))
    # Without a host sync (capturable in a CUDA graph): requests sharing a draft row merge their entries into
    # the row of that row's last valid request (its "owner"; overlapping entries are any covering request's),
    # and every request then writes its row's owner's merged row (or the row unchanged when no valid request
    # owns it), so duplicate indices in the one scatter write equal rows.
    requests = torch.arange(batch, device=pool.device)
    owners = torch.full((rows,), -1, dtype=torch.int64, device=pool.device)
    owners.scatter_reduce_(0, pool, torch.where(valid, requests, -1), "amax")
    owner = owners[pool]
    merged = torch.cat([draft_req_to_token[pool], draft_req_to_token.new_zeros(1, cols)])  # row B: a sink
    target = torch.where(live, owner[:, None], batch)
    merged.view(-1).index_put_((target * cols + column,), values.to(merged.dtype))  # int32: the low bits
    rows_out = torch.where((owner >= 0)[:, None], merged[owner.clamp(min=0)], merged[:batch])
    draft_req_to_token.index_copy_(0, pool, rows_out)
    return draft_req_to_token


@declare("compact_draft_rows", outputs=("draft_req_to_token",), check=check_arguments, check_data=check_data,
         reference=reference)
def build_compact_draft_rows(target_req_to_token: Tensor, req_pool_indices: Tensor, suffix_start: Tensor,
                             draft_prefix_lens: Tensor, verify_locs: Tensor, draft_req_to_token: Tensor, *,
                             backend: str | None = None, enable_pdl: bool | None = None) -> Tensor:
    """Rebuild each request's row of a draft model's compact token table: the committed suffix of its target
    row, then its verify block's cache locations (a windowed draft model, DFlash).

    For request ``b < B``, ``p = req_pool_indices[b]``, ``n = draft_prefix_lens[b]`` and ``K`` verify slots::

        draft_req_to_token[p, j]     = target_req_to_token[p, suffix_start[b] + j]   for j < n
        draft_req_to_token[p, n + k] = verify_locs[b, k]                             for k < K

    Args:
        target_req_to_token: int32/int64 ``[R_target, C_target]``, last dim contiguous, rows apart.
        req_pool_indices, suffix_start, draft_prefix_lens: int32/int64 ``[B]``, any stride.
        verify_locs: int32/int64 ``[B, K]``, last dim contiguous, any row stride.
        draft_req_to_token: int32/int64 ``[R_draft, C_draft]``, last dim contiguous, rows apart. Written in place.
        backend, enable_pdl: as for ``create_flashmla_kv_indices``.

    Values are stored in the draft table's dtype (int32: the low 32 bits). Bad data reads and writes nothing
    out of bounds: a pool index outside ``[0, min(R_draft, R_target))`` or a negative prefix length leaves the
    request's row untouched, a suffix position outside ``[0, C_target)`` is not read (its column is left
    untouched), columns at or past ``C_draft`` are not written. Requests that share a pool index write one row
    in no set order. Left untouched: every row no request names, each row's columns at and past ``n + K``,
    everything when ``B == 0``. No host sync and no device allocation on the GPU backends: capturable in a CUDA
    graph. Raises ``TypeError``/``ValueError`` naming the argument before anything is written, also where the
    draft table shares memory with an input.

    Returns:
        ``draft_req_to_token``.
    """
