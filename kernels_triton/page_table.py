"""Paged block table (FlashMLA-style) on the grid ``(batch, programs_per_row)`` of ``kvdispatch.grid``.

Program ``(b, k)`` of a row of ``T`` programs handles block ``k`` of ``PAGES_PER_PROGRAM`` pages of row ``b``
of ``out`` (phase 1). A row's blocks past its first ``T`` (its overflow, up to its real pages) are shared by
the programs of its group of ``GROUP_ROWS`` rows (phase 2), so a few long rows among short ones are served by
many programs rather than by their own ``T``; with one program per row (the batch at or above the budget)
each program instead handles its row's blocks ``k + T, k + 2T, ...`` itself. It loads the row's
pool index, length and start together, gathers one slot per page of a block in one round trip, and stores
the pages (16-byte accesses with streaming cache hints on page-1 rows the launcher found 16-byte aligned).
"""

from __future__ import annotations

import functools
import itertools

import triton
import triton.language as tl

from kvdispatch import grid as launch_grid

from . import launch as _launch
from . import native
from .specialization import Specialization, ast_signature, jit_function, warps

# The kernel's parameters, in the order it takes them. A call with no option (page size 1 included), whose
# table and output sizes and strides are all below 2**31 (any real ones), reads only the first six: the
# four pointers and two words that pack what it needs of the rest in 32-bit fields (``packed_words``):
# 48 bytes, one 64-byte line of the constant bank. On the H200 each further line a page-64 kernel read
# cost it 1.5-3% of its time, even a line needed only after the gather (benchmarks/ablation.py).
# The second line holds what the options read; the 64-bit path reads past it.
PARAMETERS = ("table_ptr", "pool_ptr", "lens_ptr", "out_ptr", "packed_table", "packed_out",
              "seqlen_offset", "fill_value", "out_width", "seq_lens_out_ptr", "start_ptr", "table_rows",
              "table_cols", "table_row_stride", "out_row_stride", "pool_stride", "lens_stride", "start_stride")
POINTERS = tuple(name for name in PARAMETERS if name.endswith("_ptr"))
RUNTIME_INTS = tuple(name for name in PARAMETERS if not name.endswith("_ptr"))
CONSTEXPRS = ("PAGE_SIZE", "PAGE_SHIFT", "PAGES_PER_PROGRAM", "HAS_START", "HAS_SEQ_LENS_OUT", "HAS_FILL",
              "HAS_OFFSET", "UNIT_STRIDES", "WIDE_INDEXING", "FOLDED_GRID", "ROUND_TOWARD_ZERO", "PDL")
WIDE = _launch.WIDE
# Rows whose programs share their overflow blocks (phase 2 of ``_page_table_kernel``): a fixed size, so the
# batch adds no compilation, and a scan of one warp's width.
GROUP_ROWS = tl.constexpr(32)


