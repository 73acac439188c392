"""The GPU lowering: the fixed-shape work list the block-sparse kernels consume, and its two builders.

A plan (here: a *schedule*) is a partition of the non-zero blocks into units of fixed shape. It
is built two ways and consumed one way:

- :func:`lower` builds a :class:`RowSplitSchedule` on the host (NumPy, cached) from a static
  :class:`~blocksparse.BlockPattern`;
- :func:`redistribute` builds its traced twin, a :class:`TracedSchedule`, inside ``jit`` from a
  dynamic pattern of bounded size (shapes fixed by the capacity, contents traced);
- the Pallas kernels (:mod:`.triton`, :mod:`.mosaic`) consume either, and :func:`execute_dsd` runs one unit
  by unit in plain JAX (the schedule's own oracle).

The schedule
------------
A :class:`RowSplitSchedule` partitions the non-zero blocks of a block-sparse operand into
*units*. A unit is a contiguous run of at most ``max_len`` blocks of one output block row; one
GPU program handles one unit (times one tile of the dense dimension). A row longer than
``max_len`` is split into several units whose partial sums go to a float32 scratch buffer and are
combined afterwards; every other row (empty rows too) is written by exactly one unit, directly.

Kernels never know who built the schedule: :func:`lower` fills it on the
host from a static pattern (NumPy, cached). Everything here is host NumPy, immutable and hashable.

Layout (``U`` units, ``nnz`` blocks, ``S`` partial slots, ``R`` split rows):

- ``unit_start[U]``, ``unit_len[U]``: the unit's slice of the block list below;
- ``unit_dest[U]``: ``>= 0``: the output block row written directly; ``< 0``: partial slot
  ``-1 - unit_dest``;
- ``block_col[nnz]``: for each block in schedule order, the block index along the contracting
  dimension (which block of the dense operand it multiplies);
- ``block_id[nnz]``: the block's index into ``data`` (so the transposed product needs no copy);
- ``split_rows[R]``: the output rows assembled from partials, ``partial_seg[S]``: for each slot,
  its index into ``split_rows``.

The block list is padded to at least one entry so that kernels never see an empty array.

The host lowering
-----------------
On the IPU a plan assigns non-zero blocks to tiles; on a GPU a *program instance* plays the tile.
The lowering here turns a :class:`~blocksparse.BlockPattern` into a
:class:`RowSplitSchedule`: which blocks each program handles.

**Load balance.** A GPU hands programs to multiprocessors as they free up, so the finish time
is about ``max(total work / parallel slots, longest program)``. With one program per block row,
a pattern whose row lengths follow a power law has a few rows hundreds of times longer than the
mean, and the longest program dominates. The lowering caps a program at ``max_len`` blocks:
longer rows are split into near-equal pieces (PopSparse's "consecutive tiles take contiguous
chunks of a row, partials reduced afterwards"), the pieces write float32 partials, and a small
combine step sums them into the split rows only. Programs are issued unit-fastest (every unit
of dense column tile 0, then of tile 1, ...: the tile of the dense operand stays in L2 while the
sparse blocks stream), so ``max_len`` is about one slot's share of *one tile's* work (and at
least twice the mean row length, so a uniform pattern is not split for nothing); see
:func:`choose_max_len`. Units are issued longest first (LPT order) within each tile, so the short
ones fill the gaps at the end.

The device's facts (its SM count) come from :mod:`blocksparse.hardware`, the measured ceilings of
:func:`estimate_seconds` from :mod:`.tuned`; the kernels never depend on them for correctness.

The traced twin
---------------
It is the traced twin of :func:`lower` (which builds the same structure on
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
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from ... import hardware
from ..._pattern import BlockPattern
from ..._util import Pytree, cdiv, next_power_of_2
from . import tuned

__all__ = [
    "GpuLowering",
    "PROGRAMS_PER_SM",
    "RowSplitSchedule",
    "kernel_constant",
    "TracedSchedule",
    "choose_max_len",
    "combine_partials",
    "contraction_splits",
    "dynamic_max_len",
    "estimate_seconds",
    "execute_dsd",
    "lower",
    "redistribute",
]


# --------------------------------------------------------------------------------------------
# The schedule type
# --------------------------------------------------------------------------------------------
def _frozen(a) -> np.ndarray:
    a = np.ascontiguousarray(a, dtype=np.int32)
    a.setflags(write=False)
    return a


class _Sizes:
    """Sizes shared by both schedule types (host and traced)."""

    @property
    def num_units(self) -> int:
        """``U``: the number of units (programs per tile of the dense operand)."""
        return int(self.unit_start.shape[0])

    @property
    def num_partials(self) -> int:
        """``S``: the number of float32 partial slots (units of split rows)."""
        return int(self.partial_seg.shape[0])


@dataclasses.dataclass(frozen=True, eq=False)
class RowSplitSchedule(_Sizes):
    """Units of at most ``max_len`` blocks of one output row; see the module docstring.

    Attributes:
        num_rows: output block rows (``m // bh`` for ``dsd``, ``k // bw`` for ``dds``).
        max_len: the most blocks one unit holds.
        unit_start, unit_len, unit_dest: ``int32[U]``.
        block_col, block_id: ``int32[max(nnz, 1)]``.
        split_rows: ``int32[R]``; partial_seg: ``int32[S]``.
        nnz: the number of real blocks (the block list may hold one pad entry).
    """

    num_rows: int
    max_len: int
    unit_start: np.ndarray
    unit_len: np.ndarray
    unit_dest: np.ndarray
    block_col: np.ndarray
    block_id: np.ndarray
    split_rows: np.ndarray
    partial_seg: np.ndarray
    nnz: int
    key: str = dataclasses.field(default="")

    def __post_init__(self):
        for name in ("unit_start", "unit_len", "unit_dest", "block_col", "block_id", "split_rows", "partial_seg"):
            object.__setattr__(self, name, _frozen(getattr(self, name)))
        u = self.unit_start.shape[0]
        if self.unit_len.shape != (u,) or self.unit_dest.shape != (u,):
            raise ValueError(
                f"Expected unit_start, unit_len and unit_dest of one length. Got {self.unit_start.shape}, "
                f"{self.unit_len.shape} and {self.unit_dest.shape}."
            )
        if self.block_col.shape != self.block_id.shape or self.block_col.shape[0] < max(self.nnz, 1):
            raise ValueError(
                f"Expected block_col and block_id of length max(nnz, 1) = {max(self.nnz, 1)}. "
                f"Got {self.block_col.shape} and {self.block_id.shape}."
            )
        if u and int(self.unit_len.max()) > self.max_len:
            raise ValueError(
                f"Expected units of at most max_len={self.max_len} blocks. Got {int(self.unit_len.max())}."
            )

    def __hash__(self) -> int:
        return hash((self.key, self.num_rows, self.max_len, self.num_units))

    def __eq__(self, other) -> bool:
        return (
            isinstance(other, RowSplitSchedule)
            and self.key == other.key
            and self.num_rows == other.num_rows
            and self.max_len == other.max_len
            and all(
                np.array_equal(getattr(self, f), getattr(other, f))
                for f in ("unit_start", "unit_len", "unit_dest", "block_col", "block_id", "split_rows", "partial_seg")
            )
        )

    def check(self) -> None:
        """Validate the invariants (used by tests): every block in exactly one unit, rows covered once."""
        covered = np.zeros(self.nnz, np.int64)
        direct = np.zeros(self.num_rows, np.int64)
        for s, n, d in zip(self.unit_start, self.unit_len, self.unit_dest, strict=True):
            covered[s : s + n] += 1
            if d >= 0:
                direct[d] += 1
            elif not 0 <= -1 - d < self.num_partials:
                raise AssertionError(f"unit writes partial slot {-1 - d}, outside [0, {self.num_partials})")
        if self.nnz and not (covered == 1).all():
            raise AssertionError("every block must belong to exactly one unit")
        split = np.zeros(self.num_rows, np.int64)
        split[self.split_rows] = 1
        if not ((direct + split) == 1).all():
            raise AssertionError("every output row must be written directly once or assembled from partials")


# --------------------------------------------------------------------------------------------
# Host lowering of a static pattern
# --------------------------------------------------------------------------------------------
#: Programs one SM is assumed to run at once by the load-balance heuristic (:func:`choose_max_len`): a "slot".
PROGRAMS_PER_SM = 2


@dataclasses.dataclass(frozen=True)
class GpuLowering:
    """Options of :func:`lower` (hashable: part of the cache key).

    Attributes:
        op: ``"dsd"`` (units are block rows of W) or ``"dds"`` (units are block columns of W,
            walked through the cached transpose; ``block_id`` points into the original data).
        tiles: programs per unit along the dense dimension (``n / tn``); each multiplies the
            work, which the balance heuristic needs.
        max_len: force the cap on blocks per unit (``None``: choose it, see the module docstring).
        min_len: never split a row into pieces shorter than this (partials cost a float32 write
            and a combine).
        num_sms: the GPU's streaming multiprocessors (``None``: :func:`blocksparse.hardware.gpu`'s, filled in by
            :func:`lower` before its cache is looked up).
    """

    op: str = "dsd"
    tiles: int = 1
    max_len: int | None = None
    min_len: int = 4
    num_sms: int | None = None

    @property
    def slots(self) -> int:
        """Programs that run at once (the unit of a "wave"): :data:`PROGRAMS_PER_SM` on each SM."""
        return (self.num_sms or hardware.gpu().num_sms) * PROGRAMS_PER_SM


def choose_max_len(row_lengths: np.ndarray, options: GpuLowering) -> int:
    """The cap on blocks per unit for these row lengths (see the module docstring).

    Programs are issued unit-fastest (all units of column tile 0, then tile 1, ...), so the
    balance bound is per tile: a unit should hold at most one slot's share of one tile's work,
    ``nnz / slots``. Rows up to twice the mean are never split (the float32 partials and the
    combine would cost more than the imbalance). If there are too few rows to give every slot a
    program, rows are split further, down to ``nnz * tiles / slots`` blocks per unit.
    """
    if options.max_len is not None:
        if options.max_len < 1:
            raise ValueError(f"Expected max_len >= 1. Got {options.max_len}.")
        return int(options.max_len)
    nnz = int(row_lengths.sum())
    if nnz == 0:
        return 1
    slots = options.slots
    tiles = max(options.tiles, 1)
    nonempty = max(int((row_lengths > 0).sum()), 1)
    mean = nnz / nonempty
    cap = max(int(options.min_len), math.ceil(2 * mean), cdiv(nnz, slots))
    if nonempty * tiles < slots:  # too few programs to fill the machine: split for parallelism
        cap = min(cap, max(int(options.min_len), cdiv(nnz * tiles, slots)))
    return cap


def _row_split(indptr: np.ndarray, cols: np.ndarray, ids: np.ndarray, max_len: int, key: str) -> RowSplitSchedule:
    num_rows = indptr.shape[0] - 1
    lengths = np.diff(indptr).astype(np.int64)
    pieces = np.maximum(1, cdiv(lengths, max_len))  # empty rows still get one unit (writes zeros)
    unit_row = np.repeat(np.arange(num_rows), pieces)
    # Piece q of p over a row of L blocks: [q * L // p, (q + 1) * L // p) -> near-equal pieces.
    first = np.repeat(np.cumsum(pieces) - pieces, pieces)
    q = np.arange(unit_row.size) - first
    p = pieces[unit_row]
    length = lengths[unit_row]
    lo = q * length // p
    hi = (q + 1) * length // p
    unit_start = indptr[unit_row] + lo
    unit_len = hi - lo
    split = p > 1
    unit_dest = unit_row.copy()
    num_partials = int(split.sum())
    unit_dest[split] = -1 - np.arange(num_partials)
    split_rows = np.flatnonzero(pieces > 1)
    seg_of_row = np.full(num_rows, -1, np.int64)
    seg_of_row[split_rows] = np.arange(split_rows.size)
    partial_seg = seg_of_row[unit_row[split]]
    # LPT: longest units first (stable, so ties stay in row order for locality).
    order = np.argsort(-unit_len, kind="stable")
    nnz = int(indptr[-1])
    pad = 1 if nnz == 0 else 0
    return RowSplitSchedule(
        num_rows=num_rows,
        max_len=max_len,
        unit_start=unit_start[order],
        unit_len=unit_len[order],
        unit_dest=unit_dest[order],
        block_col=np.concatenate([cols, np.zeros(pad, np.int64)]),
        block_id=np.concatenate([ids, np.zeros(pad, np.int64)]),
        split_rows=split_rows,
        partial_seg=partial_seg,
        nnz=nnz,
        key=key,
    )


def lower(pattern: BlockPattern, options: GpuLowering = GpuLowering()) -> RowSplitSchedule:
    """Lower a static pattern to the work list of the GPU kernels (host NumPy, cached).

    Arguments:
        pattern: the block pattern of ``W``.
        options: a :class:`GpuLowering`; ``op="dsd"`` walks the block rows of ``W`` (output rows
            of ``W @ x``), ``op="dds"`` its block columns (output columns of ``x @ W``).

    Returns:
        A :class:`RowSplitSchedule`.

    Example::

        >>> import blocksparse as bs
        >>> from blocksparse.ops.matmul.schedule import GpuLowering, lower
        >>> p = bs.BlockPattern.power_law(0, (4096, 4096), (64, 64), 1 / 16)
        >>> s = lower(p, GpuLowering(tiles=32))
        >>> int(s.unit_len.max()) <= s.max_len
        True
    """
    if options.num_sms is None:  # the device's SMs: part of the cache key
        options = dataclasses.replace(options, num_sms=hardware.gpu().num_sms)
    return _lower(pattern, options)


@functools.lru_cache(maxsize=512)
def _lower(pattern: BlockPattern, options: GpuLowering) -> RowSplitSchedule:
    if options.op == "dsd":
        indptr, cols = pattern.indptr, pattern.cols
        ids = np.arange(pattern.nnz_blocks, dtype=np.int64)
    elif options.op == "dds":
        t, perm = pattern.transpose()
        indptr, cols, ids = t.indptr, t.cols, perm
    else:
        raise ValueError(f"Expected op 'dsd' or 'dds'. Got {options.op!r}.")
    indptr = np.asarray(indptr, np.int64)
    max_len = choose_max_len(np.diff(indptr), options)
    return _row_split(
        indptr, np.asarray(cols, np.int64), np.asarray(ids, np.int64), max_len, pattern.fingerprint + options.op
    )


def contraction_splits(blocks: int, steps: int, split_below: int, programs: int, min_steps: int) -> int:
    """Programs per output block of an ``sdd``, each over a share of the contracted dimension's ``steps``.

    1 for at least ``split_below`` blocks; else the fewest splits that give ``programs`` programs, each of at
    least ``min_steps`` steps (and never more splits than steps).

    Example::

        >>> from blocksparse import hardware
        >>> sms = hardware.H200.num_sms
        >>> contraction_splits(4096, 64, sms, 2 * sms, 8), contraction_splits(36, 512, sms, 2 * sms, 8)
        (1, 8)
        >>> contraction_splits(36, 20, sms, 2 * sms, 8)  # 8 steps a split at least
        2
    """
    if blocks >= split_below:
        return 1
    return max(1, min(cdiv(programs, max(blocks, 1)), steps // min_steps, steps))


def kernel_constant(a) -> jax.Array:
    """A host index array as a kernel operand, kept by XLA as the stored constant it is.

    XLA's simplifier rewrites a constant whose elements are all equal into a broadcast, and a rank-1
    ``0, s, 2s, ...`` (any two elements starting at 0 are one) into an iota; either then runs as a kernel of its
    own on every call, one more launch per product (measured: docs/benchmarks.md, section "Hardware counters and
    the timed loop"). A host :class:`numpy.ndarray` gets two trailing elements that break both patterns; the kernels
    never read them (they index these arrays only through the schedule's counts). A traced array is returned as
    it is.

    Example::

        >>> import numpy as np
        >>> kernel_constant(np.arange(4)).tolist(), kernel_constant(np.array([0])).tolist()
        ([0, 1, 2, 3, -1, -3], [0, -1, -3])
    """
    if not isinstance(a, np.ndarray):
        return jnp.asarray(a)
    a = np.asarray(a, np.int32).reshape(-1)
    t = -2 if a.size and a[0] == -1 else -1  # never equal to the first element; t, t - 2: no common step with it
    return jnp.asarray(np.concatenate([a, np.array([t, t - 2], np.int32)]))


def estimate_seconds(flops: float, bytes_moved: float) -> float:
    """Roofline floor: the larger of compute time and memory time at the device's measured ceilings
    (:data:`~.tuned` ``HBM_BYTES_PER_S`` and ``BF16_FLOPS``)."""
    t = tuned.current()
    return max(flops / t.BF16_FLOPS, bytes_moved / t.HBM_BYTES_PER_S)


# --------------------------------------------------------------------------------------------
# The traced twin: built inside jit from a dynamic pattern
# --------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class TracedSchedule(_Sizes, Pytree):
    """A :class:`RowSplitSchedule` with traced contents (a pytree: the arrays are its leaves).

    Same field meanings; ``partial_seg`` has ``num_partials`` entries of which the last is the
    dummy slot for unused units.
    """

    _leaves = ("unit_start", "unit_len", "unit_dest", "block_col", "block_id", "split_rows", "partial_seg")
    _static = ("num_rows", "max_len")

    unit_start: jax.Array  # int32[U]
    unit_len: jax.Array  # int32[U]
    unit_dest: jax.Array  # int32[U]
    block_col: jax.Array  # int32[max(C, 1)]
    block_id: jax.Array  # int32[max(C, 1)]
    split_rows: jax.Array  # int32[R]
    partial_seg: jax.Array  # int32[S + 1]
    num_rows: int
    max_len: int


def dynamic_max_len(capacity: int, num_rows: int, lo: int = 4, hi: int = 64) -> int:
    """Twice the mean row length at full capacity, as a power of two in ``[lo, hi]``.

    A uniform pattern then rarely splits a row, while a row much longer than the mean is cut
    into pieces of about twice the mean, which bounds the longest program.
    """
    mean = capacity / max(num_rows, 1)
    target = max(lo, min(hi, 2 * mean))
    return next_power_of_2(math.ceil(target))


def redistribute(rows, cols, keep, num_rows: int, max_len: int | None = None) -> TracedSchedule:
    """Build the work list for block rows ``rows`` (``int32[C]``), block cols ``cols``.

    Arguments:
        rows, cols: traced block coordinates (``C`` = capacity).
        keep: ``bool[C]``, the blocks that take part (active and in range).
        num_rows: the number of output block rows (static).
        max_len: blocks per unit (static); default :func:`dynamic_max_len`.
    """
    cap = int(rows.shape[0])
    L = int(max_len or dynamic_max_len(cap, num_rows))
    gm = int(num_rows)
    n_units = gm + cdiv(cap, L)
    n_split_slots = min(n_units, 2 * cdiv(cap, L))
    n_split_rows = max(1, min(gm, cdiv(cap, L + 1)))
    i32 = jnp.int32

    key = jnp.where(keep, rows, gm).astype(i32)
    order = jnp.argsort(key, stable=True).astype(i32)
    counts = jnp.bincount(key, length=gm + 1)[:gm].astype(i32)
    indptr = jnp.concatenate([jnp.zeros(1, i32), jnp.cumsum(counts, dtype=i32)])
    nunits = jnp.maximum(1, cdiv(counts, L))
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
    if s == 0 or r == 0:  # no split rows (a host schedule without partials)
        return y
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
