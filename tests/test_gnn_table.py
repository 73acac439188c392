"""The full table of a ``gnn-graphs`` run (``blocksparse.bench.gnn_table``): the backend each cell's default takes from
the run, the rows as printed, the targets and their misses, against a hand-made run whose numbers are known."""

import pytest

from blocksparse.bench import gnn_graphs as suite
from blocksparse.bench import gnn_table as T

N, E = 1000, 8000


def _cell(graph, dtype, op, pass_, pallas, xla, peer=None, **extra):
    """A passed cell as the suite writes it: both backends timed, the default as it ran (the kernels), a peer."""
    m = dict(pallas_loop_ms=pallas, xla_loop_ms=xla, faster_backend="pallas" if pallas <= xla else "xla",
             loop_ms=pallas, calls_ms=pallas, implementation=f"{op}: pallas", nodes=N, edges=E, max_in_degree=50,
             mem_bytes=1 << 20, pallas_mem_bytes=1 << 20, xla_mem_bytes=1 << 22, **extra)  # fmt: skip
    if peer is not None:
        m.update(best_peer=peer[0], best_peer_ms=peer[1])
    prm = dict(graph=graph, op=op, dtype=dtype, order="as generated", feat=128, heads=8, **{"pass": pass_})
    return dict(suite="gnn-graphs", label=suite.label(graph, dtype, "as generated", op, pass_), params=prm,
                metrics=m, ok=True, skipped=None)  # fmt: skip


def _doc():
    g = "ogbn-arxiv"
    return {"results": [
        _cell(g, "float32", "spmm_sum", "fwd", 1.0, 2.0, ("torch-csr", 1.5)),
        _cell(g, "float32", "spmm_mean", "fwd", 3.0, 1.1, ("torch-csr", 1.5)),  # chosen by the sum: the kernels
        _cell(g, "float32", "max", "fwd", 1.01, 1.0, ("segment", 0.9)),  # XLA faster by 1%: a tie, the kernels kept
        _cell(g, "float32", "min", "fwd", 2.0, 1.0, ("segment", 3.0)),  # chosen by max: the kernels, 2.0
        _cell(g, "bfloat16", "spmm_sum", "fwd", 2.0, 1.2, ("torch-csr", 4.0)),  # XLA, slower than float32
        _cell(g, "bfloat16", "max", "fwd", 0.5, 0.6),  # no peer ran
        _cell(g, "float32", "gatv2", "fwd", 1.0, 2.0, ("pyg-scatter", 10.0), **{"pyg-scatter_mem_bytes": 50 << 20}),
        _cell(g, "float32", "gatv2", "fwd+bwd", 1.0, 0.5, ("pyg-scatter", 10.0),
              **{"pyg-scatter_mem_bytes": 1 << 20, "pallas_timer": "one call"}),  # timed once: no pick
        dict(suite="gnn-graphs", label="failed one", ok=False, skipped=None, error="FAILED",
             params=dict(graph=g, op="min", dtype="bfloat16", order="as generated", **{"pass": "fwd"}), metrics={}),
    ]}  # fmt: skip


def test_each_cell_takes_the_backend_its_familys_cell_picks():
    doc = _doc()
    cells = T.cells(doc)
    pick = {k[1:]: (c.backend, c.ms) for k, c in cells.items()}
    assert pick[("float32", "spmm_sum", "fwd")] == ("pallas", 1.0)
    assert pick[("float32", "spmm_mean", "fwd")] == ("pallas", 3.0)  # the sum's pick, not the mean's own faster
    assert pick[("float32", "max", "fwd")] == ("pallas", 1.01)  # a tie kept by the kernels
    assert pick[("float32", "min", "fwd")] == ("pallas", 2.0)
    assert pick[("bfloat16", "spmm_sum", "fwd")] == ("xla", 1.2)
    # timed once: no measurement of its own, none near: the default order, the kernels
    assert (
        pick[("float32", "gatv2", "fwd+bwd")] == ("pallas", 1.0)
        and cells[("ogbn-arxiv", "float32", "gatv2", "fwd+bwd")].follows is None
    )
    assert cells[("ogbn-arxiv", "float32", "spmm_mean", "fwd")].follows == "ogbn-arxiv"
    assert ("ogbn-arxiv", "bfloat16", "min", "fwd") not in cells
    assert T.default_backend(doc, "ogbn-arxiv", "float32", "min", "fwd") == "pallas"
    assert T.default_backend(doc, "ogbn-arxiv", "float32", "gatv2", "fwd+bwd") == "pallas"
    assert T.default_backend(doc, "ogbn-arxiv", "float32", "graph_attention", "fwd") is None  # not run


