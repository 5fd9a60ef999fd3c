"""Every backend against the torch reference, on fresh random cases with poisoned outputs.

On CPU: torch, Triton in its interpreter, and the CUDA source built for the host (``cupy-host``).
On a GPU: torch, triton and cupy on CUDA tensors (or the one ``KVDISPATCH_BACKEND`` forces).
"""

import pytest
import torch

from conftest import BACKENDS, DEVICE, page_table, token_csr
from kvdispatch import ops
from kvdispatch import grid
from kvcases import POISON, assert_same, loop_page_table, make_case

PAGE_SIZES = (1, 2, 3, 16, 64, 96, 4096)
BATCHES = (0, 1, 37, 513)


def _pages_for(page_size, batch):
    # Rows span more than one program so program boundaries are exercised, except for huge batches.
    return grid.items_per_program(grid.PAGE_TABLE, page_size) + 5 if batch <= 37 else 3


def _expected_page_table(case, out, seq_lens_out=None):
    expected = out.clone()
    expected_seq = seq_lens_out.clone() if seq_lens_out is not None else None
    ops.page_table.reference(case.req_to_token, case.req_pool_indices, case.seq_lens, expected,
                               case.page_size, case.kv_start_idx, case.seqlen_offset, expected_seq,
                               case.fill_value)
    return expected, expected_seq


def _check_page_table(backend, case, with_seq_out=False):
    out = case.page_table_out()
    seq_out = case.seq_lens_out() if with_seq_out else None
    expected, expected_seq = _expected_page_table(case, out, seq_out)
    result = page_table(backend, case.req_to_token, case.req_pool_indices, case.seq_lens, out,
                        page_size=case.page_size, kv_start_idx=case.kv_start_idx,
                        seqlen_offset=case.seqlen_offset, seq_lens_out=seq_out, fill_value=case.fill_value)
    assert result is out
    torch.testing.assert_close(out.cpu(), expected.cpu(), rtol=0, atol=0)
    if with_seq_out:
        torch.testing.assert_close(seq_out.cpu(), expected_seq.cpu(), rtol=0, atol=0)
    return out


