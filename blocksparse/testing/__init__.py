"""Testing helpers shipped with the library: hypothesis strategies and NumPy oracles."""

from . import oracles, strategies

__all__ = ["oracles", "strategies"]
