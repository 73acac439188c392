"""Max / min aggregation over in-neighbours, with gradients routed to the arg-max / arg-min."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from ...gnn._dynamic import DynamicGraph, nan_unless, poison
from ...gnn._graph import Graph, check_graph
from .. import _dispatch

__all__ = ["AggregateStatic", "aggregate"]

DEFAULT = ("pallas", "xla")


@dataclasses.dataclass(frozen=True)
class AggregateStatic:
    """The static part of one ``aggregate`` call (hashable: the ``custom_vjp``'s static argument).

    The graph is the op's first array argument (see :class:`~..gnn_spmm.api.SpmmStatic`).

    Attributes:
        impls: implementation names, tried in order.
        is_max: max (True) or min (False).
    """

    impls: tuple[str, ...]
    is_max: bool


def _module(name: str):
    return _dispatch.op_module(__package__, name)


def _values(name: str):
    fn = _module(name).segment_extreme
    return lambda s, g, x: fn(g, x, s.is_max, with_arg=False)[0]


def _values_and_args(name: str):
    fn = _module(name).segment_extreme
    return lambda s, g, x: fn(g, x, s.is_max, with_arg=True)


def _forward(s: AggregateStatic, g, x):
    return _dispatch.run("aggregate", s.impls, _values_and_args, s, g, x)


def _backward(s: AggregateStatic, arrays, arg, dout):
    """Each (node, feature) cotangent goes to the source of its arg-max / arg-min edge (none without in-edges)."""
    g, _ = arrays
    n, f = dout.shape
    valid = arg >= 0
    src = jnp.asarray(g.indices)[jnp.where(valid, arg, 0)]
    flat = jnp.where(valid, src * f + jnp.arange(f, dtype=jnp.int32)[None, :], n * f)
    dx = jax.ops.segment_sum(dout.reshape(-1).astype(jnp.float32), flat.reshape(-1), n * f + 1)[: n * f]
    return None, dx.reshape(n, f).astype(dout.dtype)


# (static, graph, x (N, F)) -> max / min over in-neighbours; the forward pass also keeps the arg-max / arg-min
_extreme = _dispatch.differentiable("aggregate", _values, _backward, _forward)


def aggregate(g: Graph | DynamicGraph, x: jax.Array, reduce: str = "max", *, implementation=None) -> jax.Array:
    """Element-wise max or min of in-neighbours' features: ``out[i] = max_{j -> i} x[j]``.

    Arguments:
        g: the :class:`Graph` or :class:`DynamicGraph`.
        x: node features ``(N, ...)``.
        reduce: ``"max"`` or ``"min"``.
        implementation: ``None`` (Pallas on a GPU, else XLA), ``"pallas"``, ``"xla"`` or a
            sequence tried in order.

    Returns:
        ``(N, ...)``; nodes without in-edges get 0. NaN propagates: ``out[i, f]`` is NaN where any
        in-neighbour's feature ``f`` is NaN, on every implementation. The gradient goes to the
        arg-max / arg-min edge of each (node, feature); ties go to the first in-edge in the order
        given to :meth:`Graph.from_edges` (deterministic), and a NaN result's gradient to the first
        in-edge whose feature is NaN.
    """
    if (own := getattr(type(g), "_gnn_aggregate", None)) is not None:  # a graph over many devices (gnn.sharded)
        return own(g, x, reduce, implementation=implementation)
    check_graph(g)
    _dispatch.check_choice("reduce", reduce, ("max", "min"))
    s = AggregateStatic(_dispatch.resolve(implementation, DEFAULT, tuple(_dispatch.OP_MODULES)), reduce == "max")
    x = g.check_features(x, "features", ndim=tuple(range(1, 8)))
    valid = g.validity() if isinstance(g, DynamicGraph) else None  # NaN out (and NaN gradients) if invalid
    x = poison(valid, x)
    shape = x.shape
    x2 = x.reshape(shape[0], math.prod(shape[1:]))
    if g.edge_capacity == 0 or g.num_nodes == 0 or x2.shape[1] == 0:
        return nan_unless(valid, jnp.zeros_like(x))
    return nan_unless(valid, _extreme(s, g, x2).reshape(shape))
