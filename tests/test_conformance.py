"""Every declared op (``kvdispatch.dispatch.OPS``) through every backend under test, against its reference.

One harness for every op, on the cases of ``tests/opcases.py`` (fresh random arguments per seed and knobs, bad data
among them), outputs views in poisoned allocations, on every backend under test and, where the host build of the
CUDA source runs, on its build specialised for each call as CuPy compiles it:

1. the result equals the reference's exactly, on every element of each allocation: what the reference leaves
   untouched (rows past the batch, columns past a row's entries, the guards around the view) is still the poison,
   and the inputs are unchanged;
2. the same on hostile data (the int32/int64 extremes in the index vectors, the lookups and the table);
3. a wrong dtype, rank or device of each tensor argument raises ``TypeError``/``ValueError`` naming it before
   anything is written, as does ``enable_pdl=0``;
4. ``torch.compile(fullgraph=True, backend="aot_eager")`` of a function calling the public op (which traces
   ``torch.ops.kvdispatch.<name>``) gives the eager result, and ``torch.library.opcheck`` passes on the custom op
   (the torch backend on CPU tensors);
5. on a GPU, one call captured in a CUDA graph and replayed on new data copied into the same buffers (valid and
   hostile in turn) equals the reference each time, with and without PDL; after warm-up an eager call of a GPU
   backend allocates no device memory.

An op declared without a case builder fails ``test_every_op_has_a_case_builder`` (and every parametrized test of
it): nothing is skipped silently. The default run keeps a representative slice of the seeds and knobs per op and
backend; the rest is marked ``exhaustive``.
"""

from __future__ import annotations

import re

import pytest
import torch

from conftest import BACKENDS, DEVICE, HAS_GPU, through
from kvcases import POISON, assert_same
from kernels_cupy import build as cupy_build
from kvdispatch import dispatch
from opcases import BUILDERS, Knobs, build, expected, refill

OP_KEYS = list(dispatch.OPS)
# Page sizes: powers of two (shifts) and 7 and 96 (divisions); a batch of 0.
KNOBS = (Knobs(5, 16, 3, False), Knobs(5, 16, 3, True), Knobs(1, 1, 6, True), Knobs(7, 7, 2, True),
         Knobs(3, 64, 2, False), Knobs(2, 96, 2, True), Knobs(0, 4, 2, True))
SEEDS = (1, 2)
COMPILE_KNOBS = (Knobs(4, 16, 2, True), Knobs(3, 4, 2, False))
# A wrong dtype, rank and device of a tensor argument: the error each must raise.
WRONG = (("dtype", TypeError, lambda t: t.to(torch.int16)),
         ("rank", ValueError, lambda t: t.unsqueeze(0)),
         ("device", ValueError, lambda t: t.to("meta")))


# The host build of the CUDA source runs twice: generic (flags at run time) and specialised (as CuPy compiles it).
BUILDS = BACKENDS + (["cupy-host-specialised"] if "cupy-host" in BACKENDS else [])


def call(case, backend, **options):
    """The public op of ``case`` on ``backend`` (``cupy-host``: the host build of the CUDA source;
    ``cupy-host-specialised``: its build for the call's specialisation)."""
    positional, keyword = case.split()
    if backend == "cupy-host-specialised":
        import cuda_host

        return getattr(cuda_host, case.op.name)(*positional, **keyword, specialised=True, **options)
    return through(backend, case.op.name, *positional, **keyword, **options)


def check_against_the_reference(case, backend):
    """``case`` through ``backend`` into freshly poisoned outputs: every allocation as the reference leaves it,
    the poison wherever the reference writes nothing, the inputs as they were."""
    case.poison()
    want = expected(case)
    inputs = {name: tensor.clone() for name, tensor in case.inputs().items()}
    result = call(case, backend)
    assert result is case.arguments[case.op.outputs[0]], "the op returns its first output"
    for name, allocation in case.allocations.items():
        reference = want[name]
        assert (reference[~case.inside(name)] == POISON).all(), f"the reference wrote outside {name}"
        assert_same(allocation, reference.cpu(), f"{case.key} {backend} {name}")
        assert (allocation[reference == POISON] == POISON).all(), f"{backend} wrote where the reference does not"
    for name, before in inputs.items():
        assert torch.equal(case.arguments[name], before), f"{backend} changed the input {name}"


