"""Compile every kernel specialisation the long fuzz can reach, in parallel processes, before the fuzz runs.

On a GPU the fuzz draws page sizes from ``COMPILED_PAGE_SIZES`` and every option and index dtype, which is
hundreds of specialisations per backend (one compilation each, about a second), far more time than the
examples themselves. Triton and CuPy keep compiled kernels in on-disk caches, so compiling them here in
``--jobs`` processes leaves the fuzz processes only cache loads.

Usage: ``python3 ci/warm_kernels.py [--backends triton cupy] [--ops page_table token_csr] [--jobs 16]``.
Prints one line per backend and op: specialisations warmed and seconds taken.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BOOLS = (False, True)
INDEX_DTYPES = ("int32", "int64")


def page_sizes():
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from test_fuzz import COMPILED_PAGE_SIZES

    return COMPILED_PAGE_SIZES


def page_table_options():
    """(page size, with start, with seq_lens_out, with fill, with a seqlen_offset, pool dtype, lens dtype,
    start dtype)."""
    for page, start, lens_out, fill, offset, pool, lens, start_dtype in itertools.product(
            page_sizes(), BOOLS, BOOLS, BOOLS, BOOLS, INDEX_DTYPES, INDEX_DTYPES, INDEX_DTYPES):
        if start or start_dtype == "int32":  # without a start its dtype is irrelevant: count it once
            yield page, start, lens_out, fill, offset, pool, lens, start_dtype


def token_csr_options():
    """(with start, pool dtype, lens dtype, start dtype, indptr dtype)."""
    for start, pool, lens, start_dtype, indptr in itertools.product(BOOLS, *[INDEX_DTYPES] * 4):
        if start or start_dtype == "int32":
            yield start, pool, lens, start_dtype, indptr


def warm(task):
    """One call of the public API with small tensors of the given specialisation on ``device``."""
    import torch

    import kvdispatch

    backend, op, options, device = task
    table = torch.arange(4 * 300, dtype=torch.int32, device=device).view(4, 300)

    def vector(values, dtype):
        return torch.tensor(values, dtype=getattr(torch, dtype), device=device)

    if op == "page_table":
        page, start, lens_out, fill, offset, pool, lens, start_dtype = options
        out = torch.empty(2, 8, dtype=torch.int32, device=device)
        kvdispatch.create_flashmla_kv_indices(
            table, vector([1, 2], pool), vector([100, 250], lens), out, page_size=page,
            kv_start_idx=vector([0, 3], start_dtype) if start else None, seqlen_offset=1 if offset else 0,
            seq_lens_out=torch.empty(2, dtype=torch.int32, device=device) if lens_out else None,
            fill_value=-1 if fill else None, backend=backend)
    else:
        start, pool, lens, start_dtype, indptr = options
        out = torch.empty(400, dtype=torch.int32, device=device)
        kvdispatch.create_flashinfer_kv_indices(
            table, vector([1, 2], pool), vector([100, 250], lens), vector([0, 100, 350], indptr), out,
            kv_start_idx=vector([0, 3], start_dtype) if start else None, backend=backend)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return backend, op


def tasks(backends, ops, device):
    """Every (backend, op, options, device) to warm."""
    options = dict(page_table=list(page_table_options()), token_csr=list(token_csr_options()))
    return [(backend, op, o, device) for backend in backends for op in ops for o in options[op]]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=["triton", "cupy"])
    parser.add_argument("--ops", nargs="+", default=["page_table", "token_csr"])
    parser.add_argument("--jobs", type=int, default=os.cpu_count())
    args = parser.parse_args(argv)
    import torch

    todo = tasks(args.backends, args.ops, torch.device("cuda", 0))
    begin = time.perf_counter()
    # spawn: CUDA cannot be used in a forked child of a process that initialised it.
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        done = {}
        for backend, op in pool.imap_unordered(warm, todo):
            done[backend, op] = done.get((backend, op), 0) + 1
    for (backend, op), count in sorted(done.items()):
        print(f"warmed {backend} {op}: {count} specialisations")
    print(f"warm: {len(todo)} calls in {time.perf_counter() - begin:.0f} s with {args.jobs} processes")


if __name__ == "__main__":
    main()
