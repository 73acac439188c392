"""The few-token kernel (``triton/stream.py``): ``x @ W`` and ``W @ x`` with a handful of tokens, in one launch.

CPU (CI): its plan and dispatch rule on a faked H200, one launch in the CUDA lowering, and its logic in Pallas'
interpreter against the dense product on random shapes, block sizes, densities (empty and full) and adversarial
patterns, with the fused epilogue and gradients. GPU (``-m gpu``): the real kernel on the same oracles.
"""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import has_gpu
from helpers import check_product_and_gradients, examples, relative_error, sweep
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from test_gnn_pallas import _lower_for_cuda

import blocksparse as bs
from blocksparse import hardware
from blocksparse.ops.matmul import tuned
from blocksparse.ops.matmul.epilogue import Epilogue, InputGate
from blocksparse.ops.matmul.triton import TritonConfig, stream

ON_GPU = has_gpu()
TOL = {jnp.dtype(jnp.float32): 2e-5, jnp.dtype(jnp.bfloat16): 2e-2, jnp.dtype(jnp.float16): 4e-3}
HIGHEST = jax.lax.Precision.HIGHEST


pytestmark = pytest.mark.usefixtures("kernels_here")


def _pattern(kind: str, rng, grid, block, density):
    gm, gk = grid
    if kind == "random":
        return bs.BlockPattern.random(rng, (gm * block, gk * block), block, density)
    mask = np.zeros(grid, bool)
    if kind == "one_full_row":
        mask[rng.integers(gm), :] = True
    elif kind == "one_full_col":
        mask[:, rng.integers(gk)] = True
    elif kind == "empty_rows":
        mask[::2, :] = True
    elif kind == "single":
        mask[rng.integers(gm), rng.integers(gk)] = True
    return bs.BlockPattern.from_mask(mask, block)


@settings(max_examples=examples(12), deadline=None)
@given(
    kind=st.sampled_from(["random", "random", "one_full_row", "one_full_col", "empty_rows", "single"]),
    gm=st.integers(1, 5),
    gk=st.integers(1, 5),
    block=st.sampled_from([16, 32, 64]),
    n=st.sampled_from([1, 2, 7, 16, 17, 40]),
    density=st.sampled_from([0.0, 0.3, 1.0]),
    op=st.sampled_from(["x @ W", "W @ x"]),
    group=st.sampled_from([1, 3, 4]),
    tile=st.sampled_from([None, 16]),
    split=st.sampled_from([None, 1, 2, 3, 8]),
    fma=st.sampled_from([None, True, False]),
    dtype=st.sampled_from([jnp.float32, jnp.bfloat16]),
    seed=st.integers(0, 2**16),
)
def test_stream_matches_the_dense_product(kind, gm, gk, block, n, density, op, group, tile, split, fma, dtype, seed):
    rng = np.random.default_rng(seed)
    p = _pattern(kind, rng, (gm, gk), block, density)
    data = jnp.asarray(rng.standard_normal((p.nnz_blocks, block, block)), dtype)
    W = bs.BlockSparseMatrix(p, data)
    # split 8 on walks of at most 5 blocks: parts with no block at all
    # fma: one token on the CUDA cores (more tokens ignore it)
    cfg = TritonConfig(stream=True, stream_group=group, tn=tile, tb=tile, stream_split=split, stream_fma=fma)
    if op == "x @ W":
        x = jnp.asarray(rng.standard_normal((n, p.shape[0])), dtype)
        got = bs.matmul(x, W, implementation="pallas", precision=HIGHEST, config=cfg)
        want = x.astype(jnp.float32) @ W.to_dense().astype(jnp.float32)
    else:
        x = jnp.asarray(rng.standard_normal((p.shape[1], n)), dtype)
        got = bs.matmul(W, x, implementation="pallas", precision=HIGHEST, config=cfg)
        want = W.to_dense().astype(jnp.float32) @ x.astype(jnp.float32)
    assert got.dtype == jnp.dtype(dtype)
    assert relative_error(got.astype(jnp.float32), want) <= TOL[jnp.dtype(dtype)]


def _walk_ordered(p, data):
    """``data`` of pattern ``p`` in ``x @ W``'s walk order (block column after block column) and whether that order
    differs from storage order."""
    perm = np.asarray(p.transpose()[1], np.int64)
    return data[perm], not np.array_equal(perm, np.arange(perm.size))


