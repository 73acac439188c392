import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import blocksparse.gnn as gnn
from blocksparse.testing.graphs import edge_lists, graphs


def test_csr_and_transpose():
    g = gnn.Graph.from_edges([0, 1, 2, 2, 3], [1, 2, 2, 1, 1], num_nodes=5)
    np.testing.assert_array_equal(g.indptr, [0, 0, 3, 5, 5, 5])
    np.testing.assert_array_equal(g.indices, [0, 2, 3, 1, 2])  # stable: edge order kept per node
    np.testing.assert_array_equal(g.edge_perm, [0, 3, 4, 1, 2])
    np.testing.assert_array_equal(g.in_degree, [0, 3, 2, 0, 0])
    np.testing.assert_array_equal(g.out_degree, [1, 1, 2, 1, 0])
    t = g.T
    np.testing.assert_array_equal(t.indptr, [0, 1, 2, 4, 5, 5])
    np.testing.assert_array_equal(t.indices, [1, 2, 2, 1, 1])
    assert t.T is g


@given(graphs())
@settings(max_examples=15)
def test_schedule_covers_every_edge_once(g):
    for h in (g, g.T):
        s = h.schedule
        cover = np.zeros(h.num_edges, int)
        for i in range(h.num_nodes):
            cover[h.indptr[i] : s.main_end[i]] += 1
        for a, b, node in zip(s.extra_start, s.extra_end, s.extra_node, strict=True):
            assert h.indptr[node] <= a < b <= h.indptr[node + 1]
            assert b - a <= s.chunk
            cover[a:b] += 1
        np.testing.assert_array_equal(cover, 1)
        assert np.all(np.diff(s.extra_node) >= 0)


@given(edge_lists())
@settings(max_examples=15)
def test_strategy_has_awkward_cases(edges):
    src, dst, n = edges
    g = gnn.Graph.from_edges(src, dst, n)
    assert (g.in_degree == 0).any()  # isolated node
    assert (src == dst).any()  # self-loop
    pairs = set()
    assert any((s, d) in pairs or pairs.add((s, d)) for s, d in zip(src.tolist(), dst.tolist(), strict=True))
    assert g.in_degree.max() >= 129  # hub


def test_hash_and_jit_specialise_per_graph():
    a = gnn.Graph.from_edges([0, 1], [1, 0], 2)
    b = gnn.Graph.from_edges(np.array([0, 1]), np.array([1, 0]), 2)
    c = gnn.Graph.from_edges([0, 1], [1, 1], 2)
    assert a == b and hash(a) == hash(b) and a != c
    traces = []

    @jax.jit
    def f(g, x):
        traces.append(g)
        return gnn.spmm(g, x)

    x = jnp.ones((2, 3))
    f(a, x)
    f(b, x)
    assert len(traces) == 1
    np.testing.assert_allclose(f(c, x), [[0, 0, 0], [2, 2, 2]])
    assert len(traces) == 2
    assert jax.tree_util.tree_leaves(a) == []


@pytest.mark.parametrize(
    "args, match",
    [
        (([0, 1], [1], 2), "equal length. Got 2 and 1"),
        (([0, 5], [1, 0], 3), r"\[0, 3\). Got src\[1\] = 5"),
        (([0, 1], [1, -1], 3), r"Got dst\[1\] = -1"),
        (([[0, 1]], [[1, 0]], 3), "1-D. Got shape"),
        (([0, 1], [1, 0], -1), "num_nodes >= 0"),
    ],
)
def test_from_edges_rejects_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        gnn.Graph.from_edges(*args)


def test_from_edges_rejects_floats_and_tracers():
    with pytest.raises(TypeError, match="integer dtype. Got float"):
        gnn.Graph.from_edges(np.array([0.0]), np.array([1.0]), 2)
    with pytest.raises(TypeError, match="concrete host data"):
        jax.jit(lambda s: gnn.Graph.from_edges(s, s, 3))(jnp.array([0, 1]))
    with pytest.raises(ValueError, match=r"heavy_quantile in \[0, 1\]"):
        gnn.Graph.from_edges([0], [1], 2, heavy_quantile=1.5)


