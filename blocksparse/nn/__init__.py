"""Layers: plain pytrees (:class:`SparseLinear`, :class:`Linear`) and framework modules.

- :class:`SparseLinear`: ``activation(x @ W + b)`` with a block-sparse ``W (in, out)``;
- :class:`Linear`: the same with a dense ``W`` (the dense baseline, same interface);
- ``bs.nn.flax``: Flax NNX modules (imported on first use; needs ``pip install 'blocksparse[flax]'``);
- ``bs.nn.equinox``: Equinox modules (imported on first use; needs ``pip install 'blocksparse[equinox]'``).
"""

import importlib

from ._linear import ACTIVATIONS, LAYOUTS, Linear, SparseLinear, random_pattern

# Not the framework modules: `from blocksparse.nn import *` must not need Flax or Equinox.
__all__ = ["ACTIVATIONS", "LAYOUTS", "Linear", "SparseLinear", "random_pattern"]

_FRAMEWORKS = ("flax", "equinox")


def __getattr__(name):
    # The framework modules import their framework: only on first use, so `import blocksparse` never needs it.
    if name in _FRAMEWORKS:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted({*globals(), *_FRAMEWORKS})
