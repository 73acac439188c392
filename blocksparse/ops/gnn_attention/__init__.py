"""gnn_attention: dispatch and custom VJP (``api``), pure-JAX reference, Pallas (Triton) kernels."""

from .api import gatv2, graph_attention

__all__ = ["gatv2", "graph_attention"]
