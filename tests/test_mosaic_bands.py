"""The banded Mosaic GPU kernel for blocks of 16 and 32 (``blocksparse.ops.matmul.mosaic.bands``).

CPU (CI): the band schedule against a brute-force reading of the pattern, the kernel in Pallas' GPU interpreter
against the float64 oracle (``x @ W`` and ``W @ x``, the epilogue, the strategies' patterns), its CUDA lowering
and its refusals. GPU (``-m gpu``): the real kernel at real sizes against the float64 oracle.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from test_pallas_mosaic import HALF, _hopper

import blocksparse as bs
from blocksparse import hardware
from blocksparse.ops.matmul import epilogue, order
from blocksparse.ops.matmul.mosaic import bands as pb
from blocksparse.testing import strategies as bst
from blocksparse.testing.oracles import assert_close, to_dense64

KINDS = ("random", "full_row", "full_col", "empty_rows", "single", "empty", "full")


def _np(x):
    return np.asarray(jnp.asarray(x, jnp.float32), np.float64)


# ----------------------------------------------------------------------------- the band schedule
@settings(max_examples=40, deadline=None)
@given(bst.block_patterns(block_size=st.sampled_from([(16, 16), (32, 32)]), max_blocks=9, kinds=KINDS),
       st.integers(1, 9), st.booleans())  # fmt: skip
def test_bands_cover_every_block_once(pattern, group, transposed):
    """Each block is in exactly one step of its band, in the slot of its column; steps are the band's block rows
    in order; masks and counts agree with the slots."""
    s = pb.bands(pattern, group, transposed)
    mask = pattern.mask()
    if transposed:
        mask = mask.T
    coords = list(zip(pattern.rows.tolist(), pattern.cols.tolist(), strict=True))
    gk, gn = mask.shape
    assert s.num_bands == max(-(-gn // group), 1)
    seen, total = [], 0
    for g in range(s.num_bands):
        cols = range(g * group, min((g + 1) * group, gn))
        want_rows = [r for r in range(gk) if any(mask[r, c] for c in cols)]
        steps = range(s.band_start[g], s.band_start[g + 1])
        assert [int(s.step_row[i]) for i in steps] == want_rows
        total += len(want_rows)
        for i in steps:
            r = int(s.step_row[i])
            ids = s.step_ids[i]
            for j in range(group):
                c = g * group + j
                present = c < gn and mask[r, c]
                assert bool((int(s.step_mask[i]) >> j) & 1) == present
                assert (ids[j] >= 0) == present
                if present:  # the id points at the block at (r, c) of W (of W^T: the block (c, r) of the pattern)
                    want = (c, r) if transposed else (r, c)
                    assert coords[int(ids[j])] == want
                    seen.append(int(ids[j]))
            assert s.step_mask[i] != 0
    assert sorted(seen) == list(range(pattern.nnz_blocks))
    assert s.num_steps == total
    for a in (s.band_start, s.meta):
        assert a.dtype == np.int32 and not a.flags.writeable
    assert s.meta.shape == (total + pb.CHUNK, -(-(group + 2) // 4) * 4)


def test_bands_are_cached_and_check_the_group():
    pat = bs.BlockPattern.random(0, (64, 64), (16, 16), 0.5)
    assert pb.bands(pat, 4) is pb.bands(pat, 4)
    with pytest.raises(ValueError, match="group"):
        pb.bands(pat, 32)


def test_plan_tiles_and_refusals():
    pat = bs.BlockPattern.random(0, (256, 512), (32, 32), 0.25)
    p = pb.plan(pat, 1000)
    assert (p.tm, p.width, p.m_pad, p.n_pad) == (128, 128, 1024, 512) and p.sched.group == 4
    assert pb.plan(pat, 1000, transposed=True).n_pad == 256
    assert pb.plan(pat, 1000, config=pb.BandConfig(tm=64, width=256)).sched.group == 8
    with pytest.raises(NotImplementedError, match="square blocks of"):
        pb.plan(bs.BlockPattern.random(0, (128, 128), (64, 64), 0.5), 128)
    with pytest.raises(ValueError, match="tm \\* width"):
        pb.BandConfig(tm=128, width=256)
    with pytest.raises(ValueError, match="width in"):
        pb.BandConfig(width=96)
    with pytest.raises(ValueError, match="2 <= stages <= 32. Got 33"):
        pb.BandConfig(stages=33)
    x = jnp.zeros((8, 256), jnp.float32)
    data = jnp.zeros((pat.nnz_blocks, 32, 32), jnp.float32)
    with pytest.raises(NotImplementedError, match="float16 or bfloat16"):
        pb.dds(pat, data, x)
    with pytest.raises(ValueError, match="Expected x of shape"):
        pb.dds(pat, data, x.T)
    with pytest.raises(ValueError, match="Expected data of shape"):
        pb.dsd(pat, data[:1], jnp.zeros((512, 8), jnp.bfloat16))


# ----------------------------------------------------------------------------- the interpreter
def _oracle_dds(W, x, bias=None, activation=None):
    y = _np(x) @ to_dense64(W)
    if bias is not None:
        y = y + _np(bias)[None, :]
    return y, np.abs(_np(x)) @ np.abs(to_dense64(W)) + (0 if bias is None else np.abs(_np(bias))[None, :])


@settings(max_examples=examples(4), deadline=None)
@given(
    bst.block_sparse_matrices(
        dtype=st.sampled_from(HALF), block_size=st.sampled_from([(16, 16), (32, 32)]), max_blocks=5, kinds=KINDS
    ),  # fmt: skip
    st.sampled_from([1, 70, 128]),
    st.sampled_from([None, (64, 128), (128, 64)]),
    st.integers(0, 2**16),
)
def test_bands_interpret_against_the_oracle(W, m, tiles, seed):
    """``x @ W`` and ``W @ x`` (the same blocks read transposed) in the interpreter, padding of both dimensions
    included (a last band narrower than the others, row tiles past ``m``)."""
    cfg = None if tiles is None else pb.BandConfig(tm=tiles[0], width=tiles[1])
    k, n = W.shape
    kx, kt = jax.random.split(jax.random.key(seed))
    x = jax.random.normal(kx, (m, k), W.dtype)
    xt = jax.random.normal(kt, (n, m), W.dtype)
    y = pb.dds(W.pattern, W.data, x, config=cfg, interpret=True)
    z = pb.dsd(W.pattern, W.data, xt, config=cfg, interpret=True)
    assert y.shape == (m, n) and y.dtype == W.dtype and z.shape == (k, m)
    want, scale = _oracle_dds(W, x)
    assert_close(y, want, scale, W.dtype, "x @ W")
    w = to_dense64(W)
    assert_close(z, w @ _np(xt), np.abs(w) @ np.abs(_np(xt)), W.dtype, "W @ x")


@pytest.mark.slow  # the bands kernel's interpreter check against the oracle stays in make test
def test_bands_epilogue_and_float32_output_interpret(getkey):
    """The fused bias (along x @ W's columns, W @ x's rows) and GELU on the float32 accumulator, float32 output; a
    band width that does not divide the columns (its bias padded)."""
    pat = bs.BlockPattern.random(0, (96, 160), (32, 32), 0.4)
    W = bs.BlockSparseMatrix(pat, jax.random.normal(getkey(), (pat.nnz_blocks, 32, 32), jnp.bfloat16))
    x = jax.random.normal(getkey(), (40, 96), jnp.bfloat16)
    bias = jax.random.normal(getkey(), (160,), jnp.float32)
    epi = epilogue.Epilogue("gelu", True, 1)
    y = pb.dds(pat, W.data, x, jnp.float32, epi, bias, config=pb.BandConfig(tm=64, width=128), interpret=True)
    pre, scale = _oracle_dds(W, x, bias)
    want = np.asarray(epilogue.apply(jnp.asarray(pre), None, "gelu"), np.float64)
    assert y.dtype == jnp.float32
    assert_close(y, want, scale, jnp.bfloat16, "gelu(x @ W + b)")
    xt = jax.random.normal(getkey(), (160, 24), jnp.bfloat16)
    rb = jax.random.normal(getkey(), (96,), jnp.float32)
    z = pb.dsd(pat, W.data, xt, None, epilogue.Epilogue("relu", True, 0), rb, interpret=True)
    w = to_dense64(W)
    want = np.maximum(w @ _np(xt) + _np(rb)[:, None], 0)
    assert_close(z, want, np.abs(w) @ np.abs(_np(xt)) + np.abs(_np(rb))[:, None], jnp.bfloat16, "relu(W @ x + b)")
    # the bias along the other axis: x @ W's rows, W @ x's columns (the tokens)
    rows = jax.random.normal(getkey(), (40,), jnp.float32)
    y = pb.dds(pat, W.data, x, None, epilogue.Epilogue("tanh", True, 0), rows, interpret=True)
    want = np.tanh(_np(x) @ to_dense64(W) + _np(rows)[:, None])
    assert_close(y, want, scale + np.abs(_np(rows))[:, None], jnp.bfloat16, "tanh(x @ W + b[:, None])")
    cols = jax.random.normal(getkey(), (24,), jnp.float32)
    z = pb.dsd(pat, W.data, xt, None, epilogue.Epilogue(None, True, 1), cols, interpret=True)
    want = w @ _np(xt) + _np(cols)[None, :]
    assert_close(z, want, np.abs(w) @ np.abs(_np(xt)) + np.abs(_np(cols))[None, :], jnp.bfloat16, "W @ x + b")
    with pytest.raises(ValueError, match="Expected a bias of shape"):
        pb.dds(pat, W.data, x, None, epilogue.Epilogue(None, True, 0), cols, interpret=True)


@pytest.mark.slow
def test_bands_long_band_interpret(getkey):
    """A band of 3 * CHUNK + 5 steps (one full column of W, plus scattered blocks): the metadata table is copied to
    shared memory chunk by chunk, three chunks in flight."""
    gk = 3 * pb.CHUNK + 5
    mask = np.zeros((gk, 3), bool)
    mask[:, 1] = True
    mask[::7, 0] = True
    pat = bs.BlockPattern.from_mask(mask, (16, 16))
    W = bs.BlockSparseMatrix(pat, jax.random.normal(getkey(), (pat.nnz_blocks, 16, 16), jnp.float16))
    x = jax.random.normal(getkey(), (8, gk * 16), jnp.float16)
    from jax._src.pallas.mosaic_gpu.interpret import gpu_callbacks  # the interpreter's race detector
    from jax.experimental.pallas import mosaic_gpu as plgpu

    params = plgpu.InterpretGPUParams(detect_races=True)
    y = pb.dds(pat, W.data, x, config=pb.BandConfig(tm=64, width=64), interpret=params)
    assert not gpu_callbacks.get_races().races_found  # a chunk's slot is refilled only after its reads
    assert pb.bands(pat, 4).num_steps == gk
    want, scale = _oracle_dds(W, x)
    assert_close(y, want, scale, jnp.float16, "x @ W (long band)")


def test_backend_routes_small_blocks_when_traced(getkey):
    """The routing of the slow test below, traced only (jax.eval_shape; the dispatch log is written while tracing):
    blocks of 16 and 32 on ``implementation="mosaic"``, plain, fused and both orders, and the gradients through
    ``("mosaic", "xla")``. The kernels' numbers: the interpreter tests above."""
    x, xt, c = jnp.zeros((96, 24), jnp.bfloat16), jnp.zeros((24, 64), jnp.bfloat16), jnp.zeros((24,), jnp.bfloat16)
    for b in (16, 32):
        W = bs.random(getkey(), (64, 96), b, 0.4, jnp.bfloat16)
        with bs.interpret(), bs.dispatch_log() as log:
            jax.eval_shape(lambda W, x: bs.matmul(W, x, implementation="mosaic"), W, x)
            jax.eval_shape(lambda W, x: bs.matmul(W, x, bias=c, activation="relu", implementation="mosaic"), W, x)
            jax.eval_shape(lambda xt, W: bs.matmul(xt, W, implementation="mosaic"), xt, W)
        assert log == [("dsd", "mosaic"), ("dsd+epilogue", "mosaic"), ("dds", "mosaic")], b
        loss = lambda d, x, W=W: bs.matmul(W.with_data(d), x, implementation=("mosaic", "xla")).sum()  # noqa: E731
        with bs.interpret(), bs.dispatch_log() as log:
            jax.eval_shape(jax.grad(loss, (0, 1)), W.data, x)
        assert log == [("dsd", "mosaic"), ("dsd", "mosaic"), ("sdd", "xla")], b  # dx = W^T @ g: a dsd


