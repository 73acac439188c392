"""The Mosaic GPU backend (``implementation="mosaic"``): which of its kernels, and which variant, runs.

:class:`MosaicBackend` serves the static ``dsd`` (``W @ x``, :mod:`.dsd`) and ``dds`` (``x @ W``, :mod:`.dds`),
plain or with the fused epilogue, the static ``sdd`` (:mod:`.sdd`: the weight gradient) and the dynamic ``W @ x``
/ ``x @ W`` (:func:`.dsd.dsd_dynamic`). Whether it runs before the Triton kernels is not decided here but in
:mod:`blocksparse.ops.matmul.order`; this module decides which variant runs once it does, from the facts of
:mod:`blocksparse.hardware` and the measured tables of :mod:`blocksparse.ops.matmul.tuned`:

- banded or plain (:func:`takes`): square blocks of 16 and 32 run the banded kernel of :mod:`.bands`;
- persistent or one program per item (:func:`dsd_persistent`, :func:`dds_persistent`): a plain product runs the
  persistent kernel of :mod:`.persistent` where ``MOSAIC_DSD_PERSISTENT_SPEEDUP`` /
  ``MOSAIC_DDS_PERSISTENT_SPEEDUP`` measured it faster, or (``W @ x``) where the one-program-per-item plan splits
  many rows (:func:`.dsd.splits_many`), and the persistent kernel can take the tiles;
- the launch order (:func:`default_grid_order`): units first below density ``UNITS_FIRST_BELOW``.

A config passed through ``bs.matmul(..., config=)`` is applied where it is of a type this backend takes for the
op (:class:`.dsd.MosaicConfig` for ``W @ x`` and dynamic products, :class:`.dds.DdsConfig` for ``x @ W``,
:class:`.bands.BandConfig` for the banded kernel, :class:`.sdd.SddConfig` for ``sdd``) and ignored otherwise;
its fields left ``None`` are chosen as above. :func:`dsd_plan` and :func:`dds_plan` are the plans the backend
runs, for inspection.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from .... import hardware
from ...._pattern import BlockPattern
from ... import _dispatch
from .. import tuned
from . import bands, persistent
from . import dds as dds_kernel
from . import dsd as dsd_kernel
from . import sdd as sdd_kernel
from .common import operand_dtypes

__all__ = [
    "MosaicBackend",
    "dds",
    "dsd",
    "dsd_dynamic",
    "default_grid_order",
    "dds_config",
    "dds_persistent",
    "dds_plan",
    "dsd_config",
    "dsd_persistent",
    "dsd_plan",
    "dynamic_grid_order",
    "takes",
]


def takes(pattern: BlockPattern) -> bool:
    """Whether ``pattern``'s blocks run the banded kernel (square, in :data:`.bands.BLOCKS`)."""
    bh, bw = pattern.block_size
    return bh == bw and bh in bands.BLOCKS


def _table_claims(table, pattern: BlockPattern, size: int) -> bool:
    """Square blocks, something to compute, and the ``table`` cell nearest to ``(b, size, density)`` at least
    ``PREFER_MARGIN``."""
    bh, bw = pattern.block_size
    if bh != bw or pattern.nnz_blocks == 0:
        return False
    density = pattern.nnz_blocks / (pattern.grid[0] * pattern.grid[1])
    return tuned.nearest_cell(table, bh, size, density) >= tuned.current().PREFER_MARGIN


def dsd_persistent(pattern: BlockPattern, n: int) -> bool:
    """Whether the measured table puts the persistent ``W @ x`` kernel first: the ``MOSAIC_DSD_PERSISTENT_SPEEDUP``
    cell nearest to ``(b, n, density)`` at least ``PREFER_MARGIN`` (square blocks, something to compute)."""
    return _table_claims(tuned.current().MOSAIC_DSD_PERSISTENT_SPEEDUP, pattern, n)


