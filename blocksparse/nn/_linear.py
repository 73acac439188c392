"""Linear layers as plain pytrees: usable with ``jax.grad``, optax, Equinox or Flax.

:class:`SparseLinear` (block-sparse weight) and :class:`Linear` (its dense counterpart) share one
interface, so a model can hold "a projection that may be dense or block-sparse": both store the
weight ``(in_features, out_features)``, take ``activation`` by name and compute
``activation(x @ W + b)`` with the same dtype rules.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from .. import prune as _prune
from .._checkpoint import register_checkpoint_type
from .._matrix import BlockSparseMatrix, is_concrete, require_host
from .._pattern import BlockPattern, check_block_size, check_density, num_blocks
from .._util import Pytree, check_positive_int
from ..ops.matmul import epilogue as _epilogue
from ..ops.matmul.api import matmul

__all__ = ["ACTIVATIONS", "LAYOUTS", "Linear", "SparseLinear", "random_pattern"]

#: Activation names fused into the product's epilogue (``None``: no activation): ``bs.matmul``'s own,
#: name -> float32 element-wise function. ``"gelu"`` is the exact (erf) form, as PyTorch and BERT.
ACTIVATIONS = _epilogue.ACTIVATIONS

#: Weight layouts of ``from_dense``: Flax stores ``(in, out)``, PyTorch and Equinox ``(out, in)``.
LAYOUTS = ("in_out", "out_in")


check_activation = _epilogue.check_activation


def check_features(**features) -> None:
    """Each of ``features`` (``in_features=...``) a positive int: named in the error otherwise."""
    for name, n in features.items():
        check_positive_int(n, name)


def random_pattern(key, shape, block_size, density: float) -> BlockPattern:
    """The pattern ``bs.random(key, shape, block_size, density)`` draws, without drawing its values.

    The pattern is host data: ``key`` must be concrete. Under ``jit``, ``jax.eval_shape`` or ``nnx.eval_shape``
    draw it outside first and pass it in (``pattern=`` of the Flax layer; ``from_pattern``-style constructors).
    """
    if not is_concrete(key):
        raise TypeError(
            "The block pattern is host data, drawn from a concrete key; this key is traced (inside jit, "
            "jax.eval_shape or nnx.eval_shape). Draw the pattern outside the trace, e.g. "
            "pattern = bs.nn.random_pattern(jax.random.key(0), (in_features, out_features), block_size, density), "
            "and pass it in (bs.nn.flax.SparseLinear(..., pattern=pattern))."
        )
    bh, bw = check_block_size(shape, block_size)
    num_blocks(check_density(density), (int(shape[0]) // bh) * (int(shape[1]) // bw))  # keeps >= 1 block if d > 0
    kp, _ = jax.random.split(key)
    return BlockPattern.random(int(jax.random.randint(kp, (), 0, 2**31 - 1)), shape, block_size, density)


def check_layout(layout) -> str:
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise ValueError(
            f"Expected layout 'in_out' (a weight of shape (in, out), as Flax) or 'out_in' (shape (out, in), "
            f"as PyTorch and Equinox). Got {layout!r}."
        )
    return layout


def dense_in_out(weight, *, layout: str, in_features=None, out_features=None, bias=None) -> np.ndarray | jax.Array:
    """``weight`` as ``(in, out)``, checked against the expected features and ``bias`` length.

    ``in_features`` / ``out_features`` (when given) are what the receiving layer expects; the bias
    length gives ``out_features`` otherwise, and a weight laid out the other way is named as such.
    """
    check_layout(layout)
    shape = tuple(getattr(weight, "shape", np.shape(weight)))
    names = "(in, out)" if layout == "in_out" else "(out, in)"
    if len(shape) != 2:
        raise ValueError(f"Expected a 2-D weight of shape {names} for layout={layout!r}. Got shape {shape}.")
    n_in, n_out = shape if layout == "in_out" else shape[::-1]
    want_in = n_in if in_features is None else int(in_features)
    want_out = n_out if out_features is None else int(out_features)
    if (want_in, want_out) != (n_in, n_out):
        want = (want_in, want_out) if layout == "in_out" else (want_out, want_in)
        raise ValueError(f"Expected a weight of shape {names} = {want} for layout={layout!r}. Got {shape}.")
    if bias is not None:
        bshape = tuple(getattr(bias, "shape", np.shape(bias)))
        if bshape != (n_out,):
            other = "out_in" if layout == "in_out" else "in_out"
            hint = f"; the weight would fit with layout={other!r}" if bshape == (n_in,) and n_in != n_out else ""
            raise ValueError(
                f"Expected a bias of shape ({n_out},) (out_features,) for a weight of shape {shape} in layout "
                f"{layout!r}. Got {bshape}{hint}."
            )
    if layout == "out_in":
        weight = weight.T
    return weight


def _check_bias(weight_shape: tuple[int, ...], lead: tuple[int, ...], bias) -> None:
    """Leading dimensions shared by the weight are allowed (a stack of layers, e.g. for ``lax.scan``)."""
    if bias is None or not hasattr(bias, "shape"):
        return
    expected = (*lead, weight_shape[-1])
    if tuple(bias.shape) != expected:
        raise ValueError(
            f"Expected a bias of shape {expected} (out_features,) for a weight of shape {weight_shape}. "
            f"Got {tuple(bias.shape)}; pass bias=None for no bias."
        )


@dataclasses.dataclass(frozen=True)
class SparseLinear(Pytree):
    """``y = activation(x @ W + b)`` with a block-sparse ``W`` of shape ``(in_features, out_features)``.

    The pattern is static (part of the pytree structure); ``W.data`` and ``b`` are the trainable
    leaves, so ``jax.grad`` of a loss w.r.t. the layer returns a layer of gradients laid out the
    same way (never a dense ``in x out`` gradient). The bias and the activation are fused into the
    product's epilogue. The output has the promoted dtype of ``x`` and ``W``; half-precision inputs
    accumulate (and add the bias, and apply the activation) in float32.

    Attributes:
        weight: a :class:`~blocksparse.BlockSparseMatrix` ``(in_features, out_features)``.
        bias: ``(out_features,)`` or ``None``.
        activation: ``None`` or one of :data:`ACTIVATIONS` (``"relu"``, ``"gelu"`` (exact erf),
            ``"gelu_tanh"``, ``"silu"``, ``"tanh"``, ``"sigmoid"``).
        implementation: passed to :func:`blocksparse.matmul`.

    Example::

        >>> import jax, jax.numpy as jnp, blocksparse as bs
        >>> layer = bs.nn.SparseLinear.init(jax.random.key(0), 64, 32, block_size=16, density=0.25)
        >>> layer(jnp.ones((8, 64))).shape
        (8, 32)
    """

    _leaves = ("weight", "bias")
    _static = ("implementation", "activation")

    weight: BlockSparseMatrix
    bias: jax.Array | None
    implementation: str | tuple[str, ...] | None = None
    activation: str | None = None

    def __post_init__(self):
        # Runs on construction only (JAX rebuilds layers from leaves without it).
        object.__setattr__(self, "activation", check_activation(self.activation))  # a function -> its name
        w = self.weight
        if isinstance(w, BlockSparseMatrix) and hasattr(w.data, "shape"):
            _check_bias(w.shape, tuple(w.data.shape[:-3]), self.bias)

    @classmethod
    def init(
        cls, key, in_features: int, out_features: int, block_size, density: float,
        *, use_bias: bool = True, dtype=jnp.float32, activation: str | None = None, implementation=None,
    ) -> SparseLinear:  # fmt: skip
        """A random pattern of the given density; values uniform in ``+-1/sqrt(fan_in)``, bias zero.

        ``fan_in`` counts only the inputs a unit actually sees (``in_features * density``), so
        activations keep the scale of a dense layer's.
        """
        require_host("SparseLinear.init", key=key, density=density)
        check_features(in_features=in_features, out_features=out_features)
        activation = check_activation(activation)
        kw, kp = jax.random.split(key)
        pattern = random_pattern(kw, (in_features, out_features), block_size, density)
        bound = 1.0 / math.sqrt(max(in_features * max(pattern.density, 1e-12), 1.0))
        data = jax.random.uniform(kp, (pattern.nnz_blocks, *pattern.block_size), dtype, -bound, bound)
        bias = jnp.zeros((out_features,), dtype) if use_bias else None
        return cls(BlockSparseMatrix(pattern, data), bias, implementation, activation)

    @classmethod
    def from_dense(
        cls, weight, bias=None, *, block_size, density: float, layout: str = "in_out", norm: str = "l2",
        activation: str | None = None, implementation=None, in_features: int | None = None,
        out_features: int | None = None,
    ) -> SparseLinear:  # fmt: skip
        """Prune a dense weight by block magnitude (see :func:`blocksparse.prune.magnitude`).

        Arguments:
            weight: a concrete dense weight, ``(in, out)`` for ``layout="in_out"`` (Flax's kernel)
                or ``(out, in)`` for ``layout="out_in"`` (PyTorch's and Equinox's weight).
            bias: ``(out,)`` or ``None``.
            block_size: blocks of the stored ``(in, out)`` weight: ``b`` or ``(b_in, b_out)``.
            density: fraction of blocks kept, in ``[0, 1]`` (``1`` keeps every block).
            in_features, out_features: optional; if given, the weight's shape is checked against them.

        The pattern is host data: call it outside ``jit`` with a concrete ``weight``.
        """
        require_host("SparseLinear.from_dense", weight=weight, density=density)
        activation = check_activation(activation)
        w = dense_in_out(weight, layout=layout, in_features=in_features, out_features=out_features, bias=bias)
        bias = None if bias is None else jnp.asarray(bias)
        return cls(_prune.magnitude(w, block_size, density, norm=norm), bias, implementation, activation)

    @property
    def in_features(self) -> int:
        return self.weight.shape[0]

    @property
    def out_features(self) -> int:
        return self.weight.shape[1]

    def __call__(self, x) -> jax.Array:
        """``x (..., in_features)`` -> ``(..., out_features)``; under ``jax.vmap`` still one product."""
        from ._product import sparse_linear

        if type(self.weight) is BlockSparseMatrix:
            return sparse_linear(x, self.weight, self.bias, self.activation, self.implementation)
        # Other sparse operands (dynamic, sharded by bs.shard) run bs.matmul's own product.
        return matmul(x, self.weight, bias=self.bias, activation=self.activation, implementation=self.implementation)


@dataclasses.dataclass(frozen=True)
class Linear(Pytree):
    """``y = activation(x @ W + b)`` with a dense ``W`` of shape ``(in_features, out_features)``.

    The dense counterpart of :class:`SparseLinear`, with the same interface and dtype rules: one
    ``dot_general`` accumulating in float32 for half-precision inputs, then the bias and the
    activation in the accumulation dtype, and the output in the promoted dtype of ``x`` and ``W``.

    Attributes:
        weight: ``(in_features, out_features)``.
        bias: ``(out_features,)`` or ``None``.
        activation: ``None`` or one of :data:`ACTIVATIONS`.

    Example::

        >>> import jax, jax.numpy as jnp, blocksparse as bs
        >>> layer = bs.nn.Linear.init(jax.random.key(0), 64, 32, activation="gelu")
        >>> layer(jnp.ones((8, 64))).shape
        (8, 32)
    """

    _leaves = ("weight", "bias")
    _static = ("activation",)

    weight: jax.Array
    bias: jax.Array | None
    activation: str | None = None

    def __post_init__(self):
        object.__setattr__(self, "activation", check_activation(self.activation))  # a function -> its name
        w = self.weight
        if hasattr(w, "shape"):
            if len(w.shape) < 2:
                raise ValueError(f"Expected a weight of shape (in_features, out_features). Got {tuple(w.shape)}.")
            _check_bias(tuple(w.shape), tuple(w.shape[:-2]), self.bias)

    @classmethod
    def init(
        cls, key, in_features: int, out_features: int, *, use_bias: bool = True, dtype=jnp.float32,
        activation: str | None = None,
    ) -> Linear:  # fmt: skip
        """Values uniform in ``+-1/sqrt(in_features)``, bias zero (as :meth:`SparseLinear.init` at density 1)."""
        activation = check_activation(activation)
        bound = 1.0 / math.sqrt(max(in_features, 1))
        weight = jax.random.uniform(key, (in_features, out_features), dtype, -bound, bound)
        bias = jnp.zeros((out_features,), dtype) if use_bias else None
        return cls(weight, bias, activation)

    @classmethod
    def from_dense(
        cls, weight, bias=None, *, layout: str = "in_out", activation: str | None = None,
        in_features: int | None = None, out_features: int | None = None,
    ) -> Linear:  # fmt: skip
        """A layer holding ``weight`` (``(in, out)`` for ``layout="in_out"``, ``(out, in)`` for ``"out_in"``).

        Unlike :meth:`SparseLinear.from_dense` it needs no host data: it works inside ``jit`` too.
        """
        activation = check_activation(activation)
        w = dense_in_out(
            jnp.asarray(weight), layout=layout, in_features=in_features, out_features=out_features, bias=bias
        )
        return cls(w, None if bias is None else jnp.asarray(bias), activation)

    @property
    def in_features(self) -> int:
        return self.weight.shape[-2]

    @property
    def out_features(self) -> int:
        return self.weight.shape[-1]

    def __call__(self, x) -> jax.Array:
        """``x (..., in_features)`` -> ``(..., out_features)``."""
        return dense_product(x, self.weight, self.bias, self.activation)


register_checkpoint_type(SparseLinear, "blocksparse.nn.SparseLinear")
register_checkpoint_type(Linear, "blocksparse.nn.Linear")


def dense_product(x, weight, bias=None, activation: str | None = None, precision=None) -> jax.Array:
    """``activation(x @ weight + bias)`` for a dense ``weight (in, out)``, with :class:`SparseLinear`'s dtype rules."""
    x = jnp.asarray(x)
    n_in = weight.shape[0]
    if x.ndim == 0 or x.shape[-1] != n_in:
        raise ValueError(
            f"Expected the input's last dimension to be {n_in} (W is {tuple(weight.shape)}). Got shape {x.shape}."
        )
    out = jnp.result_type(x, weight)
    if not (jnp.issubdtype(x.dtype, jnp.floating) and jnp.issubdtype(out, jnp.floating)):
        # as bs.matmul (SparseLinear): an integer input is refused, not promoted
        raise TypeError(f"Expected a floating-point input and weight. Got {x.dtype} and {weight.dtype}.")
    acc = jnp.float32 if jnp.finfo(out).bits < 32 else out
    y = jax.lax.dot_general(
        x.astype(out), weight.astype(out), (((x.ndim - 1,), (0,)), ((), ())),
        precision=precision, preferred_element_type=acc,
    )  # fmt: skip
    if bias is None and activation is None:
        return y.astype(out)
    return _epilogue.apply(y, bias, activation).astype(out)  # bs.matmul's epilogue, in float32
