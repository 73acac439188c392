"""The static partition search: partition the non-zero blocks of ``W`` over IPU tiles for ``Y = W X``.

The partition follows PopSparse's static sparse matmul (Li et al. 2023, arXiv:2303.16999, and
its implementation, poplibs ``popsparse/StaticMatMulPartitioner``):

* ``n`` (the columns of ``X``) is split into ``n_split`` pieces of whole vector grains; each piece
  gets its own ``tiles_per_split`` tiles (an equal share of the tiles, in grains of ``tile_grain``
  tiles) and the same block assignment;
* the block columns of ``W`` are cut into ``num_bands`` bands holding about equal numbers of
  non-zero blocks; tiles are given to bands in proportion to their non-zero blocks, in grains;
* within a band, consecutive tiles take contiguous, equal chunks of the band's blocks in row
  order, so a long row can span tiles; its partial sums are reduced afterwards.

Every candidate ``(n_split, num_bands)`` is scored exactly on the given pattern with the phase
model of :mod:`.cost`; the cheapest one whose busiest tile fits ``available_memory_proportion``
of tile memory wins; when none does, :class:`~.plan.NoValidPlanError` says what would fit
(checked by planning again). Everything here is host-side NumPy, vectorised over blocks (no per-block
Python loops), and plans are cached on the pattern's fingerprint and the options.
"""

from __future__ import annotations

import functools

import numpy as np

from .._pattern import BlockPattern
from .._util import cdiv
from . import cost as _cost
from ._checks import advice, check_common, check_int
from .machines import BOW, IPUMachine
from .plan import NoValidPlanError, Plan

__all__ = ["cache_info", "clear_cache", "column_bands", "plan", "tiles_for_bands"]

N_SPLIT_CANDIDATES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
BAND_CANDIDATES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
_CACHE_SIZE = 64


# --------------------------------------------------------------------------------------------------
# Pieces of the partition (pure NumPy, vectorised over blocks)
# --------------------------------------------------------------------------------------------------
def column_bands(cols: np.ndarray, grid_k: int, num_bands: int) -> np.ndarray:
    """Boundaries ``int[bands + 1]`` (block columns) of at most ``num_bands`` bands of about equal non-zeros."""
    return _bounds(np.bincount(cols, minlength=grid_k) if cols.size else np.zeros(grid_k, np.int64), num_bands)


def _bounds(col_counts: np.ndarray, num_bands: int) -> np.ndarray:
    grid_k = col_counts.size
    cum = np.cumsum(col_counts)
    total = int(cum[-1]) if grid_k else 0
    if total == 0 or num_bands <= 1:
        return np.array([0, grid_k], np.int64)
    targets = cdiv(total * np.arange(1, num_bands, dtype=np.int64), num_bands)
    cuts = np.searchsorted(cum, targets, side="left") + 1
    return np.unique(np.concatenate([[0], np.minimum(cuts, grid_k), [grid_k]]))


