"""Implementation choice shared by every op (block-sparse products and GNN operations).

``implementation`` is ``None`` (the op's default order, Pallas first), a name, or a sequence of
names; the first backend that does not raise ``NotImplementedError`` wins and is recorded for
:func:`dispatch_log`. A backend raises ``NotImplementedError("reason")`` for inputs it cannot take;
when every candidate refuses, an ``ExceptionGroup`` carries each one's reason.

Nothing here is a module global read while tracing. Interpret mode (Pallas kernels run in
Pallas' interpreter, how CI checks them on the CPU) is a JAX *user context*
(``jax.make_user_context``): its value is part of the ``jit`` cache key, so a function jitted
before ``with bs.interpret():`` is traced again inside it, and it is local to the thread. Its
default comes from ``BLOCKSPARSE_PALLAS_INTERPRET=1`` when the package is imported. The dispatch
log is a ``contextvars`` variable: each thread (or asyncio task) sees only its own ops.

:func:`differentiable` is the one ``custom_vjp`` factory every op is built with.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import warnings
from collections.abc import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp

from .. import hardware

__all__ = [
    "check_choice",
    "cotangent_like",
    "differentiable",
    "dispatch_log",
    "interpret",
    "interpreting",
    "pallas_mode",
    "pallas_takes_width",
    "record",
    "resolve",
    "run",
    "varying_axes",
    "NoImplementationError",
]

# jax 0.11 warns, whenever a jit containing a Triton-lowered pallas_call is lowered, that the
# Triton backend is deprecated in favour of Mosaic GPU. We target it on purpose (see
# docs/kernels.md). The warning fires when the *enclosing* jit is lowered, outside any call of
# ours, so a scoped catch_warnings cannot reach it: filter exactly that message, nothing else. The filter is
# put back whenever an op is traced (:func:`run`): a `warnings.catch_warnings` block or a test runner that
# restores the filters after `import blocksparse` would otherwise drop it, and the user would see the warning.
_TRITON_DEPRECATION = "The Pallas Triton backend is deprecated"


def quiet_triton_deprecation() -> None:
    """Filter JAX's deprecation warning of the Triton lowering (only that message) if no filter of ours is there."""
    for action, message, category, *_ in warnings.filters:
        if (
            action == "ignore"
            and category is DeprecationWarning
            and getattr(message, "pattern", "") == (_TRITON_DEPRECATION)
        ):
            return
    warnings.filterwarnings("ignore", message=_TRITON_DEPRECATION, category=DeprecationWarning)


quiet_triton_deprecation()

# Part of every jit cache key (and thread-local): see the module docstring. Every user context of
# the package is made here, when the package is imported: making one changes JAX's trace context,
# so one made lazily (say when a kernel module is first imported inside a trace) would make JAX
# trace that function again on its next call.
_INTERPRET = jax.make_user_context(os.environ.get("BLOCKSPARSE_PALLAS_INTERPRET", "") not in ("", "0"))
_LOGS: contextvars.ContextVar[tuple[list, ...]] = contextvars.ContextVar("blocksparse_dispatch_logs", default=())


@contextlib.contextmanager
def interpret(enabled: bool = True):
    """Run every Pallas kernel in Pallas' interpreter inside this block (CPU tests).

    The setting is part of the ``jit`` cache key: a function jitted outside the block is traced
    again inside it (and the other way round), never silently reusing the other path.
    """
    with _INTERPRET(bool(enabled)):
        yield


def interpreting() -> bool:
    """Whether Pallas kernels run in the interpreter here (see :func:`interpret`)."""
    return bool(_INTERPRET.value)


