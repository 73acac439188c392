"""bs.save / bs.load: exact round trips (bits, dtypes, patterns, tree structure, no retracing) of matrices, layers,
pruned models and nested trees; the file as a plain safetensors reader sees it; every refusal of bad input."""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import examples
from hypothesis import given, settings
from hypothesis import strategies as st

import blocksparse as bs
from blocksparse import _safetensors
from blocksparse.models import (
    BertConfig,
    BertEncoder,
    LlamaConfig,
    LlamaModel,
    prune_decoder,
    prune_encoder,
    read_safetensors,
    save_llama,
)
from blocksparse.testing import strategies as bst

DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)


def round_trip(tree):
    with tempfile.TemporaryDirectory() as d:
        return bs.load(bs.save(Path(d) / "tree.safetensors", tree))


def bits(x) -> tuple:
    """What must survive exactly: the kind of array, dtype, shape and bytes (key arrays by their key data)."""
    if isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        return ("key", str(jax.random.key_impl(x)), bits(jax.random.key_data(x)))
    a = np.asarray(x)
    return type(x).__name__, a.dtype, a.shape, a.reshape(-1).view(np.uint8).tobytes()


def assert_same(a, b):
    """Equal tree structure (static fields, patterns), then every leaf equal in kind, dtype and bits."""
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        if isinstance(x, jax.Array | np.ndarray | np.generic):
            assert bits(x) == bits(y)
            assert getattr(x, "weak_type", None) == getattr(y, "weak_type", None)
        else:
            assert type(x) is type(y) and (x == y or x != x and y != y), (x, y)  # NaN equals NaN here


def matrix(seed: int, shape, block_size, density: float, dtype=jnp.float32) -> bs.BlockSparseMatrix:
    """A random matrix drawn with NumPy (``bs.random`` draws with jax.random, which compiles per shape)."""
    pattern = bs.BlockPattern.random(seed, shape, block_size, density)
    values = np.random.default_rng(seed).standard_normal((pattern.nnz_blocks, *pattern.block_size))
    return bs.BlockSparseMatrix(pattern, values.astype(dtype))


def normal(seed: int, *shape, dtype=np.float32) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def random_bits(rng, shape, dtype) -> np.ndarray:
    """Values of ``dtype`` from uniformly random bits: NaNs with payloads, infinities, -0.0 and subnormals too."""
    dt = jnp.dtype(dtype)
    return rng.integers(0, 2 ** (8 * dt.itemsize), shape, dtype=f"u{dt.itemsize}").view(dt)


# -- round trips ----------------------------------------------------------------------------------------------------
@settings(max_examples=examples(40))
@given(pattern=bst.block_patterns(), dtype=bst.dtypes(DTYPES), seed=st.integers(0, 2**32 - 1))
def test_matrix_round_trip_is_bitwise_with_the_same_pattern(pattern, dtype, seed):
    W = bs.BlockSparseMatrix(
        pattern, random_bits(np.random.default_rng(seed), (pattern.nnz_blocks, *pattern.block_size), dtype)
    )
    out = round_trip(W)
    assert type(out) is bs.BlockSparseMatrix and out.pattern == W.pattern
    assert out.pattern.fingerprint == W.pattern.fingerprint
    np.testing.assert_array_equal(out.pattern.rows, W.pattern.rows)
    assert_same(out, W)


@settings(max_examples=examples(20))
@given(D=bst.dynamic_block_sparse_matrices(dtype=bst.dtypes(DTYPES)))
def test_dynamic_matrix_round_trip_keeps_padding_and_duplicates(D):
    out = round_trip(D)
    assert type(out) is bs.DynamicBlockSparseMatrix and out.capacity == D.capacity
    assert_same(out, D)  # rows, cols, data (padding garbage included) and nnz, bit for bit


