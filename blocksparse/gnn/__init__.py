"""IO-aware GNN operations: graphs, SpMM, max/min aggregation, fused attention, reordering.

Messages flow ``src -> dst``; every op aggregates at the destination over its in-edges.
Each op has a pure-JAX reference (segment ops; the oracle and the CPU path) and a Pallas
(Triton) kernel for GPUs; ``implementation=None | "pallas" | "xla"`` picks, as in
:func:`blocksparse.matmul`, and :func:`blocksparse.dispatch_log` records which one ran.
"""

from ._dispatch import interpret
from ._graph import Graph
from .attention import gatv2, graph_attention
from .generators import PAPER_GRAPHS, power_law, rmat, synthetic
from .reductions import aggregate
from .reorder import reorder
from .spmm import spmm

__all__ = [
    "PAPER_GRAPHS",
    "Graph",
    "aggregate",
    "gatv2",
    "graph_attention",
    "interpret",
    "power_law",
    "reorder",
    "rmat",
    "spmm",
    "synthetic",
]
