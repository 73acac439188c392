"""Where the bf16 MiniLM encoder's time goes on a GPU: each kernel's time per call, from a profiler trace.

The model suite's encoder cells (256 sentences x 128 tokens, bf16) under ``jax.profiler``: for the dense encoder
and the pruned ones (per-layer block magnitude, ``balance="cols"``), with the einsums' attention (``xla``) and
cuDNN's fused one (``cudnn``), the span of one call inside the Timer's jitted loop (device time), the time some
kernel ran, each kernel's time per call, the embeddings' minimum cosine to the same model's with the einsums, and what
the first call of ``jax.jit`` pays: ``lower_s`` (tracing and lowering) and ``compile_s`` (compiling, then one call).
``cudnn-lengths`` is cuDNN's attention also given the sequence lengths, which let it skip the tiles past each
sentence's last token (the speed sentences have 14 real tokens on average, padded to 128).

    BLOCKSPARSE_MINILM_WEIGHTS=DIR python benchmarks/trace_encoder.py --json encoder_trace.json
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import sys
import time

import jax
import jax.numpy as jnp


def _with_lengths():
    """``jax.nn.dot_product_attention`` also given the sequence lengths (the ``cudnn-lengths`` variant): each
    sentence's last real token + 1, from the encoder's key mask, so cuDNN may skip the tiles past it."""
    real = jax.nn.dot_product_attention

    def f(q, k, v, *args, mask=None, **kw):
        keys = mask[:, 0, 0, :]
        n = keys.shape[-1]
        lengths = (n - jnp.argmax(keys[:, ::-1], axis=-1)).astype(jnp.int32)
        return real(q, k, v, *args, mask=mask, query_seq_lengths=lengths, key_value_seq_lengths=lengths, **kw)

    return real, f


def main(argv=None) -> int:
    import numpy as np

    from blocksparse import hardware
    from blocksparse.bench import Timer, write_json
    from blocksparse.bench import model as suite
    from blocksparse.bench._trace import trace_loop
    from blocksparse.models import prune_encoder

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pruned", nargs="*", default=["32:0.125", "32:0.25"], help="block:density, balance='cols'")
    p.add_argument("--attention", nargs="+", default=["xla", "cudnn", "cudnn-lengths"],
                   choices=["xla", "cudnn", "cudnn-lengths"])  # fmt: skip
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--json")
    a = p.parse_args(argv)
    if not hardware.current().is_gpu:
        print(f"needs a GPU (default device: {hardware.current().platform})", file=sys.stderr)
        return 2
    sizes = dataclasses.replace(suite.SIZES["full"], speed_batch=a.batch)
    ctx = suite._Context(sizes, os.environ.get(suite.ENV_WEIGHTS), allow_random=False)
    ids, mask = ctx.speed_tokens["input_ids"], ctx.speed_tokens["attention_mask"]
    lengths = np.asarray(mask).sum(1)
    models = {"dense": ctx.speed_model}
    for spec in a.pruned:
        b, d = spec.split(":")
        models[f"b={b} d=1/{round(1 / float(d))} cols"] = prune_encoder(ctx.model, int(b), float(d), balance="cols")
    timer = Timer(iters=a.iters, trials=1)
    out = {"meta": {"device": jax.devices()[0].device_kind, "jax": jax.__version__, "batch": a.batch,
                    "length": int(ids.shape[1]), "mean_tokens": float(lengths.mean()),
                    "max_tokens": int(lengths.max())}, "results": {}}  # fmt: skip
    print(out["meta"], flush=True)
    for name, model in models.items():
        model = model.astype(jnp.bfloat16)
        ref = None  # this model's embeddings with the einsums' attention: the xla variant's, or computed once
        for att in a.attention:
            real, patched = _with_lengths()
            if att == "cudnn-lengths":
                jax.nn.dot_product_attention = patched
            try:
                fn = functools.partial(suite._encode, attention=att.split("-")[0])
                t0 = time.perf_counter()
                lowered = jax.jit(fn).lower(model, ids, mask)
                t1 = time.perf_counter()
                emb = np.asarray(lowered.compile()(model, ids, mask))
                compile_s = {"lower_s": t1 - t0, "compile_s": time.perf_counter() - t1}
                t = trace_loop(fn, (model, ids, mask), timer, a.iters)
            except Exception as e:  # noqa: BLE001 - recorded, the other variants still run
                out["results"][f"{name} {att}"] = {"error": f"{type(e).__name__}: {e}"[:500]}
                print(name, att, "failed:", e, flush=True)
                continue
            finally:
                jax.nn.dot_product_attention = real
            if "error" in t:
                out["results"][f"{name} {att}"] = t
                print(name, att, t, flush=True)
                continue
            if att == "xla":
                ref = emb
            elif ref is None:
                ref = np.asarray(jax.jit(suite._encode)(model, ids, mask))
            cos = float(np.min(np.sum(emb * ref, axis=1)))
            events = dict(list(t["events"].items())[:30])
            row = {"span_us": t["span_us"], "busy_us": t["busy_us"], "min_cosine_vs_einsums": cos, **compile_s,
                   "events": events}  # fmt: skip
            out["results"][f"{name} {att}"] = row
            first = f"lowered in {compile_s['lower_s']:.1f} s, compiled and run in {compile_s['compile_s']:.1f} s"
            print(
                f"{name} {att}: span {t['span_us']:.0f} us, busy {t['busy_us']:.0f} us, cos {cos:.5f}; {first}",
                flush=True,
            )
            for k, (c, us) in list(events.items())[:12]:
                print(f"    {us:8.1f} us  x{c:4.1f}  {k[:90]}", flush=True)
            if a.json:  # after every variant: a run cut short keeps what it measured
                write_json(a.json, out)
    return 1 if any("error" in r for r in out["results"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
