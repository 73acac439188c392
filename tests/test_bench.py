"""``blocksparse bench``: the suite protocol (Timer, checks), the suites at a tiny size, and the command line."""

import contextlib
import importlib.util
import io
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import bench_scripts
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from blocksparse.__main__ import main
from blocksparse.bench import Cell, CellFailed, Timer, check_close, implementation, run_cell, tolerance
from blocksparse.bench import gnn as bench_gnn
from blocksparse.bench import matmul as bench_matmul
from blocksparse.bench import plan as bench_plan


# -- the protocol ---------------------------------------------------------------------------------------
def test_timer_loop_and_calls_return_positive_medians():
    timer = Timer(iters=3, trials=2, warmup=0)
    x = jnp.arange(16.0).reshape(4, 4)
    assert timer.loop(lambda a: a @ a + 1, x) > 0
    assert timer.calls(lambda a: a @ a + 1, x) > 0
    assert timer.loop(lambda a, b: (a + b, jnp.zeros((0,))), x, x, iters=2) > 0  # pytree out, empty leaf
    assert timer.unrolled(lambda a, b: (a + b, jnp.zeros((0,))), x, x, iters=2) > 0


def test_timer_unrolled_writes_every_call_out():
    """One call traced per iteration (no loop): iters calls written out."""
    timer = Timer(iters=4, trials=1, warmup=0)
    x = jnp.arange(16.0).reshape(4, 4)
    seen = []
    timer.unrolled(lambda a: seen.append(1) or a @ a, x)
    assert len(seen) == 4
    with pytest.raises(ValueError, match="iters"):
        timer.unrolled(lambda a: a, x, iters=0)


@pytest.mark.parametrize("kw", [{"iters": 0}, {"trials": 0}, {"warmup": -1}, {"iters": 2.5}])
def test_timer_rejects_bad_settings(kw):
    with pytest.raises(ValueError, match="Expected Timer"):
        Timer(**kw)


def test_check_close_names_expected_and_actual():
    x = jnp.ones((8, 8))
    assert check_close(x, x) == 0.0
    with pytest.raises(CellFailed, match=r"expected relative error vs the reference <= 0\.0001; got 0\.5"):
        check_close(x * 1.5, x, tol=1e-4)
    with pytest.raises(CellFailed, match=r"expected shape \(8, 8\)"):
        check_close(jnp.ones((8, 4)), x)
    with pytest.raises(CellFailed, match="expected finite values; got 1 non-finite of 64"):
        check_close(x.at[0, 0].set(jnp.nan), x)
    assert tolerance(jnp.bfloat16) > tolerance(jnp.float16) > tolerance(jnp.float32, "cpu")


def test_run_cell_turns_failures_into_results():
    def bad(timer):
        raise CellFailed("expected 1; got 2")

    def broken(timer):
        return {}["missing"]

    ok = run_cell(Cell("t", "ok", {}, lambda timer: {"v": jnp.float32(2)}), Timer())
    assert ok.ok and ok.metrics == {"v": 2.0} and ok.error is None
    r = run_cell(Cell("t", "bad", {"a": 1}, bad), Timer())
    assert not r.ok and r.error == "expected 1; got 2" and r.to_dict()["params"] == {"a": 1}
    r = run_cell(Cell("t", "broken", {}, broken), Timer())
    assert not r.ok and r.error.startswith("KeyError: 'missing'") and "test_bench.py" in r.error
    assert implementation([("dsd", "xla"), ("dsd", "xla"), ("sdd", "xla")]) == "dsd: xla, sdd: xla"
    assert implementation([]) == "none recorded"


@given(
    shape=st.tuples(st.integers(1, 6), st.integers(1, 6)),
    rel=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**16),
)
def test_check_close_measures_the_relative_frobenius_error(shape, rel, seed):
    want = np.random.default_rng(seed).standard_normal(shape) + 3.0  # never all zero
    direction = np.random.default_rng(seed + 1).standard_normal(shape)
    got = want + rel * np.linalg.norm(want) * direction / np.linalg.norm(direction)
    err = check_close(jnp.asarray(got, jnp.float32), jnp.asarray(want, jnp.float32), tol=1.0 + 1e-3)
    assert err == pytest.approx(rel, rel=1e-4, abs=1e-6)


# -- the suites, at the tiny size -------------------------------------------------------------------
@pytest.fixture
def tiny(monkeypatch):
    """Every suite's quick sizes shrunk to its ``tiny`` sizes (the registry tests share with the scripts)."""
    for suite in (bench_matmul, bench_gnn, bench_plan):
        monkeypatch.setitem(suite.SIZES, "quick", suite.SIZES["tiny"])


FAST = ["--iters", "1", "--trials", "1", "--no-progress"]


