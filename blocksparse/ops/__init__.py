"""Operations, one folder each: ``api`` (dispatch, custom VJP), ``reference`` (pure JAX), kernels."""

from ._dispatch import dispatch_log, interpret
from .matmul import get_backend, matmul, register_backend, sdd

__all__ = ["dispatch_log", "get_backend", "interpret", "matmul", "register_backend", "sdd"]