def leaves():
    arrays = st.builds(
        lambda seed, dt, shape, jax_array: (jnp.asarray if jax_array else np.asarray)(
            random_bits(np.random.default_rng(seed), shape, dt) if jnp.issubdtype(dt, jnp.floating)
            else np.random.default_rng(seed).integers(0, 2, shape).astype(dt)),
        st.integers(0, 2**32 - 1),
        st.sampled_from((*DTYPES, np.float64, np.int8, np.int32, np.uint16, np.bool_)),
        st.lists(st.integers(0, 3), max_size=3).map(tuple),
        st.booleans(),
    )  # fmt: skip
    scalars = st.one_of(st.integers(-(2**40), 2**40), st.floats(allow_nan=True), st.text(max_size=5), st.booleans())
    matrices = bst.block_sparse_matrices(dtype=bst.dtypes(DTYPES), max_blocks=3)
    return st.one_of(st.none(), arrays, scalars, matrices)


trees = st.recursive(
    leaves(),
    lambda kids: st.one_of(
        st.lists(kids, max_size=3),
        st.lists(kids, max_size=3).map(tuple),
        st.dictionaries(st.text("abc.", max_size=3), kids, max_size=3),
    ),
    max_leaves=8,
)


@settings(max_examples=examples(40))
@given(tree=trees)
def test_nested_trees_round_trip(tree):
    assert_same(round_trip(tree), tree)


def test_containers_scalars_keys_and_static_values_round_trip():
    W = matrix(0, (32, 16), 8, 0.5)
    tree = collections.OrderedDict(
        # W's pattern is shared by two matrices; dict keys of several kinds
        b=(None, [W, W.T, W], {"n": np.float16(3.5), "one": "1"}, {1: -0.0, 2: 2}, {(2, "x"): ()}),
        a=dict(key=jax.random.key(3), weak=jnp.asarray(0.5), nan=float("nan"), big=2**62, pattern=W.pattern,
               dtype=jnp.dtype(jnp.bfloat16), config=BertConfig(vocab_size=10, hidden_size=8, num_heads=2)),
    )  # fmt: skip
    out = round_trip(tree)
    assert type(out) is collections.OrderedDict and list(out) == ["b", "a"]
    assert_same(out, tree)
    assert out["a"]["weak"].weak_type and out["a"]["config"] == tree["a"]["config"]
    with tempfile.TemporaryDirectory() as d:
        tensors = read_safetensors(bs.save(Path(d) / "t.safetensors", tree))
    assert sum(name.endswith("pattern.rows") for name in tensors) == 2  # W's pattern once, W.T's once


def traces_once(fn, *trees):
    """``fn`` jitted once for the first tree runs on each of the others without tracing again; the outputs."""
    traced = []

    @jax.jit
    def run(tree):
        traced.append(None)
        return fn(tree)

    outs = [run(t) for t in trees]
    assert len(traced) == 1, "traced again for the loaded tree"
    return outs


def test_layers_round_trip_and_compute_the_same():
    x = normal(1, 4, 32)
    layers = {
        "sparse": bs.nn.SparseLinear(matrix(0, (32, 16), (8, 4), 0.5), normal(2, 16), activation="gelu"),
        "no_bias": bs.nn.SparseLinear(matrix(3, (32, 16), 8, 0.25, jnp.bfloat16), None, implementation=("xla",)),
        "dense": bs.nn.Linear(normal(4, 32, 16), normal(5, 16), activation="relu"),
        "gcn": bs.gnn.GCNConv(normal(6, 8, 32), normal(7, 8)),
    }
    out = round_trip(layers)
    assert_same(out, layers)
    assert out["no_bias"].bias is None and out["no_bias"].implementation == ("xla",)
    stack = jax.tree.map(lambda a: np.stack([a, -a]), layers["sparse"])  # a stack of layers (for lax.scan)
    assert_same(round_trip(stack), stack)

    def apply(t):
        g = jnp.array([[0, 1, 2], [1, 2, 3]])
        return t["sparse"](x), t["no_bias"](x), t["dense"](x), t["gcn"](x, g)

    for a, b in zip(*traces_once(apply, layers, out), strict=True):
        np.testing.assert_array_equal(a, b)


