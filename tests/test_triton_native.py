"""The compiled host path (``kvdispatch/host_path.c``) with Triton's plans, on CPU: its tensor reads, what
Triton's launchers give it (``launch.native_parameter_count``, ``KernelLauncher.replay_launch``, the selector's
hooks, the plan caches' clears), loading it (the build cache, the self-check, the driver per vendor).

The extension is built here and pointed at stubs (``host_path_stubs``): a ``cuLaunchKernel`` that records
what it is given, a ``cuCtxGetCurrent`` and a stream query, with CPU tensors as the launch device type
(``tensor_shim("cpu")``, device index offset 1, so CPU is device 0). The replay entry's own cases, for every
op on both launchers: ``test_host_path_replay.py``. On a GPU, ``test_triton_launch.py`` runs the real thing.
"""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch

pytest.importorskip("triton")

from kvdispatch import ops
import kvdispatch  # noqa: E402
from conftest import DEVICE  # noqa: E402
from kernels_triton import launch, native, page_table, token_csr  # noqa: E402
from host_path_stubs import (CONTEXT, FUNCTION, PAGE_TABLE, STREAM_BASE, Stubs, build,  # noqa: E402
                             check_approvals_follow_the_hooks, install, random_call, random_csr_call, unsigned)
from kvdispatch import _build_cache, _debug, dispatch, host_path  # noqa: E402

