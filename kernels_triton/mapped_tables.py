"""Page tables translated through a lookup table, on the grid ``(batch, programs_per_row)`` of ``kvdispatch.grid``.

Two kernels, one per op, with the page table's row logic (``page_table.py``) and a lookup after the gather:

* ``mha_page_table_kernel``: the TRT-LLM MHA page table and, with HAS_SWA, its sliding-window twin read
  through ``full_to_swa`` from the same slots (``kvdispatch.create_trtllm_mha_page_table``);
* ``translated_page_table_kernel``: the unified pool's table, virtual pages translated by ``v2p`` and
  scaled (``kvdispatch.create_translated_page_table``).

Program ``(b, k)`` owns pages ``[k * PAGES_PER_PROGRAM, (k + 1) * PAGES_PER_PROGRAM)`` of row ``b``; a program
past its row's pages loads and stores nothing. The MHA table's program ``k`` of a row of ``T`` then handles
the row's blocks ``k + T, k + 2T, ...``; the translated table shares the blocks past each row's first ``T``
among the programs of its group of rows, as the page table does (``page_table._page_table_kernel``, phase 2).
Sizes and strides are runtime ints (one compilation per page size and option set, whatever the shapes), in
64-bit arithmetic; masks are blocks only.
"""

from __future__ import annotations

import functools
import itertools

import triton
import triton.language as tl

from kvdispatch import grid as launch_grid

from . import launch as _launch
from . import native
from .page_table import GROUP_ROWS, page_shift
from .specialization import Specialization, ast_signature, jit_function, warps

MHA_PARAMETERS = ("table_ptr", "pool_ptr", "lens_ptr", "page_table_ptr", "swa_ptr", "mapping_ptr", "table_rows",
                  "table_cols", "table_row_stride", "width", "page_table_stride", "swa_width", "swa_stride",
                  "mapping_len", "pool_stride", "lens_stride", "seqlen_offset")
MHA_CONSTEXPRS = ("PAGE_SIZE", "PAGE_SHIFT", "PAGES_PER_PROGRAM", "HAS_SWA", "ROUND_TOWARD_ZERO", "UNIT_STRIDES",
                  "FOLDED_GRID", "PDL", "HAS_OFFSET")
# What every call reads fills the first 64 bytes (one constant-bank line): the pointers, two packed words
# (``translated_packed_words``) and the map's length; the full-width values and the options' values follow.
TRANSLATED_PARAMETERS = ("table_ptr", "pool_ptr", "lens_ptr", "v2p_ptr", "out_ptr", "packed_table", "packed_out",
                         "v2p_len", "table_rows", "table_row_stride", "page_limit", "out_row_stride", "multiplier",
                         "seq_len_delta", "pool_stride", "lens_stride", "fill_value", "fill_width")
TRANSLATED_CONSTEXPRS = ("PAGE_SIZE", "PAGE_SHIFT", "PAGES_PER_PROGRAM", "HAS_MULTIPLIER", "HAS_DELTA",
                         "UNIT_STRIDES", "WIDE_INDEXING", "FOLDED_GRID", "HAS_FILL", "PDL")


@triton.jit
def row_limit(pool_ptr, lens_ptr, row, pool_stride, lens_stride, table_rows, table_cols, length_offset,
              HAS_OFFSET: tl.constexpr):
    """``(pool, limit)`` of row ``row``: its pool index (int64) and the positions its pages may start below,
    ``min(L, C)`` with ``L = seq_lens[row] + length_offset`` on a readable row, 0 otherwise. With an offset an
    int64 length is clamped into [-2**62, 2**62] first (no table comes near): the sum cannot wrap."""
    pool = tl.load(pool_ptr + row * pool_stride).to(tl.int64)
    length = tl.load(lens_ptr + row * lens_stride).to(tl.int64)
    if HAS_OFFSET:
        length = tl.minimum(tl.maximum(length, -(2**62)), 2**62) + length_offset
    readable = (pool >= 0) & (pool < table_rows)
    return pool, tl.where(readable, tl.minimum(length, table_cols), 0)


