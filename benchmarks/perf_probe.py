"""Performance experiments on a GPU: the Triton page-table kernel at other program sizes and warp counts,
next to the 2-D-grid baseline at the same settings, CUDA-graph replay, one run. Each variant's output is
checked against the reference before it is timed.

    PYTHONPATH=. python3 benchmarks/perf_probe.py [--cases 1x131072x64,64x32768x64,256x32768x1]

It launches the kernels directly (``kernel[grid](...)``) to vary what the launcher fixes; graph replay
makes the host launch path irrelevant to the times.
"""

from __future__ import annotations

import argparse
import functools
import statistics

import torch
import triton

import kvdispatch
from kernels_triton import page_table
from kvdispatch.bench import baselines
from kvdispatch.bench import core as bench


def ours(inputs, page_size, pages, warps):
    """The shipped kernel at ``pages`` pages per program and ``warps`` warps, no options."""
    table, pool, lens, out = inputs.req_to_token, inputs.req_pool_indices, inputs.seq_lens, inputs.out
    _, args = page_table.plan_key_and_arguments(table, pool, lens, out, page_size)
    constexprs = page_table.constexprs_for(page_size, False, False, False, True)
    constexprs["PAGES_PER_PROGRAM"] = pages
    grid = (pool.shape[0], triton.cdiv(out.shape[1], pages))
    page_table.page_table_kernel[grid](*args, **constexprs, num_warps=warps)


def baseline(inputs, page_size, pages, warps):
    grid = (inputs.req_pool_indices.shape[0], triton.cdiv(inputs.out.shape[1], pages))
    baselines._grid_2d_kernel[grid](inputs.req_to_token, inputs.req_pool_indices, inputs.seq_lens, inputs.out,
                                    inputs.req_to_token.stride(0), inputs.out.stride(0), PAGE=page_size,
                                    STEP=pages, num_warps=warps)


def api(inputs, page_size):
    kvdispatch.create_flashmla_kv_indices(inputs.req_to_token, inputs.req_pool_indices, inputs.seq_lens,
                                          inputs.out, page_size=page_size, backend="triton")


def graph_us(fn, inputs):
    inputs.out.fill_(-7)
    fn()
    torch.cuda.synchronize()
    if not torch.equal(inputs.out, inputs.expected):
        return float("nan")
    graph = bench.capture(fn, 20)
    return bench.event_time_us(graph.replay, 20, 200)


def interleaved_rounds(rows: dict, measure, rounds: int) -> dict:
    """``{name: [one value per round]}``: every callable of ``rows`` (``{name: fn}``) measured with
    ``measure(fn)`` once per round, the rounds interleaved so that drifts hit every row alike."""
    results = {name: [] for name in rows}
    for _ in range(rounds):
        for name, fn in rows.items():
            results[name].append(measure(fn))
    return results


def print_medians(results: dict, references: dict, width: int = 40, digits: int = 3) -> None:
    """A line per row of ``results``: its median in µs, that median over each reference row's
    (``references``: ``{label: row name}``), and the rounds."""
    medians = {label: statistics.median(results[name]) for label, name in references.items()}
    for name, values in results.items():
        m = statistics.median(values)
        ratios = "  ".join(f"/{label} {m / reference:5.3f}" for label, reference in medians.items())
        print(f"  {name:{width}} {m:7.{digits}f} us  {ratios}  (rounds {' '.join(f'{v:.{digits}f}' for v in values)})")


def time_case(title: str, rows: dict, measure, rounds: int, references: dict, width: int = 40) -> dict:
    """``interleaved_rounds`` of ``rows``, printed under ``case {title}`` by ``print_medians``; returns them."""
    results = interleaved_rounds(rows, measure, rounds)
    print(f"case {title}")
    print_medians(results, references, width)
    return results


API_ROW, BASELINE_ROW = "api (as shipped)", "2-D grid (SGLang design)"


def time_against_api_and_baseline(case, x, variants: dict, rounds: int, width: int = 40) -> dict:
    """``variants`` (``{name: fn}``) of ``case`` on the inputs ``x``, next to the op's API as shipped (Triton)
    and its first SGLang-design baseline, timed by ``graph_us`` in interleaved rounds, with ratios to both."""
    rows = {API_ROW: bench.bind(bench.API_PREFIX + "triton", x, case),
            BASELINE_ROW: bench.bind(case.module.TRITON_BASELINES[0], x, case), **variants}
    return time_case(case.name, rows, functools.partial(graph_us, inputs=x), rounds,
                     {"api": API_ROW, "2d": BASELINE_ROW}, width)


def experiment_setup(default_cases: str, add_arguments=None):
    """The shared start of the experiment scripts: ``--cases`` and ``--rounds`` (plus what ``add_arguments``
    adds to the parser) parsed, the GPU's clocks warmed up; returns ``(options, device, cases)``."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", default=default_cases)
    parser.add_argument("--rounds", type=int, default=5)
    if add_arguments:
        add_arguments(parser)
    options = parser.parse_args()
    device = torch.device("cuda")
    bench._warm_up_clocks(device)
    return options, device, bench.parse_cases(options.cases)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", default="1x131072x64,64x32768x64,256x32768x1")
    parser.add_argument("--pages", help="pages per program to try, e.g. 64,256 (default: three around the shipped)")
    parser.add_argument("--warps", default="1,2,4,8")
    options = parser.parse_args()
    cases = bench.parse_cases(options.cases)
    warps_options = [int(w) for w in options.warps.split(",")]
    device = torch.device("cuda")
    bench._warm_up_clocks(device)
    for i, case in enumerate(cases):
        inputs = bench.make_inputs(case, device, i)
        ps = case.page_size
        pages_options = (1024, 2048, 4096) if ps == 1 else (32, 64, 128)
        if options.pages:
            pages_options = [int(p) for p in options.pages.split(",")]
        rows = [("api (as shipped)", graph_us(functools.partial(api, inputs, ps), inputs))]
        for pages in pages_options:
            for warps in warps_options:
                rows.append((f"ours     pages={pages:<5} warps={warps}",
                             graph_us(functools.partial(ours, inputs, ps, pages, warps), inputs)))
                rows.append((f"baseline pages={pages:<5} warps={warps}",
                             graph_us(functools.partial(baseline, inputs, ps, pages, warps), inputs)))
        rows.append(("api (again)", graph_us(functools.partial(api, inputs, ps), inputs)))
        print(f"case {case.name}")
        for label, us in sorted(rows, key=lambda r: r[1]):
            print(f"  {label:34} {us:7.2f} us")
        del inputs
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
