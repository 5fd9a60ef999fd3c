"""Experiment: what the 512 programs of 64x32768x64 add to the page table's floor (floor_ladder.py's batch-1
rungs at 1 program), rung by rung on grids of 1, 64 and 512 programs of 64 lanes (2 warps):

    empty            nothing
    store            out[row, i] = i
    chain2 dense     the minimal page table reading 64 consecutive slots (one 256-byte span per program)
    chain2 strided   the minimal page table (one slot every 64: 64 sectors per program), as the shipped kernel

CUDA-graph replay (20 calls per graph), 5 interleaved rounds, medians.

    PYTHONPATH=. python3 benchmarks/grid_floor.py
"""

from __future__ import annotations

import torch

from floor_ladder import LANES, _chain2, _empty, _store, replay_us
from kvdispatch.bench import core as bench
from perf_probe import time_case


def main() -> int:
    device = torch.device("cuda")
    bench._warm_up_clocks(device)
    x = bench.make_inputs(bench.parse_cases("64x32768x64")[0], device, 0)
    table, pool, lens, out = x.req_to_token, x.req_pool_indices, x.seq_lens, x.out
    rows = {}
    for grid in ((1, 1), (8, 8), (64, 8)):
        programs = grid[0] * grid[1]
        rows[f"empty, {programs} programs"] = lambda g=grid: _empty[g](out, num_warps=2)
        rows[f"store, {programs} programs"] = lambda g=grid: _store[g](out, out.stride(0), LANES=LANES, num_warps=2)
        for step, name in ((1, "dense"), (64, "strided")):
            rows[f"chain2 {name}, {programs} programs"] = (
                lambda g=grid, s=step: _chain2[g](table, pool, lens, out, table.stride(0), out.stride(0),
                                                  LANES=LANES, LENGTH=True, STEP=s, num_warps=2))
    time_case("64x32768x64 inputs", rows, replay_us, 5, {"empty@1": "empty, 1 programs"}, width=30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