def pallas_mode() -> bool:
    """The ``interpret`` argument for ``pallas_call``: ``True`` inside :func:`interpret`, ``False`` on a GPU
    (:func:`blocksparse.hardware.current`, so a test lowers the real kernels on a CPU under
    ``hardware.fake(hardware.H200)``); raises ``NotImplementedError`` else."""
    if interpreting():
        return True
    dev = hardware.current()
    if not dev.is_gpu:
        raise NotImplementedError(
            f"no GPU (default backend is {dev.platform!r}); set BLOCKSPARSE_PALLAS_INTERPRET=1 or use "
            "blocksparse.interpret() to run the Pallas kernels in the interpreter"
        )
    return False


def pallas_takes_width(width: int, smallest: int = 16) -> bool:
    """Whether a Pallas kernel whose tiles span ``width`` runs here: ``width`` a power of two (Triton's tiles) of at
    least ``smallest``, on a CUDA GPU or under :func:`interpret`. Ops with one kernel and an XLA fallback ask this."""
    if width < smallest or width & (width - 1):
        return False
    try:
        pallas_mode()
    except NotImplementedError:
        return False
    return True


@contextlib.contextmanager
def dispatch_log():
    """Record, at trace time, which implementation ran each op: a list of ``(op, name)``.

    Only ops traced in this thread (or asyncio task) inside the block are recorded. A ``jit``
    cache hit traces nothing, so nothing is recorded for it.

    Example::

        >>> import jax.numpy as jnp, blocksparse as bs
        >>> W = bs.BlockSparseMatrix.from_dense(jnp.eye(8), 4)
        >>> with bs.dispatch_log() as log:
        ...     _ = bs.matmul(W, jnp.ones((8, 2)), implementation="xla")
        >>> log
        [('dsd', 'xla')]
    """
    log: list[tuple[str, str]] = []
    token = _LOGS.set((*_LOGS.get(), log))
    try:
        yield log
    finally:
        _LOGS.reset(token)


def record(op: str, name: str) -> None:
    """Record that implementation ``name`` ran ``op``, in every :func:`dispatch_log` open in this thread."""
    for log in _LOGS.get():
        log.append((op, name))


def resolve(implementation, default: tuple[str, ...], known: Sequence[str] | None = None) -> tuple[str, ...]:
    """Normalise ``implementation`` to a tuple of names (validated against ``known`` if given)."""
    if implementation is None:
        impls = tuple(default)
    elif isinstance(implementation, str):
        impls = (implementation,)
    elif isinstance(implementation, Sequence) and implementation and all(isinstance(i, str) for i in implementation):
        impls = tuple(implementation)
    else:
        raise ValueError(f"Expected implementation None, a name or a sequence of names. Got {implementation!r}.")
    if known is not None:
        for name in impls:
            if name not in known:
                raise ValueError(f"Expected an implementation in {sorted(known)}. Got {name!r}.")
    return impls


def run(op: str, impls: tuple[str, ...], table: Mapping[str, Callable] | Callable[[str], Callable], *args):
    """Call the first implementation of ``op`` in ``impls`` that accepts ``args``; record it."""
    quiet_triton_deprecation()
    errors = []
    for name in impls:
        fn = table[name] if isinstance(table, Mapping) else table(name)
        try:
            out = fn(*args)
        except NotImplementedError as e:
            errors.append(NotImplementedError(f"{name}: {e}"))
            continue
        record(op, name)
        return out
    reasons = "; ".join(str(e) for e in errors)
    raise NoImplementationError(f"no implementation of {op} among {impls} accepts these inputs: {reasons}", errors)


def with_reference_jvp(table: Mapping[str, Callable] | Callable[[str], Callable], reference: str = "xla"):
    """``table`` whose other implementations differentiate as ``reference`` does (a ``custom_jvp``: the kernel's
    values, the reference's tangents).

    For the calls an op's ``custom_vjp`` rules make directly (a forward that also returns an arg-max or a
    log-sum-exp, a backward kernel): a kernel has no derivative of its own, so without this ``jax.grad`` of
    ``jax.grad`` would fail inside JAX. Tangents whose shape differs from the kernel's output (a padded log-sum-exp)
    are zero-padded to it. First-order gradients never evaluate the reference.
    """
    lookup = (lambda name: table[name]) if isinstance(table, Mapping) else table

    def wrapped(name: str) -> Callable:
        fn = lookup(name)
        return fn if name == reference else _reference_jvp(fn, lookup(reference))

    return wrapped


