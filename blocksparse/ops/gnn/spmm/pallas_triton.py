"""Pallas kernel for ``out[i] = sum_{e: j -> i} w_e x[j]`` over a CSR by destination.

One program per (node, feature block) walks the node's in-edges ``be`` at a time, gathers the
source rows and accumulates in float32. Heavy nodes' chunks run as extra programs whose float32
partial rows are summed per node afterwards and rounded once (see :class:`blocksparse.graph.Schedule` and
:func:`~..triton_common.split_units`): the main programs write the output's dtype directly. With
``init`` the main programs add its row to theirs (``out = init + A x`` in one pass, the output written
over ``init``'s buffer): a product over a graph split in parts sums them without a separate add.

With ``nodes_per_program=G > 1`` a packed kernel takes ``G`` light nodes per program instead (in
:func:`~blocksparse.ops.gnn.aggregate.pallas_triton.length_order`, longest first, so a program's nodes
have about as many in-edges): each step gathers a ``(G, be)`` tile of edges, each row masked to its
own node's range, and sums the ``(G, be, bf)`` rows into a ``(G, bf)`` float32 accumulator. Fewer,
fuller programs for graphs of small mean in-degree, where one program per node pays mostly its launch.
Heavy nodes' chunks run packed alike (by node: a static graph's in id order, a traced graph's first chunks then the
others) and are folded in as with one node per program; their main units, empty, come last in the order.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from ...._util import cdiv, next_power_of_2
from ....graph import DynamicGraph, Graph
from .. import triton_common as P
from ..aggregate.pallas_triton import length_order, packed_tiles
from ..config import SPMM_NODES_PER_PROGRAM as NODES_PER_PROGRAM
from ..config import GatherVariant, check_variant
from ..order import spmm_edges_per_step, spmm_variant


def _kernel(
    starts_ref, ends_ref, indices_ref, *rest, be: int, bf: int, weighted: bool, init: bool, pairs=None, prefetch=False,
    narrow=False, scaled=False,
):  # fmt: skip
    """``pairs``: the 2-byte dtype whose uint32 pairs ``x_ref`` holds (``GatherVariant.pairs``), reduced as two
    float32 halves of ``bf / 2`` columns each; ``prefetch``: the next step's edge ids ride in the loop carry;
    ``narrow``: 2-byte rows gathered 4 features a lane (:func:`..triton_common.lanes`); ``scaled``: the float32 sum
    times the unit's factor (``scale_ref``, after ``x_ref``; the units are the nodes)."""
    w_ref = rest[0] if weighted else None
    x_ref = rest[int(weighted)]
    scale_ref = rest[int(weighted) + 1] if scaled else None
    init_ref = rest[-2] if init else None
    o_ref = rest[-1]
    u, fb = pl.program_id(0), pl.program_id(1)
    start, end = starts_ref[u], ends_ref[u]
    width, parts = (bf, 1) if pairs is None else (bf // 2, 2)  # x_ref's columns per program; float32 halves
    cols = fb * width + jnp.arange(width, dtype=jnp.int32)

    def ids(c):
        off, _, m = P.edge_tile(start, c, end, be)
        return P.load_ids(indices_ref, off, m, be)

    def body(c, carry):
        *acc, idx = carry if prefetch else (*carry, None)
        off, _, m = P.edge_tile(start, c, end, be)
        nxt = ids(c + 1) if prefetch else None
        idx = P.load_ids(indices_ref, off, m, be) if idx is None else idx
        rows = P.gather_parts(x_ref, idx, cols, jnp.broadcast_to(m[:, None], (be, width)), 0, pairs, narrow)
        if weighted:
            w = P.load_ids(w_ref, off, m, be).astype(jnp.float32)
            rows = [r * w[:, None] for r in rows]
        acc = tuple(a + jnp.sum(r, axis=0) for a, r in zip(acc, rows, strict=True))
        return (*acc, nxt) if prefetch else acc

    steps = P.num_chunks(start, end, be)
    init_carry = tuple(jnp.zeros((width,), jnp.float32) for _ in range(parts)) + ((ids(0),) if prefetch else ())
    acc = P.interleave(lax.fori_loop(0, steps, body, init_carry)[:parts])
    if scaled:
        acc = acc * scale_ref[u]
    if init:
        acc = acc + init_ref[0, :].astype(jnp.float32)
    o_ref[0, :] = acc.astype(o_ref.dtype)


def _call(
    starts, ends, indices, w, x, num_units, out_dtype, be, bf, interpret, init=None, variant=None, pairs=None,
    scale=None,
):  # fmt: skip
    """``variant``: a :class:`~..config.GatherVariant` (``None``: the plain kernel); ``pairs``: the dtype
    whose uint32 pairs ``x`` holds (``(N, F/2)``), or ``None``; ``scale``: a float32 factor per unit, or ``None``."""
    v = check_variant(variant)
    fp = x.shape[1] * (1 if pairs is None else 2)  # features
    args = (starts, ends, indices) + ((w,) if w is not None else ()) + (x,) + ((scale,) if scale is not None else ())
    rows = pl.BlockSpec((1, bf), lambda u, f: (u, f))
    extra = {}
    if init is not None:  # the index arrays and x whole; init by rows like the output, which overwrites it
        extra = dict(in_specs=[pl.no_block_spec] * len(args) + [rows], input_output_aliases={len(args): 0})
        args = args + (init,)
    kernel = functools.partial(
        _kernel, be=be, bf=bf, weighted=w is not None, init=init is not None, pairs=pairs, prefetch=v.prefetch,
        narrow=v.narrow_loads, scaled=scale is not None,
    )  # fmt: skip
    return pl.pallas_call(
        kernel,
        grid=(num_units, fp // bf),
        out_specs=rows,
        out_shape=jax.ShapeDtypeStruct((num_units, fp), out_dtype),
        **extra,
        interpret=interpret,
        compiler_params=P.params(v.warps(4)),
        name="gnn_spmm" + v.name_suffix(),
    )(*args)


# ---------------------------------------------------------------------------------- packed kernel
def _packed_kernel(
    *refs, num_units: int, f: int, nodes: int, be: int, bf: int, flags: tuple[bool, bool, bool, bool], pairs=None,
    prefetch=False, narrow=False,
):  # fmt: skip
    """``pairs`` / ``prefetch`` / ``narrow``: as in :func:`_kernel` (``x_ref`` then has ``f / 2`` uint32 columns);
    ``flags``: whether a unit order, weights, a factor per unit (``scale_ref``) and ``init`` come."""
    ordered, weighted, scaled, init = flags
    refs = list(refs)
    starts_ref, ends_ref = refs.pop(0), refs.pop(0)
    order_ref = refs.pop(0) if ordered else None
    indices_ref = refs.pop(0)
    w_ref = refs.pop(0) if weighted else None
    x_ref = refs.pop(0)
    scale_ref = refs.pop(0) if scaled else None
    init_ref = refs.pop(0) if init else None
    (o_ref,) = refs
    p, fb = pl.program_id(0), pl.program_id(1)
    units, live, start, end = P.unit_block(starts_ref, ends_ref, order_ref, p * nodes, nodes, num_units)
    cols = fb * bf + jnp.arange(bf, dtype=jnp.int32)
    colmask = cols < f  # no padded copy of x: the last feature block is masked instead
    width, parts, xcols, xmask = P.packed_columns(fb, bf, f, cols, colmask, pairs)
    shape = (nodes, be, width)

    def ids(c):
        return P.load_at(indices_ref, *P.edge_tiles(start, c, end, be))

    def body(c, carry):
        *acc, idx = carry if prefetch else (*carry, None)
        pos, m = P.edge_tiles(start, c, end, be)
        nxt = ids(c + 1) if prefetch else None
        idx = P.load_at(indices_ref, pos, m) if idx is None else idx
        m3 = jnp.broadcast_to(m[:, :, None], shape) & jnp.broadcast_to(xmask[None, None, :], shape)
        rows = P.gather_parts(x_ref, idx, xcols, m3, 0.0, pairs, narrow)
        if weighted:
            w = P.load_at(w_ref, pos, m).astype(jnp.float32)[:, :, None]
            rows = [r * w for r in rows]
        acc = tuple(a + jnp.sum(r, axis=1) for a, r in zip(acc, rows, strict=True))
        return (*acc, nxt) if prefetch else acc

    steps = jnp.max(P.num_chunks(start, end, be))  # the group's longest edge range
    init_carry = tuple(jnp.zeros((nodes, width), jnp.float32) for _ in range(parts)) + ((ids(0),) if prefetch else ())
    acc = P.interleave(lax.fori_loop(0, steps, body, init_carry)[:parts])
    out_mask = jnp.broadcast_to(live[:, None], (nodes, bf)) & jnp.broadcast_to(colmask[None, :], (nodes, bf))
    if scaled:
        acc = acc * P.load_at(scale_ref, units, live)[:, None]
    if init:
        acc = acc + P.load_at(init_ref, (units[:, None], cols[None, :]), out_mask).astype(jnp.float32)
    P.store_rows(o_ref, units, cols, acc, out_mask)


def _packed_call(
    starts, ends, order, indices, w, x, num_units, out_dtype, nodes, be, bf, warps, interpret, init=None,
    variant=None, pairs=None, scale=None,
):  # fmt: skip
    """``variant`` / ``pairs`` / ``scale``: as in :func:`_call`."""
    v = check_variant(variant)
    f = x.shape[1] * (1 if pairs is None else 2)  # features
    args = (starts, ends) + (() if order is None else (order,)) + (indices,) + (() if w is None else (w,)) + (x,)
    args = args + (() if scale is None else (scale,))
    extra = {}
    if init is not None:  # each program reads its rows of init, then writes the same rows of the output over it
        extra = dict(input_output_aliases={len(args): 0})
        args = args + (init,)
    kernel = functools.partial(
        _packed_kernel, num_units=num_units, f=f, nodes=nodes, be=be, bf=bf,
        flags=(order is not None, w is not None, scale is not None, init is not None), pairs=pairs, prefetch=v.prefetch,
        narrow=v.narrow_loads,
    )  # fmt: skip
    return pl.pallas_call(
        kernel,
        grid=(cdiv(num_units, nodes), cdiv(f, bf)),
        out_shape=jax.ShapeDtypeStruct((num_units, f), out_dtype),  # whole array: each program stores its rows
        **extra,
        interpret=interpret,
        compiler_params=P.params(v.warps(warps)),
        name=f"gnn_spmm_x{nodes}" + v.name_suffix(),
    )(*args)


def check_nodes_per_program(nodes_per_program) -> None:
    """``None`` or one of :data:`NODES_PER_PROGRAM`; raises ``ValueError`` otherwise."""
    g = nodes_per_program
    if g is None:
        return
    ok = isinstance(g, int | np.integer) and not isinstance(g, bool) and int(g) in NODES_PER_PROGRAM
    if not ok:
        raise ValueError(f"Expected nodes_per_program None or one of {NODES_PER_PROGRAM}. Got {g!r}.")


def _csr_sum_packed(g, w_csr, x, init, nodes, be, interpret, variant=None, row_scale=None):
    n, f = x.shape
    if g.edge_capacity == 0 or n == 0 or f == 0:  # nothing to gather (and no edge array a kernel could read)
        return jnp.zeros_like(x) if init is None else init.astype(x.dtype)
    v = check_variant(variant)
    be, bf, warps = packed_tiles(nodes, f, be, scale=v.edge_scale(x.dtype))
    pairs = v.pair_dtype(x.dtype, f)  # (odd F: the plain gather)
    xg = x if pairs is None else P.as_pairs(x)
    indices = jnp.asarray(g.indices)
    split = P.split_units(g)
    (s0, e0, _), extra = split.main, split.extra
    init = None if init is None else init.astype(x.dtype)
    kw = dict(variant=variant, pairs=pairs)
    out = _packed_call(
        s0, e0, length_order(g, split), indices, w_csr, xg, n, x.dtype, nodes, be, bf, warps, interpret, init, **kw,
        scale=row_scale,
    )  # fmt: skip
    if extra is not None:  # extra units: one chunk each, by node
        s1, e1, _ = extra
        part = _packed_call(
            s1, e1, None, indices, w_csr, xg, s1.shape[0], jnp.float32, nodes, be, bf, warps, interpret, **kw
        )
        out = split.fold(out, part, row_scale)
    return out


def csr_sum(
    g: Graph | DynamicGraph,
    w_csr: jax.Array | None,
    x: jax.Array,
    init: jax.Array | None = None,
    *,
    be: int | None = None,
    nodes_per_program: int | None = None,
    variant: GatherVariant | None = None,
    row_scale: jax.Array | None = None,
) -> jax.Array:
    """``x (N, F)`` -> ``(N, F)``; ``w_csr`` (E,) in CSR order of ``g`` or None; plus ``init (N, F)`` if given.
    ``row_scale`` (N,) or None: a factor of the destination alone (the mean's ``1 / in-degree``), multiplied into each
    float32 sum once (before ``init`` is added) rather than into every gathered row, as the reference's.

    ``nodes_per_program``: ``None`` or 1, one node per program (the default); 2, 4, 8 or 16, the
    packed kernel with that many light nodes per program. ``be``: edges per step (per node with
    the packed kernel; default: :func:`~..order.spmm_edges_per_step` for the one-node kernel, the packed
    kernel's own rule). ``variant``: a :class:`~..config.GatherVariant` of either kernel (``None``:
    :func:`~..order.spmm_variant`, tuned entry ``spmm.variant`` for the one-node kernel, the plain packed
    kernel; ``GatherVariant()``: the plain kernel). Results never depend on these (sums may round
    differently where the edges per step change).
    """
    interpret = P.interpret_mode()
    P.check_dtype(x)
    check_nodes_per_program(nodes_per_program)
    if variant is None:
        variant = spmm_variant(nodes_per_program)
    v = check_variant(variant)
    n, f = x.shape
    scale = None if row_scale is None else jnp.asarray(row_scale, jnp.float32)
    if nodes_per_program not in (None, 1):
        return _csr_sum_packed(g, w_csr, x, init, int(nodes_per_program), be, interpret, variant, scale)
    fp = next_power_of_2(f, 16)
    bf = min(fp, 128)
    be = be or spmm_edges_per_step(g.edge_capacity, g.num_nodes, bf, v.edge_scale(x.dtype))
    xp = P.pad_last(x, fp)
    pairs = v.pair_dtype(x.dtype, fp)
    xg = xp if pairs is None else P.as_pairs(xp)
    indices = jnp.asarray(g.indices)
    split = P.split_units(g)
    (s0, e0, _), extra = split.main, split.extra
    init = None if init is None else P.pad_last(init.astype(x.dtype), fp)
    kw = dict(variant=variant, pairs=pairs)
    out = _call(s0, e0, indices, w_csr, xg, n, x.dtype, be, bf, interpret, init, **kw, scale=scale)
    if extra is not None:
        s1, e1, _ = extra
        part = _call(s1, e1, indices, w_csr, xg, s1.shape[0], jnp.float32, be, bf, interpret, **kw)
        out = split.fold(out, part, scale)
    return out[:, :f]
