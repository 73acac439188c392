"""The custom VJPs of the block-sparse products: one ``custom_vjp`` op per product, its backward made of the others.

Three static ops, named by operand format (STK / MegaBlocks convention):

- :data:`dsd`: dense = sparse ``W (m, k)`` @ dense ``x (k, n)``;
- :data:`dds`: dense = dense ``x (B, m)`` @ sparse ``W (m, k)``;
- :data:`sdd`: sparse = dense ``a (m, n)`` @ dense ``b (n, k)`` sampled at a pattern.

Each has one ``custom_vjp`` whose backward is made of the other two, on the same list of implementations: the
gradient w.r.t. the dense operand runs on the cached transposed pattern, the gradient w.r.t. the values is an
``sdd`` laid out like ``.data``. Where the forward ran the default order (``OpStatic.auto``), each product of
the backward takes its own default order again (:func:`.order.default`). A config (``OpStatic.config``) applies
to the forward product only: the backward's products take their defaults.

Dynamic matrices have the twins :data:`dyn_dsd` and :data:`dyn_sdd` (``dds`` is ``dsd`` on the swapped
coordinates): the Pallas backend builds its work list inside ``jit`` with :func:`.schedule.redistribute`, so
the transposed product needs no cached transpose. :func:`nan_grad` makes the gradients of an invalid dynamic
matrix NaN, :data:`fused` is the fused-epilogue op and :func:`input_glu` the op whose dense operand is gated first
(an :class:`~.epilogue.InputGate`).

Every op takes an ``OpStatic`` (:class:`.api.OpStatic`) first; backends receive it too.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from .._dispatch import cotangent_like, differentiable, run, varying_axes
from . import epilogue as _epilogue
from . import order
from .reference import acc_dtype, transposed
from .registry import get_backend

__all__ = ["dds", "dsd", "dyn_dsd", "dyn_sdd", "fused", "input_glu", "nan_grad", "sdd"]


def _table(op: str):
    return lambda name: getattr(get_backend(name), op)


# --------------------------------------------------------------------------------------------
# Static ops; each backward is made of the other two, on the same implementations: the gradient
# w.r.t. the dense operand runs on the cached transposed pattern, the one w.r.t. the values is
# an sdd laid out like .data.
# --------------------------------------------------------------------------------------------
def _grad_sdd(s, a, b):
    """The weight gradient ``sdd(a, b)`` of a static product: on the product's implementations, or, where those
    were the default order (``s.auto``), on the sdd's own default order (its rule differs: the contracted
    dimension is the tokens, not W's)."""
    impls = order.default("sdd", s.pattern, a.shape[1], a.dtype, b.dtype) if s.auto else s.impls
    return sdd(s.but(impls=impls), a, b)


def _backward(s):
    """The static of a backward's products: the forward's config applies to the forward only."""
    return s.but(config=None)


def _dsd_bwd(s, arrays, _, g):
    data, x = arrays
    s = _backward(s)
    t, data_t = transposed(s.pattern, data)
    # Default order (s.auto): W^T @ g takes W @ x's rule for the transposed pattern.
    impls = order.default("dsd", t, g.shape[1], data.dtype, g.dtype) if s.auto else s.impls
    dx = dsd(s.but(pattern=t, out_dtype=x.dtype, impls=impls), data_t, g)
    ddata = _grad_sdd(s.but(out_dtype=data.dtype), g, x.T)
    return ddata, dx


def _dds_bwd(s, arrays, _, g):
    x, data = arrays
    s = _backward(s)
    t, data_t = transposed(s.pattern, data)
    impls = order.default("dds", t, g.shape[0], data.dtype, g.dtype) if s.auto else s.impls
    dx = dds(s.but(pattern=t, out_dtype=x.dtype, impls=impls), g, data_t)
    ddata = _grad_sdd(s.but(out_dtype=data.dtype), x.T, g)
    return dx, ddata


def _sdd_bwd(s, arrays, _, g):
    a, b = arrays
    s = _backward(s)
    # Default order (s.auto): each product takes its own rule (W @ x over n = b.shape[0] columns, x @ W over
    # a.shape[1] rows), not the sdd's.
    da_impls = order.default("dsd", s.pattern, b.shape[0], g.dtype, b.dtype) if s.auto else s.impls
    db_impls = order.default("dds", s.pattern, a.shape[1], g.dtype, a.dtype) if s.auto else s.impls
    da = dsd(s.but(impls=da_impls, out_dtype=a.dtype), g, b.T)
    db = dds(s.but(impls=db_impls, out_dtype=b.dtype), a.T, g)
    return da, db


dsd = differentiable("dsd", _table("dsd"), _dsd_bwd)  # (static, data, x) -> W @ x
dds = differentiable("dds", _table("dds"), _dds_bwd)  # (static, x, data) -> x @ W
sdd = differentiable("sdd", _table("sdd"), _sdd_bwd)  # (static, a, b) -> (a @ b) at the pattern


# --------------------------------------------------------------------------------------------
# Dynamic ops: the pattern is traced; ``keep`` masks padding and invalid blocks, and ``valid``
# (a traced bool) says whether the whole matrix is valid: if not, the result is NaN. The Pallas
# backend builds its work list inside jit (schedule.redistribute); the transposed product needs
# no cached transpose, the redistributor sorts by the other coordinate.
# --------------------------------------------------------------------------------------------
def _dynamic_backward(s):
    """A dynamic op's backward static: no config, and the default order where the forward's was (``s.auto``)."""
    return s.but(config=None, impls=order.DEFAULT) if s.auto else s.but(config=None)


