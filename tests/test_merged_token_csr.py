"""``kvdispatch.create_merged_kv_indices``: the reference against a plain loop over exact integers, every backend
under test against the reference on bad data, argument errors and the ``KVDISPATCH_DEBUG`` checks.
"""

from __future__ import annotations

import pytest
import torch

import kvdispatch
from conftest import BACKENDS, DEVICE, through
from kvcases import POISON
from kvdispatch import ops


def _loop(bounds, prefix, starts, lens, extend, indptr, out):
    begin, total = 0, out.shape[0]
    indptr[0] = 0
    for b in range(len(lens)):
        s, e = int(bounds[b]), int(bounds[b + 1])
        entries = [int(prefix[i]) for i in range(s, min(e, len(prefix)))] if 0 <= s < len(prefix) else []
        t, n = int(starts[b]), int(lens[b])
        entries += [int(extend[i]) for i in range(t, min(t + n, len(extend)))] if 0 <= t < len(extend) else []
        for j, value in enumerate(entries):
            if begin + j < total:
                out[begin + j] = value if out.dtype == torch.int64 else (value + 2**31) % 2**32 - 2**31
        begin += len(entries)
        indptr[b + 1] = begin


def _case(g, dtype, batch=6):
    bounds = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(torch.randint(-3, 20, (batch,), generator=g),
                                                                        0)])
    prefix = torch.randint(-(2**40), 2**40, (int(bounds.max()) - 4,), generator=g)
    starts = torch.randint(-2, 30, (batch,), generator=g)
    lens = torch.randint(-2, 12, (batch,), generator=g)
    extend = torch.randint(-(2**40), 2**40, (28,), generator=g)
    if dtype == torch.int64:
        bounds[2], starts[1], lens[3] = 2**63 - 1, -(2**63), 2**62
    return bounds.to(dtype), prefix.to(dtype), starts.to(dtype), lens.to(dtype), extend.to(dtype)


@pytest.mark.parametrize("dtype", (torch.int32, torch.int64))
@pytest.mark.parametrize("out_dtype", (torch.int32, torch.int64))
def test_reference_matches_the_loop(dtype, out_dtype):
    g = torch.Generator().manual_seed(7 + (dtype == torch.int64))
    for total in (0, 30, 200):
        args = _case(g, dtype)
        out, indptr = torch.full((total,), POISON, dtype=out_dtype), torch.full((9,), POISON, dtype=out_dtype)
        expected, expected_indptr = out.clone(), indptr.clone()
        ops.merged_token_csr.reference(*args, indptr, out)
        _loop(*args, expected_indptr, expected)
        assert torch.equal(out, expected) and torch.equal(indptr, expected_indptr)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", (torch.int32, torch.int64))
def test_backends_match_the_reference_on_bad_data(backend, dtype):
    g = torch.Generator().manual_seed(13)
    for total in (0, 50, 3000):
        args = [t.to(DEVICE) for t in _case(g, dtype, batch=40)]
        out = torch.full((total,), POISON, dtype=torch.int64, device=DEVICE)
        indptr = torch.full((43,), POISON, dtype=torch.int32, device=DEVICE)
        expected, expected_indptr = out.cpu().clone(), indptr.cpu().clone()
        ops.merged_token_csr.reference(*(a.cpu() for a in args), expected_indptr, expected)
        through(backend, "create_merged_kv_indices", *args, indptr, out)
        assert torch.equal(out.cpu(), expected) and torch.equal(indptr.cpu(), expected_indptr)


def _arguments():
    return dict(prefix_kv_indptr=torch.tensor([0, 2, 5]), prefix_kv_indices=torch.arange(5),
                extend_start_loc=torch.tensor([0, 1]), extend_seq_lens=torch.tensor([1, 2]),
                extend_kv_indices=torch.arange(3), kv_indptr_out=torch.zeros(3, dtype=torch.int64),
                out=torch.zeros(8, dtype=torch.int64))


@pytest.mark.parametrize("change, error, message", [
    (dict(prefix_kv_indptr=torch.tensor([0, 2])), ValueError, "prefix_kv_indptr must have 3 entries"),
    (dict(extend_start_loc=torch.tensor([0])), ValueError, "extend_start_loc must have 2 entries"),
    (dict(prefix_kv_indices=torch.arange(10)[::2]), ValueError, "prefix_kv_indices must be contiguous"),
    (dict(extend_kv_indices=torch.arange(3.0)), TypeError, "extend_kv_indices must have dtype"),
    (dict(kv_indptr_out=torch.zeros(2, dtype=torch.int64)), ValueError, "kv_indptr_out must have at least 3"),
    (dict(out=torch.zeros(2, 4, dtype=torch.int64)), ValueError, "out must be 1-D"),
    (dict(extend_seq_lens=torch.tensor([1.0, 2.0])), TypeError, "extend_seq_lens must have dtype"),
])
def test_argument_errors_name_the_argument(change, error, message):
    arguments = dict(_arguments(), **change)
    with pytest.raises(error, match=message):
        kvdispatch.create_merged_kv_indices(*arguments.values())


def test_outputs_may_not_overlap():
    arguments = _arguments()
    arguments["kv_indptr_out"] = arguments["out"][:3]
    with pytest.raises(ValueError, match="out shares memory with kv_indptr_out"):
        kvdispatch.create_merged_kv_indices(*arguments.values())


@pytest.mark.parametrize("change, message", [
    (dict(prefix_kv_indptr=torch.tensor([0, 2, 9])), r"request 1: its prefix \[2, 9\) is not a row"),
    (dict(prefix_kv_indptr=torch.tensor([0, 3, 2])), r"request 1: its prefix \[3, 2\) is not a row"),
    (dict(extend_seq_lens=torch.tensor([1, 3])), r"request 1: its extend tokens \[1, \+3\) are not a row"),
    (dict(extend_start_loc=torch.tensor([-1, 1])), r"request 0: its extend tokens \[-1, \+1\)"),
    (dict(out=torch.zeros(7, dtype=torch.int64)), r"the merged rows' 8 entries do not fit out's 7"),
])
def test_debug_checks_name_the_request(monkeypatch, change, message):
    monkeypatch.setenv("KVDISPATCH_DEBUG", "1")
    kvdispatch.reset()  # the switch is read at import and by reset()
    arguments = dict(_arguments(), **change)
    arguments["out"].fill_(POISON)
    with pytest.raises(ValueError, match=message):
        kvdispatch.create_merged_kv_indices(*arguments.values())
    assert (arguments["out"] == POISON).all()
