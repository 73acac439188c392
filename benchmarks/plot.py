"""Plots for docs/benchmarks.md, made from the benchmark JSON files (needs matplotlib: the ``bench`` extra).

Usage::

    python benchmarks/plot.py --matmul benchmarks/results/matmul_h200_run4.json \
        --gnn benchmarks/results/gnn_h200_run2.json --out docs/img
    python benchmarks/plot.py --bench matmul.json gnn.json --out figs   # `blocksparse bench --json` files
    python benchmarks/plot.py --out docs/img   # every figure of the docs' recorded runs (the defaults below)
    python benchmarks/plot.py --gnn-full benchmarks/results/gnn_full_h200.json --out docs/img   # (among them)
    python benchmarks/plot.py --gnn-runs benchmarks/results/gnn_full_run2_h100.json --out docs/img   # (among them)

``--bench`` draws the figures of ``blocksparse bench --plot`` (:func:`blocksparse.bench.figures`) from
``blocksparse bench --json`` files (and the peer scripts', which write the same layout): throughput against
density per block size with dense as a line, the GNN and planner ratios, a bar figure per other suite.
``--matmul`` and ``--gnn`` read the recorded JSON behind docs/benchmarks.md's figures
(``benchmarks/results/matmul_h200_run4.json``, ``gnn_h200_run2.json``: the layout of the scripts that measured
them, before they became ``blocksparse bench`` suites and peer scripts).
"""

from __future__ import annotations

import argparse
import json
import os
import re

import numpy as np

from blocksparse.bench import figures, require_matplotlib

plt = require_matplotlib()  # ImportError naming `pip install 'blocksparse[bench]'` without it


def _density_axes(ax, ds, ideal, ideal_label: str, ylabel: str, title: str, **legend) -> None:
    """The ideal line, dense itself (1), log axes against a decreasing density, labels and legend."""
    ax.plot(ds, ideal, "k--", lw=0.8, label=ideal_label)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.invert_xaxis()
    ax.set_xlabel("density")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, **legend)


def _time_vs_density_axes(ax, ds, n: int) -> None:
    """Time over dense: the ideal is the density itself."""
    _density_axes(ax, ds, ds, "ideal (= density)", "time / dense jnp.dot time", f"8192 x 8192 @ 8192 x {n}, bf16, H200",
                  ncol=2)  # fmt: skip


def plot_matmul(path: str, out: str) -> str:
    rows = [r for r in json.load(open(path))["rows"] if r.get("pattern", "uniform") == "uniform"]
    rows = [r for r in rows if r.get("variant", "default") == "default" and r.get("op", "dsd") == "dsd"]
    ns = sorted({r["n"] for r in rows})
    fig, axes = plt.subplots(1, len(ns), figsize=(5.5 * len(ns), 4), squeeze=False)
    for ax, n in zip(axes[0], ns, strict=True):
        for b in sorted({r["b"] for r in rows if r["n"] == n}):
            cell = sorted((r for r in rows if r["n"] == n and r["b"] == b), key=lambda r: -r["d"])
            ds = [r["d"] for r in cell]
            ax.plot(ds, [r["vs_jnp"] for r in cell], "o-", label=f"blocksparse b={b}")
            if all("vs_torch_bsr" in r for r in cell):
                bsr = [r["torch_bsr_ms"] / r["dense_jnp_ms"] for r in cell]
                ax.plot(ds, bsr, "x:", color=ax.lines[-1].get_color(), alpha=0.6, label=f"torch BSR b={b}")
        _time_vs_density_axes(ax, ds, n)
    fig.tight_layout()
    dest = os.path.join(out, "matmul_vs_dense.png")
    fig.savefig(dest, dpi=110)
    return dest


