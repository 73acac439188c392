"""The dynamic redistributor: a row-split work list built *inside* ``jit`` from a traced pattern.

It is the traced twin of :func:`blocksparse.plan.gpu.lower` (which builds the same structure on
the host, with NumPy, from a static pattern). Every array has a shape fixed by the static
``capacity`` and grid, so a new pattern never recompiles; only the contents change:

- blocks are sorted by output row (padding and invalid blocks last, never referenced);
- each row becomes ``ceil(len / max_len)`` units (an empty row still gets one, which writes
  zeros); ``U = rows + ceil(capacity / max_len)`` units always suffice;
- units of a row with more than one unit write float32 partial slots, summed afterwards into
  the split rows. At most ``2 * ceil(capacity / max_len)`` slots are ever needed (a split row of
  ``len > max_len`` blocks takes ``ceil(len / max_len) <= 2 len / max_len`` of them);
- unused units point at one extra dummy slot whose segment is out of range (dropped), and unused
  ``split_rows`` entries hold distinct out-of-range rows (dropped by the final scatter).

This mirrors PopSparse's dynamic mode, where non-zeros go to fixed-capacity buckets on tiles and
overflowing rows spill into other buckets: here a bucket is a unit of ``max_len`` blocks, and a
long row spills into as many units as it needs, bounded in total by the capacity.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

__all__ = ["TracedSchedule", "redistribute", "choose_max_len", "execute_dsd"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TracedSchedule:
    """A :class:`~blocksparse.ops.matmul.schedule.RowSplitSchedule` with traced contents.

    Same field meanings; ``partial_seg`` has ``num_partials`` entries of which the last is the
    dummy slot for unused units.
    """

    unit_start: jax.Array  # int32[U]
    unit_len: jax.Array  # int32[U]
    unit_dest: jax.Array  # int32[U]
    block_col: jax.Array  # int32[max(C, 1)]
    block_id: jax.Array  # int32[max(C, 1)]
    split_rows: jax.Array  # int32[R]
    partial_seg: jax.Array  # int32[S + 1]
    num_rows: int = dataclasses.field(metadata={"static": True})
    max_len: int = dataclasses.field(metadata={"static": True})

    @property
    def num_units(self) -> int:
        return int(self.unit_start.shape[0])

    @property
    def num_partials(self) -> int:
        return int(self.partial_seg.shape[0])


def choose_max_len(capacity: int, num_rows: int, lo: int = 4, hi: int = 64) -> int:
    """Twice the mean row length at full capacity, as a power of two in ``[lo, hi]``.

    A uniform pattern then rarely splits a row, while a row much longer than the mean is cut
    into pieces of about twice the mean, which bounds the longest program.
    """
    mean = capacity / max(num_rows, 1)
    target = max(lo, min(hi, 2 * mean))
    return 1 << max(0, math.ceil(math.log2(target)))


def redistribute(rows, cols, keep, num_rows: int, max_len: int | None = None) -> TracedSchedule:
    """Build the work list for block rows ``rows`` (``int32[C]``), block cols ``cols``.

    Arguments:
        rows, cols: traced block coordinates (``C`` = capacity).
        keep: ``bool[C]``, the blocks that take part (active and in range).
        num_rows: the number of output block rows (static).
        max_len: blocks per unit (static); default :func:`choose_max_len`.
    """
    cap = int(rows.shape[0])
    L = int(max_len or choose_max_len(cap, num_rows))
    gm = int(num_rows)
    n_units = gm + -(-cap // L)
    n_split_slots = min(n_units, 2 * -(-cap // L))
    n_split_rows = max(1, min(gm, -(-cap // (L + 1))))
    i32 = jnp.int32

    key = jnp.where(keep, rows, gm).astype(i32)
    order = jnp.argsort(key, stable=True).astype(i32)
    counts = jnp.bincount(key, length=gm + 1)[:gm].astype(i32)
    indptr = jnp.concatenate([jnp.zeros(1, i32), jnp.cumsum(counts, dtype=i32)])
    nunits = jnp.maximum(1, -(-counts // L))
    uoff = jnp.concatenate([jnp.zeros(1, i32), jnp.cumsum(nunits, dtype=i32)])

    u = jnp.arange(n_units, dtype=i32)
    live = u < uoff[-1]
    row_u = jnp.minimum(jnp.searchsorted(uoff[1:], u, side="right").astype(i32), max(gm - 1, 0))
    j = u - uoff[row_u]
    start = jnp.where(live, indptr[row_u] + j * L, 0)
    length = jnp.where(live, jnp.clip(counts[row_u] - j * L, 0, L), 0)
    split_u = live & (nunits[row_u] > 1)
    slot = jnp.cumsum(split_u, dtype=i32) - 1
    dest = jnp.where(split_u, -1 - slot, row_u)
    dest = jnp.where(live, dest, -1 - n_split_slots)  # unused units: the dummy slot

    is_split = nunits > 1
    rank = jnp.cumsum(is_split, dtype=i32) - 1
    split_rows = (
        (gm + jnp.arange(n_split_rows, dtype=i32))
        .at[jnp.where(is_split, rank, n_split_rows)]
        .set(jnp.arange(gm, dtype=i32), mode="drop")
    )
    partial_seg = jnp.full(n_split_slots + 1, n_split_rows, i32)
    partial_seg = partial_seg.at[jnp.where(split_u, slot, n_split_slots + 1)].set(rank[row_u], mode="drop")

    pad = max(cap, 1) - cap
    block_col = jnp.pad(cols.astype(i32)[order], (0, pad))
    block_id = jnp.pad(order, (0, pad))
    return TracedSchedule(start, length, dest, block_col, block_id, split_rows, partial_seg, gm, L)


def combine_partials(y, p, sched, block: int):
    """Sum float32 partial rows ``p`` (``(S * block, n)``) into the split rows of ``y``."""
    s, r = sched.num_partials, sched.split_rows.shape[0]
    parts = p[: s * block].reshape(s, block, -1)
    sums = jax.ops.segment_sum(parts, sched.partial_seg, num_segments=r)
    y3 = y.reshape(-1, block, y.shape[1])
    return y3.at[sched.split_rows].set(sums.astype(y.dtype), mode="drop").reshape(y.shape)


def execute_dsd(sched: TracedSchedule, data, x, out_dtype=None):
    """Run a schedule with plain JAX exactly as the kernel does (unit by unit): ``W @ x``.

    The oracle for the schedule itself; also a readable statement of the kernel's contract.
    """
    _, bh, bw = data.shape
    k, n = x.shape
    L = sched.max_len
    out_dtype = out_dtype or jnp.result_type(data.dtype, x.dtype)
    idx = sched.unit_start[:, None] + jnp.arange(L)[None, :]
    mask = jnp.arange(L)[None, :] < sched.unit_len[:, None]
    idx = jnp.minimum(idx, sched.block_id.shape[0] - 1)
    data = jnp.pad(data, ((0, max(1 - data.shape[0], 0)), (0, 0), (0, 0)))  # capacity 0: one pad block
    w = data[sched.block_id[idx]]  # (U, L, bh, bw)
    xb = x.reshape(k // bw, bw, n)[sched.block_col[idx]]  # (U, L, bw, n)
    acc = jnp.einsum("ulij,uljn->uin", jnp.where(mask[..., None, None], w, 0), xb,
                     preferred_element_type=jnp.float32)  # fmt: skip
    gm = sched.num_rows
    direct = sched.unit_dest >= 0
    y = (
        jnp.zeros((gm, bh, n), out_dtype)
        .at[jnp.where(direct, sched.unit_dest, gm)]
        .set(acc.astype(out_dtype), mode="drop")
    )
    p = (
        jnp.zeros((sched.num_partials, bh, n), jnp.float32)
        .at[jnp.where(direct, sched.num_partials, -1 - sched.unit_dest)]
        .set(acc, mode="drop")
    )
    return combine_partials(y.reshape(gm * bh, n), p.reshape(-1, n), sched, bh)
