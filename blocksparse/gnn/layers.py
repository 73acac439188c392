"""Message-passing layers in the shape PyTorch Geometric users know: GCNConv, GATv2Conv, TransformerConv.

Plain pytrees (:class:`~blocksparse._util.Pytree` frozen dataclasses): parameters are leaves, the
configuration is static. Each layer is called as ``layer(x, edge_index, ...)`` with PyG's
conventions: ``edge_index`` ``(2, E)`` integers, row 0 the sources and row 1 the targets, messages
flow ``source -> target``; weights are stored as PyG stores them, ``(out, in)``, so a PyG
``state_dict`` maps one to one (``lin.weight`` -> ``weight``).

``edge_index`` may also be a prebuilt :class:`~blocksparse.gnn.Graph` (static: ``jit`` specialises
per graph) or :class:`~blocksparse.gnn.DynamicGraph`. An ``edge_index`` array becomes a
``DynamicGraph`` with ``num_nodes`` rows and ``E`` edges of capacity, so under ``jit`` every graph
of the same shapes shares one compilation; ``num_edges`` marks the leading edges that count (the
rest is padding).

The aggregation runs on the fused ops (:func:`~blocksparse.gnn.spmm` for GCN,
:func:`~blocksparse.gnn.gatv2` and :func:`~blocksparse.gnn.graph_attention` for the attention
layers: Pallas kernels on GPUs, XLA on CPUs). Two cases the fused attention ops cannot express run
on segment ops over the edges instead (``E x H x C`` memory): per-edge features (``edge_attr``
with ``edge_dim``) and dropout on the attention weights while training. Nodes without in-edges
receive no message (0, never NaN).

The same layers as Flax NNX and Equinox modules: ``bs.gnn.flax`` and ``bs.gnn.equinox``
(parameters held the framework's way; each call runs these layers).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from .._checkpoint import register_checkpoint_type
from .._util import Pytree, check_positive_int
from ..graph import DynamicGraph, Graph
from ..ops.gnn.attention import gatv2, graph_attention
from ..ops.gnn.spmm import spmm

__all__ = ["GATv2Conv", "GCNConv", "TransformerConv"]


# ------------------------------------------------------------------------------------ helpers
def _glorot(key, shape, fan_in: int, fan_out: int, dtype):
    bound = math.sqrt(6.0 / max(fan_in + fan_out, 1))
    return jax.random.uniform(key, shape, dtype, -bound, bound)


def _linear_init(key, in_features: int, out_features: int, bias: bool, dtype, init: str):
    """PyG's ``Linear``: ``glorot`` or torch's default (kaiming uniform, ``+-1/sqrt(in)``); bias zero / uniform."""
    kw, kb = jax.random.split(key)
    if init == "glorot":
        w = _glorot(kw, (out_features, in_features), in_features, out_features, dtype)
        b = jnp.zeros((out_features,), dtype) if bias else None
    else:
        bound = 1.0 / math.sqrt(max(in_features, 1))
        w = jax.random.uniform(kw, (out_features, in_features), dtype, -bound, bound)
        b = jax.random.uniform(kb, (out_features,), dtype, -bound, bound) if bias else None
    return w, b


def _linear(x, w, b=None):
    acc = jnp.float32 if jnp.finfo(x.dtype).bits < 32 else None  # half precision accumulates in float32
    y = jnp.dot(x, w.T.astype(x.dtype), preferred_element_type=acc)
    if b is not None:
        y = y + b
    return y.astype(jnp.result_type(x, w))


def _impl(implementation):
    """The fused ops' ``implementation`` as a hashable static value (a sequence becomes a tuple)."""
    if implementation is None or isinstance(implementation, str):
        return implementation
    return tuple(implementation)


def _sizes(layer: str, **sizes) -> None:
    """Each size a positive int, named in the error (PyG's lazy ``in_channels=-1`` is not supported: the weights
    are built by ``init``, before any input is seen)."""
    for name, v in sizes.items():
        if v is not None:
            lazy = " (PyG's lazy -1 is not supported: give the input's feature size)" if v == -1 else ""
            check_positive_int(v, name, layer, lazy)


def _pair(layer: str, v) -> tuple[int, int]:
    """``in_channels`` as ``(in_src, in_dst)``: one size for both or a pair, each a positive int."""
    pair = tuple(v) if isinstance(v, tuple | list) else (v, v)
    if len(pair) != 2:
        raise ValueError(f"{layer}: expected in_channels as an int or a pair (in_src, in_dst). Got {v!r}.")
    if pair[0] == pair[1]:
        _sizes(layer, in_channels=pair[0])
    else:
        _sizes(layer, in_src=pair[0], in_dst=pair[1])
    return int(pair[0]), int(pair[1])


