"""The unified pool's read-table and draft options: ``create_translated_page_table(fill_value=...)``.

The reference against plain loops over exact integers (``test_mapped_page_tables.loop_translated``, then the
fill), every backend under test against the reference into outputs in the middle of poisoned allocations, the
options' argument errors.
"""

import pytest
import torch

from conftest import BACKENDS, translated_page_table
from kvcases import POISON, assert_same
from kvdispatch import ops
from test_extremes import I32_MAX, I32_MIN, copy_to_device, guarded, middle
from test_mapped_page_tables import (PAGE_SIZES, _cdiv, _row_pages, draw, generator, loop_translated, random_lookup,
                                     random_requests, random_table)


def loop_filled(table, pool, lens, v2p, out, page_size, max_pages, seq_len_delta, fill_value):
    """``loop_translated``, then ``fill_value`` in each row's columns past its pages up to ``max_pages``."""
    result = loop_translated(table, pool, lens, v2p, out, page_size, 1, max_pages, seq_len_delta)
    columns = out.shape[1] if max_pages is None else max_pages
    rows = table.tolist()
    for b, (row, length) in enumerate(zip(pool.tolist(), lens.tolist())):
        result[b, min(_row_pages(rows, row, length + seq_len_delta, page_size), columns):columns] = fill_value
    return result


@pytest.mark.parametrize("backend", [None, *BACKENDS])
@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("max_pages,seq_len_delta,fill_value", [(None, 0, 0), ("some", 3, -1), ("all", -2, I32_MAX),
                                                                (None, 0, I32_MIN)])
def test_translated_fill(backend, page_size, max_pages, seq_len_delta, fill_value):
    """``backend`` None: the reference against the loop; else the backend against the reference (rows past the
    batch and columns past ``max_pages`` untouched)."""
    g = generator()
    table = random_table(page_size, g)
    pool, lens = random_requests(table, page_size, torch.int64, g)
    v2p = random_lookup(torch.int64, _cdiv(table.numel(), page_size) + 1, g)
    width = _cdiv(table.shape[1], page_size) + int(draw(0, 3, 1, g))
    pages = dict(some=int(draw(0, width + 1, 1, g)), all=width).get(max_pages)
    rows = pool.shape[0] + 2
    store, view = guarded((rows, width))
    expected = store.cpu().clone()
    ops.translated_page_table.reference(table, pool, lens, v2p, middle(expected, (rows, width)), page_size, 1, pages,
                                        seq_len_delta, fill_value)
    if backend is None:
        loop = loop_filled(table, pool, lens, v2p, torch.full((rows, width), POISON, dtype=torch.int32), page_size,
                           pages, seq_len_delta, fill_value)
        assert_same(middle(expected, (rows, width)), loop, "reference vs loop")
        return
    move = copy_to_device
    translated_page_table(backend, move(table), move(pool), move(lens), move(v2p), view, page_size=page_size,
                          max_pages=pages, seq_len_delta=seq_len_delta, fill_value=fill_value)
    assert_same(store, expected, f"{backend} filled translated page table (whole allocation)")


@pytest.mark.parametrize("fill_value,error", [(1.0, TypeError), (True, TypeError), (2**31, ValueError),
                                              (I32_MIN - 1, ValueError)])
def test_translated_fill_argument_errors(fill_value, error):
    import kvdispatch

    table = torch.zeros((2, 32), dtype=torch.int32)
    out = torch.full((2, 4), POISON, dtype=torch.int32)
    with pytest.raises(error, match="fill_value"):
        kvdispatch.create_translated_page_table(table, torch.zeros(2, dtype=torch.int64),
                                                torch.ones(2, dtype=torch.int64), torch.arange(4), out, page_size=16,
                                                fill_value=fill_value)
    assert (out == POISON).all()
