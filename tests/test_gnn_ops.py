"""The XLA references of the GNN ops against NumPy oracles, their gradients, dtypes and errors."""

import functools

import gnn_oracle as O
import jax
import jax.numpy as jnp
import jax.test_util
import numpy as np
import pytest
from helpers import examples
from hypothesis import given, settings
from hypothesis import strategies as st

import blocksparse as bs
import blocksparse.gnn as gnn
from blocksparse.testing.graphs import graphs


def _x(g, *shape, seed=0, dtype=jnp.float32):
    return jnp.asarray(np.random.default_rng(seed).standard_normal((g.num_nodes, *shape)), dtype)


@given(graphs(), st.sampled_from([("sum", None), ("sum", "left"), ("sum", "right"), ("sum", "both"), ("mean", None)]),
       st.booleans())  # fmt: skip
@settings(max_examples=examples(8))
def test_spmm_matches_oracle(g, reduce_norm, weighted):
    reduce, norm = reduce_norm
    x = _x(g, 5)
    w = jnp.asarray(np.random.default_rng(1).uniform(0.5, 1.5, g.num_edges), jnp.float32) if weighted else None
    y = gnn.spmm(g, x, reduce, norm, w)
    ref = O.spmm(g.src, g.dst, g.num_nodes, x, w, reduce, norm)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-4)


def test_spmm_gradients():
    g = gnn.power_law(30, 200, seed=2)
    x, w = _x(g, 4), jnp.asarray(np.random.default_rng(3).standard_normal(g.num_edges), jnp.float32)
    ct = _x(g, 4, seed=5)
    dx, dw = jax.grad(lambda x, w: jnp.sum(gnn.spmm(g, x, edge_weight=w) * ct), (0, 1))(x, w)
    a = np.zeros((30, 30))
    np.add.at(a, (g.dst, g.src), np.asarray(w))
    np.testing.assert_allclose(dx, a.T @ np.asarray(ct), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dw, np.sum(np.asarray(ct)[g.dst] * np.asarray(x)[g.src], -1), rtol=1e-5, atol=1e-5)
    jax.test_util.check_grads(lambda x: gnn.spmm(g, x, "sum", "both"), (x,), order=2, modes=["rev"], eps=1e-2)
    # the norms whose transpose is the other one (left <-> right on g.T) and the mean, in x and the weights
    for reduce, norm in (("sum", "left"), ("sum", "right"), ("mean", None)):
        jax.test_util.check_grads(lambda x, w, r=reduce, n=norm: gnn.spmm(g, x, r, n, edge_weight=w), (x, w), order=2,
                                  modes=["rev"], eps=1e-2)  # fmt: skip


@pytest.mark.parametrize("norm", ["left", "right", "both", "mean"])
def test_spmm_norm_rides_on_the_edge_weights(norm):
    # a static graph's degree normalisation is one factor per edge (host data): the normalised product is the
    # weighted one, in its value and its gradients, with no pass over the features before or after the product
    # (reduce="mean" divides by the in-degree: norm "right"'s factor)
    from blocksparse.ops.gnn.spmm.api import NORM_POWERS, norm_edge_weight

    reduce, norm = ("mean", None) if norm == "mean" else ("sum", norm)
    g = gnn.power_law(40, 300, seed=4)
    x, w = _x(g, 6), jnp.asarray(np.random.default_rng(5).uniform(0.5, 1.5, g.num_edges), jnp.float32)
    p_src, p_dst = NORM_POWERS[norm or "right"]
    factor = norm_edge_weight(g, norm or "right")
    want = np.maximum(g.out_degree, 1.0)[g.src] ** -p_src * np.maximum(g.in_degree, 1.0)[g.dst] ** -p_dst
    np.testing.assert_allclose(factor, want, rtol=1e-6)
    assert norm_edge_weight(g, norm or "right") is factor  # once per graph and norm

    def normed(x, w):
        return jnp.sum(gnn.spmm(g, x, reduce, norm, edge_weight=w) ** 2)

    def weighted(x, w):
        return jnp.sum(gnn.spmm(g, x, edge_weight=w * factor) ** 2)

    np.testing.assert_allclose(normed(x, w), weighted(x, w), rtol=1e-6)
    for got, ref in zip(jax.grad(normed, (0, 1))(x, w), jax.grad(weighted, (0, 1))(x, w), strict=True):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    jaxpr = jax.make_jaxpr(lambda x: gnn.spmm(g, x, reduce, norm))(x)
    assert [e.primitive.name for e in jaxpr.eqns] == ["custom_vjp_call"]  # the product alone


