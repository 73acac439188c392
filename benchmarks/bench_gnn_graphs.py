# ruff: noqa: E402 - XLA's allocator and JAX's constants settings must precede importing JAX
"""The ``gnn-graphs`` suite with the torch peers, cuSPARSE and PyG, timed inside each cell, in one process.

    PYTHONPATH=. python benchmarks/bench_gnn_graphs.py --json out.json [--graphs NAME ...] [--dtype float32 bfloat16]
        [--ops OP ...] [--passes fwd fwd+bwd] [--orders degree rcm] [--pyg-mem-gib 60] [--small] [--resume]
        [--stop-after-s S] [--log-parts] [--skip PART ...] [--resume-across DIGEST]

The run is the ``gnn-graphs`` suite's cells (:mod:`blocksparse.bench.gnn_graphs`: ``bs.gnn`` with its default, its
two backends named, XLA's segment ops and JAX's BCSR on each graph, dtype, op, pass and order, checked against the
chunked float32 reference), each also timing, on the same graph and inputs:

- ``torch-csr``: ``torch.sparse.mm`` on a CSR tensor (cuSPARSE; the SpMM ops, the norms as the CSR's values);
- ``pyg-scatter``: ``torch_geometric.utils.scatter`` (SpMM sum / mean, the GCN norm around a sum, max, min), and
  GATv2 as PyG's ``GATv2Conv`` computes it and graph attention as its ``TransformerConv`` does (its ``softmax``, no
  projections).

A forward + backward cell runs torch's autograd with the suite's cotangent. Each peer is checked against the same
reference (``{peer}_rel_err``, recorded; a peer above the tolerance is not a failure), timed with CUDA events
(:func:`peers.torch_time`: ``{peer}_loop_ms``, ``{peer}_mem_bytes``), and counts in the cell's
``speedup_vs_best_peer``. A PyG cell whose estimated memory is above ``--pyg-mem-gib`` is skipped with the estimate;
without torch, PyG or a CUDA device the peer is recorded as skipped with the reason (``{peer}_skipped``).

``--log-parts`` writes each part of a cell (the reference, each JAX timing, each torch peer) to stderr as it starts
and ends, with its seconds; ``--skip PART`` leaves a peer's part out by the name that log gives it (recorded in the
cell as ``{peer}_skipped``): for a peer whose one call outlasts a command's time limit.

The script runs JAX with ``JAX_USE_SIMPLIFIED_JAXPR_CONSTANTS=1`` unless the environment sets it: a graph's index
arrays then reach each compiled program as arguments, copied to the device once per program, instead of being
compiled into it as constants (JAX's coming default). The computation is the same either way (the kernels and
what they read); the compilation is not: with the constants compiled in, one program on pokec's 30.6 M edges took
about 10 s to compile, and a cell compiles several (``meta["jax_constants"]`` records which way a run went).
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # torch allocates on the same GPU
os.environ.setdefault("JAX_USE_SIMPLIFIED_JAXPR_CONSTANTS", "1")  # the graph's arrays as arguments, not constants

import argparse
import functools
import math
import sys
import time

import jax.numpy as jnp
import numpy as np
from peers import require_pyg, require_torch, torch_time

from blocksparse.bench import CellSkipped, Timer, check_close, run_cells
from blocksparse.bench import gnn_graphs as suite

GIB = 2**30
# PyG's peak per edge, in E x H x D (or E x F) tensors: one gathered copy for scatter (two with the backward);
# GATv2Conv's forward + backward held 25.1 GiB on 8,388,608 edges x 128 fp32 features (docs/benchmarks.md), about
# 6.2 such tensors; graph attention gathers k and v: taken as the same.
PYG_TENSORS = {"fwd": 1.0, "fwd+bwd": 2.0, "attention": 6.2}
SPMM = ("spmm_sum", "spmm_mean", "spmm_gcn")
PEERS = {**dict.fromkeys(SPMM, ("torch-csr", "pyg-scatter")), "max": ("pyg-scatter",), "min": ("pyg-scatter",),
         "gatv2": ("pyg-scatter",), "graph_attention": ("pyg-scatter",)}  # fmt: skip


def _scales(torch, case, src, dst):
    """The SpMM op's per-edge factor (``None``: 1), as its CSR values or PyG's message scale."""
    go = case.go
    inv = lambda d, p: torch.as_tensor(np.maximum(np.asarray(d), 1).astype(np.float32) ** -p, device="cuda")  # noqa: E731
    if case.op == "spmm_mean":
        return inv(go.in_degree, 1.0)[dst]
    if case.op == "spmm_gcn":
        return inv(go.out_degree, 0.5)[src] * inv(go.in_degree, 0.5)[dst]
    return None


_GRAPH: dict = {}  # the last graph's index arrays on the GPU: the cells of one graph share them


def _graph_tensors(torch, go):
    """``(src, dst, indptr)`` of graph ``go`` as int64 CUDA tensors, copied once per graph (ogbn-products' two edge
    arrays are 2 GB)."""
    if _GRAPH.get("graph") is not go:
        _GRAPH.clear()
        cuda = lambda a: torch.as_tensor(np.asarray(a), device="cuda").long()  # noqa: E731
        _GRAPH.update(graph=go, arrays=(cuda(go.indices), cuda(go.dst_sorted), cuda(go.indptr)))
    return _GRAPH["arrays"]


def _forward(torch, peer, case, src, dst, n):
    """``f(*operands) -> out`` of the peer on torch tensors."""
    op = case.op
    if peer == "torch-csr":
        indptr = _graph_tensors(torch, case.go)[2]
        w = _scales(torch, case, src, dst)
        dtype = torch.bfloat16 if case.dtype == "bfloat16" else torch.float32
        values = (torch.ones(case.go.num_edges, device="cuda") if w is None else w).to(dtype)
        A = torch.sparse_csr_tensor(indptr, src, values, size=(n, n))  # noqa: N806
        return lambda x: torch.sparse.mm(A, x)
    import torch.nn.functional as F  # noqa: N812
    from torch_geometric.utils import scatter, softmax

    if op in SPMM:
        w = _scales(torch, case, src, dst)
        reduce = "mean" if op == "spmm_mean" else "sum"
        if w is None or op == "spmm_mean":
            return lambda x: scatter(x[src], dst, 0, n, reduce=reduce)
        return lambda x: scatter(x[src] * w.to(x.dtype)[:, None], dst, 0, n, reduce="sum")
    if op in ("max", "min"):
        return lambda x: scatter(x[src], dst, 0, n, reduce=op)
    if op == "gatv2":

        def gat(xs, xd, att):
            xj = xs[src]
            a = softmax((F.leaky_relu(xj + xd[dst], 0.2) * att).sum(-1), dst, num_nodes=n)
            return scatter(a.unsqueeze(-1) * xj, dst, 0, n, reduce="sum")

        return gat

    def dot(q, k, v):
        a = softmax((q[dst] * k[src]).sum(-1) / math.sqrt(q.shape[-1]), dst, num_nodes=n)
        return scatter(a.unsqueeze(-1) * v[src], dst, 0, n, reduce="sum")

    return dot


def _pyg_bytes(case) -> float:
    e, f = case.go.num_edges, math.prod(case.args[0].shape[1:])
    per = PYG_TENSORS["attention"] if case.op in ("gatv2", "graph_attention") else PYG_TENSORS[case.pass_]
    return per * e * f * jnp.dtype(case.dtype).itemsize


def torch_peer(peer: str, iters: int, trials: int, pyg_mem_gib: float):
    """A ``peers=`` function of :func:`blocksparse.bench.gnn_graphs.suite` timing ``peer`` on a cell's case."""

    def run(case) -> dict:
        if peer not in PEERS[case.op]:
            return {}
        try:
            torch = require_torch()
            if peer == "pyg-scatter":
                require_pyg()
                if (need := _pyg_bytes(case)) > pyg_mem_gib * GIB:
                    raise CellSkipped(f"PyG would hold about {need / GIB:.0f} GiB per call (> {pyg_mem_gib:g} GiB)")
            return _measure(torch, peer, case, iters, trials)
        except CellSkipped as e:
            return {f"{peer}_skipped": str(e)}
        except Exception as e:  # noqa: BLE001 - a peer that fails (out of memory, a dtype cuSPARSE refuses) is recorded
            return {f"{peer}_skipped": " ".join(f"{type(e).__name__}: {e}".split())[:300]}
        finally:
            torch = sys.modules.get("torch")  # (None where torch is missing or its import was refused)
            if torch is not None and torch.cuda.is_initialized():
                torch.cuda.empty_cache()  # torch's cached blocks back to the device, for JAX's next cell

    return run


