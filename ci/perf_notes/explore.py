"""Exploration on a GPU (session 2): host-cost layers, a ctypes cuLaunchKernel prototype, empty-kernel
floors, the page-table kernel against the 2-D baseline, CuPy page-size specialisation. Prints tables; every
GPU variant is checked against the reference before it is timed. (Session 2 also timed the session-1 kernel
here: ``git show f6a8700:kernels_triton/page_table.py``; NOTES.md has those numbers.)

    PYTHONPATH=. python3 ci/perf_notes/explore.py
"""

from __future__ import annotations

import ctypes
import re
import struct
import sys
from pathlib import Path

import torch
import triton

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "ci"))
import kvdispatch  # noqa: E402
from kernels_triton import page_table  # noqa: E402
from kvdispatch import _baselines, _validate, bench, dispatch  # noqa: E402
from host_cost import host_case, host_us  # noqa: E402
from perf_probe import graph_us, time_case  # noqa: E402



# ----------------------------------------------------------------------------------------------- ctypes


class CtypesLaunch:
    """cuLaunchKernel on a compiled Triton kernel, parameters packed into one fixed buffer."""

    def __init__(self, compiled, grid, n_args):
        self.cuda = ctypes.CDLL("libcuda.so.1")
        self.fn = self.cuda.cuLaunchKernel
        self.fn.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
        self.fn.restype = ctypes.c_int
        ptx = compiled.asm["ptx"]
        entry = ptx.split(".entry", 1)[1].split(")", 1)[0]
        self.params = re.findall(r"\.param\s+\.(\w+)", entry)
        count = len(self.params)
        self.buffer = (ctypes.c_uint64 * count)()
        base = ctypes.addressof(self.buffer)
        self.pointers = (ctypes.c_void_p * count)(*[base + 8 * i for i in range(count)])
        self.pointer_array = ctypes.addressof(self.pointers)
        self.format = f"{count}q"
        self.function = compiled.function
        self.grid = grid
        self.threads = 32 * compiled.metadata.num_warps
        self.shared = compiled.metadata.shared
        self.n_args = n_args

    def __call__(self, stream, *values):
        struct.pack_into(self.format, self.buffer, 0, *values)
        return self.fn(self.function, self.grid[0], self.grid[1], 1, self.threads, 1, 1, self.shared, stream,
                       self.pointer_array, None)



def host_section():
    print("== host us per call (page 64, batch 64) ==")
    args, expected = host_case("triton")
    out = args[3]
    api = kvdispatch.create_flashmla_kv_indices
    name, build = dispatch.selector.resolve(out.device, "page_table", "triton")
    full = (*args, 64, None, 0, None, None)
    x = torch.zeros(16, device="cuda")
    table, t, lens = args[:3]
    key = next(iter(page_table._plans))
    plan = page_table._plans[key]
    compiled = next(iter(page_table.launcher.compiled.values()))
    ints = (table.data_ptr(), t.data_ptr(), lens.data_ptr(), table.data_ptr(), out.data_ptr(),
            out.data_ptr(), t.stride(0), lens.stride(0), 0, table.shape[0], table.shape[1],
            table.stride(0), out.shape[1], out.stride(0), 0, 0, 0)
    tensor_args = (table, t, lens, table, out, out) + ints[6:]
    geometry = kvdispatch.grid.page_table_launch(64, out.shape[1], 64)
    stream = torch._C._cuda_getCurrentRawStream(0)
    run, function, metadata = compiled.run, compiled.function, compiled.packed_metadata
    constexprs = page_table.constexprs_for(64, False, False, False)
    constexpr_values = tuple(constexprs[n] for n in page_table.CONSTEXPRS)
    launcher = CtypesLaunch(compiled, geometry.grid, len(ints))
    print("ptx params", launcher.params, "threads", launcher.threads, "shared", launcher.shared)
    out.fill_(-7)
    tail = (0,) * (len(launcher.params) - len(ints))
    rc = launcher(stream, *ints, *tail)
    torch.cuda.synchronize()
    print("ctypes launch rc", rc, "correct", torch.equal(out, expected))

    def noop(*a):
        pass

    rows = [
        ("x.add_(1)", lambda: x.add_(1)),
        ("public API triton", lambda: api(*args, page_size=64, backend="triton")),
        ("public API cupy", lambda: api(*args, page_size=64, backend="cupy")),
        ("validation only", lambda: _validate.check_page_table_args(*full)),
        ("selection lookup", lambda: dispatch.selector.resolve(out.device, "page_table", "triton")),
        ("triton build_page_table", lambda: build(*full)),
        ("plan(*tensor args)", lambda: plan(*tensor_args)),
        ("compiled.run(ints)", lambda: run(geometry.grid[0], geometry.grid[1], 1, stream, function, metadata, None,
                                           None, None, *ints, *constexpr_values)),
        ("ctypes pack+cuLaunchKernel", lambda: launcher(stream, *ints, *tail)),
        ("struct.pack_into only", lambda: struct.pack_into(launcher.format, launcher.buffer, 0, *ints, *tail)),
        ("raw stream query", lambda: torch._C._cuda_getCurrentRawStream(0)),
        ("torch._C._cuda_getDevice()", torch._C._cuda_getDevice),
        ("t.dtype", lambda: t.dtype),
        ("t.shape", lambda: t.shape),
        ("t.shape[0]", lambda: t.shape[0]),
        ("t.stride(0)", lambda: t.stride(0)),
        ("t.stride()", lambda: t.stride()),
        ("t.data_ptr()", lambda: t.data_ptr()),
        ("t.get_device()", lambda: t.get_device()),
        ("t.is_cuda", lambda: t.is_cuda),
        ("t.device", lambda: t.device),
        ("lambda: None", lambda: None),
    ]
    results = []
    for label, fn in rows:
        results.append((label, host_us(fn)))
    page_table._plans[key] = noop
    for label, fn in [("no-op plan: build_page_table", lambda: build(*full)),
                      ("no-op plan: dispatch.call", lambda: dispatch.call(out.device, "page_table", "triton", *full)),
                      ("no-op plan: public API", lambda: api(*args, page_size=64, backend="triton")),
                      ("no-op plan: public API backend=None", lambda: api(*args, page_size=64))]:
        results.append((label, host_us(fn)))
    page_table._plans[key] = plan
    for label, us in results:
        print(f"  {label:34} {us:7.2f} us")
    out.fill_(-7)
    api(*args, page_size=64, backend="triton")
    torch.cuda.synchronize()
    print("api still correct", torch.equal(out, expected))


