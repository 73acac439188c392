"""The GNN ops' default backend by the graph (``order.choice``, data in ``tuned.CHOICES``) and the ``gnn-graphs``
suite's cells of every op and pass at the tiny size."""

import functools
import json
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import examples
from hypothesis import given, settings
from hypothesis import strategies as st

import blocksparse as bs
from blocksparse import hardware
from blocksparse.bench import Timer, gnn_table, run_cell
from blocksparse.bench import gnn_graphs as suite
from blocksparse.gnn.generators import power_law_edges
from blocksparse.ops.gnn import order, tuned
from blocksparse.ops.gnn.order import COVERAGE, GraphStats, choice, distance

ROOT = Path(__file__).resolve().parent.parent
H200, H100 = hardware.H200.kind, hardware.H100.kind
KEYS = sorted(tuned.CHOICES[H200])
#: Each measured device kind and the run its choices come from.
RUNS = {H200: tuned.FULL_RUN, H100: tuned.H100_RUN}
DEVICES = {H200: hardware.H200, H100: hardware.H100}
KIND_KEYS = [(kind, key) for kind in RUNS for key in sorted(tuned.CHOICES[kind])]
BOTH = ("pallas", "xla")


def _default(op, dtype):
    return order.implementations(op, None, dtype)


# ---------------------------------------------------------------------------------- the data and its sources
def _json(name):
    return json.loads((ROOT / "benchmarks" / "results" / name).read_text())


def _times(m: tuned.Measured, family: str, dtype: str) -> tuple[float, float]:
    """(Pallas ms, XLA ms) of measured graph ``m`` in the run's JSON: both backends named in the same cell."""
    label = m.cell.split(": ")[0]
    (r,) = [r for r in _json(m.results)["results"] if r["label"] == label]
    prm, met = r["params"], r["metrics"]
    assert (prm["graph"], prm["dtype"], prm["feat"]) == (m.graph, dtype, m.feat), m
    assert (met["nodes"], met["edges"], met["max_in_degree"]) == (m.nodes, m.edges, m.max_in_degree), m
    assert "pallas" in met["pallas_implementation"] and "xla" in met["xla_implementation"], m
    return met["pallas_loop_ms"], met["xla_loop_ms"]


@pytest.mark.parametrize(("kind", "key"), KIND_KEYS, ids=[f"{kind[7:11]}-{'/'.join(k)}" for kind, k in KIND_KEYS])
def test_every_measured_graph_is_its_json(kind, key):
    """Each graph of the tuned data names a results JSON whose statistics it carries and whose times say which
    backend was faster, as it does: no number of the choice is made up."""
    family, dtype, pass_ = key
    points = tuned.CHOICES[kind][key]
    assert points and len({m.graph for m in points}) == len(points)
    for m in points:
        assert (ROOT / "benchmarks" / "results" / m.results).is_file(), m
        assert m.faster in BOTH and m.cell and m.feat == 128, m
        pallas, xla = _times(m, family, dtype)
        faster = "pallas" if pallas <= xla else "xla"
        if m.note == suite.TIE_NOTE:  # XLA faster by at most suite.TIE: the default order kept
            assert faster == "xla" and pallas <= xla * (1 + suite.TIE) and m.faster == "pallas", m
            continue
        assert faster == m.faster and not m.note, (m.graph, key, pallas, xla)


def test_only_the_h200_and_the_h100_have_choices():
    assert set(tuned.CHOICES) == set(RUNS) and set(tuned.CHOICES[H100]) == set(tuned.CHOICES[H200])
    assert tuned.measured("spmm", "float32", "fwd", kind="some GPU") == ()
    assert tuned.measured("spmm", "float16", "fwd", kind=H200) == ()
    assert tuned.measured("spmm", "float32", "fwd", kind=H100) == tuned.CHOICES[H100][("spmm", "float32", "fwd")]


def test_the_h100_follows_its_own_run_where_the_runs_differ():
    """The H100's run measured the kernels as they are now, the H200's an earlier version: where they disagree (the
    max / min kernels on twitch-views, SpMM with the GCN norm on city-roads-L), the H100 runs its own run's faster
    backend and the reason names its run; the kernels' entries (TABLES) stay the H200's."""
    twitch, roads = GraphStats(168_114, 13_595_114, 35_802), GraphStats(142_257, 463_710, 4)
    for pass_ in order.PASSES:
        assert choice("aggregate", twitch, 128, jnp.float32, pass_, kind=H200).impls[0] == "xla"
        c = choice("aggregate", twitch, 128, jnp.float32, pass_, kind=H100)
        assert c.impls[0] == "pallas" and "gnn_full_run2_h100.json: twitch-views float32" in c.reason, c
    assert choice("spmm", roads, 128, jnp.float32, kind=H200, norm="both").impls[0] == "xla"
    assert choice("spmm", roads, 128, jnp.float32, kind=H100, norm="both").impls[0] == "pallas"
    c = choice("gatv2", roads, 128, jnp.float32, "fwd+bwd", kind=H100)  # where both runs say XLA
    assert c.impls[0] == "xla" and c.measured.results == tuned.H100_RUN
    assert tuned.entry("spmm.variant", H100) == tuned.entry("spmm.variant", H200)


