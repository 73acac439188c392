"""The ``mosaic`` suite: the Mosaic GPU kernels (Hopper: TMA + wgmma) against Triton, XLA and dense, per cell.

Four kinds of cells, each timing in one run (``*_loop_ms``: :meth:`~blocksparse.bench.Timer.loop`, one jitted
loop; ``*_calls_ms``: back-to-back jitted calls) and checking against the dense float32 product:

- ``dsd`` (``W @ x``, ``W`` of ``m x m`` with ``b x b`` blocks at density ``d``, uniform or power-law rows):
  ``dense`` (``jnp.dot``), ``xla``, ``triton`` (``implementation="pallas"``), ``mosaic``
  (``implementation="mosaic"``: its default plan), then each forced ``MosaicConfig`` of :data:`DSD_VARIANTS`
  (column tile, depth, warpgroups, cluster, grid order, the persistent kernel and its reduction), passed as
  ``bs.matmul(..., config=)``; a ``gelu`` cell fuses a bias and the activation into every sparse kernel;
- ``dds`` (``x @ W``, ``x`` of ``m x k``, ``W`` of ``k x n``): the same with ``DdsConfig`` (:data:`DDS_VARIANTS`);
- ``sdd`` (the weight gradient of a ``m x n`` sparse layer over ``K`` tokens, in the layout the backward has
  its operands: ``dsd``: ``dy (m, K) @ x.T``, ``dds``: ``x.T @ dy (K, n)``): ``bs.sdd`` with Triton (its default
  split of the tokens; ``triton_unsplit`` one program per block, ``TritonConfig(sdd_splits=1)``, and each split
  of :data:`TRITON_SPLITS`), Mosaic, and each ``SddConfig`` of :data:`SDD_VARIANTS`;
- ``bands`` (blocks of 16 and 32: the banded Mosaic kernel, ``x`` slabs shared by bands of block columns): the
  default Mosaic path and each ``BandConfig`` of :data:`BAND_VARIANTS`; ``*_share`` = density x dense time /
  the kernel's time (the share of the dense rate it reaches).

The cell's own ``loop_ms`` / ``calls_ms`` / ``implementation`` are the library's default (``bs.matmul(W, x)``:
what the ordering rules pick). Kernels this machine cannot run are recorded as ``*_skipped`` with the reason
(off a Hopper GPU every Mosaic variant, off a GPU every Triton one): on a CPU the cells run at tiny sizes and
time dense and XLA only. A variant a plan refuses (shared memory, registers) is recorded as skipped, not a
failure; a wrong result fails the cell. ``speedup_vs_*`` = the other's time / Mosaic's.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np

import blocksparse as bs
from blocksparse.ops.matmul import epilogue

from ._core import Cell, Timer, measure, ratio, variant
from .matmul import density_label

#: Forced Mosaic ``dsd`` variants: name -> ``MosaicConfig`` fields.
DSD_VARIANTS = {
    **{f"tn{tn}_s{s}": dict(tn=tn, stages=s) for tn, s in itertools.product((128, 256), (2, 3, 4))},
    "tn64": dict(tn=64),
    "consumers2": dict(consumers=2),
    "cluster2": dict(cluster=2, persistent=False),
    "order_tiles": dict(grid_order="tiles", persistent=False),
    "order_units": dict(grid_order="units", persistent=False),
    "per_item": dict(persistent=False),
    "persistent": dict(persistent=True),
    "persistent_reduce_xla": dict(persistent=True, reduce="xla"),
    "persistent_reduce_kernel": dict(persistent=True, reduce="kernel"),
}
#: Forced Mosaic ``dds`` variants: name -> ``DdsConfig`` fields.
DDS_VARIANTS = {
    **{f"tm{tm}_s{s}": dict(tm=tm, stages=s) for tm, s in itertools.product((64, 128, 256), (2, 3, 4))},
    "order_tiles": dict(grid_order="tiles", persistent=False),
    "order_units": dict(grid_order="units", persistent=False),
    "per_item": dict(persistent=False),
    "persistent": dict(persistent=True),
    "persistent_reduce_xla": dict(persistent=True, reduce="xla"),
}
#: Forced Mosaic ``sdd`` variants: name -> ``SddConfig`` fields.
SDD_VARIANTS = {
    **{f"tk{tk}_s{s}": dict(tk=tk, stages=s) for tk, s in itertools.product((64, 128), (3, 4))},
    **{f"splits{k}": dict(splits=k) for k in (1, 2, 4)},
}
#: Forced Triton token splits of the ``sdd`` cells (``TritonConfig(sdd_splits=k)``).
TRITON_SPLITS = (2, 4, 8, 16)
#: Forced banded-kernel variants: name -> ``BandConfig`` fields.
BAND_VARIANTS = {
    **{f"tm{tm}": dict(tm=tm) for tm in (64, 128)},
    **{f"width{w}": dict(width=w) for w in (64, 128)},
    "tm64_width256": dict(tm=64, width=256),
    **{f"stages{s}": dict(stages=s) for s in (2, 3, 4)},
}

#: ``dsd``: (m, ns, blocks, inverse densities, patterns, epilogues); ``dds``: ((m, k, n) shapes, blocks, inverse
#: densities); ``sdd``: ((kind, m, n, K) cells, blocks, inverse densities); ``bands``: ((op, m, k, n), blocks,
#: inverse densities). ``variants``: whether the forced variants run (the CPU sizes time the defaults only).
SIZES = {
    "tiny": dict(dtype="float32", variants=False, dsd=(128, (16,), (64,), (2,), ("uniform",), (None,)),
                 dds=(((32, 128, 128),), (64,), (2,)), sdd=((("dsd", 128, 128, 32),), (64,), (2,)),
                 bands=((("dsd", 64, 64, 16),), (16,), (4,))),
    "quick": dict(dtype="float32", variants=False, dsd=(256, (64,), (64,), (4,), ("uniform", "powerlaw"), (None,)),
                  dds=(((64, 256, 256),), (64,), (4,)),
                  sdd=((("dsd", 256, 256, 64), ("dds", 128, 256, 64)), (64,), (4,)),
                  bands=((("dsd", 256, 256, 64), ("dds", 64, 256, 256)), (16, 32), (4,))),
    "full": dict(dtype="bfloat16", variants=True,
                 dsd=(8192, (4096, 256), (64, 128), (4, 16, 64), ("uniform", "powerlaw"), (None, "gelu")),
                 dds=(((32768, 384, 1536), (8192, 8192, 8192)), (64, 128), (4, 8, 16)),
                 sdd=((("dsd", 8192, 8192, 4096), ("dds", 384, 1536, 32768)), (16, 32, 64, 128), (4, 16, 64)),
                 bands=((("dsd", 8192, 8192, 4096), ("dsd", 8192, 8192, 256), ("dds", 32768, 384, 1536)), (16, 32),
                        (4, 16, 64))),
}  # fmt: skip

COLUMNS = (
    ("loop ms", "loop_ms", ".4g"),
    ("calls ms", "calls_ms", ".4g"),
    ("dense ms", "dense_loop_ms", ".4g"),
    ("triton ms", "triton_loop_ms", ".4g"),
    ("mosaic ms", "mosaic_loop_ms", ".4g"),
    ("x triton", "speedup_vs_triton", ".3g"),
    ("x dense", "speedup_vs_dense", ".3g"),
    ("best variant", "best", ""),
    ("rel err", "rel_err", ".2g"),
)


def config(kind: str, fields: dict):
    """The public ``config=`` of one forced variant: ``kind`` in mosaic, dds, sdd, bands, triton."""
    from ..ops.matmul import BandConfig, DdsConfig, MosaicConfig, SddConfig, TritonConfig

    cls = {"mosaic": MosaicConfig, "dds": DdsConfig, "sdd": SddConfig, "bands": BandConfig,
           "triton": TritonConfig}[kind]  # fmt: skip
    return cls(**fields)


def cells(*, full: bool) -> list[Cell]:
    return suite(**SIZES["full" if full else "quick"])


def suite(*, dtype: str, variants: bool, dsd, dds, sdd, bands, seed: int = 0) -> list[Cell]:
    out = []
    m, ns, blocks, inv_ds, patterns, epilogues = dsd
    for n, b, inv_d, pattern, act in itertools.product(ns, blocks, inv_ds, patterns, epilogues):
        p = dict(op="dsd", m=m, k=m, n=n, b=b, density=1 / inv_d, pattern=pattern, epilogue=act, dtype=dtype)
        label = f"dsd n={n} b={b} d=1/{inv_d} {pattern}" + (f" {act}" if act else "")
        out.append(Cell("mosaic", label, p, _product(p, DSD_VARIANTS if variants else {}, seed)))
    shapes, blocks, inv_ds = dds
    for (m, k, n), b, inv_d in itertools.product(shapes, blocks, inv_ds):
        p = dict(op="dds", m=m, k=k, n=n, b=b, density=1 / inv_d, pattern="uniform", epilogue=None, dtype=dtype)
        label = f"dds {m}x{k}@{k}x{n} b={b} d=1/{inv_d}"
        out.append(Cell("mosaic", label, p, _product(p, DDS_VARIANTS if variants else {}, seed)))
    grads, blocks, inv_ds = sdd
    for (kind, m, n, k), b, inv_d in itertools.product(grads, blocks, inv_ds):
        p = dict(op="sdd", kind=kind, m=m, n=n, K=k, b=b, density=1 / inv_d, dtype=dtype)
        label = f"sdd {kind} {m}x{n} K={k} b={b} d=1/{inv_d}"
        out.append(Cell("mosaic", label, p, _sdd(p, variants, seed)))
    shapes, blocks, inv_ds = bands
    for (op, m, k, n), b, inv_d in itertools.product(shapes, blocks, inv_ds):
        p = dict(op=op, m=m, k=k, n=n, b=b, density=1 / inv_d, pattern="uniform", epilogue=None, dtype=dtype,
                 kernel="bands")  # fmt: skip
        label = f"bands {op} {m}x{k}x{n} b={b} d={density_label(1 / inv_d)}"
        out.append(Cell("mosaic", label, p, _product(p, BAND_VARIANTS if variants else {}, seed, kind="bands")))
    return out


def _matrix(pattern: str, shape, b: int, density: float, dtype, seed: int) -> bs.BlockSparseMatrix:
    """Uniform random blocks, or rows of power-law lengths (a few very long rows) with as many blocks."""
    if pattern == "uniform":
        return bs.random(jax.random.key(seed), shape, b, density, dtype)
    p = bs.BlockPattern.power_law(seed, shape, (b, b), density)
    return bs.BlockSparseMatrix(p, jax.random.normal(jax.random.key(seed), (p.nnz_blocks, b, b), dtype))


def _best(out: dict, names) -> None:
    timed = {n: out[f"{n}_loop_ms"] for n in names if out.get(f"{n}_loop_ms")}
    for n in timed:
        ratio(out, "triton_loop_ms", f"{n}_loop_ms", f"{n}_speedup_vs_triton")
    if timed:
        out["best"] = min(timed, key=timed.get)
        ratio(out, "mosaic_loop_ms", f"{out['best']}_loop_ms", "best_vs_default_mosaic")


def _product(p, variants: dict, seed, kind: str | None = None):
    """A ``dsd`` (``W @ x``) or ``dds`` (``x @ W``) cell: dense, XLA, Triton, Mosaic and the forced variants."""
    kind = kind or ("mosaic" if p["op"] == "dsd" else "dds")

    def run(timer: Timer) -> dict:
        dtype = jnp.dtype(p["dtype"])
        dsd = p["op"] == "dsd"
        m, k, n, b = p["m"], p["k"], p["n"], p["b"]
        W = _matrix(p["pattern"], (m, k) if dsd else (k, n), b, p["density"], dtype, seed)
        x = jax.random.normal(jax.random.key(seed + 1), (k, n) if dsd else (m, k), dtype)
        fused = {}
        if p["epilogue"] is not None:
            cols = n
            fused = dict(bias=jax.random.normal(jax.random.key(seed + 2), (cols,), jnp.float32),
                         activation=p["epilogue"])  # fmt: skip
        operands = (lambda W, x: (W, x)) if dsd else (lambda W, x: (x, W))

        def sparse(**kw):
            return lambda W, x: bs.matmul(*operands(W, x), **fused, **kw)

        def dense_fn(w, x):  # jnp.dot, then the same epilogue in XLA
            y = jnp.dot(*operands(w, x), preferred_element_type=jnp.float32)
            return epilogue.apply(y, fused["bias"][None, :], fused["activation"]) if fused else y

        with jax.default_matmul_precision("highest"):
            want = dense_fn(W.to_dense().astype(jnp.float32), x.astype(jnp.float32))
        check = dict(want=want, dtype=dtype)
        out = measure(timer, sparse(), W, x, what=f"{p['op']} default", **check)
        dense = W.to_dense()
        out.update(variant(timer, "dense", lambda w, x: dense_fn(w, x).astype(dtype), dense, x, **check))
        out.update(variant(timer, "xla", sparse(implementation="xla"), W, x, **check))
        out.update(variant(timer, "triton", sparse(implementation="pallas"), W, x, needs="gpu", **check))
        out.update(variant(timer, "mosaic", sparse(implementation="mosaic"), W, x, needs="hopper", **check))
        for name, fields in variants.items():
            fn = lambda W, x, fields=fields: sparse(implementation="mosaic", config=config(kind, fields))(W, x)  # noqa: E731
            out.update(variant(timer, name, fn, W, x, needs="hopper", what=f"{p['op']} {name}", **check))
        ratio(out, "triton_loop_ms", "mosaic_loop_ms", "speedup_vs_triton")
        ratio(out, "dense_loop_ms", "mosaic_loop_ms", "speedup_vs_dense")
        ratio(out, "dense_loop_ms", "loop_ms", "default_speedup_vs_dense")
        if kind == "bands":
            for name in ("triton", "mosaic", *variants):
                if out.get(f"{name}_loop_ms") and out.get("dense_loop_ms"):
                    out[f"{name}_share"] = p["density"] * out["dense_loop_ms"] / out[f"{name}_loop_ms"]
        tokens = n if dsd else m
        flops = 2.0 * tokens * W.nnz_blocks * b * b
        for name in ("mosaic", "triton"):
            if out.get(f"{name}_loop_ms"):
                out[f"{name}_tflops"] = flops / (out[f"{name}_loop_ms"] * 1e-3) / 1e12
        out.update(nnz_blocks=W.nnz_blocks, max_row=int(np.bincount(W.pattern.rows, minlength=W.pattern.grid[0]).max()))
        _best(out, variants)
        return out

    return run


def _sdd(p, variants: bool, seed):
    def run(timer: Timer) -> dict:
        dtype = jnp.dtype(p["dtype"])
        kind, m, n, k, b = p["kind"], p["m"], p["n"], p["K"], p["b"]
        W = bs.random(jax.random.key(seed), (m, n), b, p["density"], dtype)
        k1, k2 = jax.random.split(jax.random.key(seed + 1))
        if kind == "dsd":  # dW = dy (m, K) @ x.T, x stored (n, K)
            P, Q = jax.random.normal(k1, (m, k), dtype), jax.random.normal(k2, (n, k), dtype)
            mat = lambda P, Q: (P, Q.T)  # noqa: E731
        else:  # dW = x.T @ dy, x stored (K, m), dy (K, n)
            P, Q = jax.random.normal(k1, (k, m), dtype), jax.random.normal(k2, (k, n), dtype)
            mat = lambda P, Q: (P.T, Q)  # noqa: E731

        def grad(**kw):
            return lambda P, Q: bs.sdd(*mat(P, Q), W, **kw).data

        with jax.default_matmul_precision("highest"):
            a, c = mat(P.astype(jnp.float32), Q.astype(jnp.float32))
            full = jnp.dot(a, c)
        bh, bw = W.block_size
        g = full.reshape(W.pattern.grid[0], bh, W.pattern.grid[1], bw)
        want = g[W.pattern.rows, :, W.pattern.cols, :]
        check = dict(want=want, dtype=dtype)
        out = measure(timer, grad(), P, Q, what=f"sdd {kind} default", **check)
        dense = lambda P, Q: jnp.dot(*mat(P, Q), preferred_element_type=jnp.float32).astype(dtype)  # noqa: E731
        out.update(variant(timer, "dense", dense, P, Q))
        out.update(variant(timer, "xla", grad(implementation="xla"), P, Q, **check))
        out.update(variant(timer, "triton", grad(implementation="pallas"), P, Q, needs="gpu", **check))
        splits = (1, *TRITON_SPLITS) if variants else (1,)
        for s in splits:
            name = "triton_unsplit" if s == 1 else f"triton_splits{s}"
            fn = lambda P, Q, s=s: grad(implementation="pallas", config=config("triton", dict(sdd_splits=s)))(P, Q)  # noqa: E731
            out.update(variant(timer, name, fn, P, Q, needs="gpu", what=f"sdd {name}", **check))
        out.update(variant(timer, "mosaic", grad(implementation="mosaic"), P, Q, needs="hopper", **check))
        names = list(SDD_VARIANTS) if variants else []
        for name in names:
            fields = SDD_VARIANTS[name]
            fn = lambda P, Q, fields=fields: grad(implementation="mosaic", config=config("sdd", fields))(P, Q)  # noqa: E731
            out.update(variant(timer, name, fn, P, Q, needs="hopper", what=f"sdd {name}", **check))
        ratio(out, "triton_loop_ms", "mosaic_loop_ms", "speedup_vs_triton")
        ratio(out, "dense_loop_ms", "mosaic_loop_ms", "speedup_vs_dense")
        ratio(out, "triton_unsplit_loop_ms", "triton_loop_ms", "triton_split_speedup")
        out["nnz_blocks"] = W.nnz_blocks
        _best(out, names)
        return out

    return run
