"""``blocksparse bench``: the suite protocol (Timer, checks, skips), every suite at a tiny size, the command line,
the suites' GPU variants in the interpreter on a faked H200, and the peer scripts on the CPU."""

import contextlib
import dataclasses
import importlib.util
import io
import json
import os
import re
import subprocess
import sys
import time
import types
from pathlib import Path

import bench_scripts
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import sweep
from hypothesis import given
from hypothesis import strategies as st

import blocksparse as bs
from blocksparse import hardware
from blocksparse.__main__ import main
from blocksparse.bench import (
    Cell,
    CellFailed,
    CellSkipped,
    Timer,
    _cli,
    check_close,
    implementation,
    measure,
    run_cell,
    run_cells,
    tolerance,
    variant,
    write_json,
)
from blocksparse.bench import dynamic as bench_dynamic
from blocksparse.bench import gnn as bench_gnn
from blocksparse.bench import gnn_graphs as bench_gnn_graphs
from blocksparse.bench import gnn_variants as bench_gnn_variants
from blocksparse.bench import matmul as bench_matmul
from blocksparse.bench import mosaic as bench_mosaic
from blocksparse.bench import plan as bench_plan
from blocksparse.bench import sharded as bench_sharded
from blocksparse.bench import training as bench_training

#: Every suite with ``tiny`` / ``quick`` / ``full`` sizes (the model and decode suites have their own, tested in
#: test_models_minilm and test_models_llama).
SIZED = [bench_matmul, bench_gnn, bench_plan, bench_mosaic, bench_dynamic, bench_sharded, bench_training,
         bench_gnn_variants, bench_gnn_graphs]  # fmt: skip


# -- the protocol ---------------------------------------------------------------------------------------
def test_timer_loop_and_calls_return_positive_medians():
    timer = Timer(iters=3, trials=2, warmup=0)
    x = jnp.arange(16.0).reshape(4, 4)
    assert timer.loop(lambda a: a @ a + 1, x) > 0
    assert timer.calls(lambda a: a @ a + 1, x) > 0
    assert timer.loop(lambda a, b: (a + b, jnp.zeros((0,))), x, x, iters=2) > 0  # pytree out, empty leaf
    assert timer.unrolled(lambda a, b: (a + b, jnp.zeros((0,))), x, x, iters=2) > 0


def test_timer_loop_is_compiled_once_for_a_timing_and_its_trace():
    """The trace of a timed loop (``trace_loop``, ``kernel_us``) runs the program the timing compiled."""
    timer = Timer(iters=3, trials=2, warmup=1)
    x = jnp.arange(16.0).reshape(4, 4)
    traces = []

    def fn(a):
        traces.append(1)
        return a @ a

    timer.loop(fn, x)
    looped = timer.loop_function(fn)
    assert looped is timer.loop_function(fn, 3) and looped is not timer.loop_function(fn, 2)
    jax.block_until_ready(looped((x,)))
    assert len(traces) == 1  # traced once: the timing's compilation served the later call
    unhashable = Timer(iters=1, trials=1).loop_function  # a fn that cannot be a cache key still works
    assert float(unhashable(_Unhashable())((x,))) == float((x @ x).ravel()[0])


class _Unhashable:
    __hash__ = None

    def __call__(self, a):
        return a @ a


def _materialized_shapes(jitted, *args) -> set[str]:
    """The float32 shapes of the arrays XLA's optimized program writes out: the results of the instructions outside
    fused computations (a fusion's inside computes only what its result needs)."""
    shapes, fused = set(), False
    for line in jitted.lower(*args).compile().as_text().splitlines():
        if line and not line.startswith(" "):  # a computation's header
            fused = line.lstrip("%").startswith("fused")
        elif not fused:
            shapes.update(re.findall(r"= (f32\[[\d,]*\])", line))
    return shapes


@pytest.mark.parametrize("method", ["loop", "unrolled"])
def test_timer_computes_every_element_of_the_outputs(method):
    """The timed program computes each output whole, not only the element it reads to keep the call live: an
    elementwise output (here a concatenation of 2 x 8 x 16 sines and cosines) would otherwise be fused into the read and
    computed for one element, and its time would vanish."""
    timer = Timer(iters=2, trials=1, warmup=0)
    x = jnp.linspace(0.5, 1.0, 8 * 16, dtype=jnp.float32).reshape(8, 16)

    def fn(a):
        return jnp.concatenate([jnp.sin(a), jnp.cos(a)]) * 2.0

    jitted = getattr(timer, f"{method}_function")(fn)
    args = ((x,),)
    assert "f32[16,16]" in _materialized_shapes(jitted, *args)
    got = float(jitted(*args))
    assert got == pytest.approx(2 * 2 * float(jnp.sin(x[0, 0])), abs=1e-6)


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


