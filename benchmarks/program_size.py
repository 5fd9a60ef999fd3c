"""Experiment: pages per program and warps of the shipped page-table kernel (no options) across batches,
against the API as shipped, to see whether fewer, larger programs pay at batch 8-64 (where a page-64 grid
has 256-512 programs) without costing batch 1.

Each row is ``perf_probe.ours`` (the shipped kernel launched directly at that program size and warp count,
output checked against the reference first); CUDA-graph replay, 20 calls per graph, interleaved rounds,
medians, ratios to the API as shipped.

    PYTHONPATH=. python3 benchmarks/program_size.py [--cases ...] [--factors 1,2,4,8] [--warps 1,2,4]
"""

from __future__ import annotations

import functools

from kvdispatch.bench import core as bench
from kvdispatch import grid as launch_grid
from perf_probe import api, experiment_setup, graph_us, ours, time_case

CASES = ("1x4096x64,1x32768x64,1x131072x64,2x131072x64,4x131072x64,8x131072x64,16x65536x64,32x32768x64,"
         "64x32768x64,64x8192x64,128x16384x64,256x8192x64,64x32768x16")


def main() -> int:
    def more(parser):
        parser.add_argument("--factors", default="1,2,4,8", help="pages per program, as multiples of the shipped")
        parser.add_argument("--warps", default="1,2,4")

    options, device, cases = experiment_setup(CASES, more)
    factors = [int(f) for f in options.factors.split(",")]
    warps_options = [int(w) for w in options.warps.split(",")]
    for i, case in enumerate(cases):
        inputs = bench.make_inputs(case, device, i)
        ps = case.page_size
        shipped = launch_grid.items_per_program(launch_grid.PAGE_TABLE, ps)
        rows = {"api (as shipped)": functools.partial(api, inputs, ps)}
        for factor in factors:
            for warps in warps_options:
                pages = shipped * factor
                rows[f"pages={pages:<5} warps={warps} programs={case.batch * -(-case.width // pages)}"] = (
                    functools.partial(ours, inputs, ps, pages, warps))
        time_case(case.name, rows, lambda fn, x=inputs: graph_us(fn, x), options.rounds, {"api": "api (as shipped)"},
                  width=44)
        del inputs
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
