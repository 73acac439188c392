"""The paper's graphs: ``generators.paper_graph`` (sizes, degree skew, locality) and benchmarks/bench_gnn_graphs.py."""

import functools
import json
import os
import re
import subprocess
from pathlib import Path

import bench_scripts
import jax
import numpy as np
import pytest
from helpers import examples, sweep
from hypothesis import given, settings
from hypothesis import strategies as st

import blocksparse.gnn as gnn
from blocksparse.bench import Timer, run_cell
from blocksparse.bench import gnn_graphs as bench_gnn_graphs
from blocksparse.gnn.generators import PAPER_GRAPH_SPECS, paper_graph, paper_graph_edges
from blocksparse.testing.graphs import graphs

ROOT = Path(__file__).resolve().parent.parent
SOCIAL = [k for k, v in PAPER_GRAPH_SPECS.items() if not v.get("grid")]


@functools.cache
def _bench():
    return bench_scripts.load("bench_gnn_graphs")  # the peers' script; the JAX cells are the gnn-graphs suite


def test_real_sizes_are_the_published_ones():
    want = {  # (nodes, directed edges as a Graph stores them)
        "ogbn-arxiv": (169_343, 1_166_243),
        "ogbn-products": (2_449_029, 123_718_280),
        "pokec": (1_632_803, 30_622_564),
        "twitch-views": (168_114, 13_595_114),
        "city-roads-L": (142_257, 463_710),
    }
    got = {k: (v["nodes"], v["edges"] * (2 if v["symmetric"] else 1)) for k, v in PAPER_GRAPH_SPECS.items()}
    assert got == want
    # the older table of synthetic()'s sizes is derived from the specs: one source of truth
    assert gnn.PAPER_GRAPHS == {**want, "baseline": (262_144, 8_388_608)}


def test_exported_from_bs_gnn():
    assert (gnn.paper_graph, gnn.paper_graph_edges, gnn.PAPER_GRAPH_SPECS) == (
        paper_graph,
        paper_graph_edges,
        PAPER_GRAPH_SPECS,
    )
    assert {"paper_graph", "paper_graph_edges", "PAPER_GRAPH_SPECS", "PAPER_GRAPHS"} <= set(gnn.__all__)
    # synthetic() takes the same city-roads-L size as paper_graph (the directed count), scaled down
    g = gnn.synthetic("city-roads-L", scale=0.01)
    assert (g.num_nodes, g.num_edges) == (1422, 4637) and "synthetic" in g.name


@pytest.mark.slow
@given(name=st.sampled_from(sorted(PAPER_GRAPH_SPECS)), scale=st.floats(2e-3, 2e-2), seed=st.integers(0, 2**31))
@settings(max_examples=examples(12), deadline=None)
def test_scaled_sizes_exact_simple_and_symmetric(name, scale, seed):
    spec = PAPER_GRAPH_SPECS[name]
    src, dst, n = paper_graph_edges(name, scale=scale, seed=seed)
    m = round(spec["edges"] * scale)
    assert n == round(spec["nodes"] * scale)
    assert src.dtype == dst.dtype == np.int32
    assert src.size == dst.size == (2 * m if spec["symmetric"] else m)
    assert src.min() >= 0 and dst.min() >= 0 and max(src.max(), dst.max()) < n
    assert not np.any(src == dst)  # no self-loops
    keys = src.astype(np.int64) * n + dst
    assert np.unique(keys).size == keys.size  # no repeated edges
    if spec["symmetric"]:
        np.testing.assert_array_equal(np.sort(keys), np.sort(dst.astype(np.int64) * n + src))


def test_seeded():
    a = paper_graph_edges("ogbn-arxiv", scale=0.01, seed=3)
    b = paper_graph_edges("ogbn-arxiv", scale=0.01, seed=3)
    c = paper_graph_edges("ogbn-arxiv", scale=0.01, seed=4)
    for x, y in zip(a[:2], b[:2], strict=True):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a[1], c[1])


