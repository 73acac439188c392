"""Where a decoding step's time goes: one generation of the 1B-class Llama under ``jax.profiler``, dense and pruned.

    PYTHONPATH=. python benchmarks/profile_generate.py --batch 1 --json $OUT/generate_trace_b1.json
    PYTHONPATH=. python benchmarks/profile_generate.py --batch 8 --layers 16 --json $OUT/generate_trace_b8.json

The model is ``blocksparse.bench.decode.LLAMA_1B`` (random weights, bf16), ``--layers`` of it; the prompts are
128 random tokens, then 128 new ones (greedy). For the dense model and for the pruned one (every projection at
``b = 64``, ``d = 1/8``, q/k/v and gate/up fused by :func:`blocksparse.models.fuse_projections`) it records:

- ``ms``: the median wall time of five jitted generations after one to compile (``compile_s``);
- from a trace of one more: ``span_ms`` (first kernel to last), ``busy_ms`` (some kernel or copy running),
  ``kernels`` and ``kernels_per_token``, ``median_gap_us`` between consecutive kernels, and ``top``, the 25
  kernels that took the most, as ``(name, launches, us per new token)``.

``busy`` close to ``span`` says the GPU never waits for the host; the ``top`` list says which kernels fill it.
``--hlo`` also writes the pruned program's optimised HLO (gzip), to look a kernel name up. GPU only.
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from blocksparse.bench._trace import busy_time, trace_events
from blocksparse.bench.decode import LLAMA_1B
from blocksparse.models import LlamaConfig, LlamaModel, fuse_projections, generate, prune_decoder

PROMPT = NEW = 128
TOP = 25


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", required=True, help="where to write the results")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--layers", type=int, default=LLAMA_1B["num_layers"])
    p.add_argument("--hlo", action="store_true", help="also write the pruned program's optimised HLO next to --json")
    return p


def profile(run, model, prompts) -> dict:
    t0 = time.perf_counter()
    jax.block_until_ready(run(model, prompts))
    compile_s = time.perf_counter() - t0
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        jax.block_until_ready(run(model, prompts))
        times.append(time.perf_counter() - t0)
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d):
            jax.block_until_ready(run(model, prompts))
        events, _ = trace_events(glob.glob(os.path.join(d, "**", "*.xplane.pb"), recursive=True)[0])
    if not events:
        raise SystemExit("the trace holds no GPU kernel: this script needs a GPU")
    per = {}
    for name, a, b in events:
        c = per.setdefault(name[:60], [0, 0.0])
        c[0] += 1
        c[1] += b - a
    top = sorted(per.items(), key=lambda kv: -kv[1][1])[:TOP]
    gaps = [events[i + 1][1] - events[i][2] for i in range(len(events) - 1)]
    return dict(compile_s=compile_s, ms=float(np.median(times)) * 1e3, span_ms=(events[-1][2] - events[0][1]) / 1e3,
                busy_ms=busy_time(events) / 1e3, kernels=len(events), kernels_per_token=len(events) / NEW,
                median_gap_us=float(np.median(gaps)),
                top=[(k, c, round(us / NEW, 2)) for k, (c, us) in top])  # fmt: skip


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    cfg = LlamaConfig(**dict(LLAMA_1B, num_layers=args.layers))
    model = LlamaModel.random(jax.random.key(0), cfg, dtype=jnp.bfloat16, scale=0.05)
    prompts = jax.random.randint(jax.random.key(1), (args.batch, PROMPT), 0, cfg.vocab_size, jnp.int32)
    run = jax.jit(lambda m, p: generate(m, p, NEW))
    out = {"script": "benchmarks/profile_generate.py", "argv": list(sys.argv[1:] if argv is None else argv),
           "device": jax.devices()[0].device_kind, "flags": os.environ.get("XLA_FLAGS", ""), "layers": args.layers,
           "batch": args.batch, "weights": "random"}  # fmt: skip
    t0 = time.perf_counter()
    pruned = fuse_projections(prune_decoder(model, 64, 1 / 8))
    out["prune_s"] = time.perf_counter() - t0
    for name, m in (("dense", model), ("pruned_fused", pruned)):
        out[name] = profile(run, m, prompts)
        print(name, json.dumps({k: v for k, v in out[name].items() if k != "top"}), flush=True)
        for row in out[name]["top"]:
            print("   ", row, flush=True)
        if name == "pruned_fused" and args.hlo:
            with gzip.open(os.path.splitext(args.json)[0] + "_hlo.txt.gz", "wt") as f:
                f.write(run.lower(m, prompts).compile().as_text())
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
