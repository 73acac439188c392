"""PyG-shaped layers (GCNConv, GATv2Conv, TransformerConv) against NumPy oracles written from PyG's formulas.

The oracles loop over edges in float64 (self loops, duplicate edges and isolated nodes included);
gradients are checked against pure-jnp dense implementations (count matrices, so duplicate edges
count); ``jit`` runs different graphs of one capacity with one trace; dropout is checked in
expectation; bad input raises naming the expected and actual values.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import examples, sweep
from hypothesis import given, settings
from hypothesis import strategies as st

import blocksparse as bs
from blocksparse.gnn.layers import GATv2Conv, GCNConv, TransformerConv

N, E, IN = 7, 14, 5  # fixed shapes: every example reuses one compilation; node N - 1 is isolated
TOL = dict(rtol=2e-4, atol=2e-5)
KINDS = ["edge_index", "dynamic"]  # how the layers get the graph (a static Graph: test_static_graph, one compile)


def _graph(seed, n=N, e=E, n_src=None, n_dst=None):
    """Random edges over nodes ``< n - 1`` (node ``n - 1`` isolated), with a self loop and a duplicate edge."""
    rng = np.random.default_rng(seed)
    n_src = n - 1 if n_src is None else n_src
    n_dst = n - 1 if n_dst is None else n_dst
    src = rng.integers(0, n_src, e)
    dst = rng.integers(0, n_dst, e)
    src[0] = dst[0] = min(n_src, n_dst) - 1  # a self loop
    src[1], dst[1] = src[2], dst[2]  # a duplicate edge
    return np.stack([src, dst]).astype(np.int32)


def _np(a):
    return None if a is None else np.asarray(a, np.float64)


def _lin(x, w, b=None):
    y = x @ _np(w).T
    return y if b is None else y + _np(b)


# ------------------------------------------------------------------------------------ NumPy oracles (PyG)
def gcn_oracle(conv, x, ei, edge_weight=None):
    x, (src, dst) = _np(x), ei.astype(np.int64)
    n = x.shape[0]
    w = np.ones(src.size) if edge_weight is None else _np(edge_weight)
    if conv.normalize:
        if conv.add_self_loops:  # add_remaining_self_loops
            loop_w = np.full(n, 2.0 if conv.improved else 1.0)
            for s, d, we in zip(src, dst, w, strict=True):
                if s == d:
                    loop_w[s] = we
            keep = src != dst
            src = np.concatenate([src[keep], np.arange(n)])
            dst = np.concatenate([dst[keep], np.arange(n)])
            w = np.concatenate([w[keep], loop_w])
        deg = np.zeros(n)
        np.add.at(deg, dst, w)
        with np.errstate(divide="ignore"):
            dinv = np.where(deg > 0, deg**-0.5, 0.0)
        w = dinv[src] * w * dinv[dst]
    h = _lin(x, conv.weight)
    out = np.zeros_like(h)
    for s, d, we in zip(src, dst, w, strict=True):
        out[d] += we * h[s]
    return out if conv.bias is None else out + _np(conv.bias)


def _softmax_messages(n_dst, dst, logits, values):
    """``out[i] = sum_e softmax(logits over i's in-edges)_e values[e]`` (E, H), (E, H, C) -> (n_dst, H, C)."""
    out = np.zeros((n_dst, *values.shape[1:]))
    for i in range(n_dst):
        es = np.flatnonzero(dst == i)
        if es.size:
            a = np.exp(logits[es] - logits[es].max(0))
            out[i] = np.einsum("kh,khc->hc", a / a.sum(0), values[es])
    return out


def _loops(src, dst, n_loop, edge_attr):
    """PyG's remove_self_loops + add_self_loops(fill_value='mean'), loops appended."""
    keep = src != dst
    src, dst = src[keep], dst[keep]
    if edge_attr is not None:
        edge_attr = edge_attr[keep]
        fill = np.zeros((n_loop, edge_attr.shape[1]))
        for i in range(n_loop):
            if (dst == i).any():
                fill[i] = edge_attr[dst == i].mean(0)
        edge_attr = np.concatenate([edge_attr, fill])
    loops = np.arange(n_loop)
    return np.concatenate([src, loops]), np.concatenate([dst, loops]), edge_attr


def _split(x):
    return (_np(x[0]), _np(x[1])) if isinstance(x, tuple) else (_np(x), _np(x))


def _edge_attr(edge_attr):
    ea = _np(edge_attr)
    return ea[:, None] if ea is not None and ea.ndim == 1 else ea


def gat_oracle(conv, x, ei, edge_attr=None):
    xs, xd = _split(x)
    src, dst = ei.astype(np.int64)
    h, c = conv.heads, conv.out_channels
    ea = _edge_attr(edge_attr) if conv.lin_edge_weight is not None else None
    if conv.add_self_loops:
        src, dst, ea = _loops(src, dst, min(len(xs), len(xd)), ea)
    xl = _lin(xs, conv.lin_l_weight, conv.lin_l_bias).reshape(-1, h, c)
    if conv.share_weights:
        xr = _lin(xd, conv.lin_l_weight, conv.lin_l_bias).reshape(-1, h, c)
    else:
        xr = _lin(xd, conv.lin_r_weight, conv.lin_r_bias).reshape(-1, h, c)
    z = xl[src] + xr[dst]
    if ea is not None:
        z = z + _lin(ea, conv.lin_edge_weight).reshape(-1, h, c)
    z = np.where(z > 0, z, conv.negative_slope * z)
    logits = np.einsum("ehc,hc->eh", z, _np(conv.att))
    out = _softmax_messages(len(xd), dst, logits, xl[src])
    out = out.reshape(len(xd), h * c) if conv.concat else out.mean(1)
    return out if conv.bias is None else out + _np(conv.bias)


def transformer_oracle(conv, x, ei, edge_attr=None):
    xs, xd = _split(x)
    src, dst = ei.astype(np.int64)
    h, c = conv.heads, conv.out_channels
    q = _lin(xd, conv.lin_query_weight, conv.lin_query_bias).reshape(-1, h, c)
    k = _lin(xs, conv.lin_key_weight, conv.lin_key_bias).reshape(-1, h, c)[src]
    v = _lin(xs, conv.lin_value_weight, conv.lin_value_bias).reshape(-1, h, c)[src]
    if conv.lin_edge_weight is not None and edge_attr is not None:
        e = _lin(_edge_attr(edge_attr), conv.lin_edge_weight).reshape(-1, h, c)
        k, v = k + e, v + e
    logits = np.einsum("ehc,ehc->eh", q[dst], k) / np.sqrt(c)
    out = _softmax_messages(len(xd), dst, logits, v)
    out = out.reshape(len(xd), h * c) if conv.concat else out.mean(1)
    if conv.lin_skip_weight is not None:
        xr = _lin(xd, conv.lin_skip_weight, conv.lin_skip_bias)
        if conv.lin_beta_weight is not None:
            b = 1.0 / (1.0 + np.exp(-_lin(np.concatenate([out, xr, out - xr], -1), conv.lin_beta_weight)))
            out = b * xr + (1 - b) * out
        else:
            out = out + xr
    return out


# ------------------------------------------------------------------------------------ forward vs oracle
def _x(seed, n=N, f=IN):
    return jnp.asarray(np.random.default_rng(seed + 1000).standard_normal((n, f)), jnp.float32)


def _as(kind, ei, n):
    if kind == "graph":
        return bs.gnn.Graph.from_edges(ei[0], ei[1], n)
    if kind == "dynamic":
        return bs.gnn.DynamicGraph.from_edge_index(ei, num_nodes=n, max_edges=ei.shape[1] + 3)
    return ei


def _pad_edges(a, kind, extra=3):
    """Per-edge arrays for a DynamicGraph of capacity E + 3: padded (and ignored)."""
    if a is None or kind != "dynamic":
        return a
    return jnp.concatenate([a, jnp.full((extra, *a.shape[1:]), 7.0, a.dtype)])


@settings(max_examples=examples(8))
@given(seed=st.integers(0, 10**6), improved=st.booleans(), mode=st.sampled_from(["loops", "plain", "raw"]),
       weighted=st.booleans(), kind=st.sampled_from(KINDS))  # fmt: skip
def test_gcn_matches_oracle(seed, improved, mode, weighted, kind):
    ei = _graph(seed)
    kw = {"loops": {}, "plain": {"add_self_loops": False}, "raw": {"normalize": False}}[mode]
    conv = GCNConv.init(jax.random.key(seed), IN, 6, improved=improved, **kw)
    conv = conv._replace(bias=conv.bias + 0.5)
    w = jnp.asarray(np.random.default_rng(seed).uniform(0.2, 2.0, E), jnp.float32) if weighted else None
    x = _x(seed)
    out = conv(x, _as(kind, ei, N), edge_weight=_pad_edges(w, kind))
    np.testing.assert_allclose(out, gcn_oracle(conv, x, ei, w), **TOL)
    assert np.isfinite(np.asarray(out)).all()
    if mode != "loops":  # the isolated node receives nothing: bias only
        np.testing.assert_allclose(out[N - 1], conv.bias, **TOL)


def test_gcn_negative_degree_is_nan_as_in_pyg():
    """A negative degree (negative edge weights) gives NaN at its node, as PyG's gcn_norm; a zero degree 0."""
    conv = GCNConv.init(jax.random.key(0), 2, 2)
    x, ei = jnp.ones((4, 2)), np.array([[0, 1], [2, 2]])
    out = conv(x, ei, edge_weight=jnp.array([-3.0, 1.0]))  # node 2: -3 + 1 + its loop = -1
    assert np.isnan(np.asarray(out[2])).all() and np.isfinite(np.asarray(out)[[0, 1, 3]]).all()
    plain = GCNConv.init(jax.random.key(0), 2, 2, add_self_loops=False)
    np.testing.assert_array_equal(plain(x, ei, edge_weight=jnp.array([-1.0, 1.0]))[2], plain.bias)  # degree 0


@settings(max_examples=examples(8))
@given(seed=st.integers(0, 10**6), heads=st.sampled_from([1, 3]), concat=st.booleans(), loops=st.booleans(),
       share=st.booleans(), edge_dim=st.sampled_from([None, 2]), kind=st.sampled_from(KINDS))  # fmt: skip
def test_gatv2_matches_oracle(seed, heads, concat, loops, share, edge_dim, kind):
    ei = _graph(seed)
    conv = GATv2Conv.init(jax.random.key(seed), IN, 4, heads=heads, concat=concat, add_self_loops=loops,
                          share_weights=share, edge_dim=edge_dim, negative_slope=0.1)  # fmt: skip
    conv = conv._replace(bias=conv.bias + 0.5)
    x = _x(seed)
    ea = None if edge_dim is None else jnp.asarray(np.random.default_rng(seed).standard_normal((E, 2)), jnp.float32)
    out = conv(x, _as(kind, ei, N), edge_attr=_pad_edges(ea, kind))
    np.testing.assert_allclose(out, gat_oracle(conv, x, ei, ea), **TOL)
    if not loops:
        np.testing.assert_allclose(out[N - 1], conv.bias, **TOL)


@settings(max_examples=examples(8))
@given(seed=st.integers(0, 10**6), heads=st.sampled_from([1, 2]), concat=st.booleans(), beta=st.booleans(),
       root=st.booleans(), edge_dim=st.sampled_from([None, 1]), kind=st.sampled_from(KINDS))  # fmt: skip
def test_transformer_matches_oracle(seed, heads, concat, beta, root, edge_dim, kind):
    ei = _graph(seed)
    conv = TransformerConv.init(jax.random.key(seed), IN, 4, heads=heads, concat=concat, beta=beta and root,
                                root_weight=root, edge_dim=edge_dim)  # fmt: skip
    x = _x(seed)
    ea = None if edge_dim is None else jnp.asarray(np.random.default_rng(seed).standard_normal(E), jnp.float32)
    out = conv(x, _as(kind, ei, N), edge_attr=_pad_edges(ea, kind))
    np.testing.assert_allclose(out, transformer_oracle(conv, x, ei, ea), **TOL)
    assert np.isfinite(np.asarray(out)).all()
    if not root:
        np.testing.assert_array_equal(out[N - 1], 0.0)


def test_static_graph_matches_oracle():
    """A prebuilt static Graph (GATv2's self loops make a second static Graph, cached)."""
    ei = _graph(21)
    g = bs.gnn.Graph.from_edges(ei[0], ei[1], N)
    x, key = _x(21), jax.random.key(21)
    w = jnp.asarray(np.random.default_rng(21).uniform(0.2, 2.0, E), jnp.float32)
    ea = jnp.asarray(np.random.default_rng(22).standard_normal((E, 2)), jnp.float32)
    gcn = GCNConv.init(key, IN, 6, improved=True)
    np.testing.assert_allclose(gcn(x, g, edge_weight=w), gcn_oracle(gcn, x, ei, w), **TOL)
    # no edge weights: a static graph behind the optimization barrier, eager and jitted, equal to the oracle
    for kw in ({}, {"improved": True}, {"add_self_loops": False}):
        conv = GCNConv.init(key, IN, 6, **kw)
        want = gcn_oracle(conv, x, ei, None)
        np.testing.assert_allclose(conv(x, g), want, **TOL)
        np.testing.assert_allclose(jax.jit(lambda x, g, conv=conv: conv(x, g))(x, g), want, **TOL)
        np.testing.assert_allclose(conv(x, bs.gnn.DynamicGraph.from_edge_index(ei, num_nodes=N)), want, **TOL)
    gat = GATv2Conv.init(key, IN, 4, heads=2, edge_dim=2)
    np.testing.assert_allclose(gat(x, g), gat_oracle(gat, x, ei), **TOL)
    np.testing.assert_allclose(gat(x, g, edge_attr=ea), gat_oracle(gat, x, ei, ea), **TOL)
    tr = TransformerConv.init(key, IN, 4, heads=2, beta=True)
    np.testing.assert_allclose(tr(x, g), transformer_oracle(tr, x, ei), **TOL)
    tr = TransformerConv.init(key, IN, 4, heads=2, edge_dim=2, beta=True)
    np.testing.assert_allclose(tr(x, g, edge_attr=ea), transformer_oracle(tr, x, ei, ea), **TOL)


@sweep("layer", ["gat", "transformer"], quick=2)
@sweep("sizes", [(4, 6), (6, 3)], quick=1)
def test_bipartite(layer, sizes):
    n_src, n_dst = sizes
    ei = _graph(3, n_src=n_src, n_dst=n_dst - 1)  # target n_dst - 1 has no in-edges
    key = jax.random.key(1)
    xs, xd = _x(1, n_src, 3), _x(2, n_dst, IN)
    if layer == "gat":
        conv = GATv2Conv.init(key, (3, IN), 4, heads=2, edge_dim=2)
        ea = jnp.asarray(np.random.default_rng(0).standard_normal((E, 2)), jnp.float32)
        oracle = gat_oracle(conv, (xs, xd), ei, ea)
    else:
        conv = TransformerConv.init(key, (3, IN), 4, heads=2, beta=True)
        ea, oracle = None, transformer_oracle(conv, (xs, xd), ei)
    out = conv((xs, xd), ei, edge_attr=ea)
    assert out.shape == (n_dst, 8)
    np.testing.assert_allclose(out, oracle, **TOL)
    g = bs.gnn.Graph.from_edges(ei[0], ei[1], max(sizes))  # a prebuilt graph over max(n_src, n_dst) nodes
    np.testing.assert_allclose(conv((xs, xd), g, edge_attr=ea), oracle, **TOL)


def test_empty_graph_gives_bias_only():
    ei = np.zeros((2, 0), np.int32)
    x = _x(0)
    gcn = GCNConv.init(jax.random.key(0), IN, 3, add_self_loops=False)
    gat = GATv2Conv.init(jax.random.key(0), IN, 3, heads=2, add_self_loops=False)
    tr = TransformerConv.init(jax.random.key(0), IN, 3, root_weight=False)
    np.testing.assert_array_equal(gcn(x, ei), jnp.broadcast_to(gcn.bias, (N, 3)))
    np.testing.assert_array_equal(gat(x, ei), jnp.broadcast_to(gat.bias, (N, 6)))
    np.testing.assert_array_equal(tr(x, ei), 0.0)


# ------------------------------------------------------------------------------------ gradients vs dense jnp
def _counts(ei, n_dst, n_src):
    c = np.zeros((n_dst, n_src))
    np.add.at(c, (ei[1], ei[0]), 1.0)
    return jnp.asarray(c, jnp.float32)


def _dense_softmax(logits, cnt):
    """``softmax`` over sources with multiplicities ``cnt (n_dst, n_src)``; rows without edges give 0."""
    m = jnp.max(jnp.where(cnt[..., None] > 0, logits, -jnp.inf), axis=1, keepdims=True)
    p = cnt[..., None] * jnp.exp(logits - jnp.where(jnp.isfinite(m), m, 0.0))
    s = p.sum(1, keepdims=True)
    return p / jnp.where(s > 0, s, 1.0)


def gcn_dense(conv, x, ei):
    n = x.shape[0]
    cnt = np.array(_counts(ei, n, n))
    np.fill_diagonal(cnt, 1.0)  # add_remaining_self_loops, unweighted
    dinv = 1.0 / np.sqrt(cnt.sum(1))
    a = jnp.asarray(dinv[:, None] * cnt * dinv[None, :], jnp.float32)
    return a @ (x @ conv.weight.T) + conv.bias


def gat_dense(conv, x, ei):
    n, h, c = x.shape[0], conv.heads, conv.out_channels
    cnt = np.array(_counts(ei, n, n))
    np.fill_diagonal(cnt, 1.0)  # one self loop per node
    xl = (x @ conv.lin_l_weight.T + conv.lin_l_bias).reshape(n, h, c)
    xr = (x @ conv.lin_r_weight.T + conv.lin_r_bias).reshape(n, h, c)
    logits = jnp.einsum("ijhc,hc->ijh", jax.nn.leaky_relu(xr[:, None] + xl[None], conv.negative_slope), conv.att)
    out = jnp.einsum("ijh,jhc->ihc", _dense_softmax(logits, jnp.asarray(cnt, jnp.float32)), xl)
    return (out.reshape(n, h * c) if conv.concat else out.mean(1)) + conv.bias


def transformer_dense(conv, x, ei):
    n, h, c = x.shape[0], conv.heads, conv.out_channels
    q = (x @ conv.lin_query_weight.T + conv.lin_query_bias).reshape(n, h, c)
    k = (x @ conv.lin_key_weight.T + conv.lin_key_bias).reshape(n, h, c)
    v = (x @ conv.lin_value_weight.T + conv.lin_value_bias).reshape(n, h, c)
    logits = jnp.einsum("ihc,jhc->ijh", q, k) / np.sqrt(c)
    out = jnp.einsum("ijh,jhc->ihc", _dense_softmax(logits, _counts(ei, n, n)), v).reshape(n, h * c)
    xr = x @ conv.lin_skip_weight.T + conv.lin_skip_bias
    b = jax.nn.sigmoid(jnp.concatenate([out, xr, out - xr], -1) @ conv.lin_beta_weight.T)
    return b * xr + (1 - b) * out


@sweep(("which", "kind"), [("gcn", "graph"), ("gat", "edge_index"), ("transformer", "dynamic")])
def test_gradients_match_dense(which, kind):
    ei = _graph(11)
    key = jax.random.key(2)
    conv, dense = {
        "gcn": (GCNConv.init(key, IN, 4), gcn_dense),
        "gat": (GATv2Conv.init(key, IN, 3, heads=2), gat_dense),
        "transformer": (TransformerConv.init(key, IN, 3, heads=2, beta=True), transformer_dense),
    }[which]
    x = _x(5)
    ct = jnp.asarray(np.random.default_rng(7).standard_normal((N, conv(x, ei).shape[1])), jnp.float32)
    g = _as(kind, ei, N)
    loss = lambda c, x, g: jnp.sum(c(x, g) * ct)
    loss_dense = lambda c, x: jnp.sum(dense(c, x, ei) * ct)
    np.testing.assert_allclose(loss(conv, x, g), loss_dense(conv, x), rtol=1e-5, atol=1e-5)
    got = jax.jit(jax.grad(loss, argnums=(0, 1)))(conv, x, g)
    want = jax.grad(loss_dense, argnums=(0, 1))(conv, x)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_edge_feature_gradients_match_dense():
    """The segment-op path (edge features): gradients w.r.t. every parameter, x and edge_attr."""
    rng = np.random.default_rng(3)
    pairs = rng.permutation(N * N)[:12]  # distinct edges, so a dense (N, N, F) edge tensor holds them
    ei = np.stack([pairs % N, pairs // N]).astype(np.int32)
    ea = jnp.asarray(rng.standard_normal((12, 2)), jnp.float32)
    conv = TransformerConv.init(jax.random.key(4), IN, 3, heads=2, edge_dim=2, root_weight=False)
    x = _x(9)

    def dense(c, x, ea):
        e_dense = jnp.zeros((N, N, 2)).at[ei[1], ei[0]].set(ea)  # (dst, src, F)
        q = (x @ c.lin_query_weight.T + c.lin_query_bias).reshape(N, 2, 3)
        k = (x @ c.lin_key_weight.T + c.lin_key_bias).reshape(N, 2, 3)
        v = (x @ c.lin_value_weight.T + c.lin_value_bias).reshape(N, 2, 3)
        e = (e_dense @ c.lin_edge_weight.T).reshape(N, N, 2, 3)
        logits = jnp.einsum("ihc,ijhc->ijh", q, k[None] + e) / np.sqrt(3)
        alpha = _dense_softmax(logits, _counts(ei, N, N))
        return jnp.einsum("ijh,ijhc->ihc", alpha, v[None] + e).reshape(N, 6)

    loss = lambda c, x, ea: jnp.sum(jnp.sin(c(x, ei, edge_attr=ea)))
    loss_dense = lambda c, x, ea: jnp.sum(jnp.sin(dense(c, x, ea)))
    got = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(conv, x, ea)
    want = jax.grad(loss_dense, argnums=(0, 1, 2))(conv, x, ea)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------------ jit, dropout
def test_jit_one_trace_for_graphs_of_one_capacity():
    traces = []
    gcn = GCNConv.init(jax.random.key(0), IN, 4)
    gat = GATv2Conv.init(jax.random.key(1), 4, 2, heads=2, dropout=0.5)

    @jax.jit
    def model(params, x, edge_index, num_edges, key):
        traces.append(1)
        gcn, gat = params
        h = jax.nn.relu(gcn(x, edge_index, num_edges=num_edges))
        return gat(h, edge_index, num_edges=num_edges), gat(h, edge_index, num_edges=num_edges, key=key)

    x = _x(0)
    for seed, count in ((0, E), (1, 9), (2, 0)):
        ei = _graph(seed)
        out, dropped = model((gcn, gat), x, ei, np.int32(count), jax.random.key(seed))
        h = np.maximum(gcn_oracle(gcn, x, ei[:, :count]), 0.0)
        np.testing.assert_allclose(out, gat_oracle(gat, h, ei[:, :count]), **TOL)
        assert np.isfinite(np.asarray(dropped)).all()
    assert len(traces) == 1


def test_dropout_deterministic_and_stochastic():
    ei = _graph(5)
    x = _x(5)
    for conv in (GATv2Conv.init(jax.random.key(0), IN, 3, heads=2, dropout=0.4),
                 TransformerConv.init(jax.random.key(0), IN, 3, heads=2, dropout=0.4, root_weight=False)):  # fmt: skip
        base = conv(x, ei)
        k1, k2 = jax.random.key(1), jax.random.key(2)
        np.testing.assert_array_equal(conv(x, ei, key=k1, deterministic=True), base)
        a, b = conv(x, ei, key=k1), conv(x, ei, key=k2)
        np.testing.assert_array_equal(a, conv(x, ei, key=k1, deterministic=False))  # same key, same mask
        assert not np.allclose(a, b) and not np.allclose(a, base)
        # In expectation dropout (scaled by 1 / (1 - p)) leaves the output unchanged.
        keys = jax.random.split(jax.random.key(3), 4000)
        mean = jax.jit(jax.vmap(lambda k, conv=conv: conv(x, ei, key=k)))(keys).mean(0)
        bias = 0.0 if getattr(conv, "bias", None) is None else conv.bias
        np.testing.assert_allclose(mean - bias, base - bias, atol=0.06 * float(jnp.abs(base - bias).max()) + 1e-3)
        with pytest.raises(ValueError, match="dropout=0.4 with deterministic=False needs a key"):
            conv(x, ei, deterministic=False)


def test_zero_edge_features_take_the_segment_path_to_the_same_result():
    ei = _graph(8)
    x = _x(8)
    conv = GATv2Conv.init(jax.random.key(0), IN, 3, heads=2, edge_dim=3)
    fused = conv(x, ei)  # no edge_attr: the fused op
    np.testing.assert_allclose(conv(x, ei, edge_attr=jnp.zeros((E, 3))), fused, **TOL)


def test_invalid_traced_graph_gives_nan():
    conv = GCNConv.init(jax.random.key(0), IN, 3)
    bad = jnp.asarray(np.array([[0, 1], [2, 99]], np.int32))
    out = jax.jit(lambda ei: conv(_x(0), ei))(bad)
    assert np.isnan(np.asarray(out)).all()
    gat = GATv2Conv.init(jax.random.key(0), IN, 3)
    assert np.isnan(np.asarray(jax.jit(lambda ei: gat(_x(0), ei))(bad))).all()


# ------------------------------------------------------------------------------------ bad input
def test_bad_input_messages():
    x, ei = _x(0), _graph(0)
    gcn = GCNConv.init(jax.random.key(0), IN, 3)
    gat = GATv2Conv.init(jax.random.key(0), IN, 3, edge_dim=2)
    with pytest.raises(ValueError, match=r"GCNConv: expected edge_index of shape \(2, num_edges\). Got shape \(14, 2"):
        gcn(x, ei.T)
    with pytest.raises(TypeError, match="GCNConv: expected edge_index of an integer dtype. Got float32"):
        gcn(x, ei.astype(np.float32))
    with pytest.raises(ValueError, match=r"GCNConv: expected x of shape \(num_nodes, in_channels=5\). Got \(7, 4\)"):
        gcn(x[:, :4], ei)
    with pytest.raises(ValueError, match=r"expected target node indices in \[0, 7\). Got edge_index\[1, 3\] = 9"):
        gcn(x, np.array([[0, 1, 2, 3], [1, 2, 3, 9]]))
    with pytest.raises(ValueError, match=r"expected source node indices in \[0, 3\). Got edge_index\[0, 0\] = 4"):
        GATv2Conv.init(jax.random.key(0), (2, IN), 3)((x[:3, :2], x), np.array([[4], [0]]))
    with pytest.raises(ValueError, match=r"expected a pair \(x_src, x_dst\) for in_channels=\(2, 5\)"):
        GATv2Conv.init(jax.random.key(0), (2, IN), 3)(x, ei)
    with pytest.raises(ValueError, match=r"expected edge_attr of shape \(14, 2\), one row per edge"):
        gat(x, ei, edge_attr=jnp.zeros((E, 3)))
    with pytest.raises(ValueError, match=r"expected a graph of num_nodes=7"):
        gcn(x, bs.gnn.Graph.from_edges([0], [1], 5))
    with pytest.raises(ValueError, match=r"expected edge_weight of shape \(14,\)"):
        gcn(x, ei, edge_weight=jnp.ones(3))
    with pytest.raises(ValueError, match=r"expected num_nodes=6 to match the features' rows. Got 7"):
        gcn(x, ei, num_nodes=6)
    with pytest.raises(ValueError, match="expected add_self_loops=False with normalize=False"):
        GCNConv.init(jax.random.key(0), IN, 3, normalize=False, add_self_loops=True)
    with pytest.raises(ValueError, match=r"TransformerConv: expected edge_attr exactly .* \(edge_dim=2\). Got None"):
        TransformerConv.init(jax.random.key(0), IN, 3, edge_dim=2)(x, ei)
    with pytest.raises(ValueError, match=r"GATv2Conv: expected no edge_attr for a layer without edge_dim"):
        GATv2Conv.init(jax.random.key(0), IN, 3)(x, ei, edge_attr=jnp.zeros((E, 2)))
    with pytest.raises(ValueError, match=r"expected dropout in \[0, 1\). Got 1.0"):
        GATv2Conv.init(jax.random.key(0), IN, 3, dropout=1.0)


# ------------------------------------------------------------------------------------ the training example
@pytest.mark.slow  # the training script end to end; the layers' quick tests are above
def test_train_example_learns(tmp_path):
    """benchmarks/train_gnn.py at a tiny size: every model and mode ends well above chance (0.25)."""
    import json

    import bench_scripts

    module = bench_scripts.load("train_gnn")
    out = tmp_path / "train.json"
    result = module.main(["--small", "--nodes", "600", "--batch", "200", "--epochs", "12", "--no-pyg",
                          "--json", str(out)])  # fmt: skip
    cells = json.loads(out.read_text())["results"]  # blocksparse bench's JSON: one cell per model and mode
    ran = [{k: v for k, v in c["metrics"].items() if k != "implementation"} for c in cells if not c["skipped"]]
    assert ran == result["rows"] and all(c["ok"] for c in cells)
    runs = {(r["model"], r["mode"]) for r in result["rows"]}
    assert runs == {(m, d) for m in ("gcn", "gat") for d in ("full", "batch")}
    for row in result["rows"]:
        assert row["best_acc"] > 0.6, row
        assert row["test_acc"][-1] > row["test_acc"][0] or row["test_acc"][0] > 0.6, row
        assert row["epochs_per_s"] > 0


# ------------------------------------------------------------------------------------ the Pallas kernels
def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def _pallas_vs_xla(cls, kw, x, graph, rtol):
    """Forward and every gradient of the layer on the Pallas kernels against the XLA reference."""
    a = cls.init(jax.random.key(0), x.shape[1], 8, implementation="pallas", **kw)
    b = cls.init(jax.random.key(0), x.shape[1], 8, implementation="xla", **kw)
    f = jax.jit(jax.value_and_grad(lambda c, x, g: jnp.sum(jnp.sin(c(x, g))), argnums=(0, 1)))
    on_gpu = jax.default_backend() == "gpu"
    with bs.gnn.interpret(not on_gpu), bs.dispatch_log() as log:
        got = f(a, x, graph)
    assert log and {impl for _, impl in log} == {"pallas"}, log
    want = jax.tree.leaves(f(b, x, graph))
    # A leaf whose gradient vanishes in exact arithmetic (TransformerConv's key bias: softmax is invariant to
    # a shift shared by a node's in-edges) holds rounding noise on both paths; it is held to the gradients'
    # overall scale instead of its own.
    scale = max(float(np.linalg.norm(np.asarray(v, np.float64))) for v in want[1:])
    for u, v in zip(jax.tree.leaves(got), want, strict=True):
        assert np.isfinite(np.asarray(u)).all()
        err = np.linalg.norm(np.asarray(u, np.float64) - np.asarray(v, np.float64))
        denom = max(float(np.linalg.norm(np.asarray(v, np.float64))), 1e-4 * scale, 1e-30)
        assert err / denom < rtol, (cls.__name__, err / denom, _rel(u, v))


def test_gatv2_on_the_pallas_kernels_interpreted():
    """The fused GATv2 kernels (forward and backward), interpreted on the CPU, through the layer."""
    _pallas_vs_xla(GATv2Conv, dict(heads=2), _x(4), _graph(4), 1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("cls", [GCNConv, GATv2Conv, TransformerConv])
@pytest.mark.parametrize("kind", ["edge_index", "graph"])
def test_layers_on_the_pallas_kernels_gpu(cls, kind):
    """A power-law graph with hubs (heavy nodes split into chunks) on the GPU kernels: Pallas against XLA."""
    g = bs.gnn.power_law(4096, 65536)
    ei = np.stack([g.src, g.dst]).astype(np.int32)
    x = jnp.asarray(np.random.default_rng(0).standard_normal((4096, 64)), jnp.float32)
    kw = {} if cls is GCNConv else dict(heads=4)
    _pallas_vs_xla(cls, kw, x, g if kind == "graph" else jnp.asarray(ei), 2e-3)


# ------------------------------------------------------------------------------------ PyG itself, where installed
def _load_into_pyg(conv, module):
    """Copy the layer's parameters into the PyG module of the same configuration (PyG's names, (out, in) weights)."""
    import torch

    params = dict(module.named_parameters())
    for name in conv._leaves:
        value = getattr(conv, name)
        if value is None:
            continue
        pyg = {"weight": "lin.weight", "bias": "bias", "att": "att"}.get(name)
        pyg = pyg or name.replace("_weight", ".weight").replace("_bias", ".bias")
        target = params[pyg]
        with torch.no_grad():
            target.copy_(torch.tensor(np.asarray(value)).reshape(target.shape))


@pytest.mark.parametrize("which", ["gcn", "gat", "gat_edges", "transformer"])
def test_same_numbers_as_pyg(which):
    torch = pytest.importorskip("torch")
    pyg_nn = pytest.importorskip("torch_geometric.nn")
    ei = _graph(31)
    x = _x(31)
    key = jax.random.key(31)
    ea = jnp.asarray(np.random.default_rng(31).standard_normal((E, 2)), jnp.float32)
    w = jnp.asarray(np.random.default_rng(32).uniform(0.2, 2.0, E), jnp.float32)
    t = lambda a: torch.tensor(np.asarray(a))
    if which == "gcn":
        conv, module = GCNConv.init(key, IN, 4, improved=True), pyg_nn.GCNConv(IN, 4, improved=True)
        args, kwargs = (t(x), t(ei).long(), t(w)), dict(edge_weight=w)
    elif which.startswith("gat"):
        edge_dim = 2 if which == "gat_edges" else None
        conv = GATv2Conv.init(key, IN, 3, heads=2, edge_dim=edge_dim)
        module = pyg_nn.GATv2Conv(IN, 3, heads=2, edge_dim=edge_dim)
        kwargs = dict(edge_attr=ea) if edge_dim else {}
        args = (t(x), t(ei).long(), *((t(ea),) if edge_dim else ()))
    else:
        conv = TransformerConv.init(key, IN, 3, heads=2, beta=True, edge_dim=2)
        module = pyg_nn.TransformerConv(IN, 3, heads=2, beta=True, edge_dim=2)
        args, kwargs = (t(x), t(ei).long(), t(ea)), dict(edge_attr=ea)
    _load_into_pyg(conv, module)
    module.eval()
    with torch.no_grad():
        want = module(*args).numpy()
    np.testing.assert_allclose(conv(x, ei, **kwargs), want, rtol=1e-4, atol=1e-5)
