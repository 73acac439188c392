"""Host-side graph structure: CSR by destination, its transpose, degrees and the degree-aware schedule.

A :class:`Graph` is built once from an edge list (NumPy, on the host) and is a pytree with no
leaves: every index array is static, so ``jit`` specialises per graph (graphs hash and compare by
a fingerprint of their edges) and node features are always the traced arguments.
"""

from __future__ import annotations

import functools
import hashlib

import jax
import numpy as np

from .._util import Pytree, cdiv, check_host_bytes
from ._common import CHUNK_ALIGN, check_features

__all__ = ["Graph", "Schedule"]


class Schedule:
    """Degree-aware work units over one CSR (fixed shapes, host data).

    The *main* units are the nodes themselves: node ``i`` covers CSR positions
    ``[indptr[i], main_end[i])``. A light node's unit is its whole in-edge list; a heavy node's
    covers only its first chunk of ``chunk`` edges, and its remaining chunks are *extra* units
    ``[extra_start[u], extra_end[u])`` of node ``extra_node[u]`` (sorted by node). Kernels run one
    program per main unit and one per extra unit; the extra partials are combined per node
    (sum / max / log-sum-exp merge) and folded into the main rows.
    """

    def __init__(self, indptr: np.ndarray, heavy_nodes: np.ndarray, chunk: int):
        # One O(num_nodes) copy (the kernels' per-unit array); everything else is O(heavy nodes).
        self.chunk = int(chunk)
        heavy_nodes = np.asarray(heavy_nodes, np.int64)
        start, end = indptr[heavy_nodes].astype(np.int64), indptr[heavy_nodes + 1].astype(np.int64)
        self.main_end = indptr[1:].astype(np.int32, copy=True)
        self.main_end[heavy_nodes] = np.minimum(end, start + chunk)
        counts = np.maximum(0, cdiv(end - start, chunk) - 1)
        self.extra_node = np.repeat(heavy_nodes, counts).astype(np.int32)
        # chunk index within the node, starting at 1 (chunk 0 is the main unit)
        first = np.repeat(np.cumsum(counts) - counts, counts)
        k = np.arange(self.extra_node.size) - first + 1
        node_start, node_end = np.repeat(start, counts), np.repeat(end, counts)
        self.extra_start = (node_start + k * chunk).astype(np.int32)
        self.extra_end = np.minimum(node_end, self.extra_start.astype(np.int64) + chunk).astype(np.int32)
        self.heavy_nodes = heavy_nodes.astype(np.int32)
        # extra unit -> position of its node among heavy_nodes (for segment ops, sorted)
        self.extra_segment = np.repeat(np.arange(heavy_nodes.size, dtype=np.int32), counts)

    @property
    def num_extra(self) -> int:
        return int(self.extra_node.size)


