"""``kvdispatch.create_ragged_page_table`` (the block table of a ragged token CSR, with its SWA twin) and the MHA
page table's ``seqlen_offset``: the reference against a plain loop over exact integers, every backend under test
against the reference on bad data, argument errors, the ``KVDISPATCH_DEBUG`` checks, and (``crosscompile``
mark) the new specialisations compiling for every target.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kvdispatch
from conftest import BACKENDS, DEVICE, through
from kvcases import POISON
from kvdispatch import ops

I64_MIN, I64_MAX = -(2**63), 2**63 - 1


def _loop_ragged(kv_indices, kv_indptr, page_table, page_size, swa_page_table, full_to_swa, toward_zero):
    """The semantics, one entry at a time, in Python ints."""
    slots, bounds = kv_indices.tolist(), kv_indptr.tolist()
    total = len(slots)

    def divide(v):
        q = abs(v) // page_size * (1 if v >= 0 else -1) if toward_zero else v // page_size
        return (q + 2**31) % 2**32 - 2**31  # the low 32 bits

    mapping = None if full_to_swa is None else full_to_swa.tolist()
    for b in range(len(bounds) - 1):
        start, end = bounds[b], min(bounds[b + 1], total)
        if not 0 <= start < total:
            continue
        p = 0
        while p * page_size < end - start:
            slot = slots[start + p * page_size]
            if p < page_table.shape[1]:
                page_table[b, p] = divide(slot)
            if mapping and p < swa_page_table.shape[1]:
                swa_page_table[b, p] = divide(mapping[min(max(slot, 0), len(mapping) - 1)])
            p += 1


def _case(g, dtype, total=70, batch=5, extremes=True):
    lengths = torch.randint(-3, 40, (batch,), generator=g)
    bounds = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(lengths, 0)])
    if extremes:
        bounds[torch.randint(0, batch + 1, (1,), generator=g)] = (I64_MAX if dtype == torch.int64 else 2**31 - 1)
        bounds[torch.randint(0, batch + 1, (1,), generator=g)] = (I64_MIN if dtype == torch.int64 else -(2**31))
    slots = torch.randint(-40, 1 << 20, (total,), generator=g)
    return slots.to(dtype), bounds.to(dtype)


@pytest.mark.parametrize("page_size", (1, 7, 16))
@pytest.mark.parametrize("dtype", (torch.int32, torch.int64))
@pytest.mark.parametrize("toward_zero", (False, True))
def test_reference_matches_the_loop(page_size, dtype, toward_zero):
    g = torch.Generator().manual_seed(page_size * 7 + toward_zero)
    for _ in range(4):
        kv_indices, kv_indptr = _case(g, dtype)
        mapping = torch.randint(I64_MIN, I64_MAX, (300,), generator=g)
        tables = [torch.full((7, w), POISON, dtype=torch.int32) for w in (6, 4)]
        expected = [t.clone() for t in tables]
        ops.ragged_page_table.reference(kv_indices, kv_indptr, tables[0], page_size, tables[1], mapping, toward_zero)
        _loop_ragged(kv_indices, kv_indptr, expected[0], page_size, expected[1], mapping, toward_zero)
        assert torch.equal(tables[0], expected[0]) and torch.equal(tables[1], expected[1])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", (torch.int32, torch.int64))
@pytest.mark.parametrize("swa", (True, False))
def test_backends_match_the_reference_on_bad_data(backend, dtype, swa):
    """With the SWA twin and without (at page 1 and int32 indices, a copy of the row's slots); the last row
    reaches the end of the 300 slots."""
    g = torch.Generator().manual_seed(3)
    for page_size in (1, 16):
        kv_indices, kv_indptr = _case(g, dtype, total=300)
        kv_indptr[-1] = 300  # one row reaching the end of the slots
        mapping = torch.randint(-5, 1 << 20, (1 << 12,), generator=g) if swa else None
        tables = [torch.full((7, w), POISON, dtype=torch.int32, device=DEVICE) for w in (310, 5)]
        expected = [t.cpu().clone() for t in tables]
        twin = (expected[1], mapping) if swa else (None, None)
        ops.ragged_page_table.reference(kv_indices, kv_indptr, expected[0], page_size, *twin, True)
        twin = (tables[1], mapping.to(DEVICE)) if swa else (None, None)
        through(backend, "create_ragged_page_table", kv_indices.to(DEVICE), kv_indptr.to(DEVICE), tables[0],
                page_size=page_size, swa_page_table=twin[0], full_to_swa=twin[1], round_toward_zero=True)
        assert torch.equal(tables[0].cpu(), expected[0]) and torch.equal(tables[1].cpu(), expected[1])


def test_mha_seqlen_offset_matches_the_loop():
    g = torch.Generator().manual_seed(5)
    table = torch.randint(-50, 1 << 20, (4, 40), generator=g, dtype=torch.int32)
    pool = torch.tensor([2, 0, 9, 3])
    lens = torch.tensor([5, -4, 10, 38])
    for offset, page_size in ((4, 4), (-3, 1), (2**31 - 1, 16), (-(2**31), 2)):
        out = torch.full((4, 12), POISON, dtype=torch.int32)
        ops.mha_page_table.reference(table, pool, lens, out, page_size, None, None, True, offset)
        expected = torch.full((4, 12), POISON, dtype=torch.int32)
        for b in range(4):
            if not 0 <= int(pool[b]) < 4:
                continue
            length = min(int(lens[b]) + offset, 40)
            for p in range(12):
                if p * page_size < length:
                    slot = int(table[pool[b], p * page_size])
                    expected[b, p] = int(slot / page_size)
        assert torch.equal(out, expected), offset


def _arguments():
    return dict(kv_indices=torch.arange(16, dtype=torch.int32), kv_indptr=torch.tensor([0, 5, 16]),
                page_table=torch.zeros(2, 16, dtype=torch.int32), page_size=1)


@pytest.mark.parametrize("change, error, message", [
    (dict(kv_indices=torch.arange(16.0)), TypeError, "kv_indices must have dtype"),
    (dict(kv_indices=torch.arange(32, dtype=torch.int32)[::2]), ValueError, "kv_indices must be contiguous"),
    (dict(kv_indptr=torch.zeros(0, dtype=torch.int64)), ValueError, "kv_indptr must have at least 1"),
    (dict(kv_indptr=torch.zeros(2, 2, dtype=torch.int64)), ValueError, "kv_indptr must be 1-D"),
    (dict(page_table=torch.zeros(1, 16, dtype=torch.int32)), ValueError, "page_table must have at least 2 rows"),
    (dict(page_table=torch.zeros(2, 16, dtype=torch.int64)), TypeError, "page_table must have dtype"),
    (dict(page_size=0), ValueError, "page_size"),
    (dict(page_size=True), TypeError, "page_size"),
    (dict(round_toward_zero=1), TypeError, "round_toward_zero"),
    (dict(swa_page_table=torch.zeros(2, 4, dtype=torch.int32)), ValueError, "without full_to_swa"),
    (dict(full_to_swa=torch.zeros(4, dtype=torch.int64)), ValueError, "without swa_page_table"),
    (dict(page_table=torch.zeros(40, dtype=torch.int32).as_strided((2, 16), (8, 1))), ValueError,
     "rows of page_table share memory"),
])
def test_argument_errors_name_the_argument(change, error, message):
    arguments = dict(_arguments(), **change)
    with pytest.raises(error, match=message):
        kvdispatch.create_ragged_page_table(arguments.pop("kv_indices"), arguments.pop("kv_indptr"),
                                            arguments.pop("page_table"), **arguments)


def test_outputs_may_not_overlap_the_inputs():
    buffer = torch.zeros(64, dtype=torch.int32)
    with pytest.raises(ValueError, match="page_table shares memory with kv_indices"):
        kvdispatch.create_ragged_page_table(buffer[8:24], torch.tensor([0, 5, 16]), buffer[:32].view(2, 16),
                                            page_size=1)


def test_mha_seqlen_offset_argument_errors():
    table, pool, lens = torch.zeros(2, 8, dtype=torch.int32), torch.zeros(2, dtype=torch.int64), torch.ones(2)
    for offset, error in ((2**31, ValueError), (1.0, TypeError), (True, TypeError)):
        with pytest.raises(error, match="seqlen_offset"):
            kvdispatch.create_trtllm_mha_page_table(table, pool, lens.long(), torch.zeros(2, 8, dtype=torch.int32),
                                                    page_size=1, seqlen_offset=offset)


@pytest.mark.parametrize("bounds, message", [
    ([0, 5, 3], r"request 1: kv_indptr\[2\] = 3 is below kv_indptr\[1\] = 5"),
    ([0, 5, 20], r"request 1: its tokens \[5, 20\) are outside kv_indices' 16 entries"),
    ([-1, 5, 16], r"request 0: its tokens \[-1, 5\)"),
    ([0, 16, 16], r"request 0: its 16 pages .* do not fit page_table's 8 columns"),
])
def test_debug_checks_name_the_request(monkeypatch, bounds, message):
    monkeypatch.setenv("KVDISPATCH_DEBUG", "1")
    kvdispatch.reset()  # the switch is read at import and by reset()
    out = torch.full((2, 8), POISON, dtype=torch.int32)
    with pytest.raises(ValueError, match=message):
        kvdispatch.create_ragged_page_table(torch.arange(16, dtype=torch.int32), torch.tensor(bounds), out,
                                            page_size=1)
    assert int((out != POISON).sum()) == 0


def test_debug_checks_the_swa_slots(monkeypatch):
    monkeypatch.setenv("KVDISPATCH_DEBUG", "1")
    kvdispatch.reset()
    slots = torch.tensor([0, 1, 2, 99], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"request 0: slot 99 at kv_indices\[3\] \(page 3\) is outside full_to_swa"):
        kvdispatch.create_ragged_page_table(slots, torch.tensor([0, 4]), torch.zeros(1, 4, dtype=torch.int32),
                                            page_size=1, swa_page_table=torch.zeros(1, 4, dtype=torch.int32),
                                            full_to_swa=torch.arange(10))


_COMPILE = """
import json
from kernels_triton import crosscompile
rows = []
for target in crosscompile.TARGETS:
    for spec in crosscompile.specializations(target[2], (16,), ("i32",)):
        c = spec.constexprs
        if (spec.kernel.__name__ in ("_ragged_page_table_kernel", "_pa_swa_table_kernel",
                                     "_merged_token_csr_kernel", "_spec_concat_page_table_kernel")
                or spec.kernel.__name__ == "_mha_page_table_kernel" and c["HAS_OFFSET"]) \
                and c.get("UNIT_STRIDES", True) and not c["FOLDED_GRID"]:
            r = crosscompile.report(spec, target, crosscompile.compile_one(spec, target))
            rows.append([r.target, r.label, r.binary_bytes, r.runtime_args, r.native_parameters])
print(json.dumps(rows))
"""


@pytest.mark.crosscompile
def test_new_specialisations_compile_for_every_target(tmp_path):
    """The ragged kernel's, the prefill-aware table's, the merged CSR's, the concat table's and the MHA kernel's
    offset specialisations (page size 16, int32 vectors, the usual grid) compile for sm_90, sm_100, gfx942 and gfx950,
    taking their runtime arguments and Triton's two scratch pointers."""
    pytest.importorskip("triton")
    root = Path(__file__).resolve().parents[1]
    environment = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    environment.update(PYTHONPATH=str(root), TRITON_CACHE_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", _COMPILE], capture_output=True, text=True, env=environment,
                          cwd=root, timeout=1200)
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert len({(row[0], row[1].split("[")[0]) for row in rows}) == 20 and len(rows) == 4 * (6 + 3 + 2 + 4 + 1)
    for target, label, binary, runtime_args, native in rows:
        assert binary > 0 and native == runtime_args + 2, (target, label)
