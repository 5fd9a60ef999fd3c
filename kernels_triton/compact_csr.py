"""The compacted CSR (``kvdispatch.create_compact_kv_indices``) on the grid ``(batch, programs_per_row)`` of
``kvdispatch.grid``.

Program ``(b, k)`` of a row of ``T`` programs copies the blocks of entries ``j`` in ``skip_b + [i *
ENTRIES_PER_PROGRAM, (i + 1) * ENTRIES_PER_PROGRAM)``, ``i = k, k + T, ...``, of request ``b``: every ``step``-th
entry of its source row from its first position (a strided gather), as the DCP token CSR copies its rank's
tokens. Program 0 of a row writes an empty request's placeholder. Sizes, strides, the row step, offset and step
are runtime ints: every shape shares one compilation per option set.
"""

from __future__ import annotations

import functools
import itertools

import triton
import triton.language as tl

from kvdispatch import grid as launch_grid

from . import launch as _launch
from . import native
from .specialization import Specialization, jit_function, warps

PARAMETERS = ("source_ptr", "lens_ptr", "indptr_ptr", "out_ptr", "start_ptr", "source_rows", "source_cols",
              "source_row_stride", "out_len", "row_step", "offset", "step", "max_count", "empty_fill", "lens_stride",
              "indptr_stride", "start_stride")
CONSTEXPRS = ("ENTRIES_PER_PROGRAM", "HAS_START", "HAS_FILL", "FOLDED_GRID", "PDL")
POINTERS = tuple(n for n in PARAMETERS if n.endswith("_ptr"))
RUNTIME_INTS = tuple(n for n in PARAMETERS if not n.endswith("_ptr"))
_BOUND = 2**62


def _compact_csr_kernel(
    source_ptr, lens_ptr, indptr_ptr, out_ptr, start_ptr, source_rows: tl.int64, source_cols: tl.int64,
    source_row_stride: tl.int64, out_len: tl.int64, row_step: tl.int64, offset: tl.int64, step: tl.int64,
    max_count: tl.int64, empty_fill: tl.int64, lens_stride: tl.int64, indptr_stride: tl.int64,
    start_stride: tl.int64,
    ENTRIES_PER_PROGRAM: tl.constexpr, HAS_START: tl.constexpr, HAS_FILL: tl.constexpr, FOLDED_GRID: tl.constexpr,
    PDL: tl.constexpr,
):
    """``out[indptr[b] + j] = source[b * row_step, first_b + j * step]`` for the program's entries ``j`` below
    ``min(lens[b], ceil((C - first_b) / step), max_count)`` whose target lies in ``[0, out_len)``, ``first_b =
    start[b] + offset`` (``offset`` without HAS_START); an unreadable row (source row ``>= source_rows``, first
    position outside ``[0, C)``) writes none. HAS_FILL: a request with ``lens[b] == 0`` writes ``empty_fill`` at
    ``out[indptr[b]]`` (program 0 of its row)."""
    _launch.wait_for_producer(PDL)
    row = tl.program_id(0).to(tl.int64)
    length = tl.load(lens_ptr + row * lens_stride).to(tl.int64)
    target_start = tl.load(indptr_ptr + row * indptr_stride).to(tl.int64)
    target_start = tl.minimum(tl.maximum(target_start, -(2**62)), 2**62)
    first = offset.to(tl.int64)
    if HAS_START:
        start = tl.load(start_ptr + row * start_stride).to(tl.int64)
        first += tl.minimum(tl.maximum(start, -(2**62)), 2**62)
    source_row = row * row_step
    readable = (source_row < source_rows) & (first >= 0) & (first < source_cols)
    first = tl.where(readable, first, 0)
    source_row = tl.where(readable, source_row, 0)
    room = (source_cols - first + (step - 1)) // step
    count = tl.where(readable, tl.minimum(tl.minimum(length, room), max_count), 0)
    program = _launch.program_in_row(FOLDED_GRID)
    if HAS_FILL:
        if (program == 0) & (length == 0) & (target_start >= 0) & (target_start < out_len):
            tl.store(out_ptr + target_start, empty_fill.to(out_ptr.dtype.element_ty))
    skip = tl.maximum(-target_start, 0)
    end = tl.minimum(count, out_len - target_start)
    first_entry = skip + program * ENTRIES_PER_PROGRAM
    row_ptr = source_ptr + source_row * source_row_stride + first
    entries_step = _launch.programs_in_row(FOLDED_GRID) * ENTRIES_PER_PROGRAM
    for block in range(first_entry, end, entries_step):
        entry = block + tl.arange(0, ENTRIES_PER_PROGRAM)
        copied = entry < end
        values = tl.load(row_ptr + entry * step, mask=copied)
        tl.store(out_ptr + target_start + entry, values.to(out_ptr.dtype.element_ty), mask=copied)
    _launch.release_dependents(PDL)


