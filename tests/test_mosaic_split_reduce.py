"""Rows split across the persistent Mosaic kernel's programs, summed in the kernel: each split row's owner
waits for the other pieces' float32 partials. On the CPU: the schedule's invariants, a simulation of the
programs (any interleaving, one program at a time included: no deadlock, the float64 result) and the CUDA
lowering; on a Hopper GPU (``gpu`` mark): the kernels against the float64 oracle and XLA's sum."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_pallas_mosaic import HALF, _hopper

import blocksparse as bs
from blocksparse import hardware
from blocksparse.ops.matmul import api, order, tuned, vjp
from blocksparse.ops.matmul.mosaic import backend
from blocksparse.ops.matmul.mosaic import dds as pmd
from blocksparse.ops.matmul.mosaic import dsd as pm
from blocksparse.ops.matmul.mosaic import persistent as pp
from blocksparse.ops.matmul.schedule import GpuLowering, lower
from blocksparse.testing.oracles import assert_close, to_dense64


def _pattern(kind: str, grid: tuple[int, int], block, rng, density=0.3) -> bs.BlockPattern:
    gm, gk = grid
    if kind == "power_law":
        return bs.BlockPattern.power_law(rng, (gm * block[0], gk * block[1]), block, density)
    mask = rng.random(grid) < density
    if kind == "full_row":  # one full row, one empty
        mask[gm // 2] = True
        mask[0] = False
    elif kind == "full":
        mask[:] = True
    elif kind == "empty":
        mask[:] = False
    return bs.BlockPattern.from_mask(mask, block)


def _kind(ps: pp.PersistentSchedule) -> np.ndarray:
    """0: a piece that is not its row's owner, 1: a whole row, 2: an owner."""
    return np.where(ps.item_dest < 0, 0, np.where(ps.item_wait > 0, 2, 1))


def _simulate(ps: pp.PersistentSchedule, w, x, tiles: int, t: int, m: int, rng, one_at_a_time: bool):
    """Run the programs' items as the kernel does (float64), in a random interleaving of whole items or one
    program until it blocks; an owner proceeds only once its semaphore holds ``wait`` signals."""
    _, bh, bw = w.shape
    y = np.full((m, tiles * t), np.nan)
    parts = np.full((max(ps.num_slots, 1), bh, tiles * t), np.nan)
    sems = np.zeros(max(ps.num_sems, 1), np.int64)
    pos, step = ps.prog_item_start[:-1].astype(np.int64).copy(), ps.prog_step_start[:-1].astype(np.int64).copy()
    end = ps.prog_item_start[1:]

    def run(p) -> bool:  # one item of program p, False where it must wait
        q = pos[p]
        dest, tile, wait, sem = ps.item_dest[q], ps.item_tile[q], ps.item_wait[q], ps.item_sem[q]
        if wait > 0 and sems[sem] < wait:
            return False
        cols = slice(tile * t, (tile + 1) * t)
        acc = np.zeros((bh, t))
        for g in range(step[p], step[p] + ps.item_len[q]):
            assert ps.step_tile[g] == tile
            acc += w[ps.step_id[g]] @ x[ps.step_col[g] * bw : (ps.step_col[g] + 1) * bw, cols]
        if dest < 0:
            parts[-1 - dest, :, cols] = acc
            sems[sem] += 1
        else:
            if wait > 0:
                sems[sem] -= wait
                acc = acc + parts[ps.item_src[q] : ps.item_src[q] + wait, :, cols].sum(0)
            y[dest * bh : (dest + 1) * bh, cols] = acc
        pos[p] += 1
        step[p] += ps.item_len[q]
        return True

    while (pos < end).any():
        progressed = False
        for p in rng.permutation(ps.programs):
            while pos[p] < end[p] and run(p):
                progressed = True
                if not one_at_a_time:
                    break
        assert progressed, f"deadlock: programs at items {pos.tolist()} of {end.tolist()}"
    assert not sems.any(), "every semaphore is back at zero"
    return y


