"""Pallas Mosaic GPU (Hopper: TMA + wgmma) kernel for the static ``dds`` product ``y = x @ W``.

The inference case of a sparse linear layer: ``x (tokens, hidden) @ W (hidden, out)`` with ``W``
block-sparse and static, e.g. 32768 x 384 @ 384 x 1536 in bf16, with the fused epilogue (a bias
along the output columns, an activation, the cast). It is the twin of the ``dsd`` kernel of
:mod:`.dsd` (whose helpers it imports) and consumes the same work list
(:class:`~..schedule.RowSplitSchedule`), built by :func:`~..schedule.lower` with ``op="dds"``: the
units walk the block *columns* of ``W`` through its cached transpose (``block_col`` is then the
block row of ``W``, i.e. the block of ``x``'s columns; ``block_id`` points into the original
``data``, so no transposed copy of the values is made).

``implementation="mosaic"`` of :func:`blocksparse.matmul` for a dense ``x`` times a static ``W``
(plain or fused); with ``implementation=None`` it goes before the Triton kernel where
:func:`blocksparse.ops.matmul.order.default` says so (a Hopper GPU, half-precision square blocks of 64 or
128, enough rows of ``x``, and a measured speedup in :data:`~..tuned` ``MOSAIC_DDS_SPEEDUP``). A plain product
runs the persistent kernel of :mod:`.persistent` (``DdsConfig(persistent=True)``: one program per resident slot,
one pipeline across its items) where the backend's :func:`~.backend.dds_persistent` says so (measured faster, in
``MOSAIC_DDS_PERSISTENT_SPEEDUP``), else the kernel below.

The kernel
----------
One program (CTA, one warpgroup of 128 threads) per ``(unit u, row tile t)`` of ``tm`` rows of
``x``; units are issued fastest (every unit of row tile 0, then of tile 1, ...), so a row tile of
``x`` stays in L2 while the blocks of ``W`` stream, as the schedule's balance rule assumes. Mosaic
GPU launches the *last* grid dimension fastest (it reverses the grid onto CUDA's ``x, y, z``), so the
grid is ``(tiles, units)``; ``DdsConfig(grid_order="tiles")`` swaps it (one block column of ``W``
against every row tile of ``x``: fewer reads of ``W``, many more of ``x``). It reads ``start, len,
dest`` of its unit from the schedule arrays, then loops ``len`` times over the unit's blocks:

- TMA copies bring the ``tm x bh`` slab of ``x`` at the block's row of ``W`` (columns
  ``[r bh, (r + 1) bh)`` of ``x``) and block ``block_id[j]`` of ``W`` (``bh x bw``) into shared
  memory, swizzled (128-byte swizzle, ``8 x 64`` tiles). ``stages`` (default 3, or 2 where 3 do
  not fit in 227 KiB) copies are in flight: step ``i`` waits for stage ``i % stages``, issues the
  wgmma, waits until at most one wgmma is pending and refills the stage of step ``i - 1`` with step
  ``i + stages - 1``.
- ``plgpu.wgmma(acc, x_slab, w_block)`` accumulates ``(tm, bw)`` in float32 registers
  (``tm * bw <= 128 * 128``). Both operands are in their natural layout: ``x``'s slab is the
  ``(M, K)`` operand and ``W``'s block the ``(K, N)`` one, so no transposed operand is needed.
- The accumulator goes through shared memory and a TMA store to ``y[m0 : m0 + tm, dest bw : (dest
  + 1) bw]`` (in the output dtype) when ``dest >= 0``, or to the float32 partials buffer (slot
  ``-1 - dest``, rows ``[slot m_pad, (slot + 1) m_pad)``) for a piece of a split block column. An
  empty block column is a unit of length 0: it stores zeros (or ``activation(bias)``).
- Fused epilogue (``epi``, :mod:`..epilogue`): a tile written directly gets ``activation(acc +
  bias)`` on the float32 accumulator before the cast; the tile's bias slice (float32) is copied to
  shared memory by TMA when the program starts and read in the accumulator's layout.

Split block columns are then summed in XLA (a segment sum over the slots and a scatter into those
columns only); with an epilogue they get it there, once, after the sum. ``x`` is zero-padded to a
multiple of ``tm`` rows.

Supported: block sides ``bh, bw`` in {64, 128} (square blocks are the case measured; rectangular
ones take the same code); float16 / bfloat16 operands of one dtype (a mix promotes to float32,
refused), float32 accumulation, output in float16, bfloat16 or float32; bias along the output
columns (``bias_axis=1``, the usual ``x @ W + b``) or along the rows; every activation of
:mod:`..epilogue`. Anything else raises ``NotImplementedError`` naming what was expected and got.

What is verified
----------------
On an H200 the ``gpu``-marked tests pass, the persistent kernel's included (float64 oracle, the strategies'
patterns, the epilogue, forced tiles and both grid orders; 28 passed with the ``sdd`` ones), and the speed
is in :data:`~..tuned` ``MOSAIC_DDS_SPEEDUP`` and ``MOSAIC_DDS_PERSISTENT_SPEEDUP``. On the CPU
(``tests/test_pallas_mosaic_dds.py``): the kernel lowers for CUDA (the Pallas -> Mosaic
GPU lowering checks the wgmma shapes and layouts, the swizzle transforms and the shared memory
budget) and runs in Pallas' GPU interpreter, where it matches a float64 oracle (schedule reads, TMA
slices, stage indices, empty block columns, partials, the epilogue). The interpreter completes
copies when issued and runs wgmma synchronously, so a missing wait would go unnoticed there: the
``gpu``-marked tests are the check on a Hopper GPU.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from .... import hardware
from ...._pattern import BlockPattern
from ...._util import cdiv
from ... import _dispatch
from .. import epilogue as _epilogue
from ..schedule import GpuLowering, RowSplitSchedule, kernel_constant, lower
from . import persistent as pp
from .common import (
    MAX_ACC,
    SUPPORTED_BLOCKS,
    apply_epilogue,
    check_operands,
    operand_dtypes,
    pipeline_stages,
    pipelined_wgmma,
    store_tile,
    with_bias_buffer,
)

__all__ = ["DdsConfig", "DdsPlan", "SUPPORTED_BLOCKS", "TILES", "dds", "default_tm", "plan"]

#: Rows of ``x`` per program.
TILES = (64, 128, 256)
#: Shared memory of a fused bias slice (float32, at most max(tm, bw) = 256 values).
BIAS_SMEM = 4 * max(TILES)


@dataclasses.dataclass(frozen=True)
class DdsConfig:
    """Tiles of the Mosaic ``dds`` kernel (``None``: chosen per problem).

    Attributes:
        tm: rows of ``x`` per program, in :data:`TILES`, with ``tm * bw <= 128 * 128``.
        stages: shared-memory pipeline depth (>= 2; default: 3, or 2 where 3 do not fit).
        max_len: force the schedule's cap on blocks per program (longer block columns are split
            into float32 partials).
        grid_order: which programs are launched fastest: ``"units"`` (every block column of ``W``
            for one row tile of ``x``, then the next tile) or ``"tiles"`` (every row tile for one
            block column).
        persistent: run the persistent kernel of :mod:`.persistent` (one program per
            resident slot, one pipeline across its items; no fused epilogue). ``None``: where
            :func:`~.backend.dds_persistent` says so (measured faster), for a plain product, where the backend
            plans it (this module's :func:`plan` takes ``None`` as ``False``); ``True`` / ``False`` force it.
        programs: the persistent kernel's number of programs (default: one per resident slot); only
            with ``persistent=True``.
        reduce: how the persistent kernel sums split block columns: ``"kernel"`` or ``"xla"``, as
            :class:`~.dsd.MosaicConfig` ``reduce`` (``None``: in the kernel, but by XLA in Pallas'
            GPU interpreter and where ``programs`` exceeds the resident slots).
    """

    tm: int | None = None
    stages: int | None = None
    max_len: int | None = None
    grid_order: str = "units"
    persistent: bool | None = None
    programs: int | None = None
    reduce: str | None = None

    #: The backend this config configures (``implementation="mosaic"``; ``bs.matmul(..., config=)``).
    backend: ClassVar[str] = "mosaic"

    def __post_init__(self):
        if self.tm is not None and self.tm not in TILES:
            raise ValueError(f"Expected tm in {TILES}. Got {self.tm}.")
        if self.stages is not None and self.stages < 2:  # one stage would wait before its first copy
            raise ValueError(f"Expected stages >= 2. Got {self.stages}.")
        if self.grid_order not in ("units", "tiles"):
            raise ValueError(f"Expected grid_order 'units' or 'tiles'. Got {self.grid_order!r}.")
        if self.programs is not None and (self.persistent is not True or self.programs < 1):
            raise ValueError(f"Expected programs >= 1 with persistent=True. Got programs={self.programs}.")
        pp.check_reduce(self.reduce)


@dataclasses.dataclass(frozen=True)
class DdsPlan:
    """Everything the host prepares for one ``dds`` call (see :func:`plan`).

    Attributes:
        tm: rows of ``x`` per program.
        tiles: row tiles (``m_pad // tm``); the grid holds ``sched.num_units * tiles`` programs.
        m_pad: the rows of ``x`` rounded up to a multiple of ``tm``.
        stages: shared-memory pipeline depth.
        sched: the work list (units are block columns of ``W``).
        grid_order: ``"units"`` or ``"tiles"``: which launch fastest (see :class:`DdsConfig`).
    """

    tm: int
    tiles: int
    m_pad: int
    stages: int
    sched: RowSplitSchedule
    grid_order: str = "units"
    persistent: object = None  # a pallas_mosaic_persistent.PersistentSchedule, or None: one program per item

    @property
    def grid(self) -> tuple[tuple[int, int], tuple[str, str]]:
        """The kernel's grid and its axis names: Mosaic GPU launches the last dimension fastest."""
        if self.grid_order == "units":
            return (self.tiles, self.sched.num_units), ("t", "u")
        return (self.sched.num_units, self.tiles), ("u", "t")

    def smem_bytes(self, bh: int, bw: int, itemsize: int, out_itemsize: int | None = None) -> int:
        """Shared memory of the pipeline (the output staging buffer reuses it afterwards; the persistent
        kernel: plus its output staging tile and, with split columns, a float32 one)."""
        pipeline = self.stages * (self.tm * bh + bh * bw) * itemsize
        if self.persistent is None:
            return pipeline
        return pipeline + self.tm * bw * ((out_itemsize or itemsize) + pp.staging_bytes(self.persistent))


def default_tm(m: int, units: int) -> int:
    """128 rows (a 128 x 128 wgmma tile for b = 128), 64 where that leaves some of the GPU's SMs without a program
    (not measured yet: ``benchmarks/bench_mosaic_dds.py --tm`` sweeps it)."""
    if m <= 64 or units * cdiv(m, 128) < hardware.gpu().num_sms:
        return 64
    return 128


def plan(
    pattern: BlockPattern,
    m: int,
    itemsize: int = 2,
    config: DdsConfig | None = None,
    extra_smem: int = 0,
    out_itemsize: int | None = None,
    fused: bool = False,
) -> DdsPlan:
    """The host-side preparation of ``x @ W`` for ``x`` of ``m`` rows (NumPy; the schedule is cached).

    ``itemsize``: bytes of an operand element; ``out_itemsize``: of an output element (default
    ``itemsize``); ``extra_smem``: bytes of shared memory the kernel holds besides the pipeline (the
    bias slice); ``fused``: a fused epilogue follows (the persistent kernel has none). Raises
    ``NotImplementedError`` if the kernel cannot take these blocks or tiles. ``persistent=None`` is one
    program per item here; which variant runs by default is the backend's choice
    (:func:`blocksparse.ops.matmul.mosaic.backend.dds_plan`).
    """
    del fused  # one plan for plain and fused products; the config says which kernel
    cfg = config or DdsConfig()
    bh, bw = pattern.block_size
    if bh not in SUPPORTED_BLOCKS or bw not in SUPPORTED_BLOCKS:
        raise NotImplementedError(
            f"requires block sides in {SUPPORTED_BLOCKS} (wgmma tiles of a 128-byte swizzle) (got ({bh}, {bw}))"
        )
    tm = cfg.tm or default_tm(m, pattern.grid[1])
    if tm * bw > MAX_ACC:
        raise NotImplementedError(
            f"requires tm * bw <= {MAX_ACC} (a float32 accumulator in one warpgroup's registers) (got {tm} * {bw})"
        )
    tiles = max(cdiv(m, tm), 1)
    max_len = cfg.max_len
    if cfg.persistent and max_len is None:  # split only block columns longer than a program's share of the steps
        max_len = pp.share(pattern.nnz_blocks, tiles, cfg.programs or hardware.gpu().num_sms)
    sched = lower(pattern, GpuLowering(op="dds", tiles=tiles, max_len=max_len))
    per_stage = (tm * bh + bh * bw) * itemsize
    if cfg.persistent:  # its own output staging tile (and a float32 one where XLA sums split columns)
        stages, persistent = pp.plan_persistent(sched, tiles, cfg.grid_order, per_stage, tm * bw, extra_smem,
                                                out_itemsize or itemsize, cfg)  # fmt: skip
    else:
        stages, persistent = pipeline_stages(cfg.stages, per_stage, extra_smem), None
    return DdsPlan(tm=tm, tiles=tiles, m_pad=tiles * tm, stages=stages, sched=sched, grid_order=cfg.grid_order,
                   persistent=persistent)  # fmt: skip


def _dds_kernel(start_g, len_g, dest_g, row_g, id_g, w_g, x_g, *refs, bh, bw, tm, m_pad, stages, epi=None):
    """Program ``(u, t)``: rows ``[t * tm, (t + 1) * tm)`` of ``x`` times unit ``u`` (a block column of W).

    ``refs``: ``(bias_g,)`` when ``epi`` has a bias, then ``y_g, p_g``.
    """
    from jax.experimental.pallas import mosaic_gpu as plgpu

    bias_g, (y_g, p_g) = (refs[0], refs[1:]) if epi is not None and epi.bias else (None, refs)
    u = lax.axis_index("u")
    m0 = pl.multiple_of(lax.axis_index("t") * tm, tm)
    start = start_g[u]
    length = len_g[u]
    dest = dest_g[u]

    def accumulate(acc_ref):
        return pipelined_wgmma(
            acc_ref, length, stages,
            lambda i: x_g.at[pl.ds(m0, tm), pl.ds(row_g[start + i] * bh, bh)],  # block row of W = x's columns
            lambda i: w_g.at[pl.ds(id_g[start + i] * bh, bh), :],
            (tm, bh), (bh, bw), w_g.dtype,
        )  # fmt: skip

    def run(bias_smem=None, bias_bar=None):
        if bias_g is not None:  # this tile's bias slice: its copy overlaps the whole main loop
            piece = pl.ds(jnp.maximum(dest, 0) * bw, bw) if epi.bias_axis == 1 else pl.ds(m0, tm)
            plgpu.copy_gmem_to_smem(bias_g.at[piece], bias_smem, bias_bar.at[0])
        acc = pl.run_scoped(accumulate, plgpu.ACC((tm, bw), jnp.float32))  # zero-initialised: empty units write 0

        def store_direct():  # bias and activation on the float32 accumulator, then the one cast
            store_tile(y_g, pl.ds(m0, tm), pl.ds(dest * bw, bw), apply_epilogue(acc, epi, bias_smem, bias_bar))

        def store_partial():  # a piece of a split column: the epilogue runs after the pieces are summed
            if bias_g is not None:
                plgpu.barrier_wait(bias_bar.at[0])  # every issued copy is waited for before the kernel exits
            store_tile(p_g, pl.ds((-1 - dest) * m_pad + m0, tm), pl.ds(0, bw), acc)

        pl.when(dest >= 0)(store_direct)
        pl.when(dest < 0)(store_partial)

    with_bias_buffer(run, bias_g, bw if epi is not None and epi.bias_axis == 1 else tm)


def _launch(p: DdsPlan, n: int, data, xp, out_dtype, *, interpret, epi=None, bias=()):
    """Run the kernel: ``(y (m_pad, n) in out_dtype, partials (S * m_pad, bw) float32)``.

    ``epi``: an :class:`~..epilogue.Epilogue` for the directly written tiles; ``bias``: ``()`` or
    ``(float32 bias of n values, or m_pad for bias_axis=0,)``.
    """
    from jax.experimental.pallas import mosaic_gpu as plgpu

    _, bh, bw = data.shape
    s = p.sched
    name = f"bs_mgpu_dds_{bh}x{bw}_tm{p.tm}" + ("_epi" if epi is not None else "")
    body = functools.partial(_dds_kernel, bh=bh, bw=bw, tm=p.tm, m_pad=p.m_pad, stages=p.stages, epi=epi)
    kernel = plgpu.kernel(
        body,
        out_type=(
            jax.ShapeDtypeStruct((p.m_pad, n), out_dtype),
            jax.ShapeDtypeStruct((max(s.num_partials, 1) * p.m_pad, bw), jnp.float32),
        ),
        grid=p.grid[0],
        grid_names=p.grid[1],
        kernel_name=name + ("_tiles_fastest" if p.grid_order == "tiles" else ""),
        interpret=plgpu.InterpretGPUParams() if interpret is True else interpret,
    )
    return kernel(
        *map(kernel_constant, (s.unit_start, s.unit_len, s.unit_dest, s.block_col, s.block_id)),
        data.reshape(-1, bw),
        xp,
        *bias,
    )


def _combine(y, partials, p: DdsPlan, bw: int, epi, bias):
    """Sum the float32 partial tiles into the split block columns of ``y`` (XLA), with the epilogue there."""
    sched = p.sched
    if sched.num_partials == 0:
        return y
    r = sched.split_rows.shape[0]  # the split block columns of W (output block columns)
    parts = partials.reshape(sched.num_partials, p.m_pad, bw)
    sums = jax.ops.segment_sum(parts, sched.partial_seg, num_segments=r)  # (r, m_pad, bw) float32
    if epi is not None:
        b = None
        if bias:
            b = bias[0].reshape(-1, bw)[sched.split_rows][:, None, :] if epi.bias_axis == 1 else bias[0][None, :, None]
        sums = _epilogue.apply(sums, b, epi.activation)
    y3 = y.reshape(p.m_pad, -1, bw)
    return y3.at[:, sched.split_rows].set(sums.transpose(1, 0, 2).astype(y.dtype)).reshape(y.shape)


def dds(
    pattern: BlockPattern,
    data,
    x,
    out_dtype=None,
    epi: _epilogue.Epilogue | None = None,
    bias=None,
    *,
    config: DdsConfig | None = None,
    interpret=None,
) -> jax.Array:
    """``x @ W`` with the Mosaic GPU kernel (no hardware check: :func:`hopper_problem` says why it cannot run).

    Arguments:
        pattern: W's block pattern (``(k, n)``), blocks in :data:`SUPPORTED_BLOCKS`.
        data: W's blocks ``(nnz, bh, bw)``; x: ``(m, k)``; both float16 or bfloat16 (promoted to one).
        out_dtype: the result dtype (default: the operands'); float16, bfloat16 or float32.
        epi: an optional :class:`~..epilogue.Epilogue` (bias, activation) applied to the float32
            accumulator before the one store of each output tile.
        bias: the epilogue's bias: ``(n,)`` for ``bias_axis=1`` (along the output columns), ``(m,)``
            for ``bias_axis=0``.
        config: a :class:`DdsConfig`.
        interpret: run in Pallas' GPU interpreter on the CPU (default: ``blocksparse.interpret()``); a
            ``plgpu.InterpretGPUParams`` passes its options (e.g. ``detect_races=True``).

    Returns:
        ``(m, n)`` in ``out_dtype``.
    """
    k, n = pattern.shape
    bh, bw = pattern.block_size
    if x.ndim != 2 or x.shape[1] != k:
        raise ValueError(f"Expected x of shape (m, {k}). Got {tuple(x.shape)}.")
    m = x.shape[0]
    check_operands(pattern, data, epi, bias, (m, n))
    dt, out_dtype = operand_dtypes(data.dtype, x.dtype, out_dtype)
    with_bias = epi is not None and epi.bias
    if epi is not None and config is not None and config.persistent:
        raise NotImplementedError("requires persistent=False for a fused epilogue (not written for that kernel)")
    if interpret is None:
        interpret = _dispatch.interpreting()
    p = plan(pattern, m, jnp.dtype(dt).itemsize, pp.resolve_reduce(config or DdsConfig(), interpret),
             BIAS_SMEM if with_bias else 0, out_dtype.itemsize, fused=epi is not None)  # fmt: skip
    if m == 0:
        return jnp.zeros((m, n), out_dtype)
    if pattern.nnz_blocks == 0:
        return _epilogue.reference(jnp.zeros((m, n), jnp.float32), bias, epi, out_dtype)
    xp = x.astype(dt)
    if p.m_pad != m:
        xp = jnp.pad(xp, ((0, p.m_pad - m), (0, 0)))
    b = ()
    if with_bias:  # float32; along rows padded like x, so every tile's TMA copy stays inside the array
        b32 = bias.astype(jnp.float32)
        b = (b32 if epi.bias_axis == 1 else jnp.pad(b32, (0, p.m_pad - m)),)
    if p.persistent is not None:
        y, partials = pp.launch(p.persistent, "dds", (p.m_pad, n), p.tm, p.stages, data.astype(dt), xp, out_dtype,
                                interpret=interpret, m_pad=p.m_pad)  # fmt: skip
        if not p.persistent.reduce:
            y = _combine(y, partials, p, bw, None, ())
    else:
        y, partials = _launch(p, n, data.astype(dt), xp, out_dtype, interpret=interpret, epi=epi, bias=b)
        y = _combine(y, partials, p, bw, epi, b)
    return y[:m] if p.m_pad != m else y