@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 3 * 4096 + 17])
@pytest.mark.parametrize("magnitude", [1e-30, 1.0, 1e30])
def test_check_close_matches_float64_at_any_size_and_magnitude(size, magnitude):
    """The error is summed on the device in float32 chunks, added on the host in float64: it matches NumPy's float64
    error to float32 rounding, with no overflow or underflow of the squares at extreme magnitudes."""
    rng = np.random.default_rng(size)
    want = rng.standard_normal(size).astype(np.float32) * np.float32(magnitude)
    got = want * np.float32(1 + 1e-3) + rng.standard_normal(size).astype(np.float32) * np.float32(magnitude * 1e-3)
    w, g = want.astype(np.float64), got.astype(np.float64)
    expected = np.linalg.norm(g - w) / np.linalg.norm(w) if size else 0.0
    assert check_close(jnp.asarray(got), want, tol=1.0) == pytest.approx(expected, rel=1e-4)
    zero = np.zeros_like(want)  # against a zero reference: the error is |got| itself
    assert check_close(got, zero, tol=np.inf) == pytest.approx(np.linalg.norm(g), rel=1e-4)
    if size:
        bad = got.copy()
        bad[0] = np.inf
        with pytest.raises(CellFailed, match=f"got 1 non-finite of {size}"):
            check_close(bad, want)


def test_skipped_cells_measure_and_variants():
    """A skipped cell is ok with its reason; measure() checks and times; variant() records what cannot run here."""
    r = run_cell(Cell("t", "skip", {}, lambda timer: (_ for _ in ()).throw(CellSkipped("needs a GPU"))), Timer())
    assert r.ok and r.skipped == "needs a GPU" and r.metrics == {}
    timer = Timer(iters=1, trials=1, warmup=0)
    W = bs.BlockSparseMatrix.from_dense(jnp.eye(8), 4)
    x = jnp.ones((8, 2))
    m = measure(timer, lambda W, x: bs.matmul(W, x, implementation="xla"), W, x, want=x, prefix="p_")
    assert m["p_rel_err"] == 0 and m["p_loop_ms"] > 0 and m["p_calls_ms"] > 0 and m["p_implementation"] == "dsd: xla"
    with pytest.raises(CellFailed, match="expected relative error"):
        measure(timer, lambda W, x: 2 * (W @ x), W, x, want=x)
    with hardware.fake(dataclasses.replace(hardware.H200, platform="cpu")):
        assert variant(timer, "k", jnp.sin, x, needs="gpu") == {"k_skipped": "needs a GPU (default device: cpu)"}
        assert variant(timer, "m", jnp.sin, x, needs="hopper")["m_skipped"].startswith("needs a Hopper GPU")
    refused = variant(timer, "r", lambda W, x: bs.matmul(W, x, implementation="pallas"), W, x)  # no GPU here
    assert set(refused) == {"r_skipped"} or "r_loop_ms" in refused


def test_write_json_and_run_cells_write_one_layout(tmp_path, capsys):
    path = tmp_path / "doc.json"
    write_json(str(path), {"a": np.float32(1.5), "b": [jnp.int32(2)]})
    assert json.loads(path.read_text()) == {"a": 1.5, "b": [2]}
    cells = [
        Cell("peer", "ok", {"n": 1}, lambda timer: {"loop_ms": 1.0, "implementation": "x"}),
        Cell("peer", "missing", {"n": 2}, lambda timer: (_ for _ in ()).throw(CellSkipped("torch unavailable"))),
    ]
    assert (
        run_cells(cells, json_path=str(path), timer=Timer(iters=1, trials=1), meta={"script": "s"}, progress=False) == 0
    )
    doc = json.loads(path.read_text())
    assert doc["meta"]["script"] == "s" and [r["label"] for r in doc["results"]] == ["ok", "missing"]
    assert doc["results"][1]["skipped"] == "torch unavailable" and doc["results"][0]["params"] == {"n": 1}
    out = capsys.readouterr().out
    assert "missing  skipped  torch unavailable" in out and "2 cells, 1 ok, 0 failed, 1 skipped" in out


class _CutShort(BaseException):
    """Stands for the command being killed mid-run (run_cell catches Exception, not this)."""


