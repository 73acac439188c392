"""Every benchmark script imports on a CPU machine without torch (its helpers exist, its imports resolve)."""

from __future__ import annotations

import pytest
from bench_scripts import BENCHMARKS, load

SCRIPTS = sorted(p.stem for p in BENCHMARKS.glob("*.py"))


@pytest.mark.parametrize("name", SCRIPTS)
def test_benchmark_script_imports(name):
    module = load(name)
    assert callable(getattr(module, "main", None)), f"benchmarks/{name}.py has no main()"
