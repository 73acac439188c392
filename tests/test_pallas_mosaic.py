"""The Mosaic GPU (Hopper) dsd kernel: host preparation, CUDA lowering and the GPU interpreter on the
CPU; the real kernel on a Hopper GPU (``gpu`` mark) against the float64 oracle."""

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

import blocksparse as bs
from blocksparse import hardware
from blocksparse.ops.matmul import api, epilogue, order, tuned
from blocksparse.ops.matmul.mosaic import backend
from blocksparse.ops.matmul.mosaic import dsd as mdsd
from blocksparse.ops.matmul.schedule import execute_dsd
from blocksparse.testing import strategies as bst
from blocksparse.testing.oracles import assert_close, to_dense64

HALF = (jnp.bfloat16, jnp.float16)
GPU_KINDS = ("empty_rows", "full_row", "single", "full_col", "random", "empty")
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
@settings(max_examples=examples(15))
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
    p = backend.dsd_plan(pattern, n, 2, mdsd.MosaicConfig(max_len=max_len))
    p.sched.check()
    assert p.n_pad % p.tn == 0 and p.n_pad - p.tn < n <= p.n_pad and p.tiles == p.n_pad // p.tn
    assert bh * p.tn <= 128 * 128 and 1 <= p.stages <= 3
    assert p.smem_bytes(bh, bw, 2) <= 227 * 1024
    data = jnp.asarray(rng.standard_normal((pattern.nnz_blocks, bh, bw)), jnp.float32)
    x = jnp.asarray(rng.standard_normal((gk * bw, n)), jnp.float32)
    if pattern.nnz_blocks == 0:  # no launch: zeros
        y = backend.dsd(pattern, data.astype(jnp.bfloat16), x.astype(jnp.bfloat16), interpret=False)
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
    wide = backend.dsd_plan(p64, 4096)
    assert (wide.tn, wide.tiles, wide.stages) == (128, 32, 3)  # 3 x (8 + 16) KiB; 128 columns measured faster
    big = backend.dsd_plan(p128, 4096)
    assert (big.tn, big.stages) == (128, 3)  # 3 x 64 KiB
    tall_pattern = bs.BlockPattern.random(0, (1024, 1024), (64, 128), 0.5)
    tall = backend.dsd_plan(tall_pattern, 4096, config=mdsd.MosaicConfig(tn=256))
    assert (tall.tn, tall.stages) == (256, 2)  # 80 KiB a stage: 3 would not fit
    assert backend.dsd_plan(p64, 10).tn == 64


def test_plan_refuses_what_the_kernel_cannot_take():
    p = bs.BlockPattern.random(0, (256, 256), (32, 32), 0.5)
    with pytest.raises(NotImplementedError, match=r"block sides in \(64, 128\).*got \(32, 32\)"):
        backend.dsd_plan(p, 128)
    p = bs.BlockPattern.random(0, (256, 256), (128, 128), 0.5)
    with pytest.raises(NotImplementedError, match=r"bh \* tn <= 16384.*got 128 \* 256"):
        backend.dsd_plan(p, 128, config=mdsd.MosaicConfig(tn=256))
    with pytest.raises(NotImplementedError, match="shared memory.*got stages=4"):
        backend.dsd_plan(p, 4096, config=mdsd.MosaicConfig(stages=4))
    with pytest.raises(ValueError, match="Expected stages >= 2. Got 1."):
        mdsd.MosaicConfig(stages=1)
    with pytest.raises(ValueError, match="Expected tn in"):
        mdsd.MosaicConfig(tn=96)


# ----------------------------------------------------------------------------- lowering for CUDA
def _lower_for_cuda(block, dtype, n, stages=None, out_dtype=None, tn=None):
    pattern, data, x, _, _ = _problem("random", block, dtype, shape=(512, 512), n=n)
    cfg = mdsd.MosaicConfig(stages=stages, max_len=2, tn=tn)  # max_len=2: split rows, partials too
    fn = jax.jit(lambda d, x: backend.dsd(pattern, d, x, out_dtype, config=cfg, interpret=False))
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
    assert "mosaic_gpu" in _lower_for_cuda((64, 128), jnp.bfloat16, 4096, tn=256)
    pm = mdsd
    pattern, data, x, _, _ = _problem("random", (64, 128), jnp.bfloat16, shape=(512, 512), n=4096)
    p = backend.dsd_plan(pattern, 4096, config=pm.MosaicConfig(tn=256))
    p3 = pm.MosaicPlan(p.tn, p.tiles, p.n_pad, 3, p.sched)
    fn = jax.jit(lambda d, x: pm._launch(p3, 512, d, x, jnp.bfloat16, interpret=False))
    with pytest.raises(ValueError, match="exceeds available shared memory"):
        fn.trace(data, x).lower(lowering_platforms=("cuda",))


# ----------------------------------------------------------------------------- GPU interpreter
@sweep("kind", ["random", "full_row", "full_col", "single", "empty"], quick=["full_row", "empty"])
def test_interpreter_matches_oracle(kind):
    """The kernel itself (TMA copies, barriers, the pipeline, partial slots) in Pallas' GPU interpreter."""
    block, dtype = ((64, 64), jnp.bfloat16) if kind != "full_col" else ((128, 64), jnp.float16)
    pattern, data, x, want, scale = _problem(kind, block, dtype, n=200)
    cfg = mdsd.MosaicConfig(max_len=2)  # the full row is split into partials
    y = backend.dsd(pattern, data, x, config=cfg, interpret=True)
    assert y.dtype == dtype
    assert_close(y, want, scale, dtype)
    if kind == "full_row":
        assert backend.dsd_plan(pattern, 200, config=cfg).sched.num_partials == 2


