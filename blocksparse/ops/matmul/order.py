"""The one place that orders the backends of the block-sparse products, forward and backward.

``implementation=None`` means :func:`default` of the product: :data:`DEFAULT` (the Pallas Triton kernels where
they can run, else the pure-JAX reference), preceded by ``"mosaic"`` where a Mosaic GPU kernel measured faster
for that product. The custom VJPs call :func:`default` again for each product of a backward (the gradient
w.r.t. ``x`` runs on the transposed pattern, which a rule may judge differently; the weight gradient is an
``sdd`` with a rule of its own), so forward and backward follow one set of rules.

The rules read static facts only, at trace time, never a timing: the device (:mod:`blocksparse.hardware`: a
Hopper GPU), the pattern (block size, density, and for ``W @ x`` whether its cached schedule splits many rows:
:func:`.mosaic.dsd.skewed`), the dtypes, the size of the dense operand, whether an epilogue is fused, and the
measured tables of :mod:`.tuned` for the device (a device nobody measured has none: Triton first).

- ``dsd`` (``W @ x``, ``size`` = the columns of ``x``): the Mosaic kernel for square blocks of 64 or 128 where
  ``size >= PREFER_MIN_N`` and the nearest ``MOSAIC_DSD_SPEEDUP`` cell is at least ``PREFER_MARGIN``, or, for a
  plain product, where the pattern is skewed (the persistent kernel then runs); the banded kernel for blocks of
  16 and 32 where ``size >= BANDS_PREFER_MIN["dsd"]`` and the nearest ``BANDS_DSD_SPEEDUP`` cell (by ``size``) is
  at least ``PREFER_MARGIN``.
- ``dds`` (``x @ W``, ``size`` = the rows of ``x``): square blocks of 64 or 128 where ``size >= PREFER_MIN_M``
  and the nearest ``MOSAIC_DDS_SPEEDUP`` cell (by ``W``'s rows ``k``) is at least ``PREFER_MARGIN``; the banded
  kernel where ``size >= BANDS_PREFER_MIN["dds"]`` and the nearest ``BANDS_DDS_SPEEDUP`` cell (by ``k``) is.
- ``dsd`` and ``dds`` both: the Triton kernels first, ahead of any Mosaic claim, where the grouped kernel claims the
  product (:func:`.triton.grouped_kernel.claims`: blocks and plan fill of ``GROUPED_MIN_FILL``, ``size >=
  GROUPED_PREFER_MIN``); the Triton backend then runs it.
- ``sdd`` (``size`` = the contracted dimension): square blocks of ``SDD_PREFER_BLOCKS`` where ``size >=
  SDD_PREFER_MIN_K`` and the Mosaic kernel's default plan splits the contracted dimension at least
  ``SDD_PREFER_MIN_SPLITS`` ways.

Every rule also needs operands of one half dtype (a mix would be promoted to float32, which the Mosaic kernels
refuse) and something to compute. float16 is taken to behave as bfloat16 (the same wgmma rate; only bfloat16
was measured). A dynamic matrix keeps :data:`DEFAULT` at every size: the Triton scan kernel needs no plan built
on the device (docs/benchmarks.md).

Example::

    >>> import jax.numpy as jnp, blocksparse as bs, blocksparse.hardware as hw
    >>> from blocksparse.ops.matmul import order
    >>> p = bs.BlockPattern.random(0, (8192, 8192), (128, 128), 1 / 4)
    >>> order.default("dsd", p, 4096, jnp.bfloat16, jnp.bfloat16)  # no GPU here
    ('pallas', 'xla')
    >>> with hw.fake(hw.H200):
    ...     order.default("dsd", p, 4096, jnp.bfloat16, jnp.bfloat16)
    ('mosaic', 'pallas', 'xla')
"""

from __future__ import annotations

import math

import jax.numpy as jnp

from ... import hardware
from ..._pattern import BlockPattern
from . import tuned
from .mosaic import bands as _bands
from .mosaic import dsd as _mosaic_dsd
from .mosaic import sdd as _mosaic_sdd
from .mosaic.common import DTYPES, SUPPORTED_BLOCKS

__all__ = ["DEFAULT", "OPS", "default", "of_product"]

#: The order without a claim: the Triton kernels, then the pure-JAX reference.
DEFAULT = ("pallas", "xla")
#: The products :func:`default` orders.
OPS = ("dsd", "dds", "sdd")


