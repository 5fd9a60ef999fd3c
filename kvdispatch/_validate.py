"""Argument checks done before any work: attribute reads only, no device access, nothing written.

Each failure is a ``TypeError`` (wrong kind of object or dtype) or a ``ValueError`` (wrong shape,
layout, device or value) naming the argument, what was expected and what came.

Every tensor argument (outputs, and optional ones when given, included) must be a plain strided tensor
(``torch.strided`` layout, not nested or sparse). A tensor with elements must have memory that holds its
view: storage that exists (not released, as ``untyped_storage().resize_(0)`` does: ``data_ptr()`` 0),
whose ``untyped_storage().nbytes()`` covers the view's bytes (``storage_offset() * itemsize`` up to past
its last element), and a ``data_ptr()`` aligned to its element size (the kernels' 16-byte accesses take
element-aligned pointers at any other offset). A tensor without elements passes whatever its storage.
Meta tensors have no memory to check, and the metadata checks of fake tensors (``memory=False``) leave
these out: the real call makes them.

Outputs must not share memory with an input or with each other, and rows of a page table must not
share memory: where they did, what a backend writes would depend on the order its programs run in.
Memory is compared as the byte ranges the tensors span, ``data_ptr()`` up to past their last element
(gaps of a strided view included); a tensor without elements, or a meta tensor (``data_ptr()`` 0),
spans nothing.
"""

from __future__ import annotations

import torch

from .grid import MAX_DCP_SIZE

_INT32, _INT64 = torch.int32, torch.int64
_INDEX_DTYPES = (_INT32, _INT64)
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


_STRIDED = torch.strided


