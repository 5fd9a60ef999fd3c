"""The bounded launch grid (``kvdispatch.grid``: a program budget per launch) on every Triton op.

Launch plans are built under a budget of ``BUDGET`` programs, so a row's few programs each loop over several
of its blocks (``k, k + T, ...``) up to the row's real length, read on the device. Every op runs on rows of
mixed lengths (one spanning the whole table, others ending inside a block, empty ones) into poisoned
outputs, against the torch reference; then a plan built at one set of lengths is reused, same shapes, with
longer and shorter rows. Rows span three or more blocks of their kernel (``grid.items_per_program``).
"""

from __future__ import annotations

import pytest
import torch

import kvdispatch
from conftest import BACKENDS, DEVICE, page_table
from kvcases import POISON, make_case
from kvdispatch import grid, reference
from test_backends import _check_page_table, _check_token_csr, _expected_page_table
from test_dcp import check_dcp_csr, check_dcp_page_table, packed_indptr
from test_draft_decode import check as check_draft_decode
from test_mapped_page_tables import check_mha, check_translated, random_lookup

pytestmark = pytest.mark.skipif("triton" not in BACKENDS, reason="needs Triton")

BUDGET = 3  # programs per launch: 1 per row from a batch of 2, 3 programs sharing a single row's blocks
BLOCKS = 3  # blocks of its kernel the longest row spans, and a bit


def generator():
    return torch.Generator().manual_seed(torch.seed() % 2**31)


def draw(low, high, count, g):
    return torch.randint(low, high, (count,), generator=g)


@pytest.fixture
def bounded(monkeypatch):
    """Triton plans built under ``BUDGET`` programs per launch; yields the grids of the launches that compile
    or go the plain way (every launch under the interpreter)."""
    from kernels_triton import launch as triton_launch

    triton_launch.reset(compiled=True)
    monkeypatch.setattr(grid, "program_budget", lambda multiprocessors: BUDGET)
    grids = []
    plain = triton_launch.KernelLauncher.plain

    def spy(self, launch_grid, args, constexprs, num_warps):
        grids.append(tuple(launch_grid))
        return plain(self, launch_grid, args, constexprs, num_warps)

    monkeypatch.setattr(triton_launch.KernelLauncher, "plain", spy)
    yield grids
    triton_launch.reset(compiled=True)


def test_the_launchers_budget_is_the_probes_multiprocessors_times_the_grid_constant(monkeypatch):
    from kernels_triton import launch as triton_launch

    multiprocessors = kvdispatch.probe(DEVICE).multiprocessors
    assert triton_launch.program_budget(DEVICE) == multiprocessors * grid.PROGRAMS_PER_MULTIPROCESSOR
    monkeypatch.setattr(grid, "PROGRAMS_PER_MULTIPROCESSOR", 1)
    assert triton_launch.program_budget(DEVICE) == multiprocessors


