"""blocksparse: block-sparse matrix multiplication for JAX, modelled on Graphcore's PopSparse."""

from . import dynamic, gnn, nn, ops, prune
from . import plan as plan  # the package is callable: bs.plan(W, n, ...) plans
from ._matrix import BlockSparseMatrix, DynamicBlockSparseMatrix, random
from ._pattern import BlockPattern
from .ops import dispatch_log, interpret, matmul, sdd
from .plan import DynamicPlan, dynamic_plan, ipu, simulate, simulate_dynamic

__version__ = "0.1.0"

__all__ = [
    "BlockPattern",
    "BlockSparseMatrix",
    "DynamicBlockSparseMatrix",
    "dispatch_log",
    "dynamic",
    "gnn",
    "interpret",
    "ipu",
    "matmul",
    "nn",
    "ops",
    "plan",
    "prune",
    "random",
    "sdd",
    "simulate",
    "DynamicPlan",
    "dynamic_plan",
    "simulate_dynamic",
]


def __getattr__(name):
    # `testing` needs hypothesis (a test extra): import it on first use, not with the package.
    if name == "testing":
        import importlib

        return importlib.import_module(".testing", __name__)
    raise AttributeError(f"module 'blocksparse' has no attribute {name!r}")
