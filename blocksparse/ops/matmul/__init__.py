from .api import dispatch_log, get_backend, matmul, register_backend, sdd

__all__ = ["dispatch_log", "get_backend", "matmul", "register_backend", "sdd"]
