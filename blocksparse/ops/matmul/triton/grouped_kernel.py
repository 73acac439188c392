"""The grouped kernel: static ``W @ x`` and ``x @ W`` with small blocks, run on the grouped plan of
:mod:`..grouped` (a unit of block rows sharing block columns fills one tensor-core tile).

The work-list kernels of :mod:`.kernels` multiply one ``b x b`` block at a time: each block reads its own
``b x tn`` slab of ``x``, and a dot whose tall side is a 16- or 32-row block leaves the tensor cores' M (64 or
128 rows) mostly empty. Here program ``(u, j)`` owns *unit* ``u`` of the plan (:func:`~..grouped.group`: ``g``
block rows of ``W``, ``g b`` = 64 or 128 rows) and column tile ``j`` of ``x`` (``tn`` columns). The unit's *slabs*
``s`` (``unit_start[u] <= s < unit_start[u + 1]``, one per distinct block column ``step_col[s]`` of its rows) are
taken ``k`` at a time, ``k`` the *slabs per step* (a power of two: the call's ``slabs``, else
``TritonConfig(grouped_slabs=)``, else :func:`slabs_per_step`'s ``64 // bw``: 4 at b = 16, 2 at 32, 1 from 64); a
``lax.fori_loop`` of ``ceil(len / k)`` steps with dynamic bounds, the index arrays whole-array refs. A step from
slab ``s0``

- loads ``x``'s ``k`` slabs at those columns as **one** ``k bw x tn`` operand by a single gather load (row ``c``
  is row ``c % bw`` of ``x``'s block row ``step_col[s0 + c // bw]``);
- loads the unit's ``g`` blocks of each of those columns as **one** ``g b x k bw`` operand by a single masked
  gather load: row ``r``, column ``c`` is row ``r % b``, column ``c % bw`` of block ``step_ids[s0 + c // bw,
  r // b]`` of ``W.data`` (a 4-D ``(g, b, k, bw)`` load reshaped), and a slot whose row lacks the column (id
  ``-1``) is masked to zero (never read);
- issues **one** dot ``(g b x k bw) @ (k bw x tn)`` into a ``g b x tn`` float32 accumulator: a 64- or 128-row
  tensor-core tile built from 16- or 32-row blocks, contracted over ``k bw`` (64 by default).

A unit's slab count is rarely a multiple of ``k``: the *tail* runs in the same loop, its last step's slabs past
the unit's end (``s0 + c // bw >= unit_start[u + 1]``) masked to zero in both operands, their indices clamped to
the unit's last slab so that nothing past the unit is read (at most ``k - 1`` slabs of zeros per unit and tile).
At ``k = 1`` the step is the single-slab body as measured below (``x``'s slab a plain tile load, no tail).

Then it splits the accumulator into its ``g`` slots (``b x tn`` each) and slot ``i`` writes output block row
``unit_rows[u, i]`` (a ``-1`` pad slot writes nothing) with the fused epilogue (:func:`~.common._finish`: bias
along either axis, the activation) and the cast. The units partition the output block rows, so every output row
is written exactly once: a row of ``W`` without blocks, or a unit without slabs, writes zeros (plus the bias).
No partials, no atomics, one launch: deterministic.

``x @ W`` (:func:`dds`) is the mirror on the transposed pattern (the plan's ``op="dds"``): program ``(u, j)`` owns
``g`` block *columns* of ``W`` and row tile ``j`` of ``x`` (``tb`` rows); per step of ``k`` slabs (block rows
``c`` of ``W``, ``k = 64 // bh`` by default) it loads ``x``'s columns of those block rows side by side as one
``tb x k bh`` operand (a ``(tb, k, bh)`` load reshaped) and the unit's blocks of those block rows as one
``k bh x g bw`` operand (row ``q``, column ``c`` is row ``q % bh``, column ``c % bw`` of block
``step_ids[s0 + q // bh, c // bw]``, a ``(k, bh, g, bw)`` load read in place from ``W.data``: no transposed copy),
one dot into ``tb x g bw``, the tail masked alike, and slot ``i`` writes output block column ``unit_rows[u, i]``.

The plan groups rows where it moves fewer modelled bytes (:attr:`~..grouped.GroupedPlan.group` ``> 1``). Where it
does not (blocks of 128, or rows that share no columns), :func:`takes` declines and the dispatch keeps the
work-list kernel, which splits long rows and, at ``b = 32``, accumulates transposed; called directly, :func:`dsd`
and :func:`dds` run whatever plan they get, ``g = 1`` included (a unit per block row, one ``b``-row dot per
step). An empty pattern (no block at all) is the epilogue of a zero product, in XLA, as in :mod:`.kernels`.

Measured at one slab per step (H200, bf16, ``W`` 8192 x 8192 @ ``x`` 8192 x 4096, uniform and power-law
patterns, ``benchmarks/results/grouped_gpu_check_h200.json``, before ``k`` existed): right (relative error 1.7e-3
against the float32 product, as dense bf16) but **2-3x slower than the default work-list kernel**. ``W @ x``,
uniform: b = 16, d = 1/4 (``g`` = 8) 2.40 ms against 1.01 (dense ``jnp.dot`` 0.69); b = 32, d = 1/4 (``g`` = 4)
1.18 against 0.57; d = 1/16: 0.89 against 0.29 (b = 16), 0.40 against 0.17 (b = 32); ``x @ W`` alike (0.35-0.56x
the default's speed). At b = 16, d = 1/4 it runs 27,565 slabs x 32 column tiles of 128 x 128 x 16 dots,
4.6e11 tensor-core flops in 2.4 ms (193 TFLOP/s issued, 57 useful at a fill of 0.30), and moves about 7 GB
through L2 (3 TB/s, well below L2's bandwidth): neither is the limit. Each loop step is one ``K = b`` = 16 (or 32)
dot behind a dependent chain (index loads, then the gather, then the dot), and that per-step fixed cost
dominates; the work-list kernel multiplies several blocks per step. Hence ``k`` slabs per step: the same bytes and
flops in ``k`` times fewer steps, each a ``K = k b`` dot behind one chain. Measured too
(``grouped_gpu_check_slabs_h200.json``): faster for ``x @ W`` at b = 16, slower for ``W @ x`` at b = 32, and no
variant reached the work list (0.36-0.74x its speed). Next, ``packed`` (``TritonConfig(grouped_packed=True)``):
``W`` read from :func:`_pack`'s copy, each slab's stacked operand laid side by side by one XLA gather per call, so a
step's operand is one contiguous tile (masked past the unit's end) instead of a gather of ``g k`` scattered blocks:
faster than the gathered form, most for ``x @ W`` at b = 16 (``grouped_gpu_check_packed_h200.json``). Packed,
every ``k`` (1 included) takes the general step: ``x``'s slabs a masked gather there too,
where the gathered form at ``k = 1`` loads one plain tile (so ``packed`` at ``k = 1`` against ``k1`` changes both).

Selection: ``TritonConfig(grouped=True)`` asks for this kernel for static products (:func:`takes`); the stream
kernel keeps priority where it runs (few tokens). ``grouped=False`` never runs it. Without a config the Triton
backend runs it, with :data:`CLAIMED` (packed), where the measured rule :func:`claims` the product: small blocks
whose plan fills its dots at least as much as where it beat the default on the H200 (``GROUPED_MIN_FILL``).
Elsewhere the work list measured faster.
The plan is :func:`~..grouped.group` with :func:`options`'s options (the op, the
dense operand's size, the tile, the dtypes), cached per pattern and options; it does not depend on ``k``.

Tiles: ``tn`` (``dsd``) and ``tb`` (``dds``) from the config, else 128 (powers of two >= 16, ``n`` padded to a
multiple); ``num_warps`` 8 for accumulators of at least 128 x 128, else 4; ``num_stages`` 3. The kernel's name
records ``g``, ``k``, the tile and the packed operand: ``bs_dsd_grouped_16x16_g8_s4_tn128``,
``bs_dds_grouped_32x32_g4_s2_tb128_packed``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from ...._pattern import BlockPattern
from .. import epilogue as _epilogue
from ..grouped import GroupedPlan, Grouping, group
from ..schedule import kernel_constant
from .common import (
    TritonConfig,
    _bias_operand,
    _dot,
    _finish,
    _interpret,
    _pad_to,
    _pallas_call,
    _params,
    _split_refs,
    _tile,
)

__all__ = [
    "CLAIMED",
    "DEFAULT_TILE",
    "STEP_DEPTH",
    "claims",
    "dds",
    "dsd",
    "options",
    "plan",
    "slabs_per_step",
    "takes",
]

#: The dense operand's tile (``tn`` for ``dsd``, ``tb`` for ``dds``) where the config sets none.
DEFAULT_TILE = 128
#: The contracted side of a loop step's dot where neither the call nor the config sets the slabs per step:
#: ``STEP_DEPTH // b`` slabs of a block side ``b`` (4 at 16, 2 at 32, 1 from 64).
STEP_DEPTH = 64


def _tile_of(op: str, n: int, config: TritonConfig | None) -> int:
    """The dense operand's tile: the config's ``tn`` (``dsd``) or ``tb`` (``dds``), else :data:`DEFAULT_TILE`, no
    wider than ``n`` needs (a power of two >= 16)."""
    cfg = config or TritonConfig()
    name = "tn" if op == "dsd" else "tb"
    forced = getattr(cfg, name)
    if forced is not None and (forced < 16 or forced & (forced - 1)):
        raise ValueError(f"Expected TritonConfig.{name} a power of two >= 16 for the grouped kernel. Got {forced}.")
    return _tile(max(n, 1), forced or DEFAULT_TILE)


def _checked_slabs(slabs, where: str) -> int:
    if isinstance(slabs, bool) or not isinstance(slabs, int) or slabs < 1 or slabs & (slabs - 1):
        raise ValueError(f"Expected {where} a power of two >= 1 (slabs per loop step). Got {slabs!r}.")
    return slabs


def slabs_per_step(op: str, block_size: tuple[int, int], config: TritonConfig | None = None,
                   slabs: int | None = None) -> int:  # fmt: skip
    """Slabs per loop step ``k`` of the grouped kernel for ``op`` on blocks ``block_size``: ``slabs`` if given,
    else the config's ``grouped_slabs``, else ``max(1, STEP_DEPTH // side)`` of the contracted block side (``bw``
    for ``dsd``, ``bh`` for ``dds``): a 64-deep dot per step at b = 16 and 32."""
    if op not in ("dsd", "dds"):
        raise ValueError(f"Expected op 'dsd' or 'dds'. Got {op!r}.")
    if slabs is not None:
        return _checked_slabs(slabs, "slabs")
    forced = (config or TritonConfig()).grouped_slabs
    if forced is not None:
        return _checked_slabs(forced, "TritonConfig.grouped_slabs")
    side = block_size[1] if op == "dsd" else block_size[0]
    return max(1, STEP_DEPTH // side)


def options(op: str, n: int, config: TritonConfig | None = None, dtype=jnp.bfloat16, out_dtype=None) -> Grouping:
    """The plan's options for ``op`` (``"dsd"``: ``W @ x``, ``"dds"``: ``x @ W``) with a dense operand of ``n``
    columns (``dsd``) or rows (``dds``), its tile from ``config``, operands of ``dtype`` and an output of
    ``out_dtype`` (default: ``dtype``)."""
    out_dtype = dtype if out_dtype is None else out_dtype
    return Grouping(op=op, n=max(int(n), 1), tn=_tile_of(op, n, config), itemsize=jnp.dtype(dtype).itemsize,
                    out_itemsize=jnp.dtype(out_dtype).itemsize)  # fmt: skip


def plan(op: str, pattern: BlockPattern, n: int, config: TritonConfig | None = None, dtype=jnp.bfloat16,
         out_dtype=None) -> GroupedPlan:  # fmt: skip
    """The grouped plan the kernel runs for ``op`` on ``pattern`` (:func:`~..grouped.group` with :func:`options`'s
    options; cached)."""
    return group(pattern, options(op, n, config, dtype, out_dtype))


#: The config the Triton backend's default runs this kernel with where it :func:`claims` a product: the packed
#: operand, the default slabs per step and tile (the form measured faster than the default).
CLAIMED = TritonConfig(grouped=True, grouped_packed=True)


def claims(op: str, n: int, pattern: BlockPattern, dtype=jnp.bfloat16, out_dtype=None) -> bool:
    """Whether the default (no config) runs ``op`` on this kernel with :data:`CLAIMED`: on a GPU whose tuned table
    (:mod:`..tuned`) names ``(op, b)`` in ``GROUPED_MIN_FILL`` for the pattern's square blocks of ``b``, with a dense
    operand of at least ``GROUPED_PREFER_MIN`` columns (``dsd``) or rows (``dds``) in bfloat16, where the plan
    groups rows (``group > 1``) and fills at least that share of its dots: patterns whose rows share their columns.
    A GPU nobody measured has no cell: never."""
    from .... import hardware
    from .. import tuned

    t = tuned.current()
    bh, bw = pattern.block_size
    need = t.GROUPED_MIN_FILL.get((op, bh)) if bh == bw else None
    if need is None or n < t.GROUPED_PREFER_MIN or pattern.nnz_blocks == 0 or not hardware.current().is_gpu:
        return False
    if jnp.dtype(dtype) != jnp.dtype(jnp.bfloat16):  # the dtype measured
        return False
    p = plan(op, pattern, n, CLAIMED, dtype, out_dtype)
    return p.group > 1 and p.fill >= need


def takes(op: str, n: int, pattern: BlockPattern, config: TritonConfig | None, dtype=jnp.bfloat16,
          out_dtype=None) -> bool:  # fmt: skip
    """Whether ``op`` with a dense operand of ``n`` columns (``dsd``) or rows (``dds``) runs this kernel as the config
    asks: only where ``config.grouped`` is true, the product is not empty, and the plan groups (``group > 1``; else
    the work-list kernel runs). Without a config: :func:`claims`."""
    if config is None or not config.grouped or n == 0 or pattern.nnz_blocks == 0:
        return False
    return plan(op, pattern, n, config, dtype, out_dtype).group > 1


# --------------------------------------------------------------------------------------------
# dsd: y (m, n) = W (m, k) @ x (k, n)
# --------------------------------------------------------------------------------------------
def _dsd_kernel(start_ref, col_ref, id_ref, dest_ref, w_ref, x_ref, *refs, b, bw, g, tn, slabs, exact, epi,
                packed=False):  # fmt: skip
    """Program ``(u, j)``: unit ``u``'s ``g`` block rows, columns ``[j tn, (j + 1) tn)``, ``slabs`` slabs per loop
    step (the module docstring); ``packed``: ``w_ref`` is :func:`_pack`'s whole ``(g b, (S + slabs) bw)`` array, a
    step's operand its columns ``[s0 bw, (s0 + slabs) bw)``."""
    from jax.experimental.pallas import triton as plgpu

    bias_ref, (y_ref,) = _split_refs(refs, epi)
    u = pl.program_id(0)
    n0 = pl.multiple_of(pl.program_id(1) * tn, tn)
    h = g * b  # the stacked operand's rows: one tensor-core tile
    start, end = start_ref[u], start_ref[u + 1]

    if slabs == 1 and not packed:  # one slab per step (the form measured on the H200)
        slot = lax.broadcasted_iota(jnp.int32, (h,), 0) // b  # the slot of each stacked row
        within = lax.broadcasted_iota(jnp.int32, (h, bw), 0) % b  # its row inside the slot's block
        col = lax.broadcasted_iota(jnp.int32, (h, bw), 1)

        def body(s, acc):
            ids = id_ref[s * g + slot]  # (h,): the block of each stacked row's slot, -1 where its row lacks the column
            ids = jnp.broadcast_to(ids[:, None], (h, bw))
            live = ids >= 0
            w = plgpu.load(w_ref.at[jnp.maximum(ids, 0) * b + within, col], mask=live, other=0)  # (h, bw) gathered
            c = col_ref[s]
            xs = x_ref[pl.ds(pl.multiple_of(c * bw, bw), bw), pl.ds(n0, tn)]  # (bw, tn): the slab, loaded once
            return acc + _dot(w, xs, exact=exact)  # (h, tn)

        acc = lax.fori_loop(start, end, body, jnp.zeros((h, tn), jnp.float32))
    else:  # `slabs` consecutive slabs per step, the last step's slabs past the unit's end masked to zero
        wide = slabs * bw  # the contracted side of the step's dot
        shape4 = (g, b, slabs, bw)  # the stacked operand as (slot, row in block, slab, column in block)
        slot4 = lax.broadcasted_iota(jnp.int32, (g, slabs), 0)
        rows4 = lax.broadcasted_iota(jnp.int32, shape4, 1)
        cols4 = lax.broadcasted_iota(jnp.int32, shape4, 3)
        step_x = lax.broadcasted_iota(jnp.int32, (wide,), 0) // bw  # the slab of each row of the x operand
        row_x = lax.broadcasted_iota(jnp.int32, (wide, tn), 0) % bw
        col_x = n0 + lax.broadcasted_iota(jnp.int32, (wide, tn), 1)

        slab_w = lax.broadcasted_iota(jnp.int32, (h, wide), 1) // bw  # packed: the slab of each operand column

        def body(i, acc):
            s0 = start + i * slabs
            if packed:  # one contiguous tile; the slabs past the unit's end (the next unit's, or padding) masked
                cols = pl.ds(pl.multiple_of(s0 * bw, bw), wide)
                w = plgpu.load(w_ref.at[:, cols], mask=s0 + slab_w < end, other=0)  # (h, wide)
            else:
                step = s0 + lax.broadcasted_iota(jnp.int32, (g, slabs), 1)  # (g, slabs): each slot's slab
                ids = id_ref[jnp.minimum(step, end - 1) * g + slot4]  # clamped: never read past the unit
                live = (ids >= 0) & (step < end)
                ids = jnp.broadcast_to(jnp.maximum(ids, 0)[:, None, :, None], shape4)
                live = jnp.broadcast_to(live[:, None, :, None], shape4)
                w = plgpu.load(w_ref.at[ids * b + rows4, cols4], mask=live, other=0)  # (g, b, slabs, bw) gathered
                # row r, column c: row r % b, column c % bw of block step_ids[s0 + c // bw, r // b]
                w = w.reshape(h, wide)
            sx = s0 + step_x
            cx = col_ref[jnp.minimum(sx, end - 1)]  # (wide,): the block row of x each operand row comes from
            rows = jnp.broadcast_to((cx * bw)[:, None], (wide, tn)) + row_x
            inside = jnp.broadcast_to((sx < end)[:, None], (wide, tn))
            xs = plgpu.load(x_ref.at[rows, col_x], mask=inside, other=0)  # (wide, tn): the steps' slabs stacked
            return acc + _dot(w, xs, exact=exact)  # (h, tn)

        steps = (end - start + slabs - 1) // slabs
        acc = lax.fori_loop(0, steps, body, jnp.zeros((h, tn), jnp.float32))
    for i, part in enumerate(jnp.split(acc, g, axis=0) if g > 1 else [acc]):  # slot i: (b, tn)
        dest = dest_ref[u * g + i]

        @pl.when(dest >= 0)
        def _(part=part, dest=dest):
            out = _finish(part, epi, bias_ref, dest * b, n0, (b, tn))
            y_ref[pl.ds(pl.multiple_of(dest * b, b), b), pl.ds(n0, tn)] = out.astype(y_ref.dtype)


