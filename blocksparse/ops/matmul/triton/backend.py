"""The Pallas (Triton lowering) backend (``implementation="pallas"``): which kernel variant runs.

Every product runs its kernel of :mod:`.kernels`, except the static ``x @ W`` and ``W @ x`` with few tokens,
which run the one-launch kernel of :mod:`.stream` (:func:`.stream.takes`), a gated epilogue (GLU) in its store and
a gated input (``input_glu``) where it loads ``x`` (:func:`.stream.gates_in_load`; elsewhere the gate runs in XLA
first). ``TritonConfig(grouped=True)`` runs the grouped kernel of :mod:`.grouped_kernel` for the other static
``x @ W`` and ``W @ x`` where its plan groups rows (:func:`.grouped_kernel.takes`); without a config it runs where
the measured rule :func:`.grouped_kernel.claims` the product (small blocks whose rows share their columns).
A :class:`~.common.TritonConfig` given through ``bs.matmul(..., config=)`` (``OpStatic.config``) sets the tiles
and variants (split or not, the dynamic design, stream or not), the defaults of :mod:`.common` and the tuned
table otherwise.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from .. import epilogue as _epilogue
from ..reference import poison
from . import grouped_kernel, stream
from .common import TritonConfig, check
from .kernels import dds, dsd, dsd_dynamic, sdd, sdd_coords

__all__ = ["PallasBackend"]


def _cfg(s) -> TritonConfig | None:
    """The op's config where it is this backend's (another backend's config is ignored)."""
    return s.config if isinstance(s.config, TritonConfig) else None


def _exact(s) -> bool:
    return s.precision == lax.Precision.HIGHEST


def _gates_in_load(op: str, s, x, dt) -> bool:
    """Whether the stream kernel gates ``op``'s input where it loads it (:func:`.stream.gates_in_load`), for ``x``
    already of the product's dtype ``dt`` (else the gate, rounded to ``x``'s own dtype, runs in XLA first)."""
    n = x.shape[0] if op == "dds" else x.shape[1]
    return x.dtype == dt and stream.gates_in_load(op, n, s.pattern, _cfg(s))


def _plain(op: str, n: int, s, cfg: TritonConfig | None, dt):
    """The kernel of a static ``op`` (``"dsd"`` / ``"dds"``) with ``n`` tokens and no gated input, and the config it
    runs with: the stream kernel where it :func:`.stream.takes` the product, the grouped kernel where the config asks
    and its plan groups (:func:`.grouped_kernel.takes`) or, without a config, where the measured rule
    :func:`.grouped_kernel.claims` it (with :data:`.grouped_kernel.CLAIMED`), else the work list's."""
    if stream.takes(op, n, s.pattern, cfg):
        return getattr(stream, op), cfg
    if cfg is None and grouped_kernel.claims(op, n, s.pattern, dt, s.out_dtype):
        return getattr(grouped_kernel, op), grouped_kernel.CLAIMED
    if grouped_kernel.takes(op, n, s.pattern, cfg, dt, s.out_dtype):
        return getattr(grouped_kernel, op), cfg
    return (dsd if op == "dsd" else dds), cfg


class PallasBackend:
    """Backend object for :mod:`blocksparse.ops.matmul.api` (``implementation="pallas"``; see the module docstring)."""

    name = "pallas"

    def dsd(self, s, data, x):
        return self.dsd_fused(s, data, x, None)  # no epilogue: s.epilogue is None

    def dds(self, s, x, data):
        return self.dds_fused(s, x, data, None)

    def sdd(self, s, a, b):
        dt = check(s.pattern.block_size, a.dtype, b.dtype)
        return sdd(a.astype(dt), b.astype(dt), s.pattern, s.out_dtype, exact=_exact(s), config=_cfg(s))

    def dyn_dsd(self, s, rows, cols, keep, valid, data, x):
        dt = check(data.shape[1:], data.dtype, x.dtype)
        return dsd_dynamic(rows, cols, keep, valid, data.astype(dt), x.astype(dt), s.grid[0], s.out_dtype,
                           transposed=s.transposed, exact=_exact(s), config=_cfg(s))  # fmt: skip

    # Fused epilogue (``s.epilogue``): bias, activation and the cast in the kernels' store; a gated input
    # (``s.input_gate``) where the stream kernel loads x, else in XLA first.
    def dsd_fused(self, s, data, x, bias):
        dt = check(s.pattern.block_size, data.dtype, x.dtype)
        cfg = _cfg(s)
        if s.input_gate is not None:
            if not _gates_in_load("dsd", s, x, dt):
                return _epilogue.gate_first(self.dsd_fused, s, 1, 0, data, x, bias)
            return stream.dsd(s.pattern, data.astype(dt), x, s.out_dtype, exact=_exact(s), config=cfg, epi=s.epilogue,
                              bias=bias, gate=s.input_gate)  # fmt: skip
        run, cfg = _plain("dsd", x.shape[1], s, cfg, dt)
        return run(s.pattern, data.astype(dt), x.astype(dt), s.out_dtype, exact=_exact(s), config=cfg, epi=s.epilogue,
                   bias=bias)  # fmt: skip

    def dds_fused(self, s, x, data, bias):
        dt = check(s.pattern.block_size, data.dtype, x.dtype)
        cfg = _cfg(s)
        if s.input_gate is not None:
            if not _gates_in_load("dds", s, x, dt):
                return _epilogue.gate_first(self.dds_fused, s, 0, 1, x, data, bias)
            return stream.dds(x, s.pattern, data.astype(dt), s.out_dtype, exact=_exact(s), config=cfg, epi=s.epilogue,
                              bias=bias, gate=s.input_gate)  # fmt: skip
        run, cfg = _plain("dds", x.shape[0], s, cfg, dt)
        return run(x.astype(dt), s.pattern, data.astype(dt), s.out_dtype, exact=_exact(s), config=cfg, epi=s.epilogue,
                   bias=bias)  # fmt: skip

    # Gated input (``s.input_gate``), with the epilogue where there is one: :meth:`dsd_fused` / :meth:`dds_fused` (a
    # gated epilogue: their ``_glu`` twins) gate x where the stream kernel loads it, else in XLA first.
    def dsd_input_glu(self, s, data, x, bias):
        glu = s.epilogue is not None and s.epilogue.glu
        return (self.dsd_glu if glu else self.dsd_fused)(s, data, x, bias)

    def dds_input_glu(self, s, x, data, bias):
        glu = s.epilogue is not None and s.epilogue.glu
        return (self.dds_glu if glu else self.dds_fused)(s, x, data, bias)

    # Gated epilogue (``s.epilogue.glu``): in the few-token kernel's store where :func:`.stream.gates_in_store`, else
    # the product with the bias fused and the gate after it.
    def dsd_glu(self, s, data, x, bias):
        if stream.gates_in_store("dsd", x.shape[1], s.pattern, _cfg(s)):
            return self.dsd_fused(s, data, x, bias)
        return _epilogue.gate_after(self.dsd_fused, s, data, x, bias)

    def dds_glu(self, s, x, data, bias):
        if stream.gates_in_store("dds", x.shape[0], s.pattern, _cfg(s)):
            return self.dds_fused(s, x, data, bias)
        return _epilogue.gate_after(self.dds_fused, s, x, data, bias)

    def dyn_dsd_fused(self, s, rows, cols, keep, valid, data, x, bias):
        dt = check(data.shape[1:], data.dtype, x.dtype)
        return dsd_dynamic(rows, cols, keep, valid, data.astype(dt), x.astype(dt), s.grid[0], s.out_dtype,
                           transposed=s.transposed, exact=_exact(s), config=_cfg(s), epi=s.epilogue,
                           bias=bias)  # fmt: skip

    def dyn_sdd(self, s, rows, cols, keep, valid, a, b):
        block_size = s.block_size
        dt = check(block_size, a.dtype, b.dtype)
        if a.shape[0] == 0 or b.shape[1] == 0:  # no block can be in range
            return poison(valid, jnp.zeros((rows.shape[0], *block_size), s.out_dtype))
        r, c = jnp.where(keep, rows, 0), jnp.where(keep, cols, 0)
        out = sdd_coords(a.astype(dt), b.astype(dt), r, c, block_size, s.out_dtype, exact=_exact(s), config=_cfg(s))
        return poison(valid, jnp.where(keep[:, None, None], out, jnp.zeros((), out.dtype)))
