"""Measured launch shapes of the decode attention kernels, as data keyed by device kind: the one place they live.

The lookup by device kind (and the default for a device nobody measured: the H200's values) is
:class:`blocksparse.ops.tuning.Tuned`'s; each :class:`~blocksparse.ops.tuning.Entry` names what measured it: the
results JSON in ``benchmarks/results/`` and its cells, or "not measured: the default".

Example::

    >>> from blocksparse.ops.attention import tuned
    >>> tuned.entry("DECODE_ATTENTION_STAGES", "NVIDIA H200").source.startswith("not measured: the default")
    True
"""

from __future__ import annotations

from ... import hardware
from ..tuning import Entry, Tuned

__all__ = ["DEFAULT", "TABLES", "Entry", "entry", "get"]


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

_TUNED = Tuned("decode attention", {hardware.H200.kind: H200})
#: Device kind -> entries; :data:`DEFAULT` for a GPU without a table (the H200's values, marked unmeasured).
TABLES, DEFAULT = _TUNED.tables, _TUNED.default
entry, get = _TUNED.entry, _TUNED.get
