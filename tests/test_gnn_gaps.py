"""Input classes of the public GNN ops that the other test modules do not check against an oracle.

Every op (``spmm`` sum / mean / the three norms, weighted or not; ``aggregate`` max / min; ``gatv2``;
``graph_attention``) on degenerate graphs (no edges, one node with self-loops, one node receiving or sending every
edge, one edge repeated until its destination is heavy), forward against the float64 NumPy oracle (tests/gnn_oracle.py)
and gradients against dense formulations on the adjacency (SpMM: ``A^T dout`` and ``c_e dout[dst] . x[src]`` in
float64; max / min: the oracle's first-winner routing; the attentions: JAX autodiff of a softmax over the dense count
matrix, float32 at full precision: independent of the segment ops and the kernels), on the XLA reference and the
Pallas kernels (interpreted on a CPU). Then: ``edge_weight`` gradients under every norm (static and traced
graphs), a non-default ``negative_slope`` and ``scale`` (forward and backward), float16 (attention; sums whose partials
leave float16's range), magnitudes near float32's extremes, non-finite features at the node a traced graph's padding
points at, ``vmap``, ``jit``'s cache over graphs of one edge multiset in different orders, zero-node graphs,
one-dimensional features, and bad inputs naming the expected and the actual values.
"""

import functools

import gnn_oracle as O
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_same_nonfinite_then_close, examples, relative_error
from hypothesis import given, settings
from hypothesis import strategies as st

import blocksparse as bs
import blocksparse.gnn as gnn
from blocksparse.testing.graphs import edge_lists, graphs

ON_GPU = jax.default_backend() == "gpu"
IMPLS = ("xla", "pallas")
SPMM_MODES = (("sum", None), ("sum", "left"), ("sum", "right"), ("sum", "both"), ("mean", None))
SLOPE, SCALE = -0.3, 0.7  # non-default GATv2 slope and attention scale in the every-op checks


def _rand(shape, seed, dtype=jnp.float32):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


# ------------------------------------------------------------------------------------------- oracles
def _degrees(src, dst, n):
    """Unweighted in- and out-degrees clamped to 1, float64 (the norms' definition in docs/gnn.md)."""
    return (np.maximum(np.bincount(dst, minlength=n), 1).astype(np.float64),
            np.maximum(np.bincount(src, minlength=n), 1).astype(np.float64))  # fmt: skip


def _edge_factor(src, dst, n, reduce, norm):
    """Each edge's normalisation factor ``c_e`` (``out[i] = sum_e c_e w_e x[src_e]``), from the definitions."""
    indeg, outdeg = _degrees(src, dst, n)
    if reduce == "mean" or norm == "right":
        return 1.0 / indeg[dst]
    if norm == "left":
        return 1.0 / outdeg[src]
    if norm == "both":
        return 1.0 / np.sqrt(outdeg[src] * indeg[dst])
    return np.ones(len(src))


def _spmm_dense_grads(src, dst, n, x, w, ct, reduce, norm):
    """``(dx, dw)`` of ``sum(spmm(x, w) * ct)`` from the dense matrix ``A = sum_e c_e w_e e_dst e_src^T``, in float64:
    ``dx = A^T ct`` and ``dw_e = c_e ct[dst_e] . x[src_e]``."""
    c = _edge_factor(src, dst, n, reduce, norm)
    w = np.ones(len(src)) if w is None else np.asarray(w, np.float64)
    x, ct = np.asarray(x, np.float64).reshape(n, -1), np.asarray(ct, np.float64).reshape(n, -1)
    a = np.zeros((n, n))
    np.add.at(a, (dst, src), c * w)
    return a.T @ ct, c * np.sum(ct[dst] * x[src], -1)


def _dense_softmax(count, e, vals):
    """``out[i] = sum_j count[i, j] exp(e[i, j]) vals[j] / sum_j count[i, j] exp(e[i, j])`` (a multi-edge counts once
    per copy; 0 without in-edges): the attentions on the dense ``(N, N)`` count matrix of edges ``j -> i``."""
    e = jnp.where(count[..., None] > 0, e, -jnp.inf)
    m = jax.lax.stop_gradient(jnp.max(e, axis=1, keepdims=True))
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    p = count[..., None] * jnp.exp(e - m)
    den = p.sum(1)
    return jnp.einsum("ijh,jhd->ihd", p, vals) / jnp.where(den > 0, den, 1.0)[..., None]


def _dense_gatv2(count, xs, xd, att, slope):
    z = xs[None] + xd[:, None]  # (i, j, H, D): x_src[j] + x_dst[i]
    return _dense_softmax(count, jnp.sum(jnp.where(z > 0, z, slope * z) * att, -1), xs)


def _dense_dot(count, q, k, v, scale):
    return _dense_softmax(count, scale * jnp.einsum("ihd,jhd->ijh", q, k), v)


@functools.partial(jax.jit, static_argnums=(2, 3))
def _dense_attention_jit(count, a, slope, scale):
    out = {}
    for name, f, args in (
        ("gatv2", lambda p, q, r: _dense_gatv2(count, p, q, r, slope), (a["xs"], a["xd"], a["att"])),
        ("dot", lambda q, k, v: _dense_dot(count, q, k, v, scale), (a["xd"], a["xs"], a["v"])),
    ):
        y, back = jax.vjp(f, *args)
        out[name] = (y, back(a["cth"]))
    return out


def _dense_attention(count, a, slope, scale):
    """``{"gatv2": (out, (d x_src, d x_dst, d att)), "dot": (out, (dq, dk, dv))}`` of the dense formulations, float32
    at full precision, for GATv2 on ``(a["xs"], a["xd"], a["att"])`` and graph attention on ``(q, k, v) = (a["xd"],
    a["xs"], a["v"])``, the cotangent ``a["cth"]``."""
    with jax.default_matmul_precision("highest"):
        return _dense_attention_jit(count, {k: a[k] for k in ("xs", "xd", "att", "v", "cth")}, slope, scale)


def _count(src, dst, n):
    c = np.zeros((n, n), np.float32)
    np.add.at(c, (dst, src), 1.0)
    return jnp.asarray(c)


