"""Execute plans on simulated tiles in JAX: :func:`simulate` (static) and :func:`simulate_dynamic`.

**Static.** Every physical tile (piece ``s`` of ``n``, local tile ``t``) computes its partial output rows
from only what the plan gives it: its own non-zero blocks and the rows of ``X`` for its own
block columns, restricted to its piece of ``n``. The partials of all tiles are then reduced
into ``Y`` (a scatter-add by block row), the step the IPU performs with the partials exchange
and reduction phases. The result equals ``W @ X`` up to the order of floating-point sums.

Tiles are processed in batches inside a ``lax.scan`` so that memory stays bounded by a batch,
not by the whole chip.

**Dynamic.** The blocks of a :class:`~blocksparse.DynamicBlockSparseMatrix` are put in the plan's
buckets with :func:`~blocksparse.ipu.distribute`; every bucket computes the partial products of
only its own blocks, reduced into ``Y`` by block row. Invalid input is never a finite wrong
value: out-of-grid coordinates and blocks that fit no bucket make the whole output NaN, as the
products (``D @ x``) do.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

from .._matrix import DynamicBlockSparseMatrix
from .._pattern import BlockPattern
from .._util import cdiv
from .buckets import _check_plan, _distribute
from .plan import DynamicPlan, Plan

__all__ = ["simulate", "simulate_dynamic"]

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
    steps = cdiv(tiles, batch)

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


@partial(jax.jit, static_argnames=("grid", "split", "part", "cap", "npc", "acc", "out"))
def _simulate(rows, cols, data, nnz, x, *, grid, split, part, cap, npc, acc, out):
    gm, gk = grid
    pn = split[2]
    dist = _distribute(rows, cols, nnz, grid=grid, split=split, part=part, cap=cap)
    k, n = x.shape
    bh, bw = data.shape[1:]
    xp = jnp.pad(x, ((0, 0), (0, pn * npc - n))).reshape(gk, bw, pn, npc).astype(acc)

    def one_bucket(y, ids):
        """Partial products of one bucket's blocks (every piece of n), reduced into Y by block row."""
        ok = ids >= 0
        j = jnp.maximum(ids, 0)
        w = jnp.where(ok[:, None, None], data[j], 0).astype(acc)
        xb = xp[jnp.clip(cols[j], 0, gk - 1)]  # (cap, bw, pn, npc): the exchange delivers these rows
        prod = jnp.einsum("zij,zjsn->zisn", w, xb, preferred_element_type=acc)
        r = jnp.where(ok & (rows[j] >= 0), rows[j], gm)  # padding (and invalid rows) out of range: dropped
        return y.at[r].add(prod, mode="drop"), None

    y = jnp.zeros((gm, bh, pn, npc), acc)
    if rows.shape[0]:  # no blocks at all: nothing to gather
        y, _ = jax.lax.scan(one_bucket, y, dist.bucket_ids)
    y = y.reshape(gm * bh, pn * npc)[:, :n].astype(out)
    return jnp.where(dist.overflow > 0, jnp.nan, y), dist


def simulate_dynamic(dplan: DynamicPlan, D, x, *, return_distribution: bool = False):
    """Run ``D @ x`` bucket by bucket as the dynamic plan lays it out on the tiles.

    The blocks of ``D`` are distributed with :func:`~blocksparse.ipu.distribute`; every bucket then
    computes the partial products of only its own blocks (against each piece of ``n``), and the
    partials of all buckets are reduced into ``Y`` by block row. Jit-able; the pattern of ``D`` may
    change between calls without recompiling.

    Invalid input gives NaN in the whole output, never a finite wrong value:

    * an active block outside the grid (``D.is_valid()`` is False), exactly as ``D @ x`` does;
      under :func:`blocksparse.checkify` the error names the valid ranges (``D.check()``);
    * blocks that fit no bucket (``nnz > total_capacity``); outside ``jit`` a ``ValueError`` says so.

    Returns:
        ``(m, n)`` equal to ``D @ x`` (and the :class:`~blocksparse.ipu.Distribution` with
        ``return_distribution=True``).
    """
    _check_plan(dplan)
    if not isinstance(D, DynamicBlockSparseMatrix):
        raise TypeError(f"Expected a DynamicBlockSparseMatrix for D. Got {type(D).__name__}.")
    if D.shape != dplan.shape or D.block_size != dplan.block_size:
        raise ValueError(
            f"Expected D of shape {dplan.shape} with blocks {dplan.block_size} (the plan's). "
            f"Got shape {D.shape}, blocks {D.block_size}."
        )
    x = jnp.asarray(x)
    m, k = dplan.shape
    if x.shape != (k, dplan.n):
        raise ValueError(f"Expected x of shape {(k, dplan.n)} (k, n) for this plan. Got {x.shape}.")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"Expected floating-point x. Got dtype {x.dtype}.")
    out = jnp.result_type(D.data.dtype, x.dtype)
    npc = int(dplan.n_pieces[0, 1] - dplan.n_pieces[0, 0])
    y, dist = _simulate(
        D.rows, D.cols, D.data, D.nnz, x,
        grid=dplan.grid, split=dplan.split, part=(dplan.rows_per_partition, dplan.cols_per_partition),
        cap=dplan.bucket_capacity, npc=npc, acc=_acc_dtype(out), out=jnp.dtype(out),
    )  # fmt: skip
    valid = D.validity()  # out-of-grid blocks: NaN like the products (and a checkify error when asked)
    y = jnp.where(valid, y, jnp.asarray(jnp.nan, y.dtype))
    if not isinstance(dist.overflow, jax.core.Tracer) and int(dist.overflow) > 0:
        raise ValueError(
            f"Expected at most total_capacity={dplan.total_capacity} blocks ({dplan.num_buckets} buckets x "
            f"{dplan.bucket_capacity}). Got nnz={int(D.nnz)}: {int(dist.overflow)} blocks fit no bucket; "
            "plan with a larger max_nnz_blocks or bucket_oversize."
        )
    return (y, dist) if return_distribution else y
