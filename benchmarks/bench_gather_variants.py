"""Opt-in gather variants (``GatherVariant``) of the SpMM sum and max kernels, timed against the defaults and XLA.

    python benchmarks/bench_gather_variants.py --json out.json [--ops spmm max] [--dtypes float32 bfloat16]
        [--variants NAME ...] [--features 128] [--iters 10] [--with-arg] [--small]

Graph: ``gnn.power_law(262144, 8388608)`` (mean in-degree 32, heavy nodes split into chunks); ``x`` of
``(N, 128)`` in each dtype. For each op, dtype and variant (see :data:`SPMM` / :data:`MAX` /
:data:`MAX_WITH_ARG`: a name -> ``(nodes_per_program, GatherVariant)``), the Pallas kernel is timed with
``blocksparse.bench.Timer``: ``ms`` = ``Timer.loop`` (median device time per call inside one jitted loop),
``calls_ms`` = ``Timer.calls``; plus the XLA reference (``variant = "xla"``: ``segment_sum`` / ``segment_max``
on the sorted destination ids) as a baseline. SpMM is ``csr_sum(g, None, x)`` (default: the one-node kernel,
``blocksparse.ops.gnn.order.spmm_variant``); max is ``segment_extreme(g, x, True, with_arg=False)``
(default: ``order.aggregate_variant(dtype, False)``, per dtype). ``--with-arg`` sweeps the arg-max path instead
(``with_arg=True``, the forward that training runs), with its own rows (:data:`MAX_WITH_ARG`: warps, prefetch,
nodes per program, pairs, byte-sized tiles; ``key_reduce`` does not apply there); its ``default`` is that
path's default (``order.aggregate_variant(dtype, True)``: the packed kernel with one warp, 2 nodes per program
at this mean in-degree). Every
result is checked against the reference: SpMM by ``rel_err`` (relative Frobenius error, failing above
``blocksparse.bench.tolerance``), max by exact equality (``exact``: values, and with ``--with-arg`` the
arg-max positions). ``speedup`` = the default variant's ``ms`` / this row's; ``gather_tbps`` = the bytes of
gathered rows (``E * F * itemsize``) / ``ms``. A row whose kernel is the same as an earlier row's (knobs that
do not apply: ``pairs`` and ``tile_bytes`` in float32, ``key_reduce`` with the arg-max, ``prefetch`` in the
one-node max kernel) is skipped (listed under ``skipped``). The JSON is rewritten after every row; a failure
makes the exit status 1.

``--small`` runs a tiny graph in the Pallas interpreter on the CPU, in seconds: the test of this script.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
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
from blocksparse.ops.gnn.aggregate import pallas_triton as AK
from blocksparse.ops.gnn.aggregate import reference as AR
from blocksparse.ops.gnn.config import GatherVariant as V
from blocksparse.ops.gnn.spmm import pallas_triton as SK
from blocksparse.ops.gnn.spmm import reference as SR

#: SpMM rows: name -> (nodes_per_program, variant); ``None`` nodes: the one-node kernel (the default).
SPMM = {
    "default": (None, None),
    "pairs": (None, V(pairs=True)),
    "bytes": (None, V(tile_bytes=True)),
    "prefetch": (None, V(prefetch=True)),
    "w2": (None, V(num_warps=2)),
    "w1": (None, V(num_warps=1)),
    "bytes+w2": (None, V(tile_bytes=True, num_warps=2)),
    "w2+prefetch": (None, V(num_warps=2, prefetch=True)),
    "bytes+w2+prefetch": (None, V(tile_bytes=True, num_warps=2, prefetch=True)),
    "G2": (2, None),
    "G2+bytes": (2, V(tile_bytes=True)),
}
#: max rows: name -> (nodes_per_program, variant); ``None`` nodes: the default rule (2 at mean in-degree 32).
MAX = {
    "default": (None, None),
    "pairs": (None, V(pairs=True)),
    "bytes": (None, V(tile_bytes=True)),
    "prefetch": (None, V(prefetch=True)),
    "w2": (None, V(num_warps=2)),
    "key": (None, V(key_reduce=True)),
    "key+w2": (None, V(key_reduce=True, num_warps=2)),
    "key+prefetch": (None, V(key_reduce=True, prefetch=True)),
    "key+pairs": (None, V(key_reduce=True, pairs=True)),
    "G1": (1, None),
    "G1+key": (1, V(key_reduce=True)),
    "G1+key+w2": (1, V(key_reduce=True, num_warps=2)),
}
#: max with arg-max rows (``--with-arg``): name -> (nodes_per_program, variant); ``None`` nodes: the default
#: rule (2 at mean in-degree 32). The values-only defaults' tilings (one node per program; two warps), without
#: ``key_reduce``, which the arg-max path ignores.
MAX_WITH_ARG = {
    "default": (None, None),
    "w2": (None, V(num_warps=2)),
    "w1": (None, V(num_warps=1)),
    "prefetch": (None, V(prefetch=True)),
    "w2+prefetch": (None, V(num_warps=2, prefetch=True)),
    "pairs": (None, V(pairs=True)),
    "bytes": (None, V(tile_bytes=True)),
    "bytes+w2": (None, V(tile_bytes=True, num_warps=2)),
    "pairs+w2": (None, V(pairs=True, num_warps=2)),
    "G1": (1, None),
    "G1+w2": (1, V(num_warps=2)),
    "G1+w1": (1, V(num_warps=1)),
    "G1+bytes": (1, V(tile_bytes=True)),
    "G4": (4, None),
    "G4+w2": (4, V(num_warps=2)),
}
OPS = {"spmm": SPMM, "max": MAX}


def tables(with_arg: bool) -> dict:
    """op -> its rows: :data:`SPMM`, and :data:`MAX` or (``with_arg``) :data:`MAX_WITH_ARG`."""
    return {"spmm": SPMM, "max": MAX_WITH_ARG if with_arg else MAX}


def make_graph(small: bool) -> gnn.Graph:
    return gnn.power_law(*((96, 1536) if small else (262_144, 8_388_608)), seed=0)


def _effective(op, nodes, variant, dtype, with_arg=False):
    """What a kernel runs: float32 ignores ``pairs`` and ``tile_bytes``; the max with arg-max ``key_reduce``; the
    one-node max kernel ``prefetch``."""
    v = variant or V()
    if jnp.dtype(dtype).itemsize == 4:
        v = dataclasses.replace(v, pairs=False, tile_bytes=False)
    if op == "max" and with_arg:
        v = dataclasses.replace(v, key_reduce=False)
    if op == "max" and nodes == 1:
        v = dataclasses.replace(v, prefetch=False)
    return v


def _fn(op, g, nodes, variant, with_arg):
    if op == "spmm":
        if variant == "xla":
            return lambda x: SR.csr_sum(g, None, x)
        return lambda x: SK.csr_sum(g, None, x, nodes_per_program=nodes, variant=variant)
    if variant == "xla":
        return lambda x: AR.segment_extreme(g, x, True, with_arg=with_arg)
    return lambda x: AK.segment_extreme(g, x, True, with_arg=with_arg, nodes_per_program=nodes, variant=variant)


def _check(op, got, want, what):
    """SpMM: the relative error (raises above the dtype's tolerance); max: exact equality (raises if not)."""
    if op == "spmm":
        return dict(rel_err=check_close(got, want, what=what))
    got, want = jax.tree.leaves(got), jax.tree.leaves(want)
    exact = all(np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True) for a, b in zip(got, want, strict=True))
    if not exact:
        raise AssertionError(f"{what}: expected exactly the reference's max (and arg); got a difference")
    return dict(exact=True)


