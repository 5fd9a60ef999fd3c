"""Per-request slices gathered into cache locations (``kvdispatch.create_cache_locs``), on the grid ``(batch,
programs_per_row)`` of ``kvdispatch.grid.cache_locs_launch``.

Program ``(b, k)`` of a row of ``T`` programs copies the blocks ``k, k + T, ...`` of ENTRIES_PER_PROGRAM entries of
request ``b``'s slice, from its first entry whose position lies inside the row up to the last that is read
and lands inside ``out``. A packed slice's offset is the sum of the lengths before it: each program sums them
itself, SUM_BLOCK at a time (no second launch, no host sync), saturating at ``OFFSET_LIMIT``.
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

PARAMETERS = ("table_ptr", "pool_ptr", "start_ptr", "end_ptr", "out_ptr", "positions_ptr", "full_v2p_ptr",
              "full_out_ptr", "swa_v2p_ptr", "swa_out_ptr", "table_rows", "table_cols", "table_row_stride",
              "out_len", "width", "pool_stride", "start_stride", "end_stride", "full_v2p_len", "swa_v2p_len")
POINTERS = tuple(name for name in PARAMETERS if name.endswith("_ptr"))
RUNTIME_INTS = tuple(name for name in PARAMETERS if not name.endswith("_ptr"))
CONSTEXPRS = ("ENTRIES_PER_PROGRAM", "SUM_BLOCK", "PAGE_SIZE", "OFFSET_LIMIT", "PACKED", "HAS_POSITIONS",
              "TRANSLATE_FULL", "TRANSLATE_SWA", "FOLDED_GRID", "PDL")
_BOUND = tl.constexpr(2**62)  # kvdispatch.reference.BOUND


def _cache_locs_kernel(
    table_ptr, pool_ptr, start_ptr, end_ptr, out_ptr, positions_ptr, full_v2p_ptr, full_out_ptr, swa_v2p_ptr,
    swa_out_ptr, table_rows: tl.int64, table_cols: tl.int64, table_row_stride: tl.int64, out_len: tl.int64,
    width: tl.int64, pool_stride: tl.int64, start_stride: tl.int64, end_stride: tl.int64, full_v2p_len: tl.int64,
    swa_v2p_len: tl.int64,
    ENTRIES_PER_PROGRAM: tl.constexpr, SUM_BLOCK: tl.constexpr, PAGE_SIZE: tl.constexpr, OFFSET_LIMIT: tl.constexpr,
    PACKED: tl.constexpr, HAS_POSITIONS: tl.constexpr, TRANSLATE_FULL: tl.constexpr, TRANSLATE_SWA: tl.constexpr,
    FOLDED_GRID: tl.constexpr, PDL: tl.constexpr,
):
    """Request ``b = program_id(0)``; semantics of ``kvdispatch.ops.cache_locs.reference``. PACKED: the slice is
    ``[start, end)`` at the sum of the earlier lengths (``end_ptr`` read), else ``width`` entries at ``b *
    width``. The options' pointers (and ``end_ptr`` unless PACKED) are None when absent."""
    _launch.wait_for_producer(PDL)
    row = tl.program_id(0).to(tl.int64)
    pool = tl.load(pool_ptr + row * pool_stride).to(tl.int64)
    start = tl.load(start_ptr + row * start_stride).to(tl.int64)
    if PACKED:
        length = _length(start, tl.load(end_ptr + row * end_stride).to(tl.int64), OFFSET_LIMIT)
        offset = _packed_offset(start_ptr, start_stride, end_ptr, end_stride, row, SUM_BLOCK, OFFSET_LIMIT)
    else:
        length = width
        offset = row * width
    start = tl.minimum(tl.maximum(start, -_BOUND), _BOUND)  # changes no position inside a row
    readable = (pool >= 0) & (pool < table_rows)
    # Entries [begin, stop): positions inside [0, C), destinations below out_len; none on an unreadable row.
    begin = tl.maximum(-start, 0)
    stop = tl.where(readable, tl.minimum(tl.minimum(length, table_cols - start), out_len - offset), 0)
    row_ptr = table_ptr + pool * table_row_stride  # only dereferenced inside [begin, stop)
    first = begin + _launch.program_in_row(FOLDED_GRID).to(tl.int64) * ENTRIES_PER_PROGRAM
    step = _launch.programs_in_row(FOLDED_GRID).to(tl.int64) * ENTRIES_PER_PROGRAM
    for block in range(first, stop, step):
        entry = block + tl.arange(0, ENTRIES_PER_PROGRAM).to(tl.int64)
        live = entry < stop
        position = start + entry
        destination = offset + entry
        values = tl.load(row_ptr + position, mask=live)
        tl.store(out_ptr + destination, values.to(out_ptr.dtype.element_ty), mask=live)
        if HAS_POSITIONS:
            tl.store(positions_ptr + destination, position.to(positions_ptr.dtype.element_ty), mask=live)
        if TRANSLATE_FULL:
            tl.store(full_out_ptr + destination,
                     _launch.stored_values(values, live, full_v2p_ptr, full_v2p_len, full_out_ptr, PAGE_SIZE, True),
                     mask=live)
        if TRANSLATE_SWA:
            tl.store(swa_out_ptr + destination,
                     _launch.stored_values(values, live, swa_v2p_ptr, swa_v2p_len, swa_out_ptr, PAGE_SIZE, True),
                     mask=live)
    _launch.release_dependents(PDL)