compact_csr_kernel = triton.jit(_compact_csr_kernel, do_not_specialize=RUNTIME_INTS,
                                do_not_specialize_on_alignment=POINTERS)
launcher = _launch.register(_launch.KernelLauncher(compact_csr_kernel, CONSTEXPRS))
_plans = _launch.plan_cache(on_clear=functools.partial(native.forget_plans, "compact_csr"))


def constexprs(has_start: bool, has_fill: bool, folded_grid: bool = False, pdl: bool = False) -> dict:
    """The constexpr arguments of one specialisation."""
    return dict(ENTRIES_PER_PROGRAM=launch_grid.items_per_program(launch_grid.TOKEN_CSR), HAS_START=has_start,
                HAS_FILL=has_fill, FOLDED_GRID=folded_grid, PDL=pdl)


def build_compact_kv_indices(source, lens, kv_indptr, out, row_step=1, source_indptr=None, offset=0, step=1,
                             empty_fill=None, max_count=None, pdl=False):
    """Write the compacted CSR into ``out`` (int32/int64 ``[N]``); semantics of
    ``kvdispatch.ops.compact_csr.reference``; ``pdl``: programmatic dependent launch where the device supports
    it. Untouched: every position no request writes. Arguments arrive validated (the op's ``check_arguments``)."""
    has_start, has_fill = source_indptr is not None, empty_fill is not None
    rows, cols = source.shape
    batch, out_len = lens.shape[0], out.shape[0]
    key = (out.get_device(), batch, min(-(-cols // step), out_len), lens.dtype, kv_indptr.dtype,
           source_indptr.dtype if has_start else None, has_fill, out.dtype, pdl)
    args = (source, lens, kv_indptr, out, source_indptr if has_start else source, rows, cols, source.stride(0),
            out_len, row_step, offset, step, _BOUND if max_count is None else max_count,
            empty_fill if has_fill else 0, lens.stride(0), kv_indptr.stride(0),
            source_indptr.stride(0) if has_start else 0)

    def build():
        geometry = launch_grid.compact_csr_launch(batch, cols, out_len, step,
                                                  budget=_launch.program_budget(out.device))
        return _launch.build_plan(_plans, launcher, key, args, out.device, geometry, key[3:] + (geometry.folded,),
                                  constexprs(has_start, has_fill, geometry.folded, pdl))

    _launch.launch_through_plan(_plans, key, args, build)
    return out


def compile_specializations(warp_size, page_sizes, index_types):
    """The kernel's ``Specialization``s (``kernels_triton.specialization``), those of ``_ast_sources`` (no page
    size: ``page_sizes`` unused)."""
    kernel = jit_function(compact_csr_kernel, POINTERS, RUNTIME_INTS)
    threads = launch_grid.compact_csr_launch(1, 1, 1, 1).threads
    for signature, constexprs in _ast_sources(index_types):
        yield Specialization(kernel, signature, constexprs, warps(threads, warp_size))


def _ast_sources(index_types):
    """``(signature, constexprs)`` per start, placeholder, out dtype and index dtype on the usual grid, then a
    folded grid once."""
    combos = [(*flags, out, index, False) for flags, out, index in
              itertools.product(itertools.product((False, True), (False, True)), ("i32", "i64"), index_types)]
    combos.append((True, True, "i32", index_types[0], True))
    for start, fill, out, index, folded in combos:
        flags = constexprs(start, fill, folded)
        signature = {name: "i64" for name in RUNTIME_INTS}
        signature.update(source_ptr="*i32", lens_ptr=f"*{index}", indptr_ptr=f"*{index}", out_ptr=f"*{out}",
                         start_ptr=f"*{index}" if start else "*i32")
        signature.update({name: "constexpr" for name in flags})
        yield signature, flags


# The ops this module launches: ``kernels_triton.KERNELS`` reads them from this source, without importing it.
OP_LAUNCHERS = {"compact_csr": build_compact_kv_indices}
