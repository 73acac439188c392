"""What both graph types share, below both: the chunk alignment, the feature check and the validity helpers.

:class:`~blocksparse.graph.Graph` (host data) and :class:`~blocksparse.graph.DynamicGraph` (traced) both import
this module and neither imports the other, so the graph package has no import cycle.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["CHUNK_ALIGN", "check_features", "nan_unless", "poison"]

#: Edges per heavy-node chunk are a multiple of this, so every kernel's edge block divides it.
CHUNK_ALIGN = 128


def check_features(num_nodes: int, x, what: str, ndim: int | tuple[int, ...] = (1, 2, 3)):
    """Node features ``x`` as a floating array with ``num_nodes`` rows; returns it."""
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"Expected floating-point {what}. Got {x.dtype}.")
    ndims = (ndim,) if isinstance(ndim, int) else ndim
    if x.ndim not in ndims:
        span = f"{ndims[0]} to {ndims[-1]}" if len(ndims) > 2 else " or ".join(map(str, ndims))
        raise ValueError(f"Expected {what} with {span} dimensions. Got shape {x.shape}.")
    if x.shape[0] != num_nodes:
        raise ValueError(f"Expected {what} with one row per node: leading dimension {num_nodes}. Got shape {x.shape}.")
    return x


# ---------------------------------------------------------------------------------- op helpers
@jax.custom_vjp
def _nan_gradient_unless(valid, a):
    return a


def _ngu_fwd(valid, a):
    return a, valid


def _ngu_bwd(valid, ct):
    return None, ct * jnp.where(valid, 1.0, jnp.nan).astype(ct.dtype)


_nan_gradient_unless.defvjp(_ngu_fwd, _ngu_bwd)


def poison(valid, a):
    """``a`` unchanged, but its gradient NaN where the graph is invalid (``valid`` False).

    The identity in the forward pass (no extra pass over the inputs); with :func:`nan_unless` on the
    output, an op on an invalid graph gives NaN outputs *and* NaN gradients for every input.
    """
    if a is None or valid is None:
        return a
    return _nan_gradient_unless(valid, a)


def nan_unless(valid, out):
    """``out``, or NaN everywhere if the graph is invalid."""
    if valid is None:
        return out
    return jnp.where(valid, out, jnp.asarray(jnp.nan, out.dtype))
