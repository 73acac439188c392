"""Beyond one device: block-sparse products inside ``shard_map`` over a mesh (JAX's own sharding).

The CPU runs this with 4 host devices (see conftest.py). Static patterns are host data, so every
shard sees the same compiled program; only arrays are split. Last, the rates the sharding plans of
``blocksparse.sharding`` read (tests/test_shard_matmul.py and tests/test_gnn_sharded.py test the plans).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import blocksparse as bs

needs_4 = pytest.mark.skipif(len(jax.devices()) < 4, reason="needs 4 devices")


@needs_4
def test_columns_of_x_sharded(getkey):
    """``W @ x`` with W replicated and the columns of x split over devices: no communication."""
    mesh = Mesh(np.array(jax.devices()[:4]), ("d",))
    W = bs.random(getkey(), (64, 96), (16, 32), 0.5)
    x = jax.random.normal(getkey(), (96, 4 * 8))
    f = jax.jit(jax.shard_map(lambda W, x: W @ x, mesh=mesh, in_specs=(P(), P(None, "d")), out_specs=P(None, "d")))
    y = f(W, x)
    np.testing.assert_allclose(y, W.to_dense() @ x, rtol=1e-5, atol=1e-5)


@needs_4
@pytest.mark.parametrize("dynamic", [False, True])
def test_data_parallel_gradients_match_dense(getkey, dynamic):
    """Batch split over devices, weights replicated: gradients inside ``shard_map`` are exactly
    those of the same layer written with dense ``jnp`` (JAX sums a replicated input's cotangent
    over the devices; the custom VJPs must do the same)."""
    mesh = Mesh(np.array(jax.devices()[:4]), ("batch",))
    layer = bs.nn.SparseLinear.init(getkey(), 64, 32, block_size=16, density=0.5)
    W = bs.DynamicBlockSparseMatrix.from_static(layer.weight, capacity=6) if dynamic else layer.weight
    w_dense = layer.weight.to_dense()
    x = jax.random.normal(getkey(), (16, 64))
    t = jax.random.normal(getkey(), (16, 32))

    def sparse_grads(data, b, x, t):
        return jax.grad(lambda d, b: jnp.mean((bs.matmul(x, W.with_data(d)) + b - t) ** 2), (0, 1))(data, b)

    def dense_grads(w, b, x, t):
        return jax.grad(lambda w, b: jnp.mean((x @ w + b - t) ** 2), (0, 1))(w, b)

    def sharded(f):
        return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=(P(), P(), P("batch"), P("batch")), out_specs=P()))

    g_data, g_b = sharded(sparse_grads)(W.data, layer.bias, x, t)
    d_w, d_b = sharded(dense_grads)(w_dense, layer.bias, x, t)
    np.testing.assert_allclose(W.with_data(g_data).to_dense(), d_w * (w_dense != 0), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(g_b, d_b, rtol=1e-4, atol=1e-6)


@needs_4
def test_dynamic_pattern_sharded_batch(getkey):
    """A dynamic matrix (traced pattern) replicated, the batch of a dense @ sparse product split."""
    mesh = Mesh(np.array(jax.devices()[:4]), ("d",))
    rows = jnp.array([0, 1, 1, 3, 3])
    cols = jnp.array([2, 0, 0, 1, 3])
    D = bs.DynamicBlockSparseMatrix.from_blocks(rows, cols, jax.random.normal(getkey(), (5, 8, 8)), 4,
                                                shape=(32, 32), capacity=8)  # fmt: skip
    x = jax.random.normal(getkey(), (12, 32))
    f = jax.jit(jax.shard_map(lambda D, x: x @ D, mesh=mesh, in_specs=(P(), P("d")), out_specs=P("d")))
    np.testing.assert_allclose(f(D, x), x @ D.to_dense(), rtol=1e-5, atol=1e-5)


def _graph(seed=0, n=12, e=40):
    # No multi-edges, so that a dense mask is an exact oracle for attention.
    pairs = np.random.default_rng(seed).choice(n * n, size=e, replace=False)
    src, dst = pairs % n, pairs // n
    return bs.gnn.Graph.from_edges(src, dst, n), src, dst


@needs_4
def test_gnn_gradients_of_replicated_inputs_are_summed(getkey):
    """Feature-sharded x with replicated edge weights; replicated queries with sharded keys and
    values: every gradient equals that of the same computation written densely in ``jnp``."""
    mesh = Mesh(np.array(jax.devices()[:4]), ("f",))
    g, src, dst = _graph()
    n = g.num_nodes
    adj = lambda w: jnp.zeros((n, n)).at[dst, src].add(w)  # noqa: E731
    x = jax.random.normal(getkey(), (n, 8))
    w = jax.random.uniform(getkey(), (g.num_edges,))

    def spmm_grads(f):
        return lambda w, x: jax.grad(lambda w, x: jnp.sum(jnp.sin(f(w, x))), (0, 1))(w, x)

    specs = dict(mesh=mesh, in_specs=(P(), P(None, "f")), out_specs=(P(), P(None, "f")))
    ours = jax.jit(jax.shard_map(spmm_grads(lambda w, x: bs.gnn.spmm(g, x, edge_weight=w)), **specs))(w, x)
    dense = jax.jit(jax.shard_map(spmm_grads(lambda w, x: adj(w) @ x), **specs))(w, x)
    for a, b in zip(ours, dense, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)

    q = jax.random.normal(getkey(), (n, 1, 8))
    kv = jax.random.normal(getkey(), (2, 4 * n, 1, 8))
    mask = np.zeros((n, n), bool)
    mask[dst, src] = True

    def dense_attention(q, k, v):
        s = jnp.einsum("ihd,jhd->hij", q, k) / jnp.sqrt(8.0)
        s = jnp.where(mask[None], s, -jnp.inf)
        p = jnp.where(mask[None], jax.nn.softmax(s, axis=-1), 0.0)
        return jnp.nan_to_num(jnp.einsum("hij,jhd->ihd", p, v))

    def attn_grads(f):
        return lambda q, kv: jax.grad(lambda q, kv: jnp.sum(jnp.sin(f(q, kv[0], kv[1]))), (0, 1))(q, kv)

    specs = dict(mesh=mesh, in_specs=(P(), P(None, "f")), out_specs=(P(), P(None, "f")))
    ours = jax.jit(jax.shard_map(attn_grads(lambda q, k, v: bs.gnn.graph_attention(g, q, k, v)), **specs))(q, kv)
    dense = jax.jit(jax.shard_map(attn_grads(dense_attention), **specs))(q, kv)
    for a, b in zip(ours, dense, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@needs_4
@pytest.mark.parametrize("valid_on_every_device", [True, False])
def test_per_device_dynamic_matrices_with_a_replicated_operand(getkey, valid_on_every_device):
    # Each device holds its own dynamic matrix (varying), x is replicated: x's gradient is the sum
    # over devices (as JAX's own ops give), and NaN if any device's matrix is invalid.
    mesh = Mesh(np.array(jax.devices()[:4]), ("d",))
    Ws = [bs.random(k, (64, 64), 16, 0.5) for k in jax.random.split(getkey(), 4)]
    Ds = [bs.DynamicBlockSparseMatrix.from_static(W, capacity=16) for W in Ws]
    rows = jnp.stack([D.rows for D in Ds])
    if not valid_on_every_device:
        rows = rows.at[2, 0].set(99)  # device 2's first block row is outside the grid
    cols, data, nnz = (jnp.stack([getattr(D, f) for D in Ds]) for f in ("cols", "data", "nnz"))
    x = jax.random.normal(getkey(), (64, 8))

    def local(rows, cols, data, nnz, x):
        D = bs.DynamicBlockSparseMatrix(rows[0], cols[0], data[0], nnz[0], (64, 64))
        return jax.grad(lambda x: jnp.sum(jnp.sin(bs.matmul(D, x))))(x)

    specs = (P("d"), P("d"), P("d"), P("d"), P())
    g = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=P()))(rows, cols, data, nnz, x)
    if valid_on_every_device:
        want = sum(jax.grad(lambda x, W=W: jnp.sum(jnp.sin(W.to_dense() @ x)))(x) for W in Ws)
        np.testing.assert_allclose(g, want, rtol=1e-4, atol=1e-4)
    else:
        assert np.isnan(np.asarray(g)).all()


def test_tuned_rates_by_device_kind(getkey):
    """The plans read their rates from one table keyed by device kind (through the hardware seam); a kind
    not in the table gets the default entry, and every entry says where its numbers came from."""
    from blocksparse import hardware
    from blocksparse.sharding import tuned

    h200 = tuned.RATES["NVIDIA H200"]
    with hardware.fake(hardware.H200):
        assert tuned.rates() is h200
    assert tuned.rates("a device never measured") is tuned.RATES[tuned.DEFAULT_KIND]
    for entry in tuned.RATES.values():
        for rate in vars(entry).values():
            assert rate.value > 0 and ("bench --suite" in rate.source or "datasheet" in rate.source)
    # The same plan on the H200 as off it (the default is the H200's entry), so plans made on a CPU hold there.
    mesh = Mesh(np.array(jax.devices()[:1]), ("d",))
    W = bs.random(getkey(), (64, 64), 16, 0.5)
    with hardware.fake(hardware.H200):
        on_h200 = bs.shard(W, mesh, "d").plan
    assert bs.shard(W, mesh, "d").plan == on_h200
    edges = np.array([[0, 1, 2, 3], [1, 2, 3, 0]])
    with hardware.fake(hardware.H200):
        graph_on_h200 = bs.gnn.plan_graph(edges, 4, 2)
    assert bs.gnn.plan_graph(edges, 4, 2) == graph_on_h200
