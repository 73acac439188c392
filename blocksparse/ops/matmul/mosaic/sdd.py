"""Pallas Mosaic GPU (Hopper: TMA + wgmma) kernel for the static ``sdd`` product: ``a @ b`` at W's blocks.

``sdd`` (SDDMM) computes the dense product ``a (m, K) @ b (K, n)`` only at the blocks of a static
pattern, laid out like ``.data`` (``(nnz, bh, bw)``). It is the gradient of a block-sparse product
w.r.t. its values: for ``y = W @ x``, ``dW = sdd(dy, x.T)`` (``K`` is then the number of columns of
``x``: tokens times batch), and for ``y = x @ W``, ``dW = sdd(x.T, dy)``. It is the kernel behind
``implementation="mosaic"`` of :func:`blocksparse.sdd` and of the backward of a Mosaic product (the
custom VJP runs the same implementation order), the twin of the ``dsd`` / ``dds`` kernels of
:mod:`.dsd` and :mod:`.dds` (whose helpers it imports).

The kernel
----------
One program (CTA, one warpgroup) per ``(split s, block i)``; blocks are launched fastest, in the
pattern's row-major order, so the programs running at once share the ``bh x K`` row slab of ``a``
in L2. Program ``(s, i)`` reads the block's coordinates ``rows[i], cols[i]`` (scalar loads from global
memory) and runs the shared TMA / wgmma pipeline of :func:`.dsd._pipelined_wgmma` over its
share of the contracted dimension, ``tk`` at a time: the ``bh x tk`` tile of ``a`` and the ``tk x bw``
tile of ``b`` are copied into swizzled shared memory (``stages`` steps in flight) and
``plgpu.wgmma`` accumulates the ``bh x bw`` block in float32 registers. One split: the block is cast
and stored by TMA into row ``i`` of the output. Several (``splits > 1``, for patterns with too few
blocks to fill the GPU, or a forced config): each writes a float32 partial block and XLA sums them,
then casts once.

Operands may also be given in their stored orientation (``a_transposed``: ``a`` as its ``(K, m)``
transpose; ``b_transposed``: ``b`` as ``(n, K)``), as the backward holds them (``x`` rather than
``x.T``): the tiles are then copied as stored and handed to wgmma as transposed shared-memory views, with
no transposed copy of the operand. Dispatch does not use them: on the H200 they measured as fast as XLA's
transpose copy before the kernel (``benchmarks/bench_mosaic_sdd.py``, ``mosaic_view`` against ``mosaic``),
so the backward passes ``x.T`` as it does to every backend.

Supported: block sides in {64, 128}; float16 / bfloat16 operands of one dtype, float32 accumulation,
output float16, bfloat16 or float32; a Hopper GPU. Anything else raises ``NotImplementedError``
naming what was expected and got, so dispatch moves on to the Triton kernel.

What is verified
----------------
On the CPU (``tests/test_pallas_mosaic_sdd.py``): the kernel lowers for CUDA (the Pallas -> Mosaic GPU
lowering checks wgmma shapes, layouts, transposes, swizzles and the shared-memory budget) and runs in
Pallas' GPU interpreter against a float64 oracle (coordinate reads, TMA slices, stage indices, splits,
transposed operands). On a Hopper GPU the ``gpu``-marked tests run it against the float64 oracle at
real sizes.
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
from .. import tuned
from ..schedule import contraction_splits, kernel_constant
from .common import SUPPORTED_BLOCKS, operand_dtypes, pipelined_wgmma, smem_bytes, store_tile

__all__ = ["SddConfig", "SddPlan", "TILES_K", "default_splits", "plan", "sdd"]

#: Contracted elements per pipeline step (>= 64: a tile row of two-byte elements fills the 128-byte swizzle).
TILES_K = (64, 128)


@dataclasses.dataclass(frozen=True)
class SddConfig:
    """Tiles of the Mosaic ``sdd`` kernel (``None``: chosen per problem).

    Attributes:
        tk: contracted elements per pipeline step, in :data:`TILES_K` (default: :data:`~..tuned`
            ``SDD_DEFAULT_TK``).
        stages: shared-memory pipeline depth (>= 2; default: ``SDD_DEFAULT_STAGES``).
        splits: programs per block, each over ``1 / splits`` of the contracted dimension, summed in XLA
            (default: :func:`default_splits`).
    """

    tk: int | None = None
    stages: int | None = None
    splits: int | None = None

    #: The backend this config configures (``implementation="mosaic"``; ``bs.matmul(..., config=)``).
    backend: ClassVar[str] = "mosaic"

    def __post_init__(self):
        if self.tk is not None and self.tk not in TILES_K:
            raise ValueError(f"Expected tk in {TILES_K}. Got {self.tk}.")
        if self.stages is not None and self.stages < 2:  # one stage would wait before its first copy
            raise ValueError(f"Expected stages >= 2. Got {self.stages}.")
        if self.splits is not None and self.splits < 1:
            raise ValueError(f"Expected splits >= 1. Got {self.splits}.")


@dataclasses.dataclass(frozen=True)
class SddPlan:
    """Everything the host prepares for one ``sdd`` call (see :func:`plan`).

    Attributes:
        tk: contracted elements per step.
        steps: pipeline steps over the whole (padded) contracted dimension, ``k_pad // tk``.
        k_pad: the contracted dimension rounded up to a multiple of ``tk`` (both operands zero-padded).
        stages: shared-memory pipeline depth.
        splits: programs per block; split ``s`` runs steps ``[s * per_split, (s + 1) * per_split)``.
        per_split: steps of one split (the last may have fewer).
    """

    tk: int
    steps: int
    k_pad: int
    stages: int
    splits: int
    per_split: int

    def smem_bytes(self, bh: int, bw: int, itemsize: int) -> int:
        """Shared memory of the pipeline (the output staging buffer reuses it afterwards)."""
        return self.stages * (bh + bw) * self.tk * itemsize


def default_splits(nnz: int, steps: int) -> int:
    """1 where there is a block for every SM, else the fewest splits that fill the SMs :data:`~..tuned`
    ``SDD_WAVES`` times, each of at least ``SDD_MIN_SPLIT_STEPS`` steps (:func:`~..schedule.contraction_splits`)."""
    t, sms = tuned.current(), hardware.gpu().num_sms
    return contraction_splits(nnz, steps, sms, t.SDD_WAVES * sms, t.SDD_MIN_SPLIT_STEPS)


def plan(pattern: BlockPattern, k: int, itemsize: int = 2, config: SddConfig | None = None) -> SddPlan:
    """The host-side preparation of ``(a @ b)`` at ``pattern``'s blocks for a contracted dimension of ``k``.

    Raises ``NotImplementedError`` if the kernel cannot take these blocks or tiles.
    """
    cfg = config or SddConfig()
    bh, bw = pattern.block_size
    if bh not in SUPPORTED_BLOCKS or bw not in SUPPORTED_BLOCKS:
        raise NotImplementedError(
            f"requires block sides in {SUPPORTED_BLOCKS} (wgmma tiles of a 128-byte swizzle) (got ({bh}, {bw}))"
        )
    t = tuned.current()
    tk = cfg.tk or t.SDD_DEFAULT_TK
    steps = max(cdiv(k, tk), 1)
    per_stage = (bh + bw) * tk * itemsize
    budget = smem_bytes()
    fit = budget // per_stage
    stages = cfg.stages or min(t.SDD_DEFAULT_STAGES, fit)
    if stages > fit:
        raise NotImplementedError(
            f"requires stages * {per_stage} bytes <= {budget} of shared memory (got stages={stages})"
        )
    splits = min(cfg.splits or default_splits(pattern.nnz_blocks, steps), steps)
    per_split = cdiv(steps, splits)
    splits = cdiv(steps, per_split)  # no empty split
    return SddPlan(tk=tk, steps=steps, k_pad=steps * tk, stages=stages, splits=splits, per_split=per_split)


def _sdd_kernel(row_g, col_g, a_g, b_g, out_g, *, bh, bw, tk, stages, steps, per_split, nnz, a_t, b_t):
    """Program ``(s, i)``: block ``i`` over steps ``[s * per_split, min((s + 1) * per_split, steps))``."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    i = lax.axis_index("i")
    s = lax.axis_index("s")
    r0 = pl.multiple_of(row_g[i] * bh, bh)
    c0 = pl.multiple_of(col_g[i] * bw, bw)
    first = s * per_split
    length = jnp.minimum(per_split, steps - first)
    a_tile = (tk, bh) if a_t else (bh, tk)
    b_tile = (bw, tk) if b_t else (tk, bw)

    def a_src(j):
        k0 = pl.multiple_of((first + j) * tk, tk)
        return a_g.at[pl.ds(k0, tk), pl.ds(r0, bh)] if a_t else a_g.at[pl.ds(r0, bh), pl.ds(k0, tk)]

    def b_src(j):
        k0 = pl.multiple_of((first + j) * tk, tk)
        return b_g.at[pl.ds(c0, bw), pl.ds(k0, tk)] if b_t else b_g.at[pl.ds(k0, tk), pl.ds(c0, bw)]

    def accumulate(acc_ref):
        return pipelined_wgmma(acc_ref, length, stages, a_src, b_src, a_tile, b_tile, a_g.dtype, (a_t, b_t))

    acc = pl.run_scoped(accumulate, plgpu.ACC((bh, bw), jnp.float32))
    store_tile(out_g, pl.ds(pl.multiple_of((s * nnz + i) * bh, bh), bh), pl.ds(0, bw), acc)


