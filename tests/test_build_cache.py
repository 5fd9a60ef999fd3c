"""The build cache (``kvdispatch._build_cache``) loads only what no other user could have written.

A planted library is a real shared object whose constructor creates a marker file when it is loaded: each
refusal below checks that the marker is absent, so the planted code never ran. Files and directories of
another user are made with ``chown`` (root only; skipped otherwise).
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import stat
import subprocess
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

import cuda_host  # noqa: E402
from conftest import page_table  # noqa: E402
from kvcases import make_case  # noqa: E402
from kernels_triton import launch  # noqa: E402
from kernels_triton import page_table as triton_page_table  # noqa: E402
from kvdispatch import ops
from kvdispatch import _build_cache, host_path  # noqa: E402
from kvdispatch._build_cache import UntrustedPathError  # noqa: E402

OTHER_USER = 65534  # nobody
MARKER_ENV = "PLANTED_LIBRARY_MARKER"
PLANTED_SOURCE = f"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void planted(void) {{
    const char *marker = getenv("{MARKER_ENV}");
    FILE *file = marker ? fopen(marker, "w") : NULL;
    if (file) fclose(file);
}}
"""


@pytest.fixture(scope="module")
def planted_library(tmp_path_factory):
    """A shared object that creates ``$PLANTED_LIBRARY_MARKER`` when it is loaded."""
    if host_path.compiler() is None:
        pytest.skip("no C compiler")
    folder = tmp_path_factory.mktemp("planted")
    (folder / "planted.c").write_text(PLANTED_SOURCE)
    subprocess.run([host_path.compiler(), "-shared", "-fPIC", "-o", str(folder / "planted.so"),
                    str(folder / "planted.c")], check=True)
    return folder / "planted.so"


@pytest.fixture
def marker(tmp_path, monkeypatch):
    path = tmp_path / "planted-library-ran"
    monkeypatch.setenv(MARKER_ENV, str(path))
    return path


@pytest.fixture
def plant(planted_library):
    """``plant(directory)``: the planted library under the compiled launcher's name in ``directory``."""

    def plant(directory: Path) -> Path:
        target = directory / host_path.library_name()
        target.write_bytes(planted_library.read_bytes())
        target.chmod(0o700)
        return target

    return plant


