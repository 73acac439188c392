"""bs.nn.SparseLinear and bs.nn.Linear (plain pytrees) against a NumPy float64 oracle."""

import math
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import examples, sweep
from hypothesis import given, settings
from hypothesis import strategies as st

import blocksparse as bs

ACTS = [None, "relu", "gelu", "gelu_tanh", "silu", "tanh", "sigmoid"]
_erf = np.vectorize(math.erf)
ORACLE_ACTS = {
    None: lambda y: y,
    "relu": lambda y: np.maximum(y, 0.0),
    "gelu": lambda y: 0.5 * y * (1.0 + _erf(y / math.sqrt(2.0))),
    "gelu_tanh": lambda y: 0.5 * y * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (y + 0.044715 * y**3))),
    "silu": lambda y: y / (1.0 + np.exp(-y)),
    "tanh": np.tanh,
    "sigmoid": lambda y: 1.0 / (1.0 + np.exp(-y)),
}
TOL = {jnp.dtype(jnp.float32): 2e-5, jnp.dtype(jnp.bfloat16): 2e-2}


def oracle(x, w_in_out, b, activation):
    """``activation(x @ W + b)`` in float64 on the (already rounded) inputs."""
    f64 = lambda a: np.asarray(jnp.asarray(a, jnp.float32), np.float64)
    y = f64(x) @ f64(w_in_out)
    if b is not None:
        y = y + f64(b)
    return ORACLE_ACTS[activation](y)


def assert_close(y, want, dtype):
    tol = TOL[jnp.dtype(dtype)]
    scale = max(1.0, float(np.abs(want).max(initial=0.0)))
    np.testing.assert_allclose(np.asarray(y, np.float64), want, rtol=tol, atol=tol * scale)


def make_layer(kind, seed, n_in, n_out, block, density, *, use_bias, dtype, activation):
    """A SparseLinear with a random pattern keeping ``round(density * blocks)`` blocks (at least one if
    ``density > 0``), or a Linear holding the same values (its dense twin); and the dense ``(in, out)`` weight.

    Built from NumPy values (no per-shape JAX compilation beyond the layer's own)."""
    rng = np.random.default_rng(seed)
    bh, bw = (block, block) if isinstance(block, int) else block
    gm, gk = n_in // bh, n_out // bw
    mask = np.zeros(gm * gk, bool)
    mask[rng.choice(gm * gk, max(round(density * gm * gk), int(density > 0)), replace=False)] = True
    mask = mask.reshape(gm, gk)
    w = (rng.standard_normal((n_in, n_out)) * np.kron(mask, np.ones((bh, bw))) / math.sqrt(n_in)).astype(dtype)
    b = jnp.asarray(rng.standard_normal(n_out), dtype) if use_bias else None
    if kind == "sparse":
        return bs.nn.SparseLinear(bs.BlockSparseMatrix.from_mask(mask, w, (bh, bw)), b, activation=activation), w
    return bs.nn.Linear(jnp.asarray(w), b, activation=activation), w


@settings(max_examples=examples(10))
@given(
    kind=st.sampled_from(["sparse", "dense"]),
    block=st.sampled_from([(1, 1), (2, 4), (4, 4), (8, 2)]),
    grid=st.tuples(st.integers(1, 4), st.integers(1, 4)),
    density=st.sampled_from([0.0, 0.3, 0.6, 1.0]),
    activation=st.sampled_from(ACTS),
    dtype=st.sampled_from([jnp.float32, jnp.bfloat16]),
    use_bias=st.booleans(),
    batch=st.sampled_from([(), (3,), (2, 3)]),
    seed=st.integers(0, 2**16),
)
def test_layers_match_the_dense_oracle(kind, block, grid, density, activation, dtype, use_bias, batch, seed):
    n_in, n_out = grid[0] * block[0], grid[1] * block[1]
    layer, w = make_layer(kind, seed, n_in, n_out, block, density, use_bias=use_bias, dtype=dtype,
                          activation=activation)  # fmt: skip
    x = np.random.default_rng(seed + 1).standard_normal((*batch, n_in)).astype(dtype)
    y = jax.jit(lambda lay, x: lay(x))(layer, x)
    assert y.shape == (*batch, n_out) and y.dtype == dtype
    assert_close(y, oracle(x, w, layer.bias, activation), dtype)


