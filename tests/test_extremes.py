"""Integer extremes: every index argument at the int32/int64 limits and next to the table and output sizes.

Every backend under test against the torch reference, which is itself checked against the plain loops of
``tests/kvcases.py`` (exact Python integers). Outputs are views in the middle of larger poisoned allocations,
so a write outside them shows. Also: empty tables and outputs, ``KVDISPATCH_DEBUG`` at the extremes, and the
reference's cost on a large, sparse CSR output.

The contract: ``L_b = seq_lens[b] + seqlen_offset``, start positions and ``kv_indptr[b] + j`` are exact
integers; a pool index outside ``[0, R)`` or ``L_b <= 0`` gives an empty row, a source position outside
``[0, C)`` ends the row, and nothing is written outside ``out``.
"""

import time

import pytest
import torch

from kvdispatch import ops
import kvdispatch
from conftest import (BACKENDS, DEVICE, dcp_page_table, dcp_token_csr, mha_page_table, page_table, token_csr,
                      translated_page_table)
from kvdispatch import grid
from kvcases import POISON, Case, assert_same, loop_page_table, loop_token_csr

I32_MIN, I32_MAX = -(2**31), 2**31 - 1
I64_MIN, I64_MAX = -(2**63), 2**63 - 1
LIMITS = (0, 1, -1, I32_MAX, -I32_MAX, I32_MIN, 2**62, -(2**62), I64_MAX, I64_MIN, I64_MIN + 1)
SCALARS = (0, 1, -1, I32_MAX, -I32_MAX, I32_MIN)  # seqlen_offset and fill_value are 32-bit
DTYPES = (torch.int32, torch.int64)
GUARD = 4  # poisoned entries on every side of an output; a multiple of 4 keeps rows 16-byte aligned
ROWS = 5

# Page table geometries: (page size, table columns, output width). The last one has whole programs of
# pages inside the table (page 1 copies them with wide accesses, no masks).
PAGE1_PROGRAM = grid.items_per_program(grid.PAGE_TABLE, 1)
PAGE_GEOMETRIES = {"page1": (1, 40, 45), "page3": (3, 40, 16), "page16": (16, 40, 4),
                   "page1-whole-programs": (1, PAGE1_PROGRAM + 76, PAGE1_PROGRAM + 16)}
# Token CSR rows span two programs, so a program starts past the row's first token.
CSR_COLS = grid.items_per_program(grid.TOKEN_CSR) + 252


def extremes(dtype, *sizes):
    """LIMITS, then for each of ``sizes``: itself +-1, its negation, ``-2**63 + size`` and ``2**63 - 1 - size``;
    those ``dtype`` holds, each once."""
    values = list(LIMITS)
    for n in sizes:
        values += [n - 1, n, n + 1, -n, I64_MIN + n, I64_MAX - n]
    info = torch.iinfo(dtype)
    return list(dict.fromkeys(v for v in values if info.min <= v <= info.max))


def guarded(shape, dtype=torch.int32):
    """``(store, view)``: a poisoned allocation of ``dtype`` GUARD entries larger than ``shape`` on every side
    (on DEVICE), and the view of ``shape`` in its middle."""
    store = torch.full([n + 2 * GUARD for n in shape], POISON, dtype=dtype, device=DEVICE)
    return store, store[tuple(slice(GUARD, GUARD + n) for n in shape)]


def middle(store, shape):
    return store[tuple(slice(GUARD, GUARD + n) for n in shape)]


def random_table(rows, cols, g):
    return torch.randint(I32_MIN, I32_MAX, (rows, cols), generator=g, dtype=torch.int64).to(torch.int32)


def vector(values, dtype):
    return torch.tensor(values, dtype=torch.int64).to(dtype)


def copy_to_device(tensor):
    """A copy of ``tensor`` on DEVICE (None stays None)."""
    return None if tensor is None else tensor.clone().to(DEVICE)


def on_device(case: Case) -> Case:
    """A copy of ``case`` with its tensors on DEVICE (the CPU case stays for the reference and the loops)."""
    move = copy_to_device
    return Case(move(case.req_to_token), move(case.req_pool_indices), move(case.seq_lens), case.page_size,
                case.width, move(case.kv_start_idx), case.seqlen_offset, case.fill_value)