def _check_x(layer: str, x, in_channels: int, what: str = "x"):
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"{layer}: expected floating-point {what}. Got {x.dtype}.")
    if x.ndim != 2 or x.shape[1] != in_channels:
        raise ValueError(f"{layer}: expected {what} of shape (num_nodes, in_channels={in_channels}). Got {x.shape}.")
    return x


def _split_x(layer: str, x, in_channels: tuple[int, int]):
    """``x`` or ``(x_src, x_dst)`` (bipartite) -> checked ``(x_src, x_dst, bipartite)``."""
    if isinstance(x, tuple | list):
        if len(x) != 2:
            raise ValueError(f"{layer}: expected x or a pair (x_src, x_dst). Got a sequence of {len(x)}.")
        return _check_x(layer, x[0], in_channels[0], "x_src"), _check_x(layer, x[1], in_channels[1], "x_dst"), True
    if in_channels[0] != in_channels[1]:
        raise ValueError(
            f"{layer}: expected a pair (x_src, x_dst) for in_channels={in_channels} (a bipartite layer). Got one array."
        )
    x = _check_x(layer, x, in_channels[0])
    return x, x, False


def _check_edge_index(layer: str, edge_index, n_src: int, n_dst: int, num_edges):
    """Shape and dtype always; node ranges where the data is concrete (inside ``jit`` the graph is made invalid)."""
    shape, dtype = np.shape(edge_index), getattr(edge_index, "dtype", None)
    if dtype is None:
        edge_index = np.asarray(edge_index)
        dtype = edge_index.dtype if edge_index.size else np.dtype(np.int32)
        if not edge_index.size:
            edge_index = edge_index.astype(np.int32).reshape(shape)
    if len(shape) != 2 or shape[0] != 2:
        raise ValueError(f"{layer}: expected edge_index of shape (2, num_edges). Got shape {tuple(shape)}.")
    if not np.issubdtype(dtype, np.integer):
        raise TypeError(f"{layer}: expected edge_index of an integer dtype. Got {np.dtype(dtype)}.")
    concrete = not isinstance(edge_index, jax.core.Tracer)
    if concrete and (num_edges is None or not isinstance(num_edges, jax.core.Tracer)):
        ei = np.asarray(edge_index).astype(np.int64)
        count = ei.shape[1] if num_edges is None else int(np.asarray(num_edges))
        if not 0 <= count <= ei.shape[1]:
            raise ValueError(f"{layer}: expected num_edges in [0, {ei.shape[1]}]. Got {count}.")
        for row, n, name in ((0, n_src, "source"), (1, n_dst, "target")):
            bad = np.flatnonzero((ei[row, :count] < 0) | (ei[row, :count] >= n))
            if bad.size:
                c = int(bad[0])
                raise ValueError(
                    f"{layer}: expected {name} node indices in [0, {n}). Got edge_index[{row}, {c}] = {ei[row, c]} "
                    f"({bad.size} out of range)."
                )
    return edge_index


def _resolve_graph(layer: str, edge_index, n: int, n_src: int, n_dst: int, num_nodes, num_edges, build=True):
    """The graph over ``n = max(n_src, n_dst)`` nodes: a given Graph / DynamicGraph, or one built from ``edge_index``.

    With ``build=False`` an ``edge_index`` array is only checked, and returned as it is.
    """
    if num_nodes is not None and int(num_nodes) != n:
        raise ValueError(f"{layer}: expected num_nodes={num_nodes} to match the features' rows. Got {n} rows.")
    if isinstance(edge_index, Graph | DynamicGraph):
        if edge_index.num_nodes != n:
            raise ValueError(
                f"{layer}: expected a graph of num_nodes={n} (the features' rows"
                f"{'' if n_src == n_dst else ', max(n_src, n_dst)'}). Got {edge_index!r}."
            )
        if num_edges is not None:
            raise ValueError(f"{layer}: num_edges applies to an edge_index array, not to a prebuilt {edge_index!r}.")
        return edge_index
    edge_index = _check_edge_index(layer, edge_index, n_src, n_dst, num_edges)
    if not build:
        return edge_index
    return DynamicGraph.from_edge_index(edge_index, num_nodes=n, num_edges=num_edges)


def _edges(g):
    """``(src, dst, mask)`` in the graph's edge order; ``mask`` is None when every edge counts."""
    if isinstance(g, Graph):
        # A static graph's edges are constants of the compiled program; behind the barrier XLA computes
        # what derives from them at run time (microseconds) instead of constant-folding scatters over
        # every edge at each compilation (a minute for a million edges on a CPU).
        return (*jax.lax.optimization_barrier((jnp.asarray(g.src), jnp.asarray(g.dst))), None)
    return g.src, g.dst, g.edge_mask


def _segments(dst, mask, n: int):
    """Segment ids over ``n + 1`` segments: masked-out edges go to the dropped segment ``n``."""
    return dst if mask is None else jnp.where(mask, dst, n)


