"""The decode-context-parallel ops: ``create_dcp_kv_indices`` (token CSR of one rank) and
``create_dcp_page_table`` (rank-local block table), and ``dcp_local_lengths``.

The torch reference against plain loops over exact Python integers (below) on random data drawn fresh per case
(every backend against the reference on random and hostile data, the argument dtypes, ranks and devices,
``torch.compile``, opcheck and the host build's specialisations: tests/test_conformance.py); then every backend
under test on rows over several programs, the integer extremes of every index argument next to the table's
sizes, wide rows and nothing to do, into poisoned outputs with guard regions; ``dcp_local_lengths``; the ops' own
argument errors.
"""

import pytest
import torch

from kvdispatch import ops
import kvdispatch
from conftest import BACKENDS, DEVICE, dcp_page_table, dcp_token_csr
from kvcases import POISON, assert_same, wrap_int32
from kvdispatch import grid, reference
from test_extremes import (DTYPES, I32_MAX, I32_MIN, I64_MAX, ROWS, copy_to_device, extremes, guarded, middle,
                           vector)

DCP_SIZES = (1, 2, 3, 4, 8)  # 3: a divisor that is not a power of two
PAGE_SIZES = (1, 16, 7)
# A row of the CSR spans two programs at this many columns with dcp_size 2.
LONG_ROW_COLS = 2 * grid.items_per_program(grid.DCP_TOKEN_CSR) + 300


def generator():
    return torch.Generator().manual_seed(torch.seed() % 2**31)


def draw(low, high, count, g):
    return torch.randint(low, high, (count,), generator=g)


def divide(value, divisor, round_toward_zero):
    if round_toward_zero and value < 0:
        return -(-value // divisor)
    return value // divisor


def owned(start, length, dcp_size, dcp_rank):
    """Positions p of [start, start + length) with p mod dcp_size == dcp_rank, counted in exact integers (0 for
    an empty range)."""
    if length <= 0:
        return 0
    return (start + length - 1 - dcp_rank) // dcp_size - (start - 1 - dcp_rank) // dcp_size


def loop_dcp_csr(table, pool, lens, indptr, out, dcp_size, dcp_rank, start=None, round_toward_zero=False):
    """The DCP token CSR as a plain loop over exact Python integers (CPU tensors in, a new ``out`` back)."""
    rows, cols = table.shape
    values = table.tolist()
    result = out.clone()
    narrow = result.dtype == torch.int32
    for b in range(pool.shape[0]):
        row, offset, count = int(pool[b]), int(indptr[b]), int(lens[b])
        begin = int(start[b]) if start is not None else 0
        first = begin + (dcp_rank - begin) % dcp_size
        if not (0 <= row < rows and 0 <= first < cols):
            continue
        for j in range(max(0, -offset), min(count, result.shape[0] - offset)):
            position = first + j * dcp_size
            if position >= cols:
                break
            value = divide(values[row][position], dcp_size, round_toward_zero)
            result[offset + j] = wrap_int32(value) if narrow else value
    return result


def loop_dcp_page_table(table, pool, lens, out, page_size, dcp_size, dcp_rank, fill_value=None,
                        round_toward_zero=False):
    """The DCP page table as a plain loop over exact Python integers (CPU tensors in, a new ``out`` back)."""
    rows, cols = table.shape
    values = table.tolist()
    result = out.clone()
    virtual_page = page_size * dcp_size
    for b in range(pool.shape[0]):
        row, length = int(pool[b]), int(lens[b])
        pages = -(-length // page_size) if length > 0 and 0 <= row < rows else 0
        for p in range(result.shape[1]):
            position = dcp_rank + p * virtual_page
            if p < pages and position < cols:
                result[b, p] = divide(values[row][position], virtual_page, round_toward_zero)
            else:
                pages = min(pages, p)
                if fill_value is not None:
                    result[b, p] = fill_value
    return result


def to_device(*tensors):
    return [copy_to_device(t) for t in tensors]


def check_dcp_csr(backend, table, pool, lens, indptr, total, out_dtype, dcp_size, dcp_rank, start=None,
                  round_toward_zero=False):
    """The call (CPU tensors) through ``backend`` into a guarded ``out`` of ``total`` entries, against the
    reference, itself checked against the loop; ``backend`` None: the reference against the loop only."""
    store, _ = guarded((total,), out_dtype)
    expected = store.cpu().clone()
    ops.dcp_token_csr.reference(table, pool, lens, indptr, middle(expected, (total,)), dcp_size, dcp_rank,
                                      start, round_toward_zero)
    loop = loop_dcp_csr(table, pool, lens, indptr, torch.full((total,), POISON, dtype=out_dtype), dcp_size, dcp_rank,
                        start, round_toward_zero)
    assert_same(middle(expected, (total,)), loop, "reference vs loop")
    if backend is None:
        return
    table, pool, lens, indptr, start = to_device(table, pool, lens, indptr, start)
    dcp_token_csr(backend, table, pool, lens, indptr, middle(store, (total,)), dcp_size=dcp_size, dcp_rank=dcp_rank,
                  kv_start_idx=start, round_toward_zero=round_toward_zero)
    assert_same(store, expected, f"{backend} DCP token CSR (whole allocation)")


def check_dcp_page_table(backend, table, pool, lens, width, page_size, dcp_size, dcp_rank, fill_value=None,
                         round_toward_zero=False, spare_rows=0):
    """As ``check_dcp_csr`` for the DCP page table, ``width`` pages wide (``spare_rows`` rows past the batch)."""
    shape = (pool.shape[0] + spare_rows, width)
    store, _ = guarded(shape)
    expected = store.cpu().clone()
    ops.dcp_page_table.reference(table, pool, lens, middle(expected, shape), page_size, dcp_size, dcp_rank,
                                   fill_value, round_toward_zero)
    loop = loop_dcp_page_table(table, pool, lens, torch.full(shape, POISON, dtype=torch.int32), page_size, dcp_size,
                               dcp_rank, fill_value, round_toward_zero)
    assert_same(middle(expected, shape), loop, "reference vs loop")
    if backend is None:
        return
    table, pool, lens = to_device(table, pool, lens)
    dcp_page_table(backend, table, pool, lens, middle(store, shape), page_size=page_size, dcp_size=dcp_size,
                   dcp_rank=dcp_rank, fill_value=fill_value, round_toward_zero=round_toward_zero)
    assert_same(store, expected, f"{backend} DCP page table (whole allocation)")


def random_table(rows, cols, g):
    """Slot ids, mostly valid, some negative (floor and truncation differ there)."""
    table = draw(-3 * cols, 50 * cols, rows * cols, g).view(rows, cols)
    return table.to(torch.int32)


def packed_indptr(lens, gap, g):
    """``kv_indptr`` (int64, ``B + 1`` entries) with up to ``gap`` unused entries after each row, and the total."""
    sizes = lens.long().clamp(min=0) + draw(0, gap + 1, lens.shape[0], g)
    indptr = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(sizes, 0)])
    return indptr, int(indptr[-1]) + gap


