"""Opt-in gather variants (``GatherVariant``) of the SpMM sum and max / min kernels against the XLA references.

Interpret mode on the CPU (``gnn.interpret()``): small graphs with a heavy node split into chunks (extra
units) and isolated nodes; bfloat16, float16 and float32 (where a knob applies only to 2-byte dtypes,
float32 falls back to the plain gather); feature counts that are not a multiple of the tile, odd ones
(the packed kernel's pair gather falls back), and two feature blocks. Max / min must match exactly (values,
NaN, +-inf, ties and the arg positions); sums to float32-accumulation tolerance. CPU checks that every
variant lowers to Triton for CUDA (the ``gnn-variants`` suite's cells run in tests/test_bench.py).
"""

import dataclasses
import re
from pathlib import Path

import gnn_oracle as O
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import sweep

import blocksparse.gnn as gnn
from blocksparse import hardware
from blocksparse.gnn import GatherVariant as V
from blocksparse.ops.gnn import order
from blocksparse.ops.gnn import triton_common as P
from blocksparse.ops.gnn.aggregate import pallas_triton as A
from blocksparse.ops.gnn.aggregate import reference as AR
from blocksparse.ops.gnn.config import check_variant
from blocksparse.ops.gnn.spmm import pallas_triton as S
from blocksparse.ops.gnn.spmm import reference as SR

DTYPES = (jnp.bfloat16, jnp.float16, jnp.float32)
EVERYTHING = V(pairs=True, tile_bytes=True, prefetch=True, key_reduce=True, num_warps=2)
ROOT = Path(__file__).resolve().parent.parent


def _with_arg_rows() -> dict:
    """The arg-max rows of the ``gnn-variants`` suite (:data:`blocksparse.bench.gnn_variants.MAX_WITH_ARG`, after
    its default) as ``name -> (nodes_per_program, GatherVariant or None)``."""
    from blocksparse.bench import gnn_variants

    rows = {"default": (None, None)}
    for name, fields in gnn_variants.MAX_WITH_ARG.items():
        cfg = gnn_variants.gather_config(fields)
        rows[name] = (cfg.nodes_per_program, cfg.variant)
    return rows


def _effective(op, nodes, variant, dtype, with_arg=False):
    """What a kernel runs: float32 ignores ``pairs`` and ``tile_bytes``; the max with arg-max ``key_reduce``; the
    one-node max kernel ``prefetch``."""
    v = variant or V()
    if jnp.dtype(dtype).itemsize == 4:
        v = dataclasses.replace(v, pairs=False, tile_bytes=False)
    if op == "max" and with_arg:
        v = dataclasses.replace(v, key_reduce=False)
    if op == "max" and nodes == 1:
        v = dataclasses.replace(v, prefetch=False)
    return v


@pytest.fixture(scope="module")
def graph():
    """24 nodes: node 2 takes 300 in-edges (split into chunks: extra units), nodes 21-23 are isolated."""
    rng = np.random.default_rng(0)
    n = 24
    src = np.concatenate([rng.integers(0, n - 3, 100), rng.integers(0, n - 3, 300)])
    dst = np.concatenate([rng.integers(0, n - 3, 100), np.full(300, 2)])
    g = gnn.Graph.from_edges(src, dst, n, heavy_quantile=0.5)
    assert g.schedule.num_extra > 0 and np.all(g.in_degree[n - 3 :] == 0)
    return g


@pytest.fixture
def interp():
    with gnn.interpret():
        yield


