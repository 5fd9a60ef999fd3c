"""The compiled host path of both index builders (``kvdispatch/host_path.c``) with Triton's plans, on CPU.

The extension is built here and pointed at stubs (``host_path_stubs``): a ``cuLaunchKernel`` that records
what it is given, a ``cuCtxGetCurrent`` and a stream query, with CPU tensors as the launch device type
(``tensor_shim("cpu")``, device index offset 1, so CPU is device 0). Each call is compared with what the Python
path would launch (``page_table.plan_key_and_arguments``); every case it must not take returns NotImplemented
without a launch. On a GPU, ``test_triton_launch.py`` runs the real thing.

Most cases are page-table calls, whose checks are the larger set; the token-CSR entry shares the plan
table, the launch and the tensor reads, and has its own packing and hand-back cases below.
"""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch

pytest.importorskip("triton")

from kvdispatch import ops
import kvdispatch  # noqa: E402
from conftest import DEVICE  # noqa: E402
from kernels_triton import launch, native, page_table, token_csr  # noqa: E402
from host_path_stubs import (CONTEXT, FUNCTION, PAGE_TABLE, STREAM_BASE, TOKEN_CSR, Stubs, build,  # noqa: E402
                             check_approvals_follow_the_hooks, install, random_call, random_csr_call, unsigned)
from kvcases import named_overlap, overlapping_pairs, place_in_one_buffer  # noqa: E402
from kvdispatch import _build_cache, _debug, dispatch, host_path  # noqa: E402

