"""Host-side data checks for ``KVDISPATCH_DEBUG=1`` (or ``true``, ``yes``, ``on``).

Slow on purpose: they copy the index vectors to the host (a device sync) and raise ``ValueError`` naming
the request and the value that the kernels would otherwise silently turn into an empty or short row.
Never use them inside CUDA-graph capture.
"""

from __future__ import annotations

from ._env import flag

from .reference import BOUND


def _from_env() -> bool:
    return flag("KVDISPATCH_DEBUG")


# Read at import and by ``kvdispatch.reset()``, not per call: an environment lookup costs more host time
# than a whole argument check.
ENABLED = _from_env()


def refresh() -> None:
    global ENABLED
    ENABLED = _from_env()


def enabled() -> bool:
    return ENABLED


def _first_bad(mask):
    bad = mask.nonzero()
    return None if bad.numel() == 0 else int(bad[0, 0])


def _check_rows(req_to_token, req_pool_indices, seq_lens, kv_start_idx, lengths_offset):
    """Raise on the first request whose row reads outside the table; else return its lengths, int64 ``[B]``
    on the host, clamped like ``kvdispatch.reference`` so that no comparison here wraps (messages show the
    exact values)."""
    rows, cols = req_to_token.shape
    pool = req_pool_indices.long().cpu()
    requested = seq_lens.long().cpu()
    lengths = requested.clamp(-BOUND, BOUND) + lengths_offset
    start = kv_start_idx.long().cpu() if kv_start_idx is not None else None

    def exact_length(b):
        return int(requested[b]) + lengths_offset

    b = _first_bad((pool < 0) | (pool >= rows))
    if b is not None:
        raise ValueError(f"request {b}: req_pool_indices[{b}] = {int(pool[b])} is outside [0, {rows})")
    b = _first_bad(lengths < 0)
    if b is not None:
        raise ValueError(f"request {b}: length {exact_length(b)} (seq_lens + seqlen_offset) is negative")
    first = start.clamp(-BOUND, BOUND) if start is not None else lengths * 0
    b = _first_bad((lengths > 0) & ((first < 0) | (first >= cols)))
    if b is not None:
        raise ValueError(f"request {b}: kv_start_idx[{b}] = {int(start[b])} is outside the table's [0, {cols})")
    b = _first_bad((lengths > 0) & (lengths > cols - first))  # an empty row reads nothing
    if b is not None:
        raise ValueError(f"request {b}: start {int(first[b])} + length {exact_length(b)} runs past the "
                         f"table's {cols} columns")
    return lengths


def check_page_table_data(req_to_token, req_pool_indices, seq_lens, kv_start_idx, seqlen_offset):
    _check_rows(req_to_token, req_pool_indices, seq_lens, kv_start_idx, seqlen_offset)


def check_token_csr_data(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, kv_start_idx):
    lengths = _check_rows(req_to_token, req_pool_indices, seq_lens, kv_start_idx, 0)
    begin = kv_indptr[: lengths.shape[0]].long().cpu()
    clamped = begin.clamp(-BOUND, BOUND)
    total = out.shape[0]
    b = _first_bad((lengths > 0) & ((clamped < 0) | (lengths > total - clamped)))  # an empty row writes nothing
    if b is not None:
        raise ValueError(f"request {b}: kv_indptr[{b}] = {int(begin[b])} with length {int(seq_lens[b])} "
                         f"writes outside out's {total} entries")
