"""Measured numbers of the GNN kernels, as data keyed by device kind: the one place they live.

Key layout: ``TABLES[device_kind][entry_name] -> Entry``. ``device_kind`` is
``blocksparse.hardware.Device.kind`` of :func:`blocksparse.hardware.gpu` (``"NVIDIA H200"``): the GPU the
kernels run on, or, off a GPU (Pallas' interpreter on a CPU, plans made there), the planning default, so a
CPU runs the same kernels as that GPU. A device without a table takes the table of the device whose SMs it has
(:data:`SAME_SMS`: the H100 the H200's), else :data:`DEFAULT`.

Each :class:`Entry` names the ``blocksparse bench`` suite and cell that measured it and the results JSON in
``benchmarks/results/`` it came from: suite ``gnn`` (the ops on the power-law graph, N = 262,144,
E = 8,388,608, F = 128), ``gnn-variants`` (kernel variant sweeps on that graph: gather variants, GATv2
variants, packed SpMM and max), ``gnn-graphs`` (the paper's graphs). A cell is named
``op/dtype/variant`` after the JSON's rows (``spmm/bfloat16/w1``: SpMM, bfloat16 features, one warp per
program). Code reads entries through :func:`get`; docstrings cite an entry by name, never its value.

:data:`DEFAULT`, for a GPU nobody measured: the same backend orders (Pallas first, XLA where a kernel cannot
run) and the same structural rules (edges per step and per program), but each kernel's plain form where the
H200 chose an opt-in variant (fewer warps per program, int32 key reductions, the ``flat`` attention view,
16-edge attention steps). Those variants won on the H200 by trading occupancy against latency on its SMs;
the plain kernels are the ones every test checks, and the settings the H200 measured its variants against.

:data:`CHOICES` holds the other kind of measured fact: on which graphs XLA's segment ops were faster than the Pallas
kernels. Key layout: ``CHOICES[device_kind][(family, dtype, pass)] -> tuple[Measured, ...]``, ``family`` one of
``spmm`` (every ``reduce`` / ``norm``: one product kernel), ``spmm_gcn`` (SpMM with ``norm="both"`` where it was
measured: a weighted product, the norm riding on the edge weights, whose faster backend can differ from the
unweighted one's), ``aggregate`` (max and
min: one kernel), ``gatv2``, ``graph_attention``; ``dtype`` ``float32`` or ``bfloat16``; ``pass`` ``fwd`` or
``fwd+bwd``. Each :class:`Measured` is one graph: its statistics (what the host knows of a graph) and the backend that
was faster there, naming the results JSON and its cell. The H200's all come from one run of 93 of the cells
(:data:`FULL_RUN`), written as the table ``_H200_FASTER``; the H100's from one run of every cell with the
current kernels (:data:`H100_RUN`, the table ``_H100_FASTER``). :func:`blocksparse.ops.gnn.order.choice` reads
them (a device without its own, those of the device in :data:`SAME_SMS`); a key without measurements, a device
without any (every GPU but the H200 and the H100) and a graph far from every measured one take the default order
(Pallas first).
"""

from __future__ import annotations

import dataclasses

from ... import hardware
from .config import GatherVariant

__all__ = ["CHOICES", "DEFAULT", "SAME_SMS", "TABLES", "Entry", "Measured", "entry", "get", "measured"]


@dataclasses.dataclass(frozen=True)
class Entry:
    """One measured choice: its value and where it came from.

    Attributes:
        value: what the code reads.
        suite: the ``blocksparse bench`` suite that measured it (``gnn``, ``gnn-variants``, ``gnn-graphs``).
        cell: the suite's cell (``op/dtype/variant``), or cells joined by ``vs``.
        results: the results JSON under ``benchmarks/results/``.
        note: what was compared, in words (no numbers: the JSON has them).
    """

    value: object
    suite: str = ""
    cell: str = ""
    results: str = ""
    note: str = ""


