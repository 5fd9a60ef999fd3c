"""The compiled host path (``kvdispatch/host_path.c``) with CuPy's launches, on CPU, without CuPy or Triton.

The extension is pointed at stubs (``host_path_stubs``; CPU is device 0 there) and CuPy's runtime at a recorder.
A call's launch becomes its replay plan as ``kernels_cupy/native.py`` describes it (``replay_launch``): the
next call of the same key is launched from C with exactly the parameters, grid and threads
``kernels_cupy/launch.py`` builds for it, whatever its options. ``KVDISPATCH_CUPY_LAUNCH`` decides whether
a launch is described at all, and whether one the C path cannot take raises. The replay entry's own cases, for
every op on both launchers: ``test_host_path_replay.py``. On a GPU, ``test_cupy_native_gpu.py`` runs the real
thing.
"""

from __future__ import annotations

import functools

import pytest
import torch

import kvdispatch
from host_path_stubs import (FUNCTION, PAGE_TABLE, STREAM_BASE, build, check_approvals_follow_the_hooks, install,
                             random_call, random_csr_call, siblings, unsigned)
from kernels_cupy import launch as cupy_launch
from kernels_cupy import native as cupy_native
from kvdispatch import dispatch, host_path

CUPY = host_path.LAUNCHERS["cupy"]
BUILDERS = {"page_table": cupy_launch.build_page_table, "token_csr": cupy_launch.build_token_indices}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return build(tmp_path_factory)


class RecordingRuntime:
    """Stands in for ``kernels_cupy.runtime`` (which needs CuPy and a GPU): records the calls launched."""

    def __init__(self):
        self.calls = []

    def launch(self, call, device):
        self.calls.append(call)


@pytest.fixture
def stubs(built, monkeypatch):
    """The extension with stubs as ``host_path``'s module, CuPy's runtime a recorder (``stubs.runtime``), and the
    kernel and context a description reads (on a GPU: the ``CUfunction`` and CuPy's context) the stubs' ones."""
    stubs = install(built, monkeypatch, count=0)
    monkeypatch.setattr(cupy_native, "kernel_and_context", lambda index, call: (FUNCTION, stubs.context))
    monkeypatch.delenv(cupy_native.LAUNCH_ENV, raising=False)
    stubs.runtime = RecordingRuntime()
    monkeypatch.setattr(cupy_launch, "_runtime_module", stubs.runtime)
    return stubs


def register(stubs, op, call, backend=None):
    """Run ``call`` (public arguments, replay order) through CuPy's Python path as the API does on a GPU
    (``host_path.call_and_register``), which registers its launch as the replay plan on device 0; returns the
    ``KernelCall`` it launched."""
    stubs.runtime.calls.clear()
    host_path.call_and_register(op, backend, tuple(call), functools.partial(BUILDERS[op], *call))
    (kernel_call,) = stubs.runtime.calls
    stubs.count = len(kernel_call.args)
    return kernel_call


def assert_launched_as(stubs, kernel_call):
    (launched,) = stubs.launches
    assert launched["params"] == unsigned(kernel_call.args)
    assert launched["grid"] == kernel_call.grid
    assert launched["block"] == (kernel_call.threads, 1, 1) and launched["shared"] == 0
    assert launched["function"] == FUNCTION and launched["stream"] == STREAM_BASE + 0 and not launched["extra"]


@pytest.mark.parametrize("options", ["", "start", "lens_out fill", "round", "start lens_out fill round"])
def test_the_page_table_launch_registers_and_the_next_call_is_taken(stubs, options):
    """``build_page_table`` (the Python path) launches; the next call of its key, on other tensors, is launched
    by C with the parameters the Python path builds for it, rounding toward zero included."""
    call = random_call(14, with_start="start" in options, options=options)
    call[9] = "round" in options
    stubs.module.approve(PAGE_TABLE, 0, None, CUPY)
    register(stubs, "page_table", call)
    second = siblings(call)
    expected = cupy_launch.page_table_call(*second)
    assert stubs.module.replay(PAGE_TABLE, None, *second) is second[3]
    assert_launched_as(stubs, expected)


