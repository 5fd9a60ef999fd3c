"""Invariants of the shared grid helper, and SGLang's helper values."""

import math
import random

import pytest

from kvdispatch import grid
from kvdispatch.compat import sglang

PAGE_SIZES = list(range(1, 130)) + [192, 255, 256, 1000, 1024, 2048, 3000, 4095, 4096]


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_page_table_items_are_a_power_of_two_that_depends_only_on_page_size(page_size):
    items = grid.items_per_program(grid.PAGE_TABLE, page_size)
    assert items & (items - 1) == 0
    assert 16 <= items <= 1024
    for batch, width in [(1, 1), (3, 17), (513, 2048)]:
        launch = grid.page_table_launch(batch, width, page_size)
        assert launch.items_per_program == items
        assert launch.threads % 64 == 0 and 64 <= launch.threads <= 256


def test_page_table_grid_covers_every_page_and_no_more():
    rng = random.Random(0)
    for _ in range(2000):
        batch, width, page_size = rng.randint(0, 600), rng.randint(0, 140000), rng.randint(1, 4096)
        launch = grid.page_table_launch(batch, width, page_size)
        rows, programs, slices = launch.grid
        if batch == 0 or width == 0:
            assert launch.grid == (0, 0, 0)
            continue
        assert rows == batch and slices == 1
        assert programs * launch.items_per_program >= width  # every page of the widest row is owned
        assert (programs - 1) * launch.items_per_program < width  # no program beyond what it can use


def test_zero_width_tables_that_write_lengths_get_one_program_per_row():
    assert grid.page_table_launch(5, 0, 64).grid == (0, 0, 0)
    assert grid.page_table_launch(5, 0, 64, writes_lengths=True).grid == (5, 1, 1)
    assert grid.page_table_launch(0, 0, 64, writes_lengths=True).grid == (0, 0, 0)
    assert grid.page_table_launch(5, 70, 64, writes_lengths=True) == grid.page_table_launch(5, 70, 64)


def test_token_csr_grid_covers_the_longest_possible_row():
    rng = random.Random(1)
    for _ in range(2000):
        batch, cols, total = rng.randint(0, 600), rng.randint(0, 200000), rng.randint(0, 10**7)
        launch = grid.token_csr_launch(batch, cols, total)
        span = min(cols, total)
        rows, programs, slices = launch.grid
        if batch == 0 or span == 0:
            assert launch.grid == (0, 0, 0)
            continue
        assert rows == batch and slices == 1
        assert programs * launch.items_per_program >= span
        assert (programs - 1) * launch.items_per_program < span


def _launch_with_programs(kind, batch, programs, items):
    """The launch of ``kind`` whose rows need exactly ``programs`` programs of ``items`` items."""
    return _launch_of(kind, batch, programs * items)


def _launch_of(kind, batch, span, budget=None):
    """The launch of ``kind`` for ``batch`` rows of ``span`` items (page size 64) within ``budget`` programs."""
    if kind == grid.PAGE_TABLE:
        return grid.page_table_launch(batch, span, 64, budget=budget)
    if kind == grid.MAPPED_PAGE_TABLE:
        return grid.mapped_page_table_launch(batch, span, 64, budget=budget)
    if kind == grid.DRAFT_DECODE:
        return grid.draft_decode_launch(batch, span, span + 5, budget=budget)
    if kind == grid.DCP_PAGE_TABLE:
        return grid.dcp_page_table_launch(batch, span, 64, budget=budget)
    if kind == grid.DCP_TOKEN_CSR:
        return grid.dcp_token_csr_launch(batch, span * 4, span + 5, 4, budget=budget)
    return grid.token_csr_launch(batch, span, span + 5, budget=budget)


@pytest.mark.parametrize("kind", grid.KINDS)
@pytest.mark.parametrize("programs,expected", [
    (1, (1, 1)), (65535, (65535, 1)), (65536, (65535, 2)), (2 * 65535, (65535, 2)), (2 * 65535 + 1, (65535, 3)),
    (65535 * 65535, (65535, 65535))])
def test_rows_past_the_second_dimension_fold_into_the_third(kind, programs, expected):
    items = grid.items_per_program(kind, 64)
    launch = _launch_with_programs(kind, 3, programs, items)
    assert launch.grid == (3,) + expected
    assert launch.folded == (expected[1] > 1)
    assert all(1 <= n <= limit for n, limit in zip(launch.grid, (grid.MAX_GRID_X, grid.MAX_GRID_Y, grid.MAX_GRID_Z)))


