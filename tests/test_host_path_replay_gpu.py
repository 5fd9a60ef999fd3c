"""The ops the compiled host path replays (``host_path.REPLAYED``: every op) on a GPU, for the Triton and CuPy
backends: after a key's first call (Python, which registers the replay plan) each call is launched from C (the
extension's launch count grows by one), equals the reference, on the registering call's buffers and on
other buffers of the same metadata, and inside a CUDA graph too; the page table and the token CSR with each of
their options. The parameters themselves are checked on CPU (``test_host_path_replay.py``)."""

from __future__ import annotations

import pytest
import torch

import kvdispatch
from conftest import BACKENDS, HAS_GPU, require_host_path
from kvcases import POISON, assert_same, make_case
from test_family_graphs import FAMILY_OPS, _case, _refresh, check_replays

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_GPU, reason="the compiled host path launches on a GPU")]

from kvdispatch import _validate, host_path, ops  # noqa: E402

REPLAYS = 10


@pytest.fixture(autouse=True)
def fresh_selection():
    kvdispatch.reset()
    require_host_path(torch.cuda.current_device())
    yield
    kvdispatch.reset()


def c_launches() -> int:
    return host_path.load().launch_count()


def call_checked(x, outputs, call, backend, label, from_c=True, **options):
    """One eager call of ``backend`` on the buffers ``x`` (outputs poisoned first): it equals the reference
    applied to the same buffers, and was launched from C (``from_c``) or not."""
    for name in outputs:
        x[name].fill_(POISON)
    expected = {k: v.cpu() for k, v in x.items()}
    call(expected)
    before = c_launches()
    call(x, backend, enable_pdl=False, **options)
    torch.cuda.synchronize()
    assert c_launches() == before + from_c, f"{label}: {'not ' if from_c else ''}launched from C"
    for name in outputs:
        assert torch.equal(x[name].cpu(), expected[name]), f"{label}: {name} differs"


BACKENDS_WITH_C = [b for b in ("triton", "cupy") if b in BACKENDS]


@pytest.mark.parametrize("backend", BACKENDS_WITH_C)
@pytest.mark.parametrize("op", FAMILY_OPS)
def test_calls_after_the_first_are_launched_from_c(backend, op):
    device = torch.device("cuda")
    g = torch.Generator().manual_seed(len(op) + 7)
    x, outputs, call = _case(op, device, g)
    _refresh(x, g, 0)
    call(x, backend, enable_pdl=False)  # Python: compiles, selects, registers the replay plan
    torch.cuda.synchronize()
    for step in range(1, 4):
        _refresh(x, g, step)
        call_checked(x, outputs, call, backend, f"{op} {backend} eager {step}")
    # Other buffers of the same metadata: the same plan, with their pointers.
    call_checked({k: v.clone() for k, v in x.items()}, outputs, call, backend, f"{op} {backend} other buffers")
    # An output over the table (same metadata, one buffer): handed back, and the Python path raises.
    table, out = x["table"], x[outputs[0]]
    extent = max(_validate._span(t)[1] - _validate._span(t)[0] for t in (table, out))
    base = torch.zeros(extent + 64, dtype=torch.uint8, device=device)
    overlapping = dict(x, table=base.view(torch.int32).as_strided(table.shape, table.stride()))
    overlapping[outputs[0]] = base.view(out.dtype).as_strided(out.shape, out.stride())
    before = c_launches()
    with pytest.raises(ValueError, match="shares memory"):
        call(overlapping, backend, enable_pdl=False)
    assert c_launches() == before
    # A CUDA graph: captured through C, replays equal the reference.
    graph = torch.cuda.CUDAGraph()
    before = c_launches()
    with torch.cuda.graph(graph):
        call(x, backend, enable_pdl=False)
    assert c_launches() == before + 1
    check_replays(graph, x, g, outputs, call, range(4, 4 + REPLAYS), f"{op} {backend} graph replay")


