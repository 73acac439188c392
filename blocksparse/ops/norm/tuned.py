"""Measured launch shapes of the RMSNorm kernel, as data keyed by device kind: the one place they live.

Key layout: ``TABLES[device_kind][entry_name] -> Entry``. ``device_kind`` is ``blocksparse.hardware.Device.kind``
of :func:`blocksparse.hardware.gpu` (``"NVIDIA H200"``): the GPU the kernel runs on, or, off a GPU (Pallas'
interpreter on a CPU), the planning default, so a CPU runs the kernel as that GPU would. A device without a table
takes :data:`DEFAULT`. Each :class:`Entry` names what measured it: the results JSON in ``benchmarks/results/`` and
its cells, or "not measured: the default". Code reads entries through :func:`get`; docstrings cite an entry by its
name, never its value.

:data:`DEFAULT`, for a GPU nobody measured: the H200's launch shapes (a launch shape changes the speed, never the
result).

Example::

    >>> from blocksparse.ops.norm import tuned
    >>> "decode_norm_warps_h200.json" in tuned.entry("RMS_NORM_TILE", "NVIDIA H200").source
    True
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from ... import hardware

__all__ = ["DEFAULT", "TABLES", "Entry", "entry", "get"]


@dataclasses.dataclass(frozen=True)
class Entry:
    """One measured choice: its value and what produced it."""

    value: Any
    source: str


_PROBE = (
    "benchmarks/results/decode_norm_warps_h200.json (a probe of launch shapes, not a bench suite: the kernel with "
    "the residual on rows x 1 x 2048 bf16, 1, 8 and 32 rows, the Timer's loop under the profiler)"
)

H200 = {
    "RMS_NORM_WARPS": Entry(
        ((4096, 4), (math.inf, 8)),
        f"(widest row, warps) pairs, the first whose width takes the row: {_PROBE}, cells 'norm rows=R warps=W "
        f"rpp=1' for W = 1, 2, 4, 8: 4 warps for rows of 2048; 8 warps for rows wider than 4096: not measured: the "
        f"default",
    ),
    "RMS_NORM_TILE": Entry(
        2048,
        f"elements of the rows one program normalises (a whole number of rows, at least one): {_PROBE}, cells 'norm "
        f"rows=R warps=W rpp=P' for P = 1, 2 and all rows: one row of 2048 a program fastest",
    ),
}

#: A GPU without a table: the H200's launch shapes (see the module docstring).
DEFAULT = {name: Entry(e.value, f"not measured on this device: the H200's ({e.source})") for name, e in H200.items()}

#: Device kind -> entries.
TABLES = {hardware.H200.kind: H200}


def entry(name: str, kind: str | None = None) -> Entry:
    """Entry ``name`` for device ``kind`` (default: :func:`blocksparse.hardware.gpu`'s); :data:`DEFAULT` else."""
    kind = hardware.gpu().kind if kind is None else kind
    table = TABLES.get(kind, DEFAULT)
    if name not in table:
        raise KeyError(f"Expected a tuned RMSNorm entry in {sorted(DEFAULT)}. Got {name!r}.")
    return table[name]


def get(name: str, kind: str | None = None):
    """The value of :func:`entry` ``name``."""
    return entry(name, kind).value
