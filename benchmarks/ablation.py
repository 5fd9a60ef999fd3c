"""Experiment: which part of the shipped page-64 kernel keeps it above the minimal page table?

``floor_ladder.py`` found the minimal page table (pool index and length, one gather, a store under
``64 i < length``) 4-7% faster than the shipped kernel. This times a copy of the shipped kernel's path for
these cases (no start, no options, contiguous index vectors, 32-bit indexing) with one of its bounds tests
left out at a time, with 13 unused parameters before or after its integers (all 8 bytes, as the
shipped kernel's), and with and without Triton's specialisation of its integer arguments and pointer
alignments; next to the shipped kernel, the API, the 2-D baseline and the minimal kernel. CUDA-graph
replay, 5 interleaved rounds, medians.

    PYTHONPATH=. python3 benchmarks/ablation.py
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

import kvdispatch
from floor_ladder import _chain2, checked, replay_us
from kvdispatch.bench import baselines
from kvdispatch.bench import core as bench
from perf_probe import ours, time_case


@triton.jit
def _program(pool_ptr, lens_ptr, PAGE_SHIFT: tl.constexpr, PAGES: tl.constexpr):
    """What every variant starts with: its row, pages and their positions, and the row's pool index and length."""
    row = tl.program_id(0)
    first = tl.program_id(1) * PAGES
    page = tl.max_contiguous(tl.multiple_of(first + tl.arange(0, PAGES), PAGES), PAGES)
    return row, page, page.to(tl.int64) << PAGE_SHIFT, tl.load(pool_ptr + row), tl.load(lens_ptr + row)


def _copy(table_ptr, pool_ptr, lens_ptr, out_ptr, table_rows: tl.int64, table_cols: tl.int64,
          table_row_stride: tl.int64, out_width: tl.int64, out_row_stride: tl.int64, seqlen_offset: tl.int64,
          PAGE_SHIFT: tl.constexpr, PAGES: tl.constexpr,
          CHECK_WIDTH: tl.constexpr, CHECK_COLS: tl.constexpr, CHECK_RANGE: tl.constexpr):
    row, page, position, pool, length = _program(pool_ptr, lens_ptr, PAGE_SHIFT, PAGES)
    out_row = out_ptr + row.to(tl.int64) * out_row_stride
    keep = page >= 0
    if CHECK_WIDTH:
        keep = keep & (page < out_width)
    if CHECK_COLS:
        keep = keep & (position < table_cols)
    below = tl.minimum(position - seqlen_offset, 2**31 - 1).to(tl.int32)
    if CHECK_RANGE:
        keep = keep & (pool.to(tl.uint32, bitcast=True) < table_rows.to(tl.uint32))
    index = pool.to(tl.uint32, bitcast=True)
    offset = index.to(tl.uint64) * table_row_stride.to(tl.uint32).to(tl.uint64) + position.to(tl.uint64, bitcast=True)
    keep = keep & (below < length)
    slots = tl.load(table_ptr + offset.to(tl.int64, bitcast=True), mask=keep, other=0)
    tl.store(out_row + page, slots >> PAGE_SHIFT, mask=keep)


PAD = ", ".join(f"x{i}: tl.int64" for i in range(13))
INTS = ("table_rows: tl.int64, table_cols: tl.int64, table_row_stride: tl.int64, out_width: tl.int64, "
        "out_row_stride: tl.int64, seqlen_offset: tl.int64")
_WRAPPERS = f"""
def _copy_padded_before(table_ptr, pool_ptr, lens_ptr, out_ptr, {PAD}, {INTS}, PAGE_SHIFT: tl.constexpr,
                        PAGES: tl.constexpr, CHECK_WIDTH: tl.constexpr, CHECK_COLS: tl.constexpr,
                        CHECK_RANGE: tl.constexpr):
    copy_runtime(table_ptr, pool_ptr, lens_ptr, out_ptr, table_rows, table_cols, table_row_stride, out_width,
                 out_row_stride, seqlen_offset, PAGE_SHIFT, PAGES, CHECK_WIDTH, CHECK_COLS, CHECK_RANGE)


def _copy_padded_after(table_ptr, pool_ptr, lens_ptr, out_ptr, {INTS}, {PAD}, PAGE_SHIFT: tl.constexpr,
                       PAGES: tl.constexpr, CHECK_WIDTH: tl.constexpr, CHECK_COLS: tl.constexpr,
                       CHECK_RANGE: tl.constexpr):
    copy_runtime(table_ptr, pool_ptr, lens_ptr, out_ptr, table_rows, table_cols, table_row_stride, out_width,
                 out_row_stride, seqlen_offset, PAGE_SHIFT, PAGES, CHECK_WIDTH, CHECK_COLS, CHECK_RANGE)
"""