def test_the_tuned_data_reads_the_same_picks():
    """``measured_from`` (what ``tuned.CHOICES`` is made of) and the table agree on every family's cell."""
    doc = _doc()
    got = suite.measured_from(doc, "x.json")
    cells = T.cells(doc)
    for (family, dtype, pass_), points in got.items():
        op = {"spmm": "spmm_sum", "aggregate": "max"}.get(family, family)
        for m in points:
            assert cells[(m.graph, dtype, op, pass_)].backend == m.faster


def test_the_rows_as_printed():
    lines = T.full_table(_doc()).splitlines()
    assert lines[0].startswith("| graph | op, pass | float32 |") and len(lines) == 2 + len(suite.GRAPHS) * 14
    at = next(i for i, line in enumerate(lines) if line.startswith("| ogbn-arxiv |"))
    rows = {line.split(" | ")[1]: line for line in lines[at : at + 14]}  # ogbn-arxiv's rows (the others: not run)
    assert all(line.endswith("|  |  |  |  |  |") for line in lines[2:at] + lines[at + 14 :])
    assert (
        rows["SpMM sum fwd"]
        == "| ogbn-arxiv | SpMM sum fwd | pallas 1.000 | 1.50 (cuSPARSE) | xla 1.200 | 3.33 (cuSPARSE) | 1.20 |"
    )
    assert rows["min fwd"] == "|  | min fwd | pallas 2.000 | 1.50 (XLA segment) | failed |  |  |"
    assert rows["max fwd"].endswith("| pallas 0.500 |  | 0.50 |")  # no peer in bfloat16
    assert rows["GATv2 fwd+bwd"] == "|  | GATv2 fwd+bwd | pallas 1.000 | 10.00 (PyG) |  |  |  |"
    assert rows["graph attention fwd"] == "|  | graph attention fwd |  |  |  |  |  |"


def test_the_targets_name_each_miss_and_its_bound():
    text = T.targets(_doc())
    assert "- **8 of 168 cells** ran and passed their checks (1 failed, 159 not yet run, of which 0 cut short" in text
    assert "max on the power-law graph, float32 forward:** not run yet (target 1.0 ms)" in text
    assert "**The default at least as fast as the fastest peer in 5 of 7 cells** where a peer ran." in text
    # the mean, picked by the sum, loses to cuSPARSE by 2x; max (a tie) loses to the segment ops
    mean = T.smallest_traffic("spmm_mean", "fwd", N, E, 128, 4) / T.COPY_RATE * 1e3
    rows = E * 128 * 4 / T.COPY_RATE * 1e3
    assert (f"  - ogbn-arxiv float32 SpMM mean fwd: pallas 3.000 against cuSPARSE 1.500 ms (0.50, 1500 µs); at the "
            f"copy rate the smallest traffic takes {mean:.3f} ms (the op {3.0 / mean:.1f}x that), a row gathered per "
            f"edge {rows:.3f}") in text  # fmt: skip
    assert "ogbn-arxiv float32 max fwd: pallas 1.010 against XLA segment 0.900 ms (0.89, 110 µs)" in text
    assert text.index("SpMM mean fwd:") < text.index("max fwd:")  # the largest miss first
    assert "- **bfloat16 at least as fast as float32 in 1 of 2 pairs.**" in text
    assert "  - ogbn-arxiv SpMM sum fwd: bfloat16 1.200 against float32 1.000 ms (1.20)" in text
    assert "ogbn-arxiv max fwd: bfloat16" not in text  # faster: not listed
    assert "**Attention memory at least 40x below PyG's in 1 of 2 cells** where PyG ran (1.0x to 50.0x)." in text
    # the forward + backward: its output and two gradients (N x 128 float32 each) alone are PyG's / 0.7
    floor = 3 * N * 128 * 4
    assert f"what it returns alone, {floor / 2**20:,.0f} MiB, is PyG / {(1 << 20) / floor:.1f}" in text


def test_a_run_that_measured_its_copy_rate_prices_the_bytes_at_it():
    doc = _doc()
    doc["meta"] = {"copy_bytes_per_s": T.COPY_RATE / 2}  # a GPU copying at half the H200's rate
    text = T.targets(doc)
    assert f"- **The copy rate** the run measured, the bytes below priced at: {T.COPY_RATE / 2e12:.2f} TB/s" in text
    mean = T.smallest_traffic("spmm_mean", "fwd", N, E, 128, 4) / T.COPY_RATE * 1e3
    assert f"the smallest traffic takes {2 * mean:.3f} ms (the op {3.0 / (2 * mean):.1f}x that)" in text
    assert T.run_copy_rate({}) == T.COPY_RATE and "The copy rate" not in T.targets(_doc())  # a run without its own


