"""A BERT sentence encoder in JAX whose projections may be dense or block-sparse.

The model is a pytree (:class:`blocksparse._util.Pytree`): ``jax.jit``, ``jax.grad`` and optax see
its arrays; the configuration, the compute dtype and every sparsity pattern are static structure.
Each of the six projections of a layer (query, key, value, attention output, FFN in, FFN out) is a
``bs.nn`` layer: :class:`~blocksparse.nn.Linear` (dense) or :class:`~blocksparse.nn.SparseLinear`.
Weights use the ``(in, out)`` layout (``y = x @ W + b``), the transpose of PyTorch's.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from .. import nn as _nn
from .._checkpoint import register_checkpoint_type
from .._matrix import BlockSparseMatrix
from .._pattern import check_block_size, check_density
from .._util import Pytree

__all__ = [
    "BertConfig",
    "BertEncoder",
    "BertLayer",
    "LayerNorm",
    "ENCODER_ATTENTION",
    "PROJECTIONS",
    "RECONSTRUCT_OBJECTIVES",
    "STAGES",
    "prune_encoder",
    "prune_encoder_reconstruct",
]

#: The projections of one layer, in the order PyTorch's BERT applies them.
PROJECTIONS = ("query", "key", "value", "attn_out", "ffn_in", "ffn_out")
#: The projections grouped by the input they read, in the order a layer computes them (query, key and value
#: share the layer's input; each later one reads what the ones before it produce).
STAGES = (("query", "key", "value"), ("attn_out",), ("ffn_in",), ("ffn_out",))
#: How a layer computes its self-attention: ``"xla"`` (einsums and a softmax, which XLA fuses in part; the default)
#: or ``"cudnn"`` (``jax.nn.dot_product_attention``'s cuDNN kernel: one fused launch, the scores never written to
#: memory; an NVIDIA GPU and float16 or bfloat16 activations).
ENCODER_ATTENTION = ("xla", "cudnn")


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """The shape of a BERT encoder (the fields of a Hugging Face ``config.json`` that matter here)."""

    vocab_size: int = 30522
    hidden_size: int = 384
    num_layers: int = 6
    num_heads: int = 12
    intermediate_size: int = 1536
    max_positions: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size", "max_positions",
                     "type_vocab_size"):  # fmt: skip
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 1:
                raise ValueError(f"Expected {name} a positive integer. Got {v!r}.")
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"Expected hidden_size divisible by num_heads. Got hidden_size={self.hidden_size}, "
                f"num_heads={self.num_heads}."
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @classmethod
    def from_hf(cls, config: Mapping, *, source: str = "config.json") -> BertConfig:
        """Read a Hugging Face BERT ``config.json`` dict; anything this encoder does not implement raises."""
        checks = {"model_type": "bert", "hidden_act": "gelu", "position_embedding_type": "absolute"}
        for key, expected in checks.items():
            got = config.get(key, expected)
            if got != expected:
                raise ValueError(f"{source}: expected {key}={expected!r} (what this encoder implements). Got {got!r}.")
        names = {"vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_layers": "num_hidden_layers",
                 "num_heads": "num_attention_heads", "intermediate_size": "intermediate_size",
                 "max_positions": "max_position_embeddings", "type_vocab_size": "type_vocab_size"}  # fmt: skip
        missing = [hf for hf in names.values() if hf not in config]
        if missing:
            raise ValueError(f"{source}: expected the keys {sorted(names.values())}. Missing {missing}.")
        eps = float(config.get("layer_norm_eps", 1e-12))
        return cls(**{k: config[hf] for k, hf in names.items()}, layer_norm_eps=eps)


@dataclasses.dataclass(frozen=True)
class LayerNorm(Pytree):
    """Layer normalisation over the last axis, computed in float32, returned in the input's dtype."""

    _leaves = ("weight", "bias")
    _static = ("eps",)

    weight: jax.Array
    bias: jax.Array
    eps: float = 1e-12

    def __call__(self, x) -> jax.Array:
        x32 = x.astype(jnp.float32)
        mean = x32.mean(-1, keepdims=True)
        var = jnp.square(x32 - mean).mean(-1, keepdims=True)
        y = (x32 - mean) * jax.lax.rsqrt(var + self.eps)
        return (y * self.weight.astype(jnp.float32) + self.bias.astype(jnp.float32)).astype(x.dtype)