def _mha_page_table_kernel(
    table_ptr, pool_ptr, lens_ptr, page_table_ptr, swa_ptr, mapping_ptr, table_rows: tl.int64,
    table_cols: tl.int64, table_row_stride: tl.int64, width: tl.int64, page_table_stride: tl.int64,
    swa_width: tl.int64, swa_stride: tl.int64, mapping_len: tl.int64, pool_stride: tl.int64, lens_stride: tl.int64,
    seqlen_offset: tl.int64, PAGE_SIZE: tl.constexpr, PAGE_SHIFT: tl.constexpr, PAGES_PER_PROGRAM: tl.constexpr,
    HAS_SWA: tl.constexpr, ROUND_TOWARD_ZERO: tl.constexpr, UNIT_STRIDES: tl.constexpr, FOLDED_GRID: tl.constexpr,
    PDL: tl.constexpr, HAS_OFFSET: tl.constexpr,
):
    """``slot = table[pool[b], p * PAGE_SIZE]``; ``page_table[b, p] = slot // PAGE_SIZE`` for ``p < width`` and,
    with HAS_SWA, ``swa[b, p] = mapping[clamp(slot, 0, mapping_len - 1)] // PAGE_SIZE`` (low 32 bits) for
    ``p < swa_width``, over the row's pages. HAS_SWA only with ``mapping_len > 0``; without it ``swa_ptr`` and
    ``mapping_ptr`` are not read. Program ``k`` of a row handles its blocks of PAGES_PER_PROGRAM pages ``k, k +
    T, ...`` (``T``: ``launch.programs_in_row``) up to the row's last page, the row's length ``seq_lens[b] +
    seqlen_offset`` (HAS_OFFSET: the offset is not 0, else it is not read). PAGE_SHIFT: log2(PAGE_SIZE) for
    powers of two, else -1. UNIT_STRIDES: the index vectors are contiguous. FOLDED_GRID:
    ``launch.program_in_row``."""
    _launch.wait_for_producer(PDL)
    if UNIT_STRIDES:
        pool_stride, lens_stride = 1, 1
    row = tl.program_id(0).to(tl.int64)
    first = _launch.program_in_row(FOLDED_GRID) * PAGES_PER_PROGRAM
    pool, limit = row_limit(pool_ptr, lens_ptr, row, pool_stride, lens_stride, table_rows, table_cols, seqlen_offset,
                            HAS_OFFSET)
    row_ptr = table_ptr + pool * table_row_stride  # only dereferenced below the limit, 0 on an unreadable row
    mha_row(first, row_ptr, limit, page_table_ptr + row * page_table_stride, width, swa_ptr + row * swa_stride,
            swa_width, mapping_ptr, mapping_len, PAGE_SIZE, PAGE_SHIFT, PAGES_PER_PROGRAM, HAS_SWA,
            ROUND_TOWARD_ZERO, FOLDED_GRID)
    _launch.release_dependents(PDL)


@triton.jit
def mha_row(first, row_ptr, limit, page_table_row, width, swa_row, swa_width, mapping_ptr, mapping_len,
            PAGE_SIZE: tl.constexpr, PAGE_SHIFT: tl.constexpr, PAGES_PER_PROGRAM: tl.constexpr,
            HAS_SWA: tl.constexpr, ROUND_TOWARD_ZERO: tl.constexpr, FOLDED_GRID: tl.constexpr):
    """The blocks of a row this program owns (``_mha_pages`` each): the one of page ``first``, then every
    ``launch.programs_in_row``-th block after it, up to the row's last page below ``limit`` positions."""
    if first.to(tl.int64) * PAGE_SIZE < limit:
        _mha_pages(first, row_ptr, limit, page_table_row, width, swa_row, swa_width, mapping_ptr, mapping_len,
                   PAGE_SIZE, PAGE_SHIFT, PAGES_PER_PROGRAM, HAS_SWA, ROUND_TOWARD_ZERO)
    pages_end = _launch.pages_below(limit, tl.maximum(width, swa_width) if HAS_SWA else width, PAGE_SIZE)
    step = _launch.programs_in_row(FOLDED_GRID) * PAGES_PER_PROGRAM
    for later in range(first + step, pages_end, step):
        _mha_pages(later, row_ptr, limit, page_table_row, width, swa_row, swa_width, mapping_ptr, mapping_len,
                   PAGE_SIZE, PAGE_SHIFT, PAGES_PER_PROGRAM, HAS_SWA, ROUND_TOWARD_ZERO)


