"""The GNN operations, one folder each, the same shape as ``ops/matmul``.

Each op folder (``spmm/``, ``aggregate/``, ``attention/``) holds ``api.py`` (the public op: validation,
dispatch, the custom VJP), ``reference.py`` (pure JAX: the fallback on every machine and the oracle) and
``pallas_triton.py`` (the Pallas kernels). Beside them:

* ``registry`` -- the one registry of backends (implementation name -> the op folder's module);
* ``order`` -- the one place that decides what runs: the backends' order and the kernels' default variants;
* ``tuned`` -- the kernels' measured numbers, as data keyed by device kind;
* ``config`` -- :class:`GatherConfig` / :class:`GatherVariant` and :class:`AttentionConfig`, passed as ``config=``;
* ``triton_common`` -- the machinery the kernels share.

The graph types they consume live below them, in :mod:`blocksparse.graph`; users reach everything through
:mod:`blocksparse.gnn` (``bs.gnn.spmm``, ...). This package re-exports only the configs: the names
``spmm`` / ``aggregate`` / ``attention`` here are the op folders (``blocksparse.ops.gnn.spmm.spmm`` is the op).
"""

from .config import LAYOUTS, AttentionConfig, GatherConfig, GatherVariant

__all__ = ["LAYOUTS", "AttentionConfig", "GatherConfig", "GatherVariant"]
