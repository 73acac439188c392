"""The packed max / min kernel (several light nodes per program) against the NumPy oracle and the XLA path.

Interpret mode on the CPU (``gnn.interpret()``); a CPU check that every variant lowers to Triton for
CUDA; ``gpu``-marked tests run the real kernels. Each case compares values, the arg-max / arg-min
positions the backward uses, and gradients, for every ``nodes_per_program``.
"""

import gnn_oracle as O
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import examples, sweep
from hypothesis import given, settings
from hypothesis import strategies as st

import blocksparse as bs
import blocksparse.gnn as gnn
from blocksparse import hardware
from blocksparse.gnn import GatherConfig
from blocksparse.ops.gnn import order
from blocksparse.ops.gnn import triton_common as P
from blocksparse.ops.gnn.aggregate import pallas_triton as K
from blocksparse.ops.gnn.aggregate import reference as R
from blocksparse.testing.graphs import graphs

ON_GPU = jax.default_backend() == "gpu"
PACKED = (2, 4, 8, 32)


@pytest.fixture
def interp():
    with gnn.interpret():
        yield


def _cfg(impl, nodes):
    """``nodes`` per program for the Pallas kernel (the XLA backend takes no config)."""
    return GatherConfig(nodes_per_program=nodes) if impl == "pallas" and nodes is not None else None


def _ties(n, f, seed=0, dtype=jnp.float32):
    """Few distinct values: many ties, which must go to the first in-edge."""
    return jnp.asarray(np.random.default_rng(seed).integers(-2, 3, (n, f)), dtype)


def _check_kernel(g, x, reduce, nodes, sort=True, prefetch=False):
    """Values (with and without the arg) and arg positions of ``nodes`` per program == the reference.

    Both kernels in one jitted function (eager calls compile the interpreted kernel's primitives one by one, about
    twice as slow; the eager path: test_packed_nan_inf_ties_and_isolated_nodes, test_packed_half_precision)."""
    is_max = reduce == "max"
    want, want_arg = R.segment_extreme(g, x, is_max)
    kw = dict(nodes_per_program=nodes, sort_by_degree=sort, prefetch=prefetch)
    both = jax.jit(
        lambda x: (K.segment_extreme(g, x, is_max, **kw), K.segment_extreme(g, x, is_max, with_arg=False, **kw))
    )
    (got, arg), (only, none) = both(x)
    assert got.dtype == x.dtype and only.dtype == x.dtype and none is None
    what = f"{reduce}, nodes_per_program={nodes}"
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32), err_msg=what)
    np.testing.assert_array_equal(np.asarray(only, np.float32), np.asarray(want, np.float32), err_msg=what)
    np.testing.assert_array_equal(arg, want_arg, err_msg=what)


def _check_api(g, x, reduce, nodes, ct):
    """Forward and gradient of ``aggregate`` (Pallas, ``nodes`` per program) == the NumPy oracle."""
    f = lambda x: gnn.aggregate(g, x, reduce, implementation="pallas", config=_cfg("pallas", nodes))

    @jax.jit  # one program (the eager path: see _check_kernel)
    def forward_and_gradient(x, ct):
        y, vjp = jax.vjp(f, x)
        return y, vjp(ct)[0]

    with bs.dispatch_log() as log:  # written while tracing
        y, dx = forward_and_gradient(x, ct)
    assert log == [("aggregate", "pallas")]
    src, dst = np.asarray(g.src), np.asarray(g.dst)
    np.testing.assert_array_equal(y, O.extreme(src, dst, g.num_nodes, x, reduce).astype(np.float32))
    np.testing.assert_allclose(dx, O.extreme_grad(src, dst, g.num_nodes, x, ct, reduce), rtol=1e-6, atol=1e-6)


@given(
    graphs(max_nodes=40, max_edges=200),
    st.sampled_from(["max", "min"]),
    st.sampled_from(PACKED),
    st.booleans(),
    st.booleans(),
)
@settings(max_examples=examples(3))
def test_packed_matches_reference_on_random_graphs(g, reduce, nodes, sort, prefetch):
    # isolated nodes, self-loops, multi-edges and a hub split into chunks (extra units, packed alike)
    with gnn.interpret():
        x = _ties(g.num_nodes, 5)
        _check_kernel(g, x, reduce, nodes, sort, prefetch)
        _check_api(g, x, reduce, nodes, _ties(g.num_nodes, 5, seed=1) + 0.25)


