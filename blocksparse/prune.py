"""Block pruning: turn a dense weight into a block-sparse one, or move blocks during training (RigL).

- :func:`magnitude`, :func:`magnitude_global`: keep the blocks of largest norm (per matrix or ranked
  across matrices);
- :func:`reconstruct`: keep the blocks a layer's calibration inputs need most and re-fit them, so
  that ``x @ W'`` stays close to ``x @ W`` (optimal brain surgeon on blocks, as SparseGPT does on
  weights); :func:`refit` re-fits the kept values of a given pattern;
- ``balance=``: every block row (or column) keeps the same number of blocks, so the kernels' work
  units have one length;
- :func:`rigl_update`: move blocks during training.
"""

from __future__ import annotations

import functools
import math
import numbers

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ._matrix import BlockSparseMatrix, DynamicBlockSparseMatrix, check_floating, is_concrete, require_host
from ._pattern import BlockPattern, check_block_size, check_density, num_blocks
from ._util import cdiv

__all__ = [
    "BALANCES",
    "METHODS",
    "block_norms",
    "check_balance",
    "keep_count",
    "magnitude",
    "magnitude_global",
    "reconstruct",
    "reconstruction_error",
    "refit",
    "rigl_update",
    "top_blocks",
]

_ORDS = {"l1": 1, "l2": 2, "max": np.inf}

#: Values of ``balance=``: ``None`` (blocks ranked over the whole matrix), ``"rows"`` (every block row keeps
#: the same number of blocks), ``"cols"`` (every block column does).
BALANCES = (None, "rows", "cols")


