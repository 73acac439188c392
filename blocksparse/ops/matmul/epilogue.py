"""The fused epilogue of a product: ``activation(product + bias)``, then the cast to the output dtype; or, gated
(``glu``), ``activation(a) * b`` of the two halves ``a, b`` of ``product + bias`` along its features. And its one
prologue, a gate on the dense operand (:class:`InputGate`): the product runs on ``activation(a) * b`` of the
operand's two halves along the contracted dimension, computed where the kernel loads the operand.

A linear layer's product is followed by a bias, an activation and a cast; run as separate XLA ops
after a kernel, they read and write the whole output again (for a 32768 x 1536 FFN activation in
bf16, 100 MB each way, about as long as the sparse product itself at d = 1/8). The kernels apply
:func:`apply` to their float32 accumulator before the one store instead.

The functions use only element-wise ``jnp`` / ``lax`` operations that lower inside Pallas (Triton)
kernels as well as in XLA, so the kernels and the pure-JAX reference share this one definition.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from jax import lax

__all__ = ["ACTIVATIONS", "Epilogue", "InputGate", "apply", "check_activation", "gate_after", "gate_first",
           "gate_input", "gated", "gated_pair"]  # fmt: skip

_SQRT_HALF = 1.0 / math.sqrt(2.0)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _sigmoid(y):
    # exp of -|y| only: 1 / (1 + exp(-y)) overflows for y < -88 and its gradient becomes inf / inf.
    e = jnp.exp(-jnp.abs(y))
    return jnp.where(y >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


# erf(x) ~ x P(x^2) / Q(x^2) on [-4, 4] (+-1 beyond, where float32 erf is +-1 to the last bit): the
# rational approximation XLA and Eigen use for float32 (about 1 ulp). Pallas' Triton lowering has
# no erf primitive, so kernels and the reference share this one.
_ERF_P = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
          -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02)  # fmt: skip
_ERF_Q = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03,
          -1.42647390514189e-02)  # fmt: skip


def _horner(coefficients, z):
    acc = jnp.full_like(z, coefficients[0])
    for c in coefficients[1:]:
        acc = acc * z + c
    return acc


def erf(y):
    """float32 ``erf`` from element-wise arithmetic only (lowers inside Triton kernels); float64
    (the XLA path only: the kernels take no float64) uses ``lax.erf``."""
    if y.dtype == jnp.float64:
        return lax.erf(y)
    y = jnp.clip(y, -4.0, 4.0)
    z = y * y
    return y * _horner(_ERF_P, z) / _horner(_ERF_Q, z)


#: Activation name -> element-wise float32 function. ``"gelu"`` is the exact (erf) form, as in
#: PyTorch's ``nn.GELU()`` and BERT; ``"gelu_tanh"`` the tanh approximation (``jax.nn.gelu``'s default).
ACTIVATIONS = {
    "relu": lambda y: jnp.maximum(y, 0.0),
    "gelu": lambda y: 0.5 * y * (1.0 + erf(y * _SQRT_HALF)),
    "gelu_tanh": lambda y: 0.5 * y * (1.0 + jnp.tanh(_SQRT_2_OVER_PI * (y + 0.044715 * y * y * y))),
    "silu": lambda y: y * _sigmoid(y),
    "tanh": jnp.tanh,
    "sigmoid": _sigmoid,
}


def _jax_functions() -> dict:
    """JAX's own activation functions -> their name here (``jax.nn.gelu`` is the tanh form by default)."""
    import jax

    return {jax.nn.relu: "relu", jax.nn.gelu: "gelu_tanh", jax.nn.silu: "silu", jax.nn.swish: "silu",
            jax.nn.sigmoid: "sigmoid", jnp.tanh: "tanh", jax.lax.tanh: "tanh"}  # fmt: skip


def check_activation(activation) -> str | None:
    """The activation's name: ``None``, a name in :data:`ACTIVATIONS`, or one of JAX's own functions
    (``jax.nn.relu``, ``jax.nn.gelu`` (tanh form; ``functools.partial(jax.nn.gelu, approximate=False)`` is
    ``"gelu"``), ``jax.nn.silu`` / ``swish``, ``jax.nn.sigmoid``, ``jnp.tanh``); else a ``ValueError``
    listing what is accepted."""
    if activation is None or (isinstance(activation, str) and activation in ACTIVATIONS):
        return activation
    if callable(activation):
        known = _jax_functions()
        try:
            if activation in known:
                return known[activation]
        except TypeError:  # unhashable callable
            pass
        func = getattr(activation, "func", None)  # functools.partial(jax.nn.gelu, approximate=...)
        if func is not None and known.get(func) == "gelu_tanh" and not activation.args:
            return "gelu_tanh" if activation.keywords.get("approximate", True) else "gelu"
    what = getattr(activation, "__name__", None) if callable(activation) else None
    got = f"the function {what}" if what else repr(activation)
    raise ValueError(
        f"Expected activation None or one of {sorted(ACTIVATIONS)} or of JAX's [jax.nn.relu, jax.nn.gelu, "
        f"jax.nn.silu, jax.nn.sigmoid, jnp.tanh]. Got {got}; other functions apply to the product's result "
        "(they are not fused into the kernel's store)."
    )


