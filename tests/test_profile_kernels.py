"""What the kernel profiles rest on, on the CPU: the kernels' index constants stay constants, the timed loop is
the traced loop, and ``benchmarks/profile_kernels.py`` reads ncu's CSV and a trace's intervals right."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from bench_scripts import load
from hypothesis import given, settings
from hypothesis import strategies as st

import blocksparse as bs
from blocksparse.bench import Timer
from blocksparse.bench._trace import busy_time
from blocksparse.ops.matmul.schedule import kernel_constant


def _compiled_text(wrap, a) -> str:
    """The optimized HLO of a function passing ``wrap(a)`` to an opaque call (a custom call, like a kernel)."""

    def f(x):
        c = wrap(a)
        out = jax.ShapeDtypeStruct((), jnp.int32)
        return x + jax.pure_callback(lambda c: np.int32(c[: a.size].sum()), out, c)

    return jax.jit(f).lower(jnp.int32(0)).compile().as_text()


@pytest.mark.parametrize(
    "a",
    [np.arange(64), np.arange(0, 64, 4), np.full(64, 3), np.full(64, -1), np.full(2, -2), np.array([0, 7])],
    ids=["iota", "strided", "equal", "minus-one", "pair", "two-from-zero"],
)
def test_xla_rewrites_these_constants_and_kernel_constant_keeps_them(a):
    """The rewrite is real (an iota or a broadcast in XLA's output), and kernel_constant's operand avoids it."""
    a = a.astype(np.int32)
    plain = _compiled_text(jnp.asarray, a)
    assert "iota" in plain or "broadcast" in plain
    kept = _compiled_text(kernel_constant, a)
    assert "iota" not in kept and "broadcast" not in kept


@pytest.mark.parametrize("a", [np.array([0]), np.array([-1]), np.array([5]), np.zeros(0)], ids=str)
def test_kernel_constant_of_one_element_or_none_stays_a_constant(a):
    """One element is never rewritten, but one element and one tail would be (``0, x`` is a strided iota)."""
    kept = _compiled_text(kernel_constant, a.astype(np.int32))
    assert "iota" not in kept and "broadcast" not in kept


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-(2**31), 2**31 - 1), max_size=40))
def test_kernel_constant_keeps_every_value_and_appends_one_breaking_the_patterns(values):
    a = np.asarray(values, np.int64).astype(np.int32)
    out = np.asarray(kernel_constant(a))
    assert out.dtype == np.int32 and out.shape == (a.size + 2,)
    np.testing.assert_array_equal(out[: a.size], a)
    assert np.unique(out).size > 1  # never all equal
    steps = np.diff(out.astype(np.int64))
    assert out[0] != 0 or np.unique(steps).size > 1  # never 0, s, 2s, ...


def test_kernel_constant_passes_traced_arrays_through():
    got = jax.jit(lambda x: kernel_constant(x))(jnp.arange(3))
    np.testing.assert_array_equal(np.asarray(got), [0, 1, 2])


@pytest.mark.slow
def test_the_products_still_match_the_dense_product_with_the_padded_constants():
    """The Triton kernels (interpreted here) read only their schedules' entries, not the trailing element."""
    W = bs.random(jax.random.key(0), (64, 96), 16, 0.5, jnp.float32)
    x = jax.random.normal(jax.random.key(1), (96, 32), jnp.float32)
    with bs.interpret():
        got = np.asarray(bs.matmul(W, x, implementation="pallas"))
        grad = np.asarray(jax.grad(lambda W: bs.matmul(W, x, implementation="pallas").sum())(W).to_dense())
    np.testing.assert_allclose(got, np.asarray(W.to_dense() @ x), rtol=2e-2, atol=2e-2)
    mask = np.kron(W.pattern.mask(), np.ones((16, 16), np.float32))
    want = np.asarray(jax.grad(lambda a: (a @ x).sum())(W.to_dense())) * mask
    np.testing.assert_allclose(grad, want, rtol=2e-2, atol=2e-2)  # the sdd at the pattern's constant coordinates
    from blocksparse.ops.matmul import TritonConfig

    full = bs.BlockSparseMatrix(bs.BlockPattern.from_mask(np.ones((2, 6), bool), (16, 16)),
                                jax.random.normal(jax.random.key(2), (12, 16, 16), jnp.float32))  # fmt: skip
    split = TritonConfig(max_len=2, stream=False)  # the work list, rows split in three: partials, the combine kernel
    with bs.interpret():
        got = np.asarray(bs.matmul(full, x, implementation="pallas", config=split))
        jaxpr = jax.make_jaxpr(lambda W, x: bs.matmul(W, x, implementation="pallas", config=split))(full, x)
        assert "bs_combine" in str(jaxpr)
    np.testing.assert_allclose(got, np.asarray(full.to_dense() @ x), rtol=2e-2, atol=2e-2)


def test_loop_function_is_what_loop_times(monkeypatch):
    timer = Timer(iters=3, trials=1, warmup=0)
    x = jnp.arange(4.0)
    f = timer.loop_function(lambda a: a * 2, 3)
    assert float(f((x,))) == pytest.approx(0.0)  # three probes of the first element, 0 * 2
    assert float(timer.loop_function(lambda a: a + 1, 3)((x,))) == pytest.approx(3.0)
    built = []
    original = Timer.loop_function
    monkeypatch.setattr(Timer, "loop_function", lambda self, fn, iters=None: built.append(iters) or original(
        self, fn, iters))  # fmt: skip
    assert timer.loop(lambda a: a + 1, x, iters=2) > 0 and built == [2]  # loop() times exactly that function


# -- the script ---------------------------------------------------------------------------------------------
NCU_CSV = """==PROF== Connected to process 1 (/usr/bin/python3)
==PROF== Profiling "bs_kernel" - 0: 0%....50%....100% - 9 passes
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","1","python3","h","bs_kernel","1","7","(128, 1, 1)","(132, 1, 1)","0","9.0","GPU Speed Of Light Throughput","Duration","ns","6,624"
"0","1","python3","h","bs_kernel","1","7","(128, 1, 1)","(132, 1, 1)","0","9.0","GPU Speed Of Light Throughput","L2 Cache Throughput","%","34.36"
"0","1","python3","h","bs_kernel","1","7","(128, 1, 1)","(132, 1, 1)","0","9.0","Command line profiler metrics","lts__t_bytes.sum","byte","16644896"
"0","1","python3","h","bs_kernel","1","7","(128, 1, 1)","(132, 1, 1)","0","9.0","Launch Statistics","Cluster Scheduling Policy","","PolicySpread"
"1","1","python3","h","loop_fusion","1","7","(256, 1, 1)","(4, 1, 1)","0","9.0","GPU Speed Of Light Throughput","Duration","usecond","2.5"
"""  # noqa: E501


def test_ncu_csv_is_parsed_per_launch_with_units():
    script = load("profile_kernels")
    kernels = script.parse_ncu_csv(NCU_CSV)
    assert [k["name"] for k in kernels] == ["bs_kernel", "loop_fusion"]
    m = kernels[0]["metrics"]
    assert m["GPU Speed Of Light Throughput / Duration"] == [6624.0, "ns"]  # thousands separator dropped
    assert m["Launch Statistics / Cluster Scheduling Policy"] == ["PolicySpread", ""]  # text stays text
    s = [script.summarise(k, [("lts__t_bytes.sum", "l2_bytes")]) for k in kernels]
    assert s[0]["duration_us"] == pytest.approx(6.624) and s[1]["duration_us"] == pytest.approx(2.5)
    assert s[0]["l2_pct"] == pytest.approx(34.36) and s[0]["l2_bytes"] == 16644896.0 and s[1]["l2_bytes"] is None
    assert script.parse_ncu_csv("==ERROR== no kernels were profiled\n") == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 20)), max_size=12))
