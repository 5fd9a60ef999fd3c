"""SGLang compatibility: its grid-sizing helpers with identical values, and drop-ins for its index builders.

SGLang's Triton page-table kernel gives each program ``4096 // page_size`` pages, and engines size
their padded ``kv_indices`` buffers with these two functions. kvdispatch's own kernels size their grid
with ``kvdispatch.grid`` and accept any buffer width; these exist so engine code keeps its numbers.

The builders below take SGLang's argument order and forward to the public API
(``kvdispatch.create_flashmla_kv_indices`` / ``kvdispatch.create_flashinfer_kv_indices``). Each can be
called directly or with SGLang's launch syntax ``builder[grid](...)``: the grid is ignored, because
kvdispatch sizes its own launch (from the buffer width, never from the data, so a captured CUDA graph
stays valid). The row strides SGLang passes explicitly are redundant, since tensors carry their strides:
they are accepted and checked against the tensors (a mismatch is a ``ValueError``, as it would be a
silent out-of-bounds access in the original kernel).

Differences from the originals, all on the safe side: a row never writes past the buffer's width
(``kv_indices.shape[1]``); columns past a row's pages are untouched (SGLang's behaviour) unless
``fill_value`` is given; bad data (pool index out of range, length ``<= 0``) gives an empty row.
"""

from __future__ import annotations

import math

from .. import api

_SGLANG_TOKENS_PER_BLOCK = 4096
# TRT-LLM MLA (flashinfer's trtllm-gen decode) wants the block-table width, in pages, to be a
# multiple of 128 / page_size.
_TRTLLM_BLOCK_TOKENS = 128

# The two public builders, looked up at call time through these names (tests route them per backend).
_build_page_table = api.create_flashmla_kv_indices
_build_token_csr = api.create_flashinfer_kv_indices


def get_num_page_per_block_flashmla(page_size: int = 64) -> int:
    """Pages per program of SGLang's page-table kernel: ``4096 // page_size``."""
    return _SGLANG_TOKENS_PER_BLOCK // page_size