@sweep("order", mdsd.GRID_ORDERS)
def test_interpreter_both_grid_orders(order):
    """Either launch order (units or column tiles fastest) computes the same product: split rows, several
    column tiles, both stores."""
    pattern, data, x, want, scale = _problem("full_row", (64, 64), jnp.bfloat16, n=200)
    cfg = mdsd.MosaicConfig(tn=64, max_len=2, grid_order=order)
    p = backend.dsd_plan(pattern, 200, config=cfg)
    assert p.grid_order == order and sorted(p.grid[0]) == sorted((p.sched.num_units, p.tiles))
    assert p.grid[1][-1] == ("t" if order == "tiles" else "u")  # Mosaic GPU launches the last axis fastest
    assert_close(backend.dsd(pattern, data, x, config=cfg, interpret=True), want, scale, jnp.bfloat16)
    assert backend.dsd_plan(pattern, 200).grid_order == backend.default_grid_order(pattern)
    sparse = bs.BlockPattern.from_mask(np.eye(64, dtype=bool), (64, 64))  # density 1/64: units first
    assert backend.default_grid_order(sparse) == "units"
    assert backend.default_grid_order(pattern) == "tiles"  # a full row of 4 x 4 blocks
    with pytest.raises(ValueError, match="grid_order"):
        mdsd.MosaicConfig(grid_order="rows")


@sweep("kind,order,programs", [("full_row", "units", 3), ("random", "tiles", None), ("single", "units", 1),
                               ("full_col", "tiles", 2)], quick=2)  # fmt: skip
def test_interpreter_persistent_kernel(kind, order, programs):
    """The persistent kernel (one pipeline across a program's items; split rows, several column tiles, items
    of one or no block) matches the oracle, and its schedule holds every (unit, tile) item and block once."""
    block = (64, 64) if kind != "full_col" else (128, 64)
    pattern, data, x, want, scale = _problem(kind, block, jnp.bfloat16, n=200)
    # the interpreter has no semaphores: XLA sums the split rows (the in-kernel sum: test_mosaic_split_reduce.py)
    cfg = mdsd.MosaicConfig(tn=64, max_len=2, grid_order=order, persistent=True, programs=programs,
                                     reduce="xla")  # fmt: skip
    p = backend.dsd_plan(pattern, 200, config=cfg)
    ps, s = p.persistent, p.sched
    assert ps.programs == (programs or min(s.num_units * p.tiles, ps.programs))
    assert ps.prog_item_start[-1] == s.num_units * p.tiles and ps.num_steps == s.nnz * p.tiles
    got = sorted(zip(ps.item_dest.tolist(), ps.item_tile.tolist(), ps.item_len.tolist(), strict=True))
    want_items = sorted((d, t, n) for d, n in zip(s.unit_dest.tolist(), s.unit_len.tolist(), strict=True)
                        for t in range(p.tiles))  # fmt: skip
    assert got == want_items
    assert np.bincount(ps.step_id, minlength=s.nnz)[: s.nnz].tolist() == [p.tiles] * s.nnz  # each block once a tile
    bh, bw = block
    staging = bh * 64 * (2 + (4 if s.num_partials else 0))  # the output tile, and a float32 one for split rows
    assert p.smem_bytes(bh, bw, 2) == p.stages * (bh * bw + bw * 64) * 2 + staging
    y = backend.dsd(pattern, data, x, config=cfg, interpret=True)
    assert_close(y, want, scale, jnp.bfloat16)


def test_persistent_kernel_lowers_for_cuda_and_refuses_what_it_lacks():
    for block, ml in (((64, 64), 2), ((128, 128), None)):
        pattern, data, x, _, _ = _problem("random", block, jnp.bfloat16, shape=(512, 512), n=4096)
        cfg = mdsd.MosaicConfig(max_len=ml, persistent=True)
        fn = jax.jit(lambda d, x, p=pattern, cfg=cfg: backend.dsd(p, d, x, config=cfg, interpret=False))
        assert "bs_mgpu_dsd" in fn.trace(data, x).lower(lowering_platforms=("cuda",)).as_text()
    with pytest.raises(ValueError, match="programs"):
        mdsd.MosaicConfig(programs=4)
    with pytest.raises(ValueError, match="consumers=1"):
        mdsd.MosaicConfig(persistent=True, consumers=2)
    epi = epilogue.Epilogue("relu", False, 1)
    with pytest.raises(NotImplementedError, match="persistent=False"):
        backend.dsd(pattern, data, x, config=mdsd.MosaicConfig(persistent=True), epi=epi)


def test_interpreter_float32_output_and_two_stages():
    pattern, data, x, want, scale = _problem("random", (64, 128), jnp.float16, n=64)
    y = backend.dsd(pattern, data, x, jnp.float32, config=mdsd.MosaicConfig(stages=2), interpret=True)
    assert y.dtype == jnp.float32
    assert_close(y, want, scale, jnp.float16)


def test_interpreter_four_stages_and_wide_tiles_at_small_n():
    """Knobs the benchmark can force for b = 64: a 4-stage pipeline (4 x 40 KiB) and tn = 256 at n = 256."""
    pattern, data, x, want, scale = _problem("full_row", (64, 64), jnp.bfloat16, n=256)
    cfg = mdsd.MosaicConfig(tn=256, stages=4, persistent=False)  # the one-program-per-item kernel
    assert backend.dsd_plan(pattern, 256, config=cfg).smem_bytes(64, 64, 2) == 4 * 40 * 1024
    both = dataclasses.replace(cfg, persistent=True)  # plus its 256 x 64 bfloat16 staging tile (no split rows)
    assert backend.dsd_plan(pattern, 256, config=both).smem_bytes(64, 64, 2) == 4 * 40 * 1024 + 64 * 256 * 2
    assert_close(backend.dsd(pattern, data, x, config=cfg, interpret=True), want, scale, jnp.bfloat16)
    txt = _lower_for_cuda((64, 64), jnp.bfloat16, 4096, stages=4, tn=256)
    assert "bs_mgpu_dsd_64x64_tn256" in txt


