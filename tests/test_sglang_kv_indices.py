"""``kvdispatch.compat.sglang`` as a drop-in for SGLang's module ``sglang.kernels.ops.attention.kv_indices``.

Name by name: the module's public names, each function's parameters (names, order, defaults), the grid
helpers' values against SGLang's formulas, and each builder on the call patterns of SGLang's engines
(chunked-prefix MLA, the DCP prefix gather, the token CSR with a sliding window or a page-granular table,
the block table at every page size), on every backend under test, against the plain-loop oracle of
``kvcases`` on data drawn fresh per case. Outputs are poisoned before each call, so what must stay
untouched is checked too.
"""

from __future__ import annotations

import dataclasses
import inspect
import os

import pytest
import torch

from conftest import BACKENDS, DEVICE
from kvcases import POISON, assert_same, loop_page_table, loop_token_csr, make_case
import kvdispatch
from kvdispatch import dispatch
from kvdispatch.compat import sglang

REQUIRED = inspect.Parameter.empty

# SGLang's public names with their parameters, in order, and defaults.
SGLANG_FUNCTIONS = {
    "create_flashinfer_kv_indices_triton": [
        ("req_to_token_ptr", REQUIRED), ("req_pool_indices_ptr", REQUIRED), ("page_kernel_lens_ptr", REQUIRED),
        ("kv_indptr", REQUIRED), ("kv_start_idx", REQUIRED), ("kv_indices_ptr", REQUIRED),
        ("req_to_token_ptr_stride", REQUIRED), ("ENTRY_PAGE_SIZE", 1), ("TOKEN_BLOCK_PARALLEL", False),
        ("token_mapping", None)],
    "create_chunked_prefix_cache_kv_indices": [
        ("req_to_token_ptr", REQUIRED), ("req_pool_indices_ptr", REQUIRED), ("chunk_start_idx_ptr", REQUIRED),
        ("chunk_seq_lens_ptr", REQUIRED), ("chunk_cu_seq_lens_ptr", REQUIRED), ("chunk_kv_indices_ptr", REQUIRED),
        ("req_to_token_ptr_stride", REQUIRED)],
    "create_flashmla_kv_indices_triton": [
        ("req_to_token_ptr", REQUIRED), ("req_pool_indices_ptr", REQUIRED), ("page_kernel_lens_ptr", REQUIRED),
        ("kv_start_idx", REQUIRED), ("kv_indices_ptr", REQUIRED), ("req_to_token_ptr_stride", REQUIRED),
        ("kv_indices_ptr_stride", REQUIRED), ("PAGED_SIZE", 64)],
    "get_num_page_per_block_flashmla": [("page_size", 64)],
    "get_num_kv_index_blocks_flashmla": [("kv_indices_width", REQUIRED), ("page_size", REQUIRED)],
    "kv_indices_num_token_blocks": [("table_width", REQUIRED), ("base_programs", REQUIRED)],
    "spec_kv_index_token_blocks": [
        ("table_width", REQUIRED), ("kv_lens_sum", REQUIRED), ("batch_size", REQUIRED), ("base_programs", None),
        ("length_cap", None), ("context_len", None)],
    "get_num_mha_kv_index_blocks": [("num_pages", REQUIRED), ("page_size", REQUIRED)],
    "create_trtllm_mha_kv_indices_triton": [
        ("req_to_token_ptr", REQUIRED), ("req_pool_indices_ptr", REQUIRED), ("seq_lens_ptr", REQUIRED),
        ("full_to_swa_ptr", REQUIRED), ("page_table_ptr", REQUIRED), ("swa_page_table_ptr", REQUIRED),
        ("full_to_swa_numel", REQUIRED), ("req_to_token_stride", REQUIRED), ("page_table_stride", REQUIRED),
        ("PAGE_SIZE", REQUIRED), ("HAS_SWA", REQUIRED)],
    "build_trtllm_mha_page_table": [
        ("req_to_token", REQUIRED), ("req_pool_indices", REQUIRED), ("cache_seqlens", REQUIRED),
        ("page_table", REQUIRED), ("page_size", REQUIRED), ("swa_page_table", None), ("full_to_swa", None)],
    "build_kv_read_table": [
        ("req_to_token", REQUIRED), ("req_pool_indices", REQUIRED), ("seq_lens", REQUIRED), ("v2p", REQUIRED),
        ("page_size", REQUIRED), ("max_pages", REQUIRED), ("out", REQUIRED), ("seq_len_delta", 0),
        ("zero_tail", False)],
    "create_triton_kv_indices_for_dcp_triton": [
        ("req_to_token_ptr", REQUIRED), ("req_pool_indices_ptr", REQUIRED), ("dcp_kernel_lens_ptr", REQUIRED),
        ("kv_indptr", REQUIRED), ("kv_start_idx", REQUIRED), ("kv_indices_ptr", REQUIRED),
        ("req_to_token_ptr_stride", REQUIRED), ("dcp_size", REQUIRED), ("dcp_rank", REQUIRED)],
    "create_mla_kv_page_table_for_dcp": [
        ("req_to_token_ptr", REQUIRED), ("req_pool_indices_ptr", REQUIRED), ("local_seq_lens_ptr", REQUIRED),
        ("block_kv_indices_ptr", REQUIRED), ("v2p_ptr", REQUIRED), ("req_to_token_stride", REQUIRED),
        ("block_table_stride", REQUIRED), ("PHYSICAL_PAGE_SIZE", REQUIRED), ("DCP_SIZE", REQUIRED),
        ("DCP_RANK", REQUIRED), ("PAGES_PER_BLOCK", REQUIRED), ("HAS_V2P", REQUIRED)],
    "get_dcp_lens": [("lens", REQUIRED), ("dcp_size", REQUIRED), ("dcp_rank", REQUIRED), ("start", None),
                     ("interleave_size", 1)],
    "compact_dcp_verify_token_table_to_ragged": [
        ("token_table_ptr", REQUIRED), ("local_kv_lens_ptr", REQUIRED), ("kv_indptr_ptr", REQUIRED),
        ("kv_indices_ptr", REQUIRED), ("table_stride", REQUIRED), ("Q_LEN", REQUIRED), ("BLOCK_SIZE", REQUIRED)],
    "update_kv_lens_and_indices": [
        ("kv_lens", REQUIRED), ("kv_lens_cumsum", REQUIRED), ("kv_indices", REQUIRED), ("local_kv_lens", REQUIRED),
        ("local_kv_lens_cumsum", REQUIRED), ("local_kv_indices", REQUIRED), ("dcp_rank", REQUIRED),
        ("dcp_world_size", REQUIRED), ("BLOCK_SIZE", REQUIRED)],
    "create_dcp_kv_indices": [
        ("kv_indptr", REQUIRED), ("extend_lens_ptr", REQUIRED), ("extend_cu_lens_ptr", REQUIRED),
        ("extend_prefix_lens_ptr", REQUIRED), ("extend_cu_prefix_lens_ptr", REQUIRED), ("kv_indices_ptr", REQUIRED),
        ("extend_prefix_lens_sum", REQUIRED), ("dcp_world_size", REQUIRED)],
}
SGLANG_FUNCTIONS.update({
    "scatter_ragged_to_page_table_kernel": [(name, REQUIRED) for name in (
        "kv_flat_ptr", "kv_indptr_ptr", "dest_ptr", "dest_stride", "sw_page_table_ptr", "swa_slot_mapping_ptr",
        "PAGE_SIZE", "BLOCK_SIZE", "HAS_SWA")],
    "scatter_req_to_token_to_page_table_kernel": [(name, REQUIRED) for name in (
        "req_to_token_ptr", "req_pool_indices_ptr", "seq_lens_ptr", "page_table_ptr", "req_to_token_stride",
        "page_table_stride", "sw_page_table_ptr", "swa_slot_mapping_ptr", "DRAFT_NUM", "PAGE_SIZE", "BLOCK_SIZE",
        "HAS_SWA")],
})
SGLANG_FUNCTIONS["_build_pa_page_table"] = [(name, REQUIRED) for name in (
    "req_to_token", "req_pool_indices", "seq_lens", "prefill_lens", "window_size", "bs", "pa_max_len", "device")] + [
    ("dst_page_table", None), ("dst_kv_lens", None)]
