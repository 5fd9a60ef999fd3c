"""SGLang's attention backends' index-building call patterns, replayed on a simulated page pool.

Every pattern goes through ``kvdispatch.compat.sglang`` with the engine's argument order, on every
backend in ``conftest.BACKENDS`` (CPU: torch, Triton in its interpreter, cupy-host; GPU: torch, triton,
cupy). Each result is checked twice: against ``kvdispatch.reference`` run on a copy of the output as it
was before the call (so untouched columns and rows are checked too), and against the pool's own
bookkeeping of each request's pages and slots.

Patterns:
* eager decode (FlashMLA, CUTLASS MLA): a fresh ``-1`` buffer ``ceil(max_seq_len / page)`` wide per step;
* CUDA-graph decode (TRT-LLM MLA): one persistent buffer at the model's context width padded to a multiple
  of ``lcm(128 / page, pages per program)`` pages, rebuilt in place before every replay (a real
  ``torch.cuda.CUDAGraph`` on a GPU; repeated in-place calls on CPU), batch padded with row 0 / length 1;
* target-verify (speculative decoding): lengths plus draft tokens copied into ``seq_lens_k``, then the
  block table; draft tokens are then partly accepted and rolled back;
* Aiter: a token CSR (``kv_indptr``/``kv_indices``) and a page table built from the same pool, eager and
  with persistent buffers.
"""

from __future__ import annotations

import math
import os
import random
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from conftest import BACKENDS, DEVICE
from kvcases import POISON
from kvdispatch import ops
from kvdispatch import dispatch
from kvdispatch.compat import sglang
from pagepool import PagePool, populate

PAGE_SIZES = (1, 16, 32, 64)
ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Scale:
    batch: int
    steps: int
    max_len: int


def _scale(backend: str) -> Scale:
    # The Triton interpreter and the host build of the CUDA source run every program in Python/C on
    # the CPU: keep their cases small (a few requests, a few hundred tokens, a few steps).
    if backend == "torch" or DEVICE.type == "cuda":
        return Scale(batch=6, steps=5, max_len=300)
    return Scale(batch=4, steps=3, max_len=140)


def _pool(page_size: int, scale: Scale, seed: int, extra_tokens: int = 0) -> PagePool:
    context = scale.max_len + scale.steps + extra_tokens + 8
    pages_per_request = -(-context // page_size) + 1
    return PagePool(page_size=page_size, num_pages=(scale.batch + 4) * pages_per_request + 16,
                    max_requests=scale.batch + 3, max_context_len=context, device=DEVICE, seed=seed)


def _churn(pool: PagePool, scale: Scale, grow: int = 1) -> None:
    """One decode step: every request grows; sometimes one finishes and a new one (maybe sharing) comes."""
    for rid in pool.live():
        if pool.requests[rid].length + grow <= scale.max_len + scale.steps:
            pool.extend(rid, grow)
    if pool.live() and pool.rng.random() < 0.7:
        pool.retire(pool.rng.choice(pool.live()))
    while len(pool.live()) < scale.batch:
        populate(pool, 1, min_len=1, max_len=scale.max_len)


def _vec(values, dtype) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, device=DEVICE)


def _expected_table(out, rows, lens, page_size, *, req_to_token):
    """``kvdispatch.reference`` on a copy of ``out`` as it is now (before the call)."""
    expected = out.clone()
    ops.page_table.reference(req_to_token, rows, lens, expected, page_size, None, 0, None, None)
    return expected


def _same(actual, expected):
    torch.testing.assert_close(actual.cpu(), expected.cpu(), rtol=0, atol=0)


def _check_against_pool(pool, rids, out, *, extra=0, lengths=None, fill_value=None):
    """Row ``b`` of ``out`` starts with the pages the pool gave request ``rids[b]``; then ``fill_value``."""
    out = out.cpu()
    for b, rid in enumerate(rids):
        length = (pool.requests[rid].length if lengths is None else lengths[b]) + extra
        pages = pool.block_table(rid, length)
        assert out[b, : len(pages)].tolist() == pages, f"request {rid} (row {b})"
        if fill_value is not None:
            assert (out[b, len(pages):] == fill_value).all(), f"request {rid} (row {b}) padding"