def default(op: str, pattern: BlockPattern, size: int, w_dtype, x_dtype, *, fused: bool = False) -> tuple[str, ...]:
    """The implementations ``implementation=None`` means for one static product (see the module docstring).

    Arguments:
        op: ``"dsd"`` (``W @ x``), ``"dds"`` (``x @ W``) or ``"sdd"`` (``a @ b`` at ``pattern``'s blocks).
        pattern: the sparse operand's (or the sdd's output's) static pattern.
        size: the dense operand's columns (``dsd``, batch dimensions folded in), rows (``dds``), or the
            contracted dimension (``sdd``).
        w_dtype, x_dtype: the two operands' dtypes (for ``sdd``: ``a``'s and ``b``'s).
        fused: an epilogue (bias, activation) is fused into the product.
    """
    if op in ("dsd", "dds") and _grouped_claims(op, pattern, size, w_dtype, x_dtype):
        return DEFAULT
    if op == "dsd":
        claimed = _mosaic_dsd_claims(pattern, size, w_dtype, x_dtype, fused) or _bands_claims(
            pattern, size, w_dtype, x_dtype, "dsd"
        )
    elif op == "dds":
        claimed = _mosaic_dds_claims(pattern, size, w_dtype, x_dtype) or _bands_claims(
            pattern, size, w_dtype, x_dtype, "dds"
        )
    elif op == "sdd":
        claimed = _mosaic_sdd_claims(pattern, size, w_dtype, x_dtype)
    else:
        raise ValueError(f"Expected op in {OPS}. Got {op!r}.")
    return ("mosaic", *DEFAULT) if claimed else DEFAULT


def of_product(op: str, pattern: BlockPattern | None, w_dtype, dense, *, fused: bool = False) -> tuple[str, ...]:
    """:func:`default` of ``bs.matmul`` with a sparse operand of ``pattern`` and the dense operand ``dense``:
    ``op="dsd"`` for ``W @ x`` (``size``: the columns of ``x``, batch dimensions folded in), ``"dds"`` for ``x @
    W`` (``size``: the rows of ``x``, batch dimensions folded in). :data:`DEFAULT` for a dynamic matrix
    (``pattern=None``: the Triton scan kernel needs no plan built on the device) and where ``dense`` is not an
    array of at least one dimension (``matmul`` then raises its own error)."""
    if pattern is None:
        return DEFAULT
    try:
        dtype, shape = jnp.result_type(dense), jnp.shape(dense)
    except TypeError:  # not an array: matmul raises the error
        return DEFAULT
    if len(shape) == 0:
        return DEFAULT
    size = (1 if len(shape) == 1 else math.prod(shape[:-2]) * shape[-1]) if op == "dsd" else math.prod(shape[:-1])
    return default(op, pattern, size, w_dtype, dtype, fused=fused)


def _density(pattern: BlockPattern, size: int, min_size: int, w_dtype, x_dtype, blocks) -> float | None:
    """The density of ``pattern`` if the static facts every rule needs hold (square blocks of ``blocks``, the
    measured ones; something to compute, ``size >= min_size``, one half dtype, a Hopper GPU), else ``None``."""
    bh, bw = pattern.block_size
    if bh != bw or bh not in blocks or pattern.nnz_blocks == 0 or size < min_size:
        return None
    if jnp.dtype(w_dtype) != jnp.dtype(x_dtype) or jnp.dtype(w_dtype) not in DTYPES:
        return None
    if hardware.hopper_problem() is not None:
        return None
    return pattern.nnz_blocks / (pattern.grid[0] * pattern.grid[1])


def _mosaic_dsd_claims(pattern: BlockPattern, n: int, w_dtype, x_dtype, fused: bool) -> bool:
    t = tuned.current()
    density = _density(pattern, n, t.PREFER_MIN_N, w_dtype, x_dtype, SUPPORTED_BLOCKS)
    if density is None:
        return False
    speedup = tuned.nearest_cell(t.MOSAIC_DSD_SPEEDUP, pattern.block_size[0], n, density)
    return speedup >= t.PREFER_MARGIN or (not fused and _mosaic_dsd.skewed(pattern, n))


def _mosaic_dds_claims(pattern: BlockPattern, m: int, w_dtype, x_dtype) -> bool:
    t = tuned.current()
    density = _density(pattern, m, t.PREFER_MIN_M, w_dtype, x_dtype, SUPPORTED_BLOCKS)
    if density is None:
        return False
    return tuned.nearest_cell(t.MOSAIC_DDS_SPEEDUP, pattern.block_size[0], pattern.shape[0], density) >= t.PREFER_MARGIN


def _mosaic_sdd_claims(pattern: BlockPattern, k: int, a_dtype, b_dtype) -> bool:
    t = tuned.current()
    if _density(pattern, k, t.SDD_PREFER_MIN_K, a_dtype, b_dtype, t.SDD_PREFER_BLOCKS) is None:
        return False
    return _mosaic_sdd.plan(pattern, k, jnp.dtype(a_dtype).itemsize).splits >= t.SDD_PREFER_MIN_SPLITS


def _grouped_claims(op: str, pattern: BlockPattern, size: int, w_dtype, x_dtype) -> bool:
    from .triton import grouped_kernel

    if jnp.dtype(w_dtype) != jnp.dtype(x_dtype):
        return False
    return grouped_kernel.claims(op, size, pattern, w_dtype)


def _bands_claims(pattern: BlockPattern, size: int, w_dtype, x_dtype, op: str) -> bool:
    t = tuned.current()
    density = _density(pattern, size, t.BANDS_PREFER_MIN[op], w_dtype, x_dtype, _bands.BLOCKS)
    if density is None:
        return False
    table, key = (t.BANDS_DSD_SPEEDUP, size) if op == "dsd" else (t.BANDS_DDS_SPEEDUP, pattern.shape[0])
    return tuned.nearest_cell(table, pattern.block_size[0], key, density) >= t.PREFER_MARGIN
