"""Lazy package exports (PEP 562): a backend package names its public functions without importing the
submodules defining them, so importing the package (for its descriptor) imports no kernel runtime."""

from __future__ import annotations

import importlib
import sys


def exports(package: str, owners: dict[str, str]):
    """``(__getattr__, __dir__)`` for ``package``: ``__getattr__(name)`` imports ``package.<owners[name]>``
    at the first access of ``name`` and keeps the value in the package, so later reads are plain attribute
    reads; a name not in ``owners`` raises AttributeError."""
    namespace = vars(sys.modules[package])

    def __getattr__(name):
        owner = owners.get(name)
        if owner is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{owner}"), name)
        namespace[name] = value
        return value

    def __dir__():
        return sorted(set(namespace) | set(owners))

    return __getattr__, __dir__