@triton.jit
def _mha_pages(first, row_ptr, limit, page_table_row, width, swa_row, swa_width, mapping_ptr, mapping_len,
               PAGE_SIZE: tl.constexpr, PAGE_SHIFT: tl.constexpr, PAGES_PER_PROGRAM: tl.constexpr,
               HAS_SWA: tl.constexpr, ROUND_TOWARD_ZERO: tl.constexpr):
    """Pages ``[first, first + PAGES_PER_PROGRAM)`` of a row whose pages start below ``limit`` positions: the
    MHA table's below ``width`` and, with HAS_SWA, the SWA table's below ``swa_width``."""
    page = first + tl.arange(0, PAGES_PER_PROGRAM)
    position = page.to(tl.int64) * PAGE_SIZE
    in_row = position < limit
    in_table = in_row & (page < width)
    if HAS_SWA:
        in_swa = in_row & (page < swa_width)
        read = in_table | in_swa
    else:
        read = in_table
    # Only dereferenced under in_row, which is empty on an unreadable row.
    slots = tl.load(row_ptr + position, mask=read, other=0)
    tl.store(page_table_row + page, _launch.divide(slots, PAGE_SIZE, PAGE_SHIFT, ROUND_TOWARD_ZERO), mask=in_table)
    if HAS_SWA:
        index = tl.minimum(tl.maximum(slots.to(tl.int64), 0), mapping_len.to(tl.int64) - 1)
        mapped = tl.load(mapping_ptr + index, mask=in_swa, other=0)
        tl.store(swa_row + page, _launch.divide(mapped, PAGE_SIZE, PAGE_SHIFT, ROUND_TOWARD_ZERO).to(tl.int32),
                 mask=in_swa)


