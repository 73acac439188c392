"""bs.nn.equinox.SparseLinear: eqx.nn.Linear's conventions, vmap as one product, training with optax."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_nn_layers import ACTS, assert_close, make_layer, oracle

import blocksparse as bs

eqx = pytest.importorskip("equinox")
optax = pytest.importorskip("optax")
ESparseLinear = bs.nn.equinox.SparseLinear


def eqx_layer(seed, n_in, n_out, block, density, *, use_bias=True, dtype=jnp.float32, activation=None, **kw):
    """An Equinox layer made from a (out, in) weight with a random pattern; and the dense (in, out) weight."""
    plain, w = make_layer("sparse", seed, n_in, n_out, block, density, use_bias=use_bias, dtype=dtype,
                          activation=activation)  # fmt: skip
    layer = ESparseLinear.from_dense(w.T, plain.bias, block_size=block, density=plain.weight.density,
                                     activation=activation, **kw)  # fmt: skip
    assert layer.weight.pattern == plain.weight.pattern
    return layer, w


@settings(max_examples=8)
@given(
    block=st.sampled_from([(1, 1), (2, 4), (4, 4), (8, 2)]),
    grid=st.tuples(st.integers(1, 4), st.integers(1, 4)),
    density=st.sampled_from([0.0, 0.4, 1.0]),
    activation=st.sampled_from(ACTS),
    dtype=st.sampled_from([jnp.float32, jnp.bfloat16]),
    use_bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_vmapped_and_batched_calls_match_the_dense_oracle(block, grid, density, activation, dtype, use_bias, seed):
    n_in, n_out = grid[0] * block[0], grid[1] * block[1]
    layer, w = eqx_layer(seed, n_in, n_out, block, density, use_bias=use_bias, dtype=dtype, activation=activation)
    x = np.random.default_rng(seed + 1).standard_normal((2, 3, n_in)).astype(dtype)
    want = oracle(x, w, layer.bias, activation)
    # Equinox's way (one example at a time, mapped), leading dimensions directly, and one example: one compile.
    vmapped, batched, one = eqx.filter_jit(lambda m, x: (jax.vmap(jax.vmap(m))(x), m(x), m(x[0, 0])))(layer, x)
    assert vmapped.shape == (2, 3, n_out) and vmapped.dtype == dtype
    assert_close(vmapped, want, dtype)
    assert_close(batched, want, dtype)
    assert_close(one, want[0, 0], dtype)


def test_from_dense_follows_eqx_nn_linear(getkey):
    lin = eqx.nn.Linear(32, 16, key=getkey())
    x = jax.random.normal(getkey(), (5, 32))
    full = ESparseLinear.from_dense(lin.weight, lin.bias, block_size=8, density=1.0)  # (out, in) by default
    assert (full.in_features, full.out_features, full.use_bias) == (32, 16, True)
    np.testing.assert_allclose(jax.vmap(full)(x), jax.vmap(lin)(x), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(full.to_dense(), lin.weight)  # back in eqx.nn.Linear's layout
    same = ESparseLinear.from_dense(lin.weight.T, lin.bias, block_size=8, density=1.0, layout="in_out")
    np.testing.assert_array_equal(same.weight.to_dense(), full.weight.to_dense())
    half = ESparseLinear.from_dense(lin.weight, None, block_size=8, density=0.5, activation="relu")
    assert half.bias is None and not half.use_bias and half.weight.nnz_blocks == 4
    np.testing.assert_allclose(half(x), jax.nn.relu(x @ half.to_dense().T), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=re.escape("bias of shape (16,) (out_features,) for a weight of shape (16, 32)")
                       + r".*Got \(32,\); the weight would fit with layout='in_out'"):  # fmt: skip
        ESparseLinear.from_dense(lin.weight, jnp.zeros(32), block_size=8, density=0.5)
    with pytest.raises(ValueError, match=r"Expected layout 'in_out'"):
        ESparseLinear.from_dense(lin.weight, block_size=8, density=0.5, layout="oi")
    msg = "Expected a weight of shape (out, in) = (16, 64) for layout='out_in'. Got (16, 32)."
    with pytest.raises(ValueError, match=re.escape(msg)):
        ESparseLinear.from_dense(lin.weight, block_size=8, density=0.5, in_features=64, out_features=16)
    with pytest.raises(ValueError, match=r"activation None or one of"):
        ESparseLinear(8, 8, block_size=4, density=0.5, activation="gelu_new", key=getkey())
    with pytest.raises(TypeError, match="expected weight as concrete host data"):
        jax.jit(lambda w: ESparseLinear.from_dense(w, block_size=8, density=0.5))(lin.weight)


def test_init_follows_eqx_conventions(getkey):
    layer = ESparseLinear(64, 48, block_size=16, density=0.5, key=getkey())
    assert layer.weight.shape == (64, 48) and layer.weight.nnz_blocks == 6 and layer.bias.shape == (48,)
    bound = 1 / np.sqrt(64 * 0.5)  # the fan-in a unit sees
    assert 0.8 * bound < float(jnp.abs(layer.weight.data).max()) <= bound
    assert 0.5 * bound < float(jnp.abs(layer.bias).max()) <= bound
    no_bias = ESparseLinear(64, 48, block_size=16, density=0.5, use_bias=False, dtype=jnp.bfloat16, key=getkey())
    assert no_bias.bias is None and no_bias.weight.dtype == jnp.bfloat16
    assert jax.eval_shape(no_bias, jax.ShapeDtypeStruct((64,), jnp.bfloat16)).dtype == jnp.bfloat16
    params = eqx.filter(layer, eqx.is_array)
    assert [a.shape for a in jax.tree.leaves(params)] == [(6, 16, 16), (48,)]  # the pattern is static


def _product_eqns(jaxpr):
    return [e for e in jaxpr.eqns if e.primitive.name == "bs_sparse_linear"]


def test_vmap_is_one_batched_product(getkey):
    layer, w = eqx_layer(0, 32, 16, 8, 0.5, activation="gelu")
    xs = jax.random.normal(getkey(), (12, 32))
    jaxpr = jax.make_jaxpr(jax.vmap(layer))(xs).jaxpr
    (eqn,) = _product_eqns(jaxpr)  # one product whose rows are the 12 examples
    assert eqn.invars[0].aval.shape == (12, 32)

    # grad(vmap): the weight gradient is one sdd over the batch, never one per example then a sum.
    t = jax.random.normal(getkey(), (12, 16))
    loss = lambda m: jnp.sum((jax.vmap(m)(xs) - t) ** 2)
    grad_jaxpr = jax.make_jaxpr(eqx.filter_grad(loss))(layer).jaxpr
    biggest = max(v.aval.size for e in grad_jaxpr.eqns for v in e.outvars if hasattr(v.aval, "size"))
    assert biggest < xs.shape[0] * layer.weight.data.size, biggest
    g = eqx.filter_jit(eqx.filter_grad(loss))(layer)
    gd = jax.grad(lambda w: jnp.sum((jax.nn.gelu(xs @ w + layer.bias, approximate=False) - t) ** 2))(jnp.asarray(w))
    np.testing.assert_allclose(g.weight.to_dense(), gd * (w != 0), rtol=1e-4, atol=1e-4)

    # vmap(grad): per-example gradients, each the dense one restricted to the pattern.
    per = jax.vmap(eqx.filter_grad(lambda m, x, t: jnp.sum((m(x) - t) ** 2)), in_axes=(None, 0, 0))(layer, xs, t)
    assert per.weight.data.shape == (12, *layer.weight.data.shape)
    np.testing.assert_allclose(per.weight.data.sum(0), g.weight.data, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(per.bias.sum(0), g.bias, rtol=1e-4, atol=1e-4)


def test_pallas_kernel_under_vmap_and_grad(getkey):
    """The same product on the Pallas kernels (interpreter on the CPU): vmap and gradients."""
    layer, w = eqx_layer(1, 32, 32, 16, 0.5, activation="silu", implementation="pallas")
    xs = jax.random.normal(getkey(), (8, 32))
    with bs.interpret():
        y = eqx.filter_jit(lambda m, x: jax.vmap(m)(x))(layer, xs)
        g = eqx.filter_jit(eqx.filter_grad(lambda m: jnp.sum(jax.vmap(m)(xs) ** 2)))(layer)
    assert_close(y, oracle(xs, w, layer.bias, "silu"), jnp.float32)
    gd = jax.grad(lambda w: jnp.sum(jax.nn.silu(xs @ w + layer.bias) ** 2))(jnp.asarray(w))
    np.testing.assert_allclose(g.weight.to_dense(), gd * (w != 0), rtol=1e-4, atol=1e-4)


@pytest.mark.slow  # a training loop (10 s); the layer's calls and gradients are checked quickly
def test_a_small_model_trains_with_optax(getkey):
    model = eqx.nn.Sequential([
        ESparseLinear(32, 32, block_size=16, density=0.5, activation="gelu_tanh", key=getkey()),
        ESparseLinear(32, 8, block_size=8, density=0.5, key=getkey()),
    ])  # fmt: skip
    x = jax.random.normal(getkey(), (64, 32))
    t = jnp.tanh(x[:, :8])
    loss = eqx.filter_jit(lambda m: jnp.mean((jax.vmap(m)(x) - t) ** 2))
    opt = optax.adam(1e-2)
    state = opt.init(eqx.filter(model, eqx.is_array))

    @eqx.filter_jit
    def step(model, state):
        value, grads = eqx.filter_value_and_grad(loss)(model)
        updates, state = opt.update(grads, state, eqx.filter(model, eqx.is_array))
        return eqx.apply_updates(model, updates), state, value

    first = float(loss(model))
    for _ in range(15):
        model, state, _ = step(model, state)
    assert float(loss(model)) < 0.75 * first
    assert model.layers[0].weight.pattern.nnz_blocks == 2  # the pattern is static: training moves values only


@pytest.mark.gpu
def test_gpu_vmapped_layer_runs_the_fused_pallas_kernels(getkey):
    """On a GPU: jax.vmap of a bf16 layer is one fused Pallas product; its gradients are one Pallas sdd and one
    product, and match dense float32 ones."""
    n_in, n_out, batch = 1024, 2048, 512
    layer, w = eqx_layer(0, n_in, n_out, 32, 0.25, dtype=jnp.bfloat16, activation="gelu")
    xs = jax.random.normal(getkey(), (batch, n_in), jnp.bfloat16)
    with bs.dispatch_log() as log:
        y = eqx.filter_jit(lambda m, x: jax.vmap(m)(x))(layer, xs)
    assert log == [("dds+epilogue", "pallas")]
    assert_close(y, oracle(xs, w, layer.bias, "gelu"), jnp.bfloat16)
    loss = lambda m: jnp.sum(jax.vmap(m)(xs).astype(jnp.float32) ** 2) / batch
    with bs.dispatch_log() as log:
        g = eqx.filter_jit(eqx.filter_grad(loss))(layer)
    assert sorted(log) == [("dds+epilogue", "pallas"), ("sdd", "pallas")]
    f32 = lambda a: jnp.asarray(a, jnp.float32)
    dense = lambda w, b: jnp.sum(jax.nn.gelu(f32(xs) @ w + b, approximate=False) ** 2) / batch
    gw = jax.grad(dense)(f32(w), f32(layer.bias))
    np.testing.assert_allclose(f32(g.weight.to_dense()), gw * (np.asarray(f32(w)) != 0), rtol=5e-2,
                               atol=5e-2 * float(jnp.abs(gw).max()))  # fmt: skip