def _page_table_kernel(
    table_ptr, pool_ptr, lens_ptr, out_ptr, packed_table: tl.int64, packed_out: tl.int64,
    seqlen_offset: tl.int64, fill_value: tl.int64, out_width: tl.int64, seq_lens_out_ptr, start_ptr,
    table_rows: tl.int64, table_cols: tl.int64, table_row_stride: tl.int64, out_row_stride: tl.int64,
    pool_stride: tl.int64, lens_stride: tl.int64, start_stride: tl.int64,
    PAGE_SIZE: tl.constexpr, PAGE_SHIFT: tl.constexpr, PAGES_PER_PROGRAM: tl.constexpr,
    HAS_START: tl.constexpr, HAS_SEQ_LENS_OUT: tl.constexpr, HAS_FILL: tl.constexpr, HAS_OFFSET: tl.constexpr,
    UNIT_STRIDES: tl.constexpr, WIDE_INDEXING: tl.constexpr, FOLDED_GRID: tl.constexpr,
    ROUND_TOWARD_ZERO: tl.constexpr, PDL: tl.constexpr,
):
    """``out[b, p] = table[pool[b], start[b] + p * PAGE_SIZE] // PAGE_SIZE`` for the program's blocks of
    pages (floor division; truncation toward zero with ROUND_TOWARD_ZERO).

    Phase 1: program ``k`` of row ``b`` handles block ``k`` of ``PAGES_PER_PROGRAM`` pages (``T``:
    ``launch.programs_in_row``) as a width-sized grid's program does. Phase 2: rows ``[g, g + GROUP_ROWS)``
    (``g`` a multiple of GROUP_ROWS) form a group of ``M`` programs; the blocks of each of its rows past the
    first ``T`` up to the pages the row's length reaches (``_overflow_counts``: the row's real pages or more,
    read on the device; the width's with HAS_FILL) form one list in row order, and member ``m = (b - g) * T +
    k`` takes its items ``[m * s, (m + 1) * s)``, ``s = ceil(items / M)``: consecutive blocks, mostly of one
    row. It locates each one's row and block through the prefix sum of the group's overflow counts, which it
    computes itself (one load of GROUP_ROWS lengths issued with the row's inputs, a reduction within a warp,
    the prefix sum only where the program has an item; with HAS_FILL every row has the same count and no
    scan runs; no inter-program synchronisation), and gives it the row's own setup (``_overflow_block``). The
    list holds at most the width's blocks per row, whatever the lengths. Phase 2 runs only when some row can
    overflow (``T`` blocks short of the page bound) and a row has several programs; otherwise (one program
    per row, or ``T`` covering the width) program ``k`` handles its row's blocks ``k + T, k + 2T, ...``
    itself. ``seq_lens_out`` is written once per row, by program 0.

    PAGE_SHIFT: log2(PAGE_SIZE) for powers of two, else -1. HAS_OFFSET: ``seqlen_offset`` is not 0 (else
    it is not read). UNIT_STRIDES: the index vectors are contiguous (the usual case), so their element
    addresses need no runtime multiply ahead of the row's loads. WIDE_INDEXING: some size or stride is
    ``WIDE`` or more (``packed_words``; never in practice): the row then takes 64-bit arithmetic and reads
    the full-width parameters, as rows with a start always do; otherwise the kernel reads ``packed_table``
    and ``packed_out`` in their place. FOLDED_GRID: the row's programs span the grid's second and third
    dimensions (``launch.program_in_row``). PDL: launched with programmatic dependent launch
    (``launch.wait_for_producer``).
    """
    _launch.wait_for_producer(PDL)
    row = tl.program_id(0)
    program = _launch.program_in_row(FOLDED_GRID)
    first = program * PAGES_PER_PROGRAM
    if UNIT_STRIDES:
        pool_stride, lens_stride, start_stride = 1, 1, 1
    if not HAS_OFFSET:
        seqlen_offset = 0
    # Independent scalar loads, issued together; pool and length stay in their stored dtype.
    pool, length, start = _row_inputs(row, pool_ptr, lens_ptr, start_ptr, pool_stride, lens_stride, start_stride,
                                      HAS_START)
    if HAS_SEQ_LENS_OUT:
        if first == 0:
            tl.store(seq_lens_out_ptr + row, (length.to(tl.int64) + seqlen_offset).to(tl.int32))

    # Overflow blocks (a row's blocks past its first T) exist only when T blocks fall short of the pages a
    # row may have (``_row_geometry``); then, and when a row has several programs, they are shared within the
    # row's group (phase 2). A single program per row (the batch at or above the budget) keeps the row's own
    # loop.
    programs = _launch.programs_in_row(FOLDED_GRID)
    if HAS_FILL or HAS_START or WIDE_INDEXING:
        page_bound = out_width
    else:
        page_bound = (packed_out.to(tl.int64) & 0x7FFFFFFF).to(tl.int32)
    deal = (programs > 1) & (programs * PAGES_PER_PROGRAM < page_bound)
    # The row's group: GROUP_ROWS consecutive rows whose programs share the group's overflow blocks.
    batch = tl.num_programs(0)
    group_first = row - row % GROUP_ROWS
    group_rows = group_first + tl.arange(0, GROUP_ROWS)
    in_group = group_rows < tl.where(deal, batch, 0)
    if not HAS_FILL:
        # The group's lengths, loaded with the row's inputs so that they overlap its first gather.
        group_lengths = tl.load(lens_ptr + group_rows * lens_stride, mask=in_group, other=0)

    # Phase 1: block k of the row, as a width-sized grid's program k.
    (row_ptr, out_row, column_limit, position_offset, position_limit, whole_rows, whole_limit, whole_table_row,
     whole_out_row, pages_end) = _row_block(
        row, pool, length, start, first, table_ptr, out_ptr, packed_table, packed_out, seqlen_offset, fill_value,
        out_width, table_rows, table_cols, table_row_stride, out_row_stride, PAGE_SIZE, PAGE_SHIFT,
        PAGES_PER_PROGRAM, HAS_START, HAS_FILL, HAS_OFFSET, WIDE_INDEXING, ROUND_TOWARD_ZERO)
    whole_blocks: tl.constexpr = PAGE_SIZE == 1 and not HAS_START and not WIDE_INDEXING
    if deal:
        group_size = tl.minimum(batch - group_first, GROUP_ROWS).to(tl.int64)
        members = group_size * programs
        member = (row - group_first).to(tl.int64) * programs + program
        if HAS_FILL:
            # Every row covers the width: the same overflow count for all, no scan. Member m = (row -
            # group_first) * T + k of the group's M programs takes the items m, m + M, ... of the group's
            # overflow blocks in row order: the costly ones (a row's real pages) and the fills are spread
            # over every member.
            per_row = (out_width.to(tl.int64) + (PAGES_PER_PROGRAM - 1)) // PAGES_PER_PROGRAM - programs
            for item in range(member, group_size * per_row, members):
                _overflow_block(group_first + item // per_row, (programs + item % per_row) * PAGES_PER_PROGRAM,
                                table_ptr, pool_ptr, lens_ptr, start_ptr, out_ptr, packed_table, packed_out,
                                seqlen_offset, fill_value, out_width, table_rows, table_cols, table_row_stride,
                                out_row_stride, pool_stride, lens_stride, start_stride, PAGE_SIZE, PAGE_SHIFT,
                                PAGES_PER_PROGRAM, HAS_START, HAS_FILL, HAS_OFFSET, WIDE_INDEXING, ROUND_TOWARD_ZERO)
        else:
            # Every row of the group has at least ``passes * T`` blocks (or passes is 1): the row's programs
            # handle its blocks below passes * T themselves, as without phase 2, and the blocks past them
            # (``_overflow_counts``) form the group's list in row order. Member m takes the items [m * s,
            # (m + 1) * s), s = ceil(items / M): consecutive blocks, mostly of one row, located through the
            # prefix sum of the counts, taken only where the program has an item.
            # Nothing to share unless some row of the group has more than T blocks: one reduction decides it.
            longest = _request_length(tl.max(group_lengths, 0), seqlen_offset, HAS_OFFSET)
            if longest > programs.to(tl.int64) * (PAGES_PER_PROGRAM * PAGE_SIZE):
                overflow, passes = _overflow_counts(group_lengths, in_group, seqlen_offset, page_bound, programs,
                                                    PAGE_SIZE, PAGES_PER_PROGRAM, HAS_OFFSET)
                step = programs * PAGES_PER_PROGRAM
                for later in range(first + step, tl.minimum(pages_end, passes * step), step):
                    _page_block(later, row_ptr, out_row, column_limit, position_offset, position_limit, out_width,
                                fill_value, whole_rows, whole_limit, whole_table_row, whole_out_row, PAGE_SIZE,
                                PAGE_SHIFT, PAGES_PER_PROGRAM, HAS_FILL, whole_blocks, ROUND_TOWARD_ZERO)
                items = tl.sum(overflow, 0)
                if items > 0:
                    item, items_end = _launch.member_items(items, members, member)
                    if item < items_end:
                        ends = tl.cumsum(overflow, 0)  # inclusive prefix sums
                        while item < items_end:
                            in_group_row, index = _launch.locate_item(item, ends, overflow, group_rows - group_first)
                            block = passes * programs + index
                            _overflow_block(group_first + in_group_row, block * PAGES_PER_PROGRAM, table_ptr,
                                            pool_ptr, lens_ptr, start_ptr, out_ptr, packed_table, packed_out,
                                            seqlen_offset, fill_value, out_width, table_rows, table_cols,
                                            table_row_stride, out_row_stride, pool_stride, lens_stride, start_stride,
                                            PAGE_SIZE, PAGE_SHIFT, PAGES_PER_PROGRAM, HAS_START, HAS_FILL, HAS_OFFSET,
                                            WIDE_INDEXING, ROUND_TOWARD_ZERO)
                            item += 1
    else:
        # The row's further blocks, up to its real pages (``_row_geometry``), computed after the first block's
        # gather is on its way.
        step = programs * PAGES_PER_PROGRAM
        for later in range(first + step, pages_end, step):
            _page_block(later, row_ptr, out_row, column_limit, position_offset, position_limit, out_width,
                        fill_value, whole_rows, whole_limit, whole_table_row, whole_out_row, PAGE_SIZE, PAGE_SHIFT,
                        PAGES_PER_PROGRAM, HAS_FILL, whole_blocks, ROUND_TOWARD_ZERO)
    _launch.release_dependents(PDL)


