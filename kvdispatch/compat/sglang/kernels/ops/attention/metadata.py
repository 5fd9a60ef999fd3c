"""Drop-ins for SGLang 0.5.23's ``sglang.kernels.ops.attention.metadata``: the FlashAttention backend's metadata
builders, forwarding to kvdispatch's ops.
"""

from __future__ import annotations

__all__ = ["prepare_swa_spec_page_table_triton"]

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