def test_packed_nan_inf_ties_and_isolated_nodes(interp):
    rng = np.random.default_rng(3)
    n = 23  # not a multiple of any group: the last program's missing nodes are masked
    src, dst = rng.integers(0, n - 3, 160), rng.integers(0, n - 3, 160)  # the last three nodes are isolated
    g = gnn.Graph.from_edges(src, dst, n)
    x = _ties(n, 20, seed=4)  # 20 features: the last feature block is masked, no padded copy
    x = x.at[src[5], 3].set(jnp.nan).at[src[9], :].set(-jnp.inf).at[src[11], 7:9].set(jnp.inf)
    x = x.at[src[13], 7].set(jnp.nan)  # a NaN in the same column as infinities
    ct = jnp.asarray(rng.standard_normal((n, 20)), jnp.float32)
    for reduce, nodes in (("max", 4), ("min", 32)):
        _check_kernel(g, x, reduce, nodes, prefetch=nodes == 4)
        _check_api(g, x, reduce, nodes, ct)
        y = gnn.aggregate(g, x, reduce, implementation="pallas", config=GatherConfig(nodes_per_program=nodes))
        np.testing.assert_array_equal(y[n - 3 :], 0.0)  # isolated nodes give 0
        assert np.isnan(y[dst[5], 3])


@pytest.mark.slow
def test_packed_one_node_with_every_edge(interp):
    rng = np.random.default_rng(5)
    n, e = 9, 700
    src = rng.integers(0, n, e)
    for q in (0.99, 0.0):  # the hub alone in one program, or split into 128-edge chunks (extra units)
        g = gnn.Graph.from_edges(src, np.full(e, 4), n, heavy_quantile=q)
        assert (g.schedule.num_extra > 0) == (q == 0.0)
        x = _ties(n, 16, seed=6)
        _check_kernel(g, x, "max", 32, prefetch=True)
        _check_api(g, x, "min", 4, _ties(n, 16, seed=7) + 0.5)


def test_packed_empty_graphs(interp):
    # no edges at all (the op answers 0 without a kernel), and a traced graph whose capacity holds none
    g = gnn.Graph.from_edges(np.zeros(0, int), np.zeros(0, int), 6)
    np.testing.assert_array_equal(
        gnn.aggregate(g, jnp.ones((6, 3)), implementation="pallas", config=GatherConfig(nodes_per_program=4)), 0.0
    )
    # built and run in jit (eagerly the build's sorts and the gradient's glue compile op by op)
    build = jax.jit(lambda ei: gnn.DynamicGraph.from_edge_index(ei, num_nodes=6, max_edges=256, chunk=128))
    d = build(np.zeros((2, 0), np.int32))
    for nodes in (4,):
        y, dx = jax.jit(
            jax.value_and_grad(
                lambda x, nodes=nodes: jnp.sum(
                    gnn.aggregate(d, x, implementation="pallas", config=GatherConfig(nodes_per_program=nodes))
                )
            )
        )(jnp.ones((6, 3)))
        assert y == 0.0
        np.testing.assert_array_equal(dx, 0.0)


@sweep("dtype, reduce", [(jnp.bfloat16, "max"), (jnp.float16, "min")])
def test_packed_half_precision(interp, dtype, reduce):
    rng = np.random.default_rng(8)
    dst = np.concatenate([rng.integers(0, 50, 300), np.full(200, 9)])  # node 9: 200+ in-edges, two chunks
    g = gnn.Graph.from_edges(rng.integers(0, 50, 500), dst, 50, heavy_quantile=0.9)
    assert g.schedule.num_extra > 0
    x = jnp.asarray(np.random.default_rng(9).standard_normal((50, 24)), dtype)
    ct = jnp.asarray(np.random.default_rng(10).standard_normal((50, 24)), dtype)
    _check_kernel(g, x, reduce, 4)  # exact: the kernel compares in float32, a max of casts is a cast of the max
    f = lambda x, impl: jax.vjp(lambda x: gnn.aggregate(g, x, reduce, implementation=impl, config=_cfg(impl, 4)), x)
    (y1, v1), (y2, v2) = f(x, "xla"), f(x, "pallas")
    assert y2.dtype == dtype and v2(ct)[0].dtype == dtype
    np.testing.assert_array_equal(np.asarray(y2, np.float32), np.asarray(y1, np.float32))
    np.testing.assert_array_equal(np.asarray(v2(ct)[0], np.float32), np.asarray(v1(ct)[0], np.float32))


