"""CUDA/HIP-portable kernels and their CuPy RawModule launchers.

``kernel(key)`` is the launcher of op ``key`` (``KERNELS``): it takes the op's parameters as its torch
reference does (``kvdispatch/ops/<key>.py``; already validated, CUDA tensors on one device) and ``pdl``, and
writes the outputs in place with one kernel launch on PyTorch's current stream. ``on_selected`` and
``on_deselected`` are the selector's hooks (``kvdispatch.dispatch``): they tell the compiled host path
(``native.py``) which devices CuPy serves.

Importing this package (or its descriptor, ``backend.py``, which ``import kvdispatch`` does) imports
neither CuPy nor the kernel modules: the builders are imported from ``launch.py`` at their first access,
and CuPy at the first launch; ``KERNELS`` is read from the source of ``launch.py`` (its ``OP_LAUNCHERS``).
"""

import sys

from kvdispatch._lazy import exports, op_launchers

# Op key -> (the submodule defining its launcher, the launcher's name): each submodule's ``OP_LAUNCHERS``.
KERNELS = op_launchers(__name__)
# Public name -> the submodule defining it.
_OWNERS = {name: module for module, name in KERNELS.values()} | {"on_deselected": "native", "on_selected": "native"}


def kernel(key: str):
    """The launcher of op ``key`` (imported at the first access)."""
    return getattr(sys.modules[__name__], KERNELS[key][1])


__all__ = sorted(_OWNERS) + ["KERNELS", "kernel"]
__getattr__, __dir__ = exports(__name__, _OWNERS)
