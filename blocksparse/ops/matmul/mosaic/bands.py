"""Pallas Mosaic GPU kernel for small blocks (16 and 32): block columns in bands, one slab of ``x`` per band step.

A wgmma tile is 64 rows tall, so a 16 x 16 or 32 x 32 block of ``W`` cannot be the tall operand of
``W @ x``, and the other kernels of this backend take blocks of 64 and 128 only. Here the *tokens* are
the tall dimension: the kernel computes ``y = x @ W`` (``x (m, k)``, ``W (k, n)`` block-sparse, the
``dds`` product), and ``W @ x`` is the same kernel on the transposes (``y^T = x^T @ W^T``; W's blocks
are read through a transposed shared-memory view, so only ``x`` and ``y`` are transposed, by XLA).

Bands
-----
The block columns of ``W`` are grouped into *bands* of ``group`` consecutive block columns (``width = group *
b`` output columns: 64, 128 or 256, default 128). A band's *steps* are the block rows of ``W`` that hold at least
one block in the band, in order; step ``s`` multiplies one ``tm x b`` slab of ``x`` (columns ``[k_s b, (k_s + 1)
b)``) by every block of the band in that block row. The slab is copied once per step and feeds all of the band's
blocks there, instead of once per block (the bound of the Triton kernel on these blocks: each ``b x b`` block
re-reads a ``b``-wide slab, an intensity of ``b`` flop per byte). On the IPU, PopSparse's planner forms column
bands for the same reason. :func:`bands` builds the steps on the host (NumPy, cached) as one metadata table:
per step the block row, the slot mask (bit ``j``: slot ``j`` of the band holds a block) and the block of each
slot (``-1`` where empty).

The kernel
----------
One program (a warpgroup) per ``(row tile t of x, band g)``, bands launched fastest, so a row tile of ``x``
stays in L2 while W's bands stream. The float32 accumulator ``(tm, width)`` lives in registers; slot ``j`` of
the band owns its columns ``[j b, (j + 1) b)``. The band's metadata is copied to shared memory by TMA,
:data:`CHUNK` steps at a time, into a ring of three chunks (a scalar load from global memory per step stalled
the issue of the copies); a chunk's slot is refilled once its reads are fenced (``commit_smem``). Per step, in a
``stages``-deep TMA pipeline, the slab of ``x`` (one barrier per stage) and each present block (one barrier per
stage and slot: only the present blocks are copied) land in shared memory, with a ``2 b``-byte swizzle (the
width of a block row; ``wgmma`` takes both operands in one swizzle); then one ``wgmma`` per present block,
``acc[:, j b : (j + 1) b] += slab @ block``, each under its slot's bit (a static slot, a dynamic condition).
Every step holds a block, so once at most one wgmma is pending the previous step's are done and its stage is
refilled. Pallas' warpgroup barrier before every copy is off (``unsafe_no_auto_barriers``): only TMA writes
shared memory, except the output tile, whose ``commit_smem`` syncs the warpgroup before its store. At the end
the accumulator gets the fused epilogue (bias, activation), is cast and stored by TMA. A band with no step
stores zeros (or ``activation(bias)``).

Supported: square blocks of 16 or 32, float16 / bfloat16 operands of one dtype, float32 accumulation, output
in float16, bfloat16 or float32; a bias along either axis and every activation of :mod:`..epilogue`.

Measured
--------
On an H200 (docs/benchmarks.md) it ties the Triton kernel on ``W @ x`` at b = 32 and loses at b = 16; on ``x
@ W`` it is faster at b = 32 from density 1/8 up, and :func:`blocksparse.ops.matmul.order.default` puts it first
only where :data:`~..tuned` ``BANDS_DSD_SPEEDUP`` / ``BANDS_DDS_SPEEDUP`` say so. It is bound by the TMA copies'
rate in rows: a slab is ``tm`` rows of 32 or 64 bytes.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from ...._pattern import BlockPattern
from ...._util import cdiv
from ... import _dispatch
from .. import epilogue as _epilogue
from .. import tuned
from ..schedule import kernel_constant
from .common import (
    MAX_ACC,
    apply_epilogue,
    check_operands,
    operand_dtypes,
    pipeline_stages,
    smem_bytes,
    with_bias_buffer,
)

__all__ = ["BLOCKS", "BandConfig", "BandPlan", "BandSchedule", "bands", "dds", "default_tiles", "dsd", "plan"]

#: Square block sides the kernel takes.
BLOCKS = (16, 32)
#: Mosaic GPU allocates at most 32 barriers in one group (a stage's ``x`` slab and each slot have one per stage);
#: the metadata ring also needs ``stages <= CHUNK + 2`` (a chunk's slot is refilled while at most ``stages - 1``
#: steps of the chunk two before are still unread).
MAX_STAGES = 32
#: Rows of ``x`` per program and output columns per band (``tm * width <= 128 * 128``: the float32
#: accumulator of one warpgroup).
TILES = (64, 128)
WIDTHS = (64, 128, 256)


@dataclasses.dataclass(frozen=True)
class BandConfig:
    """Tiles of the banded kernel (``None``: chosen per problem).

    Attributes:
        tm: rows of ``x`` (tokens) per program, in :data:`TILES`.
        width: output columns per band, in :data:`WIDTHS` (``group = width // b`` blocks), with
            ``tm * width <= 128 * 128``.
        stages: shared-memory pipeline depth (>= 2; default :data:`~..tuned` ``BANDS_DEFAULT_STAGES``, fewer where
            they do not fit).
    """

    tm: int | None = None
    width: int | None = None
    stages: int | None = None

    #: The backend this config configures (``implementation="mosaic"``; ``bs.matmul(..., config=)``).
    backend: ClassVar[str] = "mosaic"

    def __post_init__(self):
        if self.tm is not None and self.tm not in TILES:
            raise ValueError(f"Expected tm in {TILES}. Got {self.tm}.")
        if self.width is not None and self.width not in WIDTHS:
            raise ValueError(f"Expected width in {WIDTHS}. Got {self.width}.")
        if self.tm is not None and self.width is not None and self.tm * self.width > MAX_ACC:
            raise ValueError(f"Expected tm * width <= {MAX_ACC}. Got {self.tm} * {self.width}.")
        if self.stages is not None and not 2 <= self.stages <= MAX_STAGES:
            raise ValueError(f"Expected 2 <= stages <= {MAX_STAGES}. Got {self.stages}.")


#: Steps per chunk of the metadata table that the kernel copies to shared memory (three chunks in flight).
CHUNK = 64
_ROW, _MASK, _IDS = 0, 1, 2  # the columns of a step's metadata row


@dataclasses.dataclass(frozen=True, eq=False)
class BandSchedule:
    """The steps of every band (see the module docstring); NumPy int32 arrays, read-only.

    Attributes:
        group: block columns per band.
        band_start: ``[bands + 1]``: band ``g``'s steps are ``[band_start[g], band_start[g + 1])``.
        meta: ``[S + CHUNK, R]``: one row per step (then ``CHUNK`` rows of padding, so that a chunk's copy never
            reads past the end): the block row of ``W`` (which slab of ``x``), the slot mask (bit ``j`` set where
            slot ``j`` holds a block; never 0), then the index into ``data`` of each slot's block (``-1`` where
            empty); ``R = group + 2`` rounded up to a multiple of 4 (rows of 16-byte multiples for the TMA copy).
    """

    group: int
    band_start: np.ndarray
    meta: np.ndarray

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, np.ndarray):
                value.setflags(write=False)

    @property
    def num_bands(self) -> int:
        return int(self.band_start.shape[0] - 1)

    @property
    def num_steps(self) -> int:
        return int(self.band_start[-1])

    @property
    def step_row(self) -> np.ndarray:
        return self.meta[: self.num_steps, _ROW]

    @property
    def step_mask(self) -> np.ndarray:
        return self.meta[: self.num_steps, _MASK]

    @property
    def step_ids(self) -> np.ndarray:
        """``[S, group]``: the block of each slot (``-1``: empty)."""
        return self.meta[: self.num_steps, _IDS : _IDS + self.group]


@functools.lru_cache(maxsize=128)
def bands(pattern: BlockPattern, group: int, transposed: bool = False) -> BandSchedule:
    """The band steps of ``W`` (``pattern``, ``k x n``; with ``transposed``, of ``pattern.T`` with the ids of
    ``pattern``'s blocks) with ``group`` block columns per band (the last band may be narrower: its missing
    slots are empty). Cached; the arrays are read-only."""
    if group < 1 or group > 31:
        raise ValueError(f"Expected 1 <= group <= 31 (a step's slots are bits of an int32). Got {group}.")
    perm = None
    if transposed:
        pattern, perm = pattern.transpose()
    gn = pattern.grid[1]
    nb = max(cdiv(gn, group), 1)
    rows, cols = pattern.rows.astype(np.int64), pattern.cols.astype(np.int64)
    band, slot = np.divmod(cols, group)
    order = np.lexsort((slot, rows, band))  # band-major, then block row, then slot
    b_s, r_s, j_s = band[order], rows[order], slot[order]
    new = np.ones(order.shape[0], bool)
    new[1:] = (b_s[1:] != b_s[:-1]) | (r_s[1:] != r_s[:-1])
    step = np.cumsum(new) - 1
    n_steps = int(new.sum())
    band_start = np.zeros(nb + 1, np.int64)
    np.cumsum(np.bincount(b_s[new], minlength=nb), out=band_start[1:])
    meta = np.zeros((n_steps + CHUNK, -(-(group + _IDS) // 4) * 4), np.int64)
    meta[:n_steps, _IDS : _IDS + group] = -1
    meta[:n_steps, _ROW] = r_s[new]
    meta[step, _IDS + j_s] = order if perm is None else perm[order]  # a block's data index: its pattern position
    np.bitwise_or.at(meta[:, _MASK], step, np.left_shift(1, j_s))
    return BandSchedule(group=group, band_start=band_start.astype(np.int32), meta=meta.astype(np.int32))


@dataclasses.dataclass(frozen=True)
class BandPlan:
    """What the host prepares for one call: ``tm`` rows of ``x`` per program, ``tiles`` row tiles (``m_pad = tiles
    * tm``), ``width`` output columns per band (``n_pad = bands * width``), the pipeline depth and the steps."""

    tm: int
    tiles: int
    width: int
    stages: int
    sched: BandSchedule

    @property
    def m_pad(self) -> int:
        return self.tiles * self.tm

    @property
    def n_pad(self) -> int:
        return self.sched.num_bands * self.width


def default_tiles(m: int) -> tuple[int, int]:
    """``(tm, width)``: :data:`~..tuned` ``BANDS_DEFAULT_TILES``, the fastest measured; 64 x 256 where ``x`` has
    at most 64 rows (not measured: fewer padded rows)."""
    return (64, 256) if m <= 64 else tuple(tuned.current().BANDS_DEFAULT_TILES)


def plan(pattern: BlockPattern, m: int, itemsize: int = 2, config: BandConfig | None = None, extra_smem: int = 0,
         out_itemsize: int | None = None, transposed: bool = False) -> BandPlan:  # fmt: skip
    """The host-side preparation of ``x @ W`` for ``x`` of ``m`` rows (``transposed``: of ``x @ pattern.T``);
    ``NotImplementedError`` where the kernel cannot take the blocks or tiles."""
    cfg = config or BandConfig()
    bh, bw = pattern.block_size
    if bh != bw or bh not in BLOCKS:
        raise NotImplementedError(f"requires square blocks of {BLOCKS} (got {pattern.block_size})")
    b = pattern.block_size[0]
    tm0, w0 = default_tiles(m)
    tm, width = cfg.tm or tm0, cfg.width or w0
    if tm * width > MAX_ACC:
        raise NotImplementedError(f"requires tm * width <= {MAX_ACC} (got {tm} * {width})")
    group = width // b
    sched = bands(pattern, group, transposed)
    per_stage = (tm * b + group * b * b) * itemsize
    out_smem = tm * width * (out_itemsize or itemsize)
    fit = (smem_bytes() - extra_smem - out_smem) // per_stage
    stages = pipeline_stages(
        cfg.stages or min(tuned.current().BANDS_DEFAULT_STAGES, fit), per_stage, extra_smem + out_smem
    )
    assert stages <= min(MAX_STAGES, CHUNK + 2), stages
    return BandPlan(tm=tm, tiles=max(cdiv(m, tm), 1), width=width, stages=stages, sched=sched)


def _transforms(dtype, b: int):
    """Shared-memory layout of an operand ``b`` elements wide: 8-row tiles, a ``2 b``-byte swizzle."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    swizzle = b * jnp.dtype(dtype).itemsize
    return (plgpu.TilingTransform((8, b)), plgpu.SwizzleTransform(swizzle))


