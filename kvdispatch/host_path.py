"""The host path of the index builders in C (``host_path.c``), for calls whose launch plan exists, whichever
launcher made the plan: Triton's (``kernels_triton/native.py``) or CuPy's (``kernels_cupy/native.py``).

The Python path of one public call costs about 1.6x ``x.add_(1)`` of host time on an H200 host with Triton
(2.4-2.8x with CuPy): the checks, the selection lookup and the argument packing, then the backend's own
launch. ``host_path.c`` has one entry for every op, ``replay``, which replays the launch the Python path made
for a call of the same key, reading each tensor's metadata through PyTorch's C shim (``tensor_shim``);
validation stays in Python. A call of an op that the Python path validated and served with exactly one launch
(``call_and_register``: the backends describe what they launch while ``recording()``) leaves that launch as
the replay plan of the call's key: the op, the requested backend, the launcher (the selector's: ``on_selected``),
and each public argument's dtype, device, shape, strides and 16-byte alignment, None, or exact int or bool
value. Its parameters are kept as words, but for the pointer slots: the parameters that are an argument's
tensor (``register_replay``, which passes C a ``ReplayPlan``). A later call of the same key gets that launch
with its own pointers, once C has found each output apart from every other tensor argument (``REPLAYED``
names the outputs) and the plan's context current. For anything else it returns ``NotImplemented`` and the
Python path runs, so errors, fallbacks and first calls are unchanged: a tensor that is not strided, or whose
memory does not hold its view (``kvdispatch._validate``: a released or short storage, a pointer not aligned to
its element size; the shim's layout, storage size and offset tell), is never launched from C.

It is built at first use with the system's C compiler (``CC``, else ``cc``, ``gcc`` or ``clang``) and
Python's headers, once per source and Python version, into the build cache (``kvdispatch._build_cache``:
``$KVDISPATCH_CACHE_DIR``, default ``$XDG_CACHE_HOME/kvdispatch`` or ``~/.cache/kvdispatch``), which must be
private to the current user. A cache directory or library that another user could have written (or a
symbolic link) is refused and never loaded. Once built and configured, and before it is installed, it must
read a set of probe tensors (``probe_tensors``) on the CPU and on the GPU as PyTorch does (``self_check``): the
shim on a ``TensorImpl`` is no PyTorch contract. Where it is refused, cannot be built, loaded or configured, or
fails that check, ``failure()`` says why, launches stay on the Python path (a higher host time per call) and
``load`` warns once (a ``RuntimeWarning``), but for AMD while ``KVDISPATCH_HIP_HOST_PATH`` is off (one info
line: off by that setting). Each launcher has a variable that requires it (``KVDISPATCH_TRITON_LAUNCH=native``,
``KVDISPATCH_CUPY_LAUNCH=native``), which then raises with the reason.

The vendor of the device (``kvdispatch.probe``) picks the driver (``devices.DRIVER_LAUNCH_API``):
libcuda's ``cuLaunchKernel`` on NVIDIA; on AMD, only where ``KVDISPATCH_HIP_HOST_PATH`` is on, the HIP
runtime's ``hipModuleLaunchKernel`` (same parameters; ROCm's PyTorch devices are ``cuda`` devices, so the C
source is the same). It is off by default because it has not run on AMD hardware: AMD launches then stay on
the Python path, and the HIP runtime is never opened from here.

This module imports neither Triton nor CuPy.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch

from . import _build_cache, _env, devices, dispatch
from ._env import flag

SOURCE = Path(__file__).with_name("host_path.c")
MODULE_NAME = "kvdispatch_host_path"
DTYPE_CODES = {None: 0, torch.int32: 1, torch.int64: 2}
# The op codes replay() takes (``Op.code``: the public functions pass them): opaque to host_path.c, which only
# bounds them (OP_COUNT, shared_defines).
OPS = {key: op.code for key, op in dispatch.OPS.items()}
# Each op's output arguments, by position among the public call's arguments as ``replay()`` takes them (the
# API's order, ``backend`` and ``enable_pdl`` left out), the first being the one the call returns. Every output
# must share no byte with any other tensor argument (``kvdispatch._validate``: outputs apart from the inputs and
# from each other); C checks that per call.
REPLAYED = {key: op.output_positions for key, op in dispatch.OPS.items()}
# The launchers whose plans it takes, by the backend names that select them (LAUNCHER_COUNT of them).
LAUNCHERS = {"triton": 0, "cupy": 1}
HIP_HOST_PATH_ENV = _env.HIP_HOST_PATH

log = logging.getLogger("kvdispatch")
_lock = threading.Lock()
_module = None
_failure: str | None = None  # why the module is not available, once that is known
# (op, device index, requested backend) -> the launcher the selector resolved it to
_approved: dict[tuple[str, int, str | None], str] = {}


def compiler() -> str | None:
    """The C compiler to build with: ``CC``, else the first of cc, gcc, clang on the PATH."""
    configured = os.environ.get("CC")
    if configured:
        return configured
    return next((found for name in ("cc", "gcc", "clang") if (found := shutil.which(name))), None)


def shared_defines() -> tuple[str, ...]:
    """The ``-DNAME=value`` compiler options that give ``host_path.c`` the values it shares with the Python
    side (the source defines none of them itself): how many op codes and launcher codes there are."""
    values = {"OP_COUNT": len(OPS), "LAUNCHER_COUNT": len(LAUNCHERS)}
    return tuple(f"-D{name}={value}" for name, value in values.items())


def library_name() -> str:
    """The file name of the extension built from this source and ``shared_defines()`` for this Python."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    identity = b"\0".join([SOURCE.read_bytes(), *(d.encode() for d in shared_defines()), sys.version.encode(),
                            suffix.encode()])
    digest = hashlib.sha256(identity).hexdigest()[:16]
    return f"{MODULE_NAME}-{digest}{suffix}"


