"""Run one lane of ci/lanes.toml and print one summary line: ``lane-NAME: N passed, M failed``.

Exit status is non-zero on any failure, on a missing tool (with what to install), and when a lane ran
nothing. GPU lanes first check that the runner has the GPU the lane is for (``KVDISPATCH_EXPECT_ARCH``,
e.g. ``sm_90``, set by the workflow) and fail loudly on the wrong machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LANES = tomllib.loads((ROOT / "ci" / "lanes.toml").read_text())


class LaneError(RuntimeError):
    pass


def _require_tools(name, lane):
    for tool in lane.get("needs", []):
        if not shutil.which(tool) and "install" in lane and os.geteuid() == 0:
            print(f"+ {lane['install']}  ({tool} is missing)", flush=True)
            subprocess.call("apt-get update -qq && " + lane["install"], shell=True, stdout=subprocess.DEVNULL)
        if shutil.which(tool):
            continue
        hint = lane.get("install", {"g++": "apt-get install -y g++", "nvcc": "install the CUDA toolkit (nvcc)",
                                    "compute-sanitizer": "install the CUDA toolkit (compute-sanitizer)"}.get(tool))
        raise LaneError(f"lane {name} needs {tool!r}, which is not on PATH; install it: {hint or tool}")


def _pytest(args, env=None, python=sys.executable, skips_fail=False) -> tuple[int, int]:
    """Run pytest; returns (passed, failed) from its JUnit report (errors count as failures; with
    ``skips_fail``, skipped tests too)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.xml"
        command = [python, "-m", "pytest", "-q", f"--junitxml={report}", *args]
        print("+", " ".join(command), flush=True)
        code = subprocess.call(command, cwd=ROOT, env={**os.environ, **(env or {})})
        if not report.exists():
            return 0, 1
        suite = ET.parse(report).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        total, skipped = int(suite.get("tests")), int(suite.get("skipped"))
        failed = int(suite.get("failures")) + int(suite.get("errors"))
        passed = total - skipped - failed
        if skips_fail and skipped:
            print(f"{skipped} tests skipped, which this lane does not allow", flush=True)
            failed += skipped
        if code not in (0, 1) and failed == 0:  # interrupted, internal error, or no tests collected
            failed = 1
        return passed, failed


def run_pytest_lane(name, lane):
    return _pytest(lane["args"])


# tests/cuda_host.py's variable of more compiler options for the host build (checked equal by a test).
HOST_BUILD_FLAGS_ENV = "CUDA_HOST_CXXFLAGS"


def run_pytest_asan_lane(name, lane):
    """pytest with the host build of the CUDA source (``tests/cuda_host.py``) compiled under AddressSanitizer, its
    runtime preloaded (Python is not built with it; libstdc++ too, so that C++ exceptions thrown by PyTorch pass
    its interceptor): a kernel's access outside an allocation stops the run, and the sanitizer's report is
    printed."""
    compiler = shutil.which(os.environ.get("CXX", "g++")) or "g++"
    runtime = [subprocess.check_output([compiler, f"-print-file-name={library}"], text=True).strip()
               for library in ("libasan.so", "libstdc++.so")]
    if not all(os.path.isabs(path) for path in runtime):
        raise LaneError(f"lane {name} needs AddressSanitizer's runtime (libasan), which {compiler} does not have")
    with tempfile.TemporaryDirectory() as tmp:
        env = {HOST_BUILD_FLAGS_ENV: "-fsanitize=address -fno-omit-frame-pointer", "LD_PRELOAD": " ".join(runtime),
               "ASAN_OPTIONS": f"detect_leaks=0:halt_on_error=1:log_path={tmp}/asan"}
        passed, failed = _pytest(lane["args"], env)
        # The runtime also logs a warning that it supports swapcontext only in part: the host build's barriers
        # switch fibers through it, annotated for the sanitizer, so only a report of an error counts.
        errors = 0
        for report in sorted(Path(tmp).glob("asan*")):
            text = report.read_text()
            print(text, flush=True)
            errors += "ERROR: AddressSanitizer" in text
        return passed, max(failed, errors)


