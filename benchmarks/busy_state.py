"""Experiment: does a tiny kernel replay faster right after heavy work than after a while of light work?

In ``floor_ladder.py`` and ``ablation.py`` the first two rows of the first round (timed right after the
bench's one-second warm-up copy) read 1.21-1.24 µs on 1x4096x64, and the same rows 1.37-1.42 µs in every
later round, with the SM clock at 1980 MHz throughout (nvidia-smi every 100 ms). This times a graph of 20
calls again and again after a burst of copies and prints the time per call against the time since the
burst, for an empty kernel, the API and the 2-D baseline; then the same after a pause with the GPU idle.

    PYTHONPATH=. python3 benchmarks/busy_state.py
"""

from __future__ import annotations

import functools
import statistics
import time

import torch

import kvdispatch
from floor_ladder import _empty
from kvdispatch.bench import baselines
from kvdispatch.bench import core as bench

CALLS = 20


def timeline(graph, span_s):
    """``[(ms since start, µs per call)]``: one replay at a time, each between two events, queued behind a
    0.1 ms device sleep (as ``bench.event_time_us`` does) so that the host's launch gap is not timed."""
    samples, start = [], time.perf_counter()
    while time.perf_counter() - start < span_s:
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        at = time.perf_counter() - start
        torch.cuda._sleep(200_000)
        begin.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append((at * 1e3, begin.elapsed_time(end) * 1e3 / CALLS))
    return samples


def binned(samples, edges_ms):
    out = []
    for low, high in zip(edges_ms, edges_ms[1:]):
        values = [us for at, us in samples if low <= at < high]
        out.append(f"{statistics.median(values):.3f}" if values else "-")
    return out


def main() -> int:
    device = torch.device("cuda")
    x = bench.make_inputs(bench.parse_cases("1x4096x64")[0], device, 0)
    args = (x.req_to_token, x.req_pool_indices, x.seq_lens, x.out)
    scratch = torch.zeros(64, dtype=torch.int32, device=device)
    fns = {"empty": lambda: _empty[(1,)](scratch, num_warps=2),
           "api:triton": functools.partial(kvdispatch.create_flashmla_kv_indices, *args, page_size=64,
                                           backend="triton"),
           "2d-grid": functools.partial(baselines.grid_2d, *args, 64)}
    graphs = {name: bench.capture(fn, CALLS) for name, fn in fns.items()}
    edges = [0, 5, 10, 20, 40, 80, 160, 320, 640, 1000, 1500]
    print("µs per call, median per window of ms since the start of the timing")
    print(f"{'':28}" + " ".join(f"{f'{a}-{b}':>9}" for a, b in zip(edges, edges[1:])))
    for before, label in ((lambda: bench._warm_up_clocks(device, 0.5), "after 0.5 s of copies"),
                          (lambda: time.sleep(1.0), "after 1 s idle"),
                          (lambda: bench._warm_up_clocks(device, 0.5), "after 0.5 s of copies")):
        for name, graph in graphs.items():
            before()
            samples = timeline(graph, 1.5)
            print(f"{name + ', ' + label:28}" + " ".join(f"{v:>9}" for v in binned(samples, edges)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
