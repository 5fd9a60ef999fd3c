"""The TRT-LLM MHA page table and its sliding-window twin: the op ``mha_page_table``.

Its argument checks, its data checks (``KVDISPATCH_DEBUG``), its torch reference (the torch backend and
the semantics every backend is tested against) and its declaration (``kvdispatch.op.declare``), which makes
the public function, the custom op and the dispatch entry.
"""

from __future__ import annotations

from torch import Tensor

from .._debug import _check_pages_fit, _check_rows, _first_bad_entry, _first_slots
from .._validate import (_INT32_MAX, _INT32_MIN, _apart, _check_apart, _check_rows_apart, _common, _contiguous_vector,
                         _index_span, _int32_span, _mapping_span, _python_int, _small_int, _table_output)
from ..grid import MAX_PAGE_SIZE
from ..reference import INT32_MAX, _divide, _page_reads, _store
from ..op import declare

__all__ = ["create_trtllm_mha_page_table"]


def tables_apart(page_table, swa_page_table, full_to_swa, device, batch, inputs):
    """The hot-path check of a page table and its optional SWA twin (``full_to_swa`` with it): int32 ``[>= batch,
    W]`` tables on ``device`` whose rows share no memory, a contiguous mapping, the tables apart from each other, the
    mapping and the input spans ``inputs`` (all truthy)."""
    written = _int32_span(page_table, device, 2, batch, True)
    if not written:
        return False
    if swa_page_table is None:
        return _apart(written, inputs)
    swa_written = _int32_span(swa_page_table, device, 2, batch, True)
    mapping = _mapping_span(full_to_swa, device)
    return bool(swa_written and mapping and _apart(written, inputs + (mapping, swa_written))
                and _apart(swa_written, inputs + (mapping,)))


def check_tables(page_table, page_size, swa_page_table, full_to_swa, round_toward_zero, batch, device, inputs,
                 memory):
    """The detailed checks of a page table, its optional SWA twin and their options, each error naming the
    argument; ``inputs``: the ``(name, tensor)`` pairs the tables must be apart from. Returns ``device``."""
    _table_output("page_table", page_table, batch, device)
    _python_int("page_size", page_size, 1, MAX_PAGE_SIZE)
    if not isinstance(round_toward_zero, bool):
        raise TypeError(f"round_toward_zero must be a bool, got {type(round_toward_zero).__name__}")
    if (swa_page_table is None) != (full_to_swa is None):
        given, missing = ("swa_page_table", "full_to_swa") if full_to_swa is None else ("full_to_swa",
                                                                                       "swa_page_table")
        raise ValueError(f"{given} was given without {missing}: the SWA table needs both")
    if swa_page_table is not None:
        _table_output("swa_page_table", swa_page_table, batch, device)
        _contiguous_vector("full_to_swa", full_to_swa, device)
    if not memory:
        return device
    _check_rows_apart(page_table, "page_table")
    if swa_page_table is not None:
        _check_rows_apart(swa_page_table, "swa_page_table")
    _check_apart((("page_table", page_table), ("swa_page_table", swa_page_table)),
                 inputs + (("full_to_swa", full_to_swa),))
    return device


def check_arguments(req_to_token, req_pool_indices, seq_lens, page_table, page_size, swa_page_table=None,
                    full_to_swa=None, round_toward_zero=False, seqlen_offset=0, memory=True):
    """Validate ``create_trtllm_mha_page_table`` arguments; returns the device (``memory``: as for
    ``check_page_table_args``)."""
    try:  # hot path, as in check_page_table_args
        device, batch_shape = req_to_token.device, req_pool_indices.shape
        if (memory and len(batch_shape) == 1 and _small_int(page_size, 1, MAX_PAGE_SIZE)
                and (round_toward_zero is False or round_toward_zero is True) and _small_int(seqlen_offset)
                and (swa_page_table is None) == (full_to_swa is None)):
            table = _int32_span(req_to_token, device, 2)
            pool = _index_span(req_pool_indices, device, batch_shape)
            lens = _index_span(seq_lens, device, batch_shape)
            if table and pool and lens and tables_apart(page_table, swa_page_table, full_to_swa, device,
                                                        batch_shape[0], (table, pool, lens)):
                return device
    except (AttributeError, IndexError, TypeError, RuntimeError, NotImplementedError):
        pass
    batch, device = _common(req_to_token, req_pool_indices, seq_lens, None)
    _python_int("seqlen_offset", seqlen_offset, _INT32_MIN, _INT32_MAX)
    return check_tables(page_table, page_size, swa_page_table, full_to_swa, round_toward_zero, batch, device,
                        (("req_to_token", req_to_token), ("req_pool_indices", req_pool_indices),
                         ("seq_lens", seq_lens)), memory)


def check_data(req_to_token, req_pool_indices, seq_lens, page_table, page_size, swa_page_table,
               full_to_swa, seqlen_offset):
    """``create_trtllm_mha_page_table``: every pool index in ``[0, R)``; ``seq_lens + seqlen_offset >= 0``; a
    non-empty row ends at or before column ``C``; its ``ceil(L_b / page_size)`` pages fit the width of
    ``page_table`` and of ``swa_page_table``; with the SWA table, every slot it maps (the first slot of each
    page) inside ``full_to_swa``'s ``[0, M)``, where the kernels would clamp it (or, ``M == 0``, write nothing)."""
    lengths = _check_rows(req_to_token, req_pool_indices, seq_lens, None, seqlen_offset,
                          "seq_lens + seqlen_offset" if seqlen_offset else "seq_lens")
    _check_pages_fit(lengths, page_size, page_table.shape[1], "page_table")
    if swa_page_table is None:
        return
    _check_pages_fit(lengths, page_size, swa_page_table.shape[1], "swa_page_table")
    if swa_page_table.shape[1] == 0:
        return
    size, pool = full_to_swa.shape[0], req_pool_indices.long().cpu()
    slots, live = _first_slots(req_to_token, pool, lengths, page_size, swa_page_table.shape[1])
    bad = _first_bad_entry(live & ((slots < 0) | (slots >= size)))
    if bad is not None:
        b, p = bad
        raise ValueError(f"request {b}: slot {int(slots[b, p])} at req_to_token[{int(pool[b])}, {p * page_size}] "
                         f"(page {p}) is outside full_to_swa's [0, {size})")


