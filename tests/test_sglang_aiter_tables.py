"""The Aiter backend's unified-attention block tables (``kernels.ops.attention.aiter_unified_page_table``) and the
FlashAttention backend's prefill-aware SWA table (``kernels.ops.attention.pa_page_table``) through
``kvdispatch.compat.sglang`` against SGLang 0.5.23's own code (its kernels run in Triton's interpreter on CPU):

* on the patterns of ``srt/layers/attention/aiter_backend.py``: target-verify (``DRAFT_NUM`` draft tokens, a fresh
  zeroed table or a graph's persistent buffer with more rows than the batch), extend (``DRAFT_NUM=0``, rows sized
  to the batch's longest request) and the ragged CSR of a speculative step; each with and without the SWA twin
  (an int64 ``full_to_swa_index_mapping``);
* on those of ``srt/layers/attention/flashattention_backend.py``: eager decode (fresh tables sized
  ``min(max prefill + window, max seq len)``) and graph replay (the captured page table and cache lengths, wider
  and longer than the batch, rebuilt in place), ``prefill_lens`` a pool-sized int32 buffer.

Every element of every buffer must be equal, the untouched ones included.
"""

from __future__ import annotations

import pytest
import torch

from conftest import BACKENDS, DEVICE, through
from kvcases import POISON
from test_sglang_against_release import ROOT, _cumsum, _generator, _pool, _same, _twins
from test_sglang_against_release import release as release  # noqa: F401  (the fixture)

pytestmark = pytest.mark.skipif(ROOT is None, reason="SGLang's source is not here (set SGLANG_SOURCE)")

BLOCK_SIZE = 1024  # what every call site passes


@pytest.fixture
def aiter(compat, monkeypatch, backend):
    """``compat`` with the ragged builder routed to ``backend`` too."""
    from kvdispatch.compat.sglang import _common

    name = backend
    monkeypatch.setattr(_common, "_build_ragged_page_table",
                        lambda *a, backend=None, **k: through(name, "create_ragged_page_table", *a, **k))
    monkeypatch.setattr(_common, "_build_pa_swa_table",
                        lambda *a, backend=None, **k: through(name, "create_prefill_aware_swa_table", *a, **k))
    monkeypatch.setattr(_common, "_build_merged_token_csr",
                        lambda *a, backend=None, **k: through(name, "create_merged_kv_indices", *a, **k))
    monkeypatch.setattr(_common, "_build_spec_concat_page_table",
                        lambda *a, backend=None, **k: through(name, "create_spec_concat_page_table", *a, **k))
    return compat


def _mapping(slots, g):
    return torch.randint(0, slots, (slots,), generator=g).to(DEVICE)  # int64, as ``.long()`` gives it


