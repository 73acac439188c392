"""Cycle and memory model of a static block-sparse matmul ``Y = W X`` on an IPU, by phase.

The IPU runs bulk-synchronously: a program is a sequence of phases (an exchange or a compute
set), every tile finishes a phase before the next begins, so a phase takes as long as its
busiest tile and the total is the sum over phases. The structure follows PopSparse's static
planner (poplibs ``popsparse/StaticMatMulPartitioner``, described in Li et al. 2023,
arXiv:2303.16999): the phases are

1. ``exchange_dense``: each tile receives the rows of ``X`` for the block columns it holds,
   restricted to its piece of ``n``;
2. ``exchange_nonzeros``: with ``n_split > 1`` the non-zero blocks are replicated to the tiles
   of every piece of ``n`` (with one piece they are stored where they are used);
3. ``zero_partials``: the AMP accumulates into its output, so the partial rows are zeroed first;
4. ``compute``: every tile multiplies its blocks by its ``X`` rows (:func:`compute_cycles`);
5. ``exchange_partials``: rows whose blocks are spread over several tiles (other bands, or a long
   row split across tiles of one band) send their partial sums to a reducing tile;
6. ``reduction``: the reducing tiles add the partials;
7. ``output``: the result, cast to the output dtype, goes to its home tiles (``Y`` spread evenly
   over all tiles, as is ``X`` before the product).

All inputs here are NumPy arrays over tiles so that the planner can score many candidates at
once. Our formulas are our own estimates; the constants they use live on the machine model.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from .._util import cdiv
from .machines import IPUMachine

__all__ = [
    "DYNAMIC_PHASES",
    "PHASES",
    "DenseEstimate",
    "TileStats",
    "compute_cycles",
    "dense_estimate",
    "reduction_cycles",
    "sparse_cost",
    "sparse_cost_bound",
]

PHASES = (
    "exchange_dense",
    "exchange_nonzeros",
    "zero_partials",
    "compute",
    "exchange_partials",
    "reduction",
    "output",
)
#: Phases of a dynamic plan (:mod:`.buckets`): the static ones plus bucket exchange, metadata and propagation.
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
EXCHANGE_PHASES = ("exchange_dense", "exchange_nonzeros", "exchange_partials", "output")


@dataclass(frozen=True)
class TileStats:
    """What the cost model needs to know about one assignment of blocks to the tiles of one ``n`` piece.

    Attributes:
        blocks: ``int[tiles]`` non-zero blocks per tile.
        rows: ``int[tiles]`` distinct block rows per tile (its partial output rows).
        cols: ``int[tiles]`` distinct block columns per tile (the ``X`` rows it needs).
        multi_partial_rows: sum over block rows held by two or more tiles of the number of tiles holding them.
        multi_rows: the number of such block rows.
        span: ``int[tiles]`` non-empty block columns of the band each tile belongs to (the most ``X`` rows it
            could be sent); ``None`` means ``cols``. The dense-row exchange is scaled by ``span / cols``, the
            ratio of the largest to the average message count (poplibs' ``rhsBias``, see :func:`sparse_cost`).
    """

    blocks: np.ndarray
    rows: np.ndarray
    cols: np.ndarray
    multi_partial_rows: int
    multi_rows: int
    span: np.ndarray | None = None


def n_piece(n: int, n_split: int, grain: int, serial: int = 1) -> int:
    """Columns of the largest piece: ``n`` in ``serial`` passes, each split ``n_split`` ways, in whole grains."""
    per_pass = int(cdiv(cdiv(n, grain), serial))  # grains per pass
    return int(cdiv(per_pass, n_split) * grain)


def n_pieces(n: int, n_split: int, grain: int, serial: int = 1) -> np.ndarray:
    """``int[pieces, 2]``: ``[start, stop)`` of each piece of ``n``; piece ``j`` runs in pass ``j // n_split``."""
    p = n_piece(n, n_split, grain, serial)
    starts = np.arange(int(cdiv(n, p))) * p
    return np.stack([starts, np.minimum(starts + p, n)], axis=1)


def compute_cycles(
    machine: IPUMachine, blocks, rows, npc, block_size: tuple[int, int], dtype: str, *, dynamic: bool = False
) -> np.ndarray:
    """Cycles of one tile's compute set: ``blocks`` non-zero blocks over ``rows`` block rows times ``npc`` columns.

    The one copy of the per-tile compute formula, used by the static model (:func:`sparse_cost`) and
    the dynamic one (a tile computing a full bucket). Vectorised: ``blocks``, ``rows`` and ``npc``
    broadcast (arrays over tiles or over candidate splits); a tile without blocks costs nothing.

    * AMP (sub-blocks of 4, 8 or 16): the ``num_workers`` workers split the piece's columns, each
      handling whole vector grains; every (sub-)block pays its metadata entry, loading its values
      and filling the AMP pipeline, then ``sub * sub * n_eff / rate`` cycles of multiply-accumulate.
    * Element-wise (no AMP; block sides of 1 or 2): poplibs' element-wise vertex estimates (static
      ``matmulComputeCycles``, dynamic ``sparseDenseElementwiseMultiply``) have no fixed cost per
      non-zero: each streams its row of ``X`` through the vector MAC in chunks of two vectors
      (``n_eff`` rounded to ``2 * lanes``) at ``rate``, while every output row pays
      ``elementwise_row_cycles`` plus ``elementwise_chunk_cycles`` per chunk (loading and storing its
      accumulators); the dynamic vertex (``dynamic=True``) keeps a row's accumulators across its
      chunks and pays ``elementwise_chunk_cycles`` once per row. In a ``bh x bw`` block each ``X``
      row it loads serves ``bh`` output rows, so the load part of the issue overhead is shared by
      ``bh`` (our estimate: :meth:`IPUMachine.block_macs_per_cycle`).

    Every busy tile also pays the vertex launch (and, on the AMP, a work-list entry per output row).
    """
    mc = machine
    bh, bw = block_size
    dbytes = np.dtype(dtype).itemsize
    grain = mc.column_grain(dtype)
    sub = mc.sub_block((bh, bw))
    nsub = (bh // sub) * (bw // sub)
    rate = mc.block_macs_per_cycle(sub, dtype)
    blocks = np.asarray(blocks, np.float64)
    rows = np.asarray(rows, np.float64)
    npc = np.asarray(npc, np.int64)
    if sub >= 4:
        W = mc.num_workers
        n_eff = cdiv(cdiv(npc, W), grain) * grain * W
        per_block = nsub * (mc.block_overhead_cycles + sub * sub * dbytes / mc.load_bytes_per_cycle)
        per_block = per_block + nsub * mc.amp_pipeline_cycles + nsub * sub * sub * n_eff / rate
        out = mc.vertex_overhead_cycles + rows * mc.row_overhead_cycles + blocks * per_block
    else:
        chunk = 2 * grain
        n_eff = cdiv(npc, chunk) * chunk
        rate = mc.block_macs_per_cycle(sub, dtype, rows_sharing=bh)
        chunks = 1 if dynamic else n_eff / chunk
        per_row = mc.elementwise_row_cycles + mc.elementwise_chunk_cycles * chunks
        if dynamic:
            # poplibs' dynamic element-wise estimate (``sparseDenseElementwiseMultiply`` in
            # ``popsparse/PerformanceEstimation.hpp``) has a specialised loop for exactly one chunk of two
            # vectors of columns per worker (8 half, 4 single): a row then costs only its set-up
            # (``elementwise_two_vector_row_cycles``), no chunk loop.
            two = mc.elementwise_two_vector_row_cycles[np.dtype(dtype).name]
            per_row = np.where(npc == chunk, two, per_row)
        out = mc.vertex_overhead_cycles + rows * bh * per_row
        out = out + blocks * nsub * sub * sub * n_eff / rate
    return np.where(blocks > 0, out, 0.0)


def reduction_cycles(machine: IPUMachine, outputs, fan_in, partials_dtype: str):
    """Cycles of one tile adding ``fan_in`` partials into each of ``outputs`` outputs.

    poplibs' static partitioner estimates its strided reduce so: the workers share the outputs, each
    loop step handles an accumulator vector (4 single or 8 half partials) for
    ``reduce_cycles_per_vector`` cycles plus ``reduce_cycles_per_partial`` per partial beyond the first,
    and the vertex pays its launch once. With two partials that is about three cycles per output.
    """
    mc = machine
    width = 2 * mc.vector_lanes.get(partials_dtype, 2)  # accumulator vector: 4 float or 8 half partials
    steps = cdiv(cdiv(np.asarray(outputs, np.int64), mc.num_workers), width) * mc.num_workers
    per_step = mc.reduce_cycles_per_vector + mc.reduce_cycles_per_partial * np.maximum(np.asarray(fan_in) - 1, 0)
    return mc.vertex_overhead_cycles + steps * per_step


def sparse_cost(
    machine: IPUMachine,
    stats: TileStats,
    *,
    shape: tuple[int, int],
    block_size: tuple[int, int],
    n: int,
    n_split: int,
    tiles_per_split: int,
    dtype: str,
    partials_dtype: str,
    serial: int = 1,
) -> tuple[dict[str, float], dict[str, float], np.ndarray]:
    """Cycles per phase, exchange bytes per phase (summed over all tiles) and bytes per tile.

    ``stats`` describes one piece of ``n``; the ``n_split`` pieces run side by side on disjoint
    tiles, so cycles are those of the largest piece and bytes are multiplied by ``n_split``.
    With ``serial > 1``, ``n`` is processed in that many passes one after the other (only when no
    single pass fits), each paying every phase again; memory is that of one pass.
    """
    mc = machine
    m, k = shape
    bh, bw = block_size
    T = mc.num_tiles
    dbytes = np.dtype(dtype).itemsize
    pbytes = np.dtype(partials_dtype).itemsize
    grain = mc.column_grain(dtype)
    npc = n_piece(n, n_split, grain, serial)
    xbw = mc.exchange_bytes_per_cycle
    blocks = stats.blocks.astype(np.float64)
    rows = stats.rows.astype(np.float64)
    cols = stats.cols.astype(np.float64)
    busy = blocks > 0

    # -- exchange of the dense operand and of the non-zeros ------------------------------------------
    # poplibs' StaticMatMulPartitioner costs the dense rows at twice the exchange rate (the multicast the
    # exchange scheduler uses by default) scaled by the ratio of the largest to the average number of
    # messages (its ``rhsBias``: the band's columns over the columns a tile actually needs). Together
    # that is the tile's band width, not its used columns, at the broadcast rate: tiles that need few
    # scattered rows of a wide band multicast poorly.
    x_bytes = cols * bw * npc * dbytes
    span = cols if stats.span is None else np.maximum(stats.span.astype(np.float64), cols)
    x_cost_bytes = np.where(busy, span, 0.0) * bw * npc * dbytes / mc.exchange_broadcast_factor
    nz_bytes = blocks * bh * bw * dbytes if n_split > 1 else np.zeros_like(blocks)

    # -- compute -------------------------------------------------------------------------------------
    compute = compute_cycles(mc, blocks, rows, npc, block_size, dtype)
    zero_bytes = rows * bh * npc * pbytes

    # -- partials, reduction, output -----------------------------------------------------------------
    # A row held by several tiles is reduced in slices, one per holder (poplibs' reduction spreads each
    # row's outputs over the tiles that hold its partials): a reducing tile receives the other holders'
    # partials of its slice and adds ``fan_in`` partials per output, fan_in = holders per multi-held row.
    tps = tiles_per_split
    reducers = min(tps, stats.multi_partial_rows)
    fan_in = stats.multi_partial_rows / stats.multi_rows if stats.multi_rows else 0.0
    red_outputs = int(cdiv(stats.multi_rows * bh * npc, reducers)) if reducers else 0
    red_inputs = int(cdiv((stats.multi_partial_rows - stats.multi_rows) * bh * npc, reducers)) if reducers else 0
    partial_in_bytes = red_inputs * pbytes
    out_home = int(cdiv(m * n, T)) * dbytes
    x_home = int(cdiv(k * n, T)) * dbytes

    sync = mc.exchange_sync_cycles

    def xcycles(nbytes):
        top = float(np.max(nbytes)) if np.size(nbytes) else 0.0
        return top / xbw + sync if top > 0 else 0.0

    cycles = {
        "exchange_dense": xcycles(x_cost_bytes),
        "exchange_nonzeros": xcycles(nz_bytes),
        "zero_partials": float(np.max(zero_bytes, initial=0.0)) / mc.store_bytes_per_cycle,
        "compute": float(np.max(compute, initial=0.0)),
        "exchange_partials": xcycles(partial_in_bytes),
        "reduction": reduction_cycles(mc, red_outputs, fan_in, partials_dtype) if red_inputs else 0.0,
        "output": out_home / mc.output_bytes_per_cycle,
    }
    cycles = {name: v * serial for name, v in cycles.items()}
    cycles["output"] = out_home / mc.output_bytes_per_cycle
    reps = n_split * serial
    nbytes = {
        "exchange_dense": float(x_bytes.sum()) * reps,
        "exchange_nonzeros": float(nz_bytes.sum()) * reps,
        "exchange_partials": float(stats.multi_partial_rows) * bh * npc * pbytes * reps,
        "output": float(m) * n * dbytes,
    }
    # -- memory per tile: the larger of the compute phase and the reduction phase --------------------
    w_bytes = blocks * bh * bw * dbytes
    meta = np.where(busy, blocks * mc.metadata_bytes_per_block + rows * mc.metadata_bytes_per_row + 64, 0.0)
    partials = rows * bh * npc * pbytes
    at_compute = x_home + w_bytes + meta + x_bytes + partials
    at_reduce = x_home + w_bytes + partials + partial_in_bytes + out_home
    memory = np.maximum(at_compute, at_reduce)
    return cycles, nbytes, memory


#: The machine constants :func:`sparse_cost_bound` relies on being non-negative (with positive MAC rates, every
#: phase then grows with the statistics it bounds); :class:`IPUMachine` checks its other rates positive.
_BOUND_CONSTANTS = (
    "vertex_overhead_cycles", "row_overhead_cycles", "block_overhead_cycles", "amp_pipeline_cycles",
    "elementwise_row_cycles", "elementwise_chunk_cycles", "elementwise_issue_overhead", "reduce_cycles_per_vector",
    "reduce_cycles_per_partial", "exchange_sync_cycles", "exchange_broadcast_factor", "metadata_bytes_per_block",
    "metadata_bytes_per_row",
)  # fmt: skip


def sparse_cost_bound(
    machine: IPUMachine,
    blocks,
    rows,
    cols,
    span,
    extra_pairs,
    *,
    shape: tuple[int, int],
    block_size: tuple[int, int],
    n: int,
    n_split,
    tiles_per_split,
    dtype: str,
    partials_dtype: str,
    serial: int = 1,
) -> tuple[np.ndarray, np.ndarray]:
    """Lower bounds of :func:`sparse_cost`'s total cycles and busiest tile's bytes, for many candidates at once.

    Candidates run along the leading axis: ``n_split``, ``tiles_per_split`` and ``extra_pairs`` are ``int[C]``;
    ``blocks``, ``rows``, ``cols`` and ``span`` are ``int[C, t]``, a few tiles per candidate. Each of these tiles
    must be matched by a busy tile of the candidate's assignment with at least as many blocks, rows and columns
    and a band of exactly ``span`` non-empty columns; ``extra_pairs`` must be at most the assignment's
    (row, tile) pairs less its non-empty rows (``multi_partial_rows - multi_rows``): for instance its (row,
    band) pairs less the non-empty rows. Every phase of :func:`sparse_cost` and every tile's bytes grow with
    these statistics, and the tiles not described cost nothing here, so the results are true lower bounds (up
    to float rounding: the caller keeps a margin). Rejecting a candidate on them cannot change the plan chosen.
    Returns ``(cycles, bytes)``, each ``float[C]``; ``-inf`` (no bound) for a machine with a negative constant.
    """
    mc = machine
    m, k = shape
    bh, bw = block_size
    n_split = np.asarray(n_split, np.int64)
    rates = (*mc.amp_macs_per_cycle.values(), *mc.vector_lanes.values())
    if any(float(getattr(mc, a)) < 0 for a in _BOUND_CONSTANTS) or not all(r > 0 for r in rates):
        return np.full(n_split.shape, -np.inf), np.full(n_split.shape, -np.inf)
    T = mc.num_tiles
    dbytes = np.dtype(dtype).itemsize
    pbytes = np.dtype(partials_dtype).itemsize
    grain = mc.column_grain(dtype)
    npc = np.array([n_piece(n, int(s), grain, serial) for s in n_split], np.int64)
    tps = np.maximum(np.asarray(tiles_per_split, np.int64), 1)
    extra = np.asarray(extra_pairs, np.int64)
    w = npc[:, None]  # columns of each candidate's piece, against its tiles
    blocks = np.asarray(blocks, np.float64)
    rows = np.asarray(rows, np.float64)
    cols = np.asarray(cols, np.float64)
    span = np.maximum(np.asarray(span, np.float64), cols)
    xbw, sync = mc.exchange_bytes_per_cycle, mc.exchange_sync_cycles

    def xcycles(top):
        return np.where(top > 0, top / xbw + sync, 0.0)

    # Partials: with extra (row, tile) pairs some row has several holders, so there are reducers (at most tps):
    # the busiest receives at least cdiv(extra * bh * npc, tps) partials and adds at least two partials into
    # at least cdiv(bh * npc, tps) outputs.
    red_inputs = np.where(extra > 0, cdiv(np.maximum(extra, 0) * bh * npc, tps), 0)
    reduction = np.where(red_inputs > 0, reduction_cycles(mc, cdiv(bh * npc, tps), 2, partials_dtype), 0.0)
    per_pass = (
        xcycles((span * bw * w * dbytes / mc.exchange_broadcast_factor).max(axis=1))
        + xcycles(np.where(n_split > 1, (blocks * bh * bw * dbytes).max(axis=1), 0.0))
        + (rows * bh * w * pbytes).max(axis=1) / mc.store_bytes_per_cycle
        + compute_cycles(mc, blocks, rows, w, block_size, dtype).max(axis=1)
        + xcycles(red_inputs * pbytes)
        + reduction
    )
    out_home = int(cdiv(m * n, T)) * dbytes
    x_home = int(cdiv(k * n, T)) * dbytes
    cycles = per_pass * serial + out_home / mc.output_bytes_per_cycle
    # Memory, as in sparse_cost (every tile described is busy).
    w_bytes = blocks * bh * bw * dbytes
    meta = blocks * mc.metadata_bytes_per_block + rows * mc.metadata_bytes_per_row + 64
    partials = rows * bh * w * pbytes
    at_compute = x_home + w_bytes + meta + cols * bw * w * dbytes + partials
    at_reduce = x_home + w_bytes + partials + (red_inputs * pbytes)[:, None] + out_home
    return cycles, np.maximum(at_compute, at_reduce).max(axis=1)


@dataclass(frozen=True)
class DenseEstimate:
    """The modelled dense matmul of the same shape on the same machine (poplin-style 3-D split)."""

    split: tuple[int, int, int]
    serial: int
    cycles: float
    seconds: float
    tflops: float
    phases: MappingProxyType = field(repr=False)
    memory_bytes_per_tile: float = 0.0

    def __post_init__(self):
        object.__setattr__(self, "phases", MappingProxyType(dict(self.phases)))

    def to_dict(self) -> dict:
        return {
            "split_mkn": list(self.split),
            "serial_passes": self.serial,
            "cycles": self.cycles,
            "seconds": self.seconds,
            "tflops": self.tflops,
            "phases": dict(self.phases),
            "memory_bytes_per_tile": self.memory_bytes_per_tile,
        }


def split_candidates(limit: int) -> np.ndarray:
    """Candidate split counts up to ``limit``: every integer to 16, then about 12% apart."""
    geo = np.unique(np.round(16 * 1.125 ** np.arange(64)).astype(np.int64))
    c = np.unique(np.concatenate([np.arange(1, 17), geo]))
    return c[c <= max(limit, 1)]


@functools.lru_cache(maxsize=256)
def dense_estimate(
    machine: IPUMachine, m: int, k: int, n: int, dtype: str, partials_dtype: str, available_memory_proportion: float
) -> DenseEstimate | None:
    """Cheapest split of a dense ``(m, k) @ (k, n)`` over the tiles, or ``None`` when none fits.

    A poplin-style 3-D split: each tile holds an ``mt x kt`` piece of ``W`` and a ``kt x nt``
    piece of ``X`` (received over the exchange; ``W`` is stored where it is used, only its copies
    for the other pieces of ``n`` move) and runs the AMP at ``dense_amp_efficiency`` of peak;
    when ``k`` is split, the ``pk`` partial outputs are exchanged and reduced before the output
    goes home. When even the best split does not fit, ``n`` is processed in ``serial``
    passes (as poplin's serial splits do), each pass paying every phase again except the exchange of
    ``W``'s copies, which stay on their tiles.
    """
    mc = machine
    T = mc.num_tiles
    dbytes = np.dtype(dtype).itemsize
    pbytes = np.dtype(partials_dtype).itemsize
    grain = mc.column_grain(dtype)
    n_grains = int(cdiv(n, grain))
    serial_opts = np.array([1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64])
    serial_opts = serial_opts[serial_opts <= n_grains]
    pm, pk, pn = (a.ravel() for a in np.meshgrid(split_candidates(m), split_candidates(k),
                                                 split_candidates(n_grains), indexing="ij"))  # fmt: skip
    fit = pm * pk * pn <= T  # the splits that fit the tiles, before the serial passes multiply them
    pm, pk, pn = (np.repeat(a[fit], serial_opts.size) for a in (pm, pk, pn))
    ser = np.tile(serial_opts, int(fit.sum()))  # (the order of the full grid: pm, pk, pn, then serial)
    n_pass = cdiv(n_grains, ser)  # grains per pass
    ok = pn <= n_pass
    pm, pk, pn, ser, n_pass = pm[ok], pk[ok], pn[ok], ser[ok], n_pass[ok]
    mt = cdiv(m, pm).astype(np.float64)
    kt = cdiv(k, pk).astype(np.float64)
    nt = (cdiv(n_pass, pn) * grain).astype(np.float64)
    sync = mc.exchange_sync_cycles
    xbw = mc.exchange_bytes_per_cycle
    peak = mc.amp_macs_per_cycle[dtype] * mc.dense_amp_efficiency
    reduce_rate = mc.vector_lanes.get(partials_dtype, 1) / mc.elementwise_issue_overhead
    bcast = mc.exchange_broadcast_factor
    split_k = pk > 1
    out_pass = cdiv(m * n, T) / ser * dbytes
    phases = {
        # W is placed where it is used (static weights); only its copies for other pieces of n move.
        # Pieces that several consecutive tiles receive (X for pm > 1, W's copies for pn > 1) are broadcast.
        "exchange_inputs": kt * nt / np.where(pm > 1, bcast, 1.0) * dbytes / xbw + sync,
        "zero_partials": mt * nt * pbytes / mc.store_bytes_per_cycle,
        "compute": mc.vertex_overhead_cycles + mt * kt * nt / peak,
        "exchange_partials": np.where(split_k, mt * nt * pbytes * (pk - 1) / pk / xbw + sync, 0.0),
        "reduction": np.where(split_k, mc.vertex_overhead_cycles + mt * nt * (pk - 1) / pk / reduce_rate, 0.0),
        "output": out_pass / xbw + sync,
    }
    phases = {name: v * ser for name, v in phases.items()}
    # W's copies for the other pieces of n move once and stay on their tiles for every serial pass.
    phases["exchange_inputs"] = phases["exchange_inputs"] + np.where(pn > 1, mt * kt / bcast, 0.0) * dbytes / xbw
    phases["fixed"] = np.full(ser.shape, float(mc.dense_fixed_cycles))
    total = sum(phases.values())
    home = float(cdiv(k * n, T) + cdiv(m * n, T)) * dbytes
    memory = (mt * kt + kt * nt) * dbytes + mt * nt * pbytes * np.where(split_k, 2, 1) + home
    fits = memory <= available_memory_proportion * mc.tile_memory_bytes
    if not fits.any():
        return None
    total = np.where(fits, total, np.inf)
    i = int(np.argmin(total))
    cycles = float(total[i])
    seconds = mc.seconds(cycles)
    return DenseEstimate(
        split=(int(pm[i]), int(pk[i]), int(pn[i])),
        serial=int(ser[i]),
        cycles=cycles,
        seconds=seconds,
        tflops=2.0 * m * k * n / seconds / 1e12,
        phases={name: float(v[i]) for name, v in phases.items()},
        memory_bytes_per_tile=float(memory[i]),
    )
