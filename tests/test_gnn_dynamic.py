"""Traced graphs (``DynamicGraph``) and mini-batches: every op against the static ``Graph`` path and the
NumPy oracle, forward and gradients; independence from the edges' order; no recompilation across
graphs of the same capacities; batching and readout; bad input (host errors, NaN + checkify in jit).
The Pallas kernels run in interpret mode here (small graphs) and for real on a GPU (``gpu`` marks)."""

import gnn_oracle as O
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import examples
from hypothesis import given, settings
from hypothesis import strategies as st

import blocksparse as bs
import blocksparse.gnn as gnn
from blocksparse.ops.gnn import triton_common
from blocksparse.testing.graphs import edge_lists

ON_GPU = jax.default_backend() == "gpu"
N_CAP, E_CAP, CHUNK = 24, 384, 128  # one set of capacities: every hypothesis example reuses one compilation
H, D, F = 2, 3, 4


def _inputs(n, e_cap, seed=0):
    rng = np.random.default_rng(seed)
    f32 = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)
    return {
        "x": f32(n, F),
        "w": jnp.asarray(rng.uniform(0.5, 1.5, e_cap), jnp.float32),
        "xs": f32(n, H, D),
        "xd": f32(n, H, D),
        "v": f32(n, H, D),
        "att": f32(H, D),
        "ct": f32(n, F),
        "cth": f32(n, H, D),
    }


def _all_ops(g, a, impl="xla", names=None):
    """Every op's (or the ``names``') output and gradients, for one graph (static or traced)."""

    def vjp(f, args, ct):
        out, back = jax.vjp(f, *args)
        return out, back(ct)

    kw = dict(implementation=impl)
    ops = {
        "sum_w": lambda: vjp(lambda x, w: gnn.spmm(g, x, "sum", None, w, **kw), (a["x"], a["w"]), a["ct"]),
        "both": lambda: vjp(lambda x, w: gnn.spmm(g, x, "sum", "both", w, **kw), (a["x"], a["w"]), a["ct"]),
        "left": lambda: vjp(lambda x: gnn.spmm(g, x, "sum", "left", **kw), (a["x"],), a["ct"]),
        "mean": lambda: vjp(lambda x: gnn.spmm(g, x, "mean", **kw), (a["x"],), a["ct"]),
        "max": lambda: vjp(lambda x: gnn.aggregate(g, x, "max", **kw), (a["x"],), a["ct"]),
        "min": lambda: vjp(lambda x: gnn.aggregate(g, x, "min", **kw), (a["x"],), a["ct"]),
        "gatv2": lambda: vjp(lambda p, q, r: gnn.gatv2(g, p, q, r, **kw), (a["xs"], a["xd"], a["att"]), a["cth"]),
        "dot": lambda: vjp(lambda p, q, r: gnn.graph_attention(g, p, q, r, **kw), (a["xd"], a["xs"], a["v"]), a["cth"]),
    }
    return {k: f() for k, f in ops.items() if names is None or k in names}


@jax.jit
def _dynamic_ops(edge_index, num_edges, a):
    g = gnn.DynamicGraph.from_edge_index(edge_index, num_nodes=N_CAP, max_edges=E_CAP, num_edges=num_edges,
                                         chunk=CHUNK)  # fmt: skip
    return _all_ops(g, a)


def _padded(src, dst, fill=7):
    ei = np.full((2, E_CAP), fill, np.int32)  # padding holds junk ids: it must never count
    ei[0, : src.size], ei[1, : dst.size] = src, dst
    return ei


def _sorted_edges(src, dst):
    """The edges in CSR order of a DynamicGraph: by (dst, src). Ties in max / min go to the first of them."""
    o = np.lexsort((src, dst))
    return src[o], dst[o], o


def _close(a, b, what, rtol=1e-4, atol=1e-5):
    np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=rtol, atol=atol, err_msg=what)


# ------------------------------------------------------------------------ against the oracle and Graph
@jax.jit
def _dense_ops(count, wsum, a):
    # The dense oracle in float32 (on a GPU, XLA's default float32 dots are TF32: 1e-3 off).
    with jax.default_matmul_precision("highest"):
        return _dense_ops_f32(count, wsum, a)


