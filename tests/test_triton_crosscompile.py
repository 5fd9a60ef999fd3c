"""Every kernel compiles for NVIDIA Hopper/Blackwell and AMD CDNA3/CDNA4 with every option, on this machine,
without a GPU (the pairwise selection: each ordinary specialisation, and each value of every option built
together with each value of every other); and ``kvdispatch compile``: its options, its Triton cache and its
progress lines.

Compilation runs in ``crosscompile``'s worker processes (spawned without ``TRITON_INTERPRET``, under which
Triton's code generator does not work), all targets in one pool, with a Triton cache of their own. Compiling
the selection takes minutes on two cores, so those tests carry the ``crosscompile`` mark, which the
default run deselects: the ``compile-triton`` lane (the installed, newest Triton) and the ``triton-oldest`` lane
run them (``-m crosscompile``). The command's own tests compile a handful of specialisations for one target.
"""

import collections
import dataclasses
import itertools
import os
import re

import pytest

pytest.importorskip("triton")

import kernels_triton  # noqa: E402
from kernels_triton import crosscompile, dcp, launch, token_csr  # noqa: E402
from kvdispatch import cli  # noqa: E402

TARGETS = {crosscompile.target_name(target): target for target in crosscompile.TARGETS}


def _compile_every_target(selection):
    """Rows (``CompileReport`` as dicts) per target name, compiled in one pool."""
    reports = crosscompile.cross_compile(TARGETS.values(), selection)
    return {crosscompile.target_name(target): [dataclasses.asdict(r) for r in rows] for target, rows in reports.items()}


@pytest.fixture(scope="module")
def reports():
    """Rows per target; prints one summary line per target."""
    import triton

    results = _compile_every_target(crosscompile.PAIRS)
    for name, rows in results.items():
        registers = [r["registers"] for r in rows if r["registers"] is not None]
        print(f"\n  Triton {triton.__version__}, {name}: {len(rows)} specialisations compiled; binary "
              f"{min(r['binary_bytes'] for r in rows)}..{max(r['binary_bytes'] for r in rows)} B; registers "
              f"max {max(registers) if registers else 'n/a'}", end="")
    return results


def _expected_count():
    return sum(1 for _ in crosscompile.specializations())


@pytest.mark.crosscompile
@pytest.mark.parametrize("target", list(TARGETS))
def test_pairwise_specialisations_compile(reports, target):
    rows = reports[target]
    assert [row["label"] for row in rows] == [s.label for s in crosscompile.PAIRS.specializations(TARGETS[target])]
    assert len({row["label"] for row in rows}) == len(rows)
    for row in rows:
        assert row["binary_bytes"] > 0, row
        # No shared memory but the summing kernels' reduction scratch (tens of bytes; the page tables' for
        # their overflow scan): nothing to run out of on any part.
        summing = row["label"].startswith(("_draft_decode_kernel", "_decode_metadata_kernel", "_cache_locs_kernel",
                                           "_merged_token_csr_kernel", "_page_table_kernel",
                                           "_translated_page_table_kernel"))
        assert row["shared_bytes"] <= (1024 if summing else 0), row
        warp = TARGETS[target][2]
        assert row["num_warps"] * warp in (64, 128, 256), row
        assert not row["griddepcontrol"], row  # no PDL instruction without the PDL specialisation


@pytest.mark.crosscompile
@pytest.mark.parametrize("target", list(TARGETS))
def test_native_launch_parameters(reports, target):
    """Every specialisation compiled takes its runtime arguments then Triton's two scratch pointers, all 8 bytes
    wide, as kvdispatch/host_path.c passes them: on NVIDIA read from the PTX entry, on AMD from the
    AMDGPU metadata's kernel arguments (hidden ones after them are the runtime's), on the target's
    wavefronts."""
    for row in reports[target]:
        # The draft kernel's step and branch counts and a token mapping's or v2p's length are 32-bit parameters: the
        # 64-bit words C passes are read by their low half on NVIDIA; on AMD such kernels take the Python path.
        narrow = (row["label"].startswith("_draft_decode_kernel") or "HAS_MAPPING=1" in row["label"]
                  or re.search(r"V2P_PAGE_SIZE=[1-9]", row["label"]) is not None)
        if TARGETS[target][0] == "cuda" or not narrow:
            assert row["native_parameters"] == row["runtime_args"] + 2, row
        else:
            assert row["native_parameters"] is None, row


