"""A drop-in for SGLang 0.5.23's ``sglang.kernels.ops.attention.kv_indices``: the FlashInfer token CSR, the chunked
prefix CSR and the FlashMLA block table builders, and the grid helpers engines size their launches with.

The builders are called with Triton's launch syntax ``builder[grid](...)`` or directly; the grid is checked and
ignored, because kvdispatch sizes its own launch. The batch is ``req_pool_indices_ptr.shape[0]``: SGLang's call
sites launch one program per entry. The block-size constant of SGLang's own page-table kernel is not mirrored:
``get_num_page_per_block_flashmla`` gives its value per page size.
"""

from __future__ import annotations

from kvdispatch._validate import check_flag
from kvdispatch.compat.sglang import _common
from kvdispatch.compat.sglang._common import (_EXTENT_MAX, _Launch, _as_rows, _cdiv, _check_int, _check_optional_int,
                                              _check_stride)
from kvdispatch.grid import MAX_PAGE_SIZE

__all__ = ["SPEC_KV_INDEX_BLOCKS_MIN_CONTEXT", "create_chunked_prefix_cache_kv_indices",
           "create_flashinfer_kv_indices_triton", "create_flashmla_kv_indices_triton",
           "get_num_kv_index_blocks_flashmla", "get_num_page_per_block_flashmla", "kv_indices_num_token_blocks",
           "spec_kv_index_token_blocks"]

# SGLang's page-table kernel gives each program 4096 tokens' worth of pages.
_TOKENS_PER_PAGE_PROGRAM = 4096
# Token-block sizing of SGLang's token-CSR launches: about 8192 tokens per program, about 512 programs.
_TOKENS_PER_TOKEN_BLOCK = 8192
_TOKEN_BLOCK_PROGRAMS = 512
# Below this context, SGLang's speculative-decode index launches use one token block per program.
SPEC_KV_INDEX_BLOCKS_MIN_CONTEXT = 32768


def get_num_page_per_block_flashmla(page_size: int = 64) -> int:
    """Pages per program of SGLang's page-table kernel: ``4096 // page_size`` (``page_size``: an int in
    ``[1, 4096]``)."""
    _check_int("page_size", page_size, 1, MAX_PAGE_SIZE)
    return _TOKENS_PER_PAGE_PROGRAM // page_size


def get_num_kv_index_blocks_flashmla(kv_indices_width: int, page_size: int) -> int:
    """Programs per row SGLang launches for a block table ``kv_indices_width`` pages wide:
    ``ceil(kv_indices_width / get_num_page_per_block_flashmla(page_size))``."""
    _check_int("kv_indices_width", kv_indices_width, 0, _EXTENT_MAX)
    return _cdiv(kv_indices_width, get_num_page_per_block_flashmla(page_size))


