"""Implementation choice for the GNN ops: the shared mechanism of :mod:`blocksparse.ops._dispatch`."""

from ..ops._dispatch import check_choice, cotangent_like, interpret, pallas_mode, resolve, run

__all__ = ["check_choice", "cotangent_like", "interpret", "pallas_mode", "resolve", "run"]
