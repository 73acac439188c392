"""The GNN ops' Pallas configurations, passed as ``config=`` (frozen, hashable: part of each op's jit cache key).

One config class per op family, each naming the backend it configures (``backend = "pallas"``):

* :class:`GatherConfig` for :func:`~blocksparse.gnn.spmm` and :func:`~blocksparse.gnn.aggregate`: light nodes
  per program and a :class:`GatherVariant` of the gather kernels;
* :class:`AttentionConfig` for :func:`~blocksparse.gnn.gatv2` and :func:`~blocksparse.gnn.graph_attention`:
  the attention kernels' tiling.

Every choice computes the same function (sums may round in another order); only the kernel changes. A field
left ``None`` takes the measured rule of :mod:`blocksparse.ops.gnn.order` (data in
:mod:`blocksparse.ops.gnn.tuned`). This module imports no kernel: configs are made and checked without Pallas.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax.numpy as jnp
import numpy as np

__all__ = [
    "AGGREGATE_NODES_PER_PROGRAM",
    "LAYOUTS",
    "SPMM_NODES_PER_PROGRAM",
    "AttentionConfig",
    "GatherConfig",
    "GatherVariant",
]

#: Light nodes per program the packed SpMM kernel takes (1: the one-node kernel).
SPMM_NODES_PER_PROGRAM = (1, 2, 4, 8, 16)
#: Light nodes per program the max / min kernels take (1: the one-node kernel).
AGGREGATE_NODES_PER_PROGRAM = (1, 2, 4, 8, 16, 32)

#: ``heads``: a program's tile of ``hb`` heads is viewed as ``(be, hb, Dp)`` (every shape).
#: ``flat``: with one head per program (``Dp >= 32``), 2-D ``(be, Dp)`` tiles, per-edge logits ``(be,)``
#: and per-head scalars: no size-1 axis, no reshape. ``groups``: one head per program viewed as
#: ``(be, Dp // 16, 16)``, the shape of 8 heads of 16, the logits summed in two stages. With several
#: heads per program ``flat`` and ``groups`` run as ``heads``.
LAYOUTS = ("heads", "flat", "groups")
_EDGES = (8, 16, 32, 64, 128)  # powers of two dividing the heavy-node chunk (a multiple of 128)
_WARPS = (1, 2, 4, 8)


@dataclasses.dataclass(frozen=True)
class GatherVariant:
    """Variants of the gather kernels (SpMM's ``csr_sum``, max / min's ``segment_extreme``).

    ``GatherVariant()`` is the plain kernel; ``variant=None`` takes each entry point's measured default
    (:func:`blocksparse.ops.gnn.order.spmm_variant`, :func:`~blocksparse.ops.gnn.order.aggregate_variant`).
    Results never depend on a variant (same float32 accumulation; sums may round differently where the edges
    per step change, max / min are exact).

    Attributes:
        pairs: gather 2-byte ``x`` (bfloat16 / float16) as ``uint32`` pairs of features (``x`` bitcast to
            ``(N, F/2)``), unpacked to two float32 halves in registers (bfloat16: ``u << 16`` and
            ``u & 0xFFFF0000``), reduced separately and re-interleaved on output. float32 ``x``, or an odd
            ``F`` in a kernel that does not pad ``x``, falls back to the plain gather.
        tile_bytes: size edge tiles by bytes, not elements: ``4 / itemsize`` times the default edges per step
            (2x for 2-byte ``x``, unchanged for float32); ignored where ``be`` is given.
        num_warps: warps per program (``None``: the kernel's own rule).
        prefetch: load the next step's edge ids before gathering this step's rows (the SpMM kernels; the
            packed max / min kernel has its own ``prefetch`` argument, which this also turns on).
        key_reduce: max / min without ``with_arg``: reduce one order-preserving int32 key per element (NaN
            mapped to the top / bottom) instead of a float max plus a separate NaN-flag reduction.
        narrow_loads: gather 2-byte ``x`` 4 features (8 bytes) a lane instead of Triton's 8 (16 bytes), so a
            128-feature row spans a whole warp, as a float32 row does, and the reductions over a step's edges
            stay inside each thread; float32 ``x`` and the ``pairs`` gather are unchanged.
    """

    pairs: bool = False
    tile_bytes: bool = False
    num_warps: int | None = None
    prefetch: bool = False
    key_reduce: bool = False
    narrow_loads: bool = False

    def __post_init__(self):
        for name in ("pairs", "tile_bytes", "prefetch", "key_reduce", "narrow_loads"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"Expected GatherVariant.{name} a bool. Got {getattr(self, name)!r}.")
        w = self.num_warps
        if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w not in (1, 2, 4, 8, 16)):
            raise ValueError(f"Expected GatherVariant.num_warps None or one of 1, 2, 4, 8, 16. Got {w!r}.")

    def pair_dtype(self, dtype, f: int):
        """The 2-byte dtype that ``x`` is gathered in pairs of, or ``None`` (plain gather)."""
        dtype = jnp.dtype(dtype)
        return dtype if self.pairs and dtype.itemsize == 2 and f % 2 == 0 else None

    def edge_scale(self, dtype) -> int:
        """Factor on the default edges per step: ``4 / itemsize`` with ``tile_bytes``, else 1."""
        return 4 // jnp.dtype(dtype).itemsize if self.tile_bytes else 1

    def warps(self, default: int) -> int:
        return default if self.num_warps is None else self.num_warps

    def tag(self) -> str:
        """A short name for kernel names and tables: ``""`` for the default."""
        parts = [n for n, on in (("pairs", self.pairs), ("bytes", self.tile_bytes), ("prefetch", self.prefetch),
                                 ("key", self.key_reduce), ("narrow", self.narrow_loads)) if on]  # fmt: skip
        parts += [] if self.num_warps is None else [f"w{self.num_warps}"]
        return "+".join(parts)

    def name_suffix(self) -> str:
        """The kernel name's suffix (``_v_pairs_key``): none for the default, whose names profiles and tests know."""
        tag = self.tag()
        return "_v_" + tag.replace("+", "_") if tag else ""


def check_variant(variant) -> GatherVariant:
    """``None`` -> the plain kernel; a :class:`GatherVariant` as is; raises ``ValueError`` otherwise."""
    if variant is None:
        return GatherVariant()
    if not isinstance(variant, GatherVariant):
        raise ValueError(f"Expected variant None or a GatherVariant. Got {variant!r}.")
    return variant


def _power_of_two_in(value, allowed: tuple[int, ...]) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool) and int(value) in allowed


