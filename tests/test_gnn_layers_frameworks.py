"""The Flax NNX and Equinox forms of GCNConv, GATv2Conv, TransformerConv against the plain layers.

The plain layers (tests/test_gnn_layers.py checks them against NumPy oracles of PyG's formulas) are
the oracle here: each module, holding the same parameters, gives the same outputs and the same
parameter gradients (dropout included, given the same key); under ``nnx.jit`` / ``eqx.filter_jit``
graphs of one edge capacity share one trace; a few optax steps lower a loss; dtype handling and
the dropout-mode arguments follow each framework; a missing framework raises naming the extra.
"""

import importlib
import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from helpers import examples, sweep
from hypothesis import given, settings
from hypothesis import strategies as st

import blocksparse.gnn.equinox as E
import blocksparse.gnn.flax as F
from blocksparse.gnn import layers as L

N, E_CAP, IN, OUT, EDGE_DIM = 7, 14, 5, 3, 2  # fixed shapes: every example reuses one set of compilations
TOL = dict(rtol=1e-5, atol=1e-6)

# (name, plain-layer init kwargs, call kind): one configuration per feature the modules pass through
CONFIGS = {
    "gcn": (L.GCNConv, dict(), "edge_weight"),
    "gcn_plain_sum": (L.GCNConv, dict(normalize=False, bias=False), None),
    "gat": (L.GATv2Conv, dict(heads=2, dropout=0.3), None),
    "gat_edges": (L.GATv2Conv, dict(heads=2, concat=False, edge_dim=EDGE_DIM, share_weights=True), "edge_attr"),
    "transformer": (L.TransformerConv, dict(heads=2, beta=True, dropout=0.3), None),
    "transformer_edges": (L.TransformerConv, dict(heads=2, edge_dim=EDGE_DIM, root_weight=False), "edge_attr"),
}
FLAX = {L.GCNConv: F.GCNConv, L.GATv2Conv: F.GATv2Conv, L.TransformerConv: F.TransformerConv}
EQX = {L.GCNConv: E.GCNConv, L.GATv2Conv: E.GATv2Conv, L.TransformerConv: E.TransformerConv}


def _graph(seed, e=E_CAP):
    """Random edges over nodes ``< N - 1`` (node ``N - 1`` isolated), padded to ``E_CAP`` edges."""
    rng = np.random.default_rng(seed)
    ei = np.zeros((2, E_CAP), np.int32)
    ei[:, :e] = rng.integers(0, N - 1, (2, e))
    return ei


def _inputs(seed, extra):
    rng = np.random.default_rng(seed + 1000)
    x = jnp.asarray(rng.standard_normal((N, IN)), jnp.float32)
    kw = {}
    if extra == "edge_weight":
        kw["edge_weight"] = jnp.asarray(rng.uniform(0.5, 2.0, E_CAP), jnp.float32)
    elif extra == "edge_attr":
        kw["edge_attr"] = jnp.asarray(rng.standard_normal((E_CAP, EDGE_DIM)), jnp.float32)
    return x, kw


def _plain(name, seed):
    cls, kw, extra = CONFIGS[name]
    return cls.init(jax.random.key(seed), IN, OUT, **kw), extra


def _loss(out):
    return jnp.sum(jnp.sin(out) * jnp.arange(out.size, dtype=out.dtype).reshape(out.shape))


def _assert_tree_close(a, b):
    a, b = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(a) == len(b)
    for u, v in zip(a, b, strict=True):
        np.testing.assert_allclose(np.asarray(u), np.asarray(v), **TOL)


def _loss_out(out):
    return _loss(out), out


def _plain_value_and_grads(plain, x, ei, kw, num_edges, key=None):
    """The plain layer's output and parameter gradients (one forward pass)."""
    extra = {} if isinstance(plain, L.GCNConv) else dict(key=key)
    (_, out), grads = jax.value_and_grad(lambda p: _loss_out(p(x, ei, num_edges=num_edges, **kw, **extra)),
                                         has_aux=True)(plain)  # fmt: skip
    return out, grads