def test_packed_dynamic_graph_under_jit(interp):
    # a traced schedule: capacities above the edges (unused extra units), canonical and given orders
    rng = np.random.default_rng(11)
    n, e = 30, 420
    src = np.concatenate([rng.integers(0, n, e - 200), rng.integers(0, n, 200)])
    dst = np.concatenate([rng.integers(0, n - 2, e - 200), np.full(200, 6)])  # hub of >= 200 in-edges
    x = _ties(n, 12, seed=12)
    ct = jnp.asarray(rng.standard_normal((n, 12)), jnp.float32)
    for canonical, nodes in ((True, 4), (False, 8)):

        @jax.jit
        def run(ei, x, canonical=canonical, nodes=nodes):
            d = gnn.DynamicGraph.from_edge_index(ei, num_nodes=n, max_edges=640, chunk=128, canonical=canonical)
            assert d.schedule.num_extra == 5
            f = lambda x, impl: gnn.aggregate(d, x, "max", implementation=impl, config=_cfg(impl, nodes))
            (y, vjp), (y0, vjp0) = jax.vjp(lambda x: f(x, "pallas"), x), jax.vjp(lambda x: f(x, "xla"), x)
            return y, vjp(ct)[0], y0, vjp0(ct)[0]

        y, dx, want, dwant = run(jnp.asarray(np.stack([src, dst]), jnp.int32), x)
        np.testing.assert_array_equal(want, O.extreme(src, dst, n, x, "max").astype(np.float32))
        np.testing.assert_array_equal(y, want)
        # the same winners; a source winning several destinations sums their cotangents, in any order on a GPU
        np.testing.assert_allclose(dx, dwant, rtol=1e-6, atol=1e-6)
        if not canonical:  # (canonical order sorts each node's in-edges by source: ties go elsewhere)
            np.testing.assert_allclose(dwant, O.extreme_grad(src, dst, n, x, ct, "max"), rtol=1e-6, atol=1e-6)


@pytest.mark.slow
def test_packed_vmap(interp):
    g = gnn.power_law(50, 400, seed=1)
    xb = jax.random.normal(jax.random.key(0), (3, 50, 8))
    f = lambda x, impl: gnn.aggregate(g, x, implementation=impl, config=_cfg(impl, 4))
    yb, gb = jax.vmap(jax.value_and_grad(lambda x: f(x, "pallas").sum()))(xb)
    ya, ga = jax.vmap(jax.value_and_grad(lambda x: f(x, "xla").sum()))(xb)
    np.testing.assert_array_equal(yb, ya)
    np.testing.assert_array_equal(gb, ga)


@pytest.mark.slow
def test_length_order():
    g = gnn.power_law(300, 4000, seed=3, heavy_quantile=0.9)
    lens = g.schedule.main_end - g.indptr[:-1]
    order = np.asarray(K.length_order(g))
    np.testing.assert_array_equal(np.sort(order), np.arange(300))
    assert np.all(np.diff(lens[order]) <= 0)  # longest first
    d = gnn.DynamicGraph.from_graph(g, chunk=g.chunk, canonical=False)
    np.testing.assert_array_equal(jax.jit(K.length_order)(d), order)  # traced: the same order, ties by id


def test_length_order_of_the_split_units_puts_heavy_nodes_last():
    g = gnn.power_law(200, 3000, seed=4, heavy_quantile=0.95)
    heavy = np.asarray(g.schedule.heavy_nodes)
    assert heavy.size and g.schedule.num_extra  # heavy nodes with extra chunks
    split = P.split_units(g)
    s0, e0, _ = split.main
    lens = np.asarray(e0) - np.asarray(s0)
    assert np.all(lens[heavy] == 0) and np.all(np.asarray(g.in_degree)[heavy] > 0)  # emptied, not isolated
    order = np.asarray(K.length_order(g, split))
    np.testing.assert_array_equal(np.sort(order), np.arange(200))
    assert np.all(np.diff(lens[order]) <= 0)  # longest first: the heavy nodes' empty main units last
    d = gnn.DynamicGraph.from_graph(g, chunk=g.chunk, canonical=False)
    np.testing.assert_array_equal(jax.jit(lambda d: K.length_order(d, P.split_units(d)))(d), order)  # traced: same


