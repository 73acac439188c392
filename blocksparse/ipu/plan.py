"""The plan types: :class:`Plan` (static) and :class:`DynamicPlan`, their shared estimates, and the error.

Plans are immutable: they are cached and shared between callers, so their per-phase mappings are
read-only (``types.MappingProxyType``) and every array is read-only; ``to_dict()`` returns plain
copies. :mod:`.partition` and :mod:`.buckets` build them; :mod:`.report` formats both kinds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import ClassVar

import numpy as np

from .._pattern import BlockPattern
from . import cost as _cost
from .machines import IPUMachine
from .report import report as _report

__all__ = ["DynamicPlan", "NoValidPlanError", "Plan"]


class NoValidPlanError(ValueError):
    """No partition of the product fits the tile memory limit.

    The message names the smallest footprint, the limit, and what to change; every suggestion was
    checked by planning again.

    Attributes:
        suggestions: the suggestions as keyword changes to the failed call, e.g.
            ``[{"available_memory_proportion": 0.79}, {"n": 522}, {"dtype": "float16"}]``; each one
            applied alone gives a plan.
        nothing_fits: True when even ``n = 1`` with ``available_memory_proportion = 1.0`` does not fit.
    """

    def __init__(self, message: str, *, suggestions=(), nothing_fits: bool = False):
        super().__init__(message)
        self.suggestions = [dict(s) for s in suggestions]
        self.nothing_fits = nothing_fits


def _read_only(value):
    """Freeze what a plan holds: arrays become read-only, dicts read-only mappings."""
    if isinstance(value, np.ndarray):
        if value.flags.writeable:
            value = value.copy() if not value.flags.owndata else value
            value.setflags(write=False)
        return value
    if isinstance(value, dict | MappingProxyType):
        return MappingProxyType({k: float(v) for k, v in value.items()})
    return value


class _Estimates:
    """Derived estimates shared by :class:`Plan` and :class:`DynamicPlan`: both carry ``cycles``
    and ``exchange_bytes`` (per phase), ``machine``, ``available_memory_proportion``, ``dense``
    and ``_useful_blocks``; both are frozen once built (see :func:`_read_only`)."""

    kind: ClassVar[str]
    phases: ClassVar[tuple[str, ...]]

    def __post_init__(self):
        for f in self.__dataclass_fields__:
            object.__setattr__(self, f, _read_only(getattr(self, f)))

    @property
    def total_cycles(self) -> float:
        return float(sum(self.cycles.values()))

    @property
    def seconds(self) -> float:
        return self.machine.seconds(self.total_cycles)

    @property
    def flops(self) -> float:
        """Useful flops: ``2 * blocks * bh * bw * n`` over the non-zero elements of the blocks."""
        bh, bw = self.block_size
        return 2.0 * self._useful_blocks * bh * bw * self.n

    @property
    def tflops(self) -> float:
        return self.flops / self.seconds / 1e12 if self.seconds > 0 else 0.0

    @property
    def memory_limit_bytes(self) -> float:
        return self.available_memory_proportion * self.machine.tile_memory_bytes

    @property
    def speedup(self) -> float | None:
        """Predicted speedup over the modelled dense matmul.

        ``None`` if dense does not fit, or if there is no useful work (no non-zero block): an
        empty product is not faster than dense in any meaningful sense.
        """
        if self.dense is None or self.seconds <= 0 or self._useful_blocks == 0:
            return None
        return self.dense.seconds / self.seconds

    def _estimates_dict(self) -> dict:
        """The estimate entries of ``to_dict()``, common to both plan kinds."""
        return {
            "memory_limit_bytes": self.memory_limit_bytes,
            "exchange_bytes": dict(self.exchange_bytes),
            "cycles": dict(self.cycles),
            "total_cycles": self.total_cycles,
            "seconds": self.seconds,
            "tflops": self.tflops,
            "dense": None if self.dense is None else self.dense.to_dict(),
            "speedup_over_dense": self.speedup,
            "candidates": self.candidates,
        }

    def report(self) -> str:
        """A readable table: partition, load, memory, cycles and bytes per phase, speedup."""
        return _report(self)

    __str__ = report

    def to_json(self, path=None, **to_dict_options) -> str:
        """The summary as JSON text; written to ``path`` too when given."""
        text = json.dumps(self.to_dict(**to_dict_options), indent=2)
        if path is not None:
            with open(path, "w") as f:
                f.write(text + "\n")
        return text


@dataclass(frozen=True, eq=False)
class Plan(_Estimates):
    """A static partition of ``W @ X`` over IPU tiles, with its estimated cost.

    The block assignment is the same for every piece of ``n``: local tile ``t`` of piece ``s``
    is physical tile ``s * tiles_per_split + t``. Per-tile arrays have fixed shapes, padded
    with ``-1``; block indices refer to the pattern's (row-major) block order.

    Attributes:
        pattern: the planned :class:`~blocksparse.BlockPattern`.
        n: columns of ``X``.
        machine: the :class:`~blocksparse.ipu.IPUMachine`.
        dtype, partials_dtype: operand and accumulation dtype names.
        available_memory_proportion: the fraction of tile memory the plan may use.
        n_split, num_bands, tiles_per_split: the chosen partition.
        serial: passes over ``n`` run one after the other (1 unless no single pass fits).
        n_pieces: ``int[pieces, 2]`` ``[start, stop)`` of each piece of ``n`` (equal widths but for
            a shorter last one); piece ``j`` runs on the tiles of split ``j % n_split`` in pass
            ``j // n_split``.
        band_boundaries: ``int[num_bands + 1]`` block-column boundaries of the bands.
        tiles_per_band: ``int[num_bands]`` tiles holding each band's blocks.
        tile_band: ``int[tiles_per_split]`` band of each local tile (``-1`` if idle).
        tile_blocks: ``int[tiles_per_split, max_blocks]`` blocks of each tile, in row order.
        tile_rows: ``int[tiles_per_split, max_rows]`` distinct block rows of each tile.
        tile_cols: ``int[tiles_per_split, max_cols]`` distinct block columns of each tile.
        tile_local_row, tile_local_col: ``int[tiles_per_split, max_blocks]`` slot of each block's
            row in ``tile_rows`` and of its column in ``tile_cols``.
        tile_bytes: ``float[tiles_per_split]`` modelled memory per tile.
        cycles: estimated cycles per phase (see :data:`blocksparse.ipu.cost.PHASES`).
        exchange_bytes: bytes moved per exchange phase, over all tiles.
        dense: the modelled dense matmul of the same shape (``None`` if it does not fit).
        candidates: number of partitions scored.
    """

    pattern: BlockPattern
    n: int
    machine: IPUMachine
    dtype: str
    partials_dtype: str
    available_memory_proportion: float
    n_split: int
    num_bands: int
    tiles_per_split: int
    serial: int
    n_pieces: np.ndarray
    band_boundaries: np.ndarray
    tiles_per_band: np.ndarray
    tile_band: np.ndarray
    tile_blocks: np.ndarray
    tile_rows: np.ndarray
    tile_cols: np.ndarray
    tile_local_row: np.ndarray
    tile_local_col: np.ndarray
    tile_bytes: np.ndarray
    cycles: MappingProxyType = field(repr=False)
    exchange_bytes: MappingProxyType = field(repr=False)
    dense: _cost.DenseEstimate | None = field(repr=False)
    candidates: int = 0

    kind: ClassVar[str] = "static"
    phases: ClassVar[tuple[str, ...]] = _cost.PHASES

    # -- derived -----------------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, int]:
        return self.pattern.shape

    @property
    def block_size(self) -> tuple[int, int]:
        return self.pattern.block_size

    @property
    def tile_num_blocks(self) -> np.ndarray:
        return (self.tile_blocks >= 0).sum(axis=1)

    @property
    def tiles_used(self) -> int:
        """Physical tiles holding at least one block (over all pieces of ``n``)."""
        return int((self.tile_num_blocks > 0).sum()) * self.n_split

    @property
    def _useful_blocks(self) -> int:
        return self.pattern.nnz_blocks

    def __repr__(self) -> str:
        return (
            f"Plan({self.shape[0]}x{self.shape[1]} b={self.block_size} nnz_blocks={self.pattern.nnz_blocks} "
            f"@ n={self.n}, {self.dtype} on {self.machine.name}: n_split={self.n_split}, "
            f"bands={self.num_bands}, tiles={self.tiles_used}, {self.seconds * 1e6:.3g} us)"
        )

    # -- output ------------------------------------------------------------------------------------
    def to_dict(self, arrays: bool = False) -> dict:
        """A JSON-serialisable summary; ``arrays=True`` adds the per-tile assignment arrays."""
        used = self.tile_num_blocks > 0
        nb = self.tile_num_blocks[used]
        tb = self.tile_bytes[used] if used.any() else self.tile_bytes[:1]
        out = {
            "kind": self.kind,
            "machine": self.machine.name,
            "shape": list(self.shape),
            "block_size": list(self.block_size),
            "nnz_blocks": self.pattern.nnz_blocks,
            "density": self.pattern.density,
            "fingerprint": self.pattern.fingerprint,
            "n": self.n,
            "dtype": self.dtype,
            "partials_dtype": self.partials_dtype,
            "available_memory_proportion": self.available_memory_proportion,
            "n_split": self.n_split,
            "serial_passes": self.serial,
            "num_bands": self.num_bands,
            "tiles_per_split": self.tiles_per_split,
            "tiles_used": self.tiles_used,
            "blocks_per_tile": {"max": int(nb.max(initial=0)), "mean": float(nb.mean()) if nb.size else 0.0},
            "bytes_per_tile": {"max": float(tb.max(initial=0.0)), "mean": float(tb.mean()) if tb.size else 0.0},
            **self._estimates_dict(),
        }
        if arrays:
            for name in ("n_pieces", "band_boundaries", "tiles_per_band", "tile_band", "tile_blocks", "tile_rows",
                         "tile_cols", "tile_local_row", "tile_local_col", "tile_bytes"):  # fmt: skip
                out[name] = getattr(self, name).tolist()
        return out


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
        cycles: estimated cycles per phase (:data:`blocksparse.ipu.cost.DYNAMIC_PHASES`), full buckets exchanged,
            the busiest group's expected blocks computed.
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
    cycles: MappingProxyType = field(repr=False)
    exchange_bytes: MappingProxyType = field(repr=False)
    dense: _cost.DenseEstimate | None = field(repr=False)
    candidates: int = 0

    kind: ClassVar[str] = "dynamic"
    phases: ClassVar[tuple[str, ...]] = _cost.DYNAMIC_PHASES

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
            "kind": self.kind,
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