def test_a_resumed_run_keeps_its_measured_cells_and_runs_the_rest(tmp_path, capsys):
    path, timer = str(tmp_path / "run.json"), Timer(iters=1, trials=1)
    calls, restored, state = [], [], {"cut": True, "wrong": True}

    def run(label):
        def fn(timer):
            calls.append(label)
            if label == "c" and state.pop("cut", False):
                raise _CutShort
            if label == "b" and state.pop("wrong", False):
                raise CellFailed("expected 1; got 2")
            return {"loop_ms": float(ord(label))}

        return fn

    def cells():
        return [Cell("s", x, {"n": i}, run(x), restore=restored.append if x == "a" else None)
                for i, x in enumerate("abcd")]  # fmt: skip

    with pytest.raises(_CutShort):  # a, b (failed) then the command is cut short in c
        run_cells(cells(), json_path=path, timer=timer, progress=False, resume=True)
    first = json.loads(Path(path).read_text())
    assert [(r["label"], r["ok"]) for r in first["results"]] == [("a", True), ("b", False)]
    assert [p["cells"] for p in first["meta"]["parts"]] == [2] and len(first["meta"]["source"]) == 16
    assert json.loads(first["meta"]["running"])[1] == "c"  # the cell the command ended in
    assert run_cells(cells(), json_path=path, timer=timer, progress=False, resume=True) == 0
    assert calls == ["a", "b", "c", "b", "d", "c"]  # a kept; the failed b again, d, and the cut c last
    assert restored == [{"loop_ms": 97.0}]  # the kept cell's metrics, for the cells that read them
    doc = json.loads(Path(path).read_text())
    assert [(r["label"], r["metrics"]) for r in doc["results"]] == [(x, {"loop_ms": float(ord(x))}) for x in "abcd"]
    parts = doc["meta"]["parts"]
    assert [p["cells"] for p in parts] == [2, 3] and doc["meta"]["started"] == first["meta"]["started"]
    assert doc["meta"]["seconds"] == pytest.approx(sum(p["seconds"] for p in parts))
    out = capsys.readouterr().out
    assert f"resuming {path}: 1 of 4 cells measured, 3 to run (1 a command ended in: run last)" in out
    assert "4 cells, 4 ok, 0 failed" in out and not {"running", "cut_short"} & set(doc["meta"])
    assert run_cells(cells(), json_path=path, timer=timer, progress=False, resume=True) == 0
    assert len(calls) == 6 and len(json.loads(Path(path).read_text())["meta"]["parts"]) == 3  # nothing left to run


def test_a_cell_longer_than_a_command_keeps_the_file_and_the_others(tmp_path):
    path, timer, cuts = str(tmp_path / "run.json"), Timer(iters=1, trials=1), [2]

    def long(timer):
        if cuts[0]:
            cuts[0] -= 1
            raise _CutShort
        return {"v": 2.0}

    cells = [Cell("s", "x", {}, lambda timer: {"v": 1.0}), Cell("s", "long", {}, long),
             Cell("s", "z", {}, lambda timer: {"v": 3.0})]  # fmt: skip
    for _ in range(2):  # cut short in the long cell: after x, then, resumed, after z (the cut cell runs last)
        with pytest.raises(_CutShort):
            run_cells(cells, json_path=path, timer=timer, progress=False, resume=True)
    doc = json.loads(Path(path).read_text())
    assert [r["label"] for r in doc["results"]] == ["x", "z"]
    assert [json.loads(k)[1] for k in doc["meta"]["cut_short"]] == ["long"] and len(doc["meta"]["parts"]) == 2
    assert run_cells(cells, json_path=path, timer=timer, progress=False, resume=True) == 0
    doc = json.loads(Path(path).read_text())
    assert [r["metrics"]["v"] for r in doc["results"]] == [1.0, 2.0, 3.0] and "cut_short" not in doc["meta"]


def test_a_command_with_a_time_limit_stops_between_cells_and_resumes(tmp_path, capsys, monkeypatch):
    path, timer, now = str(tmp_path / "run.json"), Timer(iters=1, trials=1), [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: now[0])  # a clock that only the cells move

    def takes(seconds):
        def fn(timer):
            now[0] += seconds
            return {"v": seconds}

        return fn

    cells = [Cell("s", x, {}, takes(t)) for x, t in zip("abcd", (10.0, 30.0, 10.0, 10.0), strict=True)]
    # a (10 s) starts, b fits (10 + 10 <= 45), c would not (40 + the longest, 30 > 45): two cells left
    assert run_cells(cells, json_path=path, timer=timer, progress=False, resume=True, stop_after_s=45) == 0
    doc = json.loads(Path(path).read_text())
    assert [r["label"] for r in doc["results"]] == ["a", "b"] and doc["meta"]["left"] == 2
    assert [p["cells"] for p in doc["meta"]["parts"]] == [2] and "running" not in doc["meta"]
    out = capsys.readouterr().out
    assert "2 cells, 2 ok" in out
    stopped = "stopped after 40 s (stop_after_s=45): 2 of 4 cells left; the same command with --resume runs them"
    assert f"{stopped} (--json {path})" in out
    # the first cell of a command always starts, even one longer than the limit
    assert run_cells(cells, json_path=path, timer=timer, progress=False, resume=True, stop_after_s=5) == 0
    assert [r["label"] for r in json.loads(Path(path).read_text())["results"]] == ["a", "b", "c"]
    assert "stopped after 10 s (stop_after_s=5): 1 of 4 cells left" in capsys.readouterr().out
    assert run_cells(cells, json_path=path, timer=timer, progress=False, resume=True, stop_after_s=45) == 0
    doc = json.loads(Path(path).read_text())
    assert [r["metrics"]["v"] for r in doc["results"]] == [10.0, 30.0, 10.0, 10.0] and "left" not in doc["meta"]
    assert [p["cells"] for p in doc["meta"]["parts"]] == [2, 1, 1] and "stopped" not in capsys.readouterr().out


