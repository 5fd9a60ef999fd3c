"""``kvdispatch.create_cache_locs``: the reference against a plain loop over exact integers, edge cases, argument
errors, and the SGLang drop-ins built on it (``kernels.ops.speculative.cache_locs``) against SGLang 0.5.23's own
functions on their call sites' patterns (the release's kernels in Triton's interpreter)."""

from __future__ import annotations

import pytest
import torch

import kvdispatch
from conftest import BACKENDS, DEVICE, through
from kvcases import POISON, assert_same
from kvdispatch.ops import cache_locs
from test_sglang_against_release import ROOT, release  # noqa: F401  (the fixture)


def _loop(table, pool, start, out, end=None, width=None, positions=None, page_size=1, full_v2p=None, full_out=None):
    """The semantics as a plain loop over Python ints."""
    rows, cols = table.shape
    offset = 0
    for b in range(pool.shape[0]):
        s = int(start[b])
        length = max(int(end[b]) - s, 0) if end is not None else width
        base = offset if end is not None else b * width
        offset += length
        p = int(pool[b])
        for j in range(max(min(length, out.shape[0] - base), 0)):  # entries past out are never written
            d, q = base + j, s + j
            if not 0 <= p < rows or not 0 <= q < cols:
                continue
            x = int(table[p, q])
            out[d] = x
            if positions is not None:
                positions[d] = q
            if full_v2p is not None:
                page = x // page_size
                m = int(full_v2p[page]) if 0 <= x and page < full_v2p.shape[0] else -1
                full_out[d] = m * page_size + x % page_size if m >= 0 else 0
    return out


