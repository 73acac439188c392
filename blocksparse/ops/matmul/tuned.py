"""Measured numbers that steer the block-sparse products, as data keyed by device kind.

Layout: :data:`TABLES` maps a device kind (``jax.Device.device_kind``, as :func:`blocksparse.hardware.kind`
reports it: ``"NVIDIA H200"``) to a :class:`Table` of named :class:`Entry` s. :func:`current` is the table of the
GPU plans are made for (:func:`blocksparse.hardware.gpu`: the default device, an H200 for plans made off a GPU,
a faked device under :func:`blocksparse.hardware.fake`), or :data:`CONSERVATIVE` for a kind nobody measured.
Every table has the same names. Each entry says what produced it: the ``blocksparse bench`` suite and cell
(``mosaic``: Mosaic against Triton for ``dsd`` / ``dds`` / ``sdd``, persistent, bands, grid order, split;
``matmul``: dense, static and dynamic products) and the results JSON in ``benchmarks/results/`` behind it.

Speedup tables are ``{(block, size): {density: speedup}}``: Triton's time over the other kernel's, read at the
nearest measured cell on log scales (:func:`nearest_cell`). Code and docstrings cite
an entry by its name; its value lives here only.

:data:`CONSERVATIVE`, for any other device: no Mosaic preference (empty speedup tables: Triton first,
``implementation=None`` never tries a Mosaic kernel before it), the one-program-per-item Mosaic kernel where
one is asked for by name (no persistent speedup, no skew rule), and the H200's tiles elsewhere (a tile changes
the speed, never the result).

Example::

    >>> import blocksparse.hardware as hw
    >>> from blocksparse.ops.matmul import tuned
    >>> with hw.fake(hw.H200):
    ...     tuned.current().kind, tuned.current().entry("PREFER_MARGIN").source.split(":")[0]
    ('NVIDIA H200', 'bench --suite mosaic --full')
"""

from __future__ import annotations

import contextlib
import contextvars
import math

from ... import hardware
from ..tuning import Entry

__all__ = ["CONSERVATIVE", "TABLES", "Entry", "Table", "current", "nearest", "nearest_cell", "override"]


class Table:
    """The entries of one device kind; ``table.NAME`` is an entry's value, :meth:`entry` the entry."""

    def __init__(self, kind: str, entries: dict[str, Entry]):
        self.kind = kind
        self._entries = dict(entries)

    def __getattr__(self, name: str):
        try:
            return self.__dict__["_entries"][name].value
        except KeyError:
            raise AttributeError(f"no tuned entry {name!r} for {self.__dict__.get('kind')!r}") from None

    def entry(self, name: str) -> Entry:
        return self._entries[name]

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def __repr__(self) -> str:
        return f"Table({self.kind!r}, {len(self._entries)} entries)"


_MOSAIC = "bench --suite mosaic --full"
_MATMUL = "bench --suite matmul --full"
_DECODE = "bench --suite decode --full"
_R = "benchmarks/results/"

