"""CUDA-graph capture and replay the way engines do it (GPU only; skipped without CUDA).

Per backend (torch and every GPU backend): fixed buffers sized for the maximum context (so the launch grid
is fixed by the buffer width), one call captured, then 1000 replays with ``req_pool_indices``, ``seq_lens``
and ``kv_start_idx`` (and ``kv_indptr`` for CSR) rewritten in place between replays, a few replays with
hostile values. Every replay must equal the reference applied to the same buffers (columns a call must not
touch keep what the previous replay left, as in an engine). Capture fails if a call synchronises; for the
Triton and CuPy backends an eager call after warm-up must not allocate either.
"""

from __future__ import annotations

import pytest
import torch

from kvdispatch import ops
import kvdispatch
from conftest import BACKENDS, HAS_GPU
from kvdispatch.bench import core as bench
from kvcases import POISON

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_GPU, reason="CUDA graphs need a GPU")]

GRAPH_BACKENDS = [b for b in BACKENDS if b != "cupy-host"]
REPLAYS = 1000
BATCH = 8
MAX_CONTEXT = 4096
POOL_ROWS = 24
SEQLEN_OFFSET = 2


def _call_page_table(backend, buffers, page_size, fill_value, **options):
    kvdispatch.create_flashmla_kv_indices(
        buffers["table"], buffers["pool"], buffers["lens"], buffers["out"], page_size=page_size,
        kv_start_idx=buffers["start"], seqlen_offset=SEQLEN_OFFSET, seq_lens_out=buffers["seq_out"],
        fill_value=fill_value, backend=backend, **options)


def _call_token_csr(backend, buffers, **options):
    kvdispatch.create_flashinfer_kv_indices(buffers["table"], buffers["pool"], buffers["lens"], buffers["indptr"],
                                            buffers["flat"], kv_start_idx=buffers["start"], backend=backend, **options)


def _buffers(page_size, device):
    g = torch.Generator().manual_seed(page_size)
    cols = MAX_CONTEXT + 2 * page_size  # room for kv_start_idx
    table = torch.randint(0, 2**31 - 1, (POOL_ROWS, cols), generator=g, dtype=torch.int64).to(torch.int32)
    width = -(-MAX_CONTEXT // page_size)
    return dict(
        table=table.to(device), table_cpu=table,
        pool=torch.zeros(BATCH, dtype=torch.int32, device=device),
        lens=torch.ones(BATCH, dtype=torch.int32, device=device),
        start=torch.zeros(BATCH, dtype=torch.int64, device=device),
        out=torch.full((BATCH, width), POISON, dtype=torch.int32, device=device),
        seq_out=torch.full((BATCH,), POISON, dtype=torch.int32, device=device),
        indptr=torch.zeros(BATCH + 1, dtype=torch.int32, device=device),
        flat=torch.full((BATCH * (MAX_CONTEXT + 2 * page_size) + 16,), POISON, dtype=torch.int32, device=device),
    ), g


def _new_step(buffers, g, page_size, step):
    """New per-request values (CPU), every 10th step with hostile ones; written in place into the buffers."""
    cols = buffers["table"].shape[1]
    pool = torch.randperm(POOL_ROWS, generator=g)[:BATCH]
    lens = torch.randint(0, MAX_CONTEXT - SEQLEN_OFFSET + 1, (BATCH,), generator=g)
    start = torch.randint(0, 2 * page_size + 1, (BATCH,), generator=g)
    if step % 10 == 9:
        b = int(torch.randint(0, BATCH, (1,), generator=g))
        kind = step // 10 % 4
        if kind == 0:
            pool[b] = POOL_ROWS + 3
        elif kind == 1:
            lens[b] = -7
        elif kind == 2:
            start[b] = cols + 5
        else:
            lens[b] = MAX_CONTEXT * 3  # past the table and the buffer width
    lengths = torch.minimum(lens.clamp(min=0), torch.full_like(lens, MAX_CONTEXT + 2 * page_size))
    indptr = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lengths, 0)])
    for name, values in (("pool", pool), ("lens", lens), ("start", start), ("indptr", indptr)):
        buffers[name].copy_(values.to(buffers[name].dtype), non_blocking=False)


def _expected_page_table(buffers, previous, previous_seq, page_size, fill_value):
    cpu = {k: buffers[k].cpu() for k in ("pool", "lens", "start")}
    cpu["table"] = buffers["table_cpu"]
    out, seq = previous.clone(), previous_seq.clone()
    ops.page_table.reference(cpu["table"], cpu["pool"], cpu["lens"], out, page_size, cpu["start"],
                               SEQLEN_OFFSET, seq, fill_value)
    return out, seq


def _expected_token_csr(buffers, previous):
    cpu = {k: buffers[k].cpu() for k in ("pool", "lens", "start", "indptr")}
    cpu["table"] = buffers["table_cpu"]
    flat = previous.clone()
    ops.token_csr.reference(cpu["table"], cpu["pool"], cpu["lens"], cpu["indptr"], flat, cpu["start"])
    return flat


