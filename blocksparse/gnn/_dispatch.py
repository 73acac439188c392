"""Implementation choice for the GNN ops (same contract as ``blocksparse.ops.matmul``).

``implementation`` is ``None``, a name or a sequence of names; the first backend that does not
raise ``NotImplementedError`` wins and is recorded in :func:`blocksparse.dispatch_log`.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Sequence

import jax

from ..ops.matmul.api import _record

# Set to True (or use :func:`interpret`) to run the Pallas kernels in interpret mode on the CPU.
INTERPRET = False


@contextlib.contextmanager
def interpret(enabled: bool = True):
    """Run the GNN Pallas kernels in interpret mode (CPU tests) inside this block."""
    global INTERPRET
    old, INTERPRET = INTERPRET, enabled
    try:
        yield
    finally:
        INTERPRET = old


def pallas_mode() -> bool:
    """Return the ``interpret`` flag for ``pallas_call``; raise NotImplementedError without a GPU."""
    if INTERPRET:
        return True
    if jax.default_backend() != "gpu":
        raise NotImplementedError(
            f"the Pallas GNN kernels need a CUDA GPU (default backend is {jax.default_backend()!r}); "
            "use blocksparse.gnn.interpret() to run them on the CPU"
        )
    return False


@contextlib.contextmanager
def quiet_triton():
    """Silence only JAX's deprecation notice for the Pallas Triton backend (we target it on purpose)."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="The Pallas Triton backend is deprecated", category=DeprecationWarning
        )
        yield


def resolve(implementation, default: tuple[str, ...], known: Sequence[str]) -> tuple[str, ...]:
    if implementation is None:
        impls = default
    elif isinstance(implementation, str):
        impls = (implementation,)
    elif isinstance(implementation, Sequence) and implementation and all(isinstance(i, str) for i in implementation):
        impls = tuple(implementation)
    else:
        raise ValueError(f"Expected implementation None, a name or a sequence of names. Got {implementation!r}.")
    for name in impls:
        if name not in known:
            raise ValueError(f"Expected an implementation in {sorted(known)}. Got {name!r}.")
    return impls


def run(op: str, impls: tuple[str, ...], table: dict[str, Callable], *args):
    reasons = []
    for name in impls:
        try:
            with quiet_triton():
                out = table[name](*args)
        except NotImplementedError as e:
            reasons.append(f"{name}: {e}")
            continue
        _record(op, name)
        return out
    raise NotImplementedError(f"No implementation of {op} among {impls} accepts these inputs. " + "; ".join(reasons))


def check_choice(what: str, value, allowed: Sequence) -> None:
    if value not in allowed:
        raise ValueError(f"Expected {what} in {list(allowed)}. Got {value!r}.")
