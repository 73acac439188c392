"""The ``gnn-variants`` suite: the GNN kernels' variants against their defaults and XLA, and traced graphs.

Four kinds of cells, each measuring the op's default (the cell's own ``loop_ms`` / ``calls_ms`` /
``implementation``: Pallas on a GPU, XLA elsewhere) and the XLA path (``xla_*``) in the same run, every
variant checked against the XLA result (SpMM and attention: relative error; max: exactly):

- ``gather``: SpMM sum and max aggregation, per dtype, each gather variant of :data:`SPMM` / :data:`MAX`
  (a ``GatherConfig``: nodes per program and the gather knobs) as ``{name}_*`` metrics; ``max_with_arg``
  cells time the forward and backward of the max (the forward that records the arg-max, what training runs)
  with the variants of :data:`MAX_WITH_ARG`;
- ``gatv2``: GATv2 forward (``fwd``) and forward + VJP (``fwd+bwd``) per ``H x D``, each
  ``AttentionConfig`` of :data:`ATTENTION`;
- ``packed``: SpMM sum with ``nodes_per_program`` of :data:`NODES_PER_PROGRAM` on a power-law graph of mean
  in-degree 32 and an ogbn-arxiv-like one (mean in-degree 6.9);
- ``half``: bfloat16 features on a graph (the power-law one and paper-like ones): each op's default, the same op
  on float32 features (``float32_*``; ``vs_float32``: the float32 time over the bfloat16 one, > 1 when bfloat16 is
  faster), and the variants of :data:`HALF` (2-byte rows gathered 4 features a lane, ``narrow``, against Triton's 8,
  ``wide``, and the max's tilings with them);
- ``dynamic``: each op on a static :class:`~blocksparse.gnn.Graph` (``static_*``), a prebuilt
  :class:`~blocksparse.gnn.DynamicGraph` argument (the cell's own times), and the graph built inside the timed
  function (``build_*``: what a step with a new graph costs); plus the build alone.

Variants are passed through the ops' public ``config=`` and need a GPU (``*_skipped`` elsewhere). ``speedup``
metrics are the default's time over the variant's.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

import blocksparse as bs

from ._core import Cell, Timer, check_close, measure, ratio, variant

#: ``modes``: of the gatv2 and dynamic cells; ``graphs``: of the packed cells; ``gather``: the gather cells' ops;
#: ``dynamic`` / ``dynamic_modes``: the dynamic cells' ops and modes (the CPU sizes keep a few cells); ``half``:
#: the half cells' graphs (``power-law``: the suite's own; else a :data:`~.gnn_graphs.GRAPHS` name at
#: ``half_scale``) and ``half_ops`` their ops.
SIZES = {
    "tiny": dict(nodes=96, edges=1536, feat=16, dtypes=("float32",), shapes=((2, 8),), arxiv_scale=0.002,
                 dynamic_feat=16, heads=2, modes=("fwd",), graphs=("arxiv-like",), gather=("spmm", "max"),
                 dynamic=("spmm_sum",), half=("power-law",), half_ops=("max",)),
    "quick": dict(nodes=512, edges=16_384, feat=32, dtypes=("float32",), shapes=((4, 8),), arxiv_scale=0.005,
                  dynamic_feat=32, heads=2, modes=("fwd+bwd",), graphs=("power-law-32", "arxiv-like"),
                  dynamic=("spmm_sum", "max", "gatv2"), dynamic_modes=("fwd",), half=("power-law",),
                  half_ops=("max", "gatv2")),
    "full": dict(nodes=262_144, edges=8_388_608, feat=128, dtypes=("float32", "bfloat16"),
                 shapes=((1, 128), (8, 16)), arxiv_scale=1.0, dynamic_feat=128, heads=8, modes=("fwd", "fwd+bwd"),
                 graphs=("power-law-32", "arxiv-like"), half=("ogbn-arxiv", "city-roads-L", "power-law")),
}  # fmt: skip

COLUMNS = (
    ("loop ms", "loop_ms", ".4g"),
    ("calls ms", "calls_ms", ".4g"),
    ("xla ms", "xla_loop_ms", ".4g"),
    ("best variant", "best", ""),
    ("best x default", "best_speedup", ".3g"),
    ("rel err", "rel_err", ".2g"),
)

#: SpMM sum rows: name -> the GatherConfig's fields (``nodes_per_program`` None: the one-node kernel).
SPMM = {
    "pairs": dict(pairs=True),
    "bytes": dict(tile_bytes=True),
    "prefetch": dict(prefetch=True),
    "w2": dict(num_warps=2),
    "w1": dict(num_warps=1),
    "bytes+w2": dict(tile_bytes=True, num_warps=2),
    "w2+prefetch": dict(num_warps=2, prefetch=True),
    "bytes+w2+prefetch": dict(tile_bytes=True, num_warps=2, prefetch=True),
    "G2": dict(nodes_per_program=2),
    "G2+bytes": dict(nodes_per_program=2, tile_bytes=True),
}
#: Max (values only) rows.
MAX = {
    "pairs": dict(pairs=True),
    "bytes": dict(tile_bytes=True),
    "prefetch": dict(prefetch=True),
    "w2": dict(num_warps=2),
    "key": dict(key_reduce=True),
    "key+w2": dict(key_reduce=True, num_warps=2),
    "key+prefetch": dict(key_reduce=True, prefetch=True),
    "key+pairs": dict(key_reduce=True, pairs=True),
    "G1": dict(nodes_per_program=1),
    "G1+key": dict(nodes_per_program=1, key_reduce=True),
    "G1+key+w2": dict(nodes_per_program=1, key_reduce=True, num_warps=2),
    **{f"G{k}": dict(nodes_per_program=k) for k in (2, 4, 8)},
}
#: Max with the arg-max (forward and backward) rows.
MAX_WITH_ARG = {
    "w2": dict(num_warps=2),
    "w1": dict(num_warps=1),
    "prefetch": dict(prefetch=True),
    "w2+prefetch": dict(num_warps=2, prefetch=True),
    "pairs": dict(pairs=True),
    "bytes": dict(tile_bytes=True),
    "bytes+w2": dict(tile_bytes=True, num_warps=2),
    "pairs+w2": dict(pairs=True, num_warps=2),
    "G1": dict(nodes_per_program=1),
    "G1+w2": dict(nodes_per_program=1, num_warps=2),
    "G1+w1": dict(nodes_per_program=1, num_warps=1),
    "G1+bytes": dict(nodes_per_program=1, tile_bytes=True),
    "G4": dict(nodes_per_program=4),
    "G4+w2": dict(nodes_per_program=4, num_warps=2),
}
#: GATv2 rows: name -> (the AttentionConfig's fields, whether it changes only one-head programs).
ATTENTION = {
    "previous": (dict(layout="heads", edges_per_step=32, deferred=False), False),
    "flat": (dict(layout="flat", edges_per_step=32, deferred=False), True),
    "groups": (dict(layout="groups", edges_per_step=32, deferred=False), True),
    "deferred": (dict(layout="heads", edges_per_step=32, deferred=True), False),
    "flat+deferred": (dict(layout="flat", edges_per_step=32, deferred=True), True),
    "be16": (dict(layout="heads", edges_per_step=16, deferred=False), False),
    "flat+be16": (dict(layout="flat", edges_per_step=16, deferred=False), True),
    "be16+deferred": (dict(layout="heads", edges_per_step=16, deferred=True), False),
    "flat+w8": (dict(layout="flat", num_warps=8), True),
    "be64": (dict(edges_per_step=64), False),
}
#: The half cells' variants per op (pass): name -> the op's ``config=`` fields. ``wide`` is the default's kernel
#: as it was before ``narrow_loads`` (the tuned variant without it), ``narrow`` the same with it.
HALF = {
    "spmm": {"wide": dict(num_warps=1), "narrow": dict(num_warps=1, narrow_loads=True)},
    "max": {
        "wide": dict(num_warps=2),
        "narrow": dict(num_warps=2, narrow_loads=True),
        **{f"G{k}+w2+narrow": dict(nodes_per_program=k, num_warps=2, narrow_loads=True) for k in (2, 4)},
        "G1+key+narrow": dict(nodes_per_program=1, key_reduce=True, narrow_loads=True),
    },
    "max_with_arg": {
        "wide": dict(num_warps=1),
        "narrow": dict(num_warps=1, narrow_loads=True),
        **{f"G{k}+w1+narrow": dict(nodes_per_program=k, num_warps=1, narrow_loads=True) for k in (2, 4)},
    },
    "gatv2": {"wide": dict(narrow_loads=False), "narrow": dict(narrow_loads=True)},
    "graph_attention": {"wide": dict(narrow_loads=False), "narrow": dict(narrow_loads=True)},
}
HALF_OPS = tuple(HALF)
NODES_PER_PROGRAM = (1, 2, 4, 8, 16)
DYNAMIC_OPS = ("spmm_sum", "spmm_gcn_w", "max", "gatv2", "graph_attention")
_TABLES = {"spmm": SPMM, "max": MAX, "max_with_arg": MAX_WITH_ARG}


def gather_config(fields: dict):
    """The SpMM / aggregation ops' ``config=`` for one row of :data:`SPMM` / :data:`MAX` / :data:`MAX_WITH_ARG`:
    a ``GatherConfig`` of its ``nodes_per_program`` and a ``GatherVariant`` of the other fields (none: ``None``)."""
    from ..gnn import GatherConfig, GatherVariant

    knobs = {k: v for k, v in fields.items() if k != "nodes_per_program"}
    return GatherConfig(nodes_per_program=fields.get("nodes_per_program"), variant=GatherVariant(**knobs) if knobs
                        else None)  # fmt: skip


def attention_config(fields: dict):
    """The attention ops' ``config=`` for one row of :data:`ATTENTION`."""
    from ..gnn import AttentionConfig

    return AttentionConfig(**fields)


