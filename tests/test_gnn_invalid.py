"""Invalid input gives an error or NaN, never a finite wrong value: the GNN reductions on NaN / inf
features (XLA and the Pallas kernels in interpret mode, against the float64 NumPy oracle), and bad
inputs raising with the expected and the actual values. Also the max / min NaN regressions."""

import gnn_oracle as O
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_same_nonfinite_then_close, examples, sweep
from hypothesis import given, settings
from hypothesis import strategies as st

import blocksparse as bs
import blocksparse.gnn as gnn
from blocksparse.testing.graphs import graphs

IMPLS = ("xla", "pallas")
ON_GPU = jax.default_backend() == "gpu"  # the Pallas kernels run for real there, in the interpreter elsewhere
NONFINITE = (np.nan, np.inf, -np.inf)


def _run(impl, f):
    """``f()`` with ``implementation=impl`` (checked in the dispatch log); Pallas interpreted without a GPU."""
    with gnn.interpret(impl == "pallas" and not ON_GPU), bs.dispatch_log() as log:
        out = f(impl)
    assert {name for _, name in log} == {impl}, log
    return out


@st.composite
def poisoned(draw, *, max_nodes=8, hub=(129, 170)):
    """A small awkward graph (isolated node, self-loop, multi-edge, a hub split into chunks) and
    float32 features ``(N, 3)`` with a few NaN / +inf / -inf entries."""
    g = draw(graphs(max_nodes=max_nodes, max_edges=20, hub_in_degree=hub, heavy_quantile=0.5))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = rng.standard_normal((g.num_nodes, 3))
    for _ in range(draw(st.integers(1, 4))):
        x[draw(st.integers(0, g.num_nodes - 1)), draw(st.integers(0, 2))] = draw(st.sampled_from(NONFINITE))
    return g, x.astype(np.float32)


@given(poisoned(), st.sampled_from(IMPLS))
@settings(max_examples=examples(6), deadline=None)
def test_nonfinite_features_reach_exactly_the_reference_destinations(gx, impl):
    g, x = gx
    for reduce in ("max", "min"):
        got = _run(impl, lambda i, r=reduce: gnn.aggregate(g, x, r, implementation=i))
        assert_same_nonfinite_then_close(got, O.extreme(g.src, g.dst, g.num_nodes, x, reduce), f"{impl} {reduce}")
    for reduce in ("sum", "mean"):
        got = _run(impl, lambda i, r=reduce: gnn.spmm(g, x, r, implementation=i))
        want = O.spmm(g.src, g.dst, g.num_nodes, x, None, reduce)
        assert_same_nonfinite_then_close(got, want, f"{impl} spmm {reduce}")
    # a non-finite edge weight poisons exactly its destination (0 * inf is NaN too)
    w = np.ones(g.num_edges, np.float32)
    w[0] = np.nan
    got = _run(impl, lambda i: gnn.spmm(g, x, edge_weight=w, implementation=i))
    assert_same_nonfinite_then_close(got, O.spmm(g.src, g.dst, g.num_nodes, x, w), f"{impl} weighted spmm")


# ------------------------------------------------------------------------ max / min NaN regressions
def _star(values, num_nodes=None):
    """Edges ``k -> hub`` from nodes holding ``values`` (one feature); the hub is the last node."""
    k = len(values)
    n = num_nodes or k + 1
    g = gnn.Graph.from_edges(np.arange(k), np.full(k, n - 1), n)
    x = np.zeros((n, 1), np.float32)
    x[:k, 0] = values
    return g, x


