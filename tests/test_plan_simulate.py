"""The tile simulator executes a plan and reproduces W @ x, including on adversarial patterns."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import blocksparse as bs
from blocksparse.ipu.machines import IPUMachine

# Few tiles make rows span tiles and bands share tiles; plenty of memory keeps every candidate valid.
TINY = IPUMachine(name="tiny", clock_hz=1e9, num_tiles=5, tile_memory_bytes=1 << 22)


def _kind_mask(kind, gm, gk, rng):
    if kind == "random":
        return rng.random((gm, gk)) < rng.uniform(0.1, 0.9)
    mask = np.zeros((gm, gk), bool)
    if kind == "full_row":
        mask[rng.integers(gm)] = True
    elif kind == "full_col":
        mask[:, rng.integers(gk)] = True
    elif kind == "single":
        mask[rng.integers(gm), rng.integers(gk)] = True
    elif kind == "empty_rows":
        mask[::2] = rng.random((len(range(0, gm, 2)), gk)) < 0.7
    return mask  # "empty": nothing


@st.composite
def problems(draw):
    b = draw(st.sampled_from([1, 2, 4, 8]))
    gm, gk = draw(st.integers(1, 7)), draw(st.integers(1, 7))
    n = draw(st.integers(1, 24))
    kind = draw(st.sampled_from(["random", "full_row", "full_col", "single", "empty_rows", "empty"]))
    seed = draw(st.integers(0, 2**31 - 1))
    machine = draw(st.sampled_from([TINY, bs.ipu.BOW]))
    n_split = draw(st.sampled_from([None, 1, 2]))
    num_bands = draw(st.sampled_from([None, 1, 2, 3]))
    return b, gm, gk, n, kind, seed, machine, n_split, num_bands


@settings(max_examples=examples(20))
@given(problems())
def test_simulate_matches_reference(prob):
    b, gm, gk, n, kind, seed, machine, n_split, num_bands = prob
    rng = np.random.default_rng(seed)
    mask = _kind_mask(kind, gm, gk, rng)
    values = rng.standard_normal((gm * b, gk * b)).astype(np.float32)
    W = bs.BlockSparseMatrix.from_mask(mask, values, b)
    x = jnp.asarray(rng.standard_normal((gk * b, n)).astype(np.float32))
    grain = machine.column_grain("float32")
    if n_split is not None and n_split > -(-n // grain):
        n_split = None
    if num_bands is not None and num_bands > machine.num_tiles // machine.tile_grain // (n_split or 1):
        num_bands = None  # forcing more bands than grains of tiles is an error (tested in test_plan.py)
    p = bs.plan(W, n, machine=machine, dtype="float32", n_split=n_split, num_bands=num_bands)
    y = bs.simulate(p, W, x)
    ref = np.asarray(W.to_dense()) @ np.asarray(x)
    assert y.shape == (gm * b, n) and y.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(y), ref, rtol=1e-5, atol=1e-5)


def test_simulate_half_and_serial_passes(getkey):
    W = bs.random(getkey(), (256, 128), 16, 0.5, dtype=jnp.float16)
    x = jax.random.normal(getkey(), (128, 96), jnp.float16)
    # A tight memory limit forces n to be processed in passes.
    machine = IPUMachine(name="small", clock_hz=1e9, num_tiles=4, tile_memory_bytes=64 * 1024)
    p = bs.plan(W, 96, machine=machine, dtype=jnp.float16)
    assert p.serial > 1
    y = bs.simulate(p, W, x)
    ref = W.to_dense().astype(jnp.float32) @ x.astype(jnp.float32)
    assert y.dtype == jnp.float16
    np.testing.assert_allclose(np.asarray(y, np.float32), np.asarray(ref), rtol=2e-2, atol=2e-2)


def test_simulate_under_jit_with_traced_values(getkey):
    W = bs.random(getkey(), (64, 64), 8, 0.3)
    x = jax.random.normal(getkey(), (64, 16))
    p = bs.plan(W, 16, machine=TINY, dtype="float32")
    y = jax.jit(lambda W, x: bs.simulate(p, W, x))(W, x)
    np.testing.assert_allclose(np.asarray(y), np.asarray(W.to_dense() @ x), rtol=1e-5, atol=1e-5)


def test_simulate_bad_input(getkey):
    W = bs.random(getkey(), (64, 64), 8, 0.3)
    p = bs.plan(W, 16, dtype="float32")
    other = bs.random(getkey(), (64, 64), 8, 0.6)
    with pytest.raises(ValueError, match="Expected W with the planned pattern"):
        bs.simulate(p, other, jnp.ones((64, 16)))
    with pytest.raises(ValueError, match=r"Expected x of shape \(64, 16\) \(k, n\) for this plan. Got \(64, 8\)"):
        bs.simulate(p, W, jnp.ones((64, 8)))
    with pytest.raises(TypeError, match="Expected a Plan"):
        bs.simulate("plan", W, jnp.ones((64, 16)))


@st.composite
def mismatched(draw):
    """A plan for one problem, run on W and x drawn independently: often another pattern, shape or n."""
    b = draw(st.sampled_from([1, 2, 4]))
    dims = st.tuples(st.integers(1, 4), st.integers(1, 4))
    gm, gk = draw(dims)
    gm2, gk2 = draw(dims) if draw(st.booleans()) else (gm, gk)
    n = draw(st.integers(1, 8))
    n2 = draw(st.sampled_from([n, n + 1, max(n - 1, 1)]))
    seed = draw(st.integers(0, 2**31 - 1))
    same_pattern = draw(st.booleans())
    x_dtype = draw(st.sampled_from(["float32", "float32", "int32"]))
    return b, (gm, gk), (gm2, gk2), n, n2, seed, same_pattern, x_dtype


@settings(max_examples=examples(20), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mismatched())
def test_simulate_invalid_input_is_an_error_never_a_wrong_value(case):
    b, (gm, gk), (gm2, gk2), n, n2, seed, same_pattern, x_dtype = case
    rng = np.random.default_rng(seed)
    mask = rng.random((gm, gk)) < 0.6
    W1 = bs.BlockSparseMatrix.from_mask(mask, rng.standard_normal((gm * b, gk * b)).astype(np.float32), b)
    mask2 = mask if same_pattern and (gm2, gk2) == (gm, gk) else rng.random((gm2, gk2)) < 0.6
    W2 = bs.BlockSparseMatrix.from_mask(mask2, rng.standard_normal((gm2 * b, gk2 * b)).astype(np.float32), b)
    x = (rng.standard_normal((gk2 * b, n2)) * 4).astype(x_dtype)
    p = bs.plan(W1, n, machine=TINY, dtype="float32")
    try:
        y = bs.simulate(p, W2, x)
    except (ValueError, TypeError):
        return  # rejected: the right outcome for a mismatch
    # Accepted: then it was a valid call, and the result is right (never a finite wrong value).
    assert W2.pattern == W1.pattern and x.shape == (gk * b, n) and x.dtype == np.float32
    ref = np.asarray(W2.to_dense(), np.float64) @ x.astype(np.float64)
    y = np.asarray(y, np.float64)
    assert np.isnan(y).all() or np.allclose(y, ref, rtol=1e-4, atol=1e-4)
