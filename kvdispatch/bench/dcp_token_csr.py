"""One decode-context-parallel rank's token CSR, ``dcp_token_csr:BATCHxCONTEXTxDCP`` (rank DCP - 1 of DCP):
``create_dcp_kv_indices`` against dcp-loop (SGLang's design) and plain PyTorch (on full-length rows)."""

from __future__ import annotations

import argparse
import functools

import torch

from kvdispatch import ops
import kvdispatch
from kvdispatch import grid

from .core import (CSR_POOL_PAGE, PLAIN_TORCH, POISON, Case, Inputs, api_backend, baseline_kernels, dimensions,
                   indptr, shuffled_pool)

DCP_LOOP = "dcp-loop"
TRITON_BASELINES, SGLANG_BASELINE, IDEAL_BASELINE = (DCP_LOOP,), DCP_LOOP, None
API_VARIANTS, PLAIN_TORCH_CASES = (), "full-length"

# What ``core.legend`` says of its cases and of its baselines.
LEGEND_CASE = "dcp_token_csr:BxCxD: DCP rank D-1's token CSR (out B*(C/D) tokens)"
LEGEND_IMPLS = "dcp-loop: SGLang's design, one program per request; no plain-torch (written for full-length rows)"
# Its cases in each set of ``core.case_set``.
CASES = {
    "GPU": ["dcp_token_csr:64x32768x4", "dcp_token_csr:1x131072x8", "dcp_token_csr:256x8192x2"],
    "GPU_QUICK": ["dcp_token_csr:64x32768x4"],
    "GPU_REAL": ["dcp_token_csr:64x1048576x4:len=mix"],
    "GPU_REAL_QUICK": ["dcp_token_csr:64x1048576x4:len=mix"],
    "CPU": ["dcp_token_csr:8x4096x4"],
    "CPU_QUICK": [],
}


def parse(shape: str, text: str) -> Case:
    usage = f"a DCP token-CSR case is dcp_token_csr:BATCHxCONTEXTxDCP, e.g. dcp_token_csr:64x32768x4; got {text!r}"
    batch, context, dcp_size = dimensions(shape, 3, usage)
    check_sizes(batch, context, 1, dcp_size, text)
    return Case(batch, context, 1, "dcp_token_csr", int64=True, dcp_size=dcp_size)


def check_sizes(batch: int, context: int, page: int, dcp_size: int, text: str) -> None:
    """The DCP ops' ranges (``dcp_page_table`` checks with this too)."""
    if batch < 1 or context < 1 or not 1 <= page <= 4096 or not 1 <= dcp_size <= 1024:
        raise argparse.ArgumentTypeError(f"case {text!r}: batch and context >= 1, page in [1, 4096], "
                                         "DCP size in [1, 1024]")


def shape_name(case: Case) -> str:
    return f"dcp_token_csr:{case.batch}x{case.context}x{case.dcp_size}"


def make_inputs(case: Case, device: torch.device, seed: int) -> Inputs:
    """A pool of virtual pages of ``CSR_POOL_PAGE`` slots; built for the last rank (the one whose first position
    is farthest from 0), its lengths from ``dcp_local_lengths``; the CSR into int64 rows back to back (int32
    ``kv_indptr``, ``out`` for ``context // dcp_size`` tokens a row, the last rank's of a full row), as SGLang's
    Triton backend allocates them."""
    _, req_to_token, pool, seq_lens = shuffled_pool(case, device, seed, CSR_POOL_PAGE)
    rank = case.dcp_size - 1
    local = kvdispatch.dcp_local_lengths(seq_lens, case.dcp_size, rank)
    kv_indptr = indptr(local)
    out = torch.full((case.batch * (case.context // case.dcp_size),), POISON, dtype=torch.int64, device=device)
    expected = ops.dcp_token_csr.reference(req_to_token, pool, local, kv_indptr, out.clone(), case.dcp_size, rank)
    return Inputs(req_to_token, pool, local, out, expected, kv_indptr, dcp_rank=rank)


def plain_torch(req_to_token, req_pool_indices, local_seq_lens, kv_indptr, out, dcp_size, dcp_rank):
    """One DCP rank's token CSR in the few PyTorch ops an engine would write (rows full length, back to back)."""
    positions = dcp_rank + torch.arange(out.shape[0] // req_pool_indices.shape[0], device=out.device) * dcp_size
    out.copy_((req_to_token[req_pool_indices[:, None].long(), positions] // dcp_size).view(-1))


def bind(impl: str, x: Inputs, case: Case):
    args = (x.req_to_token, x.req_pool_indices, x.seq_lens, x.kv_indptr, x.out)
    if backend := api_backend(impl):
        return functools.partial(kvdispatch.create_dcp_kv_indices, *args, dcp_size=case.dcp_size,
                                 dcp_rank=x.dcp_rank, backend=backend)
    function = plain_torch if impl == PLAIN_TORCH else baseline_kernels().dcp_loop
    return functools.partial(function, *args, case.dcp_size, x.dcp_rank)


def launch(case: Case, x: Inputs, budget: int | None) -> grid.Launch:
    columns = x.req_to_token.shape[1]
    return grid.dcp_token_csr_launch(x.req_pool_indices.shape[0], columns, x.out.shape[0], case.dcp_size, budget=budget)