@sweep("values", [[np.nan, 50, 1], [np.nan, 1], [50, np.nan, 1], [1, 50, np.nan], [np.nan, np.nan]])
@sweep("reduce", ["max", "min"], quick=2)
@sweep("impl", IMPLS, quick=len(IMPLS))
def test_max_min_propagate_nan(values, reduce, impl):
    g, x = _star(values)
    f = lambda i: jax.vjp(lambda x: gnn.aggregate(g, x, reduce, implementation=i), x)
    out, vjp = _run(impl, f)
    assert np.isnan(out[-1, 0]), (values, reduce, impl, out)
    np.testing.assert_array_equal(out[:-1], 0.0)
    ref_out, ref_vjp = f("xla")
    np.testing.assert_array_equal(out, ref_out)
    # the gradient of a NaN result goes to the first NaN in-edge, on every implementation
    ct = jnp.ones_like(out)
    with gnn.interpret(impl == "pallas" and not ON_GPU):
        (dx,) = vjp(ct)
    want = np.zeros_like(x)
    want[int(np.flatnonzero(np.isnan(values))[0]), 0] = 1.0
    np.testing.assert_array_equal(dx, want)
    np.testing.assert_array_equal(ref_vjp(ct)[0], want)
    np.testing.assert_array_equal(dx, O.extreme_grad(g.src, g.dst, g.num_nodes, x, ct, reduce))


@sweep("nan_at", [5, 200, 650], quick=1)  # the main chunk, the first extra chunk, the last one
def test_max_min_nan_in_heavy_node_chunks(nan_at):
    # a hub of 700 in-edges (chunks of 128: the main unit and 5 extra units); feature 0 has one NaN,
    # feature 1 none, and the largest / smallest values sit after the NaN
    rng = np.random.default_rng(nan_at)
    n = 720  # the hub's sources are distinct nodes: the NaN sits at CSR position nan_at only
    src = np.concatenate([10 + rng.permutation(700), rng.integers(0, 10, 30)])
    dst = np.concatenate([np.full(700, 3), rng.integers(0, 9, 30)])
    g = gnn.Graph.from_edges(src, dst, n, heavy_quantile=0.5)
    assert g.num_heavy == 1 and g.schedule.num_extra == 5
    x = rng.standard_normal((n, 2)).astype(np.float32)
    x[src[nan_at], 0] = np.nan
    x[src[nan_at + 1 : 700], :] *= 10.0  # larger and smaller values after the NaN
    for reduce in ("max", "min"):
        want = O.extreme(g.src, g.dst, n, x, reduce)
        ct = jnp.asarray(rng.standard_normal((n, 2)), jnp.float32)
        for impl in IMPLS:
            f = lambda i, r=reduce: jax.vjp(lambda x: gnn.aggregate(g, x, r, implementation=i), x)
            out, vjp = _run(impl, f)
            assert np.isnan(out[3, 0]) and np.isfinite(out[3, 1])
            np.testing.assert_array_equal(np.isnan(out), np.isnan(want))
            np.testing.assert_allclose(out, want, rtol=1e-6)  # NaN where want is NaN
            with gnn.interpret(impl == "pallas" and not ON_GPU):
                (dx,) = vjp(ct)
            np.testing.assert_allclose(dx, O.extreme_grad(g.src, g.dst, n, x, ct, reduce), rtol=1e-6, atol=1e-6)
            # forward only (no arg output): the same values
            np.testing.assert_array_equal(_run(impl, lambda i, r=reduce: gnn.aggregate(g, x, r, implementation=i)), out)


# --------------------------------------------------------------------------------- bad inputs raise
def _ops(g, x):
    """Every GNN op on features ``x`` (``(rows, 2, 2)``), for the error paths."""
    n = g.num_nodes
    ok = jnp.ones((n, 2, 2))
    return {
        "spmm": lambda: gnn.spmm(g, x),
        "spmm mean": lambda: gnn.spmm(g, x, "mean"),
        "max": lambda: gnn.aggregate(g, x, "max"),
        "min": lambda: gnn.aggregate(g, x, "min"),
        "gatv2": lambda: gnn.gatv2(g, x, ok, jnp.ones((2, 2))),
        "graph_attention": lambda: gnn.graph_attention(g, ok, x, ok),
    }


