"""The CSR drop-ins of ``kvdispatch.compat.sglang.kernels.ops.attention.dcp_kernels``
(``compact_dcp_verify_token_table_to_ragged``, ``update_kv_lens_and_indices``, SGLang's ``create_dcp_kv_indices``)
against SGLang 0.5.23's own kernels under the Triton interpreter, on their call sites' argument patterns (Aiter's
verify ragged ids, ``srt/layers/attention/aiter_backend.py``; the DCP decode and prefill planners,
``srt/layers/dcp/planner.py``), every element of every buffer; skipped without ``SGLANG_SOURCE``."""

from __future__ import annotations

import pytest
import torch

from conftest import BACKENDS, DEVICE, through
from kvcases import POISON
import test_sglang_against_release as against
from test_sglang_against_release import ROOT, _generator, _same, _twins

release = against.release  # the fixture loading the release's modules

pytestmark = pytest.mark.skipif(ROOT is None, reason="SGLang's source is not here (set SGLANG_SOURCE)")


@pytest.fixture
def compat(monkeypatch, backend):
    """``kvdispatch.compat.sglang`` with the compacted and the prefix+extend CSR routed to ``backend``."""
    from kvdispatch.compat import sglang
    from kvdispatch.compat.sglang import _common

    monkeypatch.setattr(_common, "_build_compact_csr",
                        lambda *a, backend=None, **k: through(name, "create_compact_kv_indices", *a, **k))
    monkeypatch.setattr(_common, "_build_prefix_extend_csr",
                        lambda *a, backend=None, **k: through(name, "create_prefix_extend_kv_indices", *a, **k))
    name = backend
    return sglang


