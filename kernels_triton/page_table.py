"""Paged block table (FlashMLA-style) on the 2-D grid ``(batch, programs_per_row)``.

Program ``(b, k)`` owns pages ``[k * PAGES_PER_PROGRAM, (k + 1) * PAGES_PER_PROGRAM)`` of row ``b`` of
``out``. It loads the row's pool index, length and start together, gathers one slot per page in one
round trip, and stores the pages (16-byte accesses with streaming cache hints on page-1 rows the launcher
found 16-byte aligned).
"""

from __future__ import annotations

import itertools

import triton
import triton.language as tl

from kvdispatch import grid as launch_grid

from . import launch as _launch
from . import native

RUNTIME_INTS = ("pool_stride", "lens_stride", "start_stride", "table_rows", "table_cols", "table_row_stride",
                "out_width", "out_row_stride", "seqlen_offset", "fill_value", "rows_aligned")
POINTERS = ("table_ptr", "pool_ptr", "lens_ptr", "start_ptr", "out_ptr", "seq_lens_out_ptr")
CONSTEXPRS = ("PAGE_SIZE", "PAGE_SHIFT", "PAGES_PER_PROGRAM", "HAS_START", "HAS_SEQ_LENS_OUT", "HAS_FILL",
              "UNIT_STRIDES")


def _page_table_kernel(
    table_ptr, pool_ptr, lens_ptr, start_ptr, out_ptr, seq_lens_out_ptr,
    pool_stride: tl.int64, lens_stride: tl.int64, start_stride: tl.int64, table_rows: tl.int64, table_cols: tl.int64, table_row_stride: tl.int64,
    out_width: tl.int64, out_row_stride: tl.int64, seqlen_offset: tl.int64, fill_value: tl.int64, rows_aligned: tl.int64,
    PAGE_SIZE: tl.constexpr, PAGE_SHIFT: tl.constexpr, PAGES_PER_PROGRAM: tl.constexpr,
    HAS_START: tl.constexpr, HAS_SEQ_LENS_OUT: tl.constexpr, HAS_FILL: tl.constexpr, UNIT_STRIDES: tl.constexpr,
):
    """``out[b, p] = table[pool[b], start[b] + p * PAGE_SIZE] // PAGE_SIZE`` for the program's pages.

    PAGE_SHIFT: log2(PAGE_SIZE) for powers of two, else -1. UNIT_STRIDES: the index vectors are contiguous
    (the usual case), so their element addresses need no runtime multiply ahead of the row's loads.
    ``rows_aligned`` (a runtime flag, so that page 1 compiles once whatever the buffers): nonzero when the
    launcher found the table and ``out`` rows 16-byte aligned; with PAGE_SIZE == 1 and no start, whole
    blocks are then copied with 16-byte accesses.
    """
    row = tl.program_id(0)
    first = tl.program_id(1) * PAGES_PER_PROGRAM
    page = tl.max_contiguous(tl.multiple_of(first + tl.arange(0, PAGES_PER_PROGRAM), PAGES_PER_PROGRAM),
                             PAGES_PER_PROGRAM)
    # Known before the row's loads return: each page's first token inside the request, and the columns.
    position = page.to(tl.int64) * PAGE_SIZE
    in_width = page < out_width
    if UNIT_STRIDES:
        pool_stride, lens_stride, start_stride = 1, 1, 1
    # Independent scalar loads, issued together.
    pool = tl.load(pool_ptr + row * pool_stride).to(tl.int64)
    length = tl.load(lens_ptr + row * lens_stride).to(tl.int64) + seqlen_offset
    if HAS_START:
        start = tl.load(start_ptr + row * start_stride).to(tl.int64)
    if HAS_SEQ_LENS_OUT:
        if first == 0:
            tl.store(seq_lens_out_ptr + row, length.to(tl.int32))

    # Page p is written iff its first token lies inside the request and inside the table row, on a
    # readable row: p * PAGE_SIZE < limit = min(length, C - start), which is p < min(ceil(L / PAGE_SIZE),
    # ceil((C - start) / PAGE_SIZE)) with no division between the row's loads and the gather. (One limit
    # compiles to fewer dependent steps than separate predicates.)
    readable = (pool >= 0) & (pool < table_rows)
    table_row = table_ptr + pool * table_row_stride
    if HAS_START:
        readable = readable & (start >= 0)
        limit = tl.minimum(length, table_cols - start)
        table_row += start
    else:
        limit = tl.minimum(length, table_cols)
    limit = tl.where(readable, limit, 0)
    in_row = in_width & (position < limit)
    out_row = out_ptr + row.to(tl.int64) * out_row_stride

    if PAGE_SIZE == 1 and not HAS_START:
        if (rows_aligned != 0) & (first + PAGES_PER_PROGRAM <= tl.minimum(limit, out_width)):
            # A whole block of a page-1 copy: no masks, so the 16-byte-aligned rows get 16-byte accesses.
            # Streaming hints (table rows read once, evicted first; output stores marked .cs): 0.95x the
            # time of the same copy without them on the H200 (ci/perf_notes/page1_variants.py).
            values = tl.load(tl.multiple_of(table_row, 16) + page, eviction_policy="evict_first")
            tl.store(tl.multiple_of(out_row, 16) + page, values, cache_modifier=".cs")
        else:
            _write_pages(table_row, out_row, page, position, in_row, in_width, fill_value, PAGE_SIZE, PAGE_SHIFT,
                         HAS_FILL)
    else:
        _write_pages(table_row, out_row, page, position, in_row, in_width, fill_value, PAGE_SIZE, PAGE_SHIFT,
                     HAS_FILL)