def _translated_page_table_kernel(
    table_ptr, pool_ptr, lens_ptr, v2p_ptr, out_ptr, packed_table: tl.int64, packed_out: tl.int64,
    v2p_len: tl.int64, table_rows: tl.int64, table_row_stride: tl.int64, page_limit: tl.int64,
    out_row_stride: tl.int64, multiplier: tl.int64, seq_len_delta: tl.int64, pool_stride: tl.int64,
    lens_stride: tl.int64, fill_value: tl.int64, fill_width: tl.int64, PAGE_SIZE: tl.constexpr,
    PAGE_SHIFT: tl.constexpr, PAGES_PER_PROGRAM: tl.constexpr, HAS_MULTIPLIER: tl.constexpr, HAS_DELTA: tl.constexpr,
    UNIT_STRIDES: tl.constexpr, WIDE_INDEXING: tl.constexpr, FOLDED_GRID: tl.constexpr, HAS_FILL: tl.constexpr,
    PDL: tl.constexpr,
):
    """``t = table[pool[b], c * PAGE_SIZE]``, ``v = 0 if t < 0 else t // PAGE_SIZE``; ``out[b, c] =
    min(max(v2p[v] * multiplier, 0), 2**31 - 1)`` (0 for ``v >= v2p_len``) for the row's live columns: ``c <
    page_limit`` (min(columns, pages that start inside a table row), from the host) and ``c * PAGE_SIZE <
    seq_lens[b] + seq_len_delta`` on a readable row (``0 <= pool[b] < table_rows``). HAS_MULTIPLIER:
    ``multiplier`` is not 1; HAS_DELTA: ``seq_len_delta`` is not 0 (else neither is read). WIDE_INDEXING: some
    size, stride or the map's length is ``WIDE`` or more (``translated_packed_words``): the full-width
    parameters are read; otherwise ``packed_table`` (rows | row stride << 32) and ``packed_out`` (page limit |
    out row stride << 32) stand in for them. Program ``k`` of a row handles its block ``k`` of
    PAGES_PER_PROGRAM columns (``T``: ``launch.programs_in_row``). With HAS_FILL the columns past the live
    ones, up to ``fill_width`` (the columns a row may write), get ``fill_value`` (neither is read without it).
    When a row has several programs and some row can have more than ``T`` blocks, the row's further blocks up
    to its live columns are shared by the programs of its group of ``GROUP_ROWS`` rows as the page table's
    overflow blocks are (``page_table._page_table_kernel``, phase 2), and the fill past them is cut among the
    row's own programs (``launch.fill_part``: stores alone); otherwise program ``k`` handles its row's blocks
    ``k + T, k + 2T, ...``."""
    _launch.wait_for_producer(PDL)
    if UNIT_STRIDES:
        pool_stride, lens_stride = 1, 1
    row = tl.program_id(0).to(tl.int64)
    first = _launch.program_in_row(FOLDED_GRID) * PAGES_PER_PROGRAM
    if not WIDE_INDEXING:
        packed_table, packed_out = packed_table.to(tl.int64), packed_out.to(tl.int64)
        table_rows, table_row_stride = packed_table & 0xFFFFFFFF, packed_table >> 32
        page_limit, out_row_stride = packed_out & 0xFFFFFFFF, packed_out >> 32
    # Overflow blocks (a row's blocks past its first T) are shared within the row's group when a row can have
    # them and has several programs, as in the page table (``page_table._page_table_kernel``, phase 2).
    programs = _launch.programs_in_row(FOLDED_GRID)
    program = _launch.program_in_row(FOLDED_GRID)
    page_bound = fill_width if HAS_FILL else page_limit
    deal = (programs > 1) & (programs * PAGES_PER_PROGRAM < page_bound)
    batch = tl.num_programs(0)
    group_first = row - row % GROUP_ROWS
    group_rows = group_first + tl.arange(0, GROUP_ROWS)
    in_group = group_rows < tl.where(deal, batch, 0)
    row_ptr, length, live_length, out_row, row_end = _translated_row(
        row, table_ptr, pool_ptr, lens_ptr, out_ptr, table_rows, table_row_stride, page_limit, out_row_stride,
        seq_len_delta, pool_stride, lens_stride, fill_width, PAGE_SIZE, HAS_DELTA, WIDE_INDEXING, HAS_FILL)
    # The group's lengths, loaded with the row's inputs so that they overlap its first gather.
    group_lengths = tl.load(lens_ptr + group_rows * lens_stride, mask=in_group, other=0)
    if not WIDE_INDEXING:
        v2p_len = v2p_len.to(tl.int32)  # the map is shorter than 2**31 too: 32-bit compares
    _translated_pages(first, row_ptr, length, live_length, page_limit, v2p_ptr, v2p_len, out_row, multiplier,
                      fill_value, fill_width, PAGE_SIZE, PAGE_SHIFT, PAGES_PER_PROGRAM, HAS_MULTIPLIER, HAS_FILL)
    if deal:
        # As in the page table (``page_table._page_table_kernel``, phase 2): the row's programs handle its blocks
        # below passes * T themselves and member m the items [m * s, (m + 1) * s), s = ceil(items / M), of the
        # blocks past them that the rows' live pages reach; with HAS_FILL each row's programs then fill their
        # parts of the columns past its counted blocks (``launch.fill_part``: stores alone).
        group_size = tl.minimum(batch - group_first, GROUP_ROWS).to(tl.int64)
        members = group_size * programs
        member = (row - group_first) * programs + program
        fill_from = programs.to(tl.int64)  # the row's first block of pure fill
        # Nothing to share unless some row of the group has more than T blocks: one reduction decides it.
        longest = _delta_length(tl.max(group_lengths, 0), seq_len_delta, HAS_DELTA)
        if longest > programs.to(tl.int64) * (PAGES_PER_PROGRAM * PAGE_SIZE):
            overflow, passes = _translated_overflow_counts(group_lengths, in_group, seq_len_delta, page_limit,
                                                           programs, PAGE_SIZE, PAGES_PER_PROGRAM, HAS_DELTA)
            step = programs * PAGES_PER_PROGRAM
            for later in range(first + step, tl.minimum(row_end, passes * step), step):
                _translated_pages(later, row_ptr, length, live_length, page_limit, v2p_ptr, v2p_len, out_row,
                                  multiplier, fill_value, fill_width, PAGE_SIZE, PAGE_SHIFT, PAGES_PER_PROGRAM,
                                  HAS_MULTIPLIER, HAS_FILL)
            fill_from = passes * programs + tl.sum(tl.where(group_rows == row, overflow, 0), 0)
            items = tl.sum(overflow, 0)
            if items > 0:
                item, items_end = _launch.member_items(items, members, member)
                if item < items_end:
                    ends = tl.cumsum(overflow, 0)
                    while item < items_end:
                        in_group_row, index = _launch.locate_item(item, ends, overflow, group_rows - group_first)
                        block = passes * programs + index
                        _translated_overflow_block(
                            group_first + in_group_row, block * PAGES_PER_PROGRAM, table_ptr, pool_ptr, lens_ptr,
                            v2p_ptr, out_ptr, v2p_len, table_rows, table_row_stride, page_limit, out_row_stride,
                            multiplier, seq_len_delta, pool_stride, lens_stride, fill_value, fill_width,
                            PAGE_SIZE, PAGE_SHIFT, PAGES_PER_PROGRAM, HAS_MULTIPLIER, HAS_DELTA, WIDE_INDEXING,
                            HAS_FILL)
                        item += 1
        if HAS_FILL:
            _launch.fill_part(out_row, fill_from * PAGES_PER_PROGRAM, fill_width, program, programs, fill_value)
    else:
        step = programs * PAGES_PER_PROGRAM
        for later in range(first + step, row_end, step):
            _translated_pages(later, row_ptr, length, live_length, page_limit, v2p_ptr, v2p_len, out_row,
                              multiplier, fill_value, fill_width, PAGE_SIZE, PAGE_SHIFT, PAGES_PER_PROGRAM,
                              HAS_MULTIPLIER, HAS_FILL)
    _launch.release_dependents(PDL)


