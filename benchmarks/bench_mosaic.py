"""The Mosaic GPU (Hopper: TMA + wgmma) ``dsd`` kernel against the Triton Pallas kernel and dense ``jnp.dot``.

For each cell (``W`` of ``m x m`` with ``b x b`` blocks at density ``1/d``, ``x`` of ``m x n``,
bf16 or fp16, float32 accumulation) one random pattern is timed in one process:

- ``dense``: ``jnp.dot`` of the dense ``W`` (cuBLAS through XLA);
- ``triton``: ``bs.matmul(W, x, implementation="pallas")`` (the Pallas Triton kernel);
- ``mosaic``: ``blocksparse.ops.matmul.pallas_mosaic.dsd`` (called directly: the backend is not
  registered in the dispatch yet).

Times are the median device time of :class:`blocksparse.bench.Timer` ``.loop`` (one jitted loop);
``*_tflops`` counts the useful flops ``2 nnz bh bw n``. Both kernels are checked against the
dense product (relative Frobenius error); a kernel that fails to compile, run or check records
its error in the row and the run goes on.

Usage (the brief's grid, about a minute on an H200)::

    python3 benchmarks/bench_mosaic.py --json $OUT/mosaic.json
    python3 benchmarks/bench_mosaic.py --m 8192 --n 4096 --b 64 --d 16 --tn 128 --stages 2
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time

import jax
import jax.numpy as jnp

import blocksparse as bs
from blocksparse.bench import Timer, check_close
from blocksparse.ops.matmul import pallas_mosaic


def _kernels(W, cfg):
    dense = W.to_dense()
    return {
        "dense": (lambda a, x: jnp.dot(a, x, preferred_element_type=jnp.float32).astype(x.dtype), dense),
        "triton": (lambda W, x: bs.matmul(W, x, implementation="pallas"), W),
        "mosaic": (lambda W, x: pallas_mosaic.dsd(W.pattern, W.data, x, config=cfg), W),
    }


def bench_cell(m: int, n: int, b: int, d: int, dtype, timer: Timer, cfg) -> dict:
    W = bs.random(jax.random.key(0), (m, m), b, 1.0 / d, dtype)
    x = jax.random.normal(jax.random.key(1), (m, n), dtype)
    flops = 2.0 * W.nnz_blocks * b * b * n
    row = {"m": m, "n": n, "b": b, "density": 1.0 / d, "dtype": jnp.dtype(dtype).name, "nnz_blocks": W.nnz_blocks}
    if cfg is not None:
        row["config"] = {"tn": cfg.tn, "stages": cfg.stages, "max_len": cfg.max_len}
    p = pallas_mosaic.plan(W.pattern, n, jnp.dtype(dtype).itemsize, cfg)
    row.update(mosaic_tn=p.tn, mosaic_stages=p.stages, units=p.sched.num_units, partials=p.sched.num_partials)
    want = None
    for name, (fn, a) in _kernels(W, cfg).items():
        try:
            got = jax.jit(fn)(a, x)
            if name == "dense":
                want = got.astype(jnp.float32)
            else:
                row[f"{name}_err"] = check_close(got, want, dtype=dtype, what=name)
            ms = timer.loop(fn, a, x)
            row[f"{name}_ms"] = ms
            row[f"{name}_tflops"] = flops / (ms * 1e-3) / 1e12
        except Exception as e:  # CellFailed or a compile error: record it, the other kernels still run
            row[f"{name}_error"] = " ".join(f"{type(e).__name__}: {e}".split())[:500]
    for name in ("triton", "dense"):
        if "mosaic_ms" in row and f"{name}_ms" in row:
            row[f"speedup_vs_{name}"] = row[f"{name}_ms"] / row["mosaic_ms"]
    return row


def _table(rows) -> str:
    cols = [("m", "{}"), ("n", "{}"), ("b", "{}"), ("density", "{:.4g}"), ("dense_ms", "{:.3f}"),
            ("triton_ms", "{:.3f}"), ("mosaic_ms", "{:.3f}"), ("mosaic_tflops", "{:.0f}"),
            ("speedup_vs_triton", "{:.2f}"), ("speedup_vs_dense", "{:.2f}"), ("mosaic_tn", "{}"),
            ("mosaic_stages", "{}")]  # fmt: skip
    out = ["  ".join(f"{c:>17}" for c, _ in cols)]
    for r in rows:
        out.append("  ".join(f"{(f.format(r[c]) if c in r else '-'):>17}" for c, f in cols))
        for k, v in r.items():
            if k.endswith("_error"):
                out.append(f"    {k}: {v}")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--m", type=int, nargs="+", default=[8192], help="m = k")
    ap.add_argument("--n", type=int, nargs="+", default=[4096, 256])
    ap.add_argument("--b", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--d", type=int, nargs="+", default=[4, 16, 64], help="density = 1/d")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    ap.add_argument("--tn", type=int, default=None, help="force the Mosaic kernel's column tile")
    ap.add_argument("--stages", type=int, default=None, help="force the Mosaic kernel's pipeline depth")
    ap.add_argument("--max-len", type=int, default=None, help="force the schedule's cap on blocks per program")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)

    why = pallas_mosaic.hopper_problem()
    if why is not None:
        print(f"bench_mosaic: the Mosaic kernel needs a Hopper GPU: {why}", file=sys.stderr)
        return 2
    cfg = None
    if args.tn or args.stages or args.max_len:
        cfg = pallas_mosaic.MosaicConfig(tn=args.tn, stages=args.stages, max_len=args.max_len)
    dtype = jnp.dtype(args.dtype)
    timer = Timer(iters=args.iters, trials=args.trials)
    dev = jax.devices()[0]
    doc = {
        "benchmark": "bench_mosaic",
        "environment": {"jax": jax.__version__, "device": dev.device_kind, "python": platform.python_version()},
        "timer": repr(timer),
        "rows": [],
    }
    t0 = time.perf_counter()
    for m in args.m:
        for n in args.n:
            for b in args.b:
                for d in args.d:
                    row = bench_cell(m, n, b, d, dtype, timer, cfg)
                    doc["rows"].append(row)
                    print(json.dumps(row), flush=True)
    doc["seconds"] = time.perf_counter() - t0
    print(_table(doc["rows"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    failed = [r for r in doc["rows"] if any(k.endswith("_error") for k in r)]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
