"""``kvdispatch.create_prefill_aware_swa_table``: the reference against a plain loop over exact integers, every
backend under test against the reference on bad data, argument errors and the ``KVDISPATCH_DEBUG`` checks.
"""

from __future__ import annotations

import pytest
import torch

import kvdispatch
from conftest import BACKENDS, DEVICE, through
from kvcases import POISON
from kvdispatch import ops


def _loop(table, pool, lens, prefill_lens, out, kv_lens, window):
    rows, cols = table.shape
    for b in range(pool.shape[0]):
        r, s = int(pool[b]), int(lens[b])
        f = int(prefill_lens[r]) if 0 <= r < prefill_lens.shape[0] else 0
        n = min(s, f + window)
        kv_lens[b] = (n + 2**31) % 2**32 - 2**31
        if not 0 <= r < rows:
            continue
        gap = max(s - window - f, 0)
        for j in range(min(n, out.shape[1])):
            q = j if j < f else j + gap
            if q >= cols:
                break
            out[b, j] = int(table[r, q])


def _case(g, dtype, rows=6, cols=50, batch=5):
    table = torch.randint(-9, 1 << 20, (rows, cols), generator=g, dtype=torch.int32)
    pool = torch.randint(-1, rows + 2, (batch,), generator=g)
    lens = torch.randint(-3, cols + 10, (batch,), generator=g)
    prefill = torch.randint(-2, cols // 2, (rows - 1,), generator=g)  # the last row past it
    if dtype == torch.int64:
        lens[0], prefill[1] = 2**62 + 5, -(2**63)
    return table, pool.to(dtype), lens.to(dtype), prefill.to(dtype)


@pytest.mark.parametrize("dtype", (torch.int32, torch.int64))
@pytest.mark.parametrize("window", (0, 4, 2**31 - 1))
def test_reference_matches_the_loop(dtype, window):
    g = torch.Generator().manual_seed(window % 97 + (dtype == torch.int64))
    for _ in range(4):
        table, pool, lens, prefill = _case(g, dtype)
        out, kv_lens = torch.full((7, 30), POISON, dtype=torch.int32), torch.full((7,), POISON, dtype=torch.int32)
        expected, expected_lens = out.clone(), kv_lens.clone()
        ops.pa_swa_table.reference(table, pool, lens, prefill, out, kv_lens, window)
        _loop(table, pool, lens, prefill, expected, expected_lens, window)
        assert torch.equal(out, expected) and torch.equal(kv_lens, expected_lens)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", (torch.int32, torch.int64))
def test_backends_match_the_reference_on_bad_data(backend, dtype):
    g = torch.Generator().manual_seed(11)
    for window in (0, 9):
        table, pool, lens, prefill = (t.to(DEVICE) for t in _case(g, dtype, cols=1500))
        out = torch.full((6, 1200), POISON, dtype=torch.int32, device=DEVICE)
        kv_lens = torch.full((6,), POISON, dtype=torch.int32, device=DEVICE)
        expected, expected_lens = out.cpu().clone(), kv_lens.cpu().clone()
        ops.pa_swa_table.reference(table.cpu(), pool.cpu(), lens.cpu(), prefill.cpu(), expected, expected_lens,
                                   window)
        through(backend, "create_prefill_aware_swa_table", table, pool, lens, prefill, out, kv_lens,
                window_size=window)
        assert torch.equal(out.cpu(), expected) and torch.equal(kv_lens.cpu(), expected_lens)


def _arguments():
    return dict(req_to_token=torch.zeros(3, 8, dtype=torch.int32), req_pool_indices=torch.tensor([0, 1]),
                seq_lens=torch.tensor([3, 4]), prefill_lens=torch.tensor([1, 1, 1]),
                out=torch.zeros(2, 8, dtype=torch.int32), kv_lens_out=torch.zeros(2, dtype=torch.int32),
                window_size=4)


@pytest.mark.parametrize("change, error, message", [
    (dict(prefill_lens=torch.tensor([1.0])), TypeError, "prefill_lens must have dtype"),
    (dict(prefill_lens=torch.arange(6)[::2]), ValueError, "prefill_lens must be contiguous"),
    (dict(out=torch.zeros(1, 8, dtype=torch.int32)), ValueError, "out must have at least 2 rows"),
    (dict(kv_lens_out=torch.zeros(1, dtype=torch.int32)), ValueError, "kv_lens_out must have at least 2"),
    (dict(kv_lens_out=torch.zeros(2, dtype=torch.int64)), TypeError, "kv_lens_out must have dtype"),
    (dict(window_size=-1), ValueError, "window_size"),
    (dict(window_size=2.0), TypeError, "window_size"),
    (dict(seq_lens=torch.tensor([3])), ValueError, "seq_lens must have 2"),
])
def test_argument_errors_name_the_argument(change, error, message):
    arguments = dict(_arguments(), **change)
    window = arguments.pop("window_size")
    with pytest.raises(error, match=message):
        kvdispatch.create_prefill_aware_swa_table(*arguments.values(), window_size=window)


def test_outputs_may_not_overlap():
    arguments = _arguments()
    arguments["kv_lens_out"] = arguments["out"][1, :2]
    window = arguments.pop("window_size")
    with pytest.raises(ValueError, match="kv_lens_out shares memory with out"):
        kvdispatch.create_prefill_aware_swa_table(*arguments.values(), window_size=window)


@pytest.mark.parametrize("change, message", [
    (dict(req_pool_indices=torch.tensor([0, 3])), r"request 1: req_pool_indices\[1\] = 3 is outside \[0, 3\)"),
    (dict(prefill_lens=torch.tensor([1])), r"request 1: req_pool_indices\[1\] = 1 is outside prefill_lens' \[0, 1\)"),
    (dict(prefill_lens=torch.tensor([1, -2, 1])), r"request 1: prefill_lens\[1\] = -2 is negative"),
    (dict(seq_lens=torch.tensor([3, 9])), r"request 1: .*runs past the table's 8 columns"),
    (dict(out=torch.zeros(2, 3, dtype=torch.int32)), r"request 1: its 4 pages .* do not fit out's 3 columns"),
])
def test_debug_checks_name_the_request(monkeypatch, change, message):
    monkeypatch.setenv("KVDISPATCH_DEBUG", "1")
    kvdispatch.reset()  # the switch is read at import and by reset()
    arguments = dict(_arguments(), **change)
    arguments["out"].fill_(POISON)
    window = arguments.pop("window_size")
    with pytest.raises(ValueError, match=message):
        kvdispatch.create_prefill_aware_swa_table(*arguments.values(), window_size=window)
    assert (arguments["out"] == POISON).all()