PDL_TARGETS = [name for name, (backend, _, _) in TARGETS.items() if backend == "cuda"]


@pytest.fixture(scope="module")
def pdl_reports():
    """``Selection(pdl=True)`` rows for every target (none for HIP)."""
    return _compile_every_target(crosscompile.Selection(pdl=True))


@pytest.mark.crosscompile
@pytest.mark.parametrize("target", list(TARGETS))
def test_pdl_specialisations_compile_with_the_grid_dependency_instructions(pdl_reports, target):
    """Hopper and Blackwell: each kernel's PDL specialisation compiles, its PTX holds ``griddepcontrol.wait``
    and ``griddepcontrol.launch_dependents``, and the compiled host path refuses it (``launch_pdl``). AMD
    targets have no PDL specialisation."""
    rows = pdl_reports[target]
    if target not in PDL_TARGETS:
        assert rows == []
        return
    kernels = {spec.kernel.__name__ for spec in crosscompile.specializations(32, (64,), ("i32",))}
    assert {row["label"].split("[")[0] for row in rows} == kernels and len(rows) == len(kernels)
    for row in rows:
        assert "PDL=1" in row["label"] and row["binary_bytes"] > 0, row
        assert row["griddepcontrol"] == ("launch_dependents", "wait"), row
        assert row["native_parameters"] is None, row


def test_every_kernel_module_contributes():
    """``specializations`` walks every module of the backend's kernel table once, each contributes, and together
    they compile every kernel a launcher launches."""
    modules = crosscompile.kernel_modules()
    assert [module.__name__ for module in modules] == [
        f"kernels_triton.{name}" for name in dict.fromkeys(module for module, _ in kernels_triton.KERNELS.values())]
    specs = list(crosscompile.specializations())
    per_module = collections.Counter(spec.kernel.fn.__module__ for spec in specs)
    assert set(per_module) == {module.__name__ for module in modules}
    for module in modules:
        own = list(module.compile_specializations(32, crosscompile.PAGE_SIZES, ("i32", "i64")))
        assert per_module[module.__name__] == len(own) > 0, module.__name__
    launched = {launcher.kernel.fn.__name__ for launcher in launch._launchers
                if launcher.kernel.fn.__module__.startswith("kernels_triton.")}
    assert launched == {spec.kernel.__name__ for spec in specs}


def test_pdl_specialisations_are_one_per_kernel_with_pdl_set():
    specs = list(crosscompile.pdl_specializations())
    assert len({s.kernel.__name__ for s in specs}) == len(specs) == len(
        {s.kernel.__name__ for s in crosscompile.specializations()})
    assert all(s.constexprs["PDL"] is True and s.signature["PDL"] == "constexpr" for s in specs)
    assert all(s.constexprs["PDL"] is False for s in crosscompile.specializations())