def reference(req_to_token, req_pool_indices, seq_lens, page_table, page_size, swa_page_table=None,
              full_to_swa=None, round_toward_zero=False, seqlen_offset=0, pdl=False):
    """The TRT-LLM MHA page table, with its SWA twin; semantics of ``kvdispatch.create_trtllm_mha_page_table``.

    Request ``b`` has ``pages_b = min(ceil(L_b / P), ceil(C / P))`` pages (0 for a bad pool index or a length
    ``L_b = seq_lens[b] + seqlen_offset <= 0``), each read at its first slot ``s = req_to_token[pool_b, p * P]``.
    ``page_table[b, p] = s // P`` for ``p < min(pages_b, W)``; with SWA (``full_to_swa`` int32/int64 ``[M]``,
    ``M > 0``) ``swa_page_table[b, p] = full_to_swa[clamp(s, 0, M - 1)] // P`` for ``p < min(pages_b, W2)``, its
    low 32 bits. ``//`` floors, or truncates with ``round_toward_zero``. Untouched: rows ``>= B``, the columns
    past each row's pages, and the whole SWA table when ``M == 0``.
    """
    batch = req_pool_indices.shape[0]
    width = page_table.shape[1]
    swa = swa_page_table is not None and full_to_swa.shape[0] > 0
    span = max(width, swa_page_table.shape[1] if swa else 0)
    if batch == 0 or span == 0:
        return page_table
    columns, live, slots = _page_reads(req_to_token, req_pool_indices, seq_lens, span, page_size, seqlen_offset)
    kept = min(width, columns)
    if kept:
        _store(page_table[:batch, :kept], live[:, :kept], _divide(slots[:, :kept], page_size, round_toward_zero))
    if swa and columns:
        kept = min(swa_page_table.shape[1], columns)
        last = min(full_to_swa.shape[0] - 1, INT32_MAX)  # slots are int32
        mapped = full_to_swa[slots[:, :kept].clamp(0, last)]
        _store(swa_page_table[:batch, :kept], live[:, :kept], _divide(mapped, page_size, round_toward_zero))
    return page_table


@declare("mha_page_table", outputs=("page_table", "swa_page_table"), check=check_arguments, check_data=check_data,
         reference=reference)
def create_trtllm_mha_page_table(req_to_token: Tensor, req_pool_indices: Tensor, seq_lens: Tensor, page_table: Tensor,
                                 *, page_size: int, swa_page_table: Tensor | None = None,
                                 full_to_swa: Tensor | None = None, round_toward_zero: bool = False,
                                 seqlen_offset: int = 0, backend: str | None = None,
                                 enable_pdl: bool | None = None) -> Tensor:
    """Build the TRT-LLM MHA page table (and its sliding-window twin) into ``page_table``.

    For request ``b < B`` and page ``p < ceil(L_b / page_size)``, with ``L_b = seq_lens[b] + seqlen_offset``::

        slot = req_to_token[req_pool_indices[b], p * page_size]
        page_table[b, p] = slot // page_size                                   # p < W
        swa_page_table[b, p] = full_to_swa[clamp(slot, 0, M - 1)] // page_size  # p < W2, with SWA

    ``//`` floors (truncates with ``round_toward_zero``, as SGLang's kernel divides); the SWA value is the
    quotient's low 32 bits. The out-of-range slots the clamp catches read the mapping's first or last entry,
    as in SGLang; an empty mapping (``M == 0``) writes nothing into ``swa_page_table``.

    Args:
        req_to_token, req_pool_indices, seq_lens: as for ``create_flashmla_kv_indices`` (int32 ``[R, C]``,
            int32/int64 ``[B]``, int32/int64 ``[B]``).
        page_table: int32 ``[>= B, W]``, last dim contiguous, any row stride. Written in place.
        page_size: int in ``[1, 4096]``.
        swa_page_table: optional int32 ``[>= B, W2]`` (last dim contiguous, any row stride), given together
            with ``full_to_swa``: int32/int64 ``[M]``, contiguous, the full pool's slot -> SWA pool's slot.
        round_toward_zero: bool; divide negative values rounding toward zero.
        seqlen_offset: int in ``[-2**31, 2**31)`` added to every length (the draft tokens of target-verify).
        backend: ``"triton"``, ``"cupy"``, ``"torch"``, ``"auto"`` or None (auto, or ``KVDISPATCH_BACKEND``).
        enable_pdl: programmatic dependent launch, as for ``create_flashmla_kv_indices``.

    Left untouched: rows ``>= B`` of both tables and the columns past each row's pages. Bad data never
    reads or writes out of bounds: a pool index outside ``[0, R)`` or a length ``<= 0`` gives an empty row,
    and a row ends at its first page starting at or past column ``C``. No host sync and no device allocation
    on the GPU backends: capturable in a CUDA graph.

    Raises ``TypeError``/``ValueError`` naming the argument before anything is written: bad dtypes, shapes or
    devices, one of ``swa_page_table``/``full_to_swa`` without the other, outputs sharing memory with an input
    or with each other, rows of a table sharing memory.

    Returns:
        ``page_table``.
    """