# ------------------------------------------------------------------------------- degenerate graphs
def _star_in(n=200):
    """Every edge into node 0 (from every node, itself too): its 200 in-edges exceed one 128-edge chunk."""
    return np.arange(n), np.zeros(n, int), n


def _star_out(n=200):
    """Every edge out of node 0: the transposed graph's heavy node (the backward's chunks)."""
    return np.zeros(n, int), np.arange(n), n


SPECIAL = {
    "no_edges": lambda: (np.zeros(0, int), np.zeros(0, int), 5),
    "one_node_no_edges": lambda: (np.zeros(0, int), np.zeros(0, int), 1),
    "one_node_self_loops": lambda: (np.zeros(3, int), np.zeros(3, int), 1),  # a multi-edge too
    "star_in": _star_in,
    "star_out": _star_out,
    "one_edge_repeated": lambda: (np.full(150, 2), np.full(150, 1), 4),  # 150 copies of 2 -> 1: heavy, one source
    "complete_with_loops": lambda: (np.repeat(np.arange(5), 5), np.tile(np.arange(5), 5), 5),
}
# feature width and (heads, head_dim) per graph: widths 1, 3 and 5, one head and several, not powers of two
SHAPES = {"no_edges": (3, 2, 3), "one_node_no_edges": (1, 1, 1), "one_node_self_loops": (1, 1, 1),
          "star_in": (3, 1, 5), "star_out": (5, 3, 3), "one_edge_repeated": (1, 2, 1),
          "complete_with_loops": (3, 3, 5)}  # fmt: skip
PALLAS_QUICK = ("one_node_self_loops", "star_in")  # the others: slow (the kernels, interpreted)


def _special_graph(name):
    src, dst, n = SPECIAL[name]()
    # heavy_quantile 0.5: every node above the median in-degree and one chunk is split (star_in's hub, the repeat)
    g = gnn.Graph.from_edges(src, dst, n, heavy_quantile=0.5)
    if name in ("star_in", "one_edge_repeated"):
        assert g.schedule.num_extra  # the hub's chunks, combined after the kernels
    if name == "star_out":
        assert g.T.schedule.num_extra  # the backward's source pass / product over g.T splits node 0
    return g


def _inputs(n, e, f, h, d, seed=0):
    keys = iter(range(seed, seed + 20))
    return {
        "x": _rand((n, f), next(keys)),
        "w": jnp.asarray(np.random.default_rng(next(keys)).uniform(0.5, 1.5, e), jnp.float32),
        "ct": _rand((n, f), next(keys)),
        "xs": _rand((n, h, d), next(keys)),
        "xd": _rand((n, h, d), next(keys)),
        "v": _rand((n, h, d), next(keys)),
        "att": _rand((h, d), next(keys)),
        "cth": _rand((n, h, d), next(keys)),
    }


@functools.partial(jax.jit, static_argnums=(1,))
def _every_op(g, impl, a):
    """Every op's output and the VJP of its cotangent, one program per graph and backend (``g`` a static Graph: a
    pytree without leaves; or a DynamicGraph)."""

    def vjp(f, args, ct):
        out, back = jax.vjp(f, *args)
        return out, back(ct)

    kw = dict(implementation=impl)
    out = {}
    for reduce, norm in SPMM_MODES:
        out[f"{reduce}/{norm}"] = vjp(lambda x, w, r=reduce, m=norm: gnn.spmm(g, x, r, m, w, **kw), (a["x"], a["w"]),
                                      a["ct"])  # fmt: skip
    out["sum unweighted"] = vjp(lambda x: gnn.spmm(g, x, **kw), (a["x"],), a["ct"])
    for red in ("max", "min"):
        out[red] = vjp(lambda x, r=red: gnn.aggregate(g, x, r, **kw), (a["x"],), a["ct"])
    out["gatv2"] = vjp(lambda p, q, r: gnn.gatv2(g, p, q, r, SLOPE, **kw), (a["xs"], a["xd"], a["att"]), a["cth"])
    out["dot"] = vjp(lambda q, k, v: gnn.graph_attention(g, q, k, v, SCALE, **kw), (a["xd"], a["xs"], a["v"]),
                     a["cth"])  # fmt: skip
    return out


def _check_every_op(got, src, dst, n, a, what):
    """``_every_op``'s outputs against the NumPy oracle and its gradients against the dense formulations."""

    def close(u, v, name, tol=2e-5):
        u, v = np.asarray(u, np.float64), np.asarray(v, np.float64)
        assert u.shape == v.shape, (what, name, u.shape, v.shape)
        np.testing.assert_allclose(u, v, rtol=tol, atol=tol, err_msg=f"{what}: {name}")

    x, w, ct = (np.asarray(a[k], np.float64) for k in ("x", "w", "ct"))
    for reduce, norm in SPMM_MODES:
        y, (dx, dw) = got[f"{reduce}/{norm}"]
        close(y, O.spmm(src, dst, n, x, w, reduce, norm), f"spmm {reduce}/{norm}")
        want_dx, want_dw = _spmm_dense_grads(src, dst, n, x, w, ct, reduce, norm)
        close(dx, want_dx, f"spmm {reduce}/{norm} dx")
        close(dw, want_dw, f"spmm {reduce}/{norm} dw")
    y, (dx,) = got["sum unweighted"]
    close(y, O.spmm(src, dst, n, x), "spmm unweighted")
    close(dx, _spmm_dense_grads(src, dst, n, x, None, ct, "sum", None)[0], "spmm unweighted dx")
    for red in ("max", "min"):
        y, (dx,) = got[red]
        np.testing.assert_array_equal(y, O.extreme(src, dst, n, x, red), err_msg=f"{what}: {red}")
        close(dx, O.extreme_grad(src, dst, n, x, ct, red), f"{red} dx")
    count = _count(src, dst, n)
    dense = _dense_attention(count, a, SLOPE, SCALE)
    close(got["gatv2"][0], O.gatv2(src, dst, n, a["xs"], a["xd"], a["att"], SLOPE), "gatv2")
    close(got["dot"][0], O.graph_attention(src, dst, n, a["xd"], a["xs"], a["v"], SCALE), "graph_attention")
    for name in ("gatv2", "dot"):
        for i, (u, v) in enumerate(zip(got[name][1], dense[name][1], strict=True)):
            close(u, v, f"{name} grad {i}", tol=5e-5)  # (sums of up to 200 terms in another order)
    isolated = np.bincount(dst, minlength=n) == 0
    for name, (y, _) in got.items():
        assert (np.asarray(y)[isolated] == 0).all(), (what, name)


