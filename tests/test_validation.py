"""Bad arguments: a clear TypeError/ValueError before any work, naming the argument, and nothing written.

Valid calls take the validator's hot path (on CPU and CUDA tensors alike); every bad one must fall through
to the detailed checks, which name the argument.
"""

import pytest
import torch

import kvdispatch
from conftest import BACKENDS, DEVICE, page_table, token_csr
from kvcases import POISON, make_case, named_overlap, overlapping_pairs, place_in_one_buffer
from kvdispatch import _validate, grid, reference


def _page_args(case):
    out = case.page_table_out()
    return dict(req_to_token=case.req_to_token, req_pool_indices=case.req_pool_indices, seq_lens=case.seq_lens,
                out=out, page_size=case.page_size, kv_start_idx=case.kv_start_idx, seq_lens_out=None)


def _csr_args(case):
    indptr, out = case.csr()
    return dict(req_to_token=case.req_to_token, req_pool_indices=case.req_pool_indices, seq_lens=case.seq_lens,
                kv_indptr=indptr, out=out, kv_start_idx=case.kv_start_idx)


PAGE_TABLE_ERRORS = [
    # (argument, replacement builder, exception, words the message must contain)
    ("req_to_token", lambda a: a["req_to_token"].long(), TypeError, ["req_to_token", "int32", "int64"]),
    ("req_to_token", lambda a: a["req_to_token"][0], ValueError, ["req_to_token", "2-D"]),
    ("req_to_token", lambda a: a["req_to_token"].t(), ValueError, ["req_to_token", "contiguous"]),
    ("req_to_token", lambda a: a["req_to_token"].tolist(), TypeError, ["req_to_token", "Tensor", "list"]),
    ("req_pool_indices", lambda a: a["req_pool_indices"].float(), TypeError, ["req_pool_indices", "float32"]),
    ("req_pool_indices", lambda a: a["req_pool_indices"][None], ValueError, ["req_pool_indices", "1-D"]),
    ("seq_lens", lambda a: a["seq_lens"][:-1], ValueError, ["seq_lens", "entries"]),
    ("seq_lens", lambda a: a["seq_lens"].to(torch.int16), TypeError, ["seq_lens", "int16"]),
    ("kv_start_idx", lambda a: a["seq_lens"][:2], ValueError, ["kv_start_idx", "entries"]),
    ("out", lambda a: a["out"].long(), TypeError, ["out", "int32", "int64"]),
    ("out", lambda a: a["out"][:1], ValueError, ["out", "rows"]),
    ("out", lambda a: a["out"].t(), ValueError, ["out", "contiguous"]),
    ("out", lambda a: a["out"][:, 0], ValueError, ["out", "2-D"]),
    ("page_size", lambda a: 0, ValueError, ["page_size", "[1, 4096]", "0"]),
    ("page_size", lambda a: 4097, ValueError, ["page_size", "4097"]),
    ("page_size", lambda a: 64.0, TypeError, ["page_size", "float"]),
    ("page_size", lambda a: True, TypeError, ["page_size", "bool"]),
    ("seq_lens_out", lambda a: a["seq_lens"].long(), TypeError, ["seq_lens_out", "int32"]),
    ("seq_lens_out", lambda a: a["seq_lens"].int()[:1], ValueError, ["seq_lens_out", "entries"]),
]


@pytest.mark.parametrize("name,replace,error,words", PAGE_TABLE_ERRORS,
                         ids=[f"{e[0]}-{i}" for i, e in enumerate(PAGE_TABLE_ERRORS)])
def test_page_table_rejects(name, replace, error, words):
    case = make_case(4, 16, with_start=True, device=DEVICE)
    args = _page_args(case)
    args[name] = replace(args)
    out = args["out"] if isinstance(args["out"], torch.Tensor) else None
    snapshot = out.clone() if out is not None else None
    with pytest.raises(error) as info:
        kvdispatch.create_flashmla_kv_indices(**args, backend="torch")
    for word in words:
        assert word in str(info.value), (word, str(info.value))
    if snapshot is not None:
        assert torch.equal(out, snapshot)
    assert (case.page_table_out() == POISON).all()