def _eqns(jaxpr):
    """Every equation of ``jaxpr`` and of the jaxprs in its equations' parameters, recursively."""
    for e in jaxpr.eqns:
        yield e
        for v in e.params.values():
            for sub in v if isinstance(v, (tuple, list)) else (v,):
                sub = getattr(sub, "jaxpr", sub)
                if hasattr(sub, "eqns"):
                    yield from _eqns(sub)


@pytest.mark.parametrize("norm", ["left", "right", "both", "mean"])
def test_spmm_norm_factors_reach_the_product_in_its_order(norm, kernels_here):
    # a static graph's factors reach the product as host data already in the CSR order of the graph it runs on (g
    # forward, g.T backward): the program gathers nothing of one value per edge for them (XLA folds a gather of a
    # constant by a constant at every compilation: seconds on a graph of millions of edges)
    from blocksparse.ops.gnn.spmm.api import TRANSPOSED_NORM, csr_norm_factor, norm_edge_weight

    reduce, norm = ("mean", None) if norm == "mean" else ("sum", norm)
    norm_ = norm or "right"
    g = gnn.power_law(40, 300, seed=6)
    factor = norm_edge_weight(g, norm_)
    np.testing.assert_array_equal(csr_norm_factor(g, norm_), factor[g.edge_perm])
    # on g.T an edge keeps its factor: the transposed norm's there (in- and out-degrees swap roles)
    np.testing.assert_array_equal(csr_norm_factor(g.T, TRANSPOSED_NORM[norm_]), factor[g.T.edge_perm])
    assert norm_edge_weight(g.T, TRANSPOSED_NORM[norm_]) is factor  # the same factors, kept once for both
    assert csr_norm_factor(g, norm_) is csr_norm_factor(g, norm_)  # once per graph and norm
    for impl in ("xla", "pallas"):

        def loss(x, impl=impl):
            return jnp.sum(gnn.spmm(g, x, reduce, norm, implementation=impl) ** 2)

        eqns = _eqns(jax.make_jaxpr(jax.grad(loss))(_x(g, 4)).jaxpr)
        shapes = [v.aval.shape for e in eqns if e.primitive.name == "gather" for v in e.outvars]
        assert (g.num_edges,) not in shapes, (impl, shapes)


@given(graphs(), st.sampled_from(["max", "min"]))
@settings(max_examples=examples(6))
def test_aggregate_matches_oracle_and_routes_gradient(g, reduce):
    # few distinct values: many ties, which must go to the first in-edge
    x = jnp.asarray(np.random.default_rng(0).integers(-2, 3, (g.num_nodes, 3)), jnp.float32)
    y = gnn.aggregate(g, x, reduce)
    np.testing.assert_array_equal(y, O.extreme(g.src, g.dst, g.num_nodes, x, reduce))
    ct = _x(g, 3, seed=4)
    dx = jax.grad(lambda x: jnp.sum(gnn.aggregate(g, x, reduce) * ct))(x)
    np.testing.assert_allclose(dx, O.extreme_grad(g.src, g.dst, g.num_nodes, x, ct, reduce), rtol=1e-6, atol=1e-6)


@given(graphs(max_nodes=12), st.integers(1, 3), st.integers(1, 5))
@settings(max_examples=examples(5))
def test_attention_matches_oracle(g, heads, dim):
    xs, xd, att = (
        _x(g, heads, dim),
        _x(g, heads, dim, seed=1),
        jnp.asarray(np.random.default_rng(2).standard_normal((heads, dim)), jnp.float32),
    )
    np.testing.assert_allclose(
        gnn.gatv2(g, xs, xd, att), O.gatv2(g.src, g.dst, g.num_nodes, xs, xd, att), rtol=1e-4, atol=1e-5
    )
    np.testing.assert_allclose(
        gnn.graph_attention(g, xs, xd, att[None] + xs),
        O.graph_attention(g.src, g.dst, g.num_nodes, xs, xd, att[None] + xs),
        rtol=1e-4,
        atol=1e-5,
    )


