"""The kernel source, what one call of its kernels is (``KernelCall``), and every way it is compiled:
NVRTC/hipRTC options, nvcc, hipcc and clang (HIP) offline checks.

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
from typing import NamedTuple

SOURCE_PATH = Path(__file__).with_name("kv_indices.cu")
PAGE_TABLE_KERNEL = "kv_page_table"
TOKEN_CSR_KERNEL = "kv_token_csr"
MHA_PAGE_TABLE_KERNEL = "kv_mha_page_table"
TRANSLATED_PAGE_TABLE_KERNEL = "kv_translated_page_table"
DRAFT_DECODE_KERNEL = "kv_draft_decode"
DCP_TOKEN_CSR_KERNEL = "kv_dcp_token_csr"
DCP_PAGE_TABLE_KERNEL = "kv_dcp_page_table"
DECODE_METADATA_KERNEL = "kv_decode_metadata"
CACHE_LOCS_KERNEL = "kv_cache_locs"
COMPACT_DRAFT_ROWS_KERNEL = "kv_compact_draft_rows"
KERNELS = (PAGE_TABLE_KERNEL, TOKEN_CSR_KERNEL, MHA_PAGE_TABLE_KERNEL, TRANSLATED_PAGE_TABLE_KERNEL,
           DRAFT_DECODE_KERNEL, DCP_TOKEN_CSR_KERNEL, DCP_PAGE_TABLE_KERNEL, DECODE_METADATA_KERNEL,
           CACHE_LOCS_KERNEL, COMPACT_DRAFT_ROWS_KERNEL)
STD_FLAG = "-std=c++14"
# Architectures the offline HIP check tries; those the installed hipcc does not know are reported.
HIP_ARCHS = ("gfx90a", "gfx940", "gfx942", "gfx950")
# A newer clang than hipcc's, in HIP mode over the installed HIP headers, for the CDNA3/CDNA4 targets.
HIP_CLANG = "clang-19"
# The 16-byte global accesses the page-1 copy (kv_copy's kv_vec4 chunks) must compile to on AMD.
WIDE_GLOBAL_ACCESSES = ("global_load_dwordx4", "global_store_dwordx4")


class KernelCall(NamedTuple):
    """One launch of a kernel of the source: built by ``launch.py``, run by ``runtime.py`` (or the host build),
    registered with the compiled host path by ``native.py``."""

    kernel: str
    defines: tuple  # ((macro, value), ...): the compile-time specialisation, e.g. KV_PAGE_SIZE and KV_FLAGS
    grid: tuple  # (x, y, z): kvdispatch.grid.Launch.grid
    threads: int
    args: tuple
    pdl: bool = False  # programmatic dependent launch: KV_PDL is among the defines (``launch.with_pdl``)
    pointers: tuple = ()  # ((parameter index, tensor), ...): the parameters that are these tensors' addresses


@functools.lru_cache(maxsize=None)
def source() -> str:
    """The CUDA/HIP source text (read once)."""
    return SOURCE_PATH.read_text()


def rtc_options(vendor: str) -> tuple[str, ...]:
    """Options for CuPy's RawModule: NVRTC gets the standard flag; hipRTC gets none (its default is
    C++14 and its option parser is the less predictable one; the source needs nothing past C++11)."""
    return (STD_FLAG,) if vendor == "nvidia" else ()


def define_flags(defines: tuple) -> tuple[str, ...]:
    """``-DNAME=value`` per ``(name, value)`` of a specialisation (``KernelCall.defines``)."""
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
    assembly: str = ""  # the device assembly, where the compilation emitted it


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
    return CompileResult("hipcc", arch, size, _vgprs(log), log)


def _vgprs(log: str) -> dict:
    """``{kernel: VGPRs}`` from clang's kernel-resource-usage remarks."""
    return {kernel: int(count) for kernel, count in re.findall(r"Function Name: (\w+).*?VGPRs: (\d+)", log, re.S)}


def compile_hip_clang(arch: str = "gfx942", defines: tuple = (), clang: str = HIP_CLANG) -> CompileResult:
    """``clang -x hip --offload-arch=<arch> --cuda-device-only -nogpulib -S`` over the installed HIP headers
    (with the specialisation ``defines``): the device assembly, kept in the result. ``-nogpulib``: the
    kernels call nothing from the ROCm device libraries, whose installed version may predate ``arch``.
    VGPRs from clang's kernel-resource-usage remarks."""
    compiler = _require(clang)
    with tempfile.TemporaryDirectory() as tmp:
        output = os.path.join(tmp, "kv_indices.s")
        log = _run([compiler, "-x", "hip", f"--offload-arch={arch}", "--cuda-device-only", "-nogpulib", "-O3",
                    STD_FLAG, *define_flags(defines), "-include", "hip/hip_runtime.h",
                    "-Rpass-analysis=kernel-resource-usage", "-S", "-o", output, str(SOURCE_PATH)])
        assembly = Path(output).read_text()
    return CompileResult(clang, arch, len(assembly.encode()), _vgprs(log), log, assembly)


def wide_global_accesses(assembly: str, kernel: str) -> dict:
    """``{instruction: count}`` of ``WIDE_GLOBAL_ACCESSES`` in ``kernel``'s body of an AMDGPU assembly
    listing (from its label to its ``.size`` directive); zero counts included."""
    body = re.search(rf"^{kernel}:(.*?)^\s*\.size\s+{kernel},", assembly, re.S | re.M)
    text = body.group(1) if body else ""
    return {op: len(re.findall(rf"\b{op}\b", text)) for op in WIDE_GLOBAL_ACCESSES}
