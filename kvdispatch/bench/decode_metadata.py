"""The decode-metadata cases, ``decode_metadata:BATCHxCONTEXTxPAGE[:swa]``: ``update_decode_metadata`` (lengths,
``cu_seqlens_k``, the page table and, with ``:swa``, its SWA twin and 4 SWA cache locations per request) against
the page table alone (``create_trtllm_mha_page_table``: the fused op's floor) and the eager PyTorch sequence it
replaces (plain PyTorch), on the page table's batches."""

from __future__ import annotations

import dataclasses
import functools

import torch

import kvdispatch
from kvdispatch import grid, ops

from . import mha_page_table
from .core import PLAIN_TORCH, POISON, Case, Inputs, api_backend, baseline_kernels

TABLE_ALONE, FUSED_SGLANG = "page-table-alone", "fused-1d-grid"
TRITON_BASELINES, SGLANG_BASELINE, IDEAL_BASELINE = (FUSED_SGLANG,), FUSED_SGLANG, None
API_VARIANTS, PLAIN_TORCH_CASES = (TABLE_ALONE,), "all"

LEGEND_CASE = "decode_metadata:BATCHxCONTEXTxPAGE[:swa]: one decode step's metadata (with SWA)"
LEGEND_IMPLS = ("page-table-alone: create_trtllm_mha_page_table on the same tables; fused-1d-grid: SGLang's fused "
                "design; plain torch: the eager sequence")
CASES = {
    "GPU": ["decode_metadata:64x32768x64", "decode_metadata:64x32768x64:swa", "decode_metadata:256x8192x16:swa",
            "decode_metadata:8x131072x1"],
    "GPU_QUICK": ["decode_metadata:64x32768x64:swa"],
    "GPU_REAL": ["decode_metadata:256x1048576x64:swa:len=1024-8192", "decode_metadata:64x131072x1:len=mix"],
    "GPU_REAL_QUICK": ["decode_metadata:256x1048576x64:swa:len=1024-8192"],
    "CPU": ["decode_metadata:4x4096x16:swa"],
    "CPU_QUICK": [],
}
LOCATIONS_PER_REQUEST = 4


def parse(shape: str, text: str) -> Case:
    return dataclasses.replace(mha_page_table.parse(shape, text.replace("decode_metadata", "mha_page_table")),
                               op="decode_metadata")


def shape_name(case: Case) -> str:
    return mha_page_table.shape_name(case).replace("mha_page_table", "decode_metadata")


def _views(out: torch.Tensor, case: Case) -> dict:
    """The outputs, as views of one int32 buffer: page table rows, SWA rows, then the per-request vectors."""
    batch, width, tables = case.batch, case.width, 2 if case.mapping else 1
    flat = out.view(-1)
    rest = flat[tables * batch * width:]
    views = dict(page_table=flat[:batch * width].view(batch, width), cache_seqlens=rest[:batch],
                 cu_seqlens_k=rest[batch:2 * batch + 1])
    if case.mapping:
        views.update(swa_page_table=flat[batch * width:2 * batch * width].view(batch, width),
                     swa_out_cache_loc=rest[2 * batch + 1:])
    return views


def make_inputs(case: Case, device: torch.device, seed: int) -> Inputs:
    """The MHA page table's pool (``mha_page_table.make_inputs``) and one int32 buffer for every output."""
    base = mha_page_table.make_inputs(dataclasses.replace(case, op="mha_page_table"), device, seed)
    tables = 2 if case.mapping else 1
    size = tables * case.batch * case.width + 2 * case.batch + 1 + case.mapping * LOCATIONS_PER_REQUEST * case.batch
    out = torch.full((size,), POISON, dtype=torch.int32, device=device)
    x = Inputs(base.req_to_token, base.req_pool_indices, base.seq_lens, out, out.clone(),
               token_mapping=base.token_mapping)
    locs = (torch.arange(LOCATIONS_PER_REQUEST * case.batch, device=device) * 7) % base.req_to_token.numel()
    x.kv_indptr = locs  # the cache locations the SWA twin translates
    bind("api:torch", dataclasses.replace(x, out=x.expected), case)()
    return x


def bind(impl: str, x: Inputs, case: Case):
    args = (x.req_to_token, x.req_pool_indices, x.seq_lens)
    v = _views(x.out, case)
    swa = dict(swa_page_table=v.get("swa_page_table"), full_to_swa=x.token_mapping)
    if backend := api_backend(impl):
        locs = dict(out_cache_loc=x.kv_indptr, swa_out_cache_loc=v["swa_out_cache_loc"]) if case.mapping else {}
        return functools.partial(kvdispatch.update_decode_metadata, *args, v["cache_seqlens"], v["cu_seqlens_k"],
                                 page_size=case.page_size, page_table=v["page_table"], **swa, **locs, backend=backend)
    if impl == TABLE_ALONE:
        call = functools.partial(kvdispatch.create_trtllm_mha_page_table, *args, v["page_table"],
                                 page_size=case.page_size, **swa)
        expected = torch.full_like(x.out, POISON)
        done = _views(expected, case)
        ops.mha_page_table.reference(*args, done["page_table"], case.page_size, done.get("swa_page_table"),
                                     x.token_mapping)
        call.expected = expected
        return call
    if impl == FUSED_SGLANG:
        locs = dict(out_cache_loc=x.kv_indptr, swa_out_cache_loc=v["swa_out_cache_loc"]) if case.mapping else {}
        return functools.partial(baseline_kernels().fused_metadata, *args, v["cache_seqlens"], v["cu_seqlens_k"],
                                 v["page_table"], case.page_size, **swa, **locs)
    assert impl == PLAIN_TORCH
    return functools.partial(_eager_sequence, x, v, case)


def _eager_sequence(x: Inputs, v: dict, case: Case):
    """The per-step update as eager PyTorch ops (what the fused kernel replaces)."""
    lens = x.seq_lens.to(torch.int32)
    v["cache_seqlens"].copy_(lens)
    v["cu_seqlens_k"][0] = 0
    torch.cumsum(lens, 0, out=v["cu_seqlens_k"][1:])
    ops.mha_page_table.reference(x.req_to_token, x.req_pool_indices, x.seq_lens, v["page_table"], case.page_size,
                                 v.get("swa_page_table"), x.token_mapping)
    if case.mapping:
        v["swa_out_cache_loc"].copy_(x.token_mapping[x.kv_indptr])


def launch(case: Case, x: Inputs, budget: int | None) -> grid.Launch:
    return grid.decode_metadata_launch(x.req_pool_indices.shape[0], case.width, case.page_size, budget=budget)