def plot_gnn(path: str, out: str) -> str:
    rows = [r for r in json.load(open(path))["rows"] if "ms" in r]  # failed rows have no time
    cases = [("spmm_sum", "fwd", None), ("max", "fwd", None), ("max", "fwd+bwd", None),
             ("gatv2", "fwd+bwd", 8), ("transformer", "fwd+bwd", 8)]  # fmt: skip
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(12, 4))
    labels, ours, best_peer, ours_mem, peer_mem, peer_names = [], [], [], [], [], []
    for op, mode, heads in cases:
        sel = [r for r in rows if r["op"] == op and r["mode"] == mode and r.get("heads") == heads]
        mine = [r for r in sel if r["impl"] == "bs-pallas"]
        peers = [r for r in sel if not r["impl"].startswith("bs-")]
        if not mine or not peers:
            continue
        peer = min(peers, key=lambda r: r["ms"])
        labels.append(f"{op} {mode}" + (f" H={heads}" if heads else ""))
        ours.append(mine[0]["ms"])
        best_peer.append(peer["ms"])
        peer_names.append(peer["impl"])
        ours_mem.append(mine[0]["mem_bytes"] / 2**30)
        peer_mem.append(peer["mem_bytes"] / 2**30)
    x = range(len(labels))
    for ax, a, b, unit in ((ax_t, ours, best_peer, "ms"), (ax_m, ours_mem, peer_mem, "GiB (extra peak)")):
        ax.bar([i - 0.2 for i in x], a, 0.4, label="blocksparse (Pallas)")
        ax.bar([i + 0.2 for i in x], b, 0.4, label="fastest peer measured")
        ax.set_xticks(list(x), labels, rotation=20, ha="right", fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel(unit)
        ax.legend(fontsize=8)
    for i, name in enumerate(peer_names):
        ax_t.annotate(name, (i + 0.2, best_peer[i]), fontsize=6, ha="center", va="bottom")
    ax_t.set_title("GNN ops, N=262,144 E=8,388,608 F=128, fp32, H200")
    ax_m.set_title("peak memory beyond the inputs")
    fig.tight_layout()
    dest = os.path.join(out, "gnn_vs_peers.png")
    fig.savefig(dest, dpi=110)
    return dest


def plot_gnn_full(path: str, out: str, name: str = "gnn_full_table.png") -> str:
    """The full gnn-graphs table as a map: per graph and op (rows) and dtype and pass (columns), the fastest peer's
    time over the default's (:mod:`blocksparse.bench.gnn_table`: the backend the run's tuned data picks); green where
    the default is faster, red where a peer is, blank where the cell did not run or no peer did."""
    from blocksparse.bench import gnn_graphs, gnn_table

    doc = json.load(open(path))
    cells = gnn_table.cells(doc)
    cols = [(dt, p) for dt in gnn_table.DTYPES for p in gnn_graphs.PASSES]
    rows = [(g, op) for g in gnn_graphs.GRAPHS for op in gnn_graphs.OPS]
    grid = np.full((len(rows), len(cols)), np.nan)
    for i, (g, op) in enumerate(rows):
        for j, (dt, p) in enumerate(cols):
            c = cells.get((g, dt, op, p))
            if c is not None and c.speedup is not None:
                grid[i, j] = c.speedup
    fig, ax = plt.subplots(figsize=(6.5, 12))
    im = ax.imshow(np.log2(grid), cmap="RdYlGn", vmin=-2, vmax=2, aspect="auto")
    for i, j in zip(*np.nonzero(np.isfinite(grid)), strict=True):
        dark = abs(np.log2(grid[i, j])) > 1.3
        ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=6, color="w" if dark else "k")
    ax.set_xticks(range(len(cols)), [f"{dt}\n{p}" for dt, p in cols], fontsize=7)
    ax.set_yticks(range(len(rows)), [f"{g}  {gnn_table.NAMES[op]}" for g, op in rows], fontsize=6)
    for k in range(1, len(gnn_graphs.GRAPHS)):
        ax.axhline(k * len(gnn_graphs.OPS) - 0.5, color="k", lw=0.6)
    ax.xaxis.set_ticks_position("top")
    fig.colorbar(im, ax=ax, shrink=0.4, label="log2(fastest peer / default)")
    ax.set_title(f"{len(cells)} of {len(rows) * len(cols)} cells, {doc.get('meta', {}).get('device', '')}", fontsize=8)
    fig.tight_layout()
    dest = os.path.join(out, name)
    fig.savefig(dest, dpi=110)
    return dest


