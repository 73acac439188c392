"""Pallas kernel for max / min aggregation with degree-aware tiling.

Light nodes: one program per (node, feature block) loops over the in-edges. Heavy nodes: the
first chunk runs in the node's own program, the rest as extra programs in parallel, combined
afterwards. Each program also returns, per feature, the CSR position of the winning edge (the
first one on ties), which the backward uses to route gradients. NaN propagates as in the reference
(``segment_max`` / ``segment_min``): a NaN feature makes the node's result NaN, its arg the first
NaN in-edge, in light and heavy nodes alike (heavy nodes' partials are combined with segment ops).
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
from .reference import winners

_BIG = 2**31 - 1


def _kernel(starts_ref, ends_ref, indices_ref, x_ref, o_ref, *a_ref, be: int, bf: int, is_max: bool):
    u, fb = pl.program_id(0), pl.program_id(1)
    start, end = starts_ref[u], ends_ref[u]
    cols = fb * bf + jnp.arange(bf, dtype=jnp.int32)
    ident = -jnp.inf if is_max else jnp.inf

    def body(c, carry):
        best, arg = carry
        off, pos, m = P.edge_tile(start, c, end, be)
        idx = P.load_ids(indices_ref, off, m, be)
        m2 = jnp.broadcast_to(m[:, None], (be, bf))
        rows = P.gather(x_ref, idx, cols, m2)
        rows = jnp.where(m2, rows, ident)
        # NaN wins, as in segment_max / segment_min: every comparison with NaN is false, so a
        # plain max would keep NaN as the running value and then drop every later tile.
        nan = jnp.isnan(rows) & m2
        cnan = jnp.max(jnp.where(nan, 1, 0), axis=0) > 0  # (no reduce_or in the Triton lowering)
        cbest = jnp.max(rows, axis=0) if is_max else jnp.min(rows, axis=0)
        cbest = jnp.where(cnan, jnp.nan, cbest)
        hit = jnp.where(cnan[None, :], nan, rows == cbest[None, :]) & m2
        carg = jnp.min(jnp.where(hit, jnp.broadcast_to(pos[:, None], (be, bf)), _BIG), axis=0)
        better = (cbest > best) if is_max else (cbest < best)
        better = better | (cnan & ~jnp.isnan(best))  # the first NaN replaces any number
        better = better | ((arg < 0) & (carg < _BIG))  # first valid value (also +-inf)
        return jnp.where(better, cbest, best), jnp.where(better, carg, arg)

    init = (jnp.full((bf,), ident, jnp.float32), jnp.full((bf,), -1, jnp.int32))
    best, arg = lax.fori_loop(0, P.num_chunks(start, end, be), body, init)
    o_ref[0, :] = jnp.where(arg >= 0, best, 0.0).astype(o_ref.dtype)
    if a_ref:  # only when differentiating: the backward routes gradients through it
        a_ref[0][0, :] = arg


def _call(starts, ends, indices, x, num_units, out_dtype, be, bf, is_max, interpret, with_arg=True):
    fp = x.shape[1]
    spec = pl.BlockSpec((1, bf), lambda u, f: (u, f))
    return pl.pallas_call(
        functools.partial(_kernel, be=be, bf=bf, is_max=is_max),
        grid=(num_units, fp // bf),
        out_specs=[spec, spec][: 1 + with_arg],
        out_shape=[jax.ShapeDtypeStruct((num_units, fp), out_dtype), jax.ShapeDtypeStruct((num_units, fp), jnp.int32)][
            : 1 + with_arg
        ],
        interpret=interpret,
        compiler_params=P.params(4),
        name="gnn_aggregate_max" if is_max else "gnn_aggregate_min",
    )(starts, ends, indices, x)


def segment_extreme(
    g: Graph | DynamicGraph, x: jax.Array, is_max: bool, *, with_arg: bool = True, be: int | None = None
):
    """``x (N, F)`` -> (values ``(N, F)``, CSR position of the arg-max/min or -1)."""
    interpret = _dispatch.pallas_mode()
    P.check_dtype(x)
    n, f = x.shape
    fp = next_power_of_2(f, 16)
    bf = min(fp, 128)
    be = be or max(16, min(64, 2048 // bf))  # 16 edges for F >= 128: best measured on the H200
    xp = P.pad_last(x, fp)
    indices = jnp.asarray(g.indices)
    (s0, e0, _), extra = P.units(g)
    res = _call(s0, e0, indices, xp, n, x.dtype, be, bf, is_max, interpret, with_arg)
    out, arg = (res[0], res[1]) if with_arg else (res[0], None)
    red = jax.ops.segment_max if is_max else jax.ops.segment_min
    if extra is not None and not with_arg:
        s1, e1, _ = extra
        (v1,) = _call(s1, e1, indices, xp, s1.shape[0], jnp.float32, be, bf, is_max, interpret, False)
        heavy, seg, nh = P.heavy_arrays(g)
        best = red(jnp.concatenate([out[heavy].astype(jnp.float32), v1]), jnp.concatenate([jnp.arange(nh), seg]), nh)
        return out.at[heavy].set(best.astype(out.dtype), unique_indices=True, mode="drop")[:, :f], None
    if extra is not None:
        s1, e1, _ = extra
        v1, a1 = _call(s1, e1, indices, xp, s1.shape[0], jnp.float32, be, bf, is_max, interpret)
        heavy, seg, nh = P.heavy_arrays(g)
        vals = jnp.concatenate([out[heavy].astype(jnp.float32), v1])
        args = jnp.concatenate([arg[heavy], a1])
        segs = jnp.concatenate([jnp.arange(nh, dtype=jnp.int32), seg])
        order = jnp.argsort(segs, stable=True)  # main chunk first within each node
        vals, args, segs = vals[order], args[order], segs[order]
        best = red(vals, segs, nh, indices_are_sorted=True)
        win = jnp.where(winners(vals, best[segs]), args, _BIG)
        barg = jax.ops.segment_min(win, segs, nh, indices_are_sorted=True)
        out = out.at[heavy].set(best.astype(out.dtype), unique_indices=True, mode="drop")
        arg = arg.at[heavy].set(barg, unique_indices=True, mode="drop")
    return out[:, :f], (None if arg is None else arg[:, :f])
