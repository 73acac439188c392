"""attention: dispatch and custom VJP (``api``), pure-JAX reference, Pallas (Triton) kernels."""

from ..config import LAYOUTS, AttentionConfig
from .api import gatv2, graph_attention

__all__ = ["LAYOUTS", "AttentionConfig", "gatv2", "graph_attention"]
