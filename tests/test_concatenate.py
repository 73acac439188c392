"""``bs.concatenate``: static block-sparse matrices side by side or stacked, against ``jnp.concatenate``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import examples
from hypothesis import given, settings
from hypothesis import strategies as st

import blocksparse as bs


@settings(max_examples=examples(20), deadline=None)
@given(
    axis=st.sampled_from([0, 1]),
    grids=st.lists(st.integers(1, 4), min_size=1, max_size=4),
    other=st.integers(1, 4),
    block=st.sampled_from([(8, 8), (8, 16)]),
    density=st.sampled_from([0.0, 0.6, 1.0]),  # 0.6 keeps a block of even a one-block matrix
    dtype=st.sampled_from([jnp.float32, jnp.bfloat16]),
    seed=st.integers(0, 2**16),
)
def test_concatenate_is_the_dense_concatenation(axis, grids, other, block, density, dtype, seed):
    bh, bw = block
    mats = []
    for i, g in enumerate(grids):
        shape = (g * bh, other * bw) if axis == 0 else (other * bh, g * bw)
        mats.append(bs.random(jax.random.key(seed + i), shape, block, density, dtype))
    got = bs.concatenate(mats, axis=axis)
    want = jnp.concatenate([m.to_dense() for m in mats], axis=axis)
    assert got.dtype == jnp.dtype(dtype) and got.block_size == block
    assert got.pattern.nnz_blocks == sum(m.pattern.nnz_blocks for m in mats)
    np.testing.assert_array_equal(np.asarray(got.to_dense(), np.float32), np.asarray(want, np.float32))
    if axis == 1:  # one product, the concatenation of the products
        x = jnp.asarray(np.random.default_rng(seed).standard_normal((3, got.shape[0])), jnp.float32)
        y = bs.matmul(x, got.astype(jnp.float32))
        parts = jnp.concatenate([bs.matmul(x, m.astype(jnp.float32)) for m in mats], axis=1)
        np.testing.assert_allclose(y, parts, rtol=1e-5, atol=1e-5)


def test_concatenate_refuses_what_does_not_fit():
    a = bs.random(jax.random.key(0), (32, 32), 16, 0.5)
    with pytest.raises(ValueError, match=r"Expected equal rows \(32\). Got 48 at position 1"):
        bs.concatenate([a, bs.random(jax.random.key(1), (48, 32), 16, 0.5)])
    with pytest.raises(ValueError, match=r"Expected one block size. Got \(16, 16\) and \(8, 8\) at position 1"):
        bs.concatenate([a, bs.random(jax.random.key(1), (32, 32), 8, 0.5)])
    with pytest.raises(ValueError, match="Expected one dtype"):
        bs.concatenate([a, a.astype(jnp.bfloat16)])
    with pytest.raises(TypeError, match="Got ArrayImpl at position 1"):
        bs.concatenate([a, a.to_dense()])
    with pytest.raises(ValueError, match=r"Expected axis 0 or 1 \(or -2, -1, as jnp counts them\)\. Got 2"):
        bs.concatenate([a], axis=2)
    for neg, pos in ((-1, 1), (-2, 0)):  # as jnp.concatenate reads them
        np.testing.assert_array_equal(bs.concatenate([a, a], axis=neg).to_dense(),
                                      bs.concatenate([a, a], axis=pos).to_dense())  # fmt: skip
    with pytest.raises(ValueError, match="Got none"):
        bs.concatenate([])
