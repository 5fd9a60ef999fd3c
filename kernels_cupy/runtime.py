"""CuPy side: one RawModule per (device, kernel, specialisation), compiled once and cached, launched on
PyTorch's current stream.

Imported on the first GPU call only (``import kernels_cupy`` does not import CuPy). A launch reads
PyTorch's raw stream handle, allocates nothing and never synchronises, so it can be captured in a CUDA
graph once the device's module is compiled (the first call compiles; warm up before capturing).
"""

from __future__ import annotations

import threading

import cupy
import torch

from kvdispatch import devices

from . import build
from .launch import KernelCall

_kernels: dict[tuple, object] = {}  # (device index, kernel name, defines) -> cupy.cuda.function.Function
_lock = threading.Lock()
compiles = 0  # modules built in this process (tests check that shapes never trigger a rebuild)


class _RawStream:
    """What CuPy's ``Function.__call__`` reads from a stream: its ``ptr``."""

    __slots__ = ("ptr",)

    def __init__(self, ptr: int):
        self.ptr = ptr


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