# ------------------------------------------------------------------------------------ equal to the plain layers
@sweep("name", list(CONFIGS))
@settings(max_examples=examples(3), deadline=None)
@given(seed=st.integers(0, 2**16), e=st.integers(0, E_CAP), dropout_key=st.booleans())
def test_flax_module_equals_the_plain_layer(name, seed, e, dropout_key):
    plain, extra = _plain(name, seed)
    module = FLAX[type(plain)].from_plain(plain)
    x, kw = _inputs(seed, extra)
    ei, ne = _graph(seed, e), np.int32(e)
    drops = getattr(plain, "dropout", 0.0) > 0
    key = jax.random.key(seed) if drops and dropout_key else None
    call = {} if isinstance(plain, L.GCNConv) else dict(deterministic=key is None, rngs=key)

    (_, out), grads = nnx.value_and_grad(lambda m: _loss_out(m(x, ei, num_edges=ne, **kw, **call)), has_aux=True)(
        module
    )
    want_out, want = _plain_value_and_grads(plain, x, ei, kw, ne, key)
    np.testing.assert_allclose(out, want_out, **TOL)
    got = nnx.to_pure_dict(grads)
    assert set(got) == {n for n in plain._leaves if getattr(plain, n) is not None}
    for n, g in got.items():
        np.testing.assert_allclose(g, getattr(want, n), **TOL, err_msg=n)


@sweep("name", list(CONFIGS))
@settings(max_examples=examples(3), deadline=None)
@given(seed=st.integers(0, 2**16), e=st.integers(0, E_CAP), dropout_key=st.booleans())
def test_equinox_module_equals_the_plain_layer(name, seed, e, dropout_key):
    plain, extra = _plain(name, seed)
    module = EQX[type(plain)].from_plain(plain)
    x, kw = _inputs(seed, extra)
    ei, ne = _graph(seed, e), np.int32(e)
    drops = getattr(plain, "dropout", 0.0) > 0
    key = jax.random.key(seed) if drops and dropout_key else None
    call = {} if isinstance(plain, L.GCNConv) else dict(key=key, inference=key is None)

    (_, out), grads = eqx.filter_value_and_grad(lambda m: _loss_out(m(x, ei, num_edges=ne, **kw, **call)),
                                                has_aux=True)(module)  # fmt: skip
    want_out, want = _plain_value_and_grads(plain, x, ei, kw, ne, key)
    np.testing.assert_allclose(out, want_out, **TOL)
    _assert_tree_close(grads.to_plain(), want)


def test_constructors_follow_the_plain_init():
    key = jax.random.key(3)
    for name in ("gat_edges", "transformer"):
        plain_cls, kw, _ = CONFIGS[name]
        plain = plain_cls.init(nnx.Rngs(params=key).params(), IN, OUT, **kw)  # the key the module draws
        nn_module = FLAX[plain_cls](IN, OUT, **kw, rngs=nnx.Rngs(params=key))
        _assert_tree_close(nn_module.to_plain(), plain)
        eqx_module = EQX[plain_cls](IN, OUT, **kw, key=key)
        _assert_tree_close(eqx_module.to_plain(), plain_cls.init(key, IN, OUT, **kw))
        assert nn_module.to_plain()._meta() == plain._meta() == eqx_module.to_plain()._meta()
    gcn = F.GCNConv(IN, OUT, improved=True, bias=False, rngs=nnx.Rngs(0))
    assert gcn.bias is None and gcn.improved and isinstance(gcn.weight, nnx.Param)
    assert (gcn.in_channels, gcn.out_channels) == (IN, OUT) and gcn.weight.shape == (OUT, IN)  # PyG's (out, in)
    egcn = E.GCNConv(IN, OUT, key=key)
    assert (egcn.in_channels, egcn.out_channels) == (IN, OUT)
    # The plain layer's argument checks apply.
    with pytest.raises(ValueError, match=r"expected dropout in \[0, 1\)\. Got 1\.5"):
        F.GATv2Conv(IN, OUT, dropout=1.5, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"expected add_self_loops=False with normalize=False"):
        E.GCNConv(IN, OUT, normalize=False, add_self_loops=True, key=key)
    with pytest.raises(TypeError, match=r"expected a blocksparse.gnn.layers.GCNConv\. Got GATv2Conv"):
        E.GCNConv.from_plain(L.GATv2Conv.init(key, IN, OUT))
    # A hand-built plain layer whose biases the constructor cannot reproduce.
    mixed = L.GATv2Conv.init(key, IN, OUT)._replace(lin_r_bias=None)
    with pytest.raises(ValueError, match=r"expected lin_r_bias of shape \(3,\) \(the layer's configuration\)\. Got No"):
        F.GATv2Conv.from_plain(mixed)
    # The bad-input errors are the plain layer's.
    with pytest.raises(ValueError, match=r"GCNConv: expected x of shape \(num_nodes, in_channels=5\)\. Got \(7, 4\)"):
        gcn(jnp.ones((N, 4)), _graph(0))


