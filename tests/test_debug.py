"""``KVDISPATCH_DEBUG=1``: hostile data raises a ValueError naming the request and the value, before any write.

Without the switch the same data gives the contract's safe results on every backend under test.
``kvdispatch._debug.enabled()`` reads the environment on every call, so it can be flipped mid-process.
"""

import random

import pytest
import torch

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
    """No false alarms: rows reaching exactly the table's end, empty rows, empty rows pointing at out's end."""
    monkeypatch.setenv("KVDISPATCH_DEBUG", "1")
    kvdispatch.reset()  # the switch is read at import and by reset()
    case = make_case(6, 16, max_pages=5, device=DEVICE, with_start=True, fill_value=-1)
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
    reference.build_token_indices(case.req_to_token, case.req_pool_indices, case.seq_lens, indptr, reference_out,
                                  case.kv_start_idx)
    assert torch.equal(reference_out.cpu(), expected)
    token_csr(backend, case.req_to_token, case.req_pool_indices, case.seq_lens, indptr, flat,
              kv_start_idx=case.kv_start_idx)
    assert torch.equal(flat.cpu(), expected)