def cells(*, full: bool) -> list[Cell]:
    return suite(**SIZES["full" if full else "quick"])


def suite(
    *, nodes, edges, feat, dtypes, shapes, arxiv_scale, dynamic_feat, heads, modes, graphs, gather=None, dynamic=None,
    dynamic_modes=None, half=(), half_ops=HALF_OPS, half_scale=1.0, seed: int = 0,
) -> list[Cell]:  # fmt: skip
    graph = functools.cache(lambda: bs.gnn.power_law(nodes, edges, seed=seed))
    base = dict(nodes=nodes, edges=edges, graph="power_law")
    out = []
    for op in gather or _TABLES:
        for dtype in dtypes:
            params = dict(base, kind="gather", op=op, dtype=dtype, feat=feat, variants=sorted(_TABLES[op]))
            out.append(Cell("gnn-variants", f"gather {op} {dtype}", params, _gather(op, graph, feat, dtype, seed)))
    for h, d in shapes:
        for mode in modes:
            names = [n for n, (_, one_head) in ATTENTION.items() if not (one_head and 128 // d > 1)]
            params = dict(base, kind="gatv2", heads=h, head_dim=d, mode=mode, dtype="float32", variants=names)
            out.append(Cell("gnn-variants", f"gatv2 {h}x{d} {mode}", params, _gatv2(graph, h, d, mode, names, seed)))
    for name in graphs:
        graph_of = graph if name == "power-law-32" else functools.cache(lambda: _arxiv(arxiv_scale))
        for dtype in dtypes:
            params = dict(kind="packed", graph=name, dtype=dtype, feat=feat, nodes_per_program=list(NODES_PER_PROGRAM))
            out.append(
                Cell("gnn-variants", f"packed spmm {name} {dtype}", params, _packed(graph_of, feat, dtype, seed))
            )
    for name in half:
        graph_of = graph if name == "power-law" else functools.cache(lambda name=name: _paper(name, half_scale))
        where = base if name == "power-law" else dict(graph=name, scale=half_scale)
        for op in half_ops:
            params = dict(where, kind="half", op=op, dtype="bfloat16", feat=feat, variants=sorted(HALF[op]),
                          mode="fwd+bwd" if op in ("max_with_arg", "gatv2", "graph_attention") else "fwd")  # fmt: skip
            out.append(Cell("gnn-variants", f"half {op} {name}", params, _half(op, graph_of, feat, seed)))
    dyn = dict(base, kind="dynamic", feat=dynamic_feat, heads=heads, dtype="float32")
    out.append(Cell("gnn-variants", "dynamic build", dict(dyn, op="build"), _build(graph)))
    for op in dynamic or DYNAMIC_OPS:
        for mode in dynamic_modes or modes:
            run = _dynamic(op, mode, graph, dynamic_feat, heads, seed)
            out.append(Cell("gnn-variants", f"dynamic {op} {mode}", dict(dyn, op=op, mode=mode), run))
    return out


def _arxiv(scale):
    from ..gnn import paper_graph_edges

    src, dst, n = paper_graph_edges("ogbn-arxiv", scale=scale)
    return bs.gnn.Graph.from_edges(src, dst, n, name="arxiv-like")


def _paper(name, scale):
    from .gnn_graphs import graph

    return graph(name, scale)


def _half(op, graph_of, feat, seed):
    """bfloat16 ``op`` (``max_with_arg``: the max's forward + backward; attention: forward + VJP, ``feat`` as 8 heads
    of ``feat / 8``) on ``graph_of()``: the default, the float32 default and the :data:`HALF` variants, each checked
    against XLA's float32 result on the same values within bfloat16's tolerance (the max: exactly XLA's result in
    the same dtype)."""
    from ..gnn import AttentionConfig
    from ..ops.gnn import order

    attention = op in ("gatv2", "graph_attention")

    def fn_of(g, **kw):
        if op == "spmm":
            return lambda x: bs.gnn.spmm(g, x, **kw)
        if op in ("max", "max_with_arg"):
            fwd = lambda x: bs.gnn.aggregate(g, x, "max", **kw)  # noqa: E731
            if op == "max":
                return fwd
            return lambda x: jax.value_and_grad(lambda x: jnp.sum(fwd(x).astype(jnp.float32)))(x)
        f = bs.gnn.gatv2 if op == "gatv2" else bs.gnn.graph_attention

        def fb(a, b, c, ct):
            y, vjp = jax.vjp(lambda a, b, c: f(g, a, b, c, **kw), a, b, c)
            return (y, *vjp(ct))

        return fb

    def config(fields):
        return AttentionConfig(**fields) if attention else gather_config(fields)

    def run(timer: Timer) -> dict:
        g = graph_of()
        ks = jax.random.split(jax.random.key(seed), 4)
        heads = (8, feat // 8)
        if not attention:
            args32 = (jax.random.normal(ks[0], (g.num_nodes, feat), jnp.float32),)
        else:  # gatv2: (x_src, x_dst, att); graph_attention: (k, q, v); then the output's cotangent
            third = heads if op == "gatv2" else (g.num_nodes, *heads)
            shapes = [(g.num_nodes, *heads)] * 2 + [third, (g.num_nodes, *heads)]
            args32 = tuple(jax.random.normal(k, s, jnp.float32) for k, s in zip(ks, shapes, strict=True))
            if op == "gatv2":
                args32 = (*args32[:2], args32[2] / 4, args32[3])
        args = tuple(a.astype(jnp.bfloat16) for a in args32)
        args32 = tuple(a.astype(jnp.float32) for a in args)  # the same values: one float32 reference for both
        exact = op in ("max", "max_with_arg")
        want = jax.jit(fn_of(g, implementation="xla"))(*args32)
        # the max: XLA's in bfloat16, exactly (its gradient's scatter-add rounds in bfloat16 on either backend)
        want_half = jax.jit(fn_of(g, implementation="xla"))(*args) if exact else want
        check = dict(want=want_half, tol=0.0 if exact else None, dtype=jnp.dtype(jnp.bfloat16))
        out = measure(timer, fn_of(g), *args, what=f"{op} bfloat16 default", **check)
        out.update(variant(timer, "xla", fn_of(g, implementation="xla"), *args))
        out.update(variant(timer, "float32", fn_of(g), *args32, what=f"{op} float32 default", want=want,
                           tol=0.0 if exact else None, dtype=jnp.dtype(jnp.float32)))  # fmt: skip
        ratio(out, "float32_loop_ms", "loop_ms", "vs_float32")
        for name, fields in HALF[op].items():
            fn = lambda *a, fields=fields: fn_of(g, implementation="pallas", config=config(fields))(*a)  # noqa: E731
            out.update(variant(timer, name, fn, *args, needs="gpu", what=f"{op} {name}", **check))
        stats = order.graph_stats(g)  # what the host knows of the graph (the choice's statistics)
        out.update(nodes=stats.nodes, edges=stats.edges, max_in_degree=stats.max_in_degree)
        _best(out, HALF[op])  # {name}_speedup: the default's time over each variant's
        ratio(out, "wide_loop_ms", "narrow_loop_ms", "narrow_vs_wide")  # > 1: the narrow loads faster
        return out

    return run


def _best(out: dict, names) -> None:
    """The fastest variant measured, and its speedup over the default."""
    timed = {n: out[f"{n}_loop_ms"] for n in names if out.get(f"{n}_loop_ms")}
    for n in timed:
        ratio(out, "loop_ms", f"{n}_loop_ms", f"{n}_speedup")
    if timed:
        out["best"] = min(timed, key=timed.get)
        out["best_speedup"] = out["loop_ms"] / timed[out["best"]]


def _exact(got, want, what):
    """Max and its arg-max: exactly the reference (``rel_err`` 0)."""
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
        check_close(a, b, tol=0.0, what=what)


def _gather(op, graph, feat, dtype, seed):
    def fn_of(g, **kw):
        if op == "spmm":
            return lambda x: bs.gnn.spmm(g, x, **kw)
        fwd = lambda x: bs.gnn.aggregate(g, x, "max", **kw)  # noqa: E731
        if op == "max":
            return fwd
        return lambda x: jax.value_and_grad(lambda x: jnp.sum(fwd(x).astype(jnp.float32)))(x)

    def run(timer: Timer) -> dict:
        g = graph()
        x = jax.random.normal(jax.random.key(seed), (g.num_nodes, feat), jnp.dtype(dtype))
        want = jax.jit(fn_of(g, implementation="xla"))(x)
        exact = op != "spmm"  # max: the same values (and gradient positions) exactly
        check = dict(want=want, tol=0.0 if exact else None, dtype=jnp.dtype(dtype))
        out = measure(timer, fn_of(g), x, what=f"{op} default", **check)
        out.update(variant(timer, "xla", fn_of(g, implementation="xla"), x))
        table = _TABLES[op]
        for name, fields in table.items():
            fn = lambda x, fields=fields: fn_of(g, implementation="pallas", config=gather_config(fields))(x)  # noqa: E731
            out.update(variant(timer, name, fn, x, needs="gpu", what=f"{op} {name}", **check))
        if op != "max_with_arg":
            out["gather_gbps"] = g.num_edges * feat * jnp.dtype(dtype).itemsize / (out["loop_ms"] * 1e-3) / 1e9
        _best(out, table)
        return out

    return run


def _gatv2(graph, h, d, mode, names, seed):
    def run(timer: Timer) -> dict:
        g = graph()
        ks = jax.random.split(jax.random.key(h * 1000 + d + seed), 4)
        xs, xd, ct = (jax.random.normal(k, (g.num_nodes, h, d), jnp.float32) for k in ks[:3])
        att = jax.random.normal(ks[3], (h, d), jnp.float32)

        def fn_of(**kw):
            def fwd(xs, xd, att):
                return bs.gnn.gatv2(g, xs, xd, att, **kw)

            def fb(xs, xd, att):
                y, vjp = jax.vjp(fwd, xs, xd, att)
                return (y, *vjp(ct))

            return fwd if mode == "fwd" else fb

        want = jax.jit(fn_of(implementation="xla"))(xs, xd, att)
        check = dict(want=want, tol=1e-3)
        out = measure(timer, fn_of(), xs, xd, att, what="gatv2 default", **check)
        out.update(variant(timer, "xla", fn_of(implementation="xla"), xs, xd, att))
        for name in names:
            fields = ATTENTION[name][0]
            fn = lambda *a, fields=fields: fn_of(implementation="pallas", config=attention_config(fields))(*a)  # noqa: E731
            out.update(variant(timer, name, fn, xs, xd, att, needs="gpu", what=f"gatv2 {name}", **check))
        _best(out, names)
        return out

    return run


def _packed(graph_of, feat, dtype, seed):
    def run(timer: Timer) -> dict:
        g = graph_of()
        x = jax.random.normal(jax.random.key(seed), (g.num_nodes, feat), jnp.dtype(dtype))
        want = jax.jit(lambda x: bs.gnn.spmm(g, x, implementation="xla"))(x)
        check = dict(want=want, dtype=jnp.dtype(dtype))
        out = measure(timer, lambda x: bs.gnn.spmm(g, x), x, what="spmm default", **check)
        out.update(variant(timer, "xla", lambda x: bs.gnn.spmm(g, x, implementation="xla"), x))
        names = [f"G{k}" for k in NODES_PER_PROGRAM]
        for k, name in zip(NODES_PER_PROGRAM, names, strict=True):
            cfg = dict(nodes_per_program=k)
            fn = lambda x, cfg=cfg: bs.gnn.spmm(g, x, implementation="pallas", config=gather_config(cfg))  # noqa: E731
            out.update(variant(timer, name, fn, x, needs="gpu", what=f"spmm {name}", **check))
        for name in names[1:]:
            ratio(out, "G1_loop_ms", f"{name}_loop_ms", f"{name}_speedup_vs_g1")
        out.update(nodes=g.num_nodes, edges=g.num_edges, mean_in_degree=g.num_edges / g.num_nodes)
        _best(out, names)
        return out

    return run


def _edge_index(g):
    return jnp.asarray(np.stack([np.asarray(g.src), np.asarray(g.dst)]))


def _build(graph):
    def run(timer: Timer) -> dict:
        g = graph()
        ei = _edge_index(g)
        build = lambda ei: bs.gnn.DynamicGraph.from_edge_index(ei, num_nodes=g.num_nodes)  # noqa: E731
        given = lambda ei: bs.gnn.DynamicGraph.from_edge_index(ei, num_nodes=g.num_nodes, canonical=False)  # noqa: E731
        out = dict(loop_ms=timer.loop(build, ei), calls_ms=timer.calls(build, ei), implementation="build (XLA sorts)")
        out.update(given_order_loop_ms=timer.loop(given, ei), given_order_calls_ms=timer.calls(given, ei))
        return out

    return run


def _dynamic(op, mode, graph, feat, heads, seed):
    def run(timer: Timer) -> dict:
        g = graph()
        n, e = g.num_nodes, g.num_edges
        d = feat // heads
        k = jax.random.split(jax.random.key(seed), 6)
        x = jax.random.normal(k[0], (n, feat))
        w = jax.random.uniform(k[1], (e,), minval=0.5, maxval=1.5)
        xs, xd, v = (jax.random.normal(kk, (n, heads, d)) for kk in k[2:5])
        att = jax.random.normal(k[5], (heads, d))
        ops = {
            "spmm_sum": (lambda G, x: bs.gnn.spmm(G, x), (x,)),
            "spmm_gcn_w": (lambda G, x: bs.gnn.spmm(G, x, "sum", "both", w), (x,)),
            "max": (lambda G, x: bs.gnn.aggregate(G, x, "max"), (x,)),
            "gatv2": (lambda G, xs, xd: bs.gnn.gatv2(G, xs, xd, att), (xs, xd)),
            "graph_attention": (lambda G, q, kk: bs.gnn.graph_attention(G, q, kk, v), (xd, xs)),
        }
        fn, arrays = ops[op]
        if mode == "fwd+bwd":
            f0 = fn
            fn = lambda G, *a: jax.value_and_grad(lambda a: jnp.sum(f0(G, *a)))(a)  # noqa: E731
        ei = _edge_index(g)
        build = lambda ei: bs.gnn.DynamicGraph.from_edge_index(ei, num_nodes=n)  # noqa: E731
        dg = jax.jit(build)(ei)
        want = jax.jit(lambda *a: fn(g, *a))(*arrays)
        check = dict(want=want, tol=1e-3)
        out = measure(timer, fn, dg, *arrays, what=f"{op} {mode} on the traced graph", **check)
        out.update(variant(timer, "static", lambda *a: fn(g, *a), *arrays))
        out.update(variant(timer, "build", lambda ei, *a: fn(build(ei), *a), ei, *arrays, **check))
        ratio(out, "loop_ms", "static_loop_ms", "loop_vs_static")
        ratio(out, "build_loop_ms", "static_loop_ms", "build_vs_static")
        return out

    return run
