"""The backends of the block-sparse products, by name: the one registry (``implementation=`` names).

Each name maps to a backend object with the ops' methods (``dsd``, ``dds``, ``sdd``, ``dyn_dsd``, ``dyn_sdd``
and the ``*_fused`` ones), loaded lazily from :data:`PATHS` or registered with :func:`register_backend`.
Registering one affects functions traced afterwards.
"""

from __future__ import annotations

import importlib

__all__ = ["PATHS", "get_backend", "register_backend"]

#: name -> "module:attribute" of a backend object; loaded on first use.
PATHS = {
    "xla": "blocksparse.ops.matmul.reference:XlaBackend",
    "pallas": "blocksparse.ops.matmul.triton.backend:PallasBackend",
    "mosaic": "blocksparse.ops.matmul.mosaic.backend:MosaicBackend",
}
_BACKENDS: dict[str, object] = {}


def register_backend(name: str, backend) -> None:
    """Register (or replace) a backend object under ``name``."""
    _BACKENDS[name] = backend


def get_backend(name: str):
    """The backend object registered (or loaded) under ``name``."""
    if name not in _BACKENDS:
        if name not in PATHS:
            raise ValueError(f"Expected an implementation in {sorted(PATHS)}. Got {name!r}.")
        mod, attr = PATHS[name].split(":")
        _BACKENDS[name] = getattr(importlib.import_module(mod), attr)()
    return _BACKENDS[name]
