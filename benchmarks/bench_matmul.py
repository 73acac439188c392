"""PopSparse-style block-sparse matmul sweep on the GPU (a script, not a timed test).

``W (m x k, block b, density d) @ X (k x n)`` in bf16 through ``bs.matmul`` (the Pallas ``dsd``
kernel), against dense ``jnp.dot``, torch's dense matmul (cuBLAS) and torch's BSR Triton kernel
(``torch.sparse._triton_ops.bsr_dense_mm``), all measured in the same process. Also a skewed
(power-law rows) pattern against a uniform one with the same number of blocks.

Timing is the library's one helper, ``blocksparse.bench.Timer`` (``blocksparse bench`` uses it too):
``time_ms`` is ``Timer.loop``, ``--reps`` calls inside one jitted ``fori_loop`` (an optimization
barrier keeps the call in the loop), after a warm-up; the median of ``--trials`` such loops, divided
by ``--reps``: device time without Python dispatch. Operands are the same buffers every iteration,
so operands smaller than the 50 MB L2 may stay cached (as in a loop over one layer). ``wall_ms``
is ``Timer.calls``, the per-call wall time of back-to-back calls from Python, dispatch included.
torch is timed with CUDA events around ``--reps`` calls. TFLOP/s counts the non-zeros only:
``2 * nnz_blocks * b * b * n``. ``err`` is the relative Frobenius error against the dense product
of the same values (float32, highest precision); a cell whose error exceeds the dtype's tolerance
(``blocksparse.bench.tolerance``), or that raises, is recorded with an ``error`` and the script
exits with status 1. ``implementation`` says which backend ran (Pallas on a GPU, else XLA).

The library's own sweep is ``blocksparse bench --suite matmul --full``; this script adds the torch
peers (cuBLAS, torch's BSR Triton kernel, imported only when torch with CUDA is there), skewed
patterns and kernel-configuration variants.

Usage::

    python3 benchmarks/bench_matmul.py --m 8192 --n 256 4096 --d 4 16 64 --b 16 32 64 128 \
        --skew --json $OUT/bench.json
    python3 benchmarks/bench_matmul.py --variants   # compare kernel configurations on a few cells
    python3 benchmarks/bench_matmul.py --small      # CPU-sized smoke run (the XLA path)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import blocksparse as bs
from blocksparse.bench import CellFailed, Timer, check_close, implementation
from blocksparse.ops.matmul import triton as pt


def _time_torch(fn, reps: int, trials: int) -> float:
    import torch

    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(trials):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(reps):
            fn()
        e.record()
        torch.cuda.synchronize()
        out.append(s.elapsed_time(e) / 1e3 / reps)
    return statistics.median(out)


def _torch():
    try:
        import torch

        if torch.cuda.is_available():
            return torch
    except Exception:  # noqa: BLE001 - torch is optional
        pass
    return None


class Dense:
    """Dense baselines per (m, k, n), cached."""

    def __init__(self, reps, trials, dtype=jnp.bfloat16):
        self.reps, self.trials, self.cache, self.dtype = reps, trials, {}, dtype

    def get(self, m, k, n):
        if (m, k, n) in self.cache:
            return self.cache[(m, k, n)]
        key = jax.random.key(1)
        a = jax.random.normal(key, (m, k), self.dtype)
        x = jax.random.normal(jax.random.key(2), (k, n), self.dtype)
        t_jax = Timer(iters=self.reps, trials=self.trials).loop(jnp.dot, a, x) / 1e3
        t_torch = None
        torch = _torch()
        if torch is not None:
            ta = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            tx = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
            t_torch = _time_torch(lambda: ta @ tx, self.reps, self.trials)
            del ta, tx
        del a, x
        self.cache[(m, k, n)] = (t_jax, t_torch)
        return t_jax, t_torch


def _torch_bsr(pattern, data_np, n, reps, trials):
    torch = _torch()
    if torch is None:
        return None, "torch not importable"
    try:
        from torch.sparse._triton_ops import bsr_dense_mm

        m, k = pattern.shape
        crow = torch.tensor(np.asarray(pattern.indptr, np.int64), device="cuda")
        col = torch.tensor(np.asarray(pattern.cols, np.int64), device="cuda")
        vals = torch.tensor(data_np, device="cuda").to(torch.bfloat16)
        w = torch.sparse_bsr_tensor(crow, col, vals, size=(m, k))
        x = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        return _time_torch(lambda: bsr_dense_mm(w, x), reps, trials), None
    except Exception as e:  # noqa: BLE001 - report and go on
        return None, f"{type(e).__name__}: {str(e)[:120]}"


def _sparse_fn(impl, op="dsd", config=None):
    kw = dict(implementation=impl, config=config)
    if op == "dds":  # x (n, m) @ W (m, k): the linear-layer form, n = batch
        return jax.jit(lambda data, x, p: bs.matmul(x, bs.BlockSparseMatrix(p, data), **kw), static_argnums=2)
    return jax.jit(lambda data, x, p: bs.matmul(bs.BlockSparseMatrix(p, data), x, **kw), static_argnums=2)


def _check(f, pattern, data, x, op) -> tuple[float, str]:
    """Relative error against the dense product (raises CellFailed above the dtype's tolerance); the backend."""
    w = bs.BlockSparseMatrix(pattern, data).to_dense().astype(jnp.float32)
    with bs.dispatch_log() as log:
        y = f(data, x, pattern)
    x32 = x.astype(jnp.float32)
    with jax.default_matmul_precision("highest"):
        want = w @ x32 if op == "dsd" else x32 @ w
    return check_close(y, want, dtype=data.dtype, what=f"{op} product"), implementation(log)


def bench_cell(
    pattern, n, reps, trials, dense, torch_bsr=True, impl=None, label="uniform", op="dsd", dtype=jnp.bfloat16,
    config=None,
):
    m, k = pattern.shape
    b = pattern.block_size[0]
    d = jax.random.normal(jax.random.key(10), (pattern.nnz_blocks, *pattern.block_size), dtype)
    x = jax.random.normal(jax.random.key(20), (k, n) if op == "dsd" else (n, m), dtype)
    f = _sparse_fn(impl, op, config)
    err, ran = _check(f, pattern, d, x, op)  # first: the dispatch log is filled while tracing
    timer = Timer(iters=reps, trials=trials)
    t = timer.loop(lambda d, x: f(d, x, pattern), d, x) / 1e3
    t_wall = timer.calls(lambda d, x: f(d, x, pattern), d, x) / 1e3
    flops = 2.0 * pattern.nnz_blocks * b * b * n
    t_jax, t_torch = dense.get(m, k, n)
    row = dict(
        m=m, k=k, n=n, b=b, d=pattern.density, pattern=label, impl=impl or "default", implementation=ran, op=op,
        dtype=jnp.dtype(dtype).name, nnz_blocks=pattern.nnz_blocks,
        time_ms=t * 1e3, tflops=flops / t / 1e12, wall_ms=t_wall * 1e3, err=err,
        dense_jnp_ms=t_jax * 1e3, dense_torch_ms=None if t_torch is None else t_torch * 1e3,
        vs_jnp=t / t_jax, vs_torch=None if t_torch is None else t / t_torch,
        dense_torch_tflops=None if t_torch is None else 2.0 * m * k * n / t_torch / 1e12,
    )  # fmt: skip
    row["frac_of_dense_torch_rate"] = None if t_torch is None else row["tflops"] / row["dense_torch_tflops"]
    if torch_bsr:
        tb, err = _torch_bsr(pattern, np.asarray(d.astype(jnp.float32)), n, reps, trials)
        row["torch_bsr_ms"] = None if tb is None else tb * 1e3
        row["vs_torch_bsr"] = None if tb is None else t / tb
        if err:
            row["torch_bsr_error"] = err
    return row


def _fmt(v, spec):
    return "-" if v is None else format(v, spec)


def _dstr(d: float) -> str:
    return f"1/{round(1 / d)}" if d else "0"


def _cell(r) -> str:
    return f"m={r['m']} n={r['n']} b={r['b']} d={_dstr(r['d'])}"


def print_table(rows, file=sys.stdout):
    cols = ("m", "n", "b", "d", "pattern", "ms", "wall", "TF/s", "xJnp", "xTorch", "%rate", "bsr ms", "xBSR")
    widths = (5, 5, 4, 7, 8, 8, 6, 6, 5, 6, 5, 7, 5)
    print(" ".join(f"{c:>{w}}" for c, w in zip(cols, widths, strict=True)), file=file)
    for r in rows:
        rate = r.get("frac_of_dense_torch_rate")
        label = r["pattern"] if r["impl"] == "default" else r["impl"]
        vals = (
            f"{r['m']:>5}", f"{r['n']:>5}", f"{r['b']:>4}", f"{_dstr(r['d']):>7}", f"{label[:8]:>8}",
            f"{r['time_ms']:8.4f}", f"{r['wall_ms']:6.3f}", f"{r['tflops']:6.1f}", f"{r['vs_jnp']:5.2f}",
            _fmt(r["vs_torch"], "6.2f"), _fmt(None if rate is None else 100 * rate, "5.0f"),
            _fmt(r.get("torch_bsr_ms"), "7.3f"), _fmt(r.get("vs_torch_bsr"), "5.2f"),
        )  # fmt: skip
        print(" ".join(vals), file=file)


VARIANTS = {
    "default": pt.TritonConfig(),
    "accT": pt.TritonConfig(transpose_acc=True),
    "accN": pt.TritonConfig(transpose_acc=False),
    "tn64": pt.TritonConfig(tn=64),
    "tn128": pt.TritonConfig(tn=128),
    "tn256": pt.TritonConfig(tn=256),
    "w4": pt.TritonConfig(num_warps=4),
    "w8": pt.TritonConfig(num_warps=8),
    "s2": pt.TritonConfig(num_stages=2),
    "s4": pt.TritonConfig(num_stages=4),
    "tn256w8": pt.TritonConfig(tn=256, num_warps=8),
    "ml4": pt.TritonConfig(max_len=4),
    "ml8": pt.TritonConfig(max_len=8),
    "ml16": pt.TritonConfig(max_len=16),
    "tn64ml8": pt.TritonConfig(tn=64, max_len=8),
}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", type=int, nargs="+", default=[8192], help="m = k")
    ap.add_argument("--n", type=int, nargs="+", default=[256, 4096])
    ap.add_argument("--d", type=int, nargs="+", default=[4, 16, 64], help="density = 1 / D")
    ap.add_argument("--b", type=int, nargs="+", default=[16, 32, 64, 128])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--skew", action="store_true", help="also power-law vs uniform rows")
    ap.add_argument("--no-torch-bsr", action="store_true")
    ap.add_argument("--xla", action="store_true", help="also time the pure-JAX reference")
    ap.add_argument("--variants", nargs="*", default=None, help="compare kernel configs (names in VARIANTS)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--op", default="dsd", choices=["dsd", "dds"], help="W @ X (dsd) or X^T @ W (dds)")
    ap.add_argument("--budget-s", type=float, default=1e9, help="stop starting new cells after this many seconds")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--small", action="store_true", help="CPU-sized smoke run: m=512, n=128, b 16 32, d 4 16, float32")
    args = ap.parse_args(argv)
    if args.small:
        args.m, args.n, args.b, args.d, args.reps, args.trials = [512], [128], [16, 32], [4, 16], 3, 1
        args.dtype = "float32"
    dtype = jnp.dtype(args.dtype)
    failed = []

    t_start = time.perf_counter()
    dense = Dense(args.reps, args.trials, dtype)
    rows = []
    print(f"device: {jax.devices()[0].device_kind}; jax {jax.__version__}", flush=True)

    def out_of_time():
        return time.perf_counter() - t_start > args.budget_s

    cells = [(m, n, d, b) for m in args.m for n in args.n for b in args.b for d in args.d]
    for m, n, d, b in cells:
        if out_of_time():
            print(f"budget reached; skipped from {(m, n, d, b)} on", flush=True)
            break
        p = bs.BlockPattern.random(0, (m, m), (b, b), 1 / d)
        names = args.variants if args.variants is not None else [None]
        for name in names or list(VARIANTS):
            try:
                r = bench_cell(  # a variant's config: the Pallas backend alone runs (config=)
                    p, n, args.reps, args.trials, dense, op=args.op, dtype=dtype,
                    torch_bsr=not args.no_torch_bsr and name in (None, "default") and args.op == "dsd",
                    config=VARIANTS[name] if name is not None else None,
                )  # fmt: skip
            except Exception as e:  # noqa: BLE001 - keep sweeping; recorded, and the exit status says so
                why = str(e) if isinstance(e, CellFailed) else f"{type(e).__name__}: {str(e)[:300]}"
                print(f"FAILED {(m, n, d, b, name)}: {why}", flush=True)
                failed.append(dict(m=m, k=m, n=n, b=b, d=1 / d, variant=name or "default", op=args.op, error=why))
                continue
            r["variant"] = name or "default"
            rows.append(r)
            print(json.dumps(r), flush=True)
            if args.skew and name is None:
                q = bs.BlockPattern.power_law(0, (m, m), (b, b), 1 / d)
                r2 = bench_cell(
                    q, n, args.reps, args.trials, dense, torch_bsr=False, label="powerlaw", op=args.op, dtype=dtype
                )
                r2["skew_ratio"] = r2["time_ms"] / r["time_ms"]
                r2["max_row"] = int(q.row_lengths.max())
                r2["variant"] = "default"
                rows.append(r2)
                print(json.dumps(r2), flush=True)
            if args.xla and name is None:
                r3 = bench_cell(
                    p, n, args.reps, args.trials, dense, torch_bsr=False, impl="xla", op=args.op, dtype=dtype
                )
                r3["variant"] = "xla"
                rows.append(r3)
                print(json.dumps(r3), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            doc = {"device": jax.devices()[0].device_kind, "argv": sys.argv, "rows": rows, "failed": failed}
            json.dump(doc, f, indent=1)
    print()
    print_table(rows)
    for r in rows:
        if r["pattern"] == "powerlaw":
            print(f"skew {_cell(r)}: powerlaw/uniform = {r['skew_ratio']:.2f} (max row {r['max_row']})")
    if args.variants is not None:
        print("variants:")
        for r in rows:
            print(f"  {_cell(r)} {r['variant']:>8} {r['time_ms']:.4f} ms {r['tflops']:.1f} TF/s")
    if failed or not rows:
        print(f"{len(failed)} cells FAILED, {len(rows)} measured", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
