"""Sparse linear layers and block pruning."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import blocksparse as bs
from blocksparse.testing import strategies as bst


@given(
    st.sampled_from([(1, 1), (2, 4), (4, 4), (8, 2)]),
    st.integers(1, 5),
    st.integers(1, 5),
    st.sampled_from([0.0, 0.3, 0.5, 1.0]),
    st.sampled_from(["l1", "l2", "max"]),
    st.data(),
)
def test_magnitude_keeps_the_largest_blocks(bsz, gm, gk, density, norm, data):
    bh, bw = bsz
    w = data.draw(bst.dense_arrays((gm * bh, gk * bw)))
    if density > 0 and round(density * gm * gk) == 0:  # e.g. 0.3 of one block: an error, not an empty layer
        want = rf"keeps at least one of the {gm * gk} blocks.*Got density={density}, which keeps 0"
        with pytest.raises(ValueError, match=want):
            bs.prune.magnitude(w, bsz, density, norm=norm)
        return
    W = bs.prune.magnitude(w, bsz, density, norm=norm)
    scores = bs.prune.block_norms(w, bsz, norm)
    assert W.nnz_blocks == round(density * gm * gk)
    kept = W.pattern.mask()
    if kept.any() and (~kept).any():
        assert scores[kept].min() >= scores[~kept].max()
    # Kept blocks carry w's values exactly.
    dense = np.asarray(W.to_dense())
    mask = np.kron(kept, np.ones((bh, bw), bool))
    np.testing.assert_array_equal(dense[mask], w[mask])
    assert not dense[~mask].any()


def test_magnitude_ties_are_deterministic():
    w = np.ones((8, 8), np.float32)
    a = bs.prune.magnitude(w, 4, 0.5)
    assert a.pattern == bs.prune.magnitude(w, 4, 0.5).pattern
    np.testing.assert_array_equal(a.pattern.rows, [0, 0])


def test_magnitude_bad_input():
    with pytest.raises(ValueError, match=r"density in \[0, 1\]. Got -0.1"):
        bs.prune.magnitude(np.ones((4, 4), np.float32), 2, -0.1)
    with pytest.raises(ValueError, match="norm in"):
        bs.prune.magnitude(np.ones((4, 4), np.float32), 2, 0.5, norm="fro")
    with pytest.raises(TypeError, match="floating-point w"):
        bs.prune.magnitude(np.ones((4, 4), np.int32), 2, 0.5)


def test_sparse_linear_matches_dense_and_trains(getkey):
    layer = bs.nn.SparseLinear.init(getkey(), 64, 48, block_size=16, density=0.5)
    x = jax.random.normal(getkey(), (5, 7, 64))
    y = layer(x)
    assert y.shape == (5, 7, 48)
    np.testing.assert_allclose(y, x @ layer.weight.to_dense() + layer.bias, rtol=1e-5, atol=1e-5)

    target = jax.random.normal(getkey(), (5, 7, 48))
    loss = lambda layer_: jnp.mean((layer_(x) - target) ** 2)
    grads = jax.jit(jax.grad(loss))(layer)
    assert grads.weight.pattern == layer.weight.pattern and grads.bias.shape == (48,)
    dense_grad = jax.grad(lambda w: jnp.mean((x @ w + layer.bias - target) ** 2))(layer.weight.to_dense())
    mask = layer.weight.with_data(jnp.ones_like(layer.weight.data)).to_dense()
    np.testing.assert_allclose(grads.weight.to_dense(), dense_grad * mask, rtol=1e-4, atol=1e-6)
    step = jax.tree.map(lambda p, g: p - 0.1 * g, layer, grads)
    assert float(loss(step)) < float(loss(layer))


def test_sparse_linear_from_dense_no_bias():
    w = np.arange(64, dtype=np.float32).reshape(8, 8)
    layer = bs.nn.SparseLinear.from_dense(w, block_size=4, density=0.25)
    assert layer.bias is None and layer.weight.nnz_blocks == 1
    # The largest block of arange(64) is the bottom-right one.
    np.testing.assert_array_equal(layer.weight.pattern.rows, [1])
    np.testing.assert_array_equal(layer.weight.pattern.cols, [1])
    np.testing.assert_array_equal(layer.weight.data[0], w[4:, 4:])
    np.testing.assert_allclose(layer(jnp.ones((1, 8))), jnp.ones((1, 8)) @ layer.weight.to_dense())


def test_sparse_linear_checks_the_bias_shape_at_construction(getkey):
    W = bs.random(getkey(), (16, 8), 4, 0.5)
    for bad in ((1,), (16,), (8, 1), ()):
        with pytest.raises(ValueError, match=rf"bias of shape \(8,\).*Got {re.escape(str(bad))}"):
            bs.nn.SparseLinear(W, jnp.zeros(bad))
    with pytest.raises(ValueError, match=r"bias of shape \(8,\)"):
        bs.nn.SparseLinear.from_dense(np.ones((16, 8), np.float32), np.zeros(1), block_size=4, density=0.5)
    layer = bs.nn.SparseLinear(W, jnp.arange(8.0))
    np.testing.assert_allclose(layer(jnp.ones((2, 16))), jnp.ones((2, 16)) @ W.to_dense() + jnp.arange(8.0), rtol=1e-5)
    # A stack of layers (leading dimensions on every leaf, e.g. for lax.scan) still rebuilds.
    stacked = jax.tree.map(lambda a: jnp.stack([a, a]), layer)
    assert stacked.bias.shape == (2, 8)
    ys = jax.vmap(lambda lay, x: lay(x), in_axes=(0, None))(stacked, jnp.ones((2, 16)))
    np.testing.assert_allclose(ys, jnp.stack([layer(jnp.ones((2, 16)))] * 2), rtol=1e-6)


def test_magnitude_rejects_nan_blocks():
    w = np.ones((8, 8), np.float32)
    w[5, 2] = np.nan
    for norm in ("l1", "l2", "max"):
        with pytest.raises(ValueError, match=r"NaN in block \(1, 0\) \(rows 4:8, cols 0:4\)"):
            bs.prune.magnitude(w, 4, 0.5, norm=norm)
    w[5, 2] = np.inf  # infinite weights rank first, they are not dropped
    W = bs.prune.magnitude(w, 4, 0.25)
    np.testing.assert_array_equal(W.pattern.rows, [1])
    np.testing.assert_array_equal(W.pattern.cols, [0])


def test_pruning_inside_jit_says_so():
    w = jnp.ones((8, 8))
    with pytest.raises(TypeError, match=r"bs.prune.magnitude: expected w as concrete host data.*outside jit"):
        jax.jit(lambda w: bs.prune.magnitude(w, 4, 0.5))(w)
    with pytest.raises(TypeError, match=r"SparseLinear.from_dense: expected weight as concrete host data"):
        jax.jit(lambda w: bs.nn.SparseLinear.from_dense(w, block_size=4, density=0.5))(w)
    with pytest.raises(TypeError, match=r"SparseLinear.init: expected key as concrete host data"):
        jax.jit(lambda k: bs.nn.SparseLinear.init(k, 8, 8, block_size=4, density=0.5))(jax.random.key(0))
