"""The Mosaic GPU (Hopper: TMA + wgmma) ``dsd`` kernel against the Triton Pallas kernel and dense ``jnp.dot``.

For each cell (``W`` of ``m x m`` with ``b x b`` blocks at density ``1/d``, ``x`` of ``m x n``,
bf16 or fp16, float32 accumulation) one random pattern is timed in one process:

- ``dense``: ``jnp.dot`` of the dense ``W`` (cuBLAS through XLA);
- ``triton``: ``bs.matmul(W, x, implementation="pallas")`` (the Pallas Triton kernel);
- ``mosaic``: ``bs.matmul(W, x, implementation="mosaic")`` (its default tiles), then each forced
  variant of ``--tn`` x ``--stages`` x ``--consumers`` (``blocksparse.ops.matmul.mosaic.backend.dsd``
  with a ``MosaicConfig``), recorded under ``variants``; a variant the plan refuses (shared memory)
  records the reason and is not a failure.

With ``--epilogue ACT`` every sparse kernel runs fused with a bias and the activation ``ACT``
(``bs.matmul(..., bias=, activation=)``; dense: ``jnp.dot`` then the same epilogue in XLA).

Times are the median device time of :class:`blocksparse.bench.Timer` ``.loop`` (one jitted loop);
``*_tflops`` counts the useful flops ``2 nnz bh bw n``. Every kernel is checked against the
dense product (relative Frobenius error); a kernel that fails to compile, run or check records
its error in the row and the run goes on; the JSON is rewritten after every row (``bench_mosaic_dds.py`` and
``bench_mosaic_sdd.py`` share this report), so a run cut by its time limit keeps what it measured. Each row
also records ``default``: the implementation
``bs.matmul(W, x)`` picks for the cell (``blocksparse.ops.matmul.order.default``), to check the rule against the
measured speedup.

Usage (the brief's grid, about a minute on an H200; the b = 64 sweep of forced tiles and depths)::

    python3 benchmarks/bench_mosaic.py --json $OUT/mosaic.json
    python3 benchmarks/bench_mosaic.py --b 64 --tn 128 256 --stages 2 3 4 --json $OUT/mosaic_b64.json
    python3 benchmarks/bench_mosaic.py --n 256 --b 64 --tn 64 128 256 --json $OUT/mosaic_b64_n256.json
    python3 benchmarks/bench_mosaic.py --b 64 --tn 64 128 --consumers 1 2 --json $OUT/mosaic_b64_2wg.json
    python3 benchmarks/bench_mosaic.py --cluster 1 2 --tn 128 256 --json $OUT/mosaic_cluster.json
    python3 benchmarks/bench_mosaic.py --epilogue gelu --json $OUT/mosaic_gelu.json
    python3 benchmarks/bench_mosaic.py --pattern uniform powerlaw --json $OUT/mosaic_skew.json
    python3 benchmarks/bench_mosaic.py --pattern uniform powerlaw --persistent --reduce kernel xla --json $OUT/r.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import blocksparse as bs
from blocksparse import hardware
from blocksparse.bench import Timer, check_close
from blocksparse.ops.matmul import epilogue, order
from blocksparse.ops.matmul.mosaic import backend
from blocksparse.ops.matmul.mosaic import dsd as pallas_mosaic
from blocksparse.ops.matmul.mosaic import persistent as pp


def _kernels(W, bias, activation):
    """name -> (function of (operand, x), operand): the dense reference, Triton and Mosaic (default tiles)."""
    dense = W.to_dense()
    fused = {} if bias is None else {"bias": bias, "activation": activation}

    def dense_fn(a, x):
        y = jnp.dot(a, x, preferred_element_type=jnp.float32)
        return (y if bias is None else epilogue.apply(y, bias[None, :], activation)).astype(x.dtype)

    return {
        "dense": (dense_fn, dense),
        "triton": (lambda W, x: bs.matmul(W, x, implementation="pallas", **fused), W),
        "mosaic": (lambda W, x: bs.matmul(W, x, implementation="mosaic", **fused), W),
    }


def _variant(W, bias, activation, cfg):
    epi = None if bias is None else epilogue.Epilogue(activation, True, 1)
    return lambda W, x: backend.dsd(W.pattern, W.data, x, config=cfg, epi=epi, bias=bias)


def _time(name, fn, a, x, want, dtype, timer, flops, out: dict, unrolled: int = 0):
    """Run, check and time one kernel into ``out`` (``{name}_ms``, ...); an exception is recorded.

    ``unrolled``: also time that many calls written out in one jitted function (``Timer.unrolled``; 0: not).
    Returns the result (``None`` if the kernel failed)."""
    got = None
    try:
        got = jax.jit(fn)(a, x)
        if want is not None:
            out[f"{name}_err"] = check_close(got, want, dtype=dtype, what=name)
        ms = timer.loop(fn, a, x)
        out[f"{name}_ms"] = ms
        out[f"{name}_tflops"] = flops / (ms * 1e-3) / 1e12
        if unrolled:  # the same calls with no while loop around them
            out[f"{name}_unrolled_ms"] = timer.unrolled(fn, a, x, iters=unrolled)
    except Exception as e:  # CellFailed or a compile error: record it, the other kernels still run
        out[f"{name}_error"] = " ".join(f"{type(e).__name__}: {e}".split())[:500]
    return got


def _matrix(kind: str, shape: tuple[int, int], b: int, d: int, dtype) -> bs.BlockSparseMatrix:
    """W of ``shape`` with ``b x b`` blocks at density ``1/d``: uniform random blocks, or rows of power-law
    lengths (``BlockPattern.power_law``: a few very long rows) with the same number of blocks."""
    if kind == "uniform":
        return bs.random(jax.random.key(0), shape, b, 1.0 / d, dtype)
    pattern = bs.BlockPattern.power_law(0, shape, (b, b), 1.0 / d)
    return bs.BlockSparseMatrix(pattern, jax.random.normal(jax.random.key(0), (pattern.nnz_blocks, b, b), dtype))


def bench_cell(m: int, n: int, b: int, d: int, dtype, timer: Timer, configs, activation=None,
               pattern: str = "uniform", unrolled: int = 0) -> dict:  # fmt: skip
    W = _matrix(pattern, (m, m), b, d, dtype)
    x = jax.random.normal(jax.random.key(1), (m, n), dtype)
    bias = None if activation is None else jax.random.normal(jax.random.key(2), (n,), jnp.float32)
    flops = 2.0 * W.nnz_blocks * b * b * n
    row = {"m": m, "n": n, "b": b, "density": 1.0 / d, "dtype": jnp.dtype(dtype).name, "nnz_blocks": W.nnz_blocks}
    row.update(pattern=pattern, max_row=int(np.bincount(W.pattern.rows, minlength=W.pattern.grid[0]).max()))
    row["epilogue"] = activation
    row["default"] = order.default("dsd", W.pattern, n, dtype, dtype)[0]
    p = backend.dsd_plan(W.pattern, n, jnp.dtype(dtype).itemsize)
    row.update(mosaic_tn=p.tn, mosaic_stages=p.stages, units=p.sched.num_units, partials=p.sched.num_partials)
    row["mosaic_kernel"] = "persistent" if p.persistent is not None else "per item"
    want = None
    for name, (fn, a) in _kernels(W, bias, activation).items():
        got = _time(name, fn, a, x, want, dtype, timer, flops, row, unrolled)
        if name == "dense" and got is not None:
            want = got.astype(jnp.float32)
    for name in ("triton", "dense"):
        if "mosaic_ms" in row and f"{name}_ms" in row:
            row[f"speedup_vs_{name}"] = row[f"{name}_ms"] / row["mosaic_ms"]
    row["variants"] = []
    for cfg in configs:
        v = {"tn": cfg.tn, "stages": cfg.stages, "max_len": cfg.max_len, "consumers": cfg.consumers,
             "grid_order": cfg.grid_order, "persistent": cfg.persistent, "programs": cfg.programs,
             "reduce": cfg.reduce, "cluster": cfg.cluster}  # fmt: skip
        try:
            if cfg.consumers > 1 and activation is not None:
                raise NotImplementedError("two warpgroups have no fused epilogue")
            pv = backend.dsd_plan(W.pattern, n, jnp.dtype(dtype).itemsize, cfg)
            v.update(tn=pv.tn, stages=pv.stages, grid_order=pv.grid_order)
            if pv.persistent is not None:
                v.update(programs=pv.persistent.programs, max_steps=pv.persistent.max_steps_per_program(),
                         reduce="kernel" if pv.persistent.reduce else "xla", partials=pv.sched.num_partials)
        except NotImplementedError as e:  # this variant cannot take the cell (too much shared memory, ...)
            v["mosaic_error"] = f"NotImplementedError: {e}"
            row["variants"].append(v)
            continue
        _time("mosaic", _variant(W, bias, activation, cfg), W, x, want, dtype, timer, flops, v, unrolled)
        if "mosaic_ms" in v and "triton_ms" in row:
            v["speedup_vs_triton"] = row["triton_ms"] / v["mosaic_ms"]
        row["variants"].append(v)
    return row


def _failed(row) -> bool:
    """A kernel failed to compile, run or check (a variant refused by the plan is not a failure)."""
    if any(k.endswith("_error") for k in row):
        return True
    return any(k.endswith("_error") and "NotImplementedError" not in e for v in row["variants"] for k, e in v.items())


COLUMNS = [("m", "{}"), ("n", "{}"), ("b", "{}"), ("density", "{:.4g}"), ("dense_ms", "{:.3f}"),
           ("triton_ms", "{:.3f}"), ("mosaic_ms", "{:.3f}"), ("mosaic_tflops", "{:.0f}"),
           ("speedup_vs_triton", "{:.2f}"), ("speedup_vs_dense", "{:.2f}"), ("mosaic_tn", "{}"),
           ("mosaic_stages", "{}"), ("default", "{}"), ("pattern", "{}"), ("max_row", "{}"),
           ("mosaic_skew_ratio", "{:.2f}"), ("triton_skew_ratio", "{:.2f}"), ("dense_unrolled_ms", "{:.3f}"),
           ("triton_unrolled_ms", "{:.3f}"), ("mosaic_unrolled_ms", "{:.3f}")]  # fmt: skip


def _variant_label(v) -> str:
    order = f" grid_order={v['grid_order']}" if v.get("grid_order") else ""
    if v.get("persistent"):
        order += f" persistent programs={v.get('programs')} max_steps={v.get('max_steps')}"
        order += f" partials={v.get('partials')} reduce={v.get('reduce')}"
    if v.get("cluster", 1) > 1:
        order += f" cluster={v['cluster']}"
    return f"tn={v['tn']} stages={v['stages']} consumers={v['consumers']} max_len={v['max_len']}{order}:"


def _table(rows, cols=COLUMNS, variant_label=_variant_label) -> str:
    """One line per row (``cols``: (key, format)), then its errors and its forced variants."""
    out = ["  ".join(f"{c:>17}" for c, _ in cols)]
    for r in rows:
        out.append("  ".join(f"{(f.format(r[c]) if c in r else '-'):>17}" for c, f in cols))
        for k, v in r.items():
            if k.endswith("_error"):
                out.append(f"    {k}: {v}")
        for v in r.get("variants", ()):
            ms = f"{v['mosaic_ms']:.3f} ms, {v['speedup_vs_triton']:.2f}x Triton" if "speedup_vs_triton" in v else ""
            error = f" {v['mosaic_error']}" if "mosaic_error" in v else ""
            out.append(f"    variant {variant_label(v)} {ms}{error}")
    return "\n".join(out)


def new_doc(name: str, timer: Timer, **environment) -> dict:
    """The JSON document of one run: the script, the machine (plus ``environment``), the timer, its rows."""
    env = {"jax": jax.__version__, "device": jax.devices()[0].device_kind, "python": platform.python_version()}
    return {"benchmark": name, "environment": {**env, **environment}, "timer": repr(timer), "rows": [],
            "started": time.perf_counter()}  # fmt: skip


def add_row(doc: dict, row: dict, path: str | None) -> None:
    """Record ``row``: printed as a JSON line, and the document rewritten to ``path`` (a run cut by its time limit
    keeps the rows it measured)."""
    doc["rows"].append(row)
    print(json.dumps(row), flush=True)
    if path:
        _write(doc, path)


def finish(doc: dict, path: str | None, cols=COLUMNS, variant_label=_variant_label) -> int:
    """Print the table, write the document with the run's seconds; the exit status (1 if a kernel failed)."""
    doc["seconds"] = time.perf_counter() - doc.pop("started")
    print(_table(doc["rows"], cols, variant_label))
    if path:
        _write(doc, path)
    return 1 if any(_failed(r) for r in doc["rows"]) else 0


