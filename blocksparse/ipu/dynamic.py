"""The IPU model of PopSparse's *dynamic* sparsity: plan, bucket distribution and tile simulator.

With dynamic sparsity only the shape, the block size and the maximum number of non-zero blocks
are known when the program is built; the pattern and the values change on every call
(Li et al. 2023, arXiv:2303.16999; poplibs ``popsparse/FullyConnected*``). The model here:

* **Partition.** ``Y = W X`` is cut into a grid of ``pm x pk x pn`` partitions (block rows of
  ``W`` x block columns of ``W`` x pieces of ``n``), one per tile. Partition ``(i, j, s)`` is
  bucket ``q = (i * pk + j) * pn + s``; the ``pn`` buckets of one ``(i, j)`` form a *group*.
  The split sizes are searched with the cost model, like the static planner does.
* **Buckets.** Every bucket holds at most ``bucket_capacity = ceil(ceil(max_nnz / P) x (1 +
  bucket_oversize))`` blocks, ``P = pm pk pn`` (PopSparse's ``metaInfoBucketOversizeProportion``,
  default 0.3). :func:`distribute` (jit-able) sends each block to its home group, round-robin
  over the group's buckets; blocks that find their home bucket full spill to other buckets,
  searched progressively wider (distance 1 up, 1 down, 2 up, 2 down, ...), as PopSparse does.
* **Phases.** On the device every tile of piece ``s`` must see every block of its group, and the
  blocks that spilled: the buckets are propagated between tiles in extra exchange phases
  (``pn - 1`` rounds within a group, plus one round for spills when there are several groups),
  each round followed by a metadata pass (which blocks of the received bucket are mine) and a
  compute pass over a full bucket. The machine model and the compute-rate formula are those of
  :mod:`.ipu` and :mod:`.cost` (the compute per bucket equals :func:`.cost.sparse_cost`'s
  compute phase for one tile holding ``bucket_capacity`` blocks).

:func:`simulate_dynamic` executes a plan bucket by bucket in JAX and equals ``D @ x``.
Constants and formulas are our estimates; they make a dynamic plan slower than the static plan
of the same pattern (as PopSparse reports), by the bucket oversize, the dense-operand exchange of
a whole partition and the extra propagation and metadata phases.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .._pattern import _pair
from . import cost as _cost
from .machines import BOW, IPUMachine
from .planner import NoValidPlanError, _check_int, _dtype_name, _Estimates

__all__ = [
    "DYNAMIC_PHASES",
    "DynamicPlan",
    "Distribution",
    "distribute",
    "dynamic_plan",
    "simulate_dynamic",
]

DYNAMIC_PHASES = (
    "exchange_dense",
    "exchange_buckets",
    "metadata",
    "zero_partials",
    "compute",
    "propagate",
    "exchange_partials",
    "reduction",
    "output",
)


def _cdiv(a, b):
    return -(-np.asarray(a) // b)


# --------------------------------------------------------------------------------------------------
# The plan
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class DynamicPlan(_Estimates):
    """A partition of ``W @ X`` over IPU tiles for a pattern known only by its maximum size.

    Attributes:
        shape, block_size: of ``W``.
        max_nnz_blocks: the most non-zero blocks any call may bring.
        n: columns of ``X``.
        machine, dtype, partials_dtype, available_memory_proportion: as for :func:`blocksparse.plan`.
        bucket_oversize: the extra bucket capacity over an even share.
        split: ``(pm, pk, pn)`` partitions of block rows, block columns and ``n``.
        rows_per_partition, cols_per_partition: block rows / block columns of one partition.
        n_pieces: ``int[pn, 2]`` ``[start, stop)`` of each piece of ``n``.
        bucket_capacity: blocks one bucket holds.
        propagation_rounds: exchange rounds that move buckets between tiles.
        bytes_per_tile: modelled memory of the busiest tile.
        cycles: estimated cycles per phase (:data:`DYNAMIC_PHASES`), worst case (full buckets).
        exchange_bytes: bytes moved per exchange phase, over all tiles.
        dense: the modelled dense matmul of the same shape (``None`` if it does not fit).
        candidates: number of partitions scored.
    """

    shape: tuple[int, int]
    block_size: tuple[int, int]
    max_nnz_blocks: int
    n: int
    machine: IPUMachine
    dtype: str
    partials_dtype: str
    available_memory_proportion: float
    bucket_oversize: float
    split: tuple[int, int, int]
    rows_per_partition: int
    cols_per_partition: int
    n_pieces: np.ndarray
    bucket_capacity: int
    propagation_rounds: int
    bytes_per_tile: float
    cycles: dict = field(repr=False)
    exchange_bytes: dict = field(repr=False)
    dense: _cost.DenseEstimate | None = field(repr=False)
    candidates: int = 0

    @property
    def grid(self) -> tuple[int, int]:
        return self.shape[0] // self.block_size[0], self.shape[1] // self.block_size[1]

    @property
    def num_buckets(self) -> int:
        """Partitions, one bucket and one tile each."""
        pm, pk, pn = self.split
        return pm * pk * pn

    @property
    def total_capacity(self) -> int:
        """Blocks all buckets together hold; :func:`distribute` places every block while nnz is at most this."""
        return self.num_buckets * self.bucket_capacity

    @property
    def _useful_blocks(self) -> int:
        """Blocks of useful work: the maximum number of non-zero blocks."""
        return self.max_nnz_blocks

    def __repr__(self) -> str:
        return (
            f"DynamicPlan({self.shape[0]}x{self.shape[1]} b={self.block_size} max_nnz_blocks={self.max_nnz_blocks} "
            f"@ n={self.n}, {self.dtype} on {self.machine.name}: split={self.split}, "
            f"bucket_capacity={self.bucket_capacity}, {self.seconds * 1e6:.3g} us)"
        )

    def to_dict(self) -> dict:
        """A JSON-serialisable summary."""
        gm, gk = self.grid
        return {
            "kind": "dynamic",
            "machine": self.machine.name,
            "shape": list(self.shape),
            "block_size": list(self.block_size),
            "max_nnz_blocks": self.max_nnz_blocks,
            "max_density": self.max_nnz_blocks / max(gm * gk, 1),
            "n": self.n,
            "dtype": self.dtype,
            "partials_dtype": self.partials_dtype,
            "available_memory_proportion": self.available_memory_proportion,
            "bucket_oversize": self.bucket_oversize,
            "split_mkn": list(self.split),
            "rows_per_partition": self.rows_per_partition,
            "cols_per_partition": self.cols_per_partition,
            "n_pieces": self.n_pieces.tolist(),
            "num_buckets": self.num_buckets,
            "bucket_capacity": self.bucket_capacity,
            "total_capacity": self.total_capacity,
            "propagation_rounds": self.propagation_rounds,
            "bytes_per_tile": self.bytes_per_tile,
            **self._estimates_dict(),
        }

    def report(self) -> str:
        """A readable table: partition, buckets, memory, cycles and bytes per phase, speedup."""
        (m, k), (bh, bw) = self.shape, self.block_size
        pm, pk, pn = self.split
        kib = 1024.0
        lines = [
            f"Dynamic block-sparse plan on {self.machine!r}",
            f"  W {m} x {k}, blocks {bh} x {bw}, at most {self.max_nnz_blocks} non-zero blocks"
            f"  @  X {k} x {self.n};  {self.dtype} (partials {self.partials_dtype})",
            f"  partitions m/k/n {pm}/{pk}/{pn} = {self.num_buckets} tiles of {self.machine.num_tiles} "
            f"({self.rows_per_partition} block rows x {self.cols_per_partition} block cols x "
            f"<= {int(np.diff(self.n_pieces, axis=1).max(initial=0))} columns); {self.candidates} partitions scored",
            f"  buckets: {self.num_buckets} x {self.bucket_capacity} blocks (oversize {self.bucket_oversize:g}, "
            f"total {self.total_capacity}); {self.propagation_rounds} propagation rounds",
            f"  memory per tile {self.bytes_per_tile / kib:.1f} KiB, limit {self.available_memory_proportion:g} x "
            f"{self.machine.tile_memory_bytes / kib:g} KiB = {self.memory_limit_bytes / kib:.1f} KiB",
            "",
            f"  {'phase':<20}{'cycles':>14}{'exchange MB':>14}",
        ]
        for name in DYNAMIC_PHASES:
            xb = self.exchange_bytes.get(name)
            lines.append(f"  {name:<20}{self.cycles[name]:>14,.0f}{'' if xb is None else f'{xb / 1e6:.3f}':>14}")
        lines.append(f"  {'total':<20}{self.total_cycles:>14,.0f}")
        lines.append("")
        lines.append(
            f"  estimated {self.seconds * 1e6:,.2f} us at {self.machine.clock_hz / 1e9:g} GHz, "
            f"{self.tflops:,.2f} TFLOP/s at max_nnz_blocks"
        )
        if self.dense is None:
            lines.append("  dense estimate: does not fit the memory limit")
        else:
            lines.append(
                f"  dense estimate  {self.dense.seconds * 1e6:,.2f} us;  "
                f"predicted speedup over dense {self.speedup:.2f}x"
            )
        return "\n".join(lines)

    __str__ = report


# --------------------------------------------------------------------------------------------------
# Cost model (vectorised over candidate splits)
# --------------------------------------------------------------------------------------------------
def _bucket_compute(mc: IPUMachine, blocks, rows, npc, block_size, dtype):
    """Cycles to multiply ``blocks`` blocks over ``rows`` block rows by an ``npc``-column piece.

    The same formula as the compute phase of :func:`.cost.sparse_cost` (vectorised over candidates).
    """
    bh, bw = block_size
    dbytes = np.dtype(dtype).itemsize
    grain = mc.column_grain(dtype)
    sub = mc.sub_block((bh, bw))
    nsub = (bh // sub) * (bw // sub)
    rate = mc.block_macs_per_cycle(sub, dtype)
    W = mc.num_workers
    blocks = np.asarray(blocks, np.float64)
    rows = np.asarray(rows, np.float64)
    if sub >= 4:
        n_eff = _cdiv(_cdiv(npc, W), grain) * grain * W
        per_block = nsub * (mc.block_overhead_cycles + sub * sub * dbytes / mc.load_bytes_per_cycle)
        per_block = per_block + nsub * mc.amp_pipeline_cycles + nsub * sub * sub * n_eff / rate
        out = mc.vertex_overhead_cycles + rows * mc.row_overhead_cycles + blocks * per_block
    else:
        n_eff = _cdiv(npc, grain) * grain
        per_elem = mc.elementwise_overhead_cycles + n_eff / rate
        out = mc.vertex_overhead_cycles + rows * bh * mc.row_overhead_cycles + blocks * nsub * sub * sub * per_elem
    return np.where(blocks > 0, out, 0.0)


def _dynamic_cost(mc, shape, block_size, max_nnz, n, dt, pdt, oversize, pm, pk, pn):
    """Cycles per phase, exchange bytes per phase and bytes per tile for arrays of candidate splits."""
    (m, k), (bh, bw) = shape, block_size
    gm, gk = m // bh, k // bw
    T = mc.num_tiles
    dbytes = np.dtype(dt).itemsize
    pbytes = np.dtype(pdt).itemsize
    grain = mc.column_grain(dt)
    n_grains = int(_cdiv(n, grain))
    P = pm * pk * pn
    mt = _cdiv(gm, pm)
    kt = _cdiv(gk, pk)
    npc = _cdiv(n_grains, pn) * grain
    cap = np.maximum(np.ceil(_cdiv(max_nnz, P) * (1.0 + oversize)).astype(np.int64), 1)
    groups = pm * pk
    spill_rounds = np.where(groups > 1, 1, 0)
    rounds = pn - 1 + spill_rounds  # bucket propagation rounds after the first
    visits = rounds + 1  # buckets each tile processes
    meta_block = 2 * mc.metadata_bytes_per_block  # a dynamic block carries its row and column
    bucket_bytes = cap * (bh * bw * dbytes + meta_block)
    sync = mc.exchange_sync_cycles
    xbw = mc.exchange_bytes_per_cycle
    reduce_rate = mc.vector_lanes.get(pdt, 1) / mc.elementwise_issue_overhead

    x_bytes = kt * bw * npc * dbytes  # the whole partition's rows of X: the pattern is unknown
    home_rows = np.minimum(cap, mt)
    spill_rows = np.minimum(cap, gm)
    compute = pn * _bucket_compute(mc, cap, home_rows, npc, block_size, dt)
    compute = compute + spill_rounds * _bucket_compute(mc, cap, spill_rows, npc, block_size, dt)
    split_k = pk > 1
    kred_rows = np.where(split_k, mt * (pk - 1) / pk, 0.0)  # rows a reducing tile receives from other k parts
    spill_in_rows = spill_rounds * spill_rows  # partial rows of spilled blocks, sent to their home tiles
    part_bytes = (kred_rows + spill_in_rows) * bh * npc * pbytes
    out_home = _cdiv(m * n, T) * dbytes
    x_home = _cdiv(k * n, T) * dbytes
    w_home = _cdiv(max_nnz * (bh * bw * dbytes + meta_block), T)  # values and metadata as the user gives them

    def xc(nbytes):
        return np.where(nbytes > 0, nbytes / xbw + sync, 0.0)

    cycles = {
        "exchange_dense": xc(x_bytes),
        "exchange_buckets": xc(bucket_bytes),
        "metadata": visits * (mc.vertex_overhead_cycles + cap * mc.block_overhead_cycles),
        "zero_partials": (mt + spill_in_rows) * bh * npc * pbytes / mc.store_bytes_per_cycle,
        "compute": compute,
        "propagate": rounds * (bucket_bytes / xbw + sync),
        "exchange_partials": xc(part_bytes),
        "reduction": np.where(
            part_bytes > 0, mc.vertex_overhead_cycles + (kred_rows + spill_in_rows) * bh * npc / reduce_rate, 0.0
        ),
        "output": xc(out_home + 0 * P),
    }
    cycles = {name: np.broadcast_to(np.asarray(v, np.float64), P.shape) for name, v in cycles.items()}
    nbytes = {
        "exchange_dense": (P * x_bytes).astype(np.float64),
        "exchange_buckets": (P * bucket_bytes).astype(np.float64),
        "propagate": (P * rounds * bucket_bytes).astype(np.float64),
        "exchange_partials": (P * part_bytes).astype(np.float64),
        "output": np.full(P.shape, float(m) * n * dbytes),
    }
    partials = (mt + spill_in_rows) * bh * npc * pbytes
    at_compute = x_home + w_home + 2 * bucket_bytes + x_bytes + partials
    at_reduce = x_home + w_home + partials + part_bytes + out_home
    memory = np.maximum(at_compute, at_reduce).astype(np.float64)
    return cycles, nbytes, memory, cap, rounds, mt, kt


def dynamic_plan(
    shape,
    block_size,
    max_nnz_blocks: int,
    n: int,
    machine: IPUMachine = BOW,
    dtype="float16",
    available_memory_proportion: float = 0.6,
    bucket_oversize: float = 0.3,
    *,
    partials_dtype="float32",
) -> DynamicPlan:
    """Plan a dynamic-sparsity ``W @ X`` on an IPU knowing only shape, block size and max non-zero blocks.

    Arguments:
        shape: ``(m, k)`` of ``W``; block_size: ``b`` or ``(bh, bw)``, dividing ``shape``.
        max_nnz_blocks: the most non-zero blocks any call may bring, in ``[0, (m / bh) (k / bw)]``.
        n: columns of ``X``.
        machine, dtype, available_memory_proportion, partials_dtype: as for :func:`blocksparse.plan`.
        bucket_oversize: extra bucket capacity over an even share (PopSparse's default 0.3), ``>= 0``.

    Returns:
        The cheapest :class:`DynamicPlan` (worst case: full buckets) whose busiest tile fits
        ``available_memory_proportion`` of tile memory.

    Raises:
        NoValidPlanError: when no split fits (the message names the smallest footprint and the limit).
    """
    if not isinstance(machine, IPUMachine):
        raise TypeError(f"Expected an IPUMachine such as bs.ipu.BOW or bs.ipu.MK2. Got {type(machine).__name__}.")
    try:
        m, k = (int(s) for s in shape)
    except (TypeError, ValueError):
        raise ValueError(f"Expected shape as a pair of integers (m, k). Got {shape!r}.") from None
    if m <= 0 or k <= 0:
        raise ValueError(f"Expected a positive shape (m, k). Got {shape!r}.")
    bh, bw = _pair(block_size)
    if bh <= 0 or bw <= 0 or m % bh or k % bw:
        raise ValueError(f"Expected a positive block size dividing shape {(m, k)}. Got {(bh, bw)}.")
    gm, gk = m // bh, k // bw
    max_nnz = _check_int("max_nnz_blocks", max_nnz_blocks, lo=0)
    if max_nnz > gm * gk:
        raise ValueError(
            f"Expected max_nnz_blocks <= {gm * gk} (a {gm} x {gk} grid of {bh} x {bw} blocks). Got {max_nnz}."
        )
    n = _check_int("n", n)
    dt = machine.check_dtype(_dtype_name(dtype))
    pdt = _dtype_name(partials_dtype)
    if pdt not in ("float16", "float32"):
        raise ValueError(f"Expected partials_dtype float16 or float32. Got {pdt}.")
    amp = float(available_memory_proportion)
    if not 0.0 < amp <= 1.0:
        raise ValueError(f"Expected available_memory_proportion in (0, 1]. Got {available_memory_proportion!r}.")
    ov = float(bucket_oversize)
    if not (ov >= 0.0 and math.isfinite(ov)):
        raise ValueError(f"Expected bucket_oversize >= 0 (PopSparse's default is 0.3). Got {bucket_oversize!r}.")

    T = machine.num_tiles
    grain = machine.column_grain(dt)
    n_grains = int(_cdiv(n, grain))
    pm, pk, pn = np.meshgrid(
        _cost._split_candidates(gm), _cost._split_candidates(gk), _cost._split_candidates(n_grains), indexing="ij"
    )
    pm, pk, pn = pm.ravel(), pk.ravel(), pn.ravel()
    ok = pm * pk * pn <= T
    pm, pk, pn = pm[ok], pk[ok], pn[ok]
    # Equal pieces only: drop splits whose last partition would be empty.
    ok = (
        (_cdiv(gm, _cdiv(gm, pm)) == pm)
        & (_cdiv(gk, _cdiv(gk, pk)) == pk)
        & (_cdiv(n_grains, _cdiv(n_grains, pn)) == pn)
    )
    pm, pk, pn = pm[ok], pk[ok], pn[ok]
    cycles, nbytes, memory, cap, rounds, mt, kt = _dynamic_cost(
        machine, (m, k), (bh, bw), max_nnz, n, dt, pdt, ov, pm, pk, pn
    )
    total = sum(cycles.values())
    limit = amp * machine.tile_memory_bytes
    fits = memory <= limit
    if not fits.any():
        i = int(np.argmin(memory))
        kib = 1024.0
        raise NoValidPlanError(
            f"No valid dynamic plan for W {m} x {k} (blocks {bh} x {bw}, at most {max_nnz} non-zero blocks) @ X "
            f"{k} x {n} in {dt} on {machine.name}: the smallest per-tile footprint over {pm.size} partitions is "
            f"{memory[i] / kib:.1f} KiB (split m/k/n {pm[i]}/{pk[i]}/{pn[i]}, bucket capacity {cap[i]}), above the "
            f"limit available_memory_proportion={amp:g} x {machine.tile_memory_bytes / kib:g} KiB = "
            f"{limit / kib:.1f} KiB. Raise available_memory_proportion, reduce n, max_nnz_blocks or "
            "bucket_oversize, or use float16."
        )
    # Cheapest that fits; ties to the smaller footprint, then fewer tiles.
    order = np.lexsort((pm * pk * pn, memory, np.where(fits, total, np.inf)))
    i = int(order[0])
    dense = _cost.dense_estimate(machine, m, k, n, dt, pdt, amp)
    split = (int(pm[i]), int(pk[i]), int(pn[i]))
    pieces = _cost.n_pieces(n, split[2], grain).astype(np.int64)
    pieces.setflags(write=False)
    return DynamicPlan(
        shape=(m, k),
        block_size=(bh, bw),
        max_nnz_blocks=max_nnz,
        n=n,
        machine=machine,
        dtype=dt,
        partials_dtype=pdt,
        available_memory_proportion=amp,
        bucket_oversize=ov,
        split=split,
        rows_per_partition=int(mt[i]),
        cols_per_partition=int(kt[i]),
        n_pieces=pieces,
        bucket_capacity=int(cap[i]),
        propagation_rounds=int(rounds[i]),
        bytes_per_tile=float(memory[i]),
        cycles={name: float(v[i]) for name, v in cycles.items()},
        exchange_bytes={name: float(v[i]) for name, v in nbytes.items()},
        dense=dense,
        candidates=int(pm.size),
    )


# --------------------------------------------------------------------------------------------------
# Distribution of the blocks of one call over the buckets (jit-able)
# --------------------------------------------------------------------------------------------------
class Distribution(NamedTuple):
    """Where :func:`distribute` put the blocks of one call (all fixed-shape ``int32`` arrays).

    Attributes:
        bucket_ids: ``[num_buckets, bucket_capacity]`` block positions (indices into rows/cols/data)
            in each bucket, padded with ``-1``.
        bucket_fill: ``[num_buckets]`` blocks in each bucket.
        block_bucket, block_slot: ``[L]`` bucket and slot of each input position (``-1`` for
            padding and for blocks that could not be placed).
        home_bucket: ``[L]`` the bucket each active block was aimed at first (``-1`` for padding).
        spilled: blocks placed outside their home bucket.
        overflow: active blocks placed nowhere; ``> 0`` only if ``nnz > num_buckets x bucket_capacity``.
    """

    bucket_ids: jax.Array
    bucket_fill: jax.Array
    block_bucket: jax.Array
    block_slot: jax.Array
    home_bucket: jax.Array
    spilled: jax.Array
    overflow: jax.Array


def _check_plan(dplan) -> None:
    if not isinstance(dplan, DynamicPlan):
        raise TypeError(f"Expected a DynamicPlan from bs.dynamic_plan(...). Got {type(dplan).__name__}.")


def distribute(dplan: DynamicPlan, rows, cols, nnz) -> Distribution:
    """Put the active blocks (positions ``< nnz``) of one call into the plan's buckets.

    Pure ``jnp`` with fixed shapes: usable under ``jit`` with the pattern changing every call.
    Each block goes to its home group (the partition of its block row and block column), dealt
    round-robin over the group's ``pn`` buckets in input order. Blocks whose home bucket is full
    spill to the nearest buckets with room, searched progressively wider: distance 1 up, 1 down,
    2 up, 2 down, ... (homes compete for a bucket in that order). Every active block is placed
    exactly once while ``nnz <= dplan.total_capacity``; otherwise the unplaced ones are counted
    in ``overflow``, never dropped silently. To turn that into an error under ``jit``, wrap the
    caller with ``jax.experimental.checkify.checkify`` and ``checkify.check(d.overflow == 0, ...)``.
    Out-of-range coordinates are clipped into the grid for the choice of home (see
    :meth:`~blocksparse.DynamicBlockSparseMatrix.is_valid`).
    """
    _check_plan(dplan)
    rows, cols, nnz = jnp.asarray(rows), jnp.asarray(cols), jnp.asarray(nnz)
    if rows.ndim != 1 or cols.shape != rows.shape:
        raise ValueError(f"Expected rows and cols of one 1-D shape (L,). Got {rows.shape} and {cols.shape}.")
    for name, a in (("rows", rows), ("cols", cols), ("nnz", nnz)):
        if not jnp.issubdtype(a.dtype, jnp.integer):
            raise TypeError(f"Expected integer {name}. Got dtype {a.dtype}.")
    if nnz.shape != ():
        raise ValueError(f"Expected nnz as a scalar. Got shape {nnz.shape}.")
    if not isinstance(nnz, jax.core.Tracer) and not 0 <= int(nnz) <= rows.shape[0]:
        raise ValueError(f"Expected nnz in [0, {rows.shape[0]}] (the length of rows). Got {int(nnz)}.")
    pm, pk, pn = dplan.split
    gm, gk = dplan.grid
    return _distribute(
        rows.astype(jnp.int32),
        cols.astype(jnp.int32),
        nnz.astype(jnp.int32),
        grid=(gm, gk),
        split=(pm, pk, pn),
        part=(dplan.rows_per_partition, dplan.cols_per_partition),
        cap=dplan.bucket_capacity,
    )


@partial(jax.jit, static_argnames=("grid", "split", "part", "cap"))
def _distribute(rows, cols, nnz, *, grid, split, part, cap) -> Distribution:
    (gm, gk), (pm, pk, pn), (mt, kt) = grid, split, part
    P = pm * pk * pn
    L = rows.shape[0]
    idx = jnp.arange(L, dtype=jnp.int32)
    active = idx < nnz
    if L == 0:
        z = jnp.zeros((0,), jnp.int32)
        return Distribution(jnp.full((P, cap), -1, jnp.int32), jnp.zeros((P,), jnp.int32), z, z, z,
                            jnp.int32(0), jnp.int32(0))  # fmt: skip
    groups = pm * pk
    r = jnp.clip(rows, 0, gm - 1) // mt
    c = jnp.clip(cols, 0, gk - 1) // kt
    group = jnp.where(active, r * pk + c, groups)  # padding sorts last
    # Rank of each block within its group, in input order.
    order = jnp.argsort(group, stable=True)
    g_sorted = group[order]
    counts = jnp.zeros((groups + 1,), jnp.int32).at[group].add(1)
    starts = jnp.cumsum(counts) - counts
    rank = jnp.zeros((L,), jnp.int32).at[order].set(idx - starts[g_sorted])
    home = jnp.where(active, group * pn + rank % pn, -1)
    home_slot = rank // pn
    at_home = active & (home_slot < cap)
    pending0 = active & ~at_home
    fill0 = jnp.zeros((P + 1,), jnp.int32).at[jnp.where(at_home, home, P)].add(1)[:P]

    # Spill: overflowing blocks sorted by home bucket (input order within one home).
    key = jnp.where(pending0, home, P)
    sp = jnp.argsort(key, stable=True)
    sh = key[sp]  # home bucket, P for blocks that need no spill
    h = jnp.arange(P, dtype=jnp.int32)

    def offer(state, target):
        """Homes ``h`` offer their pending blocks to buckets ``target[h]`` (distinct where valid)."""
        fill, pending, dest, slot = state
        valid = (target >= 0) & (target < P)
        tc = jnp.clip(target, 0, P - 1)
        room = jnp.where(valid, cap - fill[tc], 0)
        rem = jnp.zeros((P + 1,), jnp.int32).at[sh].add(pending.astype(jnp.int32))[:P]
        take = jnp.minimum(rem, room)
        base = jnp.cumsum(rem) - rem  # pending blocks of earlier homes
        pi = pending.astype(jnp.int32)
        rank_o = jnp.cumsum(pi) - pi - jnp.concatenate([base, jnp.zeros((1,), jnp.int32)])[sh]
        shc = jnp.minimum(sh, P - 1)
        place = pending & (rank_o < take[shc])
        dest = jnp.where(place, tc[shc], dest)
        slot = jnp.where(place, fill[tc[shc]] + rank_o, slot)
        fill = fill.at[tc].add(jnp.where(valid, take, 0))
        return fill, pending & ~place, dest, slot

    def cond(carry):
        d, (_, pending, _, _) = carry
        return (d < P) & jnp.any(pending)

    def body(carry):
        d, state = carry
        state = offer(state, h + d)
        state = offer(state, h - d)
        return d + 1, state

    minus = jnp.full((L,), -1, jnp.int32)
    _, (fill, pending, sdest, sslot) = jax.lax.while_loop(
        cond, body, (jnp.int32(1), (fill0, pending0[sp], minus, minus))
    )
    # Back to input order.
    spill_dest = jnp.zeros((L,), jnp.int32).at[sp].set(sdest)
    spill_slot = jnp.zeros((L,), jnp.int32).at[sp].set(sslot)
    block_bucket = jnp.where(at_home, home, spill_dest)
    block_slot = jnp.where(at_home, home_slot, spill_slot)
    placed = block_bucket >= 0
    bucket_ids = (
        jnp.full((P, cap), -1, jnp.int32)
        .at[jnp.where(placed, block_bucket, P), jnp.where(placed, block_slot, 0)]
        .set(idx, mode="drop")
    )
    overflow = jnp.sum(pending).astype(jnp.int32)
    spilled = jnp.sum(placed & ~at_home).astype(jnp.int32)
    return Distribution(bucket_ids, fill, block_bucket, block_slot, home, spilled, overflow)


# --------------------------------------------------------------------------------------------------
# Tile simulator
# --------------------------------------------------------------------------------------------------
def _acc_dtype(dt) -> jnp.dtype:
    dt = jnp.dtype(dt)
    return jnp.dtype(jnp.float32) if jnp.finfo(dt).bits < 32 else dt


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
        r = jnp.where(ok, rows[j], gm)  # padding goes out of range and is dropped
        return y.at[r].add(prod, mode="drop"), None

    y = jnp.zeros((gm, bh, pn, npc), acc)
    if rows.shape[0]:  # no blocks at all: nothing to gather
        y, _ = jax.lax.scan(one_bucket, y, dist.bucket_ids)
    y = y.reshape(gm * bh, pn * npc)[:, :n].astype(out)
    return jnp.where(dist.overflow > 0, jnp.nan, y), dist


def simulate_dynamic(dplan: DynamicPlan, D, x, *, return_distribution: bool = False):
    """Run ``D @ x`` bucket by bucket as the dynamic plan lays it out on the tiles.

    The blocks of ``D`` are distributed with :func:`distribute`; every bucket then computes the
    partial products of only its own blocks (against each piece of ``n``), and the partials of all
    buckets are reduced into ``Y`` by block row. Jit-able; the pattern of ``D`` may change between
    calls without recompiling. If some blocks could not be placed (``nnz > total_capacity``) the
    output is NaN, and outside ``jit`` a ``ValueError`` says so.

    Returns:
        ``(m, n)`` equal to ``D @ x`` (and the :class:`Distribution` with ``return_distribution=True``).
    """
    _check_plan(dplan)
    from .._matrix import DynamicBlockSparseMatrix

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
    if not isinstance(dist.overflow, jax.core.Tracer) and int(dist.overflow) > 0:
        raise ValueError(
            f"Expected at most total_capacity={dplan.total_capacity} blocks ({dplan.num_buckets} buckets x "
            f"{dplan.bucket_capacity}). Got nnz={int(D.nnz)}: {int(dist.overflow)} blocks fit no bucket; "
            "plan with a larger max_nnz_blocks or bucket_oversize."
        )
    return (y, dist) if return_distribution else y