PARAMS = len(page_table.POINTERS) + len(page_table.RUNTIME_INTS) + 2  # + Triton's two scratch pointers
CSR_PARAMS = len(token_csr.ORDINARY_PARAMETERS) + 2
TRITON = host_path.LAUNCHERS["triton"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return build(tmp_path_factory)


@pytest.fixture
def stubs(built, monkeypatch):
    """The extension configured with stubs, installed as ``host_path``'s module (approvals start empty)."""
    return install(built, monkeypatch, PARAMS)


def register(call, threads=128, shared=16):
    """Register ``call``'s plan as the Triton launcher would (CPU is device 0 here), on a folded grid (each
    call's batch replaces its first entry); returns that grid."""
    key, _ = page_table.plan_key_and_arguments(*call[:9])
    grid = (0, 7, 3)
    kernel = launch.NativeKernel(FUNCTION, threads, shared, PARAMS, CONTEXT)
    assert native.add_page_table_plan((0,) + key[1:], kernel, grid)
    return grid


def expected_params(call):
    _, args = page_table.plan_key_and_arguments(*call[:9])
    return unsigned(args) + [0, 0]


@pytest.mark.parametrize("seed", range(20))
def test_reads_tensor_metadata_as_python_does(stubs, seed):
    """The C reads (PyTorch's C shim on the TensorImpl) give the dtype, device, sizes, strides and data pointer
    Python gives, and for an int32 or int64 tensor with elements the storage offset and bytes, for views at
    offsets, transposes, broadcasts, empty tensors and a 2**40 stride; a tensor of more than two dimensions, a
    subclass or another device type is refused."""
    generator = torch.Generator().manual_seed(seed)
    rows, cols = (int(v) for v in torch.randint(0, 9, (2,), generator=generator))
    dtype = (torch.int32, torch.int64, torch.float32)[seed % 3]
    base = torch.zeros(rows + 3, cols + 5, dtype=dtype)
    views = [base, base[1:, 2:], base.t(), base[:, 1], base[2:3], torch.zeros(0, dtype=dtype),
             base.as_strided((1, 2), (2**40, 1)), base[:1].expand(4, -1), base[::2, ::3]]
    for view in views:
        read = stubs.module.tensor_metadata(view)
        code = {torch.int32: 1, torch.int64: 2}.get(view.dtype, 0)
        storage = (view.storage_offset(), view.untyped_storage().nbytes()) if code and view.numel() else (None, None)
        assert read == (code, 0, tuple(view.shape), view.stride(), view.data_ptr(), *storage), view.shape
    for refused in (torch.zeros(2, 2, 2, dtype=torch.int32), torch.nn.Parameter(torch.zeros(3), requires_grad=False),
                    torch.zeros(3, device="meta"), 3, None):
        assert stubs.module.tensor_metadata(refused) is None


@pytest.mark.parametrize("seed", range(40))
def test_packs_what_the_python_path_launches(stubs, seed):
    call = random_call(seed)
    stubs.module.approve(PAGE_TABLE, 0, None, TRITON)
    grid = register(call)
    before = call[3].clone()
    assert stubs.module.page_table(*call) is call[3]
    (launched,) = stubs.launches
    assert launched["params"] == expected_params(call)
    assert launched["grid"] == (call[1].shape[0],) + grid[1:]
    assert launched["block"] == (128, 1, 1) and launched["shared"] == 16
    assert launched["function"] == FUNCTION and launched["stream"] == STREAM_BASE + 0 and not launched["extra"]
    assert torch.equal(call[3], before)  # the stub launched nothing: C itself writes no tensor
    assert stubs.module.launch_count() == 1


def _edge_call(kind, page_size):
    """A valid call whose sizes or strides sit at the 2**31 edge of ``page_table.packed_words`` (no memory
    behind them: one output row, or one expanded table row)."""
    call = random_call(7, page_size=page_size, with_start=False, options="")
    table, pool, lens, out = call[:4]
    if kind.startswith("out stride"):
        stride = page_table.WIDE - (1 if kind.endswith("below") else 0)
        store = torch.zeros(out.shape[1], dtype=torch.int32)
        call[3] = store.as_strided((1, out.shape[1]), (stride, 1))
        call[1], call[2] = pool[:1], lens[:1]
    else:  # table rows
        rows = page_table.WIDE - (1 if kind.endswith("below") else 0)
        call[0] = table[:1].expand(rows, table.shape[1])
    return call


@pytest.mark.parametrize("kind", ("out stride 2**31", "out stride below", "table rows 2**31", "table rows below"))
@pytest.mark.parametrize("page_size", (1, 64))
def test_packs_the_edges_of_the_32_bit_fields_as_python_does(stubs, kind, page_size):
    """At 2**31 - 1 the values go into the packed words, at 2**31 the call is wide indexing: C decides and
    packs as plan_key_and_arguments does (a different key would not find the registered plan)."""
    call = _edge_call(kind, page_size)
    key, _ = page_table.plan_key_and_arguments(*call[:9])
    assert key[10] == ("below" not in kind)  # wide indexing
    stubs.module.approve(PAGE_TABLE, 0, None, TRITON)
    register(call)
    assert stubs.module.page_table(*call) is call[3]
    (launched,) = stubs.launches
    assert launched["params"] == expected_params(call)


def _mutations():
    """(name, change to a valid call) pairs the C path must hand back to Python."""
    def at(i, value):
        return lambda c: c.__setitem__(i, value(c) if callable(value) else value)

    return {
        "table int64": at(0, lambda c: c[0].long()),
        "table last dim strided": at(0, lambda c: c[0].repeat(1, 2)[:, ::2]),
        "table 1-D": at(0, lambda c: c[0][0]),
        "table a subclass": at(0, lambda c: torch.nn.Parameter(c[0], requires_grad=False)),
        "table not a tensor": at(0, lambda c: c[0].tolist()),
        "pool float": at(1, lambda c: c[1].float()),
        "pool 2-D": at(1, lambda c: c[1][:, None]),
        "lens too long": at(2, lambda c: torch.cat([c[2], c[2][:1]])),
        "lens int16": at(2, lambda c: c[2].short()),
        "out int64": at(3, lambda c: c[3].long()),
        "out too few rows": at(3, lambda c: c[3][: c[1].shape[0] - 1]),
        "out last dim strided": at(3, lambda c: c[3].repeat(1, 2)[:, ::2]),
        "out other width": at(3, lambda c: torch.zeros(c[3].shape[0], c[3].shape[1] + 1, dtype=torch.int32)),
        "page size 0": at(4, 0),
        "page size 4097": at(4, 4097),
        "page size bool": at(4, True),
        "page size float": at(4, 64.0),
        "other page size": at(4, lambda c: 32 if c[4] != 32 else 16),
        "start length": at(5, lambda c: torch.zeros(c[1].shape[0] + 1, dtype=torch.int32)),
        "start given (plan without)": at(5, lambda c: torch.zeros(c[1].shape[0], dtype=torch.int32)),
        "offset past int32": at(6, 2**31),
        "offset huge": at(6, 2**70),
        "seq_lens_out int64": at(7, lambda c: torch.zeros(c[1].shape[0], dtype=torch.int64)),
        "seq_lens_out short": at(7, lambda c: torch.zeros(c[1].shape[0] - 1, dtype=torch.int32)),
        "fill past int32": at(8, -(2**31) - 1),
        "fill float": at(8, 1.5),
        "backend torch": at(9, "torch"),
        "backend cupy": at(9, "cupy"),
        "backend upper case": at(9, "TRITON"),
        "backend auto (not approved)": at(9, "auto"),
        "meta tensor": at(0, lambda c: c[0].to("meta")),
        "round toward zero": at(10, True),
        "round toward zero as int": at(10, 0),
        "round toward zero missing": lambda c: c.pop(),
    }


@pytest.mark.parametrize("name", list(_mutations()))
def test_hands_back_what_it_must_not_take(stubs, name):
    call = random_call(100, page_size=64, with_start=False, options="")
    stubs.module.approve(PAGE_TABLE, 0, None, TRITON)
    register(call)
    _mutations()[name](call)
    assert stubs.module.page_table(*call) is NotImplemented
    assert stubs.launches == []


@pytest.mark.parametrize("option", ("round_toward_zero", "pdl"))
def test_no_plan_for_rounding_toward_zero_or_pdl(stubs, option):
    """A key with round_toward_zero or programmatic dependent launch gets no C plan: the C path hands every
    such call back (the API does not even offer it a PDL call)."""
    call = random_call(101, page_size=64, with_start=False, options="")
    key, _ = page_table.plan_key_and_arguments(*call[:9], **{option: True})
    kernel = launch.NativeKernel(FUNCTION, 128, 16, PARAMS, CONTEXT)
    assert not native.add_page_table_plan((0,) + key[1:], kernel, (0, 7, 3))


# The tensors of each op's public call (argument position: name) and which of them are written.
PAGE_TABLE_TENSORS = {0: "req_to_token", 1: "req_pool_indices", 2: "seq_lens", 3: "out", 5: "kv_start_idx",
                      7: "seq_lens_out"}
TOKEN_CSR_TENSORS = {0: "req_to_token", 1: "req_pool_indices", 2: "seq_lens", 3: "kv_indptr", 4: "out",
                     5: "kv_start_idx"}
OUTPUTS = ("out", "seq_lens_out")


def _share_memory(call, tensors, seed):
    """``call`` with its tensors placed at random offsets of one buffer (some overlapping); the overlapping
    (output, other) name pairs."""
    g = torch.Generator().manual_seed(seed)
    for i, t in zip(tensors, place_in_one_buffer([call[i] for i in tensors], g)[0]):
        call[i] = t
    named = {name: call[i] for i, name in tensors.items()}
    return overlapping_pairs({k: v for k, v in named.items() if k in OUTPUTS},
                             {k: v for k, v in named.items() if k not in OUTPUTS})


def _python_refusal(check, args):
    """The ValueError's message the Python validator raises for ``args``, or None when it accepts them."""
    try:
        check(*args)
    except ValueError as error:
        return str(error)
    return None


def test_page_table_overlaps_are_decided_as_python_decides(stubs):
    """Random calls whose tensors share one buffer (and some with rows of out sharing memory): C takes
    exactly the calls the Python validator accepts; the rest it hands back, for Python to refuse."""
    stubs.module.approve(PAGE_TABLE, 0, None, TRITON)
    outcomes = set()
    for seed in range(150):
        call = random_call(seed)
        pairs = _share_memory(call, PAGE_TABLE_TENSORS, seed)
        out = call[3]
        if seed % 7 == 0 and out.shape[1] > 0:
            call[3] = out = out.as_strided(out.shape, (seed % out.shape[1], 1))
        rows_overlap = out.shape[0] > 1 and out.stride(0) < out.shape[1]
        register(call)
        stubs.launches.clear()
        taken = stubs.module.page_table(*call) is out
        refusal = _python_refusal(ops.page_table.check_arguments, call[:9])
        assert taken == (refusal is None) == (not pairs and not rows_overlap), (seed, refusal, pairs)
        if taken:
            assert [launched["params"] for launched in stubs.launches] == [expected_params(call)]
        elif rows_overlap:
            assert refusal.startswith("rows of out share memory")
        else:
            assert named_overlap(refusal) in pairs, (seed, refusal, pairs)
        outcomes.add((taken, rows_overlap))
    assert outcomes == {(True, False), (False, False), (False, True)}


def test_token_csr_overlaps_are_decided_as_python_decides(stubs):
    stubs.module.approve(TOKEN_CSR, 0, None, TRITON)
    outcomes = set()
    for seed in range(100):
        call = random_csr_call(seed)
        pairs = _share_memory(call, TOKEN_CSR_TENSORS, seed)
        register_csr(stubs, call)
        stubs.launches.clear()
        taken = stubs.module.token_csr(*call) is call[4]
        refusal = _python_refusal(ops.token_csr.check_arguments, call[:6])
        assert taken == (refusal is None) == (not pairs), (seed, refusal, pairs)
        if refusal is not None:
            assert named_overlap(refusal) in pairs, (seed, refusal, pairs)
        outcomes.add(taken)
    assert outcomes == {True, False}


def _aliasing(name, call):
    """A page-table call whose tensors share memory as ``name`` says. ``seq_lens`` becomes int32 and
    contiguous (so that it can be ``seq_lens_out``) and ``out`` contiguous, before the change."""
    batch = call[1].shape[0]
    rows, width = call[3].shape
    call[2] = call[2].int().contiguous()
    call[3] = torch.zeros(rows, width, dtype=torch.int32)
    if name == "seq_lens_out is seq_lens":
        call[7] = call[2]
    elif name == "seq_lens_out one entry after seq_lens":
        store = torch.cat([call[2], torch.zeros(1, dtype=torch.int32)])
        call[2], call[7] = store[:batch], store[1:]
    elif name == "out is req_to_token":
        call[0] = call[3]
    elif name == "kv_start_idx in out's last row":
        call[3] = torch.zeros(rows, width + batch, dtype=torch.int32)
        call[5] = call[3][-1, -batch:]
    elif name == "out rows stride 0":
        call[3] = call[3][:1].expand(max(rows, 2), width)
    elif name == "out rows stride below the width":
        call[3] = call[3].as_strided((rows, width), (width - 1, 1))
    elif name == "seq_lens_out ends in out":
        store = torch.zeros(batch - 1 + rows * width, dtype=torch.int32)
        call[7], call[3] = store[:batch], store[batch - 1:].view(rows, width)
    return call


ALIASINGS = ["seq_lens_out is seq_lens", "seq_lens_out one entry after seq_lens", "out is req_to_token",
             "kv_start_idx in out's last row", "out rows stride 0", "out rows stride below the width",
             "seq_lens_out ends in out"]


@pytest.mark.parametrize("name", ALIASINGS)
def test_hands_back_overlapping_calls(stubs, name):
    """Each call has its own plan registered: only the overlap sends it back."""
    call = _aliasing(name, random_call(21, page_size=64, with_start=True, options="lens_out"))
    stubs.module.approve(PAGE_TABLE, 0, None, TRITON)
    register(call)
    assert stubs.module.page_table(*call) is NotImplemented
    assert stubs.launches == []
    with pytest.raises(ValueError, match="shares? memory"):
        ops.page_table.check_arguments(*call[:9])


def test_takes_outputs_next_to_inputs(stubs):
    """Tensors back to back in one buffer, touching without sharing a byte, make a valid call."""
    call = random_call(22, with_start=True, options="lens_out")
    batch, (rows, width) = call[1].shape[0], call[3].shape
    lens, lens_out, out, start = torch.split(torch.zeros(rows * width + 3 * batch, dtype=torch.int32),
                                             [batch, batch, rows * width, batch])
    call[2], call[7], call[3], call[5] = lens.copy_(call[2]), lens_out, out.view(rows, width), start.copy_(call[5])
    stubs.module.approve(PAGE_TABLE, 0, None, TRITON)
    register(call)
    assert stubs.module.page_table(*call) is call[3]
    ops.page_table.check_arguments(*call[:9])


def test_hands_back_without_approval_plan_or_context(stubs):
    call = random_call(7)
    register(call)
    assert stubs.module.page_table(*call) is NotImplemented  # the selector never chose Triton here
    stubs.module.approve(PAGE_TABLE, 0, None, TRITON)
    stubs.context = CONTEXT + 1  # another device is current: the Python path switches devices
    assert stubs.module.page_table(*call) is NotImplemented
    stubs.context = CONTEXT
    stubs.module.clear_plans()
    assert stubs.module.page_table(*call) is NotImplemented
    assert stubs.launches == []
    register(call)
    assert stubs.module.page_table(*call) is call[3]
    assert stubs.module.page_table(*call[:9]) is NotImplemented  # not the ten public arguments
    assert len(stubs.launches) == 1


def test_a_failed_launch_is_handed_back(stubs):
    call = random_call(8)
    stubs.module.approve(PAGE_TABLE, 0, None, TRITON)
    register(call)
    stubs.result = 1  # CUDA_ERROR_INVALID_VALUE
    assert stubs.module.page_table(*call) is NotImplemented
    assert stubs.module.launch_count() == 0
    stubs.result = 0
    assert stubs.module.page_table(*call) is call[3]


def test_approvals_follow_the_selector_hooks(stubs):
    call = random_call(9)
    register(call)
    check_approvals_follow_the_hooks(stubs, native, call, "cupy")


def test_plan_cache_clear_drops_the_c_plans(stubs):
    call = random_call(10)
    stubs.module.approve(PAGE_TABLE, 0, None, TRITON)
    register(call)
    launch.reset()  # what a change of KVDISPATCH_TRITON_LAUNCH needs
    assert stubs.module.page_table(*call) is NotImplemented


def test_one_op_plan_cache_clear_keeps_the_other_ops_plans(stubs):
    calls = [random_call(seed) for seed in range(13, 20)]
    csr = random_csr_call(13)
    stubs.module.approve(PAGE_TABLE, 0, None, TRITON)
    stubs.module.approve(TOKEN_CSR, 0, None, TRITON)
    for call in calls:
        register(call)
    register_csr(stubs, csr)
    page_table._plans.clear()  # the page table's Python cache forgets (as past MAX_PLANS keys)
    assert all(stubs.module.page_table(*call) is NotImplemented for call in calls)
    assert stubs.module.token_csr(*csr) is csr[4]
    token_csr._plans.clear()
    assert stubs.module.token_csr(*csr) is NotImplemented


def test_public_api_goes_through_it_and_errors_do_not(stubs, monkeypatch):
    # The calls C hands back run on these CPU tensors in Python: the reference serves them on any machine.
    monkeypatch.setenv("KVDISPATCH_BACKEND", "torch")
    call = random_call(11, with_start=True, options="fill")
    table, pool, lens, out, page_size, start, offset, lens_out, fill, *_ = call
    stubs.module.approve(PAGE_TABLE, 0, None, TRITON)
    register(call)
    monkeypatch.setattr(dispatch, "fast_page_table", stubs.module.page_table)
    kwargs = dict(page_size=page_size, kv_start_idx=start, seqlen_offset=offset, seq_lens_out=lens_out,
                  fill_value=fill)
    before = out.clone()
    assert kvdispatch.create_flashmla_kv_indices(table, pool, lens, out, **kwargs) is out
    assert len(stubs.launches) == 1 and torch.equal(out, before)  # the (stub) C launch served it
    with pytest.raises(ValueError, match="page_size"):
        kvdispatch.create_flashmla_kv_indices(table, pool, lens, out, **{**kwargs, "page_size": 0})
    with pytest.raises(TypeError, match="req_to_token"):
        kvdispatch.create_flashmla_kv_indices(table.long(), pool, lens, out, **kwargs)
    assert len(stubs.launches) == 1
    expected = out.clone()
    ops.page_table.reference(table, pool, lens, expected, page_size, start, offset, None, fill,
                               round_toward_zero=True)
    assert kvdispatch.create_flashmla_kv_indices(table, pool, lens, out, **kwargs, round_toward_zero=True) is out
    assert len(stubs.launches) == 1 and torch.equal(out, expected)  # the Python path served it
    monkeypatch.setattr(_debug, "ENABLED", True)  # the data checks run, in Python, whatever C could take
    pool[0] = table.shape[0]
    with pytest.raises(ValueError, match="req_pool_indices"):
        kvdispatch.create_flashmla_kv_indices(table, pool, lens, out, **kwargs)
    assert len(stubs.launches) == 1


def test_selector_notifies_the_backend(monkeypatch):
    events = []
    import kernels_triton

    monkeypatch.setattr(kernels_triton, "on_selected", lambda *a: events.append(("selected",) + a))
    monkeypatch.setattr(kernels_triton, "on_deselected", lambda *a: events.append(("deselected",) + a))
    device = DEVICE  # Triton serves CPU tensors here only through its interpreter, which GPU runs leave off
    name, _ = dispatch.selector.resolve(device, "page_table", "triton")
    assert name == "triton" and events == [("selected", device, "page_table", "triton")]
    with pytest.warns(RuntimeWarning, match="disabled"):
        dispatch.selector.fail(device, "triton", RuntimeError("test"))
    assert events[-1] == ("deselected", device)
    kvdispatch.reset()
    assert events[-1] == ("deselected", None)


def test_native_mode_requires_it(monkeypatch):
    monkeypatch.setenv(launch.LAUNCH_ENV, "native")
    launcher = launch.KernelLauncher(page_table.page_table_kernel, page_table.CONSTEXPRS)
    launcher.compiled[(0, "spec")] = object()  # nothing host_path.c could launch
    with pytest.raises(RuntimeError, match="native"):
        launcher.native_kernel(0, "spec", 17, 128)
    monkeypatch.setenv(launch.LAUNCH_ENV, "direct")
    assert launcher.native_kernel(0, "spec", 17, 128) is None
    monkeypatch.setenv(launch.LAUNCH_ENV, "auto")
    assert launcher.native_kernel(0, "spec", 17, 128) is None
    assert launcher.native_kernel(-1, "spec", 17, 128) is None  # CPU (the interpreter): never


def test_parameter_count_needs_the_plain_case():
    """``native_parameter_count`` on stand-ins for compiled kernels (cross-compiled ones: test_triton_crosscompile)."""
    class Target:
        backend, warp_size = "cuda", 32

    class Metadata:
        target, num_ctas, global_scratch_size, profile_scratch_size = Target(), 1, 0, 0

    entry = ".visible .entry k(\n" + ",\n".join(f"\t.param .u64 k_param_{i}" for i in range(19)) + "\n)\n{"

    def compiled(**changes):
        metadata = Metadata()
        for name, value in changes.items():
            setattr(metadata, name, value)
        return type("Compiled", (), {"metadata": metadata, "asm": {"ptx": entry}})()

    assert launch.native_parameter_count(compiled(), 17) == 19
    assert launch.native_parameter_count(compiled(), 16) is None
    for change in ({"global_scratch_size": 8}, {"profile_scratch_size": 8}, {"num_ctas": 2},
                   {"launch_pdl": True}, {"launch_cooperative_grid": True}):
        assert launch.native_parameter_count(compiled(**change), 17) is None, change
    hip = type("Target", (), {"backend": "hip", "warp_size": 64})()
    assert launch.native_parameter_count(compiled(target=hip), 17) is None
    # A 32-bit int reads the low half of the 64-bit word the C path passes (little-endian); narrower ones are
    # not taken.
    for width, taken in ((".u32", True), (".b32", True), (".u16", False), (".u8", False), (".f32", False)):
        narrow_ptx = entry.replace(".u64 k_param_3", f"{width} k_param_3")
        narrow = type("Compiled", (), {"metadata": Metadata(), "asm": {"ptx": narrow_ptx}})()
        assert launch.native_parameter_count(narrow, 17) == (19 if taken else None), width


def test_builds_once_into_the_cache(tmp_path, monkeypatch):
    if host_path.compiler() is None:
        pytest.skip("no C compiler")
    first = host_path.build(tmp_path)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) == 1 and files[0].startswith(host_path.MODULE_NAME)
    stamp = (tmp_path / files[0]).stat().st_mtime_ns
    host_path.build(tmp_path)
    assert (tmp_path / files[0]).stat().st_mtime_ns == stamp
    assert hasattr(first, "page_table")
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    with pytest.raises(Exception):
        host_path.build(tmp_path / "elsewhere")