def _tensor(name, value):
    """A strided ``torch.Tensor`` (not nested or sparse: those have no strides or memory the kernels read)."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.layout is not _STRIDED or value.is_nested:
        layout = "a nested tensor" if value.is_nested else f"layout {value.layout}"
        raise TypeError(f"{name} must be a strided tensor (layout torch.strided), got {layout}")


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


def _contiguous_vector(name, t, device):
    """An int32/int64 1-D table of any length, contiguous, on ``device`` (a mapping the kernels index)."""
    _index_vector(name, t, device, 0, at_least=True)
    if t.stride(0) != 1 and t.shape[0] > 1:
        raise ValueError(f"{name} must be contiguous (stride 1), got strides {t.stride()}")


def _index_table(name, t, device, min_rows, min_cols, rows_are="", cols_are=""):
    """An int32/int64 2-D output with a contiguous last dimension, at least ``min_rows`` rows and
    ``min_cols`` columns, rows that share no memory, on ``device``; ``rows_are``/``cols_are`` name the
    bounds in the errors."""
    _tensor(name, t)
    if t.dtype not in _INDEX_DTYPES:
        raise TypeError(f"{name} must have dtype torch.int32 or torch.int64, got {t.dtype}")
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-D, got shape {tuple(t.shape)}")
    if t.stride(-1) != 1 and t.shape[-1] > 1:
        raise ValueError(f"{name} must have a contiguous last dimension (stride 1), got strides {t.stride()}")
    rows, cols = t.shape
    if rows < min_rows:
        raise ValueError(f"{name} must have at least {min_rows} rows ({rows_are}), got shape {tuple(t.shape)}")
    if cols < min_cols:
        raise ValueError(f"{name} must have at least {min_cols} columns ({cols_are}), got shape {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, expected {device} (the device of req_to_token)")
    _check_rows_apart(t, name)


def _python_int(name, value, low, high):
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a Python int, got {type(value).__name__}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value}")


def check_flag(name, value, optional=False):
    """``value`` is a ``bool`` (or None, where ``optional``); anything else (an int, a string, a tensor) is a
    ``TypeError`` naming ``name``."""
    if not (value is True or value is False or (optional and value is None)):
        raise TypeError(f"{name} must be a bool{' or None' if optional else ''}, got {type(value).__name__}")


_NOTHING = (0, 0)  # the span of a tensor without elements or memory, or of an absent one: it meets no other


def _span(t):
    """``(begin, end)``: the bytes from the first to past the last element of ``t``, ``(0, 0)`` when it has
    none. PyTorch strides are never negative, so the first element is the one at ``data_ptr()``."""
    begin = t.data_ptr()
    if not begin or not t.numel():
        return _NOTHING
    if t.is_contiguous():
        return begin, begin + t.nbytes
    return begin, begin + _extent(t) * t.itemsize


def _extent(t):
    """The elements from the first to past the last of ``t``, which has elements (gaps of a strided view
    included)."""
    return 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))


def _check_storage(name, t):
    """Raise unless ``t`` has no element, is a meta tensor, or has memory that holds its view at an address
    aligned to its element size."""
    elements = t.numel()
    if not elements or t.device.type == "meta":
        return
    begin, itemsize, held = t.data_ptr(), t.itemsize, t.untyped_storage().nbytes()
    if not begin or not held:
        raise ValueError(f"{name} has {elements} elements but no memory: its storage holds {held} bytes "
                         f"(data_ptr() {begin:#x}; released, as untyped_storage().resize_(0) does)")
    if begin % itemsize:
        raise ValueError(f"{name} must be aligned to its element size ({itemsize} bytes for {t.dtype}), got "
                         f"data_ptr() {begin:#x} ({begin % itemsize} past a multiple of {itemsize})")
    needed = (t.storage_offset() + _extent(t)) * itemsize
    if needed > held:
        raise ValueError(f"{name}'s storage must hold its view, {needed} bytes (storage_offset() "
                         f"{t.storage_offset()}, shape {tuple(t.shape)}, strides {t.stride()}), got "
                         f"untyped_storage().nbytes() {held}")


def _check_apart(outputs, inputs):
    """Raise naming the first tensor whose memory does not hold it (``_check_storage``; inputs, then outputs),
    then the first output that shares memory with an input or with an output before it.
    ``outputs``, ``inputs``: ``(name, tensor or None)`` pairs."""
    for name, t in inputs + outputs:
        if t is not None:
            _check_storage(name, t)
    earlier = [(name, _span(t)) for name, t in inputs if t is not None]
    for name, t in outputs:
        if t is None:
            continue
        span = _span(t)
        for other, other_span in earlier:
            if not _apart(span, (other_span,)):
                raise ValueError(f"{name} shares memory with {other} ({name} spans bytes [{span[0]:#x}, "
                                 f"{span[1]:#x}), {other} [{other_span[0]:#x}, {other_span[1]:#x})): outputs must "
                                 "not overlap the inputs or each other")
        earlier.append((name, span))


def _check_rows_apart(out, name="out"):
    rows, width = out.shape
    if rows > 1 and out.stride(0) < width:
        raise ValueError(f"rows of {name} share memory: its row stride {out.stride(0)} is below its width {width} "
                         f"(shape {tuple(out.shape)})")


def _common(req_to_token, req_pool_indices, seq_lens, kv_start_idx, lens_name="seq_lens"):
    """Checks shared by every op (``lens_name``: what the op calls ``seq_lens``); returns the batch size and the
    device."""
    _int32_tensor("req_to_token", req_to_token, 2)
    device = req_to_token.device
    _tensor("req_pool_indices", req_pool_indices)
    batch = req_pool_indices.shape[0] if req_pool_indices.dim() == 1 else -1
    _index_vector("req_pool_indices", req_pool_indices, device, batch)
    _index_vector(lens_name, seq_lens, device, batch)
    if kv_start_idx is not None:
        _index_vector("kv_start_idx", kv_start_idx, device, batch)
    return batch, device


# The hot-path forms of the checks: each returns the tensor's span (as ``_span`` computes it) when the
# tensor passes, ``_check_storage`` included, else None, reading each attribute once. A tensor of another
# layout than torch.strided fails them: a sparse one has no data pointer (nor strides, or storage), a nested
# one no shape or strides (those raise, and the hot path goes on to the detailed checks), a jagged one's
# data_ptr() is 0; one without elements is tested for its layout.

def _held(t, begin, size, itemsize, device):
    """The span ``(begin, begin + size)`` of a tensor ``t`` with elements (``begin``: its ``data_ptr()``,
    ``size``: the bytes from its first element to past its last) where its storage holds those bytes and
    ``begin`` is aligned to ``itemsize``; ``_NOTHING`` for a meta tensor, else None."""
    if begin and not begin % itemsize and t.storage_offset() * itemsize + size <= t.untyped_storage().nbytes():
        return begin, begin + size
    return _NOTHING if not begin and device.type == "meta" else None


def _empty_span(t):
    """The span of a tensor without elements: ``_NOTHING`` when it is strided, else None."""
    return _NOTHING if t.layout is _STRIDED else None


def _index_span(t, device, shape):
    """The hot-path form of ``_index_vector``: ``shape`` is the ``torch.Size`` ``t`` must have (the
    dimension count and the length at once)."""
    dtype = t.dtype
    if (dtype is _INT32 or dtype is _INT64) and t.shape == shape and t.device == device:
        length = shape[0]
        if not length:
            return _empty_span(t)
        itemsize = 4 if dtype is _INT32 else 8
        return _held(t, t.data_ptr(), ((length - 1) * t.stride()[0] + 1) * itemsize, itemsize, device)
    return None


def _int32_span(t, device, ndim, min_rows=0, distinct_rows=False):
    """The hot-path form of ``_int32_tensor`` plus the device, at least ``min_rows`` rows (entries when 1-D)
    and, with ``distinct_rows``, rows that share no memory."""
    if t.dtype is not _INT32 or t.device != device:
        return None
    stride = t.stride()
    if len(stride) != ndim or stride[-1] != 1:
        return None
    if ndim == 1:
        rows = extent = t.shape[0]
    else:
        rows, width = t.shape
        if distinct_rows and rows > 1 and stride[0] < width:
            return None
        extent = (rows - 1) * stride[0] + width if rows and width else 0
    if rows < min_rows:
        return None
    return _held(t, t.data_ptr(), 4 * extent, 4, device) if extent else _empty_span(t)


def _apart(span, others):
    """Whether the span ``span`` shares no byte with any of the spans ``others``."""
    begin, end = span
    for other_begin, other_end in others:
        if other_begin < end and begin < other_end:
            return False
    return True


def _small_int(value, low=_INT32_MIN, high=_INT32_MAX):
    return type(value) is int and low <= value <= high


def _out_vector_span(t, device):
    """The hot-path check of a token-CSR ``out``: int32 or int64, 1-D, contiguous, on ``device``."""
    dtype = t.dtype
    if (dtype is _INT32 or dtype is _INT64) and t.device == device:
        stride = t.stride()
        if len(stride) == 1 and stride[0] == 1:
            length = t.shape[0]
            if not length:
                return _empty_span(t)
            itemsize = 4 if dtype is _INT32 else 8
            return _held(t, t.data_ptr(), length * itemsize, itemsize, device)
    return None


def _mapping_span(t, device):
    """The hot-path check of ``token_mapping``: int32 or int64, 1-D, contiguous, on ``device``."""
    return _out_vector_span(t, device)


def _table_output(name, t, batch, device):
    """An int32 ``[>= batch, W]`` output table on ``device``, last dimension contiguous."""
    _int32_tensor(name, t, 2)
    if t.shape[0] < batch:
        raise ValueError(f"{name} must have at least {batch} rows (the batch), got shape {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, expected {device} (the device of req_to_token)")


def _check_dcp(dcp_size, dcp_rank, round_toward_zero):
    """``dcp_size`` in ``[1, MAX_DCP_SIZE]``, ``dcp_rank`` in ``[0, dcp_size)``, ``round_toward_zero`` a bool."""
    if _small_int(dcp_size, 1, MAX_DCP_SIZE) and _small_int(dcp_rank, 0, dcp_size - 1) and (
            round_toward_zero is False or round_toward_zero is True):
        return
    _python_int("dcp_size", dcp_size, 1, MAX_DCP_SIZE)
    _python_int("dcp_rank", dcp_rank, 0, dcp_size - 1)
    raise TypeError(f"round_toward_zero must be a bool, got {type(round_toward_zero).__name__}")


def dcp_lengths_device(seq_lens, dcp_size, dcp_rank, kv_start_idx, out, lens_name="seq_lens",
                       start_name="kv_start_idx"):
    """Validate ``dcp_local_lengths`` arguments; returns the device (``lens_name``, ``start_name``: what the
    caller calls ``seq_lens`` and ``kv_start_idx``)."""
    _tensor(lens_name, seq_lens)
    batch = seq_lens.shape[0] if seq_lens.dim() == 1 else -1
    device = seq_lens.device
    _index_vector(lens_name, seq_lens, device, batch)
    if kv_start_idx is not None:
        _index_vector(start_name, kv_start_idx, device, batch)
    if out is not None:
        _index_vector("out", out, device, batch, at_least=True)
        if out.shape[0] > 1 and out.stride(0) == 0:
            raise ValueError(f"entries of out share memory: its stride is 0 (shape {tuple(out.shape)}, an expanded "
                             "view); it must have an entry of its own per request")
    _check_apart((("out", out),), ((lens_name, seq_lens), (start_name, kv_start_idx)))
    _check_dcp(dcp_size, dcp_rank, False)
    return device


def _csr_out(out, device, device_of):
    """A CSR ``out``: a strided int32/int64 1-D tensor, contiguous, on ``device`` (the device of the argument
    ``device_of``)."""
    _tensor("out", out)
    if out.dtype not in _INDEX_DTYPES:
        raise TypeError(f"out must have dtype torch.int32 or torch.int64, got {out.dtype}")
    if out.dim() != 1:
        raise ValueError(f"out must be 1-D, got shape {tuple(out.shape)}")
    if out.stride(0) != 1 and out.shape[0] > 1:
        raise ValueError(f"out must be contiguous (stride 1), got strides {out.stride()}")
    if out.device != device:
        raise ValueError(f"out is on {out.device}, expected {device} (the device of {device_of})")