PARAMS = len(page_table.POINTERS) + len(page_table.RUNTIME_INTS) + 2  # + Triton's two scratch pointers
TOKEN_CSR = host_path.OPS["token_csr"]
TRITON = host_path.LAUNCHERS["triton"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return build(tmp_path_factory)


@pytest.fixture
def stubs(built, monkeypatch):
    """The extension configured with stubs, installed as ``host_path``'s module (approvals start empty)."""
    return install(built, monkeypatch, PARAMS)


def register(call, op="page_table", threads=128, shared=16):
    """Register ``call``'s (public arguments, replay order) launch as the replay plan Triton's page-table or
    token-CSR launcher would describe (CPU is device 0 here): its runtime arguments, the two scratch pointers;
    returns its parameters as the launch receives them."""
    module = page_table if op == "page_table" else token_csr
    _, args = module.plan_key_and_arguments(*call)
    params = tuple(a for a in args if a is not None) + (0, 0)  # None arguments compile as constants
    launch_ = host_path.Launch(native.LAUNCHER, CONTEXT, FUNCTION, (call[1].shape[0], 7, 3), threads, shared, params)
    assert host_path.register_replay(op, None, call, launch_)
    return unsigned(params)


@pytest.mark.parametrize("seed", range(20))
def test_reads_tensor_metadata_as_python_does(stubs, seed):
    """The C reads (PyTorch's C shim on the TensorImpl) give the dtype, device, sizes, strides and data pointer
    Python gives, and for an int32 or int64 tensor with elements the storage offset and bytes, for views at
    offsets, transposes, broadcasts, empty tensors and a 2**40 stride; a tensor of more than two dimensions, a
    subclass or another device type is refused."""
    generator = torch.Generator().manual_seed(seed)
    rows, cols = (int(v) for v in torch.randint(0, 9, (2,), generator=generator))
    dtype = (torch.int32, torch.int64, torch.float32)[seed % 3]
    base = torch.zeros(rows + 3, cols + 5, dtype=dtype)
    views = [base, base[1:, 2:], base.t(), base[:, 1], base[2:3], torch.zeros(0, dtype=dtype),
             base.as_strided((1, 2), (2**40, 1)), base[:1].expand(4, -1), base[::2, ::3]]
    for view in views:
        read = stubs.module.tensor_metadata(view)
        code = {torch.int32: 1, torch.int64: 2}.get(view.dtype, 0)
        storage = (view.storage_offset(), view.untyped_storage().nbytes()) if code and view.numel() else (None, None)
        assert read == (code, 0, tuple(view.shape), view.stride(), view.data_ptr(), *storage), view.shape
    for refused in (torch.zeros(2, 2, 2, dtype=torch.int32), torch.nn.Parameter(torch.zeros(3), requires_grad=False),
                    torch.zeros(3, device="meta"), 3, None):
        assert stubs.module.tensor_metadata(refused) is None


def test_approvals_follow_the_selector_hooks(stubs):
    call = random_call(9)
    register(call)
    check_approvals_follow_the_hooks(stubs, native, call, "cupy")


def test_plan_cache_clear_drops_the_c_plans(stubs):
    call = random_call(10)
    stubs.module.approve(PAGE_TABLE, 0, None, TRITON)
    register(call)
    launch.reset()  # what a change of KVDISPATCH_TRITON_LAUNCH needs
    assert stubs.module.replay(PAGE_TABLE, None, *call) is NotImplemented


def test_one_op_plan_cache_clear_keeps_the_other_ops_plans(stubs):
    calls = [random_call(seed) for seed in range(13, 20)]
    csr = random_csr_call(13)
    stubs.module.approve(PAGE_TABLE, 0, None, TRITON)
    stubs.module.approve(TOKEN_CSR, 0, None, TRITON)
    for call in calls:
        register(call)
    stubs.count = len(register(csr, "token_csr"))
    page_table._plans.clear()  # the page table's Python cache forgets (as past MAX_PLANS keys)
    assert all(stubs.module.replay(PAGE_TABLE, None, *call) is NotImplemented for call in calls)
    assert stubs.module.replay(TOKEN_CSR, None, *csr) is csr[4]
    token_csr._plans.clear()
    assert stubs.module.replay(TOKEN_CSR, None, *csr) is NotImplemented


def test_public_api_goes_through_it_and_errors_do_not(stubs, monkeypatch):
    # The calls C hands back run on these CPU tensors in Python: the reference serves them on any machine.
    monkeypatch.setenv("KVDISPATCH_BACKEND", "torch")
    call = random_call(11, with_start=True, options="fill")
    table, pool, lens, out, page_size, start, offset, lens_out, fill, _ = call
    stubs.module.approve(PAGE_TABLE, 0, None, TRITON)
    stubs.count = len(register(call))
    monkeypatch.setattr(dispatch, "fast_replay", stubs.module.replay)
    kwargs = dict(page_size=page_size, kv_start_idx=start, seqlen_offset=offset, seq_lens_out=lens_out,
                  fill_value=fill)
    before = out.clone()
    assert kvdispatch.create_flashmla_kv_indices(table, pool, lens, out, **kwargs) is out
    assert len(stubs.launches) == 1 and torch.equal(out, before)  # the (stub) C launch served it
    with pytest.raises(ValueError, match="page_size"):
        kvdispatch.create_flashmla_kv_indices(table, pool, lens, out, **{**kwargs, "page_size": 0})
    with pytest.raises(TypeError, match="req_to_token"):
        kvdispatch.create_flashmla_kv_indices(table.long(), pool, lens, out, **kwargs)
    assert len(stubs.launches) == 1
    expected = out.clone()
    ops.page_table.reference(table, pool, lens, expected, page_size, start, offset, None, fill,
                               round_toward_zero=True)
    assert kvdispatch.create_flashmla_kv_indices(table, pool, lens, out, **kwargs, round_toward_zero=True) is out
    assert len(stubs.launches) == 1 and torch.equal(out, expected)  # another key (no plan): the Python path
    monkeypatch.setattr(_debug, "ENABLED", True)  # the data checks run, in Python, whatever C could take
    pool[0] = table.shape[0]
    with pytest.raises(ValueError, match="req_pool_indices"):
        kvdispatch.create_flashmla_kv_indices(table, pool, lens, out, **kwargs)
    assert len(stubs.launches) == 1


def test_selector_notifies_the_backend(monkeypatch):
    events = []
    import kernels_triton

    monkeypatch.setattr(kernels_triton, "on_selected", lambda *a: events.append(("selected",) + a))
    monkeypatch.setattr(kernels_triton, "on_deselected", lambda *a: events.append(("deselected",) + a))
    device = DEVICE  # Triton serves CPU tensors here only through its interpreter, which GPU runs leave off
    name, _ = dispatch.selector.resolve(device, "page_table", "triton")
    assert name == "triton" and events == [("selected", device, "page_table", "triton")]
    with pytest.warns(RuntimeWarning, match="disabled"):
        dispatch.selector.fail(device, "triton", RuntimeError("test"))
    assert events[-1] == ("deselected", device)
    kvdispatch.reset()
    assert events[-1] == ("deselected", None)


def _described(compiled):
    """``compiled`` (a stand-in) with the ``src.signature`` of the page-table kernel's runtime arguments."""
    signature = {name: "*i32" if name in page_table.POINTERS else "i64" for name in page_table.PARAMETERS}
    signature.update({name: "constexpr" for name in page_table.CONSTEXPRS})
    compiled.src = type("Source", (), {"signature": signature})()
    return compiled


def _describe(launcher, specialisation, device_index=0):
    """``launcher.replay_launch`` of a page-table call on the plan of ``specialisation``."""
    _, args = page_table.plan_key_and_arguments(*random_call(17)[:9])
    return launcher.replay_launch(device_index, specialisation, (1, 7, 3), args)


def test_native_mode_requires_it(monkeypatch):
    monkeypatch.setenv(launch.LAUNCH_ENV, "native")
    launcher = launch.KernelLauncher(page_table.page_table_kernel, page_table.CONSTEXPRS)
    launcher.compiled[(0, "spec")] = _described(type("Compiled", (), {})())  # nothing host_path.c could launch
    with pytest.raises(RuntimeError, match="native"):
        _describe(launcher, "spec")
    monkeypatch.setenv(launch.LAUNCH_ENV, "direct")
    assert _describe(launcher, "spec") is None
    monkeypatch.setenv(launch.LAUNCH_ENV, "auto")
    assert _describe(launcher, "spec") is None
    assert _describe(launcher, "spec", -1) is None  # CPU (the interpreter): never


def test_parameter_count_needs_the_plain_case():
    """``native_parameter_count`` on stand-ins for compiled kernels (cross-compiled ones: test_triton_crosscompile)."""
    class Target:
        backend, warp_size = "cuda", 32

    class Metadata:
        target, num_ctas, global_scratch_size, profile_scratch_size = Target(), 1, 0, 0

    entry = ".visible .entry k(\n" + ",\n".join(f"\t.param .u64 k_param_{i}" for i in range(19)) + "\n)\n{"

    def compiled(**changes):
        metadata = Metadata()
        for name, value in changes.items():
            setattr(metadata, name, value)
        return type("Compiled", (), {"metadata": metadata, "asm": {"ptx": entry}})()

    assert launch.native_parameter_count(compiled(), 17) == 19
    assert launch.native_parameter_count(compiled(), 16) is None
    for change in ({"global_scratch_size": 8}, {"profile_scratch_size": 8}, {"num_ctas": 2},
                   {"launch_pdl": True}, {"launch_cooperative_grid": True}):
        assert launch.native_parameter_count(compiled(**change), 17) is None, change
    hip = type("Target", (), {"backend": "hip", "warp_size": 64})()
    assert launch.native_parameter_count(compiled(target=hip), 17) is None
    # A 32-bit int reads the low half of the 64-bit word the C path passes (little-endian); narrower ones are
    # not taken.
    for width, taken in ((".u32", True), (".b32", True), (".u16", False), (".u8", False), (".f32", False)):
        narrow_ptx = entry.replace(".u64 k_param_3", f"{width} k_param_3")
        narrow = type("Compiled", (), {"metadata": Metadata(), "asm": {"ptx": narrow_ptx}})()
        assert launch.native_parameter_count(narrow, 17) == (19 if taken else None), width


def test_builds_once_into_the_cache(tmp_path, monkeypatch):
    if host_path.compiler() is None:
        pytest.skip("no C compiler")
    first = host_path.build(tmp_path)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) == 1 and files[0].startswith(host_path.MODULE_NAME)
    stamp = (tmp_path / files[0]).stat().st_mtime_ns
    host_path.build(tmp_path)
    assert (tmp_path / files[0]).stat().st_mtime_ns == stamp
    assert hasattr(first, "replay")
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    with pytest.raises(Exception):
        host_path.build(tmp_path / "elsewhere")


