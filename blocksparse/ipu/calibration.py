"""PopSparse's published figures and the model's prediction of each, computed the way the paper reports them.

Every figure below is from Li et al. 2023, "PopSparse: Accelerated block sparse matrix
multiplication on IPU" (arXiv:2303.16999), measured on a Bow IPU, and from the benchmark data the
authors published with it (the ``graphcore-research/sparsity-benchmarks`` repository). Throughput is
in *non-zero* TFLOP/s (``2 * nnz * n`` useful flops per product) and, as in the paper, each method
is taken at its best ``n`` (the paper sweeps the batch dimension and reports the fastest).

:func:`model_tflops` computes the model's figure for one data point: plan a random uniform pattern
(fixed seed) for each ``n`` in :data:`N_SWEEP` and keep the best non-zero TFLOP/s.
:func:`break_even_density` finds, by bisection, the density at which the static plan's speedup over
the modelled dense matmul crosses 1. :func:`table` gathers every data point, published next to
predicted.
"""

from __future__ import annotations

import functools
import math

from .._pattern import BlockPattern
from .buckets import dynamic_plan
from .cost import dense_estimate
from .machines import BOW
from .partition import plan
from .plan import NoValidPlanError

__all__ = [
    "BREAK_EVEN",
    "DENSE",
    "N_SWEEP",
    "SPARSE",
    "best_speedup",
    "break_even_density",
    "model_dense_tflops",
    "model_tflops",
]

#: The batch sizes each method is planned for; its best one is kept ("each method at its best n").
N_SWEEP = (4, 16, 64, 256, 1024, 4096)

#: (mode, block size, m = k, density) -> published non-zero TFLOP/s, FP16, Bow IPU, best n.
#: Source: arXiv:2303.16999, Figure 3 / Table 2 (density sweep at m = k = 4096) and Figure 4 (block-size
#: and m = k sweeps at d = 1/16); values as tabulated in graphcore-research/sparsity-benchmarks.
SPARSE: dict[tuple[str, int, int, float], float] = {
    # density sweep, m = k = 4096
    ("static", 1, 4096, 1 / 4): 11.6,
    ("static", 1, 4096, 1 / 8): 11.6,
    ("static", 1, 4096, 1 / 16): 10.4,
    ("static", 1, 4096, 1 / 32): 8.6,
    ("static", 16, 4096, 1 / 4): 89.8,
    ("static", 16, 4096, 1 / 8): 67.9,
    ("static", 16, 4096, 1 / 16): 69.4,
    ("static", 16, 4096, 1 / 32): 35.6,
    ("dynamic", 1, 4096, 1 / 4): 9.6,
    ("dynamic", 1, 4096, 1 / 8): 7.6,
    ("dynamic", 1, 4096, 1 / 16): 6.0,
    ("dynamic", 1, 4096, 1 / 32): 3.7,
    ("dynamic", 16, 4096, 1 / 4): 55.0,
    ("dynamic", 16, 4096, 1 / 8): 39.0,
    ("dynamic", 16, 4096, 1 / 16): 27.0,
    ("dynamic", 16, 4096, 1 / 32): 15.0,
    # block-size sweep, m = k = 4096, d = 1/16 (b = 1 and 16 repeat the density sweep, within rounding)
    ("static", 2, 4096, 1 / 16): 15.2,
    ("static", 4, 4096, 1 / 16): 21.5,
    ("static", 8, 4096, 1 / 16): 49.0,
    ("dynamic", 4, 4096, 1 / 16): 14.4,
    ("dynamic", 8, 4096, 1 / 16): 21.2,
    # m = k sweep, b = 16, d = 1/16 (4096 is the density sweep's point)
    ("static", 16, 256, 1 / 16): 9.0,
    ("static", 16, 512, 1 / 16): 20.1,
    ("static", 16, 1024, 1 / 16): 29.2,
    ("static", 16, 2048, 1 / 16): 30.5,
    ("static", 16, 8192, 1 / 16): 62.1,
    ("dynamic", 16, 256, 1 / 16): 5.3,
    ("dynamic", 16, 512, 1 / 16): 6.5,
    ("dynamic", 16, 1024, 1 / 16): 11.2,
    ("dynamic", 16, 2048, 1 / 16): 21.5,
    ("dynamic", 16, 8192, 1 / 16): 21.8,
}

