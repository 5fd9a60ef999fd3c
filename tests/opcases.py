"""One random case builder per declared op (``kvdispatch.dispatch.OPS``), for the conformance tests.

``build(key, seed, knobs)`` draws a fresh valid call of op ``key``: its arguments by name (``Op.parameters``), every
output a view in the middle of a larger allocation filled with ``POISON``, so that a write outside the view shows.
Each case has rows of mixed lengths (some running past the table's end), bad data among them (pool indices outside
``[0, R)``, lengths ``<= 0``), index vectors of either dtype, some strided, and the table a view with a row stride
past its width now and then. ``Knobs`` sizes it and turns the optional arguments on or off;
``hostile`` puts the int32/int64 extremes (``+-(2**31 - 1)``, ``-2**31``, ``+-(2**63 - 1)``, ``-2**63`` where the
vector's dtype holds them) into the index vectors, the lookup vectors and the table.

``seed`` draws the shapes, dtypes, strides and the int options; ``data_seed`` (``seed`` when None) the tensors'
values: two cases of one ``seed`` and knobs have the same layout, so one can be copied into the other's buffers
(``refill``: a CUDA graph's replay on new data). CSR rows never overlap (``kv_indptr`` leaves each row room for every
token it may write), so every backend must give the reference's result exactly.

``expected(case)``: the op's reference run on clones of the case's allocations and inputs.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import torch

from kvcases import POISON
from kvdispatch import dispatch

GUARD = 4  # poisoned entries on each side of an output view; 4 keeps int32 rows 16-byte aligned
I32_MAX, I64_MAX = 2**31 - 1, 2**63 - 1
EXTREMES = (I32_MAX, -I32_MAX, -(2**31), I64_MAX, -I64_MAX, -(2**63))
TENSOR_ANNOTATIONS = ("Tensor", "Tensor | None")


@dataclass(frozen=True)
class Knobs:
    """The size of a case and whether the op's optional arguments are given.

    batch: requests; page_size: the op's page size (the token CSR's ``entry_page_size`` with options);
    pages: table width in pages (output widths follow it); options: every optional argument given, with
    values drawn from the seed (off: each at its default)."""

    batch: int = 5
    page_size: int = 16
    pages: int = 3
    options: bool = False

    def __str__(self):
        return f"B{self.batch}-P{self.page_size}-W{self.pages}-{'options' if self.options else 'plain'}"


@dataclass
class OpCase:
    """A call of op ``key``: ``arguments`` by name in ``Op.parameters`` order (tensors on the case's device,
    ints, None); ``allocations``: per output name, the poisoned tensor its view lies in the middle of."""

    key: str
    arguments: dict
    allocations: dict = field(default_factory=dict)

    @property
    def op(self):
        return dispatch.OPS[self.key]

    def tensor_parameters(self) -> list[str]:
        """The op's tensor arguments this case gives (optional ones it leaves None are absent)."""
        signature = inspect.signature(self.op.public).parameters
        return [name for name in self.op.parameters
                if signature[name].annotation in TENSOR_ANNOTATIONS and self.arguments[name] is not None]

    def inputs(self) -> dict:
        """The tensor arguments that are not outputs."""
        return {name: self.arguments[name] for name in self.tensor_parameters() if name not in self.op.outputs}

    def split(self, arguments=None) -> tuple[list, dict]:
        """``(positional, keyword)`` arguments of the public function (its signature's split)."""
        arguments = self.arguments if arguments is None else arguments
        signature = inspect.signature(self.op.public).parameters
        positional = [arguments[name] for name in self.op.parameters
                      if signature[name].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
        keyword = {name: arguments[name] for name in self.op.parameters
                   if signature[name].kind is inspect.Parameter.KEYWORD_ONLY}
        return positional, keyword

    def poison(self) -> None:
        for allocation in self.allocations.values():
            allocation.fill_(POISON)

    def inside(self, name) -> torch.Tensor:
        """A bool mask over ``allocations[name]``: True on the output view's elements."""
        allocation, view = self.allocations[name], self.arguments[name]
        mask = torch.zeros(allocation.shape, dtype=torch.bool, device=allocation.device)
        view_of(mask, view).fill_(True)
        return mask


def view_of(allocation: torch.Tensor, view: torch.Tensor) -> torch.Tensor:
    """The view of ``allocation`` (contiguous, storage offset 0) with ``view``'s place in its own allocation."""
    return allocation.as_strided(view.shape, view.stride(), view.storage_offset())


def expected(case: OpCase) -> dict:
    """Per output name, the allocation as the reference leaves it: the reference run on a clone of each
    allocation (the output a view of it) and on clones of the inputs."""
    clones = {name: allocation.clone() for name, allocation in case.allocations.items()}
    arguments = {}
    for name, value in case.arguments.items():
        if name in clones:
            value = view_of(clones[name], value)
        elif isinstance(value, torch.Tensor):
            value = value.clone()
        arguments[name] = value
    case.op.reference(*(arguments[name] for name in case.op.parameters))
    return clones


def refill(case: OpCase, new: OpCase) -> None:
    """Copy ``new`` (the same seed and knobs, other data) into ``case``'s tensors, in place."""
    for name, value in case.arguments.items():
        if isinstance(value, torch.Tensor) and name not in case.allocations:
            value.copy_(new.arguments[name])
        else:
            assert name in case.allocations or value == new.arguments[name], name
    for name, allocation in case.allocations.items():
        allocation.copy_(new.allocations[name])


# -- drawing ---------------------------------------------------------------------------------------------------

class _Draw:
    """The two generators of a case: ``layout`` (shapes, dtypes, strides, int options) and ``data`` (values)."""

    def __init__(self, seed, data_seed, device, hostile):
        self.layout = torch.Generator().manual_seed(seed)
        self.data = torch.Generator().manual_seed(seed if data_seed is None else data_seed)
        self.device, self.hostile = device, hostile
        self.allocations = {}

    def integer(self, low, high):
        """An int in ``[low, high)`` from the layout generator."""
        return int(torch.randint(low, high, (1,), generator=self.layout))

    def flag(self):
        return bool(self.integer(0, 2))

    def dtype(self):
        return (torch.int32, torch.int64)[self.integer(0, 2)]

    def values(self, low, high, count):
        return torch.randint(low, high, (count,), generator=self.data, dtype=torch.int64)

    def spoil(self, values: torch.Tensor, dtype, share=3) -> torch.Tensor:
        """With ``hostile``: about one entry in ``share`` replaced by an extreme ``dtype`` holds."""
        if self.hostile and values.numel():
            info = torch.iinfo(dtype)
            extremes = torch.tensor([v for v in EXTREMES if info.min <= v <= info.max], dtype=torch.int64)
            chosen = torch.randint(0, share, values.shape, generator=self.data) == 0
            picks = extremes[torch.randint(0, extremes.numel(), values.shape, generator=self.data)]
            values = torch.where(chosen, picks, values)
        return values

    def vector(self, values: torch.Tensor, dtype=None, contiguous=False) -> torch.Tensor:
        """``values`` as a ``dtype`` vector on the device (an int32/int64 from the layout when None), a strided
        view (every other entry of a poisoned buffer) now and then unless ``contiguous``."""
        dtype = self.dtype() if dtype is None else dtype
        values = self.spoil(values, dtype)
        if not contiguous and self.integer(0, 3) == 0:
            spread = torch.full((2 * values.numel(),), POISON, dtype=torch.int64)
            spread[::2] = values
            return spread.to(dtype).to(self.device)[::2]
        return values.to(dtype).to(self.device)

    def table(self, rows, cols, low, high) -> torch.Tensor:
        """An int32 ``[rows, cols]`` table of values in ``[low, high)``, a view with a wider row stride now
        and then; with ``hostile``, int32 extremes among them."""
        pad = self.integer(1, 6) if self.flag() else 0
        values = self.spoil(self.values(low, high, rows * cols), torch.int32, share=8).view(rows, cols)
        store = torch.full((rows, cols + pad), POISON, dtype=torch.int32)
        store[:, :cols] = values.to(torch.int32)
        return store.to(self.device)[:, :cols]

    def requests(self, batch, rows, max_length, dtype=None):
        """``(pool, lens)`` values: valid rows of mixed lengths in ``[1, max_length]``, about one in five with
        a pool index outside ``[0, rows)`` and one in five with a length ``<= 0``."""
        pool = self.values(0, max(rows, 1), batch)
        lens = self.values(1, max_length + 1, batch)
        bad_pool = torch.tensor([-1, rows, rows + 3])[self.values(0, 3, batch)]
        bad_length = self.values(-3, 1, batch)
        pool = torch.where(self.values(0, 5, batch) == 0, bad_pool, pool)
        lens = torch.where(self.values(0, 5, batch) == 0, bad_length, lens)
        return pool, lens

    def output(self, name, shape, dtype=torch.int32) -> torch.Tensor:
        """A view of ``shape`` in the middle of a poisoned allocation: GUARD rows (entries, when 1-D) on each
        side, and GUARD columns on each side or none (rows of the output contiguous)."""
        columns = GUARD if len(shape) == 2 and self.flag() else 0
        margins = [GUARD] + [columns] * (len(shape) - 1)
        allocation = torch.full([n + 2 * m for n, m in zip(shape, margins)], POISON, dtype=dtype, device=self.device)
        self.allocations[name] = allocation
        return allocation[tuple(slice(m, m + n) for n, m in zip(shape, margins))]


def _csr_indptr(d: _Draw, room: torch.Tensor, most: int):
    """``(kv_indptr [B + 1], total)``: rows one after another with gaps of 0..2, each ``room`` entries long (at
    least what it may write, so rows never overlap); with ``hostile``, some rows moved to an extreme offset,
    from which none of their tokens lands in ``out``. ``total``, the length of ``out``, holds rows of ``most``
    entries each (the layout's, whatever the data), so some entries past the last row stay untouched."""
    gaps = d.values(0, 3, room.numel())
    ends = torch.cumsum(room + gaps, 0)
    starts = ends - room
    indptr = torch.cat([starts, ends[-1:] if room.numel() else torch.zeros(1, dtype=torch.int64)])
    return d.vector(indptr), room.numel() * (most + 2) + 2


# -- the builders, one per op key ------------------------------------------------------------------------------

def _page_table(d: _Draw, k: Knobs):
    rows, cols = k.batch + 2, k.pages * k.page_size + k.page_size // 2 + 1
    width = k.pages + d.integer(0, 3)
    table = d.table(rows, cols, -2 * k.page_size, 1 << 20)
    pool, lens = d.requests(k.batch, rows, cols + 2 * k.page_size)
    arguments = dict(req_to_token=table, req_pool_indices=d.vector(pool), seq_lens=d.vector(lens),
                     out=d.output("out", (k.batch + d.integer(0, 3), width)), page_size=k.page_size,
                     kv_start_idx=None, seqlen_offset=0, seq_lens_out=None, fill_value=None, round_toward_zero=False)
    if k.options:
        arguments.update(kv_start_idx=d.vector(d.values(0, cols + 3, k.batch)), seqlen_offset=d.integer(-3, 4),
                         seq_lens_out=d.output("seq_lens_out", (k.batch + d.integer(0, 3),)),
                         fill_value=d.integer(-5, 5), round_toward_zero=d.flag())
    return arguments


def _token_csr(d: _Draw, k: Knobs):
    entry = k.page_size if k.options else 1
    rows, cols = k.batch + 2, k.pages * 8 + 3
    positions = cols * entry
    table = d.table(rows, cols, -3, rows * cols)
    pool, lens = d.requests(k.batch, rows, positions + 4)
    pool, lens = d.vector(pool), d.vector(lens)
    room = lens.cpu().long().clamp(0, positions)  # the most tokens a row may write
    indptr, total = _csr_indptr(d, room, positions)
    out_dtype = d.dtype() if k.options else torch.int32
    arguments = dict(req_to_token=table, req_pool_indices=pool, seq_lens=lens, kv_indptr=indptr,
                     out=d.output("out", (total,), out_dtype), kv_start_idx=None, entry_page_size=entry,
                     token_mapping=None)
    if k.options:
        mapping = d.values(-5, 1 << 20, rows * cols * entry + d.integer(-10, 10))
        arguments.update(kv_start_idx=d.vector(d.values(0, positions + 3, k.batch)),
                         token_mapping=d.vector(mapping, contiguous=True))
    return arguments


def _mha_page_table(d: _Draw, k: Knobs):
    rows, cols = k.batch + 2, k.pages * k.page_size + k.page_size // 2 + 1
    table = d.table(rows, cols, -2 * k.page_size, rows * cols)
    pool, lens = d.requests(k.batch, rows, cols + 2 * k.page_size)
    out_rows = k.batch + d.integer(0, 3)
    arguments = dict(req_to_token=table, req_pool_indices=d.vector(pool), seq_lens=d.vector(lens),
                     page_table=d.output("page_table", (out_rows, k.pages + d.integer(0, 3))), page_size=k.page_size,
                     swa_page_table=None, full_to_swa=None, round_toward_zero=False, seqlen_offset=0)
    if k.options:
        mapping = d.values(-5, 1 << 20, rows * cols + d.integer(-10, 10))
        arguments.update(swa_page_table=d.output("swa_page_table", (out_rows, k.pages + d.integer(-1, 3))),
                         full_to_swa=d.vector(mapping, contiguous=True), round_toward_zero=d.flag(),
                         seqlen_offset=d.integer(-3, 2 * k.page_size + 1))
    return arguments


def _translated_page_table(d: _Draw, k: Knobs):
    rows, cols = k.batch + 2, k.pages * k.page_size + k.page_size // 2 + 1
    table = d.table(rows, cols, -3, rows * cols)
    pool, lens = d.requests(k.batch, rows, cols + 2 * k.page_size)
    virtual_pages = -(-rows * cols // k.page_size)
    v2p = d.values(-1, 1 << 16, virtual_pages + d.integer(-2, 3))  # some pages past it
    width = k.pages + d.integer(0, 3)
    arguments = dict(req_to_token=table, req_pool_indices=d.vector(pool), seq_lens=d.vector(lens),
                     v2p=d.vector(v2p, contiguous=True), out=d.output("out", (k.batch + d.integer(0, 3), width)),
                     page_size=k.page_size, multiplier=1, max_pages=None, seq_len_delta=0)
    if k.options:
        arguments.update(multiplier=d.integer(-1, 5), max_pages=d.integer(0, width + 1), seq_len_delta=d.integer(-3, 4))
    return arguments


def _draft_decode(d: _Draw, k: Knobs):
    rows, cols = k.batch + 2, k.pages * k.page_size + 5
    steps, topk = d.integer(1, 4), d.integer(1, 4)
    table = d.table(rows, cols, -3, rows * cols)
    pool, lens = d.requests(k.batch, rows, cols)
    pool, lens = d.vector(pool), d.vector(lens)
    segments = k.batch * topk
    # About what the rows use (a prefix averages half the table's width): some rows cut at the width, some not.
    width = segments * (cols // 2 + steps) + d.integer(-segments, segments + 1) + 1
    arguments = dict(req_to_token=table, req_pool_indices=pool, seq_lens=lens,
                     kv_indptr=d.output("kv_indptr", (steps + d.integer(0, 2), segments + 1 + d.integer(0, 3)),
                                        d.dtype()),
                     out=d.output("out", (steps + d.integer(0, 2), width), d.dtype()), num_steps=steps, topk=topk,
                     page_size=k.page_size, positions=None, window_size=0, sink_size=0, v2p=None,
                     write_indptr_start=True, round_toward_zero=False)
    if k.options:
        given = lens.cpu().long().repeat_interleave(topk) + d.values(-2, 3, segments)
        window = d.integer(1, cols)
        v2p = d.values(-2, 1 << 16, -(-rows * cols // k.page_size) + d.integer(-2, 3))
        arguments.update(positions=d.vector(given), window_size=window, sink_size=d.integer(0, 4),
                         v2p=d.vector(v2p, contiguous=True), write_indptr_start=d.flag(), round_toward_zero=d.flag())
    return arguments


def _dcp_token_csr(d: _Draw, k: Knobs):
    rows, cols = k.batch + 2, k.pages * 8 + 3
    dcp_size = d.integer(1, 9)
    dcp_rank = d.integer(0, dcp_size)
    table = d.table(rows, cols, -2 * dcp_size, rows * cols)
    room_per_row = -(-cols // dcp_size)
    pool, lens = d.requests(k.batch, rows, room_per_row + 3)
    pool, lens = d.vector(pool), d.vector(lens)
    indptr, total = _csr_indptr(d, lens.cpu().long().clamp(0, room_per_row), room_per_row)
    arguments = dict(req_to_token=table, req_pool_indices=pool, local_seq_lens=lens, kv_indptr=indptr,
                     out=d.output("out", (total,), d.dtype() if k.options else torch.int32), dcp_size=dcp_size,
                     dcp_rank=dcp_rank, kv_start_idx=None, round_toward_zero=False)
    if k.options:
        arguments.update(kv_start_idx=d.vector(d.values(0, cols + 3, k.batch)), round_toward_zero=d.flag())
    return arguments


def _dcp_page_table(d: _Draw, k: Knobs):
    dcp_size = d.integer(1, 9)
    dcp_rank = d.integer(0, dcp_size)
    virtual_page = k.page_size * dcp_size
    rows, cols = k.batch + 2, k.pages * virtual_page + virtual_page // 2 + 1
    table = d.table(rows, cols, -2 * virtual_page, 1 << 20)
    pool, lens = d.requests(k.batch, rows, k.pages * k.page_size + 2 * k.page_size)
    arguments = dict(req_to_token=table, req_pool_indices=d.vector(pool), local_seq_lens=d.vector(lens),
                     out=d.output("out", (k.batch + d.integer(0, 3), k.pages + d.integer(0, 3))),
                     page_size=k.page_size, dcp_size=dcp_size, dcp_rank=dcp_rank, fill_value=None,
                     round_toward_zero=False, v2p=None)
    if k.options:
        arguments.update(fill_value=d.integer(-5, 5), round_toward_zero=d.flag())
        if d.flag():  # the unified pool's pages, some past it and some freed
            pages = d.values(-1, 1 << 16, (1 << 20) // virtual_page + d.integer(-3, 3))
            arguments.update(v2p=d.vector(pages, contiguous=True))
    return arguments


def _decode_metadata(d: _Draw, k: Knobs):
    rows, cols = k.batch + 2, k.pages * k.page_size + k.page_size // 2 + 1
    table = d.table(rows, cols, -2 * k.page_size, rows * cols)
    pool, lens = d.requests(k.batch, rows, cols + 2 * k.page_size)
    leading = d.flag()
    arguments = dict(req_to_token=table, req_pool_indices=d.vector(pool), seq_lens=d.vector(lens),
                     cache_seqlens=d.output("cache_seqlens", (k.batch + d.integer(0, 3),)),
                     cu_seqlens_k=d.output("cu_seqlens_k", (k.batch + leading,)), page_size=k.page_size,
                     seqlen_offset=d.integer(-3, 4), page_table=None, swa_page_table=None, full_to_swa=None,
                     full_v2p=None, swa_v2p=None, zero_tail=False, cu_seqlens_q=None, qlens=None, q_stride=None,
                     out_cache_loc=None, swa_out_cache_loc=None)
    out_rows = k.batch + d.integer(0, 3)
    if not k.options:
        arguments.update(page_table=d.output("page_table", (out_rows, k.pages + d.integer(0, 3))))
        return arguments
    mapping = d.vector(d.values(-5, 1 << 20, rows * cols + d.integer(-10, 10)), contiguous=True)
    v2p = d.vector(d.values(-1, 1 << 16, -(-rows * cols // k.page_size) + d.integer(-2, 3)), contiguous=True)
    page_map = d.flag()
    arguments.update(page_table=d.output("page_table", (out_rows, k.pages + d.integer(0, 3))),
                     swa_page_table=d.output("swa_page_table", (out_rows, k.pages + d.integer(-1, 3))),
                     full_to_swa=mapping, full_v2p=v2p if d.flag() else None, swa_v2p=v2p if page_map else None,
                     zero_tail=d.flag(), cu_seqlens_q=d.output("cu_seqlens_q", (k.batch + d.flag(),)),
                     out_cache_loc=d.vector(d.values(-3, rows * cols + 5, 3 * k.batch)),
                     swa_out_cache_loc=d.output("swa_out_cache_loc", (3 * k.batch + d.integer(-2, 3),), d.dtype()))
    if d.flag():
        arguments.update(qlens=d.vector(d.values(-2, 9, k.batch)))
    else:
        arguments.update(q_stride=d.integer(-5, 9))
    return arguments


BUILDERS = {
    "page_table": _page_table,
    "token_csr": _token_csr,
    "mha_page_table": _mha_page_table,
    "translated_page_table": _translated_page_table,
    "draft_decode": _draft_decode,
    "dcp_token_csr": _dcp_token_csr,
    "dcp_page_table": _dcp_page_table,
    "decode_metadata": _decode_metadata,
}


def _cache_locs(d: _Draw, k: Knobs):
    rows, cols = k.batch + 2, k.pages * k.page_size + 5
    table = d.table(rows, cols, -3, rows * cols)
    if k.options and d.flag():
        table = table.to(torch.int64)  # a window of cache locations read back
    pool, lens = d.requests(k.batch, rows, cols // 2 + 2)
    start = d.values(-2, cols, k.batch)
    packed = d.flag()
    width = None if packed else d.integer(0, cols // 2 + 2)
    # Sized from the layout alone (a graph replays new data in the same buffers): some slices cut at out's end.
    total = d.integer(0, k.batch * (cols // 2 + 2) + 4)
    arguments = dict(req_to_token=table, req_pool_indices=d.vector(pool), start_offset=d.vector(start),
                     out=d.output("out", (total,), d.dtype()), end_offset=d.vector(start + lens) if packed else None,
                     width=width, positions_out=None, page_size=k.page_size, full_v2p=None, full_out=None,
                     swa_v2p=None, swa_out=None)
    if k.options:
        pages = -(-rows * cols // k.page_size)
        arguments.update(positions_out=d.output("positions_out", (total,), d.dtype()),
                         full_v2p=d.vector(d.values(-2, 1 << 16, pages + d.integer(-2, 3)), contiguous=True),
                         full_out=d.output("full_out", (total,), d.dtype()),
                         swa_v2p=d.vector(d.values(-2, 1 << 16, pages + d.integer(-2, 3)), contiguous=True),
                         swa_out=d.output("swa_out", (total,), d.dtype()))
    return arguments


BUILDERS["cache_locs"] = _cache_locs


def _ragged_page_table(d: _Draw, k: Knobs):
    lengths = d.values(-3, (k.pages + 2) * k.page_size, k.batch)  # some empty, some past the table's width
    bounds = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lengths, 0)]) + d.integer(-2, 4)
    total = d.integer(0, k.batch * (k.pages + 2) * k.page_size + 1)  # the last rows may run past the end
    out_rows = k.batch + d.integer(0, 3)
    arguments = dict(kv_indices=d.vector(d.values(-2 * k.page_size, 1 << 12, total), contiguous=True),
                     kv_indptr=d.vector(bounds),
                     page_table=d.output("page_table", (out_rows, k.pages + d.integer(0, 3))), page_size=k.page_size,
                     swa_page_table=None, full_to_swa=None, round_toward_zero=False)
    if k.options:
        mapping = d.values(-5, 1 << 20, (1 << 12) + d.integer(-10, 10))
        arguments.update(swa_page_table=d.output("swa_page_table", (out_rows, k.pages + d.integer(-1, 3))),
                         full_to_swa=d.vector(mapping, contiguous=True), round_toward_zero=d.flag())
    return arguments


BUILDERS["ragged_page_table"] = _ragged_page_table


def _pa_swa_table(d: _Draw, k: Knobs):
    rows, cols = k.batch + 2, k.pages * 8 + 5
    table = d.table(rows, cols, -3, rows * cols)
    pool, lens = d.requests(k.batch, rows, cols + 9)
    window = d.integer(0, cols // 2 + 2)
    prefill = d.values(-2, cols // 2 + 3, rows + d.integer(-1, 2))  # some rows past it
    out_rows = k.batch + d.integer(0, 3)
    return dict(req_to_token=table, req_pool_indices=d.vector(pool), seq_lens=d.vector(lens),
                prefill_lens=d.vector(prefill, contiguous=True),
                out=d.output("out", (out_rows, window + cols // 2 + d.integer(-3, 3))),
                kv_lens_out=d.output("kv_lens_out", (out_rows,)), window_size=window)


BUILDERS["pa_swa_table"] = _pa_swa_table


def _merged_token_csr(d: _Draw, k: Knobs):
    prefix_lens = d.values(-2, k.pages * 8, k.batch)  # some negative: bounds going back
    bounds = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(prefix_lens, 0)]) + d.integer(-1, 3)
    # The lengths of the index streams and of out come from the layout (a graph replays new data in the same
    # buffers): the last rows may run past their ends.
    prefix_count = d.integer(0, k.batch * k.pages * 8 + 3)
    extend_lens = d.values(-2, 12, k.batch)
    extend_count = d.integer(-3, k.batch * 11 + 4)
    starts = d.values(-1, max(extend_count, 1) + 2, k.batch)
    room = k.batch * (k.pages * 8 + 11) // 2
    return dict(prefix_kv_indptr=d.vector(bounds), prefix_kv_indices=d.vector(d.values(-5, 1 << 20, prefix_count),
                                                                              contiguous=True),
                extend_start_loc=d.vector(starts), extend_seq_lens=d.vector(extend_lens),
                extend_kv_indices=d.vector(d.values(-5, 1 << 20, max(extend_count, 0)), contiguous=True),
                kv_indptr_out=d.output("kv_indptr_out", (k.batch + 1 + d.integer(0, 3),), d.dtype()),
                out=d.output("out", (max(room + d.integer(-6, 6), 0),), d.dtype()))


BUILDERS["merged_token_csr"] = _merged_token_csr


def _spec_concat_page_table(d: _Draw, k: Knobs):
    draft = d.integer(1, 4)
    rows = k.batch * draft
    width_a, width_b = k.pages * 4 + d.integer(0, 3), d.integer(1, 6)
    lens_a = d.spoil(d.values(-2, width_a + 3, k.batch), torch.int64)  # some past the table's width
    lens_b = d.values(-2, width_b + 3, rows)
    return dict(page_table_a=d.table(k.batch + d.integer(0, 2), width_a, -5, 1 << 20),
                page_table_b=d.table(rows + d.integer(0, 2), width_b, -5, 1 << 20),
                seq_lens_a=d.vector(lens_a), seq_lens_b=d.vector(lens_b),
                out=d.output("out", (rows + d.integer(0, 3), width_a + width_b + d.integer(-4, 3))),
                draft_tokens=draft)


BUILDERS["spec_concat_page_table"] = _spec_concat_page_table


def _compact_draft_rows(d: _Draw, k: Knobs):
    rows, cols = k.batch + 3, k.pages * k.page_size + 5
    target = d.table(rows + d.integer(-1, 2), cols + d.integer(-4, 5), -3, rows * cols)
    if k.options and d.flag():
        target = target.to(torch.int64)
    width = d.integer(0, 9)
    pool = torch.randperm(rows, generator=d.data)[: k.batch]  # distinct rows: requests never share one
    bad = torch.tensor([-1, rows, rows + 3])[d.values(0, 3, k.batch)]
    pool = torch.where(d.values(0, 5, k.batch) == 0, bad, pool)
    lens = d.values(-3, cols - width + 3, k.batch)  # some rows cut at the draft table's end
    start = d.values(-2, target.shape[1], k.batch)
    verify = d.values(-3, 1 << 20, k.batch * (width + 2)).view(k.batch, width + 2)
    verify = d.spoil(verify, torch.int64)[:, : width + d.integer(0, 3) * d.flag()]  # now and then a wider stride
    draft = d.output("draft_req_to_token", (rows, cols), d.dtype())
    return dict(target_req_to_token=target, req_pool_indices=d.vector(pool), suffix_start=d.vector(start),
                draft_prefix_lens=d.vector(lens), verify_locs=verify.to(d.dtype()).to(d.device),
                draft_req_to_token=draft)


BUILDERS["compact_draft_rows"] = _compact_draft_rows


def build(key: str, seed: int, knobs: Knobs = Knobs(), *, device="cpu", hostile=False, data_seed=None) -> OpCase:
    """A fresh case of op ``key`` (the module docstring); KeyError for an op without a builder."""
    d = _Draw(seed, data_seed, torch.device(device), hostile)
    arguments = BUILDERS[key](d, knobs)
    parameters = dispatch.OPS[key].parameters
    assert tuple(arguments) == parameters, f"{key}: the builder's arguments are not the op's parameters"
    return OpCase(key, arguments, d.allocations)


# -- the unified pool's read tables and the page-granular draft decode: options of existing ops --------------

def _translated_page_table_with_fill(d: _Draw, k: Knobs):
    arguments = _translated_page_table(d, k)
    arguments["fill_value"] = d.integer(-5, 5) if k.options else None
    return arguments


BUILDERS["translated_page_table"] = _translated_page_table_with_fill


def _token_csr_translated(d: _Draw, k: Knobs):
    """The token CSR through ``v2p`` (the unified pool's packed read stream): a token-granular table, pages of
    ``k.page_size``."""
    rows, cols = k.batch + 2, k.pages * k.page_size + 3
    table = d.table(rows, cols, -3, rows * cols)
    pool, lens = d.requests(k.batch, rows, cols + 4)
    pool, lens = d.vector(pool), d.vector(lens)
    indptr, total = _csr_indptr(d, lens.cpu().long().clamp(0, cols), cols)
    v2p = d.values(-1, 1 << 20, -(-rows * cols // k.page_size) + d.integer(-2, 3))  # some pages past it
    return dict(req_to_token=table, req_pool_indices=pool, seq_lens=lens, kv_indptr=indptr,
                out=d.output("out", (total,), d.dtype()), kv_start_idx=d.vector(d.values(0, cols + 3, k.batch)),
                entry_page_size=1, token_mapping=None, v2p=d.vector(v2p, contiguous=True), page_size=k.page_size)


def _token_csr_with_v2p(d: _Draw, k: Knobs):
    if k.options and d.flag():
        return _token_csr_translated(d, k)
    return dict(_token_csr(d, k), v2p=None, page_size=1)


BUILDERS["token_csr"] = _token_csr_with_v2p


def _draft_decode_with_entry_pages(d: _Draw, k: Knobs):
    """With options, now and then a page-granular table (``entry_page_size``: its rows' positions are ``C * E``)
    and the per-step window (``step_window``)."""
    arguments = _draft_decode(d, k)
    entry_page_size = d.integer(2, 5) if k.options and d.flag() else 1
    arguments["entry_page_size"] = entry_page_size
    arguments["step_window"] = 0
    if k.options and d.flag():  # the per-step window in place of the prefix window
        arguments.update(window_size=0, sink_size=0, step_window=d.integer(1, 40))
    return arguments


BUILDERS["draft_decode"] = _draft_decode_with_entry_pages


def _compact_csr(d: _Draw, k: Knobs):
    """A token table read every ``row_step`` rows, or (options) one DCP rank's share of a flat CSR: one row,
    ``source_indptr`` its row starts, ``offset`` the rank, ``step`` the DCP size; zero lengths get a placeholder
    now and then, and ``max_count`` cuts some rows."""
    row_step = d.integer(0, 3)
    rows, cols = k.batch * max(row_step, 1) + d.integer(-1, 2), k.pages * 8 + 3
    step, offset, starts, max_count = 1, 0, None, None
    if k.options:
        step = d.integer(1, 5)
        offset = d.integer(0, step)
        rows, row_step = 1, 0
        starts = d.values(-2, cols, k.batch)
        max_count = d.integer(0, cols // step + 2) if d.flag() else None
    source = d.table(max(rows, 1), cols, -3, 1 << 20)
    lens = d.requests(k.batch, 1, -(-cols // step) + 3)[1]
    lens, fill = d.vector(lens), (d.integer(-5, 5) if d.flag() else None)
    room = lens.cpu().long().clamp(1, -(-cols // step))
    indptr, total = _csr_indptr(d, room, -(-cols // step))
    return dict(source=source, lens=lens, kv_indptr=indptr, out=d.output("out", (total,), d.dtype()),
                row_step=row_step, source_indptr=None if starts is None else d.vector(starts), offset=offset,
                step=step, empty_fill=fill, max_count=max_count)


BUILDERS["compact_csr"] = _compact_csr


def _prefix_extend_csr(d: _Draw, k: Knobs):
    """Prefix and extend runs of mixed lengths (some negative), starts anywhere; rows back to back with room for
    both runs; with options an ``extend_base`` at the int64 edges now and then."""
    most = k.pages * 8 + 3
    prefix, extend = (d.requests(k.batch, 1, most)[1] for _ in range(2))
    prefix, extend = d.vector(prefix), d.vector(extend)
    room = prefix.cpu().long().clamp(min=0) + extend.cpu().long().clamp(min=0)
    indptr, total = _csr_indptr(d, room, 2 * most)
    # Rows whose extreme lengths run over other rows (a row moved to a negative extreme reaching back into out,
    # or a length past the row's room) would overlap them, and overlapping rows' entries are any covering
    # row's: each row overlapping an earlier row's entries in out writes nothing here.
    counts = (prefix.cpu().long().clamp(0, 2**61) + extend.cpu().long().clamp(0, 2**61)).tolist()
    written, overlapping = [], []
    for start, count in zip(indptr[:k.batch].cpu().tolist(), counts):
        low, high = max(start, 0), min(start + count, total)
        clash = low < high and any(low < end and begin < high for begin, end in written)
        overlapping.append(clash)
        if low < high and not clash:
            written.append((low, high))
    reaching = torch.tensor(overlapping, dtype=torch.bool).to(prefix.device)
    prefix.masked_fill_(reaching, 0)
    extend.masked_fill_(reaching, 0)
    base = (0, 2**63 - 5, -(2**63), 1 << 33)[d.integer(0, 4)] if k.options else d.integer(0, 1000)
    return dict(prefix_lens=prefix, prefix_starts=d.vector(d.values(-5, 1 << 20, k.batch)), extend_lens=extend,
                extend_starts=d.vector(d.values(-5, 1 << 20, k.batch)), kv_indptr=indptr,
                out=d.output("out", (total,), d.dtype()), extend_base=base)


BUILDERS["prefix_extend_csr"] = _prefix_extend_csr
