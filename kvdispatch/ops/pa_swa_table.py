"""The prefill-aware sliding-window token table and its lengths: the op ``pa_swa_table``.

Its argument checks, its data checks (``KVDISPATCH_DEBUG``), its torch reference (the torch backend and the
semantics every backend is tested against) and its declaration (``kvdispatch.op.declare``), which makes the
public function, the custom op and the dispatch entry.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._debug import _check_pages_fit, _check_rows
from .._validate import (_INT32_MAX, _apart, _check_apart, _check_rows_apart, _common, _contiguous_vector, _index_span,
                         _int32_span, _int32_tensor, _mapping_span, _python_int, _small_int,
                         _table_output)
from ..reference import BOUND, _clamped_pool, _store
from ..op import declare

__all__ = ["create_prefill_aware_swa_table"]


def check_arguments(req_to_token, req_pool_indices, seq_lens, prefill_lens, out, kv_lens_out, window_size,
                    memory=True):
    """Validate ``create_prefill_aware_swa_table`` arguments; returns the device (``memory``: as for
    ``check_page_table_args``)."""
    try:  # hot path, as in check_page_table_args
        device, batch_shape = req_to_token.device, req_pool_indices.shape
        if memory and len(batch_shape) == 1 and _small_int(window_size, 0, _INT32_MAX):
            batch = batch_shape[0]
            table = _int32_span(req_to_token, device, 2)
            pool = _index_span(req_pool_indices, device, batch_shape)
            lens = _index_span(seq_lens, device, batch_shape)
            prefill = _mapping_span(prefill_lens, device)
            written = _int32_span(out, device, 2, batch, True)
            lens_written = _int32_span(kv_lens_out, device, 1, batch)
            if table and pool and lens and prefill and written and lens_written:
                inputs = (table, pool, lens, prefill)
                if _apart(written, inputs + (lens_written,)) and _apart(lens_written, inputs):
                    return device
    except (AttributeError, IndexError, TypeError, RuntimeError, NotImplementedError):
        pass
    batch, device = _common(req_to_token, req_pool_indices, seq_lens, None)
    _contiguous_vector("prefill_lens", prefill_lens, device)  # any length: indexed by pool index
    _table_output("out", out, batch, device)
    _int32_tensor("kv_lens_out", kv_lens_out, 1)
    if kv_lens_out.shape[0] < batch:
        raise ValueError(f"kv_lens_out must have at least {batch} entries (the batch), got {kv_lens_out.shape[0]}")
    if kv_lens_out.device != device:
        raise ValueError(f"kv_lens_out is on {kv_lens_out.device}, expected {device} (the device of req_to_token)")
    _python_int("window_size", window_size, 0, _INT32_MAX)
    if not memory:
        return device
    _check_rows_apart(out)
    _check_apart((("out", out), ("kv_lens_out", kv_lens_out)),
                 (("req_to_token", req_to_token), ("req_pool_indices", req_pool_indices), ("seq_lens", seq_lens),
                  ("prefill_lens", prefill_lens)))
    return device


def check_data(req_to_token, req_pool_indices, seq_lens, prefill_lens, out, window_size):
    """``create_prefill_aware_swa_table``: every pool index in ``[0, R)`` and inside ``prefill_lens``;
    ``seq_lens >= 0`` and a row ending at or before column ``C``; ``prefill_lens >= 0`` where read; each row's
    ``min(seq_len, prefill_len + window_size)`` tokens fit the width of ``out``."""
    lengths = _check_rows(req_to_token, req_pool_indices, seq_lens, None, 0, "seq_lens")
    pool = req_pool_indices.long().cpu()
    size = prefill_lens.shape[0]
    b = _first_index((pool >= size).tolist())
    if b is not None:
        raise ValueError(f"request {b}: req_pool_indices[{b}] = {int(pool[b])} is outside prefill_lens' [0, {size})")
    prefill = prefill_lens.long().cpu()[pool] if pool.numel() else pool
    b = _first_index((prefill < 0).tolist())
    if b is not None:
        raise ValueError(f"request {b}: prefill_lens[{int(pool[b])}] = {int(prefill[b])} is negative")
    kept = torch.minimum(lengths, prefill.clamp(max=BOUND) + window_size)
    _check_pages_fit(kept, 1, out.shape[1], "out", "columns (its tokens: the prefill and the window)")


def _first_index(flags):
    return next((b for b, flag in enumerate(flags) if flag), None)


def reference(req_to_token, req_pool_indices, seq_lens, prefill_lens, out, kv_lens_out, window_size, pdl=False):
    """The prefill-aware sliding-window token table; semantics of ``kvdispatch.create_prefill_aware_swa_table``.

    Request ``b`` has ``s = seq_lens[b]``, ``f = prefill_lens[pool_b]`` (0 for a pool index outside
    ``prefill_lens``; both clamped into ``[-2**62, 2**62]``, which no table comes near), ``n = min(s, f +
    window_size)`` and ``gap = max(s - window_size - f, 0)``: its row holds the
    tokens at positions ``q_j = j`` for ``j < f`` and ``j + gap`` after (``[0, f)`` then the window ``[s -
    window_size, s)``), ``out[b, j] = req_to_token[pool_b, q_j]`` for ``j < min(n, W)`` while ``q_j < C`` (none
    for a pool index outside ``[0, R)``), and ``kv_lens_out[b]`` the low 32 bits of ``n``. Untouched: rows ``>= B``,
    each row's columns past its tokens, ``kv_lens_out[B:]``.
    """
    batch = req_pool_indices.shape[0]
    if batch == 0:
        return out
    device = req_to_token.device
    pool = req_pool_indices.long()
    size = prefill_lens.shape[0]
    in_prefill = (pool >= 0) & (pool < size)
    prefill = torch.where(in_prefill, prefill_lens[pool.clamp(0, max(size - 1, 0))].long() if size else pool * 0, 0)
    prefill = prefill.clamp(-BOUND, BOUND)
    lengths = seq_lens.long().clamp(-BOUND, BOUND)
    kept = torch.minimum(lengths, prefill + window_size)
    kv_lens_out[:batch].copy_(kept)  # int64 -> int32 keeps the low 32 bits
    rows, cols = req_to_token.shape
    width = min(out.shape[1], cols)  # position q_j >= j: no column past C is read
    if rows == 0 or width == 0:
        return out
    clamped, outside = _clamped_pool(req_to_token, req_pool_indices)
    # A prefill below -2**61 leaves no token (n < 0): bounding it keeps the difference inside int64.
    gap = (lengths - window_size - prefill.clamp(min=-(2**61))).clamp(min=0)
    j = torch.arange(width, device=device)[None, :]
    positions = torch.where(j < prefill[:, None], j, j + gap[:, None])
    live = ~outside[:, None] & (j < kept[:, None]) & (positions < cols)
    values = req_to_token[clamped.long()[:, None], positions.clamp(max=cols - 1)]
    _store(out[:batch, :width], live, values)
    return out


@declare("pa_swa_table", outputs=("out", "kv_lens_out"), check=check_arguments, check_data=check_data,
         reference=reference)
def create_prefill_aware_swa_table(req_to_token: Tensor, req_pool_indices: Tensor, seq_lens: Tensor,
                                   prefill_lens: Tensor, out: Tensor, kv_lens_out: Tensor, *, window_size: int,
                                   backend: str | None = None, enable_pdl: bool | None = None) -> Tensor:
    """Build the prefill-aware sliding-window token table into ``out`` and its lengths into ``kv_lens_out``.

    Request ``b < B`` keeps its prefill tokens and the last ``window_size`` of the rest: with ``s = seq_lens[b]``,
    ``f = prefill_lens[req_pool_indices[b]]`` and ``gap = max(s - window_size - f, 0)``::

        kv_lens_out[b] = min(s, f + window_size)
        out[b, j] = req_to_token[req_pool_indices[b], j if j < f else j + gap]   # j < min(kv_lens_out[b], W)

    so a row is the positions ``[0, f)`` then ``[max(f, s - window_size), s)``. ``kv_lens_out`` takes the low 32
    bits of the minimum, ``s`` and ``f`` clamped into ``[-2**62, 2**62]`` first (no table comes near).

    Args:
        req_to_token, req_pool_indices, seq_lens: as for ``create_flashmla_kv_indices`` (int32 ``[R, C]``,
            int32/int64 ``[B]``, int32/int64 ``[B]``).
        prefill_lens: int32/int64 ``[P]``, contiguous, indexed by pool index (each request row's prefill length).
        out: int32 ``[>= B, W]``, last dim contiguous, any row stride. Written in place.
        kv_lens_out: int32 ``[>= B]``, contiguous. Its first ``B`` entries are written.
        window_size: int in ``[0, 2**31)``, the sliding window's tokens.
        backend: ``"triton"``, ``"cupy"``, ``"torch"``, ``"auto"`` or None (auto, or ``KVDISPATCH_BACKEND``).
        enable_pdl: programmatic dependent launch, as for ``create_flashmla_kv_indices``.

    Left untouched: rows ``>= B`` of ``out``, the columns past each row's tokens, ``kv_lens_out[B:]``. Bad data
    never reads or writes out of bounds: a pool index outside ``[0, R)`` gives an empty row (and one outside
    ``prefill_lens`` a prefill length of 0), a row ends at its first position at or past column ``C`` and at the
    width of ``out``. No host sync and no device allocation on the GPU backends: capturable in a CUDA graph.

    Raises ``TypeError``/``ValueError`` naming the argument before anything is written: bad dtypes, shapes or
    devices, outputs sharing memory with an input or with each other, rows of ``out`` sharing memory.

    Returns:
        ``out``.
    """
