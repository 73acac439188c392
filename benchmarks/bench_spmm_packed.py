"""SpMM with several light nodes per program: ``csr_sum`` timed for each ``nodes_per_program``.

    python benchmarks/bench_spmm_packed.py --json out.json [--nodes 1 2 4 8 16] [--dtypes float32 bfloat16]
        [--graphs power-law-32 arxiv-like] [--features 128] [--small]

Graphs: ``power-law-32`` = ``gnn.power_law(262144, 8388608)`` (mean in-degree 32) and ``arxiv-like``
= ``paper_graph_edges("ogbn-arxiv")`` (169,343 nodes, 1,166,243 edges: mean in-degree 6.9, the
ogbn-arxiv degree skew). For each graph, dtype and ``G`` in ``--nodes``, the Pallas ``csr_sum``
(``G = 1``: the one-node kernel, today's default; else the packed kernel) is timed with
``blocksparse.bench.Timer``: ``ms`` = ``Timer.loop`` (median device time per call inside one jitted
loop), ``calls_ms`` = ``Timer.calls``; plus the XLA reference (``impl = "xla"``) as a baseline.
Each result is checked against the XLA reference (``rel_err``, relative Frobenius error; a failure
above ``blocksparse.bench.tolerance`` makes the exit status 1). ``speedup_vs_g1`` = the one-node
kernel's ``ms`` / this row's. The JSON is rewritten after every row.

``--small`` runs tiny graphs in the Pallas interpreter on the CPU, in seconds: the test of this script.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
import traceback
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import blocksparse.gnn as gnn
from blocksparse.bench import Timer, check_close
from blocksparse.gnn.generators import paper_graph_edges
from blocksparse.ops.gnn.spmm import pallas_triton as K
from blocksparse.ops.gnn.spmm import reference as R

GRAPHS = ("power-law-32", "arxiv-like")


def make_graph(name: str, small: bool) -> gnn.Graph:
    if name == "power-law-32":
        return gnn.power_law(*((512, 16384) if small else (262_144, 8_388_608)), seed=0)
    if name == "arxiv-like":
        src, dst, n = paper_graph_edges("ogbn-arxiv", scale=0.005 if small else 1.0)
        return gnn.Graph.from_edges(src, dst, n, name="arxiv-like")
    raise ValueError(f"Expected a graph in {GRAPHS}. Got {name!r}.")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", required=True, help="output path (rewritten after every row)")
    ap.add_argument("--graphs", nargs="+", default=list(GRAPHS), choices=GRAPHS)
    ap.add_argument("--nodes", nargs="+", type=int, default=[1, 2, 4, 8, 16], help="nodes_per_program values")
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--features", type=int, default=128)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--small", action="store_true", help="tiny graphs in the interpreter (CPU)")
    args = ap.parse_args(argv)
    for g_ in args.nodes:
        K.check_nodes_per_program(g_)
    timer = Timer(iters=2, trials=1, warmup=0) if args.small else Timer(iters=args.iters, trials=5, warmup=2)
    out = dict(device=str(jax.devices()[0]), features=args.features, timer=repr(timer), graphs={}, rows=[])
    failed = False

    def save():
        Path(args.json).write_text(json.dumps(out, indent=1))

    ctx = gnn.interpret() if args.small else contextlib.nullcontext()
    with ctx:
        for gname in args.graphs:
            t0 = time.perf_counter()
            g = make_graph(gname, args.small)
            out["graphs"][gname] = dict(
                nodes=g.num_nodes, edges=g.num_edges, mean_in_degree=g.num_edges / g.num_nodes,
                extra_units=int(g.schedule.num_extra), build_s=time.perf_counter() - t0,
            )  # fmt: skip
            for dname in args.dtypes:
                dtype = jnp.dtype(dname)
                x = jax.random.normal(jax.random.key(0), (g.num_nodes, args.features), dtype)
                want = jax.jit(lambda x, g=g: R.csr_sum(g, None, x))(x)
                base = None
                impls = [("xla", None)] + [("pallas", n) for n in args.nodes]
                for impl, nodes in impls:
                    row = dict(graph=gname, dtype=dname, impl=impl, nodes_per_program=nodes)
                    try:
                        if impl == "xla":
                            fn = lambda x, g=g: R.csr_sum(g, None, x)  # noqa: E731
                        else:
                            fn = lambda x, g=g, nodes=nodes: K.csr_sum(g, None, x, nodes_per_program=nodes)  # noqa: E731
                        row["rel_err"] = check_close(jax.jit(fn)(x), want, what=f"{gname} {dname} G={nodes}")
                        row["ms"] = timer.loop(fn, x)
                        row["calls_ms"] = timer.calls(fn, x)
                        if nodes == 1:
                            base = row["ms"]
                        if impl == "pallas" and base is not None:
                            row["speedup_vs_g1"] = base / row["ms"]
                    except Exception as e:  # recorded; the exit status says it failed
                        failed = True
                        row["error"] = f"{type(e).__name__}: {e}"
                        traceback.print_exc()
                    print(json.dumps(row), flush=True)
                    out["rows"].append(row)
                    save()
    save()
    return int(failed)


if __name__ == "__main__":
    np.set_printoptions(precision=4)
    sys.exit(main())
