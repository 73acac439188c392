"""The packed SpMM kernel (several light nodes per program) against the XLA reference.

Interpret mode on the CPU (``gnn.interpret()``); a CPU check that the packed kernel lowers to Triton
for CUDA; a ``gpu``-marked test runs the real kernels. ``nodes_per_program=None`` / 1 is the
one-node kernel, which the other GNN tests cover.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import examples, sweep
from hypothesis import given, settings
from hypothesis import strategies as st

import blocksparse.gnn as gnn
from blocksparse.ops.gnn.spmm import pallas_triton as K
from blocksparse.ops.gnn.spmm import reference as R
from blocksparse.testing.graphs import graphs

ON_GPU = jax.default_backend() == "gpu"
PACKED = (2, 4, 8)


@pytest.fixture
def interp():
    with gnn.interpret():
        yield


def _normal(shape, seed, dtype=jnp.float32):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


def _check(g, x, nodes, w=None, init=None, tol=1e-5):
    """``csr_sum`` with ``nodes`` per program == the XLA reference, in ``x``'s dtype."""
    got = K.csr_sum(g, w, x, init, nodes_per_program=nodes)
    want = R.csr_sum(g, w, x, init)
    assert got.dtype == x.dtype and got.shape == x.shape
    np.testing.assert_allclose(
        np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=tol, atol=tol, err_msg=f"G={nodes}"
    )
    return got


@given(graphs(max_nodes=40, max_edges=200), st.sampled_from(PACKED), st.booleans(), st.booleans())
@settings(max_examples=examples(4), deadline=None)
def test_packed_matches_reference_on_random_graphs(g, nodes, weighted, with_init):
    # isolated nodes, self-loops, multi-edges and hubs split into chunks (extra units, packed alike)
    with gnn.interpret():
        n = g.num_nodes
        w = _normal((g.edge_capacity,), 1) if weighted else None
        init = _normal((n, 5), 2) if with_init else None
        _check(g, _normal((n, 5), 0), nodes, w, init)


@pytest.mark.slow
def test_packed_isolated_nodes_weights_init(interp):
    rng = np.random.default_rng(3)
    n = 23  # not a multiple of any group: the last program's missing slots are masked
    src, dst = rng.integers(0, n - 3, 160), rng.integers(0, n - 3, 160)  # the last three nodes are isolated
    g = gnn.Graph.from_edges(src, dst, n)
    x = _normal((n, 20), 4)  # 20 features: the last feature block is masked, no padded copy
    w, init = _normal((g.edge_capacity,), 5), _normal((n, 20), 6)
    for nodes in PACKED + (16,):
        np.testing.assert_array_equal(_check(g, x, nodes)[n - 3 :], 0.0)  # isolated nodes give 0
        np.testing.assert_allclose(_check(g, x, nodes, w, init)[n - 3 :], init[n - 3 :])  # ... or init


@pytest.mark.slow
def test_packed_one_node_with_every_edge(interp):
    rng = np.random.default_rng(5)
    n, e = 9, 700
    src = rng.integers(0, n, e)
    x, w, init = _normal((n, 130), 6), _normal((e,), 7), _normal((n, 130), 8)  # F = 130: two feature blocks
    for q in (0.99, 0.0):  # the hub alone in one program, or split into chunks (extra units)
        g = gnn.Graph.from_edges(src, np.full(e, 4), n, heavy_quantile=q)
        assert (g.schedule.num_extra > 0) == (q == 0.0)
        for nodes in PACKED:
            _check(g, x, nodes, w, init, tol=1e-4)


def test_packed_empty_graph(interp):
    g = gnn.Graph.from_edges(np.zeros(0, int), np.zeros(0, int), 6)
    init = _normal((6, 3), 9)
    for nodes in PACKED:
        np.testing.assert_array_equal(K.csr_sum(g, None, jnp.ones((6, 3)), nodes_per_program=nodes), 0.0)
        np.testing.assert_array_equal(K.csr_sum(g, None, jnp.ones((6, 3)), init, nodes_per_program=nodes), init)
    # a traced graph whose capacity holds no real edge: every unit is empty
    d = gnn.DynamicGraph.from_edge_index(np.zeros((2, 0), np.int32), num_nodes=6, max_edges=256, chunk=128)
    np.testing.assert_array_equal(K.csr_sum(d, None, jnp.ones((6, 3)), nodes_per_program=4), 0.0)


@sweep("nodes", [None, 4])
def test_half_precision_heavy_node_is_rounded_once(interp, nodes):
    # A hub split into two chunks whose partial sums nearly cancel: the first sums to 99.25 and the second
    # to -99, exactly. Rounding the first to bfloat16 (spacing 0.5 at 99) before the second is added would
    # give 0.0 or 0.5 instead of 0.25.
    n, hub = 40, 0
    dst = np.concatenate([np.arange(1, n), np.full(256, hub)])
    src = np.concatenate([np.arange(1, n), [3], np.full(127, 1), np.full(128, 2)])
    g = gnn.Graph.from_edges(src, dst, n, heavy_quantile=0.5)
    assert hub in g.schedule.heavy_nodes and g.schedule.main_end[hub] - g.indptr[hub] == 128
    # CSR by destination keeps each node's edges in input order: sources 3 and 1 in the first chunk
    assert set(np.asarray(g.indices)[g.indptr[hub] : g.schedule.main_end[hub]]) == {1, 3}
    x = np.zeros((n, 16), np.float32)
    x[1], x[2], x[3] = 100 / 128, -99 / 128, 0.03125  # each exact in bfloat16
    x = jnp.asarray(x, jnp.bfloat16)
    want = R.csr_sum(g, None, x)
    np.testing.assert_array_equal(np.asarray(want, np.float32)[hub], 0.25)
    got = K.csr_sum(g, None, x, nodes_per_program=nodes)
    np.testing.assert_array_equal(np.asarray(got, np.float32)[hub], 0.25)
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
    # a traced graph of the same edges, with room for unused heavy slots and extra units, and an init
    d = gnn.DynamicGraph.from_edge_index(np.stack([src, dst]), num_nodes=n, max_edges=512, chunk=128)
    assert int(d.schedule.heavy_nodes[0]) == hub and d.schedule.num_extra > 1
    init = jnp.zeros((n, 16), jnp.bfloat16).at[hub].set(-0.25).at[5].set(1.5)
    got = jax.jit(lambda d, x, i: K.csr_sum(d, None, x, i, nodes_per_program=nodes))(d, x, init)
    np.testing.assert_array_equal(np.asarray(got, np.float32)[hub], 0.0)
    want = np.asarray(want, np.float32) + np.asarray(init, np.float32)
    np.testing.assert_array_equal(np.asarray(got, np.float32), want)