def _dense_ops_f32(count, wsum, a):
    """Dense float32 references on the adjacency (``count[i, j]`` edges j -> i, ``wsum`` their weights)."""
    indeg, outdeg = count.sum(1).clip(1), count.sum(0).clip(1)

    def softmax_agg(e, vals):  # e (N, N, H) logits of j -> i, repeated edges counted
        e = jnp.where(count[..., None] > 0, e, -jnp.inf)
        m = jax.lax.stop_gradient(jnp.max(e, 1, keepdims=True))
        m = jnp.where(jnp.isfinite(m), m, 0.0)
        p = count[..., None] * jnp.exp(e - m)
        den = p.sum(1)
        return jnp.einsum("ijh,jhd->ihd", p, vals) / jnp.where(den > 0, den, 1.0)[..., None]

    def gat(xs, xd, att):
        z = xs[None] + xd[:, None]
        return softmax_agg(jnp.sum(jnp.where(z > 0, z, 0.2 * z) * att, -1), xs)

    def dot(q, k, v):
        return softmax_agg(jnp.einsum("ihd,jhd->ijh", q, k) / np.sqrt(D), v)

    def vjp(f, args, ct):
        out, back = jax.vjp(f, *args)
        return out, back(ct)

    norm = (indeg**-0.5)[:, None] * (outdeg**-0.5)[None, :]
    return {
        "sum": vjp(lambda x: wsum @ x, (a["x"],), a["ct"]),
        "both": vjp(lambda x: (wsum * norm) @ x, (a["x"],), a["ct"]),
        "left": vjp(lambda x: (count / outdeg[None, :]) @ x, (a["x"],), a["ct"]),
        "mean": vjp(lambda x: (count / indeg[:, None]) @ x, (a["x"],), a["ct"]),
        "gatv2": vjp(gat, (a["xs"], a["xd"], a["att"]), a["cth"]),
        "dot": vjp(dot, (a["xd"], a["xs"], a["v"]), a["cth"]),
    }


@given(edge_lists(max_nodes=N_CAP, max_edges=40, hub_in_degree=(129, 300)), st.booleans())
@settings(max_examples=examples(5), deadline=None)
def test_every_op_matches_dense_and_numpy_oracles(edges, with_ties):
    src, dst, n = edges  # isolated node, self-loop, multi-edge, a hub of 2-3 chunks; padded to capacity
    e = src.size
    a = _inputs(N_CAP, E_CAP, seed=e)
    if with_ties:  # few distinct values: max / min ties (to the smallest source id, the first in CSR order)
        a["x"] = jnp.asarray(np.random.default_rng(e).integers(-2, 3, (N_CAP, F)), jnp.float32)
    got = _dynamic_ops(jnp.asarray(_padded(src, dst)), jnp.int32(e), a)
    w = np.asarray(a["w"][:e], np.float64)
    count, wsum = np.zeros((N_CAP, N_CAP)), np.zeros((N_CAP, N_CAP))
    np.add.at(count, (dst, src), 1.0)
    np.add.at(wsum, (dst, src), w)
    dense = _dense_ops(jnp.asarray(count, jnp.float32), jnp.asarray(wsum, jnp.float32), a)
    for name, key in (("sum_w", "sum"), ("both", "both"), ("left", "left"), ("mean", "mean"),
                      ("gatv2", "gatv2"), ("dot", "dot")):  # fmt: skip
        (yo, go), (yd, gd) = got[name], dense[key]
        _close(yo, yd, name)
        # the attention gradients sum a hub's up to 300 float32 terms (weights recomputed from the lse) in
        # another order than the dense oracle: a cancelling sum differs by a few 1e-5 (seen: 1.24e-5 at 0.0228)
        atol = 5e-5 if name in ("gatv2", "dot") else 1e-5
        for i, (u, v) in enumerate(zip(go, gd, strict=False)):  # dx, or the three attention inputs (not dw)
            _close(u, v, f"{name} grad {i}", atol=atol)
    x, ct = np.asarray(a["x"], np.float64), np.asarray(a["ct"], np.float64)
    dw = np.sum(ct[dst] * x[src], -1)
    _close(got["sum_w"][1][1][:e], dw, "dw")
    assert (np.asarray(got["sum_w"][1][1][e:]) == 0).all()  # padding weights get no gradient
    _close(got["both"][0], O.spmm(src, dst, N_CAP, x, w, "sum", "both"), "oracle both")
    _close(got["gatv2"][0], O.gatv2(src, dst, N_CAP, a["xs"], a["xd"], a["att"]), "oracle gatv2")
    _close(got["dot"][0], O.graph_attention(src, dst, N_CAP, a["xd"], a["xs"], a["v"]), "oracle dot")
    ss, sd, _ = _sorted_edges(src, dst)
    for red in ("max", "min"):
        np.testing.assert_array_equal(got[red][0], O.extreme(src, dst, N_CAP, x, red), err_msg=red)
        _close(got[red][1][0], O.extreme_grad(ss, sd, N_CAP, x, ct, red), f"{red} grad")
    isolated = np.bincount(dst, minlength=N_CAP) == 0
    for name, (y, _) in got.items():
        assert np.isfinite(np.asarray(y)).all() and (np.asarray(y)[isolated] == 0).all(), name


