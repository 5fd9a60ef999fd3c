"""The ``kvdispatch`` command line on its CPU path: ``bench`` (quick tiny runs, JSON, markdown, skipped
backends, failing on a wrong result), ``--version``, errors as one line with their exit status, and the example's
errors (``compile``: tests/test_triton_crosscompile.py).

The GPU path of the bench (CUDA-graph replay, host-cost ratios, compilation counts) runs on a GPU machine only.
"""

import argparse
import dataclasses
import importlib.util
import json
import math
import os
import pathlib
import subprocess
import sys
import types

import pytest
import torch

from kvdispatch import ops
from kvdispatch import cli, dispatch, grid
from kvdispatch.bench import core as bench
from kvdispatch.bench import page_table, token_csr

TINY = "1x256x16,2x128x1"
ROOT = pathlib.Path(__file__).resolve().parents[1]


def _run(capsys, tmp_path, *extra, cases=TINY):
    path = tmp_path / "bench.json"
    rc = cli.main(["bench", "--quick", "--device", "cpu", "--cases", cases, "--json", str(path), *extra])
    out, err = capsys.readouterr()
    return rc, json.loads(path.read_text()), out, err


def _error_lines(err):
    """stderr of a command that failed: exactly one line, ``kvdispatch: error: ...`` (or the example's)."""
    lines = err.splitlines()
    assert len(lines) == 1 and ": error: " in lines[0], err
    return lines