# The graphs measured (statistics from the JSONs' graph records).
_ROADS = dict(graph="city-roads-L", nodes=142_257, edges=463_710, max_in_degree=4, feat=128)
_ARXIV = dict(graph="ogbn-arxiv", nodes=169_343, edges=1_166_243, max_in_degree=13_185, feat=128)
_TWITCH = dict(graph="twitch-views", nodes=168_114, edges=13_595_114, max_in_degree=35_802, feat=128)
_PRODUCTS = dict(graph="ogbn-products", nodes=2_449_029, edges=123_718_280, max_in_degree=17_443, feat=128)
_POKEC = dict(graph="pokec", nodes=1_632_803, edges=30_622_564, max_in_degree=13_665, feat=128)
_POWER_LAW = dict(graph="power-law", nodes=262_144, edges=8_388_608, max_in_degree=149_288, feat=128)


def _mean(stats: dict) -> float:
    """A measured graph's mean in-degree."""
    return stats["edges"] / stats["nodes"]


_PAIRS = ("pallas", "xla")  # the Pallas kernel first, XLA's segment ops where it cannot run

H200 = {
    # ------------------------------------------------------------------ backend orders
    "spmm.order": Entry(
        _PAIRS,
        suite="gnn",
        cell="spmm_sum/float32/pallas vs spmm_sum/float32/xla",
        results="gnn_h200_run5.json",
        note="the Pallas SpMM against XLA's sorted segment_sum, float32 features",
    ),
    "spmm.order_half": Entry(
        _PAIRS,
        suite="gnn-variants",
        cell="spmm/bfloat16/w1 vs spmm/bfloat16/xla",
        results="gather_defaults_h200.json",
        note="2-byte features: the one-warp kernel against XLA's sorted segment_sum (XLA had been first before)",
    ),
    "aggregate.order": Entry(
        _PAIRS,
        suite="gnn",
        cell="aggregate_max/float32/pallas vs aggregate_max/float32/xla",
        results="gnn_h200_run5.json",
        note="the Pallas max against XLA's sorted segment_max, forward and forward + backward",
    ),
    "attention.order": Entry(
        _PAIRS,
        suite="gnn",
        cell="gatv2/float32/pallas vs gatv2/float32/xla",
        results="gnn_h200_run2.json",
        note="the fused kernels against the XLA reference (E x H x D per-edge tensors)",
    ),
    # ------------------------------------------------------------------ SpMM kernel
    "spmm.variant": Entry(
        GatherVariant(num_warps=1),
        suite="gnn-variants",
        cell="spmm/float32/w1 vs spmm/float32/default",
        results="gather_defaults_h200.json",
        note="the one-node kernel's warps per program, float32 and bfloat16: latency-bound, smaller programs win",
    ),
    "spmm.light_edges_per_step": Entry(
        (32, 16),
        suite="gnn-variants",
        cell="spmm/float32/be16 vs spmm/float32/be32 vs spmm/float32/be64",
        results="gnn_spmm_edge_tile_h200.json",
        note="(mean in-degree, edges per step): graphs of mean in-degree up to the first step the second many "
        "edges at a time (traced power-law graphs of mean 16 and 32)",
    ),
    # ------------------------------------------------------------------ max / min kernels
    "aggregate.edges_per_program": Entry(
        64,
        suite="gnn-variants",
        cell="max/float32/G1 vs max/float32/G2 vs max/float32/G4 vs max/float32/G8",
        results="gnn_max_nodes_per_program_h200.json",
        note="the in-edges per program the packed kernel's nodes-per-program rule aims at (G = 2 at mean 32)",
    ),
    "aggregate.one_node_tile": Entry(
        2048,
        suite="gnn",
        cell="aggregate_max/float32/be16 vs be32 vs be64",
        results="gnn_h200_run2.json",
        note="elements of the one-node kernel's (edges, features) tile: 16 edges per step at 128 features",
    ),
    "aggregate.values_only": Entry(
        {"float32": (1, GatherVariant(key_reduce=True)), "half": (2, GatherVariant(num_warps=2, narrow_loads=True))},
        suite="gnn-variants",
        cell="max/float32/G1+key vs max/float32/default (gather_defaults_h200.json); half max <graph>: G2+w2+narrow "
        "vs narrow vs wide vs G4+w2+narrow vs G1+key+narrow",
        results="gnn_half_loads_h200.json",
        note="(nodes per program, variant) of max / min without the arg-max, by feature width: float32 one node "
        "per program reducing int32 keys; 2-byte features two nodes per program (at most the degree rule's count) on "
        "two warps, the rows gathered 4 features a lane (fastest on the power-law graph, ogbn-arxiv and "
        "city-roads-L, mean in-degrees 32, 6.9 and 3.3)",
    ),
    "aggregate.with_arg": Entry(
        {
            "float32": (None, GatherVariant(num_warps=1), None),
            "half": (4, GatherVariant(num_warps=1, narrow_loads=True), (_mean(_ARXIV), _mean(_POWER_LAW))),
        },
        suite="gnn-variants",
        cell="max/float32/w1 vs max/float32/default vs max/float32/w2 (--with-arg, gather_with_arg_h200.json); "
        "half max_with_arg <graph>: G4+w1+narrow vs G2+w1+narrow vs narrow vs wide",
        results="gnn_half_max_with_arg_h200.json",
        note="(nodes per program, variant, mean in-degrees) of max / min with the arg-max (the forward under grad), "
        "by feature width: float32 the degree rule's nodes per program on one warp; 2-byte features four nodes a "
        "program on one warp, the rows gathered 4 features a lane, on graphs whose mean in-degree lies within the "
        "range where four measured fastest (ogbn-arxiv's and the power-law graph's, 6.89 and 32, exactly; the "
        "rule's count on city-roads-L, 3.3, and past the range)",
    ),
    # ------------------------------------------------------------------ attention kernels
    "attention.one_head_layout": Entry(
        "flat",
        suite="gnn-variants",
        cell="gatv2/float32/1x128/default vs gatv2/float32/1x128/heads+be32+eager",
        results="gatv2_defaults_h200.json",
        note="one head of 128 features per program: 2-D (edges, features) tiles with deferred reductions against "
        "the (edges, 1, 128) view, GATv2 forward + backward",
    ),
    "attention.wide_edges_per_step": Entry(
        16,
        suite="gnn-variants",
        cell="gatv2/float32/8x16/default vs gatv2/float32/8x16/heads+be32",
        results="gatv2_defaults_h200.json",
        note="edges per step of a program of 128 or more features (one head of 128, eight of 16)",
    ),
    "attention.narrow_loads": Entry(
        True,
        suite="gnn-variants",
        cell="half gatv2 <graph> fwd+bwd: narrow vs wide; half graph_attention <graph> fwd+bwd: narrow vs wide",
        results="gnn_half_loads_h200.json",
        note="2-byte features gathered 4 a lane (a 128-feature row per warp) against Triton's 8 a lane (half a "
        "warp, reductions shuffling between lanes), GATv2 and dot-product attention, forward and backward",
    ),
}

