"""Property tests: every backend against ``kvdispatch.reference``, and the reference against the plain loops.

Hypothesis draws a case *spec* (shapes, page size, layouts, options, per-request hostile values, a seed for
the table's contents) and the test builds fresh tensors from it: random slot ids (sometimes negative, for
the floor division), poisoned outputs inside larger poisoned allocations, so every write outside the
contract's region shows. On failure Hypothesis shrinks and prints the minimal spec.

Profiles (``KVDISPATCH_FUZZ_PROFILE``): ``ci`` (default) is bounded so this file stays well under two minutes
on a 2-core machine with the Triton interpreter (without a GPU the default run draws a quarter of its examples,
the ``exhaustive`` cases, which the cpu-exhaustive CI lane runs, the rest); ``long`` runs 10,000 examples per
backend and op (for a GPU box; ``KVDISPATCH_FUZZ_EXAMPLES`` overrides the count, so that shards with different
``--hypothesis-seed`` values can share the work). Each test prints how many examples it ran (``-s`` shows it).
On a GPU, Triton and CuPy compile one kernel per page size and option set, so there page sizes come from a
fixed list; the interpreter and the other backends take any page size in [1, 4096].
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from conftest import BACKENDS, DEVICE, HAS_GPU, page_table, token_csr
from kvdispatch import ops
from kvdispatch import grid
from kvcases import POISON, Case, assert_same, loop_page_table, loop_token_csr, wrap_int32

PROFILE = os.environ.get("KVDISPATCH_FUZZ_PROFILE", "ci")
if PROFILE not in ("ci", "long"):
    raise ValueError(f"KVDISPATCH_FUZZ_PROFILE must be ci or long, got {PROFILE!r}")
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
# Examples per backend and op in the ci profile (the interpreter runs each Triton program in NumPy).
CI_EXAMPLES = {"triton": 100, "reference": 150}
CI_DEFAULT = 200
# The parts of a test's examples: "default" draws a quarter of the ci profile's, "exhaustive" the rest; "all"
# (on a GPU, in the long profile, or with the count given) all of them, in the default run.
SPLIT = PROFILE == "ci" and not HAS_GPU and "KVDISPATCH_FUZZ_EXAMPLES" not in os.environ
PARTS = ["default", pytest.param("exhaustive", marks=pytest.mark.exhaustive)] if SPLIT else ["all"]


def fuzz_settings(backend, part):
    examples = 10_000 if PROFILE == "long" else CI_EXAMPLES.get(backend, CI_DEFAULT)
    examples = int(os.environ.get("KVDISPATCH_FUZZ_EXAMPLES", examples))
    examples = {"all": examples, "default": examples // 4, "exhaustive": examples - examples // 4}[part]
    return settings(max_examples=examples, deadline=None, print_blob=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                           HealthCheck.data_too_large, HealthCheck.filter_too_much])


I32_MIN, I32_MAX = -(2**31), 2**31 - 1
I64_MIN, I64_MAX = -(2**63), 2**63 - 1
DTYPES = (torch.int32, torch.int64)
# Triton and CuPy compiled for a GPU: one specialisation per page size, so a fixed list with non-powers of two.
COMPILED_PAGE_SIZES = (1, 2, 3, 16, 64, 96, 100, 1000, 4096)


def page_sizes(backend):
    if (backend == "triton" and not INTERPRETED) or backend == "cupy":
        return st.sampled_from(COMPILED_PAGE_SIZES)
    return st.one_of(st.sampled_from((1, 2, 3, 7, 16, 64, 96, 100, 128, 1000, 4095, 4096)), st.integers(1, 4096))


@dataclasses.dataclass
class Spec:
    """Everything a case is made of; printed by Hypothesis for the minimal failing example."""

    op: str
    seed: int
    batch: int
    rows: int
    cols: int
    table_signed: bool          # slot ids include negative values (and int32 extremes)
    table_layout: tuple         # (column offset, padding): table = store[:, off:off + cols]
    pools: list
    lengths: list
    starts: list | None
    dtypes: tuple               # (pool, lens, start, indptr)
    page_size: int = 1
    width: int = 0
    out_layout: tuple = (0, 0, 0, 0)  # (row offset, column offset, padding, spare rows)
    seqlen_offset: int = 0
    fill_value: int | None = None
    seq_lens_out_extra: int | None = None  # None: no seq_lens_out; else its spare entries
    indptr: list | None = None
    out_len: int = 0


def _request_values(draw, batch, rows, cols, typical_len, margin, wide_pool, wide_len, wide_start, with_start):
    def pool():
        bad = [-1, rows, rows + 3, I32_MIN, I32_MAX] + ([2**40, -(2**40), I64_MIN, I64_MAX] if wide_pool else [])
        return draw(st.one_of(st.integers(0, rows - 1), st.integers(0, rows - 1), st.sampled_from(bad)))

    def length():
        bad = [0, -1, -typical_len - 1, cols, cols + 1, 3 * cols + 7, I32_MIN, I32_MAX]
        bad += [2**40, -(2**40), I64_MIN, I64_MIN + 1, I64_MAX] if wide_len else []
        return draw(st.one_of(st.integers(1, typical_len), st.integers(1, typical_len), st.sampled_from(bad)))

    def start():
        bad = [cols, cols + 1, -1, -2, I32_MIN, I32_MAX] + ([2**40, I64_MIN, I64_MAX] if wide_start else [])
        return draw(st.one_of(st.integers(0, margin), st.integers(0, margin), st.sampled_from(bad)))

    pools = [pool() for _ in range(batch)]
    lengths = [length() for _ in range(batch)]
    starts = [start() for _ in range(batch)] if with_start else None
    return pools, lengths, starts


@st.composite
def page_table_specs(draw, backend):
    page_size = draw(page_sizes(backend))
    per_program = grid.items_per_program(grid.PAGE_TABLE, page_size)
    batch = draw(st.integers(0, 8))
    # Pages per request: a few, or around one program's worth, so program boundaries are crossed.
    max_pages = draw(st.one_of(st.integers(1, 6), st.integers(per_program - 1, per_program + 2)))
    with_start = draw(st.booleans())
    margin = draw(st.integers(0, 2 * page_size)) if with_start else 0
    cols = max(1, max_pages * page_size + margin + draw(st.integers(-page_size, page_size)))
    rows = batch + draw(st.integers(1, 4))
    dtypes = tuple(draw(st.sampled_from(DTYPES)) for _ in range(4))
    pools, lengths, starts = _request_values(draw, batch, rows, cols, max_pages * page_size, margin,
                                             dtypes[0] == torch.int64, dtypes[1] == torch.int64,
                                             dtypes[2] == torch.int64, with_start)
    return Spec(
        op="page_table", seed=draw(st.integers(0, 2**32 - 1)), batch=batch, rows=rows, cols=cols,
        table_signed=draw(st.booleans()),
        table_layout=(draw(st.integers(0, 3)), draw(st.sampled_from((0, 0, 1, 5, 16)))),
        pools=pools, lengths=lengths, starts=starts, dtypes=dtypes, page_size=page_size,
        width=draw(st.integers(0, max_pages + 3)),
        out_layout=(draw(st.integers(0, 1)), draw(st.integers(0, 3)), draw(st.sampled_from((0, 0, 1, 4))),
                    draw(st.integers(0, 2))),
        seqlen_offset=draw(st.one_of(st.just(0), st.integers(-5, 5), st.sampled_from((I32_MIN, I32_MAX)))),
        fill_value=draw(st.one_of(st.none(), st.sampled_from((-1, 0, I32_MIN, I32_MAX)),
                                  st.integers(I32_MIN, I32_MAX))),
        seq_lens_out_extra=draw(st.one_of(st.none(), st.integers(0, 2))),
    )


@st.composite
def token_csr_specs(draw, backend):
    per_program = grid.items_per_program(grid.TOKEN_CSR)
    batch = draw(st.integers(0, 8))
    cols = draw(st.one_of(st.integers(1, 64), st.integers(per_program - 3, per_program + 3),
                          st.integers(1, 2 * per_program + 100)))
    with_start = draw(st.booleans())
    margin = draw(st.integers(0, cols)) if with_start else 0
    rows = batch + draw(st.integers(1, 4))
    dtypes = tuple(draw(st.sampled_from(DTYPES)) for _ in range(4))
    pools, lengths, starts = _request_values(draw, batch, rows, cols, cols, margin, dtypes[0] == torch.int64,
                                             dtypes[1] == torch.int64, dtypes[2] == torch.int64, with_start)
    # kv_indptr: packed rows with gaps (lengths clamped to what fits), then a few hostile entries.
    indptr, position = [], 0
    for length in lengths:
        indptr.append(position)
        position += min(max(length, 0), cols) + draw(st.integers(0, 3))
    indptr.append(position)
    out_len = draw(st.one_of(st.integers(position, position + 5), st.integers(0, position + 5)))
    bad = [out_len - 2, out_len, out_len + 1000, -4, I32_MIN, I32_MAX]
    bad += [2**40, -(2**40), I64_MIN, I64_MIN + out_len, I64_MAX] if dtypes[3] == torch.int64 else []
    for b in range(batch):
        if draw(st.integers(0, 5)) == 0:
            indptr[b] = draw(st.sampled_from(bad))
    indptr += [draw(st.integers(0, out_len + 5)) for _ in range(draw(st.integers(0, 2)))]  # extra entries
    return Spec(
        op="token_csr", seed=draw(st.integers(0, 2**32 - 1)), batch=batch, rows=rows, cols=cols,
        table_signed=draw(st.booleans()),
        table_layout=(draw(st.integers(0, 3)), draw(st.sampled_from((0, 0, 1, 5, 16)))),
        pools=pools, lengths=lengths, starts=starts, dtypes=dtypes, indptr=indptr, out_len=out_len,
        out_layout=(0, draw(st.integers(0, 3)), draw(st.integers(0, 3)), 0),
    )


# Minimal failing cases found by this file, always run first.
TOKEN_CSR_REGRESSIONS = [
    # kv_indptr[0] = -1 with a length-2 row and a 1-entry out: out[0] = table[0, 1] (the row's second token).
    Spec(op="token_csr", seed=0, batch=4, rows=5, cols=2, table_signed=False, table_layout=(0, 0),
         pools=[0, 0, 0, 0], lengths=[2, 1, 1, 1], starts=None, dtypes=(torch.int32,) * 4,
         indptr=[-1, 2, 3, 4, 5], out_len=1),
    Spec(op="token_csr", seed=1, batch=2, rows=3, cols=50, table_signed=True, table_layout=(1, 2),
         pools=[1, 2], lengths=[40, 5], starts=[3, 0], dtypes=(torch.int64, torch.int32, torch.int64, torch.int64),
         indptr=[-30, 4, 9], out_len=6, out_layout=(0, 1, 2, 0)),
]


@dataclasses.dataclass
class Built:
    case: Case
    out_store: torch.Tensor  # the whole poisoned allocation around out
    out: torch.Tensor
    seq_lens_out: torch.Tensor | None = None
    indptr: torch.Tensor | None = None
    # CPU copies of everything as built (inputs, and the poisoned out_store and seq_lens_out), separate from
    # the tensors the backend gets even on a CPU run: the reference runs on them, and they show whether the
    # backend wrote into an input.
    cpu: dict = dataclasses.field(default_factory=dict)


def _vector(values, dtype):
    return torch.tensor(values, dtype=torch.int64).to(dtype)


def _on(device, cpu_tensor):
    """``cpu_tensor`` on ``device``, never the same tensor object or storage."""
    return None if cpu_tensor is None else cpu_tensor.clone().to(device)


def build(spec: Spec, device) -> Built:
    g = torch.Generator().manual_seed(spec.seed)
    offset, pad = spec.table_layout
    if spec.table_signed:
        slots = torch.randint(I32_MIN, I32_MAX, (spec.rows, spec.cols), generator=g, dtype=torch.int64)
        slots.view(-1)[torch.randint(0, slots.numel(), (4,), generator=g)] = torch.tensor(
            [I32_MIN, I32_MAX, -1, -spec.page_size], dtype=torch.int64)
    else:
        slots = torch.randint(0, I32_MAX, (spec.rows, spec.cols), generator=g, dtype=torch.int64)
    store = torch.full((spec.rows, offset + spec.cols + pad), POISON, dtype=torch.int32)
    store[:, offset: offset + spec.cols] = slots.to(torch.int32)
    pool_dt, lens_dt, start_dt, indptr_dt = spec.dtypes
    cpu = dict(table=store[:, offset: offset + spec.cols], pool=_vector(spec.pools, pool_dt),
               lens=_vector(spec.lengths, lens_dt),
               start=None if spec.starts is None else _vector(spec.starts, start_dt),
               indptr=None if spec.indptr is None else _vector(spec.indptr, indptr_dt), seq_out=None)
    case = Case(req_to_token=_on(device, store)[:, offset: offset + spec.cols],
                req_pool_indices=_on(device, cpu["pool"]), seq_lens=_on(device, cpu["lens"]),
                page_size=spec.page_size, width=spec.width,
                kv_start_idx=_on(device, cpu["start"]), seqlen_offset=spec.seqlen_offset, fill_value=spec.fill_value)
    row0, col0, pad, spare = spec.out_layout
    if spec.op == "page_table":
        cpu["out_store"] = torch.full((row0 + spec.batch + spare, col0 + spec.width + pad), POISON, dtype=torch.int32)
        out_store = _on(device, cpu["out_store"])
        if spec.seq_lens_out_extra is not None:
            cpu["seq_out"] = torch.full((spec.batch + spec.seq_lens_out_extra,), POISON, dtype=torch.int32)
        return Built(case, out_store, out_store[row0:, col0: col0 + spec.width],
                     seq_lens_out=_on(device, cpu["seq_out"]), cpu=cpu)
    cpu["out_store"] = torch.full((col0 + spec.out_len + pad,), POISON, dtype=torch.int32)
    out_store = _on(device, cpu["out_store"])
    return Built(case, out_store, out_store[col0: col0 + spec.out_len], indptr=_on(device, cpu["indptr"]), cpu=cpu)


def expected_of(built: Built, spec: Spec):
    """The reference applied to the CPU copies of everything (the whole poisoned allocations included)."""
    cpu = built.cpu
    store = cpu["out_store"].clone()
    row0, col0, _, _ = spec.out_layout
    if spec.op == "page_table":
        seq_out = None if cpu["seq_out"] is None else cpu["seq_out"].clone()
        ops.page_table.reference(cpu["table"], cpu["pool"], cpu["lens"], store[row0:, col0: col0 + spec.width],
                                   spec.page_size, cpu["start"], spec.seqlen_offset, seq_out, spec.fill_value)
        return store, seq_out
    ops.token_csr.reference(cpu["table"], cpu["pool"], cpu["lens"], cpu["indptr"],
                                  store[col0: col0 + spec.out_len], cpu["start"])
    return store, None


def csr_rows_written(spec: Spec):
    """Per request, the ``(first target, first token, count)`` the contract writes (loop semantics)."""
    rows = []
    for b in range(spec.batch):
        pool, start = spec.pools[b], spec.starts[b] if spec.starts is not None else 0
        if not (0 <= pool < spec.rows and 0 <= start < spec.cols):
            continue
        count = min(max(spec.lengths[b], 0), spec.cols - start)
        begin = spec.indptr[b]
        first, last = max(0, -begin), min(count, spec.out_len - begin)
        if last > first:
            rows.append((b, begin + first, start + first, last - first))
    return rows


def settle_csr_overlaps(spec: Spec, table, actual, expected):
    """Where hostile ``kv_indptr`` entries make rows overlap, which row's write lands is undefined: there
    ``actual`` may hold any of the overlapping rows' values (checked), and ``expected`` takes it."""
    written = csr_rows_written(spec)
    coverage = torch.zeros(spec.out_len, dtype=torch.int32)
    for _, target, _, count in written:
        coverage[target: target + count] += 1
    contested = (coverage > 1).nonzero().flatten().tolist()
    if not contested:
        return expected
    expected = expected.clone()
    col0 = spec.out_layout[1]
    for position in contested:
        allowed = {int(table[spec.pools[b], token + position - target]) for b, target, token, count in written
                   if target <= position < target + count}
        value = int(actual[col0 + position])
        assert value in allowed, f"out[{position}] = {value}: not the value of any request writing there {allowed}"
        expected[col0 + position] = value
    return expected