@given(graphs(max_nodes=12), st.integers(1, 3), st.integers(1, 5), st.booleans(), st.booleans())
@settings(max_examples=examples(6, quick=1), deadline=None)
def test_xla_attention_backward_is_autodiff_of_its_forward(g, heads, dim, traced, masked):
    """The XLA backward (weights from the saved log-sum-exp, the logits recomputed) against JAX's VJP of the XLA
    forward, on static and padded traced graphs; ``masked``: some destinations' every logit ``-inf`` (no weight)."""
    from blocksparse.ops.gnn.attention import api
    from blocksparse.ops.gnn.attention import reference as R

    gg = gnn.DynamicGraph.from_graph(g, max_edges=g.num_edges + 5) if traced else g
    xs, xd, ct = _x(g, heads, dim), _x(g, heads, dim, seed=1), _x(g, heads, dim, seed=3)
    att = jnp.asarray(np.random.default_rng(2).standard_normal((heads, dim)), jnp.float32)
    k, q = jnp.abs(xs) + 0.1, xd
    if masked:  # nodes 0 and 1's queries -inf: every logit into them is -inf (positive keys)
        q = q.at[:2].set(-jnp.inf)
    for mode, args in (("gat", (xs, xd, att)), ("dot", (k, q, _x(g, heads, dim, seed=4)))):
        s = api.AttentionStatic(("xla",), mode, slope=0.2, scale=0.5)
        out, lse = R.attention_forward(s, gg, *args)
        _, vjp = jax.vjp(lambda *a, s=s: R.attention_forward(s, gg, *a)[0], *args)
        got, want = R.attention_backward(s, gg, *args, out, lse, ct), vjp(ct)
        for x, y in zip(got, want, strict=True):
            # a weightless destination passes nothing back (the VJP's products with its -inf query give NaN there)
            assert np.isfinite(x).all(), mode
            np.testing.assert_allclose(x, np.where(np.isnan(y), x, y), rtol=1e-5, atol=1e-5, err_msg=mode)
            assert masked or not np.isnan(y).any()


def test_attention_gradients_finite_and_isolated_nodes_zero():
    g = gnn.Graph.from_edges([0, 1, 1, 2], [1, 2, 2, 2], 4)  # nodes 0, 3 have no in-edges
    xs, xd = _x(g, 2, 3), _x(g, 2, 3, seed=1)
    att = jnp.ones((2, 3))
    out = gnn.gatv2(g, xs, xd, att)
    np.testing.assert_array_equal(out[0], 0)
    np.testing.assert_array_equal(out[3], 0)
    grads = jax.grad(lambda a, b, c: jnp.sum(gnn.gatv2(g, a, b, c) ** 2), (0, 1, 2))(xs, xd, att)
    assert all(bool(jnp.isfinite(t).all()) for t in grads)
    grads = jax.grad(lambda q, k, v: jnp.sum(gnn.graph_attention(g, q, k, v) ** 2), (0, 1, 2))(xs, xd, xs)
    assert all(bool(jnp.isfinite(t).all()) for t in grads)
    # second order too: the backward's own derivative (grad of grad)
    jax.test_util.check_grads(lambda a, b: gnn.gatv2(g, a, b, att), (xs, xd), order=2, modes=["rev"], eps=1e-2)
    jax.test_util.check_grads(
        lambda q, k, v: gnn.graph_attention(g, q, k, v), (xs, xd, xs), order=2, modes=["rev"], eps=1e-2
    )


