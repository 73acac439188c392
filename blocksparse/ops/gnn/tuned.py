"""Measured numbers of the GNN kernels, as data keyed by device kind: the one place they live.

Key layout: ``TABLES[device_kind][entry_name] -> Entry``. ``device_kind`` is
``blocksparse.hardware.Device.kind`` of :func:`blocksparse.hardware.gpu` (``"NVIDIA H200"``): the GPU the
kernels run on, or, off a GPU (Pallas' interpreter on a CPU, plans made there), the planning default, so a
CPU runs the same kernels as that GPU. A device without a table takes :data:`DEFAULT`.

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
``fwd+bwd``. Each :class:`Measured` is one graph of one run: its statistics (what the host knows of a graph) and the
backend that was faster there, naming the results JSON and its cell. :func:`blocksparse.ops.gnn.order.choice` reads
them; a key without measurements, a device without a table (every GPU but the H200) and a graph far from every
measured one take the default order (Pallas first).
"""

from __future__ import annotations

import dataclasses

from ... import hardware
from .config import GatherVariant

__all__ = ["CHOICES", "DEFAULT", "TABLES", "Entry", "Measured", "entry", "get", "measured"]


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
TABLES = {"NVIDIA H200": H200}


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


_GRAPHS_RUN = "gnn_graphs_h200.json"  # its twitch-views cells (its city-roads-L and ogbn-arxiv: replaced, below)
_FULL_SMALL = "gnn_full_small_float32_h200.json"  # city-roads-L, ogbn-arxiv: every op and pass, float32, one run
# power-law in float32 (cut short: no GATv2 fwd+bwd, graph attention), one run
_FULL_POWER_LAW = "gnn_full_power_law_float32_h200.json"
# SpMM (sum, mean, the GCN norm) on city-roads-L and ogbn-arxiv in both dtypes, the norms on the edge weights
_FULL_NORMS = "gnn_full_small_spmm_norms_h200.json"
_FULL_TWITCH = "gnn_full_twitch_float32_h200.json"  # twitch-views, float32 (cut short: SpMM only)
_FULL_TWITCH_BF16 = "gnn_full_twitch_bfloat16_h200.json"  # twitch-views, bfloat16 (cut short: SpMM only)
_FULL_POWER_LAW_BF16 = "gnn_full_power_law_bfloat16_h200.json"  # power-law, bfloat16 (cut short: SpMM sum only)
# city-roads-L, ogbn-arxiv in bfloat16 after the narrow loads: max, min and both attentions, both passes
_FULL_SMALL_BF16_NARROW = "gnn_full_small_bfloat16_narrow_h200.json"
_FULL_POWER_LAW_ATTN = "gnn_full_power_law_float32_attn_h200.json"  # power-law, float32 (cut short: GATv2 fwd only)
# power-law in bfloat16 after the narrow loads: max and min, both attentions, both passes (two runs)
_FULL_POWER_LAW_BF16_EXTREMES = "gnn_full_power_law_bfloat16_extremes_h200.json"
_FULL_POWER_LAW_BF16_ATTN = "gnn_full_power_law_bfloat16_attn_h200.json"
# pokec: max, min and both attentions, both passes, float32 (XLA and PyG out of memory in GATv2's forward + backward)
_FULL_POKEC = "gnn_full_pokec_float32_rest_h200.json"
# the same in bfloat16 (cut short before graph attention's forward + backward), then both graph attention cells
_FULL_POKEC_BF16 = "gnn_full_pokec_bfloat16_rest_h200.json"
_FULL_POKEC_BF16_ATTN = "gnn_full_pokec_bfloat16_attn_h200.json"
# pokec's SpMM (sum, mean, the GCN norm) by dtype: one run cut short before the GCN norm's forward + backward, then
# that cell alone
_FULL_POKEC_SPMM = {
    "float32": "gnn_full_pokec_float32_spmm_h200.json",
    "bfloat16": "gnn_full_pokec_bfloat16_spmm_h200.json",
}
_FULL_POKEC_GCN_BWD = {
    "float32": "gnn_full_pokec_float32_gcn_bwd_h200.json",
    "bfloat16": "gnn_full_pokec_bfloat16_gcn_bwd_h200.json",
}
# the power-law graph in bfloat16: SpMM with the mean and the GCN norm, forward (its mean's forward + backward: a third
# run, no entry of its own; its max and min forward + backward under the four-nodes default,
# gnn_full_power_law_bfloat16_extremes_bwd_h200.json: replaced by the run below)
_FULL_POWER_LAW_BF16_SPMM = "gnn_full_power_law_bfloat16_spmm_fwd_h200.json"
# Measured again once the timed loop computed every output (before, it under-counted XLA's work on an output: the
# max / min backward's scatter, XLA's GATv2, the segment ops): SpMM (sum, mean, the GCN norm) and GATv2 forward +
# backward on city-roads-L and ogbn-arxiv in both dtypes; max and min forward + backward on those two graphs, the
# power-law graph and pokec, in both dtypes
_FULL_SMALL_BWD = "gnn_full_small_bwd_h200.json"
_FULL_EXTREMES_BWD = {"small": "gnn_full_small_extremes_bwd_h200.json",
                      "power-law": "gnn_full_power_law_extremes_bwd_h200.json",
                      "pokec": "gnn_full_pokec_extremes_bwd_h200.json"}  # fmt: skip