@triton.jit
def _length(start, end, OFFSET_LIMIT: tl.constexpr):
    """``min(max(end - start, 0), OFFSET_LIMIT)`` of the exact difference: where ``end > start`` it is below
    2**64, so its int64 wrap reads negative only past 2**63 - 1."""
    difference = end - start
    return tl.where(end > start, tl.where(difference < 0, OFFSET_LIMIT, tl.minimum(difference, OFFSET_LIMIT)), 0)


@triton.jit
def _packed_offset(start_ptr, start_stride, end_ptr, end_stride, count, SUM_BLOCK: tl.constexpr,
                   OFFSET_LIMIT: tl.constexpr):
    """``min(sum(_length(start[i], end[i]) for i < count), OFFSET_LIMIT)`` in int64, exactly (each term is at
    most OFFSET_LIMIT, so a pass's sum cannot wrap)."""
    total = tl.zeros((), tl.int64)
    for first in range(0, count, SUM_BLOCK):
        index = first + tl.arange(0, SUM_BLOCK).to(tl.int64)
        inside = index < count
        start = tl.load(start_ptr + index * start_stride, mask=inside, other=0).to(tl.int64)
        end = tl.load(end_ptr + index * end_stride, mask=inside, other=0).to(tl.int64)
        total = tl.minimum(total + tl.sum(_length(start, end, OFFSET_LIMIT)), OFFSET_LIMIT)
    return total


cache_locs_kernel = triton.jit(_cache_locs_kernel, do_not_specialize=RUNTIME_INTS,
                               do_not_specialize_on_alignment=POINTERS)
launcher = _launch.register(_launch.KernelLauncher(cache_locs_kernel, CONSTEXPRS))
_plans = _launch.plan_cache(on_clear=functools.partial(native.forget_plans, "cache_locs"))


def constexprs_for(page_size: int = 1, packed: bool = False, has_positions: bool = False, has_full: bool = False,
                   has_swa: bool = False, folded_grid: bool = False, pdl: bool = False) -> dict:
    """The constexpr arguments of one specialisation (tokens per program and sum block from ``kvdispatch.grid``)."""
    return dict(ENTRIES_PER_PROGRAM=launch_grid.CACHE_LOCS_ENTRIES_PER_PROGRAM,
                SUM_BLOCK=launch_grid.CACHE_LOCS_SUM_BLOCK, PAGE_SIZE=page_size,
                OFFSET_LIMIT=launch_grid.CACHE_LOCS_OFFSET_LIMIT, PACKED=packed, HAS_POSITIONS=has_positions,
                TRANSLATE_FULL=has_full, TRANSLATE_SWA=has_swa, FOLDED_GRID=folded_grid, PDL=pdl)


def _dtype(t):
    return None if t is None else t.dtype


