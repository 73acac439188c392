"""Static planner: machine models, invariants of the partition, errors, cache, report, published shapes."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import examples, sweep
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

import blocksparse as bs
from blocksparse.ipu import NoValidPlanError, Plan
from blocksparse.ipu.machines import IPUMachine
from blocksparse.ipu.partition import column_bands, tiles_for_bands
from blocksparse.testing import strategies as bst

TINY = IPUMachine(name="tiny", clock_hz=1e9, num_tiles=7, tile_memory_bytes=1 << 20)
SMALL = IPUMachine(name="small", clock_hz=1e9, num_tiles=16, tile_memory_bytes=64 * 1024)


def _patterns():
    yield bs.BlockPattern.random(0, (512, 256), 16, 1 / 8)
    yield bs.BlockPattern.power_law(1, (1024, 1024), 8, 1 / 16)
    yield bs.BlockPattern.random(2, (256, 256), 4, 1 / 4)
    yield bs.BlockPattern.random(3, (128, 96), 1, 1 / 16)
    full_row = np.zeros((16, 16), bool)
    full_row[3] = True
    yield bs.BlockPattern.from_mask(full_row, 4)


# -- API surface ------------------------------------------------------------------------------------
def test_public_names_plan_is_a_plain_function():
    import inspect

    assert inspect.isfunction(bs.plan) and inspect.isfunction(bs.dynamic_plan)
    assert bs.plan is bs.ipu.plan and bs.simulate is bs.ipu.simulate
    assert isinstance(bs.ipu.BOW, IPUMachine) and isinstance(bs.ipu.MK2, IPUMachine)
    W = bs.random(__import__("jax").random.key(0), (64, 64), 16, 0.5)
    p = bs.plan(W, 32, machine=bs.ipu.BOW, dtype=jnp.float16, available_memory_proportion=0.6)
    assert isinstance(p, Plan)
    assert bs.ipu.plan(W.pattern, 32) is p  # same cache entry whether given W or its pattern


def test_machine_constants_match_published_peaks():
    # 250 TFLOP/s (GC200) and 350 TFLOP/s (Bow) FP16; 62.5 TFLOP/s FP32 on GC200.
    assert bs.ipu.MK2.peak_flops("float16") == pytest.approx(250e12, rel=0.01)
    assert bs.ipu.BOW.peak_flops("float16") == pytest.approx(350e12, rel=0.01)
    assert bs.ipu.MK2.peak_flops("float32") == pytest.approx(62.5e12, rel=0.01)
    assert bs.ipu.BOW.num_tiles * bs.ipu.BOW.tile_memory_bytes == pytest.approx(900e6, rel=0.05)
    assert hash(bs.ipu.BOW) == hash(IPUMachine(name="bow", clock_hz=1.85e9)) and bs.ipu.BOW != bs.ipu.MK2
    assert [bs.ipu.BOW.sub_block((b, b)) for b in (1, 2, 4, 8, 16, 32, 64)] == [1, 1, 4, 8, 16, 16, 16]


# -- pieces -----------------------------------------------------------------------------------------
def test_column_bands_balance_and_tiles_proportional():
    cols = np.repeat(np.arange(8), [10, 0, 10, 10, 0, 10, 30, 10])
    b = column_bands(cols, 8, 4)
    # 80 blocks in 4 bands: cut after the columns where the running count first reaches 20, 40, 60.
    assert b.tolist() == [0, 3, 6, 7, 8]
    assert np.add.reduceat(np.bincount(cols, minlength=8), b[:-1]).tolist() == [20, 20, 30, 10]
    assert column_bands(cols, 8, 1).tolist() == [0, 8]
    t = tiles_for_bands(np.array([10, 30, 0, 60]), 10)
    assert t.tolist() == [1, 3, 0, 6]
    assert tiles_for_bands(np.array([1, 1, 1]), 2) is None
    assert tiles_for_bands(np.array([2, 1000]), 5).tolist() == [1, 4]
    # In grains of two tiles (the tiles sharing an exchange bus): 5 grains shared 1 : 1 : 0 : 3.
    assert tiles_for_bands(np.array([10, 30, 0, 60]), 10, grain=2).tolist() == [2, 2, 0, 6]
    assert tiles_for_bands(np.array([1, 1, 1]), 5, grain=2) is None  # 2 grains for 3 bands
    assert tiles_for_bands(np.array([1, 7]), 8, grain=2).tolist() == [1, 6]  # never more tiles than blocks


@settings(max_examples=examples(200, 50), deadline=None)
@given(
    nnz=st.lists(st.integers(0, 40), min_size=1, max_size=24), tiles=st.integers(1, 64), grain=st.sampled_from([1, 2])
)
@example(nnz=[4, 3, 1, 3, 17, 2, 2], tiles=16, grain=2)  # 7 bands in 8 grains: the largest band gives back two
def test_tiles_for_bands_never_hand_out_more_tiles_than_there_are(nnz, tiles, grain):
    nnz = np.array(nnz)
    t = tiles_for_bands(nnz, tiles, grain)
    nonempty = nnz > 0
    if t is None:
        assert int(nonempty.sum()) > tiles // grain
        return
    assert int(t.sum()) <= tiles and (t <= nnz).all() and (t[~nonempty] == 0).all()
    assert (t[nonempty] >= np.minimum(grain, nnz[nonempty])).all()


def test_plans_use_tiles_in_grains():
    W = bs.BlockPattern.random(0, (2048, 2048), 16, 1 / 8)
    for s in (1, 3, 5):
        p = bs.plan(W, 512, n_split=s)
        assert p.tiles_per_split == (bs.ipu.BOW.num_tiles // 2 // s) * 2  # 1472, 490, 294: whole grains
        assert p.tiles_used <= p.tiles_per_split * s
    # A machine with fewer tiles than a grain allocates single tiles.
    one = IPUMachine(name="one", clock_hz=1e9, num_tiles=1, tile_memory_bytes=1 << 22)
    assert bs.plan(bs.BlockPattern.random(0, (64, 64), 16, 0.5), 8, machine=one).tiles_per_split == 1


# -- the phase costs, by hand -----------------------------------------------------------------------
def test_dense_row_exchange_pays_for_the_band_at_the_multicast_rate():
    from blocksparse.ipu import cost

    # One tile using 4 of its band's 64 columns: poplibs' rhsBias (64 / 4) times the 4 columns at twice the
    # exchange rate = 64 columns x 16 rows x 128 columns x 2 bytes / (2 x 4 B/cycle).
    def stats(span):
        return cost.TileStats(np.array([4]), np.array([4]), np.array([4]), 0, 0, span)

    kw = dict(shape=(1024, 1024), block_size=(16, 16), n=128, n_split=1, tiles_per_split=1472, dtype="float16",
              partials_dtype="float32")  # fmt: skip
    wide, _, _ = cost.sparse_cost(bs.ipu.BOW, stats(np.array([64])), **kw)
    used, nbytes, _ = cost.sparse_cost(bs.ipu.BOW, stats(None), **kw)
    assert wide["exchange_dense"] == pytest.approx(64 * 16 * 128 * 2 / 8)
    assert used["exchange_dense"] == pytest.approx(4 * 16 * 128 * 2 / 8)
    assert nbytes["exchange_dense"] == 4 * 16 * 128 * 2  # bytes moved are those of the used columns


def test_reduction_cycles_by_hand():
    from blocksparse.ipu import cost

    # 48 float outputs, two partials each: 6 workers x ceil(8 / 4) vector steps x (11 + 1) cycles + 108 launch,
    # about three cycles per output (poplibs' reductionCycleEstimate); four partials cost two more per step.
    assert float(cost.reduction_cycles(bs.ipu.BOW, 48, 2, "float32")) == 108 + 12 * 12
    assert float(cost.reduction_cycles(bs.ipu.BOW, 48, 4, "float32")) == 108 + 12 * 14


# -- invariants ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("machine", [TINY, bs.ipu.BOW], ids=["tiny", "bow"])
def test_every_block_assigned_once_contiguous_and_within_memory(machine):
    for pattern in _patterns():
        p = bs.plan(pattern, 64, machine=machine, dtype="float32", num_bands=None)
        blocks = p.tile_blocks[p.tile_blocks >= 0]
        assert np.array_equal(np.sort(blocks), np.arange(pattern.nnz_blocks))
        assert p.tile_bytes.max() <= p.memory_limit_bytes
        bounds = p.band_boundaries
        for t in range(p.tiles_per_split):
            mine = p.tile_blocks[t][p.tile_blocks[t] >= 0]
            if mine.size == 0:
                continue
            # one band, row order, consistent local row/column slots
            band = np.searchsorted(bounds, pattern.cols[mine], side="right") - 1
            assert np.all(band == p.tile_band[t])
            key = pattern.rows[mine].astype(np.int64) * pattern.grid[1] + pattern.cols[mine]
            assert np.all(np.diff(key) > 0)
            lr = p.tile_local_row[t][: mine.size]
            lc = p.tile_local_col[t][: mine.size]
            assert np.array_equal(p.tile_rows[t][lr], pattern.rows[mine])
            assert np.array_equal(p.tile_cols[t][lc], pattern.cols[mine])
        # equal chunks within a band: every tile of a band but its last has the same count
        counts = p.tile_num_blocks
        for b in range(p.num_bands):
            c = counts[p.tile_band == b]
            if c.size > 1:
                assert np.all(c[:-1] == c[0]) and c[-1] <= c[0]


def test_deterministic_and_cached():
    pattern = bs.BlockPattern.power_law(5, (1024, 512), 16, 1 / 8)
    p1 = bs.plan(pattern, 256)
    assert bs.plan(pattern, 256) is p1
    info = bs.ipu.cache_info()
    assert info["size"] >= 1 and info["hits"] >= 1
    bs.ipu.clear_cache()
    assert bs.ipu.cache_info()["size"] == 0
    p2 = bs.plan(pattern, 256)
    assert p2 is not p1
    assert json.dumps(p1.to_dict(arrays=True)) == json.dumps(p2.to_dict(arrays=True))
    # options are part of the key
    assert bs.plan(pattern, 256, available_memory_proportion=0.5) is not p2
    assert bs.plan(pattern, 256, machine=bs.ipu.MK2) is not p2


def test_forced_partition_options():
    pattern = bs.BlockPattern.random(0, (256, 256), 8, 1 / 4)
    p = bs.plan(pattern, 64, n_split=2, num_bands=4)
    assert p.n_split == 2 and p.num_bands == 4 and p.n_pieces.tolist() == [[0, 32], [32, 64]]


def test_empty_pattern():
    pattern = bs.BlockPattern((64, 64), 16, np.zeros(0, np.int32), np.zeros(0, np.int32))
    p = bs.plan(pattern, 16)
    assert p.tiles_used == 0 and p.cycles["compute"] == 0
    assert p.speedup is None  # no useful work: no speedup to claim
    assert "0 non-zero blocks" in p.report() and "speedup over dense none" in p.report()


# -- bad input ----------------------------------------------------------------------------------------
# Each case fails; the error's suggestions are followed one by one and each must then give a plan.
NO_FIT = [
    pytest.param((512, 512), 1024, {"available_memory_proportion": 0.001}, ["available_memory_proportion"],
                 id="tiny-proportion"),
    pytest.param((1024, 1024), 64, {"machine": SMALL}, ["available_memory_proportion"], id="proportion-below-1"),
    pytest.param((256, 256), 1 << 14, {"machine": SMALL}, ["n"], id="n-only"),
    pytest.param((256, 256), 4096, {"machine": SMALL, "available_memory_proportion": 0.05},
                 ["available_memory_proportion", "n"], id="proportion-and-n"),
    pytest.param((256, 256), 4096, {"machine": SMALL, "dtype": "float32", "available_memory_proportion": 0.3},
                 ["n"], id="float32"),
]  # fmt: skip


@pytest.mark.parametrize("shape, n, kwargs, changed", NO_FIT)
def test_no_valid_plan_advice_is_checked(shape, n, kwargs, changed):
    pattern = bs.BlockPattern.random(0, shape, 16, 1 / 4)
    with pytest.raises(NoValidPlanError) as info:
        bs.plan(pattern, n, **kwargs)
    e = info.value
    text = str(e)
    assert not e.nothing_fits and e.suggestions
    assert sorted({key for s in e.suggestions for key in s}) == sorted(changed)
    for s in e.suggestions:
        p = bs.plan(pattern, **({"n": n} | kwargs | s))  # following the advice gives a plan
        assert p.tile_bytes.max() <= p.memory_limit_bytes
        for key, value in s.items():
            assert f"{'reduce' if key == 'n' else 'raise'} {key} to {'at most ' if key == 'n' else ''}{value:g}" in text
        if "available_memory_proportion" in s:
            assert 0 < s["available_memory_proportion"] <= 1
        if "n" in s:
            assert 1 <= s["n"] < n
    # The advice never claims a proportion that cannot fit, nor one that is not a raise.
    assert "0.00 would fit" not in text and "1.00 would fit" not in text


def test_no_valid_plan_suggested_n_is_the_largest_found():
    pattern = bs.BlockPattern.random(0, (256, 256), 16, 1 / 4)
    with pytest.raises(NoValidPlanError) as info:
        bs.plan(pattern, 1 << 14, machine=SMALL)
    (s,) = info.value.suggestions
    bs.plan(pattern, s["n"], machine=SMALL)
    with pytest.raises(NoValidPlanError):
        bs.plan(pattern, s["n"] + 1, machine=SMALL)


def test_no_valid_plan_when_nothing_fits_says_so():
    pattern = bs.BlockPattern.random(0, (1024, 1024), 16, 1 / 4)
    machine = IPUMachine(name="small", clock_hz=1e9, num_tiles=4, tile_memory_bytes=4096)
    with pytest.raises(NoValidPlanError, match=r"Nothing fits on this machine.*several IPUs") as info:
        bs.plan(pattern, 1 << 16, machine=machine)
    assert info.value.nothing_fits and info.value.suggestions == []
    assert "would fit" not in str(info.value) and "reduce n" not in str(info.value)
    with pytest.raises(NoValidPlanError):  # the claim holds
        bs.plan(pattern, 1, machine=machine, available_memory_proportion=1.0)


@pytest.mark.parametrize(
    "kwargs, err, match",
    [
        ({"n": 0}, ValueError, r"Expected n as an integer >= 1. Got 0"),
        ({"n": 8, "dtype": jnp.bfloat16}, ValueError, r"float16, float32.*Got bfloat16"),
        ({"n": 8, "available_memory_proportion": 1.5}, ValueError, r"\(0, 1\]. Got 1.5"),
        ({"n": 8, "machine": "bow"}, TypeError, r"Expected an IPUMachine.*Got str"),
        ({"n": 8, "n_split": 5}, ValueError, r"Expected n_split <= 2.*Got 5"),
        ({"n": 8, "partials_dtype": "int32"}, ValueError, r"partials_dtype float16 or float32. Got int32"),
    ],
)
def test_bad_input(kwargs, err, match):
    pattern = bs.BlockPattern.random(0, (64, 64), 16, 0.5)
    with pytest.raises(err, match=match):
        bs.plan(pattern, **kwargs)


def test_more_bands_than_tiles_is_an_error():
    pattern = bs.BlockPattern.random(0, (16, 64), 1, 1.0)
    with pytest.raises(NoValidPlanError, match="more non-empty column bands than tiles"):
        bs.plan(pattern, 8, machine=TINY, num_bands=12, dtype="float32")


def test_rejects_non_static_input():
    with pytest.raises(TypeError, match="Expected a BlockSparseMatrix or a BlockPattern"):
        bs.plan(np.ones((4, 4)), 4)


# -- report -------------------------------------------------------------------------------------------
def test_report_and_json():
    p = bs.plan(bs.BlockPattern.random(0, (1024, 1024), 16, 1 / 16), 512)
    text = p.report()
    for word in ("tiles used", "blocks", "memory (KiB)", "exchange_dense", "reduction", "TFLOP/s", "speedup"):
        assert word in text
    # The table shows the plan's numbers, phase by phase, in phase order.
    assert f"{p.total_cycles:>14,.0f}" in text and f"{p.speedup:.2f}x" in text
    # Each phase's share of the total, in percent, for both plan kinds; the shares add up to 100.
    dp = bs.dynamic_plan(p.shape, p.block_size, p.pattern.nnz_blocks, p.n)
    for q in (p, dp):
        lines = q.report().splitlines()
        assert "share" in next(line for line in lines if line.strip().startswith("phase"))
        shares = [
            float(line.split()[2].rstrip("%")) for line in lines if line.split()[:1] and line.split()[0] in q.cycles
        ]
        assert len(shares) == len(q.cycles) and abs(sum(shares) - 100.0) < 0.1 * len(shares)
    positions = [text.index(f"  {name} ") for name in bs.ipu.cost.PHASES]
    assert positions == sorted(positions)
    d = json.loads(p.to_json())
    assert d == json.loads(json.dumps(p.to_dict()))
    assert d["nnz_blocks"] == 256 and d["kind"] == "static" and list(d["cycles"]) == list(bs.ipu.cost.PHASES)
    assert 1.0 < d["speedup_over_dense"] < 100.0 and d["dense"]["seconds"] > d["seconds"] > 0


def test_cached_plans_are_immutable():
    pattern = bs.BlockPattern.random(7, (512, 512), 16, 1 / 8)
    p = bs.plan(pattern, 128)
    compute, dense_bytes, tile_blocks = p.cycles["compute"], p.exchange_bytes["exchange_dense"], p.tile_blocks.copy()
    assert compute > 0
    with pytest.raises(TypeError):
        p.cycles["compute"] = 0
    with pytest.raises(TypeError):
        p.exchange_bytes["exchange_dense"] = 0
    with pytest.raises(TypeError):
        p.dense.phases["compute"] = 0
    for name in ("n_pieces", "band_boundaries", "tiles_per_band", "tile_band", "tile_blocks", "tile_rows",
                 "tile_cols", "tile_local_row", "tile_local_col", "tile_bytes"):  # fmt: skip
        with pytest.raises(ValueError, match="read-only"):
            getattr(p, name)[...] = 0
    with pytest.raises(AttributeError):
        p.cycles = {}
    again = bs.plan(pattern, 128)
    assert again is p and again.cycles["compute"] == compute and again.exchange_bytes["exchange_dense"] == dense_bytes
    assert np.array_equal(again.tile_blocks, tile_blocks)
    # to_dict() hands out plain copies: changing them changes nothing in the plan.
    d = p.to_dict()
    assert type(d["cycles"]) is dict
    d["cycles"]["compute"] = 0
    assert bs.plan(pattern, 128).cycles["compute"] == compute


# -- the published shape of PopSparse's results (Li et al. 2023), on the estimates ------------------
def _speedup(m, b, d, n, dtype="float16"):
    return bs.plan(bs.BlockPattern.random(0, (m, m), b, d), n, dtype=dtype)


@pytest.mark.parametrize("n", [1024, 2048, 4096])
@pytest.mark.parametrize("inv_d", [16, 32, 64])
def test_b16_fp16_beats_dense_at_low_density(n, inv_d):
    assert _speedup(4096, 16, 1 / inv_d, n).speedup > 1.0


@pytest.mark.slow
def test_element_sparsity_fp16_dense_wins_at_one_eighth_sparse_at_one_64th():
    assert _speedup(4096, 1, 1 / 8, 1024).speedup < 1.0
    assert _speedup(4096, 1, 1 / 64, 1024).speedup > 1.0


def test_larger_blocks_n_and_matrices_raise_throughput():
    by_block = [_speedup(4096, b, 1 / 16, 1024).tflops for b in (1, 4, 8, 16)]
    assert by_block == sorted(by_block) and len(set(by_block)) == 4
    by_n = [_speedup(4096, 16, 1 / 16, n).tflops for n in (256, 512, 1024, 2048)]
    assert by_n == sorted(by_n) and len(set(by_n)) == 4
    by_size = [_speedup(m, 16, 1 / 16, 1024).tflops for m in (1024, 2048, 4096, 8192)]
    assert by_size == sorted(by_size) and len(set(by_size)) == 4
    assert _speedup(4096, 32, 1 / 16, 1024).tflops >= by_block[-1]  # decomposed into 16 x 16


@sweep(
    "shape, b, d, n, amp",
    quick=2,
    argvalues=[
        ((2048, 2048), 1, 1 / 16, 512, 0.6),  # fits in one pass
        ((2048, 2048), 1, 1 / 8, 4096, 0.3),  # 4 serial passes: levels 1 and 2 fail
        ((2048, 2048), 1, 1 / 8, 4096, 0.1),  # 16 serial passes
        # Nothing fits: the same error message (slow: the advice plans again many times without the probe).
        pytest.param((2048, 2048), 1, 1 / 4, 4096, 0.05, marks=pytest.mark.slow),
    ],
)
def test_memory_probe_keeps_plans_identical(monkeypatch, shape, b, d, n, amp):
    # Lower the exact-scoring limit so that these patterns take the screened path the probe speeds up.
    from blocksparse.ipu import partition

    W = bs.BlockPattern.random(3, shape, b, d)
    monkeypatch.setattr(partition, "EXACT_LIMIT", 1000)
    plans = []
    for probe in (False, True):
        monkeypatch.setattr(partition, "PROBE", probe)
        bs.ipu.clear_cache()
        try:
            plans.append(bs.plan(W, n, available_memory_proportion=amp))
        except bs.NoValidPlanError as e:
            plans.append(str(e).split(" To fit")[0])  # the advice that follows has a wall-clock budget
    bs.ipu.clear_cache()
    if isinstance(plans[0], str):
        assert plans[0] == plans[1] and "smallest per-tile footprint" in plans[0]
        return
    a, c = plans
    assert (a.n_split, a.num_bands, a.serial) == (c.n_split, c.num_bands, c.serial)
    assert dict(a.cycles) == dict(c.cycles) and np.array_equal(a.tile_blocks, c.tile_blocks)


#: The planner's patterns: the adversarial kinds of blocksparse.testing (one full row or column, empty rows, one
#: block, ...) on grids up to 48 x 48 of square blocks, and power-law ones.
PLAN_PATTERNS = st.one_of(
    bst.block_patterns(block_size=st.sampled_from([(1, 1), (2, 2), (4, 4), (8, 8), (16, 16)]), max_blocks=48,
                       kinds=[k for k in bst.PATTERN_KINDS if k != "empty"]),
    st.builds(lambda seed, g, b, d: bs.BlockPattern.power_law(seed, (g * b, g * b), b, d), st.integers(0, 2**16),
              st.integers(1, 48), st.sampled_from([1, 4, 16]), st.sampled_from([1 / 64, 1 / 8, 1 / 2])),
)  # fmt: skip


@settings(max_examples=examples(40), deadline=None)
@given(
    pattern=PLAN_PATTERNS,
    n=st.sampled_from([1, 16, 100, 1024, 4096]),
    machine=st.sampled_from([TINY, SMALL, bs.ipu.BOW]),
    dtypes=st.sampled_from([("float16", "float32"), ("float16", "float16"), ("float32", "float32")]),
    amp=st.sampled_from([0.05, 0.3, 0.6]),
)
def test_screening_bounds_never_exceed_the_exact_cost(pattern, n, machine, dtypes, amp):
    # The screening rejects a candidate on lower bounds of its cycles and busiest tile's bytes: for every candidate
    # at every serial level, each bound must be at most the exact figure (else it could reject the best plan).
    from blocksparse.ipu import partition

    assume(pattern.nnz_blocks > 0)  # (a random pattern of density 0; the empty plan has no candidates)
    audit = []
    try:
        partition._search(pattern, n, machine, *dtypes, amp, None, None, audit=audit)
    except partition._NoFit:
        pass  # every level tried is audited
    assert audit
    for s, nb, serial, bound_total, bound_top, total, top in audit:
        where = f"n_split={s}, bands={nb}, serial={serial}"
        assert bound_total <= total * (1 + 1e-9), f"{where}: cycles bound {bound_total} > exact {total}"
        assert bound_top <= top * (1 + 1e-9), f"{where}: bytes bound {bound_top} > exact {top}"


@pytest.mark.slow
def test_planning_a_million_element_pattern_takes_under_a_second(monkeypatch):
    # About 0.8 s on an idle CPU against 4.5 s without the memory probe. Timed against the probe
    # turned off in the same process, so that a loaded machine slows both alike; the plans are equal.
    import time

    from blocksparse.ipu import partition

    W = bs.BlockPattern.random(0, (8192, 8192), 1, 1048576 / 8192**2)

    def timed(probe):
        monkeypatch.setattr(partition, "PROBE", probe)
        bs.ipu.clear_cache()
        t0 = time.perf_counter()
        p = bs.plan(W, 1024)
        return time.perf_counter() - t0, p

    (fast, a), (slow, c) = timed(True), timed(False)
    bs.ipu.clear_cache()
    assert (a.n_split, a.num_bands, a.serial) == (c.n_split, c.num_bands, c.serial)
    assert dict(a.cycles) == dict(c.cycles) and np.array_equal(a.tile_blocks, c.tile_blocks)
    assert fast < slow / 3, (fast, slow)
