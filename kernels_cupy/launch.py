"""What each kernel call is (``build.KernelCall``): kernel name, specialisation, grid, threads and typed
arguments. Shared by the CuPy launcher (GPU) and the host build (CI); neither decides a grid itself,
``kvdispatch.grid`` does.
The backend's launchers (``OP_LAUNCHERS``, each made by ``_launcher`` from the op's ``*_call``) describe the
call here and hand it to ``runtime.py``, imported (with CuPy) at the first launch; each launch is recorded
(``host_path.recording``) and becomes a replay plan of the compiled host path (``native.replay_launch``), which
takes the next such call.

Arguments are plain Python ints in the kernels' parameter order: pointers (0 for an absent tensor),
element strides (index vectors may be any 1-D view) and values. The builders write each pointer as its tensor
(None: absent) and ``_kernel_call`` converts: the call's ``pointers`` say which parameter is which tensor's
address (what the compiled host path's replay plans fill in per call). Every kernel parameter is 8 bytes
(pointers and ``long long``), which is exactly what CuPy makes of a Python int (int64), so no per-call
NumPy scalar is needed. Reads tensor attributes only.

The specialisation (``defines``: the page size and the flags) is what the CuPy launcher compiles a module
for, as the Triton backend compiles per page size and option set: the kernels then fold the dtype
branches and the page-size arithmetic. The flags travel in the arguments too, so the host build (one
generic library) runs the same call.
"""

from __future__ import annotations

import functools
import inspect

import torch

from kvdispatch import devices, grid, host_path
from kvdispatch.reference import draft_prefix_cap

from . import native
from .build import KernelCall

# Flag bits; the same values as the KV_* macros in kv_indices.cu (tests/test_shared_constants.py).
WIDE_POOL, WIDE_LENS, WIDE_START, WIDE_INDPTR, FILL, START, LENS_OUT, FOLDED_GRID = 1, 2, 4, 8, 16, 32, 64, 128
WIDE_OUT, MAPPING, WIDE_MAPPING, ROUND_TOWARD_ZERO = 256, 512, 1024, 2048
POSITIONS, WIDE_POSITIONS, V2P, WIDE_V2P, INDPTR_START = 4096, 8192, 16384, 32768, 65536

# The geometry depends on a few ints only (the shape and the device's program budget); caching it keeps the
# helper off the per-call path.
_page_table_launch = functools.lru_cache(maxsize=4096)(grid.page_table_launch)
_token_csr_launch = functools.lru_cache(maxsize=4096)(grid.token_csr_launch)
_dcp_token_csr_launch = functools.lru_cache(maxsize=4096)(grid.dcp_token_csr_launch)
_dcp_page_table_launch = functools.lru_cache(maxsize=4096)(grid.dcp_page_table_launch)
_mapped_page_table_launch = functools.lru_cache(maxsize=4096)(grid.mapped_page_table_launch)
_draft_decode_launch = functools.lru_cache(maxsize=4096)(grid.draft_decode_launch)
_GEOMETRY_CACHES = (_page_table_launch, _token_csr_launch, _dcp_token_csr_launch, _dcp_page_table_launch,
                    _mapped_page_table_launch, _draft_decode_launch)
# The programs one launch may use on a device (``grid.program_budget`` of its multiprocessors), by the
# device's index as ``Tensor.get_device()`` gives it (-1: the CPU, where the host build runs the calls).
_budgets: dict[int, int] = {}


def forget_geometry() -> None:
    """Drop every cached ``Launch`` and program budget (after ``kvdispatch.grid``'s limits change, as tests
    do)."""
    for cache in _GEOMETRY_CACHES:
        cache.cache_clear()
    _budgets.clear()


def _budget(tensor: torch.Tensor) -> int:
    """The program budget of ``tensor``'s device: the kernels stride over their rows' blocks, so the grid
    follows the device, not the buffers' width. Probed once per device."""
    index = tensor.get_device()
    budget = _budgets.get(index)
    if budget is None:
        budget = _budgets[index] = grid.program_budget(devices.probe(tensor.device).multiprocessors)
    return budget


def _kernel_call(kernel: str, defines: tuple, launch: grid.Launch, raw: tuple) -> KernelCall:
    """The call of ``kernel`` on ``launch``'s grid with the arguments ``raw``, where each pointer parameter is
    its tensor, or None for an absent one: ``args`` holds their addresses (0 for None), ``pointers`` the
    tensors by parameter."""
    pointers = tuple((i, a) for i, a in enumerate(raw) if isinstance(a, torch.Tensor))
    args = list(raw)
    for i, a in enumerate(args):
        if a is None:
            args[i] = 0
    for i, t in pointers:
        args[i] = t.data_ptr()
    return KernelCall(kernel, defines, launch.grid, launch.threads, tuple(args), pointers=pointers)