@sweep(("name", "max_in", "max_out"), [("ogbn-arxiv", 13_155, 500), ("twitch-views", 35_279, 35_279)])
def test_full_size_degree_skew(name, max_in, max_out):
    src, dst, n = paper_graph_edges(name)
    spec = PAPER_GRAPH_SPECS[name]
    assert (n, src.size) == (spec["nodes"], spec["edges"] * (2 if spec["symmetric"] else 1))
    indeg, outdeg = np.bincount(dst, minlength=n), np.bincount(src, minlength=n)
    assert abs(indeg.max() / max_in - 1) < 0.1, indeg.max()
    assert abs(outdeg.max() / max_out - 1) < 0.1, outdeg.max()
    assert np.median(indeg) < indeg.mean() < indeg.max() / 50  # skewed: a heavy tail, not a few big nodes
    # ids are shuffled: the typical edge spans a third of the id range, as for random pairs
    assert np.median(np.abs(src.astype(np.int64) - dst)) > n / 5


def test_city_roads_is_a_local_connected_grid():
    g = paper_graph("city-roads-L")
    assert (g.num_nodes, g.num_edges) == (142_257, 463_710)
    assert g.in_degree.min() == 1 and g.in_degree.max() <= 4
    assert abs(g.in_degree.mean() - 3.26) < 0.01
    np.testing.assert_array_equal(g.in_degree, g.out_degree)  # symmetric
    # neighbours' ids are about one grid row (sqrt N ~ 377) apart at most: a real road network's locality
    span = np.abs(g.src.astype(np.int64) - g.dst)
    assert np.quantile(span, 0.99) < 2 * np.sqrt(g.num_nodes)
    sp = pytest.importorskip("scipy.sparse")
    from scipy.sparse.csgraph import connected_components

    a = sp.coo_matrix((np.ones(g.num_edges), (g.src, g.dst)), shape=(g.num_nodes,) * 2)
    assert connected_components(a, directed=False)[0] == 1
    assert "synthetic" in g.name and "city-roads-L" in g.name


def test_bad_input():
    with pytest.raises(ValueError, match=r"Expected a graph name in \[.*'pokec'.*\]. Got 'cora'"):
        paper_graph_edges("cora")
    for bad in (0, 1.5, -0.1, True, "0.5"):
        with pytest.raises(ValueError, match=r"Expected scale in \(0, 1\]. Got"):
            paper_graph_edges("pokec", scale=bad)
    with pytest.raises(ValueError, match=r"Expected scale large enough for a sparse graph: \d+ edges on \d+ nodes"):
        paper_graph_edges("twitch-views", scale=1e-4)


# ---------------------------------------------------------------------------------- locality to recover
def test_shuffled_ids_hide_a_grids_locality_for_rcm_to_recover():
    u, v, n = paper_graph_edges("city-roads-L", scale=0.05, seed=3)
    su, sv, sn = paper_graph_edges("city-roads-L", scale=0.05, seed=3, shuffle=True)
    perm = np.random.default_rng(4).permutation(n)  # shuffle_ids with the next seed: the same graph renumbered
    assert sn == n and su.dtype == sv.dtype == np.int32
    np.testing.assert_array_equal(su, perm[u])
    np.testing.assert_array_equal(sv, perm[v])
    span = lambda a, b: np.abs(a.astype(np.int64) - b).mean()  # noqa: E731
    assert span(su, sv) > 20 * span(u, v)
    g2, _ = gnn.reorder(gnn.Graph.from_edges(su, sv, n), "rcm")
    assert span(g2.src, g2.dst) < 3 * span(u, v)  # a band about as narrow as the generated order's


@given(n=st.integers(2, 300), size=st.integers(2, 64), p_in=st.floats(0, 1), seed=st.integers(0, 2**31),
       frac=st.floats(0, 1))  # fmt: skip
