"""The ``plan`` suite: the IPU planner's speed and estimates for a few shapes, static and dynamic.

Each cell plans ``W @ X`` with the plan cache cleared (:func:`blocksparse.ipu.clear_cache`) with
:func:`blocksparse.plan` (static pattern) or :func:`blocksparse.dynamic_plan` (only the maximum
number of blocks known), reports the planning time, the estimated TFLOP/s on the non-zeros, the
dense estimate and the predicted speedup, and checks the plan by running it tile by tile
(:func:`blocksparse.simulate` / :func:`blocksparse.simulate_dynamic`) against the dense product.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp

import blocksparse as bs

from ._core import Cell, CellFailed, Timer, check_close
from .matmul import density_label

#: (m = k, block, density, n) per size; the planner runs on the host, so ``full`` is CPU-friendly too.
SIZES = {
    "tiny": dict(shapes=((128, 16, 1 / 4, 32),), dtype="float32"),
    "quick": dict(shapes=((1024, 16, 1 / 16, 256), (1024, 4, 1 / 8, 256)), dtype="float16"),
    "full": dict(
        # (8192, 16, 1/16, 4096) and (8192, 1, 1/64, 1024) (a million non-zeros) are the planning-time cases
        shapes=(
            (4096, 16, 1 / 16, 1024),
            (4096, 4, 1 / 8, 1024),
            (8192, 16, 1 / 16, 4096),
            (8192, 64, 1 / 64, 4096),
            (8192, 1, 1 / 64, 1024),
        ),
        dtype="float16",
    ),
}

COLUMNS = (
    ("plan ms", "plan_ms", ".4g"),
    ("IPU TFLOP/s", "ipu_tflops", ".3g"),
    ("dense TFLOP/s", "ipu_dense_tflops", ".3g"),
    ("IPU x dense", "ipu_speedup", ".3g"),
    ("tiles", "tiles", "d"),
    ("rel err", "rel_err", ".2g"),
)


def cells(*, full: bool) -> list[Cell]:
    return suite(**SIZES["full" if full else "quick"])


def suite(*, shapes, dtype: str, seed: int = 0) -> list[Cell]:
    out = []
    for m, b, d, n in shapes:
        for kind in ("static", "dynamic"):
            params = dict(m=m, k=m, b=b, density=d, n=n, dtype=dtype, kind=kind, machine="bow")
            label = f"{m}x{m} b={b} d={density_label(d)} n={n} {kind}"
            out.append(Cell("plan", label, params, _run(params, seed)))
    return out


def _run(params, seed):
    def run(timer: Timer) -> dict:
        m, b, d, n, dtype = params["m"], params["b"], params["density"], params["n"], params["dtype"]
        pattern = bs.BlockPattern.random(seed, (m, m), b, d)
        bs.ipu.clear_cache()
        t0 = time.perf_counter()
        if params["kind"] == "static":
            plan = bs.plan(pattern, n, dtype=dtype)
        else:
            plan = bs.dynamic_plan((m, m), b, pattern.nnz_blocks, n, dtype=dtype)
        plan_ms = (time.perf_counter() - t0) * 1e3
        # Check the plan: its tile-by-tile execution equals the dense product (float32 values).
        W = bs.BlockSparseMatrix(pattern, jax.random.normal(jax.random.key(seed), (pattern.nnz_blocks, b, b)))
        x = jax.random.normal(jax.random.key(seed + 1), (m, n))
        if params["kind"] == "static":
            y = jax.jit(bs.simulate, static_argnums=0)(plan, W, x)
            tiles = plan.tiles_used
        else:
            D = bs.DynamicBlockSparseMatrix.from_static(W)
            y = jax.jit(bs.simulate_dynamic, static_argnums=0)(plan, D, x)
            tiles = plan.num_buckets
        with jax.default_matmul_precision("highest"):
            want = W.to_dense() @ x
        err = check_close(y, want, dtype=jnp.float32, what=f"simulated {params['kind']} plan")
        if not plan.tflops > 0:
            raise CellFailed(f"expected a positive estimated TFLOP/s; got {plan.tflops}")
        return dict(
            plan_ms=plan_ms, ipu_tflops=plan.tflops, ipu_seconds=plan.seconds, tiles=int(tiles),
            ipu_dense_tflops=None if plan.dense is None else plan.dense.tflops, ipu_speedup=plan.speedup,
            rel_err=err, nnz_blocks=pattern.nnz_blocks, implementation="IPU model (host planner)",
        )  # fmt: skip

    return run