def _special_cases():
    for name in SPECIAL:
        for impl in IMPLS:
            slow = impl == "pallas" and name not in PALLAS_QUICK
            yield pytest.param(name, impl, marks=[pytest.mark.slow] if slow else [], id=f"{name}-{impl}")


@pytest.mark.parametrize("name, impl", list(_special_cases()))
def test_degenerate_graphs_every_op_and_gradient(name, impl):
    g = _special_graph(name)
    src, dst, n = SPECIAL[name]()
    f, h, d = SHAPES[name]
    a = _inputs(n, g.num_edges, f, h, d, seed=len(src))
    with gnn.interpret(impl == "pallas" and not ON_GPU), bs.dispatch_log() as log:
        got = _every_op(g, impl, a)
    assert {i for _, i in log} <= {impl}, log  # (no edges: no backend runs at all)
    _check_every_op(got, src, dst, n, a, f"{name} {impl}")


def test_zero_node_graphs_every_op_and_gradient():
    """A graph of no nodes (static, and traced with spare edge capacity): empty outputs of each op's shape and dtype,
    and empty gradients of each input's, every op (test_gnn_ops.test_empty_graph: spmm and aggregate's shapes)."""
    static = gnn.Graph.from_edges([], [], 0)
    traced = gnn.DynamicGraph.from_edge_index(np.zeros((2, 4), np.int32), num_nodes=0, num_edges=0)
    for g in (static, traced):
        for dtype in (jnp.float32, jnp.bfloat16):
            a = {k: v.astype(dtype) for k, v in _inputs(0, g.edge_capacity, 3, 2, 4).items()}
            got = _every_op(g, "xla", a)
            for name, (y, grads) in got.items():
                want = (0, 2, 4) if name in ("gatv2", "dot") else (0, 3)
                assert y.shape == want and y.dtype == dtype, (name, y.shape, y.dtype)
                for t in grads:
                    assert t.dtype == dtype and not np.any(np.asarray(t, np.float32)), name


# ------------------------------------------------------------------- spmm's edge-weight gradients
N_CAP, E_CAP = 24, 400  # one traced capacity for every example: one compilation


@jax.jit
def _traced_spmm_grads(edge_index, num_edges, x, w, ct):
    g = gnn.DynamicGraph.from_edge_index(edge_index, num_nodes=N_CAP, max_edges=E_CAP, num_edges=num_edges)
    return {f"{r}/{m}": jax.grad(lambda x, w, r=r, m=m: jnp.vdot(gnn.spmm(g, x, r, m, w), ct), (0, 1))(x, w)
            for r, m in SPMM_MODES}  # fmt: skip


