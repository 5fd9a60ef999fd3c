"""The token CSR's cases, ``token_csr:BATCHxCONTEXT[:i64][:eE][:map][:v2pP]`` (int64 ``out``, ``entry_page_size``
E, a ``token_mapping``, or the unified pool's ``v2p`` on pages of P tokens): ``create_flashinfer_kv_indices``
against csr-loop (SGLang's design; on ``:v2pP`` cases read-packed-sglang, SGLang 0.5.23's packed read-table
kernel) and plain PyTorch (on full-length rows)."""

from __future__ import annotations

import argparse
import functools

import torch

from kvdispatch import ops
import kvdispatch
from kvdispatch import grid

from .core import (CSR_POOL_PAGE, PLAIN_TORCH, POISON, Case, Inputs, api_backend, baseline_kernels, dimensions,
                   indptr, page_pool, requests)

CSR_LOOP, READ_PACKED = "csr-loop", "read-packed-sglang"
TRITON_BASELINES, SGLANG_BASELINE, IDEAL_BASELINE = (CSR_LOOP,), CSR_LOOP, None
OPTION_BASELINES = (READ_PACKED,)
API_VARIANTS, PLAIN_TORCH_CASES = (), "full-length"

# What ``core.legend`` says of its cases and of its baselines.
LEGEND_CASE = ("token_csr:BATCHxCONTEXT[:i64][:eE][:map][:v2pP]: token CSR (int64 out, entry_page_size E, "
               "token_mapping; :v2pP: the unified pool's translated token stream, v2p on pages of P tokens, "
               "without :eE and :map)")
LEGEND_IMPLS = ("csr-loop: Triton after SGLang's token CSR, one program per request looping over its tokens; no "
                "plain-torch (written for full-length rows); :v2pP cases: read-packed-sglang in csr-loop's place, "
                "SGLang 0.5.23's packed read table (a grid sized from out's length, programs striding over a "
                "row's tokens)")
# Its cases in each set of ``core.case_set``.
CASES = {
    "GPU": ["token_csr:64x4096", "token_csr:64x4096:i64", "token_csr:64x4096:e16:map", "token_csr:8x32768:i64",
            "token_csr:64x4096:v2p64"],
    "GPU_QUICK": ["token_csr:64x4096:i64"],
    "GPU_REAL": ["token_csr:64x1048576:len=1024-8192", "token_csr:256x163840:e64:len=mix",
                 "token_csr:256x163840:v2p64:len=mix"],
    "GPU_REAL_QUICK": ["token_csr:64x1048576:len=1024-8192"],
    "CPU": ["token_csr:8x4096", "token_csr:8x4096:i64:e16:map", "token_csr:8x4096:v2p16"],
    "CPU_QUICK": ["token_csr:2x4096:e16:map"],
}


def parse(shape: str, text: str) -> Case:
    usage = (f"a token-CSR case is token_csr:BATCHxCONTEXT[:i64][:eE][:map][:v2pP], e.g. "
             f"token_csr:8x32768:i64:e64:map or token_csr:8x32768:v2p64; got {text!r}")
    shape, *options = shape.split(":")
    batch, context = dimensions(shape, 2, usage)
    try:
        entry = int(next((o[1:] for o in options if o.startswith("e")), 1))
        v2p_page = int(next((o[3:] for o in options if o.startswith("v2p")), 0))
    except ValueError:
        raise argparse.ArgumentTypeError(usage) from None
    if (sum(o.startswith("e") for o in options) > 1 or sum(o.startswith("v2p") for o in options) > 1
            or any(o not in ("i64", "map") and not o.startswith(("e", "v2p")) for o in options)):
        raise argparse.ArgumentTypeError(usage)
    if batch < 1 or context < 1 or not 1 <= entry <= 4096 or not 0 <= v2p_page <= 4096:
        raise argparse.ArgumentTypeError(f"case {text!r}: batch and context >= 1, E and P in [1, 4096]")
    if any(o.startswith("v2p") for o in options) and (v2p_page < 1 or entry > 1 or "map" in options):
        raise argparse.ArgumentTypeError(f"case {text!r}: :v2pP takes P in [1, 4096], without :eE and :map")
    return Case(batch, context, entry, "token_csr", "i64" in options, "map" in options, v2p_page=v2p_page)


def shape_name(case: Case) -> str:
    options = ([":i64"] * case.int64 + [f":e{case.page_size}"] * (case.page_size > 1) + [":map"] * case.mapping
               + [f":v2p{case.v2p_page}"] * bool(case.v2p_page))
    return f"token_csr:{case.batch}x{case.context}" + "".join(options)


