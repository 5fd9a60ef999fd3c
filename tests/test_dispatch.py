"""Selection policy, the env override, caching, logging, and what a backend's failure does.

Simulated GPUs (tests/simdevices.py) test the policy through ``select_backend``, ``available_backends`` and
``dispatch.selector``; the fallback and caching paths run real calls on CPU tensors with fake backend
modules that count calls and fail on demand. The last tests inject a failure into the real GPU backends
(skipped without a GPU).
"""

import logging
import sys
import warnings

import pytest
import torch

import kvdispatch
from conftest import GPU_BACKENDS, HAS_GPU
from kvdispatch import _env, devices, dispatch
from kvcases import POISON, loop_page_table, loop_token_csr, make_case
from simdevices import (A100, B200, FUTURE_NVIDIA, GPU, H200, MI300X, MI355X, RX7900, FakeBackend, Sim)

CPU = torch.device("cpu")
CHOICES_TEXT = "auto, triton, cupy, torch"


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    for name in ("KVDISPATCH_BACKEND", "KVDISPATCH_STRICT", "KVDISPATCH_DEBUG"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def sim(monkeypatch):
    return Sim(monkeypatch)


def _page_table_call(backend=None, device=CPU, fill_value=None, case=None):
    """One page-table call on fresh random data; returns (out, expected from the loop oracle)."""
    case = case or make_case(6, 16, max_pages=5, with_start=True, device=device, fill_value=fill_value)
    out = case.page_table_out()
    expected = loop_page_table(case, out)
    kvdispatch.create_flashmla_kv_indices(case.req_to_token, case.req_pool_indices, case.seq_lens, out,
                                          page_size=case.page_size, kv_start_idx=case.kv_start_idx,
                                          fill_value=case.fill_value, backend=backend)
    return out.cpu(), expected


def _token_csr_call(backend=None, device=CPU):
    case = make_case(5, 8, max_pages=4, with_start=True, device=device)
    indptr, out = case.csr()
    expected = loop_token_csr(case, indptr.cpu(), out)
    kvdispatch.create_flashinfer_kv_indices(case.req_to_token, case.req_pool_indices, case.seq_lens, indptr, out,
                                            kv_start_idx=case.kv_start_idx, backend=backend)
    return out.cpu(), expected


# ---------------------------------------------------------------- auto order


@pytest.mark.parametrize("raw", [H200, B200, A100, MI300X, MI355X, RX7900], ids=lambda r: r.name)
def test_auto_order_on_gpus(sim, monkeypatch, raw):
    device = sim.add(raw)
    assert kvdispatch.available_backends(device) == ["triton", "cupy", "torch"]
    assert kvdispatch.select_backend(device) == "triton"
    assert dispatch.selector.choose(device, "auto") == "triton"

    sim.modules(triton=False, cupy=True)
    kvdispatch.reset()
    assert kvdispatch.available_backends(device) == ["cupy", "torch"]
    assert kvdispatch.select_backend(device) == "cupy"

    sim.modules(triton=False, cupy=False)
    kvdispatch.reset()
    assert kvdispatch.available_backends(device) == ["torch"]
    assert kvdispatch.select_backend(device) == "torch"


def test_unknown_gpu_never_gets_triton(sim):
    device = sim.add(FUTURE_NVIDIA)
    with pytest.warns(RuntimeWarning, match="sm_110"):
        assert kvdispatch.select_backend(device) == "cupy"
    assert kvdispatch.available_backends(device) == ["cupy", "torch"]
    with pytest.raises(kvdispatch.BackendUnavailableError, match="sm_110"):
        dispatch.selector.choose(device, "triton")


def test_cpu_auto_is_torch_and_triton_only_when_forced(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert kvdispatch.select_backend("cpu") == "torch"
    expected = ["torch", "triton"] if devices._module_present("triton") else ["torch"]
    assert kvdispatch.available_backends("cpu") == expected
    if devices._module_present("triton"):
        assert dispatch.selector.choose(CPU, "triton") == "triton"
    with pytest.raises(kvdispatch.BackendUnavailableError, match="CUDA and ROCm"):
        dispatch.selector.choose(CPU, "cupy")

    monkeypatch.delenv("TRITON_INTERPRET")
    kvdispatch.reset()
    assert kvdispatch.available_backends("cpu") == ["torch"]
    if devices._module_present("triton"):
        with pytest.raises(kvdispatch.BackendUnavailableError, match="set TRITON_INTERPRET=1") as raised:
            dispatch.selector.choose(CPU, "triton")
        assert "pip install" not in str(raised.value)  # Triton is installed: nothing to install


def test_cpu_call_in_auto_mode_uses_torch(monkeypatch):
    fake_triton = FakeBackend(monkeypatch, "triton")
    out, expected = _page_table_call()
    assert torch.equal(out, expected)
    assert not fake_triton.calls
    assert dispatch.selector._chosen[(CPU, "page_table", None)][0] == "torch"


# ---------------------------------------------------------------- KVDISPATCH_BACKEND and backend=


@pytest.mark.parametrize("value,chosen", [("auto", "triton"), ("triton", "triton"), ("cupy", "cupy"),
                                          ("torch", "torch"), ("", "triton"), (" Torch ", "torch"),
                                          ("CUPY", "cupy")])
def test_env_override_good_values(sim, monkeypatch, value, chosen):
    device = sim.add(H200)
    monkeypatch.setenv("KVDISPATCH_BACKEND", value)
    assert kvdispatch.select_backend(device) == chosen
    assert dispatch.requested_backend() == (value.strip().lower() or "auto")


@pytest.mark.parametrize("value", ["fastest", "cuda", "triton,cupy", "none"])
def test_env_override_bad_value(sim, monkeypatch, value):
    device = sim.add(H200)
    monkeypatch.setenv("KVDISPATCH_BACKEND", value)
    with pytest.raises(ValueError, match="KVDISPATCH_BACKEND") as raised:
        kvdispatch.select_backend(device)
    assert CHOICES_TEXT in str(raised.value) and repr(value) in str(raised.value)
    case = make_case(2, 4)
    out = case.page_table_out()
    with pytest.raises(ValueError, match=CHOICES_TEXT):
        kvdispatch.create_flashmla_kv_indices(case.req_to_token, case.req_pool_indices, case.seq_lens, out,
                                              page_size=4)
    assert (out == POISON).all()


@pytest.mark.parametrize("value,chosen", [("TRITON", "triton"), (" Torch ", "torch"), ("Cupy", "cupy"),
                                          ("AUTO", "triton"), ("", "triton")])
def test_backend_argument_reads_like_the_env_variable(sim, monkeypatch, value, chosen):
    device = sim.add(H200)
    assert dispatch.requested_backend(value) == (value.strip().lower() or "auto")
    monkeypatch.setenv("KVDISPATCH_BACKEND", value)
    assert dispatch.requested_backend() == dispatch.requested_backend(value)
    assert dispatch.selector.resolve(device, "page_table", value)[0] == chosen


def test_backend_argument_in_capitals_serves_a_call(monkeypatch):
    fake_triton = _fake_triton_first(monkeypatch)
    out, expected = _page_table_call(backend="TRITON")
    assert torch.equal(out, expected) and fake_triton.calls == {"page_table": 1}
    out, expected = _page_table_call(backend=" Torch")
    assert torch.equal(out, expected) and fake_triton.calls == {"page_table": 1}


@pytest.mark.parametrize("value", ["fast", 1, "tri ton"])
def test_bad_backend_argument_values(value):
    with pytest.raises(ValueError, match=f"backend must be one of {CHOICES_TEXT}; got {value!r}"):
        dispatch.requested_backend(value)


def test_bad_backend_argument():
    case = make_case(2, 4)
    out = case.page_table_out()
    with pytest.raises(ValueError, match=f"backend must be one of {CHOICES_TEXT}; got 'fast'"):
        kvdispatch.create_flashmla_kv_indices(case.req_to_token, case.req_pool_indices, case.seq_lens, out,
                                              page_size=4, backend="fast")
    assert (out == POISON).all()


@pytest.mark.parametrize("missing,reason", [("cupy", "CuPy is not installed"), ("triton", "Triton is not installed")])
def test_forced_unavailable_backend_raises_with_reason_and_hint(monkeypatch, missing, reason):
    sim = Sim(monkeypatch, triton=missing != "triton", cupy=missing != "cupy")
    device = sim.add(H200)
    monkeypatch.setenv("KVDISPATCH_BACKEND", missing)
    with pytest.raises(kvdispatch.BackendUnavailableError) as raised:
        kvdispatch.select_backend(device)
    message = str(raised.value)
    assert reason in message and "pip install" in message and "cuda:0" in message
    assert "sm_90" in message
    with pytest.raises(kvdispatch.BackendUnavailableError):
        dispatch.selector.resolve(device, "page_table", None)
    assert not dispatch.selector._chosen  # nothing was cached: no silent fallback later either


@pytest.mark.parametrize("backend,reason", [("cupy", "CuPy serves CUDA and ROCm GPUs only, not cpu"),
                                            ("triton", "set TRITON_INTERPRET=1")])
def test_no_install_hint_when_nothing_is_missing(monkeypatch, backend, reason):
    """Installed, or with no package that would help: the error gives the reason and names nothing to
    install."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(devices, "_module_present", lambda name: True)  # Triton and CuPy installed
    with pytest.raises(kvdispatch.BackendUnavailableError) as raised:
        dispatch.selector.choose(CPU, backend)
    assert reason in str(raised.value) and "pip install" not in str(raised.value)


def test_wrong_cupy_build_is_a_missing_package(monkeypatch):
    sim = Sim(monkeypatch, cupy_vendor="nvidia")
    device = sim.add(MI300X)
    with pytest.raises(kvdispatch.BackendUnavailableError,
                       match=r'built for NVIDIA.*pip install cupy-rocm-7-0, or from a kvdispatch checkout: '
                             r'pip install -e "\.\[rocm\]"'):
        dispatch.selector.choose(device, "cupy")


def test_a_backend_that_fails_to_load_names_the_error_and_nothing_to_install(monkeypatch):
    _fake_triton_first(monkeypatch)
    monkeypatch.setitem(dispatch.REGISTRY, "triton", dispatch.Backend("triton", "kvtest_no_such_module"))
    monkeypatch.delitem(sys.modules, "kvtest_no_such_module", raising=False)
    with pytest.raises(kvdispatch.BackendUnavailableError, match="failed to load") as raised:
        _page_table_call(backend="triton")
    assert "kvtest_no_such_module" in str(raised.value) and "pip install" not in str(raised.value)


def test_forced_unavailable_backend_never_falls_back_in_a_call(monkeypatch):
    monkeypatch.setenv("KVDISPATCH_BACKEND", "cupy")  # CuPy never serves CPU tensors
    case = make_case(3, 4)
    out = case.page_table_out()
    with pytest.raises(kvdispatch.BackendUnavailableError, match="CuPy serves CUDA and ROCm GPUs only"):
        kvdispatch.create_flashmla_kv_indices(case.req_to_token, case.req_pool_indices, case.seq_lens, out,
                                              page_size=4)
    assert (out == POISON).all()
    indptr, flat = case.csr()
    with pytest.raises(kvdispatch.BackendUnavailableError):
        kvdispatch.create_flashinfer_kv_indices(case.req_to_token, case.req_pool_indices, case.seq_lens, indptr,
                                                flat)
    assert (flat == POISON).all()


def test_backend_argument_wins_over_env(monkeypatch):
    fake_triton = FakeBackend(monkeypatch, "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(devices, "_module_present", lambda name: True)
    monkeypatch.setenv("KVDISPATCH_BACKEND", "cupy")  # would raise on CPU
    out, expected = _page_table_call(backend="torch")
    assert torch.equal(out, expected)
    out, expected = _page_table_call(backend="triton")
    assert torch.equal(out, expected) and fake_triton.calls["page_table"] == 1

    monkeypatch.setenv("KVDISPATCH_BACKEND", "triton")
    kvdispatch.reset()
    out, expected = _page_table_call(backend="torch")
    assert torch.equal(out, expected) and fake_triton.calls["page_table"] == 1
    out, expected = _page_table_call()  # the env var serves when backend= is not given
    assert torch.equal(out, expected) and fake_triton.calls["page_table"] == 2
    out, expected = _page_table_call(backend="auto")  # "auto" is explicit: ignores the env var
    assert torch.equal(out, expected) and fake_triton.calls["page_table"] == 2


# ---------------------------------------------------------------- launch failures and fallback


def _fake_triton_first(monkeypatch, fail=None):
    """On CPU, auto order puts a fake 'triton' (failing with ``fail``, if given) ahead of torch."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(devices, "_module_present", lambda name: True)
    monkeypatch.setattr(dispatch, "CPU_ORDER", ("triton", "torch", "cupy"))
    return FakeBackend(monkeypatch, "triton", fail=fail)


@pytest.fixture
def failing_first(monkeypatch):
    """On CPU, auto order puts a fake 'triton' that fails at launch ahead of torch."""
    return _fake_triton_first(monkeypatch, RuntimeError("injected launch failure"))


@pytest.mark.parametrize("fill_value", [None, -1])
def test_auto_falls_back_with_one_warning(failing_first, fill_value):
    assert kvdispatch.select_backend("cpu") == "triton"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            out, expected = _page_table_call(fill_value=fill_value)
            assert torch.equal(out, expected)
            out, expected = _token_csr_call()
            assert torch.equal(out, expected)
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1, messages
    assert caught[0].category is RuntimeWarning
    assert "'triton'" in messages[0] and "cpu" in messages[0] and "injected launch failure" in messages[0]
    assert caught[0].filename == __file__  # points at the caller's line, not at kvdispatch
    assert failing_first.calls == {"page_table": 1}  # disabled for the device after the first failure
    assert kvdispatch.select_backend("cpu") == "torch"
    assert kvdispatch.available_backends("cpu") == ["torch"]
    assert "injected launch failure" in dispatch.selector.disabled(CPU)["triton"]


@pytest.mark.parametrize("how", ["argument", "env"])
def test_forced_backend_failure_raises(failing_first, monkeypatch, how):
    if how == "env":
        monkeypatch.setenv("KVDISPATCH_BACKEND", "triton")
    backend = "triton" if how == "argument" else None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning either
        for _ in range(2):
            with pytest.raises(RuntimeError, match="injected launch failure"):
                _page_table_call(backend=backend)
    assert failing_first.calls["page_table"] == 2
    assert not dispatch.selector.disabled(CPU)


@pytest.mark.parametrize("on", ["1", "true", " Yes ", "ON"])
def test_strict_turns_fallback_into_an_error(failing_first, monkeypatch, on):
    monkeypatch.setenv("KVDISPATCH_STRICT", on)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):
            with pytest.raises(RuntimeError, match="injected launch failure"):
                _page_table_call()
            with pytest.raises(RuntimeError, match="injected launch failure"):
                _token_csr_call()
    assert not dispatch.selector.disabled(CPU)
    monkeypatch.setenv("KVDISPATCH_STRICT", "0")
    with pytest.warns(RuntimeWarning, match="injected launch failure"):
        out, expected = _page_table_call()
    assert torch.equal(out, expected)


@pytest.mark.parametrize("off", ["0", "false", "no", " Off ", ""])
def test_strict_off_values_fall_back(failing_first, monkeypatch, off):
    monkeypatch.setenv("KVDISPATCH_STRICT", off)
    with pytest.warns(RuntimeWarning, match="injected launch failure"):
        out, expected = _page_table_call()
    assert torch.equal(out, expected) and kvdispatch.select_backend("cpu") == "torch"


@pytest.mark.parametrize("value", ["2", "maybe", "nope"])
def test_strict_bad_value_is_an_error_at_the_first_call(monkeypatch, value):
    """Reported when the call is first resolved, not only once a backend fails."""
    monkeypatch.setenv("KVDISPATCH_STRICT", value)
    case = make_case(2, 4)
    out = case.page_table_out()
    with pytest.raises(ValueError, match="KVDISPATCH_STRICT must be one of 1/0, true/false, yes/no, on/off"):
        kvdispatch.create_flashmla_kv_indices(case.req_to_token, case.req_pool_indices, case.seq_lens, out,
                                              page_size=4)
    assert (out == POISON).all()


@pytest.mark.parametrize("value,on", [("1", True), ("true", True), ("YES", True), (" on ", True), ("0", False),
                                      ("False", False), ("no", False), ("off", False), ("", False), (None, False)])
def test_boolean_variables_read_alike(monkeypatch, value, on):
    if value is None:
        monkeypatch.delenv("KVDISPATCH_TEST_SWITCH", raising=False)
    else:
        monkeypatch.setenv("KVDISPATCH_TEST_SWITCH", value)
    assert _env.flag("KVDISPATCH_TEST_SWITCH") is on


@pytest.mark.parametrize("value", ["2", "-1", "y", "n", "enable", "truee", "1 0"])
def test_a_boolean_variable_refuses_other_values(monkeypatch, value):
    monkeypatch.setenv("KVDISPATCH_TEST_SWITCH", value)
    with pytest.raises(ValueError) as info:
        _env.flag("KVDISPATCH_TEST_SWITCH")
    message = str(info.value)
    assert "KVDISPATCH_TEST_SWITCH" in message and "1/0, true/false, yes/no, on/off" in message
    assert repr(value) in message


@pytest.mark.skipif(not devices._module_present("triton"), reason="needs Triton installed")
@pytest.mark.parametrize("value,served", [("true", True), ("ON", True), ("no", False), ("0", False)])
def test_triton_interpret_reads_as_a_boolean(monkeypatch, value, served):
    monkeypatch.setenv("TRITON_INTERPRET", value)
    assert ("triton" in kvdispatch.available_backends("cpu")) is served


def test_a_backend_that_has_served_stays_selected_when_a_call_fails(monkeypatch):
    """After its first success on a device, a backend's failure is that call's error, for either op: no
    warning, no fallback, and the next call goes to it again."""
    fake = _fake_triton_first(monkeypatch)
    out, expected = _page_table_call()
    assert torch.equal(out, expected) and fake.calls == {"page_table": 1}
    fake.fail = RuntimeError("grid too large for these arguments")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):
            with pytest.raises(RuntimeError, match="grid too large"):
                _page_table_call()
            with pytest.raises(RuntimeError, match="grid too large"):
                _token_csr_call()  # served by the page table only: the device has seen it serve
    assert not dispatch.selector.disabled(CPU)
    assert kvdispatch.select_backend("cpu") == "triton" and dispatch.selector.has_served(CPU, "triton")
    fake.fail = None
    out, expected = _token_csr_call()
    assert torch.equal(out, expected) and fake.calls == {"page_table": 3, "token_csr": 3}


