"""The token CSR over a gathered prefix+extend buffer, ``prefix_extend_csr:BATCHxCONTEXT`` (each request's first
three quarters a prefix, the rest its extend): ``create_prefix_extend_kv_indices`` against prefix-extend-loop
(SGLang's design) and plain PyTorch (on full-length rows)."""

from __future__ import annotations

import functools

import torch

import kvdispatch
from kvdispatch import grid
from kvdispatch import ops

from .core import PLAIN_TORCH, POISON, Case, Inputs, api_backend, baseline_kernels, dimensions, indptr, requests
from .dcp_token_csr import check_sizes

PREFIX_EXTEND_LOOP = "prefix-extend-loop"
TRITON_BASELINES, SGLANG_BASELINE, IDEAL_BASELINE = (PREFIX_EXTEND_LOOP,), PREFIX_EXTEND_LOOP, None
API_VARIANTS, PLAIN_TORCH_CASES = (), "full-length"

LEGEND_CASE = "prefix_extend_csr:BxC: the CSR over B requests' gathered prefixes (3/4 of C) then extends (out B*C ids)"
LEGEND_IMPLS = ("prefix-extend-loop: SGLang's design, one program per request, 512 ids per pass; no plain-torch "
                "(written for full-length rows)")
CASES = {
    "GPU": ["prefix_extend_csr:64x32768", "prefix_extend_csr:1x131072", "prefix_extend_csr:256x8192"],
    "GPU_QUICK": ["prefix_extend_csr:64x32768"],
    "GPU_REAL": ["prefix_extend_csr:64x1048576:len=mix"],
    "GPU_REAL_QUICK": ["prefix_extend_csr:64x1048576:len=mix"],
    "CPU": ["prefix_extend_csr:8x4096"],
    "CPU_QUICK": [],
}


def parse(shape: str, text: str) -> Case:
    usage = ("a prefix+extend CSR case is prefix_extend_csr:BATCHxCONTEXT, e.g. prefix_extend_csr:64x32768; "
             f"got {text!r}")
    batch, context = dimensions(shape, 2, usage)
    check_sizes(batch, context, 1, 1, text)
    return Case(batch, context, 1, "prefix_extend_csr")


def shape_name(case: Case) -> str:
    return f"prefix_extend_csr:{case.batch}x{case.context}"


def make_inputs(case: Case, device: torch.device, seed: int) -> Inputs:
    """The prefill planner's buffers, int32: prefix lengths (``req_pool_indices``), their starts (``req_to_token``,
    as a row), extend lengths (``seq_lens``), their starts (``positions``), ``kv_indptr`` of the rows back to back
    and ``out`` for ``batch * context`` ids; the prefixes' total, ``extend_base``, rides in ``dcp_rank``."""
    g = torch.Generator().manual_seed(seed)
    _, pool, lengths = requests(case, g)
    lengths = lengths[pool]
    prefix = lengths * 3 // 4
    extend = lengths - prefix
    prefix_starts, extend_starts = indptr(prefix)[:-1].to(device), indptr(extend)[:-1].to(device)
    kv_indptr = indptr(lengths).to(device)
    prefix, extend = prefix.to(device, torch.int32), extend.to(device, torch.int32)
    out = torch.full((case.batch * case.context,), POISON, dtype=torch.int32, device=device)
    base = int(prefix.sum())
    expected = ops.prefix_extend_csr.reference(prefix, prefix_starts, extend, extend_starts, kv_indptr, out.clone(),
                                               base)
    return Inputs(prefix_starts[None], prefix, extend, out, expected, kv_indptr, dcp_rank=base,
                  positions=extend_starts)


def plain_torch(prefix, prefix_starts, extend, extend_starts, kv_indptr, out, base):
    """The CSR in the few PyTorch ops an engine would write (rows full length, back to back)."""
    j = torch.arange(out.shape[0] // prefix.shape[0], device=out.device)[None, :]
    p = prefix[:, None]
    values = torch.where(j < p, prefix_starts[:, None] + j, base + extend_starts[:, None] + j - p)
    out.copy_(values.view(-1))


def _arguments(x: Inputs):
    return x.req_pool_indices, x.req_to_token[0], x.seq_lens, x.positions, x.kv_indptr, x.out


def bind(impl: str, x: Inputs, case: Case):
    if backend := api_backend(impl):
        return functools.partial(kvdispatch.create_prefix_extend_kv_indices, *_arguments(x), extend_base=x.dcp_rank,
                                 backend=backend)
    function = plain_torch if impl == PLAIN_TORCH else baseline_kernels().prefix_extend_loop
    return functools.partial(function, *_arguments(x), x.dcp_rank)


def launch(case: Case, x: Inputs, budget: int | None) -> grid.Launch:
    return grid.prefix_extend_csr_launch(x.seq_lens.shape[0], x.out.shape[0], budget=budget)
