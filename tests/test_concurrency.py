"""Eight threads making their first call at once on one device: one probe, one selection, all results right.

On CPU: the torch backend (auto), and Triton's interpreter (forced); on a GPU: auto (Triton there) and every
GPU backend forced. A slow ``read_device`` keeps every thread arriving while the first is still probing.
A backend that fails at launch under the same race gives one warning and every thread a right result.
"""

import collections
import os
import signal
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


def _fork_and_call(timeout=60):
    """Fork; the child makes one Triton call on CPU tensors (interpreted) and reports whether it was right.
    Returns the child's report, or fails when it does not finish within ``timeout`` seconds."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report and leave, whatever happens
        code = 1
        try:
            got, expected = _work("page_table", "triton", 7)
            os.write(write, b"right" if torch.equal(got, expected) else b"wrong")
            code = 0
        except BaseException as exc:  # noqa: BLE001  (reported to the parent)
            os.write(write, f"{type(exc).__name__}: {exc}".encode()[:4000])
        finally:
            os._exit(code)
    os.close(write)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail(f"the forked child's Triton call did not finish within {timeout} s")
    with os.fdopen(read, "rb") as pipe:
        return pipe.read().decode()


def _interpreter_only():
    if DEVICE.type != "cpu" or "triton" not in kvdispatch.available_backends("cpu"):
        pytest.skip("Triton's interpreter serves CPU tensors only")


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")  # the point of the test
def test_fork_while_another_thread_holds_the_interpreter_lock(monkeypatch):
    """A thread holds the interpreted launches' lock (and the selector's) when the main thread forks: the
    child's first Triton call completes (it starts with fresh locks and nothing selected)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    _interpreter_only()
    assert torch.equal(*_work("page_table", "triton", 1))  # the kernels imported, a selection made
    from kernels_triton import launch  # noqa: PLC0415  (imported by the call above)

    held, release = threading.Event(), threading.Event()

    def holder():
        with launch._interpreter_lock, dispatch.selector._lock, devices._lock:
            held.set()
            release.wait(timeout=300)

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert held.wait(timeout=60)
        assert _fork_and_call() == "right"
    finally:
        release.set()
        thread.join(timeout=60)


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")  # the point of the test
def test_fork_while_another_thread_is_inside_an_interpreted_launch(monkeypatch):
    """A thread launches interpreted Triton kernels again and again while the main thread forks several
    times: every child's Triton call completes with the right result."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    _interpreter_only()
    assert torch.equal(*_work("page_table", "triton", 1))
    from kernels_triton import launch  # noqa: PLC0415  (imported by the call above)

    stop, errors = threading.Event(), []

    def launcher():
        try:
            while not stop.is_set():
                _work("token_csr", "triton", 3)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    thread = threading.Thread(target=launcher)
    thread.start()
    try:
        for _ in range(3):
            deadline = time.monotonic() + 60
            while not launch._interpreter_lock.locked() and time.monotonic() < deadline:
                time.sleep(0.001)  # fork while the other thread is inside a launch
            assert _fork_and_call() == "right"
    finally:
        stop.set()
        thread.join(timeout=300)
    assert not errors, errors