def test_every_op_has_a_case_builder():
    assert sorted(BUILDERS) == sorted(OP_KEYS), "each declared op needs its case builder in tests/opcases.py"


@pytest.mark.representative("key")
@pytest.mark.parametrize("backend", BUILDS)
@pytest.mark.parametrize("key", OP_KEYS)
@pytest.mark.parametrize("knobs", KNOBS, ids=str)
@pytest.mark.parametrize("seed", SEEDS)
def test_matches_the_reference(key, backend, knobs, seed):
    check_against_the_reference(build(key, seed, knobs, device=DEVICE), backend)


@pytest.mark.representative("key")
@pytest.mark.parametrize("backend", BUILDS)
@pytest.mark.parametrize("key", OP_KEYS)
@pytest.mark.parametrize("knobs", KNOBS[:4], ids=str)
@pytest.mark.parametrize("seed", SEEDS)
def test_hostile_data_matches_the_reference(key, backend, knobs, seed):
    check_against_the_reference(build(key, seed, knobs, device=DEVICE, hostile=True), backend)


# For the CUDA source's builds, a batch of more than two passes of the largest program's threads over the earlier
# rows (its block sums: a row's offset in a packed output, a running sum), and not a whole number of them; for
# the other backends, whose sums take a vector of rows at a time, one of 37 rows (the interpreter's time).
MAX_THREADS = int(re.search(r"constexpr int kv_max_threads = (\d+);", cupy_build.source()).group(1))
LONG_BATCH = 2 * MAX_THREADS + 5


@pytest.mark.representative("key")
@pytest.mark.parametrize("backend", BUILDS)
@pytest.mark.parametrize("key", OP_KEYS)
@pytest.mark.parametrize("options", (False, True), ids=("plain", "options"))
@pytest.mark.parametrize("hostile", (False, True), ids=("valid", "hostile"))
def test_long_batches_match_the_reference(key, backend, options, hostile):
    """Every row's offset or running sum over all the rows before it."""
    batch = LONG_BATCH if backend.startswith("cupy") else 37
    check_against_the_reference(build(key, 7, Knobs(batch, 4, 2, options), device=DEVICE, hostile=hostile), backend)


def names(message: str, argument: str) -> bool:
    """Whether ``message`` names ``argument`` as a word of its own (``seq_lens`` is not in ``local_seq_lens``)."""
    return re.search(rf"(?<![\w.]){re.escape(argument)}(?!\w)", message) is not None


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("key", OP_KEYS)
def test_bad_arguments_are_refused_naming_them(key, backend):
    """For each tensor argument (the optional ones given), a wrong dtype, rank and device: the error naming it,
    raised before anything is written (``req_to_token`` sets the device: on another one, the error names it as
    the device the other tensors are not on); ``enable_pdl=0`` (not a bool) too."""
    case = build(key, 3, Knobs(4, 16, 2, True), device=DEVICE)
    case.poison()
    for name in case.tensor_parameters():
        for wrong, error, change in WRONG:
            arguments = dict(case.arguments, **{name: change(case.arguments[name])})
            positional, keyword = case.split(arguments)
            with pytest.raises(error) as raised:
                through(backend, case.op.name, *positional, **keyword)
            assert names(str(raised.value), name), f"{key}: a wrong {wrong} of {name} gave {raised.value!r}"
            for output, allocation in case.allocations.items():
                assert (allocation == POISON).all(), f"{key}: a wrong {wrong} of {name} wrote into {output}"
    if backend != "cupy-host":  # the host build takes no enable_pdl
        with pytest.raises(TypeError, match="enable_pdl"):
            call(case, backend, enable_pdl=0)
        assert all((allocation == POISON).all() for allocation in case.allocations.values())


@pytest.fixture
def fresh_dynamo():
    import torch._dynamo

    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.representative("key")