@triton.jit
def _overflow_block(row, first, table_ptr, pool_ptr, lens_ptr, start_ptr, out_ptr, packed_table, packed_out,
                    seqlen_offset, fill_value, out_width, table_rows, table_cols, table_row_stride, out_row_stride,
                    pool_stride, lens_stride, start_stride, PAGE_SIZE: tl.constexpr, PAGE_SHIFT: tl.constexpr,
                    PAGES_PER_PROGRAM: tl.constexpr, HAS_START: tl.constexpr, HAS_FILL: tl.constexpr,
                    HAS_OFFSET: tl.constexpr, WIDE_INDEXING: tl.constexpr, ROUND_TOWARD_ZERO: tl.constexpr):
    """The block of pages ``[first, first + PAGES_PER_PROGRAM)`` of row ``row``, with the row's own setup
    (``_row_inputs``, ``_row_block``): an overflow item of phase 2."""
    pool, length, start = _row_inputs(row, pool_ptr, lens_ptr, start_ptr, pool_stride, lens_stride, start_stride,
                                      HAS_START)
    _row_block(row, pool, length, start, first, table_ptr, out_ptr, packed_table, packed_out, seqlen_offset,
               fill_value, out_width, table_rows, table_cols, table_row_stride, out_row_stride, PAGE_SIZE,
               PAGE_SHIFT, PAGES_PER_PROGRAM, HAS_START, HAS_FILL, HAS_OFFSET, WIDE_INDEXING, ROUND_TOWARD_ZERO)


