"""Host-side block-sparsity patterns.

A :class:`BlockPattern` is the static half of a :class:`~blocksparse.BlockSparseMatrix`:
the positions of the non-zero blocks, held as NumPy arrays on the host, sorted in row-major
order (a CSR of blocks). It is immutable and hashable through a fingerprint computed once,
so it can sit in a pytree's static structure and key ``jit`` and plan caches.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "MAX_BLOCKS",
    "MAX_BLOCK_ROWS",
    "MAX_DIM",
    "BlockPattern",
    "check_block_size",
    "check_density",
    "check_shape",
]


#: The largest side of a matrix: kernels and XLA's index arithmetic use int32.
MAX_DIM = 2**31 - 1
#: The most blocks one matrix may hold (block ids and offsets are int32 on the device).
MAX_BLOCKS = 2**31 - 1
#: The most block rows (or columns: the transpose is cached) of a static pattern: the host keeps an 8-byte row
#: offset per block row, 512 MiB at this many, whatever the number of blocks.
MAX_BLOCK_ROWS = 2**26


def check_shape(shape, what: str = "shape") -> tuple[int, int]:
    """``shape`` as a pair of Python ints in ``[0, MAX_DIM]``: integers only (a float is never truncated)."""
    if isinstance(shape, str) or not hasattr(shape, "__len__") or len(shape) != 2:
        raise ValueError(f"Expected a 2-D {what} (m, k). Got {shape!r}.")
    if not all(_is_int(s) or (isinstance(s, np.ndarray) and s.ndim == 0 and _is_int(s[()])) for s in shape):
        kinds = ", ".join(type(s).__name__ for s in shape)
        raise TypeError(f"Expected {what} as a pair of ints. Got {tuple(shape)!r} ({kinds}).")
    m, k = (int(s) for s in shape)
    if m < 0 or k < 0:
        raise ValueError(f"Expected a non-negative {what}. Got {(m, k)}.")
    if m > MAX_DIM or k > MAX_DIM:
        raise ValueError(
            f"Expected each side of {what} at most {MAX_DIM} = 2**31 - 1 (int32 indexing on the device). Got {(m, k)}."
        )
    return m, k


def check_block_size(shape: tuple[int, int], block_size: tuple[int, int]) -> tuple[int, int]:
    """Validate ``block_size`` against ``shape`` (see :func:`check_shape`) and return it as a pair of ints."""
    m, k = check_shape(shape)
    bh, bw = block_pair(block_size)
    if m % bh or k % bw:
        raise ValueError(
            f"Expected block_size ({bh}, {bw}) to divide the shape {(m, k)}. Got remainders ({m % bh}, {k % bw})."
        )
    return bh, bw


def check_grid(shape: tuple[int, int], block_size: tuple[int, int]) -> tuple[int, int]:
    """The block grid of a static pattern, refused where the host's row index could not be held."""
    gm, gk = shape[0] // block_size[0], shape[1] // block_size[1]
    if max(gm, gk) > MAX_BLOCK_ROWS:
        raise ValueError(
            f"Expected at most {MAX_BLOCK_ROWS} = 2**26 block rows and block columns in a static pattern (the host "
            f"keeps 8 bytes per block row of it and of its transpose). Got a grid of {(gm, gk)} blocks "
            f"(shape {tuple(shape)}, block size {tuple(block_size)}); use larger blocks."
        )
    return gm, gk


def check_num_blocks(n: int, what: str = "blocks") -> int:
    """``n`` (a count of blocks) refused past :data:`MAX_BLOCKS`."""
    if n > MAX_BLOCKS:
        raise ValueError(f"Expected at most {MAX_BLOCKS} = 2**31 - 1 {what} (int32 block ids). Got {n}.")
    return n


def _readonly(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a, dtype=np.int32)
    a.setflags(write=False)
    return a


