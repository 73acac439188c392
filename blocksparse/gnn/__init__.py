"""IO-aware GNN operations: graphs, SpMM, max/min aggregation, fused attention, reordering.

Messages flow ``src -> dst``; every op aggregates at the destination over its in-edges. A
:class:`Graph` is host data (``jit`` specialises per graph); a :class:`DynamicGraph` is built
inside ``jit`` from a traced ``edge_index`` with static capacities (one compilation for every
graph of those capacities), and :func:`batch` / :func:`readout` pack and pool mini-batches.
Each op has a pure-JAX reference (segment ops; the oracle and the CPU path) and a Pallas
(Triton) kernel for GPUs; ``implementation=None | "pallas" | "xla"`` picks, as in
:func:`blocksparse.matmul`, and :func:`blocksparse.dispatch_log` records which one ran;
``config=`` (a :class:`GatherConfig` or an :class:`AttentionConfig`) configures the Pallas kernel.

This package is the user-facing API: the graph types live in :mod:`blocksparse.graph` and the ops in
:mod:`blocksparse.ops.gnn`, both below it; it re-exports them and adds the layers, the generators and
reordering.
"""

import importlib

from ..graph import DynamicGraph, Graph, batch, readout
from ..ops import interpret
from ..ops.gnn import AttentionConfig, GatherConfig, GatherVariant
from ..ops.gnn.aggregate import aggregate
from ..ops.gnn.attention import gatv2, graph_attention
from ..ops.gnn.spmm import spmm
from ..sharding import GraphShardPlan, ShardedGraph, plan_graph, shard_graph
from .generators import (
    PAPER_GRAPH_SPECS,
    PAPER_GRAPHS,
    communities,
    community_edges,
    paper_graph,
    paper_graph_edges,
    power_law,
    rmat,
    shuffle_ids,
    synthetic,
)
from .layers import GATv2Conv, GCNConv, TransformerConv
from .reorder import reorder

__all__ = [
    "PAPER_GRAPHS",
    "PAPER_GRAPH_SPECS",
    "AttentionConfig",
    "GATv2Conv",
    "GCNConv",
    "GatherConfig",
    "GatherVariant",
    "TransformerConv",
    "DynamicGraph",
    "Graph",
    "GraphShardPlan",
    "ShardedGraph",
    "aggregate",
    "batch",
    "communities",
    "community_edges",
    "gatv2",
    "graph_attention",
    "interpret",
    "paper_graph",
    "paper_graph_edges",
    "plan_graph",
    "power_law",
    "readout",
    "reorder",
    "rmat",
    "shard_graph",
    "shuffle_ids",
    "spmm",
    "synthetic",
]

_FRAMEWORKS = ("flax", "equinox")


def __getattr__(name):
    # The Flax NNX and Equinox layers import their framework: only on first use, so `import
    # blocksparse` never needs it (and they stay out of __all__ for `from blocksparse.gnn import *`).
    if name in _FRAMEWORKS:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted({*globals(), *_FRAMEWORKS})