@settings(max_examples=examples(40), deadline=None)
def test_community_edges_are_simple_and_seeded(n, size, p_in, seed, frac):
    most = int(min(n * (n - 1), n * (min(size, n) - 1) / max(p_in, 1e-9)) // 4)
    e = int(frac * most)
    src, dst = gnn.community_edges(n, e, community_size=size, p_in=p_in, seed=seed)
    assert src.dtype == dst.dtype == np.int32 and src.size == dst.size == e
    assert (src != dst).all() and np.unique(src.astype(np.int64) * n + dst).size == e
    assert 0 <= src.min(initial=0) and max(src.max(initial=0), dst.max(initial=0)) < n
    again = gnn.community_edges(n, e, community_size=size, p_in=p_in, seed=seed)
    np.testing.assert_array_equal(again[0], src)
    np.testing.assert_array_equal(again[1], dst)


def test_communities_hold_their_edges_and_the_clusters_order_finds_them():
    n, size, p_in, seed = 8192, 256, 0.9, 0
    g = gnn.communities(n, 12 * n, community_size=size, p_in=p_in, seed=seed)
    assert g.num_edges == 12 * n and g.name == "synthetic communities"
    home = np.argsort(np.random.default_rng(seed + 1).permutation(n)) // size  # each id's community
    inside = (home[g.src] == home[g.dst]).mean()
    assert abs(inside - (p_in + (1 - p_in) * size / n)) < 0.02
    near = lambda h: (np.abs(h.src.astype(np.int64) - h.dst) < size).mean()  # noqa: E731
    assert near(g) < 0.1  # ids shuffled: a community's nodes are spread over the graph
    g2, perm = gnn.reorder(g, "clusters")
    assert sorted(perm.tolist()) == list(range(n)) and near(g2) > 0.8
    assert (home[perm[g2.src]] == home[perm[g2.dst]]).mean() == inside  # the same edges, renumbered


def test_locality_bad_input():
    with pytest.raises(ValueError, match=r"Expected community_size an int >= 2. Got 1"):
        gnn.community_edges(100, 10, community_size=1)
    for bad in (-0.1, 1.5, True):
        with pytest.raises(ValueError, match=r"Expected p_in a number in \[0, 1\]. Got"):
            gnn.community_edges(100, 10, p_in=bad)
    with pytest.raises(ValueError, match=r"Expected at most a quarter of the node pairs \(\d+ edges on 100 nodes"):
        gnn.community_edges(100, 2000, community_size=8)
    with pytest.raises(ValueError, match=r"Expected num_nodes >= 1. Got 0"):
        gnn.shuffle_ids([], [], 0)
    with pytest.raises(ValueError, match=r"Expected src integer ids in \[0, 3\). Got int64 ids in \[-1, 0\]"):
        gnn.shuffle_ids([-1, 0], [0, 1], 3)
    with pytest.raises(ValueError, match=r"Expected dst integer ids in \[0, 3\). Got int64 ids in \[0, 3\]"):
        gnn.shuffle_ids([0, 1], [0, 3], 3)
    with pytest.raises(ValueError, match=r"Expected src and dst of one shape \(E,\). Got \(2,\) and \(1,\)"):
        gnn.shuffle_ids([0, 1], [0], 3)
    src, dst = gnn.community_edges(64, 100, community_size=8, p_in=np.float32(0.5))  # numpy scalars are numbers
    assert src.size == 100


def test_the_suite_builds_the_locality_graphs():
    for name, kind in (("city-roads-L-shuffled", "ids shuffled"), ("communities", "communities")):
        scale = bench_gnn_graphs.scale_for(name, 3000)
        g = bench_gnn_graphs.graph(name, scale)
        assert kind in g.name and 2000 < g.num_edges <= 6000, (name, g.num_edges)  # (a symmetric graph: both ways)
    with pytest.raises(ValueError, match=r"Expected each order in \[.*'clusters'\]. Got \['metis'\]"):
        bench_gnn_graphs.suite(**dict(bench_gnn_graphs.SIZES["tiny"], orders=("metis",)))


@pytest.mark.slow  # six cells on the CPU
def test_bench_locality_graphs_in_every_order(tmp_path):
    out = tmp_path / "locality.json"
    argv = ["--small", "--graphs", "city-roads-L-shuffled", "communities", "--orders", "rcm", "clusters", "--ops",
            "spmm_sum", "--passes", "fwd", "--json", str(out)]  # fmt: skip
    assert _bench().main(argv) == 0
    rows = _cells(json.loads(out.read_text()))
    graphs, orders = ("city-roads-L-shuffled", "communities"), ("as generated", "rcm", "clusters")
    assert {(r["params"]["graph"], r["params"]["order"]) for r in rows} == {(g, o) for g in graphs for o in orders}
    for r in rows:
        assert r["ok"] and not r["skipped"] and r["metrics"]["rel_err"] < 1e-4, r
        assert ("gain" in r["metrics"]) == (r["params"]["order"] != "as generated"), r


@pytest.mark.slow
@given(g=graphs(max_nodes=16, max_edges=40), chunk=st.integers(1, 64), heads=st.sampled_from([1, 2]),
       op=st.sampled_from(bench_gnn_graphs.OPS))  # fmt: skip
@settings(max_examples=examples(12), deadline=None)  # each example compiles its own shapes
def test_chunked_reference_matches_the_ops(g, chunk, heads, op):
    """The benchmark's float32 reference, cut into node ranges of about ``chunk`` edges, against ``bs.gnn``'s XLA
    backend on the whole graph: outputs and the gradients of ``sum(out * ct)`` (max / min routed as the op routes
    them)."""
    n, d = g.num_nodes, 2
    keys = jax.random.split(jax.random.key(chunk), 5)
    ins = dict(x=jax.random.normal(keys[0], (n, heads * d)), xd=jax.random.normal(keys[1], (n, heads, d)),
               att=jax.random.normal(keys[2], (heads, d)), ct=jax.random.normal(keys[3], (n, heads, d)),
               v=jax.random.normal(keys[4], (n, heads, d)))  # fmt: skip
    args = bench_gnn_graphs.operands(op, ins)
    fwd = bench_gnn_graphs.reference(g, args, ins["ct"], op, False, chunk)
    got = bench_gnn_graphs.reference(g, args, ins["ct"], op, True, chunk)
    fb = bench_gnn_graphs.with_grad(bench_gnn_graphs.ours(g, op, "xla"), len(args))
    with jax.default_matmul_precision("highest"):
        want = jax.jit(fb)(*args, ins["ct"])
    assert len(got) == len(want) == len(args) + 1 and len(fwd) == 1
    for i, (a, w) in enumerate(zip((fwd[0], *got), (want[0], *want), strict=True)):
        # float32 sums in two orders: an absolute error of 1e-5 of the largest magnitude
        np.testing.assert_allclose(a, w, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(w).max())), err_msg=f"{op} {i}")


