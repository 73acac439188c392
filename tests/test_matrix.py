"""Formats: constructors, conversions, transposes, interop and bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import blocksparse as bs
from blocksparse.testing import strategies as bst
from blocksparse.testing.oracles import to_dense64


@given(bst.block_sparse_matrices(dtype=bst.dtypes()))
def test_pattern_invariants(W):
    p = W.pattern
    assert p.rows.dtype == np.int32 and p.indptr[0] == 0 and p.indptr[-1] == p.nnz_blocks
    key = p.rows.astype(np.int64) * p.grid[1] + p.cols
    assert np.all(np.diff(key) > 0), "row-major, no duplicates"
    assert W.data.shape == (p.nnz_blocks, *p.block_size)
    assert W.density == pytest.approx(p.nnz_blocks / (p.grid[0] * p.grid[1]))
    assert hash(p) == hash(bs.BlockPattern(p.shape, p.block_size, p.rows[::-1], p.cols[::-1]))


@given(bst.block_sparse_matrices(dtype=bst.dtypes()))
def test_roundtrips(W):
    dense = np.asarray(W.to_dense().astype(jnp.float32))
    np.testing.assert_array_equal(dense, to_dense64(W))
    # from_mask with the pattern's mask reproduces the matrix exactly (zero blocks included).
    again = bs.BlockSparseMatrix.from_mask(W.pattern.mask(), W.to_dense(), W.block_size)
    assert again.pattern == W.pattern
    np.testing.assert_array_equal(np.asarray(again.data, np.float32), np.asarray(W.data, np.float32))
    # from_dense keeps exactly the blocks holding a non-zero.
    fd = bs.BlockSparseMatrix.from_dense(W.to_dense(), W.block_size)
    np.testing.assert_array_equal(np.asarray(fd.to_dense(), np.float32), dense)
    bh, bw = W.block_size
    nz = (dense.reshape(W.shape[0] // bh, bh, -1, bw) != 0).any(axis=(1, 3))
    np.testing.assert_array_equal(fd.pattern.mask(), nz)
    # Transpose: dense transpose, involution, cached pattern.
    np.testing.assert_array_equal(np.asarray(W.T.to_dense(), np.float32), dense.T)
    assert W.T.T.pattern == W.pattern and W.pattern.T is W.pattern.T
    np.testing.assert_array_equal(np.asarray(W.T.T.data, np.float32), np.asarray(W.data, np.float32))


@given(bst.block_sparse_matrices(), st.data())
def test_from_blocks_any_order(W, data):
    perm = data.draw(st.permutations(range(W.nnz_blocks)))
    perm = np.asarray(perm, np.int64)
    p = W.pattern
    again = bs.BlockSparseMatrix.from_blocks(p.rows[perm], p.cols[perm], W.data[perm], W.shape)
    np.testing.assert_array_equal(again.to_dense(), W.to_dense())


@given(bst.block_sparse_matrices(dtype=st.sampled_from([jnp.float32, jnp.float16, jnp.bfloat16])))
def test_scipy_and_bcoo_interop(W):
    pytest.importorskip("scipy")
    dense = np.asarray(W.to_dense(), np.float32)
    s = W.to_scipy()
    np.testing.assert_array_equal(s.toarray().astype(np.float32), dense)
    back = bs.BlockSparseMatrix.from_scipy(s)
    np.testing.assert_array_equal(np.asarray(back.to_dense(), np.float32), dense)
    b = W.to_bcoo()
    np.testing.assert_array_equal(np.asarray(b.todense(), np.float32), dense)
    back = bs.BlockSparseMatrix.from_bcoo(b, W.block_size)
    assert back.pattern == W.pattern


def test_scipy_csr_with_block_size():
    sp = pytest.importorskip("scipy.sparse")
    a = np.zeros((8, 8), np.float32)
    a[0, 5] = 1.0
    a[7, 0] = 2.0
    W = bs.BlockSparseMatrix.from_scipy(sp.csr_array(a), block_size=4)
    assert W.nnz_blocks == 2
    np.testing.assert_array_equal(W.to_dense(), a)
    with pytest.raises(ValueError, match="Expected block_size for a scipy csr"):
        bs.BlockSparseMatrix.from_scipy(sp.csr_array(a))


def test_astype_with_data_and_pytree(getkey):
    W = bs.random(getkey(), (32, 64), (16, 8), 0.5)
    assert W.astype(jnp.bfloat16).dtype == jnp.bfloat16
    leaves, treedef = jax.tree.flatten(W)
    assert len(leaves) == 1 and leaves[0] is W.data
    assert jax.tree.unflatten(treedef, leaves).pattern is W.pattern
    assert W.with_data(2 * W.data).pattern is W.pattern
    assert W.shape == (32, 64) and W.block_size == (16, 8) and W.ndim == 2
    assert "nnz_blocks" in repr(W)


def test_random_density_and_determinism():
    key = jax.random.key(3)
    W = bs.random(key, (64, 64), 8, 0.25)
    assert W.nnz_blocks == 16
    assert bs.random(key, (64, 64), 8, 0.25).pattern == W.pattern
    assert bs.random(key, (64, 64), 8, 1.0).nnz_blocks == 64
    assert bs.random(key, (64, 64), 8, 0.0).nnz_blocks == 0


def test_power_law_pattern_is_skewed():
    p = bs.BlockPattern.power_law(0, (1024, 1024), 16, 1 / 8)
    assert p.nnz_blocks == 512
    lengths = p.row_lengths
    assert lengths.max() >= 8 * max(lengths.mean(), 1)


@given(bst.dynamic_block_sparse_matrices(dtype=bst.dtypes()))
def test_dynamic_to_dense_and_transpose(D):
    expected = to_dense64(D)
    np.testing.assert_allclose(np.asarray(D.to_dense(), np.float64), expected, rtol=1e-2, atol=1e-2)
    np.testing.assert_allclose(np.asarray(D.T.to_dense(), np.float64), expected.T, rtol=1e-2, atol=1e-2)
    assert bool(D.is_valid())


def test_dynamic_from_static_and_jit():
    W = bs.random(jax.random.key(0), (32, 32), 8, 0.5)
    D = bs.DynamicBlockSparseMatrix.from_static(W, capacity=20)
    assert D.capacity == 20
    np.testing.assert_array_equal(jax.jit(lambda D: D.to_dense())(D), W.to_dense())


# ---- bad input ------------------------------------------------------------------------------
def test_bad_block_sizes():
    with pytest.raises(ValueError, match=r"block_size \(16, 16\) to divide the shape \(40, 32\)"):
        bs.BlockSparseMatrix.from_dense(np.ones((40, 32), np.float32), 16)
    with pytest.raises(ValueError, match=r"positive block size. Got block_size=\(0, 4\)"):
        bs.random(jax.random.key(0), (8, 8), (0, 4), 0.5)
    with pytest.raises(ValueError, match=r"an int or a pair"):
        bs.random(jax.random.key(0), (8, 8), (2, 2, 2), 0.5)
    with pytest.raises(ValueError, match=r"density in \[0, 1\]. Got 1.5"):
        bs.random(jax.random.key(0), (8, 8), 2, 1.5)


def test_bad_from_blocks_and_mask():
    blocks = jnp.ones((2, 4, 4))
    with pytest.raises(ValueError, match=r"block rows in \[0, 2\). Got 2"):
        bs.BlockSparseMatrix.from_blocks([0, 2], [0, 1], blocks, (8, 8))
    with pytest.raises(ValueError, match=r"block cols in \[0, 2\). Got -1"):
        bs.BlockSparseMatrix.from_blocks([0, 1], [0, -1], blocks, (8, 8))
    with pytest.raises(ValueError, match=r"blocks of shape \(3, bh, bw\).*Got \(2, 4, 4\)"):
        bs.BlockSparseMatrix.from_blocks([0, 1, 1], [0, 1, 0], blocks, (8, 8))
    with pytest.raises(ValueError, match=r"unique block positions.*\(1, 1\)"):
        bs.BlockSparseMatrix.from_blocks([1, 1], [1, 1], blocks, (8, 8))
    with pytest.raises(ValueError, match=r"block mask of shape \(2, 2\).*Got \(3, 2\)"):
        bs.BlockSparseMatrix.from_mask(np.ones((3, 2), bool), jnp.ones((8, 8)), 4)
    with pytest.raises(TypeError, match="floating-point blocks. Got dtype int32"):
        bs.BlockSparseMatrix.from_blocks([0], [0], jnp.ones((1, 4, 4), jnp.int32), (8, 8))
    with pytest.raises(TypeError, match="floating-point x. Got dtype int64"):
        bs.BlockSparseMatrix.from_dense(np.ones((8, 8), np.int64), 4)
    W = bs.random(jax.random.key(0), (8, 8), 4, 0.5)
    with pytest.raises(ValueError, match=r"data of shape \(2, 4, 4\).*Got \(3, 4, 4\)"):
        W.with_data(jnp.ones((3, 4, 4)))


def test_bad_dynamic():
    blocks = jnp.ones((3, 4, 4))
    with pytest.raises(ValueError, match=r"nnz <= capacity=2. Got nnz=3"):
        bs.DynamicBlockSparseMatrix.from_blocks([0, 0, 0], [0, 0, 0], blocks[:2], 3, shape=(8, 8), capacity=2)
    with pytest.raises(ValueError, match=r"at most capacity=2 blocks. Got 3"):
        bs.DynamicBlockSparseMatrix.from_blocks([0, 0, 0], [0, 0, 0], blocks, shape=(8, 8), capacity=2)
    with pytest.raises(ValueError, match=r"rows of shape \(3,\)"):
        bs.DynamicBlockSparseMatrix(jnp.zeros(2, jnp.int32), jnp.zeros(3, jnp.int32), blocks, 3, (8, 8))
    with pytest.raises(TypeError, match="integer cols"):
        bs.DynamicBlockSparseMatrix(jnp.zeros(3, jnp.int32), jnp.zeros(3), blocks, 3, (8, 8))
    with pytest.raises(ValueError, match=r"block_size \(4, 4\) to divide the shape \(8, 6\)"):
        bs.DynamicBlockSparseMatrix.from_blocks([0], [0], blocks[:1], shape=(8, 6))


def test_generators_reject_bad_density():
    for gen in (bs.BlockPattern.random, bs.BlockPattern.power_law):
        for d in (1.5, -0.5):
            with pytest.raises(ValueError, match=rf"density in \[0, 1\]. Got {d}"):
                gen(0, (64, 64), 16, d)
