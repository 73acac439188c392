"""What the ops' tuned tables share: an :class:`Entry` (a measured value and what produced it) and :class:`Tuned`,
the lookup of an op family's entries by device kind.

Key layout: ``tables[device_kind][entry_name] -> Entry``. ``device_kind`` is ``blocksparse.hardware.Device.kind`` of
:func:`blocksparse.hardware.gpu` (``"NVIDIA H200"``): the GPU the kernels run on, or, off a GPU (Pallas'
interpreter on a CPU), the planning default, so a CPU runs the kernels as that GPU would. A device without a table
takes the reference device's values, each marked as not measured there (a launch shape changes the speed, never
the result). Code reads entries through :meth:`Tuned.get`; docstrings cite an entry by its name, never its value.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .. import hardware

__all__ = ["Entry", "Tuned"]


@dataclasses.dataclass(frozen=True)
class Entry:
    """One measured choice: its value and what produced it (the bench suite and cell, or the results JSON)."""

    value: Any
    source: str


class Tuned:
    """One op family's tables (``what`` names it in errors); ``tables[reference]`` also serves every device without a
    table of its own (:attr:`default`)."""

    def __init__(self, what: str, tables: dict[str, dict[str, Entry]], reference: str = hardware.H200.kind):
        self.what, self.tables = what, dict(tables)
        self.default = {name: Entry(e.value, f"not measured on this device: the {reference}'s ({e.source})")
                        for name, e in self.tables[reference].items()}  # fmt: skip

    def entry(self, name: str, kind: str | None = None) -> Entry:
        """Entry ``name`` for device ``kind`` (default: :func:`blocksparse.hardware.gpu`'s); :attr:`default` else."""
        kind = hardware.gpu().kind if kind is None else kind
        table = self.tables.get(kind, self.default)
        if name not in table:
            raise KeyError(f"Expected a tuned {self.what} entry in {sorted(self.default)}. Got {name!r}.")
        return table[name]

    def get(self, name: str, kind: str | None = None):
        """The value of :meth:`entry` ``name``."""
        return self.entry(name, kind).value
