"""The unified pool's read-table and draft options: ``create_translated_page_table(fill_value=...)``,
``create_flashinfer_kv_indices(v2p=..., page_size=...)`` (the packed read stream),
``create_draft_decode_kv_indices(entry_page_size=...)`` (a page-granular source table).

The reference against plain loops over exact integers (``test_mapped_page_tables.loop_translated``, then the
fill), every backend under test against the reference into outputs in the middle of poisoned allocations, the
options' argument errors.
"""

import pytest
import torch

from conftest import BACKENDS, token_csr, translated_page_table
from kvcases import POISON, assert_same
from kvdispatch import ops
from test_extremes import I32_MAX, I32_MIN, copy_to_device, guarded, middle
from kvdispatch.grid import DRAFT_OFFSET_LIMIT as LIMIT
from test_mapped_page_tables import (PAGE_SIZES, _cdiv, _row_pages, draw, generator, loop_translated, random_lookup,
                                     random_requests, random_table)


def loop_filled(table, pool, lens, v2p, out, page_size, max_pages, seq_len_delta, fill_value):
    """``loop_translated``, then ``fill_value`` in each row's columns past its pages up to ``max_pages``."""
    result = loop_translated(table, pool, lens, v2p, out, page_size, 1, max_pages, seq_len_delta)
    columns = out.shape[1] if max_pages is None else max_pages
    rows = table.tolist()
    for b, (row, length) in enumerate(zip(pool.tolist(), lens.tolist())):
        result[b, min(_row_pages(rows, row, length + seq_len_delta, page_size), columns):columns] = fill_value
    return result


@pytest.mark.representative("max_pages")
@pytest.mark.parametrize("backend", [None, *BACKENDS])
@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("max_pages,seq_len_delta,fill_value", [(None, 0, 0), ("some", 3, -1), ("all", -2, I32_MAX),
                                                                (None, 0, I32_MIN)])
def test_translated_fill(backend, page_size, max_pages, seq_len_delta, fill_value):
    """``backend`` None: the reference against the loop; else the backend against the reference (rows past the
    batch and columns past ``max_pages`` untouched)."""
    g = generator()
    table = random_table(page_size, g)
    pool, lens = random_requests(table, page_size, torch.int64, g)
    v2p = random_lookup(torch.int64, _cdiv(table.numel(), page_size) + 1, g)
    width = _cdiv(table.shape[1], page_size) + int(draw(0, 3, 1, g))
    pages = dict(some=int(draw(0, width + 1, 1, g)), all=width).get(max_pages)
    rows = pool.shape[0] + 2
    store, view = guarded((rows, width))
    expected = store.cpu().clone()
    ops.translated_page_table.reference(table, pool, lens, v2p, middle(expected, (rows, width)), page_size, 1, pages,
                                        seq_len_delta, fill_value)
    if backend is None:
        loop = loop_filled(table, pool, lens, v2p, torch.full((rows, width), POISON, dtype=torch.int32), page_size,
                           pages, seq_len_delta, fill_value)
        assert_same(middle(expected, (rows, width)), loop, "reference vs loop")
        return
    move = copy_to_device
    translated_page_table(backend, move(table), move(pool), move(lens), move(v2p), view, page_size=page_size,
                          max_pages=pages, seq_len_delta=seq_len_delta, fill_value=fill_value)
    assert_same(store, expected, f"{backend} filled translated page table (whole allocation)")


@pytest.mark.parametrize("fill_value,error", [(1.0, TypeError), (True, TypeError), (2**31, ValueError),
                                              (I32_MIN - 1, ValueError)])
def test_translated_fill_argument_errors(fill_value, error):
    import kvdispatch

    table = torch.zeros((2, 32), dtype=torch.int32)
    out = torch.full((2, 4), POISON, dtype=torch.int32)
    with pytest.raises(error, match="fill_value"):
        kvdispatch.create_translated_page_table(table, torch.zeros(2, dtype=torch.int64),
                                                torch.ones(2, dtype=torch.int64), torch.arange(4), out, page_size=16,
                                                fill_value=fill_value)
    assert (out == POISON).all()