def test_busy_time_is_the_union_of_the_intervals(spans):
    events = sorted((("k", float(a), float(a + w)) for a, w in spans), key=lambda e: e[1])
    grid = np.zeros(80, bool)  # unit cells of [0, 80)
    for _, a, b in events:
        grid[int(a) : int(b)] = True
    assert busy_time(events) == pytest.approx(grid.sum())


def test_cases_are_checked_and_build_on_the_cpu():
    script = load("profile_kernels")
    assert script.parse_case("mosaic:64:16:256") == ("mosaic", 64, 16, 256, {})
    got = script.parse_case("mosaic:64:4:4096:tn=256,persistent=true,grid_order=units,max_len=none")
    assert got[4] == {"tn": 256, "persistent": True, "grid_order": "units", "max_len": None}
    for bad in ("mosaic:64:16", "cuda:64:16:256", "dense:0:4:256", "dense:a:4:256", "pallas:64:4:256:tn=64",
                "mosaic:64:4:256:tn", "mosaic:64:4:256:=3"):  # fmt: skip
        with pytest.raises(ValueError, match="Expected a case IMPL:B:D:N"):
            script.parse_case(bad)
    assert script.parse_case("grouped:16:4:4096:pattern=clustered,op=dds")[4] == {"pattern": "clustered", "op": "dds"}
    for bad in ("grouped:16:4:64:pattern=banded", "pallas:16:4:64:op=sdd", "mosaic:64:4:64:op=dds,tn=64"):
        with pytest.raises(ValueError, match="Expected a case IMPL:B:D:N"):
            script.parse_case(bad)
    cases = (("default:16:4:32", 64), ("mosaic:64:2:64:tn=64,stages=2", 128), ("dense:16:4:32:op=dds", 64),
             ("grouped:16:4:128:pattern=clustered,op=dds", 128))  # fmt: skip
    for case, m in cases:
        fn, (W, x) = script.build(case, m)
        with bs.interpret():  # the Mosaic and grouped cases: their kernels in the GPU interpreter
            grouped = re.search(r"bs_\w+_grouped", str(jax.make_jaxpr(fn)(W, x)))
            assert bool(grouped) == case.startswith("grouped"), case  # the grouped kernel where asked, only there
            got = np.asarray(fn(W, x), np.float32)
        w = np.asarray(W.to_dense() if isinstance(W, bs.BlockSparseMatrix) else W, np.float32)
        x = np.asarray(x, np.float32)
        want = x @ w if "op=dds" in case else w @ x
        np.testing.assert_allclose(got, want, rtol=3e-2, atol=3e-2)


def test_the_script_times_and_traces_without_ncu(tmp_path, capsys):
    """On the CPU the trace has no GPU stream: recorded as such, and the run still writes its JSON."""
    import json

    script = load("profile_kernels")
    out = tmp_path / "p.json"
    assert script.main(["--no-ncu", "--m", "64", "--cases", "dense:16:4:32", "--json", str(out)]) == 0
    (cell,) = json.loads(out.read_text())["results"]  # one cell per case, as blocksparse bench writes them
    row = cell["metrics"]
    assert cell["ok"] and cell["label"] == "dense:16:4:32" and cell["params"]["impl"] == "dense"
    assert row["case"] == "dense:16:4:32" and row["loop_ms"] > 0 and row["calls_ms"] > 0
    assert row["trace"] == {"error": "the trace holds no GPU stream events"}
    assert "dense:16:4:32" in capsys.readouterr().out