def _ties(n, f, seed, dtype):
    """Few distinct values (many ties, which go to the first in-edge) with NaN, +inf and -inf planted."""
    x = np.random.default_rng(seed).integers(-2, 3, (n, f)).astype(np.float32)
    x[1, 0], x[4, f - 1], x[7, f // 2], x[9, 1] = np.nan, np.inf, -np.inf, np.inf
    return jnp.asarray(x, dtype)


def _normal(shape, seed, dtype):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


def _as32(a):
    return np.asarray(jnp.asarray(a).astype(jnp.float32))


def _applying(variants, dtype):
    """The variants that change ``dtype``'s kernel: float32 ignores ``pairs`` and ``tile_bytes`` (the fallback
    is the default kernel, which the other GNN tests cover)."""
    if jnp.dtype(dtype).itemsize == 2:
        return variants
    return [v for v in variants if dataclasses.replace(v, pairs=False, tile_bytes=False) != V()]


# ---------------------------------------------------------------------------------- the helpers
def test_variant_validation_and_fallbacks():
    assert check_variant(None) == V() and V().tag() == "" and EVERYTHING.tag() == "pairs+bytes+prefetch+key+w2"
    for bad in (dict(pairs=1), dict(num_warps=3), dict(num_warps=True), dict(key_reduce=None), dict(narrow_loads=1)):
        with pytest.raises(ValueError, match="Expected GatherVariant"):
            V(**bad)
    with pytest.raises(ValueError, match="Expected variant None or a GatherVariant"):
        check_variant({"pairs": True})
    on = V(pairs=True, tile_bytes=True)
    assert on.pair_dtype(jnp.bfloat16, 128) == jnp.bfloat16 and on.pair_dtype(jnp.float16, 20) == jnp.float16
    assert on.pair_dtype(jnp.float32, 128) is None and on.pair_dtype(jnp.bfloat16, 21) is None  # falls back
    assert V().pair_dtype(jnp.bfloat16, 128) is None
    assert (on.edge_scale(jnp.bfloat16), on.edge_scale(jnp.float32), V().edge_scale(jnp.float16)) == (2, 1, 1)
    assert A.packed_tiles(2, 128, scale=2) == (32, 128, 4) and A.packed_tiles(2, 128) == (16, 128, 4)
    assert A.one_node_tiles(128, scale=2) == (32, 128) and A.one_node_tiles(128) == (16, 128)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_pairs_unpack_exactly_and_interleave(dtype):
    vals = np.array([0.0, -0.0, 1.5, -2.25, np.inf, -np.inf, np.nan, 65504.0, 1e-7, -3.0], np.float32)
    x = jnp.asarray(np.resize(vals, (3, 10)), dtype)
    u = P.as_pairs(x)
    assert u.shape == (3, 5) and u.dtype == jnp.uint32
    np.testing.assert_array_equal(np.asarray(u), np.asarray(x).view(np.uint32))  # feature 2k in the low half
    lo, hi = P.unpack_pairs(u, dtype)
    back = P.interleave((lo, hi))
    np.testing.assert_array_equal(np.asarray(back).view(np.uint32), _as32(x).view(np.uint32))  # bit for bit
    assert P.interleave((lo,)) is lo
    lo_inf, hi_inf = P.unpack_pairs(P.pair_bits(-np.inf, dtype)[None], dtype)
    assert lo_inf[0] == -np.inf and hi_inf[0] == -np.inf


def test_order_keys_are_monotone_and_invert():
    v = jnp.asarray([-np.inf, -3e38, -1.0, -1e-45, -0.0, 0.0, 1e-45, 2.0, 3e38, np.inf], jnp.float32)
    for is_max in (True, False):
        k = P.order_key(v, is_max)
        assert np.all(np.diff(np.asarray(k).astype(np.int64)) > 0)  # strictly increasing, -0.0 just below +0.0
        np.testing.assert_array_equal(np.asarray(P.from_key(k, is_max)).view(np.uint32), np.asarray(v).view(np.uint32))
    nan = jnp.asarray([np.nan, -np.nan], jnp.float32)
    assert np.all(np.asarray(P.order_key(nan, True)) == 2**31 - 1) and np.all(
        np.asarray(P.order_key(nan, False)) == -(2**31)
    )
    assert np.all(np.isnan(np.asarray(P.from_key(P.order_key(nan, True), True))))


# ---------------------------------------------------------------------------------- SpMM sum
SPMM_VARIANTS = (V(pairs=True), V(tile_bytes=True), V(prefetch=True, num_warps=2), EVERYTHING)


@sweep("dtype", DTYPES, quick=[jnp.bfloat16], ids=lambda d: jnp.dtype(d).name)  # float32, float16: slow
@sweep("nodes", [None, 2], quick=[None], ids=["one-node", "packed"])  # packed: the extreme tests below
def test_spmm_variants_match_reference(graph, interp, dtype, nodes):
    g, n = graph, graph.num_nodes
    f = 20  # not a multiple of the tile: the one-node kernel pads to 32, the packed one masks
    x, init = _normal((n, f), 1, dtype), _normal((n, f), 2, dtype)
    w = _normal((g.edge_capacity,), 3, dtype)
    tol = 1e-5 if dtype == jnp.float32 else 1e-2  # float32 sums in another order; one rounding to 2 bytes
    want, want_wi = SR.csr_sum(g, None, x), SR.csr_sum(g, w, x, init)
    for v in _applying(SPMM_VARIANTS, dtype):
        got = S.csr_sum(g, None, x, nodes_per_program=nodes, variant=v)
        got_wi = S.csr_sum(g, w, x, init, nodes_per_program=nodes, variant=v)
        assert got.dtype == x.dtype and got.shape == x.shape and got_wi.dtype == x.dtype
        np.testing.assert_allclose(_as32(got), _as32(want), rtol=tol, atol=tol, err_msg=v.tag())
        np.testing.assert_allclose(_as32(got_wi), _as32(want_wi), rtol=tol, atol=tol, err_msg=v.tag())
        np.testing.assert_array_equal(_as32(got)[n - 3 :], 0.0)  # isolated nodes: 0 ...
        np.testing.assert_array_equal(_as32(got_wi)[n - 3 :], _as32(init)[n - 3 :])  # ... or init


@pytest.mark.slow
def test_spmm_pairs_two_feature_blocks_and_odd_features(graph, interp):
    g, n = graph, graph.num_nodes
    for f, nodes in ((130, None), (130, 4), (21, None), (21, 2)):  # two blocks (the second's pair columns offset)
        x, w = _normal((n, f), 4, jnp.bfloat16), _normal((g.edge_capacity,), 5, jnp.bfloat16)
        got = S.csr_sum(g, w, x, x, nodes_per_program=nodes, variant=V(pairs=True))
        np.testing.assert_allclose(_as32(got), _as32(SR.csr_sum(g, w, x, x)), rtol=1e-2, atol=1e-2, err_msg=f"F={f}")


def test_spmm_default_variant_is_the_default_kernel(graph, interp):
    x = _normal((graph.num_nodes, 20), 6, jnp.bfloat16)
    np.testing.assert_array_equal(S.csr_sum(graph, None, x, variant=V()), S.csr_sum(graph, None, x))


NARROW_CASES = [
    ("spmm", None, False, V()),
    ("spmm", 2, False, V(num_warps=1, prefetch=True)),
    ("max", 1, True, V()),
    ("max", 4, False, V(key_reduce=True)),
]  # (op, G, with arg-max, base variant)


@sweep("dtype", [jnp.bfloat16, jnp.float16], quick=[jnp.bfloat16], ids=lambda d: jnp.dtype(d).name)
@sweep("op,nodes,with_arg,base", NARROW_CASES, quick=[NARROW_CASES[0], NARROW_CASES[3]])
def test_narrow_loads_change_no_bit(graph, interp, dtype, op, nodes, with_arg, base):
    # 2-byte rows gathered 4 features a lane: the same column ids, so every kernel's result is bit-identical
    n, f = graph.num_nodes, 40  # one-node kernels: two feature blocks, the second padded; packed: masked
    narrow = dataclasses.replace(base, narrow_loads=True)
    if op == "spmm":
        x, w = _normal((n, f), 9, dtype), _normal((graph.edge_capacity,), 10, dtype)
        got = S.csr_sum(graph, w, x, x, nodes_per_program=nodes, variant=narrow)
        want = S.csr_sum(graph, w, x, x, nodes_per_program=nodes, variant=base)
        np.testing.assert_array_equal(got, want, f"spmm G={nodes} {narrow.tag()}")
        return
    ties = _ties(n, f, 11, dtype)
    got = A.segment_extreme(graph, ties, True, with_arg=with_arg, nodes_per_program=nodes, variant=narrow)
    want = A.segment_extreme(graph, ties, True, with_arg=with_arg, nodes_per_program=nodes, variant=base)
    for a, b in zip(got, want, strict=True):  # (the arg-max is None without it)
        a, b = (None if t is None else _as32(t) for t in (a, b))  # float32: NaN equals NaN
        np.testing.assert_array_equal(a, b, f"max G={nodes} arg={with_arg}")


# ---------------------------------------------------------------------------------- max / min
EXTREME_VARIANTS = (V(pairs=True), V(tile_bytes=True), V(key_reduce=True), EVERYTHING)


def _check_extreme(g, x, is_max, nodes, v, with_arg, refs=None):
    """Values (and arg positions) == the reference, exactly; ``refs``: a dict caching the reference per ``is_max``."""
    refs = {} if refs is None else refs
    if is_max not in refs:
        refs[is_max] = AR.segment_extreme(g, x, is_max)
    want, want_arg = refs[is_max]
    got, arg = A.segment_extreme(g, x, is_max, with_arg=with_arg, nodes_per_program=nodes, variant=v)
    what = f"{'max' if is_max else 'min'} G={nodes} {v.tag()} arg={with_arg}"
    assert got.dtype == x.dtype and got.shape == x.shape, what
    np.testing.assert_array_equal(_as32(got), _as32(want), err_msg=what)  # exact, NaN where the reference has NaN
    if with_arg:
        np.testing.assert_array_equal(arg, want_arg, err_msg=what)
    else:
        assert arg is None


@sweep("dtype", DTYPES, quick=[jnp.float32], ids=lambda d: jnp.dtype(d).name)  # bfloat16 pairs: the spmm tests
@sweep("nodes", [1, 2], quick=[2], ids=["one-node", "packed"])  # one node a program: the spmm tests above
def test_extreme_variants_match_reference_exactly(graph, interp, dtype, nodes):
    x, refs = _ties(graph.num_nodes, 20, 7, dtype), {}
    for i, v in enumerate(EXTREME_VARIANTS):
        if v in _applying(EXTREME_VARIANTS, dtype):
            _check_extreme(graph, x, i % 2 == 0, nodes, v, False, refs)  # key_reduce: the values-only path
            _check_extreme(graph, x, i % 2 == 1, nodes, v, i < 2, refs)


@pytest.mark.slow  # quick: test_spmm_pairs_two_feature_blocks_and_odd_features and the extreme tests above
def test_extreme_pairs_wide_and_odd_features(graph, interp):
    for f, nodes in ((130, 1), (130, 4), (21, 2)):  # two feature blocks; an odd F (pairs fall back when packed)
        x, refs, is_max = _ties(graph.num_nodes, f, 8, jnp.bfloat16), {}, nodes != 4
        _check_extreme(graph, x, is_max, nodes, V(key_reduce=True, pairs=True), False, refs)
        _check_extreme(graph, x, not is_max, nodes, V(pairs=True, tile_bytes=True), True, refs)


@pytest.mark.slow
def test_extreme_all_nan_and_all_inf_nodes(interp):
    # node 0's in-edges all carry NaN, node 1's all -inf, node 2's all +inf; node 3 is isolated
    src, dst = np.array([0, 1, 2, 0, 1, 2, 4, 4]), np.array([0, 0, 1, 1, 2, 2, 4, 4])
    g = gnn.Graph.from_edges(src, dst, 5)
    x = np.zeros((5, 16), np.float32)
    x[0], x[1], x[2], x[4] = np.nan, -np.inf, np.inf, 1.0
    for dtype in (jnp.bfloat16, jnp.float32):
        xd, refs = jnp.asarray(x, dtype), {}
        for nodes in (1, 2):
            for is_max in (True, False):
                _check_extreme(g, xd, is_max, nodes, EVERYTHING, False, refs)
                # the values-only kernels without keys (the 2-byte default's variant; float32: the plain kernel)
                _check_extreme(g, xd, is_max, nodes, V(num_warps=2, narrow_loads=True), False, refs)
                if dtype == jnp.bfloat16:  # (float32 falls back to the default kernel)
                    _check_extreme(g, xd, is_max, nodes, V(pairs=True, prefetch=True), True, refs)


def _arg_grad(g, arg, dout):
    """The max / min backward from ``arg`` (CSR positions, -1: none), in NumPy: each (node, feature) cotangent
    to the source of its arg edge."""
    arg, dout = np.asarray(arg), np.asarray(dout, np.float64)
    dx = np.zeros_like(dout)
    node, feat = np.nonzero(arg >= 0)
    np.add.at(dx, (np.asarray(g.indices)[arg[node, feat]], feat), dout[node, feat])
    return dx


@pytest.mark.slow
@sweep("dtype", [jnp.bfloat16, jnp.float32], quick=[jnp.float32], ids=lambda d: jnp.dtype(d).name)
def test_with_arg_sweep_rows_match_the_oracle(graph, interp, dtype):
    # the kernels of the gnn-variants suite's arg-max cells: values and the arg-max / arg-min positions (through
    # the gradient they route: ties to the first in-edge, NaN to the first NaN) against the NumPy oracle. Rows
    # that differ only in warps (no effect in the interpreter; see the lowering test) or in knobs the dtype or
    # kernel ignores run once; pairs and byte-sized tiles also on two feature blocks.
    g, n = graph, graph.num_nodes
    src, dst = np.asarray(g.src), np.asarray(g.dst)
    seen = set()
    for i, (name, (nodes, v)) in enumerate(_with_arg_rows().items()):
        kernel = (nodes, dataclasses.replace(_effective("max", nodes, v, dtype, True), num_warps=None))
        if kernel in seen:
            continue
        seen.add(kernel)
        reduce = ("max", "min")[i % 2]
        for f in (20, 130) if kernel[1].pairs or kernel[1].tile_bytes else (20,):  # 20: a masked / padded block
            x, dout = _ties(n, f, 10 + i, dtype), _normal((n, f), 9, jnp.float32)
            x64 = _as32(x).astype(np.float64)
            got, arg = A.segment_extreme(g, x, reduce == "max", with_arg=True, nodes_per_program=nodes, variant=v)
            what = f"{reduce} F={f} {name}"
            assert got.dtype == x.dtype and arg.dtype == jnp.int32, what
            np.testing.assert_array_equal(_as32(got), O.extreme(src, dst, n, x64, reduce).astype(np.float32), what)
            want_dx = O.extreme_grad(src, dst, n, x64, dout, reduce)
            np.testing.assert_allclose(_arg_grad(g, arg, dout), want_dx, rtol=1e-6, atol=1e-6, err_msg=what)
    assert len(seen) == (7 if jnp.dtype(dtype).itemsize == 2 else 4)  # the distinct kernels the GPU sweep times


@pytest.mark.slow
def test_with_arg_sweep_rows_lower_to_triton():
    # the GPU sweep's arg-max rows, bfloat16 (pairs and byte-sized tiles apply) and float32, lower for CUDA
    from test_gnn_pallas import _lower_for_cuda, lowering_graph

    g = lowering_graph()
    rows = _with_arg_rows()

    def everything(x, xb):
        outs = []
        for nodes, v in rows.values():
            outs += list(A.segment_extreme(g, xb, True, nodes_per_program=nodes, variant=v))
            outs += list(A.segment_extreme(g, x, False, nodes_per_program=nodes, variant=v))
        return outs

    txt = _lower_for_cuda(everything, jnp.ones((40, 20)), jnp.ones((40, 130), jnp.bfloat16))
    rule = order.aggregate_nodes_per_program(g.edge_capacity / g.num_nodes)
    for name, (nodes, v) in rows.items():
        nodes = nodes or rule
        kernel = "gnn_aggregate_max" + ("" if nodes == 1 else f"_x{nodes}") + (v or V()).name_suffix()
        assert f"{kernel}/" in txt, name  # (the name, not a prefix of a longer one)
    assert txt.count("__gpu$xla.gpu.triton") >= 4 * len(rows)


# ---------------------------------------------------------------------------------- CUDA lowering (CPU)
LOWERED = (
    V(pairs=True), V(tile_bytes=True), V(prefetch=True), V(num_warps=2), V(key_reduce=True), V(narrow_loads=True),
    EVERYTHING,
)  # fmt: skip


def test_spmm_variants_lower_to_triton():
    from test_gnn_pallas import _lower_for_cuda, lowering_graph

    g = lowering_graph()
    w = jnp.ones((g.edge_capacity,), jnp.bfloat16)
    variants = [v for v in LOWERED if not v.key_reduce]

    def everything(x, xb):
        outs = []
        for v in variants:
            outs += [S.csr_sum(g, w, xb, xb, variant=v), S.csr_sum(g, None, xb, nodes_per_program=2, variant=v)]
        return outs + [
            S.csr_sum(g, None, x, variant=EVERYTHING),
            S.csr_sum(g, None, x, nodes_per_program=4, variant=EVERYTHING),
        ]

    txt = _lower_for_cuda(everything, jnp.ones((40, 20)), jnp.ones((40, 130), jnp.bfloat16))
    for v in variants:
        assert txt.count("gnn_spmm" + v.name_suffix()) >= 2 and txt.count("gnn_spmm_x2" + v.name_suffix()) >= 2, v.tag()
    assert txt.count("__gpu$xla.gpu.triton") >= 4 * len(variants) + 4


def test_default_variant_lowers_to_the_measured_kernels(monkeypatch):
    # variant=None is the measured default of each entry point, op for op the same Triton IR as naming it:
    # one warp for the one-node SpMM, the plain packed SpMM, two nodes per program on two warps with narrow loads
    # for the values-only 2-byte max, the plain kernel with arg-max given one node per program, one warp and
    # narrow loads for the packed arg-max kernel by default
    from test_gnn_pallas import _lower_for_cuda, lowering_graph

    try:
        from jax._src.pallas.triton import pallas_call_registration as reg
    except ImportError:  # private API moved
        pytest.skip("jax internals changed")
    g = lowering_graph()
    w = jnp.ones((g.edge_capacity,), jnp.bfloat16)
    modules, lower = [], reg.lowering.lower_jaxpr_to_triton_module

    def capture(*args, **kw):
        res = lower(*args, **kw)
        modules.append(res.module.operation.get_asm(enable_debug_info=False))
        return res

    monkeypatch.setattr(reg.lowering, "lower_jaxpr_to_triton_module", capture)

    def kernels(spmm, packed, values, with_arg, arg_default=None, values_nodes=None):
        def run(xb):
            outs = [S.csr_sum(g, w, xb, xb, variant=spmm), S.csr_sum(g, None, xb, nodes_per_program=2, variant=packed)]
            outs += [A.segment_extreme(g, xb, True, with_arg=False, nodes_per_program=values_nodes, variant=values)[0]]
            outs += list(A.segment_extreme(g, xb, True, variant=arg_default))
            return outs + list(A.segment_extreme(g, xb, False, nodes_per_program=1, variant=with_arg))

        modules.clear()
        _lower_for_cuda(run, jnp.ones((40, 20), jnp.bfloat16))
        return list(modules)

    default = kernels(None, None, None, None)
    with hardware.fake(hardware.H200):
        spmm_default, half_values = order.spmm_variant(None), order.aggregate_variant(jnp.bfloat16, False)
        values_f32, arg_f32 = order.aggregate_variant(jnp.float32, False), order.aggregate_variant(jnp.float32, True)
        arg_bf16 = order.aggregate_variant(jnp.bfloat16, True)
    w2n, w1n = V(num_warps=2, narrow_loads=True), V(num_warps=1, narrow_loads=True)
    assert spmm_default == V(num_warps=1) and half_values == (2, w2n)
    assert kernels(V(num_warps=1), V(), w2n, V(), w1n, values_nodes=2) == default
    assert kernels(V(), V(), w2n, V(), values_nodes=2) != default  # the one-node SpMM's default is not the plain one
    assert kernels(V(num_warps=1), V(), w2n, V(), V(), values_nodes=2) != default  # nor the arg-max's
    # the narrow loads change the kernel's body, not only its name: the same modules with the names taken out differ
    plain = kernels(V(num_warps=1), V(), w2n, V(), V(num_warps=1), values_nodes=2)
    assert [re.sub(r"@[\w$.]+", "@k", m) for m in plain] != [re.sub(r"@[\w$.]+", "@k", m) for m in default]
    assert values_f32 == (1, V(key_reduce=True))
    assert arg_f32 == (None, V(num_warps=1)) and arg_bf16 == (4, w1n)  # (the lowering graph's mean in-degree, 15:
    # four nodes a program by the rule too, so the default's kernels above are the rule's count with w1n)
    assert order.spmm_variant(2) is None  # the packed SpMM: the plain kernel


def test_extreme_variants_lower_to_triton():
    from test_gnn_pallas import _lower_for_cuda, lowering_graph

    g = lowering_graph()

    def everything(x, xb):
        outs = []
        for v in LOWERED:
            outs += [A.segment_extreme(g, xb, True, with_arg=False, nodes_per_program=2, variant=v)[0]]
            outs += list(A.segment_extreme(g, xb, False, nodes_per_program=1, variant=v))
        outs += [A.segment_extreme(g, x, True, with_arg=False, nodes_per_program=1, variant=EVERYTHING)[0]]
        return outs + list(A.segment_extreme(g, x, False, nodes_per_program=4, variant=EVERYTHING))

    txt = _lower_for_cuda(everything, jnp.ones((40, 20)), jnp.ones((40, 130), jnp.bfloat16))
    for v in LOWERED:
        assert txt.count("gnn_aggregate_max_x2" + v.name_suffix()) >= 2, v.tag()
        assert txt.count("gnn_aggregate_min" + v.name_suffix()) >= 2, v.tag()
    assert txt.count("__gpu$xla.gpu.triton") >= 4 * len(LOWERED) + 4
