"""The ``gnn-graphs`` suite: every GNN op on the paper's graphs and the power-law graph, against every peer in the
process, and the reordering study.

Graphs: the stand-ins of :data:`blocksparse.gnn.PAPER_GRAPH_SPECS` (:func:`blocksparse.gnn.paper_graph_edges`: the
real node and edge counts and in-degree skew, at ``scale``) and ``power-law`` (:func:`blocksparse.gnn.power_law`,
262,144 nodes and 8,388,608 edges at scale 1: the graph of the ``gnn`` suite). Ops (:data:`OPS`): SpMM with
``reduce="sum"``, ``"mean"`` and the GCN norm (``norm="both"``), max and min aggregation, GATv2 (``H`` heads) and
graph attention (``q``, ``k``, ``v`` of ``H`` heads), each forward alone (``fwd``) and forward + backward w.r.t.
every input (``fwd+bwd``, the VJP of a fixed random cotangent), in each dtype and order (the graph as generated,
then :func:`blocksparse.gnn.reorder` by ``degree``, ``rcm`` or ``clusters``). Beside the full table's graphs, two
with locality to recover (:data:`LOCALITY_GRAPHS`) measure what a reordering gains where there is something to gain.

One cell measures, in one process, on the same inputs:

- ``bs.gnn`` as a user calls it, ``implementation=None`` (the cell's own ``loop_ms`` / ``calls_ms`` /
  ``implementation``; ``choice``: why :func:`blocksparse.ops.gnn.order.choice` picked that backend);
- each of its backends named (``pallas_*``, ``xla_*``: the measurements the tuned data of
  :mod:`blocksparse.ops.gnn.tuned` is made of; ``faster_backend`` says which won);
- the peers (:data:`PEERS`): ``segment``, XLA's sorted ``jax.ops.segment_*`` written as a JAX user writes them, in
  the features' dtype, and ``bcsr``, ``jax.experimental.sparse.BCSR`` times the features (SpMM ops); and those
  that ``peers=`` adds (``benchmarks/bench_gnn_graphs.py``: torch's cuSPARSE and PyG, timed in the same process).

Every result, gradients included, is checked against a float32 segment-op reference computed in chunks of
destination nodes (:func:`reference`; on a reordered graph, permuted alike): ours and our backends fail the cell
above the dtype's tolerance, a peer's error is recorded (``{peer}_rel_err``). ``speedup_vs_best_peer`` is the
fastest peer's time over ours (``best_peer`` names it; above 1: ours is faster); ``speedup_vs_segment`` the
segment ops' alone; ``gain`` the time as generated over the time reordered. A peer that runs out of device memory is
recorded as skipped with the reason. A cell whose first call shows that its timings would take more than
:data:`ROW_BUDGET_S` gets fewer iterations (:func:`capped_timer`; the slow peers: the ``E x H x D`` segment-op
attention, bfloat16 segment sums), recorded in ``iters`` / ``timer`` (``{name}_iters``); the full sizes only.

Labels are ``"<graph> <dtype> <order> <op> <pass>"``, so ``--filter`` selects a slice by any prefix of it
(``--filter "pokec bfloat16 as generated"``; repeated ``--filter``: any of them). docs/gnn.md ("The full table") has
the one run of every cell; :mod:`blocksparse.bench.gnn_table` makes its table from the JSON.
"""

from __future__ import annotations

import functools
import math
import time

import jax
import jax.numpy as jnp
import numpy as np

import blocksparse as bs

from ..ops.gnn import order as gnn_order
from ._core import Cell, CellFailed, CellSkipped, Timer, check_close, implementation, ratio, tolerance

#: Seconds a cell's timings may take (both timings, warm-up and trials) before it gets fewer iterations.
ROW_BUDGET_S = 20.0
#: A peer (:data:`PEERS`) whose one call was over the budget and at least this many times another peer's time in the
#: same cell is not run again for the same family of ops (SpMM's three, max and min, each attention) in the same dtype
#: on that graph or on any graph of more edges (``{peer}_skipped`` names the cell that timed it; a resumed run learns
#: it from the cells it keeps): JAX's BCSR product takes 10 to 20 s a call in bfloat16 on the large graphs, where the
#: others take milliseconds, and its time grows with the edges. It can never have been the fastest peer there.
SLOW_PEER_RATIO = 100.0

#: The graphs: the paper's stand-ins and the power-law graph (its sizes at scale 1).
POWER_LAW = dict(nodes=262_144, edges=8_388_608)
GRAPHS = ("city-roads-L", "ogbn-arxiv", "twitch-views", "pokec", "ogbn-products", "power-law")
#: The order a full run measures them in: fewest edges first, so a run cut short holds the most graphs, and a peer too
#: slow on one graph is known before the larger ones (:data:`SLOW_PEER_RATIO`). Tables list them as :data:`GRAPHS`.
RUN_ORDER = ("city-roads-L", "ogbn-arxiv", "power-law", "twitch-views", "pokec", "ogbn-products")
#: Graphs with locality to recover, for the reorderings (not in the full table): city-roads-L with its ids shuffled
#: (``paper_graph_edges(..., shuffle=True)``: a grid), and communities of 1,024 nodes with shuffled ids
#: (:func:`blocksparse.gnn.community_edges`, 90% of the edges inside; features of 512 MB, ten times the L2).
COMMUNITIES = dict(nodes=1_048_576, edges=16_777_216, community_size=1024, p_in=0.9)
LOCALITY_GRAPHS = ("city-roads-L-shuffled", "communities")
#: The orders a cell can take: the graph as generated, then :func:`blocksparse.gnn.reorder`'s methods.
ORDERS = ("as generated", "degree", "rcm", "clusters")
#: The ops: SpMM (sum, mean, GCN norm), max and min, GATv2 and graph attention.
OPS = ("spmm_sum", "spmm_mean", "spmm_gcn", "max", "min", "gatv2", "graph_attention")
PASSES = ("fwd", "fwd+bwd")
#: The peers every cell runs in-process (JAX); ``peers=`` adds others.
PEERS = ("segment", "bcsr")
#: Our own backends, each named (not peers).
BACKENDS = ("pallas", "xla")
_SPMM = {"spmm_sum": dict(reduce="sum"), "spmm_mean": dict(reduce="mean"), "spmm_gcn": dict(reduce="sum", norm="both")}
_FAMILY = {**dict.fromkeys(_SPMM, "spmm"), "max": "aggregate", "min": "aggregate", "gatv2": "gatv2",
           "graph_attention": "graph_attention"}  # fmt: skip