@triton.jit
def _row_block(row, pool, length, start, first, table_ptr, out_ptr, packed_table, packed_out, seqlen_offset,
               fill_value, out_width, table_rows, table_cols, table_row_stride, out_row_stride,
               PAGE_SIZE: tl.constexpr, PAGE_SHIFT: tl.constexpr, PAGES_PER_PROGRAM: tl.constexpr,
               HAS_START: tl.constexpr, HAS_FILL: tl.constexpr, HAS_OFFSET: tl.constexpr,
               WIDE_INDEXING: tl.constexpr, ROUND_TOWARD_ZERO: tl.constexpr):
    """The block of pages at ``first`` of row ``row`` (its inputs from ``_row_inputs``); returns the row's
    geometry, ``_row_geometry``'s tuple, for its further blocks."""
    geometry = _row_geometry(row, pool, length, start, table_ptr, out_ptr, packed_table, packed_out, seqlen_offset,
                             out_width, table_rows, table_cols, table_row_stride, out_row_stride, PAGE_SIZE,
                             HAS_START, HAS_FILL, HAS_OFFSET, WIDE_INDEXING)
    (row_ptr, out_row, column_limit, position_offset, position_limit, whole_rows, whole_limit, whole_table_row,
     whole_out_row, _) = geometry
    whole_blocks: tl.constexpr = PAGE_SIZE == 1 and not HAS_START and not WIDE_INDEXING
    _page_block(first, row_ptr, out_row, column_limit, position_offset, position_limit, out_width, fill_value,
                whole_rows, whole_limit, whole_table_row, whole_out_row, PAGE_SIZE, PAGE_SHIFT, PAGES_PER_PROGRAM,
                HAS_FILL, whole_blocks, ROUND_TOWARD_ZERO)
    return geometry


@triton.jit
def _row_inputs(row, pool_ptr, lens_ptr, start_ptr, pool_stride, lens_stride, start_stride,
                HAS_START: tl.constexpr):
    """``(pool, length, start)`` of row ``row``, pool and length in their stored dtype, the start in int64 (0
    without HAS_START)."""
    start = 0
    pool = tl.load(pool_ptr + row * pool_stride)
    length = tl.load(lens_ptr + row * lens_stride)
    if HAS_START:
        start = tl.load(start_ptr + row * start_stride).to(tl.int64)
    return pool, length, start


@triton.jit
def _overflow_counts(lengths, in_group, seqlen_offset, page_bound, programs, PAGE_SIZE: tl.constexpr,
                     PAGES_PER_PROGRAM: tl.constexpr, HAS_OFFSET: tl.constexpr):
    """``(overflow, passes)`` of a group of rows, from their lengths alone (phase 2 of ``_page_table_kernel``;
    ``launch.group_overflow`` of the pages below ``page_bound`` and each row's request length). At least the
    row's real overflow: a row whose pool index or start is out of range, or whose table row ends first, is
    counted as far as its length reaches, and its surplus items write nothing (``_overflow_block`` masks a
    block by the row's own limits). Never used with HAS_FILL, where every row covers the width."""
    pages = _launch.pages_below(_request_length(lengths, seqlen_offset, HAS_OFFSET), page_bound, PAGE_SIZE)
    return _launch.group_overflow(pages, in_group, programs, PAGES_PER_PROGRAM)