def run_backend(backend, built: Built, spec: Spec):
    case = built.case
    if spec.op == "page_table":
        result = page_table(backend, case.req_to_token, case.req_pool_indices, case.seq_lens, built.out,
                            page_size=spec.page_size, kv_start_idx=case.kv_start_idx,
                            seqlen_offset=spec.seqlen_offset, seq_lens_out=built.seq_lens_out,
                            fill_value=spec.fill_value)
    else:
        result = token_csr(backend, case.req_to_token, case.req_pool_indices, case.seq_lens, built.indptr,
                           built.out, kv_start_idx=case.kv_start_idx)
    assert result is built.out


def check(backend, spec: Spec):
    built = build(spec, DEVICE)
    expected_store, expected_seq = expected_of(built, spec)
    run_backend(backend, built, spec)
    actual_store = built.out_store.cpu()
    if spec.op == "token_csr":
        expected_store = settle_csr_overlaps(spec, built.cpu["table"], actual_store, expected_store)
    assert_same(actual_store, expected_store, f"{backend} {spec.op} output (whole allocation)")
    if built.seq_lens_out is not None:
        assert_same(built.seq_lens_out, expected_seq, f"{backend} seq_lens_out")
    # The inputs are read-only.
    case = built.case
    for name, tensor in dict(table=case.req_to_token, pool=case.req_pool_indices, lens=case.seq_lens,
                             start=case.kv_start_idx, indptr=built.indptr).items():
        assert (tensor is None) == (built.cpu[name] is None), name
        assert tensor is None or torch.equal(tensor.cpu(), built.cpu[name]), f"{backend} wrote into {name}"


