"""The public index builders. Validation, then one dispatch lookup, then one kernel launch.

A call the Triton or CuPy backend has launched before (same device, selection and shapes) is taken whole by
the compiled host path (``kvdispatch/host_path.c``), every op by its
replay entry (``dispatch.fast_replay``), which launches what the Python path launched for a call of the same
key (every argument's metadata and int values) with the new call's pointers, once the outputs are found
apart from the other arguments. Whatever it does not take, first calls, every error and ``KVDISPATCH_DEBUG``
included, goes the Python way below (which registers the replay plans), and so do calls with programmatic
dependent launch (``enable_pdl``), which the compiled host path does not take. While ``torch.compile`` (or
``torch.export``) traces, a call becomes the op of the same name in ``torch.ops.kvdispatch`` (registered by
``kvdispatch.ops``), for the backend request of that trace.
"""

from __future__ import annotations

import torch

from . import _debug, dispatch, reference
from ._validate import (check_dcp_page_table_args, check_dcp_token_csr_args, check_draft_decode_args, check_flag,
                        check_mha_page_table_args, check_page_table_args, check_token_csr_args,
                        check_translated_page_table_args, dcp_lengths_device)

# Dynamo reads this as a constant True while tracing; in eager mode it is one call returning False.
_compiling = torch.compiler.is_compiling


def _replayed(op: int, backend, pdl: bool, *args) -> bool:
    """Whether the compiled host path's replay entry (``dispatch.fast_replay``) took a call of ``op`` with the
    public function's arguments ``args``: it takes none under ``KVDISPATCH_DEBUG`` or with PDL, and hands back
    (NotImplemented) whatever it cannot take."""
    replay = dispatch.fast_replay
    return (replay is not None and not _debug.ENABLED and not pdl
            and replay(op, backend, *args) is not NotImplemented)
# The replay entry's op codes (``dispatch.fast_replay``).
_PAGE_TABLE, _TOKEN_CSR, _DRAFT_DECODE, _DCP_TOKEN_CSR, _DCP_PAGE_TABLE, _MHA_PAGE_TABLE, _TRANSLATED_PAGE_TABLE = (
    dispatch.HOST_PATH_OPS[op] for op in ("page_table", "token_csr", "draft_decode", "dcp_token_csr",
                                          "dcp_page_table", "mha_page_table", "translated_page_table"))
# ``kvdispatch.host_path``, imported by the first GPU call that may register a replay plan (``_dispatch``).
_host_path = None


def create_flashmla_kv_indices(req_to_token, req_pool_indices, seq_lens, out, *, page_size,
                               kv_start_idx=None, seqlen_offset=0, seq_lens_out=None,
                               fill_value=None, round_toward_zero=False, backend=None, enable_pdl=None):
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
    pdl = _pdl(enable_pdl)  # also while tracing: the custom op's schema would refuse a string with its own error
    if _compiling():
        return _page_table_in_graph(req_to_token, req_pool_indices, seq_lens, out, page_size, kv_start_idx,
                                    seqlen_offset, seq_lens_out, fill_value, round_toward_zero, backend,
                                    enable_pdl)
    if _replayed(_PAGE_TABLE, backend, pdl, req_to_token, req_pool_indices, seq_lens, out, page_size, kv_start_idx,
                 seqlen_offset, seq_lens_out, fill_value, round_toward_zero):
        return out
    device = check_page_table_args(req_to_token, req_pool_indices, seq_lens, out, page_size, kv_start_idx,
                                   seqlen_offset, seq_lens_out, fill_value, round_toward_zero)
    if _debug.ENABLED:
        _debug.check_page_table_data(req_to_token, req_pool_indices, seq_lens, out, page_size, kv_start_idx,
                                     seqlen_offset)
    _dispatch(device, "page_table", backend, pdl, (req_to_token, req_pool_indices, seq_lens, out, page_size,
                                                   kv_start_idx, seqlen_offset, seq_lens_out, fill_value,
                                                   round_toward_zero))
    return out


