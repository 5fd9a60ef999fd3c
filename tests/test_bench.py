"""``kvdispatch bench`` on its CPU path: quick tiny runs, JSON, markdown, and failing on a wrong result.

The GPU path (CUDA-graph replay, host-cost ratios, compilation counts) runs on a GPU machine only.
"""

import importlib.util
import json
import sys
import types

import pytest
import torch

from kvdispatch import bench, cli, dispatch, reference

TINY = "1x256x16,2x128x1"


def _run(capsys, tmp_path, *extra):
    path = tmp_path / "bench.json"
    rc = cli.main(["bench", "--quick", "--device", "cpu", "--cases", TINY, "--json", str(path), *extra])
    out, err = capsys.readouterr()
    return rc, json.loads(path.read_text()), out, err


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
    if "triton" in data["backends"]:  # the Triton interpreter (TRITON_INTERPRET=1): baselines run too
        for impl in ("api:triton", bench.NAIVE, bench.GRID_2D):
            assert [r["status"] for r in _rows(data, impl)] == ["ok", "ok"]
        assert all(r["vs_naive"] > 0 and r["vs_2d"] > 0 for r in _rows(data, "api:torch"))
    page1 = [r for r in data["rows"] if r["page_size"] == 1]
    assert all(r["gbps"] > 0 for r in page1)
    assert "GPU timings need a GPU" in out
    assert "all results correct" in out
    assert "[1/2] 1x256x16" in err and "[2/2] 2x128x1" in err


def test_markdown(capsys, tmp_path):
    rc, data, out, _ = _run(capsys, tmp_path, "--markdown", "--backends", "torch")
    assert rc == 0
    lines = [line for line in out.splitlines() if line.startswith("|")]
    assert lines[0].startswith("| case | impl | status | µs/call")
    assert set(lines[1]) <= set("|-:")
    assert len(lines) == 2 + len(data["rows"])
    assert any(line.startswith("| 2x128x1 | api:torch | ok |") for line in lines)


def _fake_torch_backend(monkeypatch, build_page_table):
    module = types.ModuleType("fake_bench_backend")
    module.build_page_table = build_page_table
    module.build_token_indices = reference.build_token_indices
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(dispatch.REGISTRY, "torch", dispatch.Backend("torch", module.__name__))


def test_wrong_result_fails_the_run(capsys, tmp_path, monkeypatch):
    def off_by_one(req_to_token, req_pool_indices, seq_lens, out, page_size, *rest):
        reference.build_page_table(req_to_token, req_pool_indices, seq_lens, out, page_size, *rest)
        out[-1, -1] += 1

    _fake_torch_backend(monkeypatch, off_by_one)
    rc, data, out, _ = _run(capsys, tmp_path, "--backends", "torch")
    assert rc == 1
    assert [r["status"] for r in _rows(data, "api:torch")] == ["WRONG", "WRONG"]
    assert all(r["status"] == "ok" for r in _rows(data, bench.PLAIN_TORCH))  # the run went on
    assert "FAILED: 2 wrong result(s)" in out
    assert "entries differ" in out


def test_backend_error_is_reported_not_fatal(capsys, tmp_path, monkeypatch):
    def broken(*args):
        raise RuntimeError("launch failed")

    _fake_torch_backend(monkeypatch, broken)
    rc, data, out, _ = _run(capsys, tmp_path, "--backends", "torch,cupy")
    assert rc == 0
    assert [r["status"] for r in _rows(data, "api:torch")] == ["error", "error"]
    assert "RuntimeError: launch failed" in out
    assert "cupy" in data["unavailable"] and "backend cupy unavailable" in out


def test_case_parsing():
    assert bench.parse_cases("1x131072x64, 256x32768x1") == [bench.Case(1, 131072, 64), bench.Case(256, 32768, 1)]
    assert bench.Case(1, 131072, 64).width == 2048 and bench.Case(2, 100, 64).width == 2
    with pytest.raises(SystemExit):
        cli.main(["bench", "--cases", "1x2"])
    with pytest.raises(SystemExit):
        cli.main(["bench", "--cases", "1x4096x64", "--backends", "vulkan"])


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
        assert rc == 2 and 'pip install "kvdispatch[bench]"' in err
    else:
        assert rc == 0 and png.read_bytes()[:4] == b"\x89PNG"


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


def test_host_cost_is_divided_by_the_cases_own_add():
    """host/add_ of an API row uses the x.add_(1) timed in its case's rounds (passed to add_ratios), not
    the run's first reference: the host's speed drifts during a run."""
    case = bench.Case(1, 4096, 64)
    rows = [bench.Row(case.name, 1, 4096, 64, case.width, impl, time_us=2.0, host_us=host, timing="cuda-graph")
            for impl, host in (("api:triton", 6.0), (bench.GRID_2D, 20.0), (bench.PLAIN_TORCH, 100.0))]
    bench.add_ratios(rows, 7.5, None)
    api = rows[0]
    assert api.add_host_us == 7.5 and api.host_vs_add == pytest.approx(0.8)
    assert api.host_vs_launch == pytest.approx(0.3)
    assert rows[1].host_vs_add is None and rows[2].add_host_us is None  # baselines carry no host ratio
