"""The ``kvdispatch`` command: ``demo``, ``info`` and ``bench``."""

from __future__ import annotations

import argparse
import sys

from . import bench as bench_command


def _demo(args) -> int:
    import torch

    import kvdispatch

    device = torch.device(args.device) if args.device else None
    device = kvdispatch.probe(device).device
    generator = torch.Generator().manual_seed(0)
    page_size, batch, pages_per_request = 4, 3, 5
    # A pool of shuffled physical pages: each request's tokens live in whole pages scattered in the pool.
    pages = torch.randperm(64, generator=generator)[: batch * pages_per_request].view(batch, pages_per_request)
    slots = (pages[:, :, None] * page_size + torch.arange(page_size)).reshape(batch, -1).to(torch.int32)
    req_to_token = torch.zeros(8, slots.shape[1], dtype=torch.int32)
    req_pool_indices = torch.tensor([5, 1, 3], dtype=torch.int32)
    req_to_token[req_pool_indices.long()] = slots
    seq_lens = torch.tensor([17, 4, 9], dtype=torch.int32)
    out = torch.full((batch, pages_per_request), -7, dtype=torch.int32)
    tensors = [t.to(device) for t in (req_to_token, req_pool_indices, seq_lens, out)]
    kvdispatch.create_flashmla_kv_indices(*tensors, page_size=page_size, fill_value=-1)
    print(f"device {device}: backend {kvdispatch.select_backend(device)}")
    print(f"seq_lens {seq_lens.tolist()}, page_size {page_size}")
    print("page table (fill_value -1):")
    for row in tensors[3].cpu().tolist():
        print("  ", row)
    expected = torch.where(torch.arange(pages_per_request) < (seq_lens[:, None] + page_size - 1) // page_size,
                           pages, torch.tensor(-1))
    if not torch.equal(tensors[3].cpu(), expected.to(torch.int32)):
        print("MISMATCH against the physical pages", file=sys.stderr)
        return 1
    print("matches the physical pages of each request")
    return 0


def _info(args) -> int:
    from .info import report

    return report(as_json=args.json)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvdispatch", description="KV-cache index tables for LLM decode.")
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="build a small page table on the default device and print it")
    demo.add_argument("--device", help="torch device (default: the current GPU, else CPU)")
    demo.set_defaults(run=_demo)

    info = commands.add_parser("info", help="versions, devices, and the backend chosen for each")
    info.add_argument("--json", action="store_true", help="print JSON")
    info.set_defaults(run=_info)

    bench = commands.add_parser("bench", help="time every backend against the naive loop and plain PyTorch")
    bench_command.add_arguments(bench)
    bench.set_defaults(run=bench_command.main)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