def create_flashinfer_kv_indices(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, *,
                                 kv_start_idx=None, entry_page_size=1, token_mapping=None, backend=None,
                                 enable_pdl=None):
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
        backend, enable_pdl: as for ``create_flashmla_kv_indices``.

    Left untouched: every position no request writes. No write ever lands outside ``out``, whatever
    ``kv_indptr`` says; a row ends at its last readable position; a bad pool index gives an empty row. Where
    the output ranges of two requests overlap (``kv_indptr`` rows that overlap), each overlapped entry holds
    the value one of the covering requests writes there (which one is not defined); every other entry is
    exact on every backend.
    Raises as ``create_flashmla_kv_indices`` does, also where ``out`` shares memory with an input
    (``token_mapping`` included).

    Returns:
        ``out``.
    """
    pdl = _pdl(enable_pdl)  # also while tracing: the custom op's schema would refuse a string with its own error
    if _compiling():
        return _token_csr_in_graph(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, kv_start_idx,
                                   entry_page_size, token_mapping, backend, enable_pdl)
    if _replayed(_TOKEN_CSR, backend, pdl, req_to_token, req_pool_indices, seq_lens, kv_indptr, out, kv_start_idx,
                 entry_page_size, token_mapping):
        return out
    device = check_token_csr_args(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, kv_start_idx,
                                  entry_page_size, token_mapping)
    if _debug.ENABLED:
        _debug.check_token_csr_data(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, kv_start_idx,
                                    entry_page_size, token_mapping)
    _dispatch(device, "token_csr", backend, pdl, (req_to_token, req_pool_indices, seq_lens, kv_indptr, out,
                                                  kv_start_idx, entry_page_size, token_mapping))
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
                         seq_lens_out, fill_value, round_toward_zero, backend, enable_pdl):
    """``create_flashmla_kv_indices`` while tracing: the custom op, for the trace's backend request."""
    torch.ops.kvdispatch.create_flashmla_kv_indices(
        req_to_token, req_pool_indices, seq_lens, out, page_size=page_size, kv_start_idx=kv_start_idx,
        seqlen_offset=seqlen_offset, seq_lens_out=seq_lens_out, fill_value=fill_value,
        round_toward_zero=round_toward_zero,
        backend=_requested_backend(backend, dispatch.generation), enable_pdl=enable_pdl)
    return out


def _token_csr_in_graph(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, kv_start_idx, entry_page_size,
                        token_mapping, backend, enable_pdl):
    """``create_flashinfer_kv_indices`` while tracing: the custom op, for the trace's backend request."""
    torch.ops.kvdispatch.create_flashinfer_kv_indices(
        req_to_token, req_pool_indices, seq_lens, kv_indptr, out, kv_start_idx=kv_start_idx,
        entry_page_size=entry_page_size, token_mapping=token_mapping,
        backend=_requested_backend(backend, dispatch.generation), enable_pdl=enable_pdl)
    return out