def plot_mosaic(path: str, out: str) -> str:
    """Time relative to dense `jnp.dot` against density, Triton and Mosaic kernels, per block size and n."""
    rows = json.load(open(path))["rows"]
    ns = sorted({r["n"] for r in rows}, reverse=True)
    fig, axes = plt.subplots(1, len(ns), figsize=(5.5 * len(ns), 4), squeeze=False)
    for ax, n in zip(axes[0], ns, strict=True):
        for b in sorted({r["b"] for r in rows if r["n"] == n}):
            cell = sorted((r for r in rows if r["n"] == n and r["b"] == b), key=lambda r: -r["density"])
            ds = [r["density"] for r in cell]
            (line,) = ax.plot(ds, [r["mosaic_ms"] / r["dense_ms"] for r in cell], "o-", label=f"Mosaic b={b}")
            ax.plot(ds, [r["triton_ms"] / r["dense_ms"] for r in cell], "x:", color=line.get_color(),
                    label=f"Triton b={b}")  # fmt: skip
        _time_vs_density_axes(ax, ds, n)
    fig.tight_layout()
    dest = os.path.join(out, "mosaic_vs_triton.png")
    fig.savefig(dest, dpi=110)
    return dest


def _sdd_mosaic_ms(row) -> float:
    """The time of the plan the kernel takes by default now (64-deep steps, 3 stages, its splits rule) where the
    row's forced variants include it, else the row's default."""
    from blocksparse import BlockPattern
    from blocksparse.ops.matmul.mosaic import sdd as ps

    pattern = BlockPattern.random(0, (row["m"], row["n"]), (row["b"], row["b"]), row["density"])
    p = ps.plan(pattern, row["K"])
    for v in row.get("variants", ()):
        if (v.get("tk"), v.get("stages"), v.get("splits")) == (p.tk, p.stages, p.splits) and "mosaic_ms" in v:
            return v["mosaic_ms"]
    return row["mosaic_view_ms"]


def plot_sdd(paths, out: str) -> str:
    """The weight gradient (sdd): Triton and Mosaic time over dense `jnp.dot`, per layer, block and density."""
    rows = {}
    for path in paths:  # a later file's cell replaces an earlier one's
        for r in json.load(open(path))["rows"]:
            rows[r["kind"], r["b"], r["density"]] = r
    kinds = sorted({k for k, _, _ in rows}, reverse=True)
    fig, axes = plt.subplots(1, len(kinds), figsize=(5.5 * len(kinds), 4), squeeze=False)
    for ax, kind in zip(axes[0], kinds, strict=True):
        cells = sorted((r for (k, _, _), r in rows.items() if k == kind), key=lambda r: (r["b"], -r["density"]))
        labels = [f"b={r['b']}\nd=1/{round(1 / r['density'])}" for r in cells]
        xs = range(len(cells))
        ax.bar([x - 0.2 for x in xs], [r["triton_ms"] / r["dense_ms"] for r in cells], 0.4, label="Triton")
        ax.bar([x + 0.2 for x in xs], [_sdd_mosaic_ms(r) / r["dense_ms"] for r in cells], 0.4, label="Mosaic")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_yscale("log", base=2)
        ax.set_xticks(list(xs), labels, fontsize=7)
        ax.set_ylabel("time / dense jnp.dot time")
        r = cells[0]
        ax.set_title(f"dW of W {r['m']} x {r['n']} over {r['K']} tokens, bf16, H200", fontsize=9)
        ax.legend(fontsize=8)
    fig.tight_layout()
    dest = os.path.join(out, "mosaic_sdd.png")
    fig.savefig(dest, dpi=110)
    return dest


def plot_sharded_gnn(path: str, out: str) -> str:
    """One GPU against two (the plan's choice, and its work without the collective), per op."""
    rows = json.load(open(path))["rows"]
    ops = ["spmm_sum", "aggregate_max"]
    series = [("1dev_dynamic", "one GPU"), ("sharded_auto", "two GPUs"), ("local_only", "two GPUs, no collective")]
    fig, ax = plt.subplots(figsize=(6.5, 4))
    width = 0.8 / len(series)
    for k, (name, label) in enumerate(series):
        ms = [next((r["loop_ms"] for r in rows if r.get("name") == name and r.get("op") == op), float("nan"))
              for op in ops]  # fmt: skip
        ax.bar([i + (k - 1) * width for i in range(len(ops))], ms, width, label=label)
    ax.set_xticks(range(len(ops)), ["SpMM (sum)", "max aggregation"])
    ax.set_ylabel("ms (device time in a jitted loop)")
    ax.set_title("N=1,048,576 E=33,554,432 F=128 fp32, H200")
    ax.legend(fontsize=8)
    fig.tight_layout()
    dest = os.path.join(out, "sharded_gnn.png")
    fig.savefig(dest, dpi=110)
    return dest


