"""blocksparse: block-sparse matrix multiplication for JAX, modelled on Graphcore's PopSparse.

Where things live (see docs/architecture.md):

- :class:`BlockSparseMatrix` (static pattern) and :class:`DynamicBlockSparseMatrix` (traced
  pattern); :func:`matmul` and :func:`sdd`, dispatched in :mod:`blocksparse.ops`;
- :mod:`blocksparse.ipu`: the IPU model (:func:`plan`, :func:`dynamic_plan`, :func:`simulate`);
- :mod:`blocksparse.gnn`: graphs and the IO-aware GNN operations;
- :mod:`blocksparse.nn` (layers), :mod:`blocksparse.prune`, :mod:`blocksparse.testing`;
- :func:`save` and :func:`load`: checkpoints of any tree of matrices, layers and models, patterns included;
- :mod:`blocksparse.models` (a pretrained encoder to prune; the ``models`` extra) and
  :mod:`blocksparse.bench` (the ``blocksparse bench`` suites), imported on first use.
"""

from importlib.metadata import PackageNotFoundError as _NotFound
from importlib.metadata import version as _version

from . import gnn, ipu, nn, ops, prune
from ._checkpoint import load, register_checkpoint_type, save
from ._matrix import BlockSparseMatrix, DynamicBlockSparseMatrix, concatenate, random
from ._pattern import BlockPattern
from ._util import checkify, runtime_checks
from .ipu import DynamicPlan, NoValidPlanError, Plan, dynamic_plan, plan, simulate, simulate_dynamic
from .ops import dispatch_log, interpret, matmul, sdd
from .sharding import ShardedBlockSparseMatrix, ShardPlan, shard

try:
    __version__ = _version("blocksparse")
except _NotFound:  # running from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "BlockPattern",
    "checkify",
    "concatenate",
    "runtime_checks",
    "BlockSparseMatrix",
    "DynamicBlockSparseMatrix",
    "DynamicPlan",
    "NoValidPlanError",
    "Plan",
    "dispatch_log",
    "dynamic_plan",
    "gnn",
    "interpret",
    "ipu",
    "load",
    "matmul",
    "nn",
    "ops",
    "plan",
    "prune",
    "random",
    "register_checkpoint_type",
    "save",
    "sdd",
    "shard",
    "ShardedBlockSparseMatrix",
    "ShardPlan",
    "simulate",
    "simulate_dynamic",
]


def __getattr__(name):
    # `testing` needs hypothesis (a test extra), `models` safetensors and tokenizers (the models
    # extra), `bench` is only for measuring: import them on first use, not with the package.
    if name in ("testing", "models", "bench"):
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'blocksparse' has no attribute {name!r}")
