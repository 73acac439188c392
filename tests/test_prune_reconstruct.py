"""Reconstruction pruning (bs.prune.reconstruct, bs.prune.refit) and balanced patterns (balance=).

The oracles are NumPy float64: np.linalg.lstsq per output column for the re-fit, the damped objective
tr((W - W')^T (X^T X + lambda I) (W - W')) for comparing patterns, and brute force over every pattern
where inputs are uncorrelated (the optimum is then known exactly).
"""

import itertools
import re

import jax
import numpy as np
import pytest
from helpers import examples
from hypothesis import given, settings
from hypothesis import strategies as st

import blocksparse as bs

BLOCKS = [(1, 1), (2, 4), (4, 2), (4, 4)]
# The fixed-input tests share one shape (one compiled program each): w (16, 8) in blocks of (4, 2), a 4 x 4 grid.
N, K, BLOCK, GRID = 16, 8, (4, 2), (4, 4)


def calibration(rng, rows, n, corr=0.7):
    """Correlated inputs with unevenly scaled features, as a layer's activations are."""
    z = rng.standard_normal((rows, n))
    mix = np.eye(n) + corr * rng.standard_normal((n, n)) / np.sqrt(n)
    return (z @ mix * rng.uniform(0.2, 3.0, n)).astype(np.float32)


def hessian(x, damp):
    x = np.asarray(x, np.float64)
    h = x.T @ x
    return h + damp * np.mean(np.diag(h)) * np.eye(len(h))


def objective(w, pruned, x, damp, y=None):
    """The damped reconstruction error of ``pruned`` (a matrix or a dense array), in float64:
    ``||Y - X W'||^2 + lambda ||W' - w||^2`` less its value at ``W' = w`` (``Y = X w`` by default)."""
    p = pruned.to_dense() if isinstance(pruned, bs.BlockSparseMatrix) else pruned
    p, w, x = (np.asarray(a, np.float64) for a in (p, w, x))
    d = p - w
    if y is None:
        return float(np.sum(d * (hessian(x, damp) @ d)))
    lam = damp * np.mean(np.sum(x * x, axis=0))
    y = np.asarray(y, np.float64)
    return float(np.sum(np.square(y - x @ p)) + lam * np.sum(d * d) - np.sum(np.square(y - x @ w)))


def lstsq_refit(w, x, mask, block, damp, y=None):
    """Per output column: least squares on its kept rows, ``[X_K; sqrt(lambda) I] v ~ [Y; sqrt(lambda) w_K]``
    (``Y = X w`` by default)."""
    w, x = np.asarray(w, np.float64), np.asarray(x, np.float64)
    y = x @ w if y is None else np.asarray(y, np.float64)
    lam = damp * np.mean(np.sum(x * x, axis=0))
    keep = np.kron(mask, np.ones(block, bool))
    out = np.zeros_like(w)
    for j in range(w.shape[1]):
        k = np.flatnonzero(keep[:, j])
        if k.size == 0:
            continue
        a = np.vstack([x[:, k], np.sqrt(lam) * np.eye(k.size)])
        b = np.concatenate([y[:, j], np.sqrt(lam) * w[k, j]])
        out[k, j] = np.linalg.lstsq(a, b, rcond=None)[0]
    return out


def assert_balanced(mask, balance, count):
    if balance == "rows":
        np.testing.assert_array_equal(mask.sum(axis=1), count)
    elif balance == "cols":
        np.testing.assert_array_equal(mask.sum(axis=0), count)
    else:
        assert mask.sum() == count


