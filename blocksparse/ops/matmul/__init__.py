from .api import get_backend, matmul, register_backend, sdd

__all__ = ["get_backend", "matmul", "register_backend", "sdd"]
