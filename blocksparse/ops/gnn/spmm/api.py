"""Sparse-dense products over a graph: ``spmm(g, x)`` = sum (or mean) of in-neighbours' features.

The core is one differentiable op, ``out = A x`` with ``A[i, j] = sum of w_e over edges
j -> i``; its backward is ``dx = A^T dout`` through the cached transposed CSR (``g.T``) and
``dw_e = dout[dst_e] . x[src_e]``. Normalisations are one factor per edge, multiplied into the weights, except a
factor of the destination alone (the mean's, norm ``"right"``), which multiplies each node's float32 sum once.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from ....graph import DynamicGraph, Graph, check_graph, nan_unless, poison
from ... import _dispatch
from .. import order, registry
from ..config import SPMM_NODES_PER_PROGRAM, GatherConfig

__all__ = [
    "NORM_POWERS",
    "TRANSPOSED_NORM",
    "SpmmStatic",
    "accumulate",
    "csr_norm_factor",
    "inverse_degree_power",
    "norm_edge_weight",
    "row_norm_factor",
    "spmm",
]


@dataclasses.dataclass(frozen=True)
class SpmmStatic:
    """The static part of one ``spmm`` call (hashable: the ``custom_vjp``'s static argument).

    Attributes:
        impls: implementation names, tried in order.
        accumulate: the arrays are ``(g, x, init, *w)`` and the result ``init + A x``.
        config: the Pallas kernel's :class:`~..config.GatherConfig` (``None``: its defaults; XLA ignores it).
        bwd_impls: the backward's (the product over ``g.T``); ``None``: ``impls``.
        grad_impls: the forward product's under ``jax.grad`` (a gradient follows it); ``None``: ``impls``.
        norm: a static graph's degree normalisation (a key of :data:`NORM_POWERS`), multiplied into the edges'
            weights as host data already in the CSR order of the graph the product runs on
            (:func:`csr_norm_factor`): the program holds the factors as one constant and gathers nothing; a factor
            of the destination alone (``"right"``, the mean's) scales each node's float32 sum once instead, on
            either backend. A dynamic graph's factors are traced: they come in the weights instead.

    The graph is the op's first array argument: a :class:`Graph` (a pytree without leaves, so
    static) or a :class:`DynamicGraph` (traced index arrays).
    """

    impls: tuple[str, ...]
    accumulate: bool = False
    config: GatherConfig | None = None
    bwd_impls: tuple[str, ...] | None = None
    norm: str | None = None
    grad_impls: tuple[str, ...] | None = None


def _table(name: str):
    csr_sum = registry.module("spmm", name).csr_sum

    def call(s: SpmmStatic, g, x, *rest):
        init, w = (rest[0], rest[1:]) if s.accumulate else (None, rest)
        w_csr = w[0][jnp.asarray(g.edge_perm)] if w else None
        kw = {}
        if name == "pallas" and s.config is not None:
            kw = dict(nodes_per_program=s.config.nodes_per_program, variant=s.config.variant)
        if s.norm is not None and NORM_POWERS[s.norm][0] == 0 and init is None:
            # a factor of the destination alone (the mean's): each float32 sum scaled once, not every gathered row
            return csr_sum(g, w_csr, x, row_scale=jnp.asarray(row_norm_factor(g, s.norm)), **kw)
        if s.norm is not None:
            factor = jnp.asarray(csr_norm_factor(g, s.norm))
            w_csr = factor if w_csr is None else w_csr.astype(jnp.float32) * factor
        return csr_sum(g, w_csr, x, **kw) if init is None else csr_sum(g, w_csr, x, init, **kw)

    return call


def _backward(s: SpmmStatic, arrays, _, dout):
    g, x, *rest = arrays
    init, w = ((rest[0],), rest[1:]) if s.accumulate else ((), rest)
    # edge ids are shared by g and g.T; the defaults' kernel, on the backward's backends; an edge's norm factor on
    # g.T is the transposed norm's there (the degrees swap roles)
    norm_t = None if s.norm is None else TRANSPOSED_NORM[s.norm]
    dx = _spmm(SpmmStatic(s.bwd_impls or s.impls, norm=norm_t), g.T, dout, *w)
    d_init = tuple(dout.astype(i.dtype) for i in init)
    if not w:
        return None, dx, *d_init
    src, dst = jnp.asarray(g.src), jnp.asarray(g.dst)
    dw = jnp.sum(dout[dst].astype(jnp.float32) * x[src].astype(jnp.float32), axis=-1)
    if s.norm is not None:
        dw = dw * jnp.asarray(norm_edge_weight(g, s.norm))
    if isinstance(g, DynamicGraph):
        dw = jnp.where(g.edge_mask, dw, 0.0)
    return None, dx, *d_init, dw.astype(w[0].dtype)


# (static, graph, x (N, F)[, init (N, F)][, w (E,) in edge order]) -> [init +] A x
def _forward(s: SpmmStatic, *arrays):
    """The forward product that a gradient follows: on ``s.grad_impls`` where the choice for a forward + backward
    differs from the forward alone's."""
    table = _dispatch.with_reference_jvp(_table)  # (grad of grad: the kernel's derivative is XLA's)
    return _dispatch.run("spmm", s.grad_impls or s.impls, table, s, *arrays), None


_spmm = _dispatch.differentiable("spmm", _table, _backward, _forward)


def accumulate(
    g: Graph | DynamicGraph,
    x: jax.Array,
    init: jax.Array | None = None,
    edge_weight: jax.Array | None = None,
    *,
    implementation=None,
) -> jax.Array:
    """``[init +] A x`` for ``x`` and ``init`` ``(N, F)``, in ``x``'s dtype, with no validity check.

    For graphs whose edges are known to be valid (the parts of a graph split over devices, checked
    on the host): the product of a second part adds itself to the first's output in the kernel, so
    the parts need no separate sum. Differentiable w.r.t. ``x``, ``init`` and ``edge_weight``.
    """
    s = SpmmStatic(order.implementations("spmm", implementation, x.dtype), init is not None)
    if init is not None and init.shape != x.shape:
        raise ValueError(f"Expected init of shape {x.shape} (x's). Got {init.shape}.")
    inits = () if init is None else (init.astype(x.dtype),)
    if g.edge_capacity == 0 or g.num_nodes == 0 or x.shape[1] == 0:
        return inits[0] if inits else jnp.zeros_like(x)
    weights = () if edge_weight is None else (_checked_weight(g, edge_weight),)
    return _spmm(s, g, x, *inits, *weights)


def _checked_weight(g, edge_weight) -> jax.Array:
    """``edge_weight`` as an array of shape ``(edge capacity,)`` and a floating dtype, else raises."""
    edge_weight = jnp.asarray(edge_weight)
    if edge_weight.shape != (g.edge_capacity,):
        raise ValueError(f"Expected edge_weight of shape ({g.edge_capacity},). Got {edge_weight.shape}.")
    if not jnp.issubdtype(edge_weight.dtype, jnp.floating):
        raise TypeError(f"Expected floating-point edge_weight. Got {edge_weight.dtype}.")
    return edge_weight


def inverse_degree_power(deg, p):
    """``max(deg, 1) ** -p`` in float32: the diagonal scaling of a normalised ``spmm`` (a degree of 0 scales by 1)."""
    return jnp.asarray(deg, jnp.float32).clip(1.0) ** (-p)


#: ``norm`` -> the powers ``(p_src, p_dst)`` of ``out_deg(src)^-p_src in_deg(dst)^-p_dst``, each edge's factor.
NORM_POWERS = {"left": (1.0, 0.0), "right": (0.0, 1.0), "both": (0.5, 0.5)}
#: ``norm`` -> the norm giving each edge the same factor on the transposed graph (whose in- and out-degrees swap).
TRANSPOSED_NORM = {"left": "right", "right": "left", "both": "both"}


def norm_edge_weight(g: Graph, norm: str) -> np.ndarray:
    """A static graph's degree normalisation as one float32 factor per edge, in the order of its edges (host data,
    computed once per graph and norm and kept with the graph): ``out_deg(src)^-p_src * in_deg(dst)^-p_dst`` with the
    powers of :data:`NORM_POWERS`, degrees clamped to at least 1. ``spmm`` multiplies the edges' weights by it
    instead of scaling ``x`` before the product and the output after it (two passes over the features each way)."""

    def make():  # an edge's factor is the transposed norm's on g.T (same edge order): computed once for both
        twin = getattr(g, "_transpose", None)
        shared = twin.__dict__.get("_norm_edge_weights", {}).get(TRANSPOSED_NORM[norm]) if twin is not None else None
        return shared if shared is not None else _norm_edge_weight(g, norm)

    return _kept(g, "_norm_edge_weights", norm, make)


def csr_norm_factor(g: Graph, norm: str) -> np.ndarray:
    """:func:`norm_edge_weight` in ``g``'s CSR order (``[g.edge_perm]``), the order the product reads its weights
    in: host data, computed once per graph and norm and kept with the graph."""
    return _kept(g, "_csr_norm_factors", norm, lambda: norm_edge_weight(g, norm)[g.edge_perm])


def row_norm_factor(g: Graph, norm: str) -> np.ndarray:
    """A static graph's norm of a factor of the destination alone (``"right"``, the mean's: ``in_deg^-p_dst``,
    degrees clamped to at least 1) as one float32 per node: what the product multiplies each node's sum by (host data,
    computed once per graph and norm and kept with the graph, as :func:`csr_norm_factor`)."""
    if NORM_POWERS[norm][0]:
        raise ValueError(f"Expected a norm of the destination alone (no source power). Got {norm!r}.")
    return _kept(
        g, "_row_norm_factors", norm, lambda: _degree_power(g.in_degree, NORM_POWERS[norm][1]).astype(np.float32)
    )


def _kept(g: Graph, attr: str, norm: str, make) -> np.ndarray:
    """``make()``'s array for ``norm``, computed once per graph, kept with it (``g.__dict__[attr]``), read-only."""
    kept = g.__dict__.setdefault(attr, {})
    if norm not in kept:
        value = make()
        value.setflags(write=False)
        kept[norm] = value
    return kept[norm]


def _degree_power(deg: np.ndarray, p: float) -> np.ndarray:
    """``max(deg, 1) ** -p`` per node, in float64 on the host."""
    return np.maximum(deg, 1).astype(np.float64) ** -p


def _norm_edge_weight(g: Graph, norm: str) -> np.ndarray:
    p_src, p_dst = NORM_POWERS[norm]
    w = np.ones(g.num_edges, np.float64)
    if p_src:
        w *= _degree_power(g.out_degree, p_src)[g.src]
    if p_dst:
        w *= _degree_power(g.in_degree, p_dst)[g.dst]
    return w.astype(np.float32)


def spmm(
    g: Graph | DynamicGraph,
    x: jax.Array,
    reduce: str = "sum",
    norm: str | None = None,
    edge_weight: jax.Array | None = None,
    *,
    implementation=None,
    config: GatherConfig | None = None,
) -> jax.Array:
    """Aggregate in-neighbours' features: ``out[i] = sum_{e: j -> i} c_e x[j]``.

    Arguments:
        g: the :class:`Graph` or :class:`DynamicGraph` (messages flow ``src -> dst``).
        x: node features ``(N, ...)``; trailing dimensions are kept.
        reduce: ``"sum"`` or ``"mean"`` (the weighted sum divided by the in-degree, an edge count;
            0 for nodes without in-edges). ``"mean"`` takes no ``norm``: it already divides by
            the in-degree; use ``reduce="sum"`` with a ``norm`` instead.
        norm: degree normalisation as in DGL's ``GraphConv`` (with ``reduce="sum"`` only):
            ``None``; ``"left"`` divides each message by its source's out-degree; ``"right"``
            divides the sum by the destination's in-degree; ``"both"`` (GCN) scales by
            ``out_deg(j)^-1/2 in_deg(i)^-1/2``. Degrees are edge counts (unweighted), clamped to
            at least 1.
        edge_weight: optional ``(E,)`` weights in the order of the edges given to
            :meth:`Graph.from_edges` (a :class:`DynamicGraph`'s: ``(max_edges,)`` in the order of
            ``edge_index``, padding entries ignored).
        implementation: ``None`` (the order of :func:`blocksparse.ops.gnn.order.implementations`: on a GPU
            Pallas, for every feature dtype, except on graphs like those where the tuned data measured XLA faster,
            :func:`blocksparse.ops.gnn.order.choice`; elsewhere XLA), ``"pallas"``, ``"xla"`` or a sequence tried
            in order. Under ``jax.grad`` both products (the forward over ``g``, the backward over ``g.T``) follow
            the tuned data's forward + backward measurement of a graph like ``g`` where there is one; else the
            backward's product over ``g.T`` is chosen alike by ``g.T``'s degrees.
        config: ``None`` or a :class:`~blocksparse.gnn.GatherConfig` for the Pallas kernel (light nodes per
            program, a gather variant); with ``implementation=None`` only the Pallas backend then runs. It
            applies to the forward product; the backward's SpMM over ``g.T`` takes the defaults.

    Returns:
        ``(N, ...)`` in ``x``'s dtype (float32 accumulation). Differentiable w.r.t. ``x`` and
        ``edge_weight``; the backward runs on the cached transpose ``g.T``. A NaN or infinite
        feature or weight reaches exactly the destinations of its edges, as IEEE arithmetic says.

    Raises:
        ValueError: for ``reduce="mean"`` with a ``norm``, an unknown ``reduce`` / ``norm``, or
            shapes that do not match the graph; TypeError for non-floating inputs or a config of
            another type.
    """
    order.check_config("spmm", config)
    if config is not None and config.nodes_per_program not in (None, *SPMM_NODES_PER_PROGRAM):
        raise ValueError(
            f"Expected config.nodes_per_program None or one of {SPMM_NODES_PER_PROGRAM} for spmm. "
            f"Got {config.nodes_per_program!r}."
        )
    if (own := getattr(type(g), "_gnn_spmm", None)) is not None:  # a graph over many devices (sharding.graph)
        if config is not None:
            raise ValueError(f"Expected config=None for a {type(g).__name__} (its parts take the defaults).")
        return own(g, x, reduce, norm, edge_weight, implementation=implementation)
    check_graph(g)
    _dispatch.check_choice("reduce", reduce, ("sum", "mean"))
    _dispatch.check_choice("norm", norm, (None, "left", "right", "both"))
    if reduce == "mean" and norm is not None:
        raise ValueError(
            f"Expected norm=None with reduce='mean'. Got norm={norm!r}: 'mean' already divides by the in-degree; "
            "use reduce='sum' with a norm instead."
        )
    x = g.check_features(x, "features", ndim=tuple(range(1, 8)))
    feat = max(math.prod(x.shape[1:]), 1)
    impls = order.implementations("spmm", implementation, x.dtype, config, graph=g, feat=feat, norm=norm)
    # With the default's choice, under jax.grad both products follow the graph's forward + backward measurement where
    # there is one (the cell timed the forward over g and the backward over g.T together, on each backend); else the
    # backward, a product over g.T, is chosen by g.T's own degrees.
    auto = implementation is None and config is None
    grad, bwd = None, impls
    if auto and isinstance(g, Graph):
        c = order.choice("spmm", order.graph_stats(g), feat, x.dtype, "fwd+bwd", norm=norm)
        grad = c.impls if c.measured is not None else None
    if auto:
        bwd = grad or order.implementations("spmm", None, x.dtype, graph=g, feat=feat, transpose=True, norm=norm)
    weights = ()
    if edge_weight is not None:
        weights = (_checked_weight(g, edge_weight),)
    # The norm (and the mean's division by the in-degree, norm "right"'s) rides on the edge weights, one factor per
    # edge: no pass over x before the product nor over its output after it. A static graph's factors are host data
    # the product multiplies in (SpmmStatic.norm; a factor of the destination alone scales each float32 sum once
    # instead, on either backend); a dynamic graph's are traced from its degrees.
    scaling = "right" if reduce == "mean" else norm
    if scaling is not None and isinstance(g, DynamicGraph) and g.num_nodes and g.edge_capacity:  # (else: no product)
        factor = _dynamic_edge_factor(g, scaling)
        weights = (factor if not weights else weights[0].astype(jnp.float32) * factor,)
        scaling = None
    s = SpmmStatic(impls, config=config, bwd_impls=None if bwd == impls else bwd, norm=scaling,
                   grad_impls=None if grad in (None, impls) else grad)  # fmt: skip
    valid = g.validity() if isinstance(g, DynamicGraph) else None  # NaN out (and NaN gradients) if invalid
    x = poison(valid, x)
    weights = tuple(poison(valid, w) for w in weights)
    shape = x.shape
    x2 = x.reshape(shape[0], math.prod(shape[1:]))
    if g.edge_capacity == 0 or g.num_nodes == 0 or x2.shape[1] == 0:
        out = jnp.zeros_like(x2)
    else:
        out = _spmm(s, g, x2, *weights)
    return nan_unless(valid, out.reshape(shape))


def _dynamic_edge_factor(g: DynamicGraph, norm: str) -> jax.Array:
    """The norm's factor of each edge of a dynamic graph (:data:`NORM_POWERS`), from its traced degrees (its padding
    edges' factors unused)."""
    p_src, p_dst = NORM_POWERS[norm]
    return inverse_degree_power(g.out_degree, p_src)[g.src] * inverse_degree_power(g.in_degree, p_dst)[g.dst]