@pytest.mark.parametrize("with_options", (False, True))
def test_valid_calls_pass(with_options):
    case = make_case(4, 16, with_start=with_options, device=DEVICE, index_dtype=torch.int64)
    args = _page_args(case)
    if with_options:
        args.update(seq_lens_out=case.seq_lens_out(), seqlen_offset=2, fill_value=-1, round_toward_zero=True)
    kvdispatch.create_flashmla_kv_indices(**args, backend="torch")
    kvdispatch.create_flashinfer_kv_indices(**_csr_args(case), backend="torch")


@pytest.mark.parametrize("with_options", (False, True))
def test_valid_calls_take_the_hot_path(monkeypatch, with_options):
    """The detailed checks never run for a valid call: the hot path alone accepts it."""
    from kvdispatch import _validate

    def detailed(*args):
        raise AssertionError("a valid call reached the detailed checks")

    monkeypatch.setattr(_validate, "_common", detailed)
    case = make_case(4, 16, with_start=with_options, device=DEVICE)
    args = _page_args(case)
    if with_options:
        args.update(seq_lens_out=case.seq_lens_out(), seqlen_offset=-3, fill_value=7, round_toward_zero=True)
    kvdispatch.create_flashmla_kv_indices(**args, backend="torch")
    kvdispatch.create_flashinfer_kv_indices(**_csr_args(case), backend="torch")


@pytest.mark.parametrize("keyword,value,error", [("seqlen_offset", 1.5, TypeError),
                                                 ("seqlen_offset", 2**31, ValueError),
                                                 ("fill_value", "x", TypeError),
                                                 ("fill_value", -(2**31) - 1, ValueError),
                                                 ("round_toward_zero", 1, TypeError),
                                                 ("round_toward_zero", None, TypeError)])
def test_page_table_rejects_scalars(keyword, value, error):
    case = make_case(3, 4, device=DEVICE)
    args = _page_args(case)
    with pytest.raises(error, match=keyword):
        kvdispatch.create_flashmla_kv_indices(**args, **{keyword: value}, backend="torch")
    assert (args["out"] == POISON).all()


CSR_ERRORS = [
    ("kv_indptr", lambda a: a["kv_indptr"][:1], ValueError, ["kv_indptr", "at least"]),
    ("kv_indptr", lambda a: a["kv_indptr"].float(), TypeError, ["kv_indptr", "float32"]),
    ("out", lambda a: a["out"][None], ValueError, ["out", "1-D"]),
    ("out", lambda a: a["out"][::2], ValueError, ["out", "contiguous"]),
    ("out", lambda a: a["out"].short(), TypeError, ["out", "int32", "int64", "int16"]),
    ("seq_lens", lambda a: a["seq_lens"][:1], ValueError, ["seq_lens", "entries"]),
    ("entry_page_size", lambda a: 0, ValueError, ["entry_page_size", "4096"]),
    ("entry_page_size", lambda a: 4097, ValueError, ["entry_page_size", "4096"]),
    ("entry_page_size", lambda a: True, TypeError, ["entry_page_size", "bool"]),
    ("entry_page_size", lambda a: 16.0, TypeError, ["entry_page_size", "float"]),
    ("token_mapping", lambda a: a["req_to_token"].float().flatten(), TypeError, ["token_mapping", "float32"]),
    ("token_mapping", lambda a: a["req_to_token"], ValueError, ["token_mapping", "1-D"]),
    ("token_mapping", lambda a: a["req_to_token"].flatten()[::2].clone()[::2], ValueError,
     ["token_mapping", "contiguous"]),
    ("token_mapping", lambda a: a["out"], ValueError, ["out", "shares memory", "token_mapping"]),
]


@pytest.mark.parametrize("name,replace,error,words", CSR_ERRORS, ids=[f"{e[0]}-{i}" for i, e in enumerate(CSR_ERRORS)])
def test_token_csr_rejects(name, replace, error, words):
    case = make_case(4, 16, with_start=True, device=DEVICE)
    args = _csr_args(case)
    original_out = args["out"]
    args[name] = replace(args)
    with pytest.raises(error) as info:
        kvdispatch.create_flashinfer_kv_indices(**args, backend="torch")
    for word in words:
        assert word in str(info.value), (word, str(info.value))
    assert (original_out == POISON).all()


