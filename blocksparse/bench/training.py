"""The ``training`` suite: training steps with a block mask that moves every step (RigL) vs a static mask vs dense.

The model is a 2-layer MLP ``y = relu(x @ W1) @ W2`` (``m -> m -> m``), mean squared error, plain SGD
(float32 accumulation and loss). One cell per variant, all from the same random pattern and values:

- ``rigl``: both weights :class:`~blocksparse.DynamicBlockSparseMatrix`; every step does SGD and then
  :func:`blocksparse.prune.rigl_update` on each weight (drop the smallest ``drop`` fraction of blocks,
  regrow as many where the sampled dense gradient, :func:`blocksparse.sdd`, is largest);
- ``dynamic``: the same dynamic weights, SGD only (the cost of traced patterns without the update);
- ``static``: :class:`~blocksparse.BlockSparseMatrix` weights with the same pattern, SGD only;
- ``dense``: dense weights (the sparse ones densified), SGD only (the cell every ratio divides by).

Times per step with :class:`~blocksparse.bench.Timer` (``loop_ms``: steps inside one jitted loop, each from
the same parameters; ``calls_ms``: back-to-back jitted steps from Python). Checks: every variant's first loss
equals the dense one's (the same function of the same values), and the RigL step moves exactly
``round(drop * capacity)`` blocks per layer.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

import blocksparse as bs

from ._core import Cell, CellFailed, Timer, implementation
from .matmul import density_label

SIZES = {
    "tiny": dict(m=64, batch=32, block=16, density=1 / 4, drop=0.25, dtype="float32"),
    "quick": dict(m=256, batch=256, block=16, density=1 / 4, drop=0.1, dtype="float32"),
    "full": dict(m=4096, batch=4096, block=32, density=1 / 16, drop=0.1, dtype="bfloat16"),
}

COLUMNS = (
    ("loop ms", "loop_ms", ".4g"),
    ("calls ms", "calls_ms", ".4g"),
    ("steps/s", "steps_per_s", ".4g"),
    ("x dense", "loop_vs_dense", ".3g"),
    ("loss0", "loss0", ".4f"),
)

VARIANTS = ("dense", "static", "dynamic", "rigl")
LEARNING_RATE = 1e-2


def cells(*, full: bool) -> list[Cell]:
    return suite(**SIZES["full" if full else "quick"])


def suite(*, m: int, batch: int, block: int, density: float, drop: float, dtype: str, seed: int = 0) -> list[Cell]:
    setup = functools.cache(lambda: _setup(m, batch, block, density, jnp.dtype(dtype), seed))
    shared: dict = {}  # the dense cell's times and loss, for the others' ratios and check
    params = dict(m=m, batch=batch, block=block, density=density, drop_fraction=drop, dtype=dtype)
    return [
        Cell(
            "training",
            f"{v} b={block} d={density_label(density)}",
            dict(params, variant=v),
            _run(v, setup, shared, drop),
            restore=functools.partial(_restore_dense, shared) if v == "dense" else None,
        )  # fmt: skip
        for v in VARIANTS
    ]


def _restore_dense(shared: dict, metrics: dict) -> None:
    """A resumed run that keeps the dense cell: its first loss and times, which the other cells check and divide by."""
    shared.update({k: metrics[k] for k in ("loss0", "loop_ms", "calls_ms") if k in metrics})


def _mm(x, W):
    if isinstance(W, bs.BlockSparseMatrix | bs.DynamicBlockSparseMatrix):
        return bs.matmul(x, W)
    return x @ W


def make_step(variant: str, lr: float, drop: float):
    """``step(params, x, t, key) -> (params, loss)`` for one variant."""
    rigl = variant == "rigl"
    sparse = variant != "dense"

    def loss_fn(vals, probes, mats, x, t):
        W1, W2 = (m.with_data(v) for m, v in zip(mats, vals, strict=True)) if sparse else vals
        h = _mm(x, W1)
        if probes is not None:  # zeros whose gradients are the layers' output gradients
            h = h + probes[0]
        a = jax.nn.relu(h)
        out = _mm(a, W2)
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
            W1 = bs.prune.rigl_update(W1, k1, drop_fraction=drop, dense_grad=lambda C: bs.sdd(x.T, gp[0], C).data)
            W2 = bs.prune.rigl_update(W2, k2, drop_fraction=drop, dense_grad=lambda C: bs.sdd(a.T, gp[1], C).data)
        return (W1, W2), loss

    return step


def _setup(m, batch, block, density, dtype, seed):
    k1, k2, kx, kt = jax.random.split(jax.random.key(seed), 4)
    scale = 1.0 / np.sqrt(m * density)  # fan-in of a unit: m * density inputs
    S1, S2 = (bs.random(k, (m, m), block, density, dtype) for k in (k1, k2))
    S1, S2 = (W.with_data((W.data.astype(jnp.float32) * scale).astype(dtype)) for W in (S1, S2))
    x = jax.random.normal(kx, (batch, m), dtype)
    t = jax.random.normal(kt, (batch, m), dtype)
    D1, D2 = (bs.DynamicBlockSparseMatrix.from_static(W) for W in (S1, S2))
    params = {"rigl": (D1, D2), "dynamic": (D1, D2), "static": (S1, S2), "dense": (S1.to_dense(), S2.to_dense())}
    return params, x, t


def _run(name, setup, shared, drop):
    def run(timer: Timer) -> dict:
        params, x, t = setup()
        step = make_step(name, LEARNING_RATE, drop)
        key = jax.random.key(1)
        with bs.dispatch_log() as log:
            new, loss = jax.jit(step)(params[name], x, t, key)
        out = dict(loss0=float(loss), implementation=implementation(log) if name != "dense" else "dense: xla dot")
        if name == "dense":
            shared["loss0"] = out["loss0"]
        elif "loss0" in shared:
            tol = 1e-4 if x.dtype == jnp.float32 else 2e-2
            if not abs(out["loss0"] - shared["loss0"]) <= tol * max(abs(shared["loss0"]), 1.0):
                raise CellFailed(f"{name}: expected the dense model's first loss {shared['loss0']:.6g}; got {loss:.6g}")
        if name == "rigl":  # the update really moves its blocks: slots whose coordinates changed in one step
            cap = params[name][0].capacity
            expected = int(round(drop * cap))
            pairs = zip(new, params[name], strict=True)
            moved = [int(jnp.sum((N.rows != D.rows) | (N.cols != D.cols))) for N, D in pairs]
            if moved != [expected] * 2:
                raise CellFailed(f"rigl: expected {expected} blocks moved per layer; got {moved}")
            out.update(capacity=cap, moved_per_layer=expected)
        out["loop_ms"] = timer.loop(step, params[name], x, t, key)
        out["calls_ms"] = timer.calls(step, params[name], x, t, key)
        out["steps_per_s"] = 1e3 / out["loop_ms"]
        if name == "dense":
            shared.update(loop_ms=out["loop_ms"], calls_ms=out["calls_ms"])
        for kind in ("loop", "calls"):
            if shared.get(f"{kind}_ms"):
                out[f"{kind}_vs_dense"] = out[f"{kind}_ms"] / shared[f"{kind}_ms"]
        return out

    return run