def create_trtllm_mha_page_table(req_to_token, req_pool_indices, seq_lens, page_table, *, page_size,
                                 swa_page_table=None, full_to_swa=None, round_toward_zero=False, backend=None,
                                 enable_pdl=None):
    """Build the TRT-LLM MHA page table (and its sliding-window twin) into ``page_table``.

    For request ``b < B`` and page ``p < ceil(L_b / page_size)``, with ``L_b = seq_lens[b]``::

        slot = req_to_token[req_pool_indices[b], p * page_size]
        page_table[b, p] = slot // page_size                                   # p < W
        swa_page_table[b, p] = full_to_swa[clamp(slot, 0, M - 1)] // page_size  # p < W2, with SWA

    ``//`` floors (truncates with ``round_toward_zero``, as SGLang's kernel divides); the SWA value is the
    quotient's low 32 bits. The out-of-range slots the clamp catches read the mapping's first or last entry,
    as in SGLang; an empty mapping (``M == 0``) writes nothing into ``swa_page_table``.

    Args:
        req_to_token, req_pool_indices, seq_lens: as for ``create_flashmla_kv_indices`` (int32 ``[R, C]``,
            int32/int64 ``[B]``, int32/int64 ``[B]``).
        page_table: int32 ``[>= B, W]``, last dim contiguous, any row stride. Written in place.
        page_size: int in ``[1, 4096]``.
        swa_page_table: optional int32 ``[>= B, W2]`` (last dim contiguous, any row stride), given together
            with ``full_to_swa``: int32/int64 ``[M]``, contiguous, the full pool's slot -> SWA pool's slot.
        round_toward_zero: bool; divide negative values rounding toward zero.
        backend: ``"triton"``, ``"cupy"``, ``"torch"``, ``"auto"`` or None (auto, or ``KVDISPATCH_BACKEND``).
        enable_pdl: programmatic dependent launch, as for ``create_flashmla_kv_indices``.

    Left untouched: rows ``>= B`` of both tables and the columns past each row's pages. Bad data never
    reads or writes out of bounds: a pool index outside ``[0, R)`` or a length ``<= 0`` gives an empty row,
    and a row ends at its first page starting at or past column ``C``. No host sync and no device allocation
    on the GPU backends: capturable in a CUDA graph.

    Raises ``TypeError``/``ValueError`` naming the argument before anything is written: bad dtypes, shapes or
    devices, one of ``swa_page_table``/``full_to_swa`` without the other, outputs sharing memory with an input
    or with each other, rows of a table sharing memory.

    Returns:
        ``page_table``.
    """
    pdl = _pdl(enable_pdl)  # also while tracing: the custom op's schema would refuse a string with its own error
    if _compiling():
        torch.ops.kvdispatch.create_trtllm_mha_page_table(
            req_to_token, req_pool_indices, seq_lens, page_table, page_size=page_size,
            swa_page_table=swa_page_table, full_to_swa=full_to_swa, round_toward_zero=round_toward_zero,
            backend=_requested_backend(backend, dispatch.generation), enable_pdl=enable_pdl)
        return page_table
    if _replayed(_MHA_PAGE_TABLE, backend, pdl, req_to_token, req_pool_indices, seq_lens, page_table, page_size,
                 swa_page_table, full_to_swa, round_toward_zero):
        return page_table
    device = check_mha_page_table_args(req_to_token, req_pool_indices, seq_lens, page_table, page_size,
                                       swa_page_table, full_to_swa, round_toward_zero)
    if _debug.ENABLED:
        _debug.check_mha_page_table_data(req_to_token, req_pool_indices, seq_lens, page_table, page_size,
                                         swa_page_table, full_to_swa)
    _dispatch(device, "mha_page_table", backend, pdl, (req_to_token, req_pool_indices, seq_lens, page_table,
                                                       page_size, swa_page_table, full_to_swa, round_toward_zero))
    return page_table


