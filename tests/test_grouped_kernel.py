"""The grouped kernel (``triton/grouped_kernel.py``): ``W @ x`` and ``x @ W`` on the grouped plan, opt-in.

CPU (CI): its logic in Pallas' interpreter against the dense product (blocks of 16 and 32, square and not,
float32 and bfloat16, empty and full patterns, adversarial ones, power-law ones, both grouping methods and every
unit size, ``g = 1`` included; 1, 2 and 4 slabs per loop step, on units whose slab count is not a multiple of it,
empty units, a unit of one full row and one of a single block column; ``W`` gathered in the kernel or read from its
packed copy), the fused epilogue against the XLA
reference, gradients through ``bs.matmul``, the dispatch (only ``TritonConfig(grouped=True)`` runs it, the stream
kernel keeps priority, a plan that does not group keeps the work list), the default slabs per step, its errors, and
its Triton lowering (one launch; per loop step, the stacked operand one masked gather load, ``x``'s slab or slabs
one load, and one dot, at one slab per step and at the default). An output row the kernel never wrote would read
NaN in the interpreter: every comparison also checks that every value is finite.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import has_gpu
from helpers import check_product_and_gradients, examples, relative_error, sweep
from hypothesis import given, settings
from hypothesis import strategies as st
from test_gnn_pallas import _lower_for_cuda

import blocksparse as bs
from blocksparse.ops.matmul import epilogue as _epilogue
from blocksparse.ops.matmul.epilogue import Epilogue
from blocksparse.ops.matmul.grouped import Grouping, group
from blocksparse.ops.matmul.triton import TritonConfig, grouped_kernel

ON_GPU = has_gpu()
TOL = {jnp.dtype(jnp.float32): 2e-5, jnp.dtype(jnp.bfloat16): 2e-2}
HIGHEST = jax.lax.Precision.HIGHEST
KINDS = ("random", "power_law", "empty", "full", "one_full_row", "empty_rows", "one_col")

pytestmark = pytest.mark.usefixtures("kernels_here")


def _pattern(kind: str, rng, grid, block, density: float = 0.3) -> bs.BlockPattern:
    gm, gk = grid
    bh, bw = (block, block) if isinstance(block, int) else block
    shape = (gm * bh, gk * bw)
    if kind == "random":
        return bs.BlockPattern.random(rng, shape, (bh, bw), density)
    if kind == "power_law":
        return bs.BlockPattern.power_law(int(rng.integers(2**16)), shape, (bh, bw), density)
    mask = np.zeros(grid, bool)
    if kind == "full":
        mask[:] = True
    elif kind == "one_full_row":
        mask[rng.integers(gm), :] = True
    elif kind == "empty_rows":  # every other block row empty, the rest random
        mask = rng.random(grid) < 0.6
        mask[::2] = False
    elif kind == "one_col":  # a single block column holds every block
        mask[:, rng.integers(gk)] = True
    elif kind != "empty":
        raise ValueError(f"unknown pattern kind {kind!r}")
    return bs.BlockPattern.from_mask(mask, (bh, bw))


def _operands(rng, p: bs.BlockPattern, op: str, n: int, dtype):
    """``(data, x, dense W in float32)`` of the product ``op`` with a dense operand of ``n`` columns / rows."""
    data = jnp.asarray(rng.standard_normal((p.nnz_blocks, *p.block_size)), dtype)
    shape = (p.shape[1], n) if op == "dsd" else (n, p.shape[0])
    x = jnp.asarray(rng.standard_normal(shape), dtype)
    return data, x, bs.BlockSparseMatrix(p, data).to_dense().astype(jnp.float32)


def _run(op: str, p, data, x, dtype, grouping=None, config=None, epi=None, bias=None, slabs=None):
    prec = dict(exact=True, config=config, epi=epi, bias=bias, grouping=grouping, slabs=slabs)
    if op == "dsd":
        return grouped_kernel.dsd(p, data, x, dtype, **prec)
    return grouped_kernel.dds(x, p, data, dtype, **prec)


def _dense(op: str, w, x):
    x = x.astype(jnp.float32)
    with jax.default_matmul_precision("highest"):
        return w @ x if op == "dsd" else x @ w


def _check(op, p, dtype, rng, n, grouping=None, config=None, slabs=None) -> float:
    data, x, w = _operands(rng, p, op, n, dtype)
    got = _run(op, p, data, x, dtype, grouping, config, slabs=slabs)
    assert got.dtype == jnp.dtype(dtype)
    err = relative_error(got.astype(jnp.float32), _dense(op, w, x))
    assert err <= TOL[jnp.dtype(dtype)], err
    return err


def _kernels(fn, *args) -> list[str]:
    """The names of the Pallas kernels ``fn`` launches (from its jaxpr)."""
    return sorted(set(re.findall(r"bs_\w+", str(jax.make_jaxpr(fn)(*args)))))


# ------------------------------------------------------------------------------------------------ the product
@settings(max_examples=examples(32), deadline=None)
@given(
    kind=st.sampled_from(KINDS),
    op=st.sampled_from(["dsd", "dds"]),
    block=st.sampled_from([16, 32, (16, 32), (32, 16)]),
    gm=st.integers(1, 9),
    gk=st.integers(1, 5),
    n=st.sampled_from([1, 16, 40, 130]),
    density=st.sampled_from([0.2, 0.5, 1.0]),
    heights=st.sampled_from([(64, 128), (64,), (128,), (32,)]),
    methods=st.sampled_from([("contiguous", "greedy"), ("contiguous",), ("greedy",)]),
    tile=st.sampled_from([None, 16, 64]),
    slabs=st.sampled_from([1, 2, 4]),
    packed=st.booleans(),
    dtype=st.sampled_from([jnp.float32, jnp.bfloat16]),
    seed=st.integers(0, 2**16),
)
def test_grouped_matches_the_dense_product(kind, op, block, gm, gk, n, density, heights, methods, tile, slabs, packed,
                                           dtype, seed):  # fmt: skip
    rng = np.random.default_rng(seed)
    p = _pattern(kind, rng, (gm, gk), block, density)
    cfg = TritonConfig(tn=tile, tb=tile, grouped_slabs=slabs, grouped_packed=packed)  # both through the config
    o = Grouping(op=op, n=n, tn=tile or 128, heights=heights, methods=methods)
    plan = group(p, o)
    assert plan.method in (*methods, "ungrouped")
    _check(op, p, dtype, rng, n, grouping=o, config=cfg)


@sweep("kind", KINDS, quick=["empty", "full", "power_law"])
def test_adversarial_patterns(kind):
    """Each kind for both products, at both block sizes and dtypes (rotated so each kind runs quickly). The quick run
    keeps ``empty``, ``full`` and ``power_law``: :func:`test_slabs_per_step_on_edge_units` has a unit with one full
    row, one with one block column and an empty one, the hypothesis sweep draws the rest."""
    rng = np.random.default_rng(KINDS.index(kind))
    b = (16, 32)[KINDS.index(kind) % 2]
    dtype = (jnp.float32, jnp.bfloat16)[KINDS.index(kind) // 2 % 2]
    for op in ("dsd", "dds"):
        p = _pattern(kind, rng, (8, 6), b, 0.3)
        plan = grouped_kernel.plan(op, p, 48, dtype=dtype)
        # Units of rows (dds: columns of W) that share all their columns (rows): grouped.
        if kind == "full" or (kind, op) in (("one_col", "dsd"), ("one_full_row", "dds")):
            assert plan.group > 1, plan
        _check(op, p, dtype, rng, 48)


@sweep("op, b, kind", [(op, b, kind) for kind in KINDS for b in (16, 32) for op in ("dsd", "dds")], quick=0)
def test_every_pattern_op_and_block(op, b, kind):
    """The cross product of :func:`test_adversarial_patterns` (``make test-slow``), float32 at b = 16 and bfloat16 at
    b = 32."""
    rng = np.random.default_rng(7)
    _check(op, _pattern(kind, rng, (12, 7), b, 0.3), jnp.float32 if b == 16 else jnp.bfloat16, rng, 72)


@sweep("method, op", [(m, op) for m in ("contiguous", "greedy") for op in ("dsd", "dds")],
       quick=[("contiguous", "dds"), ("greedy", "dsd")])  # fmt: skip
def test_each_grouping_method(method, op):
    """Each method alone, on a pattern it groups: the kernel follows the plan's units and row order (the quick run:
    each method once, each product once)."""
    rng = np.random.default_rng(3)
    b = 16
    if method == "contiguous":  # consecutive rows that share their columns
        p = _pattern("full", rng, (8, 3), b)
    else:  # a power-law pattern: its long rows share columns, greedily gathered
        p = _pattern("power_law", rng, (16, 8), b, 0.4)
    o = Grouping(op=op, n=40, methods=(method,), heights=(64,))
    plan = group(p, o)
    assert (plan.method, plan.group) == (method, 4), plan
    if method == "greedy":  # the rows really are permuted: the output rows come back in order all the same
        assert plan.row_order.tolist() != sorted(plan.row_order.tolist())
    _check(op, p, jnp.float32, rng, 40, grouping=o)


@sweep("op", ["dsd", "dds"], quick=["dsd"])
def test_ungrouped_plan_runs_with_one_row_per_unit(op):
    """``g = 1`` (blocks of 32 at 32-row tiles: no grouping fits): the kernel still runs the plan (``x @ W`` in the
    slow run; the hypothesis sweep's 32-row tiles reach ``g = 1`` for both)."""
    rng = np.random.default_rng(4)
    p = _pattern("random", rng, (5, 4), 32, 0.5)
    o = Grouping(op=op, n=24, heights=(32,))
    assert group(p, o).group == 1
    _check(op, p, jnp.bfloat16, rng, 24, grouping=o)


# ------------------------------------------------------------------------------------------------ slabs per step
#: Units of consecutive block rows (``g`` rows each), their slabs (distinct block columns) in a 7-column pattern:
#: an empty unit, one full row (7 slabs), one block column in every row (1), rows meeting in part (4: a multiple of
#: 2 and 4, slots missing columns) and 3 slabs (a tail at 2 and at 4).
EDGE_UNITS = (
    [()],
    [tuple(range(7))],
    [(3,), (3,), (3,), (3,)],
    [(0, 1), (1, 2, 5), (), (5,)],
    [(0, 2), (4,), (), (2,)],
)
EDGE_SLABS = [0, 7, 1, 4, 3]
SLAB_CASES = [(op, k, b, dt) for op in ("dsd", "dds") for k in (1, 2, 4) for b in (16, 32) for dt in ("f32", "bf16")]
SLAB_QUICK = [("dsd", 1, 16, "f32"), ("dsd", 2, 32, "bf16"), ("dsd", 4, 16, "bf16"), ("dds", 1, 32, "bf16"),
              ("dds", 2, 16, "f32"), ("dds", 4, 32, "f32")]  # fmt: skip


def _edge_pattern(g: int, b: int, op: str) -> bs.BlockPattern:
    """:data:`EDGE_UNITS` as a pattern of ``5 g`` block rows (``dds``: its transpose, units of block columns)."""
    mask = np.zeros((5 * g, 7), bool)
    for u, rows in enumerate(EDGE_UNITS):
        for r, cols in enumerate(rows[:g]):
            mask[u * g + r, list(cols)] = True
    return bs.BlockPattern.from_mask(mask if op == "dsd" else mask.T, (b, b))


@sweep("op, slabs, b, dtype", SLAB_CASES, quick=SLAB_QUICK)
def test_slabs_per_step_on_edge_units(op, slabs, b, dtype):
    """``slabs`` slabs per loop step on units of 0, 7, 1, 4 and 3 slabs: a tail masked in the last step wherever the
    count is not a multiple of ``slabs``, an empty unit writing zeros (every output row checked), one full row,
    one block column. The quick run covers each ``slabs`` with both products, both blocks and both dtypes."""
    g = 64 // b
    p = _edge_pattern(g, b, op)
    o = Grouping(op=op, n=40, methods=("contiguous",), heights=(64,))
    plan = group(p, o)
    assert (plan.group, np.diff(plan.unit_start).tolist()) == (g, EDGE_SLABS), plan
    rng = np.random.default_rng(slabs * b)
    _check(op, p, jnp.float32 if dtype == "f32" else jnp.bfloat16, rng, 40, grouping=o, slabs=slabs)


@sweep("op, slabs, b", [(op, k, b) for op in ("dsd", "dds") for k in (1, 2, 4) for b in (16, 32)],
       quick=[("dsd", 2, 16), ("dds", 4, 32)])  # fmt: skip
def test_packed_operand_on_edge_units(op, slabs, b):
    """``W`` read from its packed copy (one contiguous tile a step) on the same units: the tails masked, the next
    unit's slabs never read into this one's, an empty unit writing zeros, the last unit's step inside the array."""
    g = 64 // b
    p = _edge_pattern(g, b, op)
    o = Grouping(op=op, n=40, methods=("contiguous",), heights=(64,))
    rng = np.random.default_rng(slabs + b)
    data, x, w = _operands(rng, p, op, 40, jnp.float32)
    got = _run(op, p, data, x, jnp.float32, o, TritonConfig(grouped_packed=True), slabs=slabs)
    assert relative_error(got, _dense(op, w, x)) <= TOL[jnp.dtype(jnp.float32)]
    plan = group(p, o)
    packed = grouped_kernel._pack(op, plan, data, slabs)
    slab_side = b * (plan.slabs + slabs)
    assert packed.shape == ((g * b, slab_side) if op == "dsd" else (slab_side, g * b))


def test_default_slabs_per_step():
    """A 64-deep dot per step by default (the contracted block side: ``bw`` for ``W @ x``, ``bh`` for ``x @ W``);
    the config's ``grouped_slabs``, then the call's ``slabs``, override it; the kernel's name says which ran."""
    per_step = grouped_kernel.slabs_per_step
    assert [per_step("dsd", (b, b)) for b in (16, 32, 64, 128)] == [4, 2, 1, 1]
    assert (per_step("dsd", (16, 32)), per_step("dds", (16, 32))) == (2, 4)
    assert per_step("dsd", (16, 16), TritonConfig(grouped_slabs=1)) == 1
    assert per_step("dds", (16, 16), TritonConfig(grouped_slabs=1), slabs=8) == 8
    p = _pattern("full", np.random.default_rng(0), (8, 4), 16)
    data, x = jnp.ones((p.nnz_blocks, 16, 16)), jnp.ones((64, 24))
    for cfg, want in ((None, "s4"), (TritonConfig(grouped_slabs=2), "s2")):
        names = _kernels(lambda d, x, cfg=cfg: grouped_kernel.dsd(p, d, x, jnp.float32, config=cfg), data, x)
        assert names == [f"bs_dsd_grouped_16x16_g8_{want}_tn32"], names


# ------------------------------------------------------------------------------------------------ epilogue
@sweep("op, axis, activation", [("dsd", 1, "gelu"), ("dsd", 0, "silu"), ("dds", 1, "relu"), ("dds", 1, None)],
       quick=[("dsd", 0, "silu"), ("dds", 1, "relu")])  # fmt: skip
def test_fused_epilogue_matches_the_reference(op, axis, activation):
    rng = np.random.default_rng(5)
    p = _pattern("empty_rows", rng, (8, 4), 16)  # empty rows: zero products get the bias and the activation too
    n = 40
    data, x, w = _operands(rng, p, op, n, jnp.float32)
    length = (n if axis == 1 else p.shape[0]) if op == "dsd" else p.shape[1]
    bias = jnp.asarray(rng.standard_normal(length), jnp.float32)
    epi = Epilogue(activation, True, axis)
    got = _run(op, p, data, x, jnp.bfloat16, epi=epi, bias=bias)
    assert got.dtype == jnp.bfloat16
    want = _epilogue.reference(_dense(op, w, x), bias, epi, jnp.float32)
    assert relative_error(got.astype(jnp.float32), want) <= TOL[jnp.dtype(jnp.bfloat16)]


def test_empty_pattern_is_the_epilogue_of_zero():
    rng = np.random.default_rng(6)
    p = _pattern("empty", rng, (4, 3), 16)
    data, x, _ = _operands(rng, p, "dsd", 24, jnp.float32)
    bias = jnp.asarray(rng.standard_normal(24), jnp.float32)
    got = _run("dsd", p, data, x, jnp.float32, epi=Epilogue("relu", True, 1), bias=bias)
    np.testing.assert_allclose(np.asarray(got), np.broadcast_to(np.maximum(np.asarray(bias), 0), (64, 24)))


# ------------------------------------------------------------------------------------------------ through bs.matmul
@sweep("op", ["W @ x", "x @ W"], quick=["x @ W"])  # W @ x: make test-slow (its kernel: the sweeps above)
def test_matmul_with_grouped_config_and_gradients_match_dense(op):
    rng = np.random.default_rng(8)
    p = _pattern("power_law", rng, (8, 6), 16, 0.4)
    W = bs.BlockSparseMatrix(p, jnp.asarray(rng.standard_normal((p.nnz_blocks, 16, 16)), jnp.float32))
    n = 72  # above the stream kernel's tokens: the grouped kernel runs
    cfg = TritonConfig(grouped=True)
    out = 96 if op == "x @ W" else n
    bias = jnp.asarray(rng.standard_normal(out), jnp.float32)

    def sparse(W, x):
        a, b = (W, x) if op == "W @ x" else (x, W)
        return bs.matmul(a, b, bias=bias, activation="gelu_tanh", implementation="pallas", precision=HIGHEST,
                         config=cfg)  # fmt: skip

    def ref(w, x):
        return jax.nn.gelu((w @ x if op == "W @ x" else x @ w) + bias)

    x = jnp.asarray(rng.standard_normal((96, n) if op == "W @ x" else (n, 128)), jnp.float32)
    product = "dsd" if op == "W @ x" else "dds"
    assert any(k.startswith(f"bs_{product}_grouped_16x16_g") for k in _kernels(sparse, W, x)), _kernels(sparse, W, x)
    check_product_and_gradients(sparse, ref, W, x)


def test_dispatch_runs_grouped_only_when_asked():
    W = bs.random(jax.random.key(0), (256, 128), 16, 0.25)
    x, xt = jnp.ones((128, 96)), jnp.ones((96, 256))
    few = jnp.ones((128, 4))

    def names(cfg, a, b):
        return _kernels(lambda a, b: bs.matmul(a, b, implementation="pallas", config=cfg), a, b)

    assert any("_grouped_" in k for k in names(TritonConfig(grouped=True), W, x))
    assert any("_grouped_" in k for k in names(TritonConfig(grouped=True), xt, W))
    for cfg in (None, TritonConfig(), TritonConfig(grouped=False)):  # the default dispatch is unchanged
        assert not any("_grouped_" in k for k in names(cfg, W, x) + names(cfg, xt, W))
    # The stream kernel keeps priority where it runs (few tokens).
    assert any("_stream_" in k for k in names(TritonConfig(grouped=True, stream=True), W, few))
    # A plan that does not group (blocks of 128: no tile of 64 or 128 rows holds two) keeps the work list.
    W128 = bs.random(jax.random.key(1), (256, 256), 128, 0.5)
    assert grouped_kernel.plan("dsd", W128.pattern, 96).group == 1
    got = names(TritonConfig(grouped=True), W128, jnp.ones((256, 96)))
    assert not any("_grouped_" in k for k in got) and any(k.startswith("bs_dsd_128x128") for k in got), got


# ------------------------------------------------------------------------------------------------ errors
def test_invalid_inputs_name_expected_and_actual():
    rng = np.random.default_rng(9)
    p = _pattern("random", rng, (4, 3), 16, 0.5)
    data, x, _ = _operands(rng, p, "dsd", 16, jnp.float32)
    with pytest.raises(ValueError, match=r"Expected grouped None, True or False\. Got 'yes'"):
        TritonConfig(grouped="yes")
    with pytest.raises(ValueError, match=r"contracted dimension 48 .* Got 40"):
        grouped_kernel.dsd(p, data, jnp.ones((40, 16)), jnp.float32)
    with pytest.raises(ValueError, match=r"contracted dimension 64 .* Got 48"):
        grouped_kernel.dds(jnp.ones((16, 48)), p, data, jnp.float32)
    with pytest.raises(ValueError, match=r"Expected data of shape \(\d+, 16, 16\)"):
        grouped_kernel.dsd(p, data[:, :8], x, jnp.float32)
    with pytest.raises(ValueError, match=r"Expected a Grouping of op 'dsd' for dsd\. Got op 'dds'"):
        grouped_kernel.dsd(p, data, x, jnp.float32, grouping=Grouping(op="dds"))
    with pytest.raises(ValueError, match=r"without a gate \(glu\)"):
        grouped_kernel.dsd(p, data, x, jnp.float32, epi=Epilogue("silu", False, 1, True))
    with pytest.raises(ValueError, match=r"TritonConfig\.tn a power of two >= 16 .* Got 24"):
        grouped_kernel.dsd(p, data, x, jnp.float32, config=TritonConfig(tn=24))
    with pytest.raises(ValueError, match=r"Expected grouped_packed None, True or False\. Got 1"):
        TritonConfig(grouped_packed=1)
    for bad in (0, 3, True, 2.0):
        with pytest.raises(ValueError, match=rf"Expected grouped_slabs None or a power of two >= 1\. Got {bad!r}"):
            TritonConfig(grouped_slabs=bad)
    with pytest.raises(ValueError, match=r"Expected slabs a power of two >= 1 \(slabs per loop step\)\. Got 6"):
        grouped_kernel.dsd(p, data, x, jnp.float32, slabs=6)
    with pytest.raises(ValueError, match=r"Expected slabs a power of two >= 1 \(slabs per loop step\)\. Got 0"):
        grouped_kernel.dds(jnp.ones((16, 64)), p, data, jnp.float32, slabs=0)
    with pytest.raises(ValueError, match=r"Expected op 'dsd' or 'dds'\. Got 'sdd'"):
        grouped_kernel.slabs_per_step("sdd", (16, 16))


# ------------------------------------------------------------------------------------------------ Triton lowering
@pytest.mark.skipif(ON_GPU, reason="the GPU runs the kernels for real")
@pytest.mark.parametrize("op", ["dsd", "dds"])
@pytest.mark.parametrize("b", [16, 32])
@pytest.mark.parametrize("slabs, packed", [(1, False), (None, False), (None, True), (1, True)])
def test_lowers_to_one_triton_kernel_stacking_the_unit(op, b, slabs, packed, monkeypatch, capsys):
    """The real (not interpreted) kernel through Pallas' Triton lowering: one launch per product; in the loop, per
    step, the unit's blocks loaded as one ``g b``-row (``dds``: column) masked gather, ``x`` in one load, and one dot
    of the stacked operand (its Triton IR, printed by the lowering with ``debug=True``). At one slab per step the
    dot's contracted side is ``b``; at the default, ``k = 64 / b`` slabs make it 64: the gather a 4-D load
    ``(g, b, k, b)`` (``dds``: ``(k, b, g, b)``) reshaped to the operand, ``x``'s ``k`` slabs one masked load.
    Packed (``grouped_packed``), the unit's blocks are one masked 2-D load of the operand's shape, no gather."""
    from jax.experimental import pallas as pl

    from blocksparse.ops.matmul.triton import common

    p = bs.BlockPattern.power_law(0, (512, 512), (b, b), 1 / 4)
    g = grouped_kernel.plan(op, p, 256).group
    k = grouped_kernel.slabs_per_step(op, (b, b), slabs=slabs)
    assert g * b == 128 and k * b == (b if slabs == 1 else 64)
    data = jnp.ones((p.nnz_blocks, b, b), jnp.bfloat16)
    x = jnp.ones((512, 256), jnp.bfloat16)
    bias = jnp.ones(512, jnp.float32)
    names, real = [], pl.pallas_call

    def recording(kernel, **kwargs):
        names.append(kwargs["name"])
        return real(kernel, **{**kwargs, "debug": True})

    monkeypatch.setattr(common.pl, "pallas_call", recording)
    epi = Epilogue("gelu", True, 0) if op == "dsd" else Epilogue("silu", True, 1)
    if op == "dsd":
        fn = lambda d, x: grouped_kernel.dsd(p, d, x, jnp.bfloat16, epi=epi, bias=bias, slabs=slabs,  # noqa: E731
                                             packed=packed)  # fmt: skip
        gather = f"128x{b}" if k == 1 else f"{g}x{b}x{k}x{b}"
    else:
        fn = lambda d, x: grouped_kernel.dds(x.T, p, d, jnp.bfloat16, epi=epi, bias=bias, slabs=slabs,  # noqa: E731
                                             packed=packed)  # fmt: skip
        gather = f"{b}x128" if k == 1 else f"{k}x{b}x{g}x{b}"
    depth = k * b
    txt = _lower_for_cuda(fn, data, x)
    assert txt.count("__gpu$xla.gpu.triton") == 1
    tile = f"{'tn' if op == 'dsd' else 'tb'}128" + ("_packed" if packed else "")
    assert names == [f"bs_{op}_grouped_{b}x{b}_g{g}_s{k}_{tile}_epi"]
    ir = capsys.readouterr().out
    loop = ir[ir.index("scf.for") :]
    loop = loop[: loop.index("scf.yield")]
    assert loop.count("tt.dot ") == 1
    assert re.search(rf"tt\.dot .*tensor<128x{depth}xbf16> \* tensor<{depth}x128xbf16> -> tensor<128x128xf32>", loop)
    loads = re.findall(r"tt\.load .*: tensor<([0-9x]+)x!tt\.ptr<bf16>> \"(\w+)", loop)  # (shape, kind) of W's and x's
    if op == "dsd":  # x's slabs: one row block (k = 1), else k rows blocks gathered, the tail masked
        xs = (f"{depth}x128", "get" if k == 1 else "masked_load")
    else:  # one column block (k = 1), else k column blocks as (rows, slab, column), reshaped
        xs = (f"128x{b}", "get") if k == 1 else (f"128x{k}x{b}", "masked_load")
    if packed:  # the unit's blocks: one contiguous tile of the packed operand, the slabs past the unit masked
        operand = f"128x{depth}" if op == "dsd" else f"{depth}x128"
        xs = (f"{depth}x128", "masked_load") if op == "dsd" else (f"128x{k}x{b}", "masked_load")  # k = 1 too
        assert sorted(loads) == sorted([(operand, "masked_load"), xs]), loads
        assert not re.search(rf"tt\.reshape .*-> tensor<{operand}xbf16>", loop), loop
        return
    assert sorted(loads) == sorted([(gather, "masked_load"), xs]), loads  # the unit's blocks: one gather
    if k > 1:  # the 4-D gather reshaped into the dot's stacked operand
        operand = f"128x{depth}" if op == "dsd" else f"{depth}x128"
        assert re.search(rf"tt\.reshape .*tensor<{gather}xbf16> -> tensor<{operand}xbf16>", loop), loop


# ------------------------------------------------------------------------------------------------ the measured default
def _clustered(seed: int, m: int, b: int, d: int, transpose: bool) -> bs.BlockPattern:
    """The GPU check's clustered pattern (block rows sharing their columns, density ``1 / d``): the one measured."""
    return bs.BlockPattern.clustered(seed, (m, m), (b, b), 1.0 / d, axis=1 if transpose else 0)


def test_the_measured_rule_claims_small_blocks_whose_rows_share_columns():
    from blocksparse import hardware
    from blocksparse.ops.matmul import order

    clustered = {op: _clustered(0, 1024, 16, 4, op == "dds") for op in ("dsd", "dds")}
    uniform = bs.BlockPattern.random(1, (1024, 1024), (16, 16), 1 / 16)
    bf16 = jnp.bfloat16
    with hardware.fake(hardware.Device(kind="cpu", platform="cpu")):  # off a GPU the measured rule is off
        assert not grouped_kernel.claims("dds", 4096, clustered["dds"], bf16)
    with hardware.fake(hardware.H200):
        for op in ("dsd", "dds"):
            p = clustered[op]
            assert grouped_kernel.plan(op, p, 4096, grouped_kernel.CLAIMED, bf16).fill == 1.0
            assert grouped_kernel.claims(op, 4096, p, bf16) and order.default(op, p, 4096, bf16, bf16) == order.DEFAULT
            assert not grouped_kernel.claims(op, 2048, p, bf16)  # below the sizes measured
            assert not grouped_kernel.claims(op, 4096, p, jnp.float32)  # bfloat16 was measured
        assert grouped_kernel.plan("dds", uniform, 4096, grouped_kernel.CLAIMED, bf16).fill < 0.29
        assert not grouped_kernel.claims("dds", 4096, uniform, bf16)  # too little sharing: the old path
        p32 = _clustered(0, 1024, 32, 4, False)
        assert not grouped_kernel.claims("dsd", 4096, p32, bf16)  # W @ x at b = 32: slower everywhere
    with hardware.fake(hardware.Device(kind="NVIDIA A100-SXM4-80GB", compute_capability="8.0", num_sms=108)):
        assert not grouped_kernel.claims("dds", 4096, clustered["dds"], bf16)  # nobody measured it: never


def test_the_default_runs_the_claimed_kernel(monkeypatch):
    # the rule's size threshold lowered so that the interpreter runs it: the Triton backend with no config takes
    # the grouped kernel with the packed operand, and the product is the dense one
    from blocksparse import hardware
    from blocksparse.ops.matmul import tuned
    from blocksparse.ops.tuning import Entry

    monkeypatch.setitem(tuned.H200._entries, "GROUPED_PREFER_MIN", Entry(32, "test"))
    rng = np.random.default_rng(1)
    p = _clustered(1, 256, 16, 3, True)
    data, x, w = _operands(rng, p, "dds", 256, jnp.bfloat16)  # past the few-token (stream) kernel
    W = bs.BlockSparseMatrix(p, data)
    with hardware.fake(hardware.H200), bs.interpret():
        assert grouped_kernel.claims("dds", 256, p, jnp.bfloat16)
        names = _kernels(lambda x, W: bs.matmul(x, W, implementation="pallas"), x, W)
        got = bs.matmul(x, W, implementation="pallas")
    assert any(n.startswith("bs_dds_grouped_16x16") and n.endswith("_packed") for n in names), names
    assert relative_error(got.astype(jnp.float32), _dense("dds", w, x)) <= TOL[jnp.dtype(jnp.bfloat16)]
