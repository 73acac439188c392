"""Implementation choice shared by every op (block-sparse products and GNN operations).

``implementation`` is ``None`` (the op's default order, Pallas first), a name, or a sequence of
names; the first backend that does not raise ``NotImplementedError`` wins and is recorded for
:func:`dispatch_log`. A backend raises ``NotImplementedError("reason")`` for inputs it cannot take;
when every candidate refuses, the error lists each one's reason.

Pallas kernels run on a CUDA GPU, or anywhere in Pallas' interpreter when :data:`INTERPRET` is
set (``BLOCKSPARSE_PALLAS_INTERPRET=1``, or the :func:`interpret` context manager): that is how CI
checks their logic on the CPU.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable, Mapping, Sequence

import jax

__all__ = [
    "INTERPRET",
    "check_choice",
    "cotangent_like",
    "dispatch_log",
    "interpret",
    "pallas_mode",
    "record",
    "resolve",
    "run",
]

#: Run Pallas kernels in the interpreter (read at trace time).
INTERPRET: bool = os.environ.get("BLOCKSPARSE_PALLAS_INTERPRET", "") not in ("", "0")

# jax 0.11 warns, whenever a jit containing a Triton-lowered pallas_call is lowered, that the
# Triton backend is deprecated in favour of Mosaic GPU. We target it on purpose (see
# docs/kernels.md). The warning fires when the *enclosing* jit is lowered, outside any call of
# ours, so a scoped catch_warnings cannot reach it: filter exactly that message, nothing else.
warnings.filterwarnings("ignore", message="The Pallas Triton backend is deprecated", category=DeprecationWarning)

_LOGS: list[list[tuple[str, str]]] = []


@contextlib.contextmanager
def interpret(enabled: bool = True):
    """Run every Pallas kernel in Pallas' interpreter inside this block (CPU tests)."""
    global INTERPRET
    old, INTERPRET = INTERPRET, enabled
    try:
        yield
    finally:
        INTERPRET = old


def pallas_mode() -> bool:
    """The ``interpret`` argument for ``pallas_call``; raises ``NotImplementedError`` without a GPU."""
    if INTERPRET:
        return True
    try:
        backend = jax.default_backend()
    except RuntimeError:  # no backend initialised
        backend = "none"
    if backend != "gpu":
        raise NotImplementedError(
            f"no GPU (default backend is {backend!r}); set BLOCKSPARSE_PALLAS_INTERPRET=1 or use "
            "blocksparse.ops.interpret() to run the Pallas kernels in the interpreter"
        )
    return False


@contextlib.contextmanager
def dispatch_log():
    """Record, at trace time, which implementation ran each op: a list of ``(op, name)``.

    Example::

        with bs.dispatch_log() as log:
            bs.matmul(W, x)
        assert log == [("dsd", "xla")]   # on a machine without a GPU
    """
    log: list[tuple[str, str]] = []
    _LOGS.append(log)
    try:
        yield log
    finally:
        _LOGS.remove(log)


def record(op: str, name: str) -> None:
    for log in _LOGS:
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
    reasons = []
    for name in impls:
        fn = table[name] if isinstance(table, Mapping) else table(name)
        try:
            out = fn(*args)
        except NotImplementedError as e:
            reasons.append(f"{name}: {e}")
            continue
        record(op, name)
        return out
    raise NotImplementedError(f"No implementation of {op} among {impls} accepts these inputs. " + "; ".join(reasons))


def _varying(x) -> frozenset:
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
    have, want = _varying(ct), _varying(primal)
    if extra := tuple(sorted(have - want, key=str)):
        ct = jax.lax.psum(ct, extra)
    if missing := tuple(sorted(want - have, key=str)):
        ct = jax.lax.pcast(ct, missing, to="varying")
    return ct


def check_choice(what: str, value, allowed: Sequence) -> None:
    if value not in allowed:
        raise ValueError(f"Expected {what} in {list(allowed)}. Got {value!r}.")
