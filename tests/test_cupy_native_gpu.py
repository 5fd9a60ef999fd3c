"""The CuPy backend through the compiled host path (``kvdispatch/host_path.c``) on a GPU: after a key's first
call (Python, which registers the replay plan) the page-table and token-CSR calls are launched from C, with
every option, their results equal the reference, CUDA-graph capture and replay still work, and calls the C path
does not take (another current device, ``KVDISPATCH_CUPY_LAUNCH=python``) still run, in Python. The parameters
themselves are checked on CPU (``test_cupy_native.py``, ``test_host_path_replay.py``)."""

from __future__ import annotations

import pytest
import torch

from kvdispatch import ops
import kvdispatch
from conftest import require_host_path, skip_module_unless_cupy_serves_the_gpu
from kvcases import POISON, assert_same, make_case

skip_module_unless_cupy_serves_the_gpu()

from kernels_cupy import native as cupy_native  # noqa: E402
from kvdispatch import host_path  # noqa: E402


@pytest.fixture(autouse=True)
def cupy_through_c(monkeypatch):
    """The CuPy backend forced, with the C path required (a plan it cannot take raises); skips where the
    extension is not available here (no C compiler; AMD without ``KVDISPATCH_HIP_HOST_PATH``)."""
    monkeypatch.setenv("KVDISPATCH_BACKEND", "cupy")
    monkeypatch.setenv(cupy_native.LAUNCH_ENV, "native")
    kvdispatch.reset()
    cupy_native.reset()
    require_host_path(torch.cuda.current_device())
    yield
    kvdispatch.reset()
    cupy_native.reset()


def c_launches() -> int:
    return host_path.load().launch_count()


def page_table(case, out, seq_lens_out=None, **kwargs):
    return kvdispatch.create_flashmla_kv_indices(
        case.req_to_token, case.req_pool_indices, case.seq_lens, out, page_size=case.page_size,
        kv_start_idx=case.kv_start_idx, seqlen_offset=case.seqlen_offset, seq_lens_out=seq_lens_out,
        fill_value=case.fill_value, **kwargs)


def expected_page_table(case, out, seq_lens_out=None, round_toward_zero=False):
    """The reference's ``out`` and ``seq_lens_out`` (on CPU) for ``case``, from poisoned copies."""
    expected = torch.full_like(out, POISON).cpu()
    lens_out = None if seq_lens_out is None else torch.full_like(seq_lens_out, POISON).cpu()
    ops.page_table.reference(case.req_to_token.cpu(), case.req_pool_indices.cpu(), case.seq_lens.cpu(), expected,
                               case.page_size, None if case.kv_start_idx is None else case.kv_start_idx.cpu(),
                               case.seqlen_offset, lens_out, case.fill_value, round_toward_zero=round_toward_zero)
    return expected, lens_out


def token_csr(case, indptr, out, **kwargs):
    return kvdispatch.create_flashinfer_kv_indices(case.req_to_token, case.req_pool_indices, case.seq_lens, indptr,
                                                   out, kv_start_idx=case.kv_start_idx, **kwargs)


def expected_csr(case, indptr, out, **kwargs):
    expected = torch.full_like(out, POISON).cpu()
    ops.token_csr.reference(case.req_to_token.cpu(), case.req_pool_indices.cpu(), case.seq_lens.cpu(),
                                  indptr.cpu(), expected,
                                  None if case.kv_start_idx is None else case.kv_start_idx.cpu(), **kwargs)
    return expected


def spoil(case, generator, grow=True):
    """Bad data the host cannot see: pool indices out of range, lengths negative or (with ``grow``) past the
    row, starts past the row. Without ``grow`` no length grows, so that CSR rows stay apart."""
    rows, cols = case.req_to_token.shape
    device = case.req_pool_indices.device
    case.req_pool_indices.copy_(torch.randint(-2, rows + 2, (case.batch,), generator=generator).to(device))
    change = torch.randint(-3 if grow else 0, 6, (case.batch,), generator=generator)
    case.seq_lens.copy_(torch.where(change == 5, -case.seq_lens.cpu(), case.seq_lens.cpu() - change).to(device))
    if case.kv_start_idx is not None:
        case.kv_start_idx.copy_(torch.randint(-1, cols + 3, (case.batch,), generator=generator).to(device))


PAGE_TABLE_CASES = [dict(page_size=1), dict(page_size=64, with_start=True), dict(page_size=16, fill_value=-1),
                    dict(page_size=96, index_dtype=torch.int64, strided_table=True, strided_out=True),
                    dict(page_size=1, seqlen_offset=3, with_start=True, index_dtype=torch.int64),
                    dict(page_size=64, lens_out=True), dict(page_size=4096, max_pages=3, fill_value=7)]


@pytest.mark.parametrize("options", PAGE_TABLE_CASES, ids=str)
def test_page_table_calls_go_through_c(options):
    options = {"max_pages": 50, **options}
    lens_out, page_size = options.pop("lens_out", False), options.pop("page_size")
    g = torch.Generator().manual_seed(len(str(options)) + page_size)
    case = make_case(int(torch.randint(1, 40, (1,), generator=g)), page_size, device="cuda", generator=g, **options)
    out = case.page_table_out()
    seq_lens_out = case.seq_lens_out() if lens_out else None
    page_table(case, out, seq_lens_out)  # the first call of the key: Python launches and registers the plan
    for step in range(3):
        before = c_launches()
        out.fill_(POISON)
        if seq_lens_out is not None:
            seq_lens_out.fill_(POISON)
        if step == 2:
            spoil(case, g)
        assert page_table(case, out, seq_lens_out) is out
        assert c_launches() == before + 1
        expected, expected_lens = expected_page_table(case, out, seq_lens_out)
        assert_same(out, expected, f"out, step {step}")
        if seq_lens_out is not None:
            assert_same(seq_lens_out, expected_lens, f"seq_lens_out, step {step}")


