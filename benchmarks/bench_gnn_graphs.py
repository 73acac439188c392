# ruff: noqa: E402 - XLA's allocator setting must precede importing JAX
"""The GNN ops on the paper graphs against torch (cuSPARSE) and PyG, in one process.

    PYTHONPATH=. python benchmarks/bench_gnn_graphs.py --json out.json [--graphs NAME ...] [--dtype float32 bfloat16]
        [--orders degree rcm] [--pyg-mem-gib 60] [--small]

The run is the ``gnn-graphs`` suite's cells (:mod:`blocksparse.bench.gnn_graphs`: ours and the segment ops on
each paper graph, order and op, checked against the chunked float32 reference) and, graph by graph on the same
prepared graphs and inputs (:func:`blocksparse.bench.gnn_graphs.prepared`), the peers':

- ``torch-csr``: ``torch.sparse.mm`` on a CSR tensor (cuSPARSE; SpMM only);
- ``pyg-scatter``: ``torch_geometric.utils.scatter`` (SpMM sum, max), and GATv2 as PyG's ``GATv2Conv`` computes
  it (its ``softmax``, no projections), forward + backward.

Each peer cell checks the peer against the same reference (``peer_rel_err``, recorded; a peer above the
tolerance is not a failure), times it with CUDA events (:func:`peers.torch_time`) and reports ``speedup_vs_peer``
against ours from the suite's cell of the same graph, dtype, order and op (run before it). A PyG cell whose
estimated memory is above ``--pyg-mem-gib`` is skipped with the estimate; without torch, PyG or a CUDA device
every peer cell is skipped with the reason.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # torch allocates on the same GPU

import argparse
import sys

import jax.numpy as jnp
import numpy as np
from peers import require_pyg, require_torch, torch_time

from blocksparse.bench import Cell, CellSkipped, Timer, check_close, run_cells
from blocksparse.bench import gnn_graphs as suite

SUITE = "gnn-graphs-peers"
GIB = 2**30
# PyG's peak per edge, in E x H x D (or E x F) tensors: one gathered copy for scatter; GATv2Conv's forward +
# backward held 25.1 GiB on 8,388,608 edges x 128 fp32 features (docs/benchmarks.md), about 6.2 such tensors.
PYG_TENSORS = {"spmm_sum": 1.0, "max": 1.0, "gatv2": 6.2}
PEERS = {"spmm_sum": ("torch-csr", "pyg-scatter"), "max": ("pyg-scatter",), "gatv2": ("pyg-scatter",)}
COLUMNS = (("peer ms", "peer_ms", ".4g"), ("ours ms", "ours_loop_ms", ".4g"), ("x peer", "speedup_vs_peer", ".3g"),
           ("peer rel err", "peer_rel_err", ".2g"))  # fmt: skip


def peer_cell(prep, ours: dict, dtype, order, op, peer, iters, trials, pyg_mem_gib) -> Cell:
    def run(timer: Timer) -> dict:
        torch = require_torch()
        if peer == "pyg-scatter":
            require_pyg()
        p = prep()
        go, (x, xd, att, ct), ref = p.data(dtype, order)
        n, e = go.num_nodes, go.num_edges
        need = PYG_TENSORS[op] * e * x.shape[1] * x.dtype.itemsize if peer == "pyg-scatter" else 0
        if need > pyg_mem_gib * GIB:
            raise CellSkipped(f"PyG would hold about {need / GIB:.0f} GiB per call (> {pyg_mem_gib:g} GiB)")
        T = lambda a: torch.from_dlpack(a).clone()  # noqa: E731, N806
        xt, xdt, attt, ctt = T(x), T(xd), T(att), T(ct)
        src = torch.as_tensor(np.asarray(go.indices), device="cuda").long()
        dst = torch.as_tensor(np.asarray(go.dst_sorted), device="cuda").long()
        if peer == "torch-csr":
            indptr = torch.as_tensor(np.asarray(go.indptr), device="cuda").long()
            A = torch.sparse_csr_tensor(indptr, src, torch.ones(e, device="cuda", dtype=xt.dtype), size=(n, n))
            fn, outs, want = (lambda: torch.sparse.mm(A, xt)), (lambda o: [o]), (ref["spmm"],)
        elif op in ("spmm_sum", "max"):
            from torch_geometric.utils import scatter

            reduce = "sum" if op == "spmm_sum" else "max"
            fn, outs, want = (lambda: scatter(xt[src], dst, 0, n, reduce=reduce)), (lambda o: [o]), (
                ref["spmm" if op == "spmm_sum" else "max"],)  # fmt: skip
        else:
            import torch.nn.functional as F  # noqa: N812
            from torch_geometric.utils import scatter, softmax

            xs_r = xt.view(n, xd.shape[1], -1).detach().clone().requires_grad_(True)
            xd_r, att_r = xdt.detach().clone().requires_grad_(True), attt.detach().clone().requires_grad_(True)

            def fn():
                for t in (xs_r, xd_r, att_r):
                    t.grad = None
                xj = xs_r[src]
                a = softmax((F.leaky_relu(xj + xd_r[dst], 0.2) * att_r).sum(-1), dst, num_nodes=n)
                out = scatter(a.unsqueeze(-1) * xj, dst, 0, n, reduce="sum")
                out.backward(ctt)
                return out

            outs = lambda o: [o, xs_r.grad, xd_r.grad, att_r.grad]  # noqa: E731
            want = (ref["gatv2"], ref["dxs"], ref["dxd"], ref["datt"])
        got = [jnp.from_dlpack(t.detach().contiguous()) for t in outs(fn())]
        out = {}
        try:
            out["peer_rel_err"] = max(check_close(g.reshape(w.shape), w, tol=float("inf"), what=peer)
                                      for g, w in zip(got, want, strict=True))  # fmt: skip
        except Exception as e:  # noqa: BLE001 - a peer off the reference is recorded, not a failure
            out["peer_check"] = f"{type(e).__name__}: {e}"
        out.update(torch_time(fn, iters=iters, trials=trials))
        mine = ours.get((p.name, dtype, order, op))
        if mine:
            out["ours_loop_ms"] = mine
            out["speedup_vs_peer"] = out["peer_ms"] / mine
        out["implementation"] = peer
        return out

    params = dict(graph=prep.args[0], dtype=dtype, order=order, op=op, peer=peer)
    return Cell(SUITE, f"{prep.args[0]} {dtype} {order} {op} vs {peer}", params, run)


def cells(graphs, dtypes, orders, iters, trials, pyg_mem_gib, **sizes) -> list[Cell]:
    """The suite's cells of each graph (``sizes``: :func:`blocksparse.bench.gnn_graphs.suite`'s), each followed by
    the peers' cells on that graph."""
    ours: dict = {}  # (graph, dtype, order, op) -> our loop ms, filled as the suite's cells run
    out = []
    for name in graphs:
        mine = suite.suite(graphs=(name,), dtypes=dtypes, orders=orders, **sizes)
        prep = _prep(name, mine[0].run.prepare)
        for c in mine:
            c.run = _remember(c, ours)
        out += mine
        for dtype in dtypes:
            for order in orders:
                for op in suite.OPS:
                    for peer in PEERS[op]:
                        out.append(peer_cell(prep, ours, dtype, order, op, peer, iters, trials, pyg_mem_gib))
    return out