@pytest.mark.parametrize("kind", grid.KINDS)
def test_a_row_too_wide_even_folded_is_a_value_error(kind):
    items = grid.items_per_program(kind, 64)
    most = grid.MAX_GRID_Y * grid.MAX_GRID_Z * items
    assert _launch_with_programs(kind, 1, grid.MAX_GRID_Y * grid.MAX_GRID_Z, items).grid[1:] == (65535, 65535)
    with pytest.raises(grid.GridLimitError, match=f"must be at most {most}.*got {most + 1}"):
        _launch_of(kind, 1, most + 1)
    assert issubclass(grid.GridLimitError, ValueError)
    # Nothing to launch is never an error.
    assert grid.page_table_launch(0, most + 1, 64).grid == (0, 0, 0)


def test_folded_programs_cover_each_row_once():
    rng = random.Random(2)
    for _ in range(300):
        programs = rng.choice([rng.randint(1, 10**6), rng.randint(65530, 65540), rng.randint(1, 65535 * 65535)])
        launch = _launch_with_programs(grid.TOKEN_CSR, 1, programs, grid.items_per_program(grid.TOKEN_CSR))
        _, width, slices = launch.grid
        # Program k is block (k % width, k // width); the last slice's blocks past the row exit at once.
        assert width * slices >= programs > width * (slices - 1)
        assert width == min(programs, grid.MAX_GRID_Y)


def test_the_budget_is_programs_per_multiprocessor(monkeypatch):
    assert grid.PROGRAMS_PER_MULTIPROCESSOR == 8
    assert grid.program_budget(132) == 132 * 8
    assert grid.program_budget(1) == 8
    assert grid.program_budget(0) == 1  # at least one program, whatever the device reports
    monkeypatch.setattr(grid, "PROGRAMS_PER_MULTIPROCESSOR", 1)
    assert grid.program_budget(132) == 132
    monkeypatch.setattr(grid, "PROGRAMS_PER_MULTIPROCESSOR", 0)
    assert grid.program_budget(132) == 1


