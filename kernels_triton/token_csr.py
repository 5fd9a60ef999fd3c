"""Token-level CSR indices (FlashInfer-style) on the grid ``(batch, programs_per_row)`` of ``kvdispatch.grid``.

Program ``(b, k)`` of a row of ``T`` programs copies the blocks of tokens ``j`` in ``skip_b + [i *
TOKENS_PER_PROGRAM, (i + 1) * TOKENS_PER_PROGRAM)``, ``i = k, k + T, ...``, of request ``b``'s table row to
``out[kv_indptr[b] + j]``, up to the row's last token, where ``skip_b = max(0, -kv_indptr[b])`` is the first
token that lands in ``out``; a long row is spread over many programs. The options (an entry page size
above 1, a token mapping, an int64 ``out``) are specialisations of their own: an ordinary call compiles to
the code it compiled to without them.
"""

from __future__ import annotations

import functools
import itertools

import triton
import triton.language as tl

from kvdispatch import grid as launch_grid

from . import launch as _launch
from . import native
from .page_table import page_shift
from .specialization import Specialization, ast_signature, jit_function, warps

# The kernel's parameters, in the order it takes them. A call whose index vectors are contiguous and whose
# table and output sizes and strides are all below 2**31 (any real ones) reads only the first eight (the
# start pointer only with a start): the five pointers every call needs, two words that pack the sizes in
# 32-bit fields (``launch.csr_packed_words``) and the start pointer, 64 bytes, one line of the constant bank. Each
# further line read cost the page-table kernel 1.5-3% on the H200 (benchmarks/ablation.py); this kernel
# read two and replayed 2-6% slower than a one-line copy (benchmarks/csr_layout.py).
PARAMETERS = ("table_ptr", "pool_ptr", "lens_ptr", "indptr_ptr", "out_ptr", "packed_table", "packed_sizes",
              "start_ptr", "table_rows", "table_cols", "table_row_stride", "out_len", "pool_stride", "lens_stride",
              "indptr_stride", "start_stride", "mapping_ptr", "mapping_len", "v2p_ptr", "v2p_len")
POINTERS = tuple(name for name in PARAMETERS if name.endswith("_ptr"))
RUNTIME_INTS = tuple(name for name in PARAMETERS if not name.endswith("_ptr"))
# Without a token mapping its two parameters are passed as None, which Triton compiles as constants (and
# would with a type annotation too, hence none on ``mapping_len``): the compiled kernel then does not take them.
CONSTEXPRS = ("TOKENS_PER_PROGRAM", "HAS_START", "UNIT_STRIDES", "WIDE_INDEXING", "FOLDED_GRID", "ENTRY_PAGE_SIZE",
              "ENTRY_SHIFT", "HAS_MAPPING", "V2P_PAGE_SIZE", "PDL")
# The entry page sizes compiled ahead of time (``crosscompile``); any other in [1, MAX_PAGE_SIZE] compiles
# at its first call, as a page size of the page-table kernel does.
SPECIALISED_ENTRY_PAGE_SIZES = (1, 16, 64)
WIDE = _launch.WIDE


