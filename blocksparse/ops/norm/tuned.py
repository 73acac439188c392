"""Measured launch shapes of the RMSNorm kernel, as data keyed by device kind: the one place they live.

The lookup by device kind (and the default for a device nobody measured: the H200's values) is
:class:`blocksparse.ops.tuning.Tuned`'s; each :class:`~blocksparse.ops.tuning.Entry` names what measured it: the
results JSON in ``benchmarks/results/`` and its cells, or "not measured: the default".

Example::

    >>> from blocksparse.ops.norm import tuned
    >>> "decode_norm_warps_h200.json" in tuned.entry("RMS_NORM_TILE", "NVIDIA H200").source
    True
"""

from __future__ import annotations

import math

from ... import hardware
from ..tuning import Entry, Tuned

__all__ = ["DEFAULT", "TABLES", "Entry", "entry", "get"]


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

_TUNED = Tuned("RMSNorm", {hardware.H200.kind: H200})
#: Device kind -> entries; :data:`DEFAULT` for a GPU without a table (the H200's values, marked unmeasured).
TABLES, DEFAULT = _TUNED.tables, _TUNED.default
entry, get = _TUNED.entry, _TUNED.get
