"""One graph on one device against the same graph partitioned over every device (``blocksparse.sharding.graph``).

A synthetic power-law graph (``power_law_edges``: Zipf-like in-degrees, uniform sources, node ids
shuffled), default ``N = 1,048,576`` nodes, ``E = 33,554,432`` edges, ``F = 128`` features, fp32.
Ops: SpMM (sum) and max aggregation, forward. Rows:

- ``1dev_dynamic``: a prebuilt ``DynamicGraph`` on device 0 (the kernels every device runs when sharded);
- ``1dev_static``: a static ``Graph`` on device 0 (index arrays are compile-time constants; last, and
  skipped with ``--no-static``);
- ``sharded_auto``: ``shard_graph`` over every device with the plan's choice; ``x`` sharded by rows
  beforehand (the layout the sharded ops return, so a layer's output feeds the next layer);
- ``sharded_<balance>_<sources>``: each other candidate forced;
- ``local_only``: the auto plan with its collectives replaced by local stand-ins of the same shapes
  (wrong values; the work without the communication), and ``collective_only``: the sources'
  collective alone (``"all_gather"``: one collective permute of ``x``'s rows per other device;
  ``"exchange"``: the all-to-all of the needed rows). The collective's share is
  ``1 - local_only / sharded_auto``.

Timings are ``blocksparse.bench.Timer`` medians: ``loop_ms`` (inside one jitted loop: device time)
and ``call_ms`` (back-to-back jitted calls from Python). Every sharded result is checked against the
one-device result (``max_rel_err``). The plan's choice, its estimated bytes per device and its time
estimate are recorded. The JSON is rewritten after every row.

Usage (two GPUs)::

    NCCL_NVLS_ENABLE=0 PYTHONPATH=. python3 benchmarks/bench_sharded_gnn.py --json out.json
    PYTHONPATH=. XLA_FLAGS=--xla_force_host_platform_device_count=4 python3 benchmarks/bench_sharded_gnn.py --small
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

sys.path.insert(0, ".")
import blocksparse.gnn as gnn  # noqa: E402
from blocksparse.bench import Timer  # noqa: E402
from blocksparse.gnn.generators import power_law_edges  # noqa: E402
from blocksparse.sharding import graph as sharded  # noqa: E402

OPS = {
    "spmm_sum": (lambda G, x: gnn.spmm(G, x), lambda sg, x, **kw: sharded.spmm(sg, x, **kw)),
    "aggregate_max": (lambda G, x: gnn.aggregate(G, x, "max"), lambda sg, x, **kw: sharded.aggregate(sg, x, **kw)),
}


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def _plan_dict(p: sharded.GraphShardPlan, f: int) -> dict:
    return dict(
        balance=p.balance, sources=p.sources, cuts=list(p.cuts), edges_per_device=list(p.edges_per_device),
        local_edges_per_device=list(p.local_edges_per_device), source_capacity=p.source_capacity,
        output_capacity=p.output_capacity, estimated_bytes=p.bytes_for(f), estimated_ms=1e3 * p.seconds_for(f),
        candidates=[dict(balance=c.balance, sources=c.sources, bytes=c.bytes_received * f, ms=1e3 * c.seconds * f)
                    for c in p.candidates],
    )  # fmt: skip


def _collective(sg: sharded.ShardedGraph):
    """The sources' collective of ``sg``'s plan alone, as a function of ``x`` (sharded by rows)."""
    plan, axis = sg.plan, sg.axis

    def body(xl, send):
        if plan.sources == "exchange":
            return sharded._exchange(xl, send[0], axis)
        if plan.sources == "all_gather":
            return sharded._others(xl, axis, plan.num_devices)
        return xl  # replicated: nothing moves

    send = sg.send if plan.sources == "exchange" else jnp.zeros((plan.num_devices, 1), jnp.int32)
    f = jax.shard_map(body, mesh=sg.mesh, in_specs=(P(axis), P(axis)), out_specs=P(axis))
    return (lambda x, send: f(x, send)), send


def run(a) -> dict:
    devices = jax.devices()
    platform = devices[0].platform
    result = dict(nodes=a.nodes, edges=a.edges, feat=a.feat, dtype="float32", devices=len(devices), platform=platform,
                  device_kind=devices[0].device_kind, jax=jax.__version__, rows=[], failed=[])  # fmt: skip

    def save():
        if a.json:
            with open(a.json, "w") as fh:
                json.dump(result, fh, indent=1)

    t0 = time.perf_counter()
    src, dst = power_law_edges(a.nodes, a.edges, seed=0)
    ei = np.stack([src, dst])
    result["generate_s"] = time.perf_counter() - t0
    result["max_in_degree"] = int(np.bincount(dst, minlength=a.nodes).max())
    print(
        f"{len(devices)} x {devices[0].device_kind}; power-law N={a.nodes} E={a.edges} F={a.feat} fp32, "
        f"max in-degree {result['max_in_degree']}, generated in {result['generate_s']:.1f} s",
        flush=True,
    )
    timer = Timer(iters=a.iters, trials=a.trials, warmup=1)
    one = devices[0]
    x = jax.device_put(jax.random.normal(jax.random.key(0), (a.nodes, a.feat), jnp.float32), one)

    def record(name, op, fn, *args, ref=None, extra=None):
        row = dict(name=name, op=op)
        try:
            if ref is not None:
                row["max_rel_err"] = _rel(jax.jit(fn)(*args), ref)
            row["loop_ms"] = timer.loop(fn, *args)
            row["call_ms"] = timer.calls(fn, *args)
        except Exception as e:  # noqa: BLE001 - record and go on
            traceback.print_exc(limit=4)
            result["failed"].append(f"{name} {op}: {type(e).__name__}: {str(e)[:300]}")
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        row.update(extra or {})
        result["rows"].append(row)
        save()
        ms = f"loop {row.get('loop_ms', float('nan')):8.3f} ms  call {row.get('call_ms', float('nan')):8.3f} ms"
        err = f"  err {row['max_rel_err']:.1e}" if "max_rel_err" in row else ""
        print(f"  {name:28s} {op:14s} {ms}{err}", flush=True)
        return row

    # One device: the traced graph (the kernels the sharded parts run).
    t0 = time.perf_counter()
    build = jax.jit(lambda e: gnn.DynamicGraph.from_edge_index(e, num_nodes=a.nodes))
    dg = build(jax.device_put(ei.astype(np.int32), one))
    jax.block_until_ready(dg)
    result["build_1dev_s"] = time.perf_counter() - t0
    refs = {}
    for op, (f1, _) in OPS.items():
        refs[op] = np.asarray(jax.jit(f1)(dg, x))
        record("1dev_dynamic", op, f1, dg, x)

    # Every device: the plan's choice, then the other candidates.
    mesh = Mesh(np.array(devices), ("d",))
    xs = jax.device_put(x, NamedSharding(mesh, P("d")))
    t0 = time.perf_counter()
    sg = sharded.shard_graph(ei, a.nodes, mesh, "d")
    jax.block_until_ready(sg)
    result["shard_s"] = time.perf_counter() - t0
    plan = sg.plan
    result["plan"] = _plan_dict(plan, a.feat)
    print(f"plan: balance={plan.balance} sources={plan.sources} edges/device={plan.edges_per_device} "
          f"(local {plan.local_edges_per_device}) est {plan.bytes_for(a.feat) / 2**20:.1f} MiB received/device, "
          f"{1e3 * plan.seconds_for(a.feat):.3f} ms; sharded in {result['shard_s']:.1f} s", flush=True)  # fmt: skip
    for op, (_, fs) in OPS.items():
        record("sharded_auto", op, fs, sg, xs, ref=refs[op], extra=dict(balance=plan.balance, sources=plan.sources))
        record("local_only", op, lambda sg, x, fs=fs: fs(sg, x, _skip_collectives=True), sg, xs)
    coll, send = _collective(sg)
    record("collective_only", plan.sources, coll, xs, send)
    for row_op in OPS:
        full = next(r for r in result["rows"] if r["name"] == "sharded_auto" and r["op"] == row_op)
        local = next(r for r in result["rows"] if r["name"] == "local_only" and r["op"] == row_op)
        one_dev = next(r for r in result["rows"] if r["name"] == "1dev_dynamic" and r["op"] == row_op)
        if "loop_ms" in full and "loop_ms" in local:
            full["collective_share"] = 1 - local["loop_ms"] / full["loop_ms"]
            full["speedup_vs_1dev_dynamic"] = one_dev.get("loop_ms", float("nan")) / full["loop_ms"]
            full["speedup_calls_vs_1dev_dynamic"] = one_dev.get("call_ms", float("nan")) / full["call_ms"]
            print(f"  {row_op}: speedup {full['speedup_vs_1dev_dynamic']:.2f}x (loop), "
                  f"{full['speedup_calls_vs_1dev_dynamic']:.2f}x (calls); collective share "
                  f"{100 * full['collective_share']:.0f}%", flush=True)  # fmt: skip
    save()
    del sg
    if not a.auto_only:
        for c in plan.candidates:
            if (c.balance, c.sources) == (plan.balance, plan.sources):
                continue
            other = sharded.shard_graph(ei, a.nodes, mesh, "d", balance=c.balance, sources=c.sources)
            for op, (_, fs) in OPS.items():
                est = dict(estimated_ms=1e3 * c.seconds * a.feat, estimated_bytes=c.bytes_received * a.feat)
                record(f"sharded_{c.balance}_{c.sources}", op, fs, other, xs, ref=refs[op], extra=est)
            del other

    if a.backward:  # forward and backward w.r.t. x, one device (traced graph) and the plan's choice
        sg = sharded.shard_graph(ei, a.nodes, mesh, "d")
        for op, (f1, fs) in OPS.items():
            grad1 = jax.grad(lambda x, G, f1=f1: jnp.sum(f1(G, x)))
            grads = jax.grad(lambda x, sg, fs=fs: jnp.sum(fs(sg, x)))
            ref = np.asarray(jax.jit(grad1)(x, dg))
            record("1dev_dynamic_fwd_bwd", op, lambda G, x, grad1=grad1: grad1(x, G), dg, x)
            record("sharded_auto_fwd_bwd", op, lambda sg, x, grads=grads: grads(x, sg), sg, xs, ref=ref)
        del sg
    del dg

    if a.static:  # one device, static Graph: index arrays become constants of the program (slow to compile)
        g = gnn.Graph.from_edges(src, dst, a.nodes)
        for op, (f1, _) in OPS.items():
            record("1dev_static", op, lambda x, f1=f1: f1(g, x), x, ref=refs[op])

    print("\n| op | one GPU, traced graph (ms) | one GPU, static graph (ms) | all GPUs, plan's choice (ms) | speedup |")
    print("|---|---|---|---|---|")
    rows = {(r["name"], r["op"]): r for r in result["rows"]}
    for op in OPS:
        one_dev = rows.get(("1dev_dynamic", op), {}).get("loop_ms", float("nan"))
        static = rows.get(("1dev_static", op), {}).get("loop_ms", float("nan"))
        full = rows.get(("sharded_auto", op), {})
        ms = full.get("loop_ms", float("nan"))
        full["speedup_vs_1dev_static"] = static / ms
        print(f"| {op} | {one_dev:.3f} | {static:.3f} | {ms:.3f} | {one_dev / ms:.2f}x (static: {static / ms:.2f}x) |")
    save()
    return result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1 << 20)
    ap.add_argument("--edges", type=int, default=1 << 25)
    ap.add_argument("--feat", type=int, default=128)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--no-static", dest="static", action="store_false", help="skip the static one-device rows")
    ap.add_argument("--auto-only", action="store_true", help="only the plan's choice among the sharded candidates")
    ap.add_argument("--backward", action="store_true", help="also forward + backward w.r.t. x (one GPU, plan's choice)")
    ap.add_argument("--small", action="store_true", help="a CPU-sized graph (seconds)")
    ap.add_argument("--json", default=None, help="write the results to this path")
    a = ap.parse_args(argv)
    if a.small:
        a.nodes, a.edges, a.feat, a.iters, a.trials = 4096, 65536, 16, 3, 3
    result = run(a)
    if a.json:
        print(f"wrote {a.json}")
    if result["failed"]:
        print("FAILED:\n  " + "\n  ".join(result["failed"]))
        sys.exit(1)


if __name__ == "__main__":
    main()