def register_csr(stubs, call, threads=128):
    key, _ = token_csr.plan_key_and_arguments(*call[:6])
    stubs.count = CSR_PARAMS
    kernel = launch.NativeKernel(FUNCTION + 1, threads, 0, CSR_PARAMS, CONTEXT)
    assert native.add_token_csr_plan((0,) + key[1:], kernel, (0, 5, 1))


@pytest.mark.parametrize("seed", range(20))
def test_token_csr_packs_what_the_python_path_launches(stubs, seed):
    call = random_csr_call(seed)
    stubs.module.approve(TOKEN_CSR, 0, None, TRITON)
    register_csr(stubs, call)
    assert stubs.module.page_table(*random_call(seed)) is NotImplemented  # approved for the other op only
    assert stubs.module.token_csr(*call) is call[4]
    (launched,) = stubs.launches
    _, args = token_csr.plan_key_and_arguments(*call[:6])
    assert launched["params"] == unsigned(args[:len(token_csr.ORDINARY_PARAMETERS)]) + [0, 0]
    assert launched["grid"] == (call[1].shape[0], 5, 1) and launched["function"] == FUNCTION + 1


@pytest.mark.parametrize("edge", ("rows 2**31", "rows below", "row stride 2**31", "row stride below"))
@pytest.mark.parametrize("contiguous", (False, True))
def test_token_csr_packs_the_edges_as_python_does(stubs, edge, contiguous):
    """At 2**31 - 1 table rows or row stride the values go into the packed words, at 2**31 the call is wide
    indexing (no memory behind either: one row expanded, or one row); contiguous index vectors are unit
    strides. C decides and packs as plan_key_and_arguments does (a different key would not find the plan)."""
    call = random_csr_call(3, with_start=True)
    if contiguous:
        call[1:4], call[5] = [v.contiguous() for v in call[1:4]], call[5].contiguous()
    table = call[0][:1]
    size = token_csr.WIDE - (1 if edge.endswith("below") else 0)
    call[0] = (table.expand(size, table.shape[1]) if edge.startswith("rows")
               else table.as_strided(table.shape, (size, 1)))
    key, _ = token_csr.plan_key_and_arguments(*call[:6])
    assert key[7:9] == (contiguous, "below" not in edge)  # unit strides, wide indexing
    stubs.module.approve(TOKEN_CSR, 0, None, TRITON)
    register_csr(stubs, call)
    assert stubs.module.token_csr(*call) is call[4]
    (launched,) = stubs.launches
    _, args = token_csr.plan_key_and_arguments(*call[:6])
    assert launched["params"] == unsigned(args[:len(token_csr.ORDINARY_PARAMETERS)]) + [0, 0]