def _reference_jvp(fn: Callable, ref: Callable) -> Callable:
    @functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
    def call(static, *arrays):
        return fn(static, *arrays)

    @call.defjvp
    def _jvp(static, primals, tangents):
        out = call(static, *primals)
        _, tan = jax.jvp(functools.partial(ref, static), primals, tangents)
        return out, jax.tree.map(_padded_to, tan, out)

    return call


def _padded_to(t, like):
    """Tangent ``t`` zero-padded (trailing) to the shape of the output ``like``."""
    if t.dtype == jax.dtypes.float0 or t.shape == like.shape:
        return t
    return jnp.pad(t.astype(like.dtype), [(0, b - a) for a, b in zip(t.shape, like.shape, strict=True)])


class NoImplementationError(ExceptionGroup, NotImplementedError):
    """Every implementation refused the inputs; ``.exceptions`` holds each one's reason."""


def differentiable(op: str, table: Callable[[str], Callable], backward: Callable, forward: Callable | None = None):
    """The one ``custom_vjp`` factory: an op ``f(static, *arrays)`` that dispatches ``op``.

    Arguments:
        op: the op's name (for :func:`dispatch_log` and error messages).
        table: ``name -> callable(static, *arrays)`` for each implementation.
        backward: ``backward(static, arrays, extra, g) -> cotangents`` (one per array; ``None``
            for integer arrays). It usually calls other ops made by this factory, on the same
            ``static.impls``, so the backward runs on the backend of the forward.
        forward: optional ``forward(static, *arrays) -> (out, extra)`` for ops whose backward
            needs more than the inputs (an arg-max, a log-sum-exp); by default the primal is
            computed as without differentiation and ``extra`` is ``None``.

    ``static`` is hashable (it is a ``nondiff_argnums`` argument) and has ``impls``. Cotangents get
    the ``shard_map`` axis type of their primal (:func:`cotangent_like`).
    """

    @functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
    def f(static, *arrays):
        return run(op, static.impls, table, static, *arrays)

    def fwd(static, *arrays):
        if forward is None:
            return f(static, *arrays), (arrays, None)
        out, extra = forward(static, *arrays)
        return out, (arrays, extra)

    def bwd(static, res, g):
        arrays, extra = res
        cts = backward(static, arrays, extra, g)
        return tuple(cotangent_like(c, a) for c, a in zip(cts, arrays, strict=True))

    f.defvjp(fwd, bwd)
    f.__name__ = op
    return f


def varying_axes(x) -> frozenset:
    """The ``shard_map`` mesh axes ``x`` varies over (empty outside ``shard_map``)."""
    mat = getattr(jax.typeof(x), "mat", None)  # manual axes of shard_map, jax >= 0.8
    return frozenset(getattr(mat, "varying", ()))


def cotangent_like(ct, primal):
    """Give a custom VJP's cotangent the shard_map axis type of its primal input.

    Inside ``shard_map`` a replicated input (say a weight) combined with a per-device one (a batch
    shard) gets a per-device cotangent; JAX's own ops sum it over those axes (the transpose of
    the implicit ``pvary``), and a ``custom_vjp`` must do the same. Outside ``shard_map`` this is
    the identity.
    """
    if ct is None:
        return ct
    have, want = varying_axes(ct), varying_axes(primal)
    if extra := tuple(sorted(have - want, key=str)):
        ct = jax.lax.psum(ct, extra)
    if missing := tuple(sorted(want - have, key=str)):
        ct = jax.lax.pcast(ct, missing, to="varying")
    return ct


def check_choice(what: str, value, allowed: Sequence) -> None:
    if value not in allowed:
        raise ValueError(f"Expected {what} in {list(allowed)}. Got {value!r}.")
