"""One ahead-of-time compilation of a Triton kernel, as each kernel module lists them for ``crosscompile``.

Every kernel module of the backend's table (``kernels_triton.KERNELS``) defines
``compile_specializations(warp_size, page_sizes, index_types)``, yielding a ``Specialization`` for every
specialisation its launcher can ask for: ``page_sizes`` are the page sizes compiled ahead of time (a kernel
with page sizes of its own, or none, ignores them), ``index_types`` the dtypes of the index vectors
(``"i32"``, ``"i64"``) and ``num_warps`` as the launcher picks it for ``warp_size``-lane warps.
"""

from __future__ import annotations

from dataclasses import dataclass

import triton


@dataclass(frozen=True)
class Specialization:
    """One compilation the launchers can ask for: kernel, ASTSource signature, constexprs and warps."""

    kernel: object  # triton.runtime.jit.JITFunction
    signature: dict
    constexprs: dict
    num_warps: int

    @property
    def label(self) -> str:
        flags = ",".join(f"{k}={int(v) if isinstance(v, bool) else v}" for k, v in self.constexprs.items())
        pointers = ",".join(v for v in self.signature.values() if v.startswith("*"))
        return f"{self.kernel.__name__}[{flags}][{pointers}]"


def jit_function(kernel, pointers, runtime_ints) -> triton.runtime.jit.JITFunction:
    """A new ``JITFunction`` of ``kernel``'s Python function (``kernel`` jitted, interpreted under
    ``TRITON_INTERPRET=1``, or the function itself) with the launcher's specialisation rules: no alignment
    specialisation of the ``pointers`` parameters, no value specialisation of the ``runtime_ints``."""
    return triton.runtime.jit.JITFunction(getattr(kernel, "fn", kernel), do_not_specialize=runtime_ints,
                                          do_not_specialize_on_alignment=pointers)


def ast_signature(parameters, constexprs, types=None) -> dict:
    """The ``triton.compiler.ASTSource`` signature of a kernel's ``parameters`` (their names, in order):
    ``types[name]`` where given, else ``*i32`` for a pointer (a name ending in ``_ptr``) and ``i64``; the names
    of ``constexprs`` marked ``constexpr``."""
    types = types or {}
    signature = {name: types.get(name, "*i32" if name.endswith("_ptr") else "i64") for name in parameters}
    signature.update({name: "constexpr" for name in constexprs})
    return signature


def warps(threads: int, warp_size: int) -> int:
    """The ``num_warps`` of a program of ``threads`` threads in ``warp_size``-lane warps (at least one)."""
    return max(1, threads // warp_size)