def _tables(rows, width, swa, fill):
    tables = [torch.full((rows, width), fill, dtype=torch.int32, device=DEVICE)]
    if swa:
        tables.append(torch.full((rows, width), fill, dtype=torch.int32, device=DEVICE))
    return tables


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("page_size", (1, 16, 64))
@pytest.mark.parametrize("pattern", ("verify", "verify_graph", "extend"))
@pytest.mark.parametrize("swa", (False, True))
def test_scatter_req_to_token_to_page_table(backend, page_size, pattern, swa, release, aiter):
    kernels = release("kernels.ops.attention.aiter_unified_page_table")
    g = _generator()
    rows, max_context_len, batch = 6, 160, 4
    draft_num = 0 if pattern == "extend" else 4
    table, pool = _pool(rows, max_context_len, batch, g)
    lens_dtype = torch.int32 if pattern == "verify_graph" else torch.int64
    lens = torch.randint(0, max_context_len - draft_num + 1, (batch,), generator=g).to(lens_dtype).to(DEVICE)
    if pattern == "extend":
        max_blocks = max(-(-int(lens.max()) // page_size), 1)
    else:
        max_blocks = -(-max_context_len // page_size)
    out_rows = batch + 2 if pattern == "verify_graph" else batch
    fill = POISON if pattern == "verify_graph" else 0
    mapping = _mapping(rows * max_context_len * 2, g) if swa else None
    theirs, ours = _twins(*_tables(out_rows, max_blocks, swa, fill))
    grid = (batch, -(-max(max_blocks, 1) // BLOCK_SIZE))
    for kernel, buffers in ((kernels.scatter_req_to_token_to_page_table_kernel, theirs),
                            (aiter.scatter_req_to_token_to_page_table_kernel, ours)):
        kernel[grid](table, pool, lens, buffers[0], table.stride(0), buffers[0].stride(0),
                     buffers[1] if swa else None, mapping, DRAFT_NUM=draft_num, PAGE_SIZE=page_size,
                     BLOCK_SIZE=BLOCK_SIZE, HAS_SWA=swa)
    _same(ours, theirs, "page tables")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("page_size", (1, 16, 64))
@pytest.mark.parametrize("pattern", ("eager", "graph"))
@pytest.mark.parametrize("swa", (False, True))
@pytest.mark.parametrize("token_dtype", (torch.int32, torch.int64))
def test_scatter_ragged_to_page_table(backend, page_size, pattern, swa, token_dtype, release, aiter):
    kernels = release("kernels.ops.attention.aiter_unified_page_table")
    g = _generator()
    max_context_len, batch = 160, 4
    max_blocks = -(-max_context_len // page_size)
    lens = torch.randint(0, max_context_len + 1, (batch,), generator=g)
    lens[1] = 0
    bounds = _cumsum(lens)
    if pattern == "graph":  # the captured indptr buffer is sized for a larger batch
        bounds = torch.cat([bounds, torch.full((3,), int(bounds[-1]), dtype=torch.int32, device=DEVICE)])
    total = int(lens.sum()) + 7
    slots = torch.randperm(total * 4, generator=g)[:total].to(token_dtype).to(DEVICE)
    out_rows = batch + 2 if pattern == "graph" else batch
    fill = POISON if pattern == "graph" else 0
    mapping = _mapping(total * 4, g) if swa else None
    theirs, ours = _twins(*_tables(out_rows, max_blocks, swa, fill))
    grid = (batch, -(-max(max_blocks, 1) // BLOCK_SIZE))
    for kernel, buffers in ((kernels.scatter_ragged_to_page_table_kernel, theirs),
                            (aiter.scatter_ragged_to_page_table_kernel, ours)):
        kernel[grid](slots, bounds, buffers[0], buffers[0].stride(0), buffers[1] if swa else None, mapping,
                     PAGE_SIZE=page_size, BLOCK_SIZE=BLOCK_SIZE, HAS_SWA=swa)
    _same(ours, theirs, "page tables")


def test_scatter_ragged_argument_errors():
    from kvdispatch.compat.sglang import scatter_ragged_to_page_table_kernel as kernel

    slots, bounds, out = torch.arange(8, dtype=torch.int32), torch.tensor([0, 4, 8], dtype=torch.int32), torch.zeros(
        2, 8, dtype=torch.int32)
    with pytest.raises(TypeError, match=r"\[grid\]"):
        kernel(slots, bounds, out, 8, None, None, PAGE_SIZE=1, BLOCK_SIZE=8, HAS_SWA=False)
    with pytest.raises(ValueError, match="kv_indptr_ptr must have at least 4"):
        kernel[(3, 1)](slots, bounds, out, 8, None, None, PAGE_SIZE=1, BLOCK_SIZE=8, HAS_SWA=False)
    with pytest.raises(ValueError, match="dest_stride"):
        kernel[(2, 1)](slots, bounds, out, 9, None, None, PAGE_SIZE=1, BLOCK_SIZE=8, HAS_SWA=False)
    with pytest.raises(ValueError, match="PAGE_SIZE"):
        kernel[(2, 1)](slots, bounds, out, 8, None, None, PAGE_SIZE=0, BLOCK_SIZE=8, HAS_SWA=False)
    with pytest.raises(TypeError, match="kv_indices must have dtype"):
        kernel[(2, 1)](slots.float(), bounds, out, 8, None, None, PAGE_SIZE=1, BLOCK_SIZE=8, HAS_SWA=False)
    assert int(out.abs().sum()) == 0


def test_scatter_req_to_token_argument_errors():
    from kvdispatch.compat.sglang import scatter_req_to_token_to_page_table_kernel as kernel

    table = torch.zeros(2, 8, dtype=torch.int32)
    pool, lens, out = torch.zeros(2, dtype=torch.int64), torch.ones(2, dtype=torch.int64), torch.zeros(
        2, 8, dtype=torch.int32)
    arguments = (table, pool, lens, out, 8, 8, None, None)
    with pytest.raises(TypeError, match=r"\[grid\]"):
        kernel(*arguments, DRAFT_NUM=0, PAGE_SIZE=1, BLOCK_SIZE=8, HAS_SWA=False)
    with pytest.raises(ValueError, match="DRAFT_NUM"):
        kernel[(2, 1)](*arguments, DRAFT_NUM=-1, PAGE_SIZE=1, BLOCK_SIZE=8, HAS_SWA=False)
    with pytest.raises(ValueError, match="HAS_SWA needs"):
        kernel[(2, 1)](*arguments, DRAFT_NUM=0, PAGE_SIZE=1, BLOCK_SIZE=8, HAS_SWA=True)
    with pytest.raises(ValueError, match="req_to_token_stride"):
        kernel[(2, 1)](table, pool, lens, out, 9, 8, None, None, DRAFT_NUM=0, PAGE_SIZE=1, BLOCK_SIZE=8,
                       HAS_SWA=False)
    with pytest.raises(TypeError, match="HAS_SWA"):
        kernel[(2, 1)](*arguments, DRAFT_NUM=0, PAGE_SIZE=1, BLOCK_SIZE=8, HAS_SWA=1)
    assert int(out.abs().sum()) == 0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("pattern", ("eager", "graph", "empty"))
@pytest.mark.parametrize("window", (0, 8, 40))
def test_build_pa_page_table(backend, pattern, window, release, aiter):
    module = release("kernels.ops.attention.pa_page_table")
    g = _generator()
    pool_size, max_context_len, bs = 7, 120, 5
    table, pool = _pool(pool_size + 1, max_context_len, bs, g)
    prefill_lens = torch.zeros(pool_size + 1, dtype=torch.int32)
    prefill_lens[pool.cpu()] = torch.randint(0, 50, (bs,), generator=g).to(torch.int32)
    prefill_lens = prefill_lens.to(DEVICE)
    seq_lens = torch.randint(1, max_context_len + 1, (bs,), generator=g)
    seq_lens[0] = int(prefill_lens[pool[0]]) // 2  # shorter than its prefill
    seq_lens = seq_lens.to(DEVICE)
    max_prefill = int(prefill_lens.max())
    pa_max_len = 0 if pattern == "empty" else min(max_prefill + window, int(seq_lens.max()))
    if pattern == "graph":
        max_bs = bs + 3
        buffers = (torch.full((max_bs, max_context_len), POISON, dtype=torch.int32, device=DEVICE),
                   torch.full((max_bs,), POISON, dtype=torch.int32, device=DEVICE))
        theirs, ours = _twins(*buffers)
        rows = torch.cat([pool, pool[:3]]), torch.cat([seq_lens, seq_lens[:3]])
        for function, (page_table, kv_lens) in ((module._build_pa_page_table, theirs),
                                                (aiter._build_pa_page_table, ours)):
            result = function(table, rows[0][:bs], rows[1][:bs], prefill_lens, window, bs, pa_max_len, DEVICE,
                              dst_page_table=page_table, dst_kv_lens=kv_lens)
            assert result[0] is page_table and result[1] is kv_lens
        _same(ours, theirs, "page table and lengths")
        return
    theirs = module._build_pa_page_table(table, pool, seq_lens, prefill_lens, window, bs, pa_max_len, DEVICE)
    ours = aiter._build_pa_page_table(table, pool, seq_lens, prefill_lens, window, bs, pa_max_len, DEVICE)
    for a, b in zip(ours, theirs):
        assert (a.shape, a.dtype, a.device) == (b.shape, b.dtype, b.device)
    if pattern == "eager":
        _same(ours, theirs, "page table and lengths")
    else:  # nothing built: the zeroed table, lengths uninitialised in both
        _same(ours[:1], theirs[:1], "page table")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("pattern", ("extend", "verify", "window"))
def test_build_unified_kv_indices(backend, pattern, release, aiter):
    """``srt/layers/attention/triton_backend.py``'s unified extend: the prefix CSR (``kv_indptr``/``kv_indices``,
    int32 indptr and int64 entries, or the sliding window's), ``out_cache_loc`` (int64) as the extend CSR from
    ``extend_start_loc`` (a cumsum from 0; target-verify: uniform ``extend_seq_lens``), its indptr buffer sized for
    more requests than the batch."""
    module = release("kernels.ops.attention.extend_attention",
                     extract=("_copy_unified_indices_kernel", "build_unified_kv_indices"),
                     header="import torch\nimport triton\nimport triton.language as tl\n")
    g = _generator()
    bs = 5
    prefix_lens = torch.randint(0, 40, (bs,), generator=g)
    prefix_lens[2] = 0
    prefix_kv_indptr = torch.cat([_cumsum(prefix_lens.to(DEVICE)), torch.zeros(3, dtype=torch.int32,
                                                                                     device=DEVICE)])
    entry_dtype = torch.int32 if pattern == "window" else torch.int64
    prefix_kv_indices = torch.randperm(1000, generator=g)[: int(prefix_lens.sum()) + 9].to(entry_dtype).to(DEVICE)
    if pattern == "verify":
        extend_seq_lens = torch.full((bs,), 4, dtype=torch.int32)
    else:
        extend_seq_lens = torch.randint(1, 20, (bs,), generator=g).to(torch.int32)
    extend_start_loc = _cumsum(extend_seq_lens.to(DEVICE), leading_zero=False)
    extend_kv_indices = torch.randperm(1000, generator=g)[: int(extend_seq_lens.sum())].to(DEVICE)
    arguments = (prefix_kv_indptr, prefix_kv_indices, extend_start_loc, extend_seq_lens.to(DEVICE), extend_kv_indices,
                 bs)
    theirs = module.build_unified_kv_indices(*arguments)
    ours = aiter.build_unified_kv_indices(*arguments)
    for a, b in zip(ours, theirs):
        assert (a.shape, a.dtype, a.device) == (b.shape, b.dtype, b.device)
    total = int(theirs[0][-1])
    _same((ours[0], ours[1][:total], ours[2]), (theirs[0], theirs[1][:total], theirs[2]), "unified CSR")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("pattern", ("eager", "graph"))
@pytest.mark.parametrize("draft", (1, 4))
def test_prepare_swa_spec_page_table(backend, pattern, draft, release, aiter):
    """``srt/layers/attention/flashattention_backend.py``'s SWA speculative decode: the prefix table
    (``metadata.page_table``, int32, wider than its lengths; in a graph a captured buffer with spare rows), the
    expand table (``decode_length`` columns per draft token), int32 cache lengths; the output a fresh zeroed
    ``[bs * draft, max_seq_len_k + decode_length]`` table, or the captured SWA table (wider, stale)."""
    module = release("kernels.ops.attention.metadata")
    g = _generator()
    bs, max_seq_len_k, decode_length = 3, 300, 5
    spare = 2 if pattern == "graph" else 0
    page_table_a = torch.randint(0, 1 << 20, (bs + spare, max_seq_len_k), generator=g).to(torch.int32).to(DEVICE)
    page_table_b = torch.randint(0, 1 << 20, (bs * draft + spare, decode_length), generator=g).to(torch.int32)
    seq_len_a = torch.randint(0, max_seq_len_k + 1, (bs,), generator=g).to(torch.int32).to(DEVICE)
    seq_len_b = torch.randint(1, decode_length + 1, (bs * draft,), generator=g).to(torch.int32).to(DEVICE)
    if pattern == "graph":
        dst = torch.full((bs * draft + 2, max_seq_len_k + decode_length + 600), POISON, dtype=torch.int32,
                         device=DEVICE)
    else:
        dst = torch.zeros((bs * draft, max_seq_len_k + decode_length), dtype=torch.int32, device=DEVICE)
    (theirs,), (ours,) = _twins(dst)
    for function, out in ((module.prepare_swa_spec_page_table_triton, theirs),
                          (aiter.prepare_swa_spec_page_table_triton, ours)):
        assert function(out, page_table_a[:bs] if pattern == "eager" else page_table_a, page_table_b.to(DEVICE),
                        seq_len_a, seq_len_b, draft) is None
    _same((ours,), (theirs,), "SWA spec page table")