def test_having_served_one_device_does_not_vouch_for_another(monkeypatch):
    """Served on the (simulated) GPU, the fake Triton still is disabled on CPU when it fails there first."""
    fake = _fake_triton_first(monkeypatch)
    sim = Sim(monkeypatch)
    gpu = sim.add(H200)
    monkeypatch.setattr(devices, "_module_present", lambda name: True)
    case = make_case(4, 16, device=CPU)

    def page_table_on(device):  # the fake computes on CPU tensors, whichever device it serves
        out = case.page_table_out()
        dispatch.call(device, "page_table", None, case.req_to_token, case.req_pool_indices, case.seq_lens, out,
                      case.page_size, None, 0, None, None)
        return out

    assert torch.equal(page_table_on(gpu), loop_page_table(case, case.page_table_out()))
    fake.fail = RuntimeError("injected launch failure")
    with pytest.raises(RuntimeError, match="injected"):
        page_table_on(gpu)
    with pytest.warns(RuntimeWarning, match="disabled for this device"):
        assert torch.equal(page_table_on(CPU), loop_page_table(case, case.page_table_out()))
    assert set(dispatch.selector.disabled(CPU)) == {"triton"} and not dispatch.selector.disabled(gpu)
    assert dispatch.selector.resolve(gpu, "page_table", None)[0] == "triton"
    assert dispatch.selector.resolve(CPU, "page_table", None)[0] == "torch"


