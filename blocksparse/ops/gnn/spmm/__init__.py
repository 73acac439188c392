"""spmm: dispatch and custom VJP (``api``), pure-JAX reference, Pallas (Triton) kernels."""

from .api import spmm

__all__ = ["spmm"]
