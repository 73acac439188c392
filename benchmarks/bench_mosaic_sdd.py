"""The Mosaic GPU (Hopper: TMA + wgmma) ``sdd`` kernel (the weight gradient) against Triton and dense ``jnp.dot``.

A cell is the weight gradient of one sparse layer, ``W`` of ``m x n`` with ``b x b`` blocks at density ``1/d``
and a contracted dimension ``K`` (tokens), in the layout the backward has its operands:

- ``dsd`` (``y = W @ x``): ``dW = dy (m, K) @ x.T`` where ``x`` is stored ``(n, K)``;
- ``dds`` (``y = x @ W``): ``dW = x.T @ dy (K, n)`` where ``x`` is stored ``(K, m)``.

Timed in one process, each checked against the dense product at the blocks (relative Frobenius error):

- ``dense``: ``jnp.dot`` of the whole ``m x n`` product (a dense layer's weight gradient; cuBLAS);
- ``triton``: ``bs.sdd(..., implementation="pallas")`` on the transposed operand (XLA's transpose copy
  included, as the backward runs it today), its default splits of the contracted dimension;
- ``triton_unsplit``: the same with one program per block (``KernelConfig(sdd_splits=1)``);
- ``mosaic``: ``blocksparse.ops.matmul.mosaic.sdd.sdd`` with its default plan on the same materialised transpose;
- ``mosaic_view``: the same kernel reading the stored operand through a transposed shared-memory view
  (``a_transposed`` / ``b_transposed``: no copy);
- variants of ``--tk`` x ``--stages`` x ``--splits`` (an ``SddConfig``, on the view), under ``variants``.

Times: ``*_ms`` is the median of :meth:`blocksparse.bench.Timer.loop` (one jitted loop), ``*_calls_ms`` of
:meth:`~blocksparse.bench.Timer.calls` (back-to-back jitted calls); ``*_tflops`` counts ``2 K nnz b^2`` (dense:
``2 m n K``). A kernel that fails to compile, run or check records its error and the run goes on (exit status 1).

Usage::

    python3 benchmarks/bench_mosaic_sdd.py --json $OUT/mosaic_sdd.json
    python3 benchmarks/bench_mosaic_sdd.py --cell dsd 8192 8192 4096 --tk 64 128 --stages 3 4 --json $OUT/t.json
    python3 benchmarks/bench_mosaic_sdd.py --cell dds 384 1536 32768 --b 16 32 --triton-splits 2 4 8 --json $OUT/s.json

``--interpret`` runs every kernel in Pallas' interpreter (the CPU; tiny shapes only, to check the script). Blocks
the Mosaic kernel does not take (16, 32) time the others and record its reason.
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
from blocksparse.bench import Timer
from blocksparse.ops.matmul import triton as pt
from blocksparse.ops.matmul.mosaic import sdd as ps

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_mosaic import add_row, finish, new_doc  # noqa: E402  (the same report and failure rule)
from bench_mosaic_dds import _time  # noqa: E402  (run, check and time one kernel)

#: (kind, m, n, K): W 8192 x 8192 under x of 4096 columns; the inference layer 384 x 1536 under 32768 tokens.
CELLS = [("dsd", 8192, 8192, 4096), ("dds", 384, 1536, 32768)]


def _operands(kind: str, m: int, n: int, k: int, dtype):
    """The two stored operands of the backward's sdd: ``(dy, x)`` for dsd, ``(x, dy)`` for dds."""
    if kind == "dsd":
        return jax.random.normal(jax.random.key(1), (m, k), dtype), jax.random.normal(jax.random.key(2), (n, k), dtype)
    return jax.random.normal(jax.random.key(1), (k, m), dtype), jax.random.normal(jax.random.key(2), (k, n), dtype)


def _triton_split(kind: str, W, splits: int):
    """Triton's sdd of the two stored operands with ``splits`` programs per block (materialised transposes)."""
    a_t, b_t = kind == "dds", kind == "dsd"

    def fn(p, q):
        config = pt.TritonConfig(sdd_splits=splits)
        return bs.sdd(p.T if a_t else p, q.T if b_t else q, W, implementation="pallas", config=config).data

    return fn


def _kernels(kind: str, W, cfg=None):
    """name -> function of the two stored operands."""
    pattern = W.pattern
    a_t, b_t = kind == "dds", kind == "dsd"  # which operand is stored transposed
    mat = lambda p, q: (p.T if a_t else p, q.T if b_t else q)  # noqa: E731  (materialised transposes)
    return {
        "dense": lambda p, q: jnp.dot(*mat(p, q), preferred_element_type=jnp.float32).astype(p.dtype),
        "triton": lambda p, q: bs.sdd(*mat(p, q), W, implementation="pallas").data,
        "triton_unsplit": _triton_split(kind, W, 1),
        "mosaic": lambda p, q: ps.sdd(pattern, *mat(p, q), config=cfg),
        "mosaic_view": lambda p, q: ps.sdd(pattern, p, q, a_transposed=a_t, b_transposed=b_t, config=cfg),
    }


def _at_blocks(dense, W):
    bh, bw = W.block_size
    g = dense.reshape(W.pattern.grid[0], bh, W.pattern.grid[1], bw)
    return g[W.pattern.rows, :, W.pattern.cols, :]  # (nnz, bh, bw)


