"""Traced graphs: :class:`DynamicGraph`, built inside ``jit`` with static capacities, and batching.

A :class:`DynamicGraph` holds the same structure as a :class:`~blocksparse.gnn.Graph` (CSR by
destination, its transpose, degrees, the degree-aware schedule) as *traced* arrays of fixed shapes:
only ``num_nodes``, ``max_edges`` and ``chunk`` are static, so graphs of the same capacities share
one compilation (a new mini-batch every step, without recompiling).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

from .._util import Pytree, cdiv, runtime_checks_enabled
from ._common import CHUNK_ALIGN, check_features

__all__ = ["DeviceSchedule", "DynamicGraph", "batch", "default_chunk", "readout"]


def _concrete(a) -> bool:
    return not isinstance(a, jax.core.Tracer)


class DeviceSchedule(Pytree):
    """One CSR of a :class:`DynamicGraph` and its degree-aware schedule, as traced fixed-shape arrays.

    The fields mirror :class:`~blocksparse.graph.Schedule` (plus the CSR itself) so the
    kernels read both alike. ``X = max_edges // chunk`` is the static capacity of extra units (a
    node of in-degree ``d > chunk`` takes ``ceil(d / chunk) - 1 <= d / chunk`` of them) and of
    heavy nodes.

    Attributes:
        indptr: ``(N + 1,)`` CSR offsets (padding edges lie past ``indptr[N]``).
        indices: ``(E,)`` the other end of each CSR position (0 for padding).
        segment: ``(E,)`` the node owning each CSR position, ``N`` for padding (segment ops drop it).
        edge_perm: ``(E,)`` the edge id (position in ``edge_index``) of each CSR position.
        main_end: ``(N,)`` end of each node's own unit (``indptr[i] + chunk`` for a heavy node).
        extra_start, extra_end, extra_node: ``(X,)`` extra units (unused ones: empty, node 0).
        heavy_nodes: ``(X,)`` heavy nodes, ascending; unused slots hold ``N + slot`` (out of range, distinct).
        extra_segment: ``(X,)`` slot of each extra unit's node in ``heavy_nodes``; ``X`` if unused.
    """

    __slots__ = (
        "indptr", "indices", "segment", "edge_perm", "main_end",
        "extra_start", "extra_end", "extra_node", "heavy_nodes", "extra_segment",
    )  # fmt: skip
    _leaves = __slots__

    @property
    def num_extra(self) -> int:
        """The static capacity of extra units (the kernels' grid size for them)."""
        return int(self.extra_start.shape[0])


def _schedule(indptr, degree, chunk: int, cap: int):
    """The degree-aware schedule on the device: main units and at most ``cap`` extra units."""
    n = degree.shape[0]
    heavy = degree > chunk
    main_end = jnp.where(heavy, indptr[:-1] + chunk, indptr[1:])
    if cap == 0 or n == 0:
        empty = jnp.zeros((0,), jnp.int32)
        return main_end, empty, empty, empty, empty, empty
    counts = jnp.where(heavy, (degree + chunk - 1) // chunk - 1, 0)
    cum = jnp.cumsum(counts)
    u = jnp.arange(cap, dtype=jnp.int32)
    used = u < cum[-1]
    node = jnp.minimum(jnp.searchsorted(cum, u, side="right"), n - 1).astype(jnp.int32)
    k = u - (cum[node] - counts[node]) + 1  # chunk index within the node (chunk 0 is the main unit)
    start = indptr[node] + k * chunk
    end = jnp.minimum(indptr[node + 1], start + chunk)
    rank = jnp.cumsum(heavy.astype(jnp.int32)) - 1
    (hn,) = jnp.nonzero(heavy, size=cap, fill_value=0)
    heavy_nodes = jnp.where(u < jnp.sum(heavy), hn, n + u).astype(jnp.int32)
    zero = jnp.zeros((), jnp.int32)
    return (
        main_end.astype(jnp.int32),
        jnp.where(used, start, zero).astype(jnp.int32),
        jnp.where(used, end, zero).astype(jnp.int32),
        jnp.where(used, node, zero),
        heavy_nodes,
        jnp.where(used, rank[node], cap).astype(jnp.int32),
    )


def _csr(order, owner, other, num_nodes: int, chunk: int, cap: int) -> tuple[DeviceSchedule, jax.Array]:
    """CSR over ``owner`` (sorted by ``order``); padding has ``owner == num_nodes``. Returns it and the degrees."""
    seg = owner[order]
    degree = jax.ops.segment_sum(jnp.ones_like(owner), owner, num_nodes).astype(jnp.int32)
    indptr = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(degree, dtype=jnp.int32)])
    sched = _schedule(indptr, degree, chunk, cap)
    return DeviceSchedule._from_fields(
        **dict(zip(DeviceSchedule._leaves, (indptr, other[order], seg, order.astype(jnp.int32), *sched), strict=True))
    ), degree