def test_a_run_resumes_only_on_its_machine_code_timer_and_cells(tmp_path):
    path, timer = str(tmp_path / "run.json"), Timer(iters=1, trials=1)
    cells = [Cell("s", x, {}, lambda timer: {"v": 1.0}) for x in "ab"]
    run_cells(cells, json_path=path, timer=timer, progress=False)
    with pytest.raises(ValueError, match=r"expected its iters to be this run's 2; got 1"):
        run_cells(cells, json_path=path, timer=Timer(iters=2, trials=1), progress=False, resume=True)
    doc = json.loads(Path(path).read_text())
    write_json(path, dict(doc, meta=dict(doc["meta"], source="0" * 16)))
    with pytest.raises(ValueError, match=r"expected its source to be this run's '[0-9a-f]{16}'; got '0{16}'"):
        run_cells(cells, json_path=path, timer=timer, progress=False, resume=True)
    other = "embedded" if doc["meta"]["jax_constants"] == "arguments" else "arguments"
    write_json(path, dict(doc, meta=dict(doc["meta"], jax_constants=other)))  # the programs were compiled otherwise
    with pytest.raises(ValueError, match=rf"expected its jax_constants to be this run's '\w+'; got '{other}'"):
        run_cells(cells, json_path=path, timer=timer, progress=False, resume=True)
    write_json(path, doc)
    with pytest.raises(ValueError, match=r"got s: a \{\}, which this run does not list"):
        run_cells(cells[1:], json_path=path, timer=timer, progress=False, resume=True)
    Path(path).write_text("[1, 2]")
    with pytest.raises(ValueError, match="expected --json .* to be a blocksparse bench document to resume"):
        run_cells(cells, json_path=path, timer=timer, progress=False, resume=True)
    with pytest.raises(ValueError, match="expected a JSON path to resume"):
        run_cells(cells, timer=timer, progress=False, resume=True)
    fresh = str(tmp_path / "new.json")  # no file yet: a new run
    assert run_cells(cells, json_path=fresh, timer=timer, progress=False, resume=True) == 0
    assert len(json.loads(Path(fresh).read_text())["results"]) == 2


def test_a_run_resumes_across_the_code_change_it_is_told_to_accept(tmp_path):
    """``accept_source``: a document made by other code (its digest named) is continued; each part names the code
    that ran it, those of the earlier commands too; another digest is still refused."""
    path, timer = str(tmp_path / "run.json"), Timer(iters=1, trials=1)
    cells = [Cell("s", x, {}, lambda timer: {"v": 1.0}) for x in "abc"]
    run_cells(cells, json_path=path, timer=timer, progress=False, stop_after_s=1e-9)  # one cell, then stops
    doc = json.loads(Path(path).read_text())
    old = "1" * 16
    for p in doc["meta"]["parts"]:
        p.pop("source")  # as documents written before parts named their code
    write_json(path, dict(doc, meta=dict(doc["meta"], source=old)))
    with pytest.raises(ValueError, match=r"expected its source to be this run's '[0-9a-f]{16}'; got '1{16}'"):
        run_cells(cells, json_path=path, timer=timer, progress=False, resume=True, accept_source="2" * 16)
    assert run_cells(cells, json_path=path, timer=timer, progress=False, resume=True, accept_source=old) == 0
    doc = json.loads(Path(path).read_text())
    assert [r["label"] for r in doc["results"]] == ["a", "b", "c"] and doc["meta"]["source"] == _cli.source_digest()
    assert [(p["cells"], p["source"]) for p in doc["meta"]["parts"]] == [(1, old), (2, _cli.source_digest())]


def test_the_source_digest_names_the_library_code():
    digest = _cli.source_digest()
    assert re.fullmatch(r"[0-9a-f]{16}", digest) and _cli.environment()["source"] == digest


def test_a_run_records_how_jax_passed_the_constants():
    here = "arguments" if jax.config.jax_use_simplified_jaxpr_constants else "embedded"
    assert _cli.environment()["jax_constants"] == _cli.jax_constants() == here
    flag, want = ("0", "embedded") if here == "arguments" else ("1", "arguments")  # read when JAX is imported
    code = "from blocksparse.bench import _cli; print(_cli.jax_constants())"
    env = dict(os.environ, JAX_USE_SIMPLIFIED_JAXPR_CONSTANTS=flag, JAX_PLATFORMS="cpu")
    got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert got.stdout.split()[-1] == want


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
    for suite in SIZED:
        monkeypatch.setitem(suite.SIZES, "quick", suite.SIZES["tiny"])


FAST = ["--iters", "1", "--trials", "1", "--no-progress"]
SUITE_NAMES = [s.__name__.rsplit(".", 1)[1].replace("_", "-") for s in SIZED]