def kv_indices_num_token_blocks(table_width: int, base_programs: int) -> int:
    """Token blocks per request for SGLang's token-block launches:
    ``max(1, min(ceil(table_width / 8192), 512 // max(1, base_programs)))`` (both ints ``>= 0``)."""
    _check_int("table_width", table_width, 0, _EXTENT_MAX)
    _check_int("base_programs", base_programs, 0, _EXTENT_MAX)
    return max(1, min(_cdiv(table_width, _TOKENS_PER_TOKEN_BLOCK), _TOKEN_BLOCK_PROGRAMS // max(1, base_programs)))


def spec_kv_index_token_blocks(table_width, kv_lens_sum, batch_size, base_programs=None, length_cap=None,
                               context_len=None):
    """Token blocks per base program for a speculative-decode KV-index launch (SGLang's rule).

    1 when the context gate (``context_len``, ``table_width`` when None) is below
    ``SPEC_KV_INDEX_BLOCKS_MIN_CONTEXT`` or ``batch_size`` is 0; else ``kv_indices_num_token_blocks(width,
    programs)`` with ``width = min(kv_lens_sum, table_width, length_cap)`` (``table_width`` alone when
    ``kv_lens_sum`` is None; ``length_cap`` only with ``kv_lens_sum``) and ``programs = base_programs``
    (``batch_size`` when None). Every argument is an int ``>= 0`` (the optional ones: or None).
    """
    _check_int("table_width", table_width, 0, _EXTENT_MAX)
    _check_optional_int("kv_lens_sum", kv_lens_sum, 0, _EXTENT_MAX)
    _check_int("batch_size", batch_size, 0, _EXTENT_MAX)
    for name, value in (("base_programs", base_programs), ("length_cap", length_cap), ("context_len", context_len)):
        _check_optional_int(name, value, 0, _EXTENT_MAX)
    gate = table_width if context_len is None else context_len
    if gate < SPEC_KV_INDEX_BLOCKS_MIN_CONTEXT or batch_size == 0:
        return 1
    width = table_width
    if kv_lens_sum is not None:
        width = min(kv_lens_sum, table_width)
        if length_cap is not None:
            width = min(width, length_cap)
    return kv_indices_num_token_blocks(width, batch_size if base_programs is None else base_programs)


def _create_flashinfer_kv_indices(launch_grid, req_to_token_ptr, req_pool_indices_ptr, page_kernel_lens_ptr,
                                  kv_indptr, kv_start_idx, kv_indices_ptr, req_to_token_ptr_stride, ENTRY_PAGE_SIZE=1,
                                  TOKEN_BLOCK_PARALLEL=False, token_mapping=None):
    """Token-level CSR indices (FlashInfer, Triton and Aiter attention, EAGLE verify / draft extend).

    ``kv_indices_ptr[kv_indptr[b] + j] = req_to_token_ptr[req_pool_indices_ptr[b], kv_start_idx[b] + j]``
    for ``j < page_kernel_lens_ptr[b]`` (``kv_start_idx`` None: 0). Only ``kv_indptr[b]`` is read, for
    ``b < B = req_pool_indices_ptr.shape[0]``; every other position of ``kv_indices_ptr`` is left untouched.

    With ``ENTRY_PAGE_SIZE = E > 1`` the table holds one entry per ``E`` tokens and token ``q`` is
    ``req_to_token_ptr[row, q // E] * E + q % E``; with ``token_mapping`` every non-negative id ``v``
    becomes ``token_mapping[v]`` (negative ids give -1). These two are forwarded to the public API's
    ``entry_page_size=`` / ``token_mapping=`` keywords. ``TOKEN_BLOCK_PARALLEL`` (a bool) changes nothing.

    Shapes and dtypes as ``kvdispatch.create_flashinfer_kv_indices``; ``req_to_token_ptr_stride`` is checked
    against ``req_to_token_ptr.stride(0)``. Returns ``kv_indices_ptr``.
    """
    _check_stride("req_to_token_ptr_stride", req_to_token_ptr_stride, req_to_token_ptr, "req_to_token_ptr")
    _check_int("ENTRY_PAGE_SIZE", ENTRY_PAGE_SIZE, 1, MAX_PAGE_SIZE)
    check_flag("TOKEN_BLOCK_PARALLEL", TOKEN_BLOCK_PARALLEL)
    if ENTRY_PAGE_SIZE != 1 or token_mapping is not None:
        _common._build_token_csr(req_to_token_ptr, req_pool_indices_ptr, page_kernel_lens_ptr, kv_indptr,
                                 kv_indices_ptr, kv_start_idx=kv_start_idx, entry_page_size=ENTRY_PAGE_SIZE,
                                 token_mapping=token_mapping)
    else:
        _common._build_token_csr(req_to_token_ptr, req_pool_indices_ptr, page_kernel_lens_ptr, kv_indptr,
                                 kv_indices_ptr, kv_start_idx=kv_start_idx)
    return kv_indices_ptr


def _create_chunked_prefix_cache_kv_indices(launch_grid, req_to_token_ptr, req_pool_indices_ptr, chunk_start_idx_ptr,
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
    _check_stride("req_to_token_ptr_stride", req_to_token_ptr_stride, req_to_token_ptr, "req_to_token_ptr")
    _common._build_token_csr(req_to_token_ptr, req_pool_indices_ptr, chunk_seq_lens_ptr, chunk_cu_seq_lens_ptr,
                             chunk_kv_indices_ptr, kv_start_idx=chunk_start_idx_ptr)
    return chunk_kv_indices_ptr


def _create_flashmla_kv_indices(launch_grid, req_to_token_ptr, req_pool_indices_ptr, page_kernel_lens_ptr,
                                kv_start_idx, kv_indices_ptr, req_to_token_ptr_stride, kv_indices_ptr_stride,
                                PAGED_SIZE=64):
    """Paged block table (FlashMLA, CUTLASS MLA, TRT-LLM MLA, Aiter MLA).

    ``kv_indices_ptr[b, p] = req_to_token_ptr[req_pool_indices_ptr[b], kv_start_idx[b] + p * PAGED_SIZE]
    // PAGED_SIZE`` for the ``ceil(page_kernel_lens_ptr[b] / PAGED_SIZE)`` pages of request
    ``b < B = req_pool_indices_ptr.shape[0]``, at most the buffer's width (``kv_start_idx`` None: 0), the
    division rounding toward zero.
    Columns past a row's pages and rows ``>= B`` are left untouched.

    ``kv_indices_ptr``: int32 ``[>= B, W]`` (``kv_indices_ptr_stride`` is checked against its row stride)
    or a flat contiguous int32 buffer read as rows of ``kv_indices_ptr_stride`` entries (``_as_rows``).
    ``req_to_token_ptr_stride`` is checked against ``req_to_token_ptr.stride(0)``; ``PAGED_SIZE``: an int in
    ``[1, 4096]``. Returns ``kv_indices_ptr``.
    """
    _check_stride("req_to_token_ptr_stride", req_to_token_ptr_stride, req_to_token_ptr, "req_to_token_ptr")
    _check_int("PAGED_SIZE", PAGED_SIZE, 1, MAX_PAGE_SIZE)
    table = _as_rows(kv_indices_ptr, kv_indices_ptr_stride, "kv_indices_ptr", "kv_indices_ptr_stride")
    _common._build_page_table(req_to_token_ptr, req_pool_indices_ptr, page_kernel_lens_ptr, table,
                              page_size=PAGED_SIZE, kv_start_idx=kv_start_idx, round_toward_zero=True)
    return kv_indices_ptr


create_flashinfer_kv_indices_triton = _Launch(_create_flashinfer_kv_indices, "create_flashinfer_kv_indices_triton")
create_chunked_prefix_cache_kv_indices = _Launch(_create_chunked_prefix_cache_kv_indices,
                                                 "create_chunked_prefix_cache_kv_indices")
create_flashmla_kv_indices_triton = _Launch(_create_flashmla_kv_indices, "create_flashmla_kv_indices_triton")
