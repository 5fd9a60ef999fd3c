"""A drop-in for SGLang's module ``sglang.kernels.ops.kvcache.kv_indices``, on kvdispatch.

``from kvdispatch.compat.sglang import X`` replaces ``from sglang.kernels.ops.kvcache.kv_indices import X``
for each of that module's public names, with the same parameter names, order and defaults:

* the builders ``create_flashinfer_kv_indices_triton`` (token CSR), ``create_chunked_prefix_cache_kv_indices``
  (token CSR of one prefix chunk) and ``create_flashmla_kv_indices_triton`` (paged block table). Each is
  called with Triton's launch syntax ``builder[grid](...)`` or directly; the grid is accepted and ignored,
  because kvdispatch sizes its own launch (from the buffers' shapes, never from the data, so a captured
  CUDA graph stays valid). The batch is ``req_pool_indices.shape[0]``: SGLang's call sites launch one
  program per entry. They forward to ``kvdispatch.create_flashinfer_kv_indices`` and
  ``kvdispatch.create_flashmla_kv_indices`` and return the output tensor;
* the grid helpers ``get_num_page_per_block_flashmla``, ``get_num_kv_index_blocks_flashmla``,
  ``kv_indices_num_token_blocks``, ``kv_indices_token_blocks_for_copy`` and the constant
  ``KV_INDICES_TOKEN_BLOCKS_MIN_WIDTH``, with SGLang's values (engines size their buffers and grids with
  them). The compile-time block size of SGLang's own page-table kernel is not mirrored: no engine imports
  it, and ``get_num_page_per_block_flashmla`` gives its value per page size.

From SGLang's other KV-index modules, with their names and keyword-only parameters:
``update_trtllm_mla_graph_metadata`` (the TRT-LLM MLA backend's fused CUDA-graph metadata update).

The row strides SGLang passes explicitly (``req_to_token_ptr_stride``, ``kv_indices_ptr_stride``) are
redundant, since tensors carry their strides: they are checked against the tensors, and a mismatch is a
``ValueError`` (in SGLang's kernel it would be a silent read or write in the wrong place). A 1-D
``kv_indices_ptr`` for the block table is read as rows of ``kv_indices_ptr_stride`` entries.
``TOKEN_BLOCK_PARALLEL`` is accepted and ignored (in SGLang, too, it changes how the copy is split, not
its result). ``ENTRY_PAGE_SIZE`` and ``token_mapping`` are passed on as ``entry_page_size=`` /
``token_mapping=``, and only when they differ from their defaults. Tensors take the dtypes the public API
takes.

Where SGLang's kernels would step outside a request's row (reading or writing a neighbouring row, or
past the tensor), the result is kvdispatch's bounded one instead: a block-table row stops at the buffer's width (SGLang writes the pages
past it into the next row), a row stops at the token table's last column or at a negative position
(SGLang reads the neighbouring row), nothing is written outside ``kv_indices`` whatever ``kv_indptr``
says, and a pool index outside the table gives an empty row. Elsewhere the results are SGLang's (the
block table divides a negative slot id rounding toward zero, as SGLang's kernel does: slot -65 at page
size 64 gives page -1), with one difference: lengths and start positions are exact integers, where
SGLang's kernels keep their low 32 bits (an int64 start of ``2**32 + 5`` is position 5 there, past the
table here).
"""

from __future__ import annotations

from .. import api

# SGLang's page-table kernel gives each program 4096 tokens' worth of pages.
_TOKENS_PER_PAGE_PROGRAM = 4096
# Token-block sizing of SGLang's token-CSR launches: about 8192 tokens per program, about 512 programs.
_TOKENS_PER_TOKEN_BLOCK = 8192
_TOKEN_BLOCK_PROGRAMS = 512
# Rows narrower than this are copied by one program per request.
KV_INDICES_TOKEN_BLOCKS_MIN_WIDTH = 32768