#: (dtype, n) -> published dense TFLOP/s at m = k = 4096 on Bow (poplin). Source: arXiv:2303.16999,
#: Figure 2 (dense baseline against n); FP32 "55-58" is its large-n plateau.
DENSE: dict[tuple[str, int], float] = {
    ("float16", 4): 19.0,
    ("float16", 16): 62.0,
    ("float16", 64): 131.0,
    ("float16", 256): 176.0,
    ("float16", 2048): 224.0,
    ("float32", 2048): 56.5,
}

#: block size -> density at which static FP16 breaks even with dense at m = k = 4096, each at its best n.
#: Derived from arXiv:2303.16999's fitted law, speedup ~ 0.0013 m^0.59 d^-0.54 b^0.50 (section 4), solved
#: for speedup = 1: d = 0.040 for b = 1 and d = 0.52 for b = 16. (The measured b = 1 speedup of 0.7 at
#: d = 1/16 extrapolated with d^-0.54 gives 0.032, within the factor 1.25 the tests allow.)
BREAK_EVEN: dict[int, float] = {1: 0.040, 16: 0.52}

#: Published static-over-dynamic ratio band at best n (arXiv:2303.16999, Table 2: 1.5 to 2.6).
STATIC_OVER_DYNAMIC = (1.5, 2.6)


@functools.cache
def _pattern(m: int, b: int, density: float, seed: int = 0) -> BlockPattern:
    return BlockPattern.random(seed, (m, m), b, density)


def _one(mode: str, b: int, m: int, density: float, n: int, dtype: str) -> float:
    """Non-zero TFLOP/s at one ``n``; 0 where nothing fits the memory limit (that ``n`` is not a candidate)."""
    try:
        if mode == "static":
            return plan(_pattern(m, b, density), n, BOW, dtype).tflops
        nnz = _pattern(m, b, density).nnz_blocks
        return dynamic_plan((m, m), b, nnz, n, BOW, dtype).tflops
    except NoValidPlanError:
        return 0.0


@functools.cache
def model_tflops(mode: str, b: int, m: int, density: float, dtype: str = "float16", ns=N_SWEEP) -> tuple[float, int]:
    """``(best non-zero TFLOP/s, its n)`` of the model for one data point (Bow, random uniform pattern, seed 0)."""
    best = max((_one(mode, b, m, density, n, dtype), n) for n in ns)
    return float(best[0]), int(best[1])


def model_dense_tflops(n: int, dtype: str = "float16", m: int = 4096) -> float:
    """The modelled dense ``m x m @ m x n`` TFLOP/s on Bow."""
    return dense_estimate(BOW, m, m, n, dtype, "float32", 0.6).tflops


def best_speedup(b: int, density: float, m: int = 4096, dtype: str = "float16", ns=N_SWEEP) -> float:
    """Modelled static speedup over dense, each at its best ``n`` (the paper's definition)."""
    sparse, _ = model_tflops("static", b, m, density, dtype, ns)
    dense = max(model_dense_tflops(n, dtype, m) for n in ns)
    return sparse / density / dense


@functools.cache
def break_even_density(b: int, lo: float, hi: float, m: int = 4096, dtype: str = "float16", steps: int = 8) -> float:
    """The density in ``[lo, hi]`` where the static speedup over dense (best n) crosses 1, by bisection in log density.

    ``lo`` must be sparse enough to beat dense and ``hi`` dense enough not to; the answer is within
    ``(hi / lo) ** 2 ** -steps`` of the crossing.
    """
    lo, hi = math.log(lo), math.log(hi)
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        if best_speedup(b, math.exp(mid), m, dtype) > 1.0:
            lo = mid
        else:
            hi = mid
    return math.exp(0.5 * (lo + hi))


def table() -> list[dict]:
    """Every sparse data point: published, predicted, ratio and best n (slow: plans every point)."""
    out = []
    for (mode, b, m, d), pub in SPARSE.items():
        got, n = model_tflops(mode, b, m, d)
        out.append({"mode": mode, "b": b, "m": m, "density": d, "published": pub, "model": got, "n": n,
                    "ratio": got / pub})  # fmt: skip
    return out
