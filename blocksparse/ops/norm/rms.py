"""RMSNorm of each row, optionally after a residual add, in one launch.

In a decoder's one-token step every RMSNorm is tiny (a few rows of the hidden width) and XLA runs it as two
kernels, a reduction for the rows' mean square and an element-wise pass that scales them, with the residual add
that precedes it folded into the first: two launches of a microsecond or more each, twice a layer. :func:`rms_norm`
is one Pallas (Triton) kernel that reads each row (and its residual) once, stores the sum when asked, and stores the
normalised row. The arithmetic is Hugging Face's (``LlamaRMSNorm``): the statistics in float32, the normalised row
cast to the input dtype before the weight multiplies it. Forward only (inference); :func:`rms_norm_reference` is the
same computation in XLA, its oracle and its fallback.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from .. import _dispatch
from . import tuned

__all__ = ["rms_norm", "rms_norm_reference"]


def _check(x, weight, residual, eps):
    if x.ndim < 1 or jnp.shape(weight) != x.shape[-1:]:
        raise ValueError(f"Expected weight of shape ({x.shape[-1] if x.ndim else 'hidden'},), the last axis of x. "
                         f"Got x {x.shape}, weight {jnp.shape(weight)}.")  # fmt: skip
    if residual is not None and jnp.shape(residual) != x.shape:
        raise ValueError(f"Expected residual of x's shape {x.shape}. Got {jnp.shape(residual)}.")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(f"Expected a floating x (float32, bfloat16 or float16). Got {x.dtype}.")
    if not eps >= 0:
        raise ValueError(f"Expected eps >= 0. Got {eps}.")


def _normalise(s, weight, eps):
    """``weight * (s / rms(s))``: the statistics in float32, the row cast to ``s``'s dtype before the weight."""
    s32 = s.astype(jnp.float32)
    y = (s32 * jax.lax.rsqrt(jnp.mean(s32 * s32, axis=-1, keepdims=True) + eps)).astype(s.dtype)
    return weight.astype(s.dtype) * y


def rms_norm_reference(x, weight, *, eps: float = 1e-5, residual=None):
    """:func:`rms_norm` in XLA."""
    _check(x, weight, residual, eps)
    return _xla(x, weight, eps, residual)


def _xla(x, weight, eps, residual):
    if residual is None:
        return _normalise(x, weight, eps)
    s = x + residual.astype(x.dtype)
    return s, _normalise(s, weight, eps)


def _kernel(*refs, eps, residual):
    if residual:
        x_ref, r_ref, w_ref, s_ref, o_ref = refs
        s = (x_ref[...].astype(jnp.float32) + r_ref[...].astype(jnp.float32)).astype(x_ref.dtype)
        s_ref[...] = s
    else:
        x_ref, w_ref, o_ref = refs
        s = x_ref[...]
    o_ref[...] = _normalise(s, w_ref[...], eps)


def _warps(h: int) -> int:
    """Warps a program of rows ``h`` wide: the tuned entry ``RMS_NORM_WARPS``."""
    return next(warps for widest, warps in tuned.get("RMS_NORM_WARPS") if h <= widest)


@functools.partial(jax.jit, static_argnames=("eps", "rows"))
def _pallas(x, weight, residual, *, eps, rows):
    from jax.experimental.pallas import triton as plgpu

    shape, h = x.shape, x.shape[-1]
    x2 = x.reshape(-1, h)
    n = x2.shape[0]
    row = pl.BlockSpec((rows, h), lambda i: (i, 0))
    ins = (x2,) if residual is None else (x2, residual.astype(x.dtype).reshape(-1, h))
    outs = (jax.ShapeDtypeStruct(x2.shape, x.dtype),) * len(ins)
    res = pl.pallas_call(
        functools.partial(_kernel, eps=eps, residual=residual is not None),
        grid=(pl.cdiv(n, rows),),
        in_specs=[row] * len(ins) + [pl.BlockSpec((1, h), lambda i: (0, 0))],
        out_specs=[row] * len(outs),
        out_shape=outs,
        compiler_params=plgpu.CompilerParams(num_warps=_warps(h), num_stages=1),
        interpret=_dispatch.interpreting(),
        name="bs_rms_norm",
    )(*ins, weight.reshape(1, h))
    res = tuple(r.reshape(shape) for r in res)
    return res[0] if residual is None else res


def rms_norm(x, weight, *, eps: float = 1e-5, residual=None):
    """RMSNorm of each row of ``x`` (the last axis), after adding ``residual`` when given, in one launch.

    Arguments:
        x: ``(..., hidden)`` floating.
        weight: ``(hidden,)``: the norm's scale, cast to ``x``'s dtype.
        eps: added to the mean square before its inverse square root.
        residual: ``None``, or an array of ``x``'s shape added to ``x`` first (the residual connection before a
            pre-norm layer's norm).

    Returns ``weight * (x / sqrt(mean(x ** 2) + eps))``, the statistics in float32 and the normalised row cast to
    ``x.dtype`` before the weight (as Hugging Face's ``LlamaRMSNorm``); with ``residual``, ``(s, rms_norm(s))``
    where ``s = x + residual`` in ``x.dtype``, the residual stream to carry on. On a CUDA GPU (or under
    :func:`blocksparse.interpret`) one Pallas kernel for a hidden width that is a power of two from 16; elsewhere
    :func:`rms_norm_reference`. Forward only.

    >>> import jax.numpy as jnp
    >>> x = jnp.array([[1.0, -1.0], [2.0, 2.0]])
    >>> rms_norm(x, jnp.array([1.0, 3.0]), eps=0.0)
    Array([[ 1., -3.],
           [ 1.,  3.]], dtype=float32)
    >>> s, h = rms_norm(x, jnp.ones(2), eps=0.0, residual=x)
    >>> s[1], h[1]
    (Array([4., 4.], dtype=float32), Array([1., 1.], dtype=float32))
    """
    x = jnp.asarray(x)
    _check(x, weight, residual, eps)
    h = x.shape[-1]
    if x.size == 0 or not _dispatch.pallas_takes_width(h):
        return _xla(x, weight, eps, residual)
    # rows a program: a whole number of rows within the tuned tile (entry RMS_NORM_TILE), at least one
    rows = max(1, min(tuned.get("RMS_NORM_TILE") // h, 1 << (max(x.size // h, 1).bit_length() - 1)))
    return _pallas(x, jnp.asarray(weight), residual, eps=float(eps), rows=rows)