@sweep("dtype", [jnp.bfloat16, jnp.float16])
def test_packed_half_precision(interp, dtype):
    rng = np.random.default_rng(8)
    dst = np.concatenate([rng.integers(0, 50, 300), np.full(200, 9)])  # node 9: 200+ in-edges, two chunks
    g = gnn.Graph.from_edges(rng.integers(0, 50, 500), dst, 50, heavy_quantile=0.9)
    assert g.schedule.num_extra > 0
    x, init = _normal((50, 24), 9, dtype), _normal((50, 24), 10, dtype)
    w = _normal((g.edge_capacity,), 11, dtype)
    for nodes in (4, 8):  # float32 accumulation as the reference: one rounding at the end
        _check(g, x, nodes, w, init, tol=2e-2)


def test_packed_dynamic_graph_under_jit(interp):
    # a traced schedule: capacities above the edges (unused extra units), canonical and given orders
    rng = np.random.default_rng(11)
    n, e = 30, 420
    src = rng.integers(0, n, e)
    dst = np.concatenate([rng.integers(0, n - 2, e - 200), np.full(200, 6)])  # hub of >= 200 in-edges
    x, init = _normal((n, 12), 12), _normal((n, 12), 13)
    w = _normal((640,), 14)
    for canonical, nodes in ((True, 4), (False, 8)):

        @jax.jit
        def run(ei, x, canonical=canonical, nodes=nodes):
            d = gnn.DynamicGraph.from_edge_index(ei, num_nodes=n, max_edges=640, chunk=128, canonical=canonical)
            assert d.schedule.num_extra == 5
            return K.csr_sum(d, w, x, init, nodes_per_program=nodes), R.csr_sum(d, w, x, init)

        got, want = run(jnp.asarray(np.stack([src, dst]), jnp.int32), x)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # the reference itself against NumPy, unweighted
    g = gnn.Graph.from_edges(src, dst, n)
    dense = np.zeros((n, n), np.float32)
    np.add.at(dense, (dst, src), 1.0)
    np.testing.assert_allclose(_check(g, x, 2), dense @ np.asarray(x), rtol=1e-5, atol=1e-5)


def test_default_is_the_one_node_kernel_and_bad_knob(interp):
    g = gnn.power_law(40, 300, seed=0)
    x = _normal((40, 8), 15)
    one = K.csr_sum(g, None, x)
    np.testing.assert_array_equal(K.csr_sum(g, None, x, nodes_per_program=1), one)
    np.testing.assert_allclose(K.csr_sum(g, None, x, nodes_per_program=16), one, rtol=1e-5, atol=1e-5)
    for bad in (0, 3, 32, 2.0, True, "4"):
        with pytest.raises(ValueError, match=r"Expected nodes_per_program None or one of \(1, 2, 4, 8, 16\)"):
            K.csr_sum(g, None, x, nodes_per_program=bad)


def test_packed_kernel_lowers_to_triton():
    from test_gnn_pallas import _lower_for_cuda, lowering_graph

    g = lowering_graph()
    w = jnp.ones((g.edge_capacity,))

    def everything(x, xb):
        outs = [K.csr_sum(g, None, x, nodes_per_program=2), K.csr_sum(g, w, xb, xb, nodes_per_program=4)]
        outs += [K.csr_sum(g, w, x, x, nodes_per_program=8), K.csr_sum(g, None, xb, nodes_per_program=16)]
        scale = jnp.full((g.num_nodes,), 0.5)  # a factor per destination (the mean's): both kernels
        return outs + [
            K.csr_sum(g, None, xb, row_scale=scale, nodes_per_program=4),
            K.csr_sum(g, None, x, row_scale=scale),
        ]

    txt = _lower_for_cuda(everything, jnp.ones((40, 200)), jnp.ones((40, 20), jnp.bfloat16))
    for nodes in (2, 4, 8, 16):
        assert txt.count(f"gnn_spmm_x{nodes}") >= 2  # main and extra units
    assert txt.count("__gpu$xla.gpu.triton") >= 12


# ------------------------------------------------------------------------------- real GPU
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_gpu_packed_matches_reference(dtype):
    g = gnn.power_law(5000, 160_000, seed=7)
    assert g.schedule.num_extra > 0
    x, init = _normal((5000, 100), 0, dtype), _normal((5000, 100), 1, dtype)
    w = _normal((g.edge_capacity,), 2, dtype)
    tol = 1e-4 if dtype == jnp.float32 else 2e-2  # float32 sums in another order; one rounding to bfloat16
    for nodes in (1, 2, 4, 8):
        _check(g, x, nodes, tol=tol)
        _check(g, x, nodes, w, init, tol=tol)
