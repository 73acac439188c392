"""Grouped-query attention of one new token per sequence on a key/value cache, in one launch.

A decode step's attention is small: one query per head against the cache slots its sequence holds. Written
with ``einsum`` and ``softmax`` it is half a dozen XLA kernels per layer (scores, mask, maximum, exponent and
sum, normalisation, the weighted values), each a launch of a microsecond or two on a GPU. :func:`decode_attention`
is one Pallas (Triton) kernel: program ``(sequence, kv head)`` holds the queries of the heads that share that
key/value head (padded to 16 rows in registers), walks the cache slots ``lo .. hi`` of its sequence in chunks of
:data:`CHUNK` (chunks outside are never read) with an online softmax in float32, and stores the ``heads per kv
head`` output rows once. Forward only (inference); :func:`decode_attention_reference` is the same computation in
XLA, its oracle and its fallback off the GPU.

:func:`decode_step_attention` is the whole attention step of a decoder layer in that one launch: from the fused
q/k/v projection's output it applies the rotary embedding to the new token's queries and key, writes its key and
value into the cache slot (in place: the cache is the kernel's output as well as its input), and attends. The XLA
glue it replaces (the split of the projection, two rotary fusions, the cache updates, the query padding and the
output slice) is another five or six launches per layer.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from ... import hardware
from ..._util import cdiv, check_positive_int, next_power_of_2
from .. import _dispatch
from . import tuned

__all__ = [
    "CHUNK",
    "decode_attention",
    "decode_attention_reference",
    "decode_step_attention",
    "decode_step_attention_reference",
    "default_parts",
]

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
    _check_range(lo, hi, k_cache.shape[1])


def _check_range(lo, hi, size: int) -> None:
    """``0 <= lo <= hi < size`` where the slots are concrete (under ``jit`` they are the caller's contract: a slot
    outside the cache is never read, and the kernel's result for it is undefined)."""
    if isinstance(lo, jax.core.Tracer) or isinstance(hi, jax.core.Tracer):
        return
    lo, hi = np.asarray(lo), np.asarray(hi)
    bad = np.flatnonzero((lo < 0) | (lo > hi) | (hi >= size))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"Expected 0 <= lo <= hi < size ({size}) for every sequence. Got lo={int(lo[i])}, "
                         f"hi={int(hi[i])} for sequence {i}.")  # fmt: skip


def decode_attention_reference(q, k_cache, v_cache, lo, hi, *, scale: float | None = None) -> jax.Array:
    """:func:`decode_attention` in XLA: scores in float32, masked outside slots ``lo .. hi``, softmax, values."""
    _check(q, k_cache, v_cache, lo, hi)
    return _attention_xla(q, k_cache, v_cache, lo, hi, scale)


def _attention_xla(q, k_cache, v_cache, lo, hi, scale):
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


def _online(carry, s, v, s0, lo, hi):
    """One chunk of the walk: scores ``s (rows, chunk)`` float32 and values ``v (chunk, d)`` of slots ``s0 ..``,
    slots outside ``lo .. hi`` masked; the online softmax's ``(max, total, acc)`` updated."""
    m, total, acc = carry
    j = s0 + lax.broadcasted_iota(jnp.int32, s.shape, 1)
    s = jnp.where((j >= lo) & (j <= hi), s, -jnp.inf)
    slot = s0 + lax.broadcasted_iota(jnp.int32, v.shape, 0)
    v = jnp.where((slot >= lo) & (slot <= hi), v, 0)  # a slot outside (stale, NaN) adds nothing, not 0 * NaN
    m_new = jnp.maximum(m, jnp.max(s, axis=1))
    alpha = jnp.exp(m - m_new)
    p = jnp.exp(s - m_new[:, None])
    total = total * alpha + jnp.sum(p, axis=1)
    pv = lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
    return m_new, total, acc * alpha[:, None] + pv


