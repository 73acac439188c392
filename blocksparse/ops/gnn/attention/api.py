"""Graph attention over in-neighbours: GATv2 and dot-product (graph transformer) attention.

Both ops are one ``custom_vjp`` each: the forward saves only the output and the log-sum-exp per
(node, head); the backward recomputes the attention weights. The Pallas path never materialises
a per-edge tensor; the XLA reference (segment ops over the edges, ``E x H x D``) is the oracle and
the CPU path.
"""

from __future__ import annotations

import dataclasses
import math
import warnings

import jax
import jax.numpy as jnp

from ....graph import DynamicGraph, Graph, check_graph, nan_unless, poison
from ... import _dispatch
from .. import order, registry
from ..config import AttentionConfig

__all__ = ["AttentionConfig", "AttentionStatic", "gatv2", "graph_attention"]


def _static_number(x, name: str, op: str) -> float | None:
    """``x`` as a Python float, or ``None`` where it is traced (any JAX tracer: under ``jit``, ``grad`` or ``vmap``);
    a ``TypeError`` naming what it is for anything but a real scalar."""
    if isinstance(x, bool) or not (isinstance(x, (int, float)) or hasattr(x, "dtype")):
        raise TypeError(f"Expected {op}'s {name} to be a real scalar. Got {type(x).__name__}.")
    shape, dtype = jnp.shape(x), jnp.result_type(x)
    if shape != () or not (jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.integer)):
        raise TypeError(f"Expected {op}'s {name} to be a real scalar. Got an array of shape {shape} and dtype {dtype}.")
    return None if isinstance(x, jax.core.Tracer) else float(x)


@dataclasses.dataclass(frozen=True)
class AttentionStatic:
    """The static part of one attention call (hashable: the ``custom_vjp``'s static argument).

    The graph is the op's first array argument (see :class:`~..spmm.api.SpmmStatic`).

    Attributes:
        impls: implementation names, tried in order.
        mode: ``"gat"`` (arrays ``x_src, x_dst, att``) or ``"dot"`` (arrays ``k, q, v``).
        slope: the leaky ReLU's negative slope (``"gat"``).
        scale: the logits' scale (``"dot"``).
        config: the Pallas kernels' :class:`AttentionConfig` (tiling only; the XLA path ignores it).
        grad_impls: the forward's and the backward's under ``jax.grad``; ``None``: ``impls``.
    """

    impls: tuple[str, ...]
    mode: str
    slope: float = 0.0
    scale: float = 1.0
    config: AttentionConfig = AttentionConfig()
    grad_impls: tuple[str, ...] | None = None

    @property
    def name(self) -> str:
        return "gatv2" if self.mode == "gat" else "graph_attention"


def _module(name: str):
    return registry.module("attention", name)


def _configs(op: str, implementation, config, kernel_config) -> tuple[tuple[str, ...], AttentionConfig]:
    """The implementations and the kernels' config of ``op`` from ``config=`` (or the deprecated
    ``kernel_config=``, which tunes the kernels as before without restricting the implementation)."""
    order.check_config(op, config)
    strict = config
    if kernel_config is not None:
        warnings.warn(
            f"{op}(kernel_config=...) is deprecated: pass config=AttentionConfig(...).",
            DeprecationWarning,
            stacklevel=3,
        )
        if config is not None:
            raise ValueError("Expected config= or kernel_config=, not both.")
        if not isinstance(kernel_config, AttentionConfig):
            raise TypeError(f"Expected kernel_config None or an AttentionConfig. Got {type(kernel_config).__name__}.")
        config = kernel_config
    impls = order.implementations(op, implementation, None, strict)
    return impls, AttentionConfig() if config is None else config


def _by_graph(op: str, impls, implementation, config, g, x) -> tuple[tuple[str, ...], ...]:
    """``(impls, grad_impls)``: with the default order (``implementation`` and ``config`` ``None``),
    :func:`blocksparse.ops.gnn.order.choice`'s for graph ``g`` and features ``x`` ``(N, H, D)``, for the forward
    alone and under ``jax.grad``; else ``(impls, None)``."""
    if implementation is not None or config is not None:
        return impls, None
    feat = max(x.shape[1] * x.shape[2], 1)
    fwd, grad = (order.implementations(op, None, x.dtype, graph=g, feat=feat, pass_=p) for p in order.PASSES)
    return fwd, None if grad == fwd else grad