def build(directory: Path | None = None):
    """Compile (unless already cached) and import the extension from ``directory`` (default: the build
    cache); raises on any failure, ``_build_cache.UntrustedPathError`` where the directory or the file is
    not private to the current user."""
    cc = compiler()
    if cc is None:
        raise RuntimeError("no C compiler found (set CC, or install cc, gcc or clang)")

    def compile_to(partial: Path) -> None:
        command = [cc, "-O2", "-shared", "-fPIC", *shared_defines(), f"-I{sysconfig.get_paths()['include']}",
                   str(SOURCE), "-o", str(partial)]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed: {result.stderr.strip()[-600:]}")

    target = _build_cache.build(directory if directory is not None else _build_cache.root(), library_name(),
                                compile_to)
    spec = importlib.util.spec_from_file_location(MODULE_NAME, target)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def loaded_library(prefix: str) -> str | None:
    """The path of a library this process has already loaded whose file name starts with ``prefix``, or None."""
    try:
        with open("/proc/self/maps") as maps:
            fields = [line.split(None, 5) for line in maps]
    except OSError:  # not Linux
        return None
    loaded = sorted({f[5].strip() for f in fields if len(f) == 6 and f[5].startswith("/")})
    return next((p for p in loaded if os.path.basename(p).startswith(prefix)), None)


def open_driver(library: str, reuse_loaded: bool):
    """``ctypes.CDLL`` of the driver ``library`` (``devices.DRIVER_LAUNCH_API``). With ``reuse_loaded`` (AMD),
    the file of that name this process has already loaded (``libamdhip64.so.6...`` for ``libamdhip64.so``: the
    HIP runtime PyTorch uses, never a second one), else whatever the dynamic loader finds for the name; without
    it (NVIDIA), the name as given (``libcuda.so.1``)."""
    return ctypes.CDLL((loaded_library(library) if reuse_loaded else None) or library)


# PyTorch's C shim getters host_path.c reads tensors with, in configure()'s order.
SHIM_GETTERS = ("aoti_torch_get_dim", "aoti_torch_get_sizes", "aoti_torch_get_strides", "aoti_torch_get_data_ptr",
                "aoti_torch_get_dtype", "aoti_torch_get_device_type", "aoti_torch_get_device_index",
                "aoti_torch_get_layout", "aoti_torch_get_storage_size", "aoti_torch_get_storage_offset")


