"""What the Pallas (Triton lowering) kernels share: their config, tiles, the dot, the ``shard_map``-aware call."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from .... import hardware
from ...._util import cdiv, next_power_of_2
from ... import _dispatch
from .. import epilogue as _epilogue
from .. import tuned

__all__ = ["DTYPES", "SUPPORTED_BLOCKS", "TritonConfig", "check", "default_tn", "kernels_accept", "transpose_acc"]

SUPPORTED_BLOCKS = (16, 32, 64, 128)
DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16), jnp.dtype(jnp.float32))


@dataclasses.dataclass(frozen=True)
class TritonConfig:
    """Tile sizes and Triton launch parameters of the ``"pallas"`` backend (``None``: chosen per problem).

    Passed as ``bs.matmul(..., config=TritonConfig(...))`` or ``bs.sdd(..., config=)``: it applies to the forward
    product (the backward's products take the defaults) and is part of the ``jit`` cache key.

    Attributes:
        tn: columns of ``x`` per ``dsd`` program (a power of two >= 16).
        tb: rows of ``x`` per ``dds`` program.
        tk: shared-dimension chunk of ``sdd``.
        sdd_splits: programs per ``sdd`` block, each over a share of the contracted dimension (float32
            partials, summed by XLA). ``None``: 1 for at least :data:`~..tuned` ``TRITON_SDD_WAVES`` blocks per SM,
            else enough splits for that many programs, each of at least ``TRITON_SDD_MIN_STEPS`` chunks.
        transpose_acc: ``dsd`` accumulates ``(tn, bh)`` instead of ``(bh, tn)``.
        num_warps, num_stages: Triton launch parameters.
        max_len: force the schedule's cap on blocks per program.
        dynamic: the design of dynamic products: ``"scan"`` (no plan at all: each program scans
            the block list for its own row's blocks; one launch) or ``"worklist"`` (the
            load-balanced work list of :func:`~..schedule.redistribute`, which splits long rows; a
            dozen small launches). ``None``: ``"scan"``. (A third design, one sort and a binary
            search per program, measured slower than the scan everywhere and was dropped.)
        scan_chunk: block coordinates read at once by the scan (a power of two).
        stream: run the few-token kernel of :mod:`.stream` (one launch, every SM streaming ``W``'s blocks)
            for ``x @ W`` and ``W @ x``; ``None``: where the dense operand has at most :data:`~..tuned`
            ``TRITON_STREAM_MAX_N`` tokens. Its sub-tile is ``tn`` (``x @ W``) or ``tb`` (``W @ x``).
        stream_group: blocks the stream kernel reads per loop step.
        stream_split: parts each stream sub-tile's blocks are cut into, one program per part (float32
            partials; the part that finishes last sums them in a fixed order and stores the output, so the
            product stays one launch and deterministic). ``None``: :func:`.stream.plan`'s choice; ``1``: no split.
        stream_fma: with one token, multiply on the CUDA cores (each block's products accumulated elementwise in
            float32, summed once at the end) instead of the tensor cores' dot on the token padded to 16 rows.
            ``None``: the tuned ``TRITON_STREAM_FMA``; ignored with more than one token.
        grouped: run the grouped kernel of :mod:`.grouped_kernel` for static ``W @ x`` and ``x @ W``: units of
            ``g`` block rows (columns) of ``W`` that share block columns (rows), as planned by
            :func:`~..grouped.group`, each unit's blocks of a column stacked into one 64- or 128-row dot against a
            slab of ``x`` loaded once. ``True``: wherever the plan groups (``group > 1``; else the work-list
            kernel runs), the stream kernel keeping priority where it runs (few tokens). ``False``: never. ``None``
            (the default): where no config is given, only where the measured rule
            :func:`.grouped_kernel.claims` the product (small blocks whose rows share their columns, with the
            packed operand); elsewhere the work-list kernel was faster on an H200. Its tile is ``tn`` (``W @ x``)
            or ``tb`` (``x @ W``).
        grouped_slabs: ``k``, the slabs (distinct block columns of a unit; ``x @ W``: block rows) the grouped kernel
            takes per loop step: one gather-loaded operand ``k`` blocks wide and one dot contracted over ``k b``
            (a power of two >= 1; a unit's last step masks the slabs past its end). ``None``: ``64 // b`` of the
            contracted block side (4 at b = 16, 2 at 32, 1 from 64); ``1``: one ``K = b`` dot per step, the form
            measured on the H200.
        grouped_packed: the grouped kernel reads ``W`` from a *packed* copy, made by one XLA gather per call:
            each slab's stacked ``g b x bw`` operand (zeros where a row lacks the column) laid side by side, so a
            loop step's operand is one contiguous tile instead of a gather of ``g k`` scattered blocks (``1 /
            fill`` times ``W``'s bytes, written once). ``None`` / ``False``: gathered in the kernel.
    """

    tn: int | None = None
    tb: int | None = None
    tk: int | None = None
    transpose_acc: bool | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    max_len: int | None = None
    dynamic: str | None = None
    scan_chunk: int | None = None
    sdd_splits: int | None = None
    stream: bool | None = None
    stream_group: int | None = None
    stream_split: int | None = None
    stream_fma: bool | None = None
    grouped: bool | None = None
    grouped_slabs: int | None = None
    grouped_packed: bool | None = None

    #: The backend this config configures (``implementation="pallas"``).
    backend: ClassVar[str] = "pallas"

    def __post_init__(self):
        if self.sdd_splits is not None and self.sdd_splits < 1:
            raise ValueError(f"Expected sdd_splits >= 1. Got {self.sdd_splits}.")
        if self.dynamic not in (None, "scan", "worklist"):
            raise ValueError(f"Expected dynamic None, 'scan' or 'worklist'. Got {self.dynamic!r}.")
        if self.stream_group is not None and self.stream_group < 1:
            raise ValueError(f"Expected stream_group >= 1. Got {self.stream_group}.")
        if self.stream_split is not None and self.stream_split < 1:
            raise ValueError(f"Expected stream_split >= 1. Got {self.stream_split}.")
        if self.grouped not in (None, True, False):
            raise ValueError(f"Expected grouped None, True or False. Got {self.grouped!r}.")
        if self.grouped_packed is not None and not isinstance(self.grouped_packed, bool):
            raise ValueError(f"Expected grouped_packed None, True or False. Got {self.grouped_packed!r}.")
        k = self.grouped_slabs
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1 or k & (k - 1)):
            raise ValueError(f"Expected grouped_slabs None or a power of two >= 1. Got {k!r}.")


def _tile(n: int, preferred: int) -> int:
    """A power-of-two tile <= preferred that wastes little padding on ``n``."""
    return min(preferred, next_power_of_2(n, 16))


def default_tn(bh: int, n: int, rows: int) -> int:
    """Columns per dsd program: wide tiles from :data:`~..tuned` ``TRITON_TN_WIDE_FROM`` columns, narrow ones
    when there are too few block rows to give each of the GPU's SMs a program."""
    if n >= tuned.current().TRITON_TN_WIDE_FROM:
        return 128 if bh >= 128 else 256
    if rows * cdiv(n, 128) < hardware.gpu().num_sms:
        return 64
    return 128


def _pad_to(x, axis: int, multiple: int):
    size = x.shape[axis]
    extra = -size % multiple
    if extra == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return jnp.pad(x, widths)


def _dot(a, b, *, exact: bool, contract=((1,), (0,))):
    """float32-accumulating dot of two tiles; contraction dims as in ``dot_general``.

    float32 tiles use TF32 tensor cores unless ``exact`` (then IEEE float32 dots)."""
    if a.dtype == jnp.float32:
        precision = lax.Precision.HIGHEST if exact else lax.Precision.HIGH
    else:
        precision = None
    return lax.dot_general(a, b, (contract, ((), ())), precision=precision, preferred_element_type=jnp.float32)


def _pallas_call(kernel, *, out_shape, **kwargs):
    """``pl.pallas_call`` that also works inside ``shard_map``.

    There, Pallas needs the outputs' manual-axis type: all operands are cast to the union of the
    axes any of them varies over, and the outputs get that type.
    """

    def call(*args):
        union = frozenset().union(*(_dispatch.varying_axes(a) for a in args))
        if not union:
            return pl.pallas_call(kernel, out_shape=out_shape, **kwargs)(*args)
        args = tuple(_vary(a, union) for a in args)
        mat = jax.typeof(args[0]).mat
        out = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, manual_axis_type=mat), out_shape)
        return pl.pallas_call(kernel, out_shape=out, **kwargs)(*args)

    return call