def loop_packed(table, pool, lens, indptr, out, start, v2p, page_size):
    """The packed read stream as plain loops over exact integers; returns the expected ``out``."""
    rows, result, lookup = table.tolist(), out.clone(), v2p.tolist()
    bits = 64 if out.dtype == torch.int64 else 32
    for b, (row, length, first) in enumerate(zip(pool.tolist(), lens.tolist(), start.tolist())):
        if not 0 <= row < len(rows) or not 0 <= first < table.shape[1]:
            continue
        for j in range(min(max(length, 0), table.shape[1] - first)):
            q, target = first + j, int(indptr[b]) + j
            if not 0 <= target < out.shape[0]:
                continue
            slot = rows[row][q - q % page_size]
            page = 0 if slot < 0 else slot // page_size
            entry = max(lookup[page], 0) if page < len(lookup) else 0
            value = (entry * page_size + q % page_size) % 2**bits
            result[target] = value - 2**bits if value >= 2**(bits - 1) else value
    return result


@pytest.mark.representative("lookup")
@pytest.mark.parametrize("backend", [None, *BACKENDS])
@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("out_dtype", (torch.int32, torch.int64))
@pytest.mark.parametrize("lookup", ("random", "extremes", "empty"))
def test_packed_read_stream(backend, page_size, out_dtype, lookup):
    """``backend`` None: the reference against the loop; else the backend against the reference, into the middle
    of a poisoned allocation, rows crossing its ends, bad pool indices and starts."""
    g = generator()
    table = random_table(page_size, g)
    pool, lens = random_requests(table, page_size, torch.int64, g)
    batch, cols = pool.shape[0], table.shape[1]
    start = draw(0, cols + 2, batch, g)
    room = lens.clamp(0, cols) + draw(0, 3, batch, g)  # rows apart (valid CSR), the first from before out
    indptr = torch.cumsum(room, 0) - room - 2
    v2p = dict(random=random_lookup(torch.int64, _cdiv(table.numel(), page_size) - 1, g),
               extremes=torch.tensor([2**63 - 1, -2**63, -1, 2**31, 2**31 - 1, 5] * 4, dtype=torch.int64),
               empty=torch.zeros(0, dtype=torch.int32))[lookup]
    total = 2 * cols
    store = torch.full((total + 8,), POISON, dtype=out_dtype)
    view = store[4: 4 + total]
    expected = store.clone()
    ops.token_csr.reference(table, pool, lens, indptr, expected[4: 4 + total], start, 1, None, v2p, page_size)
    if backend is None:
        loop = loop_packed(table, pool, lens, indptr, torch.full((total,), POISON, dtype=out_dtype), start, v2p,
                           page_size)
        assert_same(expected[4: 4 + total], loop, "reference vs loop")
        return
    move = copy_to_device
    moved = move(store)
    token_csr(backend, move(table), move(pool), move(lens), move(indptr), moved[4: 4 + total],
              kv_start_idx=move(start), v2p=move(v2p), page_size=page_size)
    assert_same(moved, expected, f"{backend} packed read stream (whole allocation)")
    del view


def test_packed_read_stream_argument_errors():
    import kvdispatch

    table = torch.zeros((2, 32), dtype=torch.int32)
    common = (table, torch.zeros(2, dtype=torch.int64), torch.ones(2, dtype=torch.int64), torch.zeros(3))
    out = torch.full((4,), POISON, dtype=torch.int32)
    for options, error, name in ((dict(v2p=torch.arange(4), page_size=0), ValueError, "page_size"),
                                 (dict(page_size=0), ValueError, "page_size"), (dict(page_size=True), TypeError,
                                                                                "page_size"),
                                 (dict(v2p=torch.arange(4), page_size=2.0), TypeError, "page_size"),
                                 (dict(v2p=torch.arange(4).float()), TypeError, "v2p"),
                                 (dict(v2p=torch.arange(8)[::2]), ValueError, "v2p"),
                                 (dict(v2p=torch.arange(4), entry_page_size=2), ValueError, "entry_page_size"),
                                 (dict(v2p=torch.arange(4), token_mapping=torch.arange(4)), ValueError,
                                  "token_mapping"),
                                 (dict(v2p=out), ValueError, "v2p")):
        with pytest.raises(error, match=name):
            kvdispatch.create_flashinfer_kv_indices(*common[:3], common[3].long(), out, **options)
    assert (out == POISON).all()


