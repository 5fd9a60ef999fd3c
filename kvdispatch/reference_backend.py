"""The torch backend's descriptor: its module is ``kvdispatch.ops`` (each op's kernel is its torch reference);
it serves every device PyTorch has and needs nothing else."""

from __future__ import annotations

NAME = "torch"
MODULE = "kvdispatch.ops"


def install_hint(vendor: str) -> None:
    """Nothing to install: PyTorch is a dependency of kvdispatch."""
    return None


def reason_if_unsupported(raw, family: str) -> None:
    """Always None: the reference runs wherever PyTorch does."""
    return None
