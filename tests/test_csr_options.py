"""The token CSR options: an int64 ``out``, ``entry_page_size`` and ``token_mapping``.

The torch reference against the plain loop of ``tests/kvcases.py`` on random data drawn fresh per case (every
backend against the reference with the options on, inputs unchanged: tests/test_conformance.py); then every
backend under test, into poisoned outputs with guard regions (``test_extremes.check_token_csr``, which also checks
the reference against the loop), on the integer extremes of lengths, starts, pointers, table entries and mapping
values with the options, and nothing to do.
"""

import pytest
import torch

from conftest import BACKENDS, DEVICE, token_csr
from kvcases import POISON, Case
from test_extremes import (CSR_COLS, DTYPES, I32_MAX, I32_MIN, I64_MAX, I64_MIN, ROWS, check_token_csr, extremes,
                           on_device, packed_indptr, vector)

ENTRY_PAGE_SIZES = (1, 16, 32, 64, 128, 96, 7)  # powers of two (shifts), 96 and 7 (divisions)
MAPPINGS = (None, "int32", "int64")


def generator():
    return torch.Generator().manual_seed(torch.seed() % 2**31)


def draw(low, high, count, g):
    return torch.randint(low, high, (count,), generator=g)


def random_mapping(dtype_name, pages, entry_page_size, g):
    """A mapping that covers most slots ``page * E + offset`` of ``pages`` pages, not all of them (values
    past it read -1), with arbitrary values of its dtype, extremes included."""
    if dtype_name is None:
        return None
    dtype = getattr(torch, dtype_name)
    size = int(draw(1, pages * entry_page_size + 1, 1, g))
    info = torch.iinfo(dtype)
    values = torch.randint(info.min, info.max, (size,), generator=g, dtype=torch.int64)
    values[: min(size, 4)] = torch.tensor([info.min, info.max, -1, 0])[: min(size, 4)]
    return values[torch.randperm(size, generator=g)].to(dtype)


def random_case(index_dtype, with_start, entry_page_size, g):
    """A few requests over a page-granular table (random page ids, some negative or past the pool), with
    lengths and starts that run past a row's ``C * E`` positions now and then."""
    cols = int(draw(1, 12, 1, g))
    pages = 3 * ROWS * cols
    table = draw(-2, pages + 2, ROWS * cols, g).view(ROWS, cols).to(torch.int32)
    batch = int(draw(1, 6, 1, g))
    positions = cols * entry_page_size
    pool = draw(-1, ROWS + 1, batch, g) if int(draw(0, 4, 1, g)) == 0 else draw(0, ROWS, batch, g)
    lengths = draw(-1, positions + 3, batch, g)
    start = draw(0, positions + 2, batch, g) if with_start else None
    case = Case(table, pool.to(index_dtype), lengths.to(index_dtype), 1, 0,
                None if start is None else start.to(index_dtype))
    return case, pages


@pytest.mark.representative("entry_page_size", "mapping")
@pytest.mark.parametrize("out_dtype", DTYPES)
@pytest.mark.parametrize("entry_page_size", ENTRY_PAGE_SIZES)
@pytest.mark.parametrize("mapping", MAPPINGS)
@pytest.mark.parametrize("with_start", (False, True))
def test_reference_with_options_matches_the_loop(out_dtype, entry_page_size, mapping, with_start):
    g = generator()
    for index_dtype in DTYPES:
        case, pages = random_case(index_dtype, with_start, entry_page_size, g)
        indptr, total = packed_indptr(case, gap=int(draw(0, 3, 1, g)), entry_page_size=entry_page_size)
        check_token_csr(None, case, indptr.to(index_dtype), total, out_dtype, entry_page_size,
                        random_mapping(mapping, pages, entry_page_size, g))


@pytest.mark.representative("entry_page_size", "argument")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("entry_page_size", (16, 96, 4096))
@pytest.mark.parametrize("argument", ("lens", "start"))
@pytest.mark.parametrize("dtype", DTYPES)
def test_lengths_and_starts_at_the_extremes(backend, entry_page_size, argument, dtype):
    """Lengths and starts at the int32/int64 limits and next to a row's ``C * E`` positions: rows cut
    exactly there, starts past it give empty rows, nothing wraps."""
    g = generator()
    cols = 3
    values = extremes(dtype, cols * entry_page_size, CSR_COLS)
    batch = len(values)
    data = dict(lens=draw(1, cols * entry_page_size + 1, batch, g).tolist(),
                start=draw(0, entry_page_size, batch, g).tolist())
    data[argument] = values
    table = draw(0, 50, ROWS * cols, g).view(ROWS, cols).to(torch.int32)
    case = Case(table, vector(draw(0, ROWS, batch, g).tolist(), dtype), vector(data["lens"], dtype), 1, 0,
                vector(data["start"], dtype))
    indptr, total = packed_indptr(case, entry_page_size=entry_page_size)
    for out_dtype in DTYPES:
        check_token_csr(backend, case, indptr.to(dtype), total, out_dtype, entry_page_size)


