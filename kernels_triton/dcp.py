"""Decode-context-parallel index builders on the grid ``(batch, programs_per_row)`` of ``kvdispatch.grid``.

* ``build_dcp_token_indices``: one rank's token CSR. Program ``(b, k)`` of a row of ``T`` programs copies the
  blocks of tokens ``j`` in ``skip_b + [i * TOKENS_PER_PROGRAM, (i + 1) * TOKENS_PER_PROGRAM)``, ``i = k,
  k + T, ...``, of request ``b``, reading every ``DCP_SIZE``-th position of its table row from the rank's
  first one (a strided gather), as the token CSR does with consecutive positions.
* ``build_dcp_page_table``: the rank-local block table. Program ``(b, k)`` handles the blocks of pages
  ``[i * PAGES_PER_PROGRAM, (i + 1) * PAGES_PER_PROGRAM)``, ``i = k, k + T, ...``, of row ``b``, up to the
  row's real pages; each page is one gather, one virtual page (``PAGE_SIZE * DCP_SIZE`` positions) after the
  last.

The DCP size, page size and rounding are compile-time (divisions by constants); the rank, sizes and strides
are runtime ints, so every rank and buffer shape shares one compilation. Calls whose sizes and strides are all
below 2**31 read two packed words in place of four parameters (the first 64 bytes of parameters then hold
everything the kernel reads before its gather).
"""

from __future__ import annotations

import functools
import itertools

import triton
import triton.language as tl

from kvdispatch import grid as launch_grid

from . import launch as _launch
from . import native
from .page_table import page_shift
from .specialization import Specialization, ast_signature, jit_function, warps

WIDE = _launch.WIDE

CSR_PARAMETERS = ("table_ptr", "pool_ptr", "lens_ptr", "indptr_ptr", "out_ptr", "packed_table", "packed_sizes",
                  "dcp_rank", "start_ptr", "table_rows", "table_cols", "table_row_stride", "out_len", "pool_stride",
                  "lens_stride", "indptr_stride", "start_stride")
CSR_CONSTEXPRS = ("TOKENS_PER_PROGRAM", "DCP_SIZE", "DCP_SHIFT", "HAS_START", "UNIT_STRIDES", "WIDE_INDEXING",
                  "FOLDED_GRID", "ROUND_TOWARD_ZERO", "PDL")
TABLE_PARAMETERS = ("table_ptr", "pool_ptr", "lens_ptr", "out_ptr", "packed_table", "packed_out", "dcp_rank",
                    "fill_value", "out_width", "table_rows", "table_row_stride", "out_row_stride", "page_limit",
                    "pool_stride", "lens_stride", "v2p_ptr", "v2p_len")
# Without a v2p its pointer is passed as None (compiled as a constant) and its length as 0.
TABLE_CONSTEXPRS = ("PAGE_SIZE", "VIRTUAL_PAGE", "VIRTUAL_SHIFT", "PAGES_PER_PROGRAM", "HAS_FILL", "UNIT_STRIDES",
                    "WIDE_INDEXING", "FOLDED_GRID", "ROUND_TOWARD_ZERO", "PDL", "HAS_V2P")
# The ``kernel.fn`` parameters of both kernels are the names above; ``crosscompile`` reads these tuples.
PARAMETERS = {"csr": CSR_PARAMETERS, "table": TABLE_PARAMETERS}
POINTERS = {op: tuple(n for n in names if n.endswith("_ptr")) for op, names in PARAMETERS.items()}
RUNTIME_INTS = {op: tuple(n for n in names if not n.endswith("_ptr")) for op, names in PARAMETERS.items()}


