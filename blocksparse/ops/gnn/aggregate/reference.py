"""Pure-JAX max / min aggregation: the fallback on every machine and the oracle for the kernel.

Gather the source rows of every in-edge in CSR order and reduce them per destination with
``segment_max`` / ``segment_min``, which propagate NaN. The arg-max / arg-min is the first CSR
position (the first in-edge in input order) holding the winning value; where the result is NaN,
the first in-edge whose feature is NaN.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ....graph import DynamicGraph, Graph

_BIG = 2**31 - 1


def winners(values, best):
    """Where ``values`` hold ``best``: equal, or both NaN (NaN wins a max / min)."""
    return (values == best) | (jnp.isnan(values) & jnp.isnan(best))


def segment_extreme(g: Graph | DynamicGraph, x: jax.Array, is_max: bool, *, with_arg: bool = True):
    """``x (N, F)`` -> (values ``(N, F)``, CSR position of the arg-max/min or -1; or None)."""
    seg = jnp.asarray(g.dst_sorted)
    msg = x[jnp.asarray(g.indices)]
    red = jax.ops.segment_max if is_max else jax.ops.segment_min
    best = red(msg, seg, g.num_nodes, indices_are_sorted=True)
    has = jnp.asarray(g.in_degree > 0)[:, None]
    out = jnp.where(has, best, jnp.zeros((), x.dtype))
    if not with_arg:
        return out, None
    pos = jnp.arange(g.edge_capacity, dtype=jnp.int32)[:, None]  # padding positions: segment N, dropped
    win = jnp.where(winners(msg, best[seg]), pos, jnp.int32(_BIG))
    arg = jax.ops.segment_min(win, seg, g.num_nodes, indices_are_sorted=True)
    return out, jnp.where(has, arg, -1)
