"""Dispatch and differentiation for block-sparse products.

Three static ops, named by operand format (STK / MegaBlocks convention):

- ``dsd``: dense = sparse ``W (m, k)`` @ dense ``x (k, n)``;
- ``dds``: dense = dense ``x (B, m)`` @ sparse ``W (m, k)``;
- ``sdd``: sparse = dense ``a (m, n)`` @ dense ``b (n, k)`` sampled at a pattern.

Each has one ``custom_vjp`` whose backward is made of the other two, on the same list of
implementations: the gradient w.r.t. the dense operand runs on the cached transposed pattern,
the gradient w.r.t. the values is an ``sdd`` laid out like ``.data``.

Dynamic matrices have the twins ``dyn_dsd`` and ``dyn_sdd`` (``dds`` is ``dsd`` on the swapped
coordinates): the Pallas backend builds its work list inside ``jit`` with
:func:`.lowering.redistribute`, so the transposed product needs no cached transpose.

``implementation`` is ``None``, a name or a sequence of names; the first backend that does not
raise ``NotImplementedError`` wins. ``None`` means ``("pallas", "xla")``: the Pallas (Triton) kernel
where it can run, else the pure-JAX reference; on a Hopper GPU ``("mosaic", "pallas", "xla")`` for a
static ``W @ x`` where the Mosaic GPU kernel measured faster (:func:`.pallas_mosaic.prefers`).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..._matrix import BlockSparseMatrix, DynamicBlockSparseMatrix, check_floating, inside_sparsify
from ..._pattern import BlockPattern
from .._dispatch import cotangent_like, differentiable, dispatch_log, resolve, run, varying_axes
from . import epilogue as _epilogue
from .reference import acc_dtype, transposed

__all__ = ["OpStatic", "matmul", "sdd", "dispatch_log", "register_backend", "get_backend"]

# name -> "module:attribute" of a backend object with dsd / dds / sdd methods; loaded lazily.
_BACKEND_PATHS = {
    "xla": "blocksparse.ops.matmul.reference:XlaBackend",
    "pallas": "blocksparse.ops.matmul.pallas_triton:PallasBackend",
    "mosaic": "blocksparse.ops.matmul.pallas_mosaic:MosaicBackend",
}
_BACKENDS: dict[str, object] = {}
_DEFAULT = ("pallas", "xla")
#: Tried before ``_DEFAULT`` (``implementation=None``) for the static products ``W @ x`` their
#: ``prefers(pattern, n, w_dtype, x_dtype, fused=)`` claims, and ``x @ W`` their
#: ``prefers_dds(pattern, m, w_dtype, x_dtype, fused=)`` claims: measured faster there (see ``_default_order``).
_PREFERRED = ("mosaic",)


def _default_order(a, b, fused: bool = False) -> tuple[str, ...]:
    """The implementations ``implementation=None`` means for ``a @ b``.

    ``_DEFAULT``, preceded by each backend of ``_PREFERRED`` whose rule claims the product: a static
    ``W @ x`` (``prefers``, with ``n`` = the columns of ``x``, batch dimensions folded in) or ``x @ W``
    (``prefers_dds``, with ``m`` = the rows of ``x``, batch dimensions folded in), decided at trace
    time from static facts (the device, ``W``'s pattern, the dtypes, the shape, whether an epilogue is
    ``fused``). In the backward each product takes its own rule again (``OpStatic.auto``): the gradient
    w.r.t. ``x`` runs on the transposed pattern, which a rule may judge differently (a pattern with a few
    long rows has no long rows transposed), and the weight gradient is an ``sdd`` with a rule of its own.
    """
    if isinstance(a, BlockSparseMatrix) and not isinstance(b, _SPARSE):
        rule, dense, w, folded = "prefers", b, a, lambda s: 1 if len(s) == 1 else math.prod(s[:-2]) * s[-1]
    elif isinstance(b, BlockSparseMatrix) and not isinstance(a, _SPARSE):
        rule, dense, w, folded = "prefers_dds", a, b, lambda s: math.prod(s[:-1])
    else:
        return _DEFAULT
    try:
        dtype, shape = jnp.result_type(dense), jnp.shape(dense)
    except TypeError:  # not an array: matmul raises the error
        return _DEFAULT
    if len(shape) == 0:
        return _DEFAULT
    return _claimed(rule, w.pattern, folded(shape), w.dtype, dtype, fused)


def _claimed(rule: str, pattern, size: int, w_dtype, x_dtype, fused: bool = False) -> tuple[str, ...]:
    """``_DEFAULT`` preceded by the backends of ``_PREFERRED`` whose ``rule`` claims the product (every rule takes
    ``fused``: whether an epilogue is fused into it)."""
    claims = lambda name: getattr(get_backend(name), rule, lambda *_, **__: False)  # noqa: E731
    return tuple(name for name in _PREFERRED if claims(name)(pattern, size, w_dtype, x_dtype, fused=fused)) + _DEFAULT


def _sdd_order(pattern, a, b) -> tuple[str, ...]:
    """The implementations ``implementation=None`` means for ``sdd(a, b)`` at ``pattern``: ``_DEFAULT``, preceded
    by each backend of ``_PREFERRED`` whose ``prefers_sdd(pattern, K, a_dtype, b_dtype)`` claims it (``K``: the
    contracted dimension)."""
    return _claimed("prefers_sdd", pattern, a.shape[1], a.dtype, b.dtype)


def _grad_sdd(s: OpStatic, a, b):
    """The weight gradient ``sdd(a, b)`` of a static product: on the product's implementations, or, where those
    were the default order (``s.auto``), on the sdd's own default order (its rule differs: the contracted
    dimension is the tokens, not W's)."""
    return _sdd(s.but(impls=_sdd_order(s.pattern, a, b) if s.auto else s.impls), a, b)


