"""Max / min aggregation over in-neighbours, with gradients routed to the arg-max / arg-min."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from ...gnn._graph import Graph
from .. import _dispatch

__all__ = ["aggregate", "aggregate_reference"]

_IMPLS = ("pallas", "xla")
DEFAULT = ("pallas", "xla")


def _xla_extreme(g: Graph, x, is_max: bool, with_arg: bool):
    seg = jnp.asarray(g.dst_sorted)
    msg = x[jnp.asarray(g.indices)]
    red = jax.ops.segment_max if is_max else jax.ops.segment_min
    best = red(msg, seg, g.num_nodes, indices_are_sorted=True)
    has = jnp.asarray(g.in_degree > 0)[:, None]
    out = jnp.where(has, best, jnp.zeros((), x.dtype))
    if not with_arg:
        return out, None
    pos = jnp.arange(g.num_edges, dtype=jnp.int32)[:, None]
    win = jnp.where(msg == best[seg], pos, jnp.int32(2**31 - 1))
    arg = jax.ops.segment_min(win, seg, g.num_nodes, indices_are_sorted=True)
    return out, jnp.where(has, arg, -1)


def _pallas_extreme(g: Graph, x, is_max: bool, with_arg: bool):
    from .pallas_triton import segment_extreme

    return segment_extreme(g, x, is_max, with_arg=with_arg)


_TABLE = {"xla": _xla_extreme, "pallas": _pallas_extreme}


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _extreme(g, impls, is_max, x):
    return _dispatch.run("aggregate", impls, _TABLE, g, x, is_max, False)[0]


def _extreme_fwd(g, impls, is_max, x):
    out, arg = _dispatch.run("aggregate", impls, _TABLE, g, x, is_max, True)
    return out, arg


def _extreme_bwd(g, impls, is_max, arg, dout):
    n, f = dout.shape
    valid = arg >= 0
    src = jnp.asarray(g.indices)[jnp.where(valid, arg, 0)]
    flat = jnp.where(valid, src * f + jnp.arange(f, dtype=jnp.int32)[None, :], n * f)
    dx = jax.ops.segment_sum(dout.reshape(-1).astype(jnp.float32), flat.reshape(-1), n * f + 1)[: n * f]
    return (dx.reshape(n, f).astype(dout.dtype),)


_extreme.defvjp(_extreme_fwd, _extreme_bwd)


def aggregate(g: Graph, x: jax.Array, reduce: str = "max", *, implementation=None) -> jax.Array:
    """Element-wise max or min of in-neighbours' features: ``out[i] = max_{j -> i} x[j]``.

    Arguments:
        g: the :class:`Graph`.
        x: node features ``(N, ...)``.
        reduce: ``"max"`` or ``"min"``.
        implementation: ``None`` (Pallas on a GPU, else XLA), ``"pallas"``, ``"xla"`` or a
            sequence tried in order.

    Returns:
        ``(N, ...)``; nodes without in-edges get 0. The gradient goes to the arg-max / arg-min
        edge of each (node, feature); ties go to the first in-edge in the order given to
        :meth:`Graph.from_edges` (deterministic).
    """
    if not isinstance(g, Graph):
        raise TypeError(f"Expected a blocksparse.gnn.Graph. Got {type(g).__name__}.")
    _dispatch.check_choice("reduce", reduce, ("max", "min"))
    impls = _dispatch.resolve(implementation, DEFAULT, _IMPLS)
    x = g.check_features(x, "features", ndim=tuple(range(1, 8)))
    shape = x.shape
    x2 = x.reshape(shape[0], math.prod(shape[1:]))
    if g.num_edges == 0 or x2.shape[1] == 0:
        return jnp.zeros_like(x)
    return _extreme(g, impls, reduce == "max", x2).reshape(shape)


def aggregate_reference(g: Graph, x, reduce="max"):
    """The same as :func:`aggregate` with ``implementation="xla"`` (sorted segment ops)."""
    return aggregate(g, x, reduce, implementation="xla")