def test_every_suite_is_registered():
    assert set(_cli.SUITES) == {*SUITE_NAMES, "model", "decode"} and _cli.parse_suites("all") == list(_cli.SUITES)
    assert _cli.module_name("gnn-variants") == "gnn_variants"


@pytest.mark.parametrize("suite", SIZED, ids=SUITE_NAMES)
def test_every_suite_lists_checked_cells_at_every_size(suite):
    name = suite.__name__.rsplit(".", 1)[1].replace("_", "-")
    for size in ("tiny", "quick", "full"):
        cells = suite.cells(full=True) if size == "full" else suite.suite(**suite.SIZES[size])
        assert cells and all(isinstance(c, Cell) and c.suite == name for c in cells)
        assert len({c.label for c in cells}) == len(cells)  # one row each
        json.dumps([c.params for c in cells])
    assert {k for k in suite.SIZES} == {"tiny", "quick", "full"}
    assert len(suite.suite(**suite.SIZES["quick"])) <= 16  # the CPU-sized run stays short


#: The suites of the quick tiny run; the others (the longest to compile, each with quick tests of its own cells:
#: test_gnn_choice, test_gnn_graphs, the variants' tests here) run tiny in test_the_slower_suites_run_tiny.
QUICK_RUN = ["matmul", "gnn", "plan", "mosaic", "dynamic", "sharded"]
SLOW_RUN = [n for n in SUITE_NAMES if n not in QUICK_RUN]


def _tiny(tmp, suites: list[list[str]]) -> dict:
    """One run of ``suites`` (one ``--suite`` each group) at the tiny size, with --json and (with matplotlib) --plot."""
    argv = ["bench", *(a for group in suites for a in ("--suite", ",".join(group))), "--json", str(tmp / "bench.json"),
            *FAST]  # fmt: skip
    has_mpl = importlib.util.find_spec("matplotlib") is not None
    if has_mpl:
        argv += ["--plot", str(tmp / "figs")]
    with pytest.MonkeyPatch.context() as mp:
        for suite in SIZED:
            mp.setitem(suite.SIZES, "quick", suite.SIZES["tiny"])
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = main(argv)
    return dict(code=code, out=out.getvalue(), doc=json.loads((tmp / "bench.json").read_text()),
                figs=tmp / "figs" if has_mpl else None)  # fmt: skip


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """The quick suites' tiny run: three ``--suite`` options, one naming two suites and one naming four."""
    return _tiny(tmp_path_factory.mktemp("bench"), [["matmul", "gnn"], ["plan"], QUICK_RUN[3:]])


def test_quick_suites_run_print_the_table_and_exit_0(tiny_run):
    out = tiny_run["out"]
    assert tiny_run["code"] == 0, out
    assert all(f"[{name}]" in out for name in QUICK_RUN) and "FAILED" not in out
    if tiny_run["doc"]["meta"]["platform"] == "cpu":
        assert "pure-JAX (XLA) implementations run" in out and "dsd: xla" in out and "dyn_dsd: xla" in out
    assert " ok, 0 failed in " in out


def test_json_holds_every_cell_with_its_metrics(tiny_run):
    doc = tiny_run["doc"]
    assert doc["meta"]["suites"] == QUICK_RUN
    assert doc["meta"]["full"] is False and doc["meta"]["iters"] == 1 and doc["meta"]["seconds"] > 0
    results = doc["results"]
    assert {r["suite"] for r in results} == set(QUICK_RUN) and all(r["ok"] for r in results)
    ran = [s for s, name in zip(SIZED, SUITE_NAMES, strict=True) if name in QUICK_RUN]
    assert len(results) == sum(len(s.suite(**s.SIZES["tiny"])) for s in ran)
    kinds = {r["params"].get("kind") for r in results if r["suite"] == "matmul"}
    assert kinds == {"dense", "static", "dynamic"}
    for r in results:
        if r["suite"] not in ("matmul", "gnn", "plan"):
            continue
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


def _newer_suites_cells(run) -> dict:
    """The cells of the suites after the first three, checked: the default's both timings, its dispatch log, a
    baseline in the same run; on a CPU the GPU variants recorded as skipped (with the reason), never failed.
    ``(suite, label) -> metrics``."""
    results = [r for r in run["doc"]["results"] if r["suite"] in SUITE_NAMES[3:]]
    for r in results:
        m = r["metrics"]
        if r["skipped"]:
            assert r["suite"] == "sharded" and "devices" in r["skipped"]
            continue
        assert m["loop_ms"] > 0 and m["calls_ms"] > 0 and m["implementation"], r
        assert r["suite"] == "training" or any(k.endswith("_loop_ms") for k in m), r  # a baseline beside it
        if run["doc"]["meta"]["platform"] == "cpu":
            assert all("needs a" in v or "refused" in v or "Hopper" in v for k, v in m.items()
                       if k.endswith("_skipped")), m  # fmt: skip
    return {(r["suite"], r["label"]): r["metrics"] for r in results}


