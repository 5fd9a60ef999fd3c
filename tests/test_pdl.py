"""Programmatic dependent launch (PDL): ``enable_pdl`` on every public op and ``KVDISPATCH_PDL``.

Everywhere: the keyword is accepted by every op, its value (or the variable's, for None) reaches the backends,
results equal the reference whatever it says, and a PDL call never takes the compiled host path. Where the
device cannot do PDL (CPU, AMD, NVIDIA before compute capability 9.0) it is ignored: the probe says so, the
Triton launcher compiles without it and the CuPy launcher keeps its ordinary specialisation. On a GPU that
can (skipped elsewhere): every op launched with PDL equals the reference on triton and cupy, eagerly and in
a CUDA graph whose kernels read what the kernel before them wrote.
"""

from __future__ import annotations

import inspect

import pytest
import torch

from kvdispatch import ops
import kvdispatch
import simdevices
from conftest import BACKENDS, DEVICE, HAS_GPU
from kernels_cupy import launch as cupy_launch
from kvcases import POISON, make_case
from kvdispatch import devices, dispatch, info
from kvdispatch.bench import core as bench
from kvdispatch.devices import RawDevice
from test_family_graphs import FAMILY_OPS, _case, _refresh

API_BACKENDS = [b for b in BACKENDS if b != "cupy-host"]  # the host build has no dispatch entry
ALL_OPS = ["page_table", "token_csr"] + FAMILY_OPS
PAGE_SIZE = 16


def _op_case(op, device, g):
    """(buffers, output names, call) of any public op, as ``test_family_graphs._case``: ``call(buffers)`` runs the
    reference, ``call(buffers, backend, **options)`` the public op. Valid random data already in the buffers."""
    if op in FAMILY_OPS:
        x, outputs, call = _case(op, device, g)
        _refresh(x, g, 1)
        return x, outputs, call
    case = make_case(5, PAGE_SIZE, max_pages=4, device=device, with_start=True, generator=g)
    x = dict(table=case.req_to_token, pool=case.req_pool_indices, lens=case.seq_lens, start=case.kv_start_idx)
    if op == "page_table":
        x.update(out=case.page_table_out(), seq_out=case.seq_lens_out())

        def call(t, backend=None, **options):
            if backend is None:
                return ops.page_table.reference(t["table"], t["pool"], t["lens"], t["out"], PAGE_SIZE, t["start"],
                                                  2, t["seq_out"], -1)
            return kvdispatch.create_flashmla_kv_indices(
                t["table"], t["pool"], t["lens"], t["out"], page_size=PAGE_SIZE, kv_start_idx=t["start"],
                seqlen_offset=2, seq_lens_out=t["seq_out"], fill_value=-1, backend=backend, **options)
        return x, ("out", "seq_out"), call
    assert op == "token_csr"
    x["indptr"], x["out"] = case.csr()

    def call(t, backend=None, **options):
        if backend is None:
            return ops.token_csr.reference(t["table"], t["pool"], t["lens"], t["indptr"], t["out"], t["start"])
        return kvdispatch.create_flashinfer_kv_indices(t["table"], t["pool"], t["lens"], t["indptr"], t["out"],
                                                       kv_start_idx=t["start"], backend=backend, **options)
    return x, ("out",), call


def _use_env(monkeypatch, value):
    """``KVDISPATCH_PDL=value`` (None: unset), taking effect as documented: at ``kvdispatch.reset()``."""
    if value is None:
        monkeypatch.delenv("KVDISPATCH_PDL", raising=False)
    else:
        monkeypatch.setenv("KVDISPATCH_PDL", value)
    kvdispatch.reset()


# --- the probe's fact ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("raw, expected", [
    (simdevices.H200, True), (simdevices.B200, True), (simdevices.FUTURE_NVIDIA, True),
    (RawDevice("cuda:0", "nvidia", "sm_120", "NVIDIA RTX PRO 6000", 188, 32), True),
    (RawDevice("cuda:0", "nvidia", "sm_89", "NVIDIA L40S", 142, 32), False),
    (simdevices.A100, False), (simdevices.MI300X, False), (simdevices.MI355X, False),
    (RawDevice("cpu", "cpu", "cpu", "x86_64", 2, 1), False),
], ids=lambda v: getattr(v, "arch", None))
def test_probe_says_which_devices_can_do_pdl(raw, expected):
    assert devices.describe(raw).supports_pdl is expected


def test_simulated_devices_report_it_through_probe(monkeypatch):
    sim = simdevices.Sim(monkeypatch)
    for raw, expected in ((simdevices.H200, True), (simdevices.A100, False), (simdevices.MI300X, False)):
        sim.add(raw)
        kvdispatch.reset()
        assert kvdispatch.probe(raw.device).supports_pdl is expected


