"""The prefill-aware sliding-window token table (``kvdispatch.create_prefill_aware_swa_table``), on the grid
``(batch, programs_per_row)`` of ``kvdispatch.grid.mapped_page_table_launch`` at page size 1: program ``(b, k)``
owns row ``b``'s columns ``[k * TOKENS, (k + 1) * TOKENS)``, then every ``programs_in_row``-th block after, up
to the row's tokens; program ``(b, 0)`` writes ``kv_lens_out[b]``.
"""

from __future__ import annotations

import functools
import itertools

import triton
import triton.language as tl

from kvdispatch import grid as launch_grid

from . import launch as _launch
from . import native
from .mapped_tables import launch_plan
from .specialization import Specialization, ast_signature, jit_function, warps

PA_PARAMETERS = ("table_ptr", "pool_ptr", "lens_ptr", "prefill_ptr", "out_ptr", "kv_lens_ptr", "table_rows",
                 "table_cols", "table_row_stride", "prefill_count", "width", "out_row_stride", "kv_lens_stride",
                 "window_size", "pool_stride", "lens_stride")
PA_CONSTEXPRS = ("TOKENS", "UNIT_STRIDES", "FOLDED_GRID", "PDL")


def _pa_swa_table_kernel(
    table_ptr, pool_ptr, lens_ptr, prefill_ptr, out_ptr, kv_lens_ptr, table_rows: tl.int64, table_cols: tl.int64,
    table_row_stride: tl.int64, prefill_count: tl.int64, width: tl.int64, out_row_stride: tl.int64,
    kv_lens_stride: tl.int64, window_size: tl.int64, pool_stride: tl.int64, lens_stride: tl.int64,
    TOKENS: tl.constexpr, UNIT_STRIDES: tl.constexpr, FOLDED_GRID: tl.constexpr, PDL: tl.constexpr,
):
    """``n = min(s, f + window_size)`` (``s = lens[b]``, ``f = prefill[pool[b]]``, 0 outside ``prefill_count``;
    both clamped into [-2**62, 2**62]: no sum wraps) into ``kv_lens[b]``; ``out[b, j] = table[pool[b], q]``, ``q =
    j`` below ``f``, else ``j + max(s - window_size - f, 0)``, for ``j < min(n, width)`` and ``q < table_cols`` on
    a readable row. UNIT_STRIDES: the index vectors are contiguous."""
    _launch.wait_for_producer(PDL)
    if UNIT_STRIDES:
        pool_stride, lens_stride = 1, 1
    row = tl.program_id(0).to(tl.int64)
    program = _launch.program_in_row(FOLDED_GRID)
    pool = tl.load(pool_ptr + row * pool_stride).to(tl.int64)
    length = tl.minimum(tl.maximum(tl.load(lens_ptr + row * lens_stride).to(tl.int64), -(2**62)), 2**62)
    in_prefill = (pool >= 0) & (pool < prefill_count)
    prefill = tl.load(prefill_ptr + tl.where(in_prefill, pool, 0), mask=in_prefill, other=0).to(tl.int64)
    prefill = tl.minimum(tl.maximum(prefill, -(2**62)), 2**62)
    kept = tl.minimum(length, prefill + window_size)
    if program == 0:
        tl.store(kv_lens_ptr + row * kv_lens_stride, kept.to(tl.int32))
    gap = tl.maximum(length - window_size - tl.maximum(prefill, -(2**61)), 0)  # below -2**61: no token
    readable = (pool >= 0) & (pool < table_rows)
    limit = tl.where(readable, tl.minimum(kept, width), 0)
    row_ptr = table_ptr + tl.where(readable, pool, 0) * table_row_stride
    out_row = out_ptr + row * out_row_stride
    step = _launch.programs_in_row(FOLDED_GRID) * TOKENS
    for first in range(program * TOKENS, limit, step):
        j = first + tl.arange(0, TOKENS)
        position = tl.where(j < prefill, j, j + gap)
        live = (j < limit) & (position < table_cols)
        tl.store(out_row + j, tl.load(row_ptr + position, mask=live), mask=live)
    _launch.release_dependents(PDL)


