"""Flax NNX modules: ``bs.nn.flax.SparseLinear``, a block-sparse ``nnx.Linear``.

Imported on first use of ``bs.nn.flax``; needs ``pip install 'blocksparse[flax]'``. For a dense
layer use ``flax.nnx.Linear`` itself.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

try:
    from flax import nnx
except ImportError as e:  # ModuleNotFoundError carries the package's name, as a missing import would
    raise ModuleNotFoundError("bs.nn.flax needs Flax: pip install 'blocksparse[flax]'", name="flax") from e

from .. import prune as _prune
from .._matrix import BlockSparseMatrix, require_host
from .._pattern import BlockPattern, block_pair
from ._linear import check_activation, check_features, dense_in_out, random_pattern
from ._product import sparse_linear

__all__ = ["SparseLinear"]

_ZEROS = nnx.initializers.zeros_init()


def _check_pattern_matches(pattern: BlockPattern, block_size, density: float) -> None:
    """A given pattern must agree with the layer's ``block_size`` and ``density`` (to one block)."""
    bs_pair = block_pair(block_size)
    if bs_pair != pattern.block_size:
        raise ValueError(f"Expected block_size {pattern.block_size} (the pattern's). Got {block_size!r}.")
    total = pattern.grid[0] * pattern.grid[1]
    if abs(float(density) - pattern.density) > 0.5 / max(total, 1) + 1e-12:
        raise ValueError(
            f"Expected density {pattern.density:.6g} (the pattern's {pattern.nnz_blocks} of {total} blocks). "
            f"Got {density}."
        )


