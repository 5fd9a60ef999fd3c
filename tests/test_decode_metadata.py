"""``kvdispatch.update_decode_metadata`` (op ``decode_metadata``): its reference against a plain loop, its argument
errors, and the three SGLang 0.5.23 drop-ins over it against the release's own functions (loaded from
``SGLANG_SOURCE``, run under the Triton interpreter on CPU) on their call sites' argument patterns."""

from __future__ import annotations

import functools

import pytest
import torch

import kvdispatch
from conftest import BACKENDS, DEVICE
from kvcases import POISON, assert_same
from test_bounded_grid import bounded  # noqa: F401  (the fixture)
from test_sglang_against_release import ROOT, release  # noqa: F401  (the fixture)

OP_BACKENDS = [b for b in BACKENDS if b in ("torch", "triton", "cupy")]


def _loop(table, pool, lens, offset, page_size, width, mapping):
    """Plain Python: (cache_seqlens, running sums, page rows, SWA rows) over exact integers."""
    rows, cols = table.shape
    cache, sums, pages, swa, total = [], [], [], [], 0
    for b in range(pool.shape[0]):
        length = int(lens[b]) + offset
        cache.append(length)
        total += length
        sums.append(total)
        row, swa_row = [], []
        if 0 <= int(pool[b]) < rows:
            for p in range(width):
                if p * page_size >= min(length, cols):
                    break
                slot = int(table[int(pool[b]), p * page_size])
                row.append(slot // page_size)
                m = int(mapping[min(slot, mapping.shape[0] - 1)]) if slot >= 0 else -1
                swa_row.append(-1 if m < 0 else m // page_size)
        pages.append(row)
        swa.append(swa_row)
    return cache, sums, pages, swa


@pytest.mark.parametrize("seed", range(4))
def test_reference_against_loop(seed):
    g = torch.Generator().manual_seed(seed)
    page_size, width, batch = (1, 4, 16, 64)[seed], 5, 6
    table = torch.randint(-3, 5000, (4, 3 * page_size + 1), generator=g, dtype=torch.int32)
    pool = torch.tensor([0, 1, 3, -1, 4, 2])
    lens = torch.randint(-2, 6 * page_size, (batch,), generator=g)
    mapping = torch.randint(-1, 900, (4000,), generator=g)
    cache, cu = torch.full((batch + 2,), POISON, dtype=torch.int32), torch.full((batch + 1,), POISON, dtype=torch.int32)
    pt, swa = (torch.full((batch + 1, width), POISON, dtype=torch.int32) for _ in range(2))
    kvdispatch.update_decode_metadata(table, pool, lens, cache, cu, page_size=page_size, seqlen_offset=1,
                                      page_table=pt, swa_page_table=swa, full_to_swa=mapping, backend="torch")
    want_cache, want_sums, pages, swa_rows = _loop(table, pool, lens, 1, page_size, width, mapping)
    assert cache[:batch].tolist() == want_cache and cache[batch:].tolist() == [POISON] * 2
    assert cu.tolist() == [0] + want_sums
    for b in range(batch):
        assert pt[b, :len(pages[b])].tolist() == pages[b] and swa[b, :len(swa_rows[b])].tolist() == swa_rows[b]
        assert (pt[b, len(pages[b]):] == POISON).all() and (swa[b, len(swa_rows[b]):] == POISON).all()
    assert (pt[batch] == POISON).all()


def _args(batch=3):
    table = torch.zeros(4, 64, dtype=torch.int32)
    return (table, torch.zeros(batch, dtype=torch.int64), torch.ones(batch, dtype=torch.int64),
            torch.zeros(batch, dtype=torch.int32), torch.zeros(batch + 1, dtype=torch.int32))


@pytest.mark.parametrize("options, message", [
    (dict(), "cu_seqlens_k must have 3 or 4 entries"),
    (dict(swa_page_table=torch.zeros(3, 4, dtype=torch.int32)), "swa_page_table was given without page_table"),
    (dict(page_table=torch.zeros(3, 4, dtype=torch.int32), swa_page_table=torch.zeros(3, 4, dtype=torch.int32)),
     r"needs full_to_swa \(a slot map\) or swa_v2p"),
    (dict(swa_out_cache_loc=torch.zeros(4, dtype=torch.int64)), "swa_out_cache_loc was given without full_to_swa"),
    (dict(qlens=torch.ones(3, dtype=torch.int64)), "qlens was given without cu_seqlens_q"),
    (dict(cu_seqlens_q=torch.zeros(4, dtype=torch.int32)), "cu_seqlens_q was given without qlens or q_stride"),
    (dict(zero_tail=1), "zero_tail must be a bool"),
    (dict(page_table=torch.zeros(3, 4, dtype=torch.int64)), "page_table must have dtype torch.int32"),
])
def test_argument_errors(options, message):
    table, pool, lens, cache, cu = _args()
    if not options:
        cu = torch.zeros(6, dtype=torch.int32)
    before = cache.clone()
    with pytest.raises((TypeError, ValueError), match=message):
        kvdispatch.update_decode_metadata(table, pool, lens, cache, cu, page_size=16, **options)
    assert torch.equal(cache, before)


def test_outputs_apart():
    table, pool, lens, cache, cu = _args()
    with pytest.raises(ValueError, match="cu_seqlens_k shares memory with cache_seqlens"):
        buffer = torch.zeros(8, dtype=torch.int32)
        kvdispatch.update_decode_metadata(table, pool, lens, buffer[:3], buffer[2:6], page_size=16)


# -- the SGLang drop-ins against the release -------------------------------------------------------------------

@pytest.fixture
def routed(monkeypatch, backend):
    """The drop-ins with ``kvdispatch.update_decode_metadata`` on ``backend``."""
    monkeypatch.setattr(kvdispatch, "update_decode_metadata",
                        functools.partial(kvdispatch.update_decode_metadata, backend=backend))
    from kvdispatch.compat import sglang
    return sglang


def _step(g, page_size, batch, max_pages, offset=0, spare_rows=2):
    """A pool whose requests fit their rows: (table, pool, lens) with lens + offset within max_pages pages."""
    rows, cols = batch + spare_rows, max_pages * page_size
    table = torch.randperm(rows * cols * 2, generator=g)[:rows * cols].view(rows, cols).to(torch.int32)
    pool = torch.randperm(rows, generator=g)[:batch]
    lens = torch.randint(1, cols - offset + 1, (batch,), generator=g)
    return table.to(DEVICE), pool.to(DEVICE), lens.to(DEVICE)


def _poisoned(*shapes, dtype=torch.int32):
    return [torch.full(shape, POISON, dtype=dtype, device=DEVICE) for shape in shapes]


def _compare(theirs, ours, what):
    for index, (a, b) in enumerate(zip(ours, theirs)):
        assert_same(a, b.cpu(), f"{what} (buffer {index})")


@pytest.mark.skipif(ROOT is None, reason="SGLang's source is not here (set SGLANG_SOURCE)")
@pytest.mark.parametrize("backend", OP_BACKENDS)
@pytest.mark.parametrize("pattern", ("hpc_decode", "decode_swa", "verify_swa", "draft_extend_cumsum",
                                     "draft_extend_strided", "unified"))
def test_trtllm_graph_metadata(backend, pattern, release, routed):  # noqa: F811
    module = release("kernels.ops.attention.trtllm_mha_graph_metadata")
    g = torch.Generator().manual_seed(hash(pattern) % 2**31)
    page_size, bs, graph_bs, max_pages = 16, 3, 5, 6
    offset = {"verify_swa": 4, "draft_extend_cumsum": 2}.get(pattern, 0)
    table, pool, lens = _step(g, page_size, bs, max_pages, offset)
    swa = pattern in ("decode_swa", "verify_swa", "draft_extend_cumsum", "draft_extend_strided", "unified")
    mapping = torch.randint(-1, 1 << 20, (table.numel() * 2 + page_size + 1,), generator=g).to(DEVICE)
    locs = torch.randint(0, table.numel() * 2, (bs * 4 - 2,), generator=g).to(DEVICE)
    q_mode = {"draft_extend_cumsum": 1, "draft_extend_strided": 2}.get(pattern, 0)
    qlens = torch.randint(1, 5, (graph_bs,), generator=g).to(DEVICE)
    buffers = _poisoned((graph_bs,), (graph_bs + 1,), (graph_bs, max_pages + 2), (graph_bs, max_pages + 2),
                        (graph_bs + 1,)) + _poisoned((bs * 4,), dtype=torch.int64)
    results = []
    for function, outputs in ((module.update_trtllm_mha_graph_metadata, [b.clone() for b in buffers]),
                              (routed.update_trtllm_mha_graph_metadata, [b.clone() for b in buffers])):
        cache, cu_k, pt, swa_pt, cu_q, swa_loc = outputs
        unified = pattern == "unified"
        function(req_pool_indices=torch.cat([pool, pool[:2]]), seq_lens=torch.cat([lens, lens[:2]]),
                 req_to_token=table, cache_seqlens=cache, cu_seqlens_k=cu_k, page_table=None if unified else pt,
                 bs=bs, seqlen_offset=offset, max_seq_pages=max_pages, page_size=page_size,
                 swa_mapping=mapping if swa else None, swa_page_table=swa_pt if swa and not unified else None,
                 out_cache_loc=locs if swa else None, swa_out_cache_loc=swa_loc if swa and not unified else None,
                 cu_seqlens_q=cu_q if q_mode else None, qlens=qlens if q_mode == 1 else None, q_stride=3,
                 q_mode=q_mode, skip_page_table=unified)
        results.append(outputs)
    _compare(*results, pattern)


@pytest.mark.skipif(ROOT is None, reason="SGLang's source is not here (set SGLANG_SOURCE)")
@pytest.mark.parametrize("backend", OP_BACKENDS)
@pytest.mark.parametrize("pattern", ("plain", "swa_slots", "skip", "v2p_zero_tail", "xpu_swa"))
def test_normal_decode(backend, pattern, release, routed):  # noqa: F811
    module = release("kernels.ops.attention.metadata")
    g = torch.Generator().manual_seed(hash(pattern) % 2**31)
    page_size, bs, max_pages = (1 if pattern == "xpu_swa" else 16), 4, 5
    delta = 2 if pattern in ("plain", "v2p_zero_tail") else 0
    table, pool, lens = _step(g, page_size, bs, max_pages, delta)
    mapping = torch.randint(0, 1 << 20, (table.numel() * 2,), generator=g).to(DEVICE)
    pages = table.numel() * 2 // page_size + 1
    full_v2p = torch.randint(-1, 1 << 16, (pages,), generator=g).to(DEVICE)
    swa_v2p = torch.randint(-1, 1 << 16, (pages,), generator=g).to(DEVICE)
    buffers = _poisoned((bs,), (bs + 2,), (bs + 1, max_pages + 3), (bs + 1, max_pages + 3))
    results = []
    for function, outputs in ((module.normal_decode_set_metadata, [b.clone() for b in buffers]),
                              (routed.normal_decode_set_metadata, [b.clone() for b in buffers])):
        cache, cu_k, pt, swa_pt = outputs
        v2p = pattern == "v2p_zero_tail"
        slots = pattern in ("swa_slots", "skip", "xpu_swa")
        function(cache, cu_k, pt, table, pool, max_pages, lens, delta, page_size,
                 swa_pt if slots or v2p else None, full_to_swa_index_mapping=mapping if slots else None,
                 skip_page_table=pattern == "skip", full_v2p=full_v2p if v2p else None,
                 swa_v2p=swa_v2p if v2p else None, zero_tail=v2p)
        results.append(outputs)
    _compare(*results, pattern)


@pytest.mark.skipif(ROOT is None, reason="SGLang's source is not here (set SGLANG_SOURCE)")
@pytest.mark.parametrize("backend", OP_BACKENDS)
@pytest.mark.parametrize("swa", (False, True))
def test_draft_extend(backend, swa, release, routed):  # noqa: F811
    module = release("kernels.ops.attention.metadata")
    g = torch.Generator().manual_seed(7 + swa)
    page_size, bs, max_pages, per_request = 16, 3, 4, 3
    table, pool, lens = _step(g, page_size, bs, max_pages)
    extend = torch.randint(1, per_request + 1, (bs,), generator=g).to(DEVICE)
    mapping = torch.randint(-1, 1 << 20, (table.numel() * 2,), generator=g).to(DEVICE)
    locs = torch.randint(0, table.numel() * 2, (bs * per_request,), generator=g).to(DEVICE)
    buffers = _poisoned((bs,), (bs + 1,), (bs + 1,), (bs, max_pages), (bs, max_pages)) + _poisoned(
        (bs * per_request,), dtype=torch.int64)
    results = []
    for function, outputs in ((module.draft_extend_set_metadata, [b.clone() for b in buffers]),
                              (routed.draft_extend_set_metadata, [b.clone() for b in buffers])):
        cache, cu_k, cu_q, pt, swa_pt, swa_loc = outputs
        function(cache, cu_k, cu_q, pt, table, pool, lens, extend, page_size,
                 full_to_swa_index_mapping=mapping if swa else None, swa_page_table=swa_pt if swa else None,
                 out_cache_loc=locs if swa else None, swa_out_cache_loc=swa_loc if swa else None)
        results.append(outputs)
    _compare(*results, f"swa={swa}")


def test_debug_names_a_request_whose_pages_do_not_fit(monkeypatch):
    from kvdispatch import _debug

    table, pool, lens, cache, cu = _args()
    lens = torch.tensor([1, 40, 2])
    monkeypatch.setenv("KVDISPATCH_DEBUG", "1")
    _debug.refresh()
    try:
        with pytest.raises(ValueError, match="request 1"):
            kvdispatch.update_decode_metadata(table, pool, lens, cache, cu, page_size=16,
                                              page_table=torch.zeros(3, 2, dtype=torch.int32), backend="torch")
        with pytest.raises(ValueError, match=r"out_cache_loc\[1\] = 9 is outside full_to_swa's \[0, 9\)"):
            kvdispatch.update_decode_metadata(table, pool, lens, cache, cu, page_size=16,
                                              full_to_swa=torch.zeros(9, dtype=torch.int64),
                                              out_cache_loc=torch.tensor([0, 9]),
                                              swa_out_cache_loc=torch.zeros(2, dtype=torch.int64), backend="torch")
    finally:
        monkeypatch.delenv("KVDISPATCH_DEBUG")
        _debug.refresh()


@pytest.mark.parametrize("backend", [b for b in OP_BACKENDS if b != "torch"] + ["cupy-host"])
def test_prefix_sums_span_several_blocks(backend):
    """More requests than one pass of a program's sum (``DECODE_METADATA_SUM_BLOCK``), int32 wrap-around included."""
    from conftest import through
    from kvdispatch import grid

    batch = grid.DECODE_METADATA_SUM_BLOCK + 7
    g = torch.Generator().manual_seed(3)
    device = "cpu" if backend == "cupy-host" else DEVICE
    lens = torch.randint(0, 2**31 - 1, (batch,), generator=g).to(device)
    qlens = torch.randint(-5, 2**30, (batch,), generator=g).to(torch.int32).to(device)
    table = torch.zeros(2, 4, dtype=torch.int32, device=device)
    pool = torch.zeros(batch, dtype=torch.int64, device=device)
    results = []
    for name in ("torch", backend):
        outputs = [torch.full((n,), POISON, dtype=torch.int32, device=device) for n in (batch, batch + 1, batch)]
        through(name, "update_decode_metadata", table, pool, lens, outputs[0], outputs[1], page_size=1,
                seqlen_offset=-3, cu_seqlens_q=outputs[2], qlens=qlens)
        results.append([out.cpu() for out in outputs])
    _compare(*results, backend)


@pytest.mark.skipif("triton" not in BACKENDS, reason="needs Triton")
@pytest.mark.parametrize("page_size, zero_tail", [(16, False), (7, True)])
@pytest.mark.parametrize("batch", (1, 2))
def test_rows_and_locations_loop_over_the_bounded_grid(bounded, page_size, zero_tail, batch):  # noqa: F811
    """Under a budget of 3 programs, rows three blocks long and more SWA locations than the grid's programs
    cover in one pass: each program strides over its share, as the reference says."""
    from kvdispatch import grid

    g = torch.Generator().manual_seed(page_size + batch)
    pages = 3 * grid.items_per_program(grid.MAPPED_PAGE_TABLE, page_size) + 3
    table = torch.randint(-3, 1 << 20, (3, pages * page_size), generator=g, dtype=torch.int32).to(DEVICE)
    pool = torch.tensor([2, 0][:batch], device=DEVICE)
    mapping = torch.randint(-2, 1 << 20, (1 << 20,), generator=g).to(DEVICE)
    locs = torch.randint(-1, 1 << 20, (7 * 1024,), generator=g).to(DEVICE)
    for lens in (torch.tensor([pages * page_size, 5][:batch], device=DEVICE),
                 torch.tensor([40, pages * page_size + 9][:batch], device=DEVICE)):
        results = []
        for backend in ("torch", "triton"):
            outputs = _poisoned((batch,), (batch + 1,), (batch, pages + 1), (batch, pages - 2)) + _poisoned(
                (7 * 1024 + 5,), dtype=torch.int64)
            kvdispatch.update_decode_metadata(table, pool, lens, outputs[0], outputs[1], page_size=page_size,
                                              page_table=outputs[2], swa_page_table=outputs[3], full_to_swa=mapping,
                                              zero_tail=zero_tail, out_cache_loc=locs, swa_out_cache_loc=outputs[4],
                                              backend=backend)
            results.append(outputs)
        _compare(*results, f"lens={lens.tolist()}")
    assert bounded and all(rows == batch and y * z <= max(1, 3 // batch) for rows, y, z in bounded), bounded


def test_the_releases_asserts_are_value_errors():
    from kvdispatch.compat.sglang import draft_extend_set_metadata, normal_decode_set_metadata

    table, pool, lens, cache, cu = _args()
    pt = torch.zeros(3, 4, dtype=torch.int32)
    with pytest.raises(ValueError, match="power of two"):
        normal_decode_set_metadata(cache, cu, pt, table, pool, 4, lens, 0, 12)
    with pytest.raises(ValueError, match="exactly one of"):
        normal_decode_set_metadata(cache, cu, pt, table, pool, 4, lens, 0, 16, torch.zeros(3, 4, dtype=torch.int32))
    with pytest.raises(ValueError, match="positive multiple of the batch"):
        draft_extend_set_metadata(cache, cu, cu.clone(), pt, table, pool, lens, lens, 16, torch.zeros(9),
                                  torch.zeros(3, 4, dtype=torch.int32), torch.zeros(4, dtype=torch.int64),
                                  torch.zeros(4, dtype=torch.int64))