def fuzz(backend, part, op, specs, regressions=()):
    """``check`` over Hypothesis-drawn ``specs`` (the ``regressions`` first), then the count printed. In the
    long profile a line every 1,000 examples too: a run stopped by a timeout still shows how far it got."""
    count = 0

    def run(spec):
        nonlocal count
        count += 1
        if PROFILE == "long" and count % 1000 == 0:
            print(f"\nfuzz {backend} {op}: {count} examples so far", flush=True)
        check(backend, spec)

    for spec in regressions:
        run = example(spec=spec)(run)
    fuzz_settings(backend, part)(given(spec=specs)(run))()
    print(f"\nfuzz {backend} {op}: {count} examples, 0 failures")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("part", PARTS)
def test_page_table_matches_reference(backend, part):
    fuzz(backend, part, "page_table", page_table_specs(backend))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("part", PARTS)
def test_token_csr_matches_reference(backend, part):
    fuzz(backend, part, "token_csr", token_csr_specs(backend), TOKEN_CSR_REGRESSIONS)


@pytest.mark.parametrize("part", PARTS)
def test_reference_page_table_matches_loop(part):
    fuzz_settings("reference", part)(given(spec=page_table_specs("torch"))(reference_page_table_matches_loop))()


def reference_page_table_matches_loop(spec):
    built = build(spec, "cpu")
    case = built.case
    expected = loop_page_table(case, built.out)
    store_before = built.out_store.clone()
    ops.page_table.reference(case.req_to_token, case.req_pool_indices, case.seq_lens, built.out, spec.page_size,
                               case.kv_start_idx, spec.seqlen_offset, built.seq_lens_out, spec.fill_value)
    assert_same(built.out, expected, "reference page table vs loop")
    row0, col0, _, _ = spec.out_layout
    store_before[row0:, col0: col0 + spec.width] = expected
    assert_same(built.out_store, store_before, "reference page table: outside out")
    if built.seq_lens_out is not None:
        want = torch.full_like(built.seq_lens_out, POISON)
        want[: spec.batch] = torch.tensor([wrap_int32(n + spec.seqlen_offset) for n in spec.lengths],
                                          dtype=torch.int64).to(torch.int32)
        assert_same(built.seq_lens_out, want, "reference seq_lens_out")