def test_load_failure_leaves_launches_in_python(tmp_path, monkeypatch):
    """Where the extension cannot be built (here: no such compiler) or CUDA is missing, ``load`` returns None
    once, says why, and a required native mode raises with that reason; auto mode goes on in Python."""
    monkeypatch.setattr(host_path, "_module", None)
    monkeypatch.setattr(host_path, "_failure", None)
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv(_build_cache.CACHE_ENV, str(tmp_path / "cache"))
    with pytest.warns(RuntimeWarning, match="calls take the Python path: higher host time per call") as caught:
        assert host_path.load() is None
        assert host_path.failure()
        assert host_path.load() is None  # no second attempt, no second warning
    assert len(caught) == 1 and host_path.failure() in str(caught[0].message)
    launcher = launch.KernelLauncher(page_table.page_table_kernel, page_table.CONSTEXPRS)
    launcher.compiled[(0, "spec")] = _described(type("Compiled", (), {})())
    monkeypatch.setattr(launch, "native_parameter_count", lambda compiled, runtime_args: runtime_args + 2)
    monkeypatch.setenv(launch.LAUNCH_ENV, "auto")
    assert _describe(launcher, "spec") is None
    monkeypatch.setenv(launch.LAUNCH_ENV, "native")
    launcher.native_kernels.clear()
    with pytest.raises(RuntimeError, match="compiled launcher cannot launch.*no-such-compiler"):
        _describe(launcher, "spec")