def tensor_shim(device_type: str) -> tuple[int, ...]:
    """configure()'s ``shim``: the addresses of ``SHIM_GETTERS`` in the ``libtorch_cpu`` this process has
    loaded (never a library loaded anew), then the shim's codes of int32, int64, ``device_type`` ("cuda",
    also ROCm's devices, or "cpu" for the tests) and the strided layout."""
    path = loaded_library("libtorch_cpu")
    if path is None:
        raise RuntimeError("libtorch_cpu is not loaded in this process")
    library = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    addresses = tuple(ctypes.cast(getattr(library, name), ctypes.c_void_p).value for name in SHIM_GETTERS)

    def code(name):
        function = getattr(library, name)
        function.restype, function.argtypes = ctypes.c_int32, []
        return function()

    return addresses + (code("aoti_torch_dtype_int32"), code("aoti_torch_dtype_int64"),
                        code(f"aoti_torch_device_type_{device_type}"), code("aoti_torch_layout_strided"))


class NotEnabledError(RuntimeError):
    """The compiled host path is off by a setting (``KVDISPATCH_HIP_HOST_PATH`` on AMD)."""


# The device index the extension reads for a tensor is its own plus this offset (configure()'s last argument):
# CPU tensors (device index -1) are device 0 where the CPU is the launch device type (the self-check, the tests).
INDEX_OFFSET = {"cuda": 0, "cpu": 1}


def _configure_for(module, vendor: str) -> None:
    """Point ``module`` at ``vendor``'s launch and context functions, at PyTorch's raw stream query (the
    current ``hipStream_t`` on ROCm builds, whose devices and tensors are PyTorch's ``cuda`` ones) and at its
    tensor getters (``tensor_shim``)."""
    api = devices.DRIVER_LAUNCH_API[vendor]
    driver = open_driver(api.library, reuse_loaded=vendor == "amd")
    module.configure(ctypes.cast(getattr(driver, api.launch), ctypes.c_void_p).value,
                     ctypes.cast(getattr(driver, api.current_context), ctypes.c_void_p).value,
                     torch._C._cuda_getCurrentRawStream, torch.Tensor, tensor_shim("cuda"), INDEX_OFFSET["cuda"])


def configure_for_cuda(module) -> None:
    """Point ``module`` at libcuda's ``cuLaunchKernel`` and ``cuCtxGetCurrent``."""
    _configure_for(module, "nvidia")


def configure_for_hip(module) -> None:
    """Point ``module`` at the HIP runtime's ``hipModuleLaunchKernel`` and ``hipCtxGetCurrent``, which take
    the parameters of their CUDA namesakes."""
    _configure_for(module, "amd")


def configuration_for(device_index: int | None):
    """How to configure the extension for the vendor of the GPU ``device_index`` (None: the current
    device), per the probe: ``configure_for_hip`` on AMD when ``KVDISPATCH_HIP_HOST_PATH`` is on,
    ``configure_for_cuda`` otherwise. Raises on AMD while the variable is off (the default: this path has not
    run on AMD hardware), before anything is built or loaded."""
    device = None if device_index is None else torch.device("cuda", device_index)
    hip_host_path = flag(HIP_HOST_PATH_ENV)  # read on every vendor: an invalid value raises everywhere
    if devices.probe(device).vendor != "amd":
        return configure_for_cuda
    if not hip_host_path:
        raise NotEnabledError(f"{HIP_HOST_PATH_ENV} is off: on AMD, launches take the Python path unless it is set")
    return configure_for_hip


def probe_tensors(device: torch.device) -> dict[str, tuple[torch.Tensor, bool]]:
    """The tensors ``self_check`` reads on ``device``, by name, each with whether the extension must read it
    (False: it must refuse it). Made with ``torch.empty`` and views only: no kernel runs (``load`` may be
    called while a CUDA graph is being captured)."""
    matrix = torch.empty(5, 7, dtype=torch.int32, device=device)
    vector = torch.empty(10, dtype=torch.int64, device=device)
    released = torch.empty(4, dtype=torch.int32, device=device)
    released.untyped_storage().resize_(0)
    return {
        "a contiguous int32 matrix": (matrix, True),
        "a strided int64 vector": (vector[1::3], True),
        "an int32 view at a storage offset": (matrix[2:, 3:], True),
        "a transposed int64 view": (vector.view(2, 5).t(), True),
        "a float32 matrix": (torch.empty(3, 2, device=device), True),
        "an empty int64 matrix": (torch.empty(0, 3, dtype=torch.int64, device=device), True),
        "a tensor whose storage is released": (released, False),
        "a sparse tensor": (torch.empty(2, 2, dtype=torch.int32, layout=torch.sparse_coo, device=device), False),
        "a tensor of another device type": (torch.empty(2, dtype=torch.int32, device="meta"), False),
    }


