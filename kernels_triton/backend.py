"""The Triton backend's descriptor: its name, its module (this package), its install hint, and which devices
it serves, decided without importing Triton or the kernel modules (this module is imported at
``import kvdispatch``; the ``dispatch.DESCRIPTORS`` line names it)."""

from __future__ import annotations

from kvdispatch import devices
from kvdispatch._env import triton_flag

NAME = "triton"
MODULE = "kernels_triton"

# Families whose GPUs Triton compiles for (and kvdispatch cross-compiles its kernels for in CI).
TRITON_FAMILIES = frozenset({"ampere", "ada", "hopper", "blackwell", "blackwell-geforce",
                             "cdna2", "cdna3", "cdna4", "rdna3", "rdna4"})


# The package of the ``triton`` extra (pyproject.toml; a test checks them equal).
PACKAGES = {"triton": "triton"}


def install_hint(vendor: str) -> str:
    """How to install Triton for kvdispatch."""
    return devices.install_command(PACKAGES["triton"], "triton")


def reason_if_unsupported(raw: devices.RawDevice, family: str) -> str | None:
    """None when the Triton kernels can serve ``raw`` (of ``family``), else why not."""
    if not devices._module_present("triton"):
        return f"Triton is not installed ({install_hint(raw.vendor)})"
    if raw.vendor == "cpu":
        if triton_flag("TRITON_INTERPRET"):  # as Triton reads it: then it interprets the kernels
            return None
        return "CPU tensors run Triton kernels only in its interpreter: set TRITON_INTERPRET=1 before the first call"
    if raw.vendor not in ("nvidia", "amd"):
        return f"Triton has no backend for {raw.vendor} devices"
    if family not in TRITON_FAMILIES:
        return f"architecture {raw.arch} ({family}) is not one kvdispatch builds Triton kernels for"
    return None
