"""Block-sparse ``W @ X`` against torch's dense matmul (cuBLAS) and torch's BSR Triton kernel, in one process.

    PYTHONPATH=. python benchmarks/bench_matmul.py --m 8192 --n 256 4096 --b 16 32 64 128 --d 4 16 64 --json out.json
    PYTHONPATH=. python benchmarks/bench_matmul.py --small     # CPU-sized: the suite's cells; torch's skipped

The run is the ``matmul`` suite's cells for these sizes (:func:`blocksparse.bench.matmul.suite`: dense, static
and dynamic, timed with :class:`blocksparse.bench.Timer`, checked against dense) followed by the peers':

- ``torch dense``: ``a @ x`` of torch tensors of the same shape and dtype (cuBLAS), per ``n``;
- ``torch bsr``: ``torch.sparse._triton_ops.bsr_dense_mm`` on the same pattern and values, per cell.

Each peer cell also measures ``bs.matmul`` on the same operands (``loop_ms`` / ``calls_ms``) and reports
``peer_ms`` (CUDA events, :func:`peers.torch_time`) and ``speedup_vs_peer`` = peer time / ours. Without torch
or a CUDA device the peer cells are skipped with the reason. One JSON (``--json``), as ``blocksparse bench``
writes it.
"""

from __future__ import annotations

import argparse
import sys

import jax
import jax.numpy as jnp
import numpy as np
from peers import require_torch, torch_time

import blocksparse as bs
from blocksparse.bench import Cell, Timer, check_close, measure, ratio, run_cells
from blocksparse.bench import matmul as suite

SUITE = "matmul-peers"


def _operands(m, n, dtype, seed=0):
    return jax.random.normal(jax.random.key(seed + 1), (m, n), jnp.dtype(dtype))


def _ours(timer: Timer, W, x, dtype) -> dict:
    with jax.default_matmul_precision("highest"):
        want = jnp.dot(W.to_dense().astype(jnp.float32), x.astype(jnp.float32))
    return measure(timer, lambda W, x: W @ x, W, x, want=want, dtype=dtype, what="bs.matmul")


def dense_cell(m, n, dtype, iters, trials) -> Cell:
    def run(timer: Timer) -> dict:
        torch = require_torch()
        a = jax.random.normal(jax.random.key(2), (m, m), jnp.dtype(dtype))
        x = _operands(m, n, dtype)
        out = measure(timer, jnp.dot, a, x)
        ta = torch.from_dlpack(a).clone()
        tx = torch.from_dlpack(x).clone()
        got = jnp.asarray(np.asarray((ta @ tx).float().cpu()))
        out["peer_rel_err"] = check_close(got, jnp.dot(a, x).astype(jnp.float32), dtype=dtype, what="torch dense")
        out.update(torch_time(lambda: ta @ tx, iters=iters, trials=trials))
        ratio(out, "peer_ms", "loop_ms", "speedup_vs_peer")
        return out

    return Cell(SUITE, f"n={n} torch dense", dict(m=m, k=m, n=n, dtype=dtype, kind="torch dense"), run)


def bsr_cell(m, n, b, d, dtype, iters, trials) -> Cell:
    def run(timer: Timer) -> dict:
        torch = require_torch()
        from torch.sparse._triton_ops import bsr_dense_mm

        W = bs.random(jax.random.key(0), (m, m), b, d, dtype=jnp.dtype(dtype), pattern_seed=0)
        x = _operands(m, n, dtype)
        out = _ours(timer, W, x, jnp.dtype(dtype))
        p = W.pattern
        crow = torch.tensor(np.asarray(p.indptr, np.int64), device="cuda")
        col = torch.tensor(np.asarray(p.cols, np.int64), device="cuda")
        w = torch.sparse_bsr_tensor(crow, col, torch.from_dlpack(W.data).clone(), size=(m, m))
        tx = torch.from_dlpack(x).clone()
        out.update(torch_time(lambda: bsr_dense_mm(w, tx), iters=iters, trials=trials))
        ratio(out, "peer_ms", "loop_ms", "speedup_vs_peer")
        return out

    params = dict(m=m, k=m, n=n, b=b, density=d, dtype=dtype, kind="torch bsr")
    return Cell(SUITE, f"n={n} b={b} d={suite.density_label(d)} torch bsr", params, run)


def cells(m, ns, blocks, densities, dtype, iters, trials, bsr=True) -> list[Cell]:
    out = suite.suite(m=m, ns=ns, blocks=blocks, densities=densities, dtype=dtype)
    for n in ns:
        out.append(dense_cell(m, n, dtype, iters, trials))
        for b in blocks if bsr else ():
            for d in densities:
                out.append(bsr_cell(m, n, b, d, dtype, iters, trials))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", type=int, default=8192, help="m = k")
    ap.add_argument("--n", type=int, nargs="+", default=[256, 4096])
    ap.add_argument("--b", type=int, nargs="+", default=[16, 32, 64, 128])
    ap.add_argument("--d", type=int, nargs="+", default=[4, 16, 64], help="density = 1 / D")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--no-bsr", action="store_true", help="no torch BSR cells")
    ap.add_argument("--json", default=None)
    ap.add_argument("--small", action="store_true", help="CPU-sized: m=256, n=64, b 16 32, d 4, float32")
    args = ap.parse_args(argv)
    if args.small:
        args.m, args.n, args.b, args.d, args.dtype, args.iters, args.trials = 256, [64], [16, 32], [4], "float32", 2, 1
    todo = cells(args.m, args.n, args.b, [1 / d for d in args.d], args.dtype, args.iters, args.trials,
                 bsr=not args.no_bsr)  # fmt: skip
    timer = Timer(iters=args.iters, trials=args.trials)
    meta = dict(script="benchmarks/bench_matmul.py", argv=list(sys.argv[1:] if argv is None else argv))
    columns = {
        "matmul": suite.COLUMNS,
        SUITE: (
            ("loop ms", "loop_ms", ".4g"),
            ("peer ms", "peer_ms", ".4g"),
            ("x peer", "speedup_vs_peer", ".3g"),
            ("rel err", "rel_err", ".2g"),
        ),
    }
    return run_cells(todo, full=not args.small, json_path=args.json, timer=timer, columns=columns, meta=meta)


if __name__ == "__main__":
    sys.exit(main())
