"""``blocksparse bench``: the library's benchmark suites (matmul, gnn, plan, model), their table, JSON and figures.

Suites are modules of this package exposing ``cells(*, full: bool) -> list[Cell]``; see
:mod:`blocksparse.bench._core` for the protocol and :func:`blocksparse.bench._cli.main` for the
command line (``blocksparse bench --help``).
"""

from ._core import Cell, CellFailed, Result, Timer, check_close, implementation, run_cell, tolerance

__all__ = ["Cell", "CellFailed", "Result", "Timer", "check_close", "implementation", "run_cell", "tolerance"]
