"""The jit-able redistributor: its work list, executed unit by unit, equals the dense product."""

import jax
import jax.numpy as jnp
import numpy as np
from helpers import examples
from hypothesis import given, settings
from hypothesis import strategies as st

import blocksparse as bs
from blocksparse.ops.matmul.schedule import dynamic_max_len, execute_dsd, redistribute
from blocksparse.testing import strategies as bst
from blocksparse.testing.oracles import assert_close, to_dense64


def _invariants(s, D, keep):
    """Every kept block in exactly one unit; every row written directly once or from partials."""
    start, length, dest = (np.asarray(a) for a in (s.unit_start, s.unit_len, s.unit_dest))
    ids = np.asarray(s.block_id)
    covered = np.zeros(D.capacity, int)
    for st_, ln in zip(start, length, strict=True):
        np.add.at(covered, ids[st_ : st_ + ln], 1)
    np.testing.assert_array_equal(covered, keep.astype(int))
    assert (length <= s.max_len).all()
    gm = s.num_rows
    direct = np.bincount(dest[dest >= 0], minlength=gm)
    split = np.zeros(gm, int)
    sr = np.asarray(s.split_rows)
    split[sr[sr < gm]] = 1
    np.testing.assert_array_equal(direct + split, np.ones(gm, int))


@settings(max_examples=examples(20))
@given(bst.dynamic_block_sparse_matrices(max_capacity=40), st.sampled_from([None, 1, 2, 4, 8]), st.data())
def test_redistribute_matches_dense(D, max_len, data):
    keep = np.asarray(D.active())
    sched = jax.jit(lambda r, c, k: redistribute(r, c, k, D.grid[0], max_len))(D.rows, D.cols, D.active())
    _invariants(sched, D, keep)
    x = data.draw(bst.dense_arrays((D.shape[1], 3)))
    w64 = to_dense64(D)
    y = jax.jit(execute_dsd)(sched, D.data, jnp.asarray(x))  # eagerly: every op compiled apart for each example
    assert_close(y, w64 @ x, np.abs(w64) @ np.abs(x), jnp.float32)


def test_one_long_row_is_split_and_recombined():
    cap, gm = 64, 8
    rows = jnp.zeros(cap, jnp.int32).at[-4:].set(jnp.arange(4))
    cols = jnp.arange(cap, dtype=jnp.int32) % 8
    D = bs.DynamicBlockSparseMatrix.from_blocks(rows, cols, jnp.ones((cap, 4, 4)), shape=(gm * 4, 32))
    s = redistribute(D.rows, D.cols, D.active(), gm, max_len=8)
    assert int((np.asarray(s.unit_dest) < 0).sum()) >= 60 // 8  # row 0 spans several units
    y = execute_dsd(s, D.data, jnp.ones((32, 2)))
    np.testing.assert_allclose(y[:4, 0], 61 * 4.0)  # 60 blocks plus rows[-4] == 0
    np.testing.assert_allclose(y[4:16, 0], 4.0)
    np.testing.assert_allclose(y[16:, 0], 0.0)


def test_dynamic_max_len():
    assert dynamic_max_len(1024, 64) == 32
    assert dynamic_max_len(10, 1000) == 4
    assert dynamic_max_len(1 << 20, 16) == 64
