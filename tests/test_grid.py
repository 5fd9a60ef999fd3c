"""Invariants of the shared grid helper, and SGLang's helper values."""

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
        rows, programs = launch.grid
        if batch == 0 or width == 0:
            assert rows * programs == 0
            continue
        assert rows == batch
        assert programs * launch.items_per_program >= width  # every page of the widest row is owned
        assert (programs - 1) * launch.items_per_program < width  # no program beyond what it can use


def test_zero_width_tables_that_write_lengths_get_one_program_per_row():
    assert grid.page_table_launch(5, 0, 64).grid == (0, 0)
    assert grid.page_table_launch(5, 0, 64, writes_lengths=True).grid == (5, 1)
    assert grid.page_table_launch(0, 0, 64, writes_lengths=True).grid == (0, 0)
    assert grid.page_table_launch(5, 70, 64, writes_lengths=True) == grid.page_table_launch(5, 70, 64)


def test_token_csr_grid_covers_the_longest_possible_row():
    rng = random.Random(1)
    for _ in range(2000):
        batch, cols, total = rng.randint(0, 600), rng.randint(0, 200000), rng.randint(0, 10**7)
        launch = grid.token_csr_launch(batch, cols, total)
        span = min(cols, total)
        rows, programs = launch.grid
        if batch == 0 or span == 0:
            assert rows * programs == 0
            continue
        assert rows == batch
        assert programs * launch.items_per_program >= span
        assert (programs - 1) * launch.items_per_program < span


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
