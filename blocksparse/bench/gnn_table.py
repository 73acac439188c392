"""The full table of a ``gnn-graphs`` run, in markdown: what docs/gnn.md shows, computed from the run's JSON alone.

:func:`full_table` gives one row per graph, op and pass: per dtype, the time of the backend that the default runs with
the tuned data made from this run (:func:`cells`: :func:`blocksparse.ops.gnn.order.choice` over what
:func:`blocksparse.bench.gnn_graphs.measured_from` reads from the JSON, which is what
:data:`blocksparse.ops.gnn.tuned.CHOICES` holds: the faster backend of the family's cell, SpMM's mean by its sum, min
by max, a tie kept by the kernels), the fastest peer's time over it, and bfloat16 over float32.
:func:`targets` checks the run against its targets: the default at least as fast as the fastest peer in every cell,
bfloat16 never slower than float32, max on the power-law graph within 1.0 ms in float32, attention memory 40x below
PyG's; each cell that misses one is listed with by how much, and with its op's smallest traffic at the copy rate
(:func:`smallest_traffic`: the inputs read once, the outputs written once): where the time is many times that, bytes
do not bound the op.

    import json
    from blocksparse.bench import gnn_table
    doc = json.load(open("benchmarks/results/gnn_full_h200.json"))
    print(gnn_table.full_table(doc)); print(gnn_table.targets(doc))
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import re

from ..ops.gnn import order
from .gnn_graphs import _FAMILY, GRAPHS, OPS, PASSES, faster, measured_from

__all__ = [
    "COPY_RATE",
    "Cell",
    "cells",
    "choice_table",
    "run_copy_rate",
    "default_backend",
    "faster_rows",
    "full_table",
    "gather_traffic",
    "render",
    "smallest_traffic",
    "targets",
]

#: Bytes a second the H200 copies device memory at (a ``jnp`` copy of arrays of 0.1 to 4 GB, read and written:
#: docs/benchmarks.md, "GNN operations"): the rate the smallest traffic is priced at in a run that did not measure
#: its own (``meta["copy_bytes_per_s"]``, :func:`~blocksparse.bench.gnn_graphs.measure_copy_rate`; see
#: :func:`run_copy_rate`).
COPY_RATE = 3.5e12
DTYPES = ("float32", "bfloat16")
NAMES = {"spmm_sum": "SpMM sum", "spmm_mean": "SpMM mean", "spmm_gcn": "SpMM GCN", "max": "max", "min": "min",
         "gatv2": "GATv2", "graph_attention": "graph attention"}  # fmt: skip
PEER_NAMES = {"torch-csr": "cuSPARSE", "pyg-scatter": "PyG", "segment": "XLA segment", "bcsr": "JAX BCSR"}
#: Feature arrays an op reads (besides the graph): SpMM, max and min ``x``; GATv2 the sources' and destinations'
#: projections; graph attention ``q``, ``k``, ``v``.
INPUTS = {"spmm_sum": 1, "spmm_mean": 1, "spmm_gcn": 1, "max": 1, "min": 1, "gatv2": 2, "graph_attention": 3}
ATTENTION = ("gatv2", "graph_attention")
#: The targets: attention memory at least this many times below PyG's; the power-law graph's float32 max forward
#: within this many ms.
MEMORY_TARGET = 40.0
MAX_TARGET_MS = 1.0


@dataclasses.dataclass(frozen=True)
class Cell:
    """One cell of the run as the table shows it: the backend the tuned data picks and its time.

    ``backend`` is ``None`` where the cell ran one backend only (the other failed, or a timing was a single call):
    ``ms`` is then the default's as it ran, ``implementation`` what ran."""

    graph: str
    dtype: str
    op: str
    pass_: str
    metrics: dict
    backend: str | None
    ms: float | None
    feat: int = 128  # features per node (attention: heads x head size)
    follows: str | None = None  # the measured graph whose cell picked the backend (None: the default order)

    @property
    def peer(self) -> tuple[str, float] | None:
        """The fastest peer and its time (``None``: no peer ran)."""
        m = self.metrics
        return (m["best_peer"], m["best_peer_ms"]) if m.get("best_peer_ms") else None

    @property
    def speedup(self) -> float | None:
        """The fastest peer's time over the default's (above 1: the default is faster)."""
        return None if self.peer is None or not self.ms else self.peer[1] / self.ms

    @property
    def mem_bytes(self) -> int | None:
        """The picked backend's peak device memory (the default's as it ran without a pick)."""
        m = self.metrics
        return m.get(f"{self.backend}_mem_bytes") if self.backend else m.get("mem_bytes")