def test_rejects_unknown_backend_names():
    case = make_case(2, 8, device=DEVICE)
    args = _page_args(case)
    with pytest.raises(ValueError, match="backend must be one of auto, triton, cupy, torch; got 'cuda'"):
        kvdispatch.create_flashmla_kv_indices(**args, backend="cuda")
    assert (args["out"] == POISON).all()


def test_rejects_unknown_env_backend(monkeypatch):
    monkeypatch.setenv("KVDISPATCH_BACKEND", "fast")
    case = make_case(2, 8, device=DEVICE)
    args = _page_args(case)
    with pytest.raises(ValueError, match="KVDISPATCH_BACKEND must be one of auto, triton, cupy, torch; got 'fast'"):
        kvdispatch.create_flashmla_kv_indices(**args)
    assert (args["out"] == POISON).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU to place tensors on two devices")
def test_rejects_mixed_devices():
    case = make_case(3, 8)
    args = _page_args(case)
    args["req_to_token"] = args["req_to_token"].cuda()
    with pytest.raises(ValueError, match="req_pool_indices is on cpu, expected cuda:0"):
        kvdispatch.create_flashmla_kv_indices(**args)
    assert (args["out"] == POISON).all()


def test_rejects_mixed_devices_without_a_gpu():
    """The device check compares devices, so a meta tensor stands in for a second device here."""
    case = make_case(3, 8)
    args = _page_args(case)
    args["out"] = torch.empty(args["out"].shape, dtype=torch.int32, device="meta")
    with pytest.raises(ValueError, match="out is on meta, expected cpu"):
        kvdispatch.create_flashmla_kv_indices(**args, backend="torch")
    args = _csr_args(case)
    args["kv_indptr"] = args["kv_indptr"].to("meta")
    with pytest.raises(ValueError, match="kv_indptr is on meta, expected cpu"):
        kvdispatch.create_flashinfer_kv_indices(**args, backend="torch")


def test_seq_lens_out_being_seq_lens_is_refused_on_every_backend():
    """Written while it is read, seq_lens would take the offset once per program of a row: refused
    before any launch, on rows that span several programs."""
    pages = grid.items_per_program(grid.PAGE_TABLE, 1) + 5
    for backend in BACKENDS:
        case = make_case(3, 1, max_pages=pages, device=DEVICE, seqlen_offset=100)
        lens = case.seq_lens.clone()
        args = _page_args(case)
        with pytest.raises(ValueError, match="seq_lens_out shares memory with seq_lens"):
            page_table(backend, **{**args, "seq_lens_out": case.seq_lens}, seqlen_offset=100)
        assert torch.equal(case.seq_lens, lens) and (args["out"] == POISON).all(), backend


def _sharing_store(*sizes):
    """Back-to-back int32 views of one poisoned buffer, one per size."""
    store = torch.full((sum(sizes),), POISON, dtype=torch.int32, device=DEVICE)
    return list(torch.split(store, sizes))


def _page_overlap(name, args):
    """Make the page-table ``args`` share memory as ``name`` says; returns the names the error must give."""
    out, batch = args["out"], args["req_pool_indices"].shape[0]
    rows, width = out.shape
    if name == "out is req_to_token":
        args["req_to_token"] = out
        return "out", "req_to_token"
    if name == "out over the pool":
        store, = _sharing_store(rows * width)
        args["out"] = store.view(rows, width)
        args["req_pool_indices"] = store[-batch:].copy_(args["req_pool_indices"])
        return "out", "req_pool_indices"
    if name == "kv_start_idx in a gap of strided out":
        store, = _sharing_store(rows * (width + batch))
        args["out"] = store.view(rows, width + batch)[:, :width]
        args["kv_start_idx"] = store.view(rows, width + batch)[0, width:].copy_(args["kv_start_idx"])
        return "out", "kv_start_idx"
    if name == "seq_lens_out one entry into out":
        store, = _sharing_store(batch - 1 + rows * width)
        args["seq_lens_out"], args["out"] = store[:batch], store[batch - 1:].view(rows, width)
        return "seq_lens_out", "out"
    if name == "seq_lens_out over int64 seq_lens":
        lens = args["seq_lens"].long()
        args["seq_lens"] = lens
        args["seq_lens_out"] = lens.view(torch.int32)[: batch]
        return "seq_lens_out", "seq_lens"
    raise AssertionError(name)


