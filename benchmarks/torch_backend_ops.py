"""The torch backend against the bench's plain PyTorch version, per op: ATen ops dispatched and host µs on CPU.

On a GPU each ATen op that is not a view launches about one kernel (~2-5 µs of replay on decode-sized inputs)
and costs host time, so the kernel count is what the torch backend's GPU and host time follow; this script
counts them on CPU, where it runs without a GPU, for the bench's cases (``kvdispatch.bench``'s inputs and
callables):

    PYTHONPATH=. python3 benchmarks/torch_backend_ops.py [--cases 64x32768x64,token_csr:64x4096,...] [--device cpu]

Per case and implementation: ``kernels`` (ATen ops other than views and metadata, what launches on a GPU),
``ops`` (every ATen op), and µs per call: the best of a few batches of eager calls, wall clock (synchronised
after each batch on a GPU). On CPU, the large cases' µs is mostly arithmetic over the tokens (a GPU does that
in a few µs per op), the small ones' mostly the per-op host cost that a GPU call also pays.
``api:torch`` is the public call with ``backend="torch"`` (validation, dispatch, ``kvdispatch.reference``);
``plain-torch`` is the bench's plain version (for mha and v2p the bench times ``kvdispatch.reference`` there,
and for draft decode it has none: the one-step build stands in).
"""

from __future__ import annotations

import argparse
import functools
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kvdispatch.bench import core as bench
from kvdispatch.bench import draft_decode

CASES = ["64x32768x64", "64x4096x64", "64x4096x1", "token_csr:64x4096", "token_csr:64x4096:i64",
         "token_csr:64x4096:e16:map", "mha_page_table:64x32768x64", "mha_page_table:64x32768x64:swa",
         "translated_page_table:64x32768x64", "draft_decode:64x4096x5x4", "draft_decode:8x1024x3x4",
         "dcp_token_csr:64x32768x4", "dcp_page_table:64x32768x64x4", "dcp_page_table:64x32768x1x8"]
# Few tokens: on CPU their µs is mostly per-op host cost, as a GPU's eager call is.
SMALL_CASES = ["4x256x64", "4x256x1", "token_csr:4x256", "token_csr:4x256:i64:e16:map", "mha_page_table:4x256x16:swa",
               "translated_page_table:4x256x16", "draft_decode:2x64x3x2", "dcp_token_csr:4x256x4",
               "dcp_page_table:4x256x16x4"]

# Ops that only make a new view or read metadata: no kernel on a GPU.
VIEW_OPS = {"view", "_unsafe_view", "slice", "select", "expand", "unsqueeze", "squeeze", "alias", "as_strided",
            "t", "transpose", "permute", "detach", "lift_fresh", "reshape", "unbind", "split", "narrow", "diagonal",
            "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "is_same_size"}


class OpCounter(TorchDispatchMode):
    """Counts the ATen ops dispatched inside it, by name."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))

    @property
    def kernels(self) -> list[str]:
        return [name for name in self.names if name not in VIEW_OPS]


def count_ops(fn) -> OpCounter:
    counter = OpCounter()
    with counter:
        fn()
    return counter


def best_us(fn, device, seconds: float = 0.05, batches: int = 7) -> float:
    """µs per call: the fastest of ``batches`` batches of calls taking about ``seconds`` each (the fastest, as
    other work on a shared machine only slows a batch down)."""
    once = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        once.append(time.perf_counter() - start)
    calls = max(1, int(seconds / max(min(once), 1e-7)))
    samples = []
    for _ in range(batches):
        bench._sync(device)
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        bench._sync(device)
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return min(samples)


def implementations(case: bench.Case) -> list[str]:
    return [bench.API_PREFIX + "torch", draft_decode.ONE_STEP if case.op == "draft_decode" else bench.PLAIN_TORCH]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=bench.parse_cases, default=[bench.Case.parse(c) for c in CASES + SMALL_CASES])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--names", action="store_true", help="also list each implementation's kernels")
    parser.add_argument("--seconds", type=float, default=0.05, help="per timing batch")
    options = parser.parse_args()
    device = torch.device(options.device)
    if device.type == "cpu":
        torch.set_num_threads(1)  # steadier on a shared machine; each op's host cost is what is compared
    print(f"torch {torch.__version__}, {device}; kernels = ATen ops that are not views, ops = all ATen ops")
    print(f"{'case':34} {'impl':12} {'kernels':>7} {'ops':>5} {'µs/call':>10} {'kernels/plain':>13} {'µs/plain':>9}")
    for case in options.cases:
        x = bench.make_inputs(case, device, seed=0)
        rows = []
        for impl in implementations(case):
            fn = bind(impl, x, case)
            problem = bench.check_eager(fn, x)
            counter = count_ops(fn)
            us = best_us(fn, device, options.seconds)
            rows.append((impl, counter, us, problem))
            if options.names:
                print(f"  {impl}: {' '.join(counter.kernels)}")
        plain_kernels, plain_us = len(rows[-1][1].kernels), rows[-1][2]
        for impl, counter, us, problem in rows:
            print(f"{case.name:34} {impl:12} {len(counter.kernels):7d} {len(counter.names):5d} {us:10.1f} "
                  f"{len(counter.kernels) / plain_kernels:13.2f} {us / plain_us:9.2f} {problem}")
    return 0


def bind(impl: str, x: bench.Inputs, case: bench.Case):
    """The bench's callable for ``impl``; the one-step draft build (draft decode has no plain version in the
    bench, so building step 0 only stands in for one) through the torch backend too."""
    fn = bench.bind(impl, x, case)
    if impl == draft_decode.ONE_STEP:
        expected = fn.expected
        fn = functools.partial(fn, backend="torch")
        fn.expected = expected
    return fn


if __name__ == "__main__":
    raise SystemExit(main())
