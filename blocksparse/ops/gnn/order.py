"""The one place that decides what runs for the GNN ops: backend order, and the Pallas kernels' default variants.

:func:`implementations` orders the backends of an op (Pallas first, XLA's segment ops where a kernel cannot
run) from the tuned entries ``spmm.order`` / ``spmm.order_half`` / ``aggregate.order`` / ``attention.order``,
and applies a ``config=`` (only its backend with ``implementation=None``). Given the graph, :func:`choice` puts
XLA first where the tuned data (:data:`blocksparse.ops.gnn.tuned.CHOICES`) measured it faster on a graph like
it: by the statistics the host knows (nodes, mean and maximum in-degree, features, dtype) and the pass. The other
functions give the defaults the kernels take when a config leaves a field ``None``: which gather variant and how
many light nodes per program (by dtype and mean in-degree), how many edges per step, and the attention layout.
Each reads :mod:`blocksparse.ops.gnn.tuned` for the device (:func:`blocksparse.hardware.gpu`), so a test fakes a
device with :func:`blocksparse.hardware.fake` and asks these functions.

Example::

    >>> import jax.numpy as jnp
    >>> from blocksparse.ops.gnn import order
    >>> order.implementations("spmm", None, jnp.bfloat16)
    ('pallas', 'xla')
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp

from .. import _dispatch
from . import registry, tuned
from .config import AttentionConfig, GatherConfig, GatherVariant

__all__ = [
    "COVERAGE",
    "OPS",
    "PASSES",
    "Choice",
    "GraphStats",
    "aggregate_nodes_per_program",
    "aggregate_one_node_edges",
    "aggregate_variant",
    "attention_edges_per_step",
    "attention_layout",
    "attention_narrow_loads",
    "choice",
    "config_type",
    "graph_stats",
    "implementations",
    "spmm_edges_per_step",
    "spmm_variant",
]

#: Op name -> the config class it takes.
OPS = {"spmm": GatherConfig, "aggregate": GatherConfig, "gatv2": AttentionConfig, "graph_attention": AttentionConfig}


def config_type(op: str) -> type:
    """The config class op ``op`` takes (``GatherConfig`` or ``AttentionConfig``)."""
    if op not in OPS:
        raise ValueError(f"Expected a GNN op in {sorted(OPS)}. Got {op!r}.")
    return OPS[op]


def check_config(op: str, config):
    """``config`` if it is ``None`` or of :func:`config_type` ``op``; else a ``TypeError`` naming the type."""
    want = config_type(op)
    if config is not None and not isinstance(config, want):
        article = "an" if want.__name__[0] in "AEIOU" else "a"
        raise TypeError(f"Expected config None or {article} {want.__name__} for {op}. Got {type(config).__name__}.")
    return config


def _default(op: str, dtype) -> tuple[str, ...]:
    if op == "spmm":
        half = dtype is not None and jnp.dtype(dtype).itemsize < 4
        return tuned.get("spmm.order_half" if half else "spmm.order")
    return tuned.get("aggregate.order" if op == "aggregate" else "attention.order")


def implementations(
    op: str,
    implementation=None,
    dtype=None,
    config=None,
    *,
    graph=None,
    feat: int | None = None,
    pass_: str = "fwd",
    transpose: bool = False,
    norm: str | None = None,
) -> tuple[str, ...]:
    """The backends ``op`` tries, in order: ``implementation`` resolved against the registry.

    Arguments:
        op: ``"spmm"``, ``"aggregate"``, ``"gatv2"`` or ``"graph_attention"``.
        implementation: ``None`` (the measured order for ``dtype`` on this device; with ``graph`` and ``feat``,
            :func:`choice`'s for that graph), a name (``"pallas"``, ``"xla"``) or a sequence of names.
        dtype: the features' dtype (SpMM orders 2-byte features by their own entry).
        config: ``None`` or the op's config (:func:`config_type`). With ``implementation=None`` only the
            config's backend runs (no silent fallback); an explicit ``implementation`` must include it.
        graph, feat, pass_: the graph, the features per node and the pass (``"fwd"``, ``"fwd+bwd"``) the order
            is for (:func:`choice`); ``graph=None``: the default order. ``transpose``: for the op on ``graph.T``
            (its in-degrees are ``graph``'s out-degrees). ``norm``: SpMM's degree normalisation (:func:`choice`).

    Raises:
        TypeError: a config of another type. ValueError: an unknown name, or a config whose backend is not
        among an explicit ``implementation``.
    """
    check_config(op, config)
    known = tuple(registry.IMPLEMENTATIONS)
    if config is not None and implementation is None:
        return (config.backend,)
    if implementation is None and graph is not None and feat is not None:
        return choice(op, graph_stats(graph, transpose=transpose), feat, dtype, pass_, norm=norm).impls
    impls = _dispatch.resolve(implementation, _default(op, dtype), known)
    if config is not None and config.backend not in impls:
        raise ValueError(
            f"Expected implementation to include {config.backend!r}, the backend of config={config!r}. "
            f"Got implementation={implementation!r}."
        )
    return impls


# ------------------------------------------------------------------ which backend, by the graph
#: The passes a choice is made for: the forward alone, and the forward a gradient follows with its backward.
PASSES = ("fwd", "fwd+bwd")
#: How far a measured graph speaks for another: within this factor in every statistic of :class:`GraphStats` and
#: in the features per node. A rule, not a measurement: farther graphs take the default order.
COVERAGE = 4.0


@dataclasses.dataclass(frozen=True)
class GraphStats:
    """What the host knows of a graph that decides the backend: nodes, edges and the largest in-degree.

    ``mean_in_degree`` is ``edges / nodes``; ``skew`` is ``max_in_degree / mean_in_degree``."""

    nodes: int
    edges: int
    max_in_degree: int

    def __post_init__(self):
        for name in ("nodes", "edges", "max_in_degree"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"Expected GraphStats.{name} a non-negative int. Got {v!r}.")
        if self.max_in_degree > self.edges:
            raise ValueError(
                f"Expected max_in_degree <= edges. Got max_in_degree={self.max_in_degree}, edges={self.edges}."
            )

    @property
    def mean_in_degree(self) -> float:
        return self.edges / max(self.nodes, 1)

    @property
    def skew(self) -> float:
        return self.max_in_degree / max(self.mean_in_degree, 1e-30)


def graph_stats(g, transpose: bool = False) -> GraphStats | None:
    """:class:`GraphStats` of a :class:`~blocksparse.gnn.Graph` (host data), or of its transpose ``g.T`` (without
    building it: its in-degrees are ``g``'s out-degrees); ``None`` for a graph whose degrees the host does not
    know (a :class:`~blocksparse.gnn.DynamicGraph`, traced)."""
    from ...graph import Graph  # the graph types live below the ops

    if not isinstance(g, Graph):
        return None
    top = int(g.out_degree.max(initial=0)) if transpose else int(g.max_in_degree)
    return GraphStats(int(g.num_nodes), int(g.num_edges), top)


@dataclasses.dataclass(frozen=True)
class Choice:
    """The backends to try, in order, and why: ``measured`` the graph of the tuned data it follows (``None``:
    not measured, the default order)."""

    impls: tuple[str, ...]
    reason: str
    measured: tuned.Measured | None = None


def _log_ratio(a: float, b: float) -> float:
    return abs(math.log(max(a, 1e-30) / max(b, 1e-30)))


def distance(stats: GraphStats, feat: int, m: tuned.Measured) -> float:
    """The largest factor, as ``log``, between ``stats`` / ``feat`` and measured graph ``m`` in nodes, mean
    in-degree, maximum in-degree (each at least 1) and features per node."""
    pairs = ((stats.nodes, m.nodes), (stats.mean_in_degree, m.mean_in_degree),
             (max(stats.max_in_degree, 1), max(m.max_in_degree, 1)), (feat, m.feat))  # fmt: skip
    return max(_log_ratio(a, b) for a, b in pairs)


def choice(op: str, stats: GraphStats | None, feat: int, dtype, pass_: str = "fwd", kind: str | None = None,
           norm: str | None = None, table: dict | None = None) -> Choice:  # fmt: skip
    """The backends ``op`` tries on a graph of ``stats`` with ``feat`` features per node of ``dtype``, for
    ``pass_`` (``"fwd"``, ``"fwd+bwd"``), on device ``kind`` (default :func:`blocksparse.hardware.gpu`'s).

    The family is the op's name, except SpMM with the GCN norm (``norm="both"``), which follows its own measurements
    (``spmm_gcn``: its two degree scalings are separate launches around the Pallas kernel and fused into XLA's
    gather and segment sum, so the faster backend can differ) where the device has any, else SpMM's.
    The nearest graph of :func:`blocksparse.ops.gnn.tuned.measured` ``(family, dtype, pass_)`` within
    :data:`COVERAGE` in every statistic (:func:`distance`) decides: XLA first where XLA was faster there, else the
    default order. No such graph (none measured for this key or device, or none near enough; ``stats`` ``None``:
    a traced graph) is "not measured": the default order. ``table``: the measurements to choose from instead of the
    device's (``(family, dtype, pass) -> Measured``s, as ``blocksparse.bench.gnn_graphs.measured_from`` makes from a
    run: what the default would run with that run's data).
    """
    if op not in OPS:
        raise ValueError(f"Expected a GNN op in {sorted(OPS)}. Got {op!r}.")
    if pass_ not in PASSES:
        raise ValueError(f"Expected pass_ in {list(PASSES)}. Got {pass_!r}.")
    if isinstance(feat, bool) or not isinstance(feat, int) or feat < 1:
        raise ValueError(f"Expected feat a positive int. Got {feat!r}.")
    name = jnp.dtype(dtype).name
    default = _default(op, dtype)
    if stats is None:
        return Choice(default, "not measured: the default (the graph's degrees are traced, unknown on the host)")

    def measured(family):
        if table is None:
            return tuned.measured(family, name, pass_, kind)
        return tuple(table.get((family, name, pass_), ()))

    family = op
    if op == "spmm" and norm == "both" and measured("spmm_gcn"):
        family = "spmm_gcn"
    points = measured(family)  # CHOICES is keyed by the op's name (SpMM: and its norm)
    key = f"{family}/{name}/{pass_}"
    if not points:
        return Choice(default, f"not measured: the default (no graph measured for {key} on this device)")
    best = min(points, key=lambda m: distance(stats, feat, m))  # the first of equals: the table's order
    if distance(stats, feat, best) > math.log(COVERAGE):
        return Choice(default, f"not measured: the default (no graph measured for {key} within a factor "
                               f"{COVERAGE:g} of {stats} and {feat} features; nearest: {best.graph})")  # fmt: skip
    impls = ("xla", *(i for i in default if i != "xla")) if best.faster == "xla" else default
    return Choice(impls, f"measured for {key}: {best.faster} faster on {best.graph} ({best.results}: {best.cell})",
                  best)  # fmt: skip


# ------------------------------------------------------------------ the gather kernels' defaults
def spmm_variant(nodes_per_program: int | None) -> GatherVariant | None:
    """The SpMM kernel's variant when none is given: tuned ``spmm.variant`` for the one-node kernel
    (``nodes_per_program`` ``None`` or 1); ``None`` (the plain packed kernel) otherwise."""
    return tuned.get("spmm.variant") if nodes_per_program in (None, 1) else None


def spmm_edges_per_step(edge_capacity: int, num_nodes: int, bf: int, scale: int = 1) -> int:
    """Edges per step of the one-node SpMM kernel: tuned ``spmm.light_edges_per_step`` up to its mean in-degree,
    else as many as keep a ``(be, bf)`` float32 tile at 16 KiB, in [16, 64]; times ``scale``
    (``GatherVariant.tile_bytes``)."""
    mean, edges = tuned.get("spmm.light_edges_per_step")
    return scale * (edges if edge_capacity <= mean * max(num_nodes, 1) else max(16, min(64, 4096 // bf)))


def aggregate_nodes_per_program(mean_degree: float) -> int:
    """The default number of light nodes per max / min program, about tuned ``aggregate.edges_per_program``
    in-edges per program.

    The largest power of two ``G <= edges_per_program / mean_degree``, in ``[1, 16]`` (1: the one-node
    kernel, where one node already fills a program). Programs group nodes of about equal length (the
    kernel's length order), so ``G`` costs few idle rows.
    """
    target = tuned.get("aggregate.edges_per_program")
    g = 1
    while g < 16 and 2 * g * max(mean_degree, 1.0) <= target:
        g *= 2
    return g


def aggregate_one_node_edges(bf: int, scale: int = 1) -> int:
    """Edges per step of the one-node max / min kernel: a ``(be, bf)`` tile of tuned ``aggregate.one_node_tile``
    elements, ``be`` in [16, 64]; times ``scale`` (``GatherVariant.tile_bytes``)."""
    return scale * max(16, min(64, tuned.get("aggregate.one_node_tile") // bf))


def aggregate_variant(
    dtype, with_arg: bool, mean_degree: float | None = None
) -> tuple[int | None, GatherVariant | None]:
    """``(nodes_per_program, variant)`` of max / min when neither is given, by the features' width (float32 or
    2-byte): tuned ``aggregate.with_arg`` with the arg-max (the forward under ``grad``), else tuned
    ``aggregate.values_only``. ``nodes_per_program`` ``None`` is :func:`aggregate_nodes_per_program`'s rule for the
    graph's ``mean_degree``. Where ``mean_degree`` is given, a tuned count without the arg-max is at most the rule's
    (graphs of a higher mean in-degree than any measured take the rule's fewer nodes: one a program from a mean of
    64); with the arg-max it holds on graphs whose mean in-degree lies within the entry's measured range, and the
    rule's count runs elsewhere."""
    width = "float32" if jnp.dtype(dtype).itemsize >= 4 else "half"
    if with_arg:
        nodes, variant, means = tuned.get("aggregate.with_arg")[width]
        if nodes is not None and mean_degree is not None and means is not None:
            low, high = means
            nodes = nodes if low <= mean_degree <= high else None
        return nodes, variant
    nodes, variant = tuned.get("aggregate.values_only")[width]
    if nodes is not None and mean_degree is not None:
        nodes = min(nodes, aggregate_nodes_per_program(mean_degree))
    return nodes, variant


# ------------------------------------------------------------------ the attention kernels' defaults
def attention_layout(one_head: bool, config: AttentionConfig | None = None) -> str:
    """The attention kernels' layout: ``heads`` with several heads per program; with one head
    ``config.layout``, else tuned ``attention.one_head_layout``."""
    if not one_head:
        return "heads"
    return (config.layout if config is not None else None) or tuned.get("attention.one_head_layout")


def attention_narrow_loads(config: AttentionConfig | None = None) -> bool:
    """Whether the attention kernels gather 2-byte features 4 a lane: ``config.narrow_loads``, else tuned
    ``attention.narrow_loads`` (no effect on float32 features)."""
    if config is not None and config.narrow_loads is not None:
        return config.narrow_loads
    return tuned.get("attention.narrow_loads")


def attention_edges_per_step(width: int, config: AttentionConfig | None = None) -> int:
    """In-edges per step of a program of ``width`` features: ``config.edges_per_step``, else tuned
    ``attention.wide_edges_per_step`` for 128 or more features, else ``4096 / width`` clipped to [16, 128]."""
    if config is not None and config.edges_per_step:
        return config.edges_per_step
    wide = tuned.get("attention.wide_edges_per_step")
    if width >= 128 and wide:
        return wide
    return max(16, min(128, 4096 // width))