@triton.jit
def _row_geometry(row, pool, length, start, table_ptr, out_ptr, packed_table, packed_out, seqlen_offset, out_width,
                  table_rows, table_cols, table_row_stride, out_row_stride, PAGE_SIZE: tl.constexpr,
                  HAS_START: tl.constexpr, HAS_FILL: tl.constexpr, HAS_OFFSET: tl.constexpr,
                  WIDE_INDEXING: tl.constexpr):
    """What ``_page_block`` needs of row ``row`` (its inputs from ``_row_inputs``), and the pages its
    programs cover (``pages_end``, in int64: ``W`` with HAS_FILL, every column getting a value or the fill,
    else its real pages, 0 on an unreadable row, never more than ``W``): ``(row_ptr, out_row, column_limit,
    position_offset, position_limit, whole_rows, whole_limit, whole_table_row, whole_out_row, pages_end)``.

    Page p is written iff p < W and its first token lies inside the request and inside the table row, on a
    readable row: 0 <= pool < R (and start >= 0), p * PAGE_SIZE < L and p * PAGE_SIZE < C - start."""
    request_length = _request_length(length, seqlen_offset, HAS_OFFSET)
    if HAS_START or WIDE_INDEXING:
        out_row = out_ptr + row.to(tl.int64) * out_row_stride
        row_ptr, position_limit = _row_64bit(table_ptr, pool, request_length, start, table_rows, table_cols,
                                             table_row_stride)
        column_limit, position_offset = out_width, 0
        whole_rows = row < 0  # no whole blocks on this path
        whole_table_row, whole_out_row = row_ptr, out_row
        pages_end = _launch.pages_below(position_limit, out_width, PAGE_SIZE)
    else:
        # Already 64-bit when compiled (the annotation); the interpreter types a small int as 32-bit.
        packed_table, packed_out = packed_table.to(tl.int64), packed_out.to(tl.int64)
        row_stride32 = (packed_table >> 32).to(tl.uint32)
        column_limit = (packed_out & 0x7FFFFFFF).to(tl.int32)
        out_row = out_ptr + row.to(tl.int64) * (packed_out >> 32)
        # Unsigned compares: negative indices are out of range too.
        if pool.dtype == tl.int32:
            readable = pool.to(tl.uint32, bitcast=True) < (packed_table & 0xFFFFFFFF).to(tl.uint32)
        else:
            readable = pool.to(tl.uint64, bitcast=True) < (packed_table & 0xFFFFFFFF).to(tl.uint64)
        row_ptr, position_limit = _row_narrow(table_ptr, pool, length, readable, row_stride32)
        position_offset = seqlen_offset
        whole_rows = (((packed_out >> 31) & 1) != 0) & readable
        # The rows of the page-1 whole blocks, 16-byte aligned where they are taken. The hints sit on values
        # computed here: a hint on a jit function's argument would not reach the inlined kernel.
        whole_table_row = tl.multiple_of(table_ptr + pool.to(tl.int64) * row_stride32.to(tl.int64), 16)
        whole_out_row = tl.multiple_of(out_row, 16)
        pages_end = tl.where(readable, _launch.pages_below(request_length, column_limit, PAGE_SIZE), 0)
    if HAS_FILL:
        pages_end = out_width.to(tl.int64) + request_length * 0
    return (row_ptr, out_row, column_limit, position_offset, position_limit, whole_rows,
            tl.minimum(request_length, column_limit), whole_table_row, whole_out_row, pages_end)


