"""Operations, one folder each: ``api`` (dispatch, custom VJP), ``reference`` (pure JAX), kernels.

Besides the user's names (``interpret``, ``dispatch_log``, the products and the backend registry), the dispatch
helpers the packages above build their own ops with: :func:`resolve` (an ``implementation`` argument as names),
:func:`record` (an op's entry in :func:`dispatch_log`) and :func:`varying_axes` (the ``shard_map`` axes an array
varies over).
"""

from ._dispatch import dispatch_log, interpret, record, resolve, varying_axes
from .matmul import get_backend, matmul, register_backend, sdd

__all__ = [
    "dispatch_log",
    "get_backend",
    "interpret",
    "matmul",
    "record",
    "register_backend",
    "resolve",
    "sdd",
    "varying_axes",
]
