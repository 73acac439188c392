"""The JAX Llama decoder against transformers' ``LlamaForCausalLM``, on the same random weights (GPU machine).

    PYTHONPATH=. python benchmarks/check_llama.py --json OUT.json            # small config, batch 1 timings
    PYTHONPATH=. python benchmarks/check_llama.py --full --json OUT.json     # + the 1B-class config's timings

1. ``agree`` cells (one per configuration: grouped-query attention with untied embeddings and the default
   rotary embedding; one KV head, tied embeddings and Llama 3's rope scaling): a random-initialised
   ``transformers.LlamaConfig`` (built from :meth:`blocksparse.models.LlamaConfig.to_hf`), saved with
   ``save_pretrained`` (safetensors, sharded) to a temporary directory and loaded by both. Logits on random
   prompts: float32 (TF32 off, ``jax.default_matmul_precision("highest")``) within 2e-4 relative; bfloat16
   within twice transformers' own bfloat16 error against its float32 logits (plus 1e-2). Greedy tokens (32
   new) in float32 must equal transformers' ``generate``, except at a near-tie of its logits.
2. ``speed`` cells, batch 1, bfloat16: tokens/s of transformers' eager model (``generate``, greedy,
   timed with CUDA events) and of :func:`blocksparse.models.generate` (one jitted program,
   :class:`blocksparse.bench.Timer`), dense and pruned (b = 64, d = 1/8, every projection), in the same run.
   Small config by default; ``--full`` adds the 1B-class config of ``blocksparse bench --suite decode --full``
   (128-token prompt, 128 new tokens).

Random weights throughout (said in each row). The results are cells of ``blocksparse bench --json``'s layout;
exit status 0 when every cell agrees, 1 otherwise. No network.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
import time

import numpy as np
from peers import require_torch, torch_time

from blocksparse.bench import Cell, CellFailed, Timer, run_cells

SMALL = dict(vocab_size=1024, hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=4, intermediate_size=512,
             max_positions=512)  # fmt: skip
TIED_LLAMA3 = dict(SMALL, num_kv_heads=1, tie_word_embeddings=True,
                   rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                     original_max_position_embeddings=64))  # fmt: skip
F32_TOL = 2e-4


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    # torch and JAX share the GPU: JAX preallocates this fraction (not its default 75%) when it first runs.
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.6")
    from blocksparse.bench.decode import LLAMA_1B

    cells = [
        Cell("llama-peers", "agree: GQA, untied, default rope [random weights]", dict(SMALL, kind="agree"),
             functools.partial(agree, SMALL, args)),
        Cell("llama-peers", "agree: 1 KV head, tied, llama3 rope [random weights]", dict(TIED_LLAMA3, kind="agree"),
             functools.partial(agree, TIED_LLAMA3, args)),
        Cell("llama-peers", "speed batch=1 small [random weights]", dict(SMALL, kind="speed", prompt=32, new=32),
             functools.partial(speed, SMALL, 32, 32)),
    ]  # fmt: skip
    if args.full:
        params = dict(LLAMA_1B, kind="speed", prompt=128, new=128)
        cells.append(Cell("llama-peers", "speed batch=1 1B-class [random weights]", params,
                          functools.partial(speed, LLAMA_1B, 128, 128)))  # fmt: skip
    meta = dict(script="benchmarks/check_llama.py", argv=list(sys.argv[1:] if argv is None else argv))
    return run_cells(cells, full=True, json_path=args.json, timer=Timer(iters=args.iters, trials=3), meta=meta)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", required=True, help="where to write the results")
    p.add_argument("--full", action="store_true", help="also time the 1B-class config")
    p.add_argument("--iters", type=int, default=3, help="generations per timed trial")
    return p


def _hf_model(fields: dict, torch, dtype, directory: str | None = None):
    """transformers' eager model of ``fields`` (random, seeded), on the GPU; saved to ``directory`` if given."""
    import transformers

    from blocksparse.models import LlamaConfig

    hf = {k: v for k, v in LlamaConfig(**fields).to_hf().items() if k != "model_type"}
    cfg = transformers.LlamaConfig(**hf, bos_token_id=None, eos_token_id=None, pad_token_id=None,
                                   initializer_range=0.1, attn_implementation="eager")  # fmt: skip
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.LlamaForCausalLM(cfg)
    model = model.to(dtype).eval()
    if directory is not None:
        model.save_pretrained(directory, safe_serialization=True, max_shard_size="200MB")
    return model


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def agree(fields: dict, args, timer: Timer) -> dict:
    """Logits and greedy tokens of both models on the same checkpoint; :class:`CellFailed` when they disagree."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    torch = require_torch()
    import jax
    import jax.numpy as jnp

    from blocksparse.models import generate, load_llama

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    rng = np.random.default_rng(0)
    ids = rng.integers(0, fields["vocab_size"], (4, 24)).astype(np.int64)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        hf = _hf_model(fields, torch, torch.float32, tmp)
        out["shards"] = len([f for f in os.listdir(tmp) if f.endswith(".safetensors")])
        ours = load_llama(tmp, dtype=jnp.float32)
        ours_bf16 = load_llama(tmp, dtype=jnp.bfloat16)
    t_ids = torch.as_tensor(ids, device="cuda")
    with jax.default_matmul_precision("highest"):
        got = np.asarray(jax.jit(lambda m, t: m(t))(ours, ids.astype(np.int32)))
        tokens = np.asarray(generate(ours, ids.astype(np.int32), 32))
    got_bf16 = np.asarray(jax.jit(lambda m, t: m(t))(ours_bf16, ids.astype(np.int32)))
    with torch.no_grad():  # float32 first: the cast to bf16 below rounds the module's weights in place
        want = hf(t_ids).logits.float().cpu().numpy()
        hf_tokens = hf.generate(t_ids, max_new_tokens=32, do_sample=False).cpu().numpy()[:, ids.shape[1] :]
        on_ours = hf(torch.as_tensor(np.concatenate([ids, tokens], 1), device="cuda")).logits.float().cpu().numpy()
        want_bf16 = hf.to(torch.bfloat16)(t_ids).logits.float().cpu().numpy()
    out.update(rel_err=_rel(got, want), bf16_rel_err=_rel(got_bf16, want), hf_bf16_rel_err=_rel(want_bf16, want))
    out["tokens_equal"] = float(np.mean(tokens == hf_tokens))
    if not out["rel_err"] <= F32_TOL:
        raise CellFailed(
            f"float32 logits: expected relative error vs transformers <= {F32_TOL}; got {out['rel_err']:.3g}"
        )
    bf16_tol = 2 * out["hf_bf16_rel_err"] + 1e-2
    if not out["bf16_rel_err"] <= bf16_tol:
        raise CellFailed(f"bf16 logits: expected relative error vs transformers' float32 <= {bf16_tol:.3g} (twice its "
                         f"own bf16 error + 1e-2); got {out['bf16_rel_err']:.3g}")  # fmt: skip
    if out["tokens_equal"] < 1:
        # A differing token is allowed only at a near-tie of transformers' own logits on our sequence.
        # Each sequence up to its first differing token (after it, the two continue different texts).
        lg = on_ours[:, ids.shape[1] - 1 : -1]
        out["mismatches"] = []
        for i in range(tokens.shape[0]):
            diff = np.nonzero(tokens[i] != hf_tokens[i])[0]
            if not diff.size:
                continue
            j = int(diff[0])
            gap = float(lg[i, j].max() - lg[i, j, tokens[i, j]])
            out["mismatches"].append(dict(sequence=i, new_token=j, logit_gap=gap))
            if gap > 1e-4 * float(np.abs(lg[i, j]).max()):
                raise CellFailed(f"greedy tokens: expected transformers' tokens; sequence {i} differs at new token "
                                 f"{j} by a logit gap of {gap:.3g} (not a near-tie)")  # fmt: skip
    out["implementation"] = "blocksparse.models.LlamaModel vs transformers LlamaForCausalLM (eager)"
    return out


def speed(fields: dict, prompt: int, new: int, timer: Timer) -> dict:
    """tokens/s at batch 1, bf16: transformers eager, ours dense, ours pruned (b=64, d=1/8), one run."""
    torch = require_torch()
    import jax
    import jax.numpy as jnp

    import blocksparse as bs
    from blocksparse.bench import implementation
    from blocksparse.models import generate, load_llama, prune_decoder

    ids = np.random.default_rng(0).integers(0, fields["vocab_size"], (1, prompt)).astype(np.int64)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        hf = _hf_model(fields, torch, torch.bfloat16, tmp)
        dense = load_llama(tmp, dtype=jnp.bfloat16)
    out = dict(setup_s=time.perf_counter() - t0, parameters=dense.config.num_parameters)
    t_ids = torch.as_tensor(ids, device="cuda")

    def hf_generate():
        with torch.no_grad():
            return hf.generate(t_ids, max_new_tokens=new, min_new_tokens=new, do_sample=False)

    peer = torch_time(hf_generate, iters=timer.iters, trials=timer.trials)
    out["hf_ms"] = peer["peer_ms"]
    out["hf_tokens_per_s"] = new / (peer["peer_ms"] * 1e-3)
    hf.to("cpu")  # frees the GPU for JAX's programs
    torch.cuda.empty_cache()

    def run(m, p):
        return generate(m, p, new)[:, -1]

    prompts = jnp.asarray(ids, jnp.int32)
    out["loop_ms"] = timer.loop(run, dense, prompts)
    out["calls_ms"] = timer.calls(run, dense, prompts)
    out["tokens_per_s"] = new / (out["loop_ms"] * 1e-3)
    out["speedup_vs_hf"] = out["hf_ms"] / out["loop_ms"]
    pruned = prune_decoder(dense, 64, 1 / 8)
    with bs.dispatch_log() as log:
        jax.block_until_ready(jax.jit(run)(pruned, prompts))
    out["pruned_loop_ms"] = timer.loop(run, pruned, prompts)
    out["pruned_tokens_per_s"] = new / (out["pruned_loop_ms"] * 1e-3)
    out["pruned_speedup_vs_dense"] = out["loop_ms"] / out["pruned_loop_ms"]
    out["implementation"] = "dense: xla dot; pruned: " + implementation(log)
    return out


if __name__ == "__main__":
    sys.exit(main())
