"""Hypothesis strategies for random graphs with the awkward cases GNN kernels must handle.

``graphs()`` draws a :class:`blocksparse.gnn.Graph` that, by default, always has isolated nodes,
self-loops, multi-edges and one node of very high in-degree (a hub), and a low heavy-node
quantile so that the hub's in-edges are split into chunks.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from ..graph import Graph

__all__ = ["edge_lists", "graphs"]


@st.composite
def edge_lists(
    draw,
    *,
    min_nodes: int = 3,
    max_nodes: int = 24,
    max_edges: int = 60,
    hub_in_degree: tuple[int, int] = (129, 300),
    awkward: bool = True,
):
    """Draw ``(src, dst, num_nodes)`` as int32 NumPy arrays.

    With ``awkward=True`` (default) the edge list contains at least one isolated node, a
    self-loop, a repeated edge, and a hub whose in-degree is drawn from ``hub_in_degree``
    (above one 128-edge chunk by default).
    """
    n = draw(st.integers(min_nodes, max_nodes))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    m = draw(st.integers(0, max_edges))
    # the last node stays isolated
    live = max(1, n - 1) if awkward else n
    src = rng.integers(0, live, m)
    dst = rng.integers(0, live, m)
    if awkward:
        hub = int(rng.integers(0, live))
        k = draw(st.integers(*hub_in_degree))
        loop = int(rng.integers(0, live))
        src = np.concatenate([src, rng.integers(0, live, k), [loop, 0, 0]])
        dst = np.concatenate([dst, np.full(k, hub), [loop, live - 1, live - 1]])  # self-loop, multi-edge
        order = rng.permutation(src.size)
        src, dst = src[order], dst[order]
    return src.astype(np.int32), dst.astype(np.int32), n


@st.composite
def graphs(draw, *, heavy_quantile: float | None = None, **kw):
    """Draw a :class:`blocksparse.gnn.Graph`; keyword arguments go to :func:`edge_lists`."""
    src, dst, n = draw(edge_lists(**kw))
    q = draw(st.sampled_from([0.5, 0.9, 0.99])) if heavy_quantile is None else heavy_quantile
    return Graph.from_edges(src, dst, n, heavy_quantile=q)