@given(edge_lists(max_nodes=N_CAP, max_edges=40, hub_in_degree=(129, 300)), st.sampled_from(SPMM_MODES))
@settings(max_examples=examples(10), deadline=None)
def test_spmm_edge_weight_gradient_under_every_norm(edges, mode):
    """``d/dw`` of a normalised (or mean) weighted SpMM is ``c_e dout[dst] . x[src]`` with the norm's factor ``c_e``,
    on a static graph and a padded traced one (whose padding weights get 0): the other modules check ``dw`` of the
    plain sum only (test_gnn_ops.test_spmm_gradients; test_gnn_dynamic compares ``dx`` alone)."""
    src, dst, n = edges
    e = src.size
    reduce, norm = mode
    x, ct = _rand((N_CAP, 3), e), _rand((N_CAP, 3), e + 1)
    w = jnp.asarray(np.random.default_rng(e).uniform(-1.5, 1.5, E_CAP), jnp.float32)
    want_dx, want_dw = _spmm_dense_grads(src, dst, N_CAP, x, w[:e], ct, reduce, norm)
    g = gnn.Graph.from_edges(src, dst, N_CAP)
    dx, dw = jax.grad(lambda x, w: jnp.vdot(gnn.spmm(g, x, reduce, norm, w), ct), (0, 1))(x, w[:e])
    np.testing.assert_allclose(dx, want_dx, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dw, want_dw, rtol=1e-5, atol=1e-5)
    ei = np.full((2, E_CAP), 5, np.int32)  # padding holding node ids: never counted
    ei[:, :e] = src, dst
    dx, dw = _traced_spmm_grads(jnp.asarray(ei), jnp.int32(e), x, w, ct)[f"{reduce}/{norm}"]
    np.testing.assert_allclose(dx, want_dx, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dw[:e], want_dw, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(dw[e:], 0.0)


# ----------------------------------------------------------- GATv2's slope, the attention's scale
@functools.partial(jax.jit, static_argnums=(1, 3, 4))
def _attention(g, impl, a, slope, scale):
    """The library's GATv2 and graph attention with ``slope`` and ``scale``, outputs and VJPs, as
    :func:`_dense_attention` returns them (one program)."""
    gat = lambda p, q, r: gnn.gatv2(g, p, q, r, slope, implementation=impl)
    dot = lambda q, k, v: gnn.graph_attention(g, q, k, v, scale, implementation=impl)
    out = {}
    for name, f, args in (("gatv2", gat, (a["xs"], a["xd"], a["att"])), ("dot", dot, (a["xd"], a["xs"], a["v"]))):
        y, back = jax.vjp(f, *args)
        out[name] = (y, back(a["cth"]))
    return out


def _check_attention(g, impl, a, slope, scale, tol=2e-5):
    got = _attention(g, impl, {k: a[k] for k in ("xs", "xd", "att", "v", "cth")}, slope, scale)
    want = _dense_attention(_count(g.src, g.dst, g.num_nodes), a, slope, scale)
    oracle = {"gatv2": O.gatv2(g.src, g.dst, g.num_nodes, a["xs"], a["xd"], a["att"], slope),
              "dot": O.graph_attention(g.src, g.dst, g.num_nodes, a["xd"], a["xs"], a["v"], scale)}  # fmt: skip
    for name in got:
        what = f"{impl} {name}, slope {slope}, scale {scale}"
        np.testing.assert_allclose(got[name][0], oracle[name], rtol=1e-4, atol=1e-5, err_msg=what)
        for i, (u, v) in enumerate(zip(got[name][1], want[name][1], strict=True)):
            np.testing.assert_allclose(u, v, rtol=1e-4, atol=tol, err_msg=f"{what}: gradient {i}")


@given(graphs(max_nodes=10, max_edges=30, hub_in_degree=(2, 12)), st.sampled_from([0.0, 1.0, -0.5, 2.0]),
       st.sampled_from([0.0, -1.0, 3.0]), st.integers(1, 3), st.integers(1, 5))  # fmt: skip
@settings(max_examples=examples(16), deadline=None)
def test_slope_and_scale_forward_and_gradients(g, slope, scale, heads, dim):
    """A non-default ``negative_slope`` (0: ReLU, 1: linear, negative, above 1) and ``scale`` (0: uniform weights,
    negative) against the oracle, and the three inputs' gradients against the dense formulation: every other module
    runs the default slope 0.2 and scale (the backward's slope is ``leaky_relu``'s derivative)."""
    _check_attention(g, "xla", _inputs(g.num_nodes, g.num_edges, 1, heads, dim, seed=g.num_edges), slope, scale)


@pytest.mark.parametrize("slope, scale", [(1.5, -1.0), pytest.param(0.0, 0.0, marks=pytest.mark.slow)])
def test_slope_and_scale_on_the_kernels(slope, scale):
    """The same on the Pallas kernels (interpreted here): the slope and scale reach the forward and both backward
    passes, heavy nodes' chunks included."""
    rng = np.random.default_rng(3)
    src = np.concatenate([rng.integers(0, 12, 40), rng.integers(0, 12, 140)])
    dst = np.concatenate([rng.integers(0, 12, 40), np.full(140, 5)])
    g = gnn.Graph.from_edges(src, dst, 12, heavy_quantile=0.5)
    assert g.schedule.num_extra
    with gnn.interpret(not ON_GPU):
        _check_attention(g, "pallas", _inputs(12, g.num_edges, 1, 2, 3, seed=1), slope, scale, tol=5e-5)


@pytest.mark.parametrize("impl", IMPLS)
def test_traced_scale_is_a_learnable_temperature(impl):
    """``scale`` as a traced scalar (under ``jit`` and ``grad``): the same output as the number compiled in, and its
    gradient, with q's, k's and v's, against the dense formulation's."""
    rng = np.random.default_rng(4)
    src = np.concatenate([rng.integers(0, 12, 40), rng.integers(0, 12, 60)])
    dst = np.concatenate([rng.integers(0, 12, 40), np.full(60, 5)])
    g = gnn.Graph.from_edges(src, dst, 12, heavy_quantile=0.5)
    a = _inputs(12, g.num_edges, 1, 2, 3, seed=5)
    q, k, v, ct = a["xd"], a["xs"], a["v"], a["cth"]
    count = _count(g.src, g.dst, g.num_nodes)

    def loss(f):
        return lambda t, q, k, v: jnp.sum(f(t, q, k, v) * ct)

    ours = loss(lambda t, q, k, v: gnn.graph_attention(g, q, k, v, t, implementation=impl))
    dense = loss(lambda t, q, k, v: _dense_dot(count, q, k, v, t))
    with gnn.interpret(impl == "pallas" and not ON_GPU):
        out = jax.jit(lambda t: gnn.graph_attention(g, q, k, v, t, implementation=impl))(jnp.float32(0.7))
        fixed = gnn.graph_attention(g, q, k, v, 0.7, implementation=impl)
        got = jax.jit(jax.grad(ours, argnums=(0, 1, 2, 3)))(jnp.float32(0.7), q, k, v)
        eager = jax.grad(ours)(jnp.float32(0.7), q, k, v)  # grad without jit: the scale is still a tracer
    np.testing.assert_allclose(out, fixed, rtol=1e-5, atol=1e-6)
    with jax.default_matmul_precision("highest"):
        want = jax.grad(dense, argnums=(0, 1, 2, 3))(jnp.float32(0.7), q, k, v)
    for i, (u, w) in enumerate(zip(got, want, strict=True)):
        np.testing.assert_allclose(u, w, rtol=1e-4, atol=2e-5, err_msg=f"gradient {i}")
    np.testing.assert_allclose(eager, want[0], rtol=1e-4, atol=2e-5)
    assert got[0] != 0.0  # the temperature's gradient is not dropped


def test_traced_scale_with_bfloat16_q_rounds_q_once():
    """A traced scale with bfloat16 inputs: the result is the float32 scale times q rounded to bfloat16, exactly what
    the number gives for that pre-scaled q; the scale's gradient is float32."""
    g = gnn.Graph.from_edges([0, 1, 2, 2, 3], [1, 2, 0, 3, 3], 4)
    q, k, v = (_rand((4, 2, 16), s, jnp.bfloat16) for s in (1, 2, 3))
    got = jax.jit(lambda t: gnn.graph_attention(g, q, k, v, t, implementation="xla"))(jnp.float32(0.3))
    want = gnn.graph_attention(g, (q.astype(jnp.float32) * 0.3).astype(jnp.bfloat16), k, v, 1.0, implementation="xla")
    assert got.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
    dt = jax.grad(lambda t: jnp.sum(gnn.graph_attention(g, q, k, v, t, implementation="xla").astype(jnp.float32)))
    d = dt(jnp.float32(0.3))
    assert d.dtype == jnp.float32 and np.isfinite(d)


def test_traced_scale_under_vmap_and_on_a_traced_graph():
    """A sweep of temperatures under ``vmap`` gives each fixed scale's result; on a ``DynamicGraph`` of the same edges
    the traced scale gives the static graph's result and a gradient."""
    g = gnn.Graph.from_edges([0, 1, 2, 2, 3, 0], [1, 2, 0, 3, 3, 3], 4)
    q, k, v = (_rand((4, 2, 16), s) for s in (1, 2, 3))
    ts = jnp.array([0.1, 0.25, 1.0])
    got = jax.vmap(lambda t: gnn.graph_attention(g, q, k, v, t, implementation="xla"))(ts)
    for t, y in zip(ts, got, strict=True):
        np.testing.assert_allclose(y, gnn.graph_attention(g, q, k, v, float(t), implementation="xla"), atol=1e-6)
    dg = gnn.DynamicGraph.from_edge_index(np.stack([np.asarray(g.src), np.asarray(g.dst)]), num_nodes=4, max_edges=9)
    f = lambda t, h: jnp.sum(gnn.graph_attention(h, q, k, v, t, implementation="xla") ** 2)
    got = jax.jit(jax.value_and_grad(f))(jnp.float32(0.25), dg)
    want = jax.value_and_grad(f)(jnp.float32(0.25), g)
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_traced_negative_slope_is_a_clear_error():
    """GATv2's slope is compiled into the kernels: traced, it is a TypeError that says what to do instead."""
    with pytest.raises(TypeError, match=r"negative_slope to be a number known when the function is traced.*static"):
        jax.jit(lambda s: gnn.gatv2(_G, _XH, _XH, jnp.ones((1, 2)), s))(0.1)


# ------------------------------------------------------------------------------ float16, magnitudes
def _hub_graph(n=40, hub=3, seed=8):
    """Node ``hub`` takes 300 in-edges (three chunks, combined after the kernel); node 5 two; others a few."""
    rng = np.random.default_rng(seed)
    src = np.concatenate([rng.integers(0, n, 300), [1, 2], rng.integers(0, n, 30)])
    dst = np.concatenate([np.full(300, hub), [5, 5], rng.integers(6, n, 30)])
    g = gnn.Graph.from_edges(src, dst, n, heavy_quantile=0.5)
    assert g.schedule.num_extra
    return g


def _in_float16(want):
    """The float64 ``want`` as a float16 result holds it: inf from 65520 on (what rounds above 65504)."""
    return np.where(np.abs(want) >= 65520, np.copysign(np.inf, want), want)


@pytest.mark.parametrize("impl", IMPLS)
def test_float16_sums_whose_partials_leave_its_range(impl):
    """float16 features between 30000 and 65000 (float16's largest finite value: 65504): a mean of the hub's 300 is in
    range (its float32 sum, about 1.4e7, divided then rounded once), the other norms' results are inf exactly where the
    float64 oracle is beyond float16's range; the attentions' uniform weights (logits 0) average in range too. The
    mean's gradient likewise, in float16."""
    g = _hub_graph()
    n = g.num_nodes
    x = jnp.asarray(np.random.default_rng(0).uniform(3e4, 6.5e4, (n, 4)), jnp.float16)
    xh, zero = x.reshape(n, 2, 2), jnp.zeros((n, 2, 2), jnp.float16)

    @jax.jit
    def run(x, xh, zero):
        kw = dict(implementation=impl)
        sums = {f"{r}/{m}": gnn.spmm(g, x, r, m, **kw) for r, m in SPMM_MODES}
        dx = jax.vjp(lambda x: gnn.spmm(g, x, "mean", **kw), x)[1](x)[0]
        dot = gnn.graph_attention(g, zero, zero, xh, **kw)
        gat = gnn.gatv2(g, xh, zero, jnp.zeros((2, 2), jnp.float16), **kw)  # att 0: logits 0
        return sums, dx, dot, gat

    with gnn.interpret(impl == "pallas" and not ON_GPU):
        sums, dx, dot, gat = run(x, xh, zero)
    x64 = np.asarray(x, np.float64)
    for reduce, norm in SPMM_MODES:
        y = sums[f"{reduce}/{norm}"]
        assert y.dtype == jnp.float16
        want = _in_float16(O.spmm(g.src, g.dst, n, x64, None, reduce, norm))
        np.testing.assert_allclose(np.asarray(y, np.float64), want, rtol=1e-3, err_msg=f"{reduce}/{norm}")
    assert np.isfinite(np.asarray(sums["mean/None"], np.float32)).all()
    assert np.isinf(np.asarray(sums["sum/None"], np.float32)[g.heavy_nodes]).all()  # (the hub's sum: beyond range)
    assert dx.dtype == jnp.float16
    want = _in_float16(_spmm_dense_grads(g.src, g.dst, n, x64, None, x64, "mean", None)[0])
    np.testing.assert_allclose(np.asarray(dx, np.float64), want, rtol=1e-3)
    zero64 = np.zeros((n, 2, 2))
    want = _in_float16(O.graph_attention(g.src, g.dst, n, zero64, zero64, x64.reshape(n, 2, 2)))
    for y in (dot, gat):
        assert y.dtype == jnp.float16
        np.testing.assert_allclose(np.asarray(y, np.float64), want, rtol=1e-3)
    assert np.isfinite(want).all()


@pytest.mark.parametrize("impl", IMPLS)
def test_float16_attention_against_the_oracle(impl):
    """float16 features for GATv2 and graph attention (the other modules: bfloat16 only): float16 results and
    gradients of each input's dtype, within float16's rounding of the float64 oracle and the dense float32 gradients."""
    g = _hub_graph()
    n = g.num_nodes
    a = _inputs(n, g.num_edges, 1, 2, 4, seed=2)
    h = {k: v.astype(jnp.float16) for k, v in a.items()}
    a = {k: v.astype(jnp.float32) for k, v in h.items()}  # the same values in float32, for the oracles
    with gnn.interpret(impl == "pallas" and not ON_GPU):

        @jax.jit
        def run(h):
            gat = jax.vjp(lambda p, q, r: gnn.gatv2(g, p, q, r, implementation=impl), h["xs"], h["xd"], h["att"])
            dot = jax.vjp(lambda q, k, v: gnn.graph_attention(g, q, k, v, implementation=impl), h["xd"], h["xs"],
                          h["v"])  # fmt: skip
            return [(y, back(h["cth"])) for y, back in (gat, dot)]

        (gy, gg), (dy, dg) = run(h)
    count = _count(g.src, g.dst, n)
    dense = _dense_attention(count, a, 0.2, 0.5)  # the defaults: slope 0.2, scale 1 / sqrt(head_dim 4)
    want = (O.gatv2(g.src, g.dst, n, a["xs"], a["xd"], a["att"]),
            O.graph_attention(g.src, g.dst, n, a["xd"], a["xs"], a["v"]))  # fmt: skip
    for y, w in zip((gy, dy), want, strict=True):
        assert y.dtype == jnp.float16
        np.testing.assert_allclose(np.asarray(y, np.float64), w, rtol=1e-2, atol=2e-3)
    for got, ref in ((gg, dense["gatv2"][1]), (dg, dense["dot"][1])):
        for u, v in zip(got, ref, strict=True):
            assert u.dtype == jnp.float16
            assert relative_error(u, v) < 5e-3


@pytest.mark.parametrize("impl", IMPLS)
def test_magnitudes_near_float32s_extremes(impl):
    """Features of 2**100 (1.3e30) and 2**-100 (7.9e-31, still normal): SpMM, max / min and both attentions against
    the float64 oracle to float32 rounding (relative), the hub's 300-edge sums well inside float32's range; GATv2 with
    tiny features and a huge ``att`` (logits of order 1) too."""
    g = _hub_graph()
    n = g.num_nodes
    a = _inputs(n, g.num_edges, 6, 2, 3, seed=4)
    with gnn.interpret(impl == "pallas" and not ON_GPU):

        @jax.jit
        def run(x, xs, xd, att, v):
            kw = dict(implementation=impl)
            return (gnn.spmm(g, x, **kw), gnn.spmm(g, x, "sum", "both", **kw), gnn.spmm(g, x, "mean", **kw),
                    gnn.aggregate(g, x, "max", **kw), gnn.aggregate(g, x, "min", **kw),
                    gnn.gatv2(g, xs, xd, att, **kw), gnn.graph_attention(g, a["xd"], a["xs"], v, **kw))  # fmt: skip

        for k in (100, -100):
            s = np.float32(2.0**k)
            x, v = a["x"] * s, a["v"] * s
            xs, xd, att = a["xs"] * (1 / s), a["xd"] * (1 / s), a["att"] * s  # logits unchanged, values scaled
            got = run(x, xs, xd, att, v)
            x64 = np.asarray(x, np.float64)
            want = [O.spmm(g.src, g.dst, n, x64), O.spmm(g.src, g.dst, n, x64, None, "sum", "both"),
                    O.spmm(g.src, g.dst, n, x64, None, "mean"), O.extreme(g.src, g.dst, n, x64, "max"),
                    O.extreme(g.src, g.dst, n, x64, "min"), O.gatv2(g.src, g.dst, n, xs, xd, att),
                    O.graph_attention(g.src, g.dst, n, a["xd"], a["xs"], v)]  # fmt: skip
            for i, (u, w) in enumerate(zip(got, want, strict=True)):
                assert relative_error(u, w) < 1e-5, (k, i, relative_error(u, w))


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="the attentions sum unnormalised weights times values (sum_j p_j v_j, p_j <= 1) before dividing by "
    "sum_j p_j: with |v| near float32's maximum the float32 numerator overflows to inf although the softmax-weighted "
    "average (as jax.nn.softmax(e) @ v, PyG, DGL compute it) is finite; both backends (attention/reference.py "
    "_softmax_aggregate, the kernels' online-softmax accumulator in attention/pallas_triton.py)",
)
@pytest.mark.parametrize("impl", IMPLS)
def test_attention_average_of_values_near_float32_max_is_finite(impl):
    g = gnn.Graph.from_edges([0, 1], [2, 2], 3)  # two in-edges of equal logits: weights 1/2 each
    v = jnp.full((3, 1, 1), 2e38, jnp.float32)
    q = jnp.zeros((3, 1, 1))
    with gnn.interpret(impl == "pallas" and not ON_GPU):
        dot = gnn.graph_attention(g, q, q, v, implementation=impl)
        gat = gnn.gatv2(g, v, q, jnp.zeros((1, 1)), implementation=impl)
    for y in (dot, gat):
        np.testing.assert_allclose(np.asarray(y)[2, 0, 0], 2e38, rtol=1e-6)


