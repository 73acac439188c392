"""``blocksparse.ops.attention.decode_attention``: one query per head on a key/value cache.

CPU (``make test``): the Pallas kernel in the interpreter against the XLA reference and a NumPy softmax, on random
batches, grouped heads, cache sizes (whole chunks or not) and slot ranges (one slot, the whole cache); bad input.
``decode_step_attention`` (rotary embedding, cache update, attention in one kernel) the same way against NumPy, with
the cache's other slots left as they were. GPU (``-m gpu``): the real kernels on the decoder's shapes, the cache
updated in place under ``jit``. The decoder's ``attention="pallas"`` generates what the XLA attention does.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import has_gpu
from helpers import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from blocksparse.models import LlamaConfig, LlamaModel, generate
from blocksparse.ops.attention import (
    decode_attention,
    decode_attention_reference,
    decode_step_attention,
    decode_step_attention_reference,
)

ON_GPU = has_gpu()
TOL = {jnp.dtype(jnp.float32): 1e-5, jnp.dtype(jnp.bfloat16): 2e-2, jnp.dtype(jnp.float16): 4e-3}


pytestmark = pytest.mark.usefixtures("kernels_here")


def numpy_attention(q, k, v, lo, hi, scale):
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    b, nh, d = q.shape
    nk = k.shape[2]
    out = np.zeros((b, nh, d))
    for i in range(b):
        for h in range(nh):
            kh = h // (nh // nk)
            s = k[i, lo[i] : hi[i] + 1, kh] @ q[i, h] * scale
            p = np.exp(s - s.max())
            out[i, h] = p @ v[i, lo[i] : hi[i] + 1, kh] / p.sum()
    return out


#: What both kernels' property tests draw (with their own head dimensions): batches, grouped heads, caches of whole
#: chunks and not, both dtypes.
CASES = dict(
    batch=st.integers(1, 3),
    kv_heads=st.sampled_from([1, 2]),
    group=st.sampled_from([1, 3, 4, 16]),
    size=st.sampled_from([1, 17, 64, 130]),
    dtype=st.sampled_from([jnp.float32, jnp.bfloat16]),
    data=st.data(),
)


@settings(max_examples=examples(16), deadline=None)
@given(head_dim=st.sampled_from([16, 32]), **CASES)
def test_matches_numpy_and_the_reference(batch, kv_heads, group, head_dim, size, dtype, data):
    lo = np.array([data.draw(st.integers(0, size - 1)) for _ in range(batch)])
    hi = np.array([data.draw(st.integers(int(x), size - 1)) for x in lo])  # one slot up to the whole cache
    keys = jax.random.split(jax.random.key(int(lo.sum() + 7 * hi.sum())), 3)
    q = jax.random.normal(keys[0], (batch, kv_heads * group, head_dim)).astype(dtype)
    k = jax.random.normal(keys[1], (batch, size, kv_heads, head_dim)).astype(dtype)
    v = jax.random.normal(keys[2], (batch, size, kv_heads, head_dim)).astype(dtype)
    got = np.asarray(decode_attention(q, k, v, lo, hi).astype(jnp.float32))
    want = numpy_attention(q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32), lo, hi,
                           head_dim**-0.5)  # fmt: skip
    tol = TOL[jnp.dtype(dtype)]
    np.testing.assert_allclose(got, want, atol=4 * tol, rtol=4 * tol)
    ref = np.asarray(decode_attention_reference(q, k, v, lo, hi).astype(jnp.float32))
    np.testing.assert_allclose(ref, want, atol=4 * tol, rtol=4 * tol)
    assert got.shape == q.shape and decode_attention(q, k, v, lo, hi).dtype == dtype


def test_slots_outside_the_range_are_never_read():
    # NaN outside lo .. hi (in whole chunks beyond hi and in the chunk of lo): the output stays finite.
    q = jnp.ones((1, 2, 16))
    k = jnp.full((1, 200, 1, 16), jnp.nan).at[:, 70:75].set(0.5)
    v = jnp.full((1, 200, 1, 16), jnp.nan).at[:, 70:75].set(2.0)
    out = decode_attention(q, k, v, jnp.array([70]), jnp.array([74]))
    np.testing.assert_allclose(out, 2.0, rtol=1e-6)


def test_bad_input_names_expected_and_actual():
    q, kv = jnp.ones((2, 4, 16)), jnp.ones((2, 8, 2, 16))
    with pytest.raises(ValueError, match=r"Expected lo of shape \(2,\).*Got \(3,\)"):
        decode_attention(q, kv, kv, jnp.zeros(3, jnp.int32), jnp.ones(2, jnp.int32))
    with pytest.raises(ValueError, match="Expected heads divisible by kv_heads. Got 4 heads and 3 kv_heads"):
        decode_attention(q, jnp.ones((2, 8, 3, 16)), jnp.ones((2, 8, 3, 16)), jnp.zeros(2), jnp.ones(2))
    with pytest.raises(ValueError, match="head_dim=16"):
        decode_attention(q, jnp.ones((2, 8, 2, 8)), jnp.ones((2, 8, 2, 8)), jnp.zeros(2), jnp.ones(2))


def numpy_rope(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + np.concatenate([-x[..., half:], x[..., :half]], -1) * sin


@settings(max_examples=examples(16), deadline=None)
@given(head_dim=st.sampled_from([32, 64]), **CASES)  # the step kernel's rotated halves are dot operands of 16
def test_step_matches_numpy_and_the_reference(batch, kv_heads, group, head_dim, size, dtype, data):
    lo = np.array([data.draw(st.integers(0, size - 1)) for _ in range(batch)])
    hi = np.array([data.draw(st.integers(int(x), size - 1)) for x in lo])  # the new slot alone, up to the whole cache
    parts = data.draw(st.sampled_from([None, 1, 2, 3]))  # None: one part off the GPU
    heads = kv_heads * group
    keys = jax.random.split(jax.random.key(int(lo.sum() + 7 * hi.sum())), 4)
    qkv = jax.random.normal(keys[0], (batch, heads + 2 * kv_heads, head_dim)).astype(dtype)
    angles = jax.random.uniform(keys[1], (batch, head_dim), maxval=6.0)
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    k = jax.random.normal(keys[2], (batch, size, kv_heads, head_dim)).astype(dtype)
    v = jax.random.normal(keys[3], (batch, size, kv_heads, head_dim)).astype(dtype)
    out, k2, v2 = decode_step_attention(qkv, cos, sin, k, v, lo, hi, parts=parts)

    f = np.asarray(qkv.astype(jnp.float32), np.float64)
    c, s = np.asarray(cos)[:, None], np.asarray(sin)[:, None]
    new_k, new_v = numpy_rope(f[:, heads : heads + kv_heads], c, s), f[:, heads + kv_heads :]
    want_k, want_v = np.array(k.astype(jnp.float32)), np.array(v.astype(jnp.float32))
    want_k[np.arange(batch), hi], want_v[np.arange(batch), hi] = new_k, new_v
    tol = TOL[jnp.dtype(dtype)]
    np.testing.assert_allclose(np.asarray(k2.astype(jnp.float32)), want_k, atol=2 * tol, rtol=2 * tol)
    np.testing.assert_array_equal(np.asarray(v2.astype(jnp.float32)), want_v)  # the value is copied exactly
    others = np.ones(size, bool)[None].repeat(batch, 0)
    others[np.arange(batch), hi] = False
    np.testing.assert_array_equal(np.asarray(k2)[others], np.asarray(k)[others])  # every other slot as it was
    want = numpy_attention(numpy_rope(f[:, :heads], c, s), want_k, want_v, lo, hi, head_dim**-0.5)
    np.testing.assert_allclose(np.asarray(out.astype(jnp.float32)), want, atol=4 * tol, rtol=4 * tol)
    ref = decode_step_attention_reference(qkv, cos, sin, k, v, lo, hi)[0]
    np.testing.assert_allclose(np.asarray(ref.astype(jnp.float32)), want, atol=4 * tol, rtol=4 * tol)
    assert out.shape == (batch, heads, head_dim) and out.dtype == dtype and k2.dtype == dtype


def test_step_never_reads_the_new_slot_or_slots_outside():
    # The new slot holds NaN (stale) as do the slots outside lo .. hi - 1: the output stays finite.
    qkv = jnp.zeros((1, 4, 32)).at[:, 3].set(2.0)  # 2 heads, 1 kv head; the new value is 2
    k = jnp.full((1, 200, 1, 32), jnp.nan).at[:, 70:75].set(0.0)
    v = jnp.full((1, 200, 1, 32), jnp.nan).at[:, 70:75].set(2.0)
    ones = jnp.ones((1, 32))
    for parts in (1, 2):
        out, k2, v2 = decode_step_attention(qkv, ones, 0 * ones, k, v, jnp.array([70]), jnp.array([75]), parts=parts)
        np.testing.assert_allclose(out, 2.0, rtol=1e-6)
        assert float(v2[0, 75, 0, 0]) == 2.0 and not np.isnan(np.asarray(k2[0, 75])).any()


def test_step_bad_input_names_expected_and_actual():
    qkv, kv, angles, lo = jnp.ones((2, 8, 32)), jnp.ones((2, 8, 2, 32)), jnp.ones((2, 32)), jnp.zeros(2, jnp.int32)
    with pytest.raises(ValueError, match=r"Expected cos of shape \(2, 32\).*Got \(2, 16\)"):
        decode_step_attention(qkv, jnp.ones((2, 16)), angles, kv, kv, lo, lo)
    with pytest.raises(ValueError, match="heads a positive multiple of kv_heads \\(2\\). Got 7 rows"):
        decode_step_attention(jnp.ones((2, 7, 32)), angles, angles, kv, kv, lo, lo)
    with pytest.raises(ValueError, match="Expected an even head_dim.*Got 31"):
        decode_step_attention(jnp.ones((2, 8, 31)), jnp.ones((2, 31)), jnp.ones((2, 31)), jnp.ones((2, 8, 2, 31)),
                              jnp.ones((2, 8, 2, 31)), lo, lo)  # fmt: skip
    with pytest.raises(ValueError, match=r"Expected hi of shape \(2,\)"):
        decode_step_attention(qkv, angles, angles, kv, kv, lo, jnp.zeros(3, jnp.int32))
    with pytest.raises(ValueError, match=r"Expected 0 <= lo <= hi < size \(8\).*Got lo=0, hi=8 for sequence 1"):
        decode_step_attention(qkv, angles, angles, kv, kv, lo, jnp.array([3, 8]))
    with pytest.raises(ValueError, match=r"Got lo=3, hi=2 for sequence 0"):
        decode_attention(qkv[:, :4], kv, kv, jnp.array([3, 0]), jnp.array([2, 0]))
    with pytest.raises(ValueError, match=r"Expected parts as a positive int \(or None\). Got 0"):
        decode_step_attention(qkv, angles, angles, kv, kv, lo, lo, parts=0)


def test_default_parts_fill_the_multiprocessors():
    import blocksparse.hardware as hw
    from blocksparse.ops.attention import default_parts

    h200 = hw.Device(kind="NVIDIA H200", platform="gpu", compute_capability="9.0", num_sms=132)
    with hw.fake(h200):
        assert [default_parts(b, 8, 256) for b in (1, 8, 32)] == [4, 2, 1]  # at most a part per 64-slot chunk
        assert default_parts(1, 8, 4096) == 16
    with hw.fake(hw.Device(kind="cpu", platform="cpu")):
        assert default_parts(1, 8, 4096) == 1


# head_dim 32: the step kernel's smallest (its rotated halves are dot operands of 16)
TINY = LlamaConfig(vocab_size=64, hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64,
                   max_positions=64)  # fmt: skip


@pytest.mark.slow  # whole generations (23 s); each step against NumPy stays quick
def test_the_decoder_generates_the_same_tokens_with_pallas_attention(monkeypatch):
    from blocksparse.models import _llama
    from blocksparse.ops.attention import CHUNK

    sizes = []  # the cache sizes generate compiles for
    real = _llama._generate
    monkeypatch.setattr(_llama, "_generate", lambda *a, **kw: sizes.append(kw["cache_size"]) or real(*a, **kw))
    model = LlamaModel.random(jax.random.key(0), TINY, scale=0.3)
    prompts = [[1, 2, 3, 4, 5], [7, 8]]  # left-padded: the second sequence's slots start at 3
    want = generate(model, prompts, 6)
    fast = model.with_attention("pallas")
    assert fast.attention == "pallas" and model.attention == "xla"
    np.testing.assert_array_equal(generate(fast, prompts, 6), want)  # the default cache: one whole chunk
    np.testing.assert_array_equal(generate(fast, prompts, 6, cache_size=20), want)  # a given size is kept (padded)
    assert sizes == [11, CHUNK, 20]
    assert jax.tree.structure(fast) != jax.tree.structure(model)  # a static field: its own compilation


def test_attention_choices_are_checked():
    model = LlamaModel.random(jax.random.key(0), TINY)
    with pytest.raises(ValueError, match="Expected attention one of 'xla', 'cudnn', 'pallas'. Got 'flash'"):
        model.with_attention("flash")
    with pytest.raises(ValueError, match="Expected a bfloat16 or float16 model for cuDNN attention. Got float32"):
        model.with_attention("cudnn")
    half = model.astype(jnp.bfloat16).with_attention("cudnn")
    assert half.attention == "cudnn" and half.astype(jnp.float16).attention == "cudnn"
    with pytest.raises(ValueError, match="Expected a bfloat16 or float16 model for cuDNN attention. Got float32"):
        half.astype(jnp.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 8])
def test_decoder_shapes_on_the_gpu(batch):
    # The 1B decoder's attention (32 heads, 8 kv heads of 64) on a 256-slot cache, and a long cache of 1000 slots.
    for nh, nk, d, size in ((32, 8, 64, 256), (16, 2, 128, 1000)):
        keys = jax.random.split(jax.random.key(batch), 3)
        q = jax.random.normal(keys[0], (batch, nh, d)).astype(jnp.bfloat16)
        k = jax.random.normal(keys[1], (batch, size, nk, d)).astype(jnp.bfloat16)
        v = jax.random.normal(keys[2], (batch, size, nk, d)).astype(jnp.bfloat16)
        lo = jnp.arange(batch, dtype=jnp.int32) * 3
        hi = jnp.full((batch,), size - 1, jnp.int32).at[0].set(lo[0])
        got = jax.jit(decode_attention)(q, k, v, lo, hi).astype(jnp.float32)
        want = decode_attention_reference(*(a.astype(jnp.float32) for a in (q, k, v)), lo, hi)
        np.testing.assert_allclose(got, want, atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 8, 32])
def test_step_on_decoder_shapes_on_the_gpu(batch):
    # The 1B decoder's step (32 heads, 8 kv heads of 64) on a 256-slot cache (updated in place: donated), and 16
    # heads, 2 kv heads of 128 on a 1000-slot cache (padded to whole chunks for the walk).
    for nh, nk, d, size in ((32, 8, 64, 256), (16, 2, 128, 1000)):
        keys = jax.random.split(jax.random.key(batch), 4)
        qkv = jax.random.normal(keys[0], (batch, nh + 2 * nk, d)).astype(jnp.bfloat16)
        angles = jax.random.uniform(keys[1], (batch, d), maxval=6.0)
        k = jax.random.normal(keys[2], (batch, size, nk, d)).astype(jnp.bfloat16)
        v = jax.random.normal(keys[3], (batch, size, nk, d)).astype(jnp.bfloat16)
        lo = jnp.arange(batch, dtype=jnp.int32) * 3
        hi = jnp.full((batch,), size - 1, jnp.int32).at[0].set(lo[0])
        want = decode_step_attention_reference(qkv, jnp.cos(angles), jnp.sin(angles), k, v, lo, hi)
        run = jax.jit(decode_step_attention, donate_argnums=(3, 4))
        got = run(qkv, jnp.cos(angles), jnp.sin(angles), jnp.copy(k), jnp.copy(v), lo, hi)
        np.testing.assert_allclose(got[0].astype(jnp.float32), want[0].astype(jnp.float32), atol=2e-2, rtol=2e-2)
        np.testing.assert_allclose(got[1].astype(jnp.float32), want[1].astype(jnp.float32), atol=2e-2, rtol=2e-2)
        np.testing.assert_array_equal(got[2], want[2])


@pytest.mark.gpu
def test_cudnn_and_pallas_attention_decode_as_xla_on_the_gpu():
    model = LlamaModel.random(jax.random.key(0), TINY, dtype=jnp.bfloat16, scale=0.3)
    prompts = jax.random.randint(jax.random.key(1), (2, 8), 0, 64)
    run = jax.jit(functools.partial(generate, max_new_tokens=8))
    want = run(model, prompts)
    for att in ("pallas", "cudnn"):
        got = run(model.with_attention(att), prompts)
        assert np.mean(np.asarray(got) == np.asarray(want)) >= 0.75, att  # bf16 near-ties may differ late
