"""``kvdispatch.create_prefix_extend_kv_indices`` (op ``prefix_extend_csr``): the reference against a plain loop
over exact integers, edge cases on every backend, argument errors and the debug checks."""

from __future__ import annotations

import pytest
import torch

import opcases
from conftest import BACKENDS, DEVICE, through
from kvcases import POISON
from kvdispatch import ops


def _wrapped(value, dtype):
    """``value`` (a Python int) as ``dtype`` keeps it: its low 64 bits, then its low 32 bits for int32."""
    value &= 2**64 - 1
    bits = 32 if dtype == torch.int32 else 64
    value &= 2**bits - 1
    return value - 2**bits if value >= 2 ** (bits - 1) else value


def _loop(prefix_lens, prefix_starts, extend_lens, extend_starts, kv_indptr, out, extend_base=0):
    """The op's semantics, one request and one entry at a time, in Python ints."""
    result = out.cpu().clone()
    for b in range(prefix_lens.shape[0]):
        prefix, extend = max(int(prefix_lens[b]), 0), max(int(extend_lens[b]), 0)
        begin = int(kv_indptr[b])
        for j in range(max(0, -begin), min(prefix + extend, out.shape[0] - begin)):
            value = int(prefix_starts[b]) + j if j < prefix else extend_base + int(extend_starts[b]) + j - prefix
            result[begin + j] = _wrapped(value, out.dtype)
    return result


@pytest.mark.parametrize("options", (False, True))
@pytest.mark.parametrize("hostile", (False, True))
def test_reference_matches_a_plain_loop(options, hostile):
    for seed in range(8):
        case = opcases.build("prefix_extend_csr", seed, opcases.Knobs(batch=5, options=options), hostile=hostile)
        expected = _loop(**case.arguments)
        got = opcases.expected(case)["out"]
        inside = case.inside("out")
        assert torch.equal(got[inside].cpu(), expected), f"seed {seed}"
        assert (got[~inside] == POISON).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("out_dtype", (torch.int32, torch.int64))
def test_edges(backend, out_dtype):
    def vector(*values):
        return torch.tensor(values, device=DEVICE)

    out = torch.full((12,), POISON, dtype=out_dtype, device=DEVICE)
    # request 0 cut at out's start, 1 with an empty prefix, 2 with a negative extend, 3 wholly past out, 4 cut at
    # its end, with values past int32
    through(backend, "create_prefix_extend_kv_indices", vector(2, 0, 2, 5, 1), vector(10, 20, 2**31 - 1, 0, -3),
            vector(2, 2, -4, 1, 9), vector(0, 7, 0, 0, 1), vector(-1, 3, 5, 2**62, 9), out, extend_base=100)
    expected = [11, 100, 101, 107, 108, 2**31 - 1, 2**31, POISON, POISON, -3, 101, 102]
    assert out.cpu().tolist() == [_wrapped(v, out_dtype) if v != POISON else v for v in expected]
    out.fill_(POISON)
    through(backend, "create_prefix_extend_kv_indices", vector(1), vector(2**63 - 1), vector(1), vector(1),
            vector(0), out, extend_base=-(2**63))
    assert out.cpu().tolist()[:2] == [_wrapped(2**63 - 1, out_dtype), _wrapped(-(2**63) + 1, out_dtype)]
    assert (out[2:] == POISON).all()


@pytest.mark.parametrize("name, value, error", [
    ("extend_base", 2**63, ValueError), ("extend_base", True, TypeError),
    ("prefix_starts", torch.zeros(2, dtype=torch.int32), ValueError),
    ("extend_lens", torch.zeros(3, dtype=torch.float32), TypeError),
    ("out", torch.zeros((2, 3), dtype=torch.int32), ValueError),
])
def test_argument_errors_name_the_argument(name, value, error):
    arguments = dict(prefix_lens=torch.ones(3, dtype=torch.int32), prefix_starts=torch.zeros(3, dtype=torch.int32),
                     extend_lens=torch.ones(3, dtype=torch.int32), extend_starts=torch.zeros(3, dtype=torch.int32),
                     kv_indptr=torch.arange(4), out=torch.full((6,), 7, dtype=torch.int32), extend_base=0)
    arguments[name] = value
    out = arguments.pop("out")
    base = arguments.pop("extend_base")
    with pytest.raises(error, match=name):
        through("torch", "create_prefix_extend_kv_indices", *arguments.values(), out, extend_base=base)
    if out.dtype == torch.int32 and out.dim() == 1:
        assert (out == 7).all()


def test_debug_checks_name_the_request():
    check = ops.prefix_extend_csr.check_data
    zeros, out = torch.zeros(2, dtype=torch.int32), torch.zeros(6, dtype=torch.int32)
    with pytest.raises(ValueError, match="request 1: extend_lens"):
        check(torch.tensor([1, 1]), zeros, torch.tensor([1, -2]), zeros, torch.tensor([0, 2]), out)
    with pytest.raises(ValueError, match="request 1: kv_indptr"):
        check(torch.tensor([1, 1]), zeros, torch.tensor([1, 4]), zeros, torch.tensor([0, 2]), out)
    with pytest.raises(ValueError, match="starts inside request 0"):
        check(torch.tensor([1, 1]), zeros, torch.tensor([1, 1]), zeros, torch.tensor([0, 1]), out)
    check(torch.tensor([1, 1]), zeros, torch.tensor([1, 2]), zeros, torch.tensor([0, 2]), out)
