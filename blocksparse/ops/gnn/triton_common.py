"""Shared machinery of the GNN Pallas (Triton) kernels (``spmm/``, ``aggregate/``, ``attention/``).

Rules the kernels follow (jax 0.11.2, Triton lowering): no scalar prefetch and no dynamic grid;
index arrays are whole-array refs read with scalars (``starts_ref[u]``); edge loops are
``lax.fori_loop`` over dynamic bounds; every loaded tile has a power-of-two element count;
gathers index with arrays on *every* axis (``x_ref[idx[:, None], cols[None, :]]``) because
interpret mode cannot mix array indices with ``pl.ds`` slices. No atomics: every output row is
written by one program and heavy nodes' partial rows are combined afterwards with segment ops.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from ... import hardware
from ...graph import DynamicGraph, Graph
from .. import _dispatch

SUPPORTED_DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)


def interpret_mode() -> bool:
    """The ``interpret`` argument of the GNN kernels' ``pallas_call``: ``True`` inside
    :func:`blocksparse.interpret`, ``False`` on a GPU (:func:`blocksparse.hardware.current`, so a test lowers
    the real kernels on a CPU under ``hardware.fake(hardware.H200)``); raises ``NotImplementedError`` else."""
    if _dispatch.interpreting():
        return True
    dev = hardware.current()
    if not dev.is_gpu:
        raise NotImplementedError(
            f"no GPU (default device is {dev.platform!r}); set BLOCKSPARSE_PALLAS_INTERPRET=1 or use "
            "blocksparse.interpret() to run the Pallas kernels in the interpreter"
        )
    return False


def check_dtype(*arrays) -> None:
    for a in arrays:
        if a.dtype not in SUPPORTED_DTYPES:
            raise NotImplementedError(f"the Pallas GNN kernels take float32/bfloat16/float16, got {a.dtype}")


def pad_last(x: jax.Array, width: int) -> jax.Array:
    if x.shape[-1] == width:
        return x
    return jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, width - x.shape[-1])])


def units(g: Graph | DynamicGraph):
    """Device arrays of the two unit lists of ``g``'s schedule: (starts, ends, nodes) each.

    A :class:`Graph`'s are constants; a :class:`DynamicGraph`'s are traced, with a static number of
    extra units (its capacity; unused ones are empty and their partials are dropped by the folds).
    """
    s = g.schedule
    main = (
        jnp.asarray(g.indptr[:-1]),
        jnp.asarray(s.main_end),
        jnp.arange(g.num_nodes, dtype=jnp.int32),
    )
    extra = None
    if s.num_extra:
        extra = (jnp.asarray(s.extra_start), jnp.asarray(s.extra_end), jnp.asarray(s.extra_node))
    return main, extra


def edge_tile(start, c, end, be: int):
    """CSR positions ``start + c*be + [0, be)`` and their validity mask."""
    off = start + c * be
    pos = off + jnp.arange(be, dtype=jnp.int32)
    return off, pos, pos < end


def load_ids(ref, off, mask, be: int):
    return plgpu.load(ref.at[pl.ds(off, be)], mask=mask, other=0)


def lanes(ref, cols, narrow: bool):
    """The column ids ``cols`` (non-negative) of a gather from ``ref``; with ``narrow`` and 2-byte ``ref``, the same
    values written as ``(cols // 4) * 4 + cols % 4``, whose known contiguity is 4: Triton then loads 4 features (8
    bytes) a lane instead of 8 (16 bytes), so a 128-feature row spans a whole warp, as a float32 row does, and the
    reductions over a step's edges stay inside each thread instead of shuffling between lanes
    (``GatherVariant.narrow_loads``, ``AttentionConfig.narrow_loads``)."""
    if not narrow or jnp.dtype(ref.dtype).itemsize != 2:
        return cols
    four = jnp.int32(4)
    return lax.div(cols, four) * four + lax.rem(cols, four)


def gather(ref, rows, cols, mask2, narrow: bool = False):
    """``ref[rows[:, None], cols[None, :]]`` with masked-out rows read as 0, in float32 (``narrow``: :func:`lanes`)."""
    cols = lanes(ref, cols, narrow)
    return plgpu.load(ref.at[rows[:, None], cols[None, :]], mask=mask2, other=0).astype(jnp.float32)


def num_chunks(start, end, be: int):
    return (end - start + (be - 1)) // be


def params(num_warps: int):
    return plgpu.CompilerParams(num_warps=num_warps, num_stages=2)


def heavy_arrays(g: Graph | DynamicGraph):
    """(heavy nodes, extra unit -> heavy slot, number of slots); out-of-range entries are unused."""
    s = g.schedule
    return jnp.asarray(s.heavy_nodes), jnp.asarray(s.extra_segment), int(s.heavy_nodes.size)


class Split(NamedTuple):
    """:func:`split_units`' result. ``main`` and ``extra``: (starts, ends, nodes) as from :func:`units`
    (``extra`` ``None`` without heavy nodes); ``heavy``: the heavy nodes (:func:`heavy_arrays`); ``segments``: each
    extra unit's slot among them (out of range for unused units, which segment ops drop), ascending if
    ``is_sorted``."""

    main: tuple
    extra: tuple | None
    heavy: jax.Array | None
    segments: jax.Array | None
    is_sorted: bool

    def fold(self, out: jax.Array, part: jax.Array, scale: jax.Array | None = None) -> jax.Array:
        """Each heavy node's row of ``out`` (zero, or the row of an ``init`` the kernel started from, exact in
        ``out``'s dtype) plus the sum of its float32 rows of ``part`` (one per extra unit), times the node's factor
        of ``scale`` (per node, float32; ``None``: 1), rounded once."""
        if self.extra is None:
            return out
        sums = jax.ops.segment_sum(part, self.segments, self.heavy.shape[0], indices_are_sorted=self.is_sorted)
        if scale is not None:  # (a traced graph's unused heavy slots, node N + slot, read a clamped factor: dropped)
            sums = sums * scale[jnp.minimum(self.heavy, max(scale.shape[0] - 1, 0))][:, None]
        rows = out[self.heavy].astype(jnp.float32) + sums
        return out.at[self.heavy].set(rows.astype(out.dtype), unique_indices=True, indices_are_sorted=True, mode="drop")


def split_units(g: Graph | DynamicGraph) -> Split:
    """:func:`units` with every heavy node's result formed from float32 partial rows alone.

    A heavy node's main unit is empty here and its first chunk is an extra unit (before its other chunks), so the
    main output can take the result's dtype, half precision too, and still be rounded once (:meth:`Split.fold`
    for sums; the attention forward combines the extra rows by their log-sum-exp).
    """
    main, extra = units(g)
    if extra is None:
        return Split(main, None, None, None, True)
    (s0, e0, n0) = main
    s = g.schedule
    if isinstance(g, Graph):  # constants: the first chunks sorted in before their nodes' other chunks
        hn = np.asarray(s.heavy_nodes)
        first = np.asarray(g.indptr)[hn].astype(np.int32)
        main_end = split_main_end(g)
        segs = np.concatenate([np.arange(hn.size, dtype=np.int32), s.extra_segment])
        o = np.argsort(segs, kind="stable")
        cat = lambda a, b: jnp.asarray(np.concatenate([a, b])[o])  # noqa: E731
        extra = cat(first, s.extra_start), cat(np.asarray(s.main_end)[hn], s.extra_end), cat(hn, s.extra_node)
        return Split((s0, jnp.asarray(main_end), n0), extra, jnp.asarray(hn), jnp.asarray(segs[o]), True)
    # traced: unused heavy slots (node ``N + slot``) get empty units, and their segment ``nh`` is dropped
    heavy, seg, nh = heavy_arrays(g)
    n = g.num_nodes
    used = heavy < n
    hc = jnp.minimum(heavy, max(n - 1, 0))
    first = jnp.where(used, jnp.asarray(g.indptr)[hc], 0)
    extra = (jnp.concatenate([first, extra[0]]), jnp.concatenate([jnp.where(used, e0[hc], 0), extra[1]]),
             jnp.concatenate([hc, extra[2]]))  # fmt: skip
    e0 = e0.at[heavy].set(first, mode="drop", unique_indices=True)
    seg = jnp.concatenate([jnp.where(used, jnp.arange(nh, dtype=jnp.int32), nh), seg])
    return Split((s0, e0, n0), extra, heavy, seg, False)


def split_main_end(g: Graph) -> np.ndarray:
    """A static graph's main-unit ends in :func:`split_units` (host data): a heavy node's unit empty where the graph
    has extra units, else the schedule's."""
    s = g.schedule
    if not s.num_extra:
        return np.asarray(s.main_end)
    main_end = np.asarray(s.main_end).copy()
    hn = np.asarray(s.heavy_nodes)
    main_end[hn] = np.asarray(g.indptr)[hn]
    return main_end