# -------------------------------------------------------------------------------------------- GPU time


@triton.jit
def _empty_kernel(x):
    pass


def plain_graph_us(fn):
    fn()
    torch.cuda.synchronize()
    graph = bench.capture(fn, 20)
    return bench.event_time_us(graph.replay, 20, 200)


def cupy_variant(inputs, ps, module_cache, options, threads=None):
    import cupy

    from kernels_cupy import build, launch as cl, runtime

    key = options
    if key not in module_cache:
        module = cupy.RawModule(code=build.source(), options=build.rtc_options("nvidia") + options)
        module_cache[key] = module.get_function(build.PAGE_TABLE_KERNEL).kernel
    function = module_cache[key]
    call = cl.page_table_call(inputs.req_to_token, inputs.req_pool_indices, inputs.seq_lens, inputs.out, ps)
    stream = runtime._RawStream(torch._C._cuda_getCurrentRawStream(0))
    function(call.grid, (threads or call.threads,), call.args, 0, stream)


def gpu_section():
    import cupy

    device = torch.device("cuda")
    bench._warm_up_clocks(device)
    x = torch.zeros(16, device="cuda")
    empty_cupy = cupy.RawKernel('extern "C" __global__ void empty_kernel(long long x) {}', "empty_kernel").kernel

    def cupy_empty():
        from kernels_cupy import runtime
        empty_cupy((1,), (64,), (0,), 0, runtime._RawStream(torch._C._cuda_getCurrentRawStream(0)))

    print("== GPU us per call, graph replay ==")
    print(f"  empty triton kernel   {plain_graph_us(lambda: _empty_kernel[(1,)](x)):.3f}")
    print(f"  empty cupy kernel     {plain_graph_us(cupy_empty):.3f}")
    print(f"  touch triton kernel   {plain_graph_us(lambda: _baselines.touch(x)):.3f}")
    modules = {}
    cases = [bench.Case(1, 131072, 64), bench.Case(64, 32768, 64), bench.Case(1, 131072, 1),
             bench.Case(8, 131072, 64), bench.Case(256, 8192, 64), bench.Case(64, 32768, 16),
             bench.Case(256, 32768, 1)]
    for i, case in enumerate(cases):
        inputs = bench.make_inputs(case, device, i)
        ps = case.page_size
        args = (inputs.req_to_token, inputs.req_pool_indices, inputs.seq_lens, inputs.out)
        variants = {
            "triton api (new kernel)": lambda: kvdispatch.create_flashmla_kv_indices(*args, page_size=ps,
                                                                                     backend="triton"),
            "2d baseline": lambda: _baselines.grid_2d(*args, ps),
            "cupy api (specialised)": lambda: kvdispatch.create_flashmla_kv_indices(*args, page_size=ps,
                                                                                    backend="cupy"),
            "cupy generic module (direct)": lambda: cupy_variant(inputs, ps, modules, ()),
        }
        time_case(case.name, variants, lambda fn: graph_us(fn, inputs), 3,
                  {"baseline": "2d baseline", "triton": "triton api (new kernel)"}, width=30)
        del inputs


def main() -> int:
    host_section()
    gpu_section()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
