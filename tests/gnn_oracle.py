"""NumPy oracles for the GNN ops (float64, loops over edges): the specification the tests check."""

import numpy as np


def spmm(src, dst, n, x, w=None, reduce="sum", norm=None):
    x = np.asarray(x, np.float64).reshape(n, -1)
    w = np.ones(len(src)) if w is None else np.asarray(w, np.float64)
    indeg = np.maximum(np.bincount(dst, minlength=n), 1).astype(np.float64)
    outdeg = np.maximum(np.bincount(src, minlength=n), 1).astype(np.float64)
    out = np.zeros_like(x)
    for s, d, we in zip(src, dst, w, strict=True):
        c = we
        if norm == "left":
            c = c / outdeg[s]
        if norm == "both":
            c = c / np.sqrt(outdeg[s] * indeg[d])
        out[d] += c * x[s]
    assert reduce == "sum" or norm is None, "mean takes no norm"
    if norm == "right" or reduce == "mean":
        out /= indeg[:, None]
    return out


def extreme(src, dst, n, x, reduce="max"):
    """NaN propagates (np.maximum / np.minimum do); nodes without in-edges get 0."""
    x = np.asarray(x, np.float64).reshape(n, -1)
    f = np.maximum if reduce == "max" else np.minimum
    out = np.full_like(x, -np.inf if reduce == "max" else np.inf)
    for s, d in zip(src, dst, strict=True):
        out[d] = f(out[d], x[s])
    out[np.bincount(np.asarray(dst, np.int64), minlength=n) == 0] = 0.0
    return out


def extreme_grad(src, dst, n, x, dout, reduce="max"):
    """Gradient routed to the first in-edge (in edge order) achieving the max / min (NaN: the first NaN)."""
    x = np.asarray(x, np.float64).reshape(n, -1)
    dout = np.asarray(dout, np.float64).reshape(n, -1)
    best = extreme(src, dst, n, x, reduce)
    taken = np.zeros_like(x, bool)
    dx = np.zeros_like(x)
    for s, d in zip(src, dst, strict=True):
        hit = ((x[s] == best[d]) | (np.isnan(x[s]) & np.isnan(best[d]))) & ~taken[d]
        dx[s] += np.where(hit, dout[d], 0.0)
        taken[d] |= hit
    return dx


def _softmax_agg(src, dst, n, logits, vals):
    h, dim = vals.shape[1:]
    out = np.zeros((n, h, dim))
    for i in range(n):
        es = np.flatnonzero(dst == i)
        if es.size == 0:
            continue
        e = logits[es]  # (k, H)
        a = np.exp(e - e.max(0))
        a /= a.sum(0)
        out[i] = np.einsum("kh,khd->hd", a, vals[es])
    return out


def gatv2(src, dst, n, xs, xd, att, slope=0.2):
    xs, xd, att = (np.asarray(t, np.float64) for t in (xs, xd, att))
    z = xs[src] + xd[dst]
    e = np.sum(np.where(z > 0, z, slope * z) * att, -1)
    return _softmax_agg(src, dst, n, e, xs[src])


def graph_attention(src, dst, n, q, k, v, scale=None):
    q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    e = np.sum(q[dst] * k[src], -1) * scale
    return _softmax_agg(src, dst, n, e, v[src])
