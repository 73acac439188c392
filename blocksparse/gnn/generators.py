"""Synthetic graphs for tests and benchmarks (no downloads): power-law, R-MAT, the paper's graphs, and graphs of
communities.

Every generated graph is *labelled synthetic* in its ``name`` (e.g.
``"synthetic power-law like ogbn-arxiv"``). :func:`synthetic` matches only a dataset's node and
edge counts (:data:`PAPER_GRAPHS`); :func:`paper_graph` also its degree skew (and, for
city-roads-L, its locality), from the targets in :data:`PAPER_GRAPH_SPECS`, of which
:data:`PAPER_GRAPHS` is derived.
"""

from __future__ import annotations

import functools

import numpy as np

from ..graph import Graph

__all__ = [
    "PAPER_GRAPHS",
    "PAPER_GRAPH_SPECS",
    "communities",
    "community_edges",
    "paper_graph",
    "paper_graph_edges",
    "power_law",
    "power_law_edges",
    "rmat",
    "rmat_edges",
    "shuffle_ids",
    "synthetic",
]

# -- the paper's graphs: one table of targets, the sizes derived from it ------------------------
#: The graphs of Fomina et al. as :func:`paper_graph` generates them: node count, edge count
#: (undirected pairs for a ``symmetric`` graph, each stored in both directions, else directed
#: edges), and the degree targets the power-law exponents are solved for: ``max_degree``, the
#: largest in-degree (of a symmetric graph, degree) of the real dataset, and ``max_out_degree``,
#: the largest out-degree of a directed one. The maxima are the datasets' reported statistics as
#: we know them (approximate), except arxiv's out-degree target, an assumption (its reference
#: lists are short). ``city-roads-L`` is a road network (degrees 1 to 5, planar) and is generated
#: as a grid instead.
PAPER_GRAPH_SPECS: dict[str, dict] = {
    "ogbn-arxiv": dict(nodes=169_343, edges=1_166_243, symmetric=False, max_degree=13_155, max_out_degree=500,
                       hubs_shared=False),
    "ogbn-products": dict(nodes=2_449_029, edges=61_859_140, symmetric=True, max_degree=17_481),
    "pokec": dict(nodes=1_632_803, edges=30_622_564, symmetric=False, max_degree=13_733, max_out_degree=8_763,
                  hubs_shared=True),
    "twitch-views": dict(nodes=168_114, edges=6_797_557, symmetric=True, max_degree=35_279),
    "city-roads-L": dict(nodes=142_257, edges=231_855, symmetric=True, max_degree=5, grid=True),
}  # fmt: skip

#: ``(num_nodes, num_edges)`` of each graph of :data:`PAPER_GRAPH_SPECS` as a :class:`Graph` stores
#: it (a symmetric graph's undirected edges counted in both directions), the sizes :func:`synthetic`
#: uses; and ``"baseline"``, the 262,144-node benchmark graph of docs/benchmarks.md ("GNN operations").
PAPER_GRAPHS: dict[str, tuple[int, int]] = {
    **{k: (v["nodes"], v["edges"] * (2 if v["symmetric"] else 1)) for k, v in PAPER_GRAPH_SPECS.items()},
    "baseline": (262_144, 8_388_608),
}


def power_law_edges(num_nodes: int, num_edges: int, *, exponent: float = 0.8, seed: int = 0):
    """Edges whose destinations follow a Zipf-like law ``p(rank r) ~ r^-exponent`` (sources
    uniform), node ids shuffled. ``exponent=0.8`` on ``baseline`` gives a maximum in-degree
    around 1.4e5 at mean 32, like the benchmark graph of docs/benchmarks.md."""
    _check_counts(num_nodes, num_edges)
    rng = np.random.default_rng(seed)
    w = np.arange(1, num_nodes + 1, dtype=np.float64) ** -float(exponent)
    cdf = np.cumsum(w)
    cdf /= cdf[-1]
    ranks = np.minimum(np.searchsorted(cdf, rng.random(num_edges)), num_nodes - 1)
    perm = rng.permutation(num_nodes).astype(np.int32)
    dst = perm[ranks]
    src = rng.integers(0, num_nodes, num_edges, dtype=np.int32)
    return src, dst


