"""Simulated devices for the probe and dispatch tests: any GPU, on any machine.

``Sim(monkeypatch)`` replaces ``kvdispatch.devices.read_device`` for the devices it is given (counting the
calls, optionally slowly, to expose races), says which of triton / cupy are installed, and what a present
CuPy was built for. Unregistered devices (CPU) go to the real ``read_device``. Everything is undone by
``monkeypatch`` at the end of the test; ``conftest`` resets the probe cache and selections around each test.

Fake backend modules (``fake_backend``) stand in for kernels_triton / kernels_cupy so the dispatch policy,
fallback and caching are tested without any kernel: they count calls, can fail on purpose, and otherwise
compute with the torch reference.
"""

from __future__ import annotations

import collections
import sys
import time
import types

import torch

from kernels_cupy import backend as cupy_backend
from kvdispatch import ops
from kvdispatch import devices, dispatch
from kvdispatch.devices import RawDevice

GPU = "cuda:0"
H200 = RawDevice(GPU, "nvidia", "sm_90", "NVIDIA H200", 132, 32)
B200 = RawDevice(GPU, "nvidia", "sm_100", "NVIDIA B200", 148, 32)
A100 = RawDevice(GPU, "nvidia", "sm_80", "NVIDIA A100-SXM4-80GB", 108, 32)
MI300X = RawDevice(GPU, "amd", "gfx942", "AMD Instinct MI300X", 304, 64)
MI355X = RawDevice(GPU, "amd", "gfx950", "AMD Instinct MI355X", 256, 64)
RX7900 = RawDevice(GPU, "amd", "gfx1100", "AMD Radeon RX 7900 XTX", 96, 32)
FUTURE_NVIDIA = RawDevice(GPU, "nvidia", "sm_110", "NVIDIA Future", 200, 32)
FUTURE_AMD = RawDevice(GPU, "amd", "gfx1250", "AMD Future", 256, None)

_real_module_present = devices._module_present


class Sim:
    def __init__(self, monkeypatch, *, triton=True, cupy=True, cupy_vendor=None, cuda_version="12.8"):
        self.mp = monkeypatch
        self.raws: dict[str, RawDevice] = {}
        self.calls = collections.Counter()
        self.delay = 0.0
        self._real_read = devices.read_device
        monkeypatch.setattr(devices, "read_device", self._read)
        monkeypatch.setattr(torch.version, "cuda", cuda_version)  # pins the CuPy install hint
        monkeypatch.delenv("KVDISPATCH_BACKEND", raising=False)
        monkeypatch.delenv("KVDISPATCH_STRICT", raising=False)
        self.modules(triton=triton, cupy=cupy, cupy_vendor=cupy_vendor)

    def add(self, raw: RawDevice, device: str | None = None) -> torch.device:
        """Make ``device`` (default ``raw.device``) read as ``raw``; returns the torch.device."""
        device = device or raw.device
        self.raws[str(torch.device(device))] = raw if raw.device == device else RawDevice(
            device, raw.vendor, raw.arch, raw.name, raw.multiprocessors, raw.warp_size)
        return torch.device(device)

    def _read(self, device):
        self.calls[str(device)] += 1
        if self.delay:
            time.sleep(self.delay)
        raw = self.raws.get(str(device))
        return raw if raw is not None else self._real_read(device)

    def modules(self, *, triton=True, cupy=True, cupy_vendor=None):
        """Which runtimes are installed; ``cupy_vendor``: what a present CuPy is built for
        ("nvidia", "amd", or "broken": its import fails). Default: the vendor of the first device added."""
        present = {"triton": triton, "cupy": cupy}
        self.mp.setattr(devices, "_module_present",
                        lambda name: present[name] if name in present else _real_module_present(name))
        self._cupy_vendor = cupy_vendor
        self.mp.setattr(cupy_backend, "reason_if_unsupported", self._cupy_reason)

    def _cupy_reason(self, raw, family):
        vendor = self._cupy_vendor or raw.vendor
        if vendor == "broken":
            fake = None  # `import cupy` raises ImportError
        else:
            fake = types.ModuleType("cupy")
            fake.cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(is_hip=vendor == "amd"))
        with self.mp.context() as mp:
            mp.setitem(sys.modules, "cupy", fake)
            return _real_cupy_reason(raw, family)


_real_cupy_reason = cupy_backend.reason_if_unsupported


class FakeBackend:
    """A backend module registered under ``name``: counts calls, raises ``fail`` if set, else the reference."""

    def __init__(self, monkeypatch, name, *, fail: Exception | None = None, module_name=None):
        self.name = name
        self.fail = fail
        self.calls = collections.Counter()
        module = types.ModuleType(module_name or f"kvtest_fake_{name}")
        own = {"page_table": self._page_table, "token_csr": self._token_csr}
        module.kernel = lambda key: own.get(key) or dispatch.OPS[key].reference
        monkeypatch.setitem(sys.modules, module.__name__, module)
        monkeypatch.setitem(dispatch.REGISTRY, name, dispatch.Backend(name, module.__name__))

    def _page_table(self, *args):
        self.calls["page_table"] += 1
        if self.fail is not None:
            raise self.fail
        return ops.page_table.reference(*args)

    def _token_csr(self, *args):
        self.calls["token_csr"] += 1
        if self.fail is not None:
            raise self.fail
        return ops.token_csr.reference(*args)