@pytest.mark.parametrize("name", ["indptr too short", "indptr float", "out 2-D", "out strided", "out int64",
                                  "pool length", "start length", "start given (plan without)", "other out length",
                                  "backend cupy", "not approved for token_csr", "entry page size 16",
                                  "entry page size True", "token mapping", "seven arguments"])
def test_token_csr_hands_back_what_it_must_not_take(stubs, name):
    call = random_csr_call(5, with_start=False)
    batch = call[1].shape[0]
    stubs.module.approve(TOKEN_CSR, 0, None, TRITON)
    register_csr(stubs, call)
    out = call[4]
    change = {
        "indptr too short": (3, call[3][: batch - 1]),
        "indptr float": (3, call[3].float()),
        "out 2-D": (4, out[:, None]),
        "out strided": (4, torch.zeros(2 * out.shape[0], dtype=torch.int32)[::2]),
        "out int64": (4, out.long()),
        "pool length": (1, torch.cat([call[1], call[1][:1]])),
        "start length": (5, torch.zeros(batch + 1, dtype=torch.int32)),
        "start given (plan without)": (5, torch.zeros(batch, dtype=torch.int32)),
        "other out length": (4, torch.zeros(min(call[0].shape[1], out.shape[0]) - 1, dtype=torch.int32)),
        "backend cupy": (6, "cupy"),
        "not approved for token_csr": (6, "auto"),
        "entry page size 16": (7, 16),
        "entry page size True": (7, True),
        "token mapping": (8, torch.zeros(4, dtype=torch.int32)),
        "seven arguments": (slice(7, 9), []),
    }[name]
    call[change[0]] = change[1]
    if name == "other out length" and call[4].shape[0] == 0:
        pytest.skip("drawn case too small")
    assert stubs.module.token_csr(*call) is NotImplemented
    assert stubs.launches == []