@pytest.mark.parametrize("suite", [bench_matmul, bench_gnn, bench_plan])
def test_every_suite_lists_checked_cells_at_both_sizes(suite):
    for full in (False, True):
        cells = suite.cells(full=full)
        assert cells and all(isinstance(c, Cell) and c.suite == suite.__name__.rsplit(".", 1)[1] for c in cells)
        assert len({c.label for c in cells}) == len(cells)  # one row each
        json.dumps([c.params for c in cells])
    assert {k for k in suite.SIZES} == {"tiny", "quick", "full"}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """One run of the three CPU suites at the tiny size, with --json and (when matplotlib is there) --plot."""
    tmp = tmp_path_factory.mktemp("bench")
    argv = ["bench", "--suite", "matmul,gnn", "--suite", "plan", "--json", str(tmp / "bench.json"), *FAST]
    has_mpl = importlib.util.find_spec("matplotlib") is not None
    if has_mpl:
        argv += ["--plot", str(tmp / "figs")]
    with pytest.MonkeyPatch.context() as mp:
        for suite in (bench_matmul, bench_gnn, bench_plan):
            mp.setitem(suite.SIZES, "quick", suite.SIZES["tiny"])
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = main(argv)
    return dict(code=code, out=out.getvalue(), doc=json.loads((tmp / "bench.json").read_text()),
                figs=tmp / "figs" if has_mpl else None)  # fmt: skip


def test_quick_suites_run_print_the_table_and_exit_0(tiny_run):
    out = tiny_run["out"]
    assert tiny_run["code"] == 0, out
    assert "[matmul]" in out and "[gnn]" in out and "[plan]" in out and "FAILED" not in out
    if tiny_run["doc"]["meta"]["platform"] == "cpu":
        assert "pure-JAX (XLA) implementations run" in out and "dsd: xla" in out and "dyn_dsd: xla" in out
    assert " ok, 0 failed in " in out


def test_json_holds_every_cell_with_its_metrics(tiny_run):
    doc = tiny_run["doc"]
    assert doc["meta"]["suites"] == ["matmul", "gnn", "plan"]
    assert doc["meta"]["full"] is False and doc["meta"]["iters"] == 1 and doc["meta"]["seconds"] > 0
    results = doc["results"]
    assert {r["suite"] for r in results} == {"matmul", "gnn", "plan"} and all(r["ok"] for r in results)
    assert len(results) == sum(len(s.suite(**s.SIZES["tiny"])) for s in (bench_matmul, bench_gnn, bench_plan))
    kinds = {r["params"].get("kind") for r in results if r["suite"] == "matmul"}
    assert kinds == {"dense", "static", "dynamic"}
    for r in results:
        m = r["metrics"]
        assert m["implementation"] and m["rel_err"] < 1e-4
        if r["suite"] == "matmul":
            assert m["loop_ms"] > 0 and m["calls_ms"] > 0 and m["tflops"] > 0 and m["speedup_vs_dense"] > 0
            assert m["ipu_tflops"] > 0  # the planner's estimate beside the measured figure
        if r["suite"] == "gnn":
            assert m["reference_ms"] > 0 and m["speedup_vs_reference"] > 0
        if r["suite"] == "plan":
            assert m["plan_ms"] > 0 and m["ipu_tflops"] > 0 and m["ipu_speedup"] > 0
    assert {r["label"] for r in results if r["suite"] == "gnn"} == set(bench_gnn.OPS)


def test_plot_writes_pngs(tiny_run):
    if tiny_run["figs"] is None:
        pytest.skip("matplotlib is not installed")
    names = sorted(p.name for p in tiny_run["figs"].iterdir())
    assert names == ["gnn_vs_reference.png", "matmul_n16.png", "plan_speedup.png"]
    assert all((tiny_run["figs"] / n).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for n in names)


def test_a_failed_cell_is_shown_and_exits_1(monkeypatch, tmp_path, capsys):
    def wrong(timer):
        raise CellFailed("expected relative error <= 1e-4; got 0.5")

    ok = Cell("matmul", "fine", {}, lambda timer: {"loop_ms": timer.loop(jnp.sin, jnp.ones(4)), "implementation": "x"})
    monkeypatch.setattr(bench_matmul, "cells", lambda *, full: [ok, Cell("matmul", "broken", {"b": 16}, wrong)])
    path = tmp_path / "bench.json"
    assert main(["bench", "--suite", "matmul", "--json", str(path), *FAST]) == 1
    out = capsys.readouterr().out
    assert "broken" in out and "FAILED  expected relative error <= 1e-4; got 0.5" in out
    assert "2 cells, 1 ok, 1 failed" in out
    results = json.loads(path.read_text())["results"]
    assert [r["ok"] for r in results] == [True, False] and results[1]["error"].endswith("got 0.5")


def test_a_missing_suite_module_or_extra_fails_alone(monkeypatch, tiny, capsys):
    monkeypatch.setitem(sys.modules, "blocksparse.bench.model", None)  # the module is absent
    assert main(["bench", "--suite", "plan,model", *FAST]) == 1
    out = capsys.readouterr().out
    assert "[plan]" in out and "no module blocksparse.bench.model" in out and "1 failed" in out
    fake = types.ModuleType("blocksparse.bench.model")

    def cells(*, full):
        raise ModuleNotFoundError("No module named 'safetensors'", name="safetensors")

    fake.cells = cells
    monkeypatch.setitem(sys.modules, "blocksparse.bench.model", fake)
    assert main(["bench", "--suite", "model", *FAST]) == 1
    out = capsys.readouterr().out
    assert "No module named 'safetensors'" in out and "pip install 'blocksparse[models]'" in out