def _packed(table_ptr, pool_ptr, lens_ptr, out_ptr, rows_and_stride: tl.int64, limit_and_out_stride: tl.int64,
            seqlen_offset: tl.int64, PAGE_SHIFT: tl.constexpr, PAGES: tl.constexpr, HAS_OFFSET: tl.constexpr):
    """The copy with every test, its integers packed two 32-bit values to a parameter: rows | row stride << 32,
    min(width, pages in a table row) | out row stride << 32. Without HAS_OFFSET it reads parameter bytes 0-47
    only (one 64-byte line at 0x210-0x23f); with it, seqlen_offset at 48-55 too."""
    row, page, position, pool, length = _program(pool_ptr, lens_ptr, PAGE_SHIFT, PAGES)
    table_rows = (rows_and_stride & 0xFFFFFFFF).to(tl.uint32)
    table_row_stride = (rows_and_stride >> 32).to(tl.uint32)
    page_limit = (limit_and_out_stride & 0xFFFFFFFF).to(tl.int32)
    out_row_stride = limit_and_out_stride >> 32
    out_row = out_ptr + row.to(tl.int64) * out_row_stride
    below = position
    if HAS_OFFSET:
        below = position - seqlen_offset
    below = tl.minimum(below, 2**31 - 1).to(tl.int32)
    keep = (page < page_limit) & (pool.to(tl.uint32, bitcast=True) < table_rows) & (below < length)
    offset = (pool.to(tl.uint32, bitcast=True).to(tl.uint64) * table_row_stride.to(tl.uint64)
              + position.to(tl.uint64, bitcast=True))
    slots = tl.load(table_ptr + offset.to(tl.int64, bitcast=True), mask=keep, other=0)
    tl.store(out_row + page, slots >> PAGE_SHIFT, mask=keep)


packed = triton.jit(_packed, do_not_specialize=("rows_and_stride", "limit_and_out_stride", "seqlen_offset"),
                    do_not_specialize_on_alignment=("table_ptr", "pool_ptr", "lens_ptr", "out_ptr"))