def test_equinox_layer_round_trip():
    eqx = pytest.importorskip("equinox")
    layer = bs.nn.equinox.SparseLinear.from_dense(normal(0, 16, 32), normal(1, 16), block_size=8, density=0.5,
                                                  activation="silu")  # fmt: skip
    out = round_trip({"layer": layer})["layer"]
    assert isinstance(out, eqx.Module) and out.in_features == 32 and out.activation == "silu"
    assert_same(out, layer)
    x = normal(2, 3, 32)
    np.testing.assert_array_equal(jax.vmap(out)(x), jax.vmap(layer)(x))


TINY_BERT = BertConfig(vocab_size=40, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                       max_positions=16)  # fmt: skip


def state_dict(shapes: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """Random float32 tensors of these shapes (the models' random constructors compile a program per shape)."""
    rng = np.random.default_rng(seed)
    return {name: (0.2 * rng.standard_normal(shape)).astype(np.float32) for name, shape in shapes.items()}


def bert_shapes(c: BertConfig) -> dict:
    h, f = c.hidden_size, c.intermediate_size
    out = {"embeddings.word_embeddings.weight": (c.vocab_size, h), "embeddings.position_embeddings.weight":
           (c.max_positions, h), "embeddings.token_type_embeddings.weight": (c.type_vocab_size, h)}  # fmt: skip
    projections = {"attention.self.query": (h, h), "attention.self.key": (h, h), "attention.self.value": (h, h),
                   "attention.output.dense": (h, h), "intermediate.dense": (f, h), "output.dense": (h, f)}  # fmt: skip
    norms = ["embeddings.LayerNorm"]
    for i in range(c.num_layers):
        p = f"encoder.layer.{i}."
        out.update({p + n + s: shape if s == ".weight" else shape[:1]
                    for n, shape in projections.items() for s in (".weight", ".bias")})  # fmt: skip
        norms += [p + "attention.output.LayerNorm", p + "output.LayerNorm"]
    return out | {n + s: (h,) for n in norms for s in (".weight", ".bias")}


def test_pruned_bert_encoder_round_trip_gives_identical_embeddings():
    dense = BertEncoder.from_state_dict(state_dict(bert_shapes(TINY_BERT)), TINY_BERT, dtype=jnp.bfloat16)
    model = prune_encoder(dense, 8, 0.5, scope="global", targets=("query", "ffn_in", "ffn_out"))
    out = round_trip(model)
    assert type(out.layers[0].ffn_in) is bs.nn.SparseLinear and type(out.layers[0].key) is bs.nn.Linear
    assert out.dtype == jnp.bfloat16 and out.config == TINY_BERT
    assert_same(out, model)
    ids = np.arange(12, dtype=np.int32).reshape(2, 6) % TINY_BERT.vocab_size
    mask = np.array([[1] * 6, [1] * 4 + [0] * 2], np.int32)
    a, b = traces_once(lambda m: m(ids, mask), model, out)
    np.testing.assert_array_equal(a, b)


TINY_LLAMA = LlamaConfig(vocab_size=64, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2,
                         intermediate_size=64, max_positions=32,
                         rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 16})  # fmt: skip


def llama_shapes(c: LlamaConfig) -> dict:
    h, f, q, kv = c.hidden_size, c.intermediate_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    out = {
        "model.embed_tokens.weight": (c.vocab_size, h),
        "model.norm.weight": (h,),
        "lm_head.weight": (c.vocab_size, h),
    }
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        out.update({p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                    p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
                    p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
                    p + "mlp.gate_proj.weight": (f, h), p + "mlp.up_proj.weight": (f, h),
                    p + "mlp.down_proj.weight": (h, f)})  # fmt: skip
    return out


