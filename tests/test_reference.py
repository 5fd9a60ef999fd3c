"""The torch reference against the contract written as a plain loop (tests/kvcases.py)."""

import pytest
import torch

from kvdispatch import ops
from kvcases import POISON, loop_page_table, loop_token_csr, make_case

PAGE_SIZES = (1, 2, 3, 16, 64, 96, 4096)
BATCHES = (0, 1, 37, 513)


@pytest.mark.representative("page_size", "batch")
@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("index_dtype", (torch.int32, torch.int64))
@pytest.mark.parametrize("with_start", (False, True))
def test_page_table_matches_loop(page_size, batch, index_dtype, with_start):
    case = make_case(batch, page_size, max_pages=3 if batch > 37 else 7, index_dtype=index_dtype,
                     with_start=with_start, strided_table=True, strided_out=True)
    out = case.page_table_out()
    expected = loop_page_table(case, out)
    ops.page_table.reference(case.req_to_token, case.req_pool_indices, case.seq_lens, out, page_size,
                               case.kv_start_idx)
    assert torch.equal(out, expected)


@pytest.mark.parametrize("page_size", (1, 3, 64))
@pytest.mark.parametrize("fill_value", (None, -1, 7))
@pytest.mark.parametrize("seqlen_offset", (0, 3, -2))
def test_page_table_options_match_loop(page_size, fill_value, seqlen_offset):
    case = make_case(9, page_size, with_start=True, seqlen_offset=seqlen_offset, fill_value=fill_value)
    out, seq_out = case.page_table_out(), case.seq_lens_out()
    expected_seq = seq_out.clone()
    expected = loop_page_table(case, out, expected_seq)
    ops.page_table.reference(case.req_to_token, case.req_pool_indices, case.seq_lens, out, page_size,
                               case.kv_start_idx, seqlen_offset, seq_out, fill_value)
    assert torch.equal(out, expected)
    assert torch.equal(seq_out, expected_seq)
    assert (seq_out[case.batch:] == POISON).all()


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("with_start", (False, True))
@pytest.mark.parametrize("index_dtype", (torch.int32, torch.int64))
def test_token_csr_matches_loop(batch, with_start, index_dtype):
    case = make_case(batch, 5, max_pages=4, with_start=with_start, index_dtype=index_dtype, strided_table=True)
    indptr, out = case.csr()
    expected = loop_token_csr(case, indptr, out)
    ops.token_csr.reference(case.req_to_token, case.req_pool_indices, case.seq_lens, indptr, out,
                                  case.kv_start_idx)
    assert torch.equal(out, expected)


def test_hostile_data_matches_loop():
    case = make_case(8, 4, with_start=True, fill_value=-1)
    rows, cols = case.req_to_token.shape
    case.req_pool_indices[0] = rows          # past the pool
    case.req_pool_indices[1] = -1            # negative pool index
    case.seq_lens[2] = -5                    # negative length
    case.seq_lens[3] = cols * 3              # length past the table
    case.kv_start_idx[4] = cols + 2          # start past the table
    case.kv_start_idx[5] = -3                # negative start
    out = case.page_table_out()
    expected = loop_page_table(case, out)
    ops.page_table.reference(case.req_to_token, case.req_pool_indices, case.seq_lens, out, 4,
                               case.kv_start_idx, 0, None, -1)
    assert torch.equal(out, expected)

    indptr, out = case.csr()
    indptr[6] = out.shape[0] - 2             # runs past the end of out
    indptr[7] = -4                           # starts before out, reaching at most over the empty rows 0-2
    case.seq_lens[7] = min(int(case.seq_lens[7]), 4 + int(indptr[3]))  # (overlapping rows: any covering row's)
    expected = loop_token_csr(case, indptr, out)
    ops.token_csr.reference(case.req_to_token, case.req_pool_indices, case.seq_lens, indptr, out,
                                  case.kv_start_idx)
    assert torch.equal(out, expected)
