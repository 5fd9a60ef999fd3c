"""``KVDISPATCH_DEBUG=1``: hostile data raises a ValueError naming the request and the value, before any write,
for every op and option (the page table and token CSR, then every op through one table of spoilers: rows past
the table, pages past an output's width or ``max_pages``, CSR rows outside ``out`` or overlapping, lookups
outside ``token_mapping``, ``full_to_swa`` or ``v2p``, scaled pages past int32, draft ``positions``).

Without the switch the same data gives the contract's safe results on every backend under test.
``kvdispatch._debug.enabled()`` reads the environment on every call, so it can be flipped mid-process.
"""

import random

import pytest
import torch

from kvdispatch import ops
import kvdispatch
from conftest import BACKENDS, DEVICE, page_table, token_csr
from kvdispatch import _debug, reference
from kvcases import POISON, loop_page_table, loop_token_csr, make_case

# name -> (how to spoil request b of a case; regex of the message, formatted with b and the bad value)
PAGE_TABLE_CASES = {
    "pool-past-table": lambda c, b, rows, cols: ("req_pool_indices", b, rows),
    "pool-negative": lambda c, b, rows, cols: ("req_pool_indices", b, -1),
    "pool-huge": lambda c, b, rows, cols: ("req_pool_indices", b, 2**40),
    "length-negative": lambda c, b, rows, cols: ("seq_lens", b, -5),
    "length-past-table": lambda c, b, rows, cols: ("seq_lens", b, cols * 3),
    "start-past-table": lambda c, b, rows, cols: ("kv_start_idx", b, cols + 2),
    "start-negative": lambda c, b, rows, cols: ("kv_start_idx", b, -3),
    "start-plus-length-past-table": lambda c, b, rows, cols: ("kv_start_idx", b, cols - 1),
}
EXPECTED_MESSAGE = {
    "pool-past-table": r"request {b}: req_pool_indices\[{b}\] = {v} is outside \[0, {rows}\)",
    "pool-negative": r"request {b}: req_pool_indices\[{b}\] = -1 is outside",
    "pool-huge": r"request {b}: req_pool_indices\[{b}\] = {v} is outside",
    "length-negative": r"request {b}: length -5 .* is negative",
    "length-past-table": r"request {b}: start \d+ \+ length {v} runs past the table's {cols} columns",
    "start-past-table": r"request {b}: kv_start_idx\[{b}\] = {v} is outside the table's \[0, {cols}\)",
    "start-negative": r"request {b}: kv_start_idx\[{b}\] = -3 is outside",
    "start-plus-length-past-table": r"request {b}: start {v} \+ length \d+ runs past the table's {cols} columns",
}


def _hostile_case(kind, fill_value=None):
    case = make_case(8, 16, max_pages=6, device=DEVICE, with_start=True, index_dtype=torch.int64,
                     fill_value=fill_value)
    rows, cols = case.req_to_token.shape
    b = random.randrange(case.batch)
    name, b, value = PAGE_TABLE_CASES[kind](case, b, rows, cols)
    getattr(case, name)[b] = value
    if kind == "start-plus-length-past-table":
        case.seq_lens[b] = 40  # starts inside the table, ends past it
    pattern = EXPECTED_MESSAGE[kind].format(b=b, v=value, rows=rows, cols=cols)
    return case, pattern


def _call_page_table(case, backend=None, seq_out=None):
    out = case.page_table_out()
    kvdispatch.create_flashmla_kv_indices(case.req_to_token, case.req_pool_indices, case.seq_lens, out,
                                          page_size=case.page_size, kv_start_idx=case.kv_start_idx,
                                          seqlen_offset=case.seqlen_offset, seq_lens_out=seq_out,
                                          fill_value=case.fill_value, backend=backend)
    return out


@pytest.mark.parametrize("kind", sorted(PAGE_TABLE_CASES))
def test_debug_names_the_request_and_value(monkeypatch, kind):
    monkeypatch.setenv("KVDISPATCH_DEBUG", "1")
    kvdispatch.reset()  # the switch is read at import and by reset()
    case, pattern = _hostile_case(kind)
    out = case.page_table_out()
    seq_out = case.seq_lens_out()
    with pytest.raises(ValueError, match=pattern):
        kvdispatch.create_flashmla_kv_indices(case.req_to_token, case.req_pool_indices, case.seq_lens, out,
                                              page_size=case.page_size, kv_start_idx=case.kv_start_idx,
                                              seq_lens_out=seq_out)
    assert (out == POISON).all() and (seq_out == POISON).all()  # raised before anything was written
    if kind != "length-past-table":  # the same request breaks the CSR op too (a long length can fit a big out)
        indptr, flat = case.csr()
        with pytest.raises(ValueError, match=pattern):
            kvdispatch.create_flashinfer_kv_indices(case.req_to_token, case.req_pool_indices, case.seq_lens,
                                                    indptr, flat, kv_start_idx=case.kv_start_idx)
        assert (flat == POISON).all()


