"""A draft model's compact token-table rows (``kvdispatch.build_compact_draft_rows``), on the grid ``(batch,
programs_per_row)`` of ``kvdispatch.grid.compact_draft_rows_launch``.

Program ``(b, k)`` of a row of ``T`` programs writes the blocks ``k, k + T, ...`` of ENTRIES_PER_PROGRAM columns
of request ``b``'s draft row, up to ``min(n + K, C_draft)`` read on the device: the target's suffix below ``n``,
the verify slots after it.
"""

from __future__ import annotations

import functools

import triton
import triton.language as tl

from kvdispatch import grid as launch_grid

from . import launch as _launch
from . import native
from .specialization import Specialization, ast_signature, jit_function, warps

PARAMETERS = ("draft_ptr", "target_ptr", "pool_ptr", "start_ptr", "lens_ptr", "verify_ptr", "draft_rows",
              "draft_cols", "draft_row_stride", "target_rows", "target_cols", "target_row_stride", "verify_width",
              "verify_row_stride", "pool_stride", "start_stride", "lens_stride")
POINTERS = tuple(name for name in PARAMETERS if name.endswith("_ptr"))
RUNTIME_INTS = tuple(name for name in PARAMETERS if not name.endswith("_ptr"))
CONSTEXPRS = ("ENTRIES_PER_PROGRAM", "FOLDED_GRID", "PDL")
_BOUND = tl.constexpr(2**62)  # kvdispatch.reference.BOUND


def _compact_draft_rows_kernel(
    draft_ptr, target_ptr, pool_ptr, start_ptr, lens_ptr, verify_ptr, draft_rows: tl.int64, draft_cols: tl.int64,
    draft_row_stride: tl.int64, target_rows: tl.int64, target_cols: tl.int64, target_row_stride: tl.int64,
    verify_width: tl.int64, verify_row_stride: tl.int64, pool_stride: tl.int64, start_stride: tl.int64,
    lens_stride: tl.int64,
    ENTRIES_PER_PROGRAM: tl.constexpr, FOLDED_GRID: tl.constexpr, PDL: tl.constexpr,
):
    """Request ``b = program_id(0)``; semantics of ``kvdispatch.ops.compact_draft_rows.reference``."""
    _launch.wait_for_producer(PDL)
    b = tl.program_id(0).to(tl.int64)
    pool = tl.load(pool_ptr + b * pool_stride).to(tl.int64)
    length = tl.load(lens_ptr + b * lens_stride).to(tl.int64)
    start = tl.load(start_ptr + b * start_stride).to(tl.int64)
    start = tl.minimum(tl.maximum(start, -_BOUND), _BOUND)  # changes no position inside a row
    valid = (pool >= 0) & (pool < draft_rows) & (pool < target_rows) & (length >= 0)
    length = tl.minimum(length, draft_cols)
    stop = tl.where(valid, tl.minimum(length + verify_width, draft_cols), 0)
    draft_row = draft_ptr + pool * draft_row_stride  # only dereferenced below stop
    target_row = target_ptr + pool * target_row_stride
    verify_row = verify_ptr + b * verify_row_stride
    first = _launch.program_in_row(FOLDED_GRID).to(tl.int64) * ENTRIES_PER_PROGRAM
    step = _launch.programs_in_row(FOLDED_GRID).to(tl.int64) * ENTRIES_PER_PROGRAM
    for block in range(first, stop, step):
        column = block + tl.arange(0, ENTRIES_PER_PROGRAM).to(tl.int64)
        live = column < stop
        in_prefix = column < length
        position = start + column
        read = live & in_prefix & (position >= 0) & (position < target_cols)
        from_verify = live & ~in_prefix
        suffix = tl.load(target_row + position, mask=read, other=0).to(tl.int64)
        slots = tl.load(verify_row + (column - length), mask=from_verify, other=0).to(tl.int64)
        values = tl.where(in_prefix, suffix, slots)
        tl.store(draft_row + column, values.to(draft_ptr.dtype.element_ty), mask=read | from_verify)
    _launch.release_dependents(PDL)