@pytest.mark.parametrize("seed", range(6))
def test_reference_matches_a_loop(seed):
    g = torch.Generator().manual_seed(seed)
    rows, cols, batch = 5, 30, 7
    table = torch.randint(-3, 400, (rows, cols), generator=g, dtype=torch.int32)
    pool = torch.randint(-1, rows + 1, (batch,), generator=g)
    start = torch.randint(-4, cols + 2, (batch,), generator=g)
    end = start + torch.randint(-3, 12, (batch,), generator=g)
    v2p = torch.randint(-2, 90, (rows * cols // 4 + 1,), generator=g)
    for packed in (True, False):
        n = int(torch.randint(0, 50, (1,), generator=g))
        outs = [torch.full((n,), POISON, dtype=torch.int64) for _ in range(3)]
        wants = [o.clone() for o in outs]
        options = dict(end_offset=end) if packed else dict(width=int(torch.randint(0, 9, (1,), generator=g)))
        kvdispatch.create_cache_locs(table, pool, start, outs[0], positions_out=outs[1], page_size=4, full_v2p=v2p,
                                     full_out=outs[2], backend="torch", **options)
        _loop(table, pool, start, wants[0], options.get("end_offset"), options.get("width"), wants[1], 4, v2p,
              wants[2])
        for got, want in zip(outs, wants):
            assert torch.equal(got, want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_extreme_lengths_and_starts(backend):
    """Starts and ends at the int64 extremes: exact offsets, nothing read outside the row, nothing written past
    out (an early slice longer than any out leaves every later one outside)."""
    table = torch.arange(60, dtype=torch.int32).view(3, 20).to(DEVICE)
    big = 2**63 - 1
    pool = torch.tensor([0, 1, 2, 1], device=DEVICE)
    for start, end in (([-big - 1, 2, 5, 18], [-big + 3, 6, 3, 25]), ([0, -5, 2**40, 3], [big, 0, 2**41, 4]),
                       ([-3, 0, 0, 0], [2, 1, 1, 1])):
        start, end = torch.tensor(start, device=DEVICE), torch.tensor(end, device=DEVICE)
        out = torch.full((16,), POISON, dtype=torch.int64, device=DEVICE)
        want = _loop(table.cpu(), pool.cpu(), start.cpu(), out.cpu().clone(), end.cpu())
        through(backend, "create_cache_locs", table, pool, start, out, end_offset=end)
        assert_same(out, want, f"{backend} {start.tolist()}")


def test_bad_arguments_name_themselves():
    table = torch.zeros((2, 8), dtype=torch.int32)
    pool = start = torch.zeros(2, dtype=torch.int64)
    out = torch.zeros(8, dtype=torch.int64)
    cases = (
        (dict(), ValueError, "exactly one of end_offset"),
        (dict(end_offset=start.clone(), width=2), ValueError, "exactly one of end_offset"),
        (dict(width=-1), ValueError, "width"),
        (dict(width=True), TypeError, "width"),
        (dict(width=2, full_v2p=torch.zeros(4, dtype=torch.int64)), ValueError, "full_out"),
        (dict(width=2, swa_out=torch.zeros(8, dtype=torch.int64)), ValueError, "swa_v2p"),
        (dict(width=2, positions_out=torch.zeros(7, dtype=torch.int64)), ValueError, "positions_out"),
        (dict(width=2, positions_out=torch.zeros(16, dtype=torch.int64)[::2]), ValueError, "positions_out"),
        (dict(width=2, positions_out=out), ValueError, "positions_out shares memory"),
        (dict(width=2, page_size=0, full_v2p=torch.zeros(4, dtype=torch.int64),
              full_out=torch.zeros(8, dtype=torch.int64)), ValueError, "page_size"),
        (dict(end_offset=torch.zeros(3, dtype=torch.int64)), ValueError, "end_offset"),
    )
    for options, error, words in cases:
        before = out.clone()
        with pytest.raises(error, match=words):
            kvdispatch.create_cache_locs(table, pool, start, out, **options)
        assert torch.equal(out, before)
    with pytest.raises(TypeError, match="req_to_token"):
        kvdispatch.create_cache_locs(table.to(torch.int16), pool, start, out, width=1)
    with pytest.raises(ValueError, match="out"):
        kvdispatch.create_cache_locs(table, pool, start, out.view(2, 4), width=1)


def test_debug_checks_name_the_request():
    table = torch.arange(16, dtype=torch.int32).view(2, 8)
    pool = torch.tensor([0, 1])
    out = torch.zeros(8, dtype=torch.int64)
    checks = ((torch.tensor([0, 6]), dict(width=4), "request 1: its slice"),
              (torch.tensor([0, 0]), dict(end_offset=torch.tensor([5, 4])), "request 1: its slice ends at entry 9"),
              (torch.tensor([3, 0]), dict(end_offset=torch.tensor([2, 1])), "request 0: end_offset"),
              (torch.tensor([0, 0]), dict(width=2, full_v2p=torch.zeros(2, dtype=torch.int64),
                                          full_out=torch.zeros(8, dtype=torch.int64), page_size=4),
               "request 1: req_to_token\\[1, 0\\] = 8 is on page 2"))
    for start, options, words in checks:
        with pytest.raises(ValueError, match=words):
            cache_locs.check_data(table, pool, start, out, options.get("end_offset"), options.get("width"),
                                  options.get("page_size", 1), options.get("full_v2p"), None)


# -- the SGLang drop-ins against the release ------------------------------------------------------------------

_HEADER = """import torch
import triton
import triton.language as tl
from typing import Optional
_is_cuda, _is_hip, _is_musa, _is_xpu, _is_npu, _is_cpu = True, False, False, False, False, False
def next_power_of_2(n):
    return 1 << max(n - 1, 0).bit_length()
def _get_oot_speculative_cache_locs_fn():
    return None
"""
_RELEASED = ("assign_draft_cache_locs_contiguous", "assign_draft_cache_locs_contiguous_func",
             "assign_extend_cache_locs", "assign_extend_cache_locs_func", "assign_extend_cache_locs_uniform",
             "assign_extend_cache_locs_uniform_func", "fill_front_out_cache_loc_func")


@pytest.fixture
def locs(release):  # noqa: F811  (the fixture imported above)
    """The release's cache-location functions, as on a CUDA device (their kernels in the interpreter)."""
    return release("kernels.ops.speculative.cache_locs", extract=_RELEASED, header=_HEADER)


@pytest.fixture
def drop_in(monkeypatch, backend):
    from kvdispatch.compat import sglang
    from kvdispatch.compat.sglang import _common

    monkeypatch.setattr(_common, "_build_cache_locs",
                        lambda *a, backend=None, **k: through(name, "create_cache_locs", *a, **k))
    name = backend
    return sglang


def _requests(batch, rows, cols, g, dtype=torch.int64):
    table = torch.randperm(rows * cols * 2, generator=g)[: rows * cols].view(rows, cols).to(torch.int32)
    pool = torch.randperm(rows, generator=g)[:batch]
    lens = torch.randint(0, cols // 2, (batch,), generator=g).to(dtype)
    return table.to(DEVICE), pool.to(DEVICE), lens.to(DEVICE)


needs_release = pytest.mark.skipif(ROOT is None, reason="SGLang's source is not here (set SGLANG_SOURCE)")


@needs_release
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("pattern", ("ngram", "dspark", "dflash_int32"))
def test_assign_extend_cache_locs(backend, pattern, locs, drop_in):
    """ngram's verify (``seq_lens + draft_token_num``), dspark's ragged verify window (``prefix + verify_lens``,
    at most ``draft_token_num`` each) and dflash's block (int32 lengths): the packed entries equal, and ours
    allocates the same tensor (the entries past the packing are never written by either)."""
    g = torch.Generator().manual_seed(7)
    batch, width = 5, 6
    table, pool, prefix = _requests(batch, batch + 3, 64, g, torch.int32 if pattern == "dflash_int32" else torch.int64)
    extend = torch.full_like(prefix, width)
    if pattern == "dspark":
        extend = torch.randint(0, width + 1, (batch,), generator=g).to(DEVICE).to(prefix.dtype)
    arguments = dict(req_pool_indices=pool, req_to_token=table, start_offset=prefix, end_offset=prefix + extend,
                     batch_size=batch, draft_token_num=width, device=DEVICE)
    theirs = locs.assign_extend_cache_locs_func(**arguments)
    ours = drop_in.assign_extend_cache_locs_func(**arguments)
    assert (ours.dtype, ours.shape, ours.device) == (theirs.dtype, theirs.shape, theirs.device)
    used = int(extend.sum())
    assert_same(ours[:used], theirs[:used].cpu(), pattern)


@needs_release
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("pattern", ("verify", "translated", "translated_full_only"))
def test_assign_extend_cache_locs_uniform(backend, pattern, locs, drop_in):
    """EAGLE's and the multi-layer EAGLE worker's verify windows, and the translator's window through the full
    and SWA maps at a page size with positions and the anchor."""
    g = torch.Generator().manual_seed(11)
    batch, width, page_size = 4, 5, 16
    rows = batch + 2
    table, pool, lens = _requests(batch, rows, 64, g)
    arguments = dict(req_pool_indices=pool, req_to_token=table, start_offset=lens, batch_size=batch,
                     draft_token_num=width, device=DEVICE)
    buffers = []
    if pattern != "verify":
        pages = rows * 64 * 2 // page_size + 1
        full_v2p = torch.randint(-1, 400, (pages,), generator=g).to(DEVICE)
        swa_v2p = torch.randint(-1, 400, (pages - 3,), generator=g).to(DEVICE)  # some pages past it
        buffers = [torch.full((batch * width,), POISON, dtype=torch.int64, device=DEVICE) for _ in range(2)]
        buffers += [torch.full((batch, width), POISON, dtype=torch.int64, device=DEVICE),
                    torch.full((batch, 3), POISON, dtype=torch.int64, device=DEVICE)]
        anchor_src = torch.randint(0, 1000, (batch,), generator=g).to(DEVICE)
        maps = dict(full_v2p=full_v2p, swa_v2p=swa_v2p) if pattern == "translated" else dict(full_v2p=full_v2p)
    results = []
    for function, copies in ((locs.assign_extend_cache_locs_uniform_func, [b.clone() for b in buffers]),
                             (drop_in.assign_extend_cache_locs_uniform_func, [b.clone() for b in buffers])):
        options = {}
        if copies:
            options = dict(maps, full_out=copies[0], swa_out=copies[1] if pattern == "translated" else None,
                           page_size=page_size, positions_out=copies[2], anchor_src=anchor_src, anchor_out=copies[3])
        results.append([function(**arguments, **options)] + copies)
    for index, (ours, theirs) in enumerate(zip(results[1], results[0])):
        assert_same(ours, theirs.cpu(), f"{pattern} (buffer {index})")


@needs_release
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("topk, num_cols, write_positions", ((1, 3, True), (1, 3, False), (4, 2, False)))
def test_assign_draft_cache_locs_contiguous(backend, topk, num_cols, write_positions, locs, drop_in):
    """The EAGLE worker's draft slots, ``bs * topk * window_cols`` int64 entries, with the positions and the
    mrope rows when ``topk == 1``."""
    g = torch.Generator().manual_seed(3)
    batch = 5
    table, pool, lens = _requests(batch, batch + 2, 64, g)
    buffers = [torch.full((batch * topk * num_cols + 3,), POISON, dtype=torch.int64, device=DEVICE)]
    if write_positions:
        buffers += [torch.full_like(lens, POISON), torch.full((3, batch), POISON, dtype=torch.int64, device=DEVICE)]
    theirs, ours = [b.clone() for b in buffers], [b.clone() for b in buffers]
    for function, copies in ((locs.assign_draft_cache_locs_contiguous_func, theirs),
                             (drop_in.assign_draft_cache_locs_contiguous_func, ours)):
        extra = dict(positions=copies[1], mrope=copies[2]) if write_positions else {}
        assert function(pool, table, lens, copies[0], topk, num_cols, **extra) is None
    for index, (a, b) in enumerate(zip(ours, theirs)):
        assert_same(a, b.cpu(), f"draft slots (buffer {index})")


@needs_release
@pytest.mark.parametrize("backend", BACKENDS)
def test_fill_front_out_cache_loc(backend, locs, drop_in):
    """``move_accept_tokens``: the first ``num_correct_drafts + 1`` slots of each verify window, packed into a
    zeroed int64 buffer of ``bs * accept_index.shape[1]`` entries."""
    g = torch.Generator().manual_seed(5)
    batch, width = 6, 4
    out_cache_loc = torch.randperm(1000, generator=g)[: batch * width].to(DEVICE)
    num_front = (torch.randint(0, width, (batch,), generator=g) + 1).to(torch.int32).to(DEVICE)
    theirs, ours = (torch.zeros(batch * width, dtype=torch.int64, device=DEVICE) for _ in range(2))
    locs.fill_front_out_cache_loc_func(num_front, out_cache_loc, theirs)
    drop_in.fill_front_out_cache_loc_func(num_front, out_cache_loc, ours)
    assert_same(ours, theirs.cpu(), "front slots")


def test_drop_ins_are_in_the_flat_namespace_and_check_what_sglang_asserts():
    from kvdispatch.compat import sglang
    from kvdispatch.compat.sglang.kernels.ops.speculative import cache_locs as module

    for name in ("assign_extend_cache_locs_func", "assign_extend_cache_locs_uniform_func",
                 "assign_draft_cache_locs_contiguous_func", "fill_front_out_cache_loc_func"):
        assert name in sglang.__all__ and getattr(sglang, name) is getattr(module, name)
    table = torch.zeros((3, 16), dtype=torch.int32)
    pool = start = torch.zeros(2, dtype=torch.int64)
    with pytest.raises(ValueError, match="full_out"):
        sglang.assign_extend_cache_locs_uniform_func(pool, table, start, 2, 4, "cpu", full_v2p=torch.zeros(4))
    with pytest.raises(ValueError, match="req_pool_indices"):
        sglang.assign_extend_cache_locs_func(pool, table, start, start, 3, 4, "cpu")
    with pytest.raises(TypeError, match="batch_size"):
        sglang.assign_extend_cache_locs_func(pool, table, start, start, 2.0, 4, "cpu")
