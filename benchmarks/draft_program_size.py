"""Experiment: prefix tokens per program and warps of the shipped Triton draft-decode kernel, against the API as
shipped, the one-step build and the SGLang-design loop, to see what the multi-step build costs where it is
latency-bound (few segments) and where it writes many bytes.

Each row is the shipped kernel launched directly (``kernel[grid](...)``) at that program size and warp count;
outputs are checked against the reference first (nan if wrong). CUDA-graph replay, 20 calls per graph,
interleaved rounds, medians, ratios to the API as shipped and to the one-step build. "floor" is the time the
bytes the build moves (prefix read once, every step row written) take at the device copy bandwidth; the
"fill" rows time PyTorch's ``fill_`` of as many bytes as every step row (or one step's row) holds, in a
buffer of their own: a kernel that only writes those bytes, with nothing to load first.

    PYTHONPATH=. python3 benchmarks/draft_program_size.py [--cases ...] [--tokens 256,512,1024,2048] [--warps 2,4]
"""

from __future__ import annotations

import functools

import torch

import kvdispatch
from kernels_triton import draft_decode
from kvdispatch.bench import baselines
from kvdispatch.bench import core as bench
from perf_probe import experiment_setup, time_case

CASES = ("draft_decode:4x2048x5x1,draft_decode:8x1024x3x4,draft_decode:8x32768x3x1,draft_decode:16x4096x5x4:p16,"
         "draft_decode:64x4096x5x1,draft_decode:64x4096x5x4")


def shipped(x, case, num_steps):
    kvdispatch.create_draft_decode_kv_indices(
        x.req_to_token, x.req_pool_indices, x.seq_lens, x.kv_indptr, x.out, num_steps=num_steps, topk=case.topk,
        page_size=case.page_size, positions=x.positions, write_indptr_start=False, round_toward_zero=True,
        backend="triton")


def direct(x, case, tokens, warps):
    """The shipped kernel at ``tokens`` prefix tokens per program and ``warps`` warps."""
    _, args = draft_decode.plan_key_and_arguments(
        x.req_to_token, x.req_pool_indices, x.seq_lens, x.kv_indptr, x.out, case.steps, case.topk, case.page_size,
        positions=x.positions, write_indptr_start=False, round_toward_zero=True)
    constexprs = draft_decode.constexprs_for(case.page_size, has_positions=True)
    constexprs["TOKENS_PER_PROGRAM"] = tokens
    span = max(min(x.req_to_token.shape[1], x.out.shape[1]), 1)
    grid = (x.req_pool_indices.shape[0] * case.topk, -(-span // tokens), 1)
    draft_decode.draft_decode_kernel[grid](*args, **constexprs, num_warps=warps)


def loop(x, case):
    baselines.draft_loop(x.req_to_token, x.req_pool_indices, x.seq_lens, x.positions, x.out, x.kv_indptr,
                         case.steps, case.topk, case.page_size)


def graph_us(fn):
    """``fn``'s CUDA-graph replay time, unchecked."""
    return bench.event_time_us(bench.capture(fn, 20).replay, 20, 200)


def checked_graph_us(fn, x, expected):
    x.out.fill_(bench.POISON)
    fn()
    torch.cuda.synchronize()
    if not torch.equal(x.out, expected):
        return float("nan")
    return graph_us(fn)


def copy_gbs(device) -> float:
    """A device-to-device copy's GB/s (read + written), as the bench measures it."""
    src = torch.empty(bench.COPY_BYTES // 4, dtype=torch.int32, device=device)
    dst = torch.empty_like(src)
    return 2 * bench.COPY_BYTES / bench.event_time_us(functools.partial(dst.copy_, src), 1, 50) / 1e3


def main() -> int:
    def more(parser):
        parser.add_argument("--tokens", default="256,512,1024,2048")
        parser.add_argument("--warps", default="2,4")

    options, device, cases = experiment_setup(CASES, more)
    tokens_options = [int(t) for t in options.tokens.split(",")]
    warps_options = [int(w) for w in options.warps.split(",")]
    bandwidth = copy_gbs(device)
    for i, case in enumerate(cases):
        x = bench.make_inputs(case, device, i)
        rows = {"api (as shipped)": functools.partial(shipped, x, case, case.steps),
                "one-step (api, num_steps=1)": functools.partial(shipped, x, case, 1),
                "draft-loop (SGLang design)": functools.partial(loop, x, case)}
        for tokens in tokens_options:
            for warps in warps_options:
                rows[f"tokens={tokens:<5} warps={warps}"] = functools.partial(direct, x, case, tokens, warps)
        checked = {name: functools.partial(checked_graph_us, fn, x,
                                           x.expected_one_step if name.startswith("one-step") else x.expected)
                   for name, fn in rows.items()}
        written = case.steps * case.batch * case.topk * (case.context + case.steps) * x.out.element_size()
        for label, size in (("fill (every step's bytes)", written), ("fill (one step's bytes)", written // case.steps)):
            buffer = torch.empty(size, dtype=torch.uint8, device=device)
            checked[label] = functools.partial(graph_us, functools.partial(buffer.fill_, 0))
        moved = written + case.batch * case.context * 4
        title = (f"{case.name} ({moved / 1e6:.1f} MB moved, floor {moved / bandwidth / 1e3:.2f} us at "
                 f"{bandwidth:.0f} GB/s)")
        time_case(title, checked, lambda measure: measure(), options.rounds,
                  {"api": "api (as shipped)", "one-step": "one-step (api, num_steps=1)"}, width=36)
        del x
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