def test_every_op_matches_static_graph():
    rng = np.random.default_rng(4)
    src = np.concatenate([rng.integers(0, 20, 50), rng.integers(0, 20, 260), [7, 7]]).astype(np.int32)
    dst = np.concatenate([rng.integers(0, 20, 50), np.full(260, 2), [7, 7]]).astype(np.int32)
    e = src.size
    a = _inputs(N_CAP, E_CAP, seed=0)
    got = _dynamic_ops(jnp.asarray(_padded(src, dst)), jnp.int32(e), a)
    # The static graph over the same edges in CSR order (max / min ties break alike).
    ss, sd, o = _sorted_edges(src, dst)
    g = gnn.Graph.from_edges(ss, sd, N_CAP, heavy_quantile=0.9)
    assert g.num_heavy == 1
    want = jax.jit(lambda a: _all_ops(g, a))(dict(a, w=a["w"][:e][o]))  # one program (eagerly: op by op)
    for name in want:
        (yo, go), (ys, gs) = got[name], want[name]
        _close(yo, ys, name)
        if name in ("sum_w", "both"):  # edge-weight gradients: in edge_index order
            _close(go[0], gs[0], name)
            _close(go[1][:e][o], gs[1], name + " dw")
        else:
            for i, (u, v) in enumerate(zip(go, gs, strict=True)):
                _close(u, v, f"{name} grad {i}")


def test_edge_order_does_not_change_results():
    rng = np.random.default_rng(3)
    src = np.concatenate([rng.integers(0, 20, 60), rng.integers(0, 20, 200), [5, 5, 5]])
    dst = np.concatenate([rng.integers(0, 20, 60), np.full(200, 4), [5, 6, 6]])
    perm = rng.permutation(src.size)
    a = _inputs(N_CAP, E_CAP, seed=1)
    a2 = dict(a, w=a["w"].at[: src.size].set(a["w"][: src.size][perm]))
    r1 = _dynamic_ops(jnp.asarray(_padded(src, dst)), jnp.int32(src.size), a)
    r2 = _dynamic_ops(jnp.asarray(_padded(src[perm], dst[perm], fill=-3)), jnp.int32(src.size), a2)
    for name in r1:
        (y1, g1), (y2, g2) = r1[name], r2[name]
        if name in ("sum_w", "both"):
            # repeated edges keep their given order among themselves: weighted sums may round differently
            _close(y1, y2, name, rtol=1e-6, atol=1e-6)
            _close(g1[0], g2[0], name, rtol=1e-6, atol=1e-6)
            np.testing.assert_array_equal(g1[1][: src.size][perm], g2[1][: src.size], err_msg=name)
        else:  # bitwise: the CSR does not depend on the order of the edges
            np.testing.assert_array_equal(y1, y2, err_msg=name)
            for u, v in zip(g1, g2, strict=True):
                np.testing.assert_array_equal(u, v, err_msg=name)