def test_pruned_llama_decoder_round_trip_gives_identical_logits():
    dense = LlamaModel.from_state_dict(state_dict(llama_shapes(TINY_LLAMA)), TINY_LLAMA)
    model = prune_decoder(dense, 8, 0.5, targets=("q", "o", "gate", "down", "lm_head"))
    out = round_trip(model)
    assert type(out.lm_head) is bs.nn.SparseLinear and out.config == TINY_LLAMA
    assert_same(out, model)
    for name in ("q", "o", "gate", "down"):
        assert getattr(out.layers[0], name).weight.pattern == getattr(model.layers[0], name).weight.pattern
    tokens = np.array([[3, 1, 4, 1, 5, 9]], np.int32)
    a, b = traces_once(lambda m: m(tokens), model, out)
    np.testing.assert_array_equal(a, b)
    abstract = jax.eval_shape(lambda: model)  # the structure alone (what orbax restores into): no tensors
    assert_same(round_trip(abstract), abstract)


def test_save_llama_keeps_bfloat16(tmp_path):
    tensors = state_dict(llama_shapes(TINY_LLAMA), seed=1)
    model = LlamaModel.from_state_dict(tensors, TINY_LLAMA, dtype=jnp.bfloat16)
    written = read_safetensors(save_llama(model, tmp_path) / "model.safetensors")
    assert written.keys() == tensors.keys() and written["model.norm.weight"].dtype == jnp.bfloat16
    np.testing.assert_array_equal(written["model.embed_tokens.weight"], np.asarray(model.embed))


# -- the file, as a reader without JAX sees it ------------------------------------------------------------------------
def test_file_layout_bsr_recipe_and_the_safetensors_package(tmp_path):
    W = matrix(0, (64, 48), (16, 8), 0.3, jnp.bfloat16)
    path = bs.save(tmp_path / "w.safetensors", {"proj": {"weight": W}})
    tensors, metadata = _safetensors.read(path)
    header = json.loads(metadata["blocksparse"])
    assert header["format"] == "blocksparse.checkpoint" and header["version"] == bs._checkpoint.VERSION
    assert sorted(tensors) == ["proj.weight.data", "proj.weight.pattern.cols", "proj.weight.pattern.rows"]
    (entry,) = header["matrices"]
    p = header["patterns"][entry["pattern"]]
    assert entry["data"] == "proj.weight.data" and p["shape"] == [64, 48] and p["block_size"] == [16, 8]
    # docs/checkpoints.md's recipe for torch.sparse_bsr_tensor, in NumPy, checked by scipy's BSR (the same layout):
    # crow_indices from the block rows, col_indices the block columns; the transpose by sorting on (col, row).
    sparse = pytest.importorskip("scipy.sparse")
    rows, cols, values = tensors[p["rows"]], tensors[p["cols"]], tensors[entry["data"]].astype(np.float32)
    assert rows.dtype == cols.dtype == np.int32 and values.shape == (W.nnz_blocks, 16, 8)
    (gm, gk), (bh, bw) = W.pattern.grid, p["block_size"]
    crow = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=gm))])
    expected = np.asarray(W.to_dense(), np.float32)
    bsr = sparse.bsr_array((values, cols, crow), shape=p["shape"], blocksize=(bh, bw))
    np.testing.assert_array_equal(bsr.toarray(), expected)
    order = np.argsort(cols.astype(np.int64) * gm + rows, kind="stable")
    t_crow = np.concatenate([[0], np.cumsum(np.bincount(cols, minlength=gk))])
    t_values = values[order].transpose(0, 2, 1)
    t_bsr = sparse.bsr_array((t_values, rows[order], t_crow), shape=p["shape"][::-1], blocksize=(bw, bh))
    np.testing.assert_array_equal(t_bsr.toarray(), expected.T)
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    loaded = safetensors_numpy.load_file(path)  # the reference reader accepts the file, bfloat16 included
    np.testing.assert_array_equal(loaded["proj.weight.data"], values)


# -- user types -----------------------------------------------------------------------------------------------------
@functools.partial(jax.tree_util.register_dataclass, data_fields=["w", "sub"], meta_fields=["scale", "tag"])
@dataclasses.dataclass(frozen=True)
class Block:
    w: jax.Array
    sub: object
    scale: float
    tag: tuple


Pair = collections.namedtuple("Pair", "left right")


class Opaque:
    """A pytree whose state is not dataclass fields: registered with flatten / unflatten."""

    def __init__(self, a, name):
        self.a, self.name = a, name


