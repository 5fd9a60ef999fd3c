"""A drop-in for SGLang's module ``sglang.kernels.ops.kvcache.kv_indices``, on kvdispatch.

``from kvdispatch.compat.sglang import X`` replaces ``from sglang.kernels.ops.kvcache.kv_indices import X``
for each of that module's public names, with the same parameter names, order and defaults, and likewise the
decode-context-parallel builders of SGLang's ``sglang.kernels.ops.attention.dcp_kernels`` and its DCP layout
helper ``get_dcp_lens``:

* the builders ``create_flashinfer_kv_indices_triton`` (token CSR), ``create_chunked_prefix_cache_kv_indices``
  (token CSR of one prefix chunk) and ``create_flashmla_kv_indices_triton`` (paged block table). Each is
  called with Triton's launch syntax ``builder[grid](...)`` or directly; the grid is accepted and ignored,
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

The row strides SGLang passes explicitly (``req_to_token_ptr_stride``, ``kv_indices_ptr_stride``) are
redundant, since tensors carry their strides: they are checked against the tensors, and a mismatch is a
``ValueError`` (in SGLang's kernel it would be a silent read or write in the wrong place). A 1-D
``kv_indices_ptr`` for the block table is read as rows of ``kv_indices_ptr_stride`` entries.
``TOKEN_BLOCK_PARALLEL`` is accepted and ignored (in SGLang, too, it changes how the copy is split, not
its result). ``ENTRY_PAGE_SIZE`` and ``token_mapping`` are passed on as ``entry_page_size=`` /
``token_mapping=``, and only when they differ from their defaults. Tensors take the dtypes the public API
takes.

Where SGLang's kernels would step outside a request's row (reading or writing a neighbouring row, or
past the tensor), the result is kvdispatch's bounded one instead: a block-table row stops at the buffer's width (SGLang writes the pages
past it into the next row), a row stops at the token table's last column or at a negative position
(SGLang reads the neighbouring row), nothing is written outside ``kv_indices`` whatever ``kv_indptr``
says, and a pool index outside the table gives an empty row. Elsewhere the results are SGLang's (the
block table divides a negative slot id rounding toward zero, as SGLang's kernel does: slot -65 at page
size 64 gives page -1), with one difference: lengths and start positions are exact integers, where
SGLang's kernels keep their low 32 bits (an int64 start of ``2**32 + 5`` is position 5 there, past the
table here).
"""

from __future__ import annotations

import inspect

import torch

from .. import api, reference

# SGLang's page-table kernel gives each program 4096 tokens' worth of pages.
_TOKENS_PER_PAGE_PROGRAM = 4096
# Token-block sizing of SGLang's token-CSR launches: about 8192 tokens per program, about 512 programs.
_TOKENS_PER_TOKEN_BLOCK = 8192
_TOKEN_BLOCK_PROGRAMS = 512
# Rows narrower than this are copied by one program per request.
KV_INDICES_TOKEN_BLOCKS_MIN_WIDTH = 32768

# The two public builders, looked up at call time through these names (tests route them per backend).
_build_page_table = api.create_flashmla_kv_indices
_build_token_csr = api.create_flashinfer_kv_indices


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def get_num_page_per_block_flashmla(page_size: int = 64) -> int:
    """Pages per program of SGLang's page-table kernel: ``4096 // page_size``."""
    return _TOKENS_PER_PAGE_PROGRAM // page_size


def get_num_kv_index_blocks_flashmla(kv_indices_width: int, page_size: int) -> int:
    """Programs per row SGLang launches for a block table ``kv_indices_width`` pages wide:
    ``ceil(kv_indices_width / get_num_page_per_block_flashmla(page_size))``."""
    return _cdiv(kv_indices_width, get_num_page_per_block_flashmla(page_size))


