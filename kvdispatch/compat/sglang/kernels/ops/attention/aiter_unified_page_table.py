"""A drop-in for SGLang 0.5.23's ``sglang.kernels.ops.attention.aiter_unified_page_table``: the Aiter backend's
block tables for its unified attention (target-verify, extend, and from a speculative step's ragged token CSR),
each with its sliding-window twin. ``scatter_req_to_token_to_page_table_kernel`` forwards to
``kvdispatch.create_trtllm_mha_page_table`` (``seqlen_offset``: the draft tokens),
``scatter_ragged_to_page_table_kernel`` to ``kvdispatch.create_ragged_page_table``. SGLang's asserts are
ValueErrors here.
"""

from __future__ import annotations

from kvdispatch._validate import _INT32_MAX, _tensor, check_flag
from kvdispatch.compat.sglang import _common
from kvdispatch.compat.sglang._common import _Launch, _as_rows, _check_int, _check_stride, _leading
from kvdispatch.grid import MAX_PAGE_SIZE

__all__ = ["scatter_ragged_to_page_table_kernel", "scatter_req_to_token_to_page_table_kernel"]


def _launched_tables(launch_grid, name, tables, swa_slot_mapping_ptr, row_stride, PAGE_SIZE, BLOCK_SIZE, HAS_SWA):
    """The checks both kernels share. ``tables``: ``(argument name, buffer)`` of the table, then of the SWA
    table; ``row_stride``: ``(argument name, value)`` of their row stride. Returns ``(page_table,
    swa_page_table, mapping)``, the tables as rows of that stride cut to the ``grid[1] * BLOCK_SIZE`` pages
    SGLang's programs cover (the SWA pair None without ``HAS_SWA``)."""
    if launch_grid is None:
        raise TypeError(f"{name} is launched as {name}[grid](...), its rows being grid[0]")
    _check_int("PAGE_SIZE", PAGE_SIZE, 1, MAX_PAGE_SIZE)
    _check_int("BLOCK_SIZE", BLOCK_SIZE, 1, _INT32_MAX)
    check_flag("HAS_SWA", HAS_SWA)
    covered = launch_grid[1] * BLOCK_SIZE
    (table_name, page_table_ptr), (_, sw_page_table_ptr) = tables
    stride_name, stride = row_stride
    page_table = _as_rows(page_table_ptr, stride, table_name, stride_name)
    swa_page_table = mapping = None
    if HAS_SWA:
        if sw_page_table_ptr is None or swa_slot_mapping_ptr is None:
            raise ValueError("HAS_SWA needs sw_page_table_ptr and swa_slot_mapping_ptr")
        swa_page_table = _as_rows(sw_page_table_ptr, stride, "sw_page_table_ptr", stride_name)[:, :covered]
        _tensor("swa_slot_mapping_ptr", swa_slot_mapping_ptr)
        mapping = swa_slot_mapping_ptr
    return page_table[:, :covered], swa_page_table, mapping


