"""A drop-in for SGLang 0.5.23's ``sglang.kernels.ops.attention.dcp_kernels``: one decode-context-parallel
rank's token CSR and MLA block table, forwarding to ``kvdispatch.create_dcp_kv_indices`` and
``kvdispatch.create_dcp_page_table``. Unlike the ``kv_indices`` builders they take the batch from the grid
(``grid[0]``, as SGLang's kernels do; the block table also its covered width, ``grid[1] * PAGES_PER_BLOCK``).

SGLang's ``dcp_kernels.create_dcp_kv_indices`` (a CSR over the all-gathered prefix+extend buffer) is a different
builder from kvdispatch's public ``create_dcp_kv_indices``: its drop-in here, under SGLang's name, forwards to
``kvdispatch.create_prefix_extend_kv_indices``. ``compact_dcp_verify_token_table_to_ragged`` and
``update_kv_lens_and_indices`` forward to ``kvdispatch.create_compact_kv_indices``.
"""

from __future__ import annotations

from kvdispatch._validate import _INT32_MAX, _int32_tensor, _tensor, check_flag
from kvdispatch.compat.sglang import _common
from kvdispatch.compat.sglang._common import _Launch, _as_rows, _check_int, _check_stride, _leading
from kvdispatch.grid import MAX_DCP_SIZE, MAX_PAGE_SIZE

__all__ = ["create_mla_kv_page_table_for_dcp", "create_triton_kv_indices_for_dcp_triton"]


def _create_triton_kv_indices_for_dcp(launch_grid, req_to_token_ptr, req_pool_indices_ptr, dcp_kernel_lens_ptr,
                                      kv_indptr, kv_start_idx, kv_indices_ptr, req_to_token_ptr_stride, dcp_size,
                                      dcp_rank):
    """One decode-context-parallel rank's token-level CSR indices (Triton and FlashInfer attention under DCP).

    For request ``b < B`` (``B = grid[0]``, or ``req_pool_indices_ptr.shape[0]`` called directly), with
    ``first_b`` the first position ``>= kv_start_idx[b]`` (0 when None) congruent to ``dcp_rank`` mod
    ``dcp_size``: ``kv_indices_ptr[kv_indptr[b] + j] = req_to_token_ptr[req_pool_indices_ptr[b], first_b + j *
    dcp_size] / dcp_size`` (rounding toward zero) for ``j < dcp_kernel_lens_ptr[b]`` (``get_dcp_lens``'s count).
    Only ``kv_indptr[:B]`` is read; every other position of ``kv_indices_ptr`` is left untouched. Forwards to
    ``kvdispatch.create_dcp_kv_indices`` (a row ends at the table's last column; nothing is written outside
    ``kv_indices_ptr``). ``req_to_token_ptr_stride`` is checked against ``req_to_token_ptr.stride(0)``.
    Returns ``kv_indices_ptr``.
    """
    _check_stride("req_to_token_ptr_stride", req_to_token_ptr_stride, req_to_token_ptr, "req_to_token_ptr")
    if launch_grid:
        batch = launch_grid[0]
        req_pool_indices_ptr = _leading("req_pool_indices_ptr", req_pool_indices_ptr, batch)
        dcp_kernel_lens_ptr = _leading("dcp_kernel_lens_ptr", dcp_kernel_lens_ptr, batch)
        if kv_start_idx is not None:
            kv_start_idx = _leading("kv_start_idx", kv_start_idx, batch)
    _common._build_dcp_token_csr(req_to_token_ptr, req_pool_indices_ptr, dcp_kernel_lens_ptr, kv_indptr,
                                 kv_indices_ptr, dcp_size=dcp_size, dcp_rank=dcp_rank, kv_start_idx=kv_start_idx,
                                 round_toward_zero=True)
    return kv_indices_ptr


