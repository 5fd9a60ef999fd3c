"""The ops the compiled host path replays (``host_path.REPLAYED``) on a GPU, for the Triton and CuPy backends:
after a key's first call (Python, which registers the replay plan) each call is launched from C (the
extension's launch count grows by one), equals the reference, on the registering call's buffers and on
other buffers of the same metadata, and inside a CUDA graph too. The parameters themselves are checked on
CPU (``test_host_path_replay.py``)."""

from __future__ import annotations

import pytest
import torch

import kvdispatch
from conftest import BACKENDS, HAS_GPU
from kvcases import POISON
from test_family_graphs import FAMILY_OPS, _case, _refresh

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_GPU, reason="the compiled host path launches on a GPU")]

from kvdispatch import host_path  # noqa: E402

REPLAYS = 10


@pytest.fixture(autouse=True)
def fresh_selection():
    kvdispatch.reset()
    if host_path.load(torch.cuda.current_device()) is None:
        pytest.skip(f"the compiled host path is not available here: {host_path.failure()}")
    yield
    kvdispatch.reset()


def c_launches() -> int:
    return host_path.load().launch_count()


def poison(x, outputs):
    for name in outputs:
        x[name].fill_(POISON)


def check_against_reference(x, outputs, call, label):
    expected = {k: v.cpu() for k, v in x.items()}
    call(expected)
    for name in outputs:
        assert torch.equal(x[name].cpu(), expected[name]), f"{label}: {name} differs"


@pytest.mark.parametrize("backend", [b for b in ("triton", "cupy") if b in BACKENDS])
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
        poison(x, outputs)
        before = c_launches()
        call(x, backend, enable_pdl=False)
        torch.cuda.synchronize()
        assert c_launches() == before + 1, f"{op} {backend}: not launched from C"
        check_against_reference(x, outputs, call, f"{op} {backend} eager {step}")
    # Other buffers of the same metadata: the same plan, with their pointers.
    other = {k: v.clone() for k, v in x.items()}
    poison(other, outputs)
    before = c_launches()
    call(other, backend, enable_pdl=False)
    torch.cuda.synchronize()
    assert c_launches() == before + 1
    check_against_reference(other, outputs, call, f"{op} {backend} other buffers")
    # An output over the table (same metadata, one buffer): handed back, and the Python path raises.
    table, out = other["table"], other[outputs[0]]
    base = torch.zeros(max(table.numel() * 4, out.numel() * out.element_size()) + 64, dtype=torch.uint8,
                       device=device)
    overlapping = dict(other, table=base.view(torch.int32).as_strided(table.shape, table.stride()))
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
    for step in range(4, 4 + REPLAYS):
        _refresh(x, g, step)
        graph.replay()
        torch.cuda.synchronize()
        check_against_reference(x, outputs, call, f"{op} {backend} graph replay {step}")


@pytest.mark.parametrize("backend", [b for b in ("triton", "cupy") if b in BACKENDS])
def test_pdl_calls_stay_in_python(backend, monkeypatch):
    device = torch.device("cuda")
    g = torch.Generator().manual_seed(3)
    x, outputs, call = _case("mha", device, g)
    _refresh(x, g, 0)
    call(x, backend, enable_pdl=False)
    before = c_launches()
    call(x, backend, enable_pdl=True)
    torch.cuda.synchronize()
    assert c_launches() == before
    check_against_reference(x, outputs, call, f"mha {backend} pdl")