@triton.jit
def _translated_overflow_block(row, first, table_ptr, pool_ptr, lens_ptr, v2p_ptr, out_ptr, v2p_len, table_rows,
                               table_row_stride, page_limit, out_row_stride, multiplier, seq_len_delta, pool_stride,
                               lens_stride, fill_value, fill_width, PAGE_SIZE: tl.constexpr,
                               PAGE_SHIFT: tl.constexpr, PAGES_PER_PROGRAM: tl.constexpr,
                               HAS_MULTIPLIER: tl.constexpr, HAS_DELTA: tl.constexpr, WIDE_INDEXING: tl.constexpr,
                               HAS_FILL: tl.constexpr):
    """Columns ``[first, first + PAGES_PER_PROGRAM)`` of row ``row`` with the row's own setup
    (``_translated_row``): an overflow item."""
    row_ptr, length, live_length, out_row, _ = _translated_row(
        row, table_ptr, pool_ptr, lens_ptr, out_ptr, table_rows, table_row_stride, page_limit, out_row_stride,
        seq_len_delta, pool_stride, lens_stride, fill_width, PAGE_SIZE, HAS_DELTA, WIDE_INDEXING, HAS_FILL)
    _translated_pages(first, row_ptr, length, live_length, page_limit, v2p_ptr, v2p_len, out_row, multiplier,
                      fill_value, fill_width, PAGE_SIZE, PAGE_SHIFT, PAGES_PER_PROGRAM, HAS_MULTIPLIER, HAS_FILL)


@triton.jit
def _translated_overflow_counts(lengths, in_group, seq_len_delta, page_limit, programs, PAGE_SIZE: tl.constexpr,
                                PAGES_PER_PROGRAM: tl.constexpr, HAS_DELTA: tl.constexpr):
    """``(overflow, passes)`` of a group of rows from their lengths alone (``launch.group_overflow`` of the
    pages below ``page_limit`` and each row's length). At least the row's real overflow: an unreadable row
    is counted as far as its length reaches, and its surplus items write nothing (its live length is 0 in
    ``_translated_overflow_block``); with HAS_FILL the columns past them are filled by the row's own programs."""
    pages = _launch.pages_below(_delta_length(lengths, seq_len_delta, HAS_DELTA), page_limit, PAGE_SIZE)
    return _launch.group_overflow(pages, in_group, programs, PAGES_PER_PROGRAM)


@triton.jit
def _delta_length(length, seq_len_delta, HAS_DELTA: tl.constexpr):
    """``seq_lens[b] + seq_len_delta`` in int64: with a delta an int64 length is clamped into [-2**62, 2**62]
    first (no table comes near), so the sum cannot wrap."""
    length = length.to(tl.int64)
    if HAS_DELTA:
        length = tl.minimum(tl.maximum(length, -(2**62)), 2**62) + seq_len_delta
    return length


@triton.jit
def _translated_row(row, table_ptr, pool_ptr, lens_ptr, out_ptr, table_rows, table_row_stride, page_limit,
                    out_row_stride, seq_len_delta, pool_stride, lens_stride, fill_width, PAGE_SIZE: tl.constexpr,
                    HAS_DELTA: tl.constexpr, WIDE_INDEXING: tl.constexpr, HAS_FILL: tl.constexpr):
    """``(row_ptr, length, live_length, out_row, row_end)`` of ``row`` (int64): the table row read (row 0 in
    place of an unreadable one), the positions read and written below, its ``out`` row and the columns its
    programs cover (``fill_width`` with HAS_FILL, else its live pages: at most ``page_limit``, 0 when
    unreadable)."""
    pool = tl.load(pool_ptr + row * pool_stride)  # in its stored dtype
    length = _delta_length(tl.load(lens_ptr + row * lens_stride), seq_len_delta, HAS_DELTA)
    if WIDE_INDEXING:
        pool = pool.to(tl.int64)
        readable = (pool >= 0) & (pool < table_rows)
        row_offset = pool * table_row_stride
    else:
        # One unsigned compare (a negative index is out of range too); where readable, the index and the
        # stride lie in [0, 2**31): one unsigned 32 x 32 -> 64-bit multiply.
        if pool.dtype == tl.int32:
            readable = pool.to(tl.uint32, bitcast=True) < table_rows.to(tl.uint32)
        else:
            readable = pool.to(tl.uint64, bitcast=True) < table_rows.to(tl.uint64)
        row_offset = (pool.to(tl.int32).to(tl.uint32, bitcast=True).to(tl.uint64)
                      * table_row_stride.to(tl.uint64)).to(tl.int64, bitcast=True)
    # The loads do not wait for the row test (in their mask it cost up to 5%, docs/performance.md): an
    # unreadable row reads row 0 instead, inside its first page_limit pages (0 for a table without rows),
    # and the map, and writes nothing.
    row_ptr = table_ptr + tl.where(readable, row_offset, 0)
    out_row = out_ptr + row * out_row_stride
    # An unreadable row's limit is 0, below every position (masks combine blocks only).
    live_length = tl.where(readable, length, 0)
    if HAS_FILL:
        row_end = fill_width
    else:
        row_end = _launch.pages_below(live_length, page_limit, PAGE_SIZE)
    return row_ptr, length, live_length, out_row, row_end