def test_reset_forgets_what_has_served(monkeypatch):
    fake = _fake_triton_first(monkeypatch)
    _page_table_call()
    kvdispatch.reset()
    assert not dispatch.selector.has_served(CPU, "triton")
    fake.fail = RuntimeError("injected launch failure")
    with pytest.warns(RuntimeWarning, match="disabled for this device"):
        out, expected = _page_table_call()
    assert torch.equal(out, expected) and kvdispatch.select_backend("cpu") == "torch"


def test_torch_failure_is_never_swallowed(monkeypatch):
    FakeBackend(monkeypatch, "torch", fail=RuntimeError("torch broke"))
    with pytest.raises(RuntimeError, match="torch broke"):
        _page_table_call()


def test_a_backend_that_fails_to_import_falls_back(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(devices, "_module_present", lambda name: True)
    monkeypatch.setattr(dispatch, "CPU_ORDER", ("triton", "torch", "cupy"))
    monkeypatch.setitem(dispatch.REGISTRY, "triton", dispatch.Backend("triton", "kvtest_no_such_module"))
    monkeypatch.delitem(sys.modules, "kvtest_no_such_module", raising=False)
    with pytest.warns(RuntimeWarning, match="kvtest_no_such_module"):
        out, expected = _page_table_call()
    assert torch.equal(out, expected)
    kvdispatch.reset()
    with pytest.raises(kvdispatch.BackendUnavailableError, match="failed to load"):
        _page_table_call(backend="triton")


# ---------------------------------------------------------------- caching, hot path, logging


def test_selection_is_cached_per_device_and_op(monkeypatch):
    out, expected = _page_table_call()
    assert torch.equal(out, expected)
    out, expected = _token_csr_call()
    assert torch.equal(out, expected)
    assert set(dispatch.selector._chosen) == {(CPU, "page_table", None), (CPU, "token_csr", None)}

    def forbidden(*args, **kwargs):
        raise AssertionError("the hot path must not probe, choose or read the environment")

    monkeypatch.setattr(dispatch.selector, "choose", forbidden)
    monkeypatch.setattr(devices, "probe", forbidden)
    monkeypatch.setattr(devices, "read_device", forbidden)
    monkeypatch.setattr(dispatch, "requested_backend", forbidden)
    monkeypatch.setattr(dispatch.selector, "_lock", None)  # not even the lock is taken
    for _ in range(3):
        out, expected = _page_table_call()
        assert torch.equal(out, expected)
        out, expected = _token_csr_call()
        assert torch.equal(out, expected)


def test_simulated_gpu_resolution_is_cached(sim, monkeypatch):
    device = sim.add(H200)
    fake = FakeBackend(monkeypatch, "triton")
    name, function = dispatch.selector.resolve(device, "page_table", None)
    assert name == "triton" and function.__self__ is fake
    assert dispatch.selector.resolve(device, "token_csr", None)[0] == "triton"
    calls = []
    monkeypatch.setattr(dispatch.selector, "choose", lambda *a: calls.append(a))
    for _ in range(10):
        assert dispatch.selector.resolve(device, "page_table", None) == (name, function)
    assert not calls and sim.calls == {GPU: 1}


def test_one_info_line_at_first_selection_per_device(sim, caplog):
    caplog.set_level(logging.INFO, logger="kvdispatch")
    device = sim.add(H200)
    for _ in range(3):
        _page_table_call()
        _token_csr_call()
        kvdispatch.select_backend("cpu")
        kvdispatch.select_backend(device)
    records = [r for r in caplog.records if r.name == "kvdispatch"]
    assert len(records) == 2, [r.getMessage() for r in records]
    cpu_line, gpu_line = (r.getMessage() for r in records)
    assert records[0].levelno == logging.INFO
    assert cpu_line.startswith("kvdispatch: cpu") and "chose torch" in cpu_line
    assert "cuda:0" in gpu_line and "NVIDIA H200" in gpu_line and "sm_90" in gpu_line and "hopper" in gpu_line
    assert "chose triton" in gpu_line


def test_forced_selection_is_logged_too(sim, caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="kvdispatch")
    device = sim.add(MI300X)
    monkeypatch.setenv("KVDISPATCH_BACKEND", "cupy")
    assert kvdispatch.select_backend(device) == "cupy"
    assert kvdispatch.select_backend(device) == "cupy"
    lines = [r.getMessage() for r in caplog.records if r.name == "kvdispatch"]
    assert len(lines) == 1 and "chose cupy (forced)" in lines[0]


def test_reset_forgets_everything(failing_first):
    with pytest.warns(RuntimeWarning):
        _page_table_call()
    assert dispatch.selector.disabled(CPU)
    kvdispatch.reset()
    assert not dispatch.selector.disabled(CPU) and not dispatch.selector._chosen
    assert kvdispatch.select_backend("cpu") == "triton"


# ---------------------------------------------------------------- real GPU backends (skipped without a GPU)


@pytest.mark.skipif(not HAS_GPU or not GPU_BACKENDS, reason="needs a GPU and a GPU backend")
@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_real_gpu_backend_failure_falls_back(monkeypatch, backend):
    """A GPU backend whose launch raises: auto mode warns once and the next backend gives the right result."""
    monkeypatch.delenv("KVDISPATCH_BACKEND", raising=False)
    device = torch.device("cuda", torch.cuda.current_device())
    usable = kvdispatch.available_backends(device)
    if backend not in usable:
        pytest.skip(f"{backend} does not serve {device}: {kvdispatch.probe(device).reason(backend)}")
    # Put the backend under test first, so auto mode picks it whatever the policy's order.
    order = [backend] + [b for b in dispatch.BACKENDS if b != backend]
    monkeypatch.setattr(dispatch, "BACKENDS", tuple(order))
    module = dispatch.REGISTRY[backend].load()

    def boom(*args, **kwargs):
        raise RuntimeError(f"injected {backend} launch failure")

    monkeypatch.setattr(module, "build_page_table", boom)
    monkeypatch.setattr(module, "build_token_indices", boom)
    assert kvdispatch.select_backend(device) == backend
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            out, expected = _page_table_call(device=device, fill_value=-1)
            assert torch.equal(out, expected)
            out, expected = _token_csr_call(device=device)
            assert torch.equal(out, expected)
    messages = [str(w.message) for w in caught if "failed on" in str(w.message)]
    assert len(messages) == 1 and f"'{backend}'" in messages[0] and str(device) in messages[0]
    assert kvdispatch.select_backend(device) != backend
    with pytest.raises(RuntimeError, match="injected"):
        _page_table_call(backend=backend, device=device)


# ---------------------------------------------------------------- the caller's errors never disable a backend


def _real_triton_first(monkeypatch):
    """The device on which the real Triton backend is the auto choice: the GPU where there is one, else CPU,
    with auto order putting Triton's interpreter ahead of torch (on a GPU machine the kernels were made for
    the GPU at import, so the interpreter cannot serve CPU tensors there)."""
    if HAS_GPU:
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = CPU
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        monkeypatch.setattr(dispatch, "CPU_ORDER", ("triton", "torch", "cupy"))
    if kvdispatch.available_backends(device)[:1] != ["triton"]:
        pytest.skip(f"Triton is not the auto choice for {device} here")
    return device


def _served_by_triton_and_right(device):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "disabled for this device" warning
        out, expected = _page_table_call(device=device)
    assert torch.equal(out, expected)
    assert not dispatch.selector.disabled(device) and dispatch.selector.has_served(device, "triton")


@pytest.mark.parametrize("enable_pdl", [torch.tensor([True, False]), "false", 0.5])
def test_a_bad_flag_in_a_first_call_leaves_the_backend_selected(monkeypatch, enable_pdl):
    """The first call on the device passes ``enable_pdl`` of another type: its TypeError, before any backend
    runs; Triton stays the auto choice and serves the next call."""
    device = _real_triton_first(monkeypatch)
    case = make_case(6, 16, max_pages=5, device=device)
    out = case.page_table_out()
    with pytest.raises(TypeError, match="enable_pdl must be a bool or None"):
        kvdispatch.create_flashmla_kv_indices(case.req_to_token, case.req_pool_indices, case.seq_lens, out,
                                              page_size=16, enable_pdl=enable_pdl)
    assert (out == POISON).all()
    _served_by_triton_and_right(device)


def test_an_invalid_variable_read_at_the_first_launch_is_the_calls_error(monkeypatch):
    """``KVDISPATCH_TRITON_LAUNCH`` turns invalid after the selection, before Triton's first launch, which
    reads it: the call's ValueError; Triton is not disabled and serves once the variable is valid again."""
    device = _real_triton_first(monkeypatch)
    assert dispatch.selector.resolve(device, "page_table", None)[0] == "triton"
    from kernels_triton import launch  # noqa: PLC0415  (the selection imported it)

    launch.reset()  # no plan left from earlier tests: the call builds one, reading the variable
    monkeypatch.setenv("KVDISPATCH_TRITON_LAUNCH", "bogus")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="KVDISPATCH_TRITON_LAUNCH must be one of auto, native"):
            _page_table_call(device=device)
    assert not dispatch.selector.disabled(device) and not dispatch.selector.has_served(device, "triton")
    monkeypatch.delenv("KVDISPATCH_TRITON_LAUNCH")
    _served_by_triton_and_right(device)