def _pngs(run, want: set[str]):
    if run["figs"] is None:
        pytest.skip("matplotlib is not installed")
    names = sorted(p.name for p in run["figs"].iterdir())
    assert want <= set(names), names
    assert all((run["figs"] / n).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for n in names)


def test_the_new_suites_measure_dense_or_xla_beside_the_default(tiny_run):
    by = _newer_suites_cells(tiny_run)
    mosaic = [m for (s, _), m in by.items() if s == "mosaic"]
    assert mosaic and all("dense_loop_ms" in m and "xla_loop_ms" in m for m in mosaic)
    if tiny_run["doc"]["meta"]["platform"] == "cpu":
        assert all(m["mosaic_skipped"].startswith("needs a Hopper GPU") for m in mosaic)
    sharded = [m for (s, _), m in by.items() if s == "sharded" and m]
    assert all(m["devices"] == 4 and m["rel_err"] < 1e-4 for m in sharded)  # tests run with 4 CPU devices


def test_plot_writes_pngs(tiny_run):
    _pngs(tiny_run, {"gnn_vs_reference.png", "matmul_n16.png", "plan_speedup.png", "sharded.png"})


@pytest.mark.slow  # about 30 s on 2 cores: compiling the variants' and the graphs' cells and a training step
def test_the_slower_suites_run_tiny(tmp_path):
    run = _tiny(tmp_path, [SLOW_RUN])
    assert run["code"] == 0, run["out"]
    assert all(f"[{name}]" in run["out"] for name in SLOW_RUN) and " ok, 0 failed in " in run["out"]
    assert {r["suite"] for r in run["doc"]["results"]} == set(SLOW_RUN)
    by = _newer_suites_cells(run)
    training = {label.split()[0]: m for (s, label), m in by.items() if s == "training"}
    assert set(training) == set(bench_training.VARIANTS) and training["dense"]["loop_vs_dense"] == 1.0
    assert len({round(m["loss0"], 4) for m in training.values()}) == 1 and training["rigl"]["moved_per_layer"] > 0
    _pngs(run, {"gnn_graphs.png"})


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
    # beside a suite that runs (dynamic: one cell at the tiny size)
    assert main(["bench", "--suite", "dynamic,model", *FAST]) == 3  # could not run (1: a result disagreed)
    out = capsys.readouterr().out
    assert "[dynamic]" in out and "no module blocksparse.bench.model" in out and "1 failed" in out
    fake = types.ModuleType("blocksparse.bench.model")

    def cells(*, full):
        raise ModuleNotFoundError("No module named 'safetensors'", name="safetensors")

    fake.cells = cells
    monkeypatch.setitem(sys.modules, "blocksparse.bench.model", fake)
    assert main(["bench", "--suite", "model", *FAST]) == 3
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


def test_bench_resume_continues_the_json_run(monkeypatch, tmp_path, capsys):
    ran = []
    cell = Cell("plan", "a", {}, lambda timer: ran.append(1) or {"implementation": "x"})
    monkeypatch.setattr(bench_plan, "cells", lambda *, full: [cell])
    path = str(tmp_path / "run.json")
    assert main(["bench", "--suite", "plan", "--json", path, "--resume", *FAST]) == 0  # no file yet: a new run
    assert main(["bench", "--suite", "plan", "--json", path, "--resume", *FAST]) == 0
    assert len(ran) == 1 and "1 of 1 cells measured, 0 to run" in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:  # other timer settings: bad input, one line
        main(["bench", "--suite", "plan", "--json", path, "--resume", "--iters", "2", "--trials", "1"])
    assert info.value.code == 2 and "expected its iters to be this run's 2" in capsys.readouterr().err


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
        (["bench", "--suite", "nope"], f"--suite: expected a suite in {', '.join(_cli.SUITES)}, all; got 'nope'"),
        (["bench", "--suite", ","], f"expected a suite in {', '.join(_cli.SUITES)}, all; got ','"),
        (["bench", "--iters", "0"], "argument --iters: expected a positive integer, got 0"),
        (["bench", "--trials", "x"], "argument --trials: expected a positive integer, got 'x'"),
        (["bench", "--json", "/no/such/folder/b.json"], "expected --json to name a writable file"),
        (["bench", "--plot", "/no/such/folder/figs"], "expected --plot to name a folder in an existing one"),
        (["bench", "--resume"], "expected --json PATH with --resume (the run to continue); got none"),
        (["bench", "--stop-after-s", "0"], "argument --stop-after-s: expected a positive finite number, got 0.0"),
        (["bench", "--stop-after-s", "soon"], "argument --stop-after-s: expected a positive number, got 'soon'"),
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


# -- the GPU variants, in the interpreter on a faked H200 ----------------------------------------------------
def _interpreted(cells):
    timer = Timer(iters=1, trials=1, warmup=0)
    with hardware.fake(hardware.H200), bs.interpret():
        return [run_cell(c, timer) for c in cells]