H200 = Table(
    "NVIDIA H200",
    {
        # Mosaic dsd (W @ x): W 8192 x 8192 of uniform random b x b blocks, x 8192 x n, bf16.
        "MOSAIC_DSD_SPEEDUP": Entry(
            {
                (64, 4096): {1 / 4: 0.96, 1 / 16: 0.92, 1 / 64: 1.11},
                (64, 256): {1 / 4: 1.33, 1 / 16: 1.00, 1 / 64: 0.88},
                (128, 4096): {1 / 4: 1.52, 1 / 16: 1.51, 1 / 64: 1.30},
                (128, 256): {1 / 4: 1.75, 1 / 16: 0.78, 1 / 64: 1.23},
            },
            f"{_MOSAIC}: dsd b=64,128 n=256,4096 d=1/4,1/16,1/64, Mosaic as planned by default against Triton, the "
            f"smaller of two runs ({_R}mosaic_persistent_h200_run1.json, {_R}mosaic_persistent_h200_run2.json)",
        ),
        "MOSAIC_DSD_PERSISTENT_SPEEDUP": Entry(
            {
                (64, 4096): {1 / 4: 0.94, 1 / 16: 0.90, 1 / 64: 1.23},
                (64, 256): {1 / 4: 1.41, 1 / 16: 1.23, 1 / 64: 1.00},
                (128, 4096): {1 / 4: 1.05, 1 / 16: 1.38, 1 / 64: 1.18},
                (128, 256): {1 / 4: 1.73, 1 / 16: 0.98, 1 / 64: 1.52},
            },
            f"{_MOSAIC}: dsd persistent against one program per item, b=64,128 n=256,4096 d=1/4,1/16,1/64, the "
            f"smaller of two runs ({_R}mosaic_persistent_h200_run1.json, {_R}mosaic_persistent_h200_run2.json)",
        ),
        "PREFER_MARGIN": Entry(
            1.05,
            f"{_MOSAIC}: the spread of two runs of one cell (n = 256 times are tens of microseconds); below it a "
            f"tie stays with Triton ({_R}mosaic_persistent_h200_run1.json, {_R}mosaic_persistent_h200_run2.json)",
        ),
        "PREFER_MIN_N": Entry(
            128,
            f"{_MOSAIC}: no dsd cell below n=256 was measured; Mosaic's tiles (>= 64 columns) pad a narrow x more "
            f"than Triton's ({_R}mosaic_persistent_h200_run2.json)",
        ),
        "UNITS_FIRST_BELOW": Entry(
            1 / 32,
            f"{_MOSAIC}: dsd grid order, b=64,128 n=256,4096 d=1/4,1/16,1/64: units first faster at d=1/64 only "
            f"({_R}mosaic_grid_order_h200.json)",
        ),
        "SKEW_SPLIT_SHARE": Entry(
            1 / 4,
            f"{_MOSAIC}: dsd powerlaw against uniform, b=64 n=4096 d=1/4,1/16, persistent / one per item / Triton "
            f"({_R}mosaic_skew_h200_run3.json)",
        ),
        "MOSAIC_TN_WIDE_FROM": Entry(
            2048,
            f"{_MOSAIC}: dsd tn=128 against 256 at n=4096, b=64 d=1/4,1/16 ({_R}mosaic_b64_variants_h200.json)",
        ),
        # Mosaic dds (x @ W): keyed by (b, k): x 32768 x 384 @ W 384 x 1536 and 8192 x 8192 @ 8192 x 8192.
        "MOSAIC_DDS_SPEEDUP": Entry(
            {
                (64, 384): {1 / 4: 1.09, 1 / 8: 0.93, 1 / 16: 0.82},
                (64, 8192): {1 / 4: 1.06, 1 / 8: 1.05, 1 / 16: 1.06},
                (128, 384): {1 / 4: 1.50, 1 / 8: 1.31, 1 / 16: 1.16},
                (128, 8192): {1 / 4: 1.42, 1 / 8: 1.36, 1 / 16: 1.62},
            },
            f"{_MOSAIC}: dds b=64,128 k=384,8192 d=1/4,1/8,1/16, Mosaic as planned by default against Triton, the "
            f"smaller of two runs ({_R}mosaic_dds_persistent_h200_run1.json, "
            f"{_R}mosaic_dds_persistent_h200_run2.json)",
        ),
        "MOSAIC_DDS_PERSISTENT_SPEEDUP": Entry(
            {
                (64, 384): {1 / 4: 1.19, 1 / 8: 0.92, 1 / 16: 0.89},
                (64, 8192): {1 / 4: 0.94, 1 / 8: 0.96, 1 / 16: 0.94},
                (128, 384): {1 / 4: 1.27, 1 / 8: 1.10, 1 / 16: 0.86},
                (128, 8192): {1 / 4: 1.04, 1 / 8: 1.05, 1 / 16: 1.25},
            },
            f"{_MOSAIC}: dds persistent against one program per item, b=64,128 k=384,8192 d=1/4,1/8,1/16 "
            f"({_R}mosaic_dds_persistent_h200_run1.json, {_R}mosaic_dds_persistent_h200_run2.json)",
        ),
        "PREFER_MIN_M": Entry(
            4096,
            f"{_MOSAIC}: no dds cell below m=8192 rows of x was measured ({_R}mosaic_dds_persistent_h200_run1.json)",
        ),
        # Mosaic sdd (the weight gradient).
        "SDD_DEFAULT_TK": Entry(
            64,
            f"{_MOSAIC}: sdd tk=64,128 x stages=3,4, W 8192 x 8192 over 4096 tokens and the inference layer "
            f"({_R}mosaic_sdd_h200_run1.json, {_R}mosaic_sdd_h200_run2.json)",
        ),
        "SDD_DEFAULT_STAGES": Entry(
            3,
            f"{_MOSAIC}: sdd tk=64,128 x stages=3,4 ({_R}mosaic_sdd_h200_run1.json, {_R}mosaic_sdd_h200_run2.json)",
        ),
        "SDD_WAVES": Entry(
            2,
            f"{_MOSAIC}: sdd split against unsplit, W 8192 x 8192 over 4096 tokens and W 384 x 1536 over 32768 "
            f"({_R}mosaic_sdd_h200_run2.json)",
        ),
        "SDD_MIN_SPLIT_STEPS": Entry(
            8,
            f"{_MOSAIC}: sdd splits of the inference layer, W 384 x 1536 over 32768 tokens "
            f"({_R}mosaic_sdd_h200_run2.json)",
        ),
        "SDD_PREFER_MIN_SPLITS": Entry(
            8,
            f"{_MOSAIC}: sdd Mosaic against split Triton, W 384 x 1536 over 32768 tokens b=64,128 d=1/4,1/16,1/64 "
            f"({_R}sdd_triton_split_h200_run1.json, {_R}sdd_triton_split_h200_run2.json)",
        ),
        "SDD_PREFER_BLOCKS": Entry(
            (128,),
            f"{_MOSAIC}: sdd Mosaic against split Triton: b=64 a tie ({_R}sdd_triton_split_h200_run1.json, "
            f"{_R}sdd_triton_split_h200_run2.json)",
        ),
        "SDD_PREFER_MIN_K": Entry(
            4096,
            f"{_MOSAIC}: no sdd cell contracting fewer than 4096 tokens was measured ({_R}mosaic_sdd_h200_run2.json)",
        ),
        # The banded Mosaic kernel (blocks of 16 and 32); dsd keyed by (b, n), dds by (b, k).
        "BANDS_DSD_SPEEDUP": Entry(
            {
                (16, 4096): {1 / 4: 0.57, 1 / 16: 0.43, 1 / 64: 0.55},
                (32, 4096): {1 / 4: 0.95, 1 / 16: 0.82, 1 / 64: 0.70},
                (16, 256): {1 / 4: 0.43, 1 / 16: 0.43, 1 / 64: 0.89},
                (32, 256): {1 / 4: 0.96, 1 / 16: 0.68, 1 / 64: 0.87},
            },
            f"{_MOSAIC}: bands dsd b=16,32 n=256,4096 d=1/4,1/16,1/64, W 8192 x 8192, the smallest of the runs "
            f"({_R}mosaic_bands_dsd_h200.json, {_R}mosaic_bands_dsd_d64_h200_run2.json)",
        ),
        "BANDS_DDS_SPEEDUP": Entry(
            {
                (16, 384): {1 / 4: 0.95, 1 / 8: 0.86, 1 / 16: 0.98},
                (32, 384): {1 / 4: 1.08, 1 / 8: 1.16, 1 / 16: 0.87},
                (16, 8192): {1 / 4: 1.30, 1 / 8: 0.99, 1 / 16: 0.89},
                (32, 8192): {1 / 4: 1.21, 1 / 8: 1.06, 1 / 16: 0.96},
            },
            f"{_MOSAIC}: bands dds b=16,32 k=384,8192 d=1/4,1/8,1/16 ({_R}mosaic_bands_dds_h200.json, "
            f"{_R}mosaic_bands_dds_h200_run2.json, {_R}mosaic_bands_dds_8192_h200.json)",
        ),
        "BANDS_PREFER_MIN": Entry(
            {"dsd": 1024, "dds": 4096},
            f"{_MOSAIC}: bands, no cell below n=256 (dsd) / m=8192 (dds) was measured ({_R}mosaic_bands_dsd_h200.json, "
            f"{_R}mosaic_bands_dds_h200.json)",
        ),
        "BANDS_DEFAULT_STAGES": Entry(
            4, f"{_MOSAIC}: bands stages, dsd b=32 n=4096 ({_R}mosaic_bands_stages_h200.json)"
        ),
        "BANDS_DEFAULT_TILES": Entry(
            (128, 128), f"{_MOSAIC}: bands tiles tm x width, dsd b=32 n=4096 ({_R}mosaic_bands_tiles_h200.json)"
        ),
        # The Triton kernels.
        "TRITON_TN_WIDE_FROM": Entry(
            2048,
            f"{_MATMUL}: static dsd tn=128,256 at n=4096 against n=256, b=16,64 d=1/4 "
            f"({_R}matmul_h200_variants_run1.json, {_R}matmul_h200_variants_run2.json)",
        ),
        "TRITON_TRANSPOSE_ACC_BLOCKS": Entry(
            (32,),
            f"{_MATMUL}: static dsd accT against accN, n=4096 d=1/4 b=16,32,64 ({_R}matmul_h200_variants_run1.json)",
        ),
        "TRITON_SDD_WAVES": Entry(
            4,
            f"{_MOSAIC}: sdd Triton splits, the inference layer W 384 x 1536 over 32768 tokens b=16,32 "
            f"({_R}sdd_triton_split_variants_h200.json)",
        ),
        "TRITON_SDD_MIN_STEPS": Entry(
            32,
            f"{_MOSAIC}: sdd Triton splits, the inference layer W 384 x 1536 over 32768 tokens b=16,32 "
            f"({_R}sdd_triton_split_variants_h200.json)",
        ),
        # The few-token stream kernel (triton/stream.py): its time over the work-list kernel's, both as the busy
        # time per iteration of a profiler trace of the Timer's loop (every launch of the product counted: the
        # work list's pad, walk, combine and slice); keyed by (b, K), K the contracted dimension, n = 1 token.
        "TRITON_STREAM_DDS_SPEEDUP": Entry(
            {
                (16, 4096): {1 / 8: 1.70},
                (16, 14336): {1 / 8: 1.97},
                (32, 4096): {1 / 8: 1.19},
                (32, 14336): {1 / 8: 1.49},
                (64, 4096): {1 / 8: 1.17},
                (64, 14336): {1 / 8: 1.16},
                (128, 4096): {1 / 8: 1.39},
                (128, 14336): {1 / 8: 1.30},
            },
            f"{_DECODE}: x (1, K) @ W (K, N) b=16,32,64,128 d=1/8, K x N = 4096 x 14336 and 14336 x 4096, the "
            f"work list's busy time over the stream kernel's at the tuned warps and stages "
            f"({_R}decode_stream_tune_h200.json)",
        ),
        "TRITON_STREAM_DSD_SPEEDUP": Entry(
            {
                (16, 4096): {1 / 8: 1.11},
                (16, 14336): {1 / 8: 0.83},
                (32, 4096): {1 / 8: 1.11},
                (32, 14336): {1 / 8: 0.61},
                (64, 4096): {1 / 8: 0.97},
                (64, 14336): {1 / 8: 0.68},
                (128, 4096): {1 / 8: 1.14},
            },
            f"{_DECODE}: W (N, K) @ x (K, 1) b=16,32,64,128 d=1/8 (b=128 at K=4096 only: the run was cut "
            f"short), as for dds ({_R}decode_stream_tune_h200.json)",
        ),
        "TRITON_STREAM_MAX_N": Entry(
            64, f"{_DECODE}: no product of more than 64 tokens was measured ({_R}decode_stream_tune_h200.json)"
        ),
        "TRITON_STREAM_PROGRAMS_PER_SM": Entry(
            1,
            f"{_DECODE}: sub-tiles of 16 (tile16) and whole blocks (tile64) against one program per SM at n=1, "
            f"d=1/8: neither faster in any cell ({_R}decode_stream_tune_h200.json)",
        ),
        "TRITON_STREAM_MIN_TILE": Entry(
            32, f"{_DECODE}: tile16 slower than the 32-wide sub-tile at b=32..128 ({_R}decode_stream_tune_h200.json)"
        ),
        "TRITON_STREAM_SPLIT_MIN_BLOCKS": Entry(
            math.inf,
            f"{_DECODE}: x (1, 14336) @ W (14336, 4096) b=32,64 d=1/8, variants split1..split8: 2, 4 and 8 parts "
            f"slower than 1 by busy time in both cells (the counters' memset and the last part's sum cost more than "
            f"the extra programs gain): no split by default ({_R}decode_split_k14336_h200.json)",
        ),
        "TRITON_STREAM_GATES": Entry(
            False,
            f"{_DECODE}: silu glu x (1, 2048) @ W (2048, 16384) b=64 d=1/8: gated in the few-token kernel's store 6.3 "
            f"to 8.8 us by the variants, the product then the gate in XLA 4.1 us; in the pruned decoder's steps "
            f"1,594 tok/s against 1,645 ({_R}decode_glu_walks_h200.json, {_R}decode_gen_glu_h200.json): the gate "
            f"after the product unless TritonConfig(stream=True) asks for the kernel",
        ),
        "TRITON_STREAM_GATES_INPUT": Entry(
            False,
            f"{_DECODE}: silu-gated x (n, 2K) @ W (K, N) at the 1B and 8B down projections (K x N = 8192 x 2048, "
            f"14336 x 4096), n=1,8, b=32,64, d=1/4,1/8: the gate where the few-token kernel loads x 32 to 122 us, the "
            f"gate in XLA then the product 8.9 to 19.2 us busy, in all 12 cells ({_R}decode_gated_input_h200.json): "
            f"the gate in XLA first unless TritonConfig(stream=True) asks for the kernel",
        ),
        "TRITON_STREAM_FMA": Entry(
            False,
            f"{_DECODE}: x (1, K) @ W (K, N) at the 1B and 8B layer shapes, b=32,64, d=1/4,1/8: the CUDA cores faster "
            f"in 2 of 18 cells (b=32 on 2048 x 16384 and 4096 x 14336), up to 2.1x slower in the rest; the 1B decoder "
            f"(b=64 d=1/8, batch 1) 108.2 ms against 77.4 ({_R}decode_stream_fma_h200.json): the dot",
        ),
        "TRITON_STREAM_GROUP": Entry(
            4,
            f"{_DECODE}: 2 and 8 blocks per step within the noise of 4 at n=1 d=1/8 ({_R}decode_stream_tune_h200.json)",
        ),
        "TRITON_STREAM_WARPS": Entry(
            {16: 2, 32: 4, 64: 4, 128: 4},
            f"{_DECODE}: by block: 2 warps faster at b=16 in all four cells, 8 slower everywhere "
            f"({_R}decode_stream_tune_h200.json)",
        ),
        "TRITON_STREAM_STAGES": Entry(
            {16: 3, 32: 5, 64: 5, 128: 5},
            f"{_DECODE}: by block: 5 stages faster than 3 in 10 of the 11 cells of b=32..128, not at b=16 "
            f"({_R}decode_stream_tune_h200.json)",
        ),
        # The grouped Triton kernel (packed operand) as the default of small blocks: W 8192 x 8192 of clustered
        # (rows sharing their columns) and uniform random b x b blocks, x of 4096 columns / rows, bf16.
        "GROUPED_MIN_FILL": Entry(
            {("dds", 16): 0.29, ("dsd", 16): 1.0, ("dds", 32): 1.0},
            "benchmarks/grouped_gpu_check.py --patterns clustered uniform --variants kdef packed packed_tn256: "
            "(op, b) -> the smallest plan fill at which the packed grouped kernel beat the default; x @ W b=16: "
            "1.09x at fill 0.30 (uniform d=1/4), 0.83x at 0.18 (d=1/16), 2.95-3.33x at 1.0 (clustered); W @ x b=16 "
            "and x @ W b=32: faster at fill 1.0 only (1.26-1.27x, 1.05-1.10x); W @ x b=32: slower everywhere "
            f"({_R}grouped_gpu_check_packed_h200.json)",
        ),
        "GROUPED_PREFER_MIN": Entry(
            4096,
            "benchmarks/grouped_gpu_check.py: no x of fewer than 4096 columns / rows was measured "
            f"({_R}grouped_gpu_check_packed_h200.json)",
        ),
        # Roofline ceilings (estimate_seconds).
        "HBM_BYTES_PER_S": Entry(
            3.5e12, f"{_MATMUL}: dense cells, a copy through JAX, read + write counted ({_R}matmul_h200_run4.json)"
        ),
        "BF16_FLOPS": Entry(
            690e12,
            f"{_MATMUL}: dense cells, between jnp.dot at 8192^3 (596 TF/s) and cuBLAS through PyTorch (788) "
            f"({_R}matmul_h200_run4.json)",
        ),
    },
)


