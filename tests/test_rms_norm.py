"""``blocksparse.ops.norm.rms_norm``: RMSNorm of each row, the residual add before it in the same launch.

CPU (``make test``): the Pallas kernel in the interpreter against NumPy and the XLA reference on random row counts
(one, not a whole number of tiles), widths and dtypes, with and without the residual; widths the kernel does not
take fall back to XLA; bad input; one launch in the CUDA lowering; the decoder's Pallas steps use one launch per
norm. GPU (``-m gpu``): the real kernel on the decoder's widths.
"""

from __future__ import annotations

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import has_gpu
from helpers import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from test_gnn_pallas import _lower_for_cuda

from blocksparse import hardware
from blocksparse.models import LlamaConfig, LlamaModel, fuse_projections, prune_decoder
from blocksparse.ops.matmul import tuned
from blocksparse.ops.norm import rms_norm, rms_norm_reference

ON_GPU = has_gpu()
TOL = {jnp.dtype(jnp.float32): 1e-5, jnp.dtype(jnp.bfloat16): 1e-2, jnp.dtype(jnp.float16): 2e-3}


pytestmark = pytest.mark.usefixtures("kernels_here")


def numpy_rms_norm(x, weight, eps):
    x = np.asarray(x, np.float64)
    return np.asarray(weight, np.float64) * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def _close(got, want, dtype):
    np.testing.assert_allclose(np.asarray(got, np.float64), want, atol=TOL[jnp.dtype(dtype)] * 4,
                               rtol=TOL[jnp.dtype(dtype)])  # fmt: skip


@settings(max_examples=examples(24), deadline=None)
@given(
    lead=st.sampled_from([(1,), (5,), (2, 3), (33,), (1, 1, 2)]),
    hidden=st.sampled_from([16, 64, 256, 2048]),
    dtype=st.sampled_from([jnp.float32, jnp.bfloat16, jnp.float16]),
    residual=st.booleans(),
    eps=st.sampled_from([0.0, 1e-6, 1e-5]),
    seed=st.integers(0, 2**16),
)
def test_matches_numpy_and_the_reference(lead, hidden, dtype, residual, eps, seed):
    keys = jax.random.split(jax.random.key(seed), 3)
    x = (jax.random.normal(keys[0], (*lead, hidden)) * 3).astype(dtype)
    r = jax.random.normal(keys[1], x.shape).astype(dtype) if residual else None
    w = jax.random.normal(keys[2], (hidden,)).astype(dtype)
    got = rms_norm(x, w, eps=eps, residual=r)
    want = rms_norm_reference(x, w, eps=eps, residual=r)
    if residual:
        (s, got), (s_want, want) = got, want
        np.testing.assert_array_equal(s, s_want)  # the sum in x's dtype, as XLA rounds it
        assert s.dtype == x.dtype
    else:
        s = x
    assert got.shape == x.shape and got.dtype == x.dtype
    _close(got, numpy_rms_norm(s, w, eps), dtype)
    _close(got, np.asarray(want, np.float64), dtype)


def test_zero_rows_and_widths_the_kernel_does_not_take_match_the_reference():
    w = jnp.linspace(0.5, 2.0, 48)
    x = jax.random.normal(jax.random.key(0), (3, 48))
    np.testing.assert_array_equal(rms_norm(x, w), rms_norm_reference(x, w))  # 48: not a power of two, XLA
    zero = jnp.zeros((4, 64))
    np.testing.assert_array_equal(rms_norm(zero, jnp.ones(64), eps=1e-5), zero)  # all-zero rows stay zero
    assert rms_norm(jnp.zeros((0, 64)), jnp.ones(64)).shape == (0, 64)


def test_bad_input_names_expected_and_actual():
    x = jnp.ones((2, 64))
    with pytest.raises(ValueError, match=r"Expected weight of shape \(64,\), the last axis of x. Got x \(2, 64\), "
                                         r"weight \(32,\)"):  # fmt: skip
        rms_norm(x, jnp.ones(32))
    with pytest.raises(ValueError, match=r"Expected residual of x's shape \(2, 64\). Got \(1, 64\)"):
        rms_norm(x, jnp.ones(64), residual=jnp.ones((1, 64)))
    with pytest.raises(ValueError, match="Expected a floating x .* Got int32"):
        rms_norm(jnp.ones((2, 64), jnp.int32), jnp.ones(64))
    with pytest.raises(ValueError, match="Expected eps >= 0. Got -1"):
        rms_norm(x, jnp.ones(64), eps=-1)