def _measure(torch, peer, case, iters, trials) -> dict:
    n, grad = case.go.num_nodes, case.pass_ == "fwd+bwd"
    src, dst, _ = _graph_tensors(torch, case.go)
    args = [torch.from_dlpack(a).clone() for a in case.args]
    ct = torch.from_dlpack(case.ct).clone()
    f = _forward(torch, peer, case, src, dst, n)
    if grad:
        for a in args:
            a.requires_grad_(True)

        def fn():
            for a in args:
                a.grad = None
            out = f(*args)
            out.backward(ct.reshape(out.shape))
            return [out, *(a.grad for a in args)]
    else:

        def fn():
            with torch.no_grad():
                return [f(*args)]

    got = [jnp.from_dlpack(t.detach().contiguous()) for t in fn()]
    out = {}
    try:
        out[f"{peer}_rel_err"] = max(check_close(g.reshape(w.shape), w, tol=float("inf"), what=peer)
                                     for g, w in zip(got, case.want, strict=True))  # fmt: skip
    except Exception as e:  # noqa: BLE001 - a peer off the reference is recorded, not a failure
        out[f"{peer}_check"] = f"{type(e).__name__}: {e}"
    t = torch_time(fn, iters=iters, trials=trials)
    out.update({f"{peer}_loop_ms": t["peer_ms"], f"{peer}_mem_bytes": t["peer_mem_bytes"]})
    return out


