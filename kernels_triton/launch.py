"""Cheap launches of the Triton kernels: per-device compiled-kernel cache and per-shape launch plans.

A plain ``kernel[grid](...)`` call binds and specialises every argument and hashes a cache key on each
call (15-21 µs of host time on an H200 host). Here the first call of a specialisation goes through that
path once, under ``torch.cuda.device(index)``, and keeps the ``CompiledKernel`` it returns; later calls
hand the arguments straight to that kernel's low-level ``run`` with the raw current stream of the
tensors' device (about 6 µs).

The low-level call has had several shapes across Triton releases, so the convention is detected from the
compiled kernel the first time (``detect_convention``); when it is not one this module knows, launches stay
on the plain path. One step further down, where the installed launcher's Python ``__call__`` only forwards
its arguments to its C ``launch`` (Triton 3.6 on NVIDIA; checked in the launcher's source by ``direct_launch``),
the plan calls that C function itself, with what ``__call__`` would pass: one Python frame less, about a
microsecond.

Below all of these, a call whose plan exists can skip Python altogether: every plan describes its launches
(``KernelLauncher.replay_launch``, recorded by ``record``) for the compiled host path
(``kvdispatch/host_path.c``), where they become replay plans, once ``native_parameter_count`` finds that the
compiled kernel takes ``cuLaunchKernel``'s (on AMD ``hipModuleLaunchKernel``'s) parameters the way it passes
them.

``KVDISPATCH_TRITON_LAUNCH`` = ``auto`` (default: the deepest path detected) | ``native`` or ``direct``
(required) | ``fast`` (``CompiledKernel.run``) | ``plain`` overrides that choice; it is read when a plan is
built, so call ``reset()`` after changing it.

The fast path passes no launch hooks and no launch metadata (Triton's profiler hooks are skipped): use
``KVDISPATCH_TRITON_LAUNCH=plain`` to profile through them.
"""

from __future__ import annotations

import functools
import inspect
import os
import re
import threading
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kvdispatch import _env, devices, host_path
from kvdispatch import grid as launch_grid

from . import native

LAUNCH_ENV = _env.TRITON_LAUNCH
LAUNCH_MODES = _env.LAUNCH_MODES[LAUNCH_ENV]
# Launch plans are kept per shape; engines use a handful of (batch, width) pairs, but a caller that
# varies them freely must not grow the cache without bound.
MAX_PLANS = 4096
# A size or stride this large does not fit the 32-bit fields the kernels pack their parameters into
# (each kernel module's ``packed_words``, ``csr_packed_words``): such a call reads the full-width ones.
WIDE = 2**31

# Triton's interpreter (CPU tensors, device index -1) replaces functions of ``triton.language`` for the length
# of a launch and restores them at its end, and keeps the program being run in one global builder: two
# interpreted launches at once, of any kernels, break each other (a launch that ends restores the
# functions under the one still running). Interpreted launches therefore run one at a time.
_interpreter_lock = threading.Lock()

# CompiledKernel.run parameters ahead of the kernel arguments, as Triton >= 3.0 names them (3.6 hides
# the last four inside ``*args``; 3.8 names them).
_GRID_STREAM_FUNCTION = ("gridX", "gridY", "gridZ", "stream", "function")
_METADATA_AND_HOOKS = ("kernel_metadata", "launch_metadata", "launch_enter_hook", "launch_exit_hook")


# What the Python ``__call__`` of Triton 3.6's CudaLauncher does, whitespace removed: scratch buffers are None
# when their sizes are 0, then everything is forwarded to the C launch function. (3.8's does more; other
# releases qualify exactly when their source reads the same.)
_FORWARDING_SOURCE = (
    "ifsize>0:",
    "returnNone",
    "global_scratch=allocate_scratch(self.global_scratch_size,",
    "profile_scratch=allocate_scratch(self.profile_scratch_size,",
    "self.launch(gridX,gridY,gridZ,stream,function,self.launch_cooperative_grid,self.launch_pdl,global_scratch,"
    "profile_scratch,*args)",
)


@triton.jit
def program_in_row(FOLDED_GRID: tl.constexpr):
    """The program's index among its row's programs: ``program_id(1)`` (int32) or, on a grid folded into
    its third dimension (``kvdispatch.grid``), ``program_id(1) + program_id(2) * num_programs(1)`` in int64
    (it can pass 2**31). A compile-time choice, so the usual grid runs the code it always ran."""
    program = tl.program_id(1)
    if FOLDED_GRID:
        program = program.to(tl.int64) + tl.program_id(2).to(tl.int64) * tl.num_programs(1)
    return program