@pytest.mark.representative("option")
@pytest.mark.parametrize("backend", [None, *BACKENDS])
@pytest.mark.parametrize("entry_page_size", (2, 16, 7))
@pytest.mark.parametrize("option", ("plain", "window", "v2p", "all"))
def test_draft_decode_entry_pages(backend, entry_page_size, option):
    """A page-granular table is the token-granular one it stands for (``row[q // E] * E + q % E``): ``backend``
    None, the reference against ``test_draft_decode``'s loop over that expanded table; else the backend against
    the reference, on bad data too."""
    from test_draft_decode import check, loop_draft_decode, random_case, used_width

    g = generator()
    for page_size, bad in ((1, False), (16, True), (7, True)):
        case = random_case(g, torch.int64, page_size, window=option in ("window", "all"),
                           positions=option == "all", v2p=torch.int64 if option in ("v2p", "all") else None, bad=bad)
        case["entry_page_size"] = entry_page_size
        if backend is not None:
            check(backend, case, torch.int64, torch.int32, loop=False)
            continue
        table = case["req_to_token"].long()
        position = torch.arange(table.shape[1] * entry_page_size)
        expanded = table.repeat_interleave(entry_page_size, 1) * entry_page_size + position % entry_page_size
        steps, width = case["num_steps"], used_width(case)
        out = torch.full((steps, width), POISON, dtype=torch.int64)
        indptr = torch.full((steps, case["req_pool_indices"].shape[0] * case["topk"] + 1), POISON, dtype=torch.int32)
        looped, looped_indptr = loop_draft_decode(dict(case, req_to_token=expanded), out, indptr)
        options = {k: v for k, v in case.items() if k not in ("req_to_token", "req_pool_indices", "seq_lens")}
        ops.draft_decode.reference(case["req_to_token"], case["req_pool_indices"], case["seq_lens"], indptr, out,
                                   **options)
        assert_same(out, looped, "reference out vs loop")
        assert_same(indptr, looped_indptr, "reference kv_indptr vs loop")


def test_debug_checks_name_the_request(monkeypatch):
    """``KVDISPATCH_DEBUG``: a virtual page past ``v2p`` in the packed stream, a draft slot past a page-granular
    row's positions; a fill changes nothing the checks see."""
    import kvdispatch
    from kvdispatch import _debug

    monkeypatch.setattr(_debug, "ENABLED", True)
    table = torch.arange(64, dtype=torch.int32).view(2, 32)
    pool, lens = torch.tensor([0, 1]), torch.tensor([4, 20])
    out = torch.full((40,), POISON, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"request 1: req_to_token\[1, 16\] = 48 is virtual page 3, outside v2p"):
        kvdispatch.create_flashinfer_kv_indices(table, pool, lens, torch.tensor([0, 4]), out, v2p=torch.arange(3),
                                                page_size=16, backend="torch")
    assert (out == POISON).all()
    kvdispatch.create_flashinfer_kv_indices(table, pool, lens, torch.tensor([0, 4]), out, v2p=torch.arange(4),
                                            page_size=16, backend="torch")
    draft_out = torch.full((2, 200), POISON, dtype=torch.int64)
    indptr = torch.zeros((2, 3), dtype=torch.int32)
    with pytest.raises(ValueError, match="request 1: draft slots up to position 64 .* 64 positions"):
        kvdispatch.create_draft_decode_kv_indices(table[:, :4], pool, torch.tensor([4, 63]), indptr, draft_out,
                                                  num_steps=2, topk=1, page_size=16, entry_page_size=16,
                                                  backend="torch")
    assert (draft_out == POISON).all()
    page_out = torch.full((2, 3), POISON, dtype=torch.int32)
    kvdispatch.create_translated_page_table(table, pool, lens, torch.arange(4), page_out, page_size=16, fill_value=0,
                                            backend="torch")
    assert page_out.tolist() == [[0, 0, 0], [2, 3, 0]]