def test_flashinfer_api_goes_through_it(stubs, monkeypatch):
    call = random_csr_call(12, with_start=True)
    stubs.module.approve(TOKEN_CSR, 0, None, TRITON)
    register_csr(stubs, call)
    monkeypatch.setattr(dispatch, "fast_token_csr", stubs.module.token_csr)
    table, pool, lens, indptr, out, start = call[:6]
    assert kvdispatch.create_flashinfer_kv_indices(table, pool, lens, indptr, out, kv_start_idx=start) is out
    assert len(stubs.launches) == 1
    with pytest.raises(TypeError, match="kv_indptr"):
        kvdispatch.create_flashinfer_kv_indices(table, pool, lens, indptr.float(), out, kv_start_idx=start)
    assert len(stubs.launches) == 1


def test_load_failure_leaves_launches_in_python(tmp_path, monkeypatch):
    """Where the extension cannot be built (here: no such compiler) or CUDA is missing, ``load`` returns None
    once, says why, and a required native mode raises with that reason; auto mode goes on in Python."""
    monkeypatch.setattr(host_path, "_module", None)
    monkeypatch.setattr(host_path, "_failure", None)
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv(_build_cache.CACHE_ENV, str(tmp_path / "cache"))
    with pytest.warns(RuntimeWarning, match="calls take the Python path: higher host time per call") as caught:
        assert host_path.load() is None
        assert host_path.failure()
        assert host_path.load() is None  # no second attempt, no second warning
    assert len(caught) == 1 and host_path.failure() in str(caught[0].message)
    launcher = launch.KernelLauncher(page_table.page_table_kernel, page_table.CONSTEXPRS)
    launcher.compiled[(0, "spec")] = object()
    monkeypatch.setattr(launch, "native_parameter_count", lambda compiled, runtime_args: runtime_args + 2)
    monkeypatch.setenv(launch.LAUNCH_ENV, "auto")
    assert launcher.native_kernel(0, "spec", 17, 128) is None
    monkeypatch.setenv(launch.LAUNCH_ENV, "native")
    launcher.native_kernels.clear()
    with pytest.raises(RuntimeError, match="compiled launcher cannot launch"):
        launcher.native_kernel(0, "spec", 17, 128)