def _check_edge_array(layer: str, g, a, what: str, trailing: tuple[int, ...] | None = None):
    a = jnp.asarray(a)
    e = g.edge_capacity if isinstance(g, Graph | DynamicGraph) else np.shape(g)[1]
    if a.shape[:1] != (e,) or (trailing is not None and a.shape[1:] != trailing):
        want = f"({e},)" if trailing == () else f"({e}{''.join(f', {t}' for t in trailing) if trailing else ', ...'})"
        raise ValueError(f"{layer}: expected {what} of shape {want}, one row per edge of the graph. Got {a.shape}.")
    if not jnp.issubdtype(a.dtype, jnp.floating):
        raise TypeError(f"{layer}: expected floating-point {what}. Got {a.dtype}.")
    return a


def _valid_or_nan(g, out):
    if isinstance(g, DynamicGraph):
        return jnp.where(g.valid, out, jnp.asarray(jnp.nan, out.dtype))
    return out


def _dropout_key(layer: str, rate: float, key, deterministic):
    """The key to drop attention weights with, or None (no dropout)."""
    if deterministic is None:
        deterministic = key is None
    if deterministic or rate == 0.0:
        return None
    if key is None:
        raise ValueError(f"{layer}: dropout={rate} with deterministic=False needs a key. Got key=None.")
    return key


def _segment_softmax(logits, seg, n: int):
    """Softmax of ``logits (E, H)`` over each segment; edges of the dropped segment ``n`` get 0."""
    m = jax.ops.segment_max(logits, seg, n + 1)
    m = jax.lax.stop_gradient(jnp.where(jnp.isfinite(m), m, 0.0))
    p = jnp.exp(logits - m[seg])
    p = jnp.where((seg < n)[:, None], p, 0.0)
    s = jax.ops.segment_sum(p, seg, n + 1)
    return p / jnp.where(s > 0, s, 1.0)[seg]


def _segment_attention(logits, values, seg, n: int, rate: float, key):
    """``sum_e alpha_e values[e]`` per target, ``alpha`` the softmax of ``logits`` (dropped out with ``key``)."""
    alpha = _segment_softmax(logits.astype(jnp.float32), seg, n)
    if key is not None:
        keep = jax.random.bernoulli(key, 1.0 - rate, alpha.shape)
        alpha = jnp.where(keep, alpha / (1.0 - rate), 0.0)
    out = jax.ops.segment_sum(alpha[..., None] * values.astype(jnp.float32), seg, n + 1)
    return out[:n]


def _pad_rows(x, n: int):
    return x if x.shape[0] == n else jnp.pad(x, ((0, n - x.shape[0]),) + ((0, 0),) * (x.ndim - 1))


# ------------------------------------------------------------------------------------ self loops
@functools.lru_cache(maxsize=32)
def _static_with_loops(g: Graph, n_loop: int) -> tuple[Graph, np.ndarray]:
    """A static graph's self loops removed, one added per node ``< n_loop`` (first); the kept edges' ids."""
    keep = np.flatnonzero(g.src != g.dst)
    loops = np.arange(n_loop, dtype=np.int32)
    g2 = Graph.from_edges(np.concatenate([loops, g.src[keep]]), np.concatenate([loops, g.dst[keep]]), g.num_nodes)
    return g2, keep


def _with_self_loops(layer: str, edge_index, n: int, n_loop: int, num_edges, edge_attr):
    """PyG's ``remove_self_loops`` then ``add_self_loops(fill_value="mean")``: the new graph and edge features.

    ``edge_index`` is an array (checked by the caller), a ``Graph`` or a ``DynamicGraph``. The loops
    come first, then the kept edges in their order: one graph is built (a ``Graph`` stays static).
    A loop's features are the mean of the node's kept in-edges' features, 0 without in-edges.
    """

    def loop_attr(kept_attr, kept_dst, kept_mask):
        seg = _segments(kept_dst, kept_mask, n)
        tot = jax.ops.segment_sum(kept_attr, seg, n + 1)[:n_loop]
        cnt = jax.ops.segment_sum(jnp.ones(seg.shape, kept_attr.dtype), seg, n + 1)[:n_loop]
        return tot / jnp.maximum(cnt, 1.0)[:, None]

    if isinstance(edge_index, Graph):
        g2, keep = _static_with_loops(edge_index, n_loop)
        if edge_attr is None:
            return g2, None
        kept = edge_attr[keep]
        return g2, jnp.concatenate([loop_attr(kept, jnp.asarray(edge_index.dst[keep]), None), kept])
    if isinstance(edge_index, DynamicGraph):
        src, dst, active, valid = edge_index.src, edge_index.dst, edge_index.edge_mask, edge_index.valid
    else:
        ei = jnp.asarray(edge_index)
        src, dst, valid = ei[0].astype(jnp.int32), ei[1].astype(jnp.int32), None
        e = src.shape[0]
        active = jnp.ones((e,), bool) if num_edges is None else jnp.arange(e) < jnp.asarray(num_edges)
    keep = active & (src != dst)
    order = jnp.argsort(~keep, stable=True)  # kept edges first, in their order
    loops = jnp.arange(n_loop, dtype=jnp.int32)
    ei2 = jnp.concatenate([jnp.stack([loops, loops]), jnp.stack([src, dst])[:, order]], axis=1)
    count = n_loop + jnp.sum(keep, dtype=jnp.int32)
    if num_edges is not None and not isinstance(edge_index, DynamicGraph):
        # a num_edges outside [0, E] makes the graph invalid, as DynamicGraph.from_edge_index does
        ok = (jnp.asarray(num_edges) >= 0) & (jnp.asarray(num_edges) <= src.shape[0])
        count = jnp.where(ok, count, -1)
    g2 = DynamicGraph.from_edge_index(ei2, num_nodes=n, num_edges=count)
    if valid is not None:
        g2 = g2._replace(valid=g2.valid & valid)
    if edge_attr is None:
        return g2, None
    kept = edge_attr[order]
    return g2, jnp.concatenate([loop_attr(kept, dst[order], keep[order]), kept])


