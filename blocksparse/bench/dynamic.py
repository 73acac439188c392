"""The ``dynamic`` suite: a traced pattern (its plan built inside jit) against the static one and dense.

Per cell (``W`` of ``m x m``, ``b x b`` blocks at density ``d``, ``x`` of ``m x n``) one random pattern,
every variant timed in the same run, both ways (:class:`~blocksparse.bench.Timer`: ``*_loop_ms`` inside
one jitted loop, ``*_calls_ms`` back-to-back jitted calls), each checked against the dense product:

- ``dense``: ``jnp.dot`` of the dense ``W``;
- ``static``: ``bs.matmul(W, x)`` (pattern known at build time; its default backend);
- the cell's own ``loop_ms`` / ``calls_ms`` / ``implementation``: ``bs.matmul(D, x)`` on the
  :class:`~blocksparse.DynamicBlockSparseMatrix` ``D`` with the default backend (plan building included);
- ``xla``: the dynamic pure-JAX path (``implementation="xla"``);
- on a GPU: ``static_pallas`` and the two dynamic Triton designs, ``scan`` (each program scans the block
  list, one launch) and ``worklist`` (the redistributor's load-balanced work list), through
  ``config=TritonConfig(dynamic=...)``;
- on a Hopper GPU with blocks the Mosaic kernels take: ``static_mosaic`` and ``dynamic_mosaic``.

Variants this machine cannot run are recorded as ``*_skipped`` with the reason. Ratios are time ratios
(``*_vs_static``: this time / the static default's; ``speedup_vs_dense``: dense / the dynamic default).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

import blocksparse as bs

from ._core import Cell, Timer, measure, ratio, variant
from .matmul import density_label

SIZES = {
    "tiny": dict(m=64, ns=(16,), blocks=(16,), densities=(1 / 4,), dtype="float32"),
    "quick": dict(m=256, ns=(64,), blocks=(16, 32), densities=(1 / 8,), dtype="float32"),
    "full": dict(m=8192, ns=(256, 4096), blocks=(32, 64), densities=(1 / 16,), dtype="bfloat16"),
}

COLUMNS = (
    ("loop ms", "loop_ms", ".4g"),
    ("calls ms", "calls_ms", ".4g"),
    ("static ms", "static_loop_ms", ".4g"),
    ("dense ms", "dense_loop_ms", ".4g"),
    ("x static", "loop_vs_static", ".3g"),
    ("x dense", "speedup_vs_dense", ".3g"),
    ("rel err", "rel_err", ".2g"),
)

#: The Mosaic kernels' block sizes (the dynamic Mosaic path takes these only).
MOSAIC_BLOCKS = (64, 128)


def cells(*, full: bool) -> list[Cell]:
    return suite(**SIZES["full" if full else "quick"])


def suite(*, m: int, ns, blocks, densities, dtype: str, seed: int = 0) -> list[Cell]:
    out = []
    for n in ns:
        for b in blocks:
            for d in densities:
                params = dict(m=m, k=m, n=n, b=b, density=d, dtype=dtype)
                out.append(Cell("dynamic", f"n={n} b={b} d={density_label(d)}", params, _run(params, seed)))
    return out


def _triton_dynamic(mode: str):
    def f(D, x):
        from ..ops.matmul import TritonConfig

        return bs.matmul(D, x, implementation="pallas", config=TritonConfig(dynamic=mode))

    return f


def _run(params, seed):
    def run(timer: Timer) -> dict:
        m, n, b, d = params["m"], params["n"], params["b"], params["density"]
        dtype = jnp.dtype(params["dtype"])
        W = bs.random(jax.random.key(seed), (m, m), b, d, dtype, pattern_seed=seed)
        D = bs.DynamicBlockSparseMatrix.from_static(W, capacity=W.nnz_blocks)
        x = jax.random.normal(jax.random.key(seed + 1), (m, n), dtype)
        dense = W.to_dense()
        with jax.default_matmul_precision("highest"):
            want = jnp.dot(dense.astype(jnp.float32), x.astype(jnp.float32))
        check = dict(want=want, dtype=dtype)
        out = measure(timer, lambda D, x: bs.matmul(D, x), D, x, what="dynamic W @ x", **check)
        out.update(variant(timer, "dense", jnp.dot, dense, x, **check))
        out.update(variant(timer, "static", lambda W, x: bs.matmul(W, x), W, x, **check))
        out.update(variant(timer, "xla", lambda D, x: bs.matmul(D, x, implementation="xla"), D, x, **check))
        static_pallas = lambda W, x: bs.matmul(W, x, implementation="pallas")  # noqa: E731
        out.update(variant(timer, "static_pallas", static_pallas, W, x, needs="gpu", **check))
        for mode in ("scan", "worklist"):
            out.update(variant(timer, mode, _triton_dynamic(mode), D, x, needs="gpu", **check))
        if b in MOSAIC_BLOCKS:
            mosaic = lambda M, x: bs.matmul(M, x, implementation="mosaic")  # noqa: E731
            out.update(variant(timer, "static_mosaic", mosaic, W, x, needs="hopper", **check))
            out.update(variant(timer, "dynamic_mosaic", mosaic, D, x, needs="hopper", **check))
        out["nnz_blocks"] = W.nnz_blocks
        for kind in ("loop", "calls"):
            ratio(out, f"{kind}_ms", f"static_{kind}_ms", f"{kind}_vs_static")
            for name in ("xla", "scan", "worklist"):
                ratio(out, f"{name}_{kind}_ms", f"static_{kind}_ms", f"{name}_{kind}_vs_static")
        ratio(out, "dense_loop_ms", "loop_ms", "speedup_vs_dense")
        ratio(out, "dynamic_mosaic_loop_ms", "static_mosaic_loop_ms", "dynamic_mosaic_vs_static_mosaic")
        ratio(out, "scan_loop_ms", "dynamic_mosaic_loop_ms", "dynamic_mosaic_vs_scan")
        return out

    return run