def random_csr_case(index_dtype, with_start, dcp_size, g, cols=None):
    """Requests of random lengths (the rank's count of them, now and then more or less), starts now and then past
    the row, pool indices now and then outside the table."""
    cols = int(draw(1, 40, 1, g)) if cols is None else cols
    batch = int(draw(1, 6, 1, g))
    pool = draw(-1, ROWS + 1, batch, g) if int(draw(0, 3, 1, g)) == 0 else draw(0, ROWS, batch, g)
    start = draw(-2, cols + 3, batch, g) if with_start else None
    lengths = draw(-2, cols + 2, batch, g)
    rank = int(draw(0, dcp_size, 1, g))
    local = reference.dcp_owned_counts(lengths, dcp_size, rank, start).clamp(min=0)
    local += draw(-1, 3, batch, g) * (draw(0, 4, batch, g) == 0)  # now and then not the rank's count

    def cast(t):
        return None if t is None else t.to(index_dtype)
    return random_table(ROWS, cols, g), cast(pool), cast(local), cast(start), rank


@pytest.mark.parametrize("dcp_size", DCP_SIZES)
@pytest.mark.parametrize("out_dtype", DTYPES)
@pytest.mark.parametrize("with_start", (False, True))
def test_token_csr_reference_matches_the_loop(dcp_size, out_dtype, with_start):
    g = generator()
    for index_dtype, round_toward_zero in zip(DTYPES, (False, True)):
        table, pool, lens, start, rank = random_csr_case(index_dtype, with_start, dcp_size, g)
        indptr, total = packed_indptr(lens, int(draw(0, 3, 1, g)), g)
        check_dcp_csr(None, table, pool, lens, indptr.to(index_dtype), total, out_dtype, dcp_size, rank, start,
                      round_toward_zero)


