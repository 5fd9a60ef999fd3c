"""kv_indices.cu built for the host with g++ (through cuda_host_shim.h) and run on CPU tensors.

This is how CI without a GPU tests the CUDA/HIP source itself: the same kernels, the same launch
geometry and arguments as the CuPy launcher (``kernels_cupy.launch``), every thread run in turn. The grid is
the launcher's, bounded by the program budget of the CPU's probe (``kvdispatch.grid.program_budget``), so the
kernels' programs stride over their rows' blocks as on a GPU.
The shared library is built once per source hash (and ``$CUDA_HOST_CXXFLAGS``, more compiler options) into the
``cuda-host`` directory of the build cache (``kvdispatch._build_cache``: private to the current user, refused
otherwise) and loaded with ctypes. The ``cupy-host`` CI lane builds it under AddressSanitizer, so that every
access of a kernel outside an allocation stops the run.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import inspect
import os
import shutil
import subprocess
from pathlib import Path

import kernels_cupy
from kernels_cupy import build
from kernels_cupy.launch import KernelCall
from kvdispatch import _build_cache, dispatch

SHIM_PATH = Path(__file__).with_name("cuda_host_shim.h")
# More compiler options for the host build, e.g. AddressSanitizer's (the cupy-host lane); part of the build's key.
EXTRA_FLAGS_ENV = "CUDA_HOST_CXXFLAGS"


class CompilerMissing(RuntimeError):
    """No C++ compiler for the host build (a failed build raises a plain RuntimeError)."""


def build_dir() -> Path:
    """The private directory the host builds live in (created 0700 where missing)."""
    return _build_cache.private_dir(_build_cache.root() / "cuda-host")


@functools.lru_cache(maxsize=None)
def library(defines: tuple = (), kernels: tuple = tuple(build.KERNELS)) -> ctypes.CDLL:
    """Build (if needed) and load the host library of ``kernels``; one build per content of the source and the
    shim, per specialisation ``defines`` (``KernelCall.defines``; none: the generic kernels) and per kernel list.
    The shim makes every kernel an inline function, so a build compiles only the kernels it exports: a
    specialisation, built for one kernel, takes about 0.4 s instead of 1.1."""
    unit = ("".join(f"#define {name} {value}\n" for name, value in defines)
            + f'#include "{SHIM_PATH}"\n#include "{build.SOURCE_PATH}"\n'
            + "".join(f"KV_HOST_EXPORT({name})\n" for name in kernels))
    extra_flags = os.environ.get(EXTRA_FLAGS_ENV, "").split()
    digest = hashlib.sha256((unit + build.source() + SHIM_PATH.read_text() + " ".join(extra_flags)).encode()
                            ).hexdigest()[:16]
    compiler = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("g++")
    if compiler is None:
        raise CompilerMissing("the host build of kv_indices.cu needs a C++ compiler (g++ or $CXX)")

    def compile_to(partial: Path) -> None:
        done = subprocess.run([compiler, "-x", "c++", build.STD_FLAG, "-O2", *extra_flags, "-shared", "-fPIC",
                               "-Wall", "-Wno-unknown-pragmas", "-o", str(partial), "-"], input=unit,
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"host build of kv_indices.cu failed:\n{done.stdout}{done.stderr}")

    lib = ctypes.CDLL(str(_build_cache.build(build_dir(), f"kv_indices_{digest}.so", compile_to)))
    for name in kernels:
        getattr(lib, f"host_{name}").argtypes = [ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
                                                 ctypes.POINTER(ctypes.c_void_p)]
    return lib


def run(call: KernelCall | None, specialised: bool = False) -> None:
    """Run one kernel call on the host (the tensors behind its pointers must be CPU tensors), through the
    generic library or, with ``specialised``, the one built for the call's specialisation as on a GPU."""
    if call is None:
        return
    values = [ctypes.c_uint64(a & 0xFFFF_FFFF_FFFF_FFFF) for a in call.args]  # every parameter is 8 bytes
    pointers = (ctypes.c_void_p * len(values))(*[ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in values])
    lib = library(call.defines, (call.kernel,)) if specialised else library()
    getattr(lib, f"host_{call.kernel}")(*call.grid, call.threads, pointers)


def _host_public(op):
    """``kvdispatch.<op.name>`` on CPU tensors through the host build of its kernel: the op's arguments are
    checked (``op.check``, by name), then the CuPy launcher's call description
    (``kernels_cupy.kernel(key).describe``) runs here on them, in the order ``kvdispatch.dispatch`` passes them
    (``specialised``: through the build for the call's specialisation, as the GPU launcher compiles one).
    Returns what the op returns."""
    signature = inspect.signature(op.public)
    describe = kernels_cupy.kernel(op.key).describe

    def public(*args, specialised=False, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        values = [bound.arguments[name] for name in op.parameters]
        op.check(**dict(zip(op.parameters, values)))
        tensors = [v for v in values if hasattr(v, "device")]
        if tensors and tensors[0].device.type != "cpu":
            raise ValueError(f"the host build runs on CPU tensors only, got {tensors[0].device}")
        run(describe(*values), specialised)
        return bound.arguments[op.outputs[0]]

    specialised = inspect.Parameter("specialised", inspect.Parameter.KEYWORD_ONLY, default=False)
    public.__signature__ = signature.replace(parameters=[*signature.parameters.values(), specialised])
    public.__name__ = public.__qualname__ = op.name
    return public


def kernel(key):
    """The host build's launcher of op ``key``, as a backend's ``kernel(key)`` is called: the op's parameters,
    validated, then ``pdl`` (ignored), positionally."""
    describe, count = kernels_cupy.kernel(key).describe, len(dispatch.OPS[key].parameters)

    def launch(*arguments, pdl=False):
        run(describe(*arguments[:count]))

    return launch


globals().update({op.name: _host_public(op) for op in dispatch.OPS.values()})