# ------------------------------------------------------------------------------------ GCNConv
@dataclasses.dataclass(frozen=True, eq=False)  # hashed by identity: jax.jit(layer) works
class GCNConv(Pytree):
    r"""Graph convolution (Kipf & Welling), as PyG's ``GCNConv``: ``X' = D^-1/2 (A + I) D^-1/2 X W^T + b``.

    With ``normalize=True`` (the default), each node gets one self loop (weight 1, or 2 with
    ``improved=True``; a node that already has one keeps its weight instead, as PyG's
    ``add_remaining_self_loops``), ``deg_i`` is the sum of the weights of ``i``'s in-edges (the
    target side, loops included), and edge ``j -> i`` of weight ``w`` carries
    ``deg_j^-1/2 w deg_i^-1/2 x_j W^T`` (a zero degree gives a zero factor, a negative one NaN). With
    ``normalize=False`` the messages are ``w x_j W^T``, summed, and no loops are added.

    Attributes:
        weight: ``(out_channels, in_channels)`` (PyG's ``lin.weight``).
        bias: ``(out_channels,)`` or ``None``.
        improved, add_self_loops, normalize: as in PyG (static).
        implementation: passed to :func:`~blocksparse.gnn.spmm` (``None``: Pallas on a GPU, else XLA).

    Example::

        >>> import jax, jax.numpy as jnp
        >>> from blocksparse.gnn.layers import GCNConv
        >>> conv = GCNConv.init(jax.random.key(0), 4, 8)
        >>> conv(jnp.ones((3, 4)), jnp.array([[0, 1], [1, 2]])).shape
        (3, 8)
    """

    _leaves = ("weight", "bias")
    _static = ("improved", "add_self_loops", "normalize", "implementation")

    weight: jax.Array
    bias: jax.Array | None
    improved: bool = False
    add_self_loops: bool = True
    normalize: bool = True
    implementation: str | tuple[str, ...] | None = None

    def __post_init__(self):
        if self.add_self_loops and not self.normalize:
            raise ValueError(
                "GCNConv: expected add_self_loops=False with normalize=False (self loops are added by the "
                "normalisation, as in PyG). Got add_self_loops=True."
            )

    @classmethod
    def init(
        cls, key, in_channels: int, out_channels: int, *, improved: bool = False, add_self_loops: bool | None = None,
        normalize: bool = True, bias: bool = True, dtype=jnp.float32, implementation=None,
    ) -> GCNConv:  # fmt: skip
        """Glorot-uniform weight, zero bias (as PyG). ``add_self_loops`` defaults to ``normalize``."""
        _sizes("GCNConv", in_channels=in_channels, out_channels=out_channels)
        w, b = _linear_init(key, in_channels, out_channels, False, dtype, "glorot")
        b = jnp.zeros((out_channels,), dtype) if bias else None
        loops = normalize if add_self_loops is None else add_self_loops
        return cls(w, b, improved=improved, add_self_loops=loops, normalize=normalize,
                   implementation=_impl(implementation))  # fmt: skip

    @property
    def in_channels(self) -> int:
        return self.weight.shape[1]

    @property
    def out_channels(self) -> int:
        return self.weight.shape[0]

    def __call__(self, x, edge_index, edge_weight=None, *, num_nodes=None, num_edges=None) -> jax.Array:
        """``x (N, in_channels)`` -> ``(N, out_channels)``.

        Arguments:
            x: node features.
            edge_index: ``(2, E)`` integers (row 0 sources, row 1 targets), or a ``Graph`` /
                ``DynamicGraph`` over ``N`` nodes.
            edge_weight: optional ``(E,)`` weights in the order of the edges (a ``DynamicGraph``'s
                ``(max_edges,)``); default 1.
            num_nodes: if given, checked against ``x``'s rows.
            num_edges: with an ``edge_index`` array, how many leading edges count (traceable).
        """
        x = _check_x("GCNConv", x, self.in_channels)
        n = x.shape[0]
        g = _resolve_graph("GCNConv", edge_index, n, n, n, num_nodes, num_edges)
        h = _linear(x, self.weight)
        src, dst, mask = _edges(g)
        w = None if edge_weight is None else _check_edge_array("GCNConv", g, edge_weight, "edge_weight", ())
        if not self.normalize:
            out = spmm(g, h, "sum", edge_weight=w, implementation=self.implementation)
        else:
            w = jnp.ones(src.shape, jnp.float32) if w is None else w.astype(jnp.float32)
            seg = _segments(dst, mask, n)
            loop_w = jnp.zeros((n,), jnp.float32)
            if self.add_self_loops:
                # add_remaining_self_loops: a node's existing loop (the last one given) keeps its weight.
                is_loop = (src == dst) & (seg < n)
                last = jax.ops.segment_max(jnp.where(is_loop, jnp.arange(src.shape[0]), -1), seg, n + 1)[:n]
                fill = 2.0 if self.improved else 1.0
                loop_w = jnp.where(last >= 0, w[jnp.maximum(last, 0)], fill) if src.shape[0] else jnp.full((n,), fill)
                w = jnp.where(is_loop, 0.0, w)
            deg = jax.ops.segment_sum(jnp.where(seg < n, w, 0.0), seg, n + 1)[:n] + loop_w
            # a zero degree gives 0, a negative one NaN (as PyG's gcn_norm): never a silent 0
            dinv = jnp.where(deg == 0, 0.0, jax.lax.rsqrt(jnp.where(deg == 0, 1.0, deg)))
            norm = dinv[src] * w * dinv[dst]
            out = spmm(g, h, "sum", edge_weight=norm.astype(h.dtype), implementation=self.implementation)
            out = out + ((dinv * dinv * loop_w)[:, None] * h).astype(h.dtype)
        if self.bias is not None:
            out = out + self.bias.astype(out.dtype)
        return _valid_or_nan(g, out)


