"""Each ``kvdispatch.compat.sglang`` drop-in against SGLang 0.5.23's own code, element for element.

Where SGLang's source is at hand (see ``test_sglang_release._release_root``) and Triton runs (on CPU in its
interpreter), the release's kernels and helpers are loaded from their files, without the rest of SGLang (the
draft builder and ``get_dcp_lens`` are taken out of their modules with ``ast``, as their modules import
SGLang's runtime), and run on the call patterns of SGLang's call sites, on data where SGLang stays inside every
row (the one intended difference aside). Both write into copies of the same poisoned buffers; every element
of every buffer must be equal, the untouched ones included. The drop-ins run on every backend under test.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from conftest import BACKENDS, DEVICE
from kvcases import POISON, assert_same
from test_sglang_release import _release_root

ROOT = _release_root()
pytestmark = pytest.mark.skipif(ROOT is None, reason="SGLang's source is not here (set SGLANG_SOURCE)")


def _load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """``release(tail)``: the release's module ``sglang.<tail>`` loaded from its file; with ``extract``, only
    those top-level functions, written after ``header`` to a file of their own (Triton reads a kernel's source
    from its file)."""
    pytest.importorskip("triton")
    loaded = {}

    def load(tail, extract=None, header="import triton\nimport triton.language as tl\n"):
        if tail in loaded:
            return loaded[tail]
        path = ROOT / "sglang" / Path(*tail.split(".")).with_suffix(".py")
        if not path.is_file():
            pytest.skip(f"{path} is not in this copy of SGLang")
        name = "sglang_release_" + tail.replace(".", "_")
        if extract is not None:
            lines = path.read_text().splitlines()
            nodes = [node for node in ast.parse("\n".join(lines)).body
                     if isinstance(node, ast.FunctionDef) and node.name in extract]
            first = [node.decorator_list[0].lineno if node.decorator_list else node.lineno for node in nodes]
            text = header + "\n\n".join("\n".join(lines[begin - 1: node.end_lineno])
                                        for begin, node in zip(first, nodes))
            path = tmp_path_factory.mktemp("sglang_release") / f"{name}.py"
            path.write_text(text + "\n")
        module = _load(path, name)
        sys.modules[name] = module
        loaded[tail] = module
        return module

    return load


def _generator():
    return torch.Generator().manual_seed(torch.seed() % 2**31)


def _pool(rows, cols, batch, g):
    """``req_to_token`` (distinct slot ids, int32 ``[rows, cols]``) and ``batch`` distinct rows of it, int64."""
    table = torch.randperm(rows * cols * 2, generator=g)[: rows * cols].view(rows, cols).to(torch.int32)
    return table.to(DEVICE), torch.randperm(rows, generator=g)[:batch].to(DEVICE)


def _cumsum(lens, leading_zero=True):
    sums = torch.cumsum(lens.cpu().long(), 0)
    values = torch.cat([torch.zeros(1, dtype=torch.long), sums]) if leading_zero else sums - lens.cpu().long()
    return values.to(torch.int32).to(DEVICE)


def _twins(*buffers):
    """Copies of each buffer: one for SGLang, one for the drop-in."""
    return [b.clone() for b in buffers], [b.clone() for b in buffers]


def _same(ours, theirs, what):
    for index, (a, b) in enumerate(zip(ours, theirs)):
        assert_same(a, b.cpu(), f"{what} (buffer {index})")


# -- kernels.ops.attention.kv_indices ------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("out_dtype", (torch.int32, torch.int64))
@pytest.mark.parametrize("variant", ("plain", "start", "token_blocks", "entry_pages", "mapped"))
def test_token_csr(backend, out_dtype, variant, release, compat):
    kv = release("kernels.ops.attention.kv_indices")
    g = _generator()
    rows, cols, batch = 6, 96, 4
    entry = 16 if variant == "entry_pages" else 1
    table, pool = _pool(rows, cols, batch, g)
    start = None
    if variant == "start":
        start = torch.randint(0, 40, (batch,), generator=g).to(torch.int32).to(DEVICE)
    room = cols * entry - (0 if start is None else int(start.max()))
    lens = torch.randint(0, room + 1, (batch,), generator=g).to(torch.int32).to(DEVICE)
    mapping = None
    if variant == "mapped":
        table[int(pool[0]), 3] = -1
        mapping = torch.randperm(rows * cols * 2 + 1, generator=g).to(DEVICE)
    indptr = _cumsum(lens)
    out = torch.full((int(indptr[-1]) + 5,), POISON, dtype=out_dtype, device=DEVICE)
    grid = (batch, compat.kv_indices_num_token_blocks(cols, batch)) if variant == "token_blocks" else (batch,)
    (theirs,), (ours,) = _twins(out)
    arguments = (table, pool, lens, indptr, start)
    options = dict(ENTRY_PAGE_SIZE=entry, TOKEN_BLOCK_PARALLEL=variant == "token_blocks", token_mapping=mapping)
    kv.create_flashinfer_kv_indices_triton[grid](*arguments, theirs, table.stride(0), **options)
    compat.create_flashinfer_kv_indices_triton[grid](*arguments, ours, table.stride(0), **options)
    _same([ours], [theirs], variant)


@pytest.mark.parametrize("backend", BACKENDS)
def test_chunked_prefix(backend, release, compat):
    kv = release("kernels.ops.attention.kv_indices")
    g = _generator()
    rows, cols, batch, chunk = 5, 160, 3, 64
    table, pool = _pool(rows, cols, batch, g)
    prefix = torch.randint(0, cols + 1, (batch,), generator=g)
    for index in range(-(-int(prefix.max()) // chunk)):
        starts = torch.full((batch,), index * chunk, dtype=torch.int64)
        lens = (torch.minimum(prefix, starts + chunk) - starts).clamp(min=0)
        cu = _cumsum(lens)
        out = torch.full((int(cu[-1]) + 3,), POISON, dtype=torch.int32, device=DEVICE)
        (theirs,), (ours,) = _twins(out)
        arguments = (table, pool, starts.to(DEVICE), lens.to(DEVICE), cu)
        kv.create_chunked_prefix_cache_kv_indices[(batch,)](*arguments, theirs, table.stride(0))
        compat.create_chunked_prefix_cache_kv_indices[(batch,)](*arguments, ours, table.stride(0))
        _same([ours], [theirs], f"chunk {index}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("page_size", (1, 16, 64))
@pytest.mark.parametrize("layout", ("rows", "start", "flat"))
def test_block_table(backend, page_size, layout, release, compat):
    kv = release("kernels.ops.attention.kv_indices")
    g = _generator()
    rows, cols, batch = 5, 4 * 64, 3
    table, pool = _pool(rows, cols, batch, g)
    start = torch.randint(0, 30, (batch,), generator=g).to(DEVICE) if layout == "start" else None
    lens = torch.randint(1, cols - 30 + 1, (batch,), generator=g).to(torch.int32).to(DEVICE)
    width = -(-cols // page_size) + 2
    out = torch.full((batch + 1, width), -1, dtype=torch.int32, device=DEVICE)
    if layout == "flat":
        out = out.view(-1)
    grid = (batch, kv.get_num_kv_index_blocks_flashmla(width, page_size))
    (theirs,), (ours,) = _twins(out)
    arguments = (table, pool, lens, start)
    kv.create_flashmla_kv_indices_triton[grid](*arguments, theirs, table.stride(0), width, PAGED_SIZE=page_size)
    compat.create_flashmla_kv_indices_triton[grid](*arguments, ours, table.stride(0), width, PAGED_SIZE=page_size)
    _same([ours], [theirs], layout)


def test_grid_helpers(release):
    kv = release("kernels.ops.attention.kv_indices")
    from kvdispatch.compat.sglang.kernels.ops.attention import kv_indices as ours

    for page_size in (1, 16, 64, 128):
        assert ours.get_num_page_per_block_flashmla(page_size) == kv.get_num_page_per_block_flashmla(page_size)
        for width in (0, 1, 64, 65, 4097, 131072):
            assert ours.get_num_kv_index_blocks_flashmla(width, page_size) == kv.get_num_kv_index_blocks_flashmla(
                width, page_size)
    for table_width in (0, 8192, 32767, 32768, 131072, 10**6):
        for base in (0, 1, 7, 600):
            assert ours.kv_indices_num_token_blocks(table_width, base) == kv.kv_indices_num_token_blocks(
                table_width, base)
        for kv_lens_sum in (None, 0, 9000, 10**7):
            for batch in (0, 1, 64):
                for extra in ({}, dict(base_programs=3), dict(length_cap=20000), dict(context_len=40000)):
                    assert ours.spec_kv_index_token_blocks(table_width, kv_lens_sum, batch, **extra) == \
                        kv.spec_kv_index_token_blocks(table_width, kv_lens_sum, batch, **extra)


# -- kernels.ops.attention.trtllm_mha_page_table -------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("page_size", (1, 64))
@pytest.mark.parametrize("swa", (False, True))
def test_trtllm_mha_page_table(backend, page_size, swa, release, compat):
    mha = release("kernels.ops.attention.trtllm_mha_page_table")
    g = _generator()
    rows, cols, batch = 5, 3 * 64, 4
    table, pool = _pool(rows, cols, batch, g)
    lens = torch.randint(1, cols + 1, (batch,), generator=g).to(torch.int32).to(DEVICE)
    width = -(-cols // page_size)
    full_to_swa = torch.randint(0, rows * cols, (rows * cols * 2,), generator=g).to(DEVICE) if swa else None
    tables = [torch.full((batch, width), POISON, dtype=torch.int32, device=DEVICE)]
    if swa:
        tables.append(torch.full((batch, width), POISON, dtype=torch.int32, device=DEVICE))
    theirs, ours = _twins(*tables)
    for function, buffers in ((mha.build_trtllm_mha_page_table, theirs), (compat.build_trtllm_mha_page_table, ours)):
        function(table, pool, lens, buffers[0], page_size, buffers[1] if swa else None, full_to_swa)
    _same(ours, theirs, "page tables")


# -- kernels.ops.attention.dcp_kernels -----------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dcp_size", (2, 4))
@pytest.mark.parametrize("with_start", (False, True))
def test_dcp_token_csr(backend, dcp_size, with_start, release, compat):
    dcp = release("kernels.ops.attention.dcp_kernels")
    g = _generator()
    rows, cols, batch = 5, 200, 3
    table, pool = _pool(rows, cols, batch, g)
    seq_lens = torch.randint(1, cols + 1, (batch,), generator=g).to(DEVICE)
    start = (seq_lens - 50).clamp(min=0).to(torch.int32) if with_start else None
    lengths = seq_lens - (start if with_start else 0)
    for rank in range(dcp_size):
        local = compat.get_dcp_lens(lengths, dcp_size, rank, start)
        indptr = _cumsum(local)
        out = torch.full((int(indptr[-1]) + 3,), POISON, dtype=torch.int64, device=DEVICE)
        (theirs,), (ours,) = _twins(out)
        arguments = (table, pool, local, indptr, start)
        dcp.create_triton_kv_indices_for_dcp_triton[(batch,)](*arguments, theirs, table.stride(0), dcp_size, rank)
        compat.create_triton_kv_indices_for_dcp_triton[(batch,)](*arguments, ours, table.stride(0), dcp_size, rank)
        _same([ours], [theirs], f"rank {rank}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("engine", ("trtllm_mla", "aiter_verify"))
@pytest.mark.parametrize("has_v2p", (False, True))
def test_dcp_page_table(backend, engine, has_v2p, release, compat):
    """TRT-LLM MLA: a ``-1`` block table, ``PAGES_PER_BLOCK = 4096 // page``; Aiter's verify token table: page 1,
    16 columns per block, rows ``q_len * num_cols`` apart in a ``[bs * q_len, num_cols]`` buffer. ``has_v2p``: the
    unified pool, an int64 ``v2p`` of every page plus one, a quarter of them freed (-1), and ``-1`` slots in the
    table."""
    dcp = release("kernels.ops.attention.dcp_kernels")
    g = _generator()
    dcp_size, batch = 4, 3
    page_size, q_len = (16, 1) if engine == "trtllm_mla" else (1, 3)
    rows, cols = batch + 2, 6 * page_size * dcp_size
    table, pool = _pool(rows, cols, batch, g)
    v2p = None
    if has_v2p:
        table[pool[0], -2 * page_size * dcp_size:] = -1
        pages = 2 * rows * cols // (page_size * dcp_size) + 1
        v2p = torch.randint(0, 1 << 20, (pages,), generator=g)
        v2p[torch.randint(0, pages, (pages // 4,), generator=g)] = -1
        v2p = v2p.to(DEVICE)
    seq_lens = torch.randint(1, cols + 1, (batch,), generator=g).to(DEVICE)
    for rank in range(dcp_size):
        local = compat.get_dcp_lens(seq_lens, dcp_size, rank).to(torch.int32)
        if engine == "trtllm_mla":
            out = torch.full((batch, 8), -1, dtype=torch.int32, device=DEVICE)
            per_block = 4096 // page_size
            grid, stride = (batch, compat.get_num_kv_index_blocks_flashmla(8, page_size)), out.stride(0)
        else:
            num_cols = 64
            out = torch.full((batch * q_len, num_cols), POISON, dtype=torch.int32, device=DEVICE)
            per_block = 16
            grid, stride = (batch, -(-num_cols // per_block)), q_len * num_cols
        (theirs,), (ours,) = _twins(out)
        for function, buffer in ((dcp.create_mla_kv_page_table_for_dcp, theirs),
                                 (compat.create_mla_kv_page_table_for_dcp, ours)):
            function[grid](table, pool, local, buffer, v2p, table.stride(0), stride, PHYSICAL_PAGE_SIZE=page_size,
                           DCP_SIZE=dcp_size, DCP_RANK=rank, PAGES_PER_BLOCK=per_block, HAS_V2P=has_v2p)
        _same([ours], [theirs], f"rank {rank}")


# -- kernels.ops.kvcache.kv_read_table -----------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("page_size", (1, 16, 24))
@pytest.mark.parametrize("seq_len_delta", (0, 3))
def test_kv_read_table(backend, page_size, seq_len_delta, release, compat):
    read_table = release("kernels.ops.kvcache.kv_read_table")
    g = _generator()
    rows, cols, batch = 5, 8 * page_size + 5, 3
    table, pool = _pool(rows, cols, batch, g)
    table[0, 0] = -1  # a freed token: virtual page 0
    lens = torch.randint(0, cols - seq_len_delta + 1, (batch,), generator=g).to(torch.int32).to(DEVICE)
    pages = rows * cols * 2 // page_size + 1
    v2p = torch.where(torch.rand(pages, generator=g) < 0.2, -1, torch.randperm(pages * 2, generator=g)[:pages])
    max_pages = -(-cols // page_size)
    out = torch.full((batch + 1, max_pages + 2), POISON, dtype=torch.int32, device=DEVICE)
    (theirs,), (ours,) = _twins(out)
    for function, buffer in ((read_table.build_kv_read_table, theirs), (compat.build_kv_read_table, ours)):
        assert function(req_to_token=table, req_pool_indices=pool, seq_lens=lens, v2p=v2p.to(DEVICE),
                        page_size=page_size, max_pages=max_pages, out=buffer, seq_len_delta=seq_len_delta) is buffer
    _same([ours], [theirs], "read table")


# -- kernels.ops.speculative.cache_locs ----------------------------------------------------------------------

def _next_power_of_2(n):
    return 1 << max(n - 1, 0).bit_length()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("topk, page_size", ((1, 1), (4, 1), (4, 16)))
@pytest.mark.parametrize("engine", ("triton", "flashinfer_blocks", "window", "translated"))
def test_draft_decode(backend, topk, page_size, engine, release, compat):
    """The Triton backend's launch (grid ``(steps, bs, topk)``), FlashInfer's with token blocks and
    ``NUM_STEPS``, the draft-only window (``window_size``, ``sink_size`` positional) and ids through ``v2p``."""
    locs = release("kernels.ops.speculative.cache_locs",
                   extract=("_translate_token_ids", "_load_token_ids", "generate_draft_decode_kv_indices"))
    g = _generator()
    steps, batch = 3, 3
    pool_rows = batch + 2
    owned = -(-(page_size - 1 + steps) // page_size) * page_size
    cols = 48 + topk * owned + page_size
    table, pool = _pool(pool_rows, cols, batch, g)
    lens = torch.randint(1, cols - topk * owned - page_size + 2, (batch,), generator=g).to(DEVICE)
    positions = lens.repeat_interleave(topk)
    width = compat.draft_kv_indices_buffer_width(batch, topk, cols)
    kv_indices = torch.zeros((steps, width), dtype=torch.int64, device=DEVICE)
    kv_indptr = torch.zeros((steps, pool_rows * topk + 1), dtype=torch.int32, device=DEVICE)
    window, options = (0, 0), {}
    grid = (steps, batch, topk)
    if engine == "flashinfer_blocks":
        grid = (steps * 2, batch, topk)
        options = dict(NUM_STEPS=steps)
    elif engine == "window":
        window = (5, 2)
    elif engine == "translated":
        v2p = torch.randint(-1, 500, (pool_rows * cols * 2 // page_size + 1,), generator=g).to(DEVICE)
        options = dict(v2p=v2p, TRANSLATE=True)
    theirs, ours = _twins(kv_indices, kv_indptr)
    for function, buffers in ((locs.generate_draft_decode_kv_indices, theirs),
                              (compat.generate_draft_decode_kv_indices, ours)):
        function[grid](pool, table, lens, buffers[0], buffers[1], positions, table.stride(0), width,
                       kv_indptr.shape[1], _next_power_of_2(batch), _next_power_of_2(steps),
                       _next_power_of_2(batch * topk), page_size, *window, **options)
    _same(ours, theirs, engine)


# -- srt.layers.dcp.layout ---------------------------------------------------------------------------------

def test_get_dcp_lens(release):
    layout = release("srt.layers.dcp.layout", extract=("get_dcp_lens",), header="import torch\n")
    from kvdispatch.compat.sglang import get_dcp_lens

    g = _generator()
    for dtype in (torch.int32, torch.int64):
        lens = torch.randint(-30, 500, (64,), generator=g).to(dtype)
        start = torch.randint(0, 300, (64,), generator=g).to(dtype)
        for dcp_size, interleave in ((1, 1), (2, 1), (4, 1), (4, 16), (3, 64), (8, 5)):
            for rank in range(dcp_size):
                for begin in (None, start):
                    theirs = layout.get_dcp_lens(lens, dcp_size, rank, begin, interleave)
                    ours = get_dcp_lens(lens, dcp_size, rank, begin, interleave)
                    assert ours.dtype == theirs.dtype and torch.equal(ours, theirs), (dcp_size, interleave, rank)