def create_translated_page_table(req_to_token, req_pool_indices, seq_lens, v2p, out, *, page_size, multiplier=1,
                                 max_pages=None, seq_len_delta=0, backend=None, enable_pdl=None):
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
        backend, enable_pdl: as for ``create_trtllm_mha_page_table``.

    Left untouched: rows ``>= B``, columns ``>= max_pages`` and the columns past each row's live ones (a reused
    buffer keeps its stale tail). Bad data never reads or writes out of bounds: a bad pool index or a length
    ``<= 0`` gives an empty row, a row ends at its first column starting at or past ``C``. No host sync, no
    device allocation on the GPU backends.

    Raises ``TypeError``/``ValueError`` naming the argument before anything is written, also where ``out``
    shares memory with an input or its rows share memory.

    Returns:
        ``out``.
    """
    pdl = _pdl(enable_pdl)  # also while tracing: the custom op's schema would refuse a string with its own error
    if _compiling():
        torch.ops.kvdispatch.create_translated_page_table(
            req_to_token, req_pool_indices, seq_lens, v2p, out, page_size=page_size, multiplier=multiplier,
            max_pages=max_pages, seq_len_delta=seq_len_delta, backend=_requested_backend(backend, dispatch.generation),
            enable_pdl=enable_pdl)
        return out
    if _replayed(_TRANSLATED_PAGE_TABLE, backend, pdl, req_to_token, req_pool_indices, seq_lens, v2p, out, page_size,
                 multiplier, max_pages, seq_len_delta):
        return out
    device = check_translated_page_table_args(req_to_token, req_pool_indices, seq_lens, v2p, out, page_size,
                                              multiplier, max_pages, seq_len_delta)
    if _debug.ENABLED:
        _debug.check_translated_page_table_data(req_to_token, req_pool_indices, seq_lens, v2p, out, page_size,
                                                multiplier, max_pages, seq_len_delta)
    _dispatch(device, "translated_page_table", backend, pdl,
              (req_to_token, req_pool_indices, seq_lens, v2p, out, page_size, multiplier, max_pages, seq_len_delta))
    return out


def create_draft_decode_kv_indices(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, *, num_steps, topk,
                                   page_size=1, positions=None, window_size=0, sink_size=0, v2p=None,
                                   write_indptr_start=True, round_toward_zero=False, backend=None, enable_pdl=None):
    """Build the token CSR of every step of a speculative multi-step draft decode (EAGLE with ``topk``
    branches per request) into ``out`` and ``kv_indptr``, all steps in one launch.

    ``B = req_pool_indices.shape[0]`` requests, ``K = topk`` branches each, ``S = num_steps`` steps; step
    ``s`` has ``it = s + 1`` draft tokens. Segment ``z = b * K + k`` (request ``b``, branch ``k``) of step
    ``s`` is the request's prefix, ``n_b = min(max(seq_lens[b], 0), cap)`` tokens (``cap`` below), then the
    branch's ``it`` draft slots; row ``s`` of ``out`` holds the segments one after another::

        offset(s, z) = K * (n_0 + ... + n_{b-1}) + b * K * it + k * (n_b + it)
        out[s, offset(s, z) + i]       = token(b, i)                       for i < n_b
        out[s, offset(s, z) + n_b + j] = row_b[start(b, k) + j]             for j < it
        kv_indptr[s, z]                = offset(s, z)                       for z in 1 .. B*K

    where ``row_b = req_to_token[req_pool_indices[b]]``, ``token(b, i) = row_b[i]`` and
    ``start(b, k) = L + k * ceil((L mod P + S) / P) * P`` with ``L = seq_lens[b]``, ``P = page_size`` (the
    draft slots each branch owns in a paged pool; ``L + k * S`` when ``P == 1`` or ``K == 1``). ``mod``
    rounds down, or toward zero with ``round_toward_zero`` (they differ for negative lengths only).
    ``kv_indptr[s, B*K]`` is the row's used length, ``K * sum(n) + B * K * it``.

    Options:
        positions: int32/int64 ``[>= B*K]``: ``kv_indptr[s, z] = p_0 + ... + p_{z-1} + z * it`` with
            ``p = min(max(positions, 0), cap)`` instead (SGLang's rule; equal to the offsets when the
            positions are the lengths repeated ``K`` times); ``out``'s layout still follows ``seq_lens``.
        window_size, sink_size: with ``window_size > 0``, a draft-only sliding window: ``cap = window_size +
            sink_size`` and the prefix is the first ``min(sink_size, n_b)`` tokens, then the last
            ``n_b - min(sink_size, n_b)`` of the ``L`` tokens (positions ``L - n_b + i``); draft slots are
            still read from ``start(b, k)`` of the full length. Without a window there is no cap.
        v2p: int32/int64 ``[V]``, contiguous: every value ``x`` read is written as
            ``v2p[x // P] * P + x % P``, or 0 when ``x < 0``, ``x // P >= V`` or ``v2p[x // P] < 0``.
        write_indptr_start: write ``kv_indptr[s, 0] = 0`` (SGLang's kernel leaves it untouched).

    Args:
        req_to_token: int32 ``[R, C]``, last dim contiguous, any row stride.
        req_pool_indices, seq_lens: int32/int64 ``[B]``, any stride.
        kv_indptr: int32/int64 ``[>= S, >= B*K + 1]``, last dim contiguous, any row stride. Written in place.
        out: int32/int64 ``[>= S, W]``, last dim contiguous, any row stride, ``W <= 2**32``. Written in place.
        num_steps: int in ``[0, 1024]``; topk: int in ``[1, 1024]``; page_size: int in ``[1, 4096]``.
        window_size, sink_size: ints in ``[0, 2**31 - 1]``.
        backend, enable_pdl: as for ``create_flashmla_kv_indices``.

    Values are stored in the output's dtype (int32: the low 32 bits). Integers are exact: offsets and sums
    saturate at ``kvdispatch.grid.DRAFT_OFFSET_LIMIT`` (``2**32``, past any ``out``), which is what
    ``kv_indptr`` then holds. Bad data reads and writes nothing out of bounds: a pool index outside
    ``[0, R)`` reads nothing (the segment keeps its place, its entries are left untouched), a length
    ``<= 0`` gives an empty prefix, a position outside ``[0, C)`` is not read (its entry is left
    untouched), and entries at columns ``>= W`` are not written. Segments never overlap (the op lays them
    out itself; ``kv_indptr`` is written, never read), so every entry is exact on every backend.

    Left untouched: rows ``>= S`` of both outputs, columns of ``kv_indptr`` past ``B*K`` (and column 0 without
    ``write_indptr_start``), every column of ``out`` no segment covers; everything when ``B == 0``.
    No host sync and no device allocation on the GPU backends: capturable in a CUDA graph; one Triton
    compilation per page size and option set, whatever the batch, widths, ``num_steps`` and ``topk``.
    Raises ``TypeError``/``ValueError`` naming the argument before anything is written, also where
    an output shares memory with an input or the other output, or rows of an output share memory.

    Returns:
        ``out``.
    """
    pdl = _pdl(enable_pdl)  # also while tracing: the custom op's schema would refuse a string with its own error
    if _compiling():
        return _draft_decode_in_graph(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, num_steps, topk,
                                      page_size, positions, window_size, sink_size, v2p, write_indptr_start,
                                      round_toward_zero, backend, enable_pdl)
    if _replayed(_DRAFT_DECODE, backend, pdl, req_to_token, req_pool_indices, seq_lens, kv_indptr, out, num_steps, topk,
                 page_size, positions, window_size, sink_size, v2p, write_indptr_start, round_toward_zero):
        return out
    device = check_draft_decode_args(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, num_steps, topk,
                                     page_size, positions, window_size, sink_size, v2p, write_indptr_start,
                                     round_toward_zero)
    if _debug.ENABLED:
        _debug.check_draft_decode_data(req_to_token, req_pool_indices, seq_lens, out, num_steps, topk, page_size,
                                       positions, window_size, sink_size, v2p, round_toward_zero)
    _dispatch(device, "draft_decode", backend, pdl,
              (req_to_token, req_pool_indices, seq_lens, kv_indptr, out, num_steps, topk, page_size, positions,
               window_size, sink_size, v2p, write_indptr_start, round_toward_zero))
    return out


def _draft_decode_in_graph(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, num_steps, topk, page_size,
                           positions, window_size, sink_size, v2p, write_indptr_start, round_toward_zero, backend,
                           enable_pdl):
    """``create_draft_decode_kv_indices`` while tracing: the custom op, for the trace's backend request."""
    torch.ops.kvdispatch.create_draft_decode_kv_indices(
        req_to_token, req_pool_indices, seq_lens, kv_indptr, out, num_steps=num_steps, topk=topk,
        page_size=page_size, positions=positions, window_size=window_size, sink_size=sink_size, v2p=v2p,
        write_indptr_start=write_indptr_start, round_toward_zero=round_toward_zero,
        backend=_requested_backend(backend, dispatch.generation), enable_pdl=enable_pdl)
    return out


def create_dcp_kv_indices(req_to_token, req_pool_indices, local_seq_lens, kv_indptr, out, *, dcp_size, dcp_rank,
                          kv_start_idx=None, round_toward_zero=False, backend=None, enable_pdl=None):
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
        backend, enable_pdl: as for ``create_flashmla_kv_indices``.

    Left untouched: every position no request writes. No write ever lands outside ``out``, whatever
    ``kv_indptr`` says; a row ends at its first position outside ``[0, C)`` (a first position outside it
    gives an empty row, as does a pool index outside ``[0, R)`` or a length ``<= 0``); positions and
    offsets are exact integers. Overlapping ``kv_indptr`` rows as for ``create_flashinfer_kv_indices`` (each
    overlapped entry holds one covering request's value, every other entry is exact). No host sync, no
    device allocation on the GPU backends.
    Raises as ``create_flashinfer_kv_indices`` does, also for ``dcp_size``/``dcp_rank`` out of range.

    Returns:
        ``out``.
    """
    pdl = _pdl(enable_pdl)
    if not _compiling() and _replayed(_DCP_TOKEN_CSR, backend, pdl, req_to_token, req_pool_indices, local_seq_lens,
                                      kv_indptr, out, dcp_size, dcp_rank, kv_start_idx, round_toward_zero):
        return out
    _run("dcp_token_csr", torch.ops.kvdispatch.create_dcp_kv_indices, check_dcp_token_csr_args,
         _debug.check_dcp_token_csr_data, backend, enable_pdl,
         (req_to_token, req_pool_indices, local_seq_lens, kv_indptr, out),
         dict(dcp_size=dcp_size, dcp_rank=dcp_rank, kv_start_idx=kv_start_idx, round_toward_zero=round_toward_zero))
    return out


def create_dcp_page_table(req_to_token, req_pool_indices, local_seq_lens, out, *, page_size, dcp_size, dcp_rank,
                          fill_value=None, round_toward_zero=False, backend=None, enable_pdl=None):
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
        backend, enable_pdl: as for ``create_flashmla_kv_indices``.

    Left untouched: rows ``>= B``; without ``fill_value``, every column past a row's pages. A pool index
    outside ``[0, R)`` or a length ``<= 0`` gives an empty row; the row ends at its first position at or
    past column ``C``. No host sync, no device allocation on the GPU backends.
    Raises as ``create_flashmla_kv_indices`` does, also for ``dcp_size``/``dcp_rank`` out of range.

    Returns:
        ``out``.
    """
    pdl = _pdl(enable_pdl)
    if not _compiling() and _replayed(_DCP_PAGE_TABLE, backend, pdl, req_to_token, req_pool_indices, local_seq_lens,
                                      out, page_size, dcp_size, dcp_rank, fill_value, round_toward_zero):
        return out
    _run("dcp_page_table", torch.ops.kvdispatch.create_dcp_page_table, check_dcp_page_table_args,
         _debug.check_dcp_page_table_data, backend, enable_pdl,
         (req_to_token, req_pool_indices, local_seq_lens, out),
         dict(page_size=page_size, dcp_size=dcp_size, dcp_rank=dcp_rank, fill_value=fill_value,
              round_toward_zero=round_toward_zero))
    return out


def _run(op, custom_op, check, check_data, backend, enable_pdl, tensors, options):
    """One call of ``op``: validated by ``check`` (which takes ``tensors`` and ``options`` by these names), its
    data checked by ``check_data`` (same arguments) under ``KVDISPATCH_DEBUG``, then dispatched with ``tensors``,
    the values of ``options``, in order (the backends' positional parameters), and the PDL choice
    (``_pdl``); while tracing, the custom op ``custom_op`` with the same arguments instead."""
    if _compiling():
        custom_op(*tensors, **options, backend=_requested_backend(backend, dispatch.generation),
                  enable_pdl=enable_pdl)
        return
    device = check(*tensors, **options)
    if _debug.ENABLED:
        check_data(*tensors, **options)
    _dispatch(device, op, backend, _pdl(enable_pdl), tensors + tuple(options.values()))


def _dispatch(device, op, backend, pdl, args):
    """``dispatch.call`` of ``op`` with ``args`` (the public arguments in the API's order, without ``backend``
    and ``enable_pdl``: what the backends and the replay entry take) and ``pdl``. Where the compiled host path
    may take later such calls (a GPU, no PDL, no ``KVDISPATCH_DEBUG``, the extension not known to be
    unavailable), the call's one launch becomes the replay plan of its key (``host_path.call_and_register``)."""
    global _host_path
    if pdl or _debug.ENABLED or device.type != "cuda":
        dispatch.call(device, op, backend, *args, pdl)
        return
    if _host_path is None:
        from . import host_path  # noqa: PLC0415  (import kvdispatch does not import it)

        _host_path = host_path
    if _host_path.failure() is not None:
        dispatch.call(device, op, backend, *args, pdl)
    else:
        _host_path.call_and_register(op, backend, args, lambda: dispatch.call(device, op, backend, *args, pdl))


def _pdl(enable_pdl):
    """The backends' ``pdl`` argument: ``enable_pdl``, or ``KVDISPATCH_PDL`` (``dispatch.pdl_default``) for
    None; anything but a bool or None is a ``TypeError``, before the compiled host path or a backend sees the
    call. Each backend honours it only where the device supports PDL."""
    if enable_pdl is None:
        return dispatch.pdl_default
    check_flag("enable_pdl", enable_pdl, optional=True)
    return enable_pdl


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
        out: optional int32/int64 ``[>= B]``, an entry of its own per request (not an expanded, stride-0
            view); receives the counts in ``out[:B]`` (the rest is untouched). Counts above ``2**31 - 1`` are
            stored as ``2**31 - 1`` in an int32 ``out`` (saturated, never wrapped: telling the caller would
            need a sync).

    Raises ``TypeError``/``ValueError`` naming the argument before anything is written.

    Returns:
        ``out``, or a new ``[B]`` tensor of ``seq_lens``' dtype (which holds every count: none exceeds its
        length).
    """
    dcp_lengths_device(seq_lens, dcp_size, dcp_rank, kv_start_idx, out)
    counts = reference.dcp_owned_counts(seq_lens, dcp_size, dcp_rank, kv_start_idx).clamp_(min=0)
    if out is None:
        return counts.to(seq_lens.dtype)
    if out.dtype == torch.int32:
        counts.clamp_(max=reference.INT32_MAX)
    out[: counts.shape[0]].copy_(counts)
    return out