@settings(max_examples=25, deadline=None)
@given(
    kind=st.sampled_from(["random", "full_row", "power_law", "full", "empty"]),
    block=st.sampled_from([(64, 64), (128, 64), (64, 128)]),
    grid=st.tuples(st.integers(1, 9), st.integers(1, 9)),
    tiles=st.integers(1, 3),
    max_len=st.integers(1, 4),
    programs=st.integers(1, 12),
    one_at_a_time=st.booleans(),
    order=st.sampled_from(["tiles", "units"]),
    op=st.sampled_from(["dsd", "dsd", "dds"]),
    seed=st.integers(0, 2**16),
)
def test_schedule_sums_every_split_row_once_without_deadlock(kind, block, grid, tiles, max_len, programs,
                                                             one_at_a_time, order, op, seed):  # fmt: skip
    """Each split row has one owner per column tile, which adds exactly the other pieces' slots; in every
    program the pieces come first and the owners last, so any interleaving (one program running until it
    blocks included) finishes, with every output tile written once and equal to W @ x. The schedule of x @ W
    (units: W's block columns) is dealt by the same code: its invariants are checked here, its numbers on the GPU."""
    rng = np.random.default_rng(seed)
    pattern = _pattern(kind, grid, block, rng)
    sched = lower(pattern, GpuLowering(op=op, tiles=tiles, max_len=max_len))
    ps = pp.flatten(sched, tiles, order, programs, reduce=True)
    assert ps.reduce and ps.num_sems == sched.split_rows.shape[0] * tiles
    assert ps.num_slots == sched.num_partials - sched.split_rows.shape[0]
    kind_ = _kind(ps)
    for p in range(ps.programs):
        k = kind_[ps.prog_item_start[p] : ps.prog_item_start[p + 1]]
        assert (np.diff(k) >= 0).all(), f"program {p}: pieces, whole rows, owners in that order; got {k.tolist()}"
    owners = kind_ == 2
    assert sorted(zip(ps.item_sem[owners].tolist(), strict=True)) == [(s,) for s in range(ps.num_sems)]
    assert (ps.item_sem[kind_ == 1] == -1).all()
    for s in range(ps.num_sems):  # the owner adds the slots its pieces write, for its own column tile
        o = np.flatnonzero(owners & (ps.item_sem == s))[0]
        pieces = np.flatnonzero((kind_ == 0) & (ps.item_sem == s))
        assert ps.item_wait[o] == pieces.size >= 1
        assert sorted((-1 - ps.item_dest[pieces]).tolist()) == list(range(ps.item_src[o], ps.item_src[o] + pieces.size))
        assert (ps.item_tile[pieces] == ps.item_tile[o]).all()
    if op == "dds":
        return
    bh, bw = block
    t = 16
    w = rng.standard_normal((max(pattern.nnz_blocks, 1), bh, bw))
    x = rng.standard_normal((pattern.shape[1], tiles * t))
    y = _simulate(ps, w, x, tiles, t, pattern.shape[0], rng, one_at_a_time)
    dense = to_dense64(bs.BlockSparseMatrix(pattern, jnp.asarray(w[: pattern.nnz_blocks], jnp.float32)))
    np.testing.assert_allclose(y, dense @ x, rtol=1e-5, atol=1e-4)  # w went through float32: its rounding


