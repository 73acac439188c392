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
        nodes_per_program: the Pallas kernel's light nodes per program (``None``: its default rule).
    """

    impls: tuple[str, ...]
    is_max: bool
    nodes_per_program: int | None = None


def _module(name: str):
    return _dispatch.op_module(__package__, name)


def _kernel(name: str, with_arg: bool):
    fn = _module(name).segment_extreme
    if name == "pallas":
        return lambda s, g, x: fn(g, x, s.is_max, with_arg=with_arg, nodes_per_program=s.nodes_per_program)
    return lambda s, g, x: fn(g, x, s.is_max, with_arg=with_arg)


def _values(name: str):
    fn = _kernel(name, False)
    return lambda s, g, x: fn(s, g, x)[0]


def _values_and_args(name: str):
    return _kernel(name, True)


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


def aggregate(
    g: Graph | DynamicGraph,
    x: jax.Array,
    reduce: str = "max",
    *,
    implementation=None,
    nodes_per_program: int | None = None,
) -> jax.Array:
    """Element-wise max or min of in-neighbours' features: ``out[i] = max_{j -> i} x[j]``.

    Arguments:
        g: the :class:`Graph` or :class:`DynamicGraph`.
        x: node features ``(N, ...)``.
        reduce: ``"max"`` or ``"min"``.
        implementation: ``None`` (Pallas on a GPU, else XLA), ``"pallas"``, ``"xla"`` or a
            sequence tried in order.
        nodes_per_program: a tuning knob of the Pallas kernel (the XLA implementation ignores it):
            how many light nodes one program reduces together, a power of two up to 32; ``1`` is
            one node per program. ``None`` (default): about 64 in-edges per program from the
            graph's mean in-degree (2 nodes at a mean in-degree of 32; see
            ``blocksparse.ops.gnn_aggregate.pallas_triton.default_nodes_per_program``). Results
            are the same for every value.

    Returns:
        ``(N, ...)``; nodes without in-edges get 0. NaN propagates: ``out[i, f]`` is NaN where any
        in-neighbour's feature ``f`` is NaN, on every implementation. The gradient goes to the
        arg-max / arg-min edge of each (node, feature); ties go to the first in-edge in the order
        given to :meth:`Graph.from_edges` (deterministic), and a NaN result's gradient to the first
        in-edge whose feature is NaN.
    """
    if nodes_per_program is not None:  # (the kernel module is imported only when asked for)
        _module("pallas").check_nodes_per_program(nodes_per_program)
    if (own := getattr(type(g), "_gnn_aggregate", None)) is not None:  # a graph over many devices (gnn.sharded)
        if nodes_per_program is not None:
            raise ValueError(
                f"Expected nodes_per_program=None for a {type(g).__name__} (its per-device parts take the default). "
                f"Got {nodes_per_program!r}."
            )
        return own(g, x, reduce, implementation=implementation)
    check_graph(g)
    _dispatch.check_choice("reduce", reduce, ("max", "min"))
    impls = _dispatch.resolve(implementation, DEFAULT, tuple(_dispatch.OP_MODULES))
    npp = None if nodes_per_program is None else int(nodes_per_program)
    s = AggregateStatic(impls, reduce == "max", npp)
    x = g.check_features(x, "features", ndim=tuple(range(1, 8)))
    valid = g.validity() if isinstance(g, DynamicGraph) else None  # NaN out (and NaN gradients) if invalid
    x = poison(valid, x)
    shape = x.shape
    x2 = x.reshape(shape[0], math.prod(shape[1:]))
    if g.edge_capacity == 0 or g.num_nodes == 0 or x2.shape[1] == 0:
        return nan_unless(valid, jnp.zeros_like(x))
    return nan_unless(valid, _extreme(s, g, x2).reshape(shape))
