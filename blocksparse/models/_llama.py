"""A Llama-family decoder LM in JAX whose projections may be dense or block-sparse, with one-program generation.

The model is a pytree (:class:`blocksparse._util.Pytree`) like :class:`~blocksparse.models.BertEncoder`:
the configuration, the compute dtype and every sparsity pattern are static structure. RMSNorm, rotary
embeddings (Hugging Face's ``rotate_half`` layout), grouped-query attention and the SwiGLU MLP follow
``transformers``' ``LlamaForCausalLM``; each of the seven projections of a layer (q, k, v, o, gate, up,
down) and an untied ``lm_head`` is a ``bs.nn`` layer (:class:`~blocksparse.nn.Linear` or
:class:`~blocksparse.nn.SparseLinear`, weights ``(in, out)``), so :func:`prune_decoder` turns them
block-sparse.

:func:`generate` runs prefill and every new token as one jitted program over a fixed-size KV cache
(a ``lax.fori_loop`` over the new tokens): the shapes never change from one token to the next, so
nothing recompiles per token.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from .. import nn as _nn
from .._checkpoint import register_checkpoint_type
from .._matrix import concatenate as bs_concatenate
from .._pattern import check_block_size, check_density
from .._safetensors import read_safetensors
from .._safetensors import write as write_safetensors
from .._util import Pytree
from ..ops.attention import CHUNK as ATTENTION_CHUNK
from ..ops.attention import decode_step_attention
from ..ops.matmul import epilogue as _epilogue
from ..ops.matmul import matmul as bs_matmul
from ..ops.norm import rms_norm, rms_norm_reference
from ._bert import _apply, dense_projection, sparse_projection

__all__ = [
    "ATTENTION",
    "DECODER_PROJECTIONS",
    "FUSED_PROJECTIONS",
    "KVCache",
    "LlamaConfig",
    "LlamaLayer",
    "LlamaModel",
    "ROPE_TYPES",
    "RMSNorm",
    "block_density",
    "densified",
    "fuse_projections",
    "generate",
    "inverse_frequencies",
    "left_pad",
    "load_llama",
    "prune_decoder",
    "save_llama",
]

#: The projections of one decoder layer, in the order the layer applies them (``lm_head`` is the model's).
DECODER_PROJECTIONS = ("q", "k", "v", "o", "gate", "up", "down")
#: The attention implementations of :meth:`LlamaModel.with_attention`.
ATTENTION = ("xla", "cudnn", "pallas")
#: Hugging Face names of the projections under ``model.layers.{i}.``.
_HF = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
       "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}  # fmt: skip
#: The projections :func:`fuse_projections` joins into one product: fused name -> its members, in order.
FUSED_PROJECTIONS = {"qkv": ("q", "k", "v"), "gate_up": ("gate", "up")}
#: The activation fused into a projection's product (SwiGLU: ``down(silu(gate(x)) * up(x))``).
_ACT = {"gate": "silu"}
#: ``rope_scaling`` types implemented (``"default"``: none); any other is refused by name.
ROPE_TYPES = ("default", "linear", "llama3")


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    """The shape of a Llama decoder (the fields of a Hugging Face ``config.json`` that matter here).

    ``rope_scaling`` is ``None`` or a hashable tuple of ``(key, value)`` pairs (``from_hf`` builds it);
    its ``rope_type`` is one of :data:`ROPE_TYPES`.
    """

    vocab_size: int = 32000
    hidden_size: int = 2048
    num_layers: int = 16
    num_heads: int = 32
    num_kv_heads: int = 8
    intermediate_size: int = 8192
    max_positions: int = 2048
    head_dim: int | None = None
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: tuple | None = None
    tie_word_embeddings: bool = False

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size",
                     "max_positions"):  # fmt: skip
            _positive_int(name, getattr(self, name))
        if self.head_dim is None:
            if self.hidden_size % self.num_heads:
                raise ValueError(f"Expected hidden_size divisible by num_heads. Got hidden_size={self.hidden_size}, "
                                 f"num_heads={self.num_heads}.")  # fmt: skip
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        _positive_int("head_dim", self.head_dim)
        if self.head_dim % 2:
            raise ValueError(f"Expected an even head_dim (rotary embeddings rotate pairs). Got {self.head_dim}.")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"Expected num_heads divisible by num_kv_heads (grouped-query attention). Got "
                             f"num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}.")  # fmt: skip
        if isinstance(self.rope_scaling, Mapping):
            object.__setattr__(self, "rope_scaling", tuple(sorted(self.rope_scaling.items())))
        rope_type = self.rope_type
        if rope_type not in ROPE_TYPES:
            raise ValueError(f"rope_scaling type {rope_type!r} is not implemented (implemented: {ROPE_TYPES}).")
        if rope_type in ("linear", "llama3") and "factor" not in dict(self.rope_scaling):
            raise ValueError(f"rope_scaling type {rope_type!r} expects a 'factor'. Got {dict(self.rope_scaling)}.")
        if rope_type == "llama3":
            need = {"low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}
            if missing := sorted(need - set(dict(self.rope_scaling))):
                raise ValueError(f"rope_scaling type 'llama3' expects the keys {sorted(need)}. Missing {missing}.")

    @property
    def rope_type(self) -> str:
        if not self.rope_scaling:
            return "default"
        s = dict(self.rope_scaling)
        return s.get("rope_type", s.get("type", "default"))

    @property
    def num_parameters(self) -> int:
        h, f, d = self.hidden_size, self.intermediate_size, self.head_dim
        attn = h * d * (2 * self.num_heads + 2 * self.num_kv_heads)
        per_layer = attn + 3 * h * f + 2 * h
        heads = 1 if self.tie_word_embeddings else 2
        return self.num_layers * per_layer + heads * self.vocab_size * h + h

    @classmethod
    def from_hf(cls, config: Mapping, *, source: str = "config.json") -> LlamaConfig:
        """Read a Hugging Face Llama ``config.json`` dict; a field this model does not implement raises by name."""
        got = config.get("model_type", "llama")
        if got != "llama":
            raise ValueError(f"{source}: expected model_type='llama' (what this decoder implements). Got {got!r}.")
        act = config.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"{source}: expected hidden_act='silu' (SwiGLU). Got {act!r}.")
        for key in ("attention_bias", "mlp_bias"):
            if config.get(key, False):
                raise ValueError(f"{source}: {key}=true is not implemented (Llama's projections have no bias).")
        names = {"vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_layers": "num_hidden_layers",
                 "num_heads": "num_attention_heads", "intermediate_size": "intermediate_size"}  # fmt: skip
        missing = [hf for hf in names.values() if hf not in config]
        if missing:
            raise ValueError(f"{source}: expected the keys {sorted(names.values())}. Missing {missing}.")
        # transformers 5 moves rope_theta and the scaling into rope_parameters; 4.x keeps them at the top.
        rope = dict(config.get("rope_parameters") or {})
        theta = rope.pop("rope_theta", config.get("rope_theta", 10000.0))
        scaling = config.get("rope_scaling") or rope or None
        if scaling is not None:
            scaling = {k: v for k, v in scaling.items() if k != "rope_theta"}
            kind = scaling.get("rope_type", scaling.get("type", "default"))
            if kind not in ROPE_TYPES:
                raise ValueError(f"{source}: rope_scaling type {kind!r} is not implemented (implemented: "
                                 f"{ROPE_TYPES}; null means none).")  # fmt: skip
            scaling = None if kind == "default" else tuple(sorted((k, _hashable(v)) for k, v in scaling.items()))
        kw = {k: config[hf] for k, hf in names.items()}
        return cls(
            **kw,
            num_kv_heads=config.get("num_key_value_heads") or kw["num_heads"],
            max_positions=config.get("max_position_embeddings", 2048),
            head_dim=config.get("head_dim"),
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta),
            rope_scaling=scaling,
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        )

    def to_hf(self) -> dict:
        """A ``config.json`` dict ``transformers.LlamaConfig`` reads (what :meth:`from_hf` reads back)."""
        return dict(
            model_type="llama", architectures=["LlamaForCausalLM"], vocab_size=self.vocab_size,
            hidden_size=self.hidden_size, num_hidden_layers=self.num_layers, num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_kv_heads, intermediate_size=self.intermediate_size,
            max_position_embeddings=self.max_positions, head_dim=self.head_dim, rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta, rope_scaling=dict(self.rope_scaling) if self.rope_scaling else None,
            tie_word_embeddings=self.tie_word_embeddings, hidden_act="silu", attention_bias=False, mlp_bias=False,
        )  # fmt: skip


def _positive_int(name, v):
    if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 1:
        raise ValueError(f"Expected {name} a positive integer. Got {v!r}.")


def _hashable(v):
    return tuple(v) if isinstance(v, list) else v


def inverse_frequencies(config: LlamaConfig) -> np.ndarray:
    """The rotary inverse frequencies ``(head_dim // 2,)`` float64, with the configured scaling applied."""
    d = config.head_dim
    inv = 1.0 / config.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    kind = config.rope_type
    if kind == "default":
        return inv
    s = dict(config.rope_scaling)
    factor = float(s["factor"])
    if kind == "linear":
        return inv / factor
    low, high = float(s["low_freq_factor"]), float(s["high_freq_factor"])
    old = float(s["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > old / low, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    medium = ~(wavelen < old / high) & ~(wavelen > old / low)
    return np.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled)


@dataclasses.dataclass(frozen=True)
class RMSNorm(Pytree):
    """``x / rms(x) * weight``: statistics in float32, cast back to the input dtype before the weight (as HF)."""

    _leaves = ("weight",)
    _static = ("eps",)

    weight: jax.Array
    eps: float = 1e-5

    def __call__(self, x) -> jax.Array:
        return rms_norm_reference(x, self.weight, eps=self.eps)

    def add(self, x, residual=None) -> tuple[jax.Array, jax.Array]:
        """``(s, norm(s))`` with ``s = x + residual`` (``x`` when ``residual`` is ``None``), in one launch
        (:func:`blocksparse.ops.norm.rms_norm`: a Pallas kernel on a GPU)."""
        if residual is None:
            return x, rms_norm(x, self.weight, eps=self.eps)
        return rms_norm(x, self.weight, eps=self.eps, residual=residual)


@dataclasses.dataclass(frozen=True)
class KVCache(Pytree):
    """Keys and values of every layer, ``(batch, size, kv_heads, head_dim)`` each, in a tuple per layer.

    The size is fixed: slot ``j`` holds the token at slot ``j`` of the (left-padded) sequence.
    """

    _leaves = ("k", "v")

    k: tuple
    v: tuple

    @property
    def size(self) -> int:
        return self.k[0].shape[1]


def _gated(layer, h):
    """SwiGLU on a fused ``gate_up`` layer ``(hidden, 2 * ffn)``: ``silu(gate) * up`` of its two halves, gated in
    the product's epilogue for a block-sparse weight (:func:`blocksparse.matmul`'s ``glu``: the few-token kernel
    stores only the ``ffn`` outputs), after a float32 product for a dense one."""
    h2 = h.reshape(-1, h.shape[-1])
    if isinstance(layer, _nn.SparseLinear):
        y = bs_matmul(h2, layer.weight, bias=layer.bias, activation="silu", glu=True,
                      implementation=layer.implementation)  # fmt: skip
    else:
        out = jnp.result_type(h2, layer.weight)
        z = jnp.matmul(
            h2.astype(out), layer.weight.astype(out), preferred_element_type=jnp.promote_types(out, jnp.float32)
        )
        y = _epilogue.gated(_epilogue.apply(z, layer.bias, None), "silu").astype(out)
    return y.reshape(*h.shape[:-1], y.shape[-1])


def _rotate(x, cos, sin):
    """Rotary embedding in the ``rotate_half`` layout: ``x (b, t, heads, d)``, ``cos``/``sin`` ``(b, t, d)``."""
    half = x.shape[-1] // 2
    rot = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, :, None].astype(x.dtype) + rot * sin[:, :, None].astype(x.dtype)


@dataclasses.dataclass(frozen=True)
class LlamaLayer(Pytree):
    """One decoder layer: RMSNorm, grouped-query attention on the KV cache, residual; RMSNorm, SwiGLU, residual."""

    _leaves = ("input_norm", "q", "k", "v", "o", "post_norm", "gate", "up", "down", "qkv", "gate_up")
    _static = ("num_heads", "num_kv_heads", "head_dim")

    input_norm: RMSNorm
    q: object
    k: object
    v: object
    o: object
    post_norm: RMSNorm
    gate: object
    up: object
    down: object
    num_heads: int
    num_kv_heads: int
    head_dim: int
    qkv: object = None
    gate_up: object = None

    def __call__(self, x, cos, sin, k_cache, v_cache, start, key_mask, attention: str = "xla", bounds=None):
        """``x (b, t, hidden)`` at cache slots ``start .. start + t``; returns ``(x, k_cache, v_cache)``.

        ``key_mask (b, t, size)``: which cache slots each new token attends to (causal, no padding).
        ``attention``: :data:`ATTENTION` (``"cudnn"`` and ``"pallas"`` serve one-token steps; longer ones stay on
        XLA); ``bounds``: ``(lo, hi)`` ``(b,)``, the first and last slot each sequence attends to (one-token steps).
        """
        if attention == "pallas" and bounds is not None:  # bounds: given for one-token steps
            x, delta, k_cache, v_cache = self.decode_step(x, None, cos, sin, k_cache, v_cache, bounds)
            return x + delta, k_cache, v_cache
        b, t, _ = x.shape
        nh, nk, d = self.num_heads, self.num_kv_heads, self.head_dim
        h = self.input_norm(x)
        if self.qkv is not None:  # fused: one product, split
            q, k, v = jnp.split(_apply(self.qkv, h), [nh * d, (nh + nk) * d], axis=-1)
        else:
            q, k, v = _apply(self.q, h), _apply(self.k, h), _apply(self.v, h)
        q = _rotate(q.reshape(b, t, nh, d), cos, sin)
        k = _rotate(k.reshape(b, t, nk, d), cos, sin)
        v = v.reshape(b, t, nk, d)
        k_cache = jax.lax.dynamic_update_slice_in_dim(k_cache, k.astype(k_cache.dtype), start, axis=1)
        v_cache = jax.lax.dynamic_update_slice_in_dim(v_cache, v.astype(v_cache.dtype), start, axis=1)
        if attention == "cudnn" and t == 1:
            # cuDNN's fused attention (one kernel) on the cache; a one-token step always attends to its own slot, so
            # no row is wholly masked (a prefill's padding rows would be, and stay on XLA).
            ctx = jax.nn.dot_product_attention(q, k_cache, v_cache, mask=key_mask[:, None], implementation="cudnn")
        else:
            qg = q.reshape(b, t, nk, nh // nk, d)
            scores = jnp.einsum("btkgd,bskd->bkgts", qg, k_cache, preferred_element_type=jnp.float32) / math.sqrt(d)
            scores = jnp.where(key_mask[:, None, None], scores, jnp.finfo(jnp.float32).min)
            probs = jax.nn.softmax(scores, axis=-1).astype(x.dtype)
            ctx = jnp.einsum("bkgts,bskd->btkgd", probs, v_cache, preferred_element_type=jnp.float32).astype(x.dtype)
        return self._rest(x, ctx, k_cache, v_cache)

    def decode_step(self, x, delta, cos, sin, k_cache, v_cache, bounds):
        """A one-token step in Pallas kernels: ``x (b, 1, hidden)`` with ``delta``, the previous layer's last residual
        term not yet added (``None``: none), at slots ``bounds = (lo, hi)`` ``(b,)``; returns ``(x, delta, k_cache,
        v_cache)``, this layer's output being ``x + delta``.

        Each residual add runs in the launch of the RMSNorm after it (:func:`blocksparse.ops.norm.rms_norm`), and the
        rotary embedding, the cache update and the attention in one more
        (:func:`blocksparse.ops.attention.decode_step_attention`): handing the last add to the next layer's norm is
        what lets it join a launch.
        """
        b = x.shape[0]
        nh, nk, d = self.num_heads, self.num_kv_heads, self.head_dim
        x, h = self.input_norm.add(x, delta)
        if self.qkv is not None:
            qkv = _apply(self.qkv, h)
        else:
            qkv = jnp.concatenate([_apply(self.q, h), _apply(self.k, h), _apply(self.v, h)], axis=-1)
        ctx, k_cache, v_cache = decode_step_attention(qkv.reshape(b, nh + 2 * nk, d), cos[:, 0], sin[:, 0], k_cache,
                                                      v_cache, *bounds)  # fmt: skip
        x, h = self.post_norm.add(x, _apply(self.o, ctx.reshape(b, 1, nh * d)))
        return x, self._ffn(h), k_cache, v_cache

    def _rest(self, x, ctx, k_cache, v_cache):
        """The layer after its attention: the output projection and residual, the MLP and residual."""
        b, t, _ = x.shape
        x = x + _apply(self.o, ctx.reshape(b, t, self.num_heads * self.head_dim))
        return x + self._ffn(self.post_norm(x)), k_cache, v_cache

    def _ffn(self, h):
        """SwiGLU: ``down(silu(gate(h)) * up(h))``. Fused and block-sparse, ``gate_up``'s product is ungated (its two
        halves rounded to the model's dtype, as Hugging Face's model rounds them) and the down product is asked to gate
        them (``bs.matmul``'s ``input_glu``: where its kernel loads them if the device's tuned table says that is
        faster, else in XLA first)."""
        if self.gate_up is not None and all(isinstance(p, _nn.SparseLinear) for p in (self.gate_up, self.down)):
            y = _apply(self.gate_up, h)
            y2 = y.reshape(-1, y.shape[-1])
            out = bs_matmul(y2, self.down.weight, bias=self.down.bias, activation=self.down.activation,
                            input_glu="silu", implementation=self.down.implementation)  # fmt: skip
            return out.reshape(*y.shape[:-1], out.shape[-1])
        return _apply(self.down, self._mlp(h))

    def _mlp(self, h):
        if self.gate_up is not None:  # fused: one product, SiLU(gate) * up in its epilogue
            return _gated(self.gate_up, h)
        return _apply(self.gate, h) * _apply(self.up, h)  # the gate's SiLU is fused into its product


@dataclasses.dataclass(frozen=True)
class LlamaModel(Pytree):
    """A Llama-family causal LM (``LlamaForCausalLM``'s computation) in JAX.

    Call it on token ids ``(batch, length)`` for the float32 logits ``(batch, length, vocab)`` of the whole
    sequence; :meth:`step` runs new tokens against a :class:`KVCache`; :func:`generate` decodes.

    Arguments (fields):
        embed: ``(vocab, hidden)`` token embeddings.
        layers: a tuple of :class:`LlamaLayer`.
        norm: the final :class:`RMSNorm`.
        lm_head: a ``bs.nn`` layer ``(hidden, vocab)``, or ``None`` when the embeddings are tied.
        inv_freq: the rotary inverse frequencies ``(head_dim // 2,)`` float32 (:func:`inverse_frequencies`).
        config: the :class:`LlamaConfig` (static).
        dtype: the compute dtype (static).
        attention: which implementation runs the attention of one-token decode steps (static,
            :data:`ATTENTION`; :meth:`with_attention` sets it).
    """

    _leaves = ("embed", "layers", "norm", "lm_head", "inv_freq")
    _static = ("config", "dtype", "attention")

    embed: jax.Array
    layers: tuple
    norm: RMSNorm
    lm_head: object
    inv_freq: jax.Array
    config: LlamaConfig
    dtype: np.dtype = np.dtype(np.float32)
    attention: str = "xla"

    def __post_init__(self):
        _check_attention(self.attention, self.dtype)

    def with_attention(self, attention: str) -> LlamaModel:
        """The same model with its decode steps' attention run by ``attention`` (:data:`ATTENTION`): ``"pallas"``
        (:func:`blocksparse.ops.attention.decode_step_attention`: rotary embedding, cache update and attention in one
        launch per layer on a GPU, XLA elsewhere; the RMSNorms of those steps then run with the residual add before
        them in one launch each, :func:`blocksparse.ops.norm.rms_norm`),
        ``"cudnn"`` (cuDNN's fused attention, an NVIDIA GPU and half-precision compute) or ``"xla"`` (einsums and a
        softmax, the default). Prefills (more than one token per step) always run on XLA."""
        _check_attention(attention, self.dtype)
        return self._replace(attention=attention)

    def astype(self, dtype) -> LlamaModel:
        """Parameters and compute in ``dtype`` (float32, bfloat16 or float16); rotary frequencies stay float32."""
        dtype = np.dtype(dtype)
        if not jnp.issubdtype(dtype, jnp.floating):
            raise ValueError(f"Expected a floating dtype such as float32 or bfloat16. Got {dtype}.")
        _check_attention(self.attention, dtype)
        inv = self.inv_freq
        cast = jax.tree.map(lambda a: a.astype(dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a, self)
        return cast._replace(dtype=dtype, inv_freq=inv)

    def init_cache(self, batch: int, size: int) -> KVCache:
        """An empty (zero) cache for ``batch`` sequences of up to ``size`` tokens, in the compute dtype."""
        _positive_int("batch", batch)
        _positive_int("cache size", size)
        c = self.config
        shape = (batch, size, c.num_kv_heads, c.head_dim)
        z = tuple(jnp.zeros(shape, self.dtype) for _ in self.layers)
        return KVCache(z, tuple(jnp.zeros(shape, self.dtype) for _ in self.layers))

    def step(self, tokens, cache: KVCache, start, pad=None, *, last: bool = False):
        """Run ``tokens (batch, t)`` at cache slots ``start .. start + t``: ``(logits float32 (b, t, vocab), cache)``.

        ``pad (batch,)``: how many slots at the left of each sequence are padding (never attended to;
        positions count from the first real token). ``start`` may be traced. ``last``: the logits of the
        last token only, ``(b, 1, vocab)`` (a prefill needs no more).
        """
        b, t = tokens.shape
        size = cache.size
        pad = jnp.zeros((b,), jnp.int32) if pad is None else jnp.asarray(pad, jnp.int32)
        slots = start + jnp.arange(t, dtype=jnp.int32)  # (t,)
        positions = (slots[None, :] - pad[:, None]).astype(jnp.float32)  # (b, t)
        freqs = positions[..., None] * self.inv_freq.astype(jnp.float32)
        emb = jnp.concatenate([freqs, freqs], axis=-1)
        cos, sin = jnp.cos(emb), jnp.sin(emb)
        j = jnp.arange(size, dtype=jnp.int32)
        key_mask = (j[None, None, :] <= slots[None, :, None]) & (j[None, None, :] >= pad[:, None, None])
        x = jnp.take(self.embed, tokens, axis=0).astype(self.dtype)
        bounds = (pad, jnp.broadcast_to(slots[0], (b,))) if t == 1 else None
        ks, vs = [], []
        kernels = self.attention == "pallas" and t == 1  # each residual add joins the launch of the norm after it
        delta = None  # (kernels) the last layer's residual term, added by the next norm
        for layer, kc, vc in zip(self.layers, cache.k, cache.v, strict=True):
            if kernels:
                x, delta, kc, vc = layer.decode_step(x, delta, cos, sin, kc, vc, bounds)
            else:
                x, kc, vc = layer(x, cos, sin, kc, vc, start, key_mask, self.attention, bounds)
            ks.append(kc)
            vs.append(vc)
        h = self.norm.add(x, delta)[1] if kernels else self.norm(x[:, -1:] if last else x)
        if self.lm_head is None:
            logits = jnp.einsum("bth,vh->btv", h, self.embed.astype(h.dtype), preferred_element_type=jnp.float32)
        else:
            logits = _apply(self.lm_head, h)
        return logits.astype(jnp.float32), KVCache(tuple(ks), tuple(vs))

    def __call__(self, tokens, pad=None) -> jax.Array:
        """The float32 logits ``(batch, length, vocab)`` of every position (a fresh cache of the sequence's length)."""
        tokens = _check_tokens(tokens)
        return self.step(tokens, self.init_cache(*tokens.shape), 0, pad)[0]

    # -- construction -----------------------------------------------------------------------------------
    @classmethod
    def from_state_dict(cls, tensors: Mapping, config: LlamaConfig, *, source: str = "weights",
                        dtype=jnp.float32) -> LlamaModel:  # fmt: skip
        """Build the dense model from a Hugging Face ``LlamaForCausalLM`` state dict (PyTorch names, ``(out, in)``).

        A missing tensor or one of the wrong shape raises, naming it, the expected and the actual shape and
        ``source``. ``lm_head.weight`` is read only when the embeddings are not tied.
        """
        c = config
        h, f, d = c.hidden_size, c.intermediate_size, c.head_dim

        def get(name, shape):
            if name not in tensors:
                raise ValueError(f"{source}: expected a tensor {name!r} of shape {shape}. It is missing "
                                 "(is this a Llama checkpoint?).")  # fmt: skip
            a = tensors[name]
            if tuple(a.shape) != shape:
                raise ValueError(f"{source}: expected {name!r} of shape {shape}. Got {tuple(a.shape)}.")
            if not jnp.issubdtype(a.dtype, jnp.floating):
                raise ValueError(f"{source}: expected {name!r} floating. Got {a.dtype}.")
            return jnp.asarray(np.asarray(a), dtype)

        shapes = {"q": (c.num_heads * d, h), "k": (c.num_kv_heads * d, h), "v": (c.num_kv_heads * d, h),
                  "o": (h, c.num_heads * d), "gate": (f, h), "up": (f, h), "down": (h, f)}  # fmt: skip
        layers = []
        for i in range(c.num_layers):
            p = f"model.layers.{i}."
            proj = {
                n: dense_projection(get(p + _HF[n] + ".weight", shapes[n]).T, None, _ACT.get(n))
                for n in DECODER_PROJECTIONS
            }
            layers.append(LlamaLayer(
                input_norm=RMSNorm(get(p + "input_layernorm.weight", (h,)), c.rms_norm_eps),
                post_norm=RMSNorm(get(p + "post_attention_layernorm.weight", (h,)), c.rms_norm_eps),
                num_heads=c.num_heads, num_kv_heads=c.num_kv_heads, head_dim=d, **proj,
            ))  # fmt: skip
        head = None if c.tie_word_embeddings else dense_projection(get("lm_head.weight", (c.vocab_size, h)).T, None)
        return cls(
            embed=get("model.embed_tokens.weight", (c.vocab_size, h)),
            layers=tuple(layers),
            norm=RMSNorm(get("model.norm.weight", (h,)), c.rms_norm_eps),
            lm_head=head,
            inv_freq=jnp.asarray(inverse_frequencies(c), jnp.float32),
            config=c,
            dtype=np.dtype(dtype),
        )

    def state_dict(self) -> dict[str, np.ndarray]:
        """The parameters under Hugging Face names, PyTorch ``(out, in)`` layout, as NumPy (block-sparse written
        densely, zeros outside the pattern); bfloat16 parameters stay bfloat16 (``ml_dtypes``)."""

        def dense(p):
            return _dense_weight(p).T

        out = {"model.embed_tokens.weight": np.asarray(self.embed), "model.norm.weight": np.asarray(self.norm.weight)}
        for i, L in enumerate(self.layers):
            p = f"model.layers.{i}."
            out[p + "input_layernorm.weight"] = np.asarray(L.input_norm.weight)
            out[p + "post_attention_layernorm.weight"] = np.asarray(L.post_norm.weight)
            for n, w in _unfused_weights(L).items():
                out[p + _HF[n] + ".weight"] = w.T
        if self.lm_head is not None:
            out["lm_head.weight"] = dense(self.lm_head)
        return {k: np.ascontiguousarray(v) for k, v in out.items()}

    @classmethod
    def random(cls, key, config: LlamaConfig, *, dtype=jnp.float32, scale: float = 0.02) -> LlamaModel:
        """A randomly initialised dense model (normal weights of standard deviation ``scale``, norms one),
        drawn on the device in ``dtype`` by one jitted program (a 1B-class model never passes through the host)."""
        return _random_model(key, config, np.dtype(dtype), float(scale))


for _cls in (LlamaConfig, RMSNorm, KVCache, LlamaLayer, LlamaModel):
    register_checkpoint_type(_cls, f"blocksparse.models.{_cls.__name__}")


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _random_model(key, config: LlamaConfig, dtype, scale: float) -> LlamaModel:
    c = config
    h, f, d = c.hidden_size, c.intermediate_size, c.head_dim
    dims = {"q": (h, c.num_heads * d), "k": (h, c.num_kv_heads * d), "v": (h, c.num_kv_heads * d),
            "o": (c.num_heads * d, h), "gate": (h, f), "up": (h, f), "down": (f, h)}  # fmt: skip
    keys = iter(jax.random.split(key, c.num_layers * len(dims) + 2))

    def normal(shape):
        return (scale * jax.random.normal(next(keys), shape, jnp.float32)).astype(dtype)

    ones = jnp.ones((h,), dtype)
    layers = tuple(
        LlamaLayer(input_norm=RMSNorm(ones, c.rms_norm_eps), post_norm=RMSNorm(ones, c.rms_norm_eps),
                   num_heads=c.num_heads, num_kv_heads=c.num_kv_heads, head_dim=d,
                   **{n: dense_projection(normal(s), None, _ACT.get(n)) for n, s in dims.items()})
        for _ in range(c.num_layers)
    )  # fmt: skip
    embed = normal((c.vocab_size, h))
    head = None if c.tie_word_embeddings else dense_projection(normal((h, c.vocab_size)), None)
    inv = jnp.asarray(inverse_frequencies(c), jnp.float32)
    return LlamaModel(embed, layers, RMSNorm(ones, c.rms_norm_eps), head, inv, c, np.dtype(dtype))


def _check_attention(attention: str, dtype) -> None:
    """A known attention (:data:`ATTENTION`), and half-precision compute for cuDNN's."""
    if attention not in ATTENTION:
        raise ValueError(f"Expected attention one of {', '.join(map(repr, ATTENTION))}. Got {attention!r}.")
    if attention == "cudnn" and np.dtype(dtype) not in (np.dtype(jnp.bfloat16), np.dtype(np.float16)):
        raise ValueError(f"Expected a bfloat16 or float16 model for cuDNN attention. Got {np.dtype(dtype)}.")


def _check_tokens(tokens) -> jax.Array:
    tokens = jnp.asarray(tokens)
    if tokens.ndim != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer) or 0 in tokens.shape:
        raise ValueError(f"Expected token ids of integers, shape (batch, length), both positive. Got {tokens.dtype} "
                         f"{tuple(tokens.shape)}.")  # fmt: skip
    return tokens.astype(jnp.int32)


# -- loading ------------------------------------------------------------------------------------------
def load_tensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every tensor of a Llama directory: ``model.safetensors``, or the shards ``model.safetensors.index.json``
    lists (``transformers``' ``save_pretrained`` layout)."""
    path = Path(path)
    single, index = path / "model.safetensors", path / "model.safetensors.index.json"
    if single.is_file():
        return read_safetensors(single)
    if not index.is_file():
        raise FileNotFoundError(f"{path}: expected model.safetensors or model.safetensors.index.json; neither exists.")
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ValueError(f"{index}: expected JSON with a 'weight_map'; got an unreadable file ({e}).") from None
    out = {}
    for shard in sorted(set(weight_map.values())):
        if not (path / shard).is_file():
            raise FileNotFoundError(f"{index} lists the shard {shard!r}; {path / shard} does not exist.")
        out.update(read_safetensors(path / shard))
    return out


def load_llama(path: str | os.PathLike, *, dtype=jnp.float32) -> LlamaModel:
    """The dense decoder of a Hugging Face Llama-format directory (``config.json`` + safetensors, one file or shards).

    Arguments:
        path: a directory as ``LlamaForCausalLM.save_pretrained`` writes it.
        dtype: parameters and compute dtype (float32, bfloat16 or float16), whatever the file holds.
    """
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: expected a directory with config.json and model.safetensors.")
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{cfg_path}: expected this model file; it is missing.")
    try:
        raw = json.loads(cfg_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{cfg_path}: expected valid JSON; the file is corrupt ({e}).") from None
    config = LlamaConfig.from_hf(raw, source=str(cfg_path))
    return LlamaModel.from_state_dict(load_tensors(path), config, source=str(path), dtype=dtype)


def save_llama(model: LlamaModel, path: str | os.PathLike) -> Path:
    """Write ``model`` as a Hugging Face directory (``config.json`` + ``model.safetensors``), which
    :func:`load_llama` and ``transformers`` read; block-sparse projections are written densely (for the pattern
    and the blocks themselves, :func:`blocksparse.save`), every parameter in its own dtype (bfloat16 included)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(model.config.to_hf(), indent=1) + "\n")
    write_safetensors(path / "model.safetensors", model.state_dict(), {"format": "pt"})
    return path


# -- generation ---------------------------------------------------------------------------------------
def left_pad(prompts, pad_id: int = 0) -> tuple[jax.Array | np.ndarray, np.ndarray]:
    """``(tokens (batch, longest) int32, pad (batch,) int32)``: the prompts right-aligned, ``pad`` slots each.

    A 2-D array is taken as prompts of one length (no padding); it may be traced (``generate`` under ``jit``).
    """
    if isinstance(prompts, np.ndarray | jax.Array) and np.ndim(prompts) == 2:  # may be traced: left as it is
        return _check_tokens(prompts), np.zeros(prompts.shape[0], np.int32)
    seqs = [list(map(int, np.asarray(p).reshape(-1))) for p in prompts]
    if not seqs or not all(seqs):
        raise ValueError("Expected at least one prompt, each of at least one token.")
    n = max(map(len, seqs))
    tokens = np.full((len(seqs), n), pad_id, np.int32)
    for i, s in enumerate(seqs):
        tokens[i, n - len(s) :] = s
    return tokens, np.asarray([n - len(s) for s in seqs], np.int32)


def generate(model: LlamaModel, prompts, max_new_tokens: int, *, cache_size: int | None = None,
             temperature: float = 0.0, top_k: int | None = None, key=None,
             eos_token_id: int | None = None) -> jax.Array:  # fmt: skip
    """Decode ``max_new_tokens`` tokens after each prompt: ``(batch, max_new_tokens)`` int32.

    One jitted program: the prefill of the prompts, then a ``lax.fori_loop`` over the new tokens against a
    cache of ``cache_size`` slots; recompiled only for a new model structure, batch, prompt length,
    ``max_new_tokens``, ``cache_size``, ``top_k`` or greedy-vs-sampled (never per token; the temperature is an
    argument, not a constant).

    Arguments:
        model: a :class:`LlamaModel`, dense or pruned.
        prompts: token ids ``(batch, length)``, or a list of sequences of different lengths (left-padded;
            padding is never attended to and positions count from each prompt's first token).
        max_new_tokens: tokens to generate per prompt (at least 1).
        cache_size: slots of the KV cache (default: the prompt length plus ``max_new_tokens``, with
            ``attention="pallas"`` rounded up to whole chunks of ``blocksparse.ops.attention.CHUNK`` slots). A
            prompt plus ``max_new_tokens`` longer than the cache, or a cache longer than
            ``max_position_embeddings``, raises before anything runs.
        temperature: ``0`` for greedy decoding (argmax); above ``0``, sampling from ``softmax(logits / T)``.
        top_k: with sampling, keep only the ``top_k`` largest logits (``None``: all).
        key: the ``jax.random`` key of sampling (required when ``temperature > 0``).
        eos_token_id: once a sequence produces it, the rest of its row is this id.
    """
    tokens, pad = left_pad(prompts)
    _positive_int("max_new_tokens", max_new_tokens)
    length = tokens.shape[1]
    need = length + max_new_tokens
    size = need if cache_size is None else cache_size
    _positive_int("cache_size", size)
    if need > size:
        raise ValueError(f"The prompt ({length} tokens) plus max_new_tokens ({max_new_tokens}) needs {need} cache "
                         f"slots; the cache holds {size}. Raise cache_size or generate fewer tokens.")  # fmt: skip
    if size > model.config.max_positions:
        raise ValueError(f"Expected cache_size <= max_position_embeddings ({model.config.max_positions}). Got "
                         f"{size} (prompt {length} + max_new_tokens {max_new_tokens}).")  # fmt: skip
    if cache_size is None and model.attention == "pallas":  # whole chunks: the kernel copies any other size
        size = -(-size // ATTENTION_CHUNK) * ATTENTION_CHUNK  # (the slots beyond are never attended to)
    if not isinstance(temperature, int | float) or isinstance(temperature, bool) or temperature < 0:
        raise ValueError(f"Expected temperature a number >= 0 (0: greedy). Got {temperature!r}.")
    sample = temperature > 0
    if top_k is not None:
        _positive_int("top_k", top_k)
        if top_k > model.config.vocab_size:
            raise ValueError(f"Expected top_k <= vocab_size ({model.config.vocab_size}). Got {top_k}.")
    if sample and key is None:
        raise ValueError("Sampling (temperature > 0) needs a key: generate(..., key=jax.random.key(0)).")
    key = jax.random.key(0) if key is None else key
    eos = -1 if eos_token_id is None else int(eos_token_id)
    return _generate(model, jnp.asarray(tokens), jnp.asarray(pad), key, jnp.float32(max(temperature, 1e-6)),
                     jnp.int32(eos), max_new_tokens=max_new_tokens, cache_size=size, sample=sample,
                     top_k=top_k)  # fmt: skip


def _pick(logits, key, temperature, sample: bool, top_k):
    """The next token of each row of ``logits (b, vocab)`` float32: argmax, or a sample."""
    if not sample:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    z = logits / temperature
    if top_k is not None:
        kth = jax.lax.top_k(z, top_k)[0][:, -1:]
        z = jnp.where(z >= kth, z, -jnp.inf)
    return jax.random.categorical(key, z, axis=-1).astype(jnp.int32)


def _decode_step(model, token, cache, slot, pad):
    """One new token per sequence at cache slot ``slot``: ``(logits (b, vocab), cache)`` (traced once per program)."""
    logits, cache = model.step(token[:, None], cache, slot, pad)
    return logits[:, 0], cache


@functools.partial(jax.jit, static_argnames=("max_new_tokens", "cache_size", "sample", "top_k"))
def _generate(model, tokens, pad, key, temperature, eos, *, max_new_tokens, cache_size, sample, top_k):
    b, length = tokens.shape
    cache = model.init_cache(b, cache_size)
    logits, cache = model.step(tokens, cache, 0, pad, last=True)
    keys = jax.random.split(key, max_new_tokens)
    first = _pick(logits[:, -1], keys[0], temperature, sample, top_k)
    out = jnp.zeros((b, max_new_tokens), jnp.int32).at[:, 0].set(first)

    def body(i, carry):
        out, cache, done = carry
        prev = out[:, i - 1]
        logits, cache = _decode_step(model, prev, cache, length + i - 1, pad)
        nxt = _pick(logits, keys[i], temperature, sample, top_k)
        nxt = jnp.where(done, eos, nxt)
        return out.at[:, i].set(nxt), cache, done | (nxt == eos)

    out, _, _ = jax.lax.fori_loop(1, max_new_tokens, body, (out, cache, first == eos))
    return out


# -- pruning ------------------------------------------------------------------------------------------
def prune_decoder(model: LlamaModel, block_size, density: float, *, scope: str = "layer",
                  targets=DECODER_PROJECTIONS, norm: str = "l2", balance: str | None = None,
                  implementation=None) -> LlamaModel:  # fmt: skip
    """Block-prune the projections of ``model`` by magnitude; a copy whose ``targets`` are ``SparseLinear``.

    Arguments:
        model: a :class:`LlamaModel` whose target projections are dense.
        block_size: ``b`` or ``(bh, bw)`` dividing every target weight ``(in, out)``.
        density: fraction of blocks kept, in ``(0, 1]``.
        scope: ``"layer"``: every projection keeps ``round(density * its blocks)`` blocks
            (:func:`blocksparse.prune.magnitude`); ``"global"``: blocks ranked across all targets
            (:func:`blocksparse.prune.magnitude_global`).
        targets: names among :data:`DECODER_PROJECTIONS`, plus ``"lm_head"`` (an untied head only); the
            others stay dense.
        norm: the block norm, ``"l2"``, ``"l1"`` or ``"max"``.
        balance: ``None``, ``"rows"`` or ``"cols"`` (:data:`blocksparse.prune.BALANCES`): every block row or column of
            each weight ``(in, out)`` keeps the same number of blocks. ``"cols"`` suits decoding: ``x @ W`` walks
            ``W``'s block columns, one program per column slice, and equal columns make every walk as long as the
            average, so no program waits on a long column (see docs/decoder.md).
        implementation: passed to each ``SparseLinear`` (``None``: the fastest available).
    """
    from .. import prune as _prune

    targets = (targets,) if isinstance(targets, str) else tuple(targets)
    allowed = (*DECODER_PROJECTIONS, "lm_head")
    if not targets or any(t not in allowed for t in targets):
        raise ValueError(f"Expected targets among {allowed}. Got {targets!r}.")
    if "lm_head" in targets and model.lm_head is None:
        raise ValueError("Expected an untied lm_head to prune. This model ties it to the embeddings "
                         "(tie_word_embeddings); drop 'lm_head' from targets.")  # fmt: skip
    density = check_density(density)
    if density == 0:
        raise ValueError(f"Expected density in (0, 1] (a fraction of each projection's blocks kept). Got {density}.")
    if scope not in ("layer", "global"):
        raise ValueError(f"Expected scope 'layer' or 'global'. Got {scope!r}.")
    _prune.check_balance(balance)
    for i, L in enumerate(model.layers):
        fused = [n for n in FUSED_PROJECTIONS if getattr(L, n) is not None]
        if fused:
            raise ValueError(f"Expected unfused projections to prune. Got layers[{i}].{fused[0]} fused; prune first, "
                             "then fuse_projections.")  # fmt: skip
    where = [(i, t) for i in range(len(model.layers)) for t in targets if t != "lm_head"]
    if "lm_head" in targets:
        where.append((None, "lm_head"))
    projs = [model.lm_head if i is None else getattr(model.layers[i], t) for i, t in where]
    names = ["lm_head" if i is None else f"layers[{i}].{t}" for i, t in where]
    for name, p in zip(names, projs, strict=True):
        if isinstance(p, _nn.SparseLinear):
            raise ValueError(f"Expected dense projections to prune. Got {name} already block-sparse.")
    weights = [jnp.asarray(p.weight, jnp.float32) for p in projs]
    if scope == "layer":
        mats = []
        for name, w in zip(names, weights, strict=True):
            bh, bw = check_block_size(w.shape, block_size)
            try:
                _prune.keep_count(density, (w.shape[0] // bh, w.shape[1] // bw), balance)
            except ValueError as e:
                raise ValueError(f"{name} ({w.shape[0]} x {w.shape[1]}): {e}") from None
            mats.append(_prune.magnitude(w, block_size, density, norm=norm, balance=balance))
    else:
        mats = _prune.magnitude_global(weights, block_size, density, norm=norm, balance=balance)
    layers = list(model.layers)
    head = model.lm_head
    for (i, t), p, W in zip(where, projs, mats, strict=True):
        sp = sparse_projection(W.astype(model.dtype), p.bias, p.activation, implementation)
        if i is None:
            head = sp
        else:
            layers[i] = layers[i]._replace(**{t: sp})
    return model._replace(layers=tuple(layers), lm_head=head)


def densified(model: LlamaModel) -> LlamaModel:
    """The same weights held by dense ``bs.nn.Linear`` layers (the reference a pruned model is checked against)."""

    def dense(p):
        return _nn.Linear(p.weight.to_dense(), p.bias, p.activation) if isinstance(p, _nn.SparseLinear) else p

    names = (*DECODER_PROJECTIONS, *FUSED_PROJECTIONS)
    layers = tuple(L._replace(**{n: dense(getattr(L, n)) for n in names if getattr(L, n) is not None})
                   for L in model.layers)  # fmt: skip
    head = None if model.lm_head is None else dense(model.lm_head)
    return model._replace(layers=layers, lm_head=head)


def block_density(model: LlamaModel) -> float:
    """The fraction of weight blocks kept over every block-sparse projection (1.0 for a dense model)."""
    kept = total = 0
    projs = [getattr(L, n) for L in model.layers for n in (*DECODER_PROJECTIONS, *FUSED_PROJECTIONS)] + [model.lm_head]
    for p in projs:
        if isinstance(p, _nn.SparseLinear):
            kept += p.weight.pattern.nnz_blocks * math.prod(p.weight.block_size)
            total += math.prod(p.weight.shape)
    return kept / total if total else 1.0


def fuse_projections(model: LlamaModel) -> LlamaModel:
    """One product for each group of projections that reads one input: ``q, k, v`` as ``qkv`` and ``gate, up``
    as ``gate_up`` (:data:`FUSED_PROJECTIONS`), the same model with fewer launches per layer.

    A group is fused where its members are all dense or all block-sparse of one block size (and one
    implementation): the weights side by side (:func:`blocksparse.concatenate` for block-sparse ones); ``qkv``'s
    output is split again; ``gate_up``'s two halves are gated, ``silu(gate) * up``, by the down product when both are
    block-sparse (``bs.matmul``'s ``input_glu``), else in ``gate_up``'s epilogue (``glu``). The
    rest of the computation is the same, so in float32 the logits agree to rounding. A group of mixed members
    stays as it is. Prune first (:func:`prune_decoder` refuses a fused model), then fuse; ``state_dict`` writes
    the members under their own names again.

    Example::

        >>> import jax, blocksparse as bs
        >>> from blocksparse.models import LlamaConfig, LlamaModel, fuse_projections, prune_decoder
        >>> cfg = LlamaConfig(vocab_size=64, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
        ...                   intermediate_size=64, max_positions=16)
        >>> m = prune_decoder(LlamaModel.random(jax.random.key(0), cfg), 16, 0.5)
        >>> f = fuse_projections(m)
        >>> f.layers[0].gate is None, type(f.layers[0].gate_up).__name__, f.layers[0].gate_up.weight.shape
        (True, 'SparseLinear', (32, 128))
    """
    layers = []
    for i, L in enumerate(model.layers):
        fields = {}
        for fused, names in FUSED_PROJECTIONS.items():
            if getattr(L, fused) is None:
                fields.update(_fuse(fused, [getattr(L, n) for n in names], names, f"layers[{i}]"))
        layers.append(L._replace(**fields))
    return model._replace(layers=tuple(layers))


def _fuse(fused: str, projs, names, where: str) -> dict:
    """``{fused: the joined layer, member: None, ...}``, or ``{}`` for members of mixed kinds."""
    acts = [p.activation for p in projs]
    want = [_ACT.get(n) for n in names]
    if acts != want:
        raise ValueError(f"{where}: expected the activations {dict(zip(names, want, strict=True))} of a Llama "
                         f"layer to fuse {fused}. Got {dict(zip(names, acts, strict=True))}.")  # fmt: skip
    if all(isinstance(p, _nn.SparseLinear) for p in projs):
        ws = [p.weight for p in projs]
        if len({w.block_size for w in ws}) > 1 or len({p.implementation for p in projs}) > 1:
            return {}
        weight, make = bs_concatenate(ws), lambda w, b: _nn.SparseLinear(w, b, projs[0].implementation, None)
    elif all(type(p) is _nn.Linear for p in projs):
        weight, make = jnp.concatenate([p.weight for p in projs], axis=1), lambda w, b: _nn.Linear(w, b, None)
    else:
        return {}
    if all(p.bias is None for p in projs):
        bias = None
    else:
        bias = jnp.concatenate([jnp.zeros(_out_features(p), weight.dtype) if p.bias is None else p.bias
                                for p in projs])  # fmt: skip
    return {fused: make(weight, bias), **dict.fromkeys(names)}


def _out_features(p) -> int:
    return p.weight.shape[1]


def _dense_weight(p) -> np.ndarray:
    """A projection's ``(in, out)`` weight as NumPy (block-sparse written densely)."""
    return np.asarray(p.weight.to_dense() if isinstance(p, _nn.SparseLinear) else p.weight)


def _unfused_weights(layer: LlamaLayer) -> dict[str, np.ndarray]:
    """Each of :data:`DECODER_PROJECTIONS` ``(in, out)`` weight, fused ones split again."""
    out = {}
    for n in DECODER_PROJECTIONS:
        p = getattr(layer, n)
        if p is not None:
            out[n] = _dense_weight(p)
    for fused, names in FUSED_PROJECTIONS.items():
        p = getattr(layer, fused)
        if p is not None:
            nh, nk, d = layer.num_heads, layer.num_kv_heads, layer.head_dim
            widths = (nh * d, nk * d, nk * d) if fused == "qkv" else (p.weight.shape[1] // 2,) * 2
            parts = np.split(_dense_weight(p), np.cumsum(widths)[:-1], axis=1)
            out.update(zip(names, parts, strict=True))
    return {n: out[n] for n in DECODER_PROJECTIONS}