@dataclass(frozen=True, eq=False, repr=False)
class BlockPattern:
    """Positions of the non-zero blocks of an ``m x k`` matrix with ``bh x bw`` blocks.

    Attributes:
        shape: ``(m, k)``, the dense shape.
        block_size: ``(bh, bw)``.
        rows, cols: ``int32[nnz_blocks]`` block coordinates in row-major order, no duplicates.
        indptr: ``int64[m // bh + 1]`` offsets of each block row into ``rows``/``cols``; built on first use, so a
            pattern's host memory scales with its blocks until something needs the row index.
        fingerprint: a hex digest of all of the above; equality and hashing use it.
    """

    shape: tuple[int, int]
    block_size: tuple[int, int]
    rows: np.ndarray
    cols: np.ndarray
    fingerprint: str = field(init=False)

    def __post_init__(self):
        bh, bw = check_block_size(self.shape, self.block_size)
        m, k = (int(s) for s in self.shape)
        check_grid((m, k), (bh, bw))
        object.__setattr__(self, "shape", (m, k))
        object.__setattr__(self, "block_size", (bh, bw))
        rows, cols = np.asarray(self.rows), np.asarray(self.cols)
        if rows.ndim != 1 or cols.shape != rows.shape:
            raise ValueError(
                f"Expected rows and cols as 1-D arrays of one length. Got shapes {rows.shape} and {cols.shape}."
            )
        check_num_blocks(rows.size)
        gm, gk = m // bh, k // bw
        _check_range("rows", rows, gm)
        _check_range("cols", cols, gk)
        rows, cols = rows.astype(np.int64), cols.astype(np.int64)
        order = np.lexsort((cols, rows))
        rows, cols = rows[order], cols[order]
        if rows.size > 1:
            dup = (rows[1:] == rows[:-1]) & (cols[1:] == cols[:-1])
            if dup.any():
                i = int(np.flatnonzero(dup)[0])
                raise ValueError(
                    f"Expected unique block positions in a static pattern. Got block ({rows[i]}, {cols[i]}) "
                    "more than once; sum duplicates first or use DynamicBlockSparseMatrix."
                )
        object.__setattr__(self, "rows", _readonly(rows))
        object.__setattr__(self, "cols", _readonly(cols))
        h = hashlib.blake2b(digest_size=16)
        h.update(np.array([m, k, bh, bw], np.int64).tobytes())
        h.update(self.rows.tobytes())
        h.update(self.cols.tobytes())
        object.__setattr__(self, "fingerprint", h.hexdigest())

    @functools.cached_property
    def indptr(self) -> np.ndarray:
        indptr = np.zeros(self.grid[0] + 1, np.int64)
        np.cumsum(np.bincount(self.rows, minlength=self.grid[0]), out=indptr[1:])
        return _readonly(indptr)

    # -- identity ---------------------------------------------------------------------------
    def __hash__(self) -> int:
        return hash(self.fingerprint)

    def __eq__(self, other) -> bool:
        return isinstance(other, BlockPattern) and other.fingerprint == self.fingerprint

    def __repr__(self) -> str:
        return (
            f"BlockPattern(shape={self.shape}, block_size={self.block_size}, "
            f"nnz_blocks={self.nnz_blocks}, density={self.density:.4g})"
        )

    # -- derived ----------------------------------------------------------------------------
    @property
    def grid(self) -> tuple[int, int]:
        """Number of block rows and block columns."""
        return self.shape[0] // self.block_size[0], self.shape[1] // self.block_size[1]

    @property
    def nnz_blocks(self) -> int:
        return int(self.rows.size)

    @property
    def density(self) -> float:
        gm, gk = self.grid
        return self.nnz_blocks / (gm * gk) if gm * gk else 0.0

    @property
    def row_lengths(self) -> np.ndarray:
        return np.diff(self.indptr)

    @functools.cached_property
    def _transpose(self) -> tuple[BlockPattern, np.ndarray]:
        # Stable sort by (col, row): perm[j] is the position in self of the j-th block of the transpose.
        perm = np.lexsort((self.rows, self.cols)).astype(np.int32)
        t = BlockPattern(
            (self.shape[1], self.shape[0]),
            (self.block_size[1], self.block_size[0]),
            self.cols[perm],
            self.rows[perm],
        )
        perm.setflags(write=False)
        return t, perm

    def transpose(self) -> tuple[BlockPattern, np.ndarray]:
        """The transposed pattern and ``perm`` with ``T.data = data[perm].swapaxes(1, 2)``. Cached."""
        return self._transpose

    @property
    def T(self) -> BlockPattern:
        return self._transpose[0]

    def mask(self) -> np.ndarray:
        """Boolean block mask of shape ``grid``."""
        out = np.zeros(self.grid, bool)
        out[self.rows, self.cols] = True
        return out

    # -- constructors -----------------------------------------------------------------------
    @classmethod
    def from_mask(cls, mask, block_size) -> BlockPattern:
        mask = np.asarray(mask)
        if mask.ndim != 2:
            raise ValueError(f"Expected a 2-D block mask. Got {mask.ndim} dimensions (shape {mask.shape}).")
        if mask.dtype != bool:  # a score or density map passed by mistake must not become a full pattern
            if not np.issubdtype(mask.dtype, np.integer):
                raise TypeError(f"Expected a bool (or 0 / 1 integer) block mask. Got dtype {mask.dtype}.")
            if mask.size and not np.isin(mask, (0, 1)).all():
                bad = mask[~np.isin(mask, (0, 1))]
                raise ValueError(f"Expected a 0 / 1 block mask. Got values {sorted(set(bad.tolist()))[:5]}.")
        bh, bw = block_pair(block_size)
        rows, cols = np.nonzero(mask)
        return cls((mask.shape[0] * bh, mask.shape[1] * bw), (bh, bw), rows, cols)

    @classmethod
    def random(cls, rng: np.random.Generator | int, shape, block_size, density: float) -> BlockPattern:
        """A pattern with ``round(density * blocks)`` blocks placed uniformly at random."""
        bh, bw = check_block_size(shape, block_size)
        density = check_density(density)
        rng = np.random.default_rng(rng)
        gm, gk = check_grid(check_shape(shape), (bh, bw))
        n = check_num_blocks(int(round(density * gm * gk)))
        flat = rng.choice(gm * gk, size=n, replace=False) if n else np.zeros(0, np.int64)
        return cls(shape, (bh, bw), flat // gk, flat % gk)

    @classmethod
    def clustered(
        cls, rng, shape, block_size, density: float, cluster: int | None = None, axis: int = 0
    ) -> BlockPattern:
        """A pattern whose block rows (``axis=1``: block columns) come in clusters of ``cluster`` that keep the same
        blocks, in shuffled order: what a pruned layer looks like when some inputs matter to many outputs, and
        what the grouped kernel's planner recovers (a unit per cluster, every dot full).

        Each cluster keeps each block column (row) with probability ``density``, and at least one where
        ``density > 0``, so the count of blocks is ``density`` of the grid in expectation, not exactly. ``cluster``
        defaults to the block rows of 128 rows of the matrix (``128 // bh``; columns: ``128 // bw``), one tile of
        the kernels.

        Example::

            >>> p = BlockPattern.clustered(0, (256, 256), 16, 1 / 4)
            >>> rows = p.mask()
            >>> int(sum((rows == rows[0]).all(axis=1)))   # row 0's cluster: 8 rows with its columns
            8
        """
        bh, bw = check_block_size(shape, block_size)
        density = check_density(density)
        if axis not in (0, 1):
            raise ValueError(f"Expected axis 0 (clusters of block rows) or 1 (of block columns). Got {axis!r}.")
        gm, gk = check_grid(check_shape(shape), (bh, bw))
        across, along = (gm, gk) if axis == 0 else (gk, gm)
        if cluster is None:
            cluster = max(1, 128 // (bh if axis == 0 else bw))
        if not _is_int(cluster) or cluster < 1:
            raise ValueError(f"Expected cluster as a positive int (block rows or columns). Got {cluster!r}.")
        rng = np.random.default_rng(rng)
        mask = np.zeros((across, along), bool)
        if along:
            for start in range(0, across, int(cluster)):
                keep = rng.random(along) < density
                keep[rng.integers(along)] = density > 0
                mask[start : start + int(cluster)] = keep
        mask = mask[rng.permutation(across)]
        return cls.from_mask(mask if axis == 0 else mask.T, (bh, bw))

    @classmethod
    def power_law(cls, rng, shape, block_size, density: float, alpha: float = 1.2) -> BlockPattern:
        """A pattern whose row lengths follow a Zipf-like law (a few very long rows)."""
        bh, bw = check_block_size(shape, block_size)
        density = check_density(density)
        rng = np.random.default_rng(rng)
        gm, gk = check_grid(check_shape(shape), (bh, bw))
        total = check_num_blocks(int(round(density * gm * gk)))
        weights = 1.0 / np.arange(1, gm + 1) ** alpha
        weights = weights[rng.permutation(gm)]
        lengths = np.minimum(np.floor(weights / weights.sum() * total).astype(np.int64), gk)
        # Top up to the exact total, row by row, respecting the row capacity gk.
        short = total - int(lengths.sum())
        while short > 0:
            room = np.flatnonzero(lengths < gk)
            take = room[rng.permutation(room.size)[:short]]
            lengths[take] += 1
            short = total - int(lengths.sum())
        rows = np.repeat(np.arange(gm), lengths)
        cols = np.concatenate([rng.choice(gk, size=int(n), replace=False) for n in lengths]) if total else rows
        return cls(shape, (bh, bw), rows, cols)


def _is_int(b) -> bool:
    # Python or NumPy integers; bool is an int subclass but never a meaningful block size.
    return isinstance(b, int | np.integer) and not isinstance(b, bool | np.bool_)


def block_pair(block_size) -> tuple[int, int]:
    """``b`` or ``(bh, bw)`` as a pair of positive Python ints; anything else raises."""
    expected = "block_size as a positive int or a pair (bh, bw) of positive ints"
    if isinstance(block_size, np.ndarray) and block_size.ndim == 0:
        block_size = block_size[()]
    if _is_int(block_size):
        pair = (int(block_size), int(block_size))
    elif isinstance(block_size, tuple | list | np.ndarray) and not isinstance(block_size, str):
        items = list(block_size.tolist() if isinstance(block_size, np.ndarray) else block_size)
        if len(items) != 2 or not all(_is_int(b) for b in items):
            raise _block_size_error(expected, block_size)
        pair = (int(items[0]), int(items[1]))
    else:
        raise _block_size_error(expected, block_size)
    if pair[0] <= 0 or pair[1] <= 0:
        raise ValueError(f"Expected {expected}. Got {block_size!r}, which is not positive.")
    return pair


def _block_size_error(expected: str, got) -> Exception:
    if isinstance(got, tuple | list) and len(got) != 2:
        return ValueError(f"Expected {expected}. Got {got!r} ({len(got)} entries).")
    if isinstance(got, tuple | list):  # the entry that is not an int, and its type
        i = next(i for i, b in enumerate(got) if not _is_int(b))
        return TypeError(f"Expected {expected}. Got {got!r}, whose entry {i} is {got[i]!r} of type {_kind(got[i])}.")
    return TypeError(f"Expected {expected}. Got {got!r} of type {_kind(got)}.")


def _kind(x) -> str:
    """A value's type as a user would name it: ``numpy.bool_``, ``float``."""
    t = type(x)
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__.split('.')[0]}.{t.__name__}"


def check_density(density) -> float:
    """``density`` as a float in ``[0, 1]``; anything else raises."""
    if isinstance(density, bool | np.bool_ | str):
        raise TypeError(f"Expected density as a number in [0, 1]. Got {density!r} of type {type(density).__name__}.")
    d = float(density)
    if not 0.0 <= d <= 1.0:  # NaN fails too
        raise ValueError(f"Expected density in [0, 1]. Got {density}.")
    return d


def num_blocks(density: float, total: int) -> int:
    """``round(density * total)``, refusing a positive density that rounds to no block at all."""
    n = int(round(density * total))
    if n == 0 and density > 0 and total > 0:
        raise ValueError(
            f"Expected a density that keeps at least one of the {total} blocks: round(density * {total}) >= 1, "
            f"i.e. density > {0.5 / total:.4g} (1/{total} = {1 / total:.4g} keeps exactly one), "
            f"or density=0 for an empty matrix. Got density={density}, which keeps 0 blocks."
        )
    return n


def _check_range(name: str, idx: np.ndarray, limit: int) -> None:
    if idx.size == 0:
        return
    if not np.issubdtype(idx.dtype, np.integer):
        raise TypeError(f"Expected integer block {name}. Got dtype {idx.dtype}.")
    lo, hi = int(idx.min()), int(idx.max())
    if lo < 0 or hi >= limit:
        bad = lo if lo < 0 else hi
        raise ValueError(f"Expected block {name} in [0, {limit}). Got {bad}.")
