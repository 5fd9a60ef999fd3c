"""Multi-step speculative draft decode indices (``kvdispatch.create_draft_decode_kv_indices``).

The torch reference against a plain loop over exact Python integers (``loop_draft_decode``), on random data drawn
fresh per case: branches, steps, page sizes (powers of two and not), windows, positions, v2p translation, int32 and
int64 outputs and index vectors, lengths and pool indices past the table (every backend against the reference on
random and hostile data, the argument dtypes, ranks and devices, ``torch.compile`` and opcheck:
tests/test_conformance.py). Then every backend under test on long prefixes, more steps than a slot block, long
batches, strided index vectors, nothing to do, the integer extremes of every argument and the v2p extremes, into
outputs in the middle of larger poisoned allocations, so that a write outside them (rows past the steps, columns
past the width) shows; the op's own argument errors, folded grids and SGLang's call patterns.
"""

import inspect
import itertools
import os

import pytest
import torch

from kvdispatch import ops
import kvdispatch
from conftest import BACKENDS, DEVICE
from kvcases import POISON, assert_same, wrap_int32
from kvdispatch import grid
from test_folded_grid import FOLD_AT, folding  # noqa: F401  (a fixture)
from test_extremes import DTYPES, I32_MAX, I32_MIN, I64_MAX, I64_MIN, extremes, guarded, middle, vector

LIMIT = grid.DRAFT_OFFSET_LIMIT
PAGE_SIZES = (1, 4, 16, 7)


def draft_decode(backend, *args, **kwargs):
    """``create_draft_decode_kv_indices`` on ``backend`` (``cupy-host``: the CUDA source built for the host)."""
    if backend.startswith("cupy-host"):
        import cuda_host

        return cuda_host.create_draft_decode_kv_indices(*args, specialised=backend.endswith("specialised"), **kwargs)
    return kvdispatch.create_draft_decode_kv_indices(*args, backend=None if backend == os.environ.get(
        "KVDISPATCH_BACKEND") else backend, **kwargs)


def generator():
    return torch.Generator().manual_seed(torch.seed() % 2**31)


def draw(low, high, count, g):
    return torch.randint(low, high, (count,), generator=g)


def as_dtype(value, dtype):
    """``value`` as ``dtype`` holds it: its low 32 or 64 bits."""
    return wrap_int32(value) if dtype == torch.int32 else (value + 2**63) % 2**64 - 2**63


