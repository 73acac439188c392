"""GPU check of the grouped kernel (``TritonConfig(grouped=True)``): right against dense, and its time per variant.

For each pattern (``uniform`` random, ``power_law``, ``clustered``: block rows in clusters of ``128 / b`` that keep
the same uniformly random block columns, the rows shuffled, so a unit can share every slab once the plan finds its
cluster; for ``x @ W`` the same in block columns), block ``b`` and density ``1/d``: ``W`` is ``m x m`` (bf16,
seed 0), ``x`` is ``m x n`` (bf16). Each variant of the grouped kernel (``--variants``, named in :data:`VARIANTS`)
runs ``W @ x`` (``x @ W`` with ``--ops dds``, ``x`` then ``n x m``), checked against the float32 dense product
(:func:`blocksparse.bench.check_close`, bf16's tolerance) and confirmed to have run (its kernel, with its slabs per
step ``_s<k>``, in the jaxpr); then it is timed with ``dense`` (``jnp.dot`` on ``W.to_dense()``) and ``default``
(``implementation=None``), each the median over trials of a jitted loop after warm-up runs
(:meth:`blocksparse.bench.Timer.loop`). The default variants are ``k1`` (one slab per loop step, the form measured
first: ``benchmarks/results/grouped_gpu_check_h200.json``) and ``kdef`` (the default slabs per step, ``64 //
b``: 4 at b = 16, 2 at 32), so one run compares them; ``tn64`` / ``tn256`` (the dense operand's tile) and ``w4`` /
``w8`` (warps) and ``packed`` / ``packed_k1`` / ``packed_tn256`` (``W`` read from its packed copy, made by one XLA
gather inside the timed call: ``grouped_packed=True``) are optional. A row records per variant
``grouped_<name>_loop_ms``, ``_vs_default`` (> 1: faster than ``implementation=None``), ``_kernel``,
``_slabs_per_step`` and ``_loop_steps`` (loop steps per column tile, the masked tails included), the fastest
variant, and the plan the kernel ran (unit size, method, modelled bytes and fill,
:mod:`blocksparse.ops.matmul.grouped`). A variant that fails records why (``grouped_<name>_failed``) and the
others still run. Needs a GPU.

Usage (on the GPU machine)::

    python3 benchmarks/grouped_gpu_check.py --ops dsd dds --json $OUT/grouped_gpu_check_slabs.json
    python3 benchmarks/grouped_gpu_check.py --variants k1 kdef k2 k4 tn64 tn256 w4 w8 --json $OUT/v.json
"""

from __future__ import annotations

import argparse
import re
import sys

PATTERNS = ("uniform", "power_law", "clustered")
DEFAULT_PATTERNS = ("uniform", "power_law")  # --patterns clustered adds the third

#: Named variants of the grouped kernel: the ``TritonConfig`` fields each sets besides ``grouped=True``.
VARIANTS = {
    "k1": dict(grouped_slabs=1),  # one slab per loop step: one K = b dot per step (measured first)
    "kdef": {},  # the default slabs per step: 64 // b (4 at b = 16, 2 at 32)
    "k2": dict(grouped_slabs=2),
    "k4": dict(grouped_slabs=4),
    "k8": dict(grouped_slabs=8),
    "tn64": dict(tn=64, tb=64),  # the dense operand's tile (tn for W @ x, tb for x @ W), default slabs
    "tn256": dict(tn=256, tb=256),
    "w4": dict(num_warps=4),  # Triton warps per program, default slabs
    "w8": dict(num_warps=8),
    "packed": dict(grouped_packed=True),  # W from its packed copy (one contiguous tile a step), default slabs
    "packed_k1": dict(grouped_packed=True, grouped_slabs=1),
    "packed_tn256": dict(grouped_packed=True, tn=256, tb=256),
}
DEFAULT_VARIANTS = ("k1", "kdef")


def _operands(kind: str, op: str, m: int, n: int, b: int, d: int):
    import jax
    import jax.numpy as jnp

    import blocksparse as bs

    if kind == "clustered":
        p = bs.BlockPattern.clustered(0, (m, m), (b, b), 1.0 / d, axis=1 if op == "dds" else 0)
    else:
        make = bs.BlockPattern.random if kind == "uniform" else bs.BlockPattern.power_law
        p = make(0, (m, m), (b, b), 1.0 / d)
    W = bs.BlockSparseMatrix(p, jax.random.normal(jax.random.key(0), (p.nnz_blocks, b, b), jnp.bfloat16))
    x = jax.random.normal(jax.random.key(1), (m, n) if op == "dsd" else (n, m), jnp.bfloat16)
    return W, x


