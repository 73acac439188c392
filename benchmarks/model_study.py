"""All-MiniLM-L6-v2 block-pruned: the quality table and the speed on one GPU, in one run.

    PYTHONPATH=. python benchmarks/model_study.py --weights .cache/minilm-fp16 --json OUT.json [--plot DIR]

- Quality (float32): every block size (16, 32, 64) x density (1/2, 1/4, 1/8, 1/16) x scope (per
  layer, global), the cosine to the dense embeddings of 200 held-out sentences and the Spearman
  correlation of the pairwise similarity scores, before and (block size 32, per-layer pruning;
  ``--recover-global`` for the global ones too) after a 300-step distillation on 2,000 training
  sentences.
- Speed (bfloat16): the encoder on 256 sentences x 128 tokens, dense and pruned per layer at every
  block size x density; and the FFN alone, ``gelu(x @ W1 + b1) @ W2 + b2`` with x (32768, 384),
  W1 (384, 1536), W2 (1536, 384); each with ``Timer.loop`` (device time) and ``Timer.calls``.

The cells are those of ``blocksparse bench --suite model --full`` (:mod:`blocksparse.bench.model`);
``--json`` is rewritten after every cell, so a run cut short keeps what it measured. Exit status 1
if a cell failed its check against the dense computation. ``--quick`` runs the CPU-sized suite.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: The quality targets of the study (Spearman of the pairwise similarity scores, block size 32).
TARGETS = {"d=1/2 without recovery": 0.95, "d=1/4 with recovery": 0.90}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--weights", default=None, help="model directory (default: the installed weights package)")
    p.add_argument("--json", required=True)
    p.add_argument("--plot", default=None, help="directory for PNG figures (needs matplotlib)")
    p.add_argument("--quick", action="store_true", help="the CPU-sized suite")
    p.add_argument("--steps", type=int, default=None, help="distillation steps (default 300)")
    p.add_argument("--recover-global", action="store_true", help="also distill the globally pruned models (b=32)")
    p.add_argument("--speed-block-sizes", default=None, help="comma list, default 16,32,64")
    p.add_argument("--skip", default="", help="comma list of cell kinds to skip: quality, encoder, ffn")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--trials", type=int, default=3)
    args = p.parse_args(argv)

    import jax

    from blocksparse.bench import Timer, run_cell
    from blocksparse.bench import _report as report
    from blocksparse.bench import model as suite

    sizes = suite.SIZES["quick" if args.quick else "full"]
    if args.steps is not None:
        sizes = dataclasses.replace(sizes, steps=args.steps)
    if args.speed_block_sizes:
        sizes = dataclasses.replace(sizes, speed_block_sizes=tuple(int(b) for b in args.speed_block_sizes.split(",")))
    if args.recover_global:
        sizes = dataclasses.replace(sizes, recover_scopes=("layer", "global"))
    skip = {k for k in args.skip.split(",") if k}
    cells = [c for c in suite.cells(full=not args.quick, weights=args.weights, sizes=sizes)
             if c.params["kind"] not in skip]  # fmt: skip
    timer = Timer(iters=args.iters, trials=args.trials)
    dev = jax.devices()[0]
    doc = dict(meta=dict(jax=jax.__version__, device=getattr(dev, "device_kind", str(dev)), platform=dev.platform,
                         sizes=dataclasses.asdict(sizes), iters=timer.iters, trials=timer.trials,
                         started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())), results=[])  # fmt: skip
    t0 = time.perf_counter()
    results = []
    for i, cell in enumerate(cells):
        r = run_cell(cell, timer)
        results.append(r)
        doc["results"] = [x.to_dict() for x in results]
        doc["meta"]["seconds"] = time.perf_counter() - t0
        _write(args.json, doc)
        status = "ok" if r.ok else f"FAILED: {r.error}"
        print(f"[{i + 1}/{len(cells)} {time.perf_counter() - t0:6.1f}s] {cell.label}: {status} {_brief(r.metrics)}",
              flush=True)  # fmt: skip
    doc["targets"] = _targets(results)
    _write(args.json, doc)
    print(report.table(results, {"model": suite.COLUMNS}))
    print(report.summary(results, time.perf_counter() - t0))
    for name, t in doc["targets"].items():
        print(f"target {name}: spearman {t['spearman']} (>= {t['target']}): {'met' if t['met'] else 'NOT met'}")
    if args.plot:
        for path in plot(doc, args.plot):
            print(f"wrote {path}")
    print(f"wrote {args.json}")
    return 0 if all(r.ok for r in results) else 1


def _write(path: str, doc: dict) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(p.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(p)


def _brief(m: dict) -> str:
    keys = ("cosine_mean", "spearman", "recovered_spearman", "loop_ms", "calls_ms", "speedup_vs_dense")
    return " ".join(f"{k}={m[k]:.4g}" for k in keys if isinstance(m.get(k), float))


def _targets(results) -> dict:
    out = {}
    for r in results:
        p, m = r.params, r.metrics
        if not r.ok or p.get("kind") != "quality" or p.get("block_size") != 32 or p.get("scope") != "layer":
            continue
        if p["density"] == 1 / 2:
            out["d=1/2 without recovery"] = m["spearman"]
        if p["density"] == 1 / 4 and "recovered_spearman" in m:
            out["d=1/4 with recovery"] = m["recovered_spearman"]
    return {k: dict(spearman=v, target=TARGETS[k], met=bool(v >= TARGETS[k])) for k, v in out.items()}


def plot(doc: dict, out_dir: str) -> list[str]:
    """Spearman vs density (one line per block size and scope) and encoder/FFN speedup vs density."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = [r for r in doc["results"] if r["ok"]]
    paths = []
    fig, ax = plt.subplots(figsize=(6, 4))
    for scope, style in (("layer", "-"), ("global", "--")):
        for b in (16, 32, 64):
            pts = sorted((r["params"]["density"], r["metrics"]["spearman"]) for r in rows
                         if r["params"]["kind"] == "quality" and r["params"]["block_size"] == b
                         and r["params"]["scope"] == scope)  # fmt: skip
            if pts:
                ax.plot(*zip(*pts, strict=True), style, marker="o", label=f"b={b} {scope}")
        pts = sorted((r["params"]["density"], r["metrics"]["recovered_spearman"]) for r in rows
                     if r["params"]["kind"] == "quality" and r["params"]["scope"] == scope
                     and "recovered_spearman" in r["metrics"])  # fmt: skip
        if pts:
            ax.plot(*zip(*pts, strict=True), style, marker="s", color="k", label=f"b=32 {scope} recovered")
    ax.set(xscale="log", xlabel="density", ylabel="Spearman vs dense", title="all-MiniLM-L6-v2 block-pruned")
    ax.legend(fontsize=7)
    paths.append(str(out / "model_quality.png"))
    fig.savefig(paths[-1], dpi=120, bbox_inches="tight")
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 4))
    for kind, style in (("encoder", "-"), ("ffn", "--")):
        for b in (16, 32, 64):
            pts = sorted((r["params"]["density"], r["metrics"]["speedup_vs_dense"]) for r in rows
                         if r["params"]["kind"] == kind and r["params"].get("block_size") == b)  # fmt: skip
            if pts:
                ax.plot(*zip(*pts, strict=True), style, marker="o", label=f"{kind} b={b}")
    ax.axhline(1.0, color="gray", lw=1)
    ax.set(xscale="log", xlabel="density", ylabel="speedup vs dense (Timer.loop)", title="bf16, H200")
    ax.legend(fontsize=7)
    paths.append(str(out / "model_speed.png"))
    fig.savefig(paths[-1], dpi=120, bbox_inches="tight")
    plt.close(fig)
    return paths


if __name__ == "__main__":
    sys.exit(main())
