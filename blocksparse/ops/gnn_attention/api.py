"""Graph attention over in-neighbours: GATv2 and dot-product (graph transformer) attention.

Both ops are one ``custom_vjp`` each: the forward saves only the output and the log-sum-exp per
(node, head); the backward recomputes the attention weights. The Pallas path never materialises
a per-edge tensor; the XLA reference (segment ops over the edges, ``E x H x D``) is the oracle and
the CPU path.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from ..._util import next_power_of_2
from ...gnn._graph import Graph
from .. import _dispatch

__all__ = ["gatv2", "graph_attention", "gatv2_reference", "graph_attention_reference"]

_IMPLS = ("pallas", "xla")
DEFAULT = ("pallas", "xla")


# ------------------------------------------------------------------------------ reference (XLA)
def _softmax_aggregate(g: Graph, e, vals):
    """Softmax of logits ``e (E, H)`` over each destination's in-edges, applied to ``vals (E, H, D)``."""
    seg = jnp.asarray(g.dst_sorted)
    n = g.num_nodes
    m = jax.ops.segment_max(e, seg, n, indices_are_sorted=True)
    m = jax.lax.stop_gradient(jnp.where(jnp.isfinite(m), m, 0.0))  # shift only; softmax is invariant
    p = jnp.exp(e - m[seg])
    den = jax.ops.segment_sum(p, seg, n, indices_are_sorted=True)
    num = jax.ops.segment_sum(p[..., None] * vals, seg, n, indices_are_sorted=True)
    has = den > 0
    safe = jnp.where(has, den, 1.0)
    out = jnp.where(has[..., None], num / safe[..., None], 0.0)
    lse = jnp.where(has, m + jnp.log(safe), -jnp.inf)
    return out, lse


def _ref_gat(g: Graph, xs, xd, att, slope):
    src, dst = jnp.asarray(g.indices), jnp.asarray(g.dst_sorted)
    xs32, xd32, a32 = (t.astype(jnp.float32) for t in (xs, xd, att))
    z = xs32[src] + xd32[dst]
    e = jnp.sum(jnp.where(z > 0, z, slope * z) * a32, axis=-1)
    out, lse = _softmax_aggregate(g, e, xs32[src])
    return out.astype(xs.dtype), lse


def _ref_dot(g: Graph, k, q, v, scale):
    src, dst = jnp.asarray(g.indices), jnp.asarray(g.dst_sorted)
    k32, q32, v32 = (t.astype(jnp.float32) for t in (k, q, v))
    e = jnp.sum(q32[dst] * k32[src], axis=-1) * scale
    out, lse = _softmax_aggregate(g, e, v32[src])
    return out.astype(v.dtype), lse


def _ref(g, mode, slope, scale, a, b, c):
    return _ref_gat(g, a, b, c, slope) if mode == "gat" else _ref_dot(g, a, b, c, scale)


def _xla_fwd(g, mode, slope, scale, a, b, c):
    return _ref(g, mode, slope, scale, a, b, c)


def _xla_bwd(g, mode, slope, scale, a, b, c, out, lse, dout):
    _, vjp = jax.vjp(lambda a, b, c: _ref(g, mode, slope, scale, a, b, c)[0], a, b, c)
    return vjp(dout)


# ------------------------------------------------------------------------------------ Pallas
def _flat(x, hp, dp):
    """``(N, H, D)`` -> ``(N, Hp * Dp)`` zero-padded (``(H, D)`` -> ``(Hp * Dp,)``)."""
    pad = [(0, 0)] * (x.ndim - 2) + [(0, hp - x.shape[-2]), (0, dp - x.shape[-1])]
    x = jnp.pad(x, pad) if any(p[1] for p in pad) else x
    return x.reshape(*x.shape[:-2], hp * dp)


def _geometry(a):
    n, h, d = a.shape
    return n, h, d, next_power_of_2(h), next_power_of_2(d, 4)


def _pallas_fwd(g, mode, slope, scale, a, b, c):
    from . import pallas_triton as K

    n, h, d, hp, dp = _geometry(a)
    out, lse = K.forward(g, mode, _flat(a, hp, dp), _flat(b, hp, dp), _flat(c, hp, dp), hp, slope, scale)
    return out.reshape(n, hp, dp)[:, :h, :d], lse


def _pallas_bwd(g, mode, slope, scale, a, b, c, out, lse, dout):
    from . import pallas_triton as K

    n, h, d, hp, dp = _geometry(a)
    f = lambda t: _flat(t, hp, dp)
    da, db, dc = K.backward(g, mode, f(a), f(b), f(c), f(out), lse, f(dout), hp, slope, scale)
    da = da.reshape(n, hp, dp)[:, :h, :d].astype(a.dtype)
    db = db.reshape(n, hp, dp)[:, :h, :d].astype(b.dtype)
    dc = dc.reshape(*c.shape[:-2], hp, dp)[..., :h, :d].astype(c.dtype)
    return da, db, dc


_FWD = {"xla": _xla_fwd, "pallas": _pallas_fwd}
_BWD = {"xla": _xla_bwd, "pallas": _pallas_bwd}


