"""The CUDA/HIP source built for the host on bounded grids: a row's programs stride over its blocks.

With a program budget of a few programs per row (``kvdispatch.grid``), each program of every kernel handles
several blocks of its row (k, k + T, ...); on a folded grid T counts the blocks of the last slice too. Every op
is checked against the torch reference on outputs that are views inside larger poisoned buffers, with rows of
mixed lengths (past the width, empty, negative, unreadable, partial), then the same call (its geometry computed
once, as a captured graph replays it) on rows grown to the full width and shrunk, in the same buffers.
"""

from __future__ import annotations

import pytest
import torch

import cuda_host as host
from kernels_cupy import launch
from kvcases import POISON, assert_same
from kvdispatch import ops
from kvdispatch import devices, grid
from test_cupy_host import BUILDS, _host_library  # noqa: F401  (a fixture)

BATCH = 5
# Programs per row, and the grid's second dimension where it folds (None: as usual): with 3 programs folded
# at 2 the grid is (rows, 2, 2), so T = 4 and program 3 lies in the last slice.
BOUNDS = pytest.mark.parametrize("bounded", [(1, None), (2, None), (3, 2)], indirect=True,
                                 ids=("1-program", "2-programs", "folded"))
# The default run keeps every op under every bound in both builds; the other variants run in the exhaustive lane.
EACH_BOUND_AND_BUILD = pytest.mark.representative("bounded", "specialised")
BLOCKS = 5  # the longest rows have this many blocks, and a few items more


@pytest.fixture
def bounded(request, monkeypatch):
    """A function of the grid's rows that sets the program budget to the programs per row of the test's
    parameter; returns those programs. Geometry computed under another budget is forgotten."""
    programs, fold_at = request.param
    if fold_at is not None:
        monkeypatch.setattr(grid, "MAX_GRID_Y", fold_at)

    def limit(rows: int) -> int:
        monkeypatch.setattr(grid, "program_budget", lambda multiprocessors: programs * rows)
        launch.forget_geometry()
        return programs

    yield limit
    launch.forget_geometry()


def _guarded(*shape, dtype=torch.int32):
    """``(store, index)``: a poisoned buffer with two spare entries on each side of every dimension, and the
    index of the view of ``shape`` in its middle (last dimension contiguous, rows not 16-byte aligned)."""
    store = torch.full(tuple(n + 4 for n in shape), POISON, dtype=dtype)
    return store, tuple(slice(2, 2 + n) for n in shape)


def _table(rows, cols, generator, low=-3):
    return torch.randint(low, 50_000, (rows, cols), generator=generator, dtype=torch.int32)