def test_debug_negative_length_from_seqlen_offset(monkeypatch):
    monkeypatch.setenv("KVDISPATCH_DEBUG", "1")
    kvdispatch.reset()  # the switch is read at import and by reset()
    case = make_case(4, 8, device=DEVICE, seqlen_offset=-3)
    case.seq_lens.clamp_(min=3)
    case.seq_lens[2] = 1
    with pytest.raises(ValueError, match=r"request 2: length -2 \(seq_lens \+ seqlen_offset\) is negative"):
        _call_page_table(case)


@pytest.mark.parametrize("where", ["past-out", "negative"])
def test_debug_csr_indptr_outside_out(monkeypatch, where):
    monkeypatch.setenv("KVDISPATCH_DEBUG", "1")
    kvdispatch.reset()  # the switch is read at import and by reset()
    case = make_case(6, 8, max_pages=4, device=DEVICE, with_start=True)
    indptr, flat = case.csr()
    b = random.randrange(case.batch)
    value = flat.shape[0] - 1 if where == "past-out" else -4
    case.seq_lens[b] = max(int(case.seq_lens[b]), 2)
    indptr[b] = value
    with pytest.raises(ValueError, match=rf"request {b}: kv_indptr\[{b}\] = {value} with length \d+ writes "
                                         rf"outside out's {flat.shape[0]} entries"):
        kvdispatch.create_flashinfer_kv_indices(case.req_to_token, case.req_pool_indices, case.seq_lens, indptr,
                                                flat, kv_start_idx=case.kv_start_idx)
    assert (flat == POISON).all()