def test_two_consumer_warpgroups():
    """consumers=2: two warpgroups on two column tiles share W's copy (interpreted, with split rows and
    empty units; the interpreter runs both warpgroups and counts the "free" barrier's two arrivals);
    b = 64, tn = 128, 3 stages (216 KiB) lowers for CUDA; the plan counts the staging buffers."""
    pattern, data, x, want, scale = _problem("full_row", (64, 64), jnp.bfloat16, n=200)
    cfg = mdsd.MosaicConfig(tn=64, consumers=2, max_len=2)
    p = backend.dsd_plan(pattern, 200, config=cfg)
    assert (p.tn, p.tiles, p.n_pad, p.consumers) == (64, 2, 256, 2) and p.sched.num_partials == 2
    assert_close(backend.dsd(pattern, data, x, config=cfg, interpret=True), want, scale, jnp.bfloat16)
    big = mdsd.MosaicConfig(tn=128, stages=3, consumers=2)
    assert backend.dsd_plan(pattern, 4096, config=big).smem_bytes(64, 64, 2) == 3 * 40 * 1024 + 2 * 64 * 128 * 6
    fn = jax.jit(lambda d, x: backend.dsd(pattern, d, x, config=big, interpret=False))
    assert "_2wg" in fn.trace(data, jnp.zeros((256, 4096), jnp.bfloat16)).lower(lowering_platforms=("cuda",)).as_text()
    with pytest.raises(NotImplementedError, match="shared memory"):  # float32 staging: 3 stages no longer fit
        backend.dsd_plan(pattern, 4096, config=big, out_itemsize=4)
    with pytest.raises(NotImplementedError, match="requires consumers=1 for a fused epilogue"):
        backend.dsd(pattern, data, x, config=cfg, epi=epilogue.Epilogue("relu"))
    with pytest.raises(ValueError, match="Expected consumers 1 or 2. Got 3."):
        mdsd.MosaicConfig(consumers=3)


# ----------------------------------------------------------------------------- fused epilogue
def _epilogue_oracle(want, scale, bias, axis, activation):
    """float64 product + bias, then the activation (float32: the kernels' own precision); its scale."""
    b = np.asarray(bias, np.float64)
    b = b[None, :] if axis == 1 else b[:, None]
    z = want + b
    y = z if activation is None else np.asarray(epilogue.ACTIVATIONS[activation](jnp.asarray(z, jnp.float32)))
    return y, 1.2 * (scale + np.abs(b))  # the activations' slopes are below 1.2


@sweep("activation", [None, *epilogue.ACTIVATIONS])
def test_fused_epilogue_lowers_for_cuda(activation):
    """Every activation and both bias axes go through the Mosaic GPU lowering (layouts of the bias broadcast)."""
    pattern, data, x, _, _ = _problem("random", (64, 64), jnp.bfloat16, shape=(512, 512), n=300)
    for axis in (0, 1):
        epi = epilogue.Epilogue(activation, True, axis)
        bias = jnp.zeros(300 if axis == 1 else 512, jnp.float32)
        fn = jax.jit(lambda d, x, b, epi=epi: backend.dsd(
            pattern, d, x, jnp.bfloat16, config=mdsd.MosaicConfig(max_len=2), interpret=False, epi=epi,
            bias=b))  # fmt: skip
        txt = fn.trace(data, x, bias).lower(lowering_platforms=("cuda",)).as_text()
        assert re.search(r"bs_mgpu_dsd_64x64_tn\d+_epi", txt)
    fn = jax.jit(lambda d, x: backend.dsd(pattern, d, x, interpret=False, epi=epilogue.Epilogue(activation)))
    assert "_epi" in fn.trace(data, x).lower(lowering_platforms=("cuda",)).as_text()  # no bias operand


@sweep(
    "kind,block,dtype,out_dtype,activation,axis",
    [("full_row", (64, 64), jnp.bfloat16, jnp.bfloat16, "gelu", 1),  # split rows: the epilogue after the sum
     ("random", (128, 64), jnp.float16, jnp.float32, "silu", 0), ("empty", (64, 64), jnp.bfloat16, None, "sigmoid", 1)],
)  # fmt: skip
def test_interpreter_fused_epilogue_matches_oracle(kind, block, dtype, out_dtype, activation, axis):
    pattern, data, x, want, scale = _problem(kind, block, dtype, n=200)
    bias = jnp.asarray(np.random.default_rng(1).standard_normal(200 if axis == 1 else pattern.shape[0]), jnp.float32)
    epi = epilogue.Epilogue(activation, True, axis)
    cfg = mdsd.MosaicConfig(max_len=2)
    y = backend.dsd(pattern, data, x, out_dtype, config=cfg, interpret=True, epi=epi, bias=bias)
    assert y.dtype == (out_dtype or dtype)
    assert_close(y, *_epilogue_oracle(want, scale, bias, axis, activation), out_dtype or dtype)


def test_fused_epilogue_checks_its_bias():
    pattern, data, x, _, _ = _problem("random", (64, 64), jnp.bfloat16, n=8)
    with pytest.raises(ValueError, match=r"Expected a bias of shape \(8,\) \(bias_axis=1\). Got \(256,\)."):
        backend.dsd(pattern, data, x, epi=epilogue.Epilogue(None, True, 1), bias=jnp.zeros(256))
    with pytest.raises(ValueError, match="Expected a bias array exactly when the epilogue has a bias"):
        backend.dsd(pattern, data, x, epi=epilogue.Epilogue("relu"), bias=jnp.zeros(8))