def test_the_copy_rate_counts_bytes_read_and_written():
    class TwoMs:  # a loop of 2 ms a call: the rate is the array's bytes, read and written, over that
        def loop(self, fn, x):
            assert x.nbytes == 1 << 20 and fn(x).shape == x.shape
            return 2.0

    assert suite.measure_copy_rate(nbytes=1 << 20, timer=TwoMs()) == 2 * (1 << 20) / 2e-3
    assert 1e6 < suite.measure_copy_rate(nbytes=1 << 20, timer=suite.Timer(iters=2, trials=1)) < 1e15  # measured here


def test_back_to_back_calls_far_from_the_loop_are_listed():
    doc = _doc()
    doc["results"][0]["metrics"]["calls_ms"] = 1.3  # 30% and 0.3 ms above the loop
    doc["results"][1]["metrics"]["calls_ms"] = 3.04  # within 0.05 ms
    text = T.targets(doc)
    assert "of the loop in 7 cells; above it in:\n  - ogbn-arxiv float32 SpMM sum fwd: 1.300 against 1.000 ms" in text


@pytest.mark.parametrize(("op", "pass_", "arrays", "csrs"), [
    ("spmm_sum", "fwd", 2, 1), ("spmm_gcn", "fwd", 2, 1), ("max", "fwd+bwd", 4, 1), ("spmm_mean", "fwd+bwd", 4, 2),
    ("gatv2", "fwd", 3, 1), ("graph_attention", "fwd+bwd", 8, 2),
])  # fmt: skip
def test_smallest_traffic(op, pass_, arrays, csrs):
    """Inputs read once, outputs written once (``fwd+bwd``: the cotangent in, every input's gradient out), the CSR's
    edge ids and offsets per product (max / min's backward scatters to the arg-max: none)."""
    want = arrays * N * 64 * 2 + csrs * 4 * (E + N + 1)
    assert T.smallest_traffic(op, pass_, N, E, 64, 2) == want


def test_the_choice_table_names_each_side():
    lines = T.choice_table(_doc()).splitlines()
    assert len(lines) == 2 + len(T.FAMILIES) * 2 * 2
    rows = {line.split(" | ")[0][2:]: line for line in lines[2:]}
    assert rows["SpMM, float32, fwd"] == "| SpMM, float32, fwd |  | ogbn-arxiv |"
    assert rows["SpMM, bfloat16, fwd"] == "| SpMM, bfloat16, fwd | ogbn-arxiv |  |"
    assert rows["max / min, float32, fwd"] == "| max / min, float32, fwd |  | ogbn-arxiv (a tie) |"
    assert rows["GATv2, float32, fwd+bwd"] == "| GATv2, float32, fwd+bwd |  |  |"  # timed once: cannot tell


def test_a_cell_without_its_own_measurement_follows_the_nearest_graph():
    """As the library does: a graph whose deciding cell could not tell takes the nearest measured graph's choice
    (within the coverage), here pokec's float32 SpMM from a graph of about its size where XLA was faster."""
    doc = _doc()
    near = _cell("pokec", "float32", "spmm_sum", "fwd", 3.0, 2.0, ("torch-csr", 4.0))
    near["metrics"].update(nodes=2 * N, edges=2 * E)
    doc["results"] += [near, _cell("ogbn-products", "float32", "spmm_sum", "fwd", 1.0, 2.0,
                                   pallas_timer="one call")]  # fmt: skip
    c = T.cells(doc)[("ogbn-products", "float32", "spmm_sum", "fwd")]
    # ogbn-products' own cell cannot tell; ogbn-arxiv's (N nodes) and pokec's (2 N) are equally near: the first
    # measured in the run's order decides, ogbn-arxiv's kernels
    assert (c.backend, c.follows) == ("pallas", "ogbn-arxiv")


def test_rows_without_a_graph_are_skipped():
    doc = _doc()
    doc["results"].append(dict(suite="gnn-graphs", label="broken", params={}, metrics={}, ok=False, error="boom"))
    assert T.full_table(doc) == T.full_table(_doc()) and T.targets(doc) == T.targets(_doc())


def test_gather_traffic():
    assert T.gather_traffic("graph_attention", "fwd", E, 64, 2) == 2 * E * 64 * 2  # k and v
    assert T.gather_traffic("max", "fwd+bwd", E, 64, 4) == 2 * E * 64 * 4  # the backward's gathers again
