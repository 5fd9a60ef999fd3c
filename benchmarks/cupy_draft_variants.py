"""Experiment: the CUDA draft-decode kernel (``kernels_cupy/kv_indices.cu``) compiled from other sources or
with a register cap, against the API (CuPy and Triton) and the SGLang-design loop. Each variant is the
kernel launched directly with the arguments the CuPy launcher builds (``kernels_cupy.launch.draft_decode_call``),
from the shipped source or a file given with ``--sources LABEL=PATH`` (an earlier version, say), compiled by
NVRTC with the launcher's options plus ``--maxrregcount=N`` for each N of ``--max-registers`` (``none``: no
cap).

Outputs are checked against the reference first (nan if wrong); CUDA-graph replay, 20 calls per graph,
interleaved rounds, medians, ratios to the CuPy API as shipped and to the loop.

    PYTHONPATH=. python3 benchmarks/cupy_draft_variants.py [--cases ...] [--sources old=/tmp/old.cu]
        [--max-registers none,32,40]
"""

from __future__ import annotations

import functools
from pathlib import Path

import cupy
import torch

from draft_program_size import CASES, checked_graph_us, loop, shipped
from kernels_cupy import build
from kernels_cupy import launch as cupy_launch
from kernels_cupy import runtime
from kvdispatch.bench import core as bench
from perf_probe import experiment_setup, time_case


def compiled(source: str, defines: tuple, max_registers: int | None):
    options = build.rtc_options("nvidia") + build.define_flags(defines)
    if max_registers:
        options += (f"--maxrregcount={max_registers}",)
    return cupy.RawModule(code=source, options=options).get_function("kv_draft_decode").kernel


def direct(function, call):
    """``function`` launched as ``kernels_cupy.runtime.launch`` launches the shipped one."""
    stream = runtime._RawStream(torch._C._cuda_getCurrentRawStream(torch.cuda.current_device()))
    function(call.grid, (call.threads,), call.args, 0, stream)


def main() -> int:
    def more(parser):
        parser.add_argument("--sources", default="", help="LABEL=PATH,... : more versions of kv_indices.cu")
        parser.add_argument("--max-registers", default="none,32,40,48")

    options, device, cases = experiment_setup(CASES, more)
    sources = {"shipped": build.source()}
    for item in filter(None, options.sources.split(",")):
        label, path = item.split("=", 1)
        sources[label] = Path(path).read_text()
    caps = [None if c == "none" else int(c) for c in options.max_registers.split(",")]
    for i, case in enumerate(cases):
        x = bench.make_inputs(case, device, i)
        call = cupy_launch.draft_decode_call(x.req_to_token, x.req_pool_indices, x.seq_lens, x.kv_indptr, x.out,
                                             case.steps, case.topk, case.page_size, positions=x.positions,
                                             write_indptr_start=False, round_toward_zero=True)
        rows = {"api cupy (as shipped)": bench.bind(bench.API_PREFIX + "cupy", x, case),
                "api triton": functools.partial(shipped, x, case, case.steps),
                "draft-loop (SGLang design)": functools.partial(loop, x, case)}
        for label, text in sources.items():
            for cap in caps:
                function = compiled(text, call.defines, cap)
                rows[f"{label}, registers {cap or 'uncapped'}"] = functools.partial(direct, function, call)
        checked = {name: functools.partial(checked_graph_us, fn, x, x.expected) for name, fn in rows.items()}
        time_case(case.name, checked, lambda measure: measure(), options.rounds,
                  {"cupy": "api cupy (as shipped)", "loop": "draft-loop (SGLang design)"}, width=36)
        del x
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
