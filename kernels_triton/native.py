"""The Triton launchers' side of the compiled host path (``kvdispatch/host_path.py``, ``host_path.c``): the
selector's hooks, which approve the C path for the calls Triton serves, and the forgetting of its plans. Every
op's launches become replay plans (``host_path.register_replay``) as ``launch.KernelLauncher.replay_launch``
describes them; their plan caches drop them through ``forget_plans``. ``launch.native_parameter_count``
decides whether a compiled kernel takes ``cuLaunchKernel``'s parameters as the C path passes them;
``KVDISPATCH_TRITON_LAUNCH=native`` requires the C path and raises with the reason.
"""

from __future__ import annotations

from kvdispatch import host_path

LAUNCHER = "triton"


def on_selected(device, op, backend) -> None:
    """The selector resolved ``(device, op, backend)`` to Triton: the C path may take such calls (once
    their plan exists)."""
    host_path.on_selected(LAUNCHER, device, op, backend)


def on_deselected(device=None) -> None:
    """Triton no longer serves ``device`` (None: any device): the C path takes none of its calls there."""
    host_path.on_deselected(LAUNCHER, device)


def forget_plans(op: str) -> None:
    """Drop the C path's Triton plans of ``op`` along with the Python launcher's (its plan cache calls this
    when it forgets)."""
    host_path.forget_plans(LAUNCHER, op)