# The two public builders, looked up at call time through these names (tests route them per backend).
_build_page_table = api.create_flashmla_kv_indices
_build_token_csr = api.create_flashinfer_kv_indices
_build_mha_page_table = api.create_trtllm_mha_page_table
_build_translated_page_table = api.create_translated_page_table


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def get_num_page_per_block_flashmla(page_size: int = 64) -> int:
    """Pages per program of SGLang's page-table kernel: ``4096 // page_size``."""
    return _TOKENS_PER_PAGE_PROGRAM // page_size


def get_num_kv_index_blocks_flashmla(kv_indices_width: int, page_size: int) -> int:
    """Programs per row SGLang launches for a block table ``kv_indices_width`` pages wide:
    ``ceil(kv_indices_width / get_num_page_per_block_flashmla(page_size))``."""
    return _cdiv(kv_indices_width, get_num_page_per_block_flashmla(page_size))


def kv_indices_num_token_blocks(table_width: int, base_programs: int) -> int:
    """Token blocks per request for SGLang's token-block launches:
    ``max(1, min(ceil(table_width / 8192), 512 // max(1, base_programs)))``."""
    return max(1, min(_cdiv(table_width, _TOKENS_PER_TOKEN_BLOCK), _TOKEN_BLOCK_PROGRAMS // max(1, base_programs)))


def kv_indices_token_blocks_for_copy(table_width: int, base_programs: int) -> int:
    """1 for a token table narrower than ``KV_INDICES_TOKEN_BLOCKS_MIN_WIDTH``, else
    ``kv_indices_num_token_blocks(table_width, base_programs)``."""
    if table_width < KV_INDICES_TOKEN_BLOCKS_MIN_WIDTH:
        return 1
    return kv_indices_num_token_blocks(table_width, base_programs)


class _LaunchSyntax:
    """Wraps a builder so that ``builder[grid](...)`` (Triton launch syntax) also works; the grid is ignored."""

    def __init__(self, function, name):
        function.__name__ = function.__qualname__ = name
        self._function = function
        self.__doc__ = function.__doc__
        self.__name__ = name
        self.__wrapped__ = function

    def __call__(self, *args, **kwargs):
        return self._function(*args, **kwargs)

    def __getitem__(self, grid):
        return self._function

    def __repr__(self):
        return f"<kvdispatch.compat.sglang.{self.__name__}>"


def _check_stride(name, given, actual):
    if given is not None and int(given) != actual:
        raise ValueError(f"{name}={given} does not match the tensor's row stride {actual}; kvdispatch reads "
                         "strides from the tensors, so pass the tensor the stride belongs to")


def _as_rows(kv_indices, kv_indices_stride):
    """A 2-D view of ``kv_indices``; a flat buffer is read as rows of ``kv_indices_stride`` entries."""
    if kv_indices.dim() == 1:
        if kv_indices_stride is None:
            raise ValueError("a 1-D kv_indices_ptr needs kv_indices_ptr_stride (the row width)")
        width = int(kv_indices_stride)
        if width <= 0:
            raise ValueError(f"kv_indices_ptr_stride must be positive, got {width}")
        return kv_indices.as_strided((kv_indices.shape[0] // width, width), (width, 1))
    _check_stride("kv_indices_ptr_stride", kv_indices_stride, kv_indices.stride(0))
    return kv_indices


def _create_flashinfer_kv_indices(req_to_token_ptr, req_pool_indices_ptr, page_kernel_lens_ptr, kv_indptr,
                                  kv_start_idx, kv_indices_ptr, req_to_token_ptr_stride, ENTRY_PAGE_SIZE=1,
                                  TOKEN_BLOCK_PARALLEL=False, token_mapping=None):
    """Token-level CSR indices (FlashInfer, Triton and Aiter attention, EAGLE verify / draft extend).

    ``kv_indices_ptr[kv_indptr[b] + j] = req_to_token_ptr[req_pool_indices_ptr[b], kv_start_idx[b] + j]``
    for ``j < page_kernel_lens_ptr[b]`` (``kv_start_idx`` None: 0). Only ``kv_indptr[b]`` is read, for
    ``b < B = req_pool_indices_ptr.shape[0]``; every other position of ``kv_indices_ptr`` is left untouched.

    With ``ENTRY_PAGE_SIZE = E > 1`` the table holds one entry per ``E`` tokens and token ``q`` is
    ``req_to_token_ptr[row, q // E] * E + q % E``; with ``token_mapping`` every non-negative id ``v``
    becomes ``token_mapping[v]`` (negative ids give -1). These two are forwarded to the public API's
    ``entry_page_size=`` / ``token_mapping=`` keywords. ``TOKEN_BLOCK_PARALLEL`` changes nothing.

    Shapes and dtypes as ``kvdispatch.create_flashinfer_kv_indices``; ``req_to_token_ptr_stride`` is checked
    against ``req_to_token_ptr.stride(0)``. Returns ``kv_indices_ptr``.
    """
    _check_stride("req_to_token_ptr_stride", req_to_token_ptr_stride, req_to_token_ptr.stride(0))
    if ENTRY_PAGE_SIZE != 1 or token_mapping is not None:
        _build_token_csr(req_to_token_ptr, req_pool_indices_ptr, page_kernel_lens_ptr, kv_indptr, kv_indices_ptr,
                         kv_start_idx=kv_start_idx, entry_page_size=ENTRY_PAGE_SIZE, token_mapping=token_mapping)
    else:
        _build_token_csr(req_to_token_ptr, req_pool_indices_ptr, page_kernel_lens_ptr, kv_indptr, kv_indices_ptr,
                         kv_start_idx=kv_start_idx)
    return kv_indices_ptr


def _create_chunked_prefix_cache_kv_indices(req_to_token_ptr, req_pool_indices_ptr, chunk_start_idx_ptr,
                                            chunk_seq_lens_ptr, chunk_cu_seq_lens_ptr, chunk_kv_indices_ptr,
                                            req_to_token_ptr_stride):
    """Token-level CSR indices of one prefix chunk per request (chunked-prefix MLA, DCP prefix gather).

    ``chunk_kv_indices_ptr[chunk_cu_seq_lens_ptr[b] + j] =
    req_to_token_ptr[req_pool_indices_ptr[b], chunk_start_idx_ptr[b] + j]`` for ``j < chunk_seq_lens_ptr[b]``:
    the token CSR with ``kv_start_idx = chunk_start_idx_ptr``. Only ``chunk_cu_seq_lens_ptr[b]`` is read
    for ``b < B = req_pool_indices_ptr.shape[0]``, so an exclusive prefix sum of length ``B`` serves as
    well as one of length ``B + 1`` with a leading 0. Everything else is left untouched.

    ``req_to_token_ptr_stride`` is checked against ``req_to_token_ptr.stride(0)``.
    Returns ``chunk_kv_indices_ptr``.
    """
    _check_stride("req_to_token_ptr_stride", req_to_token_ptr_stride, req_to_token_ptr.stride(0))
    _build_token_csr(req_to_token_ptr, req_pool_indices_ptr, chunk_seq_lens_ptr, chunk_cu_seq_lens_ptr,
                     chunk_kv_indices_ptr, kv_start_idx=chunk_start_idx_ptr)
    return chunk_kv_indices_ptr


def _create_flashmla_kv_indices(req_to_token_ptr, req_pool_indices_ptr, page_kernel_lens_ptr, kv_start_idx,
                                kv_indices_ptr, req_to_token_ptr_stride, kv_indices_ptr_stride, PAGED_SIZE=64):
    """Paged block table (FlashMLA, CUTLASS MLA, TRT-LLM MLA, Aiter MLA).

    ``kv_indices_ptr[b, p] = req_to_token_ptr[req_pool_indices_ptr[b], kv_start_idx[b] + p * PAGED_SIZE]
    // PAGED_SIZE`` for the ``ceil(page_kernel_lens_ptr[b] / PAGED_SIZE)`` pages of request
    ``b < B = req_pool_indices_ptr.shape[0]``, at most the buffer's width (``kv_start_idx`` None: 0), the
    division rounding toward zero.
    Columns past a row's pages and rows ``>= B`` are left untouched.

    ``kv_indices_ptr``: int32 ``[>= B, W]`` (``kv_indices_ptr_stride`` is checked against its row stride)
    or a flat int32 buffer read as rows of ``kv_indices_ptr_stride`` entries. ``req_to_token_ptr_stride``
    is checked against ``req_to_token_ptr.stride(0)``. Returns ``kv_indices_ptr``.
    """
    _check_stride("req_to_token_ptr_stride", req_to_token_ptr_stride, req_to_token_ptr.stride(0))
    _build_page_table(req_to_token_ptr, req_pool_indices_ptr, page_kernel_lens_ptr,
                      _as_rows(kv_indices_ptr, kv_indices_ptr_stride), page_size=int(PAGED_SIZE),
                      kv_start_idx=kv_start_idx, round_toward_zero=True)
    return kv_indices_ptr


create_flashinfer_kv_indices_triton = _LaunchSyntax(_create_flashinfer_kv_indices,
                                                    "create_flashinfer_kv_indices_triton")
create_chunked_prefix_cache_kv_indices = _LaunchSyntax(_create_chunked_prefix_cache_kv_indices,
                                                       "create_chunked_prefix_cache_kv_indices")
create_flashmla_kv_indices_triton = _LaunchSyntax(_create_flashmla_kv_indices, "create_flashmla_kv_indices_triton")


def update_trtllm_mla_graph_metadata(*, req_pool_indices, seq_lens, req_to_token, block_kv_indices, bs,
                                     seqlen_offset, page_size, seq_lens_k=None):
    """The TRT-LLM MLA backend's CUDA-graph metadata update, in one launch (SGLang's fused kernel).

    For request ``i < bs``: ``seq_lens_k[i] = int32(seq_lens[i] + seqlen_offset)`` when ``seq_lens_k`` is
    given, and ``block_kv_indices[i, p] = req_to_token[req_pool_indices[i], p * page_size] // page_size``
    (rounding toward zero) for ``p < ceil((seq_lens[i] + seqlen_offset) / page_size)``, at most the table's
    width (SGLang writes a longer row's pages on into the next row). It is
    ``kvdispatch.create_flashmla_kv_indices`` on the first ``bs`` requests (views: nothing is allocated).

    ``req_pool_indices``, ``seq_lens``: int32/int64 ``[>= bs]``; ``block_kv_indices``: int32 ``[>= bs, W]``;
    ``seq_lens_k``: optional int32 ``[>= bs]``; ``seqlen_offset``: int (the draft tokens in target-verify,
    else 0). Rows ``>= bs``, columns past each row's pages and ``seq_lens_k[bs:]`` are left untouched; ``bs``
    0 writes nothing. Returns None.
    """
    if bs == 0:
        return None
    _build_page_table(req_to_token, req_pool_indices[:bs], seq_lens[:bs], block_kv_indices, page_size=int(page_size),
                      seqlen_offset=int(seqlen_offset), seq_lens_out=None if seq_lens_k is None else seq_lens_k[:bs],
                      round_toward_zero=True)
    return None

__all__ = [
    "KV_INDICES_TOKEN_BLOCKS_MIN_WIDTH",
    "create_chunked_prefix_cache_kv_indices",
    "create_flashinfer_kv_indices_triton",
    "create_flashmla_kv_indices_triton",
    "get_num_kv_index_blocks_flashmla",
    "get_num_page_per_block_flashmla",
    "kv_indices_num_token_blocks",
    "kv_indices_token_blocks_for_copy",
    "update_trtllm_mla_graph_metadata",
]