#: A GPU without a table (see the module docstring): plain kernels, the same orders and structural rules.
DEFAULT = {
    **H200,
    "spmm.variant": Entry(GatherVariant(), note="the plain kernel (its own warps rule)"),
    "aggregate.values_only": Entry(
        {"float32": (None, GatherVariant()), "half": (None, GatherVariant())},
        note="the nodes-per-program rule and the plain kernel",
    ),
    "aggregate.with_arg": Entry(
        {"float32": (None, GatherVariant(), None), "half": (None, GatherVariant(), None)},
        note="the nodes-per-program rule and the plain kernel",
    ),
    "attention.one_head_layout": Entry("heads", note="the (edges, heads, head size) view of every shape"),
    "attention.wide_edges_per_step": Entry(None, note="the tile-size rule of every program width"),
    "attention.narrow_loads": Entry(False, note="Triton's own vector width"),
}

#: Device kind -> entries.
TABLES = {hardware.H200.kind: H200}
#: Device kind -> the measured kind whose SMs it has, for a device without tables of its own: the H100 (SXM, 80 GB)
#: is the H200's GH100 die, 132 SMs alike, with 3.35 TB/s of memory bandwidth for 4.8. The variants and layouts were
#: chosen by trading occupancy against latency on those SMs, and XLA's segment ops and the kernels both stream the
#: same bytes, so the H200's entries serve it until it has its own (its choices are its own: :data:`H100_RUN`).
SAME_SMS = {hardware.H100.kind: hardware.H200.kind}


