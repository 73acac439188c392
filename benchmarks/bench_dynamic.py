"""Dynamic block sparsity on the GPU: the pattern is traced, the work list is built inside jit.

For each cell, one random pattern is timed four ways in the same process: dense ``jnp.dot``,
the static Pallas kernel (pattern known at build time), the dynamic Pallas path (redistributor +
the same kernel; the sort and schedule build are included in its time) and the dynamic pure-JAX
reference (gather, batched dot, segment sum). PopSparse found static faster than dynamic; this
measures what dynamic costs here. Timing as in ``bench_matmul.py`` (calls inside one jitted loop,
median of trials). bf16, float32 accumulation.

Usage::

    python3 benchmarks/bench_dynamic.py --m 8192 --n 256 4096 --b 32 64 --d 16 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_matmul import _time_jax_loop  # noqa: E402

import blocksparse as bs  # noqa: E402


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
        "dynamic_pallas": (lambda D, x: bs.matmul(D, x, implementation="pallas"), D),
        "dynamic_xla": (lambda D, x: bs.matmul(D, x, implementation="xla"), D),
    }
    row = {"m": m, "n": n, "b": b, "density": 1.0 / d, "nnz_blocks": W.nnz_blocks}
    for name, (f, a) in fns.items():
        y = np.asarray(jax.jit(f)(a, x), np.float32)
        row[f"{name}_err"] = float(np.linalg.norm(y - ref) / max(np.linalg.norm(ref), 1e-30))
        row[f"{name}_ms"] = 1e3 * _time_jax_loop(f, (a, x), reps, trials)
    for name in ("static_pallas", "dynamic_pallas", "dynamic_xla"):
        row[f"{name}_vs_dense"] = row[f"{name}_ms"] / row["dense_ms"]
    row["dynamic_vs_static"] = row["dynamic_pallas_ms"] / row["static_pallas_ms"]
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
    hdr = f"{'m':>5} {'n':>5} {'b':>4} {'d':>6} | {'dense':>7} {'static':>7} {'dyn':>7} {'dyn xla':>8} | "
    print(hdr + f"{'dyn/static':>10} {'dyn/dense':>9} {'max err':>8}")
    for r in rows:
        err = max(r[k] for k in r if k.endswith("_err"))
        print(
            f"{r['m']:>5} {r['n']:>5} {r['b']:>4} {'1/' + str(round(1 / r['density'])):>6} | "
            f"{r['dense_ms']:7.3f} {r['static_pallas_ms']:7.3f} {r['dynamic_pallas_ms']:7.3f} "
            f"{r['dynamic_xla_ms']:8.3f} | {r['dynamic_vs_static']:10.2f} "
            f"{r['dynamic_pallas_vs_dense']:9.2f} {err:8.1e}"
        )


if __name__ == "__main__":
    main()
