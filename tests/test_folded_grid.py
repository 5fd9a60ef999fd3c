"""Rows wider than the grid's second dimension (``kvdispatch.grid`` folds them into the third), and calls
beyond the grid limits, on every backend under test.

On CPU (and on a GPU too) the second dimension's limit is lowered to 3 programs, so that ordinary shapes
fold: each backend must then match the torch reference, its last slice holding blocks past the row. The
GPU-only tests run rows genuinely wider than 65535 programs. A call beyond the limits is a ValueError of
that call: nothing written, no backend disabled.
"""

from __future__ import annotations

import functools
import warnings

import pytest
import torch

import kvdispatch
from conftest import BACKENDS, DEVICE, GPU_BACKENDS, HAS_GPU, page_table, token_csr
from kvcases import POISON, make_case
from kvdispatch import devices, dispatch, grid
from test_backends import _check_page_table, _check_token_csr

FOLD_AT = 3  # programs per row past which the lowered limit folds
# The host build of the CUDA source runs twice: generic (flags at run time) and specialised (as CuPy compiles).
BUILDS = GPU_BACKENDS + (["cupy-host-specialised"] if "cupy-host" in GPU_BACKENDS else [])


def _forget_geometry():
    """Drop every launch geometry the launchers keep (Triton's plans, CuPy's cached ``Launch``es and its
    plans in the compiled host path), and the Triton launchers' compiled kernels, so that each test's first
    launch goes the plain way."""
    from kernels_cupy import launch as cupy_launch
    from kernels_cupy import native as cupy_native

    cupy_native.reset()
    cupy_launch.forget_geometry()
    if "triton" in BACKENDS:
        from kernels_triton import launch as triton_launch

        triton_launch.reset(compiled=True)


@pytest.fixture
def folding(monkeypatch):
    """``grid.MAX_GRID_Y`` lowered to ``FOLD_AT``; geometry computed under either limit is forgotten."""
    _forget_geometry()
    monkeypatch.setattr(grid, "MAX_GRID_Y", FOLD_AT)
    yield
    _forget_geometry()


@pytest.fixture
def triton_launches(monkeypatch):
    """``(grid, constexprs)`` of every Triton launch that compiles or goes the plain way."""
    if "triton" not in BACKENDS:
        return []
    from kernels_triton import launch as triton_launch

    launches = []
    plain = triton_launch.KernelLauncher.plain

    def spy(self, launch_grid, args, constexprs, num_warps):
        launches.append((tuple(launch_grid), dict(constexprs)))
        return plain(self, launch_grid, args, constexprs, num_warps)

    monkeypatch.setattr(triton_launch.KernelLauncher, "plain", spy)
    return launches


@pytest.fixture
def backend(request, monkeypatch):
    """The backend name for ``conftest.page_table``/``token_csr``; ``cupy-host-specialised`` is ``cupy-host``
    through the build specialised for each call."""
    if request.param != "cupy-host-specialised":
        return request.param
    import cuda_host as host

    for name in ("create_flashmla_kv_indices", "create_flashinfer_kv_indices"):
        monkeypatch.setattr(host, name, functools.partial(getattr(host, name), specialised=True))
    return "cupy-host"


def _check_triton_folded(backend, launches):
    if backend == "triton":
        assert launches and all(g[2] > 1 and c["FOLDED_GRID"] for g, c in launches), launches


@pytest.mark.representative("page_size")
@pytest.mark.parametrize("backend", BUILDS, indirect=True)
@pytest.mark.parametrize("page_size", (1, 16, 96, 4096))
@pytest.mark.parametrize("option", ("plain", "start", "fill", "offset"))
def test_page_table_on_a_folded_grid(folding, triton_launches, backend, page_size, option):
    items = grid.items_per_program(grid.PAGE_TABLE, page_size)
    # 4 programs per row on a (batch, 3, 2) grid: two blocks of the last slice lie past the row.
    pages = FOLD_AT * items + 5
    case = make_case(3, page_size, max_pages=pages, device=DEVICE, width=pages + 2,
                     index_dtype=torch.int64 if option in ("start", "offset") else torch.int32,
                     with_start=option == "start", strided_table=option == "fill", strided_out=option == "fill",
                     fill_value=-1 if option == "fill" else None, seqlen_offset=5 if option == "offset" else 0)
    case.seq_lens[0] = pages * page_size  # the first row reaches its last program
    assert grid.page_table_launch(case.batch, case.width, page_size).grid == (case.batch, FOLD_AT, 2)
    out = _check_page_table(backend, case, with_seq_out=option == "offset")
    assert (out[case.batch:] == POISON).all()
    _check_triton_folded(backend, triton_launches)


@pytest.mark.parametrize("backend", BUILDS, indirect=True)
@pytest.mark.parametrize("with_start", (False, True))
@pytest.mark.parametrize("skip", (0, 2100))
def test_token_csr_on_a_folded_grid(folding, triton_launches, backend, with_start, skip):
    tokens = grid.items_per_program(grid.TOKEN_CSR)
    case = make_case(3, 64, max_pages=FOLD_AT * tokens // 64 + 2, device=DEVICE, with_start=with_start,
                     index_dtype=torch.int64 if with_start else torch.int32)
    case.seq_lens[0] = case.req_to_token.shape[1]  # the first row reaches its last program
    indptr, out = case.csr()
    indptr[0] -= skip  # starts before out: its programs count from its first token inside out
    # 4 programs per row on a (batch, 3, 2) grid.
    cols = case.req_to_token.shape[1]
    assert grid.token_csr_launch(case.batch, cols, out.shape[0]).grid == (case.batch, FOLD_AT, 2)
    _check_token_csr(backend, case, indptr, out)
    _check_triton_folded(backend, triton_launches)


