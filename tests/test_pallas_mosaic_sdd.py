"""The Mosaic GPU (Hopper) sdd kernel ``(a @ b)`` at a pattern's blocks: host preparation, CUDA lowering and the GPU
interpreter on the CPU; the real kernel on a Hopper GPU (``gpu`` mark) against the float64 oracle at real sizes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import examples, sweep
from hypothesis import given, settings
from hypothesis import strategies as st
from test_pallas_mosaic import HALF, _hopper  # the dsd tests' helpers

import blocksparse as bs
from blocksparse import hardware
from blocksparse.ops.matmul import order, tuned
from blocksparse.ops.matmul.mosaic import sdd as ps
from blocksparse.testing import strategies as bst
from blocksparse.testing.oracles import assert_close

BLOCKS = [(64, 64), (128, 128), (64, 128), (128, 64)]
KINDS = ("random", "empty", "full_row", "full_col", "empty_rows", "single", "diagonal")


def _oracle(pattern, a, b):
    """float64 ``a @ b`` at the pattern's blocks, and the bound ``|a| @ |b|`` there: ``(nnz, bh, bw)`` each."""
    a64 = np.asarray(jnp.asarray(a, jnp.float32), np.float64)
    b64 = np.asarray(jnp.asarray(b, jnp.float32), np.float64)
    bh, bw = pattern.block_size

    def at(d):
        return np.stack([d[r * bh : (r + 1) * bh, c * bw : (c + 1) * bw] for r, c in zip(pattern.rows, pattern.cols,
                         strict=True)]) if pattern.nnz_blocks else np.zeros((0, bh, bw))  # fmt: skip

    return at(a64 @ b64), at(np.abs(a64) @ np.abs(b64))


def _problem(pattern, k, dtype, seed=0):
    rng = np.random.default_rng(seed)
    m, n = pattern.shape
    a = jnp.asarray(rng.standard_normal((m, k)), dtype)
    b = jnp.asarray(rng.standard_normal((k, n)), dtype)
    return (a, b, *_oracle(pattern, a, b))


def _run(pattern, a, b, layout, out_dtype=None, config=None, interpret=True):
    """``ps.sdd`` with the operands stored as ``layout`` says ("nn", "tn", "nt", "tt": t = stored transposed)."""
    a_t, b_t = layout[0] == "t", layout[1] == "t"
    return ps.sdd(pattern, a.T if a_t else a, b.T if b_t else b, out_dtype, a_transposed=a_t, b_transposed=b_t,
                  config=config, interpret=interpret)  # fmt: skip


# ----------------------------------------------------------------------------- host preparation
def test_plan_tiles_stages_and_splits():
    """64-deep steps, 3 stages; the contracted dimension split only for fewer blocks than SMs, into enough
    splits to fill them twice, each split of at least 8 steps, none empty."""
    big = bs.BlockPattern.random(0, (8192, 8192), (128, 128), 1 / 4)  # 1024 blocks: no split
    p = ps.plan(big, 4096)
    assert (p.tk, p.steps, p.k_pad, p.stages, p.splits, p.per_split) == (64, 64, 4096, 3, 1, 64)
    assert p.smem_bytes(128, 128, 2) == 3 * 256 * 64 * 2
    few = bs.BlockPattern.random(0, (384, 1536), (64, 64), 1 / 4)  # 36 blocks over 32768 tokens: split
    p = ps.plan(few, 32768)
    assert p.steps == 512 and p.splits == 8 and p.splits * few.nnz_blocks >= 2 * 132
    short = ps.plan(few, 1000, config=ps.SddConfig(tk=128))  # 8 steps: one split only
    assert (short.steps, short.splits) == (8, 1)
    forced = ps.plan(few, 1000, config=ps.SddConfig(splits=3))  # 16 steps: 6, 6, 4
    assert (forced.steps, forced.per_split, forced.splits) == (16, 6, 3)
    assert ps.plan(few, 64, config=ps.SddConfig(splits=5)).splits == 1  # never an empty split
    assert ps.plan(big, 4096, config=ps.SddConfig(tk=128)).smem_bytes(128, 128, 2) == 3 * 256 * 128 * 2
    sparse = bs.BlockPattern.random(0, (8192, 8192), (128, 128), 1 / 16)  # 256 blocks: no split
    assert ps.plan(sparse, 4096).splits == 1
    sparsest = bs.BlockPattern.random(0, (8192, 8192), (128, 128), 1 / 64)  # 64 blocks: 5 splits of 13 steps
    assert (ps.plan(sparsest, 4096).splits, ps.plan(sparsest, 4096).per_split) == (5, 13)


