"""``kvdispatch.compat.sglang``'s decode-context-parallel drop-ins on SGLang's call patterns, every backend.

Call patterns (from SGLang's call sites): the Triton attention backend under DCP (int64 ``kv_indices``, int32
``kv_indptr = [0, cumsum(dcp_lens)]``, ``kv_start_idx`` None or a tensor, grid ``(bs,)``); the FlashInfer DCP
updater (int32 ``kv_indices``, stride ``req_to_token.shape[1]``); the Tokenspeed / TRT-LLM MLA block table
(int32, ``PAGES_PER_BLOCK = 4096 // page_size``, grid ``(rows, get_num_kv_index_blocks_flashmla(width,
page_size))``), Aiter's ``build_dcp_page_table`` (zeros, grid ``(bs, blocks)``) and the Tokenspeed unit test
(grid ``(n, cdiv(width, 16))``, ``PAGES_PER_BLOCK = 16``, a table of -1). Page sizes 1, 16, 32, 64; DCP sizes 2,
4, 8, every rank. Expected values come from a plain loop of SGLang's rule (truncating division), on data where
SGLang stays inside the buffers; where it would not, from the reference (the safe result).
"""

import pytest
import torch

from conftest import BACKENDS, DEVICE, dcp_page_table, dcp_token_csr
from kvcases import POISON, assert_same
from kvdispatch import ops

DCP_SIZES = (2, 4, 8)
PAGE_SIZES = (1, 16, 32, 64)


@pytest.fixture
def sglang(monkeypatch, backend):
    """``kvdispatch.compat.sglang`` with its DCP builders routed to ``backend``."""
    from kvdispatch.compat import sglang as module
    from kvdispatch.compat.sglang import _common

    name = backend
    monkeypatch.setattr(_common, "_build_dcp_token_csr",
                        lambda *a, backend=None, **k: dcp_token_csr(name, *a, **k))
    monkeypatch.setattr(_common, "_build_dcp_page_table",
                        lambda *a, backend=None, **k: dcp_page_table(name, *a, **k))
    return module


def generator():
    return torch.Generator().manual_seed(torch.seed() % 2**31)