@triton.jit
def _page_block(first, row_ptr, out_row, column_limit, position_offset, position_limit, out_width, fill_value,
                whole_rows, whole_limit, whole_table_row, whole_out_row, PAGE_SIZE: tl.constexpr,
                PAGE_SHIFT: tl.constexpr, PAGES_PER_PROGRAM: tl.constexpr, HAS_FILL: tl.constexpr,
                WHOLE_BLOCKS: tl.constexpr, ROUND_TOWARD_ZERO: tl.constexpr):
    """Pages ``[first, first + PAGES_PER_PROGRAM)`` of a row (``first`` a multiple of PAGES_PER_PROGRAM): page
    ``p`` is written iff ``p < column_limit`` and ``p * PAGE_SIZE - position_offset < position_limit``, from
    ``row_ptr + p * PAGE_SIZE``; with HAS_FILL the other columns below ``out_width`` get ``fill_value``.
    WHOLE_BLOCKS (page 1 without a start, narrow indexing): a block below ``whole_limit`` (the request's length
    and the column limit) of a readable row whose table and ``out`` rows are 16-byte aligned (``whole_rows``)
    is copied without masks, from ``whole_table_row`` to ``whole_out_row`` (the rows, hinted 16-byte aligned
    by the caller)."""
    page = tl.max_contiguous(tl.multiple_of(first + tl.arange(0, PAGES_PER_PROGRAM), PAGES_PER_PROGRAM),
                             PAGES_PER_PROGRAM)
    # Each page's first token inside the request.
    position = page.to(tl.int64) * PAGE_SIZE
    in_width = page < out_width  # read (from the second constant line) only where used
    below = position - position_offset  # inside the request iff below < position_limit
    if position_limit.dtype == tl.int32:  # exact: below >= -(2**31 - 1), and no int32 length reaches 2**31
        below = tl.minimum(below, 2**31 - 1).to(tl.int32)
    # Masks combine blocks only (Triton 3.9's interpreter takes no mask made from a scalar and a block).
    in_row = (page < column_limit) & (below < position_limit)
    # ``source`` (each page's slot address) is only dereferenced under in_row, which is empty when the row
    # is unreadable.
    source = row_ptr + position
    if WHOLE_BLOCKS:
        # Whole blocks of a page-1 copy: no masks, so the 16-byte-aligned rows get 16-byte accesses.
        if whole_rows & (first + PAGES_PER_PROGRAM <= whole_limit):
            # Streaming hints (table rows read once, evicted first; output stores marked .cs): 0.95x the
            # time of the same copy without them on the H200 (benchmarks/page1_variants.py).
            values = tl.load(whole_table_row + page, eviction_policy="evict_first")
            tl.store(whole_out_row + page, values, cache_modifier=".cs")
        else:
            _write_pages(source, out_row, page, in_row, in_width, fill_value, PAGE_SIZE, PAGE_SHIFT, HAS_FILL,
                         ROUND_TOWARD_ZERO)
    else:
        _write_pages(source, out_row, page, in_row, in_width, fill_value, PAGE_SIZE, PAGE_SHIFT, HAS_FILL,
                     ROUND_TOWARD_ZERO)


@triton.jit
def _row_narrow(table_ptr, pool, length, readable, row_stride32):
    """``(row address, position limit)`` of a row when every size and stride is below 2**31
    (``packed_words``): a readable pool index then fits in 32 bits, so the row offset is one widening
    multiply, and the range tests are single compares in the length's dtype (an unreadable row's limit is
    below every page's ``position - seqlen_offset``)."""
    # Only dereferenced where readable, where the index and the stride are in [0, 2**31): an unsigned
    # 32 x 32 -> 64-bit multiply is exact there (and compiles to one instruction).
    index = pool.to(tl.int32).to(tl.uint32, bitcast=True)
    row_offset = (index.to(tl.uint64) * row_stride32.to(tl.uint64)).to(tl.int64, bitcast=True)
    floor = -(2**31) if length.dtype == tl.int32 else -(2**63)
    return table_ptr + row_offset, tl.where(readable, length, floor)


@triton.jit
def _request_length(length, seqlen_offset, HAS_OFFSET: tl.constexpr):
    """``seq_lens[b] + seqlen_offset`` in int64, exact wherever it decides a page: with an offset (32-bit),
    an int64 length is first clamped into [-2**62, 2**62], which no table comes near, so the sum cannot
    wrap. An int32 length, or no offset, needs no clamp."""
    if HAS_OFFSET:
        if length.dtype == tl.int64:
            length = tl.minimum(tl.maximum(length, -(2**62)), 2**62)
    return length.to(tl.int64) + seqlen_offset


@triton.jit
def _row_64bit(table_ptr, pool, request_length, start, table_rows, table_cols, table_row_stride):
    """``(row address, position limit)`` of a row that starts at column ``start`` (0 without one) in 64-bit
    arithmetic throughout: rows with a start, and tables of 2**31 rows or more, or rows 2**31 apart.
    ``request_length``: ``_request_length``. The limit, ``min(L, C - start)``, is 0 on an unreadable row
    (``table_cols - start`` only counts where readable, then ``0 <= start``); the row address is only
    dereferenced below it."""
    pool = pool.to(tl.int64)
    readable = (pool >= 0) & (pool < table_rows) & (start >= 0)
    limit = tl.where(readable, tl.minimum(request_length, table_cols - start), 0)
    return table_ptr + pool * table_row_stride + start, limit