@triton.jit
def _write_pages(table_row, out_row, page, position, in_row, in_width, fill_value,
                 PAGE_SIZE: tl.constexpr, PAGE_SHIFT: tl.constexpr, HAS_FILL: tl.constexpr):
    """Masked gather and store of one program's pages: the ``in_row`` ones are written, the other columns
    below the width get ``fill_value`` when HAS_FILL. A program past its row's pages has an empty mask:
    it loads and stores nothing (with HAS_FILL, it only fills)."""
    # The pool row is only dereferenced under in_row, which is empty when the row is unreadable.
    slots = tl.load(table_row + position, mask=in_row, other=0)
    if PAGE_SHIFT >= 0:
        values = slots >> PAGE_SHIFT  # arithmetic shift: floor division for negative slots too
    else:
        values = tl.where(slots >= 0, slots // PAGE_SIZE, ~((~slots) // PAGE_SIZE))
    if HAS_FILL:
        tl.store(out_row + page, tl.where(in_row, values, fill_value.to(tl.int32)), mask=in_width)
    else:
        tl.store(out_row + page, values, mask=in_row)


page_table_kernel = triton.jit(_page_table_kernel, do_not_specialize=RUNTIME_INTS,
                               do_not_specialize_on_alignment=POINTERS)
launcher = _launch.register(_launch.KernelLauncher(page_table_kernel, CONSTEXPRS))
_plans = _launch.plan_cache(on_clear=native.forget_plans)


def page_shift(page_size: int) -> int:
    """log2(page_size) for powers of two, else -1."""
    return page_size.bit_length() - 1 if page_size & (page_size - 1) == 0 else -1


def constexprs_for(page_size: int, has_start: bool, has_seq_lens_out: bool, has_fill: bool,
                   unit_strides: bool = True) -> dict:
    """The constexpr arguments of one specialisation (pages per program from ``kvdispatch.grid``)."""
    return dict(PAGE_SIZE=page_size, PAGE_SHIFT=page_shift(page_size),
                PAGES_PER_PROGRAM=launch_grid.items_per_program(launch_grid.PAGE_TABLE, page_size),
                HAS_START=has_start, HAS_SEQ_LENS_OUT=has_seq_lens_out, HAS_FILL=has_fill,
                UNIT_STRIDES=unit_strides)


def _build_plan(key, out, args):
    """The launch plan of ``key`` (``plan_key_and_arguments``), launching ``args`` when it compiles."""
    _, page_size, batch, width = key[:4]
    has_start, (has_seq_lens_out, has_fill, unit_strides) = key[6] is not None, key[7:10]
    geometry = launch_grid.page_table_launch(batch, width, page_size, writes_lengths=has_seq_lens_out)
    if geometry.grid[0] == 0:
        return _plans.add(key, _launch.nothing), False
    constexprs = constexprs_for(page_size, has_start, has_seq_lens_out, has_fill, unit_strides)
    specialisation = (page_size, has_start, has_seq_lens_out, has_fill, unit_strides) + key[4:7]
    warps = _launch.warps_for(out.device, geometry.threads)
    plan, launched = launcher.plan(key[0], specialisation, geometry.grid, constexprs, warps, args)
    kernel = launcher.native_kernel(key[0], specialisation, len(POINTERS) + len(RUNTIME_INTS))
    if kernel is not None:  # the compiled launcher takes this key's calls from now on
        native.add_page_table_plan(key, kernel, geometry.grid[1])
    return _plans.add(key, plan), launched


def build_page_table(req_to_token, req_pool_indices, seq_lens, out, page_size, kv_start_idx=None,
                     seqlen_offset=0, seq_lens_out=None, fill_value=None):
    """Write the paged block table into ``out`` (int32 ``[>= B, W]``); semantics of
    ``kvdispatch.reference.build_page_table``. Index vectors may be strided views.

    Untouched: rows ``>= B``; without ``fill_value``, the columns past each row's pages.
    Arguments arrive validated by ``kvdispatch._validate``.
    """
    key, args = plan_key_and_arguments(req_to_token, req_pool_indices, seq_lens, out, page_size, kv_start_idx,
                                       seqlen_offset, seq_lens_out, fill_value)
    plan = _plans.get(key)
    if plan is None:
        plan, launched = _build_plan(key, out, args)
        if launched:
            return out
    plan(*args)
    return out


def plan_key_and_arguments(req_to_token, req_pool_indices, seq_lens, out, page_size, kv_start_idx=None,
                           seqlen_offset=0, seq_lens_out=None, fill_value=None):
    """The launch-plan key of a call and the kernel's runtime arguments (tensors in the pointer slots),
    as ``native_launch.c`` computes them too. Key: device index, page size, batch, width, the dtypes of
    the pool, length and start vectors (None: no start), seq_lens_out given, fill_value given, unit strides.
    """
    has_start = kv_start_idx is not None
    has_seq_lens_out = seq_lens_out is not None
    has_fill = fill_value is not None
    # Each attribute is read once: on the host, every read costs about 0.1 us.
    rows, cols = req_to_token.shape
    table_stride, width, out_stride = req_to_token.stride(0), out.shape[1], out.stride(0)
    pool_stride, lens_stride = req_pool_indices.stride(0), seq_lens.stride(0)
    start_stride = kv_start_idx.stride(0) if has_start else 1
    unit_strides = pool_stride == 1 and lens_stride == 1 and start_stride == 1
    # Only page size 1 is a contiguous copy worth 16-byte accesses (larger pages are gathers of one word
    # per page); whether its rows allow them is a runtime argument, so buffers never add a compilation.
    aligned = (page_size == 1 and not has_start and out_stride % 4 == 0 and table_stride % 4 == 0
               and out.data_ptr() % 16 == 0 and req_to_token.data_ptr() % 16 == 0)
    key = (out.get_device(), page_size, req_pool_indices.shape[0], width, req_pool_indices.dtype,
           seq_lens.dtype, kv_start_idx.dtype if has_start else None, has_seq_lens_out, has_fill, unit_strides)
    args = (req_to_token, req_pool_indices, seq_lens, kv_start_idx if has_start else req_to_token, out,
            seq_lens_out if has_seq_lens_out else out, pool_stride, lens_stride, start_stride, rows, cols,
            table_stride, width, out_stride, seqlen_offset, fill_value if has_fill else 0, int(aligned))
    return key, args


def specializations(page_sizes=(1, 16, 32, 64, 128, 96), index_types=("i32", "i64")):
    """Every specialisation the launcher can produce for ``page_sizes``: yields ``(signature, constexprs)``
    in the form ``triton.compiler.ASTSource`` takes (Triton >= 3.3), for each option combination and
    each index dtype (the same for the pool, length and start vectors)."""
    flags = itertools.product((False, True), repeat=4)  # start, seq_lens_out, fill, unit strides
    for page_size, (has_start, has_seq_lens_out, has_fill, unit_strides), index in itertools.product(
            page_sizes, list(flags), index_types):
        signature = dict(table_ptr="*i32", pool_ptr=f"*{index}", lens_ptr=f"*{index}",
                         start_ptr=f"*{index}" if has_start else "*i32", out_ptr="*i32", seq_lens_out_ptr="*i32")
        signature.update({name: "i64" for name in RUNTIME_INTS})
        constexprs = constexprs_for(page_size, has_start, has_seq_lens_out, has_fill, unit_strides)
        signature.update({name: "constexpr" for name in constexprs})
        yield signature, constexprs
