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

from ..._util import next_power_of_2
from ...gnn._dynamic import DynamicGraph
from ...gnn._graph import Graph
from .. import _dispatch
from .. import _gnn_triton as P

_NEG = -1e30  # finite start of the running max: exp(-inf - -inf) would be NaN


def _lrelu(z, slope):
    return jnp.where(z > 0, z, slope * z)


def _score(kt, qrow, att, mode, slope, scale):
    """Logits ``(be, hb)`` of the edges of a tile: ``kt (be, hb, Dp)`` the source side."""
    if mode == "gat":
        return jnp.sum(_lrelu(kt + qrow[None], slope) * att[None], axis=2)
    return jnp.sum(kt * qrow[None], axis=2) * scale


def _row(ref, node, blk, hb, dp):
    return ref[node, pl.ds(blk * hb * dp, hb * dp)].astype(jnp.float32).reshape(hb, dp)


def _vec(ref, blk, hb, dp):
    return ref[pl.ds(blk * hb * dp, hb * dp)].astype(jnp.float32).reshape(hb, dp)


def _tile(ref, idx, cols, m2, be, hb, dp):
    return P.gather(ref, idx, cols, m2).reshape(be, hb, dp)


# ----------------------------------------------------------------------------------- forward
def _fwd_kernel(starts_ref, ends_ref, nodes_ref, indices_ref, *refs, be, hb, dp, mode, slope, scale):
    if mode == "gat":
        xs_ref, xd_ref, att_ref, o_ref, lse_ref = refs
    else:
        xs_ref, xd_ref, v_ref, o_ref, lse_ref = refs  # xs = k, xd = q
    u, blk = pl.program_id(0), pl.program_id(1)
    start, end, node = starts_ref[u], ends_ref[u], nodes_ref[u]
    w = hb * dp
    cols = blk * w + jnp.arange(w, dtype=jnp.int32)
    qrow = _row(xd_ref, node, blk, hb, dp)
    att = _vec(att_ref, blk, hb, dp) if mode == "gat" else None

    def body(c, carry):
        m_i, l_i, acc = carry
        off, _, msk = P.edge_tile(start, c, end, be)
        idx = P.load_ids(indices_ref, off, msk, be)
        m2 = jnp.broadcast_to(msk[:, None], (be, w))
        kt = _tile(xs_ref, idx, cols, m2, be, hb, dp)
        e = jnp.where(msk[:, None], _score(kt, qrow, att, mode, slope, scale), -jnp.inf)  # (be, hb)
        m_new = jnp.maximum(m_i, jnp.max(e, axis=0))
        p = jnp.exp(e - m_new[None, :])
        corr = jnp.exp(m_i - m_new)
        vt = kt if mode == "gat" else _tile(v_ref, idx, cols, m2, be, hb, dp)
        acc = acc * corr[:, None] + jnp.sum(p[:, :, None] * vt, axis=0)
        return m_new, l_i * corr + jnp.sum(p, axis=0), acc

    init = (jnp.full((hb,), _NEG, jnp.float32), jnp.zeros((hb,), jnp.float32), jnp.zeros((hb, dp), jnp.float32))
    m_i, l_i, acc = lax.fori_loop(0, P.num_chunks(start, end, be), body, init)
    has = l_i > 0
    safe = jnp.where(has, l_i, 1.0)
    o_ref[0, :] = jnp.where(has[:, None], acc / safe[:, None], 0.0).reshape(w).astype(o_ref.dtype)
    lse_ref[0, :] = jnp.where(has, m_i + jnp.log(safe), -jnp.inf)