def sdd(
    pattern: BlockPattern,
    a,
    b,
    out_dtype=None,
    *,
    a_transposed: bool = False,
    b_transposed: bool = False,
    config: SddConfig | None = None,
    interpret=None,
) -> jax.Array:
    """``(a @ b)`` at the blocks of ``pattern`` with the Mosaic GPU kernel, laid out like ``.data``.

    Arguments:
        pattern: the output's block pattern (``(m, n)``), blocks in :data:`SUPPORTED_BLOCKS`.
        a: ``(m, K)``, or its transpose ``(K, m)`` with ``a_transposed``.
        b: ``(K, n)``, or its transpose ``(n, K)`` with ``b_transposed``.
        out_dtype: the result dtype (default: the operands'); float16, bfloat16 or float32.
        config: an :class:`SddConfig`.
        interpret: run in Pallas' GPU interpreter on the CPU (default: ``blocksparse.interpret()``).

    Returns:
        ``(nnz, bh, bw)`` in ``out_dtype``.
    """
    m, n = pattern.shape
    bh, bw = pattern.block_size
    a_shape = tuple(a.shape)[::-1] if a_transposed else tuple(a.shape)
    b_shape = tuple(b.shape)[::-1] if b_transposed else tuple(b.shape)
    if a.ndim != 2 or b.ndim != 2 or a_shape[0] != m or b_shape[1] != n or a_shape[1] != b_shape[0]:
        want_a = f"({m}, K)" if not a_transposed else f"(K, {m})"
        want_b = f"(K, {n})" if not b_transposed else f"({n}, K)"
        raise ValueError(
            f"Expected a of shape {want_a} and b of shape {want_b} with one K. "
            f"Got {tuple(a.shape)} and {tuple(b.shape)}."
        )
    dt, out_dtype = operand_dtypes(a.dtype, b.dtype, out_dtype)
    k = a_shape[1]
    p = plan(pattern, k, jnp.dtype(dt).itemsize, config)
    nnz = pattern.nnz_blocks
    if nnz == 0:
        return jnp.zeros((0, bh, bw), out_dtype)
    if k == 0:
        return jnp.zeros((nnz, bh, bw), out_dtype)
    if interpret is None:
        interpret = _dispatch.interpreting()
    pad = p.k_pad - k
    a = a.astype(dt)
    b = b.astype(dt)
    if pad:
        a = jnp.pad(a, ((0, pad), (0, 0)) if a_transposed else ((0, 0), (0, pad)))
        b = jnp.pad(b, ((0, 0), (0, pad)) if b_transposed else ((0, pad), (0, 0)))
    out = _launch(p, pattern, a, b, out_dtype if p.splits == 1 else jnp.float32, a_transposed, b_transposed,
                  interpret)  # fmt: skip
    if p.splits > 1:
        out = out.reshape(p.splits, nnz * bh, bw).sum(axis=0).astype(out_dtype)
    return out.reshape(nnz, bh, bw)


