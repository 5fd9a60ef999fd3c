"""The compiled host path (``kvdispatch/host_path.c``) pointed at stubs, for its CPU tests (each launcher's:
``test_triton_native.py``, ``test_cupy_native.py``).

The extension is built here and configured with a ``cuLaunchKernel`` that records what it is given, a
``cuCtxGetCurrent`` and a stream query, with CPU tensors as the launch device type (``is_cpu``, device index
offset 1, so CPU is device 0). ``random_call`` and ``random_csr_call`` draw the public arguments of valid
calls, in the order the replay entry takes them (the API's, without ``backend`` and ``enable_pdl``).
"""

from __future__ import annotations

import ctypes

import pytest
import torch

from kvdispatch import host_path

CONTEXT = 0xC0FFEE
FUNCTION = 0xF00D
STREAM_BASE = 5000
PAGE_TABLE = host_path.OPS["page_table"]
LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_void_p,
                          ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)
CONTEXT_QUERY = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p))


class Stubs:
    """What the extension is configured with in these tests, and what it was asked to launch."""

    def __init__(self, count: int):
        self.launches = []
        self.count = count  # parameters of the registered kernel (what the stub launch reads)
        self.result = 0  # what the stub launch returns (nonzero: a failed launch)
        self.context = CONTEXT
        self.launch = LAUNCH(self._launch)
        self.current_context = CONTEXT_QUERY(self._current_context)

    def _launch(self, function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        values = [ctypes.cast(params[i], ctypes.POINTER(ctypes.c_uint64))[0] for i in range(self.count)]
        self.launches.append(dict(function=function, grid=(gx, gy, gz), block=(bx, by, bz), shared=shared,
                                  stream=stream, params=values, extra=extra))
        return self.result

    def _current_context(self, out):
        out[0] = self.context
        return 0


def build(tmp_path_factory):
    """The extension, built into a fresh directory (skips without a C compiler)."""
    if host_path.compiler() is None:
        pytest.skip("no C compiler")
    return host_path.build(tmp_path_factory.mktemp("host_path"))


def install(built, monkeypatch, count: int) -> Stubs:
    """``built`` configured with new stubs (reading ``count`` parameters per launch) and installed as
    ``host_path``'s module, approvals empty; returns the stubs (``.module``: the extension)."""
    stubs = Stubs(count)
    built.configure(ctypes.cast(stubs.launch, ctypes.c_void_p).value,
                    ctypes.cast(stubs.current_context, ctypes.c_void_p).value,
                    lambda index: STREAM_BASE + index, torch.Tensor, host_path.tensor_shim("cpu"),
                    host_path.INDEX_OFFSET["cpu"])
    monkeypatch.setattr(host_path, "_module", built)
    monkeypatch.setattr(host_path, "_approved", {})
    stubs.module = built
    return stubs


def check_approvals_follow_the_hooks(stubs, hooks, call, other_launcher: str) -> None:
    """A launcher's selector hooks (``hooks.on_selected``, ``hooks.on_deselected``) approve and withdraw the
    C path for ``call`` (a page-table call whose replay plan is registered, for that launcher, on device 0);
    ``other_launcher``'s withdrawal leaves its approval alone."""
    gpu = type("FakeCuda", (), {"type": "cuda", "index": 0})()  # CPU tensors are device 0 here

    def replayed():
        return stubs.module.replay(PAGE_TABLE, None, *call)

    hooks.on_selected(gpu, "token_csr", None)
    assert replayed() is NotImplemented  # approved for the other op only
    hooks.on_selected(gpu, "page_table", None)
    assert replayed() is call[3]
    host_path.on_deselected(other_launcher, gpu)
    assert replayed() is call[3]
    hooks.on_deselected(gpu)
    assert replayed() is NotImplemented
    hooks.on_selected(gpu, "page_table", None)
    hooks.on_deselected(None)
    assert replayed() is NotImplemented
    assert len(stubs.launches) == 2
    hooks.on_selected(gpu, "page_table", None)  # selected again: the plan (kept, as Python's is) serves
    assert replayed() is call[3]
    assert len(stubs.launches) == 3


def unsigned(values) -> list[int]:
    """Kernel arguments as the launch receives them: tensors as their addresses, ints as 64-bit words."""
    return [(v.data_ptr() if isinstance(v, torch.Tensor) else v) % 2**64 for v in values]


def sibling(t, fill_seed=0):
    """A tensor of ``t``'s dtype, shape and strides, in memory of its own at the same 16-byte alignment, with
    other contents."""
    if t.numel() == 0:
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype)
    extent = 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    offset = (t.data_ptr() % 16) // t.element_size()
    g = torch.Generator().manual_seed(fill_seed)
    base = torch.randint(-9, 9, (extent + offset + 16,), generator=g).to(t.dtype)
    assert base.data_ptr() % 16 == 0
    return base.as_strided(t.shape, t.stride(), offset)