def loop_draft_decode(case, out, indptr):
    """The contract as a plain loop over exact Python integers (independent of ``kvdispatch.reference``):
    fills CPU copies of ``out`` ``[rows, W]`` and ``indptr`` and returns them."""
    table = case["req_to_token"].tolist()
    rows, cols = case["req_to_token"].shape
    pool, lens = case["req_pool_indices"].tolist(), case["seq_lens"].tolist()
    steps, topk, page = case["num_steps"], case["topk"], case["page_size"]
    window, sink_size = case["window_size"], case["sink_size"]
    positions = None if case["positions"] is None else case["positions"].tolist()
    v2p = None if case["v2p"] is None else case["v2p"].tolist()
    out, indptr = out.clone(), indptr.clone()
    width = out.shape[1]
    prefix = [min(max(length, 0), window + sink_size) if window > 0 else max(length, 0) for length in lens]

    def value(x):
        if v2p is None:
            return x
        if x < 0 or x // page >= len(v2p) or v2p[x // page] < 0:
            return 0
        return v2p[x // page] * page + x % page

    def write(s, column, b, position):
        if column < width and 0 <= pool[b] < rows and 0 <= position < cols:
            out[s, column] = as_dtype(value(table[pool[b]][position]), out.dtype)

    for s in range(steps):
        it = s + 1
        offset = 0
        if case["write_indptr_start"] and lens:  # no segments: nothing is written
            indptr[s, 0] = 0
        for b, length in enumerate(lens):
            n = prefix[b]
            sink = min(sink_size, n) if window > 0 else n
            remainder = length - page * int(length / page) if case["round_toward_zero"] else length % page
            if abs(length) >= 2**53:  # int() of a float is inexact there; such a start is never read anyway
                remainder = length % page
            owned = -(-(remainder + steps) // page) * page
            for k in range(topk):
                z = b * topk + k
                for i in range(min(n, max(width - offset, 0))):
                    write(s, offset + i, b, i if i < sink else length - n + i)
                for j in range(it):
                    write(s, offset + n + j, b, length + k * owned + j)
                offset += n + it
                if positions is None:
                    indptr[s, z + 1] = as_dtype(min(offset, LIMIT), indptr.dtype)
                else:
                    cap = window + sink_size if window > 0 else LIMIT
                    counted = sum(min(max(p, 0), cap) for p in positions[: z + 1])
                    indptr[s, z + 1] = as_dtype(min(counted + (z + 1) * it, LIMIT), indptr.dtype)
    return out, indptr


def random_case(g, index_dtype=torch.int32, page_size=1, topk=None, steps=None, window=False, positions=False,
                v2p=None, bad=False):
    """A few requests over a random table; with ``bad``, lengths past the table or negative, pool indices
    outside it, now and then."""
    rows, cols = int(draw(2, 6, 1, g)), int(draw(1, 40, 1, g))
    batch = int(draw(1, 5, 1, g))
    topk = topk or int(draw(1, 4, 1, g))
    steps = steps or int(draw(1, 5, 1, g))
    table = draw(-3, 5000, rows * cols, g).view(rows, cols).to(torch.int32)
    lens = draw(1, cols + 1, batch, g) if not bad else draw(-3, cols + 10, batch, g)
    pool = draw(0, rows, batch, g) if not bad else draw(-1, rows + 1, batch, g)
    if positions:
        given = lens.repeat_interleave(topk) + (draw(-2, 3, batch * topk, g) if bad else 0)
    case = dict(req_to_token=table, req_pool_indices=pool.to(index_dtype), seq_lens=lens.to(index_dtype),
                num_steps=steps, topk=topk, page_size=page_size,
                positions=given.to(index_dtype) if positions else None,
                window_size=int(draw(1, 6, 1, g)) if window else 0, sink_size=int(draw(0, 4, 1, g)) if window else 0,
                v2p=None, write_indptr_start=bool(draw(0, 2, 1, g)), round_toward_zero=bool(draw(0, 2, 1, g)))
    if v2p is not None:
        pages = 5000 // page_size + 2
        size = int(draw(1, pages + 3, 1, g))
        case["v2p"] = draw(-2, 10**6, size, g).to(v2p)
    return case


def used_width(case):
    """The longest step row's used length (exact), for choosing out's width."""
    cap = case["window_size"] + case["sink_size"] if case["window_size"] > 0 else None
    counts = [max(int(n), 0) if cap is None else min(max(int(n), 0), cap) for n in case["seq_lens"]]
    return case["topk"] * sum(counts) + len(counts) * case["topk"] * case["num_steps"]


def same_strides(t):
    """A copy of ``t`` on DEVICE with ``t``'s strides (a view with gaps keeps them)."""
    copy = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=DEVICE)
    return copy.copy_(t)


def check(backend, case, out_dtype=torch.int32, indptr_dtype=torch.int32, width=None, extra_rows=1, extra_cols=2,
          loop=True):
    """``case`` (CPU tensors) through ``backend`` into guarded outputs, against the reference (and the loop);
    ``backend`` None: the reference against the loop only."""
    steps, segments = case["num_steps"], case["req_pool_indices"].shape[0] * case["topk"]
    width = used_width(case) if width is None else width
    out_shape, indptr_shape = (steps + extra_rows, width), (steps + extra_rows, segments + 1 + extra_cols)
    store, _ = guarded(out_shape, out_dtype)
    indptr_store, _ = guarded(indptr_shape, indptr_dtype)
    expected, expected_indptr = store.cpu().clone(), indptr_store.cpu().clone()
    options = {k: v for k, v in case.items() if k not in ("req_to_token", "req_pool_indices", "seq_lens")}
    tensors = (case["req_to_token"], case["req_pool_indices"], case["seq_lens"])
    ops.draft_decode.reference(*tensors, middle(expected_indptr, indptr_shape), middle(expected, out_shape),
                                         **options)
    if loop:
        looped, looped_indptr = loop_draft_decode(case, middle(store, out_shape).cpu(),
                                                  middle(indptr_store, indptr_shape).cpu())
        assert_same(middle(expected, out_shape), looped, "reference out vs loop")
        assert_same(middle(expected_indptr, indptr_shape), looped_indptr, "reference kv_indptr vs loop")
    if backend is None:
        return

    on_device = {k: (same_strides(v) if isinstance(v, torch.Tensor) else v) for k, v in options.items()}
    draft_decode(backend, *(same_strides(t) for t in tensors), middle(indptr_store, indptr_shape),
                 middle(store, out_shape), **on_device)
    assert_same(indptr_store, expected_indptr, f"{backend} kv_indptr (whole allocation)")
    assert_same(store, expected, f"{backend} out (whole allocation)")


# -- random data ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("out_dtype", DTYPES)
def test_reference_matches_the_loop(page_size, out_dtype):
    g = generator()
    for index_dtype, bad in itertools.product(DTYPES, (False, True)):
        case = random_case(g, index_dtype, page_size, bad=bad)
        check(None, case, out_dtype, index_dtype)


@pytest.mark.parametrize("option", ("window", "positions", "v2p-int64", "v2p-int32", "narrow-out", "all"))
def test_reference_with_options_matches_the_loop(option):
    g = generator()
    for page_size, bad in ((1, False), (16, True), (7, True)):
        v2p = {"v2p-int64": torch.int64, "v2p-int32": torch.int32, "all": torch.int64}.get(option)
        case = random_case(g, torch.int64, page_size, window=option in ("window", "all"),
                           positions=option in ("positions", "all"), v2p=v2p, bad=bad)
        width = used_width(case) // 2 if option in ("narrow-out", "all") else None
        check(None, case, torch.int64, torch.int32, width=width)


@pytest.mark.parametrize("backend", BACKENDS)
def test_prefixes_spanning_several_programs(backend):
    """Prefixes longer than a program's tokens, with a window, topk 2 and 3 steps (one loop-free check)."""
    g = generator()
    tokens = grid.items_per_program(grid.DRAFT_DECODE)
    cols = tokens + 300
    table = draw(0, 2**31 - 1, 3 * cols, g).view(3, cols).to(torch.int32)
    for window in (0, tokens + 5):
        case = dict(req_to_token=table, req_pool_indices=vector([2, 0], torch.int32),
                    seq_lens=vector([cols - 7, tokens + 1], torch.int64), num_steps=3, topk=2, page_size=1,
                    positions=None, window_size=window, sink_size=3 if window else 0, v2p=None,
                    write_indptr_start=True, round_toward_zero=False)
        check(backend, case, torch.int32, torch.int64, loop=False)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("steps", (16, 17, 40))
def test_more_draft_steps_than_one_slot_block(backend, steps):
    """More steps than the Triton kernel's slot block (16): the later draft slots come in further passes."""
    g = generator()
    for page_size, topk in ((1, 2), (16, 3)):
        check(backend, random_case(g, page_size=page_size, topk=topk, steps=steps, positions=page_size == 1))


@pytest.mark.representative()
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_long_batches_and_strided_index_vectors(backend, dtype):
    """Batches whose offsets and ``kv_indptr`` sum more earlier lengths and positions than a kernel reads in
    one pass (16), with extremes among them, a window or none, and the index vectors as views with a stride
    (``x[::2]``) or contiguous."""
    g = generator()
    extreme = vector(extremes(dtype, 4, 20, LIMIT), torch.int64)
    for strided, window in itertools.product((False, True), (False, True)):
        case = random_case(g, dtype, page_size=int(draw(1, 3, 1, g)) * 4 - 3, topk=int(draw(1, 4, 1, g)), steps=2,
                           window=window, positions=True)
        rows, cols = case["req_to_token"].shape
        batch = int(draw(17, 70, 1, g))
        lens = draw(-2, cols + 3, batch, g)
        lens[draw(0, batch, 3, g)] = extreme[draw(0, extreme.shape[0], 3, g)]
        given = lens.repeat_interleave(case["topk"])
        given[draw(0, given.shape[0], 5, g)] = extreme[draw(0, extreme.shape[0], 5, g)]
        vectors = {"req_pool_indices": draw(0, rows, batch, g), "seq_lens": lens, "positions": given}
        for name, values in vectors.items():
            values = values.to(dtype)
            if strided:
                spread = torch.full((2 * values.shape[0],), POISON, dtype=dtype)
                spread[::2] = values
                values = spread[::2]
            case[name] = values
        check(backend, case, torch.int64, dtype, width=2 * cols * batch * case["topk"] + 8, loop=False)


@pytest.mark.parametrize("backend", BACKENDS)
def test_nothing_to_do(backend):
    """No steps, no requests, a zero-width out: nothing written (the guard shows it)."""
    g = generator()
    for steps, batch, width in ((0, 2, 10), (2, 0, 10), (2, 2, 0)):
        case = random_case(g, steps=2)
        case["num_steps"] = steps
        case["req_pool_indices"], case["seq_lens"] = case["req_pool_indices"][:batch], case["seq_lens"][:batch]
        check(backend, case, width=width)


# -- integer extremes ------------------------------------------------------------------------------------------

@pytest.mark.representative("argument")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("argument", ("lens", "pool", "positions"))
@pytest.mark.parametrize("dtype", DTYPES)
def test_extremes(backend, argument, dtype):
    """One request per extreme value of ``argument`` next to valid ones: offsets saturate, nothing wraps, nothing
    outside the table is read."""
    g = generator()
    rows, cols = 4, 20
    values = extremes(dtype, rows, cols, LIMIT)
    for first in range(0, len(values), 6):
        chunk = values[first: first + 6]
        batch = len(chunk) + 1
        case = random_case(g, dtype, page_size=int(draw(1, 3, 1, g)) * 4 - 3, topk=2, steps=3,
                           positions=argument == "positions")
        case["req_to_token"] = draw(I32_MIN, I32_MAX, rows * cols, g).view(rows, cols).to(torch.int32)
        pool, lens = draw(0, rows, batch, g), draw(1, cols + 1, batch, g)
        if argument == "lens":
            lens[1:] = vector(chunk, torch.int64)
        elif argument == "pool":
            pool[1:] = vector(chunk, torch.int64)
        case["req_pool_indices"], case["seq_lens"] = pool.to(dtype), lens.to(dtype)
        if argument == "positions":
            given = lens.repeat_interleave(2)
            given[2::2] = vector(chunk, torch.int64)
            case["positions"] = given.to(dtype)
        check(backend, case, torch.int64, dtype, width=2 * cols * batch + 8)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("out_dtype", DTYPES)
def test_v2p_at_the_extremes(backend, out_dtype):
    """Table values and v2p entries at the int32/int64 limits: 0 for negatives and pages past v2p, the low bits of
    the exact value otherwise."""
    page = 16
    table = vector([0, -1, I32_MAX, I32_MIN, 15, 16, 17, 5 * page - 1, 5 * page, 3 * page + 2], torch.int64)
    table = table.to(torch.int32).view(1, -1)
    v2p = vector([I64_MAX, I64_MIN, -1, 2**59 + 3, 7], torch.int64)
    case = dict(req_to_token=table, req_pool_indices=vector([0], torch.int32), seq_lens=vector([7], torch.int32),
                num_steps=3, topk=1, page_size=page, positions=None, window_size=0, sink_size=0, v2p=v2p,
                write_indptr_start=True, round_toward_zero=False)
    check(backend, case, out_dtype, torch.int64)
    case["v2p"] = vector([I32_MAX, I32_MIN, -1, 3], torch.int32)
    check(backend, case, out_dtype, torch.int32)


# -- argument errors -------------------------------------------------------------------------------------------

def _valid_arguments():
    table = torch.zeros((3, 8), dtype=torch.int32)
    vec = torch.zeros(2, dtype=torch.int32)
    return [table, vec, vec.clone(), torch.zeros((2, 5), dtype=torch.int32), torch.zeros((2, 16), dtype=torch.int64)], \
        dict(num_steps=2, topk=2)


@pytest.mark.parametrize("change, error, words", [
    ({"num_steps": 3}, ValueError, "out must have at least 3 rows"),
    ({"num_steps": 1025}, ValueError, "num_steps"),
    ({"topk": 0}, ValueError, "topk"),
    ({"topk": 3}, ValueError, "kv_indptr must have at least 7 columns"),
    ({"page_size": 0}, ValueError, "page_size"),
    ({"window_size": -1}, ValueError, "window_size"),
    ({"sink_size": 2**31}, ValueError, "sink_size"),
    ({"write_indptr_start": 1}, TypeError, "write_indptr_start"),
    ({"round_toward_zero": None}, TypeError, "round_toward_zero"),
    ({"positions": torch.zeros(3, dtype=torch.int32)}, ValueError, "positions must have at least 4"),
    ({"v2p": torch.zeros((2, 2), dtype=torch.int64)}, ValueError, "v2p must be 1-D"),
    ({"v2p": torch.zeros(8, dtype=torch.int64)[::2]}, ValueError, "v2p must be contiguous"),
    ({4: torch.zeros((2, 16), dtype=torch.int64).t().contiguous().t()}, ValueError, "out must have a contiguous"),
    ({4: torch.zeros(40, dtype=torch.int64).as_strided((2, 16), (8, 1))}, ValueError, "rows of out share memory"),
    ({2: torch.zeros(3, dtype=torch.int32)}, ValueError, "seq_lens must have 2"),
])
def test_argument_errors(change, error, words):
    args, options = _valid_arguments()
    for key, value in change.items():
        if isinstance(key, int):
            args[key] = value
        else:
            options[key] = value
    before = [a.clone() for a in args[3:]]
    with pytest.raises(error, match=words):
        kvdispatch.create_draft_decode_kv_indices(*args, **options, backend="torch")
    for a, b in zip(args[3:], before):
        assert torch.equal(a, b)


def test_outputs_must_not_overlap():
    args, options = _valid_arguments()
    buffer = torch.zeros(64, dtype=torch.int32)
    args[3] = buffer[:10].view(2, 5)
    args[4] = buffer[8:40].view(torch.int64).view(2, 8)
    with pytest.raises(ValueError, match="kv_indptr shares memory with out"):
        kvdispatch.create_draft_decode_kv_indices(*args, **options, backend="torch")
    args, options = _valid_arguments()
    args[4] = args[0].view(torch.int64).view(3, 4)[:2]
    args[4] = torch.zeros((2, 16), dtype=torch.int64)
    options["positions"] = args[4].view(-1)[:4]
    with pytest.raises(ValueError, match="out shares memory with positions"):
        kvdispatch.create_draft_decode_kv_indices(*args, **options, backend="torch")


# -- launch geometry -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.usefixtures("folding")
def test_rows_folded_into_the_third_grid_dimension(backend):
    """Prefixes of more programs than the (lowered) second grid dimension takes."""
    g = generator()
    cols = (FOLD_AT + 1) * grid.items_per_program(grid.DRAFT_DECODE) + 50
    table = draw(0, 2**31 - 1, 2 * cols, g).view(2, cols).to(torch.int32)
    case = dict(req_to_token=table, req_pool_indices=vector([1, 0], torch.int64),
                seq_lens=vector([cols - 3, 700], torch.int32), num_steps=2, topk=2, page_size=1, positions=None,
                window_size=0, sink_size=0, v2p=None, write_indptr_start=True, round_toward_zero=False)
    check(backend, case, torch.int64, torch.int32, loop=False)


@pytest.mark.skipif("triton" not in BACKENDS, reason="Triton is not under test")
def test_triton_compiles_once_across_batches_widths_steps_and_branches():
    from kernels_triton import draft_decode as triton_draft_decode
    from kernels_triton import launch as triton_launch

    triton_launch.reset(compiled=True)
    g = generator()
    for topk, steps, batch, cols in ((1, 1, 1, 5), (4, 3, 3, 17), (2, 5, 2, 40)):
        case = random_case(g, topk=topk, steps=steps, page_size=16)
        case["req_to_token"] = case["req_to_token"][:, :1].expand(-1, cols).contiguous()
        check("triton", case, torch.int64, torch.int32, width=int(draw(1, 90, 1, g)), loop=False)
    assert triton_draft_decode.launcher.compile_count == 1


# -- kvdispatch.compat.sglang: generate_draft_decode_kv_indices on SGLang's call patterns ------------------------

def _next_power_of_2(n):
    return 1 << max(n - 1, 0).bit_length()


@pytest.fixture
def sglang(monkeypatch, backend):
    """``kvdispatch.compat.sglang`` with its draft builder routed to ``backend``."""
    from kvdispatch.compat import sglang as module
    from kvdispatch.compat.sglang import _common

    monkeypatch.setattr(_common, "_build_draft_decode", lambda *a, backend=None, **k: draft_decode(name, *a, **k))
    name = backend
    return module


def sglang_case(g, topk, page_size, steps):
    """A batch as SGLang's draft workers hold it: int64 pool indices and lengths with room in each table row
    for every branch's draft pages, positions the lengths repeated ``topk`` times."""
    batch = int(draw(1, 5, 1, g))
    pool_rows = batch + 3
    owned = -(-(page_size - 1 + steps) // page_size) * page_size
    cols = 48 + topk * owned + page_size
    table = torch.randperm(pool_rows * cols * 2, generator=g)[: pool_rows * cols].view(pool_rows, cols).to(torch.int32)
    lens = draw(1, cols - topk * owned - page_size + 1, batch, g)
    return dict(req_to_token=table, req_pool_indices=torch.randperm(pool_rows, generator=g)[:batch],
                seq_lens=lens, num_steps=steps, topk=topk, page_size=page_size,
                positions=lens.repeat_interleave(topk), window_size=0, sink_size=0, v2p=None,
                write_indptr_start=False, round_toward_zero=True), pool_rows


def run_sglang(sglang, case, pool_rows, engine, *window, **keywords):
    """``generate_draft_decode_kv_indices[grid](...)`` as ``engine``'s multi-step draft backend launches it, into
    zeroed buffers (``window``: ``window_size, sink_size`` passed positionally after ``page_size``, as SGLang's
    Triton and FlashInfer backends pass them); returns ``(kv_indices, kv_indptr)`` and checks them against the
    loop."""
    table, batch, topk, steps = case["req_to_token"], case["seq_lens"].shape[0], case["topk"], case["num_steps"]
    width = sglang.draft_kv_indices_buffer_width(batch, topk, table.shape[1])
    kv_indices = torch.zeros((steps, width), dtype=torch.int64 if engine == "triton" else torch.int32, device=DEVICE)
    kv_indptr = torch.zeros((steps, pool_rows * topk + 1), dtype=torch.int32, device=DEVICE)
    if engine == "aiter":  # token blocks, NUM_STEPS
        blocks = sglang.kv_indices_num_token_blocks(table.shape[1], steps * batch * topk)
        launch, keywords = (steps * blocks, batch, topk), dict(keywords, NUM_STEPS=steps)
    else:
        launch = (steps, batch, topk)
    expected, expected_indptr = loop_draft_decode(case, kv_indices.cpu(), kv_indptr.cpu())
    on = {k: case[k].to(DEVICE) for k in ("req_pool_indices", "req_to_token", "seq_lens", "positions")}
    result = sglang.generate_draft_decode_kv_indices[launch](
        on["req_pool_indices"], on["req_to_token"], on["seq_lens"], kv_indices, kv_indptr, on["positions"],
        table.shape[1], width, kv_indptr.shape[1], _next_power_of_2(batch), _next_power_of_2(steps),
        _next_power_of_2(batch * topk), case["page_size"], *window, **keywords)
    assert result is kv_indices
    assert_same(kv_indices, expected, f"{engine} kv_indices")
    assert_same(kv_indptr, expected_indptr, f"{engine} kv_indptr")
    return kv_indices.cpu(), kv_indptr.cpu()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("engine", ("triton", "flashinfer", "aiter"))
@pytest.mark.parametrize("topk, page_size", ((1, 1), (4, 1), (4, 16)))
def test_sglang_call_patterns(sglang, backend, engine, topk, page_size):
    g = generator()
    steps = int(draw(2, 6, 1, g))
    case, pool_rows = sglang_case(g, topk, page_size, steps)
    kv_indices, kv_indptr = run_sglang(sglang, case, pool_rows, engine)
    batch, lens_sum = case["seq_lens"].shape[0], int(case["seq_lens"].sum())
    for s in range(steps):  # each step's used length, as the engines slice it
        used = sglang.draft_kv_indices_used_len(lens_sum, topk, batch * topk, s + 1)
        assert int(kv_indptr[s, batch * topk]) == used and int(kv_indptr[s, 0]) == 0
        assert not kv_indices[s, used:].any()


@pytest.mark.parametrize("backend", BACKENDS)
def test_sglang_window_and_translation(sglang, backend):
    """The keywords of the newest call sites: a draft-only sliding window, and ids translated through v2p."""
    g = generator()
    case, pool_rows = sglang_case(g, 2, 16, 3)
    case.update(window_size=5, sink_size=2, v2p=draw(-1, 500, 60, g))
    run_sglang(sglang, case, pool_rows, "aiter", window_size=5, sink_size=2, v2p=case["v2p"].to(DEVICE),
               TRANSLATE=True)
    run_sglang(sglang, case, pool_rows, "flashinfer", 5, 2, v2p=case["v2p"].to(DEVICE), TRANSLATE=True)
    case["v2p"] = None  # given without TRANSLATE, v2p is not used
    run_sglang(sglang, case, pool_rows, "triton", window_size=5, sink_size=2, v2p=torch.zeros(3, dtype=torch.int64,
                                                                                              device=DEVICE))


def test_sglang_surface():
    from kvdispatch.compat import sglang

    def parameters(function):
        return [(p.name, p.default) for p in inspect.signature(function).parameters.values()]

    positional = ["req_pool_indices", "req_to_token", "paged_kernel_lens", "kv_indices", "kv_indptr", "positions",
                  "row_stride", "kv_indices_stride", "kv_indptr_stride", "bs_upper", "iter_upper", "num_tokens_upper",
                  "page_size"]
    expected = [(name, inspect.Parameter.empty) for name in positional] + [
        ("window_size", 0), ("sink_size", 0), ("NUM_STEPS", 0), ("ENTRY_PAGE_SIZE", 1), ("v2p", None),
        ("TRANSLATE", False)]
    for function in (sglang.generate_draft_decode_kv_indices, sglang.generate_draft_decode_kv_indices[(2, 1, 1)]):
        assert parameters(function) == expected
    assert parameters(sglang.draft_kv_indices_buffer_width) == [
        ("num_seqs", inspect.Parameter.empty), ("topk", inspect.Parameter.empty),
        ("max_context_len", inspect.Parameter.empty)]
    assert parameters(sglang.draft_kv_indices_used_len) == [
        (name, inspect.Parameter.empty) for name in ("seq_lens_sum", "topk", "bs", "num_steps")]
    assert sglang.draft_kv_indices_buffer_width(8, 4, 4096) == 8 * 4 * 4096
    with pytest.raises(ValueError, match="overflow"):
        sglang.draft_kv_indices_buffer_width(2**10, 2**11, 2**10)
    assert sglang.draft_kv_indices_used_len(100, 4, 12, 3) == 436

    table = torch.zeros((2, 8), dtype=torch.int32)
    vec, out, indptr = torch.zeros(1, dtype=torch.int64), torch.zeros((2, 8), dtype=torch.int64), \
        torch.zeros((2, 2), dtype=torch.int32)
    args = (vec, table, vec + 1, out, indptr, vec + 1, 8, 8, 2, 1, 2, 1, 1)
    with pytest.raises(TypeError, match="launch grid"):
        sglang.generate_draft_decode_kv_indices(*args)
    with pytest.raises(ValueError, match="ENTRY_PAGE_SIZE"):
        sglang.generate_draft_decode_kv_indices[(2, 1, 1)](*args, ENTRY_PAGE_SIZE=0)
    with pytest.raises(ValueError, match="row_stride=9 does not match"):
        sglang.generate_draft_decode_kv_indices[(2, 1, 1)](*args[:6], 9, *args[7:])
    with pytest.raises(ValueError, match="kv_indptr_stride=3 does not match"):
        sglang.generate_draft_decode_kv_indices[(2, 1, 1)](*args[:8], 3, *args[9:])