SGLANG_FUNCTIONS["build_unified_kv_indices"] = [(name, REQUIRED) for name in (
    "prefix_kv_indptr", "prefix_kv_indices", "extend_start_loc", "extend_seq_lens", "extend_kv_indices", "bs")]
SGLANG_FUNCTIONS["prepare_swa_spec_page_table_triton"] = [(name, REQUIRED) for name in (
    "page_table_dst", "page_table_a", "page_table_b", "seq_len_a", "seq_len_b", "speculative_num_draft_tokens")]
SGLANG_CONSTANTS = {"SPEC_KV_INDEX_BLOCKS_MIN_CONTEXT": 32768}
# Functions whose parameters are all keyword-only in SGLang.
KEYWORD_ONLY = {"build_kv_read_table"}
# SGLang's speculative draft builder and its buffer sizing helpers (tests/test_draft_decode.py tests them).
# The unified pool's packed read stream (tests/test_sglang_read_draft.py tests it against the release).
SGLANG_FUNCTIONS["build_kv_read_table_packed"] = [
    ("req_to_token", REQUIRED), ("req_pool_indices", REQUIRED), ("seq_lens", REQUIRED), ("v2p", REQUIRED),
    ("indptr", REQUIRED), ("page_size", REQUIRED), ("max_tokens", REQUIRED), ("out", REQUIRED), ("kv_start_idx", None)]