jax.tree_util.register_pytree_node(Opaque, lambda o: ((o.a,), o.name), lambda name, kids: Opaque(kids[0], name))


def test_user_types_register_once_and_round_trip():
    W = matrix(0, (16, 16), 4, 0.5)
    tree = Block(np.ones(3), Pair(W, Opaque(np.zeros(2), "x")), 0.5, ("a", 1))
    with pytest.raises(TypeError, match=r"tests?\.?.*Block.*bs\.register_checkpoint_type\(Block"):
        round_trip(tree)
    bs.register_checkpoint_type(Block, "tests.Block")
    bs.register_checkpoint_type(Block, "tests.Block")  # again: a no-op
    bs.register_checkpoint_type(Pair, "tests.Pair")
    with pytest.raises(TypeError, match="Opaque.*not registered"):
        round_trip(tree)
    with pytest.raises(TypeError, match="neither|Expected a dataclass, a namedtuple"):
        bs.register_checkpoint_type(Opaque, "tests.Opaque")
    bs.register_checkpoint_type(Opaque, "tests.Opaque", flatten=lambda o: ({"a": o.a}, {"name": o.name}),
                                unflatten=lambda kids, static: Opaque(kids["a"], static["name"]))  # fmt: skip
    out = round_trip(tree)
    assert type(out.sub) is Pair and out.sub.right.name == "x" and out.tag == ("a", 1)
    assert_same(out, tree)
    with pytest.raises(ValueError, match="'tests.Block', taken by .*Block"):
        bs.register_checkpoint_type(Pair, "tests.Block")
    with pytest.raises(ValueError, match="registered for checkpoints as 'tests.Pair'. Got a second name 'tests.P2'"):
        bs.register_checkpoint_type(Pair, "tests.P2")
    with pytest.raises(TypeError, match="both flatten= and unflatten="):
        bs.register_checkpoint_type(Opaque, "tests.Opaque", flatten=lambda o: o)
    with pytest.raises(ValueError, match="outside 'blocksparse.'"):
        bs.register_checkpoint_type(collections.namedtuple("Q", "a"), "blocksparse.Q")


def test_a_type_that_does_not_come_back_from_its_fields_is_refused_before_writing(tmp_path):
    @dataclasses.dataclass
    class Unkeyed:
        a: jax.Array

    @dataclasses.dataclass
    class Lossy:
        a: jax.Array

    jax.tree_util.register_pytree_node(Unkeyed, lambda o: ((o.a,), None), lambda _, kids: Unkeyed(*kids))
    jax.tree_util.register_pytree_with_keys(  # the aux data (an id) is not in the fields
        Lossy, lambda o: (((jax.tree_util.GetAttrKey("a"), o.a),), id(o)), lambda _, kids: Lossy(*kids))  # fmt: skip
    bs.register_checkpoint_type(Unkeyed, "tests.Unkeyed")
    bs.register_checkpoint_type(Lossy, "tests.Lossy")
    with pytest.raises(TypeError, match=r"children of 'tests.Unkeyed' are not its dataclass fields .* flatten="):
        bs.save(tmp_path / "u.safetensors", [Unkeyed(np.ones(2))])
    with pytest.raises(TypeError, match="the tests.Lossy at 'x' does not come back from its fields"):
        bs.save(tmp_path / "l.safetensors", {"x": Lossy(np.ones(2))})
    assert not list(tmp_path.iterdir())  # nothing written


