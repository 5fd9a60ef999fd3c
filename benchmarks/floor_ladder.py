"""Experiment: what a page-64 page table can cost at least on this GPU, rung by rung.

Each rung adds one step of the page table's dependency chain to a kernel of one program of 64 lanes
(the shape of 1x4096x64), written once in Triton and once in CUDA C (a CuPy RawKernel, launched on
PyTorch's stream as ``kernels_cupy`` does), next to the shipped API and the 2-D baseline:

    empty            nothing (no parameter read)
    store            out[i] = i                                   (a parameter read, a store)
    load-store       out[i] = x[i]                                (+ one memory round trip)
    chain2           out[i] = table[pool[0] * stride + 64 i] >> 6  (+ a dependent round trip: the page table
                                                                    without its length test)
    chain2+length    the same, written only where 64 i < lens[0]  (the minimal page table)
    chain3           one more dependent load before the gather    (what a round trip adds)

and the minimal page table on the 64x32768x64 grid (64 x 8 programs). CUDA-graph replay (20 calls per
graph), 5 interleaved rounds, medians.

    PYTHONPATH=. python3 benchmarks/floor_ladder.py
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

import kvdispatch
from kvdispatch.bench import baselines
from kvdispatch.bench import core as bench
from perf_probe import time_case

LANES = 64


@triton.jit
def _empty(out):
    pass


@triton.jit
def _store(out, out_stride, LANES: tl.constexpr):
    """Program (b, k) writes out[b, k * LANES + i] = its column."""
    i = tl.program_id(1) * LANES + tl.arange(0, LANES)
    tl.store(out + tl.program_id(0) * out_stride + i, i)


@triton.jit
def _load_store(x, out, LANES: tl.constexpr):
    i = tl.arange(0, LANES)
    tl.store(out + i, tl.load(x + i))


@triton.jit
def _chain2(table, pool, lens, out, stride, out_stride, LANES: tl.constexpr, LENGTH: tl.constexpr,
            STEP: tl.constexpr = 64):
    """The minimal page table of page 64; STEP: the slots read are STEP apart (64: one per page, as the
    page table reads; 1: consecutive, the same work without the gather)."""
    b = tl.program_id(0)
    i = tl.program_id(1) * LANES + tl.arange(0, LANES)
    row = tl.load(pool + b)
    if LENGTH:
        keep = i * 64 < tl.load(lens + b)
    else:
        keep = i >= 0
    slots = tl.load(table + row * stride + i * STEP, mask=keep)
    tl.store(out + b * out_stride + i, slots >> 6, mask=keep)


@triton.jit
def _chain3(table, hop, pool, out, stride, LANES: tl.constexpr):
    i = tl.arange(0, LANES)
    row = tl.load(hop + tl.load(pool))
    tl.store(out + i, tl.load(table + row * stride + i * 64) >> 6)


CUDA = r"""
extern "C" __global__ void empty(int *out) {}
extern "C" __global__ void load_store(const int *x, int *out) { out[threadIdx.x] = x[threadIdx.x]; }
// Integer parameters are long long: CuPy passes a Python int as 8 bytes.
extern "C" __global__ void chain2(const int *table, const int *pool, const int *lens, int *out, long long stride,
                                  long long out_stride, long long length) {
    int b = blockIdx.x, i = blockIdx.y * blockDim.x + threadIdx.x;
    int row = pool[b];
    if (length && i * 64 >= lens[b]) return;
    out[b * out_stride + i] = table[row * stride + i * 64] >> 6;
}
extern "C" __global__ void chain3(const int *table, const int *hop, const int *pool, int *out, long long stride) {
    int row = hop[pool[0]];
    out[threadIdx.x] = table[row * stride + threadIdx.x * 64] >> 6;
}
"""


class _RawStream:
    __slots__ = ("ptr",)

    def __init__(self, ptr):
        self.ptr = ptr


def cuda_kernels():
    import cupy  # noqa: PLC0415  (only here: the Triton rungs run without it)

    module = cupy.RawModule(code=CUDA)
    return {name: module.get_function(name).kernel for name in ("empty", "load_store", "chain2", "chain3")}


def cuda_launch(function, grid, threads, *args):
    stream = _RawStream(torch._C._cuda_getCurrentRawStream(torch.cuda.current_device()))
    function(grid, (threads,), tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args), 0, stream)


def replay_us(fn) -> float:
    graph = bench.capture(fn, 20)
    return bench.event_time_us(graph.replay, 20, 200)


def checked(fn, out, expected, rows=slice(None)):
    """``fn``, after checking once that it writes ``expected`` into ``out[rows]``."""
    out.fill_(-7)
    fn()
    torch.cuda.synchronize()
    if not torch.equal(out[rows], expected[rows]):
        raise SystemExit(f"{fn} wrote a wrong result")
    return fn


def rungs_batch1(x, k):
    """The rungs on 1x4096x64's inputs (one program, 64 pages)."""
    table, pool, lens, out = x.req_to_token, x.req_pool_indices, x.seq_lens, x.out
    stride = table.stride(0)
    scratch = torch.zeros(LANES, dtype=torch.int32, device=out.device)
    hop = torch.arange(table.shape[0], dtype=torch.int32, device=out.device)  # pool[0] -> pool[0]
    minimal = functools.partial(_chain2[(1, 1)], table, pool, lens, out, stride, out.stride(0), LANES=LANES,
                                LENGTH=True, num_warps=2)
    rows = {
        "triton empty": lambda: _empty[(1,)](scratch, num_warps=2),
        "cuda   empty": lambda: cuda_launch(k["empty"], (1,), LANES, scratch),
        "triton store": lambda: _store[(1,)](scratch, 0, LANES=LANES, num_warps=2),
        "triton load-store": lambda: _load_store[(1,)](table, scratch, LANES=LANES, num_warps=2),
        "cuda   load-store": lambda: cuda_launch(k["load_store"], (1,), LANES, table, scratch),
        "triton chain2": checked(functools.partial(_chain2[(1, 1)], table, pool, lens, out, stride, out.stride(0),
                                                   LANES=LANES, LENGTH=False, num_warps=2), out, x.expected),
        "cuda   chain2": checked(lambda: cuda_launch(k["chain2"], (1, 1), LANES, table, pool, lens, out, stride,
                                                     out.stride(0), 0), out, x.expected),
        "triton chain2+length": checked(minimal, out, x.expected),
        "cuda   chain2+length": checked(lambda: cuda_launch(k["chain2"], (1, 1), LANES, table, pool, lens, out,
                                                            stride, out.stride(0), 1), out, x.expected),
        "triton chain3": checked(lambda: _chain3[(1,)](table, hop, pool, out, stride, LANES=LANES, num_warps=2),
                                 out, x.expected),
        "cuda   chain3": checked(lambda: cuda_launch(k["chain3"], (1,), LANES, table, hop, pool, out, stride),
                                 out, x.expected),
    }
    return rows


