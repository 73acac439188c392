"""``blocksparse bench``: the suite protocol (Timer, checks), the suites at a tiny size, and the command line."""

import jax.numpy as jnp
import pytest

from blocksparse.bench import Cell, CellFailed, Timer, check_close, implementation, run_cell, tolerance


# -- the protocol ---------------------------------------------------------------------------------------
def test_timer_loop_and_calls_return_positive_medians():
    timer = Timer(iters=3, trials=2, warmup=0)
    x = jnp.arange(16.0).reshape(4, 4)
    assert timer.loop(lambda a: a @ a + 1, x) > 0
    assert timer.calls(lambda a: a @ a + 1, x) > 0
    assert timer.loop(lambda a, b: (a + b, jnp.zeros((0,))), x, x, iters=2) > 0  # pytree out, empty leaf


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
