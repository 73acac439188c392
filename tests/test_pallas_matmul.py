"""Pallas block-sparse kernels (dsd, dds, sdd) and their GPU schedule.

CPU (CI): the schedule's invariants and balance, and the kernels' logic in Pallas' interpreter on
small shapes, against the pure-JAX reference. GPU (``-m gpu``, skipped without one): every kernel,
forward and backward, every supported block size and dtype, adversarial patterns.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import examples, sweep
from hypothesis import given, settings
from hypothesis import strategies as st

import blocksparse as bs
from blocksparse import hardware
from blocksparse.ops import _dispatch as dispatch
from blocksparse.ops.matmul import triton as pt
from blocksparse.ops.matmul import tuned
from blocksparse.ops.matmul.api import OpStatic
from blocksparse.ops.matmul.reference import XlaBackend
from blocksparse.ops.matmul.schedule import PROGRAMS_PER_SM, GpuLowering, choose_max_len, lower
from blocksparse.ops.matmul.triton.backend import PallasBackend

REF = XlaBackend()
PAL = PallasBackend()
#: The H200's slots (programs running at once), as the load-balance heuristic counts them.
H200_SLOTS = hardware.H200.num_sms * PROGRAMS_PER_SM
RTOL = {jnp.dtype(jnp.float32): 2e-5, jnp.dtype(jnp.float16): 4e-3, jnp.dtype(jnp.bfloat16): 3e-2}
# TF32 tensor-core dots on the GPU (10-bit mantissa), like XLA's default there.
RTOL_GPU = {**RTOL, jnp.dtype(jnp.float32): 4e-3}


@pytest.fixture
def interpret():
    with dispatch.interpret(True):
        yield


def _static(p, out=jnp.float32, **kw):
    return OpStatic(("xla",), jnp.dtype(out), pattern=p, **kw)


def _pattern(kind: str, seed: int, shape, block, density=0.5) -> bs.BlockPattern:
    bh, bw = block
    gm, gk = shape[0] // bh, shape[1] // bw
    rng = np.random.default_rng(seed)
    if kind == "random":
        return bs.BlockPattern.random(rng, shape, block, density)
    if kind == "power_law":
        return bs.BlockPattern.power_law(rng, shape, block, density)
    mask = np.zeros((gm, gk), bool)
    if kind == "empty":
        pass
    elif kind == "single":
        mask[rng.integers(gm), rng.integers(gk)] = True
    elif kind == "full_row":  # one full row, everything else empty
        mask[rng.integers(gm), :] = True
    elif kind == "empty_rows":  # every other row empty, the rest dense
        mask[::2, :] = True
    elif kind == "full_col":
        mask[:, rng.integers(gk)] = True
    else:
        raise ValueError(kind)
    return bs.BlockPattern.from_mask(mask, block)


def _data(key, pattern, dtype):
    return jax.random.normal(key, (pattern.nnz_blocks, *pattern.block_size), jnp.float32).astype(dtype)


def _close(actual, expected, dtype, table=RTOL, what=""):
    """Relative error in the Frobenius norm (robust for bf16), plus every entry written (no NaN)."""
    a = np.asarray(jnp.asarray(actual, jnp.float32), np.float64)
    e = np.asarray(jnp.asarray(expected, jnp.float32), np.float64)
    assert a.shape == e.shape, f"{what}: shape {a.shape} != {e.shape}"
    assert np.isfinite(a).all(), f"{what}: non-finite entries (unwritten output?)"
    if a.size == 0:
        return
    err = np.linalg.norm(a - e) / np.linalg.norm(e) if np.linalg.norm(e) > 0 else np.abs(a).max()
    assert err <= table[jnp.dtype(dtype)], f"{what}: relative error {err:.3g} > {table[jnp.dtype(dtype)]} ({dtype})"


# --------------------------------------------------------------------------------------------
# Schedule (host)
# --------------------------------------------------------------------------------------------
@given(
    gm=st.integers(1, 12),
    gk=st.integers(1, 12),
    density=st.floats(0, 1),
    skew=st.booleans(),
    max_len=st.one_of(st.none(), st.integers(1, 5)),
    op=st.sampled_from(["dsd", "dds"]),
    seed=st.integers(0, 2**16),
)
def test_schedule_invariants(gm, gk, density, skew, max_len, op, seed):
    gen = bs.BlockPattern.power_law if skew else bs.BlockPattern.random
    p = gen(seed, (gm * 16, gk * 32), (16, 32), density)
    s = lower(p, GpuLowering(op=op, tiles=3, max_len=max_len))
    s.check()
    assert s.nnz == p.nnz_blocks
    assert int(s.unit_len.sum()) == p.nnz_blocks
    assert int(s.unit_len.max()) <= s.max_len
    ref = p if op == "dsd" else p.T
    assert s.num_rows == ref.grid[0]
    # Units walk blocks in the reference order; dds points back into the original data.
    if p.nnz_blocks:
        np.testing.assert_array_equal(s.block_col[: s.nnz], ref.cols)
        if op == "dds":
            np.testing.assert_array_equal(p.rows[s.block_id[: s.nnz]], ref.cols)
            np.testing.assert_array_equal(p.cols[s.block_id[: s.nnz]], ref.rows)
    # Longest first.
    assert (np.diff(s.unit_len) <= 0).all()


@pytest.mark.parametrize("tiles", [1, 2, 16])
def test_schedule_is_cached_and_balanced(tiles):
    opts = GpuLowering(tiles=tiles)
    uni = bs.BlockPattern.random(0, (8192, 8192), (16, 16), 1 / 16)
    skew = bs.BlockPattern.power_law(0, (8192, 8192), (16, 16), 1 / 16)
    assert lower(skew, opts) is lower(skew, opts)
    su, sk = lower(uni, opts), lower(skew, opts)
    assert sk.unit_len.sum() == su.unit_len.sum()
    # The longest program is at most one slot's share of one tile's work (or twice the mean row).
    mean = skew.nnz_blocks / (skew.row_lengths > 0).sum()
    assert sk.unit_len.max() <= max(skew.nnz_blocks / H200_SLOTS, 2 * mean) + 1
    assert skew.row_lengths.max() > sk.max_len  # long rows really were split
    assert sk.num_partials > 0
    # A uniform pattern is not split for nothing.
    assert su.num_partials == 0


def test_schedule_splits_for_parallelism():
    # 64 block rows x 2 column tiles = 128 programs < 264 slots: rows are split to fill the GPU.
    p = bs.BlockPattern.random(0, (8192, 8192), (128, 128), 1 / 4)
    s = lower(p, GpuLowering(tiles=2))
    assert s.num_units * 2 >= H200_SLOTS
    s.check()


def test_choose_max_len_respects_override_and_bounds():
    lengths = np.array([0, 3, 100, 2])
    assert choose_max_len(lengths, GpuLowering(max_len=7)) == 7
    with pytest.raises(ValueError, match="max_len >= 1"):
        choose_max_len(lengths, GpuLowering(max_len=0))
    assert choose_max_len(np.zeros(4, int), GpuLowering()) == 1
    assert choose_max_len(lengths, GpuLowering(min_len=50)) >= 50


# --------------------------------------------------------------------------------------------
# Kernels in interpret mode (CPU)
# --------------------------------------------------------------------------------------------
def _check_all_ops(p, dtype, key, n, cfg=None, table=RTOL):
    k1, k2, k3, k4, k5 = jax.random.split(key, 5)
    m, k = p.shape
    data = _data(k1, p, dtype)
    x = jax.random.normal(k2, (k, n), jnp.float32).astype(dtype)
    xb = jax.random.normal(k3, (n, m), jnp.float32).astype(dtype)
    a = jax.random.normal(k4, (m, n), jnp.float32).astype(dtype)
    b = jax.random.normal(k5, (n, k), jnp.float32).astype(dtype)
    # Reference in float32 on upcast inputs.
    d32 = data.astype(jnp.float32)
    f32 = jnp.float32
    s = _static(p)
    y = pt.dsd(p, data, x, dtype, config=cfg)
    _close(y, REF.dsd(s, d32, x.astype(f32)), dtype, table, f"dsd {p}")
    _close(pt.dds(xb, p, data, dtype, config=cfg), REF.dds(s, xb.astype(f32), d32), dtype, table, f"dds {p}")
    _close(pt.sdd(a, b, p, dtype, config=cfg), REF.sdd(s, a.astype(f32), b.astype(f32)), dtype, table, f"sdd {p}")


@settings(max_examples=examples(10), deadline=None)
@given(
    kind=st.sampled_from(["random", "single", "full_row", "empty"]),
    block=st.sampled_from([(16, 16), (32, 16), (16, 64)]),
    chunks=st.integers(1, 9),
    splits=st.integers(1, 6),
    dtype=st.sampled_from([jnp.float32, jnp.bfloat16]),
    seed=st.integers(0, 2**16),
)
def test_sdd_split_over_the_contracted_dimension_matches_the_reference(kind, block, chunks, splits, dtype, seed):
    """sdd_splits programs per block, each over a share of the contracted chunks (a last short share, more splits
    than chunks), their float32 partials summed; against the XLA reference."""
    p = _pattern(kind, seed, (64, 128), block)
    k1, k2 = jax.random.split(jax.random.key(seed))
    n = 16 * chunks - 3  # padded to chunks of tk = 16
    a = jax.random.normal(k1, (64, n), jnp.float32).astype(dtype)
    b = jax.random.normal(k2, (n, 128), jnp.float32).astype(dtype)
    with dispatch.interpret(True):
        got = pt.sdd(a, b, p, dtype, config=pt.TritonConfig(tk=16, sdd_splits=splits))
    _close(got, REF.sdd(_static(p), a.astype(jnp.float32), b.astype(jnp.float32)), dtype, RTOL, f"{p} {splits}")


def test_sdd_splits_by_default_only_for_few_blocks_per_sm():
    """The default: unsplit for SDD_WAVES blocks per SM; fewer blocks over a long contracted dimension are split
    (the kernel's name says how many ways) and still match."""
    from blocksparse.ops.matmul.schedule import contraction_splits

    target = tuned.H200.TRITON_SDD_WAVES * hardware.H200.num_sms
    assert contraction_splits(target, 4096, target, target, 32) == 1  # enough blocks: one program each
    assert contraction_splits(144, 256, target, target, 32) == 4  # 4 programs per SM
    assert contraction_splits(36, 256, target, target, 32) == 8  # 32 chunks a program at least
    assert contraction_splits(2, 7, target, target, 32) == 1 and contraction_splits(2, 4096, 132, 264, 8) == 132
    p = _pattern("single", 0, (32, 32), (16, 16))
    a = jax.random.normal(jax.random.key(0), (32, 16 * 96), jnp.float32)
    b = jax.random.normal(jax.random.key(1), (16 * 96, 32), jnp.float32)
    f = jax.jit(lambda a, b: pt.sdd(a, b, p, jnp.float32, config=pt.TritonConfig(tk=16)))
    with dispatch.interpret(True):
        assert "bs_sdd_16x16_tk16_split3" in str(jax.make_jaxpr(f)(a, b))  # 1 block, 96 chunks: 3 of 32
        got = f(a, b)
    _close(got, REF.sdd(_static(p), a, b), jnp.float32, RTOL, "default split")
    assert pt.sdd_splits(1, 16 * 96, (16, 16), pt.TritonConfig(tk=16)) == 3 and pt.sdd_splits(1, 0, (16, 16)) == 1
    # the measured layer (32768 tokens, chunks of 128): 144 blocks in 4, 36 in 8, 4 per SM unsplit (132 SMs here)
    assert [pt.sdd_splits(n, 32768, (32, 32)) for n in (144, 36, 528, 4096)] == [4, 8, 1, 1]
    with pytest.raises(ValueError, match="Expected sdd_splits >= 1. Got 0."):
        pt.TritonConfig(sdd_splits=0)


@settings(max_examples=examples(8))
@given(
    gm=st.integers(1, 4),
    gk=st.integers(1, 4),
    bh=st.sampled_from([16, 32]),
    bw=st.sampled_from([16, 32]),
    n=st.integers(1, 40),
    density=st.floats(0, 1),
    skew=st.booleans(),
    max_len=st.one_of(st.none(), st.integers(1, 3)),
    transpose_acc=st.one_of(st.none(), st.booleans()),
    dtype=st.sampled_from([jnp.float32, jnp.bfloat16]),
    seed=st.integers(0, 2**16),
)
def test_kernels_match_reference_interpret(gm, gk, bh, bw, n, density, skew, max_len, transpose_acc, dtype, seed):
    with dispatch.interpret():
        gen = bs.BlockPattern.power_law if skew else bs.BlockPattern.random
        p = gen(seed, (gm * bh, gk * bw), (bh, bw), density)
        cfg = pt.TritonConfig(max_len=max_len, transpose_acc=transpose_acc)
        _check_all_ops(p, dtype, jax.random.key(seed), n, cfg)


@sweep("kind", ["empty", "single", "full_row", "empty_rows", "full_col"], quick=["empty", "full_row"])
def test_adversarial_patterns_interpret(interpret, kind, getkey):
    p = _pattern(kind, 3, (64, 128), (16, 16))
    _check_all_ops(p, jnp.float32, getkey(), 24, pt.TritonConfig(max_len=2))


@pytest.mark.slow
def test_tiles_and_padding_interpret(interpret, getkey):
    # n not a multiple of the tile, several column tiles, several batch tiles in dds.
    p = _pattern("power_law", 1, (64, 64), (16, 16), 0.6)
    _check_all_ops(p, jnp.float32, getkey(), 40, pt.TritonConfig(tn=32, tb=32, tk=16, max_len=2))


# --------------------------------------------------------------------------------------------
# Dispatch and differentiation
# --------------------------------------------------------------------------------------------
def test_dispatch_uses_pallas_when_interpreting(interpret, getkey):
    W = bs.random(getkey(), (64, 96), (16, 32), 0.5)
    x = jax.random.normal(getkey(), (96, 8))
    with bs.dispatch_log() as log:
        y = bs.matmul(W, x)
    assert log == [("dsd", "pallas")]
    _close(y, W.to_dense() @ x, jnp.float32)
    xb = jax.random.normal(getkey(), (2, 3, 64))
    with bs.dispatch_log() as log:
        z = bs.matmul(xb, W)
    assert log == [("dds", "pallas")]
    _close(z, xb @ W.to_dense(), jnp.float32)


def test_dispatch_falls_back_without_gpu(getkey):
    if jax.default_backend() == "gpu":
        pytest.skip("has a GPU")
    W = bs.random(getkey(), (32, 32), (16, 16), 0.5)
    x = jax.random.normal(getkey(), (32, 4))
    with bs.interpret(False), bs.dispatch_log() as log:
        bs.matmul(W, x)
        assert log == [("dsd", "xla")]
        with pytest.raises(NotImplementedError, match="no GPU") as info:
            bs.matmul(W, x, implementation="pallas")
    assert isinstance(info.value, ExceptionGroup) and len(info.value.exceptions) == 1


def test_interpret_is_part_of_the_jit_cache_key(getkey):
    # A function jitted (and cached) outside the context is traced again inside it, and back.
    if jax.default_backend() == "gpu":
        pytest.skip("has a GPU")
    W = bs.random(getkey(), (32, 32), (16, 16), 0.5)
    x = jax.random.normal(getkey(), (32, 4))
    f = jax.jit(lambda d, x: bs.matmul(W.with_data(d), x))
    with bs.interpret(False), bs.dispatch_log() as log:
        y0 = f(W.data, x)
    assert log == [("dsd", "xla")]
    with bs.interpret(), bs.dispatch_log() as log:
        y1 = f(W.data, x)
    assert log == [("dsd", "pallas")]
    with bs.interpret(False), bs.dispatch_log() as log:
        f(W.data, x)
    assert log in ([], [("dsd", "xla")])  # never the pallas trace
    _close(y1, y0, jnp.float32)


def test_kernel_config_is_part_of_the_jit_cache_key(interpret, getkey):
    W = bs.random(getkey(), (32, 64), (16, 16), 1.0)
    x = jax.random.normal(getkey(), (64, 40))
    seen = []

    @functools.partial(jax.jit, static_argnums=2)
    def f(d, x, config):
        seen.append(config.tn)  # runs only when traced
        return bs.matmul(W.with_data(d), x, implementation="pallas", config=config)

    y16 = f(W.data, x, pt.TritonConfig(tn=16))
    y32 = f(W.data, x, pt.TritonConfig(tn=32))
    f(W.data, x, pt.TritonConfig(tn=16))  # a cache hit: not traced again
    assert seen == [16, 32]
    _close(y16, y32, jnp.float32)


def test_dispatch_log_and_interpret_are_local_to_the_thread(getkey):
    import threading

    W = bs.random(getkey(), (32, 32), (16, 16), 0.5)
    x = jax.random.normal(getkey(), (32, 4))
    seen = {}

    def other():
        with bs.dispatch_log() as log:
            bs.matmul(W.with_data(W.data + 1), x)  # a new trace in this thread
        seen["log"], seen["interpreting"] = log, dispatch.interpreting()

    thread = threading.Thread(target=other)
    with bs.interpret(), bs.dispatch_log() as log:
        thread.start()
        thread.join()
        assert dispatch.interpreting()
    assert log == []  # the other thread's op is not in this thread's log
    assert seen["interpreting"] is False  # nor does this thread's interpret() reach it
    expected = "pallas" if jax.default_backend() == "gpu" else "xla"
    assert seen["log"] == [("dsd", expected)]


@sweep("block", [(8, 8), (4, 16), (1, 1), (16, 48)], quick=[(8, 8), (16, 48)])
def test_unsupported_blocks_fall_back(interpret, block, getkey):
    W = bs.random(getkey(), (96, 96), block, 0.5)
    x = jax.random.normal(getkey(), (96, 4))
    with bs.dispatch_log() as log:
        y = bs.matmul(W, x)
    assert log == [("dsd", "xla")]
    _close(y, W.to_dense() @ x, jnp.float32)
    with pytest.raises(NotImplementedError, match=rf"got \({block[0]}, {block[1]}\)"):
        bs.matmul(W, x, implementation="pallas")


def test_unsupported_dtype_falls_back(interpret, getkey):
    W = bs.random(getkey(), (32, 32), (16, 16), 0.5)
    x = jax.random.normal(getkey(), (32, 4))
    f8 = jnp.float8_e4m3fn
    with pytest.raises(NotImplementedError, match="float16, bfloat16 or float32"):
        PAL.dsd(_static(W.pattern), W.data.astype(f8), x.astype(f8))


def test_gradients_use_pallas_interpret(interpret, getkey):
    W = bs.random(getkey(), (64, 32), (16, 16), 0.6)
    x = jax.random.normal(getkey(), (32, 20))
    xb = jax.random.normal(getkey(), (5, 64))

    def loss(data, x, xb, impl):
        Wd = W.with_data(data)
        return jnp.sum(jnp.sin(bs.matmul(Wd, x, implementation=impl))) + jnp.sum(
            jnp.cos(bs.matmul(xb, Wd, implementation=impl))
        )

    # jitted: eagerly the backward's glue compiles op by op (eager kernels: the tests above)
    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)), static_argnums=3)
    with bs.dispatch_log() as log:  # written while tracing
        gp = grad(W.data, x, xb, "pallas")
    assert {name for _, name in log} == {"pallas"}
    assert {op for op, _ in log} == {"dsd", "dds", "sdd"}
    gx = grad(W.data, x, xb, "xla")
    for a, e in zip(gp, gx, strict=True):
        _close(a, e, jnp.float32)


