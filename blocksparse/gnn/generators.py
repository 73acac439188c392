"""Synthetic graphs for tests and benchmarks (no downloads): power-law and R-MAT.

Every generated graph is *labelled synthetic* in its ``name`` (e.g.
``"synthetic power-law like ogbn-arxiv"``): only the node and edge counts match the named
dataset, not its structure.
"""

from __future__ import annotations

import numpy as np

from ._graph import Graph

__all__ = ["PAPER_GRAPHS", "power_law", "rmat", "synthetic", "power_law_edges", "rmat_edges"]

# (num_nodes, num_edges) of the graphs of Fomina et al., and "baseline": the benchmark graph of
# docs/benchmarks.md ("GNN operations").
PAPER_GRAPHS: dict[str, tuple[int, int]] = {
    "ogbn-arxiv": (169_343, 1_166_243),
    "ogbn-products": (2_449_029, 123_718_280),
    "pokec": (1_632_803, 30_622_564),
    "twitch-views": (168_114, 13_595_114),
    "city-roads-L": (142_257, 279_061),
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
