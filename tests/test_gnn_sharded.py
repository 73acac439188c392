"""Graphs partitioned over the devices of a mesh (``blocksparse.sharding.graph``): SpMM and max / min
aggregation equal to one device (the ``DynamicGraph`` ops) and to the NumPy oracle, forward and gradients
(w.r.t. the features and the edge weights), on random and adversarial graphs, for every split and every way
of moving source features; the plan's choice; bad input. Four simulated CPU devices (tests/conftest.py)."""

import inspect

import gnn_oracle as O
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import sweep
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import blocksparse.gnn as gnn
from blocksparse import sharding as sharded
from blocksparse.gnn import plan_graph, shard_graph

DEVICES = jax.devices()[:4]
MESH = Mesh(np.array(DEVICES), ("d",))
F = 3
TOL = dict(rtol=2e-5, atol=2e-5)


def _data(n, e, seed=0, f=F):
    rng = np.random.default_rng(seed)
    return (
        jnp.asarray(rng.standard_normal((n, f)), jnp.float32),
        jnp.asarray(rng.uniform(0.5, 1.5, e), jnp.float32),
        jnp.asarray(rng.standard_normal((n, f)), jnp.float32),
    )


def _one_device(ei, n):
    """The one-device reference graph, built in a jitted function (eagerly: seconds of op-by-op compiles)."""
    return jax.jit(lambda ei: gnn.DynamicGraph.from_edge_index(ei, num_nodes=n))(np.asarray(ei))


def _check(ei, n, sg, seed=0, norm="both", reduce="max", impl="xla"):
    """spmm (weighted, ``norm``) and ``reduce`` aggregation with their VJPs: sharded == one device == oracle."""
    ei = np.asarray(ei, np.int64).reshape(2, -1)
    x, w, ct = _data(n, ei.shape[1], seed)

    def ops(g, spmm, aggregate):
        def f(x, w):
            return spmm(g, x, "sum", norm, w, implementation=impl), aggregate(g, x, reduce, implementation=impl)

        (y, z), back = jax.vjp(f, x, w)
        return y, z, back((ct, jnp.zeros_like(ct)))[0], back((jnp.zeros_like(ct), ct))[0], back((ct, ct))[1]

    y, z, dx_s, dx_a, dw = jax.jit(lambda sg: ops(sg, sharded.spmm, sharded.aggregate))(sg)
    g1 = _one_device(ei, n)
    ry, rz, rdx_s, rdx_a, rdw = jax.jit(lambda g: ops(g, gnn.spmm, gnn.aggregate))(g1)
    for a, b in ((y, ry), (z, rz), (dx_s, rdx_s), (dx_a, rdx_a), (dw, rdw)):
        np.testing.assert_allclose(a, b, **TOL)
    src, dst = ei
    np.testing.assert_allclose(y, O.spmm(src, dst, n, x, w, norm=norm), **TOL)
    np.testing.assert_allclose(z, O.extreme(src, dst, n, x, reduce), **TOL)
    np.testing.assert_allclose(dx_a, O.extreme_grad(src, dst, n, x, ct, reduce), **TOL)
    return y


def _random_edges(n, e, seed):
    rng = np.random.default_rng(seed)
    return np.stack([rng.integers(0, n, e), rng.integers(0, n, e)])


@sweep(
    "balance,sources",
    [("edges", "all_gather"), ("nodes", "exchange"), ("edges", "replicated")],
    quick=[("nodes", "exchange")],
)
def test_matches_one_device(balance, sources):
    n, e = 37, 160  # 37 nodes: not a multiple of the 4 devices (the last one holds fewer rows)
    ei = _random_edges(n, e, 1)
    ei[:, :20] = ei[:, 20:40]  # duplicate edges
    sg = shard_graph(ei, n, MESH, "d", balance=balance, sources=sources)
    assert (sg.plan.balance, sg.plan.sources) == (balance, sources)
    assert sum(sg.plan.edges_per_device) == e
    _check(ei, n, sg, norm="both", reduce="max")


def _adversarial(name):
    n = 32
    if name == "one_destination":  # every edge into node 5: one device holds them all, three run on padding
        src = np.arange(48) % n
        return np.stack([src, np.full(48, 5)]), n
    if name == "isolated_and_duplicates":  # nodes 0..19 touch no edge; three edges many times, a self-loop
        rng = np.random.default_rng(4)
        ei = np.stack([rng.integers(20, n, 30), rng.integers(20, n, 30)])
        return np.concatenate([ei, np.tile(np.array([[23, 27, 29], [27, 27, 29]]), (1, 6))], axis=1), n
    if name == "no_edges":
        return np.zeros((2, 0), np.int64), n
    raise ValueError(name)


