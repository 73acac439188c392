"""gnn_attention: dispatch and custom VJP (``api``), pure-JAX reference, Pallas (Triton) kernels."""

from .api import gatv2, graph_attention
from .config import LAYOUTS, AttentionConfig

__all__ = ["LAYOUTS", "AttentionConfig", "gatv2", "graph_attention"]
