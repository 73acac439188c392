"""A transformer FFN with block-sparse weights: ``gelu(x @ W1 + b1) @ W2 + b2``, dense vs sparse.

The MiniLM shape by default (tokens x hidden = 32768 x 384, FFN 1536: 256 sentences of 128 tokens),
bf16. Rows, each checked against the dense float32 computation:

- ``dense``: ``gelu(x @ w1 + b1) @ w2 + b2`` in the input dtype, as a user writes it (XLA fuses the
  bias and GELU into one pass after each cuBLAS GEMM);
- ``sparse``: ``bs.matmul`` then the bias and GELU as separate XLA ops (the unfused product);
- ``fused``: ``bs.matmul(x, W, bias=b, activation="gelu")``: bias, GELU and the cast in the kernel.

Two timings each (medians after warm-up): inside one jitted loop (device time) and back-to-back
jitted calls from Python. Ratios are dense time / sparse time (above 1: sparse is faster).

Usage::

    python3 benchmarks/bench_ffn.py [--json out.json]            # GPU sizes
    python3 benchmarks/bench_ffn.py --small                      # CPU-sized, seconds
"""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp
import numpy as np

import blocksparse as bs
from blocksparse.bench import Timer


def _ffn_dense(x, w1, b1, w2, b2):
    # What a user writes; XLA fuses the bias and GELU into one pass after each cuBLAS GEMM.
    return jax.nn.gelu(x @ w1 + b1, approximate=False) @ w2 + b2


def _ffn_dense32(x, w1, b1, w2, b2):  # the float32 oracle
    h = jax.nn.gelu(jnp.dot(x, w1, precision="highest") + b1, approximate=False)
    return jnp.dot(h, w2, precision="highest") + b2


def _ffn_unfused(x, W1, b1, W2, b2):
    h = jax.nn.gelu(bs.matmul(x, W1).astype(jnp.float32) + b1, approximate=False).astype(x.dtype)
    return (bs.matmul(h, W2).astype(jnp.float32) + b2).astype(x.dtype)


def _ffn_fused(x, W1, b1, W2, b2, config=None):
    h = bs.matmul(x, W1, bias=b1, activation="gelu", config=config)
    return bs.matmul(h, W2, bias=b2, config=config)


def run(tokens, hidden, ffn, blocks, densities, dtype, timer):
    key = jax.random.key(0)
    kx, k1, k2, kb1, kb2 = jax.random.split(key, 5)
    x = jax.random.normal(kx, (tokens, hidden), dtype)
    b1 = (0.1 * jax.random.normal(kb1, (ffn,))).astype(dtype)
    b2 = (0.1 * jax.random.normal(kb2, (hidden,))).astype(dtype)
    rows = []
    device = jax.devices()[0].device_kind
    w1d = (jax.random.normal(k1, (hidden, ffn)) / np.sqrt(hidden)).astype(dtype)
    w2d = (jax.random.normal(k2, (ffn, hidden)) / np.sqrt(ffn)).astype(dtype)
    dense_loop = timer.loop(_ffn_dense, x, w1d, b1, w2d, b2)
    dense_calls = timer.calls(_ffn_dense, x, w1d, b1, w2d, b2)
    rows.append(dict(name="dense", block=None, density=1.0, loop_ms=dense_loop, call_ms=dense_calls))
    print(f"{device}: x {x.shape} @ W1 ({hidden}, {ffn}) -> GELU -> @ W2 ({ffn}, {hidden}), {jnp.dtype(dtype).name}")
    print(f"  {'dense':24s} loop {dense_loop:8.3f} ms  calls {dense_calls:8.3f} ms")
    for b in blocks:
        for d in densities:
            W1 = bs.random(k1, (hidden, ffn), b, d, dtype)
            W2 = bs.random(k2, (ffn, hidden), b, d, dtype)
            want = np.asarray(_ffn_dense32(x.astype(jnp.float32), W1.to_dense().astype(jnp.float32), b1.astype(
                jnp.float32), W2.to_dense().astype(jnp.float32), b2.astype(jnp.float32)))  # fmt: skip
            scale = float(np.abs(want).max()) or 1.0
            for name, fn in (("sparse", _ffn_unfused), ("fused", _ffn_fused)):
                with bs.dispatch_log() as log:
                    got = np.asarray(jax.jit(fn)(x, W1, b1, W2, b2), np.float32)
                err = float(np.abs(got - want).max()) / scale
                ok = err < (0.05 if jnp.dtype(dtype).itemsize == 2 else 1e-2)
                loop = timer.loop(fn, x, W1, b1, W2, b2)
                calls = timer.calls(fn, x, W1, b1, W2, b2)
                impls = sorted({impl for _, impl in log})
                rows.append(dict(name=name, block=b, density=d, loop_ms=loop, call_ms=calls, rel_err=err, ok=ok,
                                 speedup_loop=dense_loop / loop, speedup_calls=dense_calls / calls,
                                 implementation=",".join(impls)))  # fmt: skip
                print(
                    f"  {name:6s} b={b:<3d} d=1/{round(1 / d):<3d}        loop {loop:8.3f} ms  calls {calls:8.3f} ms  "
                    f"x{dense_loop / loop:5.2f} / x{dense_calls / calls:5.2f} vs dense  err {err:.1e}"
                    f"{'' if ok else '  FAILED'}  [{','.join(impls)}]"
                )
    return dict(device=device, tokens=tokens, hidden=hidden, ffn=ffn, dtype=jnp.dtype(dtype).name, rows=rows)


