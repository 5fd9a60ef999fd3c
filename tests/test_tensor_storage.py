"""Tensors whose memory does not hold them, and tensors of another layout, on every op and backend.

Every tensor argument of every op (outputs, and optional ones when given, included) must be strided and, with
elements, have memory that holds its view at an address aligned to its element size (``kvdispatch._validate``):
a released storage (``untyped_storage().resize_(0)``, as FSDP and offloading do), a storage shrunk under the
view, a pointer at a byte offset, a nested or sparse tensor are each refused with an error naming the argument
before anything runs, every output still its poison. Views at element-aligned addresses that are not 16-byte
aligned are valid: every backend gives the reference result there (the CUDA source's 16-byte accesses peel
to an aligned address, Triton's wide page-1 copy is taken only for aligned rows) and writes nothing around them.
The compiled host path (C) hands such calls back to Python, and the custom ops refuse them as the eager call.
"""

from __future__ import annotations

import pytest
import torch
from conftest import BACKENDS, DEVICE, through
from kvcases import POISON

import kvdispatch

GUARD = -987654
R, C, B = 6, 40, 4
# op -> its public function; the variants of each op's call (kwargs builders below); the outputs per op.
FUNCTIONS = {"page_table": "create_flashmla_kv_indices", "token_csr": "create_flashinfer_kv_indices",
             "mha_page_table": "create_trtllm_mha_page_table", "translated_page_table": "create_translated_page_table",
             "draft_decode": "create_draft_decode_kv_indices", "dcp_token_csr": "create_dcp_kv_indices",
             "dcp_page_table": "create_dcp_page_table"}
OUTPUTS = {"page_table": ("out", "seq_lens_out"), "token_csr": ("out",), "mha_page_table": ("page_table",
           "swa_page_table"), "translated_page_table": ("out",), "draft_decode": ("kv_indptr", "out"),
           "dcp_token_csr": ("out",), "dcp_page_table": ("out",)}


def _ints(g, low, high, shape, dtype=torch.int32):
    return torch.randint(low, high, shape, generator=g, dtype=torch.int64).to(dtype)


def _call(op, variant, seed=0):
    """The keyword arguments of a valid call of ``op`` on the test device (``variant``: "plain", the ordinary call whose
    page-1 copy or token CSR takes the 16-byte accesses, or "options", every option given), outputs poisoned."""
    g = torch.Generator().manual_seed(seed)
    plain = variant == "plain"
    table = _ints(g, 0, 1 << 16, (R, C))
    pool = torch.randperm(R, generator=g)[:B]
    lens = _ints(g, 1, C // 2, (B,))
    start = _ints(g, 0, C // 2, (B,), torch.int64)
    args = dict(req_to_token=table, req_pool_indices=pool, seq_lens=lens)
    if op == "page_table":
        args.update(out=torch.full((B + 1, 37 if plain else 7), POISON, dtype=torch.int32), page_size=1 if plain else 4)
        if not plain:
            args.update(kv_start_idx=start, seq_lens_out=torch.full((B,), POISON, dtype=torch.int32), fill_value=-1)
    elif op in ("token_csr", "dcp_token_csr"):
        indptr = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lens, 0)])
        out_dtype = torch.int32 if plain else torch.int64
        args.update(kv_indptr=indptr if plain else indptr.to(torch.int32),
                    out=torch.full((int(indptr[-1]) + 3,), POISON, dtype=out_dtype))
        if op == "dcp_token_csr":
            args.update(dcp_size=2, dcp_rank=1)
        if not plain:
            args.update(kv_start_idx=start)
            if op == "token_csr":
                args.update(entry_page_size=2, token_mapping=_ints(g, -2, 1 << 20, (3 * C,), torch.int64))
    elif op == "mha_page_table":
        args.update(page_table=torch.full((B, 9), POISON, dtype=torch.int32), page_size=4,
                    swa_page_table=torch.full((B, 5), POISON, dtype=torch.int32),
                    full_to_swa=_ints(g, -3, 1 << 12, (1 << 16,), torch.int64))
    elif op == "translated_page_table":
        args.update(v2p=_ints(g, -1, 1 << 10, (1 << 14,), torch.int64),
                    out=torch.full((B, 9), POISON, dtype=torch.int32), page_size=4, multiplier=3)
    elif op == "draft_decode":
        steps, topk = 2, 2
        args.update(kv_indptr=torch.full((steps, B * topk + 1), POISON, dtype=torch.int32),
                    out=torch.full((steps, 203), POISON, dtype=torch.int64), num_steps=steps, topk=topk,
                    page_size=1 if plain else 4)
        if not plain:
            args.update(positions=_ints(g, 0, C, (B * topk,), torch.int64), v2p=_ints(g, -1, 1 << 10, (1 << 14,)))
    else:  # dcp_page_table
        args.update(out=torch.full((B, 7), POISON, dtype=torch.int32), page_size=2, dcp_size=2, dcp_rank=0,
                    fill_value=None if plain else -1)
    if op.startswith("dcp"):
        args["local_seq_lens"] = args.pop("seq_lens")
    return {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in args.items()}