@pytest.mark.parametrize("backend", BACKENDS_WITH_C)
def test_pdl_and_debug_calls_stay_in_python(backend, monkeypatch):
    device = torch.device("cuda")
    g = torch.Generator().manual_seed(3)
    x, outputs, call = _case("mha", device, g)
    _refresh(x, g, 0)
    call(x, backend, enable_pdl=False)
    call_checked(x, outputs, call, backend, "mha, registered")
    for name in outputs:
        x[name].fill_(POISON)
    expected = {k: v.cpu() for k, v in x.items()}
    call(expected)
    before = c_launches()
    call(x, backend, enable_pdl=True)
    torch.cuda.synchronize()
    assert c_launches() == before
    for name in outputs:
        assert torch.equal(x[name].cpu(), expected[name]), f"mha {backend} pdl: {name} differs"
    monkeypatch.setenv("KVDISPATCH_DEBUG", "1")
    kvdispatch.reset()
    call(x, backend, enable_pdl=False)  # selects again (Python), the plan is kept
    call_checked(x, outputs, call, backend, "mha, debug", from_c=False)


PAGE_TABLE_OPTIONS = [dict(), dict(round_toward_zero=True), dict(kv_start=True, fill_value=-1),
                      dict(seq_lens_out=True, seqlen_offset=2), dict(kv_start=True, round_toward_zero=True)]
TOKEN_CSR_OPTIONS = [dict(), dict(out_dtype=torch.int64), dict(entry_page_size=4), dict(token_mapping=True),
                     dict(kv_start=True, out_dtype=torch.int64, entry_page_size=16, token_mapping=True)]


@pytest.mark.parametrize("backend", BACKENDS_WITH_C)
@pytest.mark.parametrize("options", PAGE_TABLE_OPTIONS, ids=str)
def test_page_table_options_are_launched_from_c(backend, options):
    options = dict(options)
    start, lens_out = options.pop("kv_start", False), options.pop("seq_lens_out", False)
    case = make_case(11, 16, max_pages=20, device="cuda", with_start=start,
                     seqlen_offset=options.pop("seqlen_offset", 0), fill_value=options.pop("fill_value", None),
                     generator=torch.Generator().manual_seed(len(str(options))))
    out, seq_lens_out = case.page_table_out(), case.seq_lens_out() if lens_out else None
    for from_c in (False, True):  # the key's first call registers its plan, the next one is C's
        before = c_launches()
        out.fill_(POISON)
        kvdispatch.create_flashmla_kv_indices(case.req_to_token, case.req_pool_indices, case.seq_lens, out,
                                              page_size=16, kv_start_idx=case.kv_start_idx,
                                              seqlen_offset=case.seqlen_offset, seq_lens_out=seq_lens_out,
                                              fill_value=case.fill_value, backend=backend, **options)
        torch.cuda.synchronize()
        assert c_launches() == before + from_c
        expected = torch.full_like(out, POISON).cpu()
        ops.page_table.reference(*(t.cpu() for t in (case.req_to_token, case.req_pool_indices, case.seq_lens)),
                                   expected, 16, None if case.kv_start_idx is None else case.kv_start_idx.cpu(),
                                   case.seqlen_offset, None, case.fill_value, **options)
        assert_same(out, expected, f"page table {options}")


@pytest.mark.parametrize("backend", BACKENDS_WITH_C)
@pytest.mark.parametrize("options", TOKEN_CSR_OPTIONS, ids=str)
def test_token_csr_options_are_launched_from_c(backend, options):
    options = dict(options)
    case = make_case(13, 16, max_pages=20, device="cuda", with_start=options.pop("kv_start", False),
                     generator=torch.Generator().manual_seed(len(str(options))))
    indptr, out = case.csr()
    out = out.to(options.pop("out_dtype", torch.int32))
    if options.pop("token_mapping", False):
        options["token_mapping"] = torch.randperm(2 * int(case.req_to_token.max()) + 1, device="cuda")
    cpu_options = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in options.items()}
    expected = torch.full_like(out, POISON).cpu()
    ops.token_csr.reference(*(t.cpu() for t in (case.req_to_token, case.req_pool_indices, case.seq_lens,
                                                       indptr)), expected,
                                  None if case.kv_start_idx is None else case.kv_start_idx.cpu(), **cpu_options)
    for from_c in (False, True):
        before = c_launches()
        out.fill_(POISON)
        kvdispatch.create_flashinfer_kv_indices(case.req_to_token, case.req_pool_indices, case.seq_lens, indptr, out,
                                                kv_start_idx=case.kv_start_idx, backend=backend, **options)
        torch.cuda.synchronize()
        assert c_launches() == before + from_c
        assert_same(out, expected, f"token CSR {options}")
