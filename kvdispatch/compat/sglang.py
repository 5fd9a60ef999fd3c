"""A drop-in for SGLang's module ``sglang.kernels.ops.kvcache.kv_indices``, on kvdispatch.

``from kvdispatch.compat.sglang import X`` replaces ``from sglang.kernels.ops.kvcache.kv_indices import X``
for each of that module's public names, with the same parameter names, order and defaults, and likewise the
decode-context-parallel builders of SGLang's ``sglang.kernels.ops.attention.dcp_kernels`` and its DCP layout
helper ``get_dcp_lens``:

* the builders ``create_flashinfer_kv_indices_triton`` (token CSR), ``create_chunked_prefix_cache_kv_indices``
  (token CSR of one prefix chunk) and ``create_flashmla_kv_indices_triton`` (paged block table). Each is
  called with Triton's launch syntax ``builder[grid](...)`` or directly; the grid is checked and ignored,
  because kvdispatch sizes its own launch (from the buffers' shapes, never from the data, so a captured
  CUDA graph stays valid). The batch is ``req_pool_indices.shape[0]``: SGLang's call sites launch one
  program per entry. They forward to ``kvdispatch.create_flashinfer_kv_indices`` and
  ``kvdispatch.create_flashmla_kv_indices`` and return the output tensor;
* the decode-context-parallel builders ``create_triton_kv_indices_for_dcp_triton`` (one rank's token CSR) and
  ``create_mla_kv_page_table_for_dcp`` (one rank's block table), forwarding to ``kvdispatch.create_dcp_kv_indices``
  and ``kvdispatch.create_dcp_page_table``; unlike the three above they take the batch from the grid
  (``grid[0]``, as SGLang's kernels do; the block table also its covered width, ``grid[1] * PAGES_PER_BLOCK``),
  and ``get_dcp_lens``, the per-rank lengths their callers pass;
* the grid helpers ``get_num_page_per_block_flashmla``, ``get_num_kv_index_blocks_flashmla``,
  ``kv_indices_num_token_blocks``, ``kv_indices_token_blocks_for_copy`` and the constant
  ``KV_INDICES_TOKEN_BLOCKS_MIN_WIDTH``, with SGLang's values (engines size their buffers and grids with
  them). The compile-time block size of SGLang's own page-table kernel is not mirrored: no engine imports
  it, and ``get_num_page_per_block_flashmla`` gives its value per page size.

From SGLang's other KV-index modules, with their names, parameters and defaults:
``update_trtllm_mla_graph_metadata`` (the TRT-LLM MLA backend's fused CUDA-graph metadata update);
``get_num_mha_kv_index_blocks``, ``create_trtllm_mha_kv_indices_triton`` (launched as ``[grid](...)``, its
rows being ``grid[0]``) and ``build_trtllm_mha_page_table`` (the TRT-LLM MHA page table with its SWA twin,
forwarding to ``kvdispatch.create_trtllm_mha_page_table``); ``build_kernel_page_table`` and
``build_kv_read_table`` (the unified pool's translated tables, forwarding to
``kvdispatch.create_translated_page_table``). SGLang's asserts in them are ValueErrors here.

The row strides SGLang passes explicitly (``req_to_token_ptr_stride``, ``kv_indices_ptr_stride``) are
redundant, since tensors carry their strides: they are checked against the tensors, and a mismatch is a
``ValueError`` (in SGLang's kernel it would be a silent read or write in the wrong place). A flat (1-D)
table buffer (``kv_indices_ptr`` of the block table, the draft builder's ``kv_indices`` and ``kv_indptr``, the
DCP and TRT-LLM MHA tables) is read as rows of its row-stride argument's entries: a view of that buffer, row
``r`` its elements ``[r * stride, (r + 1) * stride)``, never an element past it. Rows need a contiguous last
dimension, so a flat buffer that is itself strided (``big[::2]``) cannot be read as rows wider than one entry
and is refused with a ``ValueError`` (no view of it has such rows; a copy would leave the caller's buffer
unwritten): pass a contiguous buffer, or a 2-D tensor whose rows are contiguous.

Arguments are checked as the public functions check theirs, before anything is written: counts, sizes, ranks,
strides and grid entries are Python ints (never bool or float) in range, flags are bools; anything else is a
``TypeError`` / ``ValueError`` naming the argument (errors from the forwarded call name the public function's
parameters: ``out``, ``seq_lens``, ...). A grid is a Triton grid: one to three ints ``>= 0``, or a callable of
the arguments by name giving one; builders that size their own launch check it and ignore it.
``TOKEN_BLOCK_PARALLEL`` is accepted and ignored (in SGLang, too, it changes how the copy is split, not its
result). ``ENTRY_PAGE_SIZE`` and ``token_mapping`` are passed on as ``entry_page_size=`` / ``token_mapping=``,
and only when they differ from their defaults. Tensors take the dtypes the public API takes.

Where SGLang's kernels would step outside a request's row (reading or writing a neighbouring row, or past the
tensor), the result is kvdispatch's bounded one instead: a block-table row stops at the buffer's width (SGLang
writes the pages past it into the next row), a row stops at the token table's last column or at a negative
position (SGLang reads the neighbouring row), nothing is written outside ``kv_indices`` whatever ``kv_indptr``
says, and a pool index outside the table gives an empty row. Elsewhere the results are SGLang's (the block
table divides a negative slot id rounding toward zero, as SGLang's kernel does: slot -65 at page size 64 gives
page -1), with one difference: lengths and start positions are exact integers, where SGLang's kernels keep
their low 32 bits (an int64 start of ``2**32 + 5`` is position 5 there, past the table here).

Speculative decoding: ``generate_draft_decode_kv_indices`` (SGLang's ``sglang.kernels.ops.speculative.
cache_locs``), launched as ``generate_draft_decode_kv_indices[grid](...)``, and the buffer sizing helpers
``draft_kv_indices_buffer_width`` and ``draft_kv_indices_used_len`` of SGLang's speculative utilities. Here the
grid is read: it gives the number of steps (``grid[0]``, unless ``NUM_STEPS`` does), the batch (``grid[1]``)
and the branches (``grid[2]``), as in SGLang. It forwards to ``kvdispatch.create_draft_decode_kv_indices``.
"""

