"""The CuPy launchers' side of the compiled host path (``kvdispatch/host_path.py``, ``host_path.c``): the
selector's hooks, which approve the C path for the calls CuPy serves, and the registration of the page
table's and the token CSR's launch plans, in the CUDA kernels' parameter order (``launch.page_table_call``,
``launch.token_csr_call``).

After a call's first launch on the Python path, its plan is registered with the kernel's ``CUfunction``
(``Function.ptr``), the context current on its device, the grid's second and third entries, the threads, and
the two arguments the call's tensors do not show (the grid helper's items per program and the ``KV_FLAGS``
word); the C path then takes such calls. A plan key is what ``host_path.c`` computes from a call: device, page
size, batch, width, the index vectors' dtypes and which options are given (page table); device, batch,
``min(C, N)`` and the dtypes (token CSR, ordinary calls: int32 out, entry page size 1, no mapping).

The other ops' launches become replay plans (``host_path.register_replay``) as ``replay_launch`` describes
them: the call's parameters with each pointer as its tensor (``KernelCall.pointers``).

``KVDISPATCH_CUPY_LAUNCH`` = ``auto`` (default: the C path where it is available) | ``native`` (required: a
plan it cannot take raises with the reason) | ``python`` (never); read when a plan is registered, so call
``reset()`` after changing it. On AMD the C path stays off unless ``KVDISPATCH_HIP_HOST_PATH`` is on.
Imports neither CuPy nor the kernel runtime (``runtime.py`` is imported where a plan is registered).
"""

from __future__ import annotations

import logging

from kvdispatch import _env, grid, host_path

from .build import KernelCall

LAUNCHER = "cupy"
LAUNCH_ENV = _env.CUPY_LAUNCH
LAUNCH_MODES = _env.LAUNCH_MODES[LAUNCH_ENV]
MAX_PLANS = 4096  # the C path's table holds this many CuPy plans (host_path.c, TABLE_SLOTS)

log = logging.getLogger("kvdispatch")
# Plan keys tried, whether or not the C path took them (a key that failed is not tried again).
_tried: set[tuple] = set()
# No plan is registered until reset(): the mode is python, or the C path cannot be loaded (auto mode).
_off = False


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
    """Forget every CuPy plan, here and in the C path (after changing ``KVDISPATCH_CUPY_LAUNCH``)."""
    global _off
    _off = False
    _tried.clear()
    host_path.forget_plans(LAUNCHER)


def page_table_key(req_to_token, req_pool_indices, seq_lens, out, page_size, kv_start_idx=None, seqlen_offset=0,
                   seq_lens_out=None, fill_value=None) -> tuple:
    """The C path's plan key of a page-table call (``host_path.c``'s ``add_plan``; the last three fields are
    Triton's and stay 0 here)."""
    return (out.get_device(), page_size, req_pool_indices.shape[0], out.shape[1], req_pool_indices.dtype,
            seq_lens.dtype, None if kv_start_idx is None else kv_start_idx.dtype, seq_lens_out is not None,
            fill_value is not None, 0, 0, 0)


def token_csr_key(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, kv_start_idx=None) -> tuple:
    """The C path's plan key of an ordinary token-CSR call (the last two fields are Triton's and stay 0)."""
    return (out.get_device(), req_pool_indices.shape[0], min(req_to_token.shape[1], out.shape[0]),
            req_pool_indices.dtype, seq_lens.dtype, kv_indptr.dtype,
            None if kv_start_idx is None else kv_start_idx.dtype, 0, 0)


def add_page_table_plan(call: KernelCall, *args) -> None:
    """After ``call`` (``launch.page_table_call(*args)``, not rounding toward zero) has been launched: register
    its plan, once per key."""
    if not _off and (key := page_table_key(*args)) not in _tried:
        add_plan("page_table", key, call)


def add_token_csr_plan(call: KernelCall, *args) -> None:
    """After ``call`` (``launch.token_csr_call(*args)``, an ordinary call) has been launched: register its
    plan, once per key."""
    if not _off and (key := token_csr_key(*args)) not in _tried:
        add_plan("token_csr", key, call)


def add_plan(op: str, key: tuple, call: KernelCall) -> None:
    """Register the plan of ``key`` (``page_table_key``, ``token_csr_key``) for ``op``, launching as ``call``
    does, with the C path, as the launch mode says. In ``auto`` mode nothing here ever fails the call: a plan
    it cannot register leaves such calls on the Python path."""
    global _off
    mode = launch_mode()  # an invalid value raises before the key counts as tried
    if len(_tried) >= MAX_PLANS:
        reset()
    _tried.add(key)
    if mode == "python":
        _off = True
        return
    try:
        reason = _register(op, key, call)
    except Exception as exc:  # anything unexpected: the Python path keeps serving
        reason = f"{type(exc).__name__}: {exc}"
    if reason is not None:
        _off = mode == "auto" and host_path.load(key[0]) is None  # it will not come: no more keys to try
        if mode == "native":
            raise RuntimeError(f"{LAUNCH_ENV}=native, but the compiled launcher cannot take this call ({reason}); "
                               "use auto or python")
        log.debug("kvdispatch: CuPy %s calls of key %s stay on the Python path: %s", op, key, reason)


def kernel_and_context(index: int, call: KernelCall) -> tuple[int, int | None]:
    """The ``CUfunction`` handle of ``call``'s kernel on device ``index`` (compiled by its first launch) and
    the context CuPy loaded it in (None: none current)."""
    from . import runtime  # noqa: PLC0415  (imports CuPy; the call has just launched through it)

    function = runtime.kernel(index, call.kernel, call.defines)
    with runtime.cupy.cuda.Device(index):
        return function.ptr, host_path.current_context()


def _register(op: str, key: tuple, call: KernelCall) -> str | None:
    """Register the plan; None when the C path took it, else why not."""
    if host_path.load(key[0]) is None:
        return host_path.failure()
    function, context = kernel_and_context(key[0], call)
    if not context:
        return "no current context"
    items = grid.items_per_program(op, key[1] if op == "page_table" else 1)
    flags = dict(call.defines)["KV_FLAGS"]
    if not host_path.add_plan(LAUNCHER, op, key, context, function, call.grid, call.threads, 0, len(call.args), items,
                              flags):
        return "its plan table is full"
    return None


def replay_launch(call: KernelCall, index: int) -> host_path.Launch | None:
    """``call`` (launched on device ``index``) as a replay plan's launch (``host_path.register_replay``): its
    parameters with each pointer as its tensor (``call.pointers``); None where the C path takes no CuPy call
    (the launch mode, the extension not available, no current context)."""
    if _off or launch_mode() == "python" or host_path.load(index) is None:
        return None
    function, context = kernel_and_context(index, call)
    if not context:
        return None
    params = list(call.args)
    for position, tensor in call.pointers:
        params[position] = tensor
    return host_path.Launch(LAUNCHER, context, function, call.grid, call.threads, 0, tuple(params))
