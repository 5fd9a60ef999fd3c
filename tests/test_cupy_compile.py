"""kv_indices.cu compiles offline for NVIDIA (nvcc) and AMD (hipcc; clang-19 for gfx942) and stays within the
portable subset that NVRTC, hipRTC and the host shim all accept. Skips (with the reason) where a compiler is missing.
The default run compiles one case of each parametrized compilation; the cpu-exhaustive lane the others."""

import os
import re
import shutil
import subprocess
import tempfile

import pytest

from kernels_cupy import build


# Specialisations the CuPy launcher compiles (kernels_cupy.launch: KV_PAGE_SIZE and KV_FLAGS): a power of
# two with int64 indices and every option, a non-power of two with int32 indices, the page-1 copy; the DCP
# kernels' DCP sizes (KV_DCP_SIZE), a power of two and not.
SPECIALISATIONS = ((("KV_PAGE_SIZE", 64), ("KV_FLAGS", 127)), (("KV_PAGE_SIZE", 96), ("KV_FLAGS", 16)),
                   (("KV_PAGE_SIZE", 1), ("KV_FLAGS", 0)),
                   (("KV_PAGE_SIZE", 16), ("KV_DCP_SIZE", 4), ("KV_FLAGS", 2048 | 256 | 32 | 15)),
                   (("KV_PAGE_SIZE", 1), ("KV_DCP_SIZE", 3), ("KV_FLAGS", 16)))


def _compile_or_skip(function, arch, defines=()):
    try:
        return function(arch, defines)
    except build.ToolMissing as exc:
        pytest.skip(str(exc))


@pytest.mark.representative()
@pytest.mark.parametrize("arch", ("sm_90", "sm_100"))
def test_nvcc(arch):
    result = _compile_or_skip(build.compile_cuda, arch)
    assert result.output_bytes > 0
    assert set(result.registers) == set(build.KERNELS)
    assert set(re.findall(r"(\d+) bytes spill stores", result.log)) == {"0"}
    print(f"nvcc {arch}: {result.output_bytes} bytes, registers {result.registers}")


@pytest.mark.representative()
@pytest.mark.parametrize("defines", SPECIALISATIONS, ids=lambda d: "-".join(f"{k}{v}" for k, v in d))
def test_nvcc_specialisations(defines):
    result = _compile_or_skip(build.compile_cuda, "sm_90", defines)
    assert set(result.registers) == set(build.KERNELS)
    assert set(re.findall(r"(\d+) bytes spill stores", result.log)) == {"0"}


@pytest.mark.representative()
@pytest.mark.parametrize("defines", SPECIALISATIONS, ids=lambda d: "-".join(f"{k}{v}" for k, v in d))
def test_hipcc_specialisations(defines):
    result = _compile_or_skip(build.compile_hip, "gfx90a", defines)
    assert set(result.registers) == set(build.KERNELS)


@pytest.mark.exhaustive  # the compile-hip lane compiles the same targets
def test_hipcc_gfx90a():
    result = _compile_or_skip(build.compile_hip, "gfx90a")
    assert result.output_bytes > 0
    assert set(result.registers) == set(build.KERNELS)
    print(f"hipcc gfx90a: {result.output_bytes} bytes, VGPRs {result.registers}")


@pytest.mark.exhaustive  # the compile-hip lane compiles the same targets
@pytest.mark.parametrize("arch", [a for a in build.HIP_ARCHS if a != "gfx90a"])
def test_hipcc_newer_archs(arch):
    try:
        result = _compile_or_skip(build.compile_hip, arch)
    except build.UnsupportedArch:
        pytest.skip(f"the installed hipcc does not know {arch}")
    assert result.output_bytes > 0
    print(f"hipcc {arch}: {result.output_bytes} bytes, VGPRs {result.registers}")


@pytest.mark.exhaustive  # the compile-hip lane compiles the same targets
@pytest.mark.parametrize("arch", ("gfx942", "gfx950"))
def test_clang_hip(arch):
    try:
        result = _compile_or_skip(build.compile_hip_clang, arch)
    except build.UnsupportedArch:
        pytest.skip(f"the installed {build.HIP_CLANG} does not know {arch}")
    assert set(result.registers) == set(build.KERNELS)
    print(f"{build.HIP_CLANG} {arch}: {result.output_bytes} bytes of assembly, VGPRs {result.registers}")


