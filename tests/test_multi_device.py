"""Per-device dispatch: selections and compiled kernels are keyed by device; mixed devices are rejected.

The two-GPU tests need two GPUs and skip otherwise; the cache-key tests simulate two devices on any machine.
"""

import pytest
import torch

from kvdispatch import ops
import kvdispatch
from kernels_cupy import backend as cupy_backend
from kernels_triton import backend as triton_backend
from conftest import GPU_BACKENDS, BACKENDS
from kvdispatch import devices, dispatch
from kvcases import make_case

TWO_GPUS = torch.cuda.is_available() and torch.cuda.device_count() >= 2


def _simulate(monkeypatch, table):
    monkeypatch.delenv("KVDISPATCH_BACKEND", raising=False)  # the GPU lanes force one; these tests are auto
    monkeypatch.setattr(devices, "read_device", lambda device: table[str(device)])
    monkeypatch.setattr(cupy_backend, "reason_if_unsupported", lambda raw, family: "CuPy is not installed (simulated)")
    monkeypatch.setattr(triton_backend, "reason_if_unsupported",
                        lambda raw, family: None if family != "unknown" else "unknown")


def test_selection_is_cached_per_device(monkeypatch):
    _simulate(monkeypatch, {
        "cuda:0": devices.RawDevice("cuda:0", "nvidia", "sm_90", "NVIDIA H200", 132, 32),
        "cuda:1": devices.RawDevice("cuda:1", "nvidia", "sm_61", "an old card", 20, 32),
    })
    assert kvdispatch.select_backend("cuda:0") == "triton"
    with pytest.warns(RuntimeWarning, match="unknown nvidia architecture sm_61"):
        assert kvdispatch.select_backend("cuda:1") == "torch"
    assert kvdispatch.probe("cuda:0").arch == "sm_90" and kvdispatch.probe("cuda:1").arch == "sm_61"


def test_a_failure_disables_a_backend_on_that_device_only(monkeypatch):
    _simulate(monkeypatch, {
        "cuda:0": devices.RawDevice("cuda:0", "nvidia", "sm_90", "NVIDIA H200", 132, 32),
        "cuda:1": devices.RawDevice("cuda:1", "nvidia", "sm_90", "NVIDIA H200", 132, 32),
    })
    with pytest.warns(RuntimeWarning, match="backend 'triton' failed on cuda:0"):
        dispatch.selector.fail(torch.device("cuda", 0), "triton", RuntimeError("launch failed"))
    assert kvdispatch.available_backends("cuda:0") == ["torch"]
    assert kvdispatch.available_backends("cuda:1") == ["triton", "torch"]


@pytest.mark.skipif(not TWO_GPUS, reason="needs two GPUs")
@pytest.mark.parametrize("backend", BACKENDS)
def test_runs_on_the_tensors_device_and_captures_there(backend):
    torch.cuda.set_device(0)
    case = make_case(9, 16, max_pages=40, device="cuda:1", with_start=True, fill_value=-1)
    out = case.page_table_out()

    def expected_from(before):
        expected = before.clone()
        ops.page_table.reference(case.req_to_token, case.req_pool_indices, case.seq_lens, expected, 16,
                                   case.kv_start_idx, 0, None, -1)
        return expected

    expected = expected_from(out)
    kvdispatch.create_flashmla_kv_indices(case.req_to_token, case.req_pool_indices, case.seq_lens, out,
                                          page_size=16, kv_start_idx=case.kv_start_idx, fill_value=-1,
                                          backend=backend)  # warm-up and compile
    assert torch.equal(out.cpu(), expected.cpu())
    assert torch.cuda.current_device() == 0

    # Capture on cuda:1: a launch on any other stream than the capturing one would break the capture.
    graph = torch.cuda.CUDAGraph()
    out.fill_(7)  # what the replay leaves untouched (spare rows) now reads 7
    expected = expected_from(out)
    with torch.cuda.device(1):
        # An explicit capture stream: torch.cuda.graph's default one is created once per process, on the
        # device current at the first capture, and would send later captures on cuda:0 to cuda:1.
        with torch.cuda.graph(graph, stream=torch.cuda.Stream(1)):
            kvdispatch.create_flashmla_kv_indices(case.req_to_token, case.req_pool_indices, case.seq_lens, out,
                                                  page_size=16, kv_start_idx=case.kv_start_idx, fill_value=-1,
                                                  backend=backend)
    graph.replay()
    torch.cuda.synchronize(1)
    assert torch.equal(out.cpu(), expected.cpu())
    assert kvdispatch.probe("cuda:1") is not kvdispatch.probe("cuda:0")


@pytest.mark.skipif(not TWO_GPUS, reason="needs two GPUs")
def test_mixed_gpus_are_rejected_before_launch():
    case = make_case(3, 16, device="cuda:0")
    out = case.page_table_out().to("cuda:1")
    with pytest.raises(ValueError, match="out is on cuda:1, expected cuda:0"):
        kvdispatch.create_flashmla_kv_indices(case.req_to_token, case.req_pool_indices, case.seq_lens, out,
                                              page_size=16)


@pytest.mark.skipif(not TWO_GPUS or not GPU_BACKENDS, reason="needs two GPUs")
def test_selection_keys_name_both_devices():
    for index in (0, 1):
        case = make_case(2, 16, device=f"cuda:{index}")
        kvdispatch.create_flashmla_kv_indices(case.req_to_token, case.req_pool_indices, case.seq_lens,
                                              case.page_table_out(), page_size=16)
    assert {key[0] for key in dispatch.selector._chosen} == {torch.device("cuda", 0), torch.device("cuda", 1)}