def _check_bounded(call, programs, items, longest):
    """The call's grid gives each row ``programs`` (the folded grid: its slices' blocks), fewer than the longest
    row's blocks, so every program loops."""
    assert call is not None
    launched = call.grid[1] * call.grid[2]
    assert launched == (4 if programs == 3 else programs), call.grid
    assert -(-longest // items) > launched


def _replayed(call, specialised, outputs, run_reference, scenarios, what):
    """For each scenario (a function writing new lengths into the call's tensors in place): poison the
    ``outputs`` (``_guarded`` pairs), run ``call`` as it was built, and compare each buffer with
    ``run_reference`` (a function of the output views) run on poisoned copies."""
    for name, scenario in scenarios:
        scenario()
        for store, _ in outputs:
            store.fill_(POISON)
        expected = [store.clone() for store, _ in outputs]
        run_reference(*(copy[index] for copy, (_, index) in zip(expected, outputs)))
        host.run(call, specialised)
        for number, ((store, _), want) in enumerate(zip(outputs, expected)):
            assert_same(store, want, f"{what}, {name} rows, output {number}")


def _lengths_scenarios(lengths, full, generator, fit=None):
    """Scenarios for a length vector: mixed, every row past ``full``, short rows, random rows; ``fit`` (if
    given) runs after each to update what follows from the lengths (a CSR's offsets)."""

    def writes(values):
        def scenario():
            lengths.copy_(torch.tensor(values, dtype=lengths.dtype))
            if fit is not None:
                fit()

        return scenario

    random_rows = torch.randint(-2, full + 3, (BATCH,), generator=generator).tolist()
    return [("mixed", writes([full + 9, 0, -3, full // 2 + 1, full - 1])),
            ("longer", writes([full + 9] * BATCH)),
            ("shorter", writes([1, 2, 0, 3, 1])),
            ("random", writes(random_rows))]


def _pool(rows):
    """Pool indices of the batch, the fourth outside the table (an unreadable row)."""
    return torch.tensor([2, 0, 3, rows, 1])


@BOUNDS
@BUILDS
@EACH_BOUND_AND_BUILD
@pytest.mark.parametrize("page_size", (1, 16))
@pytest.mark.parametrize("option", ("fill", "start", "round"))
def test_page_table(bounded, specialised, page_size, option):
    g = torch.Generator().manual_seed(page_size * 7 + len(option))
    programs = bounded(BATCH)
    items = grid.items_per_program(grid.PAGE_TABLE, page_size)
    width = BLOCKS * items + 3
    table = _table(BATCH + 1, width * page_size + 11, g)
    pool, lengths = _pool(BATCH + 1), torch.zeros(BATCH, dtype=torch.int64)
    start = torch.tensor([0, 3, 1, 0, 9]) if option == "start" else None
    offset = 5 if option == "start" else 0
    fill = -7 if option == "fill" else None
    outputs = [_guarded(BATCH + 1, width), _guarded(BATCH + 2)]
    (out, out_index), (lens_out, lens_index) = outputs
    args = (table, pool, lengths, out[out_index], page_size, start, offset, lens_out[lens_index], fill,
            option == "round")
    call = launch.page_table_call(*args)
    _check_bounded(call, programs, items, width)
    _replayed(call, specialised, outputs,
              lambda o, s: ops.page_table.reference(table, pool, lengths, o, page_size, start, offset, s, fill,
                                                      option == "round"),
              _lengths_scenarios(lengths, width * page_size, g), "page table")


def _packed(lengths, offsets, gap=3):
    """Write into ``offsets`` (``[B + 1]``) the CSR offsets of ``lengths`` with gaps, the first row starting
    before out (its first tokens skipped)."""

    def fit():
        counts = lengths.clamp(min=0)
        ends = torch.cumsum(counts + gap, 0) - 40
        offsets.copy_(torch.cat([ends[:1] - counts[:1] - gap, ends - gap]).to(offsets.dtype))

    return fit


@BOUNDS
@BUILDS
@EACH_BOUND_AND_BUILD
@pytest.mark.parametrize("variant", ("copy", "entry-pages", "mapped-int64"))
def test_token_csr(bounded, specialised, variant):
    g = torch.Generator().manual_seed(len(variant))
    programs = bounded(BATCH)
    items = grid.items_per_program(grid.TOKEN_CSR)
    entry = 4 if variant == "entry-pages" else 1
    positions = BLOCKS * items + 20
    table = _table(BATCH + 1, positions // entry + 1, g, low=0)
    pool, lengths = _pool(BATCH + 1), torch.zeros(BATCH, dtype=torch.int32)
    start = torch.tensor([0, 5, 2, 0, 7])
    indptr = torch.zeros(BATCH + 1, dtype=torch.int64)
    mapping = torch.randint(-5, 2**40, (60_000,), generator=g) if variant == "mapped-int64" else None
    dtype = torch.int64 if variant == "mapped-int64" else torch.int32
    outputs = [_guarded(BATCH * (positions + 3), dtype=dtype)]
    (out, index), = outputs
    fit = _packed(lengths, indptr)
    fit()
    call = launch.token_csr_call(table, pool, lengths, indptr, out[index], start, entry, mapping)
    _check_bounded(call, programs, items, positions)
    _replayed(call, specialised, outputs,
              lambda o: ops.token_csr.reference(table, pool, lengths, indptr, o, start, entry, mapping),
              _lengths_scenarios(lengths, positions, g, fit), f"token CSR ({variant})")


@BOUNDS
@BUILDS
@EACH_BOUND_AND_BUILD
@pytest.mark.parametrize("swa_width", (0, 2, 9))
def test_mha_page_table(bounded, specialised, swa_width):
    """The SWA twin narrower and wider than the page table (in blocks); 0: no twin."""
    g = torch.Generator().manual_seed(swa_width)
    programs = bounded(BATCH)
    page_size = 16
    items = grid.items_per_program(grid.MAPPED_PAGE_TABLE, page_size)
    width = BLOCKS * items + 3 if swa_width != 9 else 2 * items + 1
    twin = {0: 0, 2: 2 * items + 5, 9: BLOCKS * items + 9}[swa_width]
    table = _table(BATCH + 1, max(width, twin) * page_size + 7, g)
    pool, lengths = _pool(BATCH + 1), torch.zeros(BATCH, dtype=torch.int64)
    mapping = torch.randint(-(2**33), 2**33, (40_000,), generator=g) if twin else None
    outputs = [_guarded(BATCH + 1, width)] + ([_guarded(BATCH + 1, twin)] if twin else [])
    views = [store[index] for store, index in outputs]
    call = launch.mha_page_table_call(table, pool, lengths, views[0], page_size, views[1] if twin else None, mapping)
    _check_bounded(call, programs, items, max(width, twin))
    _replayed(call, specialised, outputs,
              lambda o, *swa: ops.mha_page_table.reference(table, pool, lengths, o, page_size,
                                                             swa[0] if swa else None, mapping),
              _lengths_scenarios(lengths, max(width, twin) * page_size, g), "MHA page table")


@BOUNDS
@BUILDS
@EACH_BOUND_AND_BUILD
@pytest.mark.parametrize("max_pages", (None, 4))
@pytest.mark.parametrize("fill_value", (None, -7), ids=("plain", "fill"))
def test_translated_page_table(bounded, specialised, max_pages, fill_value):
    """``max_pages``: None (the width), or this many blocks and a few pages; with a fill value, every row's
    columns past its pages are filled."""
    g = torch.Generator().manual_seed(max_pages or 0)
    programs = bounded(BATCH)
    page_size = 16
    items = grid.items_per_program(grid.MAPPED_PAGE_TABLE, page_size)
    width = BLOCKS * items + 3
    table = _table(BATCH + 1, width * page_size + 7, g)
    pool, lengths = _pool(BATCH + 1), torch.zeros(BATCH, dtype=torch.int32)
    v2p = torch.randint(-9, 2**31, (3000,), generator=g, dtype=torch.int64)
    pages = None if max_pages is None else max_pages * items + 2
    outputs = [_guarded(BATCH + 1, width)]
    (out, index), = outputs
    call = launch.translated_page_table_call(table, pool, lengths, v2p, out[index], page_size, 3, pages, -2,
                                             fill_value)
    _check_bounded(call, programs, items, width if pages is None else pages)
    _replayed(call, specialised, outputs,
              lambda o: ops.translated_page_table.reference(table, pool, lengths, v2p, o, page_size, 3, pages, -2,
                                                            fill_value),
              _lengths_scenarios(lengths, width * page_size, g), "translated page table")


@BOUNDS
@BUILDS
@EACH_BOUND_AND_BUILD
@pytest.mark.parametrize("variant", ("plain", "window-v2p", "positions", "step-window", "short-step-window"))
def test_draft_decode(bounded, specialised, variant):
    g = torch.Generator().manual_seed(len(variant))
    topk, steps, page_size = 2, 3, 4
    # Segments are the grid's rows; the batch has BATCH requests, so BATCH * topk rows.
    programs = bounded(BATCH * topk)
    items = grid.items_per_program(grid.DRAFT_DECODE)
    full = BLOCKS * items + 7
    window, sink = (full - 100, 9) if variant == "window-v2p" else (0, 0)
    # A step window of more blocks than programs, and of one block (the steps on different programs).
    step_window = {"step-window": full - 100, "short-step-window": items // 2}.get(variant, 0)
    table = _table(BATCH + 1, full + 40, g)
    pool, lengths = _pool(BATCH + 1), torch.zeros(BATCH, dtype=torch.int64)
    positions = torch.zeros(BATCH * topk, dtype=torch.int32) if variant == "positions" else None
    v2p = torch.randint(-2, 20_000, (15_000,), generator=g) if variant == "window-v2p" else None
    width = BATCH * topk * (full + 8 + steps) - 50  # the last segments cut at out's width
    outputs = [_guarded(steps, BATCH * topk + 1), _guarded(steps, width)]
    (indptr, indptr_index), (out, out_index) = outputs

    def fit():
        if positions is not None:
            positions.copy_(lengths.repeat_interleave(topk).clamp(min=-1).to(positions.dtype) - 1)

    fit()
    args = (table, pool, lengths, indptr[indptr_index], out[out_index], steps, topk, page_size, positions, window,
            sink, v2p, True, False, 1, step_window)
    call = launch.draft_decode_call(*args)
    _check_bounded(call, programs, items, full)
    _replayed(call, specialised, outputs,
              lambda i, o: ops.draft_decode.reference(table, pool, lengths, i, o, steps, topk, page_size,
                                                                positions, window, sink, v2p, True, False, 1,
                                                                step_window),
              _lengths_scenarios(lengths, full, g, fit), f"draft decode ({variant})")


@BOUNDS
@BUILDS
@EACH_BOUND_AND_BUILD
@pytest.mark.parametrize("dcp_size", (2, 3))
def test_dcp_token_csr(bounded, specialised, dcp_size):
    g = torch.Generator().manual_seed(dcp_size)
    programs = bounded(BATCH)
    items = grid.items_per_program(grid.DCP_TOKEN_CSR)
    tokens = BLOCKS * items + 20  # a row's local tokens
    table = _table(BATCH + 1, tokens * dcp_size + 5, g)
    pool, lengths = _pool(BATCH + 1), torch.zeros(BATCH, dtype=torch.int64)
    start = torch.tensor([0, 4, 1, 0, 2], dtype=torch.int32)
    indptr = torch.zeros(BATCH + 1, dtype=torch.int32)
    outputs = [_guarded(BATCH * (tokens + 3))]
    (out, index), = outputs
    fit = _packed(lengths, indptr)
    fit()
    rank = dcp_size - 1
    call = launch.dcp_token_csr_call(table, pool, lengths, indptr, out[index], dcp_size, rank, start, True)
    _check_bounded(call, programs, items, tokens)
    _replayed(call, specialised, outputs,
              lambda o: ops.dcp_token_csr.reference(table, pool, lengths, indptr, o, dcp_size, rank, start,
                                                          True),
              _lengths_scenarios(lengths, tokens, g, fit), "DCP token CSR")


@BOUNDS
@BUILDS
@EACH_BOUND_AND_BUILD
@pytest.mark.parametrize("fill_value", (None, -1))
def test_dcp_page_table(bounded, specialised, fill_value):
    g = torch.Generator().manual_seed(fill_value or 0)
    programs = bounded(BATCH)
    page_size, dcp_size, rank = 16, 2, 1
    items = grid.items_per_program(grid.DCP_PAGE_TABLE, page_size)
    width = BLOCKS * items + 3
    table = _table(BATCH + 1, width * page_size * dcp_size + 3, g)
    pool, lengths = _pool(BATCH + 1), torch.zeros(BATCH, dtype=torch.int32)
    outputs = [_guarded(BATCH + 1, width)]
    (out, index), = outputs
    call = launch.dcp_page_table_call(table, pool, lengths, out[index], page_size, dcp_size, rank, fill_value)
    _check_bounded(call, programs, items, width)
    _replayed(call, specialised, outputs,
              lambda o: ops.dcp_page_table.reference(table, pool, lengths, o, page_size, dcp_size, rank,
                                                       fill_value),
              _lengths_scenarios(lengths, width * page_size, g), "DCP page table")


def test_the_launchers_grid_follows_the_budget_not_the_width(monkeypatch):
    """Unpatched, the budget is the CPU's probe's: the grid holds at most ``program_budget`` programs (at least
    one per row) whatever the width, and the rows' programs loop over the width."""
    monkeypatch.setattr(grid, "PROGRAMS_PER_MULTIPROCESSOR", 1)
    launch.forget_geometry()
    table = torch.randint(0, 9, (3, 1 << 16), dtype=torch.int32)
    pool, lengths = torch.tensor([0, 1]), torch.tensor([1 << 16, 7])
    out = torch.full((2, 1 << 16), POISON, dtype=torch.int32)
    call = launch.page_table_call(table, pool, lengths, out, 1)
    budget = grid.program_budget(devices.probe("cpu").multiprocessors)
    assert call.grid == (2, max(1, budget // 2), 1)
    host.run(call)
    launch.forget_geometry()
    expected = ops.page_table.reference(table, pool, lengths, torch.full_like(out, POISON), 1)
    assert_same(out, expected, "page table on the CPU's budget")


def test_the_budget_is_probed_once_per_device(monkeypatch):
    """The launchers keep each device's budget: later calls, whatever their shape, ask the probe nothing."""
    launch.forget_geometry()
    probed = []
    probe = devices.probe
    monkeypatch.setattr(devices, "probe", lambda device=None: probed.append(device) or probe(device))
    table = torch.zeros(4, 64, dtype=torch.int32)
    for batch, width in ((1, 3), (3, 9), (2, 64)):
        pool, lengths = torch.arange(batch), torch.full((batch,), 40)
        launch.page_table_call(table, pool, lengths, torch.empty(batch, width, dtype=torch.int32), 1)
        launch.token_csr_call(table, pool, lengths, torch.arange(batch + 1), torch.empty(width, dtype=torch.int32))
    assert len(probed) == 1
    launch.forget_geometry()
