"""Backend registry and selection policy.

Auto order: Triton, then CuPy, then torch, each where the probe says it can serve the device.
``KVDISPATCH_BACKEND`` (read at first selection per device; ``reset()`` forgets) forces one; ``backend=``
per call wins over it. A forced backend that cannot serve raises with the probe's reason, which names a
package to install only where a missing one is why. Every ``KVDISPATCH_*`` variable is read at each first
selection (``_env.check_variables``), so an invalid one raises there, on every platform.

Failures, in auto mode. A backend is taken out of auto selection for a device (with one warning, the next one
serving that call and the later ones; ``KVDISPATCH_STRICT=1`` raises instead) only when it cannot run there
at all: its module does not import, or its first call on the device fails (its kernels do not compile or do
not run there). Every other failure is the call's own error, raised to the caller with the backend staying
selected: any failing call once the backend has served a call on the device (a launch these arguments make
fail, ...), and, first calls included, the errors that are the caller's by their kind: bad arguments (caught
before any backend runs), a call beyond the GPU grid limits (``grid.GridLimitError``) and an invalid variable
(``_env.InvalidVariableError``, a ``ValueError``). A forced backend's failures always raise. The hot path is one
dict lookup per call, plus one attribute test while a selected backend has not served yet.

A child process made by ``os.fork`` starts with fresh locks and forgets every selection and probe (another
thread of the parent may have held a lock at the fork, and CUDA state does not cross it).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import sys
import threading
import warnings
from dataclasses import dataclass

import torch

from . import _debug, _env, devices
from ._env import InvalidVariableError, flag
from .grid import GridLimitError

# The registry and the auto order: one descriptor module per backend, in its own package (NAME, MODULE,
# install_hint, reason_if_unsupported; docs/architecture.md, "Adding a backend"). Importing one imports
# neither its kernels nor the runtime they need.
DESCRIPTORS = tuple(importlib.import_module(name) for name in (
    "kernels_triton.backend",
    "kernels_cupy.backend",
    "kvdispatch.reference_backend",
))
devices.register_backends(DESCRIPTORS)
BACKENDS = tuple(backend.NAME for backend in DESCRIPTORS)
# CPU tensors: the reference first; the Triton interpreter (TRITON_INTERPRET=1) only when asked for.
CPU_ORDER = ("torch",) + tuple(name for name in BACKENDS if name != "torch")
CHOICES = ("auto",) + BACKENDS
# The declared ops (``kvdispatch.op.declare`` adds each, in the order ``kvdispatch.ops`` imports them): key -> Op.
# Each backend serves op ``key`` with ``kernel(key)`` of its module.
OPS: dict = {}

log = logging.getLogger("kvdispatch")

# The compiled host path's entry (``kvdispatch/host_path.py`` sets it once built): ``replay(op code, backend,
# *the op's parameters)`` launches what the Python path launched for a call of the same key and returns its
# first output, or returns NotImplemented and the Python path (validation, selection, the backend's launcher)
# serves.
fast_replay = None

# ``KVDISPATCH_PDL``: what ``enable_pdl=None`` means. Read at import and by ``reset()``, not per call (an
# environment lookup costs more host time than a whole call's checks).
pdl_default = flag(_env.PDL)

# Bumped by ``reset()``. Code traced by ``torch.compile`` reads it (``kvdispatch.ops``), so Dynamo guards
# on it and traces again after a reset instead of reusing a graph built for the old selection.
generation = 0


class BackendUnavailableError(RuntimeError):
    """A backend that was asked for by name cannot serve the device."""


@dataclass(frozen=True)
class Backend:
    """A registered backend: where its implementation lives and when it can serve a device.

    The module's ``kernel(key)`` is its kernel of op ``key``, which takes the op's parameters (``Op.parameters``)
    and ``pdl``. ``import kvdispatch`` imports the package (its descriptor lives there) but not its kernel
    modules; ``load`` imports them, at the first selection.
    """

    name: str
    module: str

    def reasons_if_unsupported(self, info: devices.DeviceInfo) -> list[str]:
        reason = info.reason(self.name)
        return [] if reason is None else [reason]

    def load(self):
        """The module, with the modules of its kernels imported (an import failure raises; a kernel it lacks is
        ``resolve``'s to report); from then on ``notify`` reaches its hooks."""
        module = importlib.import_module(self.module)
        for key in OPS:
            with contextlib.suppress(AttributeError):
                module.kernel(key)
        _loaded_modules.add(self.module)
        return module

    def notify(self, hook: str, *args) -> None:
        """Call the module's ``on_selected`` / ``on_deselected`` hook, if ``load`` has loaded it and it has
        one (a backend never loaded has nothing to forget, and its kernels stay unimported)."""
        if self.module in _loaded_modules:
            function = getattr(sys.modules.get(self.module), hook, None)
            if function is not None:
                function(*args)


# Modules ``Backend.load`` has loaded: they stay imported, so a reset keeps this set.
_loaded_modules: set[str] = set()


REGISTRY = {backend.NAME: Backend(backend.NAME, backend.MODULE) for backend in DESCRIPTORS}


def requested_backend(backend: str | None = None) -> str:
    """The backend asked for: ``backend`` if given, else ``KVDISPATCH_BACKEND``, else ``"auto"``. Both are
    read alike: surrounding spaces and case do not matter, and empty means ``"auto"``."""
    if backend is None:
        return _env.choice(_env.BACKEND, CHOICES)
    return _env.normalized(backend, CHOICES, "backend")


def strict() -> bool:
    """``KVDISPATCH_STRICT``, read where a backend fails (and checked at each first selection)."""
    return flag(_env.STRICT)


def _described(device, info: devices.DeviceInfo) -> str:
    """``device`` for a message, with its name, architecture and family: ``cuda:0 NVIDIA H200 (sm_90, hopper)``;
    a CPU is only ``cpu`` (its architecture and family would read ``(cpu, cpu)``)."""
    return str(device) if info.vendor == "cpu" else f"{device} {info.name} ({info.arch}, {info.family})"


class _Selector:
    """Chooses and caches the implementation per (device, op, requested backend)."""

    def __init__(self):
        self._lock = threading.RLock()
        self._chosen: dict[tuple, object] = {}
        self._disabled: dict[torch.device, dict[str, str]] = {}
        self._announced: set[torch.device] = set()
        self._served: set[tuple] = set()  # (device, backend) pairs that have served a call
        self.untried: set[tuple] = set()  # (device, backend) pairs selected that have not served yet

    def reset(self):
        with self._lock:
            self._forget()
            for backend in REGISTRY.values():
                backend.notify("on_deselected", None)

    def _forget(self):
        self._chosen.clear()
        self._disabled.clear()
        self._announced.clear()
        self._served.clear()
        self.untried.clear()

    def after_fork(self):
        """In a child made by ``os.fork``: a new lock (another thread may have held this one at the fork) and
        nothing selected. The backends' hooks are not called: each module forgets its own state in the child."""
        self._lock = threading.RLock()
        self._forget()

    def disabled(self, device) -> dict[str, str]:
        return dict(self._disabled.get(device, {}))

    def has_served(self, device, name) -> bool:
        """Whether backend ``name`` has served a call on ``device`` (since the last ``reset``)."""
        return (device, name) in self._served

    def served(self, device, name) -> None:
        """Record that ``name`` served a call on ``device``: from now on its failures are the calls' own."""
        with self._lock:
            self._served.add((device, name))
            self.untried.discard((device, name))

    def candidates(self, info, device) -> tuple[list[str], dict[str, str]]:
        """Auto order of usable backends, and the rejected ones with their reasons."""
        usable, rejected = [], {}
        off = self._disabled.get(device, {})
        for name in CPU_ORDER if info.vendor == "cpu" else BACKENDS:
            reasons = REGISTRY[name].reasons_if_unsupported(info)
            if name in off:
                reasons.append(f"disabled after a failure: {off[name]}")
            if reasons:
                rejected[name] = "; ".join(reasons)
            else:
                usable.append(name)
        return usable, rejected

    def choose(self, device, requested) -> str:
        info = devices.probe(device)
        with self._lock:  # one warning and one log line per device, whichever thread selects first
            usable, rejected = self.candidates(info, device)
            if requested != "auto":
                if requested not in usable:  # the probe's reasons name a package to install where one is missing
                    raise BackendUnavailableError(
                        f"backend {requested!r} cannot serve {_described(device, info)}: {rejected[requested]}")
                chosen = requested
            else:
                chosen = usable[0]  # torch always serves
            if device not in self._announced:
                self._announced.add(device)
                if info.family == "unknown":
                    warnings.warn(f"kvdispatch: unknown {info.vendor} architecture {info.arch} on {device}; "
                                  f"using the portable {chosen!r} backend", RuntimeWarning, stacklevel=4)
                log.info("kvdispatch: %s: chose %s (%s); rejected: %s", _described(device, info), chosen,
                         "forced" if requested != "auto" else "auto",
                         "; ".join(f"{k}: {v}" for k, v in rejected.items()) or "none")
        return chosen

    def resolve(self, device, op, backend):
        """``(backend name, function)`` serving ``op`` on ``device``; cached after the first call.

        A backend whose module fails to import is handled like one that fails at launch: in auto mode
        it is disabled for the device and the next one serves; asked for by name, it raises.
        """
        key = (device, op, backend)
        impl = self._chosen.get(key)
        if impl is not None:
            return impl
        with self._lock:
            impl = self._chosen.get(key)
            _env.check_variables(CHOICES)  # a bad value is reported at the first call, not at the first failure
            while impl is None:
                requested = requested_backend(backend)
                name = self.choose(device, requested)
                try:
                    function = REGISTRY[name].load().kernel(op)
                except Exception as exc:
                    if name == "torch" or isinstance(exc, InvalidVariableError) or strict():
                        raise
                    if requested != "auto":
                        raise BackendUnavailableError(
                            f"backend {name!r} cannot serve {device}: it failed to load "
                            f"({type(exc).__name__}: {exc})") from exc
                    self.fail(device, name, exc)
                    continue
                impl = self._chosen[key] = (name, function)
                if (device, name) not in self._served:
                    self.untried.add((device, name))
                REGISTRY[name].notify("on_selected", device, op, backend)
        return impl

    def fail(self, device, name, exc):
        """Take ``name`` out of auto selection for ``device``, after it raised ``exc`` there.

        Idempotent: threads that raced into the same failing backend give one warning between them.
        """
        with self._lock:
            off = self._disabled.setdefault(device, {})
            first = name not in off
            if first:
                off[name] = f"{type(exc).__name__}: {exc}"
            for key in [k for k, v in self._chosen.items() if k[0] == device and v[0] == name]:
                del self._chosen[key]
            REGISTRY[name].notify("on_deselected", device)
        if first:
            warnings.warn(f"kvdispatch: backend {name!r} failed on {device} ({type(exc).__name__}: {exc}); "
                          "disabled for this device, the next backend serves", RuntimeWarning,
                          stacklevel=_caller_level())


# The directories of kvdispatch and of its backends' packages: a warning names the first frame outside them.
_OWN_DIRECTORIES = tuple({os.path.dirname(module.__file__) + os.sep
                          for module in (sys.modules[__name__], *DESCRIPTORS)})


def _caller_level() -> int:
    """The ``stacklevel`` at which ``warnings.warn``, called by the caller of this function, names the first
    frame outside kvdispatch and its backends (the user's call, however many frames the API passed through)."""
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_OWN_DIRECTORIES):
        frame, level = frame.f_back, level + 1
    return level