@pytest.mark.parametrize("traced", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["static", "traced"])
def test_grad_of_grad_on_the_kernels_is_xlas(traced):
    """Reverse-over-reverse (a Hessian-vector product) through the Pallas kernels: their derivatives inside the
    gradient are XLA's, so the result is XLA's (the kernels interpreted here), heavy nodes and a traced graph too."""
    rng = np.random.default_rng(1)
    dst = np.concatenate([rng.integers(0, 40, 150), np.full(150, 3)])  # node 3: 150+ in-edges, two chunks
    g0 = gnn.Graph.from_edges(rng.integers(0, 40, 300), dst, 40, heavy_quantile=0.9)
    assert g0.schedule.num_extra
    g = gnn.DynamicGraph.from_graph(g0, chunk=g0.chunk, max_edges=320, canonical=False) if traced else g0
    x = _x(g0, 2, 4)
    v, att = _x(g0, 2, 4, seed=1), jnp.ones((2, 4))
    ops = {
        "spmm gcn": lambda g, x, i: gnn.spmm(g, x.reshape(40, 8), norm="both", implementation=i),
        "max": lambda g, x, i: gnn.aggregate(g, x.reshape(40, 8), "max", implementation=i),
        "gatv2": lambda g, x, i: gnn.gatv2(g, x, x[::-1], att, implementation=i),
        "graph attention": lambda g, x, i: gnn.graph_attention(g, x, x[::-1], 0.5 * x, implementation=i),
    }
    for name, f in ops.items():
        got = {}
        for impl in ("xla", "pallas"):
            with bs.interpret():
                inner = lambda x, f=f, i=impl: jnp.vdot(jax.grad(lambda y: jnp.sin(f(g, y, i)).sum())(x), v)  # noqa: E731
                got[impl] = jax.jit(jax.grad(inner))(x)
        np.testing.assert_allclose(got["pallas"], got["xla"], rtol=1e-4, atol=1e-5, err_msg=name)


def test_bf16_within_tolerance():
    g = gnn.power_law(50, 400, seed=3)
    x = _x(g, 8)
    for f in (lambda x: gnn.spmm(g, x, "mean"), lambda x: gnn.aggregate(g, x, "max")):
        lo = f(x.astype(jnp.bfloat16))
        assert lo.dtype == jnp.bfloat16
        np.testing.assert_allclose(lo.astype(jnp.float32), f(x), rtol=2e-2, atol=2e-2)
    xh = x.reshape(50, 2, 4)
    lo = gnn.gatv2(g, xh.astype(jnp.bfloat16), xh.astype(jnp.bfloat16), jnp.ones((2, 4), jnp.bfloat16))
    np.testing.assert_allclose(lo.astype(jnp.float32), gnn.gatv2(g, xh, xh, jnp.ones((2, 4))), rtol=3e-2, atol=3e-2)


def test_attention_promotes_mixed_dtypes_on_every_backend():
    """Mixed feature dtypes promote as jnp ops do (the result type), on both backends; gradients keep each input's."""
    g = gnn.power_law(16, 60, seed=2)
    q, k, v = (_x(g, 2, 8, seed=i).astype(d) for i, d in enumerate((jnp.float32, jnp.bfloat16, jnp.float32)))
    att = jnp.ones((2, 8), jnp.bfloat16)
    for impl in ("xla", "pallas"):
        with bs.interpret():
            dot = jax.jit(functools.partial(gnn.graph_attention, g, implementation=impl))
            out, vjp = jax.vjp(dot, q, k, v)
            assert out.dtype == jnp.float32, (impl, out.dtype)
            assert [t.dtype for t in vjp(jnp.ones_like(out))] == [jnp.float32, jnp.bfloat16, jnp.float32]
            np.testing.assert_array_equal(dot(q, k, v), dot(q, k.astype(jnp.float32), v))  # as promoting first
            # (the forward under vjp also returns the log-sum-exp: another program, equal to float32 rounding)
            np.testing.assert_allclose(out, dot(q, k, v), rtol=1e-6, atol=1e-6)
            gat = functools.partial(gnn.gatv2, g, implementation=impl)
            out, vjp = jax.vjp(jax.jit(gat), k, q, att)  # bfloat16 x_src, float32 x_dst and a bfloat16 att
            assert out.dtype == jnp.float32, (impl, out.dtype)  # x_src's and x_dst's result type
            assert [t.dtype for t in vjp(jnp.ones_like(out))] == [jnp.bfloat16, jnp.float32, jnp.bfloat16]


def test_dispatch_falls_back_to_xla_on_cpu():
    if jax.default_backend() == "gpu":
        pytest.skip("CPU-only behaviour")
    g = gnn.power_law(10, 30)
    x = _x(g, 4)
    with bs.dispatch_log() as log:
        gnn.spmm(g, x)
        gnn.aggregate(g, x)
        gnn.gatv2(g, x.reshape(10, 1, 4), x.reshape(10, 1, 4), jnp.ones((1, 4)))
    assert log == [("spmm", "xla"), ("aggregate", "xla"), ("gatv2", "xla")]
    with pytest.raises(NotImplementedError, match="no GPU"):
        gnn.spmm(g, x, implementation="pallas")