def test_an_invalid_variable_in_a_fake_backends_first_call_is_not_a_backend_failure(monkeypatch):
    fake = _fake_triton_first(monkeypatch, _env.InvalidVariableError("KVDISPATCH_X must be one of a, b; got 'c'"))
    with pytest.raises(ValueError, match="KVDISPATCH_X"):
        _page_table_call()
    assert not dispatch.selector.disabled(CPU)
    fake.fail = None
    out, expected = _page_table_call()
    assert torch.equal(out, expected) and fake.calls == {"page_table": 2}


def test_a_backend_whose_first_call_fails_is_still_disabled(failing_first):
    """What stays: a backend that cannot run at all (its first call on the device fails) leaves auto selection."""
    with pytest.warns(RuntimeWarning, match="disabled for this device"):
        out, expected = _page_table_call()
    assert torch.equal(out, expected) and set(dispatch.selector.disabled(CPU)) == {"triton"}


# ---------------------------------------------------------------- every variable, read on every platform


_INVALID_VARIABLES = [("KVDISPATCH_BACKEND", "bogus"), ("KVDISPATCH_STRICT", "maybe"), ("KVDISPATCH_DEBUG", "2"),
                      ("KVDISPATCH_PDL", "sometimes"), ("KVDISPATCH_HIP_HOST_PATH", "maybe"),
                      ("KVDISPATCH_TRITON_LAUNCH", "bogus"), ("KVDISPATCH_CUPY_LAUNCH", "bogus")]


