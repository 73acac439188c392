"""benchmarks/bench_gnn.py on the CPU: the dtype option (one or several), the op filter, the max with arg-max rows,
the summary, torch missing, and the max kernel's nodes-per-program sweep."""

import json
import pathlib
import sys

import bench_scripts
import pytest

import blocksparse.gnn as gnn

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture
def bench():
    return bench_scripts.load("bench_gnn")  # fresh module state (ROWS) per test


def _run(bench, tmp_path, *args):
    out = tmp_path / "gnn.json"
    tiny = ["--nodes", "64", "--edges", "512", "--feat", "16", "--iters", "1", "--no-torch", "--heads"]
    assert bench.main([*tiny, *args, "--json", str(out)]) == 0
    return json.loads(out.read_text())


def test_bfloat16_rows_on_xla(bench, tmp_path):
    res = _run(bench, tmp_path, "--impls", "xla", "--dtype", "bfloat16", "--ops", "max", "spmm_sum")
    assert res["meta"]["dtype"] == "bfloat16"
    rows = res["rows"]
    assert {r["op"] for r in rows} == {"max", "spmm_sum"} and all(r["dtype"] == "bfloat16" for r in rows)
    checks = [r for r in rows if r["mode"] == "check"]
    assert len(checks) == 3 and all(r["err"] < 0.05 for r in checks)  # bf16 against the float32 reference
    assert {r["impl"] for r in checks} == {"bs-xla", "bs-xla-with_arg"}  # (the max with arg-max: exact)
    timed = [r for r in rows if r["mode"] == "fwd"]
    assert {r["impl"] for r in timed} >= {"bs-xla", "jax-segment_max-sorted", "jax-segment_sum-sorted"}
    assert all(r["gather_gbps"] > 0 and r["ms"] > 0 for r in timed)


@pytest.mark.slow  # every variant of the sweep interpreted; the kernels: test_gnn_pallas.py and test_gnn_gather_*
def test_nodes_per_program_sweep_in_interpret_mode(bench, tmp_path):
    with gnn.interpret():
        res = _run(bench, tmp_path, "--impls", "pallas", "--ops", "max", "--nodes-per-program", "1", "4",
                   "--edges-per-step", "8")  # fmt: skip
    rows = [r for r in res["rows"] if r["impl"].startswith("bs-pallas-npp")]
    got = {(r["impl"], r["mode"]) for r in rows}
    assert got == {
        *((f"bs-pallas-npp{g}", m) for g in (1, 4) for m in ("check", "fwd", "fwd+bwd")),
        *((f"bs-pallas-npp4-{v}", m) for v in ("idorder", "prefetch", "be8") for m in ("check", "fwd")),
    }
    assert all(r["err"] == 0.0 for r in rows if r["mode"] == "check")  # max is exact
    by = {(r["impl"], r["mode"]): r for r in rows}
    assert by["bs-pallas-npp4-be8", "fwd"]["be"] == 8 and by["bs-pallas-npp4-idorder", "fwd"]["sort_by_degree"] is False
    assert by["bs-pallas-npp4-prefetch", "fwd"]["prefetch"] is True
    assert by["bs-pallas-npp1", "fwd"]["nodes_per_program"] == 1 and by["bs-pallas-npp1", "fwd"]["be"] == 64


def test_two_dtypes_in_one_run_with_arg_rows_and_summary(bench, tmp_path, monkeypatch, capsys):
    # without --no-torch, and torch missing: its rows are skipped with the reason, the JAX rows still run
    monkeypatch.setitem(sys.modules, "torch", None)
    out = tmp_path / "gnn.json"
    argv = ["--nodes", "64", "--edges", "512", "--feat", "16", "--iters", "1", "--heads", "--impls", "xla",
            "--dtype", "float32", "bfloat16", "--ops", "max", "spmm_sum", "--json", str(out)]  # fmt: skip
    assert bench.main(argv) == 0
    res = json.loads(out.read_text())
    meta, rows = res["meta"], res["rows"]
    assert meta["dtypes"] == ["float32", "bfloat16"] and meta["torch_rows"].startswith("skipped: torch unavailable")
    assert "torch and PyG rows skipped: torch unavailable" in capsys.readouterr().out
    assert meta["defaults"]["float32"]["max_values"] == {"nodes_per_program": 1, "variant": "key"}
    assert meta["defaults"]["bfloat16"]["max_values"]["variant"] == "w2"
    assert meta["defaults"]["float32"]["max_with_arg"]["variant"] == "w1"
    for dtype in ("float32", "bfloat16"):
        mine = {(r["impl"], r["mode"]): r for r in rows if r["dtype"] == dtype and r["op"] == "max"}
        assert mine["bs-xla-with_arg", "check"]["err"] == 0.0  # values and arg-max exactly
        assert mine["bs-xla-with_arg", "fwd"]["ms"] > 0 and mine["bs-xla", "fwd"]["calls_ms"] > 0
        assert {(r["impl"], r["mode"]) for r in rows if r["dtype"] == dtype and r["op"] == "spmm_sum"} >= {
            ("bs-xla", "fwd"), ("jax-segment_sum-sorted", "fwd")}  # fmt: skip
    got = {(s["dtype"], s["ours"], s["peer"]) for s in res["summary"]}
    assert ("bfloat16", "bs-xla-with_arg", "jax-segment_max-sorted") in got
    assert ("float32", "bs-xla", "jax-segment_sum-sorted") in got
    assert all(s["ratio"] > 0 and "target" not in s for s in res["summary"])  # no cuSPARSE / PyG row here