def _dcp_token_csr_kernel(
    table_ptr, pool_ptr, lens_ptr, indptr_ptr, out_ptr, packed_table: tl.int64, packed_sizes: tl.int64,
    dcp_rank: tl.int64, start_ptr, table_rows: tl.int64, table_cols: tl.int64, table_row_stride: tl.int64,
    out_len: tl.int64, pool_stride: tl.int64, lens_stride: tl.int64, indptr_stride: tl.int64, start_stride: tl.int64,
    TOKENS_PER_PROGRAM: tl.constexpr, DCP_SIZE: tl.constexpr, DCP_SHIFT: tl.constexpr, HAS_START: tl.constexpr,
    UNIT_STRIDES: tl.constexpr, WIDE_INDEXING: tl.constexpr, FOLDED_GRID: tl.constexpr,
    ROUND_TOWARD_ZERO: tl.constexpr, PDL: tl.constexpr,
):
    """``out[indptr[b] + j] = table[pool[b], first_b + j * DCP_SIZE] // DCP_SIZE`` for the program's tokens
    ``j`` below ``min(lens[b], ceil((C - first_b) / DCP_SIZE))`` whose target lies in ``[0, out_len)``, where
    ``first_b`` is the first position ``>= start[b]`` (0 without a start) congruent to ``dcp_rank``.

    WIDE_INDEXING: some size or stride is ``WIDE`` or more (``launch.csr_packed_words``), so the full-width
    parameters are read; otherwise ``packed_table`` and ``packed_sizes`` stand in for them. UNIT_STRIDES,
    FOLDED_GRID: as in the token-CSR kernel, whose blocks of tokens a row's programs share out the same way.
    """
    _launch.wait_for_producer(PDL)
    if UNIT_STRIDES:
        start_stride = 1
    row, pool, length, target_start, table_rows, table_cols, table_row_stride, out_len = _launch.csr_row_header(
        pool_ptr, lens_ptr, indptr_ptr, packed_table, packed_sizes, table_rows, table_cols, table_row_stride,
        out_len, pool_stride, lens_stride, indptr_stride, UNIT_STRIDES, WIDE_INDEXING)
    rank = dcp_rank.to(tl.int64)
    if HAS_START:
        start = tl.load(start_ptr + row * start_stride).to(tl.int64)
        start = tl.minimum(tl.maximum(start, -(2**62)), 2**62)  # no table comes near: the same rows, no wrap
        ahead = (rank - start) % DCP_SIZE  # truncating: in (-DCP_SIZE, DCP_SIZE)
        first = start + tl.where(ahead < 0, ahead + DCP_SIZE, ahead)
    else:
        first = rank
    readable = (pool >= 0) & (pool < table_rows) & (first >= 0) & (first < table_cols)
    room = (table_cols - first + (DCP_SIZE - 1)) // DCP_SIZE  # positive where readable
    count = tl.where(readable, tl.minimum(length, room), 0)
    # The tokens that land in out are j in [skip, end): the grid gives a row min(ceil(C / DCP_SIZE), N) of them.
    skip = tl.maximum(-target_start, 0)
    end = tl.minimum(count, out_len - target_start)
    first_token = skip + _launch.program_in_row(FOLDED_GRID) * TOKENS_PER_PROGRAM
    row_ptr = table_ptr + pool * table_row_stride + first
    if first_token < end:
        _copy_rank_tokens(first_token, end, row_ptr, out_ptr + target_start, TOKENS_PER_PROGRAM, DCP_SIZE,
                          DCP_SHIFT, ROUND_TOWARD_ZERO)
    step = _launch.programs_in_row(FOLDED_GRID) * TOKENS_PER_PROGRAM
    for later in range(first_token + step, end, step):
        _copy_rank_tokens(later, end, row_ptr, out_ptr + target_start, TOKENS_PER_PROGRAM, DCP_SIZE, DCP_SHIFT,
                          ROUND_TOWARD_ZERO)
    _launch.release_dependents(PDL)


@triton.jit
def _copy_rank_tokens(first, end, row_ptr, target_ptr, TOKENS_PER_PROGRAM: tl.constexpr, DCP_SIZE: tl.constexpr,
                      DCP_SHIFT: tl.constexpr, ROUND_TOWARD_ZERO: tl.constexpr):
    """Tokens ``j`` in ``[first, min(first + TOKENS_PER_PROGRAM, end))`` of a row: ``target[j] = row[j *
    DCP_SIZE] // DCP_SIZE``, ``row`` at the rank's first position of the table row."""
    token = first + tl.arange(0, TOKENS_PER_PROGRAM)
    copied = token < end
    slots = tl.load(row_ptr + token * DCP_SIZE, mask=copied)
    values = _launch.divide(slots, DCP_SIZE, DCP_SHIFT, ROUND_TOWARD_ZERO)
    tl.store(target_ptr + token, values.to(target_ptr.dtype.element_ty), mask=copied)