def rmat_edges(num_nodes: int, num_edges: int, *, a=0.57, b=0.19, c=0.19, seed: int = 0):
    """R-MAT (Chakrabarti et al.) edges on ``2^ceil(log2 N)`` ids, out-of-range ids rejected and
    redrawn, node ids shuffled. Default (a, b, c) = Graph500's."""
    _check_counts(num_nodes, num_edges)
    if not (a > 0 and b >= 0 and c >= 0 and a + b + c < 1):
        raise ValueError(f"Expected a > 0, b, c >= 0 and a + b + c < 1. Got a={a}, b={b}, c={c}.")
    rng = np.random.default_rng(seed)
    scale = max(1, int(np.ceil(np.log2(max(num_nodes, 2)))))
    src_out, dst_out, have = [], [], 0
    while have < num_edges:
        m = int((num_edges - have) * 1.1) + 16
        s = np.zeros(m, np.int64)
        d = np.zeros(m, np.int64)
        for _ in range(scale):
            r = rng.random(m)
            sbit = r >= a + b  # quadrants c, d: lower half for the source
            dbit = ((r >= a) & (r < a + b)) | (r >= a + b + c)
            s = (s << 1) | sbit
            d = (d << 1) | dbit
        ok = (s < num_nodes) & (d < num_nodes)
        src_out.append(s[ok])
        dst_out.append(d[ok])
        have += int(ok.sum())
    perm = rng.permutation(num_nodes)
    src = perm[np.concatenate(src_out)[:num_edges]].astype(np.int32)
    dst = perm[np.concatenate(dst_out)[:num_edges]].astype(np.int32)
    return src, dst


def power_law(num_nodes: int, num_edges: int, *, exponent: float = 0.8, seed: int = 0, **graph_kw) -> Graph:
    """A :class:`Graph` from :func:`power_law_edges`, named ``"synthetic power-law"``."""
    src, dst = power_law_edges(num_nodes, num_edges, exponent=exponent, seed=seed)
    return Graph.from_edges(src, dst, num_nodes, name="synthetic power-law", **graph_kw)


def rmat(num_nodes: int, num_edges: int, *, seed: int = 0, **kw) -> Graph:
    """A :class:`Graph` from :func:`rmat_edges`, named ``"synthetic R-MAT"``."""
    graph_kw = {k: kw.pop(k) for k in ("heavy_quantile",) if k in kw}
    src, dst = rmat_edges(num_nodes, num_edges, seed=seed, **kw)
    return Graph.from_edges(src, dst, num_nodes, name="synthetic R-MAT", **graph_kw)


def synthetic(name: str, *, kind: str = "power_law", seed: int = 0, scale: float = 1.0, **kw) -> Graph:
    """A synthetic graph with the node and edge counts of ``name`` (a key of
    :data:`PAPER_GRAPHS`), optionally scaled down by ``scale`` (both counts), e.g.
    ``synthetic("ogbn-arxiv", kind="rmat")``. Its ``name`` says it is synthetic."""
    if name not in PAPER_GRAPHS:
        raise ValueError(f"Expected a graph name in {sorted(PAPER_GRAPHS)}. Got {name!r}.")
    if kind not in ("power_law", "rmat"):
        raise ValueError(f"Expected kind in ['power_law', 'rmat']. Got {kind!r}.")
    if not 0 < scale <= 1:
        raise ValueError(f"Expected scale in (0, 1]. Got {scale}.")
    n, e = PAPER_GRAPHS[name]
    n, e = max(1, int(n * scale)), max(0, int(e * scale))
    g = (power_law if kind == "power_law" else rmat)(n, e, seed=seed, **kw)
    g.name = f"synthetic {kind.replace('_', '-')} like {name}"
    return g


def _check_counts(num_nodes, num_edges):
    if num_nodes < 1:
        raise ValueError(f"Expected num_nodes >= 1. Got {num_nodes}.")
    if num_edges < 0:
        raise ValueError(f"Expected num_edges >= 0. Got {num_edges}.")