RUN = tuned.FULL_RUN  # the one run every H200 entry comes from (docs/gnn.md, "The full table")
#: Each run's cells where the default does not run the cell's own faster backend: SpMM's mean follows its sum's
#: cells, min follows max's (one kernel each), and there the cell's own faster backend was the other one.
FAMILY_MISSES = {
    H200: {
        "city-roads-L float32 as generated spmm_mean fwd+bwd",
        "ogbn-arxiv float32 as generated spmm_mean fwd+bwd",
        "twitch-views float32 as generated min fwd",
        "twitch-views float32 as generated min fwd+bwd",
    },
    H100: {  # SpMM's mean: XLA faster by under 1% (a tie) or slower, where the sum's cells (one kernel) had XLA faster
        "twitch-views float32 as generated spmm_mean fwd",
        "twitch-views float32 as generated spmm_mean fwd+bwd",
    },
}
_FAMILY = {"spmm_sum": "spmm", "spmm_mean": "spmm", "spmm_gcn": "spmm", "max": "aggregate", "min": "aggregate",
           "gatv2": "gatv2", "graph_attention": "graph_attention"}  # fmt: skip


#: The statistics of the suite's graphs that take long to build (pokec: 13 s and 2 GB on 2 cores; ogbn-products: 38 s),
#: its own and its transpose's, as the slow test below checks them against the graph built.
_PRODUCTS = GraphStats(2_449_029, 123_718_280, 17_443)  # symmetric: its transpose's are the same
KNOWN_STATS = {"pokec": (GraphStats(1_632_803, 30_622_564, 13_665), GraphStats(1_632_803, 30_622_564, 8_729)),
               "ogbn-products": (_PRODUCTS, _PRODUCTS)}  # fmt: skip


@pytest.mark.slow  # builds pokec's and ogbn-products' stand-ins
@pytest.mark.parametrize("name", list(KNOWN_STATS))
def test_known_stats_are_the_suites_graphs(name):
    g = suite.graph(name)
    assert (order.graph_stats(g), order.graph_stats(g, transpose=True)) == KNOWN_STATS[name]


@functools.cache
def _suite_graph(name: str):
    """The suite's graph ``name``, built once for this module (twitch-views or the power-law graph: seconds)."""
    return suite.graph(name)


@functools.cache
def _suite_stats(name: str) -> tuple[GraphStats, GraphStats]:
    """The statistics of the suite's graph ``name`` and of its transpose, computed once for this module, or
    ``KNOWN_STATS`` (the graphs too large to build in the quick suite)."""
    if name in KNOWN_STATS:
        return KNOWN_STATS[name]
    g = _suite_graph(name)
    return order.graph_stats(g), order.graph_stats(g, transpose=True)


def _picks(stats: tuple[GraphStats, GraphStats], prm, kind: str = H200) -> set[str]:
    """The backends the default runs for a run's cell on a graph of ``stats`` (its own and its transpose's): SpMM
    under grad by its forward + backward measurement where there is one, else (and forward alone) one forward product
    each way, g's and g.T's choice."""
    op, pass_, dtype = _FAMILY[prm["op"]], prm["pass"], jnp.dtype(prm["dtype"])
    if op != "spmm":
        return {choice(op, stats[0], prm["feat"], dtype, pass_, kind=kind).impls[0]}
    norm = "both" if prm["op"] == "spmm_gcn" else None
    c = choice(op, stats[0], prm["feat"], dtype, pass_, kind=kind, norm=norm)
    if pass_ == "fwd+bwd" and c.measured is not None:
        return {c.impls[0]}
    return {choice(op, stats[t], prm["feat"], dtype, kind=kind, norm=norm).impls[0]
            for t in (False, pass_ == "fwd+bwd")}  # fmt: skip


