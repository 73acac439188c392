"""Pallas kernels for max / min aggregation with degree-aware tiling.

Two kernels share one schedule (:class:`blocksparse.graph.Schedule`):

* one node per program (``nodes_per_program=1``): each program takes one (node, feature block)
  and loops over its in-edges ``be`` at a time;
* packed (``nodes_per_program=G > 1``): each program takes ``G`` consecutive nodes: every step
  gathers a ``(G, be)`` tile of edge ids, each row masked to its own node's edge range, reduces
  the ``(G, be, bf)`` rows into a ``(G, bf)`` accumulator and stores the ``G`` rows as one block.
  Fewer, fuller programs: more source rows in flight per program on graphs of small mean degree.

Heavy nodes: the first chunk runs in the node's own program, the rest as extra programs in
parallel (packed alike), combined afterwards. With ``with_arg``, each program also returns, per
feature, the CSR position of the winning edge (the first one on ties), which the backward uses to
route gradients; without it the kernels skip that work. NaN propagates as in the reference
(``segment_max`` / ``segment_min``): a NaN feature makes the node's result NaN, its arg the first
NaN in-edge, in light and heavy nodes alike (heavy nodes' partials are combined with segment ops).
The kernels track NaN themselves because the Triton lowering's max / min drop NaN operands.
"""

from __future__ import annotations

import functools
import weakref

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from ...._util import cdiv, next_power_of_2
from ....graph import DynamicGraph, Graph
from .. import triton_common as P
from ..config import AGGREGATE_NODES_PER_PROGRAM, GatherVariant, check_variant
from ..order import aggregate_nodes_per_program, aggregate_one_node_edges, aggregate_variant
from .reference import winners

_BIG = 2**31 - 1


def _value_step(carry, rows, is_max: bool, axis: int):
    """One step of max / min without the arg: the carry ``(best, nan)`` updated with ``rows`` reduced over the edge
    ``axis``. NaN is tracked apart: the Triton lowering's max / min drop NaN operands (the interpreter's keep them)."""
    red, pick = (jnp.max, jnp.maximum) if is_max else (jnp.min, jnp.minimum)
    best, nan = carry
    return pick(best, red(rows, axis=axis)), jnp.maximum(nan, jnp.max(jnp.where(jnp.isnan(rows), 1, 0), axis=axis))


def _value_out(best, nan, has):
    """The values-only result: NaN where a NaN was seen, else the extreme, 0 for a node without in-edges."""
    return jnp.where(nan > 0, jnp.nan, jnp.where(has, best, 0.0))