KEYWORD_ONLY.add("build_kv_read_table_packed")
BUILDERS = [name for name in SGLANG_FUNCTIONS if name.startswith("create_")]
INDEX_DTYPES = (torch.int32, torch.int64)


# -- the module's surface -------------------------------------------------------------------------------------

def test_public_names_are_sglangs():
    from test_sglang_release import RELEASE  # noqa: PLC0415  (the release's names, module by module)

    assert set(sglang.__all__) == {name for names in RELEASE.values() for name in names}
    namespace = {}
    exec("from kvdispatch.compat.sglang import *", namespace)
    assert set(SGLANG_FUNCTIONS) | set(SGLANG_CONSTANTS) <= set(namespace)
    for name, value in SGLANG_CONSTANTS.items():
        assert getattr(sglang, name) == value, name


@pytest.mark.parametrize("name", SGLANG_FUNCTIONS)
def test_parameters_are_sglangs(name):
    function = getattr(sglang, name)
    callables = [function, function[(3,)], function[lambda meta: (3, 2)]] if name in BUILDERS else [function]
    for target in callables:
        parameters = inspect.signature(target).parameters.values()
        assert [(p.name, p.default) for p in parameters] == SGLANG_FUNCTIONS[name]
        kind = inspect.Parameter.KEYWORD_ONLY if name in KEYWORD_ONLY else inspect.Parameter.POSITIONAL_OR_KEYWORD
        assert all(p.kind is kind for p in parameters)
    assert function.__name__ == name