def bench_cell(kind, m, n, k, b, d, dtype, timer: Timer, configs, triton_splits=()) -> dict:
    W = bs.random(jax.random.key(0), (m, n), b, 1.0 / d, dtype)
    p_, q_ = _operands(kind, m, n, k, dtype)
    flops = 2.0 * k * W.nnz_blocks * b * b
    row = {"kind": kind, "m": m, "n": n, "K": k, "b": b, "density": 1.0 / d, "dtype": jnp.dtype(dtype).name}
    row["nnz_blocks"] = W.nnz_blocks
    row["triton_splits"] = pt.sdd_splits(W.nnz_blocks, k, W.block_size)
    kernels = _kernels(kind, W)
    try:
        p = ps.plan(W.pattern, k, jnp.dtype(dtype).itemsize)
        row.update(mosaic_tk=p.tk, mosaic_stages=p.stages, mosaic_splits=p.splits)
    except NotImplementedError as e:  # blocks of 16 / 32: Triton and dense only
        row["mosaic_refused"] = f"NotImplementedError: {e}"  # not a failure of the cell
        kernels = {name: fn for name, fn in kernels.items() if not name.startswith("mosaic")}
        configs = ()
    want = None
    for name, fn in kernels.items():
        got = _time(name, fn, p_, q_, want, dtype, timer, 2.0 * m * n * k if name == "dense" else flops, row)
        if name == "dense" and got is not None:
            want = _at_blocks(got.astype(jnp.float32), W)
    if "triton_ms" in row and "triton_unsplit_ms" in row:
        row["triton_split_speedup"] = row["triton_unsplit_ms"] / row["triton_ms"]
    row["triton_variants"] = []
    for splits in triton_splits:
        v = {"sdd_splits": splits}
        _time("triton", _triton_split(kind, W, splits), p_, q_, want, dtype, timer, flops, v)
        row["triton_variants"].append(v)
    for name in ("triton", "dense"):
        for mine in ("mosaic", "mosaic_view"):
            if f"{mine}_ms" in row and f"{name}_ms" in row:
                row[f"{mine}_speedup_vs_{name}"] = row[f"{name}_ms"] / row[f"{mine}_ms"]
    row["variants"] = []
    for cfg in configs:
        v = {"tk": cfg.tk, "stages": cfg.stages, "splits": cfg.splits}
        try:
            pv = ps.plan(W.pattern, k, jnp.dtype(dtype).itemsize, cfg)
            v.update(tk=pv.tk, stages=pv.stages, splits=pv.splits)
        except NotImplementedError as e:
            v["mosaic_error"] = f"NotImplementedError: {e}"
            row["variants"].append(v)
            continue
        _time("mosaic", _kernels(kind, W, cfg)["mosaic_view"], p_, q_, want, dtype, timer, flops, v)
        if "mosaic_ms" in v and "triton_ms" in row:
            v["speedup_vs_triton"] = row["triton_ms"] / v["mosaic_ms"]
        row["variants"].append(v)
    return row


COLUMNS = [("kind", "{}"), ("m", "{}"), ("n", "{}"), ("K", "{}"), ("b", "{}"), ("density", "{:.4g}"),
           ("dense_ms", "{:.3f}"), ("triton_ms", "{:.3f}"), ("triton_unsplit_ms", "{:.3f}"), ("triton_splits", "{}"),
           ("triton_split_speedup", "{:.2f}"), ("mosaic_ms", "{:.3f}"), ("mosaic_view_ms", "{:.3f}"),
           ("mosaic_view_calls_ms", "{:.3f}"), ("mosaic_view_tflops", "{:.0f}"),
           ("mosaic_view_speedup_vs_triton", "{:.2f}"), ("mosaic_view_err", "{:.2e}"), ("mosaic_tk", "{}"),
           ("mosaic_splits", "{}")]  # fmt: skip


def _variant_label(v) -> str:
    return f"tk={v['tk']} stages={v['stages']} splits={v['splits']}:"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cell", nargs=4, action="append", metavar=("KIND", "M", "N", "K"), default=None,
                    help="dsd|dds M N K: the gradient of an M x N sparse W over K tokens; repeatable")  # fmt: skip
    ap.add_argument("--b", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--d", type=int, nargs="+", default=[4, 16, 64], help="density = 1/d")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    ap.add_argument("--tk", type=int, nargs="+", default=None, help="variants: force these contracted tiles")
    ap.add_argument("--stages", type=int, nargs="+", default=None, help="variants: force these depths")
    ap.add_argument("--splits", type=int, nargs="+", default=None, help="variants: force these splits")
    ap.add_argument("--triton-splits", type=int, nargs="+", default=None,
                    help="Triton variants: force these programs per block (KernelConfig(sdd_splits=...))")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--interpret", action="store_true", help="Pallas' interpreter on the CPU (tiny shapes only)")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)

    why = hardware.hopper_problem()
    if why is not None and not args.interpret:
        print(f"bench_mosaic_sdd: the Mosaic kernel needs a Hopper GPU: {why}", file=sys.stderr)
        return 2
    cells = [(c[0], int(c[1]), int(c[2]), int(c[3])) for c in args.cell] if args.cell else CELLS
    configs = []
    if args.tk or args.stages or args.splits:
        for tk, stages, splits in itertools.product(args.tk or [None], args.stages or [None], args.splits or [None]):
            configs.append(ps.SddConfig(tk=tk, stages=stages, splits=splits))
    dtype = jnp.dtype(args.dtype)
    timer = Timer(iters=args.iters, trials=args.trials)
    doc = new_doc("bench_mosaic_sdd", timer, interpret=args.interpret)
    with bs.interpret() if args.interpret else contextlib.nullcontext():
        for (kind, m, n, k), b, d in itertools.product(cells, args.b, args.d):
            if kind not in ("dsd", "dds"):
                raise SystemExit(f"Expected a cell kind 'dsd' or 'dds'. Got {kind!r}.")
            row = bench_cell(kind, m, n, k, b, d, dtype, timer, configs, args.triton_splits or ())
            add_row(doc, row, args.json)
    return finish(doc, args.json, COLUMNS, _variant_label)


if __name__ == "__main__":
    sys.exit(main())
