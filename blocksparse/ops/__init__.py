"""Operations, one folder each: ``api`` (dispatch, custom VJP), ``reference`` (pure JAX), kernels."""

from .matmul import dispatch_log, get_backend, matmul, register_backend, sdd

__all__ = ["dispatch_log", "get_backend", "matmul", "register_backend", "sdd"]
