"""One decode step's metadata in one launch (``kvdispatch.update_decode_metadata``), on the grid
``kvdispatch.grid.decode_metadata_launch``.

Program ``(b, T - 1)``, the last of row ``b``'s ``T`` (the one with the fewest pages to write, so its sums
run beside the row's first pages), writes row ``b``'s length and its prefix sums, summing the lengths of rows
``0..b`` itself (``DECODE_METADATA_SUM_BLOCK`` at a time): no program waits for another. Program ``(b, k)``
writes its blocks of row ``b``'s pages as the mapped page tables do (``mapped_tables.py``: ``row_limit``,
``launch.divide``), and every program takes its share of the sliding-window cache locations, strided over the grid.
"""

from __future__ import annotations

import functools
import itertools

import triton
import triton.language as tl

from kvdispatch import grid as launch_grid

from . import launch as _launch
from . import native
from .mapped_tables import row_limit
from .page_table import page_shift
from .specialization import Specialization, ast_signature, jit_function, warps

PARAMETERS = ("table_ptr", "pool_ptr", "lens_ptr", "cache_ptr", "cu_k_ptr", "page_table_ptr", "swa_ptr",
              "mapping_ptr", "full_v2p_ptr", "swa_v2p_ptr", "cu_q_ptr", "qlens_ptr", "loc_ptr", "swa_loc_ptr",
              "batch", "table_rows", "table_cols", "table_row_stride", "width", "page_table_stride", "swa_width",
              "swa_stride", "mapping_len", "full_v2p_len", "swa_v2p_len", "seqlen_offset", "q_stride", "loc_len",
              "swa_loc_len", "pool_stride", "lens_stride", "cache_stride", "cu_k_stride", "cu_q_stride",
              "qlens_stride", "loc_stride", "swa_loc_stride")
POINTERS, RUNTIME_INTS = PARAMETERS[:14], PARAMETERS[14:]
CONSTEXPRS = ("PAGE_SIZE", "PAGE_SHIFT", "PAGES_PER_PROGRAM", "SUM_BLOCK", "K_LEADING", "Q_MODE", "Q_LEADING",
              "HAS_TABLE", "FULL_V2P", "SWA_MODE", "ZERO_TAIL", "HAS_SWA_LOC", "FOLDED_GRID", "PDL")
Q_NONE, Q_CUMSUM, Q_STRIDED = 0, 1, 2  # how cu_seqlens_q is written
SWA_NONE, SWA_SLOT_MAP, SWA_PAGE_MAP = 0, 1, 2  # how swa_page_table is written


@triton.jit
def _running_sum(values_ptr, stride, row, offset, SUM_BLOCK: tl.constexpr):
    """The low 32 bits of ``sum(low32(values[i] + offset) for i <= row)``."""
    total = tl.zeros((), tl.int64)
    for first in range(0, row + 1, SUM_BLOCK):
        index = first + tl.arange(0, SUM_BLOCK).to(tl.int64)
        terms = (tl.load(values_ptr + index * stride, mask=index <= row, other=0).to(tl.int64) + offset)
        total += tl.sum(tl.where(index <= row, terms.to(tl.int32).to(tl.int64), 0))
    return total.to(tl.int32)


@triton.jit
def _through_map(slots, read, v2p_ptr, v2p_len, PAGE_SIZE: tl.constexpr, PAGE_SHIFT: tl.constexpr):
    """``min(max(v2p[max(slot, 0) // PAGE_SIZE], 0), 2**31 - 1)``, 0 past the map."""
    virtual = _launch.divide(tl.maximum(slots, 0), PAGE_SIZE, PAGE_SHIFT, False)
    physical = tl.load(v2p_ptr + virtual, mask=read & (virtual < v2p_len), other=0)
    return tl.minimum(tl.maximum(physical.to(tl.int64), 0), 2**31 - 1).to(tl.int32)


