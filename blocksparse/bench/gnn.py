"""The ``gnn`` suite: the GNN ops against plain JAX segment ops on a synthetic power-law graph.

Each cell runs one op of :mod:`blocksparse.gnn` (the fastest implementation available: Pallas on a
GPU, XLA elsewhere) and the same computation written with ``jax.ops.segment_*`` over the edge list
(the pure-JAX reference every GNN library in JAX writes), checks that they agree, and times both
with :meth:`~blocksparse.bench.Timer.loop`; ``speedup_vs_reference`` is reference time / op time.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

import blocksparse as bs

from ._core import Cell, Timer, check_close, implementation

#: Named sizes: ``tiny`` for tests, ``quick`` for the CPU default, ``full`` for the GPU figures
#: (the graph of docs/benchmarks.md: 262,144 nodes, 8,388,608 edges).
SIZES = {
    "tiny": dict(nodes=256, edges=2048, feat=16, heads=2),
    "quick": dict(nodes=4096, edges=65_536, feat=64, heads=4),
    "full": dict(nodes=262_144, edges=8_388_608, feat=128, heads=8),
}

COLUMNS = (
    ("op ms", "loop_ms", ".4g"),
    ("calls ms", "calls_ms", ".4g"),
    ("reference ms", "reference_ms", ".4g"),
    ("x reference", "speedup_vs_reference", ".3g"),
    ("GB/s", "gbps", ".3g"),
    ("rel err", "rel_err", ".2g"),
)

OPS = ("spmm_sum", "spmm_mean", "aggregate_max", "gatv2", "graph_attention")


def cells(*, full: bool) -> list[Cell]:
    return suite(**SIZES["full" if full else "quick"])


def suite(*, nodes: int, edges: int, feat: int, heads: int, seed: int = 0) -> list[Cell]:
    graph = functools.cache(lambda: bs.gnn.power_law(nodes, edges, seed=seed))  # built once, by the first cell
    params = dict(nodes=nodes, edges=edges, feat=feat, heads=heads, graph="power_law", dtype="float32")
    return [Cell("gnn", op, dict(params, op=op), _run(op, graph, params, seed)) for op in OPS]


# -- the pure-JAX references: segment ops over the edge list ----------------------------------------
def _segment_softmax_sum(logits, vals, dst, n):
    """``out[i] = sum_{e -> i} softmax_e(logits) vals[e]`` per head: logits ``(E, H)``, vals ``(E, H, D)``."""
    top = jax.ops.segment_max(logits, dst, n)
    a = jnp.exp(logits - top[dst])
    den = jax.ops.segment_sum(a, dst, n)
    alpha = a / den[dst]
    return jax.ops.segment_sum(alpha[..., None] * vals, dst, n)


def references(src, dst, n):
    """The pure-JAX segment-op references of the suite's ops, by name, for the edges ``src -> dst`` of ``n`` nodes."""
    indeg = jax.ops.segment_sum(jnp.ones_like(dst, jnp.float32), dst, n)

    def spmm_sum(x):
        return jax.ops.segment_sum(x[src], dst, n)

    def spmm_mean(x):
        return spmm_sum(x) / jnp.maximum(indeg, 1)[:, None]

    def aggregate_max(x):
        return jnp.where(indeg[:, None] > 0, jax.ops.segment_max(x[src], dst, n), 0)

    def gatv2(xs, xd, att):
        z = xs[src] + xd[dst]
        e = jnp.sum(jnp.where(z > 0, z, 0.2 * z) * att, -1)
        return _segment_softmax_sum(e, xs[src], dst, n)

    def graph_attention(q, k, v):
        e = jnp.sum(q[dst] * k[src], -1) / jnp.sqrt(q.shape[-1]).astype(q.dtype)
        return _segment_softmax_sum(e, v[src], dst, n)

    return dict(spmm_sum=spmm_sum, spmm_mean=spmm_mean, aggregate_max=aggregate_max, gatv2=gatv2,
                graph_attention=graph_attention)  # fmt: skip


def _ops(g):
    return dict(
        spmm_sum=lambda x: bs.gnn.spmm(g, x),
        spmm_mean=lambda x: bs.gnn.spmm(g, x, "mean"),
        aggregate_max=lambda x: bs.gnn.aggregate(g, x, "max"),
        gatv2=lambda xs, xd, att: bs.gnn.gatv2(g, xs, xd, att),
        graph_attention=lambda q, k, v: bs.gnn.graph_attention(g, q, k, v),
    )


def _inputs(op, n, feat, heads, seed):
    keys = jax.random.split(jax.random.key(seed + 3), 3)
    if op in ("spmm_sum", "spmm_mean", "aggregate_max"):
        return (jax.random.normal(keys[0], (n, feat), jnp.float32),)
    d = feat // heads
    if op == "gatv2":
        xs, xd = (jax.random.normal(k, (n, heads, d), jnp.float32) for k in keys[:2])
        return xs, xd, jax.random.normal(keys[2], (heads, d), jnp.float32)
    return tuple(jax.random.normal(k, (n, heads, d), jnp.float32) for k in keys)


def _run(op, graph, params, seed):
    def run(timer: Timer) -> dict:
        g = graph()
        n, feat, heads = params["nodes"], params["feat"], params["heads"]
        src, dst = jnp.asarray(np.asarray(g.src)), jnp.asarray(np.asarray(g.dst))
        fn, ref = _ops(g)[op], references(src, dst, n)[op]
        args = _inputs(op, n, feat, heads, seed)
        with bs.dispatch_log() as log:
            y = jax.jit(fn)(*args)
        with jax.default_matmul_precision("highest"):
            want = jax.jit(ref)(*args)
        err = check_close(y, want, dtype=jnp.float32, what=op)
        loop = timer.loop(fn, *args)
        calls = timer.calls(fn, *args)
        ref_ms = timer.loop(ref, *args)
        # Bytes every implementation must move at least once: inputs, output, and the CSR (int32).
        moved = sum(a.nbytes for a in args) + y.nbytes + 4 * (g.num_edges + g.num_nodes + 1)
        return dict(
            loop_ms=loop, calls_ms=calls, reference_ms=ref_ms, speedup_vs_reference=ref_ms / loop,
            gbps=moved / loop / 1e6, rel_err=err, implementation=implementation(log), graph=repr(g),
        )  # fmt: skip

    return run