@pytest.mark.slow
def test_matmul_fused_runs_on_mosaic_with_gradients():
    """bs.matmul(bias=, activation=, implementation="mosaic"): the fused kernel forward (matrix and vector x).
    Under grad the forward is the plain product in float32 on the kernel, the epilogue in XLA; the float32
    cotangent makes dx a mixed bf16 x float32 product, which the kernel refuses: Triton takes it."""
    pattern, data, x, _, _ = _problem("full_row", (64, 64), jnp.bfloat16, n=24)
    W = bs.BlockSparseMatrix(pattern, data)
    bias = jnp.linspace(-1.0, 1.0, 24, dtype=jnp.bfloat16)
    bias_m = jnp.linspace(-1.0, 1.0, 256, dtype=jnp.bfloat16)

    def f(x, b, impl):
        return bs.matmul(W, x, bias=b, activation="gelu_tanh", implementation=impl).astype(jnp.float32).sum()

    # the gradients jitted: eagerly the backward's glue compiles op by op (the forwards: eager)
    grad = jax.jit(jax.grad(f, argnums=(0, 1)), static_argnums=2)
    with bs.interpret(), bs.dispatch_log() as log:
        y = bs.matmul(W, x, bias=bias, activation="gelu", implementation="mosaic")
        v = bs.matmul(W, x[:, 0], bias=bias_m, activation="relu", implementation="mosaic")  # the bias along rows
        g = grad(x, bias, ("mosaic", "pallas"))
    assert log == [("dsd+epilogue", "mosaic")] * 2 + [("dsd", "mosaic"), ("dsd", "pallas"), ("sdd", "pallas")]
    ref = bs.matmul(W, x, bias=bias, activation="gelu", implementation="xla")
    np.testing.assert_allclose(np.asarray(y, np.float32), np.asarray(ref, np.float32), rtol=2e-2, atol=2e-2)
    ref_v = bs.matmul(W, x[:, 0], bias=bias_m, activation="relu", implementation="xla")
    np.testing.assert_allclose(np.asarray(v, np.float32), np.asarray(ref_v, np.float32), rtol=2e-2, atol=2e-2)
    g_ref = grad(x, bias, "xla")
    for a, b in zip(g, g_ref, strict=True):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=3e-2, atol=3e-2)


def test_fused_epilogue_the_kernel_cannot_take_falls_back_to_triton():
    """32 x 64 blocks (neither Mosaic kernel's): the Mosaic backend refuses dsd_fused with its reason and the Triton
    kernel serves it."""
    W = bs.random(jax.random.key(0), (128, 128), (32, 64), 0.5, jnp.bfloat16)
    x = jax.random.normal(jax.random.key(1), (128, 16), jnp.bfloat16)
    bias = jnp.ones(16, jnp.bfloat16)
    with bs.interpret(), bs.dispatch_log() as log:
        y = bs.matmul(W, x, bias=bias, activation="tanh", implementation=("mosaic", "pallas"))
    assert log == [("dsd+epilogue", "pallas")]
    ref = bs.matmul(W, x, bias=bias, activation="tanh", implementation="xla")
    np.testing.assert_allclose(np.asarray(y, np.float32), np.asarray(ref, np.float32), rtol=2e-2, atol=2e-2)
    with bs.interpret(), pytest.raises(ExceptionGroup) as info:
        bs.matmul(W, x, bias=bias, implementation="mosaic")
    assert re.search(r"mosaic: requires block sides in \(64, 128\).*got \(32, 64\)", str(info.value.exceptions[0]))


# ----------------------------------------------------------------------------- backend and dispatch
@pytest.mark.skipif(jax.default_backend() == "gpu", reason="checks the refusal on a machine without a GPU")
def test_backend_refuses_without_a_gpu_and_dispatch_falls_back():
    W = bs.random(jax.random.key(0), (256, 256), 64, 0.5, jnp.bfloat16)
    x = jnp.ones((256, 8), jnp.bfloat16)
    s = api.OpStatic(("mosaic",), jnp.dtype(jnp.bfloat16), pattern=W.pattern)
    with pytest.raises(NotImplementedError, match="no GPU"):
        backend.MosaicBackend().dsd(s, W.data, x)
    with bs.dispatch_log() as log:
        y = bs.matmul(W, x, implementation=("mosaic", "xla"))
    assert log == [("dsd", "xla")]
    np.testing.assert_allclose(np.asarray(y, np.float32), np.asarray(bs.matmul(W, x, implementation="xla"), np.float32))


def test_backend_reasons():
    b = backend.MosaicBackend()
    W = bs.random(jax.random.key(0), (128, 128), (32, 64), 0.5, jnp.bfloat16)  # neither kernel's blocks
    s = api.OpStatic(("mosaic",), jnp.dtype(jnp.bfloat16), pattern=W.pattern)
    with bs.interpret():
        with pytest.raises(NotImplementedError, match=r"got \(32, 64\)"):
            b.dsd(s, W.data, jnp.ones((128, 4), jnp.bfloat16))
        W = bs.random(jax.random.key(0), (128, 128), 64, 0.5, jnp.float32)
        s = s.but(pattern=W.pattern, out_dtype=jnp.dtype(jnp.float32))
        with pytest.raises(NotImplementedError, match="float16 or bfloat16 operands.*float32"):
            b.dsd(s, W.data, jnp.ones((128, 4), jnp.float32))
    with pytest.raises(NotImplementedError, match=r"the dynamic W @ x / x @ W only \(not dyn_sdd\)"):
        b.dyn_sdd(s)


@pytest.mark.parametrize(
    "platform,kind,cc,reason",
    [("gpu", "NVIDIA H200", "9.0", None), ("gpu", "NVIDIA A100-SXM4-80GB", "8.0", "requires a Hopper GPU.*A100.*8.0"),
     ("gpu", "NVIDIA B200", "10.0", "requires a Hopper GPU.*B200"), ("cpu", "cpu", None, "no GPU")],
)  # fmt: skip
def test_hopper_check(platform, kind, cc, reason):
    with hardware.fake(hardware.Device(kind=kind, platform=platform, compute_capability=cc, num_sms=132)):
        why = hardware.hopper_problem()
    if reason is None:
        assert why is None
    else:
        assert why is not None and re.search(reason, why), why


