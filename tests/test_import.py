"""``import kvdispatch`` does no device work, so a process can import it and then fork workers that use the GPU.

Runs in a fresh interpreter: import and reset, check that no CUDA context exists, that neither Triton nor
CuPy nor any kernel module was imported (the backends' packages and their descriptors, ``backend.py``, may
be) and that Triton's driver is not initialised; then fork, and in the child build both index tables (on CUDA tensors when there
is a GPU: this only works because the parent never initialised CUDA; on CPU with the torch backend).
The parent process never asks CUDA anything: ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` keeps even
``torch.cuda.is_available()`` from initialising the driver, and whether there is a GPU comes from pytest.
"""

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

import kvdispatch
import kvdispatch.api, kvdispatch.dispatch, kvdispatch.devices, kvdispatch.grid, kvdispatch.reference

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
    kvdispatch.reference.build_page_table(table, pool, lens, expected, page)
    t = [x.to(device) for x in (table, pool, lens, out)]
    kvdispatch.create_flashmla_kv_indices(*t, page_size=page)
    assert torch.equal(t[3].cpu(), expected), "page table mismatch"
    indptr = torch.tensor([0, 290, 291, 328], dtype=torch.int32)
    flat = torch.full((330,), -7, dtype=torch.int32)
    flat_expected = flat.clone()
    kvdispatch.reference.build_token_indices(table, pool, lens, indptr, flat_expected)
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

