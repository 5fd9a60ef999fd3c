"""Multi-step speculative draft decode indices (``kvdispatch.create_draft_decode_kv_indices``): every step in one
launch, on the grid ``(segments, programs_per_row)`` of ``kvdispatch.grid.draft_decode_launch``.

Row ``z`` of the grid is segment ``z = b * topk + k`` (request ``b``, branch ``k``). Program ``(z, p)`` of a row
of ``T`` programs loads the blocks of prefix tokens ``[i * TOKENS_PER_PROGRAM, (i + 1) * TOKENS_PER_PROGRAM)``,
``i = p, p + T, ...``, of its request once each and stores them into every step's row; program 0 of the row
also writes the branch's draft slots (loaded once, stored into every step that has them) and its
``kv_indptr`` entries. A segment's offset needs the prefix lengths of
the requests before it: each program sums them itself, ``SUM_BLOCK`` at a time (no second launch, no host
sync), saturating at ``OFFSET_LIMIT`` so that the sum is exact.

``num_steps`` and ``topk`` are runtime ints (loop bounds and a division), so one compilation serves every step
count and branch count, as it serves every batch and width; the page size is a compile-time constant (its
divisions become shifts), as are the options (positions, v2p) and the folded grid.
"""

from __future__ import annotations

import functools
import itertools

import triton
import triton.language as tl

from kvdispatch import grid as launch_grid
from kvdispatch.reference import draft_prefix_cap

from . import launch as _launch
from . import native
from .specialization import Specialization, ast_signature, jit_function, warps

PARAMETERS = ("table_ptr", "pool_ptr", "lens_ptr", "indptr_ptr", "out_ptr", "table_rows", "table_cols",
              "table_row_stride", "out_width", "out_row_stride", "indptr_row_stride", "pool_stride", "lens_stride",
              "num_steps", "topk", "cap", "sink", "write_indptr_start", "round_toward_zero", "positions_ptr",
              "positions_stride", "v2p_ptr", "v2p_len", "step_window")
POINTERS = tuple(name for name in PARAMETERS if name.endswith("_ptr"))
RUNTIME_INTS = tuple(name for name in PARAMETERS if not name.endswith("_ptr"))
CONSTEXPRS = ("TOKENS_PER_PROGRAM", "SUM_BLOCK", "SLOT_BLOCK", "PAGE_SIZE", "OFFSET_LIMIT", "HAS_POSITIONS",
              "HAS_V2P", "FOLDED_GRID", "ENTRY_PAGE_SIZE", "HAS_STEP_WINDOW", "PDL")
# Draft slots loaded per pass (a branch has num_steps of them).
SLOT_BLOCK = 16
# The page sizes compiled ahead of time (``crosscompile``); any other compiles at its first call.
SPECIALISED_PAGE_SIZES = (1, 16, 64)


