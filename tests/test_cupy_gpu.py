"""The CuPy backend on a GPU: the tensors' device and PyTorch's current stream are the ones used, CUDA-graph
capture and replay with new data, and one module compilation per device whatever the shapes."""

import random

import pytest
import torch

from kvdispatch import ops
import kvdispatch
from conftest import skip_module_unless_cupy_serves_the_gpu
from kvcases import POISON, make_case

skip_module_unless_cupy_serves_the_gpu()

from kernels_cupy import runtime  # noqa: E402  (imports CuPy)


def _page_table(case, out, **kwargs):
    return kvdispatch.create_flashmla_kv_indices(
        case.req_to_token, case.req_pool_indices, case.seq_lens, out, page_size=case.page_size,
        kv_start_idx=case.kv_start_idx, seqlen_offset=case.seqlen_offset, fill_value=case.fill_value,
        backend="cupy", **kwargs)


def _expected(case, out):
    expected = out.clone()
    ops.page_table.reference(case.req_to_token, case.req_pool_indices, case.seq_lens, expected, case.page_size,
                               case.kv_start_idx, case.seqlen_offset, None, case.fill_value)
    return expected


@pytest.mark.parametrize("index", range(torch.cuda.device_count()))
def test_runs_on_the_tensors_device(index):
    """Tensors on device ``index`` while another device is current (when there is one): the kernel runs
    there, and the current device is left as it was."""
    current = (index + 1) % torch.cuda.device_count()
    with torch.cuda.device(current):
        case = make_case(7, 16, max_pages=300, device=f"cuda:{index}", with_start=True, strided_out=True)
        out = case.page_table_out()
        expected = _expected(case, out)
        _page_table(case, out)
        assert torch.cuda.current_device() == current
    torch.testing.assert_close(out.cpu(), expected.cpu(), rtol=0, atol=0)


def test_runs_on_the_current_stream():
    """Inputs written on a side stream right before the call are what the kernel reads."""
    case = make_case(8, 1, max_pages=4000, device="cuda")
    out = case.page_table_out()
    fresh = case.req_to_token.flip(0).contiguous()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(10_000_000)  # keeps the side stream busy: a launch elsewhere would read stale data
        case.req_to_token.copy_(fresh)
        _page_table(case, out)
    side.synchronize()
    torch.testing.assert_close(out.cpu(), _expected(case, out.clone()).cpu(), rtol=0, atol=0)


@pytest.mark.parametrize("page_size", (1, 64))
def test_cuda_graph_replay_with_new_data(page_size):
    case = make_case(16, page_size, max_pages=70, device="cuda", with_start=True, fill_value=-1)
    out = case.page_table_out()
    indptr, csr_out = case.csr()
    _page_table(case, out)  # warm-up: compiles the module outside the capture
    kvdispatch.create_flashinfer_kv_indices(case.req_to_token, case.req_pool_indices, case.seq_lens, indptr,
                                            csr_out, kv_start_idx=case.kv_start_idx, backend="cupy")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _page_table(case, out)
        kvdispatch.create_flashinfer_kv_indices(case.req_to_token, case.req_pool_indices, case.seq_lens, indptr,
                                                csr_out, kv_start_idx=case.kv_start_idx, backend="cupy")
    rows, cols = case.req_to_token.shape
    lengths = case.seq_lens.clone()  # new lengths stay within them: CSR rows must not overlap
    for step in range(3):  # new data in the same buffers, bad values included
        g = torch.Generator().manual_seed(step)
        case.req_to_token.copy_(case.req_to_token.cpu()[torch.randperm(rows, generator=g)].flip(1))
        case.seq_lens.copy_(lengths - torch.randint(0, 5, (case.batch,), generator=g).to(lengths.device))
        case.kv_start_idx.copy_(torch.randint(0, cols + 2, (case.batch,), generator=g))
        case.req_pool_indices.copy_(torch.randint(-1, rows + 1, (case.batch,), generator=g))
        out.fill_(POISON)
        csr_out.fill_(POISON)
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out.cpu(), _expected(case, torch.full_like(out, POISON)).cpu(), rtol=0, atol=0)
        expected_csr = torch.full_like(csr_out, POISON)
        ops.token_csr.reference(case.req_to_token, case.req_pool_indices, case.seq_lens, indptr, expected_csr,
                                      case.kv_start_idx)
        torch.testing.assert_close(csr_out.cpu(), expected_csr.cpu(), rtol=0, atol=0)


def test_one_compilation_per_specialisation_whatever_the_shapes():
    """One module per (device, kernel, page size, flags): batch sizes, widths, strides and buffers never
    trigger a rebuild."""
    rng = random.Random(0)
    specs = [(page_size, dtype, with_start) for page_size in (1, 3, 64, 96) for dtype in (torch.int32, torch.int64)
             for with_start in (False, True)]

    def run(spec):
        page_size, dtype, with_start = spec
        case = make_case(rng.randrange(1, 40), page_size, max_pages=rng.randrange(1, 40), device="cuda",
                         strided_table=rng.random() < 0.5, strided_out=rng.random() < 0.5, index_dtype=dtype,
                         with_start=with_start)
        out = case.page_table_out()
        expected = _expected(case, out)
        _page_table(case, out)
        torch.testing.assert_close(out, expected, rtol=0, atol=0)
        indptr, csr_out = case.csr()
        kvdispatch.create_flashinfer_kv_indices(case.req_to_token, case.req_pool_indices, case.seq_lens, indptr,
                                                csr_out, kv_start_idx=case.kv_start_idx, backend="cupy")

    before, kernels_before = runtime.compiles, len(runtime._kernels)
    for spec in specs:  # the first call of each specialisation may compile it, once
        run(spec)
    assert runtime.compiles - before == len(runtime._kernels) - kernels_before
    compiled = runtime.compiles
    for _ in range(100):
        run(rng.choice(specs))
    assert runtime.compiles == compiled
