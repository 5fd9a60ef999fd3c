"""Ahead-of-time compilation of every kernel specialisation for a GPU target, on any machine.

``kvdispatch compile [TARGET ...]`` runs it for users (a check, before a deployment, that the installed Triton
builds every kernel for the deployment's GPUs); the CI lanes ``compile-triton`` and ``triton-oldest`` use it to prove that the kernels
build for NVIDIA and AMD targets without a GPU, and to report binary size, registers and shared memory.
It builds its own ``JITFunction`` objects from the kernels' Python source, so it works even when
``TRITON_INTERPRET=1`` made ``@triton.jit`` return interpreted functions.

``--pdl`` (``pdl=True``) compiles instead one specialisation per kernel with programmatic dependent launch (the
``PDL`` constexpr and Triton's ``launch_pdl`` option), for the NVIDIA targets only (AMD GPUs have no PDL); their
reports list the ``griddepcontrol`` instructions found in the PTX.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass

from kvdispatch import grid as launch_grid
from kvdispatch._env import triton_flag

from . import dcp, draft_decode, launch, mapped_tables, page_table, token_csr

PAGE_SIZES = page_table.SPECIALISED_PAGE_SIZES
TARGETS = (("cuda", 90, 32), ("cuda", 100, 32), ("hip", "gfx942", 64), ("hip", "gfx950", 64))


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


@dataclass(frozen=True)
class CompileReport:
    label: str
    target: str
    binary_bytes: int
    registers: int | None
    shared_bytes: int
    num_warps: int
    runtime_args: int
    native_parameters: int | None  # launch.native_parameter_count: what host_path.c would pass, or None
    griddepcontrol: tuple = ()  # the PTX's griddepcontrol instructions (``wait``, ``launch_dependents``), sorted


def _jit(module):
    import triton  # noqa: PLC0415

    kernel = {page_table: "page_table_kernel", token_csr: "token_csr_kernel",
              draft_decode: "draft_decode_kernel"}[module]
    kernel = getattr(module, kernel)
    function = getattr(kernel, "fn", kernel)  # the Python function, whether jitted or interpreted
    return triton.runtime.jit.JITFunction(function, do_not_specialize=module.RUNTIME_INTS,
                                          do_not_specialize_on_alignment=module.POINTERS)


def specializations(warp_size: int = 32, page_sizes=PAGE_SIZES, index_types=("i32", "i64")):
    """Yield a ``Specialization`` for every (page size, option flags, index dtype) of every kernel, with
    ``num_warps`` as the launchers pick it for ``warp_size``-lane warps."""
    page_kernel, csr_kernel = _jit(page_table), _jit(token_csr)
    for page_size in page_sizes:
        threads = launch_grid.page_table_launch(1, 1, page_size).threads
        for signature, constexprs in page_table.specializations((page_size,), index_types):
            yield Specialization(page_kernel, signature, constexprs, max(1, threads // warp_size))
    threads = launch_grid.token_csr_launch(1, 1, 1).threads
    for signature, constexprs in token_csr.specializations(index_types):
        yield Specialization(csr_kernel, signature, constexprs, max(1, threads // warp_size))
    draft_kernel, threads = _jit(draft_decode), launch_grid.draft_decode_launch(1, 1, 1).threads
    for signature, constexprs in draft_decode.specializations(index_types):
        yield Specialization(draft_kernel, signature, constexprs, max(1, threads // warp_size))
    yield from _mapped_table_specializations(warp_size, page_sizes, index_types)
    yield from _dcp_specializations(warp_size, index_types)


def pdl_specializations(warp_size: int = 32):
    """The first specialisation of each kernel (page size 64, int32 indices: an engine's usual call) with
    programmatic dependent launch: ``PDL`` set, compiled with ``launch_pdl``."""
    seen = set()
    for spec in specializations(warp_size, (64,), ("i32",)):
        if spec.kernel.__name__ not in seen:
            seen.add(spec.kernel.__name__)
            yield dataclasses.replace(spec, constexprs=dict(spec.constexprs, PDL=True))


def _mapped_table_specializations(warp_size, page_sizes, index_types):
    """The mapped page tables' specialisations (``mapped_tables.specializations``)."""
    import triton  # noqa: PLC0415

    kernels = {name: triton.runtime.jit.JITFunction(function, do_not_specialize=ints,
                                                    do_not_specialize_on_alignment=pointers)
               for name, (function, pointers, ints) in mapped_tables.KERNEL_PARAMETERS.items()}
    for page_size in page_sizes:
        threads = launch_grid.mapped_page_table_launch(1, 1, page_size).threads
        for name, signature, constexprs in mapped_tables.specializations((page_size,), index_types):
            yield Specialization(kernels[name], signature, constexprs, max(1, threads // warp_size))


def _dcp_specializations(warp_size, index_types):
    """The DCP kernels' specialisations (``kernels_triton.dcp``), with their own page sizes."""
    import triton  # noqa: PLC0415

    for op, kernel, specs, threads_of in (
            ("csr", dcp.dcp_token_csr_kernel, dcp.csr_specializations(index_types),
             lambda c: launch_grid.dcp_token_csr_launch(1, 1, 1, 1).threads),
            ("table", dcp.dcp_page_table_kernel, dcp.table_specializations(index_types),
             lambda c: launch_grid.dcp_page_table_launch(1, 1, c["PAGE_SIZE"]).threads)):
        jitted = triton.runtime.jit.JITFunction(getattr(kernel, "fn", kernel), do_not_specialize=dcp.RUNTIME_INTS[op],
                                                do_not_specialize_on_alignment=dcp.POINTERS[op])
        for signature, constexprs in specs:
            yield Specialization(jitted, signature, constexprs, max(1, threads_of(constexprs) // warp_size))


def compile_one(spec: Specialization, target):
    """``triton.compile`` of ``spec`` for ``target`` (a ``GPUTarget`` or ``(backend, arch, warp_size)``)."""
    import triton  # noqa: PLC0415
    from triton.backends.compiler import GPUTarget  # noqa: PLC0415

    if not isinstance(target, GPUTarget):
        target = GPUTarget(*target)
    source = triton.compiler.ASTSource(fn=spec.kernel, signature=spec.signature, constexprs=spec.constexprs)
    options = {"num_warps": spec.num_warps}
    if spec.constexprs.get("PDL"):
        options["launch_pdl"] = True
    return triton.compile(source, target=target, options=options)


def report(spec: Specialization, target, compiled) -> CompileReport:
    binary = compiled.asm.get("cubin") or compiled.asm.get("hsaco") or b""
    registers = getattr(compiled, "n_regs", None)  # set only when loaded on a device
    if registers is None:
        registers = _registers_from_asm(compiled)
    runtime_args = sum(1 for kind in spec.signature.values() if kind != "constexpr")
    ptx = compiled.asm.get("ptx")
    grid_dependency = tuple(sorted(set(re.findall(r"griddepcontrol\.(\w+)", ptx)))) if isinstance(ptx, str) else ()
    return CompileReport(spec.label, f"{target[0]}:{target[1]}", len(binary), registers,
                         compiled.metadata.shared, spec.num_warps, runtime_args,
                         launch.native_parameter_count(compiled, runtime_args), grid_dependency)


def _registers_from_asm(compiled) -> int | None:
    """Registers per thread read from the AMD assembly (``.vgpr_count``), or None."""
    amdgcn = compiled.asm.get("amdgcn")
    if isinstance(amdgcn, str):
        match = re.search(r"\.vgpr_count:\s+(\d+)", amdgcn)
        if match:
            return int(match.group(1))
    return None


def cross_compile(target, page_sizes=PAGE_SIZES, index_types=("i32", "i64"), pdl=False) -> list[CompileReport]:
    """Compile every specialisation for ``target`` (``(backend, arch, warp_size)``, e.g.
    ``("hip", "gfx942", 64)``); raises on the first failure. ``pdl``: the ``pdl_specializations`` instead
    (none for a HIP target).

    Under ``TRITON_INTERPRET=1`` Triton's code generator does not work in this process, so the
    compilation runs in a child process without it.
    """
    target = tuple(target)
    if triton_flag("TRITON_INTERPRET"):
        return _cross_compile_in_child(target, page_sizes, index_types, pdl)
    if pdl:
        specs = pdl_specializations(target[2]) if target[0] == "cuda" else ()
    else:
        specs = specializations(target[2], page_sizes, index_types)
    return [report(spec, target, compile_one(spec, target)) for spec in specs]


def _cross_compile_in_child(target, page_sizes, index_types, pdl=False) -> list[CompileReport]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "kernels_triton.crosscompile", "--json",
               "--page-sizes", ",".join(map(str, page_sizes)), "--index-types", ",".join(index_types),
               *(["--pdl"] if pdl else []), ":".join(map(str, target))]
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode:
        raise RuntimeError(f"cross-compilation for {target} failed:\n{done.stderr[-4000:]}")
    return [CompileReport(**dict(row, griddepcontrol=tuple(row["griddepcontrol"]))) for row in json.loads(done.stdout)]


def parse_target(text: str):
    """``"backend:arch:warp_size"`` as a target tuple, e.g. ``("hip", "gfx942", 64)``."""
    backend, arch, warp = text.split(":")
    return backend, int(arch) if arch.isdigit() else arch, int(warp)


def main(argv=None) -> int:
    """``python -m kernels_triton.crosscompile [--json] [backend:arch:warp ...]``: compile every
    specialisation for each target (default: ``TARGETS``) and print a table (or JSON)."""
    import argparse  # noqa: PLC0415

    parser = argparse.ArgumentParser(prog="python -m kernels_triton.crosscompile", description=main.__doc__)
    parser.add_argument("targets", nargs="*", help="backend:arch:warp_size, e.g. cuda:90:32 or hip:gfx942:64")
    parser.add_argument("--json", action="store_true", help="print the reports as JSON")
    parser.add_argument("--page-sizes", default=",".join(map(str, PAGE_SIZES)))
    parser.add_argument("--index-types", default="i32,i64")
    parser.add_argument("--pdl", action="store_true",
                        help="compile one specialisation per kernel with programmatic dependent launch (NVIDIA only)")
    options = parser.parse_args(argv)
    targets = [parse_target(t) for t in options.targets] or list(TARGETS)
    page_sizes = tuple(int(p) for p in options.page_sizes.split(","))
    index_types = tuple(options.index_types.split(","))
    reports = [r for target in targets for r in cross_compile(target, page_sizes, index_types, options.pdl)]
    if options.json:
        print(json.dumps([dataclasses.asdict(r) for r in reports]))
        return 0
    for r in reports:
        print(f"{r.target:12} {r.label:100} warps={r.num_warps} binary={r.binary_bytes}B "
              f"regs={r.registers} shared={r.shared_bytes}B"
              + (f" griddepcontrol={','.join(r.griddepcontrol)}" if r.griddepcontrol else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