# -- the re-fit --------------------------------------------------------------------------------------
@pytest.mark.parametrize("rows, damp", [(48, 0.0), (48, 0.01), (8, 0.05)], ids=["exact", "damped", "few-rows"])
def test_refit_equals_least_squares_per_output_column(rows, damp):
    rng = np.random.default_rng(rows)
    w = rng.standard_normal((N, K)).astype(np.float32)
    x = calibration(rng, rows, N)
    mask = rng.random(GRID) < 0.5
    mask[:, 0], mask[:, 1] = False, True  # a block column with nothing kept, one with everything
    got = bs.prune.refit(w, x, bs.BlockPattern.from_mask(mask, BLOCK), damp=damp)
    assert got.pattern == bs.BlockPattern.from_mask(mask, BLOCK) and got.dtype == w.dtype
    want = lstsq_refit(w, x, mask, BLOCK, damp)
    scale = np.abs(want).max()
    np.testing.assert_allclose(np.asarray(got.to_dense()), want, atol=2e-4 * scale, rtol=1e-3)
    if damp == 0:  # an exact least-squares fit: the residual is orthogonal to every kept input
        r = x.astype(np.float64) @ (np.asarray(got.to_dense(), np.float64) - w)
        g = x.astype(np.float64).T @ r * np.kron(mask, np.ones(BLOCK))
        assert np.abs(g).max() < 1e-3 * np.abs(x.T @ (x @ w)).max()
    # The matrix works as the pattern too.
    again = bs.prune.refit(w, x, got, damp=damp)
    np.testing.assert_array_equal(np.asarray(again.to_dense()), np.asarray(got.to_dense()))


# -- the chosen pattern ------------------------------------------------------------------------------
@settings(max_examples=examples(20))
@given(st.sampled_from(BLOCKS), st.integers(1, 4), st.integers(1, 4), st.sampled_from([None, "rows", "cols"]),
       st.sampled_from(["tall", "short"]), st.sampled_from([0.0, 0.01, 0.1]), st.sampled_from(bs.prune.METHODS),
       st.data())  # fmt: skip
