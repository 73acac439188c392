"""What the matrix plan (:mod:`.matrix`) and the graph plan (:mod:`.graph`) share.

Both cut a sequence of lines (a matrix's block rows or block columns, a graph's destination nodes) into one
contiguous range per device of a mesh axis, estimate each candidate's time from the work of its busiest device
and the bytes the devices receive, at the rates of :mod:`.tuned`, and keep the fastest.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from jax.sharding import Mesh

from . import tuned


def mesh_axis_size(mesh, axis) -> int:
    """The number of devices along ``mesh``'s axis ``axis``, else a clear error."""
    if not isinstance(mesh, Mesh):
        raise TypeError(f"Expected a jax.sharding.Mesh. Got {type(mesh).__name__}.")
    if axis not in mesh.axis_names:
        raise ValueError(f"Expected axis to be one of the mesh's axes {tuple(mesh.axis_names)}. Got {axis!r}.")
    return int(mesh.shape[axis])


def balanced_cuts(counts: np.ndarray, parts: int) -> tuple[int, ...]:
    """Contiguous cut points over lines with about ``total / parts`` of ``counts`` (work per line) in each part."""
    lines = counts.size
    cum = np.concatenate([[0], np.cumsum(counts)])
    total = int(cum[-1])
    if total == 0:  # nothing to balance: equal numbers of lines
        return equal_cuts(lines, parts)
    cuts = [0]
    for i in range(1, parts):
        target = i * total / parts
        r = int(np.searchsorted(cum, target, side="left"))
        if r > 0 and abs(cum[r - 1] - target) <= abs(cum[r] - target):
            r -= 1  # the nearer of the two boundaries around the target
        cuts.append(max(cuts[-1], min(r, lines)))
    cuts.append(lines)
    return tuple(cuts)


def equal_cuts(lines: int, parts: int) -> tuple[int, ...]:
    """Cut points giving every part the same number of lines, to within one."""
    return tuple(int(round(i * lines / parts)) for i in range(parts + 1))


def band(cuts: Sequence[int]) -> int:
    """The largest range (every device's part is padded to it), at least 1."""
    return max(1, max(b - a for a, b in zip(cuts[:-1], cuts[1:], strict=True)))


def owner(line: np.ndarray, cuts) -> np.ndarray:
    """The device owning each of ``line`` (line indices), from the ``parts + 1`` cut points."""
    cuts = np.asarray(cuts)
    return np.clip(np.searchsorted(cuts, line, side="right") - 1, 0, cuts.size - 2)


def link_seconds(nbytes, r: tuned.Rates) -> float:
    """Seconds for a device to receive ``nbytes`` over the axis's links."""
    return nbytes / r.link_bytes_per_s.value


def fastest(candidates):
    """The candidate with the smallest estimate ``.seconds``; ties go to the first (the documented order)."""
    return min(candidates, key=lambda c: c.seconds)
