"""aggregate: dispatch and custom VJP (``api``), pure-JAX reference, Pallas (Triton) kernels."""

from .api import aggregate

__all__ = ["aggregate"]
