"""bs.nn.flax.SparseLinear: nnx.Linear's conventions, nnx transforms, training with nnx.Optimizer and optax."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_nn_layers import ACTS, assert_close, make_layer, oracle

import blocksparse as bs

nnx = pytest.importorskip("flax.nnx")
optax = pytest.importorskip("optax")
FSparseLinear = bs.nn.flax.SparseLinear


def flax_layer(seed, n_in, n_out, block, density, *, use_bias=True, dtype=jnp.float32, activation=None, **kw):
    """A Flax layer made from an (in, out) kernel with a random pattern; and that dense kernel."""
    plain, w = make_layer("sparse", seed, n_in, n_out, block, density, use_bias=use_bias, dtype=dtype,
                          activation=activation)  # fmt: skip
    layer = FSparseLinear.from_dense(w, plain.bias, block_size=block, density=plain.weight.density,
                                     activation=activation, **kw)  # fmt: skip
    assert layer.pattern == plain.weight.pattern
    return layer, w


@settings(max_examples=6)
@given(
    block=st.sampled_from([(1, 1), (2, 4), (4, 4), (8, 2)]),
    grid=st.tuples(st.integers(1, 4), st.integers(1, 4)),
    density=st.sampled_from([0.0, 0.4, 1.0]),
    activation=st.sampled_from(ACTS),
    dtype=st.sampled_from([jnp.float32, jnp.bfloat16]),
    use_bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_calls_match_the_dense_oracle(block, grid, density, activation, dtype, use_bias, seed):
    n_in, n_out = grid[0] * block[0], grid[1] * block[1]
    layer, w = flax_layer(seed, n_in, n_out, block, density, use_bias=use_bias, dtype=dtype, activation=activation)
    assert layer.kernel[...].dtype == dtype  # param_dtype follows the dense kernel
    x = np.random.default_rng(seed + 1).standard_normal((3, n_in)).astype(dtype)
    y = nnx.jit(lambda m, x: m(x))(layer, x)
    assert y.shape == (3, n_out) and y.dtype == dtype
    assert_close(y, oracle(x, w, None if layer.bias is None else layer.bias[...], activation), dtype)


def test_module_layout_and_state(getkey):
    layer = FSparseLinear(64, 48, block_size=16, density=0.5, rngs=nnx.Rngs(0))
    assert isinstance(layer.kernel, nnx.Param) and isinstance(layer.bias, nnx.Param)
    assert layer.kernel.shape == (6, 16, 16) and layer.bias.shape == (48,)
    assert layer.weight.shape == (64, 48) and layer.weight.pattern == layer.pattern  # (in, out), as nnx.Linear
    np.testing.assert_array_equal(layer.bias[...], 0)
    # LeCun normal with the fan-in a unit sees (64 * 0.5): std 1/sqrt(32), truncated at 2 std.
    assert 0.7 / np.sqrt(32) < float(jnp.std(layer.kernel[...])) < 1.2 / np.sqrt(32)
    graphdef, state = nnx.split(layer)
    shapes = jax.tree.map(jnp.shape, nnx.to_pure_dict(state))
    assert sorted(shapes.items()) == [("bias", (48,)), ("kernel", (6, 16, 16))]
    x = jax.random.normal(getkey(), (4, 64))
    np.testing.assert_array_equal(nnx.merge(graphdef, state)(x), layer(x))
    ones = FSparseLinear(8, 8, block_size=4, density=0.5, use_bias=False, kernel_init=nnx.initializers.ones,
                         rngs=nnx.Rngs(1))  # fmt: skip
    assert ones.bias is None
    np.testing.assert_array_equal(ones.kernel[...], 1)
    pat = ones.pattern
    again = FSparseLinear(8, 8, block_size=4, density=0.5, pattern=pat, rngs=nnx.Rngs(2))
    assert again.pattern == pat
    with pytest.raises(
        ValueError, match=re.escape("pattern of shape (in_features, out_features) = (8, 16). Got (8, 8)")
    ):
        FSparseLinear(8, 16, block_size=4, density=0.5, pattern=pat, rngs=nnx.Rngs(2))
    with pytest.raises(ValueError, match=r"activation None or one of"):
        FSparseLinear(8, 8, block_size=4, density=0.5, activation="gelu_new", rngs=nnx.Rngs(2))


def test_dtype_and_param_dtype():
    layer = FSparseLinear(16, 8, block_size=4, density=0.5, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    assert layer.kernel[...].dtype == jnp.float32  # param_dtype
    assert layer(jnp.ones((2, 16))).dtype == jnp.bfloat16  # computed in dtype, as nnx.Linear
    promoted = FSparseLinear(16, 8, block_size=4, density=0.5, param_dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    assert promoted(jnp.ones((2, 16))).dtype == jnp.float32  # dtype=None promotes


def test_from_dense_layouts_and_nnx_linear(getkey):
    lin = nnx.Linear(32, 16, rngs=nnx.Rngs(0))
    x = jax.random.normal(getkey(), (5, 32))
    full = FSparseLinear.from_dense(lin.kernel, lin.bias, block_size=8, density=1.0)  # no rngs needed
    np.testing.assert_allclose(full(x), lin(x), rtol=1e-5, atol=1e-5)
    torch_like = FSparseLinear.from_dense(np.asarray(lin.kernel[...]).T, lin.bias, block_size=8, density=1.0,
                                          layout="out_in", rngs=nnx.Rngs(3))  # fmt: skip
    np.testing.assert_array_equal(torch_like.kernel[...], full.kernel[...])
    msg = "Expected a weight of shape (out, in) = (16, 32) for layout='out_in'. Got (32, 16)."
    with pytest.raises(ValueError, match=re.escape("bias of shape (32,)")):
        FSparseLinear.from_dense(lin.kernel, lin.bias, block_size=8, density=1.0, layout="out_in")
    with pytest.raises(ValueError, match=re.escape(msg)):
        FSparseLinear.from_dense(
            lin.kernel, block_size=8, density=1.0, layout="out_in", in_features=32, out_features=16
        )
    with pytest.raises(ValueError, match=re.escape(msg)):
        bs.nn.SparseLinear.from_dense(lin.kernel[...], block_size=8, density=1.0, layout="out_in", in_features=32,
                                      out_features=16)  # fmt: skip


def test_transforms_grad_vmap(getkey):
    layer, w = flax_layer(0, 32, 24, (8, 4), 0.5, activation="sigmoid")
    xs = jax.random.normal(getkey(), (6, 32))
    t = jax.random.normal(getkey(), (6, 24))
    want = oracle(xs, w, layer.bias[...], "sigmoid")
    assert_close(jax.vmap(layer)(xs), want, jnp.float32)
    assert_close(nnx.vmap(lambda m, x: m(x), in_axes=(None, 0))(layer, xs), want, jnp.float32)
    (eqn,) = [e for e in jax.make_jaxpr(jax.vmap(layer))(xs).jaxpr.eqns if e.primitive.name == "bs_sparse_linear"]
    assert eqn.invars[0].aval.shape == (6, 32)  # one product over the examples

    grads = nnx.jit(nnx.grad(lambda m: jnp.sum((m(xs) - t) ** 2)))(layer)
    gw, gb = jax.grad(lambda w, b: jnp.sum((jax.nn.sigmoid(xs @ w + b) - t) ** 2), (0, 1))(jnp.asarray(w),
                                                                                           layer.bias[...])  # fmt: skip
    dense_grad = bs.BlockSparseMatrix._from_fields(pattern=layer.pattern, data=grads["kernel"][...]).to_dense()
    np.testing.assert_allclose(dense_grad, gw * (w != 0), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(grads["bias"][...], gb, rtol=1e-4, atol=1e-5)


def test_a_small_model_trains_with_nnx_optimizer():
    class Model(nnx.Module):
        def __init__(self, rngs):
            self.up = FSparseLinear(32, 64, block_size=16, density=0.5, activation="relu", rngs=rngs)
            self.down = FSparseLinear(64, 8, block_size=8, density=0.5, rngs=rngs)

        def __call__(self, x):
            return self.down(self.up(x))

    model = Model(nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (64, 32))
    t = jnp.tanh(x[:, :8])
    loss = nnx.jit(lambda m: jnp.mean((m(x) - t) ** 2))
    opt = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)

    @nnx.jit
    def step(model, opt):
        value, grads = nnx.value_and_grad(loss)(model)
        opt.update(model, grads)
        return value

    first = float(loss(model))
    for _ in range(15):
        step(model, opt)
    assert float(loss(model)) < 0.6 * first


def test_a_given_pattern_must_match_block_size_and_density():
    from flax import nnx

    p = bs.BlockPattern.random(0, (64, 32), (16, 16), 0.5)
    with pytest.raises(ValueError, match=r"block_size \(16, 16\) \(the pattern's\). Got 32"):
        bs.nn.flax.SparseLinear(64, 32, block_size=32, density=0.5, pattern=p, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"density 0.5 \(the pattern's 4 of 8 blocks\). Got 0.9"):
        bs.nn.flax.SparseLinear(64, 32, block_size=16, density=0.9, pattern=p, rngs=nnx.Rngs(0))
    layer = bs.nn.flax.SparseLinear.from_dense(jnp.ones((64, 32)), jnp.ones(32), block_size=16, density=0.5,
                                               param_dtype=jnp.bfloat16)  # fmt: skip
    assert layer.kernel[...].dtype == layer.bias[...].dtype == jnp.bfloat16