@triton.jit
def _write_pages(source, out_row, page, in_row, in_width, fill_value,
                 PAGE_SIZE: tl.constexpr, PAGE_SHIFT: tl.constexpr, HAS_FILL: tl.constexpr,
                 ROUND_TOWARD_ZERO: tl.constexpr):
    """Masked gather and store of one program's pages: the ``in_row`` ones are written, the other columns
    below the width get ``fill_value`` when HAS_FILL. A program past its row's pages has an empty mask:
    it loads and stores nothing (with HAS_FILL, it only fills)."""
    # ``source`` (each page's slot address) is only dereferenced under in_row, which is empty when the row
    # is unreadable.
    slots = tl.load(source, mask=in_row, other=0)
    values = _launch.divide(slots, PAGE_SIZE, PAGE_SHIFT, ROUND_TOWARD_ZERO)
    if HAS_FILL:
        tl.store(out_row + page, tl.where(in_row, values, fill_value.to(tl.int32)), mask=in_width)
    else:
        tl.store(out_row + page, values, mask=in_row)


page_table_kernel = triton.jit(_page_table_kernel, do_not_specialize=RUNTIME_INTS,
                               do_not_specialize_on_alignment=POINTERS)
launcher = _launch.register(_launch.KernelLauncher(page_table_kernel, CONSTEXPRS))
_plans = _launch.plan_cache(on_clear=functools.partial(native.forget_plans, "page_table"))


def page_shift(page_size: int) -> int:
    """log2(page_size) for powers of two, else -1."""
    return page_size.bit_length() - 1 if page_size & (page_size - 1) == 0 else -1


def constexprs_for(page_size: int, has_start: bool, has_seq_lens_out: bool, has_fill: bool,
                   unit_strides: bool = True, wide_indexing: bool = False, has_offset: bool = False,
                   folded_grid: bool = False, round_toward_zero: bool = False, pdl: bool = False) -> dict:
    """The constexpr arguments of one specialisation (pages per program from ``kvdispatch.grid``)."""
    return dict(PAGE_SIZE=page_size, PAGE_SHIFT=page_shift(page_size),
                PAGES_PER_PROGRAM=launch_grid.items_per_program(launch_grid.PAGE_TABLE, page_size),
                HAS_START=has_start, HAS_SEQ_LENS_OUT=has_seq_lens_out, HAS_FILL=has_fill, HAS_OFFSET=has_offset,
                UNIT_STRIDES=unit_strides, WIDE_INDEXING=wide_indexing, FOLDED_GRID=folded_grid,
                ROUND_TOWARD_ZERO=round_toward_zero, PDL=pdl)


