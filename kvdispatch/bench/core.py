"""``kvdispatch bench``'s shared machinery: cases, inputs, timing, CUDA-graph capture, rows, ratios, references,
the run and its output. What is particular to one op lives in its case module (``case_modules``).

Per case (``BATCHxCONTEXTxPAGE`` the page table, else ``OP:SHAPE[:OPTIONS]`` with ``OP`` the op's key in
``dispatch.OPS``, e.g. ``token_csr:8x32768:i64``; with a last option ``:len=LO-HI`` or ``:len=mix``, the
real decode shape: buffers for CONTEXT tokens a row, rows shorter, against an ideal baseline too) and
implementation: correctness against ``kvdispatch.reference`` (a wrong result fails the run), device time per call
(CUDA-graph replay on a GPU, wall clock on CPU), host time per eager call, ratios to the naive loop, the op's
SGLang-design baseline and plain PyTorch, and for page-1 page-table cases the bandwidth against a
device-to-device copy. Once per run: host cost of ``x.add_(1)`` and of a plain Triton launch, the copy bandwidth,
and Triton compilations across random widths. What cannot run on the device is skipped, each with its reason;
``legend()`` explains the columns.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import importlib.util
import math
import pkgutil
import statistics
import sys
import textwrap
import time
from dataclasses import dataclass, field

import torch

import kvdispatch
from kvdispatch import dispatch

POISON = -123456789
API_PREFIX, PLAIN_TORCH = "api:", "plain-torch"
NAIVE = "naive-loop"  # the page table's per-request loop: what the /naive column divides by
PAGE_TABLE = "page_table"  # a case without an op prefix; the op of the compilation sweep and the PDL chains
# The real decode shape (a case's last option :len=LO-HI or :len=mix): buffers sized for CONTEXT tokens per row, as
# an engine's CUDA graphs hold them (req_to_token and the page tables CONTEXT wide, the token CSR's out for batch *
# CONTEXT tokens), rows of random lengths from the case's seed: uniform in [LO, HI], or for mix uniform in
# MIX_SHORT except rows 0, MIX_LONG_EVERY, 2 * MIX_LONG_EVERY, ... of the batch, uniform in the top MIX_LONG_EVERY-th
# of CONTEXT.
MIX, MIX_SHORT, MIX_LONG_EVERY = "mix", (1024, 8192), 16

# The Triton interpreter (CPU, TRITON_INTERPRET=1) runs only cases with at most this many tokens in all.
INTERPRETER_MAX_TOKENS = 32768
COMPILE_WIDTHS = 100
COMPILE_GIVE_UP = 5  # stop the width sweep of a page size after this many compilations
COPY_BYTES = 1 << 29  # each way, for the device copy bandwidth

_LEGEND_CASES = """\
               rows full length, on shuffled physical pages; any case with a
               last option :len=LO-HI or :len=mix: the real decode shape,
               buffers sized for C tokens a row as a CUDA graph holds them
               (req_to_token C wide, tables ceil(C/P) wide, the CSR out B*C
               tokens), rows of lengths drawn from the seed: uniform in
               [LO, HI]; mix: 1024-8192 except every 16th request (from the
               first) in the top 16th of C"""
_LEGEND_IMPLS = """\
               plain-torch: the few PyTorch ops an engine would write; the
               ideal baselines: the 2-D design on a grid sized on the host
               from the longest row (a lower bound: not graph-safe)"""
_LEGEND_REST = """\
  status       ok; WRONG: differs from the op's reference (fails the run);
               error: see note
  path         api rows: what launched a repeated eager call, seen in that
               call: native (the compiled C host path), else the backend's
               Python path: triton (Triton's launcher; its interpreter on
               CPU), cupy, torch
  programs     programs one call launches: the API's GPU kernels' grid
               (kvdispatch.grid), a Triton baseline's own grid
  µs/call      time per call, the median over interleaved rounds: on a GPU,
               CUDA-graph replay; on CPU, wall clock
  host µs      host time per eager call (GPU; on CPU it is µs/call)
  /naive       µs/call divided by naive-loop's on the same case (< 1: faster)
  /2d          µs/call divided by the op's SGLang-design baseline's:
               2d-grid (csr-loop, mha-2d-grid, v2p-sglang, draft-loop, ...)
  /ideal       :len= cases: µs/call divided by the op's ideal baseline's
  /torch       µs/call divided by plain-torch's on the same case
  GB/s         page-1 cases: bytes read and written per call / µs/call
  /copy        GB/s divided by a device-to-device copy's GB/s (GPU)
  host/add_    api rows: host µs divided by the host µs of x.add_(1) timed
               in the same case's rounds (GPU)
  host/launch  api rows: host µs divided by the 2d-grid (csr-loop) row's
               host µs, a plain kernel[grid](...) launch of this op (GPU)
  /no-pdl      --pdl-chain: a +pdl row's µs/call divided by the same row's
               without programmatic dependent launch, same run (rows:
               chain, after-trigger and after-plain, per backend; see
               kvdispatch/bench/pdl.py)
  note         why WRONG or error; the timing when not CUDA-graph replay
"""


def legend() -> str:
    """What the columns mean, each op's case syntax and baselines from its case module (``LEGEND_CASE``,
    ``LEGEND_IMPLS``)."""
    def block(label, texts):
        lines = textwrap.wrap("; ".join(texts), 62, break_on_hyphens=False)
        return "\n".join(f"  {label if i == 0 else '':<11}  {line}" for i, line in enumerate(lines))

    modules = sorted(case_modules().items(), key=lambda item: item[0] != PAGE_TABLE)
    return ("Columns (one row per case and implementation; empty columns are left out;\n"
            "the lines above the table name what was skipped and why):\n"
            + block("case", [m.LEGEND_CASE for _, m in modules]) + ";\n" + _LEGEND_CASES + "\n"
            + block("impl", ["api:<backend>: the op's kvdispatch function, backend=<backend>"]
                    + [m.LEGEND_IMPLS for _, m in modules]) + ";\n" + _LEGEND_IMPLS + "\n" + _LEGEND_REST)


@functools.cache
def case_modules() -> dict:
    """Op key -> the op's case module: this package's modules named after an op of ``dispatch.OPS``, in
    its order, imported at the first call. The package's docstring says what each one defines."""
    package = sys.modules[__package__]
    present = {module.name for module in pkgutil.iter_modules(package.__path__)}
    return {op: importlib.import_module(f"{__package__}.{op}") for op in dispatch.OPS if op in present}


