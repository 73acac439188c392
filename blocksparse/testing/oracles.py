"""Float64 NumPy oracles and dtype-fitting tolerances for block-sparse ops."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

__all__ = ["to_dense64", "tolerance", "assert_close"]

# Relative tolerance per output dtype, applied to the sum of absolute products (an error bound
# for float32 accumulation followed by rounding to the output dtype).
_RTOL = {jnp.dtype(jnp.float32): 2e-5, jnp.dtype(jnp.float16): 2e-3, jnp.dtype(jnp.bfloat16): 1.6e-2}


def tolerance(dtype) -> float:
    return _RTOL.get(jnp.dtype(dtype), 1e-12)


def to_dense64(mat) -> np.ndarray:
    """Dense float64 copy of a static or dynamic block-sparse matrix, computed in NumPy.

    For dynamic matrices, positions ``>= nnz`` are ignored and duplicates add up.
    """
    from .._matrix import DynamicBlockSparseMatrix

    (m, k), (bh, bw) = mat.shape, mat.block_size
    out = np.zeros((m // bh, k // bw, bh, bw))
    data = np.asarray(mat.data, np.float64)
    if isinstance(mat, DynamicBlockSparseMatrix):
        n = int(mat.nnz)
        np.add.at(out, (np.asarray(mat.rows)[:n], np.asarray(mat.cols)[:n]), data[:n])
    else:
        out[mat.pattern.rows, mat.pattern.cols] = data
    return out.swapaxes(1, 2).reshape(m, k)


def assert_close(actual, expected, scale, dtype, what: str = "result") -> None:
    """``|actual - expected| <= tol(dtype) * (scale + 1)`` elementwise, with a useful message.

    ``scale`` bounds the magnitude of the exact result, e.g. ``|A| @ |B|``.
    """
    actual = np.asarray(jnp.asarray(actual, jnp.float32), np.float64)
    expected = np.asarray(expected, np.float64)
    if actual.shape != expected.shape:
        raise AssertionError(f"{what}: expected shape {expected.shape}. Got {actual.shape}.")
    bound = tolerance(dtype) * (np.asarray(scale, np.float64) + 1.0)
    err = np.abs(actual - expected)
    bad = ~(err <= bound)
    if bad.any():
        i = np.unravel_index(np.argmax(np.where(bad, err - bound, -np.inf)), err.shape)
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {err.size} entries out of tolerance ({jnp.dtype(dtype)}); "
            f"worst at {tuple(int(j) for j in i)}: got {actual[i]:.6g}, expected {expected[i]:.6g}, "
            f"bound {bound[i] if np.ndim(bound) else bound:.3g}."
        )