def get_num_kv_index_blocks_flashmla(kv_indices_width: int, page_size: int) -> int:
    """Programs per row SGLang launches for a ``kv_indices`` buffer ``kv_indices_width`` pages wide."""
    pages = get_num_page_per_block_flashmla(page_size)
    return -(-kv_indices_width // pages)


def padded_kv_indices_width(max_seq_len: int, page_size: int, pages_per_program: int | None = None,
                            block_tokens: int = _TRTLLM_BLOCK_TOKENS) -> int:
    """Block-table width (pages) for ``max_seq_len`` tokens, padded the way SGLang's TRT-LLM MLA backend pads.

    ``ceil(max_seq_len / page_size)`` rounded up to a multiple of
    ``lcm(block_tokens // page_size, pages_per_program)``; ``pages_per_program`` defaults to SGLang's
    ``get_num_page_per_block_flashmla(page_size)``. Use it for the CUDA-graph buffer (``max_seq_len`` =
    the model's context length) and for eager decode (the batch's longest sequence).

    Adopt: ``max_blocks = padded_kv_indices_width(max_seq_len, self.page_size)`` replaces the padding helper.
    """
    if not 1 <= page_size <= block_tokens or block_tokens % page_size:
        raise ValueError(f"page_size must divide {block_tokens}, got {page_size}")
    if pages_per_program is None:
        pages_per_program = get_num_page_per_block_flashmla(page_size)
    multiple = math.lcm(block_tokens // page_size, max(pages_per_program, 1))
    blocks = -(-max(max_seq_len, 0) // page_size)
    return -(-blocks // multiple) * multiple


class _LaunchSyntax:
    """Wraps a builder so that ``builder[grid](...)`` (Triton launch syntax) also works; the grid is ignored."""

    def __init__(self, function):
        self._function = function
        self.__doc__ = function.__doc__
        self.__name__ = function.__name__
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


def _page_size(page_size, paged_size_keyword):
    if paged_size_keyword is not None:
        if page_size is not None and page_size != paged_size_keyword:
            raise ValueError(f"page_size={page_size} and PAGED_SIZE={paged_size_keyword} disagree")
        return int(paged_size_keyword)
    return 64 if page_size is None else int(page_size)  # SGLang's kernel defaults to 64


def _as_rows(kv_indices, kv_indices_stride):
    """A 2-D view of ``kv_indices``; a flat buffer is read as rows of ``kv_indices_stride`` entries."""
    if kv_indices.dim() == 1:
        if kv_indices_stride is None:
            raise ValueError("a 1-D kv_indices needs kv_indices_stride (the row width)")
        width = int(kv_indices_stride)
        if width <= 0:
            raise ValueError(f"kv_indices_stride must be positive, got {width}")
        return kv_indices.as_strided((kv_indices.shape[0] // width, width), (width, 1))
    _check_stride("kv_indices_stride", kv_indices_stride, kv_indices.stride(0))
    return kv_indices


def _flashmla_kv_indices(req_to_token, req_pool_indices, page_kernel_lens, kv_start_idx, kv_indices,
                         req_to_token_stride=None, kv_indices_stride=None, page_size=None, *, PAGED_SIZE=None,
                         seqlen_offset=0, seq_lens_out=None, fill_value=None, backend=None):
    """Paged block table with SGLang's ``create_flashmla_kv_indices_triton`` argument order.

    ``kv_indices[b, p] = req_to_token[req_pool_indices[b], kv_start_idx[b] + p * page_size] // page_size``
    for the ``ceil(page_kernel_lens[b] / page_size)`` pages of request ``b`` (FlashMLA, CUTLASS MLA,
    TRT-LLM MLA, Aiter MLA). ``req_to_token_stride`` / ``kv_indices_stride`` are checked against the
    tensors; a 1-D ``kv_indices`` is read as rows of ``kv_indices_stride``. The page size comes
    positionally, as ``page_size=`` or as the kernel's ``PAGED_SIZE=`` keyword (default 64, as in SGLang).
    Extras (keyword only): ``seqlen_offset``, ``seq_lens_out``, ``fill_value``, ``backend`` as in
    ``kvdispatch.create_flashmla_kv_indices``.

    Adopt (one line, the import; every ``create_flashmla_kv_indices_triton[grid](...)`` call site stays)::

        from kvdispatch.compat.sglang import flashmla_kv_indices as create_flashmla_kv_indices_triton

    Returns ``kv_indices``.
    """
    _check_stride("req_to_token_stride", req_to_token_stride, req_to_token.stride(0))
    out = _as_rows(kv_indices, kv_indices_stride)
    _build_page_table(req_to_token, req_pool_indices, page_kernel_lens, out,
                      page_size=_page_size(page_size, PAGED_SIZE), kv_start_idx=kv_start_idx,
                      seqlen_offset=seqlen_offset, seq_lens_out=seq_lens_out, fill_value=fill_value,
                      backend=backend)
    return kv_indices


# SGLang's token-CSR kernel has grown compile-time options; those whose value changes nothing here are
# accepted (a 2-D grid is always used; ids are token ids; no remapping), any other value is refused.
_CSR_NEUTRAL_OPTIONS = {"TOKEN_BLOCK_PARALLEL": (True, False), "ENTRY_PAGE_SIZE": (1,), "token_mapping": (None,)}


def _flashinfer_kv_indices(req_to_token, req_pool_indices, page_kernel_lens, kv_indptr, kv_start_idx, kv_indices,
                           req_to_token_stride=None, *, backend=None, **kernel_options):
    """Token-level CSR indices with SGLang's ``create_flashinfer_kv_indices_triton`` argument order.

    ``kv_indices[kv_indptr[b] + j] = req_to_token[req_pool_indices[b], kv_start_idx[b] + j]`` for
    ``j < page_kernel_lens[b]`` (FlashInfer, Aiter non-MLA, the MLA backends' prefill/verify paths).
    ``req_to_token_stride`` is checked against the tensor. No write lands outside ``kv_indices``.

    Adopt (one line, the import; the ``create_flashinfer_kv_indices_triton[grid](...)`` call sites stay)::

        from kvdispatch.compat.sglang import flashinfer_kv_indices as create_flashinfer_kv_indices_triton

    Returns ``kv_indices``.
    """
    for name, value in kernel_options.items():
        if name not in _CSR_NEUTRAL_OPTIONS:
            raise TypeError(f"unexpected keyword argument {name!r}")
        if value not in _CSR_NEUTRAL_OPTIONS[name]:
            raise NotImplementedError(f"{name}={value!r} is not supported by kvdispatch's token-CSR builder "
                                      f"(supported: {_CSR_NEUTRAL_OPTIONS[name]})")
    _check_stride("req_to_token_stride", req_to_token_stride, req_to_token.stride(0))
    _build_token_csr(req_to_token, req_pool_indices, page_kernel_lens, kv_indptr, kv_indices,
                     kv_start_idx=kv_start_idx, backend=backend)
    return kv_indices


def target_verify_kv_indices(req_to_token, req_pool_indices, seq_lens, num_draft_tokens, kv_indices, seq_lens_k,
                             page_size, *, fill_value=None, backend=None):
    """Target-verify (speculative decoding) block table and key lengths in one launch.

    Builds the block table for ``seq_lens + num_draft_tokens`` tokens per request and writes those lengths
    into ``seq_lens_k`` (int32, ``>= B`` entries) in the same launch: SGLang's graph-metadata pattern
    (lengths plus draft tokens, copied into the persistent ``seq_lens_k`` buffer, then the page-table kernel)
    without the temporary ``seq_lens + num_draft_tokens`` tensor and the extra copy kernel.
    ``kv_indices`` is the (persistent) ``[>= B, W]`` buffer; capturable in a CUDA graph.

    Adopt (one call replaces the add, the ``seq_lens_k.copy_(...)`` and the kernel launch)::

        target_verify_kv_indices(self.req_to_token, req_pool_indices[:bs], seq_lens[:bs], self.num_draft_tokens, metadata.block_kv_indices, metadata.seq_lens_k, self.page_size)

    Returns ``kv_indices``.
    """
    return _build_page_table(req_to_token, req_pool_indices, seq_lens, kv_indices, page_size=page_size,
                             seqlen_offset=int(num_draft_tokens), seq_lens_out=seq_lens_k,
                             fill_value=fill_value, backend=backend)


flashmla_kv_indices = _LaunchSyntax(_flashmla_kv_indices)
flashmla_kv_indices.__name__ = "flashmla_kv_indices"
flashinfer_kv_indices = _LaunchSyntax(_flashinfer_kv_indices)
flashinfer_kv_indices.__name__ = "flashinfer_kv_indices"

__all__ = [
    "flashinfer_kv_indices",
    "flashmla_kv_indices",
    "get_num_kv_index_blocks_flashmla",
    "get_num_page_per_block_flashmla",
    "padded_kv_indices_width",
    "target_verify_kv_indices",
]
