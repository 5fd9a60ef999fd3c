"""Token-level CSR indices (FlashInfer-style) on the 2-D grid ``(batch, programs_per_row)``.

Program ``(b, k)`` copies tokens ``j`` in ``skip_b + [k * TOKENS_PER_PROGRAM, (k + 1) * TOKENS_PER_PROGRAM)``
of request ``b``'s table row to ``out[kv_indptr[b] + j]``, where ``skip_b = max(0, -kv_indptr[b])`` is the
first token that lands in ``out``; a long row is spread over many programs.
"""

from __future__ import annotations

import functools

import triton
import triton.language as tl

from kvdispatch import grid as launch_grid

from . import launch as _launch
from . import native

RUNTIME_INTS = ("pool_stride", "lens_stride", "start_stride", "indptr_stride", "table_rows", "table_cols",
                "table_row_stride", "out_len")
POINTERS = ("table_ptr", "pool_ptr", "lens_ptr", "start_ptr", "indptr_ptr", "out_ptr")
CONSTEXPRS = ("TOKENS_PER_PROGRAM", "HAS_START")


def _token_csr_kernel(
    table_ptr, pool_ptr, lens_ptr, start_ptr, indptr_ptr, out_ptr,
    pool_stride: tl.int64, lens_stride: tl.int64, start_stride: tl.int64, indptr_stride: tl.int64,
    table_rows: tl.int64, table_cols: tl.int64, table_row_stride: tl.int64, out_len: tl.int64,
    TOKENS_PER_PROGRAM: tl.constexpr, HAS_START: tl.constexpr,
):
    """``out[indptr[b] + j] = table[pool[b], start[b] + j]`` for the program's tokens ``j`` below
    ``min(lens[b], C - start[b])`` whose target lies in ``[0, out_len)``; the others are masked."""
    row = tl.program_id(0)
    pool = tl.load(pool_ptr + row * pool_stride).to(tl.int64)
    length = tl.load(lens_ptr + row * lens_stride).to(tl.int64)
    target_start = tl.load(indptr_ptr + row * indptr_stride).to(tl.int64)
    if HAS_START:
        start = tl.load(start_ptr + row * start_stride).to(tl.int64)
    else:
        start = tl.zeros((), tl.int64)

    readable = (pool >= 0) & (pool < table_rows) & (start >= 0) & (start < table_cols)
    count = tl.where(readable, tl.minimum(length, table_cols - start), 0)
    # The tokens that land in out are j in [skip, end): at most min(C, N) of them, which is what the
    # grid gives a row, so the row's programs start counting at ``skip``, not at token 0.
    skip = tl.maximum(-target_start, 0)
    end = tl.minimum(count, out_len - target_start)
    first = skip + tl.program_id(1) * TOKENS_PER_PROGRAM
    if first < end:
        token = first + tl.arange(0, TOKENS_PER_PROGRAM)
        copied = token < end
        slots = tl.load(table_ptr + pool * table_row_stride + start + token, mask=copied)
        tl.store(out_ptr + target_start + token, slots, mask=copied)


token_csr_kernel = triton.jit(_token_csr_kernel, do_not_specialize=RUNTIME_INTS,
                              do_not_specialize_on_alignment=POINTERS)
launcher = _launch.register(_launch.KernelLauncher(token_csr_kernel, CONSTEXPRS))
_plans = _launch.plan_cache(on_clear=functools.partial(native.forget_plans, "token_csr"))


def constexprs_for(has_start: bool) -> dict:
    return dict(TOKENS_PER_PROGRAM=launch_grid.items_per_program(launch_grid.TOKEN_CSR), HAS_START=has_start)


def _build_plan(key, out, has_start, args):
    geometry = launch_grid.token_csr_launch(key[1], table_width=args[11], out_len=args[13])
    if geometry.grid[0] == 0:
        return _plans.add(key, _launch.nothing), False
    specialisation = (has_start,) + key[3:]
    warps = _launch.warps_for(out.device, geometry.threads)
    plan, launched = launcher.plan(key[0], specialisation, geometry.grid, constexprs_for(has_start), warps, args)
    kernel = launcher.native_kernel(key[0], specialisation, len(POINTERS) + len(RUNTIME_INTS))
    if kernel is not None:  # the compiled launcher takes this key's calls from now on
        native.add_token_csr_plan(key, kernel, geometry.grid[1])
    return _plans.add(key, plan), launched


def build_token_indices(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, kv_start_idx=None):
    """Write token-level CSR indices into ``out`` (int32 ``[N]``); semantics of
    ``kvdispatch.reference.build_token_indices``. Index vectors may be strided views.

    Untouched: every position of ``out`` no request writes; nothing lands outside ``[0, N)``.
    Arguments arrive validated by ``kvdispatch._validate``.
    """
    key, args = plan_key_and_arguments(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, kv_start_idx)
    plan = _plans.get(key)
    if plan is None:
        plan, launched = _build_plan(key, out, kv_start_idx is not None, args)
        if launched:
            return out
    plan(*args)
    return out


def plan_key_and_arguments(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, kv_start_idx=None):
    """The launch-plan key of a call and the kernel's runtime arguments (tensors in the pointer slots), as
    ``native_launch.c`` computes them too. Key: device index, batch, min(C, N) (the geometry depends on
    nothing else: ``kvdispatch.grid.token_csr_launch``), the dtypes of the pool, length, indptr and start
    vectors (None: no start)."""
    has_start = kv_start_idx is not None
    rows, cols = req_to_token.shape
    key = (out.get_device(), req_pool_indices.shape[0], min(cols, out.shape[0]), req_pool_indices.dtype,
           seq_lens.dtype, kv_indptr.dtype, kv_start_idx.dtype if has_start else None)
    args = (req_to_token, req_pool_indices, seq_lens, kv_start_idx if has_start else req_to_token, kv_indptr,
            out, req_pool_indices.stride(0), seq_lens.stride(0), kv_start_idx.stride(0) if has_start else 0,
            kv_indptr.stride(0), rows, cols, req_to_token.stride(0), out.shape[0])
    return key, args


def specializations(index_types=("i32", "i64")):
    """Every specialisation the launcher can produce: yields ``(signature, constexprs)`` for
    ``triton.compiler.ASTSource`` (Triton >= 3.3), per start option and index dtype."""
    for has_start in (False, True):
        for index in index_types:
            signature = dict(table_ptr="*i32", pool_ptr=f"*{index}", lens_ptr=f"*{index}",
                             start_ptr=f"*{index}" if has_start else "*i32", indptr_ptr=f"*{index}",
                             out_ptr="*i32")
            signature.update({name: "i64" for name in RUNTIME_INTS})
            constexprs = constexprs_for(has_start)
            signature.update({name: "constexpr" for name in constexprs})
            yield signature, constexprs