@pytest.mark.parametrize("backend", ["torch"])
@pytest.mark.parametrize("key", OP_KEYS)
@pytest.mark.parametrize("knobs", COMPILE_KNOBS, ids=str)
@pytest.mark.usefixtures("fresh_dynamo")
def test_torch_compile_gives_the_eager_result(key, backend, knobs):
    """One graph (fullgraph, aot_eager) holding the custom op, writing what the eager call writes."""
    import torch._dynamo.testing

    compiled_case, eager_case = (build(key, 4, knobs) for _ in range(2))
    op = compiled_case.op
    tensors = {name: value for name, value in compiled_case.arguments.items() if isinstance(value, torch.Tensor)}
    constants = {name: value for name, value in compiled_case.arguments.items() if name not in tensors}

    def step(**tensors):
        op.public(**tensors, **constants, backend=backend)

    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    torch.compile(step, backend=counter, fullgraph=True)(**tensors)
    op.public(**eager_case.arguments, backend=backend)
    assert counter.frame_count == 1
    targets = [str(node.target) for graph in counter.graphs for node in graph.graph.nodes]  # Dynamo's graph
    assert any(f"kvdispatch.{op.name}" in target for target in targets), targets
    for name, allocation in compiled_case.allocations.items():
        assert_same(allocation, eager_case.allocations[name], f"{key} compiled {name}")


@pytest.mark.representative("key")
@pytest.mark.parametrize("backend", ["torch"])
@pytest.mark.parametrize("key", OP_KEYS)
@pytest.mark.parametrize("knobs", COMPILE_KNOBS, ids=str)
def test_opcheck(key, backend, knobs):
    case = build(key, 5, knobs)
    positional, keyword = case.split()
    torch.library.opcheck(getattr(torch.ops.kvdispatch, case.op.name).default, tuple(positional),
                          dict(keyword, backend=backend))


GRAPH_BACKENDS = [b for b in BACKENDS if b != "cupy-host"]


GRAPH_SEED, GRAPH_KNOBS, GRAPH_STEPS = 6, Knobs(6, 16, 3, True), 20


def graph_data(key, step, device="cpu"):
    """The new data of replay ``step`` (valid, then hostile, in turn) in the captured case's layout."""
    return build(key, GRAPH_SEED, GRAPH_KNOBS, device=device, hostile=step % 2 == 0, data_seed=100 + step)


@pytest.mark.parametrize("key", OP_KEYS)
def test_replay_data_fits_the_captured_buffers(key):
    """Every replay's new data has the captured case's shapes, so ``refill`` can copy it in place."""
    case = build(key, GRAPH_SEED, GRAPH_KNOBS)
    for step in range(1, GRAPH_STEPS + 1):
        refill(case, graph_data(key, step))


@pytest.mark.representative("key")
@pytest.mark.parametrize("backend", BUILDS)
@pytest.mark.parametrize("key", OP_KEYS)
@pytest.mark.parametrize("step", range(1, GRAPH_STEPS + 1))
def test_replay_data_matches_the_reference(key, backend, step):
    """Each replay's data, called afresh, gives the reference's result: a replay's expectation is well defined
    (no rows overlapping, whose entries would be any covering row's)."""
    check_against_the_reference(graph_data(key, step, DEVICE), backend)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("backend", GRAPH_BACKENDS)
@pytest.mark.parametrize("key", OP_KEYS)
@pytest.mark.parametrize("enable_pdl", [None, True])
def test_cuda_graph_replays_on_new_data(key, backend, enable_pdl):
    """Capture one call, then replay it on new data (valid, then hostile, in turn) copied into the same buffers."""
    from kvdispatch.bench import core as bench

    case = build(key, GRAPH_SEED, GRAPH_KNOBS, device=DEVICE)

    def run():
        call(case, backend, enable_pdl=enable_pdl)

    run()  # warm-up: compiles, selects, plans
    torch.cuda.synchronize()
    if backend != "torch":
        before = torch.cuda.memory_allocated()
        run()
        torch.cuda.synchronize()
        assert torch.cuda.memory_allocated() == before, f"{backend}: an eager call kept device memory"
    graph = bench.capture(run, 1)
    for step in range(1, GRAPH_STEPS + 1):
        refill(case, graph_data(key, step, DEVICE))
        want = expected(case)
        graph.replay()
        torch.cuda.synchronize()
        for name, allocation in case.allocations.items():
            assert_same(allocation, want[name].cpu(), f"{key} {backend} replay {step}: {name}")