def _kernel(bstart_g, meta_g, w_g, x_g, *refs, b, group, tm, stages, epi, w_transposed):
    """Program ``(t, g)``: rows ``[t tm, (t + 1) tm)`` of ``x`` times band ``g`` of ``W``. ``refs``: ``(bias_g,)``
    when ``epi`` has a bias, then ``y_g``."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    bias_g, (y_g,) = (refs[0], refs[1:]) if epi is not None and epi.bias else (None, refs)
    g = lax.axis_index("g")
    m0 = pl.multiple_of(lax.axis_index("t") * tm, tm)
    s0 = bstart_g[g]
    count = bstart_g[g + 1] - s0
    width = group * b
    dtype = w_g.dtype
    tr = _transforms(dtype, b)

    def pipeline(acc_ref, x_smem, w_smem, meta_smem, meta_bar, x_bar, *w_bars):
        def load_chunk(c):  # steps [c CHUNK, (c + 1) CHUNK) of the band's metadata into chunk slot c % 3
            plgpu.copy_gmem_to_smem(meta_g.at[pl.ds(s0 + c * CHUNK, CHUNK), :], meta_smem.at[lax.rem(c, 3)],
                                    meta_bar.at[lax.rem(c, 3)])  # fmt: skip

        def meta(i, col):  # a step's metadata, from shared memory (a global load per step would stall the issue)
            return meta_smem[lax.rem(lax.div(i, CHUNK), 3), lax.rem(i, CHUNK), col]

        def fetch(i):  # step i's slab and present blocks into stage i % stages; steps are fetched in order
            c = lax.div(i, CHUNK)

            @pl.when((lax.rem(i, CHUNK) == 0) & (i > 0))
            def _():  # a new chunk: wait for it, start the next into the slot of chunk c - 2, read long ago
                plgpu.barrier_wait(meta_bar.at[lax.rem(c, 3)])
                plgpu.commit_smem()  # those reads (every thread's) before the copy overwrites them
                pl.when((c + 1) * CHUNK < count)(lambda: load_chunk(c + 1))

            slot = lax.rem(i, stages)
            plgpu.copy_gmem_to_smem(x_g.at[pl.ds(m0, tm), pl.ds(meta(i, _ROW) * b, b)], x_smem.at[slot],
                                    x_bar.at[slot])  # fmt: skip
            mask = meta(i, _MASK)

            def fetch_block(j):  # only the present blocks are copied
                bid = meta(i, _IDS + j)
                plgpu.copy_gmem_to_smem(w_g.at[pl.ds(bid * b, b), :], w_smem.at[slot, j], w_bars[j].at[slot])

            for j in range(group):
                pl.when(lax.shift_right_logical(mask, j) & 1 == 1)(functools.partial(fetch_block, j))

        @pl.when(count > 0)
        def _():
            load_chunk(0)
            plgpu.barrier_wait(meta_bar.at[0])
            pl.when(count > CHUNK)(lambda: load_chunk(1))

        for i in range(stages - 1):
            pl.when(i < count)(functools.partial(fetch, i))

        def step(i, carry):
            slot = lax.rem(i, stages)
            mask = meta(i, _MASK)
            plgpu.barrier_wait(x_bar.at[slot])

            def multiply(j):  # slot j's block into its columns of the accumulator
                plgpu.barrier_wait(w_bars[j].at[slot])
                blk = w_smem.at[slot, j]
                blk = blk.transpose((1, 0)) if w_transposed else blk
                plgpu.wgmma(acc_ref.at[:, j * b : (j + 1) * b], x_smem.at[slot], blk)

            for j in range(group):
                pl.when(lax.shift_right_logical(mask, j) & 1 == 1)(functools.partial(multiply, j))

            # a step holds >= 1 block: with at most one of its wgmmas pending, step i - 1's are done
            plgpu.wgmma_wait(1)
            nxt = i + stages - 1
            pl.when(nxt < count)(lambda: fetch(nxt))
            return carry

        lax.fori_loop(0, count, step, None)
        plgpu.wgmma_wait(0)

    def accumulate(acc_ref):
        pl.run_scoped(
            functools.partial(pipeline, acc_ref),
            plgpu.SMEM((stages, tm, b), dtype, transforms=tr),
            plgpu.SMEM((stages, group, b, b), dtype, transforms=tr),
            plgpu.SMEM((3, CHUNK, meta_g.shape[1]), jnp.int32),
            plgpu.Barrier(num_barriers=3),
            plgpu.Barrier(num_barriers=stages),
            *[plgpu.Barrier(num_barriers=stages) for _ in range(group)],
        )
        return acc_ref[...]

    def run(bias_smem=None, bias_bar=None):
        if bias_g is not None:  # this tile's bias slice: its copy overlaps the whole main loop
            piece = pl.ds(g * width, width) if epi.bias_axis == 1 else pl.ds(m0, tm)
            plgpu.copy_gmem_to_smem(bias_g.at[piece], bias_smem, bias_bar.at[0])
        acc = pl.run_scoped(accumulate, plgpu.ACC((tm, width), jnp.float32))
        out = apply_epilogue(acc, epi, bias_smem, bias_bar)

        def store(o_smem):
            o_smem[...] = out.astype(o_smem.dtype)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(o_smem, y_g.at[pl.ds(m0, tm), pl.ds(g * width, width)])
            plgpu.wait_smem_to_gmem(0, wait_read_only=True)

        pl.run_scoped(store, plgpu.SMEM((tm, width), y_g.dtype))

    with_bias_buffer(run, bias_g, width if epi is not None and epi.bias_axis == 1 else tm)


@functools.lru_cache(maxsize=256)
def _kernel_fn(b: int, group: int, tm: int, width: int, stages: int, tiles: int, num_bands: int, m_pad: int,
               n_pad: int, out_dtype, epi, w_transposed: bool, interpret):  # fmt: skip
    """The kernel for one static configuration, jitted: products of the same configuration (a balanced pruned
    model's projections of one shape) call the same function on operands of the same shapes, so a program that
    holds several lowers and compiles it once. The schedule is an operand, never part of the kernel."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    body = functools.partial(_kernel, b=b, group=group, tm=tm, stages=stages, epi=epi, w_transposed=w_transposed)
    kernel = plgpu.kernel(
        body,
        out_type=jax.ShapeDtypeStruct((m_pad, n_pad), out_dtype),
        grid=(tiles, num_bands),
        grid_names=("t", "g"),
        kernel_name=f"bs_mgpu_bands_{b}_tm{tm}_w{width}"
        + ("_epi" if epi is not None else "")
        + ("_wt" if w_transposed else ""),
        interpret=plgpu.InterpretGPUParams() if interpret is True else interpret,
        # no warpgroup barrier before every TMA copy (Pallas' default): a step issues one copy per block. Safe
        # here: shared memory is written by TMA copies only, except the output tile, whose commit_smem syncs.
        compiler_params=plgpu.CompilerParams(unsafe_no_auto_barriers=True),
    )
    return jax.jit(kernel)


def _meta_rows(n: int) -> int:
    """The schedule's rows as the kernel takes them: a power of two (rows past the steps are zeros, never read as
    steps), so products of one configuration whose step counts differ a little share the kernel's shapes."""
    return 1 << max(int(n) - 1, 1).bit_length()


def _launch(p: BandPlan, data, xp, out_dtype, *, interpret, epi=None, bias=(), w_transposed=False):
    b = data.shape[-1]
    s = p.sched
    meta = s.meta
    if meta.shape[0] != _meta_rows(meta.shape[0]):
        meta = np.pad(meta, ((0, _meta_rows(meta.shape[0]) - meta.shape[0]), (0, 0)))
    fn = _kernel_fn(b, s.group, p.tm, p.width, p.stages, p.tiles, s.num_bands, p.m_pad, p.n_pad, jnp.dtype(out_dtype),
                    epi, bool(w_transposed), interpret)  # fmt: skip
    return fn(kernel_constant(s.band_start), jnp.asarray(meta), data.reshape(-1, b), xp, *bias)


def _run(pattern, data, xt, out_dtype, epi, bias, config, interpret, transposed):
    """``xt @ W`` for ``W`` of ``pattern`` (``transposed``: ``xt @ W^T``, W's blocks read transposed): ``(m, n)``
    in ``out_dtype``."""
    n = pattern.shape[0 if transposed else 1]
    m = xt.shape[0]
    dt, out_dtype = operand_dtypes(data.dtype, xt.dtype, out_dtype)
    if interpret is None:
        interpret = _dispatch.interpreting()
    with_bias = epi is not None and epi.bias
    p = plan(pattern, m, jnp.dtype(dt).itemsize, config, 4 * max(WIDTHS) if with_bias else 0, out_dtype.itemsize,
             transposed)  # fmt: skip
    if m == 0 or n == 0:
        return jnp.zeros((m, n), out_dtype)
    if pattern.nnz_blocks == 0:
        return _epilogue.reference(jnp.zeros((m, n), jnp.float32), bias, epi, out_dtype)
    xp = xt.astype(dt)
    if p.m_pad != m:
        xp = jnp.pad(xp, ((0, p.m_pad - m), (0, 0)))
    bias_args = ()
    if with_bias:  # padded like the kernel's output, so every tile's copy stays inside the array
        bias_args = (jnp.pad(bias.astype(jnp.float32), (0, (p.n_pad - n) if epi.bias_axis == 1 else (p.m_pad - m))),)
    y = _launch(p, data.astype(dt), xp, out_dtype, interpret=interpret, epi=epi, bias=bias_args,
                w_transposed=transposed)  # fmt: skip
    return y[:m, :n] if (p.m_pad, p.n_pad) != (m, n) else y


def dds(pattern: BlockPattern, data, x, out_dtype=None, epi: _epilogue.Epilogue | None = None, bias=None, *,
        config: BandConfig | None = None, interpret=None) -> jax.Array:  # fmt: skip
    """``x @ W`` (``x (m, k)``, ``W (k, n)`` of ``pattern`` with blocks ``data``) with the banded kernel; ``epi``:
    an optional fused epilogue with a bias along the ``n`` output columns."""
    k, n = pattern.shape
    if x.ndim != 2 or x.shape[1] != k:
        raise ValueError(f"Expected x of shape (m, {k}). Got {tuple(x.shape)}.")
    check_operands(pattern, data, epi, bias, (x.shape[0], n))
    return _run(pattern, data, x, out_dtype, epi, bias, config, interpret, transposed=False)


def dsd(pattern: BlockPattern, data, x, out_dtype=None, epi: _epilogue.Epilogue | None = None, bias=None, *,
        config: BandConfig | None = None, interpret=None) -> jax.Array:  # fmt: skip
    """``W @ x`` (``W (m, k)`` of ``pattern`` with blocks ``data``, ``x (k, n)``) as ``(x^T @ W^T)^T``: the bands
    are groups of W's block rows; ``epi``: an optional fused epilogue, its bias ``(m,)`` (``bias_axis=0``) or
    ``(n,)`` (``bias_axis=1``)."""
    m, k = pattern.shape
    if x.ndim != 2 or x.shape[0] != k:
        raise ValueError(f"Expected x of shape ({k}, n). Got {tuple(x.shape)}.")
    check_operands(pattern, data, epi, bias, (m, x.shape[1]))
    if epi is not None:  # the kernel computes y^T: its columns are W's rows
        epi = dataclasses.replace(epi, bias_axis=1 - epi.bias_axis)
    return _run(pattern, data, x.T, out_dtype, epi, bias, config, interpret, transposed=True).T