SIZES = {
    # the new ops and the backward of the small ones (the rest: test_gnn_graphs_suite's slow test)
    "tiny": dict(graphs=("ogbn-arxiv",), edges=3000, dtypes=("float32",), orders=("as generated",), feat=16, heads=2,
                 ops=("spmm_gcn", "min", "graph_attention"), passes=("fwd+bwd",)),
    "quick": dict(graphs=("ogbn-arxiv",), edges=6000, dtypes=("float32",), orders=("as generated",), feat=32,
                  heads=4, ops=OPS, passes=PASSES),
    "full": dict(graphs=RUN_ORDER, edges=None, dtypes=("float32", "bfloat16"), orders=("as generated", "degree", "rcm"),
                 feat=128, heads=8, ops=OPS, passes=PASSES, budget_s=ROW_BUDGET_S),
}  # fmt: skip

COLUMNS = (
    ("loop ms", "loop_ms", ".4g"),
    ("calls ms", "calls_ms", ".4g"),
    ("pallas ms", "pallas_loop_ms", ".4g"),
    ("xla ms", "xla_loop_ms", ".4g"),
    ("best peer ms", "best_peer_ms", ".4g"),
    ("best peer", "best_peer", ""),
    ("x best peer", "speedup_vs_best_peer", ".3g"),
    ("gain", "gain", ".3g"),
    ("rel err", "rel_err", ".2g"),
)

#: RCM or the clusters on the host above this many edges take more than about 30 s: those cells are skipped.
RCM_MAX_EDGES = 40_000_000
#: Edges per chunk of destination nodes in :func:`reference`.
REFERENCE_CHUNK_EDGES = 1 << 23


