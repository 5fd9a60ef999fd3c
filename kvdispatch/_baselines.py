"""Triton comparison kernels for ``kvdispatch bench`` (not part of the API; valid, full-length data only).

* ``naive_loop``: one program per request, looping over its row ``4096 // page_size`` pages at a time.
* ``grid_2d``: the seed design, written for kvdispatch: a 2-D grid ``(batch, blocks)``, each program
  ``4096 // page_size`` pages, runtime strides, plain masked loads.
* ``csr_loop``: token CSR after SGLang's design, written for kvdispatch: one program per request, looping
  over its tokens ``CSR_BLOCK`` at a time; value ``table[row, q // E] * E + q % E``, then the mapping.
* ``touch``: a trivial one-element kernel, the reference for a plain ``kernel[grid](...)`` launch.
* ``dcp_loop``: one decode-context-parallel rank's token CSR after SGLang's design, written for kvdispatch: one
  program per request, looping over its tokens ``CSR_BLOCK`` at a time, reading every ``D``-th position from
  the rank's first (DCP size and rank compile-time), value ``slot // D``.
* ``dcp_grid_2d``: that rank's block table after SGLang's design, written for kvdispatch: a 2-D grid
  ``(batch, blocks)`` of ``4096 // page_size`` pages per program, value ``slot // (page_size * D)``.

Import this module only after ``TRITON_INTERPRET`` has its final value: ``triton.jit`` reads it. The
plain-PyTorch baseline is ``bench.plain_torch``: it runs where Triton is not installed.
"""

from __future__ import annotations

import triton
import triton.language as tl

TOKENS_PER_PROGRAM = 4096
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
    _naive_loop_kernel[(req_pool_indices.shape[0],)](
        req_to_token, req_pool_indices, seq_lens, out, req_to_token.stride(0), out.stride(0),
        PAGE=page_size, STEP=step)


def grid_2d(req_to_token, req_pool_indices, seq_lens, out, page_size):
    step = pages_per_program(page_size)
    grid = (req_pool_indices.shape[0], triton.cdiv(out.shape[1], step))
    _grid_2d_kernel[grid](req_to_token, req_pool_indices, seq_lens, out, req_to_token.stride(0), out.stride(0),
                          PAGE=page_size, STEP=step)


def csr_loop(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, entry_page_size, token_mapping):
    """Token CSR into ``out`` (int32/int64 ``[N]``); ``token_mapping`` int32/int64 ``[M]`` or None."""
    mapped = token_mapping is not None
    _csr_loop_kernel[(req_pool_indices.shape[0],)](
        req_to_token, req_pool_indices, seq_lens, kv_indptr, token_mapping if mapped else out, out,
        req_to_token.stride(0), ENTRY=entry_page_size, MAPPED=mapped, BLOCK=CSR_BLOCK)


def touch(x):
    """A plain ``kernel[grid](...)`` launch of a trivial kernel."""
    _touch_kernel[(1,)](x)


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
    _dcp_loop_kernel[(req_pool_indices.shape[0],)](
        req_to_token, req_pool_indices, local_seq_lens, kv_indptr, out, req_to_token.stride(0), DCP_SIZE=dcp_size,
        DCP_RANK=dcp_rank, BLOCK=CSR_BLOCK)


def dcp_grid_2d(req_to_token, req_pool_indices, local_seq_lens, out, page_size, dcp_size, dcp_rank):
    """One DCP rank's block table into ``out`` (int32 ``[>= B, W]``)."""
    step = pages_per_program(page_size)
    grid = (req_pool_indices.shape[0], triton.cdiv(out.shape[1], step))
    _dcp_grid_2d_kernel[grid](req_to_token, req_pool_indices, local_seq_lens, out, req_to_token.stride(0),
                              out.stride(0), PAGE=page_size, DCP_SIZE=dcp_size, DCP_RANK=dcp_rank, STEP=step)
