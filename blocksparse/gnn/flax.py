"""Flax NNX modules: ``bs.gnn.flax.GCNConv``, ``GATv2Conv``, ``TransformerConv``.

The layers of :mod:`blocksparse.gnn.layers` (PyG's arguments, semantics and parameter names) as
``nnx.Module``: each weight is an ``nnx.Param`` under the plain layer's name (``weight``,
``lin_l_weight``, ...; ``None`` where the layer has none), the configuration is static module
metadata, and a call builds the plain layer from the current values and runs it: one
implementation of the message passing. Attention dropout follows ``nnx.MultiHeadAttention``:
``deterministic`` (constructor, call, ``model.train()`` / ``model.eval()``) and ``rngs`` (a
``dropout`` stream forked at construction, or ``rngs=`` at the call).

Imported on first use of ``bs.gnn.flax``; needs ``pip install 'blocksparse[flax]'``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

try:
    from flax import nnx
except ImportError as e:  # ModuleNotFoundError carries the package's name, as a missing import would
    raise ModuleNotFoundError("bs.gnn.flax needs Flax: pip install 'blocksparse[flax]'", name="flax") from e

from . import layers as _layers

__all__ = ["GATv2Conv", "GCNConv", "TransformerConv"]


def _cast(a, dtype):
    """A floating array cast to ``dtype`` (others left for the plain layer to reject); pairs element-wise."""
    if dtype is None or a is None:
        return a
    if isinstance(a, tuple | list):
        return type(a)(_cast(v, dtype) for v in a)
    a = jnp.asarray(a)
    return a.astype(dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a


class _Conv(nnx.Module):
    """Parameters as ``nnx.Param`` under the plain layer's leaf names, its static fields as attributes."""

    _plain: type  # the blocksparse.gnn.layers class

    def _set(self, layer, dtype, deterministic=None, rngs=None, keep_rngs: bool = True):
        for name in self._plain._leaves:
            value = getattr(layer, name)
            setattr(self, name, None if value is None else nnx.Param(jnp.asarray(value)))
        for name in self._plain._static:
            setattr(self, name, getattr(layer, name))
        self.dtype = dtype
        if "dropout" in self._plain._static:  # the attention layers: nnx.MultiHeadAttention's dropout state
            self.deterministic = deterministic
            stream = None
            if keep_rngs and layer.dropout > 0.0 and rngs is not None:
                try:
                    stream = rngs.dropout.fork()
                except AttributeError:  # no dropout (nor default) stream: rngs= at the call then
                    pass
            self.rngs = nnx.data(stream)

    def _load(self, layer):
        """Take a plain layer's values; ``self`` was built with its configuration (the same leaves and shapes)."""
        if type(layer) is not self._plain:
            raise TypeError(
                f"{type(self).__name__}.from_plain: expected a blocksparse.gnn.layers.{self._plain.__name__}. "
                f"Got {type(layer).__name__}."
            )
        for name in self._plain._leaves:
            mine, value = getattr(self, name), getattr(layer, name)
            if (mine is None) != (value is None) or (value is not None and mine.shape != jnp.shape(value)):
                raise ValueError(
                    f"{type(self).__name__}.from_plain: expected {name} "
                    f"{'None' if mine is None else f'of shape {mine.shape}'} (the layer's configuration). Got "
                    f"{'None' if value is None else f'shape {jnp.shape(value)}'}."
                )
            if value is not None:
                setattr(self, name, nnx.Param(jnp.asarray(value)))
        return self

    def to_plain(self):
        """The plain :mod:`blocksparse.gnn.layers` layer holding the current values (in ``param_dtype``)."""
        leaves = {n: None if getattr(self, n) is None else getattr(self, n)[...] for n in self._plain._leaves}
        return self._plain._from_fields(**leaves, **{n: getattr(self, n) for n in self._plain._static})

    @property
    def in_channels(self):
        return self.to_plain().in_channels

    def _computing(self):
        """The plain layer with its parameters in the computation dtype."""
        layer = self.to_plain()
        if self.dtype is None:
            return layer
        return layer._replace(**{n: _cast(getattr(layer, n), self.dtype) for n in self._plain._leaves})

    def _dropout(self, deterministic, rngs):
        """``(key, deterministic)`` for the plain layer, resolved as ``nnx.MultiHeadAttention`` does."""
        if self.dropout == 0.0:
            return None, True
        deterministic = self.deterministic if deterministic is None else deterministic
        if deterministic is None:
            raise ValueError(
                f"{type(self).__name__}: dropout={self.dropout} needs deterministic=True/False, at the call, in "
                "the constructor, or from model.train() / model.eval(). Got None."
            )
        if deterministic:
            return None, True
        rngs = self.rngs if rngs is None else rngs
        if isinstance(rngs, nnx.Rngs):
            rngs = rngs.dropout
        if rngs is None:
            raise ValueError(
                f"{type(self).__name__}: dropout={self.dropout} with deterministic=False needs rngs (given to the "
                "constructor, or rngs= at the call). Got None."
            )
        return (rngs if isinstance(rngs, jax.Array) else rngs()), False