# -- degree-matched stand-ins for the paper's graphs ------------------------------------------------
def paper_graph_edges(
    name: str, *, scale: float = 1.0, seed: int = 0, shuffle: bool = False
) -> tuple[np.ndarray, np.ndarray, int]:
    """Edges of a synthetic graph with the size and degree skew of one of the paper's graphs.

    Arguments:
        name: a key of :data:`PAPER_GRAPH_SPECS`: ``"ogbn-arxiv"`` (169,343 nodes, 1,166,243
            directed edges, max in-degree 13,155), ``"ogbn-products"`` (2,449,029 nodes,
            61,859,140 undirected edges stored both ways = 123,718,280, max degree 17,481),
            ``"pokec"`` (1,632,803 nodes, 30,622,564 directed edges, max in-degree 13,733, max
            out-degree 8,763), ``"twitch-views"`` (the twitch-gamers graph: 168,114 nodes,
            6,797,557 undirected edges = 13,595,114 directed, max degree 35,279) or
            ``"city-roads-L"`` (142,257 nodes, 231,855 undirected edges = 463,710 directed).
        scale: in ``(0, 1]``: both counts are multiplied by it and rounded (``1.0``: the exact
            sizes above); the degree law keeps its exponent, so hubs shrink with the graph.
        seed: the random seed (the same seed gives the same edges).
        shuffle: renumber the nodes by a random permutation (:func:`shuffle_ids`, seeded by ``seed + 1``): the same
            graph with the locality of city-roads-L's ids hidden, for a reordering to recover (the other graphs'
            ids carry none to begin with).

    Returns:
        ``(src, dst, num_nodes)``, ``int32`` edges without self-loops or repeated edges; a
        symmetric graph holds each undirected edge in both directions.

    How: the social and product graphs are Chung-Lu graphs: each edge end is a node drawn from a
    Zipf-like law ``p(rank r) ~ r^-a`` (continuous form, sampled by inversion), with ``a``
    solved so that the expected degree of the top-ranked node equals ``max_degree`` (and
    ``max_out_degree`` for the sources of a directed graph; pokec's in- and out-hubs are the
    same nodes, arxiv's independent); repeated edges and self-loops are redrawn until the count
    is exact, and node ids are a random permutation of the ranks, so ids carry no locality.
    ``city-roads-L`` is a grid of about ``sqrt(N)`` columns: a random spanning tree (each node
    joined to its left or upper neighbour) plus random grid edges up to the count, so degrees are
    1 to 4 (mean 3.26) and every node is reachable; ids follow the rows with a local jitter of
    a few places, so neighbours' ids are close, as in a real road network's node order.

    Example::

        >>> src, dst, n = paper_graph_edges("ogbn-arxiv", scale=0.01)
        >>> n, src.size
        (1693, 11662)
    """
    if name not in PAPER_GRAPH_SPECS:
        raise ValueError(f"Expected a graph name in {sorted(PAPER_GRAPH_SPECS)}. Got {name!r}.")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < scale <= 1:
        raise ValueError(f"Expected scale in (0, 1]. Got {scale!r}.")
    spec = PAPER_GRAPH_SPECS[name]
    n, m = max(1, round(spec["nodes"] * scale)), round(spec["edges"] * scale)
    # at most a quarter of the simple graph's pairs, so that redrawing repeats always ends quickly
    most = n * (n - 1) // (8 if spec["symmetric"] else 4)
    if m > most:
        raise ValueError(
            f"Expected scale large enough for a sparse graph: {m} edges on {n} nodes is more than {most} "
            f"(a quarter of the node pairs). Got scale={scale}."
        )
    rng = np.random.default_rng(seed)
    if spec.get("grid"):
        u, v = _grid_edges(rng, n, m)
    else:
        # exponents solved at the real sizes: a scaled graph keeps the law's shape
        a_in, a_out = _paper_exponents(name)
        p_in = rng.permutation(n)
        p_out = p_in if spec.get("hubs_shared", True) else rng.permutation(n)
        # destination-major order, as a dataset stored in CSR is (so Graph.from_edges's stable sort is cheap)
        v, u = _distinct_pairs(rng, m, n, (a_in, p_in), (a_out, p_out), undirected=spec["symmetric"])
    if spec["symmetric"]:
        u, v = np.concatenate([u, v]), np.concatenate([v, u])
    if shuffle:  # a stream of its own (the graph's draws used ``seed``'s)
        u, v = shuffle_ids(u, v, n, seed=seed + 1)
    return u.astype(np.int32), v.astype(np.int32), n


