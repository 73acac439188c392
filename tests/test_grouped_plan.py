"""The grouped plan (``blocksparse.ops.matmul.grouped``): host planning only, no kernel.

The grouping partitions the output rows; each unit's slabs are exactly the union of its rows' columns, and each
slot's block id points at the block of that row and column; the modelled bytes equal a NumPy count from the mask;
the choice never moves more bytes than the ungrouped plan; adversarial patterns; ``x @ W`` groups block columns.
"""

import json
import math

import numpy as np
import pytest
from helpers import examples
from hypothesis import given, settings
from hypothesis import strategies as st

import blocksparse as bs
from blocksparse.ops.matmul.grouped import Grouping, group
from blocksparse.testing import strategies as bst

KINDS = ("random", "full_row", "full_col", "empty_rows", "single", "empty", "full")
BLOCKS = st.sampled_from([(16, 16), (32, 32)])
HEIGHTS = st.sampled_from([(64, 128), (32, 64), (64,)])


def _check(plan):
    """Every invariant of a plan, against the pattern's mask and a NumPy count of the bytes."""
    o = plan.options
    mask = plan.pattern.mask()
    rows_of, cols_of = plan.pattern.rows, plan.pattern.cols
    if o.op == "dds":
        mask = mask.T
    num_rows = mask.shape[0]
    g = plan.group
    assert plan.unit_rows.shape == (plan.num_units, g)
    # A partition of the output rows; row_order is the units' rows one after another, a permutation.
    real = plan.unit_rows[plan.unit_rows >= 0]
    assert sorted(real.tolist()) == list(range(num_rows))
    assert plan.row_order.tolist() == real.tolist()
    assert np.array_equal(np.sort(plan.row_order), np.arange(num_rows))
    assert plan.unit_start[0] == 0 and plan.unit_start[-1] == plan.slabs
    assert (np.diff(plan.unit_start) >= 0).all()
    slabs = 0
    for u in range(plan.num_units):
        rows = plan.unit_rows[u][plan.unit_rows[u] >= 0]
        want = np.flatnonzero(mask[rows].any(axis=0)) if rows.size else np.zeros(0, int)
        got = plan.distinct_cols(u)
        assert got.tolist() == want.tolist()  # exactly the union, ascending
        slabs += want.size
        ids = plan.step_ids[plan.unit_start[u] : plan.unit_start[u + 1]]
        for s, c in enumerate(got):
            for j in range(g):
                r = plan.unit_rows[u, j]
                present = r >= 0 and mask[r, c]
                assert (ids[s, j] >= 0) == present
                if present:  # the block at (row r, column c) of the operand the units group
                    br, bc = (r, c) if o.op == "dsd" else (c, r)
                    assert (rows_of[ids[s, j]], cols_of[ids[s, j]]) == (br, bc)
        assert plan.unit_blocks[u] == mask[rows].sum()
    assert slabs == plan.slabs
    # The bytes, counted from the mask.
    bh, bw = plan.operand.block_size
    nnz = int(mask.sum())
    tiles = -(-o.n // o.tn)
    want = {
        "x": slabs * bw * o.n * o.itemsize,
        "w": nnz * bh * bw * o.itemsize * tiles,
        "out": num_rows * bh * o.n * o.out_itemsize,
    }
    assert dict(plan.bytes) == pytest.approx(want)
    ungrouped = {**want, "x": nnz * bw * o.n * o.itemsize}
    assert dict(plan.ungrouped_bytes) == pytest.approx(ungrouped)
    assert plan.total_bytes <= sum(ungrouped.values())
    assert plan.candidates[0].label == "ungrouped"
    assert all(c.total_bytes <= sum(ungrouped.values()) + 1e-6 for c in plan.candidates)
    assert plan.total_bytes == min(c.total_bytes for c in plan.candidates)
    if g > 1:  # a grouping only where it moves strictly fewer bytes
        assert plan.total_bytes < sum(ungrouped.values())
    flops = 2.0 * nnz * bh * bw * o.n
    assert plan.flops == flops
    if nnz:
        assert plan.bytes_per_flop == pytest.approx(sum(want.values()) / flops)
        assert 0 < plan.fill <= 1
    else:
        assert math.isinf(plan.bytes_per_flop) and plan.group == 1
    json.dumps(plan.to_dict(arrays=True))
    assert "chosen" in plan.report()


@settings(max_examples=examples(200, 40), deadline=None)
@given(bst.block_patterns(block_size=BLOCKS, max_blocks=12, kinds=KINDS), HEIGHTS,
       st.sampled_from(["dsd", "dds"]), st.integers(1, 300), st.sampled_from([64, 128]))  # fmt: skip
def test_grouping_invariants(pattern, heights, op, n, tn):
    _check(group(pattern, Grouping(op=op, n=n, tn=tn, heights=heights)))


@settings(max_examples=examples(100, 20), deadline=None)
@given(bst.block_patterns(block_size=BLOCKS, max_blocks=12, kinds=KINDS), st.sampled_from(["dsd", "dds"]))
def test_candidate_slabs_are_bounded(pattern, op):
    """Each candidate's slabs are no more than the blocks and no fewer than the non-empty columns."""
    plan = group(pattern, Grouping(op=op, n=64, heights=(32, 64, 128)))
    nnz = pattern.nnz_blocks
    cols = plan.operand.mask().any(axis=0).sum()
    for c in plan.candidates:
        assert cols <= c.slabs <= nnz or nnz == 0


def _pattern(mask, b=16):
    return bs.BlockPattern.from_mask(np.asarray(mask, bool), (b, b))


@pytest.mark.parametrize("op", ["dsd", "dds"])
def test_adversarial_patterns(op):
    gm, gk = 10, 7
    one_full_row = np.zeros((gm, gk), bool)
    one_full_row[3] = True
    empty_rows = np.random.default_rng(0).random((gm, gk)) < 0.5
    empty_rows[::2] = False
    one_col = np.zeros((gm, gk), bool)
    one_col[:, 4] = True
    for mask in (one_full_row, empty_rows, one_col, np.zeros((gm, gk), bool), np.ones((gm, gk), bool)):
        _check(group(_pattern(mask), Grouping(op=op, n=100)))


def test_known_plans():
    """One block column: every unit of 8 rows reads it once; one full row: nothing shared, ungrouped;
    empty: ungrouped, infinite bytes per flop, no slabs."""
    one_col = np.zeros((16, 4), bool)
    one_col[:, 2] = True
    plan = group(_pattern(one_col), Grouping(n=128))
    assert (plan.group, plan.slabs, plan.units_sharing) == (8, 2, 2)
    assert plan.x_reduction == 2 / 16 and plan.fill == 1.0
    row = np.zeros((16, 4), bool)
    row[5] = True
    plan = group(_pattern(row), Grouping(n=128))
    assert (plan.group, plan.method, plan.slabs, plan.reduction) == (1, "ungrouped", 4, 1.0)
    empty = group(_pattern(np.zeros((4, 4), bool)), Grouping(n=128))
    assert (empty.group, empty.slabs, empty.reduction) == (1, 0, 1.0) and math.isinf(empty.bytes_per_flop)
    assert empty.to_dict()["bytes_per_flop"] is None


def test_greedy_finds_the_shared_rows():
    """Rows that share columns but sit apart are put together (the permutation), contiguous units cannot."""
    gm, gk = 8, 8
    mask = np.zeros((gm, gk), bool)
    for r in range(gm):
        mask[r, [r % 2, 2 + r % 2, 4 + r % 2]] = True  # even rows share columns 0, 2, 4; odd ones 1, 3, 5
    plan = group(_pattern(mask, 32), Grouping(n=256, heights=(64,)))  # units of 2 block rows of 32
    by_label = {c.label: c.slabs for c in plan.candidates}
    assert by_label == {"ungrouped": 24, "contiguous g=2": 24, "greedy g=2": 12}
    assert (plan.group, plan.method) == (2, "greedy")
    assert all(len({int(r) % 2 for r in rows}) == 1 for rows in plan.unit_rows)
    assert sorted(plan.row_order.tolist()) == list(range(gm))


@pytest.mark.parametrize("op", ["dsd", "dds"])
def test_greedy_finds_shuffled_clusters(op):
    """``BlockPattern.clustered`` (block rows, or columns for ``x @ W``, in clusters of ``128 / b`` that keep the same
    columns, shuffled; the GPU check's patterns): the greedy grouping puts each cluster in one unit, fill 1.0, every
    slab read once per cluster."""
    for b in (16, 32):
        p = bs.BlockPattern.clustered(0, (1024, 1024), b, 1 / 4, axis=1 if op == "dds" else 0)
        plan = group(p, Grouping(op=op, n=256))
        assert (plan.group, plan.method, plan.fill) == (128 // b, "greedy", 1.0), plan
        assert plan.slabs * plan.group == p.nnz_blocks


def test_options_and_errors():
    p = bs.BlockPattern.random(0, (256, 256), (16, 16), 0.25)
    assert group(p, Grouping(n=64)) is group(p, Grouping(n=64))  # cached
    plan = group(p, Grouping(n=64, methods=("contiguous",)))
    assert {c.method for c in plan.candidates} == {"ungrouped", "contiguous"}
    # b = 128 fills a 128-row tile alone: only the ungrouped plan.
    big = bs.BlockPattern.random(0, (512, 512), (128, 128), 0.5)
    assert [c.label for c in group(big, Grouping(n=64)).candidates] == ["ungrouped"]
    with pytest.raises(ValueError, match="op"):
        Grouping(op="sdd")
    with pytest.raises(ValueError, match="n as a positive int"):
        Grouping(n=0)
    with pytest.raises(ValueError, match="methods"):
        Grouping(methods=("best",))
    with pytest.raises(TypeError, match="BlockPattern"):
        group(np.zeros((4, 4)))


def test_report():
    p = bs.BlockPattern.power_law(1, (1024, 512), (16, 16), 1 / 8)
    plan = group(p, Grouping(n=512))
    text = plan.report()
    assert str(plan) == text
    for word in ("Grouped plan for dsd", "W 1024 x 512 @ X 512 x 512", "ungrouped", "greedy g=8", "<- chosen",
                 "tensor-core fill"):  # fmt: skip
        assert word in text
    mirror = group(p, Grouping(op="dds", n=512))
    assert "X 512 x 1024 @ W 1024 x 512" in mirror.report() and "block columns" in mirror.report()
