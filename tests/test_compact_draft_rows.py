"""``kvdispatch.build_compact_draft_rows``: the reference against a plain loop over exact integers, edge cases,
argument errors, and the SGLang drop-in built on it (``rebuild_compact_draft_req_to_token_func`` of
``kernels.ops.speculative.cache_locs``) against SGLang 0.5.23's own function on DFlash's call pattern (the
release's kernel in Triton's interpreter)."""

from __future__ import annotations

import pytest
import torch

import kvdispatch
from conftest import BACKENDS, DEVICE, through
from kvcases import POISON, assert_same
from kvdispatch.ops import compact_draft_rows
from test_sglang_against_release import ROOT, release  # noqa: F401  (the fixture)


def _loop(draft, target, pool, start, lens, verify):
    """The semantics as a plain loop over Python ints; returns a new draft table."""
    draft = draft.clone()
    rows, cols = min(draft.shape[0], target.shape[0]), draft.shape[1]
    for b in range(pool.shape[0]):
        p, s, n = int(pool[b]), int(start[b]), int(lens[b])
        if not 0 <= p < rows or n < 0:
            continue
        for j in range(min(n, cols)):
            if 0 <= s + j < target.shape[1]:
                draft[p, j] = int(target[p, s + j])
        for k in range(verify.shape[1]):
            if n + k < cols:
                draft[p, n + k] = int(verify[b, k])
    return draft


def _case(g, batch=6, rows=7, cols=24, target_cols=40, width=5, dtype=torch.int32):
    draft = torch.full((rows, cols), POISON, dtype=dtype)
    target = torch.randint(-3, 5000, (rows + 1, target_cols), generator=g, dtype=torch.int32)
    pool = torch.randperm(rows + 2, generator=g)[:batch] - 1  # some outside [0, rows)
    start = torch.randint(-4, target_cols + 3, (batch,), generator=g)
    lens = torch.randint(-2, cols + 2, (batch,), generator=g)
    verify = torch.randint(0, 1 << 20, (batch, width), generator=g)
    return draft, target, pool, start, lens, verify


@pytest.mark.parametrize("seed", range(6))
def test_reference_matches_a_loop(seed):
    g = torch.Generator().manual_seed(seed)
    for dtype in (torch.int32, torch.int64):
        draft, *inputs = _case(g, dtype=dtype, width=seed)
        got = kvdispatch.build_compact_draft_rows(*inputs, draft.clone(), backend="torch")
        assert torch.equal(got, _loop(draft, *inputs))


@pytest.mark.parametrize("backend", BACKENDS)
def test_extremes_and_cut_rows(backend):
    """Starts and lengths at the int64 extremes, a pool index past the target's rows but inside the draft's, a
    zero-width verify block and rows cut at the draft table's end: what the loop gives, the rest untouched."""
    big = 2**63 - 1
    target = torch.arange(3 * 30, dtype=torch.int32).view(3, 30)
    pool = torch.tensor([0, 1, 2, 3])
    for starts, lens, width in (([-big - 1, 25, 2**40, 0], [4, 10, 3, 2], 3), ([0, 5, 1, 0], [big, 14, -big, 1], 4),
                                ([2, -3, 0, 0], [0, 6, 15, 3], 0)):
        start, length = torch.tensor(starts), torch.tensor(lens)
        verify = torch.arange(4 * width).view(4, width) + 1000
        draft = torch.full((5, 16), POISON, dtype=torch.int64)
        want = _loop(draft, target, pool, start, length, verify)
        moved = [t.to(DEVICE) for t in (target, pool, start, length, verify, draft)]
        through(backend, "build_compact_draft_rows", *moved)
        assert_same(moved[-1], want, f"{backend} {starts} {lens}")


def test_bad_arguments_name_themselves():
    draft = torch.zeros((4, 16), dtype=torch.int32)
    target = torch.zeros((4, 32), dtype=torch.int32)
    pool = start = lens = torch.zeros(2, dtype=torch.int64)
    verify = torch.zeros((2, 4), dtype=torch.int64)
    cases = (
        ((draft, target, pool, start, lens, torch.zeros((3, 4), dtype=torch.int64)), ValueError, "verify_locs"),
        ((draft, target, pool, start, lens, torch.zeros((2, 8), dtype=torch.int64)[:, ::2]), ValueError,
         "verify_locs"),
        ((draft, target, pool, start, torch.zeros(3, dtype=torch.int64), verify), ValueError, "draft_prefix_lens"),
        ((draft, target, pool, start.view(2, 1), lens, verify), ValueError, "suffix_start"),
        ((draft, target.to(torch.int16), pool, start, lens, verify), TypeError, "target_req_to_token"),
        ((draft, draft, pool, start, lens, verify), ValueError, "draft_req_to_token shares memory"),
        ((torch.zeros(64, dtype=torch.int32).as_strided((4, 16), (8, 1)), target, pool, start, lens, verify),
         ValueError, "rows of draft_req_to_token share memory"),
    )
    for arguments, error, words in cases:
        before = arguments[0].clone()
        with pytest.raises(error, match=words):
            kvdispatch.build_compact_draft_rows(*arguments[1:], arguments[0])
        assert torch.equal(arguments[0], before)