def paper_graph(name: str, *, scale: float = 1.0, seed: int = 0, **graph_kw) -> Graph:
    """A :class:`Graph` of :func:`paper_graph_edges`, named e.g. ``"synthetic degree-matched like pokec"``.

    ``graph_kw`` go to :meth:`Graph.from_edges` (``heavy_quantile``).

    Example::

        >>> g = paper_graph("city-roads-L", scale=0.01)
        >>> g.num_nodes, g.num_edges, int(g.in_degree.min()), int(g.in_degree.max()) <= 4
        (1423, 4638, 1, True)
    """
    src, dst, n = paper_graph_edges(name, scale=scale, seed=seed)
    kind = "jittered grid" if PAPER_GRAPH_SPECS[name].get("grid") else "degree-matched"
    return Graph.from_edges(src, dst, n, name=f"synthetic {kind} like {name}", **graph_kw)


@functools.cache
def _paper_exponents(name: str) -> tuple[float, float]:
    """(in, out) exponents of a paper graph: its top-ranked node gets ``max_degree`` distinct in-neighbours
    (``max_out_degree`` distinct out-neighbours), once repeated edges are merged (solved at the real sizes)."""
    spec = PAPER_GRAPH_SPECS[name]
    n, ends = spec["nodes"], spec["edges"] * (2 if spec["symmetric"] else 1)
    a_in = _zipf_exponent(n, spec["max_degree"] / ends)
    a_out = a_in if spec["symmetric"] else _zipf_exponent(n, spec["max_out_degree"] / ends)
    for _ in range(3):  # a fixed point: each end's law sets how many of the other's draws repeat
        p_in, p_out = _zipf_probs(n, a_in), _zipf_probs(n, a_out)
        a_in = _zipf_exponent(n, _draws_for_distinct(p_out, spec["max_degree"]) / ends)
        if not spec["symmetric"]:
            a_out = _zipf_exponent(n, _draws_for_distinct(p_in, spec["max_out_degree"]) / ends)
        else:
            a_out = a_in
    return a_in, a_out


def _zipf_probs(n: int, a: float) -> np.ndarray:
    """P(rank r) of :func:`_zipf_ranks`, ``r = 0 .. n-1``."""
    b, x = 1.0 - a, np.log(np.arange(1, n + 2, dtype=np.float64))
    cdf = x / x[-1] if abs(b) < 1e-9 else np.expm1(b * x) / np.expm1(b * x[-1])
    return np.diff(cdf)


def _draws_for_distinct(p: np.ndarray, target: float) -> float:
    """Draws ``d`` from the law ``p`` whose expected number of distinct values, ``sum 1 - exp(-d p)``, is ``target``."""
    lo, hi = float(target), 64.0 * target
    for _ in range(40):
        d = 0.5 * (lo + hi)
        lo, hi = (d, hi) if -np.expm1(-d * p).sum() < target else (lo, d)
    return 0.5 * (lo + hi)


def _zipf_exponent(n: int, p1: float) -> float:
    """The exponent ``a`` of :func:`_zipf_ranks` whose top rank has probability ``p1`` (bisection)."""
    p1 = min(max(p1, 1.0 / n), 1.0)
    lo, hi = 0.0, 8.0
    for _ in range(80):
        a = 0.5 * (lo + hi)
        lo, hi = (a, hi) if _zipf_top(n, a) < p1 else (lo, a)
    return 0.5 * (lo + hi)


def _zipf_top(n: int, a: float) -> float:
    # P(rank 0) of the law with CDF F(x) = (x^b - 1) / ((n+1)^b - 1) on [1, n+1), b = 1 - a
    b = 1.0 - a
    if abs(b) < 1e-9:
        return np.log(2.0) / np.log(n + 1.0)
    return float(np.expm1(b * np.log(2.0)) / np.expm1(b * np.log(n + 1.0)))


def _zipf_ranks(rng, n: int, a: float, size: int) -> np.ndarray:
    """``size`` ranks in ``[0, n)`` with ``P(r) ~ (r+1)^-a`` (the continuous law, by inversion)."""
    u = rng.random(size)
    b, big = 1.0 - a, np.log(n + 1.0)
    x = np.exp(u * big) if abs(b) < 1e-9 else np.exp(np.log1p(u * np.expm1(b * big)) / b)
    return np.minimum(x.astype(np.int64) - 1, n - 1).clip(0)