def launch_packed(x, has_offset):
    table, out = x.req_to_token, x.out
    limit = min(out.shape[1], -(-table.shape[1] // 64))
    grid = (x.req_pool_indices.shape[0], triton.cdiv(out.shape[1], 64))
    packed[grid](table, x.req_pool_indices, x.seq_lens, out, table.shape[0] | table.stride(0) << 32,
                 limit | out.stride(0) << 32, 0, PAGE_SHIFT=6, PAGES=64, HAS_OFFSET=has_offset, num_warps=2)


def _narrow32(table_ptr, pool_ptr, lens_ptr, out_ptr, table_rows: tl.int32, table_row_stride: tl.int32,
              page_limit: tl.int32, seqlen_offset: tl.int32, out_row_stride: tl.int64, PAGE_SHIFT: tl.constexpr,
              PAGES: tl.constexpr):
    """The packed kernel's tests with 32-bit integer parameters: bytes 0-47 hold what the gather needs
    (pointers, rows, row stride, page limit, seqlen_offset); the output row stride, needed only for the
    store, comes after them (bytes 48-55, the next line)."""
    row, page, position, pool, length = _program(pool_ptr, lens_ptr, PAGE_SHIFT, PAGES)
    below = tl.minimum(position - seqlen_offset, 2**31 - 1).to(tl.int32)
    keep = ((page < page_limit) & (pool.to(tl.uint32, bitcast=True) < table_rows.to(tl.uint32, bitcast=True))
            & (below < length))
    offset = (pool.to(tl.uint32, bitcast=True).to(tl.uint64)
              * table_row_stride.to(tl.uint32, bitcast=True).to(tl.uint64) + position.to(tl.uint64, bitcast=True))
    slots = tl.load(table_ptr + offset.to(tl.int64, bitcast=True), mask=keep, other=0)
    tl.store(out_ptr + row.to(tl.int64) * out_row_stride + page, slots >> PAGE_SHIFT, mask=keep)


narrow32 = triton.jit(_narrow32, do_not_specialize=("table_rows", "table_row_stride", "page_limit", "seqlen_offset",
                                                    "out_row_stride"),
                      do_not_specialize_on_alignment=("table_ptr", "pool_ptr", "lens_ptr", "out_ptr"))


def launch_narrow32(x):
    table, out = x.req_to_token, x.out
    limit = min(out.shape[1], -(-table.shape[1] // 64))
    grid = (x.req_pool_indices.shape[0], triton.cdiv(out.shape[1], 64))
    narrow32[grid](table, x.req_pool_indices, x.seq_lens, out, table.shape[0], table.stride(0), limit, 0,
                   out.stride(0), PAGE_SHIFT=6, PAGES=64, num_warps=2)


RUNTIME = ("table_rows", "table_cols", "table_row_stride", "out_width", "out_row_stride", "seqlen_offset")
POINTERS = ("table_ptr", "pool_ptr", "lens_ptr", "out_ptr")
copy_runtime = triton.jit(_copy, do_not_specialize=RUNTIME, do_not_specialize_on_alignment=POINTERS)
copy_specialised = triton.jit(_copy)


def _padded(name):
    """One of the ``_WRAPPERS``: the copy with 13 unused 8-byte parameters before or after its integers
    (it is defined from source text, so ``triton.jit`` can read it, in a temporary module file)."""
    import importlib.util  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    path = tempfile.NamedTemporaryFile("w", suffix="_ablation_padded.py", delete=False)
    path.write("import triton\nimport triton.language as tl\nfrom ablation import copy_runtime\n" + _WRAPPERS)
    path.close()
    spec = importlib.util.spec_from_file_location("ablation_padded", path.name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    names = RUNTIME + tuple(f"x{i}" for i in range(13))
    return triton.jit(getattr(module, name), do_not_specialize=names, do_not_specialize_on_alignment=POINTERS)


chain2_runtime = triton.jit(_chain2.fn, do_not_specialize=("stride", "out_stride"),
                            do_not_specialize_on_alignment=("table", "pool", "lens", "out"))


def launch_copy(kernel, x, checks, pad=None):
    table, out = x.req_to_token, x.out
    grid = (x.req_pool_indices.shape[0], triton.cdiv(out.shape[1], 64))
    ints = [table.shape[0], table.shape[1], table.stride(0), out.shape[1], out.stride(0), 0]
    padding = [2**33 + i for i in range(13)]
    ints = ints + padding if pad == "after" else padding + ints if pad == "before" else ints
    kernel[grid](table, x.req_pool_indices, x.seq_lens, out, *ints, PAGE_SHIFT=6, PAGES=64,
                 CHECK_WIDTH="w" in checks, CHECK_COLS="c" in checks, CHECK_RANGE="r" in checks, num_warps=2)


def launch_chain2(kernel, x):
    table, out = x.req_to_token, x.out
    kernel[(x.req_pool_indices.shape[0], out.shape[1] // 64)](table, x.req_pool_indices, x.seq_lens, out,
                                                               table.stride(0), out.stride(0), LANES=64,
                                                               LENGTH=True, num_warps=2)


def main() -> int:
    device = torch.device("cuda")
    padded_before, padded_after = _padded("_copy_padded_before"), _padded("_copy_padded_after")
    bench._warm_up_clocks(device)
    for i, case in enumerate(bench.parse_cases("1x4096x64,1x131072x64,64x32768x64")):
        x = bench.make_inputs(case, device, i)
        args = (x.req_to_token, x.req_pool_indices, x.seq_lens, x.out)
        candidates = {
            "api:triton": functools.partial(kvdispatch.create_flashmla_kv_indices, *args, page_size=64,
                                            backend="triton"),
            "2d-grid (plain launch)": functools.partial(baselines.grid_2d, *args, 64),
            "shipped kernel, direct": functools.partial(ours, x, 64, 64, 2),
            "copy: all tests": functools.partial(launch_copy, copy_runtime, x, "wcr"),
            "copy, 13 params before ints": functools.partial(launch_copy, padded_before, x, "wcr", "before"),
            "copy, 13 params after ints": functools.partial(launch_copy, padded_after, x, "wcr", "after"),
            "packed: one line": functools.partial(launch_packed, x, False),
            "packed + seqlen_offset": functools.partial(launch_packed, x, True),
            "32-bit: out stride in line 2": functools.partial(launch_narrow32, x),
            "copy: no width test": functools.partial(launch_copy, copy_runtime, x, "cr"),
            "copy: no column test": functools.partial(launch_copy, copy_runtime, x, "wr"),
            "copy: no pool-range test": functools.partial(launch_copy, copy_runtime, x, "wc"),
            "copy: length test only": functools.partial(launch_copy, copy_runtime, x, ""),
            "copy: all tests, specialised": functools.partial(launch_copy, copy_specialised, x, "wcr"),
            "minimal, specialised": functools.partial(launch_chain2, _chain2, x),
            "minimal, runtime strides": functools.partial(launch_chain2, chain2_runtime, x),
        }
        rows = {name: checked(fn, x.out, x.expected) for name, fn in candidates.items()}
        time_case(case.name, rows, replay_us, 5, {"2d": "2d-grid (plain launch)", "shipped": "shipped kernel, direct"},
                  width=30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
