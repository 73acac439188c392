"""Small numeric helpers shared by the host planners and the kernels (one copy each)."""

from __future__ import annotations

import numpy as np

__all__ = ["Pytree", "cdiv", "next_power_of_2"]


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