@sweep("name", ["one_destination", "isolated_and_duplicates", "no_edges"])
def test_adversarial_graphs(name):
    ei, n = _adversarial(name)
    sg = shard_graph(ei, n, MESH, "d")
    assert len(sg.plan.cuts) == len(DEVICES) + 1
    assert sum(sg.plan.edges_per_device) == ei.shape[1]
    if name == "one_destination":
        assert sorted(sg.plan.edges_per_device) == [0] * (len(DEVICES) - 1) + [48]
    _check(ei, n, sg, norm="left", reduce="min")


@pytest.mark.slow
@settings(max_examples=3)
@given(
    n=st.integers(1, 30),
    e=st.integers(0, 90),
    seed=st.integers(0, 2**16),
    sources=st.sampled_from(["all_gather", "exchange", "replicated"]),
    reduce=st.sampled_from(["sum", "mean"]),
)
def test_spmm_property(n, e, seed, sources, reduce):
    ei = _random_edges(n, e, seed)
    sg = shard_graph(ei, n, MESH, "d", sources=sources)
    x, _, _ = _data(n, e, seed, f=2)
    y = jax.jit(lambda sg, x: sharded.spmm(sg, x, reduce))(sg, x)
    np.testing.assert_allclose(y, O.spmm(ei[0], ei[1], n, x, reduce=reduce), **TOL)


@pytest.mark.slow
def test_dense_gradients_and_layout():
    """Gradients against a dense adjacency; the output is sharded by rows like x; features (N, 2, 3)."""
    n, e = 40, 200
    ei = _random_edges(n, e, 7)
    sg = shard_graph(ei, n, MESH, "d", balance="edges")
    x = jax.random.normal(jax.random.key(0), (n, 2, 3))
    w = jax.random.uniform(jax.random.key(1), (e,))

    def dense(x, w):
        a = jnp.zeros((n, n)).at[ei[1], ei[0]].add(w)
        return jnp.einsum("ij,jhd->ihd", a, x, precision="highest")  # not TF32 on a GPU

    loss = lambda f: lambda x, w: jnp.sum(jnp.sin(f(x, w)))  # noqa: E731
    y = jax.jit(lambda x, w: sharded.spmm(sg, x, edge_weight=w))(x, w)
    np.testing.assert_allclose(y, dense(x, w), **TOL)
    assert y.shape == (n, 2, 3)
    got = jax.jit(jax.grad(loss(lambda x, w: sharded.spmm(sg, x, edge_weight=w)), (0, 1)))(x, w)
    want = jax.grad(loss(dense), (0, 1))(x, w)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, **TOL)
    x2 = x.reshape(n, 6)
    y2 = jax.jit(lambda x: sharded.aggregate(sg, x))(x2)
    assert y2.sharding.spec == P("d")  # 40 rows over the devices: row ranges of x's layout
    sg_rep = shard_graph(ei, n, MESH, "d", sources="replicated")
    assert sg_rep.feature_sharding.spec == P()
    y3 = jax.jit(lambda x: sharded.aggregate(sg_rep, x))(x2)
    assert y3.sharding.spec == P("d")  # x replicated, the output still by rows (no gather)
    np.testing.assert_allclose(y3, y2)
    # x sharded by rows beforehand works as well as x anywhere
    xs = jax.device_put(x2, sg.feature_sharding)
    assert sg.feature_sharding.spec == P("d")
    np.testing.assert_allclose(jax.jit(lambda x: sharded.aggregate(sg, x))(xs), y2)


def test_graph_input_and_repr():
    g = gnn.power_law(64, 300, seed=2)
    sg = shard_graph(g, None, MESH, "d")
    assert sg.num_nodes == 64 and sg.num_edges == 300
    assert "ShardedGraph(num_nodes=64" in repr(sg)
    x = jax.random.normal(jax.random.key(0), (64, 4))
    np.testing.assert_allclose(jax.jit(sharded.spmm)(sg, x), gnn.spmm(g, x), **TOL)
    xb = x.astype(jnp.bfloat16)  # bf16 features: bf16 out, float32 accumulation within each part
    yb = jax.jit(sharded.spmm)(sg, xb)
    assert yb.dtype == jnp.bfloat16
    np.testing.assert_allclose(yb.astype(jnp.float32), gnn.spmm(g, x), rtol=2e-2, atol=2e-2)
    # the leaves: a leading device axis, sharded over the mesh axis
    assert sg.local.src.shape[0] == len(DEVICES)
    assert sg.local.src.sharding.spec == P("d")


