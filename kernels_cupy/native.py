"""The CuPy launchers' side of the compiled host path (``kvdispatch/host_path.py``, ``host_path.c``): the
selector's hooks, which approve the C path for the calls CuPy serves, and the description of each launch as a
replay plan's (``replay_launch``): the call's parameters with each pointer as its tensor
(``KernelCall.pointers``), the kernel's ``CUfunction`` (``Function.ptr``) and the context current on its
device. ``host_path.register_replay`` then makes it the replay plan of the call's key, which the C path takes.

``KVDISPATCH_CUPY_LAUNCH`` = ``auto`` (default: the C path where it is available) | ``native`` (required: a
launch it cannot take raises with the reason) | ``python`` (never); read at each launch a call may register,
so no reset is needed after changing it (``reset()`` forgets the plans made before). On AMD the C path stays
off unless ``KVDISPATCH_HIP_HOST_PATH`` is on. Imports neither CuPy nor the kernel runtime (``runtime.py`` is
imported where a launch is described).
"""

from __future__ import annotations

from kvdispatch import _env, host_path

from .build import KernelCall

LAUNCHER = "cupy"
LAUNCH_ENV = _env.CUPY_LAUNCH
LAUNCH_MODES = _env.LAUNCH_MODES[LAUNCH_ENV]


def launch_mode() -> str:
    """``KVDISPATCH_CUPY_LAUNCH``: ``auto``, ``native`` or ``python`` (surrounding spaces and case ignored)."""
    return _env.choice(LAUNCH_ENV, LAUNCH_MODES)


def on_selected(device, op, backend) -> None:
    """The selector resolved ``(device, op, backend)`` to CuPy: the C path may take such calls (once their
    plan exists)."""
    host_path.on_selected(LAUNCHER, device, op, backend)


def on_deselected(device=None) -> None:
    """CuPy no longer serves ``device`` (None: any device): the C path takes none of its calls there."""
    host_path.on_deselected(LAUNCHER, device)


def reset() -> None:
    """Forget every CuPy plan in the C path."""
    host_path.forget_plans(LAUNCHER)


def kernel_and_context(index: int, call: KernelCall) -> tuple[int, int | None]:
    """The ``CUfunction`` handle of ``call``'s kernel on device ``index`` (compiled by its first launch) and
    the context CuPy loaded it in (None: none current)."""
    from . import runtime  # noqa: PLC0415  (imports CuPy; the call has just launched through it)

    function = runtime.kernel(index, call.kernel, call.defines)
    with runtime.cupy.cuda.Device(index):
        return function.ptr, host_path.current_context()


def replay_launch(call: KernelCall, index: int) -> host_path.Launch | None:
    """``call`` (launched on device ``index``) as a replay plan's launch (``host_path.register_replay``): its
    parameters with each pointer as its tensor (``call.pointers``). None in ``python`` mode, and in ``auto``
    mode where the C path takes no CuPy call (the extension not available, no current context); ``native``
    mode raises with the reason there."""
    mode = launch_mode()
    if mode == "python":
        return None
    if host_path.load(index) is None:
        return _not_taken(mode, host_path.failure())
    function, context = kernel_and_context(index, call)
    if not context:
        return _not_taken(mode, "no current context")
    params = list(call.args)
    for position, tensor in call.pointers:
        params[position] = tensor
    return host_path.Launch(LAUNCHER, context, function, call.grid, call.threads, 0, tuple(params))


def _not_taken(mode: str, reason: str | None) -> None:
    """None, for a launch the C path cannot take; raises in ``native`` mode, which requires it."""
    if mode == "native":
        raise RuntimeError(f"{LAUNCH_ENV}=native, but the compiled launcher cannot take this call ({reason}); "
                           "use auto or python")
    return None