# pokec's bfloat16 SpMM sum forward once heavy nodes' sums were formed from float32 partial rows alone (the main
# output written in bfloat16)
_FULL_POKEC_BF16_SUM = "gnn_full_pokec_bfloat16_sum_fwd_h200.json"
_SEGMENT = "XLA's side: the suite's sorted segment op in the features' dtype (jax-segment), as the xla backend runs it"


def _paper(stats, faster, results, op, dtype="float32", note=_SEGMENT):
    return Measured(**stats, faster=faster, results=results,
                    cell=f"{stats['graph']}/{dtype}/as generated/{op}: ours vs jax-segment", note=note)  # fmt: skip


_TIE = "a tie: XLA faster by at most 2%, the default order kept"  # blocksparse.bench.gnn_graphs.TIE_NOTE


def _full(stats, faster, op, pass_, results=_FULL_SMALL, dtype="float32", note=""):
    """A cell of the full ``gnn-graphs`` table, as ``blocksparse.bench.gnn_graphs.measured_from`` reads it: both
    backends named (``pallas_loop_ms`` against ``xla_loop_ms``) in the same cell; ``faster="pallas"`` with
    ``note=_TIE`` where XLA won by at most 2%."""
    label = f"{stats['graph']} {dtype} as generated {op} {pass_}"
    return Measured(**stats, faster=faster, results=results, cell=f"{label}: pallas_loop_ms vs xla_loop_ms",
                    note=note)  # fmt: skip


def _narrow(stats, faster, op, pass_):
    """A bfloat16 cell of the full table's run on city-roads-L and ogbn-arxiv with the 2-byte rows gathered 4 features
    a lane (``narrow_loads``, the max's two nodes per program)."""
    return _full(stats, faster, op, pass_, _FULL_SMALL_BF16_NARROW, "bfloat16")


def _pl_half(op, pass_):
    """A bfloat16 cell of the later runs on the power-law graph (max / min, the attentions, SpMM with the GCN norm):
    the kernels were faster in every one."""
    results = _FULL_POWER_LAW_BF16_EXTREMES if op in ("max", "min") else _FULL_POWER_LAW_BF16_ATTN
    if op == "spmm_gcn":
        results = _FULL_POWER_LAW_BF16_SPMM
    if op in ("max", "min") and pass_ == "fwd+bwd":
        results = _FULL_EXTREMES_BWD["power-law"]  # (and again with every output timed)
    return _full(_POWER_LAW, "pallas", op, pass_, results, "bfloat16")


