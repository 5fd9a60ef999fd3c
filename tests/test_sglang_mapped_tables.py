"""SGLang's mapped page tables through ``kvdispatch.compat.sglang``, on the call patterns of their engines.

* The TRT-LLM MHA backend (and the hpc / FlashAttention backends, which launch the kernel without SWA): an
  int32 page table ``[bs, ceil(max_context_len / page)]``, int64 request rows, int32 cache lengths; eager
  (a fresh uninitialised buffer per step) and graph replay (a persistent buffer rebuilt in place); SWA hybrid
  models with an int64 ``full_to_swa`` mapping into the sliding-window pool.
* The unified pool's ``KVIndexTranslator``: ``build_kv_read_table`` with an int64 ``v2p`` holding -1 for freed
  pages, the draft tokens as ``seq_len_delta``; eager fresh zeros and a reused buffer whose stale tail must
  survive (``zero_tail=False``; ``zero_tail=True`` zeroes it up to ``max_pages``).

Every backend in ``conftest.BACKENDS``; each result is checked against ``kvdispatch.reference`` run on a copy of
the output as it was before the call, and against the pool's own bookkeeping.
"""

from __future__ import annotations

import random

import pytest
import torch

from conftest import BACKENDS, DEVICE
from kvcases import POISON
from kvdispatch import ops
from pagepool import populate
from test_sglang_patterns import _batch, _churn, _pool, _replayer, _same, _scale, _vec

PAGE_SIZES = (1, 16, 32, 64, 128)
ODD_PAGE_SIZE = 24  # not a power of two (the unified pool's builders take any page size)


