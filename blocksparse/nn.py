"""Sparse linear layers as pytrees: usable with ``jax.grad``, optax, Equinox or Flax."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from . import prune as _prune
from ._matrix import BlockSparseMatrix, random
from .ops.matmul.api import matmul

__all__ = ["SparseLinear"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SparseLinear:
    """``y = x @ W + b`` with a block-sparse ``W`` of shape ``(in_features, out_features)``.

    The pattern is static (part of the pytree structure); ``W.data`` and ``b`` are the trainable
    leaves, so ``jax.grad`` of a loss w.r.t. the layer returns a layer of gradients laid out the
    same way (never a dense ``in x out`` gradient).

    Example::

        >>> import jax, jax.numpy as jnp, blocksparse as bs
        >>> layer = bs.nn.SparseLinear.init(jax.random.key(0), 64, 32, block_size=16, density=0.25)
        >>> layer(jnp.ones((8, 64))).shape
        (8, 32)
    """

    weight: BlockSparseMatrix
    bias: jax.Array | None
    implementation: str | tuple[str, ...] | None = dataclasses.field(default=None, metadata={"static": True})

    @classmethod
    def init(
        cls, key, in_features: int, out_features: int, block_size, density: float,
        *, use_bias: bool = True, dtype=jnp.float32, implementation=None,
    ) -> SparseLinear:  # fmt: skip
        """A random pattern of the given density; values uniform in ``+-1/sqrt(fan_in)``.

        ``fan_in`` counts only the inputs a unit actually sees (``in_features * density``), so
        activations keep the scale of a dense layer's.
        """
        kw, kp = jax.random.split(key)
        w = random(kw, (in_features, out_features), block_size, density, dtype)
        bound = 1.0 / math.sqrt(max(in_features * max(w.density, 1e-12), 1.0))
        data = jax.random.uniform(kp, w.data.shape, dtype, -bound, bound)
        bias = jnp.zeros((out_features,), dtype) if use_bias else None
        return cls(w.with_data(data), bias, implementation)

    @classmethod
    def from_dense(
        cls, weight, bias=None, *, block_size, density: float, norm: str = "l2", implementation=None
    ) -> SparseLinear:
        """Prune a dense ``(in, out)`` weight by block magnitude (see :func:`blocksparse.prune.magnitude`)."""
        return cls(_prune.magnitude(weight, block_size, density, norm=norm), bias, implementation)

    @property
    def in_features(self) -> int:
        return self.weight.shape[0]

    @property
    def out_features(self) -> int:
        return self.weight.shape[1]

    def __call__(self, x) -> jax.Array:
        y = matmul(x, self.weight, implementation=self.implementation)
        return y if self.bias is None else y + self.bias