# AMD: the same C path, configured with the HIP runtime's functions (KVDISPATCH_HIP_HOST_PATH).

def amdgpu_assembly(sizes, kinds=None, wavefront=64, workgroup=128, kernels=1, offsets=None):
    """AMD assembly whose AMDGPU metadata describes ``kernels`` kernels with arguments of ``sizes`` bytes
    at ``offsets`` (default 8 * i; ``kinds``: their ``.value_kind``, default global_buffer), as the compiler
    writes it."""
    kinds = kinds or ["global_buffer"] * len(sizes)
    offsets = offsets or [8 * i for i in range(len(sizes))]
    arguments = "".join(f"      - .offset:         {offset}\n        .size:           {size}\n"
                        f"        .value_kind:     {kind}\n" for offset, size, kind in zip(offsets, sizes, kinds))
    kernel = (f"  - .agpr_count:     0\n    .args:\n{arguments}    .group_segment_fixed_size: 0\n"
              f"    .kernarg_segment_align: 8\n    .kernarg_segment_size: {8 * len(sizes)}\n"
              f"    .max_flat_workgroup_size: {workgroup}\n    .name:           k\n    .symbol:         k.kd\n"
              f"    .wavefront_size: {wavefront}\n")
    return (f"\t.amdhsa_code_object_version 5\n\t.amdgpu_metadata\n---\namdhsa.kernels:\n{kernel * kernels}"
            "amdhsa.target:   amdgcn-amd-amdhsa--gfx942\namdhsa.version:\n  - 1\n  - 2\n"
            "...\n\n\t.end_amdgpu_metadata\n")


def hip_compiled(runtime_args, num_warps=2, **assembly):
    """A stand-in for a compiled gfx942 kernel: ``runtime_args`` arguments then the two scratch pointers."""
    target = type("Target", (), {"backend": "hip", "arch": "gfx942", "warp_size": 64})()
    metadata = type("Metadata", (), {"target": target, "num_warps": num_warps, "num_ctas": 1, "shared": 0,
                                     "global_scratch_size": 0, "profile_scratch_size": 0,
                                     "launch_cooperative_grid": False})()
    assembly.setdefault("sizes", [8] * (runtime_args + 2))
    assembly.setdefault("workgroup", 64 * num_warps)
    return type("Compiled", (), {"metadata": metadata, "function": FUNCTION,
                                 "asm": {"amdgcn": amdgpu_assembly(**assembly)}})()


def test_parameter_count_reads_the_amdgpu_kernel_arguments():
    """An AMD kernel qualifies when its metadata lists exactly the runtime arguments then the two scratch
    pointers, 8 bytes each at offsets 8 * i, then only hidden arguments (the runtime fills those), for
    wavefronts of the target's width and num_warps of them."""
    assert launch.native_parameter_count(hip_compiled(17), 17) == 19
    assert launch.threads_per_program(hip_compiled(17)) == 128
    assert launch.native_parameter_count(hip_compiled(17), 16) is None
    hidden = ["hidden_block_count_x", "hidden_block_count_y", "hidden_group_size_x"]
    with_hidden = dict(sizes=[8] * 19 + [4, 4, 2], kinds=["global_buffer"] * 19 + hidden)
    assert launch.native_parameter_count(hip_compiled(17, **with_hidden), 17) == 19
    refused = {
        "a 4-byte argument": dict(sizes=[8] * 5 + [4] + [8] * 13),
        "an argument at another offset": dict(offsets=[8 * i for i in range(18)] + [152]),
        "a hidden argument among them": dict(kinds=["global_buffer"] * 18 + ["hidden_block_count_x"]),
        "an explicit argument after a hidden one": dict(sizes=[8] * 20,
                                                        kinds=["global_buffer"] * 18 + [hidden[0], "by_value"]),
        "wave32": dict(wavefront=32),
        "another workgroup size": dict(workgroup=256),
        "two kernels": dict(kernels=2),
    }
    for name, change in refused.items():
        assert launch.native_parameter_count(hip_compiled(17, **change), 17) is None, name
    no_metadata = hip_compiled(17)
    no_metadata.asm = {"amdgcn": "\t.amdhsa_code_object_version 5\n"}
    assert launch.native_parameter_count(no_metadata, 17) is None