def _key(r: dict) -> tuple[str, str, str, str]:
    p = r["params"]
    return p["graph"], p["dtype"], p["op"], p["pass"]


def _rows(doc: dict) -> list[dict]:
    """The run's cells of the full table's graphs (a broken suite's row, without a graph, is none)."""
    return [r for r in doc.get("results", [])
            if r.get("suite") == "gnn-graphs" and r.get("params", {}).get("graph") in GRAPHS]  # fmt: skip


def _measured(doc: dict) -> dict:
    """``(graph, dtype, op, pass) -> metrics`` of the run's cells as generated that passed."""
    return {_key(r): r["metrics"] for r in _rows(doc)
            if r.get("ok") and not r.get("skipped") and r["params"].get("order") == "as generated"}  # fmt: skip


def _pick(table: dict, metrics: dict, dtype: str, op: str, pass_: str, feat: int) -> order.Choice:
    """What :func:`blocksparse.ops.gnn.order.choice` picks for a cell on the graph of its statistics with ``table``'s
    measurements. SpMM under grad without a forward + backward measurement near: the forward's (the library takes
    each product's own, ``g.T``'s by its in-degrees, which the cell does not record; ``g``'s stand in)."""
    stats = order.GraphStats(metrics["nodes"], metrics["edges"], metrics["max_in_degree"])
    family, norm = _FAMILY[op], ("both" if op == "spmm_gcn" else None)
    c = order.choice(family, stats, feat, dtype, pass_, norm=norm, table=table)
    if family == "spmm" and pass_ == "fwd+bwd" and c.measured is None:
        c = order.choice(family, stats, feat, dtype, "fwd", norm=norm, table=table)
    return c


def cells(doc: dict) -> dict[tuple[str, str, str, str], Cell]:
    """``(graph, dtype, op, pass) -> Cell`` for every cell of ``doc`` that passed, as generated: the backend the
    default runs with the tuned data made from ``doc`` (``measured_from``: the graph's own measurement, else the
    nearest measured graph's within the coverage, else the default order), and its time in the cell."""
    table = measured_from(doc, "this run")
    feats = {_key(r): r["params"].get("feat", 128) for r in _rows(doc)}
    out = {}
    for key, m in _measured(doc).items():
        c = _pick(table, m, key[1], key[2], key[3], feats[key])
        backend = c.impls[0] if m.get(f"{c.impls[0]}_loop_ms") else None
        ms = m[f"{backend}_loop_ms"] if backend else m.get("loop_ms")
        out[key] = Cell(*key, m, backend, ms, feats[key], c.measured.graph if c.measured else None)
    return out


def default_backend(doc: dict, graph: str, dtype: str, op: str, pass_: str) -> str | None:
    """The backend the default runs for a cell of ``doc`` with the tuned data made from it (:func:`cells`); ``None``
    where the cell did not run, or ran one backend only."""
    c = cells(doc).get((graph, dtype, op, pass_))
    return None if c is None else c.backend


def smallest_traffic(op: str, pass_: str, nodes: int, edges: int, feat: int, itemsize: int) -> int:
    """Bytes an op moves at least, however it is written: its feature arrays read once and its outputs written once,
    in the features' dtype, and the graph's CSR once (int32 edge ids and offsets; the norms' factors come from the
    degrees). ``fwd+bwd`` adds the cotangent read, every input's gradient written, and but for max / min (whose
    backward scatters to the arg-max) the transposed graph's CSR."""
    rows = nodes * feat * itemsize
    csr = 4 * edges + 4 * (nodes + 1)
    k = INPUTS[op]
    fwd = (k + 1) * rows + csr
    if pass_ == "fwd":
        return fwd
    return fwd + (1 + k) * rows + (0 if op in ("max", "min") else csr)


#: Feature arrays an op gathers a row of per edge: SpMM, max and min ``x``; GATv2 the sources' projection; graph
#: attention ``k`` and ``v``.
GATHERED = {"spmm_sum": 1, "spmm_mean": 1, "spmm_gcn": 1, "max": 1, "min": 1, "gatv2": 1, "graph_attention": 2}


def gather_traffic(op: str, pass_: str, edges: int, feat: int, itemsize: int) -> int:
    """Bytes of a source row gathered per edge from DRAM, for each array the op gathers (``fwd+bwd``: the backward
    gathers as many again): what a kernel moves when no gathered row is still in the cache, an upper figure where the
    features outgrow the L2 and rows repeat; a time below it at the copy rate means rows were served by the L2."""
    return edges * feat * itemsize * GATHERED[op] * (1 if pass_ == "fwd" else 2)