def _create_mla_kv_page_table_for_dcp(launch_grid, req_to_token_ptr, req_pool_indices_ptr, local_seq_lens_ptr,
                                      block_kv_indices_ptr, v2p_ptr, req_to_token_stride, block_table_stride,
                                      PHYSICAL_PAGE_SIZE, DCP_SIZE, DCP_RANK, PAGES_PER_BLOCK, HAS_V2P):
    """One decode-context-parallel rank's MLA block table (TRT-LLM MLA / Tokenspeed, Aiter under DCP).

    With ``V = PHYSICAL_PAGE_SIZE * DCP_SIZE``: ``block_kv_indices_ptr[r, p] = req_to_token_ptr[
    req_pool_indices_ptr[r], DCP_RANK + p * V] / V`` (rounding toward zero) for the
    ``ceil(local_seq_lens_ptr[r] / PHYSICAL_PAGE_SIZE)`` pages of row ``r < grid[0]`` that the grid covers
    (``p < grid[1] * PAGES_PER_BLOCK``), at most the row's width (SGLang writes the pages past it into the
    next row). Called directly: every row of the batch ``req_pool_indices_ptr.shape[0]``, every page of the
    width. Everything else is left untouched. Forwards to ``kvdispatch.create_dcp_page_table``.

    Rows are ``block_table_stride`` entries apart, as given: ``block_kv_indices_ptr`` is an int32 ``[rows, W]``
    tensor whose row stride is ``block_table_stride`` (rows of ``W`` entries), or a contiguous int32 buffer of
    any shape read as its elements in rows of ``block_table_stride`` entries (Aiter's verify table passes
    ``q_len * num_cols`` for a ``[bs * q_len, num_cols]`` buffer: request ``r``'s row is row ``r * q_len`` of it
    and the ``q_len - 1`` rows after). The buffer must hold every row the grid launches (a ValueError
    otherwise). ``req_to_token_stride`` is checked against ``req_to_token_ptr.stride(0)``.
    ``PHYSICAL_PAGE_SIZE``: an int in ``[1, 4096]``; ``DCP_SIZE`` in ``[1, 1024]``; ``DCP_RANK`` in ``[0,
    DCP_SIZE)``; ``PAGES_PER_BLOCK`` an int ``>= 1``; ``HAS_V2P`` a bool. ``HAS_V2P=True`` (the unified pool):
    each page ``q`` (0 for a negative slot) is written as ``max(v2p_ptr[q], 0)``, 0 (the padding page) for a page
    past ``v2p_ptr`` (an int32/int64 contiguous vector); without it ``v2p_ptr`` is not read.
    Returns ``block_kv_indices_ptr``.
    """
    _check_stride("req_to_token_stride", req_to_token_stride, req_to_token_ptr, "req_to_token_ptr")
    _check_int("PHYSICAL_PAGE_SIZE", PHYSICAL_PAGE_SIZE, 1, MAX_PAGE_SIZE)
    _check_int("DCP_SIZE", DCP_SIZE, 1, MAX_DCP_SIZE)
    _check_int("DCP_RANK", DCP_RANK, 0, DCP_SIZE - 1)
    _check_int("PAGES_PER_BLOCK", PAGES_PER_BLOCK, 1, _INT32_MAX)
    check_flag("HAS_V2P", HAS_V2P)
    table = _as_rows(block_kv_indices_ptr, block_table_stride, "block_kv_indices_ptr", "block_table_stride",
                     any_stride=True)
    _int32_tensor("block_kv_indices_ptr", table, 2)
    if HAS_V2P:
        _tensor("v2p_ptr", v2p_ptr)
    rows, width = table.shape
    if launch_grid:
        if launch_grid[0] > rows:
            raise ValueError(f"block_kv_indices_ptr holds {rows} rows of block_table_stride={block_table_stride} "
                             f"entries, the grid launches {launch_grid[0]} (grid[0])")
        rows = launch_grid[0]
        width = min(width, launch_grid[1] * PAGES_PER_BLOCK)
    else:
        _tensor("req_pool_indices_ptr", req_pool_indices_ptr)
        rows = req_pool_indices_ptr.shape[0] if req_pool_indices_ptr.dim() == 1 else 0  # the public call names it
    if (rows, width) != table.shape:
        table = table[:rows, :width]
    _common._build_dcp_page_table(req_to_token_ptr, _leading("req_pool_indices_ptr", req_pool_indices_ptr, rows),
                                  _leading("local_seq_lens_ptr", local_seq_lens_ptr, rows), table,
                                  page_size=PHYSICAL_PAGE_SIZE, dcp_size=DCP_SIZE, dcp_rank=DCP_RANK,
                                  round_toward_zero=True, v2p=v2p_ptr if HAS_V2P else None)
    return block_kv_indices_ptr