def _kernel(
    starts_ref, ends_ref, indices_ref, x_ref, o_ref, *a_ref, be: int, bf: int, is_max: bool, pairs=None, key=False,
    narrow=False,
):  # fmt: skip
    """``pairs``: the 2-byte dtype whose uint32 pairs ``x_ref`` holds, reduced as two float32 halves of ``bf / 2``
    columns each; ``key``: without the arg, reduce :func:`~..triton_common.order_key` keys (see ``GatherVariant``);
    ``narrow``: 2-byte rows gathered 4 features a lane (:func:`..triton_common.lanes`)."""
    u, fb = pl.program_id(0), pl.program_id(1)
    start, end = starts_ref[u], ends_ref[u]
    width, parts = (bf, 1) if pairs is None else (bf // 2, 2)  # x_ref's columns per program; float32 halves
    cols = fb * width + jnp.arange(width, dtype=jnp.int32)
    ident = -jnp.inf if is_max else jnp.inf

    def tiles(c):
        off, pos, m = P.edge_tile(start, c, end, be)
        idx = P.load_ids(indices_ref, off, m, be)
        m2 = jnp.broadcast_to(m[:, None], (be, width))
        return pos, m2, [jnp.where(m2, r, ident) for r in P.gather_parts(x_ref, idx, cols, m2, 0, pairs, narrow)]

    if key and not a_ref:  # values only, one integer reduction per step

        def keyed(c, keys):
            _, _, rows = tiles(c)
            red = jnp.max if is_max else jnp.min
            pick = jnp.maximum if is_max else jnp.minimum
            return tuple(pick(k, red(P.order_key(r, is_max), axis=0)) for k, r in zip(keys, rows, strict=True))

        key0 = P.order_key(jnp.full((width,), ident, jnp.float32), is_max)
        keys = lax.fori_loop(0, P.num_chunks(start, end, be), keyed, (key0,) * parts)
        best = P.interleave([P.from_key(k, is_max) for k in keys])
        o_ref[0, :] = jnp.where(end > start, best, 0.0).astype(o_ref.dtype)
        return

    if not a_ref:  # values only: the running extreme and whether a NaN was seen, no arg positions

        def values(c, carry):
            _, _, rows = tiles(c)  # masked-out entries hold the identity, never NaN
            return sum((_value_step(carry[2 * i : 2 * i + 2], r, is_max, 0) for i, r in enumerate(rows)), ())

        init = (jnp.full((width,), ident, jnp.float32), jnp.zeros((width,), jnp.int32)) * parts
        res = lax.fori_loop(0, P.num_chunks(start, end, be), values, init)
        best, nan = P.interleave(res[0::2]), P.interleave(res[1::2])
        o_ref[0, :] = _value_out(best, nan, end > start).astype(o_ref.dtype)
        return

    def part(c, carry, pos, m2, rows):
        best, arg = carry
        # NaN wins, as in segment_max / segment_min: every comparison with NaN is false, so a
        # plain max would keep NaN as the running value and then drop every later tile.
        nan = jnp.isnan(rows) & m2
        cnan = jnp.max(jnp.where(nan, 1, 0), axis=0) > 0  # (no reduce_or in the Triton lowering)
        cbest = jnp.max(rows, axis=0) if is_max else jnp.min(rows, axis=0)
        cbest = jnp.where(cnan, jnp.nan, cbest)
        hit = jnp.where(cnan[None, :], nan, rows == cbest[None, :]) & m2
        carg = jnp.min(jnp.where(hit, jnp.broadcast_to(pos[:, None], (be, width)), _BIG), axis=0)
        better = (cbest > best) if is_max else (cbest < best)
        better = better | (cnan & ~jnp.isnan(best))  # the first NaN replaces any number
        better = better | ((arg < 0) & (carg < _BIG))  # first valid value (also +-inf)
        return jnp.where(better, cbest, best), jnp.where(better, carg, arg)

    def body(c, carry):
        pos, m2, rows = tiles(c)
        return sum((part(c, carry[2 * i : 2 * i + 2], pos, m2, r) for i, r in enumerate(rows)), ())

    init = (jnp.full((width,), ident, jnp.float32), jnp.full((width,), -1, jnp.int32)) * parts
    res = lax.fori_loop(0, P.num_chunks(start, end, be), body, init)
    best, arg = P.interleave(res[0::2]), P.interleave(res[1::2])
    o_ref[0, :] = jnp.where(arg >= 0, best, 0.0).astype(o_ref.dtype)
    if a_ref:  # only when differentiating: the backward routes gradients through it
        a_ref[0][0, :] = arg


def _call(
    starts, ends, indices, x, num_units, out_dtype, be, bf, is_max, interpret, with_arg=True, variant=None, pairs=None
):
    """``variant``: a :class:`~..config.GatherVariant` (``None``: the plain kernel); ``pairs``: the dtype
    whose uint32 pairs ``x`` holds (``(N, F/2)``), or ``None``."""
    v = check_variant(variant)
    fp = x.shape[1] * (1 if pairs is None else 2)  # features
    spec = pl.BlockSpec((1, bf), lambda u, f: (u, f))
    return pl.pallas_call(
        functools.partial(_kernel, be=be, bf=bf, is_max=is_max, pairs=pairs, key=v.key_reduce, narrow=v.narrow_loads),
        grid=(num_units, fp // bf),
        out_specs=[spec, spec][: 1 + with_arg],
        out_shape=[jax.ShapeDtypeStruct((num_units, fp), out_dtype), jax.ShapeDtypeStruct((num_units, fp), jnp.int32)][
            : 1 + with_arg
        ],
        interpret=interpret,
        compiler_params=P.params(v.warps(4)),
        name=("gnn_aggregate_max" if is_max else "gnn_aggregate_min") + v.name_suffix(),
    )(starts, ends, indices, x)


# ---------------------------------------------------------------------------------- packed kernel
#: The packed kernel's tile budget: ``nodes * be * bf`` elements per step (a ``(nodes, be, bf)`` gather).
_TILE = 4096
MAX_NODES_PER_PROGRAM = AGGREGATE_NODES_PER_PROGRAM[-1]


def check_nodes_per_program(nodes_per_program) -> None:
    """``None`` or a power of two in ``[1, MAX_NODES_PER_PROGRAM]``; raises ``ValueError`` otherwise."""
    if nodes_per_program is None:
        return
    g = nodes_per_program
    ok = isinstance(g, int | np.integer) and not isinstance(g, bool)
    if not (ok and 1 <= g <= MAX_NODES_PER_PROGRAM and g & (g - 1) == 0):
        raise ValueError(
            f"Expected nodes_per_program None or a power of two in [1, {MAX_NODES_PER_PROGRAM}]. Got {g!r}."
        )


def one_node_tiles(f: int, be: int | None = None, scale: int = 1) -> tuple[int, int]:
    """(edges per step ``be``, features per program ``bf``) of the one-node kernel (``x`` padded to a power of two).

    ``be`` defaults to :func:`~..order.aggregate_one_node_edges` (tuned entry ``aggregate.one_node_tile``);
    ``scale``: a factor on it (``GatherVariant.tile_bytes``: 2 for 2-byte ``x``)."""
    bf = min(next_power_of_2(f, 16), 128)
    return be or aggregate_one_node_edges(bf, scale), bf


def packed_tiles(nodes: int, f: int, be: int | None = None, scale: int = 1) -> tuple[int, int, int]:
    """(edges per step ``be``, features per program ``bf``, warps) of the packed kernel for ``nodes`` per program.

    ``scale``: a factor on the tile budget and the default ``be``'s cap (``GatherVariant.tile_bytes``: 2 for
    2-byte ``x``, a budget in bytes rather than elements)."""
    bf = min(next_power_of_2(f, 16), 128)
    tile = _TILE * scale
    be = be or max(4, min(32 * scale, tile // (nodes * bf)))
    while nodes * be * bf > 2 * tile and bf > 16:  # many nodes: narrower feature blocks, not fewer edges
        bf //= 2
    return be, bf, 4 if nodes * be * bf <= tile else 8


def _packed_kernel(
    *refs, num_units: int, f: int, nodes: int, be: int, bf: int, is_max: bool, ordered: bool, prefetch: bool,
    pairs=None, key: bool = False, narrow: bool = False,
):  # fmt: skip
    """``pairs`` / ``key`` / ``narrow``: as in :func:`_kernel` (``x_ref`` then has ``f / 2`` uint32 columns)."""
    if ordered:
        starts_ref, ends_ref, order_ref, indices_ref, x_ref, o_ref, *a_ref = refs
    else:
        (starts_ref, ends_ref, indices_ref, x_ref, o_ref, *a_ref), order_ref = refs, None
    p, fb = pl.program_id(0), pl.program_id(1)
    units, live, start, end = P.unit_block(starts_ref, ends_ref, order_ref, p * nodes, nodes, num_units)
    cols = fb * bf + jnp.arange(bf, dtype=jnp.int32)
    colmask = cols < f  # no padded copy of x: the last feature block is masked instead
    ident = -jnp.inf if is_max else jnp.inf
    red, pick = (jnp.max, jnp.maximum) if is_max else (jnp.min, jnp.minimum)
    width, parts, xcols, xmask = P.packed_columns(fb, bf, f, cols, colmask, pairs)
    shape = (nodes, be, width)

    def ids(c):
        pos, m = P.edge_tiles(start, c, end, be)
        return P.load_at(indices_ref, pos, m)

    def tile(c, idx):
        """Step ``c``'s rows; ``idx``: its edge ids, loaded in the step before with ``prefetch``, else now."""
        pos, m = P.edge_tiles(start, c, end, be)
        idx = P.load_at(indices_ref, pos, m) if idx is None else idx
        m3 = jnp.broadcast_to(m[:, :, None], shape) & jnp.broadcast_to(xmask[None, None, :], shape)
        # masked-out entries read the identity, so they never win (a real +-inf ties with it: see `hit`)
        return pos, m3, P.gather_parts(x_ref, idx, xcols, m3, ident, pairs, narrow)

    def each_part(body, k):
        """``body`` (``k`` carry entries) applied to each part (half) with its own slice of the carry."""

        def run(c, carry, pos, m3, rows):
            return sum((tuple(body(c, carry[k * i : k * i + k], pos, m3, r)) for i, r in enumerate(rows)), ())

        return run

    def step(body):
        """``body(c, carry, rows...)`` as a loop body; with ``prefetch`` the next step's ids ride in the carry,
        loaded before this step's gather so the two loads overlap."""
        if not prefetch:
            return lambda c, carry: body(c, carry, *tile(c, None))

        def run(c, carry):
            *carry, idx = carry
            nxt = ids(c + 1)
            return (*body(c, tuple(carry), *tile(c, idx)), nxt)

        return run

    def keyed(c, carry, pos, m3, rows):  # one integer reduction: the key order propagates NaN
        return (pick(carry[0], red(P.order_key(rows, is_max), axis=1)),)

    def values(c, carry, pos, m3, rows):
        return _value_step(carry, rows, is_max, 1)

    def with_args(c, carry, pos, m3, rows):  # as _kernel's body, per node (axis 1 is the edge axis)
        best, arg = carry
        nan = jnp.isnan(rows)  # masked-out entries hold the identity, never NaN
        cnan = jnp.max(jnp.where(nan, 1, 0), axis=1) > 0
        cbest = jnp.where(cnan, jnp.nan, red(rows, axis=1))
        hit = jnp.where(jnp.broadcast_to(cnan[:, None, :], shape), nan, rows == cbest[:, None, :]) & m3
        carg = jnp.min(jnp.where(hit, jnp.broadcast_to(pos[:, :, None], shape), _BIG), axis=1)
        better = (cbest > best) if is_max else (cbest < best)
        better = better | (cnan & ~jnp.isnan(best))  # the first NaN replaces any number
        better = better | ((arg < 0) & (carg < _BIG))  # first valid value (also +-inf)
        return jnp.where(better, cbest, best), jnp.where(better, carg, arg)

    steps = jnp.max(P.num_chunks(start, end, be))  # the group's longest edge range
    out_mask = jnp.broadcast_to(live[:, None], (nodes, bf)) & jnp.broadcast_to(colmask[None, :], (nodes, bf))
    best0 = jnp.full((nodes, width), ident, jnp.float32)
    first = (ids(0),) if prefetch else ()

    def loop(body, init):
        """Each part's carry ``init`` (``k`` entries) through the loop: ``k`` lists of ``parts`` results."""
        k = len(init)
        res = lax.fori_loop(0, steps, step(each_part(body, k)), (*init * parts, *first))[: k * parts]
        return [res[j::k] for j in range(k)]

    if a_ref:  # only when differentiating: the backward routes gradients through it
        best, arg = map(P.interleave, loop(with_args, (best0, jnp.full((nodes, width), -1, jnp.int32))))
        P.store_rows(o_ref, units, cols, jnp.where(arg >= 0, best, 0.0), out_mask)
        P.store_rows(a_ref[0], units, cols, arg, out_mask)
    elif key:
        (keys,) = loop(keyed, (P.order_key(best0, is_max),))
        best = P.interleave([P.from_key(k, is_max) for k in keys])
        has = jnp.broadcast_to((end > start)[:, None], (nodes, bf))
        P.store_rows(o_ref, units, cols, jnp.where(has, best, 0.0), out_mask)
    else:
        best, nan = map(P.interleave, loop(values, (best0, jnp.zeros((nodes, width), jnp.int32))))
        has = jnp.broadcast_to((end > start)[:, None], (nodes, bf))
        P.store_rows(o_ref, units, cols, _value_out(best, nan, has), out_mask)


def _packed_call(
    starts, ends, order, indices, x, num_units, out_dtype, nodes, be, bf, warps, is_max, interpret, with_arg, prefetch,
    variant=None, pairs=None,
):  # fmt: skip
    """``variant`` / ``pairs``: as in :func:`_call`."""
    v = check_variant(variant)
    f = x.shape[1] * (1 if pairs is None else 2)  # features
    shapes = [jax.ShapeDtypeStruct((num_units, f), out_dtype), jax.ShapeDtypeStruct((num_units, f), jnp.int32)]
    kernel = functools.partial(
        _packed_kernel, num_units=num_units, f=f, nodes=nodes, be=be, bf=bf, is_max=is_max,
        ordered=order is not None, prefetch=prefetch or v.prefetch, pairs=pairs, key=v.key_reduce,
        narrow=v.narrow_loads,
    )  # fmt: skip
    return pl.pallas_call(
        kernel,
        grid=(cdiv(num_units, nodes), cdiv(f, bf)),
        out_shape=shapes[: 1 + with_arg],  # whole arrays: each program stores its rows, masked at the end
        interpret=interpret,
        compiler_params=P.params(v.warps(warps)),
        name=f"gnn_aggregate_{'max' if is_max else 'min'}_x{nodes}" + v.name_suffix(),
    )(*(starts, ends) + (() if order is None else (order,)) + (indices, x))


_HOST_ORDERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Graph -> {split: its length order}


def _host_order(g: Graph, split: bool) -> np.ndarray:
    """A static graph's nodes by main-unit length, longest first (stable), computed once per graph and kind of main
    units (the schedule's, or :func:`~..triton_common.split_units`')."""
    orders = _HOST_ORDERS.setdefault(g, {})
    if split not in orders:
        ends = P.split_main_end(g) if split else g.schedule.main_end
        orders[split] = np.argsort(g.indptr[:-1].astype(np.int64) - ends, kind="stable").astype(np.int32)
    return orders[split]


def length_order(g: Graph | DynamicGraph, split: P.Split | None = None) -> jax.Array:
    """Nodes sorted by the length of their main unit, longest first (ties by id).

    The packed kernel takes nodes in this order: each program's nodes then have about the same
    number of in-edges, so few of its ``(G, be)`` tile rows are masked (about 87% of them busy on a
    power-law graph of mean in-degree 32, against 45% for ``G = 4`` in id order), and the longest
    programs start first. A :class:`Graph`'s order is a constant; a :class:`DynamicGraph`'s is one
    sort of ``num_nodes`` keys per call. The main units are :func:`~blocksparse.ops.gnn.triton_common.units`'
    (a heavy node's first chunk), or those of ``split``, the graph's
    :func:`~blocksparse.ops.gnn.triton_common.split_units` that the kernel runs (heavy nodes' empty: last).
    """
    if isinstance(g, Graph):
        return jnp.asarray(_host_order(g, split is not None))
    ends = jnp.asarray(g.schedule.main_end) if split is None else split.main[1]
    return jnp.argsort(jnp.asarray(g.indptr[:-1]) - ends, stable=True).astype(jnp.int32)


def segment_extreme(
    g: Graph | DynamicGraph,
    x: jax.Array,
    is_max: bool,
    *,
    with_arg: bool = True,
    be: int | None = None,
    nodes_per_program: int | None = None,
    sort_by_degree: bool = True,
    prefetch: bool = False,
    variant: GatherVariant | None = None,
):
    """``x (N, F)`` -> (values ``(N, F)``, CSR position of the arg-max/min or -1; or None without ``with_arg``).

    ``nodes_per_program``: light nodes per program, a power of two; ``None`` picks
    :func:`~..order.aggregate_nodes_per_program` of the graph's mean in-degree (``edge_capacity / num_nodes``),
    1 is the one-node kernel. ``be``: edges per step (default: per kernel, see :func:`packed_tiles`).
    ``sort_by_degree``: the packed kernel groups nodes in :func:`length_order` (``False``: in id
    order, for comparison). ``prefetch``: the packed kernel loads step ``c + 1``'s edge ids before
    gathering step ``c``'s rows (one dependent memory round trip per step instead of two). ``variant``:
    a :class:`~..config.GatherVariant` of either kernel (``None``: with neither ``nodes_per_program``
    nor ``prefetch`` given, :func:`~..order.aggregate_variant`, tuned entries ``aggregate.with_arg`` /
    ``aggregate.values_only``; else the plain kernel). Results never depend on these.
    """
    interpret = P.interpret_mode()
    P.check_dtype(x)
    check_nodes_per_program(nodes_per_program)
    n, f = x.shape
    mean_degree = g.edge_capacity / max(n, 1)
    if variant is None and nodes_per_program is None and not prefetch:  # (prefetch: a knob of the packed kernel)
        nodes_per_program, variant = aggregate_variant(x.dtype, with_arg, mean_degree)
    v = check_variant(variant)
    nodes = nodes_per_program or aggregate_nodes_per_program(mean_degree)
    indices = jnp.asarray(g.indices)
    if nodes == 1:
        be, bf = one_node_tiles(f, be, scale=v.edge_scale(x.dtype))
        xp = P.pad_last(x, next_power_of_2(f, 16))
        pairs = v.pair_dtype(x.dtype, xp.shape[1])
        xg = xp if pairs is None else P.as_pairs(xp)

        def run(s, e, dtype, arg, order):  # (one node per program: always in id order)
            kw = dict(variant=variant, pairs=pairs)
            return _call(s, e, indices, xg, s.shape[0], dtype, be, bf, is_max, interpret, arg, **kw)
    else:
        be, bf, warps = packed_tiles(nodes, f, be, scale=v.edge_scale(x.dtype))
        pairs = v.pair_dtype(x.dtype, f)  # (odd F: the plain gather)
        xg = x if pairs is None else P.as_pairs(x)

        def run(s, e, dtype, arg, order):
            return _packed_call(
                s, e, order, indices, xg, s.shape[0], dtype, nodes, be, bf, warps, is_max, interpret, arg, prefetch,
                variant, pairs,
            )  # fmt: skip

    (s0, e0, _), extra = P.units(g)
    # the main units in length order; the extra units (all one chunk long but each node's last) in id order
    res = run(s0, e0, x.dtype, with_arg, length_order(g) if sort_by_degree and nodes > 1 else None)
    out, arg = (res[0], res[1]) if with_arg else (res[0], None)
    red = jax.ops.segment_max if is_max else jax.ops.segment_min
    if extra is not None and not with_arg:
        s1, e1, _ = extra
        (v1,) = run(s1, e1, jnp.float32, False, None)
        heavy, seg, nh = P.heavy_arrays(g)
        best = red(jnp.concatenate([out[heavy].astype(jnp.float32), v1]), jnp.concatenate([jnp.arange(nh), seg]), nh)
        return out.at[heavy].set(best.astype(out.dtype), unique_indices=True, mode="drop")[:, :f], None
    if extra is not None:
        s1, e1, _ = extra
        v1, a1 = run(s1, e1, jnp.float32, True, None)
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