def _kernel(lo_ref, hi_ref, q_ref, k_ref, v_ref, o_ref, *, group, rows, chunk, scale):
    from jax.experimental.pallas import triton as plgpu

    bi, kh = pl.program_id(0), pl.program_id(1)
    lo, hi = lo_ref[bi], hi_ref[bi]
    d = q_ref.shape[-1]
    live = lax.broadcasted_iota(jnp.int32, (rows, d), 0) < group
    q = plgpu.load(q_ref.at[bi, pl.ds(kh * group, rows), :], mask=live, other=0)  # (rows, d)

    def step(c, carry):
        s0 = pl.multiple_of(c * chunk, chunk)
        k = k_ref[bi, pl.ds(s0, chunk), kh, :]  # (chunk, d)
        s = lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32) * scale
        return _online(carry, s, v_ref[bi, pl.ds(s0, chunk), kh, :], s0, lo, hi)

    init = (jnp.full((rows,), -jnp.inf, jnp.float32), jnp.zeros((rows,), jnp.float32),
            jnp.zeros((rows, d), jnp.float32))  # fmt: skip
    # The first chunk holds lo, which is <= hi: every row sees at least one slot, so m is finite after it.
    _, total, acc = lax.fori_loop(lo // chunk, hi // chunk + 1, step, init)
    out = (acc / total[:, None]).astype(o_ref.dtype)
    plgpu.store(o_ref.at[bi, pl.ds(kh * group, rows), :], out, mask=live)


def _whole_chunks(k_cache, v_cache, chunk: int):
    """The caches padded to whole chunks of slots (a copy; the pad is beyond every ``hi``, never attended to), or
    ``None`` when they are whole already."""
    size = k_cache.shape[1]
    padded = cdiv(size, chunk) * chunk
    if padded == size:
        return None
    pad = ((0, 0), (0, padded - size), (0, 0), (0, 0))
    return jnp.pad(k_cache, pad), jnp.pad(v_cache, pad)


@functools.partial(jax.jit, static_argnames=("scale",))
def _pallas(q, k_cache, v_cache, lo, hi, *, scale):
    from jax.experimental.pallas import triton as plgpu

    b, nh, d = q.shape
    nk = k_cache.shape[2]
    group = nh // nk
    rows = next_power_of_2(group, 16)
    k_cache, v_cache = _whole_chunks(k_cache, v_cache, CHUNK) or (k_cache, v_cache)
    # q padded so each program's ``rows``-row slice stays inside the array.
    qp = jnp.pad(q, ((0, 0), (0, (nk - 1) * group + rows - nh), (0, 0)))
    kernel = functools.partial(_kernel, group=group, rows=rows, chunk=CHUNK, scale=scale)
    out = pl.pallas_call(
        kernel,
        grid=(b, nk),
        out_shape=jax.ShapeDtypeStruct(qp.shape, q.dtype),
        compiler_params=plgpu.CompilerParams(
            num_warps=tuned.get("DECODE_ATTENTION_WARPS"), num_stages=tuned.get("DECODE_ATTENTION_STAGES")
        ),
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
    if _dispatch.pallas_takes_width(q.shape[-1], 16):
        return _pallas(q, k_cache, v_cache, lo, hi, scale=scale)
    return _attention_xla(q, k_cache, v_cache, lo, hi, scale)


def _check_step(qkv, cos, sin, k_cache, v_cache, lo, hi):
    if qkv.ndim != 3 or k_cache.ndim != 4:
        raise ValueError(f"Expected qkv (batch, heads + 2 kv_heads, head_dim) and caches (batch, size, kv_heads, "
                         f"head_dim). Got qkv {qkv.shape}, k_cache {k_cache.shape}.")  # fmt: skip
    b, _, d = qkv.shape
    nk = k_cache.shape[2]
    heads = qkv.shape[1] - 2 * nk
    if heads < nk or heads % nk:
        raise ValueError(f"Expected qkv's rows heads + 2 kv_heads with heads a positive multiple of kv_heads "
                         f"({nk}). Got {qkv.shape[1]} rows.")  # fmt: skip
    if d % 2:
        raise ValueError(f"Expected an even head_dim (the rotary embedding turns pairs). Got {d}.")
    _check(qkv[:, :heads], k_cache, v_cache, lo, hi)
    for name, a in (("cos", cos), ("sin", sin)):
        if jnp.shape(a) != (b, d):
            raise ValueError(f"Expected {name} of shape ({b}, {d}) (the new token's angles). Got {jnp.shape(a)}.")
    return heads


def _rope(x, cos, sin):
    """``rotate_half`` rotary embedding of ``x (..., d)`` by ``cos``/``sin`` ``(d,)``, in float32, cast back."""
    half = x.shape[-1] // 2
    x32 = x.astype(jnp.float32)
    rot = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
    return (x32 * cos + rot * sin).astype(x.dtype)


def decode_step_attention_reference(qkv, cos, sin, k_cache, v_cache, lo, hi, *, scale: float | None = None):
    """:func:`decode_step_attention` in XLA: the rotary embedding, the cache updates, then
    :func:`decode_attention_reference`."""
    heads = _check_step(qkv, cos, sin, k_cache, v_cache, lo, hi)
    return _step_xla(qkv, cos, sin, k_cache, v_cache, lo, hi, heads, scale)


def _step_xla(qkv, cos, sin, k_cache, v_cache, lo, hi, heads, scale):
    nk = k_cache.shape[2]
    c, s = cos[:, None].astype(jnp.float32), sin[:, None].astype(jnp.float32)
    q = _rope(qkv[:, :heads], c, s)
    k = _rope(qkv[:, heads : heads + nk], c, s).astype(k_cache.dtype)
    v = qkv[:, heads + nk :].astype(v_cache.dtype)
    rows = jnp.arange(qkv.shape[0])
    hi = jnp.asarray(hi, jnp.int32)
    k_cache, v_cache = k_cache.at[rows, hi].set(k), v_cache.at[rows, hi].set(v)
    return _attention_xla(q, k_cache, v_cache, lo, hi, scale), k_cache, v_cache


def _step_kernel(lo_ref, hi_ref, qkv_ref, cos_ref, sin_ref, k_ref, v_ref, *refs, heads, group, rows, chunk, scale,
                 parts):  # fmt: skip
    """Program ``(sequence, kv head, part)``. ``k_ref``/``v_ref`` are read (the cache, or its copy padded to whole
    chunks, then followed by the cache's own input refs); ``refs`` ends with the outputs: the attention (one part),
    or each part's running maximum, total and weighted values (several, combined in XLA), then the cache's output
    refs (the same buffers as its inputs), where part 0 writes the new slot."""
    from jax.experimental.pallas import triton as plgpu

    k_out, v_out = refs[-2:]
    part = pl.program_id(2)
    bi, kh = pl.program_id(0), pl.program_id(1)
    lo, hi = lo_ref[bi], hi_ref[bi]
    d = v_ref.shape[-1]
    half = d // 2
    dt = k_ref.dtype
    c_lo, c_hi = cos_ref[bi, pl.ds(0, half)], cos_ref[bi, pl.ds(half, half)]
    s_lo, s_hi = sin_ref[bi, pl.ds(0, half)], sin_ref[bi, pl.ds(half, half)]

    def rope(row, n):  # rows row .. row + n of qkv rotated, as (lo half, hi half) in the cache dtype
        a = qkv_ref[bi, pl.ds(row, n), pl.ds(0, half)].astype(jnp.float32)
        b = qkv_ref[bi, pl.ds(row, n), pl.ds(half, half)].astype(jnp.float32)
        return (a * c_lo - b * s_lo).astype(dt), (b * c_hi + a * s_hi).astype(dt)

    # The group's query rows inside a tile of ``rows`` rows that stays within the heads (tiles of neighbouring
    # programs overlap; each stores only its own rows).
    start = jnp.minimum(kh * group, heads - rows)
    r = start + lax.broadcasted_iota(jnp.int32, (rows, d), 0)
    live = (r >= kh * group) & (r < kh * group + group)
    r1 = start + lax.broadcasted_iota(jnp.int32, (rows,), 0)  # (a column of live: Triton slices no tensors)
    live1 = (r1 >= kh * group) & (r1 < kh * group + group)
    q_lo, q_hi = rope(start, rows)  # (rows, half) each
    k_lo, k_hi = rope(heads + kh, 1)  # (1, half): the new token's key
    v_new = qkv_ref[bi, pl.ds(heads + k_ref.shape[2] + kh, 1), :].astype(dt)  # (1, d)

    @pl.when(part == 0)
    def _():
        k_out[bi, pl.ds(hi, 1), kh, pl.ds(0, half)] = k_lo
        k_out[bi, pl.ds(hi, 1), kh, pl.ds(half, half)] = k_hi
        v_out[bi, pl.ds(hi, 1), kh, :] = v_new

    def dot_t(a, b):
        return lax.dot_general(a, b, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)

    # Part 0 starts from the new token (slot hi, from registers), the others from nothing; then each walks its
    # share of the chunks of the cache's slots lo .. hi - 1 (every one of those chunks holds at least one of them,
    # so a part's maximum is finite after its first chunk).
    f32 = jnp.float32
    s_new = (jnp.sum(q_lo.astype(f32) * k_lo.astype(f32), axis=1) + jnp.sum(q_hi.astype(f32) * k_hi.astype(f32),
                                                                            axis=1)) * scale  # fmt: skip
    one = (1 - jnp.minimum(part, 1)).astype(f32)  # 1 for part 0, else 0 (no float constant in a select)
    init = (jnp.where(jnp.full((rows,), part) == 0, s_new, jnp.full((rows,), -jnp.inf, f32)),
            jnp.full((rows,), one, f32), jnp.broadcast_to(v_new.astype(f32) * one, (rows, d)))  # fmt: skip

    def step(c, carry):
        s0 = pl.multiple_of(c * chunk, chunk)
        ka = k_ref[bi, pl.ds(s0, chunk), kh, pl.ds(0, half)]  # (chunk, half)
        kb = k_ref[bi, pl.ds(s0, chunk), kh, pl.ds(half, half)]
        s = (dot_t(q_lo, ka) + dot_t(q_hi, kb)) * scale
        return _online(carry, s, v_ref[bi, pl.ds(s0, chunk), kh, :], s0, lo, hi - 1)

    c0 = lo // chunk
    end = jnp.where(hi > lo, (hi - 1) // chunk + 1, c0)
    share = (end - c0 + parts - 1) // parts
    m, total, acc = lax.fori_loop(c0 + part * share, jnp.minimum(c0 + (part + 1) * share, end), step, init)
    if parts == 1:
        o_ref = refs[-3]
        plgpu.store(o_ref.at[bi, pl.ds(start, rows), :], (acc / total[:, None]).astype(o_ref.dtype), mask=live)
    else:
        m_ref, t_ref, a_ref = refs[-5:-2]
        plgpu.store(m_ref.at[bi, part, pl.ds(start, rows)], m, mask=live1)
        plgpu.store(t_ref.at[bi, part, pl.ds(start, rows)], total, mask=live1)
        plgpu.store(a_ref.at[bi, part, pl.ds(start, rows), :], acc, mask=live)


@functools.partial(jax.jit, static_argnames=("scale", "chunk", "parts"))
def _step_pallas(qkv, cos, sin, k_cache, v_cache, lo, hi, *, scale, chunk, parts):
    from jax.experimental.pallas import triton as plgpu

    b, _, d = qkv.shape
    size, nk = k_cache.shape[1], k_cache.shape[2]
    heads = qkv.shape[1] - 2 * nk
    group = heads // nk
    rows = next_power_of_2(group, 16)
    out_heads = max(heads, rows)
    if out_heads != heads:  # fewer heads than a tile (small models): the q rows padded, the output sliced
        qkv = jnp.concatenate([jnp.pad(qkv[:, :heads], ((0, 0), (0, rows - heads), (0, 0))), qkv[:, heads:]], 1)
    # The walk reads the cache itself (aliased to the output: updated in place), or its copy in whole chunks.
    reads = _whole_chunks(k_cache, v_cache, chunk) or ()
    parts = min(parts, cdiv(size, chunk))
    if parts == 1:
        outs = (jax.ShapeDtypeStruct((b, out_heads, d), qkv.dtype),)
    else:  # each part's running maximum, total and weighted values, float32
        outs = (jax.ShapeDtypeStruct((b, parts, out_heads), jnp.float32),) * 2 + (
            jax.ShapeDtypeStruct((b, parts, out_heads, d), jnp.float32),)  # fmt: skip
    caches = (jax.ShapeDtypeStruct(k_cache.shape, k_cache.dtype), jax.ShapeDtypeStruct(v_cache.shape, v_cache.dtype))
    kernel = functools.partial(_step_kernel, heads=out_heads, group=group, rows=rows, chunk=chunk, scale=scale,
                               parts=parts)  # fmt: skip
    first = 5 + len(reads)
    *res, k_cache, v_cache = pl.pallas_call(
        kernel,
        grid=(b, nk, parts),
        out_shape=outs + caches,
        input_output_aliases={first: len(outs), first + 1: len(outs) + 1},
        compiler_params=plgpu.CompilerParams(
            num_warps=tuned.get("DECODE_STEP_WARPS"), num_stages=tuned.get("DECODE_STEP_STAGES")
        ),
        interpret=_dispatch.interpreting(),
        name="bs_decode_step_attention",
    )(lo, hi, qkv, cos.astype(jnp.float32), sin.astype(jnp.float32), *reads, k_cache, v_cache)
    if parts == 1:
        out = res[0]
    else:  # the parts' softmaxes rescaled to their common maximum (part 0's is finite: it holds the new token)
        m, total, acc = res
        w = jnp.exp(m - jnp.max(m, axis=1, keepdims=True))
        out = (jnp.sum(w[..., None] * acc, axis=1) / jnp.sum(w * total, axis=1)[..., None]).astype(qkv.dtype)
    return out[:, :heads], k_cache, v_cache


def default_parts(batch: int, kv_heads: int, size: int, chunk: int = CHUNK) -> int:
    """Parts per (sequence, kv head) that :func:`decode_step_attention` splits a walk into: enough programs for every
    multiprocessor of the GPU (one part off GPUs), at most one per chunk of the cache."""
    sms = hardware.current().num_sms
    return max(1, min(cdiv(size, chunk), sms // max(batch * kv_heads, 1)))


def decode_step_attention(qkv, cos, sin, k_cache, v_cache, lo, hi, *, scale: float | None = None,
                          parts: int | None = None):  # fmt: skip
    """A decoder layer's attention step for one new token per sequence, in one launch: rotary embedding, cache
    update, attention.

    Arguments:
        qkv: ``(batch, heads + 2 kv_heads, head_dim)``: the new token's projected queries, key and value in that
            order (a fused q/k/v projection's output, reshaped), before the rotary embedding.
        cos, sin: ``(batch, head_dim)``: the new token's rotary angles (``rotate_half`` layout: the rotated pair of
            element ``i`` is ``i + head_dim / 2``).
        k_cache, v_cache: ``(batch, size, kv_heads, head_dim)``: the cache, keys stored rotated.
        lo, hi: ``(batch,)`` int32: the first slot each sequence attends to and the new token's slot (``lo <= hi <
            size``); the slots ``lo .. hi - 1`` are read, slot ``hi`` written.
        scale: the scores' scale (default ``1 / sqrt(head_dim)``).
        parts: split each sequence's walk over the cache into this many programs per kv head, whose softmaxes XLA
            then combines (flash-decoding; one more small launch). ``None``: :func:`default_parts`, enough programs
            to occupy every multiprocessor (a batch of one has a program per kv head only, each walking the whole
            cache).

    Returns ``(out (batch, heads, head_dim), k_cache, v_cache)``: the attention of the rotated queries on slots
    ``lo .. hi`` (grouped-query: head ``h`` reads kv head ``h // (heads // kv_heads)``), and the caches with the
    rotated key and the value at slot ``hi``. Under ``jit``, where the old cache is not used again, the caches are
    updated in place; called eagerly, XLA copies them first. On a CUDA GPU (or under :func:`blocksparse.interpret`)
    one Pallas kernel for head dimensions that are powers of two from 32; elsewhere
    :func:`decode_step_attention_reference`. Forward only. A cache whose size is not a multiple of :data:`CHUNK`
    is padded for the walk, a copy on every call.

    >>> import jax, jax.numpy as jnp
    >>> qkv = jax.random.normal(jax.random.key(0), (2, 4 + 2 * 2, 32))
    >>> angles = jnp.full((2, 32), 0.1)
    >>> cache = jnp.zeros((2, 64, 2, 32))
    >>> out, k_cache, v_cache = decode_step_attention(qkv, jnp.cos(angles), jnp.sin(angles), cache, cache,
    ...                                               jnp.array([0, 5]), jnp.array([9, 9]))
    >>> out.shape, bool((v_cache[:, 9] == qkv[:, 6:]).all())
    ((2, 4, 32), True)
    """
    heads = _check_step(qkv, cos, sin, k_cache, v_cache, lo, hi)
    scale = 1 / math.sqrt(qkv.shape[-1]) if scale is None else float(scale)
    lo, hi = jnp.asarray(lo, jnp.int32), jnp.asarray(hi, jnp.int32)
    if parts is None:
        parts = default_parts(qkv.shape[0], k_cache.shape[2], k_cache.shape[1])
    else:
        check_positive_int(parts, "parts", hint=" (or None)")
    if _dispatch.pallas_takes_width(qkv.shape[-1], 32):
        return _step_pallas(qkv, cos, sin, k_cache, v_cache, lo, hi, scale=scale, chunk=CHUNK, parts=parts)
    return _step_xla(qkv, cos, sin, k_cache, v_cache, lo, hi, heads, scale)