def check_page_table(backend, case: Case):
    """``case`` (CPU tensors) through ``backend`` into guarded outputs, against the reference and the loop."""
    batch, width = case.batch, case.width
    store, _ = guarded((batch, width))
    seq_store, _ = guarded((batch,))
    expected, expected_seq = store.cpu().clone(), seq_store.cpu().clone()
    ops.page_table.reference(case.req_to_token, case.req_pool_indices, case.seq_lens,
                               middle(expected, (batch, width)), case.page_size, case.kv_start_idx,
                               case.seqlen_offset, middle(expected_seq, (batch,)), case.fill_value)
    loop_out, loop_seq = torch.full((batch, width), POISON, dtype=torch.int32), torch.zeros(batch, dtype=torch.int32)
    assert_same(middle(expected, (batch, width)), loop_page_table(case, loop_out, loop_seq), "reference vs loop")
    assert_same(middle(expected_seq, (batch,)), loop_seq, "reference seq_lens_out vs loop")

    device_case = on_device(case)
    page_table(backend, device_case.req_to_token, device_case.req_pool_indices, device_case.seq_lens,
               middle(store, (batch, width)), page_size=case.page_size, kv_start_idx=device_case.kv_start_idx,
               seqlen_offset=case.seqlen_offset, seq_lens_out=middle(seq_store, (batch,)),
               fill_value=case.fill_value)
    assert_same(store, expected, f"{backend} page table (whole allocation)")
    assert_same(seq_store, expected_seq, f"{backend} seq_lens_out (whole allocation)")


def check_token_csr(backend, case: Case, indptr: torch.Tensor, total: int, out_dtype=torch.int32,
                    entry_page_size=1, token_mapping=None):
    """As ``check_page_table``, for the token CSR op with ``kv_indptr`` ``indptr``, ``out`` of ``total``
    entries of ``out_dtype`` and the options ``entry_page_size`` and ``token_mapping`` (CPU); ``backend`` None:
    the reference against the loop only."""
    store, _ = guarded((total,), out_dtype)
    expected = store.cpu().clone()
    ops.token_csr.reference(case.req_to_token, case.req_pool_indices, case.seq_lens, indptr,
                                  middle(expected, (total,)), case.kv_start_idx, entry_page_size, token_mapping)
    loop_out = torch.full((total,), POISON, dtype=out_dtype)
    assert_same(middle(expected, (total,)), loop_token_csr(case, indptr, loop_out, entry_page_size, token_mapping),
                "reference vs loop")
    if backend is None:
        return

    device_case = on_device(case)
    token_csr(backend, device_case.req_to_token, device_case.req_pool_indices, device_case.seq_lens,
              indptr.clone().to(DEVICE), middle(store, (total,)), kv_start_idx=device_case.kv_start_idx,
              entry_page_size=entry_page_size,
              token_mapping=None if token_mapping is None else token_mapping.to(DEVICE))
    assert_same(store, expected, f"{backend} token CSR (whole allocation)")


def spoilt_case(argument, dtype, with_start, page_size, cols, width, g, seqlen_offset=0, fill_value=None):
    """One request per extreme value of ``argument`` (``pool``, ``lens`` or ``start``); the other arguments
    are valid and random."""
    sizes = dict(pool=(ROWS,), lens=(cols, width * page_size), start=(cols,))[argument]
    values = extremes(dtype, *sizes)
    batch = len(values)
    data = dict(pool=torch.randint(0, ROWS, (batch,), generator=g).tolist(),
                lens=torch.randint(1, cols + 1, (batch,), generator=g).tolist(),
                start=torch.randint(0, 2 * page_size + 1, (batch,), generator=g).tolist())
    data[argument] = values
    start = vector(data["start"], dtype) if with_start or argument == "start" else None
    return Case(random_table(ROWS, cols, g), vector(data["pool"], dtype), vector(data["lens"], dtype),
                page_size, width, start, seqlen_offset, fill_value)


