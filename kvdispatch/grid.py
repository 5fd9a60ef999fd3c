"""Launch geometry shared by every GPU backend (pure Python: no torch, triton or cupy import).

Every kernel runs on a grid ``(batch, programs_per_row)``. A row's items (pages or tokens) fall into blocks
of ``items_per_program`` items; program ``(b, k)`` of a row of ``T`` programs handles the blocks ``k, k + T,
k + 2T, ...`` of row ``b``, up to the row's real length, which the kernel reads on the device (it stops at
the row's last block; a program with no block of its own exits at once). ``items_per_program`` depends
only on the kernel kind and the page size, never on the batch or the width, so a compiled kernel is
reused for every shape (one compilation per page size and option set); ``T`` is the grid's, read by the
kernel (``tl.num_programs``, ``gridDim``), never a kernel argument, so any grid is correct.

The programs per row follow the device, the batch and the width: at most the blocks the buffer width
needs, and, given a ``budget`` (the programs one launch may use on the device, ``program_budget`` of its
multiprocessors), at most ``max(1, budget // batch)``. A CUDA graph captured with buffers sized for the
maximum context thus launches a bounded number of programs, whose work follows the rows' real lengths at
replay; without a budget each program owns one block (the width-sized grid). The Triton page table
(``kernels_triton.page_table``) reads the same grid differently where a row has several programs: program
``(b, k)`` handles block ``k`` of row ``b``, and the blocks of every row past its first ``T`` are shared by
the programs of its group of rows, so a few long rows are served by many programs.

Every grid is a 3-tuple within the limits of every supported vendor (``MAX_GRID_*``): a row of up to
``MAX_GRID_Y`` programs is ``(batch, programs, 1)``; a wider one is folded into the third dimension,
``(batch, MAX_GRID_Y, ceil(programs / MAX_GRID_Y))``, and its program index is ``y + z * MAX_GRID_Y``
(``Launch.folded``: the kernels compute that sum only in a specialisation of their own, so ordinary
calls run unchanged code; the blocks of the last slice past the row's programs take the blocks that
their index names, or none). A batch above ``max_batch`` rows (2**32 - 1 threads in the first dimension
on AMD: 16,777,215 requests at 256 threads per program, 67,108,863 at 64), or a row too wide even folded,
raises ``GridLimitError`` (a ``ValueError``) before anything is launched or written.
"""

from __future__ import annotations

from dataclasses import dataclass

PAGE_TABLE = "page_table"
TOKEN_CSR = "token_csr"
# The page tables translated through a lookup table (the TRT-LLM MHA table with its SWA twin, the unified
# pool's translated table): per page one slot gather then one lookup, on the page table's programs.
MAPPED_PAGE_TABLE = "mapped_page_table"
DRAFT_DECODE = "draft_decode"
DCP_TOKEN_CSR = "dcp_token_csr"
DCP_PAGE_TABLE = "dcp_page_table"
KINDS = (PAGE_TABLE, TOKEN_CSR, MAPPED_PAGE_TABLE, DRAFT_DECODE, DCP_TOKEN_CSR, DCP_PAGE_TABLE)

MAX_PAGE_SIZE = 4096
# Decode context parallel: ranks per request (dcp_size). A virtual page of page_size * dcp_size positions then
# stays below 2**22, so every divisor and stride the DCP kernels take is a 32-bit constant.
MAX_DCP_SIZE = 1024
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
# Programs per multiprocessor a bounded launch may use (``program_budget``): enough resident programs to hide
# the latency of a row's dependent loads, few enough that a graph captured with max-context buffers launches
# far fewer programs than the buffers' blocks. On an H200 (benchmarks/grid_budget.py and the bench's decode-shape
# cases at 8, 12 and 16: docs/performance.md) 8 keeps short rows within 1.15x of a grid sized from their real
# lengths; 16 costs them up to 1.6x, and gains up to 4% on full-length page-1 copies of 256 rows and on long rows.
PROGRAMS_PER_MULTIPROCESSOR = 8

# Grid limits that hold on every supported vendor (blocks per dimension; the kernels' blocks are 1-D):
#   NVIDIA (CUDA): (2**31 - 1, 65535, 65535) blocks.
#   AMD (HIP): (2**31 - 1) blocks in each dimension, and blocks x threads per block at most 2**32 - 1 in each
#   (a launch past that fails with hipErrorInvalidConfiguration), which binds the first dimension only.
MAX_GRID_X = 2**31 - 1
MAX_GRID_Y = 65535
MAX_GRID_Z = 65535
MAX_GRID_X_THREADS = 2**32 - 1


