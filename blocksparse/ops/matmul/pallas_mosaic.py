"""Pallas Mosaic GPU (Hopper: TMA + wgmma) kernel for the static ``dsd`` product ``y = W @ x``.

``implementation="mosaic"`` of :func:`blocksparse.matmul` for the static ``dsd`` (plain or with the
fused epilogue); its twin :mod:`.pallas_mosaic_dds` serves the static ``dds`` ``x @ W``. It consumes
the same work list as the Triton kernels
(:class:`~.lowering.RowSplitSchedule`, built by :func:`~.lowering.lower`): units of at most
``max_len`` blocks of one output block row. With ``implementation=None`` it goes before the Triton
kernel where :func:`prefers` says so (a Hopper GPU, half-precision square blocks of 64 or 128, and
a measured speedup in :data:`MEASURED_SPEEDUP`).

The kernel
----------
One program (CTA, one warpgroup of 128 threads) per ``(unit u, column tile t)`` of ``tn``
columns of ``x``. It reads ``start, len, dest`` of its unit from the schedule arrays (scalar loads
from global memory, as JAX's ragged-dot kernels read their group offsets), then loops ``len``
times (a ``fori_loop`` with a dynamic trip count) over the unit's blocks:

- TMA copies bring block ``block_id[j]`` of W (``bh x bw``) and the ``bw x tn`` slab of ``x``
  at block row ``block_col[j]`` into shared memory, swizzled (128-byte swizzle, ``8 x 64``
  tiles) as wgmma wants, each stage with its own pair of barriers. ``stages`` (default 3, or 2
  where 3 do not fit in 227 KiB; more can be forced) copies are in flight: step ``i`` waits for
  stage ``i % stages``, issues the wgmma, waits until at most one wgmma is pending (so the stage of
  step ``i - 1`` is free) and refills that stage with step ``i + stages - 1``.
- ``plgpu.wgmma`` accumulates into a ``(bh, tn)`` float32 register accumulator
  (``bh * tn <= 128 * 128``: 128 registers per thread for one warpgroup).
- The accumulator is written through shared memory with a TMA store to ``y`` (in the output
  dtype) when ``dest >= 0``, or to the float32 partials buffer (slot ``-1 - dest``) for a piece of
  a split row; the shared memory of the pipeline is released first and reused for the store.
- Fused epilogue (``epi``, :mod:`.epilogue`): a row written directly gets ``activation(acc +
  bias)`` on the float32 accumulator before the cast and the store. The tile's bias slice (float32)
  is copied to shared memory by TMA when the program starts, so the copy overlaps the main loop,
  and read in the accumulator's layout (``Layout.WGMMA.reduce``) then broadcast.

Split rows are then summed (an XLA segment sum and a scatter into the split rows only, as
:func:`~.lowering.combine_partials`); with an epilogue, split rows get it there, once, after the
sum. ``n`` is zero-padded to a multiple of ``tn`` (the bias too).

Supported: block sides ``bh, bw`` in {64, 128}; float16 / bfloat16 operands (both of one dtype:
a mix promotes to float32), float32 accumulation, output in float16, bfloat16 or float32; bias
along columns or rows and every activation of :mod:`.epilogue`; a Hopper GPU (compute capability
9.x: wgmma and TMA). Everything else raises ``NotImplementedError`` with the reason (dispatch
then falls back): other blocks, float32 or mixed operands (TF32 wgmma is possible, not written;
this includes the ``x``-gradient of a fused call under ``jax.grad``, whose cotangent is float32).
``dds`` is :mod:`.pallas_mosaic_dds`, ``sdd`` :mod:`.pallas_mosaic_sdd`; a dynamic pattern (both orders)
is :func:`dsd_dynamic`: the same one-program-per-item kernel on a work list built inside ``jit``.

What is verified, and what is not
---------------------------------
The plain kernel has run on an H200: it matched the Triton kernel's error on every benchmark cell,
and the speed is in :data:`MEASURED_SPEEDUP`. On the CPU (``tests/test_pallas_mosaic.py``): it
lowers for CUDA (``jax.jit(f).trace(...).lower(lowering_platforms=("cuda",))`` runs the Pallas ->
Mosaic GPU lowering, which checks the wgmma shapes and layouts, the swizzle transforms and the
shared memory budget), and it runs in Pallas' GPU interpreter (``plgpu.InterpretGPUParams``, used
under ``blocksparse.interpret()``), where it matches the float64 oracle: the schedule reads, the
slices of the TMA copies, the stage indices, empty units and both stores. The interpreter counts
barrier arrivals (a wait with no copy behind it hangs, which caught a one-stage pipeline) but
completes copies when they are issued and runs wgmma synchronously, so a *missing* wait or a stage
refilled too early would go unnoticed there. The fused epilogue and pipelines deeper than 3 stages
are verified that way only; the ``gpu``-marked tests cover them on a Hopper GPU.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from ..._pattern import BlockPattern
from ..._util import cdiv
from .. import _dispatch
from . import epilogue as _epilogue
from . import pallas_mosaic_persistent as pp
from .lowering import GpuLowering, RowSplitSchedule, combine_partials, kernel_constant, lower

__all__ = [
    "MEASURED_SPEEDUP",
    "MosaicBackend",
    "MosaicConfig",
    "MosaicPlan",
    "SUPPORTED_BLOCKS",
    "dsd",
    "dsd_dynamic",
    "hopper_problem",
    "measured_speedup",
    "plan",
    "prefers",
    "skewed",
]

SUPPORTED_BLOCKS = (64, 128)
_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
_OUT_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16), jnp.dtype(jnp.float32))
_TILES = (64, 128, 256)
#: Shared memory one CTA may use on Hopper (227 KiB), less a little for the barriers.
_SMEM_BYTES = 227 * 1024 - 1024
#: Floats of one warpgroup's wgmma accumulator (128 registers per thread).
_MAX_ACC = 128 * 128
_SWIZZLE = 128  # bytes: every operand row here is >= 128 bytes wide (>= 64 two-byte elements)
#: Shared memory of a fused bias slice (float32, at most max(tn, bh) = 256 values).
_BIAS_SMEM = 4 * max(_TILES)
#: The launch orders of :class:`MosaicConfig` ``grid_order``.
GRID_ORDERS = ("tiles", "units")
#: Below this density the default launch order is ``"units"`` (H200, bf16, W 8192 x 8192 at d = 1/64:
#: 0.074 / 0.067 ms against 0.082-0.086 / 0.074-0.077 ms with column tiles fastest for b = 64 / 128 at
#: n = 4096, and no slower at n = 256; at d = 1/4 and 1/16 column tiles first was as fast or faster:
#: b = 64, d = 1/4: 0.345-0.357 ms against 0.373).
UNITS_FIRST_BELOW = 1 / 32


@dataclasses.dataclass(frozen=True)
class MosaicConfig:
    """Tiles of the Mosaic ``dsd`` kernel (``None``: chosen per problem).

    Attributes:
        tn: columns of ``x`` per program, in (64, 128, 256), with ``bh * tn <= 128 * 128``.
        stages: shared-memory pipeline depth (>= 2; default: 3, or 2 where 3 do not fit).
        max_len: force the schedule's cap on blocks per program.
        consumers: warpgroups per program (1 or 2). With 2, each program computes ``2 tn``
            columns, ``tn`` per warpgroup, and W's block is copied once for both (an experiment
            for b = 64, where one warpgroup per SM leaves the tensor cores idle; no epilogue).
        grid_order: which programs are launched fastest: ``"tiles"`` (every column tile of ``x``
            for one unit, then the next unit: the programs running at once share W's blocks and
            read many slabs of ``x``) or ``"units"`` (every unit for one column tile: they share
            one ``k x tn`` slab of ``x`` in L2). ``None``: ``"units"`` below density
            :data:`UNITS_FIRST_BELOW` (rows of one or two blocks: the slab of ``x`` is what is read
            again), else ``"tiles"``.
        persistent: one program per resident slot walks a list of items with one pipeline across
            them (:mod:`.pallas_mosaic_persistent`); no fused epilogue, one warpgroup. ``None``: where
            :func:`prefers_persistent` says so (measured faster), for a plain product.
        programs: the persistent kernel's number of programs (default: as many as are resident on
            the GPU's SMs at once, at most one per item).
        reduce: how the persistent kernel sums rows split across programs: ``"kernel"`` (the row's last
            piece waits for the others' float32 partials and adds them before its one store; every program
            must be resident at once) or ``"xla"`` (every piece writes a partial, XLA sums them after the
            kernel). ``None``: ``"kernel"``, but ``"xla"`` in Pallas' GPU interpreter (it has no semaphores)
            and where ``programs`` exceeds the resident slots.
        cluster: programs per cluster along x's columns (1 or 2). With 2, the programs of two adjacent column
            tiles of one unit run as a cluster and each W block is copied once for both (a TMA multicast); the
            column tiles are padded to an even count (for ``n <= tn`` that is a second, empty tile); one program
            per item (not the persistent kernel), one warpgroup, static matrices. Measured no faster on an H200
            (docs/benchmarks.md): never chosen by default.
    """

    tn: int | None = None
    stages: int | None = None
    max_len: int | None = None
    consumers: int = 1
    grid_order: str | None = None
    persistent: bool | None = None
    programs: int | None = None
    reduce: str | None = None
    cluster: int = 1

    def __post_init__(self):
        if self.tn is not None and self.tn not in _TILES:
            raise ValueError(f"Expected tn in {_TILES}. Got {self.tn}.")
        if self.stages is not None and self.stages < 2:  # one stage would wait before its first copy
            raise ValueError(f"Expected stages >= 2. Got {self.stages}.")
        if self.consumers not in (1, 2):
            raise ValueError(f"Expected consumers 1 or 2. Got {self.consumers}.")
        if self.grid_order not in (None, *GRID_ORDERS):
            raise ValueError(f"Expected grid_order None or one of {GRID_ORDERS}. Got {self.grid_order!r}.")
        if self.programs is not None and (self.persistent is not True or self.programs < 1):
            raise ValueError(f"Expected programs >= 1 with persistent=True. Got programs={self.programs}.")
        if self.persistent and self.consumers != 1:
            raise ValueError(f"Expected consumers=1 with persistent=True. Got {self.consumers}.")
        pp.check_reduce(self.reduce)
        if self.cluster not in (1, 2):
            raise ValueError(f"Expected cluster 1 or 2. Got {self.cluster}.")
        if self.cluster > 1 and (self.persistent or self.consumers != 1):
            raise ValueError(
                f"Expected persistent not True and consumers=1 with cluster={self.cluster}. "
                f"Got persistent={self.persistent}, consumers={self.consumers}."
            )


@dataclasses.dataclass(frozen=True)
class MosaicPlan:
    """Everything the host prepares for one ``dsd`` call (see :func:`plan`).

    Attributes:
        tn: columns of ``x`` per program.
        tiles: column tiles (``n_pad // tn``); the grid is ``(sched.num_units, tiles)``.
        n_pad: ``n`` rounded up to a multiple of ``tn`` (``x`` is zero-padded to it).
        stages: shared-memory pipeline depth.
        sched: the work list.
        consumers: warpgroups per program, each on ``tn`` columns (a program covers ``consumers * tn``).
        grid_order: ``"tiles"`` or ``"units"``: which programs launch fastest (see :class:`MosaicConfig`).
        cluster: programs per cluster along the column tiles (``tiles`` is then a multiple of it).
    """

    tn: int
    tiles: int
    n_pad: int
    stages: int
    sched: RowSplitSchedule
    consumers: int = 1
    grid_order: str = "tiles"
    persistent: object = None  # a pallas_mosaic_persistent.PersistentSchedule, or None: one program per item
    cluster: int = 1

    @property
    def grid(self) -> tuple[tuple[int, int], tuple[str, str]]:
        """The kernel's grid (of clusters) and axis names: Mosaic GPU launches the *last* dimension fastest (it
        reverses the grid onto CUDA's ``x, y, z``)."""
        tiles = self.tiles // self.cluster
        if self.grid_order == "tiles":
            return (self.sched.num_units, tiles), ("u", "t")
        return (tiles, self.sched.num_units), ("t", "u")

    @property
    def cluster_shape(self) -> dict:
        """``plgpu.kernel``'s cluster arguments: ``cluster`` programs along the column tiles, axis ``"c"``."""
        if self.cluster == 1:
            return {}
        along_tiles = self.grid_order == "tiles"
        shape = (1, self.cluster) if along_tiles else (self.cluster, 1)
        return dict(cluster=shape, cluster_names=("cu", "c") if along_tiles else ("c", "cu"))

    def smem_bytes(self, bh: int, bw: int, itemsize: int, out_itemsize: int | None = None) -> int:
        """Shared memory of the pipeline (one warpgroup: the output staging buffer reuses it afterwards;
        two: plus their own output and float32 staging buffers; the persistent kernel: plus its output
        staging tile and, with split rows, a float32 one)."""
        pipeline = self.stages * (bh * bw + bw * self.tn * self.consumers) * itemsize
        out = out_itemsize or itemsize
        if self.persistent is not None:
            return pipeline + bh * self.tn * (out + pp.staging_bytes(self.persistent))
        return pipeline + (0 if self.consumers == 1 else self.consumers * bh * self.tn * (out + 4))


def default_grid_order(pattern: BlockPattern, persistent: bool = False) -> str:
    """The launch order :func:`plan` takes when the config names none: for the persistent kernel column
    tiles first (measured faster at every density), else see :data:`UNITS_FIRST_BELOW`."""
    if persistent:
        return "tiles"
    density = pattern.nnz_blocks / max(pattern.grid[0] * pattern.grid[1], 1)
    return "units" if density < UNITS_FIRST_BELOW else "tiles"


def _default_tn(bh: int, n: int, rows: int) -> int:
    """The Triton kernel's measured choice (docs/kernels.md), bounded by one warpgroup's registers."""
    if n <= 64:
        return 64
    if n >= 2048:  # H200, n = 4096, b = 64: 128 columns beat 256 (0.367 vs 0.391 ms at d = 1/4, 0.130 vs 0.148 at 1/16)
        return 128
    if rows * cdiv(n, 128) < 132:  # too few programs for the 132 SMs: narrower tiles
        return 64
    return 128


def plan(
    pattern: BlockPattern,
    n: int,
    itemsize: int = 2,
    config: MosaicConfig | None = None,
    extra_smem: int = 0,
    out_itemsize: int | None = None,
    fused: bool = False,
) -> MosaicPlan:
    """The host-side preparation of ``W @ x`` for ``x`` of ``n`` columns (NumPy; the schedule is cached).

    ``itemsize``: bytes of an operand element; ``out_itemsize``: of an output element (default
    ``itemsize``); ``extra_smem``: bytes of shared memory the kernel holds besides the pipeline (the
    bias slice); ``fused``: a fused epilogue follows (the persistent kernel has none). Raises
    ``NotImplementedError`` if the kernel cannot take these blocks or tiles.
    """
    cfg = config or MosaicConfig()
    if cfg.persistent is None and cfg.cluster > 1:
        cfg = dataclasses.replace(cfg, persistent=False)
    if cfg.persistent is None:  # the measured rules; where the persistent kernel cannot take the tiles, the other
        per_item = functools.partial(plan, pattern, n, itemsize, dataclasses.replace(cfg, persistent=False),
                                     extra_smem, out_itemsize, fused)  # fmt: skip
        if fused or cfg.consumers != 1:
            return per_item()
        p = None if prefers_persistent(pattern, n) else per_item()
        if p is None or _splits_many(p.sched):  # by the table, or skewed (see skewed())
            try:
                return plan(pattern, n, itemsize, dataclasses.replace(cfg, persistent=True), extra_smem, out_itemsize)
            except NotImplementedError:
                pass
        return p or per_item()
    bh, bw = pattern.block_size
    if bh not in SUPPORTED_BLOCKS or bw not in SUPPORTED_BLOCKS:
        raise NotImplementedError(
            f"requires block sides in {SUPPORTED_BLOCKS} (wgmma tiles of a 128-byte swizzle, M a multiple of 64) "
            f"(got ({bh}, {bw}))"
        )
    tn = cfg.tn or _default_tn(bh, n, pattern.grid[0])
    if bh * tn > _MAX_ACC:
        raise NotImplementedError(
            f"requires bh * tn <= {_MAX_ACC} (a float32 accumulator in one warpgroup's registers) (got {bh} * {tn})"
        )
    c = cfg.consumers
    tiles = cdiv(n, tn * c * cfg.cluster) * cfg.cluster
    max_len = cfg.max_len
    if cfg.persistent and max_len is None:  # split only rows longer than a program's share of the steps
        # The share of one program per SM, even where two fit: a finer cap would split more rows (b = 64:
        # 0.164 ms at d = 1/16 with splits summed by XLA, 0.134-0.142 without, H200).
        slots = cfg.programs or pp.device_sms()
        max_len = pp.share(pattern.nnz_blocks, tiles, slots)
    sched = lower(pattern, GpuLowering(op="dsd", tiles=tiles, max_len=max_len))
    if c > 1:
        # the warpgroups' output and float32 staging buffers (the pipeline's memory is not reused)
        extra_smem += c * bh * tn * ((out_itemsize or itemsize) + 4)
    per_stage = (bh * bw + bw * tn * c) * itemsize
    order = cfg.grid_order or default_grid_order(pattern, cfg.persistent)
    if cfg.persistent:  # its own output staging tile (and a float32 one where XLA sums split rows)
        stages, persistent = pp.plan_persistent(sched, tiles, order, per_stage, bh * tn, extra_smem,
                                                out_itemsize or itemsize, cfg)  # fmt: skip
        return MosaicPlan(tn=tn, tiles=tiles, n_pad=tiles * tn, stages=stages, sched=sched, grid_order=order,
                          persistent=persistent)  # fmt: skip
    stages = _stages(cfg.stages, per_stage, extra_smem)
    return MosaicPlan(tn=tn, tiles=tiles, n_pad=tiles * tn * c, stages=stages, sched=sched, consumers=c,
                      grid_order=order, cluster=cfg.cluster)  # fmt: skip


def _stages(forced: int | None, per_stage: int, extra_smem: int) -> int:
    """The pipeline depth: ``forced``, or 3 where 3 fit in shared memory next to ``extra_smem`` bytes, else 2;
    ``NotImplementedError`` where it does not fit."""
    fit = (_SMEM_BYTES - extra_smem) // per_stage
    stages = forced or min(3, fit)
    if stages > fit or stages < 2:
        raise NotImplementedError(
            f"requires stages * {per_stage} bytes <= {_SMEM_BYTES - extra_smem} of shared memory (got stages={stages})"
        )
    return stages


def _operand_transforms(dtype):
    """Shared-memory layout of a wgmma operand: 8-row tiles, 128-byte swizzle."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    return (plgpu.TilingTransform((8, _SWIZZLE // jnp.dtype(dtype).itemsize)), plgpu.SwizzleTransform(_SWIZZLE))


def _consume(acc_ref, a_smem, b_smem, a_bar, b_bar, i, stages: int, count, fetch, transposed=(False, False),
             free=None):  # fmt: skip
    """Step ``i`` of a ``stages``-deep pipeline of ``count`` steps: wait for stage ``i % stages``, issue
    ``acc_ref += a @ b`` on it, wait until at most that wgmma is pending (step ``i - 1``'s stage is then
    free) and refill that stage with ``fetch(i + stages - 1)``.

    ``transposed``: whether the ``a`` / ``b`` tiles are stored transposed (wgmma reads them through a
    transposed view of shared memory). ``free``: the cluster barriers of a multicast ``a`` (see
    :func:`_pipelined_wgmma`): this program says it is done with step ``i - 1``'s stage, and ``fetch`` waits
    for every program of the cluster to have said so before the multicast refills that stage in all of them."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    slot = lax.rem(i, stages)
    plgpu.barrier_wait(a_bar.at[slot])
    plgpu.barrier_wait(b_bar.at[slot])
    a, b = a_smem.at[slot], b_smem.at[slot]
    a = a.transpose((1, 0)) if transposed[0] else a
    b = b.transpose((1, 0)) if transposed[1] else b
    plgpu.wgmma(acc_ref, a, b)
    plgpu.wgmma_wait(1)
    nxt = i + stages - 1
    if free is None:
        pl.when(nxt < count)(lambda: fetch(nxt))
        return

    # Only a stage that is refilled is announced: every arrival then lands on a barrier its program still waits on
    # (the programs of a cluster run the same steps), so none reaches a program that has exited.
    @pl.when(nxt < count)
    def _():
        pl.when(i > 0)(lambda: plgpu.barrier_arrive(free.at[lax.rem(nxt, stages)]))
        fetch(nxt, wait=i > 0)


def _pipelined_wgmma(acc_ref, length, stages: int, a_src, b_src, a_tile, b_tile, dtype, transposed=(False, False),
                     a_cluster: str | None = None):  # fmt: skip
    """``acc_ref += a_src(i) @ b_src(i)`` for ``i < length`` and the accumulator's value.

    ``a_src(i)`` / ``b_src(i)``: global-memory slices of shapes ``a_tile`` / ``b_tile``, TMA-copied into
    swizzled shared memory, ``stages`` steps in flight: step ``i`` waits for its stage, issues the
    wgmma, waits until at most one wgmma is pending (step ``i - 1``'s stage is then free) and refills
    that stage with step ``i + stages - 1``. ``transposed``: the tiles of ``a`` / ``b`` are stored
    transposed (``a_tile`` / ``b_tile`` are then the stored shapes).

    ``a_cluster``: a cluster axis whose programs all run this pipeline with the same ``a_src`` and ``length``
    (their own ``b_src``): ``a`` is then copied once for all of them (a TMA multicast), and a stage is refilled
    only once every program of the cluster has finished with it (a cluster barrier per stage).
    """
    from jax.experimental.pallas import mosaic_gpu as plgpu

    def pipeline(a_smem, b_smem, a_bar, b_bar, *free):
        free = free[0] if free else None

        def fetch(i, wait=False):  # step i's operands into stage i % stages
            slot = lax.rem(i, stages)
            if a_cluster is None:
                plgpu.copy_gmem_to_smem(a_src(i), a_smem.at[slot], a_bar.at[slot])
                plgpu.copy_gmem_to_smem(b_src(i), b_smem.at[slot], b_bar.at[slot])
                return
            plgpu.copy_gmem_to_smem(b_src(i), b_smem.at[slot], b_bar.at[slot])  # this program's own: no wait
            if wait is not False:  # the stage's previous step is done in every program of the cluster
                pl.when(wait)(lambda: plgpu.barrier_wait(free.at[slot]))
            plgpu.copy_gmem_to_smem(a_src(i), a_smem.at[slot], a_bar.at[slot], collective_axes=a_cluster)

        for i in range(stages - 1):  # prologue: fill all stages but one
            pl.when(i < length)(functools.partial(fetch, i))

        def step(i, carry):
            _consume(acc_ref, a_smem, b_smem, a_bar, b_bar, i, stages, length, fetch, transposed, free)
            return carry

        lax.fori_loop(0, length, step, None)
        plgpu.wgmma_wait(0)

    transforms = _operand_transforms(dtype)
    free = () if a_cluster is None else (plgpu.ClusterBarrier(collective_axes=(a_cluster,), num_barriers=stages),)
    pl.run_scoped(
        pipeline,
        plgpu.SMEM((stages, *a_tile), dtype, transforms=transforms),
        plgpu.SMEM((stages, *b_tile), dtype, transforms=transforms),
        plgpu.Barrier(num_barriers=stages),
        plgpu.Barrier(num_barriers=stages),
        *free,
    )
    return acc_ref[...]


def _store_tile(out_g, rows, cols, value):
    """``out_g[rows, cols] = value`` (a register tile, cast to ``out_g``'s dtype) through shared memory."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    def scope(o_smem):
        o_smem[...] = value.astype(o_smem.dtype)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(o_smem, out_g.at[rows, cols])
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)

    pl.run_scoped(scope, plgpu.SMEM(value.shape, out_g.dtype))


def _apply_epilogue(acc, epi, bias_smem, bias_bar):
    """``activation(acc + bias)`` on the float32 accumulator (``acc`` without an epilogue); the bias
    slice, if any, is waited for in shared memory and broadcast along ``epi.bias_axis``."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    if epi is None:
        return acc
    bias = None
    if bias_smem is not None:
        plgpu.barrier_wait(bias_bar.at[0])
        b = plgpu.load(bias_smem, layout=plgpu.Layout.WGMMA.reduce(1 - epi.bias_axis))
        bias = lax.broadcast_in_dim(b, acc.shape, (epi.bias_axis,))
    return _epilogue.apply(acc, bias, epi.activation)


def _with_bias_buffer(run, bias_g, size: int):
    """``run()``, or ``run(bias_smem, bias_bar)`` with a float32 buffer of ``size`` for the bias slice."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    if bias_g is None:
        run()
    else:
        pl.run_scoped(run, plgpu.SMEM((size,), jnp.float32), plgpu.Barrier(num_barriers=1))


def _dsd_kernel(start_g, len_g, dest_g, col_g, id_g, w_g, x_g, *refs, bh, bw, tn, stages, epi=None,
                transposed=False, cluster=1):  # fmt: skip
    """Program ``(u, t)``: unit ``u`` of the schedule times columns ``[t * tn, (t + 1) * tn)``.

    ``refs``: ``(bias_g,)`` when ``epi`` has a bias, then ``y_g, p_g``. ``transposed``: ``w_g`` holds each
    block transposed (``bw x bh``, a dynamic ``x @ D``'s blocks), read through a transposed shared-memory view.
    ``cluster``: programs per cluster (axis ``"c"``) on adjacent column tiles of one unit, W's blocks multicast.
    """
    from jax.experimental.pallas import mosaic_gpu as plgpu

    bias_g, (y_g, p_g) = (refs[0], refs[1:]) if epi is not None and epi.bias else (None, refs)
    u = lax.axis_index("u")
    t = lax.axis_index("t") if cluster == 1 else lax.axis_index("t") * cluster + lax.axis_index("c")
    n0 = pl.multiple_of(t * tn, tn)
    start = start_g[u]
    length = len_g[u]
    dest = dest_g[u]

    def accumulate(acc_ref):
        wr, w_tile = (bw, (bw, bh)) if transposed else (bh, (bh, bw))
        return _pipelined_wgmma(
            acc_ref, length, stages,
            lambda i: w_g.at[pl.ds(id_g[start + i] * wr, wr), :],
            lambda i: x_g.at[pl.ds(col_g[start + i] * bw, bw), pl.ds(n0, tn)],
            w_tile, (bw, tn), w_g.dtype, transposed=(transposed, False), a_cluster=None if cluster == 1 else "c",
        )  # fmt: skip

    def run(bias_smem=None, bias_bar=None):
        if bias_g is not None:  # this tile's bias slice: its copy overlaps the whole main loop
            piece = pl.ds(n0, tn) if epi.bias_axis == 1 else pl.ds(jnp.maximum(dest, 0) * bh, bh)
            plgpu.copy_gmem_to_smem(bias_g.at[piece], bias_smem, bias_bar.at[0])
        acc = pl.run_scoped(accumulate, plgpu.ACC((bh, tn), jnp.float32))  # zero-initialised: empty units write 0

        def store_direct():  # bias and activation on the float32 accumulator, then the one cast
            _store_tile(y_g, pl.ds(dest * bh, bh), pl.ds(n0, tn), _apply_epilogue(acc, epi, bias_smem, bias_bar))

        def store_partial():  # a piece of a split row: the epilogue runs after the pieces are summed
            if bias_g is not None:
                plgpu.barrier_wait(bias_bar.at[0])  # every issued copy is waited for before the kernel exits
            _store_tile(p_g, pl.ds((-1 - dest) * bh, bh), pl.ds(n0, tn), acc)

        pl.when(dest >= 0)(store_direct)
        pl.when(dest < 0)(store_partial)

    _with_bias_buffer(run, bias_g, tn if epi is not None and epi.bias_axis == 1 else bh)


def _dsd_kernel_2wg(start_g, len_g, dest_g, col_g, id_g, w_g, x_g, y_g, p_g, *, bh, bw, tn, stages):
    """Program ``(u, t)`` with two consumer warpgroups ``g``: columns ``[(2 t + g) tn, (2 t + g + 1) tn)``.

    Warpgroup 0 issues every TMA copy: W's block once for both, and the ``bw x 2 tn`` slab of x.
    Both wait for a stage's copies; after its wgmma of step ``i`` has been issued and step ``i - 1``'s
    has finished, each warpgroup arrives at the stage of step ``i - 1``'s "free" barrier (two
    arrivals), which warpgroup 0 waits for before refilling that stage.
    """
    from jax.experimental.pallas import mosaic_gpu as plgpu

    u = lax.axis_index("u")
    wg = lax.axis_index("wg")
    c0 = pl.multiple_of(lax.axis_index("t") * 2 * tn, 2 * tn)
    start = start_g[u]
    length = len_g[u]
    dest = dest_g[u]
    dtype = w_g.dtype
    transforms = _operand_transforms(dtype)
    leader = wg == 0

    def body(w_smem, x_smem, w_bar, x_bar, free_bar, y_smem, p_smem):
        def fetch(i):
            slot = lax.rem(i, stages)
            j = start + i
            plgpu.copy_gmem_to_smem(w_g.at[pl.ds(id_g[j] * bh, bh), :], w_smem.at[slot], w_bar.at[slot])
            plgpu.copy_gmem_to_smem(x_g.at[pl.ds(col_g[j] * bw, bw), pl.ds(c0, 2 * tn)], x_smem.at[slot],
                                    x_bar.at[slot])  # fmt: skip

        for i in range(stages - 1):
            pl.when(leader & (i < length))(functools.partial(fetch, i))

        def compute(acc_ref):
            def step(i, carry):
                slot = lax.rem(i, stages)
                plgpu.barrier_wait(w_bar.at[slot])
                plgpu.barrier_wait(x_bar.at[slot])
                plgpu.wgmma(acc_ref, w_smem.at[slot], x_smem.at[slot].at[:, pl.ds(wg * tn, tn)])
                plgpu.wgmma_wait(1)  # this warpgroup is done with step i - 1's stage
                prev = lax.rem(i + stages - 1, stages)
                pl.when(i > 0)(lambda: plgpu.barrier_arrive(free_bar.at[prev]))
                nxt = i + stages - 1  # refills step i - 1's stage (for i = 0, the never used last stage)

                @pl.when(leader & (nxt < length))
                def _():
                    pl.when(i > 0)(lambda: plgpu.barrier_wait(free_bar.at[prev]))
                    fetch(nxt)

                return carry

            lax.fori_loop(0, length, step, None)
            plgpu.wgmma_wait(0)
            return acc_ref[...]

        acc = pl.run_scoped(compute, plgpu.ACC((bh, tn), jnp.float32))  # one per warpgroup
        n0 = c0 + wg * tn

        def store(out_g, o_smem, row):
            o_smem[...] = acc.astype(o_smem.dtype)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(o_smem, out_g.at[pl.ds(row * bh, bh), pl.ds(n0, tn)])
            plgpu.wait_smem_to_gmem(0, wait_read_only=True)

        pl.when(dest >= 0)(lambda: store(y_g, y_smem.at[wg], dest))
        pl.when(dest < 0)(lambda: store(p_g, p_smem.at[wg], -1 - dest))

    pl.run_scoped(
        body,
        plgpu.SMEM((stages, bh, bw), dtype, transforms=transforms),
        plgpu.SMEM((stages, bw, 2 * tn), dtype, transforms=transforms),
        plgpu.Barrier(num_barriers=stages),
        plgpu.Barrier(num_barriers=stages),
        plgpu.Barrier(num_arrivals=2, num_barriers=stages),
        plgpu.SMEM((2, bh, tn), y_g.dtype),
        plgpu.SMEM((2, bh, tn), jnp.float32),
        collective_axes="wg",
    )


def _launch(p: MosaicPlan, m: int, data, xp, out_dtype, *, interpret, epi=None, bias=(), transposed=False):
    """Run the kernel: ``(y (m, n_pad) in out_dtype, partials (S * bh, n_pad) float32)``.

    ``epi``: an :class:`~.epilogue.Epilogue` for the directly written rows; ``bias``: ``()`` or
    ``(float32 bias padded to n_pad or m,)``; ``transposed``: ``data`` holds W's blocks transposed.
    """
    from jax.experimental.pallas import mosaic_gpu as plgpu

    _, bh, bw = data.shape[:1] + (data.shape[1:][::-1] if transposed else data.shape[1:])
    s = p.sched
    if p.consumers == 2:
        body = functools.partial(_dsd_kernel_2wg, bh=bh, bw=bw, tn=p.tn, stages=p.stages)
        threads = dict(num_threads=2, thread_name="wg")
    else:
        body = functools.partial(_dsd_kernel, bh=bh, bw=bw, tn=p.tn, stages=p.stages, epi=epi, transposed=transposed,
                                 cluster=p.cluster)  # fmt: skip
        threads = p.cluster_shape
    kernel = plgpu.kernel(
        body,
        out_type=(
            jax.ShapeDtypeStruct((m, p.n_pad), out_dtype),
            jax.ShapeDtypeStruct((max(s.num_partials, 1) * bh, p.n_pad), jnp.float32),
        ),
        grid=p.grid[0],
        grid_names=p.grid[1],
        kernel_name=f"bs_mgpu_dsd_{bh}x{bw}_tn{p.tn}"
        + ("_epi" if epi is not None else "")
        + ("_2wg" if p.consumers == 2 else "")
        + ("_units_fastest" if p.grid_order == "units" else "")
        + ("_wt" if transposed else "")
        + (f"_cluster{p.cluster}" if p.cluster > 1 else ""),
        interpret=plgpu.InterpretGPUParams() if interpret is True else interpret,
        **threads,
    )
    return kernel(
        *map(kernel_constant, (s.unit_start, s.unit_len, s.unit_dest, s.block_col, s.block_id)),
        data.reshape(-1, data.shape[-1]),
        xp,
        *bias,
    )


def _combine(y, partials, sched: RowSplitSchedule, bh: int, epi, bias):
    """:func:`~.lowering.combine_partials` with the epilogue on the summed split rows (XLA)."""
    if epi is None or sched.num_partials == 0:
        return combine_partials(y, partials, sched, bh)
    r = sched.split_rows.shape[0]
    parts = partials[: sched.num_partials * bh].reshape(sched.num_partials, bh, -1)
    sums = jax.ops.segment_sum(parts, sched.partial_seg, num_segments=r)  # (r, bh, n_pad) float32
    b = None
    if bias:
        b = bias[0][None, None, :] if epi.bias_axis == 1 else bias[0].reshape(-1, bh)[sched.split_rows][:, :, None]
    sums = _epilogue.apply(sums, b, epi.activation)
    y3 = y.reshape(-1, bh, y.shape[1])
    return y3.at[sched.split_rows].set(sums.astype(y.dtype), mode="drop").reshape(y.shape)


def dsd(pattern: BlockPattern, data, x, out_dtype=None, *, config: MosaicConfig | None = None, interpret=None,
        epi: _epilogue.Epilogue | None = None, bias=None):  # fmt: skip
    """``W @ x`` with the Mosaic GPU kernel (no hardware check: see :class:`MosaicBackend`).

    Arguments:
        pattern: W's block pattern, blocks in ``SUPPORTED_BLOCKS``.
        data: W's blocks ``(nnz, bh, bw)``; x: ``(k, n)``; both float16 or bfloat16 (promoted to one).
        out_dtype: the result dtype (default: the operands'); float16, bfloat16 or float32.
        config: a :class:`MosaicConfig`.
        interpret: run in Pallas' GPU interpreter on the CPU (default: ``blocksparse.interpret()``); a
            ``plgpu.InterpretGPUParams`` passes its options (e.g. ``detect_races=True``).
        epi: an optional :class:`~.epilogue.Epilogue` (bias, activation) applied to the float32
            accumulator before the one store of each output tile; ``bias`` its array (``(n,)`` for
            ``bias_axis=1``, ``(m,)`` for ``bias_axis=0``).
    """
    m, k = pattern.shape
    bh, bw = pattern.block_size
    if x.ndim != 2 or x.shape[0] != k:
        raise ValueError(f"Expected x of shape ({k}, n). Got {tuple(x.shape)}.")
    n = x.shape[1]
    _check_operands(pattern, data, epi, bias, (m, n))
    dt, out_dtype = _dtypes(data.dtype, x.dtype, out_dtype)
    with_bias = epi is not None and epi.bias
    if epi is not None and config is not None and config.consumers > 1:
        raise NotImplementedError("requires consumers=1 for a fused epilogue (not written for two warpgroups)")
    if epi is not None and config is not None and config.persistent:
        raise NotImplementedError("requires persistent=False for a fused epilogue (not written for that kernel)")
    if interpret is None:
        interpret = _dispatch.interpreting()
    p = plan(pattern, n, jnp.dtype(dt).itemsize, pp.resolve_reduce(config or MosaicConfig(), interpret),
             _BIAS_SMEM if with_bias else 0, out_dtype.itemsize, fused=epi is not None)  # fmt: skip
    if n == 0:
        return jnp.zeros((m, n), out_dtype)
    if pattern.nnz_blocks == 0:
        return _epilogue.reference(jnp.zeros((m, n), jnp.float32), bias, epi, out_dtype)
    xp, b = _padded(x, bias, epi, dt, p.n_pad)
    if p.persistent is not None:
        y, partials = pp.launch(p.persistent, "dsd", (m, p.n_pad), p.tn, p.stages, data.astype(dt), xp, out_dtype,
                                interpret=interpret)  # fmt: skip
        if not p.persistent.reduce:
            y = combine_partials(y, partials, p.sched, bh)
    else:
        y, partials = _launch(p, m, data.astype(dt), xp, out_dtype, interpret=interpret, epi=epi, bias=b)
        y = _combine(y, partials, p.sched, bh, epi, b)
    return y[:, :n] if p.n_pad != n else y


def _padded(x, bias, epi, dt, n_pad: int):
    """``(x in dt with its columns zero-padded to n_pad, () or (float32 bias,))``: a bias along columns is padded
    like ``x``, so every tile's TMA copy stays inside the arrays."""
    xp = jnp.pad(x.astype(dt), ((0, 0), (0, n_pad - x.shape[1])))
    if epi is None or not epi.bias:
        return xp, ()
    b = bias.astype(jnp.float32)
    return xp, (jnp.pad(b, (0, n_pad - x.shape[1])) if epi.bias_axis == 1 else b,)


def dsd_dynamic(rows, cols, keep, valid, data, x, num_rows: int, out_dtype=None, *, transposed: bool = False,
                config: MosaicConfig | None = None, interpret=None, epi: _epilogue.Epilogue | None = None,
                bias=None):  # fmt: skip
    """``W @ x`` for a traced block COO (a dynamic matrix) with the one-program-per-item kernel; NaN where
    ``valid`` (traced bool) is false.

    The work list is built inside ``jit`` (:func:`~.lowering.redistribute`: units of at most ``max_len``
    blocks, long rows split into float32 partials that XLA sums after the kernel), with room for every block
    of the capacity, so the grid is static: units beyond the live ones have no blocks and write a dummy
    partial slot. ``rows``, ``cols``, ``keep``: ``int32[C]``, ``int32[C]``, ``bool[C]`` (``keep`` masks
    padding); ``data``: ``(C, bh, bw)``, or ``(C, bw, bh)`` with ``transposed`` (each stored block is W's
    block transposed, as for ``x @ D``; read through a transposed shared-memory view, no copy);
    ``num_rows``: W's block rows. ``config``: ``tn``, ``stages``, ``max_len`` and ``grid_order`` of
    :class:`MosaicConfig` (the persistent kernel and two warpgroups take static patterns only). ``epi`` /
    ``bias`` as for :func:`dsd`.
    """
    from .lowering import redistribute
    from .reference import poison

    cfg = config or MosaicConfig()
    if cfg.persistent or cfg.consumers != 1 or cfg.cluster != 1:
        raise NotImplementedError(
            f"requires persistent=False, consumers=1 and cluster=1 for a dynamic matrix (got persistent="
            f"{cfg.persistent}, consumers={cfg.consumers}, cluster={cfg.cluster})"
        )
    bh, bw = data.shape[1:][::-1] if transposed else data.shape[1:]
    if bh not in SUPPORTED_BLOCKS or bw not in SUPPORTED_BLOCKS:
        raise NotImplementedError(f"requires block sides in {SUPPORTED_BLOCKS} (got ({bh}, {bw}))")
    if x.ndim != 2:
        raise ValueError(f"Expected x of shape (k, n). Got {tuple(x.shape)}.")
    dt, out_dtype = _dtypes(data.dtype, x.dtype, out_dtype)
    m, (k, n) = num_rows * bh, x.shape
    cap = int(data.shape[0])
    if cap == 0 or n == 0 or k == 0:
        return poison(valid, _epilogue.reference(jnp.zeros((m, n), jnp.float32), bias, epi, out_dtype))
    if interpret is None:
        interpret = _dispatch.interpreting()
    tn = cfg.tn or _default_tn(bh, n, num_rows)
    if bh * tn > _MAX_ACC:
        raise NotImplementedError(f"requires bh * tn <= {_MAX_ACC} (got {bh} * {tn})")
    with_bias = epi is not None and epi.bias
    extra = _BIAS_SMEM if with_bias else 0
    stages = _stages(cfg.stages, (bh * bw + bw * tn) * jnp.dtype(dt).itemsize, extra)
    density = cap / max(num_rows * max(k // bw, 1), 1)  # at full capacity
    order = cfg.grid_order or ("units" if density < UNITS_FIRST_BELOW else "tiles")
    sched = redistribute(rows, cols, keep, num_rows, cfg.max_len)
    tiles = cdiv(n, tn)
    p = MosaicPlan(tn=tn, tiles=tiles, n_pad=tiles * tn, stages=stages, sched=sched, grid_order=order)
    xp, b = _padded(x, bias, epi, dt, p.n_pad)
    y, partials = _launch(p, m, data.astype(dt), xp, out_dtype, interpret=interpret, epi=epi, bias=b,
                          transposed=transposed)  # fmt: skip
    y = _combine(y, partials, sched, bh, epi, b)
    return poison(valid, y[:, :n] if p.n_pad != n else y)


def _check_operands(pattern: BlockPattern, data, epi, bias, lengths: tuple[int, int]) -> None:
    """``ValueError`` unless ``data`` holds ``pattern``'s blocks and ``bias`` is given exactly when ``epi`` has one,
    of the product's length along ``epi.bias_axis`` (``lengths``: the product's two dimensions)."""
    want = (pattern.nnz_blocks, *pattern.block_size)
    if tuple(data.shape) != want:
        raise ValueError(f"Expected data of shape {want}. Got {tuple(data.shape)}.")
    with_bias = epi is not None and epi.bias
    if with_bias != (bias is not None):
        raise ValueError(f"Expected a bias array exactly when the epilogue has a bias ({epi}). Got {bias is not None}.")
    if with_bias and tuple(bias.shape) != (lengths[epi.bias_axis],):
        want = (lengths[epi.bias_axis],)
        raise ValueError(f"Expected a bias of shape {want} (bias_axis={epi.bias_axis}). Got {tuple(bias.shape)}.")


def _dtypes(a_dtype, b_dtype, out_dtype) -> tuple[jnp.dtype, jnp.dtype]:
    """``(operand dtype, output dtype)`` of a Mosaic kernel (the output defaults to the operands'); raises
    ``NotImplementedError`` naming what the kernels take where they cannot take these."""
    dt = jnp.dtype(jnp.result_type(a_dtype, b_dtype))
    if dt not in _DTYPES:
        raise NotImplementedError(
            f"requires float16 or bfloat16 operands of one dtype (got {jnp.dtype(a_dtype)}, {jnp.dtype(b_dtype)})"
        )
    out_dtype = jnp.dtype(out_dtype or dt)
    if out_dtype not in _OUT_DTYPES:
        raise NotImplementedError(f"requires a float16, bfloat16 or float32 output (got {out_dtype})")
    return dt, out_dtype


def hopper_problem() -> str | None:
    """Why the kernel cannot run on this machine's default device, or ``None`` if it is a Hopper GPU."""
    try:
        dev = jax.devices()[0]
    except RuntimeError as e:  # no backend initialised
        return f"no device ({e})"
    if dev.platform != "gpu":
        return f"no GPU (default device is {dev.platform!r}: {dev.device_kind})"
    cc = getattr(dev, "compute_capability", None)
    try:
        major = int(str(cc).split(".")[0])
    except ValueError:
        return f"requires a Hopper GPU (compute capability 9.x); got {dev.device_kind} (compute capability {cc!r})"
    if major != 9:
        return (
            f"requires a Hopper GPU (compute capability 9.x: wgmma and TMA); got {dev.device_kind} "
            f"(compute capability {cc})"
        )
    return None


# --------------------------------------------------------------------------------------------
# Default dispatch: where the Mosaic kernel goes before the Triton one. The one rule, from one table.
# --------------------------------------------------------------------------------------------
#: Mosaic / Triton speedup (Triton's time over Mosaic's) measured on an H200 (bf16; W 8192 x 8192 of
#: uniform random b x b blocks at density d, x 8192 x n; each kernel's median in one jitted loop,
#: ``benchmarks/bench_mosaic.py --persistent``; the Mosaic kernel as :func:`plan` now chooses it: the
#: persistent kernel where :data:`PERSISTENT_SPEEDUP` says so, else one program per item; 128-column
#: tiles (64 for b = 128 at n = 256); 3 stages). jnp.dot took 0.66-0.75 ms at n = 4096, 0.066-0.075 ms
#: at n = 256. Times, ms (Triton / Mosaic):
#:
#:     (b, n)       d = 1/4           1/16              1/64              (persistent kernel where marked P)
#:     (64, 4096)   0.96 (.344/.359)  0.92 (.127/.138)  1.11 (.072/.065) P
#:     (64, 256)    1.33 (.057/.043) P 1.00 (.030/.030) P 0.88 (.022/.025)
#:     (128, 4096)  1.52 (.439/.289) P 1.51 (.153/.101) P 1.30 (.083/.064) P
#:     (128, 256)   1.75 (.070/.040) P 0.78 (.036/.046)  1.23 (.027/.022) P
MEASURED_SPEEDUP = {  # the smaller of two runs on the H200 (n = 256 times are tens of microseconds and vary)
    (64, 4096): {1 / 4: 0.96, 1 / 16: 0.92, 1 / 64: 1.11},
    (64, 256): {1 / 4: 1.33, 1 / 16: 1.00, 1 / 64: 0.88},
    (128, 4096): {1 / 4: 1.52, 1 / 16: 1.51, 1 / 64: 1.30},
    (128, 256): {1 / 4: 1.75, 1 / 16: 0.78, 1 / 64: 1.23},
}
#: Mosaic goes first only where it measured at least this much faster: a tie stays with Triton,
#: the kernel that also serves the backward's sdd and every other op.
PREFER_MARGIN = 1.05
#: Below this many columns nothing was measured, and Mosaic's tiles (>= 64 columns) would pad a
#: narrow x more than Triton's (>= 16): Triton stays first.
PREFER_MIN_N = 128


def _nearest(value: float, measured) -> float:
    """The measured point nearest to ``value`` on a log scale: the largest whose geometric midpoint
    with the next smaller point is <= ``value`` (a value on a midpoint goes to the larger point)."""
    points = sorted(measured, reverse=True)
    for hi, lo in zip(points, points[1:], strict=False):  # one pair fewer than points
        if value >= math.sqrt(lo * hi):
            return hi
    return points[-1]


def measured_speedup(block: int, n: int, density: float) -> float:
    """The :data:`MEASURED_SPEEDUP` cell nearest to ``(block, n, density)`` on log scales: n < 1024
    reads the n = 256 row, n >= 1024 the n = 4096 row; density >= 1/8 the 1/4 column, [1/32, 1/8)
    the 1/16 column, < 1/32 the 1/64 column."""
    return _nearest_cell(MEASURED_SPEEDUP, block, n, density)


#: Persistent / one-program-per-item speedup of the Mosaic ``dsd`` kernel (the default kernel's time over
#: the persistent one's, same run, H200, bf16, as :data:`MEASURED_SPEEDUP`; ``bench_mosaic.py --persistent``;
#: the smaller of two runs). The persistent kernel is the default where the nearest cell is >= PREFER_MARGIN.
PERSISTENT_SPEEDUP = {
    (64, 4096): {1 / 4: 0.94, 1 / 16: 0.90, 1 / 64: 1.23},
    (64, 256): {1 / 4: 1.41, 1 / 16: 1.23, 1 / 64: 1.00},
    (128, 4096): {1 / 4: 1.05, 1 / 16: 1.38, 1 / 64: 1.18},
    (128, 256): {1 / 4: 1.73, 1 / 16: 0.98, 1 / 64: 1.52},
}


def _nearest_cell(table, block: int, n: int, density: float) -> float:
    cells = {key[1]: row for key, row in table.items() if key[0] == block}
    if not cells:
        return 0.0
    row = cells[_nearest(max(n, 1), cells)]
    return row[_nearest(density, row)]


def prefers_persistent(pattern: BlockPattern, n: int) -> bool:
    """Whether :func:`plan` takes the persistent kernel when the config leaves it open: square blocks of a
    measured size and the :data:`PERSISTENT_SPEEDUP` cell nearest to ``(b, n, density)`` (as
    :func:`measured_speedup` reads its table) at least ``PREFER_MARGIN``."""
    return _table_claims(PERSISTENT_SPEEDUP, pattern, n)


#: Where the one-program-per-item plan splits at least this share of its units into partials (a few rows far
#: longer than the rest, as in power-law patterns), the persistent kernel goes first (its larger share per program
#: splits fewer rows, and it sums those in the kernel), before the Triton kernel too (:func:`prefers`, plain
#: products). H200, bf16, W 8192 x 8192 @ x 8192 x 4096,
#: power-law rows with the blocks of a uniform pattern (``bench_mosaic.py --pattern uniform powerlaw
#: --persistent``): b = 64, d = 1/16: 41 partials of 158 units, one per item 0.212 ms, persistent 0.133, Triton
#: 0.165 (uniform: 0.138 / 0.146 / 0.122); at d = 1/4 (26 of 141) the three within 4% of each other.
SKEW_SPLIT_SHARE = 1 / 4


def skewed(pattern: BlockPattern, n: int, config: MosaicConfig | None = None) -> bool:
    """Whether the one-program-per-item plan of ``W @ x`` (``n`` columns, ``config``'s tiles) splits at least
    :data:`SKEW_SPLIT_SHARE` of its units into float32 partials."""
    cfg = dataclasses.replace(config or MosaicConfig(), persistent=False, programs=None, reduce=None)
    try:
        return _splits_many(plan(pattern, n, config=cfg).sched)
    except NotImplementedError:
        return False


def _splits_many(sched: RowSplitSchedule) -> bool:
    """At least :data:`SKEW_SPLIT_SHARE` of the units of a one-program-per-item schedule are pieces of split rows."""
    return sched.num_units > 0 and sched.num_partials >= SKEW_SPLIT_SHARE * sched.num_units


def _table_claims(table, pattern: BlockPattern, size: int) -> bool:
    """Square blocks, something to compute, and the ``table`` cell nearest to ``(b, size, density)`` at least
    ``PREFER_MARGIN`` (the persistent kernels' rules)."""
    bh, bw = pattern.block_size
    if bh != bw or pattern.nnz_blocks == 0:
        return False
    density = pattern.nnz_blocks / (pattern.grid[0] * pattern.grid[1])
    return _nearest_cell(table, bh, size, density) >= PREFER_MARGIN


def prefers(pattern: BlockPattern, n: int, w_dtype, x_dtype, fused: bool = False) -> bool:
    """Whether ``implementation=None`` should try the Mosaic kernel before the Triton one for ``W @ x``.

    Static facts only (evaluated at trace time, never timed): the default device is a Hopper GPU,
    ``W`` and ``x`` share one half dtype (a mix would be promoted to float32, which the kernel
    refuses), square blocks of 64 or 128 (the measured ones), ``n >= PREFER_MIN_N``, and
    :func:`measured_speedup` of the cell nearest to ``(b, n, density)`` is at least
    :data:`PREFER_MARGIN` or, for a plain product (not ``fused``: the persistent kernel has no epilogue),
    the pattern is :func:`skewed` (the persistent kernel then runs). float16 is taken to behave as bfloat16
    (the same wgmma rate; only bfloat16 was measured).
    """
    density = _preferable(pattern, n, PREFER_MIN_N, w_dtype, x_dtype)
    if density is None:
        return False
    return measured_speedup(pattern.block_size[0], n, density) >= PREFER_MARGIN or (not fused and skewed(pattern, n))


def _preferable(pattern: BlockPattern, size: int, min_size: int, w_dtype, x_dtype,
                blocks=SUPPORTED_BLOCKS) -> float | None:  # fmt: skip
    """The density of ``pattern`` if the static facts every default rule needs hold (square blocks of ``blocks``,
    the measured ones; something to compute, ``size >= min_size``, one half dtype, a Hopper GPU), else ``None``."""
    bh, bw = pattern.block_size
    if bh != bw or bh not in blocks or pattern.nnz_blocks == 0 or size < min_size:
        return None
    if jnp.dtype(w_dtype) != jnp.dtype(x_dtype) or jnp.dtype(w_dtype) not in _DTYPES:
        return None
    if hopper_problem() is not None:
        return None
    return pattern.nnz_blocks / (pattern.grid[0] * pattern.grid[1])


def _not_yet(op: str):
    def method(self, s, *args):
        raise NotImplementedError(
            f"the Mosaic GPU backend implements the static dsd, dds and sdd and the dynamic W @ x / x @ W only "
            f"(not {op})"
        )

    method.__name__ = op
    return method


class MosaicBackend:
    """Backend object for :mod:`blocksparse.ops.matmul.api` (``implementation="mosaic"``).

    The static ``dsd`` (``W @ x``, this module) and ``dds`` (``x @ W``, :mod:`.pallas_mosaic_dds`), plain
    or with the fused epilogue (square blocks of 16 and 32: the banded kernel of :mod:`.pallas_mosaic_bands`), the
    static ``sdd`` (:mod:`.pallas_mosaic_sdd`: the weight gradient) and the dynamic ``W @ x`` / ``x @ W``
    (:func:`dsd_dynamic`, plain or fused; never first by default: its work list built on the device makes it slower
    than the Triton scan kernel, docs/benchmarks.md); every other op (the dynamic ``sdd``) raises
    ``NotImplementedError`` so dispatch moves on to the next implementation.
    :meth:`prefers`, :meth:`prefers_dds` and :meth:`prefers_sdd` are the default order's rules (see
    :func:`prefers`, :func:`.pallas_mosaic_dds.prefers` and :func:`.pallas_mosaic_sdd.prefers`).
    """

    name = "mosaic"

    @staticmethod
    def _interpret() -> bool:
        interpret = _dispatch.interpreting()
        if not interpret and (why := hopper_problem()) is not None:
            raise NotImplementedError(why)
        return interpret

    def prefers(self, pattern: BlockPattern, n: int, w_dtype, x_dtype, fused: bool = False) -> bool:
        from . import pallas_mosaic_bands

        return prefers(pattern, n, w_dtype, x_dtype, fused) or pallas_mosaic_bands.prefers(
            pattern, n, w_dtype, x_dtype, "dsd"
        )

    def prefers_dds(self, pattern: BlockPattern, m: int, w_dtype, x_dtype, fused: bool = False) -> bool:
        from . import pallas_mosaic_bands, pallas_mosaic_dds

        del fused  # one rule for plain and fused x @ W
        return pallas_mosaic_dds.prefers(pattern, m, x_dtype, w_dtype) or pallas_mosaic_bands.prefers(
            pattern, m, w_dtype, x_dtype, "dds"
        )

    def prefers_sdd(self, pattern: BlockPattern, k: int, a_dtype, b_dtype, fused: bool = False) -> bool:
        from . import pallas_mosaic_sdd

        del fused  # an sdd has no epilogue

        return pallas_mosaic_sdd.prefers(pattern, k, a_dtype, b_dtype)

    def _dsd(self, s, data, x, epi=None, bias=None):
        from . import pallas_mosaic_bands

        if pallas_mosaic_bands.takes(s.pattern):  # blocks of 16 and 32: the banded kernel
            return pallas_mosaic_bands.dsd(s.pattern, data, x, s.out_dtype, epi, bias, interpret=self._interpret())
        return dsd(s.pattern, data, x, s.out_dtype, interpret=self._interpret(), epi=epi, bias=bias)

    def _dds(self, s, x, data, epi=None, bias=None):
        from . import pallas_mosaic_bands, pallas_mosaic_dds

        if pallas_mosaic_bands.takes(s.pattern):
            return pallas_mosaic_bands.dds(s.pattern, data, x, s.out_dtype, epi, bias, interpret=self._interpret())
        return pallas_mosaic_dds.dds(s.pattern, data, x, s.out_dtype, epi, bias, interpret=self._interpret())

    def dsd(self, s, data, x):
        return self._dsd(s, data, x)

    def dsd_fused(self, s, data, x, bias):
        return self._dsd(s, data, x, s.epilogue, bias)

    def dds(self, s, x, data):
        return self._dds(s, x, data)

    def dds_fused(self, s, x, data, bias):
        return self._dds(s, x, data, s.epilogue, bias)

    def sdd(self, s, a, b):
        from . import pallas_mosaic_sdd

        return pallas_mosaic_sdd.sdd(s.pattern, a, b, s.out_dtype, interpret=self._interpret())

    def dyn_dsd(self, s, rows, cols, keep, valid, data, x):
        return dsd_dynamic(rows, cols, keep, valid, data, x, s.grid[0], s.out_dtype, transposed=s.transposed,
                           interpret=self._interpret())  # fmt: skip

    def dyn_dsd_fused(self, s, rows, cols, keep, valid, data, x, bias):
        return dsd_dynamic(rows, cols, keep, valid, data, x, s.grid[0], s.out_dtype, transposed=s.transposed,
                           interpret=self._interpret(), epi=s.epilogue, bias=bias)  # fmt: skip

    dyn_sdd = _not_yet("dyn_sdd")
