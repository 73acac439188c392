"""The IPU model of PopSparse's *dynamic* sparsity: the plan search and the bucket distribution.

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
  compute pass over the blocks the bucket holds (:func:`bucket_fill`: the busiest group's mean
  plus one standard deviation; exchanges and memory are those of full, fixed-size buckets). The
  machine model is :mod:`.machines` and the compute per bucket is :func:`.cost.compute_cycles`,
  the formula of the static model's compute phase (with the dynamic element-wise vertex's row cost).

:func:`blocksparse.ipu.simulate_dynamic` (in :mod:`.simulate`) executes a plan bucket by bucket in
JAX and equals ``D @ x``.
Constants and formulas are our estimates, after poplibs' estimators where it has one (sources in
:mod:`.machines`); they make a dynamic plan slower than the static plan of the same pattern (as
PopSparse reports), by the moves of whole buckets, the dense-operand exchange of a whole partition
and the extra propagation and metadata phases.
"""

from __future__ import annotations

import math
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .._pattern import block_pair
from .._util import cdiv
from . import cost as _cost
from ._checks import advice, check_common, check_int, check_machine
from .machines import BOW, IPUMachine
from .plan import DynamicPlan, NoValidPlanError

__all__ = ["Distribution", "distribute", "dynamic_plan"]