def _no_alloc_no_sync(backend, call):
    """After warm-up, an eager call allocates nothing (Triton, CuPy) and never synchronises (any backend)."""
    call()  # warm-up: compile, load modules
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    # Cumulative count of allocation requests: catches a temporary that is freed before the call returns.
    requests = torch.cuda.memory_stats().get("allocation.all.allocated", 0)
    cupy_pool = None
    if backend == "cupy":
        import cupy

        cupy_pool = cupy.get_default_memory_pool()
        cupy_before = cupy_pool.used_bytes()
    torch.cuda.set_sync_debug_mode("error")
    try:
        call()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    if backend != "torch":
        assert torch.cuda.memory_allocated() == before, f"{backend}: an eager call kept device memory"
        assert torch.cuda.memory_stats().get("allocation.all.allocated", 0) == requests, \
            f"{backend}: an eager call allocated device memory (through PyTorch's allocator)"
        if cupy_pool is not None:
            assert cupy_pool.used_bytes() == cupy_before, "cupy: an eager call allocated from CuPy's pool"
    torch.cuda.synchronize()


@pytest.mark.parametrize("backend", GRAPH_BACKENDS)
@pytest.mark.parametrize("page_size", [1, 16, 64, 96])
@pytest.mark.parametrize("fill_value", [None, -1])
def test_page_table_graph_replay(backend, page_size, fill_value):
    device = torch.device("cuda", torch.cuda.current_device())
    buffers, g = _buffers(page_size, device)
    _new_step(buffers, g, page_size, 0)
    call = lambda: _call_page_table(backend, buffers, page_size, fill_value)  # noqa: E731
    _no_alloc_no_sync(backend, call)
    graph = bench.capture(call, 1)  # warm-up on a side stream, then capture; a sync inside raises

    buffers["out"].fill_(POISON)
    buffers["seq_out"].fill_(POISON)
    expected, expected_seq = buffers["out"].cpu(), buffers["seq_out"].cpu()
    for step in range(REPLAYS):
        _new_step(buffers, g, page_size, step)
        expected, expected_seq = _expected_page_table(buffers, expected, expected_seq, page_size, fill_value)
        graph.replay()
        got = buffers["out"].cpu()
        if not torch.equal(got, expected):
            bad = (got != expected).nonzero()[0].tolist()
            raise AssertionError(f"{backend} replay {step}: out{bad} = {int(got[tuple(bad)])}, "
                                 f"expected {int(expected[tuple(bad)])}; pool {buffers['pool'].tolist()}, "
                                 f"lens {buffers['lens'].tolist()}, start {buffers['start'].tolist()}")
        assert torch.equal(buffers["seq_out"].cpu(), expected_seq), f"{backend} replay {step}: seq_lens_out"


@pytest.mark.parametrize("backend", GRAPH_BACKENDS)
@pytest.mark.parametrize("page_size", [1, 64])  # only sizes the buffers: the CSR op has no page size
def test_token_csr_graph_replay(backend, page_size):
    device = torch.device("cuda", torch.cuda.current_device())
    buffers, g = _buffers(page_size, device)
    _new_step(buffers, g, page_size, 0)
    call = lambda: _call_token_csr(backend, buffers)  # noqa: E731
    _no_alloc_no_sync(backend, call)
    graph = bench.capture(call, 1)

    buffers["flat"].fill_(POISON)
    expected = buffers["flat"].cpu()
    for step in range(REPLAYS):
        _new_step(buffers, g, page_size, step)
        expected = _expected_token_csr(buffers, expected)
        graph.replay()
        got = buffers["flat"].cpu()
        if not torch.equal(got, expected):
            bad = int((got != expected).nonzero()[0])
            raise AssertionError(f"{backend} replay {step}: flat[{bad}] = {int(got[bad])}, expected "
                                 f"{int(expected[bad])}; indptr {buffers['indptr'].tolist()}")


@pytest.mark.parametrize("backend", GRAPH_BACKENDS)
@pytest.mark.parametrize("enable_pdl", [None, True])
def test_both_ops_in_one_graph(backend, enable_pdl):
    """An engine's decode step captures both builders (and more) in one graph; with ``enable_pdl=True`` both are
    launched with programmatic dependent launch where the GPU supports it, one right behind the other."""
    page_size = 64
    device = torch.device("cuda", torch.cuda.current_device())
    buffers, g = _buffers(page_size, device)
    _new_step(buffers, g, page_size, 0)

    def call():
        _call_page_table(backend, buffers, page_size, -1, enable_pdl=enable_pdl)
        _call_token_csr(backend, buffers, enable_pdl=enable_pdl)

    _no_alloc_no_sync(backend, call)
    graph = bench.capture(call, 1)
    buffers["out"].fill_(POISON)
    buffers["seq_out"].fill_(POISON)
    buffers["flat"].fill_(POISON)
    expected, expected_seq, expected_flat = (buffers[k].cpu() for k in ("out", "seq_out", "flat"))
    for step in range(200):
        _new_step(buffers, g, page_size, step)
        expected, expected_seq = _expected_page_table(buffers, expected, expected_seq, page_size, -1)
        expected_flat = _expected_token_csr(buffers, expected_flat)
        graph.replay()
        assert torch.equal(buffers["out"].cpu(), expected), f"replay {step}: page table"
        assert torch.equal(buffers["seq_out"].cpu(), expected_seq), f"replay {step}: seq_lens_out"
        assert torch.equal(buffers["flat"].cpu(), expected_flat), f"replay {step}: token CSR"
