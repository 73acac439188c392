"""Command line (``blocksparse`` or ``python -m blocksparse``): ``bench`` (the benchmark suites: table, JSON,
figures), ``demo`` (multiply, check, time) and ``plan`` (IPU model).

Bad input ends with a one-line message naming the expected and the actual value, and exit status 2;
``bench`` exits with status 1 when a cell disagrees with its dense reference, and 3 when a cell could not run
(a missing weights file or optional extra: the row names it).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from fractions import Fraction

#: Size guards, checked before anything is allocated. The pattern generator draws from every cell
#: of the block grid, so the grid is capped; the planner's time grows with the non-zero blocks
#: (about 10 s for a million on a laptop CPU); the demo holds W densely next to x and the output.
MAX_GRID_BLOCKS = 1 << 24
MAX_NNZ_BLOCKS = 1 << 20
MAX_N = 1 << 22
MAX_DEMO_ELEMENTS = 1 << 26


class _Error(Exception):
    """Bad command-line input: reported as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage block
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


# -- argument types -----------------------------------------------------------------------------------
def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not v > 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive finite number, got {v}")
    return v


def _nonneg_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = -1
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return v


def _fraction(text: str, what: str) -> float:
    """A number in ``(0, 1]`` written as a fraction (``"1/16"``) or a decimal (``"0.0625"``)."""
    try:
        v = Fraction(text)
    except (ValueError, ZeroDivisionError):
        v = None
    if v is None or not 0 < v <= 1:
        raise argparse.ArgumentTypeError(f"expected {what} in (0, 1], got {text!r}")
    return float(v)


def _density(text: str) -> float:
    """A density of 0 is refused: it has no work, and any speedup reported for it would be meaningless."""
    return _fraction(text, "a density such as 1/16 or 0.0625")


def _proportion(text: str) -> float:
    return _fraction(text, "a proportion such as 0.6")


