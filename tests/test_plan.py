"""Static planner: machine models, invariants of the partition, errors, cache, report, published shapes."""

import json
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

import blocksparse as bs
from blocksparse.ipu import NoValidPlanError, Plan
from blocksparse.ipu.machines import IPUMachine
from blocksparse.ipu.planner import column_bands, tiles_for_bands

TINY = IPUMachine(name="tiny", clock_hz=1e9, num_tiles=7, tile_memory_bytes=1 << 20)


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
    assert b[0] == 0 and b[-1] == 8 and np.all(np.diff(b) > 0)
    t = tiles_for_bands(np.array([10, 30, 0, 60]), 10)
    assert t.tolist() == [1, 3, 0, 6]
    assert tiles_for_bands(np.array([1, 1, 1]), 2) is None
    assert tiles_for_bands(np.array([2, 1000]), 5).tolist() == [1, 4]


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
    bs.ipu.clear_cache()
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
    assert "0 non-zero blocks" in p.report()


# -- bad input ----------------------------------------------------------------------------------------
def test_no_valid_plan_says_what_to_change():
    pattern = bs.BlockPattern.random(0, (512, 512), 16, 1 / 4)
    with pytest.raises(NoValidPlanError, match=r"available_memory_proportion=0.001.*Raise available_memory_proportion"):
        bs.plan(pattern, 1024, available_memory_proportion=0.001)


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
    d = json.loads(p.to_json())
    assert d["nnz_blocks"] == 256 and d["total_cycles"] == pytest.approx(sum(d["cycles"].values()))
    assert d["speedup_over_dense"] == pytest.approx(p.speedup)
    assert set(d["cycles"]) == set(bs.ipu.cost.PHASES)


def test_cli_plan(tmp_path):
    out = tmp_path / "plan.json"
    cmd = [sys.executable, "-m", "blocksparse", "plan", "--m", "1024", "--k", "512", "--n", "256", "--block", "8",
           "--density", "1/16", "--dtype", "float32", "--machine", "mk2", "--json", str(out)]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    assert "Static block-sparse plan" in res.stdout
    d = json.loads(out.read_text())
    assert d["machine"] == "mk2" and d["dtype"] == "float32" and d["shape"] == [1024, 512]


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


def test_cli_reports_bad_input_without_a_traceback(capsys):
    from blocksparse.__main__ import main

    with pytest.raises(SystemExit) as exit_info:
        main(["plan", "--m", "1000", "--k", "1024", "--n", "64", "--block", "16"])
    assert exit_info.value.code == 2
    assert "to divide the shape (1000, 1024)" in capsys.readouterr().err