# ------------------------------------------------------------------------------------ GATv2Conv
@dataclasses.dataclass(frozen=True, eq=False)  # hashed by identity: jax.jit(layer) works
class GATv2Conv(Pytree):
    r"""GATv2 attention (Brody et al.), as PyG's ``GATv2Conv``.

    ``e_ij = a_h . leaky_relu(W_l x_j + W_r x_i + W_e e_ji)`` per head ``h``, ``alpha`` its softmax
    over ``i``'s in-edges (dropped out with rate ``dropout`` while training), ``x'_i = sum_j alpha_ij
    W_l x_j``; heads concatenated (``concat=True``, ``(N, heads * out)``) or averaged (``(N, out)``),
    then the bias. With ``add_self_loops`` every node's self loops are replaced by one (PyG's
    ``remove_self_loops`` then ``add_self_loops``; a loop's edge features are the mean of the node's
    in-edges'). A bipartite layer (``in_channels=(in_src, in_dst)``) takes ``x=(x_src, x_dst)``; its
    loops are added for nodes ``< min(n_src, n_dst)``, as PyG does.

    Without edge features and dropout this is one fused :func:`~blocksparse.gnn.gatv2`; with them,
    segment ops over the edges.

    Attributes:
        lin_l_weight, lin_l_bias: source projection ``(heads * out, in_src)``, ``(heads * out,)``.
        lin_r_weight, lin_r_bias: target projection (``None`` with ``share_weights``: ``lin_l`` is used).
        att: ``(heads, out)``.
        lin_edge_weight: ``(heads * out, edge_dim)`` or ``None``.
        bias: ``(heads * out,)`` if ``concat`` else ``(out,)``, or ``None``.
        heads, out_channels, concat, negative_slope, dropout, add_self_loops, share_weights: static.
        implementation: passed to :func:`~blocksparse.gnn.gatv2` (``None``: Pallas on a GPU, else XLA).
    """

    _leaves = ("lin_l_weight", "lin_l_bias", "lin_r_weight", "lin_r_bias", "att", "lin_edge_weight", "bias")
    _static = (
        "heads", "out_channels", "concat", "negative_slope", "dropout", "add_self_loops", "share_weights",
        "implementation",
    )  # fmt: skip

    lin_l_weight: jax.Array
    lin_l_bias: jax.Array | None
    lin_r_weight: jax.Array | None
    lin_r_bias: jax.Array | None
    att: jax.Array
    lin_edge_weight: jax.Array | None
    bias: jax.Array | None
    heads: int = 1
    out_channels: int = 1
    concat: bool = True
    negative_slope: float = 0.2
    dropout: float = 0.0
    add_self_loops: bool = True
    share_weights: bool = False
    implementation: str | tuple[str, ...] | None = None

    @classmethod
    def init(
        cls, key, in_channels: int | tuple[int, int], out_channels: int, *, heads: int = 1, concat: bool = True,
        negative_slope: float = 0.2, dropout: float = 0.0, add_self_loops: bool = True, edge_dim: int | None = None,
        bias: bool = True, share_weights: bool = False, dtype=jnp.float32, implementation=None,
    ) -> GATv2Conv:  # fmt: skip
        """Glorot-uniform weights and ``att``, zero biases (as PyG)."""
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"GATv2Conv: expected dropout in [0, 1). Got {dropout}.")
        in_src, in_dst = _pair("GATv2Conv", in_channels)
        _sizes("GATv2Conv", out_channels=out_channels, heads=heads, edge_dim=edge_dim)
        if share_weights and in_src != in_dst:
            raise ValueError(f"GATv2Conv: share_weights needs in_src == in_dst. Got in_channels={in_channels}.")
        hc = heads * out_channels
        kl, kr, ka, ke = jax.random.split(key, 4)
        wl, bl = _linear_init(kl, in_src, hc, bias, dtype, "glorot")
        wr, br = (None, None) if share_weights else _linear_init(kr, in_dst, hc, bias, dtype, "glorot")
        att = _glorot(ka, (heads, out_channels), heads, out_channels, dtype)
        we = None if edge_dim is None else _linear_init(ke, edge_dim, hc, False, dtype, "glorot")[0]
        b = jnp.zeros((hc if concat else out_channels,), dtype) if bias else None
        return cls(wl, bl, wr, br, att, we, b, heads=heads, out_channels=out_channels, concat=concat,
                   negative_slope=float(negative_slope), dropout=float(dropout), add_self_loops=add_self_loops,
                   share_weights=share_weights, implementation=_impl(implementation))  # fmt: skip

    @property
    def in_channels(self) -> tuple[int, int]:
        w_r = self.lin_l_weight if self.lin_r_weight is None else self.lin_r_weight
        return self.lin_l_weight.shape[1], w_r.shape[1]

    def __call__(
        self, x, edge_index, edge_attr=None, *, num_nodes=None, num_edges=None, key=None, deterministic=None
    ) -> jax.Array:
        """``x (N, in)`` or ``(x_src (N_src, in_src), x_dst (N_dst, in_dst))`` -> ``(N_dst, heads * out)`` (or ``out``).

        Arguments:
            x: node features, or a pair for a bipartite graph (``edge_index`` row 0 indexes
                ``x_src``, row 1 ``x_dst``).
            edge_index: ``(2, E)`` integers, or a ``Graph`` / ``DynamicGraph`` over
                ``max(N_src, N_dst)`` nodes.
            edge_attr: ``(E, edge_dim)`` (or ``(E,)`` for ``edge_dim=1``) in the order of the edges
                (a ``DynamicGraph``'s: ``(max_edges, edge_dim)``). Optional for a layer with
                ``edge_dim``, an error without one (as PyG).
            num_nodes: if given, checked against the features' rows.
            num_edges: with an ``edge_index`` array, how many leading edges count (traceable).
            key: PRNG key for dropout on the attention weights.
            deterministic: ``True``: no dropout; ``False``: dropout (needs ``key``); ``None``
                (default): dropout exactly when a ``key`` is given.
        """
        layer = "GATv2Conv"
        x_src, x_dst, _ = _split_x(layer, x, self.in_channels)
        n_src, n_dst = x_src.shape[0], x_dst.shape[0]
        n = max(n_src, n_dst)
        # With self loops, the graph is built once, from the edges with the loops (not twice).
        g = _resolve_graph(layer, edge_index, n, n_src, n_dst, num_nodes, num_edges, build=not self.add_self_loops)
        if edge_attr is not None and self.lin_edge_weight is None:  # PyG asserts this too
            raise ValueError("GATv2Conv: expected no edge_attr for a layer without edge_dim. Got edge_attr.")
        use_edges = edge_attr is not None
        if use_edges:
            edge_attr = jnp.asarray(edge_attr)
            edge_attr = edge_attr[:, None] if edge_attr.ndim == 1 else edge_attr
            edge_attr = _check_edge_array(layer, g, edge_attr, "edge_attr", (self.lin_edge_weight.shape[1],))
        if self.add_self_loops:
            g, edge_attr = _with_self_loops(layer, g, n, min(n_src, n_dst), num_edges, edge_attr if use_edges else None)
        drop = _dropout_key(layer, self.dropout, key, deterministic)
        h, c = self.heads, self.out_channels
        x_l = _linear(x_src, self.lin_l_weight, self.lin_l_bias).reshape(n_src, h, c)
        if self.share_weights:
            x_r = x_l if x_dst is x_src else _linear(x_dst, self.lin_l_weight, self.lin_l_bias).reshape(n_dst, h, c)
        else:
            x_r = _linear(x_dst, self.lin_r_weight, self.lin_r_bias).reshape(n_dst, h, c)
        x_l, x_r = _pad_rows(x_l, n), _pad_rows(x_r, n)
        if not use_edges and drop is None:
            out = gatv2(g, x_l, x_r, self.att, self.negative_slope, implementation=self.implementation)
        else:
            src, dst, mask = _edges(g)
            z = (x_l[src] + x_r[dst]).astype(jnp.float32)
            if use_edges:
                z = z + _linear(edge_attr, self.lin_edge_weight).reshape(-1, h, c).astype(jnp.float32)
            logits = jnp.sum(jax.nn.leaky_relu(z, self.negative_slope) * self.att.astype(jnp.float32), axis=-1)
            out = _segment_attention(logits, x_l[src], _segments(dst, mask, n), n, self.dropout, drop)
            out = out.astype(x_l.dtype)
        out = out[:n_dst]
        out = out.reshape(n_dst, h * c) if self.concat else jnp.mean(out, axis=1)
        if self.bias is not None:
            out = out + self.bias.astype(out.dtype)
        return _valid_or_nan(g, out)


