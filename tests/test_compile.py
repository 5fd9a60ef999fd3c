"""The public builders under ``torch.compile``: custom ops, one graph, the eager results, CUDA-graph replay.

* ``torch.ops.kvdispatch.<public name>`` exists after ``import kvdispatch`` (without importing Dynamo), for every
  declared op with the public signature as its schema (its outputs mutated), and the page table's and token CSR's
  pass ``torch.library.opcheck`` on every backend here (every op's, on the torch backend:
  tests/test_conformance.py).
* A decode-metadata step (``seq_lens + 1``, the page table with ``seq_lens_out`` and ``fill_value``,
  ``kv_indptr`` by a cumulative sum of what the page table wrote, the token CSR) compiles with
  ``fullgraph=True`` into one graph under the ``eager``, ``aot_eager`` and ``inductor`` compilers, equals
  the eager step, and reruns on new data in the same buffers without tracing again.
* The backend request is fixed at trace time: ``kvdispatch.reset()`` (after changing
  ``KVDISPATCH_BACKEND``) or another ``backend=`` traces again, and the new backend serves.
* On a GPU, ``mode="reduce-overhead"`` replays Inductor's CUDA graph 1000 times on changing inputs (the
  buffers and hostile values of tests/test_graphs.py) without running a kernel's Python once.

``kernels_cupy/host.py`` (backend ``cupy-host`` in other tests) is a host build of the CUDA source that tests
call directly; it is no dispatch backend, so no op's ``backend`` can name it, and it is not run here.
"""

from __future__ import annotations

import inspect
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch._dynamo.testing

import kvdispatch
from conftest import BACKENDS, DEVICE, HAS_GPU
from kvdispatch import dispatch, op
from kvcases import POISON, loop_page_table, make_case
from test_graphs import _buffers, _new_step

ROOT = Path(__file__).resolve().parents[1]
COMPILE_BACKENDS = [b for b in BACKENDS if b != "cupy-host"]
OPS = {op.name: op for op in dispatch.OPS.values()}  # every declared op, by its public name
HAS_CXX = HAS_GPU or any(shutil.which(name) for name in (os.environ.get("CXX") or "g++", "c++", "clang++"))
COMPILERS = ["eager", "aot_eager",
             pytest.param("inductor", marks=pytest.mark.skipif(not HAS_CXX, reason="Inductor on CPU needs C++"))]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Every test traces afresh: no cached graph, and no recompile limit reached by earlier tests."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _request(backend):
    """``backend=`` for a call: None where ``KVDISPATCH_BACKEND`` already names it, as an engine's call would."""
    return None if backend == os.environ.get("KVDISPATCH_BACKEND") else backend


def decode_metadata(req_to_token, req_pool_indices, seq_lens, kv_start_idx, block_table, seq_lens_out, kv_indices,
                    *, page_size, fill_value, backend):
    """One decode step's attention metadata, in place; returns ``kv_indptr`` (int32 ``[B + 1]``).

    ``kv_indptr`` sums what the page table wrote into ``seq_lens_out`` (so the token CSR must run after it),
    clamped at 0 so that rows never overlap, whatever the lengths.
    """
    next_lens = seq_lens + 1
    kvdispatch.create_flashmla_kv_indices(req_to_token, req_pool_indices, next_lens, block_table, page_size=page_size,
                                          kv_start_idx=kv_start_idx, seq_lens_out=seq_lens_out,
                                          fill_value=fill_value, backend=backend)
    batch = req_pool_indices.shape[0]
    kv_indptr = torch.zeros(batch + 1, dtype=torch.int32, device=seq_lens.device)
    kv_indptr[1:] = torch.cumsum(seq_lens_out[:batch].clamp(min=0), 0)
    kvdispatch.create_flashinfer_kv_indices(req_to_token, req_pool_indices, next_lens, kv_indptr, kv_indices,
                                            kv_start_idx=kv_start_idx, backend=backend)
    return kv_indptr


def _assert_equal(name, got, expected):
    assert torch.equal(got.cpu(), expected.cpu()), (
        f"{name}: first difference at {(got.cpu() != expected.cpu()).nonzero()[0].tolist()}")


# ---------------------------------------------------------------- registration


