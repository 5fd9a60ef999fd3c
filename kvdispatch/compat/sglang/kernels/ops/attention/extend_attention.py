"""A drop-in for SGLang 0.5.23's ``sglang.kernels.ops.attention.extend_attention.build_unified_kv_indices``: the
Triton backend's unified extend attention's KV CSR, forwarding to ``kvdispatch.create_merged_kv_indices``.
"""

from __future__ import annotations

import torch

from kvdispatch._validate import _INT32_MAX, _tensor
from kvdispatch.compat.sglang import _common
from kvdispatch.compat.sglang._common import _check_int, _leading

__all__ = ["build_unified_kv_indices"]


def build_unified_kv_indices(prefix_kv_indptr, prefix_kv_indices, extend_start_loc, extend_seq_lens, extend_kv_indices,
                             bs):
    """Merge the first ``bs`` rows of a prefix CSR and of an extend CSR into one; returns ``(unified_kv_indptr,
    unified_kv_indices, prefix_lens)``.

    As SGLang's: ``prefix_lens = prefix_kv_indptr[1:bs + 1] - prefix_kv_indptr[:bs]``; ``unified_kv_indptr``, int64
    ``[bs + 1]``, the prefix sums of ``prefix_lens + extend_seq_lens[:bs]`` from 0 (computed on the device, no
    host sync); ``unified_kv_indices``, a new uninitialised int64 ``[len(prefix_kv_indices) +
    len(extend_kv_indices)]`` holding each request's prefix entries then its ``extend_seq_lens[b]`` entries of
    ``extend_kv_indices`` from ``extend_start_loc[b]``, its tail past the last row left as allocated. A part
    outside its array ends there (SGLang reads past it). ``prefix_kv_indptr`` needs ``bs + 1`` entries,
    ``extend_start_loc`` and ``extend_seq_lens`` ``bs``.
    """
    _check_int("bs", bs, 0, _INT32_MAX)
    _tensor("prefix_kv_indptr", prefix_kv_indptr)
    bounds = _leading("prefix_kv_indptr", prefix_kv_indptr, bs + 1)
    prefix_lens = bounds[1:] - bounds[:-1]
    device = prefix_kv_indptr.device
    unified_kv_indptr = torch.zeros(bs + 1, dtype=torch.int64, device=device)
    _tensor("prefix_kv_indices", prefix_kv_indices)
    _tensor("extend_kv_indices", extend_kv_indices)
    unified_kv_indices = torch.empty(len(prefix_kv_indices) + len(extend_kv_indices), dtype=torch.int64,
                                     device=device)
    _common._build_merged_token_csr(bounds, prefix_kv_indices, _leading("extend_start_loc", extend_start_loc, bs),
                                    _leading("extend_seq_lens", extend_seq_lens, bs), extend_kv_indices,
                                    unified_kv_indptr, unified_kv_indices)
    return unified_kv_indptr, unified_kv_indices, prefix_lens