def _token_csr_kernel(
    table_ptr, pool_ptr, lens_ptr, indptr_ptr, out_ptr, packed_table: tl.int64, packed_sizes: tl.int64, start_ptr,
    table_rows: tl.int64, table_cols: tl.int64, table_row_stride: tl.int64, out_len: tl.int64,
    pool_stride: tl.int64, lens_stride: tl.int64, indptr_stride: tl.int64, start_stride: tl.int64,
    mapping_ptr, mapping_len, v2p_ptr, v2p_len,
    TOKENS_PER_PROGRAM: tl.constexpr, HAS_START: tl.constexpr, UNIT_STRIDES: tl.constexpr,
    WIDE_INDEXING: tl.constexpr, FOLDED_GRID: tl.constexpr, ENTRY_PAGE_SIZE: tl.constexpr,
    ENTRY_SHIFT: tl.constexpr, HAS_MAPPING: tl.constexpr, V2P_PAGE_SIZE: tl.constexpr, PDL: tl.constexpr,
):
    """``out[indptr[b] + j] = table[pool[b], start[b] + j]`` for the program's tokens ``j`` below
    ``min(lens[b], C - start[b])`` whose target lies in ``[0, out_len)``; the others are masked. Program ``k``
    of a row handles its blocks of TOKENS_PER_PROGRAM tokens ``k, k + T, ...`` (``T``:
    ``launch.programs_in_row``), counted from the row's first token inside ``out``, up to its last.

    With ``E = ENTRY_PAGE_SIZE`` above 1, position ``q = start[b] + j`` reads entry ``q // E`` and
    writes ``entry * E + q % E`` (64-bit), below ``min(lens[b], C * E - start[b])``; ENTRY_SHIFT is
    log2(E) for powers of two, else -1. HAS_MAPPING: the value ``v`` becomes ``mapping[v]`` for ``v`` in
    ``[0, mapping_len)``, else -1 (``mapping_ptr`` and ``mapping_len`` are None without it). The value is
    stored in ``out``'s dtype (int32: its low 32 bits). ``P = V2P_PAGE_SIZE`` above 0 (the unified pool's
    translated stream; ENTRY_PAGE_SIZE 1, no mapping): position ``q`` reads the slot ``t`` at ``q - q % P`` and
    writes ``max(v2p[v], 0) * P + q % P``, ``v = 0 if t < 0 else t // P``, entry 0 for ``v >= v2p_len``
    (``v2p_ptr`` and ``v2p_len`` are None with ``V2P_PAGE_SIZE`` 0).

    UNIT_STRIDES: the index vectors are contiguous (their strides are not read). WIDE_INDEXING: some size
    or stride is ``WIDE`` or more (``launch.csr_packed_words``), so the full-width parameters are read; otherwise
    ``packed_table`` and ``packed_sizes`` stand in for them. FOLDED_GRID: the row's programs span the
    grid's second and third dimensions (``launch.program_in_row``). PDL: launched with programmatic dependent
    launch (``launch.wait_for_producer``).
    """
    _launch.wait_for_producer(PDL)
    if UNIT_STRIDES:
        start_stride = 1
    row, pool, length, target_start, table_rows, table_cols, table_row_stride, out_len = _launch.csr_row_header(
        pool_ptr, lens_ptr, indptr_ptr, packed_table, packed_sizes, table_rows, table_cols, table_row_stride,
        out_len, pool_stride, lens_stride, indptr_stride, UNIT_STRIDES, WIDE_INDEXING)
    if HAS_START:
        start = tl.load(start_ptr + row * start_stride).to(tl.int64)
    else:
        start = tl.zeros((), tl.int64)

    row_positions = table_cols
    if ENTRY_PAGE_SIZE != 1:
        row_positions = table_cols * ENTRY_PAGE_SIZE  # exact: no table has 2**51 columns
    readable = (pool >= 0) & (pool < table_rows) & (start >= 0) & (start < row_positions)
    count = tl.where(readable, tl.minimum(length, row_positions - start), 0)
    # The tokens that land in out are j in [skip, end): at most min(C, N) of them, which is what the
    # grid gives a row, so the row's programs start counting at ``skip``, not at token 0.
    skip = tl.maximum(-target_start, 0)
    end = tl.minimum(count, out_len - target_start)
    first = skip + _launch.program_in_row(FOLDED_GRID) * TOKENS_PER_PROGRAM
    if first < end:
        _copy_tokens(first, end, table_ptr, pool, table_row_stride, start, target_start, out_ptr, mapping_ptr,
                     mapping_len, v2p_ptr, v2p_len, TOKENS_PER_PROGRAM, ENTRY_PAGE_SIZE, ENTRY_SHIFT, HAS_MAPPING,
                     V2P_PAGE_SIZE)
    step = _launch.programs_in_row(FOLDED_GRID) * TOKENS_PER_PROGRAM
    for later in range(first + step, end, step):
        _copy_tokens(later, end, table_ptr, pool, table_row_stride, start, target_start, out_ptr, mapping_ptr,
                     mapping_len, v2p_ptr, v2p_len, TOKENS_PER_PROGRAM, ENTRY_PAGE_SIZE, ENTRY_SHIFT, HAS_MAPPING,
                     V2P_PAGE_SIZE)
    _launch.release_dependents(PDL)


