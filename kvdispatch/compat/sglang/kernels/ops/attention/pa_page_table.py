"""A drop-in for SGLang 0.5.23's ``sglang.kernels.ops.attention.pa_page_table``: the FlashAttention backend's
prefill-aware sliding-window token table, forwarding to ``kvdispatch.create_prefill_aware_swa_table``.
"""

from __future__ import annotations

import torch

from kvdispatch._validate import _INT32_MAX
from kvdispatch.compat.sglang import _common
from kvdispatch.compat.sglang._common import _EXTENT_MAX, _check_int, _leading

__all__ = ["_build_pa_page_table"]


def _build_pa_page_table(req_to_token, req_pool_indices, seq_lens, prefill_lens, window_size, bs, pa_max_len, device,
                         dst_page_table=None, dst_kv_lens=None):
    """Build the prefill-aware token table of the first ``bs`` requests; returns ``(page_table, kv_lens)``.

    Row ``b`` holds ``req_to_token[req_pool_indices[b]]`` at positions ``[0, f)`` then ``[max(f, s -
    window_size), s)`` (``s = seq_lens[b]``, ``f = prefill_lens[req_pool_indices[b]]``: ``prefill_lens`` is
    indexed by pool index), ``kv_lens[b] = min(s, f + window_size)``; a row ends at the table's width (SGLang
    writes a longer one on into the next row). Nothing is built unless ``bs > 0`` and ``pa_max_len > 0``.

    As SGLang's: ``dst_page_table`` None allocates int32 zeros ``[bs, pa_max_len]`` on ``device``,
    ``dst_kv_lens`` None an uninitialised int32 ``[bs]`` (left so when nothing is built); given, they are written
    in place (CUDA-graph replay): only the rows' tokens and ``kv_lens[:bs]``, everything else untouched.
    ``req_pool_indices`` and ``seq_lens`` need at least ``bs`` entries.
    """
    _check_int("bs", bs, 0, _INT32_MAX)
    _check_int("pa_max_len", pa_max_len, -_EXTENT_MAX, _EXTENT_MAX)
    _check_int("window_size", window_size, 0, _INT32_MAX)
    if dst_page_table is None:
        dst_page_table = torch.zeros(bs, max(pa_max_len, 0), dtype=torch.int32, device=device)
    if dst_kv_lens is None:
        dst_kv_lens = torch.empty(bs, dtype=torch.int32, device=device)
    if bs > 0 and pa_max_len > 0:
        pool = _leading("req_pool_indices", req_pool_indices, bs)
        lens = _leading("seq_lens", seq_lens, bs)
        _common._build_pa_swa_table(req_to_token, pool, lens, prefill_lens, dst_page_table, dst_kv_lens,
                                    window_size=window_size)
    return dst_page_table, dst_kv_lens
