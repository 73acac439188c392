"""Kernel geometry of the Pallas attention kernels, chosen per call (``kernel_config=``): never a global.

Every choice computes the same function (up to float32 rounding order); only the tiling changes.
The default, ``AttentionConfig()``, leaves each knob to the measured rule of the kernels' geometry
(H200, fp32, power-law graph N = 262,144, E = 8,388,608, F = 128, GATv2 forward + backward): one head
of 128 features per program takes the ``flat`` layout, 16 edges per step and ``deferred`` reductions
(6.71 ms against 19.82 for the ``(be, 1, 128)`` view at 32 edges per step); several heads per program
(8 heads of 16) take the ``heads`` view and 16 edges per step (5.92 against 7.31 ms at 32).
"""

from __future__ import annotations

import dataclasses

__all__ = ["AttentionConfig", "LAYOUTS"]

#: ``heads``: a program's tile of ``hb`` heads is viewed as ``(be, hb, Dp)`` (the default, for every shape).
#: ``flat``: with one head per program (``Dp >= 128``), 2-D ``(be, Dp)`` tiles, per-edge logits ``(be,)``
#: and per-head scalars: no size-1 axis, no reshape. ``groups``: one head per program viewed as
#: ``(be, Dp // 16, 16)``, the shape of 8 heads of 16, the logits summed in two stages. With several
#: heads per program ``flat`` and ``groups`` run as ``heads``.
LAYOUTS = ("heads", "flat", "groups")
_EDGES = (8, 16, 32, 64, 128)  # powers of two dividing the heavy-node chunk (a multiple of 128)
_WARPS = (1, 2, 4, 8)


@dataclasses.dataclass(frozen=True)
class AttentionConfig:
    """How the Pallas kernels of :func:`~blocksparse.gnn.gatv2` / :func:`~blocksparse.gnn.graph_attention` tile.

    Hashable (part of the op's static argument, so each configuration is its own ``jit`` trace); the
    XLA path ignores it.

    Attributes:
        layout: one of :data:`LAYOUTS`; ``None``: ``flat`` with one head per program, else ``heads``.
        edges_per_step: in-edges per loop step ``be`` (8, 16, 32, 64 or 128); ``None``: 16 for 128 or more
            features per program, else ``4096 / (hb * Dp)`` clipped to [16, 128].
        num_warps: 1, 2, 4 or 8; ``None``: 4 for tiles of 2048 elements or more, else 2 or 1.
        deferred: keep per-row partials (``be`` rows: online-softmax state in the forward, gradient
            sums in the backward) across the loop and reduce over the edge axis once after it,
            instead of reducing across warps at every step; GATv2's source pass sums ``dx_src`` in one
            accumulator. ``None``: with the ``flat`` layout.
    """

    layout: str | None = None
    edges_per_step: int | None = None
    num_warps: int | None = None
    deferred: bool | None = None

    def __post_init__(self):
        if self.layout is not None and self.layout not in LAYOUTS:
            raise ValueError(f"Expected layout None or one of {LAYOUTS}. Got {self.layout!r}.")
        knobs = (("edges_per_step", self.edges_per_step, _EDGES), ("num_warps", self.num_warps, _WARPS))
        for name, v, allowed in knobs:
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v not in allowed):
                raise ValueError(f"Expected {name} None or one of {allowed}. Got {v!r}.")
        if self.deferred is not None and not isinstance(self.deferred, bool):
            raise ValueError(f"Expected deferred None or a bool. Got {self.deferred!r}.")

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
        return "+".join(parts)


def resolve(config) -> AttentionConfig:
    """``None`` -> the default; an :class:`AttentionConfig` as is; anything else raises ``TypeError``."""
    if config is None:
        return AttentionConfig()
    if not isinstance(config, AttentionConfig):
        raise TypeError(f"Expected kernel_config None or an AttentionConfig. Got {config!r}.")
    return config
