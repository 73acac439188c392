"""blocksparse: block-sparse matrix multiplication for JAX, modelled on Graphcore's PopSparse."""

from . import nn, ops, prune
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
    "nn",
    "ops",
    "prune",
    "random",
    "sdd",
]


def __getattr__(name):
    # `testing` needs hypothesis (a test extra): import it on first use, not with the package.
    if name == "testing":
        import importlib

        return importlib.import_module(".testing", __name__)
    raise AttributeError(f"module 'blocksparse' has no attribute {name!r}")
