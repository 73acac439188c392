"""Pallas Mosaic GPU (Hopper: TMA + wgmma) kernel for the static ``dsd`` product ``y = W @ x``.

``implementation="mosaic"`` of :func:`blocksparse.matmul` for the static ``dsd`` (plain or with the
fused epilogue); its twin :mod:`.dds` serves the static ``dds`` ``x @ W``. It consumes
the same work list as the Triton kernels
(:class:`~..schedule.RowSplitSchedule`, built by :func:`~..schedule.lower`): units of at most
``max_len`` blocks of one output block row. With ``implementation=None`` it goes before the Triton
kernel where :func:`blocksparse.ops.matmul.order.default` says so (a Hopper GPU, half-precision square blocks of
64 or 128, and a measured speedup in :data:`~..tuned` ``MOSAIC_DSD_SPEEDUP``).

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
- Fused epilogue (``epi``, :mod:`..epilogue`): a row written directly gets ``activation(acc +
  bias)`` on the float32 accumulator before the cast and the store. The tile's bias slice (float32)
  is copied to shared memory by TMA when the program starts, so the copy overlaps the main loop,
  and read in the accumulator's layout (``Layout.WGMMA.reduce``) then broadcast.

Split rows are then summed (an XLA segment sum and a scatter into the split rows only, as
:func:`~..schedule.combine_partials`); with an epilogue, split rows get it there, once, after the
sum. ``n`` is zero-padded to a multiple of ``tn`` (the bias too).

Supported: block sides ``bh, bw`` in {64, 128}; float16 / bfloat16 operands (both of one dtype:
a mix promotes to float32), float32 accumulation, output in float16, bfloat16 or float32; bias
along columns or rows and every activation of :mod:`..epilogue`; a Hopper GPU (compute capability
9.x: wgmma and TMA). Everything else raises ``NotImplementedError`` with the reason (dispatch
then falls back): other blocks, float32 or mixed operands (TF32 wgmma is possible, not written;
this includes the ``x``-gradient of a fused call under ``jax.grad``, whose cotangent is float32).
``dds`` is :mod:`.dds`, ``sdd`` :mod:`.sdd`; a dynamic pattern (both orders)
is :func:`dsd_dynamic`: the same one-program-per-item kernel on a work list built inside ``jit``.

What is verified, and what is not
---------------------------------
The plain kernel has run on an H200: it matched the Triton kernel's error on every benchmark cell,
and the speed is in :data:`~..tuned` ``MOSAIC_DSD_SPEEDUP``. On the CPU (``tests/test_pallas_mosaic.py``): it
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
from .. import tuned
from ..schedule import GpuLowering, RowSplitSchedule, combine_partials, kernel_constant, lower
from . import persistent as pp
from .common import (
    MAX_ACC,
    SUPPORTED_BLOCKS,
    apply_epilogue,
    check_operands,
    operand_dtypes,
    operand_transforms,
    pipeline_stages,
    pipelined_wgmma,
    store_tile,
    with_bias_buffer,
)

__all__ = [
    "GRID_ORDERS",
    "MosaicConfig",
    "MosaicPlan",
    "SUPPORTED_BLOCKS",
    "default_tn",
    "dsd",
    "dsd_dynamic",
    "plan",
    "skewed",
    "splits_many",
]

_TILES = (64, 128, 256)
#: Shared memory of a fused bias slice (float32, at most max(tn, bh) = 256 values).
BIAS_SMEM = 4 * max(_TILES)
#: The launch orders of :class:`MosaicConfig` ``grid_order``.
GRID_ORDERS = ("tiles", "units")


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
            one ``k x tn`` slab of ``x`` in L2). ``None``: the backend's
            :func:`~.backend.default_grid_order` (``"tiles"`` where this module plans alone).
        persistent: one program per resident slot walks a list of items with one pipeline across
            them (:mod:`.persistent`); no fused epilogue, one warpgroup. ``None``: where
            the backend's :func:`~.backend.dsd_persistent` says so (measured faster), for a plain product, where
            the backend plans it (this module's :func:`plan` takes ``None`` as ``False``).
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

    #: The backend this config configures (``implementation="mosaic"``; ``bs.matmul(..., config=)``).
    backend: ClassVar[str] = "mosaic"

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


def default_tn(bh: int, n: int, rows: int) -> int:
    """The column tile the plan takes when the config names none: 64 for a narrow ``x``, 128 from
    :data:`~..tuned` ``MOSAIC_TN_WIDE_FROM`` columns, and below that 64 where 128-column tiles would leave some
    of the GPU's SMs without a program; bounded by one warpgroup's registers."""
    if n <= 64:
        return 64
    if n >= tuned.current().MOSAIC_TN_WIDE_FROM:
        return 128
    if rows * cdiv(n, 128) < hardware.gpu().num_sms:  # too few programs for the SMs: narrower tiles
        return 64
    return 128


def splits_many(sched: RowSplitSchedule) -> bool:
    """At least :data:`~..tuned` ``SKEW_SPLIT_SHARE`` of the units of a one-program-per-item schedule are pieces
    of split rows (a few rows far longer than the rest, as in power-law patterns)."""
    return sched.num_units > 0 and sched.num_partials >= tuned.current().SKEW_SPLIT_SHARE * sched.num_units


def skewed(pattern: BlockPattern, n: int) -> bool:
    """Whether the default one-program-per-item plan of ``W @ x`` (``n`` columns) :func:`splits_many` rows: read
    from its cached schedule (:func:`~..schedule.lower`), no plan built."""
    bh, bw = pattern.block_size
    if bh not in SUPPORTED_BLOCKS or bw not in SUPPORTED_BLOCKS:
        return False
    tn = default_tn(bh, n, pattern.grid[0])
    if bh * tn > MAX_ACC:
        return False
    return splits_many(lower(pattern, GpuLowering(op="dsd", tiles=cdiv(n, tn))))


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

    This kernel plans what the config says: ``persistent=None`` is one program per item and ``grid_order=None``
    column tiles first. Which variant runs by default is the backend's choice
    (:func:`blocksparse.ops.matmul.mosaic.backend.dsd_plan`).
    """
    del fused  # one plan for plain and fused products; the config says which kernel
    cfg = config or MosaicConfig()
    bh, bw = pattern.block_size
    if bh not in SUPPORTED_BLOCKS or bw not in SUPPORTED_BLOCKS:
        raise NotImplementedError(
            f"requires block sides in {SUPPORTED_BLOCKS} (wgmma tiles of a 128-byte swizzle, M a multiple of 64) "
            f"(got ({bh}, {bw}))"
        )
    tn = cfg.tn or default_tn(bh, n, pattern.grid[0])
    if bh * tn > MAX_ACC:
        raise NotImplementedError(
            f"requires bh * tn <= {MAX_ACC} (a float32 accumulator in one warpgroup's registers) (got {bh} * {tn})"
        )
    c = cfg.consumers
    tiles = cdiv(n, tn * c * cfg.cluster) * cfg.cluster
    max_len = cfg.max_len
    if cfg.persistent and max_len is None:  # split only rows longer than a program's share of the steps
        # The share of one program per SM, even where two fit: a finer cap would split more rows, measured
        # slower (docs/benchmarks.md, section "Hopper kernels (Mosaic GPU)": the persistent kernel).
        slots = cfg.programs or hardware.gpu().num_sms
        max_len = pp.share(pattern.nnz_blocks, tiles, slots)
    sched = lower(pattern, GpuLowering(op="dsd", tiles=tiles, max_len=max_len))
    if c > 1:
        # the warpgroups' output and float32 staging buffers (the pipeline's memory is not reused)
        extra_smem += c * bh * tn * ((out_itemsize or itemsize) + 4)
    per_stage = (bh * bw + bw * tn * c) * itemsize
    order = cfg.grid_order or "tiles"
    if cfg.persistent:  # its own output staging tile (and a float32 one where XLA sums split rows)
        stages, persistent = pp.plan_persistent(sched, tiles, order, per_stage, bh * tn, extra_smem,
                                                out_itemsize or itemsize, cfg)  # fmt: skip
        return MosaicPlan(tn=tn, tiles=tiles, n_pad=tiles * tn, stages=stages, sched=sched, grid_order=order,
                          persistent=persistent)  # fmt: skip
    stages = pipeline_stages(cfg.stages, per_stage, extra_smem)
    return MosaicPlan(tn=tn, tiles=tiles, n_pad=tiles * tn * c, stages=stages, sched=sched, consumers=c,
                      grid_order=order, cluster=cfg.cluster)  # fmt: skip


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
        return pipelined_wgmma(
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
            store_tile(y_g, pl.ds(dest * bh, bh), pl.ds(n0, tn), apply_epilogue(acc, epi, bias_smem, bias_bar))

        def store_partial():  # a piece of a split row: the epilogue runs after the pieces are summed
            if bias_g is not None:
                plgpu.barrier_wait(bias_bar.at[0])  # every issued copy is waited for before the kernel exits
            store_tile(p_g, pl.ds((-1 - dest) * bh, bh), pl.ds(n0, tn), acc)

        pl.when(dest >= 0)(store_direct)
        pl.when(dest < 0)(store_partial)

    with_bias_buffer(run, bias_g, tn if epi is not None and epi.bias_axis == 1 else bh)


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
    transforms = operand_transforms(dtype)
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

    ``epi``: an :class:`~..epilogue.Epilogue` for the directly written rows; ``bias``: ``()`` or
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
    """:func:`~..schedule.combine_partials` with the epilogue on the summed split rows (XLA)."""
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
        epi: an optional :class:`~..epilogue.Epilogue` (bias, activation) applied to the float32
            accumulator before the one store of each output tile; ``bias`` its array (``(n,)`` for
            ``bias_axis=1``, ``(m,)`` for ``bias_axis=0``).
    """
    m, k = pattern.shape
    bh, bw = pattern.block_size
    if x.ndim != 2 or x.shape[0] != k:
        raise ValueError(f"Expected x of shape ({k}, n). Got {tuple(x.shape)}.")
    n = x.shape[1]
    check_operands(pattern, data, epi, bias, (m, n))
    dt, out_dtype = operand_dtypes(data.dtype, x.dtype, out_dtype)
    with_bias = epi is not None and epi.bias
    if epi is not None and config is not None and config.consumers > 1:
        raise NotImplementedError("requires consumers=1 for a fused epilogue (not written for two warpgroups)")
    if epi is not None and config is not None and config.persistent:
        raise NotImplementedError("requires persistent=False for a fused epilogue (not written for that kernel)")
    if interpret is None:
        interpret = _dispatch.interpreting()
    p = plan(pattern, n, jnp.dtype(dt).itemsize, pp.resolve_reduce(config or MosaicConfig(), interpret),
             BIAS_SMEM if with_bias else 0, out_dtype.itemsize, fused=epi is not None)  # fmt: skip
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

    The work list is built inside ``jit`` (:func:`~..schedule.redistribute`: units of at most ``max_len``
    blocks, long rows split into float32 partials that XLA sums after the kernel), with room for every block
    of the capacity, so the grid is static: units beyond the live ones have no blocks and write a dummy
    partial slot. ``rows``, ``cols``, ``keep``: ``int32[C]``, ``int32[C]``, ``bool[C]`` (``keep`` masks
    padding); ``data``: ``(C, bh, bw)``, or ``(C, bw, bh)`` with ``transposed`` (each stored block is W's
    block transposed, as for ``x @ D``; read through a transposed shared-memory view, no copy);
    ``num_rows``: W's block rows. ``config``: ``tn``, ``stages``, ``max_len`` and ``grid_order`` of
    :class:`MosaicConfig` (the persistent kernel and two warpgroups take static patterns only). ``epi`` /
    ``bias`` as for :func:`dsd`.
    """
    from ..reference import poison
    from ..schedule import redistribute

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
    dt, out_dtype = operand_dtypes(data.dtype, x.dtype, out_dtype)
    m, (k, n) = num_rows * bh, x.shape
    cap = int(data.shape[0])
    if cap == 0 or n == 0 or k == 0:
        return poison(valid, _epilogue.reference(jnp.zeros((m, n), jnp.float32), bias, epi, out_dtype))
    if interpret is None:
        interpret = _dispatch.interpreting()
    tn = cfg.tn or default_tn(bh, n, num_rows)
    if bh * tn > MAX_ACC:
        raise NotImplementedError(f"requires bh * tn <= {MAX_ACC} (got {bh} * {tn})")
    with_bias = epi is not None and epi.bias
    extra = BIAS_SMEM if with_bias else 0
    stages = pipeline_stages(cfg.stages, (bh * bw + bw * tn) * jnp.dtype(dt).itemsize, extra)
    order = cfg.grid_order or "tiles"
    sched = redistribute(rows, cols, keep, num_rows, cfg.max_len)
    tiles = cdiv(n, tn)
    p = MosaicPlan(tn=tn, tiles=tiles, n_pad=tiles * tn, stages=stages, sched=sched, grid_order=order)
    xp, b = _padded(x, bias, epi, dt, p.n_pad)
    y, partials = _launch(p, m, data.astype(dt), xp, out_dtype, interpret=interpret, epi=epi, bias=b,
                          transposed=transposed)  # fmt: skip
    y = _combine(y, partials, sched, bh, epi, b)
    return poison(valid, y[:, :n] if p.n_pad != n else y)