def test_no_plan_is_registered_for_a_call_with_an_option(stubs):
    """Keys with an int64 out, an entry page size, a token mapping or PDL are refused at registration."""
    call = random_csr_call(14)
    kernel = launch.NativeKernel(FUNCTION + 1, 128, 0, CSR_PARAMS, CONTEXT)
    out64 = call[4].long()
    mapping = torch.zeros(3, dtype=torch.int64)
    for options in ((out64, 1, None, False), (call[4], 16, None, False), (call[4], 1, mapping, False),
                    (call[4], 1, None, True)):
        key, _ = token_csr.plan_key_and_arguments(*call[:4], options[0], call[5], *options[1:])
        assert not native.is_ordinary_token_csr(key)
        assert native.add_token_csr_plan((0,) + key[1:], kernel, (0, 5, 1)) is False
    key, _ = token_csr.plan_key_and_arguments(*call[:6])
    assert native.is_ordinary_token_csr(key)


# AMD: the same C path, configured with the HIP runtime's functions (KVDISPATCH_HIP_HOST_PATH).

def amdgpu_assembly(sizes, kinds=None, wavefront=64, workgroup=128, kernels=1, offsets=None):
    """AMD assembly whose AMDGPU metadata describes ``kernels`` kernels with arguments of ``sizes`` bytes
    at ``offsets`` (default 8 * i; ``kinds``: their ``.value_kind``, default global_buffer), as the compiler
    writes it."""
    kinds = kinds or ["global_buffer"] * len(sizes)
    offsets = offsets or [8 * i for i in range(len(sizes))]
    arguments = "".join(f"      - .offset:         {offset}\n        .size:           {size}\n"
                        f"        .value_kind:     {kind}\n" for offset, size, kind in zip(offsets, sizes, kinds))
    kernel = (f"  - .agpr_count:     0\n    .args:\n{arguments}    .group_segment_fixed_size: 0\n"
              f"    .kernarg_segment_align: 8\n    .kernarg_segment_size: {8 * len(sizes)}\n"
              f"    .max_flat_workgroup_size: {workgroup}\n    .name:           k\n    .symbol:         k.kd\n"
              f"    .wavefront_size: {wavefront}\n")
    return (f"\t.amdhsa_code_object_version 5\n\t.amdgpu_metadata\n---\namdhsa.kernels:\n{kernel * kernels}"
            "amdhsa.target:   amdgcn-amd-amdhsa--gfx942\namdhsa.version:\n  - 1\n  - 2\n"
            "...\n\n\t.end_amdgpu_metadata\n")