def test_dispatch_runs_the_kernel_in_the_interpreter_with_gradients():
    """Forward, dx (a dsd on the transposed pattern) and the sdd of dW on the Mosaic kernels, interpreted."""
    pattern, data, x, want, scale = _problem("random", (64, 64), jnp.bfloat16, n=40)
    W = bs.BlockSparseMatrix(pattern, data)
    with bs.interpret(), bs.dispatch_log() as log:
        y = bs.matmul(W, x, implementation=("mosaic", "xla"))
        g = jax.grad(lambda x: bs.matmul(W, x, implementation=("mosaic", "xla")).astype(jnp.float32).sum())(x)
    assert log == [("dsd", "mosaic")] * 3 + [("sdd", "mosaic")]
    assert_close(y, want, scale, jnp.bfloat16)
    wd = to_dense64(W)
    assert_close(g, wd.sum(0)[:, None] * np.ones((1, 40)), np.abs(wd).sum(0)[:, None] * np.ones((1, 40)), jnp.bfloat16)


# ----------------------------------------------------------------------------- default dispatch
FAKE_DEVICES = {
    "H200": hardware.H200,
    "A100": hardware.Device(kind="NVIDIA A100-SXM4-80GB", compute_capability="8.0", num_sms=108),
    "B200": hardware.Device(kind="NVIDIA B200", compute_capability="10.0", num_sms=148),
    "CPU": hardware.Device(kind="cpu", platform="cpu"),
}


def _matrix(block, nnz, grid=(8, 8), dtype=jnp.bfloat16):
    """A matrix of ``nnz`` blocks on ``grid`` (density nnz / 64 on the default 8 x 8 grid)."""
    mask = np.zeros(grid[0] * grid[1], bool)
    mask[np.random.default_rng(nnz).choice(mask.size, nnz, replace=False)] = True
    pattern = bs.BlockPattern.from_mask(mask.reshape(grid), block)
    return bs.BlockSparseMatrix(pattern, jnp.zeros((nnz, *block), dtype))


def test_measured_speedup_reads_the_nearest_cell():
    def ms(b, n, d):
        return tuned.nearest_cell(tuned.H200.MOSAIC_DSD_SPEEDUP, b, n, d)

    assert ms(128, 4096, 1 / 4) == 1.52 and ms(128, 100_000, 1.0) == 1.52  # beyond the table: the nearest cell
    assert ms(128, 1023, 1 / 16) == 0.78 and ms(128, 1024, 1 / 16) == 1.51  # n: 1024 is the log midpoint
    assert ms(64, 256, 1 / 8) == 1.33 and ms(64, 256, 0.124) == 1.00  # density 1/8: midpoint of 1/4 and 1/16
    assert ms(64, 256, 1 / 32) == 1.00 and ms(64, 256, 0.031) == 0.88 and ms(64, 1, 1e-6) == 0.88
    for (b, n), row in tuned.H200.MOSAIC_DSD_SPEEDUP.items():  # every measured cell reads itself
        for d, speedup in row.items():
            assert ms(b, n, d) == speedup


# (block, nnz of 64 blocks, x shape, x dtype, W dtype, Mosaic first on a Hopper GPU)
RULE_CASES = [
    ((128, 128), 16, (1024, 4096), jnp.bfloat16, jnp.bfloat16, True),  # d = 1/4, n = 4096: 1.52
    ((128, 128), 4, (1024, 4096), jnp.bfloat16, jnp.bfloat16, True),  # 1/16: 1.51
    ((128, 128), 1, (1024, 2048), jnp.float16, jnp.float16, True),  # 1/64, n >= 1024: 1.30; float16 as bf16
    ((128, 128), 16, (1024, 256), jnp.bfloat16, jnp.bfloat16, True),  # n = 256: 1.75 (persistent)
    ((128, 128), 4, (1024, 256), jnp.bfloat16, jnp.bfloat16, False),  # 0.78
    ((128, 128), 4, (16, 1024, 256), jnp.bfloat16, jnp.bfloat16, True),  # batch folded in: n = 4096
    ((128, 128), 1, (1024, 128), jnp.bfloat16, jnp.bfloat16, True),  # n = 128 reads the n = 256 row: 1.23
    ((64, 64), 1, (512, 128), jnp.bfloat16, jnp.bfloat16, False),  # n = 128 reads the n = 256 row: 0.88
    ((128, 128), 1, (1024, 127), jnp.bfloat16, jnp.bfloat16, False),  # below PREFER_MIN_N: not measured
    ((128, 128), 1, (1024,), jnp.bfloat16, jnp.bfloat16, False),  # a vector: n = 1
    ((64, 64), 16, (512, 4096), jnp.bfloat16, jnp.bfloat16, False),  # b = 64, n = 4096, d = 1/4: 0.96
    ((64, 64), 4, (512, 4096), jnp.bfloat16, jnp.bfloat16, False),  # d = 1/16: 0.92
    ((64, 64), 1, (512, 4096), jnp.bfloat16, jnp.bfloat16, True),  # d = 1/64: 1.11 (persistent)
    ((64, 64), 16, (512, 256), jnp.bfloat16, jnp.bfloat16, True),  # 1.33 (persistent)
    ((64, 64), 4, (512, 256), jnp.bfloat16, jnp.bfloat16, False),  # 1.00: below the 5% margin
    ((128, 128), 16, (1024, 4096), jnp.bfloat16, jnp.float16, False),  # mixed: promoted to float32
    ((128, 128), 16, (1024, 4096), jnp.float32, jnp.float32, False),
    ((64, 128), 16, (1024, 4096), jnp.bfloat16, jnp.bfloat16, False),  # not measured: rectangular
    ((32, 32), 16, (256, 4096), jnp.bfloat16, jnp.bfloat16, False),
    ((128, 128), 0, (1024, 4096), jnp.bfloat16, jnp.bfloat16, False),  # nothing to compute
]


