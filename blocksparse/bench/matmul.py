"""The ``matmul`` suite: a PopSparse-style sweep of dense vs static vs dynamic block-sparse ``W @ X``.

For every ``n``, block size ``b`` and density ``d``: ``W`` (``m x m``, uniformly random pattern) times
a dense ``X`` (``m x n``) as a :class:`~blocksparse.BlockSparseMatrix` (static pattern) and as a
:class:`~blocksparse.DynamicBlockSparseMatrix` (traced pattern, capacity = the non-zero blocks),
each checked against the dense product of the same values (float32, highest precision), timed both
ways (:class:`~blocksparse.bench.Timer`), with TFLOP/s counted on the non-zeros only
(``2 nnz_blocks b^2 n``), the ratio to dense ``jnp.dot`` of the same shape and dtype, and the IPU
planner's estimate beside it (:func:`blocksparse.plan` / :func:`blocksparse.dynamic_plan`, on the
Bow model in float16, or float32 for float32 operands).

The full sizes add, on a GPU, each Triton tiling of :data:`TRITON_VARIANTS` to the static cells
(``config=TritonConfig(...)``, as ``{name}_*`` metrics, the fastest as ``best``), and a ``powerlaw`` cell per
static one: rows of power-law lengths with as many blocks, ``skew_ratio`` = its time / the uniform one's.

They also add the small-block sweep (:data:`SMALL`, :func:`small_blocks`; ``kind="small"``): ``W @ x`` and ``x @ W``
at b = 16 and 32 on uniform, clustered (:meth:`~blocksparse.BlockPattern.clustered`: rows, or for ``x @ W``
columns, sharing their blocks) and power-law patterns. Each cell times the default against dense in the same
orientation (``share_of_dense``: its rate on the non-zeros over dense's), records whether the grouped kernel's
measured rule claimed the product (``claimed``) and ran it (``grouped_ran``), the grouped plan (``plan_group``,
``plan_fill``, ``plan_bytes_per_flop`` against the ungrouped ``worklist_bytes_per_flop``: modelled L2 bytes per
flop), the grouped kernel with its packed operand (``grouped_*``), and, where the rule claimed it, the default as
it was without the rule (``previous_*``: the tuned ``GROUPED_MIN_FILL`` emptied).
"""

from __future__ import annotations

from fractions import Fraction

import jax
import jax.numpy as jnp

import blocksparse as bs

from ._core import Cell, CellFailed, Timer, check_close, implementation, measure, ratio, variant

#: Named sizes: ``tiny`` for tests, ``quick`` for the CPU default, ``full`` for the GPU figures.
SIZES = {
    "tiny": dict(m=64, ns=(16,), blocks=(16,), densities=(1 / 4,), dtype="float32"),
    "quick": dict(m=512, ns=(128,), blocks=(16, 32), densities=(1 / 4, 1 / 16), dtype="float32"),
    "full": dict(m=8192, ns=(256, 4096), blocks=(16, 32, 64, 128), densities=(1 / 4, 1 / 16, 1 / 64), dtype="bfloat16",
                 variants=True),
}  # fmt: skip

#: The small-block sweep of the full sizes (:func:`small_blocks`); ``tiny`` for tests.
SMALL = {
    "tiny": dict(m=64, n=256, blocks=(16,), densities=(1 / 4,), ops=("dsd", "dds"), patterns=("clustered",),
                 dtype="float32"),
    "full": dict(m=8192, n=4096, blocks=(16, 32), densities=(1 / 4, 1 / 16), ops=("dsd", "dds"),
                 patterns=("uniform", "clustered", "power_law"), dtype="bfloat16"),
}  # fmt: skip

#: Triton tilings of the static cells (full sizes, GPU): name -> ``TritonConfig`` fields.
TRITON_VARIANTS = {
    "accT": dict(transpose_acc=True),
    "accN": dict(transpose_acc=False),
    "tn64": dict(tn=64),
    "tn128": dict(tn=128),
    "tn256": dict(tn=256),
    "w4": dict(num_warps=4),
    "w8": dict(num_warps=8),
    "s2": dict(num_stages=2),
    "s4": dict(num_stages=4),
    "tn256w8": dict(tn=256, num_warps=8),
    "ml4": dict(max_len=4),
    "ml8": dict(max_len=8),
    "ml16": dict(max_len=16),
    "tn64ml8": dict(tn=64, max_len=8),
}

