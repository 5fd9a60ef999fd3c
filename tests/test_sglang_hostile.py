"""``kvdispatch.compat.sglang`` at the edges of the tensor model, every builder, every backend under test.

* Strided buffers: each 1-D buffer argument of each builder (outputs, ``kv_indptr``, index vectors, flat tables
  read as rows) is passed once as a strided view ``big[1::2]`` of a bigger poisoned buffer and once as a
  contiguous view ``big[3:3 + n]`` with a storage offset. Either the call equals the same call on contiguous
  copies and no element of ``big`` outside the view changed, or (where the buffer cannot be read as the builder
  needs it) it raises a ``ValueError`` naming the argument and nothing anywhere is written. Which of the two
  happens is part of the contract and checked.
* Bad counts, sizes, ranks, strides, flags and grids (``bs=-1``, ``bs=True``, ``PAGED_SIZE=4.7``, a grid
  ``(-1,)``, ``dcp_size=0``, ...): a ``TypeError`` / ``ValueError`` naming the argument, outputs untouched; the
  same call with the good value then succeeds (so the error is the value's).
"""

from __future__ import annotations

import pytest
import torch
from conftest import BACKENDS, DEVICE
from kvcases import POISON, assert_same

import kvdispatch

BATCH, ROWS, COLS = 3, 5, 64


@pytest.fixture
def sglang(compat):
    """``kvdispatch.compat.sglang`` with every builder routed to ``backend``."""
    return compat


def _vec(values, dtype=torch.int32):
    return torch.as_tensor(values, dtype=dtype).to(DEVICE)


def _poisoned(n, dtype=torch.int32):
    return torch.full((n,), POISON, dtype=dtype, device=DEVICE)


def _exclusive_sum(lens, extra=0):
    return _vec([0] + torch.cumsum(lens.cpu(), 0).tolist()[:-1] + [int(lens.sum())] * extra)


def _pool(g):
    """``req_to_token`` (distinct slot ids, int32 ``[ROWS, COLS]``), int64 pool indices and int32 lengths."""
    table = torch.randperm(ROWS * COLS * 2, generator=g)[: ROWS * COLS].view(ROWS, COLS).to(torch.int32)
    pool = torch.randperm(ROWS, generator=g)[:BATCH]
    lens = torch.randint(1, COLS + 1, (BATCH,), generator=g).to(torch.int32)
    return table.to(DEVICE), pool.to(DEVICE), lens.to(DEVICE)


# Each case: (grid or None for a direct / keyword-only call, the builder's arguments by name).

def _flashinfer(g):
    table, pool, lens = _pool(g)
    return (BATCH,), dict(req_to_token_ptr=table, req_pool_indices_ptr=pool, page_kernel_lens_ptr=lens,
                          kv_indptr=_exclusive_sum(lens, 1), kv_start_idx=None,
                          kv_indices_ptr=_poisoned(int(lens.sum()) + 5), req_to_token_ptr_stride=COLS)


def _chunked(g):
    table, pool, lens = _pool(g)
    start = torch.randint(0, 8, (BATCH,), generator=g).to(DEVICE)
    return (BATCH,), dict(req_to_token_ptr=table, req_pool_indices_ptr=pool, chunk_start_idx_ptr=start,
                          chunk_seq_lens_ptr=lens, chunk_cu_seq_lens_ptr=_exclusive_sum(lens),
                          chunk_kv_indices_ptr=_poisoned(int(lens.sum()) + 5), req_to_token_ptr_stride=COLS)


def _flashmla(g, width=3):
    table, pool, lens = _pool(g)
    return (BATCH, 1), dict(req_to_token_ptr=table, req_pool_indices_ptr=pool, page_kernel_lens_ptr=lens,
                            kv_start_idx=None, kv_indices_ptr=_poisoned((BATCH + 1) * width),
                            req_to_token_ptr_stride=COLS, kv_indices_ptr_stride=width, PAGED_SIZE=16)


