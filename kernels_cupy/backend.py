"""The CuPy backend's descriptor: its name, its module (this package), its install hint, and which devices
it serves. It imports neither CuPy nor the kernel modules (it is imported at ``import kvdispatch``); CuPy
is imported only when a GPU is probed and CuPy is installed, to learn whether it is built for CUDA or ROCm."""

from __future__ import annotations

import torch

from kvdispatch import devices

NAME = "cupy"
MODULE = "kernels_cupy"


# The CuPy build of each extra (pyproject.toml; a test checks them equal).
PACKAGES = {"cuda12": "cupy-cuda12x", "cuda13": "cupy-cuda13x", "rocm": "cupy-rocm-7-0"}


def install_hint(vendor: str) -> str:
    """How to install the CuPy build matching ``vendor`` and PyTorch's CUDA version."""
    if vendor == "amd":
        extra = "rocm"
    else:
        extra = "cuda13" if (torch.version.cuda or "12").split(".")[0] == "13" else "cuda12"
    return devices.install_command(PACKAGES[extra], extra)


def reason_if_unsupported(raw: devices.RawDevice, family: str) -> str | None:
    """None when the CuPy kernels can serve ``raw``, else why not (``family`` plays no part)."""
    if raw.vendor not in ("nvidia", "amd"):
        return f"CuPy serves CUDA and ROCm GPUs only, not {raw.vendor}"
    if not devices._module_present("cupy"):
        return f"CuPy is not installed ({install_hint(raw.vendor)})"
    try:
        import cupy  # noqa: PLC0415  (imported only when a GPU is probed)

        built_for = "amd" if cupy.cuda.runtime.is_hip else "nvidia"
    except Exception as exc:  # a broken CuPy install must not break the probe
        return f"CuPy failed to import: {exc}"
    if built_for != raw.vendor:
        return (f"CuPy is built for {built_for.upper()} GPUs, this is an {raw.vendor.upper()} GPU "
                f"({install_hint(raw.vendor)})")
    return None