def register_backend(name: str, backend) -> None:
    """Register (or replace) a backend object under ``name``."""
    _BACKENDS[name] = backend


def get_backend(name: str):
    if name not in _BACKENDS:
        if name not in _BACKEND_PATHS:
            raise ValueError(f"Expected an implementation in {sorted(_BACKEND_PATHS)}. Got {name!r}.")
        mod, attr = _BACKEND_PATHS[name].split(":")
        _BACKENDS[name] = getattr(importlib.import_module(mod), attr)()
    return _BACKENDS[name]


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
        auto: ``impls`` is the default order (``implementation=None``): the weight gradient's sdd takes its
            own default order rather than the product's, and the products of an sdd's backward theirs.
    """

    impls: tuple[str, ...]
    out_dtype: np.dtype
    precision: lax.Precision | None = None
    pattern: BlockPattern | None = None
    grid: tuple[int, int] | None = None
    transposed: bool = False
    block_size: tuple[int, int] | None = None
    epilogue: _epilogue.Epilogue | None = None
    auto: bool = False

    def but(self, **changes) -> OpStatic:
        return dataclasses.replace(self, **changes)


def _table(op: str):
    return lambda name: getattr(get_backend(name), op)


# --------------------------------------------------------------------------------------------
# Static ops; each backward is made of the other two, on the same implementations: the gradient
# w.r.t. the dense operand runs on the cached transposed pattern, the one w.r.t. the values is
# an sdd laid out like .data.
# --------------------------------------------------------------------------------------------
def _dsd_bwd(s: OpStatic, arrays, _, g):
    data, x = arrays
    t, data_t = transposed(s.pattern, data)
    # Default order (s.auto): W^T @ g takes W @ x's rule for the transposed pattern.
    impls = _claimed("prefers", t, g.shape[1], data.dtype, g.dtype) if s.auto else s.impls
    dx = _dsd(s.but(pattern=t, out_dtype=x.dtype, impls=impls), data_t, g)
    ddata = _grad_sdd(s.but(out_dtype=data.dtype), g, x.T)
    return ddata, dx


def _dds_bwd(s: OpStatic, arrays, _, g):
    x, data = arrays
    t, data_t = transposed(s.pattern, data)
    impls = _claimed("prefers_dds", t, g.shape[0], data.dtype, g.dtype) if s.auto else s.impls
    dx = _dds(s.but(pattern=t, out_dtype=x.dtype, impls=impls), g, data_t)
    ddata = _grad_sdd(s.but(out_dtype=data.dtype), x.T, g)
    return dx, ddata


def _sdd_bwd(s: OpStatic, arrays, _, g):
    a, b = arrays
    # Default order (s.auto): each product takes its own rule (W @ x over n = b.shape[0] columns, x @ W over
    # a.shape[1] rows), not the sdd's.
    da_impls = _claimed("prefers", s.pattern, b.shape[0], g.dtype, b.dtype) if s.auto else s.impls
    db_impls = _claimed("prefers_dds", s.pattern, a.shape[1], g.dtype, a.dtype) if s.auto else s.impls
    da = _dsd(s.but(impls=da_impls, out_dtype=a.dtype), g, b.T)
    db = _dds(s.but(impls=db_impls, out_dtype=b.dtype), a.T, g)
    return da, db


_dsd = differentiable("dsd", _table("dsd"), _dsd_bwd)  # (static, data, x) -> W @ x
_dds = differentiable("dds", _table("dds"), _dds_bwd)  # (static, x, data) -> x @ W
_sdd = differentiable("sdd", _table("sdd"), _sdd_bwd)  # (static, a, b) -> (a @ b) at the pattern


# --------------------------------------------------------------------------------------------
# Dynamic ops: the pattern is traced; ``keep`` masks padding and invalid blocks, and ``valid``
# (a traced bool) says whether the whole matrix is valid: if not, the result is NaN. The Pallas
# backend builds its work list inside jit (lowering.redistribute); the transposed product needs
# no cached transpose, the redistributor sorts by the other coordinate.
# --------------------------------------------------------------------------------------------
def _dyn_dsd_bwd(s: OpStatic, arrays, _, g):
    rows, cols, keep, valid, data, x = arrays
    t = s.but(grid=s.grid[::-1], transposed=not s.transposed, out_dtype=x.dtype)
    dx = _dyn_dsd(t, cols, rows, keep, valid, data, g)
    sdd = s.but(block_size=data.shape[1:], out_dtype=data.dtype, transposed=False)
    if s.transposed:  # data[i] is the transposed block: its gradient is x[col i] @ g[row i]^T
        ddata = _dyn_sdd(sdd, cols, rows, keep, valid, x, g.T)
    else:
        ddata = _dyn_sdd(sdd, rows, cols, keep, valid, g, x.T)
    return None, None, None, None, ddata, dx


def _dyn_sdd_bwd(s: OpStatic, arrays, _, g):
    rows, cols, keep, valid, a, b = arrays
    bh, bw = s.block_size
    grid = (a.shape[0] // bh, b.shape[1] // bw)
    da = _dyn_dsd(s.but(grid=grid, out_dtype=a.dtype), rows, cols, keep, valid, g, b.T)
    db = _dyn_dsd(s.but(grid=grid[::-1], transposed=True, out_dtype=b.dtype), cols, rows, keep, valid, g, a).T
    return None, None, None, None, da, db


_dyn_dsd = differentiable("dyn_dsd", _table("dyn_dsd"), _dyn_dsd_bwd)  # (static, rows, cols, keep, valid, data, x)
_dyn_sdd = differentiable("dyn_sdd", _table("dyn_sdd"), _dyn_sdd_bwd)  # (static, rows, cols, keep, valid, a, b)


def _keep_and_validity(D: DynamicBlockSparseMatrix):
    gm, gk = D.grid
    valid = D.validity()
    keep = D.active() & (D.rows >= 0) & (D.rows < gm) & (D.cols >= 0) & (D.cols < gk)
    return keep, valid


@jax.custom_vjp
def _nan_grad(valid, x):
    """``x`` itself; its cotangent is NaN where the dynamic input is invalid.

    The dynamic ops return NaN for an invalid matrix (every backend poisons its own output, the
    kernels in the same pass). Their gradients must be NaN too: a plain zero would let a training
    step silently learn nothing. Applied to the output and to the dense operands (an invalid
    matrix whose blocks are all dropped would otherwise give them finite zero gradients).
    """
    return x


def _nan_grad_fwd(valid, x):
    return x, (valid, x)


def _nan_grad_bwd(res, g):
    valid, x = res
    # Inside shard_map, ``valid`` may vary over devices where ``x`` (and its summed cotangent ``g``)
    # is replicated: the gradient of a replicated operand is NaN if any device's matrix is invalid.
    if extra := tuple(sorted(varying_axes(valid) - varying_axes(x), key=str)):
        valid = jax.lax.pmin(valid.astype(jnp.int32), extra) > 0
    return None, cotangent_like(jnp.where(valid, g, jnp.asarray(jnp.nan, g.dtype)), x)


_nan_grad.defvjp(_nan_grad_fwd, _nan_grad_bwd)


# --------------------------------------------------------------------------------------------
# Fused epilogue: ``activation(product + bias)`` in float32, then the cast, in the kernel's store.
# Backends implement ``<kind>_fused(static, *ints, *floats, bias)``. Under differentiation the
# forward runs the plain product (with its own VJP) in float32 and the epilogue in XLA, keeping
# the pre-activation for the backward, as dense code does; only the primal uses the fused kernel.
# --------------------------------------------------------------------------------------------
_NUM_INTS = {"dsd": 0, "dds": 0, "dyn_dsd": 4}  # rows, cols, keep, valid


def _plain(kind: str, s: OpStatic, ints, floats):
    if kind == "dsd":
        return _dsd(s, *floats)
    if kind == "dds":
        return _dds(s, *floats)
    return _dyn_dsd(s, *ints, *floats)


def _fused_table(kind: str):
    def table(name: str):
        fn = getattr(get_backend(name), f"{kind}_fused", None)
        if fn is None:  # a registered backend without the fused ops: the next implementation runs

            def refuse(*_):
                raise NotImplementedError(f"the backend has no {kind}_fused method (no fused epilogue)")

            return refuse
        return fn

    return table


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _fused(kind: str, s: OpStatic, ints, floats, bias):
    return run(f"{kind}+epilogue", s.impls, _fused_table(kind), s, *ints, *floats, bias)


def _fused_fwd(kind, s, ints, floats, bias):
    plain = s.but(out_dtype=acc_dtype(*(f.dtype for f in floats)), epilogue=None)
    z, product_vjp = jax.vjp(lambda *f: _plain(kind, plain, ints, f), *floats)
    if bias is None:
        y, act_vjp = jax.vjp(lambda z: _epilogue.reference(z, None, s.epilogue, plain.out_dtype), z)
    else:
        y, act_vjp = jax.vjp(lambda z, b: _epilogue.reference(z, b, s.epilogue, plain.out_dtype), z, bias)
    return y.astype(s.out_dtype), (product_vjp, act_vjp, bias)


def _fused_bwd(kind, s, res, g):
    product_vjp, act_vjp, bias = res
    cts = act_vjp(g.astype(acc_dtype(g.dtype)))
    dfloats = product_vjp(cts[0])
    dbias = None if bias is None else cotangent_like(cts[1].astype(bias.dtype), bias)
    return (None,) * _NUM_INTS[kind], dfloats, dbias


_fused.defvjp(_fused_fwd, _fused_bwd)


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


def matmul(
    a, b, *, bias=None, activation=None, implementation=None, precision=None, preferred_element_type=None
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
            ``"gelu_tanh"``, ``"silu"``, ``"tanh"`` or ``"sigmoid"``. Bias, activation and the cast to
            the output dtype run on the float32 accumulator inside the kernel (one store of the
            output, no extra pass over it); the gradients are those of the unfused expression.
        implementation: ``None`` (fastest available, falling back to pure JAX), ``"pallas"``
            (Triton), ``"mosaic"`` (the Hopper kernel for a static ``W @ x``; first by default on a
            Hopper GPU where it measured faster), ``"xla"``, or a sequence tried in order.
        precision: as for ``jnp.dot``: ``None`` (``jax.default_matmul_precision`` if set, else the
            backend default: TF32 tensor-core dots for float32 on a GPU), a ``jax.lax.Precision``
            or its name. ``"highest"`` gives float32 accuracy for float32 inputs on every backend.
        preferred_element_type: output dtype (floating); by default JAX's promotion of the two
            dtypes. Half-precision inputs always accumulate in float32.

    Returns:
        The dense product. Differentiable w.r.t. the dense operand and the sparse ``.data``;
        works under ``jit``, ``grad`` and ``vmap``. For a dynamic matrix with invalid
        coordinates the result and its gradients are NaN (see
        :meth:`~blocksparse.DynamicBlockSparseMatrix.is_valid`).
    """
    activation = _epilogue.check_activation(activation)
    fused = bias is not None or activation is not None
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
            return _epilogue.apply(y, b1, activation).astype(out.dtype)
    impls = resolve(implementation, _DEFAULT if implementation is not None else _default_order(a, b, fused))
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
        s = OpStatic(impls, result_dtype(preferred_element_type, W.dtype, x.dtype), prec, auto=implementation is None)
        if not fused:
            return apply_2d(W.shape, x, lambda x2: _sparse_dense(W, x2, s), sparse_first=True)
        if x.ndim == 1:  # (m,) output: the bias runs along the rows of the (m, 1) product
            b1 = _bias(bias, (W.shape[0],))
            s = s.but(epilogue=_epilogue.Epilogue(activation, b1 is not None, 0))
            return apply_2d(W.shape, x, lambda x2: _sparse_dense(W, x2, s, b1), sparse_first=True)
        b1 = _bias(bias, x.shape[-1:])
        s = s.but(epilogue=_epilogue.Epilogue(activation, b1 is not None, 1))
        # Batch dimensions are folded into the columns: the bias repeats once per batch element.
        tile = lambda x2: None if b1 is None else jnp.tile(b1, math.prod(x.shape[:-2]))  # noqa: E731
        return apply_2d(W.shape, x, lambda x2: _sparse_dense(W, x2, s, tile(x2)), sparse_first=True)
    x, W = _dense(a, "dense operand"), b
    s = OpStatic(impls, result_dtype(preferred_element_type, W.dtype, x.dtype), prec, auto=implementation is None)
    if not fused:
        return apply_2d(W.shape, x, lambda x2: _dense_sparse(x2, W, s), sparse_first=False)
    b1 = _bias(bias, (W.shape[1],))
    s = s.but(epilogue=_epilogue.Epilogue(activation, b1 is not None, 1))
    return apply_2d(W.shape, x, lambda x2: _dense_sparse(x2, W, s, b1), sparse_first=False)


