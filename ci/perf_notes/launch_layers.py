"""Host µs of each layer under one Triton launch, same run (session 2): is a launch below
``CompiledKernel.run`` worth it?

    PYTHONPATH=. python3 ci/perf_notes/launch_layers.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "ci"))
import kvdispatch  # noqa: E402
from host_cost import host_us  # noqa: E402
from kernels_triton import page_table  # noqa: E402
from kvcases import make_case  # noqa: E402
from kvdispatch import _baselines, _validate  # noqa: E402


def main() -> int:
    case = make_case(64, 64, max_pages=512, device="cuda")
    out = case.page_table_out()
    args = (case.req_to_token, case.req_pool_indices, case.seq_lens, out)
    api = kvdispatch.create_flashmla_kv_indices
    api(*args, page_size=64, backend="triton")
    _baselines.grid_2d(*args, 64)
    x = torch.zeros(16, device="cuda")
    _baselines.touch(x)
    compiled = next(iter(page_table.launcher.compiled.values()))
    table, pool, lens = case.req_to_token, case.req_pool_indices, case.seq_lens
    ints = (table.data_ptr(), pool.data_ptr(), lens.data_ptr(), table.data_ptr(), out.data_ptr(), out.data_ptr(),
            1, 1, 1, table.shape[0], table.shape[1], table.stride(0), out.shape[1], out.stride(0), 0, 0, 0)
    constexprs = page_table.constexprs_for(64, False, False, False, True)
    tail = tuple(constexprs[n] for n in page_table.CONSTEXPRS)
    grid = kvdispatch.grid.page_table_launch(64, out.shape[1], 64).grid
    stream = torch._C._cuda_getCurrentRawStream(0)
    run, function, metadata = compiled.run, compiled.function, compiled.packed_metadata
    rows = [
        ("x.add_(1)", lambda: x.add_(1)),
        ("plain launch, touch kernel (1 arg)", lambda: _baselines.touch(x)),
        ("plain launch, 2-D baseline kernel", lambda: _baselines.grid_2d(*args, 64)),
        ("public API, triton", lambda: api(*args, page_size=64, backend="triton")),
        ("public API, cupy", lambda: api(*args, page_size=64, backend="cupy")),
        ("validation", lambda: _validate.check_page_table_args(*args, 64, None, 0, None, None)),
        ("compiled.run(ints)", lambda: run(grid[0], grid[1], 1, stream, function, metadata, None, None, None,
                                           *ints, *tail)),
    ]
    launch = getattr(run, "launch", None)
    if launch is not None and hasattr(run, "launch_pdl"):
        try:
            launch(grid[0], grid[1], 1, stream, function, run.launch_cooperative_grid, run.launch_pdl, None, None,
                   metadata, None, None, None, *ints, *tail)
            torch.cuda.synchronize()
            rows.append(("run.launch(...) (C, 3.6 layout)", lambda: launch(
                grid[0], grid[1], 1, stream, function, run.launch_cooperative_grid, run.launch_pdl, None, None,
                metadata, None, None, None, *ints, *tail)))
        except Exception as exc:  # another Triton layout
            print("run.launch direct failed:", type(exc).__name__, exc)
    rows.append(("C call floor: raw stream query", lambda: torch._C._cuda_getCurrentRawStream(0)))
    for _ in range(2):
        for label, fn in rows:
            print(f"  {label:40} {host_us(fn):7.2f} us", flush=True)
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