@triton.jit
def programs_in_row(FOLDED_GRID: tl.constexpr):
    """``T``, the row's programs as the grid has them: ``num_programs(1)`` (int32) or, on a folded grid,
    ``num_programs(1) * num_programs(2)`` in int64. Program ``k`` of a row handles its blocks ``k, k + T,
    k + 2T, ...`` (``kvdispatch.grid``): read from the grid, never passed, so any grid is correct."""
    programs = tl.num_programs(1)
    if FOLDED_GRID:
        programs = programs.to(tl.int64) * tl.num_programs(2)
    return programs


@triton.jit
def divide(values, DIVISOR: tl.constexpr, SHIFT: tl.constexpr, ROUND_TOWARD_ZERO: tl.constexpr):
    """``values // DIVISOR`` of signed ints, rounding down, or toward zero with ROUND_TOWARD_ZERO. SHIFT:
    log2(DIVISOR) for powers of two, else -1."""
    # Triton's ``//`` on signed ints truncates toward zero (as C does), compiled and in the interpreter.
    if ROUND_TOWARD_ZERO:
        if SHIFT >= 0:  # a negative value is biased by DIVISOR - 1 first: it cannot overflow
            sign = values >> (values.dtype.primitive_bitwidth - 1)
            return (values + (sign & (DIVISOR - 1))) >> SHIFT
        return values // DIVISOR
    if SHIFT >= 0:
        return values >> SHIFT  # arithmetic shift: floor division for negative values too
    return tl.where(values >= 0, values // DIVISOR, ~((~values) // DIVISOR))


@triton.jit
def pages_below(positions, page_limit, PAGE_SIZE: tl.constexpr):
    """The pages (of ``PAGE_SIZE`` positions) that start below ``positions``, at most ``page_limit`` (>= 0),
    in int64: a row's real pages, the end of its programs' blocks. Exact for every int64 ``positions``
    (clamped to the limit's positions first); 0 when ``positions <= 0``."""
    reach = tl.maximum(tl.minimum(positions.to(tl.int64), page_limit.to(tl.int64) * PAGE_SIZE), 0)
    return (reach + (PAGE_SIZE - 1)) // PAGE_SIZE


@triton.jit
def group_overflow(pages, in_group, programs, PAGES_PER_PROGRAM: tl.constexpr):
    """``(overflow, passes)`` of a group of rows of ``programs`` programs each, from the pages each row may
    write (``pages``, int64): ``passes``, the passes a row's programs make over its own blocks, is the fewest
    blocks of a row of the group over ``programs``, at least 1; ``overflow`` (0 where not ``in_group``) each
    row's blocks past its first ``passes * programs``, the items its group's programs share."""
    blocks = tl.where(in_group, (pages + (PAGES_PER_PROGRAM - 1)) // PAGES_PER_PROGRAM, 0)
    passes = tl.maximum(tl.min(tl.where(in_group, blocks, 2**62), 0) // programs, 1)
    return tl.maximum(blocks - passes * programs, 0), passes


# Columns a fill_part store covers at once.
FILL_CHUNK = tl.constexpr(1024)


@triton.jit
def fill_part(out_row, start, end, part, parts, fill_value):
    """Part ``part`` of ``parts`` of the columns ``[start, end)`` of an int32 row, ``fill_value`` in each (stores
    alone): a row's pure fill, past the blocks its real pages reach, cut among the row's programs."""
    each = (tl.maximum(end - start, 0) + parts - 1) // parts
    begin = start + part * each
    stop = tl.minimum(begin + each, end)
    for at in range(begin, stop, FILL_CHUNK):
        column = at + tl.arange(0, FILL_CHUNK)
        tl.store(out_row + column, fill_value.to(tl.int32), mask=column < stop)


@triton.jit
def stored_values(values, loaded, v2p_ptr, v2p_len, out_ptr, PAGE_SIZE: tl.constexpr, HAS_V2P: tl.constexpr):
    """Table values as ``out`` stores them: with v2p, ``v2p[x // P] * P + x % P`` (int64, wrapping as the low
    64 bits of the exact value) where ``x >= 0``, the page is inside v2p and its entry is non-negative, else 0."""
    if HAS_V2P:
        value = values.to(tl.int64)
        page = value // PAGE_SIZE
        inside = (value >= 0) & (page < v2p_len)
        mapped = tl.load(v2p_ptr + page, mask=loaded & inside, other=0).to(tl.int64)
        values = tl.where(inside & (mapped >= 0), mapped * PAGE_SIZE + (value - page * PAGE_SIZE), 0)
    return values.to(out_ptr.dtype.element_ty)


@triton.jit
def csr_row_header(pool_ptr, lens_ptr, indptr_ptr, packed_table, packed_sizes, table_rows, table_cols,
                   table_row_stride, out_len, pool_stride, lens_stride, indptr_stride, UNIT_STRIDES: tl.constexpr,
                   WIDE_INDEXING: tl.constexpr):
    """``(row, pool, length, target_start, table_rows, table_cols, table_row_stride, out_len)`` of a CSR
    kernel's program: its row's pool index, length and first target position in int64 (loads issued together),
    and the sizes, unpacked from ``packed_table`` and ``packed_sizes`` unless WIDE_INDEXING (``csr_packed_words``)."""
    if UNIT_STRIDES:
        pool_stride, lens_stride, indptr_stride = 1, 1, 1
    if not WIDE_INDEXING:
        # Already 64-bit when compiled (the annotation); the interpreter types a small int as 32-bit.
        packed_table, packed_sizes = packed_table.to(tl.int64), packed_sizes.to(tl.int64)
        table_rows, table_row_stride = packed_table & 0xFFFFFFFF, packed_table >> 32
        table_cols, out_len = packed_sizes & 0xFFFFFFFF, packed_sizes >> 32
    row = tl.program_id(0)
    pool = tl.load(pool_ptr + row * pool_stride).to(tl.int64)
    length = tl.load(lens_ptr + row * lens_stride).to(tl.int64)
    target_start = tl.load(indptr_ptr + row * indptr_stride)
    if target_start.dtype == tl.int64:
        # A row starting beyond +-2**62 lands wholly outside out, and so does one starting at the bound:
        # clamped, the offsets below cannot wrap (sizes stay far below 2**62).
        target_start = tl.minimum(tl.maximum(target_start, -(2**62)), 2**62)
    return row, pool, length, target_start.to(tl.int64), table_rows, table_cols, table_row_stride, out_len


@triton.jit
def member_items(items, members, member):
    """``[begin, end)``, the consecutive share of ``items`` items (a group's overflow blocks) that member
    ``member`` of ``members`` programs takes: ``ceil(items / members)`` each, fewer or none for the last."""
    share = (items + members - 1) // members
    begin = member * share
    return begin, tl.minimum(begin + share, items)


@triton.jit
def locate_item(item, ends, counts, member_rows):
    """``(row, index)`` of item ``item`` of a list of the rows' items in row order: ``row`` the row (an index
    into ``member_rows``, ``tl.arange`` over the rows) it falls in, ``index`` its place among that row's items;
    ``ends`` the inclusive prefix sums of the rows' item ``counts``."""
    row = tl.sum((ends <= item).to(tl.int32), 0)
    return row, item - tl.sum(tl.where(member_rows == row, ends - counts, 0), 0)


@triton.jit
def wait_for_producer(PDL: tl.constexpr):
    """Under programmatic dependent launch (PDL), wait until the kernel before this one on the stream has
    finished and its writes are visible (``griddepcontrol.wait``); the kernels call it before their first
    load. Compiles to nothing without PDL."""
    if PDL:
        tl.extra.cuda.gdc_wait()


@triton.jit
def release_dependents(PDL: tl.constexpr):
    """Under PDL, let the next PDL kernel on the stream start launching (``griddepcontrol.launch_dependents``);
    the kernels call it after their last store. Compiles to nothing without PDL."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()


def csr_packed_words(rows: int, table_stride: int, cols: int, out_len: int) -> tuple[int, int] | None:
    """A CSR kernel's ``packed_table`` (rows | table row stride << 32) and ``packed_sizes`` (cols | out_len
    << 32), so that a call's parameters fit one constant-cache line; None when a value is ``WIDE`` or more
    (the kernel then reads the full-width parameters)."""
    if (rows | table_stride | cols | out_len) >= WIDE:  # one of them is (none is negative)
        return None
    return rows | table_stride << 32, cols | out_len << 32


def launch_mode() -> str:
    """``KVDISPATCH_TRITON_LAUNCH``: ``auto`` (the deepest path supported), ``native``, ``direct`` or ``fast``
    (required), or ``plain``."""
    return _env.choice(LAUNCH_ENV, LAUNCH_MODES)


@dataclass(frozen=True)
class FastConvention:
    """How a compiled kernel's low-level ``run`` takes its arguments.

    The call is ``run(gridX, gridY, gridZ, stream, function, packed_metadata, launch_metadata,
    enter_hook, exit_hook, *kernel_args)`` in every Triton release this supports (3.0 to 3.8 at least).
    with_constexprs: True when ``kernel_args`` lists every kernel parameter, constexprs included
    (Triton >= 3.3, whose ``ASTSource.signature`` names constexprs too); False when only the runtime ones.
    """

    with_constexprs: bool


def _positional_names(function) -> tuple[list[str], bool] | None:
    """Names of the positional parameters of ``function`` and whether it takes ``*args``."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):  # a builtin without a text signature
        return None
    names = [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return names, any(p.kind is p.VAR_POSITIONAL for p in parameters)


def detect_convention(compiled, arg_names, constexpr_names) -> FastConvention | None:
    """The low-level call convention of ``compiled`` (a ``triton.compiler.CompiledKernel``), or None.

    ``arg_names``: every parameter of the kernel in order; ``constexpr_names``: the constexpr ones.
    Recognised: ``run(gridX, gridY, gridZ, stream, function, *args)`` (Triton 3.0-3.7: the launcher
    forwards metadata, hooks and arguments together) and ``run(gridX, gridY, gridZ, stream, function,
    kernel_metadata, launch_metadata, launch_enter_hook, launch_exit_hook, *args)`` (3.8), on a kernel
    with ``function`` and ``packed_metadata`` attributes. Anything else (Triton 2.x's
    ``run(grid0, grid1, grid2, num_warps, ...)``, an unknown future form) returns None: launch plainly.
    """
    if not all(hasattr(compiled, name) for name in ("run", "function", "packed_metadata", "src")):
        return None
    found = _positional_names(compiled.run)
    if found is None:
        return None
    names, varargs = found
    if not varargs:
        return None
    if tuple(names) not in (_GRID_STREAM_FUNCTION, _GRID_STREAM_FUNCTION + _METADATA_AND_HOOKS):
        return None
    signature = getattr(compiled.src, "signature", None)
    if not isinstance(signature, dict):
        return None
    if len(signature) == len(arg_names):
        return FastConvention(with_constexprs=True)
    if len(signature) == len(arg_names) - len(constexpr_names):
        return FastConvention(with_constexprs=False)
    return None


@dataclass(frozen=True)
class DirectLaunch:
    """The C launch function behind a compiled kernel's ``run`` and the two flags ``run`` passes it."""

    launch: object
    cooperative: object
    pdl: object


def direct_launch(compiled) -> DirectLaunch | None:
    """The C function ``compiled.run`` forwards to, when calling it directly is exactly what ``run`` does.

    Requires a kernel without scratch memory and a launcher class whose ``__call__`` source is Triton
    3.6's NVIDIA form (``_FORWARDING_SOURCE``); anything else (3.8, AMD, a future change) returns None
    and launches go through ``run``.
    """
    run = getattr(compiled, "run", None)
    needed = ("launch", "launch_cooperative_grid", "launch_pdl", "global_scratch_size", "profile_scratch_size")
    if run is None or not all(hasattr(run, name) for name in needed):
        return None
    if run.global_scratch_size or run.profile_scratch_size or not forwards_to_c_launch(type(run)):
        return None
    return DirectLaunch(run.launch, run.launch_cooperative_grid, run.launch_pdl)


def forwards_to_c_launch(launcher_class) -> bool:
    """Whether ``launcher_class.__call__`` is Triton 3.6's NVIDIA form (``_FORWARDING_SOURCE``)."""
    try:
        source = "".join(inspect.getsource(launcher_class.__call__).split())
    except (AttributeError, OSError, TypeError):
        return False
    return all(fragment in source for fragment in _FORWARDING_SOURCE)


@dataclass(frozen=True)
class NativeKernel:
    """What ``host_path.c`` needs to launch a compiled kernel: ``cuLaunchKernel``'s (or
    ``hipModuleLaunchKernel``'s) arguments."""

    function: int
    threads: int
    shared: int
    param_count: int
    context: int


def _entry_parameter_types(ptx: str) -> list[str]:
    """The PTX types of the kernel entry's parameters (``u64``, ``b32``...)."""
    entry = ptx.split(".entry", 1)[1].split(")", 1)[0] if ".entry" in ptx else ""
    return re.findall(r"\.param\s+\.(\w+)", entry)


def _amdgpu_kernel_metadata(amdgcn: str) -> tuple[list[dict[str, str]], dict[str, str]] | None:
    """The kernel argument list (``.args``: one dict of ``.offset``, ``.size``, ``.value_kind``... per
    argument) and the other kernel fields (``.wavefront_size``, ``.max_flat_workgroup_size``...) of the one
    kernel in the AMDGPU metadata block (``.amdgpu_metadata`` ... ``.end_amdgpu_metadata``, YAML) of AMD
    assembly; None without exactly one kernel there."""
    if ".amdgpu_metadata" not in amdgcn:
        return None
    block = amdgcn.split(".amdgpu_metadata", 1)[1].split(".end_amdgpu_metadata", 1)[0]
    if block.count(".symbol:") != 1:
        return None
    arguments: list[dict[str, str]] = []
    fields: dict[str, str] = {}
    args_indent = None
    for line in block.splitlines():
        indent = len(line) - len(line.lstrip(" "))
        text = line.strip()
        if args_indent is not None and indent <= args_indent and not text.startswith("- "):
            args_indent = None  # past the argument list
        if text.startswith("- "):
            if args_indent is not None:
                arguments.append({})
            text = text[2:].strip()
        name, _, value = text.partition(":")
        if not name.startswith("."):
            continue
        if args_indent is not None:
            if not arguments:
                return None
            arguments[-1][name] = value.strip()
        elif name == ".args":
            args_indent = indent
        else:
            fields[name] = value.strip()
    return arguments, fields


def _hip_parameter_count(compiled, metadata, target, runtime_args: int) -> int | None:
    """``native_parameter_count`` of an AMD kernel, read from its AMDGPU metadata: ``runtime_args`` explicit
    arguments then the two scratch pointers, each 8 bytes at offset 8 * i, one kernel compiled for
    ``target``'s wavefront and for exactly ``num_warps`` wavefronts per workgroup. Hidden arguments
    (``hidden_block_count_y``... which ``tl.num_programs`` reads) may follow: the HIP runtime fills them at
    each launch, from the launch itself, as it does for Triton's own launcher, which passes the same
    parameters."""
    asm = getattr(compiled, "asm", None)
    amdgcn = asm.get("amdgcn") if isinstance(asm, dict) else None
    found = _amdgpu_kernel_metadata(amdgcn) if isinstance(amdgcn, str) else None
    if found is None:
        return None
    arguments, fields = found
    hidden = [a.get(".value_kind", "").startswith("hidden_") for a in arguments]
    explicit = arguments[:hidden.index(True)] if any(hidden) else arguments
    if (any(not h for h in hidden[len(explicit):])
            or [(a.get(".offset"), a.get(".size")) for a in explicit] != [(str(8 * i), "8")
                                                                          for i in range(runtime_args + 2)]
            or any(a.get(".value_kind") not in ("global_buffer", "by_value") for a in explicit)):
        return None
    warp_size = getattr(target, "warp_size", None)
    if (fields.get(".wavefront_size") != str(warp_size)
            or fields.get(".max_flat_workgroup_size") != str(warp_size * getattr(metadata, "num_warps", 0))):
        return None
    return len(explicit)


def native_parameter_count(compiled, runtime_args: int) -> int | None:
    """How many ``cuLaunchKernel`` (``hipModuleLaunchKernel``) parameters ``compiled`` takes, when
    ``host_path.c`` can launch it: a kernel whose parameters are its ``runtime_args`` runtime arguments
    then Triton's two scratch pointers (left null: it needs no scratch memory), all 8 bytes wide (on NVIDIA a
    ``tl.int32`` parameter may be 4: it reads the low half of the word ``host_path.c`` passes), on one CTA
    per program, neither cooperative nor PDL. What every Triton launcher from 3.0 to 3.9 passes in that case.
    NVIDIA: read from the PTX entry, on 32-lane warps. AMD: read from the AMDGPU metadata's kernel argument
    list, on wavefronts of the target's size (``_hip_parameter_count``). None otherwise.
    """
    metadata = getattr(compiled, "metadata", None)
    target = getattr(metadata, "target", None)
    backend = getattr(target, "backend", None)
    if backend not in ("cuda", "hip") or (backend == "cuda" and getattr(target, "warp_size", 32) != 32):
        return None
    if (getattr(metadata, "num_ctas", 1) != 1 or getattr(metadata, "global_scratch_size", 0)
            or getattr(metadata, "profile_scratch_size", 0) or getattr(metadata, "launch_cooperative_grid", False)
            or getattr(metadata, "launch_pdl", False)):
        return None
    if backend == "hip":
        return _hip_parameter_count(compiled, metadata, target, runtime_args)
    asm = getattr(compiled, "asm", None)
    ptx = asm.get("ptx") if isinstance(asm, dict) else None
    if not isinstance(ptx, str):
        return None
    types = _entry_parameter_types(ptx)
    # 32-bit ints (``tl.int32`` parameters) read the low half of the 64-bit word host_path.c passes.
    if len(types) != runtime_args + 2 or any(t not in ("u64", "b64", "s64", "u32", "b32", "s32") for t in types):
        return None
    return len(types)


def threads_per_program(compiled) -> int:
    """The threads of one program of ``compiled`` as Triton's launchers start it: ``num_warps`` warps (AMD:
    wavefronts) of its target's width."""
    metadata = compiled.metadata
    return getattr(metadata.target, "warp_size", 32) * metadata.num_warps


# The current stream's handle of a device, without creating a Stream object (an alias, not a wrapper: it
# is called on every launch). Absent from CPU-only builds of PyTorch, which never launch.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _pointer_positions(compiled) -> tuple[int, ...]:
    """Positions of the kernel's pointer parameters (``*i32``...) in its signature."""
    return tuple(i for i, kind in enumerate(compiled.src.signature.values())
                 if isinstance(kind, str) and kind.startswith("*"))


def fast_launcher(compiled, convention: FastConvention, grid, constexpr_values: tuple, device_index: int,
                  direct: DirectLaunch | None = None):
    """A function ``launch(*runtime_args)`` that starts ``compiled`` on ``grid`` (``(x, y, z)``, as
    ``kvdispatch.grid.Launch.grid``) on the current stream of ``device_index``; ``constexpr_values`` follow
    the runtime arguments where the convention wants them.
    Through ``compiled.run``, or through its C launch function when ``direct`` is given.

    Tensors in the pointer parameters are passed as their addresses: every Triton launcher takes an int
    there as it is, while for a tensor it calls ``data_ptr()`` and asks the driver about the pointer
    (``cuPointerGetAttribute``), about a microsecond per pointer. The launchers validated the tensors'
    device before.
    """
    function, metadata = compiled.function, compiled.packed_metadata
    if direct is None:
        run, extra = compiled.run, (metadata, None, None, None)
    else:  # what run.__call__ passes: its flags, no scratch buffers, then its own arguments
        run, extra = direct.launch, (direct.cooperative, direct.pdl, None, None, metadata, None, None, None)
    grid_x, grid_y, grid_z = grid
    tail = constexpr_values if convention.with_constexprs else ()
    positions = _pointer_positions(compiled)
    address = torch.Tensor.data_ptr
    raw_stream = _raw_stream
    current_device = torch._C._cuda_getDevice

    def launch(*args):
        values = list(args)
        for i in positions:
            values[i] = address(values[i])
        if current_device() != device_index:
            with torch.cuda.device(device_index):
                run(grid_x, grid_y, grid_z, raw_stream(device_index), function, *extra, *values, *tail)
            return
        run(grid_x, grid_y, grid_z, raw_stream(device_index), function, *extra, *values, *tail)

    return launch


class KernelLauncher:
    """Launches one ``@triton.jit`` kernel; caches compiled kernels per (device index, specialisation).

    ``specialisation`` is a hashable key that names everything Triton specialises on for this kernel
    (constexprs, argument dtypes); the launchers build it from attribute reads only.
    """

    def __init__(self, kernel, constexpr_names: tuple[str, ...]):
        self.kernel = kernel
        self.constexpr_names = constexpr_names
        self.arg_names = tuple(getattr(kernel, "arg_names", ()))
        self.compiled: dict[tuple, object] = {}  # (device index, specialisation) -> CompiledKernel
        self.conventions: dict[tuple, FastConvention | None] = {}
        self.direct_paths: dict[tuple, DirectLaunch | None] = {}
        self.native_kernels: dict[tuple, NativeKernel | None] = {}
        self._lock = threading.Lock()

    @property
    def compile_count(self) -> int:
        """Specialisations compiled (on a GPU) or first-launched (under the interpreter) so far."""
        return len(self.compiled)

    def plain(self, grid, args, constexprs: dict, num_warps: int):
        """``kernel[grid](...)``: bind, specialise, compile if new, launch. Returns the CompiledKernel
        (None under the interpreter). A ``PDL`` constexpr that is true also asks for Triton's ``launch_pdl``
        option, which the compiled kernel's metadata keeps: every later launch of it, through ``run`` or its
        C launch function (``DirectLaunch.pdl``), sets the programmatic stream serialisation attribute."""
        if constexprs.get("PDL"):
            return self.kernel[grid](*args, **constexprs, num_warps=num_warps, launch_pdl=True)
        return self.kernel[grid](*args, **constexprs, num_warps=num_warps)

    def plan(self, device_index: int, specialisation, grid, constexprs: dict, num_warps: int, first_args):
        """A ``launch(*runtime_args)`` for this device, specialisation and grid.

        Runs the first launch with ``first_args`` itself when the kernel is new on that device (the
        plain path compiles it), so the caller must not launch again for this call. Returns
        ``(launch, launched)``. A true ``PDL`` constexpr (programmatic dependent launch) is kept only on a
        device that supports it (``supports_pdl``); elsewhere, CPU tensors included, the kernel compiles
        without it.
        """
        key = (device_index, specialisation)
        mode = launch_mode()
        launched = False
        if constexprs.get("PDL") and not supports_pdl(device_index):  # a request the device cannot honour
            constexprs = dict(constexprs, PDL=False)
        compiled = self.compiled.get(key)
        if compiled is None or device_index < 0:
            with self._lock:
                compiled = self._plain_on(device_index, grid, first_args, constexprs, num_warps)
                self.compiled.setdefault(key, compiled)
                launched = True
        launch = None
        if device_index >= 0 and mode != "plain":
            launch = self._fast_plan(key, compiled, mode, grid, constexprs)
        if launch is None:
            def launch(*args):
                self._plain_on(device_index, grid, args, constexprs, num_warps)
        launch.describe = functools.partial(self.replay_launch, device_index, specialisation, grid)
        return launch, launched

    def _plain_on(self, device_index: int, grid, args, constexprs: dict, num_warps: int):
        """``plain`` with device ``device_index`` current, or, for CPU tensors (index < 0), in the
        interpreter while no other interpreted launch runs."""
        if device_index >= 0:
            with torch.cuda.device(device_index):
                return self.plain(grid, args, constexprs, num_warps)
        with _interpreter_lock:
            return self.plain(grid, args, constexprs, num_warps)

    def _fast_plan(self, key, compiled, mode: str, grid, constexprs: dict):
        """The launch below ``kernel[grid]`` that ``mode`` asks for (``auto``: the deepest detected), or
        None for the plain path; raises when ``direct`` or ``fast`` is required but not available."""
        convention = self.conventions.get(key, False)
        if convention is False:
            convention = self.conventions[key] = detect_convention(compiled, self.arg_names, self.constexpr_names)
        if convention is None:
            if mode in ("direct", "fast"):
                raise RuntimeError(f"{LAUNCH_ENV}={mode}, but the installed Triton's CompiledKernel.run has an "
                                   "unknown call convention; use auto or plain")
            return None
        direct = None
        if mode in ("auto", "native", "direct"):  # native: this plan serves the calls C hands back
            direct = self.direct_paths.get(key, False)
            if direct is False:  # reading the launcher's source takes milliseconds: once per kernel
                direct = self.direct_paths[key] = direct_launch(compiled)
            if mode == "direct" and direct is None:
                raise RuntimeError(f"{LAUNCH_ENV}=direct, but the installed Triton's launcher does more than "
                                   "forward to its C launch function; use auto, fast or plain")
        values = tuple(constexprs[name] for name in self.constexpr_names)
        return fast_launcher(compiled, convention, grid, values, key[0], direct)

    def replay_launch(self, device_index: int, specialisation, grid, args) -> host_path.Launch | None:
        """The launch of ``args`` (a plan's runtime arguments, tensors in the pointer slots) through the plan
        of ``(device_index, specialisation)`` on ``grid``, as a replay plan's launch
        (``host_path.register_replay``): the arguments the compiled kernel takes (its signature's constexprs,
        None ones included, left out), then Triton's two scratch pointers (0). None where the launch mode is
        not ``auto`` or ``native``, for CPU tensors (the interpreter), and in ``auto`` mode where ``host_path.c``
        cannot launch the kernel (``native_parameter_count``, the extension, the context); ``native`` mode raises
        with the reason there."""
        key = (device_index, specialisation)
        compiled = self.compiled.get(key)
        signature = getattr(getattr(compiled, "src", None), "signature", None)
        mode = launch_mode()
        if device_index < 0 or mode not in ("auto", "native"):
            return None
        kernel = None
        if isinstance(signature, dict):
            params = tuple(value for name, value in zip(self.arg_names, args) if signature.get(name) != "constexpr")
            kernel = self.native_kernels.get(key, False)
            if kernel is False:
                kernel = self.native_kernels[key] = self._native_kernel(key, len(params))
        if kernel is None:
            if mode == "native":
                reason = host_path.failure() or "the compiled kernel does not take cuLaunchKernel's parameters " \
                                                "as host_path.c passes them"
                raise RuntimeError(f"{LAUNCH_ENV}=native, but the compiled launcher cannot launch this kernel "
                                   f"({reason}); use auto, direct, fast or plain")
            return None
        scratch = (0,) * (kernel.param_count - len(params))
        return host_path.Launch(native.LAUNCHER, kernel.context, kernel.function, tuple(grid), kernel.threads,
                                kernel.shared, params + scratch)

    def _native_kernel(self, key, runtime_args: int) -> NativeKernel | None:
        """The compiled kernel of ``key`` as ``host_path.c`` launches it (``runtime_args`` arguments, then the
        scratch pointers: ``native_parameter_count``), with the threads Triton's launcher starts and the context
        current on its device; None where the extension is not available or no context is current."""
        compiled = self.compiled.get(key)
        count = native_parameter_count(compiled, runtime_args)
        if count is None or host_path.load(key[0]) is None:
            return None
        with torch.cuda.device(key[0]):
            context = host_path.current_context()
        if not context:
            return None
        return NativeKernel(compiled.function, threads_per_program(compiled), compiled.metadata.shared, count, context)


def nothing(*args):
    """The launch plan of a call with an empty grid."""


def record(plan, args) -> None:
    """After ``plan(*args)`` (a plan of ``KernelLauncher.plan``) has launched for a call that may register a
    replay plan (``host_path.recording``): note the launch, described when the call registers."""
    launches = host_path.recording()
    if launches is not None and plan is not nothing:
        launches.append(functools.partial(plan.describe, args))


def launch_through_plan(plans, key, args, build) -> None:
    """Launch ``args`` through the plan of ``key`` in ``plans``, building it with ``build()`` at the key's first
    call (it returns ``(plan, launched)``; ``launched``: building compiled the kernel with these arguments, or
    there is nothing to launch), then ``record`` the launch for the compiled host path's replay entry."""
    plan = plans.get(key)
    if plan is None:
        plan, launched = build()
        if not launched:
            plan(*args)
    else:
        plan(*args)
    record(plan, args)


def build_plan(plans, launcher, key, args, device, geometry, specialisation, constexprs):
    """The plan of ``key`` (whose first entry is the device index) on ``geometry`` (a ``kvdispatch.grid.Launch``),
    added to ``plans``: ``nothing`` for an empty grid, else ``launcher.plan``'s, which launches ``args`` itself
    when it compiles. Returns ``(plan, launched)`` for ``launch_through_plan``."""
    if geometry.grid[0] == 0:
        return plans.add(key, nothing), True
    warps = warps_for(device, geometry.threads)
    plan, launched = launcher.plan(key[0], specialisation, geometry.grid, constexprs, warps, args)
    return plans.add(key, plan), launched


class PlanCache(dict):
    """Launch plans per call key (device, shape, options); forgets everything past ``MAX_PLANS``.
    ``on_clear`` runs whenever it forgets (the compiled launcher's copies of the plans go with them)."""

    def __init__(self, on_clear=None):
        super().__init__()
        self.on_clear = on_clear

    def add(self, key, plan):
        if len(self) >= MAX_PLANS:
            self.clear()
        self[key] = plan
        return plan

    def clear(self):
        super().clear()
        if self.on_clear is not None:
            self.on_clear()


_plan_caches: list[PlanCache] = []
_launchers: list[KernelLauncher] = []


def plan_cache(on_clear=None) -> PlanCache:
    cache = PlanCache(on_clear)
    _plan_caches.append(cache)
    return cache


def register(launcher: KernelLauncher) -> KernelLauncher:
    _launchers.append(launcher)
    return launcher


def reset(compiled: bool = False) -> None:
    """Forget the launch plans (after changing ``KVDISPATCH_TRITON_LAUNCH``); ``compiled=True`` also drops
    the cached compiled kernels (Triton keeps its own cache, so they come back without recompiling)."""
    for cache in _plan_caches:  # each also drops the compiled launcher's copies (PlanCache.on_clear)
        cache.clear()
    if compiled:
        for launcher in _launchers:
            launcher.compiled.clear()
            launcher.conventions.clear()
            launcher.direct_paths.clear()
            launcher.native_kernels.clear()


def _after_fork() -> None:
    """In a child made by ``os.fork``: new locks (another thread may have been inside a launch, holding one, at
    the fork) and no plans or compiled kernels (CUDA state does not cross a fork)."""
    global _interpreter_lock
    _interpreter_lock = threading.Lock()
    for launcher in _launchers:
        launcher._lock = threading.Lock()
    reset(compiled=True)


os.register_at_fork(after_in_child=_after_fork)


def supports_pdl(device_index: int) -> bool:
    """Whether the GPU ``device_index`` supports programmatic dependent launch (the probe's ``supports_pdl``);
    False for CPU tensors (index < 0), which the interpreter runs."""
    return device_index >= 0 and devices.probe(torch.device("cuda", device_index)).supports_pdl


def program_budget(device) -> int:
    """The programs one launch may use on ``device`` (``kvdispatch.grid.program_budget`` of the probe's
    multiprocessors; the probe is cached per device): the ``budget`` the launchers pass the grid helper when
    they build a plan."""
    return launch_grid.program_budget(devices.probe(device).multiprocessors)


def warps_for(device, threads: int) -> int:
    """``threads // warp_size`` of ``device`` per the probe (64 lanes on AMD), at least 1."""
    return max(1, threads // max(1, devices.probe(device).warp_size))
