"""Where the max aggregation's forward + backward spends its time, piece by piece, on a suite graph (GPU).

(min runs the same kernels and backward with the comparison reversed.)

On each graph of the ``gnn-graphs`` suite named (``pokec``, ``power-law``, ...; F = 128 features, seed 0), in
float32 and bfloat16, the Pallas max kernel's pieces are timed apart, each as :meth:`blocksparse.bench.Timer.loop`
(device time in one jitted loop) and :meth:`~blocksparse.bench.Timer.calls` (back-to-back jitted calls):

- ``fwd values``: the forward alone (what ``aggregate`` runs outside ``jax.grad``);
- ``fwd with arg``: the forward that also returns each (node, feature)'s arg-max edge (what ``jax.grad`` runs);
- ``bwd``: the backward as the op runs it: the source of each winning edge (``g.indices[arg]``), the float32
  scatter-add of the cotangents into those rows, the cast to the features' dtype;
- ``gather src``: ``g.indices[arg]`` alone;
- ``bwd from src``: the backward given the sources (no gather), as a flat segment sum;
- ``bwd 2-d scatter``: the same as ``.at[rows, cols].add``;
- ``vjp``: ``jax.vjp`` of ``bs.gnn.aggregate`` (forward and backward, the default backend).

The three backward forms are checked against each other first (float32 sums in any order: a relative tolerance).
Needs a GPU.

Usage (on the GPU machine)::

    PYTHONPATH=. python benchmarks/profile_gnn_backward.py --graphs pokec power-law --json $OUT/backward.json
"""

from __future__ import annotations

import argparse
import sys
import time


def _pieces(g, f: int):
    """The timed functions of one graph: name -> (fn, which arguments of ``(g, x, arg, src, ct)`` it takes)."""
    import jax
    import jax.numpy as jnp

    import blocksparse as bs
    from blocksparse.ops.gnn import registry
    from blocksparse.ops.gnn.aggregate import api

    n = g.num_nodes
    kernel = registry.module("aggregate", "pallas").segment_extreme
    static = api.AggregateStatic(("pallas",), True)

    def bwd_src(src, ct):
        flat = jnp.where(src >= 0, src * f + jnp.arange(f, dtype=jnp.int32)[None, :], n * f)
        dx = jax.ops.segment_sum(ct.reshape(-1).astype(jnp.float32), flat.reshape(-1), n * f + 1)[: n * f]
        return dx.reshape(n, f).astype(ct.dtype)

    def bwd_2d(src, ct):
        rows = jnp.where(src >= 0, src, n)
        cols = jnp.broadcast_to(jnp.arange(f, dtype=jnp.int32)[None, :], rows.shape)
        dx = jnp.zeros((n + 1, f), jnp.float32).at[rows, cols].add(ct.astype(jnp.float32), mode="drop")
        return dx[:n].astype(ct.dtype)

    return {
        "fwd values": (lambda g, x: kernel(g, x, True, with_arg=False)[0], ("g", "x")),
        "fwd with arg": (lambda g, x: kernel(g, x, True, with_arg=True), ("g", "x")),
        "bwd": (lambda g, x, arg, ct: api._backward(static, (g, x), arg, ct)[1], ("g", "x", "arg", "ct")),
        "gather src": (lambda g, arg: jnp.where(arg >= 0, jnp.asarray(g.indices)[jnp.maximum(arg, 0)], -1),
                       ("g", "arg")),
        "bwd from src": (bwd_src, ("src", "ct")),
        "bwd 2-d scatter": (bwd_2d, ("src", "ct")),
        "vjp": (lambda g, x, ct: jax.vjp(lambda x: bs.gnn.aggregate(g, x, "max"), x)[1](ct)[0], ("g", "x", "ct")),
    }  # fmt: skip


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--graphs", nargs="+", default=["pokec", "power-law"], help="gnn-graphs suite graphs")
    ap.add_argument("--feat", type=int, default=128, help="features per node")
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--iters", type=int, default=10, help="calls per timed loop")
    ap.add_argument("--trials", type=int, default=3, help="timed loops (the median is reported)")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)

    import jax
    import numpy as np

    from blocksparse import hardware
    from blocksparse.bench import Timer, write_json
    from blocksparse.bench import gnn_graphs as suite

    if not hardware.current().is_gpu:
        print(f"needs a GPU (default device: {hardware.current().platform})", file=sys.stderr)
        return 2
    timer = Timer(iters=args.iters, trials=args.trials)
    dev = jax.devices()[0]
    rows = []
    for name in args.graphs:
        t0 = time.perf_counter()
        g = suite.graph(name)
        print(f"{name}: {g.num_nodes:,} nodes, {g.num_edges:,} edges (built in {time.perf_counter() - t0:.1f} s)")
        pieces = _pieces(g, args.feat)
        for dtype in args.dtypes:
            x = jax.random.normal(jax.random.key(0), (g.num_nodes, args.feat)).astype(dtype)
            ct = jax.random.normal(jax.random.key(1), (g.num_nodes, args.feat)).astype(dtype)
            _, arg = jax.jit(pieces["fwd with arg"][0])(g, x)
            src = jax.jit(pieces["gather src"][0])(g, arg)
            have = dict(g=g, x=x, arg=arg, src=src, ct=ct)
            got = [np.asarray(jax.jit(pieces[k][0])(*(have[a] for a in pieces[k][1])), np.float32)
                   for k in ("bwd", "bwd from src", "bwd 2-d scatter")]  # fmt: skip
            for other in got[1:]:  # float32 adds in another order: equal up to rounding
                np.testing.assert_allclose(other, got[0], rtol=2e-2, atol=1e-3)
            for piece, (fn, names) in pieces.items():
                operands = [have[a] for a in names]
                loop, calls = timer.loop(fn, *operands), timer.calls(fn, *operands)
                rows.append(dict(graph=name, dtype=dtype, feat=args.feat, piece=piece, loop_ms=loop, calls_ms=calls))
                print(f"{name} {dtype:9s} {piece:16s} loop {loop:8.3f} ms  calls {calls:8.3f} ms", flush=True)
                if args.json:  # after every row: a run cut short keeps what it measured
                    doc = {"device": getattr(dev, "device_kind", str(dev)), "jax": jax.__version__,
                           "timer": repr(timer), "rows": rows}  # fmt: skip
                    write_json(args.json, doc)
            del x, ct, arg, src, have
    return 0


if __name__ == "__main__":
    sys.exit(main())
