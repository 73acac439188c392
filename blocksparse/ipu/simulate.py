"""Execute a static :class:`~blocksparse.ipu.Plan` tile by tile in JAX.

Every physical tile (piece ``s`` of ``n``, local tile ``t``) computes its partial output rows
from only what the plan gives it: its own non-zero blocks and the rows of ``X`` for its own
block columns, restricted to its piece of ``n``. The partials of all tiles are then reduced
into ``Y`` (a scatter-add by block row), the step the IPU performs with the partials exchange
and reduction phases. The result equals ``W @ X`` up to the order of floating-point sums.

Tiles are processed in batches inside a ``lax.scan`` so that memory stays bounded by a batch,
not by the whole chip.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

from .._pattern import BlockPattern
from .planner import Plan

__all__ = ["simulate"]

_BATCH_BYTES = 1 << 26


def _acc_dtype(dt) -> jnp.dtype:
    dt = jnp.dtype(dt)
    return jnp.dtype(jnp.float32) if jnp.finfo(dt).bits < 32 else dt


@partial(jax.jit, static_argnames=("pieces", "npc", "grid_m", "batch", "acc", "out"))
def _run(data, x, tile_blocks, tile_cols, tile_rows, local_row, local_col, *, pieces, npc, grid_m, batch, acc, out):
    k, n = x.shape
    bh, bw = data.shape[1:]
    tps, max_rows = tile_rows.shape
    # Piece s of n (on the tiles of split s % n_split, in pass s // n_split) is columns [s * npc, (s + 1) * npc).
    x = jnp.pad(x, ((0, 0), (0, pieces * npc - n))).reshape(k // bw, bw, pieces, npc)

    def one_tile(p):
        """Partial output rows of tile run ``p`` from its own blocks and its own rows of X."""
        s, t = p // tps, p % tps
        blk = tile_blocks[t]
        w = jnp.where((blk >= 0)[:, None, None], data[jnp.maximum(blk, 0)], 0).astype(acc)
        cols = tile_cols[t]
        x_local = x[jnp.maximum(cols, 0), :, s, :].astype(acc)  # what the dense-operand exchange delivers
        prod = jnp.einsum("zij,zjn->zin", w, x_local[jnp.maximum(local_col[t], 0)], preferred_element_type=acc)
        lr = jnp.where(blk >= 0, local_row[t], max_rows)
        return jax.ops.segment_sum(prod, lr, num_segments=max_rows, indices_are_sorted=True)

    tiles = pieces * tps
    steps = -(-tiles // batch)

    def step(y, i):
        p = i * batch + jnp.arange(batch)
        valid = p < tiles
        p = jnp.minimum(p, tiles - 1)
        partials = jax.vmap(one_tile)(p)  # (batch, max_rows, bh, npc)
        rows = tile_rows[p % tps]
        rows = jnp.where(valid[:, None] & (rows >= 0), rows, grid_m)  # padding goes out of range, dropped
        s = p // tps
        y = y.at[rows, :, s[:, None], :].add(partials, mode="drop")
        return y, None

    y0 = jnp.zeros((grid_m, bh, pieces, npc), acc)
    y, _ = jax.lax.scan(step, y0, jnp.arange(steps))
    return y.reshape(grid_m * bh, pieces * npc)[:, :n].astype(out)


def simulate(plan: Plan, W, x) -> jax.Array:
    """Run ``plan`` for ``W @ x`` tile by tile: per-tile partial products, then their reduction.

    Arguments:
        plan: from :func:`blocksparse.plan` for ``W``'s pattern and ``n = x.shape[1]``.
        W: a :class:`~blocksparse.BlockSparseMatrix` with the planned pattern (its data may be traced).
        x: dense ``(k, n)``.

    Returns:
        ``(m, n)``, equal to ``W @ x``, in the promoted dtype of ``W`` and ``x`` (sums in float32
        for half types).
    """
    if not isinstance(plan, Plan):
        raise TypeError(f"Expected a Plan from bs.plan(...). Got {type(plan).__name__}.")
    pattern = getattr(W, "pattern", None)
    if not isinstance(pattern, BlockPattern) or not hasattr(W, "data"):
        raise TypeError(f"Expected a BlockSparseMatrix for W. Got {type(W).__name__}.")
    if pattern != plan.pattern:
        raise ValueError(
            f"Expected W with the planned pattern (shape {plan.shape}, block size {plan.block_size}, "
            f"{plan.pattern.nnz_blocks} blocks, fingerprint {plan.pattern.fingerprint[:12]}). "
            f"Got shape {pattern.shape}, block size {pattern.block_size}, {pattern.nnz_blocks} blocks, "
            f"fingerprint {pattern.fingerprint[:12]}."
        )
    x = jnp.asarray(x)
    m, k = plan.shape
    if x.ndim != 2 or x.shape != (k, plan.n):
        raise ValueError(f"Expected x of shape {(k, plan.n)} (k, n) for this plan. Got {x.shape}.")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"Expected floating-point x. Got dtype {x.dtype}.")
    out = jnp.result_type(W.data.dtype, x.dtype)
    acc = _acc_dtype(out)
    bh, bw = plan.block_size
    # Piece s of n starts at s * npc (pieces are equal but for a shorter last one).
    npc = int(plan.n_pieces[0, 1] - plan.n_pieces[0, 0])
    max_blocks = plan.tile_blocks.shape[1]
    per_tile = max_blocks * (bh * bw + bw * npc + bh * npc) * acc.itemsize
    pieces = int(plan.n_pieces.shape[0])
    batch = int(max(1, min(pieces * plan.tiles_per_split, _BATCH_BYTES // max(per_tile, 1))))
    if plan.pattern.nnz_blocks == 0:
        return jnp.zeros((m, plan.n), out)
    return _run(
        W.data,
        x,
        jnp.asarray(plan.tile_blocks),
        jnp.asarray(plan.tile_cols),
        jnp.asarray(plan.tile_rows),
        jnp.asarray(plan.tile_local_row),
        jnp.asarray(plan.tile_local_col),
        pieces=pieces,
        npc=npc,
        grid_m=plan.pattern.grid[0],
        batch=batch,
        acc=acc,
        out=jnp.dtype(out),
    )
