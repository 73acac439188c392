"""Command line: ``python -m blocksparse demo`` (and more subcommands as they land)."""

from __future__ import annotations

import argparse
import sys
import time


def _demo(args) -> int:
    import jax
    import jax.numpy as jnp

    import blocksparse as bs

    m = k = args.size
    W = bs.random(jax.random.key(0), (m, k), args.block, args.density)
    x = jax.random.normal(jax.random.key(1), (k, args.n))
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}; {W}")
    dense_w = W.to_dense()
    sparse_fn = jax.jit(lambda W, x: W @ x)
    dense_fn = jax.jit(jnp.dot)
    for name, fn, a in (("block-sparse", sparse_fn, W), ("dense jnp.dot", dense_fn, dense_w)):
        fn(a, x).block_until_ready()
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            fn(a, x).block_until_ready()
            times.append(time.perf_counter() - t0)
        times.sort()
        print(f"{name:>14}: median {times[len(times) // 2] * 1e3:8.3f} ms over {args.repeats} calls")
    err = float(jnp.max(jnp.abs(sparse_fn(W, x) - dense_fn(dense_w, x))))
    print(f"max |sparse - dense| = {err:.3g}")
    return 0 if err < 1e-3 * max(1.0, float(jnp.max(jnp.abs(dense_fn(dense_w, x))))) else 1


def _fraction(text: str) -> float:
    """``"1/16"`` or ``"0.0625"``."""
    from fractions import Fraction

    try:
        return float(Fraction(text))
    except (ValueError, ZeroDivisionError):
        raise argparse.ArgumentTypeError(f"expected a density such as 1/16 or 0.0625, got {text!r}") from None


def _plan(args) -> int:
    import blocksparse as bs

    pattern = bs.BlockPattern.random(args.seed, (args.m, args.k), args.block, args.density)
    p = bs.plan(
        pattern,
        args.n,
        machine=bs.ipu.by_name(args.machine),
        dtype=args.dtype,
        available_memory_proportion=args.available_memory_proportion,
    )
    print(p.report())
    if args.json:
        p.to_json(args.json)
        print(f"wrote {args.json}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m blocksparse", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    demo = sub.add_parser("demo", help="multiply a random block-sparse matrix, compare with dense, time both")
    demo.add_argument("--size", type=int, default=1024)
    demo.add_argument("--n", type=int, default=256)
    demo.add_argument("--block", type=int, default=16)
    demo.add_argument("--density", type=float, default=1 / 16)
    demo.add_argument("--repeats", type=int, default=10)
    demo.set_defaults(func=_demo)
    pl = sub.add_parser("plan", help="plan a random block-sparse W @ X on an IPU model and print the report")
    pl.add_argument("--m", type=int, default=4096)
    pl.add_argument("--k", type=int, default=4096)
    pl.add_argument("--n", type=int, default=2048)
    pl.add_argument("--block", type=int, default=16)
    pl.add_argument("--density", type=_fraction, default=1 / 16, help="e.g. 1/16 or 0.0625")
    pl.add_argument("--dtype", choices=("float16", "float32"), default="float16")
    pl.add_argument("--machine", choices=("bow", "mk2"), default="bow")
    pl.add_argument("--available-memory-proportion", type=float, default=0.6)
    pl.add_argument("--seed", type=int, default=0)
    pl.add_argument("--json", metavar="PATH", help="also write the plan summary as JSON")
    pl.set_defaults(func=_plan)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, TypeError) as e:  # bad input: the message names expected and actual values
        parser.exit(2, f"{parser.prog} {args.cmd}: error: {e}\n")


if __name__ == "__main__":
    sys.exit(main())