def _cells(doc, suite="gnn-graphs"):
    return [r for r in doc["results"] if r["suite"] == suite]


@pytest.mark.slow  # three ops in every order; every op: test_gnn_choice's slow tests
def test_bench_small_runs_and_checks(tmp_path):
    """``--small`` on a skewed graph (heavy nodes, nodes without in-edges): three ops in every order, ours, our
    backends and the JAX peers in each cell, checked; the torch peers recorded as skipped without torch."""
    out = tmp_path / "graphs.json"
    bench = _bench()
    argv = ["--small", "--graphs", "ogbn-arxiv", "--orders", "degree", "rcm", "--ops", "spmm_sum", "max", "gatv2",
            "--passes", "fwd", "--json", str(out)]  # fmt: skip
    assert bench.main(argv) == 0
    data = json.loads(out.read_text())
    rows = _cells(data)
    assert len(rows) == 3 * 3 and {(r["params"]["order"], r["params"]["op"]) for r in rows} == {
        (o, op) for o in ("as generated", "degree", "rcm") for op in ("spmm_sum", "max", "gatv2")}  # fmt: skip
    for r in rows:
        m = r["metrics"]
        assert r["ok"] and not r["skipped"] and r["params"]["pass"] == "fwd", r
        assert m["loop_ms"] > 0 and m["calls_ms"] > 0 and m["rel_err"] < 1e-4 and m["segment_loop_ms"] > 0, r
        assert ("gain" in m) == (r["params"]["order"] != "as generated")
        assert m["speedup_vs_best_peer"] > 0 and "pyg-scatter_skipped" in m, r
        assert ("torch-csr_skipped" in m) == (r["params"]["op"] == "spmm_sum"), r
    assert {r["metrics"]["implementation"] for r in rows} == {"spmm: xla", "aggregate: xla", "gatv2: xla"}
    assert all(r["metrics"]["max_in_degree"] > 0 for r in rows)