#: Columns of this suite's table: (header, metric key, format).
COLUMNS = (
    ("loop ms", "loop_ms", ".4g"),
    ("calls ms", "calls_ms", ".4g"),
    ("TFLOP/s", "tflops", ".3g"),
    ("x dense", "speedup_vs_dense", ".3g"),
    ("IPU TFLOP/s", "ipu_tflops", ".3g"),
    ("IPU x dense", "ipu_speedup", ".3g"),
    ("rel err", "rel_err", ".2g"),
)


def density_label(d: float) -> str:
    """``0.0625 -> "1/16"``."""
    f = Fraction(d).limit_denominator(1 << 16)
    return str(f) if f.numerator != 1 or f.denominator != 1 else "1"


def cells(*, full: bool) -> list[Cell]:
    out = suite(**SIZES["full" if full else "quick"])
    return out + small_blocks(**SMALL["full"]) if full else out


def suite(*, m: int, ns, blocks, densities, dtype: str, variants: bool = False, seed: int = 0) -> list[Cell]:
    """The cells of one sweep: per ``n`` one dense cell, then static and dynamic per ``(b, d)`` (``variants``: the
    Triton tilings on the static cells, and a power-law cell after each)."""
    dense_ms: dict = {}  # (n) -> dense loop ms, shared by the cells of one sweep
    static_ms: dict = {}  # (n, b, d) -> the uniform static loop ms, for the power-law cells' skew_ratio
    out = []
    kinds = ("static", "dynamic", "powerlaw") if variants else ("static", "dynamic")
    for n in ns:
        params = dict(m=m, k=m, n=n, dtype=dtype)
        out.append(Cell("matmul", f"n={n} dense", dict(params, kind="dense"), _dense_run(params, dense_ms, seed)))
        for b in blocks:
            for d in densities:
                for kind in kinds:
                    p = dict(params, b=b, density=d, kind=kind)
                    label = f"n={n} b={b} d={density_label(d)} {kind}"
                    out.append(Cell("matmul", label, p, _sparse_run(p, dense_ms, seed, variants, static_ms)))
    return out


def _operands(m, n, dtype, seed):
    x = jax.random.normal(jax.random.key(seed + 1), (m, n), jnp.dtype(dtype))
    return x


def _dense_time(timer: Timer, params, dense_ms, seed) -> float:
    key = params["n"]
    if key not in dense_ms:
        m, n, dtype = params["m"], params["n"], jnp.dtype(params["dtype"])
        a = jax.random.normal(jax.random.key(seed + 2), (m, m), dtype)
        dense_ms[key] = timer.loop(jnp.dot, a, _operands(m, n, dtype, seed))
    return dense_ms[key]


def _reference(w_dense, x):
    with jax.default_matmul_precision("highest"):
        return jnp.dot(w_dense.astype(jnp.float32), x.astype(jnp.float32))


def _dense_run(params, dense_ms, seed):
    def run(timer: Timer) -> dict:
        m, n, dtype = params["m"], params["n"], jnp.dtype(params["dtype"])
        a = jax.random.normal(jax.random.key(seed + 2), (m, m), dtype)
        x = _operands(m, n, dtype, seed)
        err = check_close(jax.jit(jnp.dot)(a, x), _reference(a, x), dtype=dtype, what="dense jnp.dot")
        loop = _dense_time(timer, params, dense_ms, seed)
        calls = timer.calls(jnp.dot, a, x)
        flops = 2.0 * m * m * n
        ipu = _ipu_dense(m, n, dtype)
        return dict(
            loop_ms=loop, calls_ms=calls, tflops=flops / loop / 1e9, speedup_vs_dense=1.0, rel_err=err,
            ipu_tflops=ipu, ipu_speedup=1.0 if ipu is not None else None, implementation="jnp.dot",
        )  # fmt: skip

    return run


def _ipu_dtype(dtype) -> str:
    return "float32" if jnp.dtype(dtype) == jnp.float32 else "float16"


def _ipu_dense(m, n, dtype) -> float | None:
    """The IPU model's dense ``(m, m) @ (m, n)`` estimate, as the plans compare against (``None``: does not fit)."""
    from blocksparse.ipu import cost

    est = cost.dense_estimate(bs.ipu.BOW, m, m, n, _ipu_dtype(dtype), "float32", 0.6)
    return None if est is None else est.tflops


def _triton(fields):
    def f(M, x):
        from ..ops.matmul import TritonConfig

        return bs.matmul(M, x, implementation="pallas", config=TritonConfig(**fields))

    return f


