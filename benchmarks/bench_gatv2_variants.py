"""GATv2 kernel variants (``config=``): forward and forward+backward per variant, on one graph.

    python benchmarks/bench_gatv2_variants.py --json out.json [--shapes 1x128 8x16] [--variants NAME ...]
        [--modes fwd fwd+bwd] [--calls best|all|none] [--budget-s 190] [--small]

Graph ``gnn.power_law(262144, 8388608)`` (seed 0; heavy nodes split into chunks), float32 ``x_src``,
``x_dst`` of shape ``(N, H, D)`` and ``att (H, D)`` for each ``HxD`` in ``--shapes``: ``H = 1, D = 128``
(one head per program) and ``H = 8, D = 16`` (eight heads per program). Each variant is an
:class:`~blocksparse.ops.gnn.config.AttentionConfig` (see :data:`VARIANTS`; ``flat`` and ``groups``
change only one-head programs, so they run for ``H = 1`` only). ``ms`` = ``Timer.loop`` (median device
time per call inside one jitted loop) of ``gatv2`` (``fwd``) or of its output and VJP (``fwd+bwd``,
cotangent fixed); ``calls_ms`` = ``Timer.calls`` (back-to-back jitted calls) for the default and the
fastest variant of each shape and mode (``--calls all``: every row; ``none``: no row).

Checks: each variant's output and gradients against the default variant's (``rel_err``: the largest
relative Frobenius error of the four arrays, at most 1e-4), and the default against the XLA reference
once per shape (``xla_rel_err``, at most 1e-3; ``--no-xla-check`` skips it). A failed check, or a
variant that raises, is recorded in its row and makes the exit status 1. Rows are printed as they
finish, the JSON is rewritten after every row, and a table closes the run. Rows that would start
after their shape's share of ``--budget-s`` (in proportion to its rows) are recorded as skipped; the
default variant always runs. On an H200 the whole run is about 60 compilations of a few seconds each
and stays under 4 minutes.

``--small`` runs a tiny power-law graph in the Pallas interpreter on the CPU, in seconds: the test of
this script.
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
from blocksparse.ops.gnn.config import AttentionConfig

C = AttentionConfig
#: name -> (config, whether it differs from the default only with one head per program)
VARIANTS: dict[str, tuple[AttentionConfig, bool]] = {
    "default": (C(), False),  # the measured rule (config.AttentionConfig)
    "previous": (C(layout="heads", edges_per_step=32, deferred=False), False),  # the geometry before the rule
    "flat": (C(layout="flat", edges_per_step=32, deferred=False), True),
    "groups": (C(layout="groups", edges_per_step=32, deferred=False), True),
    "deferred": (C(layout="heads", edges_per_step=32, deferred=True), False),
    "flat+deferred": (C(layout="flat", edges_per_step=32, deferred=True), True),
    "be16": (C(layout="heads", edges_per_step=16, deferred=False), False),
    "flat+be16": (C(layout="flat", edges_per_step=16, deferred=False), True),
    "be16+deferred": (C(layout="heads", edges_per_step=16, deferred=True), False),
    "flat+w8": (C(layout="flat", num_warps=8), True),
    "be64": (C(edges_per_step=64), False),
}
SHAPES = ("1x128", "8x16")
MODES = ("fwd", "fwd+bwd")
TOL_VARIANT, TOL_XLA = 1e-4, 1e-3


def parse_shape(s: str) -> tuple[int, int]:
    try:
        h, d = (int(t) for t in s.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"Expected a shape HxD such as 1x128. Got {s!r}.") from None
    return h, d


def make_inputs(n: int, h: int, d: int):
    ks = jax.random.split(jax.random.key(h * 1000 + d), 4)
    xs, xd, ct = (jax.random.normal(k, (n, h, d), jnp.float32) for k in ks[:3])
    att = jax.random.normal(ks[3], (h, d), jnp.float32)
    return (xs, xd, att), ct


def functions(g, ct, impl: str, config: AttentionConfig | None):
    """(forward, forward+backward): ``gatv2`` and ``(out, d x_src, d x_dst, d att)`` for cotangent ``ct``."""

    def fwd(xs, xd, att):
        return gnn.gatv2(g, xs, xd, att, implementation=impl, config=config)

    def fb(xs, xd, att):
        out, vjp = jax.vjp(fwd, xs, xd, att)
        return (out, *vjp(ct))

    return fwd, fb


def rel_err(got, want, tol: float, what: str) -> float:
    return max(check_close(a, b, tol=tol, what=f"{what} [{i}]") for i, (a, b) in enumerate(zip(got, want, strict=True)))


def table(rows) -> str:
    lines = [
        "| H x D | mode | variant | ms | calls ms | vs default | rel err |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "ms" not in r:
            status = r.get("error") or r.get("skipped") or ""
            lines.append(f"| {r['shape']} | {r['mode']} | {r['variant']} | - | - | - | {status[:60]} |")
            continue
        calls = f"{r['calls_ms']:.3f}" if "calls_ms" in r else ""
        speed = f"{r['speedup']:.2f}x" if "speedup" in r else ""
        err = f"{r['rel_err']:.1e}" if "rel_err" in r else ""
        lines.append(f"| {r['shape']} | {r['mode']} | {r['variant']} | {r['ms']:.3f} | {calls} | {speed} | {err} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", required=True, help="output path (rewritten after every row)")
    ap.add_argument("--shapes", nargs="+", type=parse_shape, default=[parse_shape(s) for s in SHAPES])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    ap.add_argument("--calls", default="best", choices=["best", "all", "none"], help="rows also timed by Timer.calls")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--budget-s", type=float, default=190.0, help="rows starting later are skipped")
    ap.add_argument("--no-xla-check", action="store_true")
    ap.add_argument("--small", action="store_true", help="tiny graph in the interpreter (CPU)")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    variants = ["default"] + [v for v in args.variants if v != "default"]  # the baseline first, always
    timer = Timer(iters=1, trials=1, warmup=0) if args.small else Timer(iters=args.iters, trials=3, warmup=1)
    nodes, edges = (128, 2048) if args.small else (262_144, 8_388_608)
    out = dict(device=str(jax.devices()[0]), timer=repr(timer), small=args.small, rows=[])
    failed = False

    def save():
        Path(args.json).write_text(json.dumps(out, indent=1))

    ctx = gnn.interpret() if args.small else contextlib.nullcontext()
    with ctx:
        t0 = time.perf_counter()
        g = gnn.power_law(nodes, edges, seed=0)
        _ = g.T.schedule  # the transpose (the backward's source pass) built before the timings
        out["graph"] = dict(
            repr=repr(g), nodes=g.num_nodes, edges=g.num_edges, extra_units=int(g.schedule.num_extra),
            extra_units_transpose=int(g.T.schedule.num_extra), build_s=time.perf_counter() - t0,
        )  # fmt: skip
        print(f"{g}: built in {out['graph']['build_s']:.1f} s; device {out['device']}", flush=True)
        # each shape's rows get a share of the time budget in proportion to their number
        plan = [[v for v in variants if not (VARIANTS[v][1] and 128 // d > 1)] for h, d in args.shapes]
        total_rows, done_rows = sum(len(p) for p in plan), 0
        for (h, d), names in zip(args.shapes, plan, strict=True):
            shape = f"{h}x{d}"
            inputs, ct = make_inputs(nodes, h, d)
            done_rows += len(names)
            deadline = args.budget_s * done_rows / total_rows
            base: dict = {}  # mode -> ms; "result" -> the default's fwd+bwd arrays
            for name in names:  # flat / groups only for one head per program (128 // D <= 1)
                config = VARIANTS[name][0]
                fwd, fb = functions(g, ct, "pallas", config)
                for mode in args.modes:
                    row = dict(shape=shape, heads=h, head_dim=d, mode=mode, variant=name, config=config.label)
                    elapsed = time.perf_counter() - t_start
                    if elapsed > deadline and name != "default":
                        row["skipped"] = f"time budget ({elapsed:.0f} s > {deadline:.0f} s for {shape})"
                        out["rows"].append(row)
                        print(json.dumps(row), flush=True)
                        continue
                    try:
                        t1 = time.perf_counter()
                        if mode == "fwd+bwd":  # checked here; the forward is the first of these arrays
                            res = jax.block_until_ready(jax.jit(fb)(*inputs))
                            if name == "default":
                                base["result"] = res
                                if not args.no_xla_check:
                                    want = jax.jit(functions(g, ct, "xla", None)[1])(*inputs)
                                    row["xla_rel_err"] = rel_err(res, want, TOL_XLA, f"{shape} default vs XLA")
                                    del want
                            elif "result" in base:
                                row["rel_err"] = rel_err(res, base["result"], TOL_VARIANT, f"{shape} {name}")
                            del res
                        fn = fwd if mode == "fwd" else fb
                        row["ms"] = timer.loop(fn, *inputs)
                        if args.calls == "all":
                            row["calls_ms"] = timer.calls(fn, *inputs)
                        if name == "default":
                            base[mode] = row["ms"]
                        if mode in base:
                            row["speedup"] = base[mode] / row["ms"]
                        row["wall_s"] = time.perf_counter() - t1
                    except Exception as e:  # recorded; the exit status says it failed
                        failed = True
                        row["error"] = f"{type(e).__name__}: {e}"
                        traceback.print_exc()
                    print(json.dumps(row), flush=True)
                    out["rows"].append(row)
                    save()
            if args.calls == "best":  # Timer.calls for the default and the fastest variant of each mode
                for mode in args.modes:
                    timed = [r for r in out["rows"] if r["shape"] == shape and r["mode"] == mode and "ms" in r]
                    picks = {r["variant"]: r for r in timed if r["variant"] == "default"}
                    if timed:
                        best = min(timed, key=lambda r: r["ms"])
                        picks[best["variant"]] = best
                    for r in picks.values():
                        if time.perf_counter() - t_start > deadline:
                            break
                        fwd, fb = functions(g, ct, "pallas", VARIANTS[r["variant"]][0])
                        try:
                            r["calls_ms"] = timer.calls(fwd if mode == "fwd" else fb, *inputs)
                        except Exception as e:
                            failed = True
                            r["calls_error"] = f"{type(e).__name__}: {e}"
                        print(json.dumps(dict(shape=shape, mode=mode, variant=r["variant"], **{
                            k: r[k] for k in ("calls_ms", "calls_error") if k in r})), flush=True)  # fmt: skip
                        save()
    out["total_s"] = time.perf_counter() - t_start
    save()
    print(table(out["rows"]))
    print(f"total {out['total_s']:.0f} s")
    return int(failed)


if __name__ == "__main__":
    np.set_printoptions(precision=4)
    sys.exit(main())
