"""Pure-JAX SpMM over a graph: the fallback on every machine and the oracle for the kernel.

Gather the source rows of every in-edge in CSR order (sorted by destination), scale them by the
edge weights and ``segment_sum`` them into their destinations, in float32. A
:class:`DynamicGraph`'s padding positions have destination ``N``, which ``segment_sum`` drops.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ....graph import DynamicGraph, Graph


def csr_sum(
    g: Graph | DynamicGraph,
    w_csr: jax.Array | None,
    x: jax.Array,
    init: jax.Array | None = None,
    *,
    row_scale: jax.Array | None = None,
) -> jax.Array:
    """``out[i] = init[i] + s_i sum_{e: j -> i} w_e x[j]``: ``x (N, F)`` -> ``(N, F)``; ``w_csr`` (E,) in CSR
    order or None; ``init`` ``(N, F)`` or None (zeros); ``row_scale`` ``s`` (N,) or None (ones): a factor of the
    destination alone (the mean's ``1 / in-degree``), multiplied into each float32 sum once rather than into every
    edge's row."""
    msg = x[jnp.asarray(g.indices)].astype(jnp.float32)
    if w_csr is not None:
        msg = msg * w_csr.astype(jnp.float32)[:, None]
    out = jax.ops.segment_sum(msg, jnp.asarray(g.dst_sorted), g.num_nodes, indices_are_sorted=True)
    if row_scale is not None:
        out = out * row_scale.astype(jnp.float32)[:, None]
    if init is not None:
        out = out + init.astype(x.dtype).astype(jnp.float32)
    return out.astype(x.dtype)