def run_copy_rate(doc: dict) -> float:
    """Bytes a second the run's device copies at: what the run measured, else the H200's :data:`COPY_RATE`."""
    return doc.get("meta", {}).get("copy_bytes_per_s") or COPY_RATE


def _gather_s(c: Cell, rate: float) -> float:
    item = 2 if c.dtype == "bfloat16" else 4
    return gather_traffic(c.op, c.pass_, c.metrics["edges"], c.feat, item) / rate


def _traffic_s(c: Cell, rate: float) -> float:
    m = c.metrics
    item = 2 if c.dtype == "bfloat16" else 4
    return smallest_traffic(c.op, c.pass_, m["nodes"], m["edges"], c.feat, item) / rate


def _ms(x: float | None) -> str:
    if x is None:
        return ""
    return f"{x:.3f}" if x < 10 else f"{x:.2f}" if x < 100 else f"{x:.1f}"


def _failed(doc: dict) -> dict:
    return {_key(r): r for r in _rows(doc) if not r.get("ok")}


def full_table(doc: dict) -> str:
    """The markdown table: per graph, op and pass, per dtype the picked backend and its device ms (one jitted loop),
    the fastest peer's time over it with the peer's name, and bfloat16 over float32 (below 1: bfloat16 faster).
    A blank cell was not run; ``failed`` failed its check or its run; a time without a backend is the default as it
    ran (the cell could not tell the faster backend)."""
    table = cells(doc)
    failed = _failed(doc)
    head = ("| graph | op, pass | float32 | best peer / float32 | bfloat16 | best peer / bfloat16 "
            "| bfloat16 / float32 |")  # fmt: skip
    lines = [head, "|" + "---|" * 7]
    for graph in GRAPHS:
        first = True
        for op in OPS:
            for pass_ in PASSES:
                row = [graph if first else "", f"{NAMES[op]} {pass_}"]
                first = False
                for dtype in DTYPES:
                    c = table.get((graph, dtype, op, pass_))
                    if c is None:
                        row += ["failed" if (graph, dtype, op, pass_) in failed else "", ""]
                        continue
                    row.append(" ".join(x for x in (c.backend or "", _ms(c.ms)) if x))
                    s = c.speedup
                    row.append("" if s is None else f"{s:.2f} ({PEER_NAMES.get(c.peer[0], c.peer[0])})")
                f32, bf16 = (table.get((graph, dt, op, pass_)) for dt in DTYPES)
                ok = f32 is not None and bf16 is not None and f32.ms and bf16.ms
                row.append(f"{bf16.ms / f32.ms:.2f}" if ok else "")
                lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


#: The tuned data's families, as the docs name them, and the op whose cells pick each.
FAMILIES = {"spmm": ("SpMM", "spmm_sum"), "spmm_gcn": ("SpMM with the GCN norm", "spmm_gcn"),
            "aggregate": ("max / min", "max"), "gatv2": ("GATv2", "gatv2"),
            "graph_attention": ("graph attention", "graph_attention")}  # fmt: skip


def choice_table(doc: dict) -> str:
    """The markdown table of which backend the tuned data made from ``doc`` runs first, per family, dtype and pass:
    the graphs where XLA was faster, and those where the kernels were (a tie, XLA faster by at most
    :data:`~blocksparse.bench.gnn_graphs.TIE`, noted); a graph whose cell could not tell is in neither."""
    measured = _measured(doc)
    graphs = GRAPHS
    lines = ["| family, dtype, pass | XLA first | the kernels first |", "|---|---|---|"]
    for name, op in FAMILIES.values():
        for dtype in DTYPES:
            for pass_ in PASSES:
                picks = {
                    g: faster(measured[(g, dtype, op, pass_)]) for g in graphs if (g, dtype, op, pass_) in measured
                }
                xla = [g for g, p in picks.items() if p and p[0] == "xla"]
                ours = [g + (" (a tie)" if p[1] else "") for g, p in picks.items() if p and p[0] == "pallas"]
                lines.append(f"| {name}, {dtype}, {pass_} | {', '.join(xla)} | {', '.join(ours)} |")
    return "\n".join(lines)


def _where(c: Cell) -> str:
    return f"{c.graph} {c.dtype} {NAMES[c.op]} {c.pass_}"


