"""Equinox modules: ``bs.nn.equinox.SparseLinear``, a block-sparse ``eqx.nn.Linear``.

Imported on first use of ``bs.nn.equinox``; needs ``pip install 'blocksparse[equinox]'``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

try:
    import equinox as eqx
except ImportError as e:  # ModuleNotFoundError carries the package's name, as a missing import would
    raise ModuleNotFoundError("bs.nn.equinox needs Equinox: pip install 'blocksparse[equinox]'", name="equinox") from e

from .. import prune as _prune
from .._checkpoint import register_checkpoint_type
from .._matrix import BlockSparseMatrix, require_host
from ..ops.matmul.api import matmul
from ._linear import check_activation, check_features, dense_in_out, random_pattern
from ._product import sparse_linear

__all__ = ["SparseLinear"]


class SparseLinear(eqx.Module):
    """``y = activation(x @ W + b)`` with a block-sparse ``W``, following ``eqx.nn.Linear``'s conventions.

    Keyword-only ``key``, ``use_bias``, ``dtype``; applied to one example ``x (in_features,)`` and
    mapped with ``jax.vmap`` (one batched product, not one per example, in any order of ``vmap``
    and ``grad``). Leading batch dimensions ``x (..., in_features)`` are accepted directly too.

    **Weight layout.** ``weight`` is a :class:`~blocksparse.BlockSparseMatrix` of shape
    ``(in_features, out_features)``, the transpose of ``eqx.nn.Linear.weight``: it is the layout of
    every ``bs.nn`` layer (the same pattern and product, ``x @ W`` with the examples as rows, as
    :class:`blocksparse.nn.SparseLinear` and the Flax module), so a layer moves between frameworks
    with its pattern unchanged. :meth:`from_dense` takes an ``eqx.nn.Linear`` weight ``(out, in)``
    by default (``layout="out_in"``).

    Arguments:
        in_features, out_features: the layer's sizes.
        block_size: ``b`` or ``(b_in, b_out)``: the blocks of the ``(in, out)`` weight.
        density: fraction of blocks kept (a random pattern, host data).
        use_bias: whether to add a bias.
        dtype: the parameters' dtype (default float32).
        activation: ``None`` or a name in :data:`blocksparse.nn.ACTIVATIONS`, fused into the product.
        implementation: passed to :func:`blocksparse.matmul`.
        key: a PRNG key (pattern and values).

    Values are uniform in ``+-1/sqrt(fan_in)`` with ``fan_in = in_features * density`` (the inputs a
    unit actually sees), the bias likewise, as ``eqx.nn.Linear`` does at density 1.

    Example::

        >>> import jax, jax.numpy as jnp, blocksparse as bs
        >>> layer = bs.nn.equinox.SparseLinear(64, 32, block_size=16, density=0.25, key=jax.random.key(0))
        >>> jax.vmap(layer)(jnp.ones((8, 64))).shape
        (8, 32)
    """

    weight: BlockSparseMatrix
    bias: jax.Array | None
    in_features: int = eqx.field(static=True)
    out_features: int = eqx.field(static=True)
    use_bias: bool = eqx.field(static=True)
    activation: str | None = eqx.field(static=True)
    implementation: str | tuple[str, ...] | None = eqx.field(static=True)

    def __init__(
        self, in_features: int, out_features: int, *, block_size, density: float, use_bias: bool = True,
        dtype=None, activation: str | None = None, implementation=None, key,
    ):  # fmt: skip
        require_host("bs.nn.equinox.SparseLinear", key=key, density=density)
        check_features(in_features=in_features, out_features=out_features)
        activation = check_activation(activation)
        dtype = jnp.float32 if dtype is None else dtype
        kp, kw, kb = jax.random.split(key, 3)
        pattern = random_pattern(kp, (in_features, out_features), block_size, density)
        bound = 1.0 / math.sqrt(max(in_features * max(pattern.density, 1e-12), 1.0))
        data = jax.random.uniform(kw, (pattern.nnz_blocks, *pattern.block_size), dtype, -bound, bound)
        self.weight = BlockSparseMatrix(pattern, data)
        self.bias = jax.random.uniform(kb, (out_features,), dtype, -bound, bound) if use_bias else None
        self.in_features, self.out_features = in_features, out_features
        self.use_bias = use_bias
        self.activation = activation
        self.implementation = tuple(implementation) if isinstance(implementation, list) else implementation

    @classmethod
    def from_dense(
        cls, weight, bias=None, *, block_size, density: float, layout: str = "out_in", norm: str = "l2",
        activation: str | None = None, implementation=None, in_features: int | None = None,
        out_features: int | None = None,
    ) -> SparseLinear:  # fmt: skip
        """Prune a dense weight by block magnitude (:func:`blocksparse.prune.magnitude`).

        ``weight`` is ``(out, in)`` for ``layout="out_in"`` (the default: ``eqx.nn.Linear.weight``,
        also PyTorch's) or ``(in, out)`` for ``layout="in_out"``; ``block_size`` is that of the
        stored ``(in, out)`` weight. Call it outside ``jit`` (the pattern is host data), e.g.
        ``SparseLinear.from_dense(lin.weight, lin.bias, block_size=16, density=0.25)``. If given,
        ``in_features`` / ``out_features`` are checked against the weight.
        """
        require_host("bs.nn.equinox.SparseLinear.from_dense", weight=weight, density=density)
        activation = check_activation(activation)
        w = dense_in_out(weight, layout=layout, in_features=in_features, out_features=out_features, bias=bias)
        W = _prune.magnitude(w, block_size, density, norm=norm)
        return cls._build(W, None if bias is None else jnp.asarray(bias), activation, implementation)

    @classmethod
    def _build(cls, weight: BlockSparseMatrix, bias, activation, implementation) -> SparseLinear:
        # An instance with these fields, without drawing a random pattern first (Equinox modules are
        # frozen dataclasses: fields are set once, here as __init__ would).
        self = object.__new__(cls)
        for name, value in dict(
            weight=weight, bias=bias, in_features=weight.shape[0], out_features=weight.shape[1],
            use_bias=bias is not None, activation=activation, implementation=implementation,
        ).items():  # fmt: skip
            object.__setattr__(self, name, value)
        return self

    def __call__(self, x, *, key=None) -> jax.Array:
        """``x (in_features,)`` or ``(..., in_features)`` -> ``(out_features,)`` or ``(..., out_features)``.

        ``key`` is ignored (Equinox's convention for deterministic layers).
        """
        del key
        if type(self.weight) is BlockSparseMatrix:
            return sparse_linear(x, self.weight, self.bias, self.activation, self.implementation)
        return matmul(x, self.weight, bias=self.bias, activation=self.activation, implementation=self.implementation)

    def to_dense(self) -> jax.Array:
        """The weight as a dense ``(out, in)`` array, the layout of ``eqx.nn.Linear.weight``."""
        return self.weight.to_dense().T


register_checkpoint_type(SparseLinear, "blocksparse.nn.equinox.SparseLinear")