def test_given_order_within_nodes_breaks_ties_like_graph():
    rng = np.random.default_rng(6)
    src = np.concatenate([rng.integers(0, 20, 60), rng.integers(0, 20, 200)]).astype(np.int32)
    dst = np.concatenate([rng.integers(0, 20, 60), np.full(200, 3)]).astype(np.int32)
    x = jnp.asarray(rng.integers(-2, 3, (N_CAP, F)), jnp.float32)  # many ties
    ct = np.asarray(_inputs(N_CAP, 1)["ct"])

    @jax.jit
    def run(ei, x):
        g = gnn.DynamicGraph.from_edge_index(ei, num_nodes=N_CAP, num_edges=src.size, chunk=CHUNK, canonical=False)
        outs = {r: jax.vjp(lambda x, r=r: gnn.aggregate(g, x, r), x) for r in ("max", "min")}
        return {r: (y, back(jnp.asarray(ct))[0]) for r, (y, back) in outs.items()}, g.indices

    got, indices = run(jnp.asarray(_padded(src, dst)), x)
    np.testing.assert_array_equal(indices[: src.size], src[np.argsort(dst, kind="stable")])  # as Graph's CSR
    for r, (y, dx) in got.items():
        np.testing.assert_array_equal(y, O.extreme(src, dst, N_CAP, x, r))
        _close(dx, O.extreme_grad(src, dst, N_CAP, x, ct, r), r)  # the first in-edge in the given order


