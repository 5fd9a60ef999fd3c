"""The device probe on simulated devices (any machine) and on the real one.

Simulated: NVIDIA H200 / B200 / A100, AMD MI300X / MI355X / RX 7900, unknown architectures, CPU; Triton or
CuPy missing, CuPy built for the other vendor or broken. ``read_device`` itself is checked against fake
device properties of both PyTorch builds (ROCm reports capability numbers that must not be used).
"""

import dataclasses
import re
import threading
import types
import warnings

import pytest
import torch

import kvdispatch
from kernels_cupy import backend as cupy_backend
from kvdispatch import devices, dispatch, info
from simdevices import (A100, B200, FUTURE_AMD, FUTURE_NVIDIA, GPU, H200, MI300X, MI355X, RX7900, Sim)

HAS_GPU = torch.cuda.is_available()

# raw device, family, warp size, whether kvdispatch builds Triton kernels for it
KNOWN = [
    (H200, "hopper", 32, True),
    (B200, "blackwell", 32, True),
    (A100, "ampere", 32, True),
    (MI300X, "cdna3", 64, True),
    (MI355X, "cdna4", 64, True),
    (RX7900, "rdna3", 32, True),
]


@pytest.fixture
def sim(monkeypatch):
    return Sim(monkeypatch)


@pytest.mark.parametrize("raw,family,warp,triton", KNOWN, ids=lambda v: getattr(v, "name", None))
def test_known_gpus(sim, raw, family, warp, triton):
    device = sim.add(raw)
    found = kvdispatch.probe(device)
    assert isinstance(found, kvdispatch.DeviceInfo)
    assert (found.vendor, found.arch, found.family, found.name) == (raw.vendor, raw.arch, family, raw.name)
    assert found.multiprocessors == raw.multiprocessors and found.warp_size == warp
    assert found.device == GPU
    assert found.usable("triton") is triton and found.usable("cupy") and found.usable("torch")
    assert dict(found.runtimes).keys() == {"triton", "cupy", "torch"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        found.arch = "sm_00"


def test_h200_facts(sim):
    found = kvdispatch.probe(sim.add(H200))
    assert (found.arch, found.family, found.multiprocessors, found.warp_size) == ("sm_90", "hopper", 132, 32)


def test_cpu(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    found = kvdispatch.probe("cpu")
    assert (found.vendor, found.arch, found.family, found.device) == ("cpu", "cpu", "cpu", "cpu")
    assert found.multiprocessors >= 1
    assert found.usable("torch")
    assert "CUDA and ROCm" in found.reason("cupy")
    assert found.usable("triton") == devices._module_present("triton")

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    kvdispatch.reset()  # TRITON_INTERPRET is read at probe time
    found = kvdispatch.probe(torch.device("cpu"))
    if devices._module_present("triton"):
        assert "TRITON_INTERPRET=1" in found.reason("triton")


@pytest.mark.parametrize("raw", [FUTURE_NVIDIA, FUTURE_AMD], ids=["sm_110", "gfx1250"])
def test_unknown_arch_takes_the_portable_path_with_one_warning(sim, raw):
    device = sim.add(raw)
    found = kvdispatch.probe(device)  # the probe itself never warns or fails
    assert found.family == "unknown" and found.arch == raw.arch
    assert found.warp_size == (32 if raw.vendor == "nvidia" else 64)
    assert raw.arch in found.reason("triton")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        chosen = {kvdispatch.select_backend(device) for _ in range(5)}
        kvdispatch.available_backends(device)
        dispatch.selector.choose(device, "auto")
    assert chosen == {"cupy"}  # CuPy compiles its source for whatever GPU it finds; never Triton here
    unknown = [w for w in caught if "unknown" in str(w.message)]
    assert len(unknown) == 1, [str(w.message) for w in caught]
    assert raw.arch in str(unknown[0].message) and "portable" in str(unknown[0].message)

    sim.modules(triton=True, cupy=False)
    kvdispatch.reset()
    with pytest.warns(RuntimeWarning, match=raw.arch):
        assert kvdispatch.select_backend(device) == "torch"


def test_unknown_vendor_is_not_a_crash(sim):
    device = sim.add(devices.RawDevice("xpu:0", "xpu", "xpu", "Some accelerator", 0, None), "xpu:0")
    found = kvdispatch.probe(device)
    assert (found.family, found.warp_size) == ("unknown", 1)
    assert not found.usable("triton") and not found.usable("cupy")
    with pytest.warns(RuntimeWarning, match="unknown xpu architecture"):
        assert kvdispatch.select_backend(device) == "torch"


def test_family_mapping_is_by_name_only():
    assert devices.family_of("amd", "gfx942") == "cdna3"
    assert devices.family_of("amd", "sm_90") == "unknown"
    assert devices.family_of("nvidia", "gfx942") == "unknown"
    assert devices.family_of("nvidia", "sm_90") == "hopper"
    assert devices.family_of("cpu", "cpu") == "cpu"
    assert devices.family_of("amd", "gfx1100") == "rdna3"


def _props(**kw):
    base = dict(name="GPU", major=0, minor=0, multi_processor_count=100, warp_size=None)
    base.update(kw)
    return types.SimpleNamespace(**base)


@pytest.mark.parametrize("props,hip,arch,family,warp", [
    # ROCm reports gfx942 as capability 9.4 and gfx90a as 9.0: read as numbers, 9.0 would be "hopper".
    (_props(name="AMD Instinct MI300X", major=9, minor=4, gcnArchName="gfx942:sramecc+:xnack-",
            multi_processor_count=304, warp_size=64), "6.4", "gfx942", "cdna3", 64),
    (_props(name="AMD Instinct MI250X", major=9, minor=0, gcnArchName="gfx90a:sramecc+:xnack-",
            multi_processor_count=110, warp_size=64), "6.4", "gfx90a", "cdna2", 64),
    (_props(name="AMD Instinct MI355X", major=9, minor=5, gcnArchName="gfx950:sramecc+:xnack-",
            multi_processor_count=256), "7.0", "gfx950", "cdna4", 64),
    (_props(name="AMD Radeon RX 7900 XTX", major=11, minor=0, gcnArchName="gfx1100",
            multi_processor_count=96), "6.4", "gfx1100", "rdna3", 32),
    (_props(name="AMD ???", major=9, minor=0, gcnArchName=""), "6.4", "unknown", "unknown", 64),
    (_props(name="NVIDIA H200", major=9, minor=0, multi_processor_count=132, warp_size=32), None, "sm_90",
     "hopper", 32),
    (_props(name="NVIDIA B200", major=10, minor=0, multi_processor_count=148), None, "sm_100", "blackwell", 32),
    (_props(name="NVIDIA A100", major=8, minor=0, multi_processor_count=108), None, "sm_80", "ampere", 32),
], ids=["mi300x", "mi250x", "mi355x", "rx7900", "no-arch-name", "h200", "b200", "a100"])
def test_read_device_from_properties(monkeypatch, props, hip, arch, family, warp):
    monkeypatch.setattr(torch.version, "hip", hip)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    raw = devices.read_device(torch.device("cuda", 0))
    assert (raw.vendor, raw.arch, raw.name) == ("amd" if hip else "nvidia", arch, props.name)
    assert raw.multiprocessors == props.multi_processor_count
    monkeypatch.setattr(cupy_backend, "reason_if_unsupported", lambda raw, family: "simulated: no CuPy")
    described = devices.describe(raw)
    assert (described.family, described.warp_size) == (family, warp)


def test_triton_missing(sim):
    sim.modules(triton=False, cupy=True)
    found = kvdispatch.probe(sim.add(H200))
    assert "Triton is not installed" in found.reason("triton")
    assert 'pip install triton, or from a kvdispatch checkout: pip install -e ".[triton]"' in found.reason("triton")
    assert found.usable("cupy")
    assert kvdispatch.select_backend(GPU) == "cupy"


@pytest.mark.parametrize("raw,cuda,package,extra", [(H200, "12.8", "cupy-cuda12x", "cuda12"),
                                                   (B200, "13.0", "cupy-cuda13x", "cuda13"),
                                                   (MI300X, None, "cupy-rocm-7-0", "rocm")],
                         ids=["cuda12", "cuda13", "rocm"])
def test_cupy_missing(monkeypatch, raw, cuda, package, extra):
    sim = Sim(monkeypatch, cupy=False, cuda_version=cuda)
    found = kvdispatch.probe(sim.add(raw))
    assert "CuPy is not installed" in found.reason("cupy")
    assert f'pip install {package}, or from a kvdispatch checkout: pip install -e ".[{extra}]"' in found.reason("cupy")
    assert found.usable("triton")


def test_cupy_built_for_rocm_on_an_nvidia_gpu(monkeypatch):
    sim = Sim(monkeypatch, cupy_vendor="amd")
    found = kvdispatch.probe(sim.add(H200))
    reason = found.reason("cupy")
    assert "built for AMD" in reason and "NVIDIA" in reason
    assert "pip install cupy-cuda12x" in reason
    with pytest.raises(kvdispatch.BackendUnavailableError, match="built for AMD") as raised:
        dispatch.selector.choose(torch.device(GPU), "cupy")
    assert '".[cuda12]"' in str(raised.value)


def test_cupy_built_for_cuda_on_an_amd_gpu(monkeypatch):
    sim = Sim(monkeypatch, cupy_vendor="nvidia")
    reason = kvdispatch.probe(sim.add(MI300X)).reason("cupy")
    assert "built for NVIDIA" in reason and "AMD" in reason and "pip install cupy-rocm-7-0" in reason


def test_broken_cupy_does_not_break_the_probe(monkeypatch):
    sim = Sim(monkeypatch, cupy_vendor="broken")
    found = kvdispatch.probe(sim.add(H200))
    assert "CuPy failed to import" in found.reason("cupy")
    assert kvdispatch.select_backend(GPU) == "triton"


def test_nothing_but_torch(monkeypatch):
    sim = Sim(monkeypatch, triton=False, cupy=False)
    device = sim.add(MI355X)
    assert kvdispatch.available_backends(device) == ["torch"]
    assert kvdispatch.select_backend(device) == "torch"


def test_probe_runs_once_per_device(sim):
    sim.add(H200, "cuda:0")
    sim.add(MI300X, "cuda:1")
    first = kvdispatch.probe("cuda:0")
    for device in ("cuda:0", torch.device("cuda", 0), torch.device("cuda:0")):
        assert kvdispatch.probe(device) is first
    kvdispatch.select_backend("cuda:0")
    kvdispatch.available_backends("cuda:0")
    assert kvdispatch.probe("cuda:1").arch == "gfx942"
    kvdispatch.select_backend("cuda:1")
    assert sim.calls == {"cuda:0": 1, "cuda:1": 1}
    kvdispatch.reset()
    kvdispatch.probe("cuda:0")
    assert sim.calls["cuda:0"] == 2


def test_probe_is_thread_safe(sim):
    sim.add(H200, "cuda:0")
    sim.add(B200, "cuda:1")
    sim.delay = 0.05  # a slow read: every thread arrives while the first is still probing
    barrier = threading.Barrier(8)
    found, errors = [None] * 8, []

    def worker(i):
        try:
            barrier.wait()
            found[i] = kvdispatch.probe(f"cuda:{i % 2}")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sim.calls == {"cuda:0": 1, "cuda:1": 1}
    assert all(f is found[0] for f in found[0::2]) and all(f is found[1] for f in found[1::2])
    assert found[0].arch == "sm_90" and found[1].arch == "sm_100"


def test_probe_of_the_default_device():
    expected = torch.device("cuda", torch.cuda.current_device()) if HAS_GPU else torch.device("cpu")
    assert kvdispatch.probe().device == str(expected)
    assert kvdispatch.probe() is kvdispatch.probe(expected)


def test_info_report_runs(monkeypatch, capsys):
    monkeypatch.delenv("KVDISPATCH_BACKEND", raising=False)
    data = info.collect()
    assert data["devices"][0]["device"] == "cpu" and data["devices"][0]["chosen"] == "torch"
    assert "torch" in data["devices"][0]["available"]
    assert info.report() == 0 and info.report(as_json=True) == 0
    assert "chosen backend" in capsys.readouterr().out


def test_info_report_names_a_bad_env_value(monkeypatch):
    monkeypatch.setenv("KVDISPATCH_BACKEND", "fastest")
    entry = info.collect()["devices"][0]
    assert entry["chosen"].startswith("error:") and "auto, triton, cupy, torch" in entry["chosen"]


@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU")
def test_real_gpu():
    found = kvdispatch.probe("cuda")
    assert found.vendor in ("nvidia", "amd")
    assert found.family != "unknown", f"add {found.arch} ({found.name}) to kvdispatch.devices"
    assert found.multiprocessors > 0
    assert found.warp_size == (32 if found.vendor == "nvidia" else found.warp_size)
    assert found.usable("torch")
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    assert found.name == props.name and found.multiprocessors == props.multi_processor_count
    if "H200" in found.name:
        assert (found.arch, found.family, found.multiprocessors, found.warp_size) == ("sm_90", "hopper", 132, 32)
        assert found.usable("triton"), found.reason("triton")
    if devices._module_present("cupy"):
        assert found.usable("cupy"), found.reason("cupy")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible to PyTorch here")
@pytest.mark.parametrize("device", ["cuda", "cuda:0", torch.device("cuda", 1)])
def test_a_cuda_device_without_a_gpu_is_a_clear_value_error(device):
    """Not the assertion of PyTorch's CPU-only build: a ValueError naming the device and why."""
    for ask in (kvdispatch.select_backend, kvdispatch.probe, kvdispatch.available_backends):
        with pytest.raises(ValueError, match=r"^device cuda(:\d)?: no GPU here: (this PyTorch|PyTorch sees no GPU)"):
            ask(device)


def test_errors_about_the_cpu_name_it_once(monkeypatch):
    """A forced backend that cannot serve the CPU: "cannot serve cpu: ...", with no "(cpu, cpu)" pair; a GPU
    keeps its architecture and family."""
    monkeypatch.delenv("KVDISPATCH_BACKEND", raising=False)
    with pytest.raises(kvdispatch.BackendUnavailableError) as info:
        dispatch.selector.choose(torch.device("cpu"), "cupy")
    assert str(info.value).startswith("backend 'cupy' cannot serve cpu: ") and "(cpu" not in str(info.value)
    sim = Sim(monkeypatch, cupy=False)
    gpu = sim.add(H200)
    with pytest.raises(kvdispatch.BackendUnavailableError, match=r"serve cuda:0 NVIDIA H200 \(sm_90, hopper\): "):
        dispatch.selector.choose(gpu, "cupy")


def test_install_hints_name_the_extras_packages():
    """Each backend's install hint names the package its extra in pyproject.toml requires."""
    import tomllib
    from pathlib import Path

    from kernels_cupy import backend as cupy_backend
    from kernels_triton import backend as triton_backend

    extras = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    for packages in (triton_backend.PACKAGES, cupy_backend.PACKAGES):
        for extra, package in packages.items():
            names = [re.split(r"[<>=!~ ]", requirement)[0] for requirement in extras[extra]]
            assert package in names, (extra, package, extras[extra])