def case_set(kind: str) -> list[str]:
    """The cases of a set (``GPU``, ``GPU_QUICK``, ``GPU_REAL``, ``GPU_REAL_QUICK``, ``CPU``, ``CPU_QUICK``): each case
    module's ``CASES[kind]``, the page table's first."""
    modules = sorted(case_modules().items(), key=lambda item: item[0] != PAGE_TABLE)
    return [name for _, module in modules for name in module.CASES[kind]]


@dataclass(frozen=True)
class Case:
    """One case of the op ``op`` (its key; ``module``, its case module, parses, names and builds it): ``batch``
    requests of ``context`` tokens, ``page_size`` tokens per page (the token CSR's ``entry_page_size``); the
    ops' options: ``int64`` (the token CSR's output dtype), ``mapping`` (a ``token_mapping``; the MHA table's SWA
    twin), ``steps`` and ``topk`` (draft decode), ``dcp_size`` (the DCP ops), ``zero_tail`` (the translated
    table's ``fill_value=0``), ``v2p_page`` (the token CSR's ``v2p`` on pages of that many tokens; 0: none),
    ``entry_page_size`` and ``step_window`` (draft decode's page-granular table and per-step window)."""

    batch: int
    context: int
    page_size: int
    op: str = PAGE_TABLE
    int64: bool = False
    mapping: bool = False
    steps: int = 1  # draft decode: steps and branches per request
    topk: int = 1
    dcp_size: int = 1  # DCP ops: ranks per request
    lengths: str = ""  # "" every row full length; "LO-HI" or "mix": see MIX (context is then the capacity)
    zero_tail: bool = False
    v2p_page: int = 0
    entry_page_size: int = 1
    step_window: int = 0

    @property
    def module(self):
        return case_modules()[self.op]

    @property
    def width(self) -> int:
        """Table entries per request: pages (page table), entries of ``page_size`` tokens (token CSR); for DCP,
        the rank's tokens (token CSR) or pages (block table)."""
        return -(-self.context // (self.page_size * self.dcp_size))

    @property
    def name(self) -> str:
        return self.module.shape_name(self) + f":len={self.lengths}" * bool(self.lengths)

    @property
    def length_range(self) -> tuple[int, int]:
        """The uniform range (inclusive) the rows' lengths are drawn from: ``(context, context)`` for full-length
        rows; for ``mix``, that of its short rows (``MIX_SHORT``)."""
        if not self.lengths:
            return self.context, self.context
        if self.lengths == MIX:
            return MIX_SHORT
        low, high = (int(part) for part in self.lengths.split("-"))
        return low, high

    @classmethod
    def parse(cls, text: str) -> "Case":
        """``OP:SHAPE`` (``OP`` an op's key; without it, the page table) and a last option ``:len=...``."""
        shape, option, lengths = text.lower().partition(":len=")
        if option:
            return cls._parse_lengths(cls.parse(shape), lengths, text)
        op, _, rest = shape.partition(":")
        modules = case_modules()
        return modules[op].parse(rest, text) if op in modules else modules[PAGE_TABLE].parse(shape, text)

    @classmethod
    def _parse_lengths(cls, case: "Case", lengths: str, text: str) -> "Case":
        usage = (f"case {text!r}: the last option :len= takes LO-HI (rows of LO to HI tokens, 0 <= LO <= HI <= "
                 f"CONTEXT) or {MIX} (CONTEXT >= {MIX_SHORT[1]})")
        if lengths != MIX:
            try:
                low, high = (int(part) for part in lengths.split("-"))
            except ValueError:
                raise argparse.ArgumentTypeError(usage) from None
            if not 0 <= low <= high <= case.context:
                raise argparse.ArgumentTypeError(usage)
            lengths = f"{low}-{high}"
        elif case.context < MIX_SHORT[1]:
            raise argparse.ArgumentTypeError(usage)
        return dataclasses.replace(case, lengths=lengths)


def dimensions(shape: str, count: int, usage: str) -> list[int]:
    """The ``count`` whole numbers of ``shape`` (``AxBx...``); ``usage`` the error's text otherwise."""
    try:
        numbers = [int(part) for part in shape.split("x")]
    except ValueError:
        numbers = []
    if len(numbers) != count:
        raise argparse.ArgumentTypeError(usage)
    return numbers


@dataclass(frozen=True)
class Reps:
    """How much to repeat: calls per CUDA graph, graph replays, eager calls per batch, batches, and rounds
    (every implementation of a case is timed once per round, rounds interleaved; the median counts)."""

    graph_calls: int = 20
    replays: int = 100
    host_calls: int = 200
    host_batches: int = 7
    cpu_batch_seconds: float = 0.02  # CPU: calls per batch are chosen to take about this long
    rounds: int = 3


QUICK_REPS = Reps(graph_calls=20, replays=25, host_calls=200, host_batches=3, cpu_batch_seconds=0.004, rounds=1)


@dataclass
class Row:
    """One (case, implementation) result. Times in µs per call; ratios are time / baseline time."""

    case: str
    batch: int
    context: int
    page_size: int
    width: int
    impl: str
    status: str = "ok"  # ok | WRONG | error
    path: str = ""  # API rows: how a repeated eager call launched (eager_path)
    time_us: float | None = None  # GPU: CUDA-graph replay (or eager events, see timing); CPU: wall clock
    timing: str = ""  # cuda-graph | eager-events | wall-clock
    host_us: float | None = None  # eager call, host side (GPU); equal to time_us on CPU
    vs_naive: float | None = None
    vs_2d: float | None = None
    vs_ideal: float | None = None  # real-shape cases: time_us / the op's ideal baseline's
    programs: int | None = None  # programs one call launches (GPU kernels; None for PyTorch)
    vs_torch: float | None = None
    gbps: float | None = None  # page 1 only: (bytes read + written) / time_us
    copy_fraction: float | None = None  # gbps / device copy bandwidth
    host_vs_add: float | None = None  # API rows: host_us / add_host_us
    add_host_us: float | None = None  # API rows: host µs of x.add_(1), measured in the same rounds
    host_vs_launch: float | None = None  # API rows: host_us / host_us of the 2-D baseline (its plain launch)
    vs_no_pdl: float | None = None  # --pdl-chain rows with PDL: time_us / the same row's without PDL
    note: str = ""
    time_rounds: list = field(default_factory=list)  # time_us of each round (time_us is their median)
    host_rounds: list = field(default_factory=list)


@dataclass
class Compilations:
    """Triton compilations while building page tables of ``widths`` random widths at one page size."""

    page_size: int
    widths: int
    per_kernel: dict[str, int] = field(default_factory=dict)
    method: str = ""
    note: str = ""

    @property
    def ok(self) -> bool:
        return all(n <= 1 for n in self.per_kernel.values())


@dataclass
class References:
    """Once-per-run measurements the rows are compared with (µs per call, GB/s)."""

    add_host_us: float | None = None
    launch_host_us: float | None = None
    touch_kernel_us: float | None = None  # graph replay of a kernel with one load and one store
    copy_gbps: float | None = None
    notes: list[str] = field(default_factory=list)


@dataclass
class Report:
    device: str
    device_name: str
    gpu: bool
    timing: str
    data: str
    backends: list[str]
    skipped: dict[str, str]  # what was not measured (a backend, baselines, cases, counts) -> why
    references: References
    compilations: list[Compilations]
    rows: list[Row]

    @property
    def wrong(self) -> list[str]:
        """Every wrong result (rows and the compilation sweep): any of them fails the run."""
        return ([f"{r.case} {r.impl}" for r in self.rows if r.status == "WRONG"]
                + [f"compilation sweep, page {c.page_size}" for c in self.compilations if c.note.startswith("WRONG")])


# ----------------------------------------------------------------------------------------------- timing


def _sync(device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def host_time_us(fn, device, calls: int, batches: int) -> float:
    """Median over ``batches`` of the host time of ``calls`` back-to-back calls; sync only between batches."""
    samples = []
    for _ in range(batches):
        _sync(device)
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    _sync(device)
    return statistics.median(samples)


def wall_time_us(fn, device, reps: Reps) -> float:
    """CPU timing: ``host_time_us`` with the calls per batch chosen to take ``reps.cpu_batch_seconds``."""
    start = time.perf_counter()
    fn()
    once = max(time.perf_counter() - start, 1e-7)
    calls = max(1, min(reps.host_calls, int(reps.cpu_batch_seconds / once)))
    return host_time_us(fn, device, calls, reps.host_batches)


def event_time_us(launch, calls_per_launch: int, repeats: int) -> float:
    """Median GPU time of ``launch()`` (CUDA events around each), divided by the calls it makes.

    A short device sleep ahead of each chunk lets the host queue the launches before the GPU starts, so host
    launch gaps do not count (where ``torch.cuda._sleep`` exists).
    """
    chunk = 25
    times = []
    for first in range(0, repeats, chunk):
        n = min(chunk, repeats - first)
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
        if hasattr(torch.cuda, "_sleep"):
            torch.cuda._sleep(2_000_000)
        for begin, end in events:
            begin.record()
            launch()
            end.record()
        torch.cuda.synchronize()
        times += [begin.elapsed_time(end) * 1e3 / calls_per_launch for begin, end in events]
    return statistics.median(times)


def capture(fn, calls: int):
    """A CUDA graph of ``calls`` calls of ``fn`` (warmed up on a side stream first)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    torch.cuda.synchronize()
    return graph


# ------------------------------------------------------------------------------------------------- data


@dataclass
class Inputs:
    req_to_token: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    out: torch.Tensor
    expected: torch.Tensor
    kv_indptr: torch.Tensor | None = None  # token CSR and draft decode only
    token_mapping: torch.Tensor | None = None  # token CSR with a mapping only
    dcp_rank: int = 0  # DCP ops
    positions: torch.Tensor | None = None  # draft decode only
    expected_one_step: torch.Tensor | None = None  # draft decode: out after a build of step 0 only


# The token CSR's E == 1 cases read a token-granular table of a pool of pages of this many tokens.
CSR_POOL_PAGE = 64


def make_inputs(case: Case, device: torch.device, seed: int) -> Inputs:
    """A shuffled page pool: every request's tokens on random physical pages of its own, and the op's buffers
    (``case.module.make_inputs``, which says what else).

    ``req_to_token`` has a few spare rows and ``req_pool_indices`` is a random subset of them, so rows
    are read out of order, as in an engine. Rows are full length, or of random lengths in buffers for
    ``case.context`` tokens (``case.lengths``, ``requests``).
    """
    return case.module.make_inputs(case, device, seed)


def requests(case: Case, g: torch.Generator) -> tuple[int, torch.Tensor, torch.Tensor]:
    """``(rows, pool, lengths)``: the pool's rows (the batch and a few spare ones), the batch's rows (int64
    ``[batch]``, a random subset) and every row's tokens (int64 ``[rows]``, CPU): ``case.context`` (full
    length), or drawn from ``g``, uniform in ``case.length_range``; for ``mix``, every ``MIX_LONG_EVERY``-th
    request of the batch (from the first) in the top ``1 / MIX_LONG_EVERY`` of ``case.context``."""
    rows = case.batch + max(1, case.batch // 8)
    pool = torch.randperm(rows, generator=g)[: case.batch]
    if not case.lengths:
        return rows, pool, torch.full((rows,), case.context)
    low, high = case.length_range
    lengths = torch.randint(low, high + 1, (rows,), generator=g)
    if case.lengths == MIX:
        long_rows = pool[::MIX_LONG_EVERY]
        lengths[long_rows] = torch.randint(case.context - case.context // MIX_LONG_EVERY, case.context + 1,
                                           (long_rows.numel(),), generator=g)
    return rows, pool, lengths


def indptr(lengths: torch.Tensor) -> torch.Tensor:
    """int32 ``[B + 1]``: rows of ``lengths`` back to back from 0."""
    return torch.cat([lengths.new_zeros(1), lengths.cumsum(0)]).to(torch.int32)


def page_pool(rows: int, context: int, page_size: int, g: torch.Generator, device,
              lengths: torch.Tensor) -> torch.Tensor:
    """int32 ``[rows, context]``: row r's first ``lengths[r]`` slots (int64 ``[rows]``, CPU) on random physical
    pages of ``page_size`` of its own; the positions past a row's length hold slot 0 (stale, as an engine's
    table holds there)."""
    pages = -(-lengths // page_size)
    physical = torch.randperm(int(pages.sum()), generator=g).to(device)
    first_page, first_token = (pages.cumsum(0) - pages).to(device), (lengths.cumsum(0) - lengths).to(device)
    row = torch.repeat_interleave(torch.arange(rows, device=device), lengths.to(device))
    position = torch.arange(row.numel(), device=device) - first_token[row]
    slots = physical[first_page[row] + position // page_size] * page_size + position % page_size
    req_to_token = torch.zeros((rows, context), dtype=torch.int32, device=device)
    req_to_token[row, position] = slots.to(torch.int32)
    return req_to_token


def shuffled_pool(case: Case, device: torch.device, seed: int, page_size: int, index_dtype=torch.int32):
    """``(g, req_to_token, req_pool_indices, seq_lens)``: the ``page_pool`` of ``requests(case, g)``, ``context``
    wide on pages of ``page_size``; ``req_pool_indices`` of ``index_dtype``, ``seq_lens`` int32, both on
    ``device``; ``g`` the generator of ``seed`` after those draws, for the op's other inputs."""
    g = torch.Generator().manual_seed(seed)
    rows, pool, lengths = requests(case, g)
    req_to_token = page_pool(rows, case.context, page_size, g, device, lengths)
    return g, req_to_token, pool.to(device=device, dtype=index_dtype), lengths[pool].to(device=device,
                                                                                       dtype=torch.int32)


