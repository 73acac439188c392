"""The Pallas (Triton lowering) backend of the block-sparse products: ``implementation="pallas"``.

:mod:`.common` (the config, tiles and helpers the kernels share), :mod:`.kernels` (``dsd`` / ``dds`` with their
combine kernel, the dynamic scan, ``sdd``), :mod:`.stream` (the one-launch few-token ``x @ W`` / ``W @ x`` of
decoding), :mod:`.grouped_kernel` (``x @ W`` / ``W @ x`` of small blocks on the grouped plan: by config, or by
default where the measured rule claims the product),
:mod:`.backend` (:class:`~.backend.PallasBackend`, loaded by the registry of :mod:`blocksparse.ops.matmul.registry`).
"""

from .common import SUPPORTED_BLOCKS, TritonConfig, kernels_accept
from .kernels import dds, dsd, dsd_dynamic, run_schedule, sdd, sdd_coords, sdd_splits, tile_for

__all__ = [
    "SUPPORTED_BLOCKS",
    "TritonConfig",
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