def give_away(path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    os.lchown(path, OTHER_USER, OTHER_USER)


def private(path: Path) -> Path:
    path.mkdir(mode=0o700)
    return path


def test_a_planted_library_runs_when_loaded(planted_library, marker):
    """The marker works: loading the planted library directly runs its constructor."""
    ctypes.CDLL(str(planted_library))
    assert marker.exists()


@pytest.mark.parametrize("mode", (0o770, 0o707, 0o1777))
def test_writable_cache_is_refused(tmp_path, plant, marker, mode):
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(mode)
    plant(cache)
    with pytest.raises(UntrustedPathError, match=f"{cache} is writable by group or others"):
        host_path.build(cache)
    assert not marker.exists()


def test_writable_library_is_refused(tmp_path, plant, marker):
    library = plant(private(tmp_path / "cache"))
    library.chmod(0o775)
    with pytest.raises(UntrustedPathError, match=f"{library} is writable by group or others"):
        host_path.build(library.parent)
    assert not marker.exists()


@pytest.mark.parametrize("owned_by_other", ("cache", "parent", "library"))
def test_files_of_another_user_are_refused(tmp_path, plant, marker, owned_by_other):
    parent = tmp_path / "parent"
    parent.mkdir(mode=0o755)
    cache = private(parent / "cache")
    library = plant(cache)
    refused = {"cache": cache, "parent": parent, "library": library}[owned_by_other]
    give_away(refused)
    with pytest.raises(UntrustedPathError, match=f"{refused} .*owned by uid {OTHER_USER}"):
        host_path.build(cache)
    assert not marker.exists()


@pytest.mark.parametrize("link", ("cache", "library"))
def test_symbolic_links_are_refused(tmp_path, plant, marker, link):
    """The linked directory and library are private and ours: only the link is refused."""
    real = private(tmp_path / "real")
    planted = plant(real)
    if link == "cache":
        cache = tmp_path / "link"
        cache.symlink_to(real)
        refused = cache
    else:
        cache = private(tmp_path / "cache")
        refused = cache / planted.name
        refused.symlink_to(planted)
    with pytest.raises(UntrustedPathError, match=f"{refused} is a symbolic link"):
        host_path.build(cache)
    assert not marker.exists()


def test_symbolic_link_above_the_cache_is_resolved(tmp_path):
    real = private(tmp_path / "real")
    (tmp_path / "alias").symlink_to(real)
    assert _build_cache.private_dir(tmp_path / "alias" / "cache") == real / "cache"


def test_writable_parent_is_refused_unless_sticky(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(UntrustedPathError, match=f"{shared} .*writable by group or others and not sticky"):
        _build_cache.private_dir(shared / "mine")
    assert not (shared / "mine").exists()
    shared.chmod(0o1777)  # as /tmp: others cannot rename or remove what is ours
    assert stat.S_IMODE((_build_cache.private_dir(shared / "mine")).stat().st_mode) == 0o700


def test_the_cache_is_created_private(tmp_path, monkeypatch):
    if host_path.compiler() is None:
        pytest.skip("no C compiler")
    monkeypatch.setenv(_build_cache.CACHE_ENV, str(tmp_path / "a" / "b"))
    module = host_path.build()
    for directory in (tmp_path / "a", tmp_path / "a" / "b"):
        status = directory.lstat()
        assert stat.S_ISDIR(status.st_mode) and stat.S_IMODE(status.st_mode) == 0o700
        assert status.st_uid == os.geteuid()
    library = tmp_path / "a" / "b" / host_path.library_name()
    assert [p.name for p in library.parent.iterdir()] == [library.name]
    assert stat.S_IMODE(library.stat().st_mode) == 0o700 and library.stat().st_uid == os.geteuid()
    assert Path(module.__file__) == library and callable(module.replay)


def test_default_root(tmp_path, monkeypatch):
    monkeypatch.delenv(_build_cache.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert _build_cache.root() == tmp_path / "xdg" / "kvdispatch"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert _build_cache.root() == tmp_path / "home" / ".cache" / "kvdispatch"


def test_a_failed_build_leaves_nothing(tmp_path, monkeypatch):
    compiler = tmp_path / "cc"
    compiler.write_text('#!/bin/sh\nfor a; do out="$a"; done\necho partial > "$out"\nexit 1\n')
    compiler.chmod(0o700)
    monkeypatch.setenv("CC", str(compiler))
    cache = tmp_path / "cache"
    with pytest.raises(RuntimeError, match="failed"):
        host_path.build(cache)
    assert list(cache.iterdir()) == []


def test_refusal_warns_once_and_python_serves(tmp_path, plant, marker, monkeypatch):
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(0o777)
    plant(cache)
    monkeypatch.setattr(host_path, "_module", None)
    monkeypatch.setattr(host_path, "_failure", None)
    monkeypatch.setenv(_build_cache.CACHE_ENV, str(cache))
    with pytest.warns(RuntimeWarning, match="calls take the Python path: higher host time per call") as caught:
        assert host_path.load() is None
        assert host_path.load() is None  # no second attempt
    reason = f"UntrustedPathError: {cache} is writable by group or others"
    assert host_path.failure().startswith(reason)
    assert len(caught) == 1 and reason in str(caught[0].message)
    assert not marker.exists()

    launcher = launch.KernelLauncher(triton_page_table.page_table_kernel, triton_page_table.CONSTEXPRS)
    signature = dict.fromkeys(triton_page_table.PARAMETERS, "i64")
    launcher.compiled[(0, "spec")] = type("Compiled", (), {"src": type("Source", (), {"signature": signature})()})()
    monkeypatch.setattr(launch, "native_parameter_count", lambda compiled, runtime_args: runtime_args + 2)
    monkeypatch.setenv(launch.LAUNCH_ENV, "native")
    with pytest.raises(RuntimeError, match=f"compiled launcher cannot launch this kernel \\({reason}"):
        launcher.replay_launch(0, "spec", (1, 1, 1), (0,) * len(triton_page_table.PARAMETERS))

    case = make_case(5, 16, with_start=True)
    out = case.page_table_out()
    expected = out.clone()
    ops.page_table.reference(case.req_to_token, case.req_pool_indices, case.seq_lens, expected, case.page_size,
                               case.kv_start_idx)
    page_table("torch", case.req_to_token, case.req_pool_indices, case.seq_lens, out, page_size=case.page_size,
               kv_start_idx=case.kv_start_idx)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_host_build_dir_is_private(tmp_path, monkeypatch):
    monkeypatch.setenv(_build_cache.CACHE_ENV, str(tmp_path / "cache"))
    directory = cuda_host.build_dir()
    assert directory == tmp_path / "cache" / "cuda-host"
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    directory.chmod(0o777)
    with pytest.raises(UntrustedPathError, match=f"{directory} is writable by group or others"):
        cuda_host.build_dir()


RANKS = 8


def build_as_a_rank(cache: Path, results) -> None:
    try:
        module = host_path.build(cache)
        results.put((module.__file__, callable(module.replay)))
    except Exception as exc:  # reported by the test
        results.put((repr(exc), False))


def test_ranks_building_at_once_each_load_the_one_complete_library(tmp_path, monkeypatch):
    """Eight processes on an empty cache: every one compiles (the compiler waits until all eight have
    started), every one loads the library, and one file is left. The ranks are forked: spawned ones
    would each import torch again, seconds apiece."""
    if host_path.compiler() is None:
        pytest.skip("no C compiler")
    started = tmp_path / "started"
    started.mkdir()
    compiler = tmp_path / "cc"
    compiler.write_text(f'#!/bin/sh\n: > "{started}/$$"\n'
                        f'for _ in $(seq 600); do [ "$(ls "{started}" | wc -l)" -ge {RANKS} ] && break; sleep 0.05; '
                        f'done\nexec "{host_path.compiler()}" "$@"\n')
    compiler.chmod(0o700)
    monkeypatch.setenv("CC", str(compiler))
    cache = tmp_path / "cache"
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    ranks = [context.Process(target=build_as_a_rank, args=(cache, results)) for _ in range(RANKS)]
    for rank in ranks:
        rank.start()
    loaded = [results.get(timeout=120) for _ in ranks]
    for rank in ranks:
        rank.join(timeout=30)
    library = cache / host_path.library_name()
    assert loaded == [(str(library), True)] * RANKS
    assert [rank.exitcode for rank in ranks] == [0] * RANKS
    assert len(list(started.iterdir())) == RANKS
    assert [p.name for p in cache.iterdir()] == [library.name]


RANK_SCRIPT = """
import sys, torch, kvdispatch
from kvdispatch import host_path
rank = int(sys.argv[1])
device = torch.device("cuda", rank % torch.cuda.device_count())
torch.cuda.set_device(device)
table = torch.arange(4 * 4096, dtype=torch.int32, device=device).view(4, 4096)
pool = torch.tensor([3, 1], dtype=torch.int32, device=device)
lens = torch.tensor([4096, 100], dtype=torch.int32, device=device)
out = torch.full((2, 64), -7, dtype=torch.int32, device=device)
for _ in range(3):  # the first call plans in Python, the later ones take the compiled launcher
    kvdispatch.create_flashmla_kv_indices(table, pool, lens, out, page_size=64, backend="triton")
torch.cuda.synchronize()
expected = torch.full((2, 64), -7, dtype=torch.int32)
expected[0] = torch.arange(64) + 3 * 64
expected[1, :2] = torch.tensor([64, 65])
assert torch.equal(out.cpu(), expected), out
assert host_path.load() is not None, host_path.failure()
print(host_path.load().__file__)
"""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_eight_engine_ranks_on_the_gpus_share_one_new_cache(tmp_path):
    """Eight processes, spread over every visible GPU as an engine's ranks are, make their first calls at
    once on an empty cache: each builds or finds the compiled launcher, loads the one complete library and
    gets correct tables through it."""
    cache = tmp_path / "cache"
    env = {**os.environ, "KVDISPATCH_CACHE_DIR": str(cache), "PYTHONPATH": os.pathsep.join(
        filter(None, [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH")]))}
    env.pop("KVDISPATCH_BACKEND", None)
    ranks = [subprocess.Popen(["python3", "-c", RANK_SCRIPT, str(rank)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for rank in range(RANKS)]
    results = [rank.communicate(timeout=300) for rank in ranks]
    assert [rank.returncode for rank in ranks] == [0] * RANKS, [err[-2000:] for _, err in results]
    library = cache / host_path.library_name()
    assert {out.strip() for out, _ in results} == {str(library)}
    assert [p.name for p in cache.iterdir()] == [library.name]