def build_cache_locs(req_to_token, req_pool_indices, start_offset, out, end_offset=None, width=None,
                     positions_out=None, page_size=1, full_v2p=None, full_out=None, swa_v2p=None, swa_out=None,
                     pdl=False):
    """Gather every request's slice in one launch; semantics of ``kvdispatch.ops.cache_locs.reference``; ``pdl``:
    launch with programmatic dependent launch where the device supports it. Arguments arrive validated."""
    rows, cols = req_to_token.shape
    page_size = page_size if full_v2p is not None or swa_v2p is not None else 1  # one compilation without maps
    tensors = (req_to_token, req_pool_indices, start_offset, end_offset, out, positions_out, full_v2p, full_out,
               swa_v2p, swa_out)
    key = (out.get_device(), req_pool_indices.shape[0], min(cols, out.shape[0]), page_size, pdl) + tuple(
        _dtype(t) for t in tensors)
    args = (req_to_token, req_pool_indices, start_offset, end_offset, out, positions_out, full_v2p, full_out, swa_v2p,
            swa_out, rows, cols, req_to_token.stride(0), out.shape[0], width or 0, req_pool_indices.stride(0),
            start_offset.stride(0), 0 if end_offset is None else end_offset.stride(0),
            0 if full_v2p is None else full_v2p.shape[0], 0 if swa_v2p is None else swa_v2p.shape[0])

    def build():
        geometry = launch_grid.cache_locs_launch(key[1], cols, out.shape[0], budget=_launch.program_budget(out.device))
        constexprs = constexprs_for(page_size, end_offset is not None, positions_out is not None,
                                    full_v2p is not None, swa_v2p is not None, geometry.folded, pdl)
        return _launch.build_plan(_plans, launcher, key, args, out.device, geometry, (geometry.folded,) + key[3:],
                                  constexprs)

    _launch.launch_through_plan(_plans, key, args, build)
    return out


def compile_specializations(warp_size, page_sizes, index_types):
    """The kernel's ``Specialization``s (``kernels_triton.specialization``), those of ``_ast_sources``."""
    kernel = jit_function(cache_locs_kernel, POINTERS, RUNTIME_INTS)
    threads = launch_grid.cache_locs_launch(1, 1, 1).threads
    for signature, constexprs in _ast_sources(index_types, page_sizes):
        yield Specialization(kernel, signature, constexprs, warps(threads, warp_size))


def _ast_sources(index_types, page_sizes):
    """The specialisations engines ask for: yields ``(signature, constexprs)`` for ``triton.compiler.ASTSource``
    (Triton >= 3.3). An int32 table into an int64 ``out`` (SGLang's cache locations), packed or fixed, per index
    dtype; fixed with positions and both maps at ``page_sizes`` (of 1 and 64); an int64 table (a window of cache
    locations read back); the folded grid."""
    for index, packed in itertools.product(index_types, (False, True)):
        yield _specialisation(index, "i32", constexprs_for(packed=packed))
    for page_size in (size for size in (1, 64) if size in page_sizes):
        yield _specialisation("i64", "i32", constexprs_for(page_size, False, True, True, True))
    yield _specialisation("i64", "i64", constexprs_for(packed=True))
    yield _specialisation("i64", "i32", constexprs_for(folded_grid=True))


def _specialisation(index, table, constexprs):
    types = dict(table_ptr=f"*{table}", pool_ptr=f"*{index}", start_ptr=f"*{index}", out_ptr="*i64")
    constexprs = dict(constexprs)
    if constexprs["PACKED"]:
        types.update(end_ptr=f"*{index}")
    else:
        constexprs.update(end_ptr=None)
    if constexprs["HAS_POSITIONS"]:
        types.update(positions_ptr="*i64")
    else:
        constexprs.update(positions_ptr=None)
    for kind in ("full", "swa"):
        if constexprs[f"TRANSLATE_{kind.upper()}"]:
            types.update({f"{kind}_v2p_ptr": "*i64", f"{kind}_out_ptr": "*i64"})
        else:
            constexprs.update({f"{kind}_v2p_ptr": None, f"{kind}_out_ptr": None})
    return ast_signature(PARAMETERS, constexprs, types), constexprs


# The ops this module launches: ``kernels_triton.KERNELS`` reads them from this source, without importing it.
OP_LAUNCHERS = {"cache_locs": build_cache_locs}