def test_structure_matches_static_graph():
    rng = np.random.default_rng(0)
    src = np.concatenate([rng.integers(0, 9, 30), np.zeros(300, np.int32)])
    dst = np.concatenate([rng.integers(0, 9, 30), rng.integers(0, 3, 300)])
    g = gnn.Graph.from_edges(src, dst, 10)
    dg = gnn.DynamicGraph.from_graph(g, max_edges=400, chunk=128)
    assert (dg.num_nodes, dg.max_edges, dg.chunk, int(dg.num_edges), bool(dg.valid)) == (10, 400, 128, 330, True)
    np.testing.assert_array_equal(dg.indptr, g.indptr)
    np.testing.assert_array_equal(dg.T.indptr, g.T.indptr)
    np.testing.assert_array_equal(dg.in_degree, g.in_degree)
    np.testing.assert_array_equal(dg.out_degree, g.out_degree)
    np.testing.assert_array_equal(np.asarray(dg.dst_sorted)[330:], 10)  # padding: the dropped segment
    # the source 0 has out-degree > 300: the transpose splits it into 128-edge chunks
    t = dg.T.schedule
    heavy = np.asarray(t.heavy_nodes)
    assert heavy[0] == 0 and (heavy[1:] >= 10).all()
    used = np.asarray(t.extra_segment) < t.num_extra
    deg0 = int(g.out_degree[0])
    assert used.sum() == -(-deg0 // 128) - 1
    spans = np.stack([np.asarray(t.extra_start)[used], np.asarray(t.extra_end)[used]])
    assert spans[0, 0] == 128 and spans[1, -1] == deg0 and (np.diff(spans, axis=0) <= 128).all()
    assert "DynamicGraph(num_nodes=10, max_edges=400, chunk=128)" == repr(dg)


_build = jax.jit(lambda ei, n: gnn.DynamicGraph.from_edge_index(ei, num_nodes=N_CAP, num_edges=n, chunk=CHUNK))


def _check_split(g, cap, e):
    """:func:`triton_common.split_units` of ``g`` (a CSR with ``e`` real edges in ``cap`` positions): heavy nodes' main
    units empty, every edge in exactly one unit and padding in none, each used extra unit's segment the slot of its
    node (unused ones empty and out of range), the segments ascending where the split says so."""
    split, s = triton_common.split_units(g), g.schedule
    if split.extra is None:
        assert s.num_extra == 0
        return
    ptr, heavy = np.asarray(g.indptr), list(np.asarray(s.heavy_nodes))
    n, nh = ptr.size - 1, len(heavy)
    (s0, e0, _), (s1, e1, n1) = jax.tree.map(np.asarray, (split.main, split.extra))
    seg = np.asarray(split.segments)
    np.testing.assert_array_equal(np.asarray(split.heavy), heavy)
    cover = np.zeros(cap, int)
    for i in range(n):
        assert s0[i] == ptr[i] and ptr[i] <= e0[i] <= ptr[i + 1]
        assert (e0[i] == s0[i]) == (i in heavy or ptr[i] == ptr[i + 1]), i
        cover[s0[i] : e0[i]] += 1
    for u in range(s1.size):
        if seg[u] >= nh:  # unused: empty, its segment dropped by the folds
            assert s1[u] == e1[u]
            continue
        node = n1[u]
        assert heavy[seg[u]] == node and ptr[node] <= s1[u] < e1[u] <= ptr[node + 1], u
        cover[s1[u] : e1[u]] += 1
    if split.is_sorted:
        assert (np.diff(seg) >= 0).all()
    np.testing.assert_array_equal(cover, np.arange(cap) < e)  # every edge exactly once, padding never


@given(edge_lists(max_nodes=N_CAP, max_edges=40, hub_in_degree=(100, 340)))
@settings(max_examples=10, deadline=None)
def test_schedule_and_its_split_cover_every_csr_range_once(edges):
    src, dst, _ = edges
    e = src.size
    g = _build(jnp.asarray(_padded(src, dst)), jnp.int32(e))
    assert bool(g.valid) and int(g.num_edges) == e
    for t, (a, b) in ((g, (src, dst)), (g.T, (dst, src))):
        o = np.lexsort((a, b))
        np.testing.assert_array_equal(np.asarray(t.indices)[:e], a[o])  # CSR sorted by (owner, other)
        np.testing.assert_array_equal(np.asarray(t.dst_sorted)[:e], b[o])
        np.testing.assert_array_equal(np.asarray(t.dst_sorted)[e:], N_CAP)
        np.testing.assert_array_equal(np.asarray(t.edge_perm)[:e], o)
        s = jax.tree.map(np.asarray, t.schedule)
        cover = np.zeros(E_CAP, int)
        ptr = s.indptr
        for i in range(N_CAP):
            assert ptr[i] <= s.main_end[i] <= ptr[i + 1] and s.main_end[i] - ptr[i] <= CHUNK
            cover[ptr[i] : s.main_end[i]] += 1
        used = s.extra_segment < s.num_extra
        assert s.num_extra == E_CAP // CHUNK and (s.extra_start[~used] == s.extra_end[~used]).all()
        for u in np.flatnonzero(used):
            node = s.extra_node[u]
            assert s.heavy_nodes[s.extra_segment[u]] == node and ptr[node] <= s.extra_start[u] < s.extra_end[u]
            assert s.extra_end[u] <= ptr[node + 1] and s.extra_end[u] - s.extra_start[u] <= CHUNK
            cover[s.extra_start[u] : s.extra_end[u]] += 1
        np.testing.assert_array_equal(cover, np.arange(E_CAP) < e)  # every edge exactly once, padding never
        deg = np.diff(ptr)
        heavy = np.flatnonzero(deg > CHUNK)
        np.testing.assert_array_equal(s.heavy_nodes[: heavy.size], heavy)
        np.testing.assert_array_equal(s.heavy_nodes[heavy.size :], N_CAP + np.arange(heavy.size, s.num_extra))
        _check_split(t, E_CAP, e)  # the units with heavy nodes' first chunks moved to the extra units
    static = gnn.Graph.from_edges(src, dst, N_CAP, heavy_quantile=0.5)  # the same edges as a static graph
    for t in (static, static.T):
        _check_split(t, t.edge_capacity, e)


def test_no_recompile_across_graphs_of_one_capacity():
    traces = []

    @jax.jit
    def step(edge_index, num_edges, x):
        traces.append(1)
        g = gnn.DynamicGraph.from_edge_index(edge_index, num_nodes=16, max_edges=64, num_edges=num_edges)
        loss = lambda x: jnp.sum(gnn.spmm(g, x, "sum", "both") ** 2) + jnp.sum(gnn.aggregate(g, x, "max"))
        return jax.value_and_grad(loss)(x)

    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((16, 3)), jnp.float32)
    for e in (0, 5, 64, 30):
        ei = rng.integers(0, 16, (2, 64)).astype(np.int32)
        val, dx = step(ei, np.int32(e), x)
    g = gnn.Graph.from_edges(ei[0, :e], ei[1, :e], 16)
    loss = lambda x: jnp.sum(gnn.spmm(g, x, "sum", "both") ** 2) + jnp.sum(gnn.aggregate(g, x, "max"))
    np.testing.assert_allclose(dx, jax.grad(loss)(x), rtol=1e-5)
    assert len(traces) == 1