def targets(doc: dict) -> str:
    """The run against its targets, as markdown bullets: counts, then each miss with by how much and what bounds it
    (the op's smallest traffic at the run's :func:`run_copy_rate`; for memory, what the program returns); back-to-back
    calls against the loop."""
    table = cells(doc)
    rate = run_copy_rate(doc)
    expected = len(GRAPHS) * len(OPS) * len(PASSES) * len(DTYPES)
    cut = len(doc.get("meta", {}).get("cut_short") or ())
    out = [f"- **{len(table)} of {expected} cells** ran and passed their checks ({len(_failed(doc))} failed, "
           f"{expected - len(table) - len(_failed(doc))} not yet run, of which {cut} cut short by a command's time "
           "limit)."]  # fmt: skip
    if doc.get("meta", {}).get("copy_bytes_per_s"):
        out.append(f"- **The copy rate** the run measured, the bytes below priced at: {rate / 1e12:.2f} TB/s.")
    peered = [c for c in table.values() if c.speedup is not None]
    misses = sorted((c for c in peered if c.speedup < 1), key=lambda c: c.speedup)
    out.append(f"- **The default at least as fast as the fastest peer in {len(peered) - len(misses)} of "
               f"{len(peered)} cells** where a peer ran.")  # fmt: skip
    for c in misses:
        name, peer_ms = c.peer
        t, rows = _traffic_s(c, rate) * 1e3, _gather_s(c, rate) * 1e3
        out.append(
            f"  - {_where(c)}: {c.backend or 'as run'} {_ms(c.ms)} against {PEER_NAMES.get(name, name)} "
            f"{_ms(peer_ms)} ms ({c.speedup:.2f}, {1e3 * (c.ms - peer_ms):.0f} µs); at the copy rate the smallest "
            f"traffic takes {t:.3f} ms (the op {c.ms / t:.1f}x that), a row gathered per edge {rows:.3f}"
        )
    pairs = [(table[(g, "float32", o, p)], table[(g, "bfloat16", o, p)]) for (g, dt, o, p) in table
             if dt == "float32" and (g, "bfloat16", o, p) in table]  # fmt: skip
    slower = sorted(((a, b) for a, b in pairs if b.ms > a.ms), key=lambda ab: ab[0].ms / ab[1].ms)
    out.append(f"- **bfloat16 at least as fast as float32 in {len(pairs) - len(slower)} of {len(pairs)} pairs.**")
    for a, b in slower:
        out.append(f"  - {a.graph} {NAMES[a.op]} {a.pass_}: bfloat16 {_ms(b.ms)} against float32 {_ms(a.ms)} ms "
                   f"({b.ms / a.ms:.2f})")  # fmt: skip
    mx = table.get(("power-law", "float32", "max", "fwd"))
    if mx is None:
        out.append(f"- **max on the power-law graph, float32 forward:** not run yet (target {MAX_TARGET_MS} ms).")
    else:
        verdict = "met" if mx.ms <= MAX_TARGET_MS else f"missed by {100 * (mx.ms / MAX_TARGET_MS - 1):.0f}%"
        t = _traffic_s(mx, rate) * 1e3
        out.append(f"- **max on the power-law graph, float32 forward: {_ms(mx.ms)} ms** against {MAX_TARGET_MS} "
                   f"({verdict}; smallest traffic {t:.3f} ms at the copy rate).")  # fmt: skip
    mem = [c for c in table.values() if c.op in ATTENTION and c.metrics.get("pyg-scatter_mem_bytes") and c.mem_bytes]
    if mem:
        ratios = sorted(((c.metrics["pyg-scatter_mem_bytes"] / c.mem_bytes, c) for c in mem), key=lambda rc: rc[0])
        below = [(r, c) for r, c in ratios if r < MEMORY_TARGET]
        out.append(f"- **Attention memory at least {MEMORY_TARGET:.0f}x below PyG's in {len(ratios) - len(below)} of "
                   f"{len(ratios)} cells** where PyG ran ({ratios[0][0]:.1f}x to {ratios[-1][0]:.1f}x).")  # fmt: skip
        for r, c in below:
            pyg, floor = c.metrics["pyg-scatter_mem_bytes"], _returned_bytes(c)
            out.append(f"  - {_where(c)}: {r:.1f}x ({c.mem_bytes / 2**20:,.0f} MiB against {pyg / 2**20:,.0f}); what "
                       f"it returns alone, {floor / 2**20:,.0f} MiB, is PyG / {pyg / floor:.1f}")  # fmt: skip
    slow_calls = [c for c in table.values() if _calls_gap(c) is not None]
    out.append(f"- **Back-to-back calls** (`calls_ms`, the default as it ran) within 15% or 0.05 ms of the loop in "
               f"{len([c for c in table.values() if c.metrics.get('calls_ms')]) - len(slow_calls)} cells"
               + ("." if not slow_calls else "; above it in:"))  # fmt: skip
    for c in slow_calls:
        m = c.metrics
        out.append(f"  - {_where(c)}: {_ms(m['calls_ms'])} against {_ms(m['loop_ms'])} ms")
    return "\n".join(out)


