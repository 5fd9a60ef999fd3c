"""``kvdispatch bench --pdl-chain``: what programmatic dependent launch (``enable_pdl``) changes in a CUDA graph.

Per page-table case and backend (triton, cupy), CUDA graphs of ``Reps.graph_calls`` repetitions, each with
``enable_pdl`` False and True, in the same run (rows ``SCENARIO:BACKEND`` and ``SCENARIO:BACKEND+pdl``):

    chain           the call back to back: a PDL call may start while the one before it finishes
    after-trigger   a producer kernel then the call: the producer writes ``req_pool_indices`` (as an engine's
                    preceding kernel writes the op's inputs) and lets the next PDL kernel start at once
                    (``griddepcontrol.launch_dependents``)
    after-plain     the same producer without the trigger, as PyTorch's kernels are: PDL can only cost here

Times are per call; the after-* rows subtract the producer alone (its own graph of the same length), so they
are what the call adds behind it. ``/no-pdl`` divides a ``+pdl`` row by the same row without PDL. Each graph is
checked first: with ``req_pool_indices`` set wrong beforehand, one replay must give the reference (the producer
corrects it, so a call reading before the producer's writes landed shows up as WRONG).
Needs a GPU with PDL (``probe(device).supports_pdl``) and Triton (the producer); skipped with the reason
elsewhere.
"""

from __future__ import annotations

import functools
import statistics
import sys

import torch

import kvdispatch

from . import core

CASES = ["1x4096x64", "1x131072x64", "8x131072x64", "64x32768x64", "1x131072x1", "256x32768x1"]
SCENARIOS = ("chain", "after-trigger", "after-plain")


def unavailable(device: torch.device) -> str | None:
    """Why PDL chains cannot be measured on ``device``, or None."""
    if device.type != "cuda":
        return "measured on a GPU only"
    info = kvdispatch.probe(device)
    if not info.supports_pdl:
        return f"{info.name} ({info.arch}) has no programmatic dependent launch (NVIDIA compute capability 9.0+)"
    if not info.usable("triton"):
        return f"the producer kernel is a Triton kernel: {info.reason('triton')}"
    return None


def _right_after_replay(graph, x: core.Inputs, source: torch.Tensor, produced: bool) -> bool:
    """One replay of ``graph`` gives the reference; with ``produced``, ``req_pool_indices`` is set wrong first
    (only the producer in the graph puts it right)."""
    if produced:
        x.req_pool_indices.copy_(torch.remainder(source + 1, x.req_to_token.shape[0]))
    x.out.fill_(core.POISON)
    torch.cuda.synchronize()
    graph.replay()
    torch.cuda.synchronize()
    right = torch.equal(x.out, x.expected)
    x.req_pool_indices.copy_(source)
    return right