# ------------------------------------------------------------------ which backend, by the graph
@dataclasses.dataclass(frozen=True)
class Measured:
    """One graph on which the Pallas kernel and XLA's segment ops ran in one process, and which was faster.

    Attributes:
        graph: the graph's name (a stand-in of :func:`blocksparse.gnn.paper_graph`, or ``power-law``:
            ``bs.gnn.power_law(262144, 8388608)``).
        nodes, edges, max_in_degree: its statistics (the JSON's ``graphs`` or ``graph`` record).
        feat: features per node (``H x D`` for attention).
        faster: ``"pallas"`` or ``"xla"``.
        results: the results JSON under ``benchmarks/results/``.
        cell: the rows compared (``op/dtype/...: ours vs xla``), as the JSON names them.
        note: what the XLA side was, where it is not the ``xla`` backend itself.
    """

    graph: str
    nodes: int
    edges: int
    max_in_degree: int
    feat: int
    faster: str
    results: str
    cell: str
    note: str = ""

    @property
    def mean_in_degree(self) -> float:
        return self.edges / self.nodes


#: The H200's run: the ``gnn-graphs`` suite with the torch peers (``benchmarks/bench_gnn_graphs.py``), both backends
#: named in each cell, one version of the code on one H200, resumed across commands; 93 of its 168 cells (pokec's
#: bfloat16 cells, ogbn-products and the power-law graph not run: docs/gnn.md, "The H200's run").
FULL_RUN = "gnn_full_h200.json"
_GRAPHS = (_ROADS, _ARXIV, _TWITCH, _POKEC, _PRODUCTS, _POWER_LAW)  # the columns of _H200_FASTER
#: The family's cell of the run: SpMM by its sum, max / min by max (one kernel each).
_CELL_OP = {"spmm": "spmm_sum", "spmm_gcn": "spmm_gcn", "aggregate": "max", "gatv2": "gatv2",
            "graph_attention": "graph_attention"}  # fmt: skip
_TIE = "a tie: XLA faster by at most 2%, the default order kept"  # blocksparse.bench.gnn_graphs.TIE_NOTE