@settings(max_examples=examples(8), deadline=None)
@given(
    kind=st.sampled_from(["random", "random", "empty_rows"]),
    gm=st.integers(2, 4),
    gk=st.integers(2, 4),
    block=st.sampled_from([16, 32]),
    n=st.sampled_from([1, 3, 16]),
    split=st.sampled_from([None, 2]),
    fma=st.sampled_from([None, True]),
    seed=st.integers(0, 2**16),
)
def test_blocks_in_walk_order_match_the_dense_product(kind, gm, gk, block, n, split, fma, seed):
    # x @ W with W's blocks handed over block column after block column (`ordered`): no index load before a block's
    rng = np.random.default_rng(seed)
    p = _pattern(kind, rng, (gm, gk), block, 0.6)
    data = jnp.asarray(rng.standard_normal((p.nnz_blocks, block, block)), jnp.float32)
    walk, reordered = _walk_ordered(p, data)
    assume(reordered)  # a walk order equal to storage order would not tell `ordered` from the index load
    x = jnp.asarray(rng.standard_normal((n, p.shape[0])), jnp.float32)
    cfg = TritonConfig(stream=True, stream_split=split, stream_fma=fma)
    got = stream.dds(x, p, walk, jnp.float32, exact=True, config=cfg, ordered=True)
    want = jnp.dot(x, bs.BlockSparseMatrix(p, data).to_dense(), precision=HIGHEST)
    assert relative_error(got, want) <= TOL[jnp.dtype(jnp.float32)]


def test_blocks_in_walk_order_are_read_in_that_order():
    # a fixed pattern whose walk order differs from storage order: the same blocks read through the index (storage
    # order) or in walk order give the product; the walk-ordered blocks read through the index do not
    p = bs.BlockPattern.from_mask(np.array([[1, 1, 0], [0, 1, 1], [1, 0, 1]], bool), 16)
    rng = np.random.default_rng(0)
    data = jnp.asarray(rng.standard_normal((p.nnz_blocks, 16, 16)), jnp.float32)
    walk, reordered = _walk_ordered(p, data)
    assert reordered
    x = jnp.asarray(rng.standard_normal((2, 48)), jnp.float32)
    want = jnp.dot(x, bs.BlockSparseMatrix(p, data).to_dense(), precision=HIGHEST)
    cfg = TritonConfig(stream=True)
    assert relative_error(stream.dds(x, p, walk, jnp.float32, exact=True, config=cfg, ordered=True), want) <= 2e-5
    assert relative_error(stream.dds(x, p, data, jnp.float32, exact=True, config=cfg), want) <= 2e-5
    assert relative_error(stream.dds(x, p, walk, jnp.float32, exact=True, config=cfg), want) > 0.1


@sweep("op", ["x @ W", "W @ x"])
def test_fused_epilogue_and_gradients_match_dense(op):
    rng = np.random.default_rng(1)
    W = bs.random(jax.random.key(2), (128, 64) if op == "x @ W" else (64, 128), 32, 0.5)
    bias = jnp.asarray(rng.standard_normal(64), jnp.float32)

    def sparse(W, x):
        if op == "x @ W":
            return bs.matmul(x, W, bias=bias, activation=jax.nn.gelu, precision=HIGHEST)
        out = bs.matmul(W, x, precision=HIGHEST)
        return jax.nn.gelu(out + bias[:, None])

    def ref(w, x):
        out = x @ w if op == "x @ W" else w @ x
        return jax.nn.gelu(out + (bias if op == "x @ W" else bias[:, None]))

    x = jnp.asarray(rng.standard_normal((3, 128) if op == "x @ W" else (128, 3)), jnp.float32)
    with bs.dispatch_log() as log:
        check_product_and_gradients(sparse, ref, W, x)
    assert any("pallas" in str(e) for e in log)


def _gated_dense(z, activation):
    a, b = np.split(np.asarray(z, np.float64), 2, axis=-1)
    return np.asarray(jax.nn.silu(a) if activation == "silu" else a, np.float64) * b


