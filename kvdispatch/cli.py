"""The ``kvdispatch`` command: ``demo``, ``info``, ``bench`` and ``compile``.

An error ends the command with one line on stderr, ``kvdispatch: error: ...``, and exit status 2 for a
command line that cannot run here (bad arguments, a device or backend this machine lacks) or 1 for a
failed check or an unexpected failure; ``--verbose`` prints the traceback first.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import sys
import time
import traceback

import torch

from . import devices, dispatch, info

PROG = "kvdispatch"


class UsageError(Exception):
    """The command line cannot run here: bad arguments, or a device or backend this machine lacks."""


class CheckFailed(Exception):
    """A result did not match the reference."""


EXIT_STATUS = {UsageError: 2, dispatch.BackendUnavailableError: 2, CheckFailed: 1}


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(f"{message} (see {self.prog} --help)")


class _CommandParser(_Parser):
    """A command's parser. ``add_arguments(parser)``, when given, adds the command's options at its first parse
    (``--help`` included): only when that command is chosen, so its module is not imported for the others."""

    def __init__(self, *args, add_arguments=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._add_arguments = add_arguments

    def parse_known_args(self, args=None, namespace=None):
        if self._add_arguments is not None:
            add_arguments, self._add_arguments = self._add_arguments, None
            add_arguments(self)
        return super().parse_known_args(args, namespace)


def parse_device(text: str) -> torch.device:
    """``--device``: a torch device this machine has."""
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a torch device (e.g. cpu, cuda, cuda:1)") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise argparse.ArgumentTypeError(f"{text}: no GPU here: {devices.no_gpu_reason()}")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise argparse.ArgumentTypeError(f"{text}: this machine has {count} GPU(s), cuda:0 to cuda:{count - 1}")
    return device


def _demo(args) -> int:
    import kvdispatch

    device = kvdispatch.probe(args.device).device
    try:
        requested = dispatch.requested_backend()
    except ValueError as exc:  # KVDISPATCH_BACKEND names no backend
        raise UsageError(str(exc)) from exc
    try:
        backend = kvdispatch.select_backend(device)
    except dispatch.BackendUnavailableError as exc:
        raise UsageError(f"KVDISPATCH_BACKEND={requested}: {exc}") from exc
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
    print(f"device {device}: backend {backend}")
    print(f"seq_lens {seq_lens.tolist()}, page_size {page_size}")
    print("page table (fill_value -1):")
    for row in tensors[3].cpu().tolist():
        print("  ", row)
    expected = torch.where(torch.arange(pages_per_request) < (seq_lens[:, None] + page_size - 1) // page_size,
                           pages, torch.tensor(-1))
    if not torch.equal(tensors[3].cpu(), expected.to(torch.int32)):
        raise CheckFailed(f"the page table built by backend {backend} does not match the physical pages")
    print("matches the physical pages of each request")
    return 0


def _info(args) -> int:
    return info.report(as_json=args.json)


def _bench(args) -> int:
    import kvdispatch

    from .bench import core as bench_command

    device = torch.device(kvdispatch.probe(args.device).device)
    gpu = device.type == "cuda"
    reps = bench_command.QUICK_REPS if args.quick else bench_command.Reps()
    if args.pdl_chain:
        from .bench import pdl as bench_pdl

        cases, run = args.cases or bench_pdl.default_cases(args.quick), bench_pdl.run
    else:
        cases, run = args.cases or bench_command.default_cases(device, args.quick), bench_command.run
    with torch.cuda.device(device) if gpu else contextlib.nullcontext():
        report = run(cases, args.backends, device, reps, args.seed)
    bench_command.print_report(report, args.markdown)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(bench_command.to_json(report), f, indent=2)
    if args.plot:
        bench_command.plot(report, args.plot)
    if report.wrong:
        raise CheckFailed(f"{len(report.wrong)} wrong result(s): {'; '.join(report.wrong)}")
    return 0


def _bench_arguments(parser: argparse.ArgumentParser):
    """The ``bench`` command's options and legend (``kvdispatch.bench``, imported only for this command)."""
    from .bench import core as bench_command

    parser.epilog = bench_command.legend()
    bench_command.add_arguments(parser)
    parser.add_argument("--device", type=parse_device, help="torch device (default: the current GPU, else CPU)")
    _add_common(parser, top_level=False)


def _add_common(parser: argparse.ArgumentParser, top_level: bool):
    # On the top level and on every command, so that it may stand before or after the command's name.
    parser.add_argument("-v", "--verbose", action="store_true", default=False if top_level else argparse.SUPPRESS,
                        help="on an error, print the traceback too")


