"""``kvdispatch info``: versions, relevant environment, every visible device and what serves it."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os

import torch

from . import devices, dispatch

ENV_VARS = ("KVDISPATCH_BACKEND", "KVDISPATCH_STRICT", "KVDISPATCH_DEBUG", "KVDISPATCH_PDL", "KVDISPATCH_TRITON_LAUNCH",
            "KVDISPATCH_CUPY_LAUNCH", "KVDISPATCH_HIP_HOST_PATH", "KVDISPATCH_CACHE_DIR", "TRITON_INTERPRET",
            "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def kvdispatch_version() -> str:
    """The installed distribution's version; from a checkout that is not installed, the package's own
    ``__version__`` (which the distribution's version is built from)."""
    from . import __version__

    return _version("kvdispatch") or __version__


def _cupy_version() -> str | None:
    for dist in ("cupy-cuda13x", "cupy-cuda12x", "cupy-rocm-7-0", "cupy"):
        version = _version(dist)
        if version:
            return f"{dist} {version}"
    return None


def _driver() -> str | None:
    if not torch.cuda.is_available():
        return None
    if torch.version.hip:
        return f"HIP {torch.version.hip}"
    try:
        import ctypes

        version = ctypes.c_int()
        ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version))
        return f"CUDA driver API {version.value // 1000}.{version.value % 1000 // 10}"
    except OSError:
        return None


def collect() -> dict:
    visible = [torch.device("cpu")]
    if torch.cuda.is_available():
        visible += [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    report = {
        "versions": {"kvdispatch": kvdispatch_version(), "torch": torch.__version__,
                     "torch_cuda": torch.version.cuda, "torch_hip": torch.version.hip,
                     "triton": _version("triton") or _version("pytorch-triton-rocm"),
                     "cupy": _cupy_version(), "driver": _driver()},
        "env": {name: os.environ.get(name) for name in ENV_VARS},
        "devices": [],
    }
    for device in visible:
        info = devices.probe(device)
        entry = dataclasses.asdict(info)
        entry["runtimes"] = {name: reason or "usable" for name, reason in info.runtimes}
        try:
            entry["chosen"] = dispatch.select_backend(device)
        except (ValueError, dispatch.BackendUnavailableError) as exc:
            entry["chosen"] = f"error: {exc}"
        usable, rejected = dispatch.selector.candidates(info, device)
        entry["available"] = usable
        entry["rejected"] = rejected
        report["devices"].append(entry)
    return report


def report(as_json: bool = False) -> int:
    data = collect()
    if as_json:
        print(json.dumps(data, indent=2))
        return 0
    print("versions:")
    for name, version in data["versions"].items():
        print(f"  {name:<12} {version or '-'}")
    print("environment:")
    width = max(map(len, data["env"]))
    for name, value in data["env"].items():
        print(f"  {name:<{width}} {value if value is not None else '(unset)'}")
    for entry in data["devices"]:
        print(f"device {entry['device']}: {entry['name']}")
        print(f"  vendor {entry['vendor']}, arch {entry['arch']}, family {entry['family']}, "
              f"multiprocessors {entry['multiprocessors']}, warp size {entry['warp_size']}")
        print(f"  chosen backend (every op): {entry['chosen']}")
        print("  programmatic dependent launch (enable_pdl, KVDISPATCH_PDL): "
              + ("available" if entry["supports_pdl"] else "unavailable (ignored on this device)"))
        for name, reason in entry["rejected"].items():
            print(f"  rejected {name}: {reason}")
    return 0