def test_jit_and_sdd_api_interpret(interpret, getkey):
    W = bs.random(getkey(), (32, 64), (16, 32), 0.5)
    a = jax.random.normal(getkey(), (32, 12))
    b = jax.random.normal(getkey(), (12, 64))
    with bs.dispatch_log() as log:
        S = jax.jit(lambda a, b: bs.sdd(a, b, W).data)(a, b)
    assert log == [("sdd", "pallas")]
    _close(S, REF.sdd(_static(W.pattern), a, b), jnp.float32)


# --------------------------------------------------------------------------------------------
# GPU: every kernel, forward and backward, every supported block size and dtype
# --------------------------------------------------------------------------------------------
GPU_BLOCKS = [(16, 16), (32, 32), (64, 64), (128, 128), (16, 64), (128, 32)]
GPU_DTYPES = [jnp.bfloat16, jnp.float16, jnp.float32]


@functools.cache
def _fwd_bwd(impl: str, config: pt.TritonConfig | None = None):
    # `config` applies to the forward products (the backward's take the defaults).
    def f(data, x, xb, gy, gz, pattern):
        W = bs.BlockSparseMatrix(pattern, data)

        def fwd(data, x, xb):
            Wd = W.with_data(data)
            return bs.matmul(Wd, x, implementation=impl, config=config), bs.matmul(xb, Wd, implementation=impl,
                                                                                  config=config)  # fmt: skip

        (y, z), vjp = jax.vjp(fwd, data, x, xb)
        return (y, z, *vjp((gy, gz)))

    return jax.jit(f, static_argnums=5)