def test_specialisations_cover_every_option():
    every_spec = list(crosscompile.specializations())
    specs = [s for s in every_spec
             if s.kernel.__name__ != "_draft_decode_kernel" and not s.kernel.__name__.startswith("_dcp_")]
    page_sizes = {s.constexprs["PAGE_SIZE"] for s in specs if "PAGE_SIZE" in s.constexprs}
    assert page_sizes == set(crosscompile.PAGE_SIZES)
    flags = {tuple(s.constexprs[k] for k in ("HAS_START", "HAS_SEQ_LENS_OUT", "HAS_FILL", "UNIT_STRIDES",
                                            "FOLDED_GRID"))
             for s in specs if "HAS_START" in s.constexprs and "PAGE_SIZE" in s.constexprs}
    assert len(flags) == 32  # every combination
    csr_flags = {(s.constexprs["HAS_START"], s.constexprs["FOLDED_GRID"]) for s in specs
                 if "TOKENS_PER_PROGRAM" in s.constexprs}
    assert len(csr_flags) == 4
    csr = [s for s in specs if "TOKENS_PER_PROGRAM" in s.constexprs and not s.constexprs["V2P_PAGE_SIZE"]]
    options = {(s.signature["out_ptr"], s.constexprs["ENTRY_PAGE_SIZE"], s.constexprs["HAS_MAPPING"],
                s.constexprs["HAS_START"], s.signature["pool_ptr"]) for s in csr}
    assert options == set(itertools.product(("*i32", "*i64"), token_csr.SPECIALISED_ENTRY_PAGE_SIZES, (False, True),
                                            (False, True), ("*i32", "*i64")))
    ordinary = [s for s in csr if s.constexprs["ENTRY_PAGE_SIZE"] == 1 and not s.constexprs["HAS_MAPPING"]
                and s.signature["out_ptr"] == "*i32"]
    assert len(ordinary) == 32 and len(csr) == 32 + 44  # every flag combination; the options on the usual grid
    assert all(s.constexprs["mapping_ptr"] is None and s.signature["mapping_len"] == "constexpr" for s in ordinary)
    mha = [s for s in specs if "HAS_SWA" in s.constexprs]
    assert {(s.constexprs["PAGE_SIZE"], s.constexprs["HAS_SWA"], s.constexprs["ROUND_TOWARD_ZERO"],
             s.constexprs["FOLDED_GRID"], s.signature["mapping_ptr"]) for s in mha if s.constexprs["HAS_SWA"]} == set(
        itertools.product(crosscompile.PAGE_SIZES, (True,), (False, True), (False, True), ("*i32", "*i64")))
    translated = [s for s in specs if "HAS_MULTIPLIER" in s.constexprs]
    assert {(s.constexprs["HAS_MULTIPLIER"], s.constexprs["HAS_DELTA"], s.signature["v2p_ptr"])
            for s in translated} == set(itertools.product((False, True), (False, True), ("*i32", "*i64")))
    draft = [s for s in every_spec if s.kernel.__name__ == "_draft_decode_kernel"]
    draft_options = {(s.constexprs["PAGE_SIZE"], s.signature["pool_ptr"], s.signature["out_ptr"],
                      s.constexprs["HAS_POSITIONS"], s.constexprs["HAS_V2P"]) for s in draft}
    assert len(draft_options) == 3 * 2 * 2 * 3 and any(s.constexprs["FOLDED_GRID"] for s in draft)


def test_ordinary_specialisations_are_those_without_options():
    """The default of ``kvdispatch compile``: per kernel, page size and dtype, contiguous vectors and no option."""
    every = crosscompile.specializations()
    ordinary = crosscompile.ORDINARY.specializations(crosscompile.TARGETS[0])
    assert [s.label for s in ordinary] == [s.label for s in every if crosscompile.is_ordinary(s)]
    assert {s.kernel.__name__ for s in ordinary} == {s.kernel.__name__ for s in crosscompile.specializations()}
    assert {s.constexprs["PAGE_SIZE"] for s in ordinary if s.kernel.__name__ == "_page_table_kernel"} == set(
        crosscompile.PAGE_SIZES)
    for spec in ordinary:
        assert spec.constexprs.get("UNIT_STRIDES", True) is True and spec.constexprs["PDL"] is False, spec.label
        assert not any(v for k, v in spec.constexprs.items() if isinstance(v, bool) and k != "UNIT_STRIDES"), spec.label


def test_pairwise_selection_builds_every_option_with_every_other():
    """Per kernel, every pair of features (constexpr values, pointer dtypes, warps) that some specialisation has
    together is in a chosen one; every ordinary specialisation is chosen; the order is the full list's; and the
    selection is a small part of the product."""
    every = crosscompile.Selection().specializations(crosscompile.TARGETS[0])
    chosen = crosscompile.PAIRS.specializations(crosscompile.TARGETS[0])
    labels = [s.label for s in chosen]
    assert labels == [s.label for s in every if s.label in set(labels)]
    assert {s.label for s in every if crosscompile.is_ordinary(s)} <= set(labels)
    for kernel in {s.kernel.__name__ for s in every}:
        def pairs(specs, kernel=kernel):
            return set().union(*(crosscompile._pairs(s) for s in specs if s.kernel.__name__ == kernel))
        assert pairs(chosen) == pairs(every), kernel
    assert len(chosen) * 5 < len(every)
    page_table = [s for s in chosen if s.kernel.__name__ == "_page_table_kernel"]
    for name in ("HAS_START", "HAS_FILL", "WIDE_INDEXING", "ROUND_TOWARD_ZERO"):
        for page_size in crosscompile.PAGE_SIZES:
            assert any(s.constexprs[name] and s.constexprs["PAGE_SIZE"] == page_size for s in page_table), name


