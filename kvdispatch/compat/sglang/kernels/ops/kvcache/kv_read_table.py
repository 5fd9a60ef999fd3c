"""A drop-in for SGLang 0.5.23's ``sglang.kernels.ops.kvcache.kv_read_table``: the unified pool's KV read table
(the page table its ``KVIndexTranslator`` builds), forwarding to ``kvdispatch.create_translated_page_table``.
SGLang's asserts are ValueErrors here.
"""

from __future__ import annotations

import torch

from kvdispatch._validate import _INT32_MAX, _int32_tensor, _tensor, check_flag
from kvdispatch.compat.sglang import _common
from kvdispatch.compat.sglang._common import _check_int, _leading
from kvdispatch.grid import MAX_PAGE_SIZE

__all__ = ["build_kv_read_table"]


def build_kv_read_table(*, req_to_token, req_pool_indices, seq_lens, v2p, page_size, max_pages, out,
                        seq_len_delta=0, zero_tail=False):
    """The unified pool's KV read table: for ``b < bs = req_pool_indices.numel()`` and live columns ``c <
    min(ceil((seq_lens[b] + seq_len_delta) / page_size), max_pages)``, ``out[b, c] = max(v2p[page], 0)`` with
    ``page = req_to_token[req_pool_indices[b], c * page_size] // page_size`` (0 for a negative token). Exact,
    saturated at ``2**31 - 1``; a page past ``v2p`` gives 0. Every other element of ``out`` (dead columns,
    columns ``>= max_pages``, rows ``>= bs``) keeps its value; with ``zero_tail=True`` each row's columns past its
    live ones, up to ``max_pages``, are set to 0 in the same launch (``fill_value=0``).

    SGLang's asserts are ValueErrors: ``out`` int32, 2-D, at least ``(bs, max_pages)``, rows packed; ``(max_pages
    - 1) * page_size < req_to_token.shape[1]``. ``bs`` or ``max_pages`` 0: ``out`` untouched. Returns ``out``.
    """
    _tensor("req_pool_indices", req_pool_indices)
    _int32_tensor("req_to_token", req_to_token, 2)
    _check_int("page_size", page_size, 1, MAX_PAGE_SIZE)
    _check_int("max_pages", max_pages, 0, _INT32_MAX)
    check_flag("zero_tail", zero_tail)
    batch = req_pool_indices.numel()
    if not isinstance(out, torch.Tensor) or out.dtype != torch.int32 or out.dim() != 2:
        raise ValueError(f"out must be a 2-D int32 tensor, got {getattr(out, 'dtype', type(out).__name__)} "
                         f"{tuple(getattr(out, 'shape', ()))}")
    if out.shape[0] < batch or out.shape[1] < max_pages:
        raise ValueError(f"out must be at least ({batch}, {max_pages}) (bs, max_pages), got {tuple(out.shape)}")
    if out.stride(1) != 1:
        raise ValueError(f"out's rows must be packed (stride(1) == 1), got strides {out.stride()}")
    if not (max_pages - 1) * page_size < req_to_token.shape[1]:
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
    _common._build_translated_page_table(req_to_token, req_pool_indices, _leading("seq_lens", seq_lens, batch), v2p,
                                         out, page_size=page_size, max_pages=max_pages, seq_len_delta=seq_len_delta,
                                         fill_value=0 if zero_tail else None)
    return out