@pytest.mark.slow  # six kernels interpreted through bs.matmul; the routing alone: the traced test above
def test_backend_routes_small_blocks_to_the_banded_kernel(getkey):
    """``implementation="mosaic"`` takes blocks of 16 and 32 (plain and fused, both orders, the bias along either
    axis); gradients through ``("mosaic", "xla")`` match XLA's (the weight gradient of these blocks is not on
    Mosaic: it falls to XLA)."""
    W = bs.random(getkey(), (64, 96), 16, 0.4, jnp.bfloat16)
    x = jax.random.normal(getkey(), (96, 24), jnp.bfloat16)
    xt = jax.random.normal(getkey(), (24, 64), jnp.bfloat16)
    c = jax.random.normal(getkey(), (24,), jnp.bfloat16)
    with bs.interpret(), bs.dispatch_log() as log:
        y = bs.matmul(W, x, implementation="mosaic")
        f = bs.matmul(W, x, bias=c, activation="relu", implementation="mosaic")
        z = bs.matmul(xt, W, implementation="mosaic")
    assert log == [("dsd", "mosaic"), ("dsd+epilogue", "mosaic"), ("dds", "mosaic")]
    w = to_dense64(W)
    assert_close(y, w @ _np(x), np.abs(w) @ np.abs(_np(x)), jnp.bfloat16, "W @ x")
    assert_close(f, np.maximum(w @ _np(x) + _np(c)[None, :], 0), np.abs(w) @ np.abs(_np(x)) + 2, jnp.bfloat16, "fused")
    assert_close(z, _np(xt) @ w, np.abs(_np(xt)) @ np.abs(w), jnp.bfloat16, "x @ W")
    g = jax.random.normal(getkey(), (64, 24), jnp.float32)

    def loss(impl):
        return lambda d, x: jnp.sum(g * bs.matmul(W.with_data(d), x, implementation=impl).astype(jnp.float32))

    with bs.interpret():
        got = jax.grad(loss(("mosaic", "xla")), (0, 1))(W.data, x)
    want = jax.grad(loss("xla"), (0, 1))(W.data, x)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=2e-2, atol=2e-2)


