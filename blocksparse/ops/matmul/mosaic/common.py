"""What the Mosaic GPU (Hopper: TMA + wgmma) kernels share: operand checks, the TMA / wgmma pipeline, stores.

Every kernel of this package (:mod:`.dsd`, :mod:`.dds`, :mod:`.sdd`, :mod:`.persistent`, :mod:`.bands`) imports
from here and from nothing above it: the shared-memory budget, the swizzled operand layout, one pipeline step
(:func:`consume`), the whole pipeline (:func:`pipelined_wgmma`), the store of a register tile, the fused
epilogue on the accumulator, and the checks every kernel makes of its operands (``NotImplementedError`` with
the reason where a kernel cannot take them).
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from .... import hardware
from ...._pattern import BlockPattern
from .. import epilogue as _epilogue

__all__ = [
    "BARRIER_BYTES",
    "DTYPES",
    "MAX_ACC",
    "OUT_DTYPES",
    "SUPPORTED_BLOCKS",
    "SWIZZLE",
    "apply_epilogue",
    "check_operands",
    "consume",
    "operand_dtypes",
    "operand_transforms",
    "pipeline_stages",
    "pipelined_wgmma",
    "smem_bytes",
    "store_tile",
    "with_bias_buffer",
]

#: Block sides of the dsd / dds / sdd kernels (wgmma tiles of a 128-byte swizzle, M a multiple of 64).
SUPPORTED_BLOCKS = (64, 128)
#: Operand dtypes (both of one dtype: a mix promotes to float32, which no kernel takes).
DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
OUT_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16), jnp.dtype(jnp.float32))
#: Shared memory a kernel keeps back from its CTA's budget (:func:`smem_bytes`) for the barriers.
BARRIER_BYTES = 1024
#: Floats of one warpgroup's wgmma accumulator (128 registers per thread).
MAX_ACC = 128 * 128
SWIZZLE = 128  # bytes: every operand row here is >= 128 bytes wide (>= 64 two-byte elements)


def smem_bytes() -> int:
    """Shared memory one CTA of these kernels may use: the GPU's per-CTA budget (``smem_per_block`` of
    :func:`blocksparse.hardware.gpu`, the planning default's off a GPU or where a device does not say), less
    :data:`BARRIER_BYTES`."""
    return (hardware.gpu().smem_per_block or hardware.PLANNING_DEFAULT.smem_per_block) - BARRIER_BYTES


def pipeline_stages(forced: int | None, per_stage: int, extra_smem: int) -> int:
    """The pipeline depth: ``forced``, or 3 where 3 fit in shared memory next to ``extra_smem`` bytes, else 2;
    ``NotImplementedError`` where it does not fit."""
    budget = smem_bytes() - extra_smem
    fit = budget // per_stage
    stages = forced or min(3, fit)
    if stages > fit or stages < 2:
        raise NotImplementedError(
            f"requires stages * {per_stage} bytes <= {budget} of shared memory (got stages={stages})"
        )
    return stages


def operand_transforms(dtype):
    """Shared-memory layout of a wgmma operand: 8-row tiles, 128-byte swizzle."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    return (plgpu.TilingTransform((8, SWIZZLE // jnp.dtype(dtype).itemsize)), plgpu.SwizzleTransform(SWIZZLE))


def consume(acc_ref, a_smem, b_smem, a_bar, b_bar, i, stages: int, count, fetch, transposed=(False, False),
             free=None):  # fmt: skip
    """Step ``i`` of a ``stages``-deep pipeline of ``count`` steps: wait for stage ``i % stages``, issue
    ``acc_ref += a @ b`` on it, wait until at most that wgmma is pending (step ``i - 1``'s stage is then
    free) and refill that stage with ``fetch(i + stages - 1)``.

    ``transposed``: whether the ``a`` / ``b`` tiles are stored transposed (wgmma reads them through a
    transposed view of shared memory). ``free``: the cluster barriers of a multicast ``a`` (see
    :func:`pipelined_wgmma`): this program says it is done with step ``i - 1``'s stage, and ``fetch`` waits
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


def pipelined_wgmma(acc_ref, length, stages: int, a_src, b_src, a_tile, b_tile, dtype, transposed=(False, False),
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
            consume(acc_ref, a_smem, b_smem, a_bar, b_bar, i, stages, length, fetch, transposed, free)
            return carry

        lax.fori_loop(0, length, step, None)
        plgpu.wgmma_wait(0)

    transforms = operand_transforms(dtype)
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


def store_tile(out_g, rows, cols, value):
    """``out_g[rows, cols] = value`` (a register tile, cast to ``out_g``'s dtype) through shared memory."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    def scope(o_smem):
        o_smem[...] = value.astype(o_smem.dtype)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(o_smem, out_g.at[rows, cols])
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)

    pl.run_scoped(scope, plgpu.SMEM(value.shape, out_g.dtype))


def apply_epilogue(acc, epi, bias_smem, bias_bar):
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


def with_bias_buffer(run, bias_g, size: int):
    """``run()``, or ``run(bias_smem, bias_bar)`` with a float32 buffer of ``size`` for the bias slice."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    if bias_g is None:
        run()
    else:
        pl.run_scoped(run, plgpu.SMEM((size,), jnp.float32), plgpu.Barrier(num_barriers=1))


def check_operands(pattern: BlockPattern, data, epi, bias, lengths: tuple[int, int]) -> None:
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


def operand_dtypes(a_dtype, b_dtype, out_dtype) -> tuple[jnp.dtype, jnp.dtype]:
    """``(operand dtype, output dtype)`` of a Mosaic kernel (the output defaults to the operands'); raises
    ``NotImplementedError`` naming what the kernels take where they cannot take these."""
    dt = jnp.dtype(jnp.result_type(a_dtype, b_dtype))
    if dt not in DTYPES:
        raise NotImplementedError(
            f"requires float16 or bfloat16 operands of one dtype (got {jnp.dtype(a_dtype)}, {jnp.dtype(b_dtype)})"
        )
    out_dtype = jnp.dtype(out_dtype or dt)
    if out_dtype not in OUT_DTYPES:
        raise NotImplementedError(f"requires a float16, bfloat16 or float32 output (got {out_dtype})")
    return dt, out_dtype
