"""Node reordering: reverse Cuthill-McKee (bandwidth), clusters (communities together) or degree (hubs first).

Reordering renumbers nodes so that neighbours have nearby ids: gathers of neighbour rows then hit
the cache more often. It helps gather-heavy (neighbour-parallel) kernels on graphs whose feature
matrix does not fit in the L2 cache; see docs/gnn.md and docs/benchmarks.md for measurements.
"""

from __future__ import annotations

import numpy as np

from ..graph import Graph

__all__ = ["reorder"]


#: Label propagation's rounds at most, and the fraction of nodes whose label may still change when it stops.
CLUSTER_ROUNDS = 30
CLUSTER_SETTLED = 1e-3


def _symmetric(g: Graph, method: str):
    """The symmetrised adjacency of ``g`` as a SciPy CSR matrix of ones (repeated edges once)."""
    try:
        import scipy.sparse as sp
    except ImportError as e:  # pragma: no cover - scipy is a test dependency
        raise ImportError(f"reorder(method={method!r}) needs scipy (pip install blocksparse[scipy])") from e
    n = g.num_nodes
    a = sp.coo_matrix((np.ones(g.num_edges, np.int32), (g.dst, g.src)), shape=(n, n)).tocsr()  # (repeats: summed)
    sym = (a + a.T).tocsr()
    sym.data[:] = 1
    return sym


def _rcm(g: Graph) -> np.ndarray:
    from scipy.sparse.csgraph import reverse_cuthill_mckee

    return np.asarray(reverse_cuthill_mckee(_symmetric(g, "rcm"), symmetric_mode=True), np.int64)


def _clusters(g: Graph, seed: int = 0) -> np.ndarray:
    """Nodes grouped by the clusters that label propagation finds on the symmetrised graph, ties by old id.

    Each node starts in a cluster of its own; each round, a random half of the nodes take the label most frequent
    among their neighbours (ties: the smallest label), until at most :data:`CLUSTER_SETTLED` of them change or
    :data:`CLUSTER_ROUNDS` rounds have run (updating half at a time keeps two neighbours from swapping labels
    forever). A round sorts one key per symmetrised edge."""
    sym = _symmetric(g, "clusters")
    n = g.num_nodes
    rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(sym.indptr))
    cols = sym.indices.astype(np.int64)
    has = np.diff(sym.indptr) > 0
    label = np.arange(n, dtype=np.int64)
    rng = np.random.default_rng(seed)
    for _ in range(CLUSTER_ROUNDS):
        key = np.sort(rows * n + label[cols])  # (node, neighbour's label), grouped
        first = np.concatenate([[True], key[1:] != key[:-1]]) if key.size else np.zeros(0, bool)
        starts = np.flatnonzero(first)
        count = np.diff(np.append(starts, key.size))
        node, lab = np.divmod(key[starts], n)
        score = count * n + (n - 1 - lab)  # most frequent first, then the smallest label
        node_start = np.flatnonzero(np.concatenate([[True], node[1:] != node[:-1]])) if node.size else starts
        best = np.maximum.reduceat(score, node_start) if node.size else score
        want = label.copy()
        want[node[node_start]] = (n - 1) - best % n
        move = (want != label) & has & (rng.random(n) < 0.5)
        label[move] = want[move]
        if move.sum() <= CLUSTER_SETTLED * n:
            break
    return np.lexsort((np.arange(n), label))


def reorder(g: Graph, method: str = "rcm") -> tuple[Graph, np.ndarray]:
    """Renumber the nodes of ``g``.

    Arguments:
        g: the :class:`Graph`.
        method: ``"rcm"`` (reverse Cuthill-McKee on the symmetrised graph: a narrow band, for meshes and road
            networks), ``"clusters"`` (the clusters that label propagation finds, each one's nodes together: for
            graphs of communities, whose cross edges make RCM's band wide) or ``"degree"`` (decreasing total
            degree, ties by old id). RCM and the clusters run on the host with SciPy; the clusters take a few
            rounds, each sorting one key per edge (tens of seconds at 10^7 edges).

    Returns:
        ``(g2, perm)``: new node ``k`` is old node ``perm[k]``. Edges keep their order, so edge
        weights carry over unchanged. Use ``x[perm]`` as ``g2``'s features and map results back
        with ``y2[np.argsort(perm)]``.
    """
    if not isinstance(g, Graph):
        raise TypeError(f"Expected a blocksparse.gnn.Graph. Got {type(g).__name__}.")
    if method == "rcm":
        perm = _rcm(g)
    elif method == "clusters":
        perm = _clusters(g)
    elif method == "degree":
        deg = g.in_degree.astype(np.int64) + g.out_degree
        perm = np.argsort(-deg, kind="stable")
    else:
        raise ValueError(f"Expected method in ['rcm', 'clusters', 'degree']. Got {method!r}.")
    inv = np.empty_like(perm)
    inv[perm] = np.arange(perm.size)
    g2 = Graph.from_edges(inv[g.src], inv[g.dst], g.num_nodes, heavy_quantile=g.heavy_quantile, name=g.name)
    return g2, perm.astype(np.int32)