@triton.jit
def _copy_tokens(first, end, table_ptr, pool, table_row_stride, start, target_start, out_ptr, mapping_ptr,
                 mapping_len, v2p_ptr, v2p_len, TOKENS_PER_PROGRAM: tl.constexpr, ENTRY_PAGE_SIZE: tl.constexpr,
                 ENTRY_SHIFT: tl.constexpr, HAS_MAPPING: tl.constexpr, V2P_PAGE_SIZE: tl.constexpr):
    """Tokens ``j`` in ``[first, min(first + TOKENS_PER_PROGRAM, end))`` of a row: ``out[target_start + j] =
    table[pool, start + j]`` (through the entries and the mapping when asked)."""
    token = first + tl.arange(0, TOKENS_PER_PROGRAM)
    copied = token < end
    if V2P_PAGE_SIZE > 0:
        values = _page_translated(table_ptr + pool * table_row_stride, start + token, copied, v2p_ptr, v2p_len,
                                  V2P_PAGE_SIZE)
    elif ENTRY_PAGE_SIZE == 1:
        values = tl.load(table_ptr + pool * table_row_stride + start + token, mask=copied)
    else:
        values = _entry_values(table_ptr + pool * table_row_stride, start + token, copied, ENTRY_PAGE_SIZE,
                               ENTRY_SHIFT)
    if HAS_MAPPING:
        inside = (values >= 0) & (values < mapping_len)
        mapped = tl.load(mapping_ptr + values, mask=copied & inside)
        values = tl.where(inside, mapped, -1)
    tl.store(out_ptr + target_start + token, values.to(out_ptr.dtype.element_ty), mask=copied)


@triton.jit
def _entry_values(row_ptr, position, copied, ENTRY_PAGE_SIZE: tl.constexpr, ENTRY_SHIFT: tl.constexpr):
    """``row[q // E] * E + q % E`` in int64 at the (non-negative) positions ``q``, loaded under ``copied``."""
    if ENTRY_SHIFT >= 0:
        entry, within = position >> ENTRY_SHIFT, position & (ENTRY_PAGE_SIZE - 1)
    else:
        entry = position // ENTRY_PAGE_SIZE
        within = position - entry * ENTRY_PAGE_SIZE
    return tl.load(row_ptr + entry, mask=copied).to(tl.int64) * ENTRY_PAGE_SIZE + within