def virtual_pool(batch, context, page_size, dcp_size, g, spare_rows=2):
    """``req_to_token`` (int32, on DEVICE, rows ``batch + spare_rows``, ``context`` columns) of virtual slot ids:
    each row owns shuffled virtual pages of ``page_size * dcp_size`` slots, token ``t`` at ``page * V + t % V``;
    and ``req_pool_indices`` (int64), a random permutation of the rows."""
    virtual_page = page_size * dcp_size
    rows = batch + spare_rows
    pages_per_row = -(-context // virtual_page)
    pages = torch.randperm(rows * pages_per_row + 5, generator=g)[: rows * pages_per_row].view(rows, -1)
    token = torch.arange(context)
    table = pages[:, token // virtual_page] * virtual_page + token % virtual_page
    pool = torch.randperm(rows, generator=g)[:batch]
    return table.to(torch.int32).to(DEVICE), pool.to(DEVICE)


def sglang_csr_loop(table, pool, lens, indptr, out, dcp_size, dcp_rank, start=None):
    """SGLang's DCP token-CSR rule on in-bounds data (asserted), truncating division and remainder."""
    result = out.cpu().clone()
    values = table.cpu().tolist()
    for b in range(lens.shape[0]):
        s = int(start[b]) if start is not None else 0
        first = s + int(torch.fmod(torch.tensor(dcp_rank + dcp_size - int(torch.fmod(torch.tensor(s), dcp_size))),
                                   dcp_size))
        for j in range(int(lens[b])):
            position = first + j * dcp_size
            assert 0 <= position < table.shape[1]
            result[int(indptr[b]) + j] = int(values[int(pool[b])][position] / dcp_size)  # truncating
    return result


def sglang_table_loop(table, pool, lens, out, page_size, dcp_size, dcp_rank, rows, covered):
    """SGLang's DCP block-table rule for the grid's ``rows`` and ``covered`` pages, on in-bounds data."""
    result = out.cpu().clone()
    values = table.cpu().tolist()
    virtual_page = page_size * dcp_size
    for r in range(rows):
        pages = -(-int(lens[r]) // page_size)
        for p in range(min(pages, covered)):
            assert p < result.shape[1]
            result[r, p] = int(values[int(pool[r])][dcp_rank + p * virtual_page] / virtual_page)
    return result


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dcp_size", DCP_SIZES)
@pytest.mark.parametrize("with_start", (False, True))
@pytest.mark.parametrize("engine", ("triton", "flashinfer"))
def test_token_csr_call_patterns(sglang, backend, dcp_size, with_start, engine):
    g = generator()
    batch, context = int(torch.randint(1, 5, (1,), generator=g)), 200
    table, pool = virtual_pool(batch, context, 1, dcp_size, g)
    seq_lens = torch.randint(1, context + 1, (batch,), generator=g).to(DEVICE)
    # Sliding window: the start is seq_lens - window where positive.
    start = (seq_lens - torch.randint(1, 64, (batch,), generator=g).to(DEVICE)).clamp(min=0).to(torch.int32) \
        if with_start else None
    lengths = seq_lens - (start if with_start else 0)
    out_dtype, stride = (torch.int64, table.stride(0)) if engine == "triton" else (torch.int32, table.shape[1])
    for rank in range(dcp_size):
        dcp_lens = sglang.get_dcp_lens(lengths, dcp_size, rank, start)
        indptr = torch.zeros(batch + 1, dtype=torch.int32, device=DEVICE)
        indptr[1:] = torch.cumsum(dcp_lens, 0)
        out = torch.full((int(indptr[-1]) + 3,), POISON, dtype=out_dtype, device=DEVICE)
        expected = sglang_csr_loop(table, pool, dcp_lens, indptr, out, dcp_size, rank, start)
        result = sglang.create_triton_kv_indices_for_dcp_triton[(batch,)](
            table, pool, dcp_lens, indptr, start, out, stride, dcp_size, rank)
        assert result is out
        assert_same(out, expected, f"rank {rank}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("dcp_size", DCP_SIZES)
def test_page_table_call_patterns(sglang, backend, page_size, dcp_size):
    """Tokenspeed (rows of the table, a table of -1) and Aiter (zeros of ``(bs, max_pages)``) at every rank."""
    g = generator()
    virtual_page = page_size * dcp_size
    batch, context = int(torch.randint(1, 4, (1,), generator=g)), 3 * virtual_page + 5
    table, pool = virtual_pool(batch, context, page_size, dcp_size, g)
    seq_lens = torch.randint(1, context + 1, (batch,), generator=g).to(DEVICE)
    width = -(-context // virtual_page)
    for rank in range(dcp_size):
        local = sglang.get_dcp_lens(seq_lens, dcp_size, rank).to(torch.int32)
        per_block = sglang.get_num_page_per_block_flashmla(page_size)
        assert per_block == 4096 // page_size
        for fill in (-1, 0):
            out = torch.full((batch, width), fill, dtype=torch.int32, device=DEVICE)
            grid = (out.shape[0], sglang.get_num_kv_index_blocks_flashmla(out.shape[1], page_size))
            expected = sglang_table_loop(table, pool, local, out, page_size, dcp_size, rank, batch, width)
            sglang.create_mla_kv_page_table_for_dcp[grid](table, pool, local, out, None, table.stride(0),
                                                          out.stride(0), PHYSICAL_PAGE_SIZE=page_size,
                                                          DCP_SIZE=dcp_size, DCP_RANK=rank,
                                                          PAGES_PER_BLOCK=per_block, HAS_V2P=False)
            assert_same(out, expected, f"rank {rank}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_page_table_grid_decides_rows_and_pages(sglang, backend):
    """Tokenspeed's unit-test launch (16 pages per block): the grid's rows and covered pages are written, the rest
    untouched; a grid covering more pages than the row holds stops at the row's end (SGLang writes those pages
    into the next row), as does a flat buffer read as rows of ``block_table_stride``."""
    g = generator()
    page_size, dcp_size, rank = 1, 2, 1
    rows, width = 4, 40
    context = 2 * 2 * width
    table, pool = virtual_pool(rows, context, page_size, dcp_size, g, spare_rows=1)
    local = torch.full((rows,), 2 * width, dtype=torch.int32, device=DEVICE)  # twice the width: rows overflow
    for grid in ((rows, -(-width // 16)), (2, 1), (rows, 1), (rows, 8)):
        out = torch.full((rows + 1, width), -1, dtype=torch.int32, device=DEVICE)
        covered = min(grid[1] * 16, width)
        expected = out.cpu().clone()
        ops.dcp_page_table.reference(table.cpu(), pool.cpu()[: grid[0]], local.cpu()[: grid[0]],
                                       expected[: grid[0], :covered], page_size, dcp_size, rank,
                                       round_toward_zero=True)
        sglang.create_mla_kv_page_table_for_dcp[grid](table, pool, local, out, None, table.stride(0), width,
                                                      page_size, dcp_size, rank, 16, False)
        assert_same(out, expected, f"grid {grid}")
    flat = torch.full((rows * width,), -1, dtype=torch.int32, device=DEVICE)
    grid = lambda meta: (rows, -(-meta["block_table_stride"] // meta["PAGES_PER_BLOCK"]))  # noqa: E731
    sglang.create_mla_kv_page_table_for_dcp[grid](table, pool, local, flat, None, table.stride(0), width,
                                                  page_size, dcp_size, rank, 16, False)
    assert_same(flat.view(rows, width), expected[:rows], "flat buffer")
    with pytest.raises(ValueError, match=r"holds 4 rows .* launches 5 \(grid\[0\]\)"):
        sglang.create_mla_kv_page_table_for_dcp[(rows + 1, 3)](table, pool, torch.cat([local, local[:1]]), flat, None,
                                                               table.stride(0), width, page_size, dcp_size, rank, 16,
                                                               False)
    identity = torch.arange(int(table.max()) // (page_size * dcp_size) + 1, device=DEVICE)  # HAS_V2P: pages as they are
    flat.fill_(-1)
    sglang.create_mla_kv_page_table_for_dcp[grid](table, pool, local, flat, identity, table.stride(0), width,
                                                  page_size, dcp_size, rank, 16, True)
    assert_same(flat.view(rows, width), expected[:rows], "an identity v2p")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("q_len", (1, 3))
def test_page_table_rows_of_a_wider_layout(sglang, backend, q_len):
    """Aiter's DCP verify token table: a ``[bs * q_len, num_cols]`` buffer with ``block_table_stride = q_len *
    num_cols``, so request ``r``'s row starts at row ``r * q_len``; page size 1, 16 pages per block, grid ``(bs,
    cdiv(num_cols, 16))``. SGLang's rule on every element: each request's row of ``q_len * num_cols`` entries gets
    its shard's tokens, everything else keeps its value."""
    g = generator()
    dcp_size, rank, bs, num_cols = 4, 2, 3, 32
    table, pool = virtual_pool(bs, dcp_size * num_cols, 1, dcp_size, g)
    local = torch.randint(0, num_cols + 1, (bs,), generator=g).to(torch.int32).to(DEVICE)
    out = torch.full((bs * q_len, num_cols), POISON, dtype=torch.int32, device=DEVICE)
    grid = (bs, -(-num_cols // 16))
    rows = out.cpu().clone().view(bs, q_len * num_cols)
    expected = sglang_table_loop(table, pool, local, rows, 1, dcp_size, rank, bs, grid[1] * 16).view(out.shape)
    sglang.create_mla_kv_page_table_for_dcp[grid](table, pool, local, out, None, table.stride(0), q_len * num_cols,
                                                  PHYSICAL_PAGE_SIZE=1, DCP_SIZE=dcp_size, DCP_RANK=rank,
                                                  PAGES_PER_BLOCK=16, HAS_V2P=False)
    assert_same(out, expected, f"q_len {q_len}")
    with pytest.raises(ValueError, match="must be contiguous"):
        wide = torch.full((bs * q_len, num_cols + 4), POISON, dtype=torch.int32, device=DEVICE)
        sglang.create_mla_kv_page_table_for_dcp[grid](table, pool, local, wide[:, :num_cols], None, table.stride(0),
                                                      q_len * num_cols, 1, dcp_size, rank, 16, False)


@pytest.mark.parametrize("backend", BACKENDS)
def test_token_csr_takes_the_batch_from_the_grid(sglang, backend):
    """A grid of fewer programs than entries: only those requests are written; a length past the table's row
    ends the row there (SGLang would read the next row); the stride is checked."""
    g = generator()
    dcp_size, rank = 4, 3
    table, pool = virtual_pool(3, 50, 1, dcp_size, g)
    lens = torch.tensor([5, 40, 7], dtype=torch.int32, device=DEVICE)  # 40 runs past the row's 12 owned positions
    indptr = torch.tensor([0, 5, 45, 52], dtype=torch.int32, device=DEVICE)
    out = torch.full((60,), POISON, dtype=torch.int64, device=DEVICE)
    expected = out.cpu().clone()
    ops.dcp_token_csr.reference(table.cpu(), pool.cpu()[:2], lens.cpu()[:2], indptr.cpu(), expected, dcp_size,
                                      rank, None, True)
    sglang.create_triton_kv_indices_for_dcp_triton[(2,)](table, pool, lens, indptr, None, out, table.stride(0),
                                                         dcp_size, rank)
    assert_same(out, expected, "grid of 2")
    assert int((out != POISON).sum()) == 5 + 12
    with pytest.raises(ValueError, match="req_to_token_ptr_stride"):
        sglang.create_triton_kv_indices_for_dcp_triton[(2,)](table, pool, lens, indptr, None, out, 7, dcp_size, rank)


def _owned_before(x, dcp_size, rank, interleave):
    """SGLang's count of the rank's positions before ``x`` (floor division: negative ``x`` included)."""
    cycle = dcp_size * interleave
    return x // cycle * interleave + min(max(x % cycle - rank * interleave, 0), interleave)


def test_get_dcp_lens_interleaved_runs():
    """``interleave_size``: runs of that many positions rotate over the ranks. Against SGLang's formula and a
    plain count of the positions, with and without a start, negative lengths included (SGLang's count is then
    negative: no clamp), int32 and int64."""
    from kvdispatch.compat.sglang import get_dcp_lens

    g = generator()
    for dtype in (torch.int32, torch.int64):
        lens = torch.randint(-40, 300, (48,), generator=g).to(dtype)
        start = torch.randint(0, 200, (48,), generator=g).to(dtype)
        for dcp_size, interleave in ((2, 1), (4, 16), (3, 5), (8, 64)):
            for rank in range(dcp_size):
                plain = get_dcp_lens(lens, dcp_size, rank, interleave_size=interleave)
                with_start = get_dcp_lens(lens, dcp_size, rank, start, interleave)
                assert plain.dtype == dtype and with_start.dtype == dtype
                for b in range(48):
                    n, s = int(lens[b]), int(start[b])
                    owned = sum(1 for p in range(s, s + n) if (p // interleave) % dcp_size == rank)
                    assert int(plain[b]) == _owned_before(n, dcp_size, rank, interleave)
                    assert int(with_start[b]) == (_owned_before(s + n, dcp_size, rank, interleave)
                                                  - _owned_before(s, dcp_size, rank, interleave))
                    if n >= 0:
                        assert int(with_start[b]) == owned
    big = torch.tensor([2**63 - 1, -(2**63), 2**62], dtype=torch.int64)
    start = torch.tensor([2**63 - 1, 5, 2**62], dtype=torch.int64)
    for dcp_size, rank, interleave in ((8, 7, 1), (3, 1, 64), (1024, 1000, 2**31 - 1)):
        expected = [_owned_before(s + n, dcp_size, rank, interleave) - _owned_before(s, dcp_size, rank, interleave)
                    for n, s in zip(big.tolist(), start.tolist())]
        assert get_dcp_lens(big, dcp_size, rank, start, interleave).tolist() == expected
        assert get_dcp_lens(big, dcp_size, rank, None, interleave).tolist() == [
            _owned_before(n, dcp_size, rank, interleave) for n in big.tolist()]


def test_get_dcp_lens_matches_sglang_formulas():
    """``get_dcp_lens``: without a start ``lens // D + (rank < lens % D)`` in lens' dtype (negative lengths
    included), with one the count of owned positions in the promoted dtype (negative for a negative length, as
    in SGLang); ``lens`` itself at ``D == 1``; at the int64 extremes the exact count."""
    from kvdispatch.compat.sglang import get_dcp_lens

    g = generator()
    lens = torch.randint(-20, 300, (64,), generator=g, dtype=torch.int32)
    start = torch.randint(0, 100, (64,), generator=g)
    assert get_dcp_lens(lens, 1, 0) is lens
    for dcp_size in DCP_SIZES:
        for rank in range(dcp_size):
            plain = get_dcp_lens(lens, dcp_size, rank)
            assert plain.dtype == torch.int32
            assert torch.equal(plain, lens // dcp_size + (rank < lens % dcp_size).to(torch.int32))
            with_start = get_dcp_lens(lens, dcp_size, rank, start)
            expected = (start + lens - 1 - rank) // dcp_size - (start - 1 - rank) // dcp_size
            assert with_start.dtype == torch.int64 and torch.equal(with_start, expected)
    big = torch.tensor([2**63 - 1, -(2**63)], dtype=torch.int64)
    assert get_dcp_lens(big, 8, 7, torch.tensor([2**63 - 1, 0])).tolist() == [
        (2**64 - 2 - 1 - 7) // 8 - (2**63 - 1 - 1 - 7) // 8, (-(2**63) - 1 - 7) // 8 - (-1 - 7) // 8]
    assert get_dcp_lens(big, 8, 7).tolist() == [(2**63 - 1 - 8) // 8 + 1, -(2**63) // 8]
