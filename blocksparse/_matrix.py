"""Block-sparse matrix types.

``BlockSparseMatrix``: static pattern (host data, in the pytree's static structure), traced
``.data``. ``DynamicBlockSparseMatrix``: traced rows, cols, data and nnz, static capacity.
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

from ._pattern import (
    BlockPattern,
    block_pair,
    check_block_size,
    check_density,
    check_grid,
    check_num_blocks,
    check_shape,
    num_blocks,
)
from ._util import Pytree, runtime_checks_enabled

__all__ = ["BlockSparseMatrix", "DynamicBlockSparseMatrix", "concatenate", "random"]


def check_floating(dtype, what: str = "data") -> None:
    if not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(f"Expected floating-point {what}. Got dtype {jnp.dtype(dtype)}.")


def is_concrete(x) -> bool:
    return not isinstance(x, jax.core.Tracer)


def require_host(what: str, **values) -> None:
    """Raise a clear error for traced arguments of a function that builds a static pattern."""
    for name, value in values.items():
        if any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(value)):
            raise TypeError(
                f"{what}: expected {name} as concrete host data. Got a traced value: the pattern is host data "
                "(part of the program jit compiles), so build it outside jit and pass the matrix in as an argument, "
                "or use DynamicBlockSparseMatrix for a pattern that changes inside jit."
            )


_INT32 = np.iinfo(np.int32)


def _coords(name: str, idx) -> jax.Array:
    """Block coordinates as int32: concrete values out of int32 range raise, traced ones become -1 (invalid).

    A plain ``astype(int32)`` would wrap ``2**32 + 1`` to ``1``, a plausible in-range coordinate.
    """
    if is_concrete(idx):
        host = np.asarray(idx)
        if host.dtype == object or not np.issubdtype(host.dtype, np.integer):
            raise TypeError(f"Expected integer block {name}. Got dtype {host.dtype}; round or cast explicitly.")
        if host.size and (int(host.min()) < _INT32.min or int(host.max()) > _INT32.max):
            bad = int(host.max()) if int(host.max()) > _INT32.max else int(host.min())
            raise ValueError(f"Expected block {name} within int32 range. Got {bad}.")
        return jnp.asarray(host.astype(np.int32))
    if not jnp.issubdtype(idx.dtype, jnp.integer):
        raise TypeError(f"Expected integer block {name}. Got dtype {idx.dtype}; round or cast explicitly.")
    info = jnp.iinfo(idx.dtype)
    if info.max > _INT32.max or info.min < _INT32.min:
        # Out of int32 range is out of any grid: -1 makes is_valid() False and products NaN.
        idx = jnp.where((idx < 0) | (idx > _INT32.max), -1, idx)
    return idx.astype(jnp.int32)


def _called_by_jax_operator() -> bool:
    # jax.Array's binary operators (x @ W, s * W) call ``other.__jax_array__()`` before deciding whether
    # to return NotImplemented; they live in jax._src.numpy.array_methods and are named ``_operator_*``.
    frame = sys._getframe(2)
    return frame.f_code.co_name.startswith("_operator_") and frame.f_globals.get("__name__", "").endswith(
        "numpy.array_methods"
    )


def inside_sparsify() -> bool:
    """Whether ``jax.experimental.sparse.sparsify`` is tracing the caller (its frames are on the stack)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_globals.get("__name__") == "jax.experimental.sparse.transform":
            return True
        frame = frame.f_back
    return False


def _leaf_repr(name: str, data) -> str:
    """``dtype=...`` of an array leaf, or ``data=<repr>`` of whatever else a tree operation put there."""
    dtype = getattr(data, "dtype", None)
    if dtype is not None:
        return f"{name}={dtype}"
    return f"data={data!r}"


class NoImplicitDense:
    """Refuse silent or cryptic conversions of a block-sparse matrix to a dense array."""

    __slots__ = ()

    def _conversion_error(self, how: str) -> TypeError:
        return TypeError(
            f"{how} cannot take a {type(self).__name__}: it is not a dense array. "
            "Multiply with `W @ x`, `x @ W` or `bs.matmul(W, x)`; for a dense copy call `W.to_dense()`."
        )

    def __array__(self, dtype=None, copy=None):
        raise self._conversion_error("np.asarray (or another NumPy function)")

    def __jax_array__(self):
        if _called_by_jax_operator():
            return self  # not an array type: the operator returns NotImplemented and Python calls ours
        raise self._conversion_error("jnp.asarray, jnp.dot (or another jax.numpy function)")

    def _sparsify_matmul(self, other, swap: bool):
        raise NotImplementedError

    def _matmul(self, other, swap: bool):
        if inside_sparsify():
            return self._sparsify_matmul(other, swap)
        from .ops.matmul.api import matmul

        return matmul(other, self) if swap else matmul(self, other)

    def __matmul__(self, other):
        return self._matmul(other, swap=False)

    def __rmatmul__(self, other):
        return self._matmul(other, swap=True)