VARIANTS = [(op, variant) for op in FUNCTIONS for variant in ("plain", "options")]


def _tensor_names(op, variant):
    return [name for name, value in _call(op, variant).items() if isinstance(value, torch.Tensor)]


CASES = [(op, variant, name) for op, variant in VARIANTS for name in _tensor_names(op, variant)]


def run(backend, op, args):
    return through(backend, FUNCTIONS[op], **args)


def reference(op, args):
    """The outputs of the torch backend on fresh contiguous copies of ``args``."""
    copies = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    kvdispatch.__dict__[FUNCTIONS[op]](**copies, backend="torch")
    return {name: copies[name] for name in OUTPUTS[op] if copies.get(name) is not None}


def _guarded(t, shift):
    """``t``'s values in a contiguous view ``shift`` elements past a 16-byte-aligned buffer, with ``GUARD``
    around it; returns the view and the buffer."""
    buffer = torch.full((t.numel() + shift + 8,), GUARD, dtype=t.dtype, device=t.device)
    assert buffer.data_ptr() % 16 == 0
    view = buffer[shift: shift + t.numel()].view(t.shape)
    view.copy_(t)
    return view, buffer


def released(t):
    t = t.clone()
    t.untyped_storage().resize_(0)
    return t


def released_under_offset(t):
    """``t``'s values one element into a storage, then the storage released (``data_ptr()`` is then the
    offset, not 0)."""
    base = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    view = base[1:].view(t.shape).copy_(t)
    base.untyped_storage().resize_(0)
    return view


def shrunk(t):
    """``t`` over a storage one element short of its view."""
    t = t.clone()
    t.untyped_storage().resize_(t.nbytes - t.itemsize)
    return t


def misaligned(t, keep):
    """``t``'s values at one byte past an aligned address (its buffer appended to ``keep``)."""
    buffer = torch.zeros(t.nbytes + 16, dtype=torch.uint8, device=t.device)
    keep.append(buffer)
    storage = torch._C._construct_storage_from_data_pointer(buffer.data_ptr() + 1, t.device, t.nbytes)
    view = torch.empty(0, dtype=t.dtype, device=t.device).set_(storage, 0, t.shape, t.contiguous().stride())
    view.copy_(t)
    return view


SPOILERS = {"released storage": lambda t, keep: released(t),
            "released under an offset": lambda t, keep: released_under_offset(t),
            "shrunk storage": lambda t, keep: shrunk(t), "byte offset": misaligned}
EXPECTED = {"released storage": "no memory", "released under an offset": "no memory",
            "shrunk storage": "storage must hold its view", "byte offset": "aligned to its element size"}


def assert_poisoned(op, args, spoilt=None, kind=None, keep=()):
    """Every output of ``op`` in ``args`` still holds its poison. The spoilt one is read back only at a byte
    offset, through the bytes of its buffer (``keep[0]``): a PyTorch kernel reading it there faults on a GPU."""
    for name in OUTPUTS[op]:
        t = args.get(name)
        if t is None:
            continue
        if name != spoilt:
            assert (t == POISON).all(), name
        elif kind == "byte offset":
            poison = torch.full(t.shape, POISON, dtype=t.dtype).view(-1).view(torch.uint8)
            assert torch.equal(keep[0][1: 1 + t.nbytes].cpu(), poison), name