@triton.jit
def _translated_pages(first, row_ptr, length, live_length, page_limit, v2p_ptr, v2p_len, out_row, multiplier,
                      fill_value, fill_width, PAGE_SIZE: tl.constexpr, PAGE_SHIFT: tl.constexpr,
                      PAGES_PER_PROGRAM: tl.constexpr, HAS_MULTIPLIER: tl.constexpr, HAS_FILL: tl.constexpr):
    """Columns ``[first, first + PAGES_PER_PROGRAM)`` of a translated row: read below ``page_limit`` and
    ``length`` positions (``row_ptr`` is a readable row, row 0 in place of an unreadable one), written below
    ``live_length`` (0 on an unreadable row); with HAS_FILL the other columns below ``fill_width`` get
    ``fill_value``."""
    page = first + tl.arange(0, PAGES_PER_PROGRAM)
    position = page.to(tl.int64) * PAGE_SIZE
    read = (page < page_limit) & (position < length)
    live = (page < page_limit) & (position < live_length)
    tokens = tl.load(row_ptr + position, mask=read, other=0)
    virtual = tl.where(tokens < 0, 0, _launch.divide(tokens, PAGE_SIZE, PAGE_SHIFT, False))
    # A virtual page past the map reads nothing and gives 0 (``other``), as a freed page (-1) does.
    physical = tl.load(v2p_ptr + virtual, mask=read & (virtual < v2p_len), other=0)
    if HAS_MULTIPLIER:
        # |physical| <= 2**31 and |multiplier| <= 2**31: an exact product, saturating as the true one.
        physical = tl.minimum(tl.maximum(physical.to(tl.int64), -(2**31)), 2**31) * multiplier.to(tl.int64)
    if physical.dtype == tl.int32:  # an int32 entry needs no upper clamp
        values = tl.maximum(physical, 0)
    else:
        values = tl.minimum(tl.maximum(physical, 0), 2**31 - 1).to(tl.int32)
    if HAS_FILL:
        tl.store(out_row + page, tl.where(live, values, fill_value.to(tl.int32)), mask=page < fill_width)
    else:
        tl.store(out_row + page, values, mask=live)


# Pointers first, then the runtime ints: (kernel, pointer parameters, runtime int parameters) per kernel, for
# triton.jit here and for the cross-compiler's own JITFunction objects.
KERNEL_PARAMETERS = {
    "mha": (_mha_page_table_kernel, MHA_PARAMETERS[:6], MHA_PARAMETERS[6:]),
    "translated": (_translated_page_table_kernel, TRANSLATED_PARAMETERS[:5], TRANSLATED_PARAMETERS[5:]),
}
mha_page_table_kernel, translated_page_table_kernel = (
    triton.jit(function, do_not_specialize=ints, do_not_specialize_on_alignment=pointers)
    for function, pointers, ints in KERNEL_PARAMETERS.values())
mha_launcher = _launch.register(_launch.KernelLauncher(mha_page_table_kernel, MHA_CONSTEXPRS))
translated_launcher = _launch.register(_launch.KernelLauncher(translated_page_table_kernel, TRANSLATED_CONSTEXPRS))
_mha_plans = _launch.plan_cache(on_clear=functools.partial(native.forget_plans, "mha_page_table"))
_translated_plans = _launch.plan_cache(on_clear=functools.partial(native.forget_plans, "translated_page_table"))


def common_constexprs(page_size: int, unit_strides: bool, folded_grid: bool, pdl: bool) -> dict:
    return dict(PAGE_SIZE=page_size, PAGE_SHIFT=page_shift(page_size),
                PAGES_PER_PROGRAM=launch_grid.items_per_program(launch_grid.MAPPED_PAGE_TABLE, page_size),
                UNIT_STRIDES=unit_strides, FOLDED_GRID=folded_grid, PDL=pdl)