# ------------------------------------------------------------------------------------ implementations


def baseline_kernels():
    """``kvdispatch.bench.baselines``, the Triton comparison kernels (imported at the first use: ``triton.jit``
    reads ``TRITON_INTERPRET`` then)."""
    return importlib.import_module("kvdispatch.bench.baselines")


def triton_runs_on(device: torch.device) -> bool:
    """Whether our Triton baselines can run: a GPU Triton supports, or CPU with TRITON_INTERPRET=1."""
    return kvdispatch.probe(device).usable("triton")


def api_backend(impl: str) -> str | None:
    """The backend an API row (``api:<backend>``) asks for; None for every other implementation."""
    return impl[len(API_PREFIX):] if impl.startswith(API_PREFIX) else None


def implementations(backends: list[str], device: torch.device, case: Case) -> list[str]:
    """What ``case`` is timed with: the API per backend (and the op's ``API_VARIANTS``), then its Triton
    baselines, then plain PyTorch where the op has it for the case's shape (``PLAIN_TORCH_CASES``)."""
    module = case.module
    names = [API_PREFIX + b for b in backends] + list(module.API_VARIANTS)
    if triton_runs_on(device):
        names += triton_baselines(case)
    plain = module.PLAIN_TORCH_CASES == "all" or (module.PLAIN_TORCH_CASES == "full-length" and not case.lengths)
    return names + [PLAIN_TORCH] * plain