def test_empty_and_zero_capacity_graphs():
    empty = _dynamic_ops(jnp.asarray(_padded(np.zeros(0), np.zeros(0))), jnp.int32(0), _inputs(N_CAP, E_CAP))
    g = gnn.DynamicGraph.from_edge_index(np.zeros((2, 0), np.int32), num_nodes=5)  # no edge capacity at all
    for outs in (empty, _all_ops(g, _inputs(5, 0))):
        for name, (y, grads) in outs.items():
            assert (np.asarray(y) == 0).all(), name
            for d in grads:
                assert (np.asarray(d) == 0).all(), name


# ------------------------------------------------------------------------------- Pallas (interpret)
def _pallas_vs_xla(g, a, names=None, rtol=1e-4, atol=1e-4):
    """The Pallas kernels (interpreted without a GPU) against the XLA reference, on a traced graph."""
    ref = jax.jit(lambda g, a: _all_ops(g, a, "xla", names))(g, a)
    with gnn.interpret(not ON_GPU), bs.dispatch_log() as log:
        got = jax.jit(lambda g, a: _all_ops(g, a, "pallas", names))(g, a)
    assert {impl for _, impl in log} == {"pallas"}, log
    for name in ref:
        for u, v in zip(jax.tree.leaves(got[name]), jax.tree.leaves(ref[name]), strict=True):
            assert np.isfinite(np.asarray(u)).all(), name
            _close(u, v, name, rtol, atol)


def test_interpret_pallas_traced_graph_with_heavy_chunks_and_padding():
    # a hub of 280 in-edges (3 chunks of 128) and a source of out-degree 150 (the transpose's chunks)
    rng = np.random.default_rng(5)
    src = np.concatenate([rng.integers(0, 11, 280), np.full(150, 2), rng.integers(0, 11, 10)])
    dst = np.concatenate([np.full(280, 6), rng.integers(0, 11, 150), rng.integers(0, 11, 10)])
    ei = np.full((2, 512), 99, np.int32)
    ei[:, :440] = np.stack([src, dst])
    # built in jit (eagerly its sorts compile op by op; the eager build: the tests above)
    g = jax.jit(lambda ei: gnn.DynamicGraph.from_edge_index(ei, num_nodes=12, num_edges=440, chunk=128))(ei)
    _pallas_vs_xla(g, _inputs(12, 512, seed=2), ["sum_w", "min", "gatv2"])


# ------------------------------------------------------------------------------------ batching
def _graphs(seed=0, sizes=(5, 1, 7)):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, n, (2, int(rng.integers(0, 3 * n)))).astype(np.int32) for n in sizes], list(sizes)


def test_host_batch_equals_separate_graphs_and_readout():
    eis, sizes = _graphs()
    g, ids = gnn.batch(eis, sizes, num_nodes=16, max_edges=40)
    assert (g.num_nodes, g.max_edges) == (16, 40)
    np.testing.assert_array_equal(ids, [0] * 5 + [1] + [2] * 7 + [3] * 3)
    x = jnp.asarray(np.random.default_rng(1).standard_normal((16, 3)), jnp.float32)
    y = gnn.spmm(g, x, "mean")
    off = np.cumsum([0] + sizes)
    for i, ei in enumerate(eis):
        gi = gnn.Graph.from_edges(ei[0], ei[1], sizes[i])
        _close(y[off[i] : off[i + 1]], gnn.spmm(gi, x[off[i] : off[i + 1]], "mean"), f"graph {i}")
    assert (np.asarray(y[13:]) == 0).all()  # padding nodes
    xn = np.asarray(x)
    for red, f in (("sum", np.sum), ("mean", np.mean), ("max", np.max)):
        r = gnn.readout(x, ids, 3, red)
        _close(r, np.stack([f(xn[off[i] : off[i + 1]], 0) for i in range(3)]), red)
    assert (np.asarray(gnn.readout(x, jnp.where(ids == 1, 0, ids), 3, "max"))[1] == 0).all()  # no nodes: 0
    with pytest.raises(ValueError, match=r"Expected node indices of graph 1 in \[0, 1\)"):
        gnn.batch([eis[0], np.array([[0], [1]])], [5, 1])
    with pytest.raises(ValueError, match="Expected at most num_nodes=10 nodes in all. Got 13"):
        gnn.batch(eis, sizes, num_nodes=10)