@sweep(("op", "split"), [("x @ W", None), ("W @ v", 3), ("x @ W", 3), ("W @ v", None)], quick=2)
def test_gated_store_matches_dense(op, split):
    # glu=True in the kernel's store: output block u walks block columns (rows) u and u + half; split walks publish
    # both partials. Patterns with an empty block column (row) in one half, and a full one.
    rng = np.random.default_rng(7)
    mask = rng.random((4, 6)) < 0.4
    mask[:, 1] = False  # an empty gate column
    mask[:, 5] = True  # a full value column
    W = bs.BlockSparseMatrix.from_mask(mask if op == "x @ W" else mask.T, rng.standard_normal((64, 96)) if op ==
                                       "x @ W" else rng.standard_normal((96, 64)), 16)  # fmt: skip
    cfg = TritonConfig(stream=True, stream_split=split)
    bias = jnp.asarray(rng.standard_normal(96), jnp.float32)
    dense = np.asarray(W.to_dense(), np.float64)
    if op == "x @ W":
        x = jnp.asarray(rng.standard_normal((3, 64)), jnp.float32)
        got = bs.matmul(x, W, bias=bias, activation="silu", glu=True, precision=HIGHEST, config=cfg)
        want = _gated_dense(np.asarray(x, np.float64) @ dense + np.asarray(bias), "silu")
    else:
        x = jnp.asarray(rng.standard_normal(64), jnp.float32)
        got = bs.matmul(W, x, bias=bias, activation="silu", glu=True, precision=HIGHEST, config=cfg)
        want = _gated_dense(dense @ np.asarray(x, np.float64) + np.asarray(bias), "silu")
    assert relative_error(got, want) <= TOL[jnp.dtype(jnp.float32)]


@pytest.mark.skipif(ON_GPU, reason="the GPU runs the kernels for real")
def test_gated_product_is_one_launch_and_odd_halves_gate_after():
    # The gate and up projections of a decode step: one launch, the gate in its store (no multiply after it).
    W = bs.random(jax.random.key(0), (1024, 512), 32, 1 / 4, dtype=jnp.bfloat16)
    cfg = TritonConfig(stream=True)
    txt = _lower_for_cuda(lambda W, x: bs.matmul(x, W, activation="silu", glu=True, config=cfg), W,
                          jnp.ones((1, 1024), jnp.bfloat16))  # fmt: skip
    assert txt.count("__gpu$xla.gpu.triton") == 1 and re.search(r"bs_dds_stream_\w*_glu", txt)
    assert "stablehlo.multiply" not in txt and "stablehlo.slice" not in txt
    # halves that do not meet at a block boundary (3 block columns of 32): the kernel's product, then the gate
    W3 = bs.random(jax.random.key(1), (64, 96), 32, 1.0)
    x = jax.random.normal(jax.random.key(2), (2, 64))
    assert not stream.gates("dds", W3.pattern) and stream.gates("dsd", W3.pattern.T) is False
    txt = _lower_for_cuda(lambda W, x: bs.matmul(x, W, activation="silu", glu=True, config=cfg), W3, x)
    assert not re.search(r"bs_dds_stream_\w*_glu", txt) and "stablehlo.multiply" in txt
    with bs.interpret():
        got = bs.matmul(x, W3, activation="silu", glu=True, config=cfg, precision=HIGHEST)
    want = _gated_dense(np.asarray(x, np.float64) @ np.asarray(W3.to_dense(), np.float64), "silu")
    assert relative_error(got, want) <= 2e-5
    with pytest.raises(ValueError, match="even number of output blocks to gate.*Got 3"):
        stream.dds(x, W3.pattern, W3.data, jnp.float32, epi=Epilogue("silu", glu=True))


def _glu_dense(x, axis, activation):
    """``activation(a) * b`` of ``x``'s halves along ``axis``, rounded to ``x``'s dtype as a separate gate stores it."""
    a, b = jnp.split(jnp.asarray(x, jnp.float32), 2, axis=axis)
    act = {"silu": jax.nn.silu, "gelu_tanh": jax.nn.gelu, None: lambda v: v}[activation]
    return np.asarray((act(a) * b).astype(x.dtype).astype(jnp.float32), np.float64)