def _cell(kind: str, op: str, m: int, n: int, b: int, d: int, variants, timer) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

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
    plan = grouped_kernel.plan(op, W.pattern, n, TritonConfig(grouped=True), jnp.bfloat16)
    row = dict(pattern=kind, op=op, m=m, n=n, b=b, d=d, nnz_blocks=W.nnz_blocks, group=plan.group, method=plan.method,
               modelled_bytes=plan.reduction, modelled_slabs=plan.x_reduction, fill=plan.fill,
               slabs=plan.slabs, variants=list(variants))  # fmt: skip
    try:
        row.update(measure(timer, dense, w, x, want=want, dtype=jnp.bfloat16, prefix="dense_"))
        row.update(measure(timer, product(), W, x, want=want, dtype=jnp.bfloat16, prefix="default_"))
    except CellFailed as e:
        row["failed"] = str(e)
        return row
    for name in variants:
        cfg = TritonConfig(grouped=True, **VARIANTS[name])
        fn = product(cfg)
        ran = re.findall(r"bs_\w+_grouped_\w+", str(jax.make_jaxpr(fn)(W, x)))
        key = f"grouped_{name}_"
        vplan = grouped_kernel.plan(op, W.pattern, n, cfg, jnp.bfloat16)  # its tile may differ from the default's
        k = grouped_kernel.slabs_per_step(op, W.pattern.block_size, cfg)
        row[key + "kernel"] = ran[0] if ran else None
        row[key + "slabs_per_step"] = k
        row[key + "loop_steps"] = int(np.sum(-(-vplan.unit_slabs // k)))  # per column tile, the masked tails included
        try:
            if not ran:
                raise CellFailed(f"expected the grouped kernel to run for variant {name!r} (plan group {vplan.group}); "
                                 "it did not")  # fmt: skip
            row.update(measure(timer, fn, W, x, want=want, dtype=jnp.bfloat16, prefix=key))
        except CellFailed as e:
            row[key + "failed"] = str(e)
            continue
        row[key + "vs_default"] = row["default_loop_ms"] / row[key + "loop_ms"]  # > 1: the grouped kernel faster
        row[key + "vs_dense"] = row["dense_loop_ms"] / row[key + "loop_ms"]
    timed = [v for v in variants if f"grouped_{v}_loop_ms" in row]
    if timed:
        row["fastest_variant"] = min(timed, key=lambda v: row[f"grouped_{v}_loop_ms"])
    return row


def _failed(row: dict) -> bool:
    return any(k == "failed" or k.endswith("_failed") for k in row)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--m", type=int, default=8192, help="W is m x m")
    ap.add_argument("--n", type=int, default=4096, help="x is m x n (dsd) or n x m (dds)")
    ap.add_argument("--blocks", type=int, nargs="+", default=[16, 32])
    ap.add_argument("--densities", type=int, nargs="+", default=[4, 16], help="d: density 1/d")
    ap.add_argument("--patterns", nargs="+", default=list(DEFAULT_PATTERNS), choices=PATTERNS)
    ap.add_argument("--ops", nargs="+", default=["dsd"], choices=["dsd", "dds"], help="dsd: W @ x, dds: x @ W")
    ap.add_argument("--variants", nargs="+", default=list(DEFAULT_VARIANTS), choices=list(VARIANTS),
                    help="grouped-kernel variants to time (TritonConfig fields: "
                         + "; ".join(f"{k}: {v or 'defaults'}" for k, v in VARIANTS.items()) + ")")  # fmt: skip
    ap.add_argument("--iters", type=int, default=20, help="calls per timed loop")
    ap.add_argument("--trials", type=int, default=5, help="timed loops (the median is reported)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed runs after compiling")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    variants = list(dict.fromkeys(args.variants))

    import jax

    from blocksparse import hardware
    from blocksparse.bench import Timer, write_json

    if not hardware.current().is_gpu:
        print(f"needs a GPU (default device: {hardware.current().platform})", file=sys.stderr)
        return 2
    timer = Timer(iters=args.iters, trials=args.trials, warmup=args.warmup)
    rows = []
    head = f"{'op':<4}{'pattern':<10}{'b':>3}{'d':>4}{'g':>3} {'method':<11}{'dense ms':>10}{'default ms':>11}"
    print(head + "".join(f"{v + ' ms':>12}{'vs dflt':>8}" for v in variants))
    for op in args.ops:
        for kind in args.patterns:
            for b in args.blocks:
                for d in args.densities:
                    r = _cell(kind, op, args.m, args.n, b, d, variants, timer)
                    rows.append(r)
                    lead = f"{op:<4}{kind:<10}{b:>3}{d:>4}{r['group']:>3} {r['method']:<11}"
                    if "failed" in r:
                        print(f"{lead}FAILED: {r['failed']}")
                    else:
                        line = f"{lead}{r['dense_loop_ms']:>10.3f}{r['default_loop_ms']:>11.3f}"
                        for v in variants:
                            if f"grouped_{v}_failed" in r:
                                line += f"{'FAILED':>12}{'':>8}"
                            else:
                                line += f"{r[f'grouped_{v}_loop_ms']:>12.3f}{r[f'grouped_{v}_vs_default']:>7.2f}x"
                        print(line)
                        for v in variants:
                            if f"grouped_{v}_failed" in r:
                                print(f"    {v}: FAILED: {r[f'grouped_{v}_failed']}")
                    if args.json:  # after every row: a run cut short keeps what it measured
                        dev = jax.devices()[0]
                        doc = {"device": getattr(dev, "device_kind", str(dev)), "jax": jax.__version__,
                               "timer": repr(timer), "variants": {v: VARIANTS[v] for v in variants},
                               "rows": rows}  # fmt: skip
                        write_json(args.json, doc)
    return 1 if any(_failed(r) for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
