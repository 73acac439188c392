"""Traced graphs (``DynamicGraph``) against the static ``Graph``: the same ops on the same graph.

    python benchmarks/bench_gnn_dynamic.py [--nodes N --edges E --feat F --heads H] [--json out.json] [--small]

For each op (SpMM sum, SpMM weighted with GCN norm, max, GATv2, graph attention) and mode (``fwd``,
``fwd+bwd`` w.r.t. the features), three rows per implementation:

- ``static``: a :class:`blocksparse.gnn.Graph` (index arrays are compile-time constants);
- ``dynamic``: a prebuilt :class:`blocksparse.gnn.DynamicGraph` passed as an argument (traced index
  arrays, the same kernels);
- ``dynamic+build``: ``edge_index`` is the argument and the graph is built inside the timed function
  (three sorts, segment counts, the schedule): what a step with a new graph every call costs.

plus ``build`` alone (``DynamicGraph.from_edge_index``; ``build_given_order`` with ``canonical=False``,
two sorts instead of three). Times are ``blocksparse.bench.Timer.loop``:
median device time per call of ``--iters`` calls inside one jitted loop. Every traced result is first
checked against the static one (``err``, relative Frobenius error); a failed check makes the exit
status 1. The default graph is the one of docs/benchmarks.md ("GNN operations"):
``power_law(262144, 8388608)``, F = 128, fp32.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, ".")
import blocksparse.gnn as gnn  # noqa: E402
from blocksparse.bench import Timer  # noqa: E402

ROWS: list[dict] = []
FAILED: list[str] = []


def _save(path):
    if path:
        with open(path, "w") as f:
            json.dump(dict(rows=ROWS, failed=FAILED, device=jax.devices()[0].device_kind), f, indent=1)


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--nodes", type=int, default=262_144)
    p.add_argument("--edges", type=int, default=8_388_608)
    p.add_argument("--feat", type=int, default=128)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--chunk", type=int, default=None, help="the DynamicGraph's chunk (default: its default)")
    p.add_argument("--impls", nargs="*", default=None, help="default: pallas on a GPU, xla elsewhere")
    p.add_argument("--small", action="store_true", help="tiny graph (CPU smoke test)")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    if a.small:
        a.nodes, a.edges, a.feat, a.heads, a.iters = 512, 8192, 32, 2, 3
    impls = a.impls or (["pallas"] if jax.default_backend() == "gpu" else ["xla"])
    timer = Timer(iters=a.iters, trials=3, warmup=2)

    g = gnn.power_law(a.nodes, a.edges, seed=0)
    edge_index = jnp.asarray(np.stack([g.src, g.dst]))
    build = lambda ei: gnn.DynamicGraph.from_edge_index(ei, num_nodes=a.nodes, chunk=a.chunk)
    dg = jax.jit(build)(edge_index)
    extra = int(jnp.sum(dg.schedule.extra_segment < dg.schedule.num_extra))
    print(
        f"graph: N={g.num_nodes} E={g.num_edges} max in-degree {g.max_in_degree}; static chunk {g.chunk}, "
        f"{g.schedule.num_extra} extra units; dynamic chunk {dg.chunk}, {extra} extra units used of "
        f"{dg.schedule.num_extra}; device {jax.devices()[0].device_kind}",
        flush=True,
    )
    ROWS.append(dict(kind="graph", nodes=a.nodes, edges=a.edges, feat=a.feat, heads=a.heads, static_chunk=g.chunk,
                     static_extra=g.schedule.num_extra, dynamic_chunk=dg.chunk, dynamic_extra_used=extra,
                     dynamic_extra_capacity=dg.schedule.num_extra))  # fmt: skip

    def record(op, impl, mode, graph, ms, err=None):
        ROWS.append(dict(op=op, impl=impl, mode=mode, graph=graph, ms=ms, err=err))
        e = f"  err {err:.1e}" if err is not None else ""
        print(f"{op:16s} {impl:7s} {mode:8s} {graph:14s} {ms:9.3f} ms{e}", flush=True)
        _save(a.json)

    try:
        record("build", "-", "fwd", "dynamic+build", timer.loop(build, edge_index))
        given = lambda ei: gnn.DynamicGraph.from_edge_index(ei, num_nodes=a.nodes, chunk=a.chunk, canonical=False)
        record("build_given_order", "-", "fwd", "dynamic+build", timer.loop(given, edge_index))
    except Exception as e:  # noqa: BLE001
        traceback.print_exc(limit=3)
        FAILED.append(f"build: {type(e).__name__}: {str(e)[:200]}")

    k = jax.random.split(jax.random.key(0), 6)
    n, f, h = a.nodes, a.feat, a.heads
    d = f // h
    x = jax.random.normal(k[0], (n, f))
    w = jax.random.uniform(k[1], (a.edges,), minval=0.5, maxval=1.5)
    xs, xd, v = (jax.random.normal(kk, (n, h, d)) for kk in k[2:5])
    att = jax.random.normal(k[5], (h, d))
    ops = {  # name -> (fn(graph, *arrays), arrays)
        "spmm_sum": (lambda G, x, i: gnn.spmm(G, x, implementation=i), (x,)),
        "spmm_gcn_w": (lambda G, x, i: gnn.spmm(G, x, "sum", "both", w, implementation=i), (x,)),
        "max": (lambda G, x, i: gnn.aggregate(G, x, "max", implementation=i), (x,)),
        "gatv2": (lambda G, xs, xd, i: gnn.gatv2(G, xs, xd, att, implementation=i), (xs, xd)),
        "graph_attention": (lambda G, q, kk, i: gnn.graph_attention(G, q, kk, v, implementation=i), (xd, xs)),
    }

    def fwd_bwd(fn):
        def run(G, *arrs):
            return jax.value_and_grad(lambda arrs: jnp.sum(fn(G, *arrs)), allow_int=True)(arrs)

        return run

    for impl in impls:
        for name, (fn, arrs) in ops.items():
            f0 = lambda G, *arrs, fn=fn, impl=impl: fn(G, *arrs, impl)
            for mode, f1 in (("fwd", f0), ("fwd+bwd", fwd_bwd(f0))):
                try:
                    ref = jax.jit(lambda *arrs, f1=f1: f1(g, *arrs))(*arrs)
                    got = jax.jit(f1)(dg, *arrs)
                    err = max(_rel(u, r) for u, r in zip(jax.tree.leaves(got), jax.tree.leaves(ref), strict=True))
                    if not err < 1e-3:
                        FAILED.append(f"{name} {impl} {mode}: traced result differs from static, err {err:.2e}")
                    del ref, got
                    record(name, impl, mode, "static", timer.loop(lambda *arrs, f1=f1: f1(g, *arrs), *arrs))
                    record(name, impl, mode, "dynamic", timer.loop(f1, dg, *arrs), err)
                    record(name, impl, mode, "dynamic+build",
                           timer.loop(lambda ei, *arrs, f1=f1: f1(build(ei), *arrs), edge_index, *arrs))  # fmt: skip
                except Exception as e:  # noqa: BLE001 - record and go on
                    traceback.print_exc(limit=3)
                    FAILED.append(f"{name} {impl} {mode}: {type(e).__name__}: {str(e)[:200]}")
                    _save(a.json)

    print("\n| op | impl | mode | static (ms) | dynamic (ms) | dynamic+build (ms) |")
    print("|---|---|---|---|---|---|")
    keyed = {(r.get("op"), r.get("impl"), r.get("mode"), r.get("graph")): r["ms"] for r in ROWS if "ms" in r}
    for op, impl, mode, gr in keyed:
        if gr == "static":
            row = [keyed.get((op, impl, mode, x)) for x in ("static", "dynamic", "dynamic+build")]
            print(f"| {op} | {impl} | {mode} | " + " | ".join("" if t is None else f"{t:.3f}" for t in row) + " |")
    _save(a.json)
    if FAILED:
        print("FAILED:\n  " + "\n  ".join(FAILED))
        sys.exit(1)


if __name__ == "__main__":
    main()