def tiles_for_bands(nnz_per_band: np.ndarray, tiles: int, grain: int = 1) -> np.ndarray | None:
    """Tiles per band in proportion to its non-zero blocks (at least one grain per non-empty band).

    Tiles are handed out in grains of ``grain`` consecutive tiles (poplibs allocates them in grains of
    the tiles sharing an exchange bus, two on the GC200). Returns ``None`` when there are more
    non-empty bands than grains. A band never gets more tiles than it has blocks.
    """
    if grain > 1:
        units = tiles_for_bands(nnz_per_band, tiles // grain)
        return None if units is None else np.minimum(units * grain, np.asarray(nnz_per_band, np.int64))
    nnz = np.asarray(nnz_per_band, np.int64)
    total = int(nnz.sum())
    out = np.zeros(nnz.shape, np.int64)
    if total == 0:
        return out
    nonempty = nnz > 0
    if int(nonempty.sum()) > tiles:
        return None
    raw = nnz * tiles / total
    out = np.where(nonempty, np.maximum(np.floor(raw).astype(np.int64), 1), 0)
    over = int(out.sum()) - tiles
    if over > 0:  # the minimum of one tile per band overshot: take back from the largest allocations
        order = np.argsort(-(out - raw), kind="stable")  # most over-allocated first
        take = np.zeros_like(out)
        cand = order[out[order] > 1][:over]
        take[cand] = 1
        out -= take
        over -= int(take.sum())
        while over > 0:  # fewer bands above one tile than tiles to take back: again from the most over-allocated
            out[int(np.argmax(np.where(out > 1, out - raw, -np.inf)))] -= 1
            over -= 1
    left = tiles - int(out.sum())
    if left > 0:  # largest remainders first
        order = np.argsort(-(raw - out), kind="stable")
        give = np.zeros_like(out)
        give[order[nonempty[order]][:left]] = 1
        out += give
    return np.minimum(out, nnz)


class _Bands:
    """Column bands of a pattern: counts at once (what screening reads), the band-major order of the blocks on
    first use (what exact scoring and the plan read): a stable sort of every block, skipped for the candidates
    a screen or a bound rejects."""

    def __init__(self, pattern: BlockPattern, boundaries: np.ndarray, nnz: np.ndarray, nonempty_rows: np.ndarray,
                 nonempty_cols: np.ndarray):  # fmt: skip
        self.pattern = pattern
        self.boundaries = boundaries  # int[B + 1]
        self.nnz = nnz  # int[B] blocks per band
        self.nonempty_rows = nonempty_rows  # int[B] block rows with a block in the band
        self.nonempty_cols = nonempty_cols  # int[B] block columns with a block in the band

    @functools.cached_property
    def of_block(self) -> np.ndarray | None:
        """Band of each block in pattern order (None: one band)."""
        nb = self.nnz.size
        if nb == 1:
            return None
        lut = _small_int(np.repeat(np.arange(nb), np.diff(self.boundaries)), nb)  # band of each block column
        return lut[self.pattern.cols]

    @functools.cached_property
    def order(self) -> np.ndarray:
        """Permutation of blocks: band-major, row-major within a band."""
        if self.of_block is None:
            return np.arange(self.pattern.nnz_blocks)  # one band: the pattern's own row-major order
        return np.argsort(self.of_block, kind="stable")  # pattern order is row-major: stays so

    @functools.cached_property
    def starts(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.nnz)[:-1]])

    @functools.cached_property
    def band(self) -> np.ndarray:
        """Band of each block, in :attr:`order`."""
        return np.repeat(np.arange(self.nnz.size), self.nnz)

    @functools.cached_property
    def pos(self) -> np.ndarray:
        """Position of each block within its band, in :attr:`order`."""
        return np.arange(self.pattern.nnz_blocks) - np.repeat(self.starts, self.nnz)

    @functools.cached_property
    def row_changes(self) -> np.ndarray:
        """``int[nnz + 1]``: at ``x``, how many of the first ``x`` blocks in :attr:`order` start a (row, band) run
        (their row or band differs from the previous block's). Runs are contiguous: band order is row-major."""
        rows = self.pattern.rows[self.order]
        change = np.ones(rows.size, bool)
        change[1:] = rows[1:] != rows[:-1]
        change[self.starts[self.nnz > 0]] = True
        return np.concatenate([[0], np.cumsum(change)])

    @functools.cached_property
    def runs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """The (row, band) runs: first and last position in :attr:`order`, whether the run is its row's only one,
        and how many rows have several runs (they lie in several bands)."""
        change = np.diff(self.row_changes).astype(bool)
        first = np.flatnonzero(change)
        last = np.append(first[1:], change.size) - 1
        per_row = np.bincount(self.pattern.rows[self.order[first]], minlength=self.pattern.grid[0])
        single = per_row[self.pattern.rows[self.order[first]]] == 1
        return first, last, single, int(np.count_nonzero(per_row > 1))

    def by_col(self, col_major: np.ndarray) -> np.ndarray:
        """Positions in :attr:`order` of the blocks in column-major order (``col_major``, rows ascending in a
        column): within a column, ascending (a column lies in one band, whose order is row-major)."""
        if "_by_col" not in self.__dict__:
            at = np.empty(self.pattern.nnz_blocks, np.int32)  # position in order of each block
            at[self.order] = np.arange(at.size, dtype=np.int32)
            self._by_col = at[col_major]
        return self._by_col

    def first_blocks(self, j: int, count: int) -> np.ndarray:
        """The first ``count`` blocks of band ``j`` in :attr:`order` (pattern positions), without sorting."""
        if "order" in self.__dict__ or self.nnz.size == 1:
            start = int(self.starts[j])
            return self.order[start : start + count]
        # They lie in a prefix of the pattern (row-major): scan about twice the prefix expected if the band's
        # blocks were spread evenly, and grow it until enough are found (the whole pattern at worst).
        cols, total = self.pattern.cols, self.pattern.nnz_blocks
        lo, hi = int(self.boundaries[j]), int(self.boundaries[j + 1])
        length = min(total, 2 * count * total // max(int(self.nnz[j]), 1) + 1024)
        while True:
            head = cols[:length]
            hits = np.flatnonzero((head >= lo) & (head < hi))
            if hits.size >= count or length == total:
                return hits[:count]
            length = min(total, 4 * length)


def _tiles_per_split(machine: IPUMachine, n_split: int) -> int:
    """Tiles of one piece of ``n``: the machine's tiles in whole grains, shared evenly by the pieces."""
    g = _grain(machine)
    return (machine.num_tiles // g // n_split) * g


def _grain(machine: IPUMachine) -> int:
    """Tiles per allocation grain (one when the machine has fewer tiles than a grain, as in poplibs)."""
    return machine.tile_grain if machine.num_tiles >= machine.tile_grain else 1


def _small_int(a: np.ndarray, limit: int) -> np.ndarray:
    # NumPy's stable sort is a radix sort for 16-bit integers: linear time for band and column ids.
    return a.astype(np.int16) if limit < np.iinfo(np.int16).max else a


#: Above this many cells the (prev, e) histogram of :func:`_nonempty_rows` is skipped: each split is counted alone.
_HIST_CELLS = 1 << 22


def _nonempty_rows(pattern: BlockPattern, all_bounds: list[np.ndarray]) -> list[np.ndarray]:
    """Block rows with a block in each band, for several splits into bands at once, in one pass over the blocks.

    Together the splits' boundaries cut the block columns into ``E`` elementary intervals. Take the distinct
    (row, interval) pairs of the blocks, in row-major order, each with ``prev``, the row's previous interval
    (-1 for its first). A row has a block in the band of intervals ``[a, b)`` iff its first pair at or after
    ``a`` comes before ``b``: iff it has a pair with ``prev < a <= e < b``. So a 2-D histogram of
    ``(prev, e)`` over the pairs, summed into prefix sums, counts every band of every split in O(1).
    """
    if pattern.nnz_blocks == 0:
        return [np.zeros(b.size - 1, np.int64) for b in all_bounds]
    rows = pattern.rows
    first_of_row = np.ones(rows.size, bool)
    first_of_row[1:] = rows[1:] != rows[:-1]

    def pairs(cuts):
        """The interval (between ``cuts``) of each distinct (row, interval) pair, and whether it is its row's first."""
        E = cuts.size - 1
        e = _small_int(np.repeat(np.arange(E), np.diff(cuts)), E)[pattern.cols]
        new = first_of_row.copy()
        new[1:] |= e[1:] != e[:-1]
        return e[new].astype(np.int64), first_of_row[new]

    cuts = np.unique(np.concatenate(all_bounds))  # includes 0 and grid_k
    E = cuts.size - 1
    if (E + 1) * E > _HIST_CELLS:  # too many intervals for the histogram: one pass per split
        return [np.bincount(pairs(b)[0], minlength=b.size - 1) for b in all_bounds]
    pe, pfirst = pairs(cuts)
    prev = np.empty_like(pe)
    prev[0] = -1
    prev[1:] = pe[:-1]
    prev[pfirst] = -1
    hist = np.bincount((prev + 1) * E + pe, minlength=(E + 1) * E).reshape(E + 1, E)
    S = np.zeros((E + 2, E + 1), np.int64)  # S[p, q]: pairs with prev + 1 < p and e < q
    S[1:, 1:] = hist.cumsum(axis=0).cumsum(axis=1)
    out = []
    for bounds in all_bounds:
        a = np.searchsorted(cuts, bounds[:-1])  # the bands' first intervals
        b = np.searchsorted(cuts, bounds[1:])
        out.append(S[a + 1, b] - S[a + 1, a])
    return out


def _bands(pattern: BlockPattern, bounds: np.ndarray, col_counts: np.ndarray, nonempty_rows: np.ndarray) -> _Bands:
    """The :class:`_Bands` of the block columns split at ``bounds`` (:func:`_bounds`)."""
    nb = bounds.size - 1
    nnz = np.add.reduceat(col_counts, bounds[:-1]) if col_counts.size else np.zeros(nb, np.int64)
    cum = np.concatenate([[0], np.cumsum(col_counts > 0)])
    nonempty_cols = cum[bounds[1:]] - cum[bounds[:-1]]
    return _Bands(pattern, bounds, nnz, nonempty_rows, nonempty_cols)


def _tile_of_block(bands: _Bands, tiles_per_band: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Tile (within one piece of ``n``) of each block in band order, blocks per tile chunk, tiles used per band."""
    nnz = bands.nnz
    chunk = np.where(tiles_per_band > 0, cdiv(nnz, np.maximum(tiles_per_band, 1)), 1)
    used = np.where(nnz > 0, cdiv(nnz, chunk), 0)
    # Consecutive tiles take `chunk` blocks of their band each, the band's last tile the rest.
    per_tile = np.repeat(chunk, used)
    last = np.cumsum(used)[used > 0] - 1
    per_tile[last] = nnz[used > 0] - (used[used > 0] - 1) * chunk[used > 0]
    tile = np.repeat(np.arange(per_tile.size, dtype=np.int32), per_tile)
    return tile, chunk, used


def _stats(
    pattern: BlockPattern, bands: _Bands, tile: np.ndarray, tiles: int, col_major: np.ndarray, col_starts: np.ndarray
) -> _cost.TileStats:
    """Exact per-tile statistics of one assignment. A tile holds a contiguous range of band order, so rows and
    the partials are counted per tile and per run from prefix sums prepared once per split into bands; only the
    distinct columns take a pass over the blocks."""
    if tile.size == 0:
        z = np.zeros(tiles, np.int64)
        return _cost.TileStats(z, z, z, 0, 0)
    edges = np.searchsorted(tile, np.arange(tiles + 1, dtype=tile.dtype))  # tile t holds edges[t]:edges[t + 1]
    start, stop = edges[:-1], edges[1:]
    blocks = stop - start
    busy = blocks > 0
    # Distinct rows: the tile's first block, then each block starting a run (runs do not cross bands).
    rc = bands.row_changes
    rows_per_tile = np.where(busy, 1 + rc[stop] - rc[np.minimum(start + 1, stop)], 0)
    # Rows held by several tiles: those in several bands, and those whose only run a tile boundary splits. Over
    # them, the holders add up to all (row, tile) pairs less one per row held once.
    first, last, single, multi_band = bands.runs
    multi_rows = multi_band + int(np.count_nonzero(single & (tile[first] != tile[last])))
    rows_nonempty = int(np.count_nonzero(np.diff(pattern.indptr)))
    multi_partial_rows = int(rows_per_tile.sum()) - (rows_nonempty - multi_rows)
    # Distinct columns: in column-major order a column's tiles are non-decreasing (its band's tiles take its
    # blocks in row order), so (tile, column) pairs are runs.
    tc = tile[bands.by_col(col_major)]
    new_col = col_starts.copy()  # a column's first block starts a pair
    new_col[1:] |= tc[1:] != tc[:-1]
    cols_per_tile = np.bincount(tc[new_col], minlength=tiles)
    span = np.zeros(tiles, np.int64)
    span[busy] = bands.nonempty_cols[bands.band[start[busy]]]
    return _cost.TileStats(blocks, rows_per_tile, cols_per_tile, multi_partial_rows, multi_rows, span)


def _estimate_stats(bands: _Bands, tiles_per_band: np.ndarray, rows_nonempty: int) -> _cost.TileStats:
    """Screening estimate of the busiest tile of each band, assuming blocks spread uniformly within a band."""
    nnz = bands.nnz.astype(np.float64)
    t = np.maximum(tiles_per_band, 1)
    chunk = np.ceil(nnz / t)
    used = np.where(nnz > 0, np.ceil(nnz / np.maximum(chunk, 1)), 0)
    per_row = nnz / np.maximum(bands.nonempty_rows, 1)
    rows = np.minimum(chunk, np.ceil(chunk / np.maximum(per_row, 1e-9)) + 1)
    C = np.maximum(bands.nonempty_cols, 1).astype(np.float64)
    cols = np.minimum(chunk, np.ceil(C * -np.expm1(chunk * np.log1p(-1.0 / np.maximum(C, 1.0 + 1e-9)))))
    cols = np.where(C <= 1, np.minimum(chunk, 1), cols)
    pairs = float((used * rows).sum())
    extra = max(pairs - rows_nonempty, 0.0)
    multi_rows = min(float(rows_nonempty), extra)
    span = np.where(nnz > 0, bands.nonempty_cols, 0)
    return _cost.TileStats(chunk, rows, cols, int(extra + multi_rows), int(multi_rows), span)


# --------------------------------------------------------------------------------------------------
# Search
# --------------------------------------------------------------------------------------------------
def _as_pattern(W) -> BlockPattern:
    if isinstance(W, BlockPattern):
        return W
    pattern = getattr(W, "pattern", None)
    if isinstance(pattern, BlockPattern):
        return pattern
    raise TypeError(
        f"Expected a BlockSparseMatrix or a BlockPattern (a static pattern known on the host). Got {type(W).__name__}."
    )


def plan(
    W,
    n: int,
    machine: IPUMachine = BOW,
    dtype=np.float16,
    available_memory_proportion: float = 0.6,
    *,
    partials_dtype=np.float32,
    n_split: int | None = None,
    num_bands: int | None = None,
) -> Plan:
    """Plan ``W @ X`` (``W`` block-sparse ``m x k``, ``X`` dense ``k x n``) on an IPU.

    Arguments:
        W: a :class:`~blocksparse.BlockSparseMatrix` or its :class:`~blocksparse.BlockPattern`.
        n: columns of ``X``.
        machine: an :class:`IPUMachine` (``bs.ipu.BOW``, ``bs.ipu.MK2``).
        dtype: operand dtype, ``float16`` or ``float32``.
        available_memory_proportion: fraction of each tile's memory the plan may use, in ``(0, 1]``.
        partials_dtype: accumulation dtype (``float32`` by default; ``float16`` halves partial traffic).
        n_split, num_bands: fix these instead of searching them.

    Returns:
        The cheapest :class:`Plan` that fits; cached on (pattern fingerprint, ``n``, machine, dtypes,
        options), so planning the same pattern again is free.

    Raises:
        NoValidPlanError: when no partition fits the memory limit (the message says what to change).

    Example::

        >>> import blocksparse as bs
        >>> W = bs.BlockPattern.random(0, (1024, 1024), 16, 1 / 16)
        >>> p = bs.plan(W, 512)
        >>> p.pattern.nnz_blocks == int((p.tile_blocks >= 0).sum())
        True
    """
    pattern = _as_pattern(W)
    n, dt, pdt, amp = check_common(n, machine, dtype, available_memory_proportion, partials_dtype)
    if n_split is not None:
        n_split = check_int("n_split", n_split)
    if num_bands is not None:
        num_bands = check_int("num_bands", num_bands)
    try:
        return _cached_plan(pattern, n, machine, dt, pdt, amp, n_split, num_bands)
    except _NoFit as e:
        raise _no_plan_error(e, pattern, n, machine, dt, pdt, amp, n_split, num_bands) from None


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _cached_plan(pattern, n, machine, dt, pdt, amp, n_split, num_bands) -> Plan:
    """The plan cache: keyed on the pattern (hashed and compared by fingerprint) and the checked options."""
    return _search(pattern, n, machine, dt, pdt, amp, n_split, num_bands)


def clear_cache() -> None:
    """Forget every cached plan."""
    _cached_plan.cache_clear()


def cache_info() -> dict:
    """``{"size", "maxsize", "hits", "misses"}`` of the plan cache."""
    info = _cached_plan.cache_info()
    return {"size": info.currsize, "maxsize": info.maxsize, "hits": info.hits, "misses": info.misses}


# Patterns up to this many blocks are scored exactly for every candidate; larger ones are screened
# with `_estimate_stats` first and only the most promising candidates are scored exactly.
EXACT_LIMIT = 100_000
EXACT_TOP = 4
SERIAL_CANDIDATES = (1, 2, 4, 8, 16, 32, 64)
# With PROBE, a candidate is not scored exactly when a lower bound of its cost (`_cost.sparse_cost_bound`, from
# the exact footprint of its fullest tile and counts per band) shows that it cannot fit the memory limit or
# cannot beat the best plan so far. This keeps planning fast; plans and error messages are identical either way.
PROBE = True
# A bound rejects only when it is beyond the limit or the best total by more than this relative margin, far
# above the rounding error of the few float operations that separate it from the exact figure.
_BOUND_SLACK = 1e-9


def _search(pattern, n, machine, dt, pdt, amp, n_split_opt, num_bands_opt, audit: list | None = None) -> Plan:
    """The cheapest plan that fits (or :class:`_NoFit`). ``audit``: a list that receives, for every candidate at
    every serial level tried, ``(n_split, bands, serial, bound_total, bound_top, total, top)``: its lower bounds
    and its exact cycles and busiest tile's bytes, every one scored exactly (the screening's check)."""
    T = machine.num_tiles
    grain = machine.column_grain(dt)
    max_split = cdiv(n, grain)
    if n_split_opt is not None:
        if n_split_opt > min(max_split, T):
            raise ValueError(
                f"Expected n_split <= {min(max_split, T)} (n={n} in grains of {grain} columns, {T} tiles). "
                f"Got {n_split_opt}."
            )
        splits = [n_split_opt]
    else:
        splits = [s for s in N_SPLIT_CANDIDATES if s <= min(max_split, T)]
    gm, gk = pattern.grid
    band_options = [num_bands_opt] if num_bands_opt is not None else [b for b in BAND_CANDIDATES if b <= max(gk, 1)]
    limit = amp * machine.tile_memory_bytes
    col_counts = np.bincount(pattern.cols, minlength=gk)
    rows_nonempty = int((np.diff(pattern.indptr) > 0).sum())
    col_major = np.argsort(_small_int(pattern.cols, gk), kind="stable")  # rows stay ascending within a column
    col_starts = np.ones(pattern.nnz_blocks, bool)  # whether each block in col_major starts its column
    col_starts[1:] = np.diff(pattern.cols[col_major]) != 0

    all_bounds = []
    seen = set()
    for nb in band_options:
        bounds = _bounds(col_counts, nb)
        bkey = tuple(bounds.tolist())
        if bkey not in seen:  # another band count may give the same bands
            seen.add(bkey)
            all_bounds.append(bounds)
    candidates = []  # (bands, n_split, tiles_per_split, tiles_per_band)
    for bounds, nonempty_rows in zip(all_bounds, _nonempty_rows(pattern, all_bounds), strict=True):
        bands = _bands(pattern, bounds, col_counts, nonempty_rows)
        for s in splits:
            tps = _tiles_per_split(machine, s)
            tpb = tiles_for_bands(bands.nnz, tps, _grain(machine))
            if tpb is not None:
                candidates.append((bands, s, tps, tpb))

    stats_cache = {}

    def score(i: int, exact: bool, serial: int):
        bands, s, tps, tpb = candidates[i]
        key = (i, exact)
        if key not in stats_cache:
            if exact:
                tile, _, used = _tile_of_block(bands, tpb)
                stats_cache[key] = (_stats(pattern, bands, tile, tps, col_major, col_starts), tile, used)
            else:
                stats_cache[key] = (_estimate_stats(bands, tpb, rows_nonempty), None, None)
        stats, tile, used = stats_cache[key]
        cycles, nbytes, memory = _cost.sparse_cost(
            machine, stats, shape=pattern.shape, block_size=pattern.block_size, n=n, n_split=s,
            tiles_per_split=tps, dtype=dt, partials_dtype=pdt, serial=serial,
        )  # fmt: skip
        total = float(sum(cycles.values()))
        top = float(memory.max(initial=0.0))
        rank = (total, top, s, bands.boundaries.size - 1)
        return rank, (candidates[i], serial, tile, used, cycles, nbytes, memory)

    bound_inputs = {}

    def bound_input(i: int) -> tuple[int, ...]:
        """What the lower bound of candidate ``i`` reads (the same at every serial level): the exact blocks, rows
        and columns of its fullest tile (the first of the band with the largest chunk) and that band's width;
        the widest band's width; the (row, band) pairs beyond the non-empty rows (each is a partial to reduce)."""
        if i not in bound_inputs:
            bands, _, _, tpb = candidates[i]
            chunk = np.where(tpb > 0, cdiv(bands.nnz, np.maximum(tpb, 1)), 0)
            j = int(np.argmax(chunk))
            sel = bands.first_blocks(j, int(chunk[j]))
            rows = pattern.rows[sel]  # ascending within a band
            nrows = int(np.count_nonzero(np.diff(rows))) + 1
            ncols = int(np.count_nonzero(np.bincount(pattern.cols[sel] - bands.boundaries[j])))
            widest = int(bands.nonempty_cols[bands.nnz > 0].max())
            extra = int(bands.nonempty_rows.sum()) - rows_nonempty
            bound_inputs[i] = (sel.size, nrows, ncols, int(bands.nonempty_cols[j]), widest, extra)
        return bound_inputs[i]

    def lower_bounds(order: list[int], serial: int) -> tuple[np.ndarray, np.ndarray]:
        """Lower bounds of the total cycles and of the busiest tile's bytes of the candidates ``order``."""
        b, r, c, span, widest, extra = np.array([bound_input(i) for i in order], np.int64).T
        one = np.ones_like(b)  # the widest band has a busy tile of at least one block, row and column
        s, tps = np.array([candidates[i][1:3] for i in order], np.int64).T
        return _cost.sparse_cost_bound(
            machine, np.stack([b, one], 1), np.stack([r, one], 1), np.stack([c, one], 1), np.stack([span, widest], 1),
            extra, shape=pattern.shape, block_size=pattern.block_size, n=n, n_split=s, tiles_per_split=tps,
            dtype=dt, partials_dtype=pdt, serial=serial,
        )  # fmt: skip

    large = pattern.nnz_blocks > EXACT_LIMIT
    screen = PROBE and pattern.nnz_blocks > 0  # (the bounds need a busy tile)
    best = None  # ((rank, position in its level's order), details)
    levels = []  # (serial, candidates in order) of every level tried, for the error message
    for serial in SERIAL_CANDIDATES:
        if serial > 1 and (n_split_opt is not None or serial > max_split):
            break
        idx = [i for i, c in enumerate(candidates) if c[1] * serial <= max_split]
        if not large:
            order = idx
        else:
            est = {i: score(i, False, serial)[0] for i in idx}
            # Promising first: estimated to fit (with slack for the estimate), then by estimated cycles.
            order = sorted(idx, key=lambda i: (est[i][1] > 1.1 * limit, est[i]))
        levels.append((serial, order))
        visit = range(len(order))
        if screen and order:
            lb_total, lb_top = lower_bounds(order, serial)
            for i, bt, bm in zip(order, lb_total, lb_top, strict=True) if audit is not None else ():
                (total, top, split, nb), _ = score(i, True, serial)
                audit.append((split, nb, serial, float(bt), float(bm), total, top))
            lb_total, cannot_fit = lb_total * (1 - _BOUND_SLACK), lb_top * (1 - _BOUND_SLACK) > limit
            if not large:
                # Every candidate would be scored: take the smallest bounds first, so that the best plan is found
                # early and the rest are rejected by their bounds. Ties between equal ranks still go to the
                # earlier candidate in `order` (the position is the rank's last key).
                visit = np.argsort(lb_total, kind="stable")
        scored = 0
        for p in visit:
            if best is not None and large and scored >= EXACT_TOP:
                break
            scored += 1  # a candidate rejected by its bound counts as scored: the same ones are considered
            if screen:
                if cannot_fit[p]:
                    continue
                if best is not None and lb_total[p] > best[0][0][0]:
                    if large:
                        continue
                    break  # bounds ascending: none of the rest can beat the best either
            rank, details = score(order[p], True, serial)
            if rank[1] <= limit and (best is None or (rank, p) < best[0]):
                best = ((rank, p), details)
        if best is not None:
            break  # serialising costs every phase again: only when no single pass fits

    if best is None:

        def smallest():
            """The smallest exact footprint over every candidate tried, first in order on ties."""
            out = None  # (bytes, n_split, bands, serial)
            for serial, order in levels:
                for i in order:
                    rank, _ = score(i, True, serial)
                    if out is None or rank[1] < out[0]:
                        out = (rank[1], candidates[i][1], candidates[i][0].boundaries.size - 1, serial)
            return out

        raise _NoFit(smallest, len(candidates))
    (bands, s, tps, _), serial, tile, used, cycles, nbytes, memory = best[1]
    dense = _cost.dense_estimate(machine, pattern.shape[0], pattern.shape[1], n, dt, pdt, amp)
    return _build_plan(pattern, n, machine, dt, pdt, amp, s, tps, serial, bands, used, tile, cycles, nbytes, memory,
                       dense, len(candidates), col_major)  # fmt: skip


class _NoFit(Exception):
    """Raised by :func:`_search` when nothing fits; :func:`plan` turns it into a NoValidPlanError with advice."""

    def __init__(self, smallest, scored):
        super().__init__("no partition fits")
        self._smallest, self.scored = smallest, scored

    @functools.cached_property
    def smallest(self):
        """``(bytes, n_split, bands, serial)`` of the smallest footprint, or None: computed on first use only (the
        advice's replanning only asks whether something fits)."""
        return self._smallest()


def _fits(pattern, n, machine, dt, pdt, amp, n_split, num_bands) -> bool:
    try:
        _search(pattern, n, machine, dt, pdt, amp, n_split, num_bands)
    except (_NoFit, ValueError):  # ValueError: a forced n_split too large for this n
        return False
    return True


def _no_plan_error(e: _NoFit, pattern, n, machine, dt, pdt, amp, n_split, num_bands) -> NoValidPlanError:
    (m, k), (bh, bw) = pattern.shape, pattern.block_size
    what = f"W {m} x {k} (blocks {bh} x {bw}, {pattern.nnz_blocks} non-zero blocks) @ X {k} x {n} in {dt}"
    what += f" on {machine.name}"
    if e.smallest is None:
        return NoValidPlanError(
            f"No valid plan for {what}: no partition is possible with {machine.num_tiles} tiles in grains of "
            f"{_grain(machine)} (more non-empty column bands than tiles, or than grains of tiles, for one piece of n). "
            "Pass a smaller num_bands or a smaller n_split."
        )
    top, s, nb, serial = e.smallest
    limit = amp * machine.tile_memory_bytes
    others = []
    if dt == "float32":
        others.append(("use float16 instead of float32", {"dtype": "float16"},
                       lambda: _fits(pattern, n, machine, "float16", pdt, amp, n_split, num_bands)))  # fmt: skip
    text, suggestions, nothing_fits = advice(
        lambda a, n_: _fits(pattern, n_, machine, dt, pdt, a, n_split, num_bands),
        n=n, amp=amp, smallest_bytes=top, tile_memory_bytes=machine.tile_memory_bytes, others=others,
    )  # fmt: skip
    kib = 1024.0
    return NoValidPlanError(
        f"No valid plan for {what}: the smallest per-tile footprint over {e.scored} partitions is {top / kib:.1f} KiB "
        f"(n_split={s}, bands={nb}, serial passes={serial}), above the limit available_memory_proportion={amp:g} x "
        f"{machine.tile_memory_bytes / kib:g} KiB = {limit / kib:.1f} KiB. {text}",
        suggestions=suggestions,
        nothing_fits=nothing_fits,
    )


def _pad_rows(values: np.ndarray, group: np.ndarray, groups: int) -> tuple[np.ndarray, np.ndarray]:
    """Scatter ``values`` (sorted by ``group``) into a ``(groups, max_count)`` array padded with -1; also slots."""
    pad = _Padding(group, groups)
    return pad(values), pad.slot


class _Padding:
    """Where the values of sorted groups go in a ``(groups, max_count)`` array, worked out once for several arrays."""

    def __init__(self, group: np.ndarray, groups: int):
        counts = np.diff(np.searchsorted(group, np.arange(groups + 1, dtype=group.dtype)))  # group is sorted
        self.shape = (groups, max(int(counts.max(initial=0)), 1))
        starts = np.cumsum(counts) - counts
        self.slot = np.arange(group.size) - np.repeat(starts, counts)  # rank within its group
        self.flat = np.repeat(np.arange(groups) * self.shape[1], counts) + self.slot

    def __call__(self, values: np.ndarray) -> np.ndarray:
        out = np.full(self.shape, -1, np.int32)
        out.reshape(-1)[self.flat] = values
        return out


def _build_plan(
    pattern, n, machine, dt, pdt, amp, s, tps, serial, bands, used, tile, cycles, nbytes, memory, dense, scored,
    col_major,
):  # fmt: skip
    order = bands.order
    rows = pattern.rows[order]
    cols = pattern.cols[order]
    # Blocks, in row order within each tile.
    by_tile = _Padding(tile, tps)
    tile_blocks = by_tile(order)
    # Distinct rows: band order is sorted by (tile, row).
    new_row = np.ones(tile.size, bool)
    new_row[1:] = (tile[1:] != tile[:-1]) | (rows[1:] != rows[:-1])
    tile_rows, _ = _pad_rows(rows[new_row], tile[new_row], tps)
    row_id = np.cumsum(new_row) - 1  # global index of each block's (tile, row) pair
    rows_per_tile = np.bincount(tile[new_row], minlength=tps)
    first_pair = np.cumsum(rows_per_tile) - rows_per_tile
    local_row = row_id - first_pair[tile]
    # Distinct columns, sorted per tile. In column-major order a column's tiles are non-decreasing (its band's
    # tiles take its blocks in row order), so a stable sort by tile (a radix sort) orders blocks by (tile, column).
    by_col = bands.by_col(col_major)
    by_tc = by_col[np.argsort(_small_int(tile[by_col], tps), kind="stable")]
    t_tc, c_tc = tile[by_tc], cols[by_tc]
    new_pair = np.ones(tile.size, bool)
    new_pair[1:] = (t_tc[1:] != t_tc[:-1]) | (c_tc[1:] != c_tc[:-1])
    tile_cols, col_slot = _pad_rows(c_tc[new_pair], t_tc[new_pair], tps)
    local_col = np.empty(tile.size, np.int64)
    local_col[by_tc] = col_slot[np.cumsum(new_pair) - 1]
    tile_local_row = by_tile(local_row)
    tile_local_col = by_tile(local_col)
    # Band of each local tile: the bands' tiles are consecutive.
    tile_band = np.full(tps, -1, np.int32)
    tile_band[: int(used.sum())] = np.repeat(np.arange(used.size), used)
    grain = machine.column_grain(dt)
    return Plan(
        pattern=pattern,
        n=n,
        machine=machine,
        dtype=dt,
        partials_dtype=pdt,
        available_memory_proportion=amp,
        n_split=s,
        num_bands=int(bands.boundaries.size - 1),
        tiles_per_split=tps,
        serial=serial,
        n_pieces=_cost.n_pieces(n, s, grain, serial).astype(np.int64),
        band_boundaries=bands.boundaries.astype(np.int64),
        tiles_per_band=used.astype(np.int64),
        tile_band=tile_band,
        tile_blocks=tile_blocks,
        tile_rows=tile_rows,
        tile_cols=tile_cols,
        tile_local_row=tile_local_row,
        tile_local_col=tile_local_col,
        tile_bytes=np.asarray(memory, np.float64),
        cycles=cycles,
        exchange_bytes=nbytes,
        dense=dense,
        candidates=scored,
    )
