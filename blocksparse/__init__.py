"""blocksparse: block-sparse matrix multiplication for JAX, modelled on Graphcore's PopSparse."""

from . import ops
from ._matrix import BlockSparseMatrix, DynamicBlockSparseMatrix, random
from ._pattern import BlockPattern
from .ops import dispatch_log, matmul, sdd

__version__ = "0.1.0"

__all__ = [
    "BlockPattern",
    "BlockSparseMatrix",
    "DynamicBlockSparseMatrix",
    "dispatch_log",
    "matmul",
    "ops",
    "random",
    "sdd",
]