# --------------------------------------------------------------------------------------------------
# Cost model (vectorised over candidate splits)
# --------------------------------------------------------------------------------------------------
def _dynamic_cost(mc, shape, block_size, max_nnz, n, dt, pdt, oversize, pm, pk, pn):
    """Cycles per phase, exchange bytes per phase and bytes per tile for arrays of candidate splits."""
    (m, k), (bh, bw) = shape, block_size
    gm, gk = m // bh, k // bw
    T = mc.num_tiles
    dbytes = np.dtype(dt).itemsize
    pbytes = np.dtype(pdt).itemsize
    grain = mc.column_grain(dt)
    n_grains = int(cdiv(n, grain))
    P = pm * pk * pn
    mt = cdiv(gm, pm)
    kt = cdiv(gk, pk)
    npc = cdiv(n_grains, pn) * grain
    cap = np.maximum(np.ceil(cdiv(max_nnz, P) * (1.0 + oversize)).astype(np.int64), 1)
    groups = pm * pk
    spill_rounds = np.where(groups > 1, 1, 0)
    rounds = pn - 1 + spill_rounds  # bucket propagation rounds after the first
    visits = rounds + 1  # buckets each tile processes
    # A dynamic block carries its row and column; an element of element sparsity only its 16-bit column
    # offset (its row is an entry shared by the row's elements).
    meta_block = 2 * mc.metadata_bytes_per_block if mc.sub_block((bh, bw)) >= 4 else 2
    bucket_bytes = cap * (bh * bw * dbytes + meta_block)
    sync = mc.exchange_sync_cycles
    xbw = mc.exchange_bytes_per_cycle
    reduce_rate = mc.vector_lanes.get(pdt, 1) / mc.elementwise_issue_overhead

    # Buckets are fixed-size tensors, so exchanges and memory are those of full buckets; the vertices,
    # though, loop over the entries a bucket actually holds (poplibs' dynamic estimators take the
    # blocks per bucket): compute and metadata scale with the busiest group's blocks.
    fill = bucket_fill(max_nnz, groups, pn, cap)
    # Metadata entries scanned per bucket: one per block on the AMP; one per row for element sparsity
    # (the compute vertex reads the elements' offsets itself).
    entries = fill if mc.sub_block((bh, bw)) >= 4 else np.minimum(fill, np.maximum(mt, 1) * bh)
    x_bytes = kt * bw * npc * dbytes  # the whole partition's rows of X: the pattern is unknown
    home_rows = np.minimum(fill, mt)
    spill_rows = np.minimum(fill, gm)
    compute = pn * _cost.compute_cycles(mc, fill, home_rows, npc, block_size, dt, dynamic=True)
    compute = compute + spill_rounds * _cost.compute_cycles(mc, fill, spill_rows, npc, block_size, dt, dynamic=True)
    split_k = pk > 1
    kred_rows = np.where(split_k, mt * (pk - 1) / pk, 0.0)  # rows a reducing tile receives from other k parts
    spill_in_rows = spill_rounds * spill_rows  # partial rows of spilled blocks, sent to their home tiles
    part_bytes = (kred_rows + spill_in_rows) * bh * npc * pbytes
    out_home = cdiv(m * n, T) * dbytes
    x_home = cdiv(k * n, T) * dbytes
    w_home = cdiv(max_nnz * (bh * bw * dbytes + meta_block), T)  # values and metadata as the user gives them

    def xc(nbytes):
        return np.where(nbytes > 0, nbytes / xbw + sync, 0.0)

    cycles = {
        # The pm partitions of one (k, n) piece receive the same rows of X: a multicast, at the broadcast
        # rate of poplin's and poplibs' exchange estimates (as in the static and dense models).
        "exchange_dense": xc(x_bytes / _bus_share(mc, pm, P)),
        "exchange_buckets": xc(bucket_bytes),
        "metadata": visits * (mc.vertex_overhead_cycles + entries * mc.metadata_cycles_per_entry / mc.num_workers),
        "zero_partials": (mt + spill_in_rows) * bh * npc * pbytes / mc.store_bytes_per_cycle,
        "compute": compute,
        "propagate": rounds * (bucket_bytes / xbw + sync + mc.round_cycles),
        "exchange_partials": xc(part_bytes),
        "reduction": np.where(
            part_bytes > 0, mc.vertex_overhead_cycles + (kred_rows + spill_in_rows) * bh * npc / reduce_rate, 0.0
        ),
        "output": out_home / mc.output_bytes_per_cycle + 0.0 * P,
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


def _bus_share(mc, consecutive, total):
    """The exchange's speed-up when ``consecutive`` tiles of ``total`` receive the same data.

    poplibs' dynamic planner (``popsparse/FullyConnectedPlan.cpp``, ``ExchangeEstimator::getCycles``)
    doubles the receive rate only when the tiles sharing an exchange bus (two on the GC200, the
    machine's ``tile_grain``) can share it: the number of consecutive tiles receiving the same data is
    a multiple of the grain, or every receiving tile gets it (a full broadcast).
    """
    g = max(int(mc.tile_grain), 1)
    can = (consecutive > 1) & ((consecutive % g == 0) | (consecutive == total))
    return np.where(can, mc.exchange_broadcast_factor, 1.0)


def bucket_fill(max_nnz, groups, pn, cap):
    """Blocks per visited bucket that the busiest tile computes when ``max_nnz`` blocks fall uniformly at random.

    A group (a block of ``W``'s rows and columns, dealt over its ``pn`` buckets) receives a binomial
    number of blocks; like poplibs' static partitioner we take its mean plus one standard deviation,
    at most the group's ``pn * cap`` slots, spread evenly over the group's buckets (a fraction when
    the group has fewer blocks than buckets: its tile computes each of them once over its visits).
    """
    groups = np.asarray(groups, np.float64)
    mean = max_nnz / groups
    busiest = np.ceil(mean + np.sqrt(mean * (1.0 - 1.0 / groups)))
    return np.minimum(busiest, pn * cap) / pn


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
        The cheapest :class:`DynamicPlan` (full buckets moved and held; the busiest group's expected
        blocks computed) whose busiest tile fits
        ``available_memory_proportion`` of tile memory.

    Raises:
        NoValidPlanError: when no split fits (the message names the smallest footprint and the limit).
    """
    check_machine(machine)
    try:
        m, k = (int(s) for s in shape)
    except (TypeError, ValueError):
        raise ValueError(f"Expected shape as a pair of integers (m, k). Got {shape!r}.") from None
    if m <= 0 or k <= 0:
        raise ValueError(f"Expected a positive shape (m, k). Got {shape!r}.")
    bh, bw = block_pair(block_size)
    if bh <= 0 or bw <= 0 or m % bh or k % bw:
        raise ValueError(f"Expected a positive block size dividing shape {(m, k)}. Got {(bh, bw)}.")
    gm, gk = m // bh, k // bw
    max_nnz = check_int("max_nnz_blocks", max_nnz_blocks, lo=0)
    if max_nnz > gm * gk:
        raise ValueError(
            f"Expected max_nnz_blocks <= {gm * gk} (a {gm} x {gk} grid of {bh} x {bw} blocks). Got {max_nnz}."
        )
    n, dt, pdt, amp = check_common(n, machine, dtype, available_memory_proportion, partials_dtype)
    ov = float(bucket_oversize)
    if not (ov >= 0.0 and math.isfinite(ov)):
        raise ValueError(f"Expected bucket_oversize >= 0 (PopSparse's default is 0.3). Got {bucket_oversize!r}.")
    args = ((m, k), (bh, bw), max_nnz, machine, dt, pdt, ov)
    found = _search(*args, n, amp)
    if isinstance(found, DynamicPlan):
        return found
    raise _no_plan_error(found, *args, n, amp)


def _search(shape, block_size, max_nnz, machine, dt, pdt, ov, n, amp) -> DynamicPlan | dict:
    """The cheapest split that fits, or (when none does) a description of the smallest footprint."""
    (m, k), (bh, bw) = shape, block_size
    gm, gk = m // bh, k // bw
    T = machine.num_tiles
    grain = machine.column_grain(dt)
    n_grains = int(cdiv(n, grain))
    pm, pk, pn = np.meshgrid(
        _cost.split_candidates(gm), _cost.split_candidates(gk), _cost.split_candidates(n_grains), indexing="ij"
    )
    pm, pk, pn = pm.ravel(), pk.ravel(), pn.ravel()
    ok = pm * pk * pn <= T
    pm, pk, pn = pm[ok], pk[ok], pn[ok]
    # Equal pieces only: drop splits whose last partition would be empty.
    ok = (cdiv(gm, cdiv(gm, pm)) == pm) & (cdiv(gk, cdiv(gk, pk)) == pk) & (cdiv(n_grains, cdiv(n_grains, pn)) == pn)
    pm, pk, pn = pm[ok], pk[ok], pn[ok]
    cycles, nbytes, memory, cap, rounds, mt, kt = _dynamic_cost(
        machine, (m, k), (bh, bw), max_nnz, n, dt, pdt, ov, pm, pk, pn
    )
    total = sum(cycles.values())
    limit = amp * machine.tile_memory_bytes
    fits = memory <= limit
    if not fits.any():
        i = int(np.argmin(memory))
        return {"bytes": float(memory[i]), "split": (int(pm[i]), int(pk[i]), int(pn[i])), "cap": int(cap[i]),
                "scored": int(pm.size)}  # fmt: skip
    # Cheapest that fits; ties to the smaller footprint, then fewer tiles.
    order = np.lexsort((pm * pk * pn, memory, np.where(fits, total, np.inf)))
    i = int(order[0])
    dense = _cost.dense_estimate(machine, m, k, n, dt, pdt, amp)
    split = (int(pm[i]), int(pk[i]), int(pn[i]))
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
        n_pieces=_cost.n_pieces(n, split[2], grain).astype(np.int64),
        bucket_capacity=int(cap[i]),
        propagation_rounds=int(rounds[i]),
        bytes_per_tile=float(memory[i]),
        cycles={name: float(v[i]) for name, v in cycles.items()},
        exchange_bytes={name: float(v[i]) for name, v in nbytes.items()},
        dense=dense,
        candidates=int(pm.size),
    )


def _no_plan_error(smallest: dict, shape, block_size, max_nnz, machine, dt, pdt, ov, n, amp) -> NoValidPlanError:
    (m, k), (bh, bw) = shape, block_size

    def fits(amp_, n_, dt_=dt, ov_=ov) -> bool:
        return isinstance(_search(shape, block_size, max_nnz, machine, dt_, pdt, ov_, n_, amp_), DynamicPlan)

    others = []
    if dt == "float32":
        others.append(("use float16 instead of float32", {"dtype": "float16"}, lambda: fits(amp, n, dt_="float16")))
    if ov > 0:
        others.append(("lower bucket_oversize to 0", {"bucket_oversize": 0.0}, lambda: fits(amp, n, ov_=0.0)))
    text, suggestions, nothing_fits = advice(
        fits, n=n, amp=amp, smallest_bytes=smallest["bytes"], tile_memory_bytes=machine.tile_memory_bytes, others=others
    )
    kib = 1024.0
    pm, pk, pn = smallest["split"]
    return NoValidPlanError(
        f"No valid dynamic plan for W {m} x {k} (blocks {bh} x {bw}, at most {max_nnz} non-zero blocks) @ X "
        f"{k} x {n} in {dt} on {machine.name}: the smallest per-tile footprint over {smallest['scored']} partitions "
        f"is {smallest['bytes'] / kib:.1f} KiB (split m/k/n {pm}/{pk}/{pn}, bucket capacity {smallest['cap']}), "
        f"above the limit available_memory_proportion={amp:g} x {machine.tile_memory_bytes / kib:g} KiB = "
        f"{amp * machine.tile_memory_bytes / kib:.1f} KiB. {text}",
        suggestions=suggestions,
        nothing_fits=nothing_fits,
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
