"""A minimal decode loop that rebuilds its block table through kvdispatch every step.

What an engine does, in miniature:

* a KV pool of pages and a token table ``req_to_token[rows, max_context]`` (slot id per token);
* requests are admitted (a prompt is written into fresh, randomly placed pages), grow one token per step
  (a new page when the last one is full), and retire when done, giving their pages and row back;
* before "attention" each step, the paged block table is rebuilt from the table by kvdispatch into one
  persistent buffer. On a GPU that call is captured once in a CUDA graph and replayed with new data in
  the same buffers; on CPU it is called eagerly (the torch backend serves CPU tensors).

Run: ``python3 examples/decode_loop.py --steps 20`` (``--check`` verifies every table against the
loop's own bookkeeping; ``--page-size``, ``--batch``, ``--backend`` as named). An error is one line on
stderr, exit status 2 for a backend that cannot run here and 1 for a failed check; ``--verbose`` prints the
traceback too.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import traceback

import torch

import kvdispatch


class Pool:
    """Pages, token table and requests. Page 0 / row 0 are padding (an idle batch slot reads them)."""

    def __init__(self, num_pages, page_size, rows, max_context, device, seed=0):
        self.page_size, self.max_context = page_size, max_context
        self.rng = random.Random(seed)
        self.free_pages = list(range(1, num_pages))
        self.rng.shuffle(self.free_pages)
        self.free_rows = list(range(rows - 1, 0, -1))
        self.host = torch.zeros(rows, max_context, dtype=torch.int32)  # host mirror of the table
        self.req_to_token = self.host.to(device)                      # the device table (fixed address)
        self.pages, self.length, self.target, self.row = {}, {}, {}, {}
        self.next_id = 0

    def admit(self, prompt_len, output_len):
        rid, self.next_id = self.next_id, self.next_id + 1
        self.row[rid], self.pages[rid], self.length[rid] = self.free_rows.pop(), [], 0
        self.target[rid] = min(prompt_len + output_len, self.max_context)
        self.grow(rid, prompt_len)
        return rid

    def grow(self, rid, n=1):
        for _ in range(n):
            pos = self.length[rid]
            if pos % self.page_size == 0:
                self.pages[rid].append(self.free_pages.pop())
            self.host[self.row[rid], pos] = self.pages[rid][-1] * self.page_size + pos % self.page_size
            self.length[rid] = pos + 1

    def retire(self, rid):
        self.free_pages.extend(self.pages.pop(rid))
        self.free_rows.append(self.row.pop(rid))
        del self.length[rid], self.target[rid]


class Failure(Exception):
    """An error reported in one line, with the exit status."""

    def __init__(self, message, status):
        super().__init__(message)
        self.status = status


def bounded(low, high=None):
    """An argparse type: an int in ``[low, high]`` (no upper bound for None), else a usage error."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low or (high is not None and value > high):
            bound = f"at least {low}" if high is None else f"in [{low}, {high}]"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {value}")
        return value
    return parse


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="decode_loop.py", description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=bounded(0), default=20)
    parser.add_argument("--batch", type=bounded(1), default=8, help="batch slots (the captured batch size)")
    parser.add_argument("--page-size", type=bounded(1, kvdispatch.grid.MAX_PAGE_SIZE), default=16)
    parser.add_argument("--max-context", type=bounded(1), default=1024)
    parser.add_argument("--backend", default=None, help="triton | cupy | torch (default: auto)")
    parser.add_argument("--check", action="store_true", help="verify each table against the pool")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--verbose", action="store_true", help="on an error, print the traceback too")
    args = parser.parse_args(argv)
    try:
        run(args)
    except Exception as exc:
        if args.verbose:
            traceback.print_exc()
        status = exc.status if isinstance(exc, Failure) else 1
        message = str(exc) if isinstance(exc, Failure) else f"{type(exc).__name__}: {exc}"
        print(f"{parser.prog}: error: {message}", file=sys.stderr)
        return status
    return 0


def run(args):

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    page, bs = args.page_size, args.batch
    width = -(-args.max_context // page)  # pages per row of the block table
    pool = Pool(num_pages=(bs + 1) * width + 1, page_size=page, rows=bs + 1, max_context=args.max_context,
                device=device, seed=args.seed)
    rng = pool.rng

    # Persistent buffers, as a CUDA graph needs them: slot i of the batch is one request or idle
    # (row 0, length 0: an empty row, all fill_value).
    req_pool_indices = torch.zeros(bs, dtype=torch.int64, device=device)
    seq_lens = torch.zeros(bs, dtype=torch.int32, device=device)
    block_table = torch.full((bs, width), -1, dtype=torch.int32, device=device)

    def build():
        kvdispatch.create_flashmla_kv_indices(pool.req_to_token, req_pool_indices, seq_lens, block_table,
                                              page_size=page, fill_value=-1, backend=args.backend)

    def first_build():
        # Backend selection (and compilation): a backend that cannot run here fails in this call.
        try:
            build()
        except (ValueError, kvdispatch.BackendUnavailableError) as exc:
            raise Failure(str(exc), 2) from exc

    if device.type == "cuda":
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            first_build()  # warm-up before capture
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            build()
        rebuild = graph.replay
    else:
        first_build()
        rebuild = build
    print(f"device {device}, backend {args.backend or kvdispatch.select_backend(device)}, page {page}, "
          f"batch {bs}, table {tuple(block_table.shape)}, {'CUDA graph' if device.type == 'cuda' else 'eager'}")

    slots = [None] * bs  # request id per batch slot
    for step in range(args.steps):
        # Scheduler: retire finished requests, admit new ones into free slots, grow the others by a token.
        for i, rid in enumerate(slots):
            if rid is not None and pool.length[rid] >= pool.target[rid]:
                pool.retire(rid)
                slots[i] = None
            elif rid is not None:
                pool.grow(rid)
        for i in range(bs):
            if slots[i] is None and rng.random() < 0.6:
                slots[i] = pool.admit(rng.randint(1, args.max_context // 2), rng.randint(1, 24))
        pool.req_to_token.copy_(pool.host)  # in place: the graph reads this buffer
        live = [rid for rid in slots if rid is not None]
        req_pool_indices.copy_(torch.tensor([pool.row[r] if r is not None else 0 for r in slots]))
        seq_lens.copy_(torch.tensor([pool.length[r] if r is not None else 0 for r in slots]))

        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        rebuild()
        if device.type == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
        longest = max((pool.length[r] for r in live), default=0)
        print(f"step {step:3d}: {len(live)} live, longest {longest:4d} tokens, index build {elapsed * 1e6:8.1f} us")

        if args.check:
            table = block_table.cpu()
            for i, rid in enumerate(slots):
                pages = pool.pages[rid] if rid is not None else []
                expected = pages + [-1] * (width - len(pages))
                if table[i].tolist() != expected:
                    raise Failure(f"step {step}, slot {i}: the block table does not match the pool", 1)
    if args.check:
        print(f"checked {args.steps} steps: every block table matches the pool")


if __name__ == "__main__":
    sys.exit(main())