def test_debug_checks_name_the_request():
    draft = torch.zeros((4, 16), dtype=torch.int32)
    target = torch.zeros((3, 32), dtype=torch.int32)
    verify = torch.zeros((2, 4), dtype=torch.int64)
    checks = (([0, 3], [0, 0], [2, 2], "request 1: req_pool_indices\\[1\\] = 3 is outside \\[0, 3\\)"),
              ([1, 1], [0, 0], [2, 2], "request 1: .* an earlier request's row"),
              ([0, 1], [0, 0], [2, -1], "request 1: draft_prefix_lens\\[1\\] = -1"),
              ([0, 1], [30, 0], [4, 2], "request 0: its suffix \\[30, 34\\)"),
              ([0, 1], [0, 0], [2, 13], "request 1: its rebuilt row of 17 entries"))
    for pool, start, lens, words in checks:
        with pytest.raises(ValueError, match=words):
            compact_draft_rows.check_data(target, torch.tensor(pool), torch.tensor(start), torch.tensor(lens), verify,
                                          draft)


# -- the SGLang drop-in against the release ---------------------------------------------------------------------

_HEADER = "import torch\nimport triton\nimport triton.language as tl\n"
_RELEASED = ("rebuild_compact_draft_req_to_token", "rebuild_compact_draft_req_to_token_func")
needs_release = pytest.mark.skipif(ROOT is None, reason="SGLang's source is not here (set SGLANG_SOURCE)")


@pytest.fixture
def locs(release):  # noqa: F811  (the fixture imported above)
    """The release's compact-draft rebuild, as on a CUDA device (its kernel in the interpreter)."""
    return release("kernels.ops.speculative.cache_locs", extract=_RELEASED, header=_HEADER)


@pytest.fixture
def drop_in(monkeypatch, backend):
    from kvdispatch.compat import sglang
    from kvdispatch.compat.sglang import _common

    monkeypatch.setattr(_common, "_build_compact_draft_rows",
                        lambda *a, backend=None, **k: through(name, "build_compact_draft_rows", *a, **k))
    name = backend
    return sglang


def _dflash_step(g, batch, rows, context, window, block_size, page_size):
    """DFlash's ``_rebuild_compact_draft_cache`` arguments: int32 tables (the draft's a window plus a block
    wide), int64 pool indices and committed lengths, the compact lengths (int32, page-aligned starts for
    ``page_size > 1``) and their suffix starts, the verify block's int64 slots ``[bs, block_size]``."""
    target = torch.randperm(rows * context * 2, generator=g)[: rows * context].view(rows, context).to(torch.int32)
    draft = torch.full((rows, window + page_size + block_size), POISON, dtype=torch.int32)
    pool = torch.randperm(rows, generator=g)[:batch]
    prefix = torch.randint(0, context - block_size, (batch,), generator=g)
    visible = prefix.clamp(max=window)
    if page_size > 1:
        first = prefix - visible
        visible = prefix - (first - first % page_size)
    lens = visible.to(torch.int32)
    verify = torch.randperm(1 << 16, generator=g)[: batch * block_size].view(batch, block_size)
    return dict(draft_req_to_token=draft, target_req_to_token=target, req_pool_indices=pool,
                suffix_start=prefix - lens.long(), draft_prefix_lens=lens, verify_out_cache_loc_2d=verify,
                batch_size=batch, block_size=block_size)


@needs_release
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("page_size", (1, 16))
def test_rebuild_compact_draft_req_to_token(backend, page_size, locs, drop_in):
    """DFlash's compact draft cache: every draft row equal to the release's, rows no request names included."""
    g = torch.Generator().manual_seed(13 + page_size)
    arguments = _dflash_step(g, batch=5, rows=8, context=96, window=40, block_size=8, page_size=page_size)
    arguments = {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in arguments.items()}
    theirs = dict(arguments, draft_req_to_token=arguments["draft_req_to_token"].clone())
    ours = dict(arguments, draft_req_to_token=arguments["draft_req_to_token"].clone())
    assert locs.rebuild_compact_draft_req_to_token_func(**theirs) is None
    assert drop_in.rebuild_compact_draft_req_to_token_func(**ours) is None
    assert_same(ours["draft_req_to_token"], theirs["draft_req_to_token"].cpu(), f"page {page_size}")


def test_drop_in_is_in_the_flat_namespace_and_checks_its_arguments():
    from kvdispatch.compat import sglang
    from kvdispatch.compat.sglang.kernels.ops.speculative import cache_locs as module

    name = "rebuild_compact_draft_req_to_token_func"
    assert name in sglang.__all__ and getattr(sglang, name) is getattr(module, name)
    arguments = _dflash_step(torch.Generator().manual_seed(1), batch=2, rows=3, context=32, window=8, block_size=4,
                             page_size=1)
    with pytest.raises(TypeError, match="positional"):
        sglang.rebuild_compact_draft_req_to_token_func(*arguments.values())
    for change, error, words in ((dict(block_size=5), ValueError, "verify_out_cache_loc_2d"),
                                 (dict(batch_size=3), ValueError, "req_pool_indices"),
                                 (dict(batch_size=2.0), TypeError, "batch_size"),
                                 (dict(block_size=-1), ValueError, "block_size")):
        with pytest.raises(error, match=words):
            sglang.rebuild_compact_draft_req_to_token_func(**dict(arguments, **change))
