"""The grouped plan: block rows that share block columns, gathered into units as tall as a ``wgmma`` tile.

A host-side plan for static ``W @ x`` (``dsd``) and its mirror ``x @ W`` (``dds``) with small blocks (16 or 32),
made from the known pattern as PopSparse's planner makes one for IPU tiles. The Pallas (Triton) kernel of
:mod:`.triton.grouped_kernel` consumes it (a unit's blocks of a column stacked into one 64- or 128-row dot) when
asked, ``TritonConfig(grouped=True)``, and by default where a measured rule claims the product
(:func:`.triton.grouped_kernel.claims`: patterns whose rows share their columns).

Why
---
The work-list kernels (:mod:`.schedule`) run one program per block row (times a column tile of ``x``): every block
``b x b`` reads its own ``b x tn`` slab of ``x`` from L2, an intensity of ``b`` flops per byte of slabs (bf16), so
blocks of 16 and 32 are bound by the L2's bandwidth, not by the tensor cores. A ``wgmma`` tile is 64 (or 128) rows
tall, so a program can instead own a *unit* of ``g = 64 / b`` (or ``128 / b``) block rows: for each distinct block
column of the unit it loads the slab once and multiplies it into every block row of the unit that holds that column
(the unit's blocks of that column, stacked into a ``g b x b`` operand, zeros where a row lacks the column). The
slabs a unit reads are its *distinct columns*, not its blocks; the more its rows share columns, the fewer bytes.

What it plans
-------------
:func:`group` partitions the block rows (every one, empty rows too: their output is zeros) into units of at most
``g`` rows, for each ``g`` that makes a tile of one of ``Grouping.heights`` (64 and 128 rows by default: ``g`` = 4
and 8 for ``b = 16``, 2 and 4 for ``b = 32``, 2 for ``b = 64`` at 128 rows), two ways:

- ``"contiguous"``: consecutive block rows in the pattern's order (what the banded kernel,
  :mod:`.mosaic.bands`, does for ``x @ W``, with its column bands);
- ``"greedy"``: rows permuted. Seed a unit with the longest row not yet placed, then add, ``g - 1`` times, the
  row that shares most columns with the unit so far (ties: the shorter row, the one adding fewer new columns; no
  row sharing any: the shortest left, so empty rows fill units that share nothing). The permutation is
  ``row_order`` (the units' rows one after another); it applies to the *output* rows (a unit's slot ``j`` writes
  block row ``unit_rows[u, j]``), never to a copy of ``W``: ``step_ids`` point into ``W.data`` as stored.

The cost model
--------------
Bytes moved through L2 for the whole product (``n`` columns of ``x`` in tiles of ``tn``), the same terms for every
plan:

- ``x``: ``slabs x bw x n x itemsize``, where ``slabs`` is the sum over units of their distinct columns (the
  ungrouped plan: one slab per block, ``slabs = nnz``);
- ``w``: ``nnz x bh x bw x itemsize x ceil(n / tn)`` (each block once per column tile, grouped or not);
- ``out``: ``m x n x out_itemsize`` (every output row written once).

and the useful flops ``2 x nnz x bh x bw x n``. The plan takes the candidate with the fewest bytes, and a grouping
only where it moves strictly fewer bytes than the ungrouped plan (ties keep ``g = 1``). Grouping never moves more:
a unit's distinct columns are at most its blocks. The price is the tensor cores' *fill*: a unit issues
``slabs x g`` block products of which ``nnz`` are non-zero (:attr:`GroupedPlan.fill`); the model records it and
does not score it (the kernel's measurement will say what it costs).

For ``x @ W`` (``op="dds"``) the same is done on the transposed pattern (through the cached transpose, ``step_ids``
into the original data): units of block *columns* of ``W`` that share block rows, a slab of ``x`` being ``n x bh``
(``n`` = the rows of ``x``).

Example::

    >>> import blocksparse as bs
    >>> from blocksparse.ops.matmul.grouped import Grouping, group
    >>> p = bs.BlockPattern.power_law(0, (2048, 2048), (16, 16), 1 / 4)
    >>> plan = group(p, Grouping(n=4096))
    >>> plan.group, plan.method, plan.reduction < 0.6  # 8 rows of 16 per unit, rows permuted, < 0.6x the bytes
    (8, 'greedy', True)
    >>> sorted(plan.row_order.tolist()) == list(range(128))
    True
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from types import MappingProxyType

import numpy as np

from ..._pattern import BlockPattern
from ..._util import cdiv

__all__ = ["Candidate", "GroupedPlan", "Grouping", "expected_bytes", "group", "report"]

#: The ways of grouping rows :func:`group` scores (``Grouping.methods``).
METHODS = ("contiguous", "greedy")


@dataclasses.dataclass(frozen=True)
class Grouping:
    """Options of :func:`group` (hashable: part of its cache key).

    Attributes:
        op: ``"dsd"`` (``W @ x``: units of block rows of ``W``) or ``"dds"`` (``x @ W``: units of block columns).
        n: the dense operand's other dimension (columns of ``x`` for ``dsd``, rows for ``dds``).
        tn: the column tile of ``n`` one program covers (``W``'s blocks are read once per tile).
        itemsize, out_itemsize: bytes per element of the operands and of the output (bf16: 2).
        heights: the tile heights in rows a unit may fill (64 and 128: ``wgmma``'s M of one and two warpgroups).
        methods: the groupings scored (:data:`METHODS`).
    """

    op: str = "dsd"
    n: int = 4096
    tn: int = 128
    itemsize: int = 2
    out_itemsize: int = 2
    heights: tuple[int, ...] = (64, 128)
    methods: tuple[str, ...] = METHODS

    def __post_init__(self):
        if self.op not in ("dsd", "dds"):
            raise ValueError(f"Expected op 'dsd' or 'dds'. Got {self.op!r}.")
        for name in ("n", "tn", "itemsize", "out_itemsize"):
            v = getattr(self, name)
            if not isinstance(v, int | np.integer) or isinstance(v, bool) or v < 1:
                raise ValueError(f"Expected {name} as a positive int. Got {v!r}.")
        object.__setattr__(self, "heights", tuple(int(h) for h in self.heights))
        object.__setattr__(self, "methods", tuple(self.methods))
        if any(h < 1 for h in self.heights):
            raise ValueError(f"Expected positive tile heights. Got {self.heights}.")
        bad = [m for m in self.methods if m not in METHODS]
        if bad:
            raise ValueError(f"Expected methods among {METHODS}. Got {bad}.")


def expected_bytes(slabs: int, nnz: int, shape: tuple[int, int], block_size: tuple[int, int], o: Grouping) -> dict:
    """The modelled L2 bytes of a plan that reads ``slabs`` slabs (see the module docstring).

    ``shape`` and ``block_size`` are those of the operand as the units see it: ``W`` for ``dsd``, ``W^T`` for
    ``dds`` (rows: the output's, columns: the contracted dimension).

    Example::

        >>> expected_bytes(3, 4, (64, 32), (16, 16), Grouping(n=128, tn=128))
        {'x': 12288.0, 'w': 2048.0, 'out': 16384.0}
    """
    bh, bw = block_size
    return {
        "x": float(slabs) * bw * o.n * o.itemsize,
        "w": float(nnz) * bh * bw * o.itemsize * cdiv(o.n, o.tn),
        "out": float(shape[0]) * o.n * o.out_itemsize,
    }


def _per_flop(b: Mapping[str, float], flops: float) -> float:
    return sum(b.values()) / flops if flops > 0 else math.inf


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One plan :func:`group` scored: ``group`` rows per unit, grouped by ``method``, reading ``slabs`` slabs."""

    group: int
    method: str
    slabs: int
    bytes: Mapping[str, float]
    flops: float

    def __post_init__(self):
        object.__setattr__(self, "bytes", MappingProxyType({k: float(v) for k, v in self.bytes.items()}))

    @property
    def label(self) -> str:
        return "ungrouped" if self.group == 1 else f"{self.method} g={self.group}"

    @property
    def total_bytes(self) -> float:
        return float(sum(self.bytes.values()))

    @property
    def bytes_per_flop(self) -> float:
        return _per_flop(self.bytes, self.flops)


def _frozen(a, dtype=np.int32) -> np.ndarray:
    a = np.ascontiguousarray(a, dtype=dtype)
    a.setflags(write=False)
    return a


@dataclasses.dataclass(frozen=True, eq=False)
class GroupedPlan:
    """The chosen grouping of one static product and the bytes it expects (read-only; see the module docstring).

    Units ``U``, slabs ``S`` (the units' distinct columns, one after another), ``g = group``:

    Attributes:
        pattern: the planned pattern of ``W`` (as given: for ``dds`` the units are its block columns).
        options: the :class:`Grouping`.
        group: ``g``, block rows per unit (1: the ungrouped plan, every block row its own unit).
        method: ``"ungrouped"``, ``"contiguous"`` or ``"greedy"``.
        unit_rows: ``int32[U, g]``: the output block rows of each unit, in slot order; ``-1`` pads a short unit.
        row_order: ``int32[rows]``: the units' rows one after another, a permutation of the output block rows.
        unit_start: ``int32[U + 1]``: unit ``u``'s slabs are ``step_col[unit_start[u]:unit_start[u + 1]]``.
        step_col: ``int32[S]``: the distinct contracted block index (block column of ``W`` for ``dsd``) of each
            slab, ascending within a unit.
        step_ids: ``int32[S, g]``: the block (index into ``W.data``) each slot multiplies by the slab; ``-1``
            where the slot's row lacks the column.
        candidates: every plan scored, the ungrouped one first, the chosen one among them (:attr:`chosen`; its
            modelled L2 bytes by term, ``x``, ``w``, ``out``, are :attr:`bytes`).
    """

    pattern: BlockPattern
    options: Grouping
    group: int
    method: str
    unit_rows: np.ndarray
    row_order: np.ndarray
    unit_start: np.ndarray
    step_col: np.ndarray
    step_ids: np.ndarray
    candidates: tuple[Candidate, ...]

    def __post_init__(self):
        for name in ("unit_rows", "row_order", "unit_start", "step_col", "step_ids"):
            object.__setattr__(self, name, _frozen(getattr(self, name)))

    # -- sizes ---------------------------------------------------------------------------------------------------
    @property
    def operand(self) -> BlockPattern:
        """The pattern whose rows the units group: ``W``'s for ``dsd``, ``W^T``'s for ``dds``."""
        return self.pattern if self.options.op == "dsd" else self.pattern.T

    @property
    def num_units(self) -> int:
        return int(self.unit_rows.shape[0])

    @property
    def slabs(self) -> int:
        """``S``: slabs of ``x`` read per column tile (the units' distinct columns, summed)."""
        return int(self.step_col.shape[0])

    @property
    def unit_slabs(self) -> np.ndarray:
        """Distinct columns of each unit."""
        return np.diff(self.unit_start)

    @property
    def unit_blocks(self) -> np.ndarray:
        """Non-zero blocks of each unit."""
        lengths = np.append(self.operand.row_lengths, 0)  # index -1 (a pad slot): no blocks
        return lengths[self.unit_rows].sum(axis=1)

    @property
    def units_sharing(self) -> int:
        """Units with fewer distinct columns than blocks: those where grouping lowers the bytes."""
        return int((self.unit_slabs < self.unit_blocks).sum())

    def distinct_cols(self, u: int) -> np.ndarray:
        """The distinct contracted block indices of unit ``u``."""
        return self.step_col[self.unit_start[u] : self.unit_start[u + 1]]

    # -- estimates -----------------------------------------------------------------------------------------------
    @property
    def chosen(self) -> Candidate:
        """The candidate this plan is."""
        return next(c for c in self.candidates if (c.group, c.method) == (self.group, self.method))

    @property
    def bytes(self) -> Mapping[str, float]:
        """The modelled L2 bytes by term (``x``, ``w``, ``out``)."""
        return self.chosen.bytes

    @property
    def ungrouped_bytes(self) -> Mapping[str, float]:
        """The same for the ungrouped plan."""
        return self.candidates[0].bytes

    @property
    def flops(self) -> float:
        """Useful flops: ``2 x nnz x bh x bw x n``."""
        bh, bw = self.pattern.block_size
        return 2.0 * self.pattern.nnz_blocks * bh * bw * self.options.n

    @property
    def mma_flops(self) -> float:
        """Flops the tensor cores issue: every slot of every slab, zero blocks included."""
        bh, bw = self.pattern.block_size
        return 2.0 * self.slabs * self.group * bh * bw * self.options.n

    @property
    def fill(self) -> float:
        """Useful over issued flops (1 for the ungrouped plan; 0 for an empty pattern)."""
        return self.flops / self.mma_flops if self.mma_flops > 0 else 0.0

    @property
    def total_bytes(self) -> float:
        return self.chosen.total_bytes

    @property
    def bytes_per_flop(self) -> float:
        """Modelled L2 bytes per useful flop (``inf`` without a non-zero block)."""
        return self.chosen.bytes_per_flop

    @property
    def ungrouped_bytes_per_flop(self) -> float:
        return self.candidates[0].bytes_per_flop

    @property
    def reduction(self) -> float:
        """This plan's bytes over the ungrouped plan's (1.0: no gain, or nothing to move)."""
        u = self.candidates[0].total_bytes
        return self.total_bytes / u if u > 0 else 1.0

    @property
    def x_reduction(self) -> float:
        """Slabs of ``x`` read, over the ungrouped plan's (its blocks); 1.0 for an empty pattern."""
        nnz = self.pattern.nnz_blocks
        return self.slabs / nnz if nnz else 1.0

    # -- output --------------------------------------------------------------------------------------------------
    def __repr__(self) -> str:
        m, k = self.pattern.shape
        return (
            f"GroupedPlan({self.options.op} {m}x{k} b={self.pattern.block_size} nnz_blocks={self.pattern.nnz_blocks} "
            f"n={self.options.n}: {self.method} g={self.group}, {self.num_units} units, {self.slabs} slabs, "
            f"{self.reduction:.3f}x the ungrouped bytes)"
        )

    def to_dict(self, arrays: bool = False) -> dict:
        """A JSON-serialisable summary; ``arrays=True`` adds the grouping's arrays."""
        o = self.options
        out = {
            "op": o.op,
            "shape": list(self.pattern.shape),
            "block_size": list(self.pattern.block_size),
            "nnz_blocks": self.pattern.nnz_blocks,
            "density": self.pattern.density,
            "fingerprint": self.pattern.fingerprint,
            "n": o.n,
            "tn": o.tn,
            "itemsize": o.itemsize,
            "out_itemsize": o.out_itemsize,
            "group": self.group,
            "method": self.method,
            "num_units": self.num_units,
            "units_sharing": self.units_sharing,
            "slabs": self.slabs,
            "flops": self.flops,
            "mma_flops": self.mma_flops,
            "fill": self.fill,
            "bytes": dict(self.bytes),
            "bytes_per_flop": _finite(self.bytes_per_flop),
            "ungrouped_bytes": dict(self.ungrouped_bytes),
            "ungrouped_bytes_per_flop": _finite(self.ungrouped_bytes_per_flop),
            "reduction": self.reduction,
            "candidates": [
                {
                    "label": c.label,
                    "group": c.group,
                    "method": c.method,
                    "slabs": c.slabs,
                    "bytes": dict(c.bytes),
                    "bytes_per_flop": _finite(c.bytes_per_flop),
                }
                for c in self.candidates
            ],
        }
        if arrays:
            for name in ("unit_rows", "row_order", "unit_start", "step_col", "step_ids"):
                out[name] = getattr(self, name).tolist()
        return out

    def report(self) -> str:
        """A readable table: the product, the units, every candidate's bytes per flop, the choice."""
        return report(self)

    __str__ = report


def _finite(v: float) -> float | None:
    return None if math.isinf(v) else v


# ----------------------------------------------------------------------------------------------------------------
# Building the groupings
# ----------------------------------------------------------------------------------------------------------------
def _segments(indptr: np.ndarray, values: np.ndarray, which: np.ndarray) -> np.ndarray:
    """``values[indptr[i]:indptr[i + 1]]`` for each ``i`` of ``which``, concatenated."""
    starts, ends = indptr[which], indptr[which + 1]
    lens = ends - starts
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, values.dtype)
    offs = np.repeat(starts - np.cumsum(lens) + lens, lens)
    return values[offs + np.arange(total)]


def _contiguous(num_rows: int, g: int) -> np.ndarray:
    """Units of consecutive rows: ``int[U, g]``, ``-1`` padded."""
    u = cdiv(num_rows, g)
    rows = np.full(u * g, -1, np.int64)
    rows[:num_rows] = np.arange(num_rows)
    return rows.reshape(u, g)


def _greedy(indptr: np.ndarray, cols: np.ndarray, num_cols: int, g: int) -> np.ndarray:
    """Units of rows that share columns, chosen greedily (see the module docstring): ``int[U, g]``, ``-1`` padded."""
    num_rows = indptr.shape[0] - 1
    lengths = np.diff(indptr)
    # The transpose (column -> rows), to count each row's overlap with a unit as its columns arrive.
    by_col = np.argsort(cols, kind="stable")
    col_rows = np.repeat(np.arange(num_rows), lengths)[by_col]
    col_ptr = np.zeros(num_cols + 1, np.int64)
    np.cumsum(np.bincount(cols, minlength=num_cols), out=col_ptr[1:])

    longest = np.argsort(-lengths, kind="stable")
    shortest = longest[::-1].copy()
    placed = np.zeros(num_rows, bool)
    overlap = np.zeros(num_rows, np.int64)
    in_unit = np.zeros(num_cols, bool)
    units = np.full((cdiv(num_rows, g), g), -1, np.int64)
    lo = hi = 0  # next candidates in longest / shortest order
    for u in range(units.shape[0]):
        touched = np.zeros(0, np.int64)
        ucols = np.zeros(0, np.int64)
        for j in range(g):
            if j == 0:
                while placed[longest[lo]]:
                    lo += 1
                r = int(longest[lo])
            else:
                cand = touched[~placed[touched]] if touched.size else touched
                if cand.size and overlap[cand].max() > 0:
                    # The most shared columns; ties: the shorter row (fewer new columns).
                    key = overlap[cand] * (num_cols + 1) + (num_cols - lengths[cand])
                    r = int(cand[np.argmax(key)])
                else:
                    while hi < num_rows and placed[shortest[hi]]:
                        hi += 1
                    if hi == num_rows:
                        break
                    r = int(shortest[hi])
            units[u, j] = r
            placed[r] = True
            rc = cols[indptr[r] : indptr[r + 1]]
            new = rc[~in_unit[rc]]
            if new.size:
                in_unit[new] = True
                ucols = np.concatenate([ucols, new])
                hit = _segments(col_ptr, col_rows, new)
                np.add.at(overlap, hit, 1)
                touched = np.union1d(touched, hit)
            if placed.all():
                break
        overlap[touched] = 0
        in_unit[ucols] = False
        if placed.all():
            units = units[: u + 1]
            break
    return units


def _steps(unit_rows: np.ndarray, indptr: np.ndarray, cols: np.ndarray, ids: np.ndarray):
    """The slabs of each unit: ``unit_start``, ``step_col`` (ascending per unit) and ``step_ids`` (``-1``: none)."""
    num_units, g = unit_rows.shape
    slot_rows = unit_rows.reshape(-1)
    real = slot_rows >= 0
    safe = np.where(real, slot_rows, 0)
    lens = np.where(real, indptr[safe + 1] - indptr[safe], 0)
    blk = _segments(indptr, np.arange(cols.shape[0]), np.where(real, safe, 0)[real])
    # Each block's unit and slot, in unit order.
    slot = np.repeat(np.arange(slot_rows.size), lens)
    unit = slot // g
    col = cols[blk]
    key = unit * (int(cols.max(initial=0)) + 1) + col
    order = np.lexsort((col, unit))
    key_sorted = key[order]
    first = np.ones(key_sorted.size, bool)
    first[1:] = key_sorted[1:] != key_sorted[:-1]
    step_of = np.cumsum(first) - 1  # the slab each block (in sorted order) belongs to
    num_steps = int(first.sum())
    step_col = col[order][first]
    step_unit = unit[order][first]
    step_ids = np.full((num_steps, g), -1, np.int64)
    step_ids[step_of, (slot % g)[order]] = ids[blk[order]]
    unit_start = np.zeros(num_units + 1, np.int64)
    np.cumsum(np.bincount(step_unit, minlength=num_units), out=unit_start[1:])
    return unit_start, step_col, step_ids


def group(pattern: BlockPattern, options: Grouping = Grouping()) -> GroupedPlan:
    """The grouped plan of a static product with ``pattern`` (host NumPy, cached on the pattern and options).

    Scores the ungrouped plan and, for each unit size ``g`` that fills one of ``options.heights``, every grouping
    of ``options.methods``; returns the one with the fewest modelled bytes (the ungrouped one on a tie). See the
    module docstring.
    """
    if not isinstance(pattern, BlockPattern):
        raise TypeError(f"Expected a BlockPattern. Got {type(pattern).__name__}.")
    if not isinstance(options, Grouping):
        raise TypeError(f"Expected options as a Grouping. Got {type(options).__name__}.")
    return _group(pattern, options)


@functools.lru_cache(maxsize=64)
def _group(pattern: BlockPattern, o: Grouping) -> GroupedPlan:
    if o.op == "dsd":
        p = pattern
        ids = np.arange(pattern.nnz_blocks, dtype=np.int64)
    else:
        p, perm = pattern.transpose()
        ids = np.asarray(perm, np.int64)
    indptr = np.asarray(p.indptr, np.int64)
    cols = np.asarray(p.cols, np.int64)
    num_rows, num_cols = p.grid
    side = p.block_size[0]
    nnz = p.nnz_blocks
    bh, bw = p.block_size
    flops = 2.0 * nnz * bh * bw * o.n

    groups = sorted({h // side for h in o.heights if h % side == 0 and h // side >= 2})
    built = {(1, "ungrouped"): _contiguous(num_rows, 1)}
    for g in groups:
        for method in o.methods:
            built[(g, method)] = (
                _contiguous(num_rows, g) if method == "contiguous" else _greedy(indptr, cols, num_cols, g)
            )
    scored, steps = [], {}
    for (g, method), unit_rows in built.items():
        steps[(g, method)] = s = _steps(unit_rows, indptr, cols, ids)
        slabs = int(s[1].shape[0])
        scored.append(Candidate(g, method, slabs, expected_bytes(slabs, nnz, p.shape, p.block_size, o), flops))
    best = min(scored, key=lambda c: (c.total_bytes, c.group))  # strictly fewer bytes to leave g = 1
    unit_rows = built[(best.group, best.method)]
    unit_start, step_col, step_ids = steps[(best.group, best.method)]
    flat = unit_rows.reshape(-1)
    return GroupedPlan(
        pattern=pattern,
        options=o,
        group=best.group,
        method=best.method,
        unit_rows=unit_rows,
        row_order=flat[flat >= 0],
        unit_start=unit_start,
        step_col=step_col,
        step_ids=step_ids,
        candidates=tuple(scored),
    )


# ----------------------------------------------------------------------------------------------------------------
# The report
# ----------------------------------------------------------------------------------------------------------------
_MB = 1e6


def _stats(a: np.ndarray) -> str:
    if a.size == 0:
        return "-"
    return f"{int(a.min())} / {float(a.mean()):.1f} / {int(a.max())}"


def report(plan: GroupedPlan) -> str:
    """The report of a :class:`GroupedPlan` (the IPU plan's layout: the product, the partition, the table)."""
    o, p = plan.options, plan.pattern
    (m, k), (bh, bw) = p.shape, p.block_size
    product = f"W {m} x {k} @ X {k} x {o.n}" if o.op == "dsd" else f"X {o.n} x {m} @ W {m} x {k}"
    what = "block rows" if o.op == "dsd" else "block columns"
    side = plan.operand.block_size[0]
    if plan.group == 1:
        units = f"  units: {plan.num_units} of 1 {what[:-1]} (ungrouped: no grouping moves fewer bytes)"
    else:
        units = (
            f"  units: {plan.num_units} of {plan.group} {what} ({plan.group * side}-row tiles), "
            f"{'rows permuted (greedy)' if plan.method == 'greedy' else 'in the pattern order (contiguous)'}; "
            f"{plan.units_sharing} units share columns"
        )
    lines = [
        f"Grouped plan for {o.op} on a GPU (host model: L2 bytes per flop; the kernel: TritonConfig(grouped=True))",
        f"  {product}, blocks {bh} x {bw}, {p.nnz_blocks} non-zero blocks (density {p.density:.4g}); "
        f"operands {o.itemsize} B, output {o.out_itemsize} B, column tile {o.tn}",
        units,
        f"  per unit (min / mean / max): slabs {_stats(plan.unit_slabs)}, blocks {_stats(plan.unit_blocks)}; "
        f"tensor-core fill {plan.fill:.3f}",
        "",
        f"  {'plan':<18}{'slabs':>10}{'x MB':>12}{'W MB':>10}{'out MB':>10}{'bytes/flop':>12}{'vs ungrouped':>14}",
    ]
    base = plan.candidates[0].total_bytes
    for c in plan.candidates:
        chosen = "  <- chosen" if c is plan.chosen else ""
        bpf = c.bytes_per_flop
        lines.append(
            f"  {c.label:<18}{c.slabs:>10,d}{c.bytes['x'] / _MB:>12.2f}{c.bytes['w'] / _MB:>10.2f}"
            f"{c.bytes['out'] / _MB:>10.2f}{'-' if math.isinf(bpf) else f'{bpf:.5f}':>12}"
            f"{(c.total_bytes / base if base > 0 else 1.0):>13.3f}x{chosen}"
        )
    lines += [
        "",
        f"  chosen: {plan.chosen.label}, "
        f"{plan.reduction:.3f}x the ungrouped plan's bytes ({plan.x_reduction:.3f}x its slabs of x)",
    ]
    return "\n".join(lines)