# x @ W with W 1024 x 1024 of 128 x 128 blocks at density 1/4 (k = 1024 reads the k = 384 row: 1.07):
# (x shape, x dtype, Mosaic first on a Hopper GPU)
DDS_RULE_CASES = [
    ((4096, 1024), jnp.bfloat16, True),
    ((2, 2048, 1024), jnp.bfloat16, True),  # batch dimensions folded into the rows: m = 4096
    ((2048, 1024), jnp.bfloat16, False),  # below PREFER_MIN_M
    ((4096, 1024), jnp.float32, False),  # a mix promotes to float32, which the kernel refuses
]


@pytest.mark.parametrize("device", list(FAKE_DEVICES))
def test_default_order_rule_on_fake_devices(device):
    """implementation=None puts "mosaic" first exactly where the measured rule says, on a Hopper GPU only."""
    with hardware.fake(FAKE_DEVICES[device]):
        for block, nnz, x_shape, x_dtype, w_dtype, on_hopper in RULE_CASES:
            W = _matrix(block, nnz, dtype=w_dtype)
            x = np.zeros(x_shape, x_dtype)
            want = ("mosaic", "pallas", "xla") if on_hopper and device == "H200" else ("pallas", "xla")
            assert order.of_product("dsd", W.pattern, W.dtype, x) == want, (device, block, nnz, x_shape, x_dtype)
        W = _matrix((128, 128), 16)
        for x_shape, x_dtype, on_hopper in DDS_RULE_CASES:  # x @ W: the dds rule
            want = ("mosaic", "pallas", "xla") if on_hopper and device == "H200" else ("pallas", "xla")
            assert order.of_product("dds", W.pattern, W.dtype, np.zeros(x_shape, x_dtype)) == want, (device, x_shape)
        dense = np.zeros((1024, 4096), jnp.bfloat16)
        assert order.of_product("dsd", None, jnp.bfloat16, dense) == ("pallas", "xla")  # dynamic: no static pattern
        assert order.of_product("dsd", W.pattern, W.dtype, [[1.0]]) == ("pallas", "xla")  # not an array


def test_default_dispatch_on_a_claimed_hopper_when_traced():
    """The decisions of the slow test below, traced only (jax.eval_shape; the dispatch log is written while
    tracing): the rule's Mosaic for the forward and dx, Triton for the sdd, Triton at density 1/16, and an explicit
    implementation over the rule. The kernels' numbers: the interpreter tests above."""
    with hardware.fake(hardware.H200):
        W = _matrix((64, 64), 16, grid=(8, 8))
        assert backend.dsd_plan(W.pattern, 128).persistent is not None
        x = jnp.zeros((2, 512, 64), jnp.bfloat16)  # batch folded in: n = 2 x 64 = 128
        with bs.interpret(), bs.dispatch_log() as log:
            jax.eval_shape(lambda W, x: bs.matmul(W, x), W, x)
            jax.eval_shape(jax.grad(lambda x: bs.matmul(W, x).astype(jnp.float32).sum()), x)
        assert log == [("dsd", "mosaic")] * 3 + [("sdd", "pallas")]
        V = _matrix((64, 64), 1, grid=(4, 4))
        with bs.interpret(), bs.dispatch_log() as log:
            jax.eval_shape(lambda V, x: bs.matmul(V, x), V, x[:, :256])
            jax.eval_shape(lambda V, x: bs.matmul(V, x, implementation="mosaic"), V, x[:, :256])
        assert log == [("dsd", "pallas"), ("dsd", "mosaic")]


@pytest.mark.slow  # interprets the persistent kernel through bs.matmul; the decisions alone: the traced test above
def test_default_dispatch_on_a_claimed_hopper_runs_the_rule_in_the_interpreter():
    """With the device taken for a Hopper GPU, bs.matmul(W, x) runs the kernel the rule picks (interpreted):
    b = 64 at density 1/4 and n = 128 (the n = 256 row, 1.33; the persistent kernel) on Mosaic, forward and
    dx, the sdd on Triton; b = 64 at density 1/16 (1.00) on Triton. An explicit implementation="mosaic"
    ignores the rule."""
    with hardware.fake(hardware.H200):
        W = _matrix((64, 64), 16, grid=(8, 8))
        assert backend.dsd_plan(W.pattern, 128).persistent is not None
        W = W.with_data(jax.random.normal(jax.random.key(0), W.data.shape, jnp.bfloat16))
        x = jax.random.normal(jax.random.key(1), (2, 512, 64), jnp.bfloat16)  # batch folded in: n = 2 x 64 = 128
        with bs.interpret(), bs.dispatch_log() as log:
            y = bs.matmul(W, x)
            jax.grad(lambda x: bs.matmul(W, x).astype(jnp.float32).sum())(x)
        assert log == [("dsd", "mosaic")] * 3 + [("sdd", "pallas")]
        wd, xd = to_dense64(W), np.asarray(x.astype(jnp.float32), np.float64)
        assert_close(y, wd @ xd, np.abs(wd) @ np.abs(xd), jnp.bfloat16)
        V = _matrix((64, 64), 1, grid=(4, 4))
        x = x[:, :256]
        with bs.interpret(), bs.dispatch_log() as log:
            bs.matmul(V, x)
            bs.matmul(V, x, implementation="mosaic")
        assert log == [("dsd", "pallas"), ("dsd", "mosaic")]