# ------------------------------------------------------ non-finite features on a padded traced graph
@pytest.mark.parametrize("impl", ["xla", pytest.param("pallas", marks=pytest.mark.slow)])
def test_nonfinite_features_where_a_traced_graphs_padding_points(impl):
    """A traced graph's padding and masked edges read node 0 (and the junk ids given hold node 7's): NaN and inf there
    must reach exactly the destinations of real edges, forward and backward, as on the static graph of the same edges
    (test_gnn_invalid: static graphs; test_gnn_dynamic: finite features)."""
    n = 8
    src = np.array([0, 1, 1, 2, 3, 4, 5, 6])  # node 7: no edges; node 0 sends one edge; sorted by (dst, src)
    dst = np.array([2, 2, 3, 3, 3, 5, 5, 6])
    e, cap = src.size, src.size + 8
    ei = np.full((2, cap), 7, np.int32)
    ei[:, :e] = src, dst
    x = np.array(_rand((n, 2, 2), 0))
    x[0, 0, 0], x[0, 1, 1], x[7, 0, 1], x[7, 1, 0] = np.nan, np.inf, -np.inf, np.nan
    a = {"x": jnp.asarray(x.reshape(n, 4)), "w": jnp.ones(cap), "ct": _rand((n, 4), 1), "xs": jnp.asarray(x),
         "xd": jnp.asarray(x[::-1]), "v": jnp.asarray(x), "att": jnp.ones((2, 2)),
         "cth": _rand((n, 2, 2), 2)}  # fmt: skip
    static = gnn.Graph.from_edges(src, dst, n)
    with gnn.interpret(impl == "pallas" and not ON_GPU):
        traced = jax.jit(lambda ei: gnn.DynamicGraph.from_edge_index(ei, num_nodes=n, num_edges=e))(ei)
        got = _every_op(traced, impl, a)
        want = _every_op(static, impl, dict(a, w=a["w"][:e]))
    for name in got:
        (y, grads), (wy, wgrads) = got[name], want[name]
        if len(grads) == 2 and grads[1].shape == (cap,):  # spmm's dw: in edge_index order, the padding's last
            np.testing.assert_array_equal(grads[1][e:], 0.0)  # no gradient, whatever node 0 holds
            grads = (grads[0], grads[1][:e])
        for u, v in zip((y, *grads), (wy, *wgrads), strict=True):
            u, v = np.asarray(u, np.float64), np.asarray(v, np.float64)
            np.testing.assert_array_equal(np.isnan(u), np.isnan(v), err_msg=name)
            np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-6, err_msg=name)  # (NaN where NaN)
    for reduce in ("max", "min"):
        assert_same_nonfinite_then_close(got[reduce][0], O.extreme(src, dst, n, a["x"], reduce), reduce, atol=1e-6)
    assert_same_nonfinite_then_close(got["sum/None"][0], O.spmm(src, dst, n, a["x"]), "sum", atol=1e-6)


