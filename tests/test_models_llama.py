"""The Llama decoder on a tiny checkpoint the tests write: the loader, logits against a float64 NumPy forward,
the KV cache against full recomputation, generation in one program (no recompilation per token), pruning,
and the refusals of bad input."""

from __future__ import annotations

import json
import math
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import blocksparse as bs
from blocksparse.models import (
    LlamaConfig,
    _llama,
    densified,
    generate,
    load_llama,
    prune_decoder,
    read_safetensors,
    save_llama,
)

safetensors_numpy = pytest.importorskip("safetensors.numpy")  # the tests write checkpoints with it

HF = dict(model_type="llama", vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
          num_key_value_heads=2, intermediate_size=48, max_position_embeddings=64, rms_norm_eps=1e-6,
          rope_theta=10000.0, rope_scaling=None, tie_word_embeddings=False, hidden_act="silu")  # fmt: skip
LLAMA3 = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
              original_max_position_embeddings=16)  # fmt: skip


def random_tensors(cfg: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """A random ``LlamaForCausalLM`` state dict (PyTorch names, ``(out, in)``), float32."""
    rng = np.random.default_rng(seed)
    h, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    nh, nk = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or h // nh

    def w(*shape, scale=0.2):
        return (scale * rng.standard_normal(shape)).astype(np.float32)

    t = {"model.embed_tokens.weight": w(v, h, scale=1.0), "model.norm.weight": 1 + w(h, scale=0.1)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t.update({
            p + "input_layernorm.weight": 1 + w(h, scale=0.1),
            p + "post_attention_layernorm.weight": 1 + w(h, scale=0.1),
            p + "self_attn.q_proj.weight": w(nh * d, h), p + "self_attn.k_proj.weight": w(nk * d, h),
            p + "self_attn.v_proj.weight": w(nk * d, h), p + "self_attn.o_proj.weight": w(h, nh * d),
            p + "mlp.gate_proj.weight": w(f, h), p + "mlp.up_proj.weight": w(f, h), p + "mlp.down_proj.weight": w(h, f),
        })  # fmt: skip
    if not cfg.get("tie_word_embeddings"):
        t["lm_head.weight"] = w(v, h)
    return t


def write_checkpoint(path, cfg: dict, tensors: dict, shards: int = 1):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    if shards == 1:
        safetensors_numpy.save_file(tensors, str(path / "model.safetensors"))
        return path
    names = sorted(tensors)
    weight_map = {}
    for s in range(shards):
        shard = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[s::shards]}
        safetensors_numpy.save_file(part, str(path / shard))
        weight_map.update(dict.fromkeys(part, shard))
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return path


# -- the independent float64 forward ----------------------------------------------------------------------
def np_inv_freq(cfg: dict) -> np.ndarray:
    d = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    inv = 1.0 / (cfg["rope_theta"] ** (np.arange(0, d, 2) / d))
    s = cfg.get("rope_scaling")
    if not s:
        return inv
    if s.get("rope_type", s.get("type")) == "linear":
        return inv / s["factor"]
    # Hugging Face's _compute_llama3_parameters, written out again
    low_wl = s["original_max_position_embeddings"] / s["low_freq_factor"]
    high_wl = s["original_max_position_embeddings"] / s["high_freq_factor"]
    out = []
    for f in inv:
        wl = 2 * math.pi / f
        if wl < high_wl:
            out.append(f)
        elif wl > low_wl:
            out.append(f / s["factor"])
        else:
            sm = (s["original_max_position_embeddings"] / wl - s["low_freq_factor"]) / (
                s["high_freq_factor"] - s["low_freq_factor"])  # fmt: skip
            out.append((1 - sm) * f / s["factor"] + sm * f)
    return np.asarray(out)


def np_forward(t: dict, cfg: dict, ids: np.ndarray) -> np.ndarray:
    """``LlamaForCausalLM``'s logits in float64, from the state dict, with no KV cache."""
    t = {k: np.asarray(v, np.float64) for k, v in t.items()}
    nh, nk, eps = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["rms_norm_eps"]
    d = cfg.get("head_dim") or cfg["hidden_size"] // nh
    b, n = ids.shape

    def rms(x, w):
        return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * w

    ang = np.arange(n)[:, None] * np_inv_freq(cfg)[None]  # (n, d/2)
    cos, sin = np.cos(ang), np.sin(ang)

    def rope(x):  # (b, n, heads, d), pairs (i, i + d/2)
        x1, x2 = x[..., : d // 2], x[..., d // 2 :]
        c, s = cos[None, :, None], sin[None, :, None]
        return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], -1)

    x = t["model.embed_tokens.weight"][ids]
    causal = np.tril(np.ones((n, n), bool))
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms(x, t[p + "input_layernorm.weight"])
        q = rope((h @ t[p + "self_attn.q_proj.weight"].T).reshape(b, n, nh, d))
        k = rope((h @ t[p + "self_attn.k_proj.weight"].T).reshape(b, n, nk, d))
        v = (h @ t[p + "self_attn.v_proj.weight"].T).reshape(b, n, nk, d)
        k, v = np.repeat(k, nh // nk, axis=2), np.repeat(v, nh // nk, axis=2)
        s = np.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(d)
        s = np.where(causal, s, -np.inf)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        ctx = np.einsum("bhqk,bkhd->bqhd", a, v).reshape(b, n, nh * d)
        x = x + ctx @ t[p + "self_attn.o_proj.weight"].T
        h = rms(x, t[p + "post_attention_layernorm.weight"])
        g = h @ t[p + "mlp.gate_proj.weight"].T
        x = x + ((g / (1 + np.exp(-g))) * (h @ t[p + "mlp.up_proj.weight"].T)) @ t[p + "mlp.down_proj.weight"].T
    head = t["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else t["lm_head.weight"]
    return rms(x, t["model.norm.weight"]) @ head.T


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    tensors = random_tensors(HF)
    path = write_checkpoint(tmp_path_factory.mktemp("llama"), HF, tensors)
    return dict(path=path, tensors=tensors, model=load_llama(path))


IDS = np.random.default_rng(1).integers(0, HF["vocab_size"], (2, 7)).astype(np.int32)


# -- the forward pass and the loader ------------------------------------------------------------------
def test_logits_match_the_float64_numpy_forward(ckpt):
    got = ckpt["model"](IDS)
    assert got.shape == (2, 7, HF["vocab_size"]) and got.dtype == jnp.float32
    assert rel(got, np_forward(ckpt["tensors"], HF, IDS)) < 1e-5


@pytest.mark.parametrize("variant", ["tied", "llama3", "linear", "head_dim"])
def test_config_variants_match_numpy(tmp_path, variant):
    cfg = dict(HF)
    if variant == "tied":
        cfg["tie_word_embeddings"] = True
    elif variant == "llama3":
        cfg["rope_scaling"] = LLAMA3
    elif variant == "linear":
        cfg["rope_scaling"] = {"type": "linear", "factor": 4.0}  # the older key
    else:
        cfg.update(head_dim=16, num_key_value_heads=1)  # head_dim given, not hidden / heads; one KV head
    tensors = random_tensors(cfg, seed=2)
    model = load_llama(write_checkpoint(tmp_path, cfg, tensors))
    assert (model.lm_head is None) == (variant == "tied")
    ids = IDS[:, :5]
    assert rel(model(ids), np_forward(tensors, cfg, ids)) < 1e-5


def test_transformers_5_rope_parameters_are_read():
    cfg = dict(HF, rope_parameters=dict(LLAMA3, rope_theta=500000.0))
    del cfg["rope_theta"], cfg["rope_scaling"]
    c = LlamaConfig.from_hf(cfg)
    assert c.rope_theta == 500000.0 and c.rope_type == "llama3"
    assert LlamaConfig.from_hf(c.to_hf()) == c  # what check_llama hands to transformers reads back the same
    np.testing.assert_allclose(_llama.inverse_frequencies(c), np_inv_freq(dict(cfg, rope_theta=5e5,
                                                                               rope_scaling=LLAMA3)))  # fmt: skip
    assert LlamaConfig.from_hf(dict(HF, rope_scaling={"rope_type": "default"})).rope_scaling is None


def test_sharded_checkpoint_loads_the_same(ckpt, tmp_path):
    path = write_checkpoint(tmp_path, HF, ckpt["tensors"], shards=3)
    assert len(list(path.glob("model-*-of-00003.safetensors"))) == 3
    np.testing.assert_array_equal(load_llama(path)(IDS), ckpt["model"](IDS))


def test_bfloat16_checkpoint_and_save_round_trip(ckpt, tmp_path):
    safetensors_flax = pytest.importorskip("safetensors.flax")
    path = tmp_path / "bf16"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(HF))
    bf = {k: jnp.asarray(v, jnp.bfloat16) for k, v in ckpt["tensors"].items()}
    safetensors_flax.save_file(bf, str(path / "model.safetensors"))
    assert read_safetensors(path / "model.safetensors")["model.norm.weight"].dtype == jnp.bfloat16
    m = load_llama(path, dtype=jnp.bfloat16)
    assert m.dtype == jnp.bfloat16 and m.embed.dtype == jnp.bfloat16
    rounded = {k: np.asarray(v.astype(jnp.float32)) for k, v in bf.items()}
    assert rel(m(IDS), np_forward(rounded, HF, IDS)) < 0.05  # bf16 compute
    again = load_llama(save_llama(ckpt["model"], tmp_path / "saved"))
    np.testing.assert_array_equal(again(IDS), ckpt["model"](IDS))


# -- the cache and generation ---------------------------------------------------------------------------
def test_kv_cache_decoding_equals_full_recomputation(ckpt):
    m = ckpt["model"]
    full = np.asarray(m(IDS))
    cache = m.init_cache(2, 16)
    logits, cache = m.step(jnp.asarray(IDS[:, :4]), cache, 0)
    np.testing.assert_allclose(logits, full[:, :4], rtol=1e-5, atol=1e-5)
    step = jax.jit(lambda m, t, c, s: m.step(t, c, s))
    for j in range(4, 7):
        logits, cache = step(m, jnp.asarray(IDS[:, j : j + 1]), cache, jnp.int32(j))
        np.testing.assert_allclose(logits[:, 0], full[:, j], rtol=1e-5, atol=1e-5)


def test_greedy_generation_is_the_argmax_of_recomputed_logits(ckpt):
    m = ckpt["model"]
    out = np.asarray(generate(m, IDS, 6))
    assert out.shape == (2, 6) and out.dtype == np.int32
    seq = np.concatenate([IDS, out], 1)
    want = np.argmax(np_forward(ckpt["tensors"], HF, seq)[:, IDS.shape[1] - 1 : -1], -1)
    np.testing.assert_array_equal(out, want)


def test_prompts_of_different_lengths_are_left_padded_and_decode_as_alone(ckpt):
    m = ckpt["model"]
    short = [5, 17, 3]
    both = np.asarray(generate(m, [short, list(IDS[1])], 6))
    np.testing.assert_array_equal(both[0], generate(m, [short], 6)[0])
    greedy = np.asarray(generate(m, IDS, 6))  # the greedy test's program: IDS[1] unpadded
    np.testing.assert_array_equal(both[1], greedy[1])


def test_sampling_top_k_and_eos(ckpt):
    m = ckpt["model"]
    greedy = np.asarray(generate(m, IDS, 6))  # the program of the greedy test (one compilation fewer)
    np.testing.assert_array_equal(generate(m, IDS, 6, temperature=0.7, top_k=1, key=jax.random.key(3)), greedy)
    a = np.asarray(generate(m, IDS, 6, temperature=1.5, top_k=4, key=jax.random.key(4)))
    logits = np_forward(ckpt["tensors"], HF, np.concatenate([IDS, a], 1))[:, IDS.shape[1] - 1 : -1]
    top4 = np.argsort(-logits, -1)[..., :4]
    assert all(a[i, j] in top4[i, j] for i in range(2) for j in range(6))  # every sample within the top 4
    np.testing.assert_array_equal(a, generate(m, IDS, 6, temperature=1.5, top_k=4, key=jax.random.key(4)))
    eos = int(greedy[0, 1])
    e = np.asarray(generate(m, IDS, 6, eos_token_id=eos))
    assert (e[0, 1:] == eos).all() and e[0, 0] == greedy[0, 0]


def test_generation_is_one_program_not_recompiled_per_token(ckpt, monkeypatch):
    traces = []
    real = _llama._decode_step

    def counting(*args):
        traces.append(1)
        return real(*args)

    monkeypatch.setattr(_llama, "_decode_step", counting)
    m = ckpt["model"]
    before = _llama._generate._cache_size()
    a = generate(m, IDS, 11, temperature=1.0, key=jax.random.key(0))  # 11 new tokens: a shape no other test uses
    b = generate(m, IDS[::-1], 11, temperature=0.5, key=jax.random.key(1))  # new prompts, a new temperature
    assert len(traces) == 1, f"the decode step was traced {len(traces)} times for 2 x 11 tokens"
    assert _llama._generate._cache_size() == before + 1
    assert a.shape == b.shape == (2, 11)


# -- pruning --------------------------------------------------------------------------------------------
def test_pruned_model_equals_the_dense_model_of_its_weights(ckpt):
    m = ckpt["model"]
    p = prune_decoder(m, 8, 0.5, targets=(*_llama.DECODER_PROJECTIONS, "lm_head"))
    assert all(isinstance(getattr(L, n), bs.nn.SparseLinear) for L in p.layers for n in _llama.DECODER_PROJECTIONS)
    assert isinstance(p.lm_head, bs.nn.SparseLinear) and p.layers[0].gate.activation == "silu"
    assert _llama.block_density(p) == pytest.approx(0.5)
    d = densified(p)
    np.testing.assert_allclose(p(IDS), d(IDS), rtol=1e-5, atol=1e-5)
    assert rel(p(IDS), np_forward(d.state_dict(), HF, IDS)) < 1e-5  # (pruned generation: the decode suite's cells)
    g = prune_decoder(m, 8, 0.25, scope="global", targets=("gate", "up"))
    assert isinstance(g.layers[1].up, bs.nn.SparseLinear) and isinstance(g.layers[1].down, bs.nn.Linear)
    assert _llama.block_density(g) == pytest.approx(0.25, abs=0.01)


@pytest.mark.parametrize("balance", ["cols", "rows"])
def test_balanced_pruning_keeps_equal_walks_and_fuses_to_them(ckpt, balance):
    m = ckpt["model"]
    p = prune_decoder(m, 8, 0.5, balance=balance)
    for L in p.layers:
        for name in _llama.DECODER_PROJECTIONS:
            W = getattr(L, name).weight
            mask = W.pattern.mask()
            counts = mask.sum(axis=0 if balance == "cols" else 1)  # the weight is (in, out): x @ W walks columns
            assert (counts == round(0.5 * mask.shape[0 if balance == "cols" else 1])).all(), (name, counts)
    np.testing.assert_allclose(p(IDS), densified(p)(IDS), rtol=1e-5, atol=1e-5)
    if balance == "cols":  # q, k, v (and gate, up) share the input: fused, every column still keeps as many blocks
        fused = _llama.fuse_projections(p)
        counts = fused.layers[0].qkv.weight.pattern.mask().sum(axis=0)
        assert len(set(counts.tolist())) == 1
    with pytest.raises(ValueError, match="balance"):
        prune_decoder(m, 8, 0.5, balance="diagonal")
    g = prune_decoder(m, 8, 0.5, scope="global", targets=("gate", "up"), balance=balance)  # ranked together
    for L in g.layers:
        for name in ("gate", "up"):
            mask = getattr(L, name).weight.pattern.mask()
            assert len(set(mask.sum(axis=0 if balance == "cols" else 1).tolist())) == 1, name


@pytest.mark.slow
def test_fused_projections_give_the_same_model_with_fewer_products(ckpt, tmp_path):
    m = ckpt["model"]
    pruned = prune_decoder(m, 8, 0.5)
    for model in (m, pruned):
        fused = _llama.fuse_projections(model)
        for L in fused.layers:
            assert L.q is None and L.k is None and L.v is None and L.gate is None and L.up is None
            assert type(L.qkv) is type(model.layers[0].q) and L.gate_up.activation is None
        np.testing.assert_allclose(fused(IDS), model(IDS), rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(generate(fused, IDS, 4), generate(model, IDS, 4))
        want = model.state_dict()
        got = fused.state_dict()
        assert got.keys() == want.keys() and all(np.array_equal(got[k], want[k]) for k in want)
        assert _llama.block_density(fused) == pytest.approx(_llama.block_density(model))
        np.testing.assert_allclose(densified(fused)(IDS), model(IDS), rtol=1e-5, atol=1e-5)
    fused = _llama.fuse_projections(pruned)
    loaded = bs.load(bs.save(tmp_path / "fused.safetensors", fused))  # a checkpoint keeps it fused
    assert loaded.layers[0].q is None and loaded.layers[0].qkv.weight.pattern == fused.layers[0].qkv.weight.pattern
    np.testing.assert_array_equal(loaded(IDS), fused(IDS))
    with bs.dispatch_log() as log:
        jax.jit(lambda model, ids: model(ids))(fused, IDS)
    assert len(log) == 4 * HF["num_hidden_layers"]  # qkv, o, gate_up, down: four products a layer, not seven
    with pytest.raises(ValueError, match=r"layers\[0\].qkv fused; prune first"):
        prune_decoder(_llama.fuse_projections(m), 8, 0.5)
    mixed = _llama.fuse_projections(prune_decoder(m, 8, 0.5, targets=("q", "gate", "up")))
    assert mixed.layers[0].qkv is None and isinstance(mixed.layers[0].q, bs.nn.SparseLinear)  # mixed: as it was
    assert isinstance(mixed.layers[0].gate_up, bs.nn.SparseLinear)
    np.testing.assert_allclose(mixed(IDS), prune_decoder(m, 8, 0.5, targets=("q", "gate", "up"))(IDS), rtol=1e-5,
                               atol=1e-5)  # fmt: skip


# -- bad input ------------------------------------------------------------------------------------------
def test_missing_or_misshaped_tensor_is_named(ckpt, tmp_path):
    t = dict(ckpt["tensors"])
    del t["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(ValueError, match=r"'model.layers.1.mlp.up_proj.weight' of shape \(48, 32\). It is missing"):
        load_llama(write_checkpoint(tmp_path / "a", HF, t))
    t = dict(ckpt["tensors"], **{"model.layers.0.self_attn.k_proj.weight": np.zeros((32, 32), np.float32)})
    with pytest.raises(
        ValueError, match=r"'model.layers.0.self_attn.k_proj.weight' of shape \(16, 32\). Got \(32, 32\)"
    ):
        load_llama(write_checkpoint(tmp_path / "b", HF, t))
    t = dict(ckpt["tensors"])
    del t["lm_head.weight"]
    with pytest.raises(ValueError, match="'lm_head.weight'"):
        load_llama(write_checkpoint(tmp_path / "c", HF, t))
    with pytest.raises(FileNotFoundError, match="model.safetensors or model.safetensors.index.json"):
        (tmp_path / "d").mkdir()
        (tmp_path / "d" / "config.json").write_text(json.dumps(HF))
        load_llama(tmp_path / "d")


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}), "rope_scaling type 'yarn' is not implemented"),
        (dict(rope_scaling={"type": "dynamic", "factor": 2.0}), "rope_scaling type 'dynamic' is not implemented"),
        (dict(rope_scaling={"rope_type": "llama3", "factor": 8.0}), "expects the keys"),
        (dict(model_type="mistral"), "expected model_type='llama'"),
        (dict(hidden_act="gelu"), "expected hidden_act='silu'"),
        (dict(attention_bias=True), "attention_bias=true is not implemented"),
        (dict(num_key_value_heads=3), "num_heads divisible by num_kv_heads"),
    ],
)
def test_unimplemented_config_fields_are_refused_by_name(change, message):
    with pytest.raises(ValueError, match=message):
        LlamaConfig.from_hf(dict(HF, **change))


