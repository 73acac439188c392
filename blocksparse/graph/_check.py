"""The type check every GNN op starts with; above both graph types (it names them both)."""

from __future__ import annotations

from ._dynamic import DynamicGraph
from ._static import Graph

__all__ = ["check_graph"]


def check_graph(g) -> None:
    """Raise a ``TypeError`` unless ``g`` is a :class:`Graph` or a :class:`DynamicGraph`."""
    if not isinstance(g, Graph | DynamicGraph):
        raise TypeError(f"Expected a blocksparse.gnn.Graph or DynamicGraph. Got {type(g).__name__}.")
