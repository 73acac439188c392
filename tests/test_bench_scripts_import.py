"""Every script left in ``benchmarks/`` imports on a CPU machine without torch, has a ``main()``, and keeps to the
layout: it needs a peer (torch, PyG, sentence-transformers), an external profiler or a GPU, edits no ``sys.path``,
imports no other script (only the one shared helper, ``peers``) and writes its JSON through blocksparse.bench."""

from __future__ import annotations

import ast

import pytest
from bench_scripts import BENCHMARKS, HELPERS, load

SCRIPTS = sorted(p.stem for p in BENCHMARKS.glob("*.py") if p.stem not in HELPERS)
#: What each script needs beyond JAX (everything that needs only JAX is a ``blocksparse bench`` suite).
PEERS = {
    "bench_gnn": "torch, PyG",
    "bench_gnn_graphs": "torch, PyG",
    "bench_matmul": "torch",
    "check_llama": "torch, transformers",
    "check_minilm": "sentence-transformers",
    "grouped_gpu_check": "a GPU (the opt-in grouped kernel checked against dense and timed, before any dispatch rule)",
    "plot": "matplotlib (figures of the results JSON)",
    "profile_gnn_backward": "a GPU (the max / min forward and backward timed piece by piece)",
    "profile_kernels": "ncu",
    "trace_encoder": "a GPU (jax.profiler's trace of the GPU's kernels)",
    "train_gnn": "PyG",
}


def test_only_scripts_with_peers_are_left():
    assert set(SCRIPTS) == set(PEERS)


@pytest.mark.parametrize("name", SCRIPTS)
def test_benchmark_script_imports(name):
    module = load(name)
    assert callable(getattr(module, "main", None)), f"benchmarks/{name}.py has no main()"


@pytest.mark.parametrize("name", [*SCRIPTS, *HELPERS])
def test_no_sys_path_edits_no_imports_of_other_scripts_no_own_json(name):
    tree = ast.parse((BENCHMARKS / f"{name}.py").read_text())
    scripts = {*SCRIPTS, *HELPERS} - {name}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            assert (node.value.id, node.attr) != ("sys", "path"), f"{name}: edits sys.path"
            own_json = (node.value.id, node.attr) in {("json", "dump"), ("json", "dumps")}
            assert not own_json or name == "check_minilm", f"{name}: writes its own JSON"  # (its fixture's meta.json)
        if isinstance(node, ast.ImportFrom) and node.module in scripts:
            assert node.module in HELPERS, f"{name} imports the script {node.module}"
        if isinstance(node, ast.Import):
            assert not ({a.name for a in node.names} & (scripts - set(HELPERS))), f"{name} imports another script"
