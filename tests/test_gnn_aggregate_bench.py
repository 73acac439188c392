"""benchmarks/bench_gnn.py on the CPU: the gnn suite's cells for one or several dtypes, the torch and PyG cells
skipped with the reason when torch is missing, and the targets the peers' ratios are held to."""

import json
import sys

import bench_scripts
import pytest


@pytest.fixture
def bench():
    return bench_scripts.load("bench_gnn")


@pytest.mark.slow
def test_two_dtypes_the_suites_cells_and_the_peers_skipped(bench, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # torch missing: its cells are skipped, the JAX ones run
    out = tmp_path / "gnn.json"
    argv = ["--small", "--dtype", "float32", "bfloat16", "--ops", "max", "spmm_sum", "--heads", "2", "--json", str(out)]
    assert bench.main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["meta"]["script"] == "benchmarks/bench_gnn.py" and doc["meta"]["argv"] == argv
    ours = [r for r in doc["results"] if r["suite"] == "gnn"]
    assert {r["label"] for r in ours} == {"spmm_sum", "spmm_mean", "aggregate_max", "gatv2", "graph_attention"}
    assert all(r["ok"] and r["metrics"]["loop_ms"] > 0 and r["metrics"]["speedup_vs_reference"] > 0 for r in ours)
    peers = [r for r in doc["results"] if r["suite"] == "gnn-peers"]
    assert {(r["params"]["dtype"], r["params"]["op"], r["params"]["peer"], r["params"]["mode"]) for r in peers} == {
        (dt, op, peer, mode) for dt in ("float32", "bfloat16") for op, cases in bench.PEERS.items()
        for peer, mode in cases}  # fmt: skip
    assert all(r["ok"] and r["skipped"] for r in peers)
    assert any("torch unavailable" in r["skipped"] for r in peers)


def test_attention_cells_per_head_count_and_mode(bench):
    cells = bench.cells(256, 2048, 16, [8, 1], ["float32"], ["gatv2", "transformer"], 1, 1)
    peers = [c for c in cells if c.suite == "gnn-peers"]
    assert [c.label for c in peers] == [f"float32 {op} H={h} {m} vs pyg" for op in ("gatv2", "transformer")
                                        for h in (8, 1) for m in ("fwd", "fwd+bwd")]  # fmt: skip


def test_ratios_and_targets(bench):
    out = bench._finish(dict(loop_ms=1.0, peer_ms=10.0, ours_mem_bytes=100, peer_mem_bytes=4000),
                        ("gatv2", 8, "fwd+bwd", "pyg"))  # fmt: skip
    assert out["speedup_vs_peer"] == 10.0 and out["memory_vs_peer"] == 40.0
    assert out["target"] == bench.TARGETS[("gatv2", 8, "fwd+bwd", "pyg")] and out["target_met"] is False
    assert "target" not in bench._finish(dict(loop_ms=1.0, peer_ms=2.0), ("max", None, "fwd", "pyg-scatter"))
