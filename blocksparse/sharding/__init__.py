"""One block-sparse matrix, or one graph, partitioned over the devices of a mesh axis.

- :mod:`.matrix`: :func:`shard` a :class:`~blocksparse.BlockSparseMatrix` (``Ws @ x``, :func:`matmul`);
- :mod:`.graph`: :func:`shard_graph` / :func:`plan_graph` a graph for the GNN ops (:func:`spmm`,
  :func:`aggregate`; ``bs.gnn.spmm`` / ``bs.gnn.aggregate`` hand a :class:`ShardedGraph` to them).

Both cut contiguous ranges of lines (block lines, destination nodes) and rank their candidates by one
time estimate; the cut search and the cost helpers live in :mod:`._cuts`, the measured rates the estimate
uses in :mod:`.tuned` (keyed by device kind). ``bs.shard`` and ``bs.gnn.shard_graph`` re-export from here.
"""

from .graph import GraphShardCandidate, GraphShardPlan, ShardedGraph, aggregate, plan_graph, shard_graph, spmm
from .matrix import ShardCandidate, ShardedBlockSparseMatrix, ShardPlan, matmul, shard

__all__ = [
    "GraphShardCandidate",
    "GraphShardPlan",
    "ShardCandidate",
    "ShardPlan",
    "ShardedBlockSparseMatrix",
    "ShardedGraph",
    "aggregate",
    "matmul",
    "plan_graph",
    "shard",
    "shard_graph",
    "spmm",
]