MOSAIC_TINY = dict(dtype="float16", variants=True, dsd=(128, (64,), (64,), (2,), ("uniform",), (None,)),
                   dds=(((64, 128, 128),), (64,), (2,)), sdd=((("dsd", 128, 128, 64),), (64,), (2,)),
                   bands=((("dsd", 128, 128, 64),), (16,), (2,)))  # fmt: skip


@sweep("kind", ["dsd", "dds", "sdd", "bands"], quick=0)  # the kernels themselves: their own interpreter tests
def test_mosaic_cells_run_every_kernel_and_a_forced_variant_in_the_interpreter(kind, monkeypatch):
    """On a faked H200 the cell runs dense, XLA, Triton, Mosaic and its config= variants, each checked."""
    variants = {
        "dsd": ("DSD_VARIANTS", {"tn64_s2": dict(tn=64, stages=2)}),
        "dds": ("DDS_VARIANTS", {"tm64": dict(tm=64)}),
        "sdd": ("SDD_VARIANTS", {"splits2": dict(splits=2)}),
        "bands": ("BAND_VARIANTS", {"tm64": dict(tm=64)}),
    }
    monkeypatch.setattr(bench_mosaic, variants[kind][0], variants[kind][1])
    monkeypatch.setattr(bench_mosaic, "TRITON_SPLITS", (2,))
    cells = [c for c in bench_mosaic.suite(**MOSAIC_TINY) if c.label.startswith(kind)]
    (r,) = _interpreted(cells)
    assert r.ok, r.error
    m = r.metrics
    names = ["dense", "xla", "triton", "mosaic", *variants[kind][1]] + (["triton_unsplit", "triton_splits2"]
                                                                        if kind == "sdd" else [])  # fmt: skip
    assert not [k for k in m if k.endswith("_skipped")], m
    assert all(m[f"{n}_loop_ms"] > 0 and m[f"{n}_calls_ms"] > 0 for n in names), m
    assert m["mosaic_implementation"].endswith(": mosaic") and m["triton_implementation"].endswith(": pallas")
    assert m["speedup_vs_triton"] > 0 and m["best"] in variants[kind][1]


@pytest.mark.slow  # the dynamic cell runs seven kernels in the interpreter (about a minute on 2 cores)
def test_dynamic_and_triton_variants_reach_their_kernels_in_the_interpreter(monkeypatch):
    """The dynamic suite's Triton designs (config=TritonConfig(dynamic=...)) and Mosaic paths, and the matmul
    suite's Triton tilings, on a faked H200."""
    monkeypatch.setattr(bench_matmul, "TRITON_VARIANTS", {"tn64": dict(tn=64), "accT": dict(transpose_acc=True)})
    cells = bench_dynamic.suite(m=128, ns=(64,), blocks=(64,), densities=(1 / 2,), dtype="float16")
    cells += [c for c in bench_matmul.suite(m=64, ns=(16,), blocks=(16,), densities=(1 / 4,), dtype="float32",
                                            variants=True) if c.params["kind"] == "static"]  # fmt: skip
    dyn, static = _interpreted(cells)
    assert dyn.ok and static.ok, (dyn.error, static.error)
    assert not [k for k in (*dyn.metrics, *static.metrics) if k.endswith("_skipped")]
    assert dyn.metrics["scan_implementation"] == dyn.metrics["worklist_implementation"] == "dyn_dsd: pallas"
    assert dyn.metrics["dynamic_mosaic_implementation"] == "dyn_dsd: mosaic" and dyn.metrics["scan_loop_vs_static"] > 0
    assert static.metrics["tn64_implementation"] == "dsd: pallas" and static.metrics["best"] in ("tn64", "accT")


@pytest.mark.slow  # every variant interpreted; the configs reach the kernels in test_gnn_config.py
def test_gnn_variant_cells_run_their_configs_in_the_interpreter(monkeypatch):
    """Each gather / attention / packed variant reaches its kernel through config= and matches XLA."""
    monkeypatch.setattr(bench_gnn_variants, "SPMM", {"w2": dict(num_warps=2), "G2": dict(nodes_per_program=2)})
    monkeypatch.setattr(bench_gnn_variants, "MAX", {"key": dict(key_reduce=True)})
    monkeypatch.setattr(bench_gnn_variants, "_TABLES", {"spmm": bench_gnn_variants.SPMM, "max": bench_gnn_variants.MAX})
    monkeypatch.setattr(bench_gnn_variants, "ATTENTION", {"be16": (dict(edges_per_step=16), False)})
    monkeypatch.setattr(bench_gnn_variants, "NODES_PER_PROGRAM", (1, 2))
    monkeypatch.setitem(bench_gnn_variants.HALF, "max", {"narrow": dict(num_warps=2, narrow_loads=True)})
    cells = [c for c in bench_gnn_variants.suite(**bench_gnn_variants.SIZES["tiny"]) if c.params["kind"] != "dynamic"]
    for r in _interpreted(cells):
        assert r.ok, (r.label, r.error)
        names = [k[: -len("_loop_ms")] for k in r.metrics if k.endswith("_loop_ms")]
        assert not [k for k in r.metrics if k.endswith("_skipped")] and len(names) >= 2, r.metrics
        assert r.metrics["implementation"].split(": ")[1] == "pallas" and "best" in r.metrics