compact_draft_rows_kernel = triton.jit(_compact_draft_rows_kernel, do_not_specialize=RUNTIME_INTS,
                                       do_not_specialize_on_alignment=POINTERS)
launcher = _launch.register(_launch.KernelLauncher(compact_draft_rows_kernel, CONSTEXPRS))
_plans = _launch.plan_cache(on_clear=functools.partial(native.forget_plans, "compact_draft_rows"))


def constexprs_for(folded_grid: bool = False, pdl: bool = False) -> dict:
    """The constexpr arguments of one specialisation (columns per program from ``kvdispatch.grid``)."""
    return dict(ENTRIES_PER_PROGRAM=launch_grid.COMPACT_DRAFT_ROWS_ENTRIES_PER_PROGRAM, FOLDED_GRID=folded_grid,
                PDL=pdl)


def build_compact_draft_rows(target_req_to_token, req_pool_indices, suffix_start, draft_prefix_lens, verify_locs,
                             draft_req_to_token, pdl=False):
    """Rebuild every request's draft row in one launch; semantics of
    ``kvdispatch.ops.compact_draft_rows.reference``; ``pdl``: launch with programmatic dependent launch where the
    device supports it. Arguments arrive validated."""
    tensors = (draft_req_to_token, target_req_to_token, req_pool_indices, suffix_start, draft_prefix_lens,
               verify_locs)
    device = draft_req_to_token.device
    batch, cols = req_pool_indices.shape[0], draft_req_to_token.shape[1]
    key = (draft_req_to_token.get_device(), batch, cols, pdl) + tuple(t.dtype for t in tensors)
    args = tensors + (draft_req_to_token.shape[0], cols, draft_req_to_token.stride(0), target_req_to_token.shape[0],
                      target_req_to_token.shape[1], target_req_to_token.stride(0), verify_locs.shape[1],
                      verify_locs.stride(0), req_pool_indices.stride(0), suffix_start.stride(0),
                      draft_prefix_lens.stride(0))

    def build():
        geometry = launch_grid.compact_draft_rows_launch(batch, cols, budget=_launch.program_budget(device))
        return _launch.build_plan(_plans, launcher, key, args, device, geometry, (geometry.folded,) + key[3:],
                                  constexprs_for(geometry.folded, pdl))

    _launch.launch_through_plan(_plans, key, args, build)
    return draft_req_to_token


def compile_specializations(warp_size, page_sizes, index_types):
    """The kernel's ``Specialization``s (``kernels_triton.specialization``), those of ``_ast_sources`` (no page
    size: ``page_sizes`` unused)."""
    kernel = jit_function(compact_draft_rows_kernel, POINTERS, RUNTIME_INTS)
    threads = launch_grid.compact_draft_rows_launch(1, 1).threads
    for signature, constexprs in _ast_sources(index_types):
        yield Specialization(kernel, signature, constexprs, warps(threads, warp_size))


def _ast_sources(index_types):
    """The specialisations engines ask for: yields ``(signature, constexprs)`` for ``triton.compiler.ASTSource``
    (Triton >= 3.3). DFlash's call (int32 tables, int64 verify slots and starts, ``index_types`` pool indices and
    lengths), int64 tables, and the folded grid."""
    for index in index_types:
        yield _specialisation("i32", index, constexprs_for())
    yield _specialisation("i64", "i64", constexprs_for())
    yield _specialisation("i32", "i64", constexprs_for(folded_grid=True))


def _specialisation(table, index, constexprs):
    types = dict(draft_ptr=f"*{table}", target_ptr=f"*{table}", pool_ptr=f"*{index}", start_ptr="*i64",
                 lens_ptr=f"*{index}", verify_ptr="*i64")
    return ast_signature(PARAMETERS, constexprs, types), dict(constexprs)


# The ops this module launches: ``kernels_triton.KERNELS`` reads them from this source, without importing it.
OP_LAUNCHERS = {"compact_draft_rows": build_compact_draft_rows}
