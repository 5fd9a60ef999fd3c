"""One compilation per (kernel, page size, option flags, index dtypes), whatever the widths and strides.

Each launch is recorded where the launcher hands it to Triton (``KernelLauncher.plain``, the path that
compiles). Triton's own binder then computes the specialisation key of those arguments, on CPU too (it
needs no device): every launcher specialisation must map to exactly one Triton key. The launcher's
compiled-kernel cache is counted as well, and on a GPU so is Triton's per-device kernel cache.
"""

import random

import pytest
import torch

from conftest import DEVICE, HAS_GPU

triton = pytest.importorskip("triton")

import kernels_triton  # noqa: E402
from kernels_triton import crosscompile, launch, page_table, token_csr  # noqa: E402
from kvdispatch import ops  # noqa: E402

CALLS = 100


def _triton_binder(module):
    """Triton's argument binder for ``module``'s kernel (specialisation only; no compile, no device)."""
    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import make_backend
        from triton.runtime.jit import create_function_from_signature
    except ImportError as exc:  # pragma: no cover - other Triton layouts
        pytest.skip(f"this Triton has no create_function_from_signature/make_backend: {exc}")
    jit = next(module.compile_specializations(32, crosscompile.PAGE_SIZES, ("i32",))).kernel
    return create_function_from_signature(jit.signature, jit.params, make_backend(GPUTarget("cuda", 90, 32)))


@pytest.fixture
def recorded(monkeypatch):
    """``(launcher, args, constexprs, num_warps)`` of every launch that went through the plain path."""
    calls = []
    plain = launch.KernelLauncher.plain

    def spy(self, grid, args, constexprs, num_warps):
        calls.append((self, tuple(args), dict(constexprs), num_warps))
        return plain(self, grid, args, constexprs, num_warps)

    monkeypatch.setenv(launch.LAUNCH_ENV, "plain")  # every launch passes the spy
    monkeypatch.setattr(launch.KernelLauncher, "plain", spy)
    launch.reset(compiled=True)
    yield calls
    launch.reset(compiled=True)


def _triton_cache_size(kernel):
    """Kernels in Triton's own cache for the current device (GPU only; 0 under the interpreter)."""
    if not HAS_GPU:
        return 0
    return len(kernel.device_caches[torch.cuda.current_device()][0])


def _strided(rows, cols, extra, fill, rng):
    store = torch.full((rows, cols + extra), fill, dtype=torch.int32, device=DEVICE)
    return store[:, :cols]


def _random_page_table_call(rng, page_size, with_start, with_seq_out, with_fill, with_offset, index_dtype):
    batch = rng.randint(1, 4)
    rows = batch + rng.randint(0, 5)
    cols = rng.randint(1, 40) * page_size + rng.randint(0, page_size - 1)
    table = _strided(rows, cols, rng.randint(0, 9), 0, rng)
    table.copy_(torch.randint(0, 1 << 20, (rows, cols), dtype=torch.int32))
    to = dict(dtype=index_dtype, device=DEVICE)
    pool = torch.tensor(rng.sample(range(rows), batch), **to)
    lens = torch.tensor([rng.randint(-2, cols + 5) for _ in range(batch)], **to)
    start = torch.tensor([rng.randint(0, page_size * 2) for _ in range(batch)], **to) if with_start else None
    width = rng.randint(1, 40)
    out = _strided(batch + rng.randint(0, 2), width, rng.randint(0, 9), -7, rng)
    seq_out = torch.full((batch + 1,), -7, dtype=torch.int32, device=DEVICE) if with_seq_out else None
    offset = rng.choice((-3, -2, -1, 1, 2, 3)) if with_offset else 0
    fill = rng.randint(-5, 5) if with_fill else None
    return (table, pool, lens, out, page_size, start, offset, seq_out, fill)


def _specialisation_keys(calls, module):
    binder = _triton_binder(module)
    keys = {}
    for launcher, args, constexprs, num_warps in calls:
        if launcher is not module.launcher:
            continue
        _, specialization, options = binder(*args, **constexprs, num_warps=num_warps)
        ours = tuple(sorted(constexprs.items())) + tuple(str(a.dtype) for a in args if hasattr(a, "dtype"))
        keys.setdefault(ours, set()).add(repr(specialization) + repr(sorted(options.items())))
    return keys


@pytest.mark.representative("page_size")
@pytest.mark.parametrize("page_size", (1, 16, 96))
@pytest.mark.parametrize("options", ((False, False, False, False, torch.int32), (True, True, True, True, torch.int64)))
def test_page_table_one_compile_per_specialisation(recorded, page_size, options):
    rng = random.Random(page_size * 7 + options[0])
    compiled_before = _triton_cache_size(page_table.page_table_kernel)
    for _ in range(CALLS):
        call = _random_page_table_call(rng, page_size, *options)
        expected_out, expected_seq = call[3].clone(), None if call[7] is None else call[7].clone()
        ops.page_table.reference(*call[:3], expected_out, page_size, call[5], call[6], expected_seq, call[8])
        kernels_triton.build_page_table(*call)
        torch.testing.assert_close(call[3], expected_out, rtol=0, atol=0)
    keys = _specialisation_keys(recorded, page_table)
    assert keys, "no launch went through Triton"
    assert all(len(triton_keys) == 1 for triton_keys in keys.values()), keys
    # Random widths, strides and buffer alignments: one specialisation for the fixed options (row alignment
    # is a runtime argument).
    assert len(keys) == 1
    assert page_table.launcher.compile_count == len(keys)
    if HAS_GPU:
        assert _triton_cache_size(page_table.page_table_kernel) - compiled_before <= len(keys)


@pytest.mark.parametrize("with_start", (False, True))
def test_token_csr_one_compile_per_specialisation(recorded, with_start):
    rng = random.Random(11 + with_start)
    compiled_before = _triton_cache_size(token_csr.token_csr_kernel)
    for _ in range(CALLS):
        batch = rng.randint(1, 4)
        rows = batch + rng.randint(0, 4)
        cols = rng.randint(1, 300)
        table = _strided(rows, cols, rng.randint(0, 9), 0, rng)
        table.copy_(torch.randint(0, 1 << 20, (rows, cols), dtype=torch.int32))
        pool = torch.tensor(rng.sample(range(rows), batch), device=DEVICE)
        lens = torch.tensor([rng.randint(0, cols) for _ in range(batch)], device=DEVICE)
        start = torch.tensor([rng.randint(0, 5) for _ in range(batch)], device=DEVICE) if with_start else None
        indptr = torch.cumsum(torch.cat([torch.zeros(1, dtype=torch.long, device=DEVICE), lens]), 0)
        out = torch.full((int(indptr[-1]) + rng.randint(0, 50),), -7, dtype=torch.int32, device=DEVICE)
        expected = out.clone()
        ops.token_csr.reference(table, pool, lens, indptr, expected, start)
        kernels_triton.build_token_indices(table, pool, lens, indptr, out, start)
        torch.testing.assert_close(out, expected, rtol=0, atol=0)
    keys = _specialisation_keys(recorded, token_csr)
    assert len(keys) == 1 and all(len(k) == 1 for k in keys.values()), keys
    assert token_csr.launcher.compile_count == 1
    if HAS_GPU:
        assert _triton_cache_size(token_csr.token_csr_kernel) - compiled_before <= 1