@pytest.mark.representative("op", "kind")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", list(SPOILERS))
@pytest.mark.parametrize("op, variant, name", CASES)
def test_memory_that_does_not_hold_the_view_is_refused(backend, op, variant, name, kind):
    args = _call(op, variant)
    keep = []
    args[name] = SPOILERS[kind](args[name], keep)
    with pytest.raises(ValueError, match=f"^{name}.*{EXPECTED[kind]}"):
        run(backend, op, args)
    assert_poisoned(op, args, name, kind, keep)


LAYOUTS = {"sparse_coo": lambda t: t.to_sparse(), "sparse_csr": lambda t: t.to_sparse_csr(),
           "nested": lambda t: torch.nested.nested_tensor(list(t) if t.dim() == 2 else [t]),
           "jagged": lambda t: torch.nested.nested_tensor(list(t), layout=torch.jagged)}


LAYOUT_CASES = [(op, variant, name, layout) for op, variant, name in CASES for layout in LAYOUTS
                if _call(op, variant)[name].dim() == 2 or layout not in ("sparse_csr", "jagged")]


@pytest.mark.filterwarnings("ignore::UserWarning")  # nested and sparse CSR tensors are beta
@pytest.mark.representative("op", "layout")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op, variant, name, layout", LAYOUT_CASES)
def test_other_layouts_are_refused(backend, op, variant, name, layout):
    args = _call(op, variant)
    args[name] = LAYOUTS[layout](args[name])
    with pytest.raises(TypeError, match=f"^{name} must be a strided tensor"):
        run(backend, op, args)
    assert_poisoned(op, args, name)


@pytest.mark.representative("op", "variant")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shift", (1, 3))
@pytest.mark.parametrize("op, variant", VARIANTS)
def test_element_aligned_views_off_16_bytes_give_the_reference(backend, op, variant, shift):
    """Every tensor of the call ``shift`` elements past a 16-byte boundary (4, 8 or 12 bytes; odd output
    widths put the rows at every alignment): the reference result, nothing written around the views."""
    args = _call(op, variant, seed=shift)
    expected = reference(op, args)
    placed, buffers = {}, {}
    for name, value in args.items():
        if isinstance(value, torch.Tensor):
            placed[name], buffers[name] = _guarded(value, shift)
            assert placed[name].data_ptr() % 16 and placed[name].data_ptr() % value.itemsize == 0
        else:
            placed[name] = value
    run(backend, op, placed)
    for name, buffer in buffers.items():
        outside = torch.cat([buffer[:shift], buffer[shift + args[name].numel():]])
        assert (outside == GUARD).all(), f"{name}: written around the view"
        want = expected.get(name, args[name])
        assert torch.equal(placed[name], want), name


@pytest.mark.parametrize("backend", BACKENDS)
def test_tensors_without_elements_pass_whatever_their_storage(backend):
    """An empty batch, an output without columns: nothing to hold, released or not."""
    args = _call("page_table", "options")
    for name in ("req_pool_indices", "seq_lens", "kv_start_idx", "seq_lens_out"):
        args[name] = released(args[name][:0])
    args["out"] = released(args["out"][:, :0])
    run(backend, "page_table", args)
    args = _call("token_csr", "plain")
    args["out"] = released(args["out"][:0])
    run(backend, "token_csr", args)


@pytest.mark.parametrize("kind", list(SPOILERS))
@pytest.mark.parametrize("name", ("seq_lens", "kv_start_idx", "out"))
def test_dcp_local_lengths_refuses_them(name, kind):
    """``dcp_local_lengths`` (PyTorch operations, which would read a released storage) refuses them too."""
    args = dict(seq_lens=_ints(torch.Generator().manual_seed(1), 0, 99, (B,), torch.int64),
                kv_start_idx=torch.arange(B), out=torch.full((B + 1,), POISON, dtype=torch.int64))
    keep = []
    args[name] = SPOILERS[kind](args[name], keep)
    with pytest.raises(ValueError, match=f"^{name}.*{EXPECTED[kind]}"):
        kvdispatch.dcp_local_lengths(**args, dcp_size=2, dcp_rank=1)
    if name != "out":
        assert (args["out"] == POISON).all()


