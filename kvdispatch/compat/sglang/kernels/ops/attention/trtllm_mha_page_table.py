"""A drop-in for SGLang 0.5.23's ``sglang.kernels.ops.attention.trtllm_mha_page_table``: the TRT-LLM MHA page
table with its SWA twin (also launched by the hpc and FlashAttention backends), forwarding to
``kvdispatch.create_trtllm_mha_page_table``. SGLang's asserts are ValueErrors here.
"""

from __future__ import annotations

from kvdispatch._validate import _int32_tensor, _tensor, check_flag
from kvdispatch.compat.sglang import _common
from kvdispatch.compat.sglang._common import _EXTENT_MAX, _Launch, _as_rows, _cdiv, _check_int, _check_stride, _leading
from kvdispatch.compat.sglang.kernels.ops.attention.kv_indices import (_TOKENS_PER_PAGE_PROGRAM,
                                                                       get_num_page_per_block_flashmla)
from kvdispatch.grid import MAX_PAGE_SIZE

__all__ = ["build_trtllm_mha_page_table", "create_trtllm_mha_kv_indices_triton", "get_num_mha_kv_index_blocks"]


def get_num_mha_kv_index_blocks(num_pages: int, page_size: int) -> int:
    """Programs per row SGLang launches for a TRT-LLM MHA page table ``num_pages`` pages wide:
    ``ceil(num_pages / (4096 // page_size))``."""
    _check_int("num_pages", num_pages, 0, _EXTENT_MAX)
    return _cdiv(num_pages, get_num_page_per_block_flashmla(page_size))


def _check_mha_page_size(name, page_size):
    """``page_size`` (the argument ``name``): an int dividing 4096, which SGLang asserts in
    build_trtllm_mha_page_table (its kernel skips pages of longer rows otherwise)."""
    _check_int(name, page_size, 1, MAX_PAGE_SIZE)
    if _TOKENS_PER_PAGE_PROGRAM % page_size:
        raise ValueError(f"{name} must divide {_TOKENS_PER_PAGE_PROGRAM} for the TRT-LLM MHA page table, "
                         f"got {page_size}")


def _create_trtllm_mha_kv_indices(launch_grid, req_to_token_ptr, req_pool_indices_ptr, seq_lens_ptr, full_to_swa_ptr,
                                  page_table_ptr, swa_page_table_ptr, full_to_swa_numel, req_to_token_stride,
                                  page_table_stride, PAGE_SIZE, HAS_SWA):
    """The TRT-LLM MHA page table (and, with ``HAS_SWA``, its SWA twin) for the first ``grid[0]`` requests.

    ``page_table_ptr[r, p] = req_to_token_ptr[req_pool_indices_ptr[r], p * PAGE_SIZE] // PAGE_SIZE``
    (rounding toward zero) for the ``ceil(seq_lens_ptr[r] / PAGE_SIZE)`` pages of row ``r < grid[0]``, at most
    the table's width (SGLang writes a longer row's pages on into the next row); with ``HAS_SWA``
    ``swa_page_table_ptr[r, p] = full_to_swa_ptr[clamp(slot, 0, full_to_swa_numel - 1)] // PAGE_SIZE``.
    Everything else is left untouched. Launched only as ``[grid](...)``, as SGLang's kernel is.

    Tables: int32 ``[>= grid[0], W]`` with row stride ``page_table_stride`` (both tables; checked), or flat
    contiguous buffers read as rows of it (``_as_rows``). ``full_to_swa_numel`` reads the first that many entries
    of ``full_to_swa_ptr`` (more than it holds is a ValueError). ``PAGE_SIZE`` must divide 4096 (SGLang's kernel
    skips pages of longer rows otherwise). Without ``HAS_SWA`` the SWA arguments are not read. Returns None.
    """
    if launch_grid is None:
        raise TypeError("create_trtllm_mha_kv_indices_triton is launched as "
                        "create_trtllm_mha_kv_indices_triton[grid](...), its rows being grid[0]")
    _check_stride("req_to_token_stride", req_to_token_stride, req_to_token_ptr, "req_to_token_ptr")
    _check_mha_page_size("PAGE_SIZE", PAGE_SIZE)
    check_flag("HAS_SWA", HAS_SWA)
    page_table = _as_rows(page_table_ptr, page_table_stride, "page_table_ptr", "page_table_stride")
    swa_page_table = full_to_swa = None
    if HAS_SWA:
        if full_to_swa_ptr is None or swa_page_table_ptr is None:
            raise ValueError("HAS_SWA needs full_to_swa_ptr and swa_page_table_ptr")
        swa_page_table = _as_rows(swa_page_table_ptr, page_table_stride, "swa_page_table_ptr", "page_table_stride")
        _tensor("full_to_swa_ptr", full_to_swa_ptr)
        _check_int("full_to_swa_numel", full_to_swa_numel, 0, full_to_swa_ptr.numel())
        full_to_swa = full_to_swa_ptr[:full_to_swa_numel]
    rows = launch_grid[0]
    pool = _leading("req_pool_indices_ptr", req_pool_indices_ptr, rows)
    lens = _leading("seq_lens_ptr", seq_lens_ptr, rows)
    if rows == 0:
        return None
    _common._build_mha_page_table(req_to_token_ptr, pool, lens, page_table, page_size=PAGE_SIZE,
                                  swa_page_table=swa_page_table, full_to_swa=full_to_swa, round_toward_zero=True)
    return None


create_trtllm_mha_kv_indices_triton = _Launch(_create_trtllm_mha_kv_indices, "create_trtllm_mha_kv_indices_triton")


def build_trtllm_mha_page_table(req_to_token, req_pool_indices, cache_seqlens, page_table, page_size,
                                swa_page_table=None, full_to_swa=None):
    """The TRT-LLM MHA backend's page-table build: ``create_trtllm_mha_kv_indices_triton`` on one row per row
    of ``page_table`` (``req_pool_indices`` and ``cache_seqlens`` need at least that many entries), with the
    SWA table when ``swa_page_table`` and ``full_to_swa`` (all of it) are given. SGLang's asserts are
    ValueErrors: the two SWA arguments given together, ``page_size`` dividing 4096; both tables must share
    their row stride (SGLang addresses the SWA table with the page table's). Returns None."""
    if (swa_page_table is None) != (full_to_swa is None):
        raise ValueError("swa_page_table and full_to_swa must be given together")
    _check_mha_page_size("page_size", page_size)
    _tensor("req_to_token", req_to_token)
    _int32_tensor("page_table", page_table, 2)
    rows, num_pages = page_table.shape
    if swa_page_table is not None:
        _tensor("full_to_swa", full_to_swa)
        _tensor("swa_page_table", swa_page_table)
        if swa_page_table.dim() == 2 and swa_page_table.stride(0) != page_table.stride(0):
            raise ValueError(f"swa_page_table's row stride {swa_page_table.stride(0)} differs from page_table's "
                             f"{page_table.stride(0)}: SGLang addresses both with page_table's")
    grid = (rows, get_num_mha_kv_index_blocks(num_pages, page_size))
    create_trtllm_mha_kv_indices_triton[grid](
        req_to_token, req_pool_indices, cache_seqlens, full_to_swa, page_table, swa_page_table,
        full_to_swa.numel() if full_to_swa is not None else 0, req_to_token.stride(0), page_table.stride(0),
        page_size, full_to_swa is not None)