def _flashmla_one_page(g):  # rows of one entry: a strided flat buffer serves
    return _flashmla(g, width=1)


def _mha_kernel(g):
    table, pool, lens = _pool(g)
    width = 5
    mapping = torch.randperm(ROWS * COLS * 2, generator=g).to(DEVICE)
    return (BATCH, 1), dict(req_to_token_ptr=table, req_pool_indices_ptr=pool, seq_lens_ptr=lens,
                            full_to_swa_ptr=mapping, page_table_ptr=_poisoned((BATCH + 1) * width),
                            swa_page_table_ptr=_poisoned((BATCH + 1) * width), full_to_swa_numel=mapping.numel(),
                            req_to_token_stride=COLS, page_table_stride=width, PAGE_SIZE=16, HAS_SWA=True)


def _mha_build(g):
    table, pool, lens = _pool(g)
    return None, dict(req_to_token=table, req_pool_indices=pool, cache_seqlens=lens,
                      page_table=torch.full((BATCH, 5), POISON, dtype=torch.int32, device=DEVICE), page_size=16)


def _kv_read_table(g):
    table, pool, lens = _pool(g)
    v2p = torch.randint(-1, 500, (ROWS * COLS * 2 // 16 + 1,), generator=g).to(torch.int32).to(DEVICE)
    return None, dict(req_to_token=table, req_pool_indices=pool, seq_lens=lens, v2p=v2p, page_size=16, max_pages=4,
                      out=torch.full((BATCH + 1, 6), POISON, dtype=torch.int32, device=DEVICE), seq_len_delta=2)


def _draft(g, steps=2, topk=2):
    table, pool, lens = _pool(g)
    lens = (lens // 2).clamp_(min=1)
    width, segments = BATCH * topk * COLS, BATCH * topk
    return (steps, BATCH, topk), dict(
        req_pool_indices=pool, req_to_token=table, paged_kernel_lens=lens, kv_indices=_poisoned(steps * width),
        kv_indptr=_poisoned(steps * (segments + 1)), positions=lens.repeat_interleave(topk).to(torch.int64),
        row_stride=COLS, kv_indices_stride=width, kv_indptr_stride=segments + 1, bs_upper=4, iter_upper=2,
        num_tokens_upper=8, page_size=1)


def _dcp_csr(g, dcp_size=2, rank=1):
    table, pool, lens = _pool(g)
    return (BATCH,), dict(req_to_token_ptr=table, req_pool_indices_ptr=pool, dcp_kernel_lens_ptr=lens // dcp_size,
                          kv_indptr=_exclusive_sum(lens // dcp_size, 1), kv_start_idx=None,
                          kv_indices_ptr=_poisoned(int(lens.sum()) + 5, torch.int64), req_to_token_ptr_stride=COLS,
                          dcp_size=dcp_size, dcp_rank=rank)


def _dcp_page_table(g):
    table, pool, lens = _pool(g)
    width = 4
    return (BATCH, 1), dict(req_to_token_ptr=table, req_pool_indices_ptr=pool, local_seq_lens_ptr=lens // 2,
                            block_kv_indices_ptr=_poisoned((BATCH + 1) * width), v2p_ptr=None,
                            req_to_token_stride=COLS, block_table_stride=width, PHYSICAL_PAGE_SIZE=8, DCP_SIZE=2,
                            DCP_RANK=1, PAGES_PER_BLOCK=4, HAS_V2P=False)


def _dcp_lens(g):
    _, _, lens = _pool(g)
    start = torch.randint(0, 9, (BATCH,), generator=g).to(DEVICE)
    return None, dict(lens=lens - 3, dcp_size=4, dcp_rank=3, start=start)


CASES = {
    "create_flashinfer_kv_indices_triton": _flashinfer,
    "create_chunked_prefix_cache_kv_indices": _chunked,
    "create_flashmla_kv_indices_triton": _flashmla,
    "create_flashmla_kv_indices_triton/one-page rows": _flashmla_one_page,
    "create_trtllm_mha_kv_indices_triton": _mha_kernel,
    "build_trtllm_mha_page_table": _mha_build,
    "build_kv_read_table": _kv_read_table,
    "generate_draft_decode_kv_indices": _draft,
    "create_triton_kv_indices_for_dcp_triton": _dcp_csr,
    "create_mla_kv_page_table_for_dcp": _dcp_page_table,
    "get_dcp_lens": _dcp_lens,
}


def _call(sglang, case, arguments, grid=None):
    builder = getattr(sglang, case.split("/")[0])
    if grid is not None:
        builder = builder[grid]
    return builder(**arguments)


def _tensors(arguments):
    return {name: value for name, value in arguments.items() if isinstance(value, torch.Tensor)}


# (case, the 1-D argument passed strided, the ValueError a strided view gives, None where it serves)
STRIDED = [
    ("create_flashinfer_kv_indices_triton", "kv_indptr", None),
    ("create_flashinfer_kv_indices_triton", "page_kernel_lens_ptr", None),
    ("create_flashinfer_kv_indices_triton", "kv_indices_ptr", "out must be contiguous"),
    ("create_chunked_prefix_cache_kv_indices", "chunk_cu_seq_lens_ptr", None),
    ("create_chunked_prefix_cache_kv_indices", "chunk_start_idx_ptr", None),
    ("create_chunked_prefix_cache_kv_indices", "chunk_kv_indices_ptr", "out must be contiguous"),
    ("create_flashmla_kv_indices_triton", "kv_indices_ptr", "flat kv_indices_ptr .* must have stride 1"),
    ("create_flashmla_kv_indices_triton", "req_pool_indices_ptr", None),
    ("create_flashmla_kv_indices_triton/one-page rows", "kv_indices_ptr", None),
    ("create_trtllm_mha_kv_indices_triton", "page_table_ptr", "flat page_table_ptr .* must have stride 1"),
    ("create_trtllm_mha_kv_indices_triton", "swa_page_table_ptr", "flat swa_page_table_ptr .* must have stride 1"),
    ("create_trtllm_mha_kv_indices_triton", "full_to_swa_ptr", "full_to_swa must be contiguous"),
    ("create_trtllm_mha_kv_indices_triton", "seq_lens_ptr", None),
    ("build_trtllm_mha_page_table", "cache_seqlens", None),
    ("build_kv_read_table", "seq_lens", None),
    ("build_kv_read_table", "v2p", "v2p must be contiguous"),
    ("build_kv_read_table", "req_pool_indices", None),
    ("generate_draft_decode_kv_indices", "kv_indices", "flat kv_indices .* must have stride 1"),
    ("generate_draft_decode_kv_indices", "kv_indptr", "flat kv_indptr .* must have stride 1"),
    ("generate_draft_decode_kv_indices", "positions", None),
    ("generate_draft_decode_kv_indices", "paged_kernel_lens", None),
    ("create_triton_kv_indices_for_dcp_triton", "kv_indptr", None),
    ("create_triton_kv_indices_for_dcp_triton", "kv_indices_ptr", "out must be contiguous"),
    ("create_mla_kv_page_table_for_dcp", "block_kv_indices_ptr", "flat block_kv_indices_ptr .* must have stride 1"),
    ("create_mla_kv_page_table_for_dcp", "local_seq_lens_ptr", None),
    ("get_dcp_lens", "lens", None),
    ("get_dcp_lens", "start", None),
]


def _inside(values, step, offset):
    """``values`` (1-D) as the view ``big[offset::step][:n]`` of a bigger buffer poisoned elsewhere; returns the
    view and ``big``."""
    n = values.shape[0]
    big = torch.full((offset + n * step + 4,), POISON, dtype=values.dtype, device=DEVICE)
    view = big[offset: offset + n * step: step]
    view.copy_(values)
    return view, big


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", ("strided", "offset"))
@pytest.mark.parametrize("case, argument, refusal", STRIDED, ids=[f"{c}-{a}" for c, a, _ in STRIDED])
def test_buffers_inside_bigger_buffers(sglang, backend, layout, case, argument, refusal):
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    grid, arguments = CASES[case](g)
    expected = {name: t.clone() for name, t in _tensors(arguments).items()}
    expected_result = _call(sglang, case, dict(arguments, **expected), grid)

    step, offset = (2, 1) if layout == "strided" else (1, 3)
    view, big = _inside(arguments[argument], step, offset)
    before = {name: t.clone() for name, t in _tensors(arguments).items()}
    big_before = big.clone()
    outside = torch.ones(big.shape[0], dtype=torch.bool, device=DEVICE)
    outside[offset: offset + view.shape[0] * step: step] = False
    if refusal is not None and layout == "strided":
        with pytest.raises(ValueError, match=refusal):
            _call(sglang, case, dict(arguments, **{argument: view}), grid)
        assert_same(big, big_before.cpu(), f"{argument}'s buffer after a refused call")
        for name, t in before.items():
            assert_same(arguments[name], t.cpu(), f"{name} after a refused call")
        return
    result = _call(sglang, case, dict(arguments, **{argument: view}), grid)
    assert_same(big[outside], big_before[outside].cpu(), f"{argument}'s buffer outside the view")
    assert_same(view, expected[argument].cpu(), argument)
    for name, t in _tensors(arguments).items():
        if name != argument:
            assert_same(t, expected[name].cpu(), name)
    if isinstance(expected_result, torch.Tensor) and case == "get_dcp_lens":
        assert_same(result, expected_result.cpu(), "the counts")


def test_rows_of_a_flat_buffer_stay_inside_it():
    """A flat buffer read as rows: a view of its own elements, the partial last row left out, the storage offset
    kept; a strided one only as rows of one entry."""
    from kvdispatch.compat.sglang import _common as sglang

    big = torch.arange(40, dtype=torch.int32)
    rows = sglang._as_rows(big[5:28], 4, "kv_indices_ptr", "kv_indices_ptr_stride")
    assert rows.shape == (5, 4) and rows.storage_offset() == 5 and rows.stride() == (4, 1)
    assert rows.flatten().tolist() == list(range(5, 25))
    single = sglang._as_rows(big[1::3], 1, "kv_indices_ptr", "kv_indices_ptr_stride")
    assert single.shape == (13, 1) and single[:, 0].tolist() == list(range(1, 40, 3))
    with pytest.raises(ValueError, match="flat kv_indices_ptr is read as rows of kv_indices_ptr_stride=2"):
        sglang._as_rows(big[::2], 2, "kv_indices_ptr", "kv_indices_ptr_stride")


# (case, the grid (None: the case's), the changed arguments, the error, the words it must contain)
BAD_VALUES = [
    ("create_flashinfer_kv_indices_triton", (-1,), {}, ValueError, "grid[0]"),
    ("create_flashinfer_kv_indices_triton", (1.5,), {}, TypeError, "grid[0]"),
    ("create_flashinfer_kv_indices_triton", (True,), {}, TypeError, "grid[0]"),
    ("create_flashinfer_kv_indices_triton", (1, 2, 3, 4), {}, ValueError, "grid must have 1 to 3"),
    ("create_flashinfer_kv_indices_triton", None, dict(req_to_token_ptr_stride=64.0), TypeError,
     "req_to_token_ptr_stride"),
    ("create_flashinfer_kv_indices_triton", None, dict(req_to_token_ptr_stride=True), TypeError,
     "req_to_token_ptr_stride"),
    ("create_flashinfer_kv_indices_triton", None, dict(ENTRY_PAGE_SIZE=0), ValueError, "ENTRY_PAGE_SIZE"),
    ("create_flashinfer_kv_indices_triton", None, dict(ENTRY_PAGE_SIZE=2.0), TypeError, "ENTRY_PAGE_SIZE"),
    ("create_flashinfer_kv_indices_triton", None, dict(ENTRY_PAGE_SIZE=True), TypeError, "ENTRY_PAGE_SIZE"),
    ("create_flashinfer_kv_indices_triton", None, dict(TOKEN_BLOCK_PARALLEL=1), TypeError, "TOKEN_BLOCK_PARALLEL"),
    ("create_chunked_prefix_cache_kv_indices", None, dict(req_to_token_ptr_stride=-1), ValueError,
     "req_to_token_ptr_stride"),
    ("create_flashmla_kv_indices_triton", None, dict(PAGED_SIZE=4.7), TypeError, "PAGED_SIZE"),
    ("create_flashmla_kv_indices_triton", None, dict(PAGED_SIZE=0), ValueError, "PAGED_SIZE"),
    ("create_flashmla_kv_indices_triton", None, dict(PAGED_SIZE=True), TypeError, "PAGED_SIZE"),
    ("create_flashmla_kv_indices_triton", None, dict(PAGED_SIZE=8192), ValueError, "PAGED_SIZE"),
    ("create_flashmla_kv_indices_triton", None, dict(kv_indices_ptr_stride=0), ValueError, "kv_indices_ptr_stride"),
    ("create_flashmla_kv_indices_triton", None, dict(kv_indices_ptr_stride=3.0), TypeError,
     "kv_indices_ptr_stride"),
    ("create_flashmla_kv_indices_triton", (-1, 1), {}, ValueError, "grid[0]"),
    ("create_trtllm_mha_kv_indices_triton", None, dict(PAGE_SIZE=4.7), TypeError, "PAGE_SIZE"),
    ("create_trtllm_mha_kv_indices_triton", None, dict(PAGE_SIZE=0), ValueError, "PAGE_SIZE"),
    ("create_trtllm_mha_kv_indices_triton", None, dict(PAGE_SIZE=24), ValueError, "PAGE_SIZE must divide 4096"),
    ("create_trtllm_mha_kv_indices_triton", None, dict(HAS_SWA=1), TypeError, "HAS_SWA"),
    ("create_trtllm_mha_kv_indices_triton", None, dict(full_to_swa_numel=2.0), TypeError, "full_to_swa_numel"),
    ("create_trtllm_mha_kv_indices_triton", None, dict(full_to_swa_numel=-1), ValueError, "full_to_swa_numel"),
    ("create_trtllm_mha_kv_indices_triton", None, dict(page_table_stride=5.0), TypeError, "page_table_stride"),
    ("create_trtllm_mha_kv_indices_triton", (-1, 1), {}, ValueError, "grid[0]"),
    ("create_trtllm_mha_kv_indices_triton", (BATCH + 1, 1), {}, ValueError, "req_pool_indices_ptr"),
    ("build_trtllm_mha_page_table", None, dict(page_size=4.7), TypeError, "page_size"),
    ("build_trtllm_mha_page_table", None, dict(page_size=0), ValueError, "page_size"),
    ("build_trtllm_mha_page_table", None, dict(page_size=True), TypeError, "page_size"),
    ("build_kv_read_table", None, dict(page_size=4.7), TypeError, "page_size"),
    ("build_kv_read_table", None, dict(max_pages=2.5), TypeError, "max_pages"),
    ("build_kv_read_table", None, dict(max_pages=-1), ValueError, "max_pages"),
    ("build_kv_read_table", None, dict(zero_tail=1), TypeError, "zero_tail"),
    ("build_kv_read_table", None, dict(seq_len_delta=0.5), TypeError, "seq_len_delta"),
    ("generate_draft_decode_kv_indices", None, dict(NUM_STEPS=-1), ValueError, "NUM_STEPS"),
    ("generate_draft_decode_kv_indices", None, dict(NUM_STEPS=2.0), TypeError, "NUM_STEPS"),
    ("generate_draft_decode_kv_indices", (-1, BATCH, 2), {}, ValueError, "grid[0]"),
    ("generate_draft_decode_kv_indices", (2, BATCH, 2.0), {}, TypeError, "grid[2]"),
    ("generate_draft_decode_kv_indices", (2, -1, 2), {}, ValueError, "grid[1]"),
    ("generate_draft_decode_kv_indices", (2, BATCH + 1, 2), {}, ValueError, "req_pool_indices"),
    ("generate_draft_decode_kv_indices", None, dict(page_size=4.7), TypeError, "page_size"),
    ("generate_draft_decode_kv_indices", None, dict(row_stride=64.0), TypeError, "row_stride"),
    ("generate_draft_decode_kv_indices", None, dict(ENTRY_PAGE_SIZE=0), ValueError, "ENTRY_PAGE_SIZE"),
    ("generate_draft_decode_kv_indices", None, dict(kv_indptr_stride=0), ValueError, "kv_indptr_stride"),
    ("generate_draft_decode_kv_indices", None, dict(TRANSLATE=1, v2p=torch.zeros(4, dtype=torch.int32)), TypeError,
     "TRANSLATE"),
    ("generate_draft_decode_kv_indices", None, dict(window_size=1.5), TypeError, "window_size"),
    ("generate_draft_decode_kv_indices", None, dict(ENTRY_PAGE_SIZE=1.0), TypeError, "ENTRY_PAGE_SIZE"),
    ("create_triton_kv_indices_for_dcp_triton", None, dict(dcp_size=0), ValueError, "dcp_size"),
    ("create_triton_kv_indices_for_dcp_triton", None, dict(dcp_size=-2), ValueError, "dcp_size"),
    ("create_triton_kv_indices_for_dcp_triton", None, dict(dcp_size=2.5), TypeError, "dcp_size"),
    ("create_triton_kv_indices_for_dcp_triton", None, dict(dcp_size=True), TypeError, "dcp_size"),
    ("create_triton_kv_indices_for_dcp_triton", None, dict(dcp_rank=2), ValueError, "dcp_rank"),
    ("create_triton_kv_indices_for_dcp_triton", None, dict(dcp_rank=-1), ValueError, "dcp_rank"),
    ("create_triton_kv_indices_for_dcp_triton", (-1,), {}, ValueError, "grid[0]"),
    ("create_triton_kv_indices_for_dcp_triton", (BATCH + 1,), {}, ValueError, "req_pool_indices_ptr"),
    ("create_triton_kv_indices_for_dcp_triton", lambda meta: (-meta["req_pool_indices_ptr"].shape[0],), {},
     ValueError, "grid[0]"),
    ("create_flashinfer_kv_indices_triton", lambda meta: (meta["page_kernel_lens_ptr"].shape[0], 0.5), {},
     TypeError, "grid[1]"),
    ("create_mla_kv_page_table_for_dcp", None, dict(DCP_SIZE=0), ValueError, "DCP_SIZE"),
    ("create_mla_kv_page_table_for_dcp", None, dict(DCP_SIZE=2.5), TypeError, "DCP_SIZE"),
    ("create_mla_kv_page_table_for_dcp", None, dict(DCP_SIZE=True), TypeError, "DCP_SIZE"),
    ("create_mla_kv_page_table_for_dcp", None, dict(DCP_RANK=2), ValueError, "DCP_RANK"),
    ("create_mla_kv_page_table_for_dcp", None, dict(PHYSICAL_PAGE_SIZE=4.7), TypeError, "PHYSICAL_PAGE_SIZE"),
    ("create_mla_kv_page_table_for_dcp", None, dict(PAGES_PER_BLOCK=0), ValueError, "PAGES_PER_BLOCK"),
    ("create_mla_kv_page_table_for_dcp", None, dict(block_table_stride=4.0), TypeError, "block_table_stride"),
    ("create_mla_kv_page_table_for_dcp", None, dict(HAS_V2P=1), TypeError, "HAS_V2P"),
    ("create_mla_kv_page_table_for_dcp", None, dict(HAS_V2P=True, v2p_ptr=torch.zeros(8, dtype=torch.float32)),
     TypeError, "v2p"),
    ("create_mla_kv_page_table_for_dcp", None, dict(HAS_V2P=True, v2p_ptr=None), TypeError, "v2p"),
    ("create_mla_kv_page_table_for_dcp", (BATCH + 2, 1), {}, ValueError, "grid[0]"),
    ("create_mla_kv_page_table_for_dcp", (-1, 1), {}, ValueError, "grid[0]"),
    ("create_mla_kv_page_table_for_dcp", (BATCH, 1.0), {}, TypeError, "grid[1]"),
    ("get_dcp_lens", None, dict(dcp_size=0), ValueError, "dcp_size"),
    ("get_dcp_lens", None, dict(dcp_size=-2), ValueError, "dcp_size"),
    ("get_dcp_lens", None, dict(dcp_size=2.5), TypeError, "dcp_size"),
    ("get_dcp_lens", None, dict(dcp_size=True), TypeError, "dcp_size"),
    ("get_dcp_lens", None, dict(dcp_rank=4), ValueError, "dcp_rank"),
    ("get_dcp_lens", None, dict(dcp_rank=-1), ValueError, "dcp_rank"),
    ("get_dcp_lens", None, dict(dcp_size=1, dcp_rank=1), ValueError, "dcp_rank"),
    ("get_dcp_lens", None, dict(lens=torch.ones(BATCH)), TypeError, "lens"),
    ("get_dcp_lens", None, dict(start=torch.zeros(BATCH + 1, dtype=torch.int64)), ValueError, "start"),
    ("get_dcp_lens", None, dict(interleave_size=0), ValueError, "interleave_size"),
    ("get_dcp_lens", None, dict(interleave_size=2.0), TypeError, "interleave_size"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case, grid, changes, error, words", BAD_VALUES,
                         ids=[f"{c}-{w}-{i}" for i, (c, _, _, _, w) in enumerate(BAD_VALUES)])
def test_bad_counts_sizes_ranks_and_grids(sglang, backend, case, grid, changes, error, words):
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    good_grid, arguments = CASES[case](g)
    changes = {name: value.to(DEVICE) if isinstance(value, torch.Tensor) else value for name, value in changes.items()}
    before = {name: t.clone() for name, t in _tensors(arguments).items()}
    with pytest.raises(error) as raised:
        _call(sglang, case, dict(arguments, **changes), grid if grid is not None else good_grid)
    assert words in str(raised.value)
    for name, t in before.items():
        assert_same(arguments[name], t.cpu(), f"{name} after a refused call")
    _call(sglang, case, arguments, good_grid)  # the good values pass


@pytest.mark.parametrize("dcp_size, dcp_rank", [(0, 0), (-2, 0), (2.5, 0), (True, 0), (2, 2), (2, -1), (1, 1),
                                                (4, 1.0), (1025, 0)])
def test_get_dcp_lens_refuses_as_dcp_local_lengths(dcp_size, dcp_rank):
    from kvdispatch.compat import sglang

    lens = torch.arange(4, dtype=torch.int32)
    errors = []
    for function in (sglang.get_dcp_lens, kvdispatch.dcp_local_lengths):
        with pytest.raises((TypeError, ValueError)) as raised:
            function(lens, dcp_size, dcp_rank)
        errors.append((type(raised.value), str(raised.value)))
    assert errors[0] == errors[1]


@pytest.mark.parametrize("call, error, words", [
    (lambda s: s.get_num_page_per_block_flashmla(0), ValueError, "page_size"),
    (lambda s: s.get_num_page_per_block_flashmla(4.7), TypeError, "page_size"),
    (lambda s: s.get_num_page_per_block_flashmla(True), TypeError, "page_size"),
    (lambda s: s.get_num_page_per_block_flashmla(8192), ValueError, "page_size"),
    (lambda s: s.get_num_kv_index_blocks_flashmla(-1, 64), ValueError, "kv_indices_width"),
    (lambda s: s.get_num_kv_index_blocks_flashmla(10, 0), ValueError, "page_size"),
    (lambda s: s.kv_indices_num_token_blocks(1.5, 1), TypeError, "table_width"),
    (lambda s: s.kv_indices_num_token_blocks(10, -1), ValueError, "base_programs"),
    (lambda s: s.spec_kv_index_token_blocks(10, 2.0, 3), TypeError, "kv_lens_sum"),
    (lambda s: s.spec_kv_index_token_blocks(10, None, -1), ValueError, "batch_size"),
    (lambda s: s.spec_kv_index_token_blocks(10, None, 3, context_len=True), TypeError, "context_len"),
    (lambda s: s.get_num_mha_kv_index_blocks(4, 0), ValueError, "page_size"),
    (lambda s: s.get_num_mha_kv_index_blocks(-4, 16), ValueError, "num_pages"),
    (lambda s: s.draft_kv_indices_buffer_width(-1, 2, 64), ValueError, "num_seqs"),
    (lambda s: s.draft_kv_indices_buffer_width(2, True, 64), TypeError, "topk"),
    (lambda s: s.draft_kv_indices_used_len(1.5, 2, 3, 1), TypeError, "seq_lens_sum"),
    (lambda s: s.draft_kv_indices_used_len(10, 2, 3, -1), ValueError, "num_steps"),
])
def test_grid_helpers_refuse_bad_values(call, error, words):
    from kvdispatch.compat import sglang

    with pytest.raises(error, match=words):
        call(sglang)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case, grid", [
    ("generate_draft_decode_kv_indices", (0, BATCH, 2)), ("generate_draft_decode_kv_indices", (2, BATCH, 0)),
    ("generate_draft_decode_kv_indices", (2, 0, 2)), ("create_trtllm_mha_kv_indices_triton", (0, 1)),
    ("create_triton_kv_indices_for_dcp_triton", (0,)), ("create_mla_kv_page_table_for_dcp", (0, 1)),
    ("create_mla_kv_page_table_for_dcp", (BATCH, 0)),
])
def test_a_read_grid_with_a_zero_launches_nothing(sglang, backend, case, grid):
    """The builders that read their grid write nothing for a grid without programs, as Triton launches none."""
    _, arguments = CASES[case](torch.Generator().manual_seed(torch.seed() % 2**31))
    before = {name: t.clone() for name, t in _tensors(arguments).items()}
    _call(sglang, case, arguments, grid)
    for name, t in before.items():
        assert_same(arguments[name], t.cpu(), name)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_callable_grid_gets_the_arguments_by_name(sglang, backend):
    """As Triton calls it: every argument by name, defaults included; the grid it gives is read and checked."""
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    grid, arguments = _draft(g)
    expected = {name: t.clone() for name, t in _tensors(arguments).items()}
    _call(sglang, "generate_draft_decode_kv_indices", dict(arguments, **expected), grid)
    seen = []

    def from_meta(meta):
        seen.append(meta)
        return grid

    _call(sglang, "generate_draft_decode_kv_indices", arguments, from_meta)
    assert seen[0]["NUM_STEPS"] == 0 and seen[0]["TRANSLATE"] is False and seen[0]["kv_indices"] is arguments[
        "kv_indices"]
    for name, t in expected.items():
        assert_same(arguments[name], t.cpu(), name)
    with pytest.raises(ValueError, match=r"grid\[1\]"):
        _call(sglang, "generate_draft_decode_kv_indices", arguments, lambda meta: (2, -1, 2))