def _dcp_page_table_kernel(
    table_ptr, pool_ptr, lens_ptr, out_ptr, packed_table: tl.int64, packed_out: tl.int64, dcp_rank: tl.int64,
    fill_value: tl.int64, out_width: tl.int64, table_rows: tl.int64, table_row_stride: tl.int64,
    out_row_stride: tl.int64, page_limit: tl.int64, pool_stride: tl.int64, lens_stride: tl.int64, v2p_ptr,
    v2p_len: tl.int64,
    PAGE_SIZE: tl.constexpr, VIRTUAL_PAGE: tl.constexpr, VIRTUAL_SHIFT: tl.constexpr,
    PAGES_PER_PROGRAM: tl.constexpr, HAS_FILL: tl.constexpr, UNIT_STRIDES: tl.constexpr,
    WIDE_INDEXING: tl.constexpr, FOLDED_GRID: tl.constexpr, ROUND_TOWARD_ZERO: tl.constexpr, PDL: tl.constexpr,
    HAS_V2P: tl.constexpr,
):
    """``out[b, p] = table[pool[b], dcp_rank + p * VIRTUAL_PAGE] // VIRTUAL_PAGE`` for the program's pages
    ``p < page_limit`` with ``p * PAGE_SIZE < lens[b]`` on a readable row (``0 <= pool[b] < table_rows``);
    with HAS_FILL the other columns below ``out_width`` get ``fill_value``. Program ``k`` of a row handles its
    blocks of PAGES_PER_PROGRAM pages ``k, k + T, ...`` (``T``: ``launch.programs_in_row``) up to the row's
    real pages (the width's with HAS_FILL).

    ``page_limit`` = min(width, pages whose source position lies inside a table row), from the host.
    WIDE_INDEXING: some size or stride is ``WIDE`` or more (``table_packed_words``): the full-width parameters
    are read; otherwise ``packed_table`` (rows | row stride << 32) and ``packed_out`` (page limit | out row
    stride << 32) stand in for them. HAS_V2P: each page ``q`` (0 for a negative slot) is written as
    ``max(v2p[q], 0)``, 0 for ``q >= v2p_len``.
    """
    _launch.wait_for_producer(PDL)
    row = tl.program_id(0)
    first = _launch.program_in_row(FOLDED_GRID) * PAGES_PER_PROGRAM
    if UNIT_STRIDES:
        pool_stride, lens_stride = 1, 1
    pool = tl.load(pool_ptr + row * pool_stride).to(tl.int64)
    length = tl.load(lens_ptr + row * lens_stride).to(tl.int64)
    if not WIDE_INDEXING:
        packed_table, packed_out = packed_table.to(tl.int64), packed_out.to(tl.int64)
        table_rows, table_row_stride = packed_table & 0xFFFFFFFF, packed_table >> 32
        page_limit, out_row_stride = packed_out & 0xFFFFFFFF, packed_out >> 32
    # An unreadable row's limit is 0, below every position.
    limit = tl.where((pool >= 0) & (pool < table_rows), length, 0)
    # Only dereferenced under a block's in-row mask, where the row is readable.
    row_ptr = table_ptr + pool * table_row_stride + dcp_rank
    out_row = out_ptr + row.to(tl.int64) * out_row_stride
    _rank_pages(first, row_ptr, out_row, limit, page_limit, fill_value, out_width, v2p_ptr, v2p_len, PAGE_SIZE,
                VIRTUAL_PAGE, VIRTUAL_SHIFT, PAGES_PER_PROGRAM, HAS_FILL, ROUND_TOWARD_ZERO, HAS_V2P)
    # The row's further blocks: with HAS_FILL every column below the width is written (a value or the fill).
    pages_end = out_width if HAS_FILL else _launch.pages_below(limit, page_limit, PAGE_SIZE)
    step = _launch.programs_in_row(FOLDED_GRID) * PAGES_PER_PROGRAM
    for later in range(first + step, pages_end, step):
        _rank_pages(later, row_ptr, out_row, limit, page_limit, fill_value, out_width, v2p_ptr, v2p_len, PAGE_SIZE,
                    VIRTUAL_PAGE, VIRTUAL_SHIFT, PAGES_PER_PROGRAM, HAS_FILL, ROUND_TOWARD_ZERO, HAS_V2P)
    _launch.release_dependents(PDL)