@pytest.fixture
def auto_gpu_backend_first(monkeypatch):
    """Auto selection without ``KVDISPATCH_BACKEND``; on CPU, Triton (its interpreter) is put first."""
    for name in ("KVDISPATCH_BACKEND", "KVDISPATCH_STRICT", "KVDISPATCH_DEBUG"):
        monkeypatch.delenv(name, raising=False)
    if not HAS_GPU:
        if "triton" not in BACKENDS:
            pytest.skip("needs Triton")
        monkeypatch.setattr(devices, "_module_present", lambda name: True)
        monkeypatch.setattr(dispatch, "CPU_ORDER", ("triton", "torch", "cupy"))
    kvdispatch.reset()
    chosen = kvdispatch.select_backend(DEVICE)
    if chosen == "torch":
        pytest.skip("no GPU backend serves this device")
    return chosen


@pytest.mark.parametrize("op", ("page_table", "token_csr"))
@pytest.mark.parametrize("backend", [None] + GPU_BACKENDS, ids=lambda name: name or "auto")
def test_a_batch_beyond_the_grid_is_the_calls_value_error(auto_gpu_backend_first, monkeypatch, backend, op):
    """``None``: auto selection, whose backend stays selected. Nothing is written."""
    monkeypatch.setattr(grid, "MAX_GRID_X", 2)
    _forget_geometry()
    case = make_case(3, 16, device=DEVICE, with_start=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match=r"batch \(req_pool_indices.shape\[0\]\) must be at most 2 .*got 3"):
            if op == "page_table":
                out = case.page_table_out()
                page_table(backend, case.req_to_token, case.req_pool_indices, case.seq_lens, out, page_size=16,
                           kv_start_idx=case.kv_start_idx)
            else:
                indptr, out = case.csr()
                token_csr(backend, case.req_to_token, case.req_pool_indices, case.seq_lens, indptr, out,
                          kv_start_idx=case.kv_start_idx)
    assert (out == POISON).all()
    assert not [w for w in caught if "disabled" in str(w.message)]
    assert dispatch.selector.disabled(DEVICE) == {}
    assert kvdispatch.select_backend(DEVICE) == auto_gpu_backend_first
    _forget_geometry()


# ---------------------------------------------------------------- genuinely wide rows (GPU)

def _calls_twice(call, out, check):
    """Run ``call`` twice on a poisoned ``out`` (the second one takes the launcher's cached plan) and check
    each result."""
    for _ in range(2):
        out.fill_(POISON)
        call()
        torch.cuda.synchronize()
        check()


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU")
@pytest.mark.parametrize("backend", GPU_BACKENDS + [None], ids=lambda name: name or "auto")
@pytest.mark.parametrize("fill_value", (None, -1))
def test_page_table_wider_than_65535_programs(auto_gpu_backend_first, backend, fill_value):
    """Page 64: a row of 4.3M pages needs 67188 programs of 64 pages (grid (2, 65535, 2)). The table is one
    row of slots 0..C-1 (1.1 GB), so page p holds p; the second request stops 1000 pages short."""
    page_size, width = 64, 4_300_000
    assert grid.page_table_launch(2, width, page_size).grid == (2, 65535, 2)
    table = torch.arange(width * page_size, dtype=torch.int32, device=DEVICE).view(1, -1)
    pool = torch.zeros(2, dtype=torch.int32, device=DEVICE)
    lens = torch.tensor([width * page_size, (width - 1000) * page_size - 3], dtype=torch.int32, device=DEVICE)
    out = torch.empty(3, width, dtype=torch.int32, device=DEVICE)
    pages = torch.arange(width, dtype=torch.int32, device=DEVICE)
    short = width - 1000

    def check():
        assert torch.equal(out[0], pages)
        assert torch.equal(out[1, :short], pages[:short])
        assert (out[1, short:] == (POISON if fill_value is None else fill_value)).all()
        assert (out[2] == POISON).all()

    _calls_twice(lambda: kvdispatch.create_flashmla_kv_indices(table, pool, lens, out, page_size=page_size,
                                                               fill_value=fill_value, backend=backend), out, check)
    assert dispatch.selector.disabled(DEVICE) == {}
    assert kvdispatch.select_backend(DEVICE) == auto_gpu_backend_first


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU")
@pytest.mark.parametrize("backend", GPU_BACKENDS + [None], ids=lambda name: name or "auto")
def test_token_csr_wider_than_65535_programs(auto_gpu_backend_first, backend):
    """min(C, N) = 140M tokens: 68360 programs of 2048 (grid (1, 65535, 2)); 560 MB per tensor."""
    tokens = 140_000_000
    assert grid.token_csr_launch(1, tokens, tokens).grid == (1, 65535, 2)
    table = torch.arange(tokens, dtype=torch.int32, device=DEVICE).view(1, -1)
    pool = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    lens = torch.tensor([tokens], dtype=torch.int32, device=DEVICE)
    indptr = torch.tensor([0, tokens], dtype=torch.int32, device=DEVICE)
    out = torch.empty(tokens, dtype=torch.int32, device=DEVICE)

    def check():
        assert torch.equal(out, table[0])

    _calls_twice(lambda: kvdispatch.create_flashinfer_kv_indices(table, pool, lens, indptr, out, backend=backend),
                 out, check)
    assert dispatch.selector.disabled(DEVICE) == {}
    assert kvdispatch.select_backend(DEVICE) == auto_gpu_backend_first
