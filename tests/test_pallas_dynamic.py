"""Dynamic block-sparse products through the Pallas kernels (work list built inside jit).

CPU (CI): the kernels in Pallas' interpreter against a float64 oracle. GPU (``-m gpu``): the
real kernels against the pure-JAX reference on fresh random patterns, forward and backward.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import examples, sweep
from hypothesis import given, settings
from hypothesis import strategies as st

import blocksparse as bs
from blocksparse.ops.matmul import TritonConfig
from blocksparse.testing import strategies as bst
from blocksparse.testing.oracles import assert_close, to_dense64

ON_GPU = jax.default_backend() == "gpu"


def _np(x):
    return np.asarray(jnp.asarray(x, jnp.float32), np.float64)


def _check(D, n, key, dtype, config=None):
    """Forward both orders, sdd, and gradients of the Pallas path against oracles / the reference; ``config``
    applies to the forward products (the backward's take the defaults)."""
    m, k = D.shape
    kx, kt, kg = jax.random.split(key, 3)
    x = jax.random.normal(kx, (k, n), dtype)
    xt = jax.random.normal(kt, (n, m), dtype)
    w64 = to_dense64(D)
    # On the GPU, float32 dots run on TF32 tensor cores (like XLA's default): float16's mantissa.
    tol = jnp.float16 if ON_GPU and dtype == jnp.float32 else dtype
    with bs.dispatch_log() as log:
        y = jax.jit(lambda D, x: bs.matmul(D, x, implementation="pallas", config=config))(D, x)
        z = jax.jit(lambda D, x: bs.matmul(x, D, implementation="pallas", config=config))(D, xt)
    assert set(log) == {("dyn_dsd", "pallas")}
    assert_close(y, w64 @ _np(x), np.abs(w64) @ np.abs(_np(x)), tol, "D @ x")
    assert_close(z, _np(xt) @ w64, np.abs(_np(xt)) @ np.abs(w64), tol, "x @ D")

    def loss(impl, config=None):
        def f(d, x):
            y = bs.matmul(D.with_data(d), x, implementation=impl, config=config)
            return jnp.sum(jnp.sin(y.astype(jnp.float32)))

        return f

    gp = jax.jit(jax.grad(loss("pallas", config), (0, 1)))(D.data, x)
    gx = jax.jit(jax.grad(loss("xla"), (0, 1)))(D.data, x)
    scale = float(np.abs(w64).sum() + np.abs(_np(x)).sum() + 1.0)
    assert_close(gp[0], _np(gx[0]), scale, tol, "d data")
    assert_close(gp[1], _np(gx[1]), scale, tol, "d x")
    a = jax.random.normal(kg, (m, n), dtype)
    s_p = bs.sdd(a, x.T, D, implementation="pallas", config=config)
    s_x = bs.sdd(a, x.T, D, implementation="xla")
    bound = float(np.abs(_np(a)).max() * np.abs(_np(x)).max() * n)
    assert_close(s_p.data, _np(s_x.data), bound, tol, "sdd")


@settings(max_examples=examples(8))
@given(
    bst.dynamic_block_sparse_matrices(block_size=st.sampled_from([(16, 16), (16, 32), (32, 16)]), max_blocks=4),
    st.sampled_from([1, 8, 20]),
    st.sampled_from([None, 1, 2]),
    st.sampled_from(["scan", "worklist"]),
    st.integers(0, 2**16),
)
def test_dynamic_pallas_interpret(D, n, max_len, mode, seed):
    with bs.interpret():
        _check(D, n, jax.random.key(seed), jnp.float32, TritonConfig(max_len=max_len, dynamic=mode))


@sweep(
    "kind,mode",
    [(k, m) for m in ["scan", "worklist"] for k in ["one_row", "one_col", "empty", "all_padding"]],
    quick=[("one_row", "scan"), ("all_padding", "worklist")],
)
def test_dynamic_pallas_adversarial_interpret(mode, kind, getkey):
    gm = gk = 4
    cap = 12
    rng = np.random.default_rng(1)
    rows, cols = rng.integers(0, gm, cap), rng.integers(0, gk, cap)
    nnz = cap
    if kind == "one_row":
        rows[:] = 2
    elif kind == "one_col":
        cols[:] = 3
    elif kind == "empty":
        nnz = 0
    else:  # padding holds out-of-range garbage, which must be ignored
        nnz, rows[:], cols[:] = 0, 99, -5
    D = bs.DynamicBlockSparseMatrix.from_blocks(
        rows, cols, jax.random.normal(getkey(), (cap, 16, 16)), nnz, shape=(64, 64), capacity=cap
    )
    with bs.interpret():
        _check(D, 16, getkey(), jnp.float32, TritonConfig(dynamic=mode))


@pytest.mark.slow  # a row split over several units: quick in the adversarial one_row case and the sweep above
def test_dynamic_pallas_one_long_row_interpret(getkey):
    # 40 blocks in one row of a 4-row grid: split over several units, combined afterwards.
    rows = jnp.zeros(40, jnp.int32).at[-2:].set(jnp.array([2, 3]))
    cols = jnp.arange(40, dtype=jnp.int32) % 4
    D = bs.DynamicBlockSparseMatrix.from_blocks(
        rows, cols, jax.random.normal(getkey(), (40, 16, 16)), 38, shape=(64, 64), capacity=48
    )
    for mode in ("scan", "worklist"):
        with bs.interpret():
            _check(D, 16, getkey(), jnp.float32, TritonConfig(dynamic=mode))


def test_dynamic_falls_back_without_gpu(getkey):
    if ON_GPU:
        pytest.skip("has a GPU")
    D = bs.DynamicBlockSparseMatrix.from_static(bs.random(getkey(), (32, 32), 16, 0.5))
    with bs.dispatch_log() as log:
        bs.matmul(D, jnp.ones((32, 4)))
    assert log == [("dyn_dsd", "xla")]
    D8 = bs.DynamicBlockSparseMatrix.from_static(bs.random(getkey(), (32, 32), 8, 0.5))
    with bs.interpret(), bs.dispatch_log() as log:
        bs.matmul(D8, jnp.ones((32, 4)))
    assert log == [("dyn_dsd", "xla")]  # block 8 is not a kernel size
    with bs.interpret(), pytest.raises(NotImplementedError, match=r"got \(8, 8\)"):
        bs.matmul(D8, jnp.ones((32, 4)), implementation="pallas")


# ---- on the GPU -----------------------------------------------------------------------------
def _random_dynamic(rng, gm, gk, b, capacity, nnz, skew, dtype):
    if skew:  # one row holds half the blocks
        rows = np.where(rng.random(capacity) < 0.5, 0, rng.integers(0, gm, capacity))
    else:
        rows = rng.integers(0, gm, capacity)
    cols = rng.integers(0, gk, capacity)
    data = jnp.asarray(rng.standard_normal((capacity, b, b)), dtype)
    return bs.DynamicBlockSparseMatrix.from_blocks(rows, cols, data, nnz, shape=(gm * b, gk * b), capacity=capacity)


@pytest.mark.gpu
@pytest.mark.parametrize("b", [16, 32, 64, 128])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("skew", [False, True])
@pytest.mark.parametrize("mode", ["scan", "worklist"])
def test_dynamic_pallas_gpu(b, dtype, skew, mode):
    rng = np.random.default_rng(b + skew)
    gm, gk = 1024 // b, 768 // b
    capacity = gm * gk // 4
    D = _random_dynamic(rng, gm, gk, b, capacity, capacity - 7, skew, dtype)
    _check(D, 96, jax.random.key(b), dtype, TritonConfig(dynamic=mode))


@pytest.mark.gpu
def test_dynamic_jitted_call_needs_no_host_transfer():
    rng = np.random.default_rng(5)
    D = _random_dynamic(rng, 64, 64, 32, 512, 500, False, jnp.bfloat16)
    x = jnp.asarray(rng.standard_normal((2048, 1024)), jnp.bfloat16)
    f = jax.jit(lambda D, x: bs.matmul(D, x, implementation="pallas"))
    f(D, x).block_until_ready()
    D2 = _random_dynamic(rng, 64, 64, 32, 512, 300, True, jnp.bfloat16)
    with jax.transfer_guard("disallow"):
        y = f(D2, x)
    w64 = to_dense64(D2)
    assert_close(y, w64 @ _np(x), np.abs(w64) @ np.abs(_np(x)), jnp.bfloat16)
    assert f._cache_size() == 1


@pytest.mark.gpu
def test_dynamic_pallas_gpu_pattern_changes_without_recompiling():
    rng = np.random.default_rng(0)
    traces = []

    @jax.jit
    def f(D, x):
        traces.append(1)
        return bs.matmul(D, x)

    x = jnp.asarray(rng.standard_normal((512, 64)), jnp.bfloat16)
    for skew in (False, True, False):
        D = _random_dynamic(rng, 32, 32, 16, 256, int(rng.integers(0, 257)), skew, jnp.bfloat16)
        w64 = to_dense64(D)
        assert_close(f(D, x), w64 @ _np(x), np.abs(w64) @ np.abs(_np(x)), jnp.bfloat16)
    assert len(traces) == 1


def test_default_dispatch_is_pallas_at_every_size(getkey):
    # The scan kernel builds no plan on the device: measured faster than the pure-JAX path at any n.
    D = bs.DynamicBlockSparseMatrix.from_static(bs.random(getkey(), (32, 32), 16, 0.5))
    with bs.interpret():
        for n in (1, 8, 1024):
            with bs.dispatch_log() as log:
                bs.matmul(D, jnp.ones((32, n)))
            assert log == [("dyn_dsd", "pallas")]
        with bs.dispatch_log() as log:
            bs.matmul(D, jnp.ones((32, 8)), implementation="xla")
        assert log == [("dyn_dsd", "xla")]