@pytest.mark.slow  # the suite's limit end to end; the quick suite run: test_bench_small_runs_and_checks
def test_bench_skips_rcm_above_the_limit(tmp_path):
    out = tmp_path / "graphs.json"
    bench = _bench()
    argv = ["--small", "--graphs", "pokec", "--orders", "degree", "rcm", "--rcm-max-edges", "100", "--ops", "max",
            "--json", str(out)]  # fmt: skip
    assert bench.main(argv) == 0
    rows = _cells(json.loads(out.read_text()))
    ran = [r for r in rows if not r["skipped"]]
    assert {r["params"]["order"] for r in ran} == {"as generated", "degree"}
    assert all("rcm_max_edges=100" in r["skipped"] for r in rows if r["params"]["order"] == "rcm")
    # a reordered graph's result is mapped back and checked like the others
    assert all(r["metrics"]["rel_err"] < 1e-4 for r in ran)


@pytest.mark.slow  # a second suite run on one graph; the quick one: test_bench_small_runs_and_checks
def test_bench_two_dtypes_one_graph_and_the_row_budget():
    """Both dtypes on one graph (cells and gains per dtype); a cell over its time budget gets fewer iterations, and a
    call over it by itself is the timing."""
    ops = ("spmm_sum", "max", "gatv2")
    cells = bench_gnn_graphs.suite(graphs=("ogbn-arxiv",), edges=None, scale=0.01, dtypes=("float32", "bfloat16"),
                                   orders=("as generated", "degree"), feat=16, heads=2, budget_s=1e-9, ops=ops,
                                   passes=("fwd",))  # fmt: skip
    results = [run_cell(c, Timer(iters=4, trials=1, warmup=0)) for c in cells]
    assert {(r.params["dtype"], r.params["order"], r.params["op"]) for r in results} == {
        (dt, o, op) for dt in ("float32", "bfloat16") for o in ("as generated", "degree") for op in ops
    }
    assert all(r.ok and not r.skipped for r in results), [r.error for r in results]
    assert all("gain" in r.metrics for r in results if r.params["order"] == "degree")
    assert all(r.metrics["rel_err"] < (1e-4 if r.params["dtype"] == "float32" else 2e-2) for r in results)
    # every call is over a budget of 1 ns: that call is the timing
    assert all(r.metrics["iters"] == 1 and r.metrics["timer"] == "one call" for r in results)
    assert all(r.metrics["xla_timer"] == "one call" and r.metrics["loop_ms"] > 0 for r in results)
    assert all(r.metrics["segment_iters"] == 1 and r.metrics["xla_iters"] == 1 for r in results)
    t = Timer(iters=20, trials=3, warmup=1)  # 8 calls per iteration (loop and calls, warm-up and trials)
    assert bench_gnn_graphs.capped_timer(t, 0.01, 20.0) is t
    assert repr(bench_gnn_graphs.capped_timer(t, 0.5, 20.0)) == "Timer(iters=5, trials=3, warmup=1)"
    assert repr(bench_gnn_graphs.capped_timer(t, 5.0, 20.0)) == "Timer(iters=1, trials=1, warmup=0)"
    assert (
        bench_gnn_graphs.capped_iters(20, 1, 0.5, 20.0) == 20 and bench_gnn_graphs.capped_iters(20, 1, 3.0, 20.0) == 6
    )


