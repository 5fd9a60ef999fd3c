"""Ahead-of-time compilation of the kernel specialisations for a GPU target, on any machine.

``kvdispatch compile [TARGET ...]`` runs it for users (a check, before a deployment, that the installed Triton
builds the kernels for the deployment's GPUs); the CI lanes ``compile-triton`` and ``triton-oldest`` use it to
prove, without a GPU, that every kernel builds for NVIDIA and AMD targets with every option (the ``pairwise``
selection: every value of each option together with every value of every other), and to report binary size,
registers and shared memory.
It builds its own ``JITFunction`` objects from the kernels' Python source, so it works even when
``TRITON_INTERPRET=1`` made ``@triton.jit`` return interpreted functions.

``--pdl`` (``Selection(pdl=True)``) compiles instead one specialisation per kernel with programmatic dependent
launch (the ``PDL`` constexpr and Triton's ``launch_pdl`` option), for the NVIDIA targets only (AMD GPUs have no
PDL); their reports list the ``griddepcontrol`` instructions found in the PTX.

Compilation runs in a pool of spawned worker processes (one per CPU by default) with a Triton cache of their
own: a private temporary directory, removed at the end, unless the caller names one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import itertools
import multiprocessing
import os
import re
import shutil
import tempfile
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass

from . import KERNELS, launch, page_table
from .specialization import Specialization

PAGE_SIZES = page_table.SPECIALISED_PAGE_SIZES
TARGETS = (("cuda", 90, 32), ("cuda", 100, 32), ("hip", "gfx942", 64), ("hip", "gfx950", 64))


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


def specializations(warp_size: int = 32, page_sizes=PAGE_SIZES, index_types=("i32", "i64")):
    """Yield a ``Specialization`` for every (page size, option flags, index dtype) of every kernel, with
    ``num_warps`` as the launchers pick it for ``warp_size``-lane warps: each kernel module's
    ``compile_specializations``, module by module."""
    for module in kernel_modules():
        yield from module.compile_specializations(warp_size, page_sizes, index_types)


def kernel_modules() -> list:
    """The modules of the backend's kernel table (``kernels_triton.KERNELS``), each once, in the table's order."""
    names = dict.fromkeys(module for module, _ in KERNELS.values())
    return [importlib.import_module(f"{__package__}.{name}") for name in names]


def pdl_specializations(warp_size: int = 32):
    """The first specialisation of each kernel (page size 64, int32 indices: an engine's usual call) with
    programmatic dependent launch: ``PDL`` set, compiled with ``launch_pdl``."""
    seen = set()
    for spec in specializations(warp_size, (64,), ("i32",)):
        if spec.kernel.__name__ not in seen:
            seen.add(spec.kernel.__name__)
            yield dataclasses.replace(spec, constexprs=dict(spec.constexprs, PDL=True))


def compile_one(spec: Specialization, target):
    """``triton.compile`` of ``spec`` for ``target`` (a ``GPUTarget`` or ``(backend, arch, warp_size)``)."""
    import triton  # noqa: PLC0415
    from triton.backends.compiler import GPUTarget  # noqa: PLC0415

    if not isinstance(target, GPUTarget):
        target = GPUTarget(*target)
    source = triton.compiler.ASTSource(fn=spec.kernel, signature=spec.signature, constexprs=spec.constexprs)
    # The kernels do no floating-point arithmetic, so FP fusion changes nothing; naming it keeps Triton 3.9 from
    # warning that its default (TRITON_DEFAULT_FP_FUSION) changes in 3.10.
    options = {"num_warps": spec.num_warps, "enable_fp_fusion": False}
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


def is_ordinary(spec: Specialization) -> bool:
    """Whether ``spec`` is what a call without options builds: contiguous index vectors (``UNIT_STRIDES``) and
    every other flag off; page sizes and index and output dtypes vary as in every specialisation."""
    return all(value is (name == "UNIT_STRIDES") for name, value in spec.constexprs.items() if isinstance(value, bool))


def _features(spec: Specialization) -> set:
    """What a specialisation fixes: each constexpr's value, each pointer's dtype and the warps."""
    return ({("constexpr", name, repr(value)) for name, value in spec.constexprs.items()}
            | {("pointer", name, kind) for name, kind in spec.signature.items() if kind.startswith("*")}
            | {("num_warps", spec.num_warps)})


def _pairs(spec: Specialization) -> set:
    return set(itertools.combinations(sorted(_features(spec)), 2))


def pairwise(specs: list[Specialization]) -> list[Specialization]:
    """A subset of ``specs``, in their order, in which every pair of features (two constexprs' values, a
    constexpr's value and a pointer's dtype, ...) that any specialisation of a kernel has together appears
    together in one chosen specialisation of that kernel: every ``is_ordinary`` one, then, greedily, the one
    that adds the most pairs not yet covered. Each option's code is thus built with every value of every other
    option, at a small fraction of the product's compilations."""
    chosen = set()
    for kernel in dict.fromkeys(spec.kernel.__name__ for spec in specs):  # a JITFunction's hash compiles it
        own = [index for index, spec in enumerate(specs) if spec.kernel.__name__ == kernel]
        pair_ids: dict = {}
        masks = {}
        for index in own:
            mask = 0
            for pair in _pairs(specs[index]):
                mask |= 1 << pair_ids.setdefault(pair, len(pair_ids))
            masks[index] = mask
        covered = 0
        for index in own:
            if is_ordinary(specs[index]):
                chosen.add(index)
                covered |= masks[index]
        every = (1 << len(pair_ids)) - 1
        while covered != every:
            best = max(own, key=lambda index: (masks[index] & ~covered).bit_count())
            chosen.add(best)
            covered |= masks[best]
    return [spec for index, spec in enumerate(specs) if index in chosen]


@dataclass(frozen=True)
class Selection:
    """Which specialisations to compile: those of ``page_sizes`` and ``index_types``; ``ordinary``: only the
    ``is_ordinary`` ones; ``pairs``: the ``pairwise`` subset; ``pdl``: the ``pdl_specializations`` instead
    (none for a HIP target)."""

    page_sizes: tuple = PAGE_SIZES
    index_types: tuple = ("i32", "i64")
    ordinary: bool = False
    pairs: bool = False
    pdl: bool = False

    def specializations(self, target) -> list[Specialization]:
        if self.pdl:
            return list(pdl_specializations(target[2])) if target[0] == "cuda" else []
        specs = list(specializations(target[2], self.page_sizes, self.index_types))
        if self.ordinary:
            return [spec for spec in specs if is_ordinary(spec)]
        return pairwise(specs) if self.pairs else specs


ORDINARY = Selection(ordinary=True)
PAIRS = Selection(pairs=True)


def default_jobs() -> int:
    """The CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def cross_compile(targets, selection: Selection = Selection(), *, jobs: int | None = None, cache_dir=None,
                  progress=None) -> dict[tuple, list[CompileReport]]:
    """Compile the ``selection`` for each of ``targets`` (``(backend, arch, warp_size)``, e.g.
    ``("hip", "gfx942", 64)``) in ``jobs`` worker processes (default: ``default_jobs()``); returns the reports
    per target, in the selection's order. Raises on the first failure, naming the specialisation and target.

    ``cache_dir``: Triton's cache for the workers (created if missing, kept); None: a private temporary
    directory, removed at the end. ``progress(target, done, total)`` is called after each compilation.
    """
    targets = [tuple(target) for target in targets]
    counts = {target: len(selection.specializations(target)) for target in targets}
    reports = {target: [None] * count for target, count in counts.items()}
    done = dict.fromkeys(targets, 0)
    with _worker_environment(cache_dir), ProcessPoolExecutor(
            jobs or default_jobs(), mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(_compile_in_worker, selection, target, index): (target, index)
                   for target in targets for index in range(counts[target])}
        try:
            for future in as_completed(futures):
                target, index = futures[future]
                reports[target][index] = future.result()
                done[target] += 1
                if progress is not None:
                    progress(target, done[target], counts[target])
        except BaseException:
            pool.shutdown(cancel_futures=True)
            raise
    return reports


@contextlib.contextmanager
def _worker_environment(cache_dir):
    """The workers' environment in ``os.environ`` while the pool lives (a spawned process starts with it, before
    it imports anything), restored after: no ``TRITON_INTERPRET`` (Triton's code generator does not work in a
    process that imported Triton under it) and ``TRITON_CACHE_DIR``, ``cache_dir`` or a new private (0700)
    temporary directory, removed at the end."""
    private = cache_dir is None
    if private:
        cache_dir = tempfile.mkdtemp(prefix="kvdispatch-compile-")
    else:
        os.makedirs(cache_dir, exist_ok=True)
    saved = {name: os.environ.pop(name, None) for name in ("TRITON_INTERPRET", "TRITON_CACHE_DIR")}
    os.environ["TRITON_CACHE_DIR"] = os.path.abspath(cache_dir)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if private:
            shutil.rmtree(cache_dir, ignore_errors=True)


@functools.lru_cache(maxsize=None)
def _selected(selection: Selection, target) -> list[Specialization]:
    return selection.specializations(target)


def _compile_in_worker(selection: Selection, target, index: int) -> CompileReport:
    """In a worker: compile the ``index``-th specialisation of ``selection`` for ``target``."""
    spec = _selected(selection, target)[index]
    try:
        return report(spec, target, compile_one(spec, target))
    except Exception as exc:  # Triton's own errors need not pickle back to the parent
        raise RuntimeError(f"{spec.label} does not compile for {target_name(target)}: "
                           f"{type(exc).__name__}: {exc}") from None


def target_name(target) -> str:
    """``target`` as ``parse_target`` reads it, e.g. ``cuda:90:32``."""
    return ":".join(map(str, target))


def parse_target(text: str):
    """``"backend:arch:warp_size"`` as a target tuple, e.g. ``("hip", "gfx942", 64)``; a ``ValueError`` saying
    what is expected for anything else."""
    parts = text.split(":")
    if len(parts) != 3 or parts[0] not in ("cuda", "hip") or not parts[1] or not parts[2].isdigit():
        raise ValueError(f"target {text!r}: expected backend:arch:warp_size with backend cuda or hip, e.g. "
                         f"{', '.join(map(target_name, TARGETS))}")
    backend, arch, warp = parts
    return backend, int(arch) if arch.isdigit() else arch, int(warp)
