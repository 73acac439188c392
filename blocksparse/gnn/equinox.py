"""Equinox modules: ``bs.gnn.equinox.GCNConv``, ``GATv2Conv``, ``TransformerConv``.

The layers of :mod:`blocksparse.gnn.layers` (PyG's arguments, semantics and parameter names) as
``eqx.Module``: each weight is an array field under the plain layer's name (``weight``,
``lin_l_weight``, ...; ``None`` where the layer has none), the configuration static fields, and a
call builds the plain layer from the fields and runs it: one implementation of the message
passing. Construction takes a keyword-only ``key``; attention dropout follows ``eqx.nn.Dropout``:
an ``inference`` field (toggled by ``eqx.nn.inference_mode``, or ``inference=`` at the call) and
``key=`` at the call. A layer is applied to a whole graph, ``x (N, in)``, not mapped over nodes.

Imported on first use of ``bs.gnn.equinox``; needs ``pip install 'blocksparse[equinox]'``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

try:
    import equinox as eqx
except ImportError as e:  # ModuleNotFoundError carries the package's name, as a missing import would
    raise ModuleNotFoundError("bs.gnn.equinox needs Equinox: pip install 'blocksparse[equinox]'", name="equinox") from e

from . import layers as _layers

__all__ = ["GATv2Conv", "GCNConv", "TransformerConv"]

_Impl = str | tuple[str, ...] | None


class _Conv(eqx.Module):
    """Array fields under the plain layer's leaf names, its static fields as static fields."""

    def _set(self, layer, **extra):
        for name in (*layer._leaves, *layer._static):
            setattr(self, name, getattr(layer, name))
        for name, value in extra.items():
            setattr(self, name, value)

    @classmethod
    def _wrap(cls, layer, **extra):
        # An instance with these fields, without drawing random values first (as bs.nn.equinox does).
        plain = cls._plain()
        if type(layer) is not plain:
            raise TypeError(
                f"{cls.__name__}.from_plain: expected a blocksparse.gnn.layers.{plain.__name__}. "
                f"Got {type(layer).__name__}."
            )
        self = object.__new__(cls)
        for name, value in {**{n: getattr(layer, n) for n in (*plain._leaves, *plain._static)}, **extra}.items():
            object.__setattr__(self, name, value)
        return self

    def to_plain(self):
        """The plain :mod:`blocksparse.gnn.layers` layer holding these values."""
        plain = self._plain()
        return plain._from_fields(**{n: getattr(self, n) for n in (*plain._leaves, *plain._static)})

    @property
    def in_channels(self):
        return self.to_plain().in_channels

    def _dropout(self, key, inference):
        """``(key, deterministic)`` for the plain layer, resolved as ``eqx.nn.Dropout`` does."""
        inference = self.inference if inference is None else inference
        if inference or self.dropout == 0.0:
            return None, True
        if key is None:
            raise ValueError(
                f"{type(self).__name__}: dropout={self.dropout} in training mode (inference=False) needs key=. "
                "Got key=None (for inference: eqx.nn.inference_mode(model) or inference=True)."
            )
        return key, False


class _AttentionConv(_Conv):
    """What GATv2Conv and TransformerConv share: conversion and the call with Dropout's arguments."""

    @classmethod
    def from_plain(cls, layer, *, inference: bool = False):
        """The module holding a plain layer's parameters and configuration (e.g. one loaded from PyG)."""
        return cls._wrap(layer, inference=inference)

    def __call__(
        self, x, edge_index, edge_attr=None, *, num_nodes=None, num_edges=None, key=None, inference=None
    ) -> jax.Array:
        """As the plain layer's ``__call__``, with ``eqx.nn.Dropout``'s ``key`` / ``inference``."""
        key, deterministic = self._dropout(key, inference)
        return self.to_plain()(
            x, edge_index, edge_attr=edge_attr, num_nodes=num_nodes, num_edges=num_edges, key=key,
            deterministic=deterministic,
        )  # fmt: skip


