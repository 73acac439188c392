"""Sparse-dense products over a graph: ``spmm(g, x)`` = sum (or mean) of in-neighbours' features.

The core is one differentiable primitive, ``out = A x`` with ``A[i, j] = sum of w_e over edges
j -> i``; its backward is ``dx = A^T dout`` through the cached transposed CSR (``g.T``) and
``dw_e = dout[dst_e] . x[src_e]``. Normalisations are diagonal scalings around it.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from ...gnn._graph import Graph
from .. import _dispatch

__all__ = ["spmm", "spmm_reference"]

_IMPLS = ("pallas", "xla")
# SpMM default: measured on the H200 (docs/benchmarks.md, "GNN operations"). XLA's sorted
# segment_sum is the fallback everywhere.
DEFAULT = ("pallas", "xla")


def _xla_sum(g: Graph, w_csr, x):
    rows = jnp.asarray(g.indices)
    msg = x[rows].astype(jnp.float32)
    if w_csr is not None:
        msg = msg * w_csr.astype(jnp.float32)[:, None]
    out = jax.ops.segment_sum(msg, jnp.asarray(g.dst_sorted), g.num_nodes, indices_are_sorted=True)
    return out.astype(x.dtype)


def _pallas_sum(g: Graph, w_csr, x):
    from .pallas_triton import csr_sum

    return csr_sum(g, w_csr, x)


_TABLE = {"xla": _xla_sum, "pallas": _pallas_sum}


def _csr_apply(g: Graph, impls, w, x):
    w_csr = None if w is None else w[jnp.asarray(g.edge_perm)]
    return _dispatch.run("spmm", impls, _TABLE, g, w_csr, x)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _spmm_x(g, impls, x):
    return _csr_apply(g, impls, None, x)


def _spmm_x_fwd(g, impls, x):
    return _spmm_x(g, impls, x), None


def _spmm_x_bwd(g, impls, _, dout):
    return (_spmm_x(g.T, impls, dout),)


_spmm_x.defvjp(_spmm_x_fwd, _spmm_x_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _spmm_xw(g, impls, x, w):
    return _csr_apply(g, impls, w, x)


def _spmm_xw_fwd(g, impls, x, w):
    return _spmm_xw(g, impls, x, w), (x, w)


def _spmm_xw_bwd(g, impls, res, dout):
    x, w = res
    dx = _spmm_xw(g.T, impls, dout, w)  # edge ids are shared by g and g.T
    src, dst = jnp.asarray(g.src), jnp.asarray(g.dst)
    dw = jnp.sum(dout[dst].astype(jnp.float32) * x[src].astype(jnp.float32), axis=-1)
    return _dispatch.cotangent_like(dx, x), _dispatch.cotangent_like(dw.astype(w.dtype), w)


_spmm_xw.defvjp(_spmm_xw_fwd, _spmm_xw_bwd)


def _inv_pow(deg, p):
    return jnp.asarray(deg, jnp.float32).clip(1.0) ** (-p)


def spmm(
    g: Graph,
    x: jax.Array,
    reduce: str = "sum",
    norm: str | None = None,
    edge_weight: jax.Array | None = None,
    *,
    implementation=None,
) -> jax.Array:
    """Aggregate in-neighbours' features: ``out[i] = sum_{e: j -> i} c_e x[j]``.

    Arguments:
        g: the :class:`Graph` (messages flow ``src -> dst``).
        x: node features ``(N, ...)``; trailing dimensions are kept.
        reduce: ``"sum"`` or ``"mean"`` (sum divided by the in-degree; 0 for nodes without
            in-edges).
        norm: degree normalisation as in DGL's ``GraphConv``: ``None``; ``"left"`` divides each
            message by its source's out-degree; ``"right"`` divides the sum by the destination's
            in-degree; ``"both"`` (GCN) scales by ``out_deg(j)^-1/2 in_deg(i)^-1/2``. Degrees are
            edge counts (unweighted), clamped to at least 1.
        edge_weight: optional ``(E,)`` weights in the order of the edges given to
            :meth:`Graph.from_edges`.
        implementation: ``None`` (Pallas on a GPU, else XLA), ``"pallas"``, ``"xla"`` or a
            sequence tried in order.

    Returns:
        ``(N, ...)`` in ``x``'s dtype (float32 accumulation). Differentiable w.r.t. ``x`` and
        ``edge_weight``; the backward runs on the cached transpose ``g.T``.
    """
    if not isinstance(g, Graph):
        raise TypeError(f"Expected a blocksparse.gnn.Graph. Got {type(g).__name__}.")
    _dispatch.check_choice("reduce", reduce, ("sum", "mean"))
    _dispatch.check_choice("norm", norm, (None, "left", "right", "both"))
    impls = _dispatch.resolve(implementation, DEFAULT, _IMPLS)
    x = g.check_features(x, "features", ndim=tuple(range(1, 8)))
    if edge_weight is not None:
        edge_weight = jnp.asarray(edge_weight)
        if edge_weight.shape != (g.num_edges,):
            raise ValueError(f"Expected edge_weight of shape ({g.num_edges},). Got {edge_weight.shape}.")
        if not jnp.issubdtype(edge_weight.dtype, jnp.floating):
            raise TypeError(f"Expected floating-point edge_weight. Got {edge_weight.dtype}.")
    shape = x.shape
    x2 = x.reshape(shape[0], math.prod(shape[1:]))
    if norm in ("left", "both"):
        x2 = (x2 * _inv_pow(g.out_degree, 1.0 if norm == "left" else 0.5)[:, None]).astype(x.dtype)
    if g.num_edges == 0 or x2.shape[1] == 0:
        out = jnp.zeros_like(x2)
    elif edge_weight is None:
        out = _spmm_x(g, impls, x2)
    else:
        out = _spmm_xw(g, impls, x2, edge_weight)
    post = None
    if norm == "both":
        post = _inv_pow(g.in_degree, 0.5)
    if norm == "right" or reduce == "mean":
        r = _inv_pow(g.in_degree, 1.0)
        post = r if post is None else post * r
    if post is not None:
        out = (out * post[:, None]).astype(x.dtype)
    return out.reshape(shape)


def spmm_reference(g: Graph, x, reduce="sum", norm=None, edge_weight=None):
    """The same as :func:`spmm` with ``implementation="xla"`` (sorted ``segment_sum``)."""
    return spmm(g, x, reduce, norm, edge_weight, implementation="xla")
