"""Pallas (Triton lowering) kernels for static block-sparse products: ``dsd``, ``dds``, ``sdd``.

All three walk a fixed-shape work list (:mod:`..schedule`: built by :func:`~..schedule.lower` on
the host or by :func:`~..schedule.redistribute` inside ``jit``), passed as whole-array ``int32``
refs: the Triton backend has no scalar prefetch and no dynamic grid, so each program reads its
own scalars (``start_ref[u]``) and loops with ``lax.fori_loop`` over a dynamic trip count.

- ``dsd`` (``W @ x``): program ``(u, t)`` owns unit ``u`` (<= ``max_len`` blocks of one block row
  of W) and columns ``[t * tn, (t + 1) * tn)`` of ``x``. Per block it loads the ``bh x bw`` block
  and the ``bw x tn`` slab of ``x`` at the block's column, and accumulates in float32.
  For ``bh == 32`` it computes ``x_slab^T @ w^T`` (``tn x bh``) instead, so that the
  tensor-core M dimension is ``tn`` rather than a short block: for the blocks of :data:`~..tuned`
  ``TRITON_TRANSPOSE_ACC_BLOCKS`` (``TritonConfig.transpose_acc`` overrides).
- ``dds`` (``x @ W``): program ``(u, t)`` owns unit ``u`` of the *transposed* pattern (a block
  column of W) and rows ``[t * tb, (t + 1) * tb)`` of ``x``; blocks are read in place through
  ``block_id`` (no transposed copy of the values).
- ``sdd``: program ``i`` computes block ``i``: ``a[rows of r] @ b[:, cols of c]``, a loop over the
  shared dimension in chunks of ``tk``.

Rows split by the schedule write float32 partials; a small combine kernel (one program per split
row and tile, output aliased in place) sums them into the split rows only. No atomics, so results are deterministic.

Supported: block sides in {16, 32, 64, 128} (tensor-core dots need >= 16 and Triton tiles need
powers of two); dtypes float16, bfloat16 (float32 accumulation) and float32 (TF32 tensor-core
dots, like XLA's default on GPU; ``precision=HIGHEST`` gives exact float32 dots). Smaller blocks
(1, 4, 8) raise ``NotImplementedError`` and dispatch falls back to XLA; see docs/kernels.md.

Tile sizes and launch parameters come from a :class:`~.common.TritonConfig` (``bs.matmul(..., config=)``, part
of the ``jit`` cache key through the op's static argument), chosen per problem where unset.

On a machine without a GPU the backend reports itself unavailable, unless interpret mode is on
(``BLOCKSPARSE_PALLAS_INTERPRET=1`` or ``blocksparse.interpret()``, shared by every op), in which
case the kernels run in Pallas' interpreter: that is how CI checks their logic on the CPU.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from .... import hardware
from ...._pattern import BlockPattern
from ...._util import cdiv, next_power_of_2
from .. import epilogue as _epilogue
from .. import tuned
from ..reference import poison
from ..schedule import GpuLowering, contraction_splits, kernel_constant, lower, redistribute
from .common import (
    TritonConfig,
    _bias_operand,
    _dot,
    _finish,
    _interpret,
    _masked_load,
    _pad_to,
    _pallas_call,
    _params,
    _split_refs,
    _tile,
    default_tn,
    transpose_acc,
)

__all__ = [
    "dds",
    "dsd",
    "dsd_dynamic",
    "run_schedule",
    "sdd",
    "sdd_coords",
    "sdd_splits",
    "tile_for",
]


# --------------------------------------------------------------------------------------------
# dsd: y (m, n) = W (m, k) @ x (k, n)
# --------------------------------------------------------------------------------------------
def _dsd_kernel(start_ref, len_ref, dest_ref, col_ref, id_ref, w_ref, x_ref, *refs, bh, bw, tn, acc_t, exact,
                epi=None):  # fmt: skip
    bias_ref, (y_ref, p_ref) = _split_refs(refs, epi)
    u = pl.program_id(0)
    n0 = pl.multiple_of(pl.program_id(1) * tn, tn)
    start = start_ref[u]
    length = len_ref[u]
    dest = dest_ref[u]

    def body(i, acc):
        j = start + i
        c = col_ref[j]
        d = id_ref[j]
        w = w_ref[pl.ds(pl.multiple_of(d * bh, bh), bh), :]  # (bh, bw)
        xs = x_ref[pl.ds(pl.multiple_of(c * bw, bw), bw), pl.ds(n0, tn)]  # (bw, tn)
        if acc_t:
            return acc + _dot(xs, w, exact=exact, contract=((0,), (1,)))  # (tn, bh)
        return acc + _dot(w, xs, exact=exact)  # (bh, tn)

    shape = (tn, bh) if acc_t else (bh, tn)
    acc = lax.fori_loop(0, length, body, jnp.zeros(shape, jnp.float32))
    if acc_t:
        acc = acc.T

    @pl.when(dest >= 0)
    def _():
        out = _finish(acc, epi, bias_ref, dest * bh, n0, (bh, tn))
        y_ref[pl.ds(pl.multiple_of(dest * bh, bh), bh), pl.ds(n0, tn)] = out.astype(y_ref.dtype)

    @pl.when(dest < 0)
    def _():
        p_ref[pl.ds(pl.multiple_of((-1 - dest) * bh, bh), bh), pl.ds(n0, tn)] = acc


def _combine_kernel(row_ref, off_ref, y_in_ref, p_ref, *refs, block, tile, axis, num_rows, epi=None):
    """Program ``(r, t)``: sum split row ``r``'s partial slots (contiguous) into ``y`` in place.

    Entries of ``split_rows`` >= ``num_rows`` are padding (dynamic schedules) and write nothing.
    With an epilogue, the split rows get it here (the walk kernel applied it to the direct rows).
    """
    del y_in_ref  # aliased with y_ref
    bias_ref, (y_ref,) = _split_refs(refs, epi)
    r = pl.program_id(0)
    t0 = pl.multiple_of(pl.program_id(1) * tile, tile)
    lo = off_ref[r]
    hi = off_ref[r + 1]
    row = jnp.minimum(row_ref[r], num_rows - 1)
    real = row_ref[r] < num_rows

    def body(s, acc):
        o = pl.multiple_of(s * block, block)
        if axis == 0:
            return acc + p_ref[pl.ds(o, block), pl.ds(t0, tile)]
        return acc + p_ref[pl.ds(t0, tile), pl.ds(o, block)]

    shape = (block, tile) if axis == 0 else (tile, block)
    acc = lax.fori_loop(lo, hi, body, jnp.zeros(shape, jnp.float32))
    r0, c0 = (row * block, t0) if axis == 0 else (t0, row * block)
    acc = _finish(acc, epi, bias_ref, r0, c0, shape)
    dst = pl.ds(pl.multiple_of(row * block, block), block)

    @pl.when(real)
    def _():
        if axis == 0:
            y_ref[dst, pl.ds(t0, tile)] = acc.astype(y_ref.dtype)
        else:
            y_ref[pl.ds(t0, tile), dst] = acc.astype(y_ref.dtype)


def _combine_rows(y, p, sched, block: int, tile: int, axis: int, num_warps: int, epi=None, bias=()):
    """Sum the float32 partials of split rows into ``y`` (rows along ``axis``), in place.

    The schedule numbers a split row's partial slots consecutively, so one program per
    (split row, tile) loops over its slots; ``y`` is aliased, so only split rows are touched.
    """
    if sched.num_partials == 0:
        return y
    r = sched.split_rows.shape[0]
    if isinstance(sched.partial_seg, np.ndarray):  # host schedule: offsets on the host
        offsets = np.zeros(r + 1, np.int32)
        np.cumsum(np.bincount(sched.partial_seg, minlength=r), out=offsets[1:])
    else:  # traced schedule (dynamic sparsity); its dummy slot's segment r is not counted
        counts = jnp.bincount(sched.partial_seg, length=r + 1)[:r]
        offsets = jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum(counts, dtype=jnp.int32)])
    tiles = y.shape[1 - axis] // tile
    num_rows = y.shape[axis] // block
    return _pallas_call(
        functools.partial(_combine_kernel, block=block, tile=tile, axis=axis, num_rows=num_rows, epi=epi),
        grid=(r, tiles),
        out_shape=jax.ShapeDtypeStruct(y.shape, y.dtype),
        input_output_aliases={2: 0},
        compiler_params=_params(num_warps, 2),
        interpret=_interpret(),
        name=f"bs_combine_{block}_{tile}_{axis}",
    )(kernel_constant(sched.split_rows), kernel_constant(offsets), y, p, *bias)


def _walk(kernel, sched, tiles: int, shapes, out_dtype, data, x, num_warps: int, num_stages: int, name: str,
          bias=()):  # fmt: skip
    """Launch a work-list kernel (dsd or dds): one program per (unit, tile of the dense operand).

    Returns the output (``shapes[0]``, ``out_dtype``) and the float32 partials (``shapes[1]``).
    """
    return _pallas_call(
        kernel,
        grid=(sched.num_units, tiles),
        out_shape=(jax.ShapeDtypeStruct(shapes[0], out_dtype), jax.ShapeDtypeStruct(shapes[1], jnp.float32)),
        compiler_params=_params(num_warps, num_stages),
        interpret=_interpret(),
        name=name,
    )(
        *map(kernel_constant, (sched.unit_start, sched.unit_len, sched.unit_dest, sched.block_col, sched.block_id)),
        data.reshape(-1, data.shape[-1]),
        x,
        *bias,
    )


def dsd(pattern: BlockPattern, data, x, out_dtype, *, exact: bool = False, config: TritonConfig | None = None,
        epi=None, bias=None):  # fmt: skip
    """``W @ x`` with the Pallas kernel; ``data`` and ``x`` already of one supported dtype.

    ``epi``: an optional :class:`~.epilogue.Epilogue` applied in the kernel's store (``bias`` its array).
    """
    cfg = config or TritonConfig()
    bh, bw = pattern.block_size
    m, _ = pattern.shape
    n = x.shape[1]
    if n == 0:
        return jnp.zeros((m, n), out_dtype)
    if pattern.nnz_blocks == 0:
        z = jnp.zeros((m, n), jnp.float32)
        return _epilogue.reference(z, bias, epi, out_dtype)
    tn = _tile(n, cfg.tn or default_tn(bh, n, pattern.grid[0]))
    tiles = cdiv(n, tn)
    sched = lower(pattern, GpuLowering(op="dsd", tiles=tiles, max_len=cfg.max_len))
    return _dsd_call(sched, m, data, x, out_dtype, tn, cfg, exact, epi, bias)


def tile_for(bh: int, n: int, rows: int, config: TritonConfig | None = None) -> int:
    """The dsd kernel's column tile for ``n`` columns and ``rows`` output block rows (``config``: default
    :class:`TritonConfig()`)."""
    cfg = config or TritonConfig()
    return _tile(n, cfg.tn or default_tn(bh, n, rows))


def run_schedule(sched, m: int, data, x, out_dtype, tn: int, *, exact: bool = False,
                 config: TritonConfig | None = None):  # fmt: skip
    """``W @ x`` on a given work list (host or traced), ``W`` of ``m`` rows with blocks ``data``."""
    return _dsd_call(sched, m, data, x, out_dtype, tn, config or TritonConfig(), exact)


def _dsd_call(sched, m: int, data, x, out_dtype, tn: int, cfg: TritonConfig, exact: bool, epi=None, bias=None):
    """Run the dsd kernel on a host (:class:`RowSplitSchedule`) or traced (dynamic) schedule."""
    _, bh, bw = data.shape
    n = x.shape[1]
    acc_t = transpose_acc(bh, cfg)
    npad = -n % tn
    xp = _pad_to(x, 1, tn)
    tiles = xp.shape[1] // tn
    nw = cfg.num_warps or (8 if bh * tn >= 128 * 128 else 4)
    ns = cfg.num_stages or 3
    s = max(sched.num_partials, 1)
    kernel = functools.partial(_dsd_kernel, bh=bh, bw=bw, tn=tn, acc_t=acc_t, exact=exact, epi=epi)
    out = ((m, xp.shape[1]), (s * bh, xp.shape[1]))
    b = _bias_operand(bias, epi, xp.shape[1] if epi is not None and epi.bias_axis == 1 else m)
    name = f"bs_dsd_{bh}x{bw}_tn{tn}" + ("_epi" if epi is not None else "")
    y, p = _walk(kernel, sched, tiles, out, out_dtype, data, xp, nw, ns, name, b)
    y = _combine_rows(y, p, sched, bh, tn, axis=0, num_warps=nw, epi=epi, bias=b)
    return y[:, :n] if npad else y


def dsd_dynamic(
    rows,
    cols,
    keep,
    valid,
    data,
    x,
    num_rows: int,
    out_dtype,
    *,
    transposed: bool = False,
    exact: bool = False,
    config: TritonConfig | None = None,
    epi=None,
    bias=None,
):
    """``W @ x`` for a traced block COO (``keep`` masks padding).

    ``transposed``: ``data[i]`` holds block ``i`` of W transposed (W is the transpose of the
    matrix whose blocks ``data`` stores: ``x @ D`` and the backward need no transposed copy).
    ``valid`` (traced bool): if false the result is NaN. The plan is built inside ``jit``; see
    :class:`TritonConfig` ``dynamic`` for the two designs (default: the scan kernel, no plan).
    """
    cfg = config or TritonConfig()
    bh, bw = data.shape[1:][::-1] if transposed else data.shape[1:]
    n = x.shape[1]
    if data.shape[0] == 0 or n == 0 or x.shape[0] == 0:  # k == 0: no block can be in range
        z = jnp.zeros((num_rows * bh, n), jnp.float32)
        return poison(valid, _epilogue.reference(z, bias, epi, out_dtype))
    tn = _tile(n, cfg.tn or default_tn(bh, n, num_rows))
    mode = cfg.dynamic or "scan"
    if mode == "scan":
        return _scan_call(rows, cols, keep, valid, data, x, num_rows, out_dtype, tn, cfg, transposed, exact, epi, bias)
    if transposed:
        data = data.swapaxes(-1, -2)
    sched = redistribute(rows, cols, keep, num_rows, cfg.max_len)
    return poison(valid, _dsd_call(sched, num_rows * bh, data, x, out_dtype, tn, cfg, exact, epi, bias))


def _block_product(acc, d, c, w_ref, x_ref, n0, *, bh, bw, tn, acc_t, trans, exact):
    """``acc += W_block(d) @ x[block row c, n0:n0 + tn]`` (``acc`` transposed if ``acc_t``).

    ``trans``: the stored block ``d`` is ``(bw, bh)`` (the block of W's transpose): contract its
    first axis instead of copying it.
    """
    xs = x_ref[pl.ds(pl.multiple_of(c * bw, bw), bw), pl.ds(n0, tn)]  # (bw, tn)
    if trans:
        w = w_ref[pl.ds(pl.multiple_of(d * bw, bw), bw), :]  # (bw, bh)
        if acc_t:
            return acc + _dot(xs, w, exact=exact, contract=((0,), (0,)))  # (tn, bh)
        return acc + _dot(w, xs, exact=exact, contract=((0,), (0,)))  # (bh, tn)
    w = w_ref[pl.ds(pl.multiple_of(d * bh, bh), bh), :]  # (bh, bw)
    if acc_t:
        return acc + _dot(xs, w, exact=exact, contract=((0,), (1,)))
    return acc + _dot(w, xs, exact=exact)


def _scan_kernel(valid_ref, rows_ref, cols_ref, keep_ref, w_ref, x_ref, *refs, bh, bw, tn, acc_t, trans, exact,
                 cap, chunk, epi=None):  # fmt: skip
    """Program ``(r, t)``: output block row ``r``, columns ``[t * tn, (t + 1) * tn)``.

    No plan: the program reads the block coordinates ``chunk`` at a time, keeps those of its own
    row, and multiplies them one by one (the first remaining match each time). Every program of a
    column tile reads the same few KiB of coordinates, which stay in L2. The output is NaN if the
    matrix is invalid (``valid_ref``), in the same pass.
    """
    bias_ref, (y_ref,) = _split_refs(refs, epi)
    r = pl.program_id(0)
    n0 = pl.multiple_of(pl.program_id(1) * tn, tn)
    lane = jnp.arange(chunk, dtype=jnp.int32)
    block = functools.partial(_block_product, w_ref=w_ref, x_ref=x_ref, n0=n0, bh=bh, bw=bw, tn=tn, acc_t=acc_t,
                              trans=trans, exact=exact)  # fmt: skip

    def over_chunks(i, acc):
        c0 = pl.multiple_of(i * chunk, chunk)
        inside = c0 + lane < cap
        rr = _masked_load(rows_ref.at[pl.ds(c0, chunk)], inside, -1)
        kk = _masked_load(keep_ref.at[pl.ds(c0, chunk)], inside, 0)
        mine = (rr == r) & (kk != 0)

        def take(_, carry):
            acc, left = carry
            first = jnp.min(jnp.where(left, lane, chunk))
            d = c0 + first
            return block(acc, d, cols_ref[d]), left & (lane != first)

        count = jnp.sum(mine.astype(jnp.int32))
        return lax.fori_loop(0, count, take, (acc, mine))[0]

    acc = lax.fori_loop(0, cdiv(cap, chunk), over_chunks, jnp.zeros((tn, bh) if acc_t else (bh, tn), jnp.float32))
    if acc_t:
        acc = acc.T
    acc = _finish(acc, epi, bias_ref, r * bh, n0, (bh, tn))
    acc = jnp.where(valid_ref[0] != 0, acc, jnp.nan)
    y_ref[pl.ds(pl.multiple_of(r * bh, bh), bh), pl.ds(n0, tn)] = acc.astype(y_ref.dtype)


def _scan_call(rows, cols, keep, valid, data, x, num_rows, out_dtype, tn: int, cfg: TritonConfig, trans: bool,
               exact: bool, epi=None, bias=None):  # fmt: skip
    bh, bw = data.shape[1:][::-1] if trans else data.shape[1:]
    n = x.shape[1]
    cap = int(rows.shape[0])
    chunk = cfg.scan_chunk or min(1024, next_power_of_2(cap, 16))
    acc_t = transpose_acc(bh, cfg)
    xp = _pad_to(x, 1, tn)
    tiles = xp.shape[1] // tn
    nw = cfg.num_warps or (8 if bh * tn >= 128 * 128 else 4)
    ns = cfg.num_stages or 3
    kernel = functools.partial(_scan_kernel, bh=bh, bw=bw, tn=tn, acc_t=acc_t, trans=trans, exact=exact, cap=cap,
                               chunk=chunk, epi=epi)  # fmt: skip
    y = _pallas_call(
        kernel,
        grid=(num_rows, tiles),
        out_shape=jax.ShapeDtypeStruct((num_rows * bh, xp.shape[1]), out_dtype),
        compiler_params=_params(nw, ns),
        interpret=_interpret(),
        name=f"bs_dyn_scan_{bh}x{bw}_tn{tn}" + ("_t" if trans else "") + ("_epi" if epi is not None else ""),
    )(
        jnp.reshape(valid, (1,)).astype(jnp.int32),
        rows.astype(jnp.int32),
        cols.astype(jnp.int32),
        keep.astype(jnp.int32),
        data.reshape(-1, data.shape[-1]),
        xp,
        *_bias_operand(bias, epi, xp.shape[1] if epi is not None and epi.bias_axis == 1 else num_rows * bh),
    )
    return y[:, :n] if xp.shape[1] != n else y


# --------------------------------------------------------------------------------------------
# dds: y (B, k) = x (B, m) @ W (m, k)
# --------------------------------------------------------------------------------------------
def _dds_kernel(start_ref, len_ref, dest_ref, col_ref, id_ref, w_ref, x_ref, *refs, bh, bw, tb, exact, epi=None):
    bias_ref, (y_ref, p_ref) = _split_refs(refs, epi)
    u = pl.program_id(0)
    b0 = pl.multiple_of(pl.program_id(1) * tb, tb)
    start = start_ref[u]
    length = len_ref[u]
    dest = dest_ref[u]

    def body(i, acc):
        j = start + i
        r = col_ref[j]  # block row of W = block column of x
        d = id_ref[j]
        w = w_ref[pl.ds(pl.multiple_of(d * bh, bh), bh), :]  # (bh, bw)
        xs = x_ref[pl.ds(b0, tb), pl.ds(pl.multiple_of(r * bh, bh), bh)]  # (tb, bh)
        return acc + _dot(xs, w, exact=exact)  # (tb, bw)

    acc = lax.fori_loop(0, length, body, jnp.zeros((tb, bw), jnp.float32))

    @pl.when(dest >= 0)
    def _():
        out = _finish(acc, epi, bias_ref, b0, dest * bw, (tb, bw))
        y_ref[pl.ds(b0, tb), pl.ds(pl.multiple_of(dest * bw, bw), bw)] = out.astype(y_ref.dtype)

    @pl.when(dest < 0)
    def _():
        p_ref[pl.ds(b0, tb), pl.ds(pl.multiple_of((-1 - dest) * bw, bw), bw)] = acc


def dds(x, pattern: BlockPattern, data, out_dtype, *, exact: bool = False, config: TritonConfig | None = None,
        epi=None, bias=None):  # fmt: skip
    """``x @ W`` with the Pallas kernel, walking W's block columns through the cached transpose.

    ``epi``: an optional :class:`~.epilogue.Epilogue` (bias along the output columns) applied in the store.
    """
    cfg = config or TritonConfig()
    bh, bw = pattern.block_size
    _, k = pattern.shape
    b = x.shape[0]
    if b == 0:
        return jnp.zeros((b, k), out_dtype)
    if pattern.nnz_blocks == 0:
        z = jnp.zeros((b, k), jnp.float32)
        return _epilogue.reference(z, bias, epi, out_dtype)
    tb = _tile(b, cfg.tb or 128)
    xp = _pad_to(x, 0, tb)
    tiles = xp.shape[0] // tb
    sched = lower(pattern, GpuLowering(op="dds", tiles=tiles, max_len=cfg.max_len))
    nw = cfg.num_warps or (8 if bw * tb >= 128 * 128 else 4)
    ns = cfg.num_stages or 3
    s = max(sched.num_partials, 1)
    kernel = functools.partial(_dds_kernel, bh=bh, bw=bw, tb=tb, exact=exact, epi=epi)
    out = ((xp.shape[0], k), (xp.shape[0], s * bw))
    b1 = _bias_operand(bias, epi, k)
    name = f"bs_dds_{bh}x{bw}_tb{tb}" + ("_epi" if epi is not None else "")
    y, p = _walk(kernel, sched, tiles, out, out_dtype, data, xp, nw, ns, name, b1)
    y = _combine_rows(y, p, sched, bw, tb, axis=1, num_warps=nw, epi=epi, bias=b1)
    return y[:b] if xp.shape[0] != b else y


# --------------------------------------------------------------------------------------------
# sdd: out[i] = a[rows of block i] @ b[:, cols of block i]
# --------------------------------------------------------------------------------------------
def _sdd_kernel(row_ref, col_ref, a_ref, b_ref, o_ref, *, bh, bw, tk, steps, per_split, nnz, exact):
    """Program ``(split, i)``: block ``i`` over chunks ``[split * per_split, min((split + 1) * per_split, steps))``
    of the contracted dimension, into row block ``split * nnz + i`` of the output."""
    split, i = pl.program_id(0), pl.program_id(1)
    r0 = pl.multiple_of(row_ref[i] * bh, bh)
    c0 = pl.multiple_of(col_ref[i] * bw, bw)
    first = split * per_split

    def body(s, acc):
        k0 = pl.multiple_of(s * tk, tk)
        a = a_ref[pl.ds(r0, bh), pl.ds(k0, tk)]  # (bh, tk)
        b = b_ref[pl.ds(k0, tk), pl.ds(c0, bw)]  # (tk, bw)
        return acc + _dot(a, b, exact=exact)

    zero = jnp.zeros((bh, bw), jnp.float32)
    if per_split >= steps:  # one program per block: the loop's bounds stay static
        acc = lax.fori_loop(0, steps, body, zero)
    else:
        acc = lax.fori_loop(first, jnp.minimum(first + per_split, steps), body, zero)
    o_ref[pl.ds(pl.multiple_of((split * nnz + i) * bh, bh), bh), :] = acc.astype(o_ref.dtype)


def _sdd_plan(nnz: int, k: int, block_size, cfg: TritonConfig) -> tuple[int, int, int, int]:
    """``(tk, steps, splits, per_split)`` of an sdd over a contracted dimension of ``k``: chunks of ``tk``, and
    ``splits`` programs per block of ``per_split`` chunks each (the last may have fewer, none is empty): split where
    there are fewer blocks than :data:`~..tuned` ``TRITON_SDD_WAVES`` programs per SM, into enough splits for as
    many programs, each of at least ``TRITON_SDD_MIN_STEPS`` chunks."""
    tk = _tile(k, cfg.tk or (64 if max(block_size) >= 128 else 128))
    steps = cdiv(k, tk)
    t = tuned.current()
    target = t.TRITON_SDD_WAVES * hardware.gpu().num_sms
    splits = max(
        1, min(cfg.sdd_splits or contraction_splits(nnz, steps, target, target, t.TRITON_SDD_MIN_STEPS), steps)
    )
    per_split = cdiv(steps, splits)
    return tk, steps, cdiv(steps, per_split), per_split


def sdd_splits(nnz: int, k: int, block_size, config: TritonConfig | None = None) -> int:
    """Programs per block the sdd kernel runs for ``nnz`` blocks over a contracted dimension of ``k``."""
    return _sdd_plan(nnz, k, block_size, config or TritonConfig())[2] if k else 1


def sdd(a, b, pattern: BlockPattern, out_dtype, *, exact: bool = False, config: TritonConfig | None = None):
    """``(a @ b)`` at the blocks of ``pattern``, laid out like ``.data``: ``(nnz, bh, bw)``."""
    rows, cols = kernel_constant(pattern.rows), kernel_constant(pattern.cols)  # one unread element more
    return sdd_coords(a, b, rows, cols, pattern.block_size, out_dtype, exact=exact, config=config,
                      nnz=pattern.nnz_blocks)  # fmt: skip


def sdd_coords(a, b, rows, cols, block_size, out_dtype, *, exact: bool = False, config: TritonConfig | None = None,
               nnz: int | None = None):  # fmt: skip
    """``(a @ b)`` at block coordinates ``rows``, ``cols`` (host or traced, all in range); ``nnz``: the number of
    blocks, the first ``nnz`` coordinates (default: all of them)."""
    cfg = config or TritonConfig()
    bh, bw = block_size
    nnz = rows.shape[0] if nnz is None else nnz
    n = a.shape[1]
    if nnz == 0:
        return jnp.zeros((0, bh, bw), out_dtype)
    if n == 0:
        return jnp.zeros((nnz, bh, bw), out_dtype)
    tk, steps, splits, per_split = _sdd_plan(nnz, n, block_size, cfg)
    ap, bp = _pad_to(a, 1, tk), _pad_to(b, 0, tk)
    nw = cfg.num_warps or (8 if bh * bw >= 128 * 128 else 4)
    ns = cfg.num_stages or 3
    kernel = functools.partial(_sdd_kernel, bh=bh, bw=bw, tk=tk, steps=steps, per_split=per_split, nnz=nnz,
                               exact=exact)  # fmt: skip
    out = _pallas_call(
        kernel,
        grid=(splits, nnz),
        out_shape=jax.ShapeDtypeStruct((splits * nnz * bh, bw), out_dtype if splits == 1 else jnp.float32),
        compiler_params=_params(nw, ns),
        interpret=_interpret(),
        name=f"bs_sdd_{bh}x{bw}_tk{tk}" + (f"_split{splits}" if splits > 1 else ""),
    )(rows.astype(jnp.int32), cols.astype(jnp.int32), ap, bp)
    if splits > 1:  # the partial blocks, summed in float32
        out = out.reshape(splits, nnz * bh, bw).sum(axis=0).astype(out_dtype)
    return out.reshape(nnz, bh, bw)


# --------------------------------------------------------------------------------------------
# Backend
# --------------------------------------------------------------------------------------------