class SparseLinear(nnx.Module):
    """``y = activation(x @ W + b)`` with a block-sparse kernel, following ``nnx.Linear``'s conventions.

    The kernel's layout is ``(in_features, out_features)``, as ``nnx.Linear``'s. ``kernel`` is an
    ``nnx.Param`` holding the kept blocks, shape ``(nnz_blocks, b_in, b_out)``; ``bias`` an
    ``nnx.Param`` ``(out_features,)`` (or ``None``). The block pattern is static module metadata
    (part of the graph definition, not a ``Param``): optimisers and ``nnx.split`` see only values.

    Arguments:
        in_features, out_features: the layer's sizes.
        block_size: ``b`` or ``(b_in, b_out)``.
        density: fraction of blocks kept (a random pattern drawn from ``rngs.params()``).
        use_bias: whether to add a bias.
        dtype: the computation dtype (inputs and parameters are cast to it); ``None`` promotes them.
        param_dtype: the parameters' dtype.
        activation: ``None`` or a name in :data:`blocksparse.nn.ACTIVATIONS`, fused into the product.
        kernel_init: an initializer called as ``kernel_init(key, (in_features, out_features), dtype)``;
            the layer keeps its values at the pattern's blocks. The default is ``nnx.Linear``'s
            (LeCun normal) with the fan-in a unit actually sees, ``in_features * density``.
        bias_init: an initializer for ``(out_features,)`` (default zeros).
        pattern: a :class:`~blocksparse.BlockPattern` ``(in, out)`` to use instead of a random one
            (``block_size`` and ``density`` must then match it, to one block; else a ``ValueError``).
        implementation: passed to :func:`blocksparse.matmul`.
        rngs: ``nnx.Rngs``.

    Example::

        >>> import jax.numpy as jnp, blocksparse as bs
        >>> from flax import nnx
        >>> layer = bs.nn.flax.SparseLinear(64, 32, block_size=16, density=0.25, rngs=nnx.Rngs(0))
        >>> layer(jnp.ones((8, 64))).shape
        (8, 32)
    """

    def __init__(
        self, in_features: int, out_features: int, *, block_size, density: float, use_bias: bool = True,
        dtype=None, param_dtype=jnp.float32, activation: str | None = None, kernel_init=None,
        bias_init=_ZEROS, pattern: BlockPattern | None = None, implementation=None,
        rngs: nnx.Rngs,
    ):  # fmt: skip
        require_host("bs.nn.flax.SparseLinear", density=density)
        check_features(in_features=in_features, out_features=out_features)
        activation = check_activation(activation)
        if pattern is None:
            pattern = random_pattern(rngs.params(), (in_features, out_features), block_size, density)
        elif pattern.shape != (in_features, out_features):
            raise ValueError(
                f"Expected a pattern of shape (in_features, out_features) = {(in_features, out_features)}. "
                f"Got {pattern.shape}."
            )
        else:
            _check_pattern_matches(pattern, block_size, density)
        if kernel_init is None:
            kernel_init = nnx.initializers.variance_scaling(1.0 / max(pattern.density, 1e-12), "fan_in",
                                                            "truncated_normal")  # fmt: skip
        dense = kernel_init(rngs.params(), (in_features, out_features), param_dtype)
        self.kernel = nnx.Param(_blocks(pattern, jnp.asarray(dense, param_dtype)))
        self.bias = (nnx.Param(jnp.asarray(bias_init(rngs.params(), (out_features,), param_dtype), param_dtype))
                     if use_bias else None)  # fmt: skip
        self.pattern = pattern
        self.in_features, self.out_features = in_features, out_features
        self.use_bias = use_bias
        self.dtype, self.param_dtype = dtype, param_dtype
        self.activation = activation
        self.implementation = tuple(implementation) if isinstance(implementation, list) else implementation

    @classmethod
    def from_dense(
        cls, kernel, bias=None, *, block_size, density: float, layout: str = "in_out", norm: str = "l2",
        dtype=None, param_dtype=None, activation: str | None = None, implementation=None, rngs: nnx.Rngs | None = None,
        in_features: int | None = None, out_features: int | None = None,
    ) -> SparseLinear:  # fmt: skip
        """Prune a dense kernel by block magnitude (:func:`blocksparse.prune.magnitude`).

        ``kernel`` is ``(in, out)`` for ``layout="in_out"`` (the default: ``nnx.Linear.kernel``) or
        ``(out, in)`` for ``layout="out_in"`` (PyTorch's weight). ``rngs`` is optional (nothing
        random is drawn); ``param_dtype`` defaults to the kernel's dtype. If given, ``in_features`` /
        ``out_features`` are checked against the kernel. Call it outside ``jit``.
        """
        require_host("bs.nn.flax.SparseLinear.from_dense", kernel=kernel, density=density)
        kernel, bias = (v.get_value() if isinstance(v, nnx.Variable) else v for v in (kernel, bias))  # nnx.Param
        w = dense_in_out(kernel, layout=layout, in_features=in_features, out_features=out_features, bias=bias)
        W = _prune.magnitude(w, block_size, density, norm=norm)
        param_dtype = W.dtype if param_dtype is None else param_dtype
        n_in, n_out = W.shape
        return cls(
            n_in, n_out, block_size=W.block_size, density=W.density, use_bias=bias is not None, dtype=dtype,
            param_dtype=param_dtype, activation=activation, pattern=W.pattern,
            kernel_init=lambda *_: W.to_dense(), bias_init=lambda *_: jnp.asarray(bias),
            implementation=implementation, rngs=nnx.Rngs(0) if rngs is None else rngs,
        )  # fmt: skip

    @property
    def weight(self) -> BlockSparseMatrix:
        """The kernel as a :class:`~blocksparse.BlockSparseMatrix` ``(in, out)``."""
        return BlockSparseMatrix._from_fields(pattern=self.pattern, data=self.kernel[...])

    def __call__(self, x) -> jax.Array:
        """``x (..., in_features)`` -> ``(..., out_features)``."""
        data = self.kernel[...]
        bias = None if self.bias is None else self.bias[...]
        x = jnp.asarray(x)
        if self.dtype is not None:
            x, data = x.astype(self.dtype), data.astype(self.dtype)
            bias = None if bias is None else bias.astype(self.dtype)
        W = BlockSparseMatrix._from_fields(pattern=self.pattern, data=data)
        return sparse_linear(x, W, bias, self.activation, self.implementation)


def _blocks(pattern: BlockPattern, dense) -> jax.Array:
    """The ``(nnz, bh, bw)`` blocks of a dense ``(in, out)`` array at ``pattern``."""
    bh, bw = pattern.block_size
    gm, gk = pattern.grid
    blocks = dense.reshape(gm, bh, gk, bw).swapaxes(1, 2)
    return blocks[np.asarray(pattern.rows), np.asarray(pattern.cols)]
