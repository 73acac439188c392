"""The suite protocol of ``blocksparse bench``: :class:`Cell`, :class:`CellFailed` and the one :class:`Timer`.

A suite is a module ``blocksparse.bench.<suite>`` exposing ``cells(*, full: bool) -> list[Cell]``
(``full=False``: CPU-sized, the whole suite well under a minute on a 2-core CPU; ``full=True``: GPU
sizes). Each cell's ``run(timer)`` does the work, checks it against the dense (or pure-JAX reference)
computation, raising :class:`CellFailed` with a reason naming the expected and the actual value when
they disagree, and returns JSON-able metrics: times in ms, ratios, errors, and ``"implementation"``
(which backend ran, from :func:`blocksparse.dispatch_log`; see :func:`implementation`).

Example::

    >>> import jax.numpy as jnp
    >>> from blocksparse.bench import Cell, Timer, run_cell
    >>> def run(timer):
    ...     x = jnp.ones((64, 64))
    ...     return {"loop_ms": timer.loop(jnp.dot, x, x), "calls_ms": timer.calls(jnp.dot, x, x)}
    >>> result = run_cell(Cell("demo", "64 x 64 dot", {"n": 64}, run), Timer(iters=2, trials=1))
    >>> result.ok, result.metrics["loop_ms"] > 0
    (True, True)
"""

from __future__ import annotations

import dataclasses
import statistics
import time
import traceback
from collections.abc import Callable, Hashable, Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "Cell",
    "CellFailed",
    "CellSkipped",
    "Result",
    "Timer",
    "check_close",
    "implementation",
    "measure",
    "missing",
    "ratio",
    "run_cell",
    "tolerance",
    "variant",
    "write_json",
]


class CellFailed(Exception):
    """A cell's result disagrees with the dense/reference computation (the message names expected and actual)."""


class CellSkipped(Exception):
    """A cell cannot run here (no GPU, a peer library missing): its row says why; not a failure."""


@dataclasses.dataclass
class Cell:
    """One row of a suite's table.

    Attributes:
        suite: the suite's name (``"matmul"``, ``"gnn-variants"``, ...; a peer script's own name).
        label: the table row's name, e.g. ``"b=32 d=1/8 static"``.
        params: JSON-able parameters of the cell (shape, block size, density, dtype, ...).
        run: does the work with the given :class:`Timer`, checks it, and returns JSON-able metrics;
            raises :class:`CellFailed` when the result disagrees with the reference.
        restore: for a cell whose metrics later cells use (a baseline's time, a loss they must match):
            puts a kept result's metrics back where ``run`` would have left them, when a resumed run keeps
            the cell rather than running it again (``resume`` of :func:`~blocksparse.bench.run_cells`).
    """

    suite: str
    label: str
    params: dict
    run: Callable[[Timer], dict]
    restore: Callable[[dict], None] | None = None


@dataclasses.dataclass
class Result:
    """What :func:`run_cell` made of a :class:`Cell`: ``ok`` and its metrics, or the reason it failed.

    A skipped cell (:class:`CellSkipped`) is ``ok`` with no metrics and the reason in ``skipped``.
    """

    suite: str
    label: str
    params: dict
    ok: bool
    metrics: dict = dataclasses.field(default_factory=dict)
    error: str | None = None
    skipped: str | None = None
    seconds: float = 0.0  # wall time of the whole cell, compilation and checking included
    #: The cell could not run (an exception other than :class:`CellFailed`: a missing file or extra, a bug),
    #: as opposed to a result that disagrees with the reference.
    broken: bool = False

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def run_cell(cell: Cell, timer: Timer) -> Result:
    """Run one cell; a :class:`CellFailed` or any other exception becomes a failed :class:`Result`.

    An unexpected exception is reported with its type and the innermost frame, so that a table row
    says where the cell broke without printing a traceback in the middle of the table.
    """
    t0 = time.perf_counter()
    common = dict(suite=cell.suite, label=cell.label, params=cell.params)
    try:
        metrics = cell.run(timer)
    except CellFailed as e:
        return Result(**common, ok=False, error=" ".join(str(e).split()), seconds=time.perf_counter() - t0)
    except CellSkipped as e:
        return Result(**common, ok=True, skipped=" ".join(str(e).split()), seconds=time.perf_counter() - t0)
    except Exception as e:  # noqa: BLE001 - one broken cell must not stop the suite
        frame = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
        where = f" (at {frame.filename.rsplit('/', 1)[-1]}:{frame.lineno})" if frame else ""
        message = " ".join(f"{type(e).__name__}: {e}".split())[:400] + _install_hint(e)
        return Result(**common, ok=False, error=message + where, seconds=time.perf_counter() - t0, broken=True)
    if not isinstance(metrics, dict):
        error = f"expected run() to return a dict of metrics; got {type(metrics).__name__}"
        return Result(**common, ok=False, error=error, seconds=time.perf_counter() - t0)
    return Result(**common, ok=True, metrics=_jsonable(metrics), seconds=time.perf_counter() - t0)


