"""IPU machine models: the constants the static planner's cost model runs on.

``MK2`` is the Colossus Mk2 GC200 IPU, ``BOW`` the Bow IPU (the same GC200 tile array on a
wafer-on-wafer power die, clocked higher). Both are :class:`IPUMachine` instances, frozen and
hashable, so they key the plan cache.

Where each constant comes from
-------------------------------
Published figures (Graphcore product material, the IPU Programmer's Guide and the PopSparse paper,
Li et al. 2023, arXiv:2303.16999, section "IPU architecture"):

* ``num_tiles = 1472`` tiles, ``num_workers = 6`` hardware worker threads per tile (8,832 threads
  per chip), about 900 MB of In-Processor-Memory in all: GC200 launch material and the PopSparse
  paper. ``tile_memory_bytes = 624 KiB`` per tile (1472 x 624 KiB = 897 MiB, the "900 MB").
* ``clock_hz``: 1.325 GHz for the Mk2 GC200 and 1.85 GHz for Bow (Bow launch material, March 2022).
* FP16 peak: 250 TFLOP/s for GC200 ("250 teraFLOPS FP16.16"), 350 TFLOP/s for Bow (Bow-2000
  datasheet: 1.4 PFLOP/s FP16.16 for four IPUs). Divided by 1472 tiles and the clock both give
  128 flop per cycle per tile, i.e. ``amp_macs_per_cycle[float16] = 64`` multiply-accumulates per
  cycle per tile through the Accumulating Matrix Product (AMP) unit.
* FP32 peak: 62.5 TFLOP/s for GC200, a quarter of FP16, hence ``amp_macs_per_cycle[float32] = 16``.
* IPU-Exchange: 8 TB/s all-to-all for GC200. 8e12 / (1472 tiles x 1.325e9 Hz) = 4.1 bytes per tile
  per cycle, hence ``exchange_bytes_per_cycle = 4`` (the exchange runs on the tile clock, so Bow
  keeps 4 bytes per cycle and scales in bytes per second with its clock).
* 64-bit load/store data path per tile (IPU Programmer's Guide, tile architecture): 8 bytes per
  cycle, ``load_bytes_per_cycle = store_bytes_per_cycle = 8``; the vector unit works on 64-bit
  vectors: 4 half or 2 single lanes (``vector_lanes``).

Estimates (not published as such; each with its reasoning):

* AMP efficiency by block size: the AMP consumes 16 input channels per pass, so a ``b x b`` block
  with ``b < 16`` keeps ``b / 16`` of it busy: 64, 32, 16 half MACs/cycle for ``b = 16, 8, 4``
  (16, 8, 4 single). Blocks larger than 16 are decomposed into 16 x 16 sub-blocks. This matches
  the shape of PopSparse's results (throughput grows with block size).
* ``elementwise_issue_overhead = 1.5``: for ``b = 1`` there is no AMP. Each non-zero streams a
  row of ``x`` through the 64-bit vector MAC (4 half / 2 single lanes); the six workers share one
  issue slot per cycle and each MAC instruction needs about half an instruction more to load ``x``
  and do index arithmetic. Hence 4 / 1.5 = 2.7 half (1.3 single) MACs per cycle per tile, about 24x
  below the AMP peak, which is why element sparsity needs far lower density to beat dense. poplibs'
  element-wise estimators agree: 3 cycles per non-zero per 8 half (4 single) columns. In a
  ``bh x bw`` block of side 2 (no AMP either) each loaded ``x`` row serves ``bh`` output rows, so the
  extra half instruction is shared: ``1 + 0.5 / bh`` (our estimate).
* ``elementwise_row_cycles = 12``, ``elementwise_chunk_cycles = 14``: poplibs' element-wise vertex
  estimates charge every output row about 12 cycles plus about 14 per chunk of two vectors of
  columns (loading, storing its accumulators), and no fixed cost per non-zero.
* ``elementwise_two_vector_row_cycles = 15`` (half), ``13`` (single): poplibs' dynamic element-wise
  vertex estimate (``sparseDenseElementwiseMultiply``, ``popsparse/PerformanceEstimation.hpp``) has a
  specialised loop for exactly two vectors of columns per worker (8 half, 4 single columns), where a
  row costs only its set-up (``xOverhead``: 15 half, 13 single cycles) and no chunk loop.
* Per-unit overheads, in tile cycles: ``vertex_overhead_cycles`` (launching a compute set's
  vertices on six workers and the supervisor's setup), ``row_overhead_cycles`` (one output row's
  work-list entry: pointer and length loads, accumulator set-up), ``block_overhead_cycles`` (one
  block's metadata entry), ``amp_pipeline_cycles`` (filling and draining the AMP pipeline once
  per block per worker, about 16 worker cycles; six round-robin workers make that ~100 tile
  cycles).
* ``exchange_sync_cycles = 0``: poplibs' static partitioner charges no separate synchronisation per
  exchange (its exchange estimate is bytes over bandwidth); kept as a knob.
* ``vertex_overhead_cycles = 108``: the per-vertex fixed cost poplibs' sparse cost estimators use
  (``popsparse/StaticMatMulPartitioner.cpp``), about 100 cycles of supervisor and worker start-up.
* ``tile_grain = 2``: poplibs' static partitioner hands tiles to pieces of ``n`` and to column bands
  in grains of the tiles that share an exchange bus (``getTileGrainSize``: two on the GC200).
* ``output_bytes_per_cycle = 1``: poplibs costs moving the result to its home tiles at one byte per
  cycle (the output move is a rearrangement, not a bulk exchange).
* ``reduce_cycles_per_vector = 11``, ``reduce_cycles_per_partial = 1``: poplibs' estimate of its
  strided reduce (``reductionCycleEstimate`` in ``popsparse/StaticMatMulPartitioner.cpp``): per worker
  loop step over one accumulator vector (4 single / 8 half partials), 11 cycles plus one per extra
  partial summed in; with two partials, about three tile cycles per output.
* ``exchange_broadcast_factor = 2``: poplin's exchange estimator doubles the receive rate when
  consecutive tiles receive the same data (a broadcast): the dense matmul's operand pieces shared by
  several tiles arrive at 8 bytes per cycle.
* ``dense_fixed_cycles``: fixed cost of a poplin matmul beyond its phases (operand rearrangement,
  several compute sets and their syncs). Fitted to PopSparse's dense baseline at ``n = 4``
  (19 TFLOP/s at m = k = 4096 on Bow, about 13k cycles in all; arXiv:2303.16999 Figure 2).
* ``metadata_cycles_per_entry`` (dynamic sparsity): cycles to scan one metadata entry of a received
  bucket for the blocks the tile owns, shared by the six workers. An entry is a block (AMP blocks)
  or a row of elements (element sparsity, whose per-element offsets are read by the compute vertex).
* ``round_cycles`` (dynamic sparsity): the fixed cost of one bucket-propagation round of PopSparse's
  runtime loop: its compute sets' launch and the device-side loop condition, each a sync.
  Fitted so that the dynamic b = 16 density sweep of arXiv:2303.16999 (plans of up to ~94 rounds)
  lands within its targets.
* ``dense_amp_efficiency``: the fraction of AMP peak that a dense (poplin) matmul vertex
  sustains on large operands (long uninterrupted AMP streams, no per-block restarts).
* ``metadata_bytes_per_block``/``metadata_bytes_per_row``: PopSparse's static work lists use
  16-bit offsets; two per block and four per row, plus alignment.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

__all__ = ["BOW", "MK2", "IPUMachine", "by_name"]

_F16 = "float16"
_F32 = "float32"


def _frozen(d: dict) -> MappingProxyType:
    return MappingProxyType(dict(d))


@dataclass(frozen=True)
class IPUMachine:
    """A Graphcore IPU as the static planner sees it: tiles, memory, clock, exchange and compute rates.

    All rates are per tile. See the module docstring for the source of every default.

    Attributes:
        name: short name (``"mk2"``, ``"bow"``).
        num_tiles: tiles per IPU.
        tile_memory_bytes: SRAM per tile.
        clock_hz: tile clock.
        num_workers: hardware worker threads per tile.
        exchange_bytes_per_cycle: bytes a tile can receive per cycle over the exchange.
        load_bytes_per_cycle, store_bytes_per_cycle: tile memory data path width.
        amp_macs_per_cycle: AMP peak multiply-accumulates per cycle, by dtype name.
        vector_lanes: elements per 64-bit vector, by dtype name.
    """

    name: str
    clock_hz: float
    num_tiles: int = 1472
    tile_memory_bytes: int = 624 * 1024
    num_workers: int = 6
    exchange_bytes_per_cycle: float = 4.0
    load_bytes_per_cycle: float = 8.0
    store_bytes_per_cycle: float = 8.0
    amp_macs_per_cycle: MappingProxyType = field(default_factory=lambda: _frozen({_F16: 64, _F32: 16}))
    vector_lanes: MappingProxyType = field(default_factory=lambda: _frozen({_F16: 4, _F32: 2}))
    amp_native_block: int = 16
    elementwise_issue_overhead: float = 1.5
    vertex_overhead_cycles: int = 108
    row_overhead_cycles: int = 24
    block_overhead_cycles: int = 16
    amp_pipeline_cycles: int = 100
    elementwise_row_cycles: int = 12
    elementwise_chunk_cycles: int = 14
    elementwise_two_vector_row_cycles: MappingProxyType = field(default_factory=lambda: _frozen({_F16: 15, _F32: 13}))
    exchange_sync_cycles: int = 0
    dense_amp_efficiency: float = 0.95
    output_bytes_per_cycle: float = 1.0
    reduce_cycles_per_vector: float = 11.0
    reduce_cycles_per_partial: float = 1.0
    exchange_broadcast_factor: float = 2.0
    tile_grain: int = 2
    dense_fixed_cycles: int = 11_000
    metadata_cycles_per_entry: float = 16.0
    round_cycles: int = 3_000
    metadata_bytes_per_block: int = 4
    metadata_bytes_per_row: int = 8

    def __post_init__(self):
        for attr in ("num_tiles", "tile_memory_bytes", "num_workers", "tile_grain"):
            v = getattr(self, attr)
            if int(v) != v or v <= 0:
                raise ValueError(f"Expected a positive integer {attr}. Got {v!r}.")
        for attr in ("clock_hz", "exchange_bytes_per_cycle", "load_bytes_per_cycle", "store_bytes_per_cycle"):
            if not getattr(self, attr) > 0:
                raise ValueError(f"Expected a positive {attr}. Got {getattr(self, attr)!r}.")
        # Plain dicts passed by the user become read-only so that the machine stays hashable in spirit.
        object.__setattr__(self, "amp_macs_per_cycle", _frozen(self.amp_macs_per_cycle))
        object.__setattr__(self, "vector_lanes", _frozen(self.vector_lanes))
        object.__setattr__(self, "elementwise_two_vector_row_cycles", _frozen(self.elementwise_two_vector_row_cycles))

    # Frozen dataclasses hash their fields; mapping proxies are not hashable, so hash a canonical tuple.
    def _key(self) -> tuple:
        out = []
        for f in self.__dataclass_fields__:
            v = getattr(self, f)
            out.append(tuple(sorted(v.items())) if isinstance(v, MappingProxyType) else v)
        return tuple(out)

    def __hash__(self) -> int:
        return hash(self._key())

    def __eq__(self, other) -> bool:
        return isinstance(other, IPUMachine) and self._key() == other._key()

    # -- derived rates ----------------------------------------------------------------------------
    def check_dtype(self, dtype) -> str:
        """The dtype's name if the machine models it, else a ValueError naming the supported ones."""
        name = _dtype_name(dtype) if isinstance(dtype, str) else np.dtype(dtype).name
        if name not in self.amp_macs_per_cycle:
            raise ValueError(
                f"Expected a dtype the IPU model supports ({', '.join(sorted(self.amp_macs_per_cycle))}). Got {name}."
            )
        return name

    def peak_flops(self, dtype) -> float:
        """Chip peak flop/s for ``dtype`` (2 flop per multiply-accumulate)."""
        return 2.0 * self.amp_macs_per_cycle[self.check_dtype(dtype)] * self.num_tiles * self.clock_hz

    def sub_block(self, block_size: tuple[int, int]) -> int:
        """Side of the square sub-block a ``bh x bw`` block is computed in (16, 8, 4 on the AMP; 1 otherwise).

        Blocks larger than the AMP's native 16 x 16 are decomposed into 16 x 16 sub-blocks; other
        shapes into the largest of 16, 8, 4 dividing both sides, else into elements.
        """
        g = int(np.gcd(*block_size))
        for s in (self.amp_native_block, 8, 4):
            if g % s == 0:
                return s
        return 1

    def block_macs_per_cycle(self, sub: int, dtype, rows_sharing: int = 1) -> float:
        """Tile multiply-accumulates per cycle when computing ``sub x sub`` (sub-)blocks.

        On the vector unit (``sub < 4``), ``rows_sharing`` output rows share each loaded row of ``x``
        (the block height), which shares the load part of the issue overhead between them.
        """
        name = self.check_dtype(dtype)
        if sub >= 4:
            return self.amp_macs_per_cycle[name] * min(sub, self.amp_native_block) / self.amp_native_block
        issue = 1.0 + (self.elementwise_issue_overhead - 1.0) / max(int(rows_sharing), 1)
        return self.vector_lanes[name] / issue

    def column_grain(self, dtype) -> int:
        """Columns of ``x`` handled together by one vector instruction."""
        return int(self.vector_lanes[self.check_dtype(dtype)])

    def seconds(self, cycles: float) -> float:
        return float(cycles) / self.clock_hz

    def __repr__(self) -> str:
        return (
            f"IPUMachine({self.name!r}, {self.num_tiles} tiles x {self.tile_memory_bytes // 1024} KiB, "
            f"{self.clock_hz / 1e9:.3g} GHz, {self.exchange_bytes_per_cycle:g} B/cycle/tile exchange)"
        )


@functools.lru_cache(maxsize=64)
def _dtype_name(name: str) -> str:
    """``np.dtype(name).name``, remembered: the cost model asks for it many times per planned candidate."""
    return np.dtype(name).name


#: Colossus Mk2 GC200 IPU (1.325 GHz).
MK2 = IPUMachine(name="mk2", clock_hz=1.325e9)
#: Bow IPU: the GC200 tile array at 1.85 GHz.
BOW = IPUMachine(name="bow", clock_hz=1.85e9)

_BY_NAME = {"mk2": MK2, "gc200": MK2, "bow": BOW}


def by_name(name: str) -> IPUMachine:
    """``"mk2"`` (or ``"gc200"``) or ``"bow"``."""
    try:
        return _BY_NAME[str(name).lower()]
    except KeyError:
        raise ValueError(f"Expected an IPU machine name in {sorted(set(_BY_NAME))}. Got {name!r}.") from None