def _conservative() -> Table:
    """No Mosaic preference, the per-item Mosaic kernel, the H200's tiles (see the module docstring)."""
    unmeasured = "not measured on this device: the conservative default"
    keep = {"SDD_DEFAULT_TK", "SDD_DEFAULT_STAGES", "SDD_WAVES", "SDD_MIN_SPLIT_STEPS", "BANDS_DEFAULT_STAGES",
            "BANDS_DEFAULT_TILES", "MOSAIC_TN_WIDE_FROM", "TRITON_TN_WIDE_FROM", "TRITON_TRANSPOSE_ACC_BLOCKS",
            "TRITON_SDD_WAVES", "TRITON_SDD_MIN_STEPS", "UNITS_FIRST_BELOW", "HBM_BYTES_PER_S",
            "BF16_FLOPS"}  # fmt: skip
    entries = {}
    for name in H200.names():
        e = H200.entry(name)
        if name in keep:  # tiles and launch orders: safe anywhere
            entries[name] = Entry(e.value, f"{unmeasured}; the H200's: {e.source}")
        elif isinstance(e.value, dict) and name.endswith("SPEEDUP"):  # no claim: Triton first, one program per item
            entries[name] = Entry({}, f"{unmeasured}: no cell")
        else:
            entries[name] = Entry(e.value, f"{unmeasured}; the H200's (unused without a speedup cell): {e.source}")
    entries["SKEW_SPLIT_SHARE"] = Entry(math.inf, f"{unmeasured}: no pattern is taken as skewed")
    entries["SDD_PREFER_BLOCKS"] = Entry((), f"{unmeasured}: no block size is claimed")
    entries["GROUPED_MIN_FILL"] = Entry({}, f"{unmeasured}: the grouped kernel is never the default")
    return Table("conservative default", entries)


