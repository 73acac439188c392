# ruff: noqa: E402 - XLA's allocator setting must precede importing JAX
"""The GNN ops against torch and PyG on one power-law graph, in one process.

    PYTHONPATH=. python benchmarks/bench_gnn.py [--nodes N --edges E --feat F --heads 8 1] [--dtype float32 bfloat16]
        [--ops spmm_sum max gatv2 transformer] [--json out.json] [--small]

The run is the ``gnn`` suite's cells on this graph (:func:`blocksparse.bench.gnn.suite`: each op against the JAX
segment-op reference, timed with :class:`blocksparse.bench.Timer`), then one cell per (dtype, op, peer, mode):

- ``spmm_sum``: ``torch.sparse.mm`` on a CSR tensor (cuSPARSE), ``index_add_``, and cuSPARSE through
  ``jax.experimental.sparse`` (float32 only);
- ``max``: ``scatter_reduce_("amax")`` forward and forward + backward, PyG's ``scatter(reduce="max")``;
- ``gatv2`` / ``transformer`` with ``H`` heads: PyG's ``GATv2Conv`` / ``TransformerConv`` forward and
  forward + backward, against ``bs.gnn.gatv2`` / ``graph_attention`` with the same linear projections.

Each peer cell measures ours on the same inputs (``loop_ms`` / ``calls_ms`` / ``implementation``, checked
against the segment-op reference), the peer (``peer_ms`` and ``peer_mem_bytes`` from :func:`peers.torch_time`;
``ours_mem_bytes``: the compiled program's temporaries and output), ``speedup_vs_peer`` = peer time / ours and
``memory_vs_peer`` = peer memory / ours. :data:`TARGETS` are the ratios the study set (met or not: ``target``
and ``target_met``). Without torch, PyG or a CUDA device the peer cells are skipped with the reason.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # torch allocates on the same GPU

import argparse
import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np
from peers import require_pyg, require_torch, torch_time

import blocksparse as bs
from blocksparse.bench import Cell, CellSkipped, Timer, measure, ratio, run_cells
from blocksparse.bench import gnn as suite

SUITE = "gnn-peers"
OPS = ("spmm_sum", "max", "gatv2", "transformer")
#: (op, heads, mode, peer) -> the speedup over the peer the study set (None: reported only).
TARGETS = {("spmm_sum", None, "fwd", "torch-csr"): 1.25, ("gatv2", 1, "fwd+bwd", "pyg"): 8.0,
           ("gatv2", 8, "fwd+bwd", "pyg"): 13.0}  # fmt: skip
COLUMNS = (("loop ms", "loop_ms", ".4g"), ("calls ms", "calls_ms", ".4g"), ("peer ms", "peer_ms", ".4g"),
           ("x peer", "speedup_vs_peer", ".3g"), ("memory x peer", "memory_vs_peer", ".3g"),
           ("rel err", "rel_err", ".2g"))  # fmt: skip


class Problem:
    """The graph, the features per dtype, and their torch copies (built on first use)."""

    def __init__(self, nodes, edges, feat, seed=0):
        self.nodes, self.edges, self.feat, self.seed = nodes, edges, feat, seed

    @functools.cached_property
    def graph(self):
        return bs.gnn.power_law(self.nodes, self.edges, seed=self.seed)

    @functools.cache  # noqa: B019 - one problem per run
    def x(self, dtype):
        return jax.random.normal(jax.random.key(self.seed), (self.nodes, self.feat), jnp.float32).astype(dtype)


def _memory(fn, *args) -> int | None:
    try:
        ma = jax.jit(fn).lower(*args).compile().memory_analysis()
        return int(ma.temp_size_in_bytes + ma.output_size_in_bytes)
    except Exception:  # noqa: BLE001 - not every backend reports it
        return None


def _finish(out, key):
    ratio(out, "peer_ms", "loop_ms", "speedup_vs_peer")
    ratio(out, "peer_mem_bytes", "ours_mem_bytes", "memory_vs_peer")
    if key in TARGETS and "speedup_vs_peer" in out:
        out.update(target=TARGETS[key], target_met=bool(out["speedup_vs_peer"] >= TARGETS[key]))
    return out


def _ours(timer, fn, args, want, dtype, what):
    out = measure(timer, fn, *args, want=want, dtype=dtype, tol=None if dtype == jnp.float32 else 0.05, what=what)
    out["ours_mem_bytes"] = _memory(fn, *args)
    return out


def aggregation_cell(problem, op, peer, mode, dtype, iters, trials) -> Cell:
    """SpMM sum or max: ours (``bs.gnn``) against one peer."""

    def run(timer: Timer) -> dict:
        if peer == "jax-bcsr-cusparse":
            if jax.default_backend() != "gpu" or dtype != "float32":
                raise CellSkipped("cuSPARSE through jax.experimental.sparse: float32 on a GPU only")
            torch = None
        else:
            torch = require_torch()
        if peer == "pyg-scatter":
            require_pyg()
        g, x = problem.graph, problem.x(dtype)
        n, f = g.num_nodes, problem.feat
        src, dst = jnp.asarray(np.asarray(g.src)), jnp.asarray(np.asarray(g.dst))
        refs = suite.references(src, dst, n)
        ct = jax.random.normal(jax.random.key(1), x.shape, jnp.float32).astype(dtype)
        if op == "spmm_sum":
            fn, ref = (lambda x: bs.gnn.spmm(g, x)), refs["spmm_sum"]
        else:
            fn, ref = (lambda x: bs.gnn.aggregate(g, x, "max")), refs["aggregate_max"]
        if mode == "fwd+bwd":
            fwd, ref_fwd = fn, ref
            fn = lambda x: jax.value_and_grad(lambda x: jnp.sum((fwd(x) * ct).astype(jnp.float32)))(x)  # noqa: E731
            ref = lambda x: jax.value_and_grad(lambda x: jnp.sum((ref_fwd(x) * ct).astype(jnp.float32)))(x)  # noqa: E731
        with jax.default_matmul_precision("highest"):
            want = jax.jit(ref)(x.astype(jnp.float32))
        out = _ours(timer, fn, (x,), want, jnp.dtype(dtype), f"{op} {mode}")
        if peer == "jax-bcsr-cusparse":  # a JAX peer, timed as ours are
            from jax.experimental import sparse

            jax.config.update("jax_bcoo_cusparse_lowering", True)
            csr = (jnp.ones(g.num_edges, x.dtype), jnp.asarray(g.indices), jnp.asarray(g.indptr))
            peer_fn = lambda x, d, i, p: sparse.BCSR((d, i, p), shape=(n, n)) @ x  # noqa: E731
            out.update(peer_ms=timer.loop(peer_fn, x, *csr), peer_mem_bytes=_memory(peer_fn, x, *csr))
            return _finish(out, (op, None, mode, peer))
        xt = torch.from_dlpack(x).clone()
        ts, td = (torch.as_tensor(np.asarray(a), device="cuda").long() for a in (g.src, g.dst))
        if peer == "torch-csr":
            indptr, indices = (torch.as_tensor(np.asarray(a), device="cuda").long() for a in (g.indptr, g.indices))
            A = torch.sparse_csr_tensor(indptr, indices, torch.ones(g.num_edges, device="cuda", dtype=xt.dtype), (n, n))
            call = lambda: torch.sparse.mm(A, xt)  # noqa: E731
        elif peer == "torch-index_add":
            call = lambda: torch.zeros_like(xt).index_add_(0, td, xt[ts])  # noqa: E731
        elif peer == "torch-scatter_reduce":
            idx = td[:, None].expand(-1, f)
            if mode == "fwd":
                call = lambda: torch.zeros_like(xt).scatter_reduce_(0, idx, xt[ts], "amax", include_self=False)  # noqa: E731
            else:
                xr, ctt = xt.clone().requires_grad_(True), torch.from_dlpack(ct).clone()

                def call():
                    torch.zeros_like(xr).scatter_reduce(0, idx, xr[ts], "amax", include_self=False).backward(ctt)
        else:  # pyg-scatter
            from torch_geometric.utils import scatter

            call = lambda: scatter(xt[ts], td, 0, n, reduce="max")  # noqa: E731
        out.update(torch_time(call, iters=iters, trials=trials))
        return _finish(out, (op, None, mode, peer))

    params = dict(op=op, peer=peer, mode=mode, dtype=dtype, nodes=problem.nodes, edges=problem.edges, feat=problem.feat)
    return Cell(SUITE, f"{dtype} {op} {mode} vs {peer}", params, run)


def attention_cell(problem, op, heads, mode, dtype, iters, trials) -> Cell:
    """GATv2 or the graph transformer with linear projections: ours against PyG's layer."""

    def run(timer: Timer) -> dict:
        torch = require_torch()
        require_pyg()
        from torch_geometric.nn import GATv2Conv, TransformerConv

        g, x = problem.graph, problem.x(dtype)
        n, f, h = g.num_nodes, problem.feat, heads
        d = f // h
        layer = (GATv2Conv(f, d, heads=h, add_self_loops=False, share_weights=False) if op == "gatv2"
                 else TransformerConv(f, d, heads=h, root_weight=False)).to("cuda", getattr(torch, dtype))  # fmt: skip
        ks = jax.random.split(jax.random.key(h), 4)
        ws = tuple((jax.random.normal(k, (f, f)) / f**0.5).astype(dtype) for k in ks[:3])
        att = jax.random.normal(ks[3], (h, d)).astype(dtype)
        cth = jax.random.normal(jax.random.key(7), (n, h, d)).astype(dtype)

        def ours(x, w1, w2, w3, att, impl=None):
            q, k, v = ((x @ w).reshape(n, h, d) for w in (w1, w2, w3))
            if op == "gatv2":
                return bs.gnn.gatv2(g, q, k, att, implementation=impl)
            return bs.gnn.graph_attention(g, q, k, v, implementation=impl)

        fn = ours
        if mode == "fwd+bwd":
            fn = jax.value_and_grad(lambda *a: jnp.sum((ours(*a) * cth).astype(jnp.float32)), argnums=(0, 1, 2, 3))
        args = (x, *ws, att)
        ref = functools.partial(ours, impl="xla") if mode == "fwd" else jax.value_and_grad(
            lambda *a: jnp.sum((ours(*a, impl="xla") * cth).astype(jnp.float32)), argnums=(0, 1, 2, 3))  # fmt: skip
        with jax.default_matmul_precision("highest"):
            want = jax.jit(ref)(*(a.astype(jnp.float32) for a in args))
        out = _ours(timer, fn, args, want, jnp.dtype(dtype), f"{op} H={h} {mode}")
        xt = torch.from_dlpack(x).clone()
        ei = torch.stack([torch.as_tensor(np.asarray(a), device="cuda").long() for a in (g.src, g.dst)])
        if mode == "fwd":

            def call():
                with torch.no_grad():
                    layer(xt, ei)
        else:
            xr, ctt = xt.clone().requires_grad_(True), torch.from_dlpack(cth.reshape(n, h * d)).clone()

            def call():
                layer(xr, ei).backward(ctt)

        out.update(torch_time(call, iters=iters, trials=trials))
        return _finish(out, (op, h, mode, "pyg"))

    params = dict(op=op, heads=heads, peer="pyg", mode=mode, dtype=dtype, nodes=problem.nodes, edges=problem.edges,
                  feat=problem.feat)  # fmt: skip
    return Cell(SUITE, f"{dtype} {op} H={heads} {mode} vs pyg", params, run)


