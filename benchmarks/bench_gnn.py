# ruff: noqa: B023 - record() calls each closure immediately, inside the loop iteration
"""Benchmark the GNN ops against JAX segment ops, torch and PyG, in one process.

    python benchmarks/bench_gnn.py [--nodes N --edges E --feat F] [--json out.json] [--small]

JAX is timed with the library's one helper, ``blocksparse.bench.Timer`` (as ``blocksparse bench``
is): ``ms`` is ``Timer.loop``, the median device time per call of ``--iters`` calls inside one
jitted loop, comparable with torch's CUDA-event times; ``calls_ms`` is ``Timer.calls``, back-to-back
calls from Python, dispatch included. torch: the median of ``--iters`` calls timed with CUDA events.
Memory is the *extra* peak beyond the inputs: for JAX, the compiled program's temporary plus output
bytes (``memory_analysis``); for torch, ``max_memory_allocated`` minus the memory allocated before
the call. PyG layers include their linear projections, and so do ours here.

Every forward of ours is first checked against the JAX segment-op reference of
``blocksparse.bench.gnn`` (``err``); a failed check or a failing JAX row makes the exit status 1
(a peer that is missing or fails is only recorded). torch and PyG are imported only when asked for
and present. The library's own suite is ``blocksparse bench --suite gnn --full``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, ".")
import blocksparse.gnn as gnn  # noqa: E402
from blocksparse.bench import CellFailed, Timer, check_close  # noqa: E402
from blocksparse.bench.gnn import references  # noqa: E402

ROWS: list[dict] = []
JSON_PATH = None
LAST: dict = {}  # extra metrics of the last jax_time call


def jax_time(fn, *args, iters=20, warmup=3):
    """(median ms per call inside one jitted loop, extra bytes of the compiled program); ``calls_ms`` in LAST."""
    comp = jax.jit(fn).lower(*args).compile()
    try:
        ma = comp.memory_analysis()
        mem = int(ma.temp_size_in_bytes + ma.output_size_in_bytes)
    except Exception:  # noqa: BLE001
        mem = None
    timer = Timer(iters=iters, trials=3, warmup=warmup)
    LAST["calls_ms"] = timer.calls(fn, *args)
    return timer.loop(fn, *args), mem


def torch_time(fn, iters=20, warmup=3):
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts), torch.cuda.max_memory_allocated() - base


def record(op, impl, mode, fn, **kw):
    LAST.clear()
    try:
        ms, mem = fn()
    except Exception as e:  # noqa: BLE001 - a failing peer must not stop the run
        traceback.print_exc(limit=2)
        ROWS.append(dict(op=op, impl=impl, mode=mode, error=f"{type(e).__name__}: {str(e)[:200]}", **kw))
        print(f"{op:18s} {impl:26s} {mode:8s} FAILED {type(e).__name__}", flush=True)
        return
    ROWS.append(dict(op=op, impl=impl, mode=mode, ms=ms, mem_bytes=mem, **LAST, **kw))
    if JSON_PATH:
        with open(JSON_PATH, "w") as f:
            json.dump(dict(rows=ROWS), f, indent=1)
    m = f"{mem / 2**30:8.3f} GiB" if mem is not None else ""
    print(f"{op:18s} {impl:26s} {mode:8s} {ms:9.3f} ms {m}", flush=True)


def bench_jax(g, x, feat, heads, iters, impls, do_reorder, sweep=False):
    key = jax.random.key(0)
    n = g.num_nodes
    ct = jax.random.normal(key, (n, feat))

    def grad_of(f):
        return jax.value_and_grad(lambda x: jnp.sum(f(x) * ct))

    check(g, x, feat, heads, impls)
    for impl in impls:
        sp = lambda x, impl=impl: gnn.spmm(g, x, implementation=impl)
        record("spmm_sum", f"bs-{impl}", "fwd", lambda: jax_time(sp, x, iters=iters))
        record("spmm_sum", f"bs-{impl}", "fwd+bwd", lambda: jax_time(grad_of(sp), x, iters=iters))
        mx = lambda x, impl=impl: gnn.aggregate(g, x, "max", implementation=impl)
        record("max", f"bs-{impl}", "fwd", lambda: jax_time(mx, x, iters=iters))
        record("max", f"bs-{impl}", "fwd+bwd", lambda: jax_time(grad_of(mx), x, iters=iters))
    # raw segment ops (the plain-JAX baseline)
    src_s, dst_s = jnp.asarray(g.indices), jnp.asarray(g.dst_sorted)
    src_u, dst_u = jnp.asarray(g.src), jnp.asarray(g.dst)
    record(
        "spmm_sum",
        "jax-segment_sum-sorted",
        "fwd",
        lambda: jax_time(lambda x: jax.ops.segment_sum(x[src_s], dst_s, n, indices_are_sorted=True), x, iters=iters),
    )
    record(
        "spmm_sum",
        "jax-segment_sum-unsorted",
        "fwd",
        lambda: jax_time(lambda x: jax.ops.segment_sum(x[src_u], dst_u, n), x, iters=iters),
    )
    record(
        "max",
        "jax-segment_max-sorted",
        "fwd",
        lambda: jax_time(lambda x: jax.ops.segment_max(x[src_s], dst_s, n, indices_are_sorted=True), x, iters=iters),
    )
    if jax.default_backend() == "gpu":

        def cusparse():
            from jax.experimental import sparse

            jax.config.update("jax_bcoo_cusparse_lowering", True)
            m = sparse.BCSR((jnp.ones(g.num_edges), jnp.asarray(g.indices), jnp.asarray(g.indptr)), shape=(n, n))
            return jax_time(lambda x: m @ x, x, iters=iters)

        record("spmm_sum", "jax-BCSR-cusparse", "fwd", cusparse)

    # attention with projections, like the PyG layers
    for h in heads:
        d = feat // h
        ks = jax.random.split(jax.random.key(h), 6)
        w1, w2, w3 = (jax.random.normal(k, (feat, feat)) / feat**0.5 for k in ks[:3])
        att = jax.random.normal(ks[3], (h, d))
        cth = jax.random.normal(ks[4], (n, h, d))
        for impl in impls:

            def gat(x, w1, w2, att, impl=impl, h=h, d=d):
                return gnn.gatv2(g, (x @ w1).reshape(n, h, d), (x @ w2).reshape(n, h, d), att, implementation=impl)

            def tr(x, w1, w2, w3, impl=impl, h=h, d=d):
                q, k, v = ((x @ w).reshape(n, h, d) for w in (w1, w2, w3))
                return gnn.graph_attention(g, q, k, v, implementation=impl)

            gg = jax.value_and_grad(lambda *a, f=gat: jnp.sum(f(*a) * cth), argnums=(0, 1, 2, 3))
            tg = jax.value_and_grad(lambda *a, f=tr: jnp.sum(f(*a) * cth), argnums=(0, 1, 2, 3))
            record("gatv2", f"bs-{impl}", "fwd", lambda: jax_time(gat, x, w1, w2, att, iters=iters), heads=h)
            record("gatv2", f"bs-{impl}", "fwd+bwd", lambda: jax_time(gg, x, w1, w2, att, iters=iters), heads=h)
            record("transformer", f"bs-{impl}", "fwd", lambda: jax_time(tr, x, w1, w2, w3, iters=iters), heads=h)
            record("transformer", f"bs-{impl}", "fwd+bwd", lambda: jax_time(tg, x, w1, w2, w3, iters=iters), heads=h)

    if sweep and "pallas" in impls:
        from blocksparse.ops.gnn_aggregate.pallas_triton import segment_extreme
        from blocksparse.ops.gnn_spmm.pallas_triton import csr_sum

        for be in (16, 32, 64):
            record(
                "spmm_sum",
                f"bs-pallas-be{be}",
                "fwd",
                lambda be=be: jax_time(lambda x: csr_sum(g, None, x, be=be), x, iters=iters),
            )
            record(
                "max",
                f"bs-pallas-be{be}",
                "fwd",
                lambda be=be: jax_time(lambda x: segment_extreme(g, x, True, with_arg=False, be=be)[0], x, iters=iters),
            )

    if do_reorder:
        for method in ("rcm", "degree"):
            t = time.perf_counter()
            g2, perm = gnn.reorder(g, method)
            print(f"reorder {method}: {time.perf_counter() - t:.1f} s", flush=True)
            x2 = x[jnp.asarray(perm)]
            impl = impls[0]
            record(
                "spmm_sum",
                f"bs-{impl}+{method}",
                "fwd",
                lambda: jax_time(lambda x: gnn.spmm(g2, x, implementation=impl), x2, iters=iters),
            )
            record(
                "max",
                f"bs-{impl}+{method}",
                "fwd",
                lambda: jax_time(lambda x: gnn.aggregate(g2, x, implementation=impl), x2, iters=iters),
            )
            d = feat // 8
            xh = x2.reshape(n, 8, d)
            record(
                "gatv2",
                f"bs-{impl}+{method}",
                "fwd",
                lambda: jax_time(lambda a: gnn.gatv2(g2, a, a, jnp.ones((8, d)), implementation=impl), xh, iters=iters),
                heads=8,
            )


def check(g, x, feat, heads, impls):
    """Each op of ours, forward, against the JAX segment-op reference; a mismatch is a failed row."""
    n = g.num_nodes
    refs = references(jnp.asarray(g.src), jnp.asarray(g.dst), n)
    for impl in impls:
        cases = [("spmm_sum", lambda: gnn.spmm(g, x, implementation=impl), lambda: refs["spmm_sum"](x)),
                 ("max", lambda: gnn.aggregate(g, x, implementation=impl), lambda: refs["aggregate_max"](x))]
        for h in heads:
            xh = x.reshape(n, h, feat // h)
            att = jnp.ones((h, feat // h)) / feat
            cases.append((f"gatv2 H={h}", lambda xh=xh, att=att: gnn.gatv2(g, xh, xh, att, implementation=impl),
                          lambda xh=xh, att=att: refs["gatv2"](xh, xh, att)))
            cases.append((f"transformer H={h}", lambda xh=xh: gnn.graph_attention(g, xh, xh, xh, implementation=impl),
                          lambda xh=xh: refs["graph_attention"](xh, xh, xh)))  # fmt: skip
        for name, ours, ref in cases:
            try:
                with jax.default_matmul_precision("highest"):
                    want = jax.jit(ref)()
                err = check_close(jax.jit(ours)(), want, dtype=jnp.float32, what=f"{name} ({impl})")
            except CellFailed as e:
                ROWS.append(dict(op=name, impl=f"bs-{impl}", mode="check", error=str(e)))
                print(f"{name:18s} bs-{impl:23s} check    FAILED {e}", flush=True)
                continue
            ROWS.append(dict(op=name, impl=f"bs-{impl}", mode="check", err=err))
            print(f"{name:18s} bs-{impl:23s} check    rel err {err:.2g}", flush=True)


def bench_torch(g, x_np, feat, heads, iters):
    import torch

    dev = "cuda"
    n = g.num_nodes
    x = torch.tensor(x_np, device=dev)
    ct = torch.randn(n, feat, device=dev)
    src = torch.tensor(g.src, device=dev, dtype=torch.long)
    dst = torch.tensor(g.dst, device=dev, dtype=torch.long)
    A = torch.sparse_csr_tensor(
        torch.tensor(g.indptr, device=dev, dtype=torch.int64),
        torch.tensor(g.indices, device=dev, dtype=torch.int64),
        torch.ones(g.num_edges, device=dev),
        size=(n, n),
    )
    record("spmm_sum", "torch-CSR-cusparse", "fwd", lambda: torch_time(lambda: torch.sparse.mm(A, x), iters))

    def index_add():
        return torch.zeros_like(x).index_add_(0, dst, x[src])

    record("spmm_sum", "torch-index_add", "fwd", lambda: torch_time(index_add, iters))
    idx = dst[:, None].expand(-1, feat)

    def scatter_max():
        return torch.zeros_like(x).scatter_reduce_(0, idx, x[src], "amax", include_self=False)

    record("max", "torch-scatter_reduce", "fwd", lambda: torch_time(scatter_max, iters))
    xr = x.clone().requires_grad_(True)

    def scatter_max_bwd():
        y = torch.zeros_like(xr).scatter_reduce(0, idx, xr[src], "amax", include_self=False)
        y.backward(ct)

    record("max", "torch-scatter_reduce", "fwd+bwd", lambda: torch_time(scatter_max_bwd, iters))
    try:
        from torch_geometric.nn import GATv2Conv, TransformerConv
        from torch_geometric.utils import scatter
    except Exception as e:  # noqa: BLE001
        print("PyG unavailable:", e)
        return
    ei = torch.stack([src, dst])
    record("max", "pyg-scatter", "fwd", lambda: torch_time(lambda: scatter(x[src], dst, 0, n, reduce="max"), iters))
    for h in heads:
        d = feat // h
        cth = torch.randn(n, h * d, device=dev)
        for name, layer in (
            ("gatv2", GATv2Conv(feat, d, heads=h, add_self_loops=False, share_weights=False)),
            ("transformer", TransformerConv(feat, d, heads=h, root_weight=False)),
        ):
            layer = layer.to(dev)

            def fwd(layer=layer):
                with torch.no_grad():
                    return layer(x, ei)

            def fb(layer=layer, cth=cth):
                layer(xr, ei).backward(cth)

            record(name, "pyg", "fwd", lambda: torch_time(fwd, iters), heads=h)
            record(name, "pyg", "fwd+bwd", lambda: torch_time(fb, iters), heads=h)
            del layer
            torch.cuda.empty_cache()


def table():
    print("\n| op | heads | implementation | mode | time (ms) | extra peak memory (GiB) |")
    print("|---|---|---|---|---|---|")
    for r in ROWS:
        if r["mode"] == "check":
            continue
        t = f"{r['ms']:.3f}" if "ms" in r else "failed"
        m = f"{r['mem_bytes'] / 2**30:.3f}" if r.get("mem_bytes") is not None else ""
        print(f"| {r['op']} | {r.get('heads', '')} | {r['impl']} | {r['mode']} | {t} | {m} |")


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--nodes", type=int, default=262_144)
    p.add_argument("--edges", type=int, default=8_388_608)
    p.add_argument("--feat", type=int, default=128)
    p.add_argument("--heads", type=int, nargs="*", default=[8, 1])
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--impls", nargs="*", default=None)
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--reorder", action="store_true")
    p.add_argument("--sweep", action="store_true", help="edge-block sizes of the SpMM / max kernels")
    p.add_argument("--small", action="store_true", help="tiny graph, XLA only (CPU smoke test)")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    global JSON_PATH
    JSON_PATH = a.json
    if a.small:
        a.nodes, a.edges, a.iters, a.no_torch = 2048, 32768, 3, True
    impls = a.impls or (["pallas", "xla"] if jax.default_backend() == "gpu" else ["xla"])
    t = time.perf_counter()
    g = gnn.power_law(a.nodes, a.edges, seed=0)
    print(
        f"{g} built in {time.perf_counter() - t:.1f} s; heavy threshold {g.heavy_threshold}, chunk {g.chunk}, "
        f"extra units {g.schedule.num_extra}; device {jax.devices()[0].device_kind}",
        flush=True,
    )
    x_np = np.random.default_rng(0).standard_normal((a.nodes, a.feat)).astype(np.float32)
    x = jnp.asarray(x_np)
    bench_jax(g, x, a.feat, a.heads, a.iters, impls, a.reorder, a.sweep)
    if not a.no_torch:
        bench_torch(g, x_np, a.feat, a.heads, a.iters)
    meta = dict(
        graph=repr(g),
        nodes=a.nodes,
        edges=a.edges,
        feat=a.feat,
        device=jax.devices()[0].device_kind,
        jax=jax.__version__,
    )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(meta=meta, rows=ROWS), f, indent=1)
    table()
    ours_failed = [r for r in ROWS if "error" in r and r["impl"].startswith(("bs-", "jax-"))]
    for r in ours_failed:
        print(f"FAILED {r['op']} {r['impl']} {r['mode']}: {r['error']}", file=sys.stderr)
    return 1 if ours_failed else 0


if __name__ == "__main__":
    sys.exit(main())