def test_plan_choices():
    n, parts = 4000, 4  # plan_graph needs no devices
    rows = n // parts
    rng = np.random.default_rng(0)
    # Uniform random sources: each device needs nearly every remote row, the all-gather moves no more.
    ei = _random_edges(n, 40 * n, 0)
    plan = plan_graph(ei, n, parts)
    assert plan.sources == "all_gather"
    assert plan.rows_per_device == rows
    ag = next(c for c in plan.candidates if c.sources == "all_gather" and c.balance == plan.balance)
    assert ag.source_capacity == rows and plan.bytes_for(16) == 16 * ag.bytes_received
    assert plan.bytes_for(1) >= (parts - 1) * rows * 4
    # Sources near their destinations (a banded graph): only a few rows per device are needed.
    dst = rng.integers(0, n, 8 * n)
    src = np.clip(dst + rng.integers(-8, 9, dst.size), 0, n - 1)
    plan = plan_graph(np.stack([src, dst]), n, parts)
    assert plan.sources == "exchange"
    assert plan.source_capacity <= 8 and plan.estimated_bytes <= (parts - 1) * 16 * 4
    # Most in-edges into the first few nodes: the edge-balanced cuts give the first device few nodes,
    # and the work they even out outweighs moving the output to x's layout.
    dst = np.where(rng.random(80 * n) < 0.9, rng.integers(0, 40, 80 * n), rng.integers(0, n, 80 * n))
    ei = np.stack([rng.integers(0, n, dst.size), dst])
    plan = plan_graph(ei, n, parts, balance="edges")
    assert plan.cuts[1] < rows and not plan.uniform and plan.output_capacity > 0
    assert max(plan.edges_per_device) < 0.3 * dst.size
    nodes = plan_graph(ei, n, parts, balance="nodes")
    assert nodes.uniform and nodes.output_capacity == 0 and max(nodes.edges_per_device) > 0.9 * dst.size
    assert plan.estimated_seconds < nodes.estimated_seconds
    assert plan_graph(ei, n, parts).balance == "edges"
    # x replicated: nothing moves for the sources
    plan = plan_graph(ei, n, parts, x_placement="replicated", balance="nodes")
    assert plan.sources == "replicated" and plan.estimated_bytes == 0


def test_bad_input():
    ei = np.array([[0, 1, 2], [1, 2, 3]])
    with pytest.raises(ValueError, match=r"node indices in \[0, 3\).*edge_index\[1, 2\] = 3"):
        shard_graph(ei, 3, MESH, "d")
    with pytest.raises(ValueError, match="num_nodes"):
        shard_graph(ei, None, MESH, "d")
    with pytest.raises(TypeError, match="DynamicGraph"):
        shard_graph(gnn.DynamicGraph.from_edge_index(ei, num_nodes=4), 4, MESH, "d")
    with pytest.raises(ValueError, match="mesh's axes"):
        shard_graph(ei, 4, MESH, "x")
    with pytest.raises(ValueError, match="balance"):
        shard_graph(ei, 4, MESH, "d", balance="rows")
    with pytest.raises(ValueError, match="sources"):
        shard_graph(ei, 4, MESH, "d", sources="gather")
    sg = shard_graph(ei, 4, MESH, "d", balance="nodes", sources="all_gather")
    with pytest.raises(ValueError, match=r"4 rows .* Got shape \(5, 2\)"):
        sharded.spmm(sg, jnp.zeros((5, 2)))
    with pytest.raises(ValueError, match=r"edge_weight of shape \(3,\)"):
        sharded.spmm(sg, jnp.zeros((4, 2)), edge_weight=jnp.ones(4))
    with pytest.raises(TypeError, match="floating-point"):
        sharded.aggregate(sg, jnp.zeros((4, 2), jnp.int32))
    with pytest.raises(ValueError, match="reduce"):
        sharded.aggregate(sg, jnp.zeros((4, 2)), "sum")
    with pytest.raises(ValueError, match="norm=None with reduce='mean'"):
        sharded.spmm(sg, jnp.zeros((4, 2)), "mean", "both")


