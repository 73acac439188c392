"""Prune, recover, measure: quality of a block-pruned sentence encoder against its dense original.

- :func:`quality`: mean and minimum cosine between the pruned and dense embeddings of the same
  sentences, and the Spearman correlation between the two models' pairwise similarity scores
  (all pairs of the sentences): what a retrieval or clustering user of the embeddings sees.
- :func:`distill`: recovery by distillation from the dense model's embeddings: a few hundred
  optax steps of ``jax.jit(jax.value_and_grad(loss))`` through the block-sparse layers, training
  only the sparse layers' block values (and optionally their biases and the LayerNorms).
- :func:`quality_table`: every block size x density x scope, before and after recovery.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from .. import nn as _nn
from ._bert import PROJECTIONS, BertEncoder, prune_encoder

__all__ = ["distill", "pairwise_scores", "quality", "quality_table", "spearman", "trainable", "with_trainable"]


def _ranks(x: np.ndarray) -> np.ndarray:
    """Ranks ``0 .. n-1`` of ``x``, ties sharing their average rank (as ``scipy.stats.rankdata`` - 1)."""
    order = np.argsort(x, kind="stable")
    xs = x[order]
    ranks = np.empty(len(x), np.float64)
    starts = np.flatnonzero(np.r_[True, xs[1:] != xs[:-1]])
    ends = np.r_[starts[1:], len(x)]
    for s, e in zip(starts, ends, strict=True):
        ranks[order[s:e]] = (s + e - 1) / 2.0
    return ranks


def spearman(a, b) -> float:
    """Spearman rank correlation of two 1-D samples (Pearson correlation of their average ranks)."""
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    if a.shape != b.shape or a.size < 2:
        raise ValueError(f"Expected two samples of the same size >= 2. Got sizes {a.size} and {b.size}.")
    ra, rb = _ranks(a), _ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = np.sqrt((ra * ra).sum() * (rb * rb).sum())
    return float((ra * rb).sum() / den) if den > 0 else float("nan")


def pairwise_scores(emb) -> np.ndarray:
    """Cosine similarity of every pair ``i < j`` of the rows of ``emb`` (``n (n - 1) / 2`` values)."""
    e = np.asarray(emb, np.float64)
    e = e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-12)
    i, j = np.triu_indices(len(e), 1)
    return (e @ e.T)[i, j]


def quality(dense_emb, pruned_emb) -> dict:
    """``cosine_mean``, ``cosine_min`` (row by row) and ``spearman`` (of the pairwise scores) of two embeddings."""
    d, p = np.asarray(dense_emb, np.float64), np.asarray(pruned_emb, np.float64)
    if d.shape != p.shape or d.ndim != 2:
        raise ValueError(f"Expected two (sentences, hidden) embeddings of one shape. Got {d.shape} and {p.shape}.")
    cos = (d * p).sum(1) / np.maximum(np.linalg.norm(d, axis=1) * np.linalg.norm(p, axis=1), 1e-12)
    return {"cosine_mean": float(cos.mean()), "cosine_min": float(cos.min()),
            "spearman": spearman(pairwise_scores(d), pairwise_scores(p))}  # fmt: skip


# -- trainable subset --------------------------------------------------------------------------------
def trainable(model: BertEncoder, *, biases: bool = True, norms: bool = False) -> dict[str, jax.Array]:
    """The arrays distillation trains, by name: every ``SparseLinear``'s block values (``"3.ffn_in.weight"``),
    optionally their biases (``"3.ffn_in.bias"``) and the layers' LayerNorms (``"3.attn_norm.weight"``...)."""
    out = {}
    for i, layer in enumerate(model.layers):
        for name in PROJECTIONS:
            p = getattr(layer, name)
            if isinstance(p, _nn.SparseLinear):
                out[f"{i}.{name}.weight"] = p.weight.data
                if biases and p.bias is not None:
                    out[f"{i}.{name}.bias"] = p.bias
        if norms:
            for name in ("attn_norm", "ffn_norm"):
                out[f"{i}.{name}.weight"] = getattr(layer, name).weight
                out[f"{i}.{name}.bias"] = getattr(layer, name).bias
    if not out:
        raise ValueError("Expected a model with block-sparse projections to train. Got none (prune it first).")
    return out


