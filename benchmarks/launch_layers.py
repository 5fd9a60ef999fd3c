"""Host µs of each layer under one Triton launch of the page table, same run: a plain launch, the
public API, validation alone, ``CompiledKernel.run`` with the arguments given as ints, and Triton 3.6's C
``launch`` function called directly (what ``KVDISPATCH_TRITON_LAUNCH=direct`` does). Is a launch below
``CompiledKernel.run`` worth it? Two passes, the host-cost case of ``host_cost.py``.

    PYTHONPATH=. python3 benchmarks/launch_layers.py
"""

from __future__ import annotations

import torch

from kvdispatch import ops
import kvdispatch
from host_cost import host_case, host_us
from kernels_triton import page_table
from kvdispatch.bench import baselines


def main() -> int:
    args, _ = host_case("triton")
    out = args[3]
    api = kvdispatch.create_flashmla_kv_indices
    baselines.grid_2d(*args, 64)
    x = torch.zeros(16, device="cuda")
    baselines.touch(x)
    compiled = next(iter(page_table.launcher.compiled.values()))
    _, run_args = page_table.plan_key_and_arguments(*args, 64)
    ints = tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in run_args)
    constexprs = page_table.constexprs_for(64, False, False, False, True)
    tail = tuple(constexprs[n] for n in page_table.CONSTEXPRS)
    grid = kvdispatch.grid.page_table_launch(64, out.shape[1], 64).grid
    stream = torch._C._cuda_getCurrentRawStream(0)
    run, function, metadata = compiled.run, compiled.function, compiled.packed_metadata
    rows = [
        ("x.add_(1)", lambda: x.add_(1)),
        ("plain launch, touch kernel (1 arg)", lambda: baselines.touch(x)),
        ("plain launch, 2-D baseline kernel", lambda: baselines.grid_2d(*args, 64)),
        ("public API, triton", lambda: api(*args, page_size=64, backend="triton")),
        ("public API, cupy", lambda: api(*args, page_size=64, backend="cupy")),
        ("validation", lambda: ops.page_table.check_arguments(*args, 64, None, 0, None, None)),
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
