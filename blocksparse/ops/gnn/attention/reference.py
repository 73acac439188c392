"""Pure-JAX graph attention: the fallback on every machine and the oracle for the kernels.

Segment ops over the edges in CSR order: per-edge logits ``(E, H)``, a softmax per destination
(shifted by its maximum) and the weighted sum of per-edge values ``(E, H, D)``; the backward is
JAX's VJP of the same computation. Unlike the kernels it materialises ``E x H x D``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ....graph import DynamicGraph, Graph


def _softmax_aggregate(g: Graph | DynamicGraph, e, vals):
    """Softmax of logits ``e (E, H)`` over each destination's in-edges, applied to ``vals (E, H, D)``."""
    seg = jnp.asarray(g.dst_sorted)
    n = g.num_nodes
    if isinstance(g, DynamicGraph):  # padding positions (segment n): weight exactly 0, in value and gradient
        e = jnp.where((seg < n)[:, None], e, -jnp.inf)
    m = jax.ops.segment_max(e, seg, n, indices_are_sorted=True)
    m = jax.lax.stop_gradient(jnp.where(jnp.isfinite(m), m, 0.0))  # shift only; softmax is invariant
    p = jnp.exp(e - m[seg])
    den = jax.ops.segment_sum(p, seg, n, indices_are_sorted=True)
    num = jax.ops.segment_sum(p[..., None] * vals, seg, n, indices_are_sorted=True)
    has = den != 0  # in-edges with a weight; a NaN sum (a NaN or +inf logit) is kept: NaN, as jax.nn.softmax gives
    safe = jnp.where(has, den, 1.0)
    out = jnp.where(has[..., None], num / safe[..., None], 0.0)
    lse = jnp.where(has, m + jnp.log(safe), -jnp.inf)
    return out, lse


def _gat(g: Graph | DynamicGraph, xs, xd, att, slope):
    src, dst = jnp.asarray(g.indices), jnp.asarray(g.dst_sorted)
    xs32, xd32, a32 = (t.astype(jnp.float32) for t in (xs, xd, att))
    z = xs32[src] + xd32[dst]
    e = jnp.sum(jnp.where(z > 0, z, slope * z) * a32, axis=-1)
    out, lse = _softmax_aggregate(g, e, xs32[src])
    return out.astype(xs.dtype), lse


def _dot(g: Graph | DynamicGraph, k, q, v, scale):
    src, dst = jnp.asarray(g.indices), jnp.asarray(g.dst_sorted)
    k32, q32, v32 = (t.astype(jnp.float32) for t in (k, q, v))
    e = jnp.sum(q32[dst] * k32[src], axis=-1) * scale
    out, lse = _softmax_aggregate(g, e, v32[src])
    return out.astype(v.dtype), lse


def attention_forward(s, g, a, b, c):
    """``(out (N, H, D), lse (N, H))`` over graph ``g`` for ``s.mode`` "gat" (``a, b, c = x_src,
    x_dst, att``) or "dot" (``a, b, c = k, q, v``); ``s`` carries ``mode``, ``slope`` and ``scale``."""
    if s.mode == "gat":
        return _gat(g, a, b, c, s.slope)
    return _dot(g, a, b, c, s.scale)


def attention_backward(s, g, a, b, c, out, lse, dout):
    """Cotangents of ``a, b, c`` (recomputed: ``out`` and ``lse`` are not needed here)."""
    del out, lse
    _, vjp = jax.vjp(lambda a, b, c: attention_forward(s, g, a, b, c)[0], a, b, c)
    return vjp(dout)
