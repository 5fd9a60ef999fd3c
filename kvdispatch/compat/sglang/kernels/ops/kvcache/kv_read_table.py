"""A drop-in for SGLang 0.5.23's ``sglang.kernels.ops.kvcache.kv_read_table``: the unified pool's KV read table
(the page table its ``KVIndexTranslator`` builds), forwarding to ``kvdispatch.create_translated_page_table``, and
its packed token stream, forwarding to ``kvdispatch.create_flashinfer_kv_indices`` with ``v2p``. SGLang's asserts
are ValueErrors here.
"""

from __future__ import annotations

import torch

from kvdispatch._validate import _INT32_MAX, _int32_tensor, _tensor, check_flag
from kvdispatch.compat.sglang import _common
from kvdispatch.compat.sglang._common import _check_int, _leading
from kvdispatch.grid import MAX_PAGE_SIZE

__all__ = ["build_kv_read_table", "build_kv_read_table_packed"]


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


def build_kv_read_table_packed(*, req_to_token, req_pool_indices, seq_lens, v2p, indptr, page_size, max_tokens, out,
                               kv_start_idx=None):
    """The unified pool's translated token stream as a CSR: for ``b < bs = req_pool_indices.numel()`` and ``j <
    seq_lens[b]``, at position ``q = kv_start_idx[b] + j`` (``j`` without a start), ``out[indptr[b] + j] =
    max(v2p[page], 0) * page_size + q % page_size`` with ``page`` the virtual page of the slot opening ``q``'s
    page, ``req_to_token[req_pool_indices[b], q - q % page_size] // page_size`` (0 for a negative slot; entry 0 for
    a page past ``v2p``), in ``out``'s dtype (int32: the low 32 bits). Every other element of ``out`` keeps its
    value; a row ends at its table row's end and at ``out``'s end (``kvdispatch.create_flashinfer_kv_indices``).

    SGLang's asserts are ValueErrors: ``out`` int32 or int64, 1-D, at least ``max_tokens`` entries; ``indptr``
    more than ``bs`` entries. ``bs`` or ``max_tokens`` 0: ``out`` untouched. Returns ``out``.
    """
    _tensor("req_pool_indices", req_pool_indices)
    _tensor("indptr", indptr)
    _check_int("page_size", page_size, 1, MAX_PAGE_SIZE)
    _check_int("max_tokens", max_tokens, 0, 2**63 - 1)
    batch = req_pool_indices.numel()
    if not isinstance(out, torch.Tensor) or out.dtype not in (torch.int32, torch.int64) or out.dim() != 1:
        raise ValueError(f"out must be a 1-D int32 or int64 tensor, got {getattr(out, 'dtype', type(out).__name__)} "
                         f"{tuple(getattr(out, 'shape', ()))}")
    if out.numel() < max_tokens:
        raise ValueError(f"out holds {out.numel()} entries, fewer than max_tokens={max_tokens}")
    if indptr.numel() <= batch:
        raise ValueError(f"indptr holds {indptr.numel()} entries, need {batch + 1} (bs + 1)")
    req_pool_indices = _flat("req_pool_indices", req_pool_indices)
    if batch == 0 or max_tokens == 0:
        return out
    start = None if kv_start_idx is None else _leading("kv_start_idx", kv_start_idx, batch)
    _common._build_token_csr(req_to_token, req_pool_indices, _leading("seq_lens", seq_lens, batch),
                             _leading("indptr", _flat("indptr", indptr), batch), out, kv_start_idx=start, v2p=v2p,
                             page_size=page_size)
    return out


def _flat(name, t):
    """``t`` as a 1-D view of its entries in order (SGLang reads them so), or a ValueError naming it."""
    if t.dim() == 1:
        return t
    try:
        return t.view(-1)
    except RuntimeError:
        raise ValueError(f"{name} (shape {tuple(t.shape)}, strides {t.stride()}) cannot be read as a 1-D view of its "
                         f"entries; pass it 1-D") from None