def with_pdl(call: KernelCall | None, pdl: bool, device) -> KernelCall | None:
    """``call`` for programmatic dependent launch when ``pdl`` is asked for and ``device`` supports it (the
    probe's ``supports_pdl``): compiled with ``KV_PDL`` (the kernels wait for the previous kernel before their
    first load and release the next one after their last store) and launched with the programmatic stream
    serialisation attribute (``runtime.launch_pdl``). Otherwise ``call`` unchanged."""
    if call is None or not pdl or not devices.probe(device).supports_pdl:
        return call
    return call._replace(defines=call.defines + (("KV_PDL", 1),), pdl=True)


def _stride(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.stride(0)


def _wide(t: torch.Tensor | None, bit: int) -> int:
    return bit if t is not None and t.dtype == torch.int64 else 0


def _folded(launch: grid.Launch) -> int:
    return FOLDED_GRID if launch.folded else 0


def _table_args(req_to_token):
    rows, cols = req_to_token.shape
    return (req_to_token, rows, cols, req_to_token.stride(0))


def page_table_call(req_to_token, req_pool_indices, seq_lens, out, page_size, kv_start_idx=None,
                    seqlen_offset=0, seq_lens_out=None, fill_value=None, round_toward_zero=False) -> KernelCall | None:
    """The ``kv_page_table`` launch for ``kvdispatch.ops.page_table.reference``'s arguments, or None
    when there is nothing to do."""
    batch, width = req_pool_indices.shape[0], out.shape[1]
    launch = _page_table_launch(batch, width, page_size, seq_lens_out is not None, budget=_budget(out))
    if launch.grid[0] == 0:
        return None
    flags = (_wide(req_pool_indices, WIDE_POOL) | _wide(seq_lens, WIDE_LENS) | _wide(kv_start_idx, WIDE_START)
             | (FILL if fill_value is not None else 0) | (START if kv_start_idx is not None else 0)
             | (LENS_OUT if seq_lens_out is not None else 0) | _folded(launch)
             | (ROUND_TOWARD_ZERO if round_toward_zero else 0))
    rows, cols = req_to_token.shape
    args = (req_to_token, req_pool_indices, seq_lens, out, rows, cols, req_to_token.stride(0), out.stride(0), width,
            launch.items_per_program, seqlen_offset, req_pool_indices.stride(0), seq_lens.stride(0), page_size,
            kv_start_idx, _stride(kv_start_idx), seq_lens_out, fill_value or 0, flags)
    defines = (("KV_PAGE_SIZE", page_size), ("KV_FLAGS", flags))
    return _kernel_call("kv_page_table", defines, launch, args)


def token_csr_call(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, kv_start_idx=None, entry_page_size=1,
                   token_mapping=None, v2p=None, page_size=1) -> KernelCall | None:
    """The ``kv_token_csr`` launch for ``kvdispatch.ops.token_csr.reference``'s arguments, or None
    when there is nothing to do."""
    batch, total = req_pool_indices.shape[0], out.shape[0]
    launch = _token_csr_launch(batch, req_to_token.shape[1] * entry_page_size, total, budget=_budget(out))
    if launch.grid[0] == 0:
        return None
    flags = (_wide(req_pool_indices, WIDE_POOL) | _wide(seq_lens, WIDE_LENS) | _wide(kv_start_idx, WIDE_START)
             | _wide(kv_indptr, WIDE_INDPTR) | (START if kv_start_idx is not None else 0) | _folded(launch)
             | _wide(out, WIDE_OUT) | (MAPPING if token_mapping is not None else 0)
             | _wide(token_mapping, WIDE_MAPPING) | (V2P | _wide(v2p, WIDE_V2P) if v2p is not None else 0))
    args = _table_args(req_to_token) + (
        req_pool_indices, req_pool_indices.stride(0), seq_lens, seq_lens.stride(0), kv_start_idx,
        _stride(kv_start_idx), kv_indptr, kv_indptr.stride(0), out, total, launch.items_per_program, flags,
        entry_page_size, token_mapping, 0 if token_mapping is None else token_mapping.shape[0], v2p,
        0 if v2p is None else v2p.shape[0], page_size)
    defines = (("KV_FLAGS", flags),) if entry_page_size == 1 else (("KV_FLAGS", flags),
                                                                  ("KV_ENTRY_PAGE_SIZE", entry_page_size))
    if v2p is not None:
        defines += (("KV_PAGE_SIZE", page_size),)
    return _kernel_call("kv_token_csr", defines, launch, args)


def mha_page_table_call(req_to_token, req_pool_indices, seq_lens, page_table, page_size, swa_page_table=None,
                        full_to_swa=None, round_toward_zero=False, seqlen_offset=0) -> KernelCall | None:
    """The ``kv_mha_page_table`` launch for ``kvdispatch.ops.mha_page_table.reference``'s arguments, or None
    when there is nothing to do. An empty ``full_to_swa`` leaves the SWA table out (nothing to read)."""
    width = page_table.shape[1]
    swa = swa_page_table is not None and full_to_swa.shape[0] > 0
    swa_width = swa_page_table.shape[1] if swa else 0
    launch = _mapped_page_table_launch(req_pool_indices.shape[0], max(width, swa_width), page_size,
                                       budget=_budget(page_table))
    if launch.grid[0] == 0:
        return None
    flags = (_wide(req_pool_indices, WIDE_POOL) | _wide(seq_lens, WIDE_LENS) | _folded(launch)
             | (MAPPING | _wide(full_to_swa, WIDE_MAPPING) if swa else 0)
             | (ROUND_TOWARD_ZERO if round_toward_zero else 0))
    rows, cols = req_to_token.shape
    args = (req_to_token, req_pool_indices, seq_lens, page_table, swa_page_table if swa else None,
            full_to_swa if swa else None, rows, cols, req_to_token.stride(0),
            width, page_table.stride(0), swa_width, _stride(swa_page_table) if swa else 0,
            full_to_swa.shape[0] if swa else 0, req_pool_indices.stride(0), seq_lens.stride(0), seqlen_offset,
            launch.items_per_program, page_size, flags)
    defines = (("KV_PAGE_SIZE", page_size), ("KV_FLAGS", flags))
    return _kernel_call("kv_mha_page_table", defines, launch, args)


def translated_page_table_call(req_to_token, req_pool_indices, seq_lens, v2p, out, page_size, multiplier=1,
                               max_pages=None, seq_len_delta=0, fill_value=None) -> KernelCall | None:
    """The ``kv_translated_page_table`` launch for ``kvdispatch.ops.translated_page_table.reference``'s
    arguments, or None when there is nothing to do."""
    columns = out.shape[1] if max_pages is None else min(max_pages, out.shape[1])
    launch = _mapped_page_table_launch(req_pool_indices.shape[0], columns, page_size, budget=_budget(out))
    if launch.grid[0] == 0:
        return None
    flags = (_wide(req_pool_indices, WIDE_POOL) | _wide(seq_lens, WIDE_LENS) | _folded(launch)
             | _wide(v2p, WIDE_MAPPING) | (FILL if fill_value is not None else 0))
    rows, cols = req_to_token.shape
    args = (req_to_token, req_pool_indices, seq_lens, v2p, out, rows, cols, req_to_token.stride(0), columns,
            out.stride(0), v2p.shape[0], multiplier, seq_len_delta, req_pool_indices.stride(0), seq_lens.stride(0),
            launch.items_per_program, page_size, fill_value or 0, flags)
    defines = (("KV_PAGE_SIZE", page_size), ("KV_FLAGS", flags))
    return _kernel_call("kv_translated_page_table", defines, launch, args)


_runtime_module = None


def _runtime():
    """``kernels_cupy.runtime`` (which imports CuPy), imported at the first launch and then kept:
    an import statement costs host time on every call."""
    global _runtime_module
    if _runtime_module is None:
        from . import runtime  # noqa: PLC0415  (imports CuPy)

        _runtime_module = runtime
    return _runtime_module


def draft_decode_call(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, num_steps, topk, page_size=1,
                      positions=None, window_size=0, sink_size=0, v2p=None, write_indptr_start=True,
                      round_toward_zero=False, entry_page_size=1, step_window=0) -> KernelCall | None:
    """The ``kv_draft_decode`` launch for ``kvdispatch.ops.draft_decode.reference``'s arguments, or
    None when there is nothing to do."""
    if num_steps == 0:
        return None
    rows, cols = req_to_token.shape
    width = out.shape[1]
    launch = _draft_decode_launch(req_pool_indices.shape[0] * topk, cols * entry_page_size, width,
                                  budget=_budget(out))
    if launch.grid[0] == 0:
        return None
    cap = draft_prefix_cap(window_size, sink_size)
    flags = (_wide(req_pool_indices, WIDE_POOL) | _wide(seq_lens, WIDE_LENS) | _wide(kv_indptr, WIDE_INDPTR)
             | _wide(out, WIDE_OUT) | _folded(launch) | (ROUND_TOWARD_ZERO if round_toward_zero else 0)
             | (POSITIONS if positions is not None else 0) | _wide(positions, WIDE_POSITIONS)
             | (V2P if v2p is not None else 0) | _wide(v2p, WIDE_V2P) | (INDPTR_START if write_indptr_start else 0))
    args = _table_args(req_to_token) + (
        req_pool_indices, req_pool_indices.stride(0), seq_lens, seq_lens.stride(0), kv_indptr, kv_indptr.stride(0), out,
        width, out.stride(0), num_steps, topk, cap, min(sink_size, cap) if window_size > 0 else cap,
        grid.DRAFT_OFFSET_LIMIT, launch.items_per_program, flags, page_size, positions, _stride(positions), v2p,
        0 if v2p is None else v2p.shape[0], entry_page_size, step_window)
    defines = (("KV_FLAGS", flags), ("KV_PAGE_SIZE", page_size), ("KV_ENTRY_PAGE_SIZE", entry_page_size))
    return _kernel_call("kv_draft_decode", defines, launch, args)


def _rounding(round_toward_zero: bool) -> int:
    return ROUND_TOWARD_ZERO if round_toward_zero else 0


def dcp_token_csr_call(req_to_token, req_pool_indices, local_seq_lens, kv_indptr, out, dcp_size, dcp_rank,
                       kv_start_idx=None, round_toward_zero=False) -> KernelCall | None:
    """The ``kv_dcp_token_csr`` launch for ``kvdispatch.ops.dcp_token_csr.reference``'s arguments, or None
    when there is nothing to do."""
    batch, total = req_pool_indices.shape[0], out.shape[0]
    launch = _dcp_token_csr_launch(batch, req_to_token.shape[1], total, dcp_size, budget=_budget(out))
    if launch.grid[0] == 0:
        return None
    flags = (_wide(req_pool_indices, WIDE_POOL) | _wide(local_seq_lens, WIDE_LENS) | _wide(kv_start_idx, WIDE_START)
             | _wide(kv_indptr, WIDE_INDPTR) | (START if kv_start_idx is not None else 0) | _folded(launch)
             | _wide(out, WIDE_OUT) | _rounding(round_toward_zero))
    args = _table_args(req_to_token) + (
        req_pool_indices, req_pool_indices.stride(0), local_seq_lens, local_seq_lens.stride(0), kv_start_idx,
        _stride(kv_start_idx), kv_indptr, kv_indptr.stride(0), out, total, launch.items_per_program, flags, dcp_size,
        dcp_rank)
    return _kernel_call("kv_dcp_token_csr", (("KV_FLAGS", flags), ("KV_DCP_SIZE", dcp_size)), launch, args)


def dcp_page_table_call(req_to_token, req_pool_indices, local_seq_lens, out, page_size, dcp_size, dcp_rank,
                        fill_value=None, round_toward_zero=False, v2p=None) -> KernelCall | None:
    """The ``kv_dcp_page_table`` launch for ``kvdispatch.ops.dcp_page_table.reference``'s arguments, or None
    when there is nothing to do."""
    batch, width = req_pool_indices.shape[0], out.shape[1]
    launch = _dcp_page_table_launch(batch, width, page_size, budget=_budget(out))
    if launch.grid[0] == 0:
        return None
    flags = (_wide(req_pool_indices, WIDE_POOL) | _wide(local_seq_lens, WIDE_LENS) | _folded(launch)
             | (FILL if fill_value is not None else 0) | _rounding(round_toward_zero)
             | (V2P if v2p is not None else 0) | _wide(v2p, WIDE_V2P))
    rows, cols = req_to_token.shape
    args = (req_to_token, req_pool_indices, local_seq_lens, out, rows, cols, req_to_token.stride(0), out.stride(0),
            width, launch.items_per_program, req_pool_indices.stride(0), local_seq_lens.stride(0), page_size, dcp_size,
            dcp_rank, fill_value or 0, flags, v2p, 0 if v2p is None else v2p.shape[0])
    defines = (("KV_PAGE_SIZE", page_size), ("KV_DCP_SIZE", dcp_size), ("KV_FLAGS", flags))
    return _kernel_call("kv_dcp_page_table", defines, launch, args)


def _launched(call: KernelCall | None, pdl: bool) -> None:
    """Launch ``call`` (None: nothing to do) on the device of its tensors, with programmatic dependent launch
    when ``pdl`` is asked for and the device supports it (``with_pdl``)."""
    if call is None:
        return
    device = call.pointers[0][1].device
    if pdl:
        call = with_pdl(call, pdl, device)
        if call.pdl:
            _runtime().launch_pdl(call, device)
            return
    _runtime().launch(call, device)
    launches = host_path.recording()
    if launches is not None:  # a call that may register a replay plan (kvdispatch.host_path)
        launches.append(functools.partial(native.replay_launch, call, device.index))


def _launcher(describe):
    """The backend's launcher of an op whose call ``describe`` (a ``*_call`` here) builds: it takes the op's
    parameters in ``describe``'s order, then ``pdl`` (programmatic dependent launch where the device supports
    it; ``kvdispatch.dispatch`` passes it positionally, last), and launches the call (``_launched``)."""
    parameters = len(inspect.signature(describe).parameters)

    def launch(*arguments, pdl=False):
        if len(arguments) > parameters:
            arguments, pdl = arguments[:-1], arguments[-1]
        _launched(describe(*arguments), pdl)

    launch.__qualname__ = f"_launcher({describe.__name__})"
    launch.describe = describe  # the call it launches (the tests' host build runs the same call)
    launch.__doc__ = f"``{describe.__name__}``'s arguments, then ``pdl``: launches that call (``_launcher``)."
    return launch


# -- one decode step's metadata (kvdispatch.update_decode_metadata) --
DM_K_LEADING, DM_Q_CUMSUM, DM_Q_STRIDED, DM_Q_LEADING, DM_TABLE = (1 << 40, 1 << 41, 1 << 42, 1 << 43, 1 << 44)
DM_FULL_V2P, DM_SWA_SLOTS, DM_SWA_PAGES, DM_ZERO_TAIL, DM_SWA_LOC = (1 << 45, 1 << 46, 1 << 47, 1 << 48, 1 << 49)
DM_WIDE_QLENS, DM_WIDE_LOC, DM_WIDE_SWA_LOC, DM_WIDE_FULL_V2P, DM_WIDE_SWA_V2P = (1 << 50, 1 << 51, 1 << 52, 1 << 53,
                                                                                  1 << 54)
_decode_metadata_launch = functools.lru_cache(maxsize=4096)(grid.decode_metadata_launch)


def _length(t: torch.Tensor | None, dimension: int = 0) -> int:
    return 0 if t is None else t.shape[dimension]


def decode_metadata_call(req_to_token, req_pool_indices, seq_lens, cache_seqlens, cu_seqlens_k, page_size,
                         seqlen_offset=0, page_table=None, swa_page_table=None, full_to_swa=None, full_v2p=None,
                         swa_v2p=None, zero_tail=False, cu_seqlens_q=None, qlens=None, q_stride=None,
                         out_cache_loc=None, swa_out_cache_loc=None) -> KernelCall:
    """The ``kv_decode_metadata`` launch for ``kvdispatch.ops.decode_metadata.reference``'s arguments."""
    batch = req_pool_indices.shape[0]
    width, swa_width = _length(page_table, 1), _length(swa_page_table, 1)
    launch = _decode_metadata_launch(batch, max(width, swa_width), page_size, budget=_budget(cache_seqlens))
    swa_pages = swa_v2p is not None
    flags = (_wide(req_pool_indices, WIDE_POOL) | _wide(seq_lens, WIDE_LENS) | _folded(launch)
             | _wide(full_to_swa, WIDE_MAPPING) | (DM_K_LEADING if cu_seqlens_k.shape[0] > batch else 0)
             | (0 if cu_seqlens_q is None else (DM_Q_CUMSUM if qlens is not None else DM_Q_STRIDED)
                | (DM_Q_LEADING if cu_seqlens_q.shape[0] > batch else 0))
             | (DM_TABLE if page_table is not None and batch else 0) | (DM_FULL_V2P if full_v2p is not None else 0)
             | (0 if swa_page_table is None else DM_SWA_PAGES if swa_pages else DM_SWA_SLOTS)
             | (DM_ZERO_TAIL if zero_tail else 0) | (DM_SWA_LOC if swa_out_cache_loc is not None else 0)
             | _wide(qlens, DM_WIDE_QLENS) | _wide(out_cache_loc, DM_WIDE_LOC)
             | _wide(swa_out_cache_loc, DM_WIDE_SWA_LOC) | _wide(full_v2p, DM_WIDE_FULL_V2P)
             | _wide(swa_v2p, DM_WIDE_SWA_V2P))
    rows, cols = req_to_token.shape
    args = (req_to_token, req_pool_indices, seq_lens, cache_seqlens, cu_seqlens_k, page_table, swa_page_table,
            full_to_swa, full_v2p, swa_v2p, cu_seqlens_q, qlens, out_cache_loc, swa_out_cache_loc, batch, rows, cols,
            req_to_token.stride(0), width, _stride(page_table), swa_width, _stride(swa_page_table),
            _length(full_to_swa), _length(full_v2p), _length(swa_v2p), seqlen_offset, q_stride or 0,
            min(_length(out_cache_loc), _length(swa_out_cache_loc)), _length(swa_out_cache_loc),
            req_pool_indices.stride(0), seq_lens.stride(0), cache_seqlens.stride(0), cu_seqlens_k.stride(0),
            _stride(cu_seqlens_q), _stride(qlens), _stride(out_cache_loc), _stride(swa_out_cache_loc),
            launch.items_per_program, page_size, flags)
    return _kernel_call("kv_decode_metadata", (("KV_PAGE_SIZE", page_size), ("KV_FLAGS", flags)), launch, args)


# Per-request slices gathered into cache locations (kvdispatch.create_cache_locs): the kernel's own `layout`
# bits (the KV_CACHE_LOCS_* values of kv_indices.cu) say which slices and the dtypes the flags do not.

CACHE_LOCS_PACKED, CACHE_LOCS_WIDE_TABLE, CACHE_LOCS_WIDE_START, CACHE_LOCS_WIDE_END = 1, 2, 4, 8
CACHE_LOCS_WIDE_FULL_OUT, CACHE_LOCS_WIDE_SWA_OUT = 16, 32
_cache_locs_launch = functools.lru_cache(maxsize=4096)(grid.cache_locs_launch)
_GEOMETRY_CACHES += (_cache_locs_launch,)


def cache_locs_call(req_to_token, req_pool_indices, start_offset, out, end_offset=None, width=None,
                    positions_out=None, page_size=1, full_v2p=None, full_out=None, swa_v2p=None,
                    swa_out=None) -> KernelCall | None:
    """The ``kv_cache_locs`` launch for ``kvdispatch.ops.cache_locs.reference``'s arguments, or None when there is
    nothing to do."""
    rows, cols = req_to_token.shape
    launch = _cache_locs_launch(req_pool_indices.shape[0], cols, out.shape[0], budget=_budget(out))
    if launch.grid[0] == 0:
        return None
    page_size = page_size if full_v2p is not None or swa_v2p is not None else 1  # one module without maps
    flags = (_wide(req_pool_indices, WIDE_POOL) | _wide(out, WIDE_OUT) | _folded(launch)
             | (POSITIONS | _wide(positions_out, WIDE_POSITIONS) if positions_out is not None else 0)
             | (V2P | _wide(full_v2p, WIDE_V2P) if full_v2p is not None else 0)
             | (MAPPING | _wide(swa_v2p, WIDE_MAPPING) if swa_v2p is not None else 0))
    layout = ((CACHE_LOCS_PACKED if end_offset is not None else 0) | _wide(req_to_token, CACHE_LOCS_WIDE_TABLE)
              | _wide(start_offset, CACHE_LOCS_WIDE_START) | _wide(end_offset, CACHE_LOCS_WIDE_END)
              | _wide(full_out, CACHE_LOCS_WIDE_FULL_OUT) | _wide(swa_out, CACHE_LOCS_WIDE_SWA_OUT))
    args = (req_to_token, req_pool_indices, start_offset, end_offset, out, positions_out, full_v2p, full_out, swa_v2p,
            swa_out, rows, cols, req_to_token.stride(0), out.shape[0], width or 0, req_pool_indices.stride(0),
            start_offset.stride(0), _stride(end_offset), 0 if full_v2p is None else full_v2p.shape[0],
            0 if swa_v2p is None else swa_v2p.shape[0], launch.items_per_program, grid.CACHE_LOCS_OFFSET_LIMIT,
            page_size, layout, flags)
    defines = (("KV_FLAGS", flags), ("KV_PAGE_SIZE", page_size))
    return _kernel_call("kv_cache_locs", defines, launch, args)


_compact_csr_launch = functools.lru_cache(maxsize=4096)(grid.compact_csr_launch)
_GEOMETRY_CACHES += (_compact_csr_launch,)


def compact_csr_call(source, lens, kv_indptr, out, row_step=1, source_indptr=None, offset=0, step=1, empty_fill=None,
                     max_count=None) -> KernelCall | None:
    """The ``kv_compact_csr`` launch for ``kvdispatch.ops.compact_csr.reference``'s arguments, or None when there
    is nothing to do."""
    launch = _compact_csr_launch(lens.shape[0], source.shape[1], out.shape[0], step, budget=_budget(out))
    if launch.grid[0] == 0:
        return None
    flags = (_wide(lens, WIDE_LENS) | _wide(kv_indptr, WIDE_INDPTR) | _wide(source_indptr, WIDE_START)
             | (START if source_indptr is not None else 0) | (FILL if empty_fill is not None else 0)
             | _folded(launch) | _wide(out, WIDE_OUT))
    args = _table_args(source) + (
        lens, lens.stride(0), source_indptr, _stride(source_indptr), kv_indptr, kv_indptr.stride(0), out,
        out.shape[0], launch.items_per_program, flags, row_step, offset, step,
        2**62 if max_count is None else max_count, empty_fill or 0)
    return _kernel_call("kv_compact_csr", (("KV_FLAGS", flags),), launch, args)


_prefix_extend_csr_launch = functools.lru_cache(maxsize=4096)(grid.prefix_extend_csr_launch)
_GEOMETRY_CACHES += (_prefix_extend_csr_launch,)


def prefix_extend_csr_call(prefix_lens, prefix_starts, extend_lens, extend_starts, kv_indptr, out,
                           extend_base=0) -> KernelCall | None:
    """The ``kv_prefix_extend_csr`` launch for ``kvdispatch.ops.prefix_extend_csr.reference``'s arguments, or None
    when there is nothing to do."""
    launch = _prefix_extend_csr_launch(prefix_lens.shape[0], out.shape[0], budget=_budget(out))
    if launch.grid[0] == 0:
        return None
    flags = (_wide(prefix_lens, WIDE_LENS) | _wide(prefix_starts, WIDE_START) | _wide(extend_lens, WIDE_POOL)
             | _wide(extend_starts, WIDE_POSITIONS) | _wide(kv_indptr, WIDE_INDPTR) | _folded(launch)
             | _wide(out, WIDE_OUT))
    args = (prefix_lens, prefix_lens.stride(0), prefix_starts, prefix_starts.stride(0), extend_lens,
            extend_lens.stride(0), extend_starts, extend_starts.stride(0), kv_indptr, kv_indptr.stride(0), out,
            out.shape[0], launch.items_per_program, flags, extend_base)
    return _kernel_call("kv_prefix_extend_csr", (("KV_FLAGS", flags),), launch, args)


# -- the block table of a ragged token CSR (kvdispatch.create_ragged_page_table) --------------------------------


WIDE_TOKENS = WIDE_POOL  # kv_indices is int64: the macro KV_WIDE_TOKENS (the kernel reads no pool indices)


def ragged_page_table_call(kv_indices, kv_indptr, page_table, page_size, swa_page_table=None, full_to_swa=None,
                           round_toward_zero=False) -> KernelCall | None:
    """The ``kv_ragged_page_table`` launch for ``kvdispatch.ops.ragged_page_table.reference``'s arguments, or
    None when there is nothing to do. An empty ``full_to_swa`` leaves the SWA table out (nothing to read)."""
    width = page_table.shape[1]
    swa = swa_page_table is not None and full_to_swa.shape[0] > 0
    swa_width = swa_page_table.shape[1] if swa else 0
    launch = _mapped_page_table_launch(kv_indptr.shape[0] - 1, max(width, swa_width), page_size,
                                       budget=_budget(page_table))
    if launch.grid[0] == 0:
        return None
    flags = (_wide(kv_indices, WIDE_TOKENS) | _wide(kv_indptr, WIDE_INDPTR) | _folded(launch)
             | (MAPPING | _wide(full_to_swa, WIDE_MAPPING) if swa else 0)
             | (ROUND_TOWARD_ZERO if round_toward_zero else 0))
    args = (kv_indices, kv_indptr, page_table, swa_page_table if swa else None, full_to_swa if swa else None,
            kv_indices.shape[0], width, page_table.stride(0), swa_width, swa_page_table.stride(0) if swa else 0,
            full_to_swa.shape[0] if swa else 0, kv_indptr.stride(0), launch.items_per_program, page_size, flags)
    defines = (("KV_PAGE_SIZE", page_size), ("KV_FLAGS", flags))
    return _kernel_call("kv_ragged_page_table", defines, launch, args)


# -- the prefill-aware sliding-window token table (kvdispatch.create_prefill_aware_swa_table) -----------------


WIDE_PREFILL = WIDE_START  # prefill_lens is int64: the macro KV_WIDE_PREFILL (the kernel reads no starts)


def pa_swa_table_call(req_to_token, req_pool_indices, seq_lens, prefill_lens, out, kv_lens_out,
                      window_size) -> KernelCall | None:
    """The ``kv_pa_swa_table`` launch for ``kvdispatch.ops.pa_swa_table.reference``'s arguments, or None when
    there is nothing to do (no request)."""
    launch = _mapped_page_table_launch(req_pool_indices.shape[0], max(out.shape[1], 1), 1, budget=_budget(out))
    if launch.grid[0] == 0:
        return None
    flags = (_wide(req_pool_indices, WIDE_POOL) | _wide(seq_lens, WIDE_LENS) | _wide(prefill_lens, WIDE_PREFILL)
             | _folded(launch))
    rows, cols = req_to_token.shape
    args = (req_to_token, req_pool_indices, seq_lens, prefill_lens, out, kv_lens_out, rows, cols,
            req_to_token.stride(0), prefill_lens.shape[0], out.shape[1], out.stride(0), kv_lens_out.stride(0),
            window_size, req_pool_indices.stride(0), seq_lens.stride(0), launch.items_per_program, flags)
    return _kernel_call("kv_pa_swa_table", (("KV_FLAGS", flags),), launch, args)


# -- two token CSRs merged row by row (kvdispatch.create_merged_kv_indices) ------------------------------------


WIDE_INDPTR_OUT = WIDE_MAPPING  # kv_indptr_out is int64 (the merged kernel reads no mapping)
WIDE_EXTEND = WIDE_POSITIONS  # extend_kv_indices is int64 (nor positions)


def merged_token_csr_call(prefix_kv_indptr, prefix_kv_indices, extend_start_loc, extend_seq_lens, extend_kv_indices,
                          kv_indptr_out, out) -> KernelCall | None:
    """The ``kv_merged_token_csr`` launch for ``kvdispatch.ops.merged_token_csr.reference``'s arguments, or None
    when there is nothing to do (no request)."""
    batch = extend_seq_lens.shape[0]
    prefix_count, extend_count, total = prefix_kv_indices.shape[0], extend_kv_indices.shape[0], out.shape[0]
    span = max(min(prefix_count + extend_count, total), 1)
    launch = _token_csr_launch(batch, span, span, budget=_budget(out))
    if launch.grid[0] == 0:
        return None
    flags = (_wide(prefix_kv_indptr, WIDE_INDPTR) | _wide(extend_start_loc, WIDE_START)
             | _wide(extend_seq_lens, WIDE_LENS) | _wide(prefix_kv_indices, WIDE_TOKENS)
             | _wide(extend_kv_indices, WIDE_EXTEND) | _wide(out, WIDE_OUT) | _wide(kv_indptr_out, WIDE_INDPTR_OUT)
             | _folded(launch))
    args = (prefix_kv_indptr, prefix_kv_indices, extend_start_loc, extend_seq_lens, extend_kv_indices, kv_indptr_out,
            out, prefix_count, extend_count, total, prefix_kv_indptr.stride(0), extend_start_loc.stride(0),
            extend_seq_lens.stride(0), launch.items_per_program, flags)
    return _kernel_call("kv_merged_token_csr", (("KV_FLAGS", flags),), launch, args)


# -- each draft token's prefix-then-expand row (kvdispatch.create_spec_concat_page_table) ----------------------


def spec_concat_page_table_call(page_table_a, page_table_b, seq_lens_a, seq_lens_b, out,
                                draft_tokens) -> KernelCall | None:
    """The ``kv_spec_concat_page_table`` launch for ``kvdispatch.ops.spec_concat_page_table.reference``'s
    arguments, or None when there is nothing to do."""
    launch = _mapped_page_table_launch(seq_lens_b.shape[0], out.shape[1], 1, budget=_budget(out))
    if launch.grid[0] == 0:
        return None
    flags = _wide(seq_lens_a, WIDE_POOL) | _wide(seq_lens_b, WIDE_LENS) | _folded(launch)
    args = (page_table_a, page_table_b, seq_lens_a, seq_lens_b, out, draft_tokens, page_table_a.shape[1],
            page_table_a.stride(0), page_table_b.shape[1], page_table_b.stride(0), out.shape[1], out.stride(0),
            seq_lens_a.stride(0), seq_lens_b.stride(0), launch.items_per_program, flags)
    return _kernel_call("kv_spec_concat_page_table", (("KV_FLAGS", flags),), launch, args)


# A draft model's compact token-table rows (kvdispatch.build_compact_draft_rows): the kernel's own `layout` bits
# (the KV_COMPACT_DRAFT_* values of kv_indices.cu) give the dtypes the flags do not.

COMPACT_DRAFT_WIDE_TARGET, COMPACT_DRAFT_WIDE_VERIFY = 1, 2
_compact_draft_rows_launch = functools.lru_cache(maxsize=4096)(grid.compact_draft_rows_launch)
_GEOMETRY_CACHES += (_compact_draft_rows_launch,)


def compact_draft_rows_call(target_req_to_token, req_pool_indices, suffix_start, draft_prefix_lens, verify_locs,
                            draft_req_to_token) -> KernelCall | None:
    """The ``kv_compact_draft_rows`` launch for ``kvdispatch.ops.compact_draft_rows.reference``'s arguments, or
    None when there is nothing to do."""
    rows, cols = draft_req_to_token.shape
    launch = _compact_draft_rows_launch(req_pool_indices.shape[0], cols, budget=_budget(draft_req_to_token))
    if launch.grid[0] == 0:
        return None
    flags = (_wide(req_pool_indices, WIDE_POOL) | _wide(draft_prefix_lens, WIDE_LENS) | _wide(suffix_start, WIDE_START)
             | _wide(draft_req_to_token, WIDE_OUT) | _folded(launch))
    layout = _wide(target_req_to_token, COMPACT_DRAFT_WIDE_TARGET) | _wide(verify_locs, COMPACT_DRAFT_WIDE_VERIFY)
    args = (draft_req_to_token, target_req_to_token, req_pool_indices, suffix_start, draft_prefix_lens, verify_locs,
            rows, cols, draft_req_to_token.stride(0), target_req_to_token.shape[0], target_req_to_token.shape[1],
            target_req_to_token.stride(0), verify_locs.shape[1], verify_locs.stride(0), req_pool_indices.stride(0),
            suffix_start.stride(0), draft_prefix_lens.stride(0), launch.items_per_program, layout, flags)
    return _kernel_call("kv_compact_draft_rows", (("KV_FLAGS", flags),), launch, args)


# The ops this module launches: ``kernels_cupy.KERNELS`` reads them from this source, without importing it.
build_page_table = _launcher(page_table_call)
build_token_indices = _launcher(token_csr_call)
build_mha_page_table = _launcher(mha_page_table_call)
build_translated_page_table = _launcher(translated_page_table_call)
build_draft_decode_indices = _launcher(draft_decode_call)
build_dcp_token_indices = _launcher(dcp_token_csr_call)
build_dcp_page_table = _launcher(dcp_page_table_call)
build_decode_metadata = _launcher(decode_metadata_call)
build_cache_locs = _launcher(cache_locs_call)
build_compact_kv_indices = _launcher(compact_csr_call)
build_prefix_extend_kv_indices = _launcher(prefix_extend_csr_call)
build_ragged_page_table = _launcher(ragged_page_table_call)
build_pa_swa_table = _launcher(pa_swa_table_call)
build_merged_kv_indices = _launcher(merged_token_csr_call)
build_spec_concat_page_table = _launcher(spec_concat_page_table_call)
build_compact_draft_rows = _launcher(compact_draft_rows_call)

OP_LAUNCHERS = {
    "page_table": build_page_table,
    "token_csr": build_token_indices,
    "mha_page_table": build_mha_page_table,
    "translated_page_table": build_translated_page_table,
    "draft_decode": build_draft_decode_indices,
    "dcp_token_csr": build_dcp_token_indices,
    "dcp_page_table": build_dcp_page_table,
    "decode_metadata": build_decode_metadata,
    "cache_locs": build_cache_locs,
    "compact_csr": build_compact_kv_indices,
    "prefix_extend_csr": build_prefix_extend_kv_indices,
    "ragged_page_table": build_ragged_page_table,
    "pa_swa_table": build_pa_swa_table,
    "merged_token_csr": build_merged_kv_indices,
    "spec_concat_page_table": build_spec_concat_page_table,
    "compact_draft_rows": build_compact_draft_rows,
}