# ------------------------------------------------------------------ several units per program
def unit_block(starts_ref, ends_ref, order_ref, first, count: int, num_units: int):
    """Slots ``first + [0, count)`` of the unit order: (unit ids, whether each exists, CSR starts, CSR ends).

    ``order_ref`` maps slots to units (say, units sorted by length); ``None``: slot ``i`` is unit ``i``.
    Missing units (slots past ``num_units``) are empty, and keep their slot as id: out of range and
    distinct, so a masked store never aliases a real row (the interpreter's masked store writes the
    old value back; out-of-range rows are dropped).
    """
    slots = first + jnp.arange(count, dtype=jnp.int32)
    live = slots < num_units
    if order_ref is None:
        units = slots
    else:
        units = jnp.where(live, plgpu.load(order_ref.at[slots], mask=live, other=0), slots)
    start = plgpu.load(starts_ref.at[units], mask=live, other=0)
    end = plgpu.load(ends_ref.at[units], mask=live, other=0)
    return units, live, start, end


def edge_tiles(start, c, end, be: int):
    """Per unit (rows), CSR positions ``start + c*be + [0, be)`` and their validity mask: ``(units, be)`` each."""
    pos = start[:, None] + c * be + jnp.arange(be, dtype=jnp.int32)[None, :]
    return pos, pos < end[:, None]