@triton.jit
def _metadata_pages(first, row_ptr, limit, page_table_row, width, swa_row, swa_width, mapping_ptr, mapping_len,
                    full_v2p_ptr, full_v2p_len, swa_v2p_ptr, swa_v2p_len, PAGE_SIZE: tl.constexpr,
                    PAGE_SHIFT: tl.constexpr, PAGES_PER_PROGRAM: tl.constexpr, FULL_V2P: tl.constexpr,
                    SWA_MODE: tl.constexpr, ZERO_TAIL: tl.constexpr):
    """Pages ``[first, first + PAGES_PER_PROGRAM)`` of a row whose pages start below ``limit`` positions."""
    page = first + tl.arange(0, PAGES_PER_PROGRAM)
    in_row = page.to(tl.int64) * PAGE_SIZE < limit
    in_table = page < width
    in_swa = page < swa_width
    slots = tl.load(row_ptr + page.to(tl.int64) * PAGE_SIZE, mask=in_row & (in_table | in_swa), other=0)
    if FULL_V2P:
        values = _through_map(slots, in_row, full_v2p_ptr, full_v2p_len, PAGE_SIZE, PAGE_SHIFT)
    else:
        values = _launch.divide(slots, PAGE_SIZE, PAGE_SHIFT, False)
    if ZERO_TAIL:
        tl.store(page_table_row + page, tl.where(in_row, values, 0), mask=in_table)
    else:
        tl.store(page_table_row + page, values, mask=in_table & in_row)
    if SWA_MODE != 0:
        if SWA_MODE == 2:
            swa_values = _through_map(slots, in_row, swa_v2p_ptr, swa_v2p_len, PAGE_SIZE, PAGE_SHIFT)
        else:
            index = tl.minimum(slots.to(tl.int64), mapping_len - 1)  # negative: a negative slot or an empty map
            mapped = tl.load(mapping_ptr + index, mask=in_row & in_swa & (index >= 0),
                             other=-1).to(tl.int64)
            swa_values = tl.where(mapped < 0, -1, _launch.divide(mapped, PAGE_SIZE, PAGE_SHIFT, False)).to(tl.int32)
        if ZERO_TAIL:
            tl.store(swa_row + page, tl.where(in_row, swa_values, 0), mask=in_swa)
        else:
            tl.store(swa_row + page, swa_values, mask=in_swa & in_row)


def _decode_metadata_kernel(
    table_ptr, pool_ptr, lens_ptr, cache_ptr, cu_k_ptr, page_table_ptr, swa_ptr, mapping_ptr, full_v2p_ptr,
    swa_v2p_ptr, cu_q_ptr, qlens_ptr, loc_ptr, swa_loc_ptr, batch: tl.int64, table_rows: tl.int64,
    table_cols: tl.int64, table_row_stride: tl.int64, width: tl.int64, page_table_stride: tl.int64,
    swa_width: tl.int64, swa_stride: tl.int64, mapping_len: tl.int64, full_v2p_len: tl.int64,
    swa_v2p_len: tl.int64, seqlen_offset: tl.int64, q_stride: tl.int64, loc_len: tl.int64, swa_loc_len: tl.int64,
    pool_stride: tl.int64, lens_stride: tl.int64, cache_stride: tl.int64, cu_k_stride: tl.int64,
    cu_q_stride: tl.int64, qlens_stride: tl.int64, loc_stride: tl.int64, swa_loc_stride: tl.int64,
    PAGE_SIZE: tl.constexpr, PAGE_SHIFT: tl.constexpr, PAGES_PER_PROGRAM: tl.constexpr, SUM_BLOCK: tl.constexpr,
    K_LEADING: tl.constexpr, Q_MODE: tl.constexpr, Q_LEADING: tl.constexpr, HAS_TABLE: tl.constexpr,
    FULL_V2P: tl.constexpr, SWA_MODE: tl.constexpr, ZERO_TAIL: tl.constexpr, HAS_SWA_LOC: tl.constexpr,
    FOLDED_GRID: tl.constexpr, PDL: tl.constexpr,
):
    """The semantics of ``kvdispatch.ops.decode_metadata.reference``. K_LEADING / Q_LEADING: the sums vector
    has ``batch + 1`` entries (row 0's first program writes entry 0). Q_MODE: ``Q_NONE``, ``Q_CUMSUM`` (of
    qlens) or ``Q_STRIDED`` (``(b + 1) * q_stride``). SWA_MODE: ``SWA_NONE``, ``SWA_SLOT_MAP`` (full_to_swa,
    ``mapping_len`` entries) or ``SWA_PAGE_MAP`` (swa_v2p). HAS_SWA_LOC: ``swa_loc[i] =
    mapping[out_loc[i]]`` for ``i < loc_len``, 0 below ``swa_loc_len``."""
    _launch.wait_for_producer(PDL)
    row = tl.program_id(0).to(tl.int64)
    program = _launch.program_in_row(FOLDED_GRID)
    programs = _launch.programs_in_row(FOLDED_GRID)
    if program == programs - 1:
        if row < batch:
            term = tl.load(lens_ptr + row * lens_stride).to(tl.int64) + seqlen_offset
            tl.store(cache_ptr + row * cache_stride, term.to(tl.int32))
            tl.store(cu_k_ptr + ((row + 1) if K_LEADING else row) * cu_k_stride,
                     _running_sum(lens_ptr, lens_stride, row, seqlen_offset, SUM_BLOCK))
            q_at = cu_q_ptr + ((row + 1) if Q_LEADING else row) * cu_q_stride
            if Q_MODE == 1:
                tl.store(q_at, _running_sum(qlens_ptr, qlens_stride, row, 0, SUM_BLOCK))
            if Q_MODE == 2:
                tl.store(q_at, ((row + 1) * q_stride).to(tl.int32))
        if row == 0:
            if K_LEADING:
                tl.store(cu_k_ptr, 0)
            if Q_MODE != 0 and Q_LEADING:
                tl.store(cu_q_ptr, 0)
    if HAS_TABLE:
        if row < batch:
            first = program * PAGES_PER_PROGRAM
            pool, limit = row_limit(pool_ptr, lens_ptr, row, pool_stride, lens_stride, table_rows, table_cols,
                                    seqlen_offset, True)
            row_ptr = table_ptr + pool * table_row_stride  # dereferenced below the limit only
            span = tl.maximum(width, swa_width)
            end = span if ZERO_TAIL else _launch.pages_below(limit, span, PAGE_SIZE)
            step = programs * PAGES_PER_PROGRAM
            for start in range(first, end, step):
                _metadata_pages(start, row_ptr, limit, page_table_ptr + row * page_table_stride, width,
                                swa_ptr + row * swa_stride, swa_width, mapping_ptr, mapping_len, full_v2p_ptr,
                                full_v2p_len, swa_v2p_ptr, swa_v2p_len, PAGE_SIZE, PAGE_SHIFT, PAGES_PER_PROGRAM,
                                FULL_V2P, SWA_MODE, ZERO_TAIL)
    if HAS_SWA_LOC:
        flat = row * programs + program
        stride = tl.num_programs(0).to(tl.int64) * programs * PAGES_PER_PROGRAM
        for start in range(flat * PAGES_PER_PROGRAM, swa_loc_len, stride):
            index = start + tl.arange(0, PAGES_PER_PROGRAM).to(tl.int64)
            real = index < loc_len
            locs = tl.load(loc_ptr + index * loc_stride, mask=real, other=0).to(tl.int64)
            entry = tl.minimum(locs, mapping_len - 1)  # negative for a negative location or an empty map
            mapped = tl.load(mapping_ptr + entry, mask=real & (entry >= 0), other=-1)
            tl.store(swa_loc_ptr + index * swa_loc_stride, tl.where(real, mapped, 0), mask=index < swa_loc_len)
    _launch.release_dependents(PDL)


