"""The mapped page tables: ``create_trtllm_mha_page_table`` (with its SWA twin) and ``create_translated_page_table``.

The torch reference against the plain loops below (exact Python integers) on random data drawn fresh per case
(every backend against the reference on random and hostile data, the argument dtypes, ranks and devices,
``torch.compile``, opcheck and the host build's specialisations: tests/test_conformance.py). Then every backend
under test on each argument at the int32/int64 extremes and next to the table's sizes, the lookups' value
extremes, empty lookups, tables and outputs, the 2**31 edge of the Triton kernel's packed words, into outputs in
the middle of larger poisoned allocations (``test_extremes.guarded``), and the op's own argument errors.
"""

import pytest
import torch

from kvdispatch import ops
from conftest import BACKENDS, DEVICE, mha_page_table, translated_page_table
from kvcases import POISON, assert_same, wrap_int32
from test_extremes import (DTYPES, I32_MAX, I32_MIN, I64_MAX, I64_MIN, ROWS, copy_to_device, extremes, guarded,
                           middle, vector)

PAGE_SIZES = (1, 16, 64, 96, 7)  # powers of two (shifts), 96 and 7 (divisions)


def generator():
    return torch.Generator().manual_seed(torch.seed() % 2**31)


def draw(low, high, count, g):
    return torch.randint(low, high, (count,), generator=g)


