"""One block-sparse matrix partitioned over the devices of a mesh axis.

A static pattern is host data, part of the program ``jit`` compiles, so per-device parts with
different patterns cannot share one ``shard_map`` program. :func:`shard` therefore stores each
device's part as a padded block COO of one common capacity (``rows``, ``cols``, ``data``, ``nnz``
with a leading device axis, sharded over the mesh axis); inside ``shard_map`` every device builds a
:class:`~blocksparse.DynamicBlockSparseMatrix` from its slice (the dynamic path, which needs no
host pattern) and one program serves every device.

Two splits, each with contiguous cut points either balancing the non-zero blocks (``balance="blocks"``,
cut on the cumulative block counts) or giving every device the same number of block lines
(``balance="lines"``):

- ``"rows"``: each device owns a range of block rows and writes those output rows; it needs all
  of ``x``. Equal ranges leave the output sharded by rows with no collective; unequal ones are
  padded to the largest range and all-gathered (a replicated output).
- ``"cols"``: each device owns a range of block columns and needs only those rows of ``x``; the
  partial full-height outputs are summed with ``psum`` (replicated output) or ``psum_scatter``
  (output sharded by rows).

``split=None`` picks the candidate with the smallest estimated time per column of ``x``: the busiest
device's blocks at the measured block rate plus the bytes it receives (the rows of ``x`` it lacks and the
output a collective brings it) at the measured link rate (:mod:`.tuned`: ``block_flops_per_s`` and
``link_bytes_per_s`` of the device kind's entry). The choice and every candidate's estimate are recorded in
:attr:`ShardedBlockSparseMatrix.plan`.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from .._matrix import BlockSparseMatrix, DynamicBlockSparseMatrix, NoImplicitDense
from .._pattern import BlockPattern
from .._util import Pytree
from ..ops import record, resolve
from ..ops.matmul import order
from ..ops.matmul.api import apply_2d, canonical_precision, result_dtype
from ..ops.matmul.api import matmul as _matmul
from ..ops.matmul.schedule import GpuLowering, TracedSchedule, lower
from . import _cuts, tuned

__all__ = ["ShardCandidate", "ShardPlan", "ShardedBlockSparseMatrix", "matmul", "shard"]

_SPLITS = ("rows", "cols")
_REDUCTIONS = ("psum", "psum_scatter")


_PLACEMENTS = ("replicated", "sharded")


@dataclasses.dataclass(frozen=True)
class ShardCandidate:
    """One way of partitioning, with its estimate (per column of ``x``; multiply by ``n``).

    Attributes:
        split: ``"rows"`` or ``"cols"``: which block lines each device owns.
        balance: ``"blocks"`` (cut points balance the non-zero blocks) or ``"lines"`` (equal numbers
            of block lines: uniform parts, so no padding and no gather, but maybe uneven work).
        collective: ``None``, ``"all_gather"``, ``"psum"`` or ``"psum_scatter"``.
        cuts: ``num_devices + 1`` block-line boundaries.
        blocks_per_device: non-zero blocks per device.
        bytes_received: bytes each device receives per column of ``x`` (``x``'s rows it lacks plus
            the output it receives).
        seconds: estimated time per column of ``x``: the busiest device's blocks at the rate
            ``block_flops_per_s`` plus ``bytes_received`` at ``link_bytes_per_s`` (:class:`.tuned.Rates`).
    """

    split: str
    balance: str
    collective: str | None
    cuts: tuple[int, ...]
    blocks_per_device: tuple[int, ...]
    bytes_received: int
    seconds: float


@dataclasses.dataclass(frozen=True)
class ShardPlan:
    """How a matrix is partitioned over a mesh axis (read-only; hashable, part of the pytree's static structure).

    Attributes:
        split: ``"rows"`` or ``"cols"``: which block lines each device owns.
        collective: what combines the per-device outputs of ``W @ x``: ``None`` (rows split with
            equal ranges: the output stays sharded by rows), ``"all_gather"`` (rows split with
            unequal ranges), ``"psum"`` or ``"psum_scatter"`` (cols split).
        estimated_bytes: bytes each device receives per column of ``x`` (``x``'s rows it lacks plus
            the output it receives); multiply by ``n`` for a product with ``n`` columns.
        candidates: every :class:`ShardCandidate` considered, the chosen one among them.
        blocks_per_device: how many non-zero blocks each device holds.
        cuts: ``num_devices + 1`` block-line boundaries: device ``i`` owns lines ``[cuts[i], cuts[i+1])``.
        capacity: the padded number of blocks per device (the largest part, at least 1).
        x_placement: where the plan assumed ``x`` lives: ``"replicated"`` or ``"sharded"`` (its rows
            split evenly over the axis).
        estimated_seconds: the chosen candidate's time estimate per column of ``x``.
    """

    split: str
    collective: str | None
    estimated_bytes: int
    candidates: tuple[ShardCandidate, ...]
    blocks_per_device: tuple[int, ...]
    cuts: tuple[int, ...]
    capacity: int
    x_placement: str = "replicated"
    estimated_seconds: float = 0.0

    @property
    def num_devices(self) -> int:
        return len(self.blocks_per_device)

    @property
    def band(self) -> int:
        """The largest number of block lines a device owns (every part is padded to it, at least 1)."""
        return _cuts.band(self.cuts)

    @property
    def uniform(self) -> bool:
        """Whether every device owns the same number of block lines (no padding, no gather)."""
        return self.band * self.num_devices == self.cuts[-1]

    def bytes_for(self, n: int) -> int:
        """The byte estimate for a product with ``n`` columns."""
        return int(self.estimated_bytes) * int(n)

    def seconds_for(self, n: int) -> float:
        """The time estimate for a product with ``n`` columns."""
        return float(self.estimated_seconds) * int(n)


def _candidate(split, balance, counts, grid, block_size, itemsize, parts, reduction, x_placement,
               rates: tuned.Rates) -> ShardCandidate:  # fmt: skip
    """One candidate and its estimate: the busiest device's compute plus the bytes it receives."""
    (gm, gk), (bh, bw) = grid, block_size
    cuts = _cuts.balanced_cuts(counts, parts) if balance == "blocks" else _cuts.equal_cuts(counts.size, parts)
    cum = np.concatenate([[0], np.cumsum(counts)])
    per_device = tuple(int(cum[b] - cum[a]) for a, b in zip(cuts[:-1], cuts[1:], strict=True))
    band = _cuts.band(cuts)
    k_rows = gk * bw
    if split == "rows":
        # Every device needs all of x: nothing to move if it is replicated, an all-gather if sharded.
        x_bytes = 0 if x_placement == "replicated" else (parts - 1) / parts * k_rows * itemsize
        collective = None if band * parts == gm else "all_gather"
        out_bytes = 0 if collective is None else (parts - 1) * band * bh * itemsize
    else:
        # Its band of x's rows: local if x is replicated, or sharded evenly and the bands are equal.
        even = band * parts == gk
        x_bytes = 0 if x_placement == "replicated" or even else (parts - 1) / parts * band * bw * itemsize
        m = gm * bh
        collective = reduction or ("psum_scatter" if m % parts == 0 else "psum")
        ring = (parts - 1) / parts * m * itemsize  # a ring reduce-scatter; an all-reduce moves twice that
        out_bytes = 2 * ring if collective == "psum" else ring
    received = int(x_bytes + out_bytes)
    compute = max(per_device, default=0) * 2 * bh * bw / rates.block_flops_per_s.value
    seconds = compute + _cuts.link_seconds(received, rates)
    return ShardCandidate(split, balance, collective, cuts, per_device, received, seconds)


def _assign(line: np.ndarray, cut: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(device, slot)`` of each block from its block line and the cut points; blocks keep the
    pattern's (row-major) order within a device."""
    parts = cut.size - 1
    device = _cuts.owner(line, cut)
    order = np.argsort(device, kind="stable")
    starts = np.concatenate([[0], np.cumsum(np.bincount(device, minlength=parts))])
    slot = np.empty(line.size, np.int64)
    slot[order] = np.arange(line.size) - starts[device[order]]
    return device, slot


def shard(W: BlockSparseMatrix, mesh: Mesh, axis: str, *, split: str | None = None,
          collective: str | None = None, balance: str | None = None,
          x_placement: str = "replicated") -> ShardedBlockSparseMatrix:  # fmt: skip
    """Partition the non-zero blocks of ``W`` over the devices of ``mesh``'s axis ``axis``.

    Arguments:
        W: a :class:`~blocksparse.BlockSparseMatrix` (its pattern is host data; its values may be
            traced, so ``shard`` may run inside ``jit`` and is differentiable w.r.t. ``W.data``).
        mesh, axis: the mesh and the name of the axis whose devices share the blocks (other mesh
            axes hold copies).
        split: ``"rows"``, ``"cols"`` or ``None`` (the candidate with the smallest estimated time: the
            busiest device's blocks plus the bytes it receives, see :class:`ShardCandidate`).
        collective: for the cols split, ``"psum"`` (replicated output) or ``"psum_scatter"`` (output
            sharded by rows; needs ``m`` divisible by the number of devices); ``None`` prefers
            ``"psum_scatter"`` where it applies.
        balance: ``"blocks"`` (cut points balance the non-zero blocks), ``"lines"`` (equal numbers of
            block lines: no padding and, for the rows split, no collective at all) or ``None`` (the
            faster by the estimate).
        x_placement: where ``x`` of ``Ws @ x`` will live, for the estimate: ``"replicated"`` on every
            device of the axis (the default) or ``"sharded"`` (its rows split evenly over the axis).
            Any placement works; this only steers the choice.

    Returns:
        A :class:`ShardedBlockSparseMatrix`; ``Ws.plan`` says what was chosen and why.

    Example::

        >>> import jax, numpy as np, blocksparse as bs
        >>> mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("d",))
        >>> W = bs.random(jax.random.key(0), (64, 64), 16, 0.5)
        >>> Ws = bs.shard(W, mesh, "d", split="rows")
        >>> Ws.plan.blocks_per_device, Ws.plan.collective
        ((8,), None)
    """
    if not isinstance(W, BlockSparseMatrix):
        raise TypeError(f"Expected a BlockSparseMatrix (static pattern). Got {type(W).__name__}.")
    parts = _cuts.mesh_axis_size(mesh, axis)
    if split not in (None, *_SPLITS):
        raise ValueError(f"Expected split 'rows', 'cols' or None. Got {split!r}.")
    if collective not in (None, *_REDUCTIONS):
        raise ValueError(f"Expected collective 'psum', 'psum_scatter' or None. Got {collective!r}.")
    p = W.pattern
    m = W.shape[0]
    if collective == "psum_scatter" and m % parts:
        raise ValueError(
            f"Expected m divisible by the {parts} devices of mesh axis {axis!r} for psum_scatter. Got m={m}; "
            "use collective='psum'."
        )
    if collective is not None and split == "rows":
        raise ValueError(f"Expected collective=None with split='rows' (its outputs are gathered). Got {collective!r}.")
    if balance not in (None, "blocks", "lines"):
        raise ValueError(f"Expected balance 'blocks', 'lines' or None. Got {balance!r}.")
    if x_placement not in _PLACEMENTS:
        raise ValueError(f"Expected x_placement 'replicated' or 'sharded'. Got {x_placement!r}.")
    itemsize = jnp.dtype(W.dtype).itemsize
    rates = tuned.rates()
    counts_of = {"rows": np.bincount(p.rows, minlength=p.grid[0]), "cols": np.bincount(p.cols, minlength=p.grid[1])}
    candidates = tuple(
        _candidate(
            s,
            bal,
            counts_of[s],
            p.grid,
            p.block_size,
            itemsize,
            parts,
            collective if s == "cols" else None,
            x_placement,
            rates,
        )  # fmt: skip
        for s in _SPLITS
        for bal in ("blocks", "lines")
    )
    if split is None and collective is not None:
        split = "cols"
    allowed = [c for c in candidates if split in (None, c.split) and balance in (None, c.balance)]
    chosen = _cuts.fastest(allowed)  # ties: rows first, then balanced by blocks
    split = chosen.split
    line = p.rows if split == "rows" else p.cols
    cut = np.asarray(chosen.cuts)
    device, slot = _assign(line, cut)
    counts = np.bincount(device, minlength=parts)
    capacity = max(1, int(counts.max(initial=0)))
    # Padding points at an extra zero block.
    index = np.full((parts, capacity), p.nnz_blocks, np.int64)
    index[device, slot] = np.arange(p.nnz_blocks)
    rows = np.zeros((parts, capacity), np.int32)
    cols = np.zeros((parts, capacity), np.int32)
    local_line = line - cut[device]
    rows[device, slot] = local_line if split == "rows" else p.rows
    cols[device, slot] = p.cols if split == "rows" else local_line
    plan = ShardPlan(split, chosen.collective, chosen.bytes_received, candidates, tuple(int(c) for c in counts),
                     chosen.cuts, capacity, x_placement, chosen.seconds)  # fmt: skip
    padded = jnp.concatenate([W.data, jnp.zeros((1, *p.block_size), W.dtype)])
    sharding = NamedSharding(mesh, P(axis))
    put = lambda a: jax.device_put(a, sharding)  # noqa: E731
    return ShardedBlockSparseMatrix._from_fields(
        rows=put(rows), cols=put(cols), data=put(padded[index]), nnz=put(counts.astype(np.int32)),
        pattern=p, mesh=mesh, axis=axis, plan=plan,
    )  # fmt: skip


class ShardedBlockSparseMatrix(NoImplicitDense, Pytree):
    """A block-sparse matrix whose blocks are partitioned over the devices of one mesh axis.

    Made by :func:`shard`. Leaves (each with a leading device axis, sharded ``P(axis)``):
    ``rows`` and ``cols`` ``(devices, capacity)`` local block coordinates, ``data``
    ``(devices, capacity, bh, bw)``, ``nnz`` ``(devices,)``. Static: the pattern (so shape and block
    size), the mesh, the axis name and the :class:`ShardPlan`. ``Ws @ x`` and ``x @ Ws`` run
    :func:`matmul`; gradients w.r.t. ``Ws.data`` are laid out like ``Ws.data`` (padding zero).
    """

    __slots__ = ("rows", "cols", "data", "nnz", "pattern", "mesh", "axis", "plan")
    __array_priority__ = 100
    _leaves = ("rows", "cols", "data", "nnz")
    _static = ("pattern", "mesh", "axis", "plan")

    shape = property(lambda self: self.pattern.shape)
    block_size = property(lambda self: self.pattern.block_size)
    nnz_blocks = property(lambda self: self.pattern.nnz_blocks)
    dtype = property(lambda self: self.data.dtype)
    split = property(lambda self: self.plan.split)
    collective = property(lambda self: self.plan.collective)
    estimated_bytes = property(lambda self: self.plan.estimated_bytes)
    blocks_per_device = property(lambda self: self.plan.blocks_per_device)
    ndim = 2

    def __repr__(self) -> str:
        return (
            f"ShardedBlockSparseMatrix(shape={self.shape}, block_size={self.block_size}, nnz_blocks={self.nnz_blocks}, "
            f"axis={self.axis!r}, split={self.split!r}, collective={self.collective!r}, "
            f"blocks_per_device={self.blocks_per_device})"
        )

    def _index(self) -> tuple[np.ndarray, np.ndarray]:
        """``(device, slot)`` of each of the pattern's blocks (host, in the pattern's order)."""
        return _assign(self.pattern.rows if self.split == "rows" else self.pattern.cols, np.asarray(self.plan.cuts))

    def with_data(self, data) -> ShardedBlockSparseMatrix:
        """The same partition with new values of ``data``'s shape ``(devices, capacity, bh, bw)`` (may be traced)."""
        data = jnp.asarray(data)
        if data.shape != self.data.shape:
            raise ValueError(f"Expected data of shape {self.data.shape} (devices, capacity, bh, bw). Got {data.shape}.")
        return self._replace(data=data)

    def to_static(self) -> BlockSparseMatrix:
        """The same matrix on the default placement as a :class:`~blocksparse.BlockSparseMatrix`."""
        device, slot = self._index()
        return BlockSparseMatrix._from_fields(pattern=self.pattern, data=self.data[device, slot])

    def to_dense(self) -> jax.Array:
        return self.to_static().to_dense()

    todense = to_dense

    def _matmul(self, other, swap: bool):
        return matmul(other, self) if swap else matmul(self, other)


# --------------------------------------------------------------------------------------------
# The forward of W @ x on the static kernels: each device's part is a static pattern, lowered on
# the host to its own work list; the lists are padded to one shape and stacked with a leading device
# axis, so one shard_map program runs the static-schedule kernel on every device (the dynamic scan
# kernel, which needs no host pattern, is slower per block). Gradients go through the dynamic path.
# --------------------------------------------------------------------------------------------
def _triton():
    """The Triton backend's module (its static-schedule kernel), imported on first use as ``bs.matmul`` loads
    its backends."""
    from ..ops.matmul import triton

    return triton


_SCHEDULE_FIELDS = ("unit_start", "unit_len", "unit_dest", "block_col", "block_id", "split_rows", "partial_seg")


@functools.lru_cache(maxsize=64)
def _stacked_schedules(pattern: BlockPattern, plan: ShardPlan, tiles: int, max_len: int | None):
    """Per-device :class:`~.ops.matmul.schedule.RowSplitSchedule` s, padded to one shape and stacked.

    Returns ``(arrays, num_rows, max_len)``: ``arrays`` maps each schedule field to an ``int32``
    array with a leading device axis, in the traced-schedule convention (a last dummy partial slot
    for padding units, whose segment and split rows are out of range and dropped).
    """
    parts, (bh, bw) = plan.num_devices, pattern.block_size
    line = pattern.rows if plan.split == "rows" else pattern.cols
    device, _ = _assign(line, np.asarray(plan.cuts))
    band = plan.band
    local_shape = (band * bh, pattern.shape[1]) if plan.split == "rows" else (pattern.shape[0], band * bw)
    scheds = []
    for d in range(parts):
        mine = device == d
        rows, cols = pattern.rows[mine], pattern.cols[mine]
        if plan.split == "rows":
            rows = rows - plan.cuts[d]
        else:
            cols = cols - plan.cuts[d]
        local = BlockPattern(local_shape, pattern.block_size, rows, cols)
        scheds.append(lower(local, GpuLowering(op="dsd", tiles=tiles, max_len=max_len)))
    num_rows = scheds[0].num_rows
    L = max(s.max_len for s in scheds)
    U = max(s.num_units for s in scheds)
    C = max(max(s.block_col.shape[0] for s in scheds), 1)
    S = max(s.num_partials for s in scheds)
    R = max(max(s.split_rows.shape[0] for s in scheds), 1)
    out = {f: [] for f in _SCHEDULE_FIELDS}
    for s in scheds:
        u, c, r, q = s.num_units, s.block_col.shape[0], s.split_rows.shape[0], s.num_partials
        out["unit_start"].append(np.pad(s.unit_start, (0, U - u)))
        out["unit_len"].append(np.pad(s.unit_len, (0, U - u)))
        out["unit_dest"].append(np.pad(s.unit_dest, (0, U - u), constant_values=-1 - S))  # the dummy slot
        out["block_col"].append(np.pad(s.block_col, (0, C - c)))
        out["block_id"].append(np.pad(s.block_id, (0, C - c)))
        out["split_rows"].append(np.concatenate([s.split_rows, num_rows + np.arange(R - r)]))
        out["partial_seg"].append(np.pad(s.partial_seg, (0, S + 1 - q), constant_values=R))
    return {f: np.stack(v).astype(np.int32) for f, v in out.items()}, num_rows, L


def _static_forward(ctx, data, x2):
    """``W @ x2`` for the rows split on the static-schedule kernels, one ``shard_map``."""
    (pattern, mesh, axis, plan), kwargs = ctx
    pt = _triton()
    kw = dict(kwargs)
    out_dtype = result_dtype(kw["preferred_element_type"], data.dtype, x2.dtype)
    exact = canonical_precision(kw["precision"]) == lax.Precision.HIGHEST
    n = x2.shape[1]
    bh = pattern.block_size[0]
    tn = pt.tile_for(bh, n, plan.band)
    arrays, num_rows, L = _stacked_schedules(pattern, plan, -(-n // tn), pt.TritonConfig().max_len)
    fields = tuple(jnp.asarray(arrays[f]) for f in _SCHEDULE_FIELDS)
    dt = jnp.result_type(data.dtype, x2.dtype)

    def local(data, xl, *fields):
        sched = TracedSchedule(*(f[0] for f in fields), num_rows, L)
        return pt.run_schedule(sched, num_rows * bh, data[0].astype(dt), xl.astype(dt), out_dtype, tn, exact=exact)

    record("sharded_dsd", "pallas")
    spec = P(axis)
    # No collective inside, so no axis types to check (and Pallas' interpreter, which tests run on the
    # CPU, trips over them: it mixes varying and replicated operands in its own slicing).
    f = jax.shard_map(local, mesh=mesh, in_specs=(spec, P(), *(spec,) * len(fields)), out_specs=spec,
                      check_vma=False)  # fmt: skip
    y = f(data, x2, *fields)
    return y if plan.uniform else _gather_rows(y, plan, mesh, bh)


def _gather_rows(y, plan: ShardPlan, mesh, block: int):
    """The real rows of per-device parts padded to the largest range (``block`` rows per block line),
    in order and replicated: the all-gather of a split whose ranges differ."""
    keep = np.concatenate([d * plan.band * block + np.arange((plan.cuts[d + 1] - plan.cuts[d]) * block)
                           for d in range(plan.num_devices)])  # fmt: skip
    return lax.with_sharding_constraint(y[keep], NamedSharding(mesh, P()))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _static_product(ctx, rows, cols, nnz, data, x2):
    return _static_forward(ctx, data, x2)


def _static_product_fwd(ctx, rows, cols, nnz, data, x2):
    # Under differentiation: the dynamic path, whose VJP gives the gradients (and its forward the output).
    (pattern, mesh, axis, plan), kwargs = ctx
    Ws = ShardedBlockSparseMatrix._from_fields(rows=rows, cols=cols, data=data, nnz=nnz, pattern=pattern, mesh=mesh,
                                               axis=axis, plan=plan)  # fmt: skip
    y, vjp = jax.vjp(lambda d, x: _local_product(Ws._replace(data=d), x, False, dict(kwargs), static=False), data, x2)
    return y, vjp


def _static_product_bwd(ctx, vjp, g):
    ddata, dx = vjp(g)
    return None, None, None, ddata, dx


_static_product.defvjp(_static_product_fwd, _static_product_bwd)


def _static_kernels_apply(Ws: ShardedBlockSparseMatrix, x2, kwargs) -> bool:
    """Whether ``Ws @ x2`` runs its forward on the static-schedule kernels: the rows split, with the
    Pallas kernels first in ``implementation`` and able to take these inputs."""
    pt = _triton()
    if Ws.plan.split != "rows" or 0 in x2.shape:  # nothing to compute: the dynamic path returns zeros
        return False
    impls = resolve(kwargs["implementation"], order.DEFAULT)
    return impls[0] == "pallas" and pt.kernels_accept(Ws.block_size, Ws.dtype, x2.dtype)


def _local_product(Ws: ShardedBlockSparseMatrix, x2, transposed: bool, kwargs, static: bool = True) -> jax.Array:
    """``W @ x2`` (``W^T @ x2`` if ``transposed``) for a 2-D ``x2``, through one ``shard_map``.

    ``static``: run the forward of a rows-split ``W @ x2`` on the static-schedule kernels where they apply.
    """
    if static and not transposed and _static_kernels_apply(Ws, x2, kwargs):
        ctx = ((Ws.pattern, Ws.mesh, Ws.axis, Ws.plan), tuple(sorted(kwargs.items())))
        return _static_product(ctx, Ws.rows, Ws.cols, Ws.nnz, Ws.data, x2)
    plan, axis, mesh, parts = Ws.plan, Ws.axis, Ws.mesh, Ws.plan.num_devices
    (m, k), (bh, bw) = Ws.shape, Ws.block_size
    band, cuts, n = plan.band, plan.cuts, x2.shape[1]
    local_shape = (band * bh, k) if plan.split == "rows" else (m, band * bw)
    # Which dimension of the product is split: the output's (each device writes its own rows) or
    # the contracting one (each device adds a partial product of the full height).
    splits_output = (plan.split == "rows") != transposed
    b_split = bh if plan.split == "rows" else bw  # the block extent along the split dimension
    out_dim = k if transposed else m
    if splits_output:
        x_spec, x_in = P(), x2
        if plan.uniform:
            collective, out_spec = None, P(axis)
        else:
            # Each device's rows padded to the largest range; gathered after the shard_map.
            collective, out_spec = "all_gather", P(axis)
    else:
        x_spec = P(axis)
        if plan.uniform:
            x_in = x2
        else:  # each device's band of x's rows, padded with a zero row to the largest band
            take = np.full((parts, band * b_split), x2.shape[0], np.int64)
            for d in range(parts):
                r = np.arange(cuts[d] * b_split, cuts[d + 1] * b_split)
                take[d, : r.size] = r
            x_in = jnp.concatenate([x2, jnp.zeros((1, n), x2.dtype)])[take.reshape(-1)]
        scatter = plan.collective != "psum" and out_dim % parts == 0
        collective = "psum_scatter" if scatter else "psum"
        out_spec = P(axis) if scatter else P()
        if parts == 1:  # one device holds the whole sum: nothing to reduce (P(axis) is P() on one device)
            collective, out_spec = None, P(axis)

    def local(rows, cols, data, nnz, xl):
        D = DynamicBlockSparseMatrix(rows[0], cols[0], data[0], nnz[0], local_shape, Ws.block_size)
        y = _matmul(D.T if transposed else D, xl, **kwargs)
        if collective == "psum":
            return lax.psum(y, axis)
        if collective == "psum_scatter":
            return lax.psum_scatter(y, axis, scatter_dimension=0, tiled=True)
        return y

    spec = P(axis)
    f = jax.shard_map(local, mesh=mesh, in_specs=(spec, spec, spec, spec, x_spec), out_specs=out_spec)
    y = f(Ws.rows, Ws.cols, Ws.data, Ws.nnz, x_in)
    if collective == "all_gather":
        y = _gather_rows(y, plan, mesh, b_split)
    return y


def matmul(a, b, *, implementation=None, precision=None, preferred_element_type=None) -> jax.Array:
    """``Ws @ x`` or ``x @ Ws`` for a :class:`ShardedBlockSparseMatrix` and a dense, globally shaped ``x``.

    Shapes and arguments are those of :func:`blocksparse.matmul` (``x`` may have batch
    dimensions). ``x`` may be placed anyhow: inside ``jit`` it is resharded to what the split needs.
    For a 2-D ``x``, the result of ``Ws @ x`` is sharded by rows over the mesh axis (rows split with
    equal ranges, or ``psum_scatter``) or replicated (``all_gather``, ``psum``); ``x @ Ws`` is the
    same with the roles of rows and columns swapped (sharded along its last dimension).
    Differentiable w.r.t. ``x`` and ``Ws.data``.
    """
    kwargs = dict(implementation=implementation, precision=precision, preferred_element_type=preferred_element_type)
    a_sharded, b_sharded = isinstance(a, ShardedBlockSparseMatrix), isinstance(b, ShardedBlockSparseMatrix)
    if a_sharded == b_sharded:
        raise TypeError(
            f"Expected exactly one ShardedBlockSparseMatrix operand. Got {type(a).__name__} and {type(b).__name__}."
        )
    if a_sharded:
        Ws, x = a, jnp.asarray(b)
        return apply_2d(Ws.shape, x, lambda x2: _local_product(Ws, x2, False, kwargs), sparse_first=True)
    x, Ws = jnp.asarray(a), b
    return apply_2d(Ws.shape, x, lambda x2: _local_product(Ws, x2.T, True, kwargs).T, sparse_first=False)


# bs.matmul hands a sharded operand (on either side) to this module's product.
ShardedBlockSparseMatrix._bs_matmul = staticmethod(matmul)
