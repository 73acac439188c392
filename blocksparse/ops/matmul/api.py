"""Dispatch and differentiation for block-sparse products.

Three static ops, named by operand format (STK / MegaBlocks convention):

- ``dsd``: dense = sparse ``W (m, k)`` @ dense ``x (k, n)``;
- ``dds``: dense = dense ``x (B, m)`` @ sparse ``W (m, k)``;
- ``sdd``: sparse = dense ``a (m, n)`` @ dense ``b (n, k)`` sampled at a pattern.

Each has one ``custom_vjp`` whose backward is made of the other two, on the same list of
implementations: the gradient w.r.t. the dense operand runs on the cached transposed pattern,
the gradient w.r.t. the values is an ``sdd`` laid out like ``.data``.

Dynamic matrices have the twins ``dyn_dsd`` and ``dyn_sdd`` (``dds`` is ``dsd`` on the swapped
coordinates): the Pallas backend builds its work list inside ``jit`` with
:func:`.lowering.redistribute`, so the transposed product needs no cached transpose.

``implementation`` is ``None``, a name or a sequence of names; the first backend that does not
raise ``NotImplementedError`` wins. ``None`` means ``("pallas", "xla")``: the Pallas kernel where
it can run, else the pure-JAX reference.
"""

from __future__ import annotations

import functools
import importlib
import math

import jax
import jax.numpy as jnp

from ..._matrix import BlockSparseMatrix, DynamicBlockSparseMatrix, _check_floating
from .._dispatch import cotangent_like, dispatch_log, resolve, run
from .reference import transposed

__all__ = ["matmul", "sdd", "dispatch_log", "register_backend", "get_backend"]

# name -> "module:attribute" of a backend object with dsd / dds / sdd methods; loaded lazily.
_BACKEND_PATHS = {
    "xla": "blocksparse.ops.matmul.reference:XlaBackend",
    "pallas": "blocksparse.ops.matmul.pallas_triton:PallasBackend",
}
_BACKENDS: dict[str, object] = {}
_DEFAULT = ("pallas", "xla")


def register_backend(name: str, backend) -> None:
    """Register (or replace) a backend object under ``name``."""
    _BACKENDS[name] = backend


def get_backend(name: str):
    if name not in _BACKENDS:
        if name not in _BACKEND_PATHS:
            raise ValueError(f"Expected an implementation in {sorted(_BACKEND_PATHS)}. Got {name!r}.")
        mod, attr = _BACKEND_PATHS[name].split(":")
        _BACKENDS[name] = getattr(importlib.import_module(mod), attr)()
    return _BACKENDS[name]


def _impls(implementation) -> tuple[str, ...]:
    return resolve(implementation, _DEFAULT)


def _run(op: str, impls: tuple[str, ...], *args):
    return run(op, impls, lambda name: getattr(get_backend(name), op), *args)


# --------------------------------------------------------------------------------------------
# Static ops with custom VJPs
# --------------------------------------------------------------------------------------------
@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 3, 4))
def _dsd(pattern, data, x, impls, out_dtype):
    return _run("dsd", impls, pattern, data, x, out_dtype)


def _dsd_fwd(pattern, data, x, impls, out_dtype):
    return _dsd(pattern, data, x, impls, out_dtype), (data, x)


def _dsd_bwd(pattern, impls, out_dtype, res, g):
    data, x = res
    t, data_t = transposed(pattern, data)
    dx = _dsd(t, data_t, g, impls, x.dtype)
    ddata = _sdd(g, x.T, pattern, impls, data.dtype)
    return cotangent_like(ddata, data), cotangent_like(dx, x)


_dsd.defvjp(_dsd_fwd, _dsd_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 3, 4))
def _dds(x, pattern, data, impls, out_dtype):
    return _run("dds", impls, x, pattern, data, out_dtype)


def _dds_fwd(x, pattern, data, impls, out_dtype):
    return _dds(x, pattern, data, impls, out_dtype), (x, data)


def _dds_bwd(pattern, impls, out_dtype, res, g):
    x, data = res
    t, data_t = transposed(pattern, data)
    dx = _dds(g, t, data_t, impls, x.dtype)
    ddata = _sdd(x.T, g, pattern, impls, data.dtype)
    return cotangent_like(dx, x), cotangent_like(ddata, data)


