"""The human-readable report of a plan, static or dynamic: one formatter for both kinds.

Every report has the same sections: the product, the partition (what differs between the two
kinds), memory per tile against the limit, cycles and exchange bytes per phase (with each phase's share of
the total), and the estimated
time, throughput and speedup over the modelled dense matmul.
"""

from __future__ import annotations

import numpy as np

__all__ = ["report"]

_KIB = 1024.0


def _piece_width(p) -> int:
    return int(np.diff(p.n_pieces, axis=1).max(initial=0))


def _static_partition(p, d: dict) -> list[str]:
    return [
        f"  n_split {p.n_split} (pieces of <= {_piece_width(p)} columns), column bands {p.num_bands}, "
        f"serial passes {p.serial}, tiles used {p.tiles_used} of {p.machine.num_tiles}; "
        f"{p.candidates} partitions scored",
        "",
        f"  {'per tile':<20}{'max':>14}{'mean':>14}",
        f"  {'blocks':<20}{d['blocks_per_tile']['max']:>14d}{d['blocks_per_tile']['mean']:>14.1f}",
        f"  {'memory (KiB)':<20}{d['bytes_per_tile']['max'] / _KIB:>14.1f}{d['bytes_per_tile']['mean'] / _KIB:>14.1f}",
    ]


def _dynamic_partition(p, d: dict) -> list[str]:
    pm, pk, pn = p.split
    return [
        f"  partitions m/k/n {pm}/{pk}/{pn} = {p.num_buckets} tiles of {p.machine.num_tiles} "
        f"({p.rows_per_partition} block rows x {p.cols_per_partition} block cols x <= {_piece_width(p)} columns); "
        f"{p.candidates} partitions scored",
        f"  buckets: {p.num_buckets} x {p.bucket_capacity} blocks (oversize {p.bucket_oversize:g}, "
        f"total {p.total_capacity}); {p.propagation_rounds} propagation rounds",
        "",
        f"  {'per tile':<20}{'max':>14}",
        f"  {'memory (KiB)':<20}{p.bytes_per_tile / _KIB:>14.1f}",
    ]


def report(p) -> str:
    """The report of a :class:`~blocksparse.ipu.Plan` or a :class:`~blocksparse.ipu.DynamicPlan`."""
    d = p.to_dict()
    (m, k), (bh, bw) = p.shape, p.block_size
    if p.kind == "static":
        blocks = f"{d['nnz_blocks']} non-zero blocks (density {d['density']:.4g})"
        partition = _static_partition(p, d)
        work = "useful flops"
    else:
        blocks = f"at most {p.max_nnz_blocks} non-zero blocks (density <= {d['max_density']:.4g})"
        partition = _dynamic_partition(p, d)
        work = "full buckets moved, max_nnz_blocks computed; useful flops at max_nnz_blocks"
    lines = [
        f"{p.kind.capitalize()} block-sparse plan on {p.machine!r}",
        f"  W {m} x {k}, blocks {bh} x {bw}, {blocks}  @  X {k} x {p.n};  {p.dtype} (partials {p.partials_dtype})",
        *partition,
        f"  {'memory limit (KiB)':<20}{p.memory_limit_bytes / _KIB:>14.1f}"
        f"   = {p.available_memory_proportion:g} x {p.machine.tile_memory_bytes / _KIB:g} KiB"
        " (available_memory_proportion x tile memory)",
        "",
        f"  {'phase':<20}{'cycles':>14}{'share':>9}{'exchange MB':>14}",
    ]
    total = p.total_cycles
    for name in p.phases:
        xb = p.exchange_bytes.get(name)
        share = 100.0 * p.cycles[name] / total if total > 0 else 0.0
        lines.append(f"  {name:<20}{p.cycles[name]:>14,.0f}{share:>8.1f}%{'' if xb is None else f'{xb / 1e6:.3f}':>14}")
    lines += [
        f"  {'total':<20}{total:>14,.0f}{100.0 if total > 0 else 0.0:>8.1f}%",
        "",
        f"  estimated {p.seconds * 1e6:,.2f} us at {p.machine.clock_hz / 1e9:g} GHz, {p.tflops:,.2f} TFLOP/s "
        f"({work} {p.flops / 1e9:,.3f} GFLOP)",
    ]
    if p.dense is None:
        lines.append("  dense estimate: does not fit the memory limit; no speedup to report")
    else:
        pm, pk, pn = p.dense.split
        speedup = "none (no non-zero blocks)" if p.speedup is None else f"{p.speedup:.2f}x"
        lines.append(
            f"  dense estimate  {p.dense.seconds * 1e6:,.2f} us, {p.dense.tflops:,.2f} TFLOP/s "
            f"(split m/k/n {pm}/{pk}/{pn});  predicted speedup over dense {speedup}"
        )
    return "\n".join(lines)