def _cdiv(a, b):
    return -(-a // b)


def _quotient(value, page_size, round_toward_zero):
    quotient = value // page_size
    return -(-value // page_size) if round_toward_zero and value < 0 else quotient


def _row_pages(table, pool, length, page_size):
    """Pages of a request as the contract counts them: its length's pages, cut where the table row ends;
    none for a bad pool index or a length <= 0."""
    rows, cols = len(table), len(table[0]) if table else 0
    if not 0 <= pool < rows or length <= 0:
        return 0
    return min(_cdiv(length, page_size), _cdiv(cols, page_size))


def loop_mha(table, pool, lens, page_table, swa_page_table, full_to_swa, page_size, round_toward_zero):
    """The MHA page table contract as plain loops; returns the expected (page_table, swa_page_table)."""
    table, result = table.tolist(), page_table.clone()
    swa = None if swa_page_table is None else swa_page_table.clone()
    mapping = None if full_to_swa is None else full_to_swa.tolist()
    for b, (row, length) in enumerate(zip(pool.tolist(), lens.tolist())):
        for p in range(_row_pages(table, row, length, page_size)):
            slot = table[row][p * page_size]
            if p < result.shape[1]:
                result[b, p] = _quotient(slot, page_size, round_toward_zero)
            if mapping and p < swa.shape[1]:
                mapped = mapping[min(max(slot, 0), len(mapping) - 1)]
                swa[b, p] = wrap_int32(_quotient(mapped, page_size, round_toward_zero))
    return result, swa


def loop_translated(table, pool, lens, v2p, out, page_size, multiplier, max_pages, seq_len_delta, fill_value=None):
    """The translated page table contract as plain loops; returns the expected ``out``."""
    table, lookup, result = table.tolist(), v2p.tolist(), out.clone()
    columns = out.shape[1] if max_pages is None else max_pages
    for b, (row, length) in enumerate(zip(pool.tolist(), lens.tolist())):
        live = min(_row_pages(table, row, length + seq_len_delta, page_size), columns)
        for c in range(live):
            token = table[row][c * page_size]
            page = 0 if token < 0 else token // page_size
            result[b, c] = min(max(lookup[page] * multiplier, 0), I32_MAX) if page < len(lookup) else 0
        if fill_value is not None:
            result[b, live:columns] = fill_value
    return result


def check_mha(backend, table, pool, lens, width, page_size, swa_width=None, full_to_swa=None,
              round_toward_zero=False, rows=None):
    """One call of ``backend`` (CPU inputs, copied to DEVICE) into guarded tables of ``rows`` rows (the batch
    when None), against the reference on the same poisoned allocations and the loop; ``backend`` None: the
    reference against the loop only."""
    batch = pool.shape[0]
    rows = batch if rows is None else rows
    store, _ = guarded((rows, width))
    swa_store = None if swa_width is None else guarded((rows, swa_width))[0]
    expected = store.cpu().clone()
    expected_swa = None if swa_store is None else swa_store.cpu().clone()

    def view(allocation, columns):
        return None if allocation is None else middle(allocation, (rows, columns))
    ops.mha_page_table.reference(table, pool, lens, view(expected, width), page_size,
                                   view(expected_swa, swa_width), full_to_swa, round_toward_zero)
    loop_table, loop_swa = loop_mha(table, pool, lens, torch.full((rows, width), POISON, dtype=torch.int32),
                                    None if swa_width is None else torch.full((rows, swa_width), POISON,
                                                                              dtype=torch.int32),
                                    full_to_swa, page_size, round_toward_zero)
    assert_same(view(expected, width), loop_table, "reference vs loop (page_table)")
    if swa_width is not None:
        assert_same(view(expected_swa, swa_width), loop_swa, "reference vs loop (swa_page_table)")
    if backend is None:
        return

    move = copy_to_device
    result = mha_page_table(backend, move(table), move(pool), move(lens), view(store, width), page_size=page_size,
                            swa_page_table=view(swa_store, swa_width), full_to_swa=move(full_to_swa),
                            round_toward_zero=round_toward_zero)
    assert result.data_ptr() == view(store, width).data_ptr()
    assert_same(store, expected, f"{backend} page_table (whole allocation)")
    if swa_store is not None:
        assert_same(swa_store, expected_swa, f"{backend} swa_page_table (whole allocation)")


def check_translated(backend, table, pool, lens, v2p, width, page_size, multiplier=1, max_pages=None,
                     seq_len_delta=0, rows=None, fill_value=None):
    """As ``check_mha``, for the translated page table."""
    batch = pool.shape[0]
    rows = batch if rows is None else rows
    store, view = guarded((rows, width))
    expected = store.cpu().clone()
    ops.translated_page_table.reference(table, pool, lens, v2p, middle(expected, (rows, width)), page_size,
                                          multiplier, max_pages, seq_len_delta, fill_value)
    loop = loop_translated(table, pool, lens, v2p, torch.full((rows, width), POISON, dtype=torch.int32), page_size,
                           multiplier, max_pages, seq_len_delta, fill_value)
    assert_same(middle(expected, (rows, width)), loop, "reference vs loop")
    if backend is None:
        return
    move = copy_to_device
    result = translated_page_table(backend, move(table), move(pool), move(lens), move(v2p), view,
                                   page_size=page_size, multiplier=multiplier, max_pages=max_pages,
                                   seq_len_delta=seq_len_delta, fill_value=fill_value)
    assert result.data_ptr() == view.data_ptr()
    assert_same(store, expected, f"{backend} translated page table (whole allocation)")


def random_table(page_size, g, slots=None, negative=True):
    """A ``[ROWS, C]`` table of slot ids below ``slots`` (some negative), C a few pages and a bit."""
    cols = int(draw(1, 5, 1, g)) * page_size + int(draw(0, page_size, 1, g)) + 1
    slots = slots if slots is not None else ROWS * cols
    return draw(-3 if negative else 0, slots, ROWS * cols, g).view(ROWS, cols).to(torch.int32)


def random_requests(table, page_size, index_dtype, g, bad_pools=True):
    """``(pool, lens)``: a few requests, some with pool indices outside the table and lengths <= 0 or past it."""
    rows, cols = table.shape
    batch = int(draw(1, 6, 1, g))
    pool = draw(-1, rows + 1, batch, g) if bad_pools and int(draw(0, 3, 1, g)) == 0 else draw(0, rows, batch, g)
    lens = draw(-1, cols + 2 * page_size, batch, g)
    return pool.to(index_dtype), lens.to(index_dtype)


def random_lookup(dtype, size, g):
    """``size`` random values of ``dtype``, its extremes and -1 among them."""
    info = torch.iinfo(dtype)
    values = torch.randint(-5, 1 << 20, (size,), generator=g, dtype=torch.int64)
    values[: min(size, 4)] = torch.tensor([info.min, info.max, -1, 0])[: min(size, 4)]
    return values[torch.randperm(size, generator=g)].to(dtype)


# -- the TRT-LLM MHA page table -----------------------------------------------------------------------------

@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("swa", (None, "int32", "int64"))
@pytest.mark.parametrize("round_toward_zero", (False, True))
def test_mha_reference_matches_the_loop(page_size, swa, round_toward_zero):
    g = generator()
    for index_dtype in DTYPES:
        table = random_table(page_size, g)
        pool, lens = random_requests(table, page_size, index_dtype, g)
        pages = _cdiv(table.shape[1], page_size)
        width = int(draw(0, pages + 2, 1, g))
        swa_width = full_to_swa = None
        if swa is not None:
            swa_width = int(draw(0, pages + 2, 1, g))
            full_to_swa = random_lookup(getattr(torch, swa), int(draw(1, table.numel() + 2, 1, g)), g)
        check_mha(None, table, pool, lens, width, page_size, swa_width, full_to_swa, round_toward_zero,
                  rows=pool.shape[0] + int(draw(0, 3, 1, g)))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("argument", ("pool", "lens"))
@pytest.mark.parametrize("dtype", DTYPES)
def test_mha_index_extremes(backend, argument, dtype):
    """Pool indices and lengths at the int32/int64 limits and next to the table's sizes: empty rows, rows cut
    at the table's end, nothing read or written outside."""
    g = generator()
    page_size, cols = 16, 40
    values = extremes(dtype, ROWS, cols, 3 * page_size)
    batch = len(values)
    data = dict(pool=draw(0, ROWS, batch, g).tolist(), lens=draw(1, cols + 1, batch, g).tolist())
    data[argument] = values
    table = random_table(page_size, g)[:, :1].expand(ROWS, cols).contiguous() + torch.arange(cols, dtype=torch.int32)
    check_mha(backend, table, vector(data["pool"], dtype), vector(data["lens"], dtype), 4, page_size, 3,
              random_lookup(torch.int64, 50, g), True)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("page_size", (1, 64, 7))
@pytest.mark.parametrize("mapping_dtype", DTYPES)
@pytest.mark.parametrize("round_toward_zero", (False, True))
def test_mha_value_extremes(backend, page_size, mapping_dtype, round_toward_zero):
    """Slots at the int32 limits (clamped into the mapping: its first and last entries), mapping values at
    their dtype's limits (the quotient's low 32 bits), and an empty mapping (nothing written into the SWA table)."""
    cols = 6 * page_size
    entries = [I32_MIN, I32_MAX, -1, 0, 4, 5, 6, I32_MIN + 1, I32_MAX - 1, -page_size - 1]
    table = torch.tensor([entries[(r + c) % len(entries)] for r in range(ROWS) for c in range(cols)],
                         dtype=torch.int64).view(ROWS, cols).to(torch.int32)
    info = torch.iinfo(mapping_dtype)
    mapping = vector([info.min, info.max, -1, -page_size - 1, 7, info.max - 3, info.min + 5], mapping_dtype)
    pool, lens = vector(list(range(ROWS)), torch.int64), vector([cols] * ROWS, torch.int32)
    for full_to_swa in (mapping, mapping[:1], mapping[:0]):
        check_mha(backend, table, pool, lens, 6, page_size, 7, full_to_swa, round_toward_zero)


@pytest.mark.parametrize("backend", BACKENDS)
def test_mha_nothing_to_do(backend):
    """An empty batch, zero-width tables, an empty table: nothing is written."""
    g = generator()
    table = random_table(16, g)
    empty = vector([], torch.int64)
    check_mha(backend, table, empty, empty, 5, 16, 3, random_lookup(torch.int64, 9, g), rows=2)
    pool, lens = random_requests(table, 16, torch.int32, g)
    check_mha(backend, table, pool, lens, 0, 16, 0, random_lookup(torch.int64, 9, g))
    check_mha(backend, torch.zeros((0, 4), dtype=torch.int32), pool, lens, 3, 16, 2, random_lookup(torch.int32, 3, g))
    check_mha(backend, torch.zeros((ROWS, 0), dtype=torch.int32), pool, lens, 3, 16)


# -- the translated page table ------------------------------------------------------------------------------

@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("v2p_dtype", DTYPES)
@pytest.mark.parametrize("multiplier,max_pages,seq_len_delta", [(1, None, 0), (4, "some", 3), (1, "all", -2),
                                                                (3, None, 0)])
def test_translated_reference_matches_the_loop(page_size, v2p_dtype, multiplier, max_pages, seq_len_delta):
    g = generator()
    for index_dtype in DTYPES:
        table = random_table(page_size, g)
        pool, lens = random_requests(table, page_size, index_dtype, g)
        virtual_pages = _cdiv(ROWS * table.shape[1], page_size)
        v2p = random_lookup(v2p_dtype, int(draw(1, virtual_pages + 2, 1, g)), g)  # some pages past it
        width = _cdiv(table.shape[1], page_size) + int(draw(0, 3, 1, g))
        pages = dict(some=int(draw(0, width + 1, 1, g)), all=width).get(max_pages)
        check_translated(None, table, pool, lens, v2p, width, page_size, multiplier, pages, seq_len_delta,
                         rows=pool.shape[0] + int(draw(0, 3, 1, g)))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("argument", ("pool", "lens", "delta"))
@pytest.mark.parametrize("dtype", DTYPES)
def test_translated_index_extremes(backend, argument, dtype):
    """Pool indices, lengths and the length delta at the limits: ``L + delta`` is exact, rows end at the
    table's last page, nothing is read or written outside."""
    g = generator()
    page_size, cols = 16, 40
    values = extremes(dtype, ROWS, cols, 3 * page_size)
    batch = len(values)
    data = dict(pool=draw(0, ROWS, batch, g).tolist(), lens=draw(1, cols + 1, batch, g).tolist())
    if argument != "delta":
        data[argument] = values
    table = random_table(page_size, g, negative=True)
    v2p = random_lookup(torch.int64, ROWS * cols // page_size, g)
    for delta in ((I32_MAX, I32_MIN, -1, 1) if argument == "delta" else (0,)):
        lens = vector(extremes(dtype, cols)[:batch] + [1] * max(0, batch - len(extremes(dtype, cols))), dtype) \
            if argument == "delta" else vector(data["lens"], dtype)
        check_translated(backend, table, vector(data["pool"], dtype), lens, v2p, 4, page_size, 1, None, delta)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("v2p_dtype", DTYPES)
@pytest.mark.parametrize("multiplier", (1, 0, -1, 3, I32_MAX, I32_MIN))
def test_translated_value_extremes(backend, v2p_dtype, multiplier):
    """Physical pages at their dtype's limits times every multiplier extreme: the product saturates at
    ``2**31 - 1`` or 0, never wraps; negative tokens read virtual page 0; an empty map gives 0 everywhere."""
    page_size, cols = 4, 24
    info = torch.iinfo(v2p_dtype)
    v2p = vector([info.max, info.min, -1, 0, 1, 2**31 - 1 if v2p_dtype == torch.int32 else 2**40, info.max - 1,
                  info.min + 1], v2p_dtype)
    tokens = [I32_MIN, -1, 0, 3, 4, 9, 31, 32, I32_MAX, 28, 12, 20]  # virtual pages 0 .. 7, and far past the map
    table = torch.tensor([tokens[(r + c) % len(tokens)] for r in range(ROWS) for c in range(cols)],
                         dtype=torch.int64).view(ROWS, cols).to(torch.int32)
    pool, lens = vector(list(range(ROWS)), torch.int32), vector([cols] * ROWS, torch.int64)
    for lookup in (v2p, v2p[:0]):
        check_translated(backend, table, pool, lens, lookup, 7, page_size, multiplier)


@pytest.mark.parametrize("backend", BACKENDS)
def test_translated_nothing_to_do(backend):
    g = generator()
    table = random_table(16, g)
    pool, lens = random_requests(table, 16, torch.int64, g)
    v2p = random_lookup(torch.int64, 40, g)
    empty = vector([], torch.int64)
    check_translated(backend, table, empty, empty, v2p, 5, 16, rows=2)
    check_translated(backend, table, pool, lens, v2p, 5, 16, max_pages=0)
    check_translated(backend, table, pool, lens, v2p, 0, 16)
    check_translated(backend, torch.zeros((0, 3), dtype=torch.int32), pool, lens, v2p, 4, 16)


def test_translated_packed_words_hold_32_bit_fields_or_nothing():
    """The Triton kernel's two parameter words, rows | row stride << 32 and page limit | out row stride << 32;
    None (the full-width parameters) as soon as one value, the map's length included, reaches 2**31."""
    mapped_tables = pytest.importorskip("kernels_triton.mapped_tables")
    top = 2**31 - 1
    packed_table, packed_out = mapped_tables.translated_packed_words(top, top - 1, 7, top, top)
    assert (packed_table & 0xFFFFFFFF, packed_table >> 32, packed_out & 0xFFFFFFFF, packed_out >> 32) == \
        (top, top - 1, 7, top)
    for wide in range(5):
        values = [1] * 5
        values[wide] = top + 1
        assert mapped_tables.translated_packed_words(*values) is None, values


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("edge", ("rows 2**31 - 1", "rows 2**31 + 5", "row stride 2**31 - 1", "row stride 2**31",
                                  "out stride 2**31"))
def test_translated_tables_at_the_2_31_edge(backend, edge):
    """Tables and outputs at the edge of the Triton kernel's packed words (no memory behind them: one row
    expanded to about 2**31 rows, or one row with a huge row stride): below it the packed words, at it the
    full-width parameters; int64 pool indices past 2**31 are read, the ones past the table are not."""
    page_size, cols = 16, 300
    row = torch.arange(cols, dtype=torch.int32) * 3 - 20
    size = 2**31 - 1 if edge.endswith("- 1") else 2**31 + (5 if edge.startswith("rows") else 0)
    if edge.startswith("rows"):
        table = row.expand(size, cols)
        pool = vector([size - 1, size, 3, -1, 2**32 + 1, 2**31 - 2], torch.int64)
    else:
        table = row.as_strided((1, cols), (size if edge.startswith("row stride") else cols, 1))
        pool = vector([0, 1, 0, -1, 2**32, 0], torch.int64)
    lens = vector([cols, 40, 17, cols, cols, 290], torch.int64)
    v2p = random_lookup(torch.int32, 40, generator())
    width = 20
    if edge.startswith("out stride"):  # one output row: no memory behind its stride
        pool, lens = pool[:1], lens[:1]
        store = torch.full((width,), POISON, dtype=torch.int32)
        expected = store.as_strided((1, width), (size, 1)).clone()
        ops.translated_page_table.reference(table, pool, lens, v2p, expected, page_size, 2)
        store = store.to(DEVICE)
        out = store.as_strided((1, width), (size, 1))
    else:
        expected = torch.full((pool.shape[0], width), POISON, dtype=torch.int32)
        ops.translated_page_table.reference(table, pool, lens, v2p, expected, page_size, 2)
        out = torch.full_like(expected, POISON, device=DEVICE)
    moved = [t.to(DEVICE) for t in (pool, lens, v2p)]
    table = row.to(DEVICE).expand(size, cols) if edge.startswith("rows") else \
        row.to(DEVICE).as_strided(table.shape, table.stride())
    for _ in range(2):  # the second call takes the launch plan
        out.fill_(POISON)
        translated_page_table(backend, table, moved[0], moved[1], moved[2], out, page_size=page_size, multiplier=2)
        assert torch.equal(out.cpu(), expected), edge


# -- argument errors ----------------------------------------------------------------------------------------

def _valid(g):
    table = random_table(16, g, negative=False).to(DEVICE)
    pool, lens = (t.to(DEVICE) for t in random_requests(table, 16, torch.int64, g, bad_pools=False))
    rows = pool.shape[0]
    return table, pool, lens, torch.full((rows, 4), POISON, dtype=torch.int32, device=DEVICE)


@pytest.mark.parametrize("backend", BACKENDS)
def test_mha_argument_errors_write_nothing(backend):
    table, pool, lens, out = _valid(generator())
    swa = torch.full_like(out, POISON)
    mapping = torch.arange(100, device=DEVICE)
    bad = [
        (ValueError, "full_to_swa", dict(swa_page_table=swa)),
        (ValueError, "swa_page_table", dict(full_to_swa=mapping)),
        (ValueError, "swa_page_table", dict(swa_page_table=swa[:0], full_to_swa=mapping)),
        (ValueError, "full_to_swa", dict(swa_page_table=swa, full_to_swa=mapping[::2])),
        (ValueError, "shares memory", dict(swa_page_table=out, full_to_swa=mapping)),
        (ValueError, "page_size", dict(page_size=0)),
        (TypeError, "round_toward_zero", dict(round_toward_zero=1)),
    ]
    for error, text, options in bad:
        options = dict(dict(page_size=16), **options)
        with pytest.raises(error, match=text):
            mha_page_table(backend, table, pool, lens, out, **options)
    with pytest.raises(ValueError, match="shares memory"):
        mha_page_table(backend, table, pool, lens, table[:, :4], page_size=16)
    assert (out == POISON).all() and (swa == POISON).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_translated_argument_errors_write_nothing(backend):
    table, pool, lens, out = _valid(generator())
    v2p = torch.arange(100, device=DEVICE)
    bad = [
        (ValueError, "v2p", dict(v2p=v2p[::2])),
        (ValueError, "max_pages", dict(max_pages=5)),
        (ValueError, "max_pages", dict(max_pages=-1)),
        (ValueError, "multiplier", dict(multiplier=2**31)),
        (TypeError, "multiplier", dict(multiplier=1.0)),
        (ValueError, "seq_len_delta", dict(seq_len_delta=-(2**31) - 1)),
        (ValueError, "page_size", dict(page_size=4097)),
        (ValueError, "shares memory", dict(v2p=out.view(-1))),
    ]
    for error, text, options in bad:
        options = dict(dict(v2p=v2p, page_size=16), **options)
        with pytest.raises(error, match=text):
            translated_page_table(backend, table, pool, lens, options.pop("v2p"), out, **options)
    with pytest.raises(ValueError, match="out must have at least"):
        translated_page_table(backend, table, pool, lens, v2p, out[:0], page_size=16)
    assert (out == POISON).all()


def test_int64_values_past_32_bits_in_the_loop_oracles():
    """The loops hold exact integers: the saturation and the low-32-bit store are theirs, not torch's."""
    assert loop_translated(torch.tensor([[8]], dtype=torch.int32), torch.tensor([0]), torch.tensor([1]),
                           torch.tensor([I64_MAX, 0, 1 << 40]), torch.zeros((1, 1), dtype=torch.int32), 4, 2**31 - 1,
                           None, 0).tolist() == [[I32_MAX]]
    _, swa = loop_mha(torch.tensor([[I32_MAX]], dtype=torch.int32), torch.tensor([0]), torch.tensor([1]),
                      torch.zeros((1, 1), dtype=torch.int32), torch.zeros((1, 1), dtype=torch.int32),
                      torch.tensor([I64_MIN]), 1, False)
    assert swa.tolist() == [[0]]


@pytest.mark.skipif("triton" not in BACKENDS, reason="Triton is not under test")
def test_triton_compiles_once_across_batches_widths_and_strides():
    """One compilation per kernel for one specialisation (page size, dtypes, options), whatever the batch, the
    table's width and row stride (its width), the output widths and row strides (``guarded``: the width plus the
    guards), ``max_pages``, the lookup's length and the multiplier's and delta's values."""
    from kernels_triton import launch as triton_launch
    from kernels_triton import mapped_tables as triton_mapped

    triton_launch.reset(compiled=True)
    g = generator()
    page_size = 16
    for width, swa_width, max_pages, multiplier, delta in ((1, 1, 1, 2, 1), (7, 3, 5, 3, -2), (12, 12, 12, 5, 7),
                                                           (4, 9, 0, -1, 3)):
        table = random_table(page_size, g)
        pool, lens = random_requests(table, page_size, torch.int64, g, bad_pools=False)
        mapping = random_lookup(torch.int64, int(draw(1, 200, 1, g)), g)
        check_mha("triton", table, pool, lens, width, page_size, swa_width, mapping, rows=pool.shape[0] + 1)
        v2p = random_lookup(torch.int32, int(draw(1, 200, 1, g)), g)
        check_translated("triton", table, pool, lens, v2p, width, page_size, multiplier, min(max_pages, width), delta)
    assert triton_mapped.mha_launcher.compile_count == 1
    assert triton_mapped.translated_launcher.compile_count == 1
