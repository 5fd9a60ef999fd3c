"""Experiment: what programmatic dependent launch (PDL, sm_90+) saves the page table in a CUDA graph.

The shipped kernel wrapped in ``griddepcontrol.wait`` (before any load: whatever the previous kernel
writes is visible after it) and optionally ``griddepcontrol.launch_dependents`` (the next PDL kernel may
start launching), launched through Triton's own ``launch_pdl`` option. Rows, each 20 calls per graph:

    api                      the shipped API (no PDL)
    wait, plain launch       the wrapped kernel launched without PDL (what the instruction costs)
    wait, PDL                launched with PDL, after the previous call
    wait+trigger, PDL        the same, also letting the next call launch early
    producer                 a one-program Triton kernel that writes req_pool_indices (as an engine's
                             preceding kernel writes the op's inputs); it does not trigger, as torch's
                             kernels do not
    producer + api           the pair, no PDL
    producer + wait, PDL     the pair, the op launched with PDL

Before timing, each row runs once with ``req_pool_indices`` first set to a wrong permutation that only the
producer corrects, and the output is checked against the reference (nan if wrong).

    PYTHONPATH=. python3 benchmarks/pdl.py [--cases ...]
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from kernels_triton import page_table
from kvdispatch.bench import core as bench
from kvdispatch import grid as launch_grid
from perf_probe import api, experiment_setup, graph_us, time_case

_page_table = triton.jit(page_table._page_table_kernel)


def _wrapped(table_ptr, pool_ptr, lens_ptr, out_ptr, packed_table: tl.int64, packed_out: tl.int64,
             PAGE_SIZE: tl.constexpr, PAGE_SHIFT: tl.constexpr, PAGES_PER_PROGRAM: tl.constexpr,
             TRIGGER: tl.constexpr):
    """The shipped kernel's call without options (it reads only these parameters), behind the GDC calls."""
    if TRIGGER:
        tl.extra.cuda.gdc_launch_dependents()
    tl.extra.cuda.gdc_wait()
    zero = 0  # the parameters a call without options never reads
    _page_table(table_ptr, pool_ptr, lens_ptr, out_ptr, packed_table, packed_out, zero, zero, zero, out_ptr,
                table_ptr, zero, zero, zero, zero, zero, zero, zero, PAGE_SIZE, PAGE_SHIFT, PAGES_PER_PROGRAM,
                HAS_START=False, HAS_SEQ_LENS_OUT=False, HAS_FILL=False, HAS_OFFSET=False, UNIT_STRIDES=True,
                WIDE_INDEXING=False, FOLDED_GRID=False, ROUND_TOWARD_ZERO=False, PDL=False)


wrapped = triton.jit(_wrapped, do_not_specialize=("packed_table", "packed_out"),
                     do_not_specialize_on_alignment=page_table.POINTERS[:4])


@triton.jit
def _producer(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(dst_ptr + i, tl.load(src_ptr + i, mask=i < n), mask=i < n)


def op_pdl(inputs, page_size, trigger, pdl):
    table, pool, lens, out = inputs.req_to_token, inputs.req_pool_indices, inputs.seq_lens, inputs.out
    _, args = page_table.plan_key_and_arguments(table, pool, lens, out, page_size)
    constexprs = page_table.constexprs_for(page_size, False, False, False, True)
    geometry = launch_grid.page_table_launch(pool.shape[0], out.shape[1], page_size)
    assert args[4] or args[5], "the 64-bit path: this experiment wraps only the packed one"
    wrapped[geometry.grid](*args[:6], PAGE_SIZE=page_size, PAGE_SHIFT=constexprs["PAGE_SHIFT"],
                           PAGES_PER_PROGRAM=constexprs["PAGES_PER_PROGRAM"], TRIGGER=trigger,
                           num_warps=geometry.threads // 32, launch_pdl=pdl)


def producer(inputs, source):
    n = source.shape[0]
    _producer[(1,)](source, inputs.req_pool_indices, n, BLOCK=triton.next_power_of_2(n), num_warps=4)


def checked_graph_us(fn, inputs, source):
    """fn's graph time per call, after one eager call that must give the reference output with
    req_pool_indices first set wrong (only a producer in fn corrects it; rows without one reset it first)."""
    pool = inputs.req_pool_indices
    pool.copy_(source.roll(1))
    inputs.out.fill_(-7)
    fn()
    torch.cuda.synchronize()
    ok = torch.equal(inputs.out, inputs.expected)
    pool.copy_(source)
    if not ok:
        return float("nan")
    graph = bench.capture(fn, 20)
    return bench.event_time_us(graph.replay, 20, 200)


def main() -> int:
    options, device, cases = experiment_setup("1x4096x64,1x131072x64,8x131072x64,64x32768x64,1x131072x1,"
                                              "256x32768x1")
    for i, case in enumerate(cases):
        x = bench.make_inputs(case, device, i)
        ps = case.page_size
        source = x.req_pool_indices.clone()
        make = functools.partial
        reset = make(producer, x, source)  # rows without a producer still need the right indices

        def pair(first, second):
            return lambda: (first(), second())

        rows = {
            "api": pair(reset, make(api, x, ps)),
            "wait, plain launch": pair(reset, make(op_pdl, x, ps, False, False)),
            "wait, PDL": pair(reset, make(op_pdl, x, ps, False, True)),
            "wait+trigger, PDL": pair(reset, make(op_pdl, x, ps, True, True)),
        }
        # The rows above include the producer once per call too (to set the indices), so their graphs hold
        # 20 pairs: compare them with each other and with the producer alone.
        rows["producer alone"] = reset
        # 20 calls of the op alone, back to back (as the bench times it): a PDL call overlaps the previous.
        chains = {"chain: api": make(api, x, ps), "chain: wait+trigger, PDL": make(op_pdl, x, ps, True, True)}
        rows.update(chains)
        measure = functools.partial(checked_graph_us, inputs=x, source=source)

        def measured(fn):
            if fn is reset:
                return bench.event_time_us(bench.capture(fn, 20).replay, 20, 200)
            if fn in chains.values():
                return graph_us(fn, x)
            return measure(fn)

        time_case(case.name, rows, measured, options.rounds, {"api": "api", "producer": "producer alone"}, width=24)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
