"""The Mosaic GPU (Hopper) dds kernel ``x @ W``: host preparation, CUDA lowering and the GPU interpreter on
the CPU; the real kernel on a Hopper GPU (``gpu`` mark) against the float64 oracle at real sizes."""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import examples, sweep
from hypothesis import given, settings
from hypothesis import strategies as st
from test_pallas_mosaic import HALF, _epilogue_oracle, _hopper  # the dsd tests' helpers

import blocksparse as bs
from blocksparse import hardware
from blocksparse.ops.matmul import epilogue, order, tuned
from blocksparse.ops.matmul.mosaic import backend
from blocksparse.ops.matmul.mosaic import dds as pmd
from blocksparse.testing import strategies as bst
from blocksparse.testing.oracles import assert_close, to_dense64

KINDS = ("random", "empty", "full_row", "full_col", "empty_rows", "single", "diagonal")


def _mask(kind: str, gk: int, gn: int, rng) -> np.ndarray:
    """W's block mask (``gk`` block rows: the contracted dimension; ``gn`` block columns: the output's)."""
    mask = np.zeros((gk, gn), bool)
    if kind == "empty_cols":  # every other block column empty (programs that only write zeros)
        mask = rng.random((gk, gn)) < 0.6
        mask[:, ::2] = False
        mask[0, 1] = True
    elif kind == "full_col":  # one full block column (the longest unit, split by a small max_len)
        mask[:, gn - 1] = True
        mask[0, 0] = True
    elif kind == "full_row":  # one full block row: every block column has one block
        mask[gk // 2] = True
    elif kind == "single":
        mask[gk - 1, 0] = True
    elif kind == "random":
        mask = rng.random((gk, gn)) < 0.5
    elif kind != "empty":
        raise ValueError(kind)
    return mask


def _oracle(pattern, data, x):
    """float64 ``x @ W`` and the bound on its magnitude ``|x| @ |W|``."""
    wd = to_dense64(bs.BlockSparseMatrix(pattern, data))
    xd = np.asarray(jnp.asarray(x, jnp.float32), np.float64)
    return xd @ wd, np.abs(xd) @ np.abs(wd)


def _problem(kind, block, dtype, shape=(256, 384), m=200, seed=0):
    """W ``shape`` (k, n) of ``kind``, x ``(m, k)``; ``m`` is not a multiple of the row tile (padding)."""
    rng = np.random.default_rng(seed)
    (k, n), (bh, bw) = shape, block
    pattern = bs.BlockPattern.from_mask(_mask(kind, k // bh, n // bw, rng), block)
    data = jnp.asarray(rng.standard_normal((pattern.nnz_blocks, bh, bw)), dtype)
    x = jnp.asarray(rng.standard_normal((m, k)), dtype)
    return (pattern, data, x, *_oracle(pattern, data, x))


def _run_schedule(p: pmd.DdsPlan, pattern, data, x) -> np.ndarray:
    """The kernel's contract in NumPy: each (unit, row tile) program's sum, stored directly or as a partial."""
    s, (bh, bw) = p.sched, pattern.block_size
    m, (_, n) = x.shape[0], pattern.shape
    xp = np.zeros((p.m_pad, x.shape[1]))
    xp[:m] = x
    y = np.full((p.m_pad, n), np.nan)  # columns no program writes stay NaN
    parts = np.zeros((max(s.num_partials, 1), p.m_pad, bw))
    for start, length, dest in zip(s.unit_start, s.unit_len, s.unit_dest, strict=True):
        for t in range(p.tiles):
            rows = slice(t * p.tm, (t + 1) * p.tm)
            acc = np.zeros((p.tm, bw))
            for j in range(start, start + length):
                r = s.block_col[j]
                acc += xp[rows, r * bh : (r + 1) * bh] @ data[s.block_id[j]]
            if dest >= 0:
                y[rows, dest * bw : (dest + 1) * bw] = acc
            else:
                parts[-1 - dest, rows] = acc
    for slot, seg in enumerate(s.partial_seg):
        c = s.split_rows[seg]
        cols = slice(c * bw, (c + 1) * bw)
        y[:, cols] = np.where(np.isnan(y[:, cols]), 0.0, y[:, cols]) + parts[slot]
    return y[:m]


# ----------------------------------------------------------------------------- host preparation
@settings(max_examples=25, deadline=None)
@given(
    block=st.sampled_from([(64, 64), (128, 128), (64, 128), (128, 64)]),
    pattern_seed=st.data(),
    m=st.integers(1, 600),
    tm=st.sampled_from([None, 64, 128]),
    max_len=st.one_of(st.none(), st.integers(1, 3)),
    seed=st.integers(0, 2**16),
)
def test_plan_schedule_computes_x_at_w(block, pattern_seed, m, tm, max_len, seed):
    """The plan's work list run as the kernel runs it (NumPy, float64) covers every output column once: x @ W."""
    pattern = pattern_seed.draw(bst.block_patterns(block_size=block, max_blocks=5, kinds=KINDS))
    p = backend.dds_plan(pattern, m, 2, pmd.DdsConfig(tm=tm, max_len=max_len))
    p.sched.check()
    assert p.sched.num_rows == pattern.grid[1]  # units walk W's block columns
    assert p.m_pad % p.tm == 0 and p.m_pad - p.tm < m <= p.m_pad and p.tiles == p.m_pad // p.tm
    assert p.tm * block[1] <= 128 * 128 and 2 <= p.stages <= 3
    assert p.smem_bytes(*block, 2) <= 227 * 1024
    rng = np.random.default_rng(seed)
    data = rng.standard_normal((pattern.nnz_blocks, *block)).astype(np.float32).astype(np.float64)  # as to_dense64 sees
    x = rng.standard_normal((m, pattern.shape[0]))
    want = x @ to_dense64(bs.BlockSparseMatrix(pattern, data))
    np.testing.assert_allclose(_run_schedule(p, pattern, data, x), want, rtol=1e-10, atol=1e-10)


def test_plan_tiles_and_stages():
    """The users' shape (32768 x 384 @ 384 x 1536) at d = 1/4: the persistent kernel (1.19 and 1.27 on the
    H200), 128-row tiles, 3 stages, plus its output staging tile; forced off, the same pipeline alone; small
    m: 64 rows."""
    per_item = pmd.DdsConfig(persistent=False)
    for b in (64, 128):
        pattern = bs.BlockPattern.random(0, (384, 1536), (b, b), 1 / 4)
        p = backend.dds_plan(pattern, 32768)
        assert p.persistent is not None and p.sched.num_partials == 0
        assert (p.tm, p.tiles, p.m_pad, p.stages) == (128, 256, 32768, 3)
        assert p.smem_bytes(b, b, 2) == 3 * (128 * b + b * b) * 2 + 128 * b * 2
        q = backend.dds_plan(pattern, 32768, config=per_item)
        assert q.persistent is None and (q.tm, q.tiles, q.stages) == (128, 256, 3)
        assert q.smem_bytes(b, b, 2) == 3 * (128 * b + b * b) * 2
        assert q.sched.num_units >= pattern.grid[1]  # one unit per block column at least (empty ones too)
        assert backend.dds_plan(pattern, 100).tm == 64
    pattern = bs.BlockPattern.random(0, (512, 512), (64, 64), 0.5)
    wide = backend.dds_plan(pattern, 4096, config=pmd.DdsConfig(tm=256, persistent=False))
    assert (wide.tm, wide.stages) == (256, 3)  # 3 x 40 KiB
    deep = backend.dds_plan(pattern, 4096, config=pmd.DdsConfig(stages=5, persistent=False))
    assert deep.stages == 5  # 5 x 24 KiB
    # Mosaic GPU launches the last grid dimension fastest: units (W's block columns) by default
    assert deep.grid == ((32, deep.sched.num_units), ("t", "u"))
    tiles_first = backend.dds_plan(pattern, 4096, config=pmd.DdsConfig(grid_order="tiles", persistent=False))
    assert tiles_first.grid == ((backend.dds_plan(pattern, 4096, config=per_item).sched.num_units, 32), ("u", "t"))


def _exact_pattern(k: int, b: int, density: float, rect: bool = False, gn: int = 16) -> bs.BlockPattern:
    """W of ``k // b`` x ``gn`` b x b blocks (b x b/2 with ``rect``) at exactly ``density``: the first ones in
    column-major order (full block columns, which a small max_len splits)."""
    gk = k // b
    mask = np.zeros(gk * gn, bool)
    mask[: round(density * gk * gn)] = True
    return bs.BlockPattern.from_mask(mask.reshape(gn, gk).T, (b, b // 2 if rect else b))


def test_prefers_persistent_reads_the_nearest_cell():
    """Every measured cell decides for itself (>= PREFER_MARGIN); k and density go to the nearest cell on
    log scales, as measured_speedup reads its table; m does not enter; rectangular or empty W: never."""
    for (b, k), row in tuned.H200.MOSAIC_DDS_PERSISTENT_SPEEDUP.items():
        for d, speedup in row.items():
            pattern = _exact_pattern(k, b, d)
            assert backend.dds_persistent(pattern, 32768) == (speedup >= tuned.H200.PREFER_MARGIN), (b, k, d)
            assert backend.dds_persistent(pattern, 1) == backend.dds_persistent(pattern, 32768)
    # b = 128, d = 1/4: 1.27 at k = 384, 1.04 at k = 8192; k = 1664 < 1774 (the log midpoint) reads k = 384
    assert backend.dds_persistent(_exact_pattern(1664, 128, 1 / 4), 8192)
    assert not backend.dds_persistent(_exact_pattern(1792, 128, 1 / 4), 8192)
    # b = 128, k = 8192: d = 1/2 reads the 1/4 column (1.04), d = 1/32 the 1/16 one (1.25)
    assert not backend.dds_persistent(_exact_pattern(8192, 128, 1 / 2), 8192)
    assert backend.dds_persistent(_exact_pattern(8192, 128, 1 / 32), 8192)
    assert not backend.dds_persistent(_exact_pattern(384, 128, 1 / 4, rect=True), 32768)  # 128 x 64 blocks
    assert not backend.dds_persistent(_exact_pattern(384, 128, 0.0), 32768)  # nothing to compute


def test_plan_takes_the_persistent_kernel_by_the_rule_and_falls_back():
    """persistent=None: the persistent plan where prefers_persistent holds (never for a fused call), the
    one-program-per-item plan elsewhere and where the persistent kernel cannot take the forced tiles."""
    fast = _exact_pattern(384, 128, 1 / 4)  # 1.27
    slow = _exact_pattern(384, 128, 1 / 16)  # 0.86
    assert backend.dds_plan(fast, 32768).persistent is not None
    assert backend.dds_plan(fast, 32768, fused=True).persistent is None  # the persistent kernel has no epilogue
    assert backend.dds_plan(slow, 32768).persistent is None
    assert backend.dds_plan(slow, 32768, config=pmd.DdsConfig(persistent=True)).persistent is not None  # forced
    assert backend.dds_plan(fast, 32768, config=pmd.DdsConfig(persistent=False)).persistent is None
    # b = 128, tm = 128, 3 stages and split columns: 3 x 64 KiB fit, plus the persistent kernel's 32 KiB
    # output tile; its 64 KiB float32 staging tile (split columns summed by XLA) does not
    cfg = pmd.DdsConfig(tm=128, stages=3, max_len=1)
    with pytest.raises(NotImplementedError, match=r"shared memory.*got stages=3"):
        backend.dds_plan(fast, 4096, config=dataclasses.replace(cfg, persistent=True, reduce="xla"))
    assert backend.dds_plan(fast, 4096, config=dataclasses.replace(cfg, persistent=True)).persistent.reduce
    p = backend.dds_plan(fast, 4096, config=dataclasses.replace(cfg, reduce="xla"))  # the rule's pick does not fit
    assert p.persistent is None and (p.tm, p.stages) == (128, 3) and p.sched.num_partials > 0
    with pytest.raises(ValueError, match="programs"):
        pmd.DdsConfig(persistent=False, programs=4)


def test_dds_takes_the_persistent_kernel_by_the_rule_but_never_fused(monkeypatch):
    """dds() with the default config: a plain product where the rule holds launches the persistent kernel; a
    fused one (the same W) the one-program-per-item kernel, which runs in the interpreter and matches."""

    class Launched(Exception):
        pass

    def launch(*args, **kwargs):
        raise Launched

    monkeypatch.setattr(pmd.pp, "launch", launch)
    rng = np.random.default_rng(0)
    pattern = _exact_pattern(256, 64, 1 / 4, gn=4)  # the k = 384 row: 1.19
    assert backend.dds_persistent(pattern, 64)
    data = jnp.asarray(rng.standard_normal((pattern.nnz_blocks, 64, 64)), jnp.bfloat16)
    x = jnp.asarray(rng.standard_normal((64, 256)), jnp.bfloat16)
    with pytest.raises(Launched):
        backend.dds(pattern, data, x, interpret=True)
    want, scale = _oracle(pattern, data, x)
    y = backend.dds(pattern, data, x, None, epilogue.Epilogue("relu"), interpret=True)
    assert_close(y, *_epilogue_oracle(want, scale, np.zeros(256), 1, "relu"), jnp.bfloat16)


def test_refuses_what_the_kernel_cannot_take():
    """NotImplementedError names what the kernel takes and what it got; bad configs are ValueErrors."""

    def matrix(block, dtype=jnp.bfloat16):
        pattern = bs.BlockPattern.random(0, (256, 256), block, 0.5)
        return pattern, jnp.zeros((pattern.nnz_blocks, *pattern.block_size), dtype)

    x = jnp.ones((64, 256), jnp.bfloat16)
    with pytest.raises(NotImplementedError, match=r"block sides in \(64, 128\).*got \(32, 32\)"):
        backend.dds(*matrix((32, 32)), x)
    with pytest.raises(NotImplementedError, match=r"block sides in \(64, 128\).*got \(64, 32\)"):
        backend.dds(*matrix((64, 32)), x)
    pattern, data = matrix((64, 64), jnp.float32)
    with pytest.raises(NotImplementedError, match="float16 or bfloat16 operands.*got float32, float32"):
        backend.dds(pattern, data, x.astype(jnp.float32))
    with pytest.raises(NotImplementedError, match="float16 or bfloat16 operands.*got float16, bfloat16"):
        backend.dds(pattern, data.astype(jnp.float16), x)  # a mix promotes to float32
    with pytest.raises(NotImplementedError, match=r"float16, bfloat16 or float32 output \(got int32\)"):
        backend.dds(pattern, data.astype(jnp.bfloat16), x, jnp.int32)
    pattern, data = matrix((128, 128))
    with pytest.raises(NotImplementedError, match=r"tm \* bw <= 16384.*got 256 \* 128"):
        backend.dds(pattern, data, x, config=pmd.DdsConfig(tm=256))
    with pytest.raises(NotImplementedError, match=r"shared memory.*got stages=4"):
        backend.dds_plan(pattern, 4096, config=pmd.DdsConfig(tm=128, stages=4))  # 4 x 64 KiB
    with pytest.raises(ValueError, match=r"Expected tm in \(64, 128, 256\). Got 96."):
        pmd.DdsConfig(tm=96)
    with pytest.raises(ValueError, match="Expected stages >= 2. Got 1."):
        pmd.DdsConfig(stages=1)
    with pytest.raises(ValueError, match="Expected grid_order 'units' or 'tiles'. Got 'rows'."):
        pmd.DdsConfig(grid_order="rows")


def test_bad_shapes_raise_with_expected_and_actual():
    pattern, data, x, _, _ = _problem("random", (64, 64), jnp.bfloat16, m=8)
    with pytest.raises(ValueError, match=r"Expected x of shape \(m, 256\). Got \(8, 384\)."):
        backend.dds(pattern, data, jnp.zeros((8, 384), jnp.bfloat16))
    with pytest.raises(ValueError, match=r"Expected data of shape \(\d+, 64, 64\). Got \(1, 64, 64\)."):
        backend.dds(pattern, data[:1], x)
    with pytest.raises(ValueError, match=r"Expected a bias of shape \(384,\) \(bias_axis=1\). Got \(8,\)."):
        backend.dds(pattern, data, x, epi=epilogue.Epilogue(None, True, 1), bias=jnp.zeros(8))
    with pytest.raises(ValueError, match=r"Expected a bias of shape \(8,\) \(bias_axis=0\). Got \(384,\)."):
        backend.dds(pattern, data, x, epi=epilogue.Epilogue(None, True, 0), bias=jnp.zeros(384))
    with pytest.raises(ValueError, match="Expected a bias array exactly when the epilogue has a bias"):
        backend.dds(pattern, data, x, epi=epilogue.Epilogue("relu"), bias=jnp.zeros(384))


def test_no_launch_for_empty_operands():
    """No rows of x, or no blocks in W: zeros (or the epilogue of zeros), without a kernel."""
    pattern, data, x, _, _ = _problem("empty", (64, 64), jnp.bfloat16, m=8)
    assert pattern.nnz_blocks == 0
    y = backend.dds(pattern, data, x, interpret=False)
    assert y.shape == (8, 384) and y.dtype == jnp.bfloat16 and not np.asarray(y, np.float32).any()
    bias = jnp.linspace(-1.0, 1.0, 384, dtype=jnp.float32)
    y = backend.dds(pattern, data, x, jnp.float32, epilogue.Epilogue("relu", True, 1), bias, interpret=False)
    np.testing.assert_array_equal(np.asarray(y), np.broadcast_to(np.maximum(np.asarray(bias), 0), (8, 384)))
    pattern, data, _, _, _ = _problem("random", (64, 64), jnp.bfloat16)
    assert backend.dds(pattern, data, jnp.zeros((0, 256), jnp.bfloat16), interpret=False).shape == (0, 384)


# ----------------------------------------------------------------------------- lowering for CUDA
def _lower(pattern, data, x, out_dtype=None, epi=None, bias=(), config=None) -> str:
    """The CUDA lowering's text of ``dds`` (``bias``: ``()`` or ``(array,)``)."""
    fn = jax.jit(lambda d, x, *b: backend.dds(pattern, d, x, out_dtype, epi, *b, config=config, interpret=False))
    return fn.trace(data, x, *bias).lower(lowering_platforms=("cuda",)).as_text()


@sweep(
    "block,dtype,tm,out_dtype,order",
    [((64, 64), jnp.bfloat16, None, None, "units"), ((128, 128), jnp.float16, None, None, "units"),
     ((64, 64), jnp.bfloat16, 256, None, "units"), ((128, 128), jnp.bfloat16, 64, jnp.float32, "tiles"),
     ((64, 128), jnp.float16, 128, None, "units")],
)  # fmt: skip
def test_kernel_lowers_for_cuda(block, dtype, tm, out_dtype, order):
    """The Pallas -> Mosaic GPU lowering (wgmma shapes and layouts, swizzles, the shared memory budget) at the
    users' shape, with max_len=1 so that split block columns (partials) are lowered too."""
    pattern, data, x, _, _ = _problem("random", block, dtype, shape=(384, 1536), m=4096)
    cfg = pmd.DdsConfig(tm=tm, max_len=1, grid_order=order, persistent=False)
    txt = _lower(pattern, data, x, out_dtype, config=cfg)
    p = backend.dds_plan(pattern, 4096, 2, cfg)
    assert p.sched.num_partials > 0
    name = f"bs_mgpu_dds_{block[0]}x{block[1]}_tm{p.tm}" + ("_tiles_fastest" if order == "tiles" else "")
    assert name in txt and "mosaic_gpu" in txt


def test_lowering_checks_the_shared_memory_budget_the_plan_uses():
    """The largest stages the plan allows for b = 128 (3 x 64 KiB) lower; a fourth stage does not."""
    pattern, data, x, _, _ = _problem("random", (128, 128), jnp.bfloat16, shape=(512, 512), m=512)
    cfg = pmd.DdsConfig(tm=128, persistent=False)
    p = backend.dds_plan(pattern, 512, config=cfg)
    assert p.smem_bytes(128, 128, 2) == 3 * 64 * 1024
    assert "bs_mgpu_dds_128x128_tm128" in _lower(pattern, data, x, config=cfg)
    p4 = pmd.DdsPlan(p.tm, p.tiles, p.m_pad, 4, p.sched)
    fn = jax.jit(lambda d, x: pmd._launch(p4, 512, d, x, jnp.bfloat16, interpret=False))
    with pytest.raises(ValueError, match="exceeds available shared memory"):
        fn.trace(data, x).lower(lowering_platforms=("cuda",))


@sweep("activation", [None, *epilogue.ACTIVATIONS])
def test_fused_epilogue_lowers_for_cuda(activation):
    """Every activation, both bias axes and no bias go through the lowering (the bias broadcast's layouts)."""
    block = (128, 128) if activation in ("gelu", "silu") else (64, 64)
    pattern, data, x, _, _ = _problem("random", block, jnp.bfloat16, shape=(384, 1536), m=1000)
    cfg = pmd.DdsConfig(max_len=1)
    for axis in (0, 1):
        bias = jnp.zeros(1536 if axis == 1 else 1000, jnp.float32)
        txt = _lower(pattern, data, x, jnp.bfloat16, epilogue.Epilogue(activation, True, axis), (bias,), cfg)
        assert re.search(rf"bs_mgpu_dds_{block[0]}x{block[1]}_tm\d+_epi", txt)
    assert "_epi" in _lower(pattern, data, x, epi=epilogue.Epilogue(activation))  # no bias operand


# ----------------------------------------------------------------------------- GPU interpreter
@sweep(
    "kind,block,dtype,max_len",
    [("empty_cols", (64, 64), jnp.bfloat16, None), ("full_col", (128, 128), jnp.float16, 1),
     ("full_row", (64, 64), jnp.float16, None),
     ("single", (128, 128), jnp.bfloat16, None), ("random", (64, 128), jnp.bfloat16, None)],
)  # fmt: skip
def test_interpreter_matches_oracle(kind, block, dtype, max_len):
    """The kernel itself (TMA copies, barriers, the pipeline, empty block columns, partial slots) in Pallas'
    GPU interpreter against the float64 oracle; x has 200 rows (padded to the row tile)."""
    pattern, data, x, want, scale = _problem(kind, block, dtype)
    cfg = pmd.DdsConfig(max_len=max_len, persistent=False)  # the persistent kernel: the next test
    if kind == "full_col":  # the full column is split into partials
        assert backend.dds_plan(pattern, 200, config=cfg).sched.num_partials >= 2
    y = backend.dds(pattern, data, x, config=cfg, interpret=True)
    assert y.dtype == dtype and y.shape == (200, 384)
    assert_close(y, want, scale, dtype)


@sweep("kind,block,order,programs,max_len", [
    ("full_col", (64, 64), "units", 3, 2), ("empty_cols", (128, 64), "tiles", None, None),
    ("single", (64, 128), "units", 1, None), ("random", (128, 128), "tiles", 5, 1)], quick=2)  # fmt: skip
def test_interpreter_persistent_kernel(kind, block, order, programs, max_len):
    """The persistent kernel for x @ W (one pipeline across a program's (block column, row tile) items: split
    columns into partials, empty columns, one program, several) against the float64 oracle, in float32
    output too; every item and block once."""
    pattern, data, x, want, scale = _problem(kind, block, jnp.bfloat16)
    cfg = pmd.DdsConfig(tm=64, persistent=True, programs=programs, grid_order=order, max_len=max_len)
    p = backend.dds_plan(pattern, 200, config=cfg)
    ps, s = p.persistent, p.sched
    assert ps.prog_item_start[-1] == s.num_units * p.tiles and ps.num_steps == s.nnz * p.tiles
    assert kind != "full_col" or s.num_partials > 0
    y = backend.dds(pattern, data, x, jnp.float32 if kind == "single" else None, config=cfg, interpret=True)
    assert y.shape == (200, 384)
    assert_close(y, want, scale, jnp.bfloat16)


def test_persistent_kernel_lowers_for_cuda_and_refuses_an_epilogue():
    pattern, data, x, _, _ = _problem("random", (128, 128), jnp.bfloat16, shape=(512, 512), m=4096)
    cfg = pmd.DdsConfig(persistent=True)
    fn = jax.jit(lambda d, x: backend.dds(pattern, d, x, config=cfg, interpret=False))
    txt = fn.trace(data, x).lower(lowering_platforms=("cuda",)).as_text()
    assert re.search(r"bs_mgpu_dds_128x128_tm\d+_persistent", txt)
    with pytest.raises(ValueError, match="programs"):
        pmd.DdsConfig(programs=4)
    with pytest.raises(NotImplementedError, match="persistent=False"):
        backend.dds(pattern, data, x, None, epilogue.Epilogue("relu", False, 1), config=cfg)


def test_interpreter_wide_tiles_two_stages_and_float32_output():
    """tm = 256 with b = 64 (the 256 x 64 accumulator), a 2-stage pipeline, a float32 store, row tiles fastest."""
    pattern, data, x, want, scale = _problem("full_col", (64, 64), jnp.bfloat16, m=300)
    cfg = pmd.DdsConfig(tm=256, stages=2, max_len=3, grid_order="tiles", persistent=False)
    y = backend.dds(pattern, data, x, jnp.float32, config=cfg, interpret=True)
    assert y.dtype == jnp.float32
    assert_close(y, want, scale, jnp.bfloat16)


@sweep(
    "kind,block,dtype,out_dtype,activation,axis,max_len",
    [("full_col", (64, 64), jnp.bfloat16, None, "gelu", 1, 2),  # split columns: the epilogue after the sum
     ("empty_cols", (128, 128), jnp.float16, jnp.float32, "silu", 1, None),  # empty columns: act(bias)
     ("random", (64, 64), jnp.bfloat16, None, "relu", 0, 2),  # bias along the rows of x
     ("empty", (64, 64), jnp.float16, None, "sigmoid", 1, None)],  # no blocks: no launch
)  # fmt: skip
def test_interpreter_fused_epilogue_matches_oracle(kind, block, dtype, out_dtype, activation, axis, max_len):
    pattern, data, x, want, scale = _problem(kind, block, dtype)
    bias = jnp.asarray(np.random.default_rng(1).standard_normal(384 if axis == 1 else 200), jnp.float32)
    epi = epilogue.Epilogue(activation, True, axis)
    y = backend.dds(pattern, data, x, out_dtype, epi, bias, config=pmd.DdsConfig(max_len=max_len), interpret=True)
    assert y.dtype == (out_dtype or dtype)
    assert_close(y, *_epilogue_oracle(want, scale, bias, axis, activation), out_dtype or dtype)


@settings(max_examples=examples(5), deadline=None)
@given(
    b=st.sampled_from([64, 128]),
    dtype=st.sampled_from(HALF),
    activation=st.sampled_from([None, "none", "gelu_tanh", "tanh"]),
    data=st.data(),
    seed=st.integers(0, 2**16),
)
def test_interpreter_on_strategy_patterns(b, dtype, activation, data, seed):
    """The strategies' patterns (empty block rows and columns, one full row or column, a single block, the
    diagonal, ...) in the interpreter; with an epilogue (bias along the output columns) or none."""
    pattern = data.draw(bst.block_patterns(block_size=(b, b), shape=(256, 384), kinds=KINDS), label="W")
    rng = np.random.default_rng(seed)
    w = jnp.asarray(rng.standard_normal((pattern.nnz_blocks, b, b)), dtype)
    x = jnp.asarray(rng.standard_normal((72, 256)), dtype)
    want, scale = _oracle(pattern, w, x)
    cfg = pmd.DdsConfig(max_len=2)
    if activation is None:
        assert_close(backend.dds(pattern, w, x, config=cfg, interpret=True), want, scale, dtype)
        return
    act = None if activation == "none" else activation
    bias = jnp.asarray(rng.standard_normal(384), dtype)
    y = backend.dds(pattern, w, x, None, epilogue.Epilogue(act, True, 1), bias, config=cfg, interpret=True)
    assert_close(y, *_epilogue_oracle(want, scale, bias.astype(jnp.float32), 1, act), dtype)


def test_interpreter_finds_no_races():
    """The interpreter's race detector (TMA engines as threads with vector clocks) on the pipeline, the partials
    and the fused bias copy: every shared-memory access is ordered by a barrier or a wait."""
    try:
        from jax._src.pallas.mosaic_gpu.interpret import gpu_callbacks
    except ImportError:  # a private module: its place may change between jax versions
        pytest.skip("jax's GPU interpreter keeps its race detector elsewhere in this version")
    from jax.experimental.pallas import mosaic_gpu as plgpu

    pattern, data, x, want, scale = _problem("full_col", (64, 64), jnp.bfloat16, shape=(256, 256), m=100)
    bias = jnp.ones(256, jnp.float32)
    y = backend.dds(pattern, data, x, None, epilogue.Epilogue("relu", True, 1), bias, config=pmd.DdsConfig(max_len=2),
                interpret=plgpu.InterpretGPUParams(detect_races=True))  # fmt: skip
    assert_close(y, *_epilogue_oracle(want, scale, bias, 1, "relu"), jnp.bfloat16)
    assert gpu_callbacks.get_races().races_found is False


def test_interpret_default_follows_blocksparse_interpret():
    """interpret=None reads blocksparse.interpret() (how CI runs the kernels on the CPU)."""
    pattern, data, x, want, scale = _problem("single", (64, 64), jnp.bfloat16, m=64)
    with bs.interpret():
        y = jax.jit(lambda d, x: backend.dds(pattern, d, x))(data, x)
    assert_close(y, want, scale, jnp.bfloat16)


def test_backend_runs_forward_fused_and_gradients():
    """bs.matmul(x, W, implementation=("mosaic", "xla")) runs this kernel for the forward, the fused
    forward, the x-gradient (a dds on the transposed pattern) and the sdd of the W-gradient."""
    pattern, data, x, want, scale = _problem("empty_cols", (64, 64), jnp.bfloat16, shape=(256, 256), m=2 * 24)
    W = bs.BlockSparseMatrix(pattern, data)
    x3 = x.reshape(2, 24, 256)  # batch dimensions are folded into the rows
    bias = jnp.linspace(-1.0, 1.0, 256, dtype=jnp.bfloat16)
    impl = ("mosaic", "xla")
    with bs.interpret(), bs.dispatch_log() as log:
        y = bs.matmul(x3, W, implementation=impl)
        f = bs.matmul(x3, W, bias=bias, activation="tanh", implementation=impl)
        # jitted: eagerly the backward's glue compiles op by op (the dispatch log is written while tracing)
        g = jax.jit(jax.grad(lambda x, W: bs.matmul(x, W, implementation=impl).astype(jnp.float32).sum(), (0, 1)))(
            x3, W
        )
    assert log == [("dds", "mosaic"), ("dds+epilogue", "mosaic"), ("dds", "mosaic"), ("dds", "mosaic"),
                   ("sdd", "mosaic")]  # fmt: skip
    assert_close(y.reshape(48, 256), want, scale, jnp.bfloat16)
    want_f, scale_f = _epilogue_oracle(want, scale, bias.astype(jnp.float32), 1, "tanh")
    assert_close(f.reshape(48, 256), want_f, scale_f, jnp.bfloat16)
    wd = to_dense64(W)  # d(sum x @ W)/dx = 1 @ W^T: every row is W's row sums
    assert_close(g[0].reshape(48, 256), np.broadcast_to(wd.sum(1), (48, 256)),
                 np.broadcast_to(np.abs(wd).sum(1), (48, 256)), jnp.bfloat16)  # fmt: skip
    ref = jax.jit(jax.grad(lambda W: bs.matmul(x3, W, implementation="xla").astype(jnp.float32).sum()))(W)
    got_dw, want_dw = np.asarray(g[1].data, np.float32), np.asarray(ref.data, np.float32)
    np.testing.assert_allclose(got_dw, want_dw, rtol=2e-2, atol=0.05)


def test_backend_refuses_float32_and_dispatch_falls_back():
    """float32 operands: the kernel refuses with its reason and implementation=("mosaic", "xla") runs XLA."""
    W = bs.random(jax.random.key(0), (128, 128), 64, 0.5, jnp.float32)
    x = jnp.ones((64, 128), jnp.float32)
    with bs.interpret(), bs.dispatch_log() as log:
        y = bs.matmul(x, W, implementation=("mosaic", "xla"))
    assert log == [("dds", "xla")]
    want = np.asarray(x) @ np.asarray(W.to_dense())
    # float32 sums of 128 terms in XLA's order and NumPy's: relative 1e-5, absolute 1e-5 of the largest entry
    np.testing.assert_allclose(np.asarray(y), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    with bs.interpret(), pytest.raises(NotImplementedError, match="float16 or bfloat16 operands.*float32"):
        backend.dds(W.pattern, W.data, x)


def test_measured_speedup_reads_the_nearest_cell():
    def ms(b, k, d):
        return tuned.nearest_cell(tuned.H200.MOSAIC_DDS_SPEEDUP, b, k, d)

    for (b, k), row in tuned.H200.MOSAIC_DDS_SPEEDUP.items():  # every measured cell reads itself
        for d, speedup in row.items():
            assert ms(b, k, d) == speedup
    assert ms(128, 1773, 1 / 4) == ms(128, 384, 1 / 4) and ms(128, 1774, 1 / 4) == ms(128, 8192, 1 / 4)
    assert ms(64, 8192, 1.0) == ms(64, 8192, 1 / 4) and ms(64, 8192, 1e-6) == ms(64, 8192, 1 / 16)


def test_prefers_needs_a_hopper_gpu_half_operands_and_enough_rows():
    W = bs.random(jax.random.key(0), (8192, 8192), 128, 1 / 4, jnp.bfloat16)  # 1.43 on the H200
    bf = jnp.bfloat16

    def prefers(pattern, m, w_dtype, x_dtype):
        return order.default("dds", pattern, m, w_dtype, x_dtype)[0] == "mosaic"

    if hardware.hopper_problem() is not None:
        assert not prefers(W.pattern, 8192, bf, bf)  # not a Hopper GPU here
    with hardware.fake(hardware.H200):  # the check every rule shares
        assert prefers(W.pattern, 8192, bf, bf)
        assert not prefers(W.pattern, tuned.H200.PREFER_MIN_M - 1, bf, bf)
        assert not prefers(W.pattern, 8192, jnp.float16, bf)  # a mix promotes to float32
        assert not prefers(W.pattern, 8192, jnp.float32, jnp.float32)
        V = bs.random(jax.random.key(0), (384, 1536), 64, 1 / 16, jnp.bfloat16)  # k = 384, d = 1/16: slower
        slower = tuned.nearest_cell(tuned.H200.MOSAIC_DDS_SPEEDUP, 64, 384, 1 / 16) < tuned.H200.PREFER_MARGIN
        assert not prefers(V.pattern, 32768, bf, bf) and slower
        U = bs.random(jax.random.key(0), (256, 256), 16, 1 / 16, jnp.bfloat16)
        assert not prefers(U.pattern, 8192, bf, bf)  # b = 16: not this kernel's, and the banded one's is slower


# ----------------------------------------------------------------------------- real Hopper GPU
@pytest.mark.gpu
@pytest.mark.parametrize("b", [64, 128])
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("d", [4, 8])
def test_gpu_users_shape_matches_oracle(b, dtype, d):
    """4096 x 384 @ 384 x 1536 at density 1/d (the default plan, and forced tiles, depth and split columns),
    plain and fused (bias along the output columns, gelu), against the float64 oracle; Triton agrees."""
    _hopper()
    W = bs.random(jax.random.key(b + d), (384, 1536), b, 1 / d, dtype)
    x = jax.random.normal(jax.random.key(1), (4096, 384), dtype)
    want, scale = _oracle(W.pattern, W.data, x)
    deepest = pmd.DdsConfig(tm=256, stages=4, max_len=2) if b == 64 else pmd.DdsConfig(tm=128, stages=3, max_len=2)
    persistent = (pmd.DdsConfig(persistent=True), pmd.DdsConfig(persistent=True, max_len=1, grid_order="tiles"))
    forced = (pmd.DdsConfig(persistent=False), pmd.DdsConfig(tm=64, stages=2, max_len=1), deepest)
    for cfg in (None, *forced, *persistent):
        y = jax.jit(lambda w, x, cfg=cfg: backend.dds(W.pattern, w, x, config=cfg))(W.data, x)
        assert_close(y, want, scale, dtype, what=f"b={b} d=1/{d} {jnp.dtype(dtype).name} {cfg}")
    bias = jax.random.normal(jax.random.key(2), (1536,), jnp.float32)
    epi = epilogue.Epilogue("gelu", True, 1)
    y = jax.jit(lambda w, x, c: backend.dds(W.pattern, w, x, None, epi, c))(W.data, x, bias)
    assert_close(y, *_epilogue_oracle(want, scale, bias, 1, "gelu"), dtype, what="fused")
    triton = jax.jit(lambda x, W: bs.matmul(x, W, bias=bias, activation="gelu", implementation="pallas"))(x, W)
    np.testing.assert_allclose(np.asarray(y, np.float32), np.asarray(triton, np.float32), rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("b", [64, 128])
@pytest.mark.parametrize("dtype", HALF)
@settings(max_examples=4, deadline=None)
@given(data=st.data(), seed=st.integers(0, 2**16))
def test_gpu_strategy_patterns(b, dtype, data, seed):
    """The strategies' patterns on a Hopper GPU, default plan and max_len=3 (partials), plain and fused."""
    _hopper()
    pattern = data.draw(bst.block_patterns(block_size=(b, b), shape=(1024, 2048), kinds=KINDS))
    rng = np.random.default_rng(seed)
    w = jnp.asarray(rng.standard_normal((pattern.nnz_blocks, b, b)), dtype)
    x = jnp.asarray(rng.standard_normal((1000, 1024)), dtype)
    want, scale = _oracle(pattern, w, x)
    for cfg in (None, pmd.DdsConfig(max_len=3)):
        y = jax.jit(lambda w, x, cfg=cfg: backend.dds(pattern, w, x, config=cfg))(w, x)
        assert_close(y, want, scale, dtype, what=f"{cfg}")
    bias = jnp.asarray(rng.standard_normal(1000), jnp.float32)  # along the rows of x
    epi = epilogue.Epilogue("silu", True, 0)
    y = jax.jit(lambda w, x, c: backend.dds(pattern, w, x, jnp.float32, epi, c, config=pmd.DdsConfig(max_len=3)))(
        w, x, bias)  # fmt: skip
    assert_close(y, *_epilogue_oracle(want, scale, bias, 0, "silu"), dtype)


@pytest.mark.gpu
def test_gpu_default_order_runs_the_rule():
    """On an H200 implementation=None runs this kernel for x @ W where the table says so (b = 128, k = 8192,
    d = 1/4) and Triton where it does not (b = 64, k = 384, d = 1/16), forward and the x-gradient."""
    _hopper()
    for (k, n, b, d), want in (((8192, 2048, 128, 4), "mosaic"), ((384, 1536, 64, 16), "pallas")):
        W = bs.random(jax.random.key(b), (k, n), b, 1 / d, jnp.bfloat16)
        x = jax.random.normal(jax.random.key(2), (8192, k), jnp.bfloat16)
        with bs.dispatch_log() as log:
            y = jax.jit(bs.matmul)(x, W)
        assert log == [("dds", want)]
        ref = np.asarray(x, np.float64) @ to_dense64(W)
        assert_close(y, ref, np.abs(np.asarray(x, np.float64)) @ np.abs(to_dense64(W)), jnp.bfloat16)