create_triton_kv_indices_for_dcp_triton = _Launch(_create_triton_kv_indices_for_dcp,
                                                  "create_triton_kv_indices_for_dcp_triton")
create_mla_kv_page_table_for_dcp = _Launch(_create_mla_kv_page_table_for_dcp, "create_mla_kv_page_table_for_dcp")


def _compact_dcp_verify_token_table_to_ragged(launch_grid, token_table_ptr, local_kv_lens_ptr, kv_indptr_ptr,
                                              kv_indices_ptr, table_stride, Q_LEN, BLOCK_SIZE):
    """Aiter's DCP verify shard as ragged ids: row 0 of each request's ``Q_LEN`` rows of the token table.

    For request ``b < B`` (``B = grid[0]``, or ``local_kv_lens_ptr.shape[0]`` called directly):
    ``kv_indices_ptr[kv_indptr_ptr[b] + j] = token_table_ptr[b * Q_LEN, j]`` for ``j < local_kv_lens_ptr[b]``;
    a request with ``local_kv_lens_ptr[b] == 0`` gets one 0 at ``kv_indptr_ptr[b]`` (a placeholder the caller
    removes later). ``token_table_ptr``: an int32 ``[rows, table_stride]`` table (or a flat buffer read as rows of
    ``table_stride``); a shard longer than a row ends at the row's end (SGLang asserts, then reads the next row).
    ``Q_LEN`` and ``BLOCK_SIZE``: ints ``>= 1`` (``BLOCK_SIZE`` sizes SGLang's loop, not the result). Everything
    else is left untouched. Forwards to ``kvdispatch.create_compact_kv_indices``. Returns ``kv_indices_ptr``.
    """
    _check_int("Q_LEN", Q_LEN, 1, _INT32_MAX)
    _check_int("BLOCK_SIZE", BLOCK_SIZE, 1, _INT32_MAX)
    table = _as_rows(token_table_ptr, table_stride, "token_table_ptr", "table_stride")
    _tensor("local_kv_lens_ptr", local_kv_lens_ptr)
    if launch_grid:
        local_kv_lens_ptr = _leading("local_kv_lens_ptr", local_kv_lens_ptr, launch_grid[0])
    _common._build_compact_csr(table, local_kv_lens_ptr, kv_indptr_ptr, kv_indices_ptr, row_step=Q_LEN, empty_fill=0)
    return kv_indices_ptr


def _update_kv_lens_and_indices(launch_grid, kv_lens, kv_lens_cumsum, kv_indices, local_kv_lens, local_kv_lens_cumsum,
                                local_kv_indices, dcp_rank, dcp_world_size, BLOCK_SIZE):
    """One DCP rank's share of a token CSR, compacted: for request ``b < B`` (``B = grid[0]``, or
    ``local_kv_lens.shape[0]`` called directly), ``local_kv_indices[local_kv_lens_cumsum[b] + j] =
    kv_indices[kv_lens_cumsum[b] + dcp_rank + j * dcp_world_size]`` for ``j < local_kv_lens[b]`` (at most
    ``grid[1] * BLOCK_SIZE``, the entries SGLang's grid covers), the ids unchanged (still widened).
    ``kv_lens`` is not read (nor by SGLang's kernel). ``kv_indices``: int32, 1-D, contiguous; a shard running
    past its end ends there. ``dcp_world_size``: an int in ``[1, 1024]``, ``dcp_rank`` in ``[0,
    dcp_world_size)``, ``BLOCK_SIZE`` an int ``>= 1``. Everything else is left untouched. Forwards to
    ``kvdispatch.create_compact_kv_indices``. Returns ``local_kv_indices``.
    """
    _check_int("dcp_world_size", dcp_world_size, 1, MAX_DCP_SIZE)
    _check_int("dcp_rank", dcp_rank, 0, dcp_world_size - 1)
    _check_int("BLOCK_SIZE", BLOCK_SIZE, 1, _INT32_MAX)
    _tensor("kv_lens", kv_lens)
    _int32_tensor("kv_indices", kv_indices, 1)
    _tensor("local_kv_lens", local_kv_lens)
    max_count = None
    if launch_grid:
        local_kv_lens = _leading("local_kv_lens", local_kv_lens, launch_grid[0])
        max_count = launch_grid[1] * BLOCK_SIZE
    _common._build_compact_csr(kv_indices[None], local_kv_lens, local_kv_lens_cumsum, local_kv_indices, row_step=0,
                               source_indptr=kv_lens_cumsum, offset=dcp_rank, step=dcp_world_size,
                               max_count=max_count)
    return local_kv_indices