def _check_bounded(grids, batch):
    """Every launch took at most ``max(1, BUDGET // batch)`` programs per row."""
    assert grids, "no Triton launch"
    for rows, programs_y, programs_z in grids:
        assert rows == batch and programs_y * programs_z <= max(1, BUDGET // batch), grids


def _mixed_lengths(batch, longest, g, low=1):
    """``batch`` lengths: the first ``longest``, the others random in ``[low, longest]`` (mixed)."""
    lengths = draw(low, longest + 1, batch, g)
    lengths[0] = longest
    return lengths


# -- the page table and the token CSR ---------------------------------------------------------------------

PAGE_TABLE_OPTIONS = ("plain", "start", "fill", "offset", "strided", "int64")


@pytest.mark.parametrize("page_size", (1, 16, 96))
@pytest.mark.parametrize("option", PAGE_TABLE_OPTIONS)
@pytest.mark.parametrize("batch", (1, 2))
def test_page_table_rows_loop_over_their_blocks(bounded, page_size, option, batch):
    pages = BLOCKS * grid.items_per_program(grid.PAGE_TABLE, page_size) + 5
    case = make_case(batch, page_size, max_pages=pages, device=DEVICE,
                     index_dtype=torch.int64 if option in ("int64", "start") else torch.int32,
                     with_start=option == "start", strided_table=option == "strided", strided_out=option == "strided",
                     fill_value=-1 if option == "fill" else None, seqlen_offset=3 if option == "offset" else 0)
    case.seq_lens[0] = pages * page_size - case.seqlen_offset  # the whole row, to its last block
    out = _check_page_table("triton", case, with_seq_out=option == "offset")
    assert (out[case.batch:] == POISON).all()
    _check_bounded(bounded, batch)


@pytest.mark.parametrize("page_size", (1, 64))
def test_a_page_table_plan_serves_longer_and_shorter_rows(bounded, page_size):
    """One plan (same shapes), built at short rows, then rows reaching the width, shorter ones, empty ones and
    ones whose pool index lies outside the table."""
    g = generator()
    pages = BLOCKS * grid.items_per_program(grid.PAGE_TABLE, page_size) + 5
    case = make_case(3, page_size, max_pages=pages, device=DEVICE, generator=g)
    longest = pages * page_size
    rows = case.req_to_token.shape[0]
    for lengths in (draw(1, 2 * page_size, 3, g), _mixed_lengths(3, longest, g), torch.tensor([longest] * 3),
                    draw(1, page_size + 1, 3, g), torch.tensor([0, -5, longest])):
        case.seq_lens.copy_(lengths)
        _check_page_table("triton", case, with_seq_out=True)
    case.req_pool_indices.copy_(torch.tensor([rows, -1, 0]))
    _check_page_table("triton", case, with_seq_out=True)
    assert len(set(bounded)) == 1, bounded
    _check_bounded(bounded, 3)


@pytest.fixture
def budget(monkeypatch):
    """Sets the programs per launch of the Triton and CUDA-source plans built after it (``budget(programs)``)."""
    from kernels_cupy import launch as cupy_launch
    from kernels_triton import launch as triton_launch

    triton_launch.reset(compiled=True)
    cupy_launch.forget_geometry()
    yield lambda programs: monkeypatch.setattr(grid, "program_budget", lambda multiprocessors: programs)
    triton_launch.reset(compiled=True)
    cupy_launch.forget_geometry()


# The page tables whose long rows span many blocks of a bounded grid: Triton shares them within groups of rows,
# the CUDA source walks each row with its own programs (benchmarks/cupy_group_*.patch share them too).
LONG_ROW_BACKENDS = pytest.mark.parametrize("backend", [b for b in BACKENDS if b in ("triton", "cupy", "cupy-host")])


def _hostile_mix(case, long_rows, g):
    """Lengths and pool entries of ``case`` for the overflow pass: the ``long_rows`` reach the width or pass
    it (the length dtype's extreme), the others end in their first block or are empty, negative or at the
    dtype's minimum; a few rows' pool entries lie outside the table (negative, past it, the dtype's
    extremes)."""
    info = torch.iinfo(case.seq_lens.dtype)
    full = (case.width + 1) * case.page_size
    short = [1, case.page_size + 1, 0, -1, info.min]
    lengths = [(full, info.max)[i % 2] if i in long_rows else short[i % len(short)] for i in range(case.batch)]
    case.seq_lens.copy_(torch.tensor(lengths))
    rows = case.req_to_token.shape[0]
    pool = case.req_pool_indices.clone()
    pool_info = torch.iinfo(pool.dtype)
    for i, bad in zip(range(2, case.batch, 3), (rows, -1, pool_info.max, pool_info.min)):
        pool[i] = bad
    pool[long_rows[-1]] = rows  # a long row that cannot be read
    case.req_pool_indices.copy_(pool)


@pytest.mark.representative("option")
@pytest.mark.parametrize("page_size", (1, 16, 96))
@pytest.mark.parametrize("option", PAGE_TABLE_OPTIONS)
@pytest.mark.parametrize("batch, programs, long_rows", [(5, 16, (0, 3)), (7, 20, (1, 2, 6))])
@LONG_ROW_BACKENDS
def test_page_table_overflow_blocks_are_dealt_over_the_grid(budget, page_size, option, batch, programs, long_rows,
                                                            backend):
    """A few rows far longer than their ``T`` programs' blocks, the rest short: the blocks past a row's first
    ``T`` are dealt over every program of the grid, exactly as the reference writes them, into a poisoned
    output whose guard columns (past the width) and spare rows stay untouched."""
    budget(programs)
    g = generator()
    pages = 4 * BLOCKS * grid.items_per_program(grid.PAGE_TABLE, page_size) + 3
    case = make_case(batch, page_size, max_pages=pages, device=DEVICE, generator=g,
                     index_dtype=torch.int64 if option in ("int64", "start") else torch.int32,
                     with_start=option == "start", strided_table=option == "strided",
                     fill_value=-1 if option == "fill" else None, seqlen_offset=3 if option == "offset" else 0)
    _hostile_mix(case, long_rows, g)
    _check_guarded(case, backend, with_seq_out=option == "offset")


@pytest.mark.parametrize("page_size", (1, 16))
@LONG_ROW_BACKENDS
def test_page_table_fill_reaches_the_width_past_short_rows(budget, page_size, backend):
    """With a fill value, every row ending within its ``T`` programs' blocks of a table far wider: no block is
    shared, and the fill past those blocks reaches the width; the guard columns and spare row stay untouched."""
    budget(16)
    g = generator()
    items = grid.items_per_program(grid.PAGE_TABLE, page_size)
    case = make_case(5, page_size, max_pages=4 * BLOCKS * items + 3, device=DEVICE, generator=g, fill_value=-1)
    case.seq_lens.copy_(draw(0, 3 * items * page_size, 5, g))
    _check_guarded(case, backend)


@LONG_ROW_BACKENDS
def test_overflow_blocks_are_shared_within_groups_of_rows(budget, backend):
    """A batch of several groups of rows (``page_table.GROUP_ROWS``), the last one partial, long rows in some
    groups and none in others."""
    from kernels_triton import page_table as triton_page_table

    batch = 3 * triton_page_table.GROUP_ROWS.value + 5
    budget(2 * batch)
    case = make_case(batch, 64, max_pages=3 * grid.items_per_program(grid.PAGE_TABLE, 64) + 1, device=DEVICE,
                     generator=generator())
    _hostile_mix(case, (3, 5, 70, batch - 4, batch - 1), generator())
    _check_guarded(case, backend)


@pytest.mark.parametrize("page_size", (1, 64))
@pytest.mark.parametrize("option", ("none", "offset", "start"))
@LONG_ROW_BACKENDS
def test_page_table_rows_all_long_take_their_common_passes_themselves(budget, page_size, option, backend):
    """Every row far past its ``T`` programs' blocks, by different amounts: the row's programs take the blocks
    every row of its group has, the rest is shared; one row reaches past the width."""
    budget(12)
    g = generator()
    items = grid.items_per_program(grid.PAGE_TABLE, page_size)
    case = make_case(6, page_size, max_pages=9 * items + 5, device=DEVICE, generator=g,
                     index_dtype=torch.int64 if option == "start" else torch.int32, with_start=option == "start",
                     seqlen_offset=2 if option == "offset" else 0)
    lengths = draw(5 * items * page_size, 9 * items * page_size, 6, g)
    lengths[4] = torch.iinfo(case.seq_lens.dtype).max - 2
    case.seq_lens.copy_(lengths)
    _check_guarded(case, backend, with_seq_out=option == "offset")


@pytest.mark.parametrize("page_size", (1, 64))
@pytest.mark.parametrize("fill", (False, True))
@LONG_ROW_BACKENDS
def test_page_table_rows_alike_and_long_take_every_block_themselves(budget, page_size, fill, backend):
    """Every row of the same length, far past its ``T`` programs' blocks (the full-length shape): no block is
    left to share, each row's programs write all of it and, with a fill value, the columns past it up to the
    width."""
    budget(12)
    g = generator()
    items = grid.items_per_program(grid.PAGE_TABLE, page_size)
    case = make_case(6, page_size, max_pages=9 * items + 5, device=DEVICE, generator=g,
                     fill_value=-1 if fill else None)
    case.seq_lens.fill_(int(draw(5 * items * page_size, 7 * items * page_size, 1, g)))
    _check_guarded(case, backend)


def _check_guarded(case, backend, with_seq_out=False):
    """The page table of ``case`` on ``backend`` into a poisoned store three columns wider than ``out`` and a
    row taller: ``out`` is the reference's, the rest of the store untouched."""
    store = torch.full((case.batch + 1, case.width + 3), POISON, dtype=torch.int32, device=DEVICE)
    out = store[:, : case.width]
    seq_out = case.seq_lens_out() if with_seq_out else None
    expected, expected_seq = _expected_page_table(case, out, seq_out)
    page_table(backend, case.req_to_token, case.req_pool_indices, case.seq_lens, out, page_size=case.page_size,
               kv_start_idx=case.kv_start_idx, seqlen_offset=case.seqlen_offset, seq_lens_out=seq_out,
               fill_value=case.fill_value)
    torch.testing.assert_close(out.cpu(), expected.cpu(), rtol=0, atol=0)
    assert (store[:, case.width:] == POISON).all() and (store[case.batch:] == POISON).all()
    if with_seq_out:
        torch.testing.assert_close(seq_out.cpu(), expected_seq.cpu(), rtol=0, atol=0)


def _csr_arguments(case, total):
    """``kv_indptr`` of ``case``'s lengths (gaps of 0..2 entries) into a poisoned ``out`` of ``total`` entries,
    whatever the lengths (the same shapes for every set of lengths)."""
    lengths = case.seq_lens.long().clamp(min=0).cpu()
    starts = torch.cumsum(lengths + torch.randint(0, 3, lengths.shape), 0) - lengths
    indptr = torch.cat([starts, starts[-1:] + lengths[-1:]]).to(case.seq_lens.dtype).to(DEVICE)
    return indptr, torch.full((total,), POISON, dtype=torch.int32, device=DEVICE)


@pytest.mark.parametrize("with_start", (False, True))
@pytest.mark.parametrize("batch", (1, 2))
def test_token_csr_rows_loop_over_their_blocks(bounded, with_start, batch):
    g = generator()
    pages = BLOCKS * grid.items_per_program(grid.TOKEN_CSR) // 64 + 3
    case = make_case(batch, 64, max_pages=pages, device=DEVICE, with_start=with_start, generator=g,
                     index_dtype=torch.int64 if with_start else torch.int32)
    cols = case.req_to_token.shape[1]
    total = batch * cols + 3 * batch
    for lengths in (_mixed_lengths(batch, cols, g), draw(1, 100, batch, g), torch.full((batch,), cols)):
        case.seq_lens.copy_(lengths)
        _check_token_csr("triton", case, *_csr_arguments(case, total))
    # A row that starts before out: its programs count from its first token inside out.
    indptr, out = _csr_arguments(case, total)
    indptr[0] -= 2100
    _check_token_csr("triton", case, indptr, out)
    assert len(set(bounded)) == 1, bounded
    _check_bounded(bounded, batch)


# -- the mapped page tables -----------------------------------------------------------------------------------

def _slot_table(rows, cols, g):
    """A table of slot ids (a few negative ones)."""
    return draw(-3, rows * cols, rows * cols, g).view(rows, cols).to(torch.int32)


@pytest.mark.parametrize("page_size", (1, 16, 7))
@pytest.mark.parametrize("swa", (False, True))
def test_mha_page_table_rows_loop_over_their_blocks(bounded, page_size, swa):
    g = generator()
    pages = BLOCKS * grid.items_per_program(grid.MAPPED_PAGE_TABLE, page_size) + 3
    table = _slot_table(4, pages * page_size, g)
    pool = torch.tensor([2, 0], dtype=torch.int32)
    full_to_swa = random_lookup(torch.int32, table.numel() + 2, g) if swa else None
    for lengths in (_mixed_lengths(2, table.shape[1], g, low=-1), draw(1, 3 * page_size, 2, g),
                    torch.tensor([table.shape[1] + 5, table.shape[1]])):
        check_mha("triton", table, pool, lengths.to(torch.int32), pages + 1, page_size, pages - 2 if swa else None,
                  full_to_swa, rows=3)
    assert len(set(bounded)) == 1, bounded
    _check_bounded(bounded, 2)


@pytest.mark.representative("page_size")
@pytest.mark.parametrize("page_size", (1, 16, 7))
@pytest.mark.parametrize("multiplier,max_pages,seq_len_delta", [(1, None, 0), (4, "some", 3), (1, None, -2)])
def test_translated_page_table_rows_loop_over_their_blocks(bounded, page_size, multiplier, max_pages,
                                                           seq_len_delta):
    g = generator()
    pages = BLOCKS * grid.items_per_program(grid.MAPPED_PAGE_TABLE, page_size) + 3
    table = _slot_table(4, pages * page_size, g)
    pool = torch.tensor([3, 1], dtype=torch.int64)
    v2p = random_lookup(torch.int32, table.numel() // page_size + 3, g)
    width = pages + 2
    limit = None if max_pages is None else width - 7
    for lengths in (_mixed_lengths(2, table.shape[1], g, low=-1), draw(1, 3 * page_size, 2, g),
                    torch.tensor([table.shape[1], table.shape[1] + 9])):
        check_translated("triton", table, pool, lengths, v2p, width, page_size, multiplier, limit, seq_len_delta,
                         rows=3)
    assert len(set(bounded)) == 1, bounded
    _check_bounded(bounded, 2)


@pytest.mark.representative("page_size")
@pytest.mark.parametrize("page_size", (1, 16, 7))
@pytest.mark.parametrize("multiplier,max_pages,seq_len_delta", [(1, None, 0), (4, "some", 3), (1, None, -2)])
@pytest.mark.parametrize("dtype", (torch.int32, torch.int64))
@LONG_ROW_BACKENDS
def test_translated_overflow_blocks_are_dealt_over_the_grid(budget, page_size, multiplier, max_pages, seq_len_delta,
                                                            dtype, backend):
    """A few rows far longer than their ``T`` programs' blocks (some at the length dtype's extremes), short
    and empty ones, unreadable pool entries: the overflow blocks dealt over the grid write exactly the
    reference's output, the guard around it untouched."""
    budget(16)
    g = generator()
    pages = 4 * BLOCKS * grid.items_per_program(grid.MAPPED_PAGE_TABLE, page_size) + 3
    table = _slot_table(6, pages * page_size, g)
    info = torch.iinfo(dtype)
    pool = torch.tensor([3, 1, 6, 0, -1, 5, 2], dtype=dtype)
    pool[-1] = info.max
    lengths = torch.tensor([table.shape[1], 1, table.shape[1], info.max, info.max, 0, info.min], dtype=dtype)
    lengths[1] = -1 if seq_len_delta else page_size + 1
    v2p = random_lookup(torch.int32, table.numel() // page_size + 3, g)
    width = pages + 2
    limit = None if max_pages is None else width - 7
    check_translated(backend, table, pool, lengths, v2p, width, page_size, multiplier, limit, seq_len_delta,
                     rows=pool.shape[0] + 1)


@pytest.mark.parametrize("page_size", (1, 16))
@pytest.mark.parametrize("long_rows", (True, False))
@LONG_ROW_BACKENDS
def test_translated_fill_reaches_the_width_past_every_row(budget, page_size, long_rows, backend):
    """With a fill value (SGLang's zero tail): short, empty and unreadable rows, with or without a few far
    longer than their ``T`` programs' blocks, in a table far wider: the live pages and the fill past them up to
    the width are the reference's, the guard around them untouched."""
    budget(16)
    g = generator()
    pages = 4 * BLOCKS * grid.items_per_program(grid.MAPPED_PAGE_TABLE, page_size) + 3
    table = _slot_table(6, pages * page_size, g)
    pool = torch.tensor([3, 1, 6, 0, -1, 5, 2], dtype=torch.int32)
    full = table.shape[1] if long_rows else 2 * page_size
    lengths = torch.tensor([full, 1, full, page_size + 1, full, 0, 3 * page_size - 1], dtype=torch.int32)
    v2p = random_lookup(torch.int32, table.numel() // page_size + 3, g)
    check_translated(backend, table, pool, lengths, v2p, pages + 2, page_size, rows=pool.shape[0] + 1, fill_value=0)


@pytest.mark.parametrize("lengths_are, fill_value", [("different", None), ("alike", None), ("alike", 0)])
@LONG_ROW_BACKENDS
def test_translated_rows_all_long(budget, lengths_are, fill_value, backend):
    """As for the page table: every row past its programs' blocks, by different amounts (the row's programs
    take the blocks every row of its group has, the rest is shared) or by one (the full-length shape: each
    row's programs take all of it, and with a fill value the columns past it)."""
    budget(12)
    g = generator()
    page_size = 16
    items = grid.items_per_program(grid.MAPPED_PAGE_TABLE, page_size)
    table = _slot_table(6, (9 * items + 5) * page_size, g)
    pool = torch.randperm(6, generator=g)
    if lengths_are == "alike":
        lengths = draw(5 * items * page_size, 7 * items * page_size, 1, g).expand(6).clone()
    else:
        lengths = draw(5 * items * page_size, 9 * items * page_size, 6, g)
    v2p = random_lookup(torch.int32, table.numel() // page_size + 3, g)
    check_translated(backend, table, pool, lengths, v2p, 9 * items + 7, page_size, rows=7, fill_value=fill_value)


# -- draft decode ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("window", (False, True))
def test_draft_decode_prefixes_loop_over_their_blocks(bounded, window):
    """Two requests of two branches: 4 segments, one program each, prefixes of several blocks."""
    g = generator()
    tokens = grid.items_per_program(grid.DRAFT_DECODE)
    cols = BLOCKS * tokens + 300
    table = _slot_table(3, cols, g)
    # Rows claiming far more tokens than the table holds end at its width.
    for lengths in (torch.tensor([cols - 7, tokens + 1]), draw(1, 40, 2, g), torch.tensor([cols, cols]),
                    torch.tensor([2**40, 2**62])):
        case = dict(req_to_token=table, req_pool_indices=torch.tensor([2, 0], dtype=torch.int32),
                    seq_lens=lengths, num_steps=3, topk=2, page_size=1, positions=None,
                    window_size=2 * tokens + 5 if window else 0, sink_size=3 if window else 0, v2p=None,
                    write_indptr_start=True, round_toward_zero=False)
        # out as wide as the longest prefixes need, whatever this call's lengths (the same shapes each time).
        check_draft_decode("triton", case, torch.int32, torch.int64, width=2 * 2 * cols + 2 * 2 * 3, loop=False)
    assert len(set(bounded)) == 1, bounded
    _check_bounded(bounded, 4)


@pytest.mark.parametrize("blocks", (1, BUDGET + 1))
def test_draft_decode_step_window_deals_each_steps_blocks_over_the_programs(bounded, blocks):
    """One segment on ``BUDGET`` programs, five steps: a window of one block (fewer blocks than programs: the
    steps side by side) and of more blocks than programs (each step's blocks dealt over all of them)."""
    g = generator()
    tokens = grid.items_per_program(grid.DRAFT_DECODE)
    window = blocks * tokens - 5
    cols = window + tokens + 40
    table = _slot_table(2, cols, g)
    for lengths in (torch.tensor([cols - 30]), draw(1, window // 2, 1, g), torch.tensor([2**40])):
        case = dict(req_to_token=table, req_pool_indices=torch.tensor([1], dtype=torch.int32), seq_lens=lengths,
                    num_steps=5, topk=1, page_size=1, positions=None, window_size=0, sink_size=0, v2p=None,
                    write_indptr_start=True, round_toward_zero=False, entry_page_size=1, step_window=window)
        check_draft_decode("triton", case, torch.int32, torch.int64, width=window + 2, loop=False)
    assert len(set(bounded)) == 1, bounded
    _check_bounded(bounded, 1)


# -- decode context parallel ----------------------------------------------------------------------------------

@pytest.mark.parametrize("dcp_size", (2, 3))
@pytest.mark.parametrize("with_start", (False, True))
def test_dcp_token_csr_rows_loop_over_their_blocks(bounded, dcp_size, with_start):
    g = generator()
    cols = BLOCKS * grid.items_per_program(grid.DCP_TOKEN_CSR) * dcp_size + 100
    table = _slot_table(4, cols, g)
    pool = torch.tensor([1, 3], dtype=torch.int64)
    rank = dcp_size - 1
    start = torch.tensor([0, 5], dtype=torch.int64) if with_start else None
    total = 2 * (cols // dcp_size + 1) + 6
    for lengths in (_mixed_lengths(2, cols, g), draw(1, 100, 2, g), torch.tensor([cols, cols - 1])):
        local = reference.dcp_owned_counts(lengths, dcp_size, rank, start).clamp(min=0)
        indptr, _ = packed_indptr(local, 2, g)
        check_dcp_csr("triton", table, pool, local, indptr, total, torch.int32, dcp_size, rank, start)
    assert len(set(bounded)) == 1, bounded
    _check_bounded(bounded, 2)


@pytest.mark.parametrize("page_size", (1, 16, 7))
@pytest.mark.parametrize("fill_value", (None, -1))
def test_dcp_page_table_rows_loop_over_their_blocks(bounded, page_size, fill_value):
    g = generator()
    dcp_size, rank = 2, 1
    pages = BLOCKS * grid.items_per_program(grid.DCP_PAGE_TABLE, page_size) + 3
    table = _slot_table(4, pages * page_size * dcp_size, g)
    pool = torch.tensor([0, 2], dtype=torch.int32)
    local_longest = pages * page_size
    for lengths in (_mixed_lengths(2, local_longest, g, low=-1), draw(1, 3 * page_size, 2, g),
                    torch.tensor([local_longest, local_longest + 3])):
        check_dcp_page_table("triton", table, pool, lengths.to(torch.int32), pages + 2, page_size, dcp_size, rank,
                             fill_value, spare_rows=1)
    assert len(set(bounded)) == 1, bounded
    _check_bounded(bounded, 2)