def default_chunk(num_nodes: int, max_edges: int) -> int:
    """About 8 times the mean in-degree at capacity, a multiple of 128, in ``[128, 2048]``."""
    mean = max_edges / max(num_nodes, 1)
    return CHUNK_ALIGN * min(16, max(1, cdiv(int(np.ceil(8 * mean)), CHUNK_ALIGN)))


class DynamicGraph(Pytree):
    """A graph whose edges are traced arrays: built inside ``jit``, any edges, one compilation per capacity.

    Build with :meth:`from_edge_index` (or :func:`batch`). Every op that takes a
    :class:`~blocksparse.gnn.Graph` takes a ``DynamicGraph`` too, forward and backward, on every
    implementation. Messages flow ``src -> dst``.

    Static (part of the ``jit`` cache key): ``num_nodes`` (node capacity: the feature arrays'
    leading dimension), ``max_edges`` (edge capacity), ``chunk`` (heavy-node threshold and chunk
    length). Everything else is a leaf.

    Attributes:
        src, dst: ``(max_edges,)`` int32, the edges in the caller's order; padding (positions
            ``>= num_edges``) and invalid edges read 0 and are masked by ``edge_mask``.
        edge_mask: ``(max_edges,)`` bool, the edges that count.
        num_edges: int32 scalar; ``-1`` if the given count was outside ``[0, max_edges]``.
        valid: bool scalar: ``num_edges`` in range and every counted edge's node ids in
            ``[0, num_nodes)``. Ops return NaN (and NaN gradients) on an invalid graph.
        in_degree, out_degree: ``(num_nodes,)`` int32 edge counts.
        csr, csr_t: :class:`DeviceSchedule` of the CSR by destination and by source (the
            transpose, for backward passes). Within a node, CSR positions are sorted by the other
            endpoint (with ``canonical=True``, the default), so the structure (and every result)
            does not depend on the edges' order.
    """

    __slots__ = (
        "src", "dst", "edge_mask", "num_edges", "valid", "in_degree", "out_degree", "csr", "csr_t",
        "num_nodes", "max_edges", "chunk",
    )  # fmt: skip
    _leaves = ("src", "dst", "edge_mask", "num_edges", "valid", "in_degree", "out_degree", "csr", "csr_t")
    _static = ("num_nodes", "max_edges", "chunk")

    @classmethod
    def from_edge_index(
        cls,
        edge_index,
        *,
        num_nodes: int,
        max_edges: int | None = None,
        num_edges=None,
        chunk: int | None = None,
        canonical: bool = True,
    ) -> DynamicGraph:
        """Build the graph on the device from ``edge_index`` ``(2, E)`` (row 0 sources, row 1 destinations).

        Usable inside ``jit``: ``edge_index`` and ``num_edges`` may be traced. Edges at positions
        ``>= num_edges`` are padding and never contribute.

        Arguments:
            edge_index: ``(2, E)`` integer array (PyG convention), ``E <= max_edges``.
            num_nodes: node capacity (static): features have this many rows.
            max_edges: edge capacity (static), default ``E``; ``edge_index`` is padded to it.
            num_edges: how many leading edges count (an int or a traced int scalar); default ``E``.
            chunk: heavy-node threshold and chunk length (static, a multiple of 128): a node of
                in-degree ``> chunk`` is split into units of ``chunk`` in-edges processed in parallel.
                Default :func:`default_chunk` (about 8 times the mean in-degree).
            canonical: sort each node's in-edges by source (and out-edges by destination), so the
                structure and every result are independent of the edges' order (three stable
                sorts). ``False``: keep the given order within each node, as a :class:`Graph` does
                (two sorts; sums may then round differently, and max / min ties go to the first
                in-edge in the given order).

        Returns:
            A :class:`DynamicGraph`. Node ids outside ``[0, num_nodes)`` among the counted edges,
            or ``num_edges`` outside ``[0, E]``, make it invalid (``valid`` False: every op gives
            NaN, and under :func:`blocksparse.checkify` an error naming the valid ranges); on the
            host (concrete inputs) they raise a ``ValueError`` here.

        Example::

            g = DynamicGraph.from_edge_index(jnp.array([[0, 1, 2], [1, 2, 2]]), num_nodes=4, max_edges=8)
        """
        if isinstance(num_nodes, bool) or not isinstance(num_nodes, int | np.integer) or num_nodes < 0:
            raise TypeError(f"Expected num_nodes as a non-negative int (static). Got {num_nodes!r}.")
        num_nodes = int(num_nodes)
        if num_nodes >= 2**31 - 1:
            raise ValueError(f"Expected num_nodes < 2**31 - 1. Got {num_nodes}.")
        shape, dtype = np.shape(edge_index), getattr(edge_index, "dtype", None)
        if dtype is None:
            edge_index = np.asarray(edge_index)
            dtype = edge_index.dtype if edge_index.size else np.dtype(np.int32)
        if len(shape) != 2 or shape[0] != 2:
            raise ValueError(f"Expected edge_index of shape (2, num_edges). Got shape {tuple(shape)}.")
        if not np.issubdtype(dtype, np.integer):
            raise TypeError(f"Expected edge_index of an integer dtype. Got {np.dtype(dtype)}.")
        e = int(shape[1])
        max_edges = e if max_edges is None else max_edges
        if isinstance(max_edges, bool) or not isinstance(max_edges, int | np.integer) or max_edges < 0:
            raise TypeError(f"Expected max_edges as a non-negative int (static). Got {max_edges!r}.")
        max_edges = int(max_edges)
        if e > max_edges:
            raise ValueError(f"Expected at most max_edges={max_edges} edges. Got edge_index with {e}.")
        if max_edges >= 2**31 - 1:
            raise ValueError(f"Expected max_edges < 2**31 - 1. Got {max_edges}.")
        chunk = default_chunk(num_nodes, max_edges) if chunk is None else chunk
        if isinstance(chunk, bool) or not isinstance(chunk, int | np.integer) or chunk <= 0 or chunk % CHUNK_ALIGN:
            raise ValueError(f"Expected chunk as a positive multiple of {CHUNK_ALIGN}. Got {chunk!r}.")
        chunk = int(chunk)

        # Host checks where the data is concrete: a clear error now instead of NaN later.
        if num_edges is None:
            num_edges = e
        if _concrete(num_edges):
            host = np.asarray(num_edges)
            if host.shape != () or not np.issubdtype(host.dtype, np.integer):
                raise TypeError(f"Expected num_edges as an integer scalar. Got shape {host.shape}, dtype {host.dtype}.")
            if not 0 <= int(host) <= e:
                raise ValueError(
                    f"Expected num_edges in [0, {e}] (the edges given; max_edges={max_edges}). Got {int(host)}."
                )
            if _concrete(edge_index) and e:
                ei = np.asarray(edge_index)[:, : int(host)].astype(np.int64)
                bad = np.argwhere((ei < 0) | (ei >= num_nodes))
                if bad.size:
                    r, c = (int(v) for v in bad[0])
                    raise ValueError(
                        f"Expected node indices in [0, {num_nodes}). Got edge_index[{r}, {c}] = {int(ei[r, c])} "
                        f"({len(bad)} out of range)."
                    )
        else:
            if num_edges.shape != () or not jnp.issubdtype(num_edges.dtype, jnp.integer):
                raise TypeError(
                    f"Expected num_edges as an integer scalar. Got shape {num_edges.shape}, dtype {num_edges.dtype}."
                )

        ei = jnp.asarray(edge_index)
        if ei.dtype != jnp.int32:  # int64 ids beyond int32 become -1: out of range, not wrapped around
            ei = jnp.where((ei >= 0) & (ei < 2**31 - 1), ei, -1).astype(jnp.int32)
        ei = jnp.pad(ei, ((0, 0), (0, max_edges - e)))
        n_edges = jnp.asarray(num_edges).astype(jnp.int32)
        count_ok = (n_edges >= 0) & (n_edges <= e)
        n_edges = jnp.where(count_ok, n_edges, -1)
        src, dst = ei[0], ei[1]
        active = jnp.arange(max_edges, dtype=jnp.int32) < n_edges
        in_range = (src >= 0) & (src < num_nodes) & (dst >= 0) & (dst < num_nodes)
        mask = active & in_range
        valid = count_ok & jnp.all(in_range | ~active)
        src = jnp.where(mask, src, 0)
        dst = jnp.where(mask, dst, 0)
        src_key = jnp.where(mask, src, num_nodes)
        dst_key = jnp.where(mask, dst, num_nodes)
        if canonical:
            # Sort by (dst, src), then by (src, dst) for the transpose: three stable single-key sorts
            # (each a radix sort on GPUs), so the CSR does not depend on the order of the edges.
            p1 = jnp.argsort(src_key, stable=True)
            p2 = p1[jnp.argsort(dst_key[p1], stable=True)]
            p3 = p2[jnp.argsort(src_key[p2], stable=True)]
        else:  # the given order within each node, as Graph.from_edges
            p2 = jnp.argsort(dst_key, stable=True)
            p3 = jnp.argsort(src_key, stable=True)
        cap = max_edges // chunk if num_nodes else 0
        csr, in_deg = _csr(p2, dst_key, src, num_nodes, chunk, cap)
        csr_t, out_deg = _csr(p3, src_key, dst, num_nodes, chunk, cap)
        return cls._from_fields(
            src=src, dst=dst, edge_mask=mask, num_edges=n_edges, valid=valid, in_degree=in_deg,
            out_degree=out_deg, csr=csr, csr_t=csr_t, num_nodes=num_nodes, max_edges=max_edges, chunk=chunk,
        )  # fmt: skip

    @classmethod
    def from_graph(
        cls, g, *, num_nodes: int | None = None, max_edges: int | None = None, chunk=None, canonical: bool = True
    ) -> DynamicGraph:
        """The traced twin of a static :class:`~blocksparse.gnn.Graph` (optionally with larger capacities)."""
        ei = np.stack([g.src, g.dst])
        n = g.num_nodes if num_nodes is None else num_nodes
        return cls.from_edge_index(ei, num_nodes=n, max_edges=max_edges, chunk=chunk, canonical=canonical)

    # ------------------------------------------------------------------ the Graph interface
    @property
    def T(self) -> DynamicGraph:
        """The transposed graph (every edge reversed): no work, the two CSRs swap roles."""
        return self._replace(
            src=self.dst, dst=self.src, in_degree=self.out_degree, out_degree=self.in_degree,
            csr=self.csr_t, csr_t=self.csr,
        )  # fmt: skip

    indptr = property(lambda self: self.csr.indptr)
    indices = property(lambda self: self.csr.indices)
    dst_sorted = property(lambda self: self.csr.segment)
    edge_perm = property(lambda self: self.csr.edge_perm)
    schedule = property(lambda self: self.csr)
    edge_capacity = property(lambda self: self.max_edges)

    def __repr__(self) -> str:
        return f"DynamicGraph(num_nodes={self.num_nodes}, max_edges={self.max_edges}, chunk={self.chunk})"

    def check_features(self, x, what: str, ndim: int | tuple[int, ...] = (1, 2, 3)):
        """Node features ``x`` as a floating array with ``num_nodes`` rows; returns it."""
        return check_features(self.num_nodes, x, what, ndim)

    # ------------------------------------------------------------------ validity
    def is_valid(self) -> jax.Array:
        """Traced bool: ``num_edges`` in range and every counted edge's node ids in ``[0, num_nodes)``."""
        return self.valid

    def check(self) -> jax.Array:
        """Report an invalid graph through checkify (a no-op unless functionalized); return ``is_valid()``."""
        checkify.debug_check(
            self.valid,
            f"DynamicGraph: expected num_edges in [0, the number of edges given] (at most max_edges={self.max_edges}) "
            f"and the node ids of the first num_edges edges in [0, {self.num_nodes}); got num_edges={{n}} (-1: outside "
            "that range) or node ids out of range.",
            n=self.num_edges,
        )
        return self.valid

    def validity(self) -> jax.Array:
        """What the ops use: :meth:`check` inside :func:`blocksparse.runtime_checks` (or
        :func:`blocksparse.checkify`), else :meth:`is_valid`."""
        return self.check() if runtime_checks_enabled() else self.is_valid()