class Graph(Pytree):
    """A directed graph whose messages flow ``src -> dst``; aggregation is at ``dst`` over in-edges.

    Build with :meth:`from_edges`. Self-loops, multi-edges and isolated nodes are allowed.

    Attributes (all NumPy, host-side, computed once):
        num_nodes, num_edges: sizes.
        src, dst: the edges in the caller's order (``edge_weight`` follows this order).
        indptr, indices, edge_perm: CSR by destination: the in-edges of node ``i`` are CSR
            positions ``indptr[i]:indptr[i+1]``, with sources ``indices[p]`` and original edge ids
            ``edge_perm[p]`` (stable: multi-edges keep their order).
        in_degree, out_degree: edge counts (``int32``).
        max_in_degree: the largest in-degree.
        heavy_quantile, heavy_threshold, heavy_nodes: nodes whose in-degree exceeds the
            ``heavy_quantile`` quantile of in-degrees (and one chunk) are *heavy*; ``heavy_nodes``
            lists them (sorted), ``heavy`` is the per-node mask.
        T: the transposed graph (``dst -> src``), i.e. CSR by source; cached.
    """

    # A pytree with no leaves: the whole graph is static structure (host data, hashed by its
    # fingerprint), so jit specialises on it like on a BlockPattern.
    _static = ("self",)

    def __init__(self, num_nodes: int, src: np.ndarray, dst: np.ndarray, heavy_quantile: float, name: str | None):
        self.num_nodes = int(num_nodes)
        self.num_edges = int(src.size)
        self.src, self.dst = src, dst
        self.heavy_quantile = float(heavy_quantile)
        self.name = name
        order = np.argsort(dst, kind="stable")
        self.edge_perm = order.astype(np.int32)
        self.indices = src[order]
        self.dst_sorted = dst[order]
        # Host work is O(num_edges) except for the O(num_nodes) arrays the kernels read (degrees,
        # indptr), each made in one vectorised pass (zero-filled arrays are allocated lazily).
        nodes, counts = _counts(self.dst_sorted, self.num_nodes)
        self.in_degree = _scatter(nodes, counts, self.num_nodes)
        self.out_degree = _scatter(*_counts(np.sort(src), self.num_nodes), self.num_nodes)
        self.indptr = np.zeros(self.num_nodes + 1, np.int32)
        np.cumsum(self.in_degree, dtype=np.int32, out=self.indptr[1:])
        self.max_in_degree = int(counts.max(initial=0))
        q = _degree_quantile(self.in_degree, counts, self.heavy_quantile)
        self.heavy_threshold = int(np.ceil(q))
        self.chunk = CHUNK_ALIGN * max(1, cdiv(max(self.heavy_threshold, 1), CHUNK_ALIGN))
        is_heavy = (counts > self.heavy_threshold) & (counts > self.chunk)
        self.heavy_nodes = nodes[is_heavy].astype(np.int32)  # sorted
        h = hashlib.sha1()
        h.update(np.asarray([self.num_nodes, self.num_edges], np.int64).tobytes())
        h.update(src.tobytes())
        h.update(dst.tobytes())
        h.update(np.float64(self.heavy_quantile).tobytes())
        self.fingerprint = h.hexdigest()
        self._transpose: Graph | None = None

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_edges(cls, src, dst, num_nodes: int, *, heavy_quantile: float = 0.99, name: str | None = None) -> Graph:
        """Build a graph from edges ``src[e] -> dst[e]``.

        Arguments:
            src, dst: 1-D integer arrays of equal length (host data: NumPy, lists or concrete
                JAX arrays), values in ``[0, num_nodes)``.
            num_nodes: number of nodes (nodes without edges are allowed).
            heavy_quantile: in-degree quantile above which a node is *heavy* (its in-edges are
                split into chunks processed in parallel). Default 0.99.
            name: an optional label (e.g. ``"synthetic power-law"``), shown in ``repr``.

        Returns:
            A :class:`Graph`.

        Example::

            g = Graph.from_edges([0, 1, 2], [1, 2, 2], num_nodes=4)   # node 3 is isolated
        """
        if isinstance(num_nodes, bool) or not isinstance(num_nodes, (int, np.integer)):
            raise TypeError(f"Expected num_nodes to be a non-negative int. Got {num_nodes!r}.")
        if num_nodes < 0:
            raise ValueError(f"Expected num_nodes >= 0. Got {num_nodes}.")
        if num_nodes >= 2**31 - 1:  # int32 node ids on the device, as DynamicGraph
            raise ValueError(f"Expected num_nodes < 2**31 - 1 (int32 node ids). Got {num_nodes}.")
        # the CSR and its cached transpose hold 24 bytes a node on the host whatever the edges (traced with
        # tracemalloc at 2 M nodes)
        check_host_bytes(24 * int(num_nodes), f"a graph of {num_nodes} nodes")
        if not 0.0 <= float(heavy_quantile) <= 1.0:
            raise ValueError(f"Expected heavy_quantile in [0, 1]. Got {heavy_quantile}.")
        arrs = []
        for nm, a in (("src", src), ("dst", dst)):
            if isinstance(a, jax.core.Tracer):
                raise TypeError(
                    f"Expected {nm} as concrete host data (a graph is static across steps). Got a traced array; "
                    "build the Graph outside jit."
                )
            a = np.asarray(a)
            if a.ndim != 1:
                raise ValueError(f"Expected {nm} to be 1-D. Got shape {a.shape}.")
            if a.size and not np.issubdtype(a.dtype, np.integer):
                raise TypeError(f"Expected {nm} of an integer dtype. Got {a.dtype}.")
            arrs.append(a)
        s, d = arrs
        if s.size != d.size:
            raise ValueError(f"Expected src and dst of equal length. Got {s.size} and {d.size}.")
        if s.size >= 2**31 - 1:
            raise ValueError(f"Expected fewer than 2**31 - 1 edges. Got {s.size}.")
        for nm, a in (("src", s), ("dst", d)):
            if a.size:  # in the ids' own dtype: a uint64 id above int64's range is named as given, not wrapped
                bad = np.flatnonzero((a < 0) | (a >= num_nodes))
                if bad.size:
                    e = int(bad[0])
                    raise ValueError(
                        f"Expected node indices in [0, {num_nodes}). Got {nm}[{e}] = {int(a[e])} "
                        f"({bad.size} out of range)."
                    )
        return cls(num_nodes, s.astype(np.int32), d.astype(np.int32), heavy_quantile, name)

    # ------------------------------------------------------------------ derived structure
    @property
    def T(self) -> Graph:
        """The transposed graph (every edge reversed): CSR by source, used by backward passes."""
        if self._transpose is None:
            t = Graph(self.num_nodes, self.dst, self.src, self.heavy_quantile, None)
            t._transpose = self
            self._transpose = t
        return self._transpose

    @functools.cached_property
    def schedule(self) -> Schedule:
        return Schedule(self.indptr, self.heavy_nodes, self.chunk)

    @functools.cached_property
    def heavy(self) -> np.ndarray:
        """Whether each node is heavy, ``(num_nodes,)`` bool (see :attr:`heavy_nodes`)."""
        out = np.zeros(self.num_nodes, bool)
        out[self.heavy_nodes] = True
        return out

    @property
    def num_heavy(self) -> int:
        return int(self.heavy_nodes.size)

    def with_heavy_quantile(self, q: float) -> Graph:
        """The same edges with another heavy-node quantile."""
        return Graph.from_edges(self.src, self.dst, self.num_nodes, heavy_quantile=q, name=self.name)

    # ------------------------------------------------------------------ pytree / hashing
    def __hash__(self) -> int:
        return hash(self.fingerprint)

    def __eq__(self, other) -> bool:
        return isinstance(other, Graph) and other.fingerprint == self.fingerprint

    def __repr__(self) -> str:
        label = f", name={self.name!r}" if self.name else ""
        return (
            f"Graph(num_nodes={self.num_nodes}, num_edges={self.num_edges}, max_in_degree="
            f"{self.max_in_degree}, heavy={self.num_heavy}{label})"
        )

    def check_features(self, x, what: str, ndim: int | tuple[int, ...] = (1, 2, 3)):
        """Node features ``x`` as a floating array with one row per node; returns it."""
        return check_features(self.num_nodes, x, what, ndim)

    @property
    def edge_capacity(self) -> int:
        """The length of the per-edge arrays (``num_edges``; a :class:`DynamicGraph`'s ``max_edges``)."""
        return self.num_edges


