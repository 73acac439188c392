"""The dispatch decisions of the block-sparse products: which backend ``implementation=None`` tries first, and which
Mosaic variant runs, on a faked H200 (``blocksparse.hardware.fake``), through ``order.default`` and the Mosaic
backend's plans.

The expected values are those the code gave before the layout moved (every cell of the grid that
produced them was compared line by line after the move): a change here is a change of behaviour, to be measured
first (``blocksparse bench --suite mosaic``, ``benchmarks/grouped_gpu_check.py``) and written into
``blocksparse.ops.matmul.tuned``. One cell changed since, by a measurement: ``x @ W`` at b = 16, d = 1/4 on
uniform blocks, which the grouped kernel's rule now claims (``GROUPED_MIN_FILL``).
"""

from __future__ import annotations

import functools
import itertools

import jax.numpy as jnp
import pytest

import blocksparse as bs
from blocksparse import hardware
from blocksparse.ops.matmul import order, tuned
from blocksparse.ops.matmul.mosaic import backend, bands

MOSAIC = ("mosaic", "pallas", "xla")
DTYPES = {"bf16": jnp.dtype(jnp.bfloat16), "f32": jnp.dtype(jnp.float32)}
DENSITY = {"1/4": 1 / 4, "1/16": 1 / 16, "1/64": 1 / 64}


@functools.cache
def _pattern(name: str) -> bs.BlockPattern:
    """The patterns of the grid: ``"b=64 d=1/4 8192x8192"``, ``"b=64 powerlaw d=1/16 8192x8192"`` (``.T``: its
    transpose), ``"b=32 d=1/4 384x1536"`` (the inference layer), with the grid's seeds."""
    b, *kind, shape = name.split()
    b = int(b[2:])
    if kind[0].startswith("powerlaw"):
        p = bs.BlockPattern.power_law(b, (8192, 8192), (b, b), 1 / 16)
        return p.T if kind[0].endswith(".T") else p
    d = DENSITY[kind[0][2:]]
    if shape == "8192x8192":
        return bs.BlockPattern.random(b * 7 + 1, (8192, 8192), (b, b), d)
    return bs.BlockPattern.random(b + 3, (384, 1536), (b, b), d)


# (op, pattern) -> the (size, w dtype, x dtype, fused) where "mosaic" goes first; every other combination of
# size in (16, 256, 4096), dtypes in (bf16, bf16), (bf16, f32), fused or not keeps ("pallas", "xla").
BOTH = ((4096, "bf16", "bf16", False), (4096, "bf16", "bf16", True))
CLAIMS = {
    ("dds", "b=128 d=1/16 384x1536"): BOTH,
    ("dds", "b=128 d=1/16 8192x8192"): BOTH,
    ("dds", "b=128 d=1/4 384x1536"): BOTH,
    ("dds", "b=128 d=1/4 8192x8192"): BOTH,
    # ("dds", "b=16 d=1/4 8192x8192"): the banded kernel before the grouped kernel's rule claimed it (plan fill 0.30)
    ("dds", "b=32 d=1/4 384x1536"): BOTH,  # the banded kernel
    ("dds", "b=32 d=1/4 8192x8192"): BOTH,
    ("dds", "b=64 d=1/4 8192x8192"): BOTH,
    ("dds", "b=64 d=1/64 8192x8192"): BOTH,
    ("dds", "b=64 powerlaw d=1/16 8192x8192"): BOTH,
    ("dds", "b=64 powerlaw.T d=1/16 8192x8192"): BOTH,
    ("dsd", "b=128 d=1/16 384x1536"): BOTH,
    ("dsd", "b=128 d=1/16 8192x8192"): ((256, "bf16", "bf16", False), *BOTH),  # 256 unfused: skewed, persistent
    ("dsd", "b=128 d=1/4 384x1536"): ((256, "bf16", "bf16", False), (256, "bf16", "bf16", True), *BOTH),
    ("dsd", "b=128 d=1/4 8192x8192"): ((256, "bf16", "bf16", False), (256, "bf16", "bf16", True), *BOTH),
    ("dsd", "b=64 d=1/4 8192x8192"): ((256, "bf16", "bf16", False), (256, "bf16", "bf16", True)),
    ("dsd", "b=64 d=1/64 8192x8192"): BOTH,
    ("dsd", "b=64 powerlaw d=1/16 8192x8192"): ((256, "bf16", "bf16", False),),  # skewed: plain products only
    ("dsd", "b=64 powerlaw.T d=1/16 8192x8192"): ((256, "bf16", "bf16", False),),
    ("sdd", "b=128 d=1/16 384x1536"): ((4096, "bf16", "bf16", False),),
    ("sdd", "b=128 d=1/4 384x1536"): ((4096, "bf16", "bf16", False),),
}
PATTERNS = sorted({p for _, p in CLAIMS} | {"b=32 d=1/4 384x1536"})