# --------------------------------------------------------------------------------------------
# dds: y (B, k) = x (B, m) @ W (m, k)
# --------------------------------------------------------------------------------------------
def _dds_kernel(start_ref, col_ref, id_ref, dest_ref, w_ref, x_ref, *refs, bh, bw, g, tb, slabs, exact, epi,
                packed=False):  # fmt: skip
    """Program ``(u, j)``: unit ``u``'s ``g`` block columns of ``W``, rows ``[j tb, (j + 1) tb)`` of ``x``,
    ``slabs`` slabs per loop step; ``packed``: ``w_ref`` is :func:`_pack`'s whole ``((S + slabs) bh, g bw)`` array,
    a step's operand its rows ``[s0 bh, (s0 + slabs) bh)``."""
    from jax.experimental.pallas import triton as plgpu

    bias_ref, (y_ref,) = _split_refs(refs, epi)
    u = pl.program_id(0)
    b0 = pl.multiple_of(pl.program_id(1) * tb, tb)
    wide = g * bw  # the stacked operand's columns: one tensor-core tile
    start, end = start_ref[u], start_ref[u + 1]

    if slabs == 1 and not packed:  # one slab per step (the form measured on the H200)
        slot = lax.broadcasted_iota(jnp.int32, (wide,), 0) // bw
        row = lax.broadcasted_iota(jnp.int32, (bh, wide), 0)
        within = lax.broadcasted_iota(jnp.int32, (bh, wide), 1) % bw  # its column inside the slot's block

        def body(s, acc):
            ids = id_ref[s * g + slot]  # (wide,): the block (into W.data) of each stacked column's slot, or -1
            ids = jnp.broadcast_to(ids[None, :], (bh, wide))
            live = ids >= 0
            w = plgpu.load(w_ref.at[jnp.maximum(ids, 0) * bh + row, within], mask=live, other=0)  # (bh, wide)
            c = col_ref[s]  # a block row of W: a block column of x
            xs = x_ref[pl.ds(b0, tb), pl.ds(pl.multiple_of(c * bh, bh), bh)]  # (tb, bh): the slab, loaded once
            return acc + _dot(xs, w, exact=exact)  # (tb, wide)

        acc = lax.fori_loop(start, end, body, jnp.zeros((tb, wide), jnp.float32))
    else:  # `slabs` consecutive slabs per step, the last step's slabs past the unit's end masked to zero
        tall = slabs * bh  # the contracted side of the step's dot
        shape4 = (slabs, bh, g, bw)  # the stacked operand as (slab, row in block, slot, column in block)
        slot4 = lax.broadcasted_iota(jnp.int32, (slabs, g), 1)
        rows4 = lax.broadcasted_iota(jnp.int32, shape4, 1)
        cols4 = lax.broadcasted_iota(jnp.int32, shape4, 3)
        slab_w = lax.broadcasted_iota(jnp.int32, (tall, wide), 0) // bh  # packed: the slab of each operand row
        shape3 = (tb, slabs, bh)  # the x operand as (row, slab, column in block)
        rows3 = b0 + lax.broadcasted_iota(jnp.int32, shape3, 0)
        cols3 = lax.broadcasted_iota(jnp.int32, shape3, 2)

        def body(i, acc):
            s0 = start + i * slabs
            step = s0 + lax.broadcasted_iota(jnp.int32, (slabs,), 0)  # the step's slabs
            inside = step < end
            last = jnp.minimum(step, end - 1)  # clamped: never read past the unit
            cx = col_ref[last]  # (slabs,): block rows of W, block columns of x
            xcols = jnp.broadcast_to((cx * bh)[None, :, None], shape3) + cols3
            xmask = jnp.broadcast_to(inside[None, :, None], shape3)
            xs = plgpu.load(x_ref.at[rows3, xcols], mask=xmask, other=0).reshape(tb, tall)  # the slabs side by side
            if packed:  # one contiguous tile; the slabs past the unit's end (the next unit's, or padding) masked
                rows = pl.ds(pl.multiple_of(s0 * bh, bh), tall)
                w = plgpu.load(w_ref.at[rows, :], mask=s0 + slab_w < end, other=0)  # (tall, wide)
            else:
                ids = id_ref[last[:, None] * g + slot4]  # (slabs, g)
                live = jnp.broadcast_to(((ids >= 0) & inside[:, None])[:, None, :, None], shape4)
                ids = jnp.broadcast_to(jnp.maximum(ids, 0)[:, None, :, None], shape4)
                w = plgpu.load(w_ref.at[ids * bh + rows4, cols4], mask=live, other=0)  # (slabs, bh, g, bw) gathered
                # row q, column c: row q % bh, column c % bw of step_ids[s0 + q // bh, c // bw]
                w = w.reshape(tall, wide)
            return acc + _dot(xs, w, exact=exact)  # (tb, wide)

        steps = (end - start + slabs - 1) // slabs
        acc = lax.fori_loop(0, steps, body, jnp.zeros((tb, wide), jnp.float32))
    for i, part in enumerate(jnp.split(acc, g, axis=1) if g > 1 else [acc]):  # slot i: (tb, bw)
        dest = dest_ref[u * g + i]

        @pl.when(dest >= 0)
        def _(part=part, dest=dest):
            out = _finish(part, epi, bias_ref, b0, dest * bw, (tb, bw))
            y_ref[pl.ds(b0, tb), pl.ds(pl.multiple_of(dest * bw, bw), bw)] = out.astype(y_ref.dtype)


