"""The Mosaic GPU (Hopper: TMA + wgmma) ``dds`` kernel ``x @ W`` against the Triton kernel and dense ``jnp.dot``.

For each cell (``x`` of ``m x k``, ``W`` of ``k x n`` with ``b x b`` blocks at density ``1/d``,
bf16 or fp16, float32 accumulation) one random pattern is timed in one process:

- ``dense``: ``jnp.dot(x, W_dense)`` (cuBLAS through XLA);
- ``triton``: ``bs.matmul(x, W, implementation="pallas")`` (the Pallas Triton ``dds`` kernel);
- ``mosaic``: ``blocksparse.ops.matmul.mosaic.backend.dds`` with its default plan, then each forced
  variant of ``--tm`` x ``--stages`` x ``--grid-order`` (a ``blocksparse.ops.matmul.DdsConfig``), recorded
  under ``variants``; a variant the plan refuses (shared memory, registers) records the reason and is
  not a failure.

With ``--epilogue ACT`` every kernel runs with a bias along the output columns and the activation
``ACT`` (the sparse ones fused: ``bs.matmul(..., bias=, activation=)`` and ``dds(..., epi, bias)``;
dense: ``jnp.dot`` then the same epilogue in XLA).

Times: ``*_ms`` is the median device time of :meth:`blocksparse.bench.Timer.loop` (one jitted loop),
``*_calls_ms`` of :meth:`~blocksparse.bench.Timer.calls` (back-to-back jitted calls from Python,
dispatch included); ``*_tflops`` counts the useful flops ``2 m nnz b^2`` (dense: ``2 m k n``). Every
kernel is checked against the dense product (relative Frobenius error, ``*_err``); a kernel that
fails to compile, run or check records its error in the row and the run goes on (exit status 1).

Usage (the brief's grid: x 32768 x 384 @ W 384 x 1536 and 8192^3, b = 64, 128, d = 1/4, 1/8, 1/16)::

    python3 benchmarks/bench_mosaic_dds.py --json $OUT/mosaic_dds.json
    python3 benchmarks/bench_mosaic_dds.py --epilogue gelu --json $OUT/mosaic_dds_gelu.json
    python3 benchmarks/bench_mosaic_dds.py --shape 32768 384 1536 --tm 64 128 256 --stages 2 3 4 \\
        --json $OUT/mosaic_dds_tiles.json
    python3 benchmarks/bench_mosaic_dds.py --shape 8192 8192 8192 --grid-order units tiles \\
        --json $OUT/mosaic_dds_order.json

``--interpret`` runs every kernel in Pallas' interpreter (the CPU; tiny shapes only, to check the script).
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
from blocksparse import hardware
from blocksparse.bench import Timer, check_close, implementation
from blocksparse.ops.matmul import epilogue
from blocksparse.ops.matmul.mosaic import backend
from blocksparse.ops.matmul.mosaic import dds as pmd
from blocksparse.ops.matmul.mosaic import persistent as pp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_mosaic import add_row, finish, new_doc  # noqa: E402  (the same report and failure rule as for W @ x)

SHAPES = [(32768, 384, 1536), (8192, 8192, 8192)]  # (m, k, n): x (m, k) @ W (k, n)


def _kernels(W, bias, activation, cfg=None):
    """name -> (function of (x, operand), operand): dense, Triton and Mosaic."""
    fused = {} if bias is None else {"bias": bias, "activation": activation}
    epi = None if bias is None else epilogue.Epilogue(activation, True, 1)

    def dense_fn(x, w):
        y = jnp.dot(x, w, preferred_element_type=jnp.float32)
        return (y if bias is None else epilogue.apply(y, bias[None, :], activation)).astype(x.dtype)

    return {
        "dense": (dense_fn, W.to_dense()),
        "triton": (lambda x, W: bs.matmul(x, W, implementation="pallas", **fused), W),
        "mosaic": (lambda x, W: backend.dds(W.pattern, W.data, x, None, epi, bias, config=cfg), W),
    }


def _time(name, fn, x, a, want, dtype, timer, flops, out: dict):
    """Run, check and time one kernel into ``out`` (``{name}_ms``, ...); an exception is recorded.

    Returns the result (``None`` if the kernel failed)."""
    got = None
    try:
        with bs.dispatch_log() as log:
            got = jax.jit(fn)(x, a)
        if log:  # which backend bs.matmul ran (Triton, unless it refused)
            out[f"{name}_implementation"] = implementation(log)
        if want is not None:
            out[f"{name}_err"] = check_close(got, want, dtype=dtype, what=name)
        ms = timer.loop(fn, x, a)
        out[f"{name}_ms"] = ms
        out[f"{name}_tflops"] = flops / (ms * 1e-3) / 1e12
        out[f"{name}_calls_ms"] = timer.calls(fn, x, a)
    except Exception as e:  # CellFailed or a compile error: record it, the other kernels still run
        out[f"{name}_error"] = " ".join(f"{type(e).__name__}: {e}".split())[:500]
    return got


def bench_cell(m: int, k: int, n: int, b: int, d: int, dtype, timer: Timer, configs, activation=None) -> dict:
    W = bs.random(jax.random.key(0), (k, n), b, 1.0 / d, dtype)
    x = jax.random.normal(jax.random.key(1), (m, k), dtype)
    bias = None if activation is None else jax.random.normal(jax.random.key(2), (n,), jnp.float32)
    flops = 2.0 * m * W.nnz_blocks * b * b
    row = {"m": m, "k": k, "n": n, "b": b, "density": 1.0 / d, "dtype": jnp.dtype(dtype).name}
    row.update(nnz_blocks=W.nnz_blocks, epilogue=activation)
    p = backend.dds_plan(W.pattern, m, jnp.dtype(dtype).itemsize)
    row.update(mosaic_tm=p.tm, mosaic_stages=p.stages, units=p.sched.num_units, partials=p.sched.num_partials)
    want = None
    for name, (fn, a) in _kernels(W, bias, activation).items():
        got = _time(name, fn, x, a, want, dtype, timer, 2.0 * m * k * n if name == "dense" else flops, row)
        if name == "dense" and got is not None:
            want = got.astype(jnp.float32)
    for name in ("triton", "dense"):
        if "mosaic_ms" in row and f"{name}_ms" in row:
            row[f"speedup_vs_{name}"] = row[f"{name}_ms"] / row["mosaic_ms"]
    row["variants"] = []
    for cfg in configs:
        v = {"tm": cfg.tm, "stages": cfg.stages, "max_len": cfg.max_len, "grid_order": cfg.grid_order,
             "persistent": cfg.persistent, "reduce": cfg.reduce}  # fmt: skip
        try:
            pv = backend.dds_plan(W.pattern, m, jnp.dtype(dtype).itemsize, cfg)
            v.update(tm=pv.tm, stages=pv.stages, partials=pv.sched.num_partials)
            if pv.persistent is not None:
                v.update(programs=pv.persistent.programs, max_steps=pv.persistent.max_steps_per_program(),
                         reduce="kernel" if pv.persistent.reduce else "xla")
        except NotImplementedError as e:  # this variant cannot take the cell (shared memory, registers)
            v["mosaic_error"] = f"NotImplementedError: {e}"
            row["variants"].append(v)
            continue
        fn, a = _kernels(W, bias, activation, cfg)["mosaic"]
        _time("mosaic", fn, x, a, want, dtype, timer, flops, v)
        if "mosaic_ms" in v and "triton_ms" in row:
            v["speedup_vs_triton"] = row["triton_ms"] / v["mosaic_ms"]
        row["variants"].append(v)
    return row


COLUMNS = [("m", "{}"), ("k", "{}"), ("n", "{}"), ("b", "{}"), ("density", "{:.4g}"), ("dense_ms", "{:.3f}"),
           ("triton_ms", "{:.3f}"), ("mosaic_ms", "{:.3f}"), ("mosaic_calls_ms", "{:.3f}"),
           ("mosaic_tflops", "{:.0f}"), ("speedup_vs_triton", "{:.2f}"), ("speedup_vs_dense", "{:.2f}"),
           ("mosaic_err", "{:.2e}"), ("mosaic_tm", "{}"), ("mosaic_stages", "{}")]  # fmt: skip


def _variant_label(v) -> str:
    persistent = f" persistent programs={v.get('programs')} reduce={v.get('reduce')}" if v.get("persistent") else ""
    return f"tm={v['tm']} stages={v['stages']} max_len={v['max_len']} {v['grid_order']} first{persistent}:"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", type=int, nargs=3, action="append", metavar=("M", "K", "N"), default=None,
                    help="x (M, K) @ W (K, N); repeatable (default: 32768 384 1536 and 8192 8192 8192)")  # fmt: skip
    ap.add_argument("--b", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--d", type=int, nargs="+", default=[4, 8, 16], help="density = 1/d")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    ap.add_argument("--tm", type=int, nargs="+", default=None, help="Mosaic variants: force these row tiles")
    ap.add_argument("--stages", type=int, nargs="+", default=None, help="Mosaic variants: force these depths")
    ap.add_argument("--max-len", type=int, default=None, help="Mosaic variants: force the cap on blocks per program")
    ap.add_argument("--grid-order", nargs="+", default=None, choices=["units", "tiles"],
                    help="Mosaic variants: launch W's block columns (units) or x's row tiles fastest")  # fmt: skip
    ap.add_argument("--persistent", action="store_true",
                    help="Mosaic variants: each variant also as the persistent kernel (one pipeline across items)")
    ap.add_argument("--reduce", nargs="+", default=None, choices=pp.REDUCTIONS,
                    help="Mosaic variants: the persistent kernel's sums of split columns (in the kernel, by XLA)")
    ap.add_argument("--epilogue", default=None, choices=sorted(epilogue.ACTIVATIONS),
                    help="a bias along the output columns and this activation, fused in the kernels")  # fmt: skip
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--interpret", action="store_true", help="Pallas' interpreter on the CPU (tiny shapes only)")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)

    why = hardware.hopper_problem()
    if why is not None and not args.interpret:
        print(f"bench_mosaic_dds: the Mosaic kernel needs a Hopper GPU: {why}", file=sys.stderr)
        return 2
    configs = []
    if args.tm or args.stages or args.max_len or args.grid_order or args.persistent:
        orders = args.grid_order or ["units"]
        for tm, stages, order in itertools.product(args.tm or [None], args.stages or [None], orders):
            configs.append(pmd.DdsConfig(tm=tm, stages=stages, max_len=args.max_len, grid_order=order,
                                         persistent=False if args.persistent else None))  # fmt: skip
            if args.persistent and args.epilogue is None:  # the persistent kernel has no fused epilogue
                for reduce in args.reduce or [None]:
                    configs.append(pmd.DdsConfig(tm=tm, stages=stages, max_len=args.max_len, grid_order=order,
                                                 persistent=True, reduce=reduce))  # fmt: skip
    dtype = jnp.dtype(args.dtype)
    timer = Timer(iters=args.iters, trials=args.trials)
    doc = new_doc("bench_mosaic_dds", timer, interpret=args.interpret)
    with bs.interpret() if args.interpret else contextlib.nullcontext():
        for (m, k, n), b, d in itertools.product(args.shape or SHAPES, args.b, args.d):
            add_row(doc, bench_cell(m, k, n, b, d, dtype, timer, configs, args.epilogue), args.json)
    return finish(doc, args.json, COLUMNS, _variant_label)


if __name__ == "__main__":
    sys.exit(main())