@pytest.mark.parametrize("name,value", _INVALID_VARIABLES)
def test_every_variable_is_validated_on_cpu(monkeypatch, name, value):
    """A CPU call (torch serves it) reads every KVDISPATCH_* variable, also those only a GPU vendor's path uses."""
    monkeypatch.setenv(name, value)
    case = make_case(3, 16, max_pages=3, device=CPU)
    out = case.page_table_out()
    with pytest.raises(ValueError, match=f"{name} must be one of .*{value!r}"):
        kvdispatch.create_flashmla_kv_indices(case.req_to_token, case.req_pool_indices, case.seq_lens, out,
                                              page_size=16, backend="torch")
    assert (out == POISON).all()


@pytest.mark.parametrize("raw", [H200, MI300X], ids=lambda r: r.name)
@pytest.mark.parametrize("name,value", _INVALID_VARIABLES)
def test_every_variable_is_validated_on_every_gpu_vendor(sim, monkeypatch, raw, name, value):
    """On NVIDIA and AMD alike: the AMD-only ``KVDISPATCH_HIP_HOST_PATH`` and the CuPy launcher's variable too."""
    device = sim.add(raw)
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=f"{name} must be one of"):
        dispatch.selector.resolve(device, "page_table", None)
    assert not dispatch.selector.disabled(device)