PEERS = {
    "spmm_sum": (("torch-csr", "fwd"), ("torch-index_add", "fwd"), ("jax-bcsr-cusparse", "fwd")),
    "max": (("torch-scatter_reduce", "fwd"), ("torch-scatter_reduce", "fwd+bwd"), ("pyg-scatter", "fwd")),
}


def cells(nodes, edges, feat, heads, dtypes, ops, iters, trials) -> list[Cell]:
    out = suite.suite(nodes=nodes, edges=edges, feat=feat, heads=heads[0])
    problem = Problem(nodes, edges, feat)
    for dtype in dtypes:
        for op in ops:
            for peer, mode in PEERS.get(op, ()):
                out.append(aggregation_cell(problem, op, peer, mode, dtype, iters, trials))
            if op in ("gatv2", "transformer"):
                for h in heads:
                    for mode in ("fwd", "fwd+bwd"):
                        out.append(attention_cell(problem, op, h, mode, dtype, iters, trials))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=262_144)
    p.add_argument("--edges", type=int, default=8_388_608)
    p.add_argument("--feat", type=int, default=128)
    p.add_argument("--heads", type=int, nargs="+", default=[8, 1])
    p.add_argument("--dtype", nargs="+", choices=["float32", "bfloat16"], default=["float32"])
    p.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS))
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--small", action="store_true", help="a tiny graph (CPU: the suite's cells; the peers skipped)")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    if a.small:
        a.nodes, a.edges, a.feat, a.iters, a.trials = 256, 2048, 16, 2, 1
    todo = cells(a.nodes, a.edges, a.feat, a.heads, list(dict.fromkeys(a.dtype)), a.ops, a.iters, a.trials)
    meta = dict(script="benchmarks/bench_gnn.py", argv=list(sys.argv[1:] if argv is None else argv))
    timer = Timer(iters=a.iters, trials=a.trials)
    return run_cells(todo, full=not a.small, json_path=a.json, timer=timer, meta=meta,
                     columns={"gnn": suite.COLUMNS, SUITE: COLUMNS})  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