# --------------------------------------------------------------------------------------------
# The calls
# --------------------------------------------------------------------------------------------
def _checked(op: str, pattern: BlockPattern, data, x, epi, grouping: Grouping | None) -> None:
    """``ValueError`` for operands this kernel cannot take, naming what it expected."""
    if not isinstance(pattern, BlockPattern):
        raise TypeError(f"Expected a BlockPattern. Got {type(pattern).__name__}.")
    m, k = pattern.shape
    want = (pattern.nnz_blocks, *pattern.block_size)
    if tuple(data.shape) != want:
        raise ValueError(f"Expected data of shape {want} (the pattern's blocks). Got {tuple(data.shape)}.")
    if x.ndim != 2:
        raise ValueError(f"Expected a 2-D dense operand. Got x of shape {tuple(x.shape)}.")
    got, need = (x.shape[0], k) if op == "dsd" else (x.shape[1], m)
    if got != need:
        raise ValueError(f"Expected x's contracted dimension {need} (W is {pattern.shape}). Got {got} "
                         f"(x {tuple(x.shape)}).")  # fmt: skip
    if epi is not None and epi.glu:
        raise ValueError("Expected an epilogue without a gate (glu) for the grouped kernel. Got glu=True.")
    if grouping is not None:
        if not isinstance(grouping, Grouping):
            raise TypeError(f"Expected grouping as a Grouping. Got {type(grouping).__name__}.")
        if grouping.op != op:
            raise ValueError(f"Expected a Grouping of op {op!r} for {op}. Got op {grouping.op!r}.")