def test_bands_lower_for_cuda():
    """The Pallas -> Mosaic GPU lowering accepts the kernel: the 32- and 64-byte swizzles, the per-slot barriers,
    the conditional wgmmas on column slices of the accumulator, the transposed view of W's blocks."""
    for b, op in ((16, "dds"), (32, "dsd")):
        pat = bs.BlockPattern.random(0, (512, 512), (b, b), 0.25)
        data = jnp.zeros((pat.nnz_blocks, b, b), jnp.bfloat16)
        x = jnp.zeros((256, 512), jnp.bfloat16)
        fn = pb.dds if op == "dds" else pb.dsd
        f = jax.jit(lambda d, x, fn=fn, pat=pat: fn(pat, d, x, interpret=False))
        txt = f.trace(data, x if op == "dds" else x.T).lower(lowering_platforms=("cuda",)).as_text()
        assert f"bs_mgpu_bands_{b}" in txt


@pytest.mark.slow  # compiles many products to count kernels (13 s); the interpreter check stays quick
def test_products_of_one_configuration_share_one_kernel():
    """Two products whose patterns differ but whose static configuration is the same (shape, blocks, their count;
    step counts 109 and 106, both taken as 128 schedule rows) lower the kernel once and call it twice: a pruned
    model's projections of one shape compile it once. A third product of another shape gets its own."""
    b = 32
    same = [bs.BlockPattern.random(seed, (512, 512), (b, b), 0.25) for seed in (0, 1)]
    other = bs.BlockPattern.random(2, (512, 256), (b, b), 0.25)
    assert [pb.bands(p, 4).meta.shape[0] for p in same] == [109, 106] and same[0] != same[1]
    data = jnp.zeros((same[0].nnz_blocks, b, b), jnp.bfloat16)
    data2 = jnp.zeros((other.nnz_blocks, b, b), jnp.bfloat16)
    x = jnp.zeros((256, 512), jnp.bfloat16)

    def two(d, x):
        return pb.dds(same[0], d, x, interpret=False) + pb.dds(same[1], d, x, interpret=False)

    def three(d, d2, x):
        return jnp.sum(two(d, x)) + jnp.sum(pb.dds(other, d2, x, interpret=False))

    txt = jax.jit(two).trace(data, x).lower(lowering_platforms=("cuda",)).as_text()
    assert txt.count("mosaic_gpu_v2") == 1 and txt.count("bs_mgpu_bands_32") >= 1
    txt = jax.jit(three).trace(data, data2, x).lower(lowering_platforms=("cuda",)).as_text()
    assert txt.count("mosaic_gpu_v2") == 2
    with bs.interpret():  # and the shared kernel computes each product with its own schedule
        w = [bs.BlockSparseMatrix(p, jax.random.normal(jax.random.key(i), (p.nnz_blocks, b, b), jnp.bfloat16))
             for i, p in enumerate(same)]  # fmt: skip
        xs = jax.random.normal(jax.random.key(9), (64, 512), jnp.bfloat16)
        for m in w:
            got = pb.dds(m.pattern, m.data, xs)
            want = np.asarray(xs, np.float32) @ np.asarray(m.to_dense(), np.float32)
            np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=3e-2, atol=3e-1)


