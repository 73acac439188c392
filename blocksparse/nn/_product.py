"""The layers' product ``activation(x @ W + b)`` as one JAX primitive, so that ``vmap`` folds into one product.

Equinox applies a layer to one example and lets the user ``jax.vmap`` it. Under ``vmap`` a
``custom_vjp`` product batches its kernel call instead: one tiny product per example (a Pallas grid
over the examples, each block padded from one row to a tile), and ``grad(vmap(f))`` computes one
weight gradient per example before summing them. Like ``lax.dot_general``, this primitive has its
own batching rule (a batched input only adds leading dimensions, which the product folds into its
rows), a JVP and transposes: whichever order ``vmap`` and ``grad`` come in, the forward is one
product and the weight gradient one ``sdd`` over the whole batch (per-example gradients,
``vmap(grad(f))``, need one ``sdd`` per example by definition).

The primitive runs :func:`blocksparse.matmul` with its fused epilogue (lowered with
``mlir.lower_fun``, so the usual implementation choice, Pallas or XLA, applies). Under
differentiation the product runs with the bias fused and a float32 output, and the activation
follows it (its backward needs that pre-activation). Weights that vary along the mapped axis (a stack
of layers) fall back to ``vmap`` of the differentiable product.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from .._matrix import BlockSparseMatrix
from ..ops import varying_axes
from ..ops.matmul import epilogue as _epilogue
from ..ops.matmul.api import matmul, sdd
from ..ops.matmul.reference import acc_dtype as _acc_dtype
from ..ops.matmul.reference import transposed

__all__ = ["sparse_linear"]


def _apply_activation(activation, z, out_dtype):
    """``activation(z)`` in float32 (bs.matmul's epilogue), cast to ``out_dtype``."""
    return (z if activation is None else _epilogue.apply(z, None, activation)).astype(out_dtype)


def _matrix(pattern, data) -> BlockSparseMatrix:
    return BlockSparseMatrix._from_fields(pattern=pattern, data=data)


def _compute(x, data, *bias, pattern, activation, implementation, out_dtype):
    return matmul(x, _matrix(pattern, data), bias=bias[0] if bias else None, activation=activation,
                  implementation=implementation, preferred_element_type=out_dtype)  # fmt: skip


_p = Primitive("bs_sparse_linear")
_p.def_impl(_compute)
mlir.register_lowering(_p, mlir.lower_fun(_compute, multiple_results=False))


def _result_dtype(x_dtype, data_dtype, out_dtype):
    return jnp.dtype(jnp.result_type(x_dtype, data_dtype) if out_dtype is None else out_dtype)


@_p.def_abstract_eval
def _abstract(x, data, *bias, pattern, activation, implementation, out_dtype):
    del activation, implementation
    # x's axis types (inside shard_map, _bind gave every operand the same ones).
    return x.update(shape=(*x.shape[:-1], pattern.shape[1]), dtype=_result_dtype(x.dtype, data.dtype, out_dtype),
                    weak_type=False)  # fmt: skip


def _bind(*args, **params):
    """Bind the primitive; inside ``shard_map`` every operand is first made varying over the same axes
    (as JAX's own ops do: the transpose of that cast sums a replicated weight's gradient)."""
    axes = frozenset().union(*(varying_axes(a) for a in args))
    cast = lambda a, extra: jax.lax.pcast(a, tuple(sorted(extra, key=str)), to="varying") if extra else a
    args = [cast(a, axes - varying_axes(a)) for a in args]
    return _p.bind(*args, **params)


def _batch(args, dims, **params):
    x, data, *bias = args
    dx, ddata, *dbias = dims
    if ddata is None and all(d is None for d in dbias):
        # Only the input is mapped: its mapped axis becomes a leading dimension, folded into the rows.
        return _bind(jnp.moveaxis(x, dx, 0), data, *bias, **params), 0
    # Weights mapped too (a stack of layers): one product per layer, as this primitive (a loop over
    # the layers), so its own JVP and transposes still apply (forward and reverse mode alike).
    mapped = [i for i, d in enumerate(dims) if d is not None]

    def one(sliced):
        full = list(args)
        for i, a in zip(mapped, sliced, strict=True):
            full[i] = a
        return _bind(*full, **params)

    return jax.lax.map(one, tuple(jnp.moveaxis(args[i], dims[i], 0) for i in mapped)), 0


batching.primitive_batchers[_p] = _batch


def _jvp(primals, tangents, *, pattern, activation, implementation, out_dtype):
    x, data, *bias = primals
    tx, tdata, *tbias = tangents
    out = _result_dtype(x.dtype, data.dtype, out_dtype)
    # The pre-activation z in float32 for half types (the bias fused), then the activation and the
    # cast, as the fused epilogue computes them; z is what the backward of the activation needs.
    acc = _acc_dtype(out)
    lin = dict(pattern=pattern, activation=None, implementation=implementation, out_dtype=acc)
    z = _bind(x, data, *bias, **lin)
    terms = []
    if type(tx) is not ad.Zero:
        terms.append(_bind(tx, data, **lin))
    if type(tdata) is not ad.Zero:
        terms.append(_bind(x, tdata, **lin))
    if tbias and type(tbias[0]) is not ad.Zero:
        terms.append(jnp.broadcast_to(tbias[0].astype(acc), z.shape))
    tz = functools.reduce(jnp.add, terms) if terms else jnp.zeros(z.shape, acc)
    return jax.jvp(functools.partial(_apply_activation, activation, out_dtype=out), (z,), (tz,))


ad.primitive_jvps[_p] = _jvp


def _transpose(ct, x, data, *bias, pattern, activation, implementation, out_dtype):
    # Only the tangent form appears in linear programs: no bias, no activation, one linear operand.
    assert activation is None and not bias
    del out_dtype
    if type(ct) is ad.Zero:
        return None, None
    if ad.is_undefined_primal(x):  # ct (..., out) @ W^T
        t, data_t = transposed(pattern, data)
        ct_x = _bind(ct, data_t, pattern=t, activation=None, implementation=implementation, out_dtype=x.aval.dtype)
        return ct_x, None
    # W's gradient: x^T @ ct at W's blocks, every leading dimension contracted.
    x2 = x.reshape(-1, x.shape[-1])
    ct2 = ct.reshape(-1, ct.shape[-1])
    like = _matrix(pattern, None)
    ct_data = sdd(x2.T, ct2, like, implementation=implementation, preferred_element_type=data.aval.dtype).data
    return None, ct_data


ad.primitive_transposes[_p] = _transpose


def sparse_linear(x, weight: BlockSparseMatrix, bias=None, activation: str | None = None, implementation=None):
    """``activation(x @ weight + bias)`` for ``x (..., in)`` and a static ``weight (in, out)``."""
    if isinstance(implementation, list):
        implementation = tuple(implementation)
    x = jnp.asarray(x)
    n_in = weight.shape[0]
    if x.ndim == 0 or x.shape[-1] != n_in:
        raise ValueError(
            f"Expected the dense operand's last dimension to be {n_in} (W is {weight.shape}). Got shape {x.shape}."
        )
    args = (x, weight.data) if bias is None else (x, weight.data, jnp.asarray(bias))
    return _bind(*args, pattern=weight.pattern, activation=activation, implementation=implementation, out_dtype=None)