def rungs_batch64(x, k):
    """The minimal page table on 64x32768x64's grid (64 rows x 8 programs of 64 pages)."""
    table, pool, lens, out = x.req_to_token, x.req_pool_indices, x.seq_lens, x.out
    stride, programs = table.stride(0), out.shape[1] // LANES
    return {
        "triton chain2+length": checked(functools.partial(
            _chain2[(pool.shape[0], programs)], table, pool, lens, out, stride, out.stride(0), LANES=LANES,
            LENGTH=True, num_warps=2), out, x.expected),
        "cuda   chain2+length": checked(lambda: cuda_launch(k["chain2"], (pool.shape[0], programs), LANES, table,
                                                            pool, lens, out, stride, out.stride(0), 1),
                                        out, x.expected),
    }


def main() -> int:
    device = torch.device("cuda")
    bench._warm_up_clocks(device)
    k = cuda_kernels()
    for i, (case, rungs) in enumerate(zip(bench.parse_cases("1x4096x64,64x32768x64"), (rungs_batch1, rungs_batch64))):
        x = bench.make_inputs(case, device, i)
        args = (x.req_to_token, x.req_pool_indices, x.seq_lens, x.out)
        rows = {"api:triton": checked(functools.partial(kvdispatch.create_flashmla_kv_indices, *args, page_size=64,
                                                        backend="triton"), x.out, x.expected),
                "2d-grid (plain launch)": checked(functools.partial(baselines.grid_2d, *args, 64), x.out,
                                                  x.expected)}
        rows.update(rungs(x, k))
        time_case(case.name, rows, replay_us, 5, {"2d": "2d-grid (plain launch)", "api": "api:triton"}, width=26)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
