"""Experiment: dealing a bounded grid's programs over all rows' real pages instead of a fixed share per row.

The bounded grid (``kvdispatch.grid``) gives each row ``T = max(1, budget // batch)`` programs, which stride over
that row's blocks of pages. On the decode shape with a few long rows (``len=mix``: 256 rows of 1K-8K tokens, every
16th in the top 16th of a 1M-token buffer) a long row's ``T = 4`` programs each walk thousands of pages, one
dependent round trip per block, while the other rows' programs have long finished. This compares, on an NVIDIA
GPU in CUDA-graph replay (20 calls per graph), four Triton page-table kernels of the same block size, plain and
translated through a ``v2p`` lookup (the unified pool's table):

* ``per-row:N``: the bounded grid's design, ``(batch, T)`` programs, each striding over its row's blocks of N
  pages (N: kvdispatch's block for the page size,
  ``grid.items_per_program``, and 1024);
* ``split:N``: ``budget`` programs over the flattened list of every row's blocks: each program reads all rows'
  lengths, takes their blocks' prefix sum (``tl.cumsum``, no inter-program sync) and finds a block's row by
  counting the prefix sums at or below it; graph-safe, the grid independent of lengths and width;
* ``ideal:N``: one program per block of the longest row, on ``(batch, blocks)`` sized on the host (not graph-safe);
* ``kvdispatch``: the public call (``create_flashmla_kv_indices`` / ``create_translated_page_table``).

Every kernel's output is checked against kvdispatch's torch backend before it is timed. Prints µs per call and
writes the rows to ``--out`` (JSON).

    python benchmarks/work_split.py --out work_split.json
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import kvdispatch  # noqa: E402
from kvdispatch import grid  # noqa: E402
from kvdispatch.bench import core as bench  # noqa: E402

GRAPH_CALLS = 20
MIX_SHORT, MIX_LONG_EVERY = (1024, 8192), 16
SHUFFLE = 2654435761
LARGE_BLOCK = 1024  # pages per program of the large-block variants
MAX_BATCH_BLOCK = 1024  # the split kernel reads every row's length in one vector of at most this many


@triton.jit
def _block(row, first, table_ptr, pool_ptr, v2p_ptr, out_ptr, pages, table_stride, out_stride,
           PAGE: tl.constexpr, PPP: tl.constexpr, TRANSLATE: tl.constexpr):
    pool = tl.load(pool_ptr + row).to(tl.int64)
    cols = first + tl.arange(0, PPP)
    mask = cols < pages
    slot = tl.load(table_ptr + pool * table_stride + cols.to(tl.int64) * PAGE, mask=mask, other=0)
    page = slot // PAGE
    if TRANSLATE:
        page = tl.load(v2p_ptr + page, mask=mask, other=0).to(tl.int32)
    tl.store(out_ptr + row.to(tl.int64) * out_stride + cols, page, mask=mask)


@triton.jit
def _row_pages(lens, width, PAGE: tl.constexpr):
    return tl.minimum((tl.maximum(lens, 0) + PAGE - 1) // PAGE, width)


@triton.jit
def per_row_kernel(table_ptr, pool_ptr, lens_ptr, v2p_ptr, out_ptr, width, table_stride, out_stride,
                   PAGE: tl.constexpr, PPP: tl.constexpr, TRANSLATE: tl.constexpr):
    row = tl.program_id(0)
    pages = _row_pages(tl.load(lens_ptr + row), width, PAGE)
    for first in range(tl.program_id(1) * PPP, pages, tl.num_programs(1) * PPP):
        _block(row, first, table_ptr, pool_ptr, v2p_ptr, out_ptr, pages, table_stride, out_stride, PAGE, PPP,
               TRANSLATE)


@triton.jit
def split_kernel(table_ptr, pool_ptr, lens_ptr, v2p_ptr, out_ptr, batch, width, table_stride, out_stride,
                 PAGE: tl.constexpr, PPP: tl.constexpr, BATCH_BLOCK: tl.constexpr, TRANSLATE: tl.constexpr):
    rows = tl.arange(0, BATCH_BLOCK)
    in_batch = rows < batch
    pages = _row_pages(tl.load(lens_ptr + rows, mask=in_batch, other=0), width, PAGE)
    blocks = (pages + PPP - 1) // PPP
    ends = tl.cumsum(blocks, 0)
    total = tl.sum(blocks)
    for unit in range(tl.program_id(0), total, tl.num_programs(0)):
        row = tl.sum((ends <= unit).to(tl.int32))
        here = rows == row
        first = (unit - tl.sum(tl.where(here, ends - blocks, 0))) * PPP
        _block(row, first, table_ptr, pool_ptr, v2p_ptr, out_ptr, tl.sum(tl.where(here, pages, 0)), table_stride,
               out_stride, PAGE, PPP, TRANSLATE)


def lengths_of(batch: int, context: int, kind: str, g: torch.Generator) -> torch.Tensor:
    if kind == "full":
        return torch.full((batch,), context, dtype=torch.int32)
    low, high = MIX_SHORT if kind == "mix" else map(int, kind.split("-"))
    lengths = torch.randint(low, high + 1, (batch,), generator=g, dtype=torch.int32)
    if kind == "mix":
        long_rows = torch.arange(0, batch, MIX_LONG_EVERY)
        lengths[long_rows] = torch.randint(context - context // MIX_LONG_EVERY, context + 1, (long_rows.numel(),),
                                           generator=g, dtype=torch.int32)
    return lengths


def time_us(fn) -> float:
    graph = bench.capture(fn, GRAPH_CALLS)
    return bench.event_time_us(graph.replay, GRAPH_CALLS, 100)


def run_case(batch, context, page, kind, translate, budget, device):
    g = torch.Generator().manual_seed(batch * 7 + page)
    rows, width = batch + 2, -(-context // page)
    count = rows * width
    physical = torch.arange(count, dtype=torch.int64, device=device).mul_(SHUFFLE).remainder_(count)
    table = (physical.view(rows, width, 1) * page + torch.arange(page, device=device)).view(rows, -1)[:, :context]
    table = table.to(torch.int32)
    del physical
    pool = torch.randperm(rows, generator=g)[:batch].to(torch.int32).to(device)
    lens = lengths_of(batch, context, kind, g).to(device)
    v2p = torch.randint(0, count, (count,), generator=g).to(device) if translate else table
    out = torch.empty(batch, width, dtype=torch.int32, device=device)
    ppp = grid.items_per_program(grid.PAGE_TABLE, page)
    if translate:
        expected = kvdispatch.create_translated_page_table(table, pool, lens, v2p, out.clone().fill_(-1),
                                                           page_size=page, backend="torch")
        api = lambda: kvdispatch.create_translated_page_table(table, pool, lens, v2p, out, page_size=page)  # noqa: E731
    else:
        expected = kvdispatch.create_flashmla_kv_indices(table, pool, lens, out.clone().fill_(-1), page_size=page,
                                                         backend="torch")
        api = lambda: kvdispatch.create_flashmla_kv_indices(table, pool, lens, out, page_size=page)  # noqa: E731
    args = (table, pool, lens, v2p, out)
    longest = -(-int(lens.max()) // page)
    per_row_grid = (batch, max(1, budget // batch))
    kernels = {"kvdispatch": (api, None)}
    for block in sorted({ppp, LARGE_BLOCK}):
        def per_row(block=block, launch=per_row_grid):
            per_row_kernel[launch](*args, width, table.stride(0), out.stride(0), PAGE=page, PPP=block,
                                   TRANSLATE=translate)
        ideal_grid = (batch, -(-longest // block))
        kernels[f"per-row:{block}"] = (per_row, per_row_grid)
        kernels[f"ideal:{block}"] = (functools.partial(per_row, launch=ideal_grid), ideal_grid)
        if batch <= MAX_BATCH_BLOCK:
            def split(block=block):
                split_kernel[(budget,)](*args, batch, width, table.stride(0), out.stride(0), PAGE=page, PPP=block,
                                        BATCH_BLOCK=triton.next_power_of_2(batch), TRANSLATE=translate)
            kernels[f"split:{block}"] = (split, (budget,))
    name = f"{'translated_page_table:' if translate else ''}{batch}x{context}x{page}:len={kind}"
    result = {"case": name}
    for impl, (fn, launch) in kernels.items():
        out.fill_(-1)
        fn()
        torch.cuda.synchronize()
        mask = torch.arange(width, device=device) < ((lens.clamp(min=0) + page - 1) // page).unsqueeze(1)
        if not torch.equal(torch.where(mask, out, -1), torch.where(mask, expected, -1)):
            result[impl] = "MISMATCH"
            continue
        result[impl] = round(time_us(fn), 2)
        result[impl + ":grid"] = launch
    return result


CASES = [(256, 1 << 20, 64, "mix"), (256, 1 << 20, 64, "1024-8192"), (64, 1 << 20, 16, "mix"),
         (8, 1 << 20, 64, "mix"), (256, 163840, 16, "mix"), (256, 1 << 20, 1, "mix"), (64, 32768, 64, "full"),
         (1, 131072, 64, "full"), (256, 32768, 1, "full")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="write the rows as JSON")
    options = parser.parse_args()
    device = torch.device("cuda")
    budget = grid.program_budget(torch.cuda.get_device_properties(device).multi_processor_count)
    rows = []
    for translate in (False, True):
        for case in CASES:
            if translate and case[2] == 1:
                continue
            rows.append(run_case(*case, translate, budget, device))
            print(json.dumps(rows[-1]), flush=True)
            torch.cuda.empty_cache()
    if options.out:
        Path(options.out).write_text(json.dumps({"budget": budget, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