def run_pytest_venv_lane(name, lane):
    """pytest in a virtual environment that sees this one's packages, with ``packages`` installed over them
    (another Triton version, say)."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.check_call([sys.executable, "-m", "venv", "--system-site-packages", tmp])
        python = str(Path(tmp) / "bin" / "python")
        install = [python, "-m", "pip", "install", "-q", "--no-deps", *lane["packages"]]
        print("+", " ".join(install), flush=True)
        if subprocess.call(install) != 0:
            raise LaneError(f"lane {name} could not install {' '.join(lane['packages'])}")
        subprocess.call([python, "-c", "import torch, triton; print('torch', torch.__version__, 'triton', "
                         "triton.__version__)"])
        return _pytest(lane["args"], python=python)


def run_pytest_sglang_release_lane(name, lane):
    """pytest with ``SGLANG_SOURCE`` at the unpacked wheel of ``release`` (``pip download --no-deps``: the
    tests read its source and load its kernels' modules by path; nothing of it is installed)."""
    with tempfile.TemporaryDirectory() as tmp:
        download = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    *lane.get("wheel", []), "-d", tmp, lane["release"]]
        print("+", " ".join(download), flush=True)
        wheels = list(Path(tmp).glob("*.whl")) if subprocess.call(download) == 0 else []
        if len(wheels) != 1:
            raise LaneError(f"lane {name} could not download the wheel of {lane['release']} (pip needs the index)")
        source = Path(tmp) / "source"
        with zipfile.ZipFile(wheels[0]) as wheel:
            wheel.extractall(source)
        if not (source / "sglang").is_dir():
            raise LaneError(f"{wheels[0].name} holds no sglang package")
        return _pytest(lane["args"], env={"SGLANG_SOURCE": str(source)}, skips_fail=True)


def _compile_source(compile_one, targets, optional_targets=()):
    from kernels_cupy import build

    passed = failed = 0
    for arch in [*targets, *optional_targets]:
        try:
            result = compile_one(arch)
        except build.UnsupportedArch as exc:
            if arch in optional_targets:
                reason = next((line for line in str(exc).splitlines() if "error" in line), str(exc))
                print(f"  {arch}: skipped, this compiler does not know it: {reason.strip()[:120]}")
                continue
            print(f"  {arch}: FAILED: {exc}")
            failed += 1
            continue
        except build.ToolMissing as exc:
            raise LaneError(str(exc)) from exc
        except Exception as exc:
            print(f"  {arch}: FAILED: {exc}")
            failed += 1
            continue
        passed += 1
        print(f"  {arch}: {result.compiler} ok, {result.output_bytes} B, registers {result.registers}", flush=True)
    return passed, failed


def run_compile_cuda(name, lane):
    from kernels_cupy import build

    return _compile_source(build.compile_cuda, lane["targets"])


def run_compile_hip(name, lane):
    """hipcc for ``targets`` (``optional_targets`` where it knows them), then ``clang`` in HIP mode for
    ``clang_targets`` (``clang_optional_targets`` likewise), each followed by the page-1 ISA check."""
    from kernels_cupy import build

    passed, failed = _compile_source(build.compile_hip, lane["targets"], lane.get("optional_targets", []))
    clang = lane.get("clang", build.HIP_CLANG)
    compiled = []

    def compile_with_clang(arch):
        result = build.compile_hip_clang(arch, clang=clang)
        compiled.append(arch)
        return result

    p, f = _compile_source(compile_with_clang, lane.get("clang_targets", []), lane.get("clang_optional_targets", []))
    passed, failed = passed + p, failed + f
    for arch in compiled:
        ok = _check_page1_wide_accesses(arch, clang)
        passed, failed = passed + ok, failed + (not ok)
    return passed, failed


def _check_page1_wide_accesses(arch, clang) -> bool:
    """The page-table kernel's page-1 copy (``KV_PAGE_SIZE=1``, no options) moves 16-byte chunks: its
    ``arch`` assembly has every one of ``build.WIDE_GLOBAL_ACCESSES``. Prints the counts found."""
    from kernels_cupy import build

    defines = (("KV_PAGE_SIZE", 1), ("KV_FLAGS", 0))
    try:
        result = build.compile_hip_clang(arch, defines, clang=clang)
    except Exception as exc:
        print(f"  {arch} page-1 ISA: FAILED to compile: {exc}")
        return False
    found = build.wide_global_accesses(result.assembly, "kv_page_table")
    ok = all(found.values())
    print(f"  {arch} page-1 ISA (kv_page_table, {clang}): "
          f"{', '.join(f'{op} x{count}' for op, count in found.items())}: {'ok' if ok else 'FAILED, missing'}",
          flush=True)
    return ok