def _pack(op: str, p: GroupedPlan, data, slabs: int) -> jax.Array:
    """``W``'s blocks as the grouped kernel's operands, slab after slab (one XLA gather; zeros where a slot's row
    lacks the slab's column): ``dsd`` ``(g bh, (S + slabs) bw)``, slab ``s`` in columns ``[s bw, (s + 1) bw)``;
    ``dds`` ``((S + slabs) bh, g bw)``, slab ``s`` in rows ``[s bh, (s + 1) bh)``; ``slabs`` slabs of zeros past
    the end, so a loop step's tile never leaves the array."""
    ids = jnp.asarray(p.step_ids, jnp.int32)  # (S, g)
    num, g = ids.shape
    bh, bw = data.shape[1:]
    blocks = jnp.where((ids >= 0)[:, :, None, None], data[jnp.maximum(ids, 0)], 0)  # (S, g, bh, bw)
    blocks = jnp.pad(blocks, ((0, slabs), (0, 0), (0, 0), (0, 0)))
    if op == "dsd":  # row slot * bh + r, column s * bw + c
        return blocks.transpose(1, 2, 0, 3).reshape(g * bh, (num + slabs) * bw)
    return blocks.transpose(0, 2, 1, 3).reshape((num + slabs) * bh, g * bw)  # row s * bh + r, column slot * bw + c


