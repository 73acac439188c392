"""The table on stdout and the figures (matplotlib, the ``bench`` extra) of ``blocksparse bench``."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

from ._core import Result

INSTALL_HINT = "pip install 'blocksparse[bench]'"


def _fmt(value, spec: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    try:
        return format(value, spec)
    except (TypeError, ValueError):
        return str(value)


def _generic_columns(results: Sequence[Result], limit: int = 8):
    """Numeric metrics in order of first appearance, for a suite that declares no ``COLUMNS``."""
    keys: dict[str, None] = {}
    for r in results:
        for k, v in r.metrics.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                keys.setdefault(k)
    return tuple((k, k, ".4g") for k in list(keys)[:limit])


def table(results: Sequence[Result], columns: dict[str, Sequence[tuple[str, str, str]] | None]) -> str:
    """One block per suite: label, status, the suite's columns, the implementation that ran.

    A failed cell says ``FAILED`` and its reason in place of the metrics; a skipped one ``skipped`` and why.
    """
    lines = []
    for suite in dict.fromkeys(r.suite for r in results):
        rows = [r for r in results if r.suite == suite]
        cols = tuple(columns.get(suite) or _generic_columns(rows))
        header = ["cell", "status", *(c[0] for c in cols), "implementation"]
        body = []
        for r in rows:
            if r.skipped:
                body.append([r.label, "skipped", f"{r.skipped}"])
            elif r.ok:
                vals = [_fmt(r.metrics.get(key), spec) for _, key, spec in cols]
                body.append([r.label, "ok", *vals, str(r.metrics.get("implementation", "-"))])
            else:
                body.append([r.label, "FAILED", f"{r.error}"])
        widths = [
            max([len(header[i]), *(len(b[i]) for b in body if len(b) == len(header))]) for i in range(len(header))
        ]
        lines.append(f"\n[{suite}]")
        if any(r.ok and not r.skipped for r in rows):
            lines.append(_row(header, widths))
        for b in body:
            if len(b) == len(header):
                lines.append(_row(b, widths))
            else:  # failed or skipped: the reason runs to the end of the line
                lines.append(f"{b[0].ljust(widths[0])}  {b[1]}  {b[2]}")
    return "\n".join(lines)


def _row(values, widths) -> str:
    """Label and status (the first two) and the implementation (the last) left-aligned, numbers right-aligned."""
    last = len(values) - 1
    pairs = enumerate(zip(values, widths, strict=True))
    cells = (v.ljust(w) if i < 2 or i == last else v.rjust(w) for i, (v, w) in pairs)
    return "  ".join(cells).rstrip()


def summary(results: Sequence[Result], seconds: float | None = None) -> str:
    failed = [r for r in results if not r.ok]
    skipped = sum(1 for r in results if r.skipped)
    text = f"\n{len(results)} cells, {len(results) - len(failed) - skipped} ok, {len(failed)} failed"
    if skipped:
        text += f", {skipped} skipped"
    if seconds is not None:
        text += f" in {seconds:.1f} s"
    for r in failed:
        text += f"\n  FAILED {r.suite}: {r.label}: {r.error}"
    return text


# -- figures ------------------------------------------------------------------------------------------
def require_matplotlib():
    """Import matplotlib with the Agg backend, or raise ``ImportError`` naming the extra to install."""
    try:
        import matplotlib
    except ImportError:
        raise ImportError(f"--plot needs matplotlib: {INSTALL_HINT}") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot(doc: dict, out_dir: str) -> list[str]:
    """Figures from a ``blocksparse bench --json`` document into ``out_dir``; returns the paths written.

    ``matmul``: per ``n``, TFLOP/s (on the non-zeros) against density, one line per block size,
    dense ``jnp.dot`` as a horizontal line, for the static and the dynamic product and for the IPU
    model's estimate (the PopSparse paper's figure). ``gnn``: the speedup of each op over the JAX
    segment-op reference. ``plan``: the IPU model's predicted speedup over dense per cell. ``model``: the
    Spearman correlation against density, and the encoder's and FFN's speedup over dense. The other suites: a
    bar per cell of the ratio named in :data:`BARS`.
    """
    plt = require_matplotlib()
    os.makedirs(out_dir, exist_ok=True)
    rows = [r for r in doc.get("results", []) if r.get("ok")]
    meta = doc.get("meta", {})
    where = f"{meta.get('device', '?')}, jax {meta.get('jax', '?')}"
    paths = []
    paths += _plot_matmul(plt, [r for r in rows if r["suite"] == "matmul"], out_dir, where)
    paths += _plot_bars(plt, [r for r in rows if r["suite"] == "gnn"], "speedup_vs_reference",
                        "speedup over the JAX segment-op reference", f"GNN ops ({where})",
                        os.path.join(out_dir, "gnn_vs_reference.png"))  # fmt: skip
    paths += _plot_bars(plt, [r for r in rows if r["suite"] == "plan"], "ipu_speedup",
                        "predicted speedup over dense (IPU model)", "IPU planner estimates",
                        os.path.join(out_dir, "plan_speedup.png"))  # fmt: skip
    paths += _plot_model(plt, [r for r in rows if r["suite"] == "model"], out_dir)
    for suite, (key, ylabel) in BARS.items():
        paths += _plot_bars(plt, [r for r in rows if r["suite"] == suite], key, ylabel, f"{suite} ({where})",
                            os.path.join(out_dir, f"{suite.replace('-', '_')}.png"))  # fmt: skip
    return paths


#: The bar figure of each other suite: the metric and its axis label.
BARS = {
    "mosaic": ("speedup_vs_triton", "Mosaic speedup over Triton"),
    "dynamic": ("loop_vs_static", "dynamic time / static time"),
    "sharded": ("speedup_vs_one_device", "speedup over one device"),
    "training": ("loop_vs_dense", "step time / dense step time"),
    "gnn-variants": ("best_speedup", "best variant's speedup over the default"),
    "gnn-graphs": ("speedup_vs_segment", "speedup over the segment ops"),
    "decode": ("speedup_vs_dense", "speedup over dense"),
}


def _plot_model(plt, rows, out_dir) -> list[str]:
    """Spearman vs density (one line per block size, scope and balance) and encoder/FFN speedup vs density."""
    quality = [r for r in rows if r["params"].get("kind") == "quality"]
    speed = [r for r in rows if r["params"].get("kind") in ("encoder", "ffn") and r["params"].get("block_size")]
    balances = sorted({r["params"].get("balance") for r in quality + speed}, key=str)  # None before "cols"
    marker = {None: "o", "rows": "^", "cols": "v"}
    paths = []
    if quality:
        fig, ax = plt.subplots(figsize=(6, 4))
        for scope, style in (("layer", "-"), ("global", "--"), ("reconstruct", ":")):
            for b, balance in ((b, a) for b in sorted({r["params"]["block_size"] for r in quality}) for a in balances):
                pts = sorted((r["params"]["density"], r["metrics"]["spearman"]) for r in quality
                             if r["params"]["block_size"] == b and r["params"]["scope"] == scope
                             and r["params"].get("balance") == balance)  # fmt: skip
                if pts:
                    label = f"b={b} {scope}" + (f" {balance}" if balance else "")
                    ax.plot(*zip(*pts, strict=True), style, marker=marker[balance], label=label)
            pts = sorted((r["params"]["density"], r["metrics"]["recovered_spearman"]) for r in quality
                         if r["params"]["scope"] == scope and "recovered_spearman" in r["metrics"])  # fmt: skip
            if pts:
                ax.plot(*zip(*pts, strict=True), style, marker="s", color="k", label=f"{scope} recovered")
        ax.set(xscale="log", xlabel="density", ylabel="Spearman vs dense", title="all-MiniLM-L6-v2 block-pruned")
        ax.legend(fontsize=7)
        paths.append(os.path.join(out_dir, "model_quality.png"))
        fig.savefig(paths[-1], dpi=120, bbox_inches="tight")
        plt.close(fig)
    if speed:
        fig, ax = plt.subplots(figsize=(6, 4))
        for kind, style in (("encoder", "-"), ("ffn", "--")):
            for b, balance in ((b, a) for b in sorted({r["params"]["block_size"] for r in speed}) for a in balances):
                pts = sorted((r["params"]["density"], r["metrics"]["speedup_vs_dense"]) for r in speed
                             if r["params"]["kind"] == kind and r["params"]["block_size"] == b
                             and r["params"].get("balance") == balance)  # fmt: skip
                if pts:
                    label = f"{kind} b={b}" + (f" {balance}" if balance else "")
                    ax.plot(*zip(*pts, strict=True), style, marker=marker[balance], label=label)
        ax.axhline(1.0, color="gray", lw=1)
        ax.set(xscale="log", xlabel="density", ylabel="speedup vs dense (Timer.loop)", title="model speed")
        ax.legend(fontsize=7)
        paths.append(os.path.join(out_dir, "model_speed.png"))
        fig.savefig(paths[-1], dpi=120, bbox_inches="tight")
        plt.close(fig)
    return paths


def _plot_matmul(plt, rows, out_dir, where) -> list[str]:
    paths = []
    for n in sorted({r["params"]["n"] for r in rows}):
        sel = [r for r in rows if r["params"]["n"] == n]
        dense = next((r for r in sel if r["params"]["kind"] == "dense"), None)
        panels = [("static", "tflops", "static pattern"), ("dynamic", "tflops", "dynamic pattern"),
                  ("static", "ipu_tflops", "IPU model estimate")]  # fmt: skip
        fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
        p0 = sel[0]["params"]
        for ax, (kind, key, title) in zip(axes[0], panels, strict=True):
            cells = [r for r in sel if r["params"]["kind"] == kind and r["metrics"].get(key) is not None]
            for b in sorted({r["params"]["b"] for r in cells}):
                line = sorted((r for r in cells if r["params"]["b"] == b), key=lambda r: r["params"]["density"])
                ds = [r["params"]["density"] for r in line]
                ax.plot(ds, [r["metrics"][key] for r in line], "o-", label=f"b={b}")
            if key == "ipu_tflops":  # the dynamic plans' estimates beside the static ones, dotted
                dyn = [r for r in sel if r["params"]["kind"] == "dynamic" and r["metrics"].get(key) is not None]
                for b in sorted({r["params"]["b"] for r in dyn}):
                    line = sorted((r for r in dyn if r["params"]["b"] == b), key=lambda r: r["params"]["density"])
                    ds = [r["params"]["density"] for r in line]
                    ax.plot(ds, [r["metrics"][key] for r in line], "x:", label=f"b={b} dynamic")
            if dense is not None and dense["metrics"].get(key) is not None:
                ax.axhline(dense["metrics"][key], color="k", ls="--", lw=1, label="dense")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("density")
            ax.set_ylabel("TFLOP/s on the non-zeros")
            ax.set_title(title, fontsize=10)
            if ax.lines:
                ax.legend(fontsize=7)
        fig.suptitle(f"{p0['m']} x {p0['k']} @ {p0['k']} x {n}, {p0['dtype']} ({where})", fontsize=10)
        fig.tight_layout()
        path = os.path.join(out_dir, f"matmul_n{n}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def _plot_bars(plt, rows, key, ylabel, title, path) -> list[str]:
    rows = [r for r in rows if r["metrics"].get(key) is not None]
    if not rows:
        return []
    fig, ax = plt.subplots(figsize=(max(5, 1.1 * len(rows)), 4))
    ax.bar(range(len(rows)), [r["metrics"][key] for r in rows])
    ax.axhline(1.0, color="k", ls="--", lw=1)
    ax.set_xticks(range(len(rows)), [r["label"] for r in rows], rotation=25, ha="right", fontsize=7)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]