KERNEL_PARAMETERS = {"pa_swa": (_pa_swa_table_kernel, PA_PARAMETERS[:6], PA_PARAMETERS[6:])}
pa_swa_table_kernel = triton.jit(_pa_swa_table_kernel, do_not_specialize=PA_PARAMETERS[6:],
                                 do_not_specialize_on_alignment=PA_PARAMETERS[:6])
pa_launcher = _launch.register(_launch.KernelLauncher(pa_swa_table_kernel, PA_CONSTEXPRS))
_pa_plans = _launch.plan_cache(on_clear=functools.partial(native.forget_plans, "pa_swa_table"))


def pa_constexprs(unit_strides: bool = True, folded_grid: bool = False, pdl: bool = False) -> dict:
    """The constexpr arguments of one prefill-aware table specialisation."""
    return dict(TOKENS=launch_grid.items_per_program(launch_grid.MAPPED_PAGE_TABLE, 1), UNIT_STRIDES=unit_strides,
                FOLDED_GRID=folded_grid, PDL=pdl)


def build_pa_swa_table(req_to_token, req_pool_indices, seq_lens, prefill_lens, out, kv_lens_out, window_size,
                       pdl=False):
    """Write the prefill-aware sliding-window table and its lengths in one launch; semantics of
    ``kvdispatch.ops.pa_swa_table.reference``; ``pdl`` as for ``mapped_tables.build_mha_page_table``. Arguments
    arrive validated (the op's ``check_arguments``)."""
    rows, cols = req_to_token.shape
    pool_stride, lens_stride = req_pool_indices.stride(0), seq_lens.stride(0)
    unit_strides = pool_stride == 1 and lens_stride == 1
    # At least one column: program (b, 0) writes kv_lens_out[b] whatever the width.
    key = (out.get_device(), 1, req_pool_indices.shape[0], max(out.shape[1], 1), req_pool_indices.dtype,
           seq_lens.dtype, prefill_lens.dtype, unit_strides, pdl)
    args = (req_to_token, req_pool_indices, seq_lens, prefill_lens, out, kv_lens_out, rows, cols,
            req_to_token.stride(0), prefill_lens.shape[0], out.shape[1], out.stride(0), kv_lens_out.stride(0),
            window_size, pool_stride, lens_stride)
    launch_plan(_pa_plans, pa_launcher, key, out, args, key[3],
                lambda folded: pa_constexprs(unit_strides, folded, pdl))
    return out


def compile_specializations(warp_size, page_sizes, index_types):
    """The kernel's ``Specialization``s (``kernels_triton.specialization``), those of ``_ast_sources`` (page size 1
    only: ``page_sizes`` unused)."""
    kernel = jit_function(*KERNEL_PARAMETERS["pa_swa"])
    threads = launch_grid.mapped_page_table_launch(1, 1, 1).threads
    for _, signature, constexprs in _ast_sources(index_types):
        yield Specialization(kernel, signature, constexprs, warps(threads, warp_size))


def _ast_sources(index_types):
    """Every specialisation: yields ``(kernel name, signature, constexprs)`` per grid form, index-vector dtype and
    ``prefill_lens`` dtype."""
    for (unit, folded), index, prefill in itertools.product(itertools.product((False, True), repeat=2), index_types,
                                                            ("i32", "i64")):
        types = dict(pool_ptr=f"*{index}", lens_ptr=f"*{index}", prefill_ptr=f"*{prefill}")
        constexprs = pa_constexprs(unit, folded)
        yield "pa_swa", ast_signature(PA_PARAMETERS, constexprs, types), constexprs


# The ops this module launches: ``kernels_triton.KERNELS`` reads them from this source, without importing it.
OP_LAUNCHERS = {"pa_swa_table": build_pa_swa_table}
