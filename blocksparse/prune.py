"""Block pruning: turn a dense weight into a block-sparse one."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ._matrix import BlockSparseMatrix, _check_floating, _require_host
from ._pattern import BlockPattern, check_block_size, check_density

__all__ = ["magnitude", "block_norms"]

_ORDS = {"l1": 1, "l2": 2, "max": np.inf}


def block_norms(w, block_size, norm: str = "l2") -> np.ndarray:
    """Norm of each ``bh x bw`` block of a concrete 2-D ``w``: an array of shape ``(m // bh, k // bw)``."""
    _require_host("bs.prune.block_norms", w=w)
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

    Ties are broken by position (row-major, earlier first), so the result is deterministic. A block
    holding NaN has no rank and raises. The pattern is host data: call it outside ``jit``.

    Arguments:
        w: a concrete dense ``(m, k)`` floating array.
        block_size: ``b`` or ``(bh, bw)``, dividing ``w.shape``.
        density: fraction of blocks kept, in ``[0, 1]``.
        norm: ``"l2"`` (default), ``"l1"`` or ``"max"``.

    Returns:
        A :class:`BlockSparseMatrix` with ``w``'s values on the kept blocks.
    """
    _require_host("bs.prune.magnitude", w=w, density=density)
    w = jnp.asarray(w)
    _check_floating(w.dtype, "w")
    density = check_density(density)
    scores = block_norms(w, block_size, norm)
    if np.isnan(scores).any():
        r, c = (int(i) for i in np.argwhere(np.isnan(scores))[0])
        bh, bw = check_block_size(w.shape, block_size)
        raise ValueError(
            f"Expected w without NaN. Got NaN in block ({r}, {c}) (rows {r * bh}:{(r + 1) * bh}, "
            f"cols {c * bw}:{(c + 1) * bw}); its norm cannot be ranked, so it would be dropped silently."
        )
    keep = int(round(density * scores.size))
    order = np.argsort(-scores.reshape(-1), kind="stable")[:keep]
    mask = np.zeros(scores.size, bool)
    mask[order] = True
    bh, bw = check_block_size(w.shape, block_size)
    pattern = BlockPattern.from_mask(mask.reshape(scores.shape), (bh, bw))
    return BlockSparseMatrix.from_mask(pattern.mask(), w, (bh, bw))