def _primal(name: str):
    fn = _module(name).attention_forward
    return lambda s, g, a, b, c: fn(s, g, a, b, c)[0]


def _forward(s: AttentionStatic, g, a, b, c):
    """The output, and what the backward recomputes the weights from: the output and log-sum-exp."""
    impls = s.grad_impls or s.impls
    table = _dispatch.with_reference_jvp(lambda name: _module(name).attention_forward)  # (grad of grad)
    out, lse = _dispatch.run(s.name, impls, table, s, g, a, b, c)
    return out, (out, lse)


def _backward(s: AttentionStatic, arrays, extra, dout):
    table = _dispatch.with_reference_jvp(lambda name: _module(name).attention_backward)
    return None, *_dispatch.run(s.name + "_bwd", s.grad_impls or s.impls, table, s, *arrays, *extra, dout)


# (static, graph, a, b, c) -> (N, H, D); the forward saves only the output and the log-sum-exp per (node, head)
_gat = _dispatch.differentiable("gatv2", _primal, _backward, _forward)
_dot = _dispatch.differentiable("graph_attention", _primal, _backward, _forward)


# ------------------------------------------------------------------------------------ public API
def _check_nhd(g: Graph | DynamicGraph, x, what: str):
    x = jnp.asarray(x)
    if x.ndim != 3:
        raise ValueError(f"Expected {what} of shape (num_nodes={g.num_nodes}, heads, head_dim). Got shape {x.shape}.")
    return g.check_features(x, what, ndim=3)


def _promoted(*xs: jax.Array) -> tuple[jax.Array, ...]:
    """The features in one dtype, ``jnp.result_type`` of them, as ``jnp`` ops promote: every backend then returns
    that dtype, and each input's gradient comes back in its own dtype."""
    dtype = jnp.result_type(*xs)
    return tuple(x.astype(dtype) for x in xs)


def gatv2(
    g: Graph | DynamicGraph,
    x_src,
    x_dst,
    att,
    negative_slope: float = 0.2,
    *,
    implementation=None,
    config: AttentionConfig | None = None,
    kernel_config=None,
) -> jax.Array:
    """GATv2 attention (Brody et al.) over each node's in-neighbours, fused.

    ``e_ij = sum_d att[h, d] * leaky_relu(x_src[j, h, d] + x_dst[i, h, d])``,
    ``alpha_ij = softmax_j(e_ij)`` over the in-neighbours ``j`` of ``i``,
    ``out[i, h] = sum_j alpha_ij x_src[j, h]``.

    Arguments:
        g: the :class:`Graph` or :class:`DynamicGraph` (edges ``j -> i``).
        x_src, x_dst: ``(N, H, D)`` projected source and destination features.
        att: ``(H, D)`` attention vector.
        negative_slope: of the leaky ReLU: a number known at trace time (the kernels compile it in); a traced
            value is a ``TypeError``.
        implementation: ``None`` (the order of :func:`blocksparse.ops.gnn.order.implementations`: Pallas on
            a GPU, else XLA), ``"pallas"``, ``"xla"`` or a sequence tried in order.
        config: ``None`` (the default tiling) or an :class:`~blocksparse.gnn.AttentionConfig`: how the Pallas
            kernels tile (heads per tile view, edges per step, warps, deferred edge sums), forward and
            backward; with ``implementation=None`` only the Pallas backend then runs. The result does not
            depend on it.
        kernel_config: deprecated (warns): ``config=``, kept as before: it tunes the Pallas kernels without
            restricting the implementation.

    Returns:
        ``(N, H, D)`` in ``jnp.result_type(x_src, x_dst)`` (``att``'s dtype does not promote it: a float32
        ``att`` with bfloat16 features gives bfloat16); nodes without in-edges get 0. Differentiable w.r.t.
        ``x_src``, ``x_dst`` and ``att`` (each gradient in its input's dtype); the backward recomputes the
        weights from the saved log-sum-exp.
    """
    check_graph(g)
    strict_config = config
    impls, config = _configs("gatv2", implementation, config, kernel_config)
    xs, xd = _check_nhd(g, x_src, "x_src"), _check_nhd(g, x_dst, "x_dst")
    if xd.shape != xs.shape:
        raise ValueError(f"Expected x_dst of the same shape as x_src {xs.shape}. Got {xd.shape}.")
    xs, xd = _promoted(xs, xd)
    att = jnp.asarray(att)
    if att.shape != xs.shape[1:]:
        raise ValueError(f"Expected att of shape (heads, head_dim) = {xs.shape[1:]}. Got {att.shape}.")
    if not jnp.issubdtype(att.dtype, jnp.floating):
        raise TypeError(f"Expected floating-point att. Got {att.dtype}.")
    slope = _static_number(negative_slope, "negative_slope", "gatv2")
    if slope is None:
        raise TypeError(
            "Expected gatv2's negative_slope to be a number known when the function is traced (the kernels compile it "
            "in; it is not differentiable). Got a traced value: pass it as a Python float, or mark it static "
            "(jax.jit(..., static_argnames=...))."
        )
    valid = g.validity() if isinstance(g, DynamicGraph) else None  # NaN out (and NaN gradients) if invalid
    xs, xd, att = (poison(valid, t) for t in (xs, xd, att))
    if g.edge_capacity == 0 or xs.size == 0:
        return nan_unless(valid, jnp.zeros_like(xs))
    impls, grad = _by_graph("gatv2", impls, implementation, strict_config, g, xs)
    static = AttentionStatic(impls, "gat", slope=slope, config=config, grad_impls=grad)
    return nan_unless(valid, _gat(static, g, xs, xd, att))