# ------------------------------------------------------------------------------------ TransformerConv
@dataclasses.dataclass(frozen=True, eq=False)  # hashed by identity: jax.jit(layer) works
class TransformerConv(Pytree):
    r"""Graph transformer attention (Shi et al.), as PyG's ``TransformerConv``.

    ``alpha_ij = softmax_j((W_q x_i) . (W_k x_j + W_e e_ji) / sqrt(out))`` per head over ``i``'s
    in-edges (dropped out with rate ``dropout`` while training), ``x'_i = sum_j alpha_ij (W_v x_j +
    W_e e_ji)``, heads concatenated or averaged; then with ``root_weight`` the skip ``W_s x_i`` is
    added, or with ``beta`` gated: ``b = sigmoid(w_b . [x', W_s x_i, x' - W_s x_i])``,
    ``b W_s x_i + (1 - b) x'``. No self loops are added (as PyG). The biases live in the
    projections (``bias=False`` drops them all).

    Without edge features and dropout this is one fused :func:`~blocksparse.gnn.graph_attention`;
    with them, segment ops over the edges.

    Attributes:
        lin_query_weight/bias, lin_key_weight/bias, lin_value_weight/bias: ``(heads * out, in)`` and ``(heads * out,)``.
        lin_edge_weight: ``(heads * out, edge_dim)`` or ``None``.
        lin_skip_weight/bias: ``(heads * out, in_dst)`` (``(out, in_dst)`` without ``concat``), or ``None``
            without ``root_weight``.
        lin_beta_weight: ``(1, 3 * heads * out)`` (``(1, 3 * out)`` without ``concat``) with ``beta``, else ``None``.
        heads, out_channels, concat, dropout: static.
        implementation: passed to :func:`~blocksparse.gnn.graph_attention` (``None``: Pallas on a GPU, else XLA).
    """

    _leaves = (
        "lin_query_weight", "lin_query_bias", "lin_key_weight", "lin_key_bias", "lin_value_weight", "lin_value_bias",
        "lin_edge_weight", "lin_skip_weight", "lin_skip_bias", "lin_beta_weight",
    )  # fmt: skip
    _static = ("heads", "out_channels", "concat", "dropout", "implementation")

    lin_query_weight: jax.Array
    lin_query_bias: jax.Array | None
    lin_key_weight: jax.Array
    lin_key_bias: jax.Array | None
    lin_value_weight: jax.Array
    lin_value_bias: jax.Array | None
    lin_edge_weight: jax.Array | None
    lin_skip_weight: jax.Array | None
    lin_skip_bias: jax.Array | None
    lin_beta_weight: jax.Array | None
    heads: int = 1
    out_channels: int = 1
    concat: bool = True
    dropout: float = 0.0
    implementation: str | tuple[str, ...] | None = None

    @classmethod
    def init(
        cls, key, in_channels: int | tuple[int, int], out_channels: int, *, heads: int = 1, concat: bool = True,
        beta: bool = False, dropout: float = 0.0, edge_dim: int | None = None, bias: bool = True,
        root_weight: bool = True, dtype=jnp.float32, implementation=None,
    ) -> TransformerConv:  # fmt: skip
        """torch's default ``Linear`` initialisation (uniform ``+-1/sqrt(in)``), as PyG."""
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"TransformerConv: expected dropout in [0, 1). Got {dropout}.")
        if beta and not root_weight:
            raise ValueError("TransformerConv: beta gates the root weight; expected root_weight=True with beta=True.")
        in_src, in_dst = _pair("TransformerConv", in_channels)
        _sizes("TransformerConv", out_channels=out_channels, heads=heads, edge_dim=edge_dim)
        hc = heads * out_channels
        out_skip = hc if concat else out_channels
        kq, kk, kv, ke, ks, kb = jax.random.split(key, 6)
        wq, bq = _linear_init(kq, in_dst, hc, bias, dtype, "torch")
        wk, bk = _linear_init(kk, in_src, hc, bias, dtype, "torch")
        wv, bv = _linear_init(kv, in_src, hc, bias, dtype, "torch")
        we = None if edge_dim is None else _linear_init(ke, edge_dim, hc, False, dtype, "torch")[0]
        ws, bs_ = _linear_init(ks, in_dst, out_skip, bias, dtype, "torch") if root_weight else (None, None)
        wb = _linear_init(kb, 3 * out_skip, 1, False, dtype, "torch")[0] if beta else None
        return cls(wq, bq, wk, bk, wv, bv, we, ws, bs_, wb, heads=heads, out_channels=out_channels, concat=concat,
                   dropout=float(dropout), implementation=_impl(implementation))  # fmt: skip

    @property
    def in_channels(self) -> tuple[int, int]:
        return self.lin_key_weight.shape[1], self.lin_query_weight.shape[1]

    def __call__(
        self, x, edge_index, edge_attr=None, *, num_nodes=None, num_edges=None, key=None, deterministic=None
    ) -> jax.Array:
        """``x (N, in)`` or ``(x_src, x_dst)`` -> ``(N_dst, heads * out)`` (or ``out`` without ``concat``).

        Arguments are those of :meth:`GATv2Conv.__call__`, except that ``edge_attr`` is required
        exactly when the layer has ``edge_dim`` (as PyG).
        """
        layer = "TransformerConv"
        x_src, x_dst, _ = _split_x(layer, x, self.in_channels)
        n_src, n_dst = x_src.shape[0], x_dst.shape[0]
        n = max(n_src, n_dst)
        g = _resolve_graph(layer, edge_index, n, n_src, n_dst, num_nodes, num_edges)
        if (self.lin_edge_weight is None) != (edge_attr is None):  # PyG asserts this too
            raise ValueError(
                f"TransformerConv: expected edge_attr exactly when the layer has edge_dim (edge_dim="
                f"{None if self.lin_edge_weight is None else self.lin_edge_weight.shape[1]}). Got "
                f"{'None' if edge_attr is None else 'edge_attr'}."
            )
        use_edges = edge_attr is not None
        if use_edges:
            edge_attr = jnp.asarray(edge_attr)
            edge_attr = edge_attr[:, None] if edge_attr.ndim == 1 else edge_attr
            edge_attr = _check_edge_array(layer, g, edge_attr, "edge_attr", (self.lin_edge_weight.shape[1],))
        drop = _dropout_key(layer, self.dropout, key, deterministic)
        h, c = self.heads, self.out_channels
        q = _pad_rows(_linear(x_dst, self.lin_query_weight, self.lin_query_bias).reshape(n_dst, h, c), n)
        k = _pad_rows(_linear(x_src, self.lin_key_weight, self.lin_key_bias).reshape(n_src, h, c), n)
        v = _pad_rows(_linear(x_src, self.lin_value_weight, self.lin_value_bias).reshape(n_src, h, c), n)
        scale = 1.0 / math.sqrt(c)
        if not use_edges and drop is None:
            out = graph_attention(g, q, k, v, scale, implementation=self.implementation)
        else:
            src, dst, mask = _edges(g)
            kj, vj = k[src].astype(jnp.float32), v[src].astype(jnp.float32)
            if use_edges:
                e = _linear(edge_attr, self.lin_edge_weight).reshape(-1, h, c).astype(jnp.float32)
                kj, vj = kj + e, vj + e
            logits = jnp.sum(q[dst].astype(jnp.float32) * kj, axis=-1) * scale
            out = _segment_attention(logits, vj, _segments(dst, mask, n), n, self.dropout, drop)
            out = out.astype(q.dtype)
        out = out[:n_dst]
        out = out.reshape(n_dst, h * c) if self.concat else jnp.mean(out, axis=1)
        if self.lin_skip_weight is not None:
            x_r = _linear(x_dst, self.lin_skip_weight, self.lin_skip_bias)
            if self.lin_beta_weight is not None:
                b = jax.nn.sigmoid(_linear(jnp.concatenate([out, x_r, out - x_r], axis=-1), self.lin_beta_weight))
                out = b * x_r + (1.0 - b) * out
            else:
                out = out + x_r
        return _valid_or_nan(g, out)


for _cls in (GCNConv, GATv2Conv, TransformerConv):
    register_checkpoint_type(_cls, f"blocksparse.gnn.{_cls.__name__}")