def python_reads(t: torch.Tensor) -> tuple:
    """What ``tensor_metadata(t)`` must give for a strided tensor ``t`` of the launch device type that it
    reads: the dtype code (``DTYPE_CODES``, 0 for others), device index (plus ``INDEX_OFFSET``), sizes,
    strides and data pointer, then the storage offset (elements) and the storage's bytes, both None where the
    extension does not check the storage (no element, another dtype)."""
    code = DTYPE_CODES.get(t.dtype, 0)
    checked = code != 0 and t.numel() > 0
    return (code, t.get_device() + INDEX_OFFSET[t.device.type], tuple(t.shape), t.stride(), t.data_ptr(),
            t.storage_offset() if checked else None, t.untyped_storage().nbytes() if checked else None)


def check_reads(module, device: torch.device) -> None:
    """Raise ``RuntimeError`` naming the first of ``probe_tensors(device)`` that ``module`` (configured for
    tensors of ``device.type``) reads otherwise than PyTorch does (``python_reads``), or reads where it
    must refuse it."""
    for name, (t, readable) in probe_tensors(device).items():
        read, expected = module.tensor_metadata(t), python_reads(t) if readable else None
        if read != expected:
            raise RuntimeError(f"its tensor reads disagree with PyTorch's for {name} on {device}: "
                               f"read {read}, PyTorch gives {expected}")


def self_check(module, configure, device_index: int | None) -> None:
    """``check_reads`` of ``module`` on the CPU (configured to read CPU tensors, nothing to launch), then on
    the GPU ``device_index`` (None: the current one) where PyTorch has one, after ``configure(module)``
    (``configuration_for``), which it leaves in place. Raises at the first disagreement."""
    module.configure(0, 0, None, torch.Tensor, tensor_shim("cpu"), INDEX_OFFSET["cpu"])
    check_reads(module, torch.device("cpu"))
    configure(module)
    if torch.cuda.is_available():
        check_reads(module, torch.device("cuda", torch.cuda.current_device() if device_index is None
                                         else device_index))


def load(device_index: int | None = None):
    """The configured extension, or None (the reason is in ``failure()``, and a ``RuntimeWarning`` says it
    once, but for a path off by a setting: ``NotEnabledError``); built once per process, for the vendor of
    ``device_index`` (``configuration_for``), installed once it passes ``self_check``."""
    global _module, _failure
    if _module is not None or _failure is not None:
        return _module
    with _lock:
        if _module is None and _failure is None:
            try:
                configure = configuration_for(device_index)
                module = build()
                self_check(module, configure, device_index)
                for (op, index, backend), launcher in _approved.items():
                    module.approve(OPS[op], index, backend, LAUNCHERS[launcher])
                dispatch.fast_replay = module.replay
                _module = module
            except _env.InvalidVariableError:  # the caller's error: raised, and the next call tries again
                raise
            except Exception as exc:  # any other failure: the Python path serves
                _failure = f"{type(exc).__name__}: {exc}"
                if isinstance(exc, NotEnabledError):
                    log.info("kvdispatch: the compiled host path is off (%s); calls take the Python path", _failure)
                else:
                    warnings.warn(f"kvdispatch: the compiled host path is not available ({_failure}); calls take "
                                  "the Python path: higher host time per call", RuntimeWarning, stacklevel=2)
    return _module


def failure() -> str | None:
    return _failure


def _after_fork() -> None:
    """In a child made by ``os.fork``: a new lock (another thread may have held this one at the fork)."""
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork)


def on_selected(launcher: str, device, op, backend) -> None:
    """The selector resolved ``(device, op, backend)`` to ``launcher`` (a name in ``LAUNCHERS``): the C path
    may take such calls with that launcher's plans (once they exist)."""
    if op in OPS and device.type == "cuda" and device.index is not None:
        _approved[(op, device.index, backend)] = launcher
        if _module is not None:
            _module.approve(OPS[op], device.index, backend, LAUNCHERS[launcher])