# -- the peer scripts, on the CPU (torch absent: their own cells skipped, the suites' cells run) --------------
@pytest.mark.slow  # the peer scripts end to end; their imports: test_bench_scripts_import.py
def test_peer_scripts_run_the_suites_cells_and_skip_their_peers(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    for name, argv in (("bench_matmul", ["--small", "--b", "16", "--d", "4"]),
                       ("bench_gnn", ["--small", "--ops", "spmm_sum", "gatv2", "--heads", "2"]),
                       ("bench_gnn_graphs", ["--small"])):  # fmt: skip
        out = tmp_path / f"{name}.json"
        script = bench_scripts.load(name)
        assert script.main([*argv, "--json", str(out)]) == 0, name
        doc = json.loads(out.read_text())
        assert doc["meta"]["script"] == f"benchmarks/{name}.py"
        mine = [r for r in doc["results"] if not r["suite"].endswith("-peers")]
        peers = [r for r in doc["results"] if r["suite"].endswith("-peers")]
        assert mine and all(r["ok"] and not r["skipped"] and r["metrics"]["loop_ms"] > 0 for r in mine), name
        if name == "bench_gnn_graphs":  # its torch peers run inside the suite's cells: recorded as skipped there
            peers = [r for r in mine if "pyg-scatter_skipped" in r["metrics"]]
            assert len(peers) == len(mine), name
            assert script.main([*argv, "--json", str(out), "--resume"]) == 0  # every cell kept: none runs again
            again = json.loads(out.read_text())
            assert again["results"] == doc["results"] and [p["cells"] for p in again["meta"]["parts"]] == [len(mine), 0]
            continue
        assert peers and all(r["ok"] and r["skipped"] for r in peers), name  # torch missing, or GPU-only


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
        f"python -m blocksparse bench: error: argument --suite: expected a suite in {', '.join(_cli.SUITES)}, all; "
        "got 'nope' (see --help)"
    )


def test_small_block_cells_record_the_plan_beside_the_default():
    """Off a GPU: the default (XLA) against dense, the grouped plan's modelled bytes, the kernel recorded as
    skipped with the reason, no claim."""
    for c in bench_matmul.small_blocks(**bench_matmul.SMALL["tiny"]):
        r = run_cell(c, Timer(iters=1, trials=1, warmup=0))
        assert r.ok, (r.label, r.error)
        m = r.metrics
        assert c.params["kind"] == "small" and m["implementation"] == f"{c.params['op']}: xla" and m["rel_err"] < 1e-5
        assert not m["claimed"] and not m["grouped_ran"] and m["grouped_skipped"].startswith("needs a GPU")
        assert (m["plan_group"], m["plan_fill"]) == (4, 1.0) and m["plan_bytes_per_flop"] < m["worklist_bytes_per_flop"]
        assert m["share_of_dense"] > 0 and m["dense_loop_ms"] > 0


@pytest.mark.slow  # two products interpreted three ways (about 11 s on 2 cores); the kernel's own tests are quick
def test_small_block_cells_time_the_default_the_rule_replaced_and_the_grouped_kernel():
    """The matmul suite's small-block sweep in the interpreter on a faked H200, with the rule's size threshold
    lowered to the tiny operands: where the measured rule claims the product the default runs the grouped kernel,
    the cell also times the default without the rule (``previous``) and records the grouped plan's modelled bytes."""
    from blocksparse.ops.matmul import tuned

    cells = bench_matmul.small_blocks(**dict(bench_matmul.SMALL["tiny"], dtype="bfloat16"))
    labels = ["small n=256 b=16 d=1/4 W @ x clustered", "small n=256 b=16 d=1/4 x @ W clustered"]
    assert [c.label for c in cells] == labels
    with tuned.override(GROUPED_PREFER_MIN=256):  # n = 256: past the few-token kernel too
        results = _interpreted(cells)
    for r in results:
        assert r.ok, (r.label, r.error)
        m = r.metrics
        assert m["claimed"] and m["grouped_ran"] and m["implementation"].endswith(": pallas"), m
        assert m["plan_fill"] == 1.0 and m["plan_bytes_per_flop"] < m["worklist_bytes_per_flop"]
        assert m["previous_loop_ms"] > 0 and m["speedup_vs_previous"] > 0 and m["grouped_vs_default"] > 0
        assert 0 < m["share_of_dense"] and m["rel_err"] < 1e-2
    (r,) = _interpreted(cells[:1])  # without the override: below the sizes measured, the old path
    assert r.ok and not r.metrics["claimed"] and not r.metrics["grouped_ran"] and "previous_loop_ms" not in r.metrics
