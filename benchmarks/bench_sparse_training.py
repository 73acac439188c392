"""Training steps per second with a block mask that moves every step (RigL) vs a static mask vs dense.

The model is a 2-layer MLP ``y = relu(x @ W1) @ W2`` (``m -> m -> m``), mean squared error, plain
SGD, in bf16 (float32 accumulation and loss). Variants, all from the same random pattern and values:

- ``rigl``: both weights ``bs.DynamicBlockSparseMatrix``; every step does SGD and then
  ``bs.prune.rigl_update`` on each weight (drop the smallest ``drop`` fraction of blocks, regrow
  as many among ``2 k`` sampled candidates where the sampled dense gradient, ``bs.sdd``, is largest);
- ``dynamic``: the same dynamic weights, SGD only (the cost of traced patterns without the update);
- ``static``: ``bs.BlockSparseMatrix`` weights with the same pattern, SGD only;
- ``dense``: dense weights (the sparse ones densified), SGD only.

Two timings each, medians over trials after a warm-up: ``loop``, steps inside one jitted
``lax.fori_loop`` (device time), and ``call``, back-to-back jitted steps from Python (what a
training loop sees, dispatch included).

Usage::

    python3 benchmarks/bench_sparse_training.py                 # 4096 -> 4096 -> 4096, batch 4096, b 32, 1/16
    python3 benchmarks/bench_sparse_training.py --small         # a CPU-sized smoke run (seconds)
    python3 benchmarks/bench_sparse_training.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import blocksparse as bs

VARIANTS = ("rigl", "dynamic", "static", "dense")


def _mm(x, W, impl):
    if isinstance(W, bs.BlockSparseMatrix | bs.DynamicBlockSparseMatrix):
        return bs.matmul(x, W, implementation=impl)
    return x @ W


def make_step(variant: str, impl, lr: float, drop: float):
    """``step(params, x, t, key) -> (params, loss)`` for one variant."""
    rigl = variant == "rigl"
    sparse = variant != "dense"

    def loss_fn(vals, probes, mats, x, t):
        W1, W2 = (m.with_data(v) for m, v in zip(mats, vals, strict=True)) if sparse else vals
        h = _mm(x, W1, impl)
        if probes is not None:  # zeros whose gradients are the layers' output gradients
            h = h + probes[0]
        a = jax.nn.relu(h)
        out = _mm(a, W2, impl)
        if probes is not None:
            out = out + probes[1]
        return jnp.mean(jnp.square(out.astype(jnp.float32) - t.astype(jnp.float32))), a

    def step(params, x, t, key):
        vals = tuple(W.data for W in params) if sparse else params
        if rigl:
            probes = (jnp.zeros((x.shape[0], params[0].shape[1]), x.dtype),
                      jnp.zeros((x.shape[0], params[1].shape[1]), x.dtype))  # fmt: skip
            (loss, a), (gv, gp) = jax.value_and_grad(loss_fn, argnums=(0, 1), has_aux=True)(vals, probes, params, x, t)
        else:
            (loss, a), gv = jax.value_and_grad(loss_fn, has_aux=True)(vals, None, params, x, t)
        new = tuple(v - jnp.asarray(lr, v.dtype) * g for v, g in zip(vals, gv, strict=True))
        if not sparse:
            return new, loss
        W1, W2 = (W.with_data(v) for W, v in zip(params, new, strict=True))
        if rigl:
            k1, k2 = jax.random.split(key)
            W1 = bs.prune.rigl_update(W1, k1, drop_fraction=drop,
                                      dense_grad=lambda C: bs.sdd(x.T, gp[0], C, implementation=impl).data)  # fmt: skip
            W2 = bs.prune.rigl_update(W2, k2, drop_fraction=drop,
                                      dense_grad=lambda C: bs.sdd(a.T, gp[1], C, implementation=impl).data)  # fmt: skip
        return (W1, W2), loss

    return step


def time_loop(step, params, x, t, reps: int, trials: int) -> tuple[float, float]:
    """Seconds per step with ``reps`` steps inside one jitted ``fori_loop``; and the first loss."""

    @jax.jit
    def run(params, x, t, key):
        def body(i, carry):
            params, acc = carry
            params, loss = step(params, x, t, jax.random.fold_in(key, i))
            return params, acc + loss

        return lax.fori_loop(0, reps, body, (params, jnp.float32(0)))[1]

    key = jax.random.key(1)
    jax.block_until_ready(run(params, x, t, key))  # compile and warm up
    out = []
    for _ in range(trials):
        t0 = time.perf_counter()
        jax.block_until_ready(run(params, x, t, key))
        out.append((time.perf_counter() - t0) / reps)
    return statistics.median(out), float(jax.jit(step)(params, x, t, key)[1])


def time_calls(step, params, x, t, reps: int, trials: int) -> float:
    """Seconds per step of back-to-back jitted steps from Python, each feeding the next."""
    donate = (0,) if jax.default_backend() != "cpu" else ()
    jstep = jax.jit(step, donate_argnums=donate)
    params = jax.tree.map(jnp.copy, params)  # donated below: keep the caller's arrays
    keys = list(jax.random.split(jax.random.key(2), reps))
    for i in range(3):  # compile and warm up
        params, loss = jstep(params, x, t, keys[i % reps])
    jax.block_until_ready(loss)
    out = []
    for _ in range(trials):
        t0 = time.perf_counter()
        for i in range(reps):
            params, loss = jstep(params, x, t, keys[i])
        jax.block_until_ready((params, loss))
        out.append((time.perf_counter() - t0) / reps)
    return statistics.median(out)


def run(m: int, batch: int, block: int, d: int, drop: float, dtype, impl, reps: int, trials: int, lr: float) -> dict:
    k1, k2, kx, kt = jax.random.split(jax.random.key(0), 4)
    scale = 1.0 / np.sqrt(m / d)  # fan-in of a unit: m / d inputs
    S1, S2 = (bs.random(k, (m, m), block, 1.0 / d, dtype) for k in (k1, k2))
    S1, S2 = (W.with_data((W.data.astype(jnp.float32) * scale).astype(dtype)) for W in (S1, S2))
    x = jax.random.normal(kx, (batch, m), dtype)
    t = jax.random.normal(kt, (batch, m), dtype)
    D1, D2 = (bs.DynamicBlockSparseMatrix.from_static(W) for W in (S1, S2))
    params = {"rigl": (D1, D2), "dynamic": (D1, D2), "static": (S1, S2), "dense": (S1.to_dense(), S2.to_dense())}
    cap = S1.nnz_blocks
    row = {"m": m, "batch": batch, "block": block, "density": 1.0 / d, "capacity": cap, "drop_fraction": drop,
           "moved_per_layer": int(round(drop * cap)), "dtype": jnp.dtype(dtype).name}  # fmt: skip
    # The RigL step really moves its blocks: count the slots whose coordinates changed in one step.
    (N1, N2), _ = jax.jit(make_step("rigl", impl, lr, drop))((D1, D2), x, t, jax.random.key(3))
    moved = [int(jnp.sum((N.rows != D.rows) | (N.cols != D.cols))) for N, D in ((N1, D1), (N2, D2))]
    if moved != [row["moved_per_layer"]] * 2:
        raise AssertionError(f"Expected {row['moved_per_layer']} blocks moved per layer. Got {moved}.")
    for v in VARIANTS:
        step = make_step(v, impl, lr, drop)
        row[f"{v}_loop_s"], row[f"{v}_loss0"] = time_loop(step, params[v], x, t, reps, trials)
        row[f"{v}_call_s"] = time_calls(step, params[v], x, t, reps, trials)
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", type=int, default=4096, help="input, hidden and output width")
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--b", type=int, default=32, help="block size")
    ap.add_argument("--d", type=int, default=16, help="density = 1 / D")
    ap.add_argument("--drop", type=float, default=0.1, help="RigL drop fraction (blocks moved per step per layer)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--impl", default=None, help="implementation for the sparse products (default: bs's own)")
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--reps", type=int, default=20, help="steps per timing")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--small", action="store_true", help="a CPU-sized smoke run: 256 wide, batch 256, b 16, 1/4")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.small:
        args.m, args.batch, args.b, args.d, args.reps, args.trials = 256, 256, 16, 4, 5, 3
    device = jax.devices()[0].device_kind
    print(f"jax {jax.__version__} on {device}")
    row = run(args.m, args.batch, args.b, args.d, args.drop, jnp.dtype(args.dtype), args.impl, args.reps,
              args.trials, args.lr)  # fmt: skip
    print(
        f"MLP {row['m']} -> {row['m']} -> {row['m']}, batch {row['batch']}, {row['dtype']}, blocks {row['block']}, "
        f"density 1/{args.d} ({row['capacity']} blocks per layer), RigL moves {row['moved_per_layer']} per layer "
        "per step"
    )
    print(f"\n{'variant':>8} | {'loop steps/s':>12} {'ms':>9} | {'call steps/s':>12} {'ms':>9} | "
          f"{'loop/static':>11} {'loop/dense':>10} {'call/static':>11} {'call/dense':>10} | {'loss0':>8}")  # fmt: skip
    for v in VARIANTS:
        lo, ca = row[f"{v}_loop_s"], row[f"{v}_call_s"]
        for kind in ("loop", "call"):
            row[f"{v}_{kind}_steps_per_s"] = 1.0 / row[f"{v}_{kind}_s"]
            row[f"{v}_{kind}_vs_static"] = row[f"{v}_{kind}_s"] / row[f"static_{kind}_s"]
            row[f"{v}_{kind}_vs_dense"] = row[f"{v}_{kind}_s"] / row[f"dense_{kind}_s"]
        print(
            f"{v:>8} | {1 / lo:12.1f} {1e3 * lo:9.3f} | {1 / ca:12.1f} {1e3 * ca:9.3f} | "
            f"{row[f'{v}_loop_vs_static']:11.2f} {row[f'{v}_loop_vs_dense']:10.2f} "
            f"{row[f'{v}_call_vs_static']:11.2f} {row[f'{v}_call_vs_dense']:10.2f} | {row[f'{v}_loss0']:8.4f}"
        )
    print("ratios are time per step (lower is faster); loss0: the first step's loss (the same for every variant)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device, "jax": jax.__version__, "rows": [row]}, f, indent=1)


if __name__ == "__main__":
    main()