def test_unsupported_values_are_refused_by_name(tmp_path):
    f = tmp_path / "f.safetensors"
    graph = bs.gnn.Graph.from_edges(np.array([0, 1]), np.array([1, 2]), 3)
    with pytest.raises(TypeError, match=r"Graph at 'g': this library type has no checkpoint form"):
        bs.save(f, {"g": graph})
    with pytest.raises(TypeError, match=r"leaf .* of type builtins.object at 'a.0'"):
        bs.save(f, {"a": [object()]})
    with pytest.raises(TypeError, match=r"at 'c'.*complex64"):
        bs.save(f, {"c": np.zeros(2, np.complex64)})
    with pytest.raises(TypeError, match=r"static value .* builtins.set"):
        bs.save(f, bs.nn.Linear(np.ones((2, 2)), None)._replace(activation={1}))
    with pytest.raises(TypeError, match="traced value at 'w'.*outside jit"):
        jax.jit(lambda w: bs.save(f, {"w": w}))(jnp.ones(2))
    with pytest.raises(TypeError, match="weakly typed"):
        bs.save(f, jnp.full((2,), 1.5))
    sharded = jax.ShapeDtypeStruct((2,), jnp.float32, sharding=jax.sharding.SingleDeviceSharding(jax.devices()[0]))
    with pytest.raises(TypeError, match="ShapeDtypeStruct at the root of the tree has a sharding"):
        bs.save(f, sharded)
    assert not f.exists()


# -- bad files --------------------------------------------------------------------------------------------------------
@pytest.fixture
def saved(tmp_path):
    W = bs.BlockSparseMatrix.from_mask(np.eye(4, dtype=bool) | np.eye(4, k=1, dtype=bool),
                                       jnp.arange(256.0).reshape(16, 16), 4)  # fmt: skip
    return bs.save(tmp_path / "w.safetensors", {"W": W, "b": jnp.ones(3)}), W


def rewrite(path, header=None, **tensors):
    """Write ``path`` again with the header changed by ``header(doc)`` and tensors replaced (``None`` drops one)."""
    old, metadata = _safetensors.read(path)
    doc = json.loads(metadata["blocksparse"])
    if header is not None:
        header(doc)
    new = {k: np.array(v) for k, v in old.items()}
    for name, value in tensors.items():
        name = name.replace("__", ".")
        if value is None:
            del new[name]
        else:
            new[name] = value
    _safetensors.write(path, new, {"blocksparse": json.dumps(doc)})
    return path


def node(doc, i):
    """The header node of the fixture's ``i``-th entry (0: ``W``, 1: ``b``)."""
    return doc["tree"]["items"][i][1]


def int32(*values):
    return np.array(values, np.int32)