def test_prefers_needs_a_hopper_gpu_half_operands_many_tokens_and_splits():
    """The rule: the inference layer's weight gradient with blocks of 128 (9 blocks over 32768 tokens: many
    splits) goes first; blocks of 64 (a tie with Triton's split kernel), W 8192 x 8192 over 4096 tokens (no split:
    a tie) and the rest stay with Triton."""
    few = bs.BlockPattern.random(0, (384, 1536), (128, 128), 1 / 4)
    few64 = bs.BlockPattern.random(0, (384, 1536), (64, 64), 1 / 4)
    big = bs.BlockPattern.random(0, (8192, 8192), (128, 128), 1 / 4)
    bf = jnp.bfloat16
    min_splits, min_k = tuned.H200.SDD_PREFER_MIN_SPLITS, tuned.H200.SDD_PREFER_MIN_K

    def prefers(pattern, k, a_dtype, b_dtype):
        return order.default("sdd", pattern, k, a_dtype, b_dtype)[0] == "mosaic"

    if hardware.hopper_problem() is not None:
        assert not prefers(few, 32768, bf, bf)  # not a Hopper GPU here
    with hardware.fake(hardware.H200):
        assert prefers(few, 32768, bf, bf) and ps.plan(few, 32768).splits >= min_splits
        assert not prefers(few64, 32768, bf, bf) and ps.plan(few64, 32768).splits >= min_splits
        assert not prefers(big, 4096, bf, bf)
        assert not prefers(few, min_k - 1, bf, bf)
        assert not prefers(few, 32768, jnp.float16, bf) and not prefers(few, 32768, jnp.float32, jnp.float32)
        assert order.default("sdd", few, 32768, bf, bf) == ("mosaic", "pallas", "xla")
        assert order.default("sdd", few64, 32768, bf, bf) == ("pallas", "xla")
        assert order.default("sdd", big, 4096, bf, bf) == ("pallas", "xla")


@pytest.mark.slow  # interprets the kernels at 4096 tokens; the decisions alone: the traced sibling below
def test_weight_gradient_takes_its_own_default_order():
    """implementation=None on a claimed Hopper GPU (interpreted): x @ W with 4096 tokens and W 256 x 256 of four
    64 x 64 blocks (d = 1/4) runs on Mosaic (the dds rule: 1.09x), while its weight gradient takes the sdd rule,
    which leaves blocks of 64 with Triton (a tie with its split kernel); an explicit implementation keeps every
    op on it."""
    mask = np.eye(4, dtype=bool)
    W = bs.BlockSparseMatrix(bs.BlockPattern.from_mask(mask, (64, 64)),
                             jax.random.normal(jax.random.key(0), (4, 64, 64), jnp.bfloat16))  # fmt: skip
    x = jax.random.normal(jax.random.key(1), (4096, 256), jnp.bfloat16)
    with hardware.fake(hardware.H200), bs.interpret(), bs.dispatch_log() as log:
        dw = jax.grad(lambda W: bs.matmul(x, W).astype(jnp.float32).sum())(W)
    assert log == [("dds", "mosaic"), ("dds", "mosaic"), ("sdd", "pallas")]
    assert_close(dw.data, *_oracle(W.pattern, x.T, jnp.ones((4096, 256), jnp.bfloat16)), jnp.bfloat16)
    with hardware.fake(hardware.H200), bs.interpret(), bs.dispatch_log() as log:
        jax.grad(lambda W: bs.matmul(x, W, implementation="pallas").astype(jnp.float32).sum())(W)
    assert log == [("dds", "pallas")] * 2 + [("sdd", "pallas")]


