"""SGLang 0.5.23's unified-pool read tables and page-granular draft decode through ``kvdispatch.compat.sglang``,
against the release's own functions and kernels (Triton's interpreter on CPU), element for element, on the call
patterns of ``KVIndexTranslator`` (``build_iteration_table``: a fresh or reused table with ``zero_tail=True``
and the read extent as ``seq_len_delta``).
"""

from __future__ import annotations

import pytest
import torch

from conftest import BACKENDS, DEVICE
from kvcases import POISON
from test_sglang_against_release import ROOT, _generator, _pool, _same, _twins
from test_sglang_against_release import release  # noqa: F401  (the fixture)

pytestmark = pytest.mark.skipif(ROOT is None, reason="SGLang's source is not here (set SGLANG_SOURCE)")


def _v2p(pages, g):
    """An int64 virtual-to-physical map with freed (-1) pages."""
    return torch.where(torch.rand(pages, generator=g) < 0.2, -1, torch.randperm(pages * 2, generator=g)[:pages])


@pytest.mark.representative("through")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("page_size", (1, 16, 24))
@pytest.mark.parametrize("seq_len_delta", (0, 3))
@pytest.mark.parametrize("through", ("function", "kernel"))
def test_kv_read_table_zero_tail(backend, page_size, seq_len_delta, through, release, compat):  # noqa: F811
    """``zero_tail=True``: each row's columns past its pages, up to ``max_pages``, are 0; rows past the batch and
    columns past ``max_pages`` keep their values. ``kernel``: the release's Triton launch (its CUDA path)."""
    read_table = release("kernels.ops.kvcache.kv_read_table")
    g = _generator()
    rows, cols, batch = 5, 8 * page_size + 5, 3
    table, pool = _pool(rows, cols, batch, g)
    table[pool[0], 0] = -1  # a freed token: virtual page 0
    lens = torch.randint(0, cols - seq_len_delta + 1, (batch,), generator=g).to(torch.int32).to(DEVICE)
    v2p = _v2p(rows * cols * 2 // page_size + 1, g).to(DEVICE)
    max_pages = -(-cols // page_size) - 1
    out = torch.full((batch + 1, max_pages + 2), POISON, dtype=torch.int32, device=DEVICE)
    (theirs,), (ours,) = _twins(out)
    arguments = dict(req_to_token=table, req_pool_indices=pool, seq_lens=lens, v2p=v2p, page_size=page_size,
                     seq_len_delta=seq_len_delta, zero_tail=True)
    if through == "function":
        read_table.build_kv_read_table(**arguments, max_pages=max_pages, out=theirs)
    else:
        read_table._launch(**arguments, max_items=max_pages, out=theirs, out_stride=theirs.stride(0),
                           row_starts=None, kv_start_idx=None, emit_per_token=False)
    assert compat.build_kv_read_table(**arguments, max_pages=max_pages, out=ours) is ours
    _same([ours], [theirs], "zero-tailed read table")
    assert (ours[:batch, :max_pages] != POISON).all()


def test_kv_read_table_zero_tail_refuses_bad_arguments_first():
    from kvdispatch.compat import sglang

    table = torch.zeros((2, 64), dtype=torch.int32, device=DEVICE)
    out = torch.full((2, 4), POISON, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="max_pages"):
        sglang.build_kv_read_table(req_to_token=table, req_pool_indices=torch.zeros(2, dtype=torch.int64),
                                   seq_lens=torch.ones(2, dtype=torch.int32), v2p=torch.arange(8), page_size=16,
                                   max_pages=5, out=out, zero_tail=True)
    assert (out == POISON).all()


@pytest.mark.representative("through")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("page_size", (1, 16, 24))
@pytest.mark.parametrize("out_dtype", (torch.int32, torch.int64))
@pytest.mark.parametrize("with_start", (False, True))
@pytest.mark.parametrize("through", ("function", "kernel"))
def test_kv_read_table_packed(backend, page_size, out_dtype, with_start, through, release, compat):  # noqa: F811
    """``KVIndexTranslator.pack_read_stream``'s call: the CSR of a paged wrapper (int32 ``indptr``, a
    capture-stable ``out`` of ``max_tokens = out.numel()``), with and without ``kv_start_idx``."""
    read_table = release("kernels.ops.kvcache.kv_read_table")
    g = _generator()
    rows, cols, batch = 5, 6 * page_size + 5, 3
    table, pool = _pool(rows, cols, batch, g)
    table[pool[1], 0] = -1
    start = torch.randint(0, 2 * page_size + 1 if with_start else 1, (batch,), generator=g)
    lens = torch.stack([torch.randint(0, cols - int(s) + 1, (1,), generator=g)[0] for s in start]).to(torch.int32)
    indptr = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(lens.long(), 0)]).to(torch.int32)
    v2p = _v2p(rows * cols * 2 // page_size + 1, g).to(DEVICE)
    out = torch.full((int(indptr[-1]) + 7,), POISON, dtype=out_dtype, device=DEVICE)
    (theirs,), (ours,) = _twins(out)
    arguments = dict(req_to_token=table, req_pool_indices=pool, seq_lens=lens.to(DEVICE), v2p=v2p,
                     page_size=page_size, kv_start_idx=start.to(torch.int32).to(DEVICE) if with_start else None)
    if through == "function":
        read_table.build_kv_read_table_packed(**arguments, indptr=indptr.to(DEVICE), max_tokens=out.numel(),
                                              out=theirs)
    else:
        read_table._launch(**arguments, max_items=out.numel(), out=theirs, out_stride=0, row_starts=indptr.to(DEVICE),
                           emit_per_token=True)
    assert compat.build_kv_read_table_packed(**arguments, indptr=indptr.to(DEVICE), max_tokens=out.numel(),
                                             out=ours) is ours
    _same([ours], [theirs], "packed read stream")


def test_kv_read_table_packed_asserts_are_value_errors():
    from kvdispatch.compat import sglang

    table = torch.zeros((2, 64), dtype=torch.int32, device=DEVICE)
    common = dict(req_to_token=table, req_pool_indices=torch.zeros(2, dtype=torch.int64, device=DEVICE),
                  seq_lens=torch.ones(2, dtype=torch.int32, device=DEVICE), v2p=torch.arange(8, device=DEVICE),
                  page_size=16)
    out = torch.full((4,), POISON, dtype=torch.int32, device=DEVICE)
    indptr = torch.zeros(3, dtype=torch.int32, device=DEVICE)
    for bad in (dict(out=out.float(), indptr=indptr, max_tokens=4),
                dict(out=out.view(2, 2), indptr=indptr, max_tokens=4), dict(out=out, indptr=indptr, max_tokens=5),
                dict(out=out, indptr=indptr[:2], max_tokens=4)):
        with pytest.raises(ValueError):
            sglang.build_kv_read_table_packed(**common, **bad)
    with pytest.raises(TypeError, match="max_tokens"):
        sglang.build_kv_read_table_packed(**common, out=out, indptr=indptr, max_tokens=4.0)
    assert (out == POISON).all()
    sglang.build_kv_read_table_packed(**common, out=out, indptr=indptr, max_tokens=0)
    assert (out == POISON).all()


# -- kernels.ops.speculative.cache_locs: the page-granular source ---------------------------------------------

# The release's draft kernels and the helpers they call (one extraction per module: the fixture keeps it).
DRAFT_KERNELS = ("_translate_token_ids", "_load_token_ids", "generate_draft_decode_kv_indices",
                 "generate_draft_decode_window_kv_indices")


def _next_power_of_2(n):
    return 1 << max(n - 1, 0).bit_length()


@pytest.mark.representative("engine")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("topk, page_size", ((1, 16), (4, 16), (2, 24), (3, 1)))
@pytest.mark.parametrize("engine", ("triton", "flashinfer_blocks", "window", "translated"))
def test_draft_decode_from_the_read_table(backend, topk, page_size, engine, release, compat):  # noqa: F811
    """The draft backends' launch over the unified pool's read table (``read_source`` once a table reader built
    it): ``src.ids`` the plan's table of physical pages (rows of ``row_stride``), ``src.row_ids`` its rows,
    ``ENTRY_PAGE_SIZE`` the page size; and (``translated``) a page-granular source read through ``v2p``."""
    locs = release("kernels.ops.speculative.cache_locs", extract=DRAFT_KERNELS)
    g = _generator()
    steps, batch = 3, 3
    owned = -(-(page_size - 1 + steps) // page_size) * page_size
    positions_per_row = 40 + topk * owned + page_size
    width = -(-positions_per_row // page_size)
    pages = torch.randperm(4 * batch * width, generator=g)[: (batch + 1) * width].to(torch.int32)
    table = torch.zeros((batch + 1, width + 3), dtype=torch.int32)[:, :width]  # rows of row_stride width + 3
    table.copy_(pages.view(batch + 1, width))
    table, rows = table.to(DEVICE), torch.arange(batch, dtype=torch.int64, device=DEVICE)
    lens = torch.randint(1, width * page_size - topk * owned - page_size + 2, (batch,), generator=g).to(DEVICE)
    positions = lens.repeat_interleave(topk)
    out_width = compat.draft_kv_indices_buffer_width(batch, topk, width * page_size)
    kv_indices = torch.full((steps, out_width), POISON, dtype=torch.int64, device=DEVICE)
    kv_indptr = torch.zeros((steps, batch * topk + 1), dtype=torch.int32, device=DEVICE)
    window, options, grid = (0, 0), {}, (steps, batch, topk)
    if engine == "flashinfer_blocks":
        grid, options = (steps * 2, batch, topk), dict(NUM_STEPS=steps)
    elif engine == "window":
        window = (5, 2)
    elif engine == "translated":
        v2p = torch.randint(-1, 500, (4 * batch * width + 1,), generator=g).to(DEVICE)
        options = dict(v2p=v2p, TRANSLATE=True)
    theirs, ours = _twins(kv_indices, kv_indptr)
    for function, buffers in ((locs.generate_draft_decode_kv_indices, theirs),
                              (compat.generate_draft_decode_kv_indices, ours)):
        function[grid](rows, table, lens, buffers[0], buffers[1], positions, table.stride(0), out_width,
                       kv_indptr.shape[1], _next_power_of_2(batch), _next_power_of_2(steps),
                       _next_power_of_2(batch * topk), page_size, *window, ENTRY_PAGE_SIZE=page_size, **options)
    _same(ours, theirs, engine)


@pytest.mark.representative("source")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("topk, page_size", ((1, 1), (4, 1), (4, 16), (2, 24)))
@pytest.mark.parametrize("window", (1, 3, 40))
@pytest.mark.parametrize("source", ("req_to_token", "translated", "read_table"))
def test_draft_decode_window(backend, topk, page_size, window, source, release, compat):  # noqa: F811
    """The Triton backend's window rail (``_fill_window_rail``): grid ``(steps, num_seqs, topk)``, an int64
    ``[steps, >= bs * window]`` buffer, an int32 indptr zeroed once; its read source the plain ``req_to_token``,
    ``req_to_token`` with ``v2p`` (``TRANSLATE``), or the unified pool's read table (``ENTRY_PAGE_SIZE``)."""
    locs = release("kernels.ops.speculative.cache_locs", extract=DRAFT_KERNELS)
    g = _generator()
    steps, batch = 4, 3
    owned = -(-(page_size - 1 + steps) // page_size) * page_size
    cols = 48 + topk * owned + page_size
    table, pool = _pool(batch + 2, cols, batch, g)
    lens = torch.randint(0, cols - topk * owned - page_size + 2, (batch,), generator=g).to(DEVICE)
    options, entry = {}, 1
    if source == "translated":
        pages = (batch + 2) * cols * 2 // page_size + 1
        options = dict(v2p=torch.randint(-1, 500, (pages,), generator=g).to(DEVICE), TRANSLATE=True)
    elif source == "read_table":
        width = -(-cols // page_size)
        table = torch.randperm(8 * batch * width, generator=g)[: batch * width].view(batch, width).to(torch.int32)
        table, pool, entry = table.to(DEVICE), torch.arange(batch, device=DEVICE), page_size
    positions = lens.repeat_interleave(topk)
    out = torch.full((steps, batch * topk * window + 3), POISON, dtype=torch.int64, device=DEVICE)
    indptr = torch.zeros((steps, batch * topk + 2), dtype=torch.int32, device=DEVICE)
    theirs, ours = _twins(out, indptr)
    for function, buffers in ((locs.generate_draft_decode_window_kv_indices, theirs),
                              (compat.generate_draft_decode_window_kv_indices, ours)):
        function[(steps, batch, topk)](pool, table, lens, buffers[0], buffers[1], positions, table.stride(0),
                                       out.shape[1], indptr.shape[1], _next_power_of_2(batch),
                                       _next_power_of_2(steps), _next_power_of_2(batch * topk), page_size, window,
                                       ENTRY_PAGE_SIZE=entry, **options)
    _same(ours, theirs, source)


def test_draft_decode_window_arguments():
    from kvdispatch.compat import sglang

    table = torch.zeros((2, 8), dtype=torch.int32)
    vec, out, indptr = torch.zeros(1, dtype=torch.int64), torch.full((2, 8), POISON, dtype=torch.int64), \
        torch.zeros((2, 2), dtype=torch.int32)
    args = (vec, table, vec + 1, out, indptr, vec + 1, 8, 8, 2, 1, 2, 1, 1)
    with pytest.raises(TypeError, match="launch grid"):
        sglang.generate_draft_decode_window_kv_indices(*args, 4)
    for window, error in ((0, ValueError), (2.0, TypeError), (True, TypeError)):
        with pytest.raises(error, match="window"):
            sglang.generate_draft_decode_window_kv_indices[(2, 1, 1)](*args, window)
    with pytest.raises(ValueError, match="TRANSLATE=True needs v2p"):
        sglang.generate_draft_decode_window_kv_indices[(2, 1, 1)](*args, 4, TRANSLATE=True)
    with pytest.raises(ValueError, match="row_stride=9 does not match"):
        sglang.generate_draft_decode_window_kv_indices[(2, 1, 1)](*args[:6], 9, *args[7:], 4)
    assert (out == POISON).all()