def _apply(layer, x) -> jax.Array:
    """``layer`` on the last axis of ``x`` (folded to 2-D for the product)."""
    y = layer(x.reshape(-1, x.shape[-1]))
    return y.reshape(*x.shape[:-1], y.shape[-1])


def dense_projection(weight, bias, activation: str | None = None) -> _nn.Linear:
    """A dense :class:`blocksparse.nn.Linear` with an ``(in, out)`` weight and the activation fused."""
    return _nn.Linear(jnp.asarray(weight), None if bias is None else jnp.asarray(bias), activation)


def sparse_projection(weight, bias, activation: str | None = None, implementation=None) -> _nn.SparseLinear:
    """A :class:`blocksparse.nn.SparseLinear` holding the :class:`~blocksparse.BlockSparseMatrix` ``weight``."""
    return _nn.SparseLinear(weight, None if bias is None else jnp.asarray(bias), implementation, activation)


def _check_attention(attention: str, dtype) -> str:
    """A known attention (:data:`ENCODER_ATTENTION`), and half-precision activations for cuDNN's."""
    if attention not in ENCODER_ATTENTION:
        raise ValueError(f"Expected attention one of {', '.join(map(repr, ENCODER_ATTENTION))}. Got {attention!r}.")
    if attention == "cudnn" and np.dtype(dtype) not in (np.dtype(jnp.float16), np.dtype(jnp.bfloat16)):
        raise ValueError(f"Expected float16 or bfloat16 activations for attention='cudnn' (model.astype). Got {dtype}.")
    return attention


@dataclasses.dataclass(frozen=True)
class BertLayer(Pytree):
    """One transformer layer: self-attention, residual + LayerNorm, GELU FFN, residual + LayerNorm (post-norm)."""

    _leaves = ("query", "key", "value", "attn_out", "attn_norm", "ffn_in", "ffn_out", "ffn_norm")
    _static = ("num_heads",)

    query: object
    key: object
    value: object
    attn_out: object
    attn_norm: LayerNorm
    ffn_in: object
    ffn_out: object
    ffn_norm: LayerNorm
    num_heads: int

    def __call__(self, x, mask_bias, taps: dict | None = None, attention: str = "xla") -> jax.Array:
        """``x (batch, length, hidden)``; ``mask_bias`` as :meth:`BertEncoder.embed` makes it; ``taps``, if a dict,
        receives each projection's input (calibration); ``attention``: :data:`ENCODER_ATTENTION`."""

        def tap(name, v):
            if taps is not None:
                taps[name] = v
            return v

        b, n, h = x.shape
        nh = self.num_heads
        hd = h // nh

        def heads(t):
            return t.reshape(b, n, nh, hd)

        tap("query", tap("key", tap("value", x)))
        q, k, v = (heads(_apply(p, x)) for p in (self.query, self.key, self.value))
        if _check_attention(attention, x.dtype) == "cudnn":
            # the padding as a boolean key mask; a sequence without real keys attends to all of them, as the
            # additive bias does (every score the same), instead of dividing by zero
            keys = (mask_bias == 0)[:, 0, 0, :]
            keys = keys | ~keys.any(axis=-1, keepdims=True)
            # cuDNN takes a mask of the scores' shape (batch, 1, queries, keys). The sequence lengths, which would
            # let it skip the tiles past each sentence's last token, made it slower at 128 tokens (H200: 124 against
            # 110 us a layer at 14 real tokens a sentence), so the mask alone says where the padding is.
            mask = jnp.broadcast_to(keys[:, None, None, :], (b, 1, n, n))
            ctx = jax.nn.dot_product_attention(q, k, v, mask=mask, implementation="cudnn").astype(x.dtype)
        else:
            scores = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32) / math.sqrt(hd)
            probs = jax.nn.softmax(scores + mask_bias, axis=-1).astype(x.dtype)
            ctx = jnp.einsum("bhqk,bkhd->bqhd", probs, v, preferred_element_type=jnp.float32).astype(x.dtype)
        x = self.attn_norm(x + _apply(self.attn_out, tap("attn_out", ctx.reshape(b, n, h))))
        return self.ffn_norm(x + _apply(self.ffn_out, tap("ffn_out", _apply(self.ffn_in, tap("ffn_in", x)))))


