"""Argument checks done before any work: attribute reads only, no device access, nothing written.

Each failure is a ``TypeError`` (wrong kind of object or dtype) or a ``ValueError`` (wrong shape,
layout, device or value) naming the argument, what was expected and what came.
"""

from __future__ import annotations

import torch

from .grid import MAX_PAGE_SIZE

_INT32 = torch.int32
_INDEX_DTYPES = (torch.int32, torch.int64)
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


def _tensor(name, value):
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")


def _int32_tensor(name, t, ndim):
    _tensor(name, t)
    if t.dtype is not _INT32:
        raise TypeError(f"{name} must have dtype torch.int32, got {t.dtype}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")
    if t.stride(-1) != 1 and t.shape[-1] > 1:
        raise ValueError(f"{name} must have a contiguous last dimension (stride 1), got strides {t.stride()}")


def _index_vector(name, t, device, length, at_least=False):
    _tensor(name, t)
    if t.dtype not in _INDEX_DTYPES:
        raise TypeError(f"{name} must have dtype torch.int32 or torch.int64, got {t.dtype}")
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
    n = t.shape[0]
    if n < length if at_least else n != length:
        want = f"at least {length}" if at_least else f"{length} (the batch, req_pool_indices.shape[0])"
        raise ValueError(f"{name} must have {want} entries, got {n}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, expected {device} (the device of req_to_token)")


def _python_int(name, value, low, high):
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a Python int, got {type(value).__name__}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value}")


def _common(req_to_token, req_pool_indices, seq_lens, kv_start_idx):
    """Checks shared by both ops; returns the batch size and the device."""
    _int32_tensor("req_to_token", req_to_token, 2)
    device = req_to_token.device
    _tensor("req_pool_indices", req_pool_indices)
    batch = req_pool_indices.shape[0] if req_pool_indices.dim() == 1 else -1
    _index_vector("req_pool_indices", req_pool_indices, device, batch)
    _index_vector("seq_lens", seq_lens, device, batch)
    if kv_start_idx is not None:
        _index_vector("kv_start_idx", kv_start_idx, device, batch)
    return batch, device


def _vector_ok(t, dtypes, device, shape):
    """The hot-path form of ``_index_vector``: True when ``t`` has one of ``dtypes``, shape ``shape`` (a
    ``torch.Size``, so the dimension count and the length at once) and ``device``."""
    return t.dtype in dtypes and t.shape == shape and t.device == device


def _table_ok(t, device, ndim):
    """The hot-path form of ``_int32_tensor`` plus the device."""
    return t.dtype is _INT32 and t.dim() == ndim and t.stride(-1) == 1 and t.device == device


def _small_int(value, low=_INT32_MIN, high=_INT32_MAX):
    return type(value) is int and low <= value <= high


def check_page_table_args(req_to_token, req_pool_indices, seq_lens, out, page_size, kv_start_idx,
                          seqlen_offset, seq_lens_out, fill_value):
    """Validate ``create_flashmla_kv_indices`` arguments; returns the device."""
    # Hot path: a valid call passes these attribute reads (each tensor's read once where possible) and
    # returns. Anything else, every error included, goes through the detailed checks below, which name the
    # argument. Devices are compared as objects, so CPU calls take this path too (and CI tests it).
    try:
        device, batch_shape = req_to_token.device, req_pool_indices.shape
        if (len(batch_shape) == 1 and _table_ok(req_to_token, device, 2) and _table_ok(out, device, 2)
                and out.shape[0] >= batch_shape[0]
                and _vector_ok(req_pool_indices, _INDEX_DTYPES, device, batch_shape)
                and _vector_ok(seq_lens, _INDEX_DTYPES, device, batch_shape)
                and (kv_start_idx is None or _vector_ok(kv_start_idx, _INDEX_DTYPES, device, batch_shape))
                and (seq_lens_out is None or (_table_ok(seq_lens_out, device, 1)
                                              and seq_lens_out.shape[0] >= batch_shape[0]))
                and _small_int(page_size, 1, MAX_PAGE_SIZE) and _small_int(seqlen_offset)
                and (fill_value is None or _small_int(fill_value))):
            return device
    except (AttributeError, IndexError, TypeError):
        pass
    batch, device = _common(req_to_token, req_pool_indices, seq_lens, kv_start_idx)
    _int32_tensor("out", out, 2)
    if out.shape[0] < batch:
        raise ValueError(f"out must have at least {batch} rows (the batch), got shape {tuple(out.shape)}")
    if out.device != device:
        raise ValueError(f"out is on {out.device}, expected {device} (the device of req_to_token)")
    _python_int("page_size", page_size, 1, MAX_PAGE_SIZE)
    _python_int("seqlen_offset", seqlen_offset, _INT32_MIN, _INT32_MAX)
    if fill_value is not None:
        _python_int("fill_value", fill_value, _INT32_MIN, _INT32_MAX)
    if seq_lens_out is not None:
        _int32_tensor("seq_lens_out", seq_lens_out, 1)
        if seq_lens_out.shape[0] < batch:
            raise ValueError(f"seq_lens_out must have at least {batch} entries (the batch), "
                             f"got {seq_lens_out.shape[0]}")
        if seq_lens_out.device != device:
            raise ValueError(f"seq_lens_out is on {seq_lens_out.device}, expected {device} "
                             "(the device of req_to_token)")
    return device


def check_token_csr_args(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, kv_start_idx):
    """Validate ``create_flashinfer_kv_indices`` arguments; returns the device."""
    try:  # hot path, as in check_page_table_args
        device, batch_shape = req_to_token.device, req_pool_indices.shape
        if (len(batch_shape) == 1 and _table_ok(req_to_token, device, 2) and _table_ok(out, device, 1)
                and _vector_ok(req_pool_indices, _INDEX_DTYPES, device, batch_shape)
                and _vector_ok(seq_lens, _INDEX_DTYPES, device, batch_shape)
                and kv_indptr.dtype in _INDEX_DTYPES and kv_indptr.dim() == 1 and kv_indptr.device == device
                and kv_indptr.shape[0] >= batch_shape[0]
                and (kv_start_idx is None or _vector_ok(kv_start_idx, _INDEX_DTYPES, device, batch_shape))):
            return device
    except (AttributeError, IndexError, TypeError):
        pass
    batch, device = _common(req_to_token, req_pool_indices, seq_lens, kv_start_idx)
    _index_vector("kv_indptr", kv_indptr, device, batch, at_least=True)
    _int32_tensor("out", out, 1)
    if out.device != device:
        raise ValueError(f"out is on {out.device}, expected {device} (the device of req_to_token)")
    return device