@pytest.mark.parametrize("options", ["", "start", "int64 out", "entry page size", "mapping", "every option"])
def test_the_token_csr_launch_registers_and_the_next_call_is_taken(stubs, options):
    """The same for ``build_token_indices``, with each option: an int64 out, an entry page size, a mapping."""
    call = random_csr_call(15, with_start=options in ("start", "every option"))
    if options in ("int64 out", "every option"):
        call[4] = call[4].long()
    if options in ("entry page size", "every option"):
        call[6] = 16
    if options in ("mapping", "every option"):
        call[7] = torch.arange(40, dtype=torch.int64)
    op = host_path.OPS["token_csr"]
    stubs.module.approve(op, 0, None, CUPY)
    register(stubs, "token_csr", call)
    second = siblings(call)
    expected = cupy_launch.token_csr_call(*second)
    assert stubs.module.replay(op, None, *second) is second[4]
    assert_launched_as(stubs, expected)


def test_approvals_follow_the_cupy_hooks(stubs):
    call = random_call(9)
    register(stubs, "page_table", call)
    check_approvals_follow_the_hooks(stubs, cupy_native, call, "triton")


def test_launch_modes(stubs, monkeypatch):
    """``python`` describes no launch (no plan); ``native`` raises where the C path cannot take one and says why;
    ``auto`` then stays on the Python path; any other value is an error."""
    call = random_call(12)
    stubs.module.approve(PAGE_TABLE, 0, None, CUPY)
    monkeypatch.setenv(cupy_native.LAUNCH_ENV, " Python ")
    register(stubs, "page_table", call)
    assert stubs.module.replay_plan_count() == 0
    monkeypatch.setattr(cupy_native, "kernel_and_context", lambda index, call: (FUNCTION, None))
    monkeypatch.setenv(cupy_native.LAUNCH_ENV, "native")
    with pytest.raises(RuntimeError, match="KVDISPATCH_CUPY_LAUNCH=native.*no current context"):
        register(stubs, "page_table", call)
    monkeypatch.setenv(cupy_native.LAUNCH_ENV, "auto")
    register(stubs, "page_table", call)
    assert stubs.module.replay_plan_count() == 0
    monkeypatch.setenv(cupy_native.LAUNCH_ENV, "c")
    with pytest.raises(ValueError, match="KVDISPATCH_CUPY_LAUNCH must be one of auto, native, python"):
        register(stubs, "page_table", call)
    assert stubs.launches == []


def test_reset_forgets_the_plans(stubs):
    call = random_call(10)
    stubs.module.approve(PAGE_TABLE, 0, None, CUPY)
    register(stubs, "page_table", call)
    assert stubs.module.replay(PAGE_TABLE, None, *call) is call[3]
    cupy_native.reset()
    assert stubs.module.replay(PAGE_TABLE, None, *call) is NotImplemented


def test_unavailable_host_path(monkeypatch):
    """Where the extension cannot be loaded, ``auto`` describes no launch (the Python path serves); ``native``
    raises with the reason."""
    monkeypatch.setattr(host_path, "_module", None)
    monkeypatch.setattr(host_path, "_failure", "RuntimeError: no C compiler found")
    kernel_call = cupy_launch.page_table_call(*random_call(13))
    monkeypatch.setenv(cupy_native.LAUNCH_ENV, "auto")
    assert cupy_native.replay_launch(kernel_call, 0) is None
    monkeypatch.setenv(cupy_native.LAUNCH_ENV, "native")
    with pytest.raises(RuntimeError, match="no C compiler found"):
        cupy_native.replay_launch(kernel_call, 0)


def test_public_api_goes_through_it_and_errors_do_not(stubs, monkeypatch):
    call = random_call(15, with_start=True, options="lens_out")
    table, pool, lens, out, page_size, start, offset, lens_out, fill, _ = call
    stubs.module.approve(PAGE_TABLE, 0, "cupy", CUPY)
    register(stubs, "page_table", call, backend="cupy")
    monkeypatch.setattr(dispatch, "fast_replay", stubs.module.replay)
    kwargs = dict(page_size=page_size, kv_start_idx=start, seqlen_offset=offset, seq_lens_out=lens_out,
                  fill_value=fill, backend="cupy")
    assert kvdispatch.create_flashmla_kv_indices(table, pool, lens, out, **kwargs) is out
    assert len(stubs.launches) == 1
    with pytest.raises(ValueError, match="page_size"):
        kvdispatch.create_flashmla_kv_indices(table, pool, lens, out, **{**kwargs, "page_size": 0})
    with pytest.raises(TypeError, match="req_to_token"):
        kvdispatch.create_flashmla_kv_indices(table.long(), pool, lens, out, **kwargs)
    assert len(stubs.launches) == 1
