"""What a new user hits: JAX's own activation functions, PyG's call signatures, clear errors on bad layer sizes."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import blocksparse as bs

FUNCTIONS = [
    (jax.nn.relu, "relu"),
    (jax.nn.gelu, "gelu_tanh"),
    (functools.partial(jax.nn.gelu, approximate=False), "gelu"),
    (jax.nn.silu, "silu"),
    (jax.nn.swish, "silu"),
    (jax.nn.sigmoid, "sigmoid"),
    (jnp.tanh, "tanh"),
]


@pytest.mark.parametrize("fn,name", FUNCTIONS)
def test_jax_activation_functions_are_fused_by_name(fn, name):
    W = bs.random(jax.random.key(0), (64, 64), 16, 0.5)
    x = jax.random.normal(jax.random.key(1), (8, 64))
    np.testing.assert_array_equal(bs.matmul(x, W, activation=fn), bs.matmul(x, W, activation=name))
    np.testing.assert_allclose(bs.matmul(x, W, activation=fn), fn(x @ W.to_dense()), rtol=1e-5, atol=1e-5)
    layer = bs.nn.SparseLinear.init(jax.random.key(2), 64, 32, 16, 0.5, activation=fn)
    assert layer.activation == name  # stored by name: hashable, printable, saved as such


def test_unknown_activation_is_named():
    W = bs.random(jax.random.key(0), (64, 64), 16, 0.5)
    with pytest.raises(ValueError, match=r"activation None or one of .*jax.nn.relu.*\]. Got the function softplus"):
        bs.matmul(jnp.ones((2, 64)), W, activation=jax.nn.softplus)
    with pytest.raises(ValueError, match=r"Got 'swish'"):
        bs.matmul(jnp.ones((2, 64)), W, activation="swish")


def test_the_triton_deprecation_warning_stays_filtered_after_filters_are_reset():
    import warnings

    from blocksparse.ops import _dispatch

    W = bs.random(jax.random.key(0), (64, 64), 16, 0.5)
    with warnings.catch_warnings(record=True) as seen:
        warnings.resetwarnings()  # as a test runner or a user's catch_warnings block may leave them
        warnings.simplefilter("always")
        bs.matmul(jnp.ones((2, 64)), W, implementation="xla")  # any op traced puts the filter back
        warnings.warn(_dispatch._TRITON_DEPRECATION + " and will be removed", DeprecationWarning, stacklevel=1)
        warnings.warn("another deprecation", DeprecationWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == ["another deprecation"]
