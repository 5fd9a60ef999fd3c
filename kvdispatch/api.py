"""The public index builders. Validation, then one dispatch lookup, then one kernel launch.

A call the Triton backend has launched before (same device, selection and shapes) is taken whole by its
compiled launcher (``dispatch.fast_page_table``, ``dispatch.fast_token_csr``): the same checks, in C.
Whatever it does not take, first calls, every error and ``KVDISPATCH_DEBUG`` included, goes the Python
way below. While ``torch.compile`` (or ``torch.export``) traces, a call becomes the op of the same name in
``torch.ops.kvdispatch`` (registered by ``kvdispatch.ops``), for the backend request of that trace.
"""

from __future__ import annotations

import torch

from . import _debug, dispatch, reference
from ._validate import (check_dcp_page_table_args, check_dcp_token_csr_args, check_page_table_args,
                        check_token_csr_args, dcp_lengths_device)

# Dynamo reads this as a constant True while tracing; in eager mode it is one call returning False.
_compiling = torch.compiler.is_compiling


def create_flashmla_kv_indices(req_to_token, req_pool_indices, seq_lens, out, *, page_size,
                               kv_start_idx=None, seqlen_offset=0, seq_lens_out=None,
                               fill_value=None, round_toward_zero=False, backend=None):
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

    Left untouched: rows ``>= B``; without ``fill_value``, every column past a row's pages. Bad data
    never reads or writes out of bounds: a pool index outside ``[0, R)`` or a length ``<= 0`` gives an
    empty row, and the row ends at the first position at or past column ``C``.
    No host sync and no device allocation on the GPU backends: capturable in a CUDA graph.

    Raises ``TypeError``/``ValueError`` naming the argument before anything is written, also where
    ``out`` or ``seq_lens_out`` shares memory with an input or with the other (the byte ranges from
    ``data_ptr()`` to past the last element intersect), or rows of ``out`` share memory
    (``out.stride(0) < W`` with more than one row).

    Returns:
        ``out``.
    """
    if _compiling():
        return _page_table_in_graph(req_to_token, req_pool_indices, seq_lens, out, page_size, kv_start_idx,
                                    seqlen_offset, seq_lens_out, fill_value, round_toward_zero, backend)
    fast = dispatch.fast_page_table
    if fast is not None and not _debug.ENABLED:
        # The compiled launcher hands back (NotImplemented) every call with round_toward_zero set.
        result = fast(req_to_token, req_pool_indices, seq_lens, out, page_size, kv_start_idx, seqlen_offset,
                      seq_lens_out, fill_value, backend, round_toward_zero)
        if result is not NotImplemented:
            return result
    device = check_page_table_args(req_to_token, req_pool_indices, seq_lens, out, page_size, kv_start_idx,
                                   seqlen_offset, seq_lens_out, fill_value, round_toward_zero)
    if _debug.ENABLED:
        _debug.check_page_table_data(req_to_token, req_pool_indices, seq_lens, kv_start_idx, seqlen_offset)
    dispatch.call(device, "page_table", backend, req_to_token, req_pool_indices, seq_lens, out, page_size,
                  kv_start_idx, seqlen_offset, seq_lens_out, fill_value, round_toward_zero)
    return out


def create_flashinfer_kv_indices(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, *,
                                 kv_start_idx=None, entry_page_size=1, token_mapping=None, backend=None):
    """Build token-level CSR indices (FlashInfer, Aiter non-MLA) into ``out``.

    For request ``b < B`` and ``j < seq_lens[b]``, at token position ``q = start_b + j``::

        out[kv_indptr[b] + j] = req_to_token[req_pool_indices[b], q]                  # entry_page_size 1
        out[kv_indptr[b] + j] = req_to_token[req_pool_indices[b], q // E] * E + q % E  # E = entry_page_size

    the second in 64-bit integers; then, with ``token_mapping``, the value ``v`` becomes
    ``token_mapping[v]`` when ``0 <= v < M`` and -1 otherwise (negative ``v`` included). The result is
    written in ``out``'s dtype: for int32, its low 32 bits (as ``Tensor.to(torch.int32)``).

    Args:
        req_to_token: int32 ``[R, C]``, last dim contiguous, any row stride.
        req_pool_indices: int32/int64 ``[B]``.
        seq_lens: int32/int64 ``[B]``.
        kv_indptr: int32/int64 ``[>= B]`` (usually ``B + 1``) first output position per request.
        out: int32/int64 ``[N]``, contiguous. Written in place.
        kv_start_idx: optional int32/int64 ``[B]`` first token position per request.
        entry_page_size: int in ``[1, 4096]``: tokens per table entry (a page-granular table of a pool whose
            slots are ``page * E + offset``); a row's readable positions are ``[0, C * E)``.
        token_mapping: optional int32/int64 ``[M]``, contiguous, on the table's device: maps each value
            (a slot) to the written one. Read only inside ``[0, M)``.
        backend: as for ``create_flashmla_kv_indices``.

    Left untouched: every position no request writes. No write ever lands outside ``out``, whatever
    ``kv_indptr`` says; a row ends at its last readable position; a bad pool index gives an empty row.
    Raises as ``create_flashmla_kv_indices`` does, also where ``out`` shares memory with an input
    (``token_mapping`` included).

    Returns:
        ``out``.
    """
    if _compiling():
        return _token_csr_in_graph(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, kv_start_idx,
                                   entry_page_size, token_mapping, backend)
    fast = dispatch.fast_token_csr
    if fast is not None and not _debug.ENABLED:
        # The compiled launcher hands back (NotImplemented) every call with an option or an int64 out.
        result = fast(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, kv_start_idx, backend,
                      entry_page_size, token_mapping)
        if result is not NotImplemented:
            return result
    device = check_token_csr_args(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, kv_start_idx,
                                  entry_page_size, token_mapping)
    if _debug.ENABLED and entry_page_size == 1:  # its row checks know one position per entry only
        _debug.check_token_csr_data(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, kv_start_idx)
    dispatch.call(device, "token_csr", backend, req_to_token, req_pool_indices, seq_lens, kv_indptr, out,
                  kv_start_idx, entry_page_size, token_mapping)
    return out


def _requested_backend(backend, generation):
    """The backend request a graph is traced for. Dynamo calls it while tracing and keeps the result as a
    constant, so ``KVDISPATCH_BACKEND`` is read then and not guarded on.

    ``generation`` is ``dispatch.generation``: passing it makes Dynamo guard on it, so a graph traced
    before ``kvdispatch.reset()`` is not reused after it.
    """
    return dispatch.requested_backend(backend)


# What ``torch.compiler.assume_constant_result`` does, without the import of ``torch._dynamo`` that it starts
# (about a second, more than the rest of ``import kvdispatch`` after torch); tests/test_compile.py checks that
# the two agree.
_requested_backend._dynamo_marked_constant = True


def _page_table_in_graph(req_to_token, req_pool_indices, seq_lens, out, page_size, kv_start_idx, seqlen_offset,
                         seq_lens_out, fill_value, round_toward_zero, backend):
    """``create_flashmla_kv_indices`` while tracing: the custom op, for the trace's backend request."""
    torch.ops.kvdispatch.create_flashmla_kv_indices(
        req_to_token, req_pool_indices, seq_lens, out, page_size=page_size, kv_start_idx=kv_start_idx,
        seqlen_offset=seqlen_offset, seq_lens_out=seq_lens_out, fill_value=fill_value,
        round_toward_zero=round_toward_zero,
        backend=_requested_backend(backend, dispatch.generation))
    return out


def _token_csr_in_graph(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, kv_start_idx, entry_page_size,
                        token_mapping, backend):
    """``create_flashinfer_kv_indices`` while tracing: the custom op, for the trace's backend request."""
    torch.ops.kvdispatch.create_flashinfer_kv_indices(
        req_to_token, req_pool_indices, seq_lens, kv_indptr, out, kv_start_idx=kv_start_idx,
        entry_page_size=entry_page_size, token_mapping=token_mapping,
        backend=_requested_backend(backend, dispatch.generation))
    return out


def create_dcp_kv_indices(req_to_token, req_pool_indices, local_seq_lens, kv_indptr, out, *, dcp_size, dcp_rank,
                          kv_start_idx=None, round_toward_zero=False, backend=None):
    """Build one decode-context-parallel rank's token-level CSR indices into ``out``.

    Token-interleaved DCP: position ``p`` of a request belongs to rank ``p mod D`` (``D = dcp_size``), and
    slot id ``v`` of the virtual pool is stored on its owner at local slot ``v // D``. For request ``b < B``
    let ``first_b`` be the first position ``>= kv_start_idx[b]`` (0 when absent) that ``dcp_rank`` owns;
    for ``j < local_seq_lens[b]``::

        out[kv_indptr[b] + j] = req_to_token[req_pool_indices[b], first_b + j * D] // D

    (floor division; truncation with ``round_toward_zero``), written in ``out``'s dtype.
    ``local_seq_lens[b]`` is the caller's count of the positions this rank owns (``dcp_local_lengths``).

    Args:
        req_to_token: int32 ``[R, C]`` virtual slot id per token, last dim contiguous, any row stride.
        req_pool_indices: int32/int64 ``[B]`` row of ``req_to_token`` per request.
        local_seq_lens: int32/int64 ``[B]`` tokens this rank holds per request.
        kv_indptr: int32/int64 ``[>= B]`` first output position per request (only ``[:B]`` is read).
        out: int32/int64 ``[N]``, contiguous. Written in place.
        dcp_size: int in ``[1, 1024]``, the ranks a request's tokens are spread over.
        dcp_rank: int in ``[0, dcp_size)``, this rank.
        kv_start_idx: optional int32/int64 ``[B]`` first token position per request (the rank starts at its
            first own position at or after it).
        round_toward_zero: bool; divide negative slot ids rounding toward zero, as SGLang's kernel does.
        backend: as for ``create_flashmla_kv_indices``.

    Left untouched: every position no request writes. No write ever lands outside ``out``, whatever
    ``kv_indptr`` says; a row ends at its first position outside ``[0, C)`` (a first position outside it
    gives an empty row, as does a pool index outside ``[0, R)`` or a length ``<= 0``); positions and
    offsets are exact integers. No host sync, no device allocation on the GPU backends.
    Raises as ``create_flashinfer_kv_indices`` does, also for ``dcp_size``/``dcp_rank`` out of range.

    Returns:
        ``out``.
    """
    _run("dcp_token_csr", torch.ops.kvdispatch.create_dcp_kv_indices, check_dcp_token_csr_args, backend,
         (req_to_token, req_pool_indices, local_seq_lens, kv_indptr, out),
         dict(dcp_size=dcp_size, dcp_rank=dcp_rank, kv_start_idx=kv_start_idx, round_toward_zero=round_toward_zero))
    return out


def create_dcp_page_table(req_to_token, req_pool_indices, local_seq_lens, out, *, page_size, dcp_size, dcp_rank,
                          fill_value=None, round_toward_zero=False, backend=None):
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
        backend: as for ``create_flashmla_kv_indices``.

    Left untouched: rows ``>= B``; without ``fill_value``, every column past a row's pages. A pool index
    outside ``[0, R)`` or a length ``<= 0`` gives an empty row; the row ends at its first position at or
    past column ``C``. No host sync, no device allocation on the GPU backends.
    Raises as ``create_flashmla_kv_indices`` does, also for ``dcp_size``/``dcp_rank`` out of range.

    Returns:
        ``out``.
    """
    _run("dcp_page_table", torch.ops.kvdispatch.create_dcp_page_table, check_dcp_page_table_args, backend,
         (req_to_token, req_pool_indices, local_seq_lens, out),
         dict(page_size=page_size, dcp_size=dcp_size, dcp_rank=dcp_rank, fill_value=fill_value,
              round_toward_zero=round_toward_zero))
    return out


def _run(op, custom_op, check, backend, tensors, options):
    """One call of ``op``: validated by ``check`` (which takes ``tensors`` and ``options`` by these names), then
    dispatched with ``tensors`` and the values of ``options``, in order (the backends' positional parameters);
    while tracing, the custom op ``custom_op`` with the same arguments instead."""
    if _compiling():
        custom_op(*tensors, **options, backend=_requested_backend(backend, dispatch.generation))
        return
    device = check(*tensors, **options)
    dispatch.call(device, op, backend, *tensors, *options.values())


def dcp_local_lengths(seq_lens, dcp_size, dcp_rank, kv_start_idx=None, out=None):
    """Per request, the tokens of ``[start_b, start_b + seq_lens[b])`` that rank ``dcp_rank`` holds under
    token-interleaved DCP (positions ``p`` with ``p mod dcp_size == dcp_rank``; ``start_b = kv_start_idx[b]``,
    0 when absent): the ``local_seq_lens`` of ``create_dcp_kv_indices`` and ``create_dcp_page_table``.

    PyTorch operations on the tensors' device: no host sync, capturable in a CUDA graph. Exact for every
    int32/int64 value; 0 where ``seq_lens[b] <= 0``.

    Args:
        seq_lens: int32/int64 ``[B]``.
        dcp_size: int in ``[1, 1024]``; dcp_rank: int in ``[0, dcp_size)``.
        kv_start_idx: optional int32/int64 ``[B]``.
        out: optional int32/int64 ``[>= B]``; receives the counts in ``out[:B]`` (the rest is untouched).

    Returns:
        ``out``, or a new ``[B]`` tensor of ``seq_lens``' dtype.
    """
    dcp_lengths_device(seq_lens, dcp_size, dcp_rank, kv_start_idx, out)
    counts = reference.dcp_owned_counts(seq_lens, dcp_size, dcp_rank, kv_start_idx).clamp_(min=0)
    if out is None:
        return counts.to(seq_lens.dtype)
    out[: counts.shape[0]].copy_(counts)
    return out