def siblings(args):
    return [sibling(a, i) if isinstance(a, torch.Tensor) else a for i, a in enumerate(args)]


def random_call(seed, page_size=None, with_start=None, options=None):
    """The public arguments of a random valid page-table call: odd shapes, strided and int64 vectors."""
    g = torch.Generator().manual_seed(seed)

    def pick(choices):
        return choices[int(torch.randint(len(choices), (1,), generator=g))]

    page_size = page_size or pick((1, 16, 64, 96, 4096))
    rows, cols, batch, width = (int(torch.randint(lo, hi, (1,), generator=g))
                                for lo, hi in ((2, 40), (1, 300), (1, 17), (1, 50)))
    table = torch.randint(-5, 1 << 20, (rows, cols + pick((0, 3))), generator=g, dtype=torch.int32)[:, :cols]

    def vector(low, high):
        v = torch.randint(low, high, (batch * pick((1, 2)),), generator=g).to(pick((torch.int32, torch.int64)))
        return v[::2] if v.shape[0] > batch else v

    pool, lens = vector(-1, rows + 1), vector(-3, cols + 5)
    if with_start is None:
        with_start = bool(pick((0, 1)))
    start = vector(-1, cols) if with_start else None
    out = torch.randint(-9, 9, (batch + pick((0, 2)), width + pick((0, 5))), generator=g, dtype=torch.int32)
    out = out[:, :width] if pick((0, 1)) else out
    options = options if options is not None else pick(("", "lens_out", "fill", "lens_out fill"))
    lens_out = torch.zeros(batch + 1, dtype=torch.int32) if "lens_out" in options else None
    fill = int(torch.randint(-100, 100, (1,), generator=g)) if "fill" in options else None
    offset = int(torch.randint(-3, 4, (1,), generator=g))
    return [table, pool, lens, out, page_size, start, offset, lens_out, fill, False]  # round_toward_zero


def random_csr_call(seed, with_start=None):
    """The public arguments of a random valid token-CSR call (strided and int64 vectors)."""
    g = torch.Generator().manual_seed(seed)
    rows, cols, batch, n = (int(torch.randint(lo, hi, (1,), generator=g)) for lo, hi in ((2, 30), (1, 5000),
                                                                                        (1, 9), (1, 9000)))
    table = torch.randint(0, 1 << 20, (rows, cols + 3), generator=g, dtype=torch.int32)[:, :cols]

    def vector(low, high, length=batch):
        dtype = (torch.int32, torch.int64)[int(torch.randint(2, (1,), generator=g))]
        return torch.randint(low, high, (2 * length,), generator=g).to(dtype)[::2]

    if with_start is None:
        with_start = bool(torch.randint(2, (1,), generator=g))
    start = vector(0, cols) if with_start else None
    return [table, vector(-1, rows + 1), vector(-2, cols + 3), vector(-5, n, batch + 1),
            torch.zeros(n, dtype=torch.int32), start, 1, None]  # entry_page_size, token_mapping