# (family, dtype, pass) -> the faster backend on each graph of _GRAPHS in FULL_RUN (its cell's pallas_loop_ms against
# xla_loop_ms); "tie": XLA faster by at most 2%, the kernels kept; None: the cell cannot tell (not run, a backend out
# of memory or timed once). What blocksparse.bench.gnn_graphs.measured_from reads from the run's JSON.
_H200_FASTER = {
    #                                            city-road  ogbn-arxi  twitch-vi      pokec  ogbn-prod  power-law
    ('spmm', 'float32', 'fwd'):                  ( 'pallas',  'pallas',     'xla',  'pallas',      None,      None),
    ('spmm', 'float32', 'fwd+bwd'):              ( 'pallas',  'pallas',     'xla',      None,      None,      None),
    ('spmm', 'bfloat16', 'fwd'):                 ( 'pallas',  'pallas',  'pallas',      None,      None,      None),
    ('spmm', 'bfloat16', 'fwd+bwd'):             ( 'pallas',  'pallas',  'pallas',      None,      None,      None),
    ('spmm_gcn', 'float32', 'fwd'):              (    'xla',  'pallas',     'xla',  'pallas',      None,      None),
    ('spmm_gcn', 'float32', 'fwd+bwd'):          ( 'pallas',  'pallas',     'xla',  'pallas',      None,      None),
    ('spmm_gcn', 'bfloat16', 'fwd'):             ( 'pallas',  'pallas',  'pallas',      None,      None,      None),
    ('spmm_gcn', 'bfloat16', 'fwd+bwd'):         ( 'pallas',  'pallas',  'pallas',      None,      None,      None),
    ('aggregate', 'float32', 'fwd'):             ( 'pallas',  'pallas',     'xla',  'pallas',      None,      None),
    ('aggregate', 'float32', 'fwd+bwd'):         ( 'pallas',  'pallas',     'xla',  'pallas',      None,      None),
    ('aggregate', 'bfloat16', 'fwd'):            ( 'pallas',  'pallas',     'xla',      None,      None,      None),
    ('aggregate', 'bfloat16', 'fwd+bwd'):        ( 'pallas',  'pallas',     'xla',      None,      None,      None),
    ('gatv2', 'float32', 'fwd'):                 ( 'pallas',  'pallas',  'pallas',  'pallas',      None,      None),
    ('gatv2', 'float32', 'fwd+bwd'):             (    'xla',  'pallas',      None,      None,      None,      None),
    ('gatv2', 'bfloat16', 'fwd'):                (    'xla',  'pallas',  'pallas',      None,      None,      None),
    ('gatv2', 'bfloat16', 'fwd+bwd'):            (    'xla',  'pallas',      None,      None,      None,      None),
    ('graph_attention', 'float32', 'fwd'):       ( 'pallas',  'pallas',  'pallas',      None,      None,      None),
    ('graph_attention', 'float32', 'fwd+bwd'):   (    'xla',  'pallas',  'pallas',      None,      None,      None),
    ('graph_attention', 'bfloat16', 'fwd'):      ( 'pallas',  'pallas',  'pallas',      None,      None,      None),
    ('graph_attention', 'bfloat16', 'fwd+bwd'):  (    'xla',  'pallas',  'pallas',      None,      None,      None),
}  # fmt: skip


#: The H100's run: the same command on one H100 (80 GB HBM3), every cell of the six graphs, with the kernels and XLA's
#: segment ops as they are now, resumed across commands (docs/gnn.md, "The full table"); its cells read as
#: _H200_FASTER's, by the same ``measured_from``.
H100_RUN = "gnn_full_run2_h100.json"
_H100_FASTER = {
    #                                            city-road  ogbn-arxi  twitch-vi      pokec  ogbn-prod  power-law
    ('spmm', 'float32', 'fwd'):                  ( 'pallas',  'pallas',     'xla',  'pallas',  'pallas',  'pallas'),
    ('spmm', 'float32', 'fwd+bwd'):              ( 'pallas',  'pallas',     'xla',  'pallas',  'pallas',  'pallas'),
    ('spmm', 'bfloat16', 'fwd'):                 ( 'pallas',  'pallas',  'pallas',  'pallas',  'pallas',  'pallas'),
    ('spmm', 'bfloat16', 'fwd+bwd'):             ( 'pallas',  'pallas',  'pallas',  'pallas',  'pallas',  'pallas'),
    ('spmm_gcn', 'float32', 'fwd'):              ( 'pallas',  'pallas',     'xla',  'pallas',  'pallas',  'pallas'),
    ('spmm_gcn', 'float32', 'fwd+bwd'):          ( 'pallas',  'pallas',     'tie',  'pallas',  'pallas',  'pallas'),
    ('spmm_gcn', 'bfloat16', 'fwd'):             ( 'pallas',  'pallas',  'pallas',  'pallas',  'pallas',  'pallas'),
    ('spmm_gcn', 'bfloat16', 'fwd+bwd'):         ( 'pallas',  'pallas',  'pallas',  'pallas',  'pallas',  'pallas'),
    ('aggregate', 'float32', 'fwd'):             ( 'pallas',  'pallas',  'pallas',  'pallas',  'pallas',  'pallas'),
    ('aggregate', 'float32', 'fwd+bwd'):         ( 'pallas',  'pallas',  'pallas',  'pallas',  'pallas',  'pallas'),
    ('aggregate', 'bfloat16', 'fwd'):            ( 'pallas',  'pallas',  'pallas',  'pallas',  'pallas',  'pallas'),
    ('aggregate', 'bfloat16', 'fwd+bwd'):        ( 'pallas',  'pallas',     'xla',  'pallas',  'pallas',  'pallas'),
    ('gatv2', 'float32', 'fwd'):                 ( 'pallas',  'pallas',  'pallas',  'pallas',      None,  'pallas'),
    ('gatv2', 'float32', 'fwd+bwd'):             (    'xla',  'pallas',  'pallas',      None,      None,  'pallas'),
    ('gatv2', 'bfloat16', 'fwd'):                ( 'pallas',  'pallas',  'pallas',  'pallas',  'pallas',  'pallas'),
    ('gatv2', 'bfloat16', 'fwd+bwd'):            (    'xla',  'pallas',  'pallas',      None,      None,  'pallas'),
    ('graph_attention', 'float32', 'fwd'):       ( 'pallas',  'pallas',  'pallas',  'pallas',  'pallas',  'pallas'),
    ('graph_attention', 'float32', 'fwd+bwd'):   (    'xla',  'pallas',  'pallas',  'pallas',  'pallas',  'pallas'),
    ('graph_attention', 'bfloat16', 'fwd'):      ( 'pallas',  'pallas',  'pallas',  'pallas',  'pallas',  'pallas'),
    ('graph_attention', 'bfloat16', 'fwd+bwd'):  (    'xla',  'pallas',  'pallas',  'pallas',  'pallas',  'pallas'),
}  # fmt: skip