def dds_persistent(pattern: BlockPattern, m: int) -> bool:
    """Whether the measured table puts the persistent ``x @ W`` kernel first: the ``MOSAIC_DDS_PERSISTENT_SPEEDUP``
    cell nearest to ``(b, k, density)`` at least ``PREFER_MARGIN``. ``m`` (the rows of ``x``) does not enter: only
    m = 32768 (k = 384) and 8192 (k = 8192) were measured."""
    del m  # one argument list with dsd_persistent(pattern, n)
    return _table_claims(tuned.current().MOSAIC_DDS_PERSISTENT_SPEEDUP, pattern, pattern.shape[0])


def default_grid_order(pattern: BlockPattern, persistent: bool = False) -> str:
    """The ``W @ x`` launch order where the config names none: column tiles first for the persistent kernel
    (measured faster at every density), else units first below density ``UNITS_FIRST_BELOW`` (rows of one or two
    blocks: the slab of ``x`` is what is read again)."""
    if persistent:
        return "tiles"
    density = pattern.nnz_blocks / max(pattern.grid[0] * pattern.grid[1], 1)
    return "units" if density < tuned.current().UNITS_FIRST_BELOW else "tiles"


def dynamic_grid_order(capacity: int, num_rows: int, k_blocks: int) -> str:
    """:func:`default_grid_order` of a dynamic ``W @ x``, by its density at full capacity."""
    density = capacity / max(num_rows * max(k_blocks, 1), 1)
    return "units" if density < tuned.current().UNITS_FIRST_BELOW else "tiles"


def dsd_config(
    pattern: BlockPattern,
    n: int,
    itemsize: int = 2,
    config: dsd_kernel.MosaicConfig | None = None,
    extra_smem: int = 0,
    out_itemsize: int | None = None,
    fused: bool = False,
) -> dsd_kernel.MosaicConfig:
    """``config`` with the variant filled in: ``persistent`` (see the module docstring; never with a fused
    epilogue, two warpgroups or a cluster) and ``grid_order``. Raises ``NotImplementedError`` where the
    one-program-per-item kernel it falls back to cannot take the tiles."""
    cfg = config or dsd_kernel.MosaicConfig()
    if cfg.persistent is None:
        cfg = dataclasses.replace(cfg, persistent=_dsd_persistent(pattern, n, itemsize, cfg, extra_smem,
                                                                  out_itemsize, fused))  # fmt: skip
    if cfg.grid_order is None:
        cfg = dataclasses.replace(cfg, grid_order=default_grid_order(pattern, cfg.persistent))
    return cfg


def _dsd_persistent(pattern, n, itemsize, cfg, extra_smem, out_itemsize, fused) -> bool:
    if fused or cfg.consumers != 1 or cfg.cluster > 1:
        return False

    def plan(persistent: bool) -> dsd_kernel.MosaicPlan:
        c = dataclasses.replace(cfg, persistent=persistent)
        c = dataclasses.replace(c, grid_order=c.grid_order or default_grid_order(pattern, persistent))
        return dsd_kernel.plan(pattern, n, itemsize, c, extra_smem, out_itemsize)

    if not dsd_persistent(pattern, n) and not dsd_kernel.splits_many(plan(False).sched):
        return False
    try:  # by the table, or skewed; where the persistent kernel cannot take the tiles, the other
        plan(True)
    except NotImplementedError:
        return False
    return True


def dsd_plan(
    pattern: BlockPattern,
    n: int,
    itemsize: int = 2,
    config: dsd_kernel.MosaicConfig | None = None,
    extra_smem: int = 0,
    out_itemsize: int | None = None,
    fused: bool = False,
) -> dsd_kernel.MosaicPlan:
    """The plan this backend runs for ``W @ x`` (:func:`dsd_config`, then :func:`.dsd.plan`)."""
    cfg = dsd_config(pattern, n, itemsize, config, extra_smem, out_itemsize, fused)
    return dsd_kernel.plan(pattern, n, itemsize, cfg, extra_smem, out_itemsize, fused)


