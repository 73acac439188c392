"""Sparse training with a block mask that changes every step: ``bs.prune.rigl_update``."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import sweep

import blocksparse as bs


def _matrix(rng, grid, cap, block, dtype=np.float32):
    """A dynamic matrix of ``cap`` distinct random positions with blocks of distinct norms."""
    gm, gk = grid
    pos = rng.choice(gm * gk, cap, replace=False)
    blocks = rng.standard_normal((cap, block, block)).astype(dtype)
    blocks *= rng.permutation(np.arange(1, cap + 1))[:, None, None].astype(dtype)  # distinct norms
    return bs.DynamicBlockSparseMatrix.from_blocks(pos // gk, pos % gk, blocks, shape=(gm * block, gk * block))


def _positions(D):
    return [(int(r), int(c)) for r, c in zip(np.asarray(D.rows), np.asarray(D.cols), strict=True)]


@sweep("drop_fraction, num_candidates", [(0.25, None), (0.5, 9), (0.1, 20)])
def test_rigl_update_matches_numpy_oracle(drop_fraction, num_candidates):
    rng = np.random.default_rng(0)
    grid, cap, b = (6, 5), 10, 4
    D = _matrix(rng, grid, cap, b)
    x = rng.standard_normal((7, grid[0] * b)).astype(np.float32)
    dy = rng.standard_normal((7, grid[1] * b)).astype(np.float32)
    seen = {}

    def dense_grad(C):
        seen["C"] = C
        return bs.sdd(x.T, dy, C, precision="highest").data

    new = bs.prune.rigl_update(D, jax.random.key(3), drop_fraction=drop_fraction, dense_grad=dense_grad,
                               num_candidates=num_candidates)  # fmt: skip
    k = round(drop_fraction * cap)
    nc = min(2 * k, grid[0] * grid[1] - cap) if num_candidates is None else num_candidates
    old_pos, new_pos = _positions(D), _positions(new)
    data, new_data = np.asarray(D.data), np.asarray(new.data)

    # Candidates: nc distinct positions that D does not hold, with zero data.
    C = seen["C"]
    cand = _positions(C)
    assert C.capacity == nc and int(C.nnz) == nc and len(set(cand)) == nc
    assert not set(cand) & set(old_pos)
    assert not np.asarray(C.data).any()

    # Dropped: the k slots of smallest L2 norm.
    norms = np.sqrt((data.astype(np.float64) ** 2).sum(axis=(1, 2)))
    dropped = sorted(np.argsort(norms)[:k].tolist())
    changed = [i for i in range(cap) if old_pos[i] != new_pos[i]]
    assert changed == dropped

    # Kept slots unchanged (coordinates and values); regrown blocks are zeros.
    kept = [i for i in range(cap) if i not in dropped]
    np.testing.assert_array_equal(new_data[kept], data[kept])
    assert [new_pos[i] for i in kept] == [old_pos[i] for i in kept]
    assert not new_data[dropped].any()

    # Grown: the top-k candidates by the L2 norm of the dense gradient x.T @ dy at their block.
    g = x.astype(np.float64).T @ dy
    gnorm = {(r, c): np.linalg.norm(g[r * b : (r + 1) * b, c * b : (c + 1) * b]) for r, c in cand}
    top = sorted(cand, key=lambda p: -gnorm[p])[:k]
    assert sorted(new_pos[i] for i in dropped) == sorted(top)
    # The smallest block goes to the candidate with the largest gradient.
    assert new_pos[int(np.argmin(norms))] == top[0]

    # No duplicates; shapes, capacity, nnz and dtype unchanged.
    assert len(set(new_pos)) == cap
    assert new.capacity == cap and int(new.nnz) == cap and new.dtype == D.dtype
    assert new.shape == D.shape and new.block_size == D.block_size


def test_rigl_update_candidates_are_uniform_over_free_positions():
    rng = np.random.default_rng(1)
    D = _matrix(rng, (4, 4), 8, 2)
    held = set(_positions(D))
    counts = {}

    @jax.jit
    def cands(key):
        out = {}

        def dense_grad(C):
            out["C"] = (C.rows, C.cols)
            return jnp.zeros((C.capacity, 2, 2))

        bs.prune.rigl_update(D, key, drop_fraction=0.25, dense_grad=dense_grad)
        return out["C"]

    draws = 300
    for i in range(draws):
        r, c = cands(jax.random.key(i))
        for p in zip(np.asarray(r).tolist(), np.asarray(c).tolist(), strict=True):
            counts[p] = counts.get(p, 0) + 1
    assert not set(counts) & held
    assert len(counts) == 16 - 8  # every free position drawn
    # 4 candidates out of 8 free positions: each drawn with probability 1/2 (150 expected).
    assert all(100 < n < 200 for n in counts.values()), counts


def test_rigl_update_zero_drop_and_errors():
    rng = np.random.default_rng(2)
    D = _matrix(rng, (4, 4), 8, 4)
    assert bs.prune.rigl_update(D, jax.random.key(0), drop_fraction=0.0, dense_grad=None) is D
    assert bs.prune.rigl_update(D, jax.random.key(0), drop_fraction=0.05, dense_grad=None) is D  # k rounds to 0
    zeros = lambda C: jnp.zeros((C.capacity, 4, 4))
    with pytest.raises(ValueError, match=r"nnz == capacity == 10\). Got nnz=8"):
        padded = bs.DynamicBlockSparseMatrix.from_blocks(D.rows, D.cols, D.data, shape=D.shape, capacity=10)
        bs.prune.rigl_update(padded, jax.random.key(0), drop_fraction=0.25, dense_grad=zeros)
    with pytest.raises(ValueError, match=r"drop_fraction in \[0, 1\]"):
        bs.prune.rigl_update(D, jax.random.key(0), drop_fraction=1.5, dense_grad=zeros)
    dense_ish = _matrix(rng, (4, 4), 12, 4)
    with pytest.raises(ValueError, match="k=6 of 12 blocks, but only 4 of the 16 positions are free"):
        bs.prune.rigl_update(dense_ish, jax.random.key(0), drop_fraction=0.5, dense_grad=zeros)
    with pytest.raises(ValueError, match=r"num_candidates in \[k=2, free positions=8\]"):
        bs.prune.rigl_update(D, jax.random.key(0), drop_fraction=0.25, dense_grad=zeros, num_candidates=1)
    with pytest.raises(ValueError, match=r"blocks of shape \(4, 4, 4\)"):
        bs.prune.rigl_update(D, jax.random.key(0), drop_fraction=0.25, dense_grad=lambda C: jnp.zeros((3, 4, 4)))
    with pytest.raises(TypeError, match="DynamicBlockSparseMatrix"):
        bs.prune.rigl_update(bs.random(jax.random.key(0), (16, 16), 4, 0.5), jax.random.key(0), drop_fraction=0.25,
                             dense_grad=zeros)  # fmt: skip
    # Returning the candidate matrix itself (bs.sdd's result) is accepted; a traced nnz is assumed full.
    x, dy = jnp.ones((3, 16)), jnp.ones((3, 16))
    f = jax.jit(lambda D, key: bs.prune.rigl_update(D, key, drop_fraction=0.5, dense_grad=lambda C: bs.sdd(x.T, dy, C)))
    new = f(D, jax.random.key(0))
    moved = sum(a != b for a, b in zip(_positions(D), _positions(new), strict=True))
    assert len(set(_positions(new))) == 8 and moved == 4


# --------------------------------------------------------------------------------------------
# A tiny model trained with the mask updated every step inside one jitted step.
# --------------------------------------------------------------------------------------------
N_IN, N_HID, N_OUT, BLOCK, BATCH = 64, 64, 8, 16, 128


def _problem():
    kx, kt1, kt2, kw, kw2 = jax.random.split(jax.random.key(0), 5)
    x = jax.random.normal(kx, (BATCH, N_IN))
    t1 = jax.random.normal(kt1, (N_IN, N_HID)) / np.sqrt(N_IN)
    y = jax.nn.relu(x @ t1) @ (jax.random.normal(kt2, (N_HID, N_OUT)) / np.sqrt(N_HID))
    W = bs.random(kw, (N_IN, N_HID), BLOCK, 0.5)
    W1 = bs.DynamicBlockSparseMatrix.from_static(W.with_data(W.data / np.sqrt(N_IN * 0.5)))
    W2 = jax.random.normal(kw2, (N_HID, N_OUT)) / np.sqrt(N_HID)
    return (W1, W2), x, y


def _make_step(impl, traces, lr=0.1, drop_fraction=0.25):
    def loss_fn(data, W2, probe, W1, x, y):
        h = bs.matmul(x, W1.with_data(data), implementation=impl, precision="highest") + probe
        out = jnp.dot(jax.nn.relu(h), W2, precision="highest")
        return jnp.mean((out - y) ** 2)

    @jax.jit
    def step(params, key, x, y):
        traces.append(1)  # runs only while tracing
        W1, W2 = params
        probe = jnp.zeros((x.shape[0], W1.shape[1]))  # d loss / d probe = the output gradient of x @ W1
        loss, (g1, g2, dh) = jax.value_and_grad(loss_fn, argnums=(0, 1, 2))(W1.data, W2, probe, W1, x, y)
        W1, W2 = W1.with_data(W1.data - lr * g1), W2 - lr * g2
        dense_grad = lambda C: bs.sdd(x.T, dh, C, implementation=impl, precision="highest").data
        W1 = bs.prune.rigl_update(W1, key, drop_fraction=drop_fraction, dense_grad=dense_grad)
        return (W1, W2), loss

    return step


def _mask(D):
    m = np.zeros(D.grid, bool)
    m[np.asarray(D.rows), np.asarray(D.cols)] = True
    return m


def test_training_with_a_changing_mask_compiles_once():
    params, x, y = _problem()
    traces = []
    step = _make_step("xla", traces)
    losses, masks = [], [_mask(params[0])]
    for i in range(30):
        params, loss = step(params, jax.random.key(i), x, y)
        losses.append(float(loss))
        masks.append(_mask(params[0]))
    assert len(traces) == 1
    # The mask moves every step (k = 2 of 8 blocks), keeps its size and never holds duplicates.
    for a, b in zip(masks, masks[1:], strict=False):
        assert a.sum() == b.sum() == 8
        assert (a != b).sum() == 4
        assert len(set(_positions(params[0]))) == 8
    assert np.isfinite(losses).all()
    assert losses[-1] < 0.5 * losses[0], losses


def _warm_up_pallas_interpreter():
    # The first Pallas kernel run in this process adds settings to JAX's tracing context (lazily
    # loaded modules), so a step jitted before it would be traced once more on its second call.
    D = bs.DynamicBlockSparseMatrix.from_blocks(jnp.array([0]), jnp.array([0]), jnp.ones((1, 16, 16)), shape=(16, 16))
    with bs.interpret():
        jax.block_until_ready(jax.jit(lambda D, x: bs.matmul(D, x, implementation="pallas"))(D, jnp.ones((16, 4))))


def test_training_pallas_interpret_matches_xla():
    _warm_up_pallas_interpreter()
    params, x, y = _problem()
    out = {}
    for impl in ("xla", "pallas"):
        traces = []
        step = _make_step(impl, traces)
        p, losses = params, []
        with bs.interpret():
            for i in range(3):
                p, loss = step(p, jax.random.key(i), x, y)
                losses.append(float(loss))
        out[impl] = (losses, _positions(p[0]), np.asarray(p[0].data))
        assert len(traces) == 1
    np.testing.assert_allclose(out["pallas"][0], out["xla"][0], rtol=1e-4)
    assert out["pallas"][1] == out["xla"][1]
    np.testing.assert_allclose(out["pallas"][2], out["xla"][2], rtol=1e-4, atol=1e-5)