def test_prompt_plus_new_tokens_longer_than_the_cache_is_refused_before_generating(ckpt, monkeypatch):
    monkeypatch.setattr(_llama, "_generate", None)  # nothing may run
    m = ckpt["model"]
    with pytest.raises(ValueError, match=r"prompt \(7 tokens\) plus max_new_tokens \(10\) needs 17 .* holds 12"):
        generate(m, IDS, 10, cache_size=12)
    with pytest.raises(ValueError, match=r"max_position_embeddings \(64\). Got 67"):
        generate(m, IDS, 60)
    with pytest.raises(ValueError, match="needs a key"):
        generate(m, IDS, 2, temperature=1.0)
    with pytest.raises(ValueError, match="top_k <= vocab_size"):
        generate(m, IDS, 2, top_k=1000)
    with pytest.raises(ValueError, match="Expected targets among"):
        prune_decoder(m, 8, 0.5, targets=("qkv",))


# -- the bench suite and the GPU script -----------------------------------------------------------------
def test_check_llama_script_skips_its_cells_without_torch(tmp_path, monkeypatch):
    import bench_scripts

    monkeypatch.setitem(sys.modules, "torch", None)
    script = bench_scripts.load("check_llama")
    if sys.modules["peers"].torch_problem() is None:  # torch on CUDA was found (and cached) before
        pytest.skip("torch with a GPU is available: the script's cells would run for real")
    out = tmp_path / "check.json"
    assert script.main(["--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["meta"]["script"] == "benchmarks/check_llama.py"
    assert doc["results"] and all(r["ok"] and r["skipped"] for r in doc["results"])


def _run_checked(cell) -> dict:
    from blocksparse.bench import Timer, run_cell

    r = run_cell(cell, Timer(iters=1, trials=1, warmup=0))
    assert r.ok and not r.skipped, (cell.label, r.error)
    assert r.metrics["loop_ms"] > 0 and r.metrics["calls_ms"] > 0 and r.metrics["implementation"]
    return r.metrics


def test_decode_suite_lists_its_cells_and_runs_a_product_checked():
    from blocksparse.bench import decode

    cells = decode.suite(**decode.SIZES["tiny"])
    assert {c.params["kind"] for c in cells} == {"product", "layers", "generate_steps", "generate"}
    assert all("[random weights]" in c.label for c in cells if c.params["kind"].startswith("generate"))
    assert set(decode.SIZES) == {"tiny", "quick", "full"} and len(decode.cells(full=False)) <= 16
    full = decode.cells(full=True)
    assert len({c.label for c in full}) == len(full) > len(decode.cells(full=False))
    json.dumps([c.params for c in full])
    m = _run_checked(cells[0])
    assert m["rel_err"] < 1e-4 and m["dense_loop_ms"] > 0 and m["speedup_vs_dense"] > 0 and m["kept_gbs"] > 0
    # SwiGLU's down projection on the gate/up output: input_glu against dense and the gate in XLA first
    (gated,) = [c for c in cells if c.params.get("op") == "glu x @ W"]
    m = _run_checked(gated)
    assert m["rel_err"] < 1e-4 and m["gate_first_rel_err"] < 1e-4 and m["gate_first_loop_ms"] > 0


def test_decode_suite_layers_cell_checks_every_product_of_the_sequence():
    from blocksparse.bench import decode

    (cell,) = [c for c in decode.suite(**decode.SIZES["tiny"]) if c.params["kind"] == "layers"]
    assert cell.params["count"] == 2 and cell.label.startswith("layers 2 x x (2, 128)")
    m = _run_checked(cell)
    assert m["rel_err"] < 1e-4 and m["dense_rel_err"] < 1e-4 and m["dense_loop_ms"] > 0 and m["speedup_vs_dense"] > 0
    assert m["balanced_rel_err"] < 1e-4 and m["balanced_loop_ms"] > 0  # column-balanced patterns, checked
    if jax.default_backend() == "gpu":  # per product, from a trace; the variants checked and timed
        assert m["kernel_us"] > 0 and m["busy_us"] >= m["kernel_us"] and m["group1_rel_err"] < 1e-4
        assert m["balanced_kernel_us"] > 0 and m["ordered_rel_err"] < 1e-4 and m["ordered_kernel_us"] > 0
    else:  # the variants need the Triton kernels on a GPU: skipped, with the reason
        assert "kernel_us" not in m and "needs a GPU" in m["group1_skipped"] and "needs a GPU" in m["worklist_skipped"]
        assert "needs a GPU" in m["ordered_skipped"]
    full = [c for c in decode.cells(full=True) if c.params["kind"] == "layers"]
    assert {(c.params["K"], c.params["N"]) for c in full} == set(decode.LAYERS_1B)
    assert {c.params["count"] for c in full} == {16} and {c.params["n"] for c in full} == {1, 8}


@pytest.mark.slow  # two compilations of the generation, the dense model's and the fused pruned one's
def test_decode_suite_steps_cell_times_the_fastest_pruned_model_checked():
    from blocksparse.bench import decode

    plain, balanced = [c for c in decode.suite(**decode.SIZES["tiny"]) if c.params["kind"] == "generate_steps"]
    assert plain.params["balance"] is None and balanced.params["balance"] == "cols" and " cols " in balanced.label
    m = _run_checked(balanced)
    assert m["tokens_per_s"] > 0 and m["dense_tokens_per_s"] > 0 and m["speedup_vs_dense"] > 0
    full = [c.label for c in decode.cells(full=True) if c.params["kind"] == "generate_steps"]
    assert "generate b=64 d=1/8 batch=32 fused, Pallas steps [random weights]" in full
    assert "generate b=64 d=1/8 cols batch=1 fused, Pallas steps [random weights]" in full


@pytest.mark.slow  # about eight compilations (generation checked twice, timed three ways): `make test-slow`
def test_decode_suite_pruned_generation_cell_runs_checked():
    from blocksparse.bench import decode

    cell = decode.suite(**decode.SIZES["tiny"])[-1]
    assert cell.params["kind"] == "generate" and cell.params["block_size"]
    m = _run_checked(cell)
    assert m["tokens_per_s"] > 0 and m["rel_err"] < 1e-4 and m["tokens_equal"] == 1.0 and m["dense_loop_ms"] > 0
    assert m["fused_tokens_per_s"] > 0 and m["fused_calls_ms"] > 0  # the fused model, checked and timed
    if jax.default_backend() == "gpu":  # a profiler trace of each model's generations, per new token
        assert m["busy_us_per_token"] > 0 and m["fused_launches_per_token"] > 0 and m["top_kernels_per_token"]
    else:
        assert "busy_us_per_token" not in m
