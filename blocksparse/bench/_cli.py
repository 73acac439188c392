"""``blocksparse bench``: run suites of :class:`~blocksparse.bench.Cell`, print a table, write JSON and figures.

Suites are imported lazily by name (``blocksparse.bench.<suite>``), so a suite whose module or
extras are missing fails on its own with a clear message while the others run.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
import os
import platform
import sys
import time
from collections.abc import Sequence

from ._core import Cell, Result, Timer, run_cell, write_json

#: Every suite; a suite ``a-b`` is the module ``blocksparse.bench.a_b``.
SUITES = (
    "matmul",
    "gnn",
    "plan",
    "model",
    "mosaic",
    "dynamic",
    "sharded",
    "training",
    "gnn-variants",
    "gnn-graphs",
    "decode",
)
#: ``--suite`` when none is given: the quick CPU-friendly suites (``model`` needs the ``models`` extra).
DEFAULT_SUITES = ("matmul", "gnn", "plan")
#: Timer settings (iters, trials) when ``--iters`` / ``--trials`` are not given.
QUICK_TIMER = dict(iters=5, trials=3)
FULL_TIMER = dict(iters=50, trials=5)

#: What to install when a suite's import fails for want of a package.
_EXTRAS = {"model": "pip install 'blocksparse[models]'"}


def parse_suites(text: str) -> list[str]:
    """``"matmul,gnn"`` -> ``["matmul", "gnn"]``; ``"all"`` -> every suite. Raises ``ValueError`` naming the choices."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise ValueError(f"expected a suite in {', '.join((*SUITES, 'all'))}; got {text!r}")
    out = []
    for name in names:
        if name == "all":
            out.extend(SUITES)
        elif name in SUITES:
            out.append(name)
        else:
            raise ValueError(f"expected a suite in {', '.join((*SUITES, 'all'))}; got {name!r}")
    return list(dict.fromkeys(out))


def load_suite(name: str, *, full: bool) -> tuple[list[Cell], object | None, str | None]:
    """The suite's cells and module, or ``([], None, reason)`` when its module or its extras are missing."""
    path = f"blocksparse.bench.{module_name(name)}"
    try:
        module = importlib.import_module(path)
    except ImportError as e:
        missing = getattr(e, "name", None)
        if missing == path:
            return [], None, f"suite {name!r} is not available: no module {path} in this install"
        hint = _EXTRAS.get(name, "pip install 'blocksparse[bench]'")
        return [], None, f"suite {name!r} could not be imported: {' '.join(str(e).split())} ({hint})"
    try:
        cells = list(module.cells(full=full))
    except Exception as e:  # noqa: BLE001 - a broken suite must not stop the others
        hint = f" ({_EXTRAS[name]})" if isinstance(e, ImportError) and name in _EXTRAS else ""
        why = " ".join(f"{type(e).__name__}: {e}".split())
        return [], module, f"suite {name!r} could not list its cells: {why}{hint}"
    return cells, module, None


def module_name(suite: str) -> str:
    """``"gnn-variants"`` -> ``"gnn_variants"``: the suite's module in :mod:`blocksparse.bench`."""
    return suite.replace("-", "_")


def environment() -> dict:
    import jax

    dev = jax.devices()[0]
    return dict(
        jax=jax.__version__, platform=dev.platform, device=getattr(dev, "device_kind", str(dev)),
        devices=len(jax.devices()), python=platform.python_version(), host=platform.machine(),
        source=source_digest(), jax_constants=jax_constants(),
    )  # fmt: skip


def jax_constants() -> str:
    """How JAX passes the arrays a traced function closes over (a static graph's or pattern's index arrays) to the
    compiled program: ``"arguments"`` (``JAX_USE_SIMPLIFIED_JAXPR_CONSTANTS=1``, read when JAX is imported: copied
    to the device once per program) or ``"embedded"`` (JAX's default: compiled into the program, whose compilation
    then grows with their bytes)."""
    import jax

    return "arguments" if jax.config.jax_use_simplified_jaxpr_constants else "embedded"


