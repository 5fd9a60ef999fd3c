"""Two token CSRs merged row by row (``kvdispatch.create_merged_kv_indices``), on the token CSR's grid
``(batch, programs_per_row)`` of ``kvdispatch.grid.token_csr_launch``: program ``(b, k)`` sums the earlier rows'
lengths itself (blocks of SUM_BLOCK requests: the prefix sums on the device, no other launch), then copies row
``b``'s entries ``[k * TOKENS, (k + 1) * TOKENS)`` and every ``programs_in_row``-th block after; program
``(b, 0)`` writes ``kv_indptr_out[b + 1]`` (and ``(0, 0)`` its first entry).
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

MERGED_PARAMETERS = ("prefix_indptr_ptr", "prefix_ptr", "start_ptr", "lens_ptr", "extend_ptr", "indptr_out_ptr",
                     "out_ptr", "batch", "prefix_count", "extend_count", "total", "prefix_indptr_stride",
                     "start_stride", "lens_stride")
MERGED_CONSTEXPRS = ("TOKENS", "SUM_BLOCK", "FOLDED_GRID", "PDL")


@triton.jit
def _parts(prefix_indptr_ptr, start_ptr, lens_ptr, rows, prefix_count, extend_count, prefix_indptr_stride,
           start_stride, lens_stride):
    """``(prefix start, prefix length, extend start, extend length)`` of the requests ``rows`` (a block or one
    index, in range), as ``ops.merged_token_csr._lengths`` gives them, in int64."""
    start = tl.load(prefix_indptr_ptr + rows * prefix_indptr_stride).to(tl.int64)
    end = tl.load(prefix_indptr_ptr + (rows + 1) * prefix_indptr_stride).to(tl.int64)
    readable = (start >= 0) & (start < prefix_count)
    prefix = tl.where(readable, tl.minimum(tl.maximum(end, -1), prefix_count) - start, 0)
    first = tl.load(start_ptr + rows * start_stride).to(tl.int64)
    inside = (first >= 0) & (first < extend_count)
    count = tl.minimum(tl.maximum(tl.load(lens_ptr + rows * lens_stride).to(tl.int64), -1), extend_count)
    extend = tl.where(inside, tl.minimum(count, extend_count - first), 0)
    return start, tl.maximum(prefix, 0), first, tl.maximum(extend, 0)


def _merged_token_csr_kernel(
    prefix_indptr_ptr, prefix_ptr, start_ptr, lens_ptr, extend_ptr, indptr_out_ptr, out_ptr, batch: tl.int64,
    prefix_count: tl.int64, extend_count: tl.int64, total: tl.int64, prefix_indptr_stride: tl.int64,
    start_stride: tl.int64, lens_stride: tl.int64, TOKENS: tl.constexpr, SUM_BLOCK: tl.constexpr,
    FOLDED_GRID: tl.constexpr, PDL: tl.constexpr,
):
    """Row ``b = program_id(0)`` of the merged CSR (``ops.merged_token_csr.reference``); every length is at most
    its array's size, so the sums are exact in int64."""
    _launch.wait_for_producer(PDL)
    row = tl.program_id(0).to(tl.int64)
    program = _launch.program_in_row(FOLDED_GRID)
    begin = row * 0
    for block in range(0, row, SUM_BLOCK):
        earlier = block + tl.arange(0, SUM_BLOCK)
        listed = earlier < row
        earlier = tl.where(listed, earlier, 0)
        _, prefix, _, extend = _parts(prefix_indptr_ptr, start_ptr, lens_ptr, earlier, prefix_count, extend_count,
                                      prefix_indptr_stride, start_stride, lens_stride)
        begin += tl.sum(tl.where(listed, prefix + extend, 0), axis=0)
    start, prefix, first, extend = _parts(prefix_indptr_ptr, start_ptr, lens_ptr, row, prefix_count, extend_count,
                                          prefix_indptr_stride, start_stride, lens_stride)
    length = prefix + extend
    if program == 0:
        tl.store(indptr_out_ptr + row + 1, (begin + length).to(indptr_out_ptr.dtype.element_ty))
        if row == 0:
            tl.store(indptr_out_ptr, begin.to(indptr_out_ptr.dtype.element_ty))  # row 0 begins at 0
    limit = tl.minimum(length, tl.maximum(total - begin, 0))  # the row ends at the end of out
    step = _launch.programs_in_row(FOLDED_GRID) * TOKENS
    for block in range(program * TOKENS, limit, step):
        j = block + tl.arange(0, TOKENS)
        live = j < limit
        from_prefix = live & (j < prefix)
        from_extend = live & (j >= prefix)
        values = tl.load(prefix_ptr + start + j, mask=from_prefix, other=0).to(tl.int64)
        values = tl.where(from_extend, tl.load(extend_ptr + first + j - prefix, mask=from_extend, other=0).to(tl.int64),
                          values)
        tl.store(out_ptr + begin + j, values.to(out_ptr.dtype.element_ty), mask=live)
    _launch.release_dependents(PDL)