def test_filter_runs_only_the_matching_cells(monkeypatch, capsys):
    def cell(label):
        return Cell("plan", label, {}, lambda timer: {"implementation": label})

    monkeypatch.setattr(bench_plan, "cells", lambda *, full: [cell("a n=256"), cell("b n=4096"), cell("c n=256")])
    assert main(["bench", "--suite", "plan", "--filter", "n=256", *FAST]) == 0
    out = capsys.readouterr().out
    assert "a n=256" in out and "c n=256" in out and "b n=4096" not in out and "2 cells, 2 ok" in out
    with pytest.raises(SystemExit) as info:
        main(["bench", "--suite", "plan", "--filter", "n=8", *FAST])
    assert info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "expected --filter to match a cell of plan; got ['n=8']" in captured.err


def test_progress_falls_back_to_plain_lines(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tqdm", None)
    cell = Cell("gnn", "trivial", {}, lambda timer: {"implementation": "none"})
    monkeypatch.setattr(bench_gnn, "cells", lambda *, full: [cell])
    assert main(["bench", "--suite", "gnn", "--iters", "1", "--trials", "1"]) == 0
    assert "[1/1] gnn: trivial: ok (" in capsys.readouterr().err


# -- bad arguments: one line, exit status 2 ---------------------------------------------------------------
@pytest.mark.parametrize(
    "argv, expected",
    [
        (["bench", "--suite", "nope"], "--suite: expected a suite in matmul, gnn, plan, model, all; got 'nope'"),
        (["bench", "--suite", ","], "expected a suite in matmul, gnn, plan, model, all; got ','"),
        (["bench", "--iters", "0"], "argument --iters: expected a positive integer, got 0"),
        (["bench", "--trials", "x"], "argument --trials: expected a positive integer, got 'x'"),
        (["bench", "--json", "/no/such/folder/b.json"], "expected --json to name a writable file"),
        (["bench", "--plot", "/no/such/folder/figs"], "expected --plot to name a folder in an existing one"),
    ],
)  # fmt: skip
def test_bad_arguments_exit_2_with_one_line(capsys, argv, expected):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0] and captured.out == "", captured.err


def test_plot_without_matplotlib_names_the_extra(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(SystemExit) as info:
        main(["bench", "--plot", str(tmp_path)])
    assert info.value.code == 2
    assert "--plot needs matplotlib: pip install 'blocksparse[bench]'" in capsys.readouterr().err
    (tmp_path / "file").write_text("")
    monkeypatch.delitem(sys.modules, "matplotlib")
    with pytest.raises(SystemExit):
        main(["bench", "--plot", str(tmp_path / "file")])
    assert "expected --plot to name a folder" in capsys.readouterr().err


# -- the GPU scripts, on the CPU at tiny sizes ------------------------------------------------------------
def _script(name):
    return bench_scripts.load(name)


def test_bench_matmul_script_measures_on_the_cpu_and_exits_1_on_a_failed_cell(tmp_path, monkeypatch, capsys):
    script = _script("bench_matmul")
    argv = ["--m", "64", "--n", "16", "--b", "16", "--d", "4", "--reps", "1", "--trials", "1", "--dtype", "float32"]
    assert script.main([*argv, "--json", str(tmp_path / "ok.json")]) == 0
    doc = json.loads((tmp_path / "ok.json").read_text())
    assert doc["failed"] == [] and len(doc["rows"]) == 1
    row = doc["rows"][0]
    assert row["implementation"] == "dsd: xla" and row["err"] < 1e-5 and row["time_ms"] > 0 and row["wall_ms"] > 0

    def wrong(*args, **kwargs):
        raise CellFailed("dsd product: expected relative error vs the reference <= 0.0001; got 0.3")

    monkeypatch.setattr(script, "bench_cell", wrong)
    assert script.main([*argv, "--json", str(tmp_path / "bad.json")]) == 1
    doc = json.loads((tmp_path / "bad.json").read_text())
    assert doc["rows"] == [] and doc["failed"][0]["error"].endswith("got 0.3")
    assert "1 cells FAILED, 0 measured" in capsys.readouterr().err


@pytest.mark.gpu
def test_on_a_gpu_the_suites_run_the_pallas_kernels(tiny_run):
    results = tiny_run["doc"]["results"]
    assert tiny_run["code"] == 0 and tiny_run["doc"]["meta"]["platform"] == "gpu"
    ran = {r["label"]: r["metrics"]["implementation"] for r in results if r["suite"] == "matmul"}
    assert all("pallas" in v for k, v in ran.items() if not k.endswith("dense")), ran


def test_python_dash_m_exit_status_reaches_the_shell():
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=str(root))
    bad = subprocess.run([sys.executable, "-m", "blocksparse", "bench", "--suite", "nope"], cwd=root, env=env,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.strip() == (
        "python -m blocksparse bench: error: argument --suite: expected a suite in matmul, gnn, plan, model, all; "
        "got 'nope' (see --help)"
    )