def _distinct_pairs(rng, m: int, n: int, major, minor, *, undirected: bool):
    """``m`` distinct pairs ``(a, b)``, ``a != b``, sorted by ``(a, b)``; unordered (``a < b``) when ``undirected``.

    ``major`` / ``minor``: ``(exponent, permutation)`` of the law of each end (node ``perm[rank]``).
    Each round draws as many pairs as are missing and keeps the new distinct ones, so the count
    never overshoots; repeats are a small fraction, so a few rounds suffice."""
    keys = np.empty(0, np.int64)  # sorted, distinct: a * n + b
    while keys.size < m:
        u, v = (perm[_zipf_ranks(rng, n, a, m - keys.size)] for a, perm in (major, minor))
        if undirected:
            u, v = np.minimum(u, v), np.maximum(u, v)
        new = _sorted_distinct((u * n + v)[u != v])
        if keys.size:
            at = np.searchsorted(keys, new).clip(max=keys.size - 1)
            new = new[keys[at] != new]
        keys = np.sort(np.concatenate([keys, new]), kind="stable")  # two sorted runs: a linear merge
    return np.divmod(keys, n)


def _sorted_distinct(x: np.ndarray) -> np.ndarray:
    # np.unique's hash-based path (NumPy 2.3+) is many times slower than a sort on 10^7 int64 keys
    x = np.sort(x)
    return x[np.concatenate([[True], x[1:] != x[:-1]])] if x.size else x


def _grid_edges(rng, n: int, m: int):
    """``m`` undirected edges of a grid of ``n`` nodes: a random spanning tree, then random grid edges."""
    cols = max(1, int(np.ceil(np.sqrt(n))))
    k = np.arange(1, n, dtype=np.int64)
    r, c = np.divmod(k, cols)
    # parent of node k: left (k - 1) or up (k - cols), at random where both exist
    up = (r > 0) & ((c == 0) | (rng.random(k.size) < 0.5))
    tree = np.stack([np.where(up, k - cols, k - 1), k], 1)
    left = np.stack([k[c > 0] - 1, k[c > 0]], 1)
    above = np.stack([k[r > 0] - cols, k[r > 0]], 1)
    grid = np.concatenate([left, above])
    key = grid[:, 0] * n + grid[:, 1]
    spare = grid[~np.isin(key, tree[:, 0] * n + tree[:, 1])]
    if m <= tree.shape[0]:
        edges = tree[np.sort(rng.choice(tree.shape[0], m, replace=False))]
    elif m - tree.shape[0] <= spare.shape[0]:
        extra = spare[np.sort(rng.choice(spare.shape[0], m - tree.shape[0], replace=False))]
        edges = np.concatenate([tree, extra])
    else:
        raise ValueError(f"Expected at most {len(grid)} road edges on {n} nodes. Got {m}.")
    # ids follow the rows with a local jitter (each node moves by a few places)
    new_id = np.empty(n, np.int64)
    new_id[np.argsort(np.arange(n) + rng.uniform(0, 8, n), kind="stable")] = np.arange(n)
    return new_id[edges[:, 0]], new_id[edges[:, 1]]