def _counts(sorted_ids: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Distinct values of a sorted id array and their multiplicities: O(len(ids)), not O(n)."""
    if sorted_ids.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    starts = np.flatnonzero(np.concatenate([[True], sorted_ids[1:] != sorted_ids[:-1]]))
    return sorted_ids[starts].astype(np.int64), np.diff(np.append(starts, sorted_ids.size)).astype(np.int64)


def _scatter(nodes: np.ndarray, counts: np.ndarray, n: int) -> np.ndarray:
    out = np.zeros(n, np.int32)  # calloc: pages are only touched where written or read
    out[nodes] = counts
    return out


def _degree_quantile(degree: np.ndarray, counts: np.ndarray, q: float) -> float:
    """``np.quantile(degree, q)`` (linear interpolation), without touching ``degree`` when the
    quantile falls among the nodes of in-degree 0 (most of them, on a huge sparse graph)."""
    n, k = degree.size, counts.size  # k nodes have in-edges; the n - k others sort first, as 0
    if n == 0 or k == 0:
        return 0.0
    if q * (n - 1) + 2 < n - k:  # both interpolation neighbours are zeros (with a margin for rounding)
        return 0.0
    if q == 1.0:
        return float(counts.max())
    return float(np.quantile(degree, q))  # n <= (k + 2) / (1 - q): bounded by the edges