def _products_panel(ax, rows, title: str) -> None:
    """Speedup over dense (the GPU's busy time per product, both in the same cell) against density, per block."""
    for b in sorted({r["params"]["block_size"] for r in rows}):
        cell = sorted((r for r in rows if r["params"]["block_size"] == b), key=lambda r: -r["params"]["density"])
        ds = [r["params"]["density"] for r in cell]
        ax.plot(ds, [r["metrics"]["dense_busy_us"] / r["metrics"]["busy_us"] for r in cell], "o-", label=f"b={b}")
    ds = sorted({r["params"]["density"] for r in rows}, reverse=True)
    _density_axes(ax, ds, [1 / d for d in ds], "ideal (1 / density)", "speedup over dense (busy time)", title)


def plot_decode_products(paths, out: str) -> str:
    """The few-token products at n = 1 (decode suite cells on the tuned defaults, a later file's cell replacing an
    earlier one's)."""
    cells = {}
    for path in paths:
        for r in json.load(open(path))["results"]:
            if r.get("ok") and r["params"].get("kind") == "product" and r["params"]["n"] == 1:
                q = r["params"]
                cells[q["op"], q["K"], q["block_size"], q["density"]] = r
    shapes = sorted({(op, k) for op, k, _, _ in cells})
    fig, axes = plt.subplots(1, len(shapes), figsize=(4.2 * len(shapes), 3.8), squeeze=False)
    for ax, (op, k) in zip(axes[0], shapes, strict=True):
        rows = [r for (o, kk, _, _), r in cells.items() if (o, kk) == (op, k)]
        n_out = rows[0]["params"]["N"]
        title = f"x (1, {k}) @ W ({k}, {n_out})" if op == "x @ W" else f"W ({n_out}, {k}) @ x ({k}, 1)"
        _products_panel(ax, rows, f"{title}, bf16, H200")
    fig.tight_layout()
    dest = os.path.join(out, "decode_products.png")
    fig.savefig(dest, dpi=110)
    return dest


#: The generation bars: label -> {batch: (model, dense)}, each a (file, section, key) of a probe's JSON in
#: benchmarks/results; tokens/s over the dense model's. The dense model is the same file's where it has one; the
#: attention step's probe timed dense at batch 1 only, so its batch 8 bar is over the attention probe's dense.
_ATT = "decode_attention_1b_h200.json"
_GEN = "decode_gen_norms_h200.json"
_STEP = "decode_step_attention_1b_h200.json"
_BALANCED = "decode_gen_balanced_h200.json"  # rounds of generation loops; balanced: prune_decoder(balance="cols")
_BALANCED_STEPS = "decode_steps_balanced_h200.json"  # the suite's generate_steps cell, balanced, batch 8
_BATCHES = "decode_gen_batches_h200.json"
GENERATION_BARS = {
    "pruned, fused, XLA attention": {1: ((_ATT, "attention_xla_vs_cudnn", "b1_fused_xla"),
                                         (_ATT, "attention_xla_vs_cudnn", "b1_dense_xla")),
                                     8: ((_ATT, "attention_xla_vs_cudnn", "b8_fused_xla"),
                                         (_ATT, "attention_xla_vs_cudnn", "b8_dense_xla"))},
    "cuDNN attention": {1: ((_ATT, "attention_xla_vs_cudnn", "b1_fused_cudnn"),
                            (_ATT, "attention_xla_vs_cudnn", "b1_dense_xla")),
                        8: ((_ATT, "attention_xla_vs_cudnn", "b8_fused_cudnn"),
                            (_ATT, "attention_xla_vs_cudnn", "b8_dense_xla"))},
    "Pallas attention alone": {1: ((_ATT, "attention_xla_vs_pallas", "b1_fused_pallas"),
                                   (_ATT, "attention_xla_vs_pallas", "b1_dense_xla")),
                               8: ((_ATT, "attention_xla_vs_pallas", "b8_fused_pallas"),
                                   (_ATT, "attention_xla_vs_pallas", "b8_dense_xla"))},
    "Pallas attention step": {1: ((_STEP, "run3_parts", "b1_pallasP4"), (_STEP, "run1_chunks", "b1_dense")),
                              8: ((_STEP, "run3_parts", "b8_pallasP2"),
                                  (_ATT, "attention_xla_vs_cudnn", "b8_dense_xla"))},
    "Pallas steps (attention step and norms)": {
        1: ((_GEN, "generate b=64 d=1/8 batch=1 [random weights]", "fused_attention_tokens_per_s"),
            (_GEN, "generate dense batch=1 [random weights]", "tokens_per_s")),
        8: ((_GEN, "generate b=64 d=1/8 batch=8 [random weights]", "fused_attention_tokens_per_s"),
            (_GEN, "generate b=64 d=1/8 batch=8 [random weights]", "dense_tokens_per_s")),  # its own run's dense
        32: ((_BATCHES, 32, "base"), (_BATCHES, 32, "dense"))},
    "Pallas steps, balanced columns": {
        1: ((_BALANCED, 1, "balanced"), (_BALANCED, 1, "dense")),
        8: ((_BALANCED_STEPS, "generate b=64 d=1/8 cols batch=8 fused, Pallas steps [random weights]", "tokens_per_s"),
            (_BALANCED_STEPS, "generate b=64 d=1/8 cols batch=8 fused, Pallas steps [random weights]",
             "dense_tokens_per_s"))},
}  # fmt: skip