def packed_words(rows: int, table_stride: int, cols: int, width: int, out_stride: int, page_size: int,
                 rows_aligned: bool) -> tuple[int, int] | None:
    """The kernel's ``packed_table`` and ``packed_out``: what a call without a start needs of the sizes,
    strides and flags, in 32-bit fields, so that its parameters fit one constant-cache line; None when
    a value does not fit (``WIDE``: the kernel then takes 64-bit arithmetic and the full-width parameters).

    packed_table: rows (bits 0-31) | table row stride (bits 32-63).
    packed_out: page limit, min(W, pages that start inside a table row) (bits 0-30) | rows_aligned
    (bit 31: the table and ``out`` rows are 16-byte aligned, for page 1's wide copy) | out row stride
    (bits 32-63).
    """
    if (rows | table_stride | width | out_stride) >= WIDE:  # one of them is (none is negative)
        return None
    return rows | table_stride << 32, min(width, -(-cols // page_size)) | rows_aligned << 31 | out_stride << 32


def _build_plan(key, out, args):
    """The launch plan of ``key`` (``plan_key_and_arguments``), launching ``args`` when it compiles
    (``launch.build_plan``)."""
    _, page_size, batch, width = key[:4]
    has_start, flags = key[6] is not None, key[7:12]  # seq_lens_out, fill, unit strides, wide, offset
    geometry = launch_grid.page_table_launch(batch, width, page_size, writes_lengths=flags[0],
                                             budget=_launch.program_budget(out.device))
    round_toward_zero, pdl = key[12:14]
    constexprs = constexprs_for(page_size, has_start, *flags, folded_grid=geometry.folded,
                                round_toward_zero=round_toward_zero, pdl=pdl)
    specialisation = (page_size, has_start, *flags, geometry.folded) + key[4:7] + (round_toward_zero, pdl)
    return _launch.build_plan(_plans, launcher, key, args, out.device, geometry, specialisation, constexprs)


def build_page_table(req_to_token, req_pool_indices, seq_lens, out, page_size, kv_start_idx=None,
                     seqlen_offset=0, seq_lens_out=None, fill_value=None, round_toward_zero=False, pdl=False):
    """Write the paged block table into ``out`` (int32 ``[>= B, W]``); semantics of
    ``kvdispatch.ops.page_table.reference``. Index vectors may be strided views. ``pdl``: launch with
    programmatic dependent launch where the device supports it (``launch.KernelLauncher.plan``).

    Untouched: rows ``>= B``; without ``fill_value``, the columns past each row's pages.
    Arguments arrive validated (the op's ``check_arguments``).
    """
    key, args = plan_key_and_arguments(req_to_token, req_pool_indices, seq_lens, out, page_size, kv_start_idx,
                                       seqlen_offset, seq_lens_out, fill_value, round_toward_zero, pdl)
    _launch.launch_through_plan(_plans, key, args, lambda: _build_plan(key, out, args))
    return out


def plan_key_and_arguments(req_to_token, req_pool_indices, seq_lens, out, page_size, kv_start_idx=None,
                           seqlen_offset=0, seq_lens_out=None, fill_value=None, round_toward_zero=False, pdl=False):
    """The launch-plan key of a call and the kernel's runtime arguments (tensors in the pointer slots). Key:
    device index, page size, batch, width, the dtypes of the pool, length and start vectors (None: no start),
    seq_lens_out given, fill_value given, unit strides, wide indexing (no start, and no ``packed_words``),
    seqlen_offset not 0, round_toward_zero, pdl.
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
    packed = None if has_start else packed_words(rows, table_stride, cols, width, out_stride, page_size, aligned)
    packed_table, packed_out = packed or (0, 0)
    key = (out.get_device(), page_size, req_pool_indices.shape[0], width, req_pool_indices.dtype,
           seq_lens.dtype, kv_start_idx.dtype if has_start else None, has_seq_lens_out, has_fill, unit_strides,
           packed is None and not has_start, seqlen_offset != 0, round_toward_zero, pdl)
    args = (req_to_token, req_pool_indices, seq_lens, out, packed_table, packed_out, seqlen_offset,
            fill_value if has_fill else 0, width, seq_lens_out if has_seq_lens_out else out,
            kv_start_idx if has_start else req_to_token, rows, cols, table_stride, out_stride, pool_stride,
            lens_stride, start_stride)
    return key, args


# The page sizes compiled ahead of time (``crosscompile``, the warm-up): the common ones, and 96 for a size
# that is not a power of two.
SPECIALISED_PAGE_SIZES = (1, 16, 32, 64, 128, 96)


def compile_specializations(warp_size, page_sizes, index_types):
    """The kernel's ``Specialization``s (``kernels_triton.specialization``), those of ``_ast_sources``."""
    kernel = jit_function(page_table_kernel, POINTERS, RUNTIME_INTS)
    for signature, constexprs in _ast_sources(page_sizes, index_types):
        threads = launch_grid.page_table_launch(1, 1, constexprs["PAGE_SIZE"]).threads
        yield Specialization(kernel, signature, constexprs, warps(threads, warp_size))


def _ast_sources(page_sizes, index_types):
    """Every specialisation the launcher can produce for ``page_sizes``: yields ``(signature, constexprs)``
    in the form ``triton.compiler.ASTSource`` takes (Triton >= 3.3), for each option combination, grid
    form and index dtype (the same for the pool, length and start vectors). Rounding toward zero (as
    ``kvdispatch.compat.sglang`` calls) comes only with or without a start, no other option."""
    # start, seq_lens_out, fill, unit strides, wide indexing (only without a start), offset, folded grid,
    # round toward zero
    flags = [f for f in itertools.product((False, True), repeat=8)
             if not (f[0] and f[4]) and not (f[7] and any(f[i] for i in (1, 2, 4, 5)))]
    for page_size, (has_start, *options), index in itertools.product(page_sizes, flags, index_types):
        types = dict(pool_ptr=f"*{index}", lens_ptr=f"*{index}", start_ptr=f"*{index}" if has_start else "*i32")
        constexprs = constexprs_for(page_size, has_start, *options)
        yield ast_signature(PARAMETERS, constexprs, types), constexprs


# The ops this module launches: ``kernels_triton.KERNELS`` reads them from this source, without importing it.
OP_LAUNCHERS = {"page_table": build_page_table}