def loop_step_window(case, out, indptr):
    """The step window as a plain loop over exact integers (SGLang's per-step window rail, bounded): fills CPU
    copies of ``out`` and ``indptr`` and returns them."""
    table = case["req_to_token"].tolist()
    rows, cols = case["req_to_token"].shape
    cols *= case["entry_page_size"]
    pool, lens = case["req_pool_indices"].tolist(), case["seq_lens"].tolist()
    steps, topk, page, window = case["num_steps"], case["topk"], case["page_size"], case["step_window"]
    entry_page_size = case["entry_page_size"]
    positions = None if case["positions"] is None else case["positions"].tolist()
    out, indptr = out.clone(), indptr.clone()

    def read(b, q):
        value = table[pool[b]][q // entry_page_size] * entry_page_size + q % entry_page_size
        return value if out.dtype == torch.int64 else (value + 2**31) % 2**32 - 2**31

    for s in range(steps):
        it, offset = s + 1, 0
        if case["write_indptr_start"] and lens:
            indptr[s, 0] = 0
        for b, length in enumerate(lens):
            remainder = length - page * int(length / page) if case["round_toward_zero"] else length % page
            owned = -(-(remainder + steps) // page) * page
            keep = min(max(length, 0) + it, window)
            chain = min(it, window)
            for k in range(topk):
                entries = [length - (keep - chain) + i for i in range(keep - chain)]
                entries += [length + k * owned + j for j in range(it - chain, it)]
                for e, q in enumerate(entries):
                    if offset + e < out.shape[1] and 0 <= pool[b] < rows and 0 <= q < cols:
                        out[s, offset + e] = read(b, q)
                offset += keep
                z = b * topk + k
                counted = offset if positions is None else sum(min(max(p, 0) + it, window) for p in positions[: z + 1])
                indptr[s, z + 1] = min(counted, LIMIT)
    return out, indptr


def check_step_window_reference(case):
    """The reference against ``loop_step_window`` on ``case`` (CPU tensors, ``step_window`` set), into poisoned
    outputs wide enough for every step."""
    steps, segments = case["num_steps"], case["req_pool_indices"].shape[0] * case["topk"]
    out = torch.full((steps, segments * case["step_window"] + 2), POISON, dtype=torch.int64)
    indptr = torch.full((steps, segments + 2), POISON, dtype=torch.int32)
    looped, looped_indptr = loop_step_window(case, out, indptr)
    options = {k: v for k, v in case.items() if k not in ("req_to_token", "req_pool_indices", "seq_lens")}
    ops.draft_decode.reference(case["req_to_token"], case["req_pool_indices"], case["seq_lens"], indptr, out,
                               **options)
    assert_same(out, looped, "reference out vs loop")
    assert_same(indptr, looped_indptr, "reference kv_indptr vs loop")


@pytest.mark.representative("window")
@pytest.mark.parametrize("backend", [None, *BACKENDS])
@pytest.mark.parametrize("window", (1, 3, 30))
@pytest.mark.parametrize("option", ("plain", "positions", "entry_pages", "v2p", "narrow_out"))
def test_draft_decode_step_window(backend, window, option):
    """``backend`` None: the reference against the loop (without v2p); else the backend against the reference,
    bad data included, into guarded outputs (``narrow_out``: a third of the width the steps use, so that
    segments are cut at its end)."""
    from test_draft_decode import check, random_case, used_width

    g = generator()
    for page_size, bad in ((1, False), (16, True), (7, True)):
        case = random_case(g, torch.int64, page_size, positions=option == "positions",
                           v2p=torch.int64 if option == "v2p" else None, bad=bad)
        case.update(entry_page_size=4 if option == "entry_pages" else 1, step_window=window)
        if backend is not None:
            width = max(1, used_width(case) // 3) if option == "narrow_out" else None
            check(backend, case, torch.int64, torch.int32, width=width, loop=False)
            continue
        if option == "v2p":
            continue
        check_step_window_reference(case)


@pytest.mark.parametrize("backend", [None, *BACKENDS])
@pytest.mark.parametrize("window", (5, 40))
def test_draft_decode_step_window_many_steps(backend, window):
    """More steps than a kernel takes side by side and than it loads draft slots per pass (19), with a window
    shorter and longer than the steps: ``backend`` None: the reference against the loop; else the backend
    against the reference."""
    from test_draft_decode import check, random_case

    g = generator()
    for page_size, bad in ((1, False), (16, True)):
        case = random_case(g, torch.int64, page_size, steps=19, positions=page_size > 1, bad=bad)
        # Room past every request's length for its branches' draft slots.
        table = case["req_to_token"]
        room = draw(-3, 5000, table.shape[0] * 4 * 19 * page_size, g).view(table.shape[0], -1).to(table.dtype)
        case.update(req_to_token=torch.cat([table, room], 1), entry_page_size=1, step_window=window)
        if backend is None:
            check_step_window_reference(case)
        else:
            check(backend, case, torch.int64, torch.int32, loop=False)


def test_draft_decode_step_window_argument_errors():
    import kvdispatch

    table = torch.zeros((2, 8), dtype=torch.int32)
    out, indptr = torch.full((2, 8), POISON, dtype=torch.int64), torch.zeros((2, 2), dtype=torch.int32)
    common = (table, torch.zeros(1, dtype=torch.int64), torch.ones(1, dtype=torch.int64), indptr, out)
    for options, error in ((dict(step_window=-1), ValueError), (dict(step_window=2.0), TypeError),
                           (dict(step_window=3, window_size=2), ValueError)):
        with pytest.raises(error, match="step_window"):
            kvdispatch.create_draft_decode_kv_indices(*common, num_steps=2, topk=1, **options)
    assert (out == POISON).all()