def hip_compiled(runtime_args, num_warps=2, **assembly):
    """A stand-in for a compiled gfx942 kernel: ``runtime_args`` arguments then the two scratch pointers."""
    target = type("Target", (), {"backend": "hip", "arch": "gfx942", "warp_size": 64})()
    metadata = type("Metadata", (), {"target": target, "num_warps": num_warps, "num_ctas": 1, "shared": 0,
                                     "global_scratch_size": 0, "profile_scratch_size": 0,
                                     "launch_cooperative_grid": False})()
    assembly.setdefault("sizes", [8] * (runtime_args + 2))
    assembly.setdefault("workgroup", 64 * num_warps)
    return type("Compiled", (), {"metadata": metadata, "function": FUNCTION,
                                 "asm": {"amdgcn": amdgpu_assembly(**assembly)}})()


def test_parameter_count_reads_the_amdgpu_kernel_arguments():
    """An AMD kernel qualifies when its metadata lists exactly the runtime arguments then the two scratch
    pointers, 8 bytes each at offsets 8 * i, then only hidden arguments (the runtime fills those), for
    wavefronts of the target's width and num_warps of them."""
    assert launch.native_parameter_count(hip_compiled(17), 17) == 19
    assert launch.threads_per_program(hip_compiled(17)) == 128
    assert launch.native_parameter_count(hip_compiled(17), 16) is None
    hidden = ["hidden_block_count_x", "hidden_block_count_y", "hidden_group_size_x"]
    with_hidden = dict(sizes=[8] * 19 + [4, 4, 2], kinds=["global_buffer"] * 19 + hidden)
    assert launch.native_parameter_count(hip_compiled(17, **with_hidden), 17) == 19
    refused = {
        "a 4-byte argument": dict(sizes=[8] * 5 + [4] + [8] * 13),
        "an argument at another offset": dict(offsets=[8 * i for i in range(18)] + [152]),
        "a hidden argument among them": dict(kinds=["global_buffer"] * 18 + ["hidden_block_count_x"]),
        "an explicit argument after a hidden one": dict(sizes=[8] * 20,
                                                        kinds=["global_buffer"] * 18 + [hidden[0], "by_value"]),
        "wave32": dict(wavefront=32),
        "another workgroup size": dict(workgroup=256),
        "two kernels": dict(kernels=2),
    }
    for name, change in refused.items():
        assert launch.native_parameter_count(hip_compiled(17, **change), 17) is None, name
    no_metadata = hip_compiled(17)
    no_metadata.asm = {"amdgcn": "\t.amdhsa_code_object_version 5\n"}
    assert launch.native_parameter_count(no_metadata, 17) is None


@pytest.fixture
def hip_loading(built, monkeypatch):
    """``host_path.load`` with the extension already built, a simulated device and a stand-in for each driver
    library (its launch and context functions: the Stubs'); returns ``(sim, stubs, opened)``, ``opened``
    listing the libraries asked for."""
    from simdevices import Sim

    stubs, opened = Stubs(PARAMS), []

    def open_driver(library, reuse_loaded):
        opened.append((library, reuse_loaded))
        api = next(a for a in kvdispatch.devices.DRIVER_LAUNCH_API.values() if a.library == library)
        return type("Driver", (), {api.launch: stubs.launch, api.current_context: stubs.current_context})

    monkeypatch.setattr(host_path, "open_driver", open_driver)
    monkeypatch.setattr(host_path, "build", lambda: built)
    monkeypatch.setattr(host_path, "_module", None)
    monkeypatch.setattr(host_path, "_failure", None)
    monkeypatch.setattr(host_path, "_approved", {})
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: STREAM_BASE + index, raising=False)
    monkeypatch.setattr(dispatch, "fast_page_table", None)
    monkeypatch.setattr(dispatch, "fast_token_csr", None)
    monkeypatch.setattr(dispatch, "fast_replay", None)
    monkeypatch.delenv(host_path.HIP_HOST_PATH_ENV, raising=False)
    return Sim(monkeypatch), stubs, opened


def test_amd_stays_in_python_unless_the_hip_host_path_is_on(hip_loading, monkeypatch):
    from simdevices import MI300X

    sim, stubs, opened = hip_loading
    sim.add(MI300X)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # off by the setting: no warning
        assert host_path.load(0) is None
    assert host_path.HIP_HOST_PATH_ENV in host_path.failure()
    assert opened == [] and dispatch.fast_page_table is None and dispatch.fast_token_csr is None
    for value in ("0", "off"):
        monkeypatch.setattr(host_path, "_failure", None)
        monkeypatch.setenv(host_path.HIP_HOST_PATH_ENV, value)
        assert host_path.load(0) is None and opened == []
        assert host_path.HIP_HOST_PATH_ENV in host_path.failure()
    monkeypatch.setattr(host_path, "_failure", None)
    monkeypatch.setenv(host_path.HIP_HOST_PATH_ENV, "maybe")  # not a boolean: the caller's error, not remembered
    with pytest.raises(ValueError, match=f"{host_path.HIP_HOST_PATH_ENV} must be one of"):
        host_path.load(0)
    assert host_path.failure() is None and opened == []


@pytest.mark.parametrize("raw, library", [("MI300X", "libamdhip64.so"), ("H200", "libcuda.so.1")])
def test_the_probe_vendor_picks_the_driver(hip_loading, monkeypatch, raw, library):
    """With the variable on, an AMD device gets the HIP runtime's functions; an NVIDIA one libcuda's, as
    without it."""
    import simdevices

    sim, stubs, opened = hip_loading
    sim.add(getattr(simdevices, raw))
    monkeypatch.setenv(host_path.HIP_HOST_PATH_ENV, "1")
    module = host_path.load(0)
    assert module is not None, host_path.failure()
    assert opened == [(library, raw == "MI300X")]  # only the HIP runtime is looked up among the loaded files
    assert host_path.current_context() == CONTEXT  # the context query is the driver's (here the stub)
    assert dispatch.fast_page_table == module.page_table and dispatch.fast_token_csr == module.token_csr
    assert dispatch.fast_replay == module.replay