@pytest.mark.parametrize("part", PARTS)
def test_reference_token_csr_matches_loop(part):
    run = given(spec=token_csr_specs("torch"))(reference_token_csr_matches_loop)
    for spec in TOKEN_CSR_REGRESSIONS:
        run = example(spec=spec)(run)
    fuzz_settings("reference", part)(run)()


def reference_token_csr_matches_loop(spec):
    built = build(spec, "cpu")
    case = built.case
    expected = loop_token_csr(case, built.indptr, built.out)
    store = built.out_store.clone()
    col0 = spec.out_layout[1]
    store[col0: col0 + spec.out_len] = expected
    ops.token_csr.reference(case.req_to_token, case.req_pool_indices, case.seq_lens, built.indptr, built.out,
                                  case.kv_start_idx)
    store = settle_csr_overlaps(spec, case.req_to_token, built.out_store, store)
    assert_same(built.out_store, store, "reference token CSR vs loop (whole allocation)")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["page_table", "token_csr"])
def test_noncontiguous_index_vectors(backend, op):
    """Index vectors that are views with a stride (e.g. ``x[::2]``): the validator accepts them, so every
    backend must either honour the stride or reject them with a ValueError; never silently misread them."""
    spec = Spec(op=op, seed=7, batch=4, rows=6, cols=64, table_signed=False, table_layout=(0, 0),
                pools=[4, 0, 5, 2], lengths=[64, 17, 3, 40], starts=[0, 5, 60, 9],
                dtypes=(torch.int32, torch.int64, torch.int32, torch.int32), page_size=4, width=17,
                indptr=[0, 70, 90, 100, 150], out_len=160)
    built = build(spec, DEVICE)
    expected_store, _ = expected_of(built, spec)
    case = built.case

    def strided(t):
        wide = torch.full((t.shape[0] * 2,), -999, dtype=t.dtype, device=t.device)
        wide[::2] = t
        return wide[::2]

    case.req_pool_indices, case.seq_lens = strided(case.req_pool_indices), strided(case.seq_lens)
    case.kv_start_idx = strided(case.kv_start_idx)
    if built.indptr is not None:
        built.indptr = strided(built.indptr)
    try:
        run_backend(backend, built, spec)
    except ValueError as exc:
        assert "contiguous" in str(exc) or "stride" in str(exc), exc
        return
    assert_same(built.out_store, expected_store, f"{backend} {op} with strided index vectors")