from __future__ import annotations

import functools
import inspect

import torch

from .. import reference
# The builders, looked up at call time through these names (tests route them per backend).
from ..ops.dcp_page_table import create_dcp_page_table as _build_dcp_page_table
from ..ops.dcp_token_csr import create_dcp_kv_indices as _build_dcp_token_csr
from ..ops.draft_decode import create_draft_decode_kv_indices as _build_draft_decode
from ..ops.mha_page_table import create_trtllm_mha_page_table as _build_mha_page_table
from ..ops.page_table import create_flashmla_kv_indices as _build_page_table
from ..ops.token_csr import create_flashinfer_kv_indices as _build_token_csr
from ..ops.translated_page_table import create_translated_page_table as _build_translated_page_table
from .._validate import _INT32_MAX, _int32_tensor, _python_int, _tensor, check_flag, dcp_lengths_device
from ..grid import DRAFT_MAX_STEPS, DRAFT_MAX_TOPK, MAX_DCP_SIZE, MAX_PAGE_SIZE

# SGLang's page-table kernel gives each program 4096 tokens' worth of pages.
_TOKENS_PER_PAGE_PROGRAM = 4096
# Token-block sizing of SGLang's token-CSR launches: about 8192 tokens per program, about 512 programs.
_TOKENS_PER_TOKEN_BLOCK = 8192
_TOKEN_BLOCK_PROGRAMS = 512
# Rows narrower than this are copied by one program per request.
KV_INDICES_TOKEN_BLOCKS_MIN_WIDTH = 32768
# The bound of sizes, widths and strides given as Python ints (a tensor's extent).
_EXTENT_MAX = 2**63 - 1


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def get_num_page_per_block_flashmla(page_size: int = 64) -> int:
    """Pages per program of SGLang's page-table kernel: ``4096 // page_size`` (``page_size``: an int in
    ``[1, 4096]``)."""
    _python_int("page_size", page_size, 1, MAX_PAGE_SIZE)
    return _TOKENS_PER_PAGE_PROGRAM // page_size


def get_num_kv_index_blocks_flashmla(kv_indices_width: int, page_size: int) -> int:
    """Programs per row SGLang launches for a block table ``kv_indices_width`` pages wide:
    ``ceil(kv_indices_width / get_num_page_per_block_flashmla(page_size))``."""
    _python_int("kv_indices_width", kv_indices_width, 0, _EXTENT_MAX)
    return _cdiv(kv_indices_width, get_num_page_per_block_flashmla(page_size))