def _gpu_check(p, dtype, key, n=256, batch=192, config=None):
    ks = jax.random.split(key, 5)
    m, k = p.shape
    data = _data(ks[0], p, dtype)
    x = jax.random.normal(ks[1], (k, n), jnp.float32).astype(dtype)
    xb = jax.random.normal(ks[2], (batch, m), jnp.float32).astype(dtype)
    gy = jax.random.normal(ks[3], (m, n), jnp.float32).astype(dtype)
    gz = jax.random.normal(ks[4], (batch, k), jnp.float32).astype(dtype)
    with bs.dispatch_log() as log:
        got = _fwd_bwd("pallas", config)(data, x, xb, gy, gz, p)
    assert {name for _, name in log} == {"pallas"}, log
    f32 = [t.astype(jnp.float32) for t in (data, x, xb, gy, gz)]
    with jax.default_matmul_precision("highest"):
        want = _fwd_bwd("xla")(*f32, p)
    for name, a, e in zip(("y", "z", "ddata", "dx", "dxb"), got, want, strict=True):
        _close(a, e, dtype, RTOL_GPU, f"{name} {p} {jnp.dtype(dtype)}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("block", GPU_BLOCKS, ids=str)
def test_gpu_kernels_forward_backward(block, dtype, getkey):
    if jnp.dtype(dtype) != jnp.bfloat16 and block[0] != block[1] and block != (16, 64):
        pytest.skip("rectangular blocks: bf16 only, besides (16, 64)")
    p = _pattern("random", 0, (1024, 768), block, 0.2)
    _gpu_check(p, dtype, getkey())


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["empty", "single", "full_row", "empty_rows", "full_col", "power_law"])
def test_gpu_adversarial(kind, getkey):
    p = _pattern(kind, 1, (1024, 1024), (32, 32), 0.25)
    _gpu_check(p, jnp.bfloat16, getkey(), n=200, batch=72)


