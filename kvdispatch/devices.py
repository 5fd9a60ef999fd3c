"""Device probe: what a device is and which runtimes can serve it. The one home of vendor facts.

``probe(device)`` runs lazily, once per device, under a lock; ``import kvdispatch`` touches no device.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import threading
from dataclasses import dataclass, field

import torch


# Families by exact architecture name: a ROCm build reports capability numbers that mean other chips,
# so nothing here compares numbers.
NVIDIA_FAMILIES = {
    "sm_70": "volta", "sm_75": "turing",
    "sm_80": "ampere", "sm_86": "ampere", "sm_87": "ampere",
    "sm_89": "ada",
    "sm_90": "hopper",
    "sm_100": "blackwell", "sm_103": "blackwell",
    "sm_120": "blackwell-geforce", "sm_121": "blackwell-geforce",
}
AMD_FAMILIES = {
    "gfx908": "cdna1", "gfx90a": "cdna2", "gfx942": "cdna3", "gfx950": "cdna4",
    "gfx1100": "rdna3", "gfx1101": "rdna3", "gfx1102": "rdna3", "gfx1103": "rdna3",
    "gfx1200": "rdna4", "gfx1201": "rdna4",
}
WARP_SIZE = {"nvidia": 32, "amd": 64}  # when PyTorch does not report it; RDNA GPUs run wave32 (below)
# Programmatic dependent launch (``griddepcontrol`` and the launch attribute that lets a kernel start while
# the previous one finishes): NVIDIA compute capability 9.0 (Hopper) and later. AMD GPUs have no equivalent.
PDL_MIN_NVIDIA_CAPABILITY = 90


@dataclass(frozen=True)
class DriverLaunchAPI:
    """The driver functions a vendor's kernels are launched through, as the compiled host path
    (``kvdispatch/host_path.c``) calls them: ``launch`` takes ``cuLaunchKernel``'s parameters (function,
    grid x/y/z, block x/y/z, shared bytes, stream, kernel parameters, extra) and ``current_context``
    ``cuCtxGetCurrent``'s (a pointer to the context handle), each returning 0 on success."""

    library: str  # the shared library, as dlopen names it (a file of that name already loaded is preferred)
    launch: str
    current_context: str


DRIVER_LAUNCH_API = {
    "nvidia": DriverLaunchAPI("libcuda.so.1", "cuLaunchKernel", "cuCtxGetCurrent"),
    "amd": DriverLaunchAPI("libamdhip64.so", "hipModuleLaunchKernel", "hipCtxGetCurrent"),
}


@dataclass(frozen=True)
class DeviceInfo:
    """What ``probe`` found for one device.

    runtimes: ``(name, reason)`` per registered backend (``register_backends``: ``dispatch.DESCRIPTORS``, in
    auto order); ``reason`` is None when it can serve the device, else why it cannot. A reason names a package
    to install (``install_command``) when a missing package is why, and only then; otherwise it says what else
    to change.
    supports_pdl: whether kernels can be launched with programmatic dependent launch (``pdl_capable``).
    """

    device: str
    vendor: str
    arch: str
    family: str
    name: str
    multiprocessors: int
    warp_size: int
    runtimes: tuple[tuple[str, str | None], ...] = field(default=())
    supports_pdl: bool = False

    def reason(self, runtime: str) -> str | None:
        """Why ``runtime`` cannot serve this device, or None when it can."""
        return dict(self.runtimes).get(runtime, f"unknown runtime {runtime!r}")

    def usable(self, runtime: str) -> bool:
        return self.reason(runtime) is None


@dataclass(frozen=True)
class RawDevice:
    """The facts read off a device, before any policy; tests build these to simulate devices."""

    device: str
    vendor: str
    arch: str
    name: str
    multiprocessors: int
    warp_size: int | None = None


def family_of(vendor: str, arch: str) -> str:
    table = NVIDIA_FAMILIES if vendor == "nvidia" else AMD_FAMILIES if vendor == "amd" else {}
    if vendor == "cpu":
        return "cpu"
    return table.get(arch, "unknown")