@pytest.mark.parametrize("kind", list(RUNS))
def test_the_run_is_the_tuned_data(kind):
    """Every entry of a device names its one run, and the entries are exactly what ``measured_from`` reads from its
    JSON: every family, dtype and pass, one entry per graph whose cell told the faster backend."""
    run = RUNS[kind]
    got = suite.measured_from(_json(run), run)
    assert {k: tuple(v) for k, v in got.items()} == {k: v for k, v in tuned.CHOICES[kind].items() if v}
    assert all(m.results == run for v in tuned.CHOICES[kind].values() for m in v)


@pytest.mark.parametrize(("kind", "graph"), [(k, g) for k in RUNS for g in suite.GRAPHS])
def test_the_default_runs_the_faster_backend_of_each_cell(kind, graph):
    """On each graph of a device's run, from the statistics the host computes for the suite's graph, the default on
    that device runs the faster backend of every cell but the family misses; the H200's full table shows the backend
    that runs."""
    doc = _json(RUNS[kind])
    rows = [r for r in doc["results"] if r["params"]["graph"] == graph and r["ok"]]
    if not rows:
        pytest.skip(f"{graph} is not in the run yet")
    stats = _suite_stats(graph)
    table = gnn_table.cells(doc)
    for r in rows:
        prm, met = r["params"], r["metrics"]
        assert stats[0] == GraphStats(met["nodes"], met["edges"], met["max_in_degree"]), r["label"]
        picks = _picks(stats, prm, kind)
        assert len(picks) == 1, (r["label"], picks)
        if kind == H200:  # the run whose defaults ran its own data (the H100's ran the H200's)
            assert table[(graph, prm["dtype"], prm["op"], prm["pass"])].backend in (None, *picks), r["label"]
        own = suite.faster(met)
        if own is None:  # the cell could not tell: a backend out of memory, or timed once
            continue
        assert (picks == {own[0]}) == (r["label"] not in FAMILY_MISSES[kind]), (r["label"], picks)


# ---------------------------------------------------------------------------------- choice on each kind of graph
def _op(family):
    """``(op, norm)`` that ``choice`` takes for a family of the tuned data."""
    return ("spmm", "both") if family == "spmm_gcn" else (family, None)


def _follows(stats, graph, near=True, kind=H200):
    """At ``stats``, every key ``kind``'s run measured ``graph`` for picks what was measured there (``near=False``: is
    too far from every measured graph, and takes the default order)."""
    for key, points in tuned.CHOICES[kind].items():
        family, dtype, pass_ = key
        op, norm = _op(family)
        c = choice(op, stats, 128, jnp.dtype(dtype), pass_, kind=kind, norm=norm)
        mine = [m for m in points if m.graph == graph]
        if near and mine:
            assert c.measured == mine[0] and c.impls[0] == mine[0].faster, (key, c)
        elif not near:
            assert c.measured is None and c.impls == _default(op, jnp.dtype(dtype)), (key, c)


def test_road_like_graph_follows_the_run():
    """city-roads-L (a grid, degrees 1 to 4): XLA for both attentions' forward + backward and for SpMM with the GCN norm
    in float32's forward, the kernels for max / min and SpMM; a road network of another city (half the nodes, degrees
    up to 6) follows the same measurements. float16 and other GPUs: not measured."""
    g = bs.gnn.paper_graph("city-roads-L")
    stats = order.graph_stats(g)
    assert stats == GraphStats(142_257, 463_710, 4)
    for s in (stats, GraphStats(70_000, 230_000, 6)):
        _follows(s, "city-roads-L")
    for dtype in (jnp.float32, jnp.bfloat16):
        for op in ("gatv2", "graph_attention"):
            assert choice(op, stats, 128, dtype, "fwd+bwd", kind=H200).impls[0] == "xla", (op, dtype)
        for pass_ in order.PASSES:
            assert choice("aggregate", stats, 128, dtype, pass_, kind=H200).impls[0] == "pallas", (dtype, pass_)
            assert choice("spmm", stats, 128, dtype, pass_, kind=H200).impls[0] == "pallas", (dtype, pass_)
    assert choice("spmm", stats, 128, jnp.float32, kind=H200, norm="both").impls[0] == "xla"
    for op, pass_ in (("spmm", "fwd"), ("aggregate", "fwd+bwd"), ("gatv2", "fwd+bwd")):
        c = choice(op, stats, 128, jnp.float16, pass_, kind=H200)
        assert c.impls == _default(op, jnp.float16) and c.measured is None and c.reason.startswith("not measured"), c
        c = choice(op, stats, 128, jnp.float32, pass_, kind="NVIDIA A100")
        assert c.impls == _default(op, jnp.float32) and c.measured is None