class GridLimitError(ValueError):
    """The call needs a grid beyond ``MAX_GRID_*``: an error of that call (raised before any launch),
    never a reason to take a backend out of selection."""


@dataclass(frozen=True)
class Launch:
    """Launch geometry of one kernel call.

    grid: ``(batch, programs_y, programs_z)``: ``(0, 0, 0)`` when there is nothing to launch; otherwise
    every entry is at least 1 and within ``MAX_GRID_*``, and a row's program ``k`` is block
    ``(b, k % programs_y, k // programs_y)``.
    items_per_program: pages (page table) or tokens (CSR) of one block, a program's work per pass; a power of
    two.
    threads: suggested threads per program (a multiple of 64), 8 items per thread at most per pass.
    """

    grid: tuple[int, int, int]
    items_per_program: int
    threads: int

    @property
    def folded(self) -> bool:
        """The row's programs span the third dimension: the kernel must add ``z * programs_y``."""
        return self.grid[2] > 1


def _pow2_floor(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def _clamp(value: int, low: int, high: int) -> int:
    return max(low, min(value, high))


def items_per_program(kind: str, page_size: int = 1) -> int:
    """Pages (``page_table``) or tokens (``token_csr``) one program owns; depends on nothing else."""
    if kind in (PAGE_TABLE, DCP_PAGE_TABLE):
        if not 1 <= page_size <= MAX_PAGE_SIZE:
            raise ValueError(f"page_size must be in [1, {MAX_PAGE_SIZE}], got {page_size}")
        return _clamp(_pow2_floor(_PAGE_TABLE_SPAN // page_size), _MIN_PAGES_PER_PROGRAM, _MAX_PAGES_PER_PROGRAM)
    if kind in (TOKEN_CSR, DCP_TOKEN_CSR):
        return _TOKENS_PER_PROGRAM
    if kind == MAPPED_PAGE_TABLE:
        return items_per_program(PAGE_TABLE, page_size)
    if kind == DRAFT_DECODE:
        return _DRAFT_TOKENS_PER_PROGRAM
    raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")


def threads_per_program(items: int) -> int:
    """Threads for a program owning ``items`` items: 8 items (two 16-byte accesses) per thread, 64..256.

    Measured on an H200 (benchmarks/perf_probe.py): 1024 tokens per program copy 4% faster with 128 threads than
    with 256, whose threads each issue a single 16-byte access.
    """
    return _clamp(items // 8, _MIN_THREADS, _MAX_THREADS)


def max_batch(threads: int) -> int:
    """The most rows (requests) one launch of ``threads``-thread programs can take on every vendor."""
    return min(MAX_GRID_X, MAX_GRID_X_THREADS // threads)


def program_budget(multiprocessors: int) -> int:
    """The programs one launch may use on a device of ``multiprocessors`` multiprocessors (compute units on
    AMD): ``multiprocessors * PROGRAMS_PER_MULTIPROCESSOR``, at least 1. The launchers pass it as ``budget``."""
    return max(1, multiprocessors * PROGRAMS_PER_MULTIPROCESSOR)


def _launch(batch: int, span: int, items: int, span_name: str, threads: int | None = None,
            budget: int | None = None) -> Launch:
    """The ``Launch`` of ``batch`` rows of ``span`` items each, ``items`` per block, on ``threads`` threads
    per program (default ``threads_per_program(items)``): a row's programs are its blocks, at most
    ``max(1, budget // batch)`` of them with a ``budget``. Raises ``GridLimitError`` when the batch does not
    fit ``MAX_GRID_X``, or the row's blocks would not fit the other two dimensions (with or without a budget,
    so that a call fails alike on every device; ``span_name``: the argument that sets ``span``)."""
    threads = threads or threads_per_program(items)
    programs = -(-span // items)
    if batch <= 0 or programs <= 0:
        return Launch((0, 0, 0), items, threads)
    rows = max_batch(threads)
    if batch > rows:
        raise GridLimitError(f"batch (req_pool_indices.shape[0]) must be at most {rows} for one launch (the GPU "
                             f"grid's first dimension takes one request per block), got {batch}")
    if -(-programs // MAX_GRID_Y) > MAX_GRID_Z:
        raise GridLimitError(f"{span_name} must be at most {MAX_GRID_Y * MAX_GRID_Z * items} (the GPU grid's "
                             f"other two dimensions take {items} per block), got {span}")
    if budget is not None:
        programs = min(programs, max(1, budget // batch))
    return Launch((batch, min(programs, MAX_GRID_Y), -(-programs // MAX_GRID_Y)), items, threads)


def page_table_launch(batch: int, width: int, page_size: int, writes_lengths: bool = False, *,
                      budget: int | None = None) -> Launch:
    """Geometry of the page-table kernel for ``batch`` rows of an output ``width`` pages wide, within
    ``budget`` programs (``program_budget``; None: one program per block of the width).

    writes_lengths: the call also writes ``seq_lens_out``, which a zero-width table still needs: each
    row then gets one program.
    """
    span = max(width, 1 if writes_lengths else 0)
    return _launch(batch, span, items_per_program(PAGE_TABLE, page_size), "the page-table width (out.shape[1])",
                   budget=budget)


def token_csr_launch(batch: int, table_width: int, out_len: int, *, budget: int | None = None) -> Launch:
    """Geometry of the token-CSR kernel (``budget`` as for ``page_table_launch``).

    A row copies at most ``min(table_width, out_len)`` tokens (it can read no more than one table row
    and write no more than the whole output), so that bounds the programs per row without a sync.
    """
    return _launch(batch, min(table_width, out_len), items_per_program(TOKEN_CSR),
                   "min(req_to_token.shape[1], out.shape[0])", budget=budget)


def mapped_page_table_launch(batch: int, width: int, page_size: int, *, budget: int | None = None) -> Launch:
    """Geometry of the mapped page-table kernels for ``batch`` rows of ``width`` pages: the widest table a
    call writes (MHA: ``max(W, W2)``; translated: ``min(max_pages, W)``); ``budget`` as for
    ``page_table_launch``."""
    return _launch(batch, width, items_per_program(MAPPED_PAGE_TABLE, page_size), "the page-table width",
                   budget=budget)


# Multi-step draft decode indices (``kvdispatch.create_draft_decode_kv_indices``). Offsets and counted lengths
# saturate at DRAFT_OFFSET_LIMIT (out is never wider), so with at most 2**31 - 1 segments and the step and
# branch counts below, every sum and product the kernels form stays exact in int64.
DRAFT_OFFSET_LIMIT = 2**32
DRAFT_MAX_STEPS = 1024
DRAFT_MAX_TOPK = 1024
# Prefix tokens per program, each loaded once and stored num_steps times, four per thread: where few segments
# make the build latency-bound, more programs of fewer tokens finish sooner (H200,
# benchmarks/draft_program_size.py: 512 tokens on 128 threads replayed in 0.89-0.95x the time of 1024 on 128
# at 4x2048x5x1 and 8x1024x3x4, 0.97-1.03x elsewhere).
_DRAFT_TOKENS_PER_PROGRAM = 512
_DRAFT_THREADS = 128
# Lengths (or positions) of earlier segments summed per pass of a program's prefix sum.
DRAFT_SUM_BLOCK = 512


def draft_decode_launch(segments: int, table_width: int, out_width: int, *, budget: int | None = None) -> Launch:
    """Geometry of the draft-decode kernel: one row per segment (request and branch), programs over the
    prefix tokens a segment can write, ``min(table_width, out_width)`` (a prefix token reads a position below
    the table's width and lands at a column below out's), and at least one program per row (program 0 also
    writes the draft slots and ``kv_indptr``); ``budget`` as for ``page_table_launch``."""
    return _launch(segments, max(min(table_width, out_width), 1), _DRAFT_TOKENS_PER_PROGRAM,
                   "min(req_to_token.shape[1], out.shape[1])", _DRAFT_THREADS, budget)


def dcp_token_csr_launch(batch: int, table_width: int, out_len: int, dcp_size: int, *,
                         budget: int | None = None) -> Launch:
    """Geometry of the DCP token-CSR kernel: a row reads every ``dcp_size``-th position of its table row, so
    it writes at most ``min(ceil(table_width / dcp_size), out_len)`` entries; ``budget`` as for
    ``page_table_launch``."""
    return _launch(batch, min(-(-table_width // dcp_size), out_len), items_per_program(DCP_TOKEN_CSR),
                   "min(ceil(req_to_token.shape[1] / dcp_size), out.shape[0])", budget=budget)


def dcp_page_table_launch(batch: int, width: int, page_size: int, *, budget: int | None = None) -> Launch:
    """Geometry of the DCP page-table kernel for ``batch`` rows of an output ``width`` pages wide (pages per
    program as the page table's: each page is one gather either way); ``budget`` as for
    ``page_table_launch``."""
    return _launch(batch, width, items_per_program(DCP_PAGE_TABLE, page_size), "the page-table width (out.shape[1])",
                   budget=budget)


# One decode step's metadata (``kvdispatch.update_decode_metadata``): lengths summed this many at a time by each
# row's first program (the lengths before its row: a prefix sum without a second launch or a host sync).
DECODE_METADATA_SUM_BLOCK = 256


def decode_metadata_launch(batch: int, width: int, page_size: int, *, budget: int | None = None) -> Launch:
    """Geometry of the decode-metadata kernel: the mapped page table's over the widest table it writes
    (``width``, 0 without one), with at least one row and one program per row, which write the lengths, the
    prefix sums and, all programs together, the sliding-window cache locations; ``budget`` as for
    ``page_table_launch``."""
    return _launch(max(batch, 1), max(width, 1), items_per_program(MAPPED_PAGE_TABLE, page_size),
                   "the page-table width", budget=budget)
# Per-request slices of the token table gathered into cache locations (``kvdispatch.create_cache_locs``): packed
# one after another or at a fixed width per request. Lengths and the packed offsets saturate at
# CACHE_LOCS_OFFSET_LIMIT (out is never longer), so every sum the kernels form stays exact in int64.
CACHE_LOCS_OFFSET_LIMIT = 2**32
# Speculative slices are short (a few to a few hundred tokens): small programs, many rows per launch.
CACHE_LOCS_ENTRIES_PER_PROGRAM = 256
# Lengths of earlier requests summed per pass of a program's packed offset.
CACHE_LOCS_SUM_BLOCK = 256
# Two token CSRs merged row by row (``kvdispatch.create_merged_kv_indices``, on the token CSR's grid): lengths of
# earlier requests summed per pass of a program's row start (a vector of the token CSR's 2,048 costs eight times
# the lanes where a batch has a few hundred rows).
MERGED_SUM_BLOCK = 256


def cache_locs_launch(batch: int, table_width: int, out_len: int, *, budget: int | None = None) -> Launch:
    """Geometry of the cache-locations kernel: a row writes at most ``min(table_width, out_len)`` entries (each
    reads its own position of one table row and lands at its own entry of ``out``), whatever its claimed
    length; ``budget`` as for ``page_table_launch``."""
    return _launch(batch, min(table_width, out_len), CACHE_LOCS_ENTRIES_PER_PROGRAM,
                   "min(req_to_token.shape[1], out.shape[0])", budget=budget)


# Compacted CSR (``kvdispatch.create_compact_kv_indices``): a row copies every ``step``-th entry of a source row,
# with the token CSR's tokens per program.
COMPACT_CSR = "compact_csr"


def compact_csr_launch(batch: int, source_width: int, out_len: int, step: int, *, budget: int | None = None) -> Launch:
    """Geometry of the compacted-CSR kernel: a row writes at most ``min(ceil(source_width / step), out_len)``
    entries, and at least one program per row (an empty request's placeholder entry); ``budget`` as for
    ``page_table_launch``."""
    return _launch(batch, max(min(-(-source_width // step), out_len), 1), _TOKENS_PER_PROGRAM,
                   "min(ceil(source.shape[1] / step), out.shape[0])", budget=budget)


# The token CSR over a gathered prefix+extend buffer (``kvdispatch.create_prefix_extend_kv_indices``): its values
# are positions, read from nothing, so a row's span is bounded by the output alone.
PREFIX_EXTEND_CSR = "prefix_extend_csr"


def prefix_extend_csr_launch(batch: int, out_len: int, *, budget: int | None = None) -> Launch:
    """Geometry of the prefix+extend CSR kernel: a row writes at most ``out_len`` entries; ``budget`` as for
    ``page_table_launch``."""
    return _launch(batch, out_len, _TOKENS_PER_PROGRAM, "out.shape[0]", budget=budget)
# A draft model's compact token-table rows (``kvdispatch.build_compact_draft_rows``): a windowed draft's row holds
# a few thousand columns at most, written in small blocks.
COMPACT_DRAFT_ROWS_ENTRIES_PER_PROGRAM = 256


def compact_draft_rows_launch(batch: int, draft_width: int, *, budget: int | None = None) -> Launch:
    """Geometry of the compact-draft-rows kernel: a request writes at most ``draft_width`` columns of its draft
    row, whatever its claimed length; ``budget`` as for ``page_table_launch``."""
    return _launch(batch, draft_width, COMPACT_DRAFT_ROWS_ENTRIES_PER_PROGRAM, "draft_req_to_token.shape[1]",
                   budget=budget)
