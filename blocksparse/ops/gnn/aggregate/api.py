"""Max / min aggregation over in-neighbours, with gradients routed to the arg-max / arg-min."""

from __future__ import annotations

import dataclasses
import math
import warnings

import jax
import jax.numpy as jnp

from ....graph import DynamicGraph, Graph, check_graph, nan_unless, poison
from ... import _dispatch
from .. import order, registry
from ..config import GatherConfig

__all__ = ["AggregateStatic", "aggregate"]


@dataclasses.dataclass(frozen=True)
class AggregateStatic:
    """The static part of one ``aggregate`` call (hashable: the ``custom_vjp``'s static argument).

    The graph is the op's first array argument (see :class:`~..spmm.api.SpmmStatic`).

    Attributes:
        impls: implementation names, tried in order.
        is_max: max (True) or min (False).
        config: the Pallas kernel's :class:`~..config.GatherConfig` (``None``: its defaults; XLA ignores it).
        grad_impls: the forward's under ``jax.grad`` (with the arg-max / arg-min); ``None``: ``impls``.
    """

    impls: tuple[str, ...]
    is_max: bool
    config: GatherConfig | None = None
    grad_impls: tuple[str, ...] | None = None


def _kernel(name: str, with_arg: bool):
    fn = registry.module("aggregate", name).segment_extreme
    if name == "pallas":

        def pallas(s, g, x):
            c = s.config or GatherConfig()
            return fn(g, x, s.is_max, with_arg=with_arg, nodes_per_program=c.nodes_per_program, variant=c.variant)

        return pallas
    return lambda s, g, x: fn(g, x, s.is_max, with_arg=with_arg)


def _values(name: str):
    fn = _kernel(name, False)
    return lambda s, g, x: fn(s, g, x)[0]


def _values_and_args(name: str):
    return _kernel(name, True)


def _forward(s: AggregateStatic, g, x):
    table = _dispatch.with_reference_jvp(_values_and_args)  # (grad of grad: the kernel's derivative is XLA's)
    return _dispatch.run("aggregate", s.grad_impls or s.impls, table, s, g, x)


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
    config: GatherConfig | None = None,
    nodes_per_program: int | None = None,
) -> jax.Array:
    """Element-wise max or min of in-neighbours' features: ``out[i] = max_{j -> i} x[j]``.

    Arguments:
        g: the :class:`Graph` or :class:`DynamicGraph`.
        x: node features ``(N, ...)``.
        reduce: ``"max"`` or ``"min"``.
        implementation: ``None`` (the order of :func:`blocksparse.ops.gnn.order.implementations`: Pallas on
            a GPU, except on graphs like those where the tuned data measured XLA faster,
            :func:`blocksparse.ops.gnn.order.choice`, for the forward alone and for the forward under ``jax.grad``
            each; else XLA), ``"pallas"``, ``"xla"`` or a sequence tried in order.
        config: ``None`` or a :class:`~blocksparse.gnn.GatherConfig` for the Pallas kernel: how many light
            nodes one program reduces together (a power of two up to 32; ``1`` is one node per program;
            ``None``: :func:`blocksparse.ops.gnn.order.aggregate_nodes_per_program` of the graph's mean
            in-degree) and a gather variant. With ``implementation=None`` only the Pallas backend then runs.
            Results are the same for every config.
        nodes_per_program: deprecated (warns): ``config=GatherConfig(nodes_per_program=...)``, kept as before:
            it tunes the Pallas kernel without restricting the implementation.

    Returns:
        ``(N, ...)``; nodes without in-edges get 0. NaN propagates: ``out[i, f]`` is NaN where any
        in-neighbour's feature ``f`` is NaN, on every implementation. The gradient goes to the
        arg-max / arg-min edge of each (node, feature); ties go to the first in-edge in the order
        given to :meth:`Graph.from_edges` (deterministic), and a NaN result's gradient to the first
        in-edge whose feature is NaN.
    """
    order.check_config("aggregate", config)
    strict = config
    if nodes_per_program is not None:
        warnings.warn(
            "aggregate(nodes_per_program=...) is deprecated: pass config=GatherConfig(nodes_per_program=...).",
            DeprecationWarning,
            stacklevel=2,
        )
        if config is not None:
            raise ValueError("Expected config= or nodes_per_program=, not both.")
        config = GatherConfig(nodes_per_program=nodes_per_program)  # (validates it)
    if (own := getattr(type(g), "_gnn_aggregate", None)) is not None:  # a graph over many devices (sharding.graph)
        if config is not None:
            raise ValueError(
                f"Expected config=None and nodes_per_program=None for a {type(g).__name__} (its per-device parts "
                f"take the default). Got {config!r}."
            )
        return own(g, x, reduce, implementation=implementation)
    check_graph(g)
    _dispatch.check_choice("reduce", reduce, ("max", "min"))
    order.implementations("aggregate", implementation, getattr(x, "dtype", None), strict)  # checks the names
    x = g.check_features(x, "features", ndim=tuple(range(1, 8)))
    feat = max(math.prod(x.shape[1:]), 1)
    impls, grad = (order.implementations("aggregate", implementation, x.dtype, strict, graph=g, feat=feat, pass_=p)
                   for p in order.PASSES)  # fmt: skip
    s = AggregateStatic(impls, reduce == "max", config, None if grad == impls else grad)
    valid = g.validity() if isinstance(g, DynamicGraph) else None  # NaN out (and NaN gradients) if invalid
    x = poison(valid, x)
    shape = x.shape
    x2 = x.reshape(shape[0], math.prod(shape[1:]))
    if g.edge_capacity == 0 or g.num_nodes == 0 or x2.shape[1] == 0:
        return nan_unless(valid, jnp.zeros_like(x))
    return nan_unless(valid, _extreme(s, g, x2).reshape(shape))