def test_traced_batch_matches_host_batch_without_recompiling():
    traces = []

    @jax.jit
    def step(stacked, nodes, counts, x):
        traces.append(1)
        g, ids = gnn.batch(stacked, nodes, counts, num_nodes=16, max_edges=40)
        return gnn.readout(gnn.spmm(g, x, "sum", "both"), ids, 3), g.in_degree

    x = jnp.asarray(np.random.default_rng(1).standard_normal((16, 3)), jnp.float32)
    for seed in (0, 1, 2):
        eis, sizes = _graphs(seed)
        e = max(a.shape[1] for a in eis)
        stacked = np.stack([np.pad(a, ((0, 0), (0, e - a.shape[1])), constant_values=-5) for a in eis])
        stacked = np.pad(stacked, ((0, 0), (0, 0), (0, 21 - e)))  # one edge capacity per graph
        r, deg = step(stacked, np.array(sizes), np.array([a.shape[1] for a in eis]), x)
        g, ids = gnn.batch(eis, sizes, num_nodes=16, max_edges=40)
        _close(r, gnn.readout(gnn.spmm(g, x, "sum", "both"), ids, 3), f"seed {seed}")
        np.testing.assert_array_equal(deg, g.in_degree)
    assert len(traces) == 1
    # more nodes than the capacity: NaN (the graphs whose nodes fit in part)
    r, _ = step(stacked, np.array([9, 9, 9]), np.zeros(3, np.int32), x)
    assert np.isnan(np.asarray(r)[:2]).all()


# ----------------------------------------------------------------------------------- bad input
def test_host_errors_name_expected_and_actual():
    ok = np.array([[0, 1], [1, 2]])
    mk = gnn.DynamicGraph.from_edge_index
    with pytest.raises(ValueError, match=r"Expected edge_index of shape \(2, num_edges\). Got shape \(3, 2\)"):
        mk(np.zeros((3, 2), np.int32), num_nodes=3)
    with pytest.raises(ValueError, match=r"shape \(2, num_edges\). Got shape \(4,\)"):
        mk(np.zeros(4, np.int32), num_nodes=3)
    with pytest.raises(TypeError, match="Expected edge_index of an integer dtype. Got float32"):
        mk(np.zeros((2, 2), np.float32), num_nodes=3)
    with pytest.raises(ValueError, match=r"Expected node indices in \[0, 3\). Got edge_index\[1, 1\] = 3"):
        mk(np.array([[0, 1], [1, 3]]), num_nodes=3)
    with pytest.raises(ValueError, match=r"Got edge_index\[0, 0\] = -1"):
        mk(np.array([[-1, 1], [1, 2]]), num_nodes=3)
    with pytest.raises(ValueError, match=r"Expected at most max_edges=1 edges. Got edge_index with 2"):
        mk(ok, num_nodes=3, max_edges=1)
    with pytest.raises(ValueError, match=r"Expected num_edges in \[0, 2\].*Got 3"):
        mk(ok, num_nodes=3, num_edges=3)
    with pytest.raises(ValueError, match="positive multiple of 128. Got 100"):
        mk(ok, num_nodes=3, chunk=100)
    with pytest.raises(TypeError, match="Expected num_nodes as a non-negative int"):
        mk(ok, num_nodes=3.0)
    g = mk(ok, num_nodes=3, max_edges=4)
    mk(np.array([[0, 1], [1, 9]]), num_nodes=3, num_edges=1)  # an id past num_edges is padding: fine
    with pytest.raises(ValueError, match=r"Expected edge_weight of shape \(4,\). Got \(2,\)"):
        gnn.spmm(g, jnp.ones((3, 2)), edge_weight=jnp.ones(2))
    with pytest.raises(ValueError, match="leading dimension 3. Got shape"):
        gnn.aggregate(g, jnp.ones((4, 2)))