def dds_config(
    pattern: BlockPattern,
    m: int,
    itemsize: int = 2,
    config: dds_kernel.DdsConfig | None = None,
    extra_smem: int = 0,
    out_itemsize: int | None = None,
    fused: bool = False,
) -> dds_kernel.DdsConfig:
    """``config`` with ``persistent`` filled in: the persistent kernel for a plain product where
    :func:`dds_persistent` says so and it can take the tiles."""
    cfg = config or dds_kernel.DdsConfig()
    if cfg.persistent is not None:
        return cfg
    if not fused and dds_persistent(pattern, m):
        try:
            dds_kernel.plan(pattern, m, itemsize, dataclasses.replace(cfg, persistent=True), extra_smem, out_itemsize)
            return dataclasses.replace(cfg, persistent=True)
        except NotImplementedError:
            pass
    return dataclasses.replace(cfg, persistent=False)


def dds_plan(
    pattern: BlockPattern,
    m: int,
    itemsize: int = 2,
    config: dds_kernel.DdsConfig | None = None,
    extra_smem: int = 0,
    out_itemsize: int | None = None,
    fused: bool = False,
) -> dds_kernel.DdsPlan:
    """The plan this backend runs for ``x @ W`` (:func:`dds_config`, then :func:`.dds.plan`)."""
    cfg = dds_config(pattern, m, itemsize, config, extra_smem, out_itemsize, fused)
    return dds_kernel.plan(pattern, m, itemsize, cfg, extra_smem, out_itemsize, fused)


def dsd(pattern: BlockPattern, data, x, out_dtype=None, *, config: dsd_kernel.MosaicConfig | None = None,
        interpret=None, epi=None, bias=None):  # fmt: skip
    """``W @ x`` as this backend runs it: the variant of :func:`dsd_config`, then :func:`.dsd.dsd` (arguments as
    there; no hardware check)."""
    if interpret is None:
        interpret = _dispatch.interpreting()
    if x.ndim == 2 and data.ndim == 3:  # else the kernel raises its error
        dt, out = operand_dtypes(data.dtype, x.dtype, out_dtype)
        cfg = persistent.resolve_reduce(config or dsd_kernel.MosaicConfig(), interpret)
        extra = dsd_kernel.BIAS_SMEM if epi is not None and epi.bias else 0
        config = dsd_config(pattern, x.shape[1], jnp.dtype(dt).itemsize, cfg, extra, out.itemsize, epi is not None)
    return dsd_kernel.dsd(pattern, data, x, out_dtype, config=config, interpret=interpret, epi=epi, bias=bias)


def dds(pattern: BlockPattern, data, x, out_dtype=None, epi=None, bias=None, *,
        config: dds_kernel.DdsConfig | None = None, interpret=None):  # fmt: skip
    """``x @ W`` as this backend runs it: the variant of :func:`dds_config`, then :func:`.dds.dds` (arguments as
    there; no hardware check)."""
    if interpret is None:
        interpret = _dispatch.interpreting()
    if x.ndim == 2 and data.ndim == 3:
        dt, out = operand_dtypes(data.dtype, x.dtype, out_dtype)
        cfg = persistent.resolve_reduce(config or dds_kernel.DdsConfig(), interpret)
        extra = dds_kernel.BIAS_SMEM if epi is not None and epi.bias else 0
        config = dds_config(pattern, x.shape[0], jnp.dtype(dt).itemsize, cfg, extra, out.itemsize, epi is not None)
    return dds_kernel.dds(pattern, data, x, out_dtype, epi, bias, config=config, interpret=interpret)


