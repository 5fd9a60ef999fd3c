"""The Triton launchers' side of the compiled host path (``kvdispatch/host_path.py``, ``host_path.c``): the
selector's hooks, which approve the C path for the calls Triton serves, and the registration of the page
table's and the token CSR's launch plans, in Triton's parameter order. The other ops' launches become replay
plans (``host_path.register_replay``) as ``launch.KernelLauncher.replay_launch`` describes them; their plan
caches drop them through ``forget_plans`` too. ``launch.native_kernel`` decides
whether a compiled kernel takes ``cuLaunchKernel``'s parameters as the C path passes them;
``KVDISPATCH_TRITON_LAUNCH=native`` requires the C path and raises with the reason.
"""

from __future__ import annotations

import torch

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
    """Drop the C path's Triton plans of ``op`` (replay plans included) along with the Python launcher's (its
    plan cache calls this when it forgets)."""
    host_path.forget_plans(LAUNCHER, op)


def add_page_table_plan(key: tuple, kernel, grid: tuple) -> bool:
    """Register the launch of one page-table call key (``page_table.plan_key_and_arguments``) with
    ``kernel`` (a ``launch.NativeKernel``) on ``grid`` (``kvdispatch.grid.Launch.grid``; its first entry
    is the batch, read from each call); returns whether the C path took it."""
    if key[12] or key[13]:  # rounding toward zero, PDL: the C path takes no such call (it hands it back)
        return False
    return host_path.add_plan(LAUNCHER, "page_table", key[:12], kernel.context, kernel.function, grid,
                              kernel.threads, kernel.shared, kernel.param_count)


def is_ordinary_token_csr(key: tuple) -> bool:
    """Whether the token-CSR call of ``key`` (``token_csr.plan_key_and_arguments``) has none of the options,
    the only calls the C path takes: an int32 ``out``, entry page size 1, no token mapping and no programmatic
    dependent launch."""
    return key[9] is torch.int32 and key[10] == 1 and key[11] is None and not key[12]


def add_token_csr_plan(key: tuple, kernel, grid: tuple) -> bool:
    """Register the launch of one token-CSR call key (``token_csr.plan_key_and_arguments``) with
    ``kernel`` (a ``launch.NativeKernel``) on ``grid``, as ``add_page_table_plan``; returns whether the C
    path took it. A key with an option (``is_ordinary_token_csr``) is refused: the C path takes no such
    call, so it has no plan for one."""
    if not is_ordinary_token_csr(key):
        return False
    return host_path.add_plan(LAUNCHER, "token_csr", key[:9], kernel.context, kernel.function, grid,
                              kernel.threads, kernel.shared, kernel.param_count)