@pytest.mark.slow  # as above
def test_sdd_backward_products_take_their_own_default_order():
    """bs.sdd(implementation=None) claimed by the sdd rule (interpreted, a claimed Hopper GPU; blocks of 128, two
    blocks over 4096 tokens: 8 splits) runs on Mosaic, and the products of its backward run on what their own
    rules claim (here Mosaic for both, from their own tables), not on the sdd's order."""
    mask = np.zeros((4, 4), bool)
    mask[0, 0] = mask[3, 3] = True
    W = bs.BlockSparseMatrix(bs.BlockPattern.from_mask(mask, (128, 128)), jnp.zeros((2, 128, 128), jnp.bfloat16))
    x = jax.random.normal(jax.random.key(1), (4096, 512), jnp.bfloat16)
    with hardware.fake(hardware.H200):
        dsd_first = order.default("dsd", W.pattern, 4096, jnp.bfloat16, jnp.bfloat16)[0]
        dds_first = order.default("dds", W.pattern, 4096, jnp.bfloat16, jnp.bfloat16)[0]
    with hardware.fake(hardware.H200), bs.interpret(), bs.dispatch_log() as log:
        jax.grad(lambda a, b: bs.sdd(a, b, W).data.astype(jnp.float32).sum(), (0, 1))(x.T, x)
    assert log == [("sdd", "mosaic"), ("dsd", dsd_first), ("dds", dds_first)]


def test_backward_default_orders_when_traced():
    """The two slow tests above, traced only (jax.eval_shape: the dispatch log is written while tracing): x @ W's
    weight gradient takes the sdd rule, and bs.sdd's backward products take their own rules."""
    W = bs.BlockSparseMatrix(bs.BlockPattern.from_mask(np.eye(4, dtype=bool), (64, 64)),
                             jnp.zeros((4, 64, 64), jnp.bfloat16))  # fmt: skip
    x = jnp.zeros((4096, 256), jnp.bfloat16)
    for impl, want in [(None, [("dds", "mosaic")] * 2 + [("sdd", "pallas")]), ("pallas", [("dds", "pallas")] * 2
                       + [("sdd", "pallas")])]:  # fmt: skip
        with hardware.fake(hardware.H200), bs.interpret(), bs.dispatch_log() as log:
            jax.eval_shape(jax.grad(lambda W, i=impl: bs.matmul(x, W, implementation=i).astype(jnp.float32).sum()), W)
        assert log == want, impl
    mask = np.zeros((4, 4), bool)
    mask[0, 0] = mask[3, 3] = True
    W = bs.BlockSparseMatrix(bs.BlockPattern.from_mask(mask, (128, 128)), jnp.zeros((2, 128, 128), jnp.bfloat16))
    x = jnp.zeros((4096, 512), jnp.bfloat16)
    with hardware.fake(hardware.H200):
        dsd_first = order.default("dsd", W.pattern, 4096, jnp.bfloat16, jnp.bfloat16)[0]
        dds_first = order.default("dds", W.pattern, 4096, jnp.bfloat16, jnp.bfloat16)[0]
        with bs.interpret(), bs.dispatch_log() as log:
            jax.eval_shape(jax.grad(lambda a, b: bs.sdd(a, b, W).data.astype(jnp.float32).sum(), (0, 1)), x.T, x)
    assert log == [("sdd", "mosaic"), ("dsd", dsd_first), ("dds", dds_first)]