def read_device(device: torch.device) -> RawDevice:
    """Read vendor, architecture and sizes of ``device`` from PyTorch (creates a context for GPUs)."""
    if device.type == "cpu":
        return RawDevice("cpu", "cpu", "cpu", platform.processor() or platform.machine(), os.cpu_count() or 1, 1)
    if device.type != "cuda":
        return RawDevice(str(device), device.type, device.type, device.type, 0, None)
    props = _on_a_gpu(device, torch.cuda.get_device_properties, device)
    if torch.version.hip:
        # "gfx942:sramecc+:xnack-" -> "gfx942"; major/minor mean nothing comparable on ROCm.
        vendor, arch = "amd", (getattr(props, "gcnArchName", "") or "").split(":")[0] or "unknown"
    else:
        vendor, arch = "nvidia", f"sm_{props.major}{props.minor}"
    return RawDevice(str(device), vendor, arch, props.name, props.multi_processor_count,
                     getattr(props, "warp_size", None))


def pdl_capable(vendor: str, arch: str) -> bool:
    """Whether a device of ``vendor`` and ``arch`` supports programmatic dependent launch: NVIDIA ``sm_XY``
    with ``XY >= PDL_MIN_NVIDIA_CAPABILITY``; never AMD, CPU or anything else."""
    digits = arch[3:] if vendor == "nvidia" and arch.startswith("sm_") else ""
    return digits.isdigit() and int(digits) >= PDL_MIN_NVIDIA_CAPABILITY


def install_command(package: str, extra: str) -> str:
    """How to install ``package``, the requirement of kvdispatch's extra ``extra`` (``pyproject.toml``): the
    package itself, or the extra from a checkout of kvdispatch (no package index serves kvdispatch)."""
    return f'pip install {package}, or from a kvdispatch checkout: pip install -e ".[{extra}]"'


def _module_present(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


# The backends' descriptors (modules with ``NAME`` and ``reason_if_unsupported``), in auto order: the registry
# passes them in at its import (``register_backends``).
_descriptors: tuple = ()


def register_backends(descriptors) -> None:
    """Make ``descriptors`` (``dispatch.DESCRIPTORS``) the backends ``describe`` asks about each device."""
    global _descriptors
    _descriptors = tuple(descriptors)


def describe(raw: RawDevice) -> DeviceInfo:
    """Apply vendor facts to raw device facts, and ask each registered backend's descriptor whether it can
    serve the device (pure: no device access beyond the CuPy import)."""
    family = family_of(raw.vendor, raw.arch)
    warp = raw.warp_size or (32 if family.startswith("rdna") else WARP_SIZE.get(raw.vendor, 1))
    runtimes = tuple((backend.NAME, backend.reason_if_unsupported(raw, family)) for backend in _descriptors)
    return DeviceInfo(raw.device, raw.vendor, raw.arch, family, raw.name, raw.multiprocessors, warp, runtimes,
                      pdl_capable(raw.vendor, raw.arch))


_cache: dict[torch.device, DeviceInfo] = {}
_lock = threading.Lock()


def normalize_device(device=None) -> torch.device:
    """``None`` → the current CUDA device if there is one, else CPU; ``"cuda"`` → ``cuda:<current>``."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", _on_a_gpu(device, torch.cuda.current_device))
    return device


def no_gpu_reason() -> str:
    """Why PyTorch has no GPU here (``torch.cuda.is_available()`` is False)."""
    if not (torch.version.cuda or torch.version.hip):
        return f"this PyTorch ({torch.__version__}) is built without CUDA or ROCm"
    return "PyTorch sees no GPU (driver, CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES)"


def _on_a_gpu(device: torch.device, read, *args):
    """``read(*args)``, a PyTorch CUDA function, for ``device``; where it fails because PyTorch has no GPU (an
    ``AssertionError`` or ``RuntimeError`` then), a ``ValueError`` saying so."""
    try:
        return read(*args)
    except (AssertionError, RuntimeError) as exc:
        if torch.cuda.is_available():
            raise
        raise ValueError(f"device {device}: no GPU here: {no_gpu_reason()}") from exc


def probe(device=None) -> DeviceInfo:
    """Describe ``device`` (a ``torch.device``, string or None for the default device); cached per device."""
    device = normalize_device(device)
    info = _cache.get(device)
    if info is None:
        with _lock:
            info = _cache.get(device)
            if info is None:
                info = _cache[device] = describe(read_device(device))
    return info


def clear_cache() -> None:
    """Forget every probed device (tests; or after changing TRITON_INTERPRET)."""
    with _lock:
        _cache.clear()


def _after_fork() -> None:
    """In a child made by ``os.fork``: a new lock (another thread may have held this one at the fork) and no
    device probed (CUDA state does not cross a fork)."""
    global _lock
    _lock = threading.Lock()
    _cache.clear()


os.register_at_fork(after_in_child=_after_fork)