def run_gpu(name, lane):
    import torch

    import kvdispatch

    if not torch.cuda.is_available():
        raise LaneError(f"lane {name} needs a {lane['gpu']} GPU and this machine has none")
    info = kvdispatch.probe()
    expected = os.environ.get("KVDISPATCH_EXPECT_ARCH")
    if info.vendor != lane["gpu"] or (expected and info.arch != expected):
        raise LaneError(f"lane {name} expects a {lane['gpu']} GPU {expected or ''} and found "
                        f"{info.vendor} {info.arch} ({info.name}): wrong runner")
    print(f"lane {name}: {info.name}, {info.arch} ({info.family}), {info.multiprocessors} multiprocessors")
    # the suite once per backend, one after the other: suites sharing one GPU, or sharing it with memcheck,
    # slow each other down several times over (each process's kernels wait for the others' contexts)
    passed = failed = 0
    for backend in lane["backends"]:
        p, f = _pytest(["tests", "-p", "no:cacheprovider"], env={"KVDISPATCH_BACKEND": backend})
        print(f"  backend {backend}: {p} passed, {f} failed", flush=True)
        passed, failed = passed + p, failed + f
    # then memcheck over the hostile data, its parts as concurrent processes (mostly host work)
    ok = _hostile_data(lane)
    passed, failed = passed + ok, failed + (not ok)
    command = [sys.executable, "-m", "kvdispatch", "bench", "--quick"]
    print("+", " ".join(command), flush=True)
    ok = subprocess.call(command, cwd=ROOT) == 0
    return passed + ok, failed + (not ok)


def _hostile_data(lane) -> bool:
    """``ci/sanitize_hostile.py`` per backend (under compute-sanitizer on NVIDIA), each backend's cases in
    ``lane['hostile_shards']`` interleaved parts, all as concurrent processes. Prints each one's summary (and the
    end of its log when it failed); True when every one exited cleanly."""
    wrap = ["compute-sanitizer", "--tool", "memcheck", "--error-exitcode", "1"] if lane["gpu"] == "nvidia" else []
    started = []
    for backend in lane["backends"]:
        shards = lane.get("hostile_shards", {}).get(backend, 1)
        for k in range(1, shards + 1):
            command = [*wrap, sys.executable, "ci/sanitize_hostile.py", "--backend", backend, "--shard",
                       f"{k}/{shards}"]
            print("+", " ".join(command), flush=True)
            log = tempfile.TemporaryFile(mode="w+")
            started.append((command, subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT), log))
    ok = True
    for command, process, log in started:
        status = process.wait()
        log.seek(0)
        text = log.read()
        summary = "; ".join(line for line in text.splitlines() if " cases, " in line or "ERROR SUMMARY" in line)
        print(f"  {' '.join(command[-4:])}: exit {status}; {summary}", flush=True)
        if status != 0:
            ok = False
            print(text[-4000:], flush=True)
    return ok


RUNNERS = {"pytest": run_pytest_lane, "pytest-asan": run_pytest_asan_lane, "pytest-venv": run_pytest_venv_lane,
           "pytest-sglang-release": run_pytest_sglang_release_lane,
           "compile-cuda": run_compile_cuda, "compile-hip": run_compile_hip, "gpu": run_gpu}


def main(argv) -> int:
    if len(argv) != 1 or argv[0] not in LANES:
        print(f"usage: ci/run-lane LANE, with LANE one of: {', '.join(LANES)}", file=sys.stderr)
        return 2
    name = argv[0]
    lane = LANES[name]
    print(f"lane {name}: {lane['describe']}", flush=True)
    try:
        _require_tools(name, lane)
        passed, failed = RUNNERS[lane["kind"]](name, lane)
    except LaneError as exc:
        print(f"lane {name} FAILED: {exc}", file=sys.stderr)
        passed, failed = 0, 1
    if passed + failed == 0:
        print(f"lane {name} FAILED: it ran nothing", file=sys.stderr)
        failed = 1
    print(f"lane-{name}: {passed} passed, {failed} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main(sys.argv[1:]))
