"""``blocksparse bench``: run suites of :class:`~blocksparse.bench.Cell`, print a table, write JSON and figures.

Suites are imported lazily by name (``blocksparse.bench.<suite>``), so a suite whose module or
extras are missing fails on its own with a clear message while the others run.
"""

from __future__ import annotations

import importlib
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
    )  # fmt: skip


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
) -> int:
    """Run ``suites``; print the table to ``out`` (stdout); return 0, or 1 if any cell failed.

    ``--json`` is rewritten after every cell, so a run cut short keeps what it measured. ``filters``:
    run only the cells whose ``"suite: label"`` contains one of them (an error if none does).
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
) -> int:
    """Run ``cells`` with one :class:`Timer`: the table on ``out``, the JSON (``json_path``), the figures.

    The one runner and the one JSON writer of ``blocksparse bench`` and of the peer scripts in
    ``benchmarks/``: the document is ``{"meta": {...}, "results": [Result.to_dict(), ...]}``, rewritten
    after every cell. ``meta`` adds to the environment (``suites``, a script's name and options).
    ``results``: rows to report before the cells' (a suite that failed to load). Returns
    :func:`exit_code` of the results.
    """
    from . import _report

    out = sys.stdout if out is None else out
    if plot_dir is not None:
        _report.require_matplotlib()
    if timer is None:
        defaults = FULL_TIMER if full else QUICK_TIMER
        timer = Timer(iters=iters or defaults["iters"], trials=trials or defaults["trials"])
    results = list(results or [])
    columns = dict(columns or {})
    env = environment()
    meta = dict(env, **(meta or {}))
    title = title or ", ".join(dict.fromkeys(c.suite for c in cells))
    mode = "full (GPU sizes)" if full else "quick (CPU sizes)"
    print(f"blocksparse bench: {title}; {mode}; jax {env['jax']} on {env['platform']} ({env['device']}); "
          f"{timer}", file=out, flush=True)  # fmt: skip
    if env["platform"] == "cpu":
        print("no GPU: the pure-JAX (XLA) implementations run; the Pallas kernels need a GPU", file=out, flush=True)
    t_start = time.perf_counter()
    doc = dict(meta=dict(meta, full=full, iters=timer.iters, trials=timer.trials,
                         started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())), results=[])  # fmt: skip
    bar = _Progress(len(cells), enabled=progress)
    try:
        for cell in cells:
            bar.start(cell)
            result = run_cell(cell, timer)
            results.append(result)
            bar.finish(result)
            if json_path:
                doc["results"] = [r.to_dict() for r in results]
                write_json(json_path, doc)
    finally:
        bar.close()
    doc["results"] = [r.to_dict() for r in results]
    doc["meta"]["seconds"] = time.perf_counter() - t_start
    print(_report.table(results, columns), file=out)
    print(_report.summary(results, doc["meta"]["seconds"]), file=out, flush=True)
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