def mha_constexprs(page_size: int, has_swa: bool, round_toward_zero: bool, unit_strides: bool = True,
                   folded_grid: bool = False, pdl: bool = False, has_offset: bool = False) -> dict:
    """The constexpr arguments of one MHA page-table specialisation."""
    return dict(common_constexprs(page_size, unit_strides, folded_grid, pdl), HAS_SWA=has_swa,
                ROUND_TOWARD_ZERO=round_toward_zero, HAS_OFFSET=has_offset)


def translated_constexprs(page_size: int, has_multiplier: bool, has_delta: bool, unit_strides: bool = True,
                          folded_grid: bool = False, wide_indexing: bool = False, pdl: bool = False,
                          has_fill: bool = False) -> dict:
    """The constexpr arguments of one translated page-table specialisation."""
    return dict(common_constexprs(page_size, unit_strides, folded_grid, pdl), HAS_MULTIPLIER=has_multiplier,
                HAS_DELTA=has_delta, WIDE_INDEXING=wide_indexing, HAS_FILL=has_fill)


def translated_packed_words(rows: int, table_stride: int, page_limit: int, out_stride: int,
                            v2p_len: int) -> tuple[int, int] | None:
    """The translated kernel's ``packed_table`` (rows | table row stride << 32) and ``packed_out`` (page limit |
    out row stride << 32), or None when a value (the map's length included) is ``WIDE`` or more."""
    if (rows | table_stride | page_limit | out_stride | v2p_len) >= _launch.WIDE:  # none is negative
        return None
    return rows | table_stride << 32, page_limit | out_stride << 32


def launch_plan(plans, launcher, key, out, args, span, constexprs_of):
    """Run ``args`` through the plan of ``key`` (building it at its first call): ``key[:3]`` is (device index,
    page size, batch), ``key[3:]`` the rest of the specialisation; ``span`` the pages a row may write."""
    def build():
        geometry = launch_grid.mapped_page_table_launch(key[2], span, key[1], budget=_launch.program_budget(out.device))
        return _launch.build_plan(plans, launcher, key, args, out.device, geometry,
                                  (key[1], geometry.folded) + key[4:], constexprs_of(geometry.folded))

    _launch.launch_through_plan(plans, key, args, build)


def build_mha_page_table(req_to_token, req_pool_indices, seq_lens, page_table, page_size, swa_page_table=None,
                         full_to_swa=None, round_toward_zero=False, seqlen_offset=0, pdl=False):
    """Write the TRT-LLM MHA page table (and its SWA twin) in one launch; semantics of
    ``kvdispatch.ops.mha_page_table.reference``; ``pdl``: launch with programmatic dependent launch where the
    device supports it. Arguments arrive validated (the op's ``check_arguments``)."""
    rows, cols = req_to_token.shape
    width = page_table.shape[1]
    has_swa = swa_page_table is not None and full_to_swa.shape[0] > 0  # an empty mapping: nothing to write
    swa_width = swa_page_table.shape[1] if has_swa else 0
    pool_stride, lens_stride = req_pool_indices.stride(0), seq_lens.stride(0)
    unit_strides = pool_stride == 1 and lens_stride == 1
    key = (page_table.get_device(), page_size, req_pool_indices.shape[0], max(width, swa_width), req_pool_indices.dtype,
           seq_lens.dtype, full_to_swa.dtype if has_swa else None, round_toward_zero, unit_strides, pdl,
           seqlen_offset != 0)
    args = (req_to_token, req_pool_indices, seq_lens, page_table, swa_page_table if has_swa else page_table,
            full_to_swa if has_swa else req_pool_indices, rows, cols, req_to_token.stride(0), width,
            page_table.stride(0), swa_width, swa_page_table.stride(0) if has_swa else 0,
            full_to_swa.shape[0] if has_swa else 0, pool_stride, lens_stride, seqlen_offset)
    launch_plan(_mha_plans, mha_launcher, key, page_table, args, key[3],
                lambda folded: mha_constexprs(page_size, has_swa, round_toward_zero, unit_strides, folded, pdl,
                                              seqlen_offset != 0))
    return page_table


