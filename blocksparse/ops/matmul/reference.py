"""Pure-JAX block-sparse products: the fallback on every machine and the oracle for every kernel.

Gather the dense operand's block rows, multiply block by block (a batched dot), segment-sum the
partial products into the output block rows. No dense ``m x k`` intermediate is formed; the
per-block partials are bounded by processing blocks in chunks (see ``_CHUNK_BYTES``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ..._pattern import BlockPattern
from . import epilogue as _epilogue

# Upper bound on the bytes of per-block partial products held at once by the reference path.
_CHUNK_BYTES = 1 << 28


def acc_dtype(*dtypes) -> jnp.dtype:
    """Accumulation dtype: float32 for half types, else the promoted type."""
    dt = jnp.result_type(*dtypes)
    return jnp.dtype(jnp.float32) if jnp.finfo(dt).bits < 32 else jnp.dtype(dt)


def _chunks(nnz: int, per_block_bytes: int) -> int:
    """Number of blocks per chunk so that one chunk's partials fit in ``_CHUNK_BYTES``."""
    return max(1, min(nnz, _CHUNK_BYTES // max(per_block_bytes, 1)))


def coo_dsd(rows, cols, data, x, grid_m: int, *, sorted_rows: bool, out_dtype, precision=None) -> jax.Array:
    """``W @ x`` for ``W`` given as block COO (``rows``, ``cols``, ``data (nnz, bh, bw)``); ``x (k, n)``.

    Blocks whose row is ``>= grid_m`` are dropped (that is how callers mask padding).
    """
    nnz, bh, bw = data.shape
    k, n = x.shape
    acc = acc_dtype(data.dtype, x.dtype)
    xb = x.reshape(k // bw, bw, n)
    if nnz == 0 or n == 0 or k == 0:  # nothing to gather from (k == 0) or to compute
        return jnp.zeros((grid_m * bh, n), out_dtype)

    def part(r, c, d):
        prod = jnp.einsum("zij,zjn->zin", d, xb[c], precision=precision, preferred_element_type=acc)
        return jax.ops.segment_sum(prod, r, num_segments=grid_m, indices_are_sorted=sorted_rows)

    chunk = _chunks(nnz, (bh + bw) * n * acc.itemsize)
    if chunk >= nnz:
        y = part(rows, cols, data)
    else:
        pad = -nnz % chunk
        r = jnp.pad(rows, (0, pad), constant_values=grid_m).reshape(-1, chunk)
        c = jnp.pad(cols, (0, pad)).reshape(-1, chunk)
        d = jnp.pad(data, ((0, pad), (0, 0), (0, 0))).reshape(-1, chunk, bh, bw)
        y = jax.lax.fori_loop(0, r.shape[0], lambda i, y: y + part(r[i], c[i], d[i]), jnp.zeros((grid_m, bh, n), acc))
    return y.reshape(grid_m * bh, n).astype(out_dtype)


def coo_sdd(a, b, rows, cols, block_size, *, out_dtype, precision=None) -> jax.Array:
    """``(a @ b)`` sampled at the blocks ``(rows, cols)``: returns ``(nnz, bh, bw)``."""
    bh, bw = block_size
    m, n = a.shape
    _, k = b.shape
    nnz = rows.shape[0]
    acc = acc_dtype(a.dtype, b.dtype)
    if nnz == 0 or m == 0 or k == 0:  # no blocks, or none can be in range (dynamic padding)
        return jnp.zeros((nnz, bh, bw), out_dtype)
    ab = a.reshape(m // bh, bh, n)
    bb = b.reshape(n, k // bw, bw).swapaxes(0, 1)  # (k // bw, n, bw)

    def part(r, c):
        return jnp.einsum("zin,znj->zij", ab[r], bb[c], precision=precision, preferred_element_type=acc).astype(
            out_dtype
        )

    chunk = _chunks(nnz, (bh + bw) * n * a.dtype.itemsize)
    if chunk >= nnz:
        return part(rows, cols)
    pad = -nnz % chunk
    r = jnp.pad(rows, (0, pad)).reshape(-1, chunk)
    c = jnp.pad(cols, (0, pad)).reshape(-1, chunk)
    out = jax.lax.map(lambda rc: part(*rc), (r, c))
    return out.reshape(-1, bh, bw)[:nnz]


def poison(valid, y):
    """``y`` where the dynamic input is valid, NaN everywhere otherwise."""
    return jnp.where(valid, y, jnp.asarray(jnp.nan, y.dtype))


def transposed(pattern: BlockPattern, data):
    """The cached transposed pattern and ``data`` laid out for it (blocks permuted and transposed)."""
    t, perm = pattern.transpose()
    return t, data[np.asarray(perm)].swapaxes(-1, -2)


class XlaBackend:
    """The reference backend: the specification every kernel is tested against.

    Every backend implements these methods; each takes the call's
    :class:`~blocksparse.ops.matmul.api.OpStatic` first, then the arrays.
    """

    name = "xla"

    def dsd(self, s, data, x):
        p = s.pattern
        return coo_dsd(
            jnp.asarray(p.rows), jnp.asarray(p.cols), data, x, p.grid[0],
            sorted_rows=True, out_dtype=s.out_dtype, precision=s.precision,
        )  # fmt: skip

    def dds(self, s, x, data):
        # x (B, m) @ W (m, k) = (W^T @ x^T)^T, on the cached transposed pattern.
        t, data_t = transposed(s.pattern, data)
        return self.dsd(s.but(pattern=t), data_t, x.T).T

    def sdd(self, s, a, b):
        p = s.pattern
        return coo_sdd(a, b, jnp.asarray(p.rows), jnp.asarray(p.cols), p.block_size,
                       out_dtype=s.out_dtype, precision=s.precision)  # fmt: skip

    # Dynamic (traced) patterns: ``keep`` masks padding and invalid blocks.
    def dyn_dsd(self, s, rows, cols, keep, valid, data, x):
        num_rows = s.grid[0]
        if s.transposed:  # data[i] holds block i transposed
            data = data.swapaxes(-1, -2)
        r = jnp.where(keep, rows, num_rows)  # out of range: dropped by the segment sum
        c = jnp.where(keep, cols, 0)
        y = coo_dsd(r, c, data, x, num_rows, sorted_rows=False, out_dtype=s.out_dtype, precision=s.precision)
        return poison(valid, y)

    def dyn_sdd(self, s, rows, cols, keep, valid, a, b):
        r, c = jnp.where(keep, rows, 0), jnp.where(keep, cols, 0)
        out = coo_sdd(a, b, r, c, s.block_size, out_dtype=s.out_dtype, precision=s.precision)
        return poison(valid, jnp.where(keep[:, None, None], out, jnp.zeros((), out.dtype)))

    # Fused epilogue (``s.epilogue``): the product in float32, then bias, activation and the cast.
    def dsd_fused(self, s, data, x, bias):
        z = self.dsd(s.but(out_dtype=acc_dtype(data.dtype, x.dtype)), data, x)
        return _epilogue.reference(z, bias, s.epilogue, s.out_dtype)

    def dds_fused(self, s, x, data, bias):
        z = self.dds(s.but(out_dtype=acc_dtype(data.dtype, x.dtype)), x, data)
        return _epilogue.reference(z, bias, s.epilogue, s.out_dtype)

    def dyn_dsd_fused(self, s, rows, cols, keep, valid, data, x, bias):
        z = self.dyn_dsd(s.but(out_dtype=acc_dtype(data.dtype, x.dtype)), rows, cols, keep, valid, data, x)
        return poison(valid, _epilogue.reference(z, bias, s.epilogue, s.out_dtype))
