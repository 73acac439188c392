"""The Pallas (Triton lowering) backend of the block-sparse products: ``implementation="pallas"``.

:mod:`.common` (the config, tiles and helpers the kernels share), :mod:`.kernels` (``dsd`` / ``dds`` with their
combine kernel, the dynamic scan, ``sdd``), :mod:`.backend` (:class:`~.backend.PallasBackend`, loaded by the
registry of :mod:`blocksparse.ops.matmul.registry`).
"""

from .common import SUPPORTED_BLOCKS, TritonConfig, kernels_accept
from .kernels import current_config, dds, dsd, dsd_dynamic, run_schedule, sdd, sdd_coords, sdd_splits, tile_for

__all__ = [
    "SUPPORTED_BLOCKS",
    "TritonConfig",
    "current_config",
    "dds",
    "dsd",
    "dsd_dynamic",
    "kernels_accept",
    "run_schedule",
    "sdd",
    "sdd_coords",
    "sdd_splits",
    "tile_for",
]
