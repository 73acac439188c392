"""Node reordering: reverse Cuthill-McKee (bandwidth) or degree (hubs first).

Reordering renumbers nodes so that neighbours have nearby ids: gathers of neighbour rows then hit
the cache more often. It helps gather-heavy (neighbour-parallel) kernels on graphs whose feature
matrix does not fit in the L2 cache; see docs/gnn.md and docs/benchmarks.md for measurements.
"""

from __future__ import annotations

import numpy as np

from ..graph import Graph

__all__ = ["reorder"]


def _rcm(g: Graph) -> np.ndarray:
    try:
        import scipy.sparse as sp
        from scipy.sparse.csgraph import reverse_cuthill_mckee
    except ImportError as e:  # pragma: no cover - scipy is a test dependency
        raise ImportError("reorder(method='rcm') needs scipy (pip install blocksparse[scipy])") from e
    n = g.num_nodes
    a = sp.coo_matrix((np.ones(g.num_edges, np.int8), (g.dst, g.src)), shape=(n, n)).tocsr()
    sym = (a + a.T).tocsr()
    sym.data[:] = 1
    return np.asarray(reverse_cuthill_mckee(sym, symmetric_mode=True), np.int64)


def reorder(g: Graph, method: str = "rcm") -> tuple[Graph, np.ndarray]:
    """Renumber the nodes of ``g``.

    Arguments:
        g: the :class:`Graph`.
        method: ``"rcm"`` (reverse Cuthill-McKee on the symmetrised graph) or ``"degree"``
            (decreasing total degree, ties by old id).

    Returns:
        ``(g2, perm)``: new node ``k`` is old node ``perm[k]``. Edges keep their order, so edge
        weights carry over unchanged. Use ``x[perm]`` as ``g2``'s features and map results back
        with ``y2[np.argsort(perm)]``.
    """
    if not isinstance(g, Graph):
        raise TypeError(f"Expected a blocksparse.gnn.Graph. Got {type(g).__name__}.")
    if method == "rcm":
        perm = _rcm(g)
    elif method == "degree":
        deg = g.in_degree.astype(np.int64) + g.out_degree
        perm = np.argsort(-deg, kind="stable")
    else:
        raise ValueError(f"Expected method in ['rcm', 'degree']. Got {method!r}.")
    inv = np.empty_like(perm)
    inv[perm] = np.arange(perm.size)
    g2 = Graph.from_edges(inv[g.src], inv[g.dst], g.num_nodes, heavy_quantile=g.heavy_quantile, name=g.name)
    return g2, perm.astype(np.int32)