def test_debug_accepts_clean_data_and_edges(monkeypatch):
    """No false alarms: rows reaching exactly the table's end (their pages filling out's row), empty rows, empty
    rows pointing at out's end."""
    monkeypatch.setenv("KVDISPATCH_DEBUG", "1")
    kvdispatch.reset()  # the switch is read at import and by reset()
    case = make_case(6, 16, max_pages=5, device=DEVICE, with_start=True, fill_value=-1)
    case.width = -(-case.req_to_token.shape[1] // 16)  # a whole row's pages
    rows, cols = case.req_to_token.shape
    case.kv_start_idx[0], case.seq_lens[0] = 0, cols          # the whole row
    case.kv_start_idx[1], case.seq_lens[1] = cols - 1, 1      # the last position
    case.seq_lens[2] = 0                                      # an empty row
    case.kv_start_idx[3], case.seq_lens[3] = cols + 50, 0     # empty: its start is never read
    out = _call_page_table(case)
    assert torch.equal(out.cpu(), loop_page_table(case, case.page_table_out()))

    indptr, flat = case.csr()
    indptr[2] = flat.shape[0]  # empty row at out's very end: writes nothing
    expected = loop_token_csr(case, indptr.cpu(), flat)
    kvdispatch.create_flashinfer_kv_indices(case.req_to_token, case.req_pool_indices, case.seq_lens, indptr, flat,
                                            kv_start_idx=case.kv_start_idx)
    assert torch.equal(flat.cpu(), expected)


@pytest.mark.parametrize("value,on", [("1", True), ("yes", True), (" TRUE ", True), ("On", True), ("0", False),
                                      ("", False), ("no", False), ("false", False), (" OFF", False)])
def test_enabled_reads_the_environment_per_call(monkeypatch, value, on):
    monkeypatch.delenv("KVDISPATCH_DEBUG", raising=False)
    kvdispatch.reset()  # the switch is read at import and by reset()
    assert not _debug.enabled()
    monkeypatch.setenv("KVDISPATCH_DEBUG", value)
    kvdispatch.reset()  # the switch is read at import and by reset()
    assert _debug.enabled() is on
    case, pattern = _hostile_case("pool-negative")
    if on:
        with pytest.raises(ValueError, match=pattern):
            _call_page_table(case)
    else:
        _call_page_table(case)
    monkeypatch.delenv("KVDISPATCH_DEBUG")
    kvdispatch.reset()  # the switch is read at import and by reset()
    _call_page_table(case)  # no error once the switch is off again, in the same process


@pytest.mark.parametrize("value", ["2", "enabled", "y", "1 1"])
def test_a_value_that_is_not_a_boolean_is_an_error(monkeypatch, value):
    monkeypatch.setenv("KVDISPATCH_DEBUG", value)
    with pytest.raises(ValueError, match="KVDISPATCH_DEBUG must be one of 1/0, true/false, yes/no, on/off") as info:
        kvdispatch.reset()
    assert repr(value) in str(info.value)
    monkeypatch.delenv("KVDISPATCH_DEBUG")
    kvdispatch.reset()
    assert not _debug.enabled()


@pytest.mark.representative("kind")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fill_value", [None, -1])
@pytest.mark.parametrize("kind", sorted(PAGE_TABLE_CASES))
def test_without_debug_the_same_data_is_safe(monkeypatch, backend, fill_value, kind):
    monkeypatch.delenv("KVDISPATCH_DEBUG", raising=False)
    kvdispatch.reset()  # the switch is read at import and by reset()
    case, _ = _hostile_case(kind, fill_value)
    out = case.page_table_out()
    expected = loop_page_table(case, out)
    page_table(backend, case.req_to_token, case.req_pool_indices, case.seq_lens, out, page_size=case.page_size,
               kv_start_idx=case.kv_start_idx, fill_value=fill_value)
    assert torch.equal(out.cpu(), expected)
    assert (out[case.batch:].cpu() == POISON).all()

    indptr, flat = case.csr()
    expected = loop_token_csr(case, indptr.cpu(), flat)
    token_csr(backend, case.req_to_token, case.req_pool_indices, case.seq_lens, indptr, flat,
              kv_start_idx=case.kv_start_idx)
    assert torch.equal(flat.cpu(), expected)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("where", ["past-out", "negative", "far-past"])
def test_without_debug_csr_indptr_outside_out_is_safe(monkeypatch, backend, where):
    monkeypatch.delenv("KVDISPATCH_DEBUG", raising=False)
    kvdispatch.reset()  # the switch is read at import and by reset()
    case = make_case(6, 8, max_pages=4, device=DEVICE, with_start=True)
    indptr, flat = case.csr()  # 3 spare entries at the end
    # Row 0 starts at 0, so a negative start only reaches its own entries; the spare entries past the last
    # row take the writes that land just before out's end: no two rows overlap (the winner would be undefined).
    b = 0 if where == "negative" else random.randrange(case.batch)
    case.seq_lens[b] = max(int(case.seq_lens[b]), 6)
    indptr[b] = {"past-out": flat.shape[0] - 2, "negative": -4, "far-past": flat.shape[0] + 1000}[where]
    expected = loop_token_csr(case, indptr.cpu(), flat)
    reference_out = flat.clone()
    ops.token_csr.reference(case.req_to_token, case.req_pool_indices, case.seq_lens, indptr, reference_out,
                                  case.kv_start_idx)
    assert torch.equal(reference_out.cpu(), expected)
    token_csr(backend, case.req_to_token, case.req_pool_indices, case.seq_lens, indptr, flat,
              kv_start_idx=case.kv_start_idx)
    assert torch.equal(flat.cpu(), expected)


# -- the SGLang-family ops ---------------------------------------------------------------------------------------
# Each op gets a valid engine-like call (lengths 0 among them), drawn fresh per case: a dict of its arguments on
# DEVICE. A spoiler changes one request's data and returns the message the check must raise.

FAMILY_BATCH, FAMILY_ROWS = 5, 8


@pytest.fixture
def debug_on(monkeypatch):
    monkeypatch.setenv("KVDISPATCH_DEBUG", "1")
    kvdispatch.reset()  # the switch is read at import and by reset()
    yield
    monkeypatch.delenv("KVDISPATCH_DEBUG")
    kvdispatch.reset()


def _draw(low, high, count, g):
    return torch.randint(low, high, (count,), generator=g)


def _poisoned(shape, dtype=torch.int32):
    return torch.full(shape, POISON, dtype=dtype, device=DEVICE)


def _requests(g, cols, longest):
    """Distinct pool rows and lengths in ``[0, longest]`` for FAMILY_BATCH requests, request 0 empty; a table of
    FAMILY_ROWS rows of ``cols`` random slot ids in ``[0, 5000)``."""
    table = _draw(0, 5000, FAMILY_ROWS * cols, g).view(FAMILY_ROWS, cols).to(torch.int32)
    pool = torch.randperm(FAMILY_ROWS, generator=g)[:FAMILY_BATCH]
    lens = _draw(1, longest + 1, FAMILY_BATCH, g)
    lens[0] = 0
    return table, pool, lens


def _page_table_case(g):
    page_size, cols = 4, 48
    table, pool, lens = _requests(g, cols, 30)
    return dict(req_to_token=table, req_pool_indices=pool, seq_lens=lens, out=_poisoned((FAMILY_BATCH + 1, 8)),
                page_size=page_size, kv_start_idx=_draw(0, 10, FAMILY_BATCH, g), seqlen_offset=1, fill_value=-1)


def _token_csr_case(entry_page_size):
    def draw_case(g):
        cols = 60 // entry_page_size  # 60 positions a row
        table, pool, lens = _requests(g, cols, 40)
        indptr = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(lens, 0)])
        return dict(req_to_token=table, req_pool_indices=pool, seq_lens=lens, kv_indptr=indptr,
                    out=_poisoned((int(indptr[-1]) + 2,)), kv_start_idx=_draw(0, 21, FAMILY_BATCH, g),
                    entry_page_size=entry_page_size, token_mapping=torch.randperm(5000 * entry_page_size, generator=g))
    return draw_case