def option_baseline(case: Case) -> str | None:
    return READ_PACKED if case.v2p_page else None


def make_inputs(case: Case, device: torch.device, seed: int) -> Inputs:
    """With ``E = case.page_size`` > 1 the table is page-granular (one page id per E tokens), with E = 1
    token-granular on pages of ``CSR_POOL_PAGE`` tokens; ``token_mapping`` is a random permutation of the pool's
    slots; rows back to back in ``out``, int32 or int64 ``[batch * context]``. ``:v2pP``: a token-granular
    table on virtual pages of P tokens and ``token_mapping`` the int64 ``v2p`` of every virtual page, one in 16
    freed (-1)."""
    g = torch.Generator().manual_seed(seed)
    rows, pool, lengths = requests(case, g)
    if case.v2p_page:
        req_to_token = page_pool(rows, case.context, case.v2p_page, g, device, lengths)
    elif case.page_size == 1:
        req_to_token = page_pool(rows, case.context, CSR_POOL_PAGE, g, device, lengths)
    else:
        req_to_token = page_pool(rows, case.width, 1, g, device, -(-lengths // case.page_size))
    slots = (int(req_to_token.max()) + 1) * case.page_size
    seq_lens = lengths[pool].to(device=device, dtype=torch.int32)
    pool = pool.to(device=device, dtype=torch.int32)
    kv_indptr = indptr(seq_lens)
    mapping = torch.randperm(slots, generator=g).to(device=device, dtype=torch.int32) if case.mapping else None
    if case.v2p_page:
        pages = -(-slots // case.v2p_page)
        mapping = torch.randperm(pages * 4, generator=g)[:pages]
        mapping[torch.randperm(pages, generator=g)[: pages // 16]] = -1
        mapping = mapping.to(device)
    out = torch.full((case.batch * case.context,), POISON, device=device,
                     dtype=torch.int64 if case.int64 else torch.int32)
    expected = ops.token_csr.reference(req_to_token, pool, seq_lens, kv_indptr, out.clone(), **_options(case, mapping))
    return Inputs(req_to_token, pool, seq_lens, out, expected, kv_indptr, mapping)


def _options(case: Case, mapping):
    """The op's keywords of ``case``, ``mapping`` its ``token_mapping`` or, on a ``:v2pP`` case, its ``v2p``."""
    if case.v2p_page:
        return dict(v2p=mapping, page_size=case.v2p_page)
    return dict(entry_page_size=case.page_size, token_mapping=mapping)


def plain_torch(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, entry_page_size=1, token_mapping=None,
                v2p=None, page_size=1):
    """The token CSR in the few PyTorch ops an engine would write (rows full length, back to back in ``out``)."""
    batch = req_pool_indices.shape[0]
    entries = req_to_token[req_pool_indices.long()].long()
    if v2p is not None:
        physical = v2p[entries[:, ::page_size] // page_size].clamp(min=0)
        offsets = torch.arange(page_size, device=out.device)
        entries = (physical[:, :, None] * page_size + offsets).view(batch, -1)
    elif entry_page_size > 1:
        offsets = torch.arange(entry_page_size, device=out.device)
        entries = (entries[:, :, None] * entry_page_size + offsets).view(batch, -1)
    values = entries[:, : out.shape[0] // batch].reshape(-1)
    out.copy_(values if token_mapping is None else token_mapping[values])


def bind(impl: str, x: Inputs, case: Case):
    args = (x.req_to_token, x.req_pool_indices, x.seq_lens, x.kv_indptr, x.out)
    if backend := api_backend(impl):
        return functools.partial(kvdispatch.create_flashinfer_kv_indices, *args, **_options(case, x.token_mapping),
                                 backend=backend)
    if impl == PLAIN_TORCH:
        return functools.partial(plain_torch, *args, **_options(case, x.token_mapping))
    if impl == READ_PACKED:
        return functools.partial(baseline_kernels().read_table_sglang, x.req_to_token, x.req_pool_indices,
                                 x.seq_lens, x.token_mapping, x.out, case.v2p_page, row_starts=x.kv_indptr)
    return functools.partial(baseline_kernels().csr_loop, *args, case.page_size, x.token_mapping)


def launch(case: Case, x: Inputs, budget: int | None) -> grid.Launch:
    columns = x.req_to_token.shape[1]
    return grid.token_csr_launch(x.req_pool_indices.shape[0], columns * case.page_size, x.out.shape[0], budget=budget)
