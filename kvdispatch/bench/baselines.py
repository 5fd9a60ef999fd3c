"""Triton comparison kernels for ``kvdispatch bench`` (not part of the API; valid, full-length data only).

* ``naive_loop``: one program per request, looping over its row ``4096 // page_size`` pages at a time.
* ``grid_2d``: the seed design, written for kvdispatch: a 2-D grid ``(batch, blocks)``, each program
  ``4096 // page_size`` pages, runtime strides, plain masked loads.
* ``csr_loop``: token CSR after SGLang's design, written for kvdispatch: one program per request, looping
  over its tokens ``CSR_BLOCK`` at a time; value ``table[row, q // E] * E + q % E``, then the mapping.
* ``draft_loop``: multi-step draft decode indices after SGLang's design, written for kvdispatch: a grid
  ``(steps, batch, topk)``, each program summing the earlier requests' lengths in one block of
  ``next_power_of_2(batch)`` and copying its prefix ``DRAFT_COPY_BLOCK`` tokens at a time.
* ``touch``: a trivial one-element kernel, the reference for a plain ``kernel[grid](...)`` launch.
* ``dcp_loop``: one decode-context-parallel rank's token CSR after SGLang's design, written for kvdispatch: one
  program per request, looping over its tokens ``CSR_BLOCK`` at a time, reading every ``D``-th position from
  the rank's first (DCP size and rank compile-time), value ``slot // D``.
* ``dcp_grid_2d``: that rank's block table after SGLang's design, written for kvdispatch: a 2-D grid
  ``(batch, blocks)`` of ``4096 // page_size`` pages per program, value ``slot // (page_size * D)``.
* ``mha_grid_2d``: the TRT-LLM MHA page table (with its SWA twin) after SGLang's design: 2-D grid, ``4096 //
  page_size`` pages per program, programs past a row's tokens exit, block masks.
* ``v2p_grid_2d``: the unified pool's translated page table after SGLang's design: a 2-D grid of
  ``V2P_COLUMNS_PER_PROGRAM`` columns per program, or, stricter, of ``grid_2d``'s ``4096 // page_size``.
* Every launcher returns the grid it launched (``kvdispatch bench``'s programs column); the 2-D ones take
  ``pages``, the columns their grid covers (the ideal baselines size it from the longest row).
* ``producer``: a one-program copy into an op's input, optionally triggering programmatic dependent launch: the
  kernel ahead of the op in ``kvdispatch bench --pdl-chain``.

Import this module only after ``TRITON_INTERPRET`` has its final value: ``triton.jit`` reads it. The
plain-PyTorch baselines are in the op case modules (``plain_torch``): they run where Triton is not installed.
"""

from __future__ import annotations

import triton
import triton.language as tl

TOKENS_PER_PROGRAM = 4096
V2P_COLUMNS_PER_PROGRAM = 256  # SGLang's translated-table builder, whatever the page size
CSR_BLOCK = 512