# ------------------------------------------------------------------------------ vmap, jit's cache
@pytest.mark.slow  # (vmap is not documented for the GNN ops)
@pytest.mark.parametrize("impl", IMPLS)
def test_vmap_is_a_loop_over_examples(impl):
    """``jax.vmap`` over a batch of features (and of edge weights, and of ``att``), values and gradients, equals one
    call per example (test_gnn_ops / test_gnn_aggregate_packed: vmap of ``aggregate`` only). vmap is not documented
    for the GNN ops; it works through their ``custom_vjp``."""
    g = gnn.power_law(12, 60, seed=1)
    b = 3
    xs = _rand((b, 12, 2, 3), 0)
    w = jnp.asarray(np.random.default_rng(2).uniform(0.5, 1.5, (b, g.num_edges)), jnp.float32)
    att = _rand((b, 2, 3), 3)
    kw = dict(implementation=impl)
    ops = {
        "spmm": (lambda x, w, a: gnn.spmm(g, x.reshape(12, 6), "sum", "both", w, **kw), (0, 1)),
        "mean": (lambda x, w, a: gnn.spmm(g, x, "mean", None, w, **kw), (0, 1)),
        "max": (lambda x, w, a: gnn.aggregate(g, x, "max", **kw), (0,)),
        "gatv2": (lambda x, w, a: gnn.gatv2(g, x, x[::-1], a, 0.1, **kw), (0, 2)),
        "dot": (lambda x, w, a: gnn.graph_attention(g, x, x[::-1], 2 * x, 0.4, **kw), (0,)),
    }
    with gnn.interpret(impl == "pallas" and not ON_GPU):
        for name, (f, argnums) in ops.items():
            vg = jax.value_and_grad(lambda x, w, a, f=f: jnp.sum(jnp.sin(f(x, w, a))), argnums)
            batched = jax.jit(jax.vmap(vg))(xs, w, att)
            for i in range(b):
                one = jax.jit(vg)(xs[i], w[i], att[i])
                for u, v in zip(jax.tree.leaves(one), jax.tree.leaves(batched), strict=True):
                    np.testing.assert_allclose(v[i], u, rtol=1e-5, atol=1e-6, err_msg=name)


