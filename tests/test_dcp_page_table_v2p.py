"""``kvdispatch.create_dcp_page_table(..., v2p=...)``: one DCP rank's block table through the unified pool's
virtual-to-physical page table, on every backend: negative slots, freed pages, pages past ``v2p``, values past
int32; its argument errors and debug checks."""

from __future__ import annotations

import pytest
import torch

from conftest import BACKENDS, DEVICE, through
from kvcases import POISON
from kvdispatch import ops


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("v2p_dtype", (torch.int32, torch.int64))
def test_pages_are_translated(backend, v2p_dtype):
    page_size, dcp_size, rank = 2, 2, 1
    virtual_page = page_size * dcp_size
    # row 0 reads positions 1, 5, 9, 13: slots -1 (page 0), 20 (page 5), 8 (page 2, freed) and 400 (page 100,
    # past v2p); row 1 reads slot 7 (page 1, past int32 with an int64 v2p)
    table = torch.zeros((2, 16), dtype=torch.int32)
    table[0, 1::4] = torch.tensor([-1, 20, 8, 400], dtype=torch.int32)
    table[1, 1] = 7
    v2p = torch.tensor([11, 2**33 + 3 if v2p_dtype == torch.int64 else 12, -1, 0, 0, 6], dtype=v2p_dtype)
    out = torch.full((3, 5), POISON, dtype=torch.int32, device=DEVICE)
    through(backend, "create_dcp_page_table", table.to(DEVICE), torch.tensor([0, 1], device=DEVICE),
            torch.tensor([8, 2], device=DEVICE), out, page_size=page_size, dcp_size=dcp_size, dcp_rank=rank,
            v2p=v2p.to(DEVICE))
    second = 3 if v2p_dtype == torch.int64 else 12  # the low 32 bits
    assert out.cpu().tolist() == [[11, 6, 0, 0, POISON], [second] + [POISON] * 4, [POISON] * 5]
    assert virtual_page == 4
    out.fill_(POISON)
    through(backend, "create_dcp_page_table", table.to(DEVICE), torch.tensor([0, 1], device=DEVICE),
            torch.tensor([8, 2], device=DEVICE), out, page_size=page_size, dcp_size=dcp_size, dcp_rank=rank,
            fill_value=-7, v2p=v2p[:0].to(DEVICE))  # an empty v2p: every page is the padding page
    assert out.cpu().tolist()[:2] == [[0, 0, 0, 0, -7], [0, -7, -7, -7, -7]]


@pytest.mark.parametrize("v2p, error, words", [
    (torch.zeros(4, dtype=torch.float32), TypeError, "v2p"),
    (torch.zeros((2, 2), dtype=torch.int64), ValueError, "v2p"),
    (torch.zeros(8, dtype=torch.int64)[::2], ValueError, "v2p must be contiguous"),
])
def test_bad_v2p_is_refused(v2p, error, words):
    out = torch.full((2, 3), 5, dtype=torch.int32)
    with pytest.raises(error, match=words):
        through("torch", "create_dcp_page_table", torch.zeros((2, 8), dtype=torch.int32),
                torch.zeros(2, dtype=torch.int64), torch.ones(2, dtype=torch.int64), out,
                page_size=1, dcp_size=2, dcp_rank=0, v2p=v2p)
    assert (out == 5).all()


def test_v2p_sharing_memory_with_out_is_refused():
    buffer = torch.zeros(20, dtype=torch.int32)
    with pytest.raises(ValueError, match="out shares memory with v2p"):
        through("torch", "create_dcp_page_table", torch.zeros((2, 8), dtype=torch.int32),
                torch.zeros(2, dtype=torch.int64), torch.ones(2, dtype=torch.int64), buffer[:6].view(2, 3),
                page_size=1, dcp_size=2, dcp_rank=0, v2p=buffer[4:])


def test_debug_check_names_a_page_past_v2p():
    table = torch.tensor([[0, 9, 0, 30]], dtype=torch.int32)
    check = ops.dcp_page_table.check_data
    with pytest.raises(ValueError, match=r"request 0: page 1 \(slot 30\) reads page 15 of v2p, outside its \[0, 15\)"):
        check(table, torch.tensor([0]), torch.tensor([2]), torch.zeros((1, 2), dtype=torch.int32), 1, 2, 1,
              v2p=torch.zeros(15, dtype=torch.int64))
    check(table, torch.tensor([0]), torch.tensor([2]), torch.zeros((1, 2), dtype=torch.int32), 1, 2, 1,
          v2p=torch.zeros(16, dtype=torch.int64))