def _pokec(op, pass_, dtype="float32"):
    """A cell of the full table's runs on pokec (every op): the kernels were faster in every one."""
    results = {"float32": _FULL_POKEC, "bfloat16": _FULL_POKEC_BF16}[dtype]
    if dtype == "bfloat16" and op == "graph_attention":
        results = _FULL_POKEC_BF16_ATTN  # (its forward measured twice: the later run's)
    if op.startswith("spmm"):
        results = (_FULL_POKEC_GCN_BWD if (op, pass_) == ("spmm_gcn", "fwd+bwd") else _FULL_POKEC_SPMM)[dtype]
    if (op, pass_, dtype) == ("spmm_sum", "fwd", "bfloat16"):
        results = _FULL_POKEC_BF16_SUM
    if op in ("max", "min") and pass_ == "fwd+bwd":
        results = _FULL_EXTREMES_BWD["pokec"]
    return _full(_POKEC, "pallas", op, pass_, results, dtype)


def _again(stats, faster, op, pass_, dtype="float32"):
    """A forward + backward cell measured again with every output timed: SpMM and GATv2 on city-roads-L and
    ogbn-arxiv, max / min on those and the power-law graph."""
    small = stats in (_ROADS, _ARXIV)
    if op in ("max", "min"):
        results = _FULL_EXTREMES_BWD["small" if small else stats["graph"]]
    elif small:
        results = _FULL_SMALL_BWD
    else:
        raise ValueError(f"Expected city-roads-L or ogbn-arxiv for {op} measured again. Got {stats['graph']}.")
    return _full(stats, faster, op, pass_, results, dtype)


def _pl(faster, op, pass_):
    """A float32 cell of the full table's run on the power-law graph."""
    return _full(_POWER_LAW, faster, op, pass_, _FULL_POWER_LAW)


_GAT_SEGMENT = ("XLA's side: JAX's autodiff of the suite's segment GATv2 (jax-segment); the xla backend runs the same "
                "segment ops and recomputes the forward in its backward")  # fmt: skip

