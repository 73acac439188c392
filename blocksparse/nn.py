"""Sparse linear layers as pytrees: usable with ``jax.grad``, optax, Equinox or Flax."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from . import prune as _prune
from ._matrix import BlockSparseMatrix, _require_host, random
from ._util import Pytree
from .ops.matmul.api import matmul

__all__ = ["SparseLinear"]


@dataclasses.dataclass(frozen=True)
class SparseLinear(Pytree):
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

    _leaves = ("weight", "bias")
    _static = ("implementation",)

    weight: BlockSparseMatrix
    bias: jax.Array | None
    implementation: str | tuple[str, ...] | None = None

    def __post_init__(self):
        # Runs on construction only (JAX rebuilds layers from leaves without it). Leading dimensions
        # shared by the weight's data are allowed (a stack of layers, e.g. for lax.scan).
        w, b = self.weight, self.bias
        if b is None or not isinstance(w, BlockSparseMatrix) or not hasattr(b, "shape") or not hasattr(w.data, "shape"):
            return
        lead = tuple(w.data.shape[:-3])
        expected = (*lead, w.shape[1])
        if tuple(b.shape) != expected:
            raise ValueError(
                f"Expected a bias of shape {expected} (out_features,) for a weight of shape {w.shape}. "
                f"Got {tuple(b.shape)}; pass bias=None for no bias."
            )

    @classmethod
    def init(
        cls, key, in_features: int, out_features: int, block_size, density: float,
        *, use_bias: bool = True, dtype=jnp.float32, implementation=None,
    ) -> SparseLinear:  # fmt: skip
        """A random pattern of the given density; values uniform in ``+-1/sqrt(fan_in)``.

        ``fan_in`` counts only the inputs a unit actually sees (``in_features * density``), so
        activations keep the scale of a dense layer's.
        """
        _require_host("SparseLinear.init", key=key, density=density)
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
        """Prune a dense ``(in, out)`` weight by block magnitude (see :func:`blocksparse.prune.magnitude`).

        The pattern is host data: call it outside ``jit`` with a concrete ``weight``.
        """
        _require_host("SparseLinear.from_dense", weight=weight, density=density)
        bias = None if bias is None else jnp.asarray(bias)
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