@pytest.mark.representative("geometry", "seqlen_offset")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("geometry", sorted(PAGE_GEOMETRIES))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_start", (False, True))
@pytest.mark.parametrize("seqlen_offset,fill_value", list(zip(SCALARS, (None, I32_MIN, 0, -1, I32_MAX, 1))))
def test_page_table_lengths(backend, geometry, dtype, with_start, seqlen_offset, fill_value):
    """``seq_lens`` at the extremes, with every ``seqlen_offset`` extreme: the sum is exact (no empty row
    for ``2**63 - 1 + 1``, no full row for ``-2**63 - 1``)."""
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    case = spoilt_case("lens", dtype, with_start, *PAGE_GEOMETRIES[geometry], g, seqlen_offset, fill_value)
    check_page_table(backend, case)


@pytest.mark.representative("geometry", "argument")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("geometry", sorted(PAGE_GEOMETRIES))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("argument,with_start", [("pool", False), ("pool", True), ("start", True)])
def test_page_table_pool_and_start(backend, geometry, dtype, argument, with_start):
    """Pool indices and starts at the extremes: empty rows, or rows cut at the table's end."""
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    page_size = PAGE_GEOMETRIES[geometry][0]
    for seqlen_offset, fill_value in ((0, None), (page_size, -1)):
        case = spoilt_case(argument, dtype, with_start, *PAGE_GEOMETRIES[geometry], g, seqlen_offset, fill_value)
        check_page_table(backend, case)


def packed_indptr(case: Case, gap=2, entry_page_size=1):
    """``kv_indptr`` (int64) placing every request's written tokens one after another with ``gap`` entries
    between them, counted exactly as the contract does (a row has ``C * entry_page_size`` positions), and
    the ``out`` length that holds them all."""
    rows, cols = case.req_to_token.shape
    cols *= entry_page_size
    starts = case.kv_start_idx.tolist() if case.kv_start_idx is not None else [0] * case.batch
    indptr, position = [], gap
    for pool, length, start in zip(case.req_pool_indices.tolist(), case.seq_lens.tolist(), starts):
        readable = 0 <= pool < rows and 0 <= start < cols
        indptr.append(position)
        position += (min(max(length, 0), cols - start) if readable else 0) + gap
    return vector(indptr + [position], torch.int64), position + gap


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("argument,with_start", [("pool", False), ("lens", False), ("lens", True),
                                                 ("start", True)])
def test_token_csr_pool_lengths_and_start(backend, dtype, argument, with_start):
    """Pool indices, lengths and starts at the extremes, each row packed where the contract writes it."""
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    case = spoilt_case(argument, dtype, with_start, 1, CSR_COLS, 0, g)
    indptr, total = packed_indptr(case)
    check_token_csr(backend, case, indptr.to(dtype), total)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_start", (False, True))
