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


def _graph_inputs():
    ei = np.array([[0, 1, 2, 3], [1, 2, 3, 0]])
    return jax.random.normal(jax.random.key(0), (4, 8)), ei, jnp.array([1.0, 2.0, 0.5, 1.0])


def test_gnn_layers_take_pygs_positional_arguments():
    x, ei, w = _graph_inputs()
    gcn = bs.gnn.GCNConv.init(jax.random.key(1), 8, 4)
    np.testing.assert_array_equal(gcn(x, ei, w), gcn(x, ei, edge_weight=w))
    attr = jax.random.normal(jax.random.key(2), (4, 3))
    for cls in (bs.gnn.GATv2Conv, bs.gnn.TransformerConv):
        layer = cls.init(jax.random.key(3), 8, 4, heads=2, edge_dim=3)
        np.testing.assert_array_equal(layer(x, ei, attr), layer(x, ei, edge_attr=attr))


@pytest.mark.parametrize("cls", [bs.gnn.GCNConv, bs.gnn.GATv2Conv, bs.gnn.TransformerConv])
@pytest.mark.parametrize("in_channels,match", [(-1, "lazy -1 is not supported"), (0, "positive int"),
                                               ("8", "positive int")])  # fmt: skip
def test_gnn_layer_sizes_named_when_wrong(cls, in_channels, match):
    with pytest.raises((TypeError, ValueError), match=rf"{cls.__name__}: expected in_channels.*{match}"):
        cls.init(jax.random.key(0), in_channels, 4)


@pytest.mark.parametrize("cls", [bs.gnn.GATv2Conv, bs.gnn.TransformerConv])
def test_gnn_layer_heads_must_be_positive(cls):
    with pytest.raises(ValueError, match=rf"{cls.__name__}: expected heads as a positive int. Got 0"):
        cls.init(jax.random.key(0), 8, 4, heads=0)


def test_bench_exit_codes_tell_a_wrong_result_from_a_cell_that_could_not_run():
    from blocksparse.bench import Cell, CellFailed, Timer, run_cell
    from blocksparse.bench._cli import exit_code

    def wrong(timer):
        raise CellFailed("expected 1, got 2")

    def missing(timer):
        raise ModuleNotFoundError("No module named 'optax'", name="optax")

    timer = Timer(iters=1, trials=1)
    ok = run_cell(Cell("demo", "ok", {}, lambda timer: {"x": 1}), timer)
    bad = run_cell(Cell("demo", "wrong", {}, wrong), timer)
    broken = run_cell(Cell("demo", "broken", {}, missing), timer)
    assert "pip install 'blocksparse[train]'" in broken.error and broken.broken and not bad.broken
    assert exit_code([ok]) == 0 and exit_code([ok, broken]) == 3 and exit_code([bad, broken]) == 1


def test_model_suite_rows_say_when_the_encoder_is_random(monkeypatch):
    from blocksparse.bench import model

    monkeypatch.setattr(model, "importlib_find", lambda name: None)  # the weights package not installed
    monkeypatch.delenv(model.ENV_WEIGHTS, raising=False)
    cells = model.cells(full=False)
    assert cells and all(c.label.endswith("[random weights]") for c in cells)
    assert all(c.params["weights"].startswith("random") for c in cells)


def test_usage_lines_name_the_command_as_typed():
    import subprocess
    import sys
    from pathlib import Path

    script = Path(sys.executable).with_name("blocksparse")
    out = subprocess.run([sys.executable, "-m", "blocksparse", "--help"], capture_output=True, text=True, timeout=120)
    assert out.stdout.startswith("usage: python -m blocksparse ")
    if script.exists():  # the installed console script
        out = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=120)
        assert out.stdout.startswith("usage: blocksparse ")