@pytest.mark.representative("entry_page_size", "mapping")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("entry_page_size", (1, 64, 7))
@pytest.mark.parametrize("mapping", MAPPINGS)
@pytest.mark.parametrize("out_dtype", DTYPES)
def test_values_at_the_extremes(backend, entry_page_size, mapping, out_dtype):
    """Table entries at the int32 limits (``entry * E`` far past 32 bits), mapping values at their dtype's
    limits and slots just inside, at and past the mapping's end: exact in int64, the low 32 bits in int32,
    -1 outside the mapping."""
    g = generator()
    cols = 8
    mapping_size = 5 * entry_page_size
    entries = [I32_MIN, I32_MAX, -1, 0, 4, 5, 6, I32_MIN + 1, I32_MAX - 1, 1 << 24]
    table = torch.tensor([entries[(r + c) % len(entries)] for r in range(ROWS) for c in range(cols)],
                         dtype=torch.int64).view(ROWS, cols).to(torch.int32)
    token_mapping = random_mapping(mapping, mapping_size, 1, g)
    if token_mapping is not None:
        token_mapping = token_mapping[:mapping_size] if token_mapping.shape[0] >= mapping_size else torch.cat(
            [token_mapping, token_mapping.new_full((mapping_size - token_mapping.shape[0],), -5)])
        info = torch.iinfo(token_mapping.dtype)
        token_mapping[-1], token_mapping[0] = info.max, info.min  # the last and first slots inside
    case = Case(table, vector(list(range(ROWS)), torch.int64), vector([cols * entry_page_size] * ROWS, torch.int64),
                1, 0)
    indptr, total = packed_indptr(case, entry_page_size=entry_page_size)
    check_token_csr(backend, case, indptr, total, out_dtype, entry_page_size, token_mapping)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("entry_page_size", (1, 16, 7))
@pytest.mark.parametrize("dtype", DTYPES)
def test_indptr_at_the_extremes(backend, entry_page_size, dtype):
    """One full-row request per extreme ``kv_indptr`` value with the options on: rows before, across and
    past ``out`` write only inside it."""
    g = generator()
    cols = CSR_COLS // entry_page_size + 1
    total = cols * entry_page_size
    table = draw(0, 1000, ROWS * cols, g).view(ROWS, cols).to(torch.int32)
    token_mapping = torch.randperm(900 * entry_page_size, generator=g)
    for value in extremes(dtype, total, total // 2, 5)[::2]:
        case = Case(table, vector([ROWS - 1], dtype), vector([I64_MAX], torch.int64), 1, 0)
        check_token_csr(backend, case, vector([value, 0], dtype), total, torch.int64, entry_page_size, token_mapping)


@pytest.mark.parametrize("backend", BACKENDS)
def test_int64_out_without_options_and_nothing_to_do(backend):
    """An int64 ``out`` alone, an empty table, a batch of 0 and a mapping of 0 entries (every value -1)."""
    g = generator()
    for rows, cols in ((0, 4), (ROWS, 0)):
        case = Case(torch.zeros((rows, cols), dtype=torch.int32), vector([0, 1], torch.int64),
                    vector([5, I64_MAX], torch.int64), 1, 0)
        check_token_csr(backend, case, vector([0, 3, 5], torch.int64), 8, torch.int64, 16, torch.arange(9))
    case, _ = random_case(torch.int32, True, 16, g)
    indptr, total = packed_indptr(case, entry_page_size=16)
    check_token_csr(backend, case, indptr, total, torch.int64)
    check_token_csr(backend, case, indptr, total, torch.int32, 16, torch.zeros(0, dtype=torch.int64))
    empty = Case(case.req_to_token, vector([], torch.int64), vector([], torch.int64), 1, 0)
    check_token_csr(backend, empty, vector([I64_MIN], torch.int64), 6, torch.int64, 7, torch.arange(4))


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_options_write_nothing(backend):
    case, _ = random_case(torch.int32, False, 1, generator())
    indptr, total = packed_indptr(case)
    case, indptr = on_device(case), indptr.to(DEVICE)
    out = torch.full((total,), POISON, dtype=torch.int64, device=DEVICE)
    with pytest.raises(ValueError, match="entry_page_size"):
        token_csr(backend, case.req_to_token, case.req_pool_indices, case.seq_lens, indptr, out, entry_page_size=0)
    with pytest.raises(ValueError, match="token_mapping"):
        token_csr(backend, case.req_to_token, case.req_pool_indices, case.seq_lens, indptr, out,
                  token_mapping=out)
    assert (out == POISON).all()