def _draft_decode_kernel(
    table_ptr, pool_ptr, lens_ptr, indptr_ptr, out_ptr, table_rows: tl.int64, table_cols: tl.int64,
    table_row_stride: tl.int64, out_width: tl.int64, out_row_stride: tl.int64, indptr_row_stride: tl.int64,
    pool_stride: tl.int64, lens_stride: tl.int64, num_steps: tl.int32, topk: tl.int32, cap: tl.int64,
    sink: tl.int64, write_indptr_start: tl.int32, round_toward_zero: tl.int32, positions_ptr, positions_stride,
    v2p_ptr, v2p_len, step_window: tl.int64,
    TOKENS_PER_PROGRAM: tl.constexpr, SUM_BLOCK: tl.constexpr, SLOT_BLOCK: tl.constexpr, PAGE_SIZE: tl.constexpr,
    OFFSET_LIMIT: tl.constexpr, HAS_POSITIONS: tl.constexpr, HAS_V2P: tl.constexpr, FOLDED_GRID: tl.constexpr,
    ENTRY_PAGE_SIZE: tl.constexpr, HAS_STEP_WINDOW: tl.constexpr, PDL: tl.constexpr,
):
    """Segment ``z = program_id(0)`` of every step row; semantics of ``kvdispatch.reference.
    build_draft_decode_indices``. ``cap``: the most prefix tokens (``draft_prefix_cap``); ``sink``: the sink
    tokens with a window, else ``cap`` (the prefix is then positions ``0 .. n - 1``). Program ``p`` of a row
    copies its blocks of TOKENS_PER_PROGRAM prefix tokens ``p, p + T, ...`` (``T``: ``launch.programs_in_row``)
    up to the segment's prefix; program 0 writes the draft slots and ``kv_indptr`` once. ``positions_ptr`` /
    ``positions_stride`` and ``v2p_ptr`` / ``v2p_len`` are None without those options. PDL: launched with
    programmatic dependent launch (``launch.wait_for_producer``). ENTRY_PAGE_SIZE above 1: a page-granular
    table, position ``q`` reading ``row[q // E] * E + q % E`` (``table_cols`` is then the row's positions, ``C *
    E``). HAS_STEP_WINDOW: the per-step sliding window over the prefix and the draft slots
    (``_windowed_steps``; ``step_window`` is not read without it)."""
    _launch.wait_for_producer(PDL)
    segment = tl.program_id(0).to(tl.int64)
    request = segment // topk
    branch = segment - request * topk
    first = _launch.program_in_row(FOLDED_GRID).to(tl.int64) * TOKENS_PER_PROGRAM
    pool = tl.load(pool_ptr + request * pool_stride).to(tl.int64)
    length = tl.load(lens_ptr + request * lens_stride).to(tl.int64)
    # kvdispatch.reference.BOUND: changes no position that can be read, and nothing below can wrap.
    length = tl.minimum(tl.maximum(length, -(2**62)), 2**62)
    count = tl.minimum(tl.maximum(length, 0), cap)
    before = _saturated_prefix_sum(lens_ptr, lens_stride, request, cap, SUM_BLOCK, OFFSET_LIMIT)
    # offset(it) = base + segments_before * it + branch * (count + it), at most OFFSET_LIMIT
    base = tl.minimum(before * topk, OFFSET_LIMIT)
    segments_before = segment - branch
    row_readable = (pool >= 0) & (pool < table_rows)
    row_ptr = table_ptr + pool * table_row_stride

    # Program 0 of a segment also writes the branch's draft slots and its kv_indptr entries. What they read
    # (the first SLOT_BLOCK slots, the positions' sum) is loaded here, with the prefix: no load waits for a
    # store. Masks and counts take the leading test as a bound (masks combine blocks only).
    leads = first == 0
    if HAS_POSITIONS:
        through = _saturated_prefix_sum(positions_ptr, positions_stride, tl.where(leads, segment + 1, 0), cap,
                                        SUM_BLOCK, OFFSET_LIMIT)
    # Draft slots: the branch owns ceil((L mod P + S) / P) pages past the request's length.
    floor_remainder = (length % PAGE_SIZE + PAGE_SIZE) % PAGE_SIZE  # whichever way % rounds
    remainder = tl.where((round_toward_zero != 0) & (length < 0) & (floor_remainder != 0),
                         floor_remainder - PAGE_SIZE, floor_remainder)
    slot_start = length + branch * ((remainder + num_steps + PAGE_SIZE - 1) // PAGE_SIZE * PAGE_SIZE)
    if HAS_STEP_WINDOW:
        _windowed_steps(first, row_ptr, row_readable, length, count, slot_start, segment, request, branch,
                        topk, num_steps, step_window, lens_ptr, lens_stride, positions_ptr, positions_stride,
                        table_cols, v2p_ptr, v2p_len, out_ptr, out_row_stride, out_width, indptr_ptr,
                        indptr_row_stride, write_indptr_start, TOKENS_PER_PROGRAM, SUM_BLOCK, SLOT_BLOCK, PAGE_SIZE,
                        OFFSET_LIMIT, HAS_POSITIONS, HAS_V2P, FOLDED_GRID, ENTRY_PAGE_SIZE)
        _launch.release_dependents(PDL)
        return
    slot = tl.arange(0, SLOT_BLOCK).to(tl.int64)
    slots_read = tl.where(leads & row_readable, num_steps, 0)
    first_slots = _slot_mask(slot, slot_start, slots_read, table_cols)
    first_values = _launch.stored_values(_table_values(row_ptr, slot_start + slot, first_slots, ENTRY_PAGE_SIZE),
                                         first_slots, v2p_ptr, v2p_len, out_ptr, PAGE_SIZE, HAS_V2P)

    if row_readable & (first < count):
        _copy_prefix(first, row_ptr, length, count, sink, table_cols, v2p_ptr, v2p_len, out_ptr, out_row_stride,
                     out_width, num_steps, base, segments_before, branch, TOKENS_PER_PROGRAM, PAGE_SIZE,
                     OFFSET_LIMIT, HAS_V2P, ENTRY_PAGE_SIZE)

    if leads:
        _store_slots(out_ptr, first_values, first_slots, slot, 0, num_steps, base, segments_before, branch, count,
                     out_row_stride, out_width, OFFSET_LIMIT)
        for first_slot in range(SLOT_BLOCK, slots_read, SLOT_BLOCK):  # more than SLOT_BLOCK steps
            later = first_slot + slot
            readable = _slot_mask(later, slot_start, slots_read, table_cols)
            values = _launch.stored_values(_table_values(row_ptr, slot_start + later, readable, ENTRY_PAGE_SIZE),
                                           readable, v2p_ptr, v2p_len, out_ptr, PAGE_SIZE, HAS_V2P)
            _store_slots(out_ptr, values, readable, later, first_slot, num_steps, base, segments_before, branch,
                         count, out_row_stride, out_width, OFFSET_LIMIT)
        indptr_dtype = indptr_ptr.dtype.element_ty
        for step in range(num_steps):
            it = step + 1
            if HAS_POSITIONS:
                end = tl.minimum(through + (segment + 1) * it, OFFSET_LIMIT)
            else:
                end = tl.minimum(base + segments_before * it + branch * (count + it) + count + it, OFFSET_LIMIT)
            tl.store(indptr_ptr + step * indptr_row_stride + segment + 1, end.to(indptr_dtype))
        if (segment == 0) & (write_indptr_start != 0):
            for step in range(num_steps):
                tl.store(indptr_ptr + step * indptr_row_stride, tl.zeros((), indptr_dtype))
    # The segment's further blocks of prefix tokens: a token at or past the table's width reads nothing (its
    # position is at least the token) and one at or past out's width lands past it (so is its column), so
    # they end at min(count, C, W) however long the row claims to be.
    stride = _launch.programs_in_row(FOLDED_GRID).to(tl.int64) * TOKENS_PER_PROGRAM
    tokens_end = tl.minimum(tl.minimum(count, table_cols), out_width)
    for later in range(first + stride, tl.where(row_readable, tokens_end, 0), stride):
        _copy_prefix(later, row_ptr, length, count, sink, table_cols, v2p_ptr, v2p_len, out_ptr, out_row_stride,
                     out_width, num_steps, base, segments_before, branch, TOKENS_PER_PROGRAM, PAGE_SIZE,
                     OFFSET_LIMIT, HAS_V2P, ENTRY_PAGE_SIZE)
    _launch.release_dependents(PDL)


@triton.jit
def _copy_prefix(first, row_ptr, length, count, sink, table_cols, v2p_ptr, v2p_len, out_ptr, out_row_stride,
                 out_width, num_steps, base, segments_before, branch, TOKENS_PER_PROGRAM: tl.constexpr,
                 PAGE_SIZE: tl.constexpr, OFFSET_LIMIT: tl.constexpr, HAS_V2P: tl.constexpr,
                 ENTRY_PAGE_SIZE: tl.constexpr):
    """Prefix tokens ``[first, first + TOKENS_PER_PROGRAM)`` of a segment (below its ``count``), loaded once
    and stored into every step row after the offset of the segment in that step."""
    token = first + tl.arange(0, TOKENS_PER_PROGRAM)
    position = tl.where(token < tl.minimum(sink, count), token, length - count + token)
    copied = (token < count) & (position < table_cols)
    values = _table_values(row_ptr, position, copied, ENTRY_PAGE_SIZE)
    values = _launch.stored_values(values, copied, v2p_ptr, v2p_len, out_ptr, PAGE_SIZE, HAS_V2P)
    for step in range(num_steps):
        it = step + 1
        column = tl.minimum(base + segments_before * it + branch * (count + it), OFFSET_LIMIT) + token
        tl.store(out_ptr + step * out_row_stride + column, values, mask=copied & (column < out_width))


@triton.jit
def _windowed_steps(first, row_ptr, row_readable, length, count, slot_start, segment, request, branch, topk,
                    num_steps, window, lens_ptr, lens_stride, positions_ptr, positions_stride, table_cols, v2p_ptr,
                    v2p_len, out_ptr, out_row_stride, out_width, indptr_ptr, indptr_row_stride, write_indptr_start,
                    TOKENS_PER_PROGRAM: tl.constexpr, SUM_BLOCK: tl.constexpr, SLOT_BLOCK: tl.constexpr,
                    PAGE_SIZE: tl.constexpr, OFFSET_LIMIT: tl.constexpr, HAS_POSITIONS: tl.constexpr,
                    HAS_V2P: tl.constexpr, FOLDED_GRID: tl.constexpr, ENTRY_PAGE_SIZE: tl.constexpr):
    """A segment with a step window ``window``: in step ``it``, its ``keep = min(count + it, window)`` entries,
    the prefix's last ``keep - min(it, window)`` tokens then the latest ``min(it, window)`` draft slots, after the
    widths of the segments before it (``min(n + it, window) = min(n, window - it) + min(it, window)`` for ``n,
    it >= 0``, so each sum is a saturated prefix sum).

    The segment's work is a list of items, one per (step, block of TOKENS_PER_PROGRAM tail entries), steps
    first; program ``k`` of the row's ``T`` takes items ``k, k + T, ...``, so the steps, each a chain of
    dependent loads, run on different programs. Block 0's item of a step also writes that step's draft slots
    and ``kv_indptr`` entry."""
    programs = _launch.programs_in_row(FOLDED_GRID).to(tl.int64)
    token = tl.arange(0, TOKENS_PER_PROGRAM).to(tl.int64)
    slot = tl.arange(0, SLOT_BLOCK).to(tl.int64)
    indptr_dtype = indptr_ptr.dtype.element_ty
    # No step copies more tail entries than min(count, window), the table's width or out's (``tail_end``).
    most = tl.minimum(tl.minimum(count, tl.maximum(window, 0)), tl.minimum(table_cols, out_width))
    blocks = tl.maximum((most + TOKENS_PER_PROGRAM - 1) // TOKENS_PER_PROGRAM, 1)
    for item in range(first // TOKENS_PER_PROGRAM, num_steps * blocks, programs):
        step = item // blocks
        block = (item % blocks) * TOKENS_PER_PROGRAM
        it = step + 1
        chain = tl.minimum(it, window).to(tl.int64)
        room = tl.maximum(window - it, 0).to(tl.int64)
        before = tl.minimum(_saturated_prefix_sum(lens_ptr, lens_stride, request, room, SUM_BLOCK, OFFSET_LIMIT)
                            + request * chain, OFFSET_LIMIT)
        keep = tl.minimum(count + it, window)
        offset = tl.minimum(before * topk + branch * keep, OFFSET_LIMIT)
        tail = keep - chain
        row_out = out_ptr + step * out_row_stride
        # The tail's entries e read position length - tail + e; they end where a position or a column would pass
        # the table's or out's width.
        tail_end = tl.minimum(tl.minimum(tail, tl.maximum(out_width - offset, 0)),
                              tl.maximum(table_cols - length + tail, 0))
        entry = block + token
        position = length - tail + entry
        copied = (entry < tl.where(row_readable, tail_end, 0)) & (position >= 0)
        values = _launch.stored_values(_table_values(row_ptr, position, copied, ENTRY_PAGE_SIZE), copied, v2p_ptr,
                                       v2p_len, out_ptr, PAGE_SIZE, HAS_V2P)
        tl.store(row_out + offset + entry, values, mask=copied)
        if block == 0:
            for first_slot in range(0, tl.where(row_readable, chain, 0), SLOT_BLOCK):
                later = first_slot + slot
                slot_position = slot_start + it - chain + later
                readable = (later < chain) & (slot_position >= 0) & (slot_position < table_cols)
                slot_values = _launch.stored_values(_table_values(row_ptr, slot_position, readable, ENTRY_PAGE_SIZE),
                                                    readable, v2p_ptr, v2p_len, out_ptr, PAGE_SIZE, HAS_V2P)
                column = offset + tail + later
                tl.store(row_out + column, slot_values, mask=readable & (column < out_width))
            if HAS_POSITIONS:
                end = tl.minimum(_saturated_prefix_sum(positions_ptr, positions_stride, segment + 1, room, SUM_BLOCK,
                                                       OFFSET_LIMIT) + (segment + 1) * chain, OFFSET_LIMIT)
            else:
                end = tl.minimum(offset + keep, OFFSET_LIMIT)
            tl.store(indptr_ptr + step * indptr_row_stride + segment + 1, end.to(indptr_dtype))
            if (segment == 0) & (write_indptr_start != 0):
                tl.store(indptr_ptr + step * indptr_row_stride, tl.zeros((), indptr_dtype))


@triton.jit
def _table_values(row_ptr, position, mask, ENTRY_PAGE_SIZE: tl.constexpr):
    """The values at ``position`` of a table row, loaded under ``mask``: the entries, or with ENTRY_PAGE_SIZE
    ``E`` above 1 ``row[q // E] * E + q % E`` (int64; ``q >= 0`` where loaded)."""
    if ENTRY_PAGE_SIZE == 1:
        values = tl.load(row_ptr + position, mask=mask)
    else:
        entry = position // ENTRY_PAGE_SIZE
        values = (tl.load(row_ptr + entry, mask=mask).to(tl.int64) * ENTRY_PAGE_SIZE
                  + (position - entry * ENTRY_PAGE_SIZE))
    return values


@triton.jit
def _slot_mask(slot, slot_start, slots_read, table_cols):
    """Which of the draft slots ``slot`` (a block of indices below ``slots_read``) lie inside the table row."""
    position = slot_start + slot
    return (slot < slots_read) & (position >= 0) & (position < table_cols)


@triton.jit
def _store_slots(out_ptr, values, readable, slot, first_slot, num_steps, base, segments_before, branch, count,
                 out_row_stride, out_width, OFFSET_LIMIT: tl.constexpr):
    """Store draft slot ``j`` (``slot``, from ``first_slot``) into every step row ``it - 1`` with ``j < it``,
    after the segment's ``count`` prefix tokens."""
    for step in range(first_slot, num_steps):
        it = step + 1
        column = tl.minimum(base + segments_before * it + branch * (count + it), OFFSET_LIMIT) + count + slot
        tl.store(out_ptr + step * out_row_stride + column, values,
                 mask=readable & (slot < it) & (column < out_width))


@triton.jit
def _saturated_prefix_sum(values_ptr, stride, count, cap, SUM_BLOCK: tl.constexpr, OFFSET_LIMIT: tl.constexpr):
    """``min(sum(min(max(values[i], 0), cap) for i < count), OFFSET_LIMIT)`` in int64, exactly: each term is at
    most ``cap <= OFFSET_LIMIT``, so a pass's sum cannot wrap."""
    total = tl.zeros((), tl.int64)
    for first in range(0, count, SUM_BLOCK):
        index = first + tl.arange(0, SUM_BLOCK).to(tl.int64)
        terms = tl.load(values_ptr + index * stride, mask=index < count, other=0).to(tl.int64)
        total = tl.minimum(total + tl.sum(tl.minimum(tl.maximum(terms, 0), cap)), OFFSET_LIMIT)
    return total


draft_decode_kernel = triton.jit(_draft_decode_kernel, do_not_specialize=RUNTIME_INTS,
                                 do_not_specialize_on_alignment=POINTERS)
launcher = _launch.register(_launch.KernelLauncher(draft_decode_kernel, CONSTEXPRS))
_plans = _launch.plan_cache(on_clear=functools.partial(native.forget_plans, "draft_decode"))


def constexprs_for(page_size: int, has_positions: bool = False, has_v2p: bool = False,
                   folded_grid: bool = False, pdl: bool = False, entry_page_size: int = 1,
                   has_step_window: bool = False) -> dict:
    """The constexpr arguments of one specialisation (tokens per program and sum block from ``kvdispatch.grid``)."""
    return dict(TOKENS_PER_PROGRAM=launch_grid.items_per_program(launch_grid.DRAFT_DECODE),
                SUM_BLOCK=launch_grid.DRAFT_SUM_BLOCK, SLOT_BLOCK=SLOT_BLOCK, PAGE_SIZE=page_size,
                OFFSET_LIMIT=launch_grid.DRAFT_OFFSET_LIMIT, HAS_POSITIONS=has_positions, HAS_V2P=has_v2p,
                FOLDED_GRID=folded_grid, ENTRY_PAGE_SIZE=entry_page_size, HAS_STEP_WINDOW=has_step_window, PDL=pdl)


def plan_key_and_arguments(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, num_steps, topk, page_size=1,
                           positions=None, window_size=0, sink_size=0, v2p=None, write_indptr_start=True,
                           round_toward_zero=False, pdl=False, entry_page_size=1, step_window=0):
    """The launch-plan key of a call and the kernel's runtime arguments. Key: device index, segments,
    min(C * entry_page_size, W) (the geometry: ``kvdispatch.grid.draft_decode_launch``), the page size, the
    dtypes of the pool, length, indptr, out, positions and v2p tensors (None: absent), pdl and the entry page
    size."""
    rows, entries = req_to_token.shape
    cols = entries * entry_page_size  # the row's positions
    width = out.shape[1]
    segments = req_pool_indices.shape[0] * topk
    cap = draft_prefix_cap(window_size, sink_size)
    sink = min(sink_size, cap) if window_size > 0 else cap
    has_positions, has_v2p = positions is not None, v2p is not None
    key = (out.get_device(), segments, min(cols, width), page_size, req_pool_indices.dtype, seq_lens.dtype,
           kv_indptr.dtype, out.dtype, positions.dtype if has_positions else None, v2p.dtype if has_v2p else None,
           pdl, entry_page_size, step_window > 0)
    args = (req_to_token, req_pool_indices, seq_lens, kv_indptr, out, rows, cols, req_to_token.stride(0), width,
            out.stride(0), kv_indptr.stride(0), req_pool_indices.stride(0), seq_lens.stride(0), num_steps, topk,
            cap, sink, int(write_indptr_start), int(round_toward_zero), positions,
            positions.stride(0) if has_positions else None, v2p, v2p.shape[0] if has_v2p else None, step_window)
    return key, args


def _build_plan(key, out, args):
    geometry = launch_grid.draft_decode_launch(key[1], key[2], key[2], budget=_launch.program_budget(out.device))
    constexprs = constexprs_for(key[3], key[8] is not None, key[9] is not None, geometry.folded, key[10], key[11],
                                key[12])
    return _launch.build_plan(_plans, launcher, key, args, out.device, geometry, (geometry.folded,) + key[3:],
                              constexprs)


def build_draft_decode_indices(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, num_steps, topk,
                               page_size=1, positions=None, window_size=0, sink_size=0, v2p=None,
                               write_indptr_start=True, round_toward_zero=False, entry_page_size=1, step_window=0,
                               pdl=False):
    """Write every draft step's token CSR into ``out`` and ``kv_indptr`` with one launch; semantics of
    ``kvdispatch.ops.draft_decode.reference``; ``pdl``: launch with programmatic dependent launch
    where the device supports it. Arguments arrive validated (the op's ``check_arguments``)."""
    if num_steps == 0:
        return out
    key, args = plan_key_and_arguments(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, num_steps, topk,
                                       page_size, positions, window_size, sink_size, v2p, write_indptr_start,
                                       round_toward_zero, pdl, entry_page_size, step_window)
    _launch.launch_through_plan(_plans, key, args, lambda: _build_plan(key, out, args))
    return out


def compile_specializations(warp_size, page_sizes, index_types):
    """The kernel's ``Specialization``s (``kernels_triton.specialization``), those of ``_ast_sources`` (at its own
    ``SPECIALISED_PAGE_SIZES``: ``page_sizes`` unused)."""
    kernel = jit_function(draft_decode_kernel, POINTERS, RUNTIME_INTS)
    threads = launch_grid.draft_decode_launch(1, 1, 1).threads
    for signature, constexprs in _ast_sources(index_types):
        yield Specialization(kernel, signature, constexprs, warps(threads, warp_size))


def _ast_sources(index_types, page_sizes=SPECIALISED_PAGE_SIZES):
    """Every specialisation engines ask for at ``page_sizes``: yields ``(signature, constexprs)`` for
    ``triton.compiler.ASTSource`` (Triton >= 3.3). Per page size and index dtype (the pool, length and
    positions vectors): int64 or int32 ``out`` with an int32 ``kv_indptr`` (SGLang's Triton and FlashInfer
    backends), without options, with positions, with positions and an int64 v2p; plus the folded grid."""
    for page_size, index, out_type in itertools.product(page_sizes, index_types, ("i64", "i32")):
        for has_positions, has_v2p in ((False, False), (True, False), (True, True)):
            constexprs = constexprs_for(page_size, has_positions, has_v2p)
            yield _specialisation(index, out_type, constexprs)
    yield _specialisation("i32", "i64", constexprs_for(1, folded_grid=True))
    # A page-granular source table (the unified pool's read table), entries of the page size.
    for page_size, index, out_type in itertools.product(page_sizes[1:], index_types, ("i64", "i32")):
        yield _specialisation(index, out_type, constexprs_for(page_size, True, entry_page_size=page_size))
    # The per-step window rail: token-granular with v2p, and over the read table.
    for page_size, index, out_type in itertools.product(page_sizes, index_types, ("i64", "i32")):
        yield _specialisation(index, out_type, constexprs_for(page_size, True, page_size == 1, has_step_window=True,
                                                              entry_page_size=page_size))


def _specialisation(index, out_type, constexprs):
    """``(signature, constexprs)`` of one specialisation: index vectors of dtype ``index``, ``out`` of ``out_type``,
    an int32 ``kv_indptr``, int64 v2p; absent options' parameters constant None."""
    types = dict(pool_ptr=f"*{index}", lens_ptr=f"*{index}", out_ptr=f"*{out_type}", num_steps="i32", topk="i32",
                 write_indptr_start="i32", round_toward_zero="i32")
    constexprs = dict(constexprs)
    if constexprs["HAS_POSITIONS"]:
        types.update(positions_ptr=f"*{index}", positions_stride="i32")
    else:
        constexprs.update(positions_ptr=None, positions_stride=None)
    if constexprs["HAS_V2P"]:
        types.update(v2p_ptr="*i64", v2p_len="i32")
    else:
        constexprs.update(v2p_ptr=None, v2p_len=None)
    return ast_signature(PARAMETERS, constexprs, types), constexprs


# The ops this module launches: ``kernels_triton.KERNELS`` reads them from this source, without importing it.
OP_LAUNCHERS = {"draft_decode": build_draft_decode_indices}
