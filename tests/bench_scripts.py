"""The scripts under ``benchmarks/`` as modules, for the tests that run them at tiny sizes on the CPU."""

from __future__ import annotations

import importlib.util
import pathlib
import sys
from types import ModuleType

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"
#: The one module the scripts share (torch timed with CUDA events); not a script.
HELPERS = ("peers",)


def load(name: str) -> ModuleType:
    """``benchmarks/{name}.py`` as a fresh module (its own module state on every call).

    ``benchmarks/`` goes on ``sys.path`` as it does when a script runs (``python benchmarks/x.py``), so a
    script's ``import peers`` resolves."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(f"_bench_script_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