def test_default_order_on_an_h200():
    """Every cell of the table: Mosaic first exactly where it claimed the product before the move."""
    with hardware.fake(hardware.H200):
        for op, name in itertools.product(order.OPS, PATTERNS):
            want = set(CLAIMS.get((op, name), ()))
            for size, (w, x), fused in itertools.product((16, 256, 4096), (("bf16", "bf16"), ("bf16", "f32")),
                                                         (False, True)):  # fmt: skip
                if op == "sdd" and fused:
                    continue
                got = order.default(op, _pattern(name), size, DTYPES[w], DTYPES[x], fused=fused)
                assert got == (MOSAIC if (size, w, x, fused) in want else order.DEFAULT), (op, name, size, w, x, fused)


# (op, pattern, size, fused) -> the Mosaic variant its backend runs (the plan's persistent kernel, launch order,
# tile, stages; the banded kernel's tiles), as before the move.
VARIANTS = [
    ("dsd", "b=64 d=1/4 8192x8192", 256, False, "dsd persistent=True grid_order=tiles tn=128 stages=3 programs=256"),
    ("dsd", "b=64 d=1/4 8192x8192", 256, True, "dsd persistent=False grid_order=tiles tn=128 stages=3"),
    ("dsd", "b=64 d=1/4 8192x8192", 4096, False, "dsd persistent=False grid_order=tiles tn=128 stages=3"),
    ("dsd", "b=64 d=1/64 8192x8192", 256, False, "dsd persistent=False grid_order=units tn=128 stages=3"),
    ("dsd", "b=64 d=1/64 8192x8192", 4096, False, "dsd persistent=True grid_order=tiles tn=128 stages=3 programs=264"),
    ("dsd", "b=64 d=1/64 8192x8192", 4096, True, "dsd persistent=False grid_order=units tn=128 stages=3"),
    ("dsd", "b=64 powerlaw d=1/16 8192x8192", 256, False,
     "dsd persistent=True grid_order=tiles tn=128 stages=3 programs=264"),
    ("dsd", "b=64 powerlaw d=1/16 8192x8192", 4096, False, "dsd persistent=False grid_order=tiles tn=128 stages=3"),
    ("dsd", "b=128 d=1/4 8192x8192", 256, False, "dsd persistent=True grid_order=tiles tn=64 stages=3 programs=132"),
    ("dds", "b=64 d=1/4 8192x8192", 4096, False, "dds persistent=False grid_order=units tm=128 stages=3"),
    ("dds", "b=128 d=1/4 384x1536", 4096, False, "dds persistent=True grid_order=units tm=128 stages=3 programs=132"),
    ("dds", "b=128 d=1/4 384x1536", 4096, True, "dds persistent=False grid_order=units tm=128 stages=3"),
    ("dsd", "b=32 d=1/4 384x1536", 4096, False, "bands tm=128 width=128 stages=4"),
    ("dds", "b=32 d=1/4 384x1536", 256, True, "bands tm=128 width=128 stages=4"),
]  # fmt: skip


