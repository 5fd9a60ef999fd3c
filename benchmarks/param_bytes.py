"""Experiment: does the size of a kernel's parameter block move its graph-replay time on the page-64 cases?

The shipped page-table kernel takes 19 eight-byte parameters (152 bytes); the 2-D baseline, specialised by
a plain launch, about 56 bytes. This times the baseline's kernel with 0, 6 and 12 extra unused 8-byte
parameters (kept: ``do_not_specialize``) next to the shipped API, 5 interleaved rounds, CUDA-graph replay.

    PYTHONPATH=. python3 benchmarks/param_bytes.py
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

import kvdispatch
from kvdispatch.bench import baselines
from kvdispatch.bench import core as bench
from perf_probe import graph_us, time_case

EXTRA = [f"x{i}" for i in range(12)]


def _grid_2d_padded(table, pool_idx, lengths, out, table_stride, out_stride, x0, x1, x2, x3, x4, x5, x6, x7, x8,
                    x9, x10, x11, PAGE: tl.constexpr, STEP: tl.constexpr):
    # The baseline's kernel itself, inlined: only the parameter list differs.
    baselines._grid_2d_kernel(table, pool_idx, lengths, out, table_stride, out_stride, PAGE, STEP)


def padded_kernel(extra):
    names = ["table_stride", "out_stride"] + EXTRA
    return triton.jit(_grid_2d_padded, do_not_specialize=names[: 2 + extra])


def padded(kernel, x, page_size):
    step = baselines.pages_per_program(page_size)
    grid = (x.req_pool_indices.shape[0], triton.cdiv(x.out.shape[1], step))
    kernel[grid](x.req_to_token, x.req_pool_indices, x.seq_lens, x.out, x.req_to_token.stride(0), x.out.stride(0),
                 *([7] * 12), PAGE=page_size, STEP=step)


def main() -> int:
    device = torch.device("cuda")
    bench._warm_up_clocks(device)
    kernels = {extra: padded_kernel(extra) for extra in (0, 6, 12)}
    for i, case in enumerate(bench.parse_cases("1x4096x64,1x131072x64,8x131072x64,256x8192x64")):
        x = bench.make_inputs(case, device, i)
        args = (x.req_to_token, x.req_pool_indices, x.seq_lens, x.out)
        rows = {"api:triton": functools.partial(kvdispatch.create_flashmla_kv_indices, *args, page_size=64),
                "2d-grid (plain launch)": functools.partial(baselines.grid_2d, *args, 64)}
        for extra, kernel in kernels.items():
            rows[f"2d-grid, strides + {extra} params runtime i64"] = functools.partial(padded, kernel, x, 64)
        time_case(case.name, rows, functools.partial(graph_us, inputs=x), 5, {"2d": "2d-grid (plain launch)"},
                  width=44)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
