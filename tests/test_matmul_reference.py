"""Property tests of the pure-JAX products against a float64 NumPy oracle."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import examples
from hypothesis import given, settings
from hypothesis import strategies as st

import blocksparse as bs
from blocksparse.testing import strategies as bst
from blocksparse.testing.oracles import assert_close, to_dense64

XLA = "xla"


def _np(x):
    return np.asarray(jnp.asarray(x, jnp.float32), np.float64)


@given(bst.block_sparse_matrices(dtype=bst.dtypes()), st.integers(0, 5), st.data())
def test_sparse_dense_matches_oracle(W, n, data):
    x = data.draw(bst.dense_arrays((W.shape[1], n), W.dtype))
    y = bs.matmul(W, x, implementation=XLA)
    assert y.dtype == W.dtype and y.shape == (W.shape[0], n)
    w64 = to_dense64(W)
    assert_close(y, w64 @ _np(x), np.abs(w64) @ np.abs(_np(x)), W.dtype)


@given(bst.block_sparse_matrices(dtype=bst.dtypes()), st.sampled_from([(), (0,), (3,), (2, 2)]), st.data())
def test_dense_sparse_matches_oracle(W, batch, data):
    x = data.draw(bst.dense_arrays((*batch, W.shape[0]), W.dtype))
    y = bs.matmul(x, W, implementation=XLA)
    assert y.shape == (*batch, W.shape[1]) and y.dtype == W.dtype
    w64 = to_dense64(W)
    assert_close(y, _np(x) @ w64, np.abs(_np(x)) @ np.abs(w64), W.dtype)


@given(bst.block_sparse_matrices(), st.data())
def test_sparse_dense_batched_and_vector(W, data):
    k = W.shape[1]
    xb = data.draw(bst.dense_arrays((2, 3, k, 4)))
    w64 = to_dense64(W)
    assert_close(W @ xb, w64 @ _np(xb), np.abs(w64) @ np.abs(_np(xb)), jnp.float32)
    v = data.draw(bst.dense_arrays((k,)))
    assert_close(W @ v, w64 @ _np(v), np.abs(w64) @ np.abs(_np(v)), jnp.float32)


@given(bst.block_sparse_matrices(dtype=bst.dtypes()), st.integers(1, 6), st.data())
def test_sdd_matches_oracle(like, n, data):
    m, k = like.shape
    a = data.draw(bst.dense_arrays((m, n), like.dtype))
    b = data.draw(bst.dense_arrays((n, k), like.dtype))
    out = bs.sdd(a, b, like, implementation=XLA)
    assert isinstance(out, bs.BlockSparseMatrix) and out.pattern == like.pattern and out.dtype == like.dtype
    mask = to_dense64(like.with_data(jnp.ones_like(like.data))) != 0
    exact = np.where(mask, _np(a) @ _np(b), 0.0)
    assert_close(out.to_dense(), exact, np.abs(_np(a)) @ np.abs(_np(b)), like.dtype)


@settings(max_examples=examples(8))  # each example compiles a new pattern's forward and backward
@given(bst.dynamic_block_sparse_matrices(dtype=bst.dtypes()), st.integers(1, 4), st.data())
def test_dynamic_both_orders_match_oracle(D, n, data):
    m, k = D.shape
    w64 = to_dense64(D)
    x = data.draw(bst.dense_arrays((k, n), D.dtype))
    assert_close(jax.jit(bs.matmul)(D, x), w64 @ _np(x), np.abs(w64) @ np.abs(_np(x)), D.dtype)
    xt = data.draw(bst.dense_arrays((n, m), D.dtype))
    assert_close(jax.jit(bs.matmul)(xt, D), _np(xt) @ w64, np.abs(_np(xt)) @ np.abs(w64), D.dtype)
    assert_close(D.to_dense(), w64, np.abs(w64), D.dtype, "to_dense")


@given(bst.dynamic_block_sparse_matrices(), st.integers(1, 4), st.data())
def test_dynamic_sdd_matches_oracle(D, n, data):
    m, k = D.shape
    a = data.draw(bst.dense_arrays((m, n)))
    b = data.draw(bst.dense_arrays((n, k)))
    out = jax.jit(bs.sdd)(a, b, D)
    bh, bw = D.block_size
    full = (_np(a) @ _np(b)).reshape(m // bh, bh, k // bw, bw).swapaxes(1, 2)
    nnz = int(D.nnz)
    expected = np.zeros((D.capacity, bh, bw))
    expected[:nnz] = full[np.asarray(D.rows)[:nnz], np.asarray(D.cols)[:nnz]]
    scale = np.zeros_like(expected)
    scale[:nnz] = (
        (np.abs(_np(a)) @ np.abs(_np(b)))
        .reshape(full.shape[0], bh, -1, bw)
        .swapaxes(1, 2)[np.asarray(D.rows)[:nnz], np.asarray(D.cols)[:nnz]]
    )
    assert_close(out.data, expected, scale, jnp.float32, "sdd data")


# ---- gradients ------------------------------------------------------------------------------
def _loss(y):
    return jnp.sum(jnp.sin(y))


@settings(max_examples=examples(8))  # each example compiles a new pattern's forward and backward
@given(bst.block_sparse_matrices(dtype=st.sampled_from([jnp.float32, jnp.bfloat16])), st.integers(1, 4), st.data())
def test_grads_match_dense(W, n, data):
    """d/dx and d/d(data) of both operand orders equal the dense gradient restricted to the pattern."""
    x = data.draw(bst.dense_arrays((W.shape[1], n), W.dtype))
    xt = data.draw(bst.dense_arrays((n, W.shape[0]), W.dtype))
    wd = W.to_dense().astype(jnp.float32)
    f32 = lambda t: t.astype(jnp.float32)
    g_data, g_x = jax.grad(lambda d, x: _loss(bs.matmul(W.with_data(d), x, implementation=XLA)), (0, 1))(W.data, x)
    gd_w, gd_x = jax.grad(lambda w, x: _loss(w @ x), (0, 1))(wd, f32(x))
    scale = np.abs(np.asarray(wd)).sum() + 1.0
    assert g_data.dtype == W.dtype and g_x.dtype == x.dtype
    assert_close(g_x, gd_x, scale, W.dtype, "dx")
    assert_close(W.with_data(g_data).to_dense(), np.where(np.asarray(wd) != 0, gd_w, 0) if W.nnz_blocks else gd_w * 0,
                 scale, W.dtype, "ddata")  # fmt: skip
    # Blocks that happen to hold exact zeros still receive their gradient: compare block-wise.
    bh, bw = W.block_size
    full = np.asarray(gd_w).reshape(W.shape[0] // bh, bh, -1, bw).swapaxes(1, 2)[W.pattern.rows, W.pattern.cols]
    assert_close(g_data, full, scale, W.dtype, "ddata blocks")
    h_x, h_data = jax.grad(lambda x, d: _loss(bs.matmul(x, W.with_data(d), implementation=XLA)), (0, 1))(xt, W.data)
    hd_x, hd_w = jax.grad(lambda x, w: _loss(x @ w), (0, 1))(f32(xt), wd)
    assert_close(h_x, hd_x, scale, W.dtype, "dx (dense @ sparse)")
    full = np.asarray(hd_w).reshape(W.shape[0] // bh, bh, -1, bw).swapaxes(1, 2)[W.pattern.rows, W.pattern.cols]
    assert_close(h_data, full, scale, W.dtype, "ddata (dense @ sparse)")


@settings(max_examples=examples(8))  # each example compiles a new pattern's forward and backward
@given(bst.block_sparse_matrices(), st.integers(1, 4), st.data())
def test_sdd_grads_match_dense(like, n, data):
    m, k = like.shape
    a = data.draw(bst.dense_arrays((m, n)))
    b = data.draw(bst.dense_arrays((n, k)))
    mask = np.asarray(like.with_data(jnp.ones_like(like.data)).to_dense())
    ga, gb = jax.grad(lambda a, b: _loss(bs.sdd(a, b, like, implementation=XLA).data), (0, 1))(a, b)
    ea, eb = jax.grad(lambda a, b: jnp.sum(jnp.sin(a @ b) * mask), (0, 1))(a, b)
    scale = float(np.abs(a).sum() + np.abs(b).sum())
    assert_close(ga, ea, scale, jnp.float32, "da")
    assert_close(gb, eb, scale, jnp.float32, "db")


@settings(max_examples=examples(8))  # each example compiles a new pattern's forward and backward
@given(bst.dynamic_block_sparse_matrices(), st.integers(1, 3), st.data())
def test_dynamic_grads_match_dense(D, n, data):
    m, k = D.shape
    x = data.draw(bst.dense_arrays((k, n)))
    g_data, g_x = jax.jit(jax.grad(lambda d, x: _loss(bs.matmul(D.with_data(d), x)), (0, 1)))(D.data, x)
    wd = jnp.asarray(to_dense64(D), jnp.float32)
    gd_w, gd_x = jax.grad(lambda w, x: _loss(w @ x), (0, 1))(wd, x)
    scale = float(np.abs(np.asarray(wd)).sum() + 1)
    assert_close(g_x, gd_x, scale, jnp.float32, "dx")
    nnz, (bh, bw) = int(D.nnz), D.block_size
    blocks = np.asarray(gd_w).reshape(m // bh, bh, k // bw, bw).swapaxes(1, 2)
    expected = np.zeros(D.data.shape)
    expected[:nnz] = blocks[np.asarray(D.rows)[:nnz], np.asarray(D.cols)[:nnz]]
    assert_close(g_data, expected, scale, jnp.float32, "ddata (padding gets zero)")


# ---- transformations ------------------------------------------------------------------------
def test_jit_vmap_over_dense_and_data(getkey):
    W = bs.random(getkey(), (32, 48), (8, 16), 0.5)
    xs = jax.random.normal(getkey(), (3, 48, 5))
    ys = jax.jit(jax.vmap(lambda x: W @ x))(xs)
    np.testing.assert_allclose(ys, jnp.einsum("mk,bkn->bmn", W.to_dense(), xs), rtol=1e-5, atol=1e-5)
    datas = jnp.stack([W.data, 2 * W.data, -W.data])
    ys = jax.vmap(lambda d: bs.matmul(W.with_data(d), xs[0]))(datas)
    np.testing.assert_allclose(ys[1], 2 * (W.to_dense() @ xs[0]), rtol=1e-5, atol=1e-5)
    # vmap of a batch of matrices (a pytree with a batched leaf) and of grads
    Ws = jax.tree.map(lambda d: jnp.stack([d, d + 1]), W)
    ys = jax.vmap(bs.matmul, in_axes=(0, None))(Ws, xs[0])
    np.testing.assert_allclose(ys[0], W.to_dense() @ xs[0], rtol=1e-5, atol=1e-5)
    gs = jax.vmap(jax.grad(lambda d, x: _loss(bs.matmul(W.with_data(d), x))), in_axes=(None, 0))(W.data, xs)
    assert gs.shape == (3, *W.data.shape)
    # Each gradient is the dense gradient restricted to W's blocks.
    (bh, bw), (m, k) = W.block_size, W.shape
    for i in range(3):
        dense = jax.grad(lambda w, x: _loss(w @ x))(W.to_dense(), xs[i])
        blocks = np.asarray(dense).reshape(m // bh, bh, k // bw, bw).swapaxes(1, 2)[W.pattern.rows, W.pattern.cols]
        np.testing.assert_allclose(gs[i], blocks, rtol=1e-5, atol=1e-5)


def test_jit_specialises_per_pattern_not_per_values(getkey):
    traces = []

    @jax.jit
    def f(W, x):
        traces.append(W.pattern.fingerprint)
        return W @ x

    W = bs.random(getkey(), (32, 32), 8, 0.5)
    x = jnp.ones((32, 2))
    f(W, x)
    f(W.with_data(W.data * 3), x)
    assert len(traces) == 1
    f(bs.random(getkey(), (32, 32), 8, 0.25), x)
    assert len(traces) == 2


def test_dynamic_pattern_change_does_not_recompile(getkey):
    traces = []

    @jax.jit
    def f(rows, cols, blocks, nnz, x):
        traces.append(1)
        D = bs.DynamicBlockSparseMatrix.from_blocks(rows, cols, blocks, nnz, shape=(32, 32), capacity=6)
        return D @ x

    x = jax.random.normal(getkey(), (32, 3))
    blocks = jax.random.normal(getkey(), (4, 8, 8))
    for rows, cols, nnz in (([0, 1, 2, 3], [0, 1, 2, 3], 4), ([3, 3, 3, 0], [1, 1, 2, 0], 3)):
        y = f(jnp.array(rows), jnp.array(cols), blocks, nnz, x)
        D = bs.DynamicBlockSparseMatrix.from_blocks(jnp.array(rows), jnp.array(cols), blocks, nnz, shape=(32, 32))
        np.testing.assert_allclose(y, to_dense64(D) @ np.asarray(x), rtol=1e-5, atol=1e-5)
    assert len(traces) == 1


def test_mixed_dtypes_and_preferred_element_type(getkey):
    W = bs.random(getkey(), (32, 32), 16, 0.5, dtype=jnp.bfloat16)
    x = jax.random.normal(getkey(), (32, 4), jnp.float32)
    assert (W @ x).dtype == jnp.float32
    assert bs.matmul(W, x.astype(jnp.bfloat16), preferred_element_type=jnp.float32).dtype == jnp.float32
    assert bs.matmul(x.T, W).dtype == jnp.float32


def test_dispatch_log_and_fallback(getkey):
    W = bs.random(getkey(), (32, 32), 16, 0.5)
    x = jnp.ones((32, 4))
    with bs.dispatch_log() as log:
        jax.grad(lambda d: bs.matmul(W.with_data(d), x, implementation="xla").sum())(W.data)
    assert ("dsd", "xla") in log and ("sdd", "xla") in log
    # None: Pallas where it can run (a GPU, or Pallas' interpreter), else the reference.
    for interpreted in (False, True):
        with bs.interpret(interpreted), bs.dispatch_log() as log:
            y = bs.matmul(W, x)
        expected = "pallas" if interpreted or jax.default_backend() == "gpu" else "xla"
        assert log == [("dsd", expected)], (interpreted, log)
        np.testing.assert_allclose(y, W.to_dense() @ x, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="Expected an implementation"):
        bs.matmul(W, x, implementation="cuda")


# ---- bad input ------------------------------------------------------------------------------
def test_bad_operands(getkey):
    W = bs.random(getkey(), (32, 16), 8, 0.5)
    with pytest.raises(ValueError, match=r"contracting dimension to be 16.*Got 17"):
        bs.matmul(W, jnp.ones((17, 2)))
    with pytest.raises(ValueError, match=r"last dimension to be 32.*Got shape \(2, 31\)"):
        bs.matmul(jnp.ones((2, 31)), W)
    with pytest.raises(TypeError, match="exactly one block-sparse operand"):
        bs.matmul(W, W)
    with pytest.raises(TypeError, match="exactly one block-sparse operand"):
        bs.matmul(jnp.ones((2, 2)), jnp.ones((2, 2)))
    with pytest.raises(TypeError, match="floating-point dense operand.*int32"):
        bs.matmul(W, jnp.ones((16, 2), jnp.int32))
    with pytest.raises(ValueError, match=r"a of shape \(32, n\) and b of shape \(n, 16\)"):
        bs.sdd(jnp.ones((32, 3)), jnp.ones((4, 16)), W)


def test_dynamic_out_of_range_is_reported_not_silent():
    from jax.experimental import checkify

    D = bs.DynamicBlockSparseMatrix.from_blocks(
        jnp.array([0, 9]), jnp.array([0, 0]), jnp.ones((2, 8, 8)), shape=(32, 32)
    )
    x = jnp.ones((32, 2))
    assert not bool(D.is_valid())
    # Without checkify: NaN, never a plausible wrong number.
    assert bool(jnp.isnan(jax.jit(bs.matmul)(D, x)).all())
    # Plain checkify sees no check (runtime checks are off by default: they slow dispatch) ...
    err, _ = checkify.checkify(jax.jit(bs.matmul))(D, x)
    err.throw()
    # ... bs.checkify (or `with bs.runtime_checks():`) turns them on: a clear error.
    for checked in (bs.checkify(jax.jit(bs.matmul)), jax.jit(bs.checkify(bs.matmul))):
        err, _ = checked(D, x)
        with pytest.raises(checkify.JaxRuntimeError, match=r"rows in \[0, 4\)"):
            err.throw()
    with bs.runtime_checks():
        err, _ = checkify.checkify(jax.jit(bs.matmul))(D, x)
    with pytest.raises(checkify.JaxRuntimeError, match=r"rows in \[0, 4\)"):
        err.throw()
    # Without runtime checks a jitted call has no effects, so it keeps JAX's fast dispatch.
    assert not jax.make_jaxpr(bs.matmul)(D, x).effects
    # Out-of-range coordinates in padding (>= nnz) are fine.
    D = bs.DynamicBlockSparseMatrix.from_blocks(
        jnp.array([0, 9]), jnp.array([0, 0]), jnp.ones((2, 8, 8)), 1, shape=(32, 32)
    )
    err, y = bs.checkify(bs.matmul)(D, x)
    err.throw()
    np.testing.assert_allclose(y[:8], 8.0)


def test_zero_size_dimensions():
    Z = bs.BlockSparseMatrix.from_dense(jnp.zeros((0, 16)), 8)  # m = 0
    assert bs.matmul(jnp.ones((3, 0)), Z).shape == (3, 16)
    assert not bs.matmul(jnp.ones((3, 0)), Z).any()
    assert bs.matmul(Z, jnp.ones((16, 3))).shape == (0, 3)
    K = bs.BlockSparseMatrix.from_dense(jnp.zeros((16, 0)), 8)  # k = 0
    np.testing.assert_array_equal(bs.matmul(K, jnp.ones((0, 3))), np.zeros((16, 3)))
    np.testing.assert_array_equal(bs.matmul(K, jnp.ones((2, 0, 3))), np.zeros((2, 16, 3)))
    D = bs.DynamicBlockSparseMatrix.from_static(K, capacity=2)
    np.testing.assert_array_equal(bs.matmul(D, jnp.ones((0, 3))), np.zeros((16, 3)))
    W = bs.random(jax.random.key(0), (16, 16), 8, 0.5)
    assert bs.matmul(jnp.ones((0, 4, 16)), W).shape == (0, 4, 16)
    assert bs.matmul(W, jnp.ones((16, 0))).shape == (16, 0)
    # sdd on an empty dimension, dynamic padding included
    Dm = bs.DynamicBlockSparseMatrix.from_static(Z, capacity=3)
    assert bs.sdd(jnp.ones((0, 5)), jnp.ones((5, 16)), Dm).data.shape == (3, 8, 8)
    assert bs.sdd(jnp.ones((16, 5)), jnp.ones((5, 0)), D).data.shape == (2, 8, 8)