@settings(max_examples=examples(16), deadline=None)
@given(
    kind=st.sampled_from(["random", "one_full_row", "one_full_col", "empty_rows", "single"]),
    gm=st.integers(1, 4),
    gk=st.integers(1, 4),
    block=st.sampled_from([16, 32]),
    n=st.sampled_from([1, 3, 17]),
    density=st.sampled_from([0.0, 0.4, 1.0]),
    op=st.sampled_from(["x @ W", "W @ x", "W @ v"]),
    activation=st.sampled_from(["silu", "gelu_tanh", None]),
    epilogue=st.sampled_from([None, "relu", "glu"]),
    split=st.sampled_from([None, 2]),
    fma=st.sampled_from([None, True]),
    dtype=st.sampled_from([jnp.float32, jnp.bfloat16]),
    seed=st.integers(0, 2**16),
)
def test_gated_input_matches_dense(kind, gm, gk, block, n, density, op, activation, epilogue, split, fma, dtype,
                                   seed):  # fmt: skip
    # input_glu: x's contracted dimension holds (gate, value); each step gates the slab it loads. With and without
    # the fused epilogue (a bias and relu, or a gated output: two walks a program, both gating their input), split
    # walks, empty and full patterns, against the dense product of the gated operand.
    rng = np.random.default_rng(seed)
    if epilogue == "glu" and op == "W @ x":
        op = "W @ v"  # W @ X gates its output after the product, per batch element: W @ v gates in the store
    grid = (gm, 2 * gk) if epilogue == "glu" and op == "x @ W" else (2 * gm, gk) if epilogue == "glu" else (gm, gk)
    p = _pattern(kind, rng, grid, block, density)
    W = bs.BlockSparseMatrix(p, jnp.asarray(rng.standard_normal((p.nnz_blocks, block, block)), dtype))
    dense = np.asarray(W.to_dense().astype(jnp.float32), np.float64)
    cfg = TritonConfig(stream=True, stream_split=split, stream_fma=fma)
    width = p.shape[1] if op == "x @ W" else p.shape[0]
    bias = jnp.asarray(rng.standard_normal(n if op == "W @ x" else width), jnp.float32) if epilogue else None
    kw = dict(input_glu=True if activation is None else activation, bias=bias, precision=HIGHEST, config=cfg,
              activation={"relu": "relu", "glu": "silu"}.get(epilogue), glu=epilogue == "glu")  # fmt: skip
    if op == "x @ W":
        x = jnp.asarray(rng.standard_normal((n, 2 * p.shape[0])), dtype)
        got, want = bs.matmul(x, W, **kw), _glu_dense(x, 1, activation) @ dense
    elif op == "W @ x":
        x = jnp.asarray(rng.standard_normal((2 * p.shape[1], n)), dtype)
        got, want = bs.matmul(W, x, **kw), dense @ _glu_dense(x, 0, activation)
    else:
        x = jnp.asarray(rng.standard_normal(2 * p.shape[1]), dtype)
        got, want = bs.matmul(W, x, **kw), dense @ _glu_dense(x, 0, activation)
    if epilogue == "relu":
        want = np.maximum(want + np.asarray(bias, np.float64), 0.0)
    elif epilogue == "glu":
        want = _gated_dense(want + np.asarray(bias, np.float64), "silu")
    assert got.dtype == jnp.dtype(dtype)
    assert relative_error(got.astype(jnp.float32), want) <= TOL[jnp.dtype(dtype)]


@pytest.mark.skipif(ON_GPU, reason="the GPU runs the kernels for real")
def test_gated_input_is_one_launch():
    # SwiGLU's down projection of a decode step reads the gate/up product's output: one launch, no gate before it.
    W = bs.random(jax.random.key(0), (1024, 512), 32, 1 / 4, dtype=jnp.bfloat16)
    txt = _lower_for_cuda(lambda W, y: bs.matmul(y, W, input_glu="silu", config=TritonConfig(stream=True)), W,
                          jnp.ones((1, 2048), jnp.bfloat16))  # fmt: skip
    assert txt.count("__gpu$xla.gpu.triton") == 1 and re.search(r"bs_dds_stream_\w*_gated_x", txt)
    assert "stablehlo.multiply" not in txt and "stablehlo.slice" not in txt
    # Where the kernel does not gate (more tokens than it takes), the gate runs in XLA before the product.
    txt = _lower_for_cuda(lambda W, y: bs.matmul(y, W, input_glu="silu"), W, jnp.ones((256, 2048), jnp.bfloat16))
    assert "_gated_x" not in txt and "stablehlo.multiply" in txt
    with pytest.raises(ValueError, match=r"x's contracted dimension 2048 .*gated input.*Got 1024"):
        stream.dds(jnp.ones((1, 1024), jnp.bfloat16), W.pattern, W.data, jnp.bfloat16,
                   gate=InputGate("silu"))  # fmt: skip