def graph_attention(
    g: Graph | DynamicGraph,
    q,
    k,
    v,
    scale: float | None = None,
    *,
    implementation=None,
    config: AttentionConfig | None = None,
    kernel_config=None,
) -> jax.Array:
    """Dot-product attention over each node's in-neighbours (graph transformer), fused.

    ``out[i, h] = sum_j softmax_j(scale * q[i, h] . k[j, h]) v[j, h]`` over the in-neighbours
    ``j`` of ``i``.

    Arguments:
        g: the :class:`Graph` or :class:`DynamicGraph` (edges ``j -> i``).
        q, k, v: ``(N, H, D)``.
        scale: defaults to ``1 / sqrt(D)``. A Python number is compiled into the kernels (it scales the float32
            logits); a traced scalar (a learned temperature, under ``jit`` or ``grad``) multiplies ``q`` first,
            rounded to ``q``'s dtype (a float16 ``q`` times a large scale can overflow where the number would not),
            and gets its gradient.
        implementation: ``None`` (Pallas on a GPU, else XLA), ``"pallas"``, ``"xla"`` or a
            sequence tried in order.
        config, kernel_config: as for :func:`gatv2`.

    Returns:
        ``(N, H, D)`` in ``jnp.result_type(q, k, v)``; nodes without in-edges get 0. Differentiable w.r.t.
        ``q``, ``k`` and ``v`` (each gradient in its input's dtype).
    """
    check_graph(g)
    strict_config = config
    impls, config = _configs("graph_attention", implementation, config, kernel_config)
    q, k, v = _check_nhd(g, q, "q"), _check_nhd(g, k, "k"), _check_nhd(g, v, "v")
    if k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"Expected q, k and v of one shape. Got {q.shape}, {k.shape} and {v.shape}.")
    q, k, v = _promoted(q, k, v)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1]) if q.shape[-1] else 1.0  # (head_dim 0: an empty result either way)
    static_scale = _static_number(scale, "scale", "graph_attention")
    if static_scale is None:  # a traced scale (a learned temperature): scale q by it, differentiably, and use 1
        wide = jnp.promote_types(q.dtype, jnp.float32)
        q, static_scale = (q.astype(wide) * jnp.asarray(scale, wide)).astype(q.dtype), 1.0
    valid = g.validity() if isinstance(g, DynamicGraph) else None
    q, k, v = (poison(valid, t) for t in (q, k, v))
    if g.edge_capacity == 0 or q.size == 0:
        return nan_unless(valid, jnp.zeros_like(v))
    impls, grad = _by_graph("graph_attention", impls, implementation, strict_config, g, v)
    static = AttentionStatic(impls, "dot", scale=static_scale, config=config, grad_impls=grad)
    return nan_unless(valid, _dot(static, g, k, q, v))