class _Shape:
    """Static kernel geometry for ``heads`` (padded) heads of ``dp`` features."""

    def __init__(self, heads: int, dp: int):
        self.heads, self.dp = heads, dp
        self.hb = min(heads, max(1, 128 // dp))
        self.nblk = heads // self.hb
        w = self.hb * dp
        self.be = max(16, min(128, 4096 // w))
        self.warps = 4 if self.be * w >= 2048 else (2 if self.be * w >= 512 else 1)

    def kw(self):
        return dict(be=self.be, hb=self.hb, dp=self.dp)


def _fwd_call(units, indices, xs, xd, third, sh, out_dtype, mode, slope, scale, interpret):
    starts, ends, nodes = units
    nu = starts.shape[0]
    return pl.pallas_call(
        functools.partial(_fwd_kernel, mode=mode, slope=slope, scale=scale, **sh.kw()),
        grid=(nu, sh.nblk),
        out_specs=[
            pl.BlockSpec((1, sh.hb * sh.dp), lambda u, b: (u, b)),
            pl.BlockSpec((1, sh.hb), lambda u, b: (u, b)),
        ],
        out_shape=[
            jax.ShapeDtypeStruct((nu, sh.heads * sh.dp), out_dtype),
            jax.ShapeDtypeStruct((nu, sh.heads), jnp.float32),
        ],
        interpret=interpret,
        compiler_params=P.params(sh.warps),
        name=f"gnn_{mode}_fwd",
    )(starts, ends, nodes, indices, xs, xd, third)


def flat_forward(g: Graph | DynamicGraph, mode: str, xs, xd, third, heads: int, slope: float, scale: float):
    """xs, xd, (v): ``(N, Hp*Dp)``; third: att ``(Hp*Dp,)`` or v. Returns out ``(N, Hp*Dp)``, lse ``(N, Hp)``."""
    interpret = _dispatch.pallas_mode()
    P.check_dtype(xs, xd, third)
    sh = _Shape(heads, xs.shape[1] // heads)
    indices = jnp.asarray(g.indices)
    main, extra = P.units(g)
    # float32 where heavy nodes' partial outputs are combined afterwards: a half-precision output is rounded once
    main_dtype = xs.dtype if extra is None else jnp.float32
    out, lse = _fwd_call(main, indices, xs, xd, third, sh, main_dtype, mode, slope, scale, interpret)
    if extra is not None:
        o1, l1 = _fwd_call(extra, indices, xs, xd, third, sh, jnp.float32, mode, slope, scale, interpret)
        heavy, seg, nh = P.heavy_arrays(g)
        o_all = jnp.concatenate([out[heavy].astype(jnp.float32), o1]).reshape(-1, heads, sh.dp)
        l_all = jnp.concatenate([lse[heavy], l1])
        s_all = jnp.concatenate([jnp.arange(nh, dtype=jnp.int32), seg])
        mx = jax.ops.segment_max(l_all, s_all, nh)
        wgt = jnp.exp(l_all - mx[s_all])
        tot = jax.ops.segment_sum(wgt, s_all, nh)
        o_h = jax.ops.segment_sum(wgt[..., None] * o_all, s_all, nh) / tot[..., None]
        out = out.at[heavy].set(o_h.reshape(nh, -1), unique_indices=True, mode="drop").astype(xs.dtype)
        lse = lse.at[heavy].set(mx + jnp.log(tot), unique_indices=True, mode="drop")
    return out, lse


# --------------------------------------------------------------------- backward, destination pass
def _bwd_dst_kernel(starts_ref, ends_ref, nodes_ref, indices_ref, *refs, be, hb, dp, mode, slope, scale):
    if mode == "gat":
        xs_ref, xd_ref, att_ref, do_ref, lse_ref, dl_ref, dxd_ref, datt_ref = refs
    else:
        xs_ref, xd_ref, v_ref, do_ref, lse_ref, dl_ref, dxd_ref = refs
    u, blk = pl.program_id(0), pl.program_id(1)
    start, end, node = starts_ref[u], ends_ref[u], nodes_ref[u]
    w = hb * dp
    cols = blk * w + jnp.arange(w, dtype=jnp.int32)
    qrow = _row(xd_ref, node, blk, hb, dp)
    dorow = _row(do_ref, node, blk, hb, dp)
    lse = lse_ref[node, pl.ds(blk * hb, hb)]
    delta = dl_ref[node, pl.ds(blk * hb, hb)]
    att = _vec(att_ref, blk, hb, dp) if mode == "gat" else None

    def body(c, carry):
        dq, da = carry
        off, _, msk = P.edge_tile(start, c, end, be)
        idx = P.load_ids(indices_ref, off, msk, be)
        m2 = jnp.broadcast_to(msk[:, None], (be, w))
        kt = _tile(xs_ref, idx, cols, m2, be, hb, dp)
        vt = kt if mode == "gat" else _tile(v_ref, idx, cols, m2, be, hb, dp)
        if mode == "gat":
            z = kt + qrow[None]
            lz = _lrelu(z, slope)
            e = jnp.sum(lz * att[None], axis=2)
        else:
            e = jnp.sum(kt * qrow[None], axis=2) * scale
        alpha = jnp.where(msk[:, None], jnp.exp(e - lse[None, :]), 0.0)  # (be, hb)
        de = alpha * (jnp.sum(vt * dorow[None], axis=2) - delta[None, :])
        if mode == "gat":
            dz = de[:, :, None] * att[None] * jnp.where(z > 0, 1.0, slope)
            return dq + jnp.sum(dz, axis=0), da + jnp.sum(de[:, :, None] * lz, axis=0)
        return dq + scale * jnp.sum(de[:, :, None] * kt, axis=0), da

    zero = jnp.zeros((hb, dp), jnp.float32)
    dq, da = lax.fori_loop(0, P.num_chunks(start, end, be), body, (zero, zero))
    dxd_ref[0, :] = dq.reshape(w)
    if mode == "gat":
        datt_ref[0, :] = da.reshape(w)


# -------------------------------------------------------------------------- backward, source pass
def _bwd_src_kernel(starts_ref, ends_ref, nodes_ref, indices_ref, *refs, be, hb, dp, mode, slope, scale):
    # indices are destinations here (CSR of the transpose); node is the source j.
    if mode == "gat":
        xs_ref, xd_ref, att_ref, do_ref, lse_ref, dl_ref, dxs_ref = refs
    else:
        xs_ref, xd_ref, v_ref, do_ref, lse_ref, dl_ref, dk_ref, dv_ref = refs
    u, blk = pl.program_id(0), pl.program_id(1)
    start, end, node = starts_ref[u], ends_ref[u], nodes_ref[u]
    w = hb * dp
    cols = blk * w + jnp.arange(w, dtype=jnp.int32)
    hcols = blk * hb + jnp.arange(hb, dtype=jnp.int32)
    krow = _row(xs_ref, node, blk, hb, dp)
    vrow = krow if mode == "gat" else _row(v_ref, node, blk, hb, dp)
    att = _vec(att_ref, blk, hb, dp) if mode == "gat" else None

    def body(c, carry):
        dk, dv = carry
        off, _, msk = P.edge_tile(start, c, end, be)
        idx = P.load_ids(indices_ref, off, msk, be)
        m2 = jnp.broadcast_to(msk[:, None], (be, w))
        qt = _tile(xd_ref, idx, cols, m2, be, hb, dp)
        dot = _tile(do_ref, idx, cols, m2, be, hb, dp)
        mh = jnp.broadcast_to(msk[:, None], (be, hb))
        lse = P.gather(lse_ref, idx, hcols, mh)
        delta = P.gather(dl_ref, idx, hcols, mh)
        if mode == "gat":
            z = krow[None] + qt
            e = jnp.sum(_lrelu(z, slope) * att[None], axis=2)
        else:
            e = jnp.sum(qt * krow[None], axis=2) * scale
        alpha = jnp.where(mh, jnp.exp(e - lse), 0.0)
        de = alpha * (jnp.sum(dot * vrow[None], axis=2) - delta)
        dv = dv + jnp.sum(alpha[:, :, None] * dot, axis=0)
        if mode == "gat":
            dk = dk + jnp.sum(de[:, :, None] * att[None] * jnp.where(z > 0, 1.0, slope), axis=0)
        else:
            dk = dk + scale * jnp.sum(de[:, :, None] * qt, axis=0)
        return dk, dv

    zero = jnp.zeros((hb, dp), jnp.float32)
    dk, dv = lax.fori_loop(0, P.num_chunks(start, end, be), body, (zero, zero))
    if mode == "gat":
        dxs_ref[0, :] = (dk + dv).reshape(w)
    else:
        dk_ref[0, :] = dk.reshape(w)
        dv_ref[0, :] = dv.reshape(w)


def _bwd_call(kernel, nout, tag, units, indices, xs, xd, third, dout, lse, delta, sh, mode, slope, scale, interpret):
    starts, ends, nodes = units
    nu = starts.shape[0]
    spec = pl.BlockSpec((1, sh.hb * sh.dp), lambda u, b: (u, b))
    shape = jax.ShapeDtypeStruct((nu, sh.heads * sh.dp), jnp.float32)
    return pl.pallas_call(
        functools.partial(kernel, mode=mode, slope=slope, scale=scale, **sh.kw()),
        grid=(nu, sh.nblk),
        out_specs=[spec] * nout,
        out_shape=[shape] * nout,
        interpret=interpret,
        compiler_params=P.params(sh.warps),
        name=f"gnn_{mode}_bwd_{tag}",
    )(starts, ends, nodes, indices, xs, xd, third, dout, lse, delta)


def _bwd_dst_call(*args):
    mode = args[-4]
    return _bwd_call(_bwd_dst_kernel, 2 if mode == "gat" else 1, "dst", *args)


def _bwd_src_call(*args):
    mode = args[-4]
    return _bwd_call(_bwd_src_kernel, 1 if mode == "gat" else 2, "src", *args)


def _two_pass(call, g, *args):
    """Run ``call`` over main and extra units of ``g`` and fold extra partial sums in."""
    main, extra = P.units(g)
    indices = jnp.asarray(g.indices)
    outs = call(main, indices, *args)
    if extra is None:
        return outs
    parts = call(extra, indices, *args)
    return [P.fold_sum(g, o, p) for o, p in zip(outs, parts, strict=True)]


def flat_backward(
    g: Graph | DynamicGraph, mode: str, xs, xd, third, out, lse, dout, heads: int, slope: float, scale: float
):
    """Gradients w.r.t. xs, xd (or k, q) and att (or v), all in the flattened layout, float32."""
    interpret = _dispatch.pallas_mode()
    sh = _Shape(heads, xs.shape[1] // heads)
    n = xs.shape[0]
    delta = jnp.sum(
        (dout.astype(jnp.float32) * out.astype(jnp.float32)).reshape(n, heads, sh.dp), axis=-1
    )  # (N, H): sum_j alpha_ij (dout_i . v_j)
    dout = dout.astype(xs.dtype)
    common = (xs, xd, third, dout, lse, delta, sh, mode, slope, scale, interpret)
    dst_outs = _two_pass(_bwd_dst_call, g, *common)
    src_outs = _two_pass(_bwd_src_call, g.T, *common)
    if mode == "gat":
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
    """As :func:`..reference.attention_forward`: ``(out (N, H, D), lse (N, Hp))``."""
    n, h, d, hp, dp = _geometry(a)
    out, lse = flat_forward(g, s.mode, _flat(a, hp, dp), _flat(b, hp, dp), _flat(c, hp, dp), hp, s.slope, s.scale)
    return out.reshape(n, hp, dp)[:, :h, :d], lse


def attention_backward(s, g, a, b, c, out, lse, dout):
    """Cotangents of ``a, b, c`` from the saved output and log-sum-exp."""
    n, h, d, hp, dp = _geometry(a)
    f = lambda t: _flat(t, hp, dp)
    da, db, dc = flat_backward(g, s.mode, f(a), f(b), f(c), f(out), lse, f(dout), hp, s.slope, s.scale)
    da = da.reshape(n, hp, dp)[:, :h, :d].astype(a.dtype)
    db = db.reshape(n, hp, dp)[:, :h, :d].astype(b.dtype)
    dc = dc.reshape(*c.shape[:-2], hp, dp)[..., :h, :d].astype(c.dtype)
    return da, db, dc