def _scatter_req_to_token_to_page_table(launch_grid, req_to_token_ptr, req_pool_indices_ptr, seq_lens_ptr,
                                        page_table_ptr, req_to_token_stride, page_table_stride, sw_page_table_ptr,
                                        swa_slot_mapping_ptr, DRAFT_NUM, PAGE_SIZE, BLOCK_SIZE, HAS_SWA):
    """The block table of the first ``grid[0]`` requests' ``seq_lens_ptr[r] + DRAFT_NUM`` tokens.

    ``page_table_ptr[r, p] = req_to_token_ptr[req_pool_indices_ptr[r], p * PAGE_SIZE] // PAGE_SIZE`` (rounding
    toward zero) for the ``ceil((seq_lens_ptr[r] + DRAFT_NUM) / PAGE_SIZE)`` pages of row ``r < grid[0]``, at
    most the table's width and the ``grid[1] * BLOCK_SIZE`` pages the launch covers; with ``HAS_SWA``
    ``sw_page_table_ptr[r, p] = swa_slot_mapping_ptr[slot] // PAGE_SIZE`` (an out-of-range slot reads the
    mapping's first or last entry, where SGLang reads outside it). Everything else is left untouched. Launched
    only as ``[grid](...)``, as SGLang's kernel is.

    Tables: int32 ``[>= grid[0], W]`` with row stride ``page_table_stride`` (both tables; checked), or flat
    contiguous buffers read as rows of it. ``DRAFT_NUM``: int in ``[0, 2**31)``. Without ``HAS_SWA`` the SWA
    arguments are not read. Returns None.
    """
    name = "scatter_req_to_token_to_page_table_kernel"
    page_table, swa_page_table, mapping = _launched_tables(
        launch_grid, name, (("page_table_ptr", page_table_ptr), ("sw_page_table_ptr", sw_page_table_ptr)),
        swa_slot_mapping_ptr, ("page_table_stride", page_table_stride), PAGE_SIZE, BLOCK_SIZE, HAS_SWA)
    _check_stride("req_to_token_stride", req_to_token_stride, req_to_token_ptr, "req_to_token_ptr")
    _check_int("DRAFT_NUM", DRAFT_NUM, 0, _INT32_MAX)
    rows = launch_grid[0]
    pool = _leading("req_pool_indices_ptr", req_pool_indices_ptr, rows)
    lens = _leading("seq_lens_ptr", seq_lens_ptr, rows)
    if rows == 0 or launch_grid[1] == 0:
        return None
    _common._build_mha_page_table(req_to_token_ptr, pool, lens, page_table, page_size=PAGE_SIZE,
                                  swa_page_table=swa_page_table, full_to_swa=mapping, round_toward_zero=True,
                                  seqlen_offset=DRAFT_NUM)
    return None


scatter_req_to_token_to_page_table_kernel = _Launch(_scatter_req_to_token_to_page_table,
                                                    "scatter_req_to_token_to_page_table_kernel")


def _scatter_ragged_to_page_table(launch_grid, kv_flat_ptr, kv_indptr_ptr, dest_ptr, dest_stride, sw_page_table_ptr,
                                  swa_slot_mapping_ptr, PAGE_SIZE, BLOCK_SIZE, HAS_SWA):
    """The block table of the first ``grid[0]`` rows of a ragged token CSR.

    ``dest_ptr[r, p] = kv_flat_ptr[kv_indptr_ptr[r] + p * PAGE_SIZE] // PAGE_SIZE`` (rounding toward zero) for
    the ``ceil((kv_indptr_ptr[r + 1] - kv_indptr_ptr[r]) / PAGE_SIZE)`` pages of row ``r < grid[0]``, at most the
    table's width and the ``grid[1] * BLOCK_SIZE`` pages the launch covers, and a row ends at the end of
    ``kv_flat_ptr`` (SGLang reads past it); with ``HAS_SWA`` ``sw_page_table_ptr[r, p] =
    swa_slot_mapping_ptr[slot] // PAGE_SIZE`` (an out-of-range slot reads the mapping's first or last entry).
    Everything else is left untouched. Launched only as ``[grid](...)``, as SGLang's kernel is.

    ``kv_flat_ptr``: int32/int64, contiguous; ``kv_indptr_ptr``: at least ``grid[0] + 1`` entries. Tables: int32
    ``[>= grid[0], W]`` with row stride ``dest_stride`` (both tables; checked), or flat contiguous buffers read as
    rows of it. Without ``HAS_SWA`` the SWA arguments are not read. Returns None.
    """
    page_table, swa_page_table, mapping = _launched_tables(
        launch_grid, "scatter_ragged_to_page_table_kernel", (("dest_ptr", dest_ptr),
                                                             ("sw_page_table_ptr", sw_page_table_ptr)),
        swa_slot_mapping_ptr, ("dest_stride", dest_stride), PAGE_SIZE, BLOCK_SIZE, HAS_SWA)
    rows = launch_grid[0]
    bounds = _leading("kv_indptr_ptr", kv_indptr_ptr, rows + 1)
    if rows == 0 or launch_grid[1] == 0:
        return None
    _common._build_ragged_page_table(kv_flat_ptr, bounds, page_table, page_size=PAGE_SIZE,
                                     swa_page_table=swa_page_table, full_to_swa=mapping, round_toward_zero=True)
    return None


scatter_ragged_to_page_table_kernel = _Launch(_scatter_ragged_to_page_table, "scatter_ragged_to_page_table_kernel")