def build_translated_page_table(req_to_token, req_pool_indices, seq_lens, v2p, out, page_size, multiplier=1,
                                max_pages=None, seq_len_delta=0, fill_value=None, pdl=False):
    """Write the translated page table in one launch; semantics of
    ``kvdispatch.ops.translated_page_table.reference`` (``pdl`` as for ``build_mha_page_table``). Arguments
    arrive validated."""
    rows, cols = req_to_token.shape
    columns = out.shape[1] if max_pages is None else min(max_pages, out.shape[1])
    pool_stride, lens_stride = req_pool_indices.stride(0), seq_lens.stride(0)
    unit_strides = pool_stride == 1 and lens_stride == 1
    has_multiplier, has_delta, has_fill = multiplier != 1, seq_len_delta != 0, fill_value is not None
    table_stride, out_stride = req_to_token.stride(0), out.stride(0)
    page_limit = min(columns, -(-cols // page_size)) if rows else 0  # the kernel may read row 0
    packed = translated_packed_words(rows, table_stride, page_limit, out_stride, v2p.shape[0])
    key = (out.get_device(), page_size, req_pool_indices.shape[0], columns, req_pool_indices.dtype, seq_lens.dtype,
           v2p.dtype, has_multiplier, has_delta, unit_strides, packed is None, pdl, has_fill)
    packed_table, packed_out = packed or (0, 0)
    args = (req_to_token, req_pool_indices, seq_lens, v2p, out, packed_table, packed_out, v2p.shape[0], rows,
            table_stride, page_limit, out_stride, multiplier, seq_len_delta, pool_stride, lens_stride,
            fill_value if has_fill else 0, columns)
    launch_plan(_translated_plans, translated_launcher, key, out, args, columns,
                lambda folded: translated_constexprs(page_size, has_multiplier, has_delta, unit_strides, folded,
                                                     packed is None, pdl, has_fill))
    return out


def compile_specializations(warp_size, page_sizes, index_types):
    """Both kernels' ``Specialization``s (``kernels_triton.specialization``), those of ``_ast_sources``, page size
    by page size."""
    kernels = {name: jit_function(*parameters) for name, parameters in KERNEL_PARAMETERS.items()}
    for page_size in page_sizes:
        threads = launch_grid.mapped_page_table_launch(1, 1, page_size).threads
        for name, signature, constexprs in _ast_sources((page_size,), index_types):
            yield Specialization(kernels[name], signature, constexprs, warps(threads, warp_size))


def _ast_sources(page_sizes, index_types):
    """Every specialisation of both kernels for ``page_sizes``: yields ``(kernel name, signature, constexprs)``
    for ``triton.compiler.ASTSource`` (Triton >= 3.3), per option set, grid form, index dtype (the pool and
    length vectors) and lookup dtype (``full_to_swa``, ``v2p``)."""
    for page_size, (swa, round_toward_zero, unit, folded, offset), index, lookup in itertools.product(
            page_sizes, itertools.product((False, True), repeat=5), index_types, ("i32", "i64")):
        if not swa and lookup != "i32" or offset and not round_toward_zero:
            continue  # without SWA the mapping pointer is a placeholder of one type; offsets: SGLang's division
        types = dict(pool_ptr=f"*{index}", lens_ptr=f"*{index}", mapping_ptr=f"*{lookup}" if swa else f"*{index}")
        constexprs = mha_constexprs(page_size, swa, round_toward_zero, unit, folded, has_offset=offset)
        yield "mha", ast_signature(MHA_PARAMETERS, constexprs, types), constexprs
    # Wide indexing (tables or rows 2**31 entries apart) once per page size and dtype pair, with every option.
    for page_size, (multiplied, delta, unit, folded, wide), index, lookup in itertools.product(
            page_sizes, itertools.product((False, True), repeat=5), index_types, ("i32", "i64")):
        if wide and (unit, folded) != (False, False) or wide and not multiplied == delta:
            continue
        types = dict(pool_ptr=f"*{index}", lens_ptr=f"*{index}", v2p_ptr=f"*{lookup}")
        constexprs = translated_constexprs(page_size, multiplied, delta, unit, folded, wide)
        yield "translated", ast_signature(TRANSLATED_PARAMETERS, constexprs, types), constexprs
    # A fill (SGLang's zero tail), with and without a length delta, on the usual grid.
    for page_size, delta, index, lookup in itertools.product(page_sizes, (False, True), index_types, ("i32", "i64")):
        types = dict(pool_ptr=f"*{index}", lens_ptr=f"*{index}", v2p_ptr=f"*{lookup}")
        constexprs = translated_constexprs(page_size, False, delta, has_fill=True)
        yield "translated", ast_signature(TRANSLATED_PARAMETERS, constexprs, types), constexprs


# The ops this module launches: ``kernels_triton.KERNELS`` reads them from this source, without importing it.
OP_LAUNCHERS = {"mha_page_table": build_mha_page_table, "translated_page_table": build_translated_page_table}
