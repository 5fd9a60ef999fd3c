"""The ops, one module each (``kvdispatch/ops/<key>.py``): importing this package declares every op
(``kvdispatch.op.declare``), which registers its custom op ``torch.ops.kvdispatch.<public name>`` and its
dispatch entry, touching no device.

``PUBLIC``: every public name the op modules export (their ``__all__``), which ``kvdispatch`` re-exports.
``kernel(key)``: the torch backend's kernel of op ``key``, the op's reference (the semantic source of truth
every other backend is tested against).
"""

from __future__ import annotations

import importlib
import pkgutil

from .. import dispatch

PUBLIC = {}
for _module_info in pkgutil.iter_modules(__path__):
    _module = importlib.import_module(f"{__name__}.{_module_info.name}")
    PUBLIC.update((name, getattr(_module, name)) for name in _module.__all__)


def kernel(key: str):
    """The torch backend's kernel of op ``key``: its reference, which takes the op's parameters and ``pdl``
    (ignored: PyTorch launches its own kernels)."""
    return dispatch.OPS[key].reference
