"""Dynamic block-sparse products (work list built inside ``jit``) on the Mosaic GPU kernel.

CPU (CI): the kernel in Pallas' GPU interpreter against the float64 oracle (duplicates, padding holding
garbage, one long row split into partials, ``W @ x`` and ``x @ W`` from the same stored blocks), its
CUDA lowering and its refusals. GPU (``-m gpu``): the real kernel at real sizes, forward, fused and
backward.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from test_pallas_mosaic import HALF, _hopper

import blocksparse as bs
from blocksparse.ops.matmul.mosaic import backend
from blocksparse.ops.matmul.mosaic import dsd as pm
from blocksparse.testing import strategies as bst
from blocksparse.testing.oracles import assert_close, to_dense64


def _np(x):
    return np.asarray(jnp.asarray(x, jnp.float32), np.float64)


def _check(D, n, key, dtype, impl="mosaic"):
    """``D @ x`` and ``x @ D`` (the transposed layout of the same blocks) and a fused ``relu(D @ x + bias)``
    against the float64 oracle; every call is logged as Mosaic's."""
    m, k = D.shape
    kx, kt, kb = jax.random.split(key, 3)
    x = jax.random.normal(kx, (k, n), dtype)
    xt = jax.random.normal(kt, (n, m), dtype)
    bias = jax.random.normal(kb, (n,), dtype)
    w = to_dense64(D)
    with bs.dispatch_log() as log:
        y = jax.jit(lambda D, x: bs.matmul(D, x, implementation=impl))(D, x)
        z = jax.jit(lambda D, x: bs.matmul(x, D, implementation=impl))(D, xt)
        f = jax.jit(lambda D, x, c: bs.matmul(D, x, bias=c, activation="relu", implementation=impl))(D, x, bias)
    assert log == [("dyn_dsd", "mosaic"), ("dyn_dsd", "mosaic"), ("dyn_dsd+epilogue", "mosaic")]
    assert y.dtype == dtype and z.shape == (n, k)
    assert_close(y, w @ _np(x), np.abs(w) @ np.abs(_np(x)), dtype, "D @ x")
    assert_close(z, _np(xt) @ w, np.abs(_np(xt)) @ np.abs(w), dtype, "x @ D")
    want = np.maximum(w @ _np(x) + _np(bias)[None, :], 0)
    assert_close(f, want, np.abs(w) @ np.abs(_np(x)) + np.abs(_np(bias))[None, :], dtype, "relu(D @ x + bias)")


def _linear_loss(D, shape, key):
    """``impl -> loss(data, x) = sum(g * (D @ x))`` for a fixed random ``g``: its gradients (``sdd(g, x)`` and
    ``D^T g``) do not depend on how ``D @ x`` was rounded, so two backends' gradients compare at the dtype's
    tolerance (a loss like ``sum(sin(y))`` would amplify a rounding of ``y`` into its cotangent)."""
    g = jax.random.normal(key, shape, jnp.float32)

    def loss(impl):
        return lambda d, x: jnp.sum(g * bs.matmul(D.with_data(d), x, implementation=impl).astype(jnp.float32))

    return loss


@settings(max_examples=examples(4), deadline=None)
@given(
    bst.dynamic_block_sparse_matrices(
        block_size=st.sampled_from([(64, 64), (64, 128), (128, 64)]), dtype=jnp.bfloat16, max_blocks=3, max_capacity=8
    ),  # fmt: skip
    st.sampled_from([1, 64, 100]),
    st.integers(0, 2**16),
)
def test_dynamic_mosaic_interpret(D, n, seed):
    with bs.interpret():
        _check(D, n, jax.random.key(seed), jnp.bfloat16)