def _hooked() -> bool:
    from blocksparse.ops.gnn.aggregate import api as agg_api
    from blocksparse.ops.gnn.spmm import api as spmm_api

    return all("_gnn_" in inspect.getsource(m) for m in (spmm_api, agg_api))


@pytest.mark.skipif(not _hooked(), reason="bs.gnn.spmm / aggregate do not dispatch a ShardedGraph yet (the hook)")
@pytest.mark.slow  # the sharded ops through bs.gnn end to end; the same ops: test_matches_one_device
def test_dispatch_from_bs_gnn():
    ei = _random_edges(20, 60, 5)
    sg = shard_graph(ei, 20, MESH, "d")
    x = jax.random.normal(jax.random.key(0), (20, 3))
    np.testing.assert_allclose(gnn.spmm(sg, x), sharded.spmm(sg, x))
    np.testing.assert_allclose(gnn.aggregate(sg, x, "min"), sharded.aggregate(sg, x, "min"))


def test_pallas_interpret():
    """The Pallas kernels (Pallas' interpreter) inside the shard_map: the GPU path, on the CPU."""
    n, e = 40, 300
    ei = _random_edges(n, e, 9)
    sg = shard_graph(ei, n, MESH, "d", balance="edges", sources="exchange")
    x = jax.random.normal(jax.random.key(0), (n, 8))
    g = _one_device(ei, n)
    with gnn.interpret():
        y = jax.jit(lambda sg, x: sharded.spmm(sg, x, implementation="pallas"))(sg, x)
        z = jax.jit(lambda sg, x: sharded.aggregate(sg, x, "max", implementation="pallas"))(sg, x)
    np.testing.assert_allclose(y, gnn.spmm(g, x, implementation="xla"), **TOL)
    np.testing.assert_allclose(z, gnn.aggregate(g, x, "max", implementation="xla"), **TOL)


@pytest.mark.gpu
def test_pallas_on_gpus():
    """The Pallas kernels on every local GPU, against the XLA path, on a power-law graph."""
    mesh = Mesh(np.array(jax.devices()), ("d",))
    g = gnn.power_law(4096, 65536, seed=1)
    for sources in ("all_gather", "exchange"):
        sg = shard_graph(g, None, mesh, "d", sources=sources, balance="edges")
        x = jax.random.normal(jax.random.key(0), (4096, 64))
        for op in (sharded.spmm, sharded.aggregate):
            got = jax.jit(lambda sg, x, op=op: op(sg, x, implementation="pallas"))(sg, x)
            want = jax.jit(lambda sg, x, op=op: op(sg, x, implementation="xla"))(sg, x)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
            gx, wx = (
                jax.jit(jax.grad(lambda x, op=op, sg=sg, impl=impl: jnp.sum(op(sg, x, implementation=impl) ** 2)))(x)
                for impl in ("pallas", "xla")
            )
            # float32 sums over a power-law hub in two orders: entries reach hundreds, so the absolute error is
            # bounded relative to the largest one
            np.testing.assert_allclose(gx, wx, rtol=1e-4, atol=1e-6 * float(np.abs(wx).max()) + 1e-4)


@pytest.mark.slow
@sweep("sources", [None, "all_gather", "exchange", "replicated"], quick=1)
def test_one_device_mesh(sources):
    """A mesh of one device (the docs' "however many devices exist, one included"): the one-device result
    and gradients, and no collective in the program (every source is the device's own)."""
    mesh = Mesh(np.array(DEVICES[:1]), ("d",))
    n, e = 20, 60
    ei = _random_edges(n, e, 11)
    sg = shard_graph(ei, n, mesh, "d", sources=sources)
    assert sg.plan.num_devices == 1 and sg.plan.edges_per_device == (e,) and sg.plan.uniform
    y = _check(ei, n, sg, norm="both", reduce="max")
    x = jax.random.normal(jax.random.key(0), (n, F))
    for op in (lambda sg, x: sharded.spmm(sg, x), lambda sg, x: sharded.aggregate(sg, x, "min")):
        text = jax.jit(op).lower(sg, x).as_text()
        assert not any(c in text for c in ("collective_permute", "all_to_all", "all_gather", "all_reduce"))
    # bs.gnn.spmm hands it on; eagerly (an eager shard_map runs op by op: seconds a call), against the jitted op
    np.testing.assert_allclose(gnn.spmm(sg, x), jax.jit(sharded.spmm)(sg, x))
    assert y.shape == (n, F)