def triton_baselines(case: Case) -> list[str]:
    """The Triton baselines of ``case``: its op's, with the ideal one on a real-shape case (``Case.lengths``); a
    case of an option with a design of its own, that design's (its module's ``option_baseline``)."""
    module = case.module
    if option := option_baseline(case):
        return [option]
    return list(module.TRITON_BASELINES) + [module.IDEAL_BASELINE] * bool(case.lengths and module.IDEAL_BASELINE)


def ideal_pages(x: Inputs, case: Case) -> int:
    """The longest row's pages (read on the host): the columns an ideal baseline's grid covers."""
    return -(-int(x.seq_lens.max()) // case.page_size)


def bind(impl: str, x: Inputs, case: Case):
    """A no-argument callable that builds ``x.out`` with ``impl`` (one that must leave another result carries
    it as ``expected``)."""
    return case.module.bind(impl, x, case)


def _expected(fn, x: Inputs) -> torch.Tensor:
    """What ``fn`` (from ``bind``) must leave in ``x.out``."""
    return getattr(fn, "expected", x.expected)


def option_baseline(case: Case) -> str | None:
    """The one Triton baseline of a case whose options SGLang builds with a kernel of their own (it is then
    also what ``/2d`` divides by); None for the others."""
    return getattr(case.module, "option_baseline", lambda case: None)(case)


def sglang_baseline(case: Case) -> str:
    """What ``/2d`` and ``host/launch`` divide by."""
    return option_baseline(case) or case.module.SGLANG_BASELINE


def uses_interpreter(impl: str, device: torch.device) -> bool:
    return device.type == "cpu" and (impl == API_PREFIX + "triton" or any(
        impl in (*module.TRITON_BASELINES, module.IDEAL_BASELINE, *getattr(module, "OPTION_BASELINES", ()))
        for module in case_modules().values()))


def programs(impl: str, case: Case, x: Inputs, fn) -> int | None:
    """Programs one call of ``impl`` launches: an API row's on the GPU backends, from ``kvdispatch.grid`` as
    they size it (the op's ``launch``); a Triton baseline's, the grid its launcher returns (``fn`` is called
    once more); None for PyTorch (the torch backend, plain-torch)."""
    budget = kvdispatch.grid.program_budget(kvdispatch.probe(x.out.device).multiprocessors)
    if impl in case.module.API_VARIANTS:  # the auto-selected backend: a GPU one on a GPU
        return math.prod(case.module.launch(case, x, budget).grid) if x.out.is_cuda else None
    if impl.startswith(API_PREFIX):
        return None if impl == API_PREFIX + "torch" else math.prod(case.module.launch(case, x, budget).grid)
    if impl == PLAIN_TORCH:
        return None
    return math.prod(fn())


# --------------------------------------------------------------------------------------- measurements


def mismatch(out: torch.Tensor, expected: torch.Tensor) -> str:
    """Empty if equal, else a short description of the first differences."""
    if torch.equal(out, expected):
        return ""
    bad = (out != expected).nonzero()
    first = tuple(int(v) for v in bad[0])
    return (f"{bad.shape[0]} of {out.numel()} entries differ; first out[{', '.join(map(str, first))}] = "
            f"{int(out[first])}, expected {int(expected[first])}")


def check_eager(fn, x: Inputs) -> str:
    x.out.fill_(POISON)
    fn()
    return mismatch(x.out, _expected(fn, x))


# The "path" of an API row whose repeated eager call a compiled entry of dispatch took: the attributes of
# ``dispatch`` the C host path installs (``kvdispatch/host_path.py``), each None until it does.
NATIVE_PATH = "native"
COMPILED_ENTRIES = ("fast_replay",)


def eager_path(fn, x: Inputs, backend: str) -> tuple[str, str]:
    """``(path, wrong)`` of one more eager call of an API row's ``fn`` (``check_eager``'s verdict in
    ``wrong``): ``NATIVE_PATH`` when the compiled entry (``dispatch.fast_replay``, the C host path)
    launched it, else ``backend``, the one the row asks for, whose Python
    path then served it. Counted with wrappers around the installed entries, for this call only; an entry
    installed meanwhile (the first use of the compiled path) is left in place."""
    launched = []

    def counting(entry):
        def call(*args):
            result = entry(*args)
            if result is not NotImplemented:
                launched.append(result)
            return result
        return call

    wrapped = {name: (entry, counting(entry)) for name in COMPILED_ENTRIES
               if (entry := getattr(dispatch, name)) is not None}
    for name, (_, wrapper) in wrapped.items():
        setattr(dispatch, name, wrapper)
    try:
        wrong = check_eager(fn, x)
    finally:
        for name, (entry, wrapper) in wrapped.items():
            if getattr(dispatch, name) is wrapper:
                setattr(dispatch, name, entry)
    return (NATIVE_PATH if launched else backend), wrong


def measure(impl: str, case: Case, x: Inputs, device: torch.device, reps: Reps) -> Row:
    """Correctness, then the first round of timings, of one implementation on one case; for API rows a
    second eager call (plans exist then) says the launch path and is checked too."""
    row = Row(case.name, case.batch, case.context, case.page_size, case.width, impl)
    try:
        fn = bind(impl, x, case)
        wrong = check_eager(fn, x)
        if wrong:
            row.status, row.note = "WRONG", f"eager: {wrong}"
            return row
        if impl.startswith(API_PREFIX):
            row.path, wrong = eager_path(fn, x, api_backend(impl))
            if wrong:
                row.status, row.note = "WRONG", f"eager, repeated ({row.path}): {wrong}"
                return row
        row.programs = programs(impl, case, x, fn)
    except Exception as exc:  # one implementation failing must not stop the run
        row.status, row.note = "error", f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        _recover(device)
        return row
    time_again(row, x, device, reps)
    return row


def time_again(row: Row, x: Inputs, device: torch.device, reps: Reps) -> None:
    """One more round of timings of ``row``'s implementation; ``time_us`` and ``host_us`` become the
    medians of the rounds so far."""
    fn = bind(row.impl, x, Case.parse(row.case))
    try:
        if device.type != "cuda":
            time_us = host_us = wall_time_us(fn, device, reps)
            row.timing = "wall-clock"
        else:
            host_us = host_time_us(fn, device, reps.host_calls, reps.host_batches)
            time_us, row.timing, note = gpu_time_us(fn, x, reps)
            if note.startswith("WRONG"):
                row.status, row.note = "WRONG", note
            row.note = row.note or note
    except Exception as exc:  # one implementation failing must not stop the run
        row.status, row.note = "error", f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        _recover(device)
        return
    row.time_rounds.append(time_us)
    row.host_rounds.append(host_us)
    row.time_us, row.host_us = statistics.median(row.time_rounds), statistics.median(row.host_rounds)


def gpu_time_us(fn, x: Inputs, reps: Reps) -> tuple[float, str, str]:
    """GPU time per call under CUDA-graph replay; eager events if capture fails. Checks the replayed result."""
    try:
        graph = capture(fn, reps.graph_calls)
    except Exception as exc:
        _recover(x.out.device)
        note = f"graph capture failed ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})"
        time_us = event_time_us(lambda: [fn() for _ in range(reps.graph_calls)], reps.graph_calls, reps.replays)
        return time_us, "eager-events", note
    x.out.fill_(POISON)
    graph.replay()
    torch.cuda.synchronize()
    wrong = mismatch(x.out, _expected(fn, x))
    if wrong:
        return math.nan, "cuda-graph", f"WRONG after graph replay: {wrong}"
    return event_time_us(graph.replay, reps.graph_calls, reps.replays), "cuda-graph", ""


def _recover(device: torch.device):
    """After a failure: make sure no capture is left open and the device is idle."""
    if device.type == "cuda":
        try:
            torch.cuda.synchronize(device)
        except Exception:
            pass


def add_ratios(rows: list[Row], add_host_us: float | None, copy_gbps: float | None):
    """Fill the ratio and bandwidth columns of one case's rows; ``add_host_us``: host µs of ``x.add_(1)``
    measured in the same rounds as the rows (GPU runs only)."""
    base = {r.impl: r.time_us for r in rows if r.status == "ok" and r.time_us}
    for r in rows:
        if r.status != "ok" or not r.time_us:
            continue
        case = Case.parse(r.case)
        sglang = sglang_baseline(case)
        host_of_sglang = next((b.host_us for b in rows if b.impl == sglang and b.status == "ok"), None)
        r.vs_naive = _ratio(r.time_us, base.get(NAIVE))
        r.vs_2d = _ratio(r.time_us, base.get(sglang))
        r.vs_ideal = _ratio(r.time_us, base.get(case.module.IDEAL_BASELINE))
        r.vs_torch = _ratio(r.time_us, base.get(PLAIN_TORCH))
        moved = getattr(case.module, "bytes_moved", lambda case: None)(case)
        if moved:
            r.gbps = moved / r.time_us / 1e3
            r.copy_fraction = _ratio(r.gbps, copy_gbps)
        if r.impl.startswith(API_PREFIX) and r.timing != "wall-clock":
            r.add_host_us = add_host_us
            r.host_vs_add = _ratio(r.host_us, add_host_us)
            # A plain ``kernel[grid](...)`` of this op: its SGLang-design baseline, same case, same run.
            r.host_vs_launch = _ratio(r.host_us, host_of_sglang)


def _ratio(a, b):
    return a / b if a and b else None


def _warm_up_clocks(device: torch.device, seconds: float = 1.0):
    """Keep the GPU busy for a while first: an idle GPU's clocks are low, and they ramp up under load."""
    x = torch.empty(COPY_BYTES // 4, dtype=torch.int32, device=device)
    y = torch.empty_like(x)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(20):
            y.copy_(x)
        torch.cuda.synchronize(device)


def measure_references(device: torch.device, reps: Reps) -> References:
    """Host µs of ``x.add_(1)`` and of a plain Triton launch; that kernel's replay; device copy bandwidth."""
    refs = References()
    x = torch.zeros(16, device=device)
    refs.add_host_us = host_time_us(functools.partial(x.add_, 1), device, reps.host_calls, reps.host_batches)
    if device.type != "cuda":
        return refs
    _warm_up_clocks(device)
    if triton_runs_on(device):
        try:
            touch = functools.partial(baseline_kernels().touch, x)
            touch()
            refs.launch_host_us = host_time_us(touch, device, reps.host_calls, reps.host_batches)
            graph = capture(touch, reps.graph_calls)
            refs.touch_kernel_us = event_time_us(graph.replay, reps.graph_calls, reps.replays)
        except Exception as exc:
            refs.notes.append(f"plain Triton launch failed: {type(exc).__name__}: {exc}")
    else:
        refs.notes.append("no Triton on this device: host cost vs a plain launch is n/a")
    try:
        src = torch.empty(COPY_BYTES // 4, dtype=torch.int32, device=device)
        dst = torch.empty_like(src)
        # Eager, not graph-captured: a captured device-to-device copy becomes a memcpy node, which the
        # driver may run on a copy engine at a lower rate than the copy kernel an eager copy_ launches.
        copy_us = event_time_us(functools.partial(dst.copy_, src), 1, 50)
        refs.copy_gbps = 2 * COPY_BYTES / copy_us / 1e3
        del src, dst
    except Exception as exc:
        refs.notes.append(f"copy bandwidth failed: {type(exc).__name__}: {exc}")
    return refs


def _kernels_triton_objects():
    """``(module name, attribute, value)`` for every attribute of the loaded ``kernels_triton`` modules."""
    for name, mod in list(sys.modules.items()):
        if mod is not None and name.split(".")[0] == "kernels_triton":
            for attr, value in list(vars(mod).items()):
                yield name, attr, value


def compiled_variants() -> tuple[dict[str, int], str]:
    """``({kernel: compilations so far}, method)`` for the Triton backend.

    Uses the ``compile_count`` the launchers of ``kernels_triton`` expose; without them, the JIT caches of
    every Triton function in its modules.
    """
    dispatch.REGISTRY["triton"].load()
    counts, seen = {}, set()
    for module, attr, value in _kernels_triton_objects():
        count = getattr(value, "compile_count", None)
        if isinstance(count, int) and not isinstance(value, type) and id(value) not in seen:
            seen.add(id(value))
            counts[getattr(getattr(value, "kernel", None), "__name__", None) or f"{module}.{attr}"] = count
    if counts:
        return counts, "compile_count of the kernels_triton launchers"
    from triton.runtime.jit import JITFunction

    for module, attr, value in _kernels_triton_objects():
        for _ in range(4):  # Autotuner / Heuristics wrap the JIT function in .fn
            if isinstance(value, JITFunction) or not hasattr(value, "fn"):
                break
            value = value.fn
        if isinstance(value, JITFunction):
            counts[value.fn.__name__] = sum(len(c[0]) for c in getattr(value, "device_caches", {}).values())
    return counts, "Triton JIT cache entries of kernels_triton"


def count_compilations(device: torch.device, page_sizes, seed: int) -> list[Compilations]:
    """Triton compilations across random widths, per page size; run before any case so the first counts."""
    try:
        _, method = compiled_variants()
    except Exception as exc:
        return [Compilations(p, 0, method="n/a", note=f"cannot count: {type(exc).__name__}: {exc}")
                for p in page_sizes]
    g = torch.Generator().manual_seed(seed)
    results = []
    for page_size in page_sizes:
        result = Compilations(page_size, 0, method=method)
        before = compiled_variants()[0]

        def added():
            return {k: v - before.get(k, 0) for k, v in compiled_variants()[0].items() if v != before.get(k, 0)}

        try:
            for _ in range(COMPILE_WIDTHS):
                width = int(torch.randint(1, 4097, (1,), generator=g))
                x = make_inputs(Case(2, width * page_size, page_size), device, int(torch.randint(1 << 30, (1,))))
                wrong = check_eager(bind(API_PREFIX + "triton", x, Case(2, width * page_size, page_size)), x)
                result.widths += 1
                if wrong:
                    result.note = f"WRONG at width {width}: {wrong}"
                    break
                if sum(added().values()) > COMPILE_GIVE_UP:
                    result.note = f"stopped after {result.widths} widths: over {COMPILE_GIVE_UP} compilations"
                    break
        except Exception as exc:
            result.note = f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            _recover(device)
        result.per_kernel = added()
        results.append(result)
    return results


# ------------------------------------------------------------------------------------------------- run


def resolve_backends(requested: list[str] | None, device: torch.device) -> tuple[list[str], dict[str, str]]:
    """Backends to time and the skipped ones with the reason.

    ``requested`` None: every backend that can serve ``device``; the others are skipped. A requested
    backend that cannot serve ``device`` raises ``dispatch.BackendUnavailableError`` with the reason.
    """
    usable, rejected = dispatch.selector.candidates(kvdispatch.probe(device), device)
    if requested is None:
        return usable, rejected
    for name in requested:
        if name not in usable:
            raise dispatch.BackendUnavailableError(f"backend {name!r} cannot run on {device}: {rejected[name]}")
    return list(requested), {}


def skipped_measurements(backends: list[str], device: torch.device, cases: list[Case]) -> dict[str, str]:
    """What this run leaves out besides whole backends, with the reason."""
    skipped = {}
    triton_reason = kvdispatch.probe(device).reason("triton")
    if triton_reason is not None:
        baselines = list(dict.fromkeys(b for c in cases for b in triton_baselines(c)))
        skipped[f"{', '.join(baselines[:-1])} and {baselines[-1]} (Triton baselines)" if len(baselines) > 1
                else f"{baselines[0]} (Triton baseline)"] = triton_reason
    elif device.type == "cpu":
        too_big = [c for c in cases if c.batch * c.context > INTERPRETER_MAX_TOKENS]
        if too_big:
            impls = ", ".join(dict.fromkeys(i for c in too_big for i in implementations(backends, device, c)
                                            if uses_interpreter(i, device)))
            too_big = [c.name for c in too_big]
            skipped[f"{impls} on {', '.join(too_big)}"] = (
                f"the Triton interpreter runs only cases of at most {INTERPRETER_MAX_TOKENS} tokens")
    if device.type != "cuda":
        skipped["host cost, copy bandwidth, Triton compilations"] = "measured on a GPU only"
    elif "triton" not in backends:
        skipped["Triton compilations across random widths"] = "the triton backend is not timed"
    return skipped


def run(cases: list[Case], requested: list[str] | None, device: torch.device, reps: Reps, seed: int = 0,
        progress=None) -> Report:
    """Every measurement of the run; ``progress`` (default stderr) gets one line per case."""
    progress = progress or sys.stderr
    info = kvdispatch.probe(device)
    gpu = device.type == "cuda"
    backends, skipped = resolve_backends(requested, device)
    skipped.update(skipped_measurements(backends, device, cases))
    compilations = []
    if gpu and "triton" in backends:
        print(f"counting triton compilations across {COMPILE_WIDTHS} random widths ...", file=progress, flush=True)
        compilations = count_compilations(device, sorted({c.page_size for c in cases if c.op == PAGE_TABLE}), seed)
    refs = measure_references(device, reps)
    add_one = functools.partial(torch.zeros(16, device=device).add_, 1)
    rows = []
    for i, case in enumerate(cases):
        try:
            x = make_inputs(case, device, seed + i)
        except Exception as exc:
            rows.append(Row(case.name, case.batch, case.context, case.page_size, case.width, "inputs", "error",
                            note=f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"))
            print(f"[{i + 1}/{len(cases)}] {case.name}: inputs failed", file=progress, flush=True)
            _recover(device)
            continue
        # x.add_(1) once per round too: host/add_ compares host times taken minutes apart otherwise, and the
        # host's speed drifts over a run (by 1.8x within one run of the H200's host).
        add_rounds = [host_time_us(add_one, device, reps.host_calls, reps.host_batches)] if gpu else []
        case_rows = []
        for impl in implementations(backends, device, case):
            if uses_interpreter(impl, device) and case.batch * case.context > INTERPRETER_MAX_TOKENS:
                continue
            case_rows.append(measure(impl, case, x, device, reps))
        for _ in range(reps.rounds - 1):  # interleaved: slow drifts of the machine hit every row alike
            if gpu:
                add_rounds.append(host_time_us(add_one, device, reps.host_calls, reps.host_batches))
            for row in case_rows:
                if row.status == "ok":
                    time_again(row, x, device, reps)
        add_ratios(case_rows, statistics.median(add_rounds) if add_rounds else None, refs.copy_gbps)
        rows += case_rows
        print(f"[{i + 1}/{len(cases)}] {case.name}: " + ", ".join(
            f"{r.impl} {_fmt(r.time_us)} µs" if r.status == "ok" else f"{r.impl} {r.status}" for r in case_rows),
            file=progress, flush=True)
        del x
    return Report(str(device), info.name, gpu, "cuda-graph replay" if gpu else "wall-clock (CPU)",
                  "seq_lens = context for every row (all rows full length; :len= cases: CONTEXT is the buffers' "
                  "capacity, rows of random lengths); width = ceil(context / page); shuffled physical pages; "
                  "token_csr: token_mapping a random permutation of the pool's slots",
                  backends, skipped, refs, compilations, rows)


# ---------------------------------------------------------------------------------------------- output

COLUMNS = [  # (header, Row attribute, format)
    ("case", "case", "s"), ("impl", "impl", "s"), ("status", "status", "s"), ("path", "path", "s"),
    ("programs", "programs", "n"), ("µs/call", "time_us", "t"),
    ("host µs", "host_us", "t"), ("/naive", "vs_naive", "x"), ("/2d", "vs_2d", "x"), ("/ideal", "vs_ideal", "x"),
    ("/torch", "vs_torch", "x"),
    ("GB/s", "gbps", "g"), ("/copy", "copy_fraction", "x"), ("host/add_", "host_vs_add", "x"),
    ("host/launch", "host_vs_launch", "x"), ("/no-pdl", "vs_no_pdl", "x"), ("note", "note", "s"),
]


def _fmt(value, kind="t") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "" if kind == "s" else "-"
    if kind in ("s", "n"):
        return str(value)
    if kind == "x":
        return f"{value:.2f}x"
    if kind == "g":
        return f"{value:.0f}" if value >= 10 else f"{value:.3g}"
    return f"{value:.2f}" if value < 100 else f"{value:.0f}"


def shown_columns(rows: list[Row]) -> list[tuple[str, str, str]]:
    """``COLUMNS`` less those with nothing measured in ``rows``, and less ``host µs`` where it repeats
    ``µs/call`` (wall-clock timing: the host time is the time)."""
    def shown(attribute):
        if attribute == "host_us" and all(r.host_us is None or r.host_us == r.time_us for r in rows):
            return False
        return any(_fmt(getattr(r, attribute), "s") != "" for r in rows)

    return [c for c in COLUMNS if c[1] in ("case", "impl", "status") or shown(c[1])]


def table(rows: list[Row], markdown: bool) -> str:
    columns = shown_columns(rows)
    cells = [[h for h, _, _ in columns]] + [[_fmt(getattr(r, a), k) for _, a, k in columns] for r in rows]
    if markdown:
        lines = ["| " + " | ".join(c) + " |" for c in cells]
        lines.insert(1, "|" + "|".join("---" if k == "s" else "---:" for _, _, k in columns) + "|")
        return "\n".join(lines)
    widths = [max(len(c[i]) for c in cells) for i in range(len(columns))]
    return "\n".join("  ".join(c.ljust(w) if k == "s" else c.rjust(w)
                               for c, w, (_, _, k) in zip(cell, widths, columns)).rstrip() for cell in cells)


def header(report: Report) -> list[str]:
    """What ran where, what was skipped and why, and the once-per-run references."""
    refs = report.references
    timed = list(dict.fromkeys(r.impl for r in report.rows if r.impl != "inputs"))
    lines = [f"device: {report.device} ({report.device_name}); timing: {report.timing}",
             f"data: {report.data}",
             f"timed: {', '.join(timed) or 'nothing'}"]
    lines += [f"skipped {what}: {why}" for what, why in report.skipped.items()]
    references = [f"x.add_(1) {_fmt(refs.add_host_us)} host µs per call"
                  + (" (host/add_ divides by the x.add_(1) timed in each case's own rounds)" if report.gpu else "")]
    if refs.launch_host_us is not None:
        references.append(f"a plain Triton launch of a one-argument kernel {_fmt(refs.launch_host_us)} host µs")
    if refs.touch_kernel_us is not None:
        references.append(f"that kernel (one load, one store) replays in {_fmt(refs.touch_kernel_us)} µs")
    if refs.copy_gbps is not None:
        references.append(f"device copy {_fmt(refs.copy_gbps, 'g')} GB/s (read + written)")
    return lines + ["references: " + "; ".join(references)] + refs.notes


def footer(report: Report) -> list[str]:
    """Host cost of each backend through the API, compilation counts, failures."""
    lines = []
    for backend in report.backends:
        api = [r for r in report.rows if r.impl == API_PREFIX + backend and r.host_vs_add is not None]
        if api:
            to_add = statistics.median(r.host_vs_add for r in api)
            to_launch = [r.host_vs_launch for r in api if r.host_vs_launch is not None]
            lines.append(f"host cost of {backend} through the API (median over cases): {to_add:.2f}x x.add_(1)"
                         + (f", {statistics.median(to_launch):.2f}x a plain kernel[grid](...) launch of the "
                            f"{case_modules()[PAGE_TABLE].SGLANG_BASELINE} baseline" if to_launch else ""))
    for c in report.compilations:
        counts = ", ".join(f"{k}: {v}" for k, v in c.per_kernel.items()) or "none new"
        verdict = "n/a" if c.method == "n/a" else "ok" if c.ok and not c.note else "CHECK"
        lines.append(f"triton compilations, page {c.page_size}, {c.widths} random widths: "
                     f"{counts if c.method != 'n/a' else '-'} [{verdict}] {c.note}".rstrip())
    lines += [f"{r.status}: {r.case} {r.impl}: {r.note}" for r in report.rows if r.status != "ok"]
    if report.wrong:
        lines.append(f"FAILED: {len(report.wrong)} wrong result(s): {'; '.join(report.wrong)}")
    elif all(r.status == "ok" for r in report.rows):
        lines.append("all results correct")
    return lines


def _finite(value):
    """JSON-safe: NaN and infinities become None, recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def to_json(report: Report) -> dict:
    data = dataclasses.asdict(report)
    for c, raw in zip(report.compilations, data["compilations"]):
        raw["ok"] = c.ok
    data["wrong"] = report.wrong
    return _finite(data)


def plot(report: Report, path: str):
    """Grouped bars, log-scale µs per call, per case and implementation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = list(dict.fromkeys(r.case for r in report.rows))
    impls = list(dict.fromkeys(r.impl for r in report.rows))
    times = {(r.case, r.impl): r.time_us for r in report.rows if r.status == "ok" and r.time_us}
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(cases) * max(1, len(impls)) / 3), 4.5))
    step = 0.8 / max(1, len(impls))
    for j, impl in enumerate(impls):
        xs = [i + j * step for i, c in enumerate(cases) if (c, impl) in times]
        ax.bar(xs, [times[(c, impl)] for c in cases if (c, impl) in times], step, label=impl)
    ax.set_xticks([i + 0.4 - step / 2 for i in range(len(cases))], cases, rotation=30, ha="right")
    ax.set_yscale("log")
    ax.set_ylabel("µs per call (" + report.timing + ")")
    ax.set_title(f"kvdispatch index builds, {report.device_name}")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ------------------------------------------------------------------------------------------------- CLI


def parse_cases(text: str) -> list[Case]:
    return [Case.parse(c.strip()) for c in text.split(",") if c.strip()]


def parse_backends(text: str) -> list[str]:
    names = list(dict.fromkeys(b.strip().lower() for b in text.split(",") if b.strip()))
    unknown = [b for b in names if b not in dispatch.BACKENDS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown backend {', '.join(map(repr, unknown)) or repr(text)}; "
                                         f"choose from {', '.join(dispatch.BACKENDS)}")
    return names


def plot_path(text: str) -> str:
    if importlib.util.find_spec("matplotlib") is None:
        raise argparse.ArgumentTypeError('needs matplotlib: pip install matplotlib (or, in a kvdispatch checkout, '
                                         'pip install -e ".[bench]")')
    return text


def add_arguments(parser: argparse.ArgumentParser):
    """The options of ``kvdispatch bench`` (``--device`` is the command line's, shared with ``demo``)."""
    parser.add_argument("--quick", action="store_true", help="a few cases, fewer repetitions")
    parser.add_argument("--cases", type=parse_cases,
                        help='comma-separated BATCHxCONTEXTxPAGE (page table) or OP:SHAPE, OP an op\'s key (the '
                             'case column below gives each SHAPE), each with a last option :len=LO-HI or :len=mix for '
                             'the real decode shape (CONTEXT the capacity), e.g. "1x131072x64,token_csr:8x32768:i64:'
                             'e64:map,draft_decode:64x4096x5x4,dcp_token_csr:64x32768x4,256x1048576x64:len=1024-8192"')
    parser.add_argument("--backends", type=parse_backends,
                        help="comma-separated subset of triton,cupy,torch (default: every one that can run on "
                             "the device; asking for one that cannot is an error)")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON")
    parser.add_argument("--plot", metavar="PATH", type=plot_path,
                        help="write a PNG (log-scale µs per case and backend; needs matplotlib)")
    parser.add_argument("--markdown", action="store_true", help="print the table as markdown")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the page pools")
    parser.add_argument("--pdl-chain", action="store_true",
                        help="instead: CUDA graphs of page-table calls back to back and behind a producer kernel "
                             "(triggering its dependents or not), with and without enable_pdl, per backend "
                             "(skipped, with the reason, on a device without PDL)")


def default_cases(device: torch.device, quick: bool) -> list[Case]:
    if device.type == "cuda":
        names = case_set("GPU_QUICK") + case_set("GPU_REAL_QUICK") if quick else case_set("GPU") + case_set("GPU_REAL")
    else:
        names = case_set("CPU_QUICK" if quick else "CPU")
    return [Case.parse(name) for name in names]


def print_report(report: Report, markdown: bool) -> None:
    print("\n".join(header(report)), end="\n\n")
    print(table(report.rows, markdown), end="\n\n")
    print("\n".join(footer(report)))
