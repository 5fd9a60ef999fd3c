"""The block table of a ragged token CSR (``kvdispatch.create_ragged_page_table``), on the grid
``(batch, programs_per_row)`` of ``kvdispatch.grid.mapped_page_table_launch``, with the MHA page table's page
logic (``mapped_tables.mha_row``): row ``b``'s tokens are ``kv_indices[kv_indptr[b]:kv_indptr[b + 1]]``.
"""

from __future__ import annotations

import functools
import itertools

import triton
import triton.language as tl

from kvdispatch import grid as launch_grid

from . import launch as _launch
from . import native
from .mapped_tables import common_constexprs, launch_plan, mha_row
from .specialization import Specialization, ast_signature, jit_function, warps

RAGGED_PARAMETERS = ("kv_ptr", "indptr_ptr", "page_table_ptr", "swa_ptr", "mapping_ptr", "total", "width",
                     "page_table_stride", "swa_width", "swa_stride", "mapping_len", "indptr_stride")
RAGGED_CONSTEXPRS = ("PAGE_SIZE", "PAGE_SHIFT", "PAGES_PER_PROGRAM", "HAS_SWA", "ROUND_TOWARD_ZERO", "UNIT_STRIDES",
                     "FOLDED_GRID", "PDL")


def _ragged_page_table_kernel(
    kv_ptr, indptr_ptr, page_table_ptr, swa_ptr, mapping_ptr, total: tl.int64, width: tl.int64,
    page_table_stride: tl.int64, swa_width: tl.int64, swa_stride: tl.int64, mapping_len: tl.int64,
    indptr_stride: tl.int64, PAGE_SIZE: tl.constexpr, PAGE_SHIFT: tl.constexpr, PAGES_PER_PROGRAM: tl.constexpr,
    HAS_SWA: tl.constexpr, ROUND_TOWARD_ZERO: tl.constexpr, UNIT_STRIDES: tl.constexpr, FOLDED_GRID: tl.constexpr,
    PDL: tl.constexpr,
):
    """Row ``b`` reads ``kv[s + p * PAGE_SIZE]`` for ``p * PAGE_SIZE < min(e, total) - s`` (``s, e =
    indptr[b], indptr[b + 1]``; nothing when ``s`` is outside ``[0, total)``) and writes it as the MHA table does
    (``mapped_tables._mha_page_table_kernel``: the table below ``width``, with HAS_SWA its twin below
    ``swa_width``). UNIT_STRIDES: ``indptr`` is contiguous."""
    _launch.wait_for_producer(PDL)
    if UNIT_STRIDES:
        indptr_stride = 1
    row = tl.program_id(0).to(tl.int64)
    first = _launch.program_in_row(FOLDED_GRID) * PAGES_PER_PROGRAM
    start = tl.load(indptr_ptr + row * indptr_stride).to(tl.int64)
    end = tl.load(indptr_ptr + (row + 1) * indptr_stride).to(tl.int64)
    readable = (start >= 0) & (start < total)
    begin = tl.where(readable, start, 0)
    # Both ends clamped into [-1, total] first: the difference is exact.
    limit = tl.where(readable, tl.minimum(tl.maximum(end, -1), total) - begin, 0)
    mha_row(first, kv_ptr + begin, limit, page_table_ptr + row * page_table_stride, width, swa_ptr + row * swa_stride,
            swa_width, mapping_ptr, mapping_len, PAGE_SIZE, PAGE_SHIFT, PAGES_PER_PROGRAM, HAS_SWA,
            ROUND_TOWARD_ZERO, FOLDED_GRID)
    _launch.release_dependents(PDL)


KERNEL_PARAMETERS = {"ragged": (_ragged_page_table_kernel, RAGGED_PARAMETERS[:5], RAGGED_PARAMETERS[5:])}
ragged_page_table_kernel = triton.jit(_ragged_page_table_kernel, do_not_specialize=RAGGED_PARAMETERS[5:],
                                      do_not_specialize_on_alignment=RAGGED_PARAMETERS[:5])