@dataclasses.dataclass(frozen=True)
class Epilogue:
    """What follows the product (static).

    Attributes:
        activation: ``None`` or a name in :data:`ACTIVATIONS`.
        bias: whether a bias is added (an array operand of the op).
        bias_axis: the axis of the kernel's 2-D output the bias runs along (``1``: one value per
            column, the usual ``x @ W + b``; ``0``: per row, for products computed transposed): the features.
        glu: gated: the product's features (along ``bias_axis``) are two halves ``a, b`` and the output is
            ``activation(a) * b`` (:func:`gated`), half as wide (SwiGLU with ``"silu"``, GeGLU with ``"gelu"``).
    """

    activation: str | None = None
    bias: bool = False
    bias_axis: int = 1
    glu: bool = False


@dataclasses.dataclass(frozen=True)
class InputGate:
    """A GLU on the dense operand before the product (static): the operand's contracted dimension holds two halves
    ``a, b`` (gate and value) and the product runs on :func:`gate_input`'s ``activation(a) * b``, computed in float32
    and rounded to the operand's dtype (as a separate gate would store it), half as long.

    Attributes:
        activation: ``None`` (the bilinear ``a * b``) or a name in :data:`ACTIVATIONS`.
    """

    activation: str | None = None


def gate_input(x, gate: InputGate, axis: int = -1):
    """``x``'s gated half: ``activation(a) * b`` of its two halves ``a, b`` along ``axis``, in float32, then rounded to
    ``x``'s dtype: the operand a product with :class:`InputGate` multiplies."""
    return gated(x, gate.activation, axis).astype(x.dtype)


def apply(y, bias, activation: str | None):
    """``activation(y + bias)`` in float32, or in ``y``'s dtype where it is wider (``bias``
    broadcast against ``y``, or ``None``)."""
    dt = jnp.promote_types(y.dtype, jnp.float32)
    y = y.astype(dt)
    if bias is not None:
        y = y + bias.astype(dt)
    return y if activation is None else ACTIVATIONS[activation](y)


def gated_pair(a, b, activation: str | None):
    """``activation(a) * b`` in float32 (or the inputs' wider dtype; ``activation=None``: the bilinear ``a * b``)."""
    return apply(a, None, activation) * b.astype(jnp.promote_types(b.dtype, jnp.float32))


def gated(y, activation: str | None, axis: int = -1):
    """:func:`gated_pair` of the two halves ``a, b`` of ``y`` along ``axis`` (``jax.nn.glu``'s split)."""
    return gated_pair(*jnp.split(y, 2, axis=axis), activation)


def reference(y, bias, epi: Epilogue | None, out_dtype) -> jax.Array:
    """The epilogue on a whole 2-D product in its accumulation dtype (the XLA path); ``None``: the cast."""
    if epi is None:
        return y.astype(out_dtype)
    if bias is not None and epi.bias_axis == 0:
        bias = bias[:, None]
    if epi.glu:
        return gated(apply(y, bias, None), epi.activation, epi.bias_axis).astype(out_dtype)
    return apply(y, bias, epi.activation).astype(out_dtype)


def gate_first(product, s, i: int, axis: int, *args):
    """An input gate (``s.input_gate``) outside the kernel: ``args[i]``, the dense operand, gated in XLA along its
    contracted ``axis`` (:func:`gate_input`), then ``product(static without the gate, *args)``."""
    args = list(args)
    args[i] = gate_input(args[i], s.input_gate, axis)
    return product(s.but(input_gate=None), *args)


def gate_after(fused, s, *args):
    """A gated epilogue (``s.epilogue.glu``) outside the kernel: ``fused(static, *args)``, a backend's fused product,
    with only the bias fused and a float32 (or wider) output, then :func:`gated` and the cast in XLA."""
    epi = s.epilogue
    acc = jnp.promote_types(s.out_dtype, jnp.float32)
    z = fused(s.but(out_dtype=acc, epilogue=Epilogue(None, epi.bias, epi.bias_axis)), *args)
    return gated(z, epi.activation, epi.bias_axis).astype(s.out_dtype)
