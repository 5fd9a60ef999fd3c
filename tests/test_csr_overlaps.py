"""Overlapping CSR rows: ``kv_indptr`` entries whose requests' output ranges overlap.

The contract: each overlapped entry holds the value one of the covering requests writes there (which one is
not defined); every other entry is exact, and nothing outside ``out`` is written, on every backend. The
oracle is each request run alone through the plain loops (``tests/kvcases.py``, ``tests/test_dcp.py``): a row
of one request overlaps nothing. Random ``kv_indptr`` (rows starting before ``out``, inside one another and
past ``out``'s end) into a poisoned ``out`` in the middle of a larger poisoned allocation, for the token CSR
(with and without a start, ``entry_page_size``, ``token_mapping``, an int64 ``out``) and the DCP token CSR.
"""

import pytest
import torch

from conftest import BACKENDS, DEVICE, dcp_token_csr, token_csr
from kvcases import POISON, Case, loop_token_csr
from test_csr_options import draw, generator, random_mapping
from test_dcp import loop_dcp_csr
from test_extremes import DTYPES, GUARD, ROWS, guarded, middle, random_table

DRAWS = 6  # random cases per test, more (up to MAX_DRAWS) until one has rows that overlap
MAX_DRAWS = 60
OTHER_POISON = POISON + 1  # a second poison tells an entry a request writes from one it leaves untouched


def covering_values(solo, batch, total, out_dtype):
    """Per position of an ``out`` of ``total`` entries, the set of values the requests covering it write
    there; ``solo(b, out)`` returns a new ``out`` with request ``b``'s writes alone (a plain loop)."""
    covering = [set() for _ in range(total)]
    for b in range(batch):
        once = solo(b, torch.full((total,), POISON, dtype=out_dtype))
        again = solo(b, torch.full((total,), OTHER_POISON, dtype=out_dtype))
        for t in (once != POISON).logical_or(again != OTHER_POISON).nonzero().flatten().tolist():
            covering[t].add(int(once[t]))
    return covering


def assert_overlap_contract(store, covering, what):
    """``store`` (the guarded allocation of ``out``): each entry one of its covering requests' values, a
    poisoned one where none covers it, and the guards poisoned."""
    store = store.cpu()
    total = len(covering)
    guards = torch.cat([store[:GUARD], store[GUARD + total:]])
    assert (guards == POISON).all(), f"{what}: a write outside out"
    actual = middle(store, (total,)).tolist()
    for t, (value, allowed) in enumerate(zip(actual, covering)):
        assert value in (allowed or {POISON}), (
            f"{what}: out[{t}] = {value}, expected " + (f"one of {sorted(allowed)}" if allowed else "untouched"))
    return sum(len(allowed) > 1 for allowed in covering)


def overlapping_indptr(batch, total, longest, index_dtype, g):
    """``kv_indptr`` ``[B + 1]``: each row starting anywhere from ``longest`` before ``out`` to past its end,
    and now and then inside the row before it (so that rows overlap in most draws)."""
    indptr = draw(-longest, total + 2, batch + 1, g)
    for b in range(1, batch):
        if int(draw(0, 2, 1, g)) == 0:
            indptr[b] = indptr[b - 1] + draw(0, longest + 1, 1, g)
    return indptr.to(index_dtype)


def random_pool(batch, g):
    """Pool indices inside the table, or (one draw in four) some of them just outside it."""
    return draw(-1, ROWS + 1, batch, g) if int(draw(0, 4, 1, g)) == 0 else draw(0, ROWS, batch, g)


def over_random_draws(check_one):
    """``check_one(g)`` (the count of overlapped entries of one random case) over DRAWS cases, more until one
    has rows that overlap."""
    g = generator()
    overlapped = 0
    for drawn in range(MAX_DRAWS):
        if drawn >= DRAWS and overlapped:
            return
        overlapped += check_one(g)
    raise AssertionError(f"no draw of {MAX_DRAWS} made rows overlap")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("index_dtype", DTYPES)
@pytest.mark.parametrize("out_dtype", DTYPES)
@pytest.mark.parametrize("options", ["plain", "start", "entry-pages", "entry-pages-mapped"])
def test_token_csr_overlapping_rows(backend, index_dtype, out_dtype, options):
    def check_one(g):
        entry_page_size = int(draw(2, 6, 1, g)) if options.startswith("entry-pages") else 1
        cols = int(draw(1, 20, 1, g))
        positions = cols * entry_page_size
        batch = int(draw(2, 7, 1, g))
        table = draw(-2, 3 * ROWS * cols, ROWS * cols, g).view(ROWS, cols).to(torch.int32)
        pool, lengths = random_pool(batch, g).to(index_dtype), draw(-1, positions + 3, batch, g).to(index_dtype)
        start = draw(0, positions + 2, batch, g).to(index_dtype) if options == "start" else None
        mapping = (random_mapping("int32", 3 * ROWS * cols, entry_page_size, g) if options.endswith("mapped")
                   else None)
        total = int(draw(1, 2 * positions + 2, 1, g))
        indptr = overlapping_indptr(batch, total, positions, index_dtype, g)

        def solo(b, out):
            alone = Case(table, pool[b:b + 1], lengths[b:b + 1], 1, 0, None if start is None else start[b:b + 1])
            return loop_token_csr(alone, indptr[b:b + 1], out, entry_page_size, mapping)

        store, out = guarded((total,), out_dtype)
        token_csr(backend, table.to(DEVICE), pool.to(DEVICE), lengths.to(DEVICE), indptr.to(DEVICE), out,
                  kv_start_idx=None if start is None else start.to(DEVICE), entry_page_size=entry_page_size,
                  token_mapping=None if mapping is None else mapping.to(DEVICE))
        return assert_overlap_contract(store, covering_values(solo, batch, total, out_dtype), f"{backend} token CSR")

    over_random_draws(check_one)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("index_dtype", DTYPES)
@pytest.mark.parametrize("out_dtype", DTYPES)
@pytest.mark.parametrize("with_start", (False, True))
def test_dcp_token_csr_overlapping_rows(backend, index_dtype, out_dtype, with_start):
    def check_one(g):
        dcp_size = int(draw(1, 5, 1, g))
        rank = int(draw(0, dcp_size, 1, g))
        cols = int(draw(1, 40, 1, g))
        batch = int(draw(2, 7, 1, g))
        table = random_table(ROWS, cols, g)
        longest = -(-cols // dcp_size)
        pool, local = random_pool(batch, g).to(index_dtype), draw(-1, longest + 2, batch, g).to(index_dtype)
        start = draw(-2, cols + 2, batch, g).to(index_dtype) if with_start else None
        total = int(draw(1, 2 * longest + 2, 1, g))
        indptr = overlapping_indptr(batch, total, longest, index_dtype, g)

        def solo(b, out):
            return loop_dcp_csr(table, pool[b:b + 1], local[b:b + 1], indptr[b:b + 1], out, dcp_size, rank,
                                None if start is None else start[b:b + 1])

        store, out = guarded((total,), out_dtype)
        dcp_token_csr(backend, table.to(DEVICE), pool.to(DEVICE), local.to(DEVICE), indptr.to(DEVICE), out,
                      dcp_size=dcp_size, dcp_rank=rank, kv_start_idx=None if start is None else start.to(DEVICE))
        return assert_overlap_contract(store, covering_values(solo, batch, total, out_dtype),
                                       f"{backend} DCP token CSR")

    over_random_draws(check_one)