def test_plan_sums_in_the_kernel_by_default_and_by_xla_in_the_interpreter():
    """reduce=None: the kernel's sum (no float32 staging tile, so three stages of 128 x 128 tiles fit) on the
    GPU path; XLA's in the interpreter; "kernel" refuses more programs than are resident; bad values raise."""
    rng = np.random.default_rng(0)
    pattern = _pattern("full_row", (8, 8), (128, 128), rng)
    cfg = pm.MosaicConfig(persistent=True, max_len=2)
    p = backend.dsd_plan(pattern, 512, config=cfg)
    assert p.persistent.reduce and p.persistent.num_sems > 0 and p.stages == 3
    cfg = pm.MosaicConfig(persistent=True, max_len=2, tn=128)
    p = backend.dsd_plan(pattern, 512, config=cfg)
    assert p.persistent.reduce and p.persistent.num_sems > 0 and p.stages == 3
    assert p.smem_bytes(128, 128, 2) == 3 * 2 * 128 * 128 * 2 + 128 * 128 * 2
    q = backend.dsd_plan(pattern, 512, config=pp.resolve_reduce(cfg, True))
    assert not q.persistent.reduce and q.stages == 2  # the float32 staging tile costs a stage
    assert q.persistent.num_slots == q.sched.num_partials
    assert pp.resolve_reduce(cfg, False) is cfg
    d = backend.dds_plan(pattern, 4096, config=pmd.DdsConfig(persistent=True, max_len=2))
    assert d.persistent.reduce and d.stages == 3
    with pytest.raises(ValueError, match="reduce"):
        pm.MosaicConfig(reduce="atomic")
    with pytest.raises(ValueError, match="reduce"):
        pmd.DdsConfig(reduce="sum")
    many = pm.MosaicConfig(persistent=True, max_len=1, programs=10_000, reduce="kernel")
    big = _pattern("full", (16, 64), (64, 64), rng)
    with pytest.raises(NotImplementedError, match="resident"):
        backend.dsd_plan(big, 8192, config=many)
    fallback = backend.dsd_plan(big, 8192, config=pm.MosaicConfig(persistent=True, max_len=1, programs=10_000))
    assert not fallback.persistent.reduce


@pytest.mark.parametrize("block", [(64, 64), (128, 128)])
def test_reducing_kernels_lower_for_cuda(block):
    """With split rows the persistent dsd and dds kernels lower (semaphores, register stores of the pieces,
    the owners' loads in the wgmma layout); without any the kernel has no semaphore."""
    rng = np.random.default_rng(1)
    pattern = _pattern("full_row", (8, 8), block, rng)
    data = jnp.zeros((pattern.nnz_blocks, *block), jnp.bfloat16)
    cfg, dcfg = pm.MosaicConfig(persistent=True, max_len=2), pmd.DdsConfig(persistent=True, max_len=2)

    def lowered(fn, *args):
        return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()

    x = jnp.zeros((8 * block[1], 512), jnp.bfloat16)
    dsd = lambda d, x: backend.dsd(pattern, d, x, config=cfg, interpret=False)  # noqa: E731
    assert "_persistent_reduce" in lowered(dsd, data, x)
    xt = jnp.zeros((512, 8 * block[0]), jnp.bfloat16)
    txt = lowered(lambda d, x: backend.dds(pattern, d, x, jnp.float32, config=dcfg, interpret=False), data, xt)
    assert "_persistent_reduce" in txt
    whole = pm.MosaicConfig(persistent=True, max_len=8)
    txt = lowered(lambda d, x: backend.dsd(pattern, d, x, config=whole, interpret=False), data, x)
    assert "_persistent" in txt and "_reduce" not in txt