def _vary(a, axes):
    missing = tuple(sorted(axes - _dispatch.varying_axes(a), key=str))
    return lax.pcast(a, missing, to="varying") if missing else a


def _masked_load(ref, mask, other):
    """A masked vector load (lanes outside ``mask`` read ``other``)."""
    from jax.experimental.pallas import triton as plgpu

    return plgpu.load(ref, mask=mask, other=other)


def _params(num_warps: int, num_stages: int):
    from jax.experimental.pallas import triton as plgpu

    return plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages)


def _interpret() -> bool:
    return _dispatch.interpreting()


def _split_refs(refs, epi):
    """``(bias_ref or None, *output refs)``: a kernel's trailing refs with or without a bias input."""
    if epi is not None and epi.bias:
        return refs[0], refs[1:]
    return None, refs


def _finish(acc, epi, bias_ref, r0, c0, shape):
    """The epilogue on a float32 output tile at rows ``r0``, columns ``c0`` (``shape``): bias along
    ``epi.bias_axis``, then the activation. Identity without an epilogue."""
    if epi is None:
        return acc
    bias = None
    if bias_ref is not None:
        if epi.bias_axis == 1:
            bias = bias_ref[pl.ds(c0, shape[1])][None, :]
        else:
            bias = bias_ref[pl.ds(r0, shape[0])][:, None]
    return _epilogue.apply(acc, bias, epi.activation)