# ---------------------------------------------------------------------------------- batching
def batch(
    edge_indices,
    num_nodes_per_graph,
    num_edges_per_graph=None,
    *,
    num_nodes: int | None = None,
    max_edges: int | None = None,
    chunk: int | None = None,
    canonical: bool = True,
) -> tuple[DynamicGraph, jax.Array]:
    """Pack several graphs into one disjoint union (node ids offset per graph), padded to capacities.

    Two forms:

    * host: ``edge_indices`` a sequence of NumPy ``(2, E_i)`` arrays and ``num_nodes_per_graph``
      a sequence of ints. Capacities default to the totals; ids are checked here.
    * traced (under ``jit``, a fixed number ``G`` of graphs): ``edge_indices`` one ``(G, 2, E)``
      array, the first ``num_edges_per_graph[g]`` edges of graph ``g`` counting (default all);
      ``num_nodes_per_graph`` ``(G,)``. ``num_nodes`` and ``max_edges`` are required. Totals
      beyond the capacities make the graph invalid (NaN outputs).

    Returns:
        ``(graph, graph_ids)``: a :class:`DynamicGraph` of capacity ``num_nodes`` x ``max_edges``,
        and ``graph_ids`` ``(num_nodes,)`` int32, the graph of each node (``G`` for padding
        nodes), for per-graph readouts (:func:`readout`).
    """
    host = isinstance(edge_indices, Sequence) and all(_concrete(a) for a in edge_indices)
    host = host and all(_concrete(a) for a in np.atleast_1d(num_nodes_per_graph))
    host = host and num_edges_per_graph is None
    if host:
        eis = [np.asarray(a) for a in edge_indices]
        sizes = np.asarray(num_nodes_per_graph, np.int64).reshape(-1)
        if len(eis) != sizes.size:
            raise ValueError(f"Expected one node count per graph ({len(eis)}). Got {sizes.size}.")
        for i, a in enumerate(eis):
            if a.ndim != 2 or a.shape[0] != 2:
                raise ValueError(f"Expected edge_indices[{i}] of shape (2, num_edges). Got shape {a.shape}.")
            if a.size and not np.issubdtype(a.dtype, np.integer):
                raise TypeError(f"Expected edge_indices[{i}] of an integer dtype. Got {a.dtype}.")
            bad = np.argwhere((a < 0) | (a >= sizes[i]))
            if bad.size:
                r, c = (int(v) for v in bad[0])
                raise ValueError(
                    f"Expected node indices of graph {i} in [0, {sizes[i]}). Got edge_indices[{i}][{r}, {c}] = "
                    f"{int(a[r, c])}."
                )
        offsets = np.concatenate([[0], np.cumsum(sizes)])
        total_n = int(offsets[-1])
        num_nodes = total_n if num_nodes is None else int(num_nodes)
        if total_n > num_nodes:
            raise ValueError(f"Expected at most num_nodes={num_nodes} nodes in all. Got {total_n}.")
        parts = [a.astype(np.int64).reshape(2, -1) + o for a, o in zip(eis, offsets[:-1], strict=True)]
        ei = np.concatenate(parts or [np.zeros((2, 0), np.int64)], axis=1)
        g = DynamicGraph.from_edge_index(
            ei.astype(np.int32), num_nodes=num_nodes, max_edges=max_edges, chunk=chunk, canonical=canonical
        )
        ids = np.searchsorted(offsets[1:], np.arange(num_nodes), side="right").astype(np.int32)
        return g, jnp.asarray(ids)

    if num_nodes is None or max_edges is None:
        raise ValueError("Expected static num_nodes and max_edges capacities to batch traced graphs.")
    ei = jnp.asarray(edge_indices)
    if ei.ndim != 3 or ei.shape[1] != 2:
        raise ValueError(f"Expected edge_indices of shape (num_graphs, 2, num_edges). Got shape {ei.shape}.")
    if not jnp.issubdtype(ei.dtype, jnp.integer):
        raise TypeError(f"Expected edge_indices of an integer dtype. Got {ei.dtype}.")
    ng, _, e = ei.shape
    sizes = jnp.asarray(num_nodes_per_graph).astype(jnp.int32)
    if sizes.shape != (ng,):
        raise ValueError(f"Expected num_nodes_per_graph of shape ({ng},). Got {sizes.shape}.")
    counts = jnp.full((ng,), e, jnp.int32) if num_edges_per_graph is None else jnp.asarray(num_edges_per_graph)
    if counts.shape != (ng,):
        raise ValueError(f"Expected num_edges_per_graph of shape ({ng},). Got {counts.shape}.")
    counts = counts.astype(jnp.int32)
    ends = jnp.cumsum(sizes)
    offsets = ends - sizes
    pos = jnp.arange(e, dtype=jnp.int32)
    active = pos[None, :] < counts[:, None]  # (G, E)
    # Ids checked per graph: one outside [0, n_g) would land in another graph; make it -1 (invalid).
    ok = (ei >= 0) & (ei < sizes[:, None, None])
    shifted = jnp.where(ok, ei + offsets[:, None, None], -1)
    flat = shifted.transpose(1, 0, 2).reshape(2, ng * e)
    act = active.reshape(-1)
    # counted edges first (stable), then truncated / padded to max_edges
    order = jnp.argsort(~act, stable=True)
    flat = flat[:, order]
    total = jnp.sum(counts)
    if ng * e >= max_edges:
        flat = flat[:, :max_edges]
    n_edges = jnp.where((total <= max_edges) & (ends[-1] <= num_nodes) & jnp.all(counts >= 0) & jnp.all(counts <= e),
                        total, -1)  # fmt: skip
    g = DynamicGraph.from_edge_index(
        flat, num_nodes=num_nodes, max_edges=max_edges, num_edges=n_edges, chunk=chunk, canonical=canonical
    )
    ids = jnp.searchsorted(ends, jnp.arange(num_nodes, dtype=jnp.int32), side="right").astype(jnp.int32)
    return g, ids