def test_the_hip_host_path_variable_is_read_on_nvidia(sim, monkeypatch):
    from kvdispatch import host_path  # noqa: PLC0415  (not imported by import kvdispatch)

    device = sim.add(H200)
    monkeypatch.setenv("KVDISPATCH_HIP_HOST_PATH", "maybe")
    with pytest.raises(ValueError, match="KVDISPATCH_HIP_HOST_PATH must be one of"):
        host_path.configuration_for(device.index)
    monkeypatch.setenv("KVDISPATCH_HIP_HOST_PATH", "off")
    assert host_path.configuration_for(device.index) is host_path.configure_for_cuda


def test_an_invalid_variable_does_not_take_the_compiled_host_path_away(sim, monkeypatch):
    """Raised to the caller when the extension loads, not recorded as the reason it is not available."""
    from kvdispatch import host_path  # noqa: PLC0415

    device = sim.add(H200)
    monkeypatch.setattr(host_path, "_module", None)
    monkeypatch.setattr(host_path, "_failure", None)
    monkeypatch.setattr(host_path, "build", lambda: pytest.fail("built despite an invalid variable"))
    monkeypatch.setenv("KVDISPATCH_HIP_HOST_PATH", "maybe")
    with pytest.raises(ValueError, match="KVDISPATCH_HIP_HOST_PATH must be one of"):
        host_path.load(device.index)
    assert host_path.failure() is None