def dsd_dynamic(rows, cols, keep, valid, data, x, num_rows: int, out_dtype=None, *, transposed: bool = False,
                config: dsd_kernel.MosaicConfig | None = None, interpret=None, epi=None, bias=None):  # fmt: skip
    """The dynamic ``W @ x`` as this backend runs it: the launch order of :func:`dynamic_grid_order` where the
    config names none, then :func:`.dsd.dsd_dynamic` (arguments as there)."""
    cfg = config or dsd_kernel.MosaicConfig()
    if cfg.grid_order is None and data.ndim == 3 and x.ndim == 2:
        bw = data.shape[1] if transposed else data.shape[2]
        cfg = dataclasses.replace(cfg, grid_order=dynamic_grid_order(data.shape[0], num_rows, x.shape[0] // bw))
    return dsd_kernel.dsd_dynamic(rows, cols, keep, valid, data, x, num_rows, out_dtype, transposed=transposed,
                                  config=cfg, interpret=interpret, epi=epi, bias=bias)  # fmt: skip


def _taken(config, cls):
    """``config`` where this op takes its type, else ``None`` (a config of another kernel is ignored)."""
    return config if isinstance(config, cls) else None


def _not_yet(op: str):
    def method(self, s, *args):
        raise NotImplementedError(
            f"the Mosaic GPU backend implements the static dsd, dds and sdd and the dynamic W @ x / x @ W only "
            f"(not {op})"
        )

    method.__name__ = op
    return method


class MosaicBackend:
    """Backend object for :mod:`blocksparse.ops.matmul.api` (``implementation="mosaic"``; see the module
    docstring). The dynamic ``sdd`` raises ``NotImplementedError`` so dispatch moves on to the next
    implementation; the dynamic ``W @ x`` is never first by default (its work list built on the device makes it
    slower than the Triton scan kernel, docs/benchmarks.md)."""

    name = "mosaic"

    @staticmethod
    def _interpret() -> bool:
        interpret = _dispatch.interpreting()
        if not interpret and (why := hardware.hopper_problem()) is not None:
            raise NotImplementedError(why)
        return interpret

    def _dsd(self, s, data, x, epi=None, bias=None):
        interpret = self._interpret()
        if takes(s.pattern):  # blocks of 16 and 32: the banded kernel
            return bands.dsd(s.pattern, data, x, s.out_dtype, epi, bias, config=_taken(s.config, bands.BandConfig),
                             interpret=interpret)  # fmt: skip
        return dsd(s.pattern, data, x, s.out_dtype, config=_taken(s.config, dsd_kernel.MosaicConfig),
                   interpret=interpret, epi=epi, bias=bias)  # fmt: skip

    def _dds(self, s, x, data, epi=None, bias=None):
        interpret = self._interpret()
        if takes(s.pattern):
            return bands.dds(s.pattern, data, x, s.out_dtype, epi, bias, config=_taken(s.config, bands.BandConfig),
                             interpret=interpret)  # fmt: skip
        return dds(s.pattern, data, x, s.out_dtype, epi, bias, config=_taken(s.config, dds_kernel.DdsConfig),
                   interpret=interpret)  # fmt: skip

    def dsd(self, s, data, x):
        return self._dsd(s, data, x)

    def dsd_fused(self, s, data, x, bias):
        return self._dsd(s, data, x, s.epilogue, bias)

    def dds(self, s, x, data):
        return self._dds(s, x, data)

    def dds_fused(self, s, x, data, bias):
        return self._dds(s, x, data, s.epilogue, bias)

    def sdd(self, s, a, b):
        return sdd_kernel.sdd(s.pattern, a, b, s.out_dtype, config=_taken(s.config, sdd_kernel.SddConfig),
                       interpret=self._interpret())  # fmt: skip

    def _dyn(self, s, rows, cols, keep, valid, data, x, epi=None, bias=None):
        return dsd_dynamic(rows, cols, keep, valid, data, x, s.grid[0], s.out_dtype, transposed=s.transposed,
                           config=_taken(s.config, dsd_kernel.MosaicConfig), interpret=self._interpret(), epi=epi,
                           bias=bias)  # fmt: skip

    def dyn_dsd(self, s, rows, cols, keep, valid, data, x):
        return self._dyn(s, rows, cols, keep, valid, data, x)

    def dyn_dsd_fused(self, s, rows, cols, keep, valid, data, x, bias):
        return self._dyn(s, rows, cols, keep, valid, data, x, s.epilogue, bias)

    dyn_sdd = _not_yet("dyn_sdd")