def _bias(bias, shape: tuple[int, ...]):
    if bias is None:
        return None
    bias = _dense(bias, "bias")
    if tuple(bias.shape) != tuple(shape):
        raise ValueError(f"Expected a bias of shape {tuple(shape)} (the output's last dimension). Got {bias.shape}.")
    return bias


def apply_2d(shape: tuple[int, int], x, product, *, sparse_first: bool):
    """Check ``x`` against a sparse operand of ``shape`` and run ``product`` on its 2-D form.

    ``sparse_first``: ``W (m, k) @ x`` with ``x`` of shape ``(k,)`` or ``(..., k, n)``, batch
    dimensions folded into the columns: ``product`` gets ``(k, B * n)`` and returns ``(m, B * n)``.
    Else ``x @ W`` with ``x`` of shape ``(..., m)``: ``product`` gets ``(B, m)``, returns ``(B, k)``.
    Shared by every kind of sparse operand (static, dynamic, sharded over a mesh).
    """
    m, k = shape
    if not sparse_first:
        if x.ndim == 0 or x.shape[-1] != m:
            raise ValueError(
                f"Expected the dense operand's last dimension to be {m} (W is {shape}). Got shape {x.shape}."
            )
        return product(x.reshape(math.prod(x.shape[:-1]), m)).reshape(*x.shape[:-1], k)
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
        if s.epilogue is not None:
            return _fused("dsd", s.but(pattern=W.pattern), (), (W.data, x), bias)
        return _dsd(s.but(pattern=W.pattern), W.data, x)
    return _dynamic_product(W, x, s, transposed=False, bias=bias)


