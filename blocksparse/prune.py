"""Block pruning: turn a dense weight into a block-sparse one."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ._matrix import BlockSparseMatrix, _check_floating
from ._pattern import BlockPattern, check_block_size

__all__ = ["magnitude", "block_norms"]

_ORDS = {"l1": 1, "l2": 2, "max": np.inf}


def block_norms(w, block_size, norm: str = "l2") -> np.ndarray:
    """Norm of each ``bh x bw`` block of a concrete 2-D ``w``: an array of shape ``(m // bh, k // bw)``."""
    w = np.asarray(w, np.float32)
    if w.ndim != 2:
        raise ValueError(f"Expected a 2-D weight. Got shape {w.shape}.")
    if norm not in _ORDS:
        raise ValueError(f"Expected norm in {sorted(_ORDS)}. Got {norm!r}.")
    bh, bw = check_block_size(w.shape, block_size)
    blocks = np.abs(w.reshape(w.shape[0] // bh, bh, w.shape[1] // bw, bw))
    if norm == "l1":
        return blocks.sum(axis=(1, 3))
    if norm == "max":
        return blocks.max(axis=(1, 3), initial=0.0)
    return np.sqrt((blocks.astype(np.float64) ** 2).sum(axis=(1, 3)))


def magnitude(w, block_size, density: float, *, norm: str = "l2") -> BlockSparseMatrix:
    """Keep the ``round(density * blocks)`` blocks of ``w`` with the largest norm.

    Ties are broken by position (row-major, earlier first), so the result is deterministic.

    Arguments:
        w: a concrete dense ``(m, k)`` floating array.
        block_size: ``b`` or ``(bh, bw)``, dividing ``w.shape``.
        density: fraction of blocks kept, in ``[0, 1]``.
        norm: ``"l2"`` (default), ``"l1"`` or ``"max"``.

    Returns:
        A :class:`BlockSparseMatrix` with ``w``'s values on the kept blocks.
    """
    w = jnp.asarray(w)
    _check_floating(w.dtype, "w")
    if not 0.0 <= float(density) <= 1.0:
        raise ValueError(f"Expected density in [0, 1]. Got {density}.")
    scores = block_norms(w, block_size, norm)
    keep = int(round(float(density) * scores.size))
    order = np.argsort(-scores.reshape(-1), kind="stable")[:keep]
    mask = np.zeros(scores.size, bool)
    mask[order] = True
    bh, bw = check_block_size(w.shape, block_size)
    pattern = BlockPattern.from_mask(mask.reshape(scores.shape), (bh, bw))
    return BlockSparseMatrix.from_mask(pattern.mask(), w, (bh, bw))