class GCNConv(_Conv):
    """Graph convolution as PyG's ``GCNConv``: :class:`blocksparse.gnn.layers.GCNConv` as an Equinox module.

    Arguments are those of :meth:`blocksparse.gnn.layers.GCNConv.init` (PyG's), and:
        dtype: the parameters' dtype (default float32).
        implementation: passed to :func:`~blocksparse.gnn.spmm`.
        key: a PRNG key (keyword only).

    Fields ``weight (out_channels, in_channels)`` (PyG's ``lin.weight``) and ``bias``. Called as the
    plain layer, ``conv(x, edge_index, *, edge_weight=None, num_nodes=None, num_edges=None,
    key=None)`` (``key`` ignored: Equinox's convention for deterministic layers).

    Example::

        >>> import jax, jax.numpy as jnp, blocksparse as bs
        >>> conv = bs.gnn.equinox.GCNConv(4, 8, key=jax.random.key(0))
        >>> conv(jnp.ones((3, 4)), jnp.array([[0, 1], [1, 2]])).shape
        (3, 8)
    """

    weight: jax.Array
    bias: jax.Array | None
    improved: bool = eqx.field(static=True)
    add_self_loops: bool = eqx.field(static=True)
    normalize: bool = eqx.field(static=True)
    implementation: _Impl = eqx.field(static=True)

    def __init__(
        self, in_channels: int, out_channels: int, *, improved: bool = False, add_self_loops: bool | None = None,
        normalize: bool = True, bias: bool = True, dtype=None, implementation=None, key,
    ):  # fmt: skip
        dtype = jnp.float32 if dtype is None else dtype
        self._set(_layers.GCNConv.init(
            key, in_channels, out_channels, improved=improved, add_self_loops=add_self_loops, normalize=normalize,
            bias=bias, dtype=dtype, implementation=implementation,
        ))  # fmt: skip

    @staticmethod
    def _plain():
        return _layers.GCNConv

    @classmethod
    def from_plain(cls, layer: _layers.GCNConv) -> GCNConv:
        """The module holding a plain layer's parameters and configuration (e.g. one loaded from PyG)."""
        return cls._wrap(layer)

    @property
    def out_channels(self) -> int:
        return self.weight.shape[0]

    def __call__(self, x, edge_index, edge_weight=None, *, num_nodes=None, num_edges=None, key=None) -> jax.Array:
        """As :meth:`blocksparse.gnn.layers.GCNConv.__call__`; ``key`` is ignored."""
        del key
        return self.to_plain()(x, edge_index, edge_weight=edge_weight, num_nodes=num_nodes, num_edges=num_edges)


class GATv2Conv(_AttentionConv):
    """GATv2 attention as PyG's ``GATv2Conv``: :class:`blocksparse.gnn.layers.GATv2Conv` as an Equinox module.

    Arguments are those of :meth:`blocksparse.gnn.layers.GATv2Conv.init` (PyG's), and:
        dtype: the parameters' dtype (default float32).
        inference: ``True``: no attention dropout (``eqx.nn.inference_mode`` sets it); ``False``
            (default): dropout, which needs ``key=`` at the call.
        implementation: passed to :func:`~blocksparse.gnn.gatv2`.
        key: a PRNG key (keyword only).

    Array fields under the plain layer's names (``lin_l_weight``, ``att``, ...). Called as the
    plain layer with Equinox's dropout arguments: ``conv(x, edge_index, *, edge_attr=None,
    num_nodes=None, num_edges=None, key=None, inference=None)``.

    Example::

        >>> import jax, jax.numpy as jnp, blocksparse as bs
        >>> conv = bs.gnn.equinox.GATv2Conv(4, 8, heads=2, dropout=0.1, key=jax.random.key(0))
        >>> conv(jnp.ones((3, 4)), jnp.array([[0, 1], [1, 2]]), key=jax.random.key(1)).shape
        (3, 16)
    """

    lin_l_weight: jax.Array
    lin_l_bias: jax.Array | None
    lin_r_weight: jax.Array | None
    lin_r_bias: jax.Array | None
    att: jax.Array
    lin_edge_weight: jax.Array | None
    bias: jax.Array | None
    heads: int = eqx.field(static=True)
    out_channels: int = eqx.field(static=True)
    concat: bool = eqx.field(static=True)
    negative_slope: float = eqx.field(static=True)
    dropout: float = eqx.field(static=True)
    add_self_loops: bool = eqx.field(static=True)
    share_weights: bool = eqx.field(static=True)
    implementation: _Impl = eqx.field(static=True)
    inference: bool  # not static, as eqx.nn.Dropout's: eqx.nn.inference_mode and eqx.tree_at change it

    def __init__(
        self, in_channels: int | tuple[int, int], out_channels: int, *, heads: int = 1, concat: bool = True,
        negative_slope: float = 0.2, dropout: float = 0.0, add_self_loops: bool = True, edge_dim: int | None = None,
        bias: bool = True, share_weights: bool = False, dtype=None, inference: bool = False, implementation=None,
        key,
    ):  # fmt: skip
        dtype = jnp.float32 if dtype is None else dtype
        self._set(_layers.GATv2Conv.init(
            key, in_channels, out_channels, heads=heads, concat=concat, negative_slope=negative_slope,
            dropout=dropout, add_self_loops=add_self_loops, edge_dim=edge_dim, bias=bias,
            share_weights=share_weights, dtype=dtype, implementation=implementation,
        ), inference=inference)  # fmt: skip

    @staticmethod
    def _plain():
        return _layers.GATv2Conv


