"""A drop-in for the KV-index buffer sizing helpers of SGLang 0.5.23's ``sglang.srt.speculative.spec_utils``,
with which the draft backends size and slice ``generate_draft_decode_kv_indices``' buffers.
"""

from __future__ import annotations

from kvdispatch.compat.sglang._common import _EXTENT_MAX, _check_int

__all__ = ["draft_kv_indices_buffer_width", "draft_kv_indices_used_len"]

# SGLang's bound on a draft step row's width (its offsets are 32-bit there).
_DRAFT_ROW_WIDTH_LIMIT = 2**31


def draft_kv_indices_buffer_width(num_seqs: int, topk: int, max_context_len: int) -> int:
    """Entries per step row of the draft decode ``kv_indices`` buffer: ``num_seqs * topk * max_context_len``
    (every branch may hold a whole context; each an int ``>= 0``). Raises ``ValueError`` when that is ``2**31``
    or more."""
    for name, value in (("num_seqs", num_seqs), ("topk", topk), ("max_context_len", max_context_len)):
        _check_int(name, value, 0, _EXTENT_MAX)
    width = num_seqs * topk * max_context_len
    if width >= _DRAFT_ROW_WIDTH_LIMIT:
        raise ValueError(f"a draft kv_indices row of num_seqs * topk * max_context_len = {width} entries would "
                         f"overflow 32-bit offsets; reduce the batch, topk or context (limit {_DRAFT_ROW_WIDTH_LIMIT})")
    return width


def draft_kv_indices_used_len(seq_lens_sum: int, topk: int, bs: int, num_steps: int) -> int:
    """Entries of a draft step row used through ``num_steps`` steps: ``seq_lens_sum * topk + bs * num_steps``
    (``bs``: the branches, ``topk`` per request; each an int ``>= 0``)."""
    for name, value in (("seq_lens_sum", seq_lens_sum), ("topk", topk), ("bs", bs), ("num_steps", num_steps)):
        _check_int(name, value, 0, _EXTENT_MAX)
    return seq_lens_sum * topk + bs * num_steps
