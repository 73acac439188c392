"""Host-side graph structure: CSR by destination, its transpose, degrees and the degree-aware schedule.

A :class:`Graph` is built once from an edge list (NumPy, on the host) and is a pytree with no
leaves: every index array is static, so ``jit`` specialises per graph (graphs hash and compare by
a fingerprint of their edges) and node features are always the traced arguments.
"""

from __future__ import annotations

import functools
import hashlib

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["Graph", "Schedule"]

# Edges per heavy-node chunk are a multiple of this, so every kernel's edge block divides it.
_CHUNK_ALIGN = 128


class Schedule:
    """Degree-aware work units over one CSR (fixed shapes, host data).

    The *main* units are the nodes themselves: node ``i`` covers CSR positions
    ``[indptr[i], main_end[i])``. A light node's unit is its whole in-edge list; a heavy node's
    covers only its first chunk of ``chunk`` edges, and its remaining chunks are *extra* units
    ``[extra_start[u], extra_end[u])`` of node ``extra_node[u]`` (sorted by node). Kernels run one
    program per main unit and one per extra unit; the extra partials are combined per node
    (sum / max / log-sum-exp merge) and folded into the main rows.
    """

    def __init__(self, indptr: np.ndarray, heavy: np.ndarray, chunk: int):
        start, end = indptr[:-1].astype(np.int64), indptr[1:].astype(np.int64)
        cap = np.where(heavy, chunk, np.iinfo(np.int64).max // 4)
        self.chunk = int(chunk)
        self.main_end = np.minimum(end, start + cap).astype(np.int32)
        heavy_nodes = np.flatnonzero(heavy)
        counts = np.maximum(0, -(-(end[heavy_nodes] - start[heavy_nodes]) // chunk) - 1)
        self.extra_node = np.repeat(heavy_nodes, counts).astype(np.int32)
        # chunk index within the node, starting at 1 (chunk 0 is the main unit)
        first = np.repeat(np.cumsum(counts) - counts, counts)
        k = np.arange(self.extra_node.size) - first + 1
        self.extra_start = (start[self.extra_node] + k * chunk).astype(np.int32)
        self.extra_end = np.minimum(end[self.extra_node], self.extra_start.astype(np.int64) + chunk).astype(np.int32)
        self.heavy_nodes = heavy_nodes.astype(np.int32)
        # extra unit -> position of its node among heavy_nodes (for segment ops, sorted)
        self.extra_segment = np.searchsorted(heavy_nodes, self.extra_node).astype(np.int32)

    @property
    def num_extra(self) -> int:
        return int(self.extra_node.size)


class Graph:
    """A directed graph whose messages flow ``src -> dst``; aggregation is at ``dst`` over in-edges.

    Build with :meth:`from_edges`. Self-loops, multi-edges and isolated nodes are allowed.

    Attributes (all NumPy, host-side, computed once):
        num_nodes, num_edges: sizes.
        src, dst: the edges in the caller's order (``edge_weight`` follows this order).
        indptr, indices, edge_perm: CSR by destination: the in-edges of node ``i`` are CSR
            positions ``indptr[i]:indptr[i+1]``, with sources ``indices[p]`` and original edge ids
            ``edge_perm[p]`` (stable: multi-edges keep their order).
        in_degree, out_degree: edge counts (``int32``).
        heavy_quantile, heavy_threshold, heavy: nodes whose in-degree exceeds the
            ``heavy_quantile`` quantile of in-degrees (and one chunk) are *heavy*.
        T: the transposed graph (``dst -> src``), i.e. CSR by source; cached.
    """

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
        self.in_degree = np.bincount(dst, minlength=self.num_nodes).astype(np.int32)
        self.out_degree = np.bincount(src, minlength=self.num_nodes).astype(np.int32)
        self.indptr = np.zeros(self.num_nodes + 1, np.int32)
        np.cumsum(self.in_degree, out=self.indptr[1:])
        if self.num_nodes and self.num_edges:
            q = float(np.quantile(self.in_degree, self.heavy_quantile))
        else:
            q = 0.0
        self.heavy_threshold = int(np.ceil(q))
        self.chunk = _CHUNK_ALIGN * max(1, -(-max(self.heavy_threshold, 1) // _CHUNK_ALIGN))
        self.heavy = (self.in_degree > self.heavy_threshold) & (self.in_degree > self.chunk)
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
            arrs.append(a.astype(np.int64))
        s, d = arrs
        if s.size != d.size:
            raise ValueError(f"Expected src and dst of equal length. Got {s.size} and {d.size}.")
        if s.size >= 2**31 - 1:
            raise ValueError(f"Expected fewer than 2**31 - 1 edges. Got {s.size}.")
        for nm, a in (("src", s), ("dst", d)):
            if a.size:
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
        return Schedule(self.indptr, self.heavy, self.chunk)

    @property
    def num_heavy(self) -> int:
        return int(self.heavy.sum())

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
            f"{int(self.in_degree.max(initial=0))}, heavy={self.num_heavy}{label})"
        )

    def check_features(self, x, what: str, ndim: int | tuple[int, ...] = (1, 2, 3)):
        """Node features ``x`` as a floating array with one row per node; returns it."""
        x = jnp.asarray(x)
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise TypeError(f"Expected floating-point {what}. Got {x.dtype}.")
        ndims = (ndim,) if isinstance(ndim, int) else ndim
        if x.ndim not in ndims:
            span = f"{ndims[0]} to {ndims[-1]}" if len(ndims) > 2 else " or ".join(map(str, ndims))
            raise ValueError(f"Expected {what} with {span} dimensions. Got shape {x.shape}.")
        if x.shape[0] != self.num_nodes:
            raise ValueError(
                f"Expected {what} with one row per node: leading dimension {self.num_nodes}. Got shape {x.shape}."
            )
        return x


jax.tree_util.register_pytree_node(Graph, lambda g: ((), g), lambda g, _: g)