@pytest.mark.parametrize("traced", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["static", "traced"])
def test_attention_logits_nan_inf_and_all_masked(traced):
    """A NaN or +inf logit gives its destination NaN (as jax.nn.softmax), never the empty node's 0; a node whose
    every logit is -inf gets 0, heavy (chunks merged after the kernels) or light, on both backends."""
    n = 140
    src = np.concatenate([np.arange(1, n), [0, 1, 1]])  # node 0: 139 in-edges (heavy: two chunks); 0, 1 -> 2; 1 -> 3
    dst = np.concatenate([np.zeros(n - 1, int), [2, 2, 3]])
    g = gnn.Graph.from_edges(src, dst, n, heavy_quantile=0.5)
    assert g.schedule.num_extra
    if traced:
        g = gnn.DynamicGraph.from_graph(g, chunk=g.chunk, max_edges=g.num_edges + 16, canonical=False)
    ones = jnp.ones((n, 1, 2))
    for bad in (np.nan, np.inf):
        k = ones.at[0, 0, 0].set(bad)  # node 0's logits toward node 2
        for impl in IMPLS:
            dot = _run(impl, lambda i, k=k: gnn.graph_attention(g, ones, k, ones, implementation=i))
            gat = _run(impl, lambda i, k=k: gnn.gatv2(g, k, ones, jnp.ones((1, 2)), implementation=i))
            for out in (dot, gat):
                assert np.isnan(out[2]).all() and np.isfinite(out[3]).all() and not np.isnan(out[5:]).any(), impl
    k = jnp.full((n, 1, 2), -jnp.inf)  # every logit -inf: node 0 heavy, nodes 2 and 3 light
    for impl in IMPLS:
        out = _run(impl, lambda i: gnn.graph_attention(g, ones, k, ones, implementation=i))
        np.testing.assert_array_equal(out[:4], 0)


@given(graphs(max_nodes=10, hub_in_degree=(1, 3)), st.integers(0, 40))
@settings(max_examples=15, deadline=None)
def test_features_with_wrong_row_count_raise(g, rows):
    if rows == g.num_nodes:
        rows += 1
    x = jnp.ones((rows, 2, 2))
    for f in _ops(g, x).values():
        with pytest.raises(ValueError, match=rf"leading dimension {g.num_nodes}\. Got shape \({rows}, 2, 2\)"):
            f()


@given(graphs(max_nodes=10, hub_in_degree=(1, 3)), st.sampled_from([jnp.int32, jnp.int8, jnp.uint8, jnp.bool_]))
@settings(max_examples=10, deadline=None)
def test_non_floating_features_raise(g, dtype):
    x = jnp.ones((g.num_nodes, 2, 2), dtype)
    for f in _ops(g, x).values():
        with pytest.raises(TypeError, match=rf"Expected floating-point \w+\. Got {jnp.dtype(dtype).name}"):
            f()


@given(
    st.integers(1, 30),
    st.lists(st.tuples(st.integers(-5, 40), st.integers(-5, 40)), min_size=1, max_size=20),
)
@settings(max_examples=30, deadline=None)
def test_out_of_range_edge_ids_raise(n, edges):
    src, dst = (np.asarray(c, np.int64) for c in zip(*edges, strict=True))
    bad = [(nm, e, int(a[e])) for nm, a in (("src", src), ("dst", dst)) for e in range(a.size) if not 0 <= a[e] < n]
    if not bad:
        g = gnn.Graph.from_edges(src, dst, n)
        assert g.num_edges == len(edges)
        return
    nm, e, v = bad[0]
    with pytest.raises(ValueError, match=rf"Expected node indices in \[0, {n}\)\. Got {nm}\[{e}\] = {v} "):
        gnn.Graph.from_edges(src, dst, n)


def test_an_unsigned_id_out_of_range_is_named_as_given():
    big = np.array([2**64 - 1], np.uint64)  # not wrapped to -1 by a cast to int64
    with pytest.raises(ValueError, match=rf"Got src\[0\] = {2**64 - 1} \(1 out of range\)"):
        gnn.Graph.from_edges(big, np.array([0]), 4)