def test_refuses_what_the_kernel_cannot_take():
    small = bs.BlockPattern.random(0, (256, 256), (32, 32), 0.5)
    with pytest.raises(NotImplementedError, match=r"block sides in \(64, 128\).*got \(32, 32\)"):
        ps.plan(small, 256)
    big = bs.BlockPattern.random(0, (256, 256), (128, 128), 0.5)
    with pytest.raises(NotImplementedError, match="shared memory.*stages=4"):
        ps.plan(big, 256, config=ps.SddConfig(tk=128, stages=4))  # 4 x 64 KiB
    a = jnp.ones((256, 64), jnp.float32)
    with pytest.raises(NotImplementedError, match="float16 or bfloat16 operands.*float32"):
        ps.sdd(big, a, a.T)
    h = jnp.ones((256, 64), jnp.bfloat16)
    with pytest.raises(NotImplementedError, match="float16, bfloat16 or float32 output.*int32"):
        ps.sdd(big, h, h.T, jnp.int32)
    for bad in (dict(tk=32), dict(stages=1), dict(splits=0)):
        with pytest.raises(ValueError, match="Expected"):
            ps.SddConfig(**bad)


def test_bad_shapes_raise_with_expected_and_actual():
    pattern = bs.BlockPattern.random(0, (256, 128), (64, 64), 0.5)
    a, b = jnp.ones((256, 96), jnp.bfloat16), jnp.ones((96, 128), jnp.bfloat16)
    with pytest.raises(ValueError, match=r"Expected a of shape \(256, K\) and b of shape \(K, 128\).*\(95, 128\)"):
        ps.sdd(pattern, a, b[:95])
    with pytest.raises(ValueError, match=r"Expected a of shape \(K, 256\).*Got \(256, 96\)"):
        ps.sdd(pattern, a, b, a_transposed=True)
    with pytest.raises(ValueError, match=r"b of shape \(128, K\)"):
        ps.sdd(pattern, a, b, b_transposed=True)


def test_no_launch_for_empty_operands():
    """No blocks, or K = 0: the result without a kernel (interpret=False: a launch would fail on the CPU)."""
    empty = bs.BlockPattern.from_mask(np.zeros((2, 2), bool), (64, 64))
    h = jnp.ones((128, 64), jnp.bfloat16)
    assert ps.sdd(empty, h, h.T, interpret=False).shape == (0, 64, 64)
    pattern = bs.BlockPattern.random(0, (128, 128), (64, 64), 0.5)
    z = ps.sdd(pattern, jnp.ones((128, 0), jnp.bfloat16), jnp.ones((0, 128), jnp.bfloat16), jnp.float32,
               interpret=False)  # fmt: skip
    assert z.shape == (pattern.nnz_blocks, 64, 64) and z.dtype == jnp.float32 and not np.asarray(z).any()


# ----------------------------------------------------------------------------- lowering for CUDA
@sweep(
    "block,dtype,layout,config",
    [((64, 64), jnp.bfloat16, "nn", None), ((128, 128), jnp.float16, "nt", None),
     ((128, 128), jnp.bfloat16, "tn", ps.SddConfig(tk=128, stages=3, splits=2)),
     ((64, 128), jnp.bfloat16, "tt", ps.SddConfig(tk=64)), ((128, 64), jnp.float16, "nn", ps.SddConfig(splits=3))],
)  # fmt: skip
def test_kernel_lowers_for_cuda(block, dtype, layout, config):
    """The Pallas -> Mosaic GPU lowering (wgmma shapes, transposed shared-memory views, swizzles, the shared
    memory budget) for every block, both dtypes, every operand layout and forced tiles and splits."""
    pattern = bs.BlockPattern.random(0, (512, 512), block, 0.5)
    a, b, _, _ = _problem(pattern, 1024, dtype)
    a_t, b_t = layout[0] == "t", layout[1] == "t"
    fn = jax.jit(lambda a, b: ps.sdd(pattern, a, b, a_transposed=a_t, b_transposed=b_t, config=config,
                                     interpret=False))  # fmt: skip
    txt = fn.trace(a.T if a_t else a, b.T if b_t else b).lower(lowering_platforms=("cuda",)).as_text()
    p = ps.plan(pattern, 1024, 2, config)
    name = f"bs_mgpu_sdd_{block[0]}x{block[1]}_tk{p.tk}_{layout}" + (f"_split{p.splits}" if p.splits > 1 else "")
    assert name in txt and "mosaic_gpu" in txt