def _returned_bytes(c: Cell) -> int:
    """What the timed program returns, which its memory counts: the output, and with ``fwd+bwd`` every input's
    gradient, each ``N x F`` in the features' dtype (a floor of ``mem_bytes``, whatever the op keeps besides)."""
    rows = c.metrics["nodes"] * c.feat * (2 if c.dtype == "bfloat16" else 4)
    return rows * (1 if c.pass_ == "fwd" else 1 + INPUTS[c.op])


def _calls_gap(c: Cell) -> float | None:
    m = c.metrics
    calls, loop = m.get("calls_ms"), m.get("loop_ms")
    if not calls or not loop or not math.isfinite(calls):
        return None
    gap = calls - loop
    return gap if gap > 0.05 and calls > 1.15 * loop else None


def faster_rows(doc: dict) -> str:
    """The body of a ``_FASTER`` table of :mod:`blocksparse.ops.gnn.tuned` for this run, as that file lays it out:
    per ``(family, dtype, pass)`` of :data:`~blocksparse.ops.gnn.tuned.CHOICES`, the faster backend on each graph of
    its columns (``"tie"`` where XLA won by at most :data:`~blocksparse.bench.gnn_graphs.TIE`, ``None`` where the
    cell cannot tell), from :func:`~blocksparse.bench.gnn_graphs.measured_from`."""
    from ..ops.gnn import tuned

    got = {k: {m.graph: ("tie" if m.note else m.faster) for m in v} for k, v in measured_from(doc, "").items()}
    cols = [g["graph"] for g in tuned._GRAPHS]
    lines = ["    #" + " " * 42 + "".join(f"{c[:9]:>11}" for c in cols)]
    for key in tuned._H200_FASTER:  # the keys every table has, in its order
        row = ", ".join(f"{repr(got.get(key, {}).get(c)):>9}" for c in cols)
        lines.append(f"    {repr(key) + ':':<44} ({row}),")
    return "\n".join(lines)


#: A generated block of a markdown file: ``<!-- gnn_table.NAME [RUN.json] -->``, the text NAME prints for that run's
#: JSON (by default the run the tuned data names), then ``<!-- end -->`` (a new block may hold nothing yet).
BLOCK = re.compile(
    r"<!-- gnn_table\.(\w+)(?: (\S+\.json))? -->\n(?:((?:(?!<!-- gnn_table\.).)*?)\n)?<!-- end -->", re.S
)
MARKER = "<!-- gnn_table."


def render(text: str, results: str | pathlib.Path | None = None, run: str | None = None) -> str:
    """``text`` with every generated block (:data:`BLOCK`) remade from its run's JSON in ``results`` (default: the
    repository's ``benchmarks/results``): ``run`` where the marker names none (default:
    :data:`blocksparse.ops.gnn.tuned.FULL_RUN`). A marker that no ``<!-- end -->`` closes before the next one is a
    ``ValueError`` (nothing is rewritten)::

        python -m blocksparse.bench.gnn_table docs/gnn.md      # rewrites the file's blocks in place"""
    from ..ops.gnn import tuned

    results = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "results" if results is None else results
    names = {"full_table": full_table, "targets": targets, "choice_table": choice_table}
    docs: dict[str, dict] = {}

    def block(m: re.Match) -> str:
        name, json_name = m.group(1), m.group(2) or run or tuned.FULL_RUN
        if name not in names:
            raise ValueError(f"expected a block of one of {sorted(names)}; got gnn_table.{name}")
        if json_name not in docs:
            docs[json_name] = json.loads((pathlib.Path(results) / json_name).read_text())
        head = m.group(0)[: m.group(0).index(" -->\n") + 5]
        return f"{head}{names[name](docs[json_name])}\n<!-- end -->"

    opened = {m.start() for m in BLOCK.finditer(text)}
    stray = sorted({m.start() for m in re.finditer(re.escape(MARKER), text)} - opened)
    if stray:
        line = text.count("\n", 0, stray[0]) + 1
        raise ValueError(f"expected each {MARKER}NAME [RUN.json] --> line to start a block that a <!-- end --> line "
                         f"closes before the next marker; got one at line {line} that does not")  # fmt: skip
    return BLOCK.sub(block, text)


if __name__ == "__main__":
    import sys

    for path in sys.argv[1:] or ["docs/gnn.md"]:
        f = pathlib.Path(path)
        old = f.read_text()
        new = render(old)
        if new != old:
            f.write_text(new)
        print(f"{path}: {len(BLOCK.findall(old))} blocks, {'rewritten' if new != old else 'unchanged'}")
