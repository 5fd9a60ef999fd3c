"""``import kvdispatch`` does no device work, so a process can import it and then fork workers that use the GPU.

Runs in a fresh interpreter: import and reset, check that no CUDA context exists, that neither Triton nor
CuPy nor any kernel module was imported (the backends' packages and their descriptors, ``backend.py``, may
be) and that Triton's driver is not initialised; then fork, and in the child build a page table and a token CSR
(on CUDA tensors when there is a GPU: this only works because the parent never initialised CUDA; on CPU with the
torch backend). The parent process never asks CUDA anything: ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` keeps even
``torch.cuda.is_available()`` from initialising the driver, and whether there is a GPU comes from pytest.

The ``kvdispatch`` commands other than ``bench`` import neither the bench nor its Triton baselines, nor Triton
or a kernel module (the probe asks only whether Triton is installed); ``bench --help`` imports the bench alone.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import HAS_GPU

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import os, sys, traceback

import torch

# What import kvdispatch must not import: the runtimes and the kernel modules (not the packages, which hold
# the descriptors). Anything torch itself imported is not kvdispatch's doing.
FORBIDDEN = ("triton", "cupy", "kernels_triton.page_table", "kernels_triton.token_csr", "kernels_triton.launch",
             "kernels_triton.native", "kernels_triton.crosscompile", "kernels_cupy.runtime", "kernels_cupy.launch",
             "kernels_cupy.native", "kvdispatch.host_path")
before = set(sys.modules)

from kvdispatch import ops
import kvdispatch
import kvdispatch.dispatch, kvdispatch.devices, kvdispatch.grid, kvdispatch.ops, kvdispatch.reference

kvdispatch.reset()  # tells only loaded backends: imports no kernels

problems = []
if torch.cuda.is_initialized():
    problems.append("torch.cuda is initialised")
for name in FORBIDDEN:
    if name in sys.modules and name not in before:
        problems.append(f"{name} was imported")
if "triton" in sys.modules:
    try:
        from triton.runtime.driver import driver as triton_driver
    except ImportError:
        triton_driver = None
    if triton_driver is not None and (getattr(triton_driver, "_default", None) is not None
                                      or getattr(triton_driver, "_active", None) is not None):
        problems.append("Triton's driver was initialised")
if kvdispatch.devices._cache or kvdispatch.dispatch.selector._chosen:
    problems.append("a device was probed or a backend selected at import")
if problems:
    print("import kvdispatch did too much:", "; ".join(problems), file=sys.stderr)
    sys.exit(3)

device = sys.argv[1]


def build():
    g = torch.Generator().manual_seed(1234)
    rows, cols, page = 7, 300, 16
    table = torch.randperm(rows * cols, generator=g).to(torch.int32).view(rows, cols) + 1000
    pool = torch.tensor([4, 0, 6], dtype=torch.int32)
    lens = torch.tensor([290, 1, 37], dtype=torch.int32)
    out = torch.full((3, 20), -7, dtype=torch.int32)
    expected = out.clone()
    ops.page_table.reference(table, pool, lens, expected, page)
    t = [x.to(device) for x in (table, pool, lens, out)]
    kvdispatch.create_flashmla_kv_indices(*t, page_size=page)
    assert torch.equal(t[3].cpu(), expected), "page table mismatch"
    indptr = torch.tensor([0, 290, 291, 328], dtype=torch.int32)
    flat = torch.full((330,), -7, dtype=torch.int32)
    flat_expected = flat.clone()
    ops.token_csr.reference(table, pool, lens, indptr, flat_expected)
    t = [x.to(device) for x in (table, pool, lens, indptr, flat)]
    kvdispatch.create_flashinfer_kv_indices(*t)
    assert torch.equal(t[4].cpu(), flat_expected), "token CSR mismatch"
    return kvdispatch.select_backend(device)


pid = os.fork()
if pid == 0:
    code = 0
    try:
        print("child served by", build(), flush=True)
    except BaseException:
        traceback.print_exc()
        code = 4
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
_, status = os.waitpid(pid, 0)
code = os.waitstatus_to_exitcode(status)
if code:
    print(f"forked child failed with {code}", file=sys.stderr)
    sys.exit(code)
# The parent can still use the device after its child did.
print("parent served by", build(), flush=True)
"""


def _run(device, extra_env=None):
    env = dict(os.environ, PYTORCH_NVML_BASED_CUDA_CHECK="1", PYTHONPATH=str(ROOT))
    env.pop("KVDISPATCH_DEBUG", None)
    env.update(extra_env or {})
    return subprocess.run([sys.executable, "-W", "ignore::DeprecationWarning", "-c", SCRIPT, device], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_import_does_no_device_work_and_fork_works():
    device = "cuda" if HAS_GPU else "cpu"
    result = _run(device)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "child served by" in result.stdout and "parent served by" in result.stdout


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_import_leaves_cuda_alone_on_cpu_with_the_torch_backend():
    result = _run("cpu", {"KVDISPATCH_BACKEND": "torch"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "child served by torch" in result.stdout



CLI_SCRIPT = r"""
import contextlib, io, json, sys

from kvdispatch import cli

with contextlib.redirect_stdout(io.StringIO()) as out:
    try:
        status = cli.main(json.loads(sys.argv[1]))
    except SystemExit as exit_:  # --version, --help
        status = exit_.code
print(json.dumps({"status": status, "out": out.getvalue(), "modules": sorted(sys.modules)}))
"""

# Imported by no command but bench: the bench, its baselines (Triton kernels), Triton and every kernel module.
BENCH_MODULES = ("kvdispatch.bench", "kvdispatch.bench.core", "kvdispatch.bench.pdl")
NOT_FOR_COMMANDS = ("kvdispatch.bench.baselines", "triton", "kernels_triton.page_table", "kernels_triton.token_csr",
                    "kernels_triton.mapped_tables", "kernels_triton.draft_decode", "kernels_triton.dcp",
                    "kernels_triton.launch", "kernels_triton.native", "kernels_triton.crosscompile",
                    "kernels_cupy.launch", "kernels_cupy.native", "kvdispatch.host_path")


def _run_cli(argv):
    """``kvdispatch ARGV`` in a fresh interpreter (the torch backend, which imports no kernel module, for the
    demo's build): its exit status, its output and the modules it left imported."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), KVDISPATCH_BACKEND="torch")
    env.pop("KVDISPATCH_DEBUG", None)
    result = subprocess.run([sys.executable, "-W", "ignore::DeprecationWarning", "-c", CLI_SCRIPT, json.dumps(argv)],
                            env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout.splitlines()[-1])


@pytest.mark.representative()
@pytest.mark.parametrize("argv", [["demo", "--device", "cpu"], ["--version"], ["info"], ["info", "--json"]])
def test_commands_but_bench_import_no_bench_triton_or_kernels(argv):
    run = _run_cli(argv)
    assert run["status"] == 0, run["out"]
    assert run["out"]
    imported = set(run["modules"]) & set(BENCH_MODULES + NOT_FOR_COMMANDS)
    assert not imported, f"kvdispatch {' '.join(argv)} imported {sorted(imported)}"


def test_bench_help_imports_the_bench_only():
    run = _run_cli(["bench", "--help"])
    assert run["status"] == 0
    assert "--cases" in run["out"] and "--device" in run["out"] and "Columns (one row per case" in run["out"]
    assert "kvdispatch.bench" in run["modules"]
    imported = set(run["modules"]) & set(NOT_FOR_COMMANDS)
    assert not imported, f"kvdispatch bench --help imported {sorted(imported)}"