def on_deselected(launcher: str, device=None) -> None:
    """``launcher`` no longer serves ``device`` (None: any device): drop its approvals there. Its plans stay,
    as the Python launchers' do: without an approval the C path does not take a call, and a later selection
    makes them usable again."""
    for entry in [e for e, owner in _approved.items()
                  if owner == launcher and (device is None or e[1] == device.index)]:
        del _approved[entry]
        if _module is not None:
            _module.approve(OPS[entry[0]], entry[1], entry[2], -1)


def current_context() -> int | None:
    """The calling thread's current CUDA context (an int handle), or None."""
    return _module.context() if _module is not None else None


def forget_plans(launcher: str, op: str | None = None) -> None:
    """Drop ``launcher``'s plans of ``op`` (None: of every op) along with its Python plan cache's (which
    calls this when it forgets); a no-op before the extension is built."""
    if _module is not None:
        _module.clear_plans(LAUNCHERS[launcher], -1 if op is None else OPS[op])


# Replay plans: while the Python path serves a call that may register one, the backends append a
# ``describe()`` for each kernel they launch to the calling thread's list here (``recording()``); a call
# that launched exactly one kernel that can be described registers its launch (``call_and_register``).
_recording = threading.local()


class ReplayPlan(NamedTuple):
    """``add_replay``'s arguments, in the order ``host_path.c`` parses them (its ``REPLAY_PLAN_FIELDS``): the op
    code, the requested backend, the call's public arguments (``replay()``'s order), the launcher code, the
    kernel ``function`` loaded in ``context``, ``grid`` (x, y, z), ``threads`` per block, ``shared`` bytes,
    ``values`` (every parameter as a 64-bit word), ``slots`` (``(parameter, argument)`` for each parameter that
    is an argument's data pointer) and ``outputs`` (``REPLAYED``'s positions)."""

    op: int
    backend: str | None
    args: tuple
    launcher: int
    context: int
    function: int
    grid: tuple
    threads: int
    shared: int
    values: tuple
    slots: tuple
    outputs: tuple


@dataclass(frozen=True)
class Launch:
    """One kernel launch as ``cuLaunchKernel`` takes it: the kernel ``function`` loaded in ``context``, on
    ``grid`` (x, y, z) with ``threads`` per block and ``shared`` bytes of dynamic shared memory. ``params``:
    its parameters in order, each a tensor (its ``data_ptr()`` is passed) or an int (passed as a 64-bit word;
    a 32-bit parameter reads its low half)."""

    launcher: str
    context: int
    function: int
    grid: tuple
    threads: int
    shared: int
    params: tuple


def recording() -> list | None:
    """The list the backend appends a ``describe()`` (returning a ``Launch``, or None where the C path cannot
    launch that kernel) to for each launch, while a call may register a replay plan; None otherwise."""
    return getattr(_recording, "launches", None)


def call_and_register(op: str, backend, args: tuple, call) -> None:
    """``call()`` (the Python path's dispatch of one validated call of ``op``, whose public arguments are
    ``args``, as ``replay()`` takes them), then, if it launched exactly one kernel that can be described,
    that launch as the replay plan of its key. What registering finds wrong only means no plan."""
    launches = _recording.launches = []
    try:
        call()
    finally:
        _recording.launches = None
    if len(launches) == 1:
        launch = launches[0]()
        if launch is not None:
            register_replay(op, backend, args, launch)


def register_replay(op: str, backend, args: tuple, launch: Launch) -> bool:
    """Register ``launch`` (what the Python path launched for the call with public arguments ``args``) as the
    replay plan of the call's key; returns whether the C path took it. Each tensor among the parameters must
    be exactly one of the arguments (by identity): its parameter becomes that argument's pointer slot."""
    if _module is None:
        return False
    values, slots = [], []
    for index, value in enumerate(launch.params):
        if isinstance(value, torch.Tensor):
            owners = [i for i, arg in enumerate(args) if arg is value]
            if len(owners) != 1:  # derived from an argument, or passed twice: its pointer has no one source
                return False
            slots.append((index, owners[0]))
            value = value.data_ptr()
        elif type(value) is not int:
            return False
        values.append(value % 2**64)
    return _module.add_replay(*ReplayPlan(OPS[op], backend, tuple(args), LAUNCHERS[launch.launcher], launch.context,
                                          launch.function, tuple(launch.grid), launch.threads, launch.shared,
                                          tuple(values), tuple(slots), REPLAYED[op]))
