"""Formats: constructors, conversions, transposes, interop and bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import examples
from hypothesis import given, settings
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
    assert back.pattern == W.pattern and back.dtype == W.dtype
    np.testing.assert_array_equal(np.asarray(back.data, np.float32), np.asarray(W.data, np.float32))


def test_from_bcoo_sums_duplicates_block_by_block(monkeypatch):
    from jax.experimental import sparse

    # 2**20 x 2**20 would be 4 TiB dense: converting must touch only the stored entries' blocks.
    n = 2**20
    idx = jnp.array([[0, 1], [0, 1], [n - 1, 5], [17, n - 2], [n, 0]])  # a duplicate and a padding entry
    mat = sparse.BCOO((jnp.array([1.0, 2.0, 3.0, 4.0, 9.0]), idx), shape=(n, n))
    monkeypatch.setattr(sparse.BCOO, "todense", lambda self: pytest.fail("from_bcoo densified the matrix"))
    W = bs.BlockSparseMatrix.from_bcoo(mat, 16)
    np.testing.assert_array_equal(W.pattern.rows, [0, 1, n // 16 - 1])
    np.testing.assert_array_equal(W.pattern.cols, [0, n // 16 - 1, 0])
    assert W.data[0, 0, 1] == 3.0 and W.data[1, 1, 14] == 4.0 and W.data[2, 15, 5] == 3.0
    assert float(jnp.abs(W.data).sum()) == 10.0


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
    assert bs.random(key, (64, 64), 16, 1 / 16).nnz_blocks == 1


def test_random_density_that_keeps_no_block_raises():
    # 16 blocks: 0.01 * 16 rounds to 0, which used to give an empty matrix silently.
    with pytest.raises(ValueError, match=r"at least one of the 16 blocks.*density > 0.03125.*Got density=0.01"):
        bs.random(jax.random.key(0), (64, 64), 16, 0.01)
    with pytest.raises(ValueError, match="keeps 0 blocks"):
        bs.nn.SparseLinear.init(jax.random.key(0), 64, 64, block_size=16, density=0.01)
    assert bs.random(jax.random.key(0), (64, 64), 16, 0.0).nnz_blocks == 0
    # The pattern generators round as documented (they draw test patterns on tiny grids).
    assert bs.BlockPattern.random(0, (64, 64), 16, 0.01).nnz_blocks == 0


def test_pattern_builders_inside_jit_say_so():
    key = jax.random.key(0)
    with pytest.raises(TypeError, match="bs.random: expected key as concrete host data.*build it outside jit"):
        jax.jit(lambda k: bs.random(k, (64, 64), 16, 0.5))(key)
    with pytest.raises(TypeError, match="expected density as concrete host data"):
        jax.jit(lambda d: bs.random(key, (64, 64), 16, d))(0.5)
    with pytest.raises(TypeError, match="from_dense: expected x as concrete host data"):
        jax.jit(lambda x: bs.BlockSparseMatrix.from_dense(x, 4))(jnp.ones((8, 8)))
    with pytest.raises(TypeError, match="from_blocks: expected rows as concrete host data"):
        jax.jit(lambda r: bs.BlockSparseMatrix.from_blocks(r, [0], jnp.ones((1, 4, 4)), (8, 8)))(jnp.array([0]))
    # Values may be traced: from_mask with a concrete mask works inside jit.
    y = jax.jit(lambda v: bs.BlockSparseMatrix.from_mask(np.eye(2, dtype=bool), v, 4).to_dense())(jnp.ones((8, 8)))
    np.testing.assert_array_equal(y, np.kron(np.eye(2), np.ones((4, 4))))


# ---- conversions to dense arrays are explicit -----------------------------------------------
def _both_kinds():
    W = bs.random(jax.random.key(0), (32, 32), 8, 0.5)
    return [W, bs.DynamicBlockSparseMatrix.from_static(W, capacity=10)]


@pytest.mark.parametrize("kind", [0, 1], ids=["static", "dynamic"])
def test_implicit_dense_conversions_raise_with_advice(kind):
    W = _both_kinds()[kind]
    x = jnp.ones((32, 2))
    name = type(W).__name__
    advice = rf"cannot take a {name}.*W @ x.*bs.matmul\(W, x\).*W.to_dense\(\)"
    for convert in (np.asarray, np.array, jnp.asarray, jnp.array, lambda W: jnp.dot(W, x),
                    lambda W: jnp.matmul(W, x), lambda W: jnp.dot(x.T, W), lambda W: jnp.sum(W)):  # fmt: skip
        with pytest.raises(TypeError, match=advice):
            convert(W)


@pytest.mark.parametrize("kind", [0, 1], ids=["static", "dynamic"])
def test_operators_still_defer_to_the_matrix(kind):
    W = _both_kinds()[kind]
    dense = np.asarray(W.to_dense())
    xj = jax.random.normal(jax.random.key(1), (3, 32))
    for x in (xj, np.asarray(xj)):
        np.testing.assert_allclose(x @ W, np.asarray(x) @ dense, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(W @ x.T, dense @ np.asarray(x).T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(jax.jit(lambda x, W: x @ W)(xj, W), np.asarray(xj) @ dense, rtol=1e-5, atol=1e-5)
    if kind == 0:
        for s in (2.0, np.float32(2.0), jnp.float32(2.0)):
            np.testing.assert_array_equal((s * W).to_dense(), 2 * dense)


def test_sparsify_static_and_dynamic():
    from jax.experimental import sparse

    W, D = _both_kinds()
    x = jax.random.normal(jax.random.key(1), (32, 3))
    dense = np.asarray(W.to_dense())
    np.testing.assert_allclose(sparse.sparsify(lambda W, x: W @ x)(W, x), dense @ x, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(sparse.sparsify(lambda W, x: x.T @ W)(W, x), x.T @ dense, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(sparse.sparsify(bs.matmul)(W, x), dense @ x, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(sparse.sparsify(bs.matmul)(x.T, W), x.T @ dense, rtol=1e-5, atol=1e-5)
    with pytest.raises(NotImplementedError, match="sparsify cannot trace products with a DynamicBlockSparseMatrix"):
        sparse.sparsify(lambda D, x: D @ x)(D, x)
    with pytest.raises(NotImplementedError, match="sparsify cannot trace products with a DynamicBlockSparseMatrix"):
        sparse.sparsify(bs.matmul)(D, x)


def test_power_law_pattern_is_skewed():
    p = bs.BlockPattern.power_law(0, (1024, 1024), 16, 1 / 8)
    assert p.nnz_blocks == 512
    lengths = p.row_lengths
    assert lengths.max() >= 8 * max(lengths.mean(), 1)


@settings(max_examples=examples(20), deadline=None)
@given(
    gm=st.integers(1, 12), gk=st.integers(1, 12), bh=st.sampled_from([1, 8, 16]), bw=st.sampled_from([1, 8, 32]),
    density=st.sampled_from([0.0, 0.1, 0.5, 1.0]), cluster=st.integers(1, 5), axis=st.sampled_from([0, 1]),
    seed=st.integers(0, 2**16),
)  # fmt: skip
def test_clustered_pattern_keeps_clusters(gm, gk, bh, bw, density, cluster, axis, seed):
    p = bs.BlockPattern.clustered(seed, (gm * bh, gk * bw), (bh, bw), density, cluster=cluster, axis=axis)
    assert p.grid == (gm, gk) and p.block_size == (bh, bw)
    lines = p.mask() if axis == 0 else p.mask().T  # the clustered axis first
    distinct = {line.tobytes() for line in lines}
    assert len(distinct) <= -(-lines.shape[0] // cluster)  # at most one set of blocks per cluster
    if density == 0.0:
        assert p.nnz_blocks == 0
    elif density == 1.0:
        assert p.nnz_blocks == gm * gk
    else:
        assert lines.any(axis=1).all()  # every line keeps at least one block
    again = bs.BlockPattern.clustered(seed, (gm * bh, gk * bw), (bh, bw), density, cluster=cluster, axis=axis)
    np.testing.assert_array_equal(again.mask(), p.mask())  # one seed, one pattern


def test_clustered_pattern_bad_input():
    with pytest.raises(ValueError, match="Expected axis 0 .* Got 2"):
        bs.BlockPattern.clustered(0, (64, 64), 16, 0.5, axis=2)
    with pytest.raises(ValueError, match="Expected cluster as a positive int .* Got 0"):
        bs.BlockPattern.clustered(0, (64, 64), 16, 0.5, cluster=0)
    with pytest.raises(ValueError, match="density in \\[0, 1\\]. Got 1.5"):
        bs.BlockPattern.clustered(0, (64, 64), 16, 1.5)
    default = bs.BlockPattern.clustered(0, (512, 64), 32, 0.5).mask()  # clusters of 128 // 32 = 4 block rows
    assert len({row.tobytes() for row in default}) <= 4


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
    with pytest.raises(ValueError, match=r"positive ints. Got \(0, 4\), which is not positive"):
        bs.random(jax.random.key(0), (8, 8), (0, 4), 0.5)
    with pytest.raises(ValueError, match=r"a positive int or a pair \(bh, bw\).*Got \(2, 2, 2\) \(3 entries\)"):
        bs.random(jax.random.key(0), (8, 8), (2, 2, 2), 0.5)
    with pytest.raises(TypeError, match=r"Got \(4, 4.0\), whose entry 1 is 4.0 of type float"):  # which entry
        bs.BlockSparseMatrix.from_dense(np.ones((8, 8), np.float32), (4, 4.0))
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
    with pytest.raises(TypeError, match=r"bool \(or 0 / 1 integer\) block mask. Got dtype float64"):
        bs.BlockSparseMatrix.from_mask(np.full((2, 2), 0.5), jnp.ones((8, 8)), 4)  # a score map, not a mask
    with pytest.raises(ValueError, match=r"0 / 1 block mask. Got values \[2\]"):
        bs.BlockSparseMatrix.from_mask(np.array([[2, 0], [0, 1]]), jnp.ones((8, 8)), 4)
    assert bs.BlockSparseMatrix.from_mask(np.eye(2, dtype=np.int8), jnp.ones((8, 8)), 4).nnz_blocks == 2
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
    with pytest.raises(TypeError, match="integer block cols. Got dtype float32"):
        bs.DynamicBlockSparseMatrix(jnp.zeros(3, jnp.int32), jnp.zeros(3), blocks, 3, (8, 8))
    with pytest.raises(ValueError, match=r"block_size \(4, 4\) to divide the shape \(8, 6\)"):
        bs.DynamicBlockSparseMatrix.from_blocks([0], [0], blocks[:1], shape=(8, 6))


def test_generators_reject_bad_density():
    for gen in (bs.BlockPattern.random, bs.BlockPattern.power_law):
        for d in (1.5, -0.5):
            with pytest.raises(ValueError, match=rf"density in \[0, 1\]. Got {d}"):
                gen(0, (64, 64), 16, d)


@given(bst.invalid_block_sizes())
def test_block_sizes_are_positive_ints_everywhere(bad):
    """No silent truncation (2.5 -> 2), parsing ('4' -> 4) or bool (True -> 1), in every constructor."""
    expected = r"Expected block_size as a positive int or a pair \(bh, bw\) of positive ints. Got "
    error = (TypeError, ValueError)
    builders = (
        lambda b: bs.random(jax.random.key(0), (8, 8), b, 0.5),
        lambda b: bs.BlockSparseMatrix.from_dense(np.ones((8, 8), np.float32), b),
        lambda b: bs.BlockSparseMatrix.from_mask(np.ones((2, 2), bool), jnp.ones((8, 8)), b),
        lambda b: bs.BlockPattern.from_mask(np.ones((2, 2), bool), b),
        lambda b: bs.BlockPattern.random(0, (8, 8), b, 0.5),
        lambda b: bs.DynamicBlockSparseMatrix(jnp.zeros(1, jnp.int32), jnp.zeros(1, jnp.int32),
                                              jnp.ones((1, 4, 4)), 1, (8, 8), b),
        lambda b: bs.prune.magnitude(np.ones((8, 8), np.float32), b, 0.5),
    )  # fmt: skip
    for i, build in enumerate(builders):
        if bad is None and i == 5:
            continue  # DynamicBlockSparseMatrix(..., block_size=None) means "the data's block shape"
        with pytest.raises(error, match=expected):
            build(bad)


def test_block_sizes_accept_numpy_ints():
    W = bs.random(jax.random.key(0), (16, 16), np.int64(4), 0.5)
    assert W.block_size == (4, 4) and all(type(b) is int for b in W.block_size)
    assert bs.random(jax.random.key(0), (16, 16), (np.int32(8), 4), 0.5).block_size == (8, 4)
    assert bs.random(jax.random.key(0), (16, 16), [2, 4], 0.5).block_size == (2, 4)
    assert bs.random(jax.random.key(0), (16, 16), np.array([2, 4]), 0.5).block_size == (2, 4)


def test_dynamic_coordinates_never_wrap_around():
    blocks = jnp.ones((2, 4, 4))
    for big in (2**32 + 1, 2**31, -(2**31) - 1):
        with pytest.raises(ValueError, match=rf"block rows within int32 range. Got {big}"):
            bs.DynamicBlockSparseMatrix.from_blocks(np.array([big, 0]), [0, 1], blocks, shape=(8, 8))
        with pytest.raises(ValueError, match=rf"block cols within int32 range. Got {big}"):
            bs.DynamicBlockSparseMatrix(jnp.zeros(2, jnp.int32), [0, big], blocks, 2, (8, 8))
    with pytest.raises(TypeError, match="integer block rows. Got dtype float64"):
        bs.DynamicBlockSparseMatrix.from_blocks([0.7, 1.9], [0, 1], blocks, shape=(8, 8))
    with pytest.raises(TypeError, match="integer block cols. Got dtype float32"):
        jax.jit(lambda c: bs.DynamicBlockSparseMatrix.from_blocks(jnp.array([0, 1]), c, blocks, shape=(8, 8)))(
            jnp.array([0.0, 1.0])
        )
    # Traced 64-bit coordinates cannot raise: out of int32 range they are invalid, never wrapped into range.
    with jax.enable_x64(True):

        @jax.jit
        def f(rows, x):
            D = bs.DynamicBlockSparseMatrix.from_blocks(rows, jnp.array([0, 1]), blocks, shape=(8, 8))
            return D.is_valid(), D @ x

        for rows in ([2**32 + 1, 0], [0, -(2**32) + 1], [2**31, 1]):
            valid, y = f(jnp.array(rows, jnp.int64), jnp.ones((8, 2)))
            assert not bool(valid) and bool(jnp.isnan(y).all()), rows
        valid, y = f(jnp.array([1, 0], jnp.int64), jnp.ones((8, 2)))
        assert bool(valid) and float(y.sum()) == 64.0
        nnz_bad = jax.jit(
            lambda n: bs.DynamicBlockSparseMatrix.from_blocks([0], [0], blocks[:1], n, shape=(8, 8)).is_valid()
        )
        assert not bool(nnz_bad(jnp.int64(2**32 + 1)))
