"""Experiment: the host µs of the public page-table call through the compiled path (kvdispatch/
host_path.c) against what bounds it, in interleaved rounds:

* ``x.add_(1)``, and a plain ``kernel[grid](...)`` of the 2-D baseline (the targets' references);
* the public API as shipped (its compiled path), and its Python path (the compiled entry unset);
* ``launch_raw``: cuLaunchKernel from C with the parameters given as ints (the floor of any launcher);
* ``native_launch_torch.cpp``: the same checks with the tensors read through ATen instead of their Python
  attributes (what linking against torch would buy), where a torch extension builds.

Written to decide whether to build the compiled path (its first version, at 47b76d6, did in its own C
what kvdispatch/host_path.c does now); each variant is checked against what the public API writes.

    PYTHONPATH=. python3 benchmarks/native_launch.py
"""

from __future__ import annotations

import ctypes
import importlib.util
import subprocess
import sysconfig
import tempfile
from pathlib import Path

import torch

import kvdispatch
from host_cost import host_case, host_us
from kernels_triton import launch
from kernels_triton import page_table as triton_page_table
from kvdispatch import dispatch, host_path
from kvdispatch.bench import baselines
from perf_probe import interleaved_rounds, print_medians


def build_module():
    source = Path(__file__).with_name("native_launch.c")
    target = Path(tempfile.mkdtemp()) / f"kv_native{sysconfig.get_config_var('EXT_SUFFIX')}"
    include = sysconfig.get_paths()["include"]
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", f"-I{include}", str(source), "-o", str(target)], check=True)
    spec = importlib.util.spec_from_file_location("kv_native", target)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_torch_module():
    """native_launch_torch.cpp as a torch extension, or None where it does not build."""
    import time  # noqa: PLC0415

    from torch.utils import cpp_extension  # noqa: PLC0415

    start = time.perf_counter()
    try:
        module = cpp_extension.load("kv_native_torch", [str(Path(__file__).with_name("native_launch_torch.cpp"))],
                                    extra_cflags=["-O2"], build_directory=tempfile.mkdtemp(), verbose=False)
    except Exception as exc:  # noqa: BLE001  (an experiment: report and go on)
        print(f"torch extension did not build: {type(exc).__name__}: {str(exc)[-400:]}")
        return None
    print(f"torch extension built in {time.perf_counter() - start:.1f} s")
    return module


def main() -> int:
    native = build_module()
    cuda = ctypes.CDLL("libcuda.so.1")
    native.init(ctypes.cast(cuda.cuLaunchKernel, ctypes.c_void_p).value)

    args, expected = host_case("triton")
    out = args[3]
    api = kvdispatch.create_flashmla_kv_indices
    api(*args, page_size=64)  # the plan exists: the next calls take the compiled path
    taken = host_path._module
    print(f"compiled launcher: {'loaded' if taken else host_path.failure()}")
    baselines.grid_2d(*args, 64)
    x = torch.zeros(16, device="cuda")

    compiled = next(iter(triton_page_table.launcher.compiled.values()))
    params = launch.native_parameter_count(compiled, len(triton_page_table.PARAMETERS))
    threads, shared = 32 * compiled.metadata.num_warps, compiled.metadata.shared
    geometry = kvdispatch.grid.page_table_launch(64, out.shape[1], 64)
    _, run_args = triton_page_table.plan_key_and_arguments(*args, 64)
    # The kernel's parameters, then Triton's two scratch pointers (null: it needs no scratch memory).
    ints = [a.data_ptr() if isinstance(a, torch.Tensor) else a for a in run_args] + [0, 0]
    print(f"params {params}, threads {threads}, shared {shared}, grid {geometry.grid}")

    def raw():
        return native.launch_raw(compiled.function, geometry.grid[0], geometry.grid[1], threads, shared,
                                 torch._C._cuda_getCurrentRawStream(0), *ints)

    def python_path():  # the public API with the compiled entry unset: checks, selection, Python launcher
        dispatch.fast_replay = None
        try:
            api(*args, page_size=64)
        finally:
            dispatch.fast_replay = entry

    entry = dispatch.fast_replay
    variants = [("launch_raw", raw), ("public API", lambda: api(*args, page_size=64)), ("Python path", python_path)]
    torch_native = build_torch_module()
    if torch_native is not None:
        torch_native.init(ctypes.cast(cuda.cuLaunchKernel, ctypes.c_void_p).value,
                          torch._C._cuda_getCurrentRawStream)
        items = kvdispatch.grid.items_per_program(kvdispatch.grid.PAGE_TABLE, 64)

        def aten():
            return torch_native.page_table(compiled.function, threads, shared, items, params, 64, *args)

        variants.append(("aten", aten))
    for name, fn in variants:
        out.fill_(-7)
        before = taken.launch_count() if taken else 0
        fn()
        torch.cuda.synchronize()
        print(f"{name}: correct {torch.equal(out, expected)}, "
              f"compiled launches {(taken.launch_count() if taken else 0) - before}")

    rows = {"x.add_(1)": lambda: x.add_(1),
            "public API (compiled path)": lambda: api(*args, page_size=64),
            "public API, Python path": python_path,
            "plain launch, 2-D baseline": lambda: baselines.grid_2d(*args, 64),
            "C: launch_raw (ints given)": raw,
            "raw stream query": lambda: torch._C._cuda_getCurrentRawStream(0)}
    if torch_native is not None:
        rows["C++: checks through ATen, launch"] = aten
    results = interleaved_rounds(rows, host_us, 3)
    print_medians(results, {"add_": "x.add_(1)", "plain": "plain launch, 2-D baseline"}, width=42, digits=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