@triton.jit
def _rank_pages(first, row_ptr, out_row, limit, page_limit, fill_value, out_width, v2p_ptr, v2p_len,
                PAGE_SIZE: tl.constexpr, VIRTUAL_PAGE: tl.constexpr, VIRTUAL_SHIFT: tl.constexpr,
                PAGES_PER_PROGRAM: tl.constexpr, HAS_FILL: tl.constexpr, ROUND_TOWARD_ZERO: tl.constexpr,
                HAS_V2P: tl.constexpr):
    """Pages ``[first, first + PAGES_PER_PROGRAM)`` of a rank's row: page ``p < page_limit`` with ``p *
    PAGE_SIZE < limit`` is ``row[p * VIRTUAL_PAGE] // VIRTUAL_PAGE``; with HAS_FILL the other columns below
    ``out_width`` get ``fill_value``."""
    page = (first + tl.arange(0, PAGES_PER_PROGRAM)).to(tl.int64)
    position = page * PAGE_SIZE  # the page's first token among the rank's tokens
    # Masks combine blocks only: Triton 3.9's interpreter takes no mask made from a scalar and a block.
    in_row = (page < page_limit) & (position < limit)
    slots = tl.load(row_ptr + page * VIRTUAL_PAGE, mask=in_row, other=0)
    values = _launch.divide(slots, VIRTUAL_PAGE, VIRTUAL_SHIFT, ROUND_TOWARD_ZERO)
    if HAS_V2P:
        values = tl.where(slots < 0, 0, values)
        physical = tl.load(v2p_ptr + values, mask=in_row & (values < v2p_len), other=0)
        values = tl.maximum(physical, 0).to(tl.int32)
    if HAS_FILL:
        tl.store(out_row + page, tl.where(in_row, values, fill_value.to(tl.int32)), mask=page < out_width)
    else:
        tl.store(out_row + page, values, mask=in_row)


dcp_token_csr_kernel = triton.jit(_dcp_token_csr_kernel, do_not_specialize=RUNTIME_INTS["csr"],
                                  do_not_specialize_on_alignment=POINTERS["csr"])
dcp_page_table_kernel = triton.jit(_dcp_page_table_kernel, do_not_specialize=RUNTIME_INTS["table"],
                                   do_not_specialize_on_alignment=POINTERS["table"])
csr_launcher = _launch.register(_launch.KernelLauncher(dcp_token_csr_kernel, CSR_CONSTEXPRS))
table_launcher = _launch.register(_launch.KernelLauncher(dcp_page_table_kernel, TABLE_CONSTEXPRS))
_csr_plans = _launch.plan_cache(on_clear=functools.partial(native.forget_plans, "dcp_token_csr"))
_table_plans = _launch.plan_cache(on_clear=functools.partial(native.forget_plans, "dcp_page_table"))


def csr_constexprs(dcp_size: int, has_start: bool, round_toward_zero: bool = False, unit_strides: bool = True,
                   wide_indexing: bool = False, folded_grid: bool = False, pdl: bool = False) -> dict:
    """The constexpr arguments of one DCP token-CSR specialisation."""
    return dict(TOKENS_PER_PROGRAM=launch_grid.items_per_program(launch_grid.DCP_TOKEN_CSR), DCP_SIZE=dcp_size,
                DCP_SHIFT=page_shift(dcp_size), HAS_START=has_start, UNIT_STRIDES=unit_strides,
                WIDE_INDEXING=wide_indexing, FOLDED_GRID=folded_grid, ROUND_TOWARD_ZERO=round_toward_zero, PDL=pdl)


def table_constexprs(page_size: int, dcp_size: int, has_fill: bool, round_toward_zero: bool = False,
                     unit_strides: bool = True, wide_indexing: bool = False, folded_grid: bool = False,
                     pdl: bool = False, has_v2p: bool = False) -> dict:
    """The constexpr arguments of one DCP page-table specialisation."""
    virtual_page = page_size * dcp_size
    return dict(PAGE_SIZE=page_size, VIRTUAL_PAGE=virtual_page, VIRTUAL_SHIFT=page_shift(virtual_page),
                PAGES_PER_PROGRAM=launch_grid.items_per_program(launch_grid.DCP_PAGE_TABLE, page_size),
                HAS_FILL=has_fill, UNIT_STRIDES=unit_strides, WIDE_INDEXING=wide_indexing, FOLDED_GRID=folded_grid,
                ROUND_TOWARD_ZERO=round_toward_zero, PDL=pdl, HAS_V2P=has_v2p)


def table_packed_words(rows: int, table_stride: int, page_limit: int, out_stride: int) -> tuple[int, int] | None:
    """The page-table kernel's ``packed_table`` (rows | table row stride << 32) and ``packed_out`` (page limit |
    out row stride << 32), or None when a value is ``WIDE`` or more."""
    if (rows | table_stride | page_limit | out_stride) >= WIDE:  # one of them is (none is negative)
        return None
    return rows | table_stride << 32, page_limit | out_stride << 32