def test_a_peer_too_slow_once_is_not_run_again_on_its_graph_and_dtype(monkeypatch):
    """A peer whose one call (over the budget) was SLOW_PEER_RATIO times another peer's time is skipped in the other
    cells of the op's family in the dtype, on its graph and on graphs of more edges, naming the cell that timed it; a
    resumed run learns it from the kept cell; a cell's only peer is never skipped."""
    key, edges = ("pokec", "bfloat16", "spmm_sum", "fwd"), 30_622_564
    out = {"loop_ms": 1.0, "bcsr_loop_ms": 150.0, "bcsr_timer": "one call", "segment_loop_ms": 2.0,
           "torch-csr_loop_ms": 0.5, "edges": edges}  # fmt: skip
    alone = {"loop_ms": 0.001, "bcsr_loop_ms": 150.0, "bcsr_timer": "one call"}  # ours do not count: no other peer
    why = "too slow to run again: one call took 0.1 s in 'pokec bfloat16 as generated spmm_sum fwd', 300 times the " \
          "fastest other peer's"  # fmt: skip
    for slow, fast in ((out, dict(out, bcsr_loop_ms=49.0)), (out, dict(out, bcsr_timer="loop")), (out, alone)):
        shared, other = {}, {}
        bench_gnn_graphs._restore(shared, key, slow)  # a kept cell
        bench_gnn_graphs._note_slow_peers(other, key, fast, edges)  # 98x the fastest; timed in a loop
        assert bench_gnn_graphs._slow_peer(shared, edges, np.dtype(jax.numpy.bfloat16), "spmm_gcn", "bcsr") == why
        more = bench_gnn_graphs._slow_peer(shared, 123_718_280, "bfloat16", "spmm_sum", "bcsr")  # more edges
        assert more == f"{why} (a graph of 30,622,564 edges; this one has 123,718,280)"
        assert bench_gnn_graphs._slow_peer(shared, edges, "float32", "spmm_sum", "bcsr") is None  # another dtype
        assert bench_gnn_graphs._slow_peer(shared, 13_595_114, "bfloat16", "spmm_sum", "bcsr") is None  # fewer edges
        assert bench_gnn_graphs._slow_peer(shared, edges, "bfloat16", "max", "bcsr") is None  # another family
        assert bench_gnn_graphs._slow_peer(shared, edges, "bfloat16", "spmm_sum", "segment") is None  # in a loop
        assert bench_gnn_graphs._slow_peer(other, edges, "bfloat16", "spmm_sum", "bcsr") is None
    # the graph of fewest edges that showed it is the one named
    shared = {}
    bench_gnn_graphs._note_slow_peers(shared, key, out, edges)
    bench_gnn_graphs._note_slow_peers(shared, ("twitch-views", *key[1:]), out, 13_595_114)
    bench_gnn_graphs._note_slow_peers(shared, ("ogbn-products", *key[1:]), out, 123_718_280)
    assert "in 'twitch-views bfloat16" in bench_gnn_graphs._slow_peer(shared, edges, "bfloat16", "spmm_sum", "bcsr")
    # in a run: every call over a budget of 1 ns is one call; at a ratio of 0 every peer is too slow after one cell
    monkeypatch.setattr(bench_gnn_graphs, "SLOW_PEER_RATIO", 0.0)
    cells = bench_gnn_graphs.suite(graphs=("ogbn-arxiv",), edges=None, scale=0.002, dtypes=("float32",),
                                   orders=("as generated",), feat=16, heads=2, budget_s=1e-9,
                                   ops=("spmm_sum", "spmm_mean", "max"), passes=("fwd",))  # fmt: skip
    first, second, third = (run_cell(c, Timer(iters=2, trials=1, warmup=0)) for c in cells)
    assert first.ok and second.ok and third.ok, (first.error, second.error, third.error)
    assert "segment_skipped" not in third.metrics and third.metrics["segment_timer"] == "one call"  # another family
    assert first.metrics["bcsr_timer"] == "one call" and "bcsr_skipped" not in first.metrics
    for peer in bench_gnn_graphs.PEERS:
        assert f"{peer}_loop_ms" not in second.metrics
        assert second.metrics[f"{peer}_skipped"].startswith("too slow to run again: one call took ")
        assert "in 'ogbn-arxiv float32 as generated spmm_sum fwd'" in second.metrics[f"{peer}_skipped"]


def test_a_call_over_the_budget_runs_once():
    """A timed function compiles ahead of its first call, which is checked and timed: over the budget it is the only
    call (a peer taking seconds runs once); under it a second, warm call caps the iterations, then the timings."""
    runs = []

    def fn(x):
        jax.debug.callback(lambda: runs.append(1))
        return x * 2.0

    x = jax.numpy.ones((8,))
    kw = dict(want=x * 2.0, tol=None, dtype=np.float32, what="doubling")
    out = bench_gnn_graphs.timed(Timer(iters=3, trials=1, warmup=0), fn, (x,), 1e-9, **kw)
    assert len(runs) == 1 and out["timer"] == "one call" and out["iters"] == 1
    assert out["loop_ms"] == out["calls_ms"] > 0 and out["rel_err"] == 0
    runs.clear()
    out = bench_gnn_graphs.timed(Timer(iters=3, trials=1, warmup=0), fn, (x,), 60.0, **kw)
    assert "timer" not in out and out["iters"] == 3 and len(runs) >= 2 + 2 * 3  # first, warm, the loop's, the calls'


