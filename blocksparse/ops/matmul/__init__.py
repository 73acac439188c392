"""Block-sparse products: the public ops, the order of their backends, the backends.

:mod:`.api` (``matmul``, ``sdd`` and their validation), :mod:`.vjp` (the custom VJPs), :mod:`.order` (the one place
that orders the backends, forward and backward), :mod:`.tuned` (the measured numbers, by device kind),
:mod:`.registry` (the backends by name), :mod:`.schedule` (the work list the kernels consume), :mod:`.reference`
(pure JAX, ``"xla"``), :mod:`.epilogue`, and the backends :mod:`.triton` (``"pallas"``) and :mod:`.mosaic`
(``"mosaic"``).
"""

from .api import get_backend, matmul, register_backend, sdd
from .mosaic import BandConfig, DdsConfig, MosaicConfig, SddConfig
from .triton import TritonConfig

__all__ = [
    "BandConfig",
    "DdsConfig",
    "MosaicConfig",
    "SddConfig",
    "TritonConfig",
    "get_backend",
    "matmul",
    "register_backend",
    "sdd",
]
