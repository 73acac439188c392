"""The JAX all-MiniLM-L6-v2 encoder against sentence-transformers, on the same weights (GPU machine).

    PYTHONPATH=. python benchmarks/check_minilm.py --weights .cache/minilm-fp16 --json OUT.json \\
        --fixture-out tests/fixtures/minilm_reference

1. Loads the weights directory twice: ``sentence_transformers.SentenceTransformer(DIR)`` (PyTorch,
   float32, TF32 off) and :func:`blocksparse.models.minilm.load` (JAX, float32,
   ``jax.default_matmul_precision("highest")``).
2. Embeds 200 held-out corpus sentences with both; every cosine must be >= 0.9999 (min and mean
   reported). Also compares the token ids of both tokenizers, and the bf16 JAX encoder's cosines.
3. Writes the reference fixture of the CPU test (``--fixture-out``): 16 sentences, their token ids
   and attention mask (int32), the sentence-transformers embeddings (float32) and ``meta.json``
   (the weights' dtype, so the CPU test rounds its weights the same way).

With ``--speed``, a second cell times the encoder as the model suite does (bf16, 256 sentences x 128 tokens) beside
sentence-transformers in float16 on the same GPU, in the same process: torch's forward (``torch_fp16_ms``, CUDA
events around ``iters`` calls), the dense JAX encoder with the einsums' attention and with cuDNN's, and each pruned
encoder of ``--pruned`` (per-layer block magnitude, ``balance="cols"``) with both attentions (``{name}_loop_ms``,
``{name}_calls_ms``; ``{name}_vs_torch``: torch's time over the back-to-back calls', ``_loop_vs_torch`` over the
loop's, ``_vs_dense_xla`` and ``_vs_dense_cudnn`` loop over loop; > 1 faster), and the dense
encoders' embeddings against torch's (``{name}_cosine_min_vs_torch``, which must be >= 0.999).

    PYTHONPATH=. python benchmarks/check_minilm.py --weights .cache/minilm-fp16 --json OUT.json --speed

The result is one cell of ``blocksparse bench --json``'s layout (``--json``; two with ``--speed``); exit status 0
when every cosine passes, 1 otherwise (the cell failed). No network: everything loads from ``--weights``
(write it with ``python -m blocksparse.models export-fp16 DIR``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
from peers import require_torch, torch_time

from blocksparse.bench import Cell, CellFailed, Timer, run_cells

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # torch allocates on the same GPU

THRESHOLD = 0.9999


def main(argv=None) -> int:
    """One cell, run by :func:`blocksparse.bench.run_cells` (the table and the JSON of ``blocksparse bench``)."""
    args = _parser().parse_args(argv)
    params = dict(weights=str(args.weights), sentences=args.sentences, threshold=THRESHOLD)
    cells = [Cell("minilm-peers", "JAX MiniLM vs sentence-transformers", params, lambda timer: check(args))]
    if args.speed:
        speed = dict(weights=str(args.weights), batch=args.batch, length=LENGTH, pruned=list(args.pruned),
                     iters=args.iters, trials=args.trials)  # fmt: skip
        cells.append(Cell("minilm-peers", "encoder speed vs sentence-transformers fp16", speed,
                          lambda timer: speed_cell(args)))  # fmt: skip
    meta = dict(script="benchmarks/check_minilm.py", argv=list(sys.argv[1:] if argv is None else argv))
    return run_cells(cells, full=True, json_path=args.json, timer=Timer(iters=1, trials=1), meta=meta)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--weights", required=True, help="sentence-transformers directory (fp16 or fp32 safetensors)")
    p.add_argument("--json", required=True, help="where to write the results")
    p.add_argument("--fixture-out", default=None, help="directory for the CPU test's reference fixture")
    p.add_argument("--sentences", type=int, default=200)
    p.add_argument("--fixture-sentences", type=int, default=16)
    p.add_argument("--speed", action="store_true", help="also time the encoder against sentence-transformers fp16")
    p.add_argument("--batch", type=int, default=256, help="--speed: sentences (each padded to 128 tokens)")
    p.add_argument("--pruned", nargs="*", default=["32:0.125", "32:0.25"],
                   help="--speed: pruned encoders, block:density (balance='cols')")  # fmt: skip
    p.add_argument("--iters", type=int, default=50, help="--speed: calls per timed loop")
    p.add_argument("--trials", type=int, default=5, help="--speed: timed loops (the median)")
    return p


LENGTH = 128  # --speed: tokens per sentence (padded), as the model suite's speed cells


def speed_cell(args) -> dict:
    """The ``--speed`` cell: torch fp16 and the JAX encoders (dense and pruned, both attentions) on the same tokens."""
    import dataclasses

    import jax
    import jax.numpy as jnp

    torch = require_torch()
    from sentence_transformers import SentenceTransformer

    from blocksparse.bench import model as suite
    from blocksparse.models import prune_encoder

    sizes = dataclasses.replace(suite.SIZES["full"], speed_batch=args.batch, speed_length=LENGTH)
    ctx = suite._Context(sizes, str(args.weights), allow_random=False)
    ids, mask = ctx.speed_tokens["input_ids"], ctx.speed_tokens["attention_mask"]
    doc = dict(
        batch=int(ids.shape[0]), length=int(ids.shape[1]), real_tokens_mean=float(np.asarray(mask).mean() * LENGTH)
    )

    st = SentenceTransformer(str(args.weights), device="cuda").half().eval()
    features = {"input_ids": torch.as_tensor(np.asarray(ids), dtype=torch.long, device="cuda"),
                "attention_mask": torch.as_tensor(np.asarray(mask), dtype=torch.long, device="cuda"),
                "token_type_ids": torch.zeros(ids.shape, dtype=torch.long, device="cuda")}  # fmt: skip

    def torch_forward():
        with torch.inference_mode():
            return st.forward(dict(features))["sentence_embedding"]

    theirs = torch_forward().float().cpu().numpy()
    theirs = theirs / np.linalg.norm(theirs, axis=1, keepdims=True)
    t = torch_time(torch_forward, iters=args.iters, trials=args.trials)
    doc.update(torch_fp16_ms=t["peer_ms"], torch_fp16_mem_bytes=t["peer_mem_bytes"])

    timer = Timer(iters=args.iters, trials=args.trials)
    models = {"dense": ctx.speed_model}
    for spec in args.pruned:
        b, d = spec.split(":")
        pruned = prune_encoder(ctx.model, int(b), float(d), balance="cols").astype(jnp.bfloat16)
        models[f"b{b}_d1_{round(1 / float(d))}_cols"] = pruned
    for name, model in models.items():
        for att in ("xla", "cudnn"):
            fn = suite._encoder_fn(att)
            key = f"{name}_{att}"
            doc[key + "_loop_ms"] = timer.loop(fn, model, ids, mask)
            doc[key + "_calls_ms"] = timer.calls(fn, model, ids, mask)
            if name == "dense":
                ours = np.asarray(jax.jit(fn)(model, ids, mask))
                doc[key + "_cosine_min_vs_torch"] = cos = float(np.min(np.sum(ours * theirs, axis=1)))
                if not cos >= 0.999:
                    raise CellFailed(f"{key} against sentence-transformers fp16: expected cosine >= 0.999; got {cos}")
            else:  # against the same pruned weights held densely (the model suite's check)
                doc[key + "_cosine_min_vs_densified"] = suite._cosine_vs_densified(model, ids, mask, att, 0.99)
            # torch's eager calls between CUDA events against JAX's back-to-back jitted calls (and its loop)
            doc[key + "_vs_torch"] = doc["torch_fp16_ms"] / doc[key + "_calls_ms"]
            doc[key + "_loop_vs_torch"] = doc["torch_fp16_ms"] / doc[key + "_loop_ms"]
            print(f"{key}: {doc[key + '_loop_ms']:.3f} ms (calls {doc[key + '_calls_ms']:.3f}), "
                  f"{doc[key + '_vs_torch']:.2f}x torch fp16 ({doc['torch_fp16_ms']:.3f} ms)", flush=True)  # fmt: skip
    for key in [k[: -len("_loop_ms")] for k in doc if k.endswith("_loop_ms")]:
        doc[key + "_vs_dense_xla"] = doc["dense_xla_loop_ms"] / doc[key + "_loop_ms"]
        doc[key + "_vs_dense_cudnn"] = doc["dense_cudnn_loop_ms"] / doc[key + "_loop_ms"]
    doc["implementation"] = "minilm (JAX, bf16) vs sentence-transformers (torch, fp16)"
    return doc


def check(args) -> dict:
    """Both encoders on the held-out sentences: the metrics; :class:`CellFailed` below :data:`THRESHOLD`."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

    import jax
    import jax.numpy as jnp

    torch = require_torch()
    from safetensors.numpy import load_file
    from sentence_transformers import SentenceTransformer

    from blocksparse.models import corpus, minilm

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = "cuda" if torch.cuda.is_available() else "cpu"
    weights = Path(args.weights)
    stored = {str(v.dtype) for v in load_file(weights / "model.safetensors").values() if v.dtype.kind == "f"}
    sentences = corpus.sentences("heldout", args.sentences)
    doc = dict(weights=str(weights), weights_dtype=sorted(stored), sentences=len(sentences), device=device,
               jax_device=str(jax.devices()[0]), threshold=THRESHOLD)  # fmt: skip

    t0 = time.perf_counter()
    st = SentenceTransformer(str(weights), device=device)
    st = st.float()
    want = st.encode(sentences, batch_size=64, convert_to_numpy=True, normalize_embeddings=False)
    doc["st_seconds"] = time.perf_counter() - t0
    doc["st_max_seq_length"] = int(st.max_seq_length)

    model, tok = minilm.load(weights), minilm.load_tokenizer(weights, max_length=int(st.max_seq_length))
    t = tok(sentences)
    ours = [list(map(int, r[m.astype(bool)])) for r, m in zip(t["input_ids"], t["attention_mask"], strict=True)]
    theirs = [list(map(int, r)) for r in st.tokenize(sentences)["input_ids"]]
    theirs = [[i for i in r if i != 0] for r in theirs]
    doc["token_ids_equal"] = ours == theirs
    t0 = time.perf_counter()
    with jax.default_matmul_precision("highest"):
        got = minilm.encode(model, tok, sentences, batch_size=64)
    doc["jax_seconds"] = time.perf_counter() - t0
    cos = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    doc.update(cosine_min=float(cos.min()), cosine_mean=float(cos.mean()), max_abs_diff=float(np.abs(got - want).max()),
               norm_st_min=float(np.linalg.norm(want, axis=1).min()))  # fmt: skip
    bf16 = minilm.encode(model.astype(jnp.bfloat16), tok, sentences, batch_size=64)
    cb = (bf16 * want).sum(1) / np.linalg.norm(want, axis=1)
    doc.update(bf16_cosine_min=float(cb.min()), bf16_cosine_mean=float(cb.mean()))
    doc["ok"] = bool(cos.min() >= THRESHOLD)

    if args.fixture_out:
        out = Path(args.fixture_out)
        out.mkdir(parents=True, exist_ok=True)
        few = sentences[: args.fixture_sentences]
        ft = minilm.load_tokenizer(weights)(few)
        emb = st.encode(few, convert_to_numpy=True, normalize_embeddings=False).astype(np.float32)
        np.save(out / "input_ids.npy", ft["input_ids"].astype(np.int32))
        np.save(out / "attention_mask.npy", ft["attention_mask"].astype(np.int32))
        np.save(out / "embeddings.npy", emb)
        meta = dict(sentences=few, weights_dtype=sorted(stored), torch=torch.__version__, device=device,
                    source="sentence-transformers " + _version("sentence_transformers"))  # fmt: skip
        (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
        doc["fixture"] = str(out)
        doc["fixture_bytes"] = sum(f.stat().st_size for f in out.iterdir())

    print(("PASS" if doc["ok"] else "FAIL") + f": min cosine {doc['cosine_min']:.6f} (threshold {THRESHOLD}), "
          f"mean {doc['cosine_mean']:.6f}; token ids equal: {doc['token_ids_equal']}")  # fmt: skip
    if not doc["ok"]:
        raise CellFailed(f"expected every cosine >= {THRESHOLD}; got min {doc['cosine_min']:.6f}")
    doc["implementation"] = "minilm (JAX) vs sentence-transformers (torch)"
    return doc


def _version(name: str) -> str:
    from importlib.metadata import version

    try:
        return version(name)
    except Exception:  # noqa: BLE001
        return "?"


if __name__ == "__main__":
    sys.exit(main())