def _run(plans, launcher, key, args, make_plan):
    """Launch ``args`` through the plan of ``key``, building it with ``make_plan()`` (which returns the geometry,
    the specialisation and its constexprs) the first time; the first launch of a new kernel is the plan's."""
    def build():
        geometry, specialisation, constexprs = make_plan()
        return _launch.build_plan(plans, launcher, key, args, args[3].device, geometry, specialisation, constexprs)

    _launch.launch_through_plan(plans, key, args, build)


def build_dcp_token_indices(req_to_token, req_pool_indices, local_seq_lens, kv_indptr, out, dcp_size, dcp_rank,
                            kv_start_idx=None, round_toward_zero=False, pdl=False):
    """Write one DCP rank's token CSR into ``out`` (int32/int64 ``[N]``); semantics of
    ``kvdispatch.ops.dcp_token_csr.reference``; ``pdl``: launch with programmatic dependent launch where
    the device supports it. Untouched: every position no request writes.
    Arguments arrive validated (the op's ``check_arguments``)."""
    has_start = kv_start_idx is not None
    rows, cols = req_to_token.shape
    table_stride, out_len = req_to_token.stride(0), out.shape[0]
    strides = (req_pool_indices.stride(0), local_seq_lens.stride(0), kv_indptr.stride(0),
               kv_start_idx.stride(0) if has_start else 1)
    unit_strides = strides == (1, 1, 1, 1)
    packed = _launch.csr_packed_words(rows, table_stride, cols, out_len)
    batch, span = req_pool_indices.shape[0], min(-(-cols // dcp_size), out_len)
    key = (out.get_device(), batch, span, dcp_size, req_pool_indices.dtype, local_seq_lens.dtype, kv_indptr.dtype,
           kv_start_idx.dtype if has_start else None, unit_strides, packed is None, out.dtype, round_toward_zero, pdl)
    args = (req_to_token, req_pool_indices, local_seq_lens, kv_indptr, out, *(packed or (0, 0)), dcp_rank,
            kv_start_idx if has_start else req_to_token, rows, cols, table_stride, out_len, *strides)

    def make_plan():
        geometry = launch_grid.dcp_token_csr_launch(batch, cols, out_len, dcp_size,
                                                    budget=_launch.program_budget(out.device))
        constexprs = csr_constexprs(dcp_size, has_start, round_toward_zero, unit_strides, packed is None,
                                    geometry.folded, pdl)
        return geometry, key[3:] + (geometry.folded,), constexprs

    _run(_csr_plans, csr_launcher, key, args, make_plan)
    return out


def build_dcp_page_table(req_to_token, req_pool_indices, local_seq_lens, out, page_size, dcp_size, dcp_rank,
                         fill_value=None, round_toward_zero=False, v2p=None, pdl=False):
    """Write one DCP rank's block table into ``out`` (int32 ``[>= B, W]``); semantics of
    ``kvdispatch.ops.dcp_page_table.reference`` (``pdl`` as for ``build_dcp_token_indices``). Untouched: rows
    ``>= B``; without ``fill_value``, the columns past each row's pages. Arguments arrive validated (the op's
    ``check_arguments``)."""
    has_fill = fill_value is not None
    rows, cols = req_to_token.shape
    table_stride, width, out_stride = req_to_token.stride(0), out.shape[1], out.stride(0)
    virtual_page = page_size * dcp_size
    page_limit = min(width, -(-(cols - dcp_rank) // virtual_page)) if cols > dcp_rank else 0
    strides = (req_pool_indices.stride(0), local_seq_lens.stride(0))
    unit_strides = strides == (1, 1)
    packed = table_packed_words(rows, table_stride, page_limit, out_stride)
    batch = req_pool_indices.shape[0]
    has_v2p = v2p is not None
    key = (out.get_device(), batch, width, page_size, dcp_size, req_pool_indices.dtype, local_seq_lens.dtype,
           has_fill, unit_strides, packed is None, round_toward_zero, pdl, v2p.dtype if has_v2p else None)
    args = (req_to_token, req_pool_indices, local_seq_lens, out, *(packed or (0, 0)), dcp_rank,
            fill_value if has_fill else 0, width, rows, table_stride, out_stride, page_limit, *strides, v2p,
            v2p.shape[0] if has_v2p else 0)

    def make_plan():
        geometry = launch_grid.dcp_page_table_launch(batch, width, page_size,
                                                     budget=_launch.program_budget(out.device))
        constexprs = table_constexprs(page_size, dcp_size, has_fill, round_toward_zero, unit_strides, packed is None,
                                      geometry.folded, pdl, has_v2p)
        return geometry, key[3:] + (geometry.folded,), constexprs

    _run(_table_plans, table_launcher, key, args, make_plan)
    return out


# The (page size, DCP size) pairs compiled ahead of time (``crosscompile``): the page sizes engines use with DCP.
SPECIALISED_PAGE_SIZES = (1, 16, 32, 64)
SPECIALISED_DCP_SIZES = (2, 4, 8)


def compile_specializations(warp_size, page_sizes, index_types):
    """Both kernels' ``Specialization``s (``kernels_triton.specialization``): the token CSR's, then the page
    table's at its own ``SPECIALISED_PAGE_SIZES`` (``page_sizes`` unused)."""
    csr_kernel = jit_function(dcp_token_csr_kernel, POINTERS["csr"], RUNTIME_INTS["csr"])
    threads = launch_grid.dcp_token_csr_launch(1, 1, 1, 1).threads
    for signature, constexprs in _csr_ast_sources(index_types):
        yield Specialization(csr_kernel, signature, constexprs, warps(threads, warp_size))
    table_kernel = jit_function(dcp_page_table_kernel, POINTERS["table"], RUNTIME_INTS["table"])
    for signature, constexprs in _table_ast_sources(index_types):
        threads = launch_grid.dcp_page_table_launch(1, 1, constexprs["PAGE_SIZE"]).threads
        yield Specialization(table_kernel, signature, constexprs, warps(threads, warp_size))


def _csr_ast_sources(index_types, dcp_sizes=SPECIALISED_DCP_SIZES):
    """``(signature, constexprs)`` of the DCP token-CSR kernel: per DCP size, start, rounding, out dtype and
    index dtype on the usual grid with unit strides; then the other flags (strided index vectors, wide
    indexing, a folded grid) once each."""
    combos = [(size, start, rtz, out, index, True, False, False) for size, start, rtz, out, index in
              itertools.product(dcp_sizes, (False, True), (False, True), ("i32", "i64"), index_types)]
    combos += [(dcp_sizes[0], True, False, "i64", index_types[0], *flags)
               for flags in ((False, False, False), (True, True, False), (True, False, True))]
    for size, start, rtz, out, index, unit, wide, folded in combos:
        constexprs = csr_constexprs(size, start, rtz, unit, wide, folded)
        types = dict(pool_ptr=f"*{index}", lens_ptr=f"*{index}", indptr_ptr=f"*{index}", out_ptr=f"*{out}",
                     start_ptr=f"*{index}" if start else "*i32")
        yield ast_signature(CSR_PARAMETERS, constexprs, types), constexprs


def _table_ast_sources(index_types, page_sizes=SPECIALISED_PAGE_SIZES, dcp_sizes=SPECIALISED_DCP_SIZES):
    """``(signature, constexprs)`` of the DCP page-table kernel: per page size, DCP size, rounding (or a fill
    value, rounding down) and index dtype on the usual grid; then the other flags once each; then a v2p of either
    dtype per page size."""
    combos = [(page, size, fill, rtz, index, True, False, False) for page, size, (fill, rtz), index in
              itertools.product(page_sizes, dcp_sizes, ((False, False), (False, True), (True, False)), index_types)]
    combos += [(page_sizes[-1], dcp_sizes[0], False, True, index_types[0], *flags)
               for flags in ((False, False, False), (True, True, False), (True, False, True))]
    combos = [combo + (None,) for combo in combos] + [
        (page, dcp_sizes[0], False, False, index_types[0], True, False, False, v2p)
        for page, v2p in itertools.product(page_sizes, ("i32", "i64"))]
    for page, size, fill, rtz, index, unit, wide, folded, v2p in combos:
        constexprs = table_constexprs(page, size, fill, rtz, unit, wide, folded, has_v2p=v2p is not None)
        types = dict(pool_ptr=f"*{index}", lens_ptr=f"*{index}")
        if v2p is None:
            constexprs.update(v2p_ptr=None)
        else:
            types.update(v2p_ptr=f"*{v2p}")
        yield ast_signature(TABLE_PARAMETERS, constexprs, types), constexprs


# The ops this module launches: ``kernels_triton.KERNELS`` reads them from this source, without importing it.
OP_LAUNCHERS = {"dcp_token_csr": build_dcp_token_indices, "dcp_page_table": build_dcp_page_table}