class _prep:  # noqa: N801 - the suite's prepared graph, named
    def __init__(self, name, prepare):
        self.args, self.prepare = (name,), prepare

    def __call__(self):
        return self.prepare()


def _remember(cell, ours):
    run = cell.run
    key = tuple(cell.params[k] for k in ("graph", "dtype", "order", "op"))

    def wrapped(timer):
        metrics = run(timer)
        ours[key] = metrics.get("loop_ms")
        return metrics

    return wrapped


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    full = suite.SIZES["full"]
    p.add_argument("--graphs", nargs="+", default=None, choices=full["graphs"], help="default: all (--small: arxiv)")
    p.add_argument("--dtype", nargs="+", default=["float32"], choices=["float32", "bfloat16"])
    p.add_argument("--orders", nargs="*", default=None, choices=["degree", "rcm"],
                   help="reorderings after the graph as generated (default: degree rcm; --small: none)")  # fmt: skip
    p.add_argument("--feat", type=int, default=128)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--pyg-mem-gib", type=float, default=60.0)
    p.add_argument("--scale", type=float, default=1.0, help="of every graph's nodes and edges")
    p.add_argument("--row-budget-s", type=float, default=suite.ROW_BUDGET_S,
                   help="fewer iterations for a JAX cell whose first call says it would take longer")  # fmt: skip
    p.add_argument("--rcm-max-edges", type=float, default=suite.RCM_MAX_EDGES, help="no RCM order above")
    p.add_argument("--small", action="store_true", help="tiny graphs (CPU: the suite's cells; the peers skipped)")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    edges = None
    if a.small:
        a.feat, a.heads, a.iters, a.trials, edges = 16, 2, 2, 1, 3000
    a.graphs = a.graphs or (["ogbn-arxiv"] if a.small else list(full["graphs"]))
    a.orders = a.orders if a.orders is not None else ([] if a.small else ["degree", "rcm"])
    orders = ("as generated", *a.orders)
    sizes = dict(edges=edges, scale=a.scale, feat=a.feat, heads=a.heads, budget_s=a.row_budget_s,
                 rcm_max_edges=int(a.rcm_max_edges))  # fmt: skip
    todo = cells(a.graphs, tuple(a.dtype), orders, a.iters, a.trials, a.pyg_mem_gib, **sizes)
    meta = dict(script="benchmarks/bench_gnn_graphs.py", argv=list(sys.argv[1:] if argv is None else argv))
    timer = Timer(iters=a.iters, trials=a.trials)
    return run_cells(todo, full=not a.small, json_path=a.json, timer=timer, meta=meta,
                     columns={"gnn-graphs": suite.COLUMNS, SUITE: COLUMNS})  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