class _FakeCrossCompile:
    """Stands in for ``crosscompile.cross_compile``: records its arguments and reports ``total`` compilations of
    10 and 30 bytes per target, calling ``progress`` after each."""

    def __init__(self, total=20):
        self.total, self.calls = total, []

    def __call__(self, targets, selection, *, jobs, cache_dir, progress):
        self.calls.append(dict(targets=list(targets), selection=selection, jobs=jobs, cache_dir=cache_dir))
        reports = {}
        for target in targets:
            reports[target] = [crosscompile.CompileReport("k", str(target), 10 + 20 * (i % 2), None, 0, 2, 18, None)
                               for i in range(self.total)]
            for done in range(1, self.total + 1):
                progress(target, done, self.total)
        return reports


@pytest.mark.parametrize("argv, expected", [
    ([], dict(targets=list(crosscompile.TARGETS), selection=crosscompile.ORDINARY, jobs=crosscompile.default_jobs(),
              cache_dir=None)),
    (["hip:gfx942:64", "--all", "-j", "3", "--cache-dir", "kernels"],
     dict(targets=[("hip", "gfx942", 64)], selection=crosscompile.Selection(), jobs=3, cache_dir="kernels")),
    (["--pairs"], dict(targets=list(crosscompile.TARGETS), selection=crosscompile.PAIRS,
                       jobs=crosscompile.default_jobs(), cache_dir=None)),
    (["cuda:100:32", "--pdl", "--jobs", "1"],
     dict(targets=[("cuda", 100, 32)], selection=crosscompile.Selection(ordinary=True, pdl=True), jobs=1,
          cache_dir=None)),
])
def test_compile_command_options(monkeypatch, capsys, argv, expected):
    fake = _FakeCrossCompile()
    monkeypatch.setattr(crosscompile, "cross_compile", fake)
    assert cli.main(["compile", *argv]) == 0
    assert fake.calls == [expected]


@pytest.mark.parametrize("argv, message", [
    (["cuda:90"], "target 'cuda:90': expected backend:arch:warp_size with backend cuda or hip, e.g. cuda:90:32"),
    (["rocm:gfx942:64"], "target 'rocm:gfx942:64': expected backend:arch:warp_size"),
    (["--jobs", "0"], "argument --jobs/-j: expected a positive whole number, got '0'"),
    (["--all", "--pdl"], "argument --pdl: not allowed with argument --all"),
    (["--all", "--pairs"], "argument --pairs: not allowed with argument --all"),
])
def test_compile_command_rejects_bad_options(monkeypatch, capsys, argv, message):
    fake = _FakeCrossCompile()
    monkeypatch.setattr(crosscompile, "cross_compile", fake)
    assert cli.main(["compile", *argv]) == 2
    out, err = capsys.readouterr()
    assert err.startswith(f"kvdispatch: error: {message}") and len(err.splitlines()) == 1, err
    assert fake.calls == [] and out == ""


