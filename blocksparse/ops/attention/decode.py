"""Grouped-query attention of one new token per sequence on a key/value cache, in one launch.

A decode step's attention is small: one query per head against the cache slots its sequence holds. Written
with ``einsum`` and ``softmax`` it is half a dozen XLA kernels per layer (scores, mask, maximum, exponent and
sum, normalisation, the weighted values), each a launch of a microsecond or two on a GPU. :func:`decode_attention`
is one Pallas (Triton) kernel: program ``(sequence, kv head)`` holds the queries of the heads that share that
key/value head (padded to 16 rows in registers), walks the cache slots ``lo .. hi`` of its sequence in chunks of
:data:`CHUNK` (chunks outside are never read) with an online softmax in float32, and stores the ``heads per kv
head`` output rows once. Forward only (inference); :func:`decode_attention_reference` is the same computation in
XLA, its oracle and its fallback off the GPU.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from .. import _dispatch

__all__ = ["CHUNK", "decode_attention", "decode_attention_reference"]

#: Cache slots per step of the walk (a power of two >= 16, the dot's smallest side).
CHUNK = 64


def _check(q, k_cache, v_cache, lo, hi):
    if q.ndim != 3 or k_cache.ndim != 4:
        raise ValueError(f"Expected q (batch, heads, head_dim) and caches (batch, size, kv_heads, head_dim). Got "
                         f"q {q.shape}, k_cache {k_cache.shape}.")  # fmt: skip
    b, nh, d = q.shape
    if k_cache.shape[0] != b or k_cache.shape[3] != d or v_cache.shape != k_cache.shape:
        raise ValueError(f"Expected caches (batch={b}, size, kv_heads, head_dim={d}), both the same shape. Got "
                         f"k_cache {k_cache.shape}, v_cache {v_cache.shape}.")  # fmt: skip
    nk = k_cache.shape[2]
    if nh % nk:
        raise ValueError(f"Expected heads divisible by kv_heads. Got {nh} heads and {nk} kv_heads.")
    for name, a in (("lo", lo), ("hi", hi)):
        if jnp.shape(a) != (b,):
            raise ValueError(f"Expected {name} of shape ({b},) (one slot per sequence). Got {jnp.shape(a)}.")


def decode_attention_reference(q, k_cache, v_cache, lo, hi, *, scale: float | None = None) -> jax.Array:
    """:func:`decode_attention` in XLA: scores in float32, masked outside slots ``lo .. hi``, softmax, values."""
    _check(q, k_cache, v_cache, lo, hi)
    b, nh, d = q.shape
    size, nk = k_cache.shape[1], k_cache.shape[2]
    scale = 1 / math.sqrt(d) if scale is None else scale
    qg = q.reshape(b, nk, nh // nk, d)
    s = jnp.einsum("bkgd,bskd->bkgs", qg, k_cache, preferred_element_type=jnp.float32) * scale
    j = jnp.arange(size)
    keep = (j[None] >= jnp.asarray(lo)[:, None]) & (j[None] <= jnp.asarray(hi)[:, None])
    s = jnp.where(keep[:, None, None], s, -jnp.inf)
    v_cache = jnp.where(keep[:, :, None, None], v_cache, 0)  # as the kernel: a slot outside adds nothing
    p = jax.nn.softmax(s, axis=-1)
    out = jnp.einsum("bkgs,bskd->bkgd", p.astype(v_cache.dtype), v_cache, preferred_element_type=jnp.float32)
    return out.reshape(b, nh, d).astype(q.dtype)


def _kernel(lo_ref, hi_ref, q_ref, k_ref, v_ref, o_ref, *, group, rows, chunk, scale):
    from jax.experimental.pallas import triton as plgpu

    bi, kh = pl.program_id(0), pl.program_id(1)
    lo, hi = lo_ref[bi], hi_ref[bi]
    d = q_ref.shape[-1]
    live = lax.broadcasted_iota(jnp.int32, (rows, d), 0) < group
    q = plgpu.load(q_ref.at[bi, pl.ds(kh * group, rows), :], mask=live, other=0)  # (rows, d)

    def step(c, carry):
        m, total, acc = carry
        s0 = pl.multiple_of(c * chunk, chunk)
        k = k_ref[bi, pl.ds(s0, chunk), kh, :]  # (chunk, d)
        v = v_ref[bi, pl.ds(s0, chunk), kh, :]
        s = lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32) * scale
        j = s0 + lax.broadcasted_iota(jnp.int32, (rows, chunk), 1)
        s = jnp.where((j >= lo) & (j <= hi), s, -jnp.inf)
        slot = s0 + lax.broadcasted_iota(jnp.int32, v.shape, 0)
        v = jnp.where((slot >= lo) & (slot <= hi), v, 0)  # a slot outside (stale, NaN) adds nothing, not 0 * NaN
        m_new = jnp.maximum(m, jnp.max(s, axis=1))
        alpha = jnp.exp(m - m_new)
        p = jnp.exp(s - m_new[:, None])
        total = total * alpha + jnp.sum(p, axis=1)
        acc = acc * alpha[:, None] + lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())),
                                                     preferred_element_type=jnp.float32)  # fmt: skip
        return m_new, total, acc

    init = (jnp.full((rows,), -jnp.inf, jnp.float32), jnp.zeros((rows,), jnp.float32),
            jnp.zeros((rows, d), jnp.float32))  # fmt: skip
    # The first chunk holds lo, which is <= hi: every row sees at least one slot, so m is finite after it.
    _, total, acc = lax.fori_loop(lo // chunk, hi // chunk + 1, step, init)
    out = (acc / total[:, None]).astype(o_ref.dtype)
    plgpu.store(o_ref.at[bi, pl.ds(kh * group, rows), :], out, mask=live)


@functools.partial(jax.jit, static_argnames=("scale",))
def _pallas(q, k_cache, v_cache, lo, hi, *, scale):
    from jax.experimental.pallas import triton as plgpu

    b, nh, d = q.shape
    size, nk = k_cache.shape[1], k_cache.shape[2]
    group = nh // nk
    rows = max(16, 1 << (group - 1).bit_length())
    padded = -(-size // CHUNK) * CHUNK
    if padded != size:  # whole chunks (the pad is beyond hi, never attended to)
        pad = ((0, 0), (0, padded - size), (0, 0), (0, 0))
        k_cache, v_cache = jnp.pad(k_cache, pad), jnp.pad(v_cache, pad)
    # q padded so each program's ``rows``-row slice stays inside the array.
    qp = jnp.pad(q, ((0, 0), (0, (nk - 1) * group + rows - nh), (0, 0)))
    kernel = functools.partial(_kernel, group=group, rows=rows, chunk=CHUNK, scale=scale)
    out = pl.pallas_call(
        kernel,
        grid=(b, nk),
        out_shape=jax.ShapeDtypeStruct(qp.shape, q.dtype),
        compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=2),
        interpret=_dispatch.interpreting(),
        name="bs_decode_attention",
    )(lo, hi, qp, k_cache, v_cache)
    return out[:, :nh]


def decode_attention(q, k_cache, v_cache, lo, hi, *, scale: float | None = None) -> jax.Array:
    """Attention of one query per head on each sequence's cache slots ``lo .. hi`` (inclusive).

    Arguments:
        q: ``(batch, heads, head_dim)``: the new token's queries.
        k_cache, v_cache: ``(batch, size, kv_heads, head_dim)``; ``heads`` a multiple of ``kv_heads`` (grouped-query
            attention: query head ``h`` reads kv head ``h // (heads // kv_heads)``).
        lo, hi: ``(batch,)`` int32: the first and last slot each sequence attends to (``lo <= hi < size``; slots
            outside are never read).
        scale: the scores' scale (default ``1 / sqrt(head_dim)``).

    Returns ``(batch, heads, head_dim)`` in ``q``'s dtype. On a CUDA GPU (or under :func:`blocksparse.interpret`)
    the one-launch Pallas kernel; elsewhere :func:`decode_attention_reference`. Forward only. A cache whose size is
    not a multiple of :data:`CHUNK` is padded to one for the kernel, a copy on every call: a decoder allocates its
    cache in whole chunks.

    >>> import jax, jax.numpy as jnp
    >>> q = jax.random.normal(jax.random.key(0), (2, 4, 16))
    >>> kv = jax.random.normal(jax.random.key(1), (2, 32, 2, 16))
    >>> lo, hi = jnp.array([0, 3]), jnp.array([9, 31])
    >>> decode_attention(q, kv, kv, lo, hi).shape
    (2, 4, 16)
    """
    _check(q, k_cache, v_cache, lo, hi)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    lo, hi = jnp.asarray(lo, jnp.int32), jnp.asarray(hi, jnp.int32)
    if _dispatch.interpreting() or (jax.default_backend() == "gpu" and q.shape[-1] >= 16):
        return _pallas(q, k_cache, v_cache, lo, hi, scale=scale)
    return decode_attention_reference(q, k_cache, v_cache, lo, hi, scale=scale)