@pytest.mark.representative("page_size")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("batch", BATCHES)
def test_page_table(backend, page_size, batch):
    # Options vary with the case so every combination of dtype, start and strides is met somewhere.
    i = PAGE_SIZES.index(page_size) + BATCHES.index(batch)
    case = make_case(batch, page_size, max_pages=_pages_for(page_size, batch), device=DEVICE,
                     index_dtype=(torch.int32, torch.int64)[i % 2], with_start=bool(i // 2 % 2),
                     strided_table=bool(i // 4 % 2), strided_out=bool(i % 3 == 0))
    out = _check_page_table(backend, case)
    assert (out[case.batch:] == POISON).all()


@pytest.mark.representative("page_size", "option")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("page_size", (1, 16, 96))
@pytest.mark.parametrize("index_dtype", (torch.int32, torch.int64))
@pytest.mark.parametrize("with_start", (False, True))
@pytest.mark.parametrize("option", ("plain", "fill", "offset", "strided"))
def test_page_table_options(backend, page_size, index_dtype, with_start, option):
    case = make_case(5, page_size, max_pages=_pages_for(page_size, 5), device=DEVICE, index_dtype=index_dtype,
                     with_start=with_start, strided_table=option == "strided", strided_out=option == "strided",
                     fill_value=-1 if option == "fill" else None, seqlen_offset=3 if option == "offset" else 0)
    _check_page_table(backend, case, with_seq_out=option == "offset")


@pytest.mark.representative("page_size", "round_toward_zero")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("page_size", (1, 7, 16, 64, 96))
@pytest.mark.parametrize("round_toward_zero", (False, True))
@pytest.mark.parametrize("with_start", (False, True))
def test_page_table_negative_slots(backend, page_size, round_toward_zero, with_start):
    """Negative slot ids, the int32 extremes and their neighbours included, divided rounding down or toward
    zero: the reference and the plain loop agree, and the backend gives the same."""
    case = make_case(6, page_size, max_pages=_pages_for(page_size, 6), with_start=with_start, device=DEVICE)
    extremes = torch.tensor([-2**31, -2**31 + 1, 2**31 - 1, 2**31 - 2, -1, 1 - page_size, -page_size,
                             -page_size - 1], dtype=torch.int32)
    slots = torch.randint(-2**31, 2**31, case.req_to_token.shape, dtype=torch.int64).to(torch.int32)
    slots.view(-1)[::3] = extremes.repeat(slots.numel())[: slots.view(-1)[::3].numel()]
    case.req_to_token.copy_(slots)
    out = case.page_table_out()
    expected = out.clone()
    ops.page_table.reference(case.req_to_token, case.req_pool_indices, case.seq_lens, expected, page_size,
                               case.kv_start_idx, round_toward_zero=round_toward_zero)
    assert_same(expected, loop_page_table(case, out, round_toward_zero=round_toward_zero), "reference")
    result = page_table(backend, case.req_to_token, case.req_pool_indices, case.seq_lens, out,
                        page_size=page_size, kv_start_idx=case.kv_start_idx, round_toward_zero=round_toward_zero)
    assert result is out
    assert_same(out, expected.cpu(), "page table")


def _check_token_csr(backend, case, indptr, out):
    """One token-CSR call of ``backend`` on ``case`` into the poisoned ``out``, against the torch reference."""
    expected = out.clone()
    ops.token_csr.reference(case.req_to_token, case.req_pool_indices, case.seq_lens, indptr, expected,
                                  case.kv_start_idx)
    assert token_csr(backend, case.req_to_token, case.req_pool_indices, case.seq_lens, indptr, out,
                     kv_start_idx=case.kv_start_idx) is out
    torch.testing.assert_close(out.cpu(), expected.cpu(), rtol=0, atol=0)


@pytest.mark.representative("batch")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("with_start", (False, True))
def test_token_csr(backend, batch, with_start):
    tokens_per_program = grid.items_per_program(grid.TOKEN_CSR)
    pages = 2 if batch > 37 else tokens_per_program // 64 + 3
    case = make_case(batch, 64, max_pages=pages, device=DEVICE, with_start=with_start,
                     index_dtype=torch.int64 if with_start else torch.int32, strided_table=batch % 2 == 1)
    _check_token_csr(backend, case, *case.csr())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fill_value", (None, -1))
def test_hostile_data(backend, fill_value):
    """Out-of-range pool indices, bad lengths and starts, CSR pointers past ``out``: safe results."""
    case = make_case(10, 16, max_pages=40, device=DEVICE, with_start=True, fill_value=fill_value,
                     index_dtype=torch.int64)
    rows, cols = case.req_to_token.shape
    for b, (pool, length, start) in enumerate([(rows, None, None), (-1, None, None), (None, -5, None),
                                               (None, cols * 3, None), (None, None, cols + 2),
                                               (None, None, -3), (2**40, None, None), (None, 0, None)]):
        if pool is not None:
            case.req_pool_indices[b] = pool
        if length is not None:
            case.seq_lens[b] = length
        if start is not None:
            case.kv_start_idx[b] = start
    _check_page_table(backend, case)

    indptr, out = case.csr()
    indptr[8] = out.shape[0] - 2             # runs past the end of out
    indptr[9] = -4                           # starts before out: only its 5th token lands, in out[0],
    case.seq_lens[9] = 5                     # which belongs to row 0, empty (its pool index is bad)
    expected = out.clone()
    ops.token_csr.reference(case.req_to_token, case.req_pool_indices, case.seq_lens, indptr, expected,
                                  case.kv_start_idx)
    token_csr(backend, case.req_to_token, case.req_pool_indices, case.seq_lens, indptr, out,
              kv_start_idx=case.kv_start_idx)
    torch.testing.assert_close(out.cpu(), expected.cpu(), rtol=0, atol=0)