def test_heavy_nodes_by_quantile():
    src = np.arange(1000) % 50
    dst = np.concatenate([np.zeros(900, int), np.arange(100) % 50])
    g = gnn.Graph.from_edges(src, dst, 50)
    assert g.heavy[0] and g.num_heavy == 1
    assert g.schedule.num_extra == -(-g.in_degree[0] // g.chunk) - 1
    assert gnn.Graph.from_edges(src, dst, 50, heavy_quantile=1.0).num_heavy == 0


def test_empty_graph():
    g = gnn.Graph.from_edges([], [], 3)
    x = jnp.ones((3, 2))
    np.testing.assert_array_equal(gnn.spmm(g, x), 0)
    np.testing.assert_array_equal(gnn.aggregate(g, x), 0)


@pytest.mark.parametrize("method", ["rcm", "clusters", "degree"])
def test_reorder_is_a_relabelling(method):
    g = gnn.power_law(60, 400, seed=1)
    g2, perm = gnn.reorder(g, method)
    assert sorted(perm.tolist()) == list(range(60))
    x = np.random.default_rng(0).standard_normal((60, 4)).astype(np.float32)
    y = gnn.spmm(g, x)
    y2 = gnn.spmm(g2, x[perm])
    np.testing.assert_allclose(np.asarray(y2)[np.argsort(perm)], y, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="method in"):
        gnn.reorder(g, "metis")


def test_rcm_reduces_bandwidth():
    # a ring with shuffled ids: RCM brings neighbours close again
    n = 200
    p = np.random.default_rng(0).permutation(n)
    g = gnn.Graph.from_edges(p, p[(np.arange(n) + 1) % n], n)
    g2, _ = gnn.reorder(g, "rcm")
    assert np.abs(g2.src - g2.dst).max() < np.abs(g.src - g.dst).max() / 10


def test_generators_sizes_and_labels():
    g = gnn.synthetic("ogbn-arxiv", scale=0.01)
    assert (g.num_nodes, g.num_edges) == (1693, 11662)
    assert "synthetic" in g.name and "ogbn-arxiv" in g.name
    r = gnn.synthetic("city-roads-L", kind="rmat", scale=0.01, seed=3)
    assert r.num_edges == round(0.01 * 463_710) and r.src.max() < r.num_nodes
    assert set(gnn.PAPER_GRAPHS) >= {"ogbn-arxiv", "ogbn-products", "pokec", "twitch-views", "city-roads-L"}
    p = gnn.power_law(4096, 131072, seed=0)
    assert p.in_degree.max() > 20 * p.in_degree.mean()  # heavy-tailed
    with pytest.raises(ValueError, match="graph name in"):
        gnn.synthetic("cora")


@given(graphs(), st.sampled_from([0.0, 0.3, 0.5, 0.9, 0.99, 1.0]), st.integers(0, 3000))
@settings(max_examples=25)
def test_structure_matches_dense_definitions(g, q, extra_nodes):
    # the O(edges) construction gives what the O(nodes) definitions give, also with many isolated nodes
    n = g.num_nodes + extra_nodes
    h = gnn.Graph.from_edges(g.src, g.dst, n, heavy_quantile=q)
    in_deg = np.bincount(g.dst, minlength=n)
    np.testing.assert_array_equal(h.in_degree, in_deg)
    np.testing.assert_array_equal(h.out_degree, np.bincount(g.src, minlength=n))
    np.testing.assert_array_equal(h.indptr, np.concatenate([[0], np.cumsum(in_deg)]))
    assert h.max_in_degree == in_deg.max(initial=0)
    assert h.heavy_threshold == int(np.ceil(np.quantile(in_deg, q))) if n and h.num_edges else h.heavy_threshold == 0
    heavy = (in_deg > h.heavy_threshold) & (in_deg > h.chunk)
    np.testing.assert_array_equal(h.heavy, heavy)
    np.testing.assert_array_equal(h.heavy_nodes, np.flatnonzero(heavy))
    s = h.schedule
    cap = np.where(heavy, h.chunk, np.iinfo(np.int64).max // 4)
    np.testing.assert_array_equal(s.main_end, np.minimum(h.indptr[1:], h.indptr[:-1] + cap))
    np.testing.assert_array_equal(s.extra_segment, np.searchsorted(h.heavy_nodes, s.extra_node))


def test_huge_node_count_few_edges_builds_quickly():
    # host work is bounded by the edges, apart from one vectorised pass per O(num_nodes) array
    n = 2 * 10**7
    t = time.perf_counter()
    g = gnn.Graph.from_edges([0, 5, n - 1], [n - 1, n - 1, 3], n)
    g.schedule, g.T.schedule, repr(g)
    assert time.perf_counter() - t < 3.0
    assert g.in_degree[n - 1] == 2 and g.indptr[-1] == 3 and g.num_heavy == 0 and g.max_in_degree == 2
    assert g.schedule.main_end[n - 1] == 3 and g.T.indptr[6] == 2