@dataclasses.dataclass(frozen=True)
class GatherConfig:
    """How the Pallas kernels of :func:`~blocksparse.gnn.spmm` and :func:`~blocksparse.gnn.aggregate` run.

    Passed as ``config=``: hashable (part of the op's static argument, so each configuration is its own ``jit``
    trace). With ``implementation=None`` the op then runs only the Pallas backend (no silent fallback to XLA);
    an explicit ``implementation`` must include ``"pallas"``, and the XLA backend ignores the config.

    Attributes:
        nodes_per_program: light nodes one program takes (``None``: the measured rule,
            :func:`blocksparse.ops.gnn.order.aggregate_variant` / :func:`~blocksparse.ops.gnn.order.spmm_variant`);
            1 is the one-node kernel. SpMM takes 1, 2, 4, 8 or 16; max / min also 32.
        variant: a :class:`GatherVariant` of the kernel (``None``: the measured default where
            ``nodes_per_program`` is ``None`` too, else the plain kernel; ``GatherVariant()``: the plain kernel).

    The config applies to the op's forward kernel; SpMM's backward (an SpMM over the transpose) takes the
    defaults on the same backend, and max / min's backward is a scatter with no kernel to configure.
    """

    backend: ClassVar[str] = "pallas"

    nodes_per_program: int | None = None
    variant: GatherVariant | None = None

    def __post_init__(self):
        npp = self.nodes_per_program
        if npp is not None and not _power_of_two_in(npp, AGGREGATE_NODES_PER_PROGRAM):
            raise ValueError(
                f"Expected nodes_per_program None or a power of two in [1, {AGGREGATE_NODES_PER_PROGRAM[-1]}]. "
                f"Got {npp!r}."
            )
        if npp is not None:
            object.__setattr__(self, "nodes_per_program", int(npp))
        if self.variant is not None and not isinstance(self.variant, GatherVariant):
            raise TypeError(f"Expected variant None or a GatherVariant. Got {type(self.variant).__name__}.")

    @property
    def label(self) -> str:
        """Short name for tables: ``default``, ``G2``, ``G1+key``, ..."""
        parts = [] if self.nodes_per_program is None else [f"G{self.nodes_per_program}"]
        parts += [] if self.variant is None else [self.variant.tag() or "plain"]
        return "+".join(parts) or "default"


