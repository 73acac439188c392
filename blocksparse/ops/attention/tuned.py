"""Measured launch shapes of the decode attention kernels, as data keyed by device kind: the one place they live.

Key layout: ``TABLES[device_kind][entry_name] -> Entry``. ``device_kind`` is ``blocksparse.hardware.Device.kind``
of :func:`blocksparse.hardware.gpu` (``"NVIDIA H200"``): the GPU the kernels run on, or, off a GPU (Pallas'
interpreter on a CPU), the planning default, so a CPU runs the kernels as that GPU would. A device without a table
takes :data:`DEFAULT`. Each :class:`Entry` names what measured it: the results JSON in ``benchmarks/results/`` and
its cells, or "not measured: the default". Code reads entries through :func:`get`; docstrings cite an entry by its
name, never its value.

:data:`DEFAULT`, for a GPU nobody measured: the H200's launch shapes (a launch shape changes the speed, never the
result).

Example::

    >>> from blocksparse.ops.attention import tuned
    >>> tuned.entry("DECODE_ATTENTION_STAGES", "NVIDIA H200").source.startswith("not measured: the default")
    True
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ... import hardware

__all__ = ["DEFAULT", "TABLES", "Entry", "entry", "get"]


@dataclasses.dataclass(frozen=True)
class Entry:
    """One measured choice: its value and what produced it."""

    value: Any
    source: str


_R = "benchmarks/results/"
_TIMED_AS_IS = (
    f"{_R}decode_attention_1b_h200.json times the kernel at this setting against its XLA reference "
    f"(attention_xla_vs_pallas) and in the 1B-class decoder's generation, no other launch shape"
)
_STEP_AS_IS = (
    f"{_R}decode_step_attention_1b_h200.json times the 1B-class decoder's generation with the kernel at this "
    f"setting, varying the walk's chunk and parts only"
)

H200 = {
    "DECODE_ATTENTION_WARPS": Entry(4, f"not measured: the default ({_TIMED_AS_IS})"),
    "DECODE_ATTENTION_STAGES": Entry(2, f"not measured: the default ({_TIMED_AS_IS})"),
    "DECODE_STEP_WARPS": Entry(
        4,
        f"{_R}decode_norm_warps_h200.json (a probe of launch shapes, not a bench suite: the kernel at 32 heads, 8 "
        f"kv heads of 64, a 256-slot cache, slots 0..200), cells 'attn b=B warps=W parts=P' for B = 1, 8, W = 1, 2, "
        f"4, P = 1, 2, 4, 8: 4 warps fastest at batch 1; at batch 8 two warps with 4 parts within a fraction of a "
        f"microsecond of the default parts at 4 warps, left as it is",
    ),
    "DECODE_STEP_STAGES": Entry(2, f"not measured: the default ({_STEP_AS_IS})"),
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
        raise KeyError(f"Expected a tuned decode attention entry in {sorted(DEFAULT)}. Got {name!r}.")
    return table[name]


def get(name: str, kind: str | None = None):
    """The value of :func:`entry` ``name``."""
    return entry(name, kind).value