@functools.cache
def source_digest() -> str:
    """The first 16 hex digits of a SHA-256 over the package's Python sources (their paths and bytes).

    Two runs with the same digest measured the same library code: what a resumed run (``resume=True`` of
    :func:`run_cells`) checks, and what ties a JSON in ``benchmarks/results/`` to the code that made it.
    """
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    digest = hashlib.sha256()
    paths = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        paths.extend(os.path.join(folder, f) for f in files if f.endswith(".py"))
    for path in sorted(paths):
        digest.update(os.path.relpath(path, root).replace(os.sep, "/").encode() + b"\0")
        with open(path, "rb") as f:
            digest.update(f.read() + b"\0")
    return digest.hexdigest()[:16]


#: What a resumed run must share with the JSON it continues: the machine, the library code, how JAX passes constants
#: (:func:`jax_constants`) and the timer.
RESUME_KEYS = ("jax", "platform", "device", "devices", "source", "jax_constants", "full", "iters", "trials")


def cell_key(suite: str, label: str, params: dict) -> str:
    """A cell's identity in a JSON document: its suite, label and parameters."""
    from ._core import _jsonable

    return json.dumps([suite, label, _jsonable(params)], sort_keys=True)


def _previous(json_path: str, meta: dict, keys: Sequence[str],
              accept_source: str | None = None) -> tuple[dict | None, dict[str, Result]]:  # fmt: skip
    """The document at ``json_path`` that a resumed run continues, and its finished results by :func:`cell_key`
    (``keys``: this run's cells').

    ``(None, {})`` when there is no file yet. Raises ``ValueError`` naming the expected and the actual value when
    the document was made on another machine, by other code or timer settings (:data:`RESUME_KEYS`), or holds a
    cell that this run does not list; a document whose ``source`` is ``accept_source`` is taken as this code's.
    Failed results are not kept: their cells run again.
    """
    if not os.path.exists(json_path):
        return None, {}
    try:
        with open(json_path) as f:
            doc = json.load(f)
        old_meta, rows = doc["meta"], list(doc["results"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"expected --json {json_path!r} to be a blocksparse bench document to resume; got {e}") from e
    for key in RESUME_KEYS:
        if key == "source" and accept_source is not None and old_meta.get(key) == accept_source:
            continue
        if old_meta.get(key) != meta.get(key):
            raise ValueError(
                f"cannot resume {json_path!r}: expected its {key} to be this run's {meta.get(key)!r}; got "
                f"{old_meta.get(key)!r} (a run resumes only on the same machine, code and timer; write a new file)"
            )
    wanted = set(keys)
    kept = {}
    for row in rows:
        if not row.get("ok"):  # a failed cell runs again; a suite that failed to load reports again
            continue
        key = cell_key(row["suite"], row["label"], row["params"])
        if key not in wanted:
            raise ValueError(
                f"cannot resume {json_path!r}: expected its cells to be among this run's {len(wanted)}; got "
                f"{row['suite']}: {row['label']} {row['params']}, which this run does not list"
            )
        kept[key] = Result(**row)
    return doc, kept


class _Progress:
    """tqdm on stderr when installed, else one plain line per cell on stderr."""

    def __init__(self, total: int, enabled: bool = True):
        self.total, self.done, self.bar = total, 0, None
        self.enabled = enabled
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None:
                self.bar = tqdm(total=total, file=sys.stderr, unit="cell", dynamic_ncols=True, leave=False)

    def start(self, cell: Cell):
        if self.bar is not None:
            self.bar.set_description_str(f"{cell.suite}: {cell.label}")

    def finish(self, result: Result):
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)
        elif self.enabled:
            status = "skipped" if result.skipped else "ok" if result.ok else "FAILED"
            print(f"[{self.done}/{self.total}] {result.suite}: {result.label}: {status} ({result.seconds:.1f} s)",
                  file=sys.stderr, flush=True)  # fmt: skip

    def close(self):
        if self.bar is not None:
            self.bar.close()