def plot_decode_generation(results: str, out: str) -> str:
    """Generation tokens/s of the pruned 1B decoder (b = 64, d = 1/8) over dense JAX, per attention, batch 1 and 8;
    batch 32 with the Pallas steps only."""
    docs = {}

    def tok_s(name, section, key):
        """A probe's ``doc[section][key]["tok_s"]``, or a bench run's metric ``key`` of the cell labelled ``section``
        (``dense_tokens_per_s``: from the cell's ``dense_loop_ms``, the dense model timed in the same process)."""
        if name not in docs:
            with open(os.path.join(results, name)) as f:
                docs[name] = json.load(f)
        doc = docs[name]
        if "loop_ms" in doc:  # rounds of generation loops: {"batch:setup": [ms, ...]}, the mean of the rounds
            runs = doc["loop_ms"][f"{section}:{key}"]
            return section * doc["new_tokens"] / (sum(runs) / len(runs) * 1e-3)
        if "results" not in doc:
            return doc[section][key]["tok_s"]
        cell = next(c for c in doc["results"] if c["label"] == section)
        if key == "dense_tokens_per_s":
            p = cell["params"]
            return p["batch"] * p["new_tokens"] / (cell["metrics"]["dense_loop_ms"] * 1e-3)
        return cell["metrics"][key]

    batches = (1, 8, 32)
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(GENERATION_BARS)
    for i, (label, where) in enumerate(GENERATION_BARS.items()):
        measured = [j for j, b in enumerate(batches) if b in where]  # batch 32: the Pallas steps only
        ratios = [tok_s(*where[batches[j]][0]) / tok_s(*where[batches[j]][1]) for j in measured]
        xs = [j + (i - (len(GENERATION_BARS) - 1) / 2) * width for j in measured]
        ax.bar(xs, ratios, width, label=label, color=f"C{i}")
        for x, r in zip(xs, ratios, strict=True):
            ax.annotate(f"{r:.2f}", (x, r), fontsize=7, ha="center", va="bottom")
    for j, target in enumerate((3.0, 2.0)):
        ax.hlines(target, j - 0.45, j + 0.45, colors="k", linestyles="--", lw=0.8)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks(range(len(batches)), [f"batch {b}" for b in batches])
    ax.set_ylabel("tokens/s over dense JAX (dashed: target)")
    ax.set_title("1B-class decoder, random weights, pruned b=64 d=1/8, bf16, H200", fontsize=9)
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    dest = os.path.join(out, "decode_generation.png")
    fig.savefig(dest, dpi=110)
    return dest


