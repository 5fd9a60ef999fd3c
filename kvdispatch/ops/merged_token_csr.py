"""One token CSR from a prefix CSR and an extend CSR, row by row: the op ``merged_token_csr``.

Its argument checks, its data checks (``KVDISPATCH_DEBUG``), its torch reference (the torch backend and the
semantics every backend is tested against) and its declaration (``kvdispatch.op.declare``), which makes the
public function, the custom op and the dispatch entry.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._debug import _first_bad
from .._validate import (_apart, _check_apart, _contiguous_vector, _index_span, _index_vector, _mapping_span,
                         _out_vector_span, _tensor)
from ..op import declare

__all__ = ["create_merged_kv_indices"]

_INDEX_DTYPES = (torch.int32, torch.int64)


def check_arguments(prefix_kv_indptr, prefix_kv_indices, extend_start_loc, extend_seq_lens, extend_kv_indices,
                    kv_indptr_out, out, memory=True):
    """Validate ``create_merged_kv_indices`` arguments; returns the device (``memory``: as for
    ``check_page_table_args``)."""
    try:  # hot path, as in check_page_table_args
        device, batch_shape = extend_seq_lens.device, extend_seq_lens.shape
        if memory and len(batch_shape) == 1 and len(kv_indptr_out.shape) == 1 and (
                kv_indptr_out.shape[0] > batch_shape[0]) and prefix_kv_indptr.shape[0] == batch_shape[0] + 1:
            inputs = (_index_span(prefix_kv_indptr, device, prefix_kv_indptr.shape),
                      _mapping_span(prefix_kv_indices, device), _index_span(extend_start_loc, device, batch_shape),
                      _index_span(extend_seq_lens, device, batch_shape), _mapping_span(extend_kv_indices, device))
            indptr = _index_span(kv_indptr_out, device, kv_indptr_out.shape) if kv_indptr_out.stride(0) == 1 else None
            written = _out_vector_span(out, device)
            if all(inputs) and indptr and written and _apart(written, inputs + (indptr,)) and _apart(indptr, inputs):
                return device
    except (AttributeError, IndexError, TypeError, RuntimeError, NotImplementedError):
        pass
    _tensor("extend_seq_lens", extend_seq_lens)
    device = extend_seq_lens.device
    batch = extend_seq_lens.shape[0] if extend_seq_lens.dim() == 1 else -1
    _index_vector("extend_seq_lens", extend_seq_lens, device, max(batch, 0))
    for name, t in (("prefix_kv_indptr", prefix_kv_indptr), ("prefix_kv_indices", prefix_kv_indices),
                    ("extend_start_loc", extend_start_loc), ("extend_kv_indices", extend_kv_indices),
                    ("kv_indptr_out", kv_indptr_out), ("out", out)):
        _tensor(name, t)
        if t.device != device:
            raise ValueError(f"{name} is on {t.device}, expected {device} (the device of extend_seq_lens)")
    for name, t, length in (("prefix_kv_indptr", prefix_kv_indptr, batch + 1),
                            ("extend_start_loc", extend_start_loc, batch)):
        _index_vector(name, t, device, 0, at_least=True)
        if t.shape[0] != length:
            raise ValueError(f"{name} must have {length} entries (extend_seq_lens has {batch}), got {t.shape[0]}")
    _contiguous_vector("prefix_kv_indices", prefix_kv_indices, device)
    _contiguous_vector("extend_kv_indices", extend_kv_indices, device)
    _contiguous_vector("kv_indptr_out", kv_indptr_out, device)
    if kv_indptr_out.shape[0] < batch + 1:
        raise ValueError(f"kv_indptr_out must have at least {batch + 1} entries (the batch + 1), got "
                         f"{kv_indptr_out.shape[0]}")
    _contiguous_vector("out", out, device)
    if not memory:
        return device
    _check_apart((("kv_indptr_out", kv_indptr_out), ("out", out)),
                 (("prefix_kv_indptr", prefix_kv_indptr), ("prefix_kv_indices", prefix_kv_indices),
                  ("extend_start_loc", extend_start_loc), ("extend_seq_lens", extend_seq_lens),
                  ("extend_kv_indices", extend_kv_indices)))
    return device


def _lengths(prefix_kv_indptr, prefix_count, extend_start_loc, extend_seq_lens, extend_count):
    """``(prefix start, prefix length, extend start, extend length)`` of every request, int64 ``[B]``: each part
    inside its array (an exact difference of bounds clamped into it), 0 where its start lies outside."""
    bounds = prefix_kv_indptr.long()
    start, end = bounds[:-1], bounds[1:]
    readable = (start >= 0) & (start < prefix_count)
    prefix = torch.where(readable, end.clamp(-1, prefix_count) - start.clamp(0, prefix_count), 0).clamp(min=0)
    first = extend_start_loc.long()
    inside = (first >= 0) & (first < extend_count)
    extend = torch.where(inside, torch.minimum(extend_seq_lens.long().clamp(-1, extend_count),
                                               extend_count - first.clamp(0, extend_count)), 0).clamp(min=0)
    return start, prefix, first, extend


def check_data(prefix_kv_indptr, prefix_kv_indices, extend_start_loc, extend_seq_lens, extend_kv_indices, out):
    """``create_merged_kv_indices``: each request's prefix ``[kv_indptr[b], kv_indptr[b + 1])`` and extend
    ``[extend_start_loc[b], + extend_seq_lens[b])`` rows lie inside their arrays (lengths ``>= 0``) and the merged
    rows fit ``out``."""
    bounds, first, counts = prefix_kv_indptr.long().cpu(), extend_start_loc.long().cpu(), extend_seq_lens.long().cpu()
    prefix_count, extend_count = prefix_kv_indices.shape[0], extend_kv_indices.shape[0]
    start, end = bounds[:-1], bounds[1:]
    b = _first_bad((end < start) | ((end > start) & ((start < 0) | (end > prefix_count))))
    if b is not None:
        raise ValueError(f"request {b}: its prefix [{int(start[b])}, {int(end[b])}) is not a row of "
                         f"prefix_kv_indices' {prefix_count} entries")
    b = _first_bad((counts < 0) | ((counts > 0) & ((first < 0) | (counts > extend_count - first))))
    if b is not None:
        raise ValueError(f"request {b}: its extend tokens [{int(first[b])}, +{int(counts[b])}) are not a row of "
                         f"extend_kv_indices' {extend_count} entries")
    total = int((end - start).sum() + counts.sum())
    if total > out.shape[0]:
        raise ValueError(f"the merged rows' {total} entries do not fit out's {out.shape[0]}")


def reference(prefix_kv_indptr, prefix_kv_indices, extend_start_loc, extend_seq_lens, extend_kv_indices,
              kv_indptr_out, out, pdl=False):
    """Two token CSRs merged row by row; semantics of ``kvdispatch.create_merged_kv_indices``.

    Request ``b < B`` has a prefix part of ``p_b`` entries from ``s_b = prefix_kv_indptr[b]`` (``min(
    prefix_kv_indptr[b + 1], Np) - s_b``, none when ``s_b`` lies outside ``[0, Np)``) and an extend part of ``e_b``
    from ``t_b = extend_start_loc[b]`` (``min(extend_seq_lens[b], Ne - t_b)``, none when ``t_b`` lies outside
    ``[0, Ne)``), both at least 0. ``kv_indptr_out[0] = 0`` (with ``B > 0``) and ``kv_indptr_out[b + 1] =
    kv_indptr_out[b] + p_b + e_b`` (the low 32 bits into an int32 one); ``out[kv_indptr_out[b] + j]`` is
    ``prefix_kv_indices[s_b + j]`` for ``j < p_b``, then ``extend_kv_indices[t_b + j - p_b]``, for entries inside
    ``out`` (the low 32 bits into an int32 one). Untouched: ``kv_indptr_out[B + 1:]`` and ``out`` past the last row.
    """
    batch = extend_seq_lens.shape[0]
    if batch == 0:
        return out
    prefix_count, extend_count = prefix_kv_indices.shape[0], extend_kv_indices.shape[0]
    start, prefix, first, extend = _lengths(prefix_kv_indptr, prefix_count, extend_start_loc, extend_seq_lens,
                                            extend_count)
    ends = torch.cumsum(prefix + extend, 0)
    kv_indptr_out[:1].zero_()
    kv_indptr_out[1:batch + 1].copy_(ends)
    total = out.shape[0]
    if total == 0:
        return out
    begins = ends - prefix - extend
    # Every output entry: its request (the last row beginning at or before it) and its place in that row.
    entry = torch.arange(total, device=out.device)
    row = (torch.searchsorted(ends, entry, right=True)).clamp(max=batch - 1)
    j = entry - begins[row]
    live = entry < ends[row]
    from_prefix = j < prefix[row]
    prefix_values = prefix_kv_indices[(start[row] + j).clamp(0, max(prefix_count - 1, 0))] if prefix_count else None
    extend_values = (extend_kv_indices[(first[row] + j - prefix[row]).clamp(0, max(extend_count - 1, 0))]
                     if extend_count else None)
    if prefix_values is None:
        values = extend_values if extend_values is not None else entry
    elif extend_values is None:
        values = prefix_values
    else:
        values = torch.where(from_prefix, prefix_values.long(), extend_values.long())
    torch.where(live, values.to(out.dtype), out, out=out)
    return out


@declare("merged_token_csr", outputs=("out", "kv_indptr_out"), check=check_arguments, check_data=check_data,
         reference=reference)
def create_merged_kv_indices(prefix_kv_indptr: Tensor, prefix_kv_indices: Tensor, extend_start_loc: Tensor,
                             extend_seq_lens: Tensor, extend_kv_indices: Tensor, kv_indptr_out: Tensor, out: Tensor,
                             *, backend: str | None = None, enable_pdl: bool | None = None) -> Tensor:
    """Merge a prefix token CSR and an extend token CSR into one, row by row, with its ``kv_indptr``.

    For request ``b < B = extend_seq_lens.shape[0]``, with ``p_b = prefix_kv_indptr[b + 1] - prefix_kv_indptr[b]``
    and ``e_b = extend_seq_lens[b]``::

        kv_indptr_out[b + 1] = kv_indptr_out[b] + p_b + e_b      # kv_indptr_out[0] = 0 (with B > 0)
        out[kv_indptr_out[b] + j] = prefix_kv_indices[prefix_kv_indptr[b] + j]       # j < p_b
        out[kv_indptr_out[b] + p_b + j] = extend_kv_indices[extend_start_loc[b] + j]  # j < e_b

    The prefix sums are computed on the device, in the same launch.

    Args:
        prefix_kv_indptr: int32/int64 ``[B + 1]``, any stride; prefix_kv_indices: int32/int64 ``[Np]``,
            contiguous.
        extend_start_loc, extend_seq_lens: int32/int64 ``[B]``, any stride; extend_kv_indices: int32/int64
            ``[Ne]``, contiguous.
        kv_indptr_out: int32/int64 ``[>= B + 1]``, contiguous. Its first ``B + 1`` entries are written.
        out: int32/int64 ``[N]``, contiguous. Written in place (values' low 32 bits into int32).
        backend: ``"triton"``, ``"cupy"``, ``"torch"``, ``"auto"`` or None (auto, or ``KVDISPATCH_BACKEND``).
        enable_pdl: programmatic dependent launch, as for ``create_flashmla_kv_indices``.

    Left untouched: ``kv_indptr_out[B + 1:]`` (all of it when ``B == 0``) and ``out`` past the last row's end.
    Bad data never reads or writes out of bounds: a part starting outside its array or of a length ``<= 0`` is
    empty, a part ends at its array's end and a row at the end of ``out``. No host sync and no device allocation
    on the GPU backends: capturable in a CUDA graph.

    Raises ``TypeError``/``ValueError`` naming the argument before anything is written: bad dtypes, shapes or
    devices, outputs sharing memory with an input or with each other.

    Returns:
        ``out``.
    """