_DTYPES = """
        dtype: the computation dtype (the features, edge features and parameters are cast to it);
            ``None`` promotes them.
        param_dtype: the parameters' dtype."""
_DROPOUT = """
        deterministic: ``True``: no attention dropout; ``False``: dropout (keys from the kept
            ``dropout`` stream, or ``rngs=`` at the call); ``None``: given at the call or set by
            ``model.train()`` / ``model.eval()`` (required when ``dropout > 0``).
        rngs: ``nnx.Rngs``: ``params`` for the initialisation; with ``dropout > 0`` a ``dropout``
            stream is forked and kept (``keep_rngs=False``: pass ``rngs=`` at each call instead)."""


class _AttentionConv(_Conv):
    """What GATv2Conv and TransformerConv share: the call with NNX's dropout arguments."""

    def __call__(
        self, x, edge_index, edge_attr=None, *, num_nodes=None, num_edges=None, deterministic=None, rngs=None
    ) -> jax.Array:
        """As the plain layer's ``__call__``; ``rngs``: Rngs, RngStream or key."""
        key, det = self._dropout(deterministic, rngs)
        return self._computing()(
            _cast(x, self.dtype), edge_index, edge_attr=_cast(edge_attr, self.dtype), num_nodes=num_nodes,
            num_edges=num_edges, key=key, deterministic=det,
        )  # fmt: skip


class GCNConv(_Conv):
    """Graph convolution as PyG's ``GCNConv``: :class:`blocksparse.gnn.layers.GCNConv` as an NNX module.

    Arguments are those of :meth:`blocksparse.gnn.layers.GCNConv.init` (PyG's), and:{dtypes}
        implementation: passed to :func:`~blocksparse.gnn.spmm`.
        rngs: ``nnx.Rngs`` (``params`` draws the initial values).

    ``weight`` is an ``nnx.Param`` ``(out_channels, in_channels)`` (PyG's ``lin.weight``), ``bias``
    ``(out_channels,)`` or ``None``. Called as the plain layer: ``conv(x, edge_index, *,
    edge_weight=None, num_nodes=None, num_edges=None)``.

    Example::

        >>> import jax.numpy as jnp, blocksparse as bs
        >>> from flax import nnx
        >>> conv = bs.gnn.flax.GCNConv(4, 8, rngs=nnx.Rngs(0))
        >>> conv(jnp.ones((3, 4)), jnp.array([[0, 1], [1, 2]])).shape
        (3, 8)
    """

    _plain = _layers.GCNConv

    def __init__(
        self, in_channels: int, out_channels: int, *, improved: bool = False, add_self_loops: bool | None = None,
        normalize: bool = True, bias: bool = True, dtype=None, param_dtype=jnp.float32, implementation=None,
        rngs: nnx.Rngs,
    ):  # fmt: skip
        layer = _layers.GCNConv.init(
            rngs.params(), in_channels, out_channels, improved=improved, add_self_loops=add_self_loops,
            normalize=normalize, bias=bias, dtype=param_dtype, implementation=implementation,
        )  # fmt: skip
        self._set(layer, dtype)

    @classmethod
    def from_plain(cls, layer: _layers.GCNConv, *, dtype=None) -> GCNConv:
        """The module holding a plain layer's parameters and configuration (e.g. one loaded from PyG)."""
        w = layer.weight
        return cls(
            w.shape[1], w.shape[0], improved=layer.improved, add_self_loops=layer.add_self_loops,
            normalize=layer.normalize, bias=layer.bias is not None, dtype=dtype, param_dtype=w.dtype,
            implementation=layer.implementation, rngs=nnx.Rngs(0),
        )._load(layer)  # fmt: skip

    @property
    def out_channels(self) -> int:
        return self.weight.shape[0]

    def __call__(self, x, edge_index, edge_weight=None, *, num_nodes=None, num_edges=None) -> jax.Array:
        """As :meth:`blocksparse.gnn.layers.GCNConv.__call__`."""
        return self._computing()(
            _cast(x, self.dtype), edge_index, edge_weight=edge_weight, num_nodes=num_nodes, num_edges=num_edges
        )


