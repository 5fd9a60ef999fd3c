"""Launch geometry shared by every GPU backend (pure Python: no torch, triton or cupy import).

Both kernels run on a 2-D grid ``(batch, programs_per_row)``. Program ``(b, k)`` owns the items
``[k * items_per_program, (k + 1) * items_per_program)`` of row ``b``; programs past a row's length exit
at once. ``items_per_program`` depends only on the kernel kind and the page size, never on the batch or
the width, so a compiled kernel is reused for every shape (one compilation per page size and option set).
The grid's second dimension depends only on the buffer width, so a CUDA graph captured with fixed buffers
stays valid whatever the lengths are at replay.
"""

from __future__ import annotations

from dataclasses import dataclass

PAGE_TABLE = "page_table"
TOKEN_CSR = "token_csr"
KINDS = (PAGE_TABLE, TOKEN_CSR)

MAX_PAGE_SIZE = 4096
# A program of the page-table kernel reads about this many table entries' worth of positions: few pages
# when pages are large (each page is an independent 4-byte gather), many when pages are small (the
# positions are then nearly contiguous and are read with wide loads).
_PAGE_TABLE_SPAN = 4096
_MIN_PAGES_PER_PROGRAM = 16
_MAX_PAGES_PER_PROGRAM = 1024
_TOKENS_PER_PROGRAM = 2048
# Threads per program: a multiple of 64 so that it is whole wavefronts on AMD and whole warps on NVIDIA.
_MIN_THREADS = 64
_MAX_THREADS = 256


@dataclass(frozen=True)
class Launch:
    """Launch geometry of one kernel call.

    grid: ``(batch, programs_per_row)``; either may be 0 (then nothing is launched).
    items_per_program: pages (page table) or tokens (CSR) owned by one program; a power of two.
    threads: suggested threads per program (a multiple of 64), 8 items per thread at most per pass.
    """

    grid: tuple[int, int]
    items_per_program: int
    threads: int


def _pow2_floor(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def _clamp(value: int, low: int, high: int) -> int:
    return max(low, min(value, high))


def items_per_program(kind: str, page_size: int = 1) -> int:
    """Pages (``page_table``) or tokens (``token_csr``) one program owns; depends on nothing else."""
    if kind == PAGE_TABLE:
        if not 1 <= page_size <= MAX_PAGE_SIZE:
            raise ValueError(f"page_size must be in [1, {MAX_PAGE_SIZE}], got {page_size}")
        return _clamp(_pow2_floor(_PAGE_TABLE_SPAN // page_size), _MIN_PAGES_PER_PROGRAM, _MAX_PAGES_PER_PROGRAM)
    if kind == TOKEN_CSR:
        return _TOKENS_PER_PROGRAM
    raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")


def threads_per_program(items: int) -> int:
    """Threads for a program owning ``items`` items: 8 items (two 16-byte accesses) per thread, 64..256.

    Measured on an H200 (benchmarks/perf_probe.py): 1024 tokens per program copy 4% faster with 128 threads than
    with 256, whose threads each issue a single 16-byte access.
    """
    return _clamp(items // 8, _MIN_THREADS, _MAX_THREADS)


def page_table_launch(batch: int, width: int, page_size: int, writes_lengths: bool = False) -> Launch:
    """Geometry of the page-table kernel for ``batch`` rows of an output ``width`` pages wide.

    writes_lengths: the call also writes ``seq_lens_out``, which a zero-width table still needs: each
    row then gets one program.
    """
    items = items_per_program(PAGE_TABLE, page_size)
    programs = -(-max(width, 1 if writes_lengths else 0) // items) if batch > 0 else 0
    return Launch((batch if programs else 0, programs), items, threads_per_program(items))


def token_csr_launch(batch: int, table_width: int, out_len: int) -> Launch:
    """Geometry of the token-CSR kernel.

    A row copies at most ``min(table_width, out_len)`` tokens (it can read no more than one table row
    and write no more than the whole output), so that bounds the programs per row without a sync.
    """
    items = items_per_program(TOKEN_CSR)
    span = min(table_width, out_len)
    programs = -(-span // items) if batch > 0 else 0
    return Launch((batch if programs else 0, programs), items, threads_per_program(items))
