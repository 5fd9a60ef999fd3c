"""The compiled host path (``kvdispatch/host_path.c``) with CuPy's plans, on CPU, without CuPy or Triton.

The extension is pointed at stubs (``host_path_stubs``; CPU is device 0 there). A plan is registered as
``kernels_cupy/native.py`` registers it after a call's first launch; for random and hostile calls the
parameters, grid, threads and shared memory the C path launches with must equal exactly what
``kernels_cupy/launch.py`` builds for the same call (``page_table_call``, ``token_csr_call``). Calls of
another key, of another launcher's approval, or with an option are handed back. On a GPU,
``test_cupy_native_gpu.py`` runs the real thing.
"""

from __future__ import annotations

import pytest
import torch

import kvdispatch
from host_path_stubs import (FUNCTION, PAGE_TABLE, STREAM_BASE, TOKEN_CSR, build, check_approvals_follow_the_hooks,
                             install, random_call, random_csr_call, unsigned)
from kernels_cupy import launch as cupy_launch
from kernels_cupy import native as cupy_native
from kvdispatch import dispatch, host_path

CUPY, TRITON = host_path.LAUNCHERS["cupy"], host_path.LAUNCHERS["triton"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return build(tmp_path_factory)


@pytest.fixture
def stubs(built, monkeypatch):
    """The extension with stubs as ``host_path``'s module, CuPy's registrations forgotten, and the kernel and
    context a registration reads (on a GPU: the ``CUfunction`` and CuPy's context) the stubs' ones."""
    stubs = install(built, monkeypatch, count=0)
    monkeypatch.setattr(cupy_native, "_tried", set())
    monkeypatch.setattr(cupy_native, "_off", False)
    monkeypatch.setattr(cupy_native, "kernel_and_context", lambda index, call: (FUNCTION, stubs.context))
    monkeypatch.delenv(cupy_native.LAUNCH_ENV, raising=False)
    return stubs


def register(stubs, op, call):
    """Register ``call``'s plan (public arguments) through ``kernels_cupy.native`` as its launcher does after
    the first launch, on device 0; returns the ``KernelCall`` the Python path launched."""
    if op == "page_table":
        kernel_call, key = cupy_launch.page_table_call(*call[:9]), cupy_native.page_table_key(*call[:9])
    else:
        kernel_call, key = cupy_launch.token_csr_call(*call[:6]), cupy_native.token_csr_key(*call[:6])
    cupy_native.add_plan(op, (0,) + key[1:], kernel_call)
    stubs.count = len(kernel_call.args)
    return kernel_call


def assert_launched_as(stubs, kernel_call):
    (launched,) = stubs.launches
    assert launched["params"] == unsigned(kernel_call.args)
    assert launched["grid"] == kernel_call.grid
    assert launched["block"] == (kernel_call.threads, 1, 1) and launched["shared"] == 0
    assert launched["function"] == FUNCTION and launched["stream"] == STREAM_BASE + 0 and not launched["extra"]


def _batch_of_one(call):
    call[1], call[2] = call[1][:1], call[2][:1]
    if call[5] is not None:
        call[5] = call[5][:1]


def _hostile_page_table(call, kind):
    """``call`` (public page-table arguments) changed as ``kind`` says: values at the int32 edges, stride-0
    vectors, sizes and strides past 2**31 (no memory behind them)."""
    batch, cols, width = call[1].shape[0], call[0].shape[1], call[3].shape[1]
    if kind == "offset at int32 max":
        call[6] = 2**31 - 1
    elif kind == "offset at int32 min":
        call[6] = -(2**31)
    elif kind == "fill at int32 min":
        call[8] = -(2**31)
    elif kind == "fill at int32 max":
        call[8] = 2**31 - 1
    elif kind == "pool stride 0":
        call[1] = call[1][:1].expand(batch)
    elif kind == "int64 start stride 0":
        call[5] = torch.full((1,), 3, dtype=torch.int64).expand(batch)
    elif kind == "table rows 2**31":
        call[0] = call[0][:1].expand(2**31, cols)
    elif kind == "table row stride 2**31":
        call[0] = call[0][:1].as_strided((1, cols), (2**31, 1))
    elif kind == "out row stride 2**31":
        call[3] = torch.zeros(width, dtype=torch.int32).as_strided((1, width), (2**31, 1))
        _batch_of_one(call)
    return call


PAGE_TABLE_HOSTILE = ["offset at int32 max", "offset at int32 min", "fill at int32 min", "fill at int32 max",
                      "pool stride 0", "int64 start stride 0", "table rows 2**31", "table row stride 2**31",
                      "out row stride 2**31"]


@pytest.mark.parametrize("seed", range(60))
def test_page_table_packs_what_the_cupy_launcher_builds(stubs, seed):
    call = random_call(seed)
    if seed >= 20:  # the rest: one hostile change each, on top of the random call
        call = _hostile_page_table(call, PAGE_TABLE_HOSTILE[seed % len(PAGE_TABLE_HOSTILE)])
    stubs.module.approve(PAGE_TABLE, 0, None, CUPY)
    kernel_call = register(stubs, "page_table", call)
    before = call[3].clone()
    assert stubs.module.page_table(*call) is call[3]
    assert_launched_as(stubs, kernel_call)
    assert torch.equal(call[3], before)  # the stub launched nothing: C itself writes no tensor
    assert stubs.module.launch_count() == 1


def _hostile_csr(call, kind):
    """``call`` (public token-CSR arguments) changed as ``kind`` says."""
    batch, cols = call[1].shape[0], call[0].shape[1]
    if kind == "table rows 2**31":
        call[0] = call[0][:1].expand(2**31, cols)
    elif kind == "table row stride 2**31":
        call[0] = call[0][:1].as_strided((1, cols), (2**31, 1))
    elif kind == "indptr stride 0":
        call[3] = torch.zeros(1, dtype=torch.int64).expand(batch)
    elif kind == "int64 start stride 0":
        call[5] = torch.ones(1, dtype=torch.int64).expand(batch)
    return call


CSR_HOSTILE = ["table rows 2**31", "table row stride 2**31", "indptr stride 0", "int64 start stride 0"]


@pytest.mark.parametrize("seed", range(40))
def test_token_csr_packs_what_the_cupy_launcher_builds(stubs, seed):
    call = random_csr_call(seed)
    if seed >= 20:
        call = _hostile_csr(call, CSR_HOSTILE[seed % len(CSR_HOSTILE)])
    stubs.module.approve(TOKEN_CSR, 0, None, CUPY)
    kernel_call = register(stubs, "token_csr", call)
    assert stubs.module.token_csr(*call) is call[4]
    assert_launched_as(stubs, kernel_call)


def test_keys_are_the_ones_c_computes(stubs):
    """A call of another key finds no plan; Triton's specialisations (strides, packing, offset) are no part
    of a CuPy key, so calls that differ only in them share one plan."""
    call = random_call(3, page_size=64, with_start=False, options="")
    stubs.module.approve(PAGE_TABLE, 0, None, CUPY)
    register(stubs, "page_table", call)
    assert stubs.module.page_table(*call[:4], 32, *call[5:]) is NotImplemented  # another page size
    assert stubs.module.page_table(*call[:5], call[2][:call[1].shape[0]], *call[6:]) is NotImplemented  # a start
    assert stubs.module.page_table(*call[:6], 0 if call[6] else 5, *call[7:]) is call[3]  # offset: no key field
    strided = torch.stack([call[1], call[1]], 1)[:, 0]
    assert stubs.module.page_table(call[0], strided, *call[2:]) is call[3]  # unit strides or not: one plan
    assert stubs.module.launch_count() == 2


def test_each_launcher_has_its_own_plans(stubs):
    """A Triton approval does not take a call with CuPy's plan, nor the other way round; clearing one
    launcher's plans keeps the other's."""
    call = random_call(4, page_size=16, with_start=True, options="fill")
    register(stubs, "page_table", call)
    stubs.module.approve(PAGE_TABLE, 0, None, TRITON)
    assert stubs.module.page_table(*call) is NotImplemented
    stubs.module.approve(PAGE_TABLE, 0, None, CUPY)
    assert stubs.module.page_table(*call) is call[3]
    host_path.forget_plans("triton", "page_table")
    assert stubs.module.page_table(*call) is call[3]
    host_path.forget_plans("cupy")
    assert stubs.module.page_table(*call) is NotImplemented
    assert len(stubs.launches) == 2


def test_hands_back_calls_with_an_option_or_another_backend(stubs):
    call = random_csr_call(6, with_start=False)
    stubs.module.approve(TOKEN_CSR, 0, "cupy", CUPY)
    register(stubs, "token_csr", call)
    call[6] = "cupy"
    assert stubs.module.token_csr(*call) is call[4]
    for change in ((6, None), (6, "triton"), (6, "CuPy"), (7, 16), (8, torch.zeros(3, dtype=torch.int32)),
                   (4, call[4].long())):
        changed = list(call)
        changed[change[0]] = change[1]
        assert stubs.module.token_csr(*changed) is NotImplemented, change
    page = random_call(6)
    stubs.module.approve(PAGE_TABLE, 0, None, CUPY)
    register(stubs, "page_table", page)
    assert stubs.module.page_table(*page[:10], True) is NotImplemented  # rounding toward zero
    assert len(stubs.launches) == 1


def test_approvals_follow_the_cupy_hooks(stubs):
    call = random_call(9)
    register(stubs, "page_table", call)
    check_approvals_follow_the_hooks(stubs, cupy_native, call, "triton")


def test_launch_modes(stubs, monkeypatch):
    """``python`` registers nothing; ``native`` raises where the C path cannot take a plan and says why;
    ``auto`` then stays on the Python path; any other value is an error."""
    call = random_call(12)
    stubs.module.approve(PAGE_TABLE, 0, None, CUPY)
    monkeypatch.setenv(cupy_native.LAUNCH_ENV, " Python ")
    register(stubs, "page_table", call)
    assert stubs.module.page_table(*call) is NotImplemented
    cupy_native.reset()
    monkeypatch.setattr(cupy_native, "kernel_and_context", lambda index, call: (FUNCTION, None))
    monkeypatch.setenv(cupy_native.LAUNCH_ENV, "native")
    with pytest.raises(RuntimeError, match="KVDISPATCH_CUPY_LAUNCH=native.*no current context"):
        register(stubs, "page_table", call)
    cupy_native.reset()
    monkeypatch.setenv(cupy_native.LAUNCH_ENV, "auto")
    register(stubs, "page_table", call)
    assert stubs.module.page_table(*call) is NotImplemented
    cupy_native.reset()
    monkeypatch.setenv(cupy_native.LAUNCH_ENV, "c")
    with pytest.raises(ValueError, match="KVDISPATCH_CUPY_LAUNCH must be one of auto, native, python"):
        register(stubs, "page_table", call)
    assert stubs.launches == []


def test_unavailable_host_path(monkeypatch):
    """Where the extension cannot be loaded, ``auto`` leaves the call to Python and tries no later key (its
    Python path computes none); ``native`` raises with the reason."""
    monkeypatch.setattr(host_path, "_module", None)
    monkeypatch.setattr(host_path, "_failure", "RuntimeError: no C compiler found")
    monkeypatch.setattr(cupy_native, "_tried", set())
    monkeypatch.setattr(cupy_native, "_off", False)
    call = random_call(13)
    kernel_call, key = cupy_launch.page_table_call(*call[:9]), cupy_native.page_table_key(*call[:9])
    monkeypatch.setenv(cupy_native.LAUNCH_ENV, "auto")
    cupy_native.add_plan("page_table", key, kernel_call)
    other = random_call(14)
    cupy_native.add_page_table_plan(cupy_launch.page_table_call(*other[:9]), *other[:9])
    assert cupy_native._tried == {key}
    monkeypatch.setenv(cupy_native.LAUNCH_ENV, "native")
    cupy_native._tried.clear()
    with pytest.raises(RuntimeError, match="no C compiler found"):
        cupy_native.add_plan("page_table", key, kernel_call)


class RecordingRuntime:
    """Stands in for ``kernels_cupy.runtime`` (which needs CuPy and a GPU): records the calls launched."""

    def __init__(self):
        self.calls = []

    def launch(self, call, device):
        self.calls.append(call)


def test_the_python_launch_registers_and_the_next_call_is_taken(stubs, monkeypatch):
    """``build_page_table`` / ``build_token_indices`` (the Python path) launch, then register the plan; the
    C path then launches the same call as they did. Calls with an option register nothing."""
    runtime = RecordingRuntime()
    monkeypatch.setattr(cupy_launch, "_runtime_module", runtime)
    for name in ("page_table_key", "token_csr_key"):  # CPU tensors are device -1 to PyTorch, 0 in the C path
        key_of = getattr(cupy_native, name)
        monkeypatch.setattr(cupy_native, name, lambda *args, key_of=key_of: (0,) + key_of(*args)[1:])
    stubs.module.approve(PAGE_TABLE, 0, "cupy", CUPY)
    stubs.module.approve(TOKEN_CSR, 0, "cupy", CUPY)
    call = random_call(14, with_start=True, options="lens_out fill")
    call[9] = "cupy"
    cupy_launch.build_page_table(*call[:9], round_toward_zero=True)
    assert stubs.module.page_table(*call) is NotImplemented  # a rounding call registers no plan
    cupy_launch.build_page_table(*call[:9])
    stubs.count = len(runtime.calls[-1].args)
    assert stubs.module.page_table(*call) is call[3]
    assert_launched_as(stubs, runtime.calls[-1])
    csr = random_csr_call(14)
    csr[6] = "cupy"
    cupy_launch.build_token_indices(*csr[:4], csr[4].long(), csr[5])  # an int64 out: no plan
    cupy_launch.build_token_indices(*csr[:5], csr[5], 1, torch.zeros(2, dtype=torch.int64))  # a mapping: none
    assert stubs.module.token_csr(*csr) is NotImplemented
    cupy_launch.build_token_indices(*csr[:6])
    stubs.launches.clear()
    stubs.count = len(runtime.calls[-1].args)
    assert stubs.module.token_csr(*csr) is csr[4]
    assert_launched_as(stubs, runtime.calls[-1])


def test_public_api_goes_through_it_and_errors_do_not(stubs, monkeypatch):
    call = random_call(15, with_start=True, options="lens_out")
    table, pool, lens, out, page_size, start, offset, lens_out, fill, *_ = call
    stubs.module.approve(PAGE_TABLE, 0, "cupy", CUPY)
    register(stubs, "page_table", call)
    monkeypatch.setattr(dispatch, "fast_page_table", stubs.module.page_table)
    kwargs = dict(page_size=page_size, kv_start_idx=start, seqlen_offset=offset, seq_lens_out=lens_out,
                  fill_value=fill, backend="cupy")
    assert kvdispatch.create_flashmla_kv_indices(table, pool, lens, out, **kwargs) is out
    assert len(stubs.launches) == 1
    with pytest.raises(ValueError, match="page_size"):
        kvdispatch.create_flashmla_kv_indices(table, pool, lens, out, **{**kwargs, "page_size": 0})
    with pytest.raises(TypeError, match="req_to_token"):
        kvdispatch.create_flashmla_kv_indices(table.long(), pool, lens, out, **kwargs)
    assert len(stubs.launches) == 1


def test_plans_past_the_limit_are_forgotten(stubs, monkeypatch):
    """CuPy's plans are bounded as the Python plan caches are: past ``MAX_PLANS`` keys all are forgotten
    (here and in C), and registration starts again."""
    monkeypatch.setattr(cupy_native, "MAX_PLANS", 2)
    stubs.module.approve(PAGE_TABLE, 0, None, CUPY)
    calls = [random_call(seed, page_size=16 * (seed + 1), with_start=False, options="") for seed in range(3)]
    for call in calls:
        register(stubs, "page_table", call)
    assert [stubs.module.page_table(*call) is call[3] for call in calls] == [False, False, True]


def test_a_kernel_of_another_parameter_count_is_handed_back(stubs):
    """A CuPy kernel must take exactly the parameters C packs: a plan with any other count is handed back,
    never launched."""
    call = random_call(16, page_size=64, with_start=False, options="")
    stubs.module.approve(PAGE_TABLE, 0, None, CUPY)
    key = (0,) + cupy_native.page_table_key(*call[:9])[1:]
    kernel_call = cupy_launch.page_table_call(*call[:9])
    for count in (len(kernel_call.args) - 1, len(kernel_call.args) + 1):
        host_path.add_plan("cupy", "page_table", key, stubs.context, FUNCTION, kernel_call.grid, kernel_call.threads,
                           0, count)
        assert stubs.module.page_table(*call) is NotImplemented
    assert stubs.launches == []
