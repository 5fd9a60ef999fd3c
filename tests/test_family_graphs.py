"""Fixed buffers of the SGLang-family ops for CUDA-graph tests (GPU only; skipped without CUDA), shared by
tests/test_pdl.py and tests/test_host_path_replay_gpu.py.

Per op: the buffers of one call, a call that runs the public op or (without a backend) the reference on them,
and ``_refresh``, which rewrites the index vectors in place (random valid data, then a few hostile values), as an
engine does between replays; ``check_replays`` replays a captured graph on such data against the reference.
Capture and replay of every op on every backend, on new data in the same buffers: tests/test_conformance.py.
"""

from __future__ import annotations

import pytest
import torch

from kvdispatch import ops
import kvdispatch
from conftest import HAS_GPU
from kvcases import POISON

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_GPU, reason="CUDA graphs need a GPU")]

BATCH, ROWS, COLS = 6, 16, 1024
HOSTILE = (-1, ROWS, 2**31 - 1, -(2**31))


def _vectors(g, device):
    """Fresh pool indices and lengths (int32), the same tensors rewritten by ``_refresh``."""
    return dict(pool=torch.zeros(BATCH, dtype=torch.int32, device=device),
                lens=torch.zeros(BATCH, dtype=torch.int32, device=device))


def _refresh(x, g, step):
    """New data in the same buffers: valid rows, and on some steps a hostile pool index or length."""
    x["pool"].copy_(torch.randperm(ROWS, generator=g)[:BATCH].to(torch.int32))
    x["lens"].copy_(torch.randint(0, COLS // 2, (BATCH,), generator=g, dtype=torch.int32))
    if step % 10 == 9:
        b = int(torch.randint(BATCH, (1,), generator=g))
        target = "pool" if step % 20 == 9 else "lens"
        x[target][b] = HOSTILE[(step // 10) % len(HOSTILE)]
    if "local" in x:
        kvdispatch.dcp_local_lengths(x["lens"], 3, 1, out=x["local"])
    if "indptr" in x:  # the CSR rows back to back, as an engine's cumsum gives them
        x["indptr"][1:].copy_(torch.cumsum(x["local"].clamp(min=0), 0))


def _case(op, device, g):
    """(buffers, output names, call) of ``op``: ``call(buffers)`` runs the reference, ``call(buffers, backend,
    **options)`` the public op with those extra keyword options."""
    table = torch.randint(-3, 2**20, (ROWS, COLS), generator=g, dtype=torch.int32).to(device)
    x = dict(table=table, **_vectors(g, device))
    if op == "mha":
        x.update(page=torch.full((BATCH, 40), POISON, dtype=torch.int32, device=device),
                 swa=torch.full((BATCH, 40), POISON, dtype=torch.int32, device=device),
                 mapping=torch.randint(-5, 2**20, (2**20,), generator=g, dtype=torch.int64).to(device))

        def call(t, backend=None, **options):
            fn = kvdispatch.create_trtllm_mha_page_table if backend is not None else ops.mha_page_table.reference
            if backend is None:
                return fn(t["table"], t["pool"], t["lens"], t["page"], 32, t["swa"], t["mapping"])
            return fn(t["table"], t["pool"], t["lens"], t["page"], page_size=32, swa_page_table=t["swa"],
                      full_to_swa=t["mapping"], backend=backend, **options)
        return x, ("page", "swa"), call
    if op == "translated":
        x.update(out=torch.full((BATCH, 40), POISON, dtype=torch.int32, device=device),
                 v2p=torch.randint(-1, 2**16, (2**16,), generator=g, dtype=torch.int64).to(device))

        def call(t, backend=None, **options):
            if backend is None:
                return ops.translated_page_table.reference(t["table"], t["pool"], t["lens"], t["v2p"], t["out"], 16,
                                                             3, 30, 2)
            return kvdispatch.create_translated_page_table(t["table"], t["pool"], t["lens"], t["v2p"], t["out"],
                                                           page_size=16, multiplier=3, max_pages=30, seq_len_delta=2,
                                                           backend=backend, **options)
        return x, ("out",), call
    if op == "draft":
        steps, topk = 3, 2
        x.update(draft_indptr=torch.zeros(steps, BATCH * topk + 1, dtype=torch.int32, device=device),
                 out=torch.full((steps, BATCH * topk * COLS), POISON, dtype=torch.int64, device=device))

        def call(t, backend=None, **options):
            if backend is None:
                return ops.draft_decode.reference(t["table"], t["pool"], t["lens"], t["draft_indptr"],
                                                            t["out"], steps, topk, 16)
            return kvdispatch.create_draft_decode_kv_indices(t["table"], t["pool"], t["lens"], t["draft_indptr"],
                                                             t["out"], num_steps=steps, topk=topk, page_size=16,
                                                             backend=backend, **options)
        return x, ("draft_indptr", "out"), call
    if op == "dcp_csr":
        x.update(local=torch.zeros(BATCH, dtype=torch.int64, device=device),
                 indptr=torch.zeros(BATCH + 1, dtype=torch.int64, device=device),
                 out=torch.full((BATCH * COLS // 3 + 8,), POISON, dtype=torch.int64, device=device))

        def call(t, backend=None, **options):
            if backend is None:
                return ops.dcp_token_csr.reference(t["table"], t["pool"], t["local"], t["indptr"], t["out"], 3, 1)
            return kvdispatch.create_dcp_kv_indices(t["table"], t["pool"], t["local"], t["indptr"], t["out"],
                                                    dcp_size=3, dcp_rank=1, backend=backend, **options)
        return x, ("out",), call
    assert op == "dcp_table"
    x.update(local=torch.zeros(BATCH, dtype=torch.int64, device=device),
             out=torch.full((BATCH, 20), POISON, dtype=torch.int32, device=device))

    def call(t, backend=None, **options):
        if backend is None:
            return ops.dcp_page_table.reference(t["table"], t["pool"], t["local"], t["out"], 16, 3, 1)
        return kvdispatch.create_dcp_page_table(t["table"], t["pool"], t["local"], t["out"], page_size=16, dcp_size=3,
                                                dcp_rank=1, backend=backend, **options)
    return x, ("out",), call


FAMILY_OPS = ["mha", "translated", "draft", "dcp_csr", "dcp_table"]


def check_replays(graph, x, g, outputs, call, steps, label):
    """Replay ``graph`` (captured on the buffers ``x``) once per step on fresh data, each against the reference
    (``call`` without a backend) on CPU copies of the same inputs."""
    for step in steps:
        _refresh(x, g, step)
        expected = {k: v.cpu() for k, v in x.items()}
        call(expected)
        graph.replay()
        torch.cuda.synchronize()
        for name in outputs:
            assert torch.equal(x[name].cpu(), expected[name]), f"{label} {step}: {name} differs"