def kv_indices_num_token_blocks(table_width: int, base_programs: int) -> int:
    """Token blocks per request for SGLang's token-block launches:
    ``max(1, min(ceil(table_width / 8192), 512 // max(1, base_programs)))``."""
    return max(1, min(_cdiv(table_width, _TOKENS_PER_TOKEN_BLOCK), _TOKEN_BLOCK_PROGRAMS // max(1, base_programs)))


def kv_indices_token_blocks_for_copy(table_width: int, base_programs: int) -> int:
    """1 for a token table narrower than ``KV_INDICES_TOKEN_BLOCKS_MIN_WIDTH``, else
    ``kv_indices_num_token_blocks(table_width, base_programs)``."""
    if table_width < KV_INDICES_TOKEN_BLOCKS_MIN_WIDTH:
        return 1
    return kv_indices_num_token_blocks(table_width, base_programs)


class _LaunchSyntax:
    """Wraps a builder so that ``builder[grid](...)`` (Triton launch syntax) also works; the grid is ignored."""

    def __init__(self, function, name):
        function.__name__ = function.__qualname__ = name
        self._function = function
        self.__doc__ = function.__doc__
        self.__name__ = name
        self.__wrapped__ = function

    def __call__(self, *args, **kwargs):
        return self._function(*args, **kwargs)

    def __getitem__(self, grid):
        return self._function

    def __repr__(self):
        return f"<kvdispatch.compat.sglang.{self.__name__}>"


def _check_stride(name, given, actual):
    if given is not None and int(given) != actual:
        raise ValueError(f"{name}={given} does not match the tensor's row stride {actual}; kvdispatch reads "
                         "strides from the tensors, so pass the tensor the stride belongs to")


def _as_rows(kv_indices, kv_indices_stride, name="kv_indices_ptr", stride_name="kv_indices_ptr_stride"):
    """A 2-D view of ``kv_indices``; a flat buffer is read as rows of ``kv_indices_stride`` entries (``name``,
    ``stride_name``: the parameters' names, for errors)."""
    if kv_indices.dim() == 1:
        if kv_indices_stride is None:
            raise ValueError(f"a 1-D {name} needs {stride_name} (the row width)")
        width = int(kv_indices_stride)
        if width <= 0:
            raise ValueError(f"{stride_name} must be positive, got {width}")
        return kv_indices.as_strided((kv_indices.shape[0] // width, width), (width, 1))
    _check_stride(stride_name, kv_indices_stride, kv_indices.stride(0))
    return kv_indices


def _create_flashinfer_kv_indices(req_to_token_ptr, req_pool_indices_ptr, page_kernel_lens_ptr, kv_indptr,
                                  kv_start_idx, kv_indices_ptr, req_to_token_ptr_stride, ENTRY_PAGE_SIZE=1,
                                  TOKEN_BLOCK_PARALLEL=False, token_mapping=None):
    """Token-level CSR indices (FlashInfer, Triton and Aiter attention, EAGLE verify / draft extend).

    ``kv_indices_ptr[kv_indptr[b] + j] = req_to_token_ptr[req_pool_indices_ptr[b], kv_start_idx[b] + j]``
    for ``j < page_kernel_lens_ptr[b]`` (``kv_start_idx`` None: 0). Only ``kv_indptr[b]`` is read, for
    ``b < B = req_pool_indices_ptr.shape[0]``; every other position of ``kv_indices_ptr`` is left untouched.

    With ``ENTRY_PAGE_SIZE = E > 1`` the table holds one entry per ``E`` tokens and token ``q`` is
    ``req_to_token_ptr[row, q // E] * E + q % E``; with ``token_mapping`` every non-negative id ``v``
    becomes ``token_mapping[v]`` (negative ids give -1). These two are forwarded to the public API's
    ``entry_page_size=`` / ``token_mapping=`` keywords. ``TOKEN_BLOCK_PARALLEL`` changes nothing.

    Shapes and dtypes as ``kvdispatch.create_flashinfer_kv_indices``; ``req_to_token_ptr_stride`` is checked
    against ``req_to_token_ptr.stride(0)``. Returns ``kv_indices_ptr``.
    """
    _check_stride("req_to_token_ptr_stride", req_to_token_ptr_stride, req_to_token_ptr.stride(0))
    if ENTRY_PAGE_SIZE != 1 or token_mapping is not None:
        _build_token_csr(req_to_token_ptr, req_pool_indices_ptr, page_kernel_lens_ptr, kv_indptr, kv_indices_ptr,
                         kv_start_idx=kv_start_idx, entry_page_size=ENTRY_PAGE_SIZE, token_mapping=token_mapping)
    else:
        _build_token_csr(req_to_token_ptr, req_pool_indices_ptr, page_kernel_lens_ptr, kv_indptr, kv_indices_ptr,
                         kv_start_idx=kv_start_idx)
    return kv_indices_ptr


def _create_chunked_prefix_cache_kv_indices(req_to_token_ptr, req_pool_indices_ptr, chunk_start_idx_ptr,
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
    _check_stride("req_to_token_ptr_stride", req_to_token_ptr_stride, req_to_token_ptr.stride(0))
    _build_token_csr(req_to_token_ptr, req_pool_indices_ptr, chunk_seq_lens_ptr, chunk_cu_seq_lens_ptr,
                     chunk_kv_indices_ptr, kv_start_idx=chunk_start_idx_ptr)
    return chunk_kv_indices_ptr


def _create_flashmla_kv_indices(req_to_token_ptr, req_pool_indices_ptr, page_kernel_lens_ptr, kv_start_idx,
                                kv_indices_ptr, req_to_token_ptr_stride, kv_indices_ptr_stride, PAGED_SIZE=64):
    """Paged block table (FlashMLA, CUTLASS MLA, TRT-LLM MLA, Aiter MLA).

    ``kv_indices_ptr[b, p] = req_to_token_ptr[req_pool_indices_ptr[b], kv_start_idx[b] + p * PAGED_SIZE]
    // PAGED_SIZE`` for the ``ceil(page_kernel_lens_ptr[b] / PAGED_SIZE)`` pages of request
    ``b < B = req_pool_indices_ptr.shape[0]``, at most the buffer's width (``kv_start_idx`` None: 0), the
    division rounding toward zero.
    Columns past a row's pages and rows ``>= B`` are left untouched.

    ``kv_indices_ptr``: int32 ``[>= B, W]`` (``kv_indices_ptr_stride`` is checked against its row stride)
    or a flat int32 buffer read as rows of ``kv_indices_ptr_stride`` entries. ``req_to_token_ptr_stride``
    is checked against ``req_to_token_ptr.stride(0)``. Returns ``kv_indices_ptr``.
    """
    _check_stride("req_to_token_ptr_stride", req_to_token_ptr_stride, req_to_token_ptr.stride(0))
    _build_page_table(req_to_token_ptr, req_pool_indices_ptr, page_kernel_lens_ptr,
                      _as_rows(kv_indices_ptr, kv_indices_ptr_stride), page_size=int(PAGED_SIZE),
                      kv_start_idx=kv_start_idx, round_toward_zero=True)
    return kv_indices_ptr


create_flashinfer_kv_indices_triton = _LaunchSyntax(_create_flashinfer_kv_indices,
                                                    "create_flashinfer_kv_indices_triton")
create_chunked_prefix_cache_kv_indices = _LaunchSyntax(_create_chunked_prefix_cache_kv_indices,
                                                       "create_chunked_prefix_cache_kv_indices")
create_flashmla_kv_indices_triton = _LaunchSyntax(_create_flashmla_kv_indices, "create_flashmla_kv_indices_triton")

# The decode-context-parallel builders, looked up at call time as the two above.
_build_dcp_token_csr = api.create_dcp_kv_indices
_build_dcp_page_table = api.create_dcp_page_table


class _LaunchWithGrid:
    """A builder that takes its batch (and covered width) from the grid, as SGLang's kernel does:
    ``builder[grid](...)`` calls ``launch(grid, ...)`` with the grid as a tuple (a callable grid is called, as
    Triton does, with the arguments by name); a direct call, ``launch(None, ...)``. Both have the signature of
    ``launch`` less its first parameter: SGLang's."""

    def __init__(self, launch, name):
        self._launch = launch
        self.__signature__ = inspect.Signature(list(inspect.signature(launch).parameters.values())[1:])
        self.__name__ = self.__qualname__ = name
        self.__doc__ = launch.__doc__

    def __call__(self, *args, **kwargs):
        return self._launch(None, *args, **kwargs)

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            dims = grid(dict(self.__signature__.bind(*args, **kwargs).arguments)) if callable(grid) else grid
            return self._launch(tuple(dims) if isinstance(dims, (tuple, list)) else (dims,), *args, **kwargs)

        launch.__signature__, launch.__name__, launch.__doc__ = self.__signature__, self.__name__, self.__doc__
        return launch

    def __repr__(self):
        return f"<kvdispatch.compat.sglang.{self.__name__}>"


def _first(tensor, count):
    """``tensor[:count]``, without a new view when it has exactly ``count`` entries."""
    return tensor if tensor.shape[0] == count else tensor[:count]


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
    _check_stride("req_to_token_ptr_stride", req_to_token_ptr_stride, req_to_token_ptr.stride(0))
    batch = int(launch_grid[0]) if launch_grid else req_pool_indices_ptr.shape[0]
    _build_dcp_token_csr(req_to_token_ptr, _first(req_pool_indices_ptr, batch), _first(dcp_kernel_lens_ptr, batch),
                         kv_indptr, kv_indices_ptr, dcp_size=int(dcp_size), dcp_rank=int(dcp_rank),
                         kv_start_idx=None if kv_start_idx is None else _first(kv_start_idx, batch),
                         round_toward_zero=True)
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
    a flat int32 buffer read as rows of ``block_table_stride`` entries. ``req_to_token_stride`` is checked
    against ``req_to_token_ptr.stride(0)``. Returns ``block_kv_indices_ptr``.
    """
    _check_stride("req_to_token_stride", req_to_token_stride, req_to_token_ptr.stride(0))
    table = _as_rows(block_kv_indices_ptr, block_table_stride, "block_kv_indices_ptr", "block_table_stride")
    rows, width = table.shape
    if launch_grid:
        rows = min(rows, int(launch_grid[0]))
        covered = (int(launch_grid[1]) if len(launch_grid) > 1 else 1) * int(PAGES_PER_BLOCK)
        width = min(width, covered)
    else:
        rows = req_pool_indices_ptr.shape[0]
    if (rows, width) != table.shape:
        table = table[:rows, :width]
    _build_dcp_page_table(req_to_token_ptr, _first(req_pool_indices_ptr, rows), _first(local_seq_lens_ptr, rows),
                          table, page_size=int(PHYSICAL_PAGE_SIZE), dcp_size=int(DCP_SIZE), dcp_rank=int(DCP_RANK),
                          round_toward_zero=True)
    return block_kv_indices_ptr


def get_dcp_lens(lens, dcp_size, dcp_rank, start=None):
    """Tokens of each request that rank ``dcp_rank`` holds under token-interleaved DCP: the positions ``p`` of
    ``[start, start + lens)`` (``start`` None: 0) with ``p mod dcp_size == dcp_rank``, as SGLang's DCP layout
    helper gives them: ``lens`` itself when ``dcp_size == 1``; without ``start``, ``lens // dcp_size + (dcp_rank <
    lens % dcp_size)`` (negative for negative lengths); with it, the count clamped at 0, in the promoted dtype of
    ``start`` and ``lens``. PyTorch operations only (no host sync); exact for every int32/int64 value.
    ``kvdispatch.dcp_local_lengths`` is the same count, clamped at 0 in every case.
    """
    if dcp_size == 1:
        return lens
    counts = reference.dcp_owned_counts(lens, dcp_size, dcp_rank, start)
    if start is None:
        return counts.to(lens.dtype)
    return counts.clamp_(min=0).to(torch.result_type(start, lens))


create_triton_kv_indices_for_dcp_triton = _LaunchWithGrid(_create_triton_kv_indices_for_dcp,
                                                          "create_triton_kv_indices_for_dcp_triton")
create_mla_kv_page_table_for_dcp = _LaunchWithGrid(_create_mla_kv_page_table_for_dcp,
                                                   "create_mla_kv_page_table_for_dcp")

__all__ = [
    "KV_INDICES_TOKEN_BLOCKS_MIN_WIDTH",
    "create_chunked_prefix_cache_kv_indices",
    "create_flashinfer_kv_indices_triton",
    "create_flashmla_kv_indices_triton",
    "get_num_kv_index_blocks_flashmla",
    "get_num_page_per_block_flashmla",
    "kv_indices_num_token_blocks",
    "kv_indices_token_blocks_for_copy",
    "create_triton_kv_indices_for_dcp_triton",
    "create_mla_kv_page_table_for_dcp",
    "get_dcp_lens",
]