def block_norms(w, block_size, norm: str = "l2") -> np.ndarray:
    """Norm of each ``bh x bw`` block of a concrete 2-D ``w``: an array of shape ``(m // bh, k // bw)``."""
    require_host("bs.prune.block_norms", w=w)
    w = np.asarray(w, np.float32)
    if w.ndim != 2:
        raise ValueError(f"Expected a 2-D weight. Got shape {w.shape}.")
    if norm not in _ORDS:
        raise ValueError(f"Expected norm in {sorted(_ORDS)}. Got {norm!r}.")
    bh, bw = check_block_size(w.shape, block_size)
    blocks = np.abs(w.reshape(w.shape[0] // bh, bh, w.shape[1] // bw, bw))
    if norm == "l1":
        return blocks.sum(axis=(1, 3))
    if norm == "max":
        return blocks.max(axis=(1, 3), initial=0.0)
    return np.sqrt((blocks.astype(np.float64) ** 2).sum(axis=(1, 3)))


def check_balance(balance) -> str | None:
    """``balance`` if it is one of :data:`BALANCES`; anything else raises."""
    if not (balance is None or (isinstance(balance, str) and balance in BALANCES)):
        raise ValueError(f"Expected balance None, 'rows' or 'cols'. Got {balance!r}.")
    return balance


def keep_count(density: float, grid: tuple[int, int], balance: str | None = None) -> int:
    """How many blocks a ``grid`` of blocks keeps at ``density``: in all (``balance=None``), per block row or column.

    ``None``: ``round(density * gm * gk)``. ``"rows"``: every block row keeps ``round(density * gk)``,
    the per-row count whose total ``gm * round(density * gk)`` is closest to ``density * gm * gk``
    (so the density is rounded to a multiple of ``1 / gk``); ``"cols"``: ``round(density * gm)``
    per block column. A positive density that rounds to no block raises (``0`` keeps none on purpose).
    """
    gm, gk = grid
    if check_balance(balance) is None:
        return num_blocks(density, gm * gk)
    per, axis = (gk, "row") if balance == "rows" else (gm, "column")
    try:
        return num_blocks(density, per)
    except ValueError as e:
        raise ValueError(f"balance={balance!r}: every block {axis} keeps round(density * {per}) blocks. {e}") from None


def top_blocks(scores, count: int, balance: str | None = None) -> np.ndarray:
    """The block mask keeping the ``count`` largest ``scores``: in all, or in every block row or column.

    ``scores`` is a host ``(gm, gk)`` array; ``balance`` is ``None`` (``count`` blocks in all), ``"rows"``
    (``count`` per block row) or ``"cols"`` (``count`` per block column). Ties go to the earlier
    position (row-major for ``None``), so the mask is deterministic.
    """
    scores = np.asarray(scores)
    if scores.ndim != 2:
        raise ValueError(f"Expected a 2-D (block rows, block columns) array of scores. Got shape {scores.shape}.")
    if np.isnan(scores).any():
        raise ValueError("Expected scores without NaN (they cannot be ranked). Got NaN.")
    gm, gk = scores.shape
    limit = {None: gm * gk, "rows": gk, "cols": gm}[check_balance(balance)]
    if not 0 <= count <= limit:
        raise ValueError(f"Expected count in [0, {limit}] for balance={balance!r} on a {gm} x {gk} grid. Got {count}.")
    mask = np.zeros((gm, gk), bool)
    if balance is None:
        mask.reshape(-1)[np.argsort(-scores.reshape(-1), kind="stable")[:count]] = True
    elif balance == "rows":
        np.put_along_axis(mask, np.argsort(-scores, axis=1, kind="stable")[:, :count], True, axis=1)
    else:
        np.put_along_axis(mask, np.argsort(-scores, axis=0, kind="stable")[:count], True, axis=0)
    return mask


def magnitude(w, block_size, density: float, *, norm: str = "l2", balance: str | None = None) -> BlockSparseMatrix:
    """Keep the ``round(density * blocks)`` blocks of ``w`` with the largest norm.

    Ties are broken by position (row-major, earlier first), so the result is deterministic. A block
    holding NaN has no rank and raises. The pattern is host data: call it outside ``jit``.

    Arguments:
        w: a concrete dense ``(m, k)`` floating array.
        block_size: ``b`` or ``(bh, bw)``, dividing ``w.shape``.
        density: fraction of blocks kept, in ``[0, 1]``; a positive density that rounds to no block
            raises (``0`` gives an empty matrix on purpose).
        norm: ``"l2"`` (default), ``"l1"`` or ``"max"``.
        balance: ``None`` (default: the largest blocks of the whole matrix), ``"rows"`` (the
            ``round(density * k // bw)`` largest of every block row) or ``"cols"`` (the
            ``round(density * m // bh)`` largest of every block column); see :func:`keep_count`. For
            ``x @ W`` (every ``bs.nn`` layer) the kernels walk ``W``'s block columns, so ``"cols"``
            gives every work unit the same length.

    Returns:
        A :class:`BlockSparseMatrix` with ``w``'s values on the kept blocks.
    """
    require_host("bs.prune.magnitude", w=w, density=density)
    w = jnp.asarray(w)
    check_floating(w.dtype, "w")
    density = check_density(density)
    check_balance(balance)
    scores = block_norms(w, block_size, norm)
    bh, bw = check_block_size(w.shape, block_size)
    _check_no_nan(scores, (bh, bw), "w")
    mask = top_blocks(scores, keep_count(density, scores.shape, balance), balance)
    return BlockSparseMatrix.from_mask(mask, w, (bh, bw))


def _check_no_nan(scores, block, what: str) -> None:
    if np.isnan(scores).any():
        r, c = (int(i) for i in np.argwhere(np.isnan(scores))[0])
        bh, bw = block
        raise ValueError(
            f"Expected {what} without NaN. Got NaN in block ({r}, {c}) (rows {r * bh}:{(r + 1) * bh}, "
            f"cols {c * bw}:{(c + 1) * bw}); its norm cannot be ranked, so it would be dropped silently."
        )


def magnitude_global(
    weights, block_size, density: float, *, norm: str = "l2", balance: str | None = None
) -> list[BlockSparseMatrix]:
    """Global block pruning: rank the blocks of all ``weights`` together and keep the largest.

    Each block is scored by its norm *divided by the norm of an all-ones block of its size*: the
    root mean square of its entries for ``"l2"`` (norm / sqrt(bh * bw)), their mean absolute value
    for ``"l1"`` (norm / (bh * bw)), the largest for ``"max"``. Scores then measure the typical
    weight magnitude in a block, so weights pruned with different block sizes compare fairly (a
    64 x 64 block is not kept just because it holds 16 times more entries than a 16 x 16 one).
    Weights are not rescaled per layer: a layer whose weights are small overall loses more blocks,
    which is the point of a global ranking.

    ``round(density * total blocks)`` blocks are kept. Every weight keeps at least its largest block
    (an empty layer would cut the network), counted in that total; a density too small for one block
    per weight raises. Ties are broken by position (weight order, then row-major), so the result is
    deterministic.

    With ``balance="rows"`` (``"cols"``) the global ranking decides how many blocks each weight keeps,
    and the balance where: a weight that the ranking gives ``n`` of its ``gm x gk`` blocks keeps the
    ``max(1, round(n / gm))`` largest of every block row (``max(1, round(n / gk))`` of every block
    column), so the total is close to, not exactly, ``round(density * total blocks)``.

    Arguments:
        weights: a sequence of concrete 2-D floating arrays.
        block_size: ``b`` or ``(bh, bw)`` for every weight, or a *list* with one of those per weight.
        density: overall fraction of blocks kept, in ``(0, 1]``.
        norm: ``"l2"`` (default), ``"l1"`` or ``"max"``.
        balance: ``None`` (default), ``"rows"`` or ``"cols"`` (see above and :func:`magnitude`).

    Returns:
        One :class:`BlockSparseMatrix` per weight, in order, with the weight's values on its kept blocks.

    Example::

        >>> import numpy as np, blocksparse as bs
        >>> big, small = np.ones((8, 8), np.float32), np.full((8, 8), 0.1, np.float32)
        >>> [W.nnz_blocks for W in bs.prune.magnitude_global([big, small], 4, 0.5)]
        [3, 1]
    """
    require_host("bs.prune.magnitude_global", density=density)
    if isinstance(weights, np.ndarray | jax.Array) or not hasattr(weights, "__len__") or len(weights) == 0:
        raise TypeError(f"Expected weights as a non-empty sequence of 2-D arrays. Got {type(weights).__name__}.")
    density = check_density(density)
    check_balance(balance)
    if norm not in _ORDS:
        raise ValueError(f"Expected norm in {sorted(_ORDS)}. Got {norm!r}.")
    sizes = list(block_size) if isinstance(block_size, list) else [block_size] * len(weights)
    if len(sizes) != len(weights):
        raise ValueError(f"Expected one block size per weight ({len(weights)}). Got {len(sizes)}.")
    ws, scores, shapes = [], [], []
    for i, (w, b) in enumerate(zip(weights, sizes, strict=True)):
        require_host("bs.prune.magnitude_global", w=w)
        w = jnp.asarray(w)
        check_floating(w.dtype, f"weights[{i}]")
        if w.ndim != 2:
            raise ValueError(f"Expected weights[{i}] 2-D. Got shape {tuple(w.shape)}.")
        bh, bw = check_block_size(w.shape, b)
        s = block_norms(w, (bh, bw), norm)
        _check_no_nan(s, (bh, bw), f"weights[{i}]")
        scale = {"l2": np.sqrt(bh * bw), "l1": float(bh * bw), "max": 1.0}[norm]
        ws.append(w)
        scores.append(np.asarray(s, np.float64) / scale)
        shapes.append((bh, bw))
    sizes_ = [s.size for s in scores]
    total = sum(sizes_)
    keep = int(round(density * total))
    if keep < len(ws):
        raise ValueError(
            f"Expected a density that keeps at least one block per weight: round(density * {total}) >= {len(ws)} "
            f"weights, i.e. density >= {(len(ws) - 0.5) / total:.4g}. Got density={density}, which keeps {keep}."
        )
    flat = np.concatenate([s.reshape(-1) for s in scores])
    offsets = np.cumsum([0, *sizes_])
    chosen = np.zeros(total, bool)
    for i, s in enumerate(scores):  # each weight's largest block first (the lowest index among ties)
        chosen[offsets[i] + int(np.argmax(s.reshape(-1)))] = True
    rest = np.argsort(np.where(chosen, np.inf, -flat), kind="stable")[: keep - len(ws)]
    chosen[rest] = True
    out = []
    for i, (w, s, bsz) in enumerate(zip(ws, scores, shapes, strict=True)):
        mask = chosen[offsets[i] : offsets[i + 1]].reshape(s.shape)
        if balance is not None:  # the ranking's count for this weight, spread evenly
            lines = s.shape[0] if balance == "rows" else s.shape[1]
            mask = top_blocks(s, max(1, int(round(mask.sum() / lines))), balance)
        out.append(BlockSparseMatrix.from_mask(mask, w, bsz))
    return out


# -- reconstruction pruning ----------------------------------------------------------------------------
_HIGHEST = lax.Precision.HIGHEST


def _dot(a, b) -> jax.Array:
    # float32 accumulation at full precision: a GPU's default float32 dot rounds to TF32, too coarse for a Hessian.
    return jnp.matmul(a, b, precision=_HIGHEST)


@jax.jit
def _hessian(x, damp) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(H, lambda, M)``: ``H = X^T X + lambda I`` with ``lambda = damp * mean(diag(X^T X))``, and the
    lower Cholesky factor ``M`` of ``H`` with its rows and columns reversed (NaN where ``H`` is not
    positive definite). :func:`_obs_mask` turns ``M`` into the upper factor of ``H^-1`` with one
    triangular inverse."""
    x = x.astype(jnp.float32)
    h = _dot(x.T, x)
    lam = damp * jnp.mean(jnp.diag(h))
    h = h + lam * jnp.eye(h.shape[0], dtype=h.dtype)
    return h, lam, jnp.linalg.cholesky(h[::-1, ::-1])


def _check_calibration(w, x) -> jax.Array:
    """``x`` on the device, checked: 2-D ``(rows >= 1, in)``, floating, finite (a bad value is located on the host)."""
    x = jnp.asarray(x)
    if x.ndim != 2 or x.shape[1] != w.shape[0]:
        raise ValueError(
            f"Expected calibration inputs x of shape (rows, {w.shape[0]}) (the weight is (in, out) = {tuple(w.shape)}, "
            f"y = x @ w). Got shape {tuple(x.shape)}."
        )
    if x.shape[0] == 0:
        raise ValueError(f"Expected at least one calibration row in x. Got shape {tuple(x.shape)}.")
    return _floating_finite(x, "calibration inputs x")


def _floating_finite(a: jax.Array, what: str) -> jax.Array:
    """``a`` (2-D) unless it is not floating point (``TypeError``) or holds NaN or inf (``ValueError`` naming the
    first such value's row and column)."""
    if not jnp.issubdtype(a.dtype, jnp.floating):
        raise TypeError(f"Expected floating-point {what}. Got dtype {a.dtype}.")
    if not bool(jnp.isfinite(a).all()):
        bad = ~np.isfinite(np.asarray(a))
        r, c = (int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"Expected finite {what}. Got {np.asarray(a[r, c])} at row {r}, column {c} "
            f"({int(bad.sum())} of {a.size} values are NaN or inf)."
        )
    return a


def _check_targets(w, x, y) -> jax.Array | None:
    """``y`` on the device, checked like ``x``: ``(rows of x, out)``, floating, finite; ``None`` stays ``None``."""
    if y is None:
        return None
    y = jnp.asarray(y)
    want = (x.shape[0], w.shape[1])
    if y.shape != want:
        raise ValueError(
            f"Expected target outputs y_calib of shape {want} (one row per calibration row, one column per output of "
            f"the (in, out) = {tuple(w.shape)} weight). Got shape {tuple(y.shape)}."
        )
    return _floating_finite(y, "target outputs y_calib")


@jax.jit
def _target_weight(w, x, y, h, damp) -> jax.Array:
    """``w* = H^-1 (X^T Y + lambda w)``, so that ``(W' - w*)^T H (W' - w*)`` is ``||X W' - Y||^2 + lambda ||W' - w||^2``
    up to a constant (``H = X^T X + lambda I`` from :func:`_hessian`)."""
    x = x.astype(jnp.float32)
    lam = damp * jnp.mean(jnp.sum(x * x, axis=0))
    rhs = _dot(x.T, y.astype(jnp.float32)) + lam * w
    return jax.scipy.linalg.cho_solve((jnp.linalg.cholesky(h), True), rhs)


def _factor(x, damp: float):
    """The damped Hessian of a reconstruction from ``x`` and its Cholesky factor, checked positive definite."""
    if isinstance(damp, bool) or not isinstance(damp, numbers.Real) or not (math.isfinite(damp) and damp >= 0):
        raise ValueError(f"Expected damp a finite float >= 0. Got {damp!r}.")
    rows, n = x.shape
    h, lam, chol = _hessian(x, float(damp))
    if not bool(jnp.isfinite(chol).all()):
        lam = float(lam)
        if lam == 0 and damp > 0:
            why = "the calibration inputs are all zero"
        elif damp == 0 and rows < n:
            why = (f"{rows} rows for {n} input features make X^T X singular; use damp > 0 (default 0.01) or more "
                   "calibration rows")  # fmt: skip
        else:
            why = "raise damp"
        raise ValueError(
            f"Expected the Hessian X^T X + lambda I ({n} x {n}, lambda = damp * mean(diag(X^T X)) = {lam:.4g}, "
            f"damp={damp}) positive definite. Its Cholesky factorisation failed with {rows} calibration rows: {why}."
        )
    return h, chol


@functools.partial(jax.jit, static_argnames=("block_size", "balance"))
def _obs_mask(w, chol, count, *, block_size, balance) -> jax.Array:
    """The ``(gm, gk)`` mask of the blocks the sequential block OBS pass keeps (step 2 of :func:`reconstruct`)."""
    bh, bw = block_size
    n, k = w.shape
    gm, gk = n // bh, k // bw
    # With J the reversal, J H J = M M^T gives H = V V^T, V = J M J upper, so H^-1 = U^T U with U = V^-1 = J M^-1 J
    # upper triangular: row block g of U is feature group g's OBS step.
    u = jax.scipy.linalg.solve_triangular(chol, jnp.eye(n, dtype=jnp.float32), lower=True)[::-1, ::-1]
    ub = u.reshape(gm, bh, gm, bh)
    # At step r the features of groups r, r + 1, ... are still free; their inverse Hessian is U^T U restricted to
    # U's rows from group r on. Its diagonal blocks, cov[r, g] (g >= r), give every undecided block's removal
    # cost ||L^-1 W[g, c]||_F^2 with L L^T = cov[r, g]; `whiten` holds those L^-1 (identity for g < r).
    cov = jnp.cumsum(jnp.einsum("aigb,aigc->agbc", ub, ub, precision=_HIGHEST)[::-1], axis=0)[::-1]
    free = jnp.arange(gm)[None, :] >= jnp.arange(gm)[:, None]  # [r, g]: group g still free at step r
    eye_b = jnp.eye(bh, dtype=jnp.float32)
    cov = jnp.where(free[..., None, None], cov, eye_b)
    whiten = jax.scipy.linalg.solve_triangular(jnp.linalg.cholesky(cov), jnp.broadcast_to(eye_b, cov.shape), lower=True)

    def ranks(scores, axis):  # 0 for the largest along axis; ties to the earlier position
        return jnp.argsort(jnp.argsort(-scores, axis=axis, stable=True), axis=axis, stable=True)

    def step(r, carry):
        w, mask = carry
        u_r = lax.dynamic_slice(u, (r * bh, 0), (bh, n))  # (bh, n)
        u_rr = lax.dynamic_slice(u_r, (0, r * bh), (bh, bh))
        w_r = lax.dynamic_slice(w, (r * bh, 0), (bh, k))
        z = jnp.einsum("gab,gbk->gak", whiten[r], w.reshape(gm, bh, k), precision=_HIGHEST)
        scores = jnp.where(free[r][:, None], jnp.sum(jnp.square(z).reshape(gm, bh, gk, bw), axis=(1, 3)), -jnp.inf)
        kept = jnp.where(free[r][:, None], False, mask)  # the decided rows' kept blocks
        if balance is None:  # rank among every undecided block, against what is left of the budget
            keep = ranks(scores.reshape(1, -1), 1).reshape(gm, gk)[r] < count - jnp.sum(kept)
        elif balance == "cols":  # the same per block column
            keep = ranks(scores, 0)[r] < count - jnp.sum(kept, axis=0)
        else:  # "rows": row r keeps its own `count` best
            keep = ranks(scores[r][None], 1)[0] < count
        # OBS update: zero the dropped blocks of group r, move their error onto the free features.
        e = jax.scipy.linalg.solve_triangular(u_rr.T, w_r * jnp.repeat(~keep, bw)[None], lower=True)
        w = w - _dot(u_r.T, e)
        w = lax.dynamic_update_slice(w, w_r * jnp.repeat(keep, bw)[None], (r * bh, 0))
        return w, mask.at[r].set(keep)

    _, mask = lax.fori_loop(0, gm, step, (w, jnp.zeros((gm, gk), bool)))
    return mask


@functools.partial(jax.jit, static_argnames=("block_size",))
def _greedy_paths(w, h, *, block_size) -> tuple[jax.Array, jax.Array]:
    """Every block column's greedy OBS removal order: ``(rows, costs)``, both ``(gk, gm)``.

    Block column ``c`` starts with all its blocks and ``H^-1``; at each step the block ``r`` whose removal costs
    least, ``E^T S^-1 E`` with ``E = W[r, c]`` and ``S`` the diagonal block of the current inverse Hessian of
    the kept features, goes, and the rest of the column and the inverse are updated exactly:
    ``W_c -= H^-1[:, r] S^-1 E``, ``H^-1 -= H^-1[:, r] S^-1 H^-1[r, :]``. ``rows[c, s]`` is the block row
    removed at step ``s``, ``costs[c, s]`` what that removal adds to the objective. The columns are
    independent (they share only ``H``), so all of them run at once.
    """
    bh, bw = block_size
    n, k = w.shape
    gm, gk = n // bh, k // bw
    hinv = jax.scipy.linalg.cho_solve((jnp.linalg.cholesky(h), True), jnp.eye(n, dtype=jnp.float32))
    eye_b = jnp.eye(bh, dtype=jnp.float32)
    groups = jnp.arange(n) // bh

    def column(wc):  # (n, bw) -> (gm,), (gm,)
        def step(s, carry):
            hi, wc, alive, rows, costs = carry
            diag = hi.reshape(gm, bh, gm, bh)[jnp.arange(gm), :, jnp.arange(gm), :]  # (gm, bh, bh)
            diag = jnp.where(alive[:, None, None], diag, eye_b)
            e = wc.reshape(gm, bh, bw)
            chol = jnp.linalg.cholesky(diag)
            cost = jnp.where(alive, jnp.sum(e * jax.scipy.linalg.cho_solve((chol, True), e), axis=(1, 2)), jnp.inf)
            r = jnp.argmin(cost)
            col = lax.dynamic_slice(hi, (0, r * bh), (n, bh))  # H^-1[:, r]
            c_r = (chol[r], True)
            wc = wc - _dot(col, jax.scipy.linalg.cho_solve(c_r, e[r]))
            hi = hi - _dot(col, jax.scipy.linalg.cho_solve(c_r, col.T))
            wc = jnp.where((groups == r)[:, None], 0.0, wc)  # zero in exact arithmetic; so is H^-1's row and column r
            return hi, wc, alive.at[r].set(False), rows.at[s].set(r), costs.at[s].set(cost[r])

        init = (hinv, wc, jnp.ones(gm, bool), jnp.zeros(gm, jnp.int32), jnp.zeros(gm, jnp.float32))
        _, _, _, rows, costs = lax.fori_loop(0, gm, step, init)
        return rows, costs

    return jax.vmap(column)(w.reshape(n, gk, bw).swapaxes(0, 1))


def _greedy_mask(w, h, count: int, block: tuple[int, int], balance: str | None) -> np.ndarray:
    """The mask of greedy block OBS (:func:`_greedy_paths`): the cheapest next removal first, over all block columns
    (``balance=None``: the one-block-at-a-time greedy over the whole matrix), or ``gm - count`` per block column."""
    rows, costs = (np.asarray(a) for a in _greedy_paths(w, h, block_size=block))
    gk, gm = rows.shape
    mask = np.ones((gm, gk), bool)
    if balance == "cols":
        for c in range(gk):
            mask[rows[c, : gm - count], c] = False
        return mask
    taken = np.zeros(gk, np.int64)  # removals so far per column: the merge of the columns' paths by next cost
    for _ in range(gm * gk - count):
        nxt = np.where(taken < gm, costs[np.arange(gk), np.minimum(taken, gm - 1)], np.inf)
        c = int(np.argmin(nxt))
        mask[rows[c, taken[c]], c] = False
        taken[c] += 1
    return mask


@jax.jit
def _refit_values(w, h, keep, rows, valid) -> tuple[jax.Array, jax.Array]:
    """Exact re-fit on a fixed pattern: ``(W', sum of (W' - W)^T H (W' - W))``.

    ``keep``: the dense ``(n, k)`` mask of kept entries; ``rows[c]``: the kept input features of block
    column ``c`` (padded; ``valid`` marks the real ones). Per block column, with ``K`` the kept and
    ``D`` the dropped features, the change of the kept values is ``H_KK^-1 H_KD W_D``.
    """
    n, k = w.shape
    gk, _ = rows.shape
    bw = k // gk
    g = _dot(h, jnp.where(keep, 0.0, w)).reshape(n, gk, bw).swapaxes(0, 1)  # (gk, n, bw): H W_D
    rhs = jnp.where(valid[..., None], jnp.take_along_axis(g, rows[..., None], axis=1), 0.0)
    pair = valid[:, :, None] & valid[:, None, :]
    a = jnp.where(pair, h[rows[:, :, None], rows[:, None, :]], jnp.eye(rows.shape[1], dtype=h.dtype))
    delta = jax.scipy.linalg.cho_solve((jnp.linalg.cholesky(a), True), rhs)
    wc = w.reshape(n, gk, bw).swapaxes(0, 1)
    kept = jnp.take_along_axis(wc, rows[..., None], axis=1) + delta
    out = jnp.zeros_like(wc).at[jnp.arange(gk)[:, None], rows].add(jnp.where(valid[..., None], kept, 0.0))
    out = out.swapaxes(0, 1).reshape(n, k)
    diff = out - w
    return out, jnp.sum(diff * _dot(h, diff))


def _refit(w, h, mask, block) -> tuple[jax.Array, float]:
    """:func:`_refit_values` on a host block mask.

    Every block column is padded to the longest one's count rounded up to a multiple of ``ceil(gm / 8)`` blocks, so
    that patterns of a similar density share one compiled program (at most 8 per shape) at little extra work.
    """
    bh, bw = block
    gm, gk = mask.shape
    step = cdiv(gm, 8)
    width = max(cdiv(int(mask.sum(axis=0).max(initial=0)), step), 1) * step * bh
    rows = np.zeros((gk, width), np.int32)
    valid = np.zeros((gk, width), bool)
    for c in range(gk):  # one block column at a time: its kept block rows, as feature indices
        feats = (np.flatnonzero(mask[:, c])[:, None] * bh + np.arange(bh)).reshape(-1)
        rows[c, : feats.size], valid[c, : feats.size] = feats, True
    keep = np.kron(mask, np.ones((bh, bw), bool))
    out, err = _refit_values(jnp.asarray(w), h, keep, rows, valid)
    return out, float(err)


def _host_matrix(mask, dense, block, dtype) -> BlockSparseMatrix:
    """``BlockSparseMatrix.from_mask(mask, dense)`` with the blocks gathered on the host (no program per shape)."""
    bh, bw = block
    pattern = BlockPattern.from_mask(mask, block)
    n, k = dense.shape
    blocks = np.asarray(dense).reshape(n // bh, bh, k // bw, bw).swapaxes(1, 2)[pattern.rows, pattern.cols]
    return BlockSparseMatrix(pattern, jnp.asarray(blocks.astype(dtype)))


def _pattern_mask(pattern, shape) -> np.ndarray:
    if isinstance(pattern, BlockSparseMatrix):
        pattern = pattern.pattern
    if not isinstance(pattern, BlockPattern):
        raise TypeError(f"Expected a BlockPattern or a BlockSparseMatrix. Got {type(pattern).__name__}.")
    if pattern.shape != tuple(shape):
        raise ValueError(f"Expected a pattern of the weight's shape {tuple(shape)}. Got {pattern.shape}.")
    return pattern.mask()


def refit(w, x_calib, pattern, *, damp: float = 0.01, y_calib=None) -> BlockSparseMatrix:
    """Re-fit the kept values of ``pattern`` so that ``x_calib @ W'`` is closest to ``x_calib @ w`` (or ``y_calib``).

    Minimises ``||X (W - W')||_F^2 + lambda ||W - W'||_F^2`` over the values on the pattern's blocks
    (``lambda = damp * mean(diag(X^T X))``; ``damp=0`` is plain least squares). Output columns are
    independent; the columns of one block column share their kept input features ``K`` (``D`` the
    dropped ones), and with ``H = X^T X + lambda I`` their kept values move by ``H_KK^-1 H_KD W_D``:
    one Cholesky solve per block column, batched. With target outputs ``Y = y_calib`` the objective is
    ``||Y - X W'||_F^2 + lambda ||W - W'||_F^2``, the same as above with ``W`` replaced by
    ``W* = H^-1 (X^T Y + lambda W)`` (up to a constant).

    Arguments:
        w: the concrete dense weight ``(in, out)`` (``y = x @ w``, the ``bs.nn`` layout).
        x_calib: calibration inputs ``(rows, in)``, finite.
        pattern: the :class:`~blocksparse.BlockPattern` to keep, or a :class:`BlockSparseMatrix` (its pattern).
        damp: dampening of the Hessian, a float ``>= 0``.
        y_calib: ``None`` (reproduce ``x_calib @ w``) or the outputs to reproduce, ``(rows, out)``, finite.

    Returns:
        A :class:`BlockSparseMatrix` on ``pattern`` with the re-fitted values, in ``w``'s dtype.
    """
    require_host("bs.prune.refit", w=w, x_calib=x_calib)
    w = jnp.asarray(w)
    check_floating(w.dtype, "w")
    if w.ndim != 2:
        raise ValueError(f"Expected a 2-D weight (in, out). Got shape {tuple(w.shape)}.")
    mask = _pattern_mask(pattern, w.shape)
    block = pattern.block_size
    x = _check_calibration(w, x_calib)
    y = _check_targets(w, x, y_calib)
    h, _ = _factor(x, damp)
    w32 = jnp.asarray(w, jnp.float32)
    if y is not None:
        w32 = _target_weight(w32, x, y, h, float(damp))
    out, _ = _refit(w32, h, mask, block)
    return _host_matrix(mask, out, block, w.dtype)


#: Values of ``reconstruct(method=)``: how the blocks are chosen.
METHODS = ("sequential", "greedy")


def reconstruct(
    w,
    x_calib,
    block_size,
    density: float,
    *,
    damp: float = 0.01,
    balance: str | None = None,
    y_calib=None,
    method: str = "sequential",
) -> BlockSparseMatrix:
    """Block pruning that keeps a layer's outputs: choose the blocks by OBS on calibration inputs, then re-fit them.

    For a layer ``y = x @ w`` with ``w (in, out)`` and calibration inputs ``X (rows, in)`` (rows are
    tokens), it looks for the block-sparse ``W'`` minimising ``||X w - X W'||_F^2 + lambda ||w - W'||_F^2``:

    1. the Hessian ``H = X^T X + lambda I``, ``lambda = damp * mean(diag(X^T X))`` (SparseGPT's
       dampening: it makes ``H`` invertible when there are fewer rows than inputs);
    2. the block rows of ``w`` (groups of ``bh`` input features) are processed in order, with
       ``H^-1 = U^T U`` (``U`` upper triangular; its diagonal block ``U_rr`` is group ``r``'s):
       removing block ``(r, c)`` while the later groups stay free costs ``||U_rr^-T W[r, c]||_F^2``,
       and the later rows are updated to compensate, ``W -= U[r, :]^T U_rr^-T W[r, dropped]``.
       Which blocks of row ``r`` go is decided with every undecided block scored the same way
       against the current weights (the budget ``round(density * blocks)`` is shared by all rows, or
       split per block row or column by ``balance``);
    3. the kept values are re-fitted exactly for the chosen pattern (:func:`refit`).

    With target outputs ``Y = y_calib`` it minimises ``||Y - X W'||_F^2 + lambda ||w - W'||_F^2`` instead:
    up to a constant that is the objective above for ``W* = H^-1 (X^T Y + lambda w)`` (the damped least-squares
    fit of ``Y`` by a dense weight), so steps 2 and 3 run on ``W*``. In a model pruned layer after layer, ``X`` is
    what the pruned model feeds the layer and ``Y`` what the dense one computes there: the layer then also undoes
    the error of the layers before it.

    The pattern returned is that one, unless the magnitude pattern of the same balance
    (:func:`magnitude`) re-fits to a lower error, which then wins: the result never reconstructs worse
    than magnitude pruning (re-fitted or not). Everything runs in float32 under ``jit``
    (``O(in^2 out)`` work); the pattern is host data, so call it outside ``jit``.

    Arguments:
        w: the concrete dense weight ``(in, out)`` (Flax's and ``bs.nn``'s layout; transpose a
            PyTorch ``(out, in)`` weight first).
        x_calib: calibration inputs ``(rows, in)``, finite; at least one row.
        block_size: ``b`` or ``(b_in, b_out)`` dividing ``w.shape``.
        density: fraction of blocks kept, in ``[0, 1]`` (see :func:`keep_count`).
        damp: dampening as a fraction of the mean diagonal of ``X^T X``, ``>= 0`` (default 0.01).
            With ``damp=0`` and fewer rows than input features ``H`` is singular: that raises, as
            does an ``H`` that is not positive definite even after dampening (all-zero inputs).
        balance: ``None``, ``"rows"`` or ``"cols"`` (as :func:`magnitude`).
        y_calib: ``None`` (reproduce ``x_calib @ w``) or the outputs to reproduce, ``(rows, out)``, finite.

    Returns:
        A :class:`BlockSparseMatrix` ``(in, out)`` in ``w``'s dtype.
    """
    require_host("bs.prune.reconstruct", w=w, x_calib=x_calib, density=density)
    if method not in METHODS:
        raise ValueError(f"Expected method in {METHODS}. Got {method!r}.")
    if method == "greedy" and balance == "rows":
        raise ValueError("Expected balance None or 'cols' with method='greedy' (its block columns are independent). "
                         "Got balance='rows'; use method='sequential'.")  # fmt: skip
    w = jnp.asarray(w)
    check_floating(w.dtype, "w")
    if w.ndim != 2:
        raise ValueError(f"Expected a 2-D weight (in, out). Got shape {tuple(w.shape)}.")
    density = check_density(density)
    check_balance(balance)
    bh, bw = check_block_size(w.shape, block_size)
    norms = block_norms(w, (bh, bw))
    _check_no_nan(norms, (bh, bw), "w")
    if np.isinf(norms).any():
        r, c = (int(i) for i in np.argwhere(np.isinf(norms))[0])
        raise ValueError(
            f"Expected a finite weight w. Got inf in block ({r}, {c}) (rows {r * bh}:{(r + 1) * bh}, "
            f"cols {c * bw}:{(c + 1) * bw})."
        )
    count = keep_count(density, norms.shape, balance)
    x = _check_calibration(w, x_calib)
    y = _check_targets(w, x, y_calib)
    h, chol = _factor(x, damp)
    w32 = jnp.asarray(w, jnp.float32)  # one program per shape, whatever the weight's dtype
    if y is not None:
        w32 = _target_weight(w32, x, y, h, float(damp))
    if method == "greedy":
        mask = _greedy_mask(w32, h, count, (bh, bw), balance)
    else:
        mask = np.asarray(_obs_mask(w32, chol, count, block_size=(bh, bw), balance=balance))
    out, err = _refit(w32, h, mask, (bh, bw))
    by_norm = top_blocks(norms, count, balance)
    if not np.array_equal(by_norm, mask):
        out_n, err_n = _refit(w32, h, by_norm, (bh, bw))
        if err_n < err:
            mask, out = by_norm, out_n
    return _host_matrix(mask, out, (bh, bw), w.dtype)


def reconstruction_error(w, pruned, x_calib, y_calib=None) -> float:
    """``||Y - X W'||_F^2 / ||Y||_F^2``, ``Y = X w``: the share of the layer's output on ``x_calib`` ``W'`` loses.

    ``w`` is the dense ``(in, out)`` weight, ``pruned`` a :class:`BlockSparseMatrix` or dense array of its
    shape; ``y_calib`` the target outputs ``(rows, out)`` instead of ``X w``; computed in float64 on the host.
    """
    w = np.asarray(w, np.float64)
    p = np.asarray(pruned.to_dense() if isinstance(pruned, BlockSparseMatrix) else pruned, np.float64)
    x = np.asarray(x_calib, np.float64)
    if p.shape != w.shape or x.ndim != 2 or x.shape[1] != w.shape[0]:
        raise ValueError(f"Expected w and pruned of one shape (in, out) and x (rows, in). Got {w.shape}, {p.shape}, "
                         f"{x.shape}.")  # fmt: skip
    y = x @ w if y_calib is None else np.asarray(y_calib, np.float64)
    if y.shape != (x.shape[0], w.shape[1]):
        raise ValueError(f"Expected y_calib of shape {(x.shape[0], w.shape[1])} (rows, out). Got {y.shape}.")
    num, den = float(np.sum(np.square(y - x @ p))), float(np.sum(y * y))
    return num / den if den > 0 else (0.0 if num == 0 else math.inf)


def _block_sq_norms(blocks) -> jax.Array:
    """Squared L2 norm of each ``(bh, bw)`` block, in float32 (monotone in the L2 norm)."""
    b = blocks.astype(jnp.promote_types(blocks.dtype, jnp.float32))
    return jnp.sum(b * b, axis=(-2, -1))


def rigl_update(
    D: DynamicBlockSparseMatrix, key, *, drop_fraction: float, dense_grad, num_candidates: int | None = None
) -> DynamicBlockSparseMatrix:
    """One RigL mask update: drop the smallest blocks, regrow as many where the dense gradient is largest.

    With ``k = round(drop_fraction * capacity)``:

    1. the ``k`` blocks of ``D`` with the smallest L2 norm are dropped (ties: the lower slot first;
       a block holding NaN counts as the smallest);
    2. ``num_candidates`` distinct positions that ``D`` does not hold are drawn uniformly with
       ``key``; ``dense_grad`` gives the loss gradient there, and the ``k`` candidates whose
       gradient block has the largest L2 norm are grown, in the dropped blocks' slots, with zero
       values.

    Everything has a fixed shape (capacity, ``nnz`` and the block size do not change), so a jitted
    train step calling it compiles once however the mask moves. Kept blocks stay in their slots with
    their values; a regrown block is never one that ``D`` held before the update (the ``k`` slots
    whose ``rows``/``cols`` changed are exactly the moved blocks: use that to reset optimizer state).
    The result holds no duplicate coordinates if ``D`` holds none. ``k = 0`` returns ``D`` itself
    without calling ``dense_grad``.

    Every slot must be active (``nnz == capacity``, the usual RigL setting): a concrete ``nnz``
    that differs raises; a traced ``nnz`` is assumed equal to the capacity. The candidate positions
    are drawn from a dense ``(m // bh, k // bw)`` occupancy grid, which is cheap for the grid of
    a layer (a 4096 x 4096 weight of 32 x 32 blocks has 16384 positions).

    Arguments:
        D: a :class:`~blocksparse.DynamicBlockSparseMatrix` with ``nnz == capacity`` and distinct
            block coordinates.
        key: a ``jax.random`` key (may be traced) for drawing the candidates.
        drop_fraction: fraction of the capacity moved, a concrete float in ``[0, 1]`` (it sets the
            static ``k``; a different value compiles again).
        dense_grad: ``C -> (num_candidates, bh, bw)`` gradient blocks: called once, while tracing,
            with a ``DynamicBlockSparseMatrix`` ``C`` of the candidate positions (its data zeros,
            ``D``'s dtype). For ``y = x @ W`` with output gradient ``dy`` it is typically
            ``lambda C: bs.sdd(x.T, dy, C).data``; returning the matrix itself is accepted too.
        num_candidates: how many positions to sample and evaluate the gradient at; a concrete int
            in ``[k, m // bh * k // bw - capacity]``. Default ``2 * k`` capped at the number of
            positions ``D`` does not hold.

    Returns:
        A :class:`~blocksparse.DynamicBlockSparseMatrix` of the same shape, block size, capacity,
        ``nnz`` and dtype: ``D``'s blocks with ``k`` of them moved.
    """
    if not isinstance(D, DynamicBlockSparseMatrix):
        raise TypeError(
            f"bs.prune.rigl_update: expected a DynamicBlockSparseMatrix. Got {type(D).__name__}; convert a static "
            "matrix with DynamicBlockSparseMatrix.from_static(W)."
        )
    require_host("bs.prune.rigl_update", drop_fraction=drop_fraction, num_candidates=num_candidates)
    cap = D.capacity
    gm, gk = D.grid
    bh, bw = D.block_size
    free = gm * gk - cap  # positions D does not hold (with distinct coordinates)
    if is_concrete(D.nnz) and int(D.nnz) != cap:
        raise ValueError(
            f"bs.prune.rigl_update: expected every slot active (nnz == capacity == {cap}). Got nnz={int(D.nnz)}; "
            "build the matrix with capacity=nnz (RigL keeps the number of blocks fixed)."
        )
    if isinstance(drop_fraction, bool) or not isinstance(drop_fraction, numbers.Real):
        raise TypeError(f"Expected drop_fraction a float in [0, 1]. Got {drop_fraction!r}.")
    if not (math.isfinite(drop_fraction) and 0 <= drop_fraction <= 1):
        raise ValueError(f"Expected drop_fraction in [0, 1]. Got {drop_fraction}.")
    k = int(round(drop_fraction * cap))
    if k > free:
        raise ValueError(
            f"bs.prune.rigl_update: drop_fraction={drop_fraction} moves k={k} of {cap} blocks, but only {free} of the "
            f"{gm * gk} positions are free to regrow at; lower drop_fraction to at most {free / cap if cap else 0:.4g}."
        )
    if num_candidates is None:
        num_candidates = min(2 * k, free)
    elif isinstance(num_candidates, bool) or not isinstance(num_candidates, numbers.Integral):
        raise TypeError(f"Expected num_candidates an int. Got {num_candidates!r}.")
    num_candidates = int(num_candidates)
    if not k <= num_candidates <= free:
        raise ValueError(
            f"Expected num_candidates in [k={k}, free positions={free}] (k = round(drop_fraction * capacity)). "
            f"Got {num_candidates}."
        )
    if k == 0:
        return D

    # 1. Drop: the k smallest blocks (NaN first; lax.top_k puts the lower index first among ties).
    norms = _block_sq_norms(D.data)
    norms = jnp.where(jnp.isnan(norms), -jnp.inf, norms)
    _, drop = lax.top_k(-norms, k)

    # 2. Candidates: uniform scores in [0, 1) at free positions, -1 at held ones; the top scores are
    #    num_candidates distinct free positions (num_candidates <= free), a uniform random subset.
    inside = (D.rows >= 0) & (D.rows < gm) & (D.cols >= 0) & (D.cols < gk)  # invalid D: products give NaN anyway
    held = jnp.zeros(gm * gk, bool).at[jnp.where(inside, D.rows * gk + D.cols, gm * gk)].set(True, mode="drop")
    scores = jnp.where(held, -1.0, jax.random.uniform(key, (gm * gk,), jnp.float32))
    _, cand = lax.top_k(scores, num_candidates)
    cand = cand.astype(jnp.int32)
    c_rows, c_cols = cand // gk, cand % gk
    C = DynamicBlockSparseMatrix(
        c_rows, c_cols, jnp.zeros((num_candidates, bh, bw), D.dtype), num_candidates, D.shape, D.block_size
    )
    g = dense_grad(C)
    if isinstance(g, DynamicBlockSparseMatrix):
        g = g.data
    if not hasattr(g, "shape") or tuple(g.shape) != (num_candidates, bh, bw):
        raise ValueError(
            f"bs.prune.rigl_update: expected dense_grad(C) to return blocks of shape ({num_candidates}, {bh}, {bw}) "
            f"(one per candidate of C). Got {getattr(g, 'shape', type(g).__name__)}."
        )

    # 3. Grow: the k candidates of largest gradient norm (NaN gradients rank last), in the dropped slots.
    gnorms = _block_sq_norms(jnp.asarray(g))
    gnorms = jnp.where(jnp.isnan(gnorms), -jnp.inf, gnorms)
    _, grow = lax.top_k(gnorms, k)
    rows = D.rows.at[drop].set(c_rows[grow])
    cols = D.cols.at[drop].set(c_cols[grow])
    data = D.data.at[drop].set(jnp.zeros((k, bh, bw), D.dtype))
    return DynamicBlockSparseMatrix(rows, cols, data, D.nnz, D.shape, D.block_size)