# ---------------------------------------------------------------- TRITON_INTERPRET, read as Triton reads it


_INTERPRET_VALUES = ["1", " 1 ", "1 ", "true", "TRUE", "On", "yes", "y", "Y", "0", "false", "off", "no", "", "2",
                     "bogus", " true", "interpret"]


@pytest.mark.skipif(not devices._module_present("triton"), reason="needs Triton installed")
@pytest.mark.parametrize("value", _INTERPRET_VALUES + [None])
def test_triton_interpret_is_read_exactly_as_the_installed_triton_reads_it(monkeypatch, value):
    """Triton offered for CPU tensors exactly when Triton itself interprets (``knobs.runtime.interpret``)."""
    from triton import knobs  # noqa: PLC0415

    if value is None:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    else:
        monkeypatch.setenv("TRITON_INTERPRET", value)
    interprets = knobs.runtime.interpret
    assert _env.triton_flag("TRITON_INTERPRET") is interprets
    assert ("triton" in kvdispatch.available_backends("cpu")) is interprets


@pytest.mark.parametrize("value,on", [("1", True), ("y", True), ("YES", True), ("true", True), (" 1 ", False),
                                      ("1\n", False), ("0", False), ("no", False), ("2", False), ("", False)])
def test_triton_interpret_values(monkeypatch, value, on):
    """Triton's reading (3.6 to 3.9), also where Triton is not installed: lowered, not stripped."""
    monkeypatch.setenv("TRITON_INTERPRET", value)
    assert _env.triton_flag("TRITON_INTERPRET") is on