@pytest.mark.parametrize("kind", grid.KINDS)
def test_a_budget_bounds_the_programs_per_row(kind):
    """P = min(blocks the width needs, max(1, budget // batch)), laid out as the unbounded grid is; without a
    budget (None) the programs are the width's blocks."""
    rng = random.Random(3)
    items = grid.items_per_program(kind, 64)
    for _ in range(500):
        batch, blocks = rng.randint(1, 3000), rng.choice([rng.randint(1, 300), rng.randint(1, 10**6)])
        budget = rng.choice([1, 2, 7, rng.randint(1, 10**5), 132 * 8])
        unbounded = _launch_with_programs(kind, batch, blocks, items)
        bounded = _launch_of(kind, batch, blocks * items, budget)
        programs = min(blocks, max(1, budget // batch))
        assert bounded == _launch_with_programs(kind, batch, programs, items)  # the same layout, folding included
        assert bounded.grid[0] == batch and bounded.grid[1] * bounded.grid[2] >= programs
        assert bounded.items_per_program == unbounded.items_per_program and bounded.threads == unbounded.threads
        assert _launch_of(kind, batch, blocks * items, None) == unbounded
        if budget >= batch * blocks:  # room for every block: the width-sized grid
            assert bounded == unbounded


@pytest.mark.parametrize("kind", grid.KINDS)
def test_a_bounded_row_folds_past_the_second_dimension(kind, monkeypatch):
    monkeypatch.setattr(grid, "MAX_GRID_Y", 3)
    items = grid.items_per_program(kind, 64)
    assert _launch_of(kind, 2, 100 * items, budget=10).grid == (2, 3, 2)  # 5 programs per row: 3 + 2
    assert _launch_of(kind, 2, 100 * items, budget=10).folded
    assert _launch_of(kind, 2, 100 * items, budget=6).grid == (2, 3, 1)
    assert not _launch_of(kind, 2, 100 * items, budget=6).folded


@pytest.mark.parametrize("kind", grid.KINDS)
def test_a_budget_keeps_the_limits(kind):
    """Nothing to launch stays nothing; a batch or a width beyond the limits fails with a budget as without."""
    items = grid.items_per_program(kind, 64)
    assert _launch_of(kind, 0, 10 * items, budget=100).grid == (0, 0, 0)
    assert _launch_of(kind, 5000, items, budget=100).grid == (5000, 1, 1)  # at least one program per row
    most = grid.MAX_GRID_Y * grid.MAX_GRID_Z * items
    with pytest.raises(grid.GridLimitError, match=f"must be at most {most}.*got {most + 1}"):
        _launch_of(kind, 1, most + 1, budget=100)
    batch = grid.max_batch(_launch_of(kind, 1, 1).threads) + 1
    with pytest.raises(grid.GridLimitError, match=f"got {batch}"):
        _launch_of(kind, batch, 1, budget=100)
    assert grid.page_table_launch(5, 0, 64, writes_lengths=True, budget=1).grid == (5, 1, 1)


H200_MULTIPROCESSORS = 132


def test_max_context_buffers_launch_a_bounded_grid_on_an_h200():
    """256 requests in 1M-token buffers at page 64: at most 8192 programs (65,536 unbounded); the token CSR
    of the same requests likewise."""
    budget = grid.program_budget(H200_MULTIPROCESSORS)
    width = (1 << 20) // 64
    bounded = grid.page_table_launch(256, width, 64, budget=budget)
    assert math.prod(bounded.grid) <= 8192
    assert math.prod(grid.page_table_launch(256, width, 64).grid) == 65536
    assert math.prod(grid.token_csr_launch(256, 1 << 20, 256 << 20, budget=budget).grid) <= 8192
    assert math.prod(grid.mapped_page_table_launch(256, width, 64, budget=budget).grid) <= 8192
    assert math.prod(grid.dcp_page_table_launch(256, width // 4, 64, budget=budget).grid) <= 8192
    assert math.prod(grid.draft_decode_launch(256 * 4, 1 << 20, 1 << 22, budget=budget).grid) <= 8192


@pytest.mark.parametrize("batch,context,page_size,programs", [(1, 131072, 64, 32), (64, 32768, 64, 8),
                                                              (1, 131072, 1, 128), (256, 32768, 1, 4)])
def test_full_length_lab_shapes_on_an_h200(batch, context, page_size, programs):
    """The full-length reference shapes: the first three fit the budget (each program still owns one block);
    256 rows of 32 blocks at page 1 take 4 programs per row, 8 blocks each."""
    budget = grid.program_budget(H200_MULTIPROCESSORS)
    width = -(-context // page_size)
    bounded = grid.page_table_launch(batch, width, page_size, budget=budget)
    assert bounded.grid == (batch, programs, 1)
    unbounded = grid.page_table_launch(batch, width, page_size)
    assert (bounded == unbounded) == (unbounded.grid[1] == programs)


@pytest.mark.parametrize("page_size", (1, 64, 4096))
def test_batch_limit(page_size):
    """Within CUDA's 2**31 - 1 blocks and HIP's 2**32 - 1 threads in the first dimension; above: a clear
    ValueError naming the batch, whatever the width."""
    launch = grid.page_table_launch(1, 1, page_size)
    most = grid.max_batch(launch.threads)
    assert most == min(2**31 - 1, (2**32 - 1) // launch.threads)
    assert grid.page_table_launch(most, 1, page_size).grid == (most, 1, 1)
    assert grid.token_csr_launch(grid.max_batch(256), 7, 7).grid == (grid.max_batch(256), 1, 1)
    for batch in (most + 1, 2**31 - 1, 2**31):
        with pytest.raises(grid.GridLimitError, match=rf"batch \(req_pool_indices.shape\[0\]\) must be at most "
                                                       rf"{most} .*got {batch}"):
            grid.page_table_launch(batch, 1, page_size)
        with pytest.raises(grid.GridLimitError, match=f"got {batch}"):
            grid.token_csr_launch(batch, 1, 1)
    assert grid.page_table_launch(2**31, 0, page_size).grid == (0, 0, 0)


def test_grid_limits_are_the_vendors():
    assert (grid.MAX_GRID_X, grid.MAX_GRID_Y, grid.MAX_GRID_Z) == (2**31 - 1, 65535, 65535)
    assert grid.MAX_GRID_X_THREADS == 2**32 - 1


def test_bad_page_sizes_and_kinds():
    for bad in (0, -1, 4097):
        with pytest.raises(ValueError, match="page_size"):
            grid.items_per_program(grid.PAGE_TABLE, bad)
    with pytest.raises(ValueError, match="kind"):
        grid.items_per_program("paged")


def test_grid_helper_imports_nothing_heavy():
    import subprocess
    import sys

    code = ("import runpy, sys; runpy.run_path('kvdispatch/grid.py', run_name='grid');"
            "print(sorted(k for k in ('torch', 'triton', 'cupy') if k in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            cwd=__file__.rsplit("/tests/", 1)[0])
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize("page_size,pages", [(1, 4096), (16, 256), (32, 128), (64, 64), (96, 42), (128, 32),
                                             (4096, 1)])
def test_sglang_pages_per_block(page_size, pages):
    assert sglang.get_num_page_per_block_flashmla(page_size) == pages


def test_sglang_defaults_and_blocks():
    assert sglang.get_num_page_per_block_flashmla() == 64
    assert sglang.get_num_kv_index_blocks_flashmla(2048, 64) == 32
    assert sglang.get_num_kv_index_blocks_flashmla(2049, 64) == 33
    assert sglang.get_num_kv_index_blocks_flashmla(1, 96) == 1
    assert sglang.get_num_kv_index_blocks_flashmla(43, 96) == 2
    assert sglang.get_num_kv_index_blocks_flashmla(131072, 1) == 32
