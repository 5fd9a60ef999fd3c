"""Drop-ins for SGLang 0.5.23's ``sglang.kernels.ops.attention.metadata``: the FlashAttention backend's metadata
builders, forwarding to kvdispatch's ops.
"""

from __future__ import annotations

import kvdispatch

__all__ = ["draft_extend_set_metadata", "normal_decode_set_metadata", "prepare_swa_spec_page_table_triton"]


def _check_power_of_two(page_size):
    if type(page_size) is not int or page_size <= 0 or page_size & (page_size - 1):
        raise ValueError(f"page_size must be a power of two, got {page_size!r}")


def normal_decode_set_metadata(cache_seqlens_int32, cu_seqlens_k, page_table, req_to_token, req_pool_indices,
                               max_seq_pages, seq_lens, seq_len_delta, page_size, swa_page_table=None,
                               full_to_swa_index_mapping=None, skip_page_table=False, full_v2p=None, swa_v2p=None,
                               zero_tail=False):
    """FlashAttention decode metadata in one launch (``kvdispatch.update_decode_metadata``), for the
    ``B = cache_seqlens_int32.shape[0]`` requests: ``cache_seqlens_int32 = seq_lens + seq_len_delta``,
    ``cu_seqlens_k[:B + 1]`` (a 0, then the running sums) and, unless ``skip_page_table``, the first
    ``max_seq_pages`` columns of ``page_table`` (through ``full_v2p`` when given) and ``swa_page_table`` (through
    ``full_to_swa_index_mapping``, slots, or ``swa_v2p``, pages: exactly one), cleared past each row's pages with
    ``zero_tail``. Returns None."""
    _check_power_of_two(page_size)
    if swa_page_table is not None and not skip_page_table and (full_to_swa_index_mapping is None) == (swa_v2p is None):
        raise ValueError("swa_page_table needs exactly one of full_to_swa_index_mapping (slots) and swa_v2p (pages)")
    batch = cache_seqlens_int32.shape[0]
    tables = {}
    if not skip_page_table:
        tables = dict(page_table=page_table[:, :max_seq_pages], full_v2p=full_v2p, zero_tail=zero_tail)
        if swa_page_table is not None:
            tables.update(swa_page_table=swa_page_table[:, :max_seq_pages], full_to_swa=full_to_swa_index_mapping,
                          swa_v2p=swa_v2p)
    kvdispatch.update_decode_metadata(req_to_token, req_pool_indices[:batch], seq_lens[:batch], cache_seqlens_int32,
                                      cu_seqlens_k[:batch + 1], page_size=page_size, seqlen_offset=seq_len_delta,
                                      **tables)


def draft_extend_set_metadata(cache_seqlens_int32, cu_seqlens_k, cu_seqlens_q, page_table, req_to_token,
                              req_pool_indices, seq_lens, extend_seq_lens, page_size, full_to_swa_index_mapping=None,
                              swa_page_table=None, out_cache_loc=None, swa_out_cache_loc=None):
    """Draft-extend metadata in one launch (``kvdispatch.update_decode_metadata``), for the ``B =
    cache_seqlens_int32.shape[0]`` requests: ``cache_seqlens_int32 = seq_lens``, ``cu_seqlens_k[:B + 1]`` and
    ``cu_seqlens_q[:B + 1]`` (of ``extend_seq_lens``), ``page_table`` and, with ``full_to_swa_index_mapping``,
    ``swa_page_table`` and ``swa_out_cache_loc = full_to_swa_index_mapping[out_cache_loc]``. Returns None."""
    _check_power_of_two(page_size)
    batch = cache_seqlens_int32.shape[0]
    swa = {}
    if full_to_swa_index_mapping is not None:
        if swa_page_table is None or out_cache_loc is None or swa_out_cache_loc is None:
            raise ValueError("full_to_swa_index_mapping needs swa_page_table, out_cache_loc and swa_out_cache_loc")
        if (swa_page_table.shape != page_table.shape or swa_page_table.stride() != page_table.stride()
                or swa_out_cache_loc.shape[0] != out_cache_loc.shape[0]):
            raise ValueError("swa_page_table must have page_table's shape and strides, swa_out_cache_loc "
                             "out_cache_loc's length")
        if out_cache_loc.shape[0] == 0 or out_cache_loc.shape[0] % max(batch, 1):
            raise ValueError(f"out_cache_loc must hold a positive multiple of the batch ({batch}) entries, "
                             f"got {out_cache_loc.shape[0]}")
        swa = dict(swa_page_table=swa_page_table, full_to_swa=full_to_swa_index_mapping, out_cache_loc=out_cache_loc,
                   swa_out_cache_loc=swa_out_cache_loc)
    kvdispatch.update_decode_metadata(req_to_token, req_pool_indices[:batch], seq_lens[:batch], cache_seqlens_int32,
                                      cu_seqlens_k[:batch + 1], page_size=page_size, page_table=page_table,
                                      cu_seqlens_q=cu_seqlens_q[:batch + 1], qlens=extend_seq_lens[:batch], **swa)

# -- prepare_swa_spec_page_table_triton (kvdispatch.create_spec_concat_page_table) ----------------------------

from kvdispatch._validate import _INT32_MAX, _tensor  # noqa: E402
from kvdispatch.compat.sglang import _common  # noqa: E402
from kvdispatch.compat.sglang._common import _cdiv, _check_int  # noqa: E402

_CONCAT_BLOCK_N = 256  # the columns per program of SGLang's launch: its grid covers the input widths rounded up


def prepare_swa_spec_page_table_triton(page_table_dst, page_table_a, page_table_b, seq_len_a, seq_len_b,
                                       speculative_num_draft_tokens):
    """Each draft token's SWA page-table row: its request's prefix row then its own expand row; returns None.

    Row ``m`` of ``page_table_dst`` (request ``m // speculative_num_draft_tokens``) gets
    ``page_table_a[m // D, :seq_len_a[m // D]]`` then ``page_table_b[m, :seq_len_b[m]]`` (0 past each table's
    width), up to the ``ceil((LA + LB) / 256) * 256`` columns SGLang's launch covers and the table's width
    (SGLang writes past it). Everything else is left untouched. SGLang's assert is a ValueError:
    ``seq_len_b.numel() == seq_len_a.numel() * speculative_num_draft_tokens``.
    """
    _check_int("speculative_num_draft_tokens", speculative_num_draft_tokens, 1, _INT32_MAX)
    for name, t in (("page_table_dst", page_table_dst), ("page_table_a", page_table_a),
                    ("page_table_b", page_table_b), ("seq_len_a", seq_len_a), ("seq_len_b", seq_len_b)):
        _tensor(name, t)
    if seq_len_b.numel() != seq_len_a.numel() * speculative_num_draft_tokens:
        raise ValueError(f"seq_len_b must have seq_len_a's {seq_len_a.numel()} entries times "
                         f"speculative_num_draft_tokens={speculative_num_draft_tokens}, got {seq_len_b.numel()}")
    covered = _cdiv(page_table_a.shape[-1] + page_table_b.shape[-1], _CONCAT_BLOCK_N) * _CONCAT_BLOCK_N
    out = page_table_dst[:, :covered] if page_table_dst.dim() == 2 else page_table_dst
    _common._build_spec_concat_page_table(page_table_a, page_table_b, seq_len_a, seq_len_b, out,
                                          draft_tokens=speculative_num_draft_tokens)