ragged_launcher = _launch.register(_launch.KernelLauncher(ragged_page_table_kernel, RAGGED_CONSTEXPRS))
_ragged_plans = _launch.plan_cache(on_clear=functools.partial(native.forget_plans, "ragged_page_table"))


def ragged_constexprs(page_size: int, has_swa: bool, round_toward_zero: bool, unit_strides: bool = True,
                      folded_grid: bool = False, pdl: bool = False) -> dict:
    """The constexpr arguments of one ragged page-table specialisation."""
    return dict(common_constexprs(page_size, unit_strides, folded_grid, pdl), HAS_SWA=has_swa,
                ROUND_TOWARD_ZERO=round_toward_zero)


def build_ragged_page_table(kv_indices, kv_indptr, page_table, page_size, swa_page_table=None, full_to_swa=None,
                            round_toward_zero=False, pdl=False):
    """Write the block table of a ragged token CSR (and its SWA twin) in one launch; semantics of
    ``kvdispatch.ops.ragged_page_table.reference``; ``pdl`` as for ``mapped_tables.build_mha_page_table``.
    Arguments arrive validated (the op's ``check_arguments``)."""
    width = page_table.shape[1]
    has_swa = swa_page_table is not None and full_to_swa.shape[0] > 0  # an empty mapping: nothing to write
    swa_width = swa_page_table.shape[1] if has_swa else 0
    indptr_stride = kv_indptr.stride(0)
    key = (page_table.get_device(), page_size, kv_indptr.shape[0] - 1, max(width, swa_width), kv_indices.dtype,
           kv_indptr.dtype, full_to_swa.dtype if has_swa else None, round_toward_zero, indptr_stride == 1, pdl)
    args = (kv_indices, kv_indptr, page_table, swa_page_table if has_swa else page_table,
            full_to_swa if has_swa else kv_indptr, kv_indices.shape[0], width, page_table.stride(0), swa_width,
            swa_page_table.stride(0) if has_swa else 0, full_to_swa.shape[0] if has_swa else 0, indptr_stride)
    launch_plan(_ragged_plans, ragged_launcher, key, page_table, args, key[3],
                lambda folded: ragged_constexprs(page_size, has_swa, round_toward_zero, indptr_stride == 1, folded,
                                                 pdl))
    return page_table


def compile_specializations(warp_size, page_sizes, index_types):
    """The kernel's ``Specialization``s (``kernels_triton.specialization``), those of ``_ast_sources``."""
    kernel = jit_function(*KERNEL_PARAMETERS["ragged"])
    for _, signature, constexprs in _ast_sources(page_sizes, index_types):
        threads = launch_grid.mapped_page_table_launch(1, 1, constexprs["PAGE_SIZE"]).threads
        yield Specialization(kernel, signature, constexprs, warps(threads, warp_size))


def _ast_sources(page_sizes, index_types):
    """The specialisations for ``page_sizes``: yields ``(kernel name, signature, constexprs)``, per option set,
    grid form, CSR dtype (``kv_indices`` and ``kv_indptr`` of one dtype, as engines allocate them; a mixed
    pair compiles at its first call) and mapping dtype."""
    for page_size, (swa, round_toward_zero, unit, folded), index, lookup in itertools.product(
            page_sizes, itertools.product((False, True), repeat=4), index_types, ("i32", "i64")):
        if not swa and lookup != "i32":
            continue  # without SWA the mapping pointer is a placeholder (kv_indptr)
        types = dict(kv_ptr=f"*{index}", indptr_ptr=f"*{index}", mapping_ptr=f"*{lookup}" if swa else f"*{index}")
        constexprs = ragged_constexprs(page_size, swa, round_toward_zero, unit, folded)
        yield "ragged", ast_signature(RAGGED_PARAMETERS, constexprs, types), constexprs


# The ops this module launches: ``kernels_triton.KERNELS`` reads them from this source, without importing it.
OP_LAUNCHERS = {"ragged_page_table": build_ragged_page_table}