@triton.jit
def _page_translated(row_ptr, position, copied, v2p_ptr, v2p_len, PAGE_SIZE: tl.constexpr):
    """``max(v2p[v], 0) * P + q % P`` (int64) at the (non-negative) positions ``q``: ``v`` the virtual page of the
    slot ``t`` opening the token's page, 0 for ``t < 0``; entry 0 past the map. Loaded under ``copied``."""
    within = position % PAGE_SIZE
    slots = tl.load(row_ptr + position - within, mask=copied, other=0)
    pages = tl.where(slots < 0, 0, slots // PAGE_SIZE).to(tl.int64)
    entries = tl.load(v2p_ptr + pages, mask=copied & (pages < v2p_len), other=0).to(tl.int64)
    return tl.maximum(entries, 0) * PAGE_SIZE + within


token_csr_kernel = triton.jit(_token_csr_kernel, do_not_specialize=RUNTIME_INTS,
                              do_not_specialize_on_alignment=POINTERS)
launcher = _launch.register(_launch.KernelLauncher(token_csr_kernel, CONSTEXPRS))
_plans = _launch.plan_cache(on_clear=functools.partial(native.forget_plans, "token_csr"))


def constexprs_for(has_start: bool, unit_strides: bool = True, wide_indexing: bool = False,
                   folded_grid: bool = False, entry_page_size: int = 1, has_mapping: bool = False,
                   pdl: bool = False, v2p_page_size: int = 0) -> dict:
    """The constexpr arguments of one specialisation (tokens per program from ``kvdispatch.grid``);
    ``v2p_page_size``: the page size of a v2p translation, 0 for none."""
    return dict(TOKENS_PER_PROGRAM=launch_grid.items_per_program(launch_grid.TOKEN_CSR), HAS_START=has_start,
                UNIT_STRIDES=unit_strides, WIDE_INDEXING=wide_indexing, FOLDED_GRID=folded_grid,
                ENTRY_PAGE_SIZE=entry_page_size, ENTRY_SHIFT=page_shift(entry_page_size), HAS_MAPPING=has_mapping,
                V2P_PAGE_SIZE=v2p_page_size, PDL=pdl)


def _build_plan(key, out, args):
    """The launch plan of ``key`` (``plan_key_and_arguments``), launching ``args`` when it compiles
    (``launch.build_plan``)."""
    entry_page_size = key[10]
    geometry = launch_grid.token_csr_launch(key[1], table_width=args[9] * entry_page_size, out_len=args[11],
                                            budget=_launch.program_budget(out.device))
    has_start, unit_strides, wide_indexing = key[6] is not None, key[7], key[8]
    specialisation = (has_start, geometry.folded) + key[3:]
    constexprs = constexprs_for(has_start, unit_strides, wide_indexing, geometry.folded, entry_page_size,
                                key[11] is not None, pdl=key[12], v2p_page_size=key[14])
    return _launch.build_plan(_plans, launcher, key, args, out.device, geometry, specialisation, constexprs)


def build_token_indices(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, kv_start_idx=None,
                        entry_page_size=1, token_mapping=None, v2p=None, page_size=1, pdl=False):
    """Write token-level CSR indices into ``out`` (int32/int64 ``[N]``); semantics of
    ``kvdispatch.ops.token_csr.reference``. Index vectors may be strided views. ``pdl``: launch with
    programmatic dependent launch where the device supports it.

    Untouched: every position of ``out`` no request writes; nothing lands outside ``[0, N)``.
    Arguments arrive validated (the op's ``check_arguments``).
    """
    key, args = plan_key_and_arguments(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, kv_start_idx,
                                       entry_page_size, token_mapping, pdl, v2p, page_size)
    _launch.launch_through_plan(_plans, key, args, lambda: _build_plan(key, out, args))
    return out


def plan_key_and_arguments(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, kv_start_idx=None,
                           entry_page_size=1, token_mapping=None, pdl=False, v2p=None, page_size=1):
    """The launch-plan key of a call and the kernel's runtime arguments (tensors in the pointer slots). Key:
    device index, batch, min(C * entry_page_size, N) (the geometry depends on nothing else:
    ``kvdispatch.grid.token_csr_launch``), the dtypes of the pool, length, indptr and start vectors (None: no
    start), unit strides, wide indexing (no ``launch.csr_packed_words``), then the options: out's dtype, the entry page
    size and the mapping's dtype (None: no mapping), pdl, then v2p's dtype and page size (None and 0: no v2p)."""
    has_start = kv_start_idx is not None
    rows, cols = req_to_token.shape
    table_stride, out_len = req_to_token.stride(0), out.shape[0]
    pool_stride, lens_stride, indptr_stride = req_pool_indices.stride(0), seq_lens.stride(0), kv_indptr.stride(0)
    start_stride = kv_start_idx.stride(0) if has_start else 1
    unit_strides = pool_stride == 1 and lens_stride == 1 and indptr_stride == 1 and start_stride == 1
    packed = _launch.csr_packed_words(rows, table_stride, cols, out_len)
    packed_table, packed_sizes = packed or (0, 0)
    has_mapping = token_mapping is not None
    key = (out.get_device(), req_pool_indices.shape[0], min(cols * entry_page_size, out_len), req_pool_indices.dtype,
           seq_lens.dtype, kv_indptr.dtype, kv_start_idx.dtype if has_start else None, unit_strides, packed is None,
           out.dtype, entry_page_size, token_mapping.dtype if has_mapping else None, pdl,
           None if v2p is None else v2p.dtype, 0 if v2p is None else page_size)
    args = (req_to_token, req_pool_indices, seq_lens, kv_indptr, out, packed_table, packed_sizes,
            kv_start_idx if has_start else req_to_token, rows, cols, table_stride, out_len, pool_stride, lens_stride,
            indptr_stride, start_stride, token_mapping, token_mapping.shape[0] if has_mapping else None, v2p,
            None if v2p is None else v2p.shape[0])
    return key, args


def compile_specializations(warp_size, page_sizes, index_types):
    """The kernel's ``Specialization``s (``kernels_triton.specialization``), those of ``_ast_sources`` (no page
    size: ``page_sizes`` unused)."""
    kernel = jit_function(token_csr_kernel, POINTERS, RUNTIME_INTS)
    threads = launch_grid.token_csr_launch(1, 1, 1).threads
    for signature, constexprs in _ast_sources(index_types):
        yield Specialization(kernel, signature, constexprs, warps(threads, warp_size))


def _ast_sources(index_types, entry_page_sizes=SPECIALISED_ENTRY_PAGE_SIZES):
    """Every specialisation the launcher can produce for ``entry_page_sizes``: yields ``(signature,
    constexprs)`` for ``triton.compiler.ASTSource`` (Triton >= 3.3). Ordinary calls (int32 out, entry page
    size 1, no mapping): per start option, unit strides, wide indexing, grid form and index dtype (the same
    for the pool, length, indptr and start vectors). Calls with options, per out dtype, entry page size and
    mapping (of the index dtype), with and without a start, on the usual grid with unit strides (the
    other flags combine with them as they do with the ordinary code)."""
    for has_start, unit_strides, wide_indexing, folded_grid in itertools.product((False, True), repeat=4):
        for index in index_types:
            yield _specialisation(index, "i32", None, constexprs_for(has_start, unit_strides, wide_indexing,
                                                                     folded_grid))
    for out_type, entry_page_size, has_mapping, has_start, index in itertools.product(
            ("i32", "i64"), entry_page_sizes, (False, True), (False, True), index_types):
        if out_type != "i32" or entry_page_size != 1 or has_mapping:
            constexprs = constexprs_for(has_start, entry_page_size=entry_page_size, has_mapping=has_mapping)
            yield _specialisation(index, out_type, index if has_mapping else None, constexprs)
    # The unified pool's packed read stream: through an int64 v2p of pages of each entry page size above 1.
    for out_type, page_size, has_start, index in itertools.product(("i32", "i64"), entry_page_sizes[1:],
                                                                   (False, True), index_types):
        yield _specialisation(index, out_type, None, constexprs_for(has_start, v2p_page_size=page_size), "i64")


def _specialisation(index, out_type, mapping_type, constexprs, v2p_type=None):
    """``(signature, constexprs)`` of one specialisation: index vectors of dtype ``index``, ``out`` of
    ``out_type``, a mapping of ``mapping_type`` and a v2p of ``v2p_type`` (None: none, their parameters
    constant None)."""
    types = dict(pool_ptr=f"*{index}", lens_ptr=f"*{index}", indptr_ptr=f"*{index}", out_ptr=f"*{out_type}",
                 start_ptr=f"*{index}" if constexprs["HAS_START"] else "*i32")
    if mapping_type is None:
        constexprs = dict(constexprs, mapping_ptr=None, mapping_len=None)
    else:  # its length is typed by value, as Triton types an unannotated int: i32 below 2**31
        types.update(mapping_ptr=f"*{mapping_type}", mapping_len="i32")
    if v2p_type is None:
        constexprs = dict(constexprs, v2p_ptr=None, v2p_len=None)
    else:
        types.update(v2p_ptr=f"*{v2p_type}", v2p_len="i32")
    return ast_signature(PARAMETERS, constexprs, types), constexprs


# The ops this module launches: ``kernels_triton.KERNELS`` reads them from this source, without importing it.
OP_LAUNCHERS = {"token_csr": build_token_indices}
