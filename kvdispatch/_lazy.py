"""Lazy package exports (PEP 562): a backend package names its public functions without importing the
submodules defining them, so importing the package (for its descriptor) imports no kernel runtime.
``op_launchers`` reads which submodule launches which op from their sources, for the package's ``KERNELS``."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
import sys

# A submodule's table of the ops it launches, at the start of a line: ``OP_LAUNCHERS = {"<op key>": <launcher>}``.
_OP_LAUNCHERS = re.compile(r"^OP_LAUNCHERS = (\{.*?\})$", re.MULTILINE | re.DOTALL)


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


def op_launchers(package: str) -> dict[str, tuple[str, str]]:
    """Op key -> ``(submodule, launcher name)`` for every op a submodule of ``package`` launches: each submodule's
    ``OP_LAUNCHERS`` dict (op keys to launcher functions), read from its source, in submodule-name order, without
    importing any. A malformed table, or an op two submodules launch, raises ValueError."""
    table = {}
    for submodule in pkgutil.iter_modules(sys.modules[package].__path__):
        match = _OP_LAUNCHERS.search(pkgutil.get_data(package, f"{submodule.name}.py").decode())
        if match is None:
            continue
        entries = ast.parse(match.group(1), mode="eval").body
        for key, value in zip(entries.keys, entries.values):
            if not (isinstance(key, ast.Constant) and isinstance(key.value, str) and isinstance(value, ast.Name)):
                raise ValueError(f"{package}.{submodule.name}.OP_LAUNCHERS: expected op keys (strings) to launcher "
                                 f"functions (names), got {ast.unparse(key)}: {ast.unparse(value)}")
            if key.value in table:
                raise ValueError(f"op {key.value!r} launched by both {package}.{table[key.value][0]} and "
                                 f"{package}.{submodule.name}")
            table[key.value] = (submodule.name, value.id)
    return table
