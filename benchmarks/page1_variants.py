"""Experiment: the page-1 copy path (256 x 32768 x 1) with cache hints and other block sizes.

Each variant is the shipped kernel's page-1 path (no start: whole aligned blocks unmasked, 16-byte
accesses; the row's last block masked) with one change. Checked against the reference, then timed in
CUDA-graph replay (20 calls per graph), in interleaved rounds next to the public API; GB/s counts bytes
read and written. An eager device copy of 512 MiB each way (what the bench measures) is the ceiling.

    PYTHONPATH=. python3 benchmarks/page1_variants.py [rounds]
"""

from __future__ import annotations

import functools
import statistics
import sys

import torch
import triton
import triton.language as tl

import kvdispatch
from kvdispatch.bench import core as bench
from perf_probe import graph_us


@triton.jit
def _copy_kernel(table_ptr, pool_ptr, lens_ptr, out_ptr, table_rows, table_cols, table_row_stride, out_width,
                 out_row_stride, BLOCK: tl.constexpr, EVICT_FIRST: tl.constexpr, STORE_CS: tl.constexpr):
    row = tl.program_id(0)
    first = tl.program_id(1) * BLOCK
    column = tl.max_contiguous(tl.multiple_of(first + tl.arange(0, BLOCK), BLOCK), BLOCK)
    pool = tl.load(pool_ptr + row).to(tl.int64)
    length = tl.load(lens_ptr + row).to(tl.int64)
    limit = tl.where((pool >= 0) & (pool < table_rows), tl.minimum(length, table_cols), 0)
    limit = tl.minimum(limit, out_width)
    table_row = table_ptr + pool * table_row_stride
    out_row = out_ptr + row.to(tl.int64) * out_row_stride
    if first + BLOCK <= limit:
        source = tl.multiple_of(table_row, 16) + column
        if EVICT_FIRST:
            values = tl.load(source, eviction_policy="evict_first")
        else:
            values = tl.load(source)
        if STORE_CS:
            tl.store(tl.multiple_of(out_row, 16) + column, values, cache_modifier=".cs")
        else:
            tl.store(tl.multiple_of(out_row, 16) + column, values)
    else:
        mask = column < limit
        tl.store(out_row + column, tl.load(table_row + column, mask=mask), mask=mask)


def variant(inputs, block, warps, evict_first, store_cs):
    table, out = inputs.req_to_token, inputs.out
    grid = (out.shape[0], triton.cdiv(out.shape[1], block))
    _copy_kernel[grid](table, inputs.req_pool_indices, inputs.seq_lens, out, table.shape[0], table.shape[1],
                       table.stride(0), out.shape[1], out.stride(0), BLOCK=block, EVICT_FIRST=evict_first,
                       STORE_CS=store_cs, num_warps=warps)


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    device = torch.device("cuda")
    bench._warm_up_clocks(device)
    case = bench.parse_cases("256x32768x1")[0]
    inputs = bench.make_inputs(case, device, 0)
    moved = 2 * 4 * case.batch * case.width
    api = functools.partial(kvdispatch.create_flashmla_kv_indices, inputs.req_to_token, inputs.req_pool_indices,
                            inputs.seq_lens, inputs.out, page_size=1, backend="triton")
    rows = {"public API (shipped)": api}
    for block, warps in ((1024, 4), (2048, 8), (4096, 8)):
        for evict_first in (False, True):
            for store_cs in (False, True):
                rows[f"block {block:4} warps {warps} evict_first {evict_first:d} store .cs {store_cs:d}"] = \
                    functools.partial(variant, inputs, block, warps, evict_first, store_cs)
    results = {name: [] for name in rows}
    src = torch.empty(bench.COPY_BYTES // 4, dtype=torch.int32, device=device)
    dst = torch.empty_like(src)
    copies = []
    for _ in range(rounds):
        copies.append(2 * bench.COPY_BYTES / bench.event_time_us(functools.partial(dst.copy_, src), 1, 50) / 1e3)
        for name, fn in rows.items():
            results[name].append(graph_us(fn, inputs))
    copy = statistics.median(copies)
    print(f"device copy: {copy:.0f} GB/s (rounds {' '.join(f'{c:.0f}' for c in copies)})")
    shipped = statistics.median(results["public API (shipped)"])
    for name, values in sorted(results.items(), key=lambda item: statistics.median(item[1])):
        m = statistics.median(values)
        gbps = moved / m / 1e3
        print(f"  {name:48} {m:6.2f} us  {gbps:6.0f} GB/s  /copy {gbps / copy:5.3f}  /shipped {m / shipped:5.3f}  "
              f"(rounds {' '.join(f'{v:.2f}' for v in values)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
