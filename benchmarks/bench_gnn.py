# ruff: noqa: B023, E402 - record() calls each closure immediately, inside the loop iteration; XLA's
# allocator setting must precede importing JAX
"""Benchmark the GNN ops against JAX segment ops, torch and PyG, in one process.

    python benchmarks/bench_gnn.py [--nodes N --edges E --feat F] [--dtype float32 bfloat16] [--ops max ...]
        [--impls pallas] [--nodes-per-program 1 2 4 8] [--edges-per-step 8 16] [--json out.json] [--small]

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
and present: without torch or a CUDA device the torch and PyG rows are skipped, with the reason
printed and stored under ``meta.torch_rows``. The library's own suite is ``blocksparse bench --suite gnn --full``.

Ours are the library's defaults (``bs.gnn.spmm``, ``bs.gnn.aggregate``, ``bs.gnn.gatv2`` with no tuning
argument; ``meta.defaults`` names the kernel configurations they resolve to per dtype). Max runs two
ways: ``bs-{impl}`` is ``aggregate``'s forward alone (values only: ``ops.gnn.order.aggregate_variant``),
and ``bs-{impl}-with_arg`` the forward that training runs (values and arg-max, ``segment_extreme(...,
with_arg=True)``; checked exactly against the XLA reference's values and arg-max).

``--dtype`` takes one or more dtypes; each runs every op, ours and the peers', on features of that
dtype, one after the other in this process (bfloat16: accumulation in float32 inside our kernels;
half the bytes gathered); a peer without bfloat16 support fails its row and is recorded. Rows carry
``dtype``; SpMM and max rows carry ``gather_gbps``, the bytes of the gathered source rows
(``E x F x itemsize``) per second. The run ends with a summary of the headline ratios per dtype (ours
/ cuSPARSE, ours / XLA, PyG / ours in time and memory, each against its target where one is set),
also stored under ``summary`` in the JSON. A JAX row whose first call shows that its timing would take
more than ``--row-budget-s`` gets fewer iterations (``iters`` in the row). ``--nodes-per-program`` sweeps the max
kernel's light nodes per program (``bs-pallas-npp{G}``: forward and forward+backward through
``bs.gnn.aggregate``; for ``G > 1`` also, forward only, ``-idorder``: nodes grouped in id order
instead of longest-first, and ``-prefetch``: next step's edge ids loaded before this step's
gather); ``--edges-per-step`` adds forward rows of each packed ``G`` at
those edge-tile lengths (``bs-pallas-npp{G}-be{be}``). Every swept variant is first checked
against the reference.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # torch allocates on the same GPU

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
META: dict = {}  # the run's description, written with the rows
JSON_PATH = None
ROW_BUDGET_S = 30.0  # --row-budget-s
LAST: dict = {}  # extra metrics of the last jax_time call
COMMON: dict = {}  # keys of every row of this run (dtype)
GATHER_BYTES: dict = {}  # op -> bytes of source rows gathered per call (spmm_sum, max)


def jax_time(fn, *args, iters=20, warmup=3):
    """(median ms per call inside one jitted loop, extra bytes of the compiled program); ``calls_ms`` in LAST.

    A first call times ``fn``: where ``Timer.loop`` and ``Timer.calls`` would take more than ``ROW_BUDGET_S``
    together, fewer ``iters`` (at least 1; recorded as ``iters`` in the row)."""
    comp = jax.jit(fn).lower(*args).compile()
    try:
        ma = comp.memory_analysis()
        mem = int(ma.temp_size_in_bytes + ma.output_size_in_bytes)
    except Exception:  # noqa: BLE001
        mem = None
    t = time.perf_counter()
    jax.block_until_ready(comp(*args))
    calls = 2 * (warmup + 3) * (time.perf_counter() - t)  # per iteration: loop and calls, warm-up and trials
    if calls * iters > ROW_BUDGET_S:
        iters = LAST["iters"] = max(1, int(ROW_BUDGET_S // max(calls, 1e-9)))
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
        ROWS.append(dict(op=op, impl=impl, mode=mode, error=f"{type(e).__name__}: {str(e)[:200]}", **COMMON, **kw))
        print(f"{op:18s} {impl:26s} {mode:8s} FAILED {type(e).__name__}", flush=True)
        return
    row = dict(op=op, impl=impl, mode=mode, ms=ms, mem_bytes=mem, **LAST, **COMMON, **kw)
    if mode == "fwd" and op in GATHER_BYTES:
        row["gather_gbps"] = GATHER_BYTES[op] / (ms * 1e-3) / 1e9
    ROWS.append(row)
    dump()
    m = f"{mem / 2**30:8.3f} GiB" if mem is not None else ""
    bw = f"{row['gather_gbps']:8.4g} GB/s" if "gather_gbps" in row else ""
    print(f"{op:18s} {impl:26s} {mode:8s} {ms:9.3f} ms {m} {bw}", flush=True)


def dump(**extra):
    """The JSON (rewritten after every row, so a run cut short keeps what it measured)."""
    if JSON_PATH:
        with open(JSON_PATH, "w") as f:
            json.dump(dict(meta=META, rows=ROWS, **extra), f, indent=1)


OPS = ("spmm_sum", "max", "gatv2", "transformer")


def extreme(impl):
    """The ``segment_extreme`` of an implementation (the kernel module, or the XLA reference)."""
    from blocksparse.ops.gnn import registry

    return registry.module("aggregate", impl).segment_extreme


def kernel_defaults(g, dtype) -> dict:
    """What the defaults resolve to on ``g`` for ``dtype`` (the Pallas kernels' configurations)."""
    from blocksparse.ops.gnn import order

    rule = order.aggregate_nodes_per_program(g.edge_capacity / max(g.num_nodes, 1))
    tag = lambda v: (v.tag() if v else "") or "plain"  # noqa: E731
    npp, variant = order.aggregate_variant(dtype, False)
    npp_arg, variant_arg = order.aggregate_variant(dtype, True)
    return dict(
        spmm=dict(nodes_per_program=1, variant=tag(order.spmm_variant(1))),
        max_values=dict(nodes_per_program=npp or rule, variant=tag(variant)),
        max_with_arg=dict(nodes_per_program=npp_arg or rule, variant=tag(variant_arg)),
    )


def bench_jax(g, x, feat, heads, iters, impls, do_reorder, sweep=False, ops=OPS, npp=(), bes=()):
    key = jax.random.key(0)
    n = g.num_nodes
    dt = x.dtype
    ct = jax.random.normal(key, (n, feat)).astype(dt)

    def grad_of(f):
        return jax.value_and_grad(lambda x: jnp.sum((f(x) * ct).astype(jnp.float32)))

    check(g, x, feat, heads, impls, ops)
    for impl in impls:
        if "spmm_sum" in ops:
            sp = lambda x, impl=impl: gnn.spmm(g, x, implementation=impl)
            record("spmm_sum", f"bs-{impl}", "fwd", lambda: jax_time(sp, x, iters=iters))
            record("spmm_sum", f"bs-{impl}", "fwd+bwd", lambda: jax_time(grad_of(sp), x, iters=iters))
        if "max" in ops:
            mx = lambda x, impl=impl: gnn.aggregate(g, x, "max", implementation=impl)
            record("max", f"bs-{impl}", "fwd", lambda: jax_time(mx, x, iters=iters))
            record("max", f"bs-{impl}", "fwd+bwd", lambda: jax_time(grad_of(mx), x, iters=iters))
            arg = lambda x, impl=impl: extreme(impl)(g, x, True, with_arg=True)  # the forward that training runs
            record("max", f"bs-{impl}-with_arg", "fwd", lambda: jax_time(arg, x, iters=iters))
    # raw segment ops (the plain-JAX baseline)
    src_s, dst_s = jnp.asarray(g.indices), jnp.asarray(g.dst_sorted)
    src_u, dst_u = jnp.asarray(g.src), jnp.asarray(g.dst)
    if "spmm_sum" in ops:
        record(
            "spmm_sum",
            "jax-segment_sum-sorted",
            "fwd",
            lambda: jax_time(
                lambda x: jax.ops.segment_sum(x[src_s], dst_s, n, indices_are_sorted=True), x, iters=iters
            ),
        )
        record(
            "spmm_sum",
            "jax-segment_sum-unsorted",
            "fwd",
            lambda: jax_time(lambda x: jax.ops.segment_sum(x[src_u], dst_u, n), x, iters=iters),
        )
    if "max" in ops:
        record(
            "max",
            "jax-segment_max-sorted",
            "fwd",
            lambda: jax_time(
                lambda x: jax.ops.segment_max(x[src_s], dst_s, n, indices_are_sorted=True), x, iters=iters
            ),
        )
    # cuSPARSE through jax.experimental.sparse: float32 only (other dtypes fall back to a generic lowering)
    if "spmm_sum" in ops and jax.default_backend() == "gpu" and jnp.dtype(dt) == jnp.float32:

        def cusparse():
            from jax.experimental import sparse

            jax.config.update("jax_bcoo_cusparse_lowering", True)
            csr = (jnp.ones(g.num_edges, dt), jnp.asarray(g.indices), jnp.asarray(g.indptr))
            # the matrix's arrays are arguments: captured as constants, XLA would fold its index conversions
            return jax_time(lambda x, d, i, p: sparse.BCSR((d, i, p), shape=(n, n)) @ x, x, *csr, iters=iters)

        record("spmm_sum", "jax-BCSR-cusparse", "fwd", cusparse)

    # attention with projections, like the PyG layers
    for h in heads:
        d = feat // h
        ks = jax.random.split(jax.random.key(h), 6)
        w1, w2, w3 = ((jax.random.normal(k, (feat, feat)) / feat**0.5).astype(dt) for k in ks[:3])
        att = jax.random.normal(ks[3], (h, d)).astype(dt)
        cth = jax.random.normal(ks[4], (n, h, d)).astype(dt)
        for impl in impls:

            def gat(x, w1, w2, att, impl=impl, h=h, d=d):
                return gnn.gatv2(g, (x @ w1).reshape(n, h, d), (x @ w2).reshape(n, h, d), att, implementation=impl)

            def tr(x, w1, w2, w3, impl=impl, h=h, d=d):
                q, k, v = ((x @ w).reshape(n, h, d) for w in (w1, w2, w3))
                return gnn.graph_attention(g, q, k, v, implementation=impl)

            loss = lambda f: lambda *a: jnp.sum((f(*a) * cth).astype(jnp.float32))
            gg = jax.value_and_grad(loss(gat), argnums=(0, 1, 2, 3))
            tg = jax.value_and_grad(loss(tr), argnums=(0, 1, 2, 3))
            if "gatv2" in ops:
                record("gatv2", f"bs-{impl}", "fwd", lambda: jax_time(gat, x, w1, w2, att, iters=iters), heads=h)
                record("gatv2", f"bs-{impl}", "fwd+bwd", lambda: jax_time(gg, x, w1, w2, att, iters=iters), heads=h)
            if "transformer" in ops:
                record("transformer", f"bs-{impl}", "fwd", lambda: jax_time(tr, x, w1, w2, w3, iters=iters), heads=h)
                record(
                    "transformer", f"bs-{impl}", "fwd+bwd", lambda: jax_time(tg, x, w1, w2, w3, iters=iters), heads=h
                )

    if sweep and "pallas" in impls:
        from blocksparse.ops.gnn.aggregate.pallas_triton import segment_extreme
        from blocksparse.ops.gnn.spmm.pallas_triton import csr_sum

        for be in (16, 32, 64):
            if "spmm_sum" in ops:
                record(
                    "spmm_sum",
                    f"bs-pallas-be{be}",
                    "fwd",
                    lambda be=be: jax_time(lambda x: csr_sum(g, None, x, be=be), x, iters=iters),
                )
            if "max" in ops:  # the one-node-per-program kernel (see --nodes-per-program for the packed one)
                record(
                    "max",
                    f"bs-pallas-be{be}",
                    "fwd",
                    lambda be=be: jax_time(
                        lambda x: segment_extreme(g, x, True, with_arg=False, be=be, nodes_per_program=1)[0],
                        x,
                        iters=iters,
                    ),
                )

    if npp and "pallas" in impls:
        sweep_nodes_per_program(g, x, npp, bes, iters, grad_of)

    if do_reorder:
        for method in ("rcm", "degree"):
            t = time.perf_counter()
            g2, perm = gnn.reorder(g, method)
            print(f"reorder {method}: {time.perf_counter() - t:.1f} s", flush=True)
            x2 = x[jnp.asarray(perm)]
            impl = impls[0]
            if "spmm_sum" in ops:
                record(
                    "spmm_sum",
                    f"bs-{impl}+{method}",
                    "fwd",
                    lambda: jax_time(lambda x: gnn.spmm(g2, x, implementation=impl), x2, iters=iters),
                )
            if "max" in ops:
                record(
                    "max",
                    f"bs-{impl}+{method}",
                    "fwd",
                    lambda: jax_time(lambda x: gnn.aggregate(g2, x, implementation=impl), x2, iters=iters),
                )
            if "gatv2" in ops:
                d = feat // 8
                xh = x2.reshape(n, 8, d)
                record(
                    "gatv2",
                    f"bs-{impl}+{method}",
                    "fwd",
                    lambda: jax_time(
                        lambda a: gnn.gatv2(g2, a, a, jnp.ones((8, d), dt), implementation=impl), xh, iters=iters
                    ),
                    heads=8,
                )


def sweep_nodes_per_program(g, x, npp, bes, iters, grad_of):
    """The max kernel at each ``nodes_per_program`` (and edge-tile length): checked, then timed."""
    from blocksparse.ops.gnn.aggregate.pallas_triton import one_node_tiles, packed_tiles, segment_extreme

    want = jax.jit(lambda x: gnn.aggregate(g, x, "max", implementation="xla"))(x)
    f = x.shape[1]
    for nodes in npp:
        variants = [(f"bs-pallas-npp{nodes}", dict(), True)]
        if nodes > 1:
            variants.append((f"bs-pallas-npp{nodes}-idorder", dict(sort_by_degree=False), False))
            variants.append((f"bs-pallas-npp{nodes}-prefetch", dict(prefetch=True), False))
            variants += [(f"bs-pallas-npp{nodes}-be{be}", dict(be=be), False) for be in bes]
        for impl, kw, with_bwd in variants:
            be = kw.get("be") or (packed_tiles(nodes, f)[0] if nodes > 1 else one_node_tiles(f)[0])
            meta = dict(nodes_per_program=nodes, be=be, sort_by_degree=kw.get("sort_by_degree", nodes > 1))
            meta.update(prefetch=kw.get("prefetch", False))

            def fwd(x, nodes=nodes, kw=kw):
                return segment_extreme(g, x, True, with_arg=False, nodes_per_program=nodes, **kw)[0]

            try:
                err = check_close(jax.jit(fwd)(x), want, dtype=x.dtype, what=f"max ({impl})")
            except CellFailed as e:
                ROWS.append(dict(op="max", impl=impl, mode="check", error=str(e), **COMMON, **meta))
                print(f"{'max':18s} {impl:26s} check    FAILED {e}", flush=True)
                continue
            ROWS.append(dict(op="max", impl=impl, mode="check", err=err, **COMMON, **meta))
            record("max", impl, "fwd", lambda fwd=fwd: jax_time(fwd, x, iters=iters), **meta)
            if with_bwd:

                def api(x, nodes=nodes):
                    return gnn.aggregate(
                        g, x, "max", implementation="pallas", config=gnn.GatherConfig(nodes_per_program=nodes)
                    )

                record("max", impl, "fwd+bwd", lambda api=api: jax_time(grad_of(api), x, iters=iters), **meta)


def check(g, x, feat, heads, impls, ops=OPS):
    """Each op of ours, forward, against the JAX segment-op reference; a mismatch is a failed row.

    The reference runs on float32 copies of the inputs; the tolerance is that of ``x``'s dtype.
    """
    n = g.num_nodes
    refs = references(jnp.asarray(g.src), jnp.asarray(g.dst), n)
    x32 = x.astype(jnp.float32)
    for impl in impls:
        cases = [
            ("spmm_sum", lambda: gnn.spmm(g, x, implementation=impl), lambda: refs["spmm_sum"](x32)),
            ("max", lambda: gnn.aggregate(g, x, implementation=impl), lambda: refs["aggregate_max"](x32)),
        ]
        for h in heads:
            xh, xh32 = x.reshape(n, h, feat // h), x32.reshape(n, h, feat // h)
            att = jnp.ones((h, feat // h)) / feat
            cases.append(
                (
                    f"gatv2 H={h}",
                    lambda xh=xh, att=att: gnn.gatv2(g, xh, xh, att.astype(x.dtype), implementation=impl),
                    lambda xh=xh32, att=att: refs["gatv2"](xh, xh, att),
                )
            )
            cases.append((f"transformer H={h}", lambda xh=xh: gnn.graph_attention(g, xh, xh, xh, implementation=impl),
                          lambda xh=xh32: refs["graph_attention"](xh, xh, xh)))  # fmt: skip
        for name, ours, ref in cases:
            if name.split(" ")[0] not in ops:
                continue
            try:
                with jax.default_matmul_precision("highest"):
                    want = jax.jit(ref)()
                err = check_close(jax.jit(ours)(), want, dtype=x.dtype, what=f"{name} ({impl})")
            except CellFailed as e:
                ROWS.append(dict(op=name, impl=f"bs-{impl}", mode="check", error=str(e), **COMMON))
                print(f"{name:18s} bs-{impl:23s} check    FAILED {e}", flush=True)
                continue
            ROWS.append(dict(op=name, impl=f"bs-{impl}", mode="check", err=err, **COMMON))
            print(f"{name:18s} bs-{impl:23s} check    rel err {err:.2g}", flush=True)
    if "max" in ops:
        check_with_arg(g, x, impls)


def check_with_arg(g, x, impls):
    """Each implementation's max with arg-max against the XLA reference: values and arg positions exactly."""
    want = jax.tree.leaves(jax.jit(lambda x: extreme("xla")(g, x, True, with_arg=True))(x))
    for impl in impls:
        row = dict(op="max", impl=f"bs-{impl}-with_arg", mode="check", **COMMON)
        try:
            got = jax.tree.leaves(jax.jit(lambda x, impl=impl: extreme(impl)(g, x, True, with_arg=True))(x))
            bad = [k for k, a, b in zip(("values", "arg"), got, want, strict=True)
                   if not np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True)]  # fmt: skip
            if bad:
                raise CellFailed(f"max with arg-max ({impl}): expected the reference's {' and '.join(bad)} exactly")
        except Exception as e:  # noqa: BLE001 - a failed check is a failed row (exit status 1)
            ROWS.append(dict(row, error=f"{type(e).__name__}: {e}"))
            print(f"{'max':18s} bs-{impl + '-with_arg':23s} check    FAILED {e}", flush=True)
            continue
        ROWS.append(dict(row, err=0.0))
        print(f"{'max':18s} bs-{impl + '-with_arg':23s} check    exact", flush=True)


def bench_torch(g, x_np, feat, heads, iters, dtype="float32", ops=OPS):
    import torch

    dev = "cuda"
    tdt = getattr(torch, dtype)
    n = g.num_nodes
    x = torch.tensor(x_np, device=dev).to(tdt)
    ct = torch.randn(n, feat, device=dev, dtype=tdt)
    src = torch.tensor(g.src, device=dev, dtype=torch.long)
    dst = torch.tensor(g.dst, device=dev, dtype=torch.long)
    A = torch.sparse_csr_tensor(
        torch.tensor(g.indptr, device=dev, dtype=torch.int64),
        torch.tensor(g.indices, device=dev, dtype=torch.int64),
        torch.ones(g.num_edges, device=dev, dtype=tdt),
        size=(n, n),
    )
    if "spmm_sum" in ops:
        record("spmm_sum", "torch-CSR-cusparse", "fwd", lambda: torch_time(lambda: torch.sparse.mm(A, x), iters))

        def index_add():
            return torch.zeros_like(x).index_add_(0, dst, x[src])

        record("spmm_sum", "torch-index_add", "fwd", lambda: torch_time(index_add, iters))
    idx = dst[:, None].expand(-1, feat)

    def scatter_max():
        return torch.zeros_like(x).scatter_reduce_(0, idx, x[src], "amax", include_self=False)

    xr = x.clone().requires_grad_(True)

    def scatter_max_bwd():
        y = torch.zeros_like(xr).scatter_reduce(0, idx, xr[src], "amax", include_self=False)
        y.backward(ct)

    if "max" in ops:
        record("max", "torch-scatter_reduce", "fwd", lambda: torch_time(scatter_max, iters))
        record("max", "torch-scatter_reduce", "fwd+bwd", lambda: torch_time(scatter_max_bwd, iters))
    try:
        from torch_geometric.nn import GATv2Conv, TransformerConv
        from torch_geometric.utils import scatter
    except Exception as e:  # noqa: BLE001
        print("PyG unavailable:", e)
        return
    ei = torch.stack([src, dst])
    if "max" in ops:
        pyg_max = lambda: scatter(x[src], dst, 0, n, reduce="max")
        record("max", "pyg-scatter", "fwd", lambda: torch_time(pyg_max, iters))
    for h in heads:
        d = feat // h
        cth = torch.randn(n, h * d, device=dev, dtype=tdt)
        for name, layer in (
            ("gatv2", GATv2Conv(feat, d, heads=h, add_self_loops=False, share_weights=False)),
            ("transformer", TransformerConv(feat, d, heads=h, root_weight=False)),
        ):
            if name not in ops:
                continue
            layer = layer.to(dev, tdt)

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
    head = "dtype | op | heads | implementation | mode | time (ms) | calls (ms) | extra peak memory (GiB) | gather GB/s"
    print(f"\n| {head} |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in ROWS:
        if r["mode"] == "check":
            continue
        t = f"{r['ms']:.3f}" if "ms" in r else "failed"
        calls = f"{r['calls_ms']:.3f}" if "calls_ms" in r else ""
        m = f"{r['mem_bytes'] / 2**30:.3f}" if r.get("mem_bytes") is not None else ""
        bw = f"{r['gather_gbps']:.4g}" if "gather_gbps" in r else ""
        print(f"| {r.get('dtype', '')} | {r['op']} | {r.get('heads', '')} | {r['impl']} | {r['mode']} | {t} "
              f"| {calls} | {m} | {bw} |")  # fmt: skip


#: The headline comparisons: (op, heads, mode, our row's suffix, peer, measure, target). ``ours/peer``: our
#: time over the peer's (below 1: ours is faster); ``peer/ours`` and ``peer/ours memory``: how many times
#: faster / less extra memory ours is. ``target``: (comparison, value), or None.
COMPARISONS = (
    ("spmm_sum", None, "fwd", "", "torch-CSR-cusparse", "ours/peer", ("<=", 0.8)),
    ("spmm_sum", None, "fwd", "", "jax-segment_sum-sorted", "ours/peer", None),
    ("spmm_sum", None, "fwd", "", "jax-BCSR-cusparse", "ours/peer", None),
    ("max", None, "fwd", "", "jax-segment_max-sorted", "ours/peer", None),
    ("max", None, "fwd", "-with_arg", "jax-segment_max-sorted", "ours/peer", None),
    ("max", None, "fwd", "", "torch-scatter_reduce", "peer/ours", None),
    ("max", None, "fwd", "-with_arg", "torch-scatter_reduce", "peer/ours", None),
    ("max", None, "fwd", "", "pyg-scatter", "peer/ours", None),
    ("max", None, "fwd+bwd", "", "torch-scatter_reduce", "peer/ours", None),
    ("gatv2", 1, "fwd", "", "pyg", "peer/ours", None),
    ("gatv2", 1, "fwd+bwd", "", "pyg", "peer/ours", (">=", 8.0)),
    ("gatv2", 1, "fwd+bwd", "", "pyg", "peer/ours memory", None),
    ("gatv2", 8, "fwd", "", "pyg", "peer/ours", None),
    ("gatv2", 8, "fwd+bwd", "", "pyg", "peer/ours", (">=", 13.0)),
    ("gatv2", 8, "fwd+bwd", "", "pyg", "peer/ours memory", (">=", 39.0)),
)


def summary(ours: str) -> list[dict]:
    """The :data:`COMPARISONS` whose two rows ran, per dtype, for our implementation ``ours`` (``bs-pallas``)."""
    rows = {(r.get("dtype"), r["op"], r.get("heads"), r["impl"], r["mode"]): r for r in ROWS if "ms" in r}
    out = []
    print("\nsummary (device time in a jitted loop; torch: CUDA events)")
    for dtype in META.get("dtypes", []):
        for op, heads, mode, suffix, peer, measure, target in COMPARISONS:
            a, b = rows.get((dtype, op, heads, ours + suffix, mode)), rows.get((dtype, op, heads, peer, mode))
            if a is None or b is None:
                continue
            key = "mem_bytes" if measure.endswith("memory") else "ms"
            if not a.get(key) or not b.get(key):
                continue
            ratio = a[key] / b[key] if measure == "ours/peer" else b[key] / a[key]
            s = dict(dtype=dtype, op=op, heads=heads, mode=mode, ours=ours + suffix, peer=peer, measure=measure,
                     ours_value=a[key], peer_value=b[key], ratio=ratio)  # fmt: skip
            verdict = ""
            if target is not None:
                cmp, value = target
                s.update(target=f"{cmp} {value:g}", met=ratio <= value if cmp == "<=" else ratio >= value)
                verdict = f"  (target {cmp} {value:g}: {'met' if s['met'] else 'MISSED'})"
            out.append(s)
            unit = "GiB" if key == "mem_bytes" else "ms"
            scale = 2**-30 if key == "mem_bytes" else 1.0
            what = op + (f" H={heads}" if heads else "")
            print(f"  {dtype:8s} {what:10s} {mode:7s} {ours + suffix:18s} {a[key] * scale:8.3f} {unit} vs {peer:22s} "
                  f"{b[key] * scale:8.3f} {unit}: {measure} {ratio:.3f}{verdict}", flush=True)  # fmt: skip
    return out


def torch_unavailable() -> str | None:
    """Why the torch and PyG rows cannot run (``None``: they can); the versions go to ``META``."""
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        return f"torch unavailable: {type(e).__name__}: {e}"
    META["torch"] = torch.__version__
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device"
    META["torch_device"] = torch.cuda.get_device_name(0)
    try:
        import torch_geometric

        META["torch_geometric"] = torch_geometric.__version__
    except Exception as e:  # noqa: BLE001 - bench_torch records the PyG rows' absence itself
        META["torch_geometric"] = f"unavailable: {type(e).__name__}: {e}"
    return None


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
    p.add_argument("--dtype", nargs="+", choices=["float32", "bfloat16"], default=["float32"],
                   help="features' dtype(s): every row, for each in turn, in this process")  # fmt: skip
    p.add_argument("--ops", nargs="*", choices=OPS, default=list(OPS), help="ops to run (default: all)")
    p.add_argument(
        "--nodes-per-program", type=int, nargs="*", default=[], help="max kernel sweep, e.g. 1 2 4 8 16 (Pallas)"
    )
    p.add_argument("--edges-per-step", type=int, nargs="*", default=[], help="with --nodes-per-program: be values")
    p.add_argument("--row-budget-s", type=float, default=30.0,
                   help="fewer iterations for a JAX row whose first call says it would take longer")  # fmt: skip
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    global JSON_PATH, ROW_BUDGET_S
    JSON_PATH, ROW_BUDGET_S = a.json, a.row_budget_s
    dtypes = list(dict.fromkeys(a.dtype))
    if a.small:
        a.nodes, a.edges, a.iters, a.no_torch = 2048, 32768, 3, True
    impls = a.impls or (["pallas", "xla"] if jax.default_backend() == "gpu" else ["xla"])
    t = time.perf_counter()
    g = gnn.power_law(a.nodes, a.edges, seed=0)
    device = jax.devices()[0].device_kind
    print(
        f"{g} built in {time.perf_counter() - t:.1f} s; heavy threshold {g.heavy_threshold}, chunk {g.chunk}, "
        f"extra units {g.schedule.num_extra}; device {device}",
        flush=True,
    )
    META.clear()
    META.update(graph=repr(g), nodes=a.nodes, edges=a.edges, feat=a.feat, dtype=",".join(dtypes), dtypes=dtypes,
                impls=impls, device=device, backend=jax.default_backend(), jax=jax.__version__, iters=a.iters,
                row_budget_s=a.row_budget_s, argv=sys.argv[1:] if argv is None else list(argv),
                defaults={dt: kernel_defaults(g, dt) for dt in dtypes})  # fmt: skip
    why = "--no-torch" if a.no_torch else torch_unavailable()
    if why:
        META["torch_rows"] = f"skipped: {why}"
        print(f"torch and PyG rows skipped: {why}", flush=True)
    x_np = np.random.default_rng(0).standard_normal((a.nodes, a.feat)).astype(np.float32)
    for dtype in dtypes:
        COMMON["dtype"] = dtype
        print(f"\n-- {dtype} features; defaults: {META['defaults'][dtype]}", flush=True)
        gathered = g.num_edges * a.feat * jnp.dtype(dtype).itemsize
        GATHER_BYTES.update(spmm_sum=gathered, max=gathered)
        x = jnp.asarray(x_np).astype(dtype)
        bench_jax(g, x, a.feat, a.heads, a.iters, impls, a.reorder, a.sweep, a.ops, a.nodes_per_program,
                  a.edges_per_step)  # fmt: skip
        if not why:
            try:
                bench_torch(g, x_np, a.feat, a.heads, a.iters, dtype, a.ops)
            except Exception as e:  # noqa: BLE001 - a peer that cannot even be set up is recorded, not fatal
                traceback.print_exc(limit=3)
                error = f"{type(e).__name__}: {str(e)[:300]}"
                ROWS.append(dict(op="all", impl="torch", mode="setup", error=error, **COMMON))
            import torch

            torch.cuda.empty_cache()  # what torch held goes back before JAX's next allocations
        del x
    table()
    dump(summary=summary(f"bs-{impls[0]}"))
    ours_failed = [r for r in ROWS if "error" in r and r["impl"].startswith(("bs-", "jax-"))]
    for r in ours_failed:
        print(f"FAILED {r['op']} {r['impl']} {r['mode']}: {r['error']}", file=sys.stderr)
    return 1 if ours_failed else 0


if __name__ == "__main__":
    sys.exit(main())
