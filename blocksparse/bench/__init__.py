"""``blocksparse bench``: the library's benchmark suites, their table, JSON and figures.

Suites (``blocksparse bench --suite NAME``): ``matmul``, ``gnn``, ``plan``, ``model``, ``mosaic``, ``dynamic``,
``sharded``, ``training``, ``gnn-variants``, ``gnn-graphs``, ``decode``. Each is a module of this package
(``gnn-variants`` is :mod:`blocksparse.bench.gnn_variants`) exposing ``cells(*, full: bool) -> list[Cell]``; see
:mod:`blocksparse.bench._core` for the protocol and :func:`blocksparse.bench._cli.main` for the command line
(``blocksparse bench --help``). :func:`run_cells` is the one runner and JSON writer, also of the peer scripts
in ``benchmarks/`` (torch, PyG, sentence-transformers).
"""

from ._cli import run_cells
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

__all__ = [
    "Cell",
    "CellFailed",
    "CellSkipped",
    "Result",
    "Timer",
    "check_close",
    "figures",
    "implementation",
    "measure",
    "ratio",
    "require_matplotlib",
    "run_cell",
    "run_cells",
    "tolerance",
    "variant",
    "write_json",
]
