"""One graph partitioned over the devices of a mesh axis: SpMM and max / min aggregation in one ``shard_map``.

:func:`shard_graph` splits the *destination* nodes into contiguous ranges, one per device of the
axis, balanced by in-edges (``balance="edges"``) or of equal length (``balance="nodes"``). Every
in-edge of a node lives on the device that owns the node, so each device computes its rows of the
output completely, with no reduction across devices. Node features ``x`` are sharded by rows in
equal ranges (``R = ceil(N / devices)`` rows each, as ``NamedSharding(mesh, P(axis))`` lays out an
``(N, F)`` array), so a device's in-edges come in two kinds, held as two
:class:`~blocksparse.gnn.DynamicGraph` parts of one common padded capacity each:

- ``local``: the source is in the device's own rows of ``x``: computed at once, while
- ``remote``: the source is elsewhere: its features arrive by one collective, either every other
  device's rows of ``x`` (``sources="all_gather"``: an all-gather made of one collective permute per
  other device, so the table holds only other devices' rows) or an all-to-all that brings only the
  rows the device needs (``sources="exchange"``, a per-device list of needed source ids). With ``x``
  replicated (``sources="replicated"``) nothing moves.

The local part does not wait for the collective, so XLA can overlap the two. Outputs of an
edge-balanced split (unequal ranges) are moved to the equal row ranges of ``x``'s layout by one
more all-to-all of only the rows that change device; an equal split needs nothing. The result is
an ``(N, F)`` array sharded by rows like ``x``, so a layer's output is the next layer's input.

``balance=None`` / ``sources=None`` pick the candidate with the smallest estimated time (a
per-edge gather rate, the link rate, overlap of the local part with the collective; the rates of
:mod:`.tuned`: ``edge_bytes_per_s``, ``node_bytes_per_s`` and ``link_bytes_per_s``, the one
``bs.shard`` uses); the choice and every candidate's estimate are recorded in :attr:`ShardedGraph.plan`.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from .._util import Pytree, cdiv
from ..graph import DynamicGraph, Graph, default_chunk
from ..ops.gnn.aggregate import aggregate as _aggregate
from ..ops.gnn.spmm.api import accumulate as _spmm_into
from ..ops.gnn.spmm.api import inverse_degree_power
from . import _cuts, tuned

__all__ = ["GraphShardCandidate", "GraphShardPlan", "ShardedGraph", "aggregate", "plan_graph", "shard_graph", "spmm"]

_BALANCES = ("edges", "nodes")
_SOURCES = ("all_gather", "exchange", "replicated")


@dataclasses.dataclass(frozen=True)
class GraphShardCandidate:
    """One way of partitioning a graph, with its estimate per feature column (multiply by ``F``).

    Attributes:
        balance: ``"edges"`` (cut points balance the in-edges) or ``"nodes"`` (equal ranges: the
            output needs no move).
        sources: ``"all_gather"``, ``"exchange"`` or ``"replicated"``: how remote source rows arrive.
        cuts: ``devices + 1`` destination-node boundaries.
        edges_per_device: in-edges per device (local + remote).
        local_edges_per_device: in-edges whose source is in the device's own rows of ``x``.
        source_capacity: rows each device receives from each other device (``"exchange"``: the
            largest needed list, the all-to-all's slot; ``"all_gather"``: ``R``; else 0).
        output_capacity: rows each device sends each other to move the output to ``x``'s layout
            (0 when the ranges are equal).
        bytes_received: bytes each device receives per feature column (sources plus output).
        seconds: estimated time per feature column: per device, the local part overlapped with the
            sources' collective, then the remote part, then the output move; the slowest device.
    """

    balance: str
    sources: str
    cuts: tuple[int, ...]
    edges_per_device: tuple[int, ...]
    local_edges_per_device: tuple[int, ...]
    source_capacity: int
    output_capacity: int
    bytes_received: int
    seconds: float


@dataclasses.dataclass(frozen=True)
class GraphShardPlan:
    """How a graph is partitioned over a mesh axis (read-only, hashable; part of the pytree's static structure).

    Attributes:
        balance, sources, cuts, edges_per_device, local_edges_per_device, source_capacity,
            output_capacity: the chosen :class:`GraphShardCandidate`'s.
        rows_per_device: ``R = ceil(N / devices)``, the rows of ``x`` (and of the output) per device.
        estimated_bytes: bytes each device receives per feature column; :meth:`bytes_for`.
        estimated_seconds: the chosen candidate's time estimate per feature column; :meth:`seconds_for`.
        itemsize: the feature dtype's size the estimate assumed.
        candidates: every candidate considered, the chosen one among them.
    """

    balance: str
    sources: str
    cuts: tuple[int, ...]
    edges_per_device: tuple[int, ...]
    local_edges_per_device: tuple[int, ...]
    source_capacity: int
    output_capacity: int
    rows_per_device: int
    estimated_bytes: int
    estimated_seconds: float
    itemsize: int
    candidates: tuple[GraphShardCandidate, ...]

    @property
    def num_devices(self) -> int:
        return len(self.edges_per_device)

    @property
    def band(self) -> int:
        """The largest destination range (every device's output part is padded to it, at least 1)."""
        return _cuts.band(self.cuts)

    @property
    def uniform(self) -> bool:
        """Whether device ``d`` owns exactly rows ``[d R, (d + 1) R)`` (the output needs no move)."""
        return all(c == min(i * self.rows_per_device, self.cuts[-1]) for i, c in enumerate(self.cuts))

    def bytes_for(self, num_features: int) -> int:
        """The byte estimate for ``num_features`` feature columns."""
        return int(self.estimated_bytes) * int(num_features)

    def seconds_for(self, num_features: int) -> float:
        """The time estimate for ``num_features`` feature columns."""
        return float(self.estimated_seconds) * int(num_features)


class ShardedGraph(Pytree):
    """A graph whose destination nodes are partitioned over the devices of one mesh axis.

    Made by :func:`shard_graph`; :func:`spmm` and :func:`aggregate` (and ``bs.gnn.spmm`` /
    ``bs.gnn.aggregate``) take it. Leaves, each with a leading device axis sharded ``P(axis)``:
    ``local`` and ``remote`` (:class:`~blocksparse.gnn.DynamicGraph` parts: local destination ids;
    source ids are rows of the device's own ``x`` rows, or of the received table),
    ``local_edges`` / ``remote_edges`` (each part's edge ids in the caller's edge order, ``E`` for
    padding: for edge weights), ``send`` (``"exchange"``: the rows each device sends each other),
    ``out_send`` / ``out_take`` (an edge-balanced split: the output move), and the global
    ``in_degree`` / ``out_degree`` (``(devices * R,)``, for normalisations). Static: ``num_nodes``,
    ``num_edges``, the mesh, the axis name and the :class:`GraphShardPlan`.
    """

    __slots__ = (
        "local", "remote", "local_edges", "remote_edges", "send", "out_send", "out_take", "in_degree",
        "out_degree", "num_nodes", "num_edges", "mesh", "axis", "plan",
    )  # fmt: skip
    _leaves = (
        "local", "remote", "local_edges", "remote_edges", "send", "out_send", "out_take", "in_degree", "out_degree",
    )  # fmt: skip
    _static = ("num_nodes", "num_edges", "mesh", "axis", "plan")

    sources = property(lambda self: self.plan.sources)
    balance = property(lambda self: self.plan.balance)
    estimated_bytes = property(lambda self: self.plan.estimated_bytes)
    edges_per_device = property(lambda self: self.plan.edges_per_device)

    @property
    def feature_sharding(self) -> NamedSharding:
        """Where the ops expect node features: rows split over the axis (where the outputs are, so
        layers chain), or replicated for ``sources="replicated"``. ``jax.device_put(x, sg.feature_sharding)``."""
        return NamedSharding(self.mesh, P() if self.plan.sources == "replicated" else P(self.axis))

    def __repr__(self) -> str:
        return (
            f"ShardedGraph(num_nodes={self.num_nodes}, num_edges={self.num_edges}, axis={self.axis!r}, "
            f"balance={self.balance!r}, sources={self.sources!r}, edges_per_device={self.edges_per_device})"
        )


# ---------------------------------------------------------------------------------- planning (host)
def _host_edges(edges, num_nodes):
    """``(src, dst, num_nodes)`` as int64 NumPy arrays from a :class:`Graph` or an ``edge_index``."""
    if isinstance(edges, DynamicGraph):
        raise TypeError(
            "Expected a Graph or a host edge_index (2, E); got a DynamicGraph: its edges are traced, and the cut "
            "points and capacities must be known on the host. Pass the edge_index it was built from."
        )
    if isinstance(edges, Graph):
        if num_nodes is not None and int(num_nodes) != edges.num_nodes:
            raise ValueError(f"Expected num_nodes None or the graph's {edges.num_nodes}. Got {num_nodes}.")
        return edges.src.astype(np.int64), edges.dst.astype(np.int64), edges.num_nodes
    if isinstance(edges, jax.core.Tracer):
        raise TypeError("Expected a host edge_index (NumPy or a concrete array); got a traced one.")
    ei = np.asarray(edges)
    if ei.ndim != 2 or ei.shape[0] != 2:
        raise ValueError(f"Expected edge_index of shape (2, num_edges). Got shape {ei.shape}.")
    if ei.size and not np.issubdtype(ei.dtype, np.integer):
        raise TypeError(f"Expected edge_index of an integer dtype. Got {ei.dtype}.")
    if num_nodes is None:
        raise ValueError("Expected num_nodes (an int) with an edge_index. Got None.")
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int | np.integer) or num_nodes < 1:
        raise ValueError(f"Expected num_nodes as a positive int. Got {num_nodes!r}.")
    ei = ei.astype(np.int64)
    bad = np.argwhere((ei < 0) | (ei >= num_nodes))
    if bad.size:
        r, c = (int(v) for v in bad[0])
        raise ValueError(
            f"Expected node indices in [0, {num_nodes}). Got edge_index[{r}, {c}] = {int(ei[r, c])} "
            f"({len(bad)} out of range)."
        )
    return ei[0], ei[1], int(num_nodes)


def _needed(src, dev, remote, parts, rows):
    """Per device, a mask over the ``parts * rows`` source rows it needs from other devices."""
    masks = []
    for d in range(parts):
        mark = np.zeros(parts * rows, bool)
        mark[src[remote & (dev == d)]] = True
        masks.append(mark)
    return masks


def _output_pieces(cuts, parts, rows, n):
    """``pieces[d][o]``: the global rows device ``d`` computes that device ``o`` holds in ``x``'s layout."""
    return [[(max(cuts[d], o * rows), min(cuts[d + 1], (o + 1) * rows, n)) for o in range(parts)] for d in range(parts)]


def _candidate(balance, sources, cuts, src, dst, n, parts, rows, itemsize, needed_cache,
               rates: tuned.Rates) -> GraphShardCandidate:  # fmt: skip
    dev = _cuts.owner(dst, cuts)
    local = (src // rows) == dev
    per_dev = np.bincount(dev, minlength=parts)
    local_dev = np.bincount(dev[local], minlength=parts)
    if sources == "exchange":
        if cuts not in needed_cache:
            masks = _needed(src, dev, ~local, parts, rows)
            needed_cache[cuts] = max(
                [1] + [int(c) for m in masks for c in np.bincount(np.flatnonzero(m) // rows, minlength=parts)]
            )
        src_cap = needed_cache[cuts]
        in_bytes = (parts - 1) * src_cap * itemsize
        table = parts * src_cap
    elif sources == "all_gather":
        src_cap, in_bytes, table = rows, (parts - 1) * rows * itemsize, (parts - 1) * rows
    else:
        src_cap, in_bytes, table = 0, 0, parts * rows
    uniform = all(c == min(i * rows, n) for i, c in enumerate(cuts))
    out_cap = 0
    if not uniform:
        pieces = _output_pieces(cuts, parts, rows, n)
        out_cap = max(1, max(max(0, b - a) for d in range(parts) for o, (a, b) in enumerate(pieces[d]) if o != d))
    out_bytes = (parts - 1) * out_cap * itemsize
    band = _cuts.band(cuts)
    edge_s = itemsize / rates.edge_bytes_per_s.value
    # Rows written and read outside the edge loops: both parts' outputs (their node counts) and their
    # sum; the own rows padded to the band; the output move (a gather of the band).
    passes = max(band, rows) + max(band, table) + 3 * band
    passes += (2 * rows if band > rows else 0) + (3 * band if out_cap else 0)
    nodes_s = passes * itemsize / rates.node_bytes_per_s.value
    per_device = [
        max(int(local_dev[d]) * edge_s, _cuts.link_seconds(in_bytes, rates)) + int(per_dev[d] - local_dev[d]) * edge_s
        for d in range(parts)
    ]
    seconds = max(per_device) + nodes_s + _cuts.link_seconds(out_bytes, rates)
    return GraphShardCandidate(
        balance, sources, tuple(int(c) for c in cuts), tuple(int(c) for c in per_dev),
        tuple(int(c) for c in local_dev), int(src_cap), int(out_cap), int(in_bytes + out_bytes), float(seconds),
    )  # fmt: skip


def _padded(lists, fill, capacity):
    """``(parts, capacity)`` int32 from per-device int arrays, padded with ``fill``."""
    out = np.full((len(lists), capacity), fill, np.int64)
    for d, a in enumerate(lists):
        out[d, : a.size] = a
    return out.astype(np.int32)


def _capacity(num_nodes, ids, chunk):
    """``(max_edges, chunk)`` of one part: the largest device's edges, but at least one chunk (a part
    with no room for extra units would hold zero-size arrays, which XLA's CPU compiler cannot take as
    ``shard_map`` inputs under differentiation)."""
    cap = max(a.size for a in ids)
    chunk = default_chunk(num_nodes, max(cap, 1)) if chunk is None else int(chunk)
    return max(cap, chunk), chunk


@functools.lru_cache(maxsize=64)
def _builder(num_nodes, max_edges, chunk, mesh, axis):
    """The jitted ``shard_map`` that builds every device's part (one compilation per capacities)."""

    def build(s, d, c):
        g = DynamicGraph.from_edge_index(
            jnp.stack([s[0], d[0]]), num_nodes=num_nodes, max_edges=max_edges, num_edges=c[0], chunk=chunk
        )
        return jax.tree.map(lambda a: a[None], g)

    spec = P(axis)
    return jax.jit(jax.shard_map(build, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec))


def _build_parts(srcs, dsts, num_nodes, max_edges, mesh, axis, chunk):
    """One :class:`DynamicGraph` per device, built on its device, as one pytree with a leading device axis."""
    counts = np.asarray([s.size for s in srcs], np.int32)
    put = lambda a: jax.device_put(a, NamedSharding(mesh, P(axis)))  # noqa: E731
    f = _builder(num_nodes, max_edges, chunk, mesh, axis)
    return f(put(_padded(srcs, 0, max_edges)), put(_padded(dsts, 0, max_edges)), put(counts))


def plan_graph(
    edges,
    num_nodes: int | None,
    num_devices: int,
    *,
    balance: str | None = None,
    sources: str | None = None,
    x_placement: str = "sharded",
    dtype=jnp.float32,
) -> GraphShardPlan:
    """The :class:`GraphShardPlan` :func:`shard_graph` would use over ``num_devices`` devices (host only).

    Arguments are :func:`shard_graph`'s; nothing is placed on a device.
    """
    src, dst, n = _host_edges(edges, num_nodes)
    return _plan(src, dst, n, num_devices, balance, sources, x_placement, dtype)


def _plan(src, dst, n, parts, balance, sources, x_placement, dtype) -> GraphShardPlan:
    if isinstance(parts, bool) or not isinstance(parts, int | np.integer) or parts < 1:
        raise ValueError(f"Expected num_devices as a positive int. Got {parts!r}.")
    if balance not in (None, *_BALANCES):
        raise ValueError(f"Expected balance 'edges', 'nodes' or None. Got {balance!r}.")
    if sources not in (None, *_SOURCES):
        raise ValueError(f"Expected sources 'all_gather', 'exchange', 'replicated' or None. Got {sources!r}.")
    if x_placement not in ("sharded", "replicated"):
        raise ValueError(f"Expected x_placement 'sharded' or 'replicated'. Got {x_placement!r}.")
    if n >= 2**31 - 1 or src.size >= 2**31 - 1:
        raise ValueError(f"Expected fewer than 2**31 - 1 nodes and edges. Got {n} nodes, {src.size} edges.")
    parts = int(parts)
    itemsize = jnp.dtype(dtype).itemsize
    rows = cdiv(n, parts)
    cuts_of = {
        "edges": tuple(int(c) for c in _cuts.balanced_cuts(np.bincount(dst, minlength=n), parts)),
        "nodes": tuple(min(i * rows, n) for i in range(parts + 1)),
    }
    if sources is None:
        allowed_sources = ("replicated",) if x_placement == "replicated" else ("all_gather", "exchange")
    else:
        allowed_sources = (sources,)
    cache: dict = {}
    rates = tuned.rates()
    candidates = tuple(
        _candidate(b, s, cuts_of[b], src, dst, n, parts, rows, itemsize, cache, rates)
        for b in _BALANCES
        if balance in (None, b)
        for s in _SOURCES
        if s in allowed_sources
    )
    chosen = _cuts.fastest(candidates)  # ties: edges first, then all_gather
    return GraphShardPlan(
        chosen.balance, chosen.sources, chosen.cuts, chosen.edges_per_device, chosen.local_edges_per_device,
        chosen.source_capacity, chosen.output_capacity, rows, chosen.bytes_received, chosen.seconds, itemsize,
        candidates,
    )  # fmt: skip


def shard_graph(
    edges,
    num_nodes: int | None,
    mesh: Mesh,
    axis: str,
    *,
    balance: str | None = None,
    sources: str | None = None,
    x_placement: str = "sharded",
    dtype=jnp.float32,
    chunk: int | None = None,
) -> ShardedGraph:
    """Partition a graph's destination nodes over the devices of ``mesh``'s axis ``axis``.

    Arguments:
        edges: a :class:`~blocksparse.gnn.Graph` or a host ``edge_index`` ``(2, E)`` (row 0 sources,
            row 1 destinations; messages flow ``src -> dst``). Host data: the cut points and the
            capacities are planned here, once.
        num_nodes: the number of nodes (``None`` for a ``Graph``: its own).
        mesh, axis: the mesh and the name of the axis whose devices share the nodes.
        balance: ``"edges"`` (contiguous destination ranges with about ``E / devices`` in-edges
            each), ``"nodes"`` (ranges of ``R = ceil(N / devices)`` nodes, the layout of ``x``: the
            output needs no move) or ``None`` (the faster by the estimate).
        sources: how each device gets the features of remote sources: ``"all_gather"`` (all of
            ``x``), ``"exchange"`` (only the rows it needs, one all-to-all), ``"replicated"`` (``x``
            is replicated: nothing moves) or ``None`` (by the estimate; ``"replicated"`` if
            ``x_placement="replicated"``).
        x_placement: ``"sharded"`` (``x`` split by rows over the axis, the default) or
            ``"replicated"``, for the choice only: any placement works inside ``jit``.
        dtype: the feature dtype the byte estimate assumes.
        chunk: the parts' heavy-node chunk (see :meth:`DynamicGraph.from_edge_index`).

    Returns:
        A :class:`ShardedGraph`; ``sg.plan`` says what was chosen and why (:func:`plan_graph`
        gives the plan alone).

    Example::

        >>> import jax, numpy as np, blocksparse as bs
        >>> from blocksparse.gnn import shard_graph
        >>> mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("d",))
        >>> sg = shard_graph(np.array([[0, 1, 2], [1, 2, 2]]), 3, mesh, "d")
        >>> sg.plan.edges_per_device, sg.plan.sources
        ((3,), 'all_gather')
        >>> bs.gnn.spmm(sg, np.ones((3, 1), np.float32)).ravel().tolist()  # one device: no collective
        [0.0, 1.0, 2.0]
    """
    src, dst, n = _host_edges(edges, num_nodes)
    parts = _cuts.mesh_axis_size(mesh, axis)
    plan = _plan(src, dst, n, parts, balance, sources, x_placement, dtype)
    return _materialise(src, dst, n, mesh, axis, plan, chunk)


def _materialise(src, dst, n, mesh, axis, plan: GraphShardPlan, chunk) -> ShardedGraph:
    parts, rows, cuts, band = plan.num_devices, plan.rows_per_device, plan.cuts, plan.band
    e = src.size
    dev = _cuts.owner(dst, cuts)
    owner = src // rows
    local = owner == dev
    # Edges grouped by (device, remote?), keeping the caller's order within a group.
    key = (2 * dev + ~local).astype(np.uint16)
    order = np.argsort(key, kind="stable")
    bounds = np.searchsorted(key[order], np.arange(2 * parts + 1))
    groups = [order[bounds[i] : bounds[i + 1]] for i in range(2 * parts)]
    local_ids, remote_ids = groups[0::2], groups[1::2]
    start = np.asarray(cuts[:-1], np.int64)

    send = None
    if plan.sources == "exchange":
        cap = plan.source_capacity
        masks = _needed(src, dev, ~local, parts, rows)
        position = np.zeros((parts, parts * rows), np.int64)  # table row of each needed source, per device
        send_np = np.full((parts, parts, cap), rows, np.int64)  # [sender, receiver, slot] -> sender's row
        for d, mark in enumerate(masks):
            need = np.flatnonzero(mark)
            own = need // rows
            rank = np.arange(need.size) - np.searchsorted(own, own)  # rank among the ids of the same owner
            position[d, need] = own * cap + rank
            send_np[own, d, rank] = need - own * rows
        send = send_np.astype(np.int32)
        remote_src = [position[d, src[ids]] for d, ids in enumerate(remote_ids)]
    elif plan.sources == "all_gather":  # the table: the rows of devices d - 1, d - 2, ... (one permute each)
        remote_src = []
        for d, ids in enumerate(remote_ids):
            o = src[ids] // rows
            remote_src.append(((d - o) % parts - 1) * rows + src[ids] - o * rows)
    else:  # replicated: the table is x itself (padded to parts * rows)
        remote_src = [src[ids] for ids in remote_ids]
    local_src = [src[ids] - d * rows for d, ids in enumerate(local_ids)]
    local_dst = [dst[ids] - start[d] for d, ids in enumerate(local_ids)]
    remote_dst = [dst[ids] - start[d] for d, ids in enumerate(remote_ids)]

    table = {"exchange": parts * plan.source_capacity, "all_gather": (parts - 1) * rows}.get(plan.sources, parts * rows)
    n_l, n_r = max(band, rows), max(band, table)
    (cap_l, chunk_l), (cap_r, chunk_r) = (_capacity(n_l, local_ids, chunk), _capacity(n_r, remote_ids, chunk))
    g_local = _build_parts(local_src, local_dst, n_l, cap_l, mesh, axis, chunk_l)
    g_remote = _build_parts(remote_src, remote_dst, n_r, cap_r, mesh, axis, chunk_r)

    out_send = out_take = None
    if not plan.uniform:
        cap = plan.output_capacity
        pieces = _output_pieces(cuts, parts, rows, n)
        out_send_np = np.full((parts, parts, cap), band, np.int64)  # [sender, receiver, slot] -> sender's row
        take = np.full((parts, rows), parts * cap + band, np.int64)  # into [received ; own rows ; zero row]
        for o in range(parts):
            for d in range(parts):
                a, b = pieces[d][o]
                if b <= a:
                    continue
                g = np.arange(a, b)
                if d == o:
                    take[o, g - o * rows] = parts * cap + (g - cuts[o])
                else:
                    out_send_np[d, o, : b - a] = g - cuts[d]
                    take[o, g - o * rows] = d * cap + np.arange(b - a)
        out_send, out_take = out_send_np.astype(np.int32), take.astype(np.int32)

    in_deg = np.zeros(parts * rows, np.int32)
    in_deg[:n] = np.bincount(dst, minlength=n)
    out_deg = np.zeros(parts * rows, np.int32)
    out_deg[:n] = np.bincount(src, minlength=n)
    sharding = NamedSharding(mesh, P(axis))
    put = lambda a: None if a is None else jax.device_put(a, sharding)  # noqa: E731
    return ShardedGraph._from_fields(
        local=g_local, remote=g_remote, local_edges=put(_padded(local_ids, e, cap_l)),
        remote_edges=put(_padded(remote_ids, e, cap_r)), send=put(send), out_send=put(out_send),
        out_take=put(out_take), in_degree=put(in_deg), out_degree=put(out_deg), num_nodes=n, num_edges=e,
        mesh=mesh, axis=axis, plan=plan,
    )  # fmt: skip


# ---------------------------------------------------------------------------------- the ops
def _take(a, idx):
    """``a[idx]`` with rows for ``idx >= len(a)`` zero (one fused gather, no padded copy of ``a``)."""
    n = a.shape[0]
    return jnp.where((idx < n)[:, None], a[jnp.clip(idx, 0, n - 1)], jnp.zeros((), a.dtype))


def _exchange(rows_, send, axis):
    """``rows_ (R, F)`` and ``send (devices, C)`` (this device's rows for each receiver, ``R`` for
    padding) -> ``(devices * C, F)``: slot ``o`` holds what device ``o`` sent this one."""
    return lax.all_to_all(_take(rows_, send.reshape(-1)), axis, 0, 0, tiled=True)


def _others(xl, axis, parts):
    """The rows of devices ``d - 1, d - 2, ..., d - parts + 1`` on device ``d`` (one permute each; none for
    one device)."""
    if parts == 1:
        return xl[:0]
    chunks = [lax.ppermute(xl, axis, [(j, (j + k) % parts) for j in range(parts)]) for k in range(1, parts)]
    return chunks[0] if len(chunks) == 1 else jnp.concatenate(chunks)


def _max_combine(a, b, has_a, has_b, is_max):
    """Element-wise max / min of two partial aggregations, each 0 where its part has no in-edge; NaN wins."""
    better = (a >= b) if is_max else (a <= b)
    pick = jnp.isnan(a) | better
    both = jnp.where(pick, a, b)
    return jnp.where(has_a & has_b, both, jnp.where(has_a, a, b))


def _run(sg: ShardedGraph, x2, op, weights, *, skip_collectives: bool = False):
    """``op`` over both parts of every device inside one ``shard_map``: ``x2 (devices * R, F)`` -> same shape.

    ``op(g_local, x_local, w_local, g_remote, table, w_remote) -> (band, F)``. With
    ``skip_collectives`` (benchmarks only: the result is wrong) the collectives are replaced by local
    stand-ins of the same shapes, to time the local work alone.
    """
    plan, axis, mesh = sg.plan, sg.axis, sg.mesh
    parts, rows, band = plan.num_devices, plan.rows_per_device, plan.band
    replicated = plan.sources == "replicated"
    spec = P(axis)

    def body(g_local, g_remote, xl, send, out_send, out_take, wl, wr):
        first = lambda t: jax.tree.map(lambda a: a[0], t)  # noqa: E731
        g_local, g_remote = first(g_local), first(g_remote)
        if replicated:
            own = lax.dynamic_slice_in_dim(xl, lax.axis_index(axis) * rows, rows)
            table = lax.pcast(xl, axis, to="varying")  # the ops' custom VJPs expect per-device inputs
        else:
            own = xl
            if parts == 1:  # every source is among the device's own rows: no collective
                table = xl[:0]
            elif plan.sources == "all_gather":
                table = jnp.tile(xl, (parts - 1, 1)) if skip_collectives else _others(xl, axis, parts)
            else:
                s = send[0]
                table = jnp.tile(xl[: s.shape[1]], (parts, 1)) if skip_collectives else _exchange(xl, s, axis)
        pad = lambda a, m: jnp.pad(a, ((0, m - a.shape[0]), (0, 0)))  # noqa: E731
        y = op(
            g_local, pad(own, g_local.num_nodes), None if wl is None else wl[0],
            g_remote, pad(table, g_remote.num_nodes), None if wr is None else wr[0],
        )  # fmt: skip
        if out_take is None:
            return y[:rows] if band >= rows else pad(y, rows)
        s, take = out_send[0], out_take[0]
        recv = jnp.tile(y[: s.shape[1]], (parts, 1)) if skip_collectives else _exchange(y, s, axis)
        k = recv.shape[0]  # take indexes [received ; own rows ; zero]
        return jnp.where((take < k)[:, None], _take(recv, take), _take(y, take - k))

    args = (sg.local, sg.remote, x2, sg.send, sg.out_send, sg.out_take, *weights)
    specs = tuple(P() if (i == 2 and replicated) else spec for i in range(len(args)))
    # No axis-type checks: the GNN Pallas kernels' outputs carry no manual-axis type (Pallas requires
    # one under check_vma), and collectives and gradients are written out here, not inferred.
    f = jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=spec, check_vma=False)
    return f(*args)


def _features(sg: ShardedGraph, x):
    if not isinstance(sg, ShardedGraph):
        raise TypeError(f"Expected a ShardedGraph (from shard_graph). Got {type(sg).__name__}.")
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"Expected floating-point features. Got {x.dtype}.")
    if x.ndim < 1 or x.shape[0] != sg.num_nodes:
        raise ValueError(f"Expected features with {sg.num_nodes} rows (one per node). Got shape {x.shape}.")
    shape = x.shape
    x2 = x.reshape(shape[0], math.prod(shape[1:]))
    total = sg.plan.num_devices * sg.plan.rows_per_device
    return shape, jnp.pad(x2, ((0, total - shape[0]), (0, 0)))


def _edge_weights(sg: ShardedGraph, edge_weight):
    w = jnp.asarray(edge_weight)
    if w.shape != (sg.num_edges,):
        raise ValueError(f"Expected edge_weight of shape ({sg.num_edges},), one per edge. Got {w.shape}.")
    if not jnp.issubdtype(w.dtype, jnp.floating):
        raise TypeError(f"Expected floating-point edge_weight. Got {w.dtype}.")
    wz = jnp.concatenate([w, jnp.zeros((1,), w.dtype)])
    return wz[sg.local_edges], wz[sg.remote_edges]


def _output(sg: ShardedGraph, out, shape):
    """The first ``N`` of the ``devices * R`` rows; where they are unless ``N`` is not a multiple of the
    devices (JAX arrays are sharded evenly: XLA then places the result as it likes, say replicated)."""
    out = out[: sg.num_nodes].reshape(shape)
    if sg.num_nodes % sg.plan.num_devices:
        return out
    return lax.with_sharding_constraint(out, NamedSharding(sg.mesh, P(sg.axis)))


def spmm(
    sg: ShardedGraph,
    x: jax.Array,
    reduce: str = "sum",
    norm: str | None = None,
    edge_weight: jax.Array | None = None,
    *,
    implementation=None,
    _skip_collectives: bool = False,
) -> jax.Array:
    """:func:`blocksparse.gnn.spmm` over a :class:`ShardedGraph`: the same result, rows computed per device.

    Arguments are those of :func:`blocksparse.gnn.spmm`: ``x`` ``(N, ...)`` global (any placement;
    inside ``jit`` it is resharded by rows over the axis, or replicated for ``sources="replicated"``),
    ``edge_weight`` ``(E,)`` in the order of the edges given to :func:`shard_graph`. Degrees for
    ``norm`` / ``"mean"`` are the whole graph's.

    Returns:
        ``(N, ...)`` in ``x``'s dtype, sharded by rows over the axis (if ``N`` is a multiple of the
        devices; else placed by XLA). Differentiable w.r.t. ``x`` and ``edge_weight``, with the
        single-device gradients.
    """
    if reduce not in ("sum", "mean"):
        raise ValueError(f"Expected reduce in ['sum', 'mean']. Got {reduce!r}.")
    if norm not in (None, "left", "right", "both"):
        raise ValueError(f"Expected norm in [None, 'left', 'right', 'both']. Got {norm!r}.")
    if reduce == "mean" and norm is not None:
        raise ValueError(
            f"Expected norm=None with reduce='mean'. Got norm={norm!r}: 'mean' already divides by the in-degree; "
            "use reduce='sum' with a norm instead."
        )
    shape, x2 = _features(sg, x)
    weights = (None, None) if edge_weight is None else _edge_weights(sg, edge_weight)
    if norm in ("left", "both"):
        x2 = (x2 * inverse_degree_power(sg.out_degree, 1.0 if norm == "left" else 0.5)[:, None]).astype(x2.dtype)
    band = sg.plan.band

    def op(gl, xl, wl, gr, xr, wr):
        # The parts were checked on the host (no validity pass); the remote part's kernel adds the local
        # part's rows to its own (no separate sum over the output), and runs after the sources arrive.
        a = _spmm_into(gl, xl, edge_weight=wl, implementation=implementation)[:band]
        a = jnp.pad(a, ((0, gr.num_nodes - band), (0, 0)))
        return _spmm_into(gr, xr, a, edge_weight=wr, implementation=implementation)[:band]

    out = _run(sg, x2, op, weights, skip_collectives=_skip_collectives)
    post = {"both": 0.5, "right": 1.0}.get(norm, 1.0 if reduce == "mean" else None)
    if post is not None:
        out = (out * inverse_degree_power(sg.in_degree, post)[:, None]).astype(x2.dtype)
    return _output(sg, out, shape)


def aggregate(
    sg: ShardedGraph, x: jax.Array, reduce: str = "max", *, implementation=None, _skip_collectives: bool = False
) -> jax.Array:
    """:func:`blocksparse.gnn.aggregate` (max / min over in-neighbours) over a :class:`ShardedGraph`.

    Returns ``(N, ...)`` sharded by rows over the axis; nodes without in-edges get 0, NaN
    propagates. The gradient goes to the arg-max / arg-min source as on one device; between equal
    values from a source in the device's own rows of ``x`` and one elsewhere it goes to the own one.
    """
    if reduce not in ("max", "min"):
        raise ValueError(f"Expected reduce in ['max', 'min']. Got {reduce!r}.")
    shape, x2 = _features(sg, x)
    band = sg.plan.band

    def op(gl, xl, _, gr, xr, __):
        a = _aggregate(gl, xl, reduce, implementation=implementation)[:band]
        b = _aggregate(gr, xr, reduce, implementation=implementation)[:band]
        has = lambda g: (g.in_degree[:band] > 0)[:, None]  # noqa: E731
        return _max_combine(a, b, has(gl), has(gr), reduce == "max")

    out = _run(sg, x2, op, (None, None), skip_collectives=_skip_collectives)
    return _output(sg, out, shape)


# bs.gnn.spmm / bs.gnn.aggregate hand a sharded graph to this module's ops.
ShardedGraph._gnn_spmm = staticmethod(spmm)
ShardedGraph._gnn_aggregate = staticmethod(aggregate)