def test_jit_keeps_graphs_of_one_edge_multiset_apart():
    """Graphs are jit's static arguments, hashed by their edges: the same edges in another order (edge weights and
    max / min ties follow the given order) or another ``heavy_quantile`` must not share a trace's constants. Each call
    of one jitted function against the NumPy oracle of its own graph."""
    rng = np.random.default_rng(0)
    src = np.concatenate([rng.integers(0, 10, 30), np.arange(140) % 10])
    dst = np.concatenate([rng.integers(0, 10, 30), np.full(140, 4)])
    perm = rng.permutation(src.size)
    w = jnp.asarray(rng.uniform(0.5, 1.5, src.size), jnp.float32)
    x = jnp.asarray(rng.integers(-2, 3, (10, 3)), jnp.float32)  # many ties: max's gradient follows the edge order
    ct = _rand((10, 3), 1)

    @jax.jit
    def f(g, x, w):
        return gnn.spmm(g, x, "sum", "both", w), jax.grad(lambda x: jnp.vdot(gnn.aggregate(g, x, "max"), ct))(x)

    for s, d, q in ((src, dst, 0.99), (src[perm], dst[perm], 0.99), (src, dst, 0.5)):
        g = gnn.Graph.from_edges(s, d, 10, heavy_quantile=q)
        ww = w if s is src else w[perm]  # the same weight per edge, in its graph's order
        y, dx = f(g, x, ww)
        np.testing.assert_allclose(y, O.spmm(s, d, 10, x, ww, "sum", "both"), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(dx, O.extreme_grad(s, d, 10, x, ct, "max"), rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------------------------- bad input
_G = gnn.Graph.from_edges([0, 1], [1, 2], 3)
_X, _XH = np.ones((3, 2), np.float32), np.ones((3, 1, 2), np.float32)


def _DG():  # noqa: N802  (built when a case runs, not at import)
    return gnn.DynamicGraph.from_edge_index(np.array([[0, 1], [1, 2]]), num_nodes=3, max_edges=5)


BAD = {
    "int edge_weight": (lambda: gnn.spmm(_G, _X, edge_weight=jnp.ones(2, jnp.int32)), TypeError,
                        r"Expected floating-point edge_weight\. Got int32"),
    "bool edge_weight": (lambda: gnn.spmm(_G, _X, edge_weight=np.ones(2, bool)), TypeError,
                         r"Expected floating-point edge_weight\. Got bool"),
    "complex edge_weight": (lambda: gnn.spmm(_G, _X, edge_weight=jnp.ones(2, jnp.complex64)), TypeError,
                            r"Expected floating-point edge_weight\. Got complex64"),
    "2-d edge_weight": (lambda: gnn.spmm(_G, _X, edge_weight=jnp.ones((2, 1))), ValueError,
                        r"Expected edge_weight of shape \(2,\)\. Got \(2, 1\)"),
    "scalar edge_weight": (lambda: gnn.spmm(_G, _X, edge_weight=2.0), ValueError,
                           r"Expected edge_weight of shape \(2,\)\. Got \(\)"),
    "traced graph's weights per edge given": (lambda: gnn.spmm(_DG(), _X, edge_weight=jnp.ones(2)), ValueError,
                                              r"Expected edge_weight of shape \(5,\)\. Got \(2,\)"),
    "complex features": (lambda: gnn.aggregate(_G, jnp.ones((3, 2), jnp.complex64)), TypeError,
                         r"Expected floating-point features\. Got complex64"),
    "0-d features": (lambda: gnn.spmm(_G, jnp.float32(1.0)), ValueError,
                     r"Expected features with 1 to 7 dimensions\. Got shape \(\)"),
    "8-d features": (lambda: gnn.aggregate(_G, jnp.ones((3,) + (1,) * 7)), ValueError,
                     r"Expected features with 1 to 7 dimensions\. Got shape \(3, 1, 1, 1, 1, 1, 1, 1\)"),
    "int att": (lambda: gnn.gatv2(_G, _XH, _XH, jnp.ones((1, 2), jnp.int32)), TypeError,
                r"Expected floating-point att\. Got int32"),
    "int x_dst": (lambda: gnn.gatv2(_G, _XH, jnp.ones((3, 1, 2), jnp.int32), jnp.ones((1, 2))), TypeError,
                  r"Expected floating-point x_dst\. Got int32"),
    "x_dst of other heads": (lambda: gnn.gatv2(_G, _XH, jnp.ones((3, 2, 2)), jnp.ones((1, 2))), ValueError,
                             r"Expected x_dst of the same shape as x_src \(3, 1, 2\)\. Got \(3, 2, 2\)"),
    "x_dst of other rows": (lambda: gnn.gatv2(_G, _XH, jnp.ones((4, 1, 2)), jnp.ones((1, 2))), ValueError,
                            r"Expected x_dst with one row per node: leading dimension 3\. Got shape \(4, 1, 2\)"),
    "2-d x_src": (lambda: gnn.gatv2(_G, _X, _X, jnp.ones(2)), ValueError,
                  r"Expected x_src of shape \(num_nodes=3, heads, head_dim\)\. Got shape \(3, 2\)"),
    "1-d att": (lambda: gnn.gatv2(_G, _XH, _XH, jnp.ones(2)), ValueError,
                r"Expected att of shape \(heads, head_dim\) = \(1, 2\)\. Got \(2,\)"),
    "v of another head_dim": (lambda: gnn.graph_attention(_G, _XH, _XH, jnp.ones((3, 1, 3))), ValueError,
                              r"Expected q, k and v of one shape\. Got \(3, 1, 2\), \(3, 1, 2\) and \(3, 1, 3\)"),
    "k of other rows": (lambda: gnn.graph_attention(_DG(), _XH, jnp.ones((4, 1, 2)), _XH), ValueError,
                        r"Expected k with one row per node: leading dimension 3\. Got shape \(4, 1, 2\)"),
    "scale per head": (lambda: gnn.graph_attention(_G, _XH, _XH, _XH, jnp.ones(1)), TypeError,
                       r"scale to be a real scalar\. Got an array of shape \(1,\) and dtype float32"),
    "complex scale": (lambda: gnn.graph_attention(_G, _XH, _XH, _XH, 1j), TypeError,
                      r"Expected graph_attention's scale to be a real scalar\. Got complex\."),
    "complex64 scale": (lambda: gnn.graph_attention(_G, _XH, _XH, _XH, np.complex64(1)), TypeError,
                        r"scale to be a real scalar\. Got an array of shape \(\) and dtype complex64"),
    "bool slope": (lambda: gnn.gatv2(_G, _XH, _XH, jnp.ones((1, 2)), True), TypeError,
                   r"Expected gatv2's negative_slope to be a real scalar\. Got bool"),
    "string slope": (lambda: gnn.gatv2(_G, _XH, _XH, jnp.ones((1, 2)), "0.2"), TypeError,
                     r"Expected gatv2's negative_slope to be a real scalar\. Got str"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_names_expected_and_actual(case):
    f, exc, match = BAD[case]
    with pytest.raises(exc, match=match):
        f()


def test_one_dimensional_features_match_the_oracle():
    """Features ``(N,)`` (no feature axis; the ops accept 1 to 7 dimensions): a result of the same shape, as ``(N, 1)``
    would give, with gradients (not covered elsewhere: every other test passes ``(N, F)`` or more)."""
    g = _special_graph("complete_with_loops")
    x, ct = _rand((5,), 0), _rand((5,), 1)
    for reduce, norm in SPMM_MODES:
        y, back = jax.vjp(lambda x, r=reduce, m=norm: gnn.spmm(g, x, r, m), x)
        assert y.shape == (5,)
        np.testing.assert_allclose(y, O.spmm(g.src, g.dst, 5, x, None, reduce, norm)[:, 0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(back(ct)[0], _spmm_dense_grads(g.src, g.dst, 5, x, None, ct, reduce, norm)[0][:, 0],
                                   rtol=1e-5, atol=1e-6)  # fmt: skip
    for red in ("max", "min"):
        y, back = jax.vjp(lambda x, r=red: gnn.aggregate(g, x, r), x)
        assert y.shape == (5,)
        np.testing.assert_array_equal(y, O.extreme(g.src, g.dst, 5, x, red)[:, 0])
        np.testing.assert_allclose(back(ct)[0], O.extreme_grad(g.src, g.dst, 5, x, ct, red)[:, 0], rtol=1e-6)
