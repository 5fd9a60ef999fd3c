"""Experiment: does the token-CSR kernel gain, as the page table did (``ablation.py``), from reading one
64-byte line of parameters instead of two?

    shipped API   kernels_triton/token_csr.py. Before 3d7007b it took six pointers, then eight 64-bit sizes
                  and strides (parameter bytes 0-111; a call without a start read all but start_stride: two
                  lines); since, it reads one line as the packed row does (this script then checks that the
                  two read alike)
    packed        the same body for contiguous index vectors and no start, taking five pointers and two
                  words of 32-bit fields (rows | row stride << 32, cols | out_len << 32): bytes 0-55, one line

Inputs: the bench's shuffled page pools at page size 1 (every row full length, rows read out of order),
``kv_indptr`` the rows' running offsets. CUDA-graph replay (20 calls per graph), 5 interleaved rounds,
outputs checked against the reference first.

    PYTHONPATH=. python3 benchmarks/csr_layout.py [--cases 1x4096x1,...]
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from kvdispatch import ops
import kvdispatch
from kvdispatch.bench import core as bench
from kvdispatch import grid as launch_grid
from perf_probe import experiment_setup, time_case


def _packed_csr(table_ptr, pool_ptr, lens_ptr, indptr_ptr, out_ptr, packed_table, packed_sizes,
                TOKENS_PER_PROGRAM: tl.constexpr):
    row = tl.program_id(0)
    pool = tl.load(pool_ptr + row).to(tl.int64)
    length = tl.load(lens_ptr + row).to(tl.int64)
    target_start = tl.load(indptr_ptr + row).to(tl.int64)
    table_rows = packed_table & 0xFFFFFFFF
    table_cols = packed_sizes & 0xFFFFFFFF
    readable = (pool >= 0) & (pool < table_rows)
    count = tl.where(readable, tl.minimum(length, table_cols), 0)
    skip = tl.maximum(-target_start, 0)
    end = tl.minimum(count, (packed_sizes >> 32) - target_start)
    first = skip + tl.program_id(1) * TOKENS_PER_PROGRAM
    if first < end:
        token = first + tl.arange(0, TOKENS_PER_PROGRAM)
        copied = token < end
        slots = tl.load(table_ptr + pool * (packed_table >> 32) + token, mask=copied)
        tl.store(out_ptr + target_start + token, slots, mask=copied)


packed_csr = triton.jit(_packed_csr, do_not_specialize=("packed_table", "packed_sizes"),
                        do_not_specialize_on_alignment=("table_ptr", "pool_ptr", "lens_ptr", "indptr_ptr",
                                                        "out_ptr"))


def api(x):
    kvdispatch.create_flashinfer_kv_indices(x["table"], x["pool"], x["lens"], x["indptr"], x["out"], backend="triton")


def packed(x):
    table, out = x["table"], x["out"]
    rows, cols = table.shape
    geometry = launch_grid.token_csr_launch(x["pool"].shape[0], cols, out.shape[0])
    packed_csr[geometry.grid](table, x["pool"], x["lens"], x["indptr"], out, rows | table.stride(0) << 32,
                              cols | out.shape[0] << 32, TOKENS_PER_PROGRAM=geometry.items_per_program,
                              num_warps=geometry.threads // 32)


def csr_inputs(case, device, seed):
    p = bench.make_inputs(case, device, seed)
    lens = p.seq_lens
    indptr = torch.zeros(lens.shape[0] + 1, dtype=torch.int32, device=device)
    indptr[1:] = torch.cumsum(lens, 0)
    out = torch.full((int(indptr[-1]),), -7, dtype=torch.int32, device=device)
    expected = ops.token_csr.reference(p.req_to_token, p.req_pool_indices, lens, indptr, out.clone())
    return dict(table=p.req_to_token, pool=p.req_pool_indices, lens=lens, indptr=indptr, out=out,
                expected=expected)


def graph_us(fn, x):
    x["out"].fill_(-7)
    fn()
    torch.cuda.synchronize()
    if not torch.equal(x["out"], x["expected"]):
        return float("nan")
    return bench.event_time_us(bench.capture(fn, 20).replay, 20, 200)


def main() -> int:
    options, device, cases = experiment_setup("1x4096x1,1x32768x1,1x131072x1,8x32768x1,64x4096x1,64x32768x1")
    for i, case in enumerate(cases):
        x = csr_inputs(case, device, i)
        rows = {"shipped API": functools.partial(api, x), "packed (one line)": functools.partial(packed, x)}
        time_case(case.name, rows, lambda fn, x=x: graph_us(fn, x), options.rounds, {"api": "shipped API"}, width=20)
        del x
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
