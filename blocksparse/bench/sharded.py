"""The ``sharded`` suite: one block-sparse matrix, and one graph, on one device against all devices.

``matrix`` cell: ``W`` (``m x k``, ``b x b`` blocks at density ``d``) times ``x`` (``k x n``); metrics
``dense_1dev_*`` (``jnp.dot`` on device 0), ``sparse_1dev_*`` (``bs.matmul`` on device 0), the cell's own
``loop_ms`` / ``calls_ms``: :func:`blocksparse.shard` over every device with the split its byte estimate
chooses (``x`` replicated beforehand, as a model-parallel layer receives it), and each split forced
(``rows_lines_*``, ``rows_blocks_*``, ``cols_psum_*``, ``cols_psum_scatter_*``); the chosen plan
(``split``, ``collective``, ``estimated_bytes``, ``estimated_ms``, ``blocks_per_device``).

``graph`` cells (SpMM sum and max aggregation): a power-law graph (Zipf-like in-degrees, node ids
shuffled) of ``N`` nodes and ``E`` edges, ``F`` float32 features; ``dynamic_1dev_*`` (a prebuilt
:class:`~blocksparse.gnn.DynamicGraph` on device 0: the kernels each device runs when sharded), the cell's
own times: :func:`blocksparse.gnn.shard_graph` with the plan's choice (``x`` sharded by rows beforehand),
``local_only_*``: the same with its collectives replaced by local stand-ins of the same shapes (wrong values:
the work without the communication; ``collective_share`` = 1 - local only / the cell's time), and each other
candidate of the plan forced (``{balance}_{sources}_*``); the plan's choice and estimates.

Every result is checked against the one-device result; timings are :class:`~blocksparse.bench.Timer`'s
(``*_loop_ms``: one jitted loop, ``*_calls_ms``: back-to-back calls). With one device the cells are
skipped: run with several GPUs, or on a CPU with ``XLA_FLAGS=--xla_force_host_platform_device_count=4``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import blocksparse as bs
from blocksparse import sharding

from ._core import Cell, CellSkipped, Timer, measure, ratio, variant
from .matmul import density_label

SIZES = {
    # tests: one graph op (the other runs the same cell code; every op: quick and full)
    "tiny": dict(matrix=(128, 128, 32, 16, 1 / 4, "float32"), graph=(512, 4096, 8), graph_ops=("spmm_sum",)),
    "quick": dict(matrix=(512, 512, 128, 32, 1 / 8, "float32"), graph=(2048, 16_384, 16)),
    "full": dict(matrix=(32768, 32768, 8192, 64, 1 / 16, "bfloat16"), graph=(1 << 20, 1 << 25, 128)),
}

COLUMNS = (
    ("loop ms", "loop_ms", ".4g"),
    ("calls ms", "calls_ms", ".4g"),
    ("1 device ms", "one_device_loop_ms", ".4g"),
    ("x 1 device", "speedup_vs_one_device", ".3g"),
    ("est. ms", "estimated_ms", ".3g"),
    ("rel err", "rel_err", ".2g"),
)

#: The forced splits of the matrix cell: name -> :func:`blocksparse.shard` keywords.
SPLITS = {
    "rows_lines": dict(split="rows", balance="lines"),
    "rows_blocks": dict(split="rows", balance="blocks"),
    "cols_psum": dict(split="cols", collective="psum"),
    "cols_psum_scatter": dict(split="cols", collective="psum_scatter"),
}
#: The graph cells' ops: name -> the op (the same call on one device and on a sharded graph).
GRAPH_OPS = {
    "spmm_sum": lambda G, x: bs.gnn.spmm(G, x),
    "aggregate_max": lambda G, x: bs.gnn.aggregate(G, x, "max"),
}
#: The same ops with the collectives replaced by local stand-ins of the same shapes (wrong values: the work
#: without the communication), for ``collective_share``.
LOCAL_ONLY = {
    "spmm_sum": lambda sg, x: sharding.spmm(sg, x, _skip_collectives=True),
    "aggregate_max": lambda sg, x: sharding.aggregate(sg, x, "max", _skip_collectives=True),
}


def cells(*, full: bool) -> list[Cell]:
    return suite(**SIZES["full" if full else "quick"])


def suite(*, matrix, graph, graph_ops=None, seed: int = 0) -> list[Cell]:
    """``graph_ops``: the graph cells' ops among :data:`GRAPH_OPS` (``None``: every one)."""
    m, k, n, b, d, dtype = matrix
    nodes, edges, feat = graph
    out = [
        Cell("sharded", f"matrix {m}x{k} b={b} d={density_label(d)} n={n}",
             dict(kind="matrix", m=m, k=k, n=n, b=b, density=d, dtype=dtype), _matrix(m, k, n, b, d, dtype, seed))
    ]  # fmt: skip
    edges_of = functools.cache(lambda: bs.gnn.power_law(nodes, edges, seed=seed))
    for op in graph_ops or GRAPH_OPS:
        params = dict(kind="graph", op=op, nodes=nodes, edges=edges, feat=feat, dtype="float32", graph="power_law")
        out.append(Cell("sharded", f"graph {op} N={nodes} E={edges}", params, _graph(op, edges_of, feat, seed)))
    return out


