"""``kvdispatch.create_spec_concat_page_table``: the reference against a plain loop over exact integers, every
backend under test against the reference on bad data, argument errors and the ``KVDISPATCH_DEBUG`` checks.
"""

from __future__ import annotations

import pytest
import torch

import kvdispatch
from conftest import BACKENDS, DEVICE, through
from kvcases import POISON
from kvdispatch import ops


def _loop(a, b, lens_a, lens_b, out, draft):
    for m in range(lens_b.shape[0]):
        first, second = int(lens_a[m // draft]), int(lens_b[m])
        for n in range(min(first + second, out.shape[1])):
            if n < first:
                out[m, n] = int(a[m // draft, n]) if n < a.shape[1] else 0
            else:
                out[m, n] = int(b[m, n - first]) if n - first < b.shape[1] else 0


def _case(g, dtype, batch=4, draft=3):
    a = torch.randint(-(2**31), 2**31 - 1, (batch + 1, 20), generator=g).to(torch.int32)
    b = torch.randint(-(2**31), 2**31 - 1, (batch * draft, 4), generator=g).to(torch.int32)
    lens_a = torch.randint(-2, 26, (batch,), generator=g)
    lens_b = torch.randint(-3, 7, (batch * draft,), generator=g)
    return a, b, lens_a.to(dtype), lens_b.to(dtype)


@pytest.mark.parametrize("dtype", (torch.int32, torch.int64))
@pytest.mark.parametrize("draft", (1, 3))
def test_reference_matches_the_loop(dtype, draft):
    g = torch.Generator().manual_seed(draft + 10 * (dtype == torch.int64))
    for width in (0, 10, 30):
        a, b, lens_a, lens_b = _case(g, dtype, draft=draft)
        out = torch.full((4 * draft + 1, width), POISON, dtype=torch.int32)
        expected = out.clone()
        ops.spec_concat_page_table.reference(a, b, lens_a, lens_b, out, draft)
        _loop(a, b, lens_a, lens_b, expected, draft)
        assert torch.equal(out, expected)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", (torch.int32, torch.int64))
def test_backends_match_the_reference_on_bad_data(backend, dtype):
    g = torch.Generator().manual_seed(21)
    a, b, lens_a, lens_b = (t.to(DEVICE) for t in _case(g, dtype, batch=9, draft=2))
    if dtype == torch.int64:
        lens_a[0], lens_b[3] = 2**63 - 1, -(2**63)
    out = torch.full((20, 1500), POISON, dtype=torch.int32, device=DEVICE)[:, 2:1400]
    expected = out.cpu().clone()
    ops.spec_concat_page_table.reference(a.cpu(), b.cpu(), lens_a.cpu(), lens_b.cpu(), expected, 2)
    through(backend, "create_spec_concat_page_table", a, b, lens_a, lens_b, out, draft_tokens=2)
    assert torch.equal(out.cpu(), expected)


def _arguments():
    return dict(page_table_a=torch.zeros(2, 4, dtype=torch.int32), page_table_b=torch.zeros(4, 2, dtype=torch.int32),
                seq_lens_a=torch.tensor([1, 2]), seq_lens_b=torch.tensor([1, 1, 2, 0]),
                out=torch.zeros(4, 6, dtype=torch.int32), draft_tokens=2)


@pytest.mark.parametrize("change, error, message", [
    (dict(draft_tokens=3), ValueError, "seq_lens_b must have seq_lens_a's 2 entries times draft_tokens=3"),
    (dict(draft_tokens=0), ValueError, "draft_tokens"),
    (dict(page_table_b=torch.zeros(3, 2, dtype=torch.int32)), ValueError, "page_table_b must have at least 4 rows"),
    (dict(page_table_a=torch.zeros(2, 4, dtype=torch.int64)), TypeError, "page_table_a must have dtype"),
    (dict(out=torch.zeros(3, 6, dtype=torch.int32)), ValueError, "out must have at least 4 rows"),
    (dict(seq_lens_a=torch.tensor([1.0, 2.0])), TypeError, "seq_lens_a must have dtype"),
])
def test_argument_errors_name_the_argument(change, error, message):
    arguments = dict(_arguments(), **change)
    draft = arguments.pop("draft_tokens")
    with pytest.raises(error, match=message):
        kvdispatch.create_spec_concat_page_table(*arguments.values(), draft_tokens=draft)


@pytest.mark.parametrize("change, message", [
    (dict(seq_lens_a=torch.tensor([1, 5])), r"row 1: seq_lens_a\[1\] = 5 is outside \[0, 4\]"),
    (dict(seq_lens_b=torch.tensor([1, -1, 2, 0])), r"row 1: seq_lens_b\[1\] = -1 is outside \[0, 2\]"),
    (dict(out=torch.zeros(4, 3, dtype=torch.int32)), r"row 2: its 4 entries do not fit out's 3 columns"),
])
def test_debug_checks_name_the_row(monkeypatch, change, message):
    monkeypatch.setenv("KVDISPATCH_DEBUG", "1")
    kvdispatch.reset()  # the switch is read at import and by reset()
    arguments = dict(_arguments(), **change)
    arguments["out"].fill_(POISON)
    draft = arguments.pop("draft_tokens")
    with pytest.raises(ValueError, match=message):
        kvdispatch.create_spec_concat_page_table(*arguments.values(), draft_tokens=draft)
    assert (arguments["out"] == POISON).all()