def _cumsum(lens):
    indptr = torch.zeros(lens.shape[0] + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(lens.cpu().long(), 0)
    return indptr.to(DEVICE)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("buffers", ("exact", "graph"))
def test_verify_token_table_to_ragged(backend, buffers, release, compat):
    """Aiter's ``_build_dcp_verify_ragged_indices``: the table's row ``b * q_len`` per request, lengths clamped to
    at least 1 in ``kv_indptr``, zero-length shards among them; a freshly sized ``kv_indices`` or the cuda graph's
    larger one."""
    dcp = release("kernels.ops.attention.dcp_kernels")
    g = _generator()
    batch, q_len, num_cols = 5, 3, 70
    table = torch.randint(-3, 1 << 20, (batch * q_len + 2, num_cols), generator=g, dtype=torch.int32).to(DEVICE)
    lens = torch.randint(0, num_cols + 1, (batch,), generator=g, dtype=torch.int32)
    lens[1] = 0
    lens[3] = num_cols
    lens = lens.to(DEVICE)
    indptr = _cumsum(lens.clamp_min(1))
    total = int(indptr[-1]) + (7 if buffers == "graph" else 0)
    (theirs,), (ours,) = _twins(torch.full((total,), POISON, dtype=torch.int32, device=DEVICE))
    for function, out in ((dcp.compact_dcp_verify_token_table_to_ragged, theirs),
                          (compat.compact_dcp_verify_token_table_to_ragged, ours)):
        function[(batch,)](table, lens, indptr, out, table_stride=table.shape[1], Q_LEN=q_len, BLOCK_SIZE=128)
    _same([ours], [theirs], "ragged ids")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dcp_size", (2, 4))
@pytest.mark.parametrize("plan", ("synced", "static_bound", "narrow_grid"))
def test_update_kv_lens_and_indices(backend, dcp_size, plan, release, compat):
    """``plan_dcp_decode_metadata``: each rank's share of a decode CSR; the grid and the buffer from the real
    lengths (``synced``) or from a static upper bound (``static_bound``: a cuda graph's replay), or a grid of
    fewer blocks than the longest shard needs (``narrow_grid``: SGLang copies only the blocks it launches)."""
    dcp = release("kernels.ops.attention.dcp_kernels")
    g = _generator()
    batch, block = 4, 128
    kv_lens = torch.randint(0, 700, (batch,), generator=g, dtype=torch.int32)
    kv_lens[0] = 1
    kv_lens = kv_lens.to(DEVICE)
    kv_indptr = _cumsum(kv_lens)
    kv_indices = torch.randint(0, 1 << 20, (int(kv_indptr[-1]) + 5,), generator=g, dtype=torch.int32).to(DEVICE)
    for rank in range(dcp_size):
        local = ((kv_lens.long() - rank - 1).div(dcp_size, rounding_mode="floor") + 1).clamp(min=0).to(torch.int32)
        local_indptr = _cumsum(local)
        bound = local + (3 if plan == "static_bound" else 0)
        blocks = 1 if plan == "narrow_grid" else max(-(-int(bound.max()) // block), 1)
        out = torch.full((int(bound.sum()),), POISON, dtype=torch.int32, device=DEVICE)
        (theirs,), (ours,) = _twins(out)
        for function, buffer in ((dcp.update_kv_lens_and_indices, theirs), (compat.update_kv_lens_and_indices, ours)):
            function[(batch, blocks)](kv_lens, kv_indptr, kv_indices, local, local_indptr, buffer, dcp_rank=rank,
                                      dcp_world_size=dcp_size, BLOCK_SIZE=block)
        _same([ours], [theirs], f"rank {rank}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dcp_size", (2, 8))
def test_create_dcp_kv_indices(backend, dcp_size, release, compat):
    """``plan_dcp_prefill_metadata``: every request's prefix (``dcp_size``-aligned, some empty) then its extend, in
    the all-gathered buffer; ``kv_indptr`` from the sequence lengths, the cumulative lengths without their last
    entry, the prefixes' total a Python int."""
    dcp = release("kernels.ops.attention.dcp_kernels")
    g = _generator()
    batch = 5
    prefix = torch.randint(0, 40, (batch,), generator=g, dtype=torch.int32) * dcp_size
    prefix[2] = 0
    extend = torch.randint(1, 700, (batch,), generator=g, dtype=torch.int32)
    seq_lens = prefix + extend
    cu_prefix, cu_extend = _cumsum(prefix)[:-1], _cumsum(extend)[:-1]
    indptr = _cumsum(seq_lens)
    (theirs,), (ours,) = _twins(torch.zeros(int(seq_lens.sum()), dtype=torch.int32, device=DEVICE))
    prefix, extend = prefix.to(DEVICE), extend.to(DEVICE)
    prefix_sum = sum(prefix.cpu().tolist())
    for function, out in ((dcp.create_dcp_kv_indices, theirs), (compat.create_dcp_kv_indices, ours)):
        function[(batch,)](indptr, extend, cu_extend, prefix, cu_prefix, out, prefix_sum, dcp_size)
    _same([ours], [theirs], "prefix+extend ids")
    assert compat.create_dcp_kv_indices is compat.kernels.ops.attention.dcp_kernels.create_dcp_kv_indices


@pytest.mark.parametrize("backend", BACKENDS[:1])
def test_argument_errors(backend, compat):
    table = torch.zeros((6, 8), dtype=torch.int32, device=DEVICE)
    lens = torch.ones(2, dtype=torch.int32, device=DEVICE)
    indptr = torch.arange(3, dtype=torch.int32, device=DEVICE)
    out = torch.zeros(4, dtype=torch.int32, device=DEVICE)
    verify = compat.compact_dcp_verify_token_table_to_ragged
    with pytest.raises(ValueError, match="table_stride"):
        verify[(2,)](table, lens, indptr, out, table_stride=7, Q_LEN=3, BLOCK_SIZE=128)
    with pytest.raises(ValueError, match="Q_LEN"):
        verify[(2,)](table, lens, indptr, out, table_stride=8, Q_LEN=0, BLOCK_SIZE=128)
    with pytest.raises(ValueError, match="local_kv_lens_ptr"):
        verify[(3,)](table, lens, indptr, out, table_stride=8, Q_LEN=3, BLOCK_SIZE=128)
    with pytest.raises(TypeError, match="out"):
        verify[(2,)](table, lens, indptr, out.float(), table_stride=8, Q_LEN=3, BLOCK_SIZE=128)
    update = compat.update_kv_lens_and_indices
    flat = torch.zeros(16, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="dcp_rank"):
        update[(2, 1)](lens, indptr, flat, lens, indptr, out, dcp_rank=2, dcp_world_size=2, BLOCK_SIZE=128)
    with pytest.raises(TypeError, match="kv_indices"):
        update[(2, 1)](lens, indptr, flat.long(), lens, indptr, out, dcp_rank=0, dcp_world_size=2, BLOCK_SIZE=128)
    with pytest.raises(ValueError, match="out shares memory"):
        update[(2, 1)](lens, indptr, flat, lens, indptr, flat[4:], dcp_rank=0, dcp_world_size=2, BLOCK_SIZE=128)
    assert torch.equal(out, torch.zeros_like(out)) and torch.equal(flat, torch.zeros_like(flat))