@pytest.fixture
def hip_loading(built, monkeypatch):
    """``host_path.load`` with the extension already built, a simulated device and a stand-in for each driver
    library (its launch and context functions: the Stubs'); returns ``(sim, stubs, opened)``, ``opened``
    listing the libraries asked for."""
    from simdevices import Sim

    stubs, opened = Stubs(PARAMS), []

    def open_driver(library, reuse_loaded):
        opened.append((library, reuse_loaded))
        api = next(a for a in kvdispatch.devices.DRIVER_LAUNCH_API.values() if a.library == library)
        return type("Driver", (), {api.launch: stubs.launch, api.current_context: stubs.current_context})

    monkeypatch.setattr(host_path, "open_driver", open_driver)
    monkeypatch.setattr(host_path, "build", lambda: built)
    monkeypatch.setattr(host_path, "_module", None)
    monkeypatch.setattr(host_path, "_failure", None)
    monkeypatch.setattr(host_path, "_approved", {})
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: STREAM_BASE + index, raising=False)
    monkeypatch.setattr(dispatch, "fast_replay", None)
    monkeypatch.delenv(host_path.HIP_HOST_PATH_ENV, raising=False)
    return Sim(monkeypatch), stubs, opened


def test_amd_stays_in_python_unless_the_hip_host_path_is_on(hip_loading, monkeypatch):
    from simdevices import MI300X

    sim, stubs, opened = hip_loading
    sim.add(MI300X)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # off by the setting: no warning
        assert host_path.load(0) is None
    assert host_path.HIP_HOST_PATH_ENV in host_path.failure()
    assert opened == [] and dispatch.fast_replay is None
    for value in ("0", "off"):
        monkeypatch.setattr(host_path, "_failure", None)
        monkeypatch.setenv(host_path.HIP_HOST_PATH_ENV, value)
        assert host_path.load(0) is None and opened == []
        assert host_path.HIP_HOST_PATH_ENV in host_path.failure()
    monkeypatch.setattr(host_path, "_failure", None)
    monkeypatch.setenv(host_path.HIP_HOST_PATH_ENV, "maybe")  # not a boolean: the caller's error, not remembered
    with pytest.raises(ValueError, match=f"{host_path.HIP_HOST_PATH_ENV} must be one of"):
        host_path.load(0)
    assert host_path.failure() is None and opened == []


@pytest.mark.parametrize("raw, library", [("MI300X", "libamdhip64.so"), ("H200", "libcuda.so.1")])
def test_the_probe_vendor_picks_the_driver(hip_loading, monkeypatch, raw, library):
    """With the variable on, an AMD device gets the HIP runtime's functions; an NVIDIA one libcuda's, as
    without it."""
    import simdevices

    sim, stubs, opened = hip_loading
    sim.add(getattr(simdevices, raw))
    monkeypatch.setenv(host_path.HIP_HOST_PATH_ENV, "1")
    module = host_path.load(0)
    assert module is not None, host_path.failure()
    assert opened == [(library, raw == "MI300X")]  # only the HIP runtime is looked up among the loaded files
    assert host_path.current_context() == CONTEXT  # the context query is the driver's (here the stub)
    assert dispatch.fast_replay == module.replay


def test_the_self_check_passes_on_this_pytorch(stubs):
    """Every probe tensor on the CPU is read as PyTorch reads it, or refused where it must be (a released
    storage, a sparse tensor, another device type)."""
    host_path.check_reads(stubs.module, torch.device("cpu"))
    probes = host_path.probe_tensors(torch.device("cpu"))
    assert sorted(name for name, (t, readable) in probes.items() if not readable) == [
        "a sparse tensor", "a tensor of another device type", "a tensor whose storage is released"]