@pytest.mark.skipif(ON_GPU, reason="the GPU runs the kernel for real")
def test_one_launch_with_the_residual():
    x = jnp.ones((8, 1, 2048), jnp.bfloat16)
    txt = _lower_for_cuda(lambda x, r, w: rms_norm(x, w, residual=r), x, x, jnp.ones(2048, jnp.bfloat16))
    assert txt.count("__gpu$xla.gpu.triton") == 1 and "bs_rms_norm" in txt
    assert "stablehlo.reduce" not in txt and "stablehlo.add" not in txt


def _launches(jaxpr, name: str) -> int:
    """The ``pallas_call`` equations named ``name`` in ``jaxpr`` and the jaxprs it calls, each call counted."""
    n = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "pallas_call":
            n += name in str(eqn.params["name"])
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            n += _launches(sub, name)
    return n


def test_decoder_steps_run_one_norm_launch_per_norm():
    # A one-token step of the Pallas decoder: two norms a layer and the final one, each with the residual add before it.
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64,
                      head_dim=32, max_positions=64)  # fmt: skip
    model = LlamaModel.random(jax.random.key(0), cfg).with_attention("pallas")
    cache = model.init_cache(2, 64)
    tokens = jnp.ones((2, 1), jnp.int32)
    step = jax.make_jaxpr(lambda t, c: model.step(t, c, 5))(tokens, cache)
    assert _launches(step.jaxpr, "bs_rms_norm") == 2 * cfg.num_layers + 1
    logits = jax.jit(lambda m, t, c: m.step(t, c, 5)[0])  # one program each (eager, every op compiles alone)
    np.testing.assert_allclose(logits(model, tokens, cache), logits(model.with_attention("xla"), tokens, cache),
                               atol=1e-5, rtol=1e-5)  # fmt: skip


def test_pruned_decoder_steps_gate_the_mlp_by_the_tuned_rule():
    # Fused and pruned, a one-token step's gate and up projections are one product a layer, and the down product gates
    # its halves as it loads them (on a faked H200, where the few-token kernel takes these products).
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64,
                      head_dim=32, max_positions=64)  # fmt: skip
    model = fuse_projections(prune_decoder(LlamaModel.random(jax.random.key(0), cfg), 16, 0.5))
    model = model.with_attention("pallas")
    cache = model.init_cache(2, 64)
    tokens = jnp.ones((2, 1), jnp.int32)
    with hardware.fake(hardware.H200):
        step = jax.make_jaxpr(lambda t, c: model.step(t, c, 5))(tokens, cache)
        logits = jax.jit(lambda m, t, c: m.step(t, c, 5)[0])(model, tokens, cache)
    # in the down product's load where the device's tuned table measured it faster, else in XLA before it; never
    # in the gate/up product's store (the model asks the down product to gate)
    assert _launches(step.jaxpr, "_gated_x") == (cfg.num_layers if tuned.H200.TRITON_STREAM_GATES_INPUT else 0)
    assert _launches(step.jaxpr, "_glu") == 0
    want = jax.jit(lambda m, t, c: m.step(t, c, 5)[0])(model.with_attention("xla"), tokens, cache)
    np.testing.assert_allclose(logits, want, atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 8, 32, 4096])
@pytest.mark.parametrize("hidden", [2048, 8192])
def test_decoder_widths_on_the_gpu(rows, hidden):
    keys = jax.random.split(jax.random.key(rows), 3)
    x = jax.random.normal(keys[0], (rows, 1, hidden)).astype(jnp.bfloat16)
    r = jax.random.normal(keys[1], x.shape).astype(jnp.bfloat16)
    w = jax.random.normal(keys[2], (hidden,)).astype(jnp.bfloat16)
    s, got = jax.jit(lambda x, r, w: rms_norm(x, w, residual=r))(x, r, w)
    s_want, want = rms_norm_reference(x, w, residual=r)
    np.testing.assert_array_equal(s, s_want)
    _close(got, numpy_rms_norm(s, w, 1e-5), jnp.bfloat16)
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), atol=4e-2, rtol=1e-2)