def with_trainable(model: BertEncoder, params: dict) -> BertEncoder:
    """``model`` with the arrays named as by :func:`trainable` replaced (works on traced values)."""
    layers = list(model.layers)
    for key, value in params.items():
        i, name, field = key.split(".")
        i = int(i)
        mod = getattr(layers[i], name)
        if field == "weight" and isinstance(mod, _nn.SparseLinear):
            mod = mod._replace(weight=mod.weight.with_data(value))
        else:
            mod = mod._replace(**{field: value})
        layers[i] = layers[i]._replace(**{name: mod})
    return model._replace(layers=tuple(layers))


def distill(student: BertEncoder, tokens: dict, targets, *, steps: int = 300, batch_size: int = 32,
            learning_rate: float = 1e-3, biases: bool = True, norms: bool = True, token_weight: float = 1.0,
            seed: int = 0, optimizer=None) -> tuple[BertEncoder, list[float]]:  # fmt: skip
    """Recover a pruned encoder by distilling the dense model.

    With ``targets`` the dense model's sentence embeddings, the loss is the mean
    ``1 - cos(student(x), target)`` over a batch. With ``targets`` the dense model itself (the
    teacher, run in the step without gradients), the loss adds ``token_weight`` times the mean over
    the real tokens of ``1 - cos`` between the student's and the teacher's last hidden states: a
    denser signal, which recovers more in the same number of steps.

    Each step draws ``batch_size`` sentences (a NumPy generator seeded by ``seed``) and runs one
    jitted ``value_and_grad`` + optax update through the block-sparse layers: one compilation for
    all steps (the batch shape is fixed; the models are arguments of the step, not constants).

    Arguments:
        student: the pruned :class:`BertEncoder`.
        tokens: ``input_ids`` and ``attention_mask`` (and optionally ``token_type_ids``) of the
            training sentences, padded to one length (``Tokenizer(..., padding="max_length")``).
        targets: ``(sentences, hidden)`` dense-model embeddings of the same sentences, or the dense
            :class:`BertEncoder`.
        steps, batch_size, learning_rate: the optimisation (optax AdamW with a cosine decay when
            ``optimizer`` is ``None``).
        biases, norms: also train the sparse layers' biases / the layers' LayerNorms.
        token_weight: weight of the token-level term (with a teacher model only).

    Returns:
        ``(student, losses)``: the recovered encoder and the loss of every step.
    """
    import optax

    ids = np.asarray(tokens["input_ids"])
    mask = np.asarray(tokens["attention_mask"])
    types = np.asarray(tokens.get("token_type_ids", np.zeros_like(ids)))
    teacher = targets if isinstance(targets, BertEncoder) else None
    if teacher is None:
        targets = np.asarray(targets, np.float32)
        if len(targets) != len(ids):
            raise ValueError(f"Expected one target per sentence. Got {len(ids)} token rows, {len(targets)} targets.")
    else:
        targets = np.zeros((len(ids), 0), np.float32)  # unused
    if ids.ndim != 2 or ids.shape != mask.shape:
        raise ValueError(f"Expected input_ids and attention_mask of one shape (sentences, length). Got {ids.shape} "
                         f"and {mask.shape}.")  # fmt: skip
    if not 1 <= batch_size <= len(ids):
        raise ValueError(f"Expected batch_size in [1, {len(ids)}] (the number of sentences). Got {batch_size}.")
    params = trainable(student, biases=biases, norms=norms)
    if optimizer is None:
        optimizer = optax.adamw(optax.cosine_decay_schedule(learning_rate, max(steps, 1)), weight_decay=0.0)
    opt_state = optimizer.init(params)

    def loss_fn(p, frozen, teacher, ids, mask, types, target):
        model = with_trainable(frozen, p)
        if teacher is None:
            return jnp.mean(1.0 - jnp.sum(model(ids, mask, types) * target, axis=-1))
        h = model.hidden_states(ids, mask, types).astype(jnp.float32)
        ht = jax.lax.stop_gradient(teacher.hidden_states(ids, mask, types)).astype(jnp.float32)
        m = mask.astype(jnp.float32)
        sentence = 1.0 - jnp.sum(_unit(_pool(h, m)) * _unit(_pool(ht, m)), axis=-1)
        per_token = 1.0 - jnp.sum(_unit(h) * _unit(ht), axis=-1)
        token = jnp.sum(per_token * m, axis=1) / jnp.maximum(m.sum(1), 1.0)
        return jnp.mean(sentence + token_weight * token)

    @jax.jit
    def step(p, opt_state, frozen, teacher, ids, mask, types, target):
        loss, g = jax.value_and_grad(loss_fn)(p, frozen, teacher, ids, mask, types, target)
        updates, opt_state = optimizer.update(g, opt_state, p)
        return optax.apply_updates(p, updates), opt_state, loss

    rng = np.random.default_rng(seed)
    losses = []
    for _ in range(steps):
        idx = rng.choice(len(ids), batch_size, replace=False)
        params, opt_state, loss = step(params, opt_state, student, teacher, ids[idx], mask[idx], types[idx],
                                       targets[idx])  # fmt: skip
        losses.append(loss)
    return with_trainable(student, params), [float(v) for v in losses]