def _table(rows) -> str:
    head = f"{'op':5} {'dtype':9} {'variant':18} {'G':>4} {'ms':>8} {'calls_ms':>9} {'speedup':>8} {'TB/s':>6}  check"
    lines = [head, "-" * len(head)]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['op']:5} {r['dtype']:9} {r['variant']:18} {'':>4} ERROR {r['error'][:60]}")
            continue
        g = "" if r["variant"] == "xla" else str(r["nodes_per_program"] or ("1" if r["op"] == "spmm" else "auto"))
        check = f"err {r['rel_err']:.1e}" if "rel_err" in r else "exact"
        lines.append(
            f"{r['op']:5} {r['dtype']:9} {r['variant']:18} {g:>4} {r['ms']:8.3f} {r['calls_ms']:9.3f} "
            f"{r.get('speedup', float('nan')):8.2f} {r['gather_tbps']:6.2f}  {check}"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", required=True, help="output path (rewritten after every row)")
    ap.add_argument("--ops", nargs="+", default=list(OPS), choices=list(OPS))
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16", "float16"])
    names = sorted(set(SPMM) | set(MAX) | set(MAX_WITH_ARG))
    ap.add_argument("--variants", nargs="+", default=None, choices=names, help="only these rows (and xla)")
    ap.add_argument("--features", type=int, default=128)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--with-arg", action="store_true", help="max: the arg-max path's rows (with_arg=True)")
    ap.add_argument("--small", action="store_true", help="a tiny graph in the interpreter (CPU)")
    args = ap.parse_args(argv)
    timer = Timer(iters=1, trials=1, warmup=0) if args.small else Timer(iters=args.iters, trials=3, warmup=1)
    t_start = time.perf_counter()
    dev = jax.devices()[0]
    out = dict(device=str(dev), device_kind=dev.device_kind, jax=jax.__version__, features=args.features,
               timer=repr(timer), with_arg=args.with_arg)  # fmt: skip
    ops = tables(args.with_arg)
    out["variants"] = {  # op -> name -> the GatherVariant's fields and nodes_per_program
        op: {name: dataclasses.asdict(v or V()) | {"nodes_per_program": nodes} for name, (nodes, v) in table.items()}
        for op, table in ops.items()
    }
    out.update(rows=[], skipped=[])
    failed = False

    def save():
        Path(args.json).write_text(json.dumps(out, indent=1))

    with gnn.interpret() if args.small else contextlib.nullcontext():
        t0 = time.perf_counter()
        g = make_graph(args.small)
        out["graph"] = dict(
            nodes=g.num_nodes,
            edges=g.num_edges,
            extra_units=int(g.schedule.num_extra),
            build_s=time.perf_counter() - t0,
        )
        for op in args.ops:
            for dname in args.dtypes:
                dtype = jnp.dtype(dname)
                x = jax.random.normal(jax.random.key(0), (g.num_nodes, args.features), dtype)
                gathered = g.num_edges * args.features * dtype.itemsize
                want = jax.jit(_fn(op, g, None, "xla", args.with_arg))(x)
                base, seen = None, {}
                rows = [("xla", None, "xla")] + [
                    (name, nodes, v)
                    for name, (nodes, v) in ops[op].items()
                    if args.variants is None or name in args.variants
                ]
                for name, nodes, v in rows:
                    if name != "xla":
                        key = (nodes, _effective(op, nodes, v, dtype, args.with_arg))
                        if key in seen:  # a knob that does not apply here: the same kernel as an earlier row
                            out["skipped"].append(dict(op=op, dtype=dname, variant=name, same_as=seen[key]))
                            continue
                        seen[key] = name
                    row = dict(op=op, dtype=dname, variant=name, nodes_per_program=nodes)
                    t_row = time.perf_counter()
                    try:
                        fn = _fn(op, g, nodes, v, args.with_arg)
                        row.update(_check(op, jax.jit(fn)(x), want, f"{op} {dname} {name}"))
                        row["ms"] = timer.loop(fn, x)
                        row["calls_ms"] = timer.calls(fn, x)
                        row["gather_tbps"] = gathered / (row["ms"] * 1e-3) / 1e12
                        if name == "default":
                            base = row["ms"]
                        if name != "xla" and base is not None:
                            row["speedup"] = base / row["ms"]
                    except Exception as e:  # recorded; the exit status says it failed
                        failed = True
                        row["error"] = f"{type(e).__name__}: {e}"
                        traceback.print_exc()
                    row["wall_s"] = time.perf_counter() - t_row
                    print(json.dumps(row), flush=True)
                    out["rows"].append(row)
                    save()
    out["total_s"] = time.perf_counter() - t_start
    save()
    print(_table(out["rows"]))
    print(f"total {out['total_s']:.1f} s; skipped (the same kernel as an earlier row): {len(out['skipped'])}")
    return int(failed)


if __name__ == "__main__":
    sys.exit(main())