def test_token_csr_indptr(backend, dtype, with_start):
    """One full-row request per extreme ``kv_indptr`` value, into an ``out`` as long as the table is wide:
    from ``-2**63 + k`` the row lands before ``out`` (the offsets must not wrap into it), near 0 and ``N``
    partly inside it. A start makes the row read from a column the caller chose, up to the last one of the
    last table row (a wrapped offset would read past the table)."""
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    total = CSR_COLS
    for i, value in enumerate(extremes(dtype, total, CSR_COLS // 2, 5)):
        start = (CSR_COLS - 1 if i % 2 else int(torch.randint(0, 100, (1,), generator=g))) if with_start else 0
        case = Case(random_table(ROWS, CSR_COLS, g), vector([ROWS - 1], dtype), vector([I64_MAX], torch.int64),
                    1, 0, vector([start], dtype) if with_start else None)
        check_token_csr(backend, case, vector([value, 0], dtype), total)


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_tables_and_outputs(backend):
    """Tables of 0 rows or 0 columns give empty rows (``fill_value`` and ``seq_lens_out`` still written); an
    ``out`` of 0 entries or a batch of 0 writes nothing."""
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    lengths = extremes(torch.int64, 3)
    for rows, cols in ((0, 40), (ROWS, 0), (0, 0)):
        for fill_value in (None, 7):
            pools = vector([b % 2 for b in range(len(lengths))], torch.int64)
            case = Case(torch.zeros((rows, cols), dtype=torch.int32), pools, vector(lengths, torch.int64), 16, 3,
                        None, 1, fill_value)
            check_page_table(backend, case)
        case = Case(torch.zeros((rows, cols), dtype=torch.int32), vector([0, 1, 2], torch.int64),
                    vector([5, I64_MAX, 1], torch.int64), 1, 0)
        check_token_csr(backend, case, vector([0, 3, 5, 7], torch.int64), 8)
    table = random_table(ROWS, 40, g)
    check_token_csr(backend, Case(table, vector([1, 2], torch.int32), vector([40, 3], torch.int32), 1, 0),
                    vector([0, 0, 0], torch.int32), 0)
    check_page_table(backend, Case(table, vector([], torch.int64), vector([], torch.int64), 4, 5, None, 3, -1))
    check_token_csr(backend, Case(table, vector([], torch.int64), vector([], torch.int64), 1, 0),
                    vector([I64_MIN], torch.int64), 6)


TALL = 2**31 + 5  # table rows past any int32 index


def every_op(backend, table, pool, lens, g):
    """The outputs of one call of every op (with its options) on ``backend``, for requests ``pool``/``lens`` of
    ``table``; poisoned before the calls, on DEVICE. The other arguments are drawn from ``g`` (the same draw
    for the same seed)."""
    from test_draft_decode import draft_decode  # it imports this module

    batch, cols = pool.shape[0], table.shape[1]
    start = torch.randint(0, cols, (batch,), generator=g).to(pool.dtype).to(DEVICE)
    indptr = torch.arange(0, cols * (batch + 1), cols).to(pool.dtype).to(DEVICE)
    mapping = torch.randint(-5, 80, (300,), generator=g).to(DEVICE)
    v2p = torch.randint(-1, 50, (40,), generator=g, dtype=torch.int32).to(DEVICE)
    outputs = []

    def fresh(*shape, dtype=torch.int32):
        outputs.append(torch.full(shape, POISON, dtype=dtype, device=DEVICE))
        return outputs[-1]

    page_table(backend, table, pool, lens, fresh(batch, 12), page_size=4, kv_start_idx=start, fill_value=-1)
    token_csr(backend, table, pool, lens, indptr, fresh(cols * batch), kv_start_idx=start)
    token_csr(backend, table, pool, lens, indptr, fresh(cols * batch, dtype=torch.int64), entry_page_size=4,
              token_mapping=mapping)
    mha_page_table(backend, table, pool, lens, fresh(batch, 12), page_size=4, swa_page_table=fresh(batch, 9),
                   full_to_swa=mapping)
    translated_page_table(backend, table, pool, lens, v2p, fresh(batch, 12), page_size=4, multiplier=3)
    draft_decode(backend, table, pool, lens, fresh(3, 2 * batch + 1, dtype=pool.dtype), fresh(3, 4 * cols),
                 num_steps=3, topk=2, page_size=4, v2p=v2p)
    dcp_token_csr(backend, table, pool, lens, indptr, fresh(cols * batch), dcp_size=3, dcp_rank=1,
                  kv_start_idx=start)
    dcp_page_table(backend, table, pool, lens, fresh(batch, 12), page_size=2, dcp_size=3, dcp_rank=2)
    return outputs


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_table_taller_than_int32(backend, dtype):
    """A table of ``2**31 + 5`` rows (a stride-0 view of one row) read through int32 and int64 pool indices:
    every op gives what it gives on the one row itself, an index inside ``[0, R)`` reading that row and one
    outside giving an empty row (no index narrowed, none compared against a narrowed ``R``)."""
    seed = torch.seed() % 2**31
    cols = 40
    row = torch.randint(0, 160, (1, cols), generator=torch.Generator().manual_seed(seed), dtype=torch.int32)
    pools = [0, I32_MAX, -1, I32_MIN, 7] + ([TALL - 1, TALL, I64_MAX] if dtype == torch.int64 else [])
    inside = [0 <= p < TALL for p in pools]
    lens = torch.randint(1, cols + 1, (len(pools),), generator=torch.Generator().manual_seed(seed)).to(dtype)
    tall = every_op(backend, row.to(DEVICE).expand(TALL, cols), vector(pools, dtype).to(DEVICE), lens.to(DEVICE),
                    torch.Generator().manual_seed(seed))
    one_row = every_op("torch", row.to(DEVICE), vector([0 if i else -1 for i in inside], dtype).to(DEVICE),
                       lens.to(DEVICE), torch.Generator().manual_seed(seed))
    for n, (got, expected) in enumerate(zip(tall, one_row)):
        assert_same(got, expected, f"{backend} output {n} on the tall table")
    assert any((t != POISON).any() for t in tall)


def test_debug_checks_at_extremes(monkeypatch):
    """``KVDISPATCH_DEBUG=1`` names the request and the exact value, whatever the sums would wrap to."""
    monkeypatch.setenv("KVDISPATCH_DEBUG", "1")
    kvdispatch.reset()  # the switch is read at import and by reset()
    table = torch.zeros((ROWS, 40), dtype=torch.int32, device=DEVICE)
    pool = torch.tensor([0, 1], device=DEVICE)
    out = torch.full((2, 50), POISON, dtype=torch.int32, device=DEVICE)

    def page_table_error(lens, seqlen_offset=0, start=None):
        start = None if start is None else torch.tensor(start, device=DEVICE)
        with pytest.raises(ValueError) as error:
            kvdispatch.create_flashmla_kv_indices(table, pool, torch.tensor(lens, device=DEVICE), out, page_size=1,
                                                  seqlen_offset=seqlen_offset, kv_start_idx=start)
        return str(error.value)

    assert "request 1: start 0 + length 9223372036854775808 runs past" in page_table_error([3, I64_MAX], 1)
    assert "request 1: length -9223372036854775809 " in page_table_error([3, I64_MIN], -1)
    assert "request 0: kv_start_idx[0] = -9223372036854775808 is outside" in page_table_error([3, 4], 0, [I64_MIN, 0])
    assert "request 1: start 39 + length 9223372036854775807 runs past" in page_table_error([3, I64_MAX], 0, [0, 39])

    flat = torch.full((50,), POISON, dtype=torch.int32, device=DEVICE)
    for indptr in ([0, I64_MAX], [0, I64_MIN], [0, I64_MIN + 45], [0, I64_MAX - 1]):
        with pytest.raises(ValueError, match=rf"request 1: kv_indptr\[1\] = {indptr[1]} with length 4 writes outside"):
            kvdispatch.create_flashinfer_kv_indices(table, pool, torch.tensor([3, 4], device=DEVICE),
                                                    torch.tensor(indptr, device=DEVICE), flat)
    assert (out == POISON).all() and (flat == POISON).all()


def test_reference_token_csr_cost():
    """512 one-token requests into a 131072-entry ``out`` from a 131072-column table: the reference does
    O(N + B) work (a per-request expansion over min(C, N) took seconds and gigabytes)."""
    batch, width = 512, 131072
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    table = torch.empty((batch + 1, width), dtype=torch.int32, device=DEVICE)  # only column 0 is read
    table[:, 0] = random_table(batch + 1, 1, g)[:, 0].to(DEVICE)
    pool = torch.randperm(batch + 1, generator=g)[:batch].to(DEVICE)
    lens = torch.ones(batch, dtype=torch.int64, device=DEVICE)
    indptr = torch.arange(batch + 1, device=DEVICE)
    out = torch.full((width,), POISON, dtype=torch.int32, device=DEVICE)
    ops.token_csr.reference(table, pool, lens, indptr, out)  # warm-up
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    began = time.perf_counter()
    ops.token_csr.reference(table, pool, lens, indptr, out)
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()
        assert torch.cuda.max_memory_allocated() - before < 200 * (width + batch)  # bytes: a few vectors of N
    assert time.perf_counter() - began < 1.0
    assert torch.equal(out[:batch], table[pool, 0]) and (out[batch:] == POISON).all()