def _dyn_dsd_bwd(s, arrays, _, g):
    rows, cols, keep, valid, data, x = arrays
    s = _dynamic_backward(s)
    t = s.but(grid=s.grid[::-1], transposed=not s.transposed, out_dtype=x.dtype)
    dx = dyn_dsd(t, cols, rows, keep, valid, data, g)
    sampled = s.but(block_size=data.shape[1:], out_dtype=data.dtype, transposed=False)
    if s.transposed:  # data[i] is the transposed block: its gradient is x[col i] @ g[row i]^T
        ddata = dyn_sdd(sampled, cols, rows, keep, valid, x, g.T)
    else:
        ddata = dyn_sdd(sampled, rows, cols, keep, valid, g, x.T)
    return None, None, None, None, ddata, dx


def _dyn_sdd_bwd(s, arrays, _, g):
    rows, cols, keep, valid, a, b = arrays
    s = _dynamic_backward(s)
    bh, bw = s.block_size
    grid = (a.shape[0] // bh, b.shape[1] // bw)
    da = dyn_dsd(s.but(grid=grid, out_dtype=a.dtype), rows, cols, keep, valid, g, b.T)
    db = dyn_dsd(s.but(grid=grid[::-1], transposed=True, out_dtype=b.dtype), cols, rows, keep, valid, g, a).T
    return None, None, None, None, da, db


dyn_dsd = differentiable("dyn_dsd", _table("dyn_dsd"), _dyn_dsd_bwd)  # (static, rows, cols, keep, valid, data, x)
dyn_sdd = differentiable("dyn_sdd", _table("dyn_sdd"), _dyn_sdd_bwd)  # (static, rows, cols, keep, valid, a, b)


@jax.custom_vjp
def nan_grad(valid, x):
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


nan_grad.defvjp(_nan_grad_fwd, _nan_grad_bwd)


# --------------------------------------------------------------------------------------------
# Fused epilogue: ``activation(product + bias)`` in float32 (or gated: ``activation(a) * b`` of its two halves),
# then the cast, in the kernel's store.
# Backends implement ``<kind>_fused(static, *ints, *floats, bias)``. Under differentiation the
# forward runs the plain product (with its own VJP) in float32 and the epilogue in XLA, keeping
# the pre-activation for the backward, as dense code does; only the primal uses the fused kernel.
# --------------------------------------------------------------------------------------------
_NUM_INTS = {"dsd": 0, "dds": 0, "dyn_dsd": 4}  # rows, cols, keep, valid


def _plain(kind: str, s, ints, floats):
    if kind == "dsd":
        return dsd(s, *floats)
    if kind == "dds":
        return dds(s, *floats)
    return dyn_dsd(s, *ints, *floats)


def _fused_table(kind: str):
    def table(name: str):
        backend = get_backend(name)
        fn = getattr(backend, f"{kind}_fused", None)
        if fn is None:  # a registered backend without the fused ops: the next implementation runs

            def refuse(*_):
                raise NotImplementedError(f"the backend has no {kind}_fused method (no fused epilogue)")

            return refuse
        # A gated epilogue runs where the backend has a ``<kind>_glu`` method; elsewhere its fused op adds the bias,
        # and the gate follows in XLA.
        glu = getattr(backend, f"{kind}_glu", None) or functools.partial(_epilogue.gate_after, fn)
        return lambda s, *args: (glu if s.epilogue.glu else fn)(s, *args)

    return table


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def fused(kind: str, s, ints, floats, bias):
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


fused.defvjp(_fused_fwd, _fused_bwd)


# --------------------------------------------------------------------------------------------
# Gated input: ``x``'s contracted dimension holds a GLU's two halves and the product runs on
# ``activation(a) * b`` (``s.input_gate``), with or without an epilogue. Backends implement
# ``<kind>_input_glu(static, *floats, bias)`` to gate where their kernel loads ``x``; elsewhere the gate runs in
# XLA first and the backend's product follows. Under differentiation the forward is that unfused expression
# (the gate's VJP, then the product's), as for the fused epilogue.
# --------------------------------------------------------------------------------------------
_DENSE = {"dsd": (1, 0), "dds": (0, 1)}  # kind -> (x's index among the floats, its contracted axis)


def _input_glu_table(kind: str):
    i, axis = _DENSE[kind]

    def table(name: str):
        backend = get_backend(name)
        own = getattr(backend, f"{kind}_input_glu", None)
        if own is not None:  # own(static, *floats, bias)
            return own

        def product(s, *args):  # this backend's product of the gated operand (args: floats, bias)
            if s.epilogue is None:
                return getattr(backend, kind)(s, *args[:-1])
            return _fused_table(kind)(name)(s, *args)

        return lambda s, *args: _epilogue.gate_first(product, s, i, axis, *args)

    return table


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def input_glu(kind: str, s, floats, bias):
    """``kind`` (``"dsd"``: ``W @ x``, ``"dds"``: ``x @ W``) on ``floats`` with ``x`` gated by ``s.input_gate``, then
    ``s.epilogue`` where set (``bias``: its bias or ``None``)."""
    return run(f"{kind}+input_glu", s.impls, _input_glu_table(kind), s, *floats, bias)


def _input_glu_fwd(kind, s, floats, bias):
    i, axis = _DENSE[kind]

    def product(s, *args):  # the differentiable product of the gated operand, plain or fused
        *floats, bias = args
        return _plain(kind, s, (), floats) if s.epilogue is None else fused(kind, s, (), tuple(floats), bias)

    # The gate in XLA, then the product: both differentiated.
    return jax.vjp(lambda floats, bias: _epilogue.gate_first(product, s, i, axis, *floats, bias), floats, bias)


def _input_glu_bwd(kind, s, back, g):
    return back(g)


input_glu.defvjp(_input_glu_fwd, _input_glu_bwd)