def test_reconstruct_never_does_worse_than_magnitude(block, gm, gk, balance, rows, damp, method, data):
    bh, bw = block
    if balance == "rows":
        method = "sequential"  # the only one that takes it
    n, k = gm * bh, gk * bw
    if rows == "short" and damp == 0:
        damp = 0.01  # fewer rows than inputs need dampening (tested on its own below)
    seed = data.draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k)).astype(np.float32)
    x = calibration(rng, 3 * n if rows == "tall" else max(1, n // 2), n)
    lines = {None: gm * gk, "rows": gk, "cols": gm}[balance]
    count = data.draw(st.integers(1, lines))  # down to the minimum: one block (per row / column)
    density = count / lines
    W = bs.prune.reconstruct(w, x, block, density, damp=damp, balance=balance, method=method)
    mask = W.pattern.mask()
    assert_balanced(mask, balance, count)
    M = bs.prune.magnitude(w, block, density, balance=balance)
    err = objective(w, W, x, damp)
    tol = 1e-4 * objective(w, np.zeros_like(w), x, damp) + 1e-6
    assert err <= objective(w, bs.prune.refit(w, x, M, damp=damp), x, damp) + tol
    assert err <= objective(w, M, x, damp) + tol
    # The values are the exact re-fit of the chosen pattern.
    np.testing.assert_allclose(np.asarray(W.to_dense()), lstsq_refit(w, x, mask, block, damp),
                               atol=5e-3 * max(1.0, np.abs(w).max()), rtol=5e-3)  # fmt: skip


def greedy_oracle(w, x, count, block, damp, balance):
    """One block at a time, the removal that raises the exactly re-fitted objective least (NumPy least squares; the
    objective is a sum over block columns, so a candidate changes only its own column's term)."""
    bw = block[1]

    def err(m, c):  # block column c's term
        wc = w[:, c * bw : (c + 1) * bw]
        return objective(wc, lstsq_refit(wc, x, m[:, c : c + 1], block, damp), x, damp)

    mask = np.ones(GRID, bool)
    col_err = [err(mask, c) for c in range(GRID[1])]
    while mask.sum() > (count if balance is None else count * GRID[1]):
        best = None
        for r, c in zip(*np.nonzero(mask), strict=True):
            if balance == "cols" and mask[:, c].sum() <= count:
                continue
            m = mask.copy()
            m[r, c] = False
            e = err(m, c)
            if best is None or e - col_err[c] < best[0]:
                best = (e - col_err[c], m, c, e)
        _, mask, c, col_err[c] = best
    return mask, sum(col_err)


@pytest.mark.parametrize("balance", [None, "cols"])
def test_greedy_removes_the_cheapest_block_at_every_step(balance):
    # method="greedy" is the one-block-at-a-time greedy on the exact re-fitted objective (the NumPy oracle
    # re-fits by least squares after every candidate removal); its downdates are exact, so the masks agree.
    rng = np.random.default_rng(5 if balance is None else 6)
    w = rng.standard_normal((N, K)).astype(np.float32)
    x = calibration(rng, 48, N)
    count = 5 if balance is None else 1
    W = bs.prune.reconstruct(w, x, BLOCK, count / (16 if balance is None else 4), balance=balance, method="greedy")
    want, err = greedy_oracle(w, x, count, BLOCK, 0.01, balance)
    got = objective(w, W, x, 0.01)
    np.testing.assert_array_equal(W.pattern.mask(), want)
    assert got == pytest.approx(err, rel=1e-4)


# -- target outputs (y_calib) ------------------------------------------------------------------------
@settings(max_examples=examples(10))
@given(st.sampled_from([None, "rows", "cols"]), st.sampled_from([0.0, 0.01, 0.1]), st.floats(0.0, 1.0), st.data())
def test_targets_refit_is_least_squares_and_reconstruct_beats_magnitude(balance, damp, noise, data):
    # y_calib: the outputs of another weight plus noise, as a pruned model's inputs against the dense model's outputs.
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    w = rng.standard_normal((N, K)).astype(np.float32)
    x = calibration(rng, 48, N)
    y = (x @ (w + 0.5 * rng.standard_normal((N, K))) + noise * rng.standard_normal((48, K))).astype(np.float32)
    mask = rng.random(GRID) < 0.5
    got = bs.prune.refit(w, x, bs.BlockPattern.from_mask(mask, BLOCK), damp=damp, y_calib=y)
    want = lstsq_refit(w, x, mask, BLOCK, damp, y)
    np.testing.assert_allclose(np.asarray(got.to_dense()), want, atol=5e-4 * np.abs(want).max(), rtol=1e-3)
    lines = {None: GRID[0] * GRID[1], "rows": GRID[1], "cols": GRID[0]}[balance]
    count = data.draw(st.integers(1, lines))
    W = bs.prune.reconstruct(w, x, BLOCK, count / lines, damp=damp, balance=balance, y_calib=y)
    assert_balanced(W.pattern.mask(), balance, count)
    M = bs.prune.magnitude(w, BLOCK, count / lines, balance=balance)
    err = objective(w, W, x, damp, y)
    tol = 1e-4 * abs(objective(w, np.zeros_like(w), x, damp, y)) + 1e-6
    assert err <= objective(w, bs.prune.refit(w, x, M, damp=damp, y_calib=y), x, damp, y) + tol
    assert err <= objective(w, M, x, damp, y) + tol
    np.testing.assert_allclose(np.asarray(W.to_dense()), lstsq_refit(w, x, W.pattern.mask(), BLOCK, damp, y),
                               atol=5e-3 * max(1.0, np.abs(w).max()), rtol=5e-3)  # fmt: skip
    # The layer's own outputs as targets change nothing: the same blocks and, on the calibration inputs, the same
    # outputs (the weights themselves only up to the inputs' conditioning: with damp=0 and H's condition number near
    # 1e5, the float32 rounding of x @ w moves a weight by 1e-3 where the outputs move by 1e-6 of their scale)
    same = bs.prune.reconstruct(w, x, BLOCK, count / lines, damp=damp, balance=balance, y_calib=x @ w)
    own = bs.prune.reconstruct(w, x, BLOCK, count / lines, damp=damp, balance=balance)
    assert same.pattern == own.pattern
    out_same, out_own = x @ np.asarray(same.to_dense()), x @ np.asarray(own.to_dense())
    np.testing.assert_allclose(out_same, out_own, rtol=2e-3, atol=2e-5 * np.abs(out_own).max())
    if damp > 0:  # damped, H is well conditioned: the weights agree too
        np.testing.assert_allclose(np.asarray(same.to_dense()), np.asarray(own.to_dense()), rtol=2e-3, atol=2e-4)


@pytest.mark.parametrize("balance", [None, "rows", "cols"])
def test_full_density_returns_the_weights(balance):
    rng = np.random.default_rng(1)
    w = rng.standard_normal((N, K)).astype(np.float32)
    W = bs.prune.reconstruct(w, calibration(rng, 48, N), BLOCK, 1.0, balance=balance)
    assert W.nnz_blocks == GRID[0] * GRID[1]
    np.testing.assert_allclose(np.asarray(W.to_dense()), w, rtol=1e-6, atol=1e-6)
    assert bs.prune.reconstruct(w, calibration(rng, 48, N), BLOCK, 0.0, balance=balance).nnz_blocks == 0  # as magnitude


@pytest.mark.parametrize("balance", [None, "rows", "cols"])
def test_uncorrelated_inputs_keep_the_optimal_blocks_at_every_density(balance):
    # With orthogonal input columns H is diagonal: dropping a block costs sum h_ii w_ij^2 over it, nothing can
    # compensate, so the best pattern keeps the blocks of largest such cost and the re-fit leaves the values alone.
    rng = np.random.default_rng(2)
    w = rng.standard_normal((N, K)).astype(np.float32)
    q, _ = np.linalg.qr(rng.standard_normal((48, N)))
    x = (q * rng.uniform(0.3, 3.0, N)).astype(np.float32)
    damp = 0.01
    cost = np.diag(hessian(x, damp))[:, None] * np.asarray(w, np.float64) ** 2
    scores = cost.reshape(GRID[0], BLOCK[0], GRID[1], BLOCK[1]).sum(axis=(1, 3))
    lines = {None: GRID[0] * GRID[1], "rows": GRID[1], "cols": GRID[0]}[balance]
    for count in range(1, lines + 1):  # from the minimum, one block (per row / column), up
        W = bs.prune.reconstruct(w, x, BLOCK, count / lines, damp=damp, balance=balance)
        mask = W.pattern.mask()
        np.testing.assert_array_equal(mask, bs.prune.top_blocks(scores, count, balance), err_msg=f"count={count}")
        keep = np.kron(mask, np.ones(BLOCK, bool))
        np.testing.assert_allclose(np.asarray(W.to_dense())[keep], w[keep], rtol=1e-4, atol=1e-5)
        if balance is None and (count <= 2 or count >= lines - 1):  # brute force: no pattern of that size does better
            best = min(objective(w, np.where(np.kron(m, np.ones(BLOCK, bool)), w, 0), x, damp)
                       for m in _masks(GRID, count))  # fmt: skip
            assert objective(w, W, x, damp) <= best * (1 + 1e-5) + 1e-9


def _masks(grid, count):
    for keep in itertools.combinations(range(grid[0] * grid[1]), count):
        m = np.zeros(grid[0] * grid[1], bool)
        m[list(keep)] = True
        yield m.reshape(grid)


def test_inputs_that_never_fire_lose_their_blocks_first():
    # Inputs 8..15 are always zero: their blocks cost nothing to drop, however large their weights (but for the
    # dampening, lambda ||W - W'||^2, kept small here).
    rng = np.random.default_rng(3)
    x = np.zeros((48, N), np.float32)
    x[:, :8] = rng.standard_normal((48, 8))
    w = rng.standard_normal((N, K)).astype(np.float32)
    w[8:] *= 10.0
    W = bs.prune.reconstruct(w, x, BLOCK, 0.5, damp=1e-6)
    np.testing.assert_array_equal(W.pattern.mask(), [[True] * 4] * 2 + [[False] * 4] * 2)
    assert not bs.prune.magnitude(w, BLOCK, 0.5).pattern.mask()[:2].any()  # magnitude keeps the idle ones
    assert bs.prune.reconstruction_error(w, W, x) < 1e-10
    assert bs.prune.reconstruction_error(w, bs.prune.magnitude(w, BLOCK, 0.5), x) == pytest.approx(1.0)
    half = bs.prune.reconstruct(w.astype(np.float16), x, BLOCK, 0.5, damp=1e-6)
    assert half.dtype == np.float16 and half.pattern == W.pattern


# -- bad input ---------------------------------------------------------------------------------------
def test_reconstruct_bad_input_says_what_is_wrong():
    rng = np.random.default_rng(4)
    w = rng.standard_normal((N, K)).astype(np.float32)
    x = calibration(rng, 48, N)
    with pytest.raises(ValueError, match=r"x of shape \(rows, 16\).*\(16, 8\).*Got shape \(48, 4\)"):
        bs.prune.reconstruct(w, x[:, :4], BLOCK, 0.5)
    with pytest.raises(ValueError, match=r"at least one calibration row.*\(0, 16\)"):
        bs.prune.reconstruct(w, x[:0], BLOCK, 0.5)
    bad = x.copy()
    bad[7, 3] = np.nan
    with pytest.raises(ValueError, match=r"finite calibration inputs x. Got nan at row 7, column 3"):
        bs.prune.reconstruct(w, bad, BLOCK, 0.5)
    bad[7, 3] = np.inf
    with pytest.raises(ValueError, match=r"Got inf at row 7, column 3"):
        bs.prune.refit(w, bad, bs.prune.magnitude(w, BLOCK, 0.5))
    with pytest.raises(ValueError, match=r"3 rows for 16 input features make X\^T X singular; use damp > 0"):
        bs.prune.reconstruct(w, x[:3], BLOCK, 0.5, damp=0.0)
    bs.prune.reconstruct(w, x[:3], BLOCK, 0.5)  # the default dampening makes it work
    with pytest.raises(ValueError, match="positive definite.*calibration inputs are all zero"):
        bs.prune.reconstruct(w, np.zeros_like(x), BLOCK, 0.5)
    with pytest.raises(ValueError, match=r"damp a finite float >= 0. Got -0.1"):
        bs.prune.reconstruct(w, x, BLOCK, 0.5, damp=-0.1)
    with pytest.raises(ValueError, match=r"balance None, 'rows' or 'cols'. Got 'row'"):
        bs.prune.reconstruct(w, x, BLOCK, 0.5, balance="row")
    with pytest.raises(TypeError, match="floating-point calibration inputs x. Got dtype int32"):
        bs.prune.reconstruct(w, x.astype(np.int32), BLOCK, 0.5)
    w_bad = w.copy()
    w_bad[5, 1] = np.nan
    with pytest.raises(ValueError, match=r"w without NaN. Got NaN in block \(1, 0\)"):
        bs.prune.reconstruct(w_bad, x, BLOCK, 0.5)
    w_bad[5, 1] = np.inf
    with pytest.raises(ValueError, match=r"finite weight w. Got inf in block \(1, 0\)"):
        bs.prune.reconstruct(w_bad, x, BLOCK, 0.5)
    with pytest.raises(ValueError, match=r"balance='rows': every block row keeps round\(density \* 4\) blocks"):
        bs.prune.reconstruct(w, x, BLOCK, 0.1, balance="rows")
    with pytest.raises(ValueError, match=r"pattern of the weight's shape \(16, 8\). Got \(16, 4\)"):
        bs.prune.refit(w, x, bs.prune.magnitude(w[:, :4], BLOCK, 0.5).pattern)
    with pytest.raises(ValueError, match=r"y_calib of shape \(48, 8\) .*Got shape \(48, 4\)"):
        bs.prune.reconstruct(w, x, BLOCK, 0.5, y_calib=(x @ w)[:, :4])
    y_bad = x @ w
    y_bad[2, 5] = np.nan
    with pytest.raises(ValueError, match=r"finite target outputs y_calib. Got nan at row 2, column 5"):
        bs.prune.refit(w, x, bs.prune.magnitude(w, BLOCK, 0.5), y_calib=y_bad)
    with pytest.raises(TypeError, match="floating-point target outputs y_calib. Got dtype int32"):
        bs.prune.reconstruct(w, x, BLOCK, 0.5, y_calib=(x @ w).astype(np.int32))
    with pytest.raises(ValueError, match=r"method in \('sequential', 'greedy'\). Got 'obc'"):
        bs.prune.reconstruct(w, x, BLOCK, 0.5, method="obc")
    with pytest.raises(ValueError, match=r"balance None or 'cols' with method='greedy'.*Got balance='rows'"):
        bs.prune.reconstruct(w, x, BLOCK, 0.5, method="greedy", balance="rows")
    with pytest.raises(TypeError, match=r"bs.prune.reconstruct: expected w as concrete host data"):
        jax.jit(lambda w: bs.prune.reconstruct(w, x, BLOCK, 0.5))(w)


# -- balanced patterns -------------------------------------------------------------------------------
@settings(max_examples=examples(20))
@given(st.sampled_from(BLOCKS), st.integers(1, 5), st.integers(1, 5), st.sampled_from(["rows", "cols"]),
       st.sampled_from([0.0, 0.3, 0.5, 0.8, 1.0]), st.data())  # fmt: skip
def test_magnitude_balanced_keeps_the_top_blocks_of_every_line(block, gm, gk, balance, density, data):
    bh, bw = block
    w = data.draw(bs.testing.strategies.dense_arrays((gm * bh, gk * bw)))
    per = gk if balance == "rows" else gm
    if density > 0 and round(density * per) == 0:
        with pytest.raises(ValueError, match=rf"balance='{balance}'.*keeps 0 blocks"):
            bs.prune.magnitude(w, block, density, balance=balance)
        return
    W = bs.prune.magnitude(w, block, density, balance=balance)
    mask = W.pattern.mask()
    assert_balanced(mask, balance, round(density * per))
    scores = bs.prune.block_norms(w, block)
    m, s = (mask, scores) if balance == "rows" else (mask.T, scores.T)
    for line_mask, line in zip(m, s, strict=True):  # within each line the kept blocks are the largest
        if line_mask.any() and (~line_mask).any():
            assert line[line_mask].min() >= line[~line_mask].max()
    keep = np.kron(mask, np.ones(block, bool))
    np.testing.assert_array_equal(np.asarray(W.to_dense())[keep], w[keep])


def test_magnitude_global_balanced_spreads_each_weights_count():
    rng = np.random.default_rng(5)
    ws = [rng.standard_normal((16, 16)).astype(np.float32), 0.1 * rng.standard_normal((16, 32)).astype(np.float32)]
    plain = bs.prune.magnitude_global(ws, 4, 0.5)
    for balance, axis in (("rows", 1), ("cols", 0)):
        mats = bs.prune.magnitude_global(ws, 4, 0.5, balance=balance)
        for W, P, w in zip(mats, plain, ws, strict=True):
            mask = W.pattern.mask()
            lines = mask.shape[1 - axis]
            assert_balanced(mask, balance, max(1, round(P.nnz_blocks / lines)))
            assert mask.sum(axis=axis)[0] >= 1
            np.testing.assert_array_equal(mask, bs.prune.top_blocks(bs.prune.block_norms(w, 4), mask.sum(axis=axis)[0],
                                                                    balance))  # fmt: skip
    assert plain[0].nnz_blocks > plain[1].nnz_blocks  # the larger weight keeps more, balanced or not


def test_top_blocks_ties_and_bad_counts():
    scores = np.ones((2, 3))
    np.testing.assert_array_equal(bs.prune.top_blocks(scores, 2), [[True, True, False], [False, False, False]])
    np.testing.assert_array_equal(bs.prune.top_blocks(scores, 1, "rows"), [[True, False, False], [True, False, False]])
    np.testing.assert_array_equal(bs.prune.top_blocks(scores, 1, "cols"), [[True, True, True], [False, False, False]])
    with pytest.raises(ValueError, match=re.escape("count in [0, 3] for balance='rows' on a 2 x 3 grid. Got 4")):
        bs.prune.top_blocks(scores, 4, "rows")
