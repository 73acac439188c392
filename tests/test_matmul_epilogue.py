"""The fused epilogue: ``bs.matmul(a, b, bias=..., activation=...)`` = ``activation(a @ b + bias)``.

Against a float64 NumPy oracle on every backend (XLA; the Pallas kernels in the interpreter on the
CPU, for real with ``-m gpu``), static and dynamic matrices, both operand orders, split rows (the
combine kernel applies the epilogue to them), and gradients against the unfused dense expression.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import examples, sweep
from hypothesis import given, settings
from hypothesis import strategies as st

import blocksparse as bs
from blocksparse.ops.matmul import TritonConfig
from blocksparse.ops.matmul.epilogue import ACTIVATIONS
from blocksparse.testing import strategies as bst
from blocksparse.testing.oracles import assert_close, to_dense64

ON_GPU = jax.default_backend() == "gpu"
_erf = np.vectorize(math.erf)
_SIG = lambda y: 1.0 / (1.0 + np.exp(-y))  # noqa: E731
ORACLE = {
    None: lambda y: y,
    "relu": lambda y: np.maximum(y, 0.0),
    "gelu": lambda y: 0.5 * y * (1.0 + _erf(y / math.sqrt(2.0))),
    "gelu_tanh": lambda y: 0.5 * y * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (y + 0.044715 * y**3))),
    "silu": lambda y: y * _SIG(y),
    "tanh": np.tanh,
    "sigmoid": _SIG,
}
assert set(ORACLE) - {None} == set(ACTIVATIONS)


def _np(x):
    return np.asarray(jnp.asarray(x, jnp.float32), np.float64)


def _check_both_orders(M, key, dtype, activation, with_bias, impl, n=24, config=None):
    m, k = M.shape
    kx, kt, kb, kc = jax.random.split(key, 4)
    x = jax.random.normal(kx, (k, n), dtype)
    xt = jax.random.normal(kt, (n, m), dtype)
    b = jax.random.normal(kb, (n,), dtype) if with_bias else None
    bt = jax.random.normal(kc, (k,), dtype) if with_bias else None
    w = to_dense64(M)
    f = ORACLE[activation]
    tol = jnp.float16 if ON_GPU and dtype == jnp.float32 else dtype
    kw = dict(activation=activation, implementation=impl, config=config)
    y = jax.jit(lambda M, x, b: bs.matmul(M, x, bias=b, **kw))(M, x, b)
    z = jax.jit(lambda M, x, b: bs.matmul(x, M, bias=b, **kw))(M, xt, bt)
    assert y.dtype == z.dtype == jnp.dtype(dtype)
    zero = lambda b: 0.0 if b is None else _np(b)  # noqa: E731
    # Activations are 1.1-Lipschitz at most: the product's error bound carries over.
    assert_close(y, f(w @ _np(x) + zero(b)), np.abs(w) @ np.abs(_np(x)) + np.abs(zero(b)), tol, "act(W @ x + b)")
    assert_close(z, f(_np(xt) @ w + zero(bt)), np.abs(_np(xt)) @ np.abs(w) + np.abs(zero(bt)), tol, "act(x @ W + b)")


ACTS = st.sampled_from([None, *ACTIVATIONS])


@settings(max_examples=examples(12))
@given(
    bst.block_sparse_matrices(block_size=st.sampled_from([(16, 16), (16, 32), (32, 16)]), max_blocks=4),
    ACTS,
    st.booleans(),
    st.sampled_from(["xla", "pallas"]),
    st.sampled_from([None, 1]),
)
def test_static_matches_oracle(W, activation, with_bias, impl, max_len):
    # max_len=1 splits every row of more than one block into partials: the combine kernel's epilogue.
    config = TritonConfig(max_len=max_len) if impl == "pallas" else None
    with bs.interpret(not ON_GPU):
        _check_both_orders(W, jax.random.key(0), jnp.float32, activation, with_bias, impl, config=config)


@pytest.mark.parametrize("n", [3, 24, 40])
def test_bias_along_more_tokens_than_w_has_rows(getkey, n):
    """``W @ x + b`` with one 16-row block row and ``b`` along ``x``'s ``n`` columns: the decoding kernel reads the bias
    a power-of-two width of tokens at a time (32, 64), so its operand must cover them (it covered W's rows; the
    interpreter refused the slice past its end, a GPU read past it). ``n = 3`` (16 tokens read) is the control."""
    W = bs.random(getkey(), (16, 48), 16, 0.7)
    with bs.interpret(not ON_GPU):
        _check_both_orders(W, getkey(), jnp.float32, "gelu", True, "pallas", n=n)


@settings(max_examples=examples(10))
@given(
    bst.dynamic_block_sparse_matrices(block_size=st.sampled_from([(16, 16), (32, 16)]), max_blocks=4, max_capacity=8),
    ACTS,
    st.booleans(),
    st.sampled_from(["xla", "scan", "worklist"]),
)
def test_dynamic_matches_oracle(D, activation, with_bias, design):
    impl = "xla" if design == "xla" else "pallas"
    config = None if impl == "xla" else TritonConfig(dynamic=design)
    with bs.interpret(not ON_GPU):
        _check_both_orders(D, jax.random.key(1), jnp.float32, activation, with_bias, impl, config=config)


@pytest.mark.parametrize("impl", ["xla", "pallas"])
def test_bfloat16_casts_once_after_the_epilogue(getkey, impl):
    W = bs.random(getkey(), (64, 64), 16, 0.5, jnp.bfloat16)
    with bs.interpret(not ON_GPU):
        _check_both_orders(W, getkey(), jnp.bfloat16, "gelu", True, impl, n=32)


@sweep("activation", [None, *ACTIVATIONS])
@sweep("dynamic", [False, True])
def test_gradients_match_the_unfused_dense_expression(getkey, activation, dynamic):
    W = bs.random(getkey(), (32, 48), 16, 0.5)
    M = bs.DynamicBlockSparseMatrix.from_static(W, capacity=W.nnz_blocks + 2) if dynamic else W
    x = jax.random.normal(getkey(), (7, 32))
    b = jax.random.normal(getkey(), (48,))
    act = (lambda y: y) if activation is None else ACTIVATIONS[activation]

    def ours(d, x, b):
        return jnp.sum(jnp.sin(bs.matmul(x, M.with_data(d), bias=b, activation=activation)))

    def dense(w, x, b):
        return jnp.sum(jnp.sin(act(x @ w + b)))

    gd, gx, gb = jax.jit(jax.grad(ours, (0, 1, 2)))(M.data, x, b)
    wd, wx, wb = jax.grad(dense, (0, 1, 2))(W.to_dense(), x, b)
    np.testing.assert_allclose(gx, wx, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(gb, wb, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(M.with_data(gd).to_dense(), np.where(W.to_dense() != 0, wd, 0), rtol=1e-4, atol=1e-5)


def test_batched_and_vector_operands(getkey):
    W = bs.random(getkey(), (32, 48), 16, 0.5)
    x3 = jax.random.normal(getkey(), (3, 48, 5))
    b = jax.random.normal(getkey(), (5,))
    want = jax.nn.relu(W.to_dense() @ x3 + b)
    np.testing.assert_allclose(bs.matmul(W, x3, bias=b, activation="relu"), want, rtol=1e-5, atol=1e-5)
    v = jax.random.normal(getkey(), (48,))
    bv = jax.random.normal(getkey(), (32,))
    np.testing.assert_allclose(bs.matmul(W, v, bias=bv, activation="tanh"), jnp.tanh(W.to_dense() @ v + bv),
                               rtol=1e-5, atol=1e-5)  # fmt: skip
    xb = jax.random.normal(getkey(), (2, 3, 32))
    bb = jax.random.normal(getkey(), (48,))
    np.testing.assert_allclose(bs.matmul(xb, W, bias=bb), xb @ W.to_dense() + bb, rtol=1e-5, atol=1e-5)
    # vmap over the dense operand
    f = jax.vmap(lambda x: bs.matmul(x, W, bias=bb, activation="silu"))
    np.testing.assert_allclose(f(xb), jax.nn.silu(xb @ W.to_dense() + bb), rtol=1e-5, atol=1e-5)


def test_empty_pattern_gives_the_activation_of_the_bias(getkey):
    W = bs.BlockSparseMatrix.from_mask(np.zeros((2, 3), bool), jnp.zeros((32, 48)), 16)
    x = jax.random.normal(getkey(), (4, 32))
    b = jax.random.normal(getkey(), (48,))
    for impl in ("xla", "pallas"):
        with bs.interpret(not ON_GPU):
            y = bs.matmul(x, W, bias=b, activation="sigmoid", implementation=impl)
        np.testing.assert_allclose(y, jnp.broadcast_to(jax.nn.sigmoid(b), (4, 48)), rtol=1e-6)


def test_bad_arguments_name_expected_and_actual(getkey):
    W = bs.random(getkey(), (32, 48), 16, 0.5)
    x = jnp.ones((4, 32))
    with pytest.raises(ValueError, match=r"activation None or one of \[.*'gelu'.*\]. Got 'swish'"):
        bs.matmul(x, W, activation="swish")
    with pytest.raises(ValueError, match=r"bias of shape \(48,\) \(the output's last dimension\). Got \(32,\)"):
        bs.matmul(x, W, bias=jnp.ones(32))
    with pytest.raises(TypeError, match="bias"):
        bs.matmul(x, W, bias=jnp.ones(48, jnp.int32))


@pytest.mark.gpu
@pytest.mark.parametrize("b", [16, 32, 64, 128])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
def test_gpu_kernels_with_epilogue(getkey, b, dtype):
    W = bs.random(getkey(), (512, 384), b, 0.25, dtype)
    D = bs.DynamicBlockSparseMatrix.from_static(W, capacity=W.nnz_blocks + 5)
    for M in (W, D):
        for activation in ("gelu", "relu", None):
            with bs.dispatch_log() as log:
                _check_both_orders(M, getkey(), dtype, activation, True, "pallas", n=200)
            assert all(impl == "pallas" for _, impl in log)
    _check_both_orders(W, getkey(), dtype, "silu", True, "pallas", n=64, config=TritonConfig(max_len=1))


def _gated_oracle(z, activation):
    a, b = np.split(z, 2, axis=-1)
    return ORACLE[activation](a) * b


@settings(max_examples=examples(8), deadline=None)
@given(
    bst.block_sparse_matrices(block_size=st.sampled_from([(16, 16), (32, 16), (16, 32)]), max_blocks=4),
    ACTS,
    st.booleans(),
    st.sampled_from(["xla", "pallas", "pallas-stream"]),
    st.sampled_from(["x @ W", "W @ v", "W @ X", "dynamic x @ W"]),
    st.integers(0, 2**16),
)
def test_gated_matches_oracle(W, activation, with_bias, impl, form, seed):
    # glu=True: activation(a) * b of the result's halves along its last dimension, the bias added first. The few-token
    # kernel gates in its store where the halves meet at a block boundary; every other path gates after the product.
    rng = np.random.default_rng(seed)
    m, k = W.shape
    width = k if "x @ W" in form else m if form == "W @ v" else 6
    assume_even = width % 2 == 0
    if "dynamic" in form:
        W = bs.DynamicBlockSparseMatrix.from_static(W, capacity=W.nnz_blocks + 1)
    shape = {"x @ W": (5, m), "dynamic x @ W": (5, m), "W @ v": (k,), "W @ X": (2, k, 6)}[form]
    x = jnp.asarray(rng.standard_normal(shape), jnp.float32)
    bias = jnp.asarray(rng.standard_normal(width), jnp.float32) if with_bias else None
    config = TritonConfig(stream=True) if impl == "pallas-stream" else None
    impl = impl.removesuffix("-stream")
    kw = dict(activation=activation, glu=True, implementation=impl, config=config)

    def product(W, x, b):
        return bs.matmul(x, W, bias=b, **kw) if "x @ W" in form else bs.matmul(W, x, bias=b, **kw)

    if not assume_even:
        with pytest.raises(ValueError, match=f"even last dimension of the result for glu=True.*Got {width}"):
            product(W, x, bias)
        return
    with bs.interpret(not ON_GPU):
        got = jax.jit(product)(W, x, bias)
    w, xs = to_dense64(W), _np(x)
    z = xs @ w if "x @ W" in form else w @ xs
    scale = np.abs(xs) @ np.abs(w) if "x @ W" in form else np.abs(w) @ np.abs(xs)
    if bias is not None:
        z, scale = z + _np(bias), scale + np.abs(_np(bias))
    half = lambda a: np.split(a, 2, axis=-1)  # noqa: E731
    # |f(a) b - f(a') b'| <= 1.1 |a - a'| |b| + |f(a)| |b - b'|: the product's bound carried through the gate.
    sa, sb = half(scale)
    za, zb = half(z)
    bound = 1.1 * sa * (np.abs(zb) + sb) + (np.abs(ORACLE[activation](za)) + sa) * sb
    assert_close(got, _gated_oracle(z, activation), bound, jnp.float32, f"glu {form}")


@sweep("activation", ["silu", None])
@sweep("form", ["static", "dynamic"])
def test_gated_gradients_match_the_dense_expression(getkey, activation, form):
    W = bs.random(getkey(), (32, 64), 16, 0.5)
    M = bs.DynamicBlockSparseMatrix.from_static(W, capacity=W.nnz_blocks + 2) if form == "dynamic" else W
    x = jax.random.normal(getkey(), (7, 32))
    b = jax.random.normal(getkey(), (64,))
    act = (lambda y: y) if activation is None else ACTIVATIONS[activation]

    def ours(d, x, b):
        return jnp.sum(jnp.sin(bs.matmul(x, M.with_data(d), bias=b, activation=activation, glu=True)))

    def dense(w, x, b):
        g, u = jnp.split(x @ w + b, 2, axis=-1)
        return jnp.sum(jnp.sin(act(g) * u))

    with jax.default_matmul_precision("highest"):
        gd, gx, gb = jax.jit(jax.grad(ours, (0, 1, 2)))(M.data, x, b)
        wd, wx, wb = jax.grad(dense, (0, 1, 2))(W.to_dense(), x, b)
    # gradients of a product of two products: entries up to ~100, so the tolerance scales with the largest
    for got, want in ((gx, wx), (gb, wb), (M.with_data(gd).to_dense(), np.where(W.to_dense() != 0, wd, 0))):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * float(np.abs(want).max()))


def test_gated_bad_arguments(getkey):
    W = bs.random(getkey(), (32, 48), 16, 0.5)
    with pytest.raises(TypeError, match="Expected glu a bool. Got 'yes'"):
        bs.matmul(jnp.ones((4, 32)), W, glu="yes")
    with pytest.raises(ValueError, match=r"bias of shape \(48,\).*Got \(24,\)"):  # the bias is W's width
        bs.matmul(jnp.ones((4, 32)), W, bias=jnp.ones(24), glu=True)
    with pytest.raises(ValueError, match="even last dimension.*Got 5"):
        bs.matmul(W.T, jnp.ones((32, 5)), glu=True)
    assert bs.matmul(jnp.ones((0, 32)), W, activation="silu", glu=True).shape == (0, 24)


@pytest.mark.parametrize("activation", ["sigmoid", "silu"])
def test_saturating_activations_have_finite_gradients(getkey, activation):
    # 1 / (1 + exp(-y)) overflows below y = -88: its gradient would be inf / inf.
    W = bs.random(getkey(), (32, 48), 16, 0.5)
    x = jax.random.normal(getkey(), (4, 32))
    b = jnp.full((48,), -100.0)
    g = jax.grad(lambda b: jnp.sum(bs.matmul(x, W, bias=b, activation=activation)))(b)
    assert np.isfinite(np.asarray(g)).all()
    want = getattr(jax.nn, activation)(x @ W.to_dense() + b)
    np.testing.assert_allclose(bs.matmul(x, W, bias=b, activation=activation), want, rtol=1e-6, atol=1e-30)


def test_zero_columns_with_a_bias(getkey):
    W = bs.random(getkey(), (32, 48), 16, 0.5)
    assert bs.matmul(W, jnp.ones((48, 0)), bias=jnp.ones(0), activation="relu").shape == (32, 0)
    assert bs.matmul(W, jnp.ones((2, 48, 0)), bias=jnp.ones(0), activation="relu").shape == (2, 32, 0)


def test_a_backend_without_fused_ops_falls_back(getkey):
    from blocksparse.ops.matmul import api

    class Plain:  # a registered backend that only has the plain products
        def dds(self, s, x, data):
            raise AssertionError("not reached: no fused op, so the next implementation runs")

    api.register_backend("plain", Plain())
    W = bs.random(getkey(), (32, 48), 16, 0.5)
    x = jax.random.normal(getkey(), (4, 32))
    with bs.dispatch_log() as log:
        y = bs.matmul(x, W, bias=jnp.ones(48), activation="relu", implementation=("plain", "xla"))
    assert log == [("dds+epilogue", "xla")]
    np.testing.assert_allclose(y, jax.nn.relu(x @ W.to_dense() + 1.0), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(len(jax.devices()) < 4, reason="needs 4 devices")
def test_sharded_operand_rounds_once_like_the_unsharded_product(getkey):
    from jax.sharding import Mesh

    mesh = Mesh(np.array(jax.devices()[:4]), ("d",))
    W = bs.random(getkey(), (128, 96), 16, 0.5, jnp.bfloat16)
    x = jax.random.normal(getkey(), (96, 64), jnp.bfloat16)
    b = jax.random.normal(getkey(), (64,), jnp.bfloat16)
    Ws = bs.shard(W, mesh, "d", split="rows")
    # jitted: an eager shard_map runs op by op (seconds); eager sharded products: test_shard_matmul.py
    f = jax.jit(lambda W, x, b: bs.matmul(W, x, bias=b, activation="gelu", implementation="xla"))
    a, want = f(Ws, x, b), f(W, x, b)
    assert a.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(want, np.float32))
    with pytest.raises(ValueError, match=r"bias of shape \(64,\).*Got \(3,\)"):
        bs.matmul(Ws, x, bias=jnp.ones(3), activation="gelu")


@sweep("form", ["static x @ W", "static W @ X", "dynamic x @ W", "glu out"], quick=("static x @ W", "dynamic x @ W"))
def test_gated_input_gradients_match_the_dense_expression(getkey, form):
    # input_glu: the product of silu(a) * b, x's halves along its contracted dimension; gradients w.r.t. x, the
    # values and the bias are the unfused expression's, for a static matrix (its own op) and a dynamic one (the
    # gate in XLA, then the product), with an epilogue and with a gated output too; and under vmap.
    W = bs.random(getkey(), (32, 64), 16, 0.5)
    M = bs.DynamicBlockSparseMatrix.from_static(W, capacity=W.nnz_blocks + 2) if "dynamic" in form else W
    b = jax.random.normal(getkey(), (64,))
    sparse_first = "W @ X" in form
    x = jax.random.normal(getkey(), (3, 64, 5) if sparse_first else (7, 64))
    glu = form == "glu out"

    def gate(x, axis):
        a, v = jnp.split(x, 2, axis=axis)
        return jax.nn.silu(a) * v

    def ours(d, x, b):
        if sparse_first:
            return jnp.sum(jnp.sin(bs.matmul(M.with_data(d).T, x, input_glu="silu") + b[:5]))
        y = bs.matmul(x, M.with_data(d), bias=b, activation="tanh" if not glu else "silu", glu=glu, input_glu="silu")
        return jnp.sum(jnp.sin(y))

    def dense(w, x, b):
        if sparse_first:
            return jnp.sum(jnp.sin(w.T @ gate(x, -2) + b[:5]))
        z = gate(x, -1) @ w + b
        if glu:
            g, u = jnp.split(z, 2, axis=-1)
            return jnp.sum(jnp.sin(jax.nn.silu(g) * u))
        return jnp.sum(jnp.sin(jnp.tanh(z)))

    with jax.default_matmul_precision("highest"):
        got = jax.jit(jax.grad(ours, (0, 1, 2)))(M.data, x, b)
        want = jax.grad(dense, (0, 1, 2))(W.to_dense(), x, b)
        np.testing.assert_allclose(ours(M.data, x, b), dense(W.to_dense(), x, b), rtol=1e-5)
    (gd, gx, gb), (wd, wx, wb) = got, want
    for g, w in ((gx, wx), (gb, wb), (M.with_data(gd).to_dense(), np.where(W.to_dense() != 0, wd, 0))):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5 * float(np.abs(w).max() or 1.0))
    if not sparse_first:  # vmap over examples: the same as the batched product
        rows = jax.vmap(lambda r: bs.matmul(r, M, input_glu="silu"))(x)
        np.testing.assert_allclose(rows, bs.matmul(x, M, input_glu="silu"), rtol=1e-5, atol=1e-5)


def test_gated_input_bad_arguments(getkey):
    W = bs.random(getkey(), (32, 48), 16, 0.5)
    with pytest.raises(ValueError, match=r"contracted dimension to be 64 for input_glu.*W's 32.*Got 32"):
        bs.matmul(jnp.ones((4, 32)), W, input_glu="silu")
    with pytest.raises(ValueError, match=r"contracted dimension to be 96 for input_glu.*Got 48"):
        bs.matmul(W, jnp.ones((48, 2)), input_glu="silu")
    with pytest.raises(ValueError, match=r"Expected input_glu None or False \(no gate\), True.*Got 'swish'"):
        bs.matmul(jnp.ones((4, 64)), W, input_glu="swish")
    with pytest.raises(ValueError, match=r"Expected input_glu .*Got 3"):
        bs.matmul(jnp.ones((4, 64)), W, input_glu=3)
    with pytest.raises(TypeError, match="Expected exactly one block-sparse operand"):
        bs.matmul(jnp.ones((4, 64)), jnp.ones((32, 48)), input_glu="silu")
    assert bs.matmul(jnp.ones((0, 64)), W, input_glu=True).shape == (0, 48)
    x = jax.random.normal(getkey(), (2, 64))  # False (NumPy's too) is no gate; NumPy's True the bilinear gate
    for no in (False, np.False_):
        np.testing.assert_array_equal(bs.matmul(x[:, :32], W, input_glu=no), bs.matmul(x[:, :32], W))
    np.testing.assert_array_equal(bs.matmul(x, W, input_glu=np.True_), bs.matmul(x[:, :32] * x[:, 32:], W))


def test_gated_input_mixed_dtypes_round_the_gate_to_the_operand(getkey):
    # A bfloat16 operand of a float32 matrix: the gate is rounded to bfloat16 (as a separate gate would store it), then
    # promoted for the product, on every backend (the kernel's interpreter included).
    W = bs.random(getkey(), (64, 32), 16, 0.5)
    x = jax.random.normal(getkey(), (3, 128)).astype(jnp.bfloat16)
    g, v = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    want = (jax.nn.silu(g) * v).astype(jnp.bfloat16).astype(jnp.float32) @ W.to_dense()
    for impl, config in (("xla", None), ("pallas", TritonConfig(stream=True))):
        with bs.interpret(not ON_GPU), bs.dispatch_log() as log:
            got = bs.matmul(x, W, input_glu="silu", implementation=impl, config=config, precision="highest")
        assert got.dtype == jnp.float32 and log == [("dds+input_glu", impl)]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
