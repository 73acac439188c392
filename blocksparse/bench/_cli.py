"""``blocksparse bench``: run suites of :class:`~blocksparse.bench.Cell`, print a table, write JSON and figures.

Suites are imported lazily by name (``blocksparse.bench.<suite>``), so a suite whose module or
extras are missing fails on its own with a clear message while the others run.
"""

from __future__ import annotations

import importlib
import json
import os
import platform
import sys
import time
from collections.abc import Sequence

from ._core import Cell, Result, Timer, run_cell

SUITES = ("matmul", "gnn", "plan", "model")
#: ``--suite`` when none is given: the CPU-friendly suites (``model`` needs the ``models`` extra).
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
    try:
        module = importlib.import_module(f"blocksparse.bench.{name}")
    except ImportError as e:
        missing = getattr(e, "name", None)
        if missing == f"blocksparse.bench.{name}":
            return [], None, f"suite {name!r} is not available: no module blocksparse.bench.{name} in this install"
        hint = _EXTRAS.get(name, "pip install 'blocksparse[bench]'")
        return [], None, f"suite {name!r} could not be imported: {' '.join(str(e).split())} ({hint})"
    try:
        cells = list(module.cells(full=full))
    except Exception as e:  # noqa: BLE001 - a broken suite must not stop the others
        hint = f" ({_EXTRAS[name]})" if isinstance(e, ImportError) and name in _EXTRAS else ""
        why = " ".join(f"{type(e).__name__}: {e}".split())
        return [], module, f"suite {name!r} could not list its cells: {why}{hint}"
    return cells, module, None


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
            status = "ok" if result.ok else "FAILED"
            print(f"[{self.done}/{self.total}] {result.suite}: {result.label}: {status} ({result.seconds:.1f} s)",
                  file=sys.stderr, flush=True)  # fmt: skip

    def close(self):
        if self.bar is not None:
            self.bar.close()


def _write_json(path: str, doc: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, path)


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

    out = sys.stdout if out is None else out
    if plot_dir is not None:
        _report.require_matplotlib()  # fail before measuring anything
    defaults = FULL_TIMER if full else QUICK_TIMER
    timer = Timer(iters=iters or defaults["iters"], trials=trials or defaults["trials"])
    results: list[Result] = []
    columns = {}
    loaded = []
    for name in suites:
        cells, module, reason = load_suite(name, full=full)
        columns[name] = getattr(module, "COLUMNS", None)
        if reason is not None:
            results.append(Result(suite=name, label="(suite)", params={}, ok=False, error=reason))
        loaded.extend(cells)
    if filters:
        kept = [c for c in loaded if any(f in f"{c.suite}: {c.label}" for f in filters)]
        if loaded and not kept:
            raise ValueError(f"expected --filter to match a cell of {', '.join(suites)}; got {list(filters)}")
        loaded = kept
    env = environment()
    mode = "full (GPU sizes)" if full else "quick (CPU sizes)"
    print(f"blocksparse bench: {', '.join(suites)}; {mode}; jax {env['jax']} on {env['platform']} ({env['device']}); "
          f"{timer}", file=out, flush=True)  # fmt: skip
    if env["platform"] == "cpu":
        print("no GPU: the pure-JAX (XLA) implementations run; the Pallas kernels need a GPU", file=out, flush=True)
    t_start = time.perf_counter()
    doc = dict(meta=dict(env, suites=list(suites), full=full, iters=timer.iters, trials=timer.trials,
                         started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())), results=[])  # fmt: skip
    bar = _Progress(len(loaded), enabled=progress)
    try:
        for cell in loaded:
            bar.start(cell)
            result = run_cell(cell, timer)
            results.append(result)
            bar.finish(result)
            if json_path:
                doc["results"] = [r.to_dict() for r in results]
                _write_json(json_path, doc)
    finally:
        bar.close()
    doc["results"] = [r.to_dict() for r in results]
    doc["meta"]["seconds"] = time.perf_counter() - t_start
    print(_report.table(results, columns), file=out)
    print(_report.summary(results, doc["meta"]["seconds"]), file=out, flush=True)
    if json_path:
        _write_json(json_path, doc)
        print(f"wrote {json_path}", file=out)
    if plot_dir is not None:
        for path in _report.plot(doc, plot_dir):
            print(f"wrote {path}", file=out)
    return 0 if all(r.ok for r in results) else 1