# ----------------------------------------------------------------------------- the GPU
@pytest.mark.gpu
@pytest.mark.parametrize("b", [16, 32])
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("kind", KINDS)
def test_bands_gpu(b, dtype, kind):
    _hopper()
    rng = np.random.default_rng(b + len(kind))
    gk, gn = 1024 // b, 768 // b
    mask = bst._mask(kind, gk, gn, 0.25, rng)
    pat = bs.BlockPattern.from_mask(mask, (b, b))
    W = bs.BlockSparseMatrix(pat, jnp.asarray(rng.standard_normal((pat.nnz_blocks, b, b)), dtype))
    x = jnp.asarray(rng.standard_normal((1000, 1024)), dtype)
    y = jax.jit(lambda d, x: pb.dds(pat, d, x))(W.data, x)
    want, scale = _oracle_dds(W, x)
    assert_close(y, want, scale, dtype, f"x @ W ({kind})")
    xt = jnp.asarray(rng.standard_normal((768, 300)), dtype)
    z = jax.jit(lambda d, x: pb.dsd(pat, d, x))(W.data, xt)
    w = to_dense64(W)
    assert_close(z, w @ _np(xt), np.abs(w) @ np.abs(_np(xt)), dtype, f"W @ x ({kind})")


@pytest.mark.gpu
@pytest.mark.parametrize("b", [16, 32])
def test_bands_gpu_long_bands(b):
    """W 8192 x 2048 with two full columns (bands of 8192 / b steps: many metadata chunks) at density 1/4."""
    _hopper()
    rng = np.random.default_rng(b)
    mask = rng.random((8192 // b, 2048 // b)) < 0.25
    mask[:, [3, 40]] = True
    pat = bs.BlockPattern.from_mask(mask, (b, b))
    W = bs.BlockSparseMatrix(pat, jnp.asarray(rng.standard_normal((pat.nnz_blocks, b, b)), jnp.bfloat16))
    x = jnp.asarray(rng.standard_normal((512, 8192)), jnp.bfloat16)
    y = jax.jit(lambda d, x: pb.dds(pat, d, x))(W.data, x)
    want, scale = _oracle_dds(W, x)
    assert_close(y, want, scale, jnp.bfloat16, "x @ W (long bands)")
    pt = bs.BlockPattern.from_mask(mask.T, (b, b))  # W @ x with two full block rows: the long bands of dsd
    V = bs.BlockSparseMatrix(pt, jnp.asarray(rng.standard_normal((pt.nnz_blocks, b, b)), jnp.bfloat16))
    xt = jnp.asarray(rng.standard_normal((8192, 384)), jnp.bfloat16)
    z = jax.jit(lambda d, x: pb.dsd(pt, d, x))(V.data, xt)
    v = to_dense64(V)
    assert_close(z, v @ _np(xt), np.abs(v) @ np.abs(_np(xt)), jnp.bfloat16, "W @ x (long bands)")


@pytest.mark.gpu
def test_bands_gpu_through_matmul_and_the_default_rule():
    """``bs.matmul(..., implementation="mosaic")`` runs the banded kernel for 32 x 32 blocks (plain, fused with the
    API's bias, both orders) and the default order puts it first for the inference layer at density 1/4."""
    _hopper()
    W = bs.random(jax.random.key(0), (384, 1536), 32, 0.25, jnp.bfloat16)
    x = jax.random.normal(jax.random.key(1), (8192, 384), jnp.bfloat16)
    c = jax.random.normal(jax.random.key(2), (1536,), jnp.bfloat16)
    with bs.dispatch_log() as log:
        y = jax.jit(lambda x, W: bs.matmul(x, W, implementation="mosaic"))(x, W)
        f = jax.jit(lambda x, W, c: bs.matmul(x, W, bias=c, activation="gelu", implementation="mosaic"))(x, W, c)
        z = jax.jit(lambda W, x: bs.matmul(W, x, implementation="mosaic"))(W, x[:1536])
    assert log == [("dds", "mosaic"), ("dds+epilogue", "mosaic"), ("dsd", "mosaic")]
    w = to_dense64(W)
    assert_close(y, _np(x) @ w, np.abs(_np(x)) @ np.abs(w), jnp.bfloat16, "x @ W")
    pre = _np(x) @ w + _np(c)[None, :]
    want = np.asarray(epilogue.apply(jnp.asarray(pre), None, "gelu"), np.float64)
    assert_close(f, want, np.abs(_np(x)) @ np.abs(w) + np.abs(_np(c))[None, :], jnp.bfloat16, "gelu(x @ W + c)")
    assert_close(z, w @ _np(x[:1536]), np.abs(w) @ np.abs(_np(x[:1536])), jnp.bfloat16, "W @ x")
    assert order.default("dds", W.pattern, 32768, jnp.bfloat16, jnp.bfloat16)[0] == "mosaic"


@pytest.mark.gpu
@pytest.mark.parametrize("tiles", [(64, 64), (64, 128), (64, 256), (128, 64), (128, 128)])
@pytest.mark.parametrize("stages", [2, 4])
def test_bands_gpu_tiles_and_epilogue(tiles, stages):
    _hopper()
    rng = np.random.default_rng(7)
    pat = bs.BlockPattern.random(rng, (2048, 1536), (16, 16), 0.2)
    W = bs.BlockSparseMatrix(pat, jnp.asarray(rng.standard_normal((pat.nnz_blocks, 16, 16)), jnp.bfloat16))
    x = jnp.asarray(rng.standard_normal((4096, 2048)), jnp.bfloat16)
    bias = jnp.asarray(rng.standard_normal(1536), jnp.float32)
    cfg = pb.BandConfig(tm=tiles[0], width=tiles[1], stages=stages)
    epi = epilogue.Epilogue("silu", True, 1)
    y = jax.jit(lambda d, x, c: pb.dds(pat, d, x, jnp.float32, epi, c, config=cfg))(W.data, x, bias)
    pre, scale = _oracle_dds(W, x, bias)
    want = np.asarray(epilogue.apply(jnp.asarray(pre), None, "silu"), np.float64)
    assert_close(y, want, scale, jnp.bfloat16, f"silu(x @ W + b) {tiles} stages={stages}")


@pytest.mark.parametrize(
    "op,shape,b,density,size,want",
    [("dds", (384, 1536), 32, 1 / 4, 32768, True), ("dds", (384, 1536), 32, 1 / 8, 32768, True),
     ("dds", (384, 1536), 32, 1 / 16, 32768, False), ("dds", (384, 1536), 16, 1 / 4, 32768, False),
     ("dds", (384, 1536), 32, 1 / 4, 1024, False), ("dsd", (8192, 8192), 32, 1 / 4, 4096, False),
     ("dsd", (1024, 1024), 64, 1 / 4, 4096, False)],
)  # fmt: skip
def test_default_rule_on_a_claimed_hopper(op, shape, b, density, size, want):
    """The rule reads the measured tables (on a device taken for a Hopper GPU): only cells measured faster claim."""
    pat = bs.BlockPattern.random(0, shape, (b, b), density)
    with hardware.fake(hardware.H200):
        assert (order.default(op, pat, size, jnp.bfloat16, jnp.bfloat16)[0] == "mosaic") == want
        assert order.default(op, pat, size, jnp.bfloat16, jnp.float16) == order.DEFAULT