def _sparse_run(params, dense_ms, seed, variants=False, static_ms=None):
    def run(timer: Timer) -> dict:
        m, n, b, d = params["m"], params["n"], params["b"], params["density"]
        dtype = jnp.dtype(params["dtype"])
        if params["kind"] == "powerlaw":  # a few very long rows, as many blocks as the uniform pattern
            pattern = bs.BlockPattern.power_law(seed, (m, m), (b, b), d)
            W = bs.BlockSparseMatrix(
                pattern, jax.random.normal(jax.random.key(seed), (pattern.nnz_blocks, b, b), dtype)
            )
        else:
            W = bs.random(jax.random.key(seed), (m, m), b, d, dtype=dtype, pattern_seed=seed)
        x = _operands(m, n, dtype, seed)
        nnz = W.pattern.nnz_blocks
        if params["kind"] in ("static", "powerlaw"):
            M = W
            try:
                plan = bs.plan(W.pattern, n, dtype=_ipu_dtype(dtype))
            except bs.NoValidPlanError as e:
                plan, why = None, str(e)
        else:
            M = bs.DynamicBlockSparseMatrix.from_static(W, capacity=nnz)
            try:
                plan = bs.dynamic_plan((m, m), b, nnz, n, dtype=_ipu_dtype(dtype))
            except bs.NoValidPlanError as e:
                plan, why = None, str(e)

        def product(M, x):
            return M @ x

        with bs.dispatch_log() as log:
            y = jax.jit(product)(M, x)
        err = check_close(y, _reference(W.to_dense(), x), dtype=dtype, what=f"{params['kind']} W @ X")
        if y.dtype != jnp.result_type(dtype, x.dtype):
            raise CellFailed(f"expected the output dtype {jnp.result_type(dtype, x.dtype)}; got {y.dtype}")
        loop = timer.loop(product, M, x)
        calls = timer.calls(product, M, x)
        dense = _dense_time(timer, params, dense_ms, seed)
        flops = 2.0 * nnz * b * b * n
        metrics = dict(
            loop_ms=loop, calls_ms=calls, tflops=flops / loop / 1e9, speedup_vs_dense=dense / loop,
            dense_loop_ms=dense, rel_err=err, nnz_blocks=nnz, implementation=implementation(log),
            ipu_tflops=None if plan is None else plan.tflops, ipu_speedup=None if plan is None else plan.speedup,
        )  # fmt: skip
        if plan is None:
            metrics["ipu_note"] = " ".join(why.split())[:200]
        key = (n, b, d)
        if params["kind"] == "static" and static_ms is not None:
            static_ms[key] = loop
        if params["kind"] == "powerlaw":
            metrics["max_row"] = int(W.pattern.row_lengths.max())
            if static_ms and key in static_ms:
                metrics["skew_ratio"] = loop / static_ms[key]
        if variants and params["kind"] == "static":
            want = _reference(W.to_dense(), x)
            for name, fields in TRITON_VARIANTS.items():
                metrics.update(variant(timer, name, _triton(fields), M, x, needs="gpu", want=want, dtype=dtype))
            timed = {k: metrics[f"{k}_loop_ms"] for k in TRITON_VARIANTS if metrics.get(f"{k}_loop_ms")}
            if timed:
                metrics["best"] = min(timed, key=timed.get)
                metrics["best_speedup"] = loop / timed[metrics["best"]]
        return metrics

    return run


# -- the small-block sweep ----------------------------------------------------------------------------------------
_OPS = {"dsd": "W @ x", "dds": "x @ W"}


def small_blocks(*, m: int, n: int, blocks, densities, ops, patterns, dtype: str, seed: int = 0) -> list[Cell]:
    """One cell per ``(op, pattern, b, d)``: ``W`` ``m x m`` (``pattern``: ``"uniform"``, ``"clustered"`` or
    ``"power_law"``), ``x`` ``m x n`` (``W @ x``, ``op="dsd"``) or ``n x m`` (``x @ W``, ``"dds"``); see the module
    docstring for the metrics."""
    dense_ms: dict = {}  # op -> the dense loop ms of that orientation, shared by the sweep's cells
    out = []
    for op in ops:
        for pattern in patterns:
            for b in blocks:
                for d in densities:
                    p = dict(m=m, k=m, n=n, dtype=dtype, b=b, density=d, kind="small", op=op, pattern=pattern)
                    label = f"small n={n} b={b} d={density_label(d)} {_OPS[op]} {pattern}"
                    out.append(Cell("matmul", label, p, _small_run(p, dense_ms, seed)))
    return out


