"""Few-token products at the memory limit: ``x @ W`` and ``W @ x`` when the dense operand has a handful of
rows (``x @ W``) or columns (``W @ x``), as in decoding.

With ``n`` tokens of ``K`` features, the product reads ``W``'s kept blocks once and does ``2 n`` flops per
weight: its time is the time to stream the blocks from HBM. The work-list kernels of :mod:`.kernels` spend it
elsewhere at such sizes: ``x`` padded to 16 rows by XLA, one program per block column whatever the SM count,
split columns summed by a second kernel, then a slice: four launches around a kernel of a few microseconds.

This kernel is one launch. Program ``p`` owns one *sub-tile* of one output block: ``tile`` of the block's
columns (``x @ W``) or rows (``W @ x``), so that a matrix with fewer output blocks than SMs still spreads over
all of them (a 14336 x 4096 ``W`` of 64 x 64 blocks has 64 block columns: two sub-tiles of 32 give 128
programs). It walks every kept block of its block column (row), ``group`` blocks per loop step so that
enough bytes are in flight, reads the ``tile``-wide slice of each block and the matching slab of the dense
operand (the ``n`` tokens padded to 16 in registers by a masked load, never in memory), accumulates in
float32 and stores its ``n`` rows (columns) once, the epilogue and the cast fused. No partials, no atomics:
deterministic, one launch.

Split walks (``TritonConfig(stream_split=)``, or the plan where ``TRITON_STREAM_SPLIT_MIN_BLOCKS`` allows): each
sub-tile's walk is cut into parts, one program each. A part writes its float32 partial to a scratch output and
counts itself on a per-sub-tile counter (an ``atomic_add`` on int32 counters zeroed for the call); the part
that counts last sums every part's partial in part order and stores the output with the epilogue. Still one
launch, still deterministic (the same sum whichever part finishes last).

- ``x @ W`` (:func:`dds`): the block columns of ``W`` through the pattern's cached transpose (``W``'s values
  read in place); acc ``(nr, tile) += x[:, slab] @ W_block[:, sub-tile]``.
- ``W @ x`` (:func:`dsd`): ``W``'s block rows in storage order; acc ``(tile, nr) += W_block[sub-tile, :] @
  x[slab, :]``. The sub-tile is ``tile`` contiguous rows of the block: one contiguous read.

Gated (a GLU epilogue, :func:`gates`): the output block ``u`` of the first half walks block column (row) ``u`` of
``W`` for the gate and ``u + units / 2`` for the value side by side (a block of each per step, the shorter
walk's steps past its end masked), one accumulator each, and stores ``activation(gate) * value``: SwiGLU's gate
and up projections in one launch, their product never in memory. Where the tuned table measured it slower than
the product followed by the gate in XLA (the H200), it runs only when asked (:func:`gates_in_store`).

Gated input (``input_glu``, :func:`gates_in_load`): ``x``'s contracted dimension holds a GLU's two halves; each step
loads a slab of both and multiplies ``activation(gate) * value`` (float32, rounded to ``x``'s dtype), so SwiGLU's
down projection reads the gate/up product's output directly and no gated copy is written.

One token on the CUDA cores (``TritonConfig(stream_fma=True)``, or the tuned ``TRITON_STREAM_FMA``): no padding to
16 rows and no dot; each step adds ``x``'s slab times the block, elementwise in float32, to an accumulator of the
block's shape, summed over the contracted side once before the store.

Which products take it is :func:`takes` (the tuned tables ``TRITON_STREAM_DDS_SPEEDUP`` / ``_DSD_SPEEDUP``:
where it measured at least as fast as the work list, whose kernel alone is faster on long rows of few output
blocks: one program per SM then walks 30 to 110 blocks one after another) unless ``TritonConfig(stream=)``
says; its tile, group and launch parameters come from the config where set, else from :func:`plan`.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from .... import hardware
from ...._pattern import BlockPattern
from ...._util import next_power_of_2
from .. import epilogue as _epilogue
from .. import tuned
from ..schedule import kernel_constant
from .common import TritonConfig, _bias_operand, _dot, _finish, _interpret, _pallas_call, _params, _split_refs

__all__ = ["StreamPlan", "dds", "dsd", "gates", "gates_in_store", "gates_in_load", "plan", "takes"]


@dataclasses.dataclass(frozen=True)
class StreamPlan:
    """How the stream kernel runs one product (host facts, hashable).

    Attributes:
        tile: the sub-tile: columns (``x @ W``) or rows (``W @ x``) of an output block per program.
        group: blocks read per loop step.
        rows: the tokens padded to a power of two >= 16 (the accumulator's short side; held in registers).
        programs: output blocks times sub-tiles (the launch has ``programs * split``; gated, the output has half
            the blocks, each two walks).
        split: parts each sub-tile's walk is cut into (``1``: none).
        num_warps, num_stages: Triton launch parameters.
        fma: one token multiplied on the CUDA cores (``rows`` is then 1): each step adds the block's elementwise
            products to a float32 block-shaped accumulator, summed over the contracted side once, before the store.
    """

    tile: int
    group: int
    rows: int
    programs: int
    split: int
    num_warps: int
    num_stages: int
    fma: bool = False


def takes(op: str, n: int, pattern: BlockPattern, config: TritonConfig | None) -> bool:
    """Whether ``op`` (``"dds"``: ``x @ W``, ``"dsd"``: ``W @ x``) with ``n`` tokens runs the stream kernel:
    ``config.stream`` where set; else for square blocks, ``0 < n <=`` the tuned ``TRITON_STREAM_MAX_N`` and the
    nearest cell of ``TRITON_STREAM_DDS_SPEEDUP`` / ``TRITON_STREAM_DSD_SPEEDUP`` (by block and contracted
    dimension) at least 1: a tie goes to the kernel of one launch. A device nobody measured has no cell."""
    if config is not None and config.stream is not None:
        return bool(config.stream)
    t = tuned.current()
    bh, bw = pattern.block_size
    if bh != bw or not 0 < n <= t.TRITON_STREAM_MAX_N or pattern.nnz_blocks == 0:
        return False
    table, k = (t.TRITON_STREAM_DDS_SPEEDUP, pattern.shape[0]) if op == "dds" else (t.TRITON_STREAM_DSD_SPEEDUP,
                                                                                      pattern.shape[1])  # fmt: skip
    return tuned.nearest_cell(table, bh, k, pattern.density) >= 1.0


def _units(op: str, pattern: BlockPattern) -> int:
    """The output blocks of ``op``: ``W``'s block columns for ``x @ W``, its block rows for ``W @ x``."""
    return pattern.grid[1] if op == "dds" else pattern.grid[0]


def gates(op: str, pattern: BlockPattern) -> bool:
    """Whether the kernel can gate ``op``'s output (a GLU): an even number of output blocks (block columns of ``W``
    for ``x @ W``, block rows for ``W @ x``), so that the halves meet at a block boundary."""
    return _units(op, pattern) % 2 == 0


def gates_in_store(op: str, n: int, pattern: BlockPattern, config: TritonConfig | None) -> bool:
    """Whether a gated ``op`` with ``n`` tokens gates in this kernel's store: it :func:`takes` the product, the halves
    meet at a block boundary (:func:`gates`), and ``config.stream`` asks for the kernel or the tuned
    ``TRITON_STREAM_GATES`` says the store is faster than the product followed by the gate."""
    if not (takes(op, n, pattern, config) and gates(op, pattern)):
        return False
    return (config is not None and config.stream is True) or bool(tuned.current().TRITON_STREAM_GATES)


def gates_in_load(op: str, n: int, pattern: BlockPattern, config: TritonConfig | None) -> bool:
    """Whether ``op`` with ``n`` tokens and an input gate (``input_glu``) gates where this kernel loads ``x``: it
    :func:`takes` the product, and ``config.stream`` asks for the kernel or the tuned ``TRITON_STREAM_GATES_INPUT``
    says the load's gate is faster than the gate in XLA before the product."""
    if not takes(op, n, pattern, config):
        return False
    return (config is not None and config.stream is True) or bool(tuned.current().TRITON_STREAM_GATES_INPUT)


#: The share of a CTA's shared memory the pipelined loads may take (Triton keeps a buffer per stage of every load
#: feeding a dot; the epilogue's layout conversion needs some of the rest).
SMEM_SHARE = 3 / 4


def plan(op: str, pattern: BlockPattern, n: int, config: TritonConfig | None = None, itemsize: int = 2,
         glu: bool = False, gated_input: bool = False) -> StreamPlan:  # fmt: skip
    """The stream kernel's plan for ``op`` (``"dds"``: ``x @ W``, ``"dsd"``: ``W @ x``) with ``n`` tokens of
    ``itemsize`` bytes (``glu``: gated, half the output blocks, each two walks; ``gated_input``: two slabs of ``x``
    a block, gate and value).

    The sub-tile is the widest (at most the block) that still gives every SM :data:`~..tuned`
    ``TRITON_STREAM_PROGRAMS_PER_SM`` programs, and never below ``TRITON_STREAM_MIN_TILE``; the config's
    ``tn`` (``x @ W``) or ``tb`` (``W @ x``) overrides it. Where even that leaves fewer programs than wanted, each
    sub-tile's walk is split into as many parts as make up the difference, each of at least
    ``TRITON_STREAM_SPLIT_MIN_BLOCKS`` blocks on average (the config's ``stream_split`` overrides). One token
    multiplies on the CUDA cores where the config's ``stream_fma`` or else ``TRITON_STREAM_FMA`` says. Blocks per
    step and stages (config, else the tuned table's) are halved, blocks first, until the pipelined loads fit
    :data:`SMEM_SHARE` of the device's shared memory per CTA."""
    t = tuned.current()
    cfg = config or TritonConfig()
    bh, bw = pattern.block_size
    side = bw if op == "dds" else bh
    units = _units(op, pattern) // (2 if glu else 1)
    forced = cfg.tn if op == "dds" else cfg.tb
    want = t.TRITON_STREAM_PROGRAMS_PER_SM * hardware.gpu().num_sms
    if forced is not None:
        tile = min(int(forced), side)
    else:
        tile = side
        while tile > t.TRITON_STREAM_MIN_TILE and units * (side // tile) < want:
            tile //= 2
    programs = units * (side // tile)
    split = cfg.stream_split
    if split is None:  # still too few programs: cut each walk into parts of at least the tuned blocks
        mean = pattern.nnz_blocks / units
        split = max(1, min(-(-want // programs), int(mean // t.TRITON_STREAM_SPLIT_MIN_BLOCKS)))
    fma = n == 1 and bool(t.TRITON_STREAM_FMA if cfg.stream_fma is None else cfg.stream_fma)
    rows = 1 if fma else next_power_of_2(n, 16)
    group = cfg.stream_group or t.TRITON_STREAM_GROUP
    stages = cfg.num_stages or t.TRITON_STREAM_STAGES[min(bh, bw)]
    contracted = bh if op == "dds" else bw
    slabs = 2 if gated_input else 1
    step = (tile * contracted + slabs * rows * contracted) * itemsize  # one block's slice and its slab(s) of x
    budget = SMEM_SHARE * (hardware.gpu().smem_per_block or hardware.PLANNING_DEFAULT.smem_per_block)
    while group * stages * step > budget and (group > 1 or stages > 2):
        if group > 1:
            group = max(1, group // 2)
        else:
            stages -= 1
    return StreamPlan(
        tile=tile,
        group=group,
        rows=rows,
        programs=programs,
        split=int(split),
        num_warps=cfg.num_warps or t.TRITON_STREAM_WARPS[min(bh, bw)],
        num_stages=stages,
        fma=fma,
    )


@functools.lru_cache(maxsize=256)
def _walk(pattern: BlockPattern, op: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(start, kblock, block_id)``: for each output block (a block column of ``W`` for ``dds``, a block row for
    ``dsd``) the offset of its blocks, then per block the contracted block index and the block's position in
    ``data``."""
    if op == "dds":
        t, perm = pattern.transpose()
        return np.asarray(t.indptr, np.int32), np.asarray(t.cols, np.int32), np.asarray(perm, np.int32)
    ids = np.arange(pattern.nnz_blocks, dtype=np.int32)
    return np.asarray(pattern.indptr, np.int32), np.asarray(pattern.cols, np.int32), ids


def _kernel(start_ref, kb_ref, id_ref, w_ref, x_ref, *refs, op, bh, bw, tile, rows, n, nnz, group, split, exact, epi,
            half, gate, value_offset, fma, ordered):  # fmt: skip
    """Program ``p``: part ``p // Q`` of sub-tile ``p % Q`` (``Q`` sub-tiles), which is sub-tile ``q % sub`` of
    output block ``q // sub`` (see the module docstring); gated (``half``: the output blocks, half of ``W``'s),
    also of output block ``q // sub + half`` for the value. ``gate``: an input gate (``x``'s contracted dimension is
    twice ``W``'s: each slab is gated with its value slab ``value_offset`` further on as it is loaded). ``nnz``: the
    blocks (the index arrays hold two unread trailing elements past them). ``fma``: one token, its slab one row
    (column) of ``x``, each step's products added elementwise to a block-shaped accumulator summed once by
    ``reduce``. ``ordered``: ``x @ W`` with ``W``'s blocks given in walk order (block ``j`` of the walks is
    ``data[j]``: no index load before a block's; see :func:`dds`)."""
    from jax.experimental.pallas import triton as plgpu

    if split > 1:
        refs = refs[:-4] + refs[-3:]  # the zeroed counters' input: the last output is the same buffer
        bias_ref, (y_ref, part_ref, count_ref) = _split_refs(refs, epi)
    else:
        bias_ref, (y_ref,) = _split_refs(refs, epi)
    side = bw if op == "dds" else bh
    sub = side // tile
    p = pl.program_id(0)
    nq = pl.num_programs(0) // split
    q, part = p % nq, p // nq
    u = q // sub
    t0 = pl.multiple_of((q % sub) * tile, tile)

    def slab(view, start, size):  # x's slab at `start` (`size` along the contracted axis), gated where asked
        first = pl.ds(pl.multiple_of(start, size), size)
        load = lambda at: plgpu.load(view(at)) if live is None else plgpu.load(view(at), mask=live, other=0)  # noqa: E731
        if gate is None:
            return load(first)
        value = load(pl.ds(pl.multiple_of(start + value_offset, size), size))
        return _epilogue.gated_pair(load(first), value, gate.activation).astype(x_ref.dtype)

    if fma:  # one token: its slab one row (column) of x, no mask (it exists), no dot
        live = None
    if op == "dds":  # acc (rows, tile): tokens x output columns
        if not fma:
            live = lax.broadcasted_iota(jnp.int32, (rows, bh), 0) < n

        def step(j, acc):
            r, d = kb_ref[j], (j if ordered else id_ref[j])
            w = w_ref[pl.ds(pl.multiple_of(d * bh, bh), bh), pl.ds(t0, tile)]  # (bh, tile)
            if fma:  # (bh, tile) += x[0, slab] as a column * W_block
                xs = slab(lambda at: x_ref.at[pl.ds(0, 1), at], r * bh, bh)
                return acc + xs.astype(jnp.float32).reshape(bh, 1) * w.astype(jnp.float32)
            xs = slab(lambda at: x_ref.at[pl.ds(0, rows), at], r * bh, bh)
            return acc + _dot(xs, w, exact=exact)

        shape, acc_shape = (rows, tile), ((bh, tile) if fma else (rows, tile))
    else:  # acc (tile, rows): output rows x tokens
        if not fma:
            live = lax.broadcasted_iota(jnp.int32, (bw, rows), 1) < n

        def step(j, acc):
            c, d = kb_ref[j], j  # W's blocks in storage order: block j of the walk is data[j] (no index to load)
            w = w_ref[pl.ds(pl.multiple_of(d * bh + t0, tile), tile), :]  # (tile, bw)
            if fma:  # (tile, bw) += W_block * x[slab, 0] as a row
                xs = slab(lambda at: x_ref.at[at, pl.ds(0, 1)], c * bw, bw)
                return acc + w.astype(jnp.float32) * xs.astype(jnp.float32).reshape(1, bw)
            xs = slab(lambda at: x_ref.at[at, pl.ds(0, rows)], c * bw, bw)
            return acc + _dot(w, xs, exact=exact)

        shape, acc_shape = (tile, rows), ((tile, bw) if fma else (tile, rows))

    def reduce(acc):  # the accumulator as the output tile (fma: summed over the contracted side)
        if not fma:
            return acc
        return jnp.sum(acc, axis=0)[None, :] if op == "dds" else jnp.sum(acc, axis=1)[:, None]

    def bounds(u):  # this part of output block u's walk: its first block and length
        start = start_ref[u]
        length = start_ref[u + 1] - start
        if split > 1:  # this part's share of the walk
            chunk = (length + split - 1) // split
            start = start + jnp.minimum(part * chunk, length)
            length = jnp.minimum(chunk, start_ref[u + 1] - start)
        return start, length

    def walk(u):  # output block u's walk (this part of it), summed
        start, length = bounds(u)

        def grouped(i, acc):
            j = start + i * group
            for g in range(group):
                acc = step(j + g, acc)
            return acc

        full = length // group
        acc = lax.fori_loop(0, full, grouped, jnp.zeros(acc_shape, jnp.float32))
        return reduce(lax.fori_loop(start + full * group, start + length, step, acc))

    def walks(u, v):  # gated: the walks of output blocks u and v side by side, a block of each per step
        (su, lu), (sv, lv) = bounds(u), bounds(v)
        last = nnz - 1  # the last block: a step past a walk's end reads a real block (its product dropped)

        def one(start, length, i, acc):  # block i of a walk; past its end a block in range, its product dropped
            part = step(jnp.minimum(start + i, last), jnp.zeros(acc_shape, jnp.float32))
            return acc + jnp.where(i < length, part, 0.0)

        def both(i, accs):
            return one(su, lu, i, accs[0]), one(sv, lv, i, accs[1])

        def grouped(i, accs):
            for g in range(group):
                accs = both(i * group + g, accs)
            return accs

        longest = jnp.maximum(lu, lv)
        full = longest // group
        zero = jnp.zeros(acc_shape, jnp.float32)
        accs = lax.fori_loop(0, full, grouped, (zero, zero))
        return tuple(map(reduce, lax.fori_loop(full * group, longest, both, accs)))

    # The accumulators: the output block's, and gated the value's (output block u + half of W).
    accs = (walk(u),) if half is None else walks(u, u + half)

    def store(accs):
        if op == "dds":
            at = lambda v: (0, (u + v) * bw + t0)  # noqa: E731
            y = y_ref.at[pl.ds(0, rows), pl.ds(u * bw + t0, tile)]
            keep = lax.broadcasted_iota(jnp.int32, shape, 0) < n
        else:
            at = lambda v: ((u + v) * bh + t0, 0)  # noqa: E731
            y = y_ref.at[pl.ds(u * bh + t0, tile), pl.ds(0, rows)]
            keep = lax.broadcasted_iota(jnp.int32, shape, 1) < n
        out = _finish(accs[0], epi, bias_ref, *at(0), shape)
        if half is not None:  # gated: activation(gate + bias) * (value + its bias)
            out = out * _finish(accs[1], _epilogue.Epilogue(None, epi.bias, epi.bias_axis), bias_ref, *at(half), shape)
        plgpu.store(y, out.astype(y_ref.dtype), mask=keep)

    if split == 1:
        store(accs)
        return
    # Split: publish the partials, count the parts done; the last one sums all parts in part order (the same
    # sum whichever part finishes last) and stores. The barrier orders every thread's partial before the
    # counter's release; the counter's acquire and the volatile loads order the sum after the other parts'.
    height, na = shape[0], len(accs)
    for a, acc in enumerate(accs):
        part_ref[pl.ds(((part * nq + q) * na + a) * height, height), :] = acc
    if not _interpret():
        plgpu.debug_barrier()
    done = plgpu.atomic_add(count_ref, (q,), jnp.int32(1))

    @pl.when(done == split - 1)
    def _():
        totals = []
        for a in range(na):
            total = jnp.zeros(shape, jnp.float32)
            for k in range(split):
                view = part_ref.at[pl.ds(((k * nq + q) * na + a) * height, height), :]
                total = total + (view[...] if _interpret() else plgpu.load(view, volatile=True))
            totals.append(total)
        store(totals)


def _call(op, pattern, data, x, out_dtype, n, out_shape, *, exact, config, epi, bias, gate, ordered=False):
    bh, bw = pattern.block_size
    if pattern.nnz_blocks == 0:  # the epilogue of a zero product (W's whole width: gated, halved again)
        full = (n, pattern.shape[1]) if op == "dds" else (pattern.shape[0], n)
        return _epilogue.reference(jnp.zeros(full, jnp.float32), bias, epi, out_dtype)
    glu = epi is not None and epi.glu
    pl_ = plan(op, pattern, n, config, jnp.dtype(x.dtype).itemsize, glu=glu, gated_input=gate is not None)
    start, kb, ids = _walk(pattern, op)
    units = _units(op, pattern)
    kernel = functools.partial(_kernel, op=op, bh=bh, bw=bw, tile=pl_.tile, rows=pl_.rows, n=n, group=pl_.group,
                               split=pl_.split, exact=exact, epi=epi, half=units // 2 if glu else None, gate=gate,
                               value_offset=pattern.shape[0] if op == "dds" else pattern.shape[1],
                               nnz=pattern.nnz_blocks, fma=pl_.fma, ordered=ordered)  # fmt: skip
    # the bias runs along W's blocks (read a sub-tile at a time) or along the n tokens (read ``rows`` at a time)
    along_tokens = epi is not None and (op == "dds") == (epi.bias_axis == 0)
    b1 = _bias_operand(bias, epi, max(n, pl_.rows) if along_tokens else pattern.shape[1 if op == "dds" else 0])
    name = f"bs_{op}_stream_{bh}x{bw}_t{pl_.tile}_g{pl_.group}" + (f"_s{pl_.split}" if pl_.split > 1 else "")
    name += ("_glu" if glu else "_epi") if epi is not None else ""
    name += "_gated_x" if gate is not None else ""
    name += "_fma" if pl_.fma else ""
    name += "_ordered" if ordered else ""
    args = (kernel_constant(start), kernel_constant(kb), kernel_constant(ids), data.reshape(-1, bw), x, *b1)
    y = jax.ShapeDtypeStruct(out_shape, out_dtype)
    if pl_.split == 1:
        out_shapes, aliases = y, {}
    else:
        rows, cols = (pl_.rows, pl_.tile) if op == "dds" else (pl_.tile, pl_.rows)
        out_shapes = (y, jax.ShapeDtypeStruct(((1 + glu) * pl_.split * pl_.programs * rows, cols), jnp.float32),
                      jax.ShapeDtypeStruct((pl_.programs,), jnp.int32))  # fmt: skip
        args, aliases = args + (jnp.zeros((pl_.programs,), jnp.int32),), {len(args): 2}
    out = _pallas_call(
        kernel,
        grid=(pl_.programs * pl_.split,),
        out_shape=out_shapes,
        input_output_aliases=aliases,
        compiler_params=_params(pl_.num_warps, pl_.num_stages),
        interpret=_interpret(),
        name=name,
    )(*args)
    return out if pl_.split == 1 else out[0]


def _gated(op: str, pattern: BlockPattern, epi) -> int:
    """The output's features: ``W``'s (``x @ W``: columns, ``W @ x``: rows), half where ``epi`` is gated (then a
    ``ValueError`` unless :func:`gates`)."""
    features = pattern.shape[1] if op == "dds" else pattern.shape[0]
    if epi is None or not epi.glu:
        return features
    if not gates(op, pattern):
        raise ValueError(f"Expected an even number of output blocks to gate (a GLU). Got {_units(op, pattern)}.")
    return features // 2


def _contracted(op: str, pattern: BlockPattern, x, gate) -> None:
    """A ``ValueError`` unless ``x``'s contracted dimension is ``W``'s (twice it with an input ``gate``: two halves)."""
    k = pattern.shape[0] if op == "dds" else pattern.shape[1]
    got = x.shape[1] if op == "dds" else x.shape[0]
    want = k if gate is None else 2 * k
    if got != want:
        raise ValueError(f"Expected x's contracted dimension {want} (W is {pattern.shape}"
                         f"{', gated input' if gate is not None else ''}). Got {got} (x {x.shape}).")  # fmt: skip


def dds(x, pattern: BlockPattern, data, out_dtype, *, exact: bool = False, config: TritonConfig | None = None,
        epi=None, bias=None, gate=None, ordered: bool = False):  # fmt: skip
    """``x @ W`` (``x``: ``(n, K)``, few rows) in one launch; ``data`` and ``x`` of one supported dtype. ``gate``: an
    :class:`~..epilogue.InputGate`, ``x`` then ``(n, 2 K)``, gated as each slab is loaded. ``ordered``: ``data`` holds
    ``W``'s blocks in walk order, block column after block column (``data[pattern.transpose()[1]]``), so that a step
    reads its block with no index load first: what a column-ordered storage of ``W`` would give (the decode suite's
    ``layers`` cells measure it; no layer stores its weight so)."""
    _contracted("dds", pattern, x, gate)
    n, features = x.shape[0], _gated("dds", pattern, epi)
    if n == 0:
        return jnp.zeros((0, features), out_dtype)
    return _call("dds", pattern, data, x, out_dtype, n, (n, features), exact=exact, config=config, epi=epi,
                 bias=bias, gate=gate, ordered=ordered)  # fmt: skip


def dsd(pattern: BlockPattern, data, x, out_dtype, *, exact: bool = False, config: TritonConfig | None = None,
        epi=None, bias=None, gate=None):  # fmt: skip
    """``W @ x`` (``x``: ``(K, n)``, few columns) in one launch; ``data`` and ``x`` of one supported dtype. ``gate``: an
    :class:`~..epilogue.InputGate`, ``x`` then ``(2 K, n)``, gated as each slab is loaded."""
    _contracted("dsd", pattern, x, gate)
    n, features = x.shape[1], _gated("dsd", pattern, epi)
    if n == 0:
        return jnp.zeros((features, 0), out_dtype)
    return _call("dsd", pattern, data, x, out_dtype, n, (features, n), exact=exact, config=config, epi=epi,
                 bias=bias, gate=gate)  # fmt: skip
