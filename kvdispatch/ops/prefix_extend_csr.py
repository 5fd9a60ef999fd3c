"""Token CSR over a gathered prefix+extend buffer: the op ``prefix_extend_csr``.

Its argument checks, its data checks (``KVDISPATCH_DEBUG``), its torch reference (the torch backend and
the semantics every backend is tested against) and its declaration (``kvdispatch.op.declare``), which makes
the public function, the custom op and the dispatch entry.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._debug import _check_csr_rows, _first_bad
from .._validate import _check_apart, _csr_out, _index_vector, _python_int, _tensor
from ..reference import _csr_reads, _store
from ..op import declare

__all__ = ["create_prefix_extend_kv_indices"]

# Lengths are clamped into [0, LENGTH_BOUND] (no output comes near it), so every sum below is exact in int64.
LENGTH_BOUND = 2**61


def check_arguments(prefix_lens, prefix_starts, extend_lens, extend_starts, kv_indptr, out, extend_base=0,
                    memory=True):
    """Validate ``create_prefix_extend_kv_indices`` arguments; returns the device (``memory``: False checks
    metadata only, for the fake)."""
    _tensor("prefix_lens", prefix_lens)
    device = prefix_lens.device
    batch = prefix_lens.shape[0] if prefix_lens.dim() == 1 else -1
    vectors = (("prefix_lens", prefix_lens), ("prefix_starts", prefix_starts), ("extend_lens", extend_lens),
               ("extend_starts", extend_starts), ("kv_indptr", kv_indptr))
    for name, t in vectors:
        _tensor(name, t)
        if t.device != device:
            raise ValueError(f"{name} is on {t.device}, expected {device} (the device of prefix_lens)")
        _index_vector(name, t, device, batch, at_least=name == "kv_indptr")
    _csr_out(out, device, "prefix_lens")
    _python_int("extend_base", extend_base, -(2**63), 2**63 - 1)
    if memory:
        _check_apart((("out", out),), vectors)
    return device


def check_data(prefix_lens, prefix_starts, extend_lens, extend_starts, kv_indptr, out, extend_base=0):
    """``create_prefix_extend_kv_indices``: ``prefix_lens >= 0`` and ``extend_lens >= 0``; each row's
    ``prefix_lens[b] + extend_lens[b]`` entries inside ``out``, no two rows sharing one. Values are not checked
    (any int64 is a value)."""
    prefix, extend = prefix_lens.long().cpu(), extend_lens.long().cpu()
    for name, lengths in (("prefix_lens", prefix), ("extend_lens", extend)):
        b = _first_bad(lengths < 0)
        if b is not None:
            raise ValueError(f"request {b}: {name}[{b}] = {int(lengths[b])} is negative")
    _check_csr_rows(kv_indptr, prefix.clamp(max=LENGTH_BOUND) + extend.clamp(max=LENGTH_BOUND), prefix + extend, out)


def reference(prefix_lens, prefix_starts, extend_lens, extend_starts, kv_indptr, out, extend_base=0, pdl=False):
    """Token CSR over a gathered prefix+extend buffer; semantics of ``kvdispatch.create_prefix_extend_kv_indices``.

    ``out``: int32 or int64 ``[N]``. With ``P_b = max(prefix_lens[b], 0)`` and ``E_b = max(extend_lens[b], 0)``,
    request ``b`` writes ``out[kv_indptr[b] + j]`` for ``j < P_b + E_b`` whose target lies in ``[0, N)``:
    ``prefix_starts[b] + j`` for ``j < P_b``, ``extend_base + extend_starts[b] + (j - P_b)`` after (the low 64
    bits of the exact sum, then cast to ``out``'s dtype: int32 keeps the low 32 bits). Untouched: every position no
    request writes; overlapping rows as for ``create_flashinfer_kv_indices``.
    """
    batch, total = prefix_lens.shape[0], out.shape[0]
    if batch == 0 or total == 0:
        return out
    prefix = prefix_lens.long().clamp(0, LENGTH_BOUND)
    count = prefix + extend_lens.long().clamp(0, LENGTH_BOUND)
    requests = torch.arange(batch, device=out.device)
    written, owner, j = _csr_reads(kv_indptr, count, 2 * LENGTH_BOUND, requests, 0, 1, total, 2 * LENGTH_BOUND)
    in_prefix = j < prefix[owner]
    values = torch.where(in_prefix, prefix_starts.long()[owner] + j,
                         extend_starts.long()[owner] + (j - prefix[owner]) + extend_base)
    _store(out, written, values)
    return out


@declare("prefix_extend_csr", outputs=("out",), check=check_arguments, check_data=check_data, reference=reference)
def create_prefix_extend_kv_indices(prefix_lens: Tensor, prefix_starts: Tensor, extend_lens: Tensor,
                                    extend_starts: Tensor, kv_indptr: Tensor, out: Tensor, *, extend_base: int = 0,
                                    backend: str | None = None, enable_pdl: bool | None = None) -> Tensor:
    """Build the token CSR of a buffer that holds every request's prefix tokens, then every request's extend tokens
    (the all-gathered KV buffer of decode-context-parallel prefill: prefixes from 0, extends from
    ``extend_base``, the prefixes' total): each request's row lists its prefix's buffer positions, then its
    extend's.

    For request ``b < B`` (``B = prefix_lens.shape[0]``), with ``P_b = prefix_lens[b]``::

        out[kv_indptr[b] + j]       = prefix_starts[b] + j                   # j < P_b
        out[kv_indptr[b] + P_b + j] = extend_base + extend_starts[b] + j     # j < extend_lens[b]

    computed in 64 bits and written in ``out``'s dtype (int32: the low 32 bits).

    Args:
        prefix_lens, prefix_starts, extend_lens, extend_starts: int32/int64 ``[B]``, any stride.
        kv_indptr: int32/int64 ``[>= B]`` first output position per request (only ``[:B]`` is read).
        out: int32/int64 ``[N]``, contiguous. Written in place.
        extend_base: int (int64 range), added to every extend position.
        backend, enable_pdl: as for ``create_flashmla_kv_indices``.

    Left untouched: every position no request writes. No write ever lands outside ``out``, whatever
    ``kv_indptr`` says; a negative length counts as 0. Overlapping ``kv_indptr`` rows as for
    ``create_flashinfer_kv_indices``. No host sync, no device allocation on the GPU backends.
    Raises ``TypeError``/``ValueError`` naming the argument before anything is written.

    Returns:
        ``out``.
    """
