"""``kvdispatch.create_compact_kv_indices`` (op ``compact_csr``): the reference against a plain loop over exact
integers, edge cases on every backend, argument errors and the debug checks."""

from __future__ import annotations

import pytest
import torch

import opcases
from conftest import BACKENDS, DEVICE, through
from kvcases import POISON
from kvdispatch import ops


def _loop(source, lens, kv_indptr, out, row_step=1, source_indptr=None, offset=0, step=1, empty_fill=None,
          max_count=None):
    """The op's semantics, one request and one entry at a time, in Python ints."""
    rows, cols = source.shape
    table, result = source.cpu().tolist(), out.cpu().clone()
    for b, length in enumerate(lens.cpu().tolist()):
        begin = int(kv_indptr[b])
        if empty_fill is not None and length == 0 and 0 <= begin < out.shape[0]:
            result[begin] = empty_fill
        row = b * row_step
        first = (int(source_indptr[b]) if source_indptr is not None else 0) + offset
        if length <= 0 or row >= rows or not 0 <= first < cols:
            continue
        count = min(length, -(-(cols - first) // step), max_count if max_count is not None else length)
        for j in range(count):
            if 0 <= begin + j < out.shape[0]:
                result[begin + j] = table[row][first + j * step]
    return result


@pytest.mark.parametrize("options", (False, True))
@pytest.mark.parametrize("hostile", (False, True))
def test_reference_matches_a_plain_loop(options, hostile):
    for seed in range(12):
        case = opcases.build("compact_csr", seed, opcases.Knobs(batch=6, options=options), hostile=hostile)
        expected = _loop(**case.arguments)
        got = opcases.expected(case)["out"]
        inside = case.inside("out")
        assert torch.equal(got[inside].cpu(), expected.to(got.dtype)), f"seed {seed}"
        assert (got[~inside] == POISON).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_edges(backend):
    source = torch.arange(40, dtype=torch.int32, device=DEVICE).view(4, 10)
    lens = torch.tensor([0, 3, -1, 12], device=DEVICE)
    indptr = torch.tensor([3, 0, 4, 5], device=DEVICE)
    out = torch.full((10,), POISON, dtype=torch.int32, device=DEVICE)
    through(backend, "create_compact_kv_indices", source, lens, indptr, out, row_step=1, empty_fill=-2)
    # request 3 reads row 3 up to out's end; request 2 (negative length) writes nothing
    assert out.cpu().tolist() == [10, 11, 12, -2, POISON, 30, 31, 32, 33, 34]
    out.fill_(POISON)
    through(backend, "create_compact_kv_indices", source, lens, indptr, out, row_step=2, max_count=2)
    # rows 0, 2, 4, 6: request 1 reads row 2, requests 2 and 3 rows past the table; no placeholder without a fill
    assert out.cpu().tolist() == [20, 21] + [POISON] * 8
    flat = torch.arange(30, dtype=torch.int32, device=DEVICE)[None]
    starts = torch.tensor([0, 10, 28, -5], device=DEVICE)
    out.fill_(POISON)
    through(backend, "create_compact_kv_indices", flat, torch.tensor([1, 3, 4, 1], device=DEVICE), indptr, out,
            row_step=0, source_indptr=starts, offset=1, step=3)
    # request 2 starts at 29 (one entry left); request 3 at -4, outside the row
    assert out.cpu().tolist() == [11, 14, 17, 1, 29] + [POISON] * 5
    out.fill_(POISON)
    through(backend, "create_compact_kv_indices", source, lens[:0], indptr, out, empty_fill=5)
    assert (out == POISON).all()
    through(backend, "create_compact_kv_indices", source[:, :0], lens[:2], indptr, out, empty_fill=5)
    assert out.cpu().tolist() == [POISON] * 3 + [5] + [POISON] * 6


@pytest.mark.parametrize("name, value, error", [
    ("row_step", -1, ValueError), ("row_step", True, TypeError), ("offset", -1, ValueError), ("step", 0, ValueError),
    ("step", 1.0, TypeError), ("empty_fill", 2**31, ValueError), ("max_count", -1, ValueError),
    ("source_indptr", torch.zeros(1, dtype=torch.int32), ValueError),
    ("source_indptr", torch.zeros(3, dtype=torch.int16), TypeError),
])
def test_argument_errors_name_the_argument(name, value, error):
    source = torch.zeros((3, 8), dtype=torch.int32)
    out = torch.full((6,), 7, dtype=torch.int32)
    arguments = dict(row_step=1, source_indptr=None, offset=0, step=1, empty_fill=None, max_count=None)
    arguments[name] = value
    with pytest.raises(error, match=name):
        through("torch", "create_compact_kv_indices", source, torch.ones(3, dtype=torch.int32),
                torch.arange(4), out, **arguments)
    assert (out == 7).all()


def test_out_sharing_memory_with_the_source_is_refused():
    flat = torch.zeros(20, dtype=torch.int32)
    with pytest.raises(ValueError, match="out shares memory with source"):
        through("torch", "create_compact_kv_indices", flat[None, :10], torch.ones(2, dtype=torch.int32),
                torch.arange(3), flat[8:])


def test_debug_checks_name_the_request():
    source = torch.zeros((3, 8), dtype=torch.int32)
    out = torch.zeros(10, dtype=torch.int32)
    check = ops.compact_csr.check_data
    with pytest.raises(ValueError, match="request 1: lens"):
        check(source, torch.tensor([1, -1]), torch.tensor([0, 1]), out)
    with pytest.raises(ValueError, match="request 1: its source row 4"):
        check(source, torch.tensor([1, 1]), torch.tensor([0, 1]), out, row_step=4)
    with pytest.raises(ValueError, match="request 0: 5 entries every 2"):
        check(source, torch.tensor([5, 1]), torch.tensor([0, 5]), out, step=2)
    with pytest.raises(ValueError, match="request 1: kv_indptr"):
        check(source, torch.tensor([0, 2]), torch.tensor([0, 9]), out, empty_fill=0)
    with pytest.raises(ValueError, match="starts inside request 0"):
        check(source, torch.tensor([0, 2]), torch.tensor([0, 0]), out, empty_fill=0)
    check(source, torch.tensor([0, 2]), torch.tensor([0, 0]), out)  # an empty row without a placeholder writes none
    check(source, torch.tensor([9, 2]), torch.tensor([0, 3]), out, max_count=3)


_COMPILE_ALL = """
import dataclasses, json
from kernels_triton import crosscompile
import sys
kernel = sys.argv[1]
specs = [s for s in crosscompile.specializations() if s.kernel.__name__ == kernel]
pdl = [s for s in crosscompile.pdl_specializations() if s.kernel.__name__ == kernel]
rows = [dict(dataclasses.asdict(crosscompile.report(spec, target, crosscompile.compile_one(spec, target))),
             pdl=spec.constexprs["PDL"])
        for target in crosscompile.TARGETS for spec in specs + (pdl if target[0] == "cuda" else [])]
print(json.dumps(dict(specs=len(specs), pdl=len(pdl), rows=rows)))
"""


@pytest.mark.crosscompile
@pytest.mark.parametrize("kernel, count", (("_compact_csr_kernel", 17), ("_prefix_extend_csr_kernel", 9)))
def test_every_specialisation_compiles_for_every_target(kernel, count):
    """The compacted CSR's and the prefix+extend CSR's specialisations (and their PDL ones on NVIDIA) build for
    sm_90, sm_100, gfx942 and gfx950, without shared memory, and take their runtime arguments then Triton's two
    scratch pointers, all 8 bytes wide (the compiled host path's launch). Compiled in a process without
    ``TRITON_INTERPRET`` (Triton's code generator does not work under it)."""
    pytest.importorskip("triton")
    import json
    import os
    import subprocess
    import sys

    environment = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", _COMPILE_ALL, kernel], capture_output=True, text=True, env=environment,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["specs"] == count and result["pdl"] == 1 and len(result["rows"]) == count * 4 + 2
    for row in result["rows"]:
        assert row["binary_bytes"] > 0 and row["shared_bytes"] == 0, row
        if row["pdl"]:
            assert row["griddepcontrol"] == ["launch_dependents", "wait"], row
        else:
            assert row["native_parameters"] == row["runtime_args"] + 2 and not row["griddepcontrol"], row