def sweep(tokens, b, inv_d, dtype, timer, path):
    """The fused FFN over the dds kernel's tiles: which configuration the default should be."""
    from blocksparse.ops.matmul import TritonConfig

    kx, k1, k2 = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(kx, (tokens, 384), dtype)
    W1 = bs.random(k1, (384, 1536), b, 1 / inv_d, dtype)
    W2 = bs.random(k2, (1536, 384), b, 1 / inv_d, dtype)
    b1, b2 = jnp.zeros((1536,), dtype), jnp.zeros((384,), dtype)
    rows = []
    for tb in (64, 128, 256):
        for nw in (4, 8):
            for ns in (2, 3, 4):
                config = TritonConfig(tb=tb, num_warps=nw, num_stages=ns)  # both products' forward
                try:
                    ms = timer.loop(lambda *a, config=config: _ffn_fused(*a, config=config), x, W1, b1, W2, b2)
                except Exception as e:  # a configuration Triton cannot compile (shared memory)
                    print(f"  tb={tb} warps={nw} stages={ns}: {type(e).__name__}")
                    continue
                rows.append(dict(tb=tb, num_warps=nw, num_stages=ns, loop_ms=ms))
                print(f"  tb={tb:<4d} warps={nw} stages={ns}: {ms:.3f} ms")
    if path:
        with open(path, "w") as f:
            json.dump(dict(block=b, density=1 / inv_d, tokens=tokens, rows=rows), f, indent=1)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="CPU-sized (seconds)")
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--blocks", default="16,32,64")
    ap.add_argument("--densities", default="2,4,8,16", help="1/d for each d")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--json", default=None)
    ap.add_argument("--sweep", default=None, metavar="B,D",
                    help="time the fused FFN at block B, density 1/D over kernel tiles (tb, num_warps, num_stages)")
    args = ap.parse_args(argv)
    blocks = [int(b) for b in args.blocks.split(",")]
    dens = [1.0 / float(d) for d in args.densities.split(",")]
    timer = Timer(iters=20, trials=5)
    tokens, dtype = args.tokens, jnp.dtype(args.dtype)
    if args.small:
        tokens, blocks, dens, timer, dtype = 256, [16], [0.25], Timer(iters=2, trials=1), jnp.dtype(jnp.float32)
    if args.sweep:
        return sweep(tokens, *(int(v) for v in args.sweep.split(",")), dtype, timer, args.json)
    result = run(tokens, 384, 1536, blocks, dens, dtype, timer)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0 if all(r.get("ok", True) for r in result["rows"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