def _swa_mapping(pool, rng):
    """An int64 ``full_to_swa`` over every full-pool slot: a scattered slot of the smaller SWA pool, -1 for
    some (slots the window has dropped)."""
    slots = len(pool.refcount) * pool.page_size
    values = [rng.randrange(slots // 2) if rng.random() < 0.9 else -1 for _ in range(slots)]
    return torch.tensor(values, dtype=torch.int64, device=DEVICE)


def _expected_mha(page_table, swa_page_table, table, rows, lens, page_size, full_to_swa):
    expected = page_table.clone()
    expected_swa = None if swa_page_table is None else swa_page_table.clone()
    ops.mha_page_table.reference(table, rows, lens, expected, page_size, expected_swa, full_to_swa, True)
    return expected, expected_swa


def _check_mha_against_pool(pool, rids, page_table, swa_page_table, full_to_swa, page_size):
    """Row ``b`` holds request ``rids[b]``'s pages; its SWA row, each page's first slot mapped, divided."""
    mapping = None if full_to_swa is None else full_to_swa.cpu().tolist()
    for b, rid in enumerate(rids):
        pages = pool.block_table(rid)
        assert page_table[b, : len(pages)].cpu().tolist() == pages, f"request {rid} (row {b})"
        if mapping is not None:
            swa = [int(mapping[page * page_size] / page_size) for page in pages]  # truncating
            assert swa_page_table[b, : len(pages)].cpu().tolist() == swa, f"request {rid} (row {b}) SWA"


# -- the TRT-LLM MHA page table ----------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("mode", ("eager", "graph"))
@pytest.mark.parametrize("swa", (False, True))
def test_trtllm_mha_page_table(backend, page_size, mode, swa, compat):
    scale = _scale(backend)
    pool = _pool(page_size, scale, seed=13 * page_size + len(mode) + swa)
    populate(pool, scale.batch, min_len=1, max_len=scale.max_len)
    table = pool.req_to_token
    rng = random.Random(page_size + swa)
    full_to_swa = _swa_mapping(pool, rng) if swa else None
    bs, max_bs = scale.batch, scale.batch + 2
    width = -(-pool.max_context_len // page_size)  # max_num_pages
    store = torch.full((max_bs, width), -1, dtype=torch.int32, device=DEVICE)
    swa_store = torch.full((max_bs, width), -1, dtype=torch.int32, device=DEVICE) if swa else None
    rows_buf = torch.zeros(bs, dtype=torch.int64, device=DEVICE)
    lens_buf = torch.ones(bs, dtype=torch.int32, device=DEVICE)

    def build():
        assert compat.build_trtllm_mha_page_table(
            req_to_token=table, req_pool_indices=rows_buf, cache_seqlens=lens_buf, page_table=store[:bs],
            page_size=page_size, swa_page_table=None if swa_store is None else swa_store[:bs],
            full_to_swa=full_to_swa) is None

    replay = _replayer(build) if mode == "graph" else None
    for step in range(scale.steps):
        if step:
            _churn(pool, scale)
        pool.sync()
        rids, rows, lens = _batch(pool, bs)
        if mode == "eager":  # a fresh, uninitialised buffer per step
            rows_t, lens_t = _vec(rows, torch.int64), _vec(lens, torch.int32)
            page_table = torch.full((bs, width), POISON, dtype=torch.int32, device=DEVICE)
            swa_table = torch.full((bs, width), POISON, dtype=torch.int32, device=DEVICE) if swa else None
            expected, expected_swa = _expected_mha(page_table, swa_table, table, rows_t, lens_t, page_size,
                                                   full_to_swa)
            compat.build_trtllm_mha_page_table(table, rows_t, lens_t, page_table, page_size, swa_table, full_to_swa)
        else:
            rows_buf.copy_(_vec(rows, torch.int64))
            lens_buf.copy_(_vec(lens, torch.int32))
            page_table, swa_table = store[:bs], None if swa_store is None else swa_store[:bs]
            expected, expected_swa = _expected_mha(page_table, swa_table, table, rows_buf, lens_buf, page_size,
                                                   full_to_swa)
            spare = store[bs:].clone()
            replay()
            _same(store[bs:], spare)
        _same(page_table, expected)
        if swa:
            _same(swa_table, expected_swa)
        _check_mha_against_pool(pool, rids, page_table, swa_table, full_to_swa, page_size)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("page_size", (1, 64))
@pytest.mark.parametrize("swa", (False, True))
def test_trtllm_mha_kernel_launch(backend, page_size, swa, compat):
    """The kernel launched directly, as the hpc and FlashAttention backends do: rows from ``grid[0]`` (fewer
    than the table has: the others stay untouched), SGLang's positional order; with SWA, a ``full_to_swa_numel``
    below the mapping's size clamps there, as in SGLang."""
    scale = _scale(backend)
    pool = _pool(page_size, scale, seed=page_size + 101 * swa)
    populate(pool, scale.batch, min_len=1, max_len=scale.max_len)
    pool.sync()
    table = pool.req_to_token
    rids = pool.live()
    rows, lens = _vec(pool.rows(rids), torch.int64), _vec(pool.lengths(rids), torch.int32)
    width = -(-pool.max_context_len // page_size)
    page_table = torch.full((len(rids), width), POISON, dtype=torch.int32, device=DEVICE)
    swa_table = torch.full_like(page_table, POISON) if swa else None
    full_to_swa = _swa_mapping(pool, random.Random(page_size)) if swa else None
    numel = full_to_swa.numel() // 3 if swa else 0
    launched = len(rids) - 1
    expected, expected_swa = _expected_mha(page_table[:launched], None if swa_table is None else swa_table[:launched],
                                           table, rows[:launched], lens[:launched], page_size,
                                           None if full_to_swa is None else full_to_swa[:numel])
    grid = (launched, compat.get_num_mha_kv_index_blocks(width, page_size))
    result = compat.create_trtllm_mha_kv_indices_triton[grid](
        table, rows, lens, full_to_swa, page_table, swa_table, numel, table.stride(0), page_table.stride(0),
        page_size, swa)
    assert result is None
    _same(page_table[:launched], expected)
    assert (page_table[launched:] == POISON).all()
    if swa:
        _same(swa_table[:launched], expected_swa)
        assert (swa_table[launched:] == POISON).all()
    _check_mha_against_pool(pool, rids[:launched], page_table, None, None, page_size)


def test_trtllm_mha_asserts_are_value_errors():
    from kvdispatch.compat import sglang

    table = torch.zeros((3, 64), dtype=torch.int32, device=DEVICE)
    rows, lens = torch.zeros(2, dtype=torch.int64, device=DEVICE), torch.ones(2, dtype=torch.int32, device=DEVICE)
    page_table = torch.zeros((2, 4), dtype=torch.int32, device=DEVICE)
    mapping = torch.arange(64, device=DEVICE)
    with pytest.raises(ValueError, match="together"):
        sglang.build_trtllm_mha_page_table(table, rows, lens, page_table, 16, full_to_swa=mapping)
    with pytest.raises(ValueError, match="divide 4096"):
        sglang.build_trtllm_mha_page_table(table, rows, lens, page_table, 24)
    with pytest.raises(ValueError, match="row stride"):
        wide = torch.zeros((2, 8), dtype=torch.int32, device=DEVICE)
        sglang.build_trtllm_mha_page_table(table, rows, lens, page_table, 16, wide[:, :4], mapping)
    with pytest.raises(ValueError, match="at least 3"):
        sglang.build_trtllm_mha_page_table(table, rows, lens, torch.zeros((3, 4), dtype=torch.int32, device=DEVICE), 16)
    with pytest.raises(ValueError, match="full_to_swa_numel"):
        sglang.create_trtllm_mha_kv_indices_triton[(2, 1)](table, rows, lens, mapping, page_table, page_table.clone(),
                                                           65, 64, 4, 16, True)
    with pytest.raises(TypeError, match=r"\[grid\]"):
        sglang.create_trtllm_mha_kv_indices_triton(table, rows, lens, None, page_table, None, 0, 64, 4, 16, False)


# -- the unified pool's translated tables -------------------------------------------------------------------

def _v2p(pool, rng):
    """int64 ``v2p`` over every virtual page: a scattered physical page for each page in use, -1 for freed ones."""
    in_use = [count > 0 for count in pool.refcount]
    physical = list(range(len(in_use) * 2))
    rng.shuffle(physical)
    return torch.tensor([physical[v] if used else -1 for v, used in enumerate(in_use)], dtype=torch.int64,
                        device=DEVICE)


def _check_translated_against_pool(pool, rids, out, v2p, max_pages, lengths):
    mapping = v2p.cpu().tolist()
    for b, (rid, length) in enumerate(zip(rids, lengths)):
        pages = pool.block_table(rid, length)[:max_pages]
        assert out[b, : len(pages)].cpu().tolist() == [max(mapping[p], 0) for p in pages], f"request {rid} (row {b})"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("page_size", PAGE_SIZES + (ODD_PAGE_SIZE,))
@pytest.mark.parametrize("num_draft", (0, 3))
@pytest.mark.parametrize("mode", ("eager", "reused"))
def test_unified_pool_translator(backend, page_size, num_draft, mode, compat):
    scale = _scale(backend)
    pool = _pool(page_size, scale, seed=17 * page_size + num_draft + len(mode),
                 extra_tokens=num_draft * (scale.steps + 2))
    populate(pool, scale.batch, min_len=1, max_len=scale.max_len)
    table = pool.req_to_token
    rng = random.Random(page_size * 3 + len(mode))
    columns = table.shape[1]
    max_pages = -(-columns // page_size)  # the widest the builder's assert lets through
    bs = scale.batch
    stale_tail = 5
    reused = torch.full((bs + 2, max_pages + stale_tail), -7, dtype=torch.int32, device=DEVICE)
    for step in range(scale.steps):
        if step:
            _churn(pool, scale)
        rids, rows, committed = _batch(pool, bs)
        for rid in rids:  # the draft tokens' slots, read by a whole-sequence verify
            pool.extend(rid, num_draft)
        pool.sync()
        v2p = _v2p(pool, rng)
        out = torch.zeros((bs, max_pages), dtype=torch.int32, device=DEVICE) if mode == "eager" else reused
        expected = out.clone()
        rows_t, lens_t = _vec(rows, torch.int64), _vec(committed, torch.int32)
        ops.translated_page_table.reference(table, rows_t, lens_t, v2p, expected, page_size, 1, max_pages,
                                              num_draft)
        options = dict(req_to_token=table, req_pool_indices=rows_t, seq_lens=lens_t, v2p=v2p, page_size=page_size,
                       max_pages=max_pages, out=out)
        if num_draft:
            options["seq_len_delta"] = num_draft
        assert compat.build_kv_read_table(**options) is out
        _same(out, expected)
        if mode == "reused":
            assert (reused[:, max_pages:] == -7).all() and (reused[bs:] == -7).all()  # the stale tail survives
        _check_translated_against_pool(pool, rids, out, v2p, max_pages, [n + num_draft for n in committed])
        for rid, n in zip(rids, committed):
            pool.truncate(rid, n + (rng.randint(0, num_draft - 1) + 1 if num_draft else 0))


@pytest.mark.parametrize("backend", BACKENDS)
def test_unified_pool_edges(backend, compat):
    """Negative tokens read virtual page 0, as in SGLang; live columns stop at ``max_pages``; ``bs`` or
    ``max_pages`` 0 leaves ``out`` untouched."""
    table = torch.tensor([[-1, 5, 2, -7, 9, 1], [3, 3, 3, 3, 3, 3]], dtype=torch.int32, device=DEVICE)
    v2p = torch.tensor([11, -1, 2**40, 7, 5, 6, 8, 9, 10, 4], dtype=torch.int64, device=DEVICE)
    rows, lens = _vec([0, 1], torch.int64), _vec([6, 6], torch.int32)
    out = torch.full((3, 6), POISON, dtype=torch.int32, device=DEVICE)
    build = compat.build_kv_read_table
    build(req_to_token=table, req_pool_indices=rows, seq_lens=lens, v2p=v2p, page_size=1, max_pages=4, out=out)
    assert out[0].tolist() == [11, 6, 2**31 - 1, 11, POISON, POISON]
    assert out[1].tolist() == [7] * 4 + [POISON] * 2 and (out[2] == POISON).all()
    before = out.clone()
    build(req_to_token=table, req_pool_indices=rows[:0], seq_lens=lens[:0], v2p=v2p, page_size=1, max_pages=4,
          out=out)
    build(req_to_token=table, req_pool_indices=rows, seq_lens=lens, v2p=v2p, page_size=1, max_pages=0, out=out)
    _same(out, before)


def test_unified_pool_asserts_are_value_errors():
    from kvdispatch.compat import sglang

    table = torch.zeros((2, 64), dtype=torch.int32, device=DEVICE)
    rows, lens = _vec([0, 1], torch.int64), _vec([6, 6], torch.int32)
    v2p = torch.arange(8, device=DEVICE)
    out = torch.zeros((2, 4), dtype=torch.int32, device=DEVICE)
    build = sglang.build_kv_read_table
    common = dict(req_to_token=table, req_pool_indices=rows, seq_lens=lens, v2p=v2p, page_size=16)
    for bad in (dict(out=out.long(), max_pages=4), dict(out=out.view(-1), max_pages=4), dict(out=out, max_pages=5),
                dict(out=out[:1], max_pages=4), dict(out=out.t(), max_pages=2),
                dict(out=out, max_pages=4, page_size=22)):
        with pytest.raises(ValueError):
            build(**dict(common, **bad))
    assert (out == 0).all()
    build(**common, out=out.fill_(POISON), max_pages=3, zero_tail=True)
    assert (out[:, :3] == 0).all() and (out[:, 3] == POISON).all()