@pytest.mark.slow  # a long row interpreted; the kernel's quick interpreter test: test_dynamic_mosaic_interpret
def test_dynamic_mosaic_long_row_invalid_and_gradients_interpret(getkey):
    """One row of 10 blocks (split into units of 4: float32 partials summed after the kernel); an invalid
    matrix gives NaN; gradients through ``("mosaic", "xla")`` (the dynamic sdd is not on Mosaic) match XLA's."""
    rows = jnp.zeros(12, jnp.int32).at[-2:].set(jnp.array([1, 2]))
    cols = jnp.arange(12, dtype=jnp.int32) % 5
    data = jax.random.normal(getkey(), (12, 64, 64), jnp.bfloat16)
    D = bs.DynamicBlockSparseMatrix.from_blocks(rows, cols, data, 12, shape=(192, 320), capacity=16)
    with bs.interpret():
        _check(D, 64, getkey(), jnp.bfloat16)
        cfg = pm.MosaicConfig(max_len=4)
        keep = jnp.arange(16) < 12
        x = jax.random.normal(getkey(), (320, 64), jnp.bfloat16)
        y = backend.dsd_dynamic(D.rows, D.cols, keep, jnp.bool_(True), D.data, x, 3, config=cfg)
        w = to_dense64(D)
        assert_close(y, w @ _np(x), np.abs(w) @ np.abs(_np(x)), jnp.bfloat16)
        bad = backend.dsd_dynamic(D.rows, D.cols, keep, jnp.bool_(False), D.data, x, 3, config=cfg)
        assert np.isnan(np.asarray(bad, np.float32)).all()

        loss = _linear_loss(D, (192, 64), getkey())

        with bs.dispatch_log() as log:
            gm = jax.jit(jax.grad(loss(("mosaic", "xla")), (0, 1)))(D.data, x)
        assert ("dyn_dsd", "mosaic") in log and ("dyn_sdd", "xla") in log
    gx = jax.jit(jax.grad(loss("xla"), (0, 1)))(D.data, x)
    for a, b, what in ((gm[0], gx[0], "d data"), (gm[1], gx[1], "d x")):
        assert_close(a, _np(b), float(np.abs(_np(b)).max()), jnp.bfloat16, what)


def test_dynamic_mosaic_lowers_for_cuda_and_refuses_what_it_lacks(getkey):
    D = bs.DynamicBlockSparseMatrix.from_static(bs.random(getkey(), (512, 512), 128, 0.5, jnp.bfloat16))
    x = jnp.zeros((512, 4096), jnp.bfloat16)
    keep = jnp.ones(D.capacity, bool)
    for transposed in (False, True):
        fn = jax.jit(lambda D, x, t=transposed: backend.dsd_dynamic(D.rows, D.cols, keep, jnp.bool_(True), D.data, x, 4,
                                                               transposed=t, interpret=False))  # fmt: skip
        txt = fn.trace(D, x).lower(lowering_platforms=("cuda",)).as_text()
        assert "bs_mgpu_dsd_128x128" in txt and (("_wt" in txt) == transposed)
    with pytest.raises(NotImplementedError, match="persistent=False"):
        backend.dsd_dynamic(D.rows, D.cols, keep, True, D.data, x, 4, config=pm.MosaicConfig(persistent=True))
    D32 = bs.DynamicBlockSparseMatrix.from_static(bs.random(getkey(), (64, 64), 32, 0.5, jnp.bfloat16))
    with pytest.raises(NotImplementedError, match="block sides"):
        backend.dsd_dynamic(D32.rows, D32.cols, jnp.ones(D32.capacity, bool), True, D32.data, x[:64], 2)
    with pytest.raises(NotImplementedError, match="float16 or bfloat16"):
        backend.dsd_dynamic(D.rows, D.cols, keep, True, D.data.astype(jnp.float32), x, 4)
    with pytest.raises(NotImplementedError, match="dyn_sdd"):
        backend.MosaicBackend().dyn_sdd(None, D.rows, D.cols, keep, True, x, x)


# ---- on the GPU -----------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("b", [64, 128])
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("skew", [False, True])
def test_dynamic_mosaic_gpu(b, dtype, skew):
    """A 2048 x 1536 matrix at density 1/4 with 7 padding slots (one row holding half the blocks with
    ``skew``), against the float64 oracle in both orders and fused; gradients against XLA's."""
    _hopper()
    rng = np.random.default_rng(b + skew)
    gm, gk = 2048 // b, 1536 // b
    cap = gm * gk // 4
    rows = np.where(rng.random(cap) < 0.5, 0, rng.integers(0, gm, cap)) if skew else rng.integers(0, gm, cap)
    data = jnp.asarray(rng.standard_normal((cap, b, b)), dtype)
    D = bs.DynamicBlockSparseMatrix.from_blocks(rows, rng.integers(0, gk, cap), data, cap - 7, shape=(gm * b, gk * b),
                                                capacity=cap)  # fmt: skip
    _check(D, 1000, jax.random.key(b), dtype)
    x = jax.random.normal(jax.random.key(1), (gk * b, 512), dtype)

    loss = _linear_loss(D, (gm * b, 512), jax.random.key(2))

    gm_ = jax.jit(jax.grad(loss(("mosaic", "xla")), (0, 1)))(D.data, x)
    gx = jax.jit(jax.grad(loss("xla"), (0, 1)))(D.data, x)
    for a, g, what in ((gm_[0], gx[0], "d data"), (gm_[1], gx[1], "d x")):
        assert_close(a, _np(g), float(np.abs(_np(g)).max()), dtype, what)
