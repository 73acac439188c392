"""``blocksparse bench``: the library's benchmark suites, their table, JSON and figures.

Suites (``blocksparse bench --suite NAME``): ``matmul``, ``gnn``, ``plan``, ``model``, ``mosaic``, ``dynamic``,
``sharded``, ``training``, ``gnn-variants``, ``gnn-graphs``, ``decode``. Each is a module of this package
(``gnn-variants`` is :mod:`blocksparse.bench.gnn_variants`) exposing ``cells(*, full: bool) -> list[Cell]``; see
:mod:`blocksparse.bench._core` for the protocol and :func:`blocksparse.__main__.main` for the command line
(``blocksparse bench --help``). :func:`run_cells` is the one runner and JSON writer, also of the peer scripts
in ``benchmarks/`` (torch, PyG, sentence-transformers); :func:`run` runs suites by name (:data:`DEFAULT_SUITES`
without one, :func:`parse_suites` reads ``--suite``), the command line's runner; :func:`trace_loop` times the
Timer's loop under the profiler (``benchmarks/profile_kernels.py``).
"""

from ._cli import DEFAULT_SUITES, parse_suites, run, run_cells
from ._core import (
    Cell,
    CellFailed,
    CellSkipped,
    Result,
    Timer,
    check_close,
    implementation,
    measure,
    ratio,
    run_cell,
    tolerance,
    variant,
    write_json,
)
from ._report import plot as figures
from ._report import require_matplotlib
from ._trace import trace_loop

__all__ = [
    "DEFAULT_SUITES",
    "Cell",
    "CellFailed",
    "CellSkipped",
    "Result",
    "Timer",
    "check_close",
    "figures",
    "implementation",
    "measure",
    "parse_suites",
    "ratio",
    "require_matplotlib",
    "run",
    "run_cell",
    "run_cells",
    "tolerance",
    "trace_loop",
    "variant",
    "write_json",
]