@dataclasses.dataclass(frozen=True)
class AttentionConfig:
    """How the Pallas kernels of :func:`~blocksparse.gnn.gatv2` / :func:`~blocksparse.gnn.graph_attention` tile.

    Passed as ``config=``: hashable (part of the op's static argument, so each configuration is its own ``jit``
    trace). With ``implementation=None`` the op then runs only the Pallas backend; an explicit
    ``implementation`` must include ``"pallas"``, and the XLA path ignores the config. It applies to the
    forward kernel and both backward passes.

    Attributes:
        layout: one of :data:`LAYOUTS`; ``None``: with one head per program the layout of the tuned entry
            ``attention.one_head_layout`` (:mod:`blocksparse.ops.gnn.tuned`), else ``heads``.
        edges_per_step: in-edges per loop step ``be`` (8, 16, 32, 64 or 128); ``None``: the tuned entry
            ``attention.wide_edges_per_step`` for 128 or more features per program, else ``4096 / (hb * Dp)``
            clipped to [16, 128].
        num_warps: 1, 2, 4 or 8; ``None``: 4 for tiles of 2048 elements or more, else 2 or 1.
        deferred: keep per-row partials (``be`` rows: online-softmax state in the forward, gradient
            sums in the backward) across the loop and reduce over the edge axis once after it,
            instead of reducing across warps at every step; GATv2's source pass sums ``dx_src`` in one
            accumulator. ``None``: with the ``flat`` layout.
        narrow_loads: gather 2-byte features 4 a lane (8 bytes) instead of 8 (16 bytes), as
            ``GatherVariant.narrow_loads``; ``None``: the tuned entry ``attention.narrow_loads``.
    """

    backend: ClassVar[str] = "pallas"

    layout: str | None = None
    edges_per_step: int | None = None
    num_warps: int | None = None
    deferred: bool | None = None
    narrow_loads: bool | None = None

    def __post_init__(self):
        if self.layout is not None and self.layout not in LAYOUTS:
            raise ValueError(f"Expected layout None or one of {LAYOUTS}. Got {self.layout!r}.")
        knobs = (("edges_per_step", self.edges_per_step, _EDGES), ("num_warps", self.num_warps, _WARPS))
        for name, v, allowed in knobs:
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v not in allowed):
                raise ValueError(f"Expected {name} None or one of {allowed}. Got {v!r}.")
        if self.deferred is not None and not isinstance(self.deferred, bool):
            raise ValueError(f"Expected deferred None or a bool. Got {self.deferred!r}.")
        if self.narrow_loads is not None and not isinstance(self.narrow_loads, bool):
            raise ValueError(f"Expected narrow_loads None or a bool. Got {self.narrow_loads!r}.")

    @property
    def label(self) -> str:
        """Short name for tables: ``heads``, ``flat+be16+w8+deferred``, ..."""
        parts = [self.layout or "default"]
        if self.edges_per_step is not None:
            parts.append(f"be{self.edges_per_step}")
        if self.num_warps is not None:
            parts.append(f"w{self.num_warps}")
        if self.deferred is not None:
            parts.append("deferred" if self.deferred else "eager")
        if self.narrow_loads is not None:
            parts.append("narrow" if self.narrow_loads else "wide")
        return "+".join(parts)
