"""The kernel source and every way it is compiled: NVRTC/hipRTC options, nvcc and hipcc offline checks.

Every path compiles the same file; the macros are those of a specialisation (``KV_PAGE_SIZE``, ``KV_FLAGS``)
or none (the generic kernels, runtime page size and flags). Only the language standard flag and hipcc's
forced ``hip_runtime.h`` (which hipRTC provides implicitly) differ by toolchain.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

SOURCE_PATH = Path(__file__).with_name("kv_indices.cu")
PAGE_TABLE_KERNEL = "kv_page_table"
TOKEN_CSR_KERNEL = "kv_token_csr"
KERNELS = (PAGE_TABLE_KERNEL, TOKEN_CSR_KERNEL)
STD_FLAG = "-std=c++14"
# Architectures the offline HIP check tries; those the installed hipcc does not know are reported.
HIP_ARCHS = ("gfx90a", "gfx940", "gfx942", "gfx950")


@functools.lru_cache(maxsize=None)
def source() -> str:
    """The CUDA/HIP source text (read once)."""
    return SOURCE_PATH.read_text()


def rtc_options(vendor: str) -> tuple[str, ...]:
    """Options for CuPy's RawModule: NVRTC gets the standard flag; hipRTC gets none (its default is
    C++14 and its option parser is the less predictable one; the source needs nothing past C++11)."""
    return (STD_FLAG,) if vendor == "nvidia" else ()


def define_flags(defines: tuple) -> tuple[str, ...]:
    """``-DNAME=value`` per ``(name, value)`` of a specialisation (``kernels_cupy.launch.KernelCall.defines``)."""
    return tuple(f"-D{name}={value}" for name, value in defines)


@dataclass(frozen=True)
class CompileResult:
    """One offline compilation: the output file size and, where the compiler reports it, registers per
    kernel (``{kernel: registers}``; VGPRs for AMD)."""

    compiler: str
    arch: str
    output_bytes: int
    registers: dict
    log: str


class ToolMissing(RuntimeError):
    """The compiler is not installed here."""


class UnsupportedArch(RuntimeError):
    """The installed compiler does not know the architecture (or has no device library for it)."""


_UNSUPPORTED = ("invalid target ID", "cannot find ROCm device library", "Unsupported gpu architecture",
                "is not a recognized processor")


def _run(command: list[str], env=None) -> str:
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    log = done.stdout + done.stderr
    if done.returncode != 0:
        error = UnsupportedArch if any(marker in log for marker in _UNSUPPORTED) else RuntimeError
        raise error(f"{' '.join(command)} failed ({done.returncode}):\n{log}")
    return log


def _require(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise ToolMissing(f"{tool} is not on PATH")
    return path


def compile_cuda(arch: str = "sm_90", defines: tuple = ()) -> CompileResult:
    """``nvcc -arch=<arch> -cubin`` (with the specialisation ``defines``); registers from ``-Xptxas -v``."""
    nvcc = _require("nvcc")
    with tempfile.TemporaryDirectory() as tmp:
        output = os.path.join(tmp, "kv_indices.cubin")
        log = _run([nvcc, f"-arch={arch}", "-cubin", STD_FLAG, *define_flags(defines), "-Xptxas", "-v", "-o", output,
                    str(SOURCE_PATH)])
        size = os.path.getsize(output)
    registers = {}
    for kernel, count in re.findall(r"Compiling entry function '(\w+)'.*?Used (\d+) registers", log, re.S):
        registers[kernel] = int(count)
    return CompileResult("nvcc", arch, size, registers, log)


def compile_hip(arch: str = "gfx90a", defines: tuple = ()) -> CompileResult:
    """``HIP_PLATFORM=amd hipcc --offload-arch=<arch> --cuda-device-only -c`` (with the specialisation
    ``defines``); VGPRs from clang's kernel-resource-usage remarks."""
    hipcc = _require("hipcc")
    env = dict(os.environ, HIP_PLATFORM="amd")
    with tempfile.TemporaryDirectory() as tmp:
        output = os.path.join(tmp, "kv_indices.o")
        log = _run([hipcc, f"--offload-arch={arch}", "--cuda-device-only", "-O3", STD_FLAG, *define_flags(defines),
                    "-include", "hip/hip_runtime.h", "-Rpass-analysis=kernel-resource-usage",
                    "-c", "-o", output, str(SOURCE_PATH)], env=env)
        size = os.path.getsize(output)
    registers = {}
    for kernel, count in re.findall(r"Function Name: (\w+).*?VGPRs: (\d+)", log, re.S):
        registers[kernel] = int(count)
    return CompileResult("hipcc", arch, size, registers, log)
