"""Small blocks (16, 32) on Mosaic GPU: the banded kernel against the Triton kernel and dense ``jnp.dot``.

For each cell one random pattern (uniform ``b x b`` blocks at density ``1/d``, or ``--pattern powerlaw``)
is timed in one process, bf16 or fp16, float32 accumulation:

- ``dense``: ``jnp.dot`` of the dense matrix (cuBLAS through XLA);
- ``triton``: ``bs.matmul(..., implementation="pallas")`` (the Pallas Triton kernel);
- ``bands``: :func:`blocksparse.ops.matmul.mosaic.bands.dsd` / ``dds`` with the default plan, then each
  forced variant of ``--tm`` x ``--width`` x ``--stages`` (a ``BandConfig``) under ``variants``;
- ``bands_kernel`` (``W @ x`` only): the kernel alone on ``x^T``, without XLA's transposes of ``x`` and ``y``.

``--op dsd``: ``W (m x k) @ x (k x n)`` (the shapes of the matmul benchmarks: W 8192 x 8192, n = 4096 and 256);
``--op dds``: ``x (m x k) @ W (k x n)`` (the inference layer 32768 x 384 @ 384 x 1536). Times: ``*_ms`` the median
of :meth:`blocksparse.bench.Timer.loop` (one jitted loop), ``*_calls_ms`` of back-to-back jitted calls;
``share`` = density x dense time / time (the non-zero throughput as a share of the dense rate). Every kernel is
checked against the dense product (``*_err``); a failure is recorded in the row (exit status 1).

Usage::

    python3 benchmarks/bench_mosaic_bands.py --json $OUT/bands.json
    python3 benchmarks/bench_mosaic_bands.py --op dds --shape 32768 384 1536 --json $OUT/bands_dds.json
    python3 benchmarks/bench_mosaic_bands.py --tm 64 128 --width 128 256 --stages 3 4 --json $OUT/bands_tiles.json
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import sys

import jax
import jax.numpy as jnp

import blocksparse as bs
from blocksparse.bench import Timer
from blocksparse.hardware import hopper_problem
from blocksparse.ops.matmul.mosaic import bands as pb

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_mosaic import _matrix, add_row, finish, new_doc  # noqa: E402
from bench_mosaic_dds import _time  # noqa: E402  (run, check and time one kernel into a row)

SHAPES = {"dsd": [(8192, 8192, 4096), (8192, 8192, 256)], "dds": [(32768, 384, 1536)]}


def bench_cell(op, m, k, n, b, d, dtype, timer, configs, pattern="uniform") -> dict:
    W = _matrix(pattern, (m, k) if op == "dsd" else (k, n), b, d, dtype)
    x = jax.random.normal(jax.random.key(1), (k, n) if op == "dsd" else (m, k), dtype)
    tokens = n if op == "dsd" else m
    flops = 2.0 * tokens * W.nnz_blocks * b * b
    row = {"op": op, "m": m, "k": k, "n": n, "b": b, "density": W.pattern.density, "pattern": pattern,
           "dtype": jnp.dtype(dtype).name, "nnz_blocks": W.nnz_blocks}  # fmt: skip
    p = pb.plan(W.pattern, tokens, jnp.dtype(dtype).itemsize, transposed=op == "dsd")
    row.update(bands_tm=p.tm, bands_width=p.width, bands_stages=p.stages, steps=p.sched.num_steps)
    kernel = pb.dsd if op == "dsd" else pb.dds
    order = (lambda x, w: (w, x)) if op == "dsd" else (lambda x, w: (x, w))  # noqa: E731  (the product's operands)
    kernels = {
        "dense": (lambda x, w: jnp.dot(*order(x, w), preferred_element_type=jnp.float32).astype(x.dtype), W.to_dense()),
        "triton": (lambda x, W: bs.matmul(*order(x, W), implementation="pallas"), W),
        "bands": (lambda x, W: kernel(W.pattern, W.data, x), W),
    }
    want = None
    for name, (fn, a) in kernels.items():
        got = _time(name, fn, x, a, want, dtype, timer, 2.0 * m * k * n if name == "dense" else flops, row)
        if name == "dense" and got is not None:
            want = got.astype(jnp.float32)
    if op == "dsd":  # the kernel alone: x^T in, y^T out (XLA's two transposes left out)
        kt = lambda xt, W: pb._run(W.pattern, W.data, xt, None, None, None, None, None, True)  # noqa: E731
        _time("bands_kernel", kt, x.T, W, None if want is None else want.T, dtype, timer, flops, row)
    for name in ("triton", "bands", "bands_kernel"):
        if f"{name}_ms" in row and "dense_ms" in row:
            row[f"{name}_share"] = row["density"] * row["dense_ms"] / row[f"{name}_ms"]
    if "bands_ms" in row and "triton_ms" in row:
        row["speedup_vs_triton"] = row["triton_ms"] / row["bands_ms"]
    row["variants"] = []
    for cfg in configs:
        v = {"tm": cfg.tm, "width": cfg.width, "stages": cfg.stages}
        try:
            pv = pb.plan(W.pattern, tokens, jnp.dtype(dtype).itemsize, cfg, transposed=op == "dsd")
            v.update(tm=pv.tm, width=pv.width, stages=pv.stages)
        except NotImplementedError as e:
            v["bands_error"] = f"NotImplementedError: {e}"
            row["variants"].append(v)
            continue
        _time("bands", lambda x, W, cfg=cfg: kernel(W.pattern, W.data, x, config=cfg), x, W, want, dtype, timer,
              flops, v)  # fmt: skip
        if "bands_ms" in v and "dense_ms" in row:
            v["bands_share"] = row["density"] * row["dense_ms"] / v["bands_ms"]
        row["variants"].append(v)
    return row


COLUMNS = [("op", "{}"), ("n", "{}"), ("b", "{}"), ("density", "{:.4g}"), ("pattern", "{}"), ("dense_ms", "{:.3f}"),
           ("triton_ms", "{:.3f}"), ("bands_ms", "{:.3f}"), ("bands_kernel_ms", "{:.3f}"), ("bands_calls_ms", "{:.3f}"),
           ("triton_share", "{:.2f}"), ("bands_share", "{:.2f}"), ("speedup_vs_triton", "{:.2f}"),
           ("bands_err", "{:.2e}"), ("bands_tm", "{}"), ("bands_width", "{}"), ("bands_stages", "{}")]  # fmt: skip


def _variant_label(v) -> str:
    return f"tm={v['tm']} width={v['width']} stages={v['stages']}:"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--op", default="dsd", choices=["dsd", "dds"])
    ap.add_argument(
        "--shape",
        type=int,
        nargs=3,
        action="append",
        metavar=("M", "K", "N"),
        default=None,
        help="dsd: W (M, K) @ x (K, N); dds: x (M, K) @ W (K, N); repeatable",
    )
    ap.add_argument("--b", type=int, nargs="+", default=[16, 32])
    ap.add_argument("--d", type=int, nargs="+", default=[4, 16, 64], help="density = 1/d")
    ap.add_argument("--pattern", nargs="+", default=["uniform"], choices=["uniform", "powerlaw"])
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    ap.add_argument("--tm", type=int, nargs="+", default=None, help="variants: force these row tiles")
    ap.add_argument("--width", type=int, nargs="+", default=None, help="variants: force these band widths")
    ap.add_argument("--stages", type=int, nargs="+", default=None, help="variants: force these depths")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--interpret", action="store_true", help="Pallas' interpreter on the CPU (tiny shapes only)")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)
    why = hopper_problem()
    if why is not None and not args.interpret:
        print(f"bench_mosaic_bands: the kernel needs a Hopper GPU: {why}", file=sys.stderr)
        return 2
    configs = []
    if args.tm or args.width or args.stages:
        for tm, width, stages in itertools.product(args.tm or [None], args.width or [None], args.stages or [None]):
            try:
                configs.append(pb.BandConfig(tm=tm, width=width, stages=stages))
            except ValueError as e:
                print(f"skipped variant: {e}", file=sys.stderr)
    dtype = jnp.dtype(args.dtype)
    timer = Timer(iters=args.iters, trials=args.trials)
    doc = new_doc("bench_mosaic_bands", timer, interpret=args.interpret)
    with bs.interpret() if args.interpret else contextlib.nullcontext():
        for (m, k, n), b, d, pat in itertools.product(args.shape or SHAPES[args.op], args.b, args.d, args.pattern):
            add_row(doc, bench_cell(args.op, m, k, n, b, d, dtype, timer, configs, pat), args.json)
    return finish(doc, args.json, COLUMNS, _variant_label)


if __name__ == "__main__":
    sys.exit(main())