def _pool(h, m):
    return (h * m[..., None]).sum(1) / jnp.maximum(m.sum(1), 1e-9)[:, None]


def _unit(x):
    return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def embed(model, tokens, batch_size: int = 256) -> np.ndarray:
    fn = jax.jit(lambda m, a, b, c: m(a, b, c))
    n = len(tokens["input_ids"])
    out = [np.asarray(fn(model, *(jnp.asarray(tokens[k][i : i + batch_size])
                                  for k in ("input_ids", "attention_mask", "token_type_ids"))))
           for i in range(0, n, batch_size)]  # fmt: skip
    return np.concatenate(out)


def quality_table(model: BertEncoder, train_tokens: dict, eval_tokens: dict, *, block_sizes=(16, 32, 64),
                  densities=(1 / 2, 1 / 4, 1 / 8, 1 / 16), scopes=("layer", "global"), recover=(32,),
                  recover_scopes=("layer", "global"), steps: int = 300, batch_size: int = 32,
                  learning_rate: float = 1e-3, targets: Sequence[str] = PROJECTIONS,
                  progress=None) -> list[dict]:  # fmt: skip
    """Quality of ``model`` pruned at every block size x density x scope, before and after recovery.

    Arguments:
        model: the dense encoder (the teacher and the reference).
        train_tokens: fixed-length tokens of the training sentences (distillation).
        eval_tokens: tokens of the held-out sentences (quality).
        recover: block sizes whose pruned models are also distilled (for ``recover_scopes``).
        progress: optional ``callable(str)`` told about each row.

    Returns:
        One dict per row: ``block_size``, ``density``, ``scope``, ``before`` (see :func:`quality`),
        and, where recovered, ``after``, ``loss_first``, ``loss_last``, ``train_s``.
    """
    dense_eval = embed(model, eval_tokens)
    dense_train = None
    rows = []
    for b in block_sizes:
        for d in densities:
            for scope in scopes:
                t0 = time.perf_counter()
                pruned = prune_encoder(model, b, d, scope=scope, targets=targets)
                row = {"block_size": b, "density": d, "scope": scope,
                       "before": quality(dense_eval, embed(pruned, eval_tokens))}  # fmt: skip
                if b in recover and scope in recover_scopes and steps > 0:
                    if dense_train is None:
                        dense_train = embed(model, train_tokens)
                    t1 = time.perf_counter()
                    rec, losses = distill(pruned, train_tokens, dense_train, steps=steps, batch_size=batch_size,
                                          learning_rate=learning_rate)  # fmt: skip
                    row.update(after=quality(dense_eval, embed(rec, eval_tokens)), loss_first=losses[0],
                               loss_last=float(np.mean(losses[-10:])), train_s=time.perf_counter() - t1)  # fmt: skip
                row["seconds"] = time.perf_counter() - t0
                rows.append(row)
                if progress is not None:
                    progress(format_row(row))
    return rows


def format_row(row: dict) -> str:
    b, d = row["before"], row.get("after")
    s = (f"b={row['block_size']:<3} d=1/{round(1 / row['density']):<3} {row['scope']:<6} "
         f"cos {b['cosine_mean']:.4f} (min {b['cosine_min']:.4f}) spearman {b['spearman']:.4f}")  # fmt: skip
    if d:
        s += f" -> recovered cos {d['cosine_mean']:.4f} (min {d['cosine_min']:.4f}) spearman {d['spearman']:.4f}"
    return s