decode_metadata_kernel = triton.jit(_decode_metadata_kernel, do_not_specialize=RUNTIME_INTS,
                                    do_not_specialize_on_alignment=POINTERS)
launcher = _launch.register(_launch.KernelLauncher(decode_metadata_kernel, CONSTEXPRS))
_plans = _launch.plan_cache(on_clear=functools.partial(native.forget_plans, "decode_metadata"))


def constexprs_for(page_size: int, k_leading: bool = True, q_mode: int = Q_NONE, q_leading: bool = True,
                   has_table: bool = True, full_v2p: bool = False, swa_mode: int = SWA_NONE, zero_tail: bool = False,
                   has_swa_loc: bool = False, folded_grid: bool = False, pdl: bool = False) -> dict:
    """The constexpr arguments of one specialisation."""
    return dict(PAGE_SIZE=page_size, PAGE_SHIFT=page_shift(page_size),
                PAGES_PER_PROGRAM=launch_grid.items_per_program(launch_grid.MAPPED_PAGE_TABLE, page_size),
                SUM_BLOCK=launch_grid.DECODE_METADATA_SUM_BLOCK, K_LEADING=k_leading, Q_MODE=q_mode,
                Q_LEADING=q_leading, HAS_TABLE=has_table, FULL_V2P=full_v2p, SWA_MODE=swa_mode, ZERO_TAIL=zero_tail,
                HAS_SWA_LOC=has_swa_loc, FOLDED_GRID=folded_grid, PDL=pdl)


def _len(t):
    return 0 if t is None else t.shape[0]


