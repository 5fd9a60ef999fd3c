"""Experiment: pages per program and threads of the mapped page tables (the translated table, the TRT-LLM MHA
table) through the shipped API, next to their SGLang-design 2-D baselines.

A variant runs the API as shipped with the grid helper's choice replaced (``kvdispatch.grid`` pages per
program and threads per program patched, launch plans dropped) while its call is captured; the replay then
runs that geometry. Each output is checked against the reference first (nan if wrong). CUDA-graph replay, 20
calls per graph, interleaved rounds, medians, ratios to the API as shipped and to the baseline.

    PYTHONPATH=. python3 benchmarks/mapped_program_size.py [--cases ...] [--pages 32,64,128] [--threads 64,128]
"""

from __future__ import annotations

from unittest import mock

from kernels_triton import launch as triton_launch
from kvdispatch.bench import core as bench
from kvdispatch import grid as launch_grid
from perf_probe import experiment_setup, time_against_api_and_baseline

CASES = ("translated_page_table:64x32768x64,translated_page_table:8x131072x64,translated_page_table:256x8192x16,"
         "mha_page_table:64x32768x64:swa")


def with_geometry(fn, pages, threads):
    """``fn`` (a bound API call) with ``pages`` pages and ``threads`` threads per program of a mapped table."""
    shipped_items = launch_grid.items_per_program

    def items(kind, page_size=1):
        return pages if kind == launch_grid.MAPPED_PAGE_TABLE else shipped_items(kind, page_size)

    def call():
        with mock.patch.object(launch_grid, "items_per_program", items), \
                mock.patch.object(launch_grid, "threads_per_program", lambda n: threads):
            triton_launch.reset(compiled=True)  # compiled kernels are kept per specialisation, not per size
            fn()
        triton_launch.reset(compiled=True)

    return call


def main() -> int:
    def more(parser):
        parser.add_argument("--pages", default="32,64,128")
        parser.add_argument("--threads", default="64,128")

    options, device, cases = experiment_setup(CASES, more)
    pages_options = [int(p) for p in options.pages.split(",")]
    threads_options = [int(t) for t in options.threads.split(",")]
    for i, case in enumerate(cases):
        x = bench.make_inputs(case, device, i)
        api = bench.bind(bench.API_PREFIX + "triton", x, case)
        variants = {f"pages={pages:<4} threads={threads}": with_geometry(api, pages, threads)
                    for pages in pages_options for threads in threads_options}
        time_against_api_and_baseline(case, x, variants, options.rounds, width=36)
        del x
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