def _compile(args) -> int:
    if importlib.util.find_spec("triton") is None:
        raise UsageError("kvdispatch compile needs Triton: pip install triton")
    import triton

    from kernels_triton import crosscompile

    try:
        targets = [crosscompile.parse_target(text) for text in args.targets] or list(crosscompile.TARGETS)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    selection = crosscompile.Selection(ordinary=not (args.all or args.pairs), pairs=args.pairs, pdl=args.pdl)
    jobs = args.jobs or crosscompile.default_jobs()
    every = len(crosscompile.Selection().specializations(targets[0]))
    what = ("the programmatic-dependent-launch specialisation of each kernel (NVIDIA targets)" if args.pdl
            else f"all {every} specialisations" if args.all
            else f"every option paired with every other ({len(selection.specializations(targets[0]))} of {every} "
                 f"specialisations)" if args.pairs
            else f"the ordinary specialisations ({len(selection.specializations(targets[0]))} of {every}; "
                 f"--all: every one)")
    compilations = sum(len(selection.specializations(target)) for target in targets)
    cache = args.cache_dir or "a temporary directory, removed at the end"
    print(f"compiling {what} for {len(targets)} target(s), {compilations} compilations, with Triton "
          f"{triton.__version__} in {jobs} process(es); Triton cache: {cache}", flush=True)
    start = time.monotonic()

    def progress(target, done, total):
        if done % max(1, -(-total // 10)) == 0 or done == total:
            print(f"{crosscompile.target_name(target)}: {done}/{total} ({time.monotonic() - start:.0f} s)",
                  flush=True)

    reports = crosscompile.cross_compile(targets, selection, jobs=jobs, cache_dir=args.cache_dir, progress=progress)
    for target, rows in reports.items():
        sizes = [r.binary_bytes for r in rows]
        print(f"{crosscompile.target_name(target)}: {len(rows)} specialisations compiled"
              + (f", binaries {min(sizes)}..{max(sizes)} bytes" if sizes else ""))
    print(f"done in {time.monotonic() - start:.0f} s")
    return 0


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="KV-cache index tables for LLM decode.")
    parser.add_argument("--version", action="version", version=f"{PROG} {info.kvdispatch_version()}")
    _add_common(parser, top_level=True)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_CommandParser)

    demo = commands.add_parser("demo", help="build a small page table on the default device and print it")
    demo.add_argument("--device", type=parse_device, help="torch device (default: the current GPU, else CPU)")
    demo.set_defaults(run=_demo)

    info_ = commands.add_parser("info", help="versions, devices, and the backend chosen for each")
    info_.add_argument("--json", action="store_true", help="print JSON")
    info_.set_defaults(run=_info)

    bench = commands.add_parser(
        "bench", help="time every backend against the naive loop and plain PyTorch",
        description="Time every op (page table, token CSR, the mapped page tables, draft decode, DCP) of\n"
                    "every backend that can run on the device, through the public API, against baselines.\n"
                    "Every result is checked against kvdispatch.reference; a wrong one fails the run (exit\n"
                    "status 1).",
        formatter_class=argparse.RawDescriptionHelpFormatter, add_arguments=_bench_arguments)
    bench.set_defaults(run=_bench)
    compile_ = commands.add_parser(
        "compile", help="compile the Triton kernels for GPU targets, here, without a GPU",
        description="Compile the Triton kernel specialisations for each target (default: NVIDIA Hopper and\n"
                    "Blackwell, AMD CDNA3 and CDNA4) in worker processes, with progress lines, and print one\n"
                    "line per target: a check, before a deployment, that the installed Triton builds kvdispatch\n"
                    "for its GPUs. By default the ordinary specialisations (what calls without options use: a\n"
                    "few minutes on two cores); --pairs builds every value of each option together with every\n"
                    "value of every other (about twice as many); --all every specialisation the launchers can ask\n"
                    "for (some twenty times as many). Triton's cache is a private temporary directory, removed\n"
                    "at the end, unless --cache-dir names one.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    compile_.add_argument("targets", nargs="*", metavar="TARGET",
                          help="backend:arch:warp_size, e.g. cuda:90:32 or hip:gfx942:64")
    which = compile_.add_mutually_exclusive_group()
    which.add_argument("--all", action="store_true", help="every specialisation, not only the ordinary ones")
    which.add_argument("--pairs", action="store_true",
                       help="the ordinary specialisations and enough others that each option is built with every "
                            "value of every other option")
    which.add_argument("--pdl", action="store_true",
                       help="each kernel's specialisation with programmatic dependent launch (NVIDIA targets)")
    compile_.add_argument("--jobs", "-j", type=_positive, metavar="N",
                          help="worker processes (default: one per CPU this process may use)")
    compile_.add_argument("--cache-dir", metavar="DIR",
                          help="Triton's cache for the compilation (created if missing, kept afterwards)")
    compile_.set_defaults(run=_compile)
    for command in (demo, info_, compile_):  # bench: in _bench_arguments, after its own options
        _add_common(command, top_level=False)
    return parser


def _one_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def main(argv=None) -> int:
    args = None
    try:
        args = build_parser().parse_args(argv)
        return args.run(args)
    except Exception as exc:
        status = next((code for kind, code in EXIT_STATUS.items() if isinstance(exc, kind)), None)
        if getattr(args, "verbose", False):
            traceback.print_exc()
        if status is None:  # not an error the command expects: name its type
            status, message = 1, f"{type(exc).__name__}: {_one_line(exc)}"
            if not getattr(args, "verbose", False):
                message += " (--verbose prints the traceback)"
        else:
            message = _one_line(exc)
        print(f"{PROG}: error: {message}", file=sys.stderr)
        return status


if __name__ == "__main__":
    raise SystemExit(main())