# ----------------------------------------------------------------------------- real Hopper GPU
@pytest.mark.gpu
@pytest.mark.parametrize("b", [64, 128])
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("kind", ["full_row", "power_law", "random"])
def test_gpu_kernel_sum_matches_oracle(b, dtype, kind):
    """dsd and dds with split rows summed in the kernel against the float64 oracle, for several program
    counts (one program holds every piece of a row; seven interleave them) and a float32 output."""
    _hopper()
    rng = np.random.default_rng(b)
    pattern = _pattern(kind, (2048 // b, 2048 // b), (b, b), rng, density=0.2)
    W = bs.BlockSparseMatrix(pattern, jnp.asarray(rng.standard_normal((pattern.nnz_blocks, b, b)), dtype))
    wd = to_dense64(W)
    x = jnp.asarray(rng.standard_normal((2048, 1000)), dtype)
    xd = np.asarray(x.astype(jnp.float32), np.float64)
    xt = jnp.asarray(rng.standard_normal((1000, 2048)), dtype)
    xtd = np.asarray(xt.astype(jnp.float32), np.float64)
    for extra in (dict(max_len=3), dict(max_len=2, programs=7), dict(max_len=4, programs=1), dict()):
        cfg = pm.MosaicConfig(persistent=True, reduce="kernel", **extra)
        p = backend.dsd_plan(pattern, 1000, config=cfg)
        assert p.persistent.reduce
        for out in (None, jnp.float32):
            y = jax.jit(lambda d, x, cfg=cfg, out=out: backend.dsd(pattern, d, x, out, config=cfg))(W.data, x)
            assert_close(y, wd @ xd, np.abs(wd) @ np.abs(xd), dtype, what=f"dsd {kind} b={b} {extra} {out}")
        dcfg = pmd.DdsConfig(persistent=True, reduce="kernel", **extra)
        y = jax.jit(lambda d, x, dcfg=dcfg: backend.dds(pattern, d, x, config=dcfg))(W.data, xt)
        assert_close(y, xtd @ wd, np.abs(xtd) @ np.abs(wd), dtype, what=f"dds {kind} b={b} {extra}")


@pytest.mark.gpu
def test_gpu_kernel_sum_is_repeatable_and_agrees_with_xla():
    """Called again and again (the semaphores return to zero after every call) the in-kernel sum gives the same
    bits; against XLA's sum of the same pieces it differs by float32 rounding only."""
    _hopper()
    rng = np.random.default_rng(3)
    pattern = _pattern("power_law", (32, 32), (128, 128), rng, density=0.25)
    data = jnp.asarray(rng.standard_normal((pattern.nnz_blocks, 128, 128)), jnp.bfloat16)
    x = jnp.asarray(rng.standard_normal((4096, 2048)), jnp.bfloat16)
    fn = {r: jax.jit(lambda d, x, r=r: backend.dsd(pattern, d, x, jnp.float32, config=pm.MosaicConfig(
        persistent=True, tn=64, max_len=4, reduce=r))) for r in pp.REDUCTIONS}  # fmt: skip
    cfg = pm.MosaicConfig(persistent=True, tn=64, max_len=4)  # 64 columns: XLA's sum fits its staging tile too
    assert backend.dsd_plan(pattern, 2048, config=cfg).persistent.num_sems > 0
    first = np.asarray(fn["kernel"](data, x))
    for _ in range(5):
        np.testing.assert_array_equal(np.asarray(fn["kernel"](data, x)), first)
    np.testing.assert_allclose(first, np.asarray(fn["xla"](data, x)), rtol=1e-5, atol=1e-3)


def test_skewed_patterns_take_the_persistent_kernel():
    """A power-law pattern whose one-program-per-item plan splits a quarter of its units goes to the persistent
    kernel (and before Triton on a Hopper GPU); the uniform pattern with the same blocks does not."""
    uniform = bs.random(jax.random.key(0), (8192, 8192), 64, 1 / 16, jnp.bfloat16).pattern
    skew = bs.BlockPattern.power_law(0, (8192, 8192), (64, 64), 1 / 16)
    assert skew.nnz_blocks == uniform.nnz_blocks
    per_item = backend.dsd_plan(skew, 4096, config=pm.MosaicConfig(persistent=False)).sched
    assert per_item.num_partials >= tuned.H200.SKEW_SPLIT_SHARE * per_item.num_units
    assert pm.skewed(skew, 4096) and not pm.skewed(uniform, 4096)
    assert backend.dsd_plan(skew, 4096).persistent is not None and backend.dsd_plan(uniform, 4096).persistent is None
    assert backend.dsd_plan(skew, 4096, fused=True).persistent is None  # no epilogue in the persistent kernel
    assert not pm.skewed(bs.BlockPattern.power_law(0, (512, 512), (32, 32), 1 / 4), 4096)  # blocks it cannot take


def test_skew_rule_holds_for_plain_products_and_their_own_backward(monkeypatch):
    """On a (pretended) Hopper GPU the skewed pattern puts Mosaic first for a plain W @ x only: not for a fused one
    (the persistent kernel has no epilogue), and not for the x-gradient W^T @ g (the transposed pattern has no long
    rows), which takes its own rule in the backward of a default-order product."""
    bf = jnp.bfloat16
    skew = bs.BlockPattern.power_law(0, (8192, 8192), (64, 64), 1 / 16)
    t, _ = skew.transpose()
    seen = []
    monkeypatch.setattr(vjp, "dsd", lambda s, *a: seen.append((s.pattern.grid, s.impls)) or a[1])
    monkeypatch.setattr(vjp, "_grad_sdd", lambda s, a, b: None)
    W = bs.BlockSparseMatrix(skew, jnp.zeros((skew.nnz_blocks, 64, 64), jnp.bfloat16))
    g = jnp.zeros((8192, 4096), jnp.bfloat16)
    s = api.OpStatic(("mosaic", "pallas", "xla"), jnp.dtype(jnp.bfloat16), pattern=skew, auto=True)
    with hardware.fake(hardware.H200):
        assert order.default("dsd", skew, 4096, bf, bf) == ("mosaic", "pallas", "xla")
        assert order.default("dsd", skew, 4096, bf, bf, fused=True) == order.DEFAULT
        assert not pm.skewed(t, 4096) and order.default("dsd", t, 4096, bf, bf) == order.DEFAULT
        vjp._dsd_bwd(s, (W.data, g), None, g)
    assert seen == [(t.grid, order.DEFAULT)]


def test_resident_programs_are_counted_conservatively():
    """A 57344-byte program: Mosaic adds its barriers, so 3 fit an SM's 228 KiB, not 4; where owners wait, at most
    2 an SM (registers); on the device's SMs (the H200's 132 on a CPU)."""
    assert hardware.gpu().num_sms == 132 or jax.default_backend() == "gpu"
    assert pp.default_programs(57344, 10**6, num_sms=132) == 3 * 132
    assert pp.default_programs(57344, 10**6, num_sms=132, max_per_sm=pp.MAX_RESIDENT_PER_SM) == 2 * 132
    assert pp.default_programs(57344, 10**6, num_sms=114) == 3 * 114
    rng = np.random.default_rng(0)
    pattern = _pattern("full", (64, 64), (64, 64), rng)
    p = backend.dsd_plan(pattern, 4096, config=pm.MosaicConfig(persistent=True, tn=64, max_len=2))
    assert p.persistent.reduce and p.persistent.programs == 2 * hardware.gpu().num_sms
    q = backend.dsd_plan(pattern, 4096, config=pm.MosaicConfig(persistent=True, tn=64, max_len=2, reduce="xla"))
    assert q.persistent.programs == 3 * hardware.gpu().num_sms  # nobody waits: every slot that fits
    with pytest.raises(NotImplementedError, match="interpreter has no semaphores"):
        backend.dsd(pattern, jnp.zeros((pattern.nnz_blocks, 64, 64), jnp.bfloat16), jnp.zeros((4096, 64), jnp.bfloat16),
               config=pm.MosaicConfig(persistent=True, reduce="kernel"), interpret=True)  # fmt: skip


def test_persistent_schedules_are_cached_and_read_only():
    rng = np.random.default_rng(2)
    pattern = _pattern("full_row", (8, 8), (64, 64), rng)
    cfg = pm.MosaicConfig(persistent=True, max_len=2)
    a, b = backend.dsd_plan(pattern, 512, config=cfg).persistent, backend.dsd_plan(pattern, 512, config=cfg).persistent
    assert a is b
    with pytest.raises(ValueError, match="read-only"):
        a.item_dest[0] = 0
