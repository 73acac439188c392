"""One block-sparse matrix on one device against the same matrix partitioned over all devices (bs.shard).

Rows: dense ``jnp.dot`` on one device, ``bs.matmul`` on one device, and ``bs.shard`` over every
device with the split chosen by its byte estimate and with each split forced. Two timings each,
medians over trials: inside one jitted loop (``loop_ms``, device time) and back-to-back jitted calls
from Python (``call_ms``, what a step sees). The device count, the chosen split and collective and
the estimated bytes each device receives are printed. Default: ``m = k = 32768, n = 8192, b = 64,
d = 1/16``, bf16 (for GPUs); ``--small`` is a CPU-sized run of a few seconds.

Usage::

    python3 benchmarks/bench_sharded.py [--json out.json]
    python3 benchmarks/bench_sharded.py --small     # e.g. with XLA_FLAGS=--xla_force_host_platform_device_count=4
"""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import blocksparse as bs
from blocksparse.bench import Timer


def run(m, k, n, b, density, dtype, reps, trials):
    devices = jax.devices()
    W = bs.random(jax.random.key(0), (m, k), b, density, dtype)
    x = jax.random.normal(jax.random.key(1), (k, n), dtype)
    one = jax.devices()[0]
    W1, x1 = jax.device_put(W, one), jax.device_put(x, one)
    dense = jax.device_put(W.to_dense(), one)
    mesh = Mesh(np.array(devices), ("d",))
    # x replicated on every device beforehand, as a model-parallel layer receives it: the timings
    # are of the product and its collective, not of copying x from one GPU to the others per call.
    x_rep = jax.device_put(x, NamedSharding(mesh, P()))
    ref = np.asarray(jnp.dot(dense, x1, preferred_element_type=jnp.float32))
    scale = float(np.abs(ref).max()) or 1.0

    cases = {
        "dense_1dev": (lambda a, x: jnp.dot(a, x), dense, x1, None),
        "sparse_1dev": (lambda W, x: bs.matmul(W, x), W1, x1, None),
    }
    for name, kw in [
        ("sharded_auto", {}),
        ("sharded_rows_lines", dict(split="rows", balance="lines")),
        ("sharded_rows_blocks", dict(split="rows", balance="blocks")),
        ("sharded_cols_psum", dict(split="cols", collective="psum")),
        ("sharded_cols_psum_scatter", dict(split="cols", collective="psum_scatter")),
    ]:
        if kw.get("collective") == "psum_scatter" and m % len(devices):
            continue
        cases[name] = (lambda Ws, x: Ws @ x, bs.shard(W, mesh, "d", **kw), x_rep, None)
    result = {
        "m": m,
        "k": k,
        "n": n,
        "b": b,
        "density": density,
        "dtype": jnp.dtype(dtype).name,
        "devices": len(devices),
        "platform": devices[0].platform,
        "nnz_blocks": W.nnz_blocks,
        "rows": [],
    }
    print(
        f"{len(devices)} device(s) ({devices[0].platform}); m={m} k={k} n={n} b={b} d={density:.4g} "
        f"{result['dtype']}, {W.nnz_blocks} blocks"
    )
    timer = Timer(iters=reps, trials=trials)
    for name, (fn, A, xx, _) in cases.items():
        f = jax.jit(fn)
        y = f(A, xx)
        err = float(np.abs(np.asarray(y, np.float32) - ref).max()) / scale
        row = {
            "name": name,
            "loop_ms": timer.loop(fn, A, xx),
            "call_ms": timer.calls(fn, A, xx),
            "max_rel_err": err,
            "out_sharding": str(getattr(y.sharding, "spec", y.sharding)),
        }
        if isinstance(A, bs.ShardedBlockSparseMatrix):
            p = A.plan
            row.update(
                split=p.split,
                collective=p.collective,
                estimated_bytes=p.bytes_for(n),
                estimated_ms=1e3 * p.seconds_for(n),
                blocks_per_device=list(p.blocks_per_device),
            )
        result["rows"].append(row)
        extra = ""
        if "split" in row:
            extra = (
                f"  split={row['split']} collective={row['collective']} "
                f"est={row['estimated_bytes'] / 2**20:.1f} MiB/device {row['estimated_ms']:.2f} ms "
                f"blocks={row['blocks_per_device']}"
            )
        print(
            f"  {name:27s} loop {row['loop_ms']:9.3f} ms   call {row['call_ms']:9.3f} ms   "
            f"err {err:.1e}  out {row['out_sharding']}{extra}"
        )
    auto = next(r for r in result["rows"] if r["name"] == "sharded_auto")
    print(
        f"chosen: split={auto['split']} collective={auto['collective']} "
        f"estimated {auto['estimated_bytes'] / 2**20:.1f} MiB received per device, {auto['estimated_ms']:.2f} ms"
    )
    return result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="a CPU-sized problem (seconds)")
    ap.add_argument("--m", type=int, default=32768)
    ap.add_argument("--k", type=int, default=None, help="default: m")
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--b", type=int, default=64)
    ap.add_argument("--d", type=float, default=16, help="density 1/d")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--json", default=None, help="write the results to this path")
    args = ap.parse_args(argv)
    if args.small:
        args.m, args.n, args.b, args.d, args.dtype, args.reps, args.trials = 1024, 256, 32, 8, "float32", 3, 3
    result = run(args.m, args.k or args.m, args.n, args.b, 1.0 / args.d, jnp.dtype(args.dtype), args.reps, args.trials)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
