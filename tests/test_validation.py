"""Bad arguments: a clear TypeError/ValueError before any work, naming the argument, and nothing written.

Valid calls take the validator's hot path (on CPU and CUDA tensors alike); every bad one must fall through
to the detailed checks, which name the argument.
"""

import pytest
import torch

import kvdispatch
from conftest import DEVICE
from kvcases import POISON, make_case


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
        args.update(seq_lens_out=case.seq_lens_out(), seqlen_offset=2, fill_value=-1)
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
        args.update(seq_lens_out=case.seq_lens_out(), seqlen_offset=-3, fill_value=7)
    kvdispatch.create_flashmla_kv_indices(**args, backend="torch")
    kvdispatch.create_flashinfer_kv_indices(**_csr_args(case), backend="torch")


@pytest.mark.parametrize("keyword,value,error", [("seqlen_offset", 1.5, TypeError), ("seqlen_offset", 2**31, ValueError),
                                                 ("fill_value", "x", TypeError), ("fill_value", -(2**31) - 1, ValueError)])
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
    ("out", lambda a: a["out"].long(), TypeError, ["out", "int32"]),
    ("seq_lens", lambda a: a["seq_lens"][:1], ValueError, ["seq_lens", "entries"]),
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
