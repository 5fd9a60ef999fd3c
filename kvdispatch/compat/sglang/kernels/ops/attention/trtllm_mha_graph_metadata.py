"""A drop-in for SGLang 0.5.23's ``sglang.kernels.ops.attention.trtllm_mha_graph_metadata``: the TRT-LLM MHA
backend's per-replay metadata in one launch, forwarding to ``kvdispatch.update_decode_metadata``.

As in SGLang, ``cu_seqlens_k[0]`` and ``cu_seqlens_q[0]`` are left untouched, only the first ``max_seq_pages``
columns of the tables are written, and the SWA table holds -1 where the mapping does. SGLang's asserts are
ValueErrors here.
"""

from __future__ import annotations

import kvdispatch
from kvdispatch.compat.sglang._common import _EXTENT_MAX, _check_int
from kvdispatch._validate import check_flag

__all__ = ["update_trtllm_mha_graph_metadata"]

Q_MODE_NONE = 0  # cu_seqlens_q is preset (decode / target-verify)
Q_MODE_CUMSUM = 1  # cu_seqlens_q[1:] = cumsum(qlens)
Q_MODE_STRIDED = 2  # cu_seqlens_q[1:] = arange(1, bs + 1) * q_stride


def update_trtllm_mha_graph_metadata(*, req_pool_indices, seq_lens, req_to_token, cache_seqlens, cu_seqlens_k,
                                     page_table, bs: int, seqlen_offset: int, max_seq_pages: int, page_size: int,
                                     swa_mapping=None, swa_page_table=None, out_cache_loc=None,
                                     swa_out_cache_loc=None, cu_seqlens_q=None, qlens=None, q_stride: int = 0,
                                     q_mode: int = Q_MODE_NONE, skip_page_table: bool = False):
    """For the first ``bs`` requests: ``cache_seqlens = seq_lens + seqlen_offset`` (int32),
    ``cu_seqlens_k[1:bs + 1]`` its running sums, ``cu_seqlens_q[1:bs + 1]`` per ``q_mode`` (``Q_MODE_CUMSUM``:
    the running sums of ``qlens``; ``Q_MODE_STRIDED``: ``(b + 1) * q_stride``), the page table's first
    ``max_seq_pages`` columns (unless ``skip_page_table``; ``page_table`` may then be None) with its SWA twin
    through ``swa_mapping`` (-1 for a negative entry), and ``swa_out_cache_loc`` = ``swa_mapping[out_cache_loc]``,
    zero padded past ``out_cache_loc``. ``bs == 0`` writes nothing. Returns None."""
    _check_int("bs", bs, 0, _EXTENT_MAX)
    _check_int("max_seq_pages", max_seq_pages, 0, _EXTENT_MAX)
    _check_int("q_mode", q_mode, 0, 2)
    check_flag("skip_page_table", skip_page_table)
    if bs == 0:
        return
    for name, t in (("req_pool_indices", req_pool_indices), ("seq_lens", seq_lens), ("cache_seqlens", cache_seqlens),
                    ("cu_seqlens_k", cu_seqlens_k)):
        if t.shape[0] < bs + (name == "cu_seqlens_k"):
            raise ValueError(f"{name} has {t.shape[0]} entries, fewer than bs = {bs} needs")
    if swa_page_table is not None and not skip_page_table or swa_out_cache_loc is not None:
        if swa_mapping is None:
            raise ValueError("swa_page_table and swa_out_cache_loc need swa_mapping")
    q = {}
    if q_mode != Q_MODE_NONE:
        if cu_seqlens_q is None or q_mode == Q_MODE_CUMSUM and qlens is None:
            raise ValueError(f"q_mode {q_mode} needs cu_seqlens_q{' and qlens' if q_mode == Q_MODE_CUMSUM else ''}")
        q = dict(cu_seqlens_q=cu_seqlens_q[1:bs + 1])
        q.update(qlens=qlens[:bs]) if q_mode == Q_MODE_CUMSUM else q.update(q_stride=q_stride)
    tables = {}
    if not skip_page_table:
        tables = dict(page_table=page_table[:, :max_seq_pages])
        if swa_page_table is not None:
            tables.update(swa_page_table=swa_page_table[:, :max_seq_pages])
    uses_mapping = "swa_page_table" in tables or swa_out_cache_loc is not None
    kvdispatch.update_decode_metadata(
        req_to_token, req_pool_indices[:bs], seq_lens[:bs], cache_seqlens, cu_seqlens_k[1:bs + 1],
        page_size=page_size, seqlen_offset=seqlen_offset, full_to_swa=swa_mapping if uses_mapping else None,
        out_cache_loc=out_cache_loc if swa_out_cache_loc is not None else None, swa_out_cache_loc=swa_out_cache_loc,
        **tables, **q)