@sweep(
    "kind,activation",
    [("sparse", a) for a in ACTS] + [("dense", None), ("dense", "gelu"), ("dense", "sigmoid")],
    quick=[("sparse", None), ("sparse", "relu"), ("sparse", "tanh"), ("dense", "gelu")],
)
def test_gradients_match_dense_gradients_on_the_pattern(kind, activation, getkey):
    layer, w = make_layer(kind, 0, 32, 24, (8, 4), 0.5, use_bias=True, dtype=jnp.float32,
                          activation=activation)  # fmt: skip
    x = jax.random.normal(getkey(), (5, 32))
    t = jax.random.normal(getkey(), (5, 24))
    act = bs.nn.ACTIVATIONS[activation] if activation else (lambda y: y)

    grads, gx = jax.jit(jax.grad(lambda lay, x: jnp.sum((lay(x) - t) ** 2), argnums=(0, 1)))(layer, x)
    dense_loss = lambda w, b, x: jnp.sum((act(jnp.dot(x, w, precision="highest") + b) - t) ** 2)
    gw, gb, gx_want = jax.grad(dense_loss, argnums=(0, 1, 2))(w, layer.bias, x)
    if kind == "sparse":
        assert grads.weight.pattern == layer.weight.pattern  # laid out like the weight, never dense
        mask = np.asarray(layer.weight.with_data(jnp.ones_like(layer.weight.data)).to_dense())
        got_w = grads.weight.to_dense()
    else:
        mask, got_w = 1.0, grads.weight
    np.testing.assert_allclose(got_w, gw * mask, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(grads.bias, gb, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(gx, gx_want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", ["sparse", "dense"])
def test_bfloat16_gradients(kind, getkey):
    """bf16 parameters and inputs: the pre-activation is kept in float32, so gradients stay close to float32 ones."""
    layer, w = make_layer(kind, 3, 32, 16, 8, 0.5, use_bias=True, dtype=jnp.bfloat16, activation="gelu")
    x = jax.random.normal(getkey(), (8, 32), jnp.bfloat16)
    grads = jax.jit(jax.grad(lambda lay: jnp.sum(lay(x).astype(jnp.float32) ** 2)))(layer)
    assert grads.bias.dtype == jnp.bfloat16
    f32 = lambda a: jnp.asarray(a, jnp.float32)
    gw, gb = jax.grad(
        lambda w, b: jnp.sum(jax.nn.gelu(f32(x) @ w + b, approximate=False) ** 2), (0, 1)
    )(f32(w), f32(layer.bias))  # fmt: skip
    got, mask = (grads.weight.to_dense(), np.asarray(f32(w)) != 0) if kind == "sparse" else (grads.weight, 1.0)
    np.testing.assert_allclose(f32(got), gw * mask, rtol=3e-2, atol=3e-2 * float(jnp.abs(gw).max()))
    np.testing.assert_allclose(f32(grads.bias), gb, rtol=3e-2, atol=3e-2 * float(jnp.abs(gb).max()))


@pytest.mark.parametrize("kind", ["sparse", "dense"])
def test_vmap_over_the_input_and_over_a_stack_of_layers(kind, getkey):
    layer, w = make_layer(kind, 0, 16, 8, 4, 0.5, use_bias=True, dtype=jnp.float32, activation="silu")
    xs = jax.random.normal(getkey(), (6, 16))
    want = oracle(xs, w, layer.bias, "silu")
    assert_close(jax.vmap(layer)(xs), want, jnp.float32)  # one example at a time, as Equinox applies layers
    assert_close(jax.vmap(jax.vmap(layer))(xs.reshape(2, 3, 16)), want.reshape(2, 3, 8), jnp.float32)
    stacked = jax.tree.map(lambda a: jnp.stack([a, 2 * a]), layer)
    ys = jax.vmap(lambda lay, x: lay(x), in_axes=(0, None))(stacked, xs)
    assert_close(ys[1], oracle(xs, 2 * np.asarray(w), 2 * np.asarray(layer.bias), "silu"), jnp.float32)


@pytest.mark.parametrize("cls", [bs.nn.SparseLinear, bs.nn.Linear])
def test_from_dense_layouts(cls, getkey):
    w = np.asarray(jax.random.normal(getkey(), (16, 8)))  # (in, out)
    b = np.asarray(jax.random.normal(getkey(), (8,)))
    kw = {"block_size": 4, "density": 0.5} if cls is bs.nn.SparseLinear else {}
    a = cls.from_dense(w, b, layout="in_out", **kw)
    t = cls.from_dense(w.T.copy(), b, layout="out_in", in_features=16, out_features=8, **kw)
    assert (a.in_features, a.out_features) == (t.in_features, t.out_features) == (16, 8)
    wa = a.weight.to_dense() if cls is bs.nn.SparseLinear else a.weight
    wt = t.weight.to_dense() if cls is bs.nn.SparseLinear else t.weight
    np.testing.assert_array_equal(wa, wt)
    x = jax.random.normal(getkey(), (3, 16))
    np.testing.assert_array_equal(a(x), t(x))
    if cls is bs.nn.Linear:
        np.testing.assert_allclose(a(x), x @ w + b, rtol=1e-5, atol=1e-5)


def test_sparse_from_dense_at_full_density_is_the_dense_layer(getkey):
    w = jax.random.normal(getkey(), (24, 16))
    b = jax.random.normal(getkey(), (16,))
    sparse = bs.nn.SparseLinear.from_dense(w, b, block_size=8, density=1.0, activation="gelu")
    dense = bs.nn.Linear.from_dense(w, b, activation="gelu")
    assert sparse.weight.nnz_blocks == 6
    x = jax.random.normal(getkey(), (4, 24))
    np.testing.assert_allclose(sparse(x), dense(x), rtol=1e-5, atol=1e-5)


def test_output_dtype_rules_agree():
    for w_dtype, x_dtype, out in [
        (jnp.bfloat16, jnp.bfloat16, jnp.bfloat16),
        (jnp.float32, jnp.bfloat16, jnp.float32),
        (jnp.bfloat16, jnp.float32, jnp.float32),
        (jnp.float16, jnp.float16, jnp.float16),
    ]:
        x = jax.ShapeDtypeStruct((2, 16), x_dtype)
        for kind in ("sparse", "dense"):
            layer, _ = make_layer(kind, 0, 16, 8, 4, 0.5, use_bias=True, dtype=w_dtype, activation="relu")
            assert jax.eval_shape(layer, x).dtype == out, (kind, w_dtype, x_dtype)


def test_errors_name_expected_and_actual(getkey):
    w = np.ones((64, 48), np.float32)
    msg = "Expected a weight of shape (out, in) = (32, 64) for layout='out_in'. Got (64, 48)."
    for cls, kw in [(bs.nn.Linear, {}), (bs.nn.SparseLinear, {"block_size": 16, "density": 0.5})]:
        with pytest.raises(ValueError, match=re.escape(msg)):
            cls.from_dense(w, layout="out_in", in_features=64, out_features=32, **kw)
        with pytest.raises(ValueError, match=r"Expected layout 'in_out' .* or 'out_in' .*Got 'io'"):
            cls.from_dense(w, layout="io", **kw)
        with pytest.raises(ValueError, match=r"Expected a 2-D weight of shape \(in, out\).*Got shape \(64,\)"):
            cls.from_dense(w[:, 0], **kw)
        # A (out, in) weight passed as (in, out): the bias names the layout that fits.
        with pytest.raises(ValueError, match=r"bias of shape \(48,\).*Got \(64,\); the weight would fit with "
                                             r"layout='out_in'"):  # fmt: skip
            cls.from_dense(w, np.zeros(64), **kw)
        valid = r"\['gelu', 'gelu_tanh', 'relu', 'sigmoid', 'silu', 'tanh'\]"
        with pytest.raises(ValueError, match=rf"Expected activation None or one of {valid} or of JAX.*Got 'gelu_new'"):
            cls.from_dense(w, activation="gelu_new", **kw)
    with pytest.raises(ValueError, match=r"activation None or one of"):
        bs.nn.Linear.init(getkey(), 4, 4, activation=jax.nn.softplus)  # JAX's relu, gelu, ... are accepted
    with pytest.raises(ValueError, match=r"activation None or one of"):
        bs.nn.SparseLinear.init(getkey(), 4, 4, 2, 0.5, activation="Relu")
    with pytest.raises(ValueError, match=r"activation None or one of"):
        bs.nn.SparseLinear(bs.random(getkey(), (4, 4), 2, 0.5), None, activation="swish")
    with pytest.raises(ValueError, match=r"bias of shape \(4,\).*Got \(3,\)"):
        bs.nn.Linear(jnp.ones((8, 4)), jnp.ones(3))
    with pytest.raises(ValueError, match=r"input's last dimension to be 8 \(W is \(8, 4\)\). Got shape \(2, 5\)"):
        bs.nn.Linear(jnp.ones((8, 4)), None)(jnp.ones((2, 5)))
    with pytest.raises(ValueError, match=r"last dimension to be 8"):
        bs.nn.SparseLinear(bs.random(getkey(), (8, 4), 2, 0.5), None)(jnp.ones((2, 5)))


@pytest.mark.parametrize("kind", ["sparse", "dense"])
def test_optax_steps_lower_the_loss(kind, getkey):
    optax = pytest.importorskip("optax")
    layer, _ = make_layer(kind, 0, 32, 16, 8, 0.5, use_bias=True, dtype=jnp.float32, activation="tanh")
    x = jax.random.normal(getkey(), (64, 32))
    target = jnp.tanh(x @ jax.random.normal(getkey(), (32, 16)) * 0.3)
    loss = jax.jit(lambda lay: jnp.mean((lay(x) - target) ** 2))
    opt = optax.adam(1e-2)
    state = opt.init(layer)

    @jax.jit
    def step(layer, state):
        value, g = jax.value_and_grad(loss)(layer)
        updates, state = opt.update(g, state, layer)
        return optax.apply_updates(layer, updates), state, value

    first = float(loss(layer))
    for _ in range(20):
        layer, state, _ = step(layer, state)
    assert float(loss(layer)) < 0.8 * first


@pytest.mark.parametrize("framework,extra", [("flax", "Flax"), ("equinox", "Equinox")])
def test_framework_modules_are_lazy_and_name_their_extra(framework, extra, monkeypatch):
    import blocksparse.nn as nn

    assert framework in dir(nn)
    monkeypatch.delattr(nn, framework, raising=False)
    monkeypatch.delitem(sys.modules, f"blocksparse.nn.{framework}", raising=False)
    monkeypatch.setitem(sys.modules, framework, None)  # `import flax` now raises ImportError
    with pytest.raises(ImportError, match=re.escape(f"bs.nn.{framework} needs {extra}: pip install "
                                                    f"'blocksparse[{framework}]'")):  # fmt: skip
        getattr(bs.nn, framework)
    with pytest.raises(AttributeError, match="has no attribute 'haiku'"):
        bs.nn.haiku  # noqa: B018


@pytest.mark.skipif(len(jax.devices()) < 4, reason="needs 4 devices (conftest makes 4 CPU devices)")
def test_data_parallel_gradients_inside_shard_map(getkey):
    """Batch split over devices, layer replicated: gradients are summed over devices like dense ones."""
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:4]), ("batch",))
    layer, w = make_layer("sparse", 0, 32, 16, 8, 0.5, use_bias=True, dtype=jnp.float32, activation="tanh")
    x = jax.random.normal(getkey(), (16, 32))
    t = jax.random.normal(getkey(), (16, 16))

    def grads(layer, x, t):  # JAX sums a replicated input's gradient over the devices, as for dense code
        return jax.grad(lambda lay: jnp.sum((lay(x) - t) ** 2))(layer)

    g = jax.jit(jax.shard_map(grads, mesh=mesh, in_specs=(P(), P("batch"), P("batch")), out_specs=P()))(layer, x, t)
    gw, gb = jax.grad(lambda w, b: jnp.sum((jnp.tanh(x @ w + b) - t) ** 2), (0, 1))(jnp.asarray(w), layer.bias)
    np.testing.assert_allclose(g.weight.to_dense(), gw * (w != 0), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(g.bias, gb, rtol=1e-4, atol=1e-4)


def test_one_fused_product_per_call(getkey):
    """Forward: one product with bias and activation fused; grad: one product and one sdd for the weight."""
    layer, _ = make_layer("sparse", 0, 32, 16, 8, 0.5, use_bias=True, dtype=jnp.float32, activation="relu")
    x = jax.random.normal(getkey(), (4, 32))
    with bs.dispatch_log() as log:
        jax.jit(lambda lay, x: lay(x))(layer, x)
    assert [op for op, _ in log] == ["dds+epilogue"]
    with bs.dispatch_log() as log:
        jax.jit(jax.vmap(layer))(x)
    assert [op for op, _ in log] == ["dds+epilogue"]
    with bs.dispatch_log() as log:
        jax.jit(jax.grad(lambda lay, x: jnp.sum(lay(x)), argnums=(0, 1)))(layer, x)
    assert sorted(op for op, _ in log) == ["dds", "dds+epilogue", "sdd"]  # dx, forward (bias fused), dW


def test_scan_over_a_stack_of_layers_with_gradients(getkey):
    """Layers stacked along a leading axis (lax.scan over depth), with jax.checkpoint: gradients as unrolled."""
    layer, _ = make_layer("sparse", 0, 16, 16, 4, 0.5, use_bias=True, dtype=jnp.float32, activation="tanh")
    stack = jax.tree.map(lambda a: jnp.stack([a, 0.5 * a, 2 * a]), layer)
    x = jax.random.normal(getkey(), (4, 16))

    def scanned(stack):
        body = jax.checkpoint(lambda h, lay: (lay(h), None))
        return jnp.sum(jax.lax.scan(body, x, stack)[0] ** 2)

    def unrolled(stack):
        h = x
        for i in range(3):
            h = jax.tree.map(lambda a, i=i: a[i], stack)(h)
        return jnp.sum(h**2)

    g, want = jax.jit(jax.grad(scanned))(stack), jax.grad(unrolled)(stack)
    np.testing.assert_allclose(g.weight.data, want.weight.data, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(g.bias, want.bias, rtol=1e-5, atol=1e-5)


def test_a_stack_of_layers_under_forward_and_reverse_mode():
    # vmap over stacked weights loops over the layers with the layers' own primitive, so its JVP
    # and transposes apply: jax.jvp works as well as jax.grad.
    layer = bs.nn.SparseLinear.init(jax.random.key(0), 32, 48, 16, 0.5, activation="tanh")
    stack = jax.tree.map(lambda a: jnp.stack([a, 0.5 * a]), layer)
    x = jax.random.normal(jax.random.key(1), (4, 32))

    def f(s):
        return jax.vmap(lambda one: one(x))(s)

    def dense(s):
        ws = [bs.BlockSparseMatrix(layer.weight.pattern, s.weight.data[i]).to_dense() for i in range(2)]
        return jnp.stack([jnp.tanh(x @ ws[i] + s.bias[i]) for i in range(2)])

    y, t = jax.jvp(f, (stack,), (stack,))
    yd, td = jax.jvp(dense, (stack,), (stack,))
    np.testing.assert_allclose(y, yd, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(t, td, rtol=1e-4, atol=1e-5)
    g = jax.grad(lambda s: jnp.sum(f(s) ** 2))(stack)
    gd = jax.grad(lambda s: jnp.sum(dense(s) ** 2))(stack)
    np.testing.assert_allclose(g.weight.data, gd.weight.data, rtol=1e-4, atol=1e-5)


def test_dense_linear_refuses_integer_inputs_like_sparse_linear():
    x = jnp.ones((2, 32), jnp.int32)
    with pytest.raises(TypeError, match="floating-point input and weight. Got int32 and float32"):
        bs.nn.Linear.init(jax.random.key(0), 32, 16)(x)
    with pytest.raises(TypeError, match="floating-point dense operand. Got dtype int32"):
        bs.nn.SparseLinear.init(jax.random.key(0), 32, 32, 16, 0.5)(x)
