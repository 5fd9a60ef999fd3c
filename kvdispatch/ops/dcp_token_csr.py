"""One decode-context-parallel rank's token-level CSR indices: the op ``dcp_token_csr``.

Its argument checks, its data checks (``KVDISPATCH_DEBUG``), its torch reference (the torch backend and
the semantics every backend is tested against) and its declaration (``kvdispatch.op.declare``), which makes
the public function, the custom op and the dispatch entry.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._debug import _check_csr_rows, _check_rows
from .._validate import _check_dcp, dcp_lengths_device
from ..reference import INT32_MAX, BOUND, _clamped_pool, _csr_reads, _divide, _store, dcp_owned_counts
from .token_csr import check_arguments as token_csr_check_arguments
from ..op import declare

__all__ = ["create_dcp_kv_indices", "dcp_local_lengths"]


def check_arguments(req_to_token, req_pool_indices, local_seq_lens, kv_indptr, out, kv_start_idx, dcp_size,
                    dcp_rank, round_toward_zero=False, memory=True):
    """Validate ``create_dcp_kv_indices`` arguments (the token CSR's, then the DCP integers); returns the device
    (``memory``: as for ``check_page_table_args``)."""
    device = token_csr_check_arguments(req_to_token, req_pool_indices, local_seq_lens, kv_indptr, out, kv_start_idx,
                                  memory=memory, lens_name="local_seq_lens")
    _check_dcp(dcp_size, dcp_rank, round_toward_zero)
    return device


def check_data(req_to_token, req_pool_indices, local_seq_lens, kv_indptr, out, dcp_size, dcp_rank,
               kv_start_idx=None, round_toward_zero=False):
    """``create_dcp_kv_indices``: every pool index in ``[0, R)``; ``local_seq_lens >= 0`` (0: a request with no
    token on this rank); a non-empty row's ``kv_start_idx`` inside the table and its last position
    ``first_b + (L_b - 1) * dcp_size`` before column ``C``; each non-empty row writes inside ``out`` and no
    two of them share an entry. Slot values are not checked (any int32 divides). Takes the arguments of its
    validator; ``round_toward_zero`` is not read."""
    lengths = _check_rows(req_to_token, req_pool_indices, local_seq_lens, kv_start_idx, 0, "local_seq_lens",
                          dcp_size, dcp_rank)
    _check_csr_rows(kv_indptr, lengths, local_seq_lens.cpu(), out)


def reference(req_to_token, req_pool_indices, local_seq_lens, kv_indptr, out, dcp_size, dcp_rank,
              kv_start_idx=None, round_toward_zero=False, pdl=False):
    """Token-level CSR indices of one decode-context-parallel rank; semantics of
    ``kvdispatch.create_dcp_kv_indices``.

    ``out``: int32 or int64 ``[N]``. Request ``b`` reads its table row at positions ``first_b + j * D``
    (``D = dcp_size``), where ``first_b`` is the first position ``>= start_b`` with ``first_b mod D ==
    dcp_rank``; it has ``count_b = min(local_seq_lens[b], ceil((C - first_b) / D))`` tokens (0 when that is
    ``<= 0``, when ``first_b`` lies outside ``[0, C)`` or the pool index outside ``[0, R)``) and writes
    ``out[kv_indptr[b] + j] = req_to_token[req_pool_indices[b], first_b + j * D] // D`` for those whose
    target lies in ``[0, N)`` (floor division; truncation with ``round_toward_zero``), in ``out``'s dtype.
    Untouched: every position no request writes. Overlapping rows (each overlapped entry holds one covering
    request's value, every other entry is exact) as in ``build_token_indices``.
    """
    batch, total = req_pool_indices.shape[0], out.shape[0]
    cols = req_to_token.shape[1]
    if batch == 0 or total == 0 or req_to_token.numel() == 0:
        return out
    pool, outside = _clamped_pool(req_to_token, req_pool_indices)
    max_count = -(-cols // dcp_size)
    if kv_start_idx is None:
        first = dcp_rank
        room = -(-(cols - dcp_rank) // dcp_size) if cols > dcp_rank else 0
        count = local_seq_lens.clamp(0, min(room, torch.iinfo(local_seq_lens.dtype).max))
    else:
        start = kv_start_idx.long().clamp(-BOUND, BOUND)
        first = start + torch.remainder(dcp_rank - start, dcp_size)
        clamped = first.clamp(0, cols - 1)
        outside = outside | (clamped != first)
        first = clamped
        count = torch.minimum(local_seq_lens.clamp(min=0), (cols - 1 - first) // dcp_size + 1)
    count = count.masked_fill(outside, 0)  # [B]
    written, pool, position = _csr_reads(kv_indptr, count, max_count, pool, first, dcp_size, total, cols)
    _store(out, written, _divide(req_to_token[pool, position], dcp_size, round_toward_zero))
    return out


def dcp_local_lengths(seq_lens, dcp_size, dcp_rank, kv_start_idx=None, out=None):
    """Per request, the tokens of ``[start_b, start_b + seq_lens[b])`` that rank ``dcp_rank`` holds under
    token-interleaved DCP (positions ``p`` with ``p mod dcp_size == dcp_rank``; ``start_b = kv_start_idx[b]``,
    0 when absent): the ``local_seq_lens`` of ``create_dcp_kv_indices`` and ``create_dcp_page_table``.

    PyTorch operations on the tensors' device: no host sync, capturable in a CUDA graph. Exact for every
    int32/int64 value; 0 where ``seq_lens[b] <= 0``.

    Args:
        seq_lens: int32/int64 ``[B]``.
        dcp_size: int in ``[1, 1024]``; dcp_rank: int in ``[0, dcp_size)``.
        kv_start_idx: optional int32/int64 ``[B]``.
        out: optional int32/int64 ``[>= B]``, an entry of its own per request (not an expanded, stride-0
            view); receives the counts in ``out[:B]`` (the rest is untouched). Counts above ``2**31 - 1`` are
            stored as ``2**31 - 1`` in an int32 ``out`` (saturated, never wrapped: telling the caller would
            need a sync).

    Raises ``TypeError``/``ValueError`` naming the argument before anything is written.

    Returns:
        ``out``, or a new ``[B]`` tensor of ``seq_lens``' dtype (which holds every count: none exceeds its
        length).
    """
    dcp_lengths_device(seq_lens, dcp_size, dcp_rank, kv_start_idx, out)
    counts = dcp_owned_counts(seq_lens, dcp_size, dcp_rank, kv_start_idx).clamp_(min=0)
    if out is None:
        return counts.to(seq_lens.dtype)
    if out.dtype == torch.int32:
        counts.clamp_(max=INT32_MAX)
    out[: counts.shape[0]].copy_(counts)
    return out


@declare("dcp_token_csr", outputs=("out",), check=check_arguments, check_data=check_data,
         reference=reference)
def create_dcp_kv_indices(req_to_token: Tensor, req_pool_indices: Tensor, local_seq_lens: Tensor, kv_indptr: Tensor,
                          out: Tensor, *, dcp_size: int, dcp_rank: int, kv_start_idx: Tensor | None = None,
                          round_toward_zero: bool = False, backend: str | None = None,
                          enable_pdl: bool | None = None) -> Tensor:
    """Build one decode-context-parallel rank's token-level CSR indices into ``out``.

    Token-interleaved DCP: position ``p`` of a request belongs to rank ``p mod D`` (``D = dcp_size``), and
    slot id ``v`` of the virtual pool is stored on its owner at local slot ``v // D``. For request ``b < B``
    let ``first_b`` be the first position ``>= kv_start_idx[b]`` (0 when absent) that ``dcp_rank`` owns;
    for ``j < local_seq_lens[b]``::

        out[kv_indptr[b] + j] = req_to_token[req_pool_indices[b], first_b + j * D] // D

    (floor division; truncation with ``round_toward_zero``), written in ``out``'s dtype.
    ``local_seq_lens[b]`` is the caller's count of the positions this rank owns (``dcp_local_lengths``).

    Args:
        req_to_token: int32 ``[R, C]`` virtual slot id per token, last dim contiguous, any row stride.
        req_pool_indices: int32/int64 ``[B]`` row of ``req_to_token`` per request.
        local_seq_lens: int32/int64 ``[B]`` tokens this rank holds per request.
        kv_indptr: int32/int64 ``[>= B]`` first output position per request (only ``[:B]`` is read).
        out: int32/int64 ``[N]``, contiguous. Written in place.
        dcp_size: int in ``[1, 1024]``, the ranks a request's tokens are spread over.
        dcp_rank: int in ``[0, dcp_size)``, this rank.
        kv_start_idx: optional int32/int64 ``[B]`` first token position per request (the rank starts at its
            first own position at or after it).
        round_toward_zero: bool; divide negative slot ids rounding toward zero, as SGLang's kernel does.
        backend, enable_pdl: as for ``create_flashmla_kv_indices``.

    Left untouched: every position no request writes. No write ever lands outside ``out``, whatever
    ``kv_indptr`` says; a row ends at its first position outside ``[0, C)`` (a first position outside it
    gives an empty row, as does a pool index outside ``[0, R)`` or a length ``<= 0``); positions and
    offsets are exact integers. Overlapping ``kv_indptr`` rows as for ``create_flashinfer_kv_indices`` (each
    overlapped entry holds one covering request's value, every other entry is exact). No host sync, no
    device allocation on the GPU backends.
    Raises as ``create_flashinfer_kv_indices`` does, also for ``dcp_size``/``dcp_rank`` out of range.

    Returns:
        ``out``.
    """