def _suites(text: str) -> list[str]:
    from blocksparse.bench import parse_suites

    try:
        return parse_suites(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


# -- guards -------------------------------------------------------------------------------------------
def _check_grid(m: int, k: int, block: int, density: float, shape_flags: str) -> None:
    """Block divides the shape, and the grid and its non-zero blocks are within the size guards."""
    if m % block or k % block:
        raise _Error(f"expected --block to divide {shape_flags}; got --block {block} for a {m} x {k} matrix")
    grid = (m // block) * (k // block)
    if grid > MAX_GRID_BLOCKS:
        raise _Error(
            f"expected at most MAX_GRID_BLOCKS={MAX_GRID_BLOCKS:,} blocks in the grid of a {m} x {k} matrix with "
            f"--block {block}; got {m // block:,} x {k // block:,} = {grid:,}: use a smaller shape or a larger block"
        )
    nnz = round(density * grid)
    if nnz == 0:
        raise _Error(
            f"expected a density that keeps at least one of the {grid:,} blocks (--density >= 1/{grid}); "
            f"got --density {density:g}, which keeps none"
        )
    if nnz > MAX_NNZ_BLOCKS:
        raise _Error(
            f"expected at most MAX_NNZ_BLOCKS={MAX_NNZ_BLOCKS:,} non-zero blocks (density x grid blocks); "
            f"got {density:g} x {grid:,} = {nnz:,}: lower the density or the shape, or use a larger block"
        )


def _check_json_path(path: str) -> None:
    parent = os.path.dirname(os.path.abspath(path))
    why = None
    if os.path.isdir(path):
        why = "it is a directory"
    elif not os.path.isdir(parent):
        why = f"its folder {parent!r} does not exist"
    elif not os.access(parent, os.W_OK):
        why = f"its folder {parent!r} is not writable"
    if why:
        raise _Error(f"expected --json to name a writable file; got {path!r} ({why})")


# -- subcommands --------------------------------------------------------------------------------------
def _median(times: list[float]) -> float:
    return sorted(times)[len(times) // 2]


def _demo(args) -> int:
    m = k = args.size
    _check_grid(m, k, args.block, args.density, "--size")
    elements = m * k + k * args.n + m * args.n
    if elements > MAX_DEMO_ELEMENTS:
        raise _Error(
            f"expected at most MAX_DEMO_ELEMENTS={MAX_DEMO_ELEMENTS:,} dense elements (size^2 + 2 size n); "
            f"got {elements:,} for --size {m} --n {args.n}"
        )
    import jax
    import jax.numpy as jnp
    import numpy as np

    import blocksparse as bs

    dtype = jnp.dtype(args.dtype)
    W = bs.random(jax.random.key(args.seed), (m, k), args.block, args.density, dtype=dtype)
    x = jax.random.normal(jax.random.key(args.seed + 1), (k, args.n), dtype)
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}; {W}; x {k} x {args.n}")
    dense_w = W.to_dense()
    sparse_fn = jax.jit(lambda W, x: W @ x)
    dense_fn = jax.jit(jnp.dot)
    with bs.dispatch_log() as log:  # recorded while the sparse product is traced (its first call)
        y = sparse_fn(W, x).block_until_ready()
    ref = dense_fn(dense_w, x).block_until_ready()
    ran = ", ".join(f"{op}: {name}" for op, name in dict.fromkeys(log)) or "none recorded"
    print(f"implementation: {ran}")
    medians = {}
    for name, fn, a in (("block-sparse", sparse_fn, W), ("dense jnp.dot", dense_fn, dense_w)):
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            fn(a, x).block_until_ready()
            times.append(time.perf_counter() - t0)
        medians[name] = _median(times)
        print(f"{name:>14}: median {medians[name] * 1e3:8.3f} ms over {args.repeats} calls")
    # Accuracy against float64, for both: the classical bound |fl(W x) - W x| <= k eps |W| |x|.
    w64, x64 = np.asarray(dense_w, np.float64), np.asarray(x, np.float64)
    exact = w64 @ x64
    err = np.abs(np.asarray(y, np.float64) - np.asarray(ref, np.float64))
    rel = float(err.max() / max(np.abs(exact).max(), np.finfo(np.float64).tiny)) if err.size else 0.0
    tol = k * float(jnp.finfo(dtype).eps)
    ok = bool(np.all(err <= 2 * tol * (np.abs(w64) @ np.abs(x64)) + np.finfo(dtype).tiny))
    print(f"relative error vs dense (max |sparse - dense| / max |dense|): {rel:.3g}")
    verdict = "within" if ok else "NOT within"
    print(f"verdict: {verdict} the {dtype.name} tolerance (k x eps = {tol:.3g}, relative to |W| |x|)")
    speedup = medians["dense jnp.dot"] / medians["block-sparse"]
    print(f"speedup over dense jnp.dot: {speedup:.2f}x (median times)")
    return 0 if ok else 1


def _bench(args) -> int:
    if args.resume and not args.json:
        raise _Error("expected --json PATH with --resume (the run to continue); got none")
    if args.json:
        _check_json_path(args.json)
    if args.plot is not None:
        if os.path.exists(args.plot) and not os.path.isdir(args.plot):
            raise _Error(f"expected --plot to name a folder; got {args.plot!r} (it is a file)")
        parent = os.path.dirname(os.path.abspath(args.plot))
        if not os.path.isdir(parent):
            raise _Error(f"expected --plot to name a folder in an existing one; got {args.plot!r} (no {parent!r})")
        try:
            from blocksparse.bench import require_matplotlib

            require_matplotlib()
        except ImportError as e:
            raise _Error(str(e)) from None
    from blocksparse import bench

    suites = [s for group in (args.suite or [list(bench.DEFAULT_SUITES)]) for s in group]
    return bench.run(
        list(dict.fromkeys(suites)), full=args.full, json_path=args.json, plot_dir=args.plot,
        iters=args.iters, trials=args.trials, progress=not args.no_progress, filters=args.filter, resume=args.resume,
        stop_after_s=args.stop_after_s,
    )  # fmt: skip


def _plan(args) -> int:
    _check_grid(args.m, args.k, args.block, args.density, "--m and --k")
    if args.json:
        _check_json_path(args.json)
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
        try:
            p.to_json(args.json)
        except OSError as e:
            raise _Error(f"expected --json to name a writable file; got {args.json!r} ({e.strerror})") from None
        print(f"wrote {args.json}")
    return 0


def _prog() -> str:
    """The command as the user typed it: ``blocksparse`` (the installed script) or ``python -m blocksparse``."""
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return "python -m blocksparse" if name in ("", "__main__.py", "-c", "-m") else name


def _parser() -> argparse.ArgumentParser:
    fmt = argparse.ArgumentDefaultsHelpFormatter
    parser = _Parser(prog=_prog(), description=__doc__, formatter_class=fmt)
    sub = parser.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    be = sub.add_parser(
        "bench", formatter_class=fmt,
        help="run the benchmark suites (matmul, gnn, plan, model, mosaic, ...): each cell checked, timed; a table",
    )  # fmt: skip
    be.add_argument(
        "--suite", type=_suites, action="append", metavar="NAME[,NAME]",
        help="matmul, gnn, plan, model, mosaic, dynamic, sharded, training, gnn-variants, gnn-graphs, decode or all; "
        "repeatable or a comma list; None runs matmul,gnn,plan",
    )  # fmt: skip
    be.add_argument(
        "--filter", metavar="TEXT", action="append", default=None,
        help="run only the cells whose 'suite: label' contains TEXT (repeatable: any of them), e.g. 'n=256'",
    )  # fmt: skip
    be.add_argument("--full", action="store_true", help="the GPU sizes of the published figures, not the CPU sizes")
    be.add_argument("--json", metavar="PATH", default=None, help="write every cell's parameters and metrics as JSON")
    be.add_argument("--plot", metavar="DIR", default=None, help="write figures (PNG) into DIR; needs the bench extra")
    be.add_argument(
        "--iters", type=_positive_int, default=None, help="timed iterations per trial; None: 5, or 50 with --full"
    )
    be.add_argument(
        "--trials", type=_positive_int, default=None, help="timed trials (median); None: 3, or 5 with --full"
    )
    be.add_argument("--no-progress", action="store_true", help="no progress bar or lines on stderr")
    be.add_argument(
        "--resume", action="store_true",
        help="continue the run in --json (one cut short, or split over commands): its measured cells are kept; "
        "the same machine, code and timer settings only",
    )  # fmt: skip
    be.add_argument(
        "--stop-after-s", type=_positive_float, default=None, metavar="S",
        help="a command's time limit: start no cell that would end after S seconds (the longest cell so far as the "
        "guess); with --json, --resume runs the cells left",
    )  # fmt: skip
    be.set_defaults(func=_bench)
    demo = sub.add_parser(
        "demo", formatter_class=fmt, help="multiply a random block-sparse matrix, check it against dense, time both"
    )
    demo.add_argument("--size", type=_positive_int, default=512, help="m = k of the square block-sparse W")
    demo.add_argument("--n", type=_positive_int, default=256, help="columns of the dense x")
    demo.add_argument("--block", type=_positive_int, default=16, help="block side b (b x b blocks); divides --size")
    demo.add_argument("--density", type=_density, default=1 / 16, help="fraction of non-zero blocks, e.g. 1/16")
    demo.add_argument("--dtype", choices=("float32", "float16"), default="float32", help="dtype of W and x")
    demo.add_argument("--repeats", type=_positive_int, default=5, help="timed calls of each product (median)")
    demo.add_argument("--seed", type=_nonneg_int, default=0, help="random seed of W and x")
    demo.set_defaults(func=_demo)
    pl = sub.add_parser(
        "plan", formatter_class=fmt, help="plan a random block-sparse W @ X on an IPU model and print the report"
    )
    pl.add_argument("--m", type=_positive_int, default=4096, help="rows of W")
    pl.add_argument("--k", type=_positive_int, default=4096, help="columns of W (rows of X)")
    pl.add_argument("--n", type=_positive_int, default=2048, help=f"columns of X (at most {MAX_N:,})")
    pl.add_argument("--block", type=_positive_int, default=16, help="block side b (b x b blocks); divides --m, --k")
    pl.add_argument("--density", type=_density, default=1 / 16, help="fraction of non-zero blocks, e.g. 1/16")
    pl.add_argument("--dtype", choices=("float16", "float32"), default="float16", help="operand dtype")
    pl.add_argument("--machine", choices=("bow", "mk2"), default="bow", help="IPU model")
    pl.add_argument(
        "--available-memory-proportion", type=_proportion, default=0.6, help="fraction of tile memory the plan may use"
    )
    pl.add_argument("--seed", type=_nonneg_int, default=0, help="seed of the random pattern")
    pl.add_argument("--json", metavar="PATH", default=None, help="also write the plan summary as JSON to PATH")
    pl.set_defaults(func=_plan)
    return parser


def main(argv=None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.cmd == "plan" and args.n > MAX_N:
        parser.exit(2, f"{parser.prog} plan: error: expected --n <= MAX_N={MAX_N:,}; got {args.n:,}\n")
    try:
        return args.func(args)
    except (_Error, ValueError, TypeError) as e:  # bad input: the message names expected and actual values
        message = " ".join(str(e).split())  # one line
        parser.exit(2, f"{parser.prog} {args.cmd}: error: {message}\n")


if __name__ == "__main__":
    sys.exit(main())
