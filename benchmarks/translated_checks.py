"""Experiment: what the translated page table's bounds checks cost. The SGLang-design 2-D baseline reads
``req_to_token`` at any pool index and ``v2p`` at any virtual page; the shipped kernel tests both (a pool
index outside the table, a page past the map read nothing). Rows: the API as shipped, the baseline, and the
baseline with the row test, the map test, both, and both with its integers unspecialised (as the shipped
kernel takes them: one compilation whatever the strides); then the baseline and the baseline with both tests
with streaming hints (table entries read once, loaded ``evict_first``; output stores marked ``.cs``), which
made the page table's page-1 copy 0.95x (``page1_variants.py``).

Outputs are checked against the reference first (nan if wrong); CUDA-graph replay, 20 calls per graph,
interleaved rounds, medians, ratios to the API and to the baseline.

    PYTHONPATH=. python3 benchmarks/translated_checks.py [--cases translated_page_table:64x32768x64,...]
"""

from __future__ import annotations

import functools

import triton
import triton.language as tl

from kvdispatch.bench import baselines
from kvdispatch.bench import core as bench
from perf_probe import experiment_setup, time_against_api_and_baseline

CASES = "translated_page_table:64x32768x64,translated_page_table:8x131072x64,translated_page_table:256x8192x16"


def _checked_2d(table, pool_idx, lengths, v2p, out, multiplier, max_pages, table_stride, out_stride, table_rows,
                v2p_len, PAGE: tl.constexpr, STEP: tl.constexpr, CHECK_ROW: tl.constexpr, CHECK_MAP: tl.constexpr,
                STREAMING: tl.constexpr = False):
    b = tl.program_id(0)
    c = tl.program_id(1) * STEP + tl.arange(0, STEP)
    row = tl.load(pool_idx + b).to(tl.int64)
    live = (c < tl.cdiv(tl.load(lengths + b), PAGE)) & (c < max_pages)
    if CHECK_ROW:
        live = live & (row >= 0) & (row < table_rows)
    tokens = tl.load(table + row * table_stride + c.to(tl.int64) * PAGE, mask=live, other=0,
                     eviction_policy="evict_first" if STREAMING else "")
    page = tl.where(tokens < 0, 0, tokens // PAGE)
    read = live
    if CHECK_MAP:
        read = read & (page < v2p_len)
    physical = tl.load(v2p + page, mask=read, other=0)
    tl.store(out + b.to(tl.int64) * out_stride + c, tl.maximum(physical * multiplier, 0).to(tl.int32), mask=live,
             cache_modifier=".cs" if STREAMING else "")


_specialised = triton.jit(_checked_2d)
_unspecialised = triton.jit(_checked_2d, do_not_specialize=("multiplier", "max_pages", "table_stride", "out_stride",
                                                             "table_rows", "v2p_len"))


def checked(kernel, x, case, check_row, check_map, streaming=False):
    step = baselines.pages_per_program(case.page_size)
    grid = (x.req_pool_indices.shape[0], triton.cdiv(x.out.shape[1], step))
    kernel[grid](x.req_to_token, x.req_pool_indices, x.seq_lens, x.token_mapping, x.out, 1, x.out.shape[1],
                 x.req_to_token.stride(0), x.out.stride(0), x.req_to_token.shape[0], x.token_mapping.shape[0],
                 PAGE=case.page_size, STEP=step, CHECK_ROW=check_row, CHECK_MAP=check_map, STREAMING=streaming)


def main() -> int:
    options, device, cases = experiment_setup(CASES)
    for i, case in enumerate(cases):
        x = bench.make_inputs(case, device, i)
        variants = {}
        for label, row_test, map_test in (("row test", True, False), ("map test", False, True),
                                          ("both tests", True, True)):
            variants[f"2-D grid + {label}"] = functools.partial(checked, _specialised, x, case, row_test, map_test)
        variants["2-D grid + both, ints unspecialised"] = functools.partial(checked, _unspecialised, x, case, True,
                                                                            True)
        for label, tests in (("", False), (" + both tests", True)):
            variants[f"2-D grid{label} + streaming hints"] = functools.partial(checked, _specialised, x, case, tests,
                                                                              tests, streaming=True)
        time_against_api_and_baseline(case, x, variants, options.rounds)
        del x
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