@pytest.mark.parametrize("backend", BACKENDS)
def test_token_csr_rows_over_several_programs(backend):
    """Rows of more tokens than a program takes, with offsets before ``out``'s start and past its end."""
    g = generator()
    cols, dcp_size = LONG_ROW_COLS, 2
    table = random_table(ROWS, cols, g)
    lens = vector([cols // 2, cols // 2 - 7, cols], torch.int64)
    for indptr, total in (([0, cols // 2, cols], 2 * cols), ([-100, cols // 2 - 50, 2 * cols], cols)):
        check_dcp_csr(backend, table, vector([3, 1, 4], torch.int32), lens, vector(indptr, torch.int64), total,
                      torch.int64, dcp_size, 1, vector([0, 5, 2], torch.int32))


def exact_indptr(table, pool, lens, start, dcp_size, dcp_rank, gap=2):
    """``kv_indptr`` (int64) placing every request's written tokens one after another with ``gap`` entries between
    them, counted in exact integers as the contract does, and the ``out`` length that holds them all."""
    rows, cols = table.shape
    indptr, position = [], gap
    for b in range(pool.shape[0]):
        begin = int(start[b]) if start is not None else 0
        first = begin + (dcp_rank - begin) % dcp_size
        readable = 0 <= int(pool[b]) < rows and 0 <= first < cols
        indptr.append(position)
        position += (min(max(int(lens[b]), 0), -(-(cols - first) // dcp_size)) if readable else 0) + gap
    return vector(indptr + [position], torch.int64), position + gap


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("argument", ("pool", "lens", "start"))
@pytest.mark.parametrize("dtype", DTYPES)
def test_token_csr_at_the_extremes(backend, argument, dtype):
    """One request per extreme value of ``argument``, next to the table size, each row packed where the contract
    writes it: nothing wraps, rows end at the table's edge."""
    g = generator()
    cols, dcp_size = 37, 4
    values = extremes(dtype, *dict(pool=(ROWS,), lens=(cols, cols // dcp_size), start=(cols,))[argument])
    batch = len(values)
    data = dict(pool=draw(0, ROWS, batch, g).tolist(), lens=draw(0, 6, batch, g).tolist(),
                start=draw(0, 8, batch, g).tolist())
    data[argument] = values
    table = torch.randint(I32_MIN, I32_MAX, (ROWS, cols), generator=g, dtype=torch.int64).to(torch.int32)
    pool, lens, start = (vector(data[name], dtype) for name in ("pool", "lens", "start"))
    for rank, out_dtype in zip((0, dcp_size - 1), DTYPES):
        indptr, total = exact_indptr(table, pool, lens, start, dcp_size, rank)
        check_dcp_csr(backend, table, pool, lens, indptr.to(dtype), total, out_dtype, dcp_size, rank, start,
                      rank == 0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_token_csr_indptr_at_the_extremes(backend, dtype):
    """One whole-row request per extreme ``kv_indptr`` value: rows before, across and past ``out`` write only
    inside it (the offsets must not wrap into it)."""
    g = generator()
    cols, dcp_size, total = 41, 3, 12
    table = random_table(ROWS, cols, g)
    for i, value in enumerate(extremes(dtype, total, 5)):
        start = vector([i % 5], dtype) if i % 2 else None
        check_dcp_csr(backend, table, vector([ROWS - 1], dtype), vector([I64_MAX], torch.int64),
                      vector([value, 0], dtype), total, DTYPES[i % 2], dcp_size, i % dcp_size, start)


@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("dcp_size", DCP_SIZES)
def test_page_table_reference_matches_the_loop(page_size, dcp_size):
    g = generator()
    for index_dtype, fill_value, round_toward_zero in zip(DTYPES, (None, -1), (True, False)):
        virtual_page = page_size * dcp_size
        cols = int(draw(1, 5 * virtual_page, 1, g))
        batch = int(draw(1, 5, 1, g))
        pool = draw(-1, ROWS + 1, batch, g) if int(draw(0, 3, 1, g)) == 0 else draw(0, ROWS, batch, g)
        rank = int(draw(0, dcp_size, 1, g))
        lens = reference.dcp_owned_counts(draw(-2, cols + virtual_page, batch, g), dcp_size, rank)
        width = int(draw(0, 7, 1, g))
        check_dcp_page_table(None, random_table(ROWS, cols, g), pool.to(index_dtype), lens.to(index_dtype), width,
                             page_size, dcp_size, rank, fill_value, round_toward_zero, int(draw(0, 3, 1, g)))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("argument", ("pool", "lens"))
@pytest.mark.parametrize("dtype", DTYPES)
def test_page_table_at_the_extremes(backend, argument, dtype):
    g = generator()
    page_size, dcp_size, width = 3, 2, 5
    cols = 4 * page_size * dcp_size + 1
    values = extremes(dtype, *dict(pool=(ROWS,), lens=(cols, width * page_size))[argument])
    batch = len(values)
    data = dict(pool=draw(0, ROWS, batch, g).tolist(), lens=draw(1, cols, batch, g).tolist())
    data[argument] = values
    table = torch.randint(I32_MIN, I32_MAX, (ROWS, cols), generator=g, dtype=torch.int64).to(torch.int32)
    for rank, fill_value in ((0, None), (1, I32_MIN)):
        check_dcp_page_table(backend, table, vector(data["pool"], dtype), vector(data["lens"], dtype), width, page_size,
                             dcp_size, rank, fill_value, rank == 1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_page_table_wide_rows_and_nothing_to_do(backend):
    """A row over several programs (page size 1: 1024 pages per program), an empty table, a batch of 0."""
    g = generator()
    width = 2 * grid.items_per_program(grid.DCP_PAGE_TABLE, 1) + 5
    table = random_table(ROWS, 2 * width + 3, g)
    check_dcp_page_table(backend, table, vector([2, 0], torch.int64), vector([width, width - 9], torch.int32), width,
                         1, 2, 1, None, False, 1)
    check_dcp_page_table(backend, torch.zeros((ROWS, 0), dtype=torch.int32), vector([1], torch.int32),
                         vector([5], torch.int32), 3, 16, 2, 0, -1)
    check_dcp_page_table(backend, table, vector([], torch.int32), vector([], torch.int32), 3, 16, 2, 0, -1, False, 2)
    check_dcp_csr(backend, torch.zeros((0, 4), dtype=torch.int32), vector([0], torch.int32), vector([3], torch.int32),
                  vector([0], torch.int32), 4, torch.int32, 2, 1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_start", (False, True))
def test_local_lengths_count_the_rank_positions(dtype, with_start):
    """``dcp_local_lengths`` against a count in exact integers, at random and at the extremes; into ``out``."""
    g = generator()
    values = extremes(dtype, 7, 64) + draw(-70, 70, 20, g).tolist()
    lens = vector(values, dtype)
    start = vector(values[::-1], dtype) if with_start else None
    for dcp_size in (1, 3, 8):
        for rank in {0, dcp_size - 1}:
            expected = [owned(int(start[b]) if with_start else 0, int(lens[b]), dcp_size, rank)
                        for b in range(lens.shape[0])]
            got = kvdispatch.dcp_local_lengths(lens.to(DEVICE), dcp_size, rank, None if start is None else
                                               start.to(DEVICE))
            assert got.dtype == dtype and got.cpu().tolist() == expected
            for out_dtype in DTYPES:  # an int32 out saturates what it cannot hold
                out = torch.full((lens.shape[0] + 2,), POISON, dtype=out_dtype, device=DEVICE)
                assert kvdispatch.dcp_local_lengths(lens.to(DEVICE), dcp_size, rank, None if start is None else
                                                    start.to(DEVICE), out=out) is out
                held = torch.iinfo(out_dtype).max
                assert out.cpu().tolist() == [min(e, held) for e in expected] + [POISON, POISON]


def test_local_lengths_saturate_in_an_int32_out_and_refuse_a_shared_one():
    """Counts past ``2**31 - 1`` are stored as ``2**31 - 1`` in an int32 ``out`` (not their low 32 bits); an
    ``out`` whose entries share memory (an expanded view) is refused, naming it, with nothing written."""
    lens = torch.tensor([2**40 + 5, 2**33, 2**31, 2**31 - 1, 7], device=DEVICE)
    out = torch.full((6,), POISON, dtype=torch.int32, device=DEVICE)
    kvdispatch.dcp_local_lengths(lens, 1, 0, out=out)
    assert out.cpu().tolist() == [I32_MAX, I32_MAX, I32_MAX, I32_MAX, 7, POISON]
    kvdispatch.dcp_local_lengths(lens, 2, 1, out=out)
    assert out.cpu().tolist() == [I32_MAX, I32_MAX, 2**30, 2**30 - 1, 3, POISON]
    for dtype in DTYPES:
        store = torch.full((1,), POISON, dtype=dtype, device=DEVICE)
        with pytest.raises(ValueError, match="entries of out share memory: its stride is 0"):
            kvdispatch.dcp_local_lengths(lens, 2, 1, out=store.expand(6))
        assert store.item() == POISON
    one = torch.full((1,), POISON, dtype=torch.int64, device=DEVICE)
    kvdispatch.dcp_local_lengths(lens[:1], 1, 0, out=one.expand(1))  # one entry shares memory with no other
    assert one.item() == 2**40 + 5


def test_dcp_arguments_are_checked_before_anything_is_written():
    g = generator()
    table, pool, lens, start, _ = random_csr_case(torch.int32, True, 2, g, cols=9)
    table, pool, lens, start = to_device(table, pool, lens, start)
    indptr = torch.zeros(pool.shape[0] + 1, dtype=torch.int64, device=DEVICE)
    out = torch.full((20,), POISON, dtype=torch.int64, device=DEVICE)
    page_out = torch.full((pool.shape[0], 3), POISON, dtype=torch.int32, device=DEVICE)
    for size, rank, error, match in ((0, 0, ValueError, "dcp_size"), (2, 2, ValueError, "dcp_rank"),
                                     (2, -1, ValueError, "dcp_rank"), (2.0, 0, TypeError, "dcp_size"),
                                     (grid.MAX_DCP_SIZE + 1, 0, ValueError, "dcp_size")):
        with pytest.raises(error, match=match):
            kvdispatch.create_dcp_kv_indices(table, pool, lens, indptr, out, dcp_size=size, dcp_rank=rank)
        with pytest.raises(error, match=match):
            kvdispatch.create_dcp_page_table(table, pool, lens, page_out, page_size=16, dcp_size=size, dcp_rank=rank)
    with pytest.raises(ValueError, match="local_seq_lens"):
        kvdispatch.create_dcp_page_table(table, pool, lens[:-1], page_out, page_size=16, dcp_size=2, dcp_rank=0)
    with pytest.raises(ValueError, match="page_size"):
        kvdispatch.create_dcp_page_table(table, pool, lens, page_out, page_size=0, dcp_size=2, dcp_rank=0)
    with pytest.raises(TypeError, match="round_toward_zero"):
        kvdispatch.create_dcp_kv_indices(table, pool, lens, indptr, out, dcp_size=2, dcp_rank=0, round_toward_zero=1)
    with pytest.raises(ValueError, match="out shares memory with local_seq_lens"):
        shared = lens.view(torch.int32)
        kvdispatch.create_dcp_kv_indices(table, pool, lens, indptr, shared, dcp_size=2, dcp_rank=0)
    with pytest.raises(ValueError, match="dcp_rank"):
        kvdispatch.dcp_local_lengths(lens, 4, 4)
    assert (out == POISON).all() and (page_out == POISON).all()


@pytest.mark.skipif("triton" not in BACKENDS, reason="Triton is not under test")
def test_triton_compiles_once_across_batches_widths_ranks_and_strides():
    """One compilation per kernel for one specialisation (DCP size, page size, dtypes, options), whatever the
    batch, the table's width and row stride, ``out``'s length or width and row stride, and the rank."""
    from kernels_triton import dcp as triton_dcp
    from kernels_triton import launch as triton_launch

    triton_launch.reset(compiled=True)
    g = generator()
    dcp_size, page_size = 4, 16
    for batch, cols, width, gap in ((1, 5, 1, 0), (3, 64, 7, 2), (6, 150, 3, 5), (2, 97, 12, 1)):
        rank = int(draw(0, dcp_size, 1, g))
        table = random_table(ROWS, cols, g)  # its row stride is its width
        pool = draw(0, ROWS, batch, g)
        start = draw(0, 6, batch, g)
        lens = reference.dcp_owned_counts(draw(0, cols + 1, batch, g), dcp_size, rank, start).clamp(min=0)
        indptr, total = packed_indptr(lens, gap, g)
        check_dcp_csr("triton", table, pool, lens, indptr, total, torch.int64, dcp_size, rank, start)
        # out's row stride is its width plus the guards
        check_dcp_page_table("triton", table, pool, lens, width, page_size, dcp_size, rank, spare_rows=gap)
    assert triton_dcp.csr_launcher.compile_count == 1
    assert triton_dcp.table_launcher.compile_count == 1
