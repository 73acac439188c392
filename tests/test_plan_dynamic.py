"""The IPU model of dynamic sparsity: plan, bucket distribution (with spills) and tile simulator."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import examples, sweep
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax.experimental import checkify

import blocksparse as bs
from blocksparse.ipu import DynamicPlan, cost, distribute, dynamic_plan, simulate_dynamic
from blocksparse.ipu.buckets import bucket_fill
from blocksparse.ipu.cost import DYNAMIC_PHASES
from blocksparse.ipu.machines import IPUMachine
from blocksparse.testing.oracles import to_dense64

SETTINGS = settings(max_examples=examples(25, quick=4), deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _tiny(tiles):
    return IPUMachine(name="tiny", clock_hz=1e9, num_tiles=tiles, tile_memory_bytes=1 << 22)


# --------------------------------------------------------------------------------------------------
# Plan
# --------------------------------------------------------------------------------------------------
def test_plan_fields_report_and_dict():
    p = dynamic_plan((1024, 2048), 16, 1000, 256)
    assert isinstance(p, DynamicPlan)
    pm, pk, pn = p.split
    assert p.num_buckets <= bs.ipu.BOW.num_tiles
    # Every partition is non-empty and they cover the grid and n.
    gm, gk = p.grid
    assert (pm - 1) * p.rows_per_partition < gm <= pm * p.rows_per_partition
    assert (pk - 1) * p.cols_per_partition < gk <= pk * p.cols_per_partition
    assert p.n_pieces[0, 0] == 0 and p.n_pieces[-1, 1] == 256 and len(p.n_pieces) == pn
    assert p.bucket_capacity == int(np.ceil(-(-1000 // p.num_buckets) * 1.3))
    assert p.total_capacity >= 1000 * 1.3 - 1e-9
    assert p.bytes_per_tile <= p.memory_limit_bytes
    assert set(p.cycles) == set(DYNAMIC_PHASES) and p.total_cycles > 0
    assert p.cycles["propagate"] > 0 and p.cycles["metadata"] > 0
    d = json.loads(json.dumps(p.to_dict()))
    assert d["split_mkn"] == list(p.split) and d["bucket_capacity"] == p.bucket_capacity
    text = p.report()
    for name in DYNAMIC_PHASES:
        assert name in text
    assert "bucket" in text and "limit" in text
    # Frozen, read-only and deterministic.
    with pytest.raises(AttributeError):
        p.n = 3
    with pytest.raises(TypeError):
        p.cycles["compute"] = 0
    with pytest.raises(ValueError, match="read-only"):
        p.n_pieces[0, 0] = 1
    assert dynamic_plan((1024, 2048), 16, 1000, 256).to_dict() == p.to_dict()


@pytest.mark.parametrize(
    "shape,b,density,n,dtype",
    [((4096, 4096), 16, 1 / 16, 1024, "float16"), ((2048, 1024), 8, 1 / 8, 512, "float32"),
     ((1024, 1024), 4, 1 / 32, 256, "float16"), ((512, 512), 1, 1 / 64, 64, "float16")],
)  # fmt: skip
def test_static_plan_is_faster_than_dynamic(shape, b, density, n, dtype):
    W = bs.BlockPattern.random(0, shape, b, density)
    static = bs.plan(W, n, dtype=dtype)
    dyn = dynamic_plan(shape, b, W.nnz_blocks, n, dtype=dtype)
    assert static.seconds < dyn.seconds, (static.seconds, dyn.seconds)
    assert dyn.bytes_per_tile <= dyn.memory_limit_bytes


# --------------------------------------------------------------------------------------------------
# The one per-tile compute formula (cost.compute_cycles), used by the static and the dynamic model
# --------------------------------------------------------------------------------------------------
def test_compute_cycles_by_hand_on_the_amp():
    # b = 16, float16 on Bow: one 16 x 16 AMP pass at 64 MACs/cycle. npc = 64 columns over 6 workers in
    # grains of 4: n_eff = ceil(ceil(64 / 6) / 4) * 4 * 6 = 72. Per block: 16 metadata + 256 * 2 / 8 load
    # + 100 pipeline + 256 * 72 / 64 MACs = 468; per tile: 108 vertex + 24 per row.
    got = cost.compute_cycles(bs.ipu.BOW, np.array([3, 0, 1]), np.array([2, 0, 1]), 64, (16, 16), "float16")
    np.testing.assert_allclose(got, [108 + 2 * 24 + 3 * 468, 0.0, 108 + 24 + 468])


def test_compute_cycles_by_hand_elementwise():
    # b = 1, float32: the vector unit at 2 lanes / 1.5 issue = 4/3 MACs/cycle; npc = 5 in chunks of two
    # vectors (4 columns) -> 8. Per non-zero: 8 / (4/3) = 6 cycles; per row 12 + 14 per chunk = 40; per tile 108.
    got = cost.compute_cycles(bs.ipu.BOW, 4, 2, 5, (1, 1), "float32")
    assert float(got) == pytest.approx(108 + 2 * 40 + 4 * 6)
    # b = 2: each loaded row of x serves the block's two rows, so the issue overhead is 1 + 0.5 / 2.
    two = cost.compute_cycles(bs.ipu.BOW, 1, 1, 5, (2, 2), "float32")
    assert float(two) == pytest.approx(108 + 2 * 40 + 4 * 8 / (2 / 1.25))
    # The dynamic element-wise vertex keeps a row's accumulators across chunks: 12 + 14 once per row.
    dyn = cost.compute_cycles(bs.ipu.BOW, 4, 2, 5, (1, 1), "float32", dynamic=True)
    assert float(dyn) == pytest.approx(108 + 2 * 26 + 4 * 6)


def test_compute_cycles_shape_of_the_formula():
    mc = bs.ipu.MK2
    blocks = np.arange(0, 50)
    c = cost.compute_cycles(mc, blocks, np.minimum(blocks, 8), 128, (8, 8), "float16")
    assert c[0] == 0 and (np.diff(c) > 0).all()  # idle tiles cost nothing; more blocks cost more
    # Vectorised over npc too, equal to one call per value.
    npcs = np.array([4, 24, 64, 256])
    many = cost.compute_cycles(mc, 10, 5, npcs, (16, 16), "float16")
    assert many.tolist() == [float(cost.compute_cycles(mc, 10, 5, int(v), (16, 16), "float16")) for v in npcs]
    # Six workers take whole grains: up to 24 columns cost the same, beyond that more.
    assert many[0] == many[1] < many[2] < many[3]
    # Per multiply-accumulate, larger blocks are cheaper (the AMP is busier), float32 dearer than float16.
    per_mac = [
        float(cost.compute_cycles(mc, (64 // b) ** 2, 64 // b, 1024, (b, b), "float16")) / (64 * 64)
        for b in (1, 4, 8, 16)
    ]
    assert per_mac == sorted(per_mac, reverse=True)
    assert cost.compute_cycles(mc, 10, 5, 256, (16, 16), "float32") > cost.compute_cycles(
        mc, 10, 5, 256, (16, 16), "float16"
    )


def test_static_and_dynamic_compute_phases_use_the_formula():
    p = dynamic_plan((2048, 2048), 16, 2000, 512)
    npc = int(p.n_pieces[0, 1] - p.n_pieces[0, 0])
    pm, pk, pn = p.split
    # The vertices loop over the blocks a bucket holds: the busiest group's (mean + one standard deviation).
    mean = 2000 / (pm * pk)
    busiest = min(int(np.ceil(mean + np.sqrt(mean * (1 - 1 / (pm * pk))))), pn * p.bucket_capacity)
    fill = busiest / pn
    assert float(bucket_fill(2000, pm * pk, pn, p.bucket_capacity)) == pytest.approx(fill) and fill <= p.bucket_capacity
    # A group with fewer blocks than buckets: its tile computes each block once over its visits.
    assert float(bucket_fill(16, 256, 8, 2)) == pytest.approx(1 / 8)
    one = cost.compute_cycles(p.machine, fill, min(fill, p.rows_per_partition), npc, p.block_size, p.dtype,
                              dynamic=True)  # fmt: skip
    spill = cost.compute_cycles(p.machine, fill, min(fill, p.grid[0]), npc, p.block_size,
                                p.dtype, dynamic=True) if pm * pk > 1 else 0.0  # fmt: skip
    assert p.cycles["compute"] == pytest.approx(float(pn * one + spill))
    W = bs.BlockPattern.random(0, (512, 512), 16, 1 / 8)
    s = bs.plan(W, 64, n_split=1, num_bands=1, machine=bs.ipu.BOW)
    tiles = s.tile_num_blocks
    rows = (s.tile_rows >= 0).sum(axis=1)
    want = cost.compute_cycles(s.machine, tiles, rows, 64, (16, 16), "float16").max()
    assert s.cycles["compute"] == pytest.approx(float(want))


def test_more_oversize_means_bigger_buckets_and_memory():
    a = dynamic_plan((1024, 1024), 16, 1024, 256, bucket_oversize=0.0)
    b = dynamic_plan((1024, 1024), 16, 1024, 256, bucket_oversize=1.0, available_memory_proportion=1.0)
    assert a.total_capacity >= 1024 and b.total_capacity >= 2048


def test_memory_error_names_sizes():
    small = IPUMachine(name="small", clock_hz=1e9, num_tiles=4, tile_memory_bytes=4096)
    with pytest.raises(bs.NoValidPlanError, match=r"KiB.*limit available_memory_proportion=0.6") as info:
        dynamic_plan((1024, 1024), 16, 4096, 1024, machine=small)
    assert info.value.nothing_fits and "Nothing fits on this machine" in str(info.value)
    with pytest.raises(bs.NoValidPlanError):  # the claim holds
        dynamic_plan((1024, 1024), 16, 4096, 1, machine=small, available_memory_proportion=1.0, bucket_oversize=0.0)


SMALL = IPUMachine(name="small", clock_hz=1e9, num_tiles=16, tile_memory_bytes=64 * 1024)


@pytest.mark.parametrize(
    "shape, max_nnz, n, kwargs",
    [((256, 256), 64, 1 << 14, {"machine": SMALL}),
     ((256, 256), 64, 2048, {"machine": SMALL, "available_memory_proportion": 0.1}),
     ((256, 256), 64, 64, {"machine": SMALL, "available_memory_proportion": 0.05, "dtype": "float32"}),
     ((1024, 1024), 256, 512, {"available_memory_proportion": 0.001})],
)  # fmt: skip
def test_no_valid_plan_advice_is_checked(shape, max_nnz, n, kwargs):
    args = {"shape": shape, "block_size": 16, "max_nnz_blocks": max_nnz, "n": n} | kwargs
    with pytest.raises(bs.NoValidPlanError) as info:
        dynamic_plan(**args)
    e = info.value
    assert e.suggestions and not e.nothing_fits
    for s in e.suggestions:
        p = dynamic_plan(**(args | s))  # following each piece of advice gives a plan
        assert p.bytes_per_tile <= p.memory_limit_bytes
        if "n" in s:
            assert 1 <= s["n"] < n and f"n to at most {s['n']}" in str(e)
        if "available_memory_proportion" in s:
            assert kwargs.get("available_memory_proportion", 0.6) < s["available_memory_proportion"] <= 1.0


@pytest.mark.parametrize(
    "kwargs,match",
    [(dict(shape=(64, 60)), r"block size dividing shape \(64, 60\)"),
     (dict(max_nnz_blocks=17), r"max_nnz_blocks <= 16 .*Got 17"),
     (dict(max_nnz_blocks=-1), r"max_nnz_blocks as an integer >= 0. Got -1"),
     (dict(n=0), r"n as an integer >= 1. Got 0"),
     (dict(bucket_oversize=-0.1), r"bucket_oversize >= 0.*Got -0.1"),
     (dict(available_memory_proportion=1.5), r"available_memory_proportion in \(0, 1\]. Got 1.5"),
     (dict(dtype="int8"), r"Expected a dtype the IPU model supports"),
     (dict(shape="ab"), r"shape as a pair of integers")],
)  # fmt: skip
def test_plan_bad_input(kwargs, match):
    args = dict(shape=(64, 64), block_size=16, max_nnz_blocks=4, n=8) | kwargs
    with pytest.raises((ValueError, TypeError), match=match):
        dynamic_plan(**args)


def test_distribute_and_simulate_bad_input():
    p = dynamic_plan((32, 32), 8, 4, 8, machine=_tiny(4))
    with pytest.raises(TypeError, match="Expected a DynamicPlan"):
        distribute(object(), jnp.zeros(3, jnp.int32), jnp.zeros(3, jnp.int32), 3)
    with pytest.raises(ValueError, match=r"one 1-D shape.*\(3,\) and \(4,\)"):
        distribute(p, jnp.zeros(3, jnp.int32), jnp.zeros(4, jnp.int32), 3)
    with pytest.raises(ValueError, match=r"nnz in \[0, 3\].*Got 5"):
        distribute(p, jnp.zeros(3, jnp.int32), jnp.zeros(3, jnp.int32), 5)
    with pytest.raises(TypeError, match="integer rows"):
        distribute(p, jnp.zeros(3), jnp.zeros(3, jnp.int32), 3)
    D = bs.DynamicBlockSparseMatrix(jnp.zeros(2, jnp.int32), jnp.zeros(2, jnp.int32), jnp.ones((2, 8, 8)), 2, (32, 64))
    with pytest.raises(ValueError, match=r"shape \(32, 32\) with blocks \(8, 8\).*Got shape \(32, 64\)"):
        simulate_dynamic(p, D, jnp.ones((64, 8)))
    D = bs.DynamicBlockSparseMatrix(jnp.zeros(2, jnp.int32), jnp.zeros(2, jnp.int32), jnp.ones((2, 8, 8)), 2, (32, 32))
    with pytest.raises(ValueError, match=r"x of shape \(32, 8\).*Got \(32, 7\)"):
        simulate_dynamic(p, D, jnp.ones((32, 7)))


# --------------------------------------------------------------------------------------------------
# Distribution and simulation, property-based
# --------------------------------------------------------------------------------------------------
@st.composite
def cases(draw):
    tiles = draw(st.integers(1, 8))
    b = draw(st.sampled_from([1, 2, 4]))
    gm, gk = draw(st.integers(1, 6)), draw(st.integers(1, 6))
    n = draw(st.integers(1, 9))
    max_nnz = draw(st.integers(0, gm * gk))
    oversize = draw(st.sampled_from([0.0, 0.3, 1.0]))
    p = dynamic_plan((gm * b, gk * b), b, max_nnz, n, machine=_tiny(tiles), bucket_oversize=oversize)
    kind = draw(st.sampled_from(["random", "one_row", "one_col", "duplicates", "empty", "full", "overfull"]))
    cap = p.total_capacity
    if kind == "empty":
        nnz = 0
    elif kind == "full":
        nnz = cap
    elif kind == "overfull":
        nnz = cap + draw(st.integers(1, 3))
    else:
        nnz = draw(st.integers(0, max(max_nnz, 1)))
    L = nnz + draw(st.integers(0, 3))  # padding after nnz
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, gm, L)
    cols = rng.integers(0, gk, L)
    if kind == "one_row":
        rows[:] = rng.integers(gm)
    elif kind == "one_col":
        cols[:] = rng.integers(gk)
    elif kind == "duplicates":
        rows[:], cols[:] = rng.integers(gm), rng.integers(gk)
    # Padding positions hold garbage, including out-of-range coordinates.
    rows[nnz:] = rng.integers(-5, gm + 5, L - nnz)
    cols[nnz:] = rng.integers(-5, gk + 5, L - nnz)
    data = rng.standard_normal((L, b, b)).astype(np.float32)
    x = rng.standard_normal((gk * b, n)).astype(np.float32)
    return p, rows.astype(np.int32), cols.astype(np.int32), nnz, data, x


def _check_distribution(p, rows, nnz, d):
    L = rows.shape[0]
    ids = np.asarray(d.bucket_ids)
    fill = np.asarray(d.bucket_fill)
    assert ids.shape == (p.num_buckets, p.bucket_capacity)
    # Buckets are filled from the front and never beyond capacity.
    assert (fill <= p.bucket_capacity).all() and ((ids >= 0).sum(axis=1) == fill).all()
    assert all((row[:f] >= 0).all() and (row[f:] == -1).all() for row, f in zip(ids, fill, strict=True))
    placed = ids[ids >= 0]
    # Never placed twice; only active positions.
    assert np.unique(placed).size == placed.size and (placed < nnz).all()
    overflow = max(0, nnz - p.total_capacity)
    assert int(d.overflow) == overflow and placed.size == min(nnz, p.total_capacity)
    bb, bsl, home = np.asarray(d.block_bucket), np.asarray(d.block_slot), np.asarray(d.home_bucket)
    for i in range(L):
        if bb[i] >= 0:
            assert ids[bb[i], bsl[i]] == i
    assert (bb[nnz:] == -1).all() and (home[nnz:] == -1).all()
    # A block spills only when its home bucket is full.
    spilled = (bb >= 0) & (bb != home)
    assert int(d.spilled) == int(spilled.sum())
    if spilled.any() or overflow:
        assert (fill[home[:nnz][(bb[:nnz] != home[:nnz])]] == p.bucket_capacity).all()


@SETTINGS
@given(cases())
def test_distribute_and_simulate_match_oracle(case):
    p, rows, cols, nnz, data, x = case
    d = distribute(p, rows, cols, nnz)
    _check_distribution(p, rows, nnz, d)
    again = distribute(p, rows, cols, nnz)  # deterministic
    assert all(np.array_equal(a, b) for a, b in zip(again, d, strict=True))
    D = bs.DynamicBlockSparseMatrix(rows, cols, data, nnz, p.shape)
    if nnz > p.total_capacity:
        with pytest.raises(ValueError, match=rf"total_capacity={p.total_capacity}.*Got nnz={nnz}"):
            simulate_dynamic(p, D, x)
        assert np.isnan(np.asarray(jax.jit(lambda D, x: simulate_dynamic(p, D, x))(D, x))).all()
        return
    y = simulate_dynamic(p, D, x)
    want = to_dense64(D) @ x.astype(np.float64)
    scale = np.abs(to_dense64(D)) @ np.abs(x.astype(np.float64))
    bs.testing.oracles.assert_close(y, want, scale, jnp.float32, "simulate_dynamic")


def test_one_row_overflows_home_and_spills_to_nearest():
    # 8 block rows, 2 partitions of rows: every block in row 0 overflows bucket 0 and spills up.
    tiny = dataclasses.replace(_tiny(4), round_cycles=0)  # a free spill round: the plan splits the rows
    p = dynamic_plan((64, 8), 8, 8, 4, machine=tiny, bucket_oversize=0.0)
    assert p.split[0] > 1 and p.split[1] == 1 and p.split[2] == 1, p.split
    rows = np.zeros(8, np.int32)
    cols = np.zeros(8, np.int32)
    d = distribute(p, rows, cols, 8)
    _check_distribution(p, rows, 8, d)
    bb = np.asarray(d.block_bucket)
    assert int(d.overflow) == 0 and int(d.spilled) == 8 - p.bucket_capacity
    # Nearest first: buckets are filled in order of distance from home 0.
    assert (np.diff(bb) >= 0).all() and bb[0] == 0


def test_jit_pattern_changes_without_recompiling_and_checkify():
    p = dynamic_plan((32, 32), 4, 20, 8, machine=_tiny(6))
    L = p.total_capacity + 2
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((32, 8)), jnp.float32)

    @jax.jit
    def f(rows, cols, data, nnz, x):
        D = bs.DynamicBlockSparseMatrix(rows, cols, data, nnz, (32, 32))
        return simulate_dynamic(p, D, x, return_distribution=True)

    for seed, nnz in enumerate([0, 5, p.total_capacity, 3]):
        r = np.random.default_rng(seed)
        rows = r.integers(0, 8, L).astype(np.int32)
        if seed == 2:
            rows[:] = 1  # all in one row: spills
        cols = r.integers(0, 8, L).astype(np.int32)
        data = r.standard_normal((L, 4, 4)).astype(np.float32)
        y, d = f(rows, cols, data, jnp.int32(nnz), x)
        D = bs.DynamicBlockSparseMatrix(rows, cols, data, nnz, (32, 32))
        np.testing.assert_allclose(np.asarray(y), to_dense64(D) @ np.asarray(x, np.float64), rtol=1e-4, atol=1e-4)
        assert int(d.overflow) == 0
    assert f._cache_size() == 1

    # checkify on top of the explicit overflow output.
    def g(rows, cols, nnz):
        d = distribute(p, rows, cols, nnz)
        checkify.check(d.overflow == 0, "{o} blocks fit no bucket", o=d.overflow)
        return d.bucket_ids

    checked = jax.jit(checkify.checkify(g))
    rows = jnp.zeros(L, jnp.int32)
    err, _ = checked(rows, rows, jnp.int32(p.total_capacity))
    err.throw()
    err, _ = checked(rows, rows, jnp.int32(L))
    with pytest.raises(checkify.JaxRuntimeError, match="2 blocks fit no bucket"):
        err.throw()


# --------------------------------------------------------------------------------------------------
# Invalid coordinates: NaN, exactly as D @ x, never a block read from somewhere else
# --------------------------------------------------------------------------------------------------
@sweep("row, col", [(0, 5), (-1, 0), (0, -1), (9, 0)], quick=1, ids=["col5", "row-1", "col-1", "row9"])
def test_simulate_dynamic_poisons_out_of_grid_coordinates(row, col):
    # A 4 x 4 grid of 4 x 4 blocks. Before, col 5 read the block column 3, row -1 became row 3, col -1
    # became col 0 and row 9 was dropped: finite wrong values where D @ x is NaN.
    p = dynamic_plan((16, 16), 4, 3, 8, machine=_tiny(4))
    D = bs.DynamicBlockSparseMatrix(
        jnp.array([0, row, 2], jnp.int32), jnp.array([0, col, 1], jnp.int32), jnp.ones((3, 4, 4)), 3, (16, 16)
    )
    x = jnp.ones((16, 8))
    assert not bool(D.is_valid()) and np.isnan(np.asarray(D @ x)).all()
    run = jax.jit(lambda D, x: simulate_dynamic(p, D, x))
    for y in (simulate_dynamic(p, D, x), run(D, x)):
        assert y.shape == (16, 8) and np.isnan(np.asarray(y)).all()
    err, _ = bs.checkify(run)(D, x)
    with pytest.raises(checkify.JaxRuntimeError, match=r"expected active block rows in \[0, 4\) and cols in \[0, 4\)"):
        err.throw()
    # The same matrix with the coordinate fixed is fine, and checkify stays quiet.
    ok = bs.DynamicBlockSparseMatrix(D.rows.at[1].set(1), D.cols.at[1].set(1), D.data, 3, (16, 16))
    err, y = bs.checkify(run)(ok, x)
    err.throw()
    np.testing.assert_allclose(np.asarray(y), to_dense64(ok) @ np.ones((16, 8)), rtol=1e-6)


@st.composite
def invalid_cases(draw):
    """Small dynamic problems where some active coordinates may be outside the grid, or nnz over capacity."""
    b = draw(st.sampled_from([1, 2, 4]))
    gm, gk = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    n = draw(st.integers(1, 6))
    max_nnz = draw(st.integers(1, gm * gk))
    p = dynamic_plan((gm * b, gk * b), b, max_nnz, n, machine=_tiny(draw(st.integers(1, 6))), bucket_oversize=0.0)
    L = draw(st.integers(1, p.total_capacity + 2))
    nnz = draw(st.integers(0, L))
    rows = np.array(draw(st.lists(st.integers(-3, gm + 2), min_size=L, max_size=L)), np.int32)
    cols = np.array(draw(st.lists(st.integers(-3, gk + 2), min_size=L, max_size=L)), np.int32)
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    data = rng.standard_normal((L, b, b)).astype(np.float32)
    x = rng.standard_normal((gk * b, n)).astype(np.float32)
    return p, rows, cols, nnz, data, x


@settings(max_examples=examples(15), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(invalid_cases(), st.booleans())
def test_simulate_dynamic_invalid_input_is_an_error_or_nan(case, jit):
    p, rows, cols, nnz, data, x = case
    D = bs.DynamicBlockSparseMatrix(rows, cols, data, nnz, p.shape)
    gm, gk = p.grid
    active = np.arange(rows.size) < nnz
    in_grid = (rows >= 0) & (rows < gm) & (cols >= 0) & (cols < gk)
    valid = bool((in_grid | ~active).all()) and nnz <= p.total_capacity
    run = jax.jit(lambda D, x: simulate_dynamic(p, D, x)) if jit else (lambda D, x: simulate_dynamic(p, D, x))
    try:
        y = np.asarray(run(D, x))
    except ValueError as e:  # outside jit, nnz over capacity is an error
        assert not jit and nnz > p.total_capacity, e
        return
    if valid:
        dense = np.zeros((gm, gk, p.block_size[0], p.block_size[1]))
        np.add.at(dense, (rows[:nnz], cols[:nnz]), data[:nnz].astype(np.float64))
        dense = dense.swapaxes(1, 2).reshape(p.shape)
        scale = np.abs(dense) @ np.abs(x.astype(np.float64))
        bs.testing.oracles.assert_close(y, dense @ x.astype(np.float64), scale, jnp.float32, "simulate_dynamic")
    else:
        assert np.isnan(y).all(), "invalid input gave a finite value"