def measure_case(case: core.Case, x: core.Inputs, backends: list[str], reps: core.Reps) -> list[core.Row]:
    """The rows of one page-table case: every scenario, backend and PDL choice, timed in ``reps.rounds``
    interleaved rounds (medians), the producer alone timed alongside."""
    producer = core.baseline_kernels().producer
    source = x.req_pool_indices.clone()
    producers = {trigger: functools.partial(producer, source, x.req_pool_indices, trigger) for trigger in (False, True)}
    graphs, rows = {}, []
    for backend in backends:
        for scenario in SCENARIOS:
            for pdl in (False, True):
                row = core.Row(case.name, case.batch, case.context, case.page_size, case.width,
                                f"{scenario}:{backend}" + "+pdl" * pdl, timing="cuda-graph")
                call = functools.partial(kvdispatch.create_flashmla_kv_indices, x.req_to_token, x.req_pool_indices,
                                         x.seq_lens, x.out, page_size=case.page_size, backend=backend,
                                         enable_pdl=pdl)
                if scenario != "chain":
                    call = functools.partial(_in_turn, producers[scenario == "after-trigger"], call)
                try:
                    graph = core.capture(call, reps.graph_calls)
                    if not _right_after_replay(graph, x, source, scenario != "chain"):
                        row.status, row.note = "WRONG", "a replay did not give the reference"
                    else:
                        graphs[row.impl] = (graph, scenario)
                except Exception as exc:  # this row's failure, reported as the bench reports any
                    row.status, row.note = "error", f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
                    core._recover(x.out.device)
                rows.append(row)
    producer_graphs = {scenario: core.capture(producers[scenario == "after-trigger"], reps.graph_calls)
                       for scenario in SCENARIOS[1:]}
    producer_rounds = {scenario: [] for scenario in producer_graphs}
    for _ in range(reps.rounds):
        for scenario, graph in producer_graphs.items():
            producer_rounds[scenario].append(core.event_time_us(graph.replay, reps.graph_calls, reps.replays))
        for row in rows:
            if row.impl in graphs:
                graph, _ = graphs[row.impl]
                row.time_rounds.append(core.event_time_us(graph.replay, reps.graph_calls, reps.replays))
    alone = {scenario: statistics.median(times) for scenario, times in producer_rounds.items()}
    for row in rows:
        if row.impl not in graphs:
            continue
        scenario = graphs[row.impl][1]
        row.time_us = statistics.median(row.time_rounds) - alone.get(scenario, 0.0)
        if scenario != "chain":
            row.note = f"minus the producer alone ({core._fmt(alone[scenario])} µs)"
    times = {row.impl: row.time_us for row in rows}
    for row in rows:
        if row.impl.endswith("+pdl"):
            row.vs_no_pdl = core._ratio(row.time_us, times.get(row.impl[: -len("+pdl")]))
    return rows


def _in_turn(first, second):
    first()
    second()


def default_cases(quick: bool) -> list[core.Case]:
    return [core.Case.parse(name) for name in (CASES[:2] if quick else CASES)]


def run(cases: list[core.Case], requested: list[str] | None, device: torch.device, reps: core.Reps, seed: int = 0,
        progress=None) -> core.Report:
    """The PDL-chain report: ``cases`` (page-table ones; others skipped with the reason) on the ``requested``
    backends (None: every one that can run, as ``core.run``; the torch backend launches no kernel of its own and
    is skipped). Everything is skipped, with the reason, where ``unavailable`` says so."""
    progress = progress or sys.stderr
    info = kvdispatch.probe(device)
    backends, skipped = core.resolve_backends(requested, device)
    reason = unavailable(device)
    if "torch" in backends:
        skipped["PDL chains of the torch backend"] = "it launches PyTorch's own kernels: enable_pdl is ignored"
    backends = [b for b in backends if b != "torch"]
    others = [c.name for c in cases if c.op != core.PAGE_TABLE]
    if others:
        skipped[f"PDL chains of {', '.join(others)}"] = "measured on page-table cases (BATCHxCONTEXTxPAGE)"
    cases = [c for c in cases if c.op == core.PAGE_TABLE]
    if reason is not None:
        skipped["PDL chains"] = reason
        cases = []
    rows = []
    for i, case in enumerate(cases):
        x = core.make_inputs(case, device, seed + i)
        case_rows = measure_case(case, x, backends, reps)
        rows += case_rows
        print(f"[{i + 1}/{len(cases)}] {case.name}: " + ", ".join(
            f"{r.impl} {core._fmt(r.time_us)} µs" if r.status == "ok" else f"{r.impl} {r.status}"
            for r in case_rows), file=progress, flush=True)
        del x
    return core.Report(str(device), info.name, device.type == "cuda", "cuda-graph replay (PDL chains)",
                        "seq_lens = context for every row; shuffled physical pages; a one-program Triton producer "
                        "kernel writes req_pool_indices ahead of each call in the after-* rows",
                        backends, skipped, core.References(), [], rows)