# The full table's runs replaced the older runs' entries for the graphs, dtypes, ops and passes they measured with
# both backends named: float32 on city-roads-L and ogbn-arxiv (gnn_full_small_float32_h200.json; replaced
# gnn_graphs_h200.json's SpMM and max forward and GATv2 forward + backward there), bfloat16 on those two graphs
# (gnn_full_small_bfloat16_h200.json; replaced spmm_packed_h200.json's ogbn-arxiv SpMM), float32 on the power-law
# graph (gnn_full_power_law_float32_h200.json; replaced gather_defaults_h200.json's SpMM and max forward and
# gather_with_arg_h200.json's max with the arg-max there). Later runs replaced some of those in turn: SpMM and SpMM
# with the GCN norm on city-roads-L and ogbn-arxiv in both dtypes, re-measured with the norms on the edge weights
# (gnn_full_small_spmm_norms_h200.json), ogbn-arxiv's bfloat16 attention (gnn_full_arxiv_bfloat16_attn_h200.json),
# the power-law graph's GATv2 forward (gnn_full_power_law_float32_attn_h200.json); and twitch-views' SpMM in both
# dtypes (gnn_full_twitch_*_h200.json; replaced gnn_graphs_h200.json's float32 SpMM) and the power-law graph's
# bfloat16 SpMM (gnn_full_power_law_bfloat16_h200.json; replaced gather_defaults_h200.json's). Then the 2-byte rows
# gathered 4 features a lane changed the bfloat16 kernels: max / min and both attentions on city-roads-L and
# ogbn-arxiv were measured again (gnn_full_small_bfloat16_narrow_h200.json; replaced gnn_full_small_bfloat16_h200.json's
# and gnn_full_arxiv_bfloat16_attn_h200.json's cells there). Later still, the power-law graph in bfloat16 with the
# narrow loads: max / min and both attentions (gnn_full_power_law_bfloat16_{extremes,attn}_h200.json; replaced
# gather_defaults_h200.json's max forward and gather_with_arg_h200.json's max with the arg-max), and pokec's max / min
# and attentions in both dtypes (gnn_full_pokec_*_h200.json; replaced gnn_graphs_pokec_h200.json's max forward in both
# dtypes; its GATv2 forward + backward in float32 stays, XLA out of memory in the full run's cell). Then pokec's SpMM
# in both dtypes (gnn_full_pokec_*_{spmm,gcn_bwd}_h200.json; replaced gnn_graphs_pokec_h200.json's float32 SpMM
# forward), the power-law graph's bfloat16 max / min forward + backward under the four-nodes default
# (gnn_full_power_law_bfloat16_extremes_bwd_h200.json) and its bfloat16 SpMM with the GCN norm, forward. Then, once
# the timed loop computed every output, the forward + backward cells it could have under-counted, measured again:
# SpMM and GATv2 on city-roads-L and ogbn-arxiv (gnn_full_small_bwd_h200.json), max / min there, on the power-law
# graph and pokec (gnn_full_*_extremes_bwd_h200.json), all in both dtypes; and pokec's bfloat16 SpMM sum forward with
# heavy nodes summed from float32 partials (gnn_full_pokec_bfloat16_sum_fwd_h200.json). The other graphs keep their
# older runs; the cells no run reached (cut short) have no entry.
H200_CHOICES = {
    ("spmm", "float32", "fwd"): (
        _full(_ROADS, "pallas", "spmm_sum", "fwd", _FULL_NORMS),
        _full(_ARXIV, "pallas", "spmm_sum", "fwd", _FULL_NORMS),
        _full(_TWITCH, "xla", "spmm_sum", "fwd", _FULL_TWITCH),
        _paper(_PRODUCTS, "pallas", "gnn_graphs_products_h200.json", "spmm_sum"),
        _pokec("spmm_sum", "fwd"),
        _pl("pallas", "spmm_sum", "fwd"),
    ),
    # SpMM with the GCN norm (norm="both"): a weighted product (the norm rides on the edge weights), whose faster
    # backend differs from the unweighted one's on some graphs. The power-law cell predates the edge weights (its
    # degree scalings were then passes over the features around the Pallas kernel).
    ("spmm_gcn", "float32", "fwd"): (
        _full(_ROADS, "xla", "spmm_gcn", "fwd", _FULL_NORMS),
        _full(_ARXIV, "pallas", "spmm_gcn", "fwd", _FULL_NORMS, note=_TIE),
        _full(_TWITCH, "xla", "spmm_gcn", "fwd", _FULL_TWITCH),
        _pokec("spmm_gcn", "fwd"),
        _pl("pallas", "spmm_gcn", "fwd"),
    ),
    ("spmm_gcn", "bfloat16", "fwd"): (
        _full(_ROADS, "pallas", "spmm_gcn", "fwd", _FULL_NORMS, "bfloat16"),
        _full(_ARXIV, "pallas", "spmm_gcn", "fwd", _FULL_NORMS, "bfloat16"),
        _pokec("spmm_gcn", "fwd", "bfloat16"),
        _pl_half("spmm_gcn", "fwd"),
    ),
    # SpMM under jax.grad: the forward + backward cells (the product over g and its backward over g.T, both on one
    # backend), which can differ from the forward's (city-roads-L: XLA's forward, the kernels' forward + backward)
    ("spmm", "float32", "fwd+bwd"): (
        _again(_ROADS, "pallas", "spmm_sum", "fwd+bwd"),
        _again(_ARXIV, "pallas", "spmm_sum", "fwd+bwd"),
        _full(_TWITCH, "xla", "spmm_sum", "fwd+bwd", _FULL_TWITCH),
        _pokec("spmm_sum", "fwd+bwd"),
        _pl("pallas", "spmm_sum", "fwd+bwd"),
    ),
    ("spmm", "bfloat16", "fwd+bwd"): (
        _again(_ROADS, "pallas", "spmm_sum", "fwd+bwd", "bfloat16"),
        _again(_ARXIV, "pallas", "spmm_sum", "fwd+bwd", "bfloat16"),
        _full(_TWITCH, "pallas", "spmm_sum", "fwd+bwd", _FULL_TWITCH_BF16, "bfloat16"),
        _pokec("spmm_sum", "fwd+bwd", "bfloat16"),
        _full(_POWER_LAW, "pallas", "spmm_sum", "fwd+bwd", _FULL_POWER_LAW_BF16, "bfloat16"),
    ),
    ("spmm_gcn", "float32", "fwd+bwd"): (
        _again(_ROADS, "pallas", "spmm_gcn", "fwd+bwd"),
        _again(_ARXIV, "pallas", "spmm_gcn", "fwd+bwd"),
        _pokec("spmm_gcn", "fwd+bwd"),
        _pl("pallas", "spmm_gcn", "fwd+bwd"),
    ),
    ("spmm_gcn", "bfloat16", "fwd+bwd"): (
        _again(_ROADS, "pallas", "spmm_gcn", "fwd+bwd", "bfloat16"),
        _again(_ARXIV, "pallas", "spmm_gcn", "fwd+bwd", "bfloat16"),
        _pokec("spmm_gcn", "fwd+bwd", "bfloat16"),
    ),
    ("spmm", "bfloat16", "fwd"): (
        _full(_ROADS, "xla", "spmm_sum", "fwd", _FULL_NORMS, "bfloat16"),
        _full(_ARXIV, "pallas", "spmm_sum", "fwd", _FULL_NORMS, "bfloat16", note=_TIE),
        _full(_TWITCH, "pallas", "spmm_sum", "fwd", _FULL_TWITCH_BF16, "bfloat16"),
        _pokec("spmm_sum", "fwd", "bfloat16"),
        _full(_POWER_LAW, "pallas", "spmm_sum", "fwd", _FULL_POWER_LAW_BF16, "bfloat16"),
    ),
    ("aggregate", "float32", "fwd"): (
        _full(_ROADS, "pallas", "max", "fwd"),
        _full(_ARXIV, "pallas", "max", "fwd"),
        _paper(_TWITCH, "xla", _GRAPHS_RUN, "max"),
        _paper(_PRODUCTS, "xla", "gnn_graphs_products_h200.json", "max"),
        _pokec("max", "fwd"),
        _pl("pallas", "max", "fwd"),
    ),
    ("aggregate", "bfloat16", "fwd"): (
        _narrow(_ROADS, "pallas", "max", "fwd"),
        _narrow(_ARXIV, "pallas", "max", "fwd"),
        _pokec("max", "fwd", "bfloat16"),
        _pl_half("max", "fwd"),
    ),
    # with the arg-max: the forward that jax.grad runs (the backward is one scatter on either backend)
    ("aggregate", "float32", "fwd+bwd"): (
        _again(_ROADS, "pallas", "max", "fwd+bwd"),
        _again(_ARXIV, "pallas", "max", "fwd+bwd"),
        _pokec("max", "fwd+bwd"),
        _again(_POWER_LAW, "pallas", "max", "fwd+bwd"),
    ),
    ("aggregate", "bfloat16", "fwd+bwd"): (
        _again(_ROADS, "pallas", "max", "fwd+bwd", "bfloat16"),
        _again(_ARXIV, "pallas", "max", "fwd+bwd", "bfloat16"),
        _pokec("max", "fwd+bwd", "bfloat16"),
        _pl_half("max", "fwd+bwd"),
    ),
    ("gatv2", "float32", "fwd"): (
        _full(_ROADS, "pallas", "gatv2", "fwd"),
        _full(_ARXIV, "pallas", "gatv2", "fwd"),
        _pokec("gatv2", "fwd"),
        _full(_POWER_LAW, "pallas", "gatv2", "fwd", _FULL_POWER_LAW_ATTN),
    ),
    ("gatv2", "bfloat16", "fwd"): (
        _narrow(_ROADS, "xla", "gatv2", "fwd"),
        _narrow(_ARXIV, "pallas", "gatv2", "fwd"),
        _pokec("gatv2", "fwd", "bfloat16"),
        _pl_half("gatv2", "fwd"),
    ),
    ("gatv2", "float32", "fwd+bwd"): (
        _again(_ROADS, "xla", "gatv2", "fwd+bwd"),
        _again(_ARXIV, "pallas", "gatv2", "fwd+bwd"),
        _paper(_TWITCH, "pallas", _GRAPHS_RUN, "gatv2", note=_GAT_SEGMENT),
        _paper(_POKEC, "pallas", "gnn_graphs_pokec_h200.json", "gatv2", note=_GAT_SEGMENT),
        _paper(_PRODUCTS, "pallas", "gnn_graphs_products_h200.json", "gatv2",
               note="XLA's side (jax-segment) ran out of device memory: the kernels were the only ones to run"),
    ),
    ("gatv2", "bfloat16", "fwd+bwd"): (
        _again(_ROADS, "xla", "gatv2", "fwd+bwd", "bfloat16"),
        _again(_ARXIV, "pallas", "gatv2", "fwd+bwd", "bfloat16"),
        _pokec("gatv2", "fwd+bwd", "bfloat16"),
        _pl_half("gatv2", "fwd+bwd"),
    ),
    ("graph_attention", "float32", "fwd"): (
        _full(_ROADS, "pallas", "graph_attention", "fwd"),
        _full(_ARXIV, "pallas", "graph_attention", "fwd"),
        _pokec("graph_attention", "fwd"),
    ),
    ("graph_attention", "bfloat16", "fwd"): (
        _narrow(_ROADS, "xla", "graph_attention", "fwd"),
        _narrow(_ARXIV, "pallas", "graph_attention", "fwd"),
        _pokec("graph_attention", "fwd", "bfloat16"),
        _pl_half("graph_attention", "fwd"),
    ),
    ("graph_attention", "float32", "fwd+bwd"): (
        _full(_ROADS, "xla", "graph_attention", "fwd+bwd"),
        _full(_ARXIV, "pallas", "graph_attention", "fwd+bwd"),
        _pokec("graph_attention", "fwd+bwd"),
    ),
    ("graph_attention", "bfloat16", "fwd+bwd"): (
        _narrow(_ROADS, "xla", "graph_attention", "fwd+bwd"),
        _narrow(_ARXIV, "pallas", "graph_attention", "fwd+bwd"),
        _pokec("graph_attention", "fwd+bwd", "bfloat16"),
        _pl_half("graph_attention", "fwd+bwd"),
    ),
}  # fmt: skip

#: Device kind -> ``(family, dtype, pass)`` -> the graphs measured there (see the module docstring).
CHOICES = {"NVIDIA H200": H200_CHOICES}


def entry(name: str, kind: str | None = None) -> Entry:
    """Entry ``name`` for device ``kind`` (default: :func:`blocksparse.hardware.gpu`'s); :data:`DEFAULT` else."""
    kind = hardware.gpu().kind if kind is None else kind
    table = TABLES.get(kind, DEFAULT)
    if name not in table:
        raise KeyError(f"Expected a tuned GNN entry in {sorted(DEFAULT)}. Got {name!r}.")
    return table[name]


def get(name: str, kind: str | None = None):
    """The value of :func:`entry` ``name``."""
    return entry(name, kind).value


def measured(family: str, dtype: str, pass_: str, kind: str | None = None) -> tuple[Measured, ...]:
    """The graphs of :data:`CHOICES` for ``(family, dtype, pass_)`` on device ``kind`` (default:
    :func:`blocksparse.hardware.gpu`'s); ``()`` where none was measured."""
    kind = hardware.gpu().kind if kind is None else kind
    return CHOICES.get(kind, {}).get((family, dtype, pass_), ())
