"""Small numeric helpers shared by the host planners and the kernels (one copy each)."""

from __future__ import annotations

import contextlib
import functools
import os

import jax
import numpy as np
from jax.experimental import checkify as _checkify

__all__ = [
    "Pytree",
    "cdiv",
    "check_host_bytes",
    "check_positive_int",
    "checkify",
    "host_memory_bytes",
    "next_power_of_2",
    "runtime_checks",
    "runtime_checks_enabled",
]

# Whether ops on dynamic (traced) inputs add checkify checks. Off by default: a check is a JAX
# effect, and a jitted function with effects leaves jax's fast C++ dispatch path (slower per call, measured in
# docs/benchmarks.md, section "Dynamic sparsity"). Invalid input gives NaN either way. Part of the jit
# cache key (a JAX user context), local to the thread.
_RUNTIME_CHECKS = jax.make_user_context(False)


@contextlib.contextmanager
def runtime_checks(enabled: bool = True):
    """Inside this block, ops on dynamic inputs report invalid data through ``checkify`` too."""
    with _RUNTIME_CHECKS(bool(enabled)):
        yield


def runtime_checks_enabled() -> bool:
    return bool(_RUNTIME_CHECKS.value)


def checkify(f, errors=_checkify.user_checks):
    """``jax.experimental.checkify.checkify(f)`` with the library's runtime checks on.

    Returns ``f`` checked: called, it returns ``(error, out)``; ``error.throw()`` raises with a
    message naming the expected and the actual ranges (for example of a dynamic matrix's block
    coordinates). Without it, such input still gives NaN outputs, never a silently wrong value.
    """
    checked = _checkify.checkify(f, errors=errors)

    @functools.wraps(f)
    def run(*args, **kwargs):
        with runtime_checks(True):
            return checked(*args, **kwargs)

    return run


def host_memory_bytes() -> int | None:
    """The host's physical memory in bytes (``None`` where the OS does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return None


def check_host_bytes(nbytes: int, what: str) -> None:
    """Refuse, before allocating, host arrays of ``nbytes`` that this machine could not hold."""
    limit = host_memory_bytes()
    if limit is not None and nbytes > limit:
        raise ValueError(
            f"Expected {what} to fit in this host's memory ({limit / 2**30:.1f} GiB). Got one that needs "
            f"{nbytes / 2**30:.1f} GiB of host arrays."
        )


def check_positive_int(value, name: str, where: str | None = None, hint: str = "") -> None:
    """``value`` a positive Python or NumPy int (not a bool); else a ``TypeError`` / ``ValueError`` naming ``name``
    (after ``where: `` when given) and ``value``, with ``hint`` after the expectation."""
    expected = f"{where}: expected" if where else "Expected"
    if not isinstance(value, int | np.integer) or isinstance(value, bool | np.bool_):
        raise TypeError(f"{expected} {name} as a positive int{hint}. Got {value!r} of type {type(value).__name__}.")
    if value <= 0:
        raise ValueError(f"{expected} {name} as a positive int{hint}. Got {value}.")


def cdiv(a, b):
    """Ceiling division ``ceil(a / b)`` for integers, NumPy arrays and JAX arrays alike."""
    if isinstance(a, int | np.integer) and isinstance(b, int | np.integer):
        return -(-int(a) // int(b))
    if isinstance(a, list | tuple):
        a = np.asarray(a)
    return -(-a // b)


def next_power_of_2(n: int, minimum: int = 1) -> int:
    """The smallest power of two ``>= max(n, minimum)``."""
    n = max(int(n), int(minimum), 1)
    return 1 << (n - 1).bit_length()


class Pytree:
    """The one pytree idiom of the package: a subclass names its leaves and its static fields.

    ``_leaves`` are traced (what ``jit``, ``grad`` and ``vmap`` see); ``_static`` fields are part of
    the tree structure (hashable, compared by ``jit``'s cache). With ``_static = ("self",)`` the
    whole object is static (a host-side structure such as a graph). Rebuilding from leaves
    (:meth:`_from_fields`, and JAX's unflatten) skips ``__init__``: constructors validate user
    input once, while JAX may pass placeholders (``None``, ``ShapeDtypeStruct``, batched tracers)
    through tree operations, and unflattening stays cheap on every call.
    """

    __slots__ = ()
    _leaves: tuple[str, ...] = ()
    _static: tuple[str, ...] = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        import jax

        def flatten_with_keys(obj):
            children = tuple((jax.tree_util.GetAttrKey(n), getattr(obj, n)) for n in cls._leaves)
            return children, obj._meta()

        def flatten(obj):
            return tuple(getattr(obj, n) for n in cls._leaves), obj._meta()

        def unflatten(meta, children):
            if cls._static == ("self",):
                return meta
            return cls._from_fields(**dict(zip(cls._static, meta, strict=True)),
                                    **dict(zip(cls._leaves, children, strict=True)))  # fmt: skip

        jax.tree_util.register_pytree_with_keys(cls, flatten_with_keys, unflatten, flatten)

    def _meta(self):
        if self._static == ("self",):
            return self
        return tuple(getattr(self, n) for n in self._static)

    @classmethod
    def _from_fields(cls, **fields):
        """An instance with exactly these fields, without running ``__init__`` (no validation)."""
        obj = object.__new__(cls)
        for name, value in fields.items():
            object.__setattr__(obj, name, value)
        return obj

    def _replace(self, **changes):
        """A copy with some fields changed, without validation (for internal, already valid data)."""
        names = (*self._static, *self._leaves) if self._static != ("self",) else self._leaves
        return self._from_fields(**{n: changes.get(n, getattr(self, n)) for n in names})
