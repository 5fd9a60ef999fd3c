"""The paged block table (FlashMLA, CUTLASS MLA, TRT-LLM MLA, Aiter MLA): the op ``page_table``.

Its argument checks, its data checks (``KVDISPATCH_DEBUG``), its torch reference (the torch backend and
the semantics every backend is tested against) and its declaration (``kvdispatch.op.declare``), which makes
the public function, the custom op and the dispatch entry.
"""

from __future__ import annotations

from torch import Tensor

from .._debug import _check_pages_fit, _check_rows
from .._validate import (_INT32_MAX, _INT32_MIN, _NOTHING, _apart, _check_apart, _check_rows_apart, _common,
                         _index_span, _int32_span, _int32_tensor, _python_int, _small_int)
from ..grid import MAX_PAGE_SIZE
from ..reference import _page_reads, _store_low_32_bits_of_sum, _store_pages
from ..op import declare

__all__ = ["create_flashmla_kv_indices"]


def check_arguments(req_to_token, req_pool_indices, seq_lens, out, page_size, kv_start_idx,
                    seqlen_offset, seq_lens_out, fill_value, round_toward_zero=False, memory=True,
                    lens_name="seq_lens"):
    """Validate ``create_flashmla_kv_indices`` arguments; returns the device. ``memory=False`` leaves out
    what needs the tensors' memory (where outputs lie, which fake tensors under ``torch.compile`` lack):
    the real call checks it. ``lens_name``: the name errors give ``seq_lens``."""
    # Hot path: a valid call passes these attribute reads (each tensor's read once) and returns. Anything
    # else, every error included, goes through the detailed checks below, which name the argument. Devices
    # are compared as objects, so CPU calls take this path too (and CI tests it).
    try:
        device, batch_shape = req_to_token.device, req_pool_indices.shape
        if (memory and len(batch_shape) == 1 and _small_int(page_size, 1, MAX_PAGE_SIZE) and _small_int(seqlen_offset)
                and (fill_value is None or _small_int(fill_value))
                and (round_toward_zero is False or round_toward_zero is True)):
            batch = batch_shape[0]
            table = _int32_span(req_to_token, device, 2)
            written = _int32_span(out, device, 2, batch, True)  # rows: at least the batch, sharing no memory
            pool = _index_span(req_pool_indices, device, batch_shape)
            lens = _index_span(seq_lens, device, batch_shape)
            start = _NOTHING if kv_start_idx is None else _index_span(kv_start_idx, device, batch_shape)
            if table and written and pool and lens and start:
                inputs = (table, pool, lens, start)
                if seq_lens_out is None:
                    if _apart(written, inputs):
                        return device
                else:
                    lens_written = _int32_span(seq_lens_out, device, 1, batch)
                    if lens_written and _apart(written, inputs + (lens_written,)) and _apart(lens_written, inputs):
                        return device
    except (AttributeError, IndexError, TypeError, RuntimeError, NotImplementedError):
        pass
    batch, device = _common(req_to_token, req_pool_indices, seq_lens, kv_start_idx, lens_name)
    _int32_tensor("out", out, 2)
    if out.shape[0] < batch:
        raise ValueError(f"out must have at least {batch} rows (the batch), got shape {tuple(out.shape)}")
    if out.device != device:
        raise ValueError(f"out is on {out.device}, expected {device} (the device of req_to_token)")
    _python_int("page_size", page_size, 1, MAX_PAGE_SIZE)
    _python_int("seqlen_offset", seqlen_offset, _INT32_MIN, _INT32_MAX)
    if fill_value is not None:
        _python_int("fill_value", fill_value, _INT32_MIN, _INT32_MAX)
    if not isinstance(round_toward_zero, bool):
        raise TypeError(f"round_toward_zero must be a bool, got {type(round_toward_zero).__name__}")
    if seq_lens_out is not None:
        _int32_tensor("seq_lens_out", seq_lens_out, 1)
        if seq_lens_out.shape[0] < batch:
            raise ValueError(f"seq_lens_out must have at least {batch} entries (the batch), "
                             f"got {seq_lens_out.shape[0]}")
        if seq_lens_out.device != device:
            raise ValueError(f"seq_lens_out is on {seq_lens_out.device}, expected {device} "
                             "(the device of req_to_token)")
    if not memory:
        return device
    _check_rows_apart(out)
    _check_apart((("out", out), ("seq_lens_out", seq_lens_out)),
                 (("req_to_token", req_to_token), ("req_pool_indices", req_pool_indices), (lens_name, seq_lens),
                  ("kv_start_idx", kv_start_idx)))
    return device


def check_data(req_to_token, req_pool_indices, seq_lens, out, page_size, kv_start_idx, seqlen_offset):
    """``create_flashmla_kv_indices``: every pool index in ``[0, R)``; ``seq_lens + seqlen_offset >= 0``; a
    non-empty row starts inside the table and ends at or before column ``C``; its ``ceil(L_b / page_size)``
    pages fit ``out``'s width."""
    lengths = _check_rows(req_to_token, req_pool_indices, seq_lens, kv_start_idx, seqlen_offset)
    _check_pages_fit(lengths, page_size, out.shape[1], "out")


