"""A drop-in for ``get_dcp_lens`` of SGLang 0.5.23's ``sglang.srt.layers.dcp.layout``: the per-rank lengths the
decode-context-parallel builders' callers pass.
"""

from __future__ import annotations

import torch

from kvdispatch._validate import _INT32_MAX, dcp_lengths_device
from kvdispatch.compat.sglang._common import _check_int

__all__ = ["get_dcp_lens"]


def _owned_before(quotient, remainder, dcp_rank, interleave_size, cycle):
    """Positions ``p < quotient * cycle + remainder`` (``remainder`` in ``[0, 2 * cycle)``) whose run of
    ``interleave_size`` belongs to ``dcp_rank``: ``interleave_size`` per whole cycle, plus the rank's share of
    the rest."""
    extra = torch.div(remainder, cycle, rounding_mode="floor")
    rest = torch.remainder(remainder, cycle)
    share = (rest - dcp_rank * interleave_size).clamp_(0, interleave_size)
    return (quotient + extra) * interleave_size + share


def get_dcp_lens(lens, dcp_size, dcp_rank, start=None, interleave_size=1):
    """Tokens of each request that rank ``dcp_rank`` holds: of the positions ``[start, start + lens)`` (``start``
    None: ``[0, lens)``), those whose run of ``interleave_size`` consecutive positions is the rank's (runs rotate
    over the ranks: position ``p`` is rank ``(p // interleave_size) mod dcp_size``'s), as SGLang's DCP layout
    helper counts them: ``lens`` itself when ``dcp_size == 1``; else ``owned(start + lens) - owned(start)`` with
    ``owned(x) = (x // C) * interleave_size + clamp(x % C - dcp_rank * interleave_size, 0, interleave_size)``,
    ``C = dcp_size * interleave_size`` (floor division; a negative length gives a negative count), in ``lens``'
    dtype without ``start``, else the promoted dtype of ``start`` and ``lens``.

    PyTorch operations only (no host sync, capturable in a CUDA graph); exact for every int32/int64 value (the
    quotients and remainders of ``start`` and ``lens`` are taken apart, so ``start + lens`` never wraps).
    ``lens``, ``start``: int32/int64 ``[B]``; ``dcp_size`` an int in ``[1, 1024]``, ``dcp_rank`` in ``[0,
    dcp_size)``, refused with the errors of ``kvdispatch.dcp_local_lengths``; ``interleave_size`` an int in
    ``[1, 2**31 - 1]``. ``kvdispatch.dcp_local_lengths`` is the count at ``interleave_size`` 1, clamped at 0.
    """
    dcp_lengths_device(lens, dcp_size, dcp_rank, start, None, "lens", "start")
    _check_int("interleave_size", interleave_size, 1, _INT32_MAX)
    if dcp_size == 1:
        return lens
    cycle = dcp_size * interleave_size
    lengths = lens.long()
    len_quotient = torch.div(lengths, cycle, rounding_mode="floor")
    len_remainder = torch.remainder(lengths, cycle)
    if start is None:
        return _owned_before(len_quotient, len_remainder, dcp_rank, interleave_size, cycle).to(lens.dtype)
    start_remainder = torch.remainder(start.long(), cycle)
    counts = (_owned_before(len_quotient, start_remainder + len_remainder, dcp_rank, interleave_size, cycle)
              - _owned_before(0, start_remainder, dcp_rank, interleave_size, cycle))
    return counts.to(torch.result_type(start, lens))