@pytest.mark.parametrize("index_dtype", (torch.int32, torch.int64))
@pytest.mark.parametrize("with_start", (False, True))
def test_token_csr_calls_go_through_c(index_dtype, with_start):
    g = torch.Generator().manual_seed(11 + with_start)
    case = make_case(17, 16, max_pages=40, device="cuda", generator=g, index_dtype=index_dtype,
                     with_start=with_start, strided_table=with_start)
    indptr, out = case.csr()
    token_csr(case, indptr, out)
    for step in range(3):
        before = c_launches()
        out.fill_(POISON)
        if step == 2:
            spoil(case, g, grow=False)
        assert token_csr(case, indptr, out) is out
        assert c_launches() == before + 1
        assert_same(out, expected_csr(case, indptr, out), f"out, step {step}")


def test_calls_with_options_go_through_c():
    """Rounding toward zero, an entry page size, a token mapping and an int64 out: each key's first call goes the
    Python way and registers its plan, the next one is launched from C, and both equal the reference."""
    case = make_case(9, 64, max_pages=30, device="cuda", with_start=True)
    out = case.page_table_out()
    for from_c in (False, True):
        before = c_launches()
        out.fill_(POISON)
        page_table(case, out, round_toward_zero=True)
        assert c_launches() == before + from_c
        assert_same(out, expected_page_table(case, out, round_toward_zero=True)[0], "rounding toward zero")
    indptr, csr_out = case.csr()
    mapping = torch.randperm(int(case.req_to_token.max()) + 1, device="cuda")
    for kwargs in (dict(entry_page_size=4), dict(token_mapping=mapping), {}):
        wide = not kwargs
        target = torch.full(csr_out.shape, POISON, dtype=torch.int64 if wide else torch.int32, device="cuda")
        expected = torch.full_like(target, POISON).cpu()
        ops.token_csr.reference(case.req_to_token.cpu(), case.req_pool_indices.cpu(), case.seq_lens.cpu(),
                                      indptr.cpu(), expected, case.kv_start_idx.cpu(),
                                      **{k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()})
        for from_c in (False, True):
            before = c_launches()
            target.fill_(POISON)
            token_csr(case, indptr, target, **kwargs)
            assert c_launches() == before + from_c, kwargs
            assert_same(target, expected, str(kwargs))


def test_python_mode_never_takes_the_c_path(monkeypatch):
    monkeypatch.setenv(cupy_native.LAUNCH_ENV, "python")
    cupy_native.reset()
    case = make_case(5, 16, device="cuda")
    out = case.page_table_out()
    before = c_launches()
    for _ in range(3):
        out.fill_(POISON)
        page_table(case, out)
    assert c_launches() == before
    assert_same(out, expected_page_table(case, out)[0], "out")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_another_current_device_is_handed_to_python():
    """The C path takes a call only in the context its plan was made in; with another device current the
    Python path serves (and leaves that device current)."""
    case = make_case(6, 16, device="cuda:1")
    out = case.page_table_out()
    with torch.cuda.device(1):
        page_table(case, out)
    before = c_launches()
    with torch.cuda.device(0):
        out.fill_(POISON)
        page_table(case, out)
        assert torch.cuda.current_device() == 0
    assert c_launches() == before
    assert_same(out, expected_page_table(case, out)[0], "out")


@pytest.mark.parametrize("page_size", (1, 64))
def test_cuda_graph_capture_and_replay(page_size):
    """Calls taken by the C path are captured like any launch; replays with new data (bad values included)
    give the reference's results."""
    case = make_case(16, page_size, max_pages=70, device="cuda", with_start=True, fill_value=-1)
    out = case.page_table_out()
    indptr, csr_out = case.csr()
    for _ in range(2):  # the first call registers the plans, the second is the C path's
        page_table(case, out)
        token_csr(case, indptr, csr_out)
    torch.cuda.synchronize()
    before = c_launches()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        page_table(case, out)
        token_csr(case, indptr, csr_out)
    assert c_launches() == before + 2
    lengths = case.seq_lens.clone()
    for step in range(3):
        g = torch.Generator().manual_seed(step)
        rows = case.req_to_token.shape[0]
        case.req_to_token.copy_(case.req_to_token.cpu()[torch.randperm(rows, generator=g)].flip(1))
        case.seq_lens.copy_(lengths)
        spoil(case, g, grow=False)  # CSR rows must not overlap
        out.fill_(POISON)
        csr_out.fill_(POISON)
        graph.replay()
        torch.cuda.synchronize()
        assert_same(out, expected_page_table(case, out)[0], f"out, replay {step}")
        assert_same(csr_out, expected_csr(case, indptr, csr_out), f"csr out, replay {step}")
    assert c_launches() == before + 2  # a replay calls no host code
