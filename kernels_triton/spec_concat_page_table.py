"""Each draft token's row, its request's prefix row then its expand row (``kvdispatch.create_spec_concat_page_table``),
on the grid ``(rows, programs_per_row)`` of ``kvdispatch.grid.mapped_page_table_launch`` at page size 1: program
``(m, k)`` owns row ``m``'s columns ``[k * COLUMNS, (k + 1) * COLUMNS)`` and every ``programs_in_row``-th block
after, up to the row's entries.
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

CONCAT_PARAMETERS = ("a_ptr", "b_ptr", "lens_a_ptr", "lens_b_ptr", "out_ptr", "draft_tokens", "width_a", "a_stride",
                     "width_b", "b_stride", "width", "out_stride", "lens_a_stride", "lens_b_stride")
CONCAT_CONSTEXPRS = ("COLUMNS", "FOLDED_GRID", "PDL")


def _spec_concat_page_table_kernel(
    a_ptr, b_ptr, lens_a_ptr, lens_b_ptr, out_ptr, draft_tokens: tl.int64, width_a: tl.int64, a_stride: tl.int64,
    width_b: tl.int64, b_stride: tl.int64, width: tl.int64, out_stride: tl.int64, lens_a_stride: tl.int64,
    lens_b_stride: tl.int64, COLUMNS: tl.constexpr, FOLDED_GRID: tl.constexpr, PDL: tl.constexpr,
):
    """Row ``m = program_id(0)``, request ``m // draft_tokens``: ``ops.spec_concat_page_table.reference`` (the
    lengths clamped into [-2**62, 2**62]: the sum is exact)."""
    _launch.wait_for_producer(PDL)
    row = tl.program_id(0).to(tl.int64)
    request = row // draft_tokens
    first = tl.minimum(tl.maximum(tl.load(lens_a_ptr + request * lens_a_stride).to(tl.int64), -(2**62)), 2**62)
    second = tl.minimum(tl.maximum(tl.load(lens_b_ptr + row * lens_b_stride).to(tl.int64), -(2**62)), 2**62)
    limit = tl.minimum(first + second, width)
    a_row = a_ptr + request * a_stride
    b_row = b_ptr + row * b_stride
    out_row = out_ptr + row * out_stride
    step = _launch.programs_in_row(FOLDED_GRID) * COLUMNS
    for block in range(_launch.program_in_row(FOLDED_GRID) * COLUMNS, limit, step):
        n = block + tl.arange(0, COLUMNS)
        live = n < limit
        in_a = n < first
        column = n - first
        values = tl.load(a_row + n, mask=live & in_a & (n < width_a), other=0)
        values = tl.where(in_a, values, tl.load(b_row + column, mask=live & ~in_a & (column < width_b), other=0))
        tl.store(out_row + n, values, mask=live)
    _launch.release_dependents(PDL)


KERNEL_PARAMETERS = {"concat": (_spec_concat_page_table_kernel, CONCAT_PARAMETERS[:5], CONCAT_PARAMETERS[5:])}
spec_concat_page_table_kernel = triton.jit(_spec_concat_page_table_kernel, do_not_specialize=CONCAT_PARAMETERS[5:],
                                           do_not_specialize_on_alignment=CONCAT_PARAMETERS[:5])
concat_launcher = _launch.register(_launch.KernelLauncher(spec_concat_page_table_kernel, CONCAT_CONSTEXPRS))
_concat_plans = _launch.plan_cache(on_clear=functools.partial(native.forget_plans, "spec_concat_page_table"))


def concat_constexprs(folded_grid: bool = False, pdl: bool = False) -> dict:
    """The constexpr arguments of one specialisation."""
    return dict(COLUMNS=launch_grid.items_per_program(launch_grid.MAPPED_PAGE_TABLE, 1), FOLDED_GRID=folded_grid,
                PDL=pdl)


def build_spec_concat_page_table(page_table_a, page_table_b, seq_lens_a, seq_lens_b, out, draft_tokens, pdl=False):
    """Write every draft token's concatenated row in one launch; semantics of
    ``kvdispatch.ops.spec_concat_page_table.reference``; ``pdl`` as for ``mapped_tables.build_mha_page_table``.
    Arguments arrive validated (the op's ``check_arguments``)."""
    key = (out.get_device(), 1, seq_lens_b.shape[0], out.shape[1], seq_lens_a.dtype, seq_lens_b.dtype, pdl)
    args = (page_table_a, page_table_b, seq_lens_a, seq_lens_b, out, draft_tokens, page_table_a.shape[1],
            page_table_a.stride(0), page_table_b.shape[1], page_table_b.stride(0), out.shape[1], out.stride(0),
            seq_lens_a.stride(0), seq_lens_b.stride(0))
    launch_plan(_concat_plans, concat_launcher, key, out, args, key[3], lambda folded: concat_constexprs(folded, pdl))
    return out


def compile_specializations(warp_size, page_sizes, index_types):
    """The kernel's ``Specialization``s (``kernels_triton.specialization``), those of ``_ast_sources`` (no page
    size: ``page_sizes`` unused)."""
    kernel = jit_function(*KERNEL_PARAMETERS["concat"])
    threads = launch_grid.mapped_page_table_launch(1, 1, 1).threads
    for _, signature, constexprs in _ast_sources(index_types):
        yield Specialization(kernel, signature, constexprs, warps(threads, warp_size))


def _ast_sources(index_types):
    """Every specialisation: yields ``(kernel name, signature, constexprs)`` per grid form and length dtype."""
    for folded, index in itertools.product((False, True), index_types):
        constexprs = concat_constexprs(folded)
        types = dict(lens_a_ptr=f"*{index}", lens_b_ptr=f"*{index}")
        yield "concat", ast_signature(CONCAT_PARAMETERS, constexprs, types), constexprs


# The ops this module launches: ``kernels_triton.KERNELS`` reads them from this source, without importing it.
OP_LAUNCHERS = {"spec_concat_page_table": build_spec_concat_page_table}