compact_dcp_verify_token_table_to_ragged = _Launch(_compact_dcp_verify_token_table_to_ragged,
                                                   "compact_dcp_verify_token_table_to_ragged")
update_kv_lens_and_indices = _Launch(_update_kv_lens_and_indices, "update_kv_lens_and_indices")
__all__ += ["compact_dcp_verify_token_table_to_ragged", "update_kv_lens_and_indices"]


def _create_dcp_kv_indices(launch_grid, kv_indptr, extend_lens_ptr, extend_cu_lens_ptr, extend_prefix_lens_ptr,
                           extend_cu_prefix_lens_ptr, kv_indices_ptr, extend_prefix_lens_sum, dcp_world_size):
    """The token CSR over the DCP prefill's all-gathered KV buffer (every request's prefix, then every request's
    extend): for request ``b < B`` (``B = grid[0]``, or ``extend_lens_ptr.shape[0]`` called directly), with ``P_b
    = extend_prefix_lens_ptr[b]``: ``kv_indices_ptr[kv_indptr[b] + j] = extend_cu_prefix_lens_ptr[b] + j`` for ``j
    < P_b``, then ``kv_indices_ptr[kv_indptr[b] + P_b + j] = extend_prefix_lens_sum + extend_cu_lens_ptr[b] + j``
    for ``j < extend_lens_ptr[b]`` (the low 32 bits into an int32 ``kv_indices_ptr``, as SGLang's int32 sums
    wrap). ``extend_prefix_lens_sum``: an int; ``dcp_world_size``: an int in ``[1, 1024]``, not read (nor by
    SGLang's kernel). Only ``kv_indptr[:B]`` is read; everything else is left untouched, nothing is written
    outside ``kv_indices_ptr``. Forwards to ``kvdispatch.create_prefix_extend_kv_indices``. Returns
    ``kv_indices_ptr``.
    """
    _check_int("dcp_world_size", dcp_world_size, 1, MAX_DCP_SIZE)
    _check_int("extend_prefix_lens_sum", extend_prefix_lens_sum, -(2**63), 2**63 - 1)
    vectors = (("extend_prefix_lens_ptr", extend_prefix_lens_ptr), ("extend_cu_prefix_lens_ptr",
                                                                    extend_cu_prefix_lens_ptr),
               ("extend_lens_ptr", extend_lens_ptr), ("extend_cu_lens_ptr", extend_cu_lens_ptr))
    _tensor("extend_lens_ptr", extend_lens_ptr)
    rows = launch_grid[0] if launch_grid else (extend_lens_ptr.shape[0] if extend_lens_ptr.dim() == 1 else 0)
    _common._build_prefix_extend_csr(*(_leading(name, t, rows) for name, t in vectors), kv_indptr, kv_indices_ptr,
                                     extend_base=extend_prefix_lens_sum)
    return kv_indices_ptr


create_dcp_kv_indices = _Launch(_create_dcp_kv_indices, "create_dcp_kv_indices")
__all__ += ["create_dcp_kv_indices"]