def _shifted_pointer(original):
    return lambda t: original(t)[:4] + (original(t)[4] + 4,) + original(t)[5:]


@pytest.mark.parametrize("misread", ["python reads another pointer", "C reads a refused tensor"])
def test_a_misread_keeps_the_path_off_and_warns_once(hip_loading, built, monkeypatch, misread):
    """Where the extension's reads of a probe tensor differ from PyTorch's, ``load`` installs nothing, says
    which probe, and warns once."""
    from simdevices import H200

    sim, stubs, opened = hip_loading
    sim.add(H200)
    if misread == "python reads another pointer":
        monkeypatch.setattr(host_path, "python_reads", _shifted_pointer(host_path.python_reads))
    else:
        reads = built.tensor_metadata
        monkeypatch.setattr(built, "tensor_metadata", lambda t: reads(t) or (0, 0, (), (), 0, None, None))
    with pytest.warns(RuntimeWarning, match="calls take the Python path: higher host time per call") as caught:
        assert host_path.load(0) is None
        assert host_path.load(0) is None
    assert len(caught) == 1 and "its tensor reads disagree with PyTorch's for a " in host_path.failure()
    assert host_path.failure() in str(caught[0].message)
    assert dispatch.fast_replay is None


def test_a_missing_shim_symbol_keeps_the_path_off_and_warns(hip_loading, monkeypatch):
    from simdevices import H200

    sim, stubs, opened = hip_loading
    sim.add(H200)
    monkeypatch.setattr(host_path, "SHIM_GETTERS", host_path.SHIM_GETTERS[:-1] + ("aoti_torch_get_no_such_getter",))
    with pytest.warns(RuntimeWarning, match="aoti_torch_get_no_such_getter.*higher host time per call"):
        assert host_path.load(0) is None
    assert dispatch.fast_replay is None


def test_cpu_calls_never_attempt_it(monkeypatch):
    """CPU tensors never take the compiled host path: nothing is built and nothing warns."""
    monkeypatch.setattr(host_path, "_module", None)
    monkeypatch.setattr(host_path, "_failure", None)
    monkeypatch.setattr(host_path, "build", lambda *a: pytest.fail("built for a CPU call"))
    monkeypatch.setenv(launch.LAUNCH_ENV, "auto")
    table, pool, lens, out = random_call(5, page_size=16, with_start=False, options="")[:4]
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        kvdispatch.create_flashmla_kv_indices(table, pool, lens, out, page_size=16, backend="triton")
    assert host_path.failure() is None


def test_amd_plan_launches_with_its_wavefronts(stubs, monkeypatch):
    """A page-table launch of a (stand-in) gfx942 kernel, described as the Triton launcher describes it and
    registered: the C path launches it with the kernel's threads (num_warps wavefronts of 64), the grid, and the
    parameters the Python path passes, scratch pointers null. A wave32 kernel of a wave64 target is never
    described."""
    monkeypatch.setattr(torch.cuda, "device", lambda index: contextlib.nullcontext())  # CPU: no device to set
    monkeypatch.setenv(launch.LAUNCH_ENV, "auto")
    call = random_call(21)
    _, args = page_table.plan_key_and_arguments(*call[:9])
    grid = (call[1].shape[0], 7, 3)
    launcher = launch.KernelLauncher(page_table.page_table_kernel, page_table.CONSTEXPRS)
    warps = 2
    launcher.compiled[(0, "amd")] = _described(hip_compiled(len(page_table.PARAMETERS), num_warps=warps))
    launcher.compiled[(0, "amd wave32")] = _described(hip_compiled(len(page_table.PARAMETERS), num_warps=warps,
                                                                   wavefront=32))
    assert launcher.replay_launch(0, "amd wave32", grid, args) is None
    described = launcher.replay_launch(0, "amd", grid, args)
    assert described.threads == 64 * warps and described.function == FUNCTION and described.context == CONTEXT
    stubs.module.approve(PAGE_TABLE, 0, None, TRITON)
    assert host_path.register_replay("page_table", None, call, described)
    stubs.count = PARAMS
    assert stubs.module.replay(PAGE_TABLE, None, *call) is call[3]
    (launched,) = stubs.launches
    assert launched["block"] == (64 * warps, 1, 1) and launched["grid"] == grid
    assert launched["params"] == unsigned(args) + [0, 0] and launched["function"] == FUNCTION