def _bias_operand(bias, epi, length: int):
    """The bias as a float32 kernel operand padded to ``length`` (``()`` without one)."""
    if epi is None or not epi.bias:
        return ()
    b = bias.astype(jnp.float32)
    return (jnp.pad(b, (0, length - b.shape[0])) if length > b.shape[0] else b,)


def check(block_size: tuple[int, int], *dtypes) -> jnp.dtype:
    """Raise ``NotImplementedError`` with the reason if the kernels cannot take these inputs."""
    _dispatch.pallas_mode()  # raises without a GPU unless interpreting
    bh, bw = block_size
    if bh not in SUPPORTED_BLOCKS or bw not in SUPPORTED_BLOCKS:
        raise NotImplementedError(
            f"requires block sides in {SUPPORTED_BLOCKS} (tensor-core dots need >= 16, Triton tiles powers "
            f"of two) (got ({bh}, {bw}))"
        )
    dt = jnp.result_type(*dtypes)
    if jnp.dtype(dt) not in DTYPES:
        raise NotImplementedError(
            f"requires float16, bfloat16 or float32 operands (got {', '.join(str(jnp.dtype(d)) for d in dtypes)})"
        )
    return jnp.dtype(dt)


def kernels_accept(block_size, *dtypes) -> bool:
    """Whether these kernels can run here (a GPU, or interpret mode) on these blocks and dtypes."""
    try:
        check(tuple(block_size), *dtypes)
    except NotImplementedError:
        return False
    return True


def transpose_acc(bh: int, cfg: TritonConfig) -> bool:
    """Whether ``dsd`` accumulates ``(tn, bh)`` (``x_slab^T @ w^T``): the config's choice, else for the blocks of
    :data:`~..tuned` ``TRITON_TRANSPOSE_ACC_BLOCKS`` (the tensor-core M dimension is then ``tn``, not a short
    block)."""
    return bh in tuned.current().TRITON_TRANSPOSE_ACC_BLOCKS if cfg.transpose_acc is None else bool(cfg.transpose_acc)