def test_cpu_has_no_pdl_and_info_says_so(capsys):
    assert kvdispatch.probe("cpu").supports_pdl is False
    info.report()
    lines = capsys.readouterr().out.splitlines()
    cpu = lines.index(next(line for line in lines if line.startswith("device cpu")))
    assert "programmatic dependent launch (enable_pdl, KVDISPATCH_PDL): unavailable" in "\n".join(lines[cpu:cpu + 8])
    assert any(line.strip().startswith("KVDISPATCH_PDL") for line in lines)


# --- the default and what reaches the backends ---------------------------------------------------------------


def test_kvdispatch_pdl_is_read_at_reset_not_per_call(monkeypatch):
    _use_env(monkeypatch, None)
    assert dispatch.pdl_default is False
    monkeypatch.setenv("KVDISPATCH_PDL", "On")
    assert dispatch.pdl_default is False  # not read per call
    kvdispatch.reset()
    assert dispatch.pdl_default is True
    monkeypatch.setenv("KVDISPATCH_PDL", "sometimes")
    with pytest.raises(ValueError, match="KVDISPATCH_PDL"):
        kvdispatch.reset()
    _use_env(monkeypatch, "0")
    assert dispatch.pdl_default is False


@pytest.mark.parametrize("op", ALL_OPS)
@pytest.mark.parametrize("enable_pdl, env, passed", [(None, None, False), (None, "1", True), (True, "0", True),
                                                     (False, "yes", False)])
def test_the_backends_get_the_pdl_choice(monkeypatch, op, enable_pdl, env, passed):
    """``enable_pdl``, or the variable for None, is the backends' last argument."""
    _use_env(monkeypatch, env)
    seen = []
    real_call = dispatch.call

    def spy(device, name, backend, *args):
        seen.append(args[-1])
        return real_call(device, name, backend, *args)

    monkeypatch.setattr(dispatch, "call", spy)
    x, _, call = _op_case(op, torch.device("cpu"), torch.Generator().manual_seed(3))
    call(x, "torch", enable_pdl=enable_pdl)
    assert seen == [passed]


def test_sglang_drop_ins_keep_their_signatures_and_follow_the_variable(monkeypatch):
    from kvdispatch.compat import sglang

    functions = [getattr(sglang, name) for name in sglang.__all__ if callable(getattr(sglang, name))]
    assert sglang.create_flashmla_kv_indices_triton in functions and sglang.build_kv_read_table in functions
    assert not [f.__name__ for f in functions if "enable_pdl" in inspect.signature(f).parameters]
    seen = []
    real_call = dispatch.call
    monkeypatch.setattr(dispatch, "call", lambda *args: seen.append(args[-1]) or real_call(*args))
    case = make_case(3, PAGE_SIZE, max_pages=4, generator=torch.Generator().manual_seed(8), device=DEVICE)
    for env in ("1", "0"):
        _use_env(monkeypatch, env)
        out = case.page_table_out()
        grid = (case.batch, sglang.get_num_kv_index_blocks_flashmla(out.shape[1], PAGE_SIZE))
        sglang.create_flashmla_kv_indices_triton[grid](case.req_to_token, case.req_pool_indices, case.seq_lens, None,
                                                       out, case.req_to_token.stride(0), out.stride(0),
                                                       PAGED_SIZE=PAGE_SIZE)
    assert seen == [True, False]


@pytest.mark.parametrize("op", ALL_OPS)
def test_pdl_calls_never_take_the_compiled_host_path(monkeypatch, op):
    """The compiled host path (its replay entry, ``dispatch.fast_replay``) refuses PDL kernels; the API does not
    even offer it the call."""
    offered = []
    monkeypatch.setattr(dispatch, "fast_replay", lambda *args: offered.append(args) or NotImplemented)
    x, _, call = _op_case(op, torch.device("cpu"), torch.Generator().manual_seed(4))
    for enable_pdl, env, taken in ((True, None, False), (None, "1", False), (False, "1", True), (None, None, True)):
        _use_env(monkeypatch, env)
        offered.clear()
        call(x, "torch", enable_pdl=enable_pdl)
        assert bool(offered) is taken, (enable_pdl, env)


# --- results: the same with and without PDL, on every backend (on a GPU that can, with PDL) --------------------


@pytest.mark.parametrize("backend", API_BACKENDS)
@pytest.mark.parametrize("op", ALL_OPS)
def test_every_op_equals_the_reference_with_or_without_pdl(monkeypatch, backend, op):
    g = torch.Generator().manual_seed(len(op))
    x, outputs, call = _op_case(op, DEVICE, g)
    for enable_pdl, env in ((True, None), (None, "1"), (False, "1"), (None, None)):
        _use_env(monkeypatch, env)
        for name in outputs:
            x[name].fill_(POISON)
        expected = {k: v.cpu().clone() for k, v in x.items()}
        call(expected)
        call(x, backend, enable_pdl=enable_pdl)
        for name in outputs:
            assert torch.equal(x[name].cpu(), expected[name]), f"{op} {backend} {enable_pdl=} {env=}: {name}"


