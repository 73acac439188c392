"""Block pruning: turn a dense weight into a block-sparse one, or move blocks during training (RigL)."""

from __future__ import annotations

import math
import numbers

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ._matrix import BlockSparseMatrix, DynamicBlockSparseMatrix, check_floating, is_concrete, require_host
from ._pattern import BlockPattern, check_block_size, check_density, num_blocks

__all__ = ["magnitude", "magnitude_global", "block_norms", "rigl_update"]

_ORDS = {"l1": 1, "l2": 2, "max": np.inf}


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


def magnitude(w, block_size, density: float, *, norm: str = "l2") -> BlockSparseMatrix:
    """Keep the ``round(density * blocks)`` blocks of ``w`` with the largest norm.

    Ties are broken by position (row-major, earlier first), so the result is deterministic. A block
    holding NaN has no rank and raises. The pattern is host data: call it outside ``jit``.

    Arguments:
        w: a concrete dense ``(m, k)`` floating array.
        block_size: ``b`` or ``(bh, bw)``, dividing ``w.shape``.
        density: fraction of blocks kept, in ``[0, 1]``; a positive density that rounds to no block
            raises (``0`` gives an empty matrix on purpose).
        norm: ``"l2"`` (default), ``"l1"`` or ``"max"``.

    Returns:
        A :class:`BlockSparseMatrix` with ``w``'s values on the kept blocks.
    """
    require_host("bs.prune.magnitude", w=w, density=density)
    w = jnp.asarray(w)
    check_floating(w.dtype, "w")
    density = check_density(density)
    scores = block_norms(w, block_size, norm)
    if np.isnan(scores).any():
        r, c = (int(i) for i in np.argwhere(np.isnan(scores))[0])
        bh, bw = check_block_size(w.shape, block_size)
        raise ValueError(
            f"Expected w without NaN. Got NaN in block ({r}, {c}) (rows {r * bh}:{(r + 1) * bh}, "
            f"cols {c * bw}:{(c + 1) * bw}); its norm cannot be ranked, so it would be dropped silently."
        )
    keep = num_blocks(density, scores.size)  # a positive density that keeps no block raises
    order = np.argsort(-scores.reshape(-1), kind="stable")[:keep]
    mask = np.zeros(scores.size, bool)
    mask[order] = True
    bh, bw = check_block_size(w.shape, block_size)
    pattern = BlockPattern.from_mask(mask.reshape(scores.shape), (bh, bw))
    return BlockSparseMatrix.from_mask(pattern.mask(), w, (bh, bw))


def magnitude_global(weights, block_size, density: float, *, norm: str = "l2") -> list[BlockSparseMatrix]:
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

    Arguments:
        weights: a sequence of concrete 2-D floating arrays.
        block_size: ``b`` or ``(bh, bw)`` for every weight, or a *list* with one of those per weight.
        density: overall fraction of blocks kept, in ``(0, 1]``.
        norm: ``"l2"`` (default), ``"l1"`` or ``"max"``.

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
        if np.isnan(s).any():
            r, c = (int(j) for j in np.argwhere(np.isnan(s))[0])
            raise ValueError(f"Expected weights without NaN. Got NaN in weights[{i}], block ({r}, {c}).")
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
        out.append(BlockSparseMatrix.from_mask(mask, w, bsz))
    return out


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
