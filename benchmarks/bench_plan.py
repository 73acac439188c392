"""Planner speed and the modelled IPU sweep.

1. Time ``bs.plan`` (cold: cache cleared) on an 8192 x 8192, b = 16, d = 1/16 pattern (16,384 blocks)
   for n = 4096, and on an 8192 x 8192, b = 1 pattern with 1,048,576 non-zeros for n = 1024.
   Target: under 1 s each on an idle CPU.
2. Print the modelled sparse and dense TFLOP/s and the predicted speedup over a sweep of block
   sizes and densities (m = k = 4096, n = 1024, FP16, Bow), the shape of PopSparse's Figure-style
   results.

    python benchmarks/bench_plan.py [--repeats 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time

import blocksparse as bs


def time_planning(repeats: int, block: int = 16, density: float = 1 / 16, n: int = 4096) -> dict:
    pattern = bs.BlockPattern.random(0, (8192, 8192), block, density)
    times = []
    for _ in range(repeats):
        bs.ipu.clear_cache()
        t0 = time.perf_counter()
        p = bs.plan(pattern, n)
        times.append(time.perf_counter() - t0)
    times.sort()
    return {
        "shape": [8192, 8192],
        "block": block,
        "nnz_blocks": pattern.nnz_blocks,
        "n": n,
        "median_s": times[len(times) // 2],
        "min_s": times[0],
        "plan": p.to_dict(),
    }


def sweep() -> list[dict]:
    rows = []
    for b in (1, 4, 8, 16):
        for inv_d in (4, 8, 16, 32, 64):
            p = bs.plan(bs.BlockPattern.random(0, (4096, 4096), b, 1 / inv_d), 1024)
            rows.append({"block": b, "density": f"1/{inv_d}", "sparse_tflops": p.tflops,
                         "dense_tflops": p.dense.tflops, "speedup": p.speedup})  # fmt: skip
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    timings = [time_planning(args.repeats), time_planning(args.repeats, 1, 1048576 / 8192**2, 1024)]
    for timing in timings:
        med, best = timing["median_s"] * 1e3, timing["min_s"] * 1e3
        print(
            f"plan 8192 x 8192, b={timing['block']} ({timing['nnz_blocks']} blocks), n={timing['n']}: "
            f"median {med:.0f} ms, min {best:.0f} ms over {args.repeats} cold runs"
        )
    timing = timings[0]
    rows = sweep()
    print(f"\n{'block':>5} {'density':>8} {'sparse TFLOP/s':>15} {'dense TFLOP/s':>14} {'speedup':>8}")
    for r in rows:
        print(f"{r['block']:>5} {r['density']:>8} {r['sparse_tflops']:>15.2f} {r['dense_tflops']:>14.2f} "
              f"{r['speedup']:>7.2f}x")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"planning": timing, "planning_b1": timings[1], "sweep": rows}, f, indent=2)


if __name__ == "__main__":
    main()
