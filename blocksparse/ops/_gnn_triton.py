"""Shared machinery of the GNN Pallas (Triton) kernels.

Rules the kernels follow (jax 0.11.2, Triton lowering): no scalar prefetch and no dynamic grid;
index arrays are whole-array refs read with scalars (``starts_ref[u]``); edge loops are
``lax.fori_loop`` over dynamic bounds; every loaded tile has a power-of-two element count;
gathers index with arrays on *every* axis (``x_ref[idx[:, None], cols[None, :]]``) because
interpret mode cannot mix array indices with ``pl.ds`` slices. No atomics: every output row is
written by one program and heavy nodes' partial rows are combined afterwards with segment ops.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from ..gnn._dynamic import DynamicGraph
from ..gnn._graph import Graph

SUPPORTED_DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)


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


def gather(ref, rows, cols, mask2):
    """``ref[rows[:, None], cols[None, :]]`` with masked-out rows read as 0, in float32."""
    return plgpu.load(ref.at[rows[:, None], cols[None, :]], mask=mask2, other=0).astype(jnp.float32)


def num_chunks(start, end, be: int):
    return (end - start + (be - 1)) // be


def params(num_warps: int):
    return plgpu.CompilerParams(num_warps=num_warps, num_stages=2)


def heavy_arrays(g: Graph | DynamicGraph):
    """(heavy nodes, extra unit -> heavy slot, number of slots); out-of-range entries are unused."""
    s = g.schedule
    return jnp.asarray(s.heavy_nodes), jnp.asarray(s.extra_segment), int(s.heavy_nodes.size)


def fold_sum(g: Graph | DynamicGraph, main: jax.Array, extra: jax.Array | None) -> jax.Array:
    """Add heavy nodes' extra partial rows (float32) into their main rows."""
    if extra is None:
        return main
    heavy, seg, nh = heavy_arrays(g)
    part = jax.ops.segment_sum(extra, seg, nh, indices_are_sorted=True)
    rows = main[heavy].astype(jnp.float32) + part
    return main.at[heavy].set(rows.astype(main.dtype), unique_indices=True, indices_are_sorted=True, mode="drop")


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


def gather_tiles(ref, ids, cols, mask3, other):
    """``ref[ids[:, :, None], cols[None, None, :]]``: a ``(units, be, bf)`` gather (float32; ``other`` where masked)."""
    rows = plgpu.load(ref.at[ids[:, :, None], cols[None, None, :]], mask=mask3, other=other)
    return rows.astype(jnp.float32)


def store_rows(ref, units, cols, value, mask2) -> None:
    """``ref[units[:, None], cols[None, :]] = value`` where ``mask2`` (rows of whole-array outputs, no blocking)."""
    plgpu.store(ref.at[units[:, None], cols[None, :]], value.astype(ref.dtype), mask=mask2)