PAGE_OVERLAPS = ["out is req_to_token", "out over the pool", "kv_start_idx in a gap of strided out",
                 "seq_lens_out one entry into out", "seq_lens_out over int64 seq_lens"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", PAGE_OVERLAPS)
def test_page_table_refuses_overlapping_outputs(backend, name):
    case = make_case(4, 16, with_start=True, device=DEVICE)
    args = _page_args(case)
    output, other = _page_overlap(name, args)
    before = {k: v.clone() for k, v in args.items() if isinstance(v, torch.Tensor)}
    with pytest.raises(ValueError, match=f"^{output} shares memory with {other} "):
        page_table(backend, **args)
    for key, value in before.items():
        assert torch.equal(args[key], value), key


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("row_stride", (0, 1, "width - 1"))
def test_page_table_refuses_rows_of_out_sharing_memory(backend, row_stride):
    case = make_case(4, 16, device=DEVICE, width=5)
    args = _page_args(case)
    stride = 4 if row_stride == "width - 1" else row_stride
    args["out"] = torch.full((64,), POISON, dtype=torch.int32, device=DEVICE).as_strided((4, 5), (stride, 1))
    with pytest.raises(ValueError, match=f"rows of out share memory: its row stride {stride} is below its width 5"):
        page_table(backend, **args)
    assert (args["out"] == POISON).all()


def _last_entry_shared(source, length):
    """A contiguous copy of ``source`` and an int32 ``out`` of ``length`` entries whose first entry is the
    source's last 4 bytes, in one poisoned buffer (returned too)."""
    words = source.numel() * source.element_size() // 4
    store, = _sharing_store(words - 1 + length)
    return store[:words].view(source.dtype).view(source.shape).copy_(source), store[words - 1:], store


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("other", ("req_to_token", "req_pool_indices", "seq_lens", "kv_indptr", "kv_start_idx"))
@pytest.mark.parametrize("index_dtype", (torch.int32, torch.int64))
def test_token_csr_refuses_out_overlapping(backend, other, index_dtype):
    case = make_case(3, 4, with_start=True, device=DEVICE, index_dtype=index_dtype)
    args = _csr_args(case)
    args[other], args["out"], store = _last_entry_shared(args[other], args["out"].shape[0])
    snapshot = store.clone()
    with pytest.raises(ValueError, match=f"^out shares memory with {other} "):
        token_csr(backend, **args)
    assert torch.equal(store, snapshot)


def test_touching_and_empty_tensors_share_nothing():
    """Back to back in one buffer, and tensors without elements anywhere, are valid calls (hot path)."""
    case = make_case(4, 16, with_start=True, device=DEVICE, width=6)
    batch = case.batch
    out_rows = case.page_table_out().shape[0]
    lens, start, lens_out, out_flat = _sharing_store(batch, batch, batch, out_rows * 6)
    args = dict(_page_args(case), seq_lens=lens.copy_(case.seq_lens), kv_start_idx=start.copy_(case.kv_start_idx),
                seq_lens_out=lens_out, out=out_flat.view(out_rows, 6))
    expected = args["out"].clone()
    reference.build_page_table(case.req_to_token, case.req_pool_indices, case.seq_lens, expected,
                               case.page_size, case.kv_start_idx, 0, None, None)
    kvdispatch.create_flashmla_kv_indices(**args, backend="torch")
    assert torch.equal(args["out"], expected)
    empty = dict(args, out=args["req_to_token"][:batch, :0], seq_lens_out=None)  # inside the table, no element
    kvdispatch.create_flashmla_kv_indices(**empty, backend="torch")


def test_meta_tensors_share_no_memory(monkeypatch):
    """Meta tensors (shapes without memory: every ``data_ptr()`` is 0) overlap nothing: the hot path takes
    them."""
    monkeypatch.setattr(_validate, "_common", None)  # the detailed checks would fail on a call

    def on_meta(args):
        return {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in args.items()}

    case = make_case(4, 16, with_start=True)
    page = on_meta(dict(_page_args(case), seq_lens_out=case.seq_lens_out()))
    assert _validate.check_page_table_args(**page, seqlen_offset=0, fill_value=None).type == "meta"
    assert _validate.check_token_csr_args(**on_meta(_csr_args(case))).type == "meta"


def _random_sharing(seed, op):
    """A valid call of ``op`` with its tensors at random offsets of one buffer; the overlapping pairs; the
    buffer."""
    g = torch.Generator().manual_seed(seed)
    case = make_case(int(torch.randint(0, 6, (1,), generator=g)), 4, with_start=seed % 2 == 0, device=DEVICE,
                     generator=g, index_dtype=(torch.int32, torch.int64)[seed % 3 == 0], strided_out=seed % 4 == 0)
    if op == "page_table":
        args = dict(_page_args(case), seq_lens_out=case.seq_lens_out() if seed % 3 else None)
        outputs = ("out", "seq_lens_out")
    else:
        args = _csr_args(case)
        outputs = ("out",)
    names = [k for k, v in args.items() if isinstance(v, torch.Tensor)]
    views, buffer = place_in_one_buffer([args[k] for k in names], g)
    args.update(zip(names, views))
    pairs = overlapping_pairs({k: args.get(k) for k in outputs}, {k: args[k] for k in names if k not in outputs})
    return args, pairs, buffer


@pytest.mark.parametrize("op", ("page_table", "token_csr"))
def test_random_sharing_is_refused_exactly_when_memory_overlaps(monkeypatch, op):
    """Valid calls take the hot path; the others raise naming a pair that overlaps, nothing written."""
    detailed = []
    common = _validate._common
    monkeypatch.setattr(_validate, "_common", lambda *a: detailed.append(1) or common(*a))
    build = kvdispatch.create_flashmla_kv_indices if op == "page_table" else kvdispatch.create_flashinfer_kv_indices
    refused = 0
    for seed in range(80):
        args, pairs, buffer = _random_sharing(seed, op)
        before = buffer.clone()
        detailed.clear()
        if pairs:
            refused += 1
            with pytest.raises(ValueError) as info:
                build(**args, backend="torch")
            assert named_overlap(str(info.value)) in pairs, (seed, str(info.value), pairs)
            assert torch.equal(buffer, before), seed
        else:
            build(**args, backend="torch")
            assert not detailed, seed
    assert 0 < refused < 80


# ---------------------------------------------------------------- flags and counts, through every entry point


def _op_call(op):
    """``(public function name, tensors, valid keyword options)`` of a small valid call of ``op`` on DEVICE,
    its outputs poisoned."""
    table = torch.arange(4 * 64, dtype=torch.int32, device=DEVICE).reshape(4, 64)
    pool = torch.tensor([2, 0, 3], dtype=torch.int32, device=DEVICE)
    lens = torch.tensor([5, 17, 9], dtype=torch.int32, device=DEVICE)
    indptr = torch.tensor([0, 5, 22, 31], dtype=torch.int32, device=DEVICE)

    def poisoned(*shape, dtype=torch.int32):
        return torch.full(shape, POISON, dtype=dtype, device=DEVICE)

    if op == "page_table":
        return "create_flashmla_kv_indices", (table, pool, lens, poisoned(3, 8)), dict(page_size=4, fill_value=-1)
    if op == "token_csr":
        return "create_flashinfer_kv_indices", (table, pool, lens, indptr, poisoned(40)), {}
    if op == "mha_page_table":
        return "create_trtllm_mha_page_table", (table, pool, lens, poisoned(3, 8)), dict(page_size=4)
    if op == "translated_page_table":
        v2p = torch.arange(64, dtype=torch.int32, device=DEVICE)
        return ("create_translated_page_table", (table, pool, lens, v2p, poisoned(3, 8)),
                dict(page_size=4, multiplier=2, max_pages=6, seq_len_delta=1))
    if op == "draft_decode":
        return ("create_draft_decode_kv_indices", (table, pool, lens, poisoned(2, 3 * 2 + 1), poisoned(2, 200)),
                dict(num_steps=2, topk=2, page_size=1))
    if op == "dcp_token_csr":
        return "create_dcp_kv_indices", (table, pool, lens, indptr, poisoned(40)), dict(dcp_size=2, dcp_rank=1)
    assert op == "dcp_page_table"
    return "create_dcp_page_table", (table, pool, lens, poisoned(3, 8)), dict(page_size=4, dcp_size=2, dcp_rank=1)


_NOT_A_FLAG = ("false", 0, 1, 2, 0.5, torch.tensor([True, False]), torch.tensor(True))
_NOT_A_COUNT = (True, False, 4.0)
# Per op: its integer options and its flags (enable_pdl, which may be None, aside).
_OPTIONS = {
    "page_table": (("page_size", "seqlen_offset", "fill_value"), ("round_toward_zero",)),
    "token_csr": (("entry_page_size",), ()),
    "mha_page_table": (("page_size",), ("round_toward_zero",)),
    "translated_page_table": (("page_size", "multiplier", "max_pages", "seq_len_delta"), ()),
    "draft_decode": (("num_steps", "topk", "page_size", "window_size", "sink_size"),
                     ("write_indptr_start", "round_toward_zero")),
    "dcp_token_csr": (("dcp_size", "dcp_rank"), ("round_toward_zero",)),
    "dcp_page_table": (("page_size", "dcp_size", "dcp_rank", "fill_value"), ("round_toward_zero",)),
}
BAD_OPTIONS = sorted({(op, name, value) for op, (counts, flags) in _OPTIONS.items()
                      for name, values in [(n, _NOT_A_COUNT) for n in counts]
                      + [(n, _NOT_A_FLAG + (None,)) for n in flags] + [("enable_pdl", _NOT_A_FLAG)]
                      for value in values}, key=repr)


def _entry(entry, name):
    return getattr(kvdispatch, name) if entry == "public" else getattr(torch.ops.kvdispatch, name)


@pytest.mark.parametrize("entry", ("public", "torch.ops"))
@pytest.mark.parametrize("op,keyword,value", BAD_OPTIONS, ids=lambda v: repr(v)[:24])
def test_a_flag_or_count_of_another_type_is_refused(entry, op, keyword, value):
    """A bool where an int is due, anything but a bool where a flag is (None only for enable_pdl): a
    TypeError naming the argument from the public function and from its custom op, before anything is
    written. (The custom op's schema refuses strings, tensors and None itself, with a RuntimeError naming the
    argument.)"""
    name, tensors, options = _op_call(op)
    outputs = [t.clone() for t in tensors]
    by_schema = isinstance(value, (str, torch.Tensor)) or value is None  # None: only enable_pdl is optional
    refused = TypeError if entry == "public" or not by_schema else RuntimeError
    with pytest.raises(refused, match=keyword):
        _entry(entry, name)(*tensors, **dict(options, **{keyword: value}), backend="torch")
    for before, after in zip(outputs, tensors):
        assert torch.equal(before, after), "a refused call wrote"


@pytest.mark.parametrize("entry", ("public", "torch.ops"))
@pytest.mark.parametrize("op", sorted(_OPTIONS))
def test_flags_as_bools_pass(entry, op):
    """The same calls with bools (and enable_pdl None) pass, through both entry points."""
    name, tensors, options = _op_call(op)
    flags = {flag: True for flag in _OPTIONS[op][1]}
    for enable_pdl in (None, False, True):
        _entry(entry, name)(*tensors, **options, **flags, backend="torch", enable_pdl=enable_pdl)


def test_enable_pdl_is_checked_before_the_compiled_host_path(monkeypatch):
    """``enable_pdl=0`` (falsy, not a bool) must not reach the compiled launcher, which takes calls without PDL."""
    taken = []
    monkeypatch.setattr(kvdispatch.dispatch, "fast_replay", lambda *args: taken.append(args))
    name, tensors, options = _op_call("page_table")
    with pytest.raises(TypeError, match="enable_pdl must be a bool or None, got int"):
        kvdispatch.create_flashmla_kv_indices(*tensors, **options, enable_pdl=0)
    assert not taken