KERNEL_PARAMETERS = {"merged": (_merged_token_csr_kernel, MERGED_PARAMETERS[:7], MERGED_PARAMETERS[7:])}
merged_token_csr_kernel = triton.jit(_merged_token_csr_kernel, do_not_specialize=MERGED_PARAMETERS[7:],
                                     do_not_specialize_on_alignment=MERGED_PARAMETERS[:7])
merged_launcher = _launch.register(_launch.KernelLauncher(merged_token_csr_kernel, MERGED_CONSTEXPRS))
_merged_plans = _launch.plan_cache(on_clear=functools.partial(native.forget_plans, "merged_token_csr"))


def merged_constexprs(folded_grid: bool = False, pdl: bool = False) -> dict:
    """The constexpr arguments of one merged-CSR specialisation."""
    return dict(TOKENS=launch_grid.items_per_program(launch_grid.TOKEN_CSR), SUM_BLOCK=launch_grid.MERGED_SUM_BLOCK,
                FOLDED_GRID=folded_grid, PDL=pdl)


def build_merged_kv_indices(prefix_kv_indptr, prefix_kv_indices, extend_start_loc, extend_seq_lens,
                            extend_kv_indices, kv_indptr_out, out, pdl=False):
    """Write the merged CSR and its ``kv_indptr`` in one launch; semantics of
    ``kvdispatch.ops.merged_token_csr.reference``; ``pdl`` as for ``mapped_tables.build_mha_page_table``.
    Arguments arrive validated (the op's ``check_arguments``)."""
    batch = extend_seq_lens.shape[0]
    prefix_count, extend_count, total = prefix_kv_indices.shape[0], extend_kv_indices.shape[0], out.shape[0]
    # A row holds at most both arrays' entries; at least one program per row writes its kv_indptr_out entry.
    span = max(min(prefix_count + extend_count, total), 1)
    key = (out.get_device(), batch, span, prefix_kv_indptr.dtype, prefix_kv_indices.dtype, extend_start_loc.dtype,
           extend_seq_lens.dtype, extend_kv_indices.dtype, kv_indptr_out.dtype, out.dtype, pdl)
    args = (prefix_kv_indptr, prefix_kv_indices, extend_start_loc, extend_seq_lens, extend_kv_indices, kv_indptr_out,
            out, batch, prefix_count, extend_count, total, prefix_kv_indptr.stride(0), extend_start_loc.stride(0),
            extend_seq_lens.stride(0))

    def build():
        geometry = launch_grid.token_csr_launch(batch, span, span, budget=_launch.program_budget(out.device))
        return _launch.build_plan(_merged_plans, merged_launcher, key, args, out.device, geometry,
                                  (geometry.folded,) + key[3:], merged_constexprs(geometry.folded, pdl))

    _launch.launch_through_plan(_merged_plans, key, args, build)
    return out


def compile_specializations(warp_size, page_sizes, index_types):
    """The kernel's ``Specialization``s (``kernels_triton.specialization``), those of ``_ast_sources`` (no page
    size: ``page_sizes`` unused)."""
    kernel = jit_function(*KERNEL_PARAMETERS["merged"])
    threads = launch_grid.token_csr_launch(1, 1, 1).threads
    for _, signature, constexprs in _ast_sources(index_types):
        yield Specialization(kernel, signature, constexprs, warps(threads, warp_size))


def _ast_sources(index_types):
    """The specialisations: yields ``(kernel name, signature, constexprs)`` per grid form, index-vector dtype
    (the CSRs' bounds and lengths), entry dtype (both arrays and ``out``) and ``kv_indptr_out`` dtype; a mixed
    set of dtypes compiles at its first call."""
    for folded, index, entries, indptr in itertools.product((False, True), index_types, ("i32", "i64"),
                                                            ("i32", "i64")):
        types = dict(prefix_indptr_ptr=f"*{index}", start_ptr=f"*{index}", lens_ptr=f"*{index}",
                     prefix_ptr=f"*{entries}", extend_ptr=f"*{entries}", out_ptr=f"*{entries}",
                     indptr_out_ptr=f"*{indptr}")
        constexprs = merged_constexprs(folded)
        yield "merged", ast_signature(MERGED_PARAMETERS, constexprs, types), constexprs


# The ops this module launches: ``kernels_triton.KERNELS`` reads them from this source, without importing it.
OP_LAUNCHERS = {"merged_token_csr": build_merged_kv_indices}