selector = _Selector()
os.register_at_fork(after_in_child=selector.after_fork)


def call(device, op, backend, *args):
    """Run ``op`` on the selected backend; in auto mode fall back past a backend whose first call on
    ``device`` fails, unless the error is the caller's (the module docstring)."""
    name, function = selector.resolve(device, op, backend)
    try:
        result = function(*args)
    except (GridLimitError, InvalidVariableError):  # beyond a GPU grid's limits, an invalid variable: the caller's
        raise
    except Exception as exc:
        if (name == "torch" or selector.has_served(device, name) or requested_backend(backend) != "auto"
                or strict()):
            raise
        selector.fail(device, name, exc)
        return call(device, op, backend, *args)
    if selector.untried and (device, name) in selector.untried:  # empty once each selected one has served
        selector.served(device, name)
    return result


def reset() -> None:
    """Forget every selection, disabled backend and probed device, and re-read ``KVDISPATCH_DEBUG`` and
    ``KVDISPATCH_PDL`` (tests; after changing environment variables). Functions compiled with
    ``torch.compile`` trace again at their next call."""
    global generation, pdl_default
    generation += 1
    pdl_default = flag(_env.PDL)
    selector.reset()
    devices.clear_cache()
    _debug.refresh()


def select_backend(device=None) -> str:
    """The backend auto selection (after ``KVDISPATCH_BACKEND``) picks for ``device``."""
    device = devices.normalize_device(device)
    return selector.choose(device, requested_backend())


def available_backends(device=None) -> list[str]:
    """Backends that can serve ``device``, in auto order."""
    device = devices.normalize_device(device)
    return selector.candidates(devices.probe(device), device)[0]
