"""CuPy side: one RawModule per (device, kernel, specialisation), compiled once and cached, launched on
PyTorch's current stream.

Imported on the first GPU call only (``import kernels_cupy`` does not import CuPy). A launch reads
PyTorch's raw stream handle, allocates nothing and never synchronises, so it can be captured in a CUDA
graph once the device's module is compiled (the first call compiles; warm up before capturing).
"""

from __future__ import annotations

import ctypes
import os
import threading

import cupy
import torch

from kvdispatch import devices

from . import build
from .build import KernelCall

_kernels: dict[tuple, object] = {}  # (device index, kernel name, defines) -> cupy.cuda.function.Function
_lock = threading.Lock()
compiles = 0  # modules built in this process (tests check that shapes never trigger a rebuild)


class _RawStream:
    """What CuPy's ``Function.__call__`` reads from a stream: its ``ptr``."""

    __slots__ = ("ptr",)

    def __init__(self, ptr: int):
        self.ptr = ptr


def _after_fork() -> None:
    """In a child made by ``os.fork``: a new lock (another thread may have held this one at the fork) and no
    compiled kernels (CUDA state does not cross a fork)."""
    global _lock
    _lock = threading.Lock()
    _kernels.clear()


os.register_at_fork(after_in_child=_after_fork)


def kernel(index: int, name: str, defines: tuple):
    """Kernel ``name`` compiled for device ``index`` and the specialisation ``defines``; the first call
    per (device, kernel, specialisation) compiles it, later ones find it here."""
    key = (index, name, defines)
    function = _kernels.get(key)
    if function is None:
        with _lock:
            function = _kernels.get(key)
            if function is None:
                function = _kernels[key] = _compile(index, name, defines)
    return function


def _compile(index: int, name: str, defines: tuple):
    global compiles
    vendor = devices.probe(torch.device("cuda", index)).vendor
    with cupy.cuda.Device(index):
        module = cupy.RawModule(code=build.source(), options=build.rtc_options(vendor) + build.define_flags(defines))
        # RawKernel.kernel compiles and loads for the current device and returns the low-level Function,
        # whose call skips RawKernel's per-call device lookup.
        function = module.get_function(name).kernel
    compiles += 1
    return function


def launch(call: KernelCall, device: torch.device) -> None:
    """Launch ``call`` on ``device`` (a CUDA device with an index), on PyTorch's current stream there."""
    index = device.index
    function = kernel(index, call.kernel, call.defines)
    stream = _RawStream(torch._C._cuda_getCurrentRawStream(index))
    if cupy.cuda.runtime.getDevice() == index:
        function(call.grid, (call.threads,), call.args, 0, stream)
    else:  # CuPy launches in its current device's context
        with cupy.cuda.Device(index):
            function(call.grid, (call.threads,), call.args, 0, stream)


# Programmatic dependent launch (PDL): CuPy's kernel call takes no launch attributes, so a PDL call goes to the
# driver's ``cuLaunchKernelEx`` itself, with the attribute CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION.
_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CUlaunchAttributeID, cuda.h


class _LaunchAttribute(ctypes.Structure):
    """``CUlaunchAttribute``: the id, padding to 8 bytes, then the 64-byte value union."""

    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int * 16)]


class _LaunchConfig(ctypes.Structure):
    """``CUlaunchConfig``."""

    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared_bytes", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_LaunchAttribute)),
                ("attr_count", ctypes.c_uint)]


_driver_launch_ex = None


def _launch_ex():
    """``cuLaunchKernelEx`` of the CUDA driver (CUDA 12.0 and later), looked up at the first PDL launch."""
    global _driver_launch_ex
    if _driver_launch_ex is None:
        function = ctypes.CDLL(devices.DRIVER_LAUNCH_API["nvidia"].library).cuLaunchKernelEx
        function.argtypes = (ctypes.POINTER(_LaunchConfig), ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                             ctypes.c_void_p)
        function.restype = ctypes.c_int
        _driver_launch_ex = function
    return _driver_launch_ex


def launch_pdl(call: KernelCall, device: torch.device) -> None:
    """Launch ``call`` (compiled with ``KV_PDL``: ``launch.with_pdl``) on ``device``'s current PyTorch stream
    with programmatic stream serialisation allowed: it may start while the previous kernel on the stream
    finishes, and waits for it in the kernel (``griddepcontrol.wait``). NVIDIA only (compute capability 9.0
    and later: the probe's ``supports_pdl``). Allocates no device memory and never synchronises: capturable
    in a CUDA graph, whose kernel node keeps the attribute. Raises ``RuntimeError`` with the driver's error
    code when the launch fails."""
    index = device.index
    function = kernel(index, call.kernel, call.defines)
    values = (ctypes.c_int64 * len(call.args))(*call.args)  # every kernel parameter is 8 bytes
    base = ctypes.addressof(values)
    parameters = (ctypes.c_void_p * len(call.args))(*(base + 8 * i for i in range(len(call.args))))
    attribute = _LaunchAttribute(id=_PROGRAMMATIC_STREAM_SERIALIZATION)
    attribute.value[0] = 1  # programmaticStreamSerializationAllowed
    config = _LaunchConfig((ctypes.c_uint * 3)(*call.grid), (ctypes.c_uint * 3)(call.threads, 1, 1), 0,
                           torch._C._cuda_getCurrentRawStream(index), ctypes.pointer(attribute), 1)
    with cupy.cuda.Device(index):  # the function belongs to the device's context, current under it
        status = _launch_ex()(ctypes.byref(config), function.ptr, parameters, None)
    if status:
        raise RuntimeError(f"cuLaunchKernelEx failed with CUresult {status} launching {call.kernel} "
                           f"(grid {call.grid}, {call.threads} threads) with programmatic dependent launch")
