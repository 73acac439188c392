"""The fixed-shape work list that the block-sparse GPU kernels consume.

A :class:`RowSplitSchedule` partitions the non-zero blocks of a block-sparse operand into
*units*. A unit is a contiguous run of at most ``max_len`` blocks of one output block row; one
GPU program handles one unit (times one tile of the dense dimension). A row longer than
``max_len`` is split into several units whose partial sums go to a float32 scratch buffer and are
combined afterwards; every other row (empty rows too) is written by exactly one unit, directly.

Kernels never know who built the schedule: :func:`blocksparse.plan.gpu.lower` fills it on the
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
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["RowSplitSchedule"]


def _frozen(a) -> np.ndarray:
    a = np.ascontiguousarray(a, dtype=np.int32)
    a.setflags(write=False)
    return a


@dataclass(frozen=True, eq=False)
class RowSplitSchedule:
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
    key: str = field(default="")

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

    @property
    def num_units(self) -> int:
        return int(self.unit_start.shape[0])

    @property
    def num_partials(self) -> int:
        """``S``: the number of float32 partial slots (units of split rows)."""
        return int(self.partial_seg.shape[0])

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