def load_at(ref, pos, mask):
    """``ref[pos]`` for an array of positions (any shape), 0 where ``mask`` is False."""
    return plgpu.load(ref.at[pos], mask=mask, other=0)


def gather_tiles(ref, ids, cols, mask3, other, narrow: bool = False):
    """``ref[ids[:, :, None], cols[None, None, :]]``: a ``(units, be, bf)`` gather (float32; ``other`` where masked;
    ``narrow``: :func:`lanes`)."""
    cols = lanes(ref, cols, narrow)
    rows = plgpu.load(ref.at[ids[:, :, None], cols[None, None, :]], mask=mask3, other=other)
    return rows.astype(jnp.float32)


def store_rows(ref, units, cols, value, mask2) -> None:
    """``ref[units[:, None], cols[None, :]] = value`` where ``mask2`` (rows of whole-array outputs, no blocking)."""
    plgpu.store(ref.at[units[:, None], cols[None, :]], value.astype(ref.dtype), mask=mask2)


def packed_columns(fb, bf: int, f: int, cols, colmask, pairs):
    """The columns a packed program reads of ``x``: ``(width, parts, xcols, xmask)``. Plain: the ``bf`` feature
    columns ``cols`` (``colmask`` masking those past ``f``), one part. With ``pairs`` (``x`` gathered as
    ``uint32`` pairs of features): ``bf / 2`` pair columns, two parts (the low and high halves)."""
    if pairs is None:
        return bf, 1, cols, colmask
    width = bf // 2
    xcols = fb * width + jnp.arange(width, dtype=jnp.int32)
    return width, 2, xcols, xcols < f // 2