def _mesh() -> Mesh:
    devices = jax.devices()
    if len(devices) < 2:
        raise CellSkipped(
            f"needs 2 or more devices; got {len(devices)} "
            "(on a CPU: XLA_FLAGS=--xla_force_host_platform_device_count=4)"
        )
    return Mesh(np.array(devices), ("d",))


def _matrix(m, k, n, b, d, dtype, seed):
    def run(timer: Timer) -> dict:
        mesh = _mesh()
        dtype_ = jnp.dtype(dtype)
        one = jax.devices()[0]
        W = bs.random(jax.random.key(seed), (m, k), b, d, dtype_)
        x = jax.random.normal(jax.random.key(seed + 1), (k, n), dtype_)
        W1, x1 = jax.device_put(W, one), jax.device_put(x, one)
        dense = jax.device_put(W.to_dense(), one)
        x_rep = jax.device_put(x, NamedSharding(mesh, P()))
        with jax.default_matmul_precision("highest"):
            want = jnp.dot(dense.astype(jnp.float32), x1.astype(jnp.float32))
        check = dict(want=want, dtype=dtype_)
        product = lambda A, x: A @ x  # noqa: E731
        Ws = bs.shard(W, mesh, "d")
        out = measure(timer, product, Ws, x_rep, what="sharded W @ x", **check)
        out.update(variant(timer, "dense_1dev", jnp.dot, dense, x1, **check))
        out.update(variant(timer, "sparse_1dev", product, W1, x1, **check))
        for name, kw in SPLITS.items():
            if kw.get("collective") == "psum_scatter" and m % len(mesh.devices.flat):
                out[f"{name}_skipped"] = f"psum_scatter needs the devices to divide m={m}"
                continue
            out.update(variant(timer, name, product, bs.shard(W, mesh, "d", **kw), x_rep, **check))
        p = Ws.plan
        out.update(devices=len(mesh.devices.flat), split=p.split, collective=p.collective,
                   estimated_bytes=p.bytes_for(n), estimated_ms=1e3 * p.seconds_for(n),
                   blocks_per_device=list(p.blocks_per_device), nnz_blocks=W.nnz_blocks,
                   one_device_loop_ms=out.get("sparse_1dev_loop_ms"))  # fmt: skip
        ratio(out, "sparse_1dev_loop_ms", "loop_ms", "speedup_vs_one_device")
        ratio(out, "sparse_1dev_calls_ms", "calls_ms", "speedup_calls_vs_one_device")
        ratio(out, "dense_1dev_loop_ms", "loop_ms", "speedup_vs_dense_one_device")
        return out

    return run


def _graph(op, graph_of, feat, seed):
    def run(timer: Timer) -> dict:
        mesh = _mesh()
        g = graph_of()
        n = g.num_nodes
        one = jax.devices()[0]
        fn = GRAPH_OPS[op]
        edge_index = np.stack([np.asarray(g.src), np.asarray(g.dst)])
        x = jax.device_put(jax.random.normal(jax.random.key(seed), (n, feat), jnp.float32), one)
        build = jax.jit(lambda e: bs.gnn.DynamicGraph.from_edge_index(e, num_nodes=n))
        dg = build(jax.device_put(edge_index.astype(np.int32), one))
        out = variant(timer, "dynamic_1dev", fn, dg, x)
        want = jax.jit(fn)(dg, x)
        xs = jax.device_put(x, NamedSharding(mesh, P("d")))
        sg = bs.gnn.shard_graph(edge_index, n, mesh, "d")
        out.update(measure(timer, fn, sg, xs, want=want, dtype=jnp.float32, what=f"sharded {op}"))
        out.update(variant(timer, "local_only", LOCAL_ONLY[op], sg, xs))  # not checked: the values are wrong
        if out.get("local_only_loop_ms"):
            out["collective_share"] = 1 - out["local_only_loop_ms"] / out["loop_ms"]
        plan = sg.plan
        out.update(devices=len(mesh.devices.flat), balance=plan.balance, sources=plan.sources,
                   edges_per_device=list(plan.edges_per_device), estimated_bytes=plan.bytes_for(feat),
                   estimated_ms=1e3 * plan.seconds_for(feat),
                   one_device_loop_ms=out.get("dynamic_1dev_loop_ms"))  # fmt: skip
        for c in plan.candidates:
            if (c.balance, c.sources) == (plan.balance, plan.sources):
                continue
            name = f"{c.balance}_{c.sources}"
            other = bs.gnn.shard_graph(edge_index, n, mesh, "d", balance=c.balance, sources=c.sources)
            out.update(variant(timer, name, fn, other, xs, want=want, dtype=jnp.float32))
            out[f"{name}_estimated_ms"] = 1e3 * c.seconds * feat
        ratio(out, "dynamic_1dev_loop_ms", "loop_ms", "speedup_vs_one_device")
        ratio(out, "dynamic_1dev_calls_ms", "calls_ms", "speedup_calls_vs_one_device")
        return out

    return run