#: Optional dependencies -> the extra of ``pip install 'blocksparse[EXTRA]'`` that brings them.
EXTRAS = {"optax": "train", "safetensors": "models", "tokenizers": "models", "flax": "flax", "equinox": "equinox",
          "matplotlib": "bench", "tqdm": "bench", "scipy": "scipy", "hypothesis": "testing"}  # fmt: skip


def _install_hint(e: Exception) -> str:
    """For a missing optional dependency: which extra installs it."""
    name = getattr(e, "name", None) if isinstance(e, ImportError) else None
    extra = EXTRAS.get((name or "").split(".")[0])
    return f" (pip install 'blocksparse[{extra}]')" if extra and extra not in str(e) else ""


def _jsonable(value: Any) -> Any:
    """NumPy and JAX scalars and arrays to plain Python (the metrics go to ``--json``)."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (np.generic, np.ndarray, jax.Array)):
        return np.asarray(value).tolist()
    return value


class Timer:
    """The one timing helper of every suite and benchmark script.

    Each method compiles and warms up first, then returns the **median over** ``trials`` of the
    per-iteration time in milliseconds:

    - :meth:`loop`: ``iters`` calls inside one jitted ``fori_loop`` (one dispatch): device time,
      without Python's dispatch cost. An optimization barrier on the operands keeps XLA from
      hoisting the call out of the loop; one on the outputs makes it compute every element of them
      (without it, XLA computes only the elements that are read, and work fused into an output, an
      elementwise epilogue say, would vanish from the time); one element of each output is then
      accumulated so nothing is dead code. The operands are the same buffers every iteration, so
      small ones stay in cache.
    - :meth:`unrolled`: ``iters`` calls written out in one jitted function: device time with no loop
      around the calls (a check on :meth:`loop` for operations of a few microseconds).
    - :meth:`calls`: ``iters`` back-to-back calls of the jitted function from Python, synchronised
      once at the end: what a training or serving step sees, dispatch included.

    Arguments:
        iters: iterations per trial (each method also takes ``iters=`` per call).
        trials: timed trials; the median is reported.
        warmup: untimed runs after compilation.
    """

    def __init__(self, *, iters: int = 10, trials: int = 3, warmup: int = 1):
        for name, v, low in (("iters", iters, 1), ("trials", trials, 1), ("warmup", warmup, 0)):
            if not isinstance(v, int) or v < low:
                raise ValueError(f"Expected Timer {name} an integer >= {low}. Got {v!r}.")
        self.iters, self.trials, self.warmup = iters, trials, warmup
        self._loops: dict = {}  # (fn, iters) -> the jitted loop: a trace of what was timed reuses its compilation

    def __repr__(self) -> str:
        return f"Timer(iters={self.iters}, trials={self.trials}, warmup={self.warmup})"

    def _iters(self, iters: int | None) -> int:
        if iters is None:
            return self.iters
        if not isinstance(iters, int) or iters < 1:
            raise ValueError(f"Expected iters an integer >= 1. Got {iters!r}.")
        return iters

    def loop(self, fn: Callable, *args, iters: int | None = None) -> float:
        """Median ms per iteration of ``fn(*args)`` inside one jitted ``fori_loop`` (device time).

        ``args`` are pytrees of arrays (static values belong in a closure); ``fn`` returns a
        pytree of arrays.
        """
        iters = self._iters(iters)
        return self._median(self.loop_function(fn, iters), args, iters)

    def loop_function(self, fn: Callable, iters: int | None = None) -> Callable:
        """The jitted function :meth:`loop` times: ``f(args)`` runs ``fn(*args)`` ``iters`` times in one
        ``fori_loop`` and returns a float32 scalar (for a profiler's trace of exactly what was timed). The same
        ``fn`` and ``iters`` give the same jitted function, so a trace after a timing compiles nothing new."""
        iters = self._iters(iters)
        key = (fn, iters) if isinstance(fn, Hashable) else None  # an unhashable fn is not cached
        if key in self._loops:
            return self._loops[key]

        def looped(args):
            def body(_, carry):
                args, acc = carry
                args = jax.lax.optimization_barrier(args)
                return args, acc + _probe(fn(*args))

            return jax.lax.fori_loop(0, iters, body, (args, jnp.float32(0)))[1]

        out = jax.jit(looped)
        if key is not None:
            self._loops[key] = out
        return out

    def unrolled(self, fn: Callable, *args, iters: int | None = None) -> float:
        """Median ms per call of ``iters`` calls of ``fn(*args)`` written out one after another in one jitted
        function (device time with no loop around it).

        It tells whether :meth:`loop`'s ``while`` loop adds its own cost per iteration to an operation of a
        few microseconds (on an H200 it did not measurably: both agreed within their run-to-run noise at 20-70
        us per call). Each call sees its operands through an optimization barrier that also carries the
        previous calls' result, so XLA can neither merge the calls nor reorder them. Compile time grows with
        ``iters``.
        """
        iters = self._iters(iters)
        return self._median(self.unrolled_function(fn, iters), args, iters)

    def unrolled_function(self, fn: Callable, iters: int | None = None) -> Callable:
        """The jitted function :meth:`unrolled` times: ``f(args)`` writes ``fn(*args)`` out ``iters`` times and
        returns a float32 scalar."""
        iters = self._iters(iters)

        def unrolled(args):
            acc = jnp.float32(0)
            for _ in range(iters):
                args, acc = jax.lax.optimization_barrier((args, acc))
                acc = acc + _probe(fn(*args))
            return acc

        return jax.jit(unrolled)

    def _median(self, jitted, args, iters: int) -> float:
        """Compile ``jitted(args)`` (a first untimed run, through ``jit``'s cache so that a later trace of the same
        function reuses it), warm up, then the median ms per iteration over the trials (``iters`` per run)."""
        jax.block_until_ready(jitted(args))
        for _ in range(self.warmup):
            jax.block_until_ready(jitted(args))
        times = []
        for _ in range(self.trials):
            t0 = time.perf_counter()
            jax.block_until_ready(jitted(args))
            times.append((time.perf_counter() - t0) / iters)
        return statistics.median(times) * 1e3

    def calls(self, fn: Callable, *args, iters: int | None = None) -> float:
        """Median ms per call of ``iters`` back-to-back jitted calls of ``fn(*args)`` from Python."""
        iters = self._iters(iters)
        jitted = jax.jit(fn)
        jax.block_until_ready(args)
        jax.block_until_ready(jitted(*args))  # compile
        for _ in range(self.warmup):
            jax.block_until_ready(jitted(*args))
        times = []
        for _ in range(self.trials):
            t0 = time.perf_counter()
            out = None
            for _ in range(iters):
                out = jitted(*args)
            jax.block_until_ready(out)
            times.append((time.perf_counter() - t0) / iters)
        return statistics.median(times) * 1e3


def _probe(out) -> jax.Array:
    """One float32 element of each output leaf, summed: keeps the loop body live, costs nothing. The outputs pass an
    optimization barrier first, so that each is computed whole: without it XLA fuses the one-element read into what
    computes an output and computes that element alone."""
    total = jnp.float32(0)
    for leaf in jax.tree_util.tree_leaves(jax.lax.optimization_barrier(out)):
        leaf = jnp.asarray(leaf)
        if leaf.size:
            total = total + jnp.real(leaf.reshape(-1)[0]).astype(jnp.float32)
    return total


# -- checking -----------------------------------------------------------------------------------------
def tolerance(dtype, platform: str | None = None) -> float:
    """The relative (Frobenius) error allowed against a float32/float64 reference of the same values.

    Half precisions are dominated by rounding the output (eps / 2 per element) and the kernels
    accumulate in float32; float32 on a GPU may multiply in TF32 (10 mantissa bits), as XLA's
    default precision does, so it gets TF32's tolerance there.
    """
    dtype = jnp.dtype(dtype)
    platform = platform or jax.default_backend()
    if dtype == jnp.float32 or dtype == jnp.float64:
        return 1e-2 if platform == "gpu" else 1e-4
    return 4.0 * float(jnp.finfo(dtype).eps)


#: Elements summed in float32 on the device per partial sum of :func:`check_close`; the partials are summed on the host
#: in float64.
CHECK_CHUNK = 4096


@jax.jit
def _error_sums(got, want):
    """``(non-finite count of got, scale, partial sums of ((got - want) / scale)**2 and of (want / scale)**2)``: what
    :func:`check_close` needs, computed where the arrays are (a large graph's outputs are gigabytes: no host copy of
    them). ``scale``, the largest finite magnitude of either, keeps the float32 squares from overflowing or
    underflowing; a non-finite ``got`` counts as zero in the sums."""
    g, w = got.astype(jnp.float32).reshape(-1), want.astype(jnp.float32).reshape(-1)
    finite = jnp.isfinite(g)
    g = jnp.where(finite, g, 0.0)
    scale = jnp.maximum(jnp.max(jnp.abs(g), initial=0.0), jnp.max(jnp.abs(jnp.where(jnp.isfinite(w), w, 0.0)),
                                                                   initial=0.0))  # fmt: skip
    scale = jnp.where(scale > 0, scale, 1.0)

    def partials(x):
        x = jnp.square(x / scale)
        whole = x.size - x.size % CHECK_CHUNK
        head = x[:whole].reshape(-1, CHECK_CHUNK).sum(axis=1)
        return jnp.concatenate([head, x[whole:].sum(keepdims=True)])

    return jnp.sum(~finite, dtype=jnp.int32), scale, partials(g - w), partials(w)


def check_close(got, want, *, dtype=None, tol: float | None = None, what: str = "result") -> float:
    """Relative Frobenius error ``|got - want| / |want|`` (``|got|`` where ``want`` is zero); raises
    :class:`CellFailed` above ``tol``.

    ``tol`` defaults to :func:`tolerance` of ``dtype`` (default: ``got``'s dtype). Shapes must match
    and every value of ``got`` must be finite. Both are compared in float32 on their device, in partial
    sums of :data:`CHECK_CHUNK` elements that the host adds in float64: only the partial sums are copied.
    """
    got, want = jnp.asarray(got), jnp.asarray(want)
    if got.shape != want.shape:
        raise CellFailed(f"{what}: expected shape {want.shape} (the reference); got {got.shape}")
    if want.sharding.device_set != got.sharding.device_set:  # a sharded result against a one-device reference
        want = jax.device_put(want, got.sharding)
    bad, scale, diff, ref = jax.device_get(_error_sums(got, want))
    if bad:
        raise CellFailed(f"{what}: expected finite values; got {int(bad)} non-finite of {got.size}")
    if tol is None:
        tol = tolerance(got.dtype if dtype is None else dtype)
    norm = lambda parts: float(np.sqrt(np.sum(parts, dtype=np.float64)))  # noqa: E731
    denom = norm(ref)
    err = norm(diff) / denom if denom > 0 else norm(diff) * float(scale)  # (a zero want: got - want is got)
    if not err <= tol:
        raise CellFailed(f"{what}: expected relative error vs the reference <= {tol:.3g}; got {err:.3g}")
    return err


def implementation(log: Iterable[tuple[str, str]]) -> str:
    """``"dsd: xla"``-style summary of a :func:`blocksparse.dispatch_log` record (first of each op)."""
    seen = dict.fromkeys(f"{op}: {name}" for op, name in log)
    return ", ".join(seen) or "none recorded"


# -- one measurement: check, dispatch log, both timings --------------------------------------------------
def measure(
    timer: Timer, fn: Callable, *args, want=None, dtype=None, tol: float | None = None, what: str = "result",
    prefix: str = "",
) -> dict:  # fmt: skip
    """Run ``fn(*args)`` jitted once (recording the dispatch log), check it against ``want``, then time it both ways.

    Returns ``{prefix}loop_ms`` (:meth:`Timer.loop`), ``{prefix}calls_ms`` (:meth:`Timer.calls`),
    ``{prefix}implementation`` (:func:`implementation` of the log) and, with ``want``, ``{prefix}rel_err``
    (:func:`check_close`, which raises :class:`CellFailed` above the tolerance). ``want`` may be a pytree
    matching the output (the largest error of its leaves is recorded).
    """
    from ..ops import dispatch_log

    with dispatch_log() as log:
        got = jax.block_until_ready(jax.jit(fn)(*args))
    out = {}
    if want is not None:
        pairs = zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True)
        errs = [check_close(g, w, dtype=dtype, tol=tol, what=f"{what} [{i}]" if i else what)
                for i, (g, w) in enumerate(pairs)]  # fmt: skip
        out[f"{prefix}rel_err"] = max(errs)
    out[f"{prefix}loop_ms"] = timer.loop(fn, *args)
    out[f"{prefix}calls_ms"] = timer.calls(fn, *args)
    out[f"{prefix}implementation"] = implementation(log)
    return out


def missing(needs: str | None) -> str | None:
    """Why this machine cannot run kernels that need ``needs`` (``"gpu"``: Pallas Triton, ``"hopper"``: Mosaic
    GPU), or ``None``. Read through :mod:`blocksparse.hardware`, so a test fakes the device there."""
    from .. import hardware

    if needs is None:
        return None
    if needs == "hopper":
        why = hardware.hopper_problem()
        return None if why is None else f"needs a Hopper GPU ({why})"
    if needs == "gpu":
        dev = hardware.current()
        return None if dev.is_gpu else f"needs a GPU (default device: {dev.platform})"
    raise ValueError(f"Expected needs None, 'gpu' or 'hopper'. Got {needs!r}.")


def variant(timer: Timer, name: str, fn: Callable, *args, needs: str | None = None, **check) -> dict:
    """:func:`measure` of one variant of a cell under the keys ``{name}_loop_ms``, ``{name}_calls_ms``, ...

    A variant this machine cannot run (``needs``: see :func:`missing`) or its backend refuses
    (``NotImplementedError``: a plan over the shared memory, a block size it does not take) is recorded as
    ``{name}_skipped`` with the reason, not a failure; a wrong result still fails the cell (:class:`CellFailed`).
    """
    if (why := missing(needs)) is not None:
        return {f"{name}_skipped": why}
    try:
        return measure(timer, fn, *args, what=check.pop("what", name), prefix=f"{name}_", **check)
    except NotImplementedError as e:
        return {f"{name}_skipped": " ".join(str(e).split())[:300]}


def ratio(metrics: dict, num: str, den: str, key: str) -> None:
    """``metrics[key] = metrics[num] / metrics[den]`` when both were measured (a skipped variant leaves it out)."""
    if metrics.get(num) and metrics.get(den):
        metrics[key] = metrics[num] / metrics[den]


def write_json(path: str, doc: dict) -> None:
    """Write ``doc`` to ``path`` atomically (a run cut short leaves the last complete document)."""
    import json
    import os

    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(_jsonable(doc), f, indent=1)
    os.replace(tmp, path)