def test_the_reviewed_shrunk_output_is_refused():
    """A 64 x 1024 ``out`` over 16 bytes (its view 256 KiB past them) is refused on every backend."""
    for backend in BACKENDS:
        args = _call("page_table", "plain")
        args["out"] = torch.full((64, 1024), POISON, dtype=torch.int32, device=DEVICE)
        args["out"].untyped_storage().resize_(16)
        with pytest.raises(ValueError, match="out's storage must hold its view, 262144 bytes .* got "
                                             r"untyped_storage\(\).nbytes\(\) 16"):
            run(backend, "page_table", args)


CUSTOM_OPS = {"page_table": torch.ops.kvdispatch.create_flashmla_kv_indices,
              "token_csr": torch.ops.kvdispatch.create_flashinfer_kv_indices,
              "translated_page_table": torch.ops.kvdispatch.create_translated_page_table}


@pytest.mark.representative("op", "kind")
@pytest.mark.parametrize("kind", list(SPOILERS))
@pytest.mark.parametrize("op, variant, name", [c for c in CASES if c[0] in CUSTOM_OPS])
def test_the_custom_ops_refuse_them_as_the_eager_call(op, variant, name, kind):
    args = _call(op, variant)
    keep = []
    args[name] = SPOILERS[kind](args[name], keep)
    tensors = [args.pop(n) for n in ("req_to_token", "req_pool_indices", "seq_lens")]
    if op == "translated_page_table":
        tensors.append(args.pop("v2p"))
    if op == "token_csr":
        tensors.append(args.pop("kv_indptr"))
    tensors.append(args.pop("page_table" if op == "mha_page_table" else "out"))
    with pytest.raises(ValueError, match=f"^{name}.*{EXPECTED[kind]}"):
        CUSTOM_OPS[op](*tensors, **args, backend="torch")
    assert_poisoned(op, dict(args, out=tensors[-1]), name, kind, keep)


@pytest.mark.parametrize("op, variant", VARIANTS)
def test_fake_tensors_still_pass_the_metadata_checks(op, variant):
    """Fake tensors (``torch.compile``'s: no memory) pass each op's fake kernel (``memory=False``)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    custom_op = getattr(torch.ops.kvdispatch, kvdispatch.dispatch.OPS[op].name)
    args = _call(op, variant)
    with FakeTensorMode() as mode:
        custom_op(**{k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for k, v in args.items()})


# ---- the compiled host path (C), pointed at stubs ------------------------------------------------------------

@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from host_path_stubs import build

    return build(tmp_path_factory)


@pytest.mark.representative("op", "kind")
@pytest.mark.parametrize("kind", list(SPOILERS) + ["sparse"])
@pytest.mark.parametrize("op, position", [("page_table", p) for p in (0, 1, 2, 3)]
                         + [("token_csr", p) for p in (0, 1, 2, 3, 4)])
def test_the_host_path_hands_them_back(built, monkeypatch, op, position, kind):
    """A call whose replay plan C holds, with one tensor spoilt: C launches nothing and returns NotImplemented (the
    Python path then raises); its tensor reads refuse the tensor."""
    from host_path_stubs import FUNCTION, install, random_call, random_csr_call
    from test_cupy_native import RecordingRuntime, register

    from kernels_cupy import launch as cupy_launch
    from kernels_cupy import native as cupy_native
    from kvdispatch import host_path

    stubs = install(built, monkeypatch, count=0)
    monkeypatch.setattr(cupy_native, "kernel_and_context", lambda index, call: (FUNCTION, stubs.context))
    stubs.runtime = RecordingRuntime()
    monkeypatch.setattr(cupy_launch, "_runtime_module", stubs.runtime)
    call = random_call(3, with_start=False, options="") if op == "page_table" else random_csr_call(3, False)
    register(stubs, op, call)
    stubs.module.approve(host_path.OPS[op], 0, None, host_path.LAUNCHERS["cupy"])

    def entry(*args):
        return stubs.module.replay(host_path.OPS[op], None, *args)

    assert entry(*call) is call[3 if op == "page_table" else 4]  # the plan serves the valid call
    keep = []
    spoilt = call[position].to_sparse() if kind == "sparse" else SPOILERS[kind](call[position], keep)
    call[position] = spoilt
    assert entry(*call) is NotImplemented
    assert len(stubs.launches) == 1
    assert stubs.module.tensor_metadata(spoilt) is None