def build_decode_metadata(req_to_token, req_pool_indices, seq_lens, cache_seqlens, cu_seqlens_k, page_size,
                          seqlen_offset=0, page_table=None, swa_page_table=None, full_to_swa=None, full_v2p=None,
                          swa_v2p=None, zero_tail=False, cu_seqlens_q=None, qlens=None, q_stride=None,
                          out_cache_loc=None, swa_out_cache_loc=None, pdl=False):
    """Write one decode step's metadata in one launch; semantics of ``kvdispatch.ops.decode_metadata.reference``
    (``pdl``: programmatic dependent launch where the device supports it). Arguments arrive validated."""
    batch = req_pool_indices.shape[0]
    rows, cols = req_to_token.shape
    width = 0 if page_table is None else page_table.shape[1]
    swa_width = 0 if swa_page_table is None else swa_page_table.shape[1]
    q_mode = Q_NONE if cu_seqlens_q is None else Q_CUMSUM if qlens is not None else Q_STRIDED
    swa_mode = SWA_NONE if swa_page_table is None else SWA_PAGE_MAP if swa_v2p is not None else SWA_SLOT_MAP
    options = dict(k_leading=cu_seqlens_k.shape[0] > batch, q_mode=q_mode, q_leading=_len(cu_seqlens_q) > batch,
                   has_table=page_table is not None and batch > 0, full_v2p=full_v2p is not None, swa_mode=swa_mode,
                   zero_tail=zero_tail, has_swa_loc=swa_out_cache_loc is not None)
    optional = (page_table, swa_page_table, full_to_swa, full_v2p, swa_v2p, cu_seqlens_q, qlens, out_cache_loc,
                swa_out_cache_loc)
    pointers = tuple(cache_seqlens if t is None else t for t in optional)  # a placeholder where absent
    args = (req_to_token, req_pool_indices, seq_lens, cache_seqlens, cu_seqlens_k) + pointers + (
        batch, rows, cols, req_to_token.stride(0), width, 0 if page_table is None else page_table.stride(0),
        swa_width, 0 if swa_page_table is None else swa_page_table.stride(0), _len(full_to_swa), _len(full_v2p),
        _len(swa_v2p), seqlen_offset, q_stride or 0, min(_len(out_cache_loc), _len(swa_out_cache_loc)),
        _len(swa_out_cache_loc), req_pool_indices.stride(0), seq_lens.stride(0), cache_seqlens.stride(0),
        cu_seqlens_k.stride(0), 0 if cu_seqlens_q is None else cu_seqlens_q.stride(0),
        0 if qlens is None else qlens.stride(0), 0 if out_cache_loc is None else out_cache_loc.stride(0),
        0 if swa_out_cache_loc is None else swa_out_cache_loc.stride(0))
    span = max(width, swa_width)
    key = (cache_seqlens.get_device(), page_size, batch, span, pdl) + tuple(options.values()) + tuple(
        None if t is None else t.dtype for t in (req_pool_indices, seq_lens) + optional[2:])

    def build():
        geometry = launch_grid.decode_metadata_launch(batch, span, page_size,
                                                      budget=_launch.program_budget(cache_seqlens.device))
        constexprs = constexprs_for(page_size, folded_grid=geometry.folded, pdl=pdl, **options)
        return _launch.build_plan(_plans, launcher, key, args, cache_seqlens.device, geometry,
                                  (page_size, geometry.folded, pdl) + key[5:], constexprs)

    _launch.launch_through_plan(_plans, key, args, build)
    return cache_seqlens


def compile_specializations(warp_size, page_sizes, index_types):
    """The kernel's ``Specialization``s (``kernels_triton.specialization``), those of ``_ast_sources``."""
    kernel = jit_function(decode_metadata_kernel, POINTERS, RUNTIME_INTS)
    for signature, constexprs in _ast_sources(page_sizes, index_types):
        threads = launch_grid.decode_metadata_launch(1, 1, constexprs["PAGE_SIZE"]).threads
        yield Specialization(kernel, signature, constexprs, warps(threads, warp_size))


def _ast_sources(page_sizes, index_types):
    """The usual specialisations for ``page_sizes``: ``(signature, constexprs)`` for ``triton.compiler.ASTSource``,
    per option set (lengths only, then those of the SGLang call sites), grid form and index dtype (maps and
    locations int64)."""
    option_sets = (dict(k_leading=False, q_leading=False, has_table=False), dict(),
                   dict(k_leading=False, q_mode=Q_CUMSUM, q_leading=False, swa_mode=SWA_SLOT_MAP, has_swa_loc=True),
                   dict(q_mode=Q_STRIDED, has_table=False, has_swa_loc=True),
                   dict(full_v2p=True, zero_tail=True, swa_mode=SWA_PAGE_MAP))
    for page_size, options, index, folded in itertools.product(page_sizes, option_sets, index_types, (False, True)):
        types = dict(pool_ptr=f"*{index}", lens_ptr=f"*{index}", qlens_ptr=f"*{index}", mapping_ptr="*i64",
                     full_v2p_ptr="*i64", swa_v2p_ptr="*i64", loc_ptr="*i64", swa_loc_ptr="*i64")
        constexprs = constexprs_for(page_size, folded_grid=folded, **options)
        yield ast_signature(PARAMETERS, constexprs, types), constexprs


# The ops this module launches: ``kernels_triton.KERNELS`` reads them from this source, without importing it.
OP_LAUNCHERS = {"decode_metadata": build_decode_metadata}
