"""Paged block table (FlashMLA-style) on the 2-D grid ``(batch, programs_per_row)``.

Program ``(b, k)`` owns pages ``[k * PAGES_PER_PROGRAM, (k + 1) * PAGES_PER_PROGRAM)`` of row ``b`` of
``out``. It loads the row's pool index, length and start together, gathers one slot per page in one
round trip, and stores the pages (16-byte stores where the launcher proved the rows aligned).
"""

from __future__ import annotations

import triton
import triton.language as tl

from kvdispatch import grid as launch_grid

from . import launch as _launch

RUNTIME_INTS = ("pool_stride", "lens_stride", "start_stride", "table_rows", "table_cols", "table_row_stride",
                "out_width", "out_row_stride", "seqlen_offset", "fill_value")
POINTERS = ("table_ptr", "pool_ptr", "lens_ptr", "start_ptr", "out_ptr", "seq_lens_out_ptr")
CONSTEXPRS = ("PAGE_SIZE", "PAGE_SHIFT", "PAGES_PER_PROGRAM", "HAS_START", "HAS_SEQ_LENS_OUT", "HAS_FILL",
              "ALIGNED")


def _page_table_kernel(
    table_ptr, pool_ptr, lens_ptr, start_ptr, out_ptr, seq_lens_out_ptr,
    pool_stride: tl.int64, lens_stride: tl.int64, start_stride: tl.int64, table_rows: tl.int64, table_cols: tl.int64, table_row_stride: tl.int64,
    out_width: tl.int64, out_row_stride: tl.int64, seqlen_offset: tl.int64, fill_value: tl.int64,
    PAGE_SIZE: tl.constexpr, PAGE_SHIFT: tl.constexpr, PAGES_PER_PROGRAM: tl.constexpr,
    HAS_START: tl.constexpr, HAS_SEQ_LENS_OUT: tl.constexpr, HAS_FILL: tl.constexpr, ALIGNED: tl.constexpr,
):
    """``out[b, p] = table[pool[b], start[b] + p * PAGE_SIZE] // PAGE_SIZE`` for the program's pages.

    PAGE_SHIFT: log2(PAGE_SIZE) for powers of two, else -1. ALIGNED (PAGE_SIZE == 1 only): the table and
    ``out`` rows are 16-byte aligned and there is no start, so the program copies consecutive columns with
    16-byte accesses.
    """
    row = tl.program_id(0)
    first = tl.program_id(1) * PAGES_PER_PROGRAM
    # Independent scalar loads, issued together.
    pool = tl.load(pool_ptr + row * pool_stride).to(tl.int64)
    length = tl.load(lens_ptr + row * lens_stride).to(tl.int64) + seqlen_offset
    if HAS_START:
        start = tl.load(start_ptr + row * start_stride).to(tl.int64)
    else:
        start = tl.zeros((), tl.int64)
    if HAS_SEQ_LENS_OUT:
        if first == 0:
            tl.store(seq_lens_out_ptr + row, length.to(tl.int32))

    readable = (pool >= 0) & (pool < table_rows) & (start >= 0) & (start < table_cols) & (length > 0)
    wanted = (length + (PAGE_SIZE - 1)) // PAGE_SIZE
    available = (table_cols - start + (PAGE_SIZE - 1)) // PAGE_SIZE
    pages = tl.where(readable, tl.minimum(tl.minimum(wanted, available), out_width), 0)

    out_row = out_ptr + row.to(tl.int64) * out_row_stride
    if ALIGNED:
        out_row = tl.multiple_of(out_row, 16)
    page = first + tl.arange(0, PAGES_PER_PROGRAM)
    if ALIGNED:
        page = tl.max_contiguous(tl.multiple_of(page, PAGES_PER_PROGRAM), PAGES_PER_PROGRAM)
    # The pool row is only dereferenced under a page mask, which is empty when the row is unreadable.
    table_row = table_ptr + pool * table_row_stride
    if HAS_START:
        # (Added only when present: an add of 0 is folded away together with a multiple_of hint on it.)
        table_row += start

    if HAS_FILL:
        has_work = first < out_width  # the fill reaches every program
    else:
        has_work = first < pages
    if first + PAGES_PER_PROGRAM <= pages:
        # Whole block inside the row: no masks, so aligned rows get 16-byte accesses.
        if PAGE_SIZE == 1:
            if ALIGNED:
                table_row = tl.multiple_of(table_row, 16)
            slots = tl.load(table_row + page)
        else:
            slots = tl.load(table_row + page.to(tl.int64) * PAGE_SIZE)
        if PAGE_SHIFT >= 0:
            values = slots >> PAGE_SHIFT  # arithmetic shift: floor division for negative slots too
        else:
            values = tl.where(slots >= 0, slots // PAGE_SIZE, ~((~slots) // PAGE_SIZE))
        tl.store(out_row + page, values)
    elif has_work:
        in_row = page < pages
        if PAGE_SIZE == 1:
            slots = tl.load(table_row + page, mask=in_row, other=0)
        else:
            slots = tl.load(table_row + page.to(tl.int64) * PAGE_SIZE, mask=in_row, other=0)
        if PAGE_SHIFT >= 0:
            values = slots >> PAGE_SHIFT
        else:
            values = tl.where(slots >= 0, slots // PAGE_SIZE, ~((~slots) // PAGE_SIZE))
        if HAS_FILL:
            values = tl.where(in_row, values, fill_value.to(tl.int32))
            tl.store(out_row + page, values, mask=page < out_width)
        else:
            tl.store(out_row + page, values, mask=in_row)


page_table_kernel = triton.jit(_page_table_kernel, do_not_specialize=RUNTIME_INTS,
                               do_not_specialize_on_alignment=POINTERS)
launcher = _launch.register(_launch.KernelLauncher(page_table_kernel, CONSTEXPRS))
_plans = _launch.plan_cache()


def page_shift(page_size: int) -> int:
    """log2(page_size) for powers of two, else -1."""
    return page_size.bit_length() - 1 if page_size & (page_size - 1) == 0 else -1


def constexprs_for(page_size: int, has_start: bool, has_seq_lens_out: bool, has_fill: bool, aligned: bool) -> dict:
    """The constexpr arguments of one specialisation (pages per program from ``kvdispatch.grid``)."""
    return dict(PAGE_SIZE=page_size, PAGE_SHIFT=page_shift(page_size),
                PAGES_PER_PROGRAM=launch_grid.items_per_program(launch_grid.PAGE_TABLE, page_size),
                HAS_START=has_start, HAS_SEQ_LENS_OUT=has_seq_lens_out, HAS_FILL=has_fill, ALIGNED=aligned)


def _build_plan(key, req_to_token, out, page_size, has_start, has_seq_lens_out, has_fill, aligned, args):
    batch, width = key[2], key[3]
    geometry = launch_grid.page_table_launch(batch, width, page_size, writes_lengths=has_seq_lens_out)
    if geometry.grid[0] == 0:
        return _plans.add(key, _launch.nothing), False
    constexprs = constexprs_for(page_size, has_start, has_seq_lens_out, has_fill, aligned)
    specialisation = (page_size, has_start, has_seq_lens_out, has_fill, aligned) + key[4:7]
    warps = _launch.warps_for(out.device, geometry.threads)
    plan, launched = launcher.plan(key[0], specialisation, geometry.grid, constexprs, warps, args)
    return _plans.add(key, plan), launched


def build_page_table(req_to_token, req_pool_indices, seq_lens, out, page_size, kv_start_idx=None,
                     seqlen_offset=0, seq_lens_out=None, fill_value=None):
    """Write the paged block table into ``out`` (int32 ``[>= B, W]``); semantics of
    ``kvdispatch.reference.build_page_table``. Index vectors may be strided views.

    Untouched: rows ``>= B``; without ``fill_value``, the columns past each row's pages.
    Arguments arrive validated by ``kvdispatch._validate``.
    """
    has_start = kv_start_idx is not None
    has_seq_lens_out = seq_lens_out is not None
    has_fill = fill_value is not None
    # Only page size 1 is a contiguous copy worth a 16-byte-access variant; larger pages are gathers of
    # one word per page, so their kernel stays one compilation whatever the buffer width.
    aligned = (page_size == 1 and not has_start and out.data_ptr() % 16 == 0 and out.stride(0) % 4 == 0
               and req_to_token.data_ptr() % 16 == 0 and req_to_token.stride(0) % 4 == 0)
    key = (out.get_device(), page_size, req_pool_indices.shape[0], out.shape[1], req_pool_indices.dtype,
           seq_lens.dtype, kv_start_idx.dtype if has_start else None, has_seq_lens_out, has_fill, aligned)
    rows, cols = req_to_token.shape
    args = (req_to_token, req_pool_indices, seq_lens, kv_start_idx if has_start else req_to_token, out,
            seq_lens_out if has_seq_lens_out else out, req_pool_indices.stride(0), seq_lens.stride(0),
            kv_start_idx.stride(0) if has_start else 0, rows, cols, req_to_token.stride(0), out.shape[1],
            out.stride(0), seqlen_offset, fill_value if has_fill else 0)
    plan = _plans.get(key)
    if plan is None:
        plan, launched = _build_plan(key, req_to_token, out, page_size, has_start, has_seq_lens_out, has_fill,
                                     aligned, args)
        if launched:
            return out
    plan(*args)
    return out


def specializations(page_sizes=(1, 16, 32, 64, 128, 96), index_types=("i32", "i64")):
    """Every specialisation the launcher can produce for ``page_sizes``: yields ``(signature, constexprs)``
    in the form ``triton.compiler.ASTSource`` takes (Triton >= 3.3), for each option combination and
    each index dtype (the same for the pool, length and start vectors)."""
    for page_size in page_sizes:
        for has_start in (False, True):
            for has_seq_lens_out in (False, True):
                for has_fill in (False, True):
                    for aligned in (False, True):
                        if aligned and (page_size != 1 or has_start):
                            continue  # the launcher never sets ALIGNED for these combinations
                        for index in index_types:
                            signature = dict(table_ptr="*i32", pool_ptr=f"*{index}", lens_ptr=f"*{index}",
                                             start_ptr=f"*{index}" if has_start else "*i32", out_ptr="*i32",
                                             seq_lens_out_ptr="*i32")
                            signature.update({name: "i64" for name in RUNTIME_INTS})
                            constexprs = constexprs_for(page_size, has_start, has_seq_lens_out, has_fill, aligned)
                            signature.update({name: "constexpr" for name in constexprs})
                            yield signature, constexprs