def measure_copy_rate(nbytes: int = 2**30, timer: Timer | None = None) -> float:
    """Bytes a second this device copies its memory at: a float32 array of ``nbytes`` negated in one jitted loop
    (read and written, both counted; the median of ``timer``'s trials). The price of the bytes an op must move,
    which :mod:`~blocksparse.bench.gnn_table` sets each miss against; a run records it in ``meta``."""
    x = jnp.ones((nbytes // 4,), jnp.float32)
    ms = (timer or Timer(iters=20, trials=5)).loop(jnp.negative, x)
    return 2 * x.nbytes / (ms * 1e-3)


def capped_iters(iters: int, calls_per_iter: int, first_s: float, budget_s: float) -> int:
    """At most ``iters``, as many as fit ``budget_s`` at ``first_s`` per call (``calls_per_iter`` calls each); >= 1."""
    return int(max(1, min(iters, budget_s // max(first_s * calls_per_iter, 1e-9))))


def capped_timer(timer: Timer, first_s: float, budget_s: float) -> Timer:
    """``timer``, or one with fewer iterations if :meth:`Timer.loop` and :meth:`Timer.calls` would take more than
    ``budget_s`` at ``first_s`` per call (down to one timed call each, without warm-up)."""
    per_iter = 2 * (timer.warmup + timer.trials)  # loop and calls: warm-up and timed trials, iters calls each
    iters = capped_iters(timer.iters, per_iter, first_s, budget_s)
    if iters == timer.iters:
        return timer
    if per_iter * first_s > budget_s:  # even one iteration per trial is too long: one timed call, no warm-up
        return Timer(iters=1, trials=1, warmup=0)
    return Timer(iters=iters, trials=timer.trials, warmup=timer.warmup)


def timed(
    timer: Timer, fn, args, budget_s: float | None, *, want, tol, dtype, what: str, prefix: str = "", calls: bool = True
) -> dict:
    """:func:`~blocksparse.bench.measure` with one compilation of ``fn``: ``{prefix}loop_ms``, ``{prefix}calls_ms``,
    ``{prefix}implementation``, ``{prefix}rel_err`` against ``want`` (``CellFailed`` above ``tol``); with
    ``budget_s`` (the full sizes) also ``{prefix}iters`` (:func:`capped_timer` of one warm call) and
    ``{prefix}mem_bytes`` (the compiled program's temporaries and output, where the backend says); a first call
    longer than ``budget_s`` by itself is the timing (``{prefix}timer`` ``"one call"``: its wall time, no loop
    compiled and run; jax.experimental.sparse's BCSR product takes 10 to 20 s a call in bfloat16 on the large
    graphs, and about 9 times that on ogbn-products). ``calls=False``:
    no ``{prefix}calls_ms`` (the baselines are compared by device time, ``loop_ms``). Where the wall time goes:
    ``{prefix}first_call_s`` (compiling ``fn`` and one call) and ``{prefix}timing_s`` (the timings, the timed
    loop's compilation included); a cell adds ``prepare_s`` (its inputs and reference) and ``peers_s``.

    ``fn`` is compiled ahead of its first call (inside :func:`blocksparse.dispatch_log`), so that call, checked
    against ``want``, is timed without its compilation: over the budget it is the only call; under it a second call
    (without the first's one-time costs) caps the iterations. The timings reuse its trace and compilation
    (``jax.jit`` of the same function), so a large graph's program (its index arrays compiled in, or passed as
    arguments: ``meta["jax_constants"]``) is compiled once per timing method, not three times."""
    from ..ops import dispatch_log

    jitted = jax.jit(fn)
    t0 = time.perf_counter()
    with dispatch_log() as log:
        compiled = jitted.lower(*args).compile()  # with the graph's index arrays (constants or arguments)
    start = time.perf_counter()
    got = jax.block_until_ready(compiled(*args))
    first_s = time.perf_counter() - start  # one call alone
    first_call_s = time.perf_counter() - t0
    pairs = zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True)
    errs = [check_close(g, w, dtype=dtype, tol=tol, what=f"{what} [{i}]" if i else what)
            for i, (g, w) in enumerate(pairs)]  # fmt: skip
    out = {f"{prefix}rel_err": max(errs), f"{prefix}implementation": implementation(log),
           f"{prefix}first_call_s": first_call_s}  # fmt: skip
    t = timer
    if budget_s is not None:
        try:
            m = compiled.memory_analysis()
            out[f"{prefix}mem_bytes"] = int(m.temp_size_in_bytes + m.output_size_in_bytes)
        except Exception:  # noqa: BLE001 - a backend without the analysis: the bytes are unknown
            pass
        if first_s > budget_s:  # one call is over the budget (a peer taking seconds): that call is the timing
            out.update({f"{prefix}loop_ms": first_s * 1e3, f"{prefix}timer": "one call", f"{prefix}iters": 1})
            if calls:
                out[f"{prefix}calls_ms"] = first_s * 1e3
            return out
        # a second call, without the first's one-time costs (the graph's arrays uploaded, the modules loaded),
        # caps the iterations
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        t = capped_timer(timer, time.perf_counter() - start, budget_s)
        out[f"{prefix}iters"] = t.iters
    t0 = time.perf_counter()
    out[f"{prefix}loop_ms"] = t.loop(fn, *args)
    if calls:
        out[f"{prefix}calls_ms"] = t.calls(fn, *args)
    out[f"{prefix}timing_s"] = time.perf_counter() - t0  # the timed loop's compilation included
    if t is not timer:
        out[f"{prefix}timer"] = repr(t)
    return out


def cells(*, full: bool) -> list[Cell]:
    return suite(**SIZES["full" if full else "quick"])


def label(graph: str, dtype: str, order: str, op: str, pass_: str) -> str:
    """A cell's label: ``--filter`` selects by any prefix of it."""
    return f"{graph} {dtype} {order} {op} {pass_}"


def suite(
    *, graphs, edges, dtypes, orders, feat, heads, ops=OPS, passes=PASSES, seed: int = 0,
    rcm_max_edges: int = RCM_MAX_EDGES, budget_s: float | None = None, scale: float | None = None, peers=(),
) -> list[Cell]:  # fmt: skip
    """``edges``: about this many edges per graph (a scale per graph); ``None``: the paper's sizes, or ``scale``
    for every graph. ``budget_s``: see :func:`capped_timer` (``None``: every cell takes the run's timer). ``peers``:
    more peers, each ``peer(case) -> metrics`` (:class:`Case`; keys ``{name}_loop_ms``, ``{name}_rel_err`` or
    ``{name}_skipped``)."""
    checks = (("graph", graphs, GRAPHS + LOCALITY_GRAPHS), ("op", ops, OPS), ("pass", passes, PASSES),
              ("order", orders, ORDERS))  # fmt: skip
    for what, got, known in checks:
        bad = [v for v in got if v not in known]
        if bad:
            raise ValueError(f"Expected each {what} in {list(known)}. Got {bad}.")
    shared: dict = {}  # (graph, dtype, op, pass) -> loop ms as generated, for the reordered cells' gain
    out = []
    for name in graphs:
        sc = scale if scale is not None and edges is None else scale_for(name, edges)
        prep = functools.partial(prepared, name, scale=sc, feat=feat, heads=heads, seed=seed,
                                 rcm_max_edges=rcm_max_edges)  # fmt: skip
        for dtype in dtypes:
            for op in ops:
                for pass_ in passes:
                    for order in orders:  # innermost: the reordered cells reuse the reference as generated
                        params = dict(graph=name, op=op, dtype=dtype, **{"pass": pass_}, order=order, feat=feat,
                                      heads=heads, scale=sc)  # fmt: skip
                        run = _run(prep, dtype, order, op, pass_, shared, budget_s, tuple(peers))
                        run.prepare = prep  # the peer script's cells share the prepared graph
                        restore = None
                        if order == "as generated":  # a resumed run keeps the reordered cells' baseline
                            restore = functools.partial(_restore, shared, (name, dtype, op, pass_))
                        out.append(Cell("gnn-graphs", label(name, dtype, order, op, pass_), params, run, restore))
    return out


def _restore(shared: dict, key: tuple, metrics: dict) -> None:
    """A kept cell as generated: its times, the baseline of the same cell reordered (``gain``), and the peers it
    found too slow to run again (:data:`SLOW_PEER_RATIO`)."""
    if "loop_ms" in metrics:
        shared[key] = (metrics["loop_ms"], metrics.get("segment_loop_ms"))
    if "edges" in metrics:
        _note_slow_peers(shared, key, metrics, metrics["edges"])


def _note_slow_peers(shared: dict, key: tuple, out: dict, edges: int) -> None:
    """Record in ``shared`` each peer of cell ``key`` ``(graph, dtype, op, pass)`` (a graph of ``edges`` edges) that
    one call over the budget timed at :data:`SLOW_PEER_RATIO` times another peer's time or more (ours and our
    backends' do not count: a cell keeps a peer to compare with), for the other cells of the op's family in the dtype
    on graphs of as many edges or more (:func:`_slow_peer`; the graph of fewest edges that showed it is kept)."""
    graph, dtype, op, pass_ = key
    dtype = jnp.dtype(dtype).name
    own = {f"{b}_loop_ms" for b in BACKENDS}
    times = {k[: -len("_loop_ms")]: v for k, v in out.items() if k.endswith("_loop_ms") and k not in own and v}
    for name in PEERS:
        ms = times.get(name)
        others = [v for k, v in times.items() if k != name]
        if not ms or not others or out.get(f"{name}_timer") != "one call":
            continue
        best = min(others)
        if ms >= SLOW_PEER_RATIO * best:
            where = label(graph, dtype, "as generated", op, pass_)
            why = f"one call took {ms / 1e3:.1f} s in {where!r}, {ms / best:.0f} times the fastest other peer's"
            slot = ("slow", dtype, _FAMILY[op], name)
            if slot not in shared or edges < shared[slot][0]:
                shared[slot] = (int(edges), why)


def _slow_peer(shared: dict, edges: int, dtype, op: str, name: str) -> str | None:
    """Why peer ``name`` is not run for ``op`` in ``dtype`` on a graph of ``edges`` edges (:func:`_note_slow_peers`:
    it was too slow on a graph of as many edges or fewer), else ``None``."""
    noted = shared.get(("slow", jnp.dtype(dtype).name, _FAMILY[op], name))
    if noted is None or noted[0] > edges:
        return None
    more = f" (a graph of {noted[0]:,} edges; this one has {edges:,})" if noted[0] < edges else ""
    return f"too slow to run again: {noted[1]}{more}"


def _spec(name: str) -> dict:
    if name == "power-law":
        return dict(POWER_LAW, symmetric=False)
    if name == "communities":
        return dict(COMMUNITIES, symmetric=False)
    return bs.gnn.PAPER_GRAPH_SPECS[name.removesuffix("-shuffled")]


def scale_for(name: str, edges: int | None) -> float:
    """The generator's scale giving about ``edges`` edges, with at least 8 x the mean degree nodes (``None``: 1)."""
    if edges is None:
        return 1.0
    spec = _spec(name)
    mean_degree = spec["edges"] * (2 if spec["symmetric"] else 1) / spec["nodes"]
    return min(1.0, max(edges / spec["edges"], 8 * mean_degree / spec["nodes"]))


def graph(name: str, scale: float = 1.0, seed: int = 0) -> bs.gnn.Graph:
    """Graph ``name`` of :data:`GRAPHS` or :data:`LOCALITY_GRAPHS` at ``scale``."""
    if name in ("power-law", "communities"):
        n, e = (max(1, round(_spec(name)[k] * scale)) for k in ("nodes", "edges"))
        if name == "power-law":
            return bs.gnn.power_law(n, e, seed=seed)
        c = COMMUNITIES
        return bs.gnn.communities(n, e, community_size=min(c["community_size"], n), p_in=c["p_in"], seed=seed)
    paper = name.removesuffix("-shuffled")
    src, dst, n = bs.gnn.paper_graph_edges(paper, scale=scale, seed=seed, shuffle=paper != name)
    kind = "jittered grid" if bs.gnn.PAPER_GRAPH_SPECS[paper].get("grid") else "degree-matched"
    shuffled = ", ids shuffled" if paper != name else ""
    return bs.gnn.Graph.from_edges(src, dst, n, name=f"synthetic {kind} like {paper}{shuffled}")


class Prepared:
    """One generated graph, its reorderings, per dtype the inputs, and the float32 reference of the last
    ``(dtype, op, pass)`` asked for (built lazily: the large graphs hold one at a time)."""

    def __init__(self, name, scale, feat, heads, seed, rcm_max_edges=RCM_MAX_EDGES):
        self.graph = graph(name, scale, seed)
        self.name, self.feat, self.heads, self.seed, self.rcm_max_edges = name, feat, heads, seed, rcm_max_edges
        self._orders: dict = {"as generated": (self.graph, None)}
        self._inputs: dict = {}
        self._ref: dict = {}

    def order(self, order: str):
        """``(graph, permutation or None)`` in that order."""
        if order not in self._orders:
            if order in ("rcm", "clusters") and self.graph.num_edges > self.rcm_max_edges:
                raise NotImplementedError(
                    f"{order}: {self.graph.num_edges:,} edges > rcm_max_edges={self.rcm_max_edges:,} (the order on "
                    "the host would take more than about 30 s)"
                )
            self._orders[order] = bs.gnn.reorder(self.graph, order)
        return self._orders[order]

    def inputs(self, dtype: str) -> dict:
        """``x (N, F)``, ``xd``, ``v`` and the cotangent ``ct`` ``(N, H, D)``, ``att (H, D)``, in ``dtype``."""
        if dtype not in self._inputs:
            n, h, d = self.graph.num_nodes, self.heads, self.feat // self.heads
            keys = jax.random.split(jax.random.key(self.seed), 5)
            normal = lambda k, shape: jax.random.normal(k, shape, jnp.float32)  # noqa: E731
            self._inputs[dtype] = dict(
                x=normal(keys[0], (n, self.feat)).astype(dtype), xd=normal(keys[1], (n, h, d)).astype(dtype),
                att=(normal(keys[2], (h, d)) / d**0.5).astype(dtype), ct=normal(keys[3], (n, h, d)).astype(dtype),
                v=normal(keys[4], (n, h, d)).astype(dtype),
            )  # fmt: skip
        return self._inputs[dtype]

    def reference(self, dtype: str, op: str, pass_: str) -> tuple:
        """The float32 reference of ``op`` (and its gradients with ``fwd+bwd``) on the graph as generated."""
        key = (dtype, op, pass_)
        if key not in self._ref:
            self._ref.clear()
            self._ref[key] = reference(self.graph, operands(op, self.inputs(dtype)), self.inputs(dtype)["ct"], op,
                                       pass_ == "fwd+bwd", REFERENCE_CHUNK_EDGES)  # fmt: skip
        return self._ref[key]

    def data(self, dtype: str, order: str, op: str, pass_: str):
        """``(graph, operands, cotangent, reference)`` of ``op`` in ``order``."""
        ins = self.inputs(dtype)
        ref = self.reference(dtype, op, pass_)
        go, perm = self.order(order)
        args, ct = operands(op, ins), ins["ct"]
        if perm is None:
            return go, args, ct, ref
        p = jnp.asarray(perm)
        node = _node_indexed(op, pass_ == "fwd+bwd")
        args = tuple(a if op == "gatv2" and i == 2 else a[p] for i, a in enumerate(args))  # att: not per node
        return go, args, ct[p], tuple(r[p] if is_node else r for r, is_node in zip(ref, node, strict=True))


def operands(op: str, ins: dict) -> tuple:
    """The arrays ``op`` takes, from :meth:`Prepared.inputs`: ``(x,)``; ``(x_src, x_dst, att)``; ``(q, k, v)``."""
    x, xd = ins["x"], ins["xd"]
    if op == "gatv2":
        return x.reshape(xd.shape), xd, ins["att"]
    if op == "graph_attention":
        return xd, x.reshape(xd.shape), ins["v"]
    return (x,)


def _node_indexed(op: str, grad: bool) -> tuple[bool, ...]:
    """Which of the reference's arrays (output, then gradients) have a row per node."""
    if not grad:
        return (True,)
    return (True, True, True, False) if op == "gatv2" else (True,) * (4 if op == "graph_attention" else 2)


_LAST: dict = {}  # the one graph kept: cells run graph by graph, and the large ones do not fit together


def prepared(
    name: str, *, scale: float, feat: int, heads: int, seed: int = 0, rcm_max_edges: int = RCM_MAX_EDGES
) -> Prepared:
    """The :class:`Prepared` graph ``name`` (the last one asked for is kept; asking for another drops it)."""
    key = (name, scale, feat, heads, seed, rcm_max_edges)
    if key not in _LAST:
        _LAST.clear()
        jax.clear_caches()  # compiled programs hold the previous graph's index arrays (constants or arguments)
        _LAST[key] = Prepared(name, scale, feat, heads, seed, rcm_max_edges)
    return _LAST[key]


# -- the segment-op formulations: the reference (float32, masked) and the peer (the features' dtype) -------------
def _leaky(z, slope=0.2):
    return jnp.where(z > 0, z, slope * z)


def _segment_softmax(e, vals, dst, n, valid=None):
    """``out[i] = sum_{e -> i} softmax_e(e) vals[e]`` per head over sorted ``dst``; ``valid`` masks padding."""
    if valid is None:
        top = jax.ops.segment_max(e, dst, n, indices_are_sorted=True)
        a = jnp.exp(e - jax.lax.stop_gradient(top)[dst])
    else:
        v = valid[:, None]
        top = jax.ops.segment_max(jnp.where(v, e, -jnp.inf), dst, n, indices_are_sorted=True)
        top = jax.lax.stop_gradient(jnp.where(jnp.isfinite(top), top, 0.0))
        a = jnp.where(v, jnp.exp(jnp.where(v, e, 0.0) - top[dst]), 0.0)
    den = jax.ops.segment_sum(a, dst, n, indices_are_sorted=True)
    alpha = a / jnp.where(den > 0, den, 1.0)[dst]
    return jax.ops.segment_sum(alpha[..., None] * vals, dst, n, indices_are_sorted=True)


def segment_gatv2(xs, xd, att, src, dst, n, valid=None):
    """GATv2 over sorted edges ``src -> dst`` with segment ops; ``valid`` masks padding edges."""
    e = jnp.sum(_leaky(xs[src] + xd[dst]) * att, -1)  # (E, H)
    return _segment_softmax(e, xs[src], dst, n, valid)


def segment_dot(q, k, v, src, dst, n, valid=None):
    """Graph (dot-product) attention over sorted edges ``src -> dst``, scale ``1 / sqrt(D)``."""
    e = jnp.sum(q[dst] * k[src], -1) / jnp.sqrt(jnp.float32(q.shape[-1])).astype(q.dtype)
    return _segment_softmax(e, v[src], dst, n, valid)


def _scales(op, indeg, outdeg, dtype):
    """``(per source, per destination)`` factors of an SpMM op (``None``: 1)."""
    inv = lambda d, p: (jnp.maximum(d, 1).astype(jnp.float32) ** -p).astype(dtype)  # noqa: E731
    if op == "spmm_mean":
        return None, inv(indeg, 1.0)
    if op == "spmm_gcn":
        return inv(outdeg, 0.5), inv(indeg, 0.5)
    return None, None


def segment_op(op, args, src, dst, n, indeg, outdeg, valid=None):
    """``op`` on edges ``src -> dst`` (sorted by ``dst``) with XLA's segment ops, in the arrays' dtype; ``valid``
    masks padding edges (the reference's chunks)."""
    if op == "gatv2":
        return segment_gatv2(*args, src, dst, n, valid)
    if op == "graph_attention":
        return segment_dot(*args, src, dst, n, valid)
    (x,) = args
    rows = x[src]
    if op in ("max", "min"):
        fill = -jnp.inf if op == "max" else jnp.inf
        red = jax.ops.segment_max if op == "max" else jax.ops.segment_min
        if valid is not None:
            rows = jnp.where(valid[:, None], rows, fill)
        top = red(rows, dst, n, indices_are_sorted=True)
        has = indeg > 0 if valid is None else jax.ops.segment_sum(valid.astype(jnp.int32), dst, n) > 0
        return jnp.where(has[:, None], top, jnp.zeros((), x.dtype))
    left, right = _scales(op, indeg, outdeg, x.dtype)
    if left is not None:
        rows = rows * left[src][:, None]
    if valid is not None:
        rows = jnp.where(valid[:, None], rows, 0)
    out = jax.ops.segment_sum(rows, dst, n, indices_are_sorted=True)
    return out if right is None else out * right[:, None]


def _extreme_grad(op, x, src, dst, n, valid, ct):
    """The max / min gradient as the op routes it: each (node, feature) to its first in-edge (CSR order) holding
    the extreme."""
    top = segment_op(op, (x,), src, dst, n, None, None, valid)
    pos = jnp.arange(src.shape[0], dtype=jnp.int32)[:, None]
    win = jnp.where(valid[:, None] & (x[src] == top[dst]), pos, jnp.int32(2**31 - 1))
    first = jax.ops.segment_min(win, dst, n, indices_are_sorted=True)
    hit = valid[:, None] & (pos == first[dst])
    return top, jax.ops.segment_sum(jnp.where(hit, ct[dst], 0.0), src, n)


@functools.partial(jax.jit, static_argnames=("n", "op", "grad"), donate_argnums=(0,))
def _reference_chunk(acc, args, ct, src, dst, valid, indeg, outdeg, *, n, op, grad):
    args, ct = tuple(a.astype(jnp.float32) for a in args), ct.astype(jnp.float32)
    if op in ("max", "min"):
        ct2 = ct.reshape(args[0].shape)
        new = _extreme_grad(op, args[0], src, dst, n, valid, ct2) if grad else (
            segment_op(op, args, src, dst, n, indeg, outdeg, valid),)  # fmt: skip
    else:
        fn = lambda *a: segment_op(op, a, src, dst, n, indeg, outdeg, valid)  # noqa: E731
        if grad:
            out, vjp = jax.vjp(fn, *args)
            new = (out, *vjp(ct.reshape(out.shape)))
        else:
            new = (fn(*args),)
    return tuple(a + b for a, b in zip(acc, new, strict=True))


def reference(g, args, ct, op: str, grad: bool, chunk_edges: int) -> tuple:
    """The float32 segment-op result of ``op`` on graph ``g`` (and with ``grad`` the gradients of
    ``sum(out * ct)`` w.r.t. each of ``args``), as a tuple.

    Destination nodes are cut into ranges of at most ``chunk_edges`` in-edges (padded to one static size, so
    one compilation): a node's output depends only on its in-edges, and the gradients are sums over the ranges
    (max / min: routed to the first in-edge, in CSR order, holding the extreme, as the op routes them)."""
    n = g.num_nodes
    cap = max(chunk_edges if g.num_edges > chunk_edges else g.num_edges, g.max_in_degree, 1)
    shapes = [jnp.shape(args[0] if op not in ("gatv2", "graph_attention") else ct)] + (
        [jnp.shape(a) for a in args] if grad else [])  # fmt: skip
    acc = tuple(jnp.zeros(s, jnp.float32) for s in shapes)
    indeg, outdeg = jnp.asarray(g.in_degree), jnp.asarray(g.out_degree)
    start = 0
    while start < n:
        end = max(start + 1, int(np.searchsorted(g.indptr, g.indptr[start] + cap, side="right")) - 1)
        lo, hi = int(g.indptr[start]), int(g.indptr[end])
        src = np.zeros(cap, np.int32)
        dst = np.full(cap, n - 1, np.int32)  # padding at the last node keeps the ids sorted
        src[: hi - lo], dst[: hi - lo] = g.indices[lo:hi], g.dst_sorted[lo:hi]
        valid = np.arange(cap) < hi - lo
        with jax.default_matmul_precision("highest"):
            acc = _reference_chunk(acc, tuple(args), ct, src, dst, valid, indeg, outdeg, n=n, op=op, grad=grad)
        start = end
    return acc


# -- what a cell times ------------------------------------------------------------------------------------------
def ours(go, op: str, implementation=None):
    """``bs.gnn``'s ``op`` on graph ``go`` as a function of :func:`operands`."""
    kw = dict(implementation=implementation)
    if op in _SPMM:
        return lambda x: bs.gnn.spmm(go, x, **_SPMM[op], **kw)
    if op in ("max", "min"):
        return lambda x: bs.gnn.aggregate(go, x, op, **kw)
    if op == "gatv2":
        return lambda xs, xd, att: bs.gnn.gatv2(go, xs, xd, att, **kw)
    return lambda q, k, v: bs.gnn.graph_attention(go, q, k, v, **kw)


def with_grad(fn, count: int):
    """``f(*operands, ct, *rest) -> (out, *d operands)``: ``fn``'s output and the VJP of ``ct`` w.r.t. its first
    ``count`` arguments."""

    def fb(*args):
        ins, ct, rest = args[:count], args[count], args[count + 1 :]
        out, vjp = jax.vjp(lambda *p: fn(*p, *rest), *ins)
        return (out, *vjp(ct.astype(out.dtype).reshape(out.shape)))

    return fb


def _bcsr(op, n):
    from jax.experimental import sparse

    def fn(x, data, indices, indptr):
        return sparse.BCSR((data, indices, indptr), shape=(n, n)) @ x

    return fn


def functions(go, args, ct, op: str, pass_: str) -> dict:
    """``{name: (fn, arrays)}`` of a cell: ``ours``, our backends (:data:`BACKENDS`) and the peers (:data:`PEERS`;
    ``bcsr`` for the SpMM ops only), each on graph ``go``, forward or forward + backward."""
    n, grad = go.num_nodes, pass_ == "fwd+bwd"
    count = len(args)
    wrap = (lambda f: with_grad(f, count)) if grad else (lambda f: f)
    tail = (ct,) if grad else ()
    out = {"ours": (wrap(ours(go, op)), (*args, *tail))}
    for name in BACKENDS:
        out[name] = (wrap(ours(go, op, name)), (*args, *tail))
    src, dst = jnp.asarray(go.indices), jnp.asarray(go.dst_sorted)
    indeg, outdeg = jnp.asarray(go.in_degree), jnp.asarray(go.out_degree)
    seg = lambda *a: segment_op(op, a[:count], *a[count : count + 2], n, *a[count + 2 :])  # noqa: E731
    out["segment"] = (wrap(seg), (*args, *tail, src, dst, indeg, outdeg))
    if op in _SPMM:
        dtype = args[0].dtype
        left, right = _scales(op, indeg, outdeg, dtype)
        data = jnp.ones(go.num_edges, dtype)
        if left is not None:
            data = data * left[src]
        if right is not None:
            data = data * right[dst]
        out["bcsr"] = (wrap(_bcsr(op, n)), (*args, *tail, data, src, jnp.asarray(go.indptr)))
    return out


class Case:
    """What a ``peers=`` function gets: the cell's graph, operands, cotangent, reference and timer.

    Attributes:
        graph_name, op, pass_, dtype, order: the cell's parameters.
        go: the graph in the cell's order; args: the op's operands (:func:`operands`); ct: the cotangent;
        want: the float32 reference (output, then each operand's gradient with ``fwd+bwd``); timer: the run's.
    """

    def __init__(self, **kw):
        self.__dict__.update(kw)


def choice_reason(go, op: str, feat: int, dtype, pass_: str) -> str:
    """Why ``implementation=None`` runs what it runs for ``op`` (:func:`blocksparse.ops.gnn.order.choice`): SpMM's
    backward is a forward product over ``go.T``, chosen by ``go.T``'s degrees; the others by the pass."""
    family = _FAMILY[op]
    if family == "spmm":
        fwd = gnn_order.choice(family, gnn_order.graph_stats(go), feat, dtype, "fwd").reason
        if pass_ == "fwd":
            return fwd
        bwd = gnn_order.choice(family, gnn_order.graph_stats(go, transpose=True), feat, dtype, "fwd").reason
        return f"forward: {fwd}; backward (over the transpose): {bwd}"
    return gnn_order.choice(family, gnn_order.graph_stats(go), feat, dtype, pass_).reason


def _out_of_memory(e: Exception) -> bool:
    return "RESOURCE_EXHAUSTED" in str(e) or "out of memory" in str(e).lower()


def _ran_only(log: str, name: str) -> bool:
    """Whether an :func:`~blocksparse.bench.implementation` summary (``"gatv2: pallas, gatv2_bwd: pallas"``) names
    only backend ``name``."""
    return all(part.split(": ")[-1] == name for part in log.split(", "))


def _skip_reason(e: Exception) -> str:
    """``refused: ...`` (a backend's ``NotImplementedError``), ``out of device memory: ...`` or ``failed: ...``."""
    why = "refused" if isinstance(e, NotImplementedError) else "out of device memory" if _out_of_memory(e) else "failed"
    return f"{why}: " + " ".join(f"{type(e).__name__}: {e}".split())[:300]


def _run(prep, dtype, order, op, pass_, shared, budget_s, peers):
    def run(timer: Timer) -> dict:
        t0 = time.perf_counter()
        p = prep()
        if budget_s is not None:  # the full sizes: each program holds the graph's index arrays: one cell's at a time
            jax.clear_caches()
            timer._loops.clear()
        try:
            go, args, ct, want = p.data(dtype, order, op, pass_)
        except NotImplementedError as e:
            raise CellSkipped(str(e)) from None
        jax.block_until_ready(want)
        prepare_s = time.perf_counter() - t0  # the graph (in its first cell), the inputs and the float32 reference
        fns = functions(go, args, ct, op, pass_)
        check = dict(want=want, tol=tolerance(dtype) if jnp.dtype(dtype) != jnp.float32 else None, dtype=dtype)
        what = f"{op} {pass_} on {p.name} ({order})"
        fn, arrays = fns["ours"]
        out = timed(timer, fn, arrays, budget_s, what=what, **check)
        out["choice"] = choice_reason(go, op, math.prod(args[0].shape[1:]), dtype, pass_)
        for name in (*BACKENDS, *PEERS):
            if name not in fns:
                continue
            if name in BACKENDS and _ran_only(out["implementation"], name):
                # the default ran this backend alone: the same kernels, already timed (one compilation less of a
                # large graph's index arrays)
                copied = ("loop_ms", "rel_err", "iters", "mem_bytes", "timer")
                out.update({f"{name}_{k}": out[k] for k in copied if k in out})
                out[f"{name}_implementation"] = out["implementation"]
                out[f"{name}_is_default"] = True
                continue
            if name in PEERS and (why := _slow_peer(shared, p.graph.num_edges, dtype, op, name)):
                out[f"{name}_skipped"] = why
                continue
            fn, arrays = fns[name]
            # our backends must agree with the reference; a peer's error is recorded, never a failure (in bfloat16
            # JAX's segment ops accumulate in bfloat16)
            tol = dict(check) if name in BACKENDS else dict(check, tol=float("inf"))
            try:
                out.update(timed(timer, fn, arrays, budget_s, what=f"{what} [{name}]", prefix=f"{name}_", calls=False,
                                 **tol))  # fmt: skip
            except CellFailed:
                raise
            except Exception as e:  # noqa: BLE001 - a backend refusing the input; a peer out of memory or failing
                if not (isinstance(e, NotImplementedError) or _out_of_memory(e) or name in PEERS):
                    raise
                out[f"{name}_skipped"] = _skip_reason(e)
        case = Case(graph_name=p.name, op=op, pass_=pass_, dtype=dtype, order=order, go=go, args=args, ct=ct,
                    want=want, timer=timer)  # fmt: skip
        t0 = time.perf_counter()
        for peer in peers:
            out.update(peer(case))
        out["peers_s"], out["prepare_s"] = time.perf_counter() - t0, prepare_s  # where a cell's seconds go
        _summarise(out)
        key = (p.name, dtype, op, pass_)
        if order == "as generated":
            shared[key] = (out["loop_ms"], out.get("segment_loop_ms"))
            _note_slow_peers(shared, key, out, p.graph.num_edges)
        elif key in shared:
            base, seg = shared[key]
            out["gain"] = base / out["loop_ms"]
            if seg and out.get("segment_loop_ms"):
                out["segment_gain"] = seg / out["segment_loop_ms"]
        g = p.graph
        out.update(nodes=g.num_nodes, edges=g.num_edges, max_in_degree=int(g.max_in_degree),
                   mean_in_degree=g.num_edges / max(g.num_nodes, 1))  # fmt: skip
        return out

    return run


def _summarise(out: dict) -> None:
    """``speedup_vs_best_peer`` / ``best_peer`` / ``best_peer_ms`` over every peer timed (every ``*_loop_ms`` but
    ours and our backends'), ``speedup_vs_segment``, and ``faster_backend`` of our two backends."""
    own = {"", *(f"{b}_" for b in BACKENDS)}
    peers = {k[: -len("_loop_ms")]: v for k, v in out.items()
             if k.endswith("loop_ms") and k[: -len("loop_ms")] not in own and v}  # fmt: skip
    if peers and out.get("loop_ms"):
        best = min(peers, key=peers.get)
        out.update(best_peer=best, best_peer_ms=peers[best], speedup_vs_best_peer=peers[best] / out["loop_ms"])
    ratio(out, "segment_loop_ms", "loop_ms", "speedup_vs_segment")
    if out.get("pallas_loop_ms") and out.get("xla_loop_ms"):
        out["faster_backend"] = "pallas" if out["pallas_loop_ms"] <= out["xla_loop_ms"] else "xla"


#: XLA faster than the kernels by at most this fraction is a tie: the tuned data keeps the default order (the kernels
#: first). Timings of the same cell in two runs differ by a few percent on the small graphs.
TIE = 0.02
TIE_NOTE = f"a tie: XLA faster by at most {TIE:.0%}, the default order kept"


def faster(metrics: dict) -> tuple[str, str] | None:
    """``(backend, note)`` of a cell where both backends were timed in a loop: the faster one, and ``"pallas"`` with
    note ``"tie"`` where XLA won by at most :data:`TIE`; ``None`` where the cell cannot tell (a backend did not run,
    or one was timed by a single call: a wall time against a loop is not comparable)."""
    m = metrics
    if m.get("faster_backend") not in BACKENDS or "one call" in (m.get("pallas_timer"), m.get("xla_timer")):
        return None
    if m["faster_backend"] == "xla" and m["pallas_loop_ms"] <= m["xla_loop_ms"] * (1 + TIE):
        return "pallas", "tie"
    return m["faster_backend"], ""


def measured_from(doc: dict, results: str) -> dict:
    """The tuned data a run of this suite measured: ``(family, dtype, pass) -> [Measured, ...]`` for
    :data:`blocksparse.ops.gnn.tuned.CHOICES`, one per graph, from the cells as generated where both backends ran
    (``faster_backend``). SpMM takes its ``spmm_sum`` cells (the forward + backward cell: both products on one
    backend), SpMM with the GCN norm its ``spmm_gcn`` cells (``spmm_gcn``), aggregate its ``max`` cells;
    ``results`` names the JSON under ``benchmarks/results/``. A cell where XLA won by at most :data:`TIE` keeps the
    default order (``faster="pallas"``, noted). Each list is in the order of the tuned tables' columns (graphs not
    among them after, as the run has them), whatever order the run's commands measured them in."""
    from ..ops.gnn import tuned

    take = {"spmm_sum": ("spmm", PASSES), "spmm_gcn": ("spmm_gcn", PASSES), "max": ("aggregate", PASSES),
            "gatv2": ("gatv2", PASSES), "graph_attention": ("graph_attention", PASSES)}  # fmt: skip
    out: dict = {}
    for r in doc.get("results", []):
        prm, m = r.get("params", {}), r.get("metrics", {})
        if r.get("suite") != "gnn-graphs" or prm.get("order") != "as generated" or prm.get("op") not in take:
            continue
        family, passes = take[prm["op"]]
        pick = faster(m)
        if prm["pass"] not in passes or pick is None:
            continue
        cell, note = f"{r['label']}: pallas_loop_ms vs xla_loop_ms", TIE_NOTE if pick[1] else ""
        out.setdefault((family, prm["dtype"], prm["pass"]), []).append(tuned.Measured(
            graph=prm["graph"], nodes=m["nodes"], edges=m["edges"], max_in_degree=m["max_in_degree"],
            feat=prm["feat"], faster=pick[0], results=results, cell=cell, note=note))  # fmt: skip
    column = {g["graph"]: i for i, g in enumerate(tuned._GRAPHS)}
    return {k: sorted(v, key=lambda m: column.get(m.graph, len(column))) for k, v in out.items()}