def _launch(p: SddPlan, pattern: BlockPattern, a, b, out_dtype, a_t: bool, b_t: bool, interpret):
    """Run the kernel: ``(splits * nnz * bh, bw)`` in ``out_dtype`` (float32 partials when split)."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    bh, bw = pattern.block_size
    nnz = pattern.nnz_blocks
    body = functools.partial(
        _sdd_kernel,
        bh=bh,
        bw=bw,
        tk=p.tk,
        stages=p.stages,
        steps=p.steps,
        per_split=p.per_split,
        nnz=nnz,
        a_t=a_t,
        b_t=b_t,
    )
    layout = ("t" if a_t else "n") + ("t" if b_t else "n")
    kernel = plgpu.kernel(
        body,
        out_type=jax.ShapeDtypeStruct((p.splits * nnz * bh, bw), out_dtype),
        grid=(p.splits, nnz),  # Mosaic GPU launches the last dimension fastest: the blocks
        grid_names=("s", "i"),
        kernel_name=f"bs_mgpu_sdd_{bh}x{bw}_tk{p.tk}_{layout}" + (f"_split{p.splits}" if p.splits > 1 else ""),
        interpret=plgpu.InterpretGPUParams() if interpret is True else interpret,
    )
    return kernel(kernel_constant(pattern.rows), kernel_constant(pattern.cols), a, b)
