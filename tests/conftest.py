"""Test configuration: which backends run here, on which device.

Without a GPU the Triton kernels run in Triton's interpreter on CPU tensors, so TRITON_INTERPRET is set
before anything imports them. ``KVDISPATCH_BACKEND`` (set by the GPU CI lanes) narrows the backends
under test to that one; ``backend=None`` then goes through the variable, as an engine's call would.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

HAS_GPU = torch.cuda.is_available()
if not HAS_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")
DEVICE = torch.device("cuda") if HAS_GPU else torch.device("cpu")

import kvdispatch  # noqa: E402  (after TRITON_INTERPRET)


def _have(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def backends_under_test() -> list[str]:
    forced = os.environ.get("KVDISPATCH_BACKEND") or "auto"
    if forced != "auto":
        return [forced]
    names = ["torch"]
    if _have("triton"):
        names.append("triton")
    if HAS_GPU and _have("cupy"):
        names.append("cupy")
    if not HAS_GPU:
        names.append("cupy-host")
    return names


def skip_module_unless_cupy_serves_the_gpu() -> None:
    """Skip the calling test module (at its import) unless there is a GPU, CuPy is installed and it can serve
    that GPU."""
    if not HAS_GPU:
        pytest.skip("no CUDA/ROCm device", allow_module_level=True)
    pytest.importorskip("cupy", reason="CuPy is not installed")
    reason = kvdispatch.probe("cuda").reason("cupy")
    if reason is not None:
        pytest.skip(f"CuPy cannot serve this device: {reason}", allow_module_level=True)


def require_host_path(device_index: int | None = None):
    """The compiled host path for ``device_index``; skips where it cannot be here (no C compiler, or off by a
    setting: ``KVDISPATCH_HIP_HOST_PATH`` on AMD) and fails where it should be and is not (a failed build or
    self-check)."""
    from kvdispatch import host_path

    module = host_path.load(device_index)
    if module is None:
        reason = host_path.failure()
        if host_path.compiler() is None or (reason or "").startswith(host_path.NotEnabledError.__name__):
            pytest.skip(f"the compiled host path is not available here: {reason}")
        pytest.fail(f"the compiled host path failed here: {reason}")
    return module


BACKENDS = backends_under_test()
GPU_BACKENDS = [b for b in BACKENDS if b != "torch"]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """``@pytest.mark.representative(*names)`` on a parametrized test: of its cases with the same values of the
    parameters ``names`` and of ``backend``, one stays in the default run and the others are marked
    ``exhaustive`` (deselected by default; the cpu-exhaustive CI lane runs them). The test's ``i``-th such group
    keeps its ``i``-th case (modulo its size), so the default run spreads over the other parameters' values and
    keeps the same cases whatever else is collected. On a GPU every case stays in the default run (the GPU
    lanes run it once per backend)."""
    if HAS_GPU:
        return
    groups = {}  # test function -> {values of its names and backend -> its cases}
    for item in items:
        marker = item.get_closest_marker("representative")
        if marker is not None:
            params = item.callspec.params
            key = tuple(repr(params.get(name)) for name in (*marker.args, "backend"))
            groups.setdefault(item.function, {}).setdefault(key, []).append(item)
    for test_groups in groups.values():
        for i, members in enumerate(test_groups.values()):
            kept = members[i % len(members)]
            for item in members:
                if item is not kept:
                    item.add_marker(pytest.mark.exhaustive)


@pytest.fixture(autouse=True)
def _fresh_selection():
    """Every test starts with no cached selection, probe or disabled backend."""
    kvdispatch.reset()
    yield
    kvdispatch.reset()


def through(backend, name, /, *args, **kwargs):
    """``kvdispatch.<name>(*args, **kwargs)`` on ``backend`` (``cupy-host``: the CUDA source built for the host;
    the backend ``KVDISPATCH_BACKEND`` names: ``backend=None``, through the variable)."""
    if backend == "cupy-host":
        import cuda_host

        return getattr(cuda_host, name)(*args, **kwargs)
    return getattr(kvdispatch, name)(*args, backend=None if backend == os.environ.get("KVDISPATCH_BACKEND")
                                     else backend, **kwargs)


def _on_backend(name):
    """``through`` bound to the builder ``name``: called as ``builder(backend, *args, **kwargs)``."""

    def build(backend, *args, **kwargs):
        return through(backend, name, *args, **kwargs)

    build.__name__ = build.__qualname__ = name
    return build


page_table = _on_backend("create_flashmla_kv_indices")
token_csr = _on_backend("create_flashinfer_kv_indices")
mha_page_table = _on_backend("create_trtllm_mha_page_table")
translated_page_table = _on_backend("create_translated_page_table")
dcp_token_csr = _on_backend("create_dcp_kv_indices")
dcp_page_table = _on_backend("create_dcp_page_table")


@pytest.fixture
def compat(monkeypatch, backend):
    """``kvdispatch.compat.sglang`` with its builders routed to ``backend`` (cupy-host has no dispatch entry); a
    test using it is parametrized over ``backend``."""
    from kvdispatch.compat import sglang
    from kvdispatch.compat.sglang import _common

    name = backend
    monkeypatch.setattr(_common, "_build_page_table", lambda *a, backend=None, **k: page_table(name, *a, **k))
    monkeypatch.setattr(_common, "_build_token_csr", lambda *a, backend=None, **k: token_csr(name, *a, **k))
    monkeypatch.setattr(_common, "_build_mha_page_table",
                        lambda *a, backend=None, **k: mha_page_table(name, *a, **k))
    monkeypatch.setattr(_common, "_build_translated_page_table",
                        lambda *a, backend=None, **k: translated_page_table(name, *a, **k))
    monkeypatch.setattr(_common, "_build_dcp_token_csr", lambda *a, backend=None, **k: dcp_token_csr(name, *a, **k))
    monkeypatch.setattr(_common, "_build_dcp_page_table", lambda *a, backend=None, **k: dcp_page_table(name, *a, **k))
    monkeypatch.setattr(_common, "_build_draft_decode",
                        lambda *a, backend=None, **k: through(name, "create_draft_decode_kv_indices", *a, **k))
    return sglang