def _name(mode):
    return "gatv2" if mode == "gat" else "graph_attention"


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3, 4))
def _attention(g, impls, mode, slope, scale, a, b, c):
    return _dispatch.run(_name(mode), impls, _FWD, g, mode, slope, scale, a, b, c)[0]


def _attention_fwd(g, impls, mode, slope, scale, a, b, c):
    out, lse = _dispatch.run(_name(mode), impls, _FWD, g, mode, slope, scale, a, b, c)
    return out, (a, b, c, out, lse)


def _attention_bwd(g, impls, mode, slope, scale, res, dout):
    a, b, c, out, lse = res
    grads = _dispatch.run(_name(mode) + "_bwd", impls, _BWD, g, mode, slope, scale, a, b, c, out, lse, dout)
    return tuple(_dispatch.cotangent_like(d, p) for d, p in zip(grads, (a, b, c), strict=True))


_attention.defvjp(_attention_fwd, _attention_bwd)


# ------------------------------------------------------------------------------------ public API
def _check_nhd(g: Graph, x, what: str):
    x = jnp.asarray(x)
    if x.ndim != 3:
        raise ValueError(f"Expected {what} of shape (num_nodes={g.num_nodes}, heads, head_dim). Got shape {x.shape}.")
    return g.check_features(x, what, ndim=3)


def gatv2(g: Graph, x_src, x_dst, att, negative_slope: float = 0.2, *, implementation=None) -> jax.Array:
    """GATv2 attention (Brody et al.) over each node's in-neighbours, fused.

    ``e_ij = sum_d att[h, d] * leaky_relu(x_src[j, h, d] + x_dst[i, h, d])``,
    ``alpha_ij = softmax_j(e_ij)`` over the in-neighbours ``j`` of ``i``,
    ``out[i, h] = sum_j alpha_ij x_src[j, h]``.

    Arguments:
        g: the :class:`Graph` (edges ``j -> i``).
        x_src, x_dst: ``(N, H, D)`` projected source and destination features.
        att: ``(H, D)`` attention vector.
        negative_slope: of the leaky ReLU.
        implementation: ``None`` (Pallas on a GPU, else XLA), ``"pallas"``, ``"xla"`` or a
            sequence tried in order.

    Returns:
        ``(N, H, D)``; nodes without in-edges get 0. Differentiable w.r.t. ``x_src``, ``x_dst`` and
        ``att``; the backward recomputes the weights from the saved log-sum-exp.
    """
    if not isinstance(g, Graph):
        raise TypeError(f"Expected a blocksparse.gnn.Graph. Got {type(g).__name__}.")
    impls = _dispatch.resolve(implementation, DEFAULT, _IMPLS)
    xs, xd = _check_nhd(g, x_src, "x_src"), _check_nhd(g, x_dst, "x_dst")
    if xd.shape != xs.shape:
        raise ValueError(f"Expected x_dst of the same shape as x_src {xs.shape}. Got {xd.shape}.")
    att = jnp.asarray(att)
    if att.shape != xs.shape[1:]:
        raise ValueError(f"Expected att of shape (heads, head_dim) = {xs.shape[1:]}. Got {att.shape}.")
    if not jnp.issubdtype(att.dtype, jnp.floating):
        raise TypeError(f"Expected floating-point att. Got {att.dtype}.")
    if g.num_edges == 0 or xs.size == 0:
        return jnp.zeros_like(xs)
    return _attention(g, impls, "gat", float(negative_slope), 1.0, xs, xd, att)


def graph_attention(g: Graph, q, k, v, scale: float | None = None, *, implementation=None) -> jax.Array:
    """Dot-product attention over each node's in-neighbours (graph transformer), fused.

    ``out[i, h] = sum_j softmax_j(scale * q[i, h] . k[j, h]) v[j, h]`` over the in-neighbours
    ``j`` of ``i``.

    Arguments:
        g: the :class:`Graph` (edges ``j -> i``).
        q, k, v: ``(N, H, D)``.
        scale: defaults to ``1 / sqrt(D)``.
        implementation: ``None`` (Pallas on a GPU, else XLA), ``"pallas"``, ``"xla"`` or a
            sequence tried in order.

    Returns:
        ``(N, H, D)``; nodes without in-edges get 0. Differentiable w.r.t. ``q``, ``k`` and ``v``.
    """
    if not isinstance(g, Graph):
        raise TypeError(f"Expected a blocksparse.gnn.Graph. Got {type(g).__name__}.")
    impls = _dispatch.resolve(implementation, DEFAULT, _IMPLS)
    q, k, v = _check_nhd(g, q, "q"), _check_nhd(g, k, "k"), _check_nhd(g, v, "v")
    if k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"Expected q, k and v of one shape. Got {q.shape}, {k.shape} and {v.shape}.")
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    if g.num_edges == 0 or q.size == 0:
        return jnp.zeros_like(v)
    return _attention(g, impls, "dot", 0.0, float(scale), k, q, v)


def gatv2_reference(g, x_src, x_dst, att, negative_slope=0.2):
    return gatv2(g, x_src, x_dst, att, negative_slope, implementation="xla")


def graph_attention_reference(g, q, k, v, scale=None):
    return graph_attention(g, q, k, v, scale, implementation="xla")