class BlockSparseMatrix(NoImplicitDense, Pytree):
    """An ``m x k`` matrix of ``bh x bw`` blocks whose pattern is fixed when the program is built.

    The pattern (a :class:`BlockPattern`, NumPy on the host) is part of the pytree's static
    structure, so ``jit`` specialises on it; ``data`` of shape ``(nnz_blocks, bh, bw)`` is the only
    leaf. Blocks are stored in row-major order of their block coordinates.

    Build one with :meth:`from_dense`, :meth:`from_mask`, :meth:`from_blocks` or
    :func:`blocksparse.random`.

    Example::

        >>> import jax, jax.numpy as jnp, blocksparse as bs
        >>> W = bs.random(jax.random.key(0), (64, 32), (16, 16), density=0.5)
        >>> x = jnp.ones((32, 8))
        >>> bool(jnp.allclose(W @ x, W.to_dense() @ x, atol=1e-5))
        True
    """

    __slots__ = ("pattern", "data")
    __array_priority__ = 100
    _leaves = ("data",)
    _static = ("pattern",)

    def __init__(self, pattern: BlockPattern, data):
        if not isinstance(pattern, BlockPattern):
            raise TypeError(f"Expected a BlockPattern. Got {type(pattern).__name__}.")
        data = jnp.asarray(data)
        check_floating(data.dtype)
        expected = (pattern.nnz_blocks, *pattern.block_size)
        if data.shape[-3:] != expected or data.ndim != 3:
            raise ValueError(f"Expected data of shape {expected} (nnz_blocks, bh, bw). Got {data.shape}.")
        self.pattern = pattern
        self.data = data

    # -- constructors -------------------------------------------------------------------------
    @classmethod
    def from_dense(cls, x, block_size) -> BlockSparseMatrix:
        """Keep the blocks of ``x`` (a concrete 2-D array) that hold at least one non-zero."""
        require_host("BlockSparseMatrix.from_dense", x=x)
        x_np = np.asarray(x)
        if x_np.ndim != 2:
            raise ValueError(f"Expected a 2-D dense matrix. Got shape {x_np.shape}.")
        check_floating(x_np.dtype, "x")
        bh, bw = check_block_size(x_np.shape, block_size)
        m, k = x_np.shape
        blocks = x_np.reshape(m // bh, bh, k // bw, bw).swapaxes(1, 2)
        mask = (blocks != 0).any(axis=(2, 3))
        return cls.from_mask(mask, x, (bh, bw))

    @classmethod
    def from_mask(cls, mask, values, block_size) -> BlockSparseMatrix:
        """Blocks of the dense ``values`` (``m x k``) where the block mask (``m//bh x k//bw``) is true.

        ``values`` may be traced; ``mask`` must be concrete.
        """
        require_host("BlockSparseMatrix.from_mask", mask=mask)
        bh, bw = block_pair(block_size)
        values = jnp.asarray(values)
        check_floating(values.dtype, "values")
        if values.ndim != 2:
            raise ValueError(f"Expected 2-D values. Got shape {values.shape}.")
        check_block_size(values.shape, (bh, bw))
        m, k = values.shape
        mask = np.asarray(mask)
        if mask.shape != (m // bh, k // bw):
            raise ValueError(
                f"Expected a block mask of shape {(m // bh, k // bw)} for values {(m, k)} "
                f"with block size {(bh, bw)}. Got {mask.shape}."
            )
        pattern = BlockPattern.from_mask(mask, (bh, bw))
        blocks = values.reshape(m // bh, bh, k // bw, bw).swapaxes(1, 2)
        return cls(pattern, blocks[pattern.rows, pattern.cols])

    @classmethod
    def from_blocks(cls, rows, cols, blocks, shape) -> BlockSparseMatrix:
        """From block coordinates (concrete, any order, no duplicates) and blocks ``(nnz, bh, bw)``."""
        require_host("BlockSparseMatrix.from_blocks", rows=rows, cols=cols)
        blocks = jnp.asarray(blocks)
        check_floating(blocks.dtype, "blocks")
        rows, cols = np.asarray(rows), np.asarray(cols)
        if blocks.ndim != 3 or blocks.shape[0] != rows.shape[0]:
            raise ValueError(
                f"Expected blocks of shape ({rows.shape[0]}, bh, bw), one per coordinate. Got {blocks.shape}."
            )
        pattern = BlockPattern(tuple(shape), blocks.shape[1:], rows, cols)
        # The pattern sorts coordinates row-major; sort the blocks the same way.
        order = np.lexsort((cols, rows))
        return cls(pattern, blocks[order] if rows.size else blocks)

    # -- properties ---------------------------------------------------------------------------
    shape = property(lambda self: self.pattern.shape)
    block_size = property(lambda self: self.pattern.block_size)
    nnz_blocks = property(lambda self: self.pattern.nnz_blocks)
    density = property(lambda self: self.pattern.density)
    dtype = property(lambda self: self.data.dtype)
    ndim = 2

    def __repr__(self) -> str:
        # Any leaf prints: tree utilities (jax.tree.map, flax's state dicts) rebuild matrices whose data is a shape,
        # None or a placeholder.
        return (
            f"BlockSparseMatrix(shape={self.shape}, block_size={self.block_size}, "
            f"nnz_blocks={self.nnz_blocks}, density={self.density:.4g}, {_leaf_repr('dtype', self.data)})"
        )

    # -- conversions --------------------------------------------------------------------------
    def to_dense(self) -> jax.Array:
        (m, k), (bh, bw) = self.shape, self.block_size
        gm, gk = self.pattern.grid
        out = jnp.zeros((gm, gk, bh, bw), self.dtype)
        out = out.at[self.pattern.rows, self.pattern.cols].set(self.data, unique_indices=True)
        return out.swapaxes(1, 2).reshape(m, k)

    todense = to_dense

    @property
    def T(self) -> BlockSparseMatrix:
        """The transpose; its pattern is computed once per pattern and cached."""
        t, perm = self.pattern.transpose()
        return BlockSparseMatrix._from_fields(pattern=t, data=self.data[perm].swapaxes(1, 2))

    def transpose(self) -> BlockSparseMatrix:
        return self.T

    def astype(self, dtype) -> BlockSparseMatrix:
        check_floating(dtype)
        return self.with_data(self.data.astype(dtype))

    def with_data(self, data) -> BlockSparseMatrix:
        """The same pattern with new block values of shape ``(nnz_blocks, bh, bw)``."""
        return BlockSparseMatrix(self.pattern, data)

    def _sparsify_matmul(self, other, swap: bool):
        # sparsify's interpreter cannot run custom_vjp functions (our products are), so hand it the
        # element-wise BCOO form of the same matrix, whose product it does know.
        b = self.to_bcoo()
        return other @ b if swap else b @ other

    def __neg__(self):
        return self.with_data(-self.data)

    def __mul__(self, scalar):
        if np.ndim(scalar) != 0:
            return NotImplemented
        return self.with_data(self.data * scalar)

    __rmul__ = __mul__

    # -- interop ------------------------------------------------------------------------------
    def to_bcoo(self):
        """As an element-wise ``jax.experimental.sparse.BCOO`` (explicit zeros inside blocks kept)."""
        from jax.experimental import sparse

        bh, bw = self.block_size
        r = self.pattern.rows[:, None, None] * bh + np.arange(bh)[None, :, None]
        c = self.pattern.cols[:, None, None] * bw + np.arange(bw)[None, None, :]
        r, c = np.broadcast_arrays(r, c)
        idx = np.stack([r.reshape(-1), c.reshape(-1)], axis=1)
        return sparse.BCOO((self.data.reshape(-1), jnp.asarray(idx)), shape=self.shape)

    @classmethod
    def from_bcoo(cls, mat, block_size) -> BlockSparseMatrix:
        """From a ``BCOO`` (concrete indices): every block holding a stored entry becomes a block.

        Converted block by block: only the touched blocks are materialised (never the dense matrix),
        and duplicate entries add up, as in ``mat.todense()``.
        """
        require_host("BlockSparseMatrix.from_bcoo", indices=mat.indices)
        bh, bw = check_block_size(mat.shape, block_size)
        idx = np.asarray(mat.indices).astype(np.int64)  # block keys below can exceed int32
        if idx.ndim != 2 or idx.shape[1] != 2 or mat.n_batch or mat.n_dense:
            raise ValueError("Expected a 2-D BCOO with no batch or dense dimensions.")
        data = jnp.asarray(mat.data)
        check_floating(data.dtype, "BCOO data")
        m, k = mat.shape
        gk = k // bw
        valid = (idx[:, 0] >= 0) & (idx[:, 0] < m) & (idx[:, 1] >= 0) & (idx[:, 1] < k)  # BCOO pads out of range
        r, c = idx[valid, 0], idx[valid, 1]
        # One slot per touched block, in row-major order (what BlockPattern stores).
        keys, slot = np.unique((r // bh) * gk + c // bw, return_inverse=True)
        pattern = BlockPattern(mat.shape, (bh, bw), keys // gk if gk else keys, keys % gk if gk else keys)
        flat = (slot * bh + r % bh) * bw + c % bw
        blocks = jnp.zeros(keys.size * bh * bw, data.dtype).at[flat].add(data[np.flatnonzero(valid)])
        return cls(pattern, blocks.reshape(keys.size, bh, bw))

    def to_scipy(self):
        """As a ``scipy.sparse.bsr_array`` (needs scipy). Half types, which scipy lacks, become float32."""
        import scipy.sparse as sp

        p = self.pattern
        data = np.asarray(self.data)
        if data.dtype.itemsize < 4:
            data = data.astype(np.float32)
        return sp.bsr_array(
            (data, p.cols.astype(np.int32), p.indptr.astype(np.int32)),
            shape=self.shape,
            blocksize=self.block_size,
        )

    @classmethod
    def from_scipy(cls, mat, block_size=None) -> BlockSparseMatrix:
        """From any ``scipy.sparse`` array or matrix; ``block_size`` defaults to a BSR's own."""
        import scipy.sparse as sp

        if not sp.issparse(mat):
            raise TypeError(
                f"Expected a scipy.sparse array or matrix. Got {type(mat).__name__}; for a dense array use "
                "BlockSparseMatrix.from_dense(x, block_size)."
            )
        if block_size is None:
            if not (sp.issparse(mat) and mat.format == "bsr"):
                raise ValueError(f"Expected block_size for a scipy {mat.format} matrix; only BSR carries one.")
            block_size = mat.blocksize
        bsr = sp.bsr_array(mat, blocksize=tuple(block_pair(block_size)))
        bsr.sum_duplicates()
        bsr.sort_indices()
        gm = bsr.shape[0] // bsr.blocksize[0]
        rows = np.repeat(np.arange(gm), np.diff(bsr.indptr))
        return cls.from_blocks(rows, bsr.indices, np.asarray(bsr.data), bsr.shape)


def concatenate(matrices, axis: int = 1) -> BlockSparseMatrix:
    """Static block-sparse matrices side by side (``axis=1``: their columns, as ``jnp.concatenate`` would) or
    stacked (``axis=0``): one matrix whose pattern holds every block at its offset.

    Two projections of one input become one product, one launch instead of two: ``x @ concatenate([Wq, Wk,
    Wv])`` is ``concatenate([x @ Wq, x @ Wk, x @ Wv], axis=-1)``. The blocks are reordered once (the pattern is
    row-major); the matrices keep nothing in common with the result.

    Arguments:
        matrices: :class:`BlockSparseMatrix` es of one block size and dtype, with equal rows (``axis=1``) or
            columns (``axis=0``) that are whole multiples of the block.
        axis: 1 (columns) or 0 (rows); -1 and -2 as ``jnp.concatenate`` reads them.

    Example::

        >>> import jax, jax.numpy as jnp, blocksparse as bs
        >>> a = bs.random(jax.random.key(0), (64, 32), 16, 0.5)
        >>> b = bs.random(jax.random.key(1), (64, 48), 16, 0.5)
        >>> ab = bs.concatenate([a, b])
        >>> ab.shape, bool(jnp.array_equal(ab.to_dense(), jnp.concatenate([a.to_dense(), b.to_dense()], 1)))
        ((64, 80), True)
    """
    mats = list(matrices)
    if isinstance(axis, bool) or axis not in (0, 1, -1, -2):
        raise ValueError(f"Expected axis 0 or 1 (or -2, -1, as jnp counts them). Got {axis!r}.")
    axis %= 2
    if not mats:
        raise ValueError("Expected at least one matrix to concatenate. Got none.")
    for i, m in enumerate(mats):
        if not isinstance(m, BlockSparseMatrix):
            raise TypeError(f"Expected static BlockSparseMatrix es. Got {type(m).__name__} at position {i}.")
    first = mats[0]
    keep = 1 - axis
    for i, m in enumerate(mats[1:], 1):
        if m.block_size != first.block_size:
            raise ValueError(f"Expected one block size. Got {first.block_size} and {m.block_size} at position {i}.")
        if m.shape[keep] != first.shape[keep]:
            what = "rows" if axis == 1 else "columns"
            raise ValueError(f"Expected equal {what} ({first.shape[keep]}). Got {m.shape[keep]} at position {i}.")
        if m.dtype != first.dtype:
            raise ValueError(f"Expected one dtype ({first.dtype}). Got {m.dtype} at position {i}.")
    rows, cols, offset = [], [], 0
    for m in mats:
        p = m.pattern
        rows.append(p.rows + (offset if axis == 0 else 0))
        cols.append(p.cols + (offset if axis == 1 else 0))
        offset += p.grid[axis]
    rows, cols = np.concatenate(rows), np.concatenate(cols)
    bh, bw = first.block_size
    shape = (offset * bh, first.shape[1]) if axis == 0 else (first.shape[0], offset * bw)
    pattern = BlockPattern(shape, (bh, bw), rows, cols)
    order = np.lexsort((cols, rows))  # the pattern's row-major order, as BlockPattern sorts
    data = jnp.concatenate([m.data for m in mats], axis=0)
    return BlockSparseMatrix(pattern, data if np.array_equal(order, np.arange(order.size)) else data[order])


def random(
    key, shape, block_size, density: float, dtype=jnp.float32, *, pattern_seed: int | None = None
) -> BlockSparseMatrix:
    """A matrix with a uniformly random block pattern of the given density and normal values.

    The pattern is drawn on the host, so ``key``, ``density`` and ``pattern_seed`` must be concrete
    (call it outside ``jit``). Its seed comes from ``key`` unless ``pattern_seed`` is given. A
    positive density that keeps no block at all (``round(density * blocks) == 0``) raises.
    """
    require_host("bs.random", key=key, density=density, pattern_seed=pattern_seed)
    check_floating(dtype)
    density = check_density(density)
    bh, bw = check_block_size(shape, block_size)
    gm, gk = check_grid(check_shape(shape), (bh, bw))
    check_num_blocks(num_blocks(density, gm * gk))  # before drawing; a positive density keeping 0 blocks raises
    kp, kv = jax.random.split(key)
    seed = pattern_seed if pattern_seed is not None else int(jax.random.randint(kp, (), 0, 2**31 - 1))
    pattern = BlockPattern.random(seed, shape, block_size, density)
    data = jax.random.normal(kv, (pattern.nnz_blocks, *pattern.block_size), dtype)
    return BlockSparseMatrix(pattern, data)


def _capacity(capacity) -> int:
    """``capacity`` as an int in ``[0, MAX_BLOCKS]``; a float is refused, never truncated."""
    if isinstance(capacity, np.ndarray) and capacity.ndim == 0:
        capacity = capacity[()]
    if not isinstance(capacity, int | np.integer) or isinstance(capacity, bool | np.bool_):
        raise TypeError(f"Expected capacity as a non-negative int. Got {capacity!r} of type {type(capacity).__name__}.")
    if capacity < 0:
        raise ValueError(f"Expected capacity >= 0 (the most blocks the matrix can hold). Got capacity={capacity}.")
    return check_num_blocks(int(capacity), "blocks of capacity")


def _nnz(nnz):
    """A concrete ``nnz`` as a Python int (an integer scalar only); a traced one as it is (checked by the class)."""
    if not is_concrete(nnz):
        return nnz
    host = np.asarray(nnz)
    if host.shape != () or not np.issubdtype(host.dtype, np.integer):
        raise TypeError(f"Expected nnz as an integer scalar. Got {nnz!r} (shape {host.shape}, dtype {host.dtype}).")
    if int(host) < 0:
        raise ValueError(f"Expected nnz >= 0. Got nnz={int(host)}.")
    return int(host)


class DynamicBlockSparseMatrix(NoImplicitDense, Pytree):
    """A block-sparse matrix whose pattern is traced: it may change every call without recompiling.

    Only the shape, block size and ``capacity`` (the maximum number of blocks) are static.
    Positions ``>= nnz`` are padding and are ignored; duplicate ``(row, col)`` blocks add up.

    Out-of-range block coordinates (at positions ``< nnz``) cannot be rejected while tracing.
    :meth:`is_valid` returns a traced flag; every op returns NaN everywhere in its output (and NaN
    gradients) rather than a silently wrong value, and under :func:`blocksparse.checkify` also
    reports them through ``jax.experimental.checkify`` with the valid ranges.
    """

    __slots__ = ("rows", "cols", "data", "nnz", "shape", "block_size")
    __array_priority__ = 100
    _leaves = ("rows", "cols", "data", "nnz")
    _static = ("shape", "block_size")

    def __init__(self, rows, cols, data, nnz, shape, block_size=None):
        data = jnp.asarray(data)
        check_floating(data.dtype)
        if data.ndim != 3:
            raise ValueError(f"Expected data of shape (capacity, bh, bw). Got {data.shape}.")
        block_size = data.shape[1:] if block_size is None else block_pair(block_size)
        if tuple(data.shape[1:]) != tuple(block_size):
            raise ValueError(f"Expected blocks of shape {tuple(block_size)}. Got {data.shape[1:]}.")
        self.shape = check_shape(shape)
        self.block_size = check_block_size(self.shape, block_size)
        cap = check_num_blocks(data.shape[0], "blocks of capacity")
        coords = []
        for name, idx in (("rows", rows), ("cols", cols)):
            if np.shape(idx) != (cap,):
                raise ValueError(f"Expected {name} of shape ({cap},) to match data. Got {np.shape(idx)}.")
            coords.append(_coords(name, idx))
        if is_concrete(nnz):
            host = np.asarray(nnz)
            if host.shape != () or not np.issubdtype(host.dtype, np.integer):
                raise TypeError(f"Expected nnz as an integer scalar. Got shape {host.shape}, dtype {host.dtype}.")
            if not 0 <= int(host) <= cap:
                raise ValueError(f"Expected nnz in [0, capacity={cap}]. Got nnz={int(host)}.")
            nnz = jnp.asarray(host.astype(np.int32))
        else:
            if nnz.shape != () or not jnp.issubdtype(nnz.dtype, jnp.integer):
                raise TypeError(f"Expected nnz as an integer scalar. Got shape {nnz.shape}, dtype {nnz.dtype}.")
            # Outside [0, capacity] is invalid; -1 keeps it so after the cast (is_valid() is False).
            nnz = jnp.where((nnz < 0) | (nnz > cap), -1, nnz).astype(jnp.int32)
        self.rows, self.cols = coords
        self.data, self.nnz = data, nnz

    @classmethod
    def from_blocks(cls, rows, cols, blocks, nnz=None, *, shape, capacity=None) -> DynamicBlockSparseMatrix:
        """From block coordinates and blocks ``(L, bh, bw)``, padded to ``capacity`` (default ``L``).

        ``nnz`` defaults to ``L``. Usable inside ``jit``: everything but ``shape`` and ``capacity``
        may be traced.
        """
        blocks = jnp.asarray(blocks)
        check_floating(blocks.dtype, "blocks")
        if blocks.ndim != 3:
            raise ValueError(f"Expected blocks of shape (L, bh, bw). Got {blocks.shape}.")
        check_shape(shape)  # before any padding is allocated
        n = blocks.shape[0]
        capacity = n if capacity is None else _capacity(capacity)
        if n > capacity:
            raise ValueError(f"Expected at most capacity={capacity} blocks. Got {n}.")
        nnz = n if nnz is None else _nnz(nnz)
        if is_concrete(nnz) and int(nnz) > capacity:
            raise ValueError(f"Expected nnz <= capacity={capacity}. Got nnz={int(nnz)}; raise the capacity.")
        if is_concrete(nnz) and int(nnz) > n:
            raise ValueError(f"Expected nnz <= the number of blocks given ({n}). Got nnz={int(nnz)}.")
        pad = capacity - n
        rows = jnp.pad(_coords("rows", rows), (0, pad))
        cols = jnp.pad(_coords("cols", cols), (0, pad))
        blocks = jnp.pad(blocks, ((0, pad), (0, 0), (0, 0)))
        return cls(rows, cols, blocks, nnz, shape)

    @classmethod
    def from_static(cls, mat: BlockSparseMatrix, capacity: int | None = None) -> DynamicBlockSparseMatrix:
        p = mat.pattern
        return cls.from_blocks(p.rows, p.cols, mat.data, shape=mat.shape, capacity=capacity)

    capacity = property(lambda self: self.data.shape[-3])
    dtype = property(lambda self: self.data.dtype)
    ndim = 2

    @property
    def grid(self) -> tuple[int, int]:
        return self.shape[0] // self.block_size[0], self.shape[1] // self.block_size[1]

    def __repr__(self) -> str:
        data = self.data
        cap = data.shape[-3] if hasattr(data, "shape") and len(getattr(data, "shape", ())) >= 3 else "?"
        return (
            f"DynamicBlockSparseMatrix(shape={self.shape}, block_size={self.block_size}, "
            f"capacity={cap}, {_leaf_repr('dtype', data)})"
        )

    def active(self) -> jax.Array:
        """``bool[capacity]``: which positions hold real blocks (``< nnz``)."""
        return jnp.arange(self.capacity) < self.nnz

    def is_valid(self) -> jax.Array:
        """Traced ``bool``: every active block has coordinates inside the grid."""
        gm, gk = self.grid
        ok = (self.rows >= 0) & (self.rows < gm) & (self.cols >= 0) & (self.cols < gk)
        return jnp.all(ok | ~self.active()) & (self.nnz >= 0) & (self.nnz <= self.capacity)

    def check(self) -> jax.Array:
        """Report invalid coordinates through checkify (a no-op unless functionalized); return ``is_valid()``."""
        valid = self.is_valid()
        gm, gk = self.grid
        checkify.debug_check(
            valid,
            f"DynamicBlockSparseMatrix: expected active block rows in [0, {gm}) and cols in [0, {gk}), "
            f"and nnz in [0, {self.capacity}]; some are out of range.",
        )
        return valid

    def validity(self) -> jax.Array:
        """What the ops use: :meth:`check` inside :func:`blocksparse.runtime_checks` (or
        :func:`blocksparse.checkify`), else :meth:`is_valid` (no checkify effect, which would slow
        every jitted call's dispatch)."""
        return self.check() if runtime_checks_enabled() else self.is_valid()

    def masked_data(self) -> jax.Array:
        """``data`` with padding positions zeroed."""
        return jnp.where(self.active()[:, None, None], self.data, jnp.zeros((), self.dtype))

    def to_dense(self) -> jax.Array:
        (m, k), (bh, bw) = self.shape, self.block_size
        gm, gk = self.grid
        valid = self.validity()
        # Padding and invalid positions are routed out of range and dropped by the scatter.
        keep = self.active()
        r = jnp.where(keep, self.rows, gm)
        # Duplicates add up: accumulate half types in float32, like the products do.
        acc = jnp.promote_types(self.dtype, jnp.float32)
        out = jnp.zeros((gm, gk, bh, bw), acc).at[r, self.cols].add(self.data.astype(acc), mode="drop")
        out = out.swapaxes(1, 2).reshape(m, k).astype(self.dtype)
        return jnp.where(valid, out, jnp.nan)

    todense = to_dense

    @property
    def T(self) -> DynamicBlockSparseMatrix:
        return self._replace(
            shape=self.shape[::-1],
            block_size=self.block_size[::-1],
            rows=self.cols,
            cols=self.rows,
            data=self.data.swapaxes(-1, -2),
        )

    def astype(self, dtype) -> DynamicBlockSparseMatrix:
        check_floating(dtype)
        return self.with_data(self.data.astype(dtype))

    def with_data(self, data) -> DynamicBlockSparseMatrix:
        return DynamicBlockSparseMatrix(self.rows, self.cols, data, self.nnz, self.shape, self.block_size)

    def _sparsify_matmul(self, other, swap: bool):
        raise NotImplementedError(
            "jax.experimental.sparse.sparsify cannot trace products with a DynamicBlockSparseMatrix (they are "
            "custom_vjp functions, which sparsify does not run). Call bs.matmul outside the sparsified function."
        )