@dataclasses.dataclass(frozen=True)
class BertEncoder(Pytree):
    """A BERT encoder with mean pooling and L2 normalisation (a sentence-transformers model such as MiniLM).

    Call it on token ids and an attention mask of shape ``(batch, length)``; it returns float32 unit
    vectors ``(batch, hidden)``. ``dtype`` is the compute dtype of the activations (float32 or
    bfloat16; LayerNorm statistics, the softmax and the pooling always run in float32); cast the
    parameters with :meth:`astype`.

    Arguments (fields):
        word_embeddings, position_embeddings, token_type_embeddings: ``(vocab, hidden)``,
            ``(max_positions, hidden)``, ``(type_vocab, hidden)`` tables.
        embeddings_norm: the :class:`LayerNorm` after the embedding sum.
        layers: a tuple of :class:`BertLayer`.
        config: the :class:`BertConfig` (static).
        dtype: the compute dtype (static).
    """

    _leaves = ("word_embeddings", "position_embeddings", "token_type_embeddings", "embeddings_norm", "layers")
    _static = ("config", "dtype")

    word_embeddings: jax.Array
    position_embeddings: jax.Array
    token_type_embeddings: jax.Array
    embeddings_norm: LayerNorm
    layers: tuple
    config: BertConfig
    dtype: np.dtype = np.dtype(np.float32)

    def astype(self, dtype) -> BertEncoder:
        """Parameters and compute in ``dtype`` (``jnp.float32`` or ``jnp.bfloat16``; float16 works too)."""
        dtype = np.dtype(dtype)
        if not jnp.issubdtype(dtype, jnp.floating):
            raise ValueError(f"Expected a floating dtype such as float32 or bfloat16. Got {dtype}.")
        cast = jax.tree.map(lambda a: a.astype(dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a, self)
        return cast._replace(dtype=dtype)

    def embed(self, input_ids, attention_mask, token_type_ids=None) -> tuple[jax.Array, jax.Array]:
        """The first layer's input ``(batch, length, hidden)`` and the attention's additive mask bias.

        The bias is ``0`` at real keys and the float32 minimum at padded ones, shaped ``(batch, 1, 1, length)``
        for the layers (``layer(x, mask_bias)``).
        """
        input_ids, attention_mask, token_type_ids = self._check_inputs(input_ids, attention_mask, token_type_ids)
        n = input_ids.shape[1]
        x = (jnp.take(self.word_embeddings, input_ids, axis=0)
             + self.position_embeddings[:n][None]
             + jnp.take(self.token_type_embeddings, token_type_ids, axis=0))  # fmt: skip
        mask_bias = jnp.where(attention_mask.astype(bool), 0.0, jnp.finfo(jnp.float32).min)[:, None, None, :]
        return self.embeddings_norm(x.astype(self.dtype)), mask_bias

    def hidden_states(self, input_ids, attention_mask, token_type_ids=None, *, attention: str = "xla") -> jax.Array:
        """The last layer's token states ``(batch, length, hidden)`` in the compute dtype (``attention``: as
        ``__call__``)."""
        x, mask_bias = self.embed(input_ids, attention_mask, token_type_ids)
        for layer in self.layers:
            x = layer(x, mask_bias, attention=attention)
        return x

    def input_norms(self, input_ids, attention_mask, token_type_ids=None) -> list[dict[str, np.ndarray]]:
        """Calibration statistics: per layer, each projection's input RMS per feature over the real tokens.

        Runs eagerly (outside ``jit``); one dict ``{projection: (in_features,) float32}`` per layer.
        """
        x, mask_bias = self.embed(input_ids, attention_mask, token_type_ids)
        m = np.asarray(attention_mask, bool)
        out = []
        for layer in self.layers:
            taps = {}
            x = layer(x, mask_bias, taps)
            out.append({k: np.sqrt(np.mean(np.square(np.asarray(v, np.float32)[m]), axis=0)) for k, v in taps.items()})
        return out

    def __call__(self, input_ids, attention_mask, token_type_ids=None, *, attention: str = "xla") -> jax.Array:
        """Sentence embeddings: mean of the token states over ``attention_mask``, L2-normalised, float32.

        ``attention``: how the layers compute self-attention, :data:`ENCODER_ATTENTION` (``"cudnn"``: cuDNN's fused
        kernel, on an NVIDIA GPU with a half-precision model, :meth:`astype`)."""
        h = self.hidden_states(input_ids, attention_mask, token_type_ids, attention=attention).astype(jnp.float32)
        m = jnp.asarray(attention_mask).astype(jnp.float32)[..., None]
        pooled = (h * m).sum(1) / jnp.maximum(m.sum(1), 1e-9)
        norm = jnp.linalg.norm(pooled, axis=-1, keepdims=True)
        return pooled / jnp.maximum(norm, 1e-12)

    def _check_inputs(self, input_ids, attention_mask, token_type_ids):
        input_ids, attention_mask = jnp.asarray(input_ids), jnp.asarray(attention_mask)
        if input_ids.ndim != 2 or not jnp.issubdtype(input_ids.dtype, jnp.integer):
            raise ValueError(f"Expected input_ids of integers, shape (batch, length). Got {input_ids.dtype} "
                             f"{tuple(input_ids.shape)}.")  # fmt: skip
        if attention_mask.shape != input_ids.shape:
            raise ValueError(f"Expected attention_mask of the shape of input_ids {tuple(input_ids.shape)}. "
                             f"Got {tuple(attention_mask.shape)}.")  # fmt: skip
        if input_ids.shape[1] > self.config.max_positions:
            raise ValueError(f"Expected at most max_positions={self.config.max_positions} tokens per sequence. "
                             f"Got length {input_ids.shape[1]}.")  # fmt: skip
        if token_type_ids is None:
            token_type_ids = jnp.zeros_like(input_ids)
        token_type_ids = jnp.asarray(token_type_ids)
        if token_type_ids.shape != input_ids.shape:
            raise ValueError(f"Expected token_type_ids of the shape of input_ids {tuple(input_ids.shape)}. "
                             f"Got {tuple(token_type_ids.shape)}.")  # fmt: skip
        return input_ids, attention_mask, token_type_ids

    # -- construction -----------------------------------------------------------------------------------
    @classmethod
    def from_state_dict(cls, tensors: Mapping[str, np.ndarray], config: BertConfig, *, source: str = "weights",
                        dtype=jnp.float32) -> BertEncoder:  # fmt: skip
        """Build the dense encoder from a Hugging Face ``BertModel`` state dict (PyTorch names and layouts).

        A missing tensor or one of the wrong shape raises, naming it and ``source``. Parameters are
        stored in ``dtype`` (float32 by default, whatever the file holds).
        """
        c = config
        h, f = c.hidden_size, c.intermediate_size

        def get(name, shape):
            if name not in tensors:
                raise ValueError(f"{source}: expected a tensor {name!r}. It is missing (is this a BERT checkpoint?).")
            a = np.asarray(tensors[name])
            if a.shape != shape:
                raise ValueError(f"{source}: expected {name!r} of shape {shape}. Got {a.shape}.")
            if not np.issubdtype(a.dtype, np.floating):
                raise ValueError(f"{source}: expected {name!r} floating. Got {a.dtype}.")
            return jnp.asarray(a, dtype)

        prefix = "bert." if "bert.embeddings.word_embeddings.weight" in tensors else ""

        def norm(p):
            return LayerNorm(get(p + ".weight", (h,)), get(p + ".bias", (h,)), c.layer_norm_eps)

        def linear(p, n_in, n_out, activation=None):
            return dense_projection(get(p + ".weight", (n_out, n_in)).T, get(p + ".bias", (n_out,)), activation)

        layers = []
        for i in range(c.num_layers):
            p = f"{prefix}encoder.layer.{i}."
            layers.append(BertLayer(
                query=linear(p + "attention.self.query", h, h),
                key=linear(p + "attention.self.key", h, h),
                value=linear(p + "attention.self.value", h, h),
                attn_out=linear(p + "attention.output.dense", h, h),
                attn_norm=norm(p + "attention.output.LayerNorm"),
                ffn_in=linear(p + "intermediate.dense", h, f, "gelu"),
                ffn_out=linear(p + "output.dense", f, h),
                ffn_norm=norm(p + "output.LayerNorm"),
                num_heads=c.num_heads,
            ))  # fmt: skip
        e = prefix + "embeddings."
        return cls(
            word_embeddings=get(e + "word_embeddings.weight", (c.vocab_size, h)),
            position_embeddings=get(e + "position_embeddings.weight", (c.max_positions, h)),
            token_type_embeddings=get(e + "token_type_embeddings.weight", (c.type_vocab_size, h)),
            embeddings_norm=norm(e + "LayerNorm"),
            layers=tuple(layers),
            config=c,
            dtype=np.dtype(dtype),
        )

    def state_dict(self) -> dict[str, np.ndarray]:
        """The parameters under Hugging Face ``BertModel`` names, PyTorch ``(out, in)`` layout, as NumPy.

        Block-sparse projections are written densely (zeros outside the pattern).
        """
        out = {
            "embeddings.word_embeddings.weight": self.word_embeddings,
            "embeddings.position_embeddings.weight": self.position_embeddings,
            "embeddings.token_type_embeddings.weight": self.token_type_embeddings,
            "embeddings.LayerNorm.weight": self.embeddings_norm.weight,
            "embeddings.LayerNorm.bias": self.embeddings_norm.bias,
        }
        hf = {
            "query": "attention.self.query",
            "key": "attention.self.key",
            "value": "attention.self.value",
            "attn_out": "attention.output.dense",
            "ffn_in": "intermediate.dense",
            "ffn_out": "output.dense",
        }
        for i, layer in enumerate(self.layers):
            p = f"encoder.layer.{i}."
            for name, hf_name in hf.items():
                proj = getattr(layer, name)
                w = proj.weight.to_dense() if isinstance(proj, _nn.SparseLinear) else proj.weight
                out[p + hf_name + ".weight"] = jnp.asarray(w).T
                out[p + hf_name + ".bias"] = proj.bias
            for name, hf_name in (("attn_norm", "attention.output.LayerNorm"), ("ffn_norm", "output.LayerNorm")):
                out[p + hf_name + ".weight"] = getattr(layer, name).weight
                out[p + hf_name + ".bias"] = getattr(layer, name).bias
        return {k: np.ascontiguousarray(np.asarray(v)) for k, v in out.items()}

    @classmethod
    def random(cls, key, config: BertConfig, *, dtype=jnp.float32, scale: float = 0.05) -> BertEncoder:
        """A randomly initialised dense encoder (normal weights of standard deviation ``scale``)."""
        c = config
        names = [("embeddings.word_embeddings.weight", (c.vocab_size, c.hidden_size)),
                 ("embeddings.position_embeddings.weight", (c.max_positions, c.hidden_size)),
                 ("embeddings.token_type_embeddings.weight", (c.type_vocab_size, c.hidden_size))]  # fmt: skip
        h, f = c.hidden_size, c.intermediate_size
        for i in range(c.num_layers):
            p = f"encoder.layer.{i}."
            for n, (o, k) in {"attention.self.query": (h, h), "attention.self.key": (h, h),
                              "attention.self.value": (h, h), "attention.output.dense": (h, h),
                              "intermediate.dense": (f, h), "output.dense": (h, f)}.items():  # fmt: skip
                names += [(p + n + ".weight", (o, k)), (p + n + ".bias", (o,))]
        keys = jax.random.split(key, len(names))
        tensors = {n: np.asarray(scale * jax.random.normal(k, s, jnp.float32))
                   for (n, s), k in zip(names, keys, strict=True)}  # fmt: skip
        norms = ["embeddings.LayerNorm"] + [f"encoder.layer.{i}.{n}" for i in range(c.num_layers)
                                            for n in ("attention.output.LayerNorm", "output.LayerNorm")]  # fmt: skip
        for n in norms:
            tensors[n + ".weight"] = np.ones(h, np.float32)
            tensors[n + ".bias"] = np.zeros(h, np.float32)
        return cls.from_state_dict(tensors, c, source="random", dtype=dtype)


for _cls in (BertConfig, LayerNorm, BertLayer, BertEncoder):
    register_checkpoint_type(_cls, f"blocksparse.models.{_cls.__name__}")


def _check_targets(targets) -> tuple[str, ...]:
    targets = (targets,) if isinstance(targets, str) else tuple(targets)
    bad = [t for t in targets if t not in PROJECTIONS]
    if bad or not targets:
        raise ValueError(f"Expected targets among {PROJECTIONS}. Got {targets!r}.")
    return targets


@jax.jit
def _layer_taps(layer: BertLayer, x, mask_bias) -> tuple[jax.Array, dict]:
    """``layer``'s output and each projection's input (``BertLayer.__call__``'s ``taps``)."""
    taps = {}
    return layer(x, mask_bias, taps), taps


def _dense_targets(model: BertEncoder, targets) -> tuple[str, ...]:
    targets = _check_targets(targets)
    for i, layer in enumerate(model.layers):
        for t in targets:
            if isinstance(getattr(layer, t), _nn.SparseLinear):
                raise ValueError(f"Expected dense projections to prune. Got layers[{i}].{t} already block-sparse.")
    return targets


def _check_positive_density(density) -> float:
    density = check_density(density)
    if density == 0:  # every projection would keep no block: never build empty layers
        raise ValueError(f"Expected density in (0, 1] (a fraction of each projection's blocks kept). Got {density}.")
    return density


def prune_encoder(model: BertEncoder, block_size, density: float, *, scope: str = "layer",
                  targets=PROJECTIONS, norm: str = "l2", calibration=None, balance: str | None = None,
                  implementation=None) -> BertEncoder:  # fmt: skip
    """Block-prune the projections of ``model`` by magnitude; a copy whose ``targets`` are ``SparseLinear``.

    Arguments:
        model: a :class:`BertEncoder` whose target projections are dense.
        block_size: ``b`` or ``(bh, bw)`` dividing every target weight.
        density: fraction of blocks kept, in ``(0, 1]``.
        scope: ``"layer"``: every projection keeps ``round(density * its blocks)`` blocks
            (:func:`blocksparse.prune.magnitude`); ``"global"``: blocks are ranked across all the
            target projections of all layers (:func:`blocksparse.prune.magnitude_global`), so the
            overall density is ``density`` and each projection's varies.
        targets: which projections to prune (names of :data:`PROJECTIONS`); the others stay dense.
        norm: the block norm, ``"l2"``, ``"l1"`` or ``"max"``.
        calibration: ``None`` (rank blocks by the weights' magnitude) or the output of
            :meth:`BertEncoder.input_norms` on calibration sentences: blocks are then ranked by the
            norm of ``diag(input RMS) @ W`` (activation-aware, as Wanda does per weight), so a
            weight row fed by a large activation counts more. The kept values are ``W``'s.
        balance: ``None`` (default), ``"rows"`` or ``"cols"``: every block row (column) of a
            projection keeps the same number of blocks (see :func:`blocksparse.prune.magnitude`;
            ``"cols"`` evens the work units of the ``x @ W`` kernels).
        implementation: passed to each ``SparseLinear`` (``None``: the fastest available).

    A density that keeps no block of some projection raises (an empty projection is never made).
    """
    from .. import prune as _prune

    targets = _dense_targets(model, targets)
    density = _check_positive_density(density)
    _prune.check_balance(balance)
    if scope not in ("layer", "global"):
        raise ValueError(f"Expected scope 'layer' or 'global'. Got {scope!r}.")
    where = [(i, t) for i in range(len(model.layers)) for t in targets]
    projs = [getattr(model.layers[i], t) for i, t in where]
    weights = [np.asarray(p.weight, np.float32) for p in projs]
    scored = weights
    if calibration is not None:
        if len(calibration) != len(model.layers):
            raise ValueError(f"Expected calibration for {len(model.layers)} layers. Got {len(calibration)}.")
        scored = []
        for (i, t), w in zip(where, weights, strict=True):
            s = np.asarray(calibration[i][t], np.float32)
            if s.shape != (w.shape[0],):
                raise ValueError(f"Expected calibration[{i}][{t!r}] of shape ({w.shape[0]},). Got {s.shape}.")
            scored.append(w * s[:, None])
    if scope == "layer":
        mats = []
        for (i, t), w in zip(where, scored, strict=True):
            bh, bw = check_block_size(w.shape, block_size)
            try:
                _prune.keep_count(density, (w.shape[0] // bh, w.shape[1] // bw), balance)
            except ValueError as e:
                raise ValueError(f"layers[{i}].{t} ({w.shape[0]} x {w.shape[1]}): {e}") from None
            mats.append(_prune.magnitude(w, block_size, density, norm=norm, balance=balance))
    else:
        mats = _prune.magnitude_global(scored, block_size, density, norm=norm, balance=balance)
    if calibration is not None:  # the pattern of the scores, the values of the weights
        mats = [BlockSparseMatrix.from_mask(W.pattern.mask(), w, W.block_size)
                for W, w in zip(mats, weights, strict=True)]  # fmt: skip
    dtype = model.word_embeddings.dtype
    layers = list(model.layers)
    for (i, t), p, W in zip(where, projs, mats, strict=True):
        sp = sparse_projection(W.astype(dtype), p.bias, p.activation, implementation)
        layers[i] = layers[i]._replace(**{t: sp})
    return model._replace(layers=tuple(layers))


#: Values of ``prune_encoder_reconstruct(objective=)``: what each projection's re-fit reproduces.
RECONSTRUCT_OBJECTIVES = ("own", "dense", "residual")


def prune_encoder_reconstruct(model: BertEncoder, calibration: Mapping, block_size, density: float, *,
                              targets=PROJECTIONS, damp: float = 0.01, balance: str | None = None,
                              objective: str = "residual", refit_bias: bool = True, method: str | None = None,
                              implementation=None) -> BertEncoder:  # fmt: skip
    """Block-prune ``model`` by reconstruction, layer after layer, each projection calibrated on the pruned model.

    Every target projection ``y = x @ W + c`` is replaced by :func:`blocksparse.prune.reconstruct` of its
    weight on its own inputs ``x`` over the real tokens of ``calibration``: the blocks that keep
    its output closest to a target (``objective``), with re-fitted values. The inputs are those of the
    model pruned so far: the layers run in order, and within a layer the projections in :data:`STAGES`
    order (query, key and value on the layer's input; the attention output on the context the pruned
    query, key and value give; the FFN's input after the pruned attention; its output on the pruned FFN
    input's GELU), so each projection compensates for the errors of those before it, not just its own.

    The target of the projection (``y_calib``; with ``x_d`` the input the *dense* model gives it):

    - ``"own"``: ``x @ W``, its own output on the pruned model's inputs (the projection is pruned as if
      alone: an error made before it passes through);
    - ``"dense"``: ``x_d @ W``, what the dense model computes there, so every projection also undoes the
      error of those before it;
    - ``"residual"`` (default): as ``"dense"``, and the attention and FFN outputs, which are added to the
      residual stream before a LayerNorm, reproduce the dense model's *sum*: ``r_d + x_d @ W - r`` with
      ``r`` (``r_d``) the residual input of the pruned (dense) model, so that they also repair the stream.

    What each option does to all-MiniLM-L6-v2's quality is measured in docs/models.md ("The dense model as the
    target", from ``benchmarks/results/model_reconstruct_objective_cpu.json``).

    Arguments:
        model: a :class:`BertEncoder` whose target projections are dense.
        calibration: tokens of calibration sentences: ``input_ids`` and ``attention_mask`` (and
            optionally ``token_type_ids``), ``(sentences, length)``, as the tokenizer returns them.
            Their real tokens are the rows of every projection's calibration inputs; fewer rows than
            a projection's input features are fine with ``damp > 0``, but the re-fit then matches
            the calibration tokens more than unseen ones: give several times as many real tokens as
            the widest projection has inputs (all-MiniLM-L6-v2: 2,000 sentences, 27,652 tokens,
            against 1,536 for ``ffn_out``; 128 sentences fall far short of them, see docs/models.md).
        block_size: ``b`` or ``(b_in, b_out)`` dividing every target weight ``(in, out)``.
        density: fraction of each projection's blocks kept, in ``(0, 1]``.
        targets: which projections to prune (names of :data:`PROJECTIONS`); the others stay dense.
        damp, balance: passed to :func:`blocksparse.prune.reconstruct`.
        method: passed to :func:`blocksparse.prune.reconstruct`; ``None`` (default): ``"greedy"``, or
            ``"sequential"`` with ``balance="rows"`` (which greedy does not take). Greedy chooses better blocks
            for about three times the pruning time.
        objective: ``"residual"`` (default), ``"dense"`` or ``"own"`` (see above; :data:`RECONSTRUCT_OBJECTIVES`).
        refit_bias: re-fit each projection's bias with its weight (default ``True``): least squares with a free
            intercept, i.e. :func:`~blocksparse.prune.reconstruct` on the inputs and targets less their means
            ``m_x`` and ``m_y`` over the calibration tokens, then ``c' = c + m_y - m_x @ W'``; ``False`` keeps ``c``.
        implementation: passed to each ``SparseLinear``.

    A problem with one projection (a density that keeps no block, NaN or inf in its inputs, a
    Hessian that is not positive definite) raises an error naming it (``layers[2].ffn_out``).
    """
    from .. import prune as _prune

    targets = _dense_targets(model, targets)
    density = _check_positive_density(density)
    _prune.check_balance(balance)
    if objective not in RECONSTRUCT_OBJECTIVES:
        raise ValueError(f"Expected objective in {RECONSTRUCT_OBJECTIVES}. Got {objective!r}.")
    if method is None:
        method = "sequential" if balance == "rows" else "greedy"
    if not isinstance(refit_bias, bool):
        raise TypeError(f"Expected refit_bias True or False. Got {refit_bias!r}.")
    if not isinstance(calibration, Mapping) or not {"input_ids", "attention_mask"} <= set(calibration):
        raise TypeError(
            "Expected calibration as the tokenizer's dict with 'input_ids' and 'attention_mask'. Got "
            + (f"keys {sorted(calibration)}." if isinstance(calibration, Mapping) else f"{type(calibration).__name__}.")
        )
    mask = calibration["attention_mask"]
    x, mask_bias = model.embed(calibration["input_ids"], mask, calibration.get("token_type_ids"))
    real = jnp.asarray(np.flatnonzero(np.asarray(mask, bool)))  # the real tokens, as rows of (batch * length, .)
    dtype = model.word_embeddings.dtype
    layers = list(model.layers)
    x_dense = x  # the dense model's stream (objective "dense" and "residual")

    def rows_of(v):
        return v.reshape(-1, v.shape[-1])[real].astype(jnp.float32)

    for i, layer in enumerate(layers):
        if objective != "own":
            x_dense_next, taps_dense = _layer_taps(layer, x_dense, mask_bias)
        twin = layer  # the pruned weights held densely: the same activations, one compiled program for every layer
        for stage in STAGES:
            names = [t for t in stage if t in targets]
            if not names:
                continue
            _, taps = _layer_taps(twin, x, mask_bias)  # this stage's inputs, given the projections pruned before it
            for t in names:
                p = getattr(layer, t)
                rows = rows_of(taps[t])
                y = None  # the target of x @ W' (the bias aside): by default x @ W
                if objective != "own":
                    y = _matmul_highest(rows_of(taps_dense[t]), p.weight)
                    if objective == "residual" and t in _RESIDUAL_OF:  # the stream it is added to, as the dense one
                        y = y + rows_of(taps_dense[_RESIDUAL_OF[t]]) - rows_of(taps[_RESIDUAL_OF[t]])
                if refit_bias:  # a free intercept: fit the centred inputs to the centred targets
                    if y is None:
                        y = _matmul_highest(rows, p.weight)
                    m_x, m_y = jnp.mean(rows, axis=0), jnp.mean(y, axis=0)
                    rows, y = rows - m_x, y - m_y
                try:
                    W = _prune.reconstruct(p.weight, rows, block_size, density, damp=damp, balance=balance, y_calib=y,
                                           method=method)  # fmt: skip
                except ValueError as e:
                    raise ValueError(f"layers[{i}].{t} ({p.in_features} x {p.out_features}): {e}") from None
                bias = p.bias
                if refit_bias:
                    old = 0.0 if p.bias is None else p.bias.astype(jnp.float32)
                    bias = (old + m_y - _matmul_highest(m_x[None], W.to_dense())[0]).astype(dtype)
                W = W.astype(dtype)
                layer = layer._replace(**{t: sparse_projection(W, bias, p.activation, implementation)})
                twin = twin._replace(**{t: dense_projection(W.to_dense(), bias, p.activation)})
        layers[i] = layer
        x, _ = _layer_taps(twin, x, mask_bias)
        if objective != "own":
            x_dense = x_dense_next
    return model._replace(layers=tuple(layers))


#: The residual input of the projections whose output is added to the stream, named by the projection it feeds.
_RESIDUAL_OF = {"attn_out": "query", "ffn_out": "ffn_in"}


@jax.jit
def _matmul_highest(x, w) -> jax.Array:
    return jnp.matmul(x, jnp.asarray(w, jnp.float32), precision=jax.lax.Precision.HIGHEST)