def _dense_sparse(x, W, s: OpStatic, bias=None):
    if isinstance(W, BlockSparseMatrix):
        if s.epilogue is not None:
            return _fused("dds", s.but(pattern=W.pattern), (), (x, W.data), bias)
        return _dds(s.but(pattern=W.pattern), x, W.data)
    # x @ W = (W^T @ x^T)^T, on W's own data (no transposed copy of the blocks); the bias then
    # runs along the rows of the transposed product.
    if s.epilogue is not None:
        s = s.but(epilogue=dataclasses.replace(s.epilogue, bias_axis=0))
    return _dynamic_product(W, x.T, s, transposed=True, bias=bias).T


def _dynamic_product(W: DynamicBlockSparseMatrix, x, s: OpStatic, transposed: bool, bias=None):
    """``W @ x`` (or ``W^T @ x``) for a dynamic ``W``: NaN, with NaN gradients, if ``W`` is invalid.

    The default order is Pallas first at every size: the scan kernel needs no plan built on the
    device, and measured at 1.06-1.19x the static kernel's time at n = 256 and 4096 on the H200,
    below dense ``jnp.dot`` (docs/benchmarks.md).
    """
    keep, valid = _keep_and_validity(W)
    data, x = _nan_grad(valid, W.data), _nan_grad(valid, x)
    rows, cols, grid = (W.cols, W.rows, W.grid[::-1]) if transposed else (W.rows, W.cols, W.grid)
    s = s.but(grid=grid, transposed=transposed)
    if s.epilogue is not None:
        return _nan_grad(valid, _fused("dyn_dsd", s, (rows, cols, keep, valid), (data, x), bias))
    return _nan_grad(valid, _dyn_dsd(s, rows, cols, keep, valid, data, x))


def sdd(a, b, like, *, implementation=None, precision=None, preferred_element_type=None):
    """``a (m, n) @ b (n, k)`` computed only at the blocks of ``like``; returns a matrix like ``like``.

    This is the gradient of a block-sparse product w.r.t. its values (SDDMM). The result has
    ``like``'s pattern (static) or coordinates and ``nnz`` (dynamic); padding blocks are zero.
    ``implementation``, ``precision`` and ``preferred_element_type`` are as for :func:`matmul`.
    """
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
    default = _sdd_order(like.pattern, a, b) if static and implementation is None else _DEFAULT
    s = OpStatic(resolve(implementation, default), result_dtype(preferred_element_type, a.dtype, b.dtype),
                 canonical_precision(precision), auto=static and implementation is None)  # fmt: skip
    if static:
        return like._replace(data=_sdd(s.but(pattern=like.pattern), a, b))
    keep, valid = _keep_and_validity(like)
    a, b = _nan_grad(valid, a), _nan_grad(valid, b)
    data = _nan_grad(valid, _dyn_sdd(s.but(block_size=like.block_size), like.rows, like.cols, keep, valid, a, b))
    return like._replace(data=data)