class GATv2Conv(_AttentionConv):
    """GATv2 attention as PyG's ``GATv2Conv``: :class:`blocksparse.gnn.layers.GATv2Conv` as an NNX module.

    Arguments are those of :meth:`blocksparse.gnn.layers.GATv2Conv.init` (PyG's), and:{dtypes}
        implementation: passed to :func:`~blocksparse.gnn.gatv2`.{dropout}

    The parameters are ``nnx.Param`` under the plain layer's names (``lin_l_weight``, ``att``, ...).
    Called as the plain layer, with NNX's dropout arguments: ``conv(x, edge_index, *,
    edge_attr=None, num_nodes=None, num_edges=None, deterministic=None, rngs=None)``.

    Example::

        >>> import jax.numpy as jnp, blocksparse as bs
        >>> from flax import nnx
        >>> conv = bs.gnn.flax.GATv2Conv(4, 8, heads=2, dropout=0.1, rngs=nnx.Rngs(0))
        >>> conv(jnp.ones((3, 4)), jnp.array([[0, 1], [1, 2]]), deterministic=True).shape
        (3, 16)
    """

    _plain = _layers.GATv2Conv

    def __init__(
        self, in_channels: int | tuple[int, int], out_channels: int, *, heads: int = 1, concat: bool = True,
        negative_slope: float = 0.2, dropout: float = 0.0, add_self_loops: bool = True, edge_dim: int | None = None,
        bias: bool = True, share_weights: bool = False, dtype=None, param_dtype=jnp.float32,
        deterministic: bool | None = None, implementation=None, rngs: nnx.Rngs, keep_rngs: bool = True,
    ):  # fmt: skip
        layer = _layers.GATv2Conv.init(
            rngs.params(), in_channels, out_channels, heads=heads, concat=concat, negative_slope=negative_slope,
            dropout=dropout, add_self_loops=add_self_loops, edge_dim=edge_dim, bias=bias,
            share_weights=share_weights, dtype=param_dtype, implementation=implementation,
        )  # fmt: skip
        self._set(layer, dtype, deterministic, rngs, keep_rngs)

    @classmethod
    def from_plain(
        cls, layer: _layers.GATv2Conv, *, dtype=None, deterministic: bool | None = None, rngs: nnx.Rngs | None = None
    ) -> GATv2Conv:
        """The module holding a plain layer's parameters and configuration; ``rngs`` for its dropout."""
        w_e = layer.lin_edge_weight
        return cls(
            layer.in_channels, layer.out_channels, heads=layer.heads, concat=layer.concat,
            negative_slope=layer.negative_slope, dropout=layer.dropout, add_self_loops=layer.add_self_loops,
            edge_dim=None if w_e is None else w_e.shape[1], bias=layer.lin_l_bias is not None,
            share_weights=layer.share_weights, dtype=dtype, param_dtype=layer.lin_l_weight.dtype,
            deterministic=deterministic, implementation=layer.implementation,
            rngs=nnx.Rngs(0) if rngs is None else rngs, keep_rngs=rngs is not None,
        )._load(layer)  # fmt: skip


class TransformerConv(_AttentionConv):
    """Graph transformer attention as PyG's ``TransformerConv``, as an NNX module.

    :class:`blocksparse.gnn.layers.TransformerConv`'s arguments (PyG's), and:{dtypes}
        implementation: passed to :func:`~blocksparse.gnn.graph_attention`.{dropout}

    The parameters are ``nnx.Param`` under the plain layer's names (``lin_query_weight``, ...).
    Called as the plain layer, with NNX's dropout arguments: ``conv(x, edge_index, *,
    edge_attr=None, num_nodes=None, num_edges=None, deterministic=None, rngs=None)``.

    Example::

        >>> import jax.numpy as jnp, blocksparse as bs
        >>> from flax import nnx
        >>> conv = bs.gnn.flax.TransformerConv(4, 8, heads=2, concat=False, rngs=nnx.Rngs(0))
        >>> conv(jnp.ones((3, 4)), jnp.array([[0, 1], [1, 2]])).shape
        (3, 8)
    """

    _plain = _layers.TransformerConv

    def __init__(
        self, in_channels: int | tuple[int, int], out_channels: int, *, heads: int = 1, concat: bool = True,
        beta: bool = False, dropout: float = 0.0, edge_dim: int | None = None, bias: bool = True,
        root_weight: bool = True, dtype=None, param_dtype=jnp.float32, deterministic: bool | None = None,
        implementation=None, rngs: nnx.Rngs, keep_rngs: bool = True,
    ):  # fmt: skip
        layer = _layers.TransformerConv.init(
            rngs.params(), in_channels, out_channels, heads=heads, concat=concat, beta=beta, dropout=dropout,
            edge_dim=edge_dim, bias=bias, root_weight=root_weight, dtype=param_dtype, implementation=implementation,
        )  # fmt: skip
        self._set(layer, dtype, deterministic, rngs, keep_rngs)

    @classmethod
    def from_plain(
        cls, layer: _layers.TransformerConv, *, dtype=None, deterministic: bool | None = None,
        rngs: nnx.Rngs | None = None,
    ) -> TransformerConv:  # fmt: skip
        """The module holding a plain layer's parameters and configuration; ``rngs`` for its dropout."""
        w_e = layer.lin_edge_weight
        return cls(
            layer.in_channels, layer.out_channels, heads=layer.heads, concat=layer.concat,
            beta=layer.lin_beta_weight is not None, dropout=layer.dropout,
            edge_dim=None if w_e is None else w_e.shape[1], bias=layer.lin_query_bias is not None,
            root_weight=layer.lin_skip_weight is not None, dtype=dtype, param_dtype=layer.lin_query_weight.dtype,
            deterministic=deterministic, implementation=layer.implementation,
            rngs=nnx.Rngs(0) if rngs is None else rngs, keep_rngs=rngs is not None,
        )._load(layer)  # fmt: skip


for _cls in (GCNConv, GATv2Conv, TransformerConv):
    _cls.__doc__ = _cls.__doc__.format(dtypes=_DTYPES, dropout=_DROPOUT)
del _cls