def test_lowering_checks_the_shared_memory_budget_the_plan_uses():
    """b = 128 with tk = 128: three 64 KiB stages lower; a fourth (the plan refuses it) does not."""
    pattern = bs.BlockPattern.random(0, (256, 256), (128, 128), 0.5)
    a, b, _, _ = _problem(pattern, 512, jnp.bfloat16)
    p = ps.plan(pattern, 512, config=ps.SddConfig(tk=128, stages=3))
    assert p.smem_bytes(128, 128, 2) == 3 * 64 * 1024
    p4 = ps.SddPlan(p.tk, p.steps, p.k_pad, 4, p.splits, p.per_split)
    fn = jax.jit(lambda a, b: ps._launch(p4, pattern, a, b, jnp.bfloat16, False, False, False))
    with pytest.raises(ValueError, match="exceeds available shared memory"):
        fn.trace(a, b).lower(lowering_platforms=("cuda",))


# ----------------------------------------------------------------------------- GPU interpreter
@settings(max_examples=examples(10), deadline=None)
@given(
    block=st.sampled_from(BLOCKS),
    dtype=st.sampled_from(HALF),
    layout=st.sampled_from(["nn", "tn", "nt", "tt"]),
    k=st.integers(1, 300),
    tk=st.sampled_from([None, 64]),
    splits=st.sampled_from([None, 1, 2, 3]),
    out=st.sampled_from([None, jnp.float32]),
    data=st.data(),
)
def test_interpreter_matches_oracle(block, dtype, layout, k, tk, splits, out, data):
    """The kernel itself (coordinate reads, TMA slices and views, stage indices, K padding, splits) in Pallas'
    GPU interpreter on the strategies' patterns (empty, one full row or column, a single block, ...)."""
    pattern = data.draw(bst.block_patterns(block_size=block, shape=(256, 256), kinds=KINDS), label="pattern")
    a, b, want, scale = _problem(pattern, k, dtype, seed=k)
    got = _run(pattern, a, b, layout, out, ps.SddConfig(tk=tk, stages=2 if k % 2 else None, splits=splits))
    assert got.shape == (pattern.nnz_blocks, *block) and got.dtype == (out or dtype)
    assert_close(got, want, scale, dtype)


def test_interpreter_finds_no_races():
    """The interpreter's race detector on the pipeline with a split and transposed views."""
    try:
        from jax._src.pallas.mosaic_gpu.interpret import gpu_callbacks
    except ImportError:  # a private module: its place may change between jax versions
        pytest.skip("jax's GPU interpreter keeps its race detector elsewhere in this version")
    from jax.experimental.pallas import mosaic_gpu as plgpu

    pattern = bs.BlockPattern.random(0, (128, 128), (64, 64), 0.5)
    a, b, want, scale = _problem(pattern, 640, jnp.bfloat16)
    got = _run(pattern, a, b, "tt", config=ps.SddConfig(splits=2, tk=64, stages=3),
               interpret=plgpu.InterpretGPUParams(detect_races=True))  # fmt: skip
    assert_close(got, want, scale, jnp.bfloat16)
    assert gpu_callbacks.get_races().races_found is False