_dds.defvjp(_dds_fwd, _dds_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _sdd(a, b, pattern, impls, out_dtype):
    return _run("sdd", impls, a, b, pattern, out_dtype)


def _sdd_fwd(a, b, pattern, impls, out_dtype):
    return _sdd(a, b, pattern, impls, out_dtype), (a, b)


def _sdd_bwd(pattern, impls, out_dtype, res, g):
    a, b = res
    da = _dsd(pattern, g, b.T, impls, a.dtype)
    db = _dds(a.T, pattern, g, impls, b.dtype)
    return cotangent_like(da, a), cotangent_like(db, b)


_sdd.defvjp(_sdd_fwd, _sdd_bwd)


# --------------------------------------------------------------------------------------------
# Dynamic ops: the pattern is traced; ``keep`` masks padding and invalid blocks. The Pallas
# backend builds its work list inside jit (lowering.redistribute); the transposed
# product needs no cached transpose, the redistributor sorts by the other coordinate.
# --------------------------------------------------------------------------------------------
@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _dyn_dsd(grid, out_dtype, impls, rows, cols, keep, data, x):
    return _run("dyn_dsd", impls, rows, cols, keep, data, x, grid[0], out_dtype)


def _dyn_dsd_fwd(grid, out_dtype, impls, rows, cols, keep, data, x):
    return _dyn_dsd(grid, out_dtype, impls, rows, cols, keep, data, x), (rows, cols, keep, data, x)


def _dyn_dsd_bwd(grid, out_dtype, impls, res, g):
    rows, cols, keep, data, x = res
    dx = _dyn_dsd(grid[::-1], x.dtype, impls, cols, rows, keep, data.swapaxes(-1, -2), g)
    ddata = _dyn_sdd(data.shape[1:], data.dtype, impls, rows, cols, keep, g, x.T)
    return None, None, None, cotangent_like(ddata, data), cotangent_like(dx, x)


_dyn_dsd.defvjp(_dyn_dsd_fwd, _dyn_dsd_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _dyn_sdd(block_size, out_dtype, impls, rows, cols, keep, a, b):
    return _run("dyn_sdd", impls, a, b, rows, cols, keep, block_size, out_dtype)


def _dyn_sdd_fwd(block_size, out_dtype, impls, rows, cols, keep, a, b):
    return _dyn_sdd(block_size, out_dtype, impls, rows, cols, keep, a, b), (rows, cols, keep, a, b)


def _dyn_sdd_bwd(block_size, out_dtype, impls, res, g):
    rows, cols, keep, a, b = res
    grid = (a.shape[0] // block_size[0], b.shape[1] // block_size[1])
    da = _dyn_dsd(grid, a.dtype, impls, rows, cols, keep, g, b.T)
    db = _dyn_dsd(grid[::-1], b.dtype, impls, cols, rows, keep, g.swapaxes(-1, -2), a).T
    return None, None, None, cotangent_like(da, a), cotangent_like(db, b)


_dyn_sdd.defvjp(_dyn_sdd_fwd, _dyn_sdd_bwd)


def _keep_and_validity(D: DynamicBlockSparseMatrix):
    gm, gk = D.grid
    valid = D.check()
    keep = D.active() & (D.rows >= 0) & (D.rows < gm) & (D.cols >= 0) & (D.cols < gk)
    return keep, valid


def _poison(y, valid):
    return jnp.where(valid, y, jnp.asarray(jnp.nan, y.dtype))


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------
_SPARSE = (BlockSparseMatrix, DynamicBlockSparseMatrix)


def _dense(x, what: str) -> jax.Array:
    x = jnp.asarray(x)
    _check_floating(x.dtype, what)
    return x


def matmul(a, b, *, implementation=None, preferred_element_type=None) -> jax.Array:
    """Block-sparse matrix product; exactly one of ``a`` and ``b`` is sparse.

    - ``sparse (m, k) @ dense (k, n)`` -> ``(m, n)``; also ``(k,)`` -> ``(m,)`` and batched
      ``(..., k, n)`` -> ``(..., m, n)``.
    - ``dense (..., m) @ sparse (m, k)`` -> ``(..., k)`` (the form of a linear layer).

    Arguments:
        a, b: a :class:`BlockSparseMatrix` or :class:`DynamicBlockSparseMatrix`, and a dense array.
        implementation: ``None`` (fastest available, falling back to pure JAX), ``"pallas"``,
            ``"xla"``, or a sequence tried in order.
        preferred_element_type: output dtype; by default JAX's promotion of the two dtypes.
            Half-precision inputs always accumulate in float32.

    Returns:
        The dense product. Differentiable w.r.t. the dense operand and the sparse ``.data``;
        works under ``jit``, ``grad`` and ``vmap``.
    """
    impls = _impls(implementation)
    a_sparse, b_sparse = isinstance(a, _SPARSE), isinstance(b, _SPARSE)
    if a_sparse == b_sparse:
        raise TypeError(
            "Expected exactly one block-sparse operand. Got "
            f"{type(a).__name__} and {type(b).__name__}" + ("; use jnp.matmul for dense ones." if not a_sparse else ".")
        )
    if a_sparse:
        W, x = a, _dense(b, "dense operand")
        m, k = W.shape
        if x.ndim == 0:
            raise ValueError("Expected a dense operand with at least 1 dimension. Got a scalar.")
        kx = x.shape[0] if x.ndim == 1 else x.shape[-2]
        if kx != k:
            raise ValueError(
                f"Expected the dense operand's contracting dimension to be {k} (W is {W.shape}). "
                f"Got {kx} (shape {x.shape})."
            )
        out_dtype = jnp.dtype(preferred_element_type or jnp.result_type(W.dtype, x.dtype))
        # Fold batch dimensions into the columns: (..., k, n) -> (k, B * n).
        if x.ndim == 1:
            x2 = x[:, None]
        else:
            x2 = jnp.moveaxis(x, -2, 0).reshape(k, math.prod(x.shape[:-2]) * x.shape[-1])
        y2 = _sparse_dense(W, x2, impls, out_dtype, implementation is None)
        if x.ndim == 1:
            return y2[:, 0]
        return jnp.moveaxis(y2.reshape(m, *x.shape[:-2], x.shape[-1]), 0, -2)
    x, W = _dense(a, "dense operand"), b
    m, k = W.shape
    if x.ndim == 0 or x.shape[-1] != m:
        raise ValueError(
            f"Expected the dense operand's last dimension to be {m} (W is {W.shape}). Got shape {x.shape}."
        )
    out_dtype = jnp.dtype(preferred_element_type or jnp.result_type(W.dtype, x.dtype))
    y2 = _dense_sparse(x.reshape(math.prod(x.shape[:-1]), m), W, impls, out_dtype, implementation is None)
    return y2.reshape(*x.shape[:-1], k)


# Building the dynamic work list on the device costs about 0.25 ms on the H200 (sort, scans,
# scatters; docs/benchmarks.md), more than the whole pure-JAX product at small n: by default the
# Pallas path goes first only from this many dense columns on.
DYNAMIC_PALLAS_MIN_N = 1024


def _sparse_dense(W, x, impls, out_dtype, default: bool = False):
    if isinstance(W, BlockSparseMatrix):
        return _dsd(W.pattern, W.data, x, impls, out_dtype)
    if default and x.shape[1] < DYNAMIC_PALLAS_MIN_N:
        impls = tuple(sorted(impls, key=lambda name: name != "xla"))
    keep, valid = _keep_and_validity(W)
    return _poison(_dyn_dsd(W.grid, out_dtype, impls, W.rows, W.cols, keep, W.data, x), valid)


def _dense_sparse(x, W, impls, out_dtype, default: bool = False):
    if isinstance(W, BlockSparseMatrix):
        return _dds(x, W.pattern, W.data, impls, out_dtype)
    # x @ W = (W^T @ x^T)^T
    return _sparse_dense(W.T, x.T, impls, out_dtype, default).T


def sdd(a, b, like, *, implementation=None, preferred_element_type=None):
    """``a (m, n) @ b (n, k)`` computed only at the blocks of ``like``; returns a matrix like ``like``.

    This is the gradient of a block-sparse product w.r.t. its values (SDDMM). The result has
    ``like``'s pattern (static) or coordinates and ``nnz`` (dynamic); padding blocks are zero.
    """
    if not isinstance(like, _SPARSE):
        raise TypeError(f"Expected `like` to be a block-sparse matrix. Got {type(like).__name__}.")
    a, b = _dense(a, "a"), _dense(b, "b")
    m, k = like.shape
    if a.ndim != 2 or b.ndim != 2 or a.shape[0] != m or b.shape[1] != k or a.shape[1] != b.shape[0]:
        raise ValueError(
            f"Expected a of shape ({m}, n) and b of shape (n, {k}) to match `like` {like.shape}. "
            f"Got {a.shape} and {b.shape}."
        )
    out_dtype = jnp.dtype(preferred_element_type or jnp.result_type(a.dtype, b.dtype))
    if isinstance(like, BlockSparseMatrix):
        return like.tree_unflatten(like.pattern, (_sdd(a, b, like.pattern, _impls(implementation), out_dtype),))
    keep, valid = _keep_and_validity(like)
    impls = _impls(implementation)
    data = _poison(_dyn_sdd(like.block_size, out_dtype, impls, like.rows, like.cols, keep, a, b), valid)
    return DynamicBlockSparseMatrix.tree_unflatten(
        (like.shape, like.block_size), (like.rows, like.cols, data, like.nnz)
    )