def test_default_rule_and_bad_knob():
    with hardware.fake(hardware.H200):
        assert [order.aggregate_nodes_per_program(d) for d in (0.0, 4, 8, 16, 32, 33, 64, 65, 128, 1000)] == [
            16, 16, 8, 4, 2, 1, 1, 1, 1, 1
        ]  # fmt: skip
    for nodes in (1, 2, 4, 8, 16, 32):
        be, bf, warps = K.packed_tiles(nodes, 128)
        assert nodes * be * bf <= 8192 and be >= 4 and warps in (4, 8)
    g = gnn.power_law(10, 40, seed=0)
    for bad in (0, 3, 64, 2.0, True, "4"):
        with pytest.raises(ValueError, match=r"Expected nodes_per_program None or a power of two in \[1, 32\]"):
            gnn.aggregate(g, jnp.ones((10, 2)), config=GatherConfig(nodes_per_program=bad))
    # the XLA path ignores the config
    np.testing.assert_array_equal(
        gnn.aggregate(g, jnp.ones((10, 2)), implementation=("xla", "pallas"), config=GatherConfig(nodes_per_program=8)),
        gnn.aggregate(g, jnp.ones((10, 2)), implementation="xla"),
    )


def test_deprecated_nodes_per_program_warns_and_keeps_its_meaning():
    # the old keyword: a DeprecationWarning, the same kernel, and no restriction of the implementation
    g = gnn.power_law(10, 40, seed=0)
    x = jnp.ones((10, 2))
    with pytest.warns(DeprecationWarning, match="config=GatherConfig"), bs.dispatch_log() as log:
        y = gnn.aggregate(g, x, implementation="xla", nodes_per_program=8)
    assert log == [("aggregate", "xla")]
    np.testing.assert_array_equal(y, gnn.aggregate(g, x, implementation="xla"))
    with pytest.raises(ValueError, match="not both"), pytest.warns(DeprecationWarning):
        gnn.aggregate(g, x, nodes_per_program=2, config=GatherConfig())


def test_every_packed_variant_lowers_to_triton():
    from test_gnn_pallas import _lower_for_cuda, lowering_graph

    g = lowering_graph()

    def everything(x, xb):
        outs = []
        for nodes in (2, 4, 32):
            for a in (x, xb):
                f = lambda a, nodes=nodes: gnn.aggregate(
                    g, a, "min", implementation="pallas", config=GatherConfig(nodes_per_program=nodes)
                )
                outs += [f(a), jax.vjp(f, a)[1](a)]
        outs += K.segment_extreme(g, x, True, nodes_per_program=4, sort_by_degree=False)
        return outs + list(K.segment_extreme(g, x, True, with_arg=False, nodes_per_program=8, prefetch=True)[:1])

    txt = _lower_for_cuda(everything, jnp.ones((40, 200)), jnp.ones((40, 20), jnp.bfloat16))
    assert txt.count("gnn_aggregate_min_x32") >= 4 and txt.count("gnn_aggregate_max_x4") >= 2
    assert txt.count("gnn_aggregate_max_x8") >= 2 and txt.count("__gpu$xla.gpu.triton") >= 28


# ------------------------------------------------------------------------------- real GPU
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_gpu_packed_matches_reference(dtype):
    g = gnn.power_law(5000, 160_000, seed=7)
    assert g.schedule.num_extra > 0
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((5000, 100)), dtype).at[17, 3].set(jnp.nan)
    ct = jnp.asarray(rng.standard_normal((5000, 100)), dtype)
    for reduce in ("max", "min"):
        f = lambda x, impl, nodes=None, reduce=reduce: jax.vjp(
            lambda x: gnn.aggregate(g, x, reduce, implementation=impl, config=_cfg(impl, nodes)), x
        )
        y0, v0 = f(x, "xla")
        for nodes in (1, 2, 4, 8, 16, 32, None):
            _check_kernel(g, x, reduce, nodes)
            if nodes in (4, 8):
                _check_kernel(g, x, reduce, nodes, sort=False, prefetch=True)
            y, v = f(x, "pallas", nodes)
            np.testing.assert_array_equal(np.asarray(y, np.float32), np.asarray(y0, np.float32))
            # the same arg per node (the forward is exact); the gradient sums them with a scatter-add whose
            # order a GPU does not fix, so it agrees to rounding
            tol = dict(rtol=1e-5, atol=1e-5) if dtype == jnp.float32 else dict(rtol=2e-2, atol=2e-2)
            np.testing.assert_allclose(np.asarray(v(ct)[0], np.float32), np.asarray(v0(ct)[0], np.float32), **tol)