def test_paper_graph_is_a_graph():
    g = paper_graph("pokec", scale=0.001, seed=1, heavy_quantile=0.9)
    assert isinstance(g, gnn.Graph) and g.heavy_quantile == 0.9
    assert g.name == "synthetic degree-matched like pokec"


def _doc_table(text: str, heading: str, columns: int) -> list[list[str]]:
    """The cells of the first table after ``heading`` (header and separator dropped)."""
    rows = []
    for line in text[text.index(heading) :].splitlines()[1:]:
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip("|").split("|")])
        elif rows:
            break
    assert rows and all(len(r) == columns for r in rows), rows
    return rows[2:]


def test_docs_reordering_gains_are_the_jsons():
    """docs/gnn.md's table of "Reordering: what was measured" holds the gains of
    benchmarks/results/gnn_graphs*_h200.json, rounded as printed; a cell not measured is shown as such."""
    rows = []
    for name in ("gnn_graphs_h200.json", "gnn_graphs_products_h200.json"):
        rows += json.loads((ROOT / "benchmarks" / "results" / name).read_text())["rows"]
    cell = {(r["graph"], r["order"], r["op"], r["impl"]): r for r in rows}
    ops = {"SpMM sum fwd": "spmm_sum", "max fwd": "max", "GATv2 fwd+bwd": "gatv2"}
    impls = ("ours", "jax-segment", "torch-csr", "pyg-scatter")
    text = (ROOT / "docs" / "gnn.md").read_text()
    gains = _doc_table(text, "### Reordering: what was measured", 6)
    assert len(gains) == 11
    for g, op, *shown in gains:
        for impl, pair in zip(impls, shown, strict=True):
            want = []
            for order in ("degree", "rcm"):
                r = cell.get((g, order, ops[op], impl))
                want.append("–" if r is None or "gain" not in r else f"{r['gain']:.2f}")
            if pair:  # blank: no such implementation of the op (cuSPARSE runs SpMM only)
                assert pair.split(" / ") in (want, want[:1]), (g, op, impl, pair, want)
            else:
                assert want == ["–", "–"] and impl == "torch-csr" and op != "SpMM sum fwd", (g, op, impl)


def test_a_full_run_measures_the_graphs_fewest_edges_first():
    order = bench_gnn_graphs.RUN_ORDER
    assert sorted(order) == sorted(bench_gnn_graphs.GRAPHS) and bench_gnn_graphs.SIZES["full"]["graphs"] == order
    spec = {name: bench_gnn_graphs._spec(name) for name in order}
    edges = [spec[n]["edges"] * (2 if spec[n]["symmetric"] else 1) for n in order]
    assert edges == sorted(edges), dict(zip(order, edges, strict=True))


