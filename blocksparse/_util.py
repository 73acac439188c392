"""Small numeric helpers shared by the host planners and the kernels (one copy each)."""

from __future__ import annotations

import numpy as np

__all__ = ["cdiv", "next_power_of_2"]


def cdiv(a, b):
    """Ceiling division ``ceil(a / b)`` for integers, NumPy arrays and JAX arrays alike."""
    if isinstance(a, int | np.integer) and isinstance(b, int | np.integer):
        return -(-int(a) // int(b))
    if isinstance(a, list | tuple):
        a = np.asarray(a)
    return -(-a // b)


def next_power_of_2(n: int, minimum: int = 1) -> int:
    """The smallest power of two ``>= max(n, minimum)``."""
    n = max(int(n), int(minimum), 1)
    return 1 << (n - 1).bit_length()
