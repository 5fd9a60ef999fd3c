"""Every kernel specialisation the launchers can produce compiles for NVIDIA Hopper/Blackwell and AMD
CDNA3/CDNA4, on this machine, without a GPU.

Compilation runs in child processes without ``TRITON_INTERPRET`` (under it Triton's code generator does
not work in-process), all targets at once, with a Triton cache of their own. It takes minutes on two cores,
so these tests carry the ``crosscompile`` mark, which the default run deselects: the ``compile-triton``
lane (the installed, newest Triton) and the ``triton-oldest`` lane run them (``-m crosscompile``).
"""

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

from kernels_triton import crosscompile, dcp, token_csr  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TARGETS = {f"{b}:{a}:{w}": (b, a, w) for b, a, w in crosscompile.TARGETS}


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """Reports per target, compiled concurrently in child processes; prints one summary line per target."""
    import triton

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path_factory.mktemp("triton-cache"))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    children = {name: subprocess.Popen([sys.executable, "-m", "kernels_triton.crosscompile", "--json", name],
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
                for name in TARGETS}
    results = {}
    for name, child in children.items():
        stdout, stderr = child.communicate(timeout=1200)
        results[name] = (child.returncode, stdout, stderr)
        if child.returncode == 0:
            rows = json.loads(stdout)
            registers = [r["registers"] for r in rows if r["registers"] is not None]
            print(f"\n  Triton {triton.__version__}, {name}: {len(rows)} specialisations compiled; binary "
                  f"{min(r['binary_bytes'] for r in rows)}..{max(r['binary_bytes'] for r in rows)} B; registers "
                  f"max {max(registers) if registers else 'n/a'}", end="")
    return results


def _expected_count():
    return sum(1 for _ in crosscompile.specializations())


@pytest.mark.crosscompile
@pytest.mark.parametrize("target", list(TARGETS))
def test_every_specialisation_compiles(reports, target):
    returncode, stdout, stderr = reports[target]
    assert returncode == 0, stderr[-4000:]
    rows = json.loads(stdout)
    assert len(rows) == _expected_count()
    assert len({row["label"] for row in rows}) == len(rows)
    for row in rows:
        assert row["binary_bytes"] > 0, row
        # No shared memory but the draft kernel's prefix-sum reduction scratch (tens of bytes): nothing to
        # run out of on any part.
        assert row["shared_bytes"] <= (1024 if row["label"].startswith("_draft_decode_kernel") else 0), row
        warp = TARGETS[target][2]
        assert row["num_warps"] * warp in (64, 128, 256), row
        assert not row["griddepcontrol"], row  # no PDL instruction without the PDL specialisation


@pytest.mark.crosscompile
@pytest.mark.parametrize("target", list(TARGETS))
def test_native_launch_parameters(reports, target):
    """Every specialisation takes its runtime arguments then Triton's two scratch pointers, all 8 bytes
    wide, as kvdispatch/host_path.c passes them: on NVIDIA read from the PTX entry, on AMD from the
    AMDGPU metadata's kernel arguments (hidden ones after them are the runtime's), on the target's
    wavefronts."""
    returncode, stdout, stderr = reports[target]
    assert returncode == 0, stderr[-4000:]
    for row in json.loads(stdout):
        # The draft kernel's step and branch counts and a token mapping's length are 32-bit parameters: the
        # 64-bit words C passes are read by their low half on NVIDIA; on AMD such kernels take the Python path.
        narrow = row["label"].startswith("_draft_decode_kernel") or "HAS_MAPPING=1" in row["label"]
        if TARGETS[target][0] == "cuda" or not narrow:
            assert row["native_parameters"] == row["runtime_args"] + 2, row
        else:
            assert row["native_parameters"] is None, row


PDL_TARGETS = [name for name, (backend, _, _) in TARGETS.items() if backend == "cuda"]


@pytest.fixture(scope="module")
def pdl_reports(tmp_path_factory):
    """``--pdl`` reports for every target (none for HIP), compiled in one child process per target."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path_factory.mktemp("triton-cache-pdl"))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    children = {name: subprocess.Popen([sys.executable, "-m", "kernels_triton.crosscompile", "--json", "--pdl", name],
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
                for name in TARGETS}
    results = {}
    for name, child in children.items():
        stdout, stderr = child.communicate(timeout=1200)
        assert child.returncode == 0, stderr[-4000:]
        results[name] = json.loads(stdout)
    return results


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
        assert row["griddepcontrol"] == ["launch_dependents", "wait"], row
        assert row["native_parameters"] is None, row


def test_pdl_specialisations_are_one_per_kernel_with_pdl_set():
    specs = list(crosscompile.pdl_specializations())
    assert len({s.kernel.__name__ for s in specs}) == len(specs) == 7
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
    csr = [s for s in specs if "TOKENS_PER_PROGRAM" in s.constexprs]
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


def test_compile_command_reports_each_target(monkeypatch, capsys):
    """``kvdispatch compile``: every default target, or the ones named, one line each (the compilation itself
    is what the crosscompile-marked tests above prove)."""
    from kvdispatch import cli

    compiled = []

    def fake_cross_compile(target):
        compiled.append(target)
        return [crosscompile.CompileReport("k", str(target), size, None, 0, 2, 18, None) for size in (10, 30)]

    monkeypatch.setattr(crosscompile, "cross_compile", fake_cross_compile)
    assert cli.main(["compile"]) == 0
    assert compiled == list(crosscompile.TARGETS)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "cuda:90:32: 2 specialisations compiled, binaries 10..30 bytes" and len(lines) == 4
    compiled.clear()
    assert cli.main(["compile", "hip:gfx942:64"]) == 0
    assert compiled == [("hip", "gfx942", 64)]


def test_dcp_specialisations_cover_their_options():
    specs = [s for s in crosscompile.specializations() if s.kernel.__name__.startswith("_dcp_")]
    table = {(s.constexprs["PAGE_SIZE"], s.constexprs["VIRTUAL_PAGE"] // s.constexprs["PAGE_SIZE"])
             for s in specs if "VIRTUAL_PAGE" in s.constexprs}
    assert table == set(itertools.product(dcp.SPECIALISED_PAGE_SIZES, dcp.SPECIALISED_DCP_SIZES))
    csr = {(s.constexprs["DCP_SIZE"], s.constexprs["HAS_START"], s.constexprs["ROUND_TOWARD_ZERO"], s.signature["out_ptr"])
           for s in specs if "DCP_SIZE" in s.constexprs}
    assert len(csr) == len(dcp.SPECIALISED_DCP_SIZES) * 8
    assert len({s.label for s in specs}) == len(specs)