def _variant(op, p, size, fused) -> str:
    if backend.takes(p):
        q = bands.plan(p, size, 2, None, 1024 if fused else 0, 2, transposed=op == "dsd")
        return f"bands tm={q.tm} width={q.width} stages={q.stages}"
    q = (backend.dsd_plan if op == "dsd" else backend.dds_plan)(p, size, 2, None, 0, 2, fused=fused)
    tile = f"tn={q.tn}" if op == "dsd" else f"tm={q.tm}"
    programs = "" if q.persistent is None else f" programs={q.persistent.programs}"
    return f"{op} persistent={q.persistent is not None} grid_order={q.grid_order} {tile} stages={q.stages}{programs}"


@pytest.mark.parametrize("op,name,size,fused,want", VARIANTS, ids=lambda v: str(v).replace(" ", ""))
def test_mosaic_variant_on_an_h200(op, name, size, fused, want):
    with hardware.fake(hardware.H200):
        assert _variant(op, _pattern(name), size, fused) == want


def test_off_hopper_and_unmeasured_devices_keep_triton_first():
    """No Hopper GPU (this machine, an A100): the default order everywhere; a Hopper nobody measured (an H100):
    the conservative table, no Mosaic claim, and the one-program-per-item Mosaic kernel where one is asked for."""
    h100 = hardware.H100
    a100 = hardware.Device(kind="NVIDIA A100-SXM4-80GB", compute_capability="8.0", num_sms=108)
    for device in (None, a100, h100):
        with hardware.fake(device) if device is not None else _nothing():
            for (op, name), claims in CLAIMS.items():
                size, w, x, fused = claims[0]
                assert order.default(op, _pattern(name), size, DTYPES[w], DTYPES[x], fused=fused) == order.DEFAULT
    with hardware.fake(h100):
        assert tuned.current() is tuned.CONSERVATIVE
        assert _variant("dsd", _pattern("b=64 d=1/64 8192x8192"), 4096, False).startswith("dsd persistent=False")
        assert _variant("dds", _pattern("b=128 d=1/4 384x1536"), 4096, False).startswith("dds persistent=False")
    with hardware.fake(hardware.H200):
        assert tuned.current() is tuned.H200


def test_override_changes_the_named_entries_inside_the_block_only():
    with hardware.fake(hardware.H200):
        with tuned.override(GROUPED_MIN_FILL={}), tuned.override(GROUPED_PREFER_MIN=1):  # nested: both apply
            t = tuned.current()
            assert t.kind == "NVIDIA H200" and t.GROUPED_MIN_FILL == {} and t.GROUPED_PREFER_MIN == 1
            assert t.PREFER_MARGIN == tuned.H200.PREFER_MARGIN  # the rest as measured
        assert tuned.current() is tuned.H200
    with pytest.raises(KeyError, match="got NOT_AN_ENTRY"), tuned.override(NOT_AN_ENTRY=1):
        pass


def _nothing():
    import contextlib

    return contextlib.nullcontext()


def test_every_table_has_the_same_entries_and_names_its_source():
    for table in (*tuned.TABLES.values(), tuned.CONSERVATIVE):
        assert table.names() == tuned.H200.names()
        for name in table.names():
            assert table.entry(name).source, name
    for name in tuned.H200.names():
        source = tuned.H200.entry(name).source
        suites = ("bench --suite mosaic", "bench --suite matmul", "bench --suite decode",
                  "benchmarks/grouped_gpu_check.py")  # fmt: skip
        assert source.startswith(suites) and "benchmarks/results/" in source
    assert order.of_product("dsd", None, jnp.bfloat16, jnp.zeros((8, 8))) == order.DEFAULT  # a dynamic matrix
    with pytest.raises(ValueError, match="Expected op in"):
        order.default("spmm", _pattern("b=32 d=1/4 384x1536"), 16, jnp.bfloat16, jnp.bfloat16)