def kv_indices_num_token_blocks(table_width: int, base_programs: int) -> int:
    """Token blocks per request for SGLang's token-block launches:
    ``max(1, min(ceil(table_width / 8192), 512 // max(1, base_programs)))`` (both ints ``>= 0``)."""
    _python_int("table_width", table_width, 0, _EXTENT_MAX)
    _python_int("base_programs", base_programs, 0, _EXTENT_MAX)
    return max(1, min(_cdiv(table_width, _TOKENS_PER_TOKEN_BLOCK), _TOKEN_BLOCK_PROGRAMS // max(1, base_programs)))


def kv_indices_token_blocks_for_copy(table_width: int, base_programs: int) -> int:
    """1 for a token table narrower than ``KV_INDICES_TOKEN_BLOCKS_MIN_WIDTH``, else
    ``kv_indices_num_token_blocks(table_width, base_programs)``."""
    _python_int("table_width", table_width, 0, _EXTENT_MAX)
    if table_width < KV_INDICES_TOKEN_BLOCKS_MIN_WIDTH:
        _python_int("base_programs", base_programs, 0, _EXTENT_MAX)
        return 1
    return kv_indices_num_token_blocks(table_width, base_programs)


_GRID_PADDING = {1: (1, 1), 2: (1,), 3: ()}


def _launch_grid(grid, arguments):
    """A Triton launch grid as ``(x, y, z)``: one to three Python ints ``>= 0`` (a single int is ``(x,)``), the
    missing dimensions 1. A callable grid is first called with ``arguments()``, the launch's arguments by name
    (as Triton calls it)."""
    dims = grid(arguments()) if callable(grid) else grid
    if type(dims) is tuple and 1 <= len(dims) <= 3:
        for programs in dims:
            if type(programs) is not int or not 0 <= programs <= _INT32_MAX:
                break
        else:
            return dims + _GRID_PADDING[len(dims)]
    if not isinstance(dims, (tuple, list)):
        dims = (dims,)
    if not 1 <= len(dims) <= 3:
        raise ValueError(f"grid must have 1 to 3 dimensions (a Triton launch grid), got {tuple(dims)}")
    for axis, programs in enumerate(dims):
        _python_int(f"grid[{axis}]", programs, 0, _INT32_MAX)
    return (*dims, 1, 1)[:3]


class _Launch:
    """A builder ``launch(launch_grid, *args, **kwargs)`` as SGLang's Triton kernel is called:
    ``builder[grid](...)`` calls it with the grid as ``_launch_grid`` gives it, a direct call ``builder(...)`` with
    None. Both have the signature of ``launch`` less its first parameter: SGLang's."""

    def __init__(self, launch, name):
        launch.__name__ = launch.__qualname__ = name
        self._launch = launch
        self.__signature__ = inspect.Signature(list(inspect.signature(launch).parameters.values())[1:])
        self.__name__ = self.__qualname__ = name
        self.__doc__ = launch.__doc__

    def __call__(self, *args, **kwargs):
        return self._launch(None, *args, **kwargs)

    def __getitem__(self, grid):
        if not callable(grid):
            return functools.partial(self._launch, _launch_grid(grid, None))  # its signature: SGLang's

        def launch(*args, **kwargs):
            dims = _launch_grid(grid, lambda: self._arguments(args, kwargs))
            return self._launch(dims, *args, **kwargs)

        launch.__signature__, launch.__name__, launch.__doc__ = self.__signature__, self.__name__, self.__doc__
        return launch

    def _arguments(self, args, kwargs):
        """The launch's arguments by name, defaults included (what Triton passes a callable grid)."""
        bound = self.__signature__.bind(*args, **kwargs)
        bound.apply_defaults()
        return dict(bound.arguments)

    def __repr__(self):
        return f"<kvdispatch.compat.sglang.{self.__name__}>"


def _check_int(name, value, low, high):
    """``_python_int`` with its common case first."""
    if type(value) is not int or not low <= value <= high:
        _python_int(name, value, low, high)


def _check_stride(name, given, tensor, tensor_name):
    """``given``, SGLang's explicit row stride of ``tensor`` (the argument ``tensor_name``): None, or a Python
    int equal to ``tensor.stride(0)``."""
    if given is None or type(given) is int and type(tensor) is torch.Tensor and tensor.dim() and (
            given == tensor.stride(0)):
        return
    _python_int(name, given, 0, _EXTENT_MAX)
    _tensor(tensor_name, tensor)
    if tensor.dim() and given != tensor.stride(0):
        raise ValueError(f"{name}={given} does not match {tensor_name}'s row stride {tensor.stride(0)}; kvdispatch "
                         "reads strides from the tensors, so pass the tensor the stride belongs to")


def _as_rows(buffer, row_stride, name, stride_name):
    """``buffer`` (the argument ``name``, its row stride the argument ``stride_name``) as rows: a 2-D tensor as it
    is (``row_stride`` checked against its row stride), a flat buffer as ``buffer.shape[0] // row_stride`` rows of
    ``row_stride`` entries each, row ``r`` its elements ``[r * row_stride, (r + 1) * row_stride)`` (a view: only
    elements of ``buffer``, none past it). Rows need a contiguous last dimension, so a flat buffer that is
    itself strided (``stride(0) != 1``) is refused unless its rows are of one entry."""
    _tensor(name, buffer)
    if buffer.dim() != 1:
        _check_stride(stride_name, row_stride, buffer, name)
        return buffer
    if row_stride is None:
        raise ValueError(f"a 1-D {name} needs {stride_name} (the row width)")
    _python_int(stride_name, row_stride, 1, _EXTENT_MAX)
    if row_stride > 1 and buffer.shape[0] > 1 and buffer.stride(0) != 1:
        raise ValueError(f"a flat {name} is read as rows of {stride_name}={row_stride} contiguous entries, so it "
                         f"must have stride 1, got stride {buffer.stride(0)}; pass a contiguous buffer, or a 2-D "
                         f"{name} whose rows are contiguous")
    rows = buffer.shape[0] // row_stride
    return buffer[: rows * row_stride].view(rows, row_stride)


def _leading(name, t, rows):
    """The first ``rows`` entries of the 1-D ``t`` (``t`` itself when it has exactly that many), or a ValueError
    naming it when it has fewer."""
    _tensor(name, t)
    if t.dim() != 1:
        return t  # the public call names its shape
    if t.shape[0] < rows:
        raise ValueError(f"{name} must have at least {rows} entries (the rows launched), got {t.shape[0]}")
    return t if t.shape[0] == rows else t[:rows]


def _create_flashinfer_kv_indices(launch_grid, req_to_token_ptr, req_pool_indices_ptr, page_kernel_lens_ptr,
                                  kv_indptr, kv_start_idx, kv_indices_ptr, req_to_token_ptr_stride, ENTRY_PAGE_SIZE=1,
                                  TOKEN_BLOCK_PARALLEL=False, token_mapping=None):
    """Token-level CSR indices (FlashInfer, Triton and Aiter attention, EAGLE verify / draft extend).

    ``kv_indices_ptr[kv_indptr[b] + j] = req_to_token_ptr[req_pool_indices_ptr[b], kv_start_idx[b] + j]``
    for ``j < page_kernel_lens_ptr[b]`` (``kv_start_idx`` None: 0). Only ``kv_indptr[b]`` is read, for
    ``b < B = req_pool_indices_ptr.shape[0]``; every other position of ``kv_indices_ptr`` is left untouched.

    With ``ENTRY_PAGE_SIZE = E > 1`` the table holds one entry per ``E`` tokens and token ``q`` is
    ``req_to_token_ptr[row, q // E] * E + q % E``; with ``token_mapping`` every non-negative id ``v``
    becomes ``token_mapping[v]`` (negative ids give -1). These two are forwarded to the public API's
    ``entry_page_size=`` / ``token_mapping=`` keywords. ``TOKEN_BLOCK_PARALLEL`` (a bool) changes nothing.

    Shapes and dtypes as ``kvdispatch.create_flashinfer_kv_indices``; ``req_to_token_ptr_stride`` is checked
    against ``req_to_token_ptr.stride(0)``. Returns ``kv_indices_ptr``.
    """
    _check_stride("req_to_token_ptr_stride", req_to_token_ptr_stride, req_to_token_ptr, "req_to_token_ptr")
    _check_int("ENTRY_PAGE_SIZE", ENTRY_PAGE_SIZE, 1, MAX_PAGE_SIZE)
    check_flag("TOKEN_BLOCK_PARALLEL", TOKEN_BLOCK_PARALLEL)
    if ENTRY_PAGE_SIZE != 1 or token_mapping is not None:
        _build_token_csr(req_to_token_ptr, req_pool_indices_ptr, page_kernel_lens_ptr, kv_indptr, kv_indices_ptr,
                         kv_start_idx=kv_start_idx, entry_page_size=ENTRY_PAGE_SIZE, token_mapping=token_mapping)
    else:
        _build_token_csr(req_to_token_ptr, req_pool_indices_ptr, page_kernel_lens_ptr, kv_indptr, kv_indices_ptr,
                         kv_start_idx=kv_start_idx)
    return kv_indices_ptr


def _create_chunked_prefix_cache_kv_indices(launch_grid, req_to_token_ptr, req_pool_indices_ptr, chunk_start_idx_ptr,
                                            chunk_seq_lens_ptr, chunk_cu_seq_lens_ptr, chunk_kv_indices_ptr,
                                            req_to_token_ptr_stride):
    """Token-level CSR indices of one prefix chunk per request (chunked-prefix MLA, DCP prefix gather).

    ``chunk_kv_indices_ptr[chunk_cu_seq_lens_ptr[b] + j] =
    req_to_token_ptr[req_pool_indices_ptr[b], chunk_start_idx_ptr[b] + j]`` for ``j < chunk_seq_lens_ptr[b]``:
    the token CSR with ``kv_start_idx = chunk_start_idx_ptr``. Only ``chunk_cu_seq_lens_ptr[b]`` is read
    for ``b < B = req_pool_indices_ptr.shape[0]``, so an exclusive prefix sum of length ``B`` serves as
    well as one of length ``B + 1`` with a leading 0. Everything else is left untouched.

    ``req_to_token_ptr_stride`` is checked against ``req_to_token_ptr.stride(0)``.
    Returns ``chunk_kv_indices_ptr``.
    """
    _check_stride("req_to_token_ptr_stride", req_to_token_ptr_stride, req_to_token_ptr, "req_to_token_ptr")
    _build_token_csr(req_to_token_ptr, req_pool_indices_ptr, chunk_seq_lens_ptr, chunk_cu_seq_lens_ptr,
                     chunk_kv_indices_ptr, kv_start_idx=chunk_start_idx_ptr)
    return chunk_kv_indices_ptr


def _create_flashmla_kv_indices(launch_grid, req_to_token_ptr, req_pool_indices_ptr, page_kernel_lens_ptr,
                                kv_start_idx, kv_indices_ptr, req_to_token_ptr_stride, kv_indices_ptr_stride,
                                PAGED_SIZE=64):
    """Paged block table (FlashMLA, CUTLASS MLA, TRT-LLM MLA, Aiter MLA).

    ``kv_indices_ptr[b, p] = req_to_token_ptr[req_pool_indices_ptr[b], kv_start_idx[b] + p * PAGED_SIZE]
    // PAGED_SIZE`` for the ``ceil(page_kernel_lens_ptr[b] / PAGED_SIZE)`` pages of request
    ``b < B = req_pool_indices_ptr.shape[0]``, at most the buffer's width (``kv_start_idx`` None: 0), the
    division rounding toward zero.
    Columns past a row's pages and rows ``>= B`` are left untouched.

    ``kv_indices_ptr``: int32 ``[>= B, W]`` (``kv_indices_ptr_stride`` is checked against its row stride)
    or a flat contiguous int32 buffer read as rows of ``kv_indices_ptr_stride`` entries (``_as_rows``).
    ``req_to_token_ptr_stride`` is checked against ``req_to_token_ptr.stride(0)``; ``PAGED_SIZE``: an int in
    ``[1, 4096]``. Returns ``kv_indices_ptr``.
    """
    _check_stride("req_to_token_ptr_stride", req_to_token_ptr_stride, req_to_token_ptr, "req_to_token_ptr")
    _check_int("PAGED_SIZE", PAGED_SIZE, 1, MAX_PAGE_SIZE)
    _build_page_table(req_to_token_ptr, req_pool_indices_ptr, page_kernel_lens_ptr,
                      _as_rows(kv_indices_ptr, kv_indices_ptr_stride, "kv_indices_ptr", "kv_indices_ptr_stride"),
                      page_size=PAGED_SIZE, kv_start_idx=kv_start_idx, round_toward_zero=True)
    return kv_indices_ptr


create_flashinfer_kv_indices_triton = _Launch(_create_flashinfer_kv_indices, "create_flashinfer_kv_indices_triton")
create_chunked_prefix_cache_kv_indices = _Launch(_create_chunked_prefix_cache_kv_indices,
                                                 "create_chunked_prefix_cache_kv_indices")
create_flashmla_kv_indices_triton = _Launch(_create_flashmla_kv_indices, "create_flashmla_kv_indices_triton")


def update_trtllm_mla_graph_metadata(*, req_pool_indices, seq_lens, req_to_token, block_kv_indices, bs,
                                     seqlen_offset, page_size, seq_lens_k=None):
    """The TRT-LLM MLA backend's CUDA-graph metadata update, in one launch (SGLang's fused kernel).

    For request ``i < bs``: ``seq_lens_k[i] = int32(seq_lens[i] + seqlen_offset)`` when ``seq_lens_k`` is
    given, and ``block_kv_indices[i, p] = req_to_token[req_pool_indices[i], p * page_size] // page_size``
    (rounding toward zero) for ``p < ceil((seq_lens[i] + seqlen_offset) / page_size)``, at most the table's
    width (SGLang writes a longer row's pages on into the next row). It is
    ``kvdispatch.create_flashmla_kv_indices`` on the first ``bs`` requests (views: nothing is allocated).

    ``req_pool_indices``, ``seq_lens``: int32/int64 ``[>= bs]``; ``block_kv_indices``: int32 ``[>= bs, W]``;
    ``seq_lens_k``: optional int32 ``[>= bs]``; ``bs``: an int ``>= 0``; ``seqlen_offset``: an int (the draft
    tokens in target-verify, else 0); ``page_size``: an int in ``[1, 4096]``. Rows ``>= bs``, columns past each
    row's pages and ``seq_lens_k[bs:]`` are left untouched; ``bs`` 0 writes nothing. Returns None.
    """
    _check_int("bs", bs, 0, _INT32_MAX)
    pool = _leading("req_pool_indices", req_pool_indices, bs)
    lens = _leading("seq_lens", seq_lens, bs)
    lens_out = None if seq_lens_k is None else _leading("seq_lens_k", seq_lens_k, bs)
    if bs == 0:
        return None
    _build_page_table(req_to_token, pool, lens, block_kv_indices, page_size=page_size, seqlen_offset=seqlen_offset,
                      seq_lens_out=lens_out, round_toward_zero=True)
    return None


def get_num_mha_kv_index_blocks(num_pages: int, page_size: int) -> int:
    """Programs per row SGLang launches for a TRT-LLM MHA page table ``num_pages`` pages wide:
    ``ceil(num_pages / (4096 // page_size))``."""
    _python_int("num_pages", num_pages, 0, _EXTENT_MAX)
    return _cdiv(num_pages, get_num_page_per_block_flashmla(page_size))


def _check_mha_page_size(name, page_size):
    """``page_size`` (the argument ``name``): an int dividing 4096, which SGLang asserts in
    build_trtllm_mha_page_table (its kernel skips pages of longer rows otherwise)."""
    _python_int(name, page_size, 1, MAX_PAGE_SIZE)
    if _TOKENS_PER_PAGE_PROGRAM % page_size:
        raise ValueError(f"{name} must divide {_TOKENS_PER_PAGE_PROGRAM} for the TRT-LLM MHA page table, "
                         f"got {page_size}")


def _create_trtllm_mha_kv_indices(launch_grid, req_to_token_ptr, req_pool_indices_ptr, seq_lens_ptr, full_to_swa_ptr,
                                  page_table_ptr, swa_page_table_ptr, full_to_swa_numel, req_to_token_stride,
                                  page_table_stride, PAGE_SIZE, HAS_SWA):
    """The TRT-LLM MHA page table (and, with ``HAS_SWA``, its SWA twin) for the first ``grid[0]`` requests.

    ``page_table_ptr[r, p] = req_to_token_ptr[req_pool_indices_ptr[r], p * PAGE_SIZE] // PAGE_SIZE``
    (rounding toward zero) for the ``ceil(seq_lens_ptr[r] / PAGE_SIZE)`` pages of row ``r < grid[0]``, at most
    the table's width (SGLang writes a longer row's pages on into the next row); with ``HAS_SWA``
    ``swa_page_table_ptr[r, p] = full_to_swa_ptr[clamp(slot, 0, full_to_swa_numel - 1)] // PAGE_SIZE``.
    Everything else is left untouched. Launched only as ``[grid](...)``, as SGLang's kernel is.

    Tables: int32 ``[>= grid[0], W]`` with row stride ``page_table_stride`` (both tables; checked), or flat
    contiguous buffers read as rows of it (``_as_rows``). ``full_to_swa_numel`` reads the first that many entries
    of ``full_to_swa_ptr`` (more than it holds is a ValueError). ``PAGE_SIZE`` must divide 4096 (SGLang's kernel
    skips pages of longer rows otherwise). Without ``HAS_SWA`` the SWA arguments are not read. Returns None.
    """
    if launch_grid is None:
        raise TypeError("create_trtllm_mha_kv_indices_triton is launched as "
                        "create_trtllm_mha_kv_indices_triton[grid](...), its rows being grid[0]")
    _check_stride("req_to_token_stride", req_to_token_stride, req_to_token_ptr, "req_to_token_ptr")
    _check_mha_page_size("PAGE_SIZE", PAGE_SIZE)
    check_flag("HAS_SWA", HAS_SWA)
    page_table = _as_rows(page_table_ptr, page_table_stride, "page_table_ptr", "page_table_stride")
    swa_page_table = full_to_swa = None
    if HAS_SWA:
        if full_to_swa_ptr is None or swa_page_table_ptr is None:
            raise ValueError("HAS_SWA needs full_to_swa_ptr and swa_page_table_ptr")
        swa_page_table = _as_rows(swa_page_table_ptr, page_table_stride, "swa_page_table_ptr", "page_table_stride")
        _tensor("full_to_swa_ptr", full_to_swa_ptr)
        _check_int("full_to_swa_numel", full_to_swa_numel, 0, full_to_swa_ptr.numel())
        full_to_swa = full_to_swa_ptr[:full_to_swa_numel]
    rows = launch_grid[0]
    pool = _leading("req_pool_indices_ptr", req_pool_indices_ptr, rows)
    lens = _leading("seq_lens_ptr", seq_lens_ptr, rows)
    if rows == 0:
        return None
    _build_mha_page_table(req_to_token_ptr, pool, lens, page_table, page_size=PAGE_SIZE, swa_page_table=swa_page_table,
                          full_to_swa=full_to_swa, round_toward_zero=True)
    return None


create_trtllm_mha_kv_indices_triton = _Launch(_create_trtllm_mha_kv_indices, "create_trtllm_mha_kv_indices_triton")


def build_trtllm_mha_page_table(req_to_token, req_pool_indices, cache_seqlens, page_table, page_size,
                                swa_page_table=None, full_to_swa=None):
    """The TRT-LLM MHA backend's page-table build: ``create_trtllm_mha_kv_indices_triton`` on one row per row
    of ``page_table`` (``req_pool_indices`` and ``cache_seqlens`` need at least that many entries), with the
    SWA table when ``swa_page_table`` and ``full_to_swa`` (all of it) are given. SGLang's asserts are
    ValueErrors: the two SWA arguments given together, ``page_size`` dividing 4096; both tables must share
    their row stride (SGLang addresses the SWA table with the page table's). Returns None."""
    if (swa_page_table is None) != (full_to_swa is None):
        raise ValueError("swa_page_table and full_to_swa must be given together")
    _check_mha_page_size("page_size", page_size)
    _tensor("req_to_token", req_to_token)
    _int32_tensor("page_table", page_table, 2)
    rows, num_pages = page_table.shape
    if swa_page_table is not None:
        _tensor("full_to_swa", full_to_swa)
        _tensor("swa_page_table", swa_page_table)
        if swa_page_table.dim() == 2 and swa_page_table.stride(0) != page_table.stride(0):
            raise ValueError(f"swa_page_table's row stride {swa_page_table.stride(0)} differs from page_table's "
                             f"{page_table.stride(0)}: SGLang addresses both with page_table's")
    grid = (rows, get_num_mha_kv_index_blocks(num_pages, page_size))
    create_trtllm_mha_kv_indices_triton[grid](
        req_to_token, req_pool_indices, cache_seqlens, full_to_swa, page_table, swa_page_table,
        full_to_swa.numel() if full_to_swa is not None else 0, req_to_token.stride(0), page_table.stride(0),
        page_size, full_to_swa is not None)


def _translated_read_table(req_to_token, req_pool_indices, seq_lens, v2p, multiplier, page_size, max_pages, out,
                           seq_len_delta, columns_fit):
    """The unified pool's read tables: SGLang's asserts as ValueErrors (``columns_fit(max_pages, page_size,
    C)``: the table-width assert of the builder), then the translated page table on ``bs =
    req_pool_indices.numel()`` rows, ``out`` untouched when ``bs`` or ``max_pages`` is 0."""
    _tensor("req_pool_indices", req_pool_indices)
    _int32_tensor("req_to_token", req_to_token, 2)
    _python_int("page_size", page_size, 1, MAX_PAGE_SIZE)
    _python_int("max_pages", max_pages, 0, _INT32_MAX)
    batch = req_pool_indices.numel()
    if not isinstance(out, torch.Tensor) or out.dtype != torch.int32 or out.dim() != 2:
        raise ValueError(f"out must be a 2-D int32 tensor, got {getattr(out, 'dtype', type(out).__name__)} "
                         f"{tuple(getattr(out, 'shape', ()))}")
    if out.shape[0] < batch or out.shape[1] < max_pages:
        raise ValueError(f"out must be at least ({batch}, {max_pages}) (bs, max_pages), got {tuple(out.shape)}")
    if out.stride(1) != 1:
        raise ValueError(f"out's rows must be packed (stride(1) == 1), got strides {out.stride()}")
    if not columns_fit(max_pages, page_size, req_to_token.shape[1]):
        raise ValueError(f"max_pages={max_pages} pages of {page_size} tokens do not fit req_to_token's "
                         f"{req_to_token.shape[1]} columns")
    if req_pool_indices.dim() != 1:
        try:
            req_pool_indices = req_pool_indices.view(-1)  # SGLang reads its bs = numel() entries in order
        except RuntimeError:
            raise ValueError(f"req_pool_indices (shape {tuple(req_pool_indices.shape)}, strides "
                             f"{req_pool_indices.stride()}) cannot be read as a 1-D view of its entries; pass it "
                             "1-D") from None
    if batch == 0 or max_pages == 0:
        return out
    _build_translated_page_table(req_to_token, req_pool_indices, _leading("seq_lens", seq_lens, batch), v2p, out,
                                 page_size=page_size, multiplier=multiplier, max_pages=max_pages,
                                 seq_len_delta=seq_len_delta)
    return out


def build_kernel_page_table(*, req_to_token, req_pool_indices, seq_lens, v2p, multiplier, page_size, max_pages,
                            out):
    """The unified pool's kernel page table: for ``b < bs = req_pool_indices.numel()`` and live columns ``c <
    min(ceil(seq_lens[b] / page_size), max_pages)``, ``out[b, c] = max(v2p[page] * multiplier, 0)`` with
    ``page = req_to_token[req_pool_indices[b], c * page_size] // page_size`` (0 for a negative token: SGLang's
    CUDA kernel reads ``v2p[-1]`` at page size 1 there). Exact, saturated at ``2**31 - 1``; a page past ``v2p``
    gives 0. Every other element of ``out`` (dead columns, columns ``>= max_pages``, rows ``>= bs``) keeps its
    value (SGLang's CUDA kernel writes live columns up to the next multiple of 256).

    SGLang's asserts are ValueErrors: ``out`` int32, 2-D, at least ``(bs, max_pages)``, rows packed;
    ``max_pages * page_size <= req_to_token.shape[1]``. ``bs`` or ``max_pages`` 0: ``out`` untouched.
    Returns ``out``.
    """
    return _translated_read_table(req_to_token, req_pool_indices, seq_lens, v2p, multiplier, page_size, max_pages,
                                  out, 0, lambda pages, size, cols: pages * size <= cols)


def build_kv_read_table(*, req_to_token, req_pool_indices, seq_lens, v2p, multiplier, page_size, max_pages, out,
                        seq_len_delta=0):
    """The unified pool's KV read table: ``build_kernel_page_table`` with ``seq_len_delta`` added to every
    length (the draft tokens of a whole-sequence verify); its table-width assert is ``(max_pages - 1) *
    page_size < req_to_token.shape[1]``. Returns ``out``."""
    return _translated_read_table(req_to_token, req_pool_indices, seq_lens, v2p, multiplier, page_size, max_pages,
                                  out, seq_len_delta, lambda pages, size, cols: (pages - 1) * size < cols)


# SGLang's bound on a draft step row's width (its offsets are 32-bit there).
_DRAFT_ROW_WIDTH_LIMIT = 2**31


def draft_kv_indices_buffer_width(num_seqs: int, topk: int, max_context_len: int) -> int:
    """Entries per step row of the draft decode ``kv_indices`` buffer: ``num_seqs * topk * max_context_len``
    (every branch may hold a whole context; each an int ``>= 0``). Raises ``ValueError`` when that is ``2**31``
    or more."""
    for name, value in (("num_seqs", num_seqs), ("topk", topk), ("max_context_len", max_context_len)):
        _python_int(name, value, 0, _EXTENT_MAX)
    width = num_seqs * topk * max_context_len
    if width >= _DRAFT_ROW_WIDTH_LIMIT:
        raise ValueError(f"a draft kv_indices row of num_seqs * topk * max_context_len = {width} entries would "
                         f"overflow 32-bit offsets; reduce the batch, topk or context (limit {_DRAFT_ROW_WIDTH_LIMIT})")
    return width


def draft_kv_indices_used_len(seq_lens_sum: int, topk: int, bs: int, num_steps: int) -> int:
    """Entries of a draft step row used through ``num_steps`` steps: ``seq_lens_sum * topk + bs * num_steps``
    (``bs``: the branches, ``topk`` per request; each an int ``>= 0``)."""
    for name, value in (("seq_lens_sum", seq_lens_sum), ("topk", topk), ("bs", bs), ("num_steps", num_steps)):
        _python_int(name, value, 0, _EXTENT_MAX)
    return seq_lens_sum * topk + bs * num_steps


def _generate_draft_decode_kv_indices(launch_grid, req_pool_indices, req_to_token, paged_kernel_lens, kv_indices,
                                      kv_indptr, positions, pool_len, kv_indices_stride, kv_indptr_stride, bs_upper,
                                      iter_upper, num_tokens_upper, page_size, NUM_STEPS=0, *, window_size=0,
                                      sink_size=0, v2p=None, TRANSLATE=False, ENTRY_PAGE_SIZE=1):
    """Speculative multi-step draft decode indices (EAGLE): every step's token CSR in one launch.

    Launched as ``generate_draft_decode_kv_indices[(steps, num_seqs, topk)](...)``; with ``NUM_STEPS > 0`` the
    grid's first entry is ``NUM_STEPS`` times a number of token blocks, and ``NUM_STEPS`` is the step count.
    For step ``s``, request ``b < num_seqs`` and branch ``k < topk``, row ``s`` of ``kv_indices`` gets the
    request's ``paged_kernel_lens[b]`` tokens of ``req_to_token[req_pool_indices[b]]`` then the branch's
    ``s + 1`` draft slots, segments back to back (``kvdispatch.create_draft_decode_kv_indices``, with SGLang's
    draft-slot rule at ``page_size``, truncating division); ``kv_indptr[s, z]`` for ``z`` in ``1 ..
    num_seqs * topk`` is ``positions[0] + ... + positions[z - 1] + z * (s + 1)``; ``kv_indptr[s, 0]`` is left
    untouched (engines zero it once). ``window_size`` / ``sink_size``: the draft-only sliding window;
    ``TRANSLATE``: every id through ``v2p`` (pages of ``page_size``). A grid with a 0 launches nothing.

    ``pool_len``, ``kv_indices_stride`` and ``kv_indptr_stride`` are checked against the tensors' row strides
    (flat contiguous buffers are read as rows of that many entries, ``_as_rows``); ``bs_upper``, ``iter_upper``
    and ``num_tokens_upper`` (SGLang's block sizes) are accepted and not needed: sums here are exact over the
    whole batch. ``ENTRY_PAGE_SIZE`` other than 1 raises ``NotImplementedError``. Returns ``kv_indices``.
    """
    if launch_grid is None:
        raise TypeError("generate_draft_decode_kv_indices takes its batch, branches and steps from the launch grid: "
                        "call it as generate_draft_decode_kv_indices[(steps, num_seqs, topk)](...)")
    _check_int("ENTRY_PAGE_SIZE", ENTRY_PAGE_SIZE, 1, MAX_PAGE_SIZE)
    if ENTRY_PAGE_SIZE != 1:
        raise NotImplementedError(f"ENTRY_PAGE_SIZE={ENTRY_PAGE_SIZE}: only 1 (a token-granular table) is "
                                  "supported by generate_draft_decode_kv_indices")
    check_flag("TRANSLATE", TRANSLATE)
    if TRANSLATE and v2p is None:
        raise ValueError("TRANSLATE=True needs v2p")
    _check_int("NUM_STEPS", NUM_STEPS, 0, DRAFT_MAX_STEPS)
    first, batch, topk = launch_grid
    if not NUM_STEPS:
        _check_int("grid[0]", first, 0, DRAFT_MAX_STEPS)  # the steps
    _check_int("grid[2]", topk, 0, DRAFT_MAX_TOPK)
    _check_stride("pool_len", pool_len, req_to_token, "req_to_token")
    indptr = _as_rows(kv_indptr, kv_indptr_stride, "kv_indptr", "kv_indptr_stride")
    out = _as_rows(kv_indices, kv_indices_stride, "kv_indices", "kv_indices_stride")
    pool = _leading("req_pool_indices", req_pool_indices, batch)
    lens = _leading("paged_kernel_lens", paged_kernel_lens, batch)
    if topk == 0 or first == 0:
        return kv_indices  # no program launched
    _build_draft_decode(req_to_token, pool, lens, indptr, out, num_steps=NUM_STEPS or first, topk=topk,
                        page_size=page_size, positions=positions, window_size=window_size, sink_size=sink_size,
                        v2p=v2p if TRANSLATE else None, write_indptr_start=False, round_toward_zero=True)
    return kv_indices


generate_draft_decode_kv_indices = _Launch(_generate_draft_decode_kv_indices, "generate_draft_decode_kv_indices")


def _create_triton_kv_indices_for_dcp(launch_grid, req_to_token_ptr, req_pool_indices_ptr, dcp_kernel_lens_ptr,
                                      kv_indptr, kv_start_idx, kv_indices_ptr, req_to_token_ptr_stride, dcp_size,
                                      dcp_rank):
    """One decode-context-parallel rank's token-level CSR indices (Triton and FlashInfer attention under DCP).

    For request ``b < B`` (``B = grid[0]``, or ``req_pool_indices_ptr.shape[0]`` called directly), with
    ``first_b`` the first position ``>= kv_start_idx[b]`` (0 when None) congruent to ``dcp_rank`` mod
    ``dcp_size``: ``kv_indices_ptr[kv_indptr[b] + j] = req_to_token_ptr[req_pool_indices_ptr[b], first_b + j *
    dcp_size] / dcp_size`` (rounding toward zero) for ``j < dcp_kernel_lens_ptr[b]`` (``get_dcp_lens``'s count).
    Only ``kv_indptr[:B]`` is read; every other position of ``kv_indices_ptr`` is left untouched. Forwards to
    ``kvdispatch.create_dcp_kv_indices`` (a row ends at the table's last column; nothing is written outside
    ``kv_indices_ptr``). ``req_to_token_ptr_stride`` is checked against ``req_to_token_ptr.stride(0)``.
    Returns ``kv_indices_ptr``.
    """
    _check_stride("req_to_token_ptr_stride", req_to_token_ptr_stride, req_to_token_ptr, "req_to_token_ptr")
    if launch_grid:
        batch = launch_grid[0]
        req_pool_indices_ptr = _leading("req_pool_indices_ptr", req_pool_indices_ptr, batch)
        dcp_kernel_lens_ptr = _leading("dcp_kernel_lens_ptr", dcp_kernel_lens_ptr, batch)
        if kv_start_idx is not None:
            kv_start_idx = _leading("kv_start_idx", kv_start_idx, batch)
    _build_dcp_token_csr(req_to_token_ptr, req_pool_indices_ptr, dcp_kernel_lens_ptr, kv_indptr, kv_indices_ptr,
                         dcp_size=dcp_size, dcp_rank=dcp_rank, kv_start_idx=kv_start_idx, round_toward_zero=True)
    return kv_indices_ptr


def _create_mla_kv_page_table_for_dcp(launch_grid, req_to_token_ptr, req_pool_indices_ptr, local_seq_lens_ptr,
                                      block_kv_indices_ptr, req_to_token_stride, block_table_stride,
                                      PHYSICAL_PAGE_SIZE, DCP_SIZE, DCP_RANK, PAGES_PER_BLOCK):
    """One decode-context-parallel rank's MLA block table (TRT-LLM MLA / Tokenspeed, Aiter under DCP).

    With ``V = PHYSICAL_PAGE_SIZE * DCP_SIZE``: ``block_kv_indices_ptr[r, p] = req_to_token_ptr[
    req_pool_indices_ptr[r], DCP_RANK + p * V] / V`` (rounding toward zero) for the
    ``ceil(local_seq_lens_ptr[r] / PHYSICAL_PAGE_SIZE)`` pages of row ``r < grid[0]`` that the grid covers
    (``p < grid[1] * PAGES_PER_BLOCK``), at most the buffer's width (SGLang writes the pages past it into the
    next row) and its rows. Called directly: every row of the batch ``req_pool_indices_ptr.shape[0]``, every
    page of the width. Everything else is left untouched. Forwards to ``kvdispatch.create_dcp_page_table``.

    ``block_kv_indices_ptr``: int32 ``[rows, W]`` (``block_table_stride`` is checked against its row stride) or
    a flat contiguous int32 buffer read as rows of ``block_table_stride`` entries (``_as_rows``).
    ``req_to_token_stride`` is checked against ``req_to_token_ptr.stride(0)``. ``PHYSICAL_PAGE_SIZE``: an int
    in ``[1, 4096]``; ``DCP_SIZE`` in ``[1, 1024]``; ``DCP_RANK`` in ``[0, DCP_SIZE)``; ``PAGES_PER_BLOCK`` an int
    ``>= 1``. Returns ``block_kv_indices_ptr``.
    """
    _check_stride("req_to_token_stride", req_to_token_stride, req_to_token_ptr, "req_to_token_ptr")
    _check_int("PHYSICAL_PAGE_SIZE", PHYSICAL_PAGE_SIZE, 1, MAX_PAGE_SIZE)
    _check_int("DCP_SIZE", DCP_SIZE, 1, MAX_DCP_SIZE)
    _check_int("DCP_RANK", DCP_RANK, 0, DCP_SIZE - 1)
    _check_int("PAGES_PER_BLOCK", PAGES_PER_BLOCK, 1, _INT32_MAX)
    table = _as_rows(block_kv_indices_ptr, block_table_stride, "block_kv_indices_ptr", "block_table_stride")
    _int32_tensor("block_kv_indices_ptr", table, 2)
    rows, width = table.shape
    if launch_grid:
        rows = min(rows, launch_grid[0])
        width = min(width, launch_grid[1] * PAGES_PER_BLOCK)
    else:
        _tensor("req_pool_indices_ptr", req_pool_indices_ptr)
        rows = req_pool_indices_ptr.shape[0] if req_pool_indices_ptr.dim() == 1 else 0  # the public call names it
    if (rows, width) != table.shape:
        table = table[:rows, :width]
    _build_dcp_page_table(req_to_token_ptr, _leading("req_pool_indices_ptr", req_pool_indices_ptr, rows),
                          _leading("local_seq_lens_ptr", local_seq_lens_ptr, rows), table,
                          page_size=PHYSICAL_PAGE_SIZE, dcp_size=DCP_SIZE, dcp_rank=DCP_RANK, round_toward_zero=True)
    return block_kv_indices_ptr


def get_dcp_lens(lens, dcp_size, dcp_rank, start=None):
    """Tokens of each request that rank ``dcp_rank`` holds under token-interleaved DCP: the positions ``p`` of
    ``[start, start + lens)`` (``start`` None: 0) with ``p mod dcp_size == dcp_rank``, as SGLang's DCP layout
    helper gives them: ``lens`` itself when ``dcp_size == 1``; without ``start``, ``lens // dcp_size + (dcp_rank <
    lens % dcp_size)`` (negative for negative lengths); with it, the count clamped at 0, in the promoted dtype of
    ``start`` and ``lens``. PyTorch operations only (no host sync); exact for every int32/int64 value.
    ``kvdispatch.dcp_local_lengths`` is the same count, clamped at 0 in every case, and takes the same arguments
    (``lens``, ``start``: int32/int64 ``[B]``; ``dcp_size`` an int in ``[1, 1024]``, ``dcp_rank`` in ``[0,
    dcp_size)``), refusing anything else with the same errors.
    """
    dcp_lengths_device(lens, dcp_size, dcp_rank, start, None, "lens", "start")
    if dcp_size == 1:
        return lens
    counts = reference.dcp_owned_counts(lens, dcp_size, dcp_rank, start)
    if start is None:
        return counts.to(lens.dtype)
    return counts.clamp_(min=0).to(torch.result_type(start, lens))


create_triton_kv_indices_for_dcp_triton = _Launch(_create_triton_kv_indices_for_dcp,
                                                  "create_triton_kv_indices_for_dcp_triton")
create_mla_kv_page_table_for_dcp = _Launch(_create_mla_kv_page_table_for_dcp, "create_mla_kv_page_table_for_dcp")

__all__ = [
    "KV_INDICES_TOKEN_BLOCKS_MIN_WIDTH",
    "create_chunked_prefix_cache_kv_indices",
    "create_flashinfer_kv_indices_triton",
    "create_flashmla_kv_indices_triton",
    "draft_kv_indices_buffer_width",
    "draft_kv_indices_used_len",
    "generate_draft_decode_kv_indices",
    "get_num_kv_index_blocks_flashmla",
    "get_num_page_per_block_flashmla",
    "kv_indices_num_token_blocks",
    "kv_indices_token_blocks_for_copy",
    "create_triton_kv_indices_for_dcp_triton",
    "create_mla_kv_page_table_for_dcp",
    "get_dcp_lens",
    "update_trtllm_mla_graph_metadata",
    "build_kernel_page_table",
    "build_kv_read_table",
    "build_trtllm_mha_page_table",
    "create_trtllm_mha_kv_indices_triton",
    "get_num_mha_kv_index_blocks",
]