def pages_per_program(page_size: int) -> int:
    return triton.next_power_of_2(max(TOKENS_PER_PROGRAM // page_size, 1))


@triton.jit
def _naive_loop_kernel(table, pool_idx, lengths, out, table_stride, out_stride,
                       PAGE: tl.constexpr, STEP: tl.constexpr):
    b = tl.program_id(0)
    row = tl.load(pool_idx + b).to(tl.int64)
    pages = tl.cdiv(tl.load(lengths + b), PAGE)
    src = table + row * table_stride
    dst = out + b.to(tl.int64) * out_stride
    for first in range(0, pages, STEP):
        p = first + tl.arange(0, STEP)
        mask = p < pages
        slots = tl.load(src + p.to(tl.int64) * PAGE, mask=mask)
        tl.store(dst + p, slots // PAGE, mask=mask)


@triton.jit
def _grid_2d_kernel(table, pool_idx, lengths, out, table_stride, out_stride,
                    PAGE: tl.constexpr, STEP: tl.constexpr):
    b = tl.program_id(0)
    p = tl.program_id(1) * STEP + tl.arange(0, STEP)
    row = tl.load(pool_idx + b).to(tl.int64)
    pages = tl.cdiv(tl.load(lengths + b), PAGE)
    mask = p < pages
    slots = tl.load(table + row * table_stride + p.to(tl.int64) * PAGE, mask=mask)
    tl.store(out + b.to(tl.int64) * out_stride + p, slots // PAGE, mask=mask)


@triton.jit
def _csr_loop_kernel(table, pool_idx, lengths, indptr, mapping, out, table_stride,
                     ENTRY: tl.constexpr, MAPPED: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    row = tl.load(pool_idx + b).to(tl.int64)
    tokens = tl.load(lengths + b)
    src = table + row * table_stride
    dst = out + tl.load(indptr + b).to(tl.int64)
    for first in range(0, tokens, BLOCK):
        q = first + tl.arange(0, BLOCK)
        mask = q < tokens
        if ENTRY == 1:
            value = tl.load(src + q, mask=mask).to(tl.int64)
        else:
            value = tl.load(src + q // ENTRY, mask=mask).to(tl.int64) * ENTRY + q % ENTRY
        if MAPPED:
            value = tl.load(mapping + value, mask=mask & (value >= 0), other=-1).to(tl.int64)
        tl.store(dst + q, value.to(out.dtype.element_ty), mask=mask)


@triton.jit
def _touch_kernel(x):
    tl.store(x, tl.load(x) + 1)


def naive_loop(req_to_token, req_pool_indices, seq_lens, out, page_size):
    step = pages_per_program(page_size)
    grid = (req_pool_indices.shape[0],)
    _naive_loop_kernel[grid](req_to_token, req_pool_indices, seq_lens, out, req_to_token.stride(0), out.stride(0),
                             PAGE=page_size, STEP=step)
    return grid


def grid_2d(req_to_token, req_pool_indices, seq_lens, out, page_size, pages=None):
    """The page table on the grid ``(batch, pages / (4096 // page_size))``; ``pages``: the columns the grid
    covers (default ``out.shape[1]``, the buffer's width)."""
    step = pages_per_program(page_size)
    grid = (req_pool_indices.shape[0], triton.cdiv(out.shape[1] if pages is None else pages, step))
    _grid_2d_kernel[grid](req_to_token, req_pool_indices, seq_lens, out, req_to_token.stride(0), out.stride(0),
                          PAGE=page_size, STEP=step)
    return grid


def csr_loop(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, entry_page_size, token_mapping):
    """Token CSR into ``out`` (int32/int64 ``[N]``); ``token_mapping`` int32/int64 ``[M]`` or None."""
    mapped = token_mapping is not None
    grid = (req_pool_indices.shape[0],)
    _csr_loop_kernel[grid](req_to_token, req_pool_indices, seq_lens, kv_indptr, token_mapping if mapped else out, out,
                           req_to_token.stride(0), ENTRY=entry_page_size, MAPPED=mapped, BLOCK=CSR_BLOCK)
    return grid


def touch(x):
    """A plain ``kernel[grid](...)`` launch of a trivial kernel."""
    _touch_kernel[(1,)](x)


@triton.jit
def _mha_grid_2d_kernel(table, pool_idx, lengths, page_table, swa_page_table, full_to_swa, mapping_len, table_stride,
                        out_stride, PAGE: tl.constexpr, STEP: tl.constexpr, HAS_SWA: tl.constexpr):
    b = tl.program_id(0)
    block = tl.program_id(1)
    length = tl.load(lengths + b)
    if block < tl.cdiv(length, STEP * PAGE):
        p = block * STEP + tl.arange(0, STEP)
        mask = p < tl.cdiv(length, PAGE)
        row = tl.load(pool_idx + b).to(tl.int64)
        slots = tl.load(table + row * table_stride + p.to(tl.int64) * PAGE, mask=mask)
        dst = b.to(tl.int64) * out_stride + p
        tl.store(page_table + dst, (slots // PAGE).to(tl.int32), mask=mask)
        if HAS_SWA:
            index = tl.minimum(tl.maximum(slots, 0), mapping_len - 1)
            swa = tl.load(full_to_swa + index, mask=mask)
            tl.store(swa_page_table + dst, (swa // PAGE).to(tl.int32), mask=mask)


@triton.jit
def _v2p_grid_2d_kernel(table, pool_idx, lengths, v2p, out, multiplier, max_pages, table_stride, out_stride,
                        PAGE: tl.constexpr, STEP: tl.constexpr):
    b = tl.program_id(0)
    c = tl.program_id(1) * STEP + tl.arange(0, STEP)
    row = tl.load(pool_idx + b).to(tl.int64)
    live = (c < tl.cdiv(tl.load(lengths + b), PAGE)) & (c < max_pages)
    tokens = tl.load(table + row * table_stride + c.to(tl.int64) * PAGE, mask=live, other=0)
    page = tl.where(tokens < 0, 0, tokens // PAGE)
    physical = tl.load(v2p + page, mask=live, other=0)
    tl.store(out + b.to(tl.int64) * out_stride + c, tl.maximum(physical * multiplier, 0).to(tl.int32), mask=live)


def mha_grid_2d(req_to_token, req_pool_indices, seq_lens, page_table, page_size, swa_page_table=None,
                full_to_swa=None, pages=None):
    """The TRT-LLM MHA page table (and its SWA twin, sharing ``page_table``'s row stride) after SGLang's design:
    a 2-D grid, ``4096 // page_size`` pages per program, programs past a row's tokens exit; ``pages``: the
    columns the grid covers (default ``page_table.shape[1]``)."""
    step = pages_per_program(page_size)
    swa = full_to_swa is not None
    grid = (req_pool_indices.shape[0], triton.cdiv(page_table.shape[1] if pages is None else pages, step))
    _mha_grid_2d_kernel[grid](req_to_token, req_pool_indices, seq_lens, page_table,
                              swa_page_table if swa else page_table, full_to_swa if swa else page_table,
                              full_to_swa.numel() if swa else 0, req_to_token.stride(0), page_table.stride(0),
                              PAGE=page_size, STEP=step, HAS_SWA=swa)
    return grid


def v2p_grid_2d(req_to_token, req_pool_indices, seq_lens, v2p, out, page_size, multiplier=1,
                columns_per_program=None, pages=None):
    """The unified pool's translated page table after SGLang's design, every column of ``out`` a possible
    live one, on a 2-D grid of ``columns_per_program`` columns per program (a power of two; None: the page
    table's ``4096 // page_size``) over ``pages`` columns (default ``out.shape[1]``)."""
    step = columns_per_program or pages_per_program(page_size)
    grid = (req_pool_indices.shape[0], triton.cdiv(out.shape[1] if pages is None else pages, step))
    _v2p_grid_2d_kernel[grid](req_to_token, req_pool_indices, seq_lens, v2p, out, multiplier, out.shape[1],
                              req_to_token.stride(0), out.stride(0), PAGE=page_size, STEP=step)
    return grid


DRAFT_COPY_BLOCK = 128


@triton.jit
def _draft_loop_kernel(table, pool_idx, lengths, positions, out, indptr, table_stride, out_stride, indptr_stride,
                       PAGE: tl.constexpr, STEPS: tl.constexpr, BS_UPPER: tl.constexpr, ITER_UPPER: tl.constexpr,
                       TOKENS_UPPER: tl.constexpr, BLOCK: tl.constexpr):
    s, b, k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    batch, topk = tl.num_programs(1), tl.num_programs(2)
    it = s + 1
    earlier = tl.arange(0, BS_UPPER)
    before = tl.sum(tl.load(lengths + earlier, mask=earlier < b, other=0))
    length = tl.load(lengths + b)
    row = table + tl.load(pool_idx + b).to(tl.int64) * table_stride
    dst = out + s.to(tl.int64) * out_stride + before * topk + b * it * topk + k * (length + it)
    for first in range(0, length, BLOCK):
        j = first + tl.arange(0, BLOCK)
        tl.store(dst + j, tl.load(row + j, mask=j < length), mask=j < length)
    if PAGE == 1 or topk == 1:
        start = length + k * STEPS
    else:
        last = length % PAGE
        start = length - last + k * tl.cdiv(last + STEPS, PAGE) * PAGE + last
    slot = tl.arange(0, ITER_UPPER)
    tl.store(dst + length + slot, tl.load(row + start + slot, mask=slot < it), mask=slot < it)
    z = b * topk + k
    z = tl.where(z == 0, batch * topk, z)  # the first branch writes the row's end, entry 0 stays untouched
    index = tl.arange(0, TOKENS_UPPER)
    value = tl.sum(tl.load(positions + index, mask=index < z, other=0)) + z * it
    tl.store(indptr + s * indptr_stride + z, value)


def draft_loop(req_to_token, req_pool_indices, seq_lens, positions, out, kv_indptr, num_steps, topk, page_size):
    """Every draft step's token CSR on the grid ``(num_steps, batch, topk)``, one program per step, request and
    branch (``kvdispatch.create_draft_decode_kv_indices``'s layout; the last kv_indptr entry, the row's total, written
    by the first program of each step, entry 0 left untouched)."""
    batch = req_pool_indices.shape[0]
    grid = (num_steps, batch, topk)
    _draft_loop_kernel[grid](
        req_to_token, req_pool_indices, seq_lens, positions, out, kv_indptr, req_to_token.stride(0), out.stride(0),
        kv_indptr.stride(0), PAGE=page_size, STEPS=num_steps, BS_UPPER=triton.next_power_of_2(batch),
        ITER_UPPER=triton.next_power_of_2(num_steps), TOKENS_UPPER=triton.next_power_of_2(batch * topk),
        BLOCK=DRAFT_COPY_BLOCK)
    return grid


@triton.jit
def _dcp_loop_kernel(table, pool_idx, lengths, indptr, out, table_stride, DCP_SIZE: tl.constexpr,
                     DCP_RANK: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    row = tl.load(pool_idx + b).to(tl.int64)
    tokens = tl.load(lengths + b)
    src = table + row * table_stride + DCP_RANK
    dst = out + tl.load(indptr + b).to(tl.int64)
    for first in range(0, tokens, BLOCK):
        j = first + tl.arange(0, BLOCK)
        mask = j < tokens
        slots = tl.load(src + j.to(tl.int64) * DCP_SIZE, mask=mask)
        tl.store(dst + j, (slots // DCP_SIZE).to(out.dtype.element_ty), mask=mask)


@triton.jit
def _dcp_grid_2d_kernel(table, pool_idx, lengths, out, table_stride, out_stride, PAGE: tl.constexpr,
                        DCP_SIZE: tl.constexpr, DCP_RANK: tl.constexpr, STEP: tl.constexpr):
    b = tl.program_id(0)
    p = tl.program_id(1) * STEP + tl.arange(0, STEP)
    row = tl.load(pool_idx + b).to(tl.int64)
    pages = tl.cdiv(tl.load(lengths + b), PAGE)
    mask = p < pages
    slots = tl.load(table + row * table_stride + DCP_RANK + p.to(tl.int64) * (PAGE * DCP_SIZE), mask=mask)
    tl.store(out + b.to(tl.int64) * out_stride + p, slots // DCP_SIZE // PAGE, mask=mask)


def dcp_loop(req_to_token, req_pool_indices, local_seq_lens, kv_indptr, out, dcp_size, dcp_rank):
    """One DCP rank's token CSR into ``out`` (int32/int64 ``[N]``), without a start."""
    grid = (req_pool_indices.shape[0],)
    _dcp_loop_kernel[grid](req_to_token, req_pool_indices, local_seq_lens, kv_indptr, out, req_to_token.stride(0),
                           DCP_SIZE=dcp_size, DCP_RANK=dcp_rank, BLOCK=CSR_BLOCK)
    return grid


def dcp_grid_2d(req_to_token, req_pool_indices, local_seq_lens, out, page_size, dcp_size, dcp_rank, pages=None):
    """One DCP rank's block table into ``out`` (int32 ``[>= B, W]``) on a grid over ``pages`` columns (default
    ``W``)."""
    step = pages_per_program(page_size)
    grid = (req_pool_indices.shape[0], triton.cdiv(out.shape[1] if pages is None else pages, step))
    _dcp_grid_2d_kernel[grid](req_to_token, req_pool_indices, local_seq_lens, out, req_to_token.stride(0),
                              out.stride(0), PAGE=page_size, DCP_SIZE=dcp_size, DCP_RANK=dcp_rank, STEP=step)
    return grid


@triton.jit
def _producer_kernel(source, target, n, BLOCK: tl.constexpr, TRIGGER: tl.constexpr):
    if TRIGGER:  # programmatic dependent launch: the next PDL kernel on the stream may start launching now
        tl.extra.cuda.gdc_launch_dependents()
    i = tl.arange(0, BLOCK)
    tl.store(target + i, tl.load(source + i, mask=i < n), mask=i < n)


def producer(source, target, trigger: bool):
    """Copy ``source`` into ``target`` (1-D, the same length and dtype) with one program: the kernel before an
    index build in ``kvdispatch bench --pdl-chain``, writing its inputs as an engine's preceding kernel does.
    ``trigger``: let a following PDL kernel start launching at once (``griddepcontrol.launch_dependents``,
    NVIDIA sm_90+); without it, as PyTorch's kernels, it does not."""
    n = source.shape[0]
    _producer_kernel[(1,)](source, target, n, BLOCK=triton.next_power_of_2(n), TRIGGER=trigger, num_warps=4)


# -- one decode step's metadata after SGLang's fused design (update_trtllm_mha_graph_metadata): a 1-D grid of
# one program per request (its length and its whole page row, PAGE_BLOCK pages a pass), one program for the
# prefix sum of the whole batch, then programs of PAGE_BLOCK SWA cache locations each --

@triton.jit
def _fused_metadata_kernel(table, pool, lens, cache, cu_k, page_table, swa_page_table, mapping, locs, swa_locs,
                           batch, width, table_stride, page_table_stride, swa_stride, loc_count,
                           PAGE: tl.constexpr, HAS_SWA: tl.constexpr, PAGE_BLOCK: tl.constexpr,
                           BATCH_BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    if pid < batch:
        length = tl.load(lens + pid).to(tl.int32)
        tl.store(cache + pid, length)
        row = table + tl.load(pool + pid).to(tl.int64) * table_stride
        pages = tl.minimum(tl.cdiv(length, PAGE), width)
        for i in range(tl.cdiv(pages, PAGE_BLOCK)):
            page = i * PAGE_BLOCK + tl.arange(0, PAGE_BLOCK)
            live = page < pages
            slot = tl.load(row + page.to(tl.int64) * PAGE, mask=live, other=0)
            tl.store(page_table + pid.to(tl.int64) * page_table_stride + page, slot // PAGE, mask=live)
            if HAS_SWA:
                mapped = tl.load(mapping + slot.to(tl.int64), mask=live & (slot >= 0), other=-1)
                tl.store(swa_page_table + pid.to(tl.int64) * swa_stride + page,
                         tl.where(mapped < 0, -1, mapped // PAGE).to(tl.int32), mask=live)
    elif pid == batch:
        offs = tl.arange(0, BATCH_BLOCK)
        lengths = tl.load(lens + offs, mask=offs < batch, other=0).to(tl.int32)
        tl.store(cu_k + 1 + offs, tl.cumsum(lengths, axis=0), mask=offs < batch)
        tl.store(cu_k, 0)
    elif HAS_SWA:
        index = (pid - batch - 1) * PAGE_BLOCK + tl.arange(0, PAGE_BLOCK)
        real = index < loc_count
        loc = tl.load(locs + index, mask=real, other=0)
        tl.store(swa_locs + index, tl.load(mapping + loc, mask=real, other=0), mask=real)


def fused_metadata(req_to_token, req_pool_indices, seq_lens, cache_seqlens, cu_seqlens_k, page_table, page_size,
                   swa_page_table=None, full_to_swa=None, out_cache_loc=None, swa_out_cache_loc=None):
    """One decode step's metadata after SGLang 0.5.23's fused kernel design (the grid grows with the SWA
    locations and each request's row is one program's)."""
    batch, block, swa = req_pool_indices.shape[0], 512, full_to_swa is not None
    count = swa_out_cache_loc.shape[0] if swa else 0
    grid = (batch + 1 + triton.cdiv(count, block),)
    _fused_metadata_kernel[grid](req_to_token, req_pool_indices, seq_lens, cache_seqlens, cu_seqlens_k, page_table,
                                 swa_page_table if swa else page_table, full_to_swa if swa else page_table,
                                 out_cache_loc if swa else page_table, swa_out_cache_loc if swa else page_table,
                                 batch, page_table.shape[1], req_to_token.stride(0), page_table.stride(0),
                                 swa_page_table.stride(0) if swa else 0, count, PAGE=page_size, HAS_SWA=swa,
                                 PAGE_BLOCK=block, BATCH_BLOCK=triton.next_power_of_2(batch))
    return grid
# Speculative cache locations after SGLang's design: one program per request, its packed offset the sum of the
# earlier lengths loaded in one block of the batch's next power of two.
EXTEND_COPY_BLOCK = 32


@triton.jit
def _extend_loop_kernel(table, pool_idx, starts, ends, out, table_stride, BS_UPPER: tl.constexpr,
                        BLOCK: tl.constexpr):
    b = tl.program_id(0)
    earlier = tl.arange(0, BS_UPPER)
    offset = tl.sum(tl.load(ends + earlier, mask=earlier < b, other=0)
                    - tl.load(starts + earlier, mask=earlier < b, other=0))
    first, last = tl.load(starts + b), tl.load(ends + b)
    row = table + tl.load(pool_idx + b).to(tl.int64) * table_stride
    for done in range(0, last - first, BLOCK):
        j = done + tl.arange(0, BLOCK)
        tl.store(out + offset + j, tl.load(row + first + j, mask=j < last - first), mask=j < last - first)


def extend_loop(req_to_token, req_pool_indices, start_offset, end_offset, out):
    """Every request's ``req_to_token[pool, start:end]`` packed into ``out`` (``kvdispatch.create_cache_locs``'s
    layout), one program per request."""
    batch = req_pool_indices.shape[0]
    _extend_loop_kernel[(batch,)](req_to_token, req_pool_indices, start_offset, end_offset, out,
                                  req_to_token.stride(0), BS_UPPER=triton.next_power_of_2(batch),
                                  BLOCK=EXTEND_COPY_BLOCK)
    return (batch,)


# ``compact_grid_2d``: one DCP rank's share of a CSR compacted, after SGLang's ``update_kv_lens_and_indices``
# (written for kvdispatch): a 2-D grid ``(batch, blocks)`` of ``COMPACT_BLOCK`` ids per program, the blocks sized
# from the longest shard of a full-length row (the planner's ``max_local_len``).
COMPACT_BLOCK = 128


@triton.jit
def _compact_grid_2d_kernel(source, starts, lengths, indptr, out, DCP_SIZE: tl.constexpr, DCP_RANK: tl.constexpr,
                            BLOCK: tl.constexpr):
    b = tl.program_id(0)
    j = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = j < tl.load(lengths + b)
    ids = tl.load(source + tl.load(starts + b) + DCP_RANK + j * DCP_SIZE, mask=mask)
    tl.store(out + tl.load(indptr + b) + j, ids, mask=mask)


def compact_grid_2d(source, starts, local_lens, local_indptr, out, dcp_size, dcp_rank):
    """The rank's share of the CSR ``source`` (``[1, N]``, rows from ``starts``) into ``out``."""
    grid = (local_lens.shape[0], triton.cdiv(out.shape[0] // max(local_lens.shape[0], 1), COMPACT_BLOCK))
    _compact_grid_2d_kernel[grid](source, starts, local_lens, local_indptr, out, DCP_SIZE=dcp_size,
                                  DCP_RANK=dcp_rank, BLOCK=COMPACT_BLOCK)
    return grid


# ``prefix_extend_loop``: the token CSR over a gathered prefix+extend buffer, after SGLang's
# ``dcp_kernels.create_dcp_kv_indices`` (written for kvdispatch): one program per request, its prefix then its
# extend ``CSR_BLOCK`` ids per pass.
@triton.jit
def _prefix_extend_loop_kernel(prefix_lens, prefix_starts, extend_lens, extend_starts, indptr, out, base,
                               BLOCK: tl.constexpr):
    b = tl.program_id(0)
    prefix = tl.load(prefix_lens + b)
    start = tl.load(prefix_starts + b)
    dst = out + tl.load(indptr + b)
    for first in range(0, prefix, BLOCK):
        j = first + tl.arange(0, BLOCK)
        tl.store(dst + j, start + j, mask=j < prefix)
    extend = tl.load(extend_lens + b)
    start = base + tl.load(extend_starts + b)
    for first in range(0, extend, BLOCK):
        j = first + tl.arange(0, BLOCK)
        tl.store(dst + prefix + j, start + j, mask=j < extend)


def prefix_extend_loop(prefix_lens, prefix_starts, extend_lens, extend_starts, kv_indptr, out, extend_base):
    """The prefix+extend CSR into ``out`` (int32 ``[N]``)."""
    grid = (prefix_lens.shape[0],)
    _prefix_extend_loop_kernel[grid](prefix_lens, prefix_starts, extend_lens, extend_starts, kv_indptr, out,
                                     extend_base, BLOCK=CSR_BLOCK)
    return grid


# ``ragged_grid_2d``: the block table of a ragged token CSR (with its SWA twin) after SGLang's Aiter design.
RAGGED_PAGES_PER_PROGRAM = 1024  # SGLang's BLOCK_SIZE, whatever the page size


@triton.jit
def _ragged_grid_2d_kernel(kv_indices, kv_indptr, page_table, swa_page_table, full_to_swa, out_stride,
                           PAGE: tl.constexpr, STEP: tl.constexpr, HAS_SWA: tl.constexpr):
    b = tl.program_id(0)
    start = tl.load(kv_indptr + b).to(tl.int64)
    pages = tl.cdiv(tl.load(kv_indptr + b + 1).to(tl.int64) - start, PAGE)
    if tl.program_id(1) * STEP < pages:
        p = tl.program_id(1) * STEP + tl.arange(0, STEP)
        mask = p < pages
        slots = tl.load(kv_indices + start + p.to(tl.int64) * PAGE, mask=mask, other=0)
        dst = b.to(tl.int64) * out_stride + p
        tl.store(page_table + dst, (slots // PAGE).to(tl.int32), mask=mask)
        if HAS_SWA:
            swa = tl.load(full_to_swa + slots, mask=mask)
            tl.store(swa_page_table + dst, (swa // PAGE).to(tl.int32), mask=mask)


def ragged_grid_2d(kv_indices, kv_indptr, page_table, page_size, swa_page_table=None, full_to_swa=None, pages=None):
    """The block table of a ragged token CSR (and its SWA twin, sharing ``page_table``'s row stride) after
    SGLang's Aiter design: a 2-D grid of ``RAGGED_PAGES_PER_PROGRAM`` pages per program, programs past a row's
    pages exit; ``pages``: the columns the grid covers (default ``page_table.shape[1]``)."""
    swa = full_to_swa is not None
    step = RAGGED_PAGES_PER_PROGRAM
    grid = (kv_indptr.shape[0] - 1, triton.cdiv(max(page_table.shape[1] if pages is None else pages, 1), step))
    _ragged_grid_2d_kernel[grid](kv_indices, kv_indptr, page_table, swa_page_table if swa else page_table,
                                 full_to_swa if swa else kv_indices, page_table.stride(0), PAGE=page_size, STEP=step,
                                 HAS_SWA=swa)
    return grid


# ``pa_loop``: the prefill-aware sliding-window token table after SGLang's design.
PA_BLOCK = 256  # SGLang's BLOCK_SIZE


@triton.jit
def _pa_loop_kernel(table, pool_idx, lengths, prefill_lens, out, kv_lens, window, table_stride, out_stride,
                    BLOCK: tl.constexpr):
    b = tl.program_id(0)
    row = tl.load(pool_idx + b).to(tl.int64)
    length = tl.load(lengths + b).to(tl.int32)
    prefill = tl.load(prefill_lens + row).to(tl.int32)
    gap = tl.maximum(length - window - prefill, 0)
    kept = length - gap
    tl.store(kv_lens + b, kept)
    for start in tl.range(0, kept, BLOCK):
        j = start + tl.arange(0, BLOCK)
        position = tl.where(j < prefill, j, j + gap)
        tl.store(out + b.to(tl.int64) * out_stride + j, tl.load(table + row * table_stride + position,
                                                                mask=j < kept), mask=j < kept)


def pa_loop(req_to_token, req_pool_indices, seq_lens, prefill_lens, out, kv_lens, window_size):
    """The prefill-aware sliding-window token table after SGLang's design: one program per request, looping over
    its ``min(seq_len, prefill + window)`` tokens ``PA_BLOCK`` at a time."""
    grid = (req_pool_indices.shape[0],)
    _pa_loop_kernel[grid](req_to_token, req_pool_indices, seq_lens, prefill_lens, out, kv_lens, window_size,
                          req_to_token.stride(0), out.stride(0), BLOCK=PA_BLOCK)
    return grid


# ``unified_copy``: two token CSRs merged row by row after SGLang's design (the Triton backend's unified extend).
UNIFIED_BLOCK = 128  # SGLang's BLOCK_SIZE


@triton.jit
def _unified_copy_kernel(prefix_indptr, prefix, start, lens, extend, indptr, out, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    prefix_start = tl.load(prefix_indptr + b)
    prefix_len = tl.load(prefix_indptr + b + 1) - prefix_start
    extend_start = tl.load(start + b)
    extend_len = tl.load(lens + b)
    begin = tl.load(indptr + b)
    for block in range(0, prefix_len, BLOCK):
        j = block + tl.arange(0, BLOCK)
        tl.store(out + begin + j, tl.load(prefix + prefix_start + j, mask=j < prefix_len), mask=j < prefix_len)
    for block in range(0, extend_len, BLOCK):
        j = block + tl.arange(0, BLOCK)
        tl.store(out + begin + prefix_len + j, tl.load(extend + extend_start + j, mask=j < extend_len),
                 mask=j < extend_len)


def unified_copy(prefix_kv_indptr, prefix_kv_indices, extend_start_loc, extend_seq_lens, extend_kv_indices,
                 kv_indptr_out, out):
    """Two token CSRs merged row by row after SGLang's design: the prefix sums by ``torch.cumsum`` (a launch of
    its own), then one program per request copying its prefix and extend entries ``UNIFIED_BLOCK`` at a time."""
    import torch  # noqa: PLC0415  (the rest of this module needs none)

    batch = extend_seq_lens.shape[0]
    lengths = prefix_kv_indptr[1:] - prefix_kv_indptr[:-1] + extend_seq_lens
    torch.cumsum(lengths, 0, out=kv_indptr_out[1:batch + 1])
    kv_indptr_out[:1].zero_()
    _unified_copy_kernel[(batch,)](prefix_kv_indptr, prefix_kv_indices, extend_start_loc, extend_seq_lens,
                                   extend_kv_indices, kv_indptr_out, out, BLOCK=UNIFIED_BLOCK)
    return (batch,)


# ``concat_grid_2d``: each draft token's prefix-then-expand row after SGLang's design (FlashAttention's SWA
# speculative decode): a 2-D grid over both tables' widths, ``CONCAT_COLUMNS`` columns per program.
CONCAT_COLUMNS = 256  # SGLang's BLOCK_N


@triton.jit
def _concat_grid_2d_kernel(out, a, b, lens_a, lens_b, out_stride, a_stride, b_stride, LEN_A: tl.constexpr,
                           LEN_B: tl.constexpr, REPEAT: tl.constexpr, BLOCK: tl.constexpr):
    m = tl.program_id(0)
    first = tl.load(lens_a + m // REPEAT)
    total = first + tl.load(lens_b + m)
    n = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    if tl.program_id(1) * BLOCK < total:
        live = n < total
        a_values = tl.load(a + (m // REPEAT) * a_stride + n, mask=live & (n < first) & (n < LEN_A), other=0)
        b_values = tl.load(b + m * b_stride + n - first, mask=live & (n >= first) & (n - first < LEN_B), other=0)
        tl.store(out + m * out_stride + n, tl.where(n < first, a_values, b_values), mask=live)


def concat_grid_2d(page_table_a, page_table_b, seq_lens_a, seq_lens_b, out, draft_tokens):
    """Each draft token's prefix-then-expand row after SGLang's design: a grid ``(rows, ceil((LA + LB) /
    CONCAT_COLUMNS))``, programs past a row's entries exit."""
    width_a, width_b = page_table_a.shape[1], page_table_b.shape[1]
    grid = (seq_lens_b.shape[0], triton.cdiv(width_a + width_b, CONCAT_COLUMNS))
    _concat_grid_2d_kernel[grid](out, page_table_a, page_table_b, seq_lens_a, seq_lens_b, out.stride(0),
                                 page_table_a.stride(0), page_table_b.stride(0), LEN_A=width_a, LEN_B=width_b,
                                 REPEAT=draft_tokens, BLOCK=CONCAT_COLUMNS)
    return grid


# SGLang 0.5.23's designs for the read-table and draft-decode options, written for kvdispatch --
# * ``read_table_sglang``: the unified pool's read indices (its translated page table, with the zero tail in the
#   same launch, and its packed token stream): a grid ``(batch, min(cdiv(READ_TARGET_PROGRAMS, batch),
#   cdiv(items, READ_BLOCK)))`` sized from the buffer's items, each program striding over its row's items up to
#   the live ones (the zero tail: up to the row's width), ``READ_BLOCK`` items a pass.
# * ``draft_entry_loop``: ``draft_loop`` on a page-granular table (position ``q`` reads ``row[q // E] * E +
#   q % E``), SGLang's ``ENTRY_PAGE_SIZE``.
# * ``draft_window_loop``: the per-step sliding-window draft CSR: a grid ``(steps, batch, topk)``, each program
#   summing the earlier branches' window widths in one block of ``next_power_of_2(batch * topk)``, copying its
#   prefix tail ``DRAFT_COPY_BLOCK`` tokens at a time, then its latest draft slots.
READ_BLOCK, READ_TARGET_PROGRAMS, READ_WARPS = 512, 1024, 8


@triton.jit
def _read_table_kernel(table, pool_idx, lengths, v2p, row_starts, out, table_stride, out_stride, item_stride,
                       row_items, PAGE: tl.constexpr, PER_TOKEN: tl.constexpr, ZERO_TAIL: tl.constexpr,
                       BLOCK: tl.constexpr):
    b = tl.program_id(0)
    row = table + tl.load(pool_idx + b).to(tl.int64) * table_stride
    length = tl.load(lengths + b)
    if PER_TOKEN:
        items = length
        dst = out + tl.load(row_starts + b).to(tl.int64)
    else:
        items = tl.minimum(tl.cdiv(length, PAGE), row_items)
        dst = out + b.to(tl.int64) * out_stride
    stored = row_items if ZERO_TAIL else items
    for first in range(tl.program_id(1) * BLOCK, stored, item_stride):
        item = first + tl.arange(0, BLOCK)
        live = item < items
        column = item // PAGE if PER_TOKEN else item
        token = tl.load(row + column.to(tl.int64) * PAGE, mask=live, other=0).to(tl.int64)
        entry = tl.maximum(tl.load(v2p + tl.where(token < 0, 0, token // PAGE), mask=live, other=0), 0)
        value = entry * PAGE + item % PAGE if PER_TOKEN else entry
        if ZERO_TAIL:
            tl.store(dst + item, tl.where(live, value, 0).to(out.dtype.element_ty), mask=item < stored)
        else:
            tl.store(dst + item, value.to(out.dtype.element_ty), mask=live)


def read_table_sglang(req_to_token, req_pool_indices, seq_lens, v2p, out, page_size, row_starts=None,
                      zero_tail=False):
    """The translated page table into ``out`` (int32 ``[>= B, W]``; ``zero_tail``: columns past a row's pages up
    to ``W`` set to 0), or with ``row_starts`` (``[B + 1]``) the packed token stream into ``out`` (int32/int64
    ``[N]``, ``N`` the items the grid is sized from, as a capture-stable buffer's size)."""
    batch, per_token = req_pool_indices.shape[0], row_starts is not None
    items = out.shape[0] if per_token else out.shape[1]
    grid = (batch, min(triton.cdiv(READ_TARGET_PROGRAMS, batch), triton.cdiv(items, READ_BLOCK)))
    _read_table_kernel[grid](req_to_token, req_pool_indices, seq_lens, v2p, row_starts if per_token else out, out,
                             req_to_token.stride(0), 0 if per_token else out.stride(0), grid[1] * READ_BLOCK, items,
                             PAGE=page_size, PER_TOKEN=per_token, ZERO_TAIL=zero_tail, BLOCK=READ_BLOCK,
                             num_warps=READ_WARPS)
    return grid


@triton.jit
def _draft_positions(row, q, mask, ENTRY: tl.constexpr):
    # One return of one type: Triton 3.6 types both branches of a constexpr test.
    if ENTRY == 1:
        values = tl.load(row + q, mask=mask).to(tl.int64)
    else:
        values = tl.load(row + q // ENTRY, mask=mask, other=0).to(tl.int64) * ENTRY + q % ENTRY
    return values


@triton.jit
def _draft_slot_start(length, k, PAGE: tl.constexpr, STEPS: tl.constexpr, TOPK_ONE: tl.constexpr):
    if PAGE == 1 or TOPK_ONE:
        return length + k * STEPS
    last = length % PAGE
    return length - last + k * tl.cdiv(last + STEPS, PAGE) * PAGE + last


@triton.jit
def _draft_entry_kernel(table, pool_idx, lengths, positions, out, indptr, table_stride, out_stride, indptr_stride,
                        PAGE: tl.constexpr, STEPS: tl.constexpr, ENTRY: tl.constexpr, TOPK_ONE: tl.constexpr,
                        BS_UPPER: tl.constexpr, ITER_UPPER: tl.constexpr, TOKENS_UPPER: tl.constexpr,
                        BLOCK: tl.constexpr):
    s, b, k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    batch, topk = tl.num_programs(1), tl.num_programs(2)
    it = s + 1
    earlier = tl.arange(0, BS_UPPER)
    before = tl.sum(tl.load(lengths + earlier, mask=earlier < b, other=0))
    length = tl.load(lengths + b)
    row = table + tl.load(pool_idx + b).to(tl.int64) * table_stride
    dst = out + s.to(tl.int64) * out_stride + before * topk + b * it * topk + k * (length + it)
    for first in range(0, length, BLOCK):
        j = first + tl.arange(0, BLOCK)
        tl.store(dst + j, _draft_positions(row, j, j < length, ENTRY), mask=j < length)
    slot = tl.arange(0, ITER_UPPER)
    start = _draft_slot_start(length, k, PAGE, STEPS, TOPK_ONE)
    tl.store(dst + length + slot, _draft_positions(row, start + slot, slot < it, ENTRY), mask=slot < it)
    z = b * topk + k
    z = tl.where(z == 0, batch * topk, z)  # the first branch writes the row's end, entry 0 stays untouched
    index = tl.arange(0, TOKENS_UPPER)
    value = tl.sum(tl.load(positions + index, mask=index < z, other=0)) + z * it
    tl.store(indptr + s * indptr_stride + z, value)


@triton.jit
def _draft_window_kernel(table, pool_idx, lengths, positions, out, indptr, table_stride, out_stride, indptr_stride,
                         window, PAGE: tl.constexpr, STEPS: tl.constexpr, ENTRY: tl.constexpr,
                         TOPK_ONE: tl.constexpr, ITER_UPPER: tl.constexpr, TOKENS_UPPER: tl.constexpr,
                         BLOCK: tl.constexpr):
    s, b, k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    batch, topk = tl.num_programs(1), tl.num_programs(2)
    it = s + 1
    length = tl.load(lengths + b)
    first_read = length + it - tl.minimum(length + it, window)  # the window's first position of the chain
    z = b * topk + k
    index = tl.arange(0, TOKENS_UPPER)
    ahead = index < tl.where(z == 0, batch * topk, z)
    base = tl.sum(tl.where(ahead, tl.minimum(tl.load(positions + index, mask=ahead, other=0) + it, window), 0))
    row = table + tl.load(pool_idx + b).to(tl.int64) * table_stride
    prefix_start = tl.minimum(first_read, length)
    prefix = length - prefix_start
    dst = out + s.to(tl.int64) * out_stride + tl.where(z == 0, 0, base)
    for done in range(0, prefix, BLOCK):
        j = done + tl.arange(0, BLOCK)
        tl.store(dst + j, _draft_positions(row, prefix_start + j, j < prefix, ENTRY), mask=j < prefix)
    chain = tl.maximum(first_read - length, 0) + tl.arange(0, ITER_UPPER)
    start = _draft_slot_start(length, k, PAGE, STEPS, TOPK_ONE)
    slot = tl.arange(0, ITER_UPPER)
    tl.store(dst + prefix + slot, _draft_positions(row, start + chain, chain < it, ENTRY), mask=chain < it)
    tl.store(indptr + s * indptr_stride + tl.where(z == 0, batch * topk, z), base)


def draft_entry_loop(req_to_token, req_pool_indices, seq_lens, positions, out, kv_indptr, num_steps, topk, page_size,
                     entry_page_size):
    """``draft_loop`` on a page-granular table of ``entry_page_size`` tokens an entry."""
    batch = req_pool_indices.shape[0]
    grid = (num_steps, batch, topk)
    _draft_entry_kernel[grid](
        req_to_token, req_pool_indices, seq_lens, positions, out, kv_indptr, req_to_token.stride(0), out.stride(0),
        kv_indptr.stride(0), PAGE=page_size, STEPS=num_steps, ENTRY=entry_page_size, TOPK_ONE=topk == 1,
        BS_UPPER=triton.next_power_of_2(batch), ITER_UPPER=triton.next_power_of_2(num_steps),
        TOKENS_UPPER=triton.next_power_of_2(batch * topk), BLOCK=DRAFT_COPY_BLOCK)
    return grid


def draft_window_loop(req_to_token, req_pool_indices, seq_lens, positions, out, kv_indptr, num_steps, topk, page_size,
                      entry_page_size, window):
    """Every draft step's window CSR (``kvdispatch.create_draft_decode_kv_indices`` with ``step_window=window``,
    positions given, entry 0 of each ``kv_indptr`` row left untouched) on the grid ``(num_steps, batch, topk)``."""
    batch = req_pool_indices.shape[0]
    grid = (num_steps, batch, topk)
    _draft_window_kernel[grid](
        req_to_token, req_pool_indices, seq_lens, positions, out, kv_indptr, req_to_token.stride(0), out.stride(0),
        kv_indptr.stride(0), window, PAGE=page_size, STEPS=num_steps, ENTRY=entry_page_size, TOPK_ONE=topk == 1,
        ITER_UPPER=triton.next_power_of_2(num_steps), TOKENS_UPPER=triton.next_power_of_2(batch * topk),
        BLOCK=DRAFT_COPY_BLOCK)
    return grid
# A draft model's compact rows after SGLang's design: one program per request, the pool rows' widths as
# constexprs, blocks of COMPACT_REBUILD_BLOCK columns up to the request's prefix length plus the verify block.
COMPACT_REBUILD_BLOCK = 256


@triton.jit
def _compact_rebuild_loop_kernel(draft, target, pool_idx, starts, lens, verify, verify_stride,
                                 DRAFT_WIDTH: tl.constexpr, TARGET_WIDTH: tl.constexpr, VERIFY_WIDTH: tl.constexpr,
                                 BLOCK: tl.constexpr):
    b = tl.program_id(0)
    row = tl.load(pool_idx + b).to(tl.int64)
    first = tl.load(starts + b).to(tl.int64)
    prefix = tl.load(lens + b).to(tl.int64)
    for done in range(0, prefix + VERIFY_WIDTH, BLOCK):
        j = done + tl.arange(0, BLOCK)
        suffix = j < prefix
        slots = (j >= prefix) & (j < prefix + VERIFY_WIDTH)
        values = tl.where(suffix, tl.load(target + row * TARGET_WIDTH + first + j, mask=suffix, other=0),
                          tl.load(verify + b * verify_stride + j - prefix, mask=slots, other=0))
        tl.store(draft + row * DRAFT_WIDTH + j, values, mask=suffix | slots)


def compact_rebuild_loop(target_req_to_token, req_pool_indices, suffix_start, draft_prefix_lens, verify_locs,
                         draft_req_to_token):
    """Every request's draft row rebuilt from its target suffix and verify slots
    (``kvdispatch.build_compact_draft_rows``' layout), one program per request."""
    batch = req_pool_indices.shape[0]
    _compact_rebuild_loop_kernel[(batch,)](draft_req_to_token, target_req_to_token, req_pool_indices, suffix_start,
                                           draft_prefix_lens, verify_locs, verify_locs.stride(0),
                                           DRAFT_WIDTH=draft_req_to_token.stride(0),
                                           TARGET_WIDTH=target_req_to_token.stride(0),
                                           VERIFY_WIDTH=verify_locs.shape[1], BLOCK=COMPACT_REBUILD_BLOCK)
    return (batch,)