@pytest.mark.skipif("triton" not in BACKENDS, reason="Triton is not installed")
def test_pdl_is_part_of_the_triton_specialisation():
    """A PDL call has its own plan and compiled specialisation (``(..., pdl)``), compiled once; on a device
    without PDL it is compiled without the instructions (under the interpreter they could not run)."""
    from kernels_triton import page_table

    x, _, call = _op_case("page_table", DEVICE, torch.Generator().manual_seed(5))
    for enable_pdl in (False, True, True):
        call(x, "triton", enable_pdl=enable_pdl)
    keys = [key for key in page_table._plans if key[0] == x["out"].get_device()]
    assert {key[-1] for key in keys} == {False, True}
    specialisations = [spec for (index, spec) in page_table.launcher.compiled if index == x["out"].get_device()]
    assert {spec[-1] for spec in specialisations} >= {False, True}


@pytest.mark.parametrize("raw, expected", [(simdevices.H200, True), (simdevices.A100, False),
                                           (simdevices.MI300X, False)], ids=lambda v: getattr(v, "arch", None))
def test_cupy_specialises_with_kv_pdl_only_where_supported(monkeypatch, raw, expected):
    """``KV_PDL`` joins the CuPy specialisation (and the call goes to ``runtime.launch_pdl``) only where asked
    for and supported; the ordinary call is left as it was."""
    monkeypatch.setattr(devices, "probe", lambda device=None: devices.describe(raw))
    case = make_case(3, PAGE_SIZE, max_pages=4, generator=torch.Generator().manual_seed(6))
    call = cupy_launch.page_table_call(case.req_to_token, case.req_pool_indices, case.seq_lens, case.page_table_out(),
                                       PAGE_SIZE)
    gpu = torch.device("cuda", 0)
    assert cupy_launch.with_pdl(call, False, gpu) is call
    assert cupy_launch.with_pdl(None, True, gpu) is None
    pdl_call = cupy_launch.with_pdl(call, True, gpu)
    if expected:
        assert pdl_call.pdl and pdl_call.defines == call.defines + (("KV_PDL", 1),)
        assert pdl_call._replace(defines=call.defines, pdl=False) == call
    else:
        assert pdl_call is call and not call.pdl


# --- GPU: PDL in CUDA graphs ------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("backend", [b for b in API_BACKENDS if b != "torch"])
def test_pdl_chain_in_a_cuda_graph_reads_what_the_kernel_before_wrote(backend):
    """One graph: copies write the pool indices and lengths, a PDL page-table call writes ``seq_lens_out``, and a
    second PDL call reads it as its lengths. Every replay, with new data, equals the reference (on a GPU without
    PDL the calls are ordinary ones)."""
    if not kvdispatch.probe().supports_pdl:
        print(f"{torch.cuda.get_device_name()}: no PDL, enable_pdl is ignored")
    g = torch.Generator().manual_seed(7)
    case = make_case(8, 64, max_pages=8, device="cuda", generator=g)
    batch = case.batch
    pool, lens = case.req_pool_indices.clone(), case.seq_lens.clone()
    staged_pool, staged_lens = pool.clone(), lens.clone()
    first, second, lengths_out = case.page_table_out(), case.page_table_out(), case.seq_lens_out()

    def step():
        pool.copy_(staged_pool)
        lens.copy_(staged_lens)
        kvdispatch.create_flashmla_kv_indices(case.req_to_token, pool, lens, first, page_size=64, seqlen_offset=1,
                                              seq_lens_out=lengths_out, backend=backend, enable_pdl=True)
        kvdispatch.create_flashmla_kv_indices(case.req_to_token, pool, lengths_out[:batch], second, page_size=64,
                                              fill_value=-1, backend=backend, enable_pdl=True)

    graph = bench.capture(step, 1)
    rows = case.req_to_token.shape[0]
    for replay in range(30):
        staged_pool.copy_(torch.randint(0, rows, (batch,), generator=g, dtype=torch.int32))
        staged_lens.copy_(torch.randint(0, 8 * 64, (batch,), generator=g, dtype=torch.int32))
        table, expected = case.req_to_token.cpu(), {}
        expected["first"], expected["second"], expected["lengths"] = first.cpu(), second.cpu(), lengths_out.cpu()
        ops.page_table.reference(table, staged_pool.cpu(), staged_lens.cpu(), expected["first"], 64, None, 1,
                                   expected["lengths"])
        ops.page_table.reference(table, staged_pool.cpu(), expected["lengths"][:batch], expected["second"], 64,
                                   fill_value=-1)
        graph.replay()
        torch.cuda.synchronize()
        for name, got in (("first", first), ("second", second), ("lengths", lengths_out)):
            assert torch.equal(got.cpu(), expected[name]), f"{backend} replay {replay}: {name}"