def _launch(kernel, p: GroupedPlan, grid, out_shape, out_dtype, data, x, bias, num_warps, num_stages, name):
    """One program per (unit, tile of the dense operand); the plan's arrays as whole-array int32 operands; ``data``
    is ``W.data`` (``(nnz, bh, bw)``, read as rows) or :func:`_pack`'s 2-D operand."""
    return _pallas_call(
        kernel,
        grid=grid,
        out_shape=jax.ShapeDtypeStruct(out_shape, out_dtype),
        compiler_params=_params(num_warps, num_stages),
        interpret=_interpret(),
        name=name,
    )(
        kernel_constant(p.unit_start),
        kernel_constant(p.step_col),
        kernel_constant(p.step_ids.reshape(-1)),
        kernel_constant(p.unit_rows.reshape(-1)),
        data if data.ndim == 2 else data.reshape(-1, data.shape[-1]),
        x,
        *bias,
    )


def dsd(pattern: BlockPattern, data, x, out_dtype, *, exact: bool = False, config: TritonConfig | None = None,
        epi=None, bias=None, grouping: Grouping | None = None, slabs: int | None = None,
        packed: bool | None = None):  # fmt: skip
    """``W @ x`` with the grouped kernel; ``data`` and ``x`` already of one supported dtype.

    ``epi``: an optional :class:`~..epilogue.Epilogue` (not gated) applied in the store, ``bias`` its array (along
    the output's columns, ``bias_axis=1``, or rows, ``0``). ``grouping``: the plan's options (op ``"dsd"``; default
    :func:`options`'s), to force its methods or tile heights. ``slabs``: slabs per loop step (a power of two;
    default :func:`slabs_per_step`'s). ``packed``: read ``W`` from :func:`_pack`'s copy (default: the config's
    ``grouped_packed``).
    """
    _checked("dsd", pattern, data, x, epi, grouping)
    cfg = config or TritonConfig()
    steps = slabs_per_step("dsd", pattern.block_size, cfg, slabs)
    bh, bw = pattern.block_size
    m, _ = pattern.shape
    n = x.shape[1]
    if n == 0:
        return jnp.zeros((m, 0), out_dtype)
    if pattern.nnz_blocks == 0:
        return _epilogue.reference(jnp.zeros((m, n), jnp.float32), bias, epi, out_dtype)
    tn = _tile_of("dsd", n, cfg)
    p = group(pattern, grouping or options("dsd", n, cfg, x.dtype, out_dtype))
    g = p.group
    xp = _pad_to(x, 1, tn)
    nw = cfg.num_warps or (8 if g * bh * tn >= 128 * 128 else 4)
    ns = cfg.num_stages or 3
    packed = bool(cfg.grouped_packed if packed is None else packed)
    kernel = functools.partial(_dsd_kernel, b=bh, bw=bw, g=g, tn=tn, slabs=steps, exact=exact, epi=epi,
                               packed=packed)  # fmt: skip
    b1 = _bias_operand(bias, epi, xp.shape[1] if epi is not None and epi.bias_axis == 1 else m)
    name = f"bs_dsd_grouped_{bh}x{bw}_g{g}_s{steps}_tn{tn}" + ("_packed" if packed else "")
    name += "_epi" if epi is not None else ""
    w = _pack("dsd", p, data, steps) if packed else data
    y = _launch(kernel, p, (p.num_units, xp.shape[1] // tn), (m, xp.shape[1]), out_dtype, w, xp, b1, nw, ns, name)
    return y[:, :n] if xp.shape[1] != n else y


def dds(x, pattern: BlockPattern, data, out_dtype, *, exact: bool = False, config: TritonConfig | None = None,
        epi=None, bias=None, grouping: Grouping | None = None, slabs: int | None = None,
        packed: bool | None = None):  # fmt: skip
    """``x @ W`` with the grouped kernel (units of ``W``'s block columns; its blocks read in place).

    ``epi``: an optional :class:`~..epilogue.Epilogue` (not gated; bias along the output's columns) applied in the
    store. ``grouping``: the plan's options (op ``"dds"``; default :func:`options`'s). ``slabs``: slabs per loop
    step (a power of two; default :func:`slabs_per_step`'s). ``packed``: read ``W`` from :func:`_pack`'s copy
    (default: the config's ``grouped_packed``).
    """
    _checked("dds", pattern, data, x, epi, grouping)
    cfg = config or TritonConfig()
    steps = slabs_per_step("dds", pattern.block_size, cfg, slabs)
    bh, bw = pattern.block_size
    _, k = pattern.shape
    rows = x.shape[0]
    if rows == 0:
        return jnp.zeros((0, k), out_dtype)
    if pattern.nnz_blocks == 0:
        return _epilogue.reference(jnp.zeros((rows, k), jnp.float32), bias, epi, out_dtype)
    tb = _tile_of("dds", rows, cfg)
    p = group(pattern, grouping or options("dds", rows, cfg, x.dtype, out_dtype))
    g = p.group
    xp = _pad_to(x, 0, tb)
    nw = cfg.num_warps or (8 if g * bw * tb >= 128 * 128 else 4)
    ns = cfg.num_stages or 3
    packed = bool(cfg.grouped_packed if packed is None else packed)
    kernel = functools.partial(_dds_kernel, bh=bh, bw=bw, g=g, tb=tb, slabs=steps, exact=exact, epi=epi,
                               packed=packed)  # fmt: skip
    b1 = _bias_operand(bias, epi, k)
    name = f"bs_dds_grouped_{bh}x{bw}_g{g}_s{steps}_tb{tb}" + ("_packed" if packed else "")
    name += "_epi" if epi is not None else ""
    w = _pack("dds", p, data, steps) if packed else data
    y = _launch(kernel, p, (p.num_units, xp.shape[0] // tb), (xp.shape[0], k), out_dtype, w, xp, b1, nw, ns, name)
    return y[:rows] if xp.shape[0] != rows else y