def test_import_registers_the_ops_without_importing_dynamo():
    script = ("import sys, torch\n"
              "before = set(sys.modules)\n"
              "import kvdispatch\n"
              "print(sorted(m for m in set(sys.modules) - before if m.startswith('torch._dynamo')))\n"
              "print(torch.ops.kvdispatch.create_flashmla_kv_indices.default.name(),\n"
              "      torch.ops.kvdispatch.create_flashinfer_kv_indices.default.name())\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTORCH_NVML_BASED_CUDA_CHECK="1")
    result = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    dynamo_modules, names = result.stdout.splitlines()
    assert dynamo_modules == "[]", f"import kvdispatch imported {dynamo_modules}"
    assert names == "kvdispatch::create_flashmla_kv_indices kvdispatch::create_flashinfer_kv_indices"


@pytest.mark.parametrize("name", OPS)
def test_schema_matches_the_public_signature(name):
    """Same names, order, keyword-only options and defaults; ``backend`` is a string there ("auto" for None),
    every output is declared mutated and nothing is returned."""
    schema = getattr(torch.ops.kvdispatch, name).default._schema
    parameters = inspect.signature(OPS[name].public).parameters.values()
    assert [a.name for a in schema.arguments] == [p.name for p in parameters]
    assert [a.kwarg_only for a in schema.arguments] == [p.kind is p.KEYWORD_ONLY for p in parameters]
    for argument, parameter in zip(schema.arguments, parameters):
        if parameter.default is not inspect.Parameter.empty:
            assert argument.default_value == (parameter.default if argument.name != "backend" else "auto")
    mutated = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
    assert mutated == set(OPS[name].outputs)
    assert list(schema.returns) == []


def test_constant_result_marker_is_what_torch_sets():
    """``op.requested_backend`` is marked the way ``torch.compiler.assume_constant_result`` marks a function
    (set by hand to keep Dynamo's import out of ``import kvdispatch``)."""
    marked = torch.compiler.assume_constant_result(lambda: None)
    assert vars(marked) and vars(marked).items() <= vars(op.requested_backend).items()


@pytest.mark.parametrize("backend", COMPILE_BACKENDS)
@pytest.mark.parametrize("with_options", [False, True])
def test_opcheck(backend, with_options):
    case = make_case(5, 16, max_pages=4, device=DEVICE, with_start=with_options,
                     index_dtype=torch.int64 if with_options else torch.int32)
    options = dict(kv_start_idx=case.kv_start_idx, seqlen_offset=2, seq_lens_out=case.seq_lens_out(),
                   fill_value=-1, round_toward_zero=True) if with_options else {}
    torch.library.opcheck(torch.ops.kvdispatch.create_flashmla_kv_indices.default,
                          (case.req_to_token, case.req_pool_indices, case.seq_lens, case.page_table_out()),
                          dict(page_size=case.page_size, backend=backend, **options))
    indptr, out = case.csr()
    torch.library.opcheck(torch.ops.kvdispatch.create_flashinfer_kv_indices.default,
                          (case.req_to_token, case.req_pool_indices, case.seq_lens, indptr, out),
                          dict(kv_start_idx=case.kv_start_idx, backend=backend))


class _HostBuildAsCupy(dispatch.Backend):
    """The CuPy backend served by the host build of its CUDA source (``tests/cuda_host.py``), on CPU tensors."""

    def reasons_if_unsupported(self, info):
        return []


@pytest.fixture
def host_build_as_cupy(monkeypatch):
    """``backend="cupy"`` runs the CUDA source's host build: the custom ops over that source, without a GPU."""
    if HAS_GPU:
        pytest.skip("on a GPU the cupy backend itself runs")
    monkeypatch.setitem(dispatch.REGISTRY, "cupy", _HostBuildAsCupy("cupy", "cuda_host"))
    kvdispatch.reset()
    yield "cupy"
    kvdispatch.reset()


@pytest.mark.parametrize("with_options", [False, True])
def test_opcheck_over_the_host_build(host_build_as_cupy, with_options):
    test_opcheck(host_build_as_cupy, with_options)
    _, function = dispatch.selector.resolve(DEVICE, "page_table", "cupy")
    assert function.__module__ == "cuda_host"


@pytest.mark.parametrize("compiler", ["eager", "aot_eager"])
def test_decode_metadata_over_the_host_build(host_build_as_cupy, compiler):
    test_decode_metadata_is_one_graph_equal_to_eager(host_build_as_cupy, compiler)


# ---------------------------------------------------------------- one graph, eager results


def _decode_case(seed):
    g = torch.Generator().manual_seed(seed)
    case = make_case(6, 16, max_pages=4, device=DEVICE, with_start=True, generator=g)
    total = case.batch * (case.req_to_token.shape[1] + 1) + 5
    outputs = (case.page_table_out(), case.seq_lens_out(),
               torch.full((total,), POISON, dtype=torch.int32, device=DEVICE))
    return case, outputs, g


def _new_values(case, g):
    """New lengths and pool rows, written into the case's own tensors."""
    rows = case.req_to_token.shape[0]
    case.seq_lens.copy_(torch.randint(-2, case.width * case.page_size + 2, (case.batch,), generator=g))
    case.req_pool_indices.copy_(torch.randperm(rows, generator=g)[: case.batch])


@pytest.mark.parametrize("backend", COMPILE_BACKENDS)
@pytest.mark.parametrize("compiler", COMPILERS)
def test_decode_metadata_is_one_graph_equal_to_eager(backend, compiler):
    case, outputs, g = _decode_case(1000 + len(backend))
    inputs = (case.req_to_token, case.req_pool_indices, case.seq_lens, case.kv_start_idx)
    options = dict(page_size=case.page_size, fill_value=-1, backend=_request(backend))
    counter = torch._dynamo.testing.CompileCounterWithBackend(compiler)
    compiled = torch.compile(decode_metadata, backend=counter, fullgraph=True)
    for call in range(3):  # then twice more on new values in the same buffers
        expected_outputs = [t.clone() for t in outputs]
        expected_indptr = decode_metadata(*inputs, *expected_outputs, **options)
        indptr = compiled(*inputs, *outputs, **options)
        for name, got, expected in zip(("kv_indptr", "block_table", "seq_lens_out", "kv_indices"),
                                       (indptr, *outputs), (expected_indptr, *expected_outputs)):
            _assert_equal(f"{backend}/{compiler} call {call}: {name}", got, expected)
        _new_values(case, g)
    assert counter.frame_count == 1, "traced more than once, or fell back to eager"


def test_new_option_values_and_dynamic_batches():
    """A new ``seqlen_offset`` / ``fill_value`` traces again (they are ``int`` in the schema); batch sizes
    that change become dynamic shapes, which the fake kernel's checks take symbolically."""

    def step(req_to_token, req_pool_indices, seq_lens, out, seq_lens_out, offset, fill):
        return kvdispatch.create_flashmla_kv_indices(req_to_token, req_pool_indices, seq_lens, out, page_size=16,
                                                     seqlen_offset=offset, seq_lens_out=seq_lens_out,
                                                     fill_value=fill, backend="torch")

    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(step, backend=counter, fullgraph=True)
    for offset in (0, 3):
        for batch in (3, 5, 7):
            case = make_case(batch, 16, max_pages=3, device=DEVICE, seqlen_offset=offset, fill_value=-1 - offset)
            out, seq_lens_out = case.page_table_out(), case.seq_lens_out()
            expected_seq = seq_lens_out.cpu().clone()
            expected = loop_page_table(case, out, expected_seq)
            compiled(case.req_to_token, case.req_pool_indices, case.seq_lens, out, seq_lens_out, offset,
                     case.fill_value)
            _assert_equal(f"offset {offset}, batch {batch}", out, expected)
            _assert_equal(f"offset {offset}, batch {batch}: seq_lens_out", seq_lens_out, expected_seq)
    # 6 calls; 4 traces on torch 2.13, 5 on torch 2.11 (the H200's), where the changed int options trace again
    assert counter.frame_count < 6, "traced for every batch size"


@pytest.mark.parametrize("backend", COMPILE_BACKENDS)
def test_rounding_toward_zero_reaches_the_op(backend):
    """``round_toward_zero`` is traced into the op (a bool in the schema) and divides negative slots as eager."""

    def step(req_to_token, req_pool_indices, seq_lens, out):
        return kvdispatch.create_flashmla_kv_indices(req_to_token, req_pool_indices, seq_lens, out, page_size=16,
                                                     round_toward_zero=True, backend=_request(backend))

    case = make_case(4, 16, max_pages=3, device=DEVICE)
    case.req_to_token.neg_()
    out = case.page_table_out()
    expected = loop_page_table(case, out, round_toward_zero=True)
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    torch.compile(step, backend=counter, fullgraph=True)(case.req_to_token, case.req_pool_indices, case.seq_lens, out)
    _assert_equal(backend, out, expected)
    assert counter.frame_count == 1


@pytest.mark.parametrize("backend", COMPILE_BACKENDS)
def test_enable_pdl_reaches_the_op(backend):
    """``enable_pdl`` is traced into the op (a ``bool?`` in the schema) and the compiled call equals eager, with
    programmatic dependent launch where the device supports it."""

    def step(req_to_token, req_pool_indices, seq_lens, out):
        return kvdispatch.create_flashmla_kv_indices(req_to_token, req_pool_indices, seq_lens, out, page_size=16,
                                                     backend=_request(backend), enable_pdl=True)

    case = make_case(4, 16, max_pages=3, device=DEVICE)
    out = case.page_table_out()
    expected = loop_page_table(case, out)
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    torch.compile(step, backend=counter, fullgraph=True)(case.req_to_token, case.req_pool_indices, case.seq_lens, out)
    _assert_equal(backend, out, expected)
    assert counter.frame_count == 1
    indptr, flat = case.csr()
    torch.library.opcheck(torch.ops.kvdispatch.create_flashinfer_kv_indices.default,
                          (case.req_to_token, case.req_pool_indices, case.seq_lens, indptr, flat),
                          dict(backend=backend, enable_pdl=True))


def test_graph_holds_one_custom_op_per_call():
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    case, outputs, _ = _decode_case(7)
    torch.compile(decode_metadata, backend=record, fullgraph=True)(
        case.req_to_token, case.req_pool_indices, case.seq_lens, case.kv_start_idx, *outputs,
        page_size=case.page_size, fill_value=None, backend="torch")
    (graph,) = graphs
    targets = [str(node.target) for node in graph.graph.nodes if node.op == "call_function"]
    assert [t for t in targets if "kvdispatch" in t] == [
        "kvdispatch.create_flashmla_kv_indices", "kvdispatch.create_flashinfer_kv_indices"]


# ---------------------------------------------------------------- the backend request


def _other_backend():
    other = next((b for b in ("triton", "cupy") if b in kvdispatch.available_backends(DEVICE)), None)
    if other is None:
        pytest.skip(f"only the torch backend serves {DEVICE}")
    return other


def _page_table_step(req_to_token, req_pool_indices, seq_lens, out, backend=None):
    return kvdispatch.create_flashmla_kv_indices(req_to_token, req_pool_indices, seq_lens, out, page_size=16,
                                                 backend=backend)


def _served(case, compiled, *backend):
    """Run ``compiled`` once on ``case`` (checked against the loop oracle); the backends that served."""
    out = case.page_table_out()
    expected = loop_page_table(case, out)
    assert compiled(case.req_to_token, case.req_pool_indices, case.seq_lens, out, *backend) is out
    _assert_equal("page table", out, expected)
    return {name for (device, op, _), (name, _) in dispatch.selector._chosen.items() if op == "page_table"}


def test_reset_traces_again_for_a_changed_backend_variable(monkeypatch):
    other = _other_backend()
    case = make_case(4, 16, max_pages=3, device=DEVICE)
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(_page_table_step, backend=counter, fullgraph=True)
    monkeypatch.setenv("KVDISPATCH_BACKEND", "torch")
    kvdispatch.reset()
    assert _served(case, compiled) == {"torch"} and counter.frame_count == 1

    monkeypatch.setenv("KVDISPATCH_BACKEND", other)  # as in eager mode, no effect before a reset
    assert _served(case, compiled) == {"torch"} and counter.frame_count == 1
    kvdispatch.reset()
    assert _served(case, compiled) == {other} and counter.frame_count == 2
    assert _served(case, compiled) == {other} and counter.frame_count == 2


def test_another_backend_argument_traces_again():
    other = _other_backend()
    case = make_case(4, 16, max_pages=3, device=DEVICE)
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(_page_table_step, backend=counter, fullgraph=True)
    assert _served(case, compiled, "torch") == {"torch"} and counter.frame_count == 1
    assert _served(case, compiled, other) == {"torch", other} and counter.frame_count == 2
    assert _served(case, compiled, "torch") == {"torch", other} and counter.frame_count == 2


def test_bad_arguments_fail_at_trace_time_with_the_eager_message():
    case = make_case(4, 16, max_pages=3, device=DEVICE)
    compiled = torch.compile(_page_table_step, backend="aot_eager", fullgraph=True)
    out = case.page_table_out()
    with pytest.raises(Exception, match="out must have dtype torch.int32, got torch.int64"):
        compiled(case.req_to_token, case.req_pool_indices, case.seq_lens, out.long())
    with pytest.raises(Exception, match="backend.*'fast'"):
        compiled(case.req_to_token, case.req_pool_indices, case.seq_lens, out, "fast")
    assert torch.equal(out.cpu(), case.page_table_out().cpu()), "a failed call wrote"



@pytest.mark.parametrize("entry,op,keyword,value,message", [
    ("public", "page_table", "page_size", True, "page_size must be a Python int, got bool"),
    ("public", "page_table", "enable_pdl", "false", "enable_pdl must be a bool or None, got str"),
    ("torch.ops", "dcp_page_table", "dcp_rank", True, "dcp_rank must be a Python int, got bool"),
    ("torch.ops", "draft_decode", "write_indptr_start", None, "write_indptr_start"),
    ("torch.ops", "mha_page_table", "enable_pdl", 2, "enable_pdl must be a bool or None, got int"),
])
def test_bad_flags_and_counts_fail_at_trace_time(entry, op, keyword, value, message):
    """Under ``torch.compile`` the fake kernels see the caller's object (the schema's ``Scalar``): a bool count
    or a flag of another type fails at trace time, through the public function and the custom op alike."""
    from test_validation import _entry, _op_call  # noqa: PLC0415

    name, tensors, options = _op_call(op)
    function = _entry(entry, name)

    def step(*tensors):
        function(*tensors, **dict(options, **{keyword: value}), backend="torch")
        return tensors[-1]

    before = [t.clone() for t in tensors]
    with pytest.raises(Exception, match=message):
        torch.compile(step, backend="aot_eager", fullgraph=True)(*tensors)
    assert all(torch.equal(a, b) for a, b in zip(before, tensors)), "a failed call wrote"


# ---------------------------------------------------------------- CUDA graphs through Inductor


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("backend", COMPILE_BACKENDS)
def test_reduce_overhead_replays_on_new_data(backend, monkeypatch):
    """Engine buffers marked static, new values written into them before every call: each call must be a
    CUDA-graph replay (no kernel's Python runs) equal to the eager step on the host."""
    from torch._dynamo.utils import counters

    page_size = 16
    device = torch.device("cuda", torch.cuda.current_device())
    buffers, g = _buffers(page_size, device)
    names = ("table", "pool", "lens", "start", "out", "seq_out", "flat")
    for name in names:
        torch._dynamo.mark_static_address(buffers[name])
    kernel_runs = []
    # Count the eager calls that the ops' kernels make on the GPU (the host's reference step runs on the CPU):
    # each ends in a dispatch or the compiled replay entry.
    monkeypatch.setattr(dispatch, "call", _counting(dispatch.call, kernel_runs, on_gpu_only=True))
    if dispatch.fast_replay is not None:
        monkeypatch.setattr(dispatch, "fast_replay", _counting(dispatch.fast_replay, kernel_runs, on_gpu_only=True))
    compiled = torch.compile(decode_metadata, mode="reduce-overhead", fullgraph=True)
    skips_before = counters["inductor"]["cudagraph_skips"]

    host = {name: buffers[name].cpu() for name in ("out", "seq_out", "flat")}
    for step in range(1003):
        if step == 3:  # warm-up, recording and a first replay are done
            kernel_runs.clear()
        _new_step(buffers, g, page_size, step)
        inputs = [buffers["table_cpu"]] + [buffers[name].cpu() for name in ("pool", "lens", "start")]
        expected_indptr = decode_metadata(*inputs, host["out"], host["seq_out"], host["flat"],
                                          page_size=page_size, fill_value=-1, backend="torch")
        torch.compiler.cudagraph_mark_step_begin()
        indptr = compiled(*(buffers[name] for name in names), page_size=page_size, fill_value=-1,
                          backend=_request(backend)).cpu()
        for name, got, expected in (("kv_indptr", indptr, expected_indptr), ("block_table", buffers["out"],
                                    host["out"]), ("seq_lens_out", buffers["seq_out"], host["seq_out"]),
                                    ("kv_indices", buffers["flat"], host["flat"])):
            _assert_equal(f"{backend} step {step}: {name}; lens {buffers['lens'].tolist()}", got, expected)
    assert counters["inductor"]["cudagraph_skips"] == skips_before, "Inductor skipped CUDA graphs"
    assert not kernel_runs, f"{len(kernel_runs)} op calls in 1000 steps ran Python instead of a graph replay"


def _counting(function, calls, on_gpu_only=False):
    def counted(*args, **kwargs):
        if not on_gpu_only or any(getattr(arg, "type", None) == "cuda" or getattr(arg, "is_cuda", False)
                                  for arg in args):
            calls.append(function.__name__)
        return function(*args, **kwargs)

    return counted