def test_default_dispatch_off_hopper_is_unchanged():
    """On this machine (no Hopper GPU) implementation=None means ("pallas", "xla") for every product."""
    if hardware.hopper_problem() is None:
        pytest.skip("runs where the default device is not a Hopper GPU")
    W = _matrix((128, 128), 16)
    x = jnp.ones((1024, 4096), jnp.bfloat16)
    assert order.of_product("dsd", W.pattern, W.dtype, x) == ("pallas", "xla")
    with bs.dispatch_log() as log:
        bs.matmul(_matrix((128, 128), 1, grid=(2, 2)), jnp.ones((256, 4), jnp.bfloat16))
    assert log[0][1] in ("pallas", "xla") and log[0][1] == ("pallas" if jax.default_backend() == "gpu" else "xla")


# ----------------------------------------------------------------------------- real Hopper GPU
@sweep("kind,order,block,n,cfg", quick=2, argvalues=[
    ("full_row", "tiles", (64, 64), 200, dict(tn=64, stages=2, max_len=2)),
    ("random", "units", (64, 128), 130, dict(tn=64, stages=3)),
    ("single", "tiles", (128, 64), 64, dict(tn=64)),
    ("empty_rows", "units", (64, 64), 300, dict(tn=128, stages=2)),
])  # fmt: skip
def test_interpreter_cluster_of_two_multicasts_w(kind, order, block, n, cfg):
    """cluster=2: two programs on adjacent column tiles of one unit share each W block's copy (a multicast);
    a stage is refilled once both have finished with it. Split rows, an odd number of column tiles padded to an
    even one, a unit of one block, empty rows; interpreted with the race detector. Pallas' GPU interpreter does
    not model the multicast (each program copies the block itself), so this checks the cluster's index mapping,
    padding, barriers' bookkeeping and the numbers; the multicast itself is checked on the GPU
    (test_gpu_forced_variants, test_gpu_matmul_matches_oracle)."""
    from jax._src.pallas.mosaic_gpu.interpret import gpu_callbacks
    from jax.experimental.pallas import mosaic_gpu as plgpu

    pattern, data, x, want, scale = _problem(kind, block, jnp.bfloat16, shape=(256, 512), n=n, seed=n)
    config = mdsd.MosaicConfig(cluster=2, grid_order=order, **cfg)
    p = backend.dsd_plan(pattern, n, config=config)
    assert p.cluster == 2 and p.tiles % 2 == 0 and p.n_pad == p.tiles * p.tn >= n and p.persistent is None
    tiles_axis = p.grid[1].index("t")
    assert p.grid[0][tiles_axis] == p.tiles // 2 and p.cluster_shape["cluster"][tiles_axis] == 2
    y = backend.dsd(pattern, data, x, config=config, interpret=plgpu.InterpretGPUParams(detect_races=True))
    assert not gpu_callbacks.get_races().races_found
    assert_close(y, want, scale, jnp.bfloat16, what=f"{kind} {order} {block} n={n}")


def test_cluster_lowers_for_cuda_with_an_epilogue_and_refuses_what_it_lacks():
    pattern, data, x, want, scale = _problem("random", (128, 128), jnp.bfloat16, shape=(512, 512), n=512)
    cfg = mdsd.MosaicConfig(cluster=2)
    bias = jnp.zeros((512,), jnp.float32)
    fn = jax.jit(lambda d, x, c: backend.dsd(pattern, d, x, config=cfg, interpret=False,
                                                   epi=epilogue.Epilogue("gelu", True, 1), bias=c))  # fmt: skip
    text = fn.trace(data, x, bias).lower(lowering_platforms=("cuda",)).as_text()
    assert "_cluster2" in text
    assert backend.dsd_plan(pattern, 512, config=mdsd.MosaicConfig(cluster=2, persistent=None)).cluster == 2
    with pytest.raises(ValueError, match="Expected cluster 1 or 2. Got 4."):
        mdsd.MosaicConfig(cluster=4)
    with pytest.raises(ValueError, match="Expected persistent not True and consumers=1 with cluster=2"):
        mdsd.MosaicConfig(cluster=2, persistent=True)
    with pytest.raises(ValueError, match="Expected persistent not True and consumers=1 with cluster=2"):
        mdsd.MosaicConfig(cluster=2, consumers=2)
    rows, cols = jnp.asarray(pattern.rows), jnp.asarray(pattern.cols)
    keep = jnp.ones(rows.shape, bool)
    with pytest.raises(NotImplementedError, match="cluster=1 for a dynamic matrix"):
        backend.dsd_dynamic(rows, cols, keep, jnp.bool_(True), data, x, pattern.grid[0], config=cfg)


def _hopper():
    why = hardware.hopper_problem()
    if why is not None:
        pytest.skip(why)


@pytest.mark.gpu
@pytest.mark.parametrize("b", [64, 128])
@pytest.mark.parametrize("dtype", HALF)
@settings(max_examples=3, deadline=None)
@given(data=st.data(), seed=st.integers(0, 2**16))
def test_gpu_matmul_matches_oracle(b, dtype, data, seed):
    """bs.matmul(implementation="mosaic") on the strategies' patterns (empty rows, one full row, a single
    block, ...) against the float64 oracle; max_len=3 splits the long rows into partials."""
    _hopper()
    pattern = data.draw(bst.block_patterns(block_size=(b, b), shape=(2048, 1024), kinds=GPU_KINDS))
    rng = np.random.default_rng(seed)
    W = bs.BlockSparseMatrix(pattern, jnp.asarray(rng.standard_normal((pattern.nnz_blocks, b, b)), dtype))
    x = jnp.asarray(rng.standard_normal((pattern.shape[1], 1000)), dtype)
    wd, xd = to_dense64(W), np.asarray(x.astype(jnp.float32), np.float64)
    with bs.dispatch_log() as log:
        y = jax.jit(lambda W, x: bs.matmul(W, x, implementation="mosaic"))(W, x)
    assert log == [("dsd", "mosaic")]
    assert_close(y, wd @ xd, np.abs(wd) @ np.abs(xd), dtype, what=f"b={b} {dtype}")
    for cfg in (mdsd.MosaicConfig(max_len=3), mdsd.MosaicConfig(max_len=3, persistent=True),
                mdsd.MosaicConfig(persistent=True, grid_order="units"),
                mdsd.MosaicConfig(cluster=2, max_len=3)):  # fmt: skip
        y = jax.jit(lambda d, x, cfg=cfg: backend.dsd(pattern, d, x, config=cfg))(W.data, x)
        assert_close(y, wd @ xd, np.abs(wd) @ np.abs(xd), dtype, what=f"b={b} {dtype} {cfg}")


