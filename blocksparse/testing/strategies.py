"""Hypothesis strategies for block-sparse matrices, shipped for users' own property tests.

Example::

    from hypothesis import given, strategies as st
    from blocksparse.testing import strategies as bst

    @given(bst.block_sparse_matrices(dtype=bst.dtypes()), st.data())
    def test_matmul(W, data):
        x = data.draw(bst.dense_arrays((W.shape[1], 3), W.dtype))
        ...

Values are drawn from a NumPy generator seeded by hypothesis (fast and still shrinkable through
the seed); the *structure* (shape, block size, pattern kind, density, dtype) is drawn directly
so that hypothesis explores and shrinks it.

Graphs for the GNN ops: :func:`graphs` (a :class:`blocksparse.gnn.Graph` with an isolated node, a
self-loop, a multi-edge and a high in-degree hub) and :func:`edge_lists`, from :mod:`.graphs`.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st

from .._matrix import BlockSparseMatrix, DynamicBlockSparseMatrix
from .._pattern import MAX_BLOCK_ROWS, MAX_BLOCKS, MAX_DIM, BlockPattern
from .graphs import edge_lists, graphs

__all__ = [
    "PATTERN_KINDS",
    "block_patterns",
    "block_sizes",
    "block_sparse_matrices",
    "dense_arrays",
    "dtypes",
    "dynamic_block_sparse_matrices",
    "edge_lists",
    "graphs",
    "huge_shapes",
    "invalid_block_sizes",
    "invalid_capacities",
    "invalid_node_counts",
    "non_integer_shapes",
]

#: Pattern families: uniform random at a drawn density (0 and 1 included), and adversarial ones.
PATTERN_KINDS = ("random", "empty", "full", "full_row", "full_col", "empty_rows", "single", "diagonal")

FLOAT_DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)


def block_sizes(sizes=(1, 2, 4, 8, 16), rectangular: bool = True) -> st.SearchStrategy[tuple[int, int]]:
    """Block sizes ``(bh, bw)`` from ``sizes``; rectangular ones too unless ``rectangular=False``."""
    s = st.sampled_from(tuple(sizes))
    return st.tuples(s, s) if rectangular else s.map(lambda b: (b, b))


def invalid_block_sizes() -> st.SearchStrategy:
    """Values that must be refused as a ``block_size``: non-integers, bools, strings, ``None``, the
    wrong number of entries and non-positive sizes (alone or inside an otherwise valid pair)."""
    bad_scalar = st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.booleans(),
        st.sampled_from([None, "4", "abc", b"4", np.float32(2.0), np.bool_(True), 2 + 0j]),
        st.integers(max_value=0),
    )
    good = st.integers(1, 8)
    return st.one_of(
        bad_scalar,
        st.tuples(bad_scalar, good),
        st.tuples(good, bad_scalar),
        st.lists(good, max_size=5).filter(lambda v: len(v) != 2),
    )


def huge_shapes(block_size: int = 16, grid: bool = True) -> st.SearchStrategy[tuple[int, int]]:
    """Integer shapes that must be refused before anything of their size is allocated: a side past
    :data:`~blocksparse._pattern.MAX_DIM` (int32 indexing), or, with ``grid`` (static patterns, whose host row
    index grows with the grid), more block rows or columns of ``block_size`` than
    :data:`~blocksparse._pattern.MAX_BLOCK_ROWS`. Multiples of ``block_size``, so the block size is never the
    reason."""
    past_dim = st.integers(MAX_DIM // block_size + 1, 2**44).map(lambda g: g * block_size)
    past_grid = st.integers(MAX_BLOCK_ROWS + 1, MAX_DIM // block_size).map(lambda g: g * block_size)
    side = st.integers(1, 64).map(lambda g: g * block_size)
    big = st.one_of(past_dim, past_grid) if grid else past_dim
    return st.one_of(st.tuples(big, side), st.tuples(side, big), st.tuples(big, big))


def non_integer_shapes() -> st.SearchStrategy:
    """Shapes with a non-integer side (floats, even integral ones, bools, strings, ``None``): refused with a
    ``TypeError``, never truncated."""
    bad = st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.booleans(),
        st.sampled_from([None, "64", np.float32(64.0), np.float64(32.0), 64 + 0j]),
    )
    good = st.integers(1, 8).map(lambda g: 16 * g)
    return st.one_of(st.tuples(bad, good), st.tuples(good, bad), st.tuples(bad, bad))


def invalid_capacities() -> st.SearchStrategy:
    """Capacities of a dynamic matrix that must be refused: negative, non-integer (2.5 and 2.0 alike), bool,
    or past :data:`~blocksparse._pattern.MAX_BLOCKS`."""
    return st.one_of(
        st.integers(max_value=-1),
        st.floats(allow_nan=True, allow_infinity=True),
        st.booleans(),
        st.sampled_from(["4", np.float32(4.0)]),
        st.integers(MAX_BLOCKS + 1, 2**62),
    )


def invalid_node_counts() -> st.SearchStrategy:
    """Node counts of a graph that must be refused: negative, past int32 node ids (``>= 2**31 - 1``), or not an
    int (floats, integral ones too, bools, strings, ``None``)."""
    return st.one_of(
        st.integers(max_value=-1),
        st.integers(2**31 - 1, 2**62),
        st.floats(allow_nan=True, allow_infinity=True),
        st.booleans(),
        st.sampled_from(["4", None, np.float32(4.0)]),
    )


def dtypes(choices=FLOAT_DTYPES) -> st.SearchStrategy:
    return st.sampled_from(tuple(jnp.dtype(d) for d in choices))


def _mask(kind: str, gm: int, gk: int, density: float, rng: np.random.Generator) -> np.ndarray:
    mask = np.zeros((gm, gk), bool)
    if kind == "random":
        mask = rng.random((gm, gk)) < density
    elif kind == "full":
        mask[:] = True
    elif kind == "full_row":  # one full row among sparse ones: the worst case for load balance
        mask = rng.random((gm, gk)) < density / 4
        mask[rng.integers(gm)] = True
    elif kind == "full_col":
        mask = rng.random((gm, gk)) < density / 4
        mask[:, rng.integers(gk)] = True
    elif kind == "empty_rows":  # about half the block rows empty
        mask = rng.random((gm, gk)) < max(density, 0.5)
        mask[rng.random(gm) < 0.5] = False
    elif kind == "single":
        mask[rng.integers(gm), rng.integers(gk)] = True
    elif kind == "diagonal":
        idx = np.arange(min(gm, gk))
        mask[idx, idx] = True
    elif kind != "empty":
        raise ValueError(f"Expected a pattern kind in {PATTERN_KINDS}. Got {kind!r}.")
    return mask


@st.composite
def block_patterns(
    draw,
    block_size=None,
    max_blocks: int = 6,
    kinds=PATTERN_KINDS,
    shape=None,
) -> BlockPattern:
    """A :class:`BlockPattern` with up to ``max_blocks`` block rows and columns.

    ``block_size`` is a strategy or a fixed pair (default :func:`block_sizes`); ``shape`` fixes the
    dense shape (it must be divisible by the block size).
    """
    if block_size is None:
        block_size = block_sizes()
    bh, bw = draw(block_size) if isinstance(block_size, st.SearchStrategy) else tuple(block_size)
    if shape is None:
        gm = draw(st.integers(1, max_blocks))
        gk = draw(st.integers(1, max_blocks))
    else:
        gm, gk = shape[0] // bh, shape[1] // bw
    kind = draw(st.sampled_from(tuple(kinds)))
    density = draw(st.sampled_from((0.0, 0.1, 0.25, 0.5, 0.75, 1.0)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return BlockPattern.from_mask(_mask(kind, gm, gk, density, rng), (bh, bw))


def _values(rng: np.random.Generator, shape, dtype) -> np.ndarray:
    # Normal values rounded to the target dtype, so that oracles see exactly what the op sees.
    return np.array(jnp.asarray(rng.standard_normal(shape), dtype))


@st.composite
def block_sparse_matrices(draw, dtype=None, patterns=None, **pattern_kwargs) -> BlockSparseMatrix:
    """A :class:`BlockSparseMatrix` with standard-normal block values.

    ``dtype``: a dtype or a strategy (default float32); ``patterns``: a strategy of patterns
    (default :func:`block_patterns` with ``pattern_kwargs``).
    """
    pattern = draw(patterns if patterns is not None else block_patterns(**pattern_kwargs))
    dt = draw(dtype) if isinstance(dtype, st.SearchStrategy) else jnp.dtype(dtype or jnp.float32)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return BlockSparseMatrix(pattern, _values(rng, (pattern.nnz_blocks, *pattern.block_size), dt))


@st.composite
def dynamic_block_sparse_matrices(
    draw, dtype=None, block_size=None, max_blocks: int = 6, max_capacity: int = 24, shape=None
) -> DynamicBlockSparseMatrix:
    """A :class:`DynamicBlockSparseMatrix` with duplicates, padding beyond ``nnz`` and arbitrary order.

    Padding positions hold garbage (large values, coordinates anywhere in the grid) so that
    anything that does not ignore them fails loudly.
    """
    if block_size is None:
        block_size = block_sizes()
    bh, bw = draw(block_size) if isinstance(block_size, st.SearchStrategy) else tuple(block_size)
    if shape is None:
        gm, gk = draw(st.integers(1, max_blocks)), draw(st.integers(1, max_blocks))
    else:
        gm, gk = shape[0] // bh, shape[1] // bw
    dt = draw(dtype) if isinstance(dtype, st.SearchStrategy) else jnp.dtype(dtype or jnp.float32)
    capacity = draw(st.integers(0, max_capacity))
    nnz = draw(st.integers(0, capacity))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    style = draw(st.sampled_from(("uniform", "duplicates", "one_row")))
    rows = rng.integers(0, gm, capacity)
    cols = rng.integers(0, gk, capacity)
    if style == "duplicates" and capacity:
        rows[:] = rows[0]
        cols[: capacity // 2] = cols[0]
    elif style == "one_row":
        rows[:] = rng.integers(gm)
    data = _values(rng, (capacity, bh, bw), dt)
    data[nnz:] = 1e4  # garbage in padding
    return DynamicBlockSparseMatrix.from_blocks(
        rows, cols, data, np.int32(nnz), shape=(gm * bh, gk * bw), capacity=capacity
    )


@st.composite
def dense_arrays(draw, shape, dtype=jnp.float32) -> np.ndarray:
    """A standard-normal NumPy array of ``shape``, rounded to ``dtype``."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return _values(rng, shape, dtype)
