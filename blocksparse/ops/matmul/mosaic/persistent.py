"""Persistent variants of the Mosaic GPU ``dsd`` and ``dds`` kernels: one program per SM walks a list of items.

:func:`.dsd.dsd` runs it with ``MosaicConfig(persistent=True)`` (verified on an H200, and the
default where :func:`.backend.dsd_persistent` says so: measured faster, or the pattern :func:`.dsd.skewed`);
:func:`.dds.dds` with
``DdsConfig(persistent=True)`` (the same kernel with the operands of ``x @ W``: ``x``'s row slab times
W's block; verified on an H200 too, and the default where :func:`.backend.dds_persistent` says
so). The default kernel of
:mod:`.dsd` launches one program per ``(unit, column tile)`` *item* and runs its shared-memory
pipeline once per item: it fills, runs ``len`` steps and drains. At density 1/64 a unit holds one or
two blocks, so most of each program is the fill (a TMA copy's latency with nothing to overlap) and the
store. Here a fixed number of programs (by default as many as fit on the GPU's SMs at once) each
take a list of items, and the pipeline runs across item boundaries: the copies of the next item's
first blocks are in flight while the current item's last wgmma runs and its tile is stored.

The schedule
------------
From the same :class:`~..schedule.RowSplitSchedule` (units of at most ``max_len`` blocks of one output
block row, split rows written to float32 partials and summed afterwards), the host (NumPy; the work list and
the dealing below are both cached) orders the ``units x tiles`` items in the launch order of
:class:`~.dsd.MosaicConfig` ``grid_order`` and deals them, in that order, each to the program
with the fewest steps so far (ties: the lowest id; for items of equal length this is round-robin), so
the programs running at once work on neighbouring items, as the launch order of the default kernel
does, and no program holds much more than its share. Rows are split into units only where one would
be longer than a program's share of all steps (see "Split rows"). It then flattens each program's items into *steps*
(one W block times one ``bw x tn`` slab of ``x``): ``step_id``, ``step_col`` and ``step_tile`` say which
block, which block row of ``x`` and which column tile; ``item_len``, ``item_dest`` and ``item_tile`` say
how many steps an item has and where its tile goes. The kernel reads these as scalars from global
memory, as the default kernel reads its unit table.

The kernel
----------
Program ``p`` holds ``stages`` shared-memory stages (W block + ``x`` slab each, 128-byte swizzle) and one
staging tile for the output (plus a float32 one where XLA sums split rows, see below).
Its steps are numbered ``g = 0 .. total - 1`` across all its items: step ``g`` waits for
stage ``g % stages``, issues the wgmma, waits until at most one wgmma is pending and refills the stage
of step ``g - 1`` with step ``g + stages - 1``, *whichever item that step belongs to*. When an item's
last step is issued, the program waits for its wgmmas, waits until the previous item's TMA store has
read the staging tile, writes the float32 accumulator (cast) there and starts the TMA store without
waiting for it. Items of length 0 (empty block rows) store zeros.

Split rows
----------
A row longer than a program's share is split into pieces (units) that different programs run. By default
(``reduce="kernel"`` in the configs) they are summed in the kernel, stream-K style: the row's last unit is
its *owner*; for each column tile the other pieces store their float32 accumulator straight from registers
to a partial slot in global memory (compact: one slot per piece that is not an owner, a row's slots
contiguous) and signal the tile's semaphore (``red.release.gpu`` after a warpgroup barrier); the owner
polls until the semaphore holds its ``wait`` signals (Pallas zero-fills the semaphores on every call), adds
the slots ``item_src .. item_src + wait - 1`` to its accumulator (plain loads in the wgmma layout, ordered
after the pieces' stores by the release / acquire pair) and stores the row's tile once, in the output dtype.
There is no float32 staging tile and no XLA sum after the kernel.

An owner waits for other programs, so this is deadlock-free only if (1) every program is resident at once
(the default count is the resident slots, counted conservatively on the device's SMs; :func:`plan_persistent`
falls back to XLA's sum where a forced ``programs`` exceeds them, and ``reduce="kernel"`` then raises; CUDA
does not promise co-residency without a cooperative launch, so kernels of other streams holding SMs, or an
MPS share of the GPU, are outside this guarantee) and (2) no program waits before it has
run every piece it owes others: each program runs its pieces first, then its whole rows, then its owners
(the sort in :func:`flatten`). A waiting owner then waits only for pieces that their programs reach
without waiting. Pallas' GPU interpreter has no semaphores: there (``reduce=None``) and with
``reduce="xla"`` every piece, owners included, goes through a float32 staging tile to a partial slot and
XLA sums them after the kernel; that tile costs shared memory, so 128 x 128 tiles drop from 3 stages to 2.

Not supported here (``NotImplementedError``; :func:`.dsd.dsd` then needs the default kernel):
the fused epilogue and two consumer warpgroups.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from .... import hardware
from ..schedule import RowSplitSchedule, kernel_constant
from .common import consume, operand_transforms, pipeline_stages

__all__ = [
    "REDUCTIONS",
    "PersistentSchedule",
    "default_programs",
    "flatten",
    "launch",
    "plan_persistent",
    "roles",
    "share",
]


@dataclasses.dataclass(frozen=True, eq=False)
class PersistentSchedule:
    """Each program's items and steps (see the module docstring); NumPy int32 arrays.

    Attributes:
        programs: the number of programs ``P``.
        prog_item_start: ``[P + 1]``; program ``p``'s items are ``[prog_item_start[p], prog_item_start[p + 1])``.
        prog_step_start: ``[P + 1]``; likewise for steps.
        item_len, item_dest, item_tile: ``[Q]``, one per (unit, column tile) item.
        step_id, step_col, step_tile: ``[max(G, 1)]``, one per step (``G = nnz * tiles``).
        reduce: split rows are summed in the kernel (see "Split rows"); ``False``: every piece writes its
            float32 partial (slot ``-1 - item_dest``) and XLA sums them afterwards.
        item_sem, item_wait, item_src: ``[Q]``: the semaphore of a piece of a split row (``-1``: a whole row,
            and every item without ``reduce``); how many pieces an owner waits for (0: none); the first partial
            slot an owner adds.
        num_slots: partial tiles written per column tile (``reduce``: the pieces that are not owners;
            else the schedule's ``num_partials``); num_sems: semaphores (split rows x column tiles).
    """

    programs: int
    prog_item_start: np.ndarray
    prog_step_start: np.ndarray
    item_len: np.ndarray
    item_dest: np.ndarray
    item_tile: np.ndarray
    step_id: np.ndarray
    step_col: np.ndarray
    step_tile: np.ndarray
    item_sem: np.ndarray
    item_wait: np.ndarray
    item_src: np.ndarray
    num_slots: int
    reduce: bool = False
    num_sems: int = 0

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, np.ndarray):
                value.setflags(write=False)  # shared by every plan the cache of flatten returns it to

    @property
    def num_steps(self) -> int:
        return int(self.prog_step_start[-1])

    def max_steps_per_program(self) -> int:
        return int(np.diff(self.prog_step_start).max(initial=0))


#: Shared memory a CTA holds besides its scratch: 1 KiB reserved by CUDA, and up to 1 KiB of Mosaic GPU's
#: barriers and alignment (a 57344-byte kernel needs 57392 bytes: 3 fit in an SM's 228 KiB, not 4).
CTA_SMEM_OVERHEAD = 2048
#: The most CTAs of these kernels an SM is counted to hold where owners wait for other programs: a warpgroup of
#: 128 threads uses at most 255 registers a thread, so 2 always fit in 64 K registers; 3 or more would need a
#: register count nobody checks.
MAX_RESIDENT_PER_SM = 2


def default_programs(smem_bytes: int, items: int, num_sms: int | None = None, smem_per_sm: int | None = None,
                     max_per_sm: int | None = None):  # fmt: skip
    """As many programs as are resident on the SMs at once (by shared memory, :data:`CTA_SMEM_OVERHEAD` per CTA
    counted; at most ``max_per_sm`` an SM), and no more than there are items. ``num_sms``, ``smem_per_sm``:
    default :func:`blocksparse.hardware.gpu`'s."""
    dev = hardware.gpu()
    per_sm = max(1, (smem_per_sm or dev.smem_per_sm) // (smem_bytes + CTA_SMEM_OVERHEAD))
    if max_per_sm is not None:
        per_sm = min(per_sm, max_per_sm)
    return max(1, min(items, (num_sms or dev.num_sms) * per_sm))


def _deal(lengths: np.ndarray, programs: int) -> np.ndarray:
    """The program of each item, dealt in order to the least-loaded program (ties: the lowest id). An item
    of length 0 still costs a store: it counts as one step."""
    heap = [(0, p) for p in range(programs)]
    out = np.empty(lengths.shape[0], np.int64)
    for i, n in enumerate(np.maximum(lengths, 1).tolist()):
        load, p = heapq.heappop(heap)
        out[i] = p
        heapq.heappush(heap, (load + n, p))
    return out


#: Rows are never split into pieces shorter than this (a tiny product's partials and their sum would cost more
#: than the balance they buy), as :class:`~..schedule.GpuLowering` ``min_len``.
MIN_SPLIT = 4


def share(nnz: int, tiles: int, programs: int) -> int:
    """A program's share of all steps (at least :data:`MIN_SPLIT`), the longest unit the persistent kernel
    needs (see the docstring)."""
    return max(MIN_SPLIT, -(-nnz * tiles // max(programs, 1)))


#: How split rows are summed: in the kernel (owners wait for the other pieces) or by XLA afterwards.
REDUCTIONS = ("kernel", "xla")


@dataclasses.dataclass(frozen=True)
class _Roles:
    """Per unit of a schedule, for the in-kernel sum of split rows (see "Split rows" in the docstring)."""

    kind: np.ndarray  # 0: a piece that is not its row's owner, 1: a whole row, 2: an owner
    dest: np.ndarray  # the row (whole, owner) or -1 - compact slot (other pieces)
    row: np.ndarray  # the split row index (-1: whole)
    wait: np.ndarray  # for an owner: the other pieces of its row
    src: np.ndarray  # for an owner: the first compact slot of the other pieces
    num_slots: int


def roles(sched: RowSplitSchedule) -> _Roles:
    """The owner of each split row (its last unit), and compact partial slots for the other pieces, each
    row's contiguous."""
    dest = sched.unit_dest.astype(np.int64)
    u, r_count = dest.shape[0], sched.split_rows.shape[0]
    kind, row = np.ones(u, np.int64), np.full(u, -1, np.int64)
    wait, src, new_dest = np.zeros(u, np.int64), np.zeros(u, np.int64), dest.copy()
    split = np.flatnonzero(dest < 0)
    if split.size:
        r = sched.partial_seg[-1 - dest[split]].astype(np.int64)
        owner = np.full(r_count, -1, np.int64)
        np.maximum.at(owner, r, split)
        is_owner = split == owner[r]
        others, r_others = split[~is_owner], r[~is_owner]
        order = np.lexsort((others, r_others))
        others, r_others = others[order], r_others[order]
        counts = np.bincount(r_others, minlength=r_count)
        base = np.concatenate([[0], np.cumsum(counts)[:-1]])
        kind[split], row[split] = np.where(is_owner, 2, 0), r
        new_dest[others] = -1 - np.arange(others.size)
        owners, r_owners = split[is_owner], r[is_owner]
        new_dest[owners] = sched.split_rows[r_owners]
        wait[owners], src[owners] = counts[r_owners], base[r_owners]
        num_slots = int(others.size)
    else:
        num_slots = 0
    return _Roles(kind, new_dest, row, wait, src, num_slots)


@functools.lru_cache(maxsize=128)
def flatten(sched: RowSplitSchedule, tiles: int, grid_order: str, programs: int,
            reduce: bool = False) -> PersistentSchedule:  # fmt: skip
    """Deal the ``units x tiles`` items of ``sched`` to ``programs`` programs and flatten them into steps;
    with ``reduce``, split rows are summed in the kernel and each program runs its pieces that are not owners
    first and its owners last (see "Split rows"). Cached (a schedule of a large pattern takes up to a second to
    deal, and every trace plans again); the arrays are read-only."""
    u = sched.num_units
    k = np.arange(u * tiles, dtype=np.int64)
    if grid_order == "units":  # every unit of column tile 0, then tile 1, ...
        item_t, item_u = np.divmod(k, u) if u else (k, k)
    else:  # every column tile of unit 0, then unit 1, ...
        item_u, item_t = np.divmod(k, tiles)
    prog = _deal(sched.unit_len[item_u].astype(np.int64), programs)
    ro = roles(sched) if reduce else None
    cls = ro.kind[item_u] if reduce else np.ones_like(k)  # without reduce: every item a whole row
    order = np.lexsort((k, cls, prog))  # program-major; in a program other pieces, whole rows, owners; launch order
    item_u, item_t, prog = item_u[order], item_t[order], prog[order]
    counts = np.bincount(prog, minlength=programs)
    item_len = sched.unit_len[item_u].astype(np.int64)
    steps_per_prog = np.bincount(prog, weights=item_len, minlength=programs).astype(np.int64)
    # steps: item i contributes blocks unit_start[u_i] + [0, len_i)
    first = np.repeat(np.cumsum(item_len) - item_len, item_len)
    j = np.arange(int(item_len.sum()), dtype=np.int64) - first
    blocks = np.repeat(sched.unit_start[item_u].astype(np.int64), item_len) + j
    pad = lambda a: (a if a.size else np.zeros(1, np.int64)).astype(np.int32)  # noqa: E731
    cum = lambda c: np.concatenate([[0], np.cumsum(c)]).astype(np.int32)  # noqa: E731
    if reduce:
        row = ro.row[item_u]
        roles_ = dict(
            item_sem=np.where(row >= 0, row * tiles + item_t, -1), item_wait=ro.wait[item_u], item_src=ro.src[item_u],
            num_slots=ro.num_slots, reduce=True, num_sems=int(sched.split_rows.shape[0]) * tiles,
        )  # fmt: skip
    else:  # every piece writes its partial slot (-1 - item_dest), nobody waits
        zero = np.zeros(item_u.shape, np.int64)
        roles_ = dict(item_sem=zero - 1, item_wait=zero, item_src=zero, num_slots=sched.num_partials)
    return PersistentSchedule(
        programs=int(programs),
        prog_item_start=cum(counts),
        prog_step_start=cum(steps_per_prog),
        item_len=item_len.astype(np.int32),
        item_dest=(ro.dest if reduce else sched.unit_dest)[item_u].astype(np.int32),
        item_tile=item_t.astype(np.int32),
        step_id=pad(sched.block_id[blocks]),
        step_col=pad(sched.block_col[blocks]),
        step_tile=pad(np.repeat(item_t, item_len)),
        **{k: v.astype(np.int32) if isinstance(v, np.ndarray) else v for k, v in roles_.items()},
    )


def check_reduce(reduce) -> None:
    """``ValueError`` unless ``reduce`` is ``None`` or one of :data:`REDUCTIONS` (the configs' field)."""
    if reduce is not None and reduce not in REDUCTIONS:
        raise ValueError(f"Expected reduce None or one of {REDUCTIONS}. Got {reduce!r}.")


def resolve_reduce(cfg, interpret):
    """``cfg`` with ``reduce=None`` made ``"xla"`` in Pallas' GPU interpreter, which has no semaphores (the
    in-kernel sum is verified on the GPU and its lowering on the CPU)."""
    if interpret is not False and interpret is not None:
        if cfg.reduce == "kernel":
            raise NotImplementedError("requires a GPU for reduce='kernel' (Pallas' GPU interpreter has no semaphores)")
        if cfg.reduce is None:
            return dataclasses.replace(cfg, reduce="xla")
    return cfg


def _staging(partials: bool, in_kernel: bool) -> int:
    """Bytes per output element of the float32 staging tile the kernel holds besides its output one: 4 where
    pieces of split rows go through shared memory to XLA's sum, else 0."""
    return 4 if partials and not in_kernel else 0


def staging_bytes(ps: PersistentSchedule) -> int:
    """:func:`_staging` of a schedule."""
    return _staging(ps.num_slots > 0, ps.reduce)


def plan_persistent(sched: RowSplitSchedule, tiles: int, grid_order: str, per_stage: int, tile_elems: int,
                    extra_smem: int, out_itemsize: int, cfg) -> tuple[int, PersistentSchedule]:  # fmt: skip
    """``(stages, schedule)`` of the persistent kernel for a config with ``stages``, ``programs`` and ``reduce``
    fields (:class:`~.dsd.MosaicConfig`, :class:`~.dds.DdsConfig`): ``per_stage`` bytes
    of shared memory per stage, ``tile_elems`` elements in an output tile, ``extra_smem`` bytes besides.

    The in-kernel sum needs every program resident at once (an owner waits for pieces of other programs): the
    default program count is then what :func:`default_programs` counts resident (by shared memory, at most
    :data:`MAX_RESIDENT_PER_SM` an SM, on :func:`blocksparse.hardware.gpu`'s SMs); with ``reduce=None`` more
    programs than that fall back to XLA's sum; ``reduce="kernel"`` raises ``NotImplementedError`` there."""
    items = sched.num_units * tiles

    def sizes(in_kernel: bool) -> tuple[int, int, int]:
        smem = extra_smem + tile_elems * (out_itemsize + _staging(sched.num_partials > 0, in_kernel))
        stages = pipeline_stages(cfg.stages, per_stage, smem)
        waits = in_kernel and sched.num_partials > 0  # owners wait for other programs: all must be resident
        resident = default_programs(stages * per_stage + smem, items, max_per_sm=MAX_RESIDENT_PER_SM if waits else None)
        return stages, min(cfg.programs or resident, max(items, 1)), resident

    in_kernel = cfg.reduce != "xla"
    stages, programs, resident = sizes(in_kernel)
    if in_kernel and sched.num_partials and programs > resident:
        if cfg.reduce == "kernel":
            raise NotImplementedError(
                f"requires programs <= {resident} (all resident at once) to sum split rows in the kernel "
                f"(got programs={programs}); reduce='xla' sums them after it"
            )
        in_kernel = False
        stages, programs, _ = sizes(False)
    return stages, flatten(sched, tiles, grid_order, programs, reduce=in_kernel)


def _operands(op: str, bh: int, bw: int, t: int, m_pad: int):
    """What one step multiplies and where an item's tile goes, for ``op``: ``(a_tile, b_tile, acc_shape,
    a_src, b_src, out_slice, partial_slice)``. ``t`` is the dense operand's tile: columns of ``x`` for
    ``dsd``, rows for ``dds``. ``a_src(refs, j)`` / ``b_src(refs, j)`` slice global memory for step ``j``;
    ``out_slice(dest, tile)`` / ``partial_slice(slot, tile)`` give the (rows, cols) of an item's tile."""
    if op == "dsd":  # acc (bh, t) += W block (bh, bw) @ x slab (bw, t)
        return (
            (bh, bw), (bw, t), (bh, t),
            lambda r, j: r.w.at[pl.ds(r.sid[j] * bh, bh), :],
            lambda r, j: r.x.at[pl.ds(r.scol[j] * bw, bw), pl.ds(pl.multiple_of(r.stile[j] * t, t), t)],
            lambda dest, tile: (pl.ds(dest * bh, bh), pl.ds(tile * t, t)),
            lambda slot, tile: (pl.ds(slot * bh, bh), pl.ds(tile * t, t)),
        )  # fmt: skip
    # dds: acc (t, bw) += x slab (t, bh) @ W block (bh, bw); block_col is W's block row (x's block of columns)
    return (
        (t, bh), (bh, bw), (t, bw),
        lambda r, j: r.x.at[pl.ds(pl.multiple_of(r.stile[j] * t, t), t), pl.ds(r.scol[j] * bh, bh)],
        lambda r, j: r.w.at[pl.ds(r.sid[j] * bh, bh), :],
        lambda dest, tile: (pl.ds(tile * t, t), pl.ds(dest * bw, bw)),
        lambda slot, tile: (pl.ds(slot * m_pad + tile * t, t), pl.ds(0, bw)),
    )  # fmt: skip


@dataclasses.dataclass(frozen=True)
class _Refs:
    sid: object
    scol: object
    stile: object
    w: object
    x: object


def _kernel(pis_g, pss_g, ilen_g, idest_g, itile_g, isem_g, iwait_g, isrc_g, sid_g, scol_g, stile_g, w_g, x_g,
            y_g, p_g, *, op, bh, bw, t, m_pad, stages, partials, reduce, num_sems):  # fmt: skip
    from jax.experimental.pallas import mosaic_gpu as plgpu

    p = lax.axis_index("p")
    i0, s0 = pis_g[p], pss_g[p]
    n_items, total = pis_g[p + 1] - i0, pss_g[p + 1] - s0
    dtype = w_g.dtype
    transforms = operand_transforms(dtype)
    a_tile, b_tile, acc_shape, a_src, b_src, out_slice, partial_slice = _operands(op, bh, bw, t, m_pad)
    refs = _Refs(sid_g, scol_g, stile_g, w_g, x_g)
    sems = pl.get_global(plgpu.SemaphoreType.REGULAR((num_sems,))) if reduce and num_sems else None

    def body(a_smem, b_smem, a_bar, b_bar, o_smem, p_smem=None):
        def fetch(g):  # program step g (of any item) into stage g % stages
            slot = lax.rem(g, stages)
            plgpu.copy_gmem_to_smem(a_src(refs, s0 + g), a_smem.at[slot], a_bar.at[slot])
            plgpu.copy_gmem_to_smem(b_src(refs, s0 + g), b_smem.at[slot], b_bar.at[slot])

        for i in range(stages - 1):  # prologue: the first steps, across items if they are short
            pl.when(i < total)(functools.partial(fetch, i))

        def item(q, g):
            length, dest, tile = ilen_g[i0 + q], idest_g[i0 + q], itile_g[i0 + q]

            def accumulate(acc_ref):
                def step(_, g):  # the refill may fetch a step of the next items
                    consume(acc_ref, a_smem, b_smem, a_bar, b_bar, g, stages, total, fetch)
                    return g + 1

                g_end = lax.fori_loop(0, length, step, g)
                plgpu.wgmma_wait(0)
                return acc_ref[...], g_end

            acc, g_end = pl.run_scoped(accumulate, plgpu.ACC(acc_shape, jnp.float32))  # zeros: empty items store 0

            def store(out_g, smem, where, value):
                plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # the previous item's store has read its tile
                smem[...] = value.astype(smem.dtype)
                plgpu.commit_smem()
                plgpu.copy_smem_to_gmem(smem, out_g.at[where])

            if not reduce:
                pl.when(dest >= 0)(lambda: store(y_g, o_smem, out_slice(dest, tile), acc))
                if p_smem is not None:
                    pl.when(dest < 0)(lambda: store(p_g, p_smem, partial_slice(-1 - dest, tile), acc))
                return g_end
            wait, sem, src = iwait_g[i0 + q], isem_g[i0 + q], isrc_g[i0 + q]
            pl.when((dest >= 0) & (wait == 0))(lambda: store(y_g, o_smem, out_slice(dest, tile), acc))
            if sems is not None:

                @pl.when(wait > 0)
                def _owner():  # the other pieces have written their partials: add them, store the row's tile
                    # Pallas zero-fills the semaphores on every call: poll without taking the signals off
                    plgpu.semaphore_wait(sems.at[sem], wait, decrement=False, memory_scope="gpu")

                    def add(j, a):
                        part = p_g.at[partial_slice(src + j, tile)]
                        return a + plgpu.load(part, layout=plgpu.Layout.WGMMA, optimized=False)

                    store(y_g, o_smem, out_slice(dest, tile), lax.fori_loop(0, wait, add, acc))

                @pl.when(dest < 0)
                def _piece():  # straight from registers to global memory, then tell the owner
                    p_g.at[partial_slice(-1 - dest, tile)][...] = acc
                    plgpu.semaphore_signal(sems.at[sem], 1, memory_scope="gpu")

            return g_end

        lax.fori_loop(0, n_items, item, jnp.int32(0))
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)

    scratch = [
        plgpu.SMEM((stages, *a_tile), dtype, transforms=transforms),
        plgpu.SMEM((stages, *b_tile), dtype, transforms=transforms),
        plgpu.Barrier(num_barriers=stages),
        plgpu.Barrier(num_barriers=stages),
        plgpu.SMEM(acc_shape, y_g.dtype),
    ]
    if partials and not reduce:
        scratch.append(plgpu.SMEM(acc_shape, jnp.float32))
    pl.run_scoped(body, *scratch)


def launch(ps: PersistentSchedule, op: str, y_shape: tuple[int, int], t: int, stages: int, data, xp, out_dtype, *,
           interpret, m_pad: int = 0):  # fmt: skip
    """Run the persistent kernel for ``op`` (``"dsd"``: ``W @ x``, ``t`` columns of ``x`` per tile; ``"dds"``:
    ``x @ W``, ``t`` rows of ``x`` per tile, ``x`` padded to ``m_pad`` rows): ``(y (y_shape) in out_dtype,
    partials float32)``; with ``ps.reduce`` ``y`` is complete, else its split rows still need the partials'
    sum (slot ``s`` holds rows ``[s * bh, (s + 1) * bh)`` for ``dsd``, ``[s * m_pad, (s + 1) * m_pad)`` for
    ``dds``)."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    _, bh, bw = data.shape
    slots = max(ps.num_slots, 1)
    p_shape = (slots * bh, y_shape[1]) if op == "dsd" else (slots * m_pad, bw)
    body = functools.partial(_kernel, op=op, bh=bh, bw=bw, t=t, m_pad=m_pad, stages=stages,
                             partials=ps.num_slots > 0, reduce=ps.reduce, num_sems=ps.num_sems)  # fmt: skip
    kernel = plgpu.kernel(
        body,
        out_type=(jax.ShapeDtypeStruct(y_shape, out_dtype), jax.ShapeDtypeStruct(p_shape, jnp.float32)),
        grid=(ps.programs,),
        grid_names=("p",),
        kernel_name=f"bs_mgpu_{op}_{bh}x{bw}_{'tn' if op == 'dsd' else 'tm'}{t}_persistent"
        + ("_reduce" if ps.reduce and ps.num_sems else ""),
        interpret=plgpu.InterpretGPUParams() if interpret is True else interpret,
    )
    arrays = (ps.prog_item_start, ps.prog_step_start, ps.item_len, ps.item_dest, ps.item_tile, ps.item_sem,
              ps.item_wait, ps.item_src, ps.step_id, ps.step_col, ps.step_tile)  # fmt: skip
    return kernel(*map(kernel_constant, arrays), data.reshape(-1, bw), xp)