def test_plan_spreads_the_decode_shapes_over_every_sm():
    with hardware.fake(hardware.H200):
        t = tuned.current()
        sms = hardware.gpu().num_sms
        for shape in ((4096, 14336), (14336, 4096)):
            for b in (16, 32, 64, 128):
                p = bs.BlockPattern.random(0, shape, b, 1 / 8)
                for op in ("dds", "dsd"):
                    pl_ = stream.plan(op, p, 1)
                    assert pl_.tile >= t.TRITON_STREAM_MIN_TILE or pl_.tile == b
                    units = p.grid[1] if op == "dds" else p.grid[0]
                    assert pl_.programs == units * b // pl_.tile
                    assert pl_.programs >= min(sms, units * b // t.TRITON_STREAM_MIN_TILE)
                    assert pl_.rows == (1 if pl_.fma else 16) and 1 <= pl_.group <= t.TRITON_STREAM_GROUP
                    assert pl_.fma == bool(t.TRITON_STREAM_FMA)
                    assert pl_.num_warps == t.TRITON_STREAM_WARPS[b]
                    step = pl_.tile * b * 2 + 16 * b * 2  # bf16
                    assert pl_.group * pl_.num_stages * step <= stream.SMEM_SHARE * hardware.H200.smem_per_block
        p = bs.BlockPattern.random(0, (4096, 4096), 64, 1 / 8)
        assert stream.plan("dds", p, 40, TritonConfig(tn=16, stream_group=2)) == stream.StreamPlan(
            tile=16, group=2, rows=64, programs=64 * 4, split=1, num_warps=t.TRITON_STREAM_WARPS[64],
            num_stages=t.TRITON_STREAM_STAGES[64])  # fmt: skip


def test_plan_splits_long_walks_of_few_output_blocks():
    # x (1, 8192) @ W (8192, 2048), b = 64: 32 block columns, 64 sub-tiles of 32 at most, 16 blocks each at d = 1/8.
    with hardware.fake(hardware.H200):
        t = tuned.current()
        sms = hardware.gpu().num_sms
        p = bs.BlockPattern.random(0, (8192, 2048), 64, 1 / 8)
        pl_ = stream.plan("dds", p, 1)
        mean = p.nnz_blocks / p.grid[1]
        assert pl_.tile == t.TRITON_STREAM_MIN_TILE and pl_.programs == 64
        # as many parts as make up the SMs, each of at least the tuned blocks (on the H200: none, measured slower)
        assert pl_.split == max(1, min(-(-sms // 64), int(mean // t.TRITON_STREAM_SPLIT_MIN_BLOCKS)))
        assert stream.plan("dds", p, 1, TritonConfig(stream_split=1)).split == 1
        assert stream.plan("dds", p, 1, TritonConfig(stream_split=5)).split == 5
        # enough output blocks for every SM: no split
        assert stream.plan("dds", bs.BlockPattern.random(0, (2048, 8192), 64, 1 / 8), 1).split == 1
        # walks too short to be worth cutting: no split
        assert stream.plan("dsd", bs.BlockPattern.random(0, (512, 512), 64, 1 / 8), 1).split == 1
    with pytest.raises(ValueError, match="stream_split >= 1"):
        TritonConfig(stream_split=0)


def test_takes_few_tokens_where_it_measured_faster_unless_the_config_says():
    most = tuned.H200.TRITON_STREAM_MAX_N
    with hardware.fake(hardware.H200):
        p = bs.BlockPattern.random(0, (4096, 4096), 32, 1 / 8)
        assert stream.takes("dds", 1, p, None) and stream.takes("dds", most, p, None)
        assert not stream.takes("dds", most + 1, p, None) and not stream.takes("dds", 0, p, None)
        long_rows = bs.BlockPattern.random(0, (4096, 14336), 32, 1 / 8)  # W @ x walks 56 blocks a row
        assert stream.takes("dds", 1, long_rows.T, None) and not stream.takes("dsd", 1, long_rows, None)
        assert not stream.takes("dds", 1, p, TritonConfig(stream=False))
        assert stream.takes("dsd", 4096, long_rows, TritonConfig(stream=True))
        assert not stream.takes("dds", 1, bs.BlockPattern.from_mask(np.zeros((8, 8), bool), 32), None)
        assert not stream.takes("dds", 1, bs.BlockPattern.random(0, (4096, 4096), (32, 64), 1 / 8), None)
    with hardware.fake(hardware.Device("an unmeasured GPU", num_sms=100, smem_per_block=100_000)):
        assert not stream.takes("dds", 1, p, None)  # no measured cell: the work list
    with pytest.raises(ValueError, match="stream_group >= 1"):
        TritonConfig(stream_group=0)


@pytest.mark.skipif(ON_GPU, reason="the GPU runs the kernels for real")
@pytest.mark.parametrize("split", [None, 4])
@pytest.mark.parametrize("op", ["x @ W", "W @ x"])
def test_one_launch_per_product(op, split):
    # The decode product is the stream kernel alone: no pad of x, no combine kernel, no slice; split or not.
    W = bs.random(jax.random.key(0), (1024, 512), 32, 1 / 4, dtype=jnp.bfloat16)
    cfg = TritonConfig(stream=True, stream_split=split)

    def f(W, x):
        return bs.matmul(x, W, config=cfg) if op == "x @ W" else bs.matmul(W.T, x, config=cfg)

    x = jnp.ones((5, 1024) if op == "x @ W" else (1024, 5), jnp.bfloat16)
    txt = _lower_for_cuda(f, W, x)
    names = set(re.findall(r'/(bs_\w+)/pallas_call"', txt))  # the kernel's name (the text also holds its bytecode)
    assert txt.count("__gpu$xla.gpu.triton") == 1 and len(names) == 1
    assert all("_stream_" in n and n.endswith("_s4") == (split == 4) for n in names), names
    assert "stablehlo.pad" not in txt and "stablehlo.slice" not in txt


@pytest.mark.skipif(ON_GPU, reason="the GPU runs the kernels for real")
@pytest.mark.parametrize("split", [None, 2])
def test_one_token_on_the_cuda_cores_is_one_launch_of_every_kind(split):
    # stream_fma: one token multiplied elementwise (no dot, no padding to 16 rows), plain, gated in the store or in
    # the load, both orientations; more tokens keep the dot.
    W = bs.random(jax.random.key(0), (1024, 512), 32, 1 / 4, dtype=jnp.bfloat16)
    cfg = TritonConfig(stream=True, stream_fma=True, stream_split=split)
    one, two = jnp.ones((1, 1024), jnp.bfloat16), jnp.ones((1, 2048), jnp.bfloat16)
    cases = {
        "dds": (lambda W, x: bs.matmul(x, W, config=cfg), one),
        "dsd": (lambda W, x: bs.matmul(W, x, config=cfg), jnp.ones((512, 1), jnp.bfloat16)),
        "dds_\\w*glu": (lambda W, x: bs.matmul(x, W, activation="silu", glu=True, config=cfg), one),
        "dds_\\w*gated_x": (lambda W, x: bs.matmul(x, W, input_glu="silu", config=cfg), two),
        "dsd_\\w*gated_x": (lambda W, x: bs.matmul(W, x, input_glu="silu", config=cfg), one.T),
    }  # fmt: skip
    for name, (f, x) in cases.items():
        txt = _lower_for_cuda(f, W, x)
        assert txt.count("__gpu$xla.gpu.triton") == 1 and re.search(rf"bs_{name}\w*_fma", txt), name
    with hardware.fake(hardware.H200):
        assert stream.plan("dds", W.pattern, 1, cfg) == dataclasses.replace(stream.plan("dds", W.pattern, 2, cfg),
                                                                            rows=1, fma=True)  # fmt: skip
        assert not stream.plan("dds", W.pattern, 2, cfg).fma
        assert not stream.plan("dds", W.pattern, 1, TritonConfig(stream_fma=False)).fma


@pytest.mark.gpu
@pytest.mark.parametrize("split", [2, 7])
@pytest.mark.parametrize("op", ["x @ W", "W @ x"])
def test_split_walks_on_the_gpu(op, split):
    # Parts of one sub-tile on different SMs, summed by the last: the same product, every run (deterministic).
    W = bs.random(jax.random.key(3), (8192, 1024) if op == "x @ W" else (1024, 8192), 64, 1 / 8, dtype=jnp.bfloat16)
    cfg = TritonConfig(stream=True, stream_split=split)
    if op == "x @ W":
        x = jax.random.normal(jax.random.key(1), (3, 8192)).astype(jnp.bfloat16)
        f = jax.jit(lambda x: bs.matmul(x, W, config=cfg))
        want = x.astype(jnp.float32) @ W.to_dense().astype(jnp.float32)
    else:
        x = jax.random.normal(jax.random.key(1), (8192, 3)).astype(jnp.bfloat16)
        f = jax.jit(lambda x: bs.matmul(W, x, config=cfg))
        want = W.to_dense().astype(jnp.float32) @ x.astype(jnp.float32)
    runs = [np.asarray(f(x).astype(jnp.float32)) for _ in range(20)]
    assert relative_error(runs[0], want) <= TOL[jnp.dtype(jnp.bfloat16)]
    assert all((r == runs[0]).all() for r in runs)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 8, 32])
def test_gated_decode_shapes_on_the_gpu(n):
    # The 1B-class decoder's fused gate and up projections (2048 x 16384, b = 64, d = 1/8) gated in the store,
    # against the float32 product gated after; the split plan and 1 to 32 tokens.
    W = bs.random(jax.random.key(n), (2048, 16384), 64, 1 / 8, dtype=jnp.bfloat16)
    x = jax.random.normal(jax.random.key(1), (n, 2048)).astype(jnp.bfloat16)
    bias = jax.random.normal(jax.random.key(2), (16384,)).astype(jnp.bfloat16)
    z = x.astype(jnp.float32) @ W.to_dense().astype(jnp.float32) + bias.astype(jnp.float32)
    want = _gated_dense(z, "silu")
    for cfg in (None, TritonConfig(stream=True, stream_split=3)):
        with bs.dispatch_log() as log:
            got = jax.jit(lambda x, cfg=cfg: bs.matmul(x, W, bias=bias, activation="silu", glu=True, config=cfg))(x)
        assert log == [("dds+epilogue", "pallas")]
        assert relative_error(got.astype(jnp.float32), want) <= TOL[jnp.dtype(jnp.bfloat16)]


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 8, 32])
def test_gated_input_decode_shapes_on_the_gpu(n):
    # The 1B-class decoder's down projection (8192 x 2048, b = 64, d = 1/8) on the gate/up product's output, gated
    # as it loads it, against the float32 product of the gated operand; the split plan and 1 to 32 tokens.
    W = bs.random(jax.random.key(n), (8192, 2048), 64, 1 / 8, dtype=jnp.bfloat16)
    y = jax.random.normal(jax.random.key(1), (n, 16384)).astype(jnp.bfloat16)
    want = _glu_dense(y, 1, "silu") @ np.asarray(W.to_dense().astype(jnp.float32), np.float64)
    for cfg in (None, TritonConfig(stream=True, stream_split=3)):
        with bs.dispatch_log() as log:
            got = jax.jit(lambda y, cfg=cfg: bs.matmul(y, W, input_glu="silu", config=cfg))(y)
        assert log == [("dds+input_glu", "pallas")]
        assert relative_error(got.astype(jnp.float32), want) <= TOL[jnp.dtype(jnp.bfloat16)]


@pytest.mark.gpu
@pytest.mark.parametrize("b", [16, 32, 64, 128])
@pytest.mark.parametrize("op", ["x @ W", "W @ x"])
def test_decode_shapes_on_the_gpu(op, b):
    # The decode suite's shapes at n = 1 and 64, bf16 and fp16, default plan, against the float32 product.
    for n, dtype in ((1, jnp.bfloat16), (64, jnp.float16)):
        W = bs.random(jax.random.key(b), (4096, 1024), b, 1 / 8, dtype=dtype)
        if op == "x @ W":
            x = jax.random.normal(jax.random.key(1), (n, 4096)).astype(dtype)
            got, want = bs.matmul(x, W), x.astype(jnp.float32) @ W.to_dense().astype(jnp.float32)
        else:
            x = jax.random.normal(jax.random.key(1), (1024, n)).astype(dtype)
            got, want = bs.matmul(W, x), W.to_dense().astype(jnp.float32) @ x.astype(jnp.float32)
        assert relative_error(got.astype(jnp.float32), want) <= TOL[jnp.dtype(dtype)]