def test_bad_input_messages():
    g = gnn.Graph.from_edges([0, 1], [1, 2], 3)
    x = jnp.ones((3, 4))
    with pytest.raises(ValueError, match=r"reduce in \['sum', 'mean'\]. Got 'max'"):
        gnn.spmm(g, x, "max")
    with pytest.raises(ValueError, match=r"reduce in \['max', 'min'\]. Got 'sum'"):
        gnn.aggregate(g, x, "sum")
    with pytest.raises(ValueError, match="norm in"):
        gnn.spmm(g, x, norm="sym")
    for norm in ("left", "right", "both"):
        with pytest.raises(
            ValueError, match=f"norm=None with reduce='mean'. Got norm='{norm}': 'mean' already divides"
        ):
            gnn.spmm(g, x, "mean", norm)
    with pytest.raises(ValueError, match=r"leading dimension 3. Got shape \(4, 4\)"):
        gnn.spmm(g, jnp.ones((4, 4)))
    with pytest.raises(ValueError, match=r"edge_weight of shape \(2,\). Got \(3,\)"):
        gnn.spmm(g, x, edge_weight=jnp.ones(3))
    with pytest.raises(TypeError, match="floating-point features. Got int32"):
        gnn.aggregate(g, jnp.ones((3, 4), jnp.int32))
    with pytest.raises(ValueError, match=r"att of shape \(heads, head_dim\) = \(2, 2\). Got \(2, 3\)"):
        gnn.gatv2(g, jnp.ones((3, 2, 2)), jnp.ones((3, 2, 2)), jnp.ones((2, 3)))
    with pytest.raises(ValueError, match=r"shape \(num_nodes=3, heads, head_dim\). Got shape \(3, 4\)"):
        gnn.graph_attention(g, x, x, x)
    with pytest.raises(ValueError, match="implementation in"):
        gnn.spmm(g, x, implementation="cuda")
    with pytest.raises(TypeError, match="Expected a blocksparse.gnn.Graph"):
        gnn.spmm(np.eye(3), x)


def test_trailing_feature_dims_and_vmap():
    g = gnn.power_law(20, 80, seed=4)
    x = _x(g, 2, 3)
    np.testing.assert_allclose(gnn.spmm(g, x).reshape(20, 6), gnn.spmm(g, x.reshape(20, 6)), rtol=1e-6)
    xb = jnp.stack([x, 2 * x])
    yb = jax.vmap(lambda x: gnn.aggregate(g, x))(xb)
    np.testing.assert_allclose(yb[1], gnn.aggregate(g, 2 * x), rtol=1e-6)


def test_empty_graph():
    g0 = gnn.Graph.from_edges([], [], 0)
    assert gnn.spmm(g0, jnp.zeros((0, 3))).shape == (0, 3)
    assert gnn.aggregate(g0, jnp.zeros((0, 3))).shape == (0, 3)
    d0 = gnn.DynamicGraph.from_edge_index(np.zeros((2, 4), np.int32), num_nodes=0, num_edges=0)  # padding only
    for kw in (dict(reduce="mean"), dict(norm="both"), dict(norm="left")):  # the norms' degrees: none to index
        assert gnn.spmm(d0, jnp.zeros((0, 3)), **kw).shape == (0, 3)
    g = gnn.Graph.from_edges([0], [1], 2)  # head_dim 0: an empty result (the default scale 1 / sqrt(0) unused)
    assert gnn.graph_attention(g, *(jnp.ones((2, 1, 0)),) * 3).shape == (2, 1, 0)


