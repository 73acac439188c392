"""Block-sparse products never return a plausible wrong number.

Invalid dynamic coordinates make the output *and its gradients* NaN; output dtypes must be
floating; precision is honoured. Checked on the pure-JAX path and on the Pallas kernels, in
interpret mode on the CPU and for real on a GPU (the same tests: ``pytest tests/test_products_invalid.py``).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import examples, sweep
from hypothesis import given, settings
from hypothesis import strategies as st

import blocksparse as bs
from blocksparse.testing import strategies as bst

IMPLS = ["xla", "pallas"]


def _dynamic(rows, cols, *, shape=(64, 64), block=16, key=0):
    n = len(rows)
    data = jax.random.normal(jax.random.key(key), (n, block, block))
    return bs.DynamicBlockSparseMatrix.from_blocks(jnp.array(rows), jnp.array(cols), data, shape=shape)


ON_GPU = jax.default_backend() == "gpu"


def _run(impl, fn):
    """Run ``fn``; the Pallas kernels in the interpreter unless a GPU runs them for real."""
    if impl == "pallas" and not ON_GPU:
        with bs.interpret():
            return fn()
    return fn()


# -- preferred_element_type ----------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [jnp.int32, jnp.bool_, jnp.uint8])
def test_integer_preferred_element_type_is_refused(dtype):
    W = bs.random(jax.random.key(0), (32, 32), 16, 0.5)
    D = bs.DynamicBlockSparseMatrix.from_static(W)
    x = jnp.full((32, 4), 1.6)
    for sparse in (W, D):
        with pytest.raises(TypeError, match=r"floating dtype.*Got (int32|bool|uint8)"):
            bs.matmul(sparse, x, preferred_element_type=dtype)
        with pytest.raises(TypeError, match="floating dtype"):
            bs.matmul(x.T, sparse, preferred_element_type=dtype)
        with pytest.raises(TypeError, match="floating dtype"):
            bs.sdd(jnp.ones((32, 4)), jnp.ones((4, 32)), sparse, preferred_element_type=dtype)


def test_floating_preferred_element_type_is_kept():
    W = bs.random(jax.random.key(0), (32, 32), 16, 0.5, dtype=jnp.bfloat16)
    y = bs.matmul(W, jnp.ones((32, 4), jnp.bfloat16), preferred_element_type=jnp.float32)
    assert y.dtype == jnp.float32


# -- invalid dynamic coordinates: NaN output, NaN gradients ---------------------------------------
BAD = [([0, 5], [1, 1]), ([0, 1], [4, 0]), ([-1, 0], [0, 0]), ([0, 0], [-1, 2]), ([9, 0], [0, 1])]


@sweep(
    "rows_cols,impl",
    [(rc, impl) for impl in IMPLS for rc in BAD],
    quick=[(BAD[1], "xla"), (BAD[3], "pallas")],
    ids=str,
)
def test_invalid_coordinates_poison_output_and_gradients(impl, rows_cols):
    D = _dynamic(*rows_cols)
    assert not bool(D.is_valid())
    x = jnp.ones((64, 16))

    def loss(data, x):
        return jnp.sum(bs.matmul(D.with_data(data), x, implementation=impl) ** 2)

    def loss_t(data, x):
        return jnp.sum(bs.matmul(x.T, D.with_data(data), implementation=impl) ** 2)

    for f in (loss, loss_t):
        value, (gd, gx) = _run(impl, lambda f=f: jax.jit(jax.value_and_grad(f, argnums=(0, 1)))(D.data, x))
        assert np.isnan(float(value))
        assert np.isnan(np.asarray(gd)).all(), "gradient w.r.t. the values must be NaN, not a silent zero"
        assert np.isnan(np.asarray(gx)).all(), "gradient w.r.t. the dense operand must be NaN"


@sweep("impl", IMPLS)
def test_invalid_coordinates_poison_sdd_and_its_gradients(impl):
    D = _dynamic([0, 7], [0, 0])
    a, b = jnp.ones((64, 8)), jnp.ones((8, 64))
    out = _run(impl, lambda: bs.sdd(a, b, D, implementation=impl))
    assert np.isnan(np.asarray(out.data)).all()
    ga, gb = _run(impl, lambda: jax.grad(lambda a, b: bs.sdd(a, b, D, implementation=impl).data.sum(), (0, 1))(a, b))
    assert np.isnan(np.asarray(ga)).all() and np.isnan(np.asarray(gb)).all()


def test_valid_coordinates_keep_finite_gradients():
    D = _dynamic([0, 3, 3], [1, 1, 2])
    x = jnp.ones((64, 16))
    gd, gx = jax.grad(lambda d, x: jnp.sum(bs.matmul(D.with_data(d), x)), (0, 1))(D.data, x)
    assert np.isfinite(np.asarray(gd)).all() and np.isfinite(np.asarray(gx)).all()


@settings(max_examples=examples(12), deadline=None)
@given(
    bst.dynamic_block_sparse_matrices(block_size=st.sampled_from([(16, 16), (16, 32)]), max_blocks=3, max_capacity=6),
    st.integers(0, 3),
    st.sampled_from([-(2**31), -1, 1, 2, 2**20]),
    st.sampled_from(["rows", "cols"]),
    st.sampled_from(IMPLS),
)
def test_property_invalid_input_gives_nan_never_a_finite_wrong_value(D, which, offset, axis, impl):
    """Move one active coordinate out of the grid: every product is then NaN everywhere."""
    if int(D.nnz) == 0:
        return
    i = which % int(D.nnz)
    gm, gk = D.grid
    limit = gm if axis == "rows" else gk
    coords = np.asarray(getattr(D, axis)).astype(np.int64)
    coords[i] = limit + offset - 1 if offset > 0 else offset  # >= limit, or negative
    coords = np.clip(coords, -(2**31), 2**31 - 1)
    rows = coords if axis == "rows" else np.asarray(D.rows)
    cols = coords if axis == "cols" else np.asarray(D.cols)
    bad = bs.DynamicBlockSparseMatrix(rows, cols, D.data, D.nnz, D.shape)
    assert not bool(bad.is_valid())
    x = jnp.ones((D.shape[1], 3), D.dtype)
    xt = jnp.ones((2, D.shape[0]), D.dtype)
    y = _run(impl, lambda: bs.matmul(bad, x, implementation=impl))
    z = _run(impl, lambda: bs.matmul(xt, bad, implementation=impl))
    s = _run(impl, lambda: bs.sdd(jnp.ones((D.shape[0], 3), D.dtype), x.T, bad, implementation=impl))
    for out in (y, z, s.data, bad.to_dense()):
        out = np.asarray(out, np.float32)
        assert out.size == 0 or np.isnan(out).all()


# -- precision ----------------------------------------------------------------------------------
def test_highest_precision_gives_float32_accuracy():
    key = jax.random.key(3)
    W = bs.random(key, (128, 256), 16, 0.5)
    x = jax.random.normal(jax.random.key(4), (256, 64))
    want = np.asarray(W.to_dense(), np.float64) @ np.asarray(x, np.float64)
    for kw in ({"precision": "highest"}, {"precision": jax.lax.Precision.HIGHEST}):
        y = np.asarray(bs.matmul(W, x, **kw), np.float64)
        assert np.abs(y - want).max() / np.abs(want).max() < 1e-5
    with jax.default_matmul_precision("highest"):
        y = np.asarray(jax.jit(bs.matmul)(W, x), np.float64)
    assert np.abs(y - want).max() / np.abs(want).max() < 1e-5


def test_bad_precision_is_refused():
    W = bs.random(jax.random.key(0), (32, 32), 16, 0.5)
    with pytest.raises(ValueError, match=r"Expected precision .* Got 'fast'"):
        bs.matmul(W, jnp.ones((32, 2)), precision="fast")