def test_the_self_check_passes_on_this_pytorch(stubs):
    """Every probe tensor on the CPU is read as PyTorch reads it, or refused where it must be (a released
    storage, a sparse tensor, another device type)."""
    host_path.check_reads(stubs.module, torch.device("cpu"))
    probes = host_path.probe_tensors(torch.device("cpu"))
    assert sorted(name for name, (t, readable) in probes.items() if not readable) == [
        "a sparse tensor", "a tensor of another device type", "a tensor whose storage is released"]


def _shifted_pointer(original):
    return lambda t: original(t)[:4] + (original(t)[4] + 4,) + original(t)[5:]


@pytest.mark.parametrize("misread", ["python reads another pointer", "C reads a refused tensor"])
def test_a_misread_keeps_the_path_off_and_warns_once(hip_loading, built, monkeypatch, misread):
    """Where the extension's reads of a probe tensor differ from PyTorch's, ``load`` installs nothing, says
    which probe, and warns once."""
    from simdevices import H200

    sim, stubs, opened = hip_loading
    sim.add(H200)
    if misread == "python reads another pointer":
        monkeypatch.setattr(host_path, "python_reads", _shifted_pointer(host_path.python_reads))
    else:
        reads = built.tensor_metadata
        monkeypatch.setattr(built, "tensor_metadata", lambda t: reads(t) or (0, 0, (), (), 0, None, None))
    with pytest.warns(RuntimeWarning, match="calls take the Python path: higher host time per call") as caught:
        assert host_path.load(0) is None
        assert host_path.load(0) is None
    assert len(caught) == 1 and "its tensor reads disagree with PyTorch's for a " in host_path.failure()
    assert host_path.failure() in str(caught[0].message)
    assert dispatch.fast_page_table is None and dispatch.fast_token_csr is None and dispatch.fast_replay is None


def test_a_missing_shim_symbol_keeps_the_path_off_and_warns(hip_loading, monkeypatch):
    from simdevices import H200

    sim, stubs, opened = hip_loading
    sim.add(H200)
    monkeypatch.setattr(host_path, "SHIM_GETTERS", host_path.SHIM_GETTERS[:-1] + ("aoti_torch_get_no_such_getter",))
    with pytest.warns(RuntimeWarning, match="aoti_torch_get_no_such_getter.*higher host time per call"):
        assert host_path.load(0) is None
    assert dispatch.fast_page_table is None


def test_cpu_calls_never_attempt_it(monkeypatch):
    """CPU tensors never take the compiled host path: nothing is built and nothing warns."""
    monkeypatch.setattr(host_path, "_module", None)
    monkeypatch.setattr(host_path, "_failure", None)
    monkeypatch.setattr(host_path, "build", lambda *a: pytest.fail("built for a CPU call"))
    monkeypatch.setenv(launch.LAUNCH_ENV, "auto")
    table, pool, lens, out = random_call(5, page_size=16, with_start=False, options="")[:4]
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        kvdispatch.create_flashmla_kv_indices(table, pool, lens, out, page_size=16, backend="triton")
    assert host_path.failure() is None


def test_amd_plan_launches_with_its_wavefronts(stubs, monkeypatch):
    """A page-table plan of a (stand-in) gfx942 kernel, registered as the Triton launcher registers it: the
    C path launches it with the grid helper's threads (num_warps wavefronts of 64), the grid, and the
    parameters the Python path passes, scratch pointers null."""
    from kernels_triton import page_table as triton_page_table
    from kvdispatch import grid as launch_grid

    monkeypatch.setattr(torch.cuda, "device", lambda index: contextlib.nullcontext())  # CPU: no device to set
    monkeypatch.setenv(launch.LAUNCH_ENV, "auto")
    call = random_call(21)
    key, _ = triton_page_table.plan_key_and_arguments(*call[:9])
    geometry = launch_grid.page_table_launch(key[2], key[3], key[1], writes_lengths=key[7])
    launcher = launch.KernelLauncher(triton_page_table.page_table_kernel, triton_page_table.CONSTEXPRS)
    warps = geometry.threads // 64
    launcher.compiled[(0, "amd")] = hip_compiled(len(triton_page_table.PARAMETERS), num_warps=warps)
    launcher.compiled[(0, "amd wave32")] = hip_compiled(len(triton_page_table.PARAMETERS), num_warps=warps,
                                                        wavefront=32)
    launcher.compiled[(0, "amd other warps")] = hip_compiled(len(triton_page_table.PARAMETERS), num_warps=2 * warps)
    for refused in ("amd wave32", "amd other warps"):  # not the block the grid helper asks for
        assert launcher.native_kernel(0, refused, len(triton_page_table.PARAMETERS), geometry.threads) is None
    kernel = launcher.native_kernel(0, "amd", len(triton_page_table.PARAMETERS), geometry.threads)
    assert kernel == launch.NativeKernel(FUNCTION, geometry.threads, 0, PARAMS, CONTEXT)
    stubs.module.approve(PAGE_TABLE, 0, None, TRITON)
    assert native.add_page_table_plan((0,) + key[1:], kernel, geometry.grid)
    assert stubs.module.page_table(*call) is call[3]
    (launched,) = stubs.launches
    assert launched["block"] == (64 * warps, 1, 1) and launched["grid"] == geometry.grid
    assert launched["params"] == expected_params(call) and launched["function"] == FUNCTION