def run(
    suites: Sequence[str],
    *,
    full: bool = False,
    json_path: str | None = None,
    plot_dir: str | None = None,
    iters: int | None = None,
    trials: int | None = None,
    progress: bool = True,
    filters: Sequence[str] | None = None,
    out=None,
    resume: bool = False,
    stop_after_s: float | None = None,
    accept_source: str | None = None,
) -> int:
    """Run ``suites``; print the table to ``out`` (stdout); return 0, or 1 if any cell failed.

    ``--json`` is rewritten after every cell, so a run cut short keeps what it measured. ``filters``:
    run only the cells whose ``"suite: label"`` contains one of them (an error if none does). ``resume``:
    continue the run in ``json_path``; ``stop_after_s``: start no cell that would end after it;
    ``accept_source``: resume a document of that other code too (all three: :func:`run_cells`).
    """
    from . import _report

    if plot_dir is not None:
        _report.require_matplotlib()  # fail before measuring anything
    failed: list[Result] = []
    columns = {}
    loaded = []
    for name in suites:
        cells, module, reason = load_suite(name, full=full)
        columns[name] = getattr(module, "COLUMNS", None)
        if reason is not None:
            failed.append(Result(suite=name, label="(suite)", params={}, ok=False, error=reason, broken=True))
        loaded.extend(cells)
    if filters:
        kept = [c for c in loaded if any(f in f"{c.suite}: {c.label}" for f in filters)]
        if loaded and not kept:
            raise ValueError(f"expected --filter to match a cell of {', '.join(suites)}; got {list(filters)}")
        loaded = kept
    return run_cells(
        loaded, full=full, json_path=json_path, plot_dir=plot_dir, iters=iters, trials=trials, progress=progress,
        out=out, columns=columns, title=", ".join(suites), meta=dict(suites=list(suites)), results=failed,
        resume=resume, stop_after_s=stop_after_s, accept_source=accept_source,
    )  # fmt: skip


