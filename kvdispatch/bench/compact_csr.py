"""One DCP rank's share of a decode CSR compacted, ``compact_csr:BATCHxCONTEXTxDCP`` (rank DCP - 1 of DCP):
``create_compact_kv_indices`` against compact-grid-2d (SGLang's ``update_kv_lens_and_indices`` design) and plain
PyTorch (on full-length rows)."""

from __future__ import annotations

import functools

import torch

import kvdispatch
from kvdispatch import grid
from kvdispatch import ops

from .core import PLAIN_TORCH, POISON, Case, Inputs, api_backend, baseline_kernels, dimensions, indptr, requests
from .dcp_token_csr import check_sizes

COMPACT_GRID_2D = "compact-grid-2d"
TRITON_BASELINES, SGLANG_BASELINE, IDEAL_BASELINE = (COMPACT_GRID_2D,), COMPACT_GRID_2D, None
API_VARIANTS, PLAIN_TORCH_CASES = (), "full-length"

LEGEND_CASE = "compact_csr:BxCxD: DCP rank D-1's share of a B-request CSR, compacted (out B*C/D ids)"
LEGEND_IMPLS = ("compact-grid-2d: SGLang's design, a 2-D grid of 128 ids per program over the longest shard; "
                "no plain-torch (written for full-length rows)")
CASES = {
    "GPU": ["compact_csr:64x32768x4", "compact_csr:1x131072x8", "compact_csr:256x8192x2"],
    "GPU_QUICK": ["compact_csr:64x32768x4"],
    "GPU_REAL": ["compact_csr:64x1048576x4:len=mix"],
    "GPU_REAL_QUICK": ["compact_csr:64x1048576x4:len=mix"],
    "CPU": ["compact_csr:8x4096x4"],
    "CPU_QUICK": [],
}


def parse(shape: str, text: str) -> Case:
    usage = f"a compacted-CSR case is compact_csr:BATCHxCONTEXTxDCP, e.g. compact_csr:64x32768x4; got {text!r}"
    batch, context, dcp_size = dimensions(shape, 3, usage)
    check_sizes(batch, context, 1, dcp_size, text)
    return Case(batch, context, 1, "compact_csr", dcp_size=dcp_size)


def shape_name(case: Case) -> str:
    return f"compact_csr:{case.batch}x{case.context}x{case.dcp_size}"


def make_inputs(case: Case, device: torch.device, seed: int) -> Inputs:
    """The planner's buffers: a decode CSR of the rows' lengths back to back (int32 ids, a buffer for
    ``batch * context`` of them; ``req_to_token`` is that buffer as one row, ``req_pool_indices`` its
    ``kv_indptr``), the last rank's shard lengths and their ``kv_indptr``, and ``out`` for ``batch * context /
    dcp_size`` ids, int32, as ``plan_dcp_decode_metadata`` allocates them."""
    g = torch.Generator().manual_seed(seed)
    _, pool, lengths = requests(case, g)
    lengths = lengths[pool]
    rank = case.dcp_size - 1
    ids = torch.randperm(case.batch * case.context, generator=g).to(device=device, dtype=torch.int32)[None]
    starts = indptr(lengths).to(device)
    local = ((lengths - rank - 1).div(case.dcp_size, rounding_mode="floor") + 1).clamp(min=0).to(device, torch.int32)
    local_indptr = indptr(local.cpu()).to(device)
    out = torch.full((case.batch * (case.context // case.dcp_size),), POISON, dtype=torch.int32, device=device)
    expected = ops.compact_csr.reference(ids, local, local_indptr, out.clone(), 0, starts, rank, case.dcp_size)
    return Inputs(ids, starts, local, out, expected, local_indptr, dcp_rank=rank)


def plain_torch(source, starts, local, local_indptr, out, dcp_size, dcp_rank):
    """The rank's share in the few PyTorch ops an engine would write (rows full length, back to back)."""
    per_row = out.shape[0] // local.shape[0]
    positions = starts[:-1, None].long() + dcp_rank + torch.arange(per_row, device=out.device) * dcp_size
    out.copy_(source[0, positions].view(-1))


def bind(impl: str, x: Inputs, case: Case):
    if backend := api_backend(impl):
        return functools.partial(kvdispatch.create_compact_kv_indices, x.req_to_token, x.seq_lens, x.kv_indptr,
                                 x.out, row_step=0, source_indptr=x.req_pool_indices, offset=x.dcp_rank,
                                 step=case.dcp_size, backend=backend)
    function = plain_torch if impl == PLAIN_TORCH else baseline_kernels().compact_grid_2d
    return functools.partial(function, x.req_to_token, x.req_pool_indices, x.seq_lens, x.kv_indptr, x.out,
                             case.dcp_size, x.dcp_rank)


def launch(case: Case, x: Inputs, budget: int | None) -> grid.Launch:
    return grid.compact_csr_launch(x.seq_lens.shape[0], x.req_to_token.shape[1], x.out.shape[0], case.dcp_size,
                                   budget=budget)