TAMPERED = {  # what changes -> the error and the message it must carry
    "newer version": (dict(header=lambda d: d.update(version=7)), ValueError,
                      r"version 1, the one this library reads. Got 7 \(written by a newer"),
    "other format": (dict(header=lambda d: d.update(format="other")), ValueError,
                     "expected format 'blocksparse.checkpoint'"),
    "index out of range": (dict(W__pattern__rows=int32(0, 0, 1, 2, 3, 9, 3)), ValueError,
                           r"pattern 0 \(tensors 'W.pattern.rows', 'W.pattern.cols'\): "
                           r"Expected block rows in \[0, 4\). Got 9"),
    "duplicate block": (dict(W__pattern__cols=int32(0, 0, 1, 2, 2, 3, 3)), ValueError,
                        r"pattern 0 .*Got block \(0, 0\) more than once"),
    "unsorted blocks": (dict(W__pattern__cols=int32(1, 0, 1, 2, 2, 3, 3)), ValueError,
                        r"row-major order.*Got block \(0, 1\) at position 0, where \(0, 0\) belongs"),
    "another pattern": (dict(W__pattern__cols=int32(0, 2, 1, 2, 2, 3, 3)), ValueError,
                        r"expected the fingerprint [0-9a-f]+ \(the header's\). Got [0-9a-f]+"),
    "int64 indices": (dict(W__pattern__rows=np.arange(7, dtype=np.int64)), ValueError,
                      r"tensor 'W.pattern.rows' \(patterns\[0\].rows\): expected int32 \[7\]. Got int64 \[7\]"),
    "missing tensor": (dict(W__data=None), ValueError,
                       r"missing tensor 'W.data': expected float32 \[7, 4, 4\] for 'W.data'"),
    "wrong shape": (dict(W__data=np.zeros((6, 4, 4), np.float32)), ValueError,
                    r"tensor 'W.data' \('W.data'\): expected float32 \[7, 4, 4\]. Got float32 \[6, 4, 4\]"),
    "wrong dtype": (dict(b=np.ones(3, np.float16)), ValueError,
                    r"tensor 'b' \('b'\): expected float32 \[3\]. Got float16 \[3\]"),
    "extra tensor": (dict(extra=np.ones(1)), ValueError, r"only the tensors its header names. Got 1 more: \['extra'\]"),
    "blocks unlike the pattern": (
        dict(header=lambda d: node(d, 0)["children"]["data"].update(shape=[7, 4, 2]),
             W__data=np.zeros((7, 4, 2), np.float32)),
        ValueError, r"W.data: expected block values of shape \(..., 7, 4, 4\) \(7 blocks of 4 x 4, the pattern's\). "
        r"Got \(7, 4, 2\)"),
    "unknown type": (dict(header=lambda d: node(d, 0).update(type="blocksparse.Nope")), TypeError,
                     r"'W' holds a 'blocksparse.Nope', a type not registered"),
    "missing field": (dict(header=lambda d: node(d, 0)["static"].clear()), ValueError,
                      r"'W': expected children \['data'\] and static \['pattern'\] for a "
                      r"blocksparse.BlockSparseMatrix. Got children \['data'\] and static \[\]"),
    "unknown kind": (dict(header=lambda d: node(d, 1).update(kind="blob")), ValueError,
                     r"header: 'b': expected a node object whose kind"),
    "unknown dtype": (dict(header=lambda d: node(d, 1).update(dtype="float99")), ValueError,
                      r"'b'.dtype: expected a dtype name among"),
    "bad pattern shape": (dict(header=lambda d: d["patterns"][0].update(shape=[16])), ValueError,
                          r"patterns\[0\].shape: expected a list of 2 non-negative ints. Got \[16\]"),
    "stale index": (dict(header=lambda d: d.update(matrices=[])), ValueError,
                    r"expected the matrices index \[\{'data': 'W.data', 'pattern': 0\}\]"),
}  # fmt: skip


@pytest.mark.parametrize("case", TAMPERED)
def test_tampered_files_name_the_tensor_or_field(saved, case):
    change, error, message = TAMPERED[case]
    path, _ = saved
    with pytest.raises(error, match=message):
        bs.load(rewrite(path, **change))


def test_corrupt_and_foreign_files_and_paths(saved, tmp_path):
    path, W = saved
    assert bs.load(path)["W"].pattern == W.pattern
    tensors, metadata = _safetensors.read(path)
    _safetensors.write(path, dict(tensors), {"blocksparse": "{not json"})
    with pytest.raises(ValueError, match=r"header: expected JSON in __metadata__\['blocksparse'\]. It is corrupt"):
        bs.load(path)
    plain = _safetensors.write(tmp_path / "plain.safetensors", {"x": np.ones(2)})
    with pytest.raises(ValueError, match=r"expected a blocksparse checkpoint .* Got metadata keys \[\]"):
        bs.load(plain)
    (tmp_path / "junk").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{garbage")
    with pytest.raises(ValueError, match="header is corrupt"):
        bs.load(tmp_path / "junk")
    (tmp_path / "short").write_bytes(b"\x01")
    with pytest.raises(ValueError, match=r"an 8-byte header length first\). Got 1 bytes"):
        bs.load(tmp_path / "short")
    header = json.dumps({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    (tmp_path / "cut").write_bytes(len(header).to_bytes(8, "little") + header + b"\x00" * 8)
    with pytest.raises(ValueError, match=r"tensor 'x' \(F32 \[4\]\) does not fit its byte range: expected 16 bytes"):
        bs.load(tmp_path / "cut")
    with pytest.raises(IsADirectoryError, match="Got a directory"):
        bs.load(tmp_path)
    with pytest.raises(IsADirectoryError, match="Got a directory"):
        bs.save(tmp_path, W)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        bs.load(tmp_path / "missing.safetensors")
    with pytest.raises(FileNotFoundError, match="expected an existing directory"):
        bs.save(tmp_path / "no" / "dir.safetensors", W)
