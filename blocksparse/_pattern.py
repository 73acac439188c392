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

__all__ = ["BlockPattern", "check_block_size", "check_density"]


def check_block_size(shape: tuple[int, int], block_size: tuple[int, int]) -> tuple[int, int]:
    """Validate ``block_size`` against ``shape`` and return it as a pair of ints."""
    if len(shape) != 2:
        raise ValueError(f"Expected a 2-D shape (m, k). Got {tuple(shape)}.")
    bh, bw = block_pair(block_size)
    m, k = (int(s) for s in shape)
    if m < 0 or k < 0:
        raise ValueError(f"Expected a non-negative shape. Got {(m, k)}.")
    if m % bh or k % bw:
        raise ValueError(
            f"Expected block_size ({bh}, {bw}) to divide the shape {(m, k)}. Got remainders ({m % bh}, {k % bw})."
        )
    return bh, bw


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
        indptr: ``int32[m // bh + 1]`` offsets of each block row into ``rows``/``cols``.
        fingerprint: a hex digest of all of the above; equality and hashing use it.
    """

    shape: tuple[int, int]
    block_size: tuple[int, int]
    rows: np.ndarray
    cols: np.ndarray
    indptr: np.ndarray = field(init=False)
    fingerprint: str = field(init=False)

    def __post_init__(self):
        bh, bw = check_block_size(self.shape, self.block_size)
        m, k = (int(s) for s in self.shape)
        object.__setattr__(self, "shape", (m, k))
        object.__setattr__(self, "block_size", (bh, bw))
        rows, cols = np.asarray(self.rows), np.asarray(self.cols)
        if rows.ndim != 1 or cols.shape != rows.shape:
            raise ValueError(
                f"Expected rows and cols as 1-D arrays of one length. Got shapes {rows.shape} and {cols.shape}."
            )
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
        indptr = np.zeros(gm + 1, np.int64)
        np.cumsum(np.bincount(rows, minlength=gm), out=indptr[1:])
        object.__setattr__(self, "rows", _readonly(rows))
        object.__setattr__(self, "cols", _readonly(cols))
        object.__setattr__(self, "indptr", _readonly(indptr))
        h = hashlib.blake2b(digest_size=16)
        h.update(np.array([m, k, bh, bw], np.int64).tobytes())
        h.update(self.rows.tobytes())
        h.update(self.cols.tobytes())
        object.__setattr__(self, "fingerprint", h.hexdigest())

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
        bh, bw = block_pair(block_size)
        rows, cols = np.nonzero(mask)
        return cls((mask.shape[0] * bh, mask.shape[1] * bw), (bh, bw), rows, cols)

    @classmethod
    def random(cls, rng: np.random.Generator | int, shape, block_size, density: float) -> BlockPattern:
        """A pattern with ``round(density * blocks)`` blocks placed uniformly at random."""
        bh, bw = check_block_size(shape, block_size)
        density = check_density(density)
        rng = np.random.default_rng(rng)
        gm, gk = shape[0] // bh, shape[1] // bw
        n = int(round(density * gm * gk))
        flat = rng.choice(gm * gk, size=n, replace=False) if n else np.zeros(0, np.int64)
        return cls(shape, (bh, bw), flat // gk, flat % gk)

    @classmethod
    def power_law(cls, rng, shape, block_size, density: float, alpha: float = 1.2) -> BlockPattern:
        """A pattern whose row lengths follow a Zipf-like law (a few very long rows)."""
        bh, bw = check_block_size(shape, block_size)
        density = check_density(density)
        rng = np.random.default_rng(rng)
        gm, gk = shape[0] // bh, shape[1] // bw
        total = int(round(density * gm * gk))
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
    kind = type(got).__name__
    if isinstance(got, tuple | list) and len(got) != 2:
        return ValueError(f"Expected {expected}. Got {got!r} ({len(got)} entries).")
    return TypeError(f"Expected {expected}. Got {got!r} of type {kind}.")


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
