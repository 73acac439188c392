"""Fused graph attention (GATv2 and dot-product), FlashAttention-style, in Pallas.

Layout: per-head features are flattened to ``(N, Hp * Dp)`` with ``Dp`` the head size and ``Hp``
the number of heads, both padded to powers of two (padding is zero and contributes nothing).
Programs are ``(unit, head block)``: a block of ``hb`` heads (``hb * Dp <= 128``) is gathered as one
``(be, hb * Dp)`` tile of whole rows and viewed as ``(be, hb, Dp)``, so with small heads one
program serves all of a node's heads (one row gather instead of ``H`` narrow ones).

- forward (one pass per destination node): online softmax over in-neighbours; writes the output
  and the log-sum-exp per (node, head) only;
- backward, destination pass (CSR by destination): recomputes the weights from the saved
  log-sum-exp and writes ``dx_dst`` / ``dq`` (and, for GATv2, per-node partials of ``datt``);
- backward, source pass (the cached transpose, CSR by source): recomputes the weights of each
  out-edge and writes ``dx_src`` / ``dk``, ``dv``.

No E x H x D or E x H tensor exists at any point; heavy nodes' extra chunks produce partial rows
combined per node with segment ops (a log-sum-exp merge in the forward, sums in the backward).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from ...._util import next_power_of_2
from ....graph import DynamicGraph, Graph
from .. import triton_common as P
from ..config import AttentionConfig
from ..order import attention_edges_per_step, attention_layout, attention_narrow_loads
from .reference import log_sum_exp


def _shift(m):
    """A running maximum as the softmax's shift: ``-inf`` (no finite logit yet) shifts by 0, so the weights of
    ``-inf`` logits are ``exp(-inf) = 0``, not ``exp(-inf - -inf) = NaN`` (a finite start such as -1e30 would instead
    take logits below it for weightless)."""
    return jnp.where(m == -jnp.inf, 0.0, m)


def _zeros(shape):
    return jnp.zeros(shape, jnp.float32)


def _lrelu(z, slope):
    return jnp.where(z > 0, z, slope * z)


class _View:
    """How a program's ``w = hb * Dp`` columns are laid out (see :data:`..config.LAYOUTS`).

    ``heads``: tiles ``(be, hb, Dp)``, rows ``(hb, Dp)``, per-edge values ``(be, hb)``, per-head ``(hb,)``.
    ``flat`` / ``groups`` (one head, ``hb == 1``): tiles ``(be, Dp)`` / ``(be, Dp // 16, 16)``, rows
    ``(Dp,)`` / ``(Dp // 16, 16)``, per-edge values ``(be,)`` and per-head scalars; the log-sum-exp and
    ``delta`` arrays come flattened to ``(N * Hp,)`` (node ``i``, head ``h`` at ``i * Hp + h``).
    """

    def __init__(self, layout: str, be: int, hb: int, dp: int, heads: int, narrow: bool = False):
        self.layout, self.be, self.hb, self.dp, self.heads, self.narrow = layout, be, hb, dp, heads, narrow
        self.w = hb * dp
        self.one = layout != "heads"
        self.tshape = {"heads": (be, hb, dp), "flat": (be, dp), "groups": (be, dp // 16, 16)}[layout]
        self.rshape = self.tshape[1:]
        self.eshape = (be, hb) if layout == "heads" else (be,)
        self.hshape = (hb,) if layout == "heads" else ()

    def __hash__(self):  # a static kernel argument
        return hash(self._key())

    def _key(self):
        return (self.layout, self.be, self.hb, self.dp, self.heads, self.narrow)

    def __eq__(self, other):
        return isinstance(other, _View) and self._key() == other._key()

    def cols(self, blk):
        return blk * self.w + jnp.arange(self.w, dtype=jnp.int32)

    def _shape(self, x, shape):
        return x if self.layout == "flat" else x.reshape(shape)

    def tile(self, ref, idx, cols, m2):
        """The ``(be, w)`` gather of rows ``idx``, in the tile shape (``narrow``: :func:`..triton_common.lanes`)."""
        return self._shape(P.gather(ref, idx, cols, m2, self.narrow), self.tshape)

    def row(self, ref, node, blk):
        return self._shape(ref[node, pl.ds(blk * self.w, self.w)].astype(jnp.float32), self.rshape)

    def vec(self, ref, blk):
        return self._shape(ref[pl.ds(blk * self.w, self.w)].astype(jnp.float32), self.rshape)

    def out_row(self, r):
        """A row (``rshape``) as the ``(w,)`` output row."""
        return self._shape(r, (self.w,))

    def dsum(self, t):
        """Per (edge, head) sums over the features of a tile: ``eshape``."""
        if self.layout == "heads":
            return jnp.sum(t, axis=2)
        if self.layout == "flat":
            return jnp.sum(t, axis=1)
        return jnp.sum(jnp.sum(t, axis=2), axis=1)

    def ebc(self, s):
        """Per (edge, head) values ``eshape`` broadcastable against a tile."""
        return {"heads": lambda: s[:, :, None], "flat": lambda: s[:, None], "groups": lambda: s[:, None, None]}[
            self.layout
        ]()

    def hbc(self, v):
        """Per-head values ``hshape`` broadcastable against a row."""
        return v[:, None] if self.layout == "heads" else v

    def emask(self, msk):
        """The edge mask ``(be,)`` against per (edge, head) values."""
        return msk[:, None] if self.layout == "heads" else msk

    def node_heads(self, ref, node, blk):
        """This program's heads of a per-(node, head) array at ``node``: ``hshape``."""
        if self.layout == "heads":
            return ref[node, pl.ds(blk * self.hb, self.hb)]
        return ref[node * self.heads + blk]

    def gather_heads(self, ref, idx, blk, msk):
        """This program's heads of a per-(node, head) array at rows ``idx``: ``eshape`` (0 where masked)."""
        if self.layout == "heads":
            hcols = blk * self.hb + jnp.arange(self.hb, dtype=jnp.int32)
            return P.gather(ref, idx, hcols, jnp.broadcast_to(msk[:, None], self.eshape))
        return P.load_at(ref, idx * self.heads + blk, msk).astype(jnp.float32)

    def store_heads(self, ref, v):
        ref[0, :] = v if self.layout == "heads" else jnp.broadcast_to(v, (1,))


# ----------------------------------------------------------------------------------- forward
def _fwd_kernel(starts_ref, ends_ref, nodes_ref, indices_ref, *refs, view, deferred, mode, slope, scale):
    if mode == "gat":
        xs_ref, xd_ref, att_ref, o_ref, hi_ref, lo_ref = refs
    else:
        xs_ref, xd_ref, v_ref, o_ref, hi_ref, lo_ref = refs  # xs = k, xd = q
    v, be, w = view, view.be, view.w
    u, blk = pl.program_id(0), pl.program_id(1)
    start, end, node = starts_ref[u], ends_ref[u], nodes_ref[u]
    cols = v.cols(blk)
    qrow = v.row(xd_ref, node, blk)
    att = v.vec(att_ref, blk) if mode == "gat" else None

    def step(c):
        """Masked logits (-inf where masked) and values of edge tile ``c``."""
        off, _, msk = P.edge_tile(start, c, end, be)
        idx = P.load_ids(indices_ref, off, msk, be)
        m2 = jnp.broadcast_to(msk[:, None], (be, w))
        kt = v.tile(xs_ref, idx, cols, m2)
        if mode == "gat":
            s = v.dsum(_lrelu(kt + qrow[None], slope) * att[None])
        else:
            s = v.dsum(kt * qrow[None]) * scale
        e = jnp.where(v.emask(msk), s, -jnp.inf)
        vt = kt if mode == "gat" else v.tile(v_ref, idx, cols, m2)
        return e, vt

    def body(c, carry):  # one online softmax per head: reductions over the edge axis at every step
        m_i, l_i, acc = carry
        e, vt = step(c)
        m_new = jnp.maximum(m_i, jnp.max(e, axis=0))
        shift = _shift(m_new)
        p = jnp.exp(e - shift)
        corr = jnp.exp(m_i - shift)
        acc = acc * v.hbc(corr) + jnp.sum(v.ebc(p) * vt, axis=0)
        return m_new, l_i * corr + jnp.sum(p, axis=0), acc

    def body_rows(c, carry):  # one online softmax per (row of the tile, head), merged after the loop
        m_r, l_r, acc_r = carry
        e, vt = step(c)
        m_new = jnp.maximum(m_r, e)
        shift = _shift(m_new)
        p = jnp.exp(e - shift)
        corr = jnp.exp(m_r - shift)
        return m_new, l_r * corr + p, acc_r * v.ebc(corr) + v.ebc(p) * vt

    steps = P.num_chunks(start, end, be)
    if deferred:
        init = (jnp.full(v.eshape, -jnp.inf, jnp.float32), jnp.zeros(v.eshape, jnp.float32), _zeros(v.tshape))
        m_r, l_r, acc_r = lax.fori_loop(0, steps, body_rows, init)
        m_i = jnp.max(m_r, axis=0)
        wgt = jnp.exp(m_r - _shift(m_i))  # rows never reached: exp(-inf - m_i) = 0 (with l = 0 where none was)
        l_i = jnp.sum(l_r * wgt, axis=0)
        acc = jnp.sum(acc_r * v.ebc(wgt), axis=0)
    else:
        init = (jnp.full(v.hshape, -jnp.inf, jnp.float32), jnp.zeros(v.hshape, jnp.float32), _zeros(v.rshape))
        m_i, l_i, acc = lax.fori_loop(0, steps, body, init)
    has = l_i != 0  # as the reference: a NaN sum (a NaN or +inf logit) gives NaN, not the empty node's 0
    safe = jnp.where(has, l_i, 1.0)
    o_ref[0, :] = v.out_row(jnp.where(v.hbc(has), acc / v.hbc(safe), 0.0)).astype(o_ref.dtype)
    hi, lo = log_sum_exp(m_i, jnp.log(safe), has)
    v.store_heads(hi_ref, hi)
    v.store_heads(lo_ref, lo)


class _Shape:
    """Static kernel geometry for ``heads`` (padded) heads of ``dp`` features, under ``config``."""

    def __init__(self, heads: int, dp: int, config: AttentionConfig | None = None):
        config = AttentionConfig() if config is None else config
        self.heads, self.dp = heads, dp
        self.hb = min(heads, max(1, 128 // dp))
        self.nblk = heads // self.hb
        w = self.hb * dp
        self.be = attention_edges_per_step(w, config)
        default_warps = 4 if self.be * w >= 2048 else (2 if self.be * w >= 512 else 1)
        self.warps = config.num_warps or default_warps
        one = self.hb == 1 and dp >= 32  # flat / groups: one head per program
        self.layout = attention_layout(one, config)
        self.deferred = config.deferred if config.deferred is not None else self.layout == "flat"
        self.view = _View(self.layout, self.be, self.hb, dp, heads, attention_narrow_loads(config))

    def kw(self):
        return dict(view=self.view, deferred=self.deferred)

    def heads_array(self, a):
        """A per-(node, head) array as the kernels read it: ``(N, Hp)``, flattened for one-head layouts."""
        return a.reshape(-1) if self.view.one else a


def _fwd_call(units, indices, xs, xd, third, sh, out_dtype, mode, slope, scale, interpret):
    starts, ends, nodes = units
    nu = starts.shape[0]
    return pl.pallas_call(
        functools.partial(_fwd_kernel, mode=mode, slope=slope, scale=scale, **sh.kw()),
        grid=(nu, sh.nblk),
        out_specs=[
            pl.BlockSpec((1, sh.hb * sh.dp), lambda u, b: (u, b)),
            pl.BlockSpec((1, sh.hb), lambda u, b: (u, b)),
            pl.BlockSpec((1, sh.hb), lambda u, b: (u, b)),
        ],
        out_shape=[
            jax.ShapeDtypeStruct((nu, sh.heads * sh.dp), out_dtype),
            jax.ShapeDtypeStruct((nu, sh.heads), jnp.float32),
            jax.ShapeDtypeStruct((nu, sh.heads), jnp.float32),
        ],
        interpret=interpret,
        compiler_params=P.params(sh.warps),
        name=f"gnn_{mode}_fwd",
    )(starts, ends, nodes, indices, xs, xd, third)


def flat_forward(
    g: Graph | DynamicGraph, mode: str, xs, xd, third, heads: int, slope: float, scale: float, config=None
):
    """xs, xd, (v): ``(N, Hp*Dp)``; third: att ``(Hp*Dp,)`` or v. Returns out ``(N, Hp*Dp)`` and the log-sum-exp as
    the pair ``(hi, lo)`` of :func:`..reference.log_sum_exp`, each ``(N, Hp)``.

    ``config``: an :class:`AttentionConfig` (``None``: the default geometry)."""
    interpret = P.interpret_mode()
    P.check_dtype(xs, xd, third)
    sh = _Shape(heads, xs.shape[1] // heads, config)
    indices = jnp.asarray(g.indices)
    split = P.split_units(g)  # heavy nodes: all their chunks as extra units, so the main output is xs's dtype
    out, hi, lo = _fwd_call(split.main, indices, xs, xd, third, sh, xs.dtype, mode, slope, scale, interpret)
    if split.extra is not None:
        o1, h1, l1 = _fwd_call(split.extra, indices, xs, xd, third, sh, jnp.float32, mode, slope, scale, interpret)
        heavy, seg, srt = split.heavy, split.segments, split.is_sorted
        nh = heavy.shape[0]
        mx = jax.ops.segment_max(h1, seg, nh, indices_are_sorted=srt)
        mx = jnp.where(mx == -jnp.inf, 0.0, mx)  # every logit -inf: weights 0, as a light node's (NaN stays NaN)
        wgt = jnp.exp((h1 - mx[jnp.minimum(seg, nh - 1)]) + l1)  # (unused units: out-of-range segments, dropped)
        tot = jax.ops.segment_sum(wgt, seg, nh, indices_are_sorted=srt)
        o_h = jax.ops.segment_sum(wgt[..., None] * o1.reshape(-1, heads, sh.dp), seg, nh, indices_are_sorted=srt)
        has = tot != 0
        safe = jnp.where(has, tot, 1.0)
        o_h = jnp.where(has[..., None], o_h / safe[..., None], 0.0)
        out = out.at[heavy].set(o_h.reshape(nh, -1).astype(out.dtype), unique_indices=True, mode="drop")
        h_h, l_h = log_sum_exp(mx, jnp.log(safe), has)
        hi = hi.at[heavy].set(h_h, unique_indices=True, mode="drop")
        lo = lo.at[heavy].set(l_h, unique_indices=True, mode="drop")
    return out, (hi, lo)


# --------------------------------------------------------------------- backward, destination pass
def _bwd_dst_kernel(starts_ref, ends_ref, nodes_ref, indices_ref, *refs, view, deferred, mode, slope, scale):
    if mode == "gat":
        xs_ref, xd_ref, att_ref, do_ref, hi_ref, lo_ref, dl_ref, dxd_ref, datt_ref = refs
    else:
        xs_ref, xd_ref, v_ref, do_ref, hi_ref, lo_ref, dl_ref, dxd_ref = refs
    v, be, w = view, view.be, view.w
    u, blk = pl.program_id(0), pl.program_id(1)
    start, end, node = starts_ref[u], ends_ref[u], nodes_ref[u]
    cols = v.cols(blk)
    qrow = v.row(xd_ref, node, blk)
    dorow = v.row(do_ref, node, blk)
    hi, lo = v.node_heads(hi_ref, node, blk), v.node_heads(lo_ref, node, blk)
    delta = v.node_heads(dl_ref, node, blk)
    att = v.vec(att_ref, blk) if mode == "gat" else None
    red = (lambda t: t) if deferred else (lambda t: jnp.sum(t, axis=0))  # per-row partials, or summed now

    def body(c, carry):
        dq, da = carry
        off, _, msk = P.edge_tile(start, c, end, be)
        idx = P.load_ids(indices_ref, off, msk, be)
        m2 = jnp.broadcast_to(msk[:, None], (be, w))
        kt = v.tile(xs_ref, idx, cols, m2)
        vt = kt if mode == "gat" else v.tile(v_ref, idx, cols, m2)
        if mode == "gat":
            z = kt + qrow[None]
            lz = _lrelu(z, slope)
            e = v.dsum(lz * att[None])
        else:
            e = v.dsum(kt * qrow[None]) * scale
        alpha = jnp.where(v.emask(msk), jnp.exp((e - hi) - lo), 0.0)
        de = alpha * (v.dsum(vt * dorow[None]) - delta)
        if mode == "gat":
            dz = v.ebc(de) * att[None] * jnp.where(z > 0, 1.0, slope)
            return dq + red(dz), da + red(v.ebc(de) * lz)
        return dq + scale * red(v.ebc(de) * kt), da

    zero = jnp.zeros(v.tshape if deferred else v.rshape, jnp.float32)
    nothing = jnp.zeros((), jnp.float32)  # dot mode has no second sum
    dq, da = lax.fori_loop(0, P.num_chunks(start, end, be), body, (zero, zero if mode == "gat" else nothing))
    if deferred:
        dq = jnp.sum(dq, axis=0)
        da = jnp.sum(da, axis=0) if mode == "gat" else da
    dead = v.hbc(hi == -jnp.inf)  # no weighted in-edge: nothing passes back (its weights and products were NaN)
    dxd_ref[0, :] = v.out_row(jnp.where(dead, 0.0, dq)).astype(dxd_ref.dtype)
    if mode == "gat":
        datt_ref[0, :] = v.out_row(jnp.where(dead, 0.0, da)).astype(datt_ref.dtype)


# -------------------------------------------------------------------------- backward, source pass
def _bwd_src_kernel(starts_ref, ends_ref, nodes_ref, indices_ref, *refs, view, deferred, mode, slope, scale):
    # indices are destinations here (CSR of the transpose); node is the source j.
    if mode == "gat":
        xs_ref, xd_ref, att_ref, do_ref, hi_ref, lo_ref, dl_ref, dxs_ref = refs
    else:
        xs_ref, xd_ref, v_ref, do_ref, hi_ref, lo_ref, dl_ref, dk_ref, dv_ref = refs
    v, be, w = view, view.be, view.w
    u, blk = pl.program_id(0), pl.program_id(1)
    start, end, node = starts_ref[u], ends_ref[u], nodes_ref[u]
    cols = v.cols(blk)
    krow = v.row(xs_ref, node, blk)
    vrow = krow if mode == "gat" else v.row(v_ref, node, blk)
    att = v.vec(att_ref, blk) if mode == "gat" else None
    one_sum = deferred and mode == "gat"  # deferred: per-row partials, and GATv2's dk + dv in one accumulator

    def body(c, carry):
        dk, dv = carry
        off, _, msk = P.edge_tile(start, c, end, be)
        idx = P.load_ids(indices_ref, off, msk, be)
        m2 = jnp.broadcast_to(msk[:, None], (be, w))
        qt = v.tile(xd_ref, idx, cols, m2)
        dot = v.tile(do_ref, idx, cols, m2)
        hi, lo = v.gather_heads(hi_ref, idx, blk, msk), v.gather_heads(lo_ref, idx, blk, msk)
        delta = v.gather_heads(dl_ref, idx, blk, msk)
        if mode == "gat":
            z = krow[None] + qt
            e = v.dsum(_lrelu(z, slope) * att[None])
        else:
            e = v.dsum(qt * krow[None]) * scale
        live = v.emask(msk) & (hi != -jnp.inf)  # a destination without weight (every logit -inf) passes nothing
        alpha = jnp.where(live, jnp.exp((e - hi) - lo), 0.0)
        de = jnp.where(live, alpha * (v.dsum(dot * vrow[None]) - delta), 0.0)
        dv_t = jnp.where(v.ebc(live), v.ebc(alpha) * dot, 0.0)  # (its cotangent may be NaN: 0 x NaN)
        if mode == "gat":
            dk_t = v.ebc(de) * att[None] * jnp.where(z > 0, 1.0, slope)
        else:
            dk_t = jnp.where(v.ebc(live), v.ebc(de) * qt, 0.0)  # (a weightless destination's q may be infinite)
        if not deferred:
            part = jnp.sum(dk_t, axis=0)
            return dk + (part if mode == "gat" else scale * part), dv + jnp.sum(dv_t, axis=0)
        if mode == "gat":
            return dk + dk_t + dv_t, dv  # one accumulator: both are gradients w.r.t. x_src
        return dk + dk_t, dv + dv_t  # dk scaled after the loop

    acc = jnp.zeros(v.tshape if deferred else v.rshape, jnp.float32)
    init = (acc, jnp.zeros((), jnp.float32)) if one_sum else (acc, acc)
    dk, dv = lax.fori_loop(0, P.num_chunks(start, end, be), body, init)
    if deferred:
        dk = jnp.sum(dk, axis=0) * (1.0 if mode == "gat" else scale)
        dv = dv if one_sum else jnp.sum(dv, axis=0)
    if mode == "gat":
        dxs_ref[0, :] = v.out_row(dk if one_sum else dk + dv).astype(dxs_ref.dtype)
    else:
        dk_ref[0, :] = v.out_row(dk).astype(dk_ref.dtype)
        dv_ref[0, :] = v.out_row(dv).astype(dv_ref.dtype)


def _bwd_call(kernel, tag, dtypes, units, indices, xs, xd, third, dout, lse, delta, sh, mode, slope, scale, interpret):
    """One backward pass over ``units``: one output row per unit for each of ``dtypes``."""
    starts, ends, nodes = units
    nu = starts.shape[0]
    spec = pl.BlockSpec((1, sh.hb * sh.dp), lambda u, b: (u, b))
    return pl.pallas_call(
        functools.partial(kernel, mode=mode, slope=slope, scale=scale, **sh.kw()),
        grid=(nu, sh.nblk),
        out_specs=[spec] * len(dtypes),
        out_shape=[jax.ShapeDtypeStruct((nu, sh.heads * sh.dp), t) for t in dtypes],
        interpret=interpret,
        compiler_params=P.params(sh.warps),
        name=f"gnn_{mode}_bwd_{tag}",
    )(starts, ends, nodes, indices, xs, xd, third, dout, *(sh.heads_array(t) for t in (*lse, delta)))


def _two_pass(kernel, tag, g, dtypes, *args):
    """Run ``kernel`` over ``g``'s units: the main units' rows in ``dtypes`` (a gradient in its input's dtype), heavy
    nodes' chunks as float32 partial rows, added per node and rounded once (:func:`~..triton_common.split_units`)."""
    split = P.split_units(g)
    indices = jnp.asarray(g.indices)
    outs = _bwd_call(kernel, tag, dtypes, split.main, indices, *args)
    if split.extra is None:
        return outs
    parts = _bwd_call(kernel, tag, [jnp.float32] * len(dtypes), split.extra, indices, *args)
    return [split.fold(o, p) for o, p in zip(outs, parts, strict=True)]


def flat_backward(
    g: Graph | DynamicGraph,
    mode: str,
    xs,
    xd,
    third,
    out,
    lse,
    dout,
    heads: int,
    slope: float,
    scale: float,
    config=None,
):
    """Gradients w.r.t. xs, xd (or k, q) and att (or v), all in the flattened layout: each node's in its input's dtype
    (rounded once from float32 sums), att's in float32 (a sum over nodes). ``lse``: the forward's ``(hi, lo)``; each
    weight is ``exp((e - hi) - lo)``."""
    interpret = P.interpret_mode()
    sh = _Shape(heads, xs.shape[1] // heads, config)
    n = xs.shape[0]
    delta = jnp.sum(
        (dout.astype(jnp.float32) * out.astype(jnp.float32)).reshape(n, heads, sh.dp), axis=-1
    )  # (N, H): sum_j alpha_ij (dout_i . v_j)
    dout = dout.astype(xs.dtype)
    common = (xs, xd, third, dout, lse, delta, sh, mode, slope, scale, interpret)
    gat = mode == "gat"  # dst pass: dxd and att's per-node rows (or dq); src pass: dxs (or dk and dv)
    dst_outs = _two_pass(_bwd_dst_kernel, "dst", g, [xd.dtype, jnp.float32] if gat else [xd.dtype], *common)
    src_outs = _two_pass(_bwd_src_kernel, "src", g.T, [xs.dtype] if gat else [xs.dtype, third.dtype], *common)
    if gat:
        dxd, datt_part = dst_outs
        (dxs,) = src_outs
        return dxs, dxd, jnp.sum(datt_part, axis=0)
    (dq,) = dst_outs
    dk, dv = src_outs
    return dk, dq, dv


# ------------------------------------------------------------------------ (N, H, D) entry points
def _flat(x, hp, dp):
    """``(N, H, D)`` -> ``(N, Hp * Dp)`` zero-padded (``(H, D)`` -> ``(Hp * Dp,)``)."""
    pad = [(0, 0)] * (x.ndim - 2) + [(0, hp - x.shape[-2]), (0, dp - x.shape[-1])]
    x = jnp.pad(x, pad) if any(p[1] for p in pad) else x
    return x.reshape(*x.shape[:-2], hp * dp)


def _geometry(a):
    n, h, d = a.shape
    return n, h, d, next_power_of_2(h), next_power_of_2(d, 4)


def attention_forward(s, g, a, b, c):
    """As :func:`..reference.attention_forward`: ``(out (N, H, D), (hi, lo))``, ``hi`` and ``lo`` ``(N, Hp)``."""
    n, h, d, hp, dp = _geometry(a)
    f = lambda t: _flat(t, hp, dp)
    out, lse = flat_forward(g, s.mode, f(a), f(b), f(c), hp, s.slope, s.scale, s.config)
    return out.reshape(n, hp, dp)[:, :h, :d], lse


def attention_backward(s, g, a, b, c, out, lse, dout):
    """Cotangents of ``a, b, c`` from the saved output and log-sum-exp."""
    n, h, d, hp, dp = _geometry(a)
    f = lambda t: _flat(t, hp, dp)
    da, db, dc = flat_backward(g, s.mode, f(a), f(b), f(c), f(out), lse, f(dout), hp, s.slope, s.scale, s.config)
    da = da.reshape(n, hp, dp)[:, :h, :d]  # (per-node gradients: written in their input's dtype)
    db = db.reshape(n, hp, dp)[:, :h, :d]
    dc = dc.reshape(*c.shape[:-2], hp, dp)[..., :h, :d].astype(c.dtype)  # att's: a float32 sum over nodes
    return da, db, dc