def _bad_run(ei, n):
    g = gnn.DynamicGraph.from_edge_index(ei, num_nodes=4, num_edges=n)
    return _all_ops(g, _inputs(4, 2))


_bad = jax.jit(_bad_run)
_bad_checked = jax.jit(bs.checkify(_bad_run))


@pytest.mark.parametrize("edges, count", [([[0, 5], [1, 1]], 2), ([[0, 1], [-1, 2]], 2), ([[0, 1], [1, 2]], 3)])
def test_traced_bad_input_is_nan_and_checkify_names_the_ranges(edges, count):
    out = _bad(jnp.asarray(edges, jnp.int32), jnp.int32(count))
    for name, (y, grads) in out.items():
        assert np.isnan(np.asarray(y)).all(), name
        for d in grads:
            assert np.isnan(np.asarray(d)).all(), name
    err, _ = _bad_checked(jnp.asarray(edges, jnp.int32), jnp.int32(count))
    given = r"expected num_edges in \[0, the number of edges given\] \(at most max_edges=2\) "
    with pytest.raises(Exception, match=given + r"and the node ids .* in \[0, 4\)"):
        err.throw()
    ok, _ = _bad_checked(jnp.asarray([[0, 1], [1, 2]], jnp.int32), jnp.int32(2))
    ok.throw()  # a valid graph reports nothing


# ------------------------------------------------------------------------------------- real GPU
@pytest.mark.gpu
def test_gpu_pallas_traced_graph_matches_reference():
    g0 = gnn.power_law(3000, 60000, seed=7)
    g = gnn.DynamicGraph.from_graph(g0, max_edges=65536, chunk=256)
    assert int(jnp.sum(g.schedule.extra_segment < g.schedule.num_extra)) > 0
    _pallas_vs_xla(g, _inputs(3000, 65536), rtol=2e-3, atol=2e-3)


@pytest.mark.gpu
def test_gpu_traced_graph_default_is_pallas_and_does_not_recompile():
    traces = []

    @jax.jit
    def f(ei, x):
        traces.append(1)
        g = gnn.DynamicGraph.from_edge_index(ei, num_nodes=1000, max_edges=20000)
        return gnn.spmm(g, x), gnn.gatv2(g, x.reshape(1000, 2, 16), x.reshape(1000, 2, 16), jnp.ones((2, 16)))

    x = jnp.ones((1000, 32))
    with bs.dispatch_log() as log:
        for seed in range(3):
            ei = np.random.default_rng(seed).integers(0, 1000, (2, 20000)).astype(np.int32)
            f(ei, x)
    assert log == [("spmm", "pallas"), ("gatv2", "pallas")] and len(traces) == 1


@pytest.mark.skipif(ON_GPU, reason="the GPU runs the kernels for real")
def test_traced_graph_kernels_lower_to_triton():
    from test_gnn_pallas import _lower_for_cuda

    def everything(ei, x, xh):
        g = gnn.DynamicGraph.from_edge_index(ei, num_nodes=16, chunk=128)
        outs = [
            jax.vjp(lambda x: gnn.spmm(g, x, edge_weight=jnp.ones(600), implementation="pallas"), x)[1](x),
            jax.vjp(lambda x: gnn.aggregate(g, x, "max", implementation="pallas"), x)[1](x),
        ]
        fa = lambda a: gnn.gatv2(g, a, a, jnp.ones((4, 6)), implementation="pallas")
        fb = lambda a: gnn.graph_attention(g, a, a, a, implementation="pallas")
        return outs + [jax.vjp(fa, xh)[1](xh), jax.vjp(fb, xh)[1](xh)]

    txt = _lower_for_cuda(everything, jnp.zeros((2, 600), jnp.int32), jnp.ones((16, 24)), jnp.ones((16, 4, 6)))
    assert txt.count("__gpu$xla.gpu.triton") >= 10
