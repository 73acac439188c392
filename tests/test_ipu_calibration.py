"""The IPU cost model against PopSparse's published figures (Bow IPU, FP16 unless said, each method at its best n).

The published tables live in :mod:`blocksparse.ipu.calibration` with their sources (Li et al. 2023,
arXiv:2303.16999, and graphcore-research/sparsity-benchmarks). Targets: static and dense within 30%,
dynamic within 40%, break-even densities within a factor 1.25, static faster than dynamic with a ratio
in the published 1.5-2.6 band. Points the model does not meet yet are strict xfails whose reason holds
the model's value, so this file is an honest table of where the model stands.
"""

import pytest

from blocksparse.ipu import calibration as C

TOL = C.TOLERANCE  # static and dense within 30%, dynamic within 40%
SLOW = 20.0  # seconds: points whose sweep plans multi-million-block patterns take longer

# (mode, b, m, density) -> the model's best-n TFLOP/s where it misses the target (strict xfail), and why: each miss
# is explained in docs/concepts.md ("What the model still leaves out"), with the term that would close it or the
# statement that no poplibs term does.
MISSES: dict[tuple, tuple[float, str]] = {
    ("static", 16, 2048, 1 / 16): (40.3, "the published dip: no term of poplibs' static partitioner explains it"),
    ("dynamic", 16, 256, 1 / 16): (1.1, "poplibs' free propagation closes it but puts m >= 1024 outside"),
    ("dynamic", 16, 512, 1 / 16): (3.7, "poplibs' free propagation closes it but puts m >= 1024 outside"),
    ("dynamic", 16, 8192, 1 / 16): (45.0, "the published drop: no term of poplibs' dynamic planner explains it"),
}
# Static b = 1 at d >= 1/8 plans 2-4 million blocks for every n of the sweep.
SLOW_POINTS = {("static", 1, 4096, 1 / 4), ("static", 1, 4096, 1 / 8)}
DENSE_MISSES: dict[tuple, float] = {}


def _name(key) -> str:
    mode, b, m, d = key
    return f"{mode}-b{b}-m{m}-d1/{round(1 / d)}"


def _params():
    out = []
    for key, pub in C.SPARSE.items():
        marks = []
        if key in MISSES:
            value, why = MISSES[key]
            marks.append(pytest.mark.xfail(strict=True, reason=f"model {value:.1f} vs published {pub:.1f}: {why}"))
        if key in SLOW_POINTS:
            marks.append(pytest.mark.slow)
        out.append(pytest.param(key, pub, id=_name(key), marks=marks))
    return out


@pytest.mark.parametrize("key, published", _params())
def test_sparse_point_within_target(key, published):
    got, n = C.model_tflops(*key)
    tol = TOL[key[0]]
    assert abs(got / published - 1.0) <= tol, f"{_name(key)}: model {got:.1f} TFLOP/s (n={n}) vs {published}"


def _dense_params():
    out = []
    for key, pub in C.DENSE.items():
        marks = []
        if key in DENSE_MISSES:
            marks.append(pytest.mark.xfail(strict=True, reason=f"model {DENSE_MISSES[key]:.1f} vs published {pub}"))
        out.append(pytest.param(key, pub, id=f"{key[0]}-n{key[1]}", marks=marks))
    return out


@pytest.mark.parametrize("key, published", _dense_params())
def test_dense_point_within_target(key, published):
    got = C.model_dense_tflops(key[1], key[0])
    assert abs(got / published - 1.0) <= TOL["dense"], f"dense {key}: model {got:.1f} vs {published}"


@pytest.mark.parametrize(
    "b, lo, hi",
    [
        pytest.param(16, 1 / 64, 1.0, id="b16"),
        pytest.param(1, 1 / 128, 1 / 8, id="b1", marks=pytest.mark.slow),
    ],
)
def test_break_even_density_within_factor(b, lo, hi):
    got = C.break_even_density(b, lo, hi)
    want = C.BREAK_EVEN[b]
    assert want / 1.25 <= got <= want * 1.25, f"b={b}: model break-even d={got:.3f} vs {want}"


# Density-sweep points where both kinds are published (b = 1's fast points, b = 16's all).
RATIO_POINTS = [
    (b, d) for b in (1, 16) for d in (1 / 4, 1 / 8, 1 / 16, 1 / 32) if (b, d) != (1, 1 / 4) and (b, d) != (1, 1 / 8)
]
RATIO_MISSES: dict[tuple, str] = {}


def _ratio_marks(b, d):
    return [pytest.mark.xfail(strict=True, reason=RATIO_MISSES[(b, d)])] if (b, d) in RATIO_MISSES else []


@pytest.mark.parametrize(
    "b, d",
    [
        pytest.param(b, d, id=f"b{b}-d1/{round(1 / d)}", marks=_ratio_marks(b, d))
        for b, d in RATIO_POINTS
    ],
)  # fmt: skip
def test_static_over_dynamic_in_published_band(b, d):
    s, _ = C.model_tflops("static", b, 4096, d)
    dyn, _ = C.model_tflops("dynamic", b, 4096, d)
    lo, hi = C.STATIC_OVER_DYNAMIC
    assert lo <= s / dyn <= hi, f"b={b} d={d}: static/dynamic {s / dyn:.2f}"


@pytest.mark.parametrize("key", [k for k in C.SPARSE if k[0] == "static" and k not in SLOW_POINTS], ids=_name)
def test_static_faster_than_dynamic(key):
    dyn_key = ("dynamic", *key[1:])
    if dyn_key not in C.SPARSE:
        pytest.skip("no dynamic point published")
    assert C.model_tflops(*key)[0] > C.model_tflops(*dyn_key)[0]


@pytest.mark.slow
def test_concepts_tables_match_the_model():
    """docs/concepts.md's predicted-vs-published tables are :func:`calibration.markdown` (plans every point)."""
    from pathlib import Path

    text = (Path(__file__).parent.parent / "docs" / "concepts.md").read_text()
    begin, end = "<!-- calibration tables: begin -->\n", "\n<!-- calibration tables: end -->"
    doc = text[text.index(begin) + len(begin) : text.index(end)]
    assert doc == C.markdown()