@pytest.mark.gpu
def test_gpu_split_rows_and_tiles(getkey):
    # Force heavy splitting so partial-combine paths run on the device.
    p = _pattern("power_law", 2, (2048, 2048), (64, 64), 0.2)
    _gpu_check(p, jnp.bfloat16, getkey(), n=320, batch=130, config=pt.TritonConfig(max_len=3, tn=64, tb=64, tk=32))


@pytest.mark.gpu
def test_gpu_default_dispatch_follows_the_measured_rules(getkey):
    """Pallas by default, or Mosaic first where its measured rule claims the product (on a Hopper GPU)."""
    from blocksparse.ops.matmul import order

    W = bs.random(getkey(), (512, 512), (64, 64), 0.25, dtype=jnp.bfloat16)
    x = jax.random.normal(getkey(), (512, 128), jnp.bfloat16)
    with bs.dispatch_log() as log:
        bs.matmul(W, x)
    first = order.default("dsd", W.pattern, 128, jnp.bfloat16, jnp.bfloat16)[0]
    assert log == [("dsd", first)]
    W8 = bs.random(getkey(), (512, 512), (8, 8), 0.25, dtype=jnp.bfloat16)
    with bs.dispatch_log() as log:
        bs.matmul(W8, x)
    assert log == [("dsd", "xla")]