def test_backend_serves_sdd_and_the_weight_gradients():
    """bs.sdd(implementation="mosaic") and the weight gradient of W @ x and x @ W on the Mosaic kernels
    (interpreted), against XLA."""
    W = bs.random(jax.random.key(0), (128, 128), 64, 0.5, jnp.bfloat16)
    x = jax.random.normal(jax.random.key(1), (128, 72), jnp.bfloat16)
    xt = jax.random.normal(jax.random.key(2), (40, 128), jnp.bfloat16)
    g = jax.random.normal(jax.random.key(3), (128, 72), jnp.bfloat16)
    impl = ("mosaic", "xla")
    # the gradients jitted (eagerly the backward's glue compiles op by op; the dispatch log is written while tracing)
    with bs.interpret(), bs.dispatch_log() as log:
        s = bs.sdd(g, x.T, W, implementation="mosaic")
        dw = jax.jit(jax.grad(lambda W: (bs.matmul(W, x, implementation=impl).astype(jnp.float32) * g).sum()))(W)
        dw2 = jax.jit(jax.grad(lambda W: bs.matmul(xt, W, implementation=impl).astype(jnp.float32).sum()))(W)
    assert ("sdd", "mosaic") in log and ("sdd", "xla") not in log and log.count(("sdd", "mosaic")) == 3
    want, scale = _oracle(W.pattern, g, x.T)
    assert_close(s.data, want, scale, jnp.bfloat16)
    assert_close(dw.data, want, scale, jnp.bfloat16)
    ones = jnp.ones((40, 128), jnp.bfloat16)
    assert_close(dw2.data, *_oracle(W.pattern, xt.T, ones), jnp.bfloat16)


# ----------------------------------------------------------------------------- real Hopper GPU
@pytest.mark.gpu
@pytest.mark.parametrize("b", [64, 128])
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("layout", ["nn", "nt", "tn"])
def test_gpu_weight_gradient_shapes_match_oracle(b, dtype, layout):
    """The weight gradient of W 2048 x 2048 at density 1/4 over 4096 tokens, default plan and forced tiles, depth
    and splits, in every layout the backward has; Triton agrees."""
    _hopper()
    W = bs.random(jax.random.key(b), (2048, 2048), b, 1 / 4, dtype)
    a, bb, want, scale = _problem(W.pattern, 4096, dtype, seed=b)
    for cfg in (None, ps.SddConfig(tk=64, stages=2, splits=3), ps.SddConfig(tk=128, stages=3)):
        got = jax.jit(lambda a, bb, cfg=cfg: _run(W.pattern, a, bb, layout, config=cfg, interpret=False))(a, bb)
        assert_close(got, want, scale, dtype, what=f"b={b} {layout} {jnp.dtype(dtype).name} {cfg}")
    triton = jax.jit(lambda a, bb: bs.sdd(a, bb, W, implementation="pallas").data)(a, bb)
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(triton, np.float32), rtol=2e-2, atol=0.5)


@pytest.mark.gpu
@pytest.mark.parametrize("b", [64, 128])
@settings(max_examples=4, deadline=None)
@given(data=st.data(), seed=st.integers(0, 2**16))
def test_gpu_strategy_patterns(b, data, seed):
    """The strategies' patterns on a Hopper GPU (few blocks: the default plan splits K), bf16."""
    _hopper()
    pattern = data.draw(bst.block_patterns(block_size=(b, b), shape=(1024, 2048), kinds=KINDS))
    a, bb, want, scale = _problem(pattern, 3000, jnp.bfloat16, seed=seed)
    got = jax.jit(lambda a, bb: ps.sdd(pattern, a, bb))(a, bb)
    assert_close(got, want, scale, jnp.bfloat16)


@pytest.mark.gpu
def test_gpu_backward_of_a_mosaic_product_runs_the_kernel():
    """jax.grad of bs.matmul(W, x, implementation="mosaic"): the weight gradient runs this kernel on the GPU."""
    _hopper()
    W = bs.random(jax.random.key(0), (2048, 2048), 128, 1 / 4, jnp.bfloat16)
    x = jax.random.normal(jax.random.key(1), (2048, 1024), jnp.bfloat16)
    with bs.dispatch_log() as log:
        dw = jax.jit(jax.grad(lambda W: bs.matmul(W, x, implementation="mosaic").astype(jnp.float32).sum()))(W)
    assert ("sdd", "mosaic") in log
    ones = jnp.ones((2048, 1024), jnp.bfloat16)
    assert_close(dw.data, *_oracle(W.pattern, ones, x.T), jnp.bfloat16)