def plot_minilm_speed(path: str, out: str) -> str:
    """``check_minilm.py --speed``'s cell as horizontal bars: ms per call of sentence-transformers fp16 and of each
    JAX encoder (the jitted loop's time and the back-to-back calls'), each labelled with its speedup over torch and
    over the dense encoder with the same attention (loop over loop)."""
    with open(path) as f:
        doc = json.load(f)
    cell = next((r for r in doc["results"] if r["label"].startswith("encoder speed") and r.get("ok")), None)
    if cell is None:
        raise ValueError(f"{path}: no passed 'encoder speed' cell (check_minilm.py --speed writes it)")
    m = cell["metrics"]
    keys = [k[: -len("_loop_ms")] for k in m if k.endswith("_loop_ms")]
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(keys) + 1.6))
    y = np.arange(len(keys) + 1)
    ax.barh(y[0], m["torch_fp16_ms"], color="0.6", label="torch fp16 (eager, CUDA events)")
    ax.barh(y[1:] - 0.2, [m[k + "_loop_ms"] for k in keys], height=0.4, label="JAX bf16: one jitted loop")
    ax.barh(y[1:] + 0.2, [m[k + "_calls_ms"] for k in keys], height=0.4, label="JAX bf16: back-to-back calls")
    for i, k in enumerate(keys, 1):
        same = "dense_" + k.rsplit("_", 1)[1]
        ax.text(max(m[k + "_loop_ms"], m[k + "_calls_ms"]) + 0.05, i,
                f"{m[k + '_loop_vs_torch']:.2f}x torch, {m[same + '_loop_ms'] / m[k + '_loop_ms']:.2f}x dense",
                va="center", fontsize=8)  # fmt: skip
    names = [re.sub(r"b(\d+)_d1_(\d+)", r"b=\1 d=1/\2", k).replace("_", " ").rsplit(" ", 1) for k in keys]
    ax.set_yticks(y, ["sentence-transformers fp16"] + [f"{model}, {attention}" for model, attention in names])
    ax.invert_yaxis()
    ax.set_xlabel(f"ms per call ({m['batch']} sentences x {m['length']} tokens)")
    ax.set_xlim(0, 1.75 * max(m["torch_fp16_ms"], *(m[k + "_calls_ms"] for k in keys)))
    ax.set_title(f"all-MiniLM-L6-v2 encoder, bf16 JAX vs fp16 torch ({doc['meta'].get('device', '?')})", fontsize=9)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    dest = os.path.join(out, "model_encoder_vs_torch.png")
    fig.savefig(dest, dpi=110)
    return dest


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", nargs="+", default=None, help="`blocksparse bench --json` files, merged")
    ap.add_argument("--matmul", default="benchmarks/results/matmul_h200_run4.json")
    ap.add_argument("--gnn", default="benchmarks/results/gnn_h200_run2.json")
    ap.add_argument("--mosaic", default="benchmarks/results/mosaic_persistent_h200_run3.json")
    ap.add_argument("--sharded-gnn", default="benchmarks/results/sharded_gnn_h200x2_run4.json")
    ap.add_argument(
        "--sdd",
        nargs="+",
        default=["benchmarks/results/mosaic_sdd_h200_run1.json", "benchmarks/results/mosaic_sdd_h200_run2.json"],
    )
    ap.add_argument(
        "--decode",
        nargs="+",
        default=["benchmarks/results/decode_stream_products_h200.json"],  # d = 1/4, 1/16 (1/8: the table)
    )
    ap.add_argument("--minilm-speed", default="benchmarks/results/check_minilm_speed_h200.json")
    ap.add_argument("--gnn-full", default="benchmarks/results/gnn_full_h200.json")
    ap.add_argument("--gnn-runs", nargs="*", default=["benchmarks/results/gnn_full_run2_h100.json"],
                    help="more gnn-graphs runs, each drawn as --gnn-full is, named after its JSON")  # fmt: skip
    ap.add_argument("--out", default="docs/img")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if args.bench:
        docs = []
        for path in args.bench:
            with open(path) as f:
                docs.append(json.load(f))
        merged = {"meta": docs[0].get("meta", {}), "results": [r for d in docs for r in d.get("results", [])]}
        dests = figures(merged, args.out)
    else:
        dests = [plot_matmul(args.matmul, args.out), plot_gnn(args.gnn, args.out),
                 plot_mosaic(args.mosaic, args.out), plot_sharded_gnn(args.sharded_gnn, args.out),
                 plot_sdd(args.sdd, args.out), plot_decode_products(args.decode, args.out),
                 plot_decode_generation("benchmarks/results", args.out),
                 plot_minilm_speed(args.minilm_speed, args.out), plot_gnn_full(args.gnn_full, args.out),
                 *(plot_gnn_full(p, args.out, os.path.basename(p)[:-5] + ".png") for p in args.gnn_runs)]  # fmt: skip
    for dest in dests:
        print(dest)


if __name__ == "__main__":
    main()