def _write(doc: dict, path: str) -> None:
    with open(path, "w") as f:
        json.dump({k: v for k, v in doc.items() if k != "started"}, f, indent=1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--m", type=int, nargs="+", default=[8192], help="m = k")
    ap.add_argument("--n", type=int, nargs="+", default=[4096, 256])
    ap.add_argument("--b", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--d", type=int, nargs="+", default=[4, 16, 64], help="density = 1/d")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    ap.add_argument("--tn", type=int, nargs="+", default=None, help="Mosaic variants: force these column tiles")
    ap.add_argument("--stages", type=int, nargs="+", default=None, help="Mosaic variants: force these depths")
    ap.add_argument("--max-len", type=int, default=None, help="Mosaic variants: force the cap on blocks per program")
    ap.add_argument("--consumers", type=int, nargs="+", default=None, choices=[1, 2],
                    help="Mosaic variants: warpgroups per program (2: two column tiles share W's copy)")  # fmt: skip
    ap.add_argument("--cluster", type=int, nargs="+", default=None, choices=[1, 2],
                    help="Mosaic variants: programs per cluster (2: two column tiles share W's copies, a multicast)")
    ap.add_argument("--grid-order", nargs="+", default=None, choices=pallas_mosaic.GRID_ORDERS,
                    help="Mosaic variants: which programs launch fastest (column tiles or units)")  # fmt: skip
    ap.add_argument("--persistent", action="store_true",
                    help="Mosaic variants: each variant also as the persistent kernel (one pipeline across items)")
    ap.add_argument("--programs", type=int, nargs="+", default=None,
                    help="Mosaic variants: the persistent kernel's program counts (default: one per resident slot)")
    ap.add_argument("--reduce", nargs="+", default=None, choices=pp.REDUCTIONS,
                    help="Mosaic variants: the persistent kernel's sums of split rows (in the kernel, by XLA after)")
    ap.add_argument("--epilogue", default=None, choices=sorted(epilogue.ACTIVATIONS),
                    help="fuse a bias and this activation into every sparse kernel")  # fmt: skip
    ap.add_argument("--pattern", nargs="+", default=["uniform"], choices=["uniform", "powerlaw"],
                    help="W's pattern kinds; a powerlaw row records skew_ratio: its time over the uniform one's")
    ap.add_argument("--unrolled", type=int, default=0, metavar="N",
                    help="also time N calls written out in one jitted function, no while loop (Timer.unrolled)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)

    why = hardware.hopper_problem()
    if why is not None:
        print(f"bench_mosaic: the Mosaic kernel needs a Hopper GPU: {why}", file=sys.stderr)
        return 2
    configs = []
    if args.tn or args.stages or args.max_len or args.consumers or args.grid_order or args.persistent or args.cluster:
        grid = itertools.product(args.tn or [None], args.stages or [None], args.consumers or [1],
                                 args.grid_order or [None], args.cluster or [1])  # fmt: skip
        for tn, stages, c, order, cluster in grid:
            if cluster > 1 and c > 1:
                continue  # a cluster shares W between two programs of one warpgroup each
            kw = dict(tn=tn, stages=stages, max_len=args.max_len, consumers=c, grid_order=order)
            configs.append(pallas_mosaic.MosaicConfig(**kw, cluster=cluster,
                                                      persistent=False if args.persistent or cluster > 1 else None))
            if args.persistent and c == 1 and cluster == 1:
                for programs, reduce in itertools.product(args.programs or [None], args.reduce or [None]):
                    configs.append(pallas_mosaic.MosaicConfig(**kw, persistent=True, programs=programs, reduce=reduce))
    dtype = jnp.dtype(args.dtype)
    timer = Timer(iters=args.iters, trials=args.trials)
    doc = new_doc("bench_mosaic", timer)
    for m, n, b, d in itertools.product(args.m, args.n, args.b, args.d):
        cell = {}
        for kind in args.pattern:
            row = cell[kind] = bench_cell(m, n, b, d, dtype, timer, configs, args.epilogue, kind, args.unrolled)
            if kind == "powerlaw" and "uniform" in cell:  # same blocks, rows of power-law lengths
                for name in ("mosaic", "triton"):
                    if f"{name}_ms" in row and f"{name}_ms" in cell["uniform"]:
                        row[f"{name}_skew_ratio"] = row[f"{name}_ms"] / cell["uniform"][f"{name}_ms"]
            add_row(doc, row, args.json)
    return finish(doc, args.json)


if __name__ == "__main__":
    sys.exit(main())
