"""Dynamic block sparsity on the GPU: the pattern is traced, its plan is built inside jit.

For each cell, one random pattern is timed in the same process: dense ``jnp.dot``, the static
Pallas kernel (pattern known at build time), the two dynamic Pallas designs (``scan``: no plan,
each program scans the block list for its row's blocks, one launch; ``worklist``: the
load-balanced work list of the redistributor, a dozen small XLA kernels) and the dynamic pure-JAX
reference; on a Hopper GPU with b = 64 or 128 also the static and dynamic Mosaic kernels
(``implementation="mosaic"``: the work list built inside jit, one program per unit). The
plan building is included in the dynamic times. Two timings
each: inside one jitted loop (device time, ``*_ms``) and back-to-back jitted calls from Python
(what a user's step sees, ``*_call_ms``). bf16, float32 accumulation.

Usage::

    python3 benchmarks/bench_dynamic.py --m 8192 --n 256 4096 --b 32 64 --d 16 --json out.json
"""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp
import numpy as np

import blocksparse as bs
from blocksparse import hardware
from blocksparse.bench import Timer
from blocksparse.ops.matmul import triton as pt
from blocksparse.ops.matmul.mosaic import common as pallas_mosaic


def _dynamic(mode):
    def f(D, x):
        return bs.matmul(D, x, implementation="pallas", config=pt.TritonConfig(dynamic=mode))

    return f


def bench_cell(m, n, b, d, reps, trials):
    key = jax.random.key(0)
    W = bs.random(key, (m, m), b, 1.0 / d, jnp.bfloat16)
    D = bs.DynamicBlockSparseMatrix.from_static(W, capacity=W.nnz_blocks)
    x = jax.random.normal(jax.random.key(1), (m, n), jnp.bfloat16)
    dense = W.to_dense()
    ref = np.asarray(jnp.dot(dense, x, preferred_element_type=jnp.float32))
    fns = {
        "dense": (lambda a, x: jnp.dot(a, x), dense),
        "static_pallas": (lambda W, x: bs.matmul(W, x, implementation="pallas"), W),
        "dynamic_scan": (_dynamic("scan"), D),
        "dynamic_worklist": (_dynamic("worklist"), D),
        "dynamic_xla": (lambda D, x: bs.matmul(D, x, implementation="xla"), D),
        "dynamic_default": (lambda D, x: bs.matmul(D, x), D),
    }
    if b in pallas_mosaic.SUPPORTED_BLOCKS and hardware.hopper_problem() is None:  # Hopper: the Mosaic kernels
        fns["static_mosaic"] = (lambda W, x: bs.matmul(W, x, implementation="mosaic"), W)
        fns["dynamic_mosaic"] = (lambda D, x: bs.matmul(D, x, implementation="mosaic"), D)
    row = {"m": m, "n": n, "b": b, "density": 1.0 / d, "nnz_blocks": W.nnz_blocks}
    timer = Timer(iters=reps, trials=trials)
    for name, (f, a) in fns.items():
        jf = jax.jit(f)
        y = np.asarray(jf(a, x), np.float32)
        row[f"{name}_err"] = float(np.linalg.norm(y - ref) / max(np.linalg.norm(ref), 1e-30))
        row[f"{name}_ms"] = timer.loop(f, a, x)
        row[f"{name}_call_ms"] = timer.calls(f, a, x)
    for name in fns:
        if name != "dense":
            row[f"{name}_vs_dense"] = row[f"{name}_ms"] / row["dense_ms"]
    for name in ("dynamic_scan", "dynamic_worklist", "dynamic_xla", "dynamic_default"):
        row[f"{name}_vs_static"] = row[f"{name}_ms"] / row["static_pallas_ms"]
        row[f"{name}_call_vs_static"] = row[f"{name}_call_ms"] / row["static_pallas_call_ms"]
    if "dynamic_mosaic_ms" in row:
        row["dynamic_mosaic_vs_scan"] = row["dynamic_scan_ms"] / row["dynamic_mosaic_ms"]
        row["dynamic_mosaic_vs_static_mosaic"] = row["dynamic_mosaic_ms"] / row["static_mosaic_ms"]
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", type=int, nargs="+", default=[8192])
    ap.add_argument("--n", type=int, nargs="+", default=[256, 4096])
    ap.add_argument("--b", type=int, nargs="+", default=[32, 64])
    ap.add_argument("--d", type=int, nargs="+", default=[16], help="density = 1 / D")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}")
    rows = []
    for m in args.m:
        for n in args.n:
            for b in args.b:
                for d in args.d:
                    rows.append(bench_cell(m, n, b, d, args.reps, args.trials))
                    if args.json:
                        with open(args.json, "w") as f:
                            json.dump({"device": jax.devices()[0].device_kind, "rows": rows}, f, indent=1)
    cols = ["dense", "static_pallas", "dynamic_scan", "dynamic_worklist", "dynamic_xla", "dynamic_default",
            "static_mosaic", "dynamic_mosaic"]  # fmt: skip
    short = ["dense", "static", "scan", "worklist", "dyn xla", "default", "st mgpu", "dyn mgpu"]
    for suffix, what in (("_ms", "inside one jitted loop"), ("_call_ms", "back-to-back jitted calls")):
        print(f"\n{what} (ms); scan/static")
        print(f"{'m':>5} {'n':>5} {'b':>4} {'d':>6} | " + " ".join(f"{c:>8}" for c in short) + " | scan/st")
        for r in rows:
            ratio = r["dynamic_scan" + suffix] / r["static_pallas" + suffix]
            print(
                f"{r['m']:>5} {r['n']:>5} {r['b']:>4} {'1/' + str(round(1 / r['density'])):>6} | "
                + " ".join(f"{r[c + suffix]:8.3f}" if c + suffix in r else f"{'-':>8}" for c in cols)
                + f" | {ratio:7.2f}"
            )
    print("max rel. error:", max(r[k] for r in rows for k in r if k.endswith("_err")))


if __name__ == "__main__":
    main()
