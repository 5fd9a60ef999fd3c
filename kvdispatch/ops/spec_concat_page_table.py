"""Each draft token's row: its request's prefix row, then the token's own expand row: the op
``spec_concat_page_table``.

Its argument checks, its data checks (``KVDISPATCH_DEBUG``), its torch reference (the torch backend and the
semantics every backend is tested against) and its declaration (``kvdispatch.op.declare``), which makes the
public function, the custom op and the dispatch entry.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._debug import _first_bad
from .._validate import (_INT32_MAX, _apart, _check_apart, _check_rows_apart, _index_span, _index_vector, _int32_span,
                         _int32_tensor, _python_int, _small_int, _table_output, _tensor)
from ..reference import BOUND, _store
from ..op import declare

__all__ = ["create_spec_concat_page_table"]


def check_arguments(page_table_a, page_table_b, seq_lens_a, seq_lens_b, out, draft_tokens, memory=True):
    """Validate ``create_spec_concat_page_table`` arguments; returns the device (``memory``: as for
    ``check_page_table_args``)."""
    try:  # hot path, as in check_page_table_args
        device, shape_a, shape_b = page_table_a.device, seq_lens_a.shape, seq_lens_b.shape
        if (memory and len(shape_a) == 1 and len(shape_b) == 1 and _small_int(draft_tokens, 1, _INT32_MAX)
                and shape_b[0] == shape_a[0] * draft_tokens):
            inputs = (_int32_span(page_table_a, device, 2, shape_a[0]),
                      _int32_span(page_table_b, device, 2, shape_b[0]), _index_span(seq_lens_a, device, shape_a),
                      _index_span(seq_lens_b, device, shape_b))
            written = _int32_span(out, device, 2, shape_b[0], True)
            if all(inputs) and written and _apart(written, inputs):
                return device
    except (AttributeError, IndexError, TypeError, RuntimeError, NotImplementedError):
        pass
    _int32_tensor("page_table_a", page_table_a, 2)
    device = page_table_a.device
    _python_int("draft_tokens", draft_tokens, 1, _INT32_MAX)
    for name, t in (("page_table_b", page_table_b), ("seq_lens_a", seq_lens_a), ("seq_lens_b", seq_lens_b),
                    ("out", out)):
        _tensor(name, t)
        if t.device != device:
            raise ValueError(f"{name} is on {t.device}, expected {device} (the device of page_table_a)")
    for name, t in (("seq_lens_a", seq_lens_a), ("seq_lens_b", seq_lens_b)):
        _index_vector(name, t, device, 0, at_least=True)
    batch, rows = seq_lens_a.shape[0], seq_lens_b.shape[0]
    if rows != batch * draft_tokens:
        raise ValueError(f"seq_lens_b must have seq_lens_a's {batch} entries times draft_tokens={draft_tokens}, got "
                         f"{rows}")
    for name, t, least in (("page_table_a", page_table_a, batch), ("page_table_b", page_table_b, rows)):
        _int32_tensor(name, t, 2)
        if t.shape[0] < least:
            raise ValueError(f"{name} must have at least {least} rows, got shape {tuple(t.shape)}")
    _table_output("out", out, rows, device)
    if not memory:
        return device
    _check_rows_apart(out)
    _check_apart((("out", out),), (("page_table_a", page_table_a), ("page_table_b", page_table_b),
                                   ("seq_lens_a", seq_lens_a), ("seq_lens_b", seq_lens_b)))
    return device


def check_data(page_table_a, page_table_b, seq_lens_a, seq_lens_b, out, draft_tokens):
    """``create_spec_concat_page_table``: every length ``>= 0`` and within its table's width, each row's
    ``seq_lens_a[m // draft_tokens] + seq_lens_b[m]`` entries within the width of ``out``."""
    for name, lens, table in (("seq_lens_a", seq_lens_a, page_table_a), ("seq_lens_b", seq_lens_b, page_table_b)):
        values = lens.long().cpu()
        b = _first_bad((values < 0) | (values > table.shape[1]))
        if b is not None:
            raise ValueError(f"row {b}: {name}[{b}] = {int(values[b])} is outside [0, {table.shape[1]}] (the width "
                             f"of its table)")
    totals = seq_lens_a.long().cpu().repeat_interleave(draft_tokens) + seq_lens_b.long().cpu()
    b = _first_bad(totals > out.shape[1])
    if b is not None:
        raise ValueError(f"row {b}: its {int(totals[b])} entries do not fit out's {out.shape[1]} columns")


def reference(page_table_a, page_table_b, seq_lens_a, seq_lens_b, out, draft_tokens, pdl=False):
    """Prefix rows then expand rows; semantics of ``kvdispatch.create_spec_concat_page_table``.

    Row ``m < M`` (request ``a = m // draft_tokens``) has ``la = seq_lens_a[a]`` and ``lb = seq_lens_b[m]``
    (clamped into ``[-2**62, 2**62]``, which no table comes near): ``out[m, n]`` for ``n < min(la + lb, W)`` is
    ``page_table_a[a, n]`` for ``n < la`` (0 past its width ``LA``), then ``page_table_b[m, n - la]`` (0 past its
    width ``LB``). Untouched: rows ``>= M`` and each row's columns past its entries.
    """
    rows, width = seq_lens_b.shape[0], out.shape[1]
    if rows == 0 or width == 0:
        return out
    device = out.device
    first = seq_lens_a.long().clamp(-BOUND, BOUND).repeat_interleave(draft_tokens)
    second = seq_lens_b.long().clamp(-BOUND, BOUND)
    n = torch.arange(width, device=device)[None, :]
    live = n < (first + second)[:, None]
    in_a = n < first[:, None]
    width_a, width_b = page_table_a.shape[1], page_table_b.shape[1]
    request = torch.arange(rows, device=device) // draft_tokens
    values = torch.zeros((rows, width), dtype=torch.int32, device=device)
    if width_a:
        a_values = page_table_a[request[:, None], n.clamp(max=width_a - 1)]
        values = torch.where(in_a & (n < width_a), a_values, values)
    if width_b:
        column = n - first[:, None]
        b_values = page_table_b[torch.arange(rows, device=device)[:, None], column.clamp(0, width_b - 1)]
        values = torch.where(~in_a & (column < width_b), b_values, values)
    _store(out[:rows], live, values)
    return out


@declare("spec_concat_page_table", outputs=("out",), check=check_arguments, check_data=check_data,
         reference=reference)
def create_spec_concat_page_table(page_table_a: Tensor, page_table_b: Tensor, seq_lens_a: Tensor, seq_lens_b: Tensor,
                                  out: Tensor, *, draft_tokens: int, backend: str | None = None,
                                  enable_pdl: bool | None = None) -> Tensor:
    """Each draft token's table row: its request's prefix row, then the token's own expand row.

    For row ``m < M = seq_lens_b.shape[0]`` (``M = B * draft_tokens``; request ``a = m // draft_tokens``) and
    ``n < seq_lens_a[a] + seq_lens_b[m]``::

        out[m, n] = page_table_a[a, n]                     # n < seq_lens_a[a] (0 past page_table_a's width)
        out[m, n] = page_table_b[m, n - seq_lens_a[a]]     # after it (0 past page_table_b's width)

    Args:
        page_table_a: int32 ``[>= B, LA]``, last dim contiguous, any row stride: each request's prefix row.
        page_table_b: int32 ``[>= M, LB]``, likewise: each draft token's expand row.
        seq_lens_a: int32/int64 ``[B]``; seq_lens_b: int32/int64 ``[M]``, any stride.
        out: int32 ``[>= M, W]``, last dim contiguous, any row stride. Written in place.
        draft_tokens: int ``>= 1``, the draft tokens per request.
        backend: ``"triton"``, ``"cupy"``, ``"torch"``, ``"auto"`` or None (auto, or ``KVDISPATCH_BACKEND``).
        enable_pdl: programmatic dependent launch, as for ``create_flashmla_kv_indices``.

    Left untouched: rows ``>= M`` and each row's columns past its entries. Bad data never reads or writes out of
    bounds: a row ends at the width of ``out``, a length ``<= 0`` adds nothing (lengths clamped into ``[-2**62,
    2**62]`` first). No host sync and no device allocation on the GPU backends: capturable in a CUDA graph.

    Raises ``TypeError``/``ValueError`` naming the argument before anything is written: bad dtypes, shapes or
    devices, ``seq_lens_b`` not ``draft_tokens`` entries per request, ``out`` sharing memory with an input, rows
    of ``out`` sharing memory.

    Returns:
        ``out``.
    """