@pytest.mark.exhaustive  # the compile-hip lane checks the same accesses
def test_clang_hip_page1_copy_is_wide():
    """The page-1 copy's 16-byte chunks compile to 16-byte global accesses on gfx942; a gather
    specialisation (page size 64, no fill) has none, so the check tells the two paths apart."""
    copy = _compile_or_skip(build.compile_hip_clang, "gfx942", SPECIALISATIONS[2])
    assert all(build.wide_global_accesses(copy.assembly, "kv_page_table").values())
    gather = _compile_or_skip(build.compile_hip_clang, "gfx942", (("KV_PAGE_SIZE", 64), ("KV_FLAGS", 0)))
    assert not any(build.wide_global_accesses(gather.assembly, "kv_page_table").values())


# The one block of inline assembly: programmatic dependent launch, compiled only with -DKV_PDL for NVIDIA sm_90+.
PDL_BLOCK = re.compile(r"#if defined\(KV_PDL\).*?#ifndef KV_GRID_WAIT", re.S)


def test_source_is_in_the_portable_subset():
    code = PDL_BLOCK.sub("", re.sub(r"//[^\n]*", "", build.source()))
    for construct in ("#include", "__shfl", "warpSize", "__ldg", "__forceinline__", "template", "int4",
                      "cooperative_groups", "asm", "atomic"):
        assert not re.search(rf"(?<!\w){re.escape(construct)}", code), construct
    # Shared memory and barriers live in the block sum alone (the host shim runs a block's threads as fibers that
    # meet at its barriers).
    block_sum = re.search(r"kv_u64 kv_block_sum\(.*?\n}\n", code, re.S).group(0)
    for construct in ("__shared__", "__syncthreads"):
        assert construct in block_sum and code.count(construct) == block_sum.count(construct), construct
    for name in build.KERNELS:
        assert re.search(rf'extern "C" __global__ void {name}\(', code)


def test_pdl_block_is_guarded_and_used_by_every_kernel():
    """The PDL instructions exist only under KV_PDL on NVIDIA sm_90+ (never HIP, never the host build), and every
    kernel waits before its first statement and releases after its last."""
    code = re.sub(r"//[^\n]*", "", build.source())
    block = PDL_BLOCK.search(code).group(0)
    assert "!defined(__HIP_PLATFORM_AMD__)" in block and "__CUDA_ARCH__ >= 900" in block
    assert re.findall(r'asm volatile\("([^"]*)"', code) == ["griddepcontrol.wait;",
                                                            "griddepcontrol.launch_dependents;"]
    for name in build.KERNELS:
        body = re.search(rf'__global__ void {name}\(.*?\) {{\n(.*?)\n}}\n', code, re.S).group(1)
        assert body.lstrip().startswith("KV_GRID_WAIT();") and body.rstrip().endswith("KV_GRID_RELEASE();"), name


def _ptx_entries(arch, defines):
    """``{kernel: PTX body}`` of ``nvcc -ptx`` for ``arch`` with ``defines`` (skips without nvcc)."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH")
    with tempfile.TemporaryDirectory() as tmp:
        output = os.path.join(tmp, "kv_indices.ptx")
        subprocess.run([nvcc, f"-arch={arch}", "-ptx", build.STD_FLAG, *build.define_flags(defines), "-o", output,
                        str(build.SOURCE_PATH)], check=True, capture_output=True)
        ptx = open(output).read()
    return dict(re.findall(r"\.entry (\w+)\((.*?)\n}", ptx, re.S))


@pytest.mark.representative()
@pytest.mark.parametrize("arch", ("sm_90", "sm_100"))
def test_nvcc_pdl_specialisation_has_the_grid_dependency_instructions(arch):
    entries = _ptx_entries(arch, (("KV_PAGE_SIZE", 64), ("KV_FLAGS", 0), ("KV_PDL", 1)))
    assert set(entries) == set(build.KERNELS)
    for name, body in entries.items():
        assert "griddepcontrol.wait" in body and "griddepcontrol.launch_dependents" in body, name


@pytest.mark.representative()
@pytest.mark.parametrize("arch, defines", (("sm_90", ()), ("sm_80", (("KV_PDL", 1),))))
def test_nvcc_without_pdl_has_no_grid_dependency_instructions(arch, defines):
    assert not any("griddepcontrol" in body for body in _ptx_entries(arch, defines).values())


def test_define_flags():
    assert build.define_flags((("KV_PAGE_SIZE", 64), ("KV_FLAGS", 5))) == ("-DKV_PAGE_SIZE=64", "-DKV_FLAGS=5")
    assert build.define_flags(()) == ()


def test_rtc_options_are_per_vendor():
    assert build.rtc_options("nvidia") == (build.STD_FLAG,)
    assert build.rtc_options("amd") == ()