def _replayer(build):
    """CUDA: capture ``build`` in a graph (after a warm-up on a side stream) and return its replay;
    CPU: ``build`` itself, called in place each time."""
    if DEVICE.type != "cuda":
        return build
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        build()  # compiles, selects the backend, allocates nothing later
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        build()

    def replay():
        graph.replay()
        torch.cuda.synchronize()

    replay.graph = graph
    return replay


def _trtllm_width(max_seq_len, page_size):
    """The TRT-LLM MLA backend's block-table width: ``ceil(max_seq_len / page)`` pages rounded up to a
    multiple of ``lcm(128 / page, pages per program of SGLang's page-table kernel)``."""
    multiple = math.lcm(128 // page_size, sglang.get_num_page_per_block_flashmla(page_size))
    return -(-max_seq_len // (page_size * multiple)) * multiple


def _batch(pool, bs):
    """Up to ``bs`` live requests, padded to ``bs`` with row 0 / length 1 (an engine's graph padding)."""
    rids = pool.live()[:bs]
    pad = bs - len(rids)
    return rids, pool.rows(rids) + [0] * pad, pool.lengths(rids) + [1] * pad


# -- eager decode: FlashMLA, CUTLASS MLA -----------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("engine,page_size", [("flashmla", p) for p in PAGE_SIZES] +
                         [("cutlass_mla", p) for p in PAGE_SIZES + (128,)])
def test_eager_decode(backend, engine, page_size, compat):
    scale = _scale(backend)
    pool = _pool(page_size, scale, seed=page_size * 7 + len(engine))
    populate(pool, scale.batch, min_len=1, max_len=scale.max_len)
    table = pool.req_to_token
    for step in range(scale.steps):
        if step:
            _churn(pool, scale)
        pool.sync()
        rids = pool.live()
        bs = len(rids)
        lens = pool.lengths(rids)
        width = -(-max(lens) // page_size)  # ceil(max_seq_len / page)
        rows = _vec(pool.rows(rids), torch.int64)
        seq_lens = _vec(lens, torch.int32 if step % 2 else torch.int64)
        kv = torch.full((bs, width), -1, dtype=torch.int32, device=DEVICE)  # fresh, pre-filled with -1
        expected = _expected_table(kv, rows, seq_lens, page_size, req_to_token=table)
        grid = (bs, compat.get_num_kv_index_blocks_flashmla(width, page_size))
        if engine == "flashmla":
            result = compat.create_flashmla_kv_indices_triton[grid](table, rows, seq_lens, None, kv,
                                                                    table.stride(0), width, PAGED_SIZE=page_size)
        else:  # positional page size, called without the launch syntax
            result = compat.create_flashmla_kv_indices_triton(table, rows, seq_lens, None, kv, table.stride(0),
                                                              kv.stride(0), page_size)
        assert result is kv
        _same(kv, expected)
        _check_against_pool(pool, rids, kv, fill_value=-1)


# -- CUDA-graph decode: TRT-LLM MLA ------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("page_size", (32, 64))
def test_cuda_graph_decode_trtllm(backend, page_size, compat):
    scale = _scale(backend)
    pool = _pool(page_size, scale, seed=page_size)
    populate(pool, scale.batch - 1, min_len=1, max_len=scale.max_len)  # one padded slot at first
    table = pool.req_to_token
    width = _trtllm_width(pool.max_context_len, page_size)

    # Persistent state, as init_cuda_graph_state allocates it: wider than the captured batch, -1 filled.
    max_bs, bs = scale.batch + 2, scale.batch
    store = torch.full((max_bs, width + 3), -1, dtype=torch.int32, device=DEVICE)
    kv = store[:bs, :width]  # strided rows: the captured view of the persistent buffer
    rows_buf = torch.zeros(bs, dtype=torch.int64, device=DEVICE)
    lens_buf = torch.ones(bs, dtype=torch.int32, device=DEVICE)
    grid = (bs, compat.get_num_kv_index_blocks_flashmla(width, page_size))

    def build():
        compat.create_flashmla_kv_indices_triton[grid](table, rows_buf, lens_buf, None, kv, table.stride(0),
                                                       store.stride(0), PAGED_SIZE=page_size)

    replay = _replayer(build)
    for step in range(scale.steps + 1):
        if step:
            _churn(pool, scale)
        pool.sync()
        rids, rows, lens = _batch(pool, bs)
        rows_buf.copy_(_vec(rows, torch.int64))  # new data, same buffers
        lens_buf.copy_(_vec(lens, torch.int32))
        expected = _expected_table(kv, rows_buf, lens_buf, page_size, req_to_token=table)
        spare = store[bs:].clone()
        replay()
        _same(kv, expected)
        _same(store[bs:], spare)  # rows past the batch untouched
        _same(store[:bs, width:], torch.full((bs, 3), -1, dtype=torch.int32))  # nor the columns past the view
        _check_against_pool(pool, rids, kv)


# -- target-verify (speculative decoding) --------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("mode", ("eager", "graph"))
def test_target_verify(backend, page_size, mode, compat):
    scale = _scale(backend)
    num_draft = 4
    pool = _pool(page_size, scale, seed=3 * page_size + len(mode), extra_tokens=num_draft * (scale.steps + 2))
    populate(pool, scale.batch, min_len=1, max_len=scale.max_len)
    table = pool.req_to_token
    rng = random.Random(page_size)

    bs = scale.batch
    width = _trtllm_width(pool.max_context_len, page_size)
    kv_store = torch.full((bs + 1, width), -1, dtype=torch.int32, device=DEVICE)
    rows_buf = torch.zeros(bs, dtype=torch.int64, device=DEVICE)
    lens_buf = torch.ones(bs, dtype=torch.int64, device=DEVICE)
    seq_lens_k = torch.zeros(bs + 1, dtype=torch.int32, device=DEVICE)
    grid = (bs, compat.get_num_kv_index_blocks_flashmla(width, page_size))

    def build():  # the graph-metadata pattern: lengths + draft tokens into seq_lens_k, then the block table
        seq_lens_k[:bs].copy_(lens_buf + num_draft)
        compat.create_flashmla_kv_indices_triton[grid](table, rows_buf, seq_lens_k[:bs], None, kv_store[:bs],
                                                       table.stride(0), width, PAGED_SIZE=page_size)

    replay = _replayer(build) if mode == "graph" else None
    for step in range(scale.steps):
        if step:
            _churn(pool, scale)
        rids, rows, committed = _batch(pool, bs)
        for rid in rids:  # the draft tokens get their KV slots before verification
            pool.extend(rid, num_draft)
        pool.sync()
        if mode == "eager":
            # FlashMLA-style: lengths plus drafts, a fresh buffer ceil(max of them / page) wide.
            rows_t = _vec(rows, torch.int64)
            seq_out = _vec(committed, torch.int32) + num_draft
            expected_seq = seq_out.clone()
            width_t = -(-(max(committed) + num_draft) // page_size)
            kv = torch.full((bs, width_t), -1, dtype=torch.int32, device=DEVICE)
            expected = _expected_table(kv, rows_t, seq_out, page_size, req_to_token=table)
            compat.create_flashmla_kv_indices_triton[(bs, compat.get_num_kv_index_blocks_flashmla(width_t, page_size))](
                table, rows_t, seq_out, None, kv, table.stride(0), width_t, page_size)
        else:
            rows_buf.copy_(_vec(rows, torch.int64))
            lens_buf.copy_(_vec(committed, torch.int64))
            kv, seq_out = kv_store[:bs], seq_lens_k
            expected_seq = seq_lens_k.clone()
            expected_seq[:bs] = lens_buf + num_draft
            expected = _expected_table(kv, rows_buf, expected_seq[:bs], page_size, req_to_token=table)
            spare = kv_store[bs:].clone()
            replay()
            _same(kv_store[bs:], spare)
        _same(kv, expected)
        _same(seq_out, expected_seq)
        assert seq_out[:bs].tolist() == [n + num_draft for n in committed]
        _check_against_pool(pool, rids, kv)  # every token, drafts included
        for rid, n in zip(rids, committed):  # accept some drafts (plus the bonus token), roll back the rest
            pool.truncate(rid, n + rng.randint(0, num_draft - 1) + 1)


# -- Aiter: token CSR and page table from the same pool ---------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("page_size", (1, 16, 64))
@pytest.mark.parametrize("mode", ("eager", "graph"))
def test_aiter_csr_and_page_table(backend, page_size, mode, compat):
    scale = _scale(backend)
    pool = _pool(page_size, scale, seed=11 * page_size + len(mode))
    populate(pool, scale.batch, min_len=1, max_len=scale.max_len)
    table = pool.req_to_token
    bs = scale.batch
    # Persistent buffers (graph mode): kv_indptr [max_bs + 1], kv_indices for bs full contexts.
    indptr_buf = torch.zeros(bs + 2, dtype=torch.int32, device=DEVICE)
    indices_buf = torch.full((bs * pool.max_context_len,), POISON, dtype=torch.int32, device=DEVICE)
    width = -(-pool.max_context_len // page_size)
    pt_buf = torch.full((bs, width), -1, dtype=torch.int32, device=DEVICE)
    for step in range(scale.steps):
        if step:
            _churn(pool, scale)
        pool.sync()
        rids = pool.live()[:bs]
        lens = pool.lengths(rids)
        rows = _vec(pool.rows(rids), torch.int64)
        seq_lens = _vec(lens, torch.int32)
        if mode == "eager":
            indptr = torch.zeros(bs + 1, dtype=torch.int32, device=DEVICE)
            indices = torch.full((sum(lens),), POISON, dtype=torch.int32, device=DEVICE)
            pt = torch.full((bs, -(-max(lens) // page_size)), -1, dtype=torch.int32, device=DEVICE)
        else:
            indptr, indices, pt = indptr_buf, indices_buf, pt_buf
        indptr[1: bs + 1] = torch.cumsum(seq_lens, 0)
        expected_csr = indices.clone()
        ops.token_csr.reference(table, rows, seq_lens, indptr, expected_csr)
        expected_pt = _expected_table(pt, rows, seq_lens, page_size, req_to_token=table)

        compat.create_flashinfer_kv_indices_triton[(bs,)](table, rows, seq_lens, indptr, None, indices,
                                                          table.stride(0))
        compat.create_flashmla_kv_indices_triton(table, rows, seq_lens, None, pt, table.stride(0), pt.stride(0),
                                                 page_size)

        _same(indices, expected_csr)
        _same(pt, expected_pt)
        _check_against_pool(pool, rids, pt, fill_value=-1 if mode == "eager" else None)
        flat, starts = indices.cpu(), indptr.cpu().tolist()
        for b, rid in enumerate(rids):
            slots = pool.token_slots(rid)
            assert flat[starts[b]: starts[b] + len(slots)].tolist() == slots, f"request {rid} CSR"
            # The same pool, two views: each page-table entry is the page of that page's first token.
            first = flat[starts[b]: starts[b] + len(slots): page_size]
            assert pt[b, : len(first)].cpu().tolist() == (first // page_size).tolist()
        if mode == "eager":
            assert (flat[sum(lens):] == POISON).all()


# -- the pool itself -------------------------------------------------------------------------------------------

def test_pagepool_shares_prefixes_and_reuses_rows():
    pool = PagePool(page_size=4, num_pages=200, max_requests=6, max_context_len=64, device="cpu", seed=5)
    a = pool.admit(30)
    b = pool.admit(20, share_from=a, shared_pages=3)
    assert pool.block_table(b)[:3] == pool.block_table(a)[:3] and pool.check_shared() == 3
    assert pool.block_table(b)[3:] and not set(pool.block_table(b)[3:]) & set(pool.block_table(a))
    assert pool.token_slots(b)[:12] == pool.token_slots(a)[:12]
    row_a = pool.requests[a].row
    pool.retire(a)
    assert pool.check_shared() == 0 and pool.refcount[pool.block_table(b)[0]] == 1
    c = pool.admit(5)
    assert pool.requests[c].row == row_a  # the finished request's row is reused...
    assert pool.host[row_a, 5:30].ne(-777).all()  # ...with its old entries left behind
    pages = set(pool.block_table(c)) | set(pool.block_table(b))
    assert len(pages) == len(pool.block_table(c)) + len(pool.block_table(b)) and 0 not in pages
    pool.extend(c, 10)
    pool.truncate(c, 6)
    assert pool.lengths([c]) == [6] and len(pool.block_table(c)) == 2
    pool.sync()
    assert pool.req_to_token.tolist() == pool.host.tolist()
    assert pool.req_to_token[pool.requests[b].row, :20].tolist() == pool.token_slots(b)


# -- the example ---------------------------------------------------------------------------------------------

def test_decode_loop_example_runs():
    env = dict(os.environ)
    if env.get("KVDISPATCH_BACKEND", "auto") not in dispatch.CHOICES:
        env.pop("KVDISPATCH_BACKEND")  # a test-only backend name: the example runs on the default one
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "decode_loop.py"), "--steps", "6", "--check"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("step")]
    assert len(lines) == 6, proc.stdout
    assert "checked" in proc.stdout
