"""Helpers shared by the test modules.

Quick and slow runs. ``make test`` (CI: 2 CPU cores, a 10-minute budget) runs every kernel in interpret mode on a
few representative shapes and small hypothesis sweeps; ``make test-slow`` runs the ``slow``-marked cases and every
hypothesis test at its full sweep. One switch tells them apart, the hypothesis profile (``HYPOTHESIS_PROFILE``):
``ci`` (the default) for quick runs, ``slow`` for ``make test-slow``. Tests ask this module, never the variable:

- :func:`examples` is a hypothesis test's example count: ``@settings(max_examples=examples(25))``.
- :func:`sweep` is ``pytest.mark.parametrize`` whose cases beyond the quick ones are marked ``slow``.

And the kernels' oracle checks: :func:`relative_error`, and :func:`check_product_and_gradients` for a sparse product
against its dense expression, value and both gradients.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable, Sequence

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
QUICK = PROFILE == "ci"
# A quick run takes this fraction of a sweep (each example of the interpreter tests compiles new shapes).
QUICK_FRACTION = 8
MIN_EXAMPLES = 2

_HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large]
# Tests without their own count: 3 examples in quick runs, 20 (the count of the suite before the split) in slow ones.
settings.register_profile("ci", max_examples=3, deadline=None, suppress_health_check=_HEALTH)
settings.register_profile("slow", max_examples=20, deadline=None, suppress_health_check=_HEALTH)


def load_profile() -> None:
    """Load the run's hypothesis profile (conftest.py, before any test module is imported)."""
    settings.load_profile(PROFILE)


def examples(full: int, quick: int | None = None) -> int:
    """A hypothesis test's example count: ``full`` under ``make test-slow``; ``quick`` (default: an eighth of
    ``full``, at least 2 and at most ``full``) under ``make test``: ``examples(40)`` is 5 there."""
    if not QUICK:
        return full
    return min(full, max(MIN_EXAMPLES, full // QUICK_FRACTION) if quick is None else quick)


def sweep(argnames: str | Sequence[str], argvalues: Iterable, quick: int | Collection = 1, ids=None):
    """``pytest.mark.parametrize(argnames, argvalues, ids=ids)`` whose cases outside ``quick`` are marked ``slow``.

    ``quick`` is a number (the first cases) or a collection of the values (``argvalues``' items, or a
    ``pytest.param``'s values) that ``make test`` runs. The ids are parametrize's own, so a case keeps its name
    in both runs."""
    names = [n.strip() for n in argnames.split(",")] if isinstance(argnames, str) else list(argnames)
    cases = []
    for i, value in enumerate(argvalues):
        if isinstance(value, type(pytest.param(None))):
            values, marks, id_ = value.values, list(value.marks), value.id
        else:
            values, marks, id_ = (tuple(value) if len(names) > 1 else (value,)), [], None
        key = values if len(names) > 1 else values[0]
        fast = i < quick if isinstance(quick, int) else any(_same(key, q) for q in quick)
        cases.append(pytest.param(*values, marks=marks if fast else [*marks, pytest.mark.slow], id=id_))
    return pytest.mark.parametrize(names, cases, ids=ids)


def _same(a, b) -> bool:
    try:
        return bool(a == b)
    except Exception:  # arrays and other values without a plain equality: identity only
        return a is b


def relative_error(got, want) -> float:
    """``||got - want|| / ||want||`` in float64 (the largest ``|got|`` where ``want`` is zero); the shapes must match
    and every value of ``got`` be finite (a NaN is an output the kernel never wrote, in the interpreter)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape
    assert np.isfinite(got).all(), "an output value the kernel never wrote (NaN in the interpreter) or not finite"
    scale = np.linalg.norm(want)
    return float(np.linalg.norm(got - want) / scale) if scale else float(np.abs(got).max())


def assert_same_nonfinite_then_close(got, want, what: str, atol: float = 1e-5) -> None:
    """``got`` NaN, +inf and -inf exactly where ``want`` is, and close to it (``rtol`` 1e-5) everywhere else."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    for cls in (np.isnan, np.isposinf, np.isneginf):
        np.testing.assert_array_equal(cls(got), cls(want), err_msg=f"{what}: {cls.__name__}")
    fin = np.isfinite(want)
    np.testing.assert_allclose(got[fin], want[fin], rtol=1e-5, atol=atol, err_msg=what)


def check_product_and_gradients(sparse, ref, W, x, tol: float = 1e-5) -> None:
    """``sparse(W, x)`` against ``ref(W.to_dense(), x)`` (float32 oracle, ``"highest"`` precision), and the gradients of
    the sum of squares: ``x``'s, and ``W``'s at its blocks."""
    import jax

    dense = W.to_dense()
    with jax.default_matmul_precision("highest"):
        got, want = sparse(W, x), ref(dense, x)
        gW, gx = jax.grad(lambda W, x: (sparse(W, x) ** 2).sum(), argnums=(0, 1))(W, x)
        rW, rx = jax.grad(lambda w, x: (ref(w, x) ** 2).sum(), argnums=(0, 1))(dense, x)
    assert relative_error(got, want) <= tol
    assert relative_error(gx, rx) <= tol
    assert relative_error(gW.to_dense(), rW * (dense != 0)) <= tol