def _no_interpreter(monkeypatch):
    """CPU tensors without Triton's interpreter, as a user's machine has them (conftest turns it on)."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    dispatch.reset()


def _rows(data, impl):
    return [r for r in data["rows"] if r["impl"] == impl]


def test_quick_json(capsys, tmp_path):
    rc, data, out, err = _run(capsys, tmp_path)
    assert rc == 0, out
    assert data["device"] == "cpu" and not data["gpu"]
    assert "torch" in data["backends"]
    assert {r["case"] for r in data["rows"]} == {"1x256x16", "2x128x1"}
    for impl in ("api:torch", bench.PLAIN_TORCH):
        rows = _rows(data, impl)
        assert len(rows) == 2
        for row in rows:
            assert row["status"] == "ok" and row["timing"] == "wall-clock"
            assert row["time_us"] > 0 and row["vs_torch"] > 0
    assert [r["path"] for r in _rows(data, "api:torch")] == ["torch", "torch"]
    assert [r["path"] for r in _rows(data, bench.PLAIN_TORCH)] == ["", ""]  # baselines: no API path
    if "triton" in data["backends"]:  # the Triton interpreter (TRITON_INTERPRET=1): baselines run too
        for impl in ("api:triton", bench.NAIVE, page_table.GRID_2D):
            assert [r["status"] for r in _rows(data, impl)] == ["ok", "ok"]
        assert [r["path"] for r in _rows(data, "api:triton")] == ["triton", "triton"]  # CPU: never native
        assert all(r["vs_naive"] > 0 and r["vs_2d"] > 0 for r in _rows(data, "api:torch"))
    page1 = [r for r in data["rows"] if r["page_size"] == 1]
    assert all(r["gbps"] > 0 for r in page1)
    assert "skipped host cost, copy bandwidth, Triton compilations: measured on a GPU only" in out
    assert "all results correct" in out
    assert "[1/2] 1x256x16" in err and "[2/2] 2x128x1" in err


def test_markdown(capsys, tmp_path):
    rc, data, out, _ = _run(capsys, tmp_path, "--markdown", "--backends", "torch")
    assert rc == 0
    lines = [line for line in out.splitlines() if line.startswith("|")]
    assert lines[0].startswith("| case | impl | status | path |")  # then programs, where a row knows them
    assert "| µs/call |" in lines[0]
    assert set(lines[1]) <= set("|-:")
    assert len(lines) == 2 + len(data["rows"])
    assert any(line.startswith("| 2x128x1 | api:torch | ok |") for line in lines)


def _fake_torch_backend(monkeypatch, build_page_table):
    module = types.ModuleType("fake_bench_backend")
    module.kernel = lambda key: build_page_table if key == "page_table" else dispatch.OPS[key].reference
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(dispatch.REGISTRY, "torch", dispatch.Backend("torch", module.__name__))


def test_wrong_result_fails_the_run(capsys, tmp_path, monkeypatch):
    def off_by_one(req_to_token, req_pool_indices, seq_lens, out, page_size, *rest):
        ops.page_table.reference(req_to_token, req_pool_indices, seq_lens, out, page_size, *rest)
        out[-1, -1] += 1

    _fake_torch_backend(monkeypatch, off_by_one)
    rc, data, out, err = _run(capsys, tmp_path, "--backends", "torch")
    assert rc == 1
    assert [r["status"] for r in _rows(data, "api:torch")] == ["WRONG", "WRONG"]
    assert all(r["status"] == "ok" for r in _rows(data, bench.PLAIN_TORCH))  # the run went on
    assert "FAILED: 2 wrong result(s)" in out
    assert "entries differ" in out
    # stderr: the progress lines, then the error
    assert err.splitlines()[-1] == "kvdispatch: error: 2 wrong result(s): 1x256x16 api:torch; 2x128x1 api:torch"


def test_backend_error_is_reported_not_fatal(capsys, tmp_path, monkeypatch):
    def broken(*args):
        raise RuntimeError("launch failed")

    _fake_torch_backend(monkeypatch, broken)
    rc, data, out, _ = _run(capsys, tmp_path, "--backends", "torch")
    assert rc == 0
    assert [r["status"] for r in _rows(data, "api:torch")] == ["error", "error"]
    assert "RuntimeError: launch failed" in out


def test_every_op_has_a_case_module():
    assert list(bench.case_modules()) == list(dispatch.OPS)


def test_case_parsing():
    assert bench.parse_cases("1x131072x64, 256x32768x1") == [bench.Case(1, 131072, 64), bench.Case(256, 32768, 1)]
    assert bench.Case(1, 131072, 64).width == 2048 and bench.Case(2, 100, 64).width == 2
    assert bench.parse_cases("token_csr:64x4096,TOKEN_CSR:8x32768:map:e64:i64") == [
        bench.Case(64, 4096, 1, "token_csr"), bench.Case(8, 32768, 64, "token_csr", int64=True, mapping=True)]
    assert bench.Case.parse("page_table:64x32768x16") == bench.Case(64, 32768, 16)
    for name in ("token_csr:64x4096", "token_csr:64x4096:i64", "token_csr:64x4096:e16", "token_csr:64x4096:map",
                 "token_csr:8x32768:i64:e64:map", "64x32768x16"):
        assert bench.Case.parse(name).name == name
    for cases in map(bench.case_set, ("CPU", "CPU_QUICK", "GPU", "GPU_QUICK", "GPU_REAL", "GPU_REAL_QUICK")):
        assert any(name.startswith("token_csr:") for name in cases) and bench.parse_cases(",".join(cases))


@pytest.mark.parametrize("case", ["token_csr:2", "token_csr:2x64x1", "token_csr:2x64:i32", "token_csr:2x64:e0",
                                  "token_csr:2x64:e16:e32", "token_csr:2x64:ex", "token_csr:0x64"])
def test_bad_csr_cases(case):
    with pytest.raises(argparse.ArgumentTypeError, match="csr"):
        bench.Case.parse(case)


CSR_TINY = "token_csr:2x200,token_csr:3x100:i64:e16:map"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the Triton interpreter on CPU tensors: conftest turns it on "
                    "only where there is no GPU")
def test_csr_cases_run_every_backend_and_baseline(capsys, tmp_path):
    """Token-CSR cases through the command line: every backend under test and the csr-loop baseline (in
    Triton's interpreter) give the reference's result; ratios divide by the csr-loop row of the same case."""
    rc, data, out, _ = _run(capsys, tmp_path, cases=CSR_TINY)  # every backend that can run here
    assert rc == 0 and "all results correct" in out
    assert {"triton", "torch"} <= set(data["backends"])  # conftest turns the interpreter on
    impls = [f"api:{b}" for b in data["backends"]] + [token_csr.CSR_LOOP, bench.PLAIN_TORCH]
    for case in CSR_TINY.split(","):
        rows = {r["impl"]: r for r in data["rows"] if r["case"] == case}
        assert list(rows) == impls
        assert all(r["status"] == "ok" and r["time_us"] > 0 and r["vs_2d"] > 0 for r in rows.values())
        assert rows[token_csr.CSR_LOOP]["vs_2d"] == 1.0 and rows["api:torch"]["vs_naive"] is None
    assert data["rows"][-1]["page_size"] == 16


@pytest.mark.skipif(torch.cuda.is_available(), reason="the Triton interpreter on CPU tensors: conftest turns it on "
                    "only where there is no GPU")
@pytest.mark.parametrize("case", ["token_csr:3x100", "token_csr:3x100:i64:e16:map", "token_csr:2x64:e64"])
def test_csr_inputs_and_baselines_match_the_reference(case):
    case = bench.Case.parse(case)
    x = bench.make_inputs(case, torch.device("cpu"), seed=2)
    assert x.out.dtype == (torch.int64 if case.int64 else torch.int32) and x.out.shape == (case.batch * case.context,)
    assert x.req_to_token.shape[1] == case.width  # E > 1: one page id per E tokens
    if case.mapping:  # a permutation of the pool's slots
        assert torch.equal(x.token_mapping.sort().values, torch.arange(x.token_mapping.numel(), dtype=torch.int32))
    assert bool((x.expected >= 0).all()) and len(torch.unique(x.expected)) == x.expected.numel()
    for impl in ("api:torch", token_csr.CSR_LOOP, bench.PLAIN_TORCH):
        assert bench.check_eager(bench.bind(impl, x, case), x) == ""


@pytest.mark.parametrize("argv, says", [
    (["bench", "--cases", "1x2"], "argument --cases: a case is BATCHxCONTEXTxPAGE"),
    (["bench", "--cases", "csr:1x2"], "or OP:SHAPE with OP one of "),
    (["bench", "--cases", "token_csr:1x2:i16"], "argument --cases: a token-CSR case is token_csr:BATCHxCONTEXT"),
    (["bench", "--cases", "1x4096x64", "--backends", "vulkan"], "unknown backend 'vulkan'"),
    (["bench", "--device", "nonsense"], "'nonsense' is not a torch device"),
    ([], "the following arguments are required: command"),
])
def test_usage_errors_are_one_line_exit_2(capsys, argv, says):
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    [line] = _error_lines(err)
    assert says in line and out == ""


def test_inputs_match_the_reference():
    x = bench.make_inputs(bench.Case(3, 200, 16), torch.device("cpu"), seed=1)
    assert x.out.shape == (3, 13) and bool((x.seq_lens == 200).all())
    pages = x.req_to_token[x.req_pool_indices.long()] // 16
    assert torch.equal(x.expected, pages[:, ::16])
    assert len(torch.unique(x.req_to_token // 16)) == x.req_to_token.shape[0] * 13  # distinct physical pages


def test_plot(capsys, tmp_path):
    png = tmp_path / "bench.png"
    rc = cli.main(["bench", "--quick", "--cases", "1x256x16", "--backends", "torch", "--plot", str(png)])
    out, err = capsys.readouterr()
    if importlib.util.find_spec("matplotlib") is None:
        assert rc == 2 and "pip install matplotlib" in err
    else:
        assert rc == 0 and png.read_bytes()[:4] == b"\x89PNG"


def test_plot_without_matplotlib_names_installs_that_work_from_a_checkout(monkeypatch):
    """No index has kvdispatch itself: the hint installs matplotlib, or the extra from a checkout."""
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None if name == "matplotlib"
                        else find_spec(name, *args))
    with pytest.raises(argparse.ArgumentTypeError) as info:
        bench.plot_path("bench.png")
    assert str(info.value) == ('needs matplotlib: pip install matplotlib '
                               '(or, in a kvdispatch checkout, pip install -e ".[bench]")')


def test_rounds_are_interleaved_and_the_median_counts(monkeypatch):
    order, seen = [], {}
    factors = (1.0, 1.4, 1.2)  # the three rounds of each implementation: median 1.2

    def fake_wall_time(fn, device, reps):
        name = fn.func.__name__
        order.append(name)
        seen[name] = seen.get(name, -1) + 1
        return 10.0 * (len(name)) * factors[seen[name]]

    monkeypatch.setattr(bench, "wall_time_us", fake_wall_time)
    monkeypatch.setattr(bench, "count_compilations", lambda *a: [])
    reps = bench.Reps(rounds=3, host_batches=1)
    report = bench.run([bench.Case(1, 64, 16)], ["torch"], torch.device("cpu"), reps, progress=open("/dev/null", "w"))
    impls = len(report.rows)
    # api:torch and plain-torch everywhere; the Triton baselines too where TRITON_INTERPRET=1.
    assert impls >= 2 and all(r.status == "ok" for r in report.rows)
    assert order[:impls] == order[impls: 2 * impls] == order[2 * impls:]  # round after round, not row after row
    for row in report.rows:
        assert len(row.time_rounds) == 3
        assert row.time_us == row.host_us == pytest.approx(sorted(row.time_rounds)[1])
        assert row.time_us == pytest.approx(row.time_rounds[0] * 1.2)


@pytest.mark.parametrize("takes", [True, False], ids=["entry-launches", "entry-hands-back"])
def test_path_is_what_launched_the_repeated_call(monkeypatch, takes):
    """An API row's path: ``native`` when a compiled entry of dispatch launched its repeated eager call, else
    its backend; the entries are put back afterwards, and that call's result is checked too."""
    case = bench.Case(2, 128, 16)
    x = bench.make_inputs(case, torch.device("cpu"), 3)
    calls = []

    def entry(code, backend, *args):  # a stand-in for the C path: builds with the reference, or hands it back
        calls.append(args)
        if not takes:
            return NotImplemented
        ops.page_table.reference(*args)
        return args[3]

    monkeypatch.setattr(dispatch, "fast_replay", entry)
    row = bench.measure("api:torch", case, x, torch.device("cpu"), bench.Reps(rounds=1, host_batches=1))
    assert row.status == "ok" and row.path == ("native" if takes else "torch")
    assert dispatch.fast_replay is entry and len(calls) >= 2


def test_host_cost_is_divided_by_the_cases_own_add():
    """host/add_ of an API row uses the x.add_(1) timed in its case's rounds (passed to add_ratios), not
    the run's first reference: the host's speed drifts during a run."""
    case = bench.Case(1, 4096, 64)
    rows = [bench.Row(case.name, 1, 4096, 64, case.width, impl, time_us=2.0, host_us=host, timing="cuda-graph")
            for impl, host in (("api:triton", 6.0), (page_table.GRID_2D, 20.0), (bench.PLAIN_TORCH, 100.0))]
    bench.add_ratios(rows, 7.5, None)
    api = rows[0]
    assert api.add_host_us == 7.5 and api.host_vs_add == pytest.approx(0.8)
    assert api.host_vs_launch == pytest.approx(0.3)
    assert rows[1].host_vs_add is None and rows[2].add_host_us is None  # baselines carry no host ratio


# -- what a new user meets: skipped backends, the legend, one-line errors ------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU default device")
def test_cpu_bench_names_what_it_skipped_and_why(capsys, tmp_path, monkeypatch):
    _no_interpreter(monkeypatch)
    rc, data, out, _ = _run(capsys, tmp_path, "--markdown")
    assert rc == 0 and data["backends"] == ["torch"]
    reason = "CPU tensors run Triton kernels only in its interpreter: set TRITON_INTERPRET=1 before the first call"
    assert f"skipped triton: {reason}" in out.splitlines()
    assert f"skipped naive-loop and 2d-grid (Triton baselines): {reason}" in out.splitlines()
    assert any(line.startswith("skipped cupy: C") for line in out.splitlines())
    assert data["skipped"]["triton"] == reason
    assert {r["impl"] for r in data["rows"]} == {"api:torch", bench.PLAIN_TORCH}
    assert "all results correct" in out


def _markdown_columns(out):
    lines = [line.strip("|").split("|") for line in out.splitlines() if line.startswith("|")]
    head, body = [c.strip() for c in lines[0]], [[c.strip() for c in row] for row in lines[2:]]
    return {name: [row[i] for row in body] for i, name in enumerate(head)}


@pytest.mark.parametrize("interpreter", [False, True], ids=["no-interpreter", "interpreter"])
def test_no_column_is_empty(capsys, tmp_path, monkeypatch, interpreter):
    if not interpreter:
        _no_interpreter(monkeypatch)
    rc, data, out, _ = _run(capsys, tmp_path, "--markdown")
    assert rc == 0
    columns = _markdown_columns(out)
    for name, cells in columns.items():
        assert any(cell not in ("", "-") for cell in cells), f"column {name} is empty"
    assert "host µs" not in columns  # wall clock: the host time is the time
    assert ("/naive" in columns) == ("triton" in data["backends"])


def test_shown_columns_leave_out_what_nothing_measured():
    rows = [bench.Row("1x64x16", 1, 64, 16, 4, "api:torch", time_us=2.0, host_us=3.0, vs_torch=1.5),
            bench.Row("1x64x16", 1, 64, 16, 4, bench.PLAIN_TORCH, status="error", note="RuntimeError: x")]
    assert [h for h, _, _ in bench.shown_columns(rows)] == ["case", "impl", "status", "µs/call", "host µs",
                                                            "/torch", "note"]


def test_gpu_report_prints_measured_ratios_only():
    """A GPU run's header and footer (built here from made-up measurements): references and host-cost ratios,
    no thresholds."""
    case = bench.Case(1, 4096, 64)
    rows = [bench.Row(case.name, 1, 4096, 64, case.width, impl, time_us=2.0, host_us=host, timing="cuda-graph")
            for impl, host in (("api:triton", 6.0), (page_table.GRID_2D, 20.0), (bench.PLAIN_TORCH, 100.0))]
    bench.add_ratios(rows, 7.5, 4000.0)
    refs = bench.References(add_host_us=7.0, launch_host_us=15.0, touch_kernel_us=0.9, copy_gbps=4100.0)
    compilations = [bench.Compilations(64, 100, {"page_table": 1}, method="compile_count")]
    report = bench.Report("cuda:0", "GPU", True, "cuda-graph replay", "data", ["triton"], {}, refs,
                          compilations, rows)
    text = "\n".join(bench.header(report) + bench.footer(report))
    assert "references: x.add_(1) 7.00 host µs per call" in text and "device copy 4100 GB/s" in text
    assert "host cost of triton through the API (median over cases): 0.80x x.add_(1), 0.30x a plain " \
           "kernel[grid](...) launch of the 2d-grid baseline" in text
    assert "triton compilations, page 64, 100 random widths: page_table: 1 [ok]" in text
    assert "target" not in text and "<=" not in text
    assert "host µs" in [h for h, _, _ in bench.shown_columns(rows)]


def test_help_prints_the_legend(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["bench", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert bench.legend().strip() in out
    for name, _, _ in bench.COLUMNS:  # the legend explains every column
        assert f"  {name} " in bench.legend()


def test_unavailable_backend_is_an_error(capsys, monkeypatch):
    _no_interpreter(monkeypatch)
    assert cli.main(["bench", "--device", "cpu", "--backends", "torch,triton"]) == 2
    out, err = capsys.readouterr()
    assert _error_lines(err) == ["kvdispatch: error: backend 'triton' cannot run on cpu: CPU tensors run Triton "
                                 "kernels only in its interpreter: set TRITON_INTERPRET=1 before the first call"]
    assert out == ""  # nothing ran
    assert cli.main(["bench", "--device", "cpu", "--backends", "cupy"]) == 2
    assert "backend 'cupy' cannot run on cpu: " in _error_lines(capsys.readouterr().err)[0]


def test_unavailable_backend_from_the_shell():
    """``python -m kvdispatch`` as a user runs it: no Triton interpreter, no traceback."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    proc = subprocess.run([sys.executable, "-m", "kvdispatch", "bench", "--device", "cpu", "--backends", "triton"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert _error_lines(proc.stderr)[0].startswith("kvdispatch: error: backend 'triton' cannot run on cpu")


def test_version(capsys, monkeypatch):
    """``kvdispatch --version`` and ``kvdispatch info``: the installed distribution's version, or the package's
    ``__version__`` from a checkout that is not installed."""
    import kvdispatch
    from kvdispatch import info

    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"kvdispatch {info.kvdispatch_version()}\n"
    monkeypatch.setattr(info, "_version", lambda dist: None)  # not installed
    assert info.kvdispatch_version() == kvdispatch.__version__
    assert info.collect()["versions"]["kvdispatch"] == kvdispatch.__version__


def test_gpu_device_this_machine_lacks(capsys):
    missing = f"cuda:{torch.cuda.device_count()}" if torch.cuda.is_available() else "cuda"
    for command in ("bench", "demo"):
        assert cli.main([command, "--device", missing]) == 2
        [line] = _error_lines(capsys.readouterr().err)
        assert line.startswith(f"kvdispatch: error: argument --device: {missing}: ")


def test_demo_with_a_forced_backend_that_cannot_serve(capsys, monkeypatch):
    monkeypatch.setenv("KVDISPATCH_BACKEND", "cupy")
    assert cli.main(["demo", "--device", "cpu"]) == 2
    out, err = capsys.readouterr()
    [line] = _error_lines(err)
    assert line.startswith("kvdispatch: error: KVDISPATCH_BACKEND=cupy: backend 'cupy' cannot serve cpu")
    assert out == ""


@pytest.mark.parametrize("argv", [["--verbose", "demo", "--device", "cpu"], ["demo", "--device", "cpu", "-v"]])
def test_verbose_prints_the_traceback(capsys, monkeypatch, argv):
    monkeypatch.setenv("KVDISPATCH_BACKEND", "cupy")
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):")
    assert "BackendUnavailableError" in err
    assert err.splitlines()[-1].startswith("kvdispatch: error: KVDISPATCH_BACKEND=cupy: ")


def test_unexpected_failure_exits_1_naming_its_type(capsys, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("device lost\nsecond line")

    monkeypatch.setattr(bench, "run", broken)
    assert cli.main(["bench", "--device", "cpu", "--quick"]) == 1
    assert _error_lines(capsys.readouterr().err) == [
        "kvdispatch: error: RuntimeError: device lost (--verbose prints the traceback)"]


def _decode_loop():
    spec = importlib.util.spec_from_file_location("decode_loop_example", ROOT / "examples" / "decode_loop.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_example_with_an_unknown_backend(capsys):
    example = _decode_loop()
    assert example.main(["--backend", "bogus", "--steps", "1"]) == 2
    out, err = capsys.readouterr()
    assert _error_lines(err) == ["decode_loop.py: error: backend must be one of auto, triton, cupy, torch; "
                                 "got 'bogus'"]
    assert example.main(["--backend", "bogus", "--steps", "1", "--verbose"]) == 2
    assert capsys.readouterr().err.startswith("Traceback (most recent call last):")


@pytest.mark.parametrize("argv,words", [
    (["--page-size", "0"], "argument --page-size: must be in [1, 4096], got 0"),
    (["--page-size", "4097"], "argument --page-size: must be in [1, 4096], got 4097"),
    (["--batch", "0"], "argument --batch: must be at least 1, got 0"),
    (["--max-context", "-5"], "argument --max-context: must be at least 1, got -5"),
    (["--steps", "-1"], "argument --steps: must be at least 0, got -1"),
    (["--page-size", "x"], "argument --page-size: expected an integer, got 'x'"),
])
def test_example_refuses_bad_numbers_as_usage_errors(capsys, argv, words):
    """Out-of-range sizes are argparse's usage errors (exit status 2), not a ZeroDivisionError later."""
    with pytest.raises(SystemExit) as info:
        _decode_loop().main(argv)
    assert info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"decode_loop.py: error: {words}"


def test_pdl_chain_is_skipped_with_its_reason_without_a_gpu(capsys, tmp_path):
    """``--pdl-chain`` on CPU: nothing timed, the reason printed and in the JSON; the run still succeeds."""
    rc, data, out, _ = _run(capsys, tmp_path, "--pdl-chain", cases="1x256x16,token_csr:2x128")
    assert rc == 0 and data["rows"] == []
    assert data["skipped"]["PDL chains"] == "measured on a GPU only"
    assert data["skipped"]["PDL chains of token_csr:2x128"] == "measured on page-table cases (BATCHxCONTEXTxPAGE)"
    assert "skipped PDL chains: measured on a GPU only" in out.splitlines()


def test_pdl_chain_needs_a_device_with_pdl(monkeypatch):
    import simdevices
    from kvdispatch.bench import pdl as bench_pdl

    sim = simdevices.Sim(monkeypatch)
    for raw, says in ((simdevices.H200, None), (simdevices.A100, "has no programmatic dependent launch"),
                      (simdevices.MI300X, "has no programmatic dependent launch")):
        device = sim.add(raw)
        dispatch.reset()
        reason = bench_pdl.unavailable(device)
        assert reason is None if says is None else says in reason
    sim.modules(triton=False)
    dispatch.reset()
    assert bench_pdl.unavailable(sim.add(simdevices.H200)).startswith("the producer kernel is a Triton kernel")
    assert [c.name for c in bench_pdl.default_cases(quick=True)] == bench_pdl.CASES[:2]


# -- the real decode shape: buffers for the capacity, rows shorter ----------------------------------------------

REAL_TINY = ["4x8192x16:len=100-3000", "token_csr:4x8192:len=0-3000", "token_csr:3x8192:e16:map:len=mix",
             "mha_page_table:4x8192x16:swa:len=100-3000", "translated_page_table:4x8192x16:len=100-3000",
             "draft_decode:4x4096x3x2:p16:len=10-1000", "dcp_token_csr:4x8192x4:len=mix",
             "dcp_page_table:2x16384x64x2:len=500-3000"]


def test_real_shape_parsing():
    case = bench.Case.parse("256x1048576x64:len=1024-8192")
    assert case == bench.Case(256, 1048576, 64, lengths="1024-8192") and case.width == 16384
    assert case.length_range == (1024, 8192) and bench.Case.parse("1x8192x1:len=mix").length_range == bench.MIX_SHORT
    for name in REAL_TINY + bench.case_set("GPU_REAL") + ["token_csr:8x32768:i64:e64:map:len=0-32768",
                                                    "mha_page_table:2x8192x1:len=mix"]:
        assert bench.Case.parse(name).name == name
    assert bench.Case.parse("TOKEN_CSR:8x32768:E64:LEN=1-2").lengths == "1-2"
    ops = {bench.Case.parse(name).op for name in bench.case_set("GPU_REAL")}
    assert ops == set(dispatch.OPS)
    quick = [bench.Case.parse(name) for name in bench.case_set("GPU_REAL_QUICK")]
    assert {c.op for c in quick} >= set(dispatch.OPS) - {"dcp_page_table"}
    assert bench.Case(256, 1048576, 64, lengths="1024-8192") in quick
    for cases in (bench.case_set("CPU"), bench.case_set("CPU_QUICK")):
        [real] = [bench.Case.parse(name) for name in cases if ":len=" in name]
        assert real.batch * real.context <= bench.INTERPRETER_MAX_TOKENS


@pytest.mark.parametrize("case", ["1x64x16:len=5-3", "1x64x16:len=0-65", "1x4096x16:len=mix", "1x64x16:len=x",
                                  "1x64x16:len=1-2-3", "token_csr:1x64:len=1-2:i64", "1x64x16:len="])
def test_bad_real_shape_cases(case):
    with pytest.raises(argparse.ArgumentTypeError, match=":len= takes LO-HI"):
        bench.Case.parse(case)


@pytest.mark.parametrize("name", REAL_TINY)
def test_real_shape_inputs(name):
    """Buffers sized for the capacity, lengths in range (mix: every 16th request long), each row's tokens on pages
    of its own with slot 0 past its length."""
    case = bench.Case.parse(name)
    x = bench.make_inputs(case, torch.device("cpu"), seed=4)
    rows = x.req_to_token[x.req_pool_indices.long()]
    lengths = x.seq_lens.long()
    low, high = case.length_range
    long_rows = torch.arange(case.batch) % bench.MIX_LONG_EVERY == 0 if case.lengths == bench.MIX else None
    if not case.op.startswith("dcp_"):  # DCP: x.seq_lens are the last rank's
        short = (low <= lengths) & (lengths <= high)
        assert bool((short if long_rows is None else short | long_rows).all())
        if long_rows is not None:
            assert bool((lengths[long_rows] >= case.context - case.context // 16).all())
        assert int(lengths.max()) < case.context
    width = case.context if case.op != "token_csr" or case.page_size == 1 else case.width
    assert x.req_to_token.shape[1] >= width and (case.op == "draft_decode" or x.req_to_token.shape[1] == width)
    out_shapes = {"page_table": (case.batch, case.width), "token_csr": (case.batch * case.context,),
                  "mha_page_table": (2 * case.batch, case.width), "translated_page_table": (case.batch, case.width),
                  "draft_decode": (case.steps, case.batch * case.topk * (case.context + case.steps)),
                  "dcp_token_csr": (case.batch * (case.context // case.dcp_size),),
                  "dcp_page_table": (case.batch, case.width)}
    assert x.out.shape == out_shapes[case.op]
    if case.op in ("page_table", "mha_page_table", "translated_page_table"):
        positions = torch.arange(x.req_to_token.shape[1])
        assert bool((rows[positions >= lengths[:, None]] == 0).all())
        live = rows[positions < lengths[:, None]]
        pages = (lengths + case.page_size - 1) // case.page_size
        assert len(torch.unique(live // case.page_size)) == int(pages.sum())  # distinct physical pages
    if case.op in ("token_csr", "dcp_token_csr"):
        assert int(x.kv_indptr[-1]) == int(x.seq_lens.sum()) < x.out.numel()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the Triton interpreter on CPU tensors: conftest turns it on "
                    "only where there is no GPU")
@pytest.mark.parametrize("name", [n for n in REAL_TINY if bench.Case.parse(n).module.IDEAL_BASELINE])
def test_ideal_baselines_match_the_reference(name):
    """Each 2-D design's ideal baseline builds the reference's result on fewer programs than the width-sized
    grid; the API's programs are kvdispatch.grid's."""
    case = bench.Case.parse(name)
    x = bench.make_inputs(case, torch.device("cpu"), seed=5)
    impls = bench.implementations(["triton"], torch.device("cpu"), case)
    ideal, width_sized = case.module.IDEAL_BASELINE, case.module.SGLANG_BASELINE
    assert ideal in impls and bench.PLAIN_TORCH in impls
    programs = {}
    for impl in impls:
        fn = bench.bind(impl, x, case)
        assert bench.check_eager(fn, x) == "", impl
        programs[impl] = bench.programs(impl, case, x, fn)
    assert programs[ideal] < programs[width_sized] and programs[bench.PLAIN_TORCH] is None
    assert programs["api:triton"] >= programs[width_sized] // 4  # sized from the width too
    full_length = dataclasses.replace(case, lengths="")
    assert bench.implementations(["triton"], torch.device("cpu"), full_length) == [
        i for i in impls if i != ideal]  # full-length cases: no ideal row


@pytest.mark.skipif(torch.cuda.is_available(), reason="the Triton interpreter on CPU tensors: conftest turns it on "
                    "only where there is no GPU")
def test_real_shape_rows_carry_ratios_and_programs(capsys, tmp_path):
    cases = "2x16384x64:len=256-2048,token_csr:2x8192:len=mix,dcp_token_csr:2x8192x4:len=100-4000"
    rc, data, out, _ = _run(capsys, tmp_path, cases=cases)
    assert rc == 0 and "all results correct" in out
    rows = {(r["case"], r["impl"]): r for r in data["rows"]}
    table = "2x16384x64:len=256-2048"
    assert rows[(table, page_table.GRID_IDEAL)]["vs_ideal"] == 1.0
    assert rows[(table, page_table.GRID_2D)]["programs"] == 2 * 4
    assert rows[(table, page_table.GRID_IDEAL)]["programs"] == 2
    assert rows[(table, "api:triton")]["programs"] == math.prod(grid.page_table_launch(2, 256, 64).grid)
    for (case, impl), row in rows.items():
        assert row["status"] == "ok" and row["vs_2d"] > 0
        assert (row["vs_ideal"] is not None) == case.startswith("2x16384")
        assert (row["programs"] is None) == (impl in ("api:torch", bench.PLAIN_TORCH))
    assert ("token_csr:2x8192:len=mix", bench.PLAIN_TORCH) not in rows  # plain-torch CSRs: full-length rows only
    header = next(line for line in out.splitlines() if line.startswith("case "))
    assert "programs" in header and "/ideal" in header


# -- the options SGLang builds with kernels of their own: :zero, :v2pP, :eE, :wN ----------------------------------

OPTION_TINY = {"translated_page_table:3x300x16:zero": "read-table-sglang",
               "token_csr:3x200:v2p16": "read-packed-sglang", "token_csr:2x100:i64:v2p1": "read-packed-sglang",
               "draft_decode:2x256x3x2:p16:e16": "draft-entry-loop", "draft_decode:2x256x3x1:e8": "draft-entry-loop",
               "draft_decode:2x256x3x2:p16:e16:w40": "draft-window-loop",
               "draft_decode:3x128x4x2:w2": "draft-window-loop"}


def test_option_case_parsing():
    assert bench.Case.parse("translated_page_table:4x4096x16:zero") == bench.Case(
        4, 4096, 16, "translated_page_table", zero_tail=True)
    assert bench.Case.parse("token_csr:8x4096:i64:v2p16") == bench.Case(8, 4096, 1, "token_csr", int64=True,
                                                                        v2p_page=16)
    assert bench.Case.parse("draft_decode:4x2048x3x2:e16:p16:w256") == bench.Case(
        4, 2048, 16, "draft_decode", steps=3, topk=2, entry_page_size=16, step_window=256)
    real = ["translated_page_table:256x1048576x64:zero:len=mix", "token_csr:256x163840:v2p64:len=mix",
            "draft_decode:64x131072x5x4:p64:e64:len=1024-8192", "draft_decode:64x131072x5x4:w4096:len=1024-8192"]
    baselines = ["read-table-sglang", "read-packed-sglang", "draft-entry-loop", "draft-window-loop"]
    for name, baseline in [*OPTION_TINY.items(), *zip(real, baselines)]:
        case = bench.Case.parse(name)
        assert case.name == name and bench.triton_baselines(case) == [baseline] == [bench.option_baseline(case)]
        assert bench.sglang_baseline(case) == baseline
    assert set(real) <= set(bench.case_set("GPU_REAL"))
    for kind in ("CPU", "GPU", "GPU_REAL"):  # every option baseline has a case in each set
        cases = [bench.Case.parse(name) for name in bench.case_set(kind)]
        assert {bench.option_baseline(c) for c in cases} >= set(OPTION_TINY.values()), kind


@pytest.mark.parametrize("case", ["translated_page_table:2x64x16:zeros", "translated_page_table:2x64x16:zero:zero",
                                  "token_csr:2x64:v2p0", "token_csr:2x64:v2px", "token_csr:2x64:e16:v2p16",
                                  "token_csr:2x64:map:v2p16", "token_csr:2x64:v2p16:v2p16", "draft_decode:2x64x3x1:e0",
                                  "draft_decode:2x64x3x1:w0", "draft_decode:2x64x3x1:w8:w8", "draft_decode:2x64x3x1:q4",
                                  "draft_decode:2x64x3x1:ex"])
def test_bad_option_cases(case):
    with pytest.raises(argparse.ArgumentTypeError, match="case"):
        bench.Case.parse(case)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the Triton interpreter on CPU tensors: conftest turns it on "
                    "only where there is no GPU")
def test_option_cases_run_every_backend_and_their_baseline(capsys, tmp_path):
    """Each option case through the command line: every CPU backend, its op's API variants, the SGLang 0.5.23
    design's baseline for the option (in place of the op's others; what /2d divides by) and plain PyTorch where
    the op has it, all equal to the reference."""
    rc, data, out, _ = _run(capsys, tmp_path, cases=",".join(OPTION_TINY))
    assert rc == 0 and "all results correct" in out
    assert {"triton", "torch"} <= set(data["backends"])
    for case, baseline in OPTION_TINY.items():
        module = bench.Case.parse(case).module
        rows = {r["impl"]: r for r in data["rows"] if r["case"] == case}
        plain = [bench.PLAIN_TORCH] * (module.PLAIN_TORCH_CASES != "none")
        assert list(rows) == [f"api:{b}" for b in data["backends"]] + list(module.API_VARIANTS) + [baseline] + plain
        assert all(r["status"] == "ok" and r["time_us"] > 0 and r["vs_2d"] > 0 for r in rows.values()), case
        assert rows[baseline]["vs_2d"] == 1.0 and rows[baseline]["programs"] > 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="the Triton interpreter on CPU tensors: conftest turns it on "
                    "only where there is no GPU")
@pytest.mark.parametrize("name, baseline", [
    *[(n, b) for n, b in OPTION_TINY.items() if n.startswith("draft_decode")],
    ("draft_decode:2x256x3x2:p16", "draft-loop"), ("draft_decode:3x100x4x1", "draft-loop")])
def test_draft_baselines_write_the_references_indptr(name, baseline):
    """The bench compares ``out``; the draft baselines' ``kv_indptr`` (SGLang's: entry 0 untouched, the last
    entry the row's total) is the op's."""
    case = bench.Case.parse(name)
    x = bench.make_inputs(case, torch.device("cpu"), seed=3)
    segments = case.batch * case.topk
    indptr = x.kv_indptr.clone()
    ops.draft_decode.reference(x.req_to_token, x.req_pool_indices, x.seq_lens, indptr, x.out.clone(),
                               num_steps=case.steps, topk=case.topk, page_size=case.page_size, positions=x.positions,
                               entry_page_size=case.entry_page_size, step_window=case.step_window,
                               write_indptr_start=False)
    fn = bench.bind(baseline, x, case)
    assert bench.check_eager(fn, x) == ""
    assert torch.equal(x.kv_indptr[:, 1: segments + 1], indptr[:, 1: segments + 1])
