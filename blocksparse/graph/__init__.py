"""Graph types, below the ops that consume them: :class:`Graph` (host data) and :class:`DynamicGraph` (traced).

A :class:`Graph` is built on the host from an edge list: CSR by destination, its transpose, degrees and the
degree-aware :class:`Schedule`, all static (``jit`` specialises per graph). A :class:`DynamicGraph` holds the
same structure as traced arrays of fixed shapes (:class:`DeviceSchedule`), built inside ``jit``;
:func:`batch` / :func:`readout` pack and pool mini-batches. The GNN ops (:mod:`blocksparse.ops.gnn`) read
both alike; users reach everything here through :mod:`blocksparse.gnn` (``bs.gnn.Graph``, ...).

Modules: ``_common`` (what both types share: :data:`CHUNK_ALIGN`, :func:`check_features`, :func:`poison`,
:func:`nan_unless`), ``_static`` and ``_dynamic`` (one type each, importing only ``_common``), ``_check``
(:func:`check_graph`, which names both).
"""

from ._check import check_graph
from ._common import CHUNK_ALIGN, check_features, nan_unless, poison
from ._dynamic import DeviceSchedule, DynamicGraph, batch, default_chunk, readout
from ._static import Graph, Schedule

__all__ = [
    "CHUNK_ALIGN",
    "DeviceSchedule",
    "DynamicGraph",
    "Graph",
    "Schedule",
    "batch",
    "check_features",
    "check_graph",
    "default_chunk",
    "nan_unless",
    "poison",
    "readout",
]