def _from_run(faster: dict, results: str) -> dict:
    """``(family, dtype, pass) -> tuple[Measured, ...]``: one entry per graph whose cell told the faster backend, naming
    the run's JSON and the cell compared (as ``measured_from`` names it)."""
    out = {}
    for (family, dtype, pass_), row in faster.items():
        points = []
        for stats, f in zip(_GRAPHS, row, strict=True):
            if f not in (None, "tie", *_PAIRS):
                raise ValueError(f"Expected None, 'tie', 'pallas' or 'xla' for {stats['graph']}. Got {f!r}.")
            if f is None:
                continue
            label = f"{stats['graph']} {dtype} as generated {_CELL_OP[family]} {pass_}"
            tie = f == "tie"
            cell = f"{label}: pallas_loop_ms vs xla_loop_ms"
            points.append(Measured(**stats, faster="pallas" if tie else f, results=results, cell=cell,
                                   note=_TIE if tie else ""))  # fmt: skip
        out[(family, dtype, pass_)] = tuple(points)
    return out


H200_CHOICES = _from_run(_H200_FASTER, FULL_RUN)
H100_CHOICES = _from_run(_H100_FASTER, H100_RUN)

CHOICES = {hardware.H200.kind: H200_CHOICES, hardware.H100.kind: H100_CHOICES}


def entry(name: str, kind: str | None = None) -> Entry:
    """Entry ``name`` for device ``kind`` (default: :func:`blocksparse.hardware.gpu`'s): from its table, else from the
    table of its :data:`SAME_SMS` kind, else :data:`DEFAULT` (an entry at a time: a partial table falls back too)."""
    kind = hardware.gpu().kind if kind is None else kind
    if name not in DEFAULT:
        raise KeyError(f"Expected a tuned GNN entry in {sorted(DEFAULT)}. Got {name!r}.")
    for table in (TABLES.get(kind, {}), TABLES.get(SAME_SMS.get(kind), {})):  # (an entry at a time)
        if name in table:
            return table[name]
    return DEFAULT[name]


def get(name: str, kind: str | None = None):
    """The value of :func:`entry` ``name``."""
    return entry(name, kind).value


def measured(family: str, dtype: str, pass_: str, kind: str | None = None) -> tuple[Measured, ...]:
    """The graphs of :data:`CHOICES` for ``(family, dtype, pass_)`` on device ``kind`` (default:
    :func:`blocksparse.hardware.gpu`'s; a key the device has none of: those of its :data:`SAME_SMS` kind); ``()``
    where none was measured."""
    kind = hardware.gpu().kind if kind is None else kind
    key = (family, dtype, pass_)
    return CHOICES.get(kind, {}).get(key) or CHOICES.get(SAME_SMS.get(kind), {}).get(key, ())  # (a key at a time)
