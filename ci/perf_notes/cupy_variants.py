"""CuPy page-table kernel variants (ci/perf_notes/cupy_variants/*.cu) against the shipped source and Triton.

Each variant is the whole kv_indices.cu with one change, compiled exactly as kernels_cupy.runtime does
(same options, same -DKV_PAGE_SIZE/-DKV_FLAGS) and launched with the shipped launcher's arguments and
geometry. Every variant is checked against the reference before it is timed; rounds are interleaved.

    PYTHONPATH=. python3 ci/perf_notes/cupy_variants.py [ROUNDS]
"""

from __future__ import annotations

import sys
from pathlib import Path

import cupy
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "ci"))
import kvdispatch  # noqa: E402
from kernels_cupy import build, launch as cupy_launch, runtime  # noqa: E402
from kvdispatch import _baselines, bench  # noqa: E402
from perf_probe import graph_us, time_case  # noqa: E402

SOURCES = {"shipped": build.source()}
SOURCES.update({p.stem: p.read_text() for p in sorted((Path(__file__).parent / "cupy_variants").glob("*.cu"))})
_functions = {}


def variant_call(name, inputs, page_size):
    call = cupy_launch.page_table_call(inputs.req_to_token, inputs.req_pool_indices, inputs.seq_lens, inputs.out,
                                       page_size)
    key = (name, call.defines)
    if key not in _functions:
        module = cupy.RawModule(code=SOURCES[name],
                                options=build.rtc_options("nvidia") + build.define_flags(call.defines))
        _functions[key] = module.get_function(build.PAGE_TABLE_KERNEL).kernel
    stream = runtime._RawStream(torch._C._cuda_getCurrentRawStream(0))
    _functions[key](call.grid, (call.threads,), call.args, 0, stream)


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    device = torch.device("cuda")
    bench._warm_up_clocks(device)
    cases = [bench.Case(1, 131072, 64), bench.Case(1, 4096, 64), bench.Case(1, 32768, 64),
             bench.Case(64, 32768, 64), bench.Case(8, 131072, 64), bench.Case(64, 32768, 16),
             bench.Case(1, 131072, 1), bench.Case(256, 32768, 1)]
    for i, case in enumerate(cases):
        inputs = bench.make_inputs(case, device, i)
        ps = case.page_size
        args = (inputs.req_to_token, inputs.req_pool_indices, inputs.seq_lens, inputs.out)
        variants = {"triton api": lambda: kvdispatch.create_flashmla_kv_indices(*args, page_size=ps, backend="triton"),
                    "2d baseline": lambda: _baselines.grid_2d(*args, ps)}
        for name in SOURCES:
            variants[f"cupy {name}"] = lambda name=name: variant_call(name, inputs, ps)
        time_case(case.name, variants, lambda fn: graph_us(fn, inputs), rounds, {"triton": "triton api"})
        del inputs
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
