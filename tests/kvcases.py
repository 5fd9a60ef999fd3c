"""Random test cases and an independent plain-Python-loop oracle, shared by every backend's tests.

Cases are drawn fresh per call from a simulated page pool: each request owns shuffled physical pages,
slots are ``page * page_size + offset``; never zeros, never square.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

POISON = -123456789  # written into every output before a call; must survive wherever nothing is written


@dataclass
class Case:
    req_to_token: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    page_size: int
    width: int
    kv_start_idx: torch.Tensor | None = None
    seqlen_offset: int = 0
    fill_value: int | None = None
    out_rows: int = 0
    out_stride: int = 0
    options: dict = field(default_factory=dict)

    @property
    def batch(self) -> int:
        return self.req_pool_indices.shape[0]

    def page_table_out(self) -> torch.Tensor:
        """A poisoned output, strided when ``out_stride > width``, with spare rows past the batch."""
        rows = max(self.out_rows, self.batch)
        store = torch.full((rows, max(self.out_stride, self.width)), POISON, dtype=torch.int32,
                           device=self.req_to_token.device)
        return store[:, : self.width]

    def seq_lens_out(self) -> torch.Tensor:
        return torch.full((self.batch + 2,), POISON, dtype=torch.int32, device=self.req_to_token.device)

    def csr(self, gap: int = 3):
        """``kv_indptr`` with random gaps between rows and a poisoned ``out`` covering all of them."""
        lengths = self.seq_lens.long().clamp(min=0).cpu()
        gaps = torch.randint(0, gap + 1, (self.batch,))
        starts = torch.cumsum(lengths + gaps, 0) - lengths
        indptr = torch.cat([starts, starts[-1:] + lengths[-1:]]) if self.batch else torch.zeros(1, dtype=torch.long)
        total = int(indptr[-1]) + gap if self.batch else gap
        out = torch.full((total,), POISON, dtype=torch.int32, device=self.req_to_token.device)
        return indptr.to(self.seq_lens.dtype).to(self.req_to_token.device), out


def make_case(batch, page_size, *, max_pages=6, index_dtype=torch.int32, with_start=False, strided_table=False,
              strided_out=False, seqlen_offset=0, fill_value=None, device="cpu", generator=None,
              width=None) -> Case:
    """A random page-pool case: ``batch`` requests of up to ``max_pages`` pages each."""
    g = generator if generator is not None else torch.Generator().manual_seed(torch.seed() % 2**31)
    spare_rows = int(torch.randint(1, 5, (1,), generator=g))
    rows = batch + spare_rows
    margin = page_size * 2 if with_start else 0
    cols = max_pages * page_size + margin + int(torch.randint(0, page_size, (1,), generator=g))
    n_pages = rows * (cols // page_size + 1) + 7
    pages = torch.randperm(n_pages, generator=g)[: rows * (cols // page_size + 1)].view(rows, -1)
    slots = (pages[:, :, None] * page_size + torch.arange(page_size)).reshape(rows, -1)[:, :cols]
    stride = cols + (int(torch.randint(1, 9, (1,), generator=g)) if strided_table else 0)
    table = torch.full((rows, stride), POISON, dtype=torch.int32)
    table[:, :cols] = slots.to(torch.int32)
    table = table[:, :cols]

    pool = torch.randperm(rows, generator=g)[:batch]
    lengths = torch.randint(1, max_pages * page_size + 1, (batch,), generator=g)
    start = None
    if with_start:
        start = torch.randint(0, margin + 1, (batch,), generator=g)
    if width is None:
        width = max_pages + int(torch.randint(0, 3, (1,), generator=g)) + (1 if with_start else 0)
    to = dict(dtype=index_dtype, device=device)
    return Case(
        req_to_token=table.to(device), req_pool_indices=pool.to(**to), seq_lens=lengths.to(**to),
        page_size=page_size, width=width,
        kv_start_idx=start.to(**to) if start is not None else None,
        seqlen_offset=seqlen_offset, fill_value=fill_value,
        out_rows=batch + int(torch.randint(0, 3, (1,), generator=g)),
        out_stride=width + (int(torch.randint(1, 5, (1,), generator=g)) if strided_out else 0),
    )


def assert_same(actual, expected, what):
    """``actual`` equals ``expected`` exactly (either on any device); else an error naming the first difference."""
    actual, expected = actual.cpu(), expected.cpu()
    if not torch.equal(actual, expected):
        bad = (actual != expected).nonzero()
        first = tuple(bad[0].tolist())
        raise AssertionError(f"{what}: {bad.shape[0]} entries differ; first at {first}: "
                             f"got {int(actual[first])}, expected {int(expected[first])}"
                             f"{' (POISON: never written)' if int(actual[first]) == POISON else ''}")


def wrap_int32(value: int) -> int:
    """The low 32 bits of ``value`` as a signed int32 (what ``seq_lens_out`` holds of an exact sum)."""
    return (value + 2**31) % 2**32 - 2**31


def loop_page_table(case: Case, out: torch.Tensor, seq_lens_out=None, round_toward_zero=False) -> torch.Tensor:
    """The contract written as a plain loop (independent of kvdispatch.reference); ``round_toward_zero``:
    slots divided by the page size rounding toward zero, else down."""
    table = case.req_to_token.cpu().tolist()
    rows, cols = case.req_to_token.shape
    result = out.cpu().clone()
    for b in range(case.batch):
        pool = int(case.req_pool_indices[b])
        length = int(case.seq_lens[b]) + case.seqlen_offset
        if seq_lens_out is not None:
            seq_lens_out[b] = wrap_int32(length)
        start = int(case.kv_start_idx[b]) if case.kv_start_idx is not None else 0
        pages = 0 if length <= 0 else (length + case.page_size - 1) // case.page_size
        for p in range(case.width):
            pos = start + p * case.page_size
            readable = 0 <= pool < rows and 0 <= pos < cols
            if p < pages and readable:
                slot = table[pool][pos]
                if round_toward_zero and slot < 0:
                    result[b, p] = -(-slot // case.page_size)
                else:
                    result[b, p] = slot // case.page_size
            else:
                pages = min(pages, p)  # the row ends at the first unreadable position
                if case.fill_value is not None:
                    result[b, p] = case.fill_value
    return result


def loop_token_csr(case: Case, indptr: torch.Tensor, out: torch.Tensor, entry_page_size: int = 1,
                   token_mapping: torch.Tensor | None = None) -> torch.Tensor:
    """The token CSR contract as a plain loop over exact Python integers: a row has ``C * entry_page_size``
    positions, position ``q`` reads entry ``q // E`` and gives ``entry * E + q % E``, mapped through
    ``token_mapping`` (-1 outside it), stored as ``out``'s dtype holds it (int32: the low 32 bits)."""
    table = case.req_to_token.cpu().tolist()
    mapping = None if token_mapping is None else token_mapping.cpu().tolist()
    rows, cols = case.req_to_token.shape
    positions = cols * entry_page_size
    result = out.cpu().clone()
    narrow = result.dtype == torch.int32
    for b in range(case.batch):
        pool = int(case.req_pool_indices[b])
        start = int(case.kv_start_idx[b]) if case.kv_start_idx is not None else 0
        first, length = int(indptr[b]), int(case.seq_lens[b])
        if not (0 <= pool < rows and 0 <= start < positions):
            continue  # an empty row
        # Only tokens that land in out matter: iterate over those (lengths may be near 2**63).
        for j in range(max(0, -first), min(length, result.shape[0] - first)):
            pos = start + j
            if pos >= positions:
                break
            value = table[pool][pos // entry_page_size] * entry_page_size + pos % entry_page_size
            if mapping is not None:
                value = mapping[value] if 0 <= value < len(mapping) else -1
            result[first + j] = wrap_int32(value) if narrow else value
    return result


def byte_span(t: torch.Tensor):
    """``(first byte, past the last)`` of the elements of ``t``, or None when it has none (the contract's
    definition of the memory a tensor occupies, gaps of a strided view included)."""
    if t.numel() == 0:
        return None
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()


def spans_meet(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` share a byte of memory."""
    sa, sb = byte_span(a), byte_span(b)
    return sa is not None and sb is not None and sa[0] < sb[1] and sb[0] < sa[1]


def overlapping_pairs(outputs: dict, inputs: dict) -> set:
    """``{(output name, other name)}``: every output against every input and every other output; None
    values are absent tensors."""
    outputs = {k: v for k, v in outputs.items() if v is not None}
    others = {**{k: v for k, v in inputs.items() if v is not None}, **outputs}
    return {(o, n) for o, t in outputs.items() for n, u in others.items() if n != o and spans_meet(t, u)}


def named_overlap(message: str) -> tuple:
    """``(output, other)`` as the validator's "<output> shares memory with <other> (...)" names them."""
    output, _, rest = message.partition(" shares memory with ")
    return output, rest.split(" ")[0]


def place_in_one_buffer(tensors, generator, spread=1.5):
    """``(views, buffer)``: ``tensors`` (1-D or 2-D int32/int64 tensors on one device, or None) as views
    with the same shapes, strides and values at random offsets of one shared int64 ``buffer``, ``spread``
    times the size they need together, so that some of them share memory; None entries stay None.
    Values are copied in order: where views overlap, later ones win."""
    def extent(t):  # elements from the first to the last
        return 0 if t.numel() == 0 else 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))

    present = [t for t in tensors if t is not None]
    words = int(spread * sum(extent(t) for t in present)) + 8  # int64 words: room for every int32 too
    buffer = torch.zeros(words, dtype=torch.int64, device=present[0].device)
    views = {torch.int64: buffer, torch.int32: buffer.view(torch.int32)}
    placed = []
    for t in tensors:
        if t is None:
            placed.append(None)
            continue
        base = views[t.dtype]
        offset = int(torch.randint(0, base.shape[0] - extent(t) + 1, (1,), generator=generator))
        view = base.as_strided(t.shape, t.stride(), offset)
        view.copy_(t)
        placed.append(view)
    return placed, buffer