def as_pairs(x: jax.Array) -> jax.Array:
    """``(N, F)`` 2-byte ``x`` -> ``(N, F/2)`` uint32: feature ``2k`` in the low half of column ``k``."""
    n, f = x.shape
    return lax.bitcast_convert_type(x.reshape(n, f // 2, 2), jnp.uint32)


def pair_bits(value: float, dtype) -> jax.Array:
    """The uint32 holding ``value`` in ``dtype`` in both halves (``other`` of a masked pair gather)."""
    return jnp.uint32(int(np.asarray([value, value], jnp.dtype(dtype)).view(np.uint32)[0]))


def unpack_pairs(u: jax.Array, dtype) -> tuple[jax.Array, jax.Array]:
    """uint32 pairs of ``dtype`` (bfloat16 / float16) -> (low halves, high halves) in float32, exactly."""
    if jnp.dtype(dtype) == jnp.bfloat16:  # a bfloat16 is the high half of its float32
        lo = lax.bitcast_convert_type(lax.shift_left(u, jnp.uint32(16)), jnp.float32)
        return lo, lax.bitcast_convert_type(u & jnp.uint32(0xFFFF0000), jnp.float32)
    lo = lax.bitcast_convert_type((u & jnp.uint32(0xFFFF)).astype(jnp.uint16), jnp.float16)
    hi = lax.bitcast_convert_type(lax.shift_right_logical(u, jnp.uint32(16)).astype(jnp.uint16), jnp.float16)
    return lo.astype(jnp.float32), hi.astype(jnp.float32)


def gather_parts(ref, idx, cols, mask, other, pairs, narrow: bool = False) -> tuple[jax.Array, ...]:
    """:func:`gather` (``idx`` of rank 1, ``other`` 0) or :func:`gather_tiles` (rank 2) as a 1-tuple; with
    ``pairs`` (the dtype whose pairs ``ref``'s uint32 hold) the (low, high) float32 halves of a pair gather
    (``narrow``: :func:`lanes`, a no-op for the uint32 pairs)."""
    if pairs is None:
        if idx.ndim == 1:
            return (gather(ref, idx, cols, mask, narrow),)
        return (gather_tiles(ref, idx, cols, mask, other, narrow),)
    ix = (idx[:, None], cols[None, :]) if idx.ndim == 1 else (idx[:, :, None], cols[None, None, :])
    return unpack_pairs(plgpu.load(ref.at[ix], mask=mask, other=pair_bits(other, pairs)), pairs)


def interleave(parts):
    """One part as is; (low, high) halves ``(..., k)`` -> ``(..., 2k)``: ``lo[i]`` at ``2i``, ``hi[i]`` at ``2i+1``."""
    if len(parts) == 1:
        return parts[0]
    lo, hi = parts
    return jnp.stack([lo, hi], axis=-1).reshape(*lo.shape[:-1], 2 * lo.shape[-1])


_KEY_NAN_MAX, _KEY_NAN_MIN = 2**31 - 1, -(2**31)


def order_key(v: jax.Array, is_max: bool) -> jax.Array:
    """float32 -> int32 keys ordered as the floats (``-0.0`` just below ``+0.0``); NaN above every key for a
    max, below every key for a min, so one integer max / min also propagates NaN."""
    b = lax.bitcast_convert_type(v, jnp.int32)
    key = jnp.where(b < 0, b ^ jnp.int32(0x7FFFFFFF), b)
    return jnp.where(jnp.isnan(v), jnp.int32(_KEY_NAN_MAX if is_max else _KEY_NAN_MIN), key)


def from_key(key: jax.Array, is_max: bool) -> jax.Array:
    """The inverse of :func:`order_key` (the NaN key gives NaN)."""
    v = lax.bitcast_convert_type(jnp.where(key < 0, key ^ jnp.int32(0x7FFFFFFF), key), jnp.float32)
    return jnp.where(key == jnp.int32(_KEY_NAN_MAX if is_max else _KEY_NAN_MIN), jnp.nan, v)
