"""kvdispatch: KV-cache index tables for LLM decode, on the fastest backend the device has.

``import kvdispatch`` touches no device: the probe runs at first use, once per device. It declares every op
(``kvdispatch/ops/``, one module each), which registers its public builder as a PyTorch custom op,
``torch.ops.kvdispatch.<public name>``.
"""

from __future__ import annotations

from . import grid
from .ops import PUBLIC
from .dispatch import BackendUnavailableError, available_backends, reset, select_backend
from .devices import DeviceInfo, probe

__version__ = "0.1.0"

globals().update(PUBLIC)

__all__ = ["BackendUnavailableError", "DeviceInfo", "available_backends", "grid", "probe", "reset", "select_backend"]
__all__ += sorted(PUBLIC)