def readout(x, graph_ids, num_graphs: int, reduce: str = "sum") -> jax.Array:
    """Per-graph pooling of node features: ``out[g] = reduce_{i: graph_ids[i] = g} x[i]``.

    Nodes whose id is outside ``[0, num_graphs)`` (padding) are ignored; a graph without nodes
    gets 0. ``reduce``: ``"sum"``, ``"mean"`` or ``"max"``.
    """
    x = jnp.asarray(x)
    if reduce not in ("sum", "mean", "max"):
        raise ValueError(f"Expected reduce in ['sum', 'mean', 'max']. Got {reduce!r}.")
    if graph_ids.shape != x.shape[:1]:
        raise ValueError(f"Expected graph_ids of shape ({x.shape[0]},), one per node. Got {graph_ids.shape}.")
    if reduce == "max":
        out = jax.ops.segment_max(x, graph_ids, num_graphs)
        cnt = jax.ops.segment_sum(jnp.ones_like(graph_ids), graph_ids, num_graphs)
        return jnp.where((cnt > 0).reshape(-1, *[1] * (x.ndim - 1)), out, jnp.zeros((), x.dtype))
    out = jax.ops.segment_sum(x, graph_ids, num_graphs)
    if reduce == "mean":
        cnt = jax.ops.segment_sum(jnp.ones_like(graph_ids), graph_ids, num_graphs).clip(1)
        out = out / cnt.reshape(-1, *[1] * (x.ndim - 1)).astype(out.dtype)
    return out
