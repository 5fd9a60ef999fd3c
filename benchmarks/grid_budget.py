"""Experiment: the bounded launch grid's budget (``kvdispatch.grid.PROGRAMS_PER_MULTIPROCESSOR``) on an NVIDIA GPU.

For each setting of the programs per multiprocessor (2, 4, 8, 16, 32, 64, and unbounded: one program per block
of the buffer's width), the Triton page table and token CSR through the public API, in CUDA-graph replay (20
calls per graph), on

* real decode shapes: buffers for 1M tokens (``req_to_token`` 1M columns, the page table 1M / page wide), batch
  1, 8, 64 and 256, page 1, 16 and 64, rows of random length in [1K, 8K] (``len=1K-8K``), and the same with a
  few long rows (``len=mix``: one row in 16, at least one, of 256K-1M tokens);
* full-length shapes (every row as long as its buffer): 1x131072x64, 64x32768x64, 1x131072x1, 256x32768x1 (the
  token CSR at 1x131072, 64x32768, 256x32768).

Every setting's output is checked against the torch backend, eagerly and after a graph replay, before it is timed.
The launch plans are rebuilt for each setting (``kernels_triton.reset``); the kernels compile once. Prints a table
of µs per call, per case and setting, and the programs each launch took; writes every row to ``--out`` (JSON).

    python benchmarks/grid_budget.py --out grid_budget.json [--replays 30] [--settings 2,4,8,16,32,64,unbounded]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import kvdispatch  # noqa: E402
from kvdispatch import grid  # noqa: E402
from kvdispatch.bench import core as bench  # noqa: E402

SETTINGS = (2, 4, 8, 16, 32, 64, None)  # None: unbounded
UNBOUNDED = 2**40  # programs per multiprocessor that no width reaches: every block gets its own program
MAX_CONTEXT = 1 << 20
BATCHES = (1, 8, 64, 256)
PAGE_SIZES = (1, 16, 64)
SHORT = (1024, 8192)
LONG = (256 * 1024, MAX_CONTEXT)
GRAPH_CALLS = 20
POISON = bench.POISON
SHUFFLE = 2654435761  # a prime above every page count here: index * SHUFFLE mod count permutes the pages


@dataclass(frozen=True)
class Case:
    op: str  # "table" or "csr"
    batch: int
    context: int  # columns of req_to_token (and the page table's width in tokens)
    page_size: int  # the page table's; the CSR's table holds slots of pages of this size
    lengths: str  # "full", "1K-8K" or "mix"

    @property
    def name(self) -> str:
        shape = f"{self.batch}x{self.context}" + (f"x{self.page_size}" if self.op == "table" else "")
        return f"{self.op}:{shape}:len={self.lengths}"


@dataclass
class Row:
    case: str
    setting: str
    programs: int
    grid: tuple
    us: float | None
    status: str


def cases() -> list[Case]:
    real = [Case("table", b, MAX_CONTEXT, p, kind) for kind in ("1K-8K", "mix") for p in PAGE_SIZES for b in BATCHES]
    real += [Case("csr", b, MAX_CONTEXT, 1, kind) for kind in ("1K-8K", "mix") for b in BATCHES]
    full = [Case("table", b, c, p, "full") for b, c, p in ((1, 131072, 64), (64, 32768, 64), (1, 131072, 1),
                                                           (256, 32768, 1))]
    full += [Case("csr", b, c, 1, "full") for b, c in ((1, 131072), (64, 32768), (256, 32768))]
    return real + full


def lengths_of(case: Case, g: torch.Generator) -> torch.Tensor:
    if case.lengths == "full":
        return torch.full((case.batch,), case.context, dtype=torch.int32)
    lengths = torch.randint(SHORT[0], SHORT[1] + 1, (case.batch,), generator=g, dtype=torch.int32)
    if case.lengths == "mix":
        long_rows = torch.randperm(case.batch, generator=g)[:max(1, case.batch // 16)]
        lengths[long_rows] = torch.randint(LONG[0], LONG[1] + 1, (long_rows.numel(),), generator=g,
                                           dtype=torch.int32)
    return lengths


def inputs(case: Case, device: torch.device, seed: int):
    """``(call, out)``: the API call of ``case`` on fresh buffers (``call(backend)`` writes ``out``)."""
    g = torch.Generator().manual_seed(seed)
    rows = case.batch + 2
    pages = -(-case.context // case.page_size)
    # Each row on shuffled physical pages (index * a prime mod the page count: a permutation, built on the
    # device), slot = page * page_size + offset.
    count = rows * pages
    physical = torch.arange(count, dtype=torch.int64, device=device).mul_(SHUFFLE).remainder_(count)
    table = (physical.view(rows, pages, 1) * case.page_size
             + torch.arange(case.page_size, device=device)).view(rows, -1)[:, :case.context].to(torch.int32)
    del physical
    pool = torch.randperm(rows, generator=g)[:case.batch].to(torch.int32).to(device)
    lens = lengths_of(case, g).to(device)
    if case.op == "table":
        out = torch.empty(case.batch, pages, dtype=torch.int32, device=device)

        def call(backend):
            return kvdispatch.create_flashmla_kv_indices(table, pool, lens, out, page_size=case.page_size,
                                                         backend=backend)
    else:
        indptr = torch.zeros(case.batch + 1, dtype=torch.int32, device=device)
        indptr[1:] = torch.cumsum(lens, 0)
        out = torch.empty(max(case.context, int(indptr[-1])), dtype=torch.int32, device=device)

        def call(backend):
            return kvdispatch.create_flashinfer_kv_indices(table, pool, lens, indptr, out, backend=backend)
    return call, out


def launch_geometry(case: Case, out: torch.Tensor, budget: int) -> grid.Launch:
    if case.op == "table":
        return grid.page_table_launch(case.batch, out.shape[1], case.page_size, budget=budget)
    return grid.token_csr_launch(case.batch, case.context, out.shape[0], budget=budget)


def use_setting(setting) -> None:
    """Make ``setting`` the programs per multiprocessor and drop the launch plans built under another."""
    from kernels_triton import launch as triton_launch

    grid.PROGRAMS_PER_MULTIPROCESSOR = UNBOUNDED if setting is None else setting
    triton_launch.reset()


def measure(case: Case, call, out: torch.Tensor, expected: torch.Tensor, replays: int) -> tuple[float | None, str]:
    out.fill_(POISON)
    call("triton")
    torch.cuda.synchronize()
    if not torch.equal(out, expected):
        return None, "WRONG (eager)"
    graph = bench.capture(lambda: call("triton"), GRAPH_CALLS)
    out.fill_(POISON)
    graph.replay()
    torch.cuda.synchronize()
    if not torch.equal(out, expected):
        return None, "WRONG (graph replay)"
    us = bench.event_time_us(graph.replay, GRAPH_CALLS, replays)
    del graph
    return us, "ok"


def setting_name(setting) -> str:
    return "unbounded" if setting is None else str(setting)


def table(rows: list[Row], settings) -> str:
    names = [setting_name(s) for s in settings]
    by_case: dict[str, dict[str, Row]] = {}
    for row in rows:
        by_case.setdefault(row.case, {})[row.setting] = row
    width = max(len(c) for c in by_case) + 2
    lines = ["µs per call (CUDA-graph replay); programs per launch in brackets",
             "case".ljust(width) + "".join(f"{n:>18}" for n in names)]
    for case, row_of in by_case.items():
        cells = []
        for n in names:
            row = row_of.get(n)
            if row is None:
                cells.append(f"{'-':>18}")
            elif row.us is None:
                cells.append(f"{row.status[:17]:>18}")
            else:
                cells.append(f"{row.us:8.2f} [{row.programs:>6}]".rjust(18))
        lines.append(case.ljust(width) + "".join(cells))
    return "\n".join(lines)


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="JSON file for every row")
    parser.add_argument("--replays", type=int, default=30, help="graph replays timed per case and setting")
    parser.add_argument("--settings", default=",".join(setting_name(s) for s in SETTINGS),
                        help="programs per multiprocessor, comma-separated; 'unbounded' for none")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    settings = [None if s == "unbounded" else int(s) for s in args.settings.split(",")]
    if not torch.cuda.is_available():
        print("needs a GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    info = kvdispatch.probe(device)
    began = time.perf_counter()
    bench._warm_up_clocks(device)
    rows: list[Row] = []
    shipped = grid.PROGRAMS_PER_MULTIPROCESSOR
    try:
        for i, case in enumerate(cases()):
            call, out = inputs(case, device, args.seed + i)
            out.fill_(POISON)
            expected = call("torch").clone()
            for setting in settings:
                use_setting(setting)
                budget = grid.program_budget(info.multiprocessors)
                geometry = launch_geometry(case, out, budget)
                try:
                    us, status = measure(case, call, out, expected, args.replays)
                except Exception as exc:  # one case's failure is that row's, the others still run
                    torch.cuda.synchronize()
                    us, status = None, f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                rows.append(Row(case.name, setting_name(setting), math.prod(geometry.grid), geometry.grid, us,
                                status))
            del call, out, expected
            torch.cuda.empty_cache()
            print(f"  {case.name}: done ({time.perf_counter() - began:.0f} s)", file=sys.stderr, flush=True)
    finally:
        use_setting(shipped)
    print(table(rows, settings))
    report = dict(device=info.name, arch=info.arch, multiprocessors=info.multiprocessors, torch=torch.__version__,
                  triton=__import__("triton").__version__, python=platform.python_version(), commit=_commit(),
                  shipped_programs_per_multiprocessor=shipped, graph_calls=GRAPH_CALLS, replays=args.replays,
                  seconds=round(time.perf_counter() - began, 1), rows=[asdict(r) for r in rows])
    Path(args.out).write_text(json.dumps(report, indent=1))
    return 0 if all(r.status == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