#: The peers a command may leave out of named cells (``--skip``): never ``bs.gnn`` or its backends.
SKIPPABLE = (*suite.PEERS, "torch-csr", "pyg-scatter")


def _jax_part(args, kw) -> str:  # suite.timed(timer, fn, arrays, budget_s, *, what, dtype, ...)
    return f"{kw['what']} in {jnp.dtype(kw['dtype']).name}"


def _torch_part(args, kw) -> str:  # _measure(torch, peer, case, iters, trials)
    peer, c = args[1], args[2]
    return f"{c.op} {c.pass_} on {c.graph_name} ({c.order}) [{peer}] in {jnp.dtype(c.dtype).name}"


_UNWATCHED: dict = {}  # the functions watch_parts wraps, as they were before it first did


def watch_parts(log=None, skip=()) -> set:
    """Name each part of a cell: the float32 reference, each JAX timing (``"gatv2 fwd+bwd on power-law (as
    generated) [segment] in float32"``), each torch peer (the same form). ``log``: a stream each part is written to as
    it starts and ends, with its seconds (where the time of a cell cut short by a command's limit went). ``skip``:
    parts of peers (:data:`SKIPPABLE`) not to run, by those names; each is recorded in its cell as
    ``{peer}_skipped`` saying so. It wraps the suite's ``reference`` and ``timed`` and this script's peers from
    outside (each call wraps the unwrapped ones again); what they compute is unchanged. Returns the set of the
    ``skip`` names that matched a part, filled as the cells run."""
    skip, used = set(skip), set()
    for part in skip:
        peer = part.rsplit("[", 1)[-1].split("]")[0] if "[" in part else None
        if peer not in SKIPPABLE:
            raise ValueError(f"expected a part of one of the peers {SKIPPABLE} to skip, as --log-parts names it "
                             f"('<op> <pass> on <graph> (<order>) [<peer>] in <dtype>'); got {part!r}")  # fmt: skip

    def wrap(fn, label, refuse=None):  # refuse: how a skipped part says so (the peers' parts only)
        @functools.wraps(fn)
        def run(*args, **kw):
            what = label(args, kw)
            if refuse is not None and what in skip:
                used.add(what)
                if log is not None:
                    print(f"[part] {what}: skipped (--skip)", file=log, flush=True)
                raise refuse(f"skipped by the command line (--skip {what!r})")
            t0 = time.perf_counter()
            if log is not None:
                print(f"[part] {what}: started", file=log, flush=True)
            try:
                return fn(*args, **kw)
            finally:
                if log is not None:
                    print(f"[part] {what}: {time.perf_counter() - t0:.1f} s", file=log, flush=True)

        return run

    # a JAX peer refusing (NotImplementedError) is recorded as "{peer}_skipped: refused: ..."; a torch peer's
    # CellSkipped as "{peer}_skipped: ..." (torch_peer)
    global _measure
    reference, timed, measure = _UNWATCHED.setdefault("fns", (suite.reference, suite.timed, _measure))
    suite.reference = wrap(reference, lambda a, kw: f"the float32 reference of {a[3]}")
    suite.timed = wrap(timed, _jax_part, NotImplementedError)
    _measure = wrap(measure, _torch_part, CellSkipped)
    return used


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    full = suite.SIZES["full"]
    p.add_argument("--graphs", nargs="+", default=None, choices=full["graphs"] + suite.LOCALITY_GRAPHS,
                   help="default: the full table's (--small: arxiv); or those with locality to recover")  # fmt: skip
    p.add_argument("--dtype", nargs="+", default=["float32"], choices=["float32", "bfloat16"])
    p.add_argument("--ops", nargs="+", default=list(suite.OPS), choices=suite.OPS)
    p.add_argument("--passes", nargs="+", default=list(suite.PASSES), choices=suite.PASSES)
    p.add_argument("--orders", nargs="*", default=None, choices=suite.ORDERS[1:],
                   help="reorderings after the graph as generated (default: none)")  # fmt: skip
    p.add_argument("--feat", type=int, default=128)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--pyg-mem-gib", type=float, default=60.0)
    p.add_argument("--scale", type=float, default=1.0, help="of every graph's nodes and edges")
    p.add_argument("--row-budget-s", type=float, default=suite.ROW_BUDGET_S,
                   help="fewer iterations for a JAX timing whose first call says it would take longer")  # fmt: skip
    p.add_argument("--rcm-max-edges", type=float, default=suite.RCM_MAX_EDGES,
                   help="no RCM or clusters order above")  # fmt: skip
    p.add_argument("--small", action="store_true", help="tiny graphs (CPU: the suite's cells; the peers skipped)")
    p.add_argument("--json", default=None)
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --json: its measured cells kept (same machine, code, timer)")  # fmt: skip
    p.add_argument("--stop-after-s", type=float, default=None, metavar="S",
                   help="start no cell that would end after S seconds (the longest so far as the guess)")  # fmt: skip
    p.add_argument("--log-parts", action="store_true", help="each part of a cell, started and its seconds, on stderr")
    p.add_argument("--resume-across", default=None, metavar="DIGEST",
                   help="with --resume: continue a JSON made by the library code of this digest (meta.source) "
                   "too, for a change reviewed as not touching what the cells measure")  # fmt: skip
    p.add_argument("--skip", action="append", default=[], metavar="PART",
                   help="a peer's part of a cell not to run, as --log-parts names it (repeatable)")  # fmt: skip
    a = p.parse_args(argv)
    if a.resume and not a.json:
        p.error("expected --json PATH with --resume; got none")
    if a.stop_after_s is not None and not 0 < a.stop_after_s < math.inf:
        p.error(f"expected --stop-after-s to be a positive number of seconds; got {a.stop_after_s}")
    if a.resume_across and not a.resume:
        p.error("expected --resume with --resume-across (it names the code of the run to continue); got none")
    used = None
    if a.log_parts or a.skip:
        try:
            used = watch_parts(sys.stderr if a.log_parts else None, a.skip)
        except ValueError as e:
            p.error(str(e))
    edges = None
    if a.small:
        a.feat, a.heads, a.iters, a.trials, edges = 16, 2, 2, 1, 3000
    a.graphs = a.graphs or (["ogbn-arxiv"] if a.small else list(full["graphs"]))
    orders = ("as generated", *(a.orders or ()))
    peers = [torch_peer(name, a.iters, a.trials, a.pyg_mem_gib) for name in ("torch-csr", "pyg-scatter")]
    todo = suite.suite(graphs=tuple(a.graphs), edges=edges, scale=a.scale, dtypes=tuple(a.dtype), orders=orders,
                       feat=a.feat, heads=a.heads, ops=tuple(a.ops), passes=tuple(a.passes), budget_s=a.row_budget_s,
                       rcm_max_edges=int(a.rcm_max_edges), peers=peers)  # fmt: skip
    meta = dict(script="benchmarks/bench_gnn_graphs.py", argv=list(sys.argv[1:] if argv is None else argv))
    if not a.small:  # what gnn_table prices each miss's bytes at (each command of a resumed run measures it)
        meta["copy_bytes_per_s"] = suite.measure_copy_rate()
    timer = Timer(iters=a.iters, trials=a.trials)
    rc = run_cells(todo, full=not a.small, json_path=a.json, timer=timer, meta=meta,
                   columns={"gnn-graphs": suite.COLUMNS}, resume=a.resume, stop_after_s=a.stop_after_s,
                   accept_source=a.resume_across)  # fmt: skip
    for part in sorted(set(a.skip) - (used or set())):
        print(f"--skip {part!r} matched no part of the cells this command ran", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