def _dcp_csr_case(g):
    dcp_size, cols = 3, 60
    table, pool, lens = _requests(g, cols, 40)
    start = _draw(0, cols - 40 + 1, FAMILY_BATCH, g)
    rank = int(_draw(0, dcp_size, 1, g))
    local = reference.dcp_owned_counts(lens, dcp_size, rank, start)
    indptr = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(local, 0)])
    return dict(req_to_token=table, req_pool_indices=pool, local_seq_lens=local, kv_indptr=indptr,
                out=_poisoned((int(indptr[-1]) + 2,)), dcp_size=dcp_size, dcp_rank=rank, kv_start_idx=start)


def _dcp_page_table_case(g):
    dcp_size, page_size, cols = 2, 4, 50
    table, pool, lens = _requests(g, cols, cols)
    rank = int(_draw(0, dcp_size, 1, g))
    local = reference.dcp_owned_counts(lens, dcp_size, rank)
    width = -(-(-(-cols // dcp_size)) // page_size)  # a whole row's local pages
    return dict(req_to_token=table, req_pool_indices=pool, local_seq_lens=local,
                out=_poisoned((FAMILY_BATCH + 1, width)), page_size=page_size, dcp_size=dcp_size, dcp_rank=rank)


def _mha_case(g):
    page_size, cols, slots = 4, 30, 5000
    table, pool, lens = _requests(g, cols, cols)
    return dict(req_to_token=table, req_pool_indices=pool, seq_lens=lens, page_table=_poisoned((FAMILY_BATCH, 9)),
                page_size=page_size, swa_page_table=_poisoned((FAMILY_BATCH + 1, 8)),  # 8: a whole row's pages
                full_to_swa=torch.randperm(slots, generator=g))


def _translated_case(g):
    page_size, cols, delta = 4, 30, 2
    table, pool, lens = _requests(g, cols, cols - delta)
    table[table % 7 == 0] = -1  # negative tokens read virtual page 0, as documented
    v2p = _draw(-1, 1000, 5000 // page_size + 1, g)  # -1: freed pages; the last one no token reads
    return dict(req_to_token=table, req_pool_indices=pool, seq_lens=lens, v2p=v2p, out=_poisoned((FAMILY_BATCH, 9)),
                page_size=page_size, multiplier=2, max_pages=8, seq_len_delta=delta)  # 8: a whole row's pages


def _draft_case(g):
    page_size, topk, steps, cols = 4, 2, 3, 60
    table, pool, lens = _requests(g, cols, 20)  # 20 + a branch's 8 slots + 3 steps < 60 columns
    width = topk * int(lens.sum()) + FAMILY_BATCH * topk * steps
    return dict(req_to_token=table, req_pool_indices=pool, seq_lens=lens,
                kv_indptr=_poisoned((steps, FAMILY_BATCH * topk + 1)), out=_poisoned((steps, width)),
                num_steps=steps, topk=topk, page_size=page_size, positions=lens.repeat_interleave(topk), window_size=6,
                sink_size=2, v2p=_draw(-1, 1000, 5000 // page_size, g))


FAMILY = {
    "page_table": (_page_table_case, kvdispatch.create_flashmla_kv_indices, ("out",)),
    "token_csr": (_token_csr_case(1), kvdispatch.create_flashinfer_kv_indices, ("out",)),
    "token_csr_entry_pages": (_token_csr_case(3), kvdispatch.create_flashinfer_kv_indices, ("out",)),
    "dcp_token_csr": (_dcp_csr_case, kvdispatch.create_dcp_kv_indices, ("out",)),
    "dcp_page_table": (_dcp_page_table_case, kvdispatch.create_dcp_page_table, ("out",)),
    "mha_page_table": (_mha_case, kvdispatch.create_trtllm_mha_page_table, ("page_table", "swa_page_table")),
    "translated_page_table": (_translated_case, kvdispatch.create_translated_page_table, ("out",)),
    "draft_decode": (_draft_case, kvdispatch.create_draft_decode_kv_indices, ("out", "kv_indptr")),
}
TENSOR_ARGUMENTS = ("req_to_token", "req_pool_indices", "seq_lens", "local_seq_lens", "kv_indptr", "out", "page_table",
                    "swa_page_table", "full_to_swa", "v2p", "kv_start_idx")


def _family_call(op, args, backend=None):
    _, function, _ = FAMILY[op]
    positional = [args[name] for name in TENSOR_ARGUMENTS[:6] + ("page_table",) if name in args
                  and name not in ("kv_start_idx",)]
    keywords = {k: v for k, v in args.items() if k not in TENSOR_ARGUMENTS[:6] + ("page_table", "v2p")}
    if op == "translated_page_table":  # v2p comes before out there
        positional.insert(3, args["v2p"])
    elif "v2p" in args:
        keywords["v2p"] = args["v2p"]
    function(*positional, **keywords, backend=backend)


def _family_case(op, g):
    args = FAMILY[op][0](g)
    return {k: (v.to(DEVICE) if isinstance(v, torch.Tensor) else v) for k, v in args.items()}


def _lengths_name(args):
    return "local_seq_lens" if "local_seq_lens" in args else "seq_lens"


def _offset(args):
    """What the op adds to every length."""
    return args.get("seqlen_offset", 0) + args.get("seq_len_delta", 0)


def _row_positions(args):
    """``(positions, text)``: the positions a row has, and how an error names them."""
    entries, entry_page_size = args["req_to_token"].shape[1], args.get("entry_page_size", 1)
    if entry_page_size == 1:
        return entries, f"the table's {entries} columns"
    positions = entries * entry_page_size
    return positions, rf"the row's {positions} positions \({entries} entries of {entry_page_size}\)"


def _pool_outside(args, b):
    args["req_pool_indices"][b] = FAMILY_ROWS
    return rf"request {b}: req_pool_indices\[{b}\] = {FAMILY_ROWS} is outside \[0, {FAMILY_ROWS}\)"


def _pool_negative(args, b):
    args["req_pool_indices"][b] = -1
    return rf"request {b}: req_pool_indices\[{b}\] = -1 is outside"


def _length_negative(args, b):
    args[_lengths_name(args)][b] = -3 - _offset(args)
    return rf"request {b}: length -3 \({_lengths_name(args)}( \+ \w+)?\) is negative"


def _length_past_table(args, b):
    cols, table = _row_positions(args)
    length = cols + 1
    args[_lengths_name(args)][b] = length
    if "dcp_size" in args:
        return rf"request {b}: {length} positions every {args['dcp_size']} from \d+ \(rank {args['dcp_rank']}\) " \
               rf"run past {table}"
    start = int(args["kv_start_idx"][b]) if "kv_start_idx" in args else 0
    return rf"request {b}: start {start} \+ length {length + _offset(args)} runs past {table}"


def _draft_slots_past_table(args, b):
    cols = args["req_to_token"].shape[1]
    length = cols - args["num_steps"]  # the prefix fits, branch 1's draft slots do not
    args["seq_lens"][b] = length
    return rf"request {b}: draft slots up to position \d+ \(seq_lens\[{b}\] = {length}, 2 branches of 3 steps\) " \
           rf"run past the table's {cols} columns"


def _start_past_table(args, b):
    cols, _ = _row_positions(args)
    args[_lengths_name(args)][b] = 1 - _offset(args)
    args["kv_start_idx"][b] = cols + 4
    where = "the table's" if cols == args["req_to_token"].shape[1] else "the row's positions"
    return rf"request {b}: kv_start_idx\[{b}\] = {cols + 4} is outside {where} \[0, {cols}\)"


def _first_own_position_past_table(args, b):
    """The start lies in the table; the rank's first position at or after it does not."""
    cols, dcp_size = args["req_to_token"].shape[1], args["dcp_size"]
    rank = args["dcp_rank"] = ((cols - 1) % dcp_size + 1) % dcp_size  # not the owner of the last column
    _repack(args, args["local_seq_lens"].clamp_(max=1))  # one token each: every other row stays in the table
    args["local_seq_lens"][b] = 1
    args["kv_start_idx"][b] = cols - 1
    return rf"request {b}: 1 positions every {dcp_size} from {cols - 1 + (rank - cols + 1) % dcp_size} \(rank " \
           rf"{rank}\) run past the table's {cols} columns"


def _repack(args, lens):
    """Rows of ``lens`` one after another in a new poisoned ``out`` with two spare entries."""
    args["kv_indptr"].copy_(torch.cat([lens.new_zeros(1), torch.cumsum(lens, 0)]))
    args["out"] = _poisoned((int(lens.sum()) + 2,))


def _nonempty(args, b):
    """Give every request a few tokens, the CSR repacked; returns the lengths."""
    lens = args[_lengths_name(args)].clamp_(min=2, max=6)
    _repack(args, lens)
    return lens


def _lookup_outside_mapping(slot):
    """Request ``b``'s first token read from entry ``slot`` (past ``token_mapping`` or negative)."""
    def spoil(args, b):
        _nonempty(args, b)
        entry_page_size, size = args["entry_page_size"], args["token_mapping"].shape[0]
        start, row = int(args["kv_start_idx"][b]), int(args["req_pool_indices"][b])
        entry = start // entry_page_size
        args["req_to_token"][row, entry] = slot
        value = slot * entry_page_size + start % entry_page_size
        return rf"request {b}: token 0 \(position {start}, req_to_token\[{row}, {entry}\] = {slot}\) has value " \
               rf"{value}, outside token_mapping's \[0, {size}\)"
    return spoil


def _table_narrower_than_pages(name):
    """Request ``b`` of at least two pages, the others of fewer, ``name`` (or ``max_pages``) one page short."""
    def spoil(args, b):
        lens, page_size, offset = args[_lengths_name(args)], args["page_size"], _offset(args)
        lens[b] = max(int(lens[b]), page_size + 1 - offset)
        length = int(lens[b]) + offset
        pages = -(-length // page_size)
        lens.clamp_(max=(pages - 1) * page_size - offset)[b] = length - offset
        if name == "max_pages":
            args["max_pages"] = pages - 1
            return rf"request {b}: its {pages} pages \(length {length}, page_size {page_size}\) do not fit out's " \
                   rf"{pages - 1} columns \(max_pages = {pages - 1}\)"
        args[name] = args[name][:, : pages - 1]
        if "max_pages" in args:
            args["max_pages"] = None  # out's width rules
        return rf"request {b}: its {pages} pages \(length {length}, page_size {page_size}\) do not fit {name}'s " \
               rf"{pages - 1} columns"
    return spoil


def _scaled_page_past_int32(args, b):
    """Request ``b``'s first column on the one virtual page no token reads, mapped to ``2**30`` (times 2)."""
    page = args["v2p"].shape[0] - 1
    args["v2p"][page] = 2**30
    row = int(args["req_pool_indices"][b])
    args["req_to_token"][row, 0] = page * args["page_size"]
    return rf"request {b}: v2p\[{page}\] = {2**30} times multiplier 2 \(column 0\) is outside \[0, {2**31 - 1}\]"


def _position_negative(args, b):
    z = b * args["topk"] + 1
    args["positions"][z] = -1
    return rf"request {b}: positions\[{z}\] = -1 \(branch 1\) is negative"


def _positions_past_out(args, b):
    """Without a window the last step's segments end at out's width: one more position puts kv_indptr past it."""
    args["window_size"] = args["sink_size"] = 0
    lens, topk, steps = args["seq_lens"].cpu(), args["topk"], args["num_steps"]
    width = topk * int(lens.sum()) + lens.shape[0] * topk * steps
    args["out"] = args["out"][:, :width]
    args["positions"][b * topk] += 1
    last = lens.shape[0] * topk - 1
    position = int(args["positions"][last])
    return rf"request {lens.shape[0] - 1}: positions\[{last}\] = {position} \(branch {topk - 1}\) " \
           rf"puts kv_indptr\[{steps - 1}, {last + 1}\] at {width + 1}, past out's {width} columns"


def _indptr_past_out(args, b):
    lens = _nonempty(args, b)
    total = args["out"].shape[0]
    args["kv_indptr"][b] = total - 1
    return rf"request {b}: kv_indptr\[{b}\] = {total - 1} with length {int(lens[b])} writes outside out's {total} " \
           rf"entries"


def _indptr_negative(args, b):
    lens = _nonempty(args, b)
    args["kv_indptr"][b] = -1
    return rf"request {b}: kv_indptr\[{b}\] = -1 with length {int(lens[b])} writes outside"


def _rows_overlap(args, b):
    _nonempty(args, b)
    b = max(b, 1)
    earlier = int(args["kv_indptr"][b - 1])
    args["kv_indptr"][b] = earlier + 1
    return rf"request {b}: kv_indptr\[{b}\] = {earlier + 1} starts inside request {b - 1}'s entries \[{earlier}, "


def _slot_outside_mapping(value):
    def spoil(args, b):
        args["seq_lens"][b] = max(int(args["seq_lens"][b]), 5)
        args["req_to_token"][int(args["req_pool_indices"][b]), 4] = value  # page 1's first slot
        size = args["full_to_swa"].shape[0]
        return rf"request {b}: slot {value} at req_to_token\[{int(args['req_pool_indices'][b])}, 4\] \(page 1\) is " \
               rf"outside full_to_swa's \[0, {size}\)"
    return spoil


def _empty_mapping(args, b):
    args["full_to_swa"] = args["full_to_swa"][:0]
    first = int((args["seq_lens"].cpu() > 0).nonzero()[0, 0])
    return rf"request {first}: slot \d+ at req_to_token\[\d+, 0\] \(page 0\) is outside full_to_swa's \[0, 0\)"


def _page_past_v2p(args, b):
    args["seq_lens"][b] = max(int(args["seq_lens"][b]), 5)
    size, page_size = args["v2p"].shape[0], args["page_size"]
    args["req_to_token"][int(args["req_pool_indices"][b]), page_size] = size * page_size  # column 1
    return (rf"request {b}: req_to_token\[\d+, {page_size}\] = {size * page_size} is virtual page {size} "
            rf"\(column 1\), outside v2p's \[0, {size}\)")


def _draft_value_off_v2p(position, value):
    """A value the draft op reads (``position`` past the prefix: a draft slot of branch 0) off v2p's pages."""
    def spoil(args, b):
        length = int(args["seq_lens"][b])
        row = int(args["req_pool_indices"][b])
        column = length + position
        args["req_to_token"][row, column] = value
        page = value // args["page_size"]
        return rf"request {b}: req_to_token\[{row}, {column}\] = {value} is on page {page}, outside v2p's"
    return spoil


def _draft_prefix_value_negative(args, b):
    args["seq_lens"][b] = max(int(args["seq_lens"][b]), 1)
    row = int(args["req_pool_indices"][b])
    args["req_to_token"][row, 0] = -1  # position 0: the window's first sink token
    return rf"request {b}: req_to_token\[{row}, 0\] = -1 is on page -1, outside v2p's"


def _segments_past_out(args, b):
    lens, topk, steps = args["seq_lens"].cpu(), args["topk"], args["num_steps"]
    counts = lens.clamp(max=args["window_size"] + args["sink_size"])
    end = topk * (int(counts[: b + 1].sum()) + (b + 1) * steps)
    args["out"] = args["out"][:, : end - 1]
    return rf"request {b}: its segments of step {steps - 1} end at column {end}, past out's {end - 1} columns"


ROW_SPOILERS = {"pool-outside": _pool_outside, "pool-negative": _pool_negative, "length-negative": _length_negative,
                "length-past-table": _length_past_table}
CSR_OPS = ("token_csr", "token_csr_entry_pages", "dcp_token_csr")
FAMILY_SPOILERS = [(op, kind, spoil) for op in FAMILY for kind, spoil in ROW_SPOILERS.items()] + [
    (op, kind, spoil) for op in CSR_OPS for kind, spoil in (
        ("start-past-table", _start_past_table), ("indptr-past-out", _indptr_past_out),
        ("indptr-negative", _indptr_negative), ("rows-overlap", _rows_overlap))] + [
    (op, kind, spoil) for op in CSR_OPS[:2] for kind, spoil in (
        ("lookup-past-mapping", _lookup_outside_mapping(5000)), ("lookup-negative", _lookup_outside_mapping(-1)))] + [
    ("page_table", "start-past-table", _start_past_table),
    ("page_table", "out-narrower-than-pages", _table_narrower_than_pages("out")),
    ("dcp_page_table", "out-narrower-than-pages", _table_narrower_than_pages("out")),
    ("mha_page_table", "page-table-narrower-than-pages", _table_narrower_than_pages("page_table")),
    ("mha_page_table", "swa-table-narrower-than-pages", _table_narrower_than_pages("swa_page_table")),
    ("translated_page_table", "out-narrower-than-pages", _table_narrower_than_pages("out")),
    ("translated_page_table", "max-pages-below-pages", _table_narrower_than_pages("max_pages")),
    ("translated_page_table", "scaled-page-past-int32", _scaled_page_past_int32),
    ("draft_decode", "position-negative", _position_negative),
    ("draft_decode", "positions-past-out", _positions_past_out),
    ("dcp_token_csr", "first-own-position-past-table", _first_own_position_past_table),
    ("mha_page_table", "slot-past-mapping", _slot_outside_mapping(5000)),
    ("mha_page_table", "slot-negative", _slot_outside_mapping(-2)),
    ("mha_page_table", "mapping-empty", _empty_mapping),
    ("translated_page_table", "page-past-v2p", _page_past_v2p),
    ("draft_decode", "draft-slot-past-v2p", _draft_value_off_v2p(1, 5000 // 4 * 4 + 3)),
    ("draft_decode", "draft-slot-negative", _draft_value_off_v2p(0, -5)),
    ("draft_decode", "prefix-negative", _draft_prefix_value_negative),
    ("draft_decode", "segments-past-out", _segments_past_out),
    ("draft_decode", "draft-slots-past-table", _draft_slots_past_table),
]


@pytest.mark.parametrize("op", sorted(FAMILY))
def test_family_valid_calls_pass_and_match_the_reference(debug_on, op):
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    for _ in range(3):
        args = _family_case(op, g)
        expected = {name: args[name].clone() for name in FAMILY[op][2]}
        _family_call(op, {**args, **expected}, backend="torch")  # the reference, with the checks
        _family_call(op, args)
        for name in FAMILY[op][2]:
            assert torch.equal(args[name].cpu(), expected[name].cpu()), name


@pytest.mark.parametrize("op,kind,spoil", FAMILY_SPOILERS, ids=[f"{op}-{kind}" for op, kind, _ in FAMILY_SPOILERS])
def test_family_bad_data_names_the_request(debug_on, op, kind, spoil):
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    args = _family_case(op, g)
    b = random.randrange(1, FAMILY_BATCH)
    pattern = spoil(args, b)
    for backend in ("torch", None):
        with pytest.raises(ValueError, match=pattern):
            _family_call(op, args, backend)
        for name in FAMILY[op][2]:
            assert (args[name] == POISON).all(), f"{name} written before the error"


def test_family_checks_only_what_is_read(debug_on):
    """No false alarms: empty rows point anywhere, values past the written columns are not looked up."""
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    args = _family_case("dcp_token_csr", g)
    cols, total = args["req_to_token"].shape[1], args["out"].shape[0]
    args["kv_start_idx"][0], args["kv_indptr"][0] = cols + 9, total  # request 0 is empty
    _family_call("dcp_token_csr", args)

    args = _family_case("mha_page_table", g)
    args["seq_lens"][1] = 4 * 5  # five pages: the SWA table maps their first slots only
    args["req_to_token"][int(args["req_pool_indices"][1]), 4 * 5] = -1
    _family_call("mha_page_table", args)

    args = _family_case("translated_page_table", g)
    args["max_pages"] = 5
    args["seq_lens"].clamp_(max=4 * 5 - 2)[1] = 4 * 5 - 2  # five pages with the delta: all of max_pages
    row = args["req_to_token"][int(args["req_pool_indices"][1])]
    row[4 * 5] = 10**9
    args["v2p"][row[: 4 * 5 : 4].clamp(min=0) // 4] = (2**31 - 1) // 2  # times the multiplier 2: int32 holds it
    _family_call("translated_page_table", args)

    args = _family_case("draft_decode", g)  # a window of 6 + 2 sink tokens: the middle of a long prefix is not read
    args["seq_lens"][1] = 20
    args["req_to_token"][int(args["req_pool_indices"][1]), 5] = -1
    steps, topk = args["num_steps"], args["topk"]  # out as wide as the longer prefix needs (8 entries of it)
    args["out"] = _poisoned((steps, topk * int(args["seq_lens"].sum()) + FAMILY_BATCH * topk * steps)).to(DEVICE)
    _family_call("draft_decode", args)


def test_debug_csr_rows_overlapping(debug_on):
    case = make_case(6, 8, max_pages=4, device=DEVICE)
    indptr, flat = case.csr(gap=0)
    case.seq_lens.clamp_(min=2)
    indptr.copy_(torch.cat([indptr.new_zeros(1), torch.cumsum(case.seq_lens, 0)]))
    flat = torch.full((int(indptr[-1]),), POISON, dtype=torch.int32, device=DEVICE)
    b = random.randrange(1, case.batch)
    indptr[b] = int(indptr[b - 1]) + 1
    with pytest.raises(ValueError, match=rf"request {b}: kv_indptr\[{b}\] = {int(indptr[b])} starts inside request "
                                         rf"{b - 1}'s entries \[{int(indptr[b - 1])}, "):
        kvdispatch.create_flashinfer_kv_indices(case.req_to_token, case.req_pool_indices, case.seq_lens, indptr, flat)
    assert (flat == POISON).all()


def test_debug_token_lookups_inside_an_entry(debug_on):
    """With ``entry_page_size`` 4 an entry's tokens have consecutive values: a mapping that ends inside an
    entry is caught at the first token past it, and one that holds every value read passes."""
    table = torch.tensor([[10, 20], [0, 5]], dtype=torch.int32, device=DEVICE)
    pool, lens = torch.tensor([1, 0], device=DEVICE), torch.tensor([2, 6], device=DEVICE)
    start, indptr = torch.tensor([0, 1], device=DEVICE), torch.tensor([0, 2, 8], device=DEVICE)
    out = _poisoned((8,))  # request 1 reads positions 1..6: values 41, 42, 43 (entry 0), 80, 81, 82 (entry 1)

    def call(size):
        kvdispatch.create_flashinfer_kv_indices(table, pool, lens, indptr, out, kv_start_idx=start, entry_page_size=4,
                                                token_mapping=torch.arange(size, device=DEVICE))

    for size, token, position, entry, value in ((43, 2, 3, 0, 43), (82, 5, 6, 1, 82), (41, 0, 1, 0, 41)):
        slot = (entry + 1) * 10
        message = (rf"request 1: token {token} \(position {position}, req_to_token\[0, {entry}\] = {slot}\) "
                   rf"has value {value}, outside token_mapping's \[0, {size}\)")
        with pytest.raises(ValueError, match=message):
            call(size)
        assert (out == POISON).all()
    call(83)  # request 0 reads 0 and 1 (entry 0 of row 1)
    assert out.cpu().tolist() == [0, 1, 41, 42, 43, 80, 81, 82]