def test_parts_logged_with_their_seconds_and_a_peer_skipped_by_name(tmp_path, monkeypatch, capsys):
    """``--log-parts``: each part of a cell (its reference, each JAX timing) on stderr as it starts and with its
    seconds when it ends, so a cell a command's limit cut short says where its time went; ``--skip PART`` leaves a
    peer's part out by that name, recorded in the cell; the rest of the cell is unchanged."""
    bench = _bench()
    for module, name in ((bench_gnn_graphs, "reference"), (bench_gnn_graphs, "timed"), (bench, "_measure")):
        monkeypatch.setattr(module, name, getattr(module, name))  # the originals back after the test
    out = tmp_path / "parts.json"
    what = "max fwd on ogbn-arxiv (as generated)"
    argv = ["--small", "--ops", "max", "--passes", "fwd", "--log-parts", "--json", str(out)]
    assert bench.main([*argv, "--skip", f"{what} [segment] in float32"]) == 0
    parts = re.findall(r"\[part\] (.+): (started|\d+\.\d s|skipped \(--skip\))\n", capsys.readouterr().err)
    timed = ["the float32 reference of max", f"{what} in float32"]  # (the default ran XLA: its timing is copied)
    got = [(p, "ended" if s.endswith(" s") else s) for p, s in parts if p in timed]
    assert got == [(n, s) for n in timed for s in ("started", "ended")]  # each started, then ended
    assert [s for p, s in parts if p == f"{what} [segment] in float32"] == ["skipped (--skip)"]
    (row,) = _cells(json.loads(out.read_text()))
    m = row["metrics"]
    assert row["ok"] and m["xla_loop_ms"] > 0 and "segment_loop_ms" not in m
    assert m["segment_skipped"] == (f"refused: NotImplementedError: skipped by the command line (--skip "
                                    f"'{what} [segment] in float32')")  # fmt: skip
    with pytest.raises(SystemExit):  # ours and our backends are never skipped
        bench.main([*argv, "--skip", f"{what} [xla] in float32"])
    assert "expected a part of one of the peers" in capsys.readouterr().err
    assert bench.main([*argv, "--skip", f"{what} [segment] in bfloat16"]) == 0  # a name of no part: said so
    assert f"--skip '{what} [segment] in bfloat16' matched no part of the cells this command ran" in (
        capsys.readouterr().err)  # fmt: skip


def test_full_run_command_continues_the_run_and_passes_its_arguments(tmp_path):
    """``benchmarks/gnn_full_run.sh LIMIT [ARG ...]`` on a machine that says it is an H100 (a stand-in
    ``nvidia-smi``, and a ``python`` that prints its arguments): the H100's run copied into ``$OUT`` and continued
    there, the cells' time limit ``LIMIT - 90``, PyG's memory limit of an 80 GB card, the ARGs passed on."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("nvidia-smi", "echo 'NVIDIA H100 80GB HBM3'"), ("python", 'printf "%s\\n" "$@"')):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    out = tmp_path / "out"
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", OUT=str(out))
    part = "gatv2 fwd+bwd on power-law (as generated) [segment] in float32"
    r = subprocess.run(["bash", "benchmarks/gnn_full_run.sh", "400", "--skip", part], cwd=ROOT, env=env,
                       capture_output=True, text=True, check=True)  # fmt: skip
    json_path = out / "gnn_full_run2_h100.json"
    assert r.stdout.splitlines() == [
        f"GPU NVIDIA H100 80GB HBM3: benchmarks/results/gnn_full_run2_h100.json (continued in {json_path})",
        "benchmarks/bench_gnn_graphs.py", "--row-budget-s", "5", "--dtype", "float32", "bfloat16", "--pyg-mem-gib",
        "45", "--json", str(json_path), "--resume", "--log-parts", "--stop-after-s", "310", "--skip", part,
    ]  # fmt: skip
    assert json_path.read_bytes() == (ROOT / "benchmarks" / "results" / "gnn_full_run2_h100.json").read_bytes()


def test_script_resumes_across_a_named_code_change(tmp_path):
    """``--resume --resume-across DIGEST``: the run made by that code is continued (its cells kept), another refused."""
    bench = _bench()
    out = tmp_path / "run.json"
    argv = ["--small", "--ops", "max", "--passes", "fwd", "--json", str(out)]
    assert bench.main(argv) == 0
    doc = json.loads(out.read_text())
    old = "1" * 16  # a run of other code, written before parts named their code
    parts = [{k: v for k, v in p.items() if k != "source"} for p in doc["meta"]["parts"]]
    out.write_text(json.dumps(dict(doc, meta=dict(doc["meta"], source=old, parts=parts))))
    with pytest.raises(ValueError, match=r"expected its source to be this run's '[0-9a-f]{16}'; got '1{16}'"):
        bench.main([*argv, "--resume"])
    with pytest.raises(SystemExit):
        bench.main([*argv, "--resume-across", old])  # without --resume
    assert bench.main([*argv, "--resume", "--resume-across", old]) == 0
    got = json.loads(out.read_text())
    assert got["results"] == doc["results"]  # the cell kept, not run again
    assert [p["source"] for p in got["meta"]["parts"]] == [old, got["meta"]["source"]] and got["meta"]["source"] != old
