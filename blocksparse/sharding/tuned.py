"""The measured rates that steer the sharding plans' choice (``bs.shard``, ``shard_graph``), keyed by device kind.

Key layout: ``RATES[kind]`` -> :class:`Rates`, ``kind`` being ``jax.Device.device_kind`` as
:func:`blocksparse.hardware.kind` reports it (``"NVIDIA H200"``). Each field of a :class:`Rates` is a
:class:`Rate`: its ``value`` and its ``source``, the ``blocksparse bench`` suite and cell that measured it and
the results JSON in benchmarks/results/ behind it (or, said so, the datasheet figure it is). :func:`rates`
looks a kind up; a kind not in the table gets the entry of :data:`DEFAULT_KIND`.

The estimates only rank candidates (every candidate computes the same result on every device), so the rates
matter through their ratios. To add a device: run ``blocksparse bench --suite sharded --full`` (and the
``gnn-variants`` suite for the per-edge rate) on it and add its entry.
"""

from __future__ import annotations

import dataclasses

from .. import hardware

__all__ = ["DEFAULT_KIND", "RATES", "Rate", "Rates", "rates"]


@dataclasses.dataclass(frozen=True)
class Rate:
    """One rate and where it came from."""

    value: float
    source: str


@dataclasses.dataclass(frozen=True)
class Rates:
    """The rates of one device kind.

    Attributes:
        link_bytes_per_s: bytes one device receives per second from the others of the mesh axis (both plans:
            what the collectives bring).
        block_flops_per_s: ``bs.matmul`` on one device, flop/s on the non-zero blocks (the matrix plan: the
            busiest device's blocks).
        edge_bytes_per_s: feature bytes gathered per second, per edge, by SpMM on a traced graph on one device
            (the graph plan: each part's edges).
        node_bytes_per_s: node-row bytes written or read per second outside the edge loops (the graph plan:
            the passes over node rows).
    """

    link_bytes_per_s: Rate
    block_flops_per_s: Rate
    edge_bytes_per_s: Rate
    node_bytes_per_s: Rate


RATES: dict[str, Rates] = {
    "NVIDIA H200": Rates(
        link_bytes_per_s=Rate(
            2.7e11,
            "two H200s of one host (NVLink, NCCL_NVLS_ENABLE=0): a plain lax.psum of 512 MiB per GPU, timed with the "
            "matrix script that became bench --suite sharded (in no results file); the same rate as bench --suite "
            "sharded --full: graph cell collective_only (one collective permute of 256 MiB per device; "
            "benchmarks/results/sharded_gnn_h200x2_run1.json to _run4.json)",
        ),
        block_flops_per_s=Rate(
            3.9e14,
            "bench --suite sharded --full: matrix cell sparse_1dev (bs.matmul on one GPU, 32768 x 32768 at b = 64, "
            "d = 1/16, bf16, @ 32768 x 8192; 2 * 64 * 64 * 8192 flop per non-zero block over the loop time; "
            "benchmarks/results/sharded_h200x2.json)",
        ),
        edge_bytes_per_s=Rate(
            4.2e12,
            "bench --suite gnn-variants --full: spmm_sum fwd on the traced graph (DynamicGraph), power_law(262144, "
            "8388608), F = 128, fp32; 512 B per edge over the time (benchmarks/results/gnn_dynamic_h200.json)",
        ),
        node_bytes_per_s=Rate(
            hardware.H200.hbm_bytes_per_s,
            "datasheet, not measured: the H200's HBM bandwidth (blocksparse.hardware.H200.hbm_bytes_per_s)",
        ),
    ),
}

#: The entry every kind not in :data:`RATES` gets: the H200's, the only device measured, as plans made off a GPU
#: assume an H200 (:data:`blocksparse.hardware.PLANNING_DEFAULT`). A conservative choice for a ranking: it invents
#: no rate, and a CPU mesh (tests, docs) or an unmeasured GPU plans as an H200 would (the plans from before this
#: table); no candidate is unsafe on any device, only slower.
DEFAULT_KIND = hardware.PLANNING_DEFAULT.kind


def rates(kind: str | None = None) -> Rates:
    """The :class:`Rates` of device kind ``kind`` (``None``: :func:`blocksparse.hardware.kind`, at call time)."""
    kind = hardware.kind() if kind is None else kind
    return RATES.get(kind, RATES[DEFAULT_KIND])