def test_compile_command_prints_progress_and_a_line_per_target(monkeypatch, capsys):
    """A first line saying what is compiled where, a progress line per tenth of each target's compilations
    (flushed as they come), then one line per target."""
    monkeypatch.setattr(crosscompile, "cross_compile", _FakeCrossCompile(total=20))
    assert cli.main(["compile", "cuda:90:32", "hip:gfx950:64", "-j", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    ordinary = len(crosscompile.ORDINARY.specializations(crosscompile.TARGETS[0]))
    assert lines[0] == (f"compiling the ordinary specialisations ({ordinary} of {_expected_count()}; --all: every one) "
                        f"for 2 target(s), {2 * ordinary} compilations, with Triton {_triton_version()} in 2 "
                        f"process(es); Triton cache: a temporary directory, removed at the end")
    progress = [re.fullmatch(r"(\S+): (\d+)/20 \(\d+ s\)", line).groups() for line in lines[1:21]]
    assert progress == [(name, str(done)) for name in ("cuda:90:32", "hip:gfx950:64") for done in range(2, 21, 2)]
    assert lines[21:23] == ["cuda:90:32: 20 specialisations compiled, binaries 10..30 bytes",
                            "hip:gfx950:64: 20 specialisations compiled, binaries 10..30 bytes"]
    assert re.fullmatch(r"done in \d+ s", lines[23]) and len(lines) == 24


def _triton_version():
    import triton

    return triton.__version__


def test_worker_environment(tmp_path, monkeypatch):
    """While the pool lives: no TRITON_INTERPRET, TRITON_CACHE_DIR the named directory (created, kept) or a
    private temporary one (0700, removed at the end); afterwards the environment as it was."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "users-cache"))
    named = tmp_path / "named" / "cache"
    with crosscompile._worker_environment(str(named)):
        assert "TRITON_INTERPRET" not in os.environ and os.environ["TRITON_CACHE_DIR"] == str(named)
        (named / "kernel.bin").write_bytes(b"x")
    assert (named / "kernel.bin").exists()
    with crosscompile._worker_environment(None):
        private = os.environ["TRITON_CACHE_DIR"]
        assert os.stat(private).st_mode & 0o777 == 0o700 and os.listdir(private) == []
    assert not os.path.exists(private)
    assert os.environ["TRITON_INTERPRET"] == "1" and os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "users-cache")
    monkeypatch.delenv("TRITON_CACHE_DIR")
    with crosscompile._worker_environment(None):
        pass
    assert "TRITON_CACHE_DIR" not in os.environ


def test_compile_command_compiles_a_handful(capsys, monkeypatch):
    """``kvdispatch compile cuda:90:32 --pdl``: one real compilation per kernel in two worker processes (from this
    process, which runs under TRITON_INTERPRET when there is no GPU), progress lines, into the
    private cache, which goes with their files at the end."""
    removed = []
    real_rmtree = crosscompile.shutil.rmtree

    def rmtree(path, **kwargs):
        removed.append(sum(len(names) for _, _, names in os.walk(path)))
        real_rmtree(path, **kwargs)

    monkeypatch.setattr(crosscompile.shutil, "rmtree", rmtree)
    assert cli.main(["compile", "cuda:90:32", "--pdl", "-j", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    kernels = len(list(crosscompile.pdl_specializations()))
    step = -(-kernels // 10)  # a progress line every tenth of the compilations, and at the last
    assert [re.fullmatch(r"cuda:90:32: (\d+)/(\d+) \(\d+ s\)", line).groups() for line in lines[1:-2]] == [
        (str(done), str(kernels)) for done in range(1, kernels + 1) if done % step == 0 or done == kernels]
    assert re.fullmatch(rf"cuda:90:32: {kernels} specialisations compiled, binaries \d+\.\.\d+ bytes", lines[-2])
    assert len(removed) == 1 and removed[0] >= kernels  # the workers wrote to the private cache, removed with it


def test_dcp_specialisations_cover_their_options():
    specs = [s for s in crosscompile.specializations() if s.kernel.__name__.startswith("_dcp_")]
    table = {(s.constexprs["PAGE_SIZE"], s.constexprs["VIRTUAL_PAGE"] // s.constexprs["PAGE_SIZE"])
             for s in specs if "VIRTUAL_PAGE" in s.constexprs}
    assert table == set(itertools.product(dcp.SPECIALISED_PAGE_SIZES, dcp.SPECIALISED_DCP_SIZES))
    csr = {(s.constexprs["DCP_SIZE"], s.constexprs["HAS_START"], s.constexprs["ROUND_TOWARD_ZERO"],
            s.signature["out_ptr"]) for s in specs if "DCP_SIZE" in s.constexprs}
    assert len(csr) == len(dcp.SPECIALISED_DCP_SIZES) * 8
    assert len({s.label for s in specs}) == len(specs)