def run_cells(
    cells: Sequence[Cell],
    *,
    full: bool = False,
    json_path: str | None = None,
    plot_dir: str | None = None,
    iters: int | None = None,
    trials: int | None = None,
    timer: Timer | None = None,
    progress: bool = True,
    out=None,
    columns: dict | None = None,
    title: str | None = None,
    meta: dict | None = None,
    results: list[Result] | None = None,
    resume: bool = False,
    stop_after_s: float | None = None,
    accept_source: str | None = None,
) -> int:
    """Run ``cells`` with one :class:`Timer`: the table on ``out``, the JSON (``json_path``), the figures.

    The one runner and the one JSON writer of ``blocksparse bench`` and of the peer scripts in
    ``benchmarks/``: the document is ``{"meta": {...}, "results": [Result.to_dict(), ...]}``, rewritten
    after every cell. ``meta`` adds to the environment (``suites``, a script's name and options).
    ``results``: rows to report before the cells' (a suite that failed to load). Returns
    :func:`exit_code` of the results.

    ``resume=True`` continues the document at ``json_path`` (a run cut short, a long run split into
    several commands): its finished cells are kept, not run again; the others run (a failed cell runs
    again). It must come from the same machine, library code (:func:`source_digest`) and timer settings,
    else ``ValueError``; ``meta["parts"]`` lists each command's start, seconds and cells run, and
    ``meta["seconds"]`` is their sum. Without the file it is a new run. The file names the cell running
    (``meta["running"]``), so a command cut short in a cell leaves it in ``meta["cut_short"]``: a resumed run
    runs those cells after the others, and a cell longer than one command does not hold the rest back.

    ``stop_after_s``: a command's time limit, for a run split into commands under one (a lent machine's). A cell
    starts only while the seconds so far plus the longest cell this command has run fit in it (the first always
    starts); the cells left are counted in ``meta["left"]`` and the table's last line, and the next command with
    ``resume=True`` runs them. Stopping between cells keeps every measured cell, where a command killed at its
    limit loses the cell it was in.

    ``accept_source``: the digest of other library code whose document ``resume=True`` continues as well (a change
    reviewed as not touching what the cells measure, such as another op's kernel). Each part in
    ``meta["parts"]`` names the code it ran (``source``) and how many cells it ran.
    """
    from . import _report

    out = sys.stdout if out is None else out
    if plot_dir is not None:
        _report.require_matplotlib()
    if resume and not json_path:
        raise ValueError("expected a JSON path to resume (--json PATH with --resume); got none")
    if stop_after_s is not None and not 0 < stop_after_s < float("inf"):
        raise ValueError(f"expected stop_after_s to be a positive number of seconds; got {stop_after_s}")
    if timer is None:
        defaults = FULL_TIMER if full else QUICK_TIMER
        timer = Timer(iters=iters or defaults["iters"], trials=trials or defaults["trials"])
    results = list(results or [])
    columns = dict(columns or {})
    env = environment()
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    meta = dict(env, **(meta or {}), full=full, iters=timer.iters, trials=timer.trials, started=started)
    keys = [cell_key(c.suite, c.label, c.params) for c in cells]
    previous, kept = _previous(json_path, meta, keys, accept_source) if resume else (None, {})
    # (a resumable document has its source, so its parts; a part without its own source ran the document's)
    parts = [dict(p, source=p.get("source", previous["meta"]["source"])) for p in previous["meta"]["parts"]] if (
        previous) else []  # fmt: skip
    if previous:
        meta["started"] = previous["meta"]["started"]
    title = title or ", ".join(dict.fromkeys(c.suite for c in cells))
    mode = "full (GPU sizes)" if full else "quick (CPU sizes)"
    print(f"blocksparse bench: {title}; {mode}; jax {env['jax']} on {env['platform']} ({env['device']}); "
          f"{timer}", file=out, flush=True)  # fmt: skip
    if env["platform"] == "cpu":
        print("no GPU: the pure-JAX (XLA) implementations run; the Pallas kernels need a GPU", file=out, flush=True)
    t_start = time.perf_counter()
    doc = dict(meta=meta, results=[])
    slots: list[Result | None] = [kept.get(k) for k in keys]
    # cells a command ended in (meta "running" when it was cut short): run after the others, so a cell longer than
    # a command does not hold the rest back
    cut = [] if previous is None else [*previous["meta"].get("cut_short", []), previous["meta"].get("running")]
    cut = [k for k in dict.fromkeys(cut) if k in keys and k not in kept]
    todo = sorted((i for i, slot in enumerate(slots) if slot is None), key=lambda i: keys[i] in cut)
    if previous is not None:
        later = f" ({len(cut)} a command ended in: run last)" if cut else ""
        print(f"resuming {json_path}: {len(kept)} of {len(cells)} cells measured, {len(todo)} to run{later}",
              file=out, flush=True)  # fmt: skip
    for cell, slot in zip(cells, slots, strict=True):
        if slot is not None and cell.restore is not None and not slot.skipped:
            cell.restore(slot.metrics)  # what the later cells read from it (a baseline, a loss to match)

    def record(ran: int) -> None:
        seconds = time.perf_counter() - t_start
        meta["parts"] = [*parts, dict(started=started, seconds=seconds, cells=ran, source=meta.get("source"))]
        meta["seconds"] = sum(p["seconds"] for p in meta["parts"])
        if cut:
            meta["cut_short"] = cut
        else:
            meta.pop("cut_short", None)
        doc["results"] = [r.to_dict() for r in (*results, *slots) if r is not None]

    bar = _Progress(len(todo), enabled=progress)
    longest, ran = 0.0, 0
    try:
        for i in todo:
            if stop_after_s is not None and ran and time.perf_counter() - t_start + longest > stop_after_s:
                break
            bar.start(cells[i])
            if json_path:  # the cell a command cut short names itself in the file
                record(ran)
                meta["running"] = keys[i]
                write_json(json_path, doc)
            slots[i] = result = run_cell(cells[i], timer)
            ran += 1
            longest = max(longest, result.seconds)
            bar.finish(result)
            meta.pop("running", None)
            if keys[i] in cut:
                cut.remove(keys[i])
            if json_path:
                record(ran)
                write_json(json_path, doc)
    finally:
        bar.close()
    left = len(todo) - ran
    record(ran)
    if left:
        meta["left"] = left
    else:
        meta.pop("left", None)
    results = [*results, *(r for r in slots if r is not None)]  # (a command stopped early: the cells it ran)
    print(_report.table(results, columns), file=out)
    print(_report.summary(results, doc["meta"]["seconds"]), file=out, flush=True)
    if left:
        again = f"; the same command with --resume runs them (--json {json_path})" if json_path else ""
        print(f"stopped after {time.perf_counter() - t_start:.0f} s (stop_after_s={stop_after_s:g}): {left} of "
              f"{len(cells)} cells left{again}", file=out, flush=True)  # fmt: skip
    if json_path:
        write_json(json_path, doc)
        print(f"wrote {json_path}", file=out)
    if plot_dir is not None:
        for path in _report.plot(doc, plot_dir):
            print(f"wrote {path}", file=out)
    return exit_code(results)


def exit_code(results) -> int:
    """0 when every cell ran and agreed with its reference; 1 when a result disagreed (the code reserved for
    a wrong result); else 3 when a cell could not run (a missing file or extra, a broken suite; 2 is the
    command line's bad input)."""
    if any(not r.ok and not r.broken for r in results):
        return 1
    return 3 if any(not r.ok for r in results) else 0
