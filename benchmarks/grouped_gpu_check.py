"""GPU check of the grouped kernel (``TritonConfig(grouped=True)``): right against dense, and its time.

For each pattern (``uniform`` random, ``power_law``), block ``b`` and density ``1/d``: ``W`` is ``m x m`` (bf16,
seed 0), ``x`` is ``m x n`` (bf16). The grouped kernel's ``W @ x`` (``x @ W`` with ``--ops dds``, ``x`` then
``n x m``) is checked against the float32 dense product (:func:`blocksparse.bench.check_close`, bf16's tolerance)
and confirmed to have run (its kernel in the jaxpr), then three variants are timed, each the median over trials of
a jitted loop after warm-up runs (:meth:`blocksparse.bench.Timer.loop`): ``dense`` (``jnp.dot`` on ``W.to_dense()``),
``default`` (``implementation=None``) and ``grouped``. Each row also records the plan the kernel ran (unit size,
method, modelled bytes and fill, :mod:`blocksparse.ops.matmul.grouped`). Needs a GPU; the defaults are the
measurement docs/kernels.md asks for (8192 x 8192 @ 4096, b = 16 and 32, d = 1/4 and 1/16).

Usage (on the GPU machine)::

    python3 benchmarks/grouped_gpu_check.py --json $OUT/grouped_gpu_check.json
    python3 benchmarks/grouped_gpu_check.py --ops dsd dds --json $OUT/grouped_gpu_check_both.json
"""

from __future__ import annotations

import argparse
import re
import sys

PATTERNS = ("uniform", "power_law")


def _operands(kind: str, op: str, m: int, n: int, b: int, d: int):
    import jax
    import jax.numpy as jnp

    import blocksparse as bs

    make = bs.BlockPattern.random if kind == "uniform" else bs.BlockPattern.power_law
    p = make(0, (m, m), (b, b), 1.0 / d)
    W = bs.BlockSparseMatrix(p, jax.random.normal(jax.random.key(0), (p.nnz_blocks, b, b), jnp.bfloat16))
    x = jax.random.normal(jax.random.key(1), (m, n) if op == "dsd" else (n, m), jnp.bfloat16)
    return W, x


def _cell(kind: str, op: str, m: int, n: int, b: int, d: int, timer) -> dict:
    import jax
    import jax.numpy as jnp

    import blocksparse as bs
    from blocksparse.bench import CellFailed, measure
    from blocksparse.ops.matmul.triton import TritonConfig, grouped_kernel

    W, x = _operands(kind, op, m, n, b, d)
    dsd = op == "dsd"

    def product(config=None):
        def fn(W, x):
            return bs.matmul(W, x, config=config) if dsd else bs.matmul(x, W, config=config)

        return fn

    def dense(w, x):
        return jnp.dot(w, x) if dsd else jnp.dot(x, w)

    w = W.to_dense()
    want = jax.jit(lambda w, x: jnp.dot(*((w, x) if dsd else (x, w)), precision="highest",
                                        preferred_element_type=jnp.float32))(w, x)  # fmt: skip
    grouped = product(TritonConfig(grouped=True))
    plan = grouped_kernel.plan(op, W.pattern, n, TritonConfig(grouped=True), jnp.bfloat16)
    row = dict(pattern=kind, op=op, m=m, n=n, b=b, d=d, nnz_blocks=W.nnz_blocks, group=plan.group, method=plan.method,
               modelled_bytes=plan.reduction, modelled_slabs=plan.x_reduction, fill=plan.fill)  # fmt: skip
    ran = re.findall(r"bs_\w+_grouped_\w+", str(jax.make_jaxpr(grouped)(W, x)))
    row["grouped_kernel"] = ran[0] if ran else None
    try:
        if not ran:
            raise CellFailed(f"expected the grouped kernel to run (plan group {plan.group}); it did not")
        row.update(measure(timer, dense, w, x, want=want, dtype=jnp.bfloat16, prefix="dense_"))
        row.update(measure(timer, product(), W, x, want=want, dtype=jnp.bfloat16, prefix="default_"))
        row.update(measure(timer, grouped, W, x, want=want, dtype=jnp.bfloat16, prefix="grouped_"))
    except CellFailed as e:
        row["failed"] = str(e)
        return row
    row["grouped_vs_default"] = row["default_loop_ms"] / row["grouped_loop_ms"]  # > 1: the grouped kernel faster
    row["grouped_vs_dense"] = row["dense_loop_ms"] / row["grouped_loop_ms"]
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--m", type=int, default=8192, help="W is m x m")
    ap.add_argument("--n", type=int, default=4096, help="x is m x n (dsd) or n x m (dds)")
    ap.add_argument("--blocks", type=int, nargs="+", default=[16, 32])
    ap.add_argument("--densities", type=int, nargs="+", default=[4, 16], help="d: density 1/d")
    ap.add_argument("--patterns", nargs="+", default=list(PATTERNS), choices=PATTERNS)
    ap.add_argument("--ops", nargs="+", default=["dsd"], choices=["dsd", "dds"], help="dsd: W @ x, dds: x @ W")
    ap.add_argument("--iters", type=int, default=20, help="calls per timed loop")
    ap.add_argument("--trials", type=int, default=5, help="timed loops (the median is reported)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed runs after compiling")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)

    import jax

    from blocksparse import hardware
    from blocksparse.bench import Timer, write_json

    if not hardware.current().is_gpu:
        print(f"needs a GPU (default device: {hardware.current().platform})", file=sys.stderr)
        return 2
    timer = Timer(iters=args.iters, trials=args.trials, warmup=args.warmup)
    rows = []
    head = f"{'op':<4}{'pattern':<10}{'b':>3}{'d':>4}{'g':>3} {'method':<11}{'dense ms':>10}{'default ms':>11}"
    print(head + f"{'grouped ms':>11}{'vs default':>11}{'rel err':>9}")
    for op in args.ops:
        for kind in args.patterns:
            for b in args.blocks:
                for d in args.densities:
                    r = _cell(kind, op, args.m, args.n, b, d, timer)
                    rows.append(r)
                    lead = f"{op:<4}{kind:<10}{b:>3}{d:>4}{r['group']:>3} {r['method']:<11}"
                    if "failed" in r:
                        print(f"{lead}FAILED: {r['failed']}")
                    else:
                        print(f"{lead}{r['dense_loop_ms']:>10.3f}{r['default_loop_ms']:>11.3f}"
                              f"{r['grouped_loop_ms']:>11.3f}{r['grouped_vs_default']:>10.2f}x"
                              f"{r['grouped_rel_err']:>9.1e}")  # fmt: skip
                    if args.json:  # after every row: a run cut short keeps what it measured
                        dev = jax.devices()[0]
                        doc = {"device": getattr(dev, "device_kind", str(dev)), "jax": jax.__version__,
                               "timer": repr(timer), "rows": rows}  # fmt: skip
                        write_json(args.json, doc)
    return 1 if any("failed" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
