"""The token CSR over a gathered prefix+extend buffer (``kvdispatch.create_prefix_extend_kv_indices``) on the grid
``(batch, programs_per_row)`` of ``kvdispatch.grid``.

Program ``(b, k)`` of a row of ``T`` programs writes the blocks of entries ``j`` in ``skip_b + [i *
ENTRIES_PER_PROGRAM, (i + 1) * ENTRIES_PER_PROGRAM)``, ``i = k, k + T, ...``, of request ``b``: positions computed
from the row's prefix and extend starts, read from no table. Every size is a runtime int: one compilation per
dtype set.
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

PARAMETERS = ("prefix_lens_ptr", "prefix_starts_ptr", "extend_lens_ptr", "extend_starts_ptr", "indptr_ptr", "out_ptr",
              "out_len", "extend_base", "prefix_lens_stride", "prefix_starts_stride", "extend_lens_stride",
              "extend_starts_stride", "indptr_stride")
CONSTEXPRS = ("ENTRIES_PER_PROGRAM", "FOLDED_GRID", "PDL")
POINTERS = tuple(n for n in PARAMETERS if n.endswith("_ptr"))
RUNTIME_INTS = tuple(n for n in PARAMETERS if not n.endswith("_ptr"))


def _prefix_extend_csr_kernel(
    prefix_lens_ptr, prefix_starts_ptr, extend_lens_ptr, extend_starts_ptr, indptr_ptr, out_ptr, out_len: tl.int64,
    extend_base: tl.int64, prefix_lens_stride: tl.int64, prefix_starts_stride: tl.int64,
    extend_lens_stride: tl.int64, extend_starts_stride: tl.int64, indptr_stride: tl.int64,
    ENTRIES_PER_PROGRAM: tl.constexpr, FOLDED_GRID: tl.constexpr, PDL: tl.constexpr,
):
    """``out[indptr[b] + j]`` for the program's entries ``j < P_b + E_b`` whose target lies in ``[0, out_len)``:
    ``prefix_starts[b] + j`` below ``P_b``, ``extend_base + extend_starts[b] + j - P_b`` after (lengths clamped
    into ``[0, 2**61]``; values wrap as int64 sums do)."""
    _launch.wait_for_producer(PDL)
    row = tl.program_id(0).to(tl.int64)
    prefix = tl.load(prefix_lens_ptr + row * prefix_lens_stride).to(tl.int64)
    extend = tl.load(extend_lens_ptr + row * extend_lens_stride).to(tl.int64)
    prefix_start = tl.load(prefix_starts_ptr + row * prefix_starts_stride).to(tl.int64)
    extend_start = tl.load(extend_starts_ptr + row * extend_starts_stride).to(tl.int64)
    target_start = tl.load(indptr_ptr + row * indptr_stride).to(tl.int64)
    target_start = tl.minimum(tl.maximum(target_start, -(2**62)), 2**62)
    prefix = tl.minimum(tl.maximum(prefix, 0), 2**61)
    count = prefix + tl.minimum(tl.maximum(extend, 0), 2**61)
    extend_first = extend_base + extend_start - prefix  # the value at j is this + j past the prefix
    skip = tl.maximum(-target_start, 0)
    end = tl.minimum(count, out_len - target_start)
    first_entry = skip + _launch.program_in_row(FOLDED_GRID) * ENTRIES_PER_PROGRAM
    entries_step = _launch.programs_in_row(FOLDED_GRID) * ENTRIES_PER_PROGRAM
    for block in range(first_entry, end, entries_step):
        entry = block + tl.arange(0, ENTRIES_PER_PROGRAM).to(tl.int64)
        values = tl.where(entry < prefix, prefix_start + entry, extend_first + entry)
        tl.store(out_ptr + target_start + entry, values.to(out_ptr.dtype.element_ty), mask=entry < end)
    _launch.release_dependents(PDL)


prefix_extend_csr_kernel = triton.jit(_prefix_extend_csr_kernel, do_not_specialize=RUNTIME_INTS,
                                      do_not_specialize_on_alignment=POINTERS)
launcher = _launch.register(_launch.KernelLauncher(prefix_extend_csr_kernel, CONSTEXPRS))
_plans = _launch.plan_cache(on_clear=functools.partial(native.forget_plans, "prefix_extend_csr"))


def constexprs(folded_grid: bool = False, pdl: bool = False) -> dict:
    """The constexpr arguments of one specialisation."""
    return dict(ENTRIES_PER_PROGRAM=launch_grid.items_per_program(launch_grid.TOKEN_CSR), FOLDED_GRID=folded_grid,
                PDL=pdl)


def build_prefix_extend_kv_indices(prefix_lens, prefix_starts, extend_lens, extend_starts, kv_indptr, out,
                                   extend_base=0, pdl=False):
    """Write the prefix+extend CSR into ``out`` (int32/int64 ``[N]``); semantics of
    ``kvdispatch.ops.prefix_extend_csr.reference``; ``pdl``: programmatic dependent launch where the device supports
    it. Untouched: every position no request writes. Arguments arrive validated (the op's ``check_arguments``)."""
    vectors = (prefix_lens, prefix_starts, extend_lens, extend_starts, kv_indptr)
    batch, out_len = prefix_lens.shape[0], out.shape[0]
    key = (out.get_device(), batch, out_len, *(t.dtype for t in vectors), out.dtype, pdl)
    args = (*vectors, out, out_len, extend_base, *(t.stride(0) for t in vectors))

    def build():
        geometry = launch_grid.prefix_extend_csr_launch(batch, out_len, budget=_launch.program_budget(out.device))
        return _launch.build_plan(_plans, launcher, key, args, out.device, geometry, key[3:] + (geometry.folded,),
                                  constexprs(geometry.folded, pdl))

    _launch.launch_through_plan(_plans, key, args, build)
    return out


def compile_specializations(warp_size, page_sizes, index_types):
    """The kernel's ``Specialization``s (``kernels_triton.specialization``), those of ``_ast_sources`` (no page
    size: ``page_sizes`` unused)."""
    kernel = jit_function(prefix_extend_csr_kernel, POINTERS, RUNTIME_INTS)
    threads = launch_grid.prefix_extend_csr_launch(1, 1).threads
    for signature, constexprs in _ast_sources(index_types):
        yield Specialization(kernel, signature, constexprs, warps(threads, warp_size))


def _ast_sources(index_types):
    """``(signature, constexprs)`` per index dtype of the lengths and starts, of ``kv_indptr`` and of ``out`` on
    the usual grid, then a folded grid once."""
    combos = [(lens, indptr, out, False) for lens, indptr, out in itertools.product(index_types, index_types,
                                                                                    ("i32", "i64"))]
    combos.append((index_types[0], index_types[0], "i32", True))
    for lens, indptr, out, folded in combos:
        flags = constexprs(folded)
        signature = {name: "i64" for name in RUNTIME_INTS}
        signature.update({name: f"*{lens}" for name in POINTERS[:4]}, indptr_ptr=f"*{indptr}", out_ptr=f"*{out}")
        signature.update({name: "constexpr" for name in flags})
        yield signature, flags


# The ops this module launches: ``kernels_triton.KERNELS`` reads them from this source, without importing it.
OP_LAUNCHERS = {"prefix_extend_csr": build_prefix_extend_kv_indices}