@pytest.mark.gpu
@pytest.mark.parametrize("transpose_acc", [False, True])
@pytest.mark.parametrize("block", [(16, 16), (32, 32), (64, 64)], ids=str)
def test_gpu_both_accumulator_layouts(block, transpose_acc, getkey):
    p = _pattern("power_law", 4, (1024, 1024), block, 0.3)
    _gpu_check(p, jnp.bfloat16, getkey(), n=384, batch=64, config=pt.TritonConfig(transpose_acc=transpose_acc))


@pytest.mark.gpu
@pytest.mark.parametrize("block", [(16, 16), (32, 32), (64, 64)], ids=str)
def test_gpu_float32_precision(block, getkey):
    """float32 on the Pallas path: TF32 by default (like jnp.dot), float32 accuracy at HIGHEST."""
    p = _pattern("random", 5, (1024, 1024), block, 0.25)
    W = bs.BlockSparseMatrix(p, _data(getkey(), p, jnp.float32))
    x = jax.random.normal(getkey(), (1024, 256))
    xb = jax.random.normal(getkey(), (96, 1024))
    w64 = np.asarray(W.to_dense(), np.float64)
    want = (w64 @ np.asarray(x, np.float64), np.asarray(xb, np.float64) @ w64)

    def rel(a, e):
        return float(np.abs(np.asarray(a, np.float64) - e).max() / np.abs(e).max())

    for mode in ({"precision": "highest"}, None):
        with bs.dispatch_log() as log:
            if mode is None:
                with jax.default_matmul_precision("highest"):
                    got = jax.jit(lambda W, x, xb: (W @ x, xb @ W))(W, x, xb)
            else:
                got = (bs.matmul(W, x, **mode), bs.matmul(xb, W, **mode))
        assert {name for _, name in log} == {"pallas"}, log
        for a, e in zip(got, want, strict=True):
            assert rel(a, e) < 1e-5, (mode, rel(a, e))
    tf32 = bs.matmul(W, x)
    assert 1e-6 < rel(tf32, want[0]) < 4e-3  # TF32 by default, as jnp.dot on the GPU
    ddata = jax.grad(lambda d: jnp.sum(bs.matmul(W.with_data(d), x, precision="highest") ** 2))(W.data)
    ddata_ref = jax.grad(lambda d: jnp.sum(bs.matmul(W.with_data(d), x, implementation="xla",
                                                     precision="highest") ** 2))(W.data)  # fmt: skip
    assert rel(ddata, np.asarray(ddata_ref, np.float64)) < 1e-5
