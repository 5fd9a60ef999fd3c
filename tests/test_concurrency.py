"""Eight threads making their first call at once on one device: one probe, one selection, all results right.

On CPU: the torch backend (auto), and Triton's interpreter (forced); on a GPU: auto (Triton there) and every
GPU backend forced. A slow ``read_device`` keeps every thread arriving while the first is still probing.
A backend that fails at launch under the same race gives one warning and every thread a right result.
"""

import collections
import threading
import time
import warnings

import pytest
import torch

import kvdispatch
from conftest import DEVICE, GPU_BACKENDS, HAS_GPU
from kvdispatch import devices, dispatch
from kvcases import loop_page_table, loop_token_csr, make_case
from simdevices import FakeBackend

THREADS = 8


@pytest.fixture
def counted(monkeypatch):
    """Counts probes (slowed down) and selections; clears the env overrides."""
    for name in ("KVDISPATCH_BACKEND", "KVDISPATCH_STRICT", "KVDISPATCH_DEBUG"):
        monkeypatch.delenv(name, raising=False)
    calls = collections.Counter()
    real_read, real_choose = devices.read_device, dispatch.selector.choose

    def read_device(device):
        calls["probe"] += 1
        time.sleep(0.05)
        return real_read(device)

    def choose(device, requested):
        calls["choose"] += 1
        return real_choose(device, requested)

    monkeypatch.setattr(devices, "read_device", read_device)
    monkeypatch.setattr(dispatch.selector, "choose", choose)
    return calls


def _work(op, backend, seed):
    """Build fresh data, call, and return (result, expected) on the CPU."""
    g = torch.Generator().manual_seed(seed)
    if op == "page_table":
        case = make_case(5, 16, max_pages=20, device=DEVICE, with_start=True, generator=g,
                         index_dtype=(torch.int32, torch.int64)[seed % 2])
        out = case.page_table_out()
        expected = loop_page_table(case, out)
        kvdispatch.create_flashmla_kv_indices(case.req_to_token, case.req_pool_indices, case.seq_lens, out,
                                              page_size=16, kv_start_idx=case.kv_start_idx, backend=backend)
        return out.cpu(), expected
    case = make_case(4, 8, max_pages=6, device=DEVICE, with_start=True, generator=g)
    indptr, out = case.csr()
    expected = loop_token_csr(case, indptr.cpu(), out)
    kvdispatch.create_flashinfer_kv_indices(case.req_to_token, case.req_pool_indices, case.seq_lens, indptr, out,
                                            kv_start_idx=case.kv_start_idx, backend=backend)
    return out.cpu(), expected


def _race(ops, backend=None):
    """Run ``_work`` for each op in its own thread, all released at once; returns (results, errors)."""
    barrier = threading.Barrier(len(ops))
    results, errors = [None] * len(ops), []

    def worker(i, op):
        try:
            barrier.wait()
            results[i] = _work(op, backend, 1000 + i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i, op)) for i, op in enumerate(ops)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    return results, errors


def _assert_all_right(results, errors):
    assert not errors, errors
    for i, (got, expected) in enumerate(results):
        assert torch.equal(got, expected), f"thread {i}: wrong result"


def test_first_calls_race_auto(counted):
    results, errors = _race(["page_table"] * THREADS)
    _assert_all_right(results, errors)
    assert counted == {"probe": 1, "choose": 1}
    assert len(dispatch.selector._chosen) == 1


def test_first_calls_race_both_ops(counted):
    results, errors = _race(["page_table", "token_csr"] * (THREADS // 2))
    _assert_all_right(results, errors)
    assert counted == {"probe": 1, "choose": 2}  # one probe per device, one selection per (device, op)


@pytest.mark.parametrize("backend", GPU_BACKENDS if HAS_GPU else ["triton"])
def test_first_calls_race_forced_backend(counted, backend):
    if backend == "cupy-host" or backend not in kvdispatch.available_backends(DEVICE):
        pytest.skip(f"{backend} does not serve {DEVICE}")
    counted.clear()
    kvdispatch.reset()
    results, errors = _race(["page_table", "token_csr"] * (THREADS // 2), backend=backend)
    _assert_all_right(results, errors)
    assert counted == {"probe": 1, "choose": 2}
    assert {name for name, _ in dispatch.selector._chosen.values()} == {backend}


def test_failing_backend_under_a_race_warns_once(counted, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(devices, "_module_present", lambda name: True)
    monkeypatch.setattr(dispatch, "CPU_ORDER", ("triton", "torch", "cupy"))
    failing = FakeBackend(monkeypatch, "triton", fail=RuntimeError("injected launch failure"))
    if DEVICE.type != "cpu":
        monkeypatch.setattr(dispatch, "BACKENDS", ("triton", "torch", "cupy"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results, errors = _race(["page_table", "token_csr"] * (THREADS // 2))
    _assert_all_right(results, errors)
    failures = [str(w.message) for w in caught if "failed on" in str(w.message)]
    assert len(failures) == 1, failures
    assert failing.calls  # it was tried, and given up for the device
    assert kvdispatch.select_backend(DEVICE) == "torch"
    assert counted["probe"] == 1


def test_interpreted_launches_from_several_threads(monkeypatch):
    """Triton's interpreter patches triton.language for the length of a launch: launches from several
    threads, of both kernels, again and again after the first, must not meet inside it."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    if DEVICE.type != "cpu" or "triton" not in kvdispatch.available_backends("cpu"):
        pytest.skip("Triton's interpreter serves CPU tensors only")
    errors, wrong = [], []

    def worker(i):
        try:
            for step in range(6):
                got, expected = _work(("page_table", "token_csr")[(i + step) % 2], "triton", 100 * i + step)
                if not torch.equal(got, expected):
                    wrong.append((i, step))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert not errors and not wrong, (errors, wrong)
