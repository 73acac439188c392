"""The public block-sparse products and their validation: :func:`matmul` and :func:`sdd`.

Each call is checked here, then runs one of the custom-VJP ops of :mod:`.vjp` (``dsd``: ``W @ x``, ``dds``:
``x @ W``, ``sdd``: ``a @ b`` at a pattern, and their dynamic twins) with an :class:`OpStatic`: everything static
about the call, the ``jit`` cache key of the op.

``implementation`` is ``None``, a name or a sequence of names; the first backend that does not raise
``NotImplementedError`` wins. ``None`` means :func:`.order.of_product` (``("pallas", "xla")``: the Pallas
(Triton) kernel where it can run, else the pure-JAX reference; on a Hopper GPU ``"mosaic"`` first where a Mosaic
GPU kernel measured faster).

``config`` is one backend's frozen config dataclass (:class:`~.triton.TritonConfig`,
:class:`~.mosaic.MosaicConfig`, :class:`~.mosaic.DdsConfig`, :class:`~.mosaic.BandConfig`,
:class:`~.mosaic.SddConfig`; each names its ``backend``), carried on the :class:`OpStatic`, so part of the
``jit`` cache key. With ``implementation=None`` only the config's backend runs (no silent fallback); an explicit
``implementation`` must include it. A backend applies a config only where it is of a type it takes for that op
(else it ignores it). The config applies to the forward product; the backward's products take their defaults.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..._matrix import BlockSparseMatrix, DynamicBlockSparseMatrix, check_floating, inside_sparsify
from ..._pattern import BlockPattern
from .._dispatch import dispatch_log, resolve
from . import epilogue as _epilogue
from . import order, vjp
from .mosaic import BandConfig, DdsConfig, MosaicConfig, SddConfig
from .reference import acc_dtype
from .registry import get_backend, register_backend
from .triton import TritonConfig

__all__ = ["OpStatic", "apply_2d", "canonical_precision", "dispatch_log", "get_backend", "matmul",
           "register_backend", "result_dtype", "sdd"]  # fmt: skip

#: The config types :func:`matmul` takes, and :func:`sdd`.
MATMUL_CONFIGS = (TritonConfig, MosaicConfig, DdsConfig, BandConfig)
SDD_CONFIGS = (TritonConfig, SddConfig)


@dataclasses.dataclass(frozen=True)
class OpStatic:
    """Everything static about one product call (hashable: the ``custom_vjp``'s static argument).

    Backends receive it first: ``backend.dsd(static, data, x)``.

    Attributes:
        impls: implementation names, tried in order.
        out_dtype: the result dtype.
        precision: ``None`` (the backend's default: TF32 tensor-core dots for float32 on a GPU,
            like ``jnp.dot``) or a ``lax.Precision``; ``HIGHEST`` gives float32 accuracy.
        pattern: the static pattern (``dsd``, ``dds``, ``sdd``).
        grid: ``(output block rows, contracting block columns)`` of a dynamic ``dyn_dsd``.
        transposed: ``dyn_dsd`` only: ``data[i]`` holds block ``i`` of the sparse operand
            transposed (``x @ D`` and gradients run on ``D``'s own data, with no transposed copy).
        block_size: the blocks of a dynamic ``dyn_sdd``.
        epilogue: the fused bias / activation of a ``*_fused`` op (see :mod:`.epilogue`).
        input_gate: the GLU on the dense operand of a ``*_input_glu`` op (:class:`.epilogue.InputGate`), or ``None``.
        auto: ``implementation=None``: the weight gradient's sdd takes its own default order rather than the
            product's, and the products of an sdd's backward theirs.
        config: one backend's config (hashable), applied by the backends that take its type for the op; the
            backward's products run without it.
    """

    impls: tuple[str, ...]
    out_dtype: np.dtype
    precision: lax.Precision | None = None
    pattern: BlockPattern | None = None
    grid: tuple[int, int] | None = None
    transposed: bool = False
    block_size: tuple[int, int] | None = None
    epilogue: _epilogue.Epilogue | None = None
    input_gate: _epilogue.InputGate | None = None
    auto: bool = False
    config: object = None

    def but(self, **changes) -> OpStatic:
        return dataclasses.replace(self, **changes)


def _keep_and_validity(D: DynamicBlockSparseMatrix):
    gm, gk = D.grid
    valid = D.validity()
    keep = D.active() & (D.rows >= 0) & (D.rows < gm) & (D.cols >= 0) & (D.cols < gk)
    return keep, valid


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------
_SPARSE = (BlockSparseMatrix, DynamicBlockSparseMatrix)

# jax.default_matmul_precision names -> lax.Precision (the same mapping jnp.dot makes).
_PRECISION_NAMES = {
    "default": lax.Precision.DEFAULT,
    "bfloat16": lax.Precision.DEFAULT,
    "fastest": lax.Precision.DEFAULT,
    "high": lax.Precision.HIGH,
    "tensorfloat32": lax.Precision.HIGH,
    "bfloat16_3x": lax.Precision.HIGH,
    "highest": lax.Precision.HIGHEST,
    "float32": lax.Precision.HIGHEST,
}


def canonical_precision(precision) -> lax.Precision | None:
    """Canonical precision: the argument, else ``jax.default_matmul_precision`` (read at trace time;
    it is part of JAX's jit cache key), else ``None`` (the backend default)."""
    where = "precision"
    if precision is None:
        precision = jax.config.jax_default_matmul_precision
        where = "jax.default_matmul_precision"
        if precision is None:
            return None
    if isinstance(precision, tuple | list) and len(precision) == 2 and precision[0] == precision[1]:
        precision = precision[0]
    if isinstance(precision, lax.Precision):
        return precision
    if isinstance(precision, str) and precision.lower() in _PRECISION_NAMES:
        return _PRECISION_NAMES[precision.lower()]
    raise ValueError(
        f"Expected {where} None, a jax.lax.Precision, one of {sorted(_PRECISION_NAMES)} or a pair of equal "
        f"precisions. Got {precision!r}."
    )


def _dense(x, what: str) -> jax.Array:
    x = jnp.asarray(x)
    check_floating(x.dtype, what)
    return x


def result_dtype(preferred_element_type, *dtypes) -> np.dtype:
    if preferred_element_type is None:
        return jnp.dtype(jnp.result_type(*dtypes))
    try:
        dt = jnp.dtype(preferred_element_type)
    except TypeError:
        raise TypeError(f"Expected preferred_element_type a floating dtype. Got {preferred_element_type!r}.") from None
    if not jnp.issubdtype(dt, jnp.floating):
        raise TypeError(
            f"Expected preferred_element_type a floating dtype (float16, bfloat16, float32, float64). Got {dt}; "
            "block-sparse products accumulate in floating point and would truncate."
        )
    return dt


def _check_config(config, allowed: tuple[type, ...]):
    """``TypeError`` unless ``config`` is ``None`` or of one of the ``allowed`` config types."""
    if config is not None and not isinstance(config, allowed):
        names = ", ".join(c.__name__ for c in allowed)
        raise TypeError(f"Expected config None or one of {names}. Got {type(config).__name__}: {config!r}.")
    return config


def _impls(implementation, config, default) -> tuple[str, ...]:
    """The implementations to try: ``implementation`` (``None``: ``default()``), and with a ``config`` only its
    backend where ``implementation`` is ``None``; an explicit one must include the config's backend."""
    if config is None:
        return resolve(implementation, order.DEFAULT if implementation is not None else default())
    if implementation is None:
        return (config.backend,)
    impls = resolve(implementation, order.DEFAULT)
    if config.backend not in impls:
        raise ValueError(
            f"Expected implementation to include {config.backend!r}, the backend of config "
            f"{type(config).__name__}. Got implementation={implementation!r}."
        )
    return impls


def _default_order(a, b, fused: bool) -> tuple[str, ...]:
    """:func:`.order.of_product` of ``a @ b`` (``W @ x`` or ``x @ W``); :data:`.order.DEFAULT` unless exactly one
    operand is sparse."""
    static = lambda M: M.pattern if isinstance(M, BlockSparseMatrix) else None  # noqa: E731
    if isinstance(a, _SPARSE) and not isinstance(b, _SPARSE):
        return order.of_product("dsd", static(a), a.dtype, b, fused=fused)
    if isinstance(b, _SPARSE) and not isinstance(a, _SPARSE):
        return order.of_product("dds", static(b), b.dtype, a, fused=fused)
    return order.DEFAULT


def matmul(
    a,
    b,
    *,
    bias=None,
    activation=None,
    glu: bool = False,
    input_glu=None,
    implementation=None,
    precision=None,
    preferred_element_type=None,
    config=None,
) -> jax.Array:
    """Block-sparse matrix product; exactly one of ``a`` and ``b`` is sparse.

    - ``sparse (m, k) @ dense (k, n)`` -> ``(m, n)``; also ``(k,)`` -> ``(m,)`` and batched
      ``(..., k, n)`` -> ``(..., m, n)``.
    - ``dense (..., m) @ sparse (m, k)`` -> ``(..., k)`` (the form of a linear layer).

    Arguments:
        a, b: a :class:`BlockSparseMatrix` or :class:`DynamicBlockSparseMatrix`, and a dense array.
        bias: optional, added to the product: shape ``(out,)`` for the output's last dimension
            (``(m,)`` when ``x`` is a vector), as ``a @ b + bias`` broadcasts.
        activation: optional, applied after the bias: ``"relu"``, ``"gelu"`` (exact, erf),
            ``"gelu_tanh"``, ``"silu"``, ``"tanh"`` or ``"sigmoid"``, or JAX's function of one of them
            (``jax.nn.relu``, ``jax.nn.gelu``, ...: :func:`.epilogue.check_activation`). Bias, activation
            and the cast to the output dtype run on the float32 accumulator inside the kernel (one store
            of the output, no extra pass over it); the gradients are those of the unfused expression.
        glu: gated (a GLU): the result's last dimension, the bias added, is split in two halves ``a, b``
            (as ``jax.nn.glu`` splits it) and the result is ``activation(a) * b``, half as wide: SwiGLU's
            ``silu(x @ W_gate) * (x @ W_up)`` is ``matmul(x, concatenate([W_gate, W_up], axis=1),
            activation="silu", glu=True)`` (:func:`blocksparse.concatenate`). ``x @ W`` and ``W @ v`` (a vector)
            gate in the kernel's store where it can (the few-token kernel), the others after the product.
        input_glu: ``None``, or a GLU on the dense operand before the product: its contracted dimension (the last of
            ``x`` in ``x @ W``, the first of ``x``'s matrix dimensions in ``W @ x``) is twice ``W``'s and holds two
            halves ``a, b``, and the product runs on ``activation(a) * b`` (computed in float32, rounded to the
            operand's dtype). Give the activation (a name or JAX function as for ``activation``; ``"silu"`` for
            SwiGLU's ``down(silu(gate) * up)``) or ``True`` for the bilinear ``a * b``; ``None`` or ``False``: no gate.
            The few-token kernel can gate where it loads the operand (no gated copy in memory) where the tuned
            ``TRITON_STREAM_GATES_INPUT`` says it is faster or ``TritonConfig(stream=True)`` asks; elsewhere the gate
            runs in XLA first. Gradients are the unfused expression's.
        implementation: ``None`` (fastest available, falling back to pure JAX: :func:`.order.of_product`),
            ``"pallas"`` (Triton), ``"mosaic"`` (the Hopper kernels; first by default on a Hopper GPU where they
            measured faster), ``"xla"``, or a sequence tried in order.
        precision: as for ``jnp.dot``: ``None`` (``jax.default_matmul_precision`` if set, else the
            backend default: TF32 tensor-core dots for float32 on a GPU), a ``jax.lax.Precision``
            or its name. ``"highest"`` gives float32 accuracy for float32 inputs on every backend.
        preferred_element_type: output dtype (floating); by default JAX's promotion of the two
            dtypes. Half-precision inputs always accumulate in float32.
        config: ``None`` (each kernel's defaults) or one backend's config: a
            :class:`~blocksparse.ops.matmul.TritonConfig` (``"pallas"``), :class:`~blocksparse.ops.matmul.MosaicConfig`
            (``"mosaic"``, ``W @ x`` and dynamic products), :class:`~blocksparse.ops.matmul.DdsConfig` (``"mosaic"``,
            ``x @ W``) or :class:`~blocksparse.ops.matmul.BandConfig` (``"mosaic"``, blocks of 16 and 32). With
            ``implementation=None`` only that backend runs; an explicit ``implementation`` must include it. It
            applies to the forward product (part of the ``jit`` cache key); the backward's products take their
            defaults. A backend ignores a config of a type it does not take for the product.

    Returns:
        The dense product. Differentiable w.r.t. the dense operand and the sparse ``.data``;
        works under ``jit``, ``grad`` and ``vmap``. For a dynamic matrix with invalid
        coordinates the result and its gradients are NaN (see
        :meth:`~blocksparse.DynamicBlockSparseMatrix.is_valid`). Absent blocks are exact zeros: a NaN
        or Inf in a part of the dense operand that no block reads does not reach the result (where
        the densified product would have NaN).
    """
    activation = _epilogue.check_activation(activation)
    config = _check_config(config, MATMUL_CONFIGS)
    if not isinstance(glu, bool | np.bool_):
        raise TypeError(f"Expected glu a bool. Got {glu!r}.")
    kw = dict(bias=bias, activation=activation, glu=bool(glu), implementation=implementation, precision=precision,
              preferred_element_type=preferred_element_type, config=config)  # fmt: skip
    if input_glu is None or (isinstance(input_glu, bool | np.bool_) and not input_glu):
        return _matmul(a, b, **kw)
    return _gated_input(a, b, _input_gate(input_glu), **kw)


def _matmul(a, b, *, bias, activation, glu, implementation, precision, preferred_element_type, config, gate=None):
    """:func:`matmul` on checked arguments; ``gate``: an input gate (``input_glu``) of a static matrix's product (the
    other operands are gated in XLA before they get here: :func:`_gated_input`)."""
    if gate is not None and not any(isinstance(o, BlockSparseMatrix) for o in (a, b)):
        raise AssertionError("an input gate reaches the product only with a static matrix")
    fused = bias is not None or activation is not None or glu
    for operand in (a, b):  # operands that run the product themselves (a matrix sharded by bs.shard)
        if (own := getattr(type(operand), "_bs_matmul", None)) is not None:
            if not fused:
                return own(a, b, implementation=implementation, precision=precision,
                           preferred_element_type=preferred_element_type)  # fmt: skip
            # Not fused into the kernels: the product in float32, then the epilogue and one cast.
            out = jax.eval_shape(lambda a, b: own(a, b, preferred_element_type=preferred_element_type), a, b)
            b1 = _bias(bias, (out.shape[0],) if out.ndim == 1 else out.shape[-1:])
            y = own(a, b, implementation=implementation, precision=precision,
                    preferred_element_type=acc_dtype(out.dtype))  # fmt: skip
            if glu:
                _even_features(y.shape)
                return _epilogue.gated(_epilogue.apply(y, b1, None), activation).astype(out.dtype)
            return _epilogue.apply(y, b1, activation).astype(out.dtype)
    impls = _impls(implementation, config, lambda: _default_order(a, b, fused))
    prec = canonical_precision(precision)
    a_sparse, b_sparse = isinstance(a, _SPARSE), isinstance(b, _SPARSE)
    if a_sparse != b_sparse and inside_sparsify():  # its interpreter cannot run our custom VJPs
        return a._sparsify_matmul(b, swap=False) if a_sparse else b._sparsify_matmul(a, swap=True)
    if a_sparse == b_sparse:
        raise TypeError(
            "Expected exactly one block-sparse operand. Got "
            f"{type(a).__name__} and {type(b).__name__}" + ("; use jnp.matmul for dense ones." if not a_sparse else ".")
        )
    if a_sparse:
        W, x = a, _dense(b, "dense operand")
        s = OpStatic(impls, result_dtype(preferred_element_type, W.dtype, x.dtype), prec, auto=implementation is None,
                     config=config)  # fmt: skip
        s = s.but(input_gate=gate)
        shape = W.shape if gate is None else (W.shape[0], 2 * W.shape[1])  # a gated x holds two halves
        if not fused:
            return apply_2d(shape, x, lambda x2: _sparse_dense(W, x2, s), sparse_first=True)
        if x.ndim == 1:  # (m,) output: the bias runs along the rows of the (m, 1) product
            b1 = _bias(bias, (W.shape[0],))
            if glu:
                _even_features((W.shape[0],))
            s = s.but(epilogue=_epilogue.Epilogue(activation, b1 is not None, 0, glu))
            return apply_2d(shape, x, lambda x2: _sparse_dense(W, x2, s, b1), sparse_first=True)
        if glu:  # the halves of each batch element's columns: the gate after the product
            _even_features(x.shape)
            y = _matmul(W, x, bias=bias, activation=None, glu=False, implementation=implementation, precision=precision,
                        preferred_element_type=acc_dtype(s.out_dtype), config=config, gate=gate)  # fmt: skip
            return _epilogue.gated(y, activation).astype(s.out_dtype)
        b1 = _bias(bias, x.shape[-1:])
        s = s.but(epilogue=_epilogue.Epilogue(activation, b1 is not None, 1))
        # Batch dimensions are folded into the columns: the bias repeats once per batch element.
        tile = lambda x2: None if b1 is None else jnp.tile(b1, math.prod(x.shape[:-2]))  # noqa: E731
        return apply_2d(shape, x, lambda x2: _sparse_dense(W, x2, s, tile(x2)), sparse_first=True)
    x, W = _dense(a, "dense operand"), b
    s = OpStatic(impls, result_dtype(preferred_element_type, W.dtype, x.dtype), prec, auto=implementation is None,
                 config=config, input_gate=gate)  # fmt: skip
    shape = W.shape if gate is None else (2 * W.shape[0], W.shape[1])  # a gated x holds two halves
    if not fused:
        return apply_2d(shape, x, lambda x2: _dense_sparse(x2, W, s), sparse_first=False)
    b1 = _bias(bias, (W.shape[1],))
    if glu:
        _even_features(W.shape)
    width = W.shape[1] // 2 if glu else W.shape[1]
    s = s.but(epilogue=_epilogue.Epilogue(activation, b1 is not None, 1, glu))
    return apply_2d(shape, x, lambda x2: _dense_sparse(x2, W, s, b1), sparse_first=False, width=width)


def _input_gate(input_glu) -> _epilogue.InputGate:
    """``matmul``'s ``input_glu`` (``True`` or an activation) as an :class:`~.epilogue.InputGate`."""
    if isinstance(input_glu, bool | np.bool_):  # True: the bilinear gate (False never gets here)
        return _epilogue.InputGate(None)
    if isinstance(input_glu, str) and input_glu in _epilogue.ACTIVATIONS or callable(input_glu):
        try:
            return _epilogue.InputGate(_epilogue.check_activation(input_glu))
        except ValueError:
            pass
    raise ValueError(
        f"Expected input_glu None or False (no gate), True (the bilinear a * b) or an activation: one of "
        f"{sorted(_epilogue.ACTIVATIONS)} or JAX's [jax.nn.relu, jax.nn.gelu, jax.nn.silu, jax.nn.sigmoid, jnp.tanh]. "
        f"Got {input_glu!r}."
    )


def _gated_input(a, b, gate: _epilogue.InputGate, **kw) -> jax.Array:
    """``matmul(a, b, **kw)`` with its dense operand gated first (``input_glu``): through the gated-input op for a
    static matrix (whose backend gates where its kernel loads the operand, or in XLA first), else the gate in XLA,
    then the product."""
    a_sparse, b_sparse = isinstance(a, _SPARSE) or hasattr(type(a), "_bs_matmul"), isinstance(b, _SPARSE)
    b_sparse = b_sparse or hasattr(type(b), "_bs_matmul")
    if a_sparse == b_sparse:
        return _matmul(a, b, **kw)  # its error for two dense or two sparse operands
    W, x = (a, _dense(b, "dense operand")) if a_sparse else (b, _dense(a, "dense operand"))
    k = W.shape[1] if a_sparse else W.shape[0]  # W's contracted dimension
    axis = (0 if x.ndim == 1 else x.ndim - 2) if a_sparse else x.ndim - 1
    if x.ndim == 0 or x.shape[axis] != 2 * k:
        got = "a scalar" if x.ndim == 0 else f"{x.shape[axis]} (shape {x.shape})"
        raise ValueError(
            f"Expected the dense operand's contracted dimension to be {2 * k} for input_glu (two halves, gate and "
            f"value, of W's {k}; W is {W.shape}). Got {got}."
        )
    if not isinstance(W, BlockSparseMatrix) or inside_sparsify():
        h = _epilogue.gate_input(x, gate, axis)
        return _matmul(W, h, **kw) if a_sparse else _matmul(h, W, **kw)
    # A static matrix: matmul's own path to its 2-D product, whose op gates x (twice W's contracted dimension).
    return _matmul(a, b, gate=gate, **kw)


def _even_features(shape: tuple[int, ...]) -> None:
    """A ``ValueError`` unless the result's last dimension ``shape[-1]`` has two halves (a GLU's gate and value)."""
    if shape[-1] % 2:
        raise ValueError(
            f"Expected an even last dimension of the result for glu=True (two halves, gate and value). Got {shape[-1]}."
        )


def _bias(bias, shape: tuple[int, ...]):
    if bias is None:
        return None
    bias = _dense(bias, "bias")
    if tuple(bias.shape) != tuple(shape):
        raise ValueError(f"Expected a bias of shape {tuple(shape)} (the output's last dimension). Got {bias.shape}.")
    return bias


def apply_2d(shape: tuple[int, int], x, product, *, sparse_first: bool, width: int | None = None):
    """Check ``x`` against a sparse operand of ``shape`` and run ``product`` on its 2-D form.

    ``sparse_first``: ``W (m, k) @ x`` with ``x`` of shape ``(k,)`` or ``(..., k, n)``, batch
    dimensions folded into the columns: ``product`` gets ``(k, B * n)`` and returns ``(m, B * n)``.
    Else ``x @ W`` with ``x`` of shape ``(..., m)``: ``product`` gets ``(B, m)``, returns ``(B, width)`` (``width``:
    ``k`` unless given, as for a gated epilogue).
    Shared by every kind of sparse operand (static, dynamic, sharded over a mesh).
    """
    m, k = shape
    if not sparse_first:
        if x.ndim == 0 or x.shape[-1] != m:
            raise ValueError(
                f"Expected the dense operand's last dimension to be {m} (W is {shape}). Got shape {x.shape}."
            )
        return product(x.reshape(math.prod(x.shape[:-1]), m)).reshape(*x.shape[:-1], k if width is None else width)
    if x.ndim == 0:
        raise ValueError("Expected a dense operand with at least 1 dimension. Got a scalar.")
    kx = x.shape[0] if x.ndim == 1 else x.shape[-2]
    if kx != k:
        raise ValueError(
            f"Expected the dense operand's contracting dimension to be {k} (W is {shape}). Got {kx} (shape {x.shape})."
        )
    if x.ndim == 1:
        return product(x[:, None])[:, 0]
    x2 = jnp.moveaxis(x, -2, 0).reshape(k, math.prod(x.shape[:-2]) * x.shape[-1])
    return jnp.moveaxis(product(x2).reshape(m, *x.shape[:-2], x.shape[-1]), 0, -2)


def _sparse_dense(W, x, s: OpStatic, bias=None):
    if isinstance(W, BlockSparseMatrix):
        if s.input_gate is not None:
            return vjp.input_glu("dsd", s.but(pattern=W.pattern), (W.data, x), bias)
        if s.epilogue is not None:
            return vjp.fused("dsd", s.but(pattern=W.pattern), (), (W.data, x), bias)
        return vjp.dsd(s.but(pattern=W.pattern), W.data, x)
    return _dynamic_product(W, x, s, transposed=False, bias=bias)


def _dense_sparse(x, W, s: OpStatic, bias=None):
    if isinstance(W, BlockSparseMatrix):
        if s.input_gate is not None:
            return vjp.input_glu("dds", s.but(pattern=W.pattern), (x, W.data), bias)
        if s.epilogue is not None:
            return vjp.fused("dds", s.but(pattern=W.pattern), (), (x, W.data), bias)
        return vjp.dds(s.but(pattern=W.pattern), x, W.data)
    # x @ W = (W^T @ x^T)^T, on W's own data (no transposed copy of the blocks); the bias then
    # runs along the rows of the transposed product.
    if s.epilogue is not None:
        s = s.but(epilogue=dataclasses.replace(s.epilogue, bias_axis=0))
    return _dynamic_product(W, x.T, s, transposed=True, bias=bias).T


def _dynamic_product(W: DynamicBlockSparseMatrix, x, s: OpStatic, transposed: bool, bias=None):
    """``W @ x`` (or ``W^T @ x``) for a dynamic ``W``: NaN, with NaN gradients, if ``W`` is invalid.

    The default order is Pallas first at every size: the scan kernel needs no plan built on the
    device, and measured close to the static kernel's time and below dense ``jnp.dot`` (docs/benchmarks.md,
    section "Dynamic sparsity").
    """
    keep, valid = _keep_and_validity(W)
    data, x = vjp.nan_grad(valid, W.data), vjp.nan_grad(valid, x)
    rows, cols, grid = (W.cols, W.rows, W.grid[::-1]) if transposed else (W.rows, W.cols, W.grid)
    s = s.but(grid=grid, transposed=transposed)
    if s.epilogue is not None:
        return vjp.nan_grad(valid, vjp.fused("dyn_dsd", s, (rows, cols, keep, valid), (data, x), bias))
    return vjp.nan_grad(valid, vjp.dyn_dsd(s, rows, cols, keep, valid, data, x))


def sdd(a, b, like, *, implementation=None, precision=None, preferred_element_type=None, config=None):
    """``a (m, n) @ b (n, k)`` computed only at the blocks of ``like``; returns a matrix like ``like``.

    This is the gradient of a block-sparse product w.r.t. its values (SDDMM). The result has
    ``like``'s pattern (static) or coordinates and ``nnz`` (dynamic); padding blocks are zero.
    ``implementation``, ``precision`` and ``preferred_element_type`` are as for :func:`matmul`; ``config`` too,
    of a type for this op: a :class:`~blocksparse.ops.matmul.TritonConfig` or a
    :class:`~blocksparse.ops.matmul.SddConfig` (the static Mosaic kernel).
    """
    config = _check_config(config, SDD_CONFIGS)
    if not isinstance(like, _SPARSE):
        raise TypeError(f"Expected `like` to be a block-sparse matrix. Got {type(like).__name__}.")
    a, b = _dense(a, "a"), _dense(b, "b")
    m, k = like.shape
    if a.ndim != 2 or b.ndim != 2 or a.shape[0] != m or b.shape[1] != k or a.shape[1] != b.shape[0]:
        raise ValueError(
            f"Expected a of shape ({m}, n) and b of shape (n, {k}) to match `like` {like.shape}. "
            f"Got {a.shape} and {b.shape}."
        )
    static = isinstance(like, BlockSparseMatrix)

    def default():
        return order.default("sdd", like.pattern, a.shape[1], a.dtype, b.dtype) if static else order.DEFAULT

    s = OpStatic(_impls(implementation, config, default), result_dtype(preferred_element_type, a.dtype, b.dtype),
                 canonical_precision(precision), auto=static and implementation is None, config=config)  # fmt: skip
    if static:
        return like._replace(data=vjp.sdd(s.but(pattern=like.pattern), a, b))
    keep, valid = _keep_and_validity(like)
    a, b = vjp.nan_grad(valid, a), vjp.nan_grad(valid, b)
    data = vjp.nan_grad(valid, vjp.dyn_sdd(s.but(block_size=like.block_size), like.rows, like.cols, keep, valid, a, b))
    return like._replace(data=data)