def small_pattern(params, seed) -> bs.BlockPattern:
    """The ``m x m`` pattern of a small-block cell's ``params`` (``m``, ``b``, ``density``, ``op``, ``pattern``), also
    what ``benchmarks/profile_kernels.py`` profiles."""
    m, b, d, op = params["m"], params["b"], params["density"], params["op"]
    if params["pattern"] == "clustered":  # for x @ W the block columns share their rows: the grouped units' axis
        return bs.BlockPattern.clustered(seed, (m, m), (b, b), d, axis=1 if op == "dds" else 0)
    if params["pattern"] == "power_law":
        return bs.BlockPattern.power_law(seed, (m, m), (b, b), d)
    if params["pattern"] == "uniform":
        return bs.BlockPattern.random(seed, (m, m), (b, b), d)
    raise ValueError(f"expected a pattern in uniform, clustered, power_law; got {params['pattern']!r}")


def _small_run(params, dense_ms, seed):
    def run(timer: Timer) -> dict:
        import re

        from ..ops.matmul import tuned
        from ..ops.matmul.triton import grouped_kernel

        m, n, b, op = params["m"], params["n"], params["b"], params["op"]
        dtype = jnp.dtype(params["dtype"])
        pattern = small_pattern(params, seed)
        W = bs.BlockSparseMatrix(pattern, jax.random.normal(jax.random.key(seed), (pattern.nnz_blocks, b, b), dtype))
        x = jax.random.normal(jax.random.key(seed + 1), (m, n) if op == "dsd" else (n, m), dtype)
        w = W.to_dense()
        want = _reference(*((w, x) if op == "dsd" else (x, w)))

        def make(config=None):  # a new function per variant: the Timer caches its loops by function
            if op == "dsd":
                return lambda W, x: bs.matmul(W, x, config=config)
            return lambda W, x: bs.matmul(x, W, config=config)

        if op not in dense_ms:
            a = jax.random.normal(jax.random.key(seed + 2), (m, m), dtype)
            dense_ms[op] = timer.loop(jnp.dot, *((a, x) if op == "dsd" else (x, a)))
        dense = dense_ms[op]
        default = make()
        metrics = measure(timer, default, W, x, want=want, dtype=dtype, what=f"{_OPS[op]} ({params['pattern']})")
        flops = 2.0 * pattern.nnz_blocks * b * b * n
        plan = grouped_kernel.plan(op, pattern, n, grouped_kernel.CLAIMED, dtype)
        claimed = grouped_kernel.claims(op, n, pattern, dtype)
        jaxpr = str(jax.make_jaxpr(default)(W, x))
        metrics.update(
            tflops=flops / metrics["loop_ms"] / 1e9, dense_loop_ms=dense, speedup_vs_dense=dense / metrics["loop_ms"],
            share_of_dense=flops / (2.0 * m * m * n) * dense / metrics["loop_ms"], nnz_blocks=pattern.nnz_blocks,
            claimed=claimed, grouped_ran=bool(re.search(r"bs_\w+_grouped", jaxpr)), plan_group=plan.group,
            plan_method=plan.method, plan_fill=plan.fill, plan_bytes_per_flop=plan.bytes_per_flop,
            worklist_bytes_per_flop=plan.ungrouped_bytes_per_flop,
        )  # fmt: skip
        if claimed != metrics["grouped_ran"] and metrics["implementation"].endswith("pallas"):
            raise CellFailed(f"expected the grouped kernel to run {'' if claimed else 'only '}where the rule claims "
                             f"the product (claimed={claimed}); it ran: {metrics['grouped_ran']}")  # fmt: skip
        if claimed:  # the default without the rule: what ran before it
            with tuned.override(GROUPED_MIN_FILL={}):
                metrics.update(variant(timer, "previous", make(), W, x, want=want, dtype=dtype))
            ratio(metrics, "previous_loop_ms", "loop_ms", "speedup_vs_previous")
        metrics.update(variant(timer, "grouped", make(grouped_kernel.CLAIMED), W, x, needs="gpu", want=want,
                               dtype=dtype))  # fmt: skip
        ratio(metrics, "loop_ms", "grouped_loop_ms", "grouped_vs_default")
        if metrics.get("grouped_vs_default"):
            metrics["grouped_share_of_dense"] = metrics["share_of_dense"] * metrics["grouped_vs_default"]
        return metrics

    return run