def test_bipartite_and_prebuilt_graphs_pass_through():
    key = jax.random.key(4)
    plain = L.GATv2Conv.init(key, (IN, 4), OUT, heads=2)
    x = (jax.random.normal(key, (N, IN)), jax.random.normal(key, (5, 4)))
    ei = np.array([[0, 6, 3], [1, 4, 0]], np.int32)
    want = plain(x, ei)
    np.testing.assert_allclose(F.GATv2Conv.from_plain(plain)(x, ei), want, **TOL)
    np.testing.assert_allclose(E.GATv2Conv.from_plain(plain)(x, ei), want, **TOL)
    from blocksparse.gnn import Graph

    g = Graph.from_edges(_graph(1)[0], _graph(1)[1], N)
    gcn = L.GCNConv.init(key, IN, OUT)
    xs = jax.random.normal(key, (N, IN))
    np.testing.assert_allclose(F.GCNConv.from_plain(gcn)(xs, g), gcn(xs, g), **TOL)
    np.testing.assert_allclose(E.GCNConv.from_plain(gcn)(xs, g), gcn(xs, g), **TOL)


# ------------------------------------------------------------------------------------ dtypes and dropout modes
def test_flax_dtype_and_param_dtype():
    plain = L.TransformerConv.init(jax.random.key(5), IN, OUT, heads=2)
    x, ei = jax.random.normal(jax.random.key(6), (N, IN)), _graph(2)
    half = F.TransformerConv(IN, OUT, heads=2, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    assert half.lin_query_weight[...].dtype == jnp.float32  # param_dtype
    assert half(x, ei).dtype == jnp.bfloat16  # computed in dtype, as nnx.Linear
    cast = F.TransformerConv.from_plain(plain, dtype=jnp.bfloat16)
    want = jax.tree.map(lambda a: a.astype(jnp.bfloat16), plain)(x.astype(jnp.bfloat16), ei)
    np.testing.assert_array_equal(np.asarray(cast(x, ei), np.float32), np.asarray(want, np.float32))
    stored = F.GCNConv(IN, OUT, param_dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    assert stored.weight[...].dtype == jnp.bfloat16 and stored(x, ei).dtype == jnp.float32  # dtype=None promotes
    assert E.GCNConv(IN, OUT, dtype=jnp.bfloat16, key=jax.random.key(0)).weight.dtype == jnp.bfloat16


def test_flax_dropout_follows_nnx_multi_head_attention():
    x, ei = jax.random.normal(jax.random.key(7), (N, IN)), _graph(3)
    conv = F.GATv2Conv(IN, OUT, heads=2, dropout=0.5, rngs=nnx.Rngs(0))
    plain = conv.to_plain()
    with pytest.raises(ValueError, match=r"GATv2Conv: dropout=0.5 needs deterministic=True/False.*Got None"):
        conv(x, ei)
    np.testing.assert_allclose(conv(x, ei, deterministic=True), plain(x, ei), **TOL)
    conv.train()  # deterministic=False: draws from the dropout stream forked at construction
    a, b = conv(x, ei), conv(x, ei)
    assert not np.allclose(a, b)  # the stream advances
    key = jax.random.key(11)
    np.testing.assert_allclose(conv(x, ei, rngs=key), plain(x, ei, key=key), **TOL)
    stream_key = nnx.Rngs(dropout=key).dropout()  # an Rngs at the call: its dropout stream's next key
    np.testing.assert_allclose(conv(x, ei, rngs=nnx.Rngs(dropout=key)), plain(x, ei, key=stream_key), **TOL)
    conv.eval()
    np.testing.assert_allclose(conv(x, ei), plain(x, ei), **TOL)
    no_rngs = F.TransformerConv(IN, OUT, dropout=0.5, deterministic=False, rngs=nnx.Rngs(0), keep_rngs=False)
    with pytest.raises(ValueError, match=r"TransformerConv: dropout=0.5 with deterministic=False needs rngs"):
        no_rngs(x, ei)
    assert no_rngs(x, ei, rngs=key).shape == (N, OUT)
    assert F.TransformerConv(IN, OUT, rngs=nnx.Rngs(0))(x, ei).shape == (N, OUT)  # dropout=0: no mode needed


def test_equinox_dropout_follows_eqx_nn_dropout():
    x, ei = jax.random.normal(jax.random.key(8), (N, IN)), _graph(4)
    conv = E.TransformerConv(IN, OUT, heads=2, dropout=0.5, key=jax.random.key(0))
    plain = conv.to_plain()
    with pytest.raises(ValueError, match=r"TransformerConv: dropout=0.5 in training mode \(inference=False\) needs"):
        conv(x, ei)
    key = jax.random.key(12)
    np.testing.assert_allclose(conv(x, ei, key=key), plain(x, ei, key=key), **TOL)
    np.testing.assert_allclose(conv(x, ei, key=key, inference=True), plain(x, ei), **TOL)
    frozen = eqx.nn.inference_mode(conv)
    assert frozen.inference
    np.testing.assert_allclose(frozen(x, ei, key=key), plain(x, ei), **TOL)
    np.testing.assert_allclose(frozen(x, ei, key=key, inference=False), plain(x, ei, key=key), **TOL)
    assert E.GATv2Conv(IN, OUT, key=jax.random.key(0))(x, ei).shape == (N, OUT)  # dropout=0: no key needed


# ------------------------------------------------------------------------------------ jit, changing graphs
def test_flax_jit_one_trace_for_graphs_of_one_capacity():
    rngs = nnx.Rngs(0)
    convs = nnx.List([F.GCNConv(IN, 8, rngs=rngs), F.GATv2Conv(8, 4, heads=2, rngs=rngs),
                      F.TransformerConv(8, OUT, heads=2, concat=False, rngs=rngs)])  # fmt: skip
    traces = []

    @nnx.jit
    def forward(convs, x, ei, ne):
        traces.append(1)
        h = jax.nn.relu(convs[0](x, ei, num_edges=ne))
        return convs[1](h, ei, num_edges=ne), convs[2](h, ei, num_edges=ne)

    x = jax.random.normal(jax.random.key(9), (N, IN))
    plain = [c.to_plain() for c in convs]
    for seed, e in ((0, E_CAP), (1, 9), (2, 0)):
        ei, ne = jnp.asarray(_graph(seed, e)), jnp.int32(e)
        got = forward(convs, x, ei, ne)
        h = jax.nn.relu(plain[0](x, ei, num_edges=ne))
        _assert_tree_close(got, (plain[1](h, ei, num_edges=ne), plain[2](h, ei, num_edges=ne)))
    assert len(traces) == 1


def test_equinox_filter_jit_one_trace_for_graphs_of_one_capacity():
    keys = jax.random.split(jax.random.key(10), 3)
    convs = (E.GCNConv(IN, 8, key=keys[0]), E.GATv2Conv(8, 4, heads=2, key=keys[1]),
             E.TransformerConv(8, OUT, heads=2, concat=False, key=keys[2]))  # fmt: skip
    traces = []

    @eqx.filter_jit
    def forward(convs, x, ei, ne):
        traces.append(1)
        h = jax.nn.relu(convs[0](x, ei, num_edges=ne))
        return convs[1](h, ei, num_edges=ne), convs[2](h, ei, num_edges=ne)

    x = jax.random.normal(jax.random.key(9), (N, IN))
    for seed, e in ((0, E_CAP), (1, 9), (2, 0)):
        ei, ne = _graph(seed, e), jnp.int32(e)  # a NumPy edge_index is traced too; num_edges a JAX scalar
        got = forward(convs, x, ei, ne)
        h = jax.nn.relu(convs[0].to_plain()(x, ei, num_edges=ne))
        want = (convs[1].to_plain()(h, ei, num_edges=ne), convs[2].to_plain()(h, ei, num_edges=ne))
        _assert_tree_close(got, want)
    assert len(traces) == 1


# ------------------------------------------------------------------------------------ training
CLASSES = 3


def _task():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((N, IN)), jnp.float32)
    y = jnp.asarray(rng.integers(0, CLASSES, N))
    graphs = [(jnp.asarray(_graph(s, e)), jnp.int32(e)) for s, e in ((0, 14), (1, 10), (2, 12))]
    return x, y, graphs


def test_flax_model_trains_with_nnx_optimizer():
    class Net(nnx.Module):
        def __init__(self, rngs):
            self.gcn = F.GCNConv(IN, 16, rngs=rngs)
            self.gat = F.GATv2Conv(16, CLASSES, heads=2, concat=False, dropout=0.2, rngs=rngs)

        def __call__(self, x, ei, ne):
            return self.gat(jax.nn.relu(self.gcn(x, ei, num_edges=ne)), ei, num_edges=ne)

    x, y, graphs = _task()
    model = Net(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(3e-2), wrt=nnx.Param)
    traces = []

    def ce(m, ei, ne):
        return optax.softmax_cross_entropy_with_integer_labels(m(x, ei, ne), y).mean()

    @nnx.jit
    def step(model, optimizer, ei, ne):
        traces.append(1)
        loss, grads = nnx.value_and_grad(ce)(model, ei, ne)
        optimizer.update(model, grads)
        return loss

    model.eval()
    before = [float(ce(model, *g)) for g in graphs]
    model.train()  # attention dropout on, keys from the layer's own stream (state carried through nnx.jit)
    for i in range(30):
        step(model, optimizer, *graphs[i % len(graphs)])
    model.eval()
    after = [float(ce(model, *g)) for g in graphs]
    assert len(traces) == 1
    assert np.mean(after) < 0.7 * np.mean(before), (before, after)


def test_equinox_model_trains_with_optax():
    x, y, graphs = _task()
    keys = jax.random.split(jax.random.key(0), 2)
    model = (E.GCNConv(IN, 16, key=keys[0]), E.TransformerConv(16, CLASSES, heads=2, concat=False, dropout=0.2,
                                                                key=keys[1]))  # fmt: skip
    opt = optax.adam(3e-2)
    opt_state = opt.init(eqx.filter(model, eqx.is_array))
    traces = []

    def ce(model, ei, ne, key=None):
        h = jax.nn.relu(model[0](x, ei, num_edges=ne))
        return optax.softmax_cross_entropy_with_integer_labels(model[1](h, ei, num_edges=ne, key=key), y).mean()

    @eqx.filter_jit
    def step(model, opt_state, ei, ne, key):
        traces.append(1)
        loss, grads = eqx.filter_value_and_grad(ce)(model, ei, ne, key)
        updates, opt_state = opt.update(grads, opt_state, eqx.filter(model, eqx.is_array))
        return eqx.apply_updates(model, updates), opt_state, loss

    frozen = eqx.nn.inference_mode(model)
    before = [float(ce(frozen, *g)) for g in graphs]
    for i, key in enumerate(jax.random.split(jax.random.key(1), 30)):
        model, opt_state, _ = step(model, opt_state, *graphs[i % len(graphs)], key)
    frozen = eqx.nn.inference_mode(model)
    after = [float(ce(frozen, *g)) for g in graphs]
    assert len(traces) == 1
    assert np.mean(after) < 0.7 * np.mean(before), (before, after)


# ------------------------------------------------------------------------------------ missing framework
@pytest.mark.parametrize(
    ("module", "package", "message"),
    [
        ("blocksparse.gnn.flax", "flax", "bs.gnn.flax needs Flax: pip install 'blocksparse[flax]'"),
        ("blocksparse.gnn.equinox", "equinox", "bs.gnn.equinox needs Equinox: pip install 'blocksparse[equinox]'"),
    ],
)
def test_missing_framework_names_the_extra(monkeypatch, module, package, message):
    monkeypatch.setitem(sys.modules, package, None)  # `import flax` now fails, as if not installed
    monkeypatch.delitem(sys.modules, module)  # restored after the test
    with pytest.raises(ModuleNotFoundError) as info:
        importlib.import_module(module)
    assert str(info.value) == message and info.value.name == package
    import blocksparse.gnn.layers  # noqa: F401  (the plain layers never need a framework)