# -- locality to recover: shuffled ids, communities -----------------------------------------------------
def shuffle_ids(src, dst, num_nodes: int, *, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The same edges with the nodes renumbered by a random permutation: node ``k`` becomes ``perm[k]``. Whatever
    locality the ids had (neighbours with close ids, which keeps gathered rows in the cache) is hidden; the graph is
    the same up to that renumbering. ``int32`` arrays.

    Example::

        >>> s, d = shuffle_ids(np.array([0, 1, 2]), np.array([1, 2, 3]), 4, seed=0)
        >>> sorted(np.bincount(d, minlength=4)) == sorted(np.bincount([1, 2, 3], minlength=4))
        True
    """
    src, dst = np.asarray(src), np.asarray(dst)
    _check_counts(num_nodes, src.size)
    if src.ndim != 1 or src.shape != dst.shape:
        raise ValueError(f"Expected src and dst of one shape (E,). Got {src.shape} and {dst.shape}.")
    for name, ids in (("src", src), ("dst", dst)):
        if ids.size and (not np.issubdtype(ids.dtype, np.integer) or ids.min() < 0 or ids.max() >= num_nodes):
            raise ValueError(f"Expected {name} integer ids in [0, {num_nodes}). Got {ids.dtype} ids in "
                             f"[{ids.min()}, {ids.max()}].")  # fmt: skip
    perm = np.random.default_rng(seed).permutation(num_nodes)
    return perm[src].astype(np.int32), perm[dst].astype(np.int32)


def community_edges(
    num_nodes: int, num_edges: int, *, community_size: int = 1024, p_in: float = 0.9, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Edges of a graph of communities, node ids shuffled: locality that a reordering can recover.

    The nodes fall into communities of ``community_size`` (the last one smaller where it does not divide). Each
    edge's destination is uniform; its source is a node of the destination's community with probability ``p_in``,
    else uniform over the graph; no self-loops, no repeated edges (redrawn until the count is exact). The ids are
    then a random permutation of that numbering (:func:`shuffle_ids`), so as generated a node's in-neighbours are
    spread over the whole graph, while an order that puts each community together (``reorder(g, "clusters")``)
    brings most of them within ``community_size`` ids of it: the gathered rows then repeat in the cache, as in the
    real graphs' communities (papers citing within a field, friends within a region). ``reorder(g, "rcm")`` does not:
    the edges between communities make its band wide.

    Arguments:
        num_nodes, num_edges: the sizes (at most a quarter of the node pairs, and of each community's pairs for
            the edges drawn inside).
        community_size: nodes per community, at least 2.
        p_in: the fraction of edges drawn inside the destination's community, in ``[0, 1]``.
        seed: the random seed.

    Returns:
        ``(src, dst)``, ``int32``, in destination order of the numbering before the shuffle.

    Example::

        >>> src, dst = community_edges(4096, 32768, community_size=256, seed=0)
        >>> src.size, bool((src != dst).all())
        (32768, True)
    """
    _check_counts(num_nodes, num_edges)
    if isinstance(community_size, bool) or not isinstance(community_size, (int, np.integer)) or community_size < 2:
        raise ValueError(f"Expected community_size an int >= 2. Got {community_size!r}.")
    if isinstance(p_in, bool) or not isinstance(p_in, (int, float, np.integer, np.floating)) or not 0 <= p_in <= 1:
        raise ValueError(f"Expected p_in a number in [0, 1]. Got {p_in!r}.")
    p_in = float(p_in)
    size = min(int(community_size), num_nodes)
    most = min(num_nodes * (num_nodes - 1), num_nodes * (size - 1) / max(p_in, 1e-9)) // 4
    if num_edges > most:
        raise ValueError(
            f"Expected at most a quarter of the node pairs ({int(most)} edges on {num_nodes} nodes in communities of "
            f"{size}, p_in={p_in}). Got {num_edges}."
        )
    rng = np.random.default_rng(seed)
    keys = np.empty(0, np.int64)
    while keys.size < num_edges:  # draw, drop self-loops and repeats, draw again for the rest
        k = int((num_edges - keys.size) * 1.1) + 16
        dst = rng.integers(0, num_nodes, k)
        base = dst - dst % size
        inside = rng.random(k) < p_in
        span = np.minimum(size, num_nodes - base)  # the last community may be smaller
        src = np.where(inside, base + (rng.random(k) * span).astype(np.int64), rng.integers(0, num_nodes, k))
        new = (dst * num_nodes + src)[src != dst]
        keys = _sorted_distinct(np.concatenate([keys, new]))
    keys = np.sort(rng.choice(keys, num_edges, replace=False)) if keys.size > num_edges else keys
    dst, src = np.divmod(keys, num_nodes)
    return shuffle_ids(src, dst, num_nodes, seed=seed + 1)


def communities(num_nodes: int, num_edges: int, *, community_size: int = 1024, p_in: float = 0.9, seed: int = 0,
                **graph_kw) -> Graph:  # fmt: skip
    """A :class:`Graph` of :func:`community_edges`, named ``"synthetic communities"``; ``graph_kw`` go to
    :meth:`Graph.from_edges`."""
    src, dst = community_edges(num_nodes, num_edges, community_size=community_size, p_in=p_in, seed=seed)
    return Graph.from_edges(src, dst, num_nodes, name="synthetic communities", **graph_kw)