def test_grid_helpers_follow_sglangs_formulas():
    def cdiv(a, b):
        return (a + b - 1) // b

    assert sglang.get_num_page_per_block_flashmla() == 4096 // 64
    for page_size in (1, 2, 5, 16, 32, 64, 96, 128, 4096):
        assert sglang.get_num_page_per_block_flashmla(page_size) == 4096 // page_size
        for width in (0, 1, 2, 31, 64, 65, 4095, 4096, 4097, 131072, 131073):
            assert sglang.get_num_kv_index_blocks_flashmla(width, page_size) == cdiv(width, 4096 // page_size)
            assert sglang.get_num_mha_kv_index_blocks(width, page_size) == cdiv(width, 4096 // page_size)
    for table_width in (0, 1, 8191, 8192, 8193, 32767, 32768, 65536, 262144, 10**7):
        for base_programs in (0, 1, 3, 64, 511, 512, 513, 4096):
            blocks = max(1, min(cdiv(table_width, 8192), 512 // max(1, base_programs)))
            assert sglang.kv_indices_num_token_blocks(table_width, base_programs) == blocks


def _spec_token_blocks(table_width, kv_lens_sum, batch_size, base_programs=None, length_cap=None, context_len=None):
    """SGLang's speculative-decode token-block rule, spelled out."""
    if (table_width if context_len is None else context_len) < 32768 or batch_size <= 0:
        return 1
    width = table_width if kv_lens_sum is None else min([kv_lens_sum, table_width] + (
        [] if length_cap is None else [length_cap]))
    programs = batch_size if base_programs is None else base_programs
    return max(1, min(-(-width // 8192), 512 // max(1, programs)))


def test_spec_kv_index_token_blocks_follows_sglangs_rule():
    assert sglang.SPEC_KV_INDEX_BLOCKS_MIN_CONTEXT == 32768
    for table_width in (0, 8192, 32767, 32768, 131072, 10**6):
        for kv_lens_sum in (None, 0, 5000, 40000, 10**7):
            for batch_size in (0, 1, 3, 64, 600):
                for extra in ({}, dict(base_programs=2), dict(length_cap=9000), dict(context_len=10**6),
                              dict(context_len=100, base_programs=0), dict(length_cap=0, base_programs=1)):
                    expected = _spec_token_blocks(table_width, kv_lens_sum, batch_size, **extra)
                    got = sglang.spec_kv_index_token_blocks(table_width, kv_lens_sum, batch_size, **extra)
                    assert got == expected, (table_width, kv_lens_sum, batch_size, extra)


# -- helpers -------------------------------------------------------------------------------------------------

def _cases(batch, page_size, index_dtype, **options):
    return make_case(batch, page_size, index_dtype=index_dtype, device=DEVICE, **options)


def _poisoned(length, dtype=torch.int32):
    return torch.full((length,), POISON, dtype=dtype, device=DEVICE)


def _check_segments(out, offsets, case, starts, lens):
    """Segment ``b`` of ``out`` (at ``offsets[b]``) is request ``b``'s table row from ``starts[b]`` on."""
    table = case.req_to_token.cpu()
    for b, row in enumerate(case.req_pool_indices.tolist()):
        begin, start, length = int(offsets[b]), int(starts[b]), int(lens[b])
        assert out[begin: begin + length].cpu().tolist() == table[row, start: start + length].tolist(), f"request {b}"


# -- create_chunked_prefix_cache_kv_indices ------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("offsets", ("leading_zero", "exclusive"))
def test_chunked_prefix(backend, index_dtype, offsets, compat):
    """``ForwardBatch.prepare_chunked_kv_indices``: chunk ``idx`` starts at ``idx * chunk_len``; lengths are
    ``clamp(min(prefix, start + chunk_len) - start, 0)``; offsets a ``[num_chunks, bs + 1]`` cumsum with a
    leading 0, or the exclusive prefix sum of length ``bs`` (only entry ``b`` is read)."""
    case = _cases(4, 1, index_dtype, max_pages=260)
    bs, chunk_len = case.batch, 64
    prefix = case.seq_lens.clone()
    prefix[int(torch.randint(0, bs, (1,)))] = 0  # a request without a cached prefix
    num_chunks = -(-int(prefix.max()) // chunk_len)
    starts = (torch.arange(num_chunks, device=DEVICE)[:, None] * chunk_len).expand(num_chunks, bs)
    lens = (torch.minimum(prefix.long()[None, :], starts + chunk_len) - starts).clamp(min=0)
    cu = torch.zeros(num_chunks, bs + 1, dtype=torch.int64, device=DEVICE)
    cu[:, 1:] = torch.cumsum(lens, 1)
    starts, lens, cu = (t.to(index_dtype).contiguous() for t in (starts, lens, cu))
    table = case.req_to_token
    gathered = [[] for _ in range(bs)]
    for idx in range(num_chunks):
        chunk_offsets = cu[idx] if offsets == "leading_zero" else cu[idx, :bs]
        out = _poisoned(int(cu[idx, -1]) + 3)
        chunk = dataclasses.replace(case, seq_lens=lens[idx], kv_start_idx=starts[idx])
        expected = loop_token_csr(chunk, chunk_offsets.cpu(), out)
        result = compat.create_chunked_prefix_cache_kv_indices[(bs,)](
            table, case.req_pool_indices, starts[idx], lens[idx], chunk_offsets, out, table.shape[1])
        assert result is out
        assert_same(out, expected, f"chunk {idx}")
        for b in range(bs):
            gathered[b] += out[int(cu[idx, b]): int(cu[idx, b + 1])].cpu().tolist()
    _check_segments(torch.tensor(sum(gathered, [])), [0] + torch.cumsum(prefix.cpu(), 0).tolist(), case,
                    [0] * bs, prefix)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
def test_dcp_prefix_gather(backend, index_dtype, compat):
    """The MLA decode-context-parallel prefix gather: starts 0, lengths the extend prefix lengths, offsets
    the exclusive prefix sum of length ``bs``, an output of exactly the total."""
    case = _cases(5, 16, index_dtype, max_pages=8)
    bs = case.batch
    prefix = case.seq_lens.clone()
    prefix[int(torch.randint(0, bs, (1,)))] = 0
    starts = torch.zeros(bs, dtype=torch.int32, device=DEVICE)
    offsets = (torch.cumsum(prefix, 0) - prefix).to(index_dtype)
    total = int(prefix.sum())
    store = _poisoned(total + 4)
    out = store[:total]
    expected = loop_token_csr(dataclasses.replace(case, seq_lens=prefix, kv_start_idx=starts), offsets.cpu(), store)
    compat.create_chunked_prefix_cache_kv_indices[(bs,)](case.req_to_token, case.req_pool_indices, starts, prefix,
                                                         offsets, out, case.req_to_token.shape[1])
    assert_same(store, expected, "prefix gather")
    _check_segments(out, offsets, case, starts, prefix)


# -- create_flashinfer_kv_indices_triton ---------------------------------------------------------------------

@pytest.mark.representative("window", "token_blocks")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("out_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("window", (None, 48))
@pytest.mark.parametrize("token_blocks", (False, True))
def test_token_csr(backend, index_dtype, out_dtype, window, token_blocks, compat):
    """The Triton and FlashInfer backends' token CSR (int64 / int32 ``kv_indices``), whole sequences or a
    sliding window (``kv_start_idx = seq_lens - window lengths``), launched per request or with token
    blocks (grid ``(bs, kv_indices_num_token_blocks(...))``, ``TOKEN_BLOCK_PARALLEL=True``)."""
    case = _cases(5, 1, index_dtype, max_pages=200, strided_table=True)
    table, bs = case.req_to_token, case.batch
    lens, starts = case.seq_lens, None
    if window is not None:
        lens = case.seq_lens.clamp(max=window)
        starts = case.seq_lens - lens
    kv_indptr = torch.zeros(bs + 1, dtype=torch.int32, device=DEVICE)
    kv_indptr[1:] = torch.cumsum(lens, 0)
    out = _poisoned(int(kv_indptr[-1]) + 2, out_dtype)
    expected = loop_token_csr(dataclasses.replace(case, seq_lens=lens, kv_start_idx=starts), kv_indptr.cpu(), out)
    if token_blocks:
        grid = (bs, sglang.kv_indices_num_token_blocks(table.shape[1], bs))
        result = compat.create_flashinfer_kv_indices_triton[grid](table, case.req_pool_indices, lens, kv_indptr,
                                                                  starts, out, table.stride(0),
                                                                  TOKEN_BLOCK_PARALLEL=True)
    else:
        result = compat.create_flashinfer_kv_indices_triton[(bs,)](table, case.req_pool_indices, lens, kv_indptr,
                                                                   starts, out, table.stride(0))
    assert result is out
    assert_same(out, expected, "token CSR")
    _check_segments(out, kv_indptr, case, starts if starts is not None else [0] * bs, lens)


def _sglang_token_csr(table, rows, starts, lens, kv_indptr, out, entry_page_size, token_mapping):
    """The token CSR with SGLang's page-granular table and token mapping, as a plain loop."""
    table, result = table.cpu().tolist(), out.cpu().clone()
    mapping = token_mapping.cpu().tolist() if token_mapping is not None else None
    for b, row in enumerate(rows.tolist()):
        for j in range(int(lens[b])):
            q = int(starts[b]) + j
            value = table[row][q // entry_page_size] * entry_page_size + q % entry_page_size
            if mapping is not None:
                value = mapping[value] if value >= 0 else -1
            result[int(kv_indptr[b]) + j] = value
    return result


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("entry_page_size,mapped", [(16, False), (1, True), (16, True)])
@pytest.mark.parametrize("token_blocks", (False, True))
def test_token_csr_page_granular_and_mapped(backend, entry_page_size, mapped, token_blocks, compat):
    """``ENTRY_PAGE_SIZE`` (one table entry per page; start 7, int32 lengths as in SGLang's grid test) and
    ``token_mapping`` (non-negative ids mapped, negative ones -1), forwarded to the public API."""
    case = _cases(3, 1 if entry_page_size > 1 else 16, torch.int32, max_pages=12)
    table, bs = case.req_to_token.clone(), case.batch
    start = 7
    readable = table.shape[1] * entry_page_size - start  # tokens from the start to the table's end
    lens = torch.randint(1, readable + 1, (bs,), dtype=torch.int32, device=DEVICE)
    starts = torch.full((bs,), start, dtype=torch.int32, device=DEVICE)
    mapping = None
    if mapped:
        table[int(case.req_pool_indices[0]), (start + int(lens[0]) // 2) // entry_page_size] = -1
        slots = (int(table.max()) + 1) * entry_page_size
        mapping = torch.randperm(slots, device=DEVICE) + 1000
    kv_indptr = torch.zeros(bs + 1, dtype=torch.int32, device=DEVICE)
    kv_indptr[1:] = torch.cumsum(lens, 0)
    out = _poisoned(int(kv_indptr[-1]) + 2)
    expected = _sglang_token_csr(table, case.req_pool_indices.cpu(), starts.cpu(), lens.cpu(), kv_indptr.cpu(), out,
                                 entry_page_size, mapping)
    grid = (bs, sglang.kv_indices_num_token_blocks(table.shape[1], bs)) if token_blocks else (bs,)
    compat.create_flashinfer_kv_indices_triton[grid](table, case.req_pool_indices, lens, kv_indptr, starts, out,
                                                     table.stride(0), entry_page_size, token_blocks,
                                                     token_mapping=mapping)
    assert_same(out, expected, "token CSR")


def test_token_csr_forwards_options_only_when_set(monkeypatch):
    """Today's call (no ``entry_page_size=`` / ``token_mapping=``) unless one of them is not the default."""
    from kvdispatch.compat.sglang import _common

    calls = []
    monkeypatch.setattr(_common, "_build_token_csr", lambda *args, **keywords: calls.append(keywords))
    table = torch.zeros(2, 8, dtype=torch.int32)
    mapping = torch.arange(16)
    arguments = (table, None, None, None, "start", None, table.stride(0))
    sglang.create_flashinfer_kv_indices_triton[(2,)](*arguments)
    sglang.create_flashinfer_kv_indices_triton[(2, 4)](*arguments, TOKEN_BLOCK_PARALLEL=True)
    sglang.create_flashinfer_kv_indices_triton(*arguments, ENTRY_PAGE_SIZE=16)
    sglang.create_flashinfer_kv_indices_triton(*arguments, token_mapping=mapping)
    assert calls == [{"kv_start_idx": "start"}, {"kv_start_idx": "start"},
                     {"kv_start_idx": "start", "entry_page_size": 16, "token_mapping": None},
                     {"kv_start_idx": "start", "entry_page_size": 1, "token_mapping": mapping}]
    with pytest.raises(TypeError):
        sglang.create_flashinfer_kv_indices_triton(*arguments, BOGUS=1)


# -- create_flashmla_kv_indices_triton -----------------------------------------------------------------------

@pytest.mark.representative("page_size", "layout")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("page_size", (1, 16, 32, 64, 128, 5))
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("layout", ("plain", "start", "narrow"))
def test_block_table(backend, page_size, index_dtype, layout, compat):
    """The MLA backends' block table, grid ``(bs, get_num_kv_index_blocks_flashmla(width, page))``, strided
    table and buffer rows, with ``kv_start_idx`` ("start"), and rows needing more pages than the buffer is
    wide ("narrow": SGLang would write the rest into the next row; here the row ends at the width)."""
    case = _cases(3, page_size, index_dtype, max_pages=5, strided_table=True, strided_out=True,
                  with_start=layout == "start", width=2 if layout == "narrow" else None)
    out = case.page_table_out()
    expected = loop_page_table(case, out)
    table = case.req_to_token
    grid = (case.batch, sglang.get_num_kv_index_blocks_flashmla(case.width, page_size))
    paged_size = {} if page_size == 64 else {"PAGED_SIZE": page_size}  # 64: SGLang's default
    result = compat.create_flashmla_kv_indices_triton[grid](table, case.req_pool_indices, case.seq_lens,
                                                            case.kv_start_idx, out, table.stride(0), out.stride(0),
                                                            **paged_size)
    assert result is out
    assert_same(out, expected, "block table")


@pytest.mark.parametrize("backend", BACKENDS)
def test_block_table_flat_buffer(backend, compat):
    """A 1-D ``kv_indices_ptr`` is rows of ``kv_indices_ptr_stride`` entries; the rest stays untouched."""
    case = _cases(3, 16, torch.int64, max_pages=5, width=7)
    flat = _poisoned(case.batch * 7 + 5)
    expected = loop_page_table(case, flat[: case.batch * 7].view(case.batch, 7))
    compat.create_flashmla_kv_indices_triton(case.req_to_token, case.req_pool_indices, case.seq_lens, None, flat,
                                             case.req_to_token.stride(0), 7, 16)
    assert_same(flat[: case.batch * 7].view(case.batch, 7), expected, "flat block table")
    assert (flat[case.batch * 7:] == POISON).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_block_table_rounds_negative_slots_toward_zero(backend, compat):
    """As SGLang's kernel: a negative slot id's page is rounded toward zero."""
    table = torch.tensor([[-65, -64, -1, 0, 63, 64, 65, 130]], dtype=torch.int32, device=DEVICE)
    one = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    out = torch.full((1, 8), POISON, dtype=torch.int32, device=DEVICE)
    compat.create_flashmla_kv_indices_triton(table, one, one + 8, None, out, 8, 8, 1)
    assert out.cpu().tolist() == [[-65, -64, -1, 0, 63, 64, 65, 130]]  # page size 1: the same as SGLang's
    slots = torch.tensor([[-65] + [0] * 63 + [-64] + [0] * 63 + [-1] + [0] * 63], dtype=torch.int32, device=DEVICE)
    out.fill_(POISON)
    compat.create_flashmla_kv_indices_triton(slots, one, one + 192, None, out, slots.stride(0), 8)
    assert out[0, :3].cpu().tolist() == [-1, -1, 0]  # kvdispatch's default floors: [-2, -1, -1]
    assert (out[0, 3:] == POISON).all()


# -- all builders --------------------------------------------------------------------------------------------

def _tiny_case():
    return _cases(3, 16, torch.int64, max_pages=4, width=6)


def test_builders_forward_to_public_api():
    """Unrouted: the drop-ins reach ``kvdispatch.create_flashmla_kv_indices`` /
    ``kvdispatch.create_flashinfer_kv_indices`` (auto selection) and give what they give."""
    if os.environ.get("KVDISPATCH_BACKEND", "auto") not in dispatch.CHOICES:
        pytest.skip("KVDISPATCH_BACKEND names a test-only backend")
    case = _tiny_case()
    table, rows, lens = case.req_to_token, case.req_pool_indices, case.seq_lens
    kv = torch.full((3, 6), -1, dtype=torch.int32, device=DEVICE)
    direct = kvdispatch.create_flashmla_kv_indices(table, rows, lens, kv.clone(), page_size=16)
    assert sglang.create_flashmla_kv_indices_triton[(3, 1)](table, rows, lens, None, kv, table.stride(0), 6,
                                                            PAGED_SIZE=16) is kv
    assert_same(kv, direct.cpu(), "block table")
    kv_indptr = torch.cumsum(lens, 0) - lens
    out = _poisoned(int(lens.sum()))
    direct = kvdispatch.create_flashinfer_kv_indices(table, rows, lens, kv_indptr, out.clone())
    for builder in (sglang.create_flashinfer_kv_indices_triton, sglang.create_chunked_prefix_cache_kv_indices):
        out.fill_(POISON)
        if builder is sglang.create_flashinfer_kv_indices_triton:
            builder[(3,)](table, rows, lens, kv_indptr, None, out, table.stride(0))
        else:
            builder[(3,)](table, rows, torch.zeros_like(lens), lens, kv_indptr, out, table.stride(0))
        assert_same(out, direct.cpu(), builder.__name__)


@pytest.mark.parametrize("backend", BACKENDS)
def test_builders_check_strides(backend, compat):
    case = _tiny_case()
    table, rows, lens = case.req_to_token, case.req_pool_indices, case.seq_lens
    kv = torch.full((3, 6), -1, dtype=torch.int32, device=DEVICE)
    kv_indptr = torch.cumsum(lens, 0) - lens
    out = _poisoned(int(lens.sum()))
    with pytest.raises(ValueError, match="req_to_token_ptr_stride"):
        compat.create_flashmla_kv_indices_triton(table, rows, lens, None, kv, table.stride(0) + 1, 6, PAGED_SIZE=16)
    with pytest.raises(ValueError, match="kv_indices_ptr_stride"):
        compat.create_flashmla_kv_indices_triton(table, rows, lens, None, kv, table.stride(0), 7, PAGED_SIZE=16)
    with pytest.raises(ValueError, match="kv_indices_ptr_stride"):
        compat.create_flashmla_kv_indices_triton(table, rows, lens, None, kv.view(-1), table.stride(0), None, 16)
    with pytest.raises(ValueError, match="req_to_token_ptr_stride"):
        compat.create_flashinfer_kv_indices_triton(table, rows, lens, kv_indptr, None, out, table.stride(0) - 1)
    with pytest.raises(ValueError, match="req_to_token_ptr_stride"):
        compat.create_chunked_prefix_cache_kv_indices(table, rows, torch.zeros_like(lens), lens, kv_indptr, out,
                                                      table.stride(0) + 2)
    assert (kv == -1).all() and (out == POISON).all()  # nothing written by a refused call