@pytest.mark.gpu
@pytest.mark.parametrize("b,dtype,activation", [(64, jnp.bfloat16, "gelu"), (128, jnp.float16, "silu")])
def test_gpu_fused_epilogue(b, dtype, activation):
    """The fused kernel on the GPU: bias along columns (matrix x, split rows too) and along rows (vector x)."""
    _hopper()
    pattern, data, x, want, scale = _problem("full_row", (b, b), dtype, shape=(2048, 1024), n=1000, seed=b)
    bias = jnp.asarray(np.random.default_rng(b).standard_normal(1000), jnp.float32)
    for cfg in (None, mdsd.MosaicConfig(max_len=3)):
        fn = jax.jit(lambda d, x, c, cfg=cfg: backend.dsd(
            pattern, d, x, config=cfg, epi=epilogue.Epilogue(activation, True, 1), bias=c))  # fmt: skip
        assert_close(fn(data, x, bias), *_epilogue_oracle(want, scale, bias, 1, activation), dtype, what=f"{cfg}")
    W = bs.BlockSparseMatrix(pattern, data)
    bias_m = jnp.asarray(np.random.default_rng(0).standard_normal(2048), dtype)
    with bs.dispatch_log() as log:
        v = jax.jit(lambda W, x, c: bs.matmul(W, x, bias=c, activation="relu", implementation="mosaic"))(
            W, x[:, 0], bias_m
        )
    assert log == [("dsd+epilogue", "mosaic")]
    want_v, scale_v = _epilogue_oracle(want[:, :1], scale[:, :1], bias_m.astype(jnp.float32), 0, "relu")
    assert_close(v, want_v[:, 0], scale_v[:, 0], dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["random", "full_row"])
@pytest.mark.parametrize(
    "config",
    [dict(tn=256, stages=4), dict(tn=128, stages=3, consumers=2), dict(tn=64, consumers=2, max_len=3),
     dict(tn=256, stages=2), dict(grid_order="units"), dict(grid_order="tiles", max_len=3),
     dict(persistent=True), dict(persistent=True, grid_order="tiles", max_len=3, programs=7),
     dict(cluster=2), dict(cluster=2, tn=256, stages=4), dict(cluster=2, grid_order="units", max_len=3),
     dict(cluster=2, tn=64, stages=2)],
)  # fmt: skip
def test_gpu_forced_variants(kind, config):
    """The variants the mosaic suite can force for b = 64 (4 stages, two consumer warpgroups, tn = 256 at
    n = 256, clusters of two sharing W's copies) against the float64 oracle, before their times mean anything."""
    _hopper()
    cfg = mdsd.MosaicConfig(**config)
    for n in (256, 1000):
        pattern, data, x, want, scale = _problem(kind, (64, 64), jnp.bfloat16, shape=(2048, 1024), n=n, seed=n)
        y = jax.jit(lambda d, x, pattern=pattern: backend.dsd(pattern, d, x, config=cfg))(data, x)
        assert_close(y, want, scale, jnp.bfloat16, what=f"{kind} n={n} {cfg}")


@pytest.mark.gpu
def test_gpu_default_order():
    """On an H200 implementation=None runs Mosaic for b = 128 at n = 4096 and Triton for b = 64 there."""
    _hopper()
    x = jax.random.normal(jax.random.key(2), (2048, 4096), jnp.bfloat16)
    for b, want in ((128, "mosaic"), (64, "pallas")):
        W = bs.random(jax.random.key(b), (2048, 2048), b, 1 / 4, jnp.bfloat16)
        with bs.dispatch_log() as log:
            y = jax.jit(bs.matmul)(W, x)
        assert log == [("dsd", want)]
        wd, xd = to_dense64(W), np.asarray(x.astype(jnp.float32), np.float64)
        assert_close(y, wd @ xd, np.abs(wd) @ np.abs(xd), jnp.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("block", [(64, 128), (128, 64)])
@pytest.mark.parametrize("n", [64, 4096])
def test_gpu_rectangular_blocks_and_wide_tiles(block, n):
    _hopper()
    pattern, data, x, want, scale = _problem("random", block, jnp.bfloat16, shape=(1024, 1024), n=n)
    y = jax.jit(lambda d, x: backend.dsd(pattern, d, x, jnp.float32))(data, x)
    assert_close(y, want, scale, jnp.bfloat16)


@pytest.mark.gpu
def test_gpu_backend_dispatch():
    _hopper()
    W = bs.random(jax.random.key(1), (1024, 1024), 128, 1 / 4, jnp.bfloat16)
    x = jax.random.normal(jax.random.key(2), (1024, 512), jnp.bfloat16)
    with bs.dispatch_log() as log:
        y = jax.jit(lambda W, x: bs.matmul(W, x, implementation="mosaic"))(W, x)
    assert log == [("dsd", "mosaic")]
    wd, xd = to_dense64(W), np.asarray(x.astype(jnp.float32), np.float64)
    assert_close(y, wd @ xd, np.abs(wd) @ np.abs(xd), jnp.bfloat16)