def test_spmm_default_implementation_by_dtype():
    """implementation=None: the Pallas kernel first for every feature dtype (with one warp per program it
    measured faster than XLA's segment sum in half precision too), XLA where it cannot run."""
    from blocksparse import hardware
    from blocksparse.ops.gnn import order

    with hardware.fake(hardware.H200):
        assert order.implementations("spmm", None, jnp.float32) == ("pallas", "xla")
        assert order.implementations("spmm", None, jnp.bfloat16) == ("pallas", "xla")
        assert order.implementations("spmm", None, jnp.float16) == ("pallas", "xla")
        assert order.implementations("spmm", "pallas", jnp.bfloat16) == ("pallas",)
    g = bs.gnn.power_law(50, 300, seed=0)
    x = jax.random.normal(jax.random.key(0), (50, 8), jnp.bfloat16)
    with bs.dispatch_log() as log:
        y = bs.gnn.spmm(g, x)
    want = "pallas" if jax.default_backend() == "gpu" else "xla"
    assert log == [("spmm", want)] and y.dtype == jnp.bfloat16


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("impl,nodes", [("xla", None), ("pallas", None), ("pallas", 4)])
def test_mean_scales_each_sum_once(dtype, impl, nodes, kernels_here):
    """A factor of the destination alone (the mean's, norm "right") multiplies each node's float32 sum once, not every
    gathered row: no (E, F) product in XLA's program and no weights in the kernel's (one node or four per program),
    heavy nodes' chunks included (one hub of 300 in-edges); the value the oracle's rounded once. The GCN norm's
    factors (source and destination) stay on the edges."""
    rng = np.random.default_rng(8)
    src = np.concatenate([rng.integers(0, 50, 400), rng.integers(0, 50, 300)])
    dst = np.concatenate([rng.integers(0, 50, 400), np.full(300, 7)])
    g = gnn.Graph.from_edges(src, dst, 50, heavy_quantile=0.5)
    assert impl == "xla" or g.schedule.num_extra  # the hub's chunks, folded after the kernel
    x = _x(g, 8, dtype=dtype)
    cfg = None if impl == "xla" else gnn.GatherConfig(nodes_per_program=nodes)
    for reduce, norm in (("mean", None), ("sum", "right")):
        y = gnn.spmm(g, x, reduce, norm, implementation=impl, config=cfg)
        ref = O.spmm(g.src, g.dst, g.num_nodes, x.astype(jnp.float32), None, reduce, norm)
        np.testing.assert_allclose(np.asarray(y, np.float32), ref, rtol=1e-5 if dtype == jnp.float32 else 1e-2,
                                   atol=1e-5 if dtype == jnp.float32 else 1e-2)  # fmt: skip
        if dtype != jnp.float32:  # (in float32 the same program twice: a GPU adds in any order, bits may differ)
            wide = gnn.spmm(g, x.astype(jnp.float32), reduce, norm, implementation=impl, config=cfg)  # not rounded
            np.testing.assert_array_equal(np.asarray(y), np.asarray(wide.astype(dtype)))
    w = jax.random.uniform(jax.random.key(1), (g.num_edges,))  # weights of the caller's, scaled per node too
    y = gnn.spmm(g, x, "sum", "right", edge_weight=w, implementation=impl, config=cfg)
    ref = O.spmm(g.src, g.dst, g.num_nodes, x.astype(jnp.float32), np.asarray(w), "sum", "right")
    tol = 1e-5 if dtype == jnp.float32 else 1e-2
    np.testing.assert_allclose(np.asarray(y, np.float32), ref, rtol=tol, atol=tol)

    def per_edge(norm, reduce="sum"):
        """XLA's (E, F) products; the kernels' operands of one float per edge (the weights)."""
        jaxpr = jax.make_jaxpr(lambda x: gnn.spmm(g, x, reduce, norm, implementation=impl, config=cfg))(x).jaxpr
        if impl == "xla":
            wide = (g.num_edges, 8)
            return [e for e in _eqns(jaxpr) if e.primitive.name == "mul" and e.outvars[0].aval.shape == wide]
        calls = [e for e in _eqns(jaxpr) if e.primitive.name == "pallas_call"]
        assert calls
        return [v for e in calls for v in e.invars if v.aval.shape == (g.num_edges,) and v.aval.dtype == jnp.float32]

    assert not per_edge(None, "mean") and not per_edge("right") and per_edge("both")
    from blocksparse.ops.gnn.spmm.api import row_norm_factor

    factor = row_norm_factor(g, "right")  # host data, once per graph and norm
    assert factor is row_norm_factor(g, "right") and factor.dtype == np.float32
    np.testing.assert_array_equal(factor, (1.0 / np.maximum(g.in_degree, 1)).astype(np.float32))
    with pytest.raises(ValueError, match="destination alone"):
        row_norm_factor(g, "both")
