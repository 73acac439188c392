"""GPU machine model and the GPU lowering of a static block pattern into a kernel schedule.

On the IPU a plan assigns non-zero blocks to tiles; on a GPU a *program instance* plays the tile.
The lowering here turns a :class:`~blocksparse.BlockPattern` into a
:class:`~blocksparse.ops.matmul.schedule.RowSplitSchedule`: which blocks each program handles.

**Load balance.** A GPU hands programs to multiprocessors as they free up, so the finish time
is about ``max(total work / parallel slots, longest program)``. With one program per block row,
a pattern whose row lengths follow a power law has a few rows hundreds of times longer than the
mean, and the longest program dominates. The lowering caps a program at ``max_len`` blocks:
longer rows are split into near-equal pieces (PopSparse's "consecutive tiles take contiguous
chunks of a row, partials reduced afterwards"), the pieces write float32 partials, and a small
combine step sums them into the split rows only. Programs are issued unit-fastest (every unit
of dense column tile 0, then of tile 1, ...: the tile of the dense operand stays in L2 while the
sparse blocks stream), so ``max_len`` is about one slot's share of *one tile's* work (and at
least twice the mean row length, so a uniform pattern is not split for nothing); see
:func:`choose_max_len`. Units are issued longest first (LPT order) within each tile, so the short
ones fill the gaps at the end.

The machine numbers are leads used by the heuristics and by the benchmark's roofline columns;
the kernels never depend on them for correctness.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from .._pattern import BlockPattern
from ..ops.matmul.schedule import RowSplitSchedule

__all__ = ["GpuMachine", "H200", "H100", "GpuLowering", "lower", "estimate_seconds"]


@dataclass(frozen=True)
class GpuMachine:
    """Numbers of one GPU that the lowering and the benchmark's roofline use.

    Attributes:
        name: marketing name.
        num_sms: streaming multiprocessors (program instances run on these).
        smem_per_sm: shared memory per SM in bytes (the per-block limit is 227 KiB on Hopper).
        l2_bytes: L2 cache size.
        hbm_bytes_per_s: datasheet HBM bandwidth.
        hbm_bytes_per_s_measured: what a copy through JAX achieved (read + write counted).
        bf16_flops: datasheet dense bf16 tensor-core rate (no sparsity).
        bf16_flops_measured: what a large dense bf16 product achieved.
        programs_per_sm: resident programs per SM assumed by the load-balance heuristic.
    """

    name: str
    num_sms: int
    smem_per_sm: int
    l2_bytes: int
    hbm_bytes_per_s: float
    hbm_bytes_per_s_measured: float
    bf16_flops: float
    bf16_flops_measured: float
    programs_per_sm: int = 2

    @property
    def slots(self) -> int:
        """Programs that run at once (the unit of a "wave")."""
        return self.num_sms * self.programs_per_sm

    @property
    def ridge_flops_per_byte(self) -> float:
        """Arithmetic intensity above which a kernel is compute-bound (measured ceilings)."""
        return self.bf16_flops_measured / self.hbm_bytes_per_s_measured


# Sources: NVIDIA H200 datasheet (141 GB HBM3e at 4.8 TB/s; same Hopper GH100 die as the H100
# SXM: 132 SMs, 228 KiB shared memory per SM, 50 MB L2 (60 MB as reported by PyTorch), dense bf16
# 989.5 TFLOP/s); NVIDIA Hopper tuning guide (shared memory per SM); measured on the lent H200:
# ../shared/BASELINES.md (3.5 TB/s copy through JAX, 596 TFLOP/s `jnp.dot` 8192^3) and the device
# notes (788 TFLOP/s through PyTorch on random data, 4.3 TB/s copy through PyTorch).
H200 = GpuMachine(
    name="NVIDIA H200 SXM",
    num_sms=132,
    smem_per_sm=228 * 1024,
    l2_bytes=50 * 1024 * 1024,
    hbm_bytes_per_s=4.8e12,
    hbm_bytes_per_s_measured=3.5e12,
    bf16_flops=989.5e12,
    bf16_flops_measured=690e12,  # between jnp.dot (596) and cuBLAS through torch (788)
)

# H100 SXM: same die, 80 GB HBM3 at 3.35 TB/s (NVIDIA datasheet); measured figures assumed equal
# to the H200's for compute and scaled by the datasheet ratio for memory.
H100 = GpuMachine(
    name="NVIDIA H100 SXM",
    num_sms=132,
    smem_per_sm=228 * 1024,
    l2_bytes=50 * 1024 * 1024,
    hbm_bytes_per_s=3.35e12,
    hbm_bytes_per_s_measured=3.5e12 * 3.35 / 4.8,
    bf16_flops=989.5e12,
    bf16_flops_measured=690e12,
)


@dataclass(frozen=True)
class GpuLowering:
    """Options of :func:`lower` (hashable: part of the cache key).

    Attributes:
        op: ``"dsd"`` (units are block rows of W) or ``"dds"`` (units are block columns of W,
            walked through the cached transpose; ``block_id`` points into the original data).
        tiles: programs per unit along the dense dimension (``n / tn``); each multiplies the
            work, which the balance heuristic needs.
        max_len: force the cap on blocks per unit (``None``: choose it, see the module docstring).
        min_len: never split a row into pieces shorter than this (partials cost a float32 write
            and a combine).
        machine: the :class:`GpuMachine`.
    """

    op: str = "dsd"
    tiles: int = 1
    max_len: int | None = None
    min_len: int = 4
    machine: GpuMachine = H200


def choose_max_len(row_lengths: np.ndarray, options: GpuLowering) -> int:
    """The cap on blocks per unit for these row lengths (see the module docstring).

    Programs are issued unit-fastest (all units of column tile 0, then tile 1, ...), so the
    balance bound is per tile: a unit should hold at most one slot's share of one tile's work,
    ``nnz / slots``. Rows up to twice the mean are never split (the float32 partials and the
    combine would cost more than the imbalance). If there are too few rows to give every slot a
    program, rows are split further, down to ``nnz * tiles / slots`` blocks per unit.
    """
    if options.max_len is not None:
        if options.max_len < 1:
            raise ValueError(f"Expected max_len >= 1. Got {options.max_len}.")
        return int(options.max_len)
    nnz = int(row_lengths.sum())
    if nnz == 0:
        return 1
    slots = options.machine.slots
    tiles = max(options.tiles, 1)
    nonempty = max(int((row_lengths > 0).sum()), 1)
    mean = nnz / nonempty
    cap = max(int(options.min_len), math.ceil(2 * mean), math.ceil(nnz / slots))
    if nonempty * tiles < slots:  # too few programs to fill the machine: split for parallelism
        cap = min(cap, max(int(options.min_len), math.ceil(nnz * tiles / slots)))
    return cap


def _row_split(indptr: np.ndarray, cols: np.ndarray, ids: np.ndarray, max_len: int, key: str) -> RowSplitSchedule:
    num_rows = indptr.shape[0] - 1
    lengths = np.diff(indptr).astype(np.int64)
    pieces = np.maximum(1, -(-lengths // max_len))  # empty rows still get one unit (writes zeros)
    unit_row = np.repeat(np.arange(num_rows), pieces)
    # Piece q of p over a row of L blocks: [q * L // p, (q + 1) * L // p) -> near-equal pieces.
    first = np.repeat(np.cumsum(pieces) - pieces, pieces)
    q = np.arange(unit_row.size) - first
    p = pieces[unit_row]
    length = lengths[unit_row]
    lo = q * length // p
    hi = (q + 1) * length // p
    unit_start = indptr[unit_row] + lo
    unit_len = hi - lo
    split = p > 1
    unit_dest = unit_row.copy()
    num_partials = int(split.sum())
    unit_dest[split] = -1 - np.arange(num_partials)
    split_rows = np.flatnonzero(pieces > 1)
    seg_of_row = np.full(num_rows, -1, np.int64)
    seg_of_row[split_rows] = np.arange(split_rows.size)
    partial_seg = seg_of_row[unit_row[split]]
    # LPT: longest units first (stable, so ties stay in row order for locality).
    order = np.argsort(-unit_len, kind="stable")
    nnz = int(indptr[-1])
    pad = 1 if nnz == 0 else 0
    return RowSplitSchedule(
        num_rows=num_rows,
        max_len=max_len,
        unit_start=unit_start[order],
        unit_len=unit_len[order],
        unit_dest=unit_dest[order],
        block_col=np.concatenate([cols, np.zeros(pad, np.int64)]),
        block_id=np.concatenate([ids, np.zeros(pad, np.int64)]),
        split_rows=split_rows,
        partial_seg=partial_seg,
        nnz=nnz,
        key=key,
    )


@functools.lru_cache(maxsize=512)
def lower(pattern: BlockPattern, options: GpuLowering = GpuLowering()) -> RowSplitSchedule:
    """Lower a static pattern to the work list of the GPU kernels (host NumPy, cached).

    Arguments:
        pattern: the block pattern of ``W``.
        options: a :class:`GpuLowering`; ``op="dsd"`` walks the block rows of ``W`` (output rows
            of ``W @ x``), ``op="dds"`` its block columns (output columns of ``x @ W``).

    Returns:
        A :class:`RowSplitSchedule`.

    Example::

        >>> import blocksparse as bs
        >>> from blocksparse.plan.gpu import GpuLowering, lower
        >>> p = bs.BlockPattern.power_law(0, (4096, 4096), (64, 64), 1 / 16)
        >>> s = lower(p, GpuLowering(tiles=32))
        >>> int(s.unit_len.max()) <= s.max_len
        True
    """
    if options.op == "dsd":
        indptr, cols = pattern.indptr, pattern.cols
        ids = np.arange(pattern.nnz_blocks, dtype=np.int64)
    elif options.op == "dds":
        t, perm = pattern.transpose()
        indptr, cols, ids = t.indptr, t.cols, perm
    else:
        raise ValueError(f"Expected op 'dsd' or 'dds'. Got {options.op!r}.")
    indptr = np.asarray(indptr, np.int64)
    max_len = choose_max_len(np.diff(indptr), options)
    return _row_split(
        indptr, np.asarray(cols, np.int64), np.asarray(ids, np.int64), max_len, pattern.fingerprint + options.op
    )


def estimate_seconds(flops: float, bytes_moved: float, machine: GpuMachine = H200) -> float:
    """Roofline floor: the larger of compute time and memory time at the measured ceilings."""
    return max(flops / machine.bf16_flops_measured, bytes_moved / machine.hbm_bytes_per_s_measured)