#: Device kind -> its table.
TABLES = {H200.kind: H200}
#: The table of a device kind nobody measured.
CONSERVATIVE = _conservative()


_OVERRIDES: contextvars.ContextVar[dict | None] = contextvars.ContextVar("blocksparse_tuned_overrides", default=None)


def current() -> Table:
    """The table of the GPU plans are made for (:func:`blocksparse.hardware.gpu`), else :data:`CONSERVATIVE`; inside
    :func:`override`, a copy with the values it names."""
    table = TABLES.get(hardware.gpu().kind, CONSERVATIVE)
    changed = _OVERRIDES.get()
    if not changed:
        return table
    entries = {name: table.entry(name) for name in table.names()}
    entries.update({name: Entry(value, "tuned.override") for name, value in changed.items()})
    return Table(table.kind, entries)


@contextlib.contextmanager
def override(**values):
    """Within the block, every table reads the named entries as ``values`` (what a benchmark uses to time the
    default as it was before a measured rule: ``override(GROUPED_MIN_FILL={})``). Products traced inside the block
    take the values; a name no table has raises ``KeyError`` naming the entries.

    Example::

        >>> from blocksparse.ops.matmul import tuned
        >>> with tuned.override(GROUPED_PREFER_MIN=1 << 20):
        ...     tuned.current().GROUPED_PREFER_MIN
        1048576
    """
    unknown = sorted(set(values) - set(H200.names()))
    if unknown:
        raise KeyError(f"expected tuned entries among {', '.join(H200.names())}; got {', '.join(unknown)}")
    token = _OVERRIDES.set({**(_OVERRIDES.get() or {}), **values})
    try:
        yield
    finally:
        _OVERRIDES.reset(token)


def nearest(value: float, measured) -> float:
    """The measured point nearest to ``value`` on a log scale: the largest whose geometric midpoint
    with the next smaller point is <= ``value`` (a value on a midpoint goes to the larger point)."""
    points = sorted(measured, reverse=True)
    for hi, lo in zip(points, points[1:], strict=False):  # one pair fewer than points
        if value >= math.sqrt(lo * hi):
            return hi
    return points[-1]


def nearest_cell(table, block: int, size: int, density: float) -> float:
    """The cell of a speedup ``table`` (``{(block, size): {density: speedup}}``) nearest to ``(size, density)``
    on log scales among ``block``'s rows; 0 where the table has no row of that block (no claim).

    Example::

        >>> nearest_cell({(64, 256): {1 / 4: 1.3, 1 / 64: 0.9}, (64, 4096): {1 / 4: 1.0, 1 / 64: 1.1}}, 64, 1000, 1 / 5)
        1.3
    """
    cells = {key[1]: row for key, row in table.items() if key[0] == block}
    if not cells:
        return 0.0
    row = cells[nearest(max(size, 1), cells)]
    return row[nearest(density, row)]
