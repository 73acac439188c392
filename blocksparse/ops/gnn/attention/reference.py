"""Pure-JAX graph attention: the fallback on every machine and the oracle for the kernels.

Segment ops over the edges in CSR order: per-edge logits ``(E, H)``, a softmax per destination
(shifted by its maximum) and the weighted sum of per-edge values ``(E, H, D)``. The backward recomputes the
logits and takes the weights from the saved log-sum-exp (the kernels' formula, in segment ops); a test checks it
against JAX's VJP of the forward. Unlike the kernels it materialises ``E x H x D``.
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
    return out, log_sum_exp(m, jnp.log(safe), has)


def log_sum_exp(m, logl, has):
    """``m + logl`` as a float32 pair ``(hi, lo)``, ``hi = m + logl`` rounded and ``lo`` what the rounding lost
    (``hi`` ``-inf`` and ``lo`` 0 where ``has`` is false: no weighted in-edge).

    With logits of 1e4 and more, ``hi`` alone has lost the digits of ``logl``, and every weight ``exp(e - hi)`` into
    a destination shares that error (two equal logits of 9e6 would weigh 0.37 each); ``exp((e - hi) - lo)`` does
    not (``e - hi`` is exact when the weight is not negligible)."""
    hi = m + logl
    return jnp.where(has, hi, -jnp.inf), jnp.where(has, (m - hi) + logl, 0.0)


def _logits(s, g: Graph | DynamicGraph, a, b, c):
    """Per-edge float32 ``(logits (E, H), values (E, H, D), terms)`` of ``s.mode``; ``terms``, what the backward
    differentiates: "gat" ``(z, leaky_relu(z))`` with ``z = x_src[src] + x_dst[dst]``, "dot" ``(q[dst], k[src])``."""
    src, dst = jnp.asarray(g.indices), jnp.asarray(g.dst_sorted)
    a32, b32, c32 = (t.astype(jnp.float32) for t in (a, b, c))
    if s.mode == "gat":  # a, b, c = x_src, x_dst, att
        z = a32[src] + b32[dst]
        lz = jnp.where(z > 0, z, s.slope * z)
        return jnp.sum(lz * c32, axis=-1), a32[src], (z, lz)
    qd, ks = b32[dst], a32[src]  # a, b, c = k, q, v
    return jnp.sum(qd * ks, axis=-1) * s.scale, c32[src], (qd, ks)


def attention_forward(s, g, a, b, c):
    """``(out (N, H, D), lse)`` over graph ``g`` for ``s.mode`` "gat" (``a, b, c = x_src, x_dst, att``) or "dot"
    (``a, b, c = k, q, v``); ``s`` carries ``mode``, ``slope`` and ``scale``. ``lse``: the log-sum-exp per (node, head)
    as the pair of :func:`log_sum_exp`, each ``(N, H)``."""
    e, vals, _ = _logits(s, g, a, b, c)
    out, lse = _softmax_aggregate(g, e, vals)
    return out.astype((a if s.mode == "gat" else c).dtype), lse  # x_src's or v's dtype


def attention_backward(s, g, a, b, c, out, lse, dout):
    """Cotangents of ``a, b, c`` from the saved log-sum-exp: the logits are recomputed, not the forward's segment
    reductions (as the kernels do).

    With ``w = exp((e - hi[dst]) - lo[dst])`` each edge's softmax weight (``lse = (hi, lo)``, :func:`log_sum_exp`),
    ``dp = dout[dst] . v`` and ``delta`` its ``w``-weighted sum per destination, a logit's cotangent is
    ``w (dp - delta[dst])`` and a value's ``w dout[dst]``. ``delta`` is summed from the edges in float32 (not from
    ``out``, which may be rounded to a 2-byte dtype). ``lse`` may be padded past ``H`` (the kernels'); a destination
    of ``hi = -inf`` (no weighted in-edge) passes nothing back."""
    del out
    src, dst = jnp.asarray(g.indices), jnp.asarray(g.dst_sorted)
    n = g.num_nodes
    do = dout.astype(jnp.float32)[dst]  # (E, H, D)
    e, vals, terms = _logits(s, g, a, b, c)
    hi, lo = (t[:, : e.shape[1]].astype(jnp.float32)[dst] for t in lse)
    dead = jnp.isneginf(hi) | (dst >= n)[:, None]  # padding edges (segment n) and destinations without weight
    w = jnp.where(dead, 0.0, jnp.exp(jnp.where(dead, 0.0, (e - hi) - lo)))  # (the inner where: no NaN in its grad)
    dp = jnp.sum(do * vals, axis=-1)
    delta = jax.ops.segment_sum(w * dp, dst, n, indices_are_sorted=True)
    de = jnp.where(dead, 0.0, w * (dp - delta[dst]))[..., None]  # (E, H, 1)
    live = ~dead[..., None]  # every per-edge product masked: a padding edge reads a clamped row, maybe inf or NaN
    dvals = jnp.where(live, w[..., None] * do, 0.0)
    if s.mode == "gat":
        z, lz = terms
        dz = jnp.where(live, de * c.astype(jnp.float32) * jnp.where(z > 0, 1.0, s.slope), 0.0)
        da = jax.ops.segment_sum(dz + dvals, src, n)
        db = jax.ops.segment_sum(dz, dst, n, indices_are_sorted=True)
        dc = jnp.sum(jnp.where(live, de * lz, 0.0), axis=0)
    else:
        qd, ks = terms
        da = jax.ops.segment_sum(jnp.where(live, de * s.scale * qd, 0.0), src, n)
        db = jax.ops.segment_sum(jnp.where(live, de * s.scale * ks, 0.0), dst, n, indices_are_sorted=True)
        dc = jax.ops.segment_sum(dvals, src, n)
    return da.astype(a.dtype), db.astype(b.dtype), dc.astype(c.dtype)
