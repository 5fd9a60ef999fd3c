"""Triton kernels (on the grid of ``kvdispatch.grid``) and their launchers.

``kernel(key)`` is the launcher of op ``key`` (``KERNELS``: the op's module and function here): it takes the
op's parameters as its torch reference does (``kvdispatch/ops/<key>.py``; already validated) and ``pdl``,
and launches one kernel on the tensors' device and current stream.
Importing this package initialises no GPU: compilation happens at the first call per device and
specialisation.
``on_selected`` and ``on_deselected`` are the selector's hooks (``kvdispatch.dispatch``): they tell the
compiled launcher (``native.py``) which devices Triton serves.

Importing this package (or its descriptor, ``backend.py``, which ``import kvdispatch`` does) imports
neither Triton nor the kernel modules: each name below is imported from the submodule owning it at its
first access, and ``KERNELS`` is read from the kernel modules' sources (each names the ops it launches in its
``OP_LAUNCHERS``; ``crosscompile`` compiles each such module's ``compile_specializations``).
"""

import sys

from kvdispatch._lazy import exports, op_launchers

# Op key -> (the submodule defining its launcher, the launcher's name): each submodule's ``OP_LAUNCHERS``.
KERNELS = op_launchers(__name__)
# Public name -> the submodule defining it.
_OWNERS = {name: module for module, name in KERNELS.values()} | {
    "cross_compile": "crosscompile",
    "on_deselected": "native",
    "on_selected": "native",
    "reset": "launch",
    "specializations": "crosscompile",
}


def kernel(key: str):
    """The launcher of op ``key`` (imported at the first access)."""
    return getattr(sys.modules[__name__], KERNELS[key][1])


__all__ = sorted(_OWNERS) + ["KERNELS", "kernel"]
__getattr__, __dir__ = exports(__name__, _OWNERS)