class TransformerConv(_AttentionConv):
    """Graph transformer attention as PyG's ``TransformerConv``, as an Equinox module.

    :class:`blocksparse.gnn.layers.TransformerConv`'s arguments (PyG's), and:
        dtype: the parameters' dtype (default float32).
        inference: ``True``: no attention dropout (``eqx.nn.inference_mode`` sets it); ``False``
            (default): dropout, which needs ``key=`` at the call.
        implementation: passed to :func:`~blocksparse.gnn.graph_attention`.
        key: a PRNG key (keyword only).

    Array fields under the plain layer's names (``lin_query_weight``, ...). Called as the plain
    layer with Equinox's dropout arguments: ``conv(x, edge_index, *, edge_attr=None,
    num_nodes=None, num_edges=None, key=None, inference=None)``.

    Example::

        >>> import jax, jax.numpy as jnp, blocksparse as bs
        >>> conv = bs.gnn.equinox.TransformerConv(4, 8, heads=2, concat=False, key=jax.random.key(0))
        >>> conv(jnp.ones((3, 4)), jnp.array([[0, 1], [1, 2]])).shape
        (3, 8)
    """

    lin_query_weight: jax.Array
    lin_query_bias: jax.Array | None
    lin_key_weight: jax.Array
    lin_key_bias: jax.Array | None
    lin_value_weight: jax.Array
    lin_value_bias: jax.Array | None
    lin_edge_weight: jax.Array | None
    lin_skip_weight: jax.Array | None
    lin_skip_bias: jax.Array | None
    lin_beta_weight: jax.Array | None
    heads: int = eqx.field(static=True)
    out_channels: int = eqx.field(static=True)
    concat: bool = eqx.field(static=True)
    dropout: float = eqx.field(static=True)
    implementation: _Impl = eqx.field(static=True)
    inference: bool

    def __init__(
        self, in_channels: int | tuple[int, int], out_channels: int, *, heads: int = 1, concat: bool = True,
        beta: bool = False, dropout: float = 0.0, edge_dim: int | None = None, bias: bool = True,
        root_weight: bool = True, dtype=None, inference: bool = False, implementation=None, key,
    ):  # fmt: skip
        dtype = jnp.float32 if dtype is None else dtype
        self._set(_layers.TransformerConv.init(
            key, in_channels, out_channels, heads=heads, concat=concat, beta=beta, dropout=dropout,
            edge_dim=edge_dim, bias=bias, root_weight=root_weight, dtype=dtype, implementation=implementation,
        ), inference=inference)  # fmt: skip

    @staticmethod
    def _plain():
        return _layers.TransformerConv