@pytest.mark.slow  # builds two power-law graphs (seconds each)
@pytest.mark.parametrize("kind", list(RUNS))
def test_power_law_graphs_follow_the_run(kind):
    """A power-law graph of half the measured one's size follows its measurements; one of a sixteenth is too far from
    every measured graph: the default."""
    if not any(m.graph == "power-law" for v in tuned.CHOICES[kind].values() for m in v):
        pytest.skip("the power-law graph is not in the run yet")
    for n, e, near in ((131_072, 4_194_304, True), (16_384, 524_288, False)):
        _, dst = power_law_edges(n, e, seed=0)
        _follows(GraphStats(n, e, int(np.bincount(dst, minlength=n).max())), "power-law", near, kind)


def test_social_graphs_follow_their_nearest_measurement():
    """ogbn-arxiv (mean 6.9): the kernels for every op, dtype and pass; twitch-views (mean 81, hubs of 35,802
    in-edges): XLA for max / min and float32's SpMM, the kernels for bfloat16's SpMM and both attentions; a graph within
    a factor 1.5 of one follows it; 64 features are near enough to the 128 measured, 16 are not."""
    arxiv = GraphStats(169_343, 1_166_243, 13_185)
    twitch = GraphStats(168_114, 13_595_114, 35_802)
    _follows(arxiv, "ogbn-arxiv")
    _follows(twitch, "twitch-views")
    _follows(GraphStats(120_000, 120_000 * 100, 30_000), "twitch-views")
    for key, points in tuned.CHOICES[H200].items():
        assert all(m.faster == "pallas" for m in points if m.graph == "ogbn-arxiv"), key
    for dtype in (jnp.float32, jnp.bfloat16):
        for pass_ in order.PASSES:
            assert choice("aggregate", twitch, 128, dtype, pass_, kind=H200).impls[0] == "xla", (dtype, pass_)
            assert choice("spmm", twitch, 128, dtype, pass_, kind=H200).impls[0] == (
                "xla" if dtype == jnp.float32 else "pallas"
            )
        assert choice("graph_attention", twitch, 128, dtype, kind=H200).impls[0] == "pallas"
    assert choice("aggregate", twitch, 64, jnp.float32, kind=H200).impls[0] == "xla"
    assert choice("aggregate", twitch, 16, jnp.float32, kind=H200).measured is None


