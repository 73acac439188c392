"""The Mosaic GPU (Hopper) dsd kernel: host preparation, CUDA lowering and the GPU interpreter on the
CPU; the real kernel on a Hopper GPU (``gpu`` mark) against the float64 oracle."""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import blocksparse as bs
from blocksparse.ops.matmul import api, pallas_mosaic
from blocksparse.ops.matmul.lowering import execute_dsd
from blocksparse.testing.oracles import assert_close, to_dense64

HALF = (jnp.bfloat16, jnp.float16)
BLOCKS = [(64, 64), (128, 128), (64, 128), (128, 64)]


def _mask(kind: str, gm: int, gk: int, rng) -> np.ndarray:
    """Patterns with the shapes that stress a row-split work list."""
    mask = np.zeros((gm, gk), bool)
    if kind == "random":  # some empty rows
        mask = rng.random((gm, gk)) < 0.4
        mask[rng.integers(gm)] = False
    elif kind == "full_row":  # one full row (split by a small max_len), the rest empty
        mask[gm // 2] = True
    elif kind == "full_col":
        mask[:, gk - 1] = True
    elif kind == "single":
        mask[gm - 1, 0] = True
    return mask


def _problem(kind, block, dtype, shape=(256, 256), n=200, seed=0):
    rng = np.random.default_rng(seed)
    (m, k), (bh, bw) = shape, block
    pattern = bs.BlockPattern.from_mask(_mask(kind, m // bh, k // bw, rng), block)
    data = jnp.asarray(rng.standard_normal((pattern.nnz_blocks, bh, bw)), dtype)
    x = jnp.asarray(rng.standard_normal((k, n)), dtype)
    W = bs.BlockSparseMatrix(pattern, data)
    wd, xd = to_dense64(W), np.asarray(x.astype(jnp.float32), np.float64)
    return pattern, data, x, wd @ xd, np.abs(wd) @ np.abs(xd)


# ----------------------------------------------------------------------------- host preparation
@settings(max_examples=15)
@given(
    block=st.sampled_from(BLOCKS),
    grid=st.tuples(st.integers(1, 5), st.integers(1, 5)),
    n=st.integers(1, 600),
    density=st.floats(0.0, 1.0),
    max_len=st.one_of(st.none(), st.integers(1, 3)),
    seed=st.integers(0, 2**16),
)
def test_plan_pads_and_schedules_like_the_oracle(block, grid, n, density, max_len, seed):
    """The kernel's contract, run in plain JAX: the plan's schedule on x padded to the tile gives W @ x."""
    rng = np.random.default_rng(seed)
    (bh, bw), (gm, gk) = block, grid
    pattern = bs.BlockPattern.from_mask(rng.random((gm, gk)) < density, block)
    p = pallas_mosaic.plan(pattern, n, 2, pallas_mosaic.MosaicConfig(max_len=max_len))
    p.sched.check()
    assert p.n_pad % p.tn == 0 and p.n_pad - p.tn < n <= p.n_pad and p.tiles == p.n_pad // p.tn
    assert bh * p.tn <= 128 * 128 and 1 <= p.stages <= 3
    assert p.smem_bytes(bh, bw, 2) <= 227 * 1024
    data = jnp.asarray(rng.standard_normal((pattern.nnz_blocks, bh, bw)), jnp.float32)
    x = jnp.asarray(rng.standard_normal((gk * bw, n)), jnp.float32)
    if pattern.nnz_blocks == 0:  # no launch: zeros
        y = pallas_mosaic.dsd(pattern, data.astype(jnp.bfloat16), x.astype(jnp.bfloat16), interpret=False)
        assert y.shape == (gm * bh, n) and not np.asarray(y, np.float32).any()
        return
    xp = jnp.pad(x, ((0, 0), (0, p.n_pad - n)))
    sched = p.sched
    if sched.num_partials == 0:  # execute_dsd needs one partial slot: give it an unused one
        sched = dataclasses.replace(sched, partial_seg=np.zeros(1, np.int32))
    y = execute_dsd(sched, data, xp)[:, :n]
    wd = to_dense64(bs.BlockSparseMatrix(pattern, data))
    xd = np.asarray(x, np.float64)
    assert_close(y, wd @ xd, np.abs(wd) @ np.abs(xd), jnp.float32)


def test_plan_tiles_and_stages():
    p64 = bs.BlockPattern.random(0, (8192, 8192), (64, 64), 1 / 16)
    p128 = bs.BlockPattern.random(0, (8192, 8192), (128, 128), 1 / 16)
    wide = pallas_mosaic.plan(p64, 4096)
    assert (wide.tn, wide.tiles, wide.stages) == (256, 16, 3)  # 3 x (8 + 32) KiB
    big = pallas_mosaic.plan(p128, 4096)
    assert (big.tn, big.stages) == (128, 3)  # 3 x 64 KiB
    tall = pallas_mosaic.plan(bs.BlockPattern.random(0, (1024, 1024), (64, 128), 0.5), 4096)
    assert (tall.tn, tall.stages) == (256, 2)  # 80 KiB a stage: 3 would not fit
    assert pallas_mosaic.plan(p64, 10).tn == 64


def test_plan_refuses_what_the_kernel_cannot_take():
    p = bs.BlockPattern.random(0, (256, 256), (32, 32), 0.5)
    with pytest.raises(NotImplementedError, match=r"block sides in \(64, 128\).*got \(32, 32\)"):
        pallas_mosaic.plan(p, 128)
    p = bs.BlockPattern.random(0, (256, 256), (128, 128), 0.5)
    with pytest.raises(NotImplementedError, match=r"bh \* tn <= 16384.*got 128 \* 256"):
        pallas_mosaic.plan(p, 128, config=pallas_mosaic.MosaicConfig(tn=256))
    with pytest.raises(NotImplementedError, match="shared memory.*got stages=4"):
        pallas_mosaic.plan(p, 4096, config=pallas_mosaic.MosaicConfig(stages=4))
    with pytest.raises(ValueError, match="Expected stages >= 2. Got 1."):
        pallas_mosaic.MosaicConfig(stages=1)
    with pytest.raises(ValueError, match="Expected tn in"):
        pallas_mosaic.MosaicConfig(tn=96)


# ----------------------------------------------------------------------------- lowering for CUDA
def _lower_for_cuda(block, dtype, n, stages=None, out_dtype=None):
    pattern, data, x, _, _ = _problem("random", block, dtype, shape=(512, 512), n=n)
    cfg = pallas_mosaic.MosaicConfig(stages=stages, max_len=2)  # max_len=2: split rows, partials too
    fn = jax.jit(lambda d, x: pallas_mosaic.dsd(pattern, d, x, out_dtype, config=cfg, interpret=False))
    return fn.trace(data, x).lower(lowering_platforms=("cuda",)).as_text()


@pytest.mark.parametrize(
    "block,dtype,n",
    [((64, 64), jnp.bfloat16, 4096), ((128, 128), jnp.float16, 4096), ((64, 128), jnp.bfloat16, 300),
     ((128, 64), jnp.float16, 64)],
)  # fmt: skip
def test_kernel_lowers_for_cuda(block, dtype, n):
    """The Pallas -> Mosaic GPU lowering (wgmma shapes and layouts, swizzles, the shared memory budget)."""
    txt = _lower_for_cuda(block, dtype, n)
    assert "mosaic_gpu" in txt
    assert "bs_mgpu_dsd" in txt


def test_lowering_checks_the_shared_memory_budget_the_plan_uses():
    """The largest stage the plan allows (64 x 128 blocks, tn = 256: 2 stages) lowers; one more does not."""
    assert "mosaic_gpu" in _lower_for_cuda((64, 128), jnp.bfloat16, 4096)
    from blocksparse.ops.matmul import pallas_mosaic as pm

    pattern, data, x, _, _ = _problem("random", (64, 128), jnp.bfloat16, shape=(512, 512), n=4096)
    p = pm.plan(pattern, 4096)
    p3 = pm.MosaicPlan(p.tn, p.tiles, p.n_pad, 3, p.sched)
    fn = jax.jit(lambda d, x: pm._launch(p3, 512, d, x, jnp.bfloat16, interpret=False))
    with pytest.raises(ValueError, match="exceeds available shared memory"):
        fn.trace(data, x).lower(lowering_platforms=("cuda",))


# ----------------------------------------------------------------------------- GPU interpreter
@pytest.mark.parametrize("kind", ["random", "full_row", "full_col", "single", "empty"])
def test_interpreter_matches_oracle(kind):
    """The kernel itself (TMA copies, barriers, the pipeline, partial slots) in Pallas' GPU interpreter."""
    block, dtype = ((64, 64), jnp.bfloat16) if kind != "full_col" else ((128, 64), jnp.float16)
    pattern, data, x, want, scale = _problem(kind, block, dtype, n=200)
    cfg = pallas_mosaic.MosaicConfig(max_len=2)  # the full row is split into partials
    y = pallas_mosaic.dsd(pattern, data, x, config=cfg, interpret=True)
    assert y.dtype == dtype
    assert_close(y, want, scale, dtype)
    if kind == "full_row":
        assert pallas_mosaic.plan(pattern, 200, config=cfg).sched.num_partials == 2


def test_interpreter_float32_output_and_two_stages():
    pattern, data, x, want, scale = _problem("random", (64, 128), jnp.float16, n=64)
    y = pallas_mosaic.dsd(pattern, data, x, jnp.float32, config=pallas_mosaic.MosaicConfig(stages=2), interpret=True)
    assert y.dtype == jnp.float32
    assert_close(y, want, scale, jnp.float16)


# ----------------------------------------------------------------------------- backend and dispatch
@pytest.fixture
def mosaic_registered(monkeypatch):
    """Register the backend for this test only (api.py does not list it yet)."""
    monkeypatch.setitem(api._BACKEND_PATHS, "mosaic", "blocksparse.ops.matmul.pallas_mosaic:MosaicBackend")
    yield
    api._BACKENDS.pop("mosaic", None)


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="checks the refusal on a machine without a GPU")
def test_backend_refuses_without_a_gpu_and_dispatch_falls_back(mosaic_registered):
    W = bs.random(jax.random.key(0), (256, 256), 64, 0.5, jnp.bfloat16)
    x = jnp.ones((256, 8), jnp.bfloat16)
    s = api.OpStatic(("mosaic",), jnp.dtype(jnp.bfloat16), pattern=W.pattern)
    with pytest.raises(NotImplementedError, match="no GPU"):
        pallas_mosaic.MosaicBackend().dsd(s, W.data, x)
    with bs.dispatch_log() as log:
        y = bs.matmul(W, x, implementation=("mosaic", "xla"))
    assert log == [("dsd", "xla")]
    np.testing.assert_allclose(np.asarray(y, np.float32), np.asarray(bs.matmul(W, x, implementation="xla"), np.float32))


def test_backend_reasons():
    b = pallas_mosaic.MosaicBackend()
    W = bs.random(jax.random.key(0), (128, 128), 32, 0.5, jnp.bfloat16)
    s = api.OpStatic(("mosaic",), jnp.dtype(jnp.bfloat16), pattern=W.pattern)
    with bs.interpret():
        with pytest.raises(NotImplementedError, match=r"got \(32, 32\)"):
            b.dsd(s, W.data, jnp.ones((128, 4), jnp.bfloat16))
        W = bs.random(jax.random.key(0), (128, 128), 64, 0.5, jnp.float32)
        s = s.but(pattern=W.pattern, out_dtype=jnp.dtype(jnp.float32))
        with pytest.raises(NotImplementedError, match="float16 or bfloat16 operands.*float32"):
            b.dsd(s, W.data, jnp.ones((128, 4), jnp.float32))
    for op in ("dds", "sdd", "dyn_dsd", "dyn_sdd", "dsd_fused", "dds_fused", "dyn_dsd_fused"):
        with pytest.raises(NotImplementedError, match="only the static dsd"):
            getattr(b, op)(s)


@pytest.mark.parametrize(
    "platform,kind,cc,reason",
    [("gpu", "NVIDIA H200", "9.0", None), ("gpu", "NVIDIA A100-SXM4-80GB", "8.0", "requires a Hopper GPU.*A100.*8.0"),
     ("gpu", "NVIDIA B200", "10.0", "requires a Hopper GPU.*B200"), ("cpu", "cpu", None, "no GPU")],
)  # fmt: skip
def test_hopper_check(monkeypatch, platform, kind, cc, reason):
    class Fake:
        pass

    dev = Fake()
    dev.platform, dev.device_kind, dev.compute_capability = platform, kind, cc
    monkeypatch.setattr(pallas_mosaic.jax, "devices", lambda: [dev])
    why = pallas_mosaic.hopper_problem()
    if reason is None:
        assert why is None
    else:
        assert why is not None and re.search(reason, why), why


def test_dispatch_runs_the_kernel_in_the_interpreter_with_gradients(mosaic_registered):
    """Forward and dx (a dsd on the transposed pattern) on the Mosaic kernel, interpreted; the sdd falls back."""
    pattern, data, x, want, scale = _problem("random", (64, 64), jnp.bfloat16, n=40)
    W = bs.BlockSparseMatrix(pattern, data)
    with bs.interpret(), bs.dispatch_log() as log:
        y = bs.matmul(W, x, implementation=("mosaic", "xla"))
        g = jax.grad(lambda x: bs.matmul(W, x, implementation=("mosaic", "xla")).astype(jnp.float32).sum())(x)
    assert log == [("dsd", "mosaic")] * 3 + [("sdd", "xla")]
    assert_close(y, want, scale, jnp.bfloat16)
    wd = to_dense64(W)
    assert_close(g, wd.sum(0)[:, None] * np.ones((1, 40)), np.abs(wd).sum(0)[:, None] * np.ones((1, 40)), jnp.bfloat16)


# ----------------------------------------------------------------------------- real Hopper GPU
def _hopper():
    why = pallas_mosaic.hopper_problem()
    if why is not None:
        pytest.skip(why)


@pytest.mark.gpu
@pytest.mark.parametrize("b", [64, 128])
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("kind", ["random", "full_row", "full_col", "single", "empty"])
def test_gpu_matches_oracle(b, dtype, kind):
    _hopper()
    pattern, data, x, want, scale = _problem(kind, (b, b), dtype, shape=(2048, 1024), n=1000, seed=b)
    for cfg in (None, pallas_mosaic.MosaicConfig(max_len=3)):  # max_len=3: long rows split into partials
        y = jax.jit(lambda d, x, cfg=cfg: pallas_mosaic.dsd(pattern, d, x, config=cfg))(data, x)
        assert_close(y, want, scale, dtype, what=f"{kind} b={b} {cfg}")


@pytest.mark.gpu
@pytest.mark.parametrize("block", [(64, 128), (128, 64)])
@pytest.mark.parametrize("n", [64, 4096])
def test_gpu_rectangular_blocks_and_wide_tiles(block, n):
    _hopper()
    pattern, data, x, want, scale = _problem("random", block, jnp.bfloat16, shape=(1024, 1024), n=n)
    y = jax.jit(lambda d, x: pallas_mosaic.dsd(pattern, d, x, jnp.float32))(data, x)
    assert_close(y, want, scale, jnp.bfloat16)


@pytest.mark.gpu
def test_gpu_backend_dispatch(mosaic_registered):
    _hopper()
    W = bs.random(jax.random.key(1), (1024, 1024), 128, 1 / 4, jnp.bfloat16)
    x = jax.random.normal(jax.random.key(2), (1024, 512), jnp.bfloat16)
    with bs.dispatch_log() as log:
        y = jax.jit(lambda W, x: bs.matmul(W, x, implementation="mosaic"))(W, x)
    assert log == [("dsd", "mosaic")]
    wd, xd = to_dense64(W), np.asarray(x.astype(jnp.float32), np.float64)
    assert_close(y, wd @ xd, np.abs(wd) @ np.abs(xd), jnp.bfloat16)
