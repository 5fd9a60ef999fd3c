"""Experiment (not shipped): the host µs of a page-table call whose checks, packing and launch are in C.

The host target (one public-API call <= 1.0x ``x.add_(1)``) is out of reach of any Python path: Triton's
C launch function alone costs ~0.75x ``add_`` on the H200's host. This builds ``native_launch.c`` (Python
C API only, cuLaunchKernel's address from ctypes) with the C compiler Triton itself uses, checks that both of
its launches write what the public API writes, and times, in interleaved rounds:

* ``x.add_(1)``, the public API (triton), a plain ``kernel[grid](...)`` of the 2-D baseline;
* ``launch_raw``: cuLaunchKernel from C with the parameters given as ints (the floor of any launcher);
* ``page_table``: the validator's attribute reads, the packing, the stream query and the launch, all in C.

    PYTHONPATH=. python3 ci/perf_notes/native_launch.py
"""

from __future__ import annotations

import ctypes
import importlib.util
import re
import statistics
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "ci"))
import kvdispatch  # noqa: E402
from host_cost import host_case, host_us  # noqa: E402
from kernels_triton import page_table as triton_page_table  # noqa: E402
from kvdispatch import _baselines  # noqa: E402


def build_module():
    source = Path(__file__).with_name("native_launch.c")
    target = Path(tempfile.mkdtemp()) / f"kv_native{sysconfig.get_config_var('EXT_SUFFIX')}"
    include = sysconfig.get_paths()["include"]
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", f"-I{include}", str(source), "-o", str(target)], check=True)
    spec = importlib.util.spec_from_file_location("kv_native", target)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> int:
    native = build_module()
    cuda = ctypes.CDLL("libcuda.so.1")
    native.init(ctypes.cast(cuda.cuLaunchKernel, ctypes.c_void_p).value, torch._C._cuda_getCurrentRawStream,
                torch.int32, torch.int64)

    args, expected = host_case("triton")
    out = args[3]
    api = kvdispatch.create_flashmla_kv_indices
    _baselines.grid_2d(*args, 64)
    x = torch.zeros(16, device="cuda")

    compiled = next(iter(triton_page_table.launcher.compiled.values()))
    entry = compiled.asm["ptx"].split(".entry", 1)[1].split(")", 1)[0]
    params = re.findall(r"\.param\s+\.(\w+)", entry)
    assert all(p in ("u64", "b64", "s64") for p in params), params  # every parameter 8 bytes wide
    threads, shared = 32 * compiled.metadata.num_warps, compiled.metadata.shared
    items = kvdispatch.grid.items_per_program(kvdispatch.grid.PAGE_TABLE, 64)
    geometry = kvdispatch.grid.page_table_launch(64, out.shape[1], 64)
    table, pool, lens = args[:3]
    ints = [table.data_ptr(), pool.data_ptr(), lens.data_ptr(), table.data_ptr(), out.data_ptr(), out.data_ptr(),
            1, 1, 1, table.shape[0], table.shape[1], table.stride(0), out.shape[1], out.stride(0), 0, 0, 0]
    ints += [0] * (len(params) - len(ints))
    print(f"params {len(params)}, threads {threads}, shared {shared}, grid {geometry.grid}")

    def raw():
        return native.launch_raw(compiled.function, geometry.grid[0], geometry.grid[1], threads, shared,
                                 torch._C._cuda_getCurrentRawStream(0), *ints)

    def full():
        return native.page_table(compiled.function, threads, shared, items, len(params), *args)

    for name, fn in (("launch_raw", raw), ("page_table", full)):
        out.fill_(-7)
        result = fn()
        torch.cuda.synchronize()
        print(f"{name}: returned {result if isinstance(result, int) else type(result).__name__}, "
              f"correct {torch.equal(out, expected)}")

    rows = {"x.add_(1)": lambda: x.add_(1),
            "public API, triton": lambda: api(*args, page_size=64, backend="triton"),
            "plain launch, 2-D baseline": lambda: _baselines.grid_2d(*args, 64),
            "C: launch_raw (ints given)": raw,
            "C: page_table (checks, packing, launch)": full,
            "raw stream query": lambda: torch._C._cuda_getCurrentRawStream(0)}
    results = {name: [] for name in rows}
    for _ in range(3):
        for name, fn in rows.items():
            results[name].append(host_us(fn))
    add = statistics.median(results["x.add_(1)"])
    plain = statistics.median(results["plain launch, 2-D baseline"])
    for name, values in results.items():
        m = statistics.median(values)
        print(f"  {name:42} {m:6.2f} us  /add_ {m / add:5.2f}  /plain {m / plain:5.2f}  "
              f"(rounds {' '.join(f'{v:.2f}' for v in values)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