def _community(n=150_000, size=500, degree=20, p_in=0.9, seed=0):
    """A graph of communities: ``degree`` in-edges per node, a fraction ``p_in`` from its own community."""
    rng = np.random.default_rng(seed)
    dst = np.repeat(np.arange(n), degree)
    same = rng.random(dst.size) < p_in
    src = np.where(same, (dst // size) * size + rng.integers(0, size, dst.size), rng.integers(0, n, dst.size))
    return bs.gnn.Graph.from_edges(src.astype(np.int32), dst.astype(np.int32), n)


def test_community_graph_is_not_measured():
    """No graph of communities was measured (its in-degrees are all about equal, unlike every measured graph with
    its mean): the default order, saying so."""
    g = _community()
    stats = order.graph_stats(g)
    assert stats.mean_in_degree == 20 and stats.skew < 3
    for op in order.OPS:
        for dtype in (jnp.float32, jnp.bfloat16):
            for pass_ in order.PASSES:
                c = choice(op, stats, 128, dtype, pass_, kind=H200)
                assert c.impls == _default(op, dtype) and c.reason.startswith("not measured: the default"), c


def test_the_ops_dispatch_by_the_choice():
    """On the road-like graph under the interpreter (where the kernels would run) the default traces the kernels
    for SpMM, max (with its gradient) and the forward-only GATv2, XLA for SpMM with the GCN norm's forward, GATv2 and
    graph attention under grad (in bfloat16: XLA for GATv2's forward, the kernels for SpMM, max and the GCN norm); an
    explicit implementation or a config is obeyed."""
    g = bs.gnn.paper_graph("city-roads-L")
    n = g.num_nodes
    x = jax.ShapeDtypeStruct((n, 128), jnp.float32)
    xs = jax.ShapeDtypeStruct((n, 8, 16), jnp.float32)
    att = jax.ShapeDtypeStruct((8, 16), jnp.float32)

    def ran_all(fn, *args):  # every op traced, in order, with the H200's data on any machine
        with hardware.fake(hardware.H200), bs.interpret(), bs.dispatch_log() as log:
            jax.eval_shape(fn, *args)
        return list(log)

    def ran(fn, *args):  # the last backend of each op
        return dict(ran_all(fn, *args))

    assert ran(lambda x: bs.gnn.spmm(g, x), x) == {"spmm": "pallas"}
    assert ran(lambda x: bs.gnn.spmm(g, x, norm="right"), x) == {"spmm": "pallas"}  # SpMM's own measurements
    assert ran(lambda x: bs.gnn.spmm(g, x, norm="both"), x) == {"spmm": "xla"}  # the GCN norm's: XLA faster here
    # under grad the GCN norm follows its forward + backward cell (the kernels were faster there): both products
    assert ran_all(jax.grad(lambda x: bs.gnn.spmm(g, x, norm="both").sum()), x) == [("spmm", "pallas")] * 2
    assert ran(jax.grad(lambda x: bs.gnn.spmm(g, x).sum()), x) == {"spmm": "pallas"}
    assert ran(lambda x: bs.gnn.aggregate(g, x, "max"), x) == {"aggregate": "pallas"}
    assert ran(lambda x: bs.gnn.spmm(g, x, implementation="xla"), x) == {"spmm": "xla"}
    assert ran(lambda x: bs.gnn.spmm(g, x, config=bs.gnn.GatherConfig()), x) == {"spmm": "pallas"}
    assert ran(lambda xs, a: bs.gnn.gatv2(g, xs, xs, a), xs, att) == {"gatv2": "pallas"}
    gat_grad = jax.grad(lambda xs, a: bs.gnn.gatv2(g, xs, xs, a).sum())
    assert ran(gat_grad, xs, att) == {"gatv2": "xla", "gatv2_bwd": "xla"}
    attn_grad = jax.grad(lambda xs: bs.gnn.graph_attention(g, xs, xs, xs).sum())
    assert ran(attn_grad, xs) == {"graph_attention": "xla", "graph_attention_bwd": "xla"}
    max_grad = jax.grad(lambda x: bs.gnn.aggregate(g, x, "max").sum())  # measured with the arg-max: kernels
    assert ran(max_grad, x) == {"aggregate": "pallas"}
    # bfloat16 features: XLA for GATv2's forward, the kernels for max (alone and under grad), SpMM and SpMM with the
    # GCN norm
    x16, xs16, att16 = (jax.ShapeDtypeStruct(a.shape, jnp.bfloat16) for a in (x, xs, att))
    assert ran(lambda x: bs.gnn.aggregate(g, x, "max"), x16) == {"aggregate": "pallas"}
    assert ran(max_grad, x16) == {"aggregate": "pallas"}
    assert ran(lambda x: bs.gnn.spmm(g, x), x16) == {"spmm": "pallas"}
    # under grad SpMM follows its forward + backward cell: the kernels, both products
    assert ran_all(jax.grad(lambda x: bs.gnn.spmm(g, x).astype(jnp.float32).sum()), x16) == [("spmm", "pallas")] * 2
    assert ran(lambda x: bs.gnn.spmm(g, x, norm="both"), x16) == {"spmm": "pallas"}
    assert ran(lambda xs, a: bs.gnn.gatv2(g, xs, xs, a), xs16, att16) == {"gatv2": "xla"}


@pytest.mark.parametrize("kind", list(RUNS))
@pytest.mark.parametrize("name", ["ogbn-arxiv", *(pytest.param(n, marks=pytest.mark.slow)  # (seconds to build)
                                   for n in ("twitch-views", "power-law"))])  # fmt: skip
def test_the_ops_run_the_choice_on_each_kind_of_graph(name, kind):
    """On a graph of each kind a device's run measured (citations, a dense social graph with hubs, the power-law
    graph), under the interpreter (where the kernels would run) on that device faked, every op traces, alone and under
    ``jax.grad``, the backend that the choice names for it: the run's data reaches the ops."""
    if not any(m.graph == name for v in tuned.CHOICES[kind].values() for m in v):
        pytest.skip(f"{name} is not in the run yet")
    g, stats = _suite_graph(name), _suite_stats(name)
    n = g.num_nodes
    ops = {"spmm_sum": lambda x, a: bs.gnn.spmm(g, x.reshape(n, 128)),
           "spmm_gcn": lambda x, a: bs.gnn.spmm(g, x.reshape(n, 128), norm="both"),
           "max": lambda x, a: bs.gnn.aggregate(g, x.reshape(n, 128), "max"),
           "gatv2": lambda x, a: bs.gnn.gatv2(g, x, x, a),
           "graph_attention": lambda x, a: bs.gnn.graph_attention(g, x, x, x)}  # fmt: skip
    for dtype in ("float32", "bfloat16"):
        xs = jax.ShapeDtypeStruct((n, 8, 16), jnp.dtype(dtype))
        att = jax.ShapeDtypeStruct((8, 16), jnp.dtype(dtype))
        for op, fn in ops.items():
            for pass_ in order.PASSES:
                run = fn if pass_ == "fwd" else jax.grad(lambda x, a, f=fn: f(x, a).astype(jnp.float32).sum())
                with hardware.fake(DEVICES[kind]), bs.interpret(), bs.dispatch_log() as log:  # its data anywhere
                    jax.eval_shape(run, xs, att)
                want = _picks(stats, dict(op=op, dtype=dtype, feat=128, **{"pass": pass_}), kind)
                assert {impl for _, impl in log} == want, (name, op, dtype, pass_, list(log), want)


def test_graph_stats():
    g = bs.gnn.Graph.from_edges([0, 0, 0, 1], [1, 2, 3, 2], 5)
    assert order.graph_stats(g) == GraphStats(5, 4, 2)
    assert order.graph_stats(g, transpose=True) == GraphStats(5, 4, 3)  # g.T's in-degrees: g's out-degrees
    dg = bs.gnn.DynamicGraph.from_edge_index(np.array([[0, 1], [1, 2]]), num_nodes=3)
    assert order.graph_stats(dg) is None
    c = choice("spmm", None, 128, jnp.float32, kind=H200)
    assert c.impls == _default("spmm", jnp.float32) and "traced" in c.reason
    assert GraphStats(4, 8, 5).mean_in_degree == 2 and GraphStats(4, 8, 5).skew == 2.5


def test_bad_input():
    with pytest.raises(ValueError, match=r"Expected a GNN op in \[.*\]. Got 'conv'"):
        choice("conv", None, 8, jnp.float32)
    with pytest.raises(ValueError, match=r"Expected pass_ in \['fwd', 'fwd\+bwd'\]. Got 'bwd'"):
        choice("spmm", None, 8, jnp.float32, "bwd")
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="Expected feat a positive int. Got"):
            choice("spmm", None, bad, jnp.float32)
    with pytest.raises(ValueError, match=r"Expected GraphStats.nodes a non-negative int. Got -1"):
        GraphStats(-1, 0, 0)
    with pytest.raises(ValueError, match=r"Expected max_in_degree <= edges. Got max_in_degree=5, edges=4"):
        GraphStats(3, 4, 5)


# ---------------------------------------------------------------------------------- properties of the choice
@st.composite
def _stats(draw):
    nodes = draw(st.integers(1, 10**7))
    edges = draw(st.integers(0, 10**9))
    return GraphStats(nodes, edges, draw(st.integers(0, edges)))


CASES = dict(op=st.sampled_from(sorted(order.OPS)), dtype=st.sampled_from(["float32", "bfloat16", "float16"]),
             pass_=st.sampled_from(order.PASSES), feat=st.integers(1, 4096))  # fmt: skip


@given(stats=_stats(), **CASES)
@settings(max_examples=examples(400, 100), deadline=None)
def test_choice_follows_the_nearest_measured_graph(stats, op, dtype, pass_, feat):
    """The order is both backends; measured: the nearest graph within the coverage decides which is first;
    otherwise the default order, said to be not measured."""
    c = choice(op, stats, feat, dtype, pass_, kind=H200)
    assert sorted(c.impls) == sorted(BOTH)
    points = tuned.measured(op, dtype, pass_, kind=H200)
    near = [distance(stats, feat, m) for m in points]
    if c.measured is None:
        assert c.impls == _default(op, dtype) and c.reason.startswith("not measured: the default")
        assert all(d > math.log(COVERAGE) for d in near)
    else:
        d = distance(stats, feat, c.measured)
        assert c.measured in points and d <= math.log(COVERAGE) and d == min(near)
        assert c.impls[0] == c.measured.faster and c.measured.graph in c.reason and c.measured.results in c.reason
    assert choice(op, stats, feat, dtype, pass_, kind="some GPU").impls == _default(op, dtype)


@given(key=st.sampled_from(KEYS), data=st.data())
@settings(max_examples=examples(100, 25), deadline=None)
def test_choice_at_and_near_a_measured_graph_is_its_measurement(key, data):
    """At a measured graph's statistics, or within a factor 1.5 of them (nearer to it than to any other), the
    choice is what was measured there."""
    family, dtype, pass_ = key
    op, norm = ("spmm", "both") if family == "spmm_gcn" else (family, None)  # the GCN norm's own measurements
    m = data.draw(st.sampled_from(tuned.CHOICES[H200][key]))
    f = [data.draw(st.floats(1 / 1.5, 1.5)) for _ in range(3)]
    nodes = max(1, round(m.nodes * f[0]))
    edges = round(nodes * m.mean_in_degree * f[1])
    stats = GraphStats(nodes, edges, min(edges, max(1, round(m.max_in_degree * f[2]))))
    others = [o for o in tuned.CHOICES[H200][key] if o is not m]
    if any(distance(stats, m.feat, o) <= distance(stats, m.feat, m) for o in others):
        return  # another measured graph is as near: the nearest decides (the test above)
    assert choice(op, stats, m.feat, dtype, pass_, kind=H200, norm=norm).impls[0] == m.faster
    exact = GraphStats(m.nodes, m.edges, m.max_in_degree)
    assert choice(op, exact, m.feat, dtype, pass_, kind=H200, norm=norm).measured == m


# ---------------------------------------------------------------------------------- the suite's new cells
def _cells(**kw):
    sizes = dict(suite.SIZES["tiny"], **kw)
    return [run_cell(c, Timer(iters=1, trials=1, warmup=0)) for c in suite.suite(**sizes)]


def _check(results, dtype="float32"):
    for r in results:
        m = r.metrics
        assert r.ok and not r.skipped, (r.label, r.error)
        assert set(r.params) >= {"graph", "op", "dtype", "pass"} and r.params["dtype"] == dtype
        tol = 1e-4 if dtype == "float32" else 3e-2
        assert m["rel_err"] < tol and m["xla_rel_err"] < tol, r.label
        assert m["speedup_vs_best_peer"] > 0 and m["best_peer"] in ("segment", "bcsr"), r.label
        assert m["best_peer_ms"] == min(m[f"{p}_loop_ms"] for p in ("segment", "bcsr") if f"{p}_loop_ms" in m)
        assert ("bcsr_loop_ms" in m) == r.params["op"].startswith("spmm"), r.label
        assert m["choice"].startswith(("not measured", "forward: not measured")), m["choice"]  # tiny: too far
        if jax.default_backend() == "cpu":
            assert "no GPU" in m["pallas_skipped"] and "xla" in m["implementation"]


def test_tiny_cells_of_each_op_check_against_the_reference():
    """Beside the tiny size's cells (the GCN norm, min and graph attention, forward + backward; test_bench runs
    them): the mean's and max's forward alone on the power-law graph (the rest: the slow tests below)."""
    results = _cells(graphs=("power-law",), ops=("spmm_mean", "max"), passes=("fwd",))
    assert [r.label for r in results] == [f"power-law float32 as generated {op} fwd" for op in ("spmm_mean", "max")]
    _check(results)


@pytest.mark.slow  # every op and pass, both dtypes, a reordering, three kinds of graph
@pytest.mark.parametrize(("graph", "dtype", "orders"), [("city-roads-L", "bfloat16", ("as generated", "degree")),
                                                         ("power-law", "float32", ("as generated",)),
                                                         ("ogbn-arxiv", "bfloat16", ("as generated",))])  # fmt: skip
def test_every_cell_at_the_tiny_size(graph, dtype, orders):
    results = _cells(graphs=(graph,), ops=suite.OPS, passes=suite.PASSES, dtypes=(dtype,), orders=orders)
    assert len(results) == len(suite.OPS) * len(suite.PASSES) * len(orders)
    _check(results, dtype)
    assert all("gain" in r.metrics for r in results if r.params["order"] == "degree")


@pytest.mark.slow  # the Pallas kernels interpreted in every cell of one graph
def test_every_cell_with_the_kernels_interpreted():
    with bs.interpret():
        results = _cells(ops=suite.OPS, passes=suite.PASSES)
    for r in results:
        assert r.ok, (r.label, r.error)
        assert r.metrics["pallas_rel_err"] < 1e-4 and "pallas" in r.metrics["implementation"], r.label
        assert r.metrics["faster_backend"] in BOTH


def test_suite_bad_input():
    with pytest.raises(ValueError, match=r"Expected each op in \[.*\]. Got \['conv'\]"):
        suite.suite(**dict(suite.SIZES["tiny"], ops=("conv",)))
    with pytest.raises(ValueError, match=r"Expected each graph in \[.*'power-law', .*'communities'\]. Got \['cora'\]"):
        suite.suite(**dict(suite.SIZES["tiny"], graphs=("cora",)))


def test_a_runs_json_becomes_tuned_data():
    """``measured_from`` turns a suite run's cells where both backends were timed into the tuned data's graphs, each
    naming the JSON and its cell; other cells (a CPU run: no kernels; a reordering) give none."""

    def row(op, pass_, order="as generated", **m):
        prm = dict(graph="pokec", op=op, dtype="bfloat16", order=order, feat=128, **{"pass": pass_})
        lbl = suite.label("pokec", "bfloat16", order, op, pass_)
        metrics = dict(nodes=1000, edges=20000, max_in_degree=900, **m)
        return dict(suite="gnn-graphs", label=lbl, params=prm, metrics=metrics)

    both = dict(pallas_loop_ms=2.0, xla_loop_ms=1.0, faster_backend="xla")
    doc = {"results": [row("spmm_sum", "fwd", **both), row("spmm_sum", "fwd+bwd", **both), row("min", "fwd", **both),
                       row("max", "fwd+bwd", **both), row("max", "fwd", "degree", **both),
                       row("gatv2", "fwd", pallas_skipped="refused: no GPU")]}  # fmt: skip
    got = suite.measured_from(doc, "gnn_graphs_full_h200.json")
    assert set(got) == {
        ("spmm", "bfloat16", "fwd"),
        ("spmm", "bfloat16", "fwd+bwd"),
        ("aggregate", "bfloat16", "fwd+bwd"),
    }
    for (family, dtype, pass_), (m,) in got.items():
        assert (m.graph, m.nodes, m.edges, m.max_in_degree, m.feat, m.faster) == ("pokec", 1000, 20000, 900, 128, "xla")
        assert m.results == "gnn_graphs_full_h200.json" and m.cell.startswith("pokec bfloat16 as generated")
        assert choice(family, GraphStats(1000, 20000, 900), 128, dtype, pass_).measured is None  # not pasted yet


# ---------------------------------------------------------------------------------- the docs' tables of the run
def test_docs_tables_are_the_run():
    """docs/gnn.md's generated blocks (the full table, its targets, which backend runs first) are what
    ``blocksparse.bench.gnn_table`` prints for the run's JSON: the run the tuned data names, or the JSON the marker
    names; every run of the tuned data has all three; ``gnn_table.render`` remakes them all."""
    text = (ROOT / "docs" / "gnn.md").read_text()
    blocks = {(m.group(1), m.group(2) or tuned.FULL_RUN) for m in gnn_table.BLOCK.finditer(text)}
    assert {(name, run) for name in ("full_table", "targets", "choice_table") for run in RUNS.values()} <= blocks
    assert gnn_table.render(text, ROOT / "benchmarks" / "results") == text


def test_render_fills_blocks_and_refuses_unknown_ones(tmp_path):
    doc = _json(RUN)
    (tmp_path / "run.json").write_text(json.dumps(doc))
    text = ("a\n<!-- gnn_table.targets run.json -->\nold\n<!-- end -->\n"
            "b\n<!-- gnn_table.choice_table -->\n\n<!-- end -->\n")  # fmt: skip
    got = gnn_table.render(text, tmp_path, run="run.json")
    new_block = text.replace("-->\n\n<!-- end", "-->\n<!-- end")  # a block added with nothing in it yet
    assert gnn_table.render(new_block, tmp_path, run="run.json") == got
    assert got == (f"a\n<!-- gnn_table.targets run.json -->\n{gnn_table.targets(doc)}\n<!-- end -->\nb\n"
                   f"<!-- gnn_table.choice_table -->\n{gnn_table.choice_table(doc)}\n<!-- end -->\n")  # fmt: skip
    assert gnn_table.render(got, tmp_path, run="run.json") == got
    with pytest.raises(ValueError, match="expected a block of one of .*; got gnn_table.plot"):
        gnn_table.render("<!-- gnn_table.plot -->\nx\n<!-- end -->", tmp_path, run="run.json")
    unclosed = "<!-- gnn_table.targets run.json -->\nold\nprose to keep\n" + got
    with pytest.raises(ValueError, match="got one at line 1 that does not"):  # it would swallow the prose
        gnn_table.render(unclosed, tmp_path, run="run.json")
    with pytest.raises(ValueError, match="got one at line 2 that does not"):  # a malformed marker is not skipped
        gnn_table.render(got.replace("targets run.json -->", "targets run.json  -->"), tmp_path, run="run.json")


@pytest.mark.parametrize("table,run", [("_H200_FASTER", tuned.FULL_RUN), ("_H100_FASTER", tuned.H100_RUN)])
def test_tuned_tables_are_what_their_run_measured(table, run):
    """Each ``_FASTER`` table of ``tuned.py`` is, line for line, what ``gnn_table.faster_rows`` prints for the run it
    names: no cell of the run left out, none added."""
    source = (ROOT / "blocksparse" / "ops" / "gnn" / "tuned.py").read_text()
    start = source.index(f"{table} = {{\n") + len(table) + 5
    assert source[start : source.index("\n}  # fmt: skip", start)] == gnn_table.faster_rows(_json(run))