def reference(req_to_token, req_pool_indices, seq_lens, out, page_size, kv_start_idx=None,
              seqlen_offset=0, seq_lens_out=None, fill_value=None, round_toward_zero=False, pdl=False):
    """Paged block table; semantics of ``kvdispatch.create_flashmla_kv_indices``.

    ``out``: int32 ``[>= B, W]``. Row ``b`` gets ``pages_b = min(ceil(L_b / page_size), pages that start
    inside the readable table row, W)`` pages (0 when ``L_b <= 0`` or the row is unreadable: a pool index
    outside ``[0, R)`` or a start outside ``[0, C)``), then ``fill_value`` up to ``W`` when given. Untouched: rows
    ``>= B``; without ``fill_value``, the columns past each row's pages. ``seq_lens_out[:B]`` (int32) gets the
    low 32 bits of ``seq_lens + seqlen_offset``. A slot is divided by ``page_size`` rounding down, or toward zero
    with ``round_toward_zero``.
    """
    batch, width = req_pool_indices.shape[0], out.shape[1]
    if seq_lens_out is not None and batch:
        _store_low_32_bits_of_sum(seq_lens_out[:batch], seq_lens[:batch], seqlen_offset)
    if batch == 0 or width == 0:
        return out
    reads = _page_reads(req_to_token, req_pool_indices, seq_lens, width, page_size, seqlen_offset,
                        kv_start_idx=kv_start_idx)
    return _store_pages(out, batch, reads, page_size, fill_value, round_toward_zero)


@declare("page_table", outputs=("out", "seq_lens_out"), check=check_arguments, check_data=check_data,
         reference=reference)
def create_flashmla_kv_indices(req_to_token: Tensor, req_pool_indices: Tensor, seq_lens: Tensor, out: Tensor, *,
                               page_size: int, kv_start_idx: Tensor | None = None, seqlen_offset: int = 0,
                               seq_lens_out: Tensor | None = None, fill_value: int | None = None,
                               round_toward_zero: bool = False, backend: str | None = None,
                               enable_pdl: bool | None = None) -> Tensor:
    """Build the paged block table (FlashMLA, CUTLASS MLA, TRT-LLM MLA, Aiter MLA) into ``out``.

    For request ``b < B`` and page ``p < min(ceil(L_b / page_size), W)``::

        out[b, p] = req_to_token[req_pool_indices[b], start_b + p * page_size] // page_size

    with ``L_b = seq_lens[b] + seqlen_offset``, ``start_b = kv_start_idx[b]`` (0 when absent),
    ``W = out.shape[1]`` and ``//`` floor division (truncation with ``round_toward_zero``).

    Args:
        req_to_token: int32 ``[R, C]`` slot id per token, last dim contiguous, any row stride.
        req_pool_indices: int32/int64 ``[B]`` row of ``req_to_token`` per request.
        seq_lens: int32/int64 ``[B]`` tokens per request.
        out: int32 ``[>= B, W]``, last dim contiguous, any row stride. Written in place.
        page_size: int in ``[1, 4096]``.
        kv_start_idx: optional int32/int64 ``[B]`` first token position per request.
        seqlen_offset: int added to every length (e.g. the draft tokens in target-verify).
        seq_lens_out: optional int32 ``[>= B]``; receives ``seq_lens + seqlen_offset`` (the low 32 bits of
            the exact sum) in the same launch.
        fill_value: optional int; when given, columns ``[pages_b, W)`` of each row are set to it.
        round_toward_zero: bool; divide negative slot ids rounding toward zero, as SGLang's kernel does
            (``-65 // 64`` gives -1); the default floors (-2).
        backend: ``"triton"``, ``"cupy"``, ``"torch"``, ``"auto"`` or None (auto, or ``KVDISPATCH_BACKEND``).
        enable_pdl: bool or None; launch with programmatic dependent launch (PDL): the kernel may start while
            the previous kernel on the stream finishes, waits for it (``griddepcontrol.wait``) before its first
            load, and lets the next PDL kernel start after its last store. Only where the device supports it
            (``kvdispatch.probe(device).supports_pdl``: NVIDIA compute capability 9.0 and later) and on the
            triton and cupy backends; ignored elsewhere, without an error. None: ``KVDISPATCH_PDL`` (off when
            unset; read at import and by ``kvdispatch.reset()``). The result is the same either way.

    Left untouched: rows ``>= B``; without ``fill_value``, every column past a row's pages. Bad data
    never reads or writes out of bounds: a pool index outside ``[0, R)`` or a length ``<= 0`` gives an
    empty row, and the row ends at the first position at or past column ``C``.
    No host sync and no device allocation on the GPU backends: capturable in a CUDA graph.

    Raises ``TypeError``/``ValueError`` naming the argument before anything is written, also where
    ``out`` or ``seq_lens_out`` shares memory with an input or with the other (the byte ranges from
    ``data_ptr()`` to past the last element intersect), or rows of ``out`` share memory
    (``out.stride(0) < W`` with more than one row), or where a tensor argument is not strided (sparse,
    nested), its storage is released or does not hold its view, or its address is not a multiple of its
    element size.

    Returns:
        ``out``.
    """
