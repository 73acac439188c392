"""The attention kernels' variants (``config=AttentionConfig(...)``) against the XLA reference.

Interpret mode on the CPU: every variant's forward and gradients equal the reference's for one head of
128 features (one head per program: ``flat`` / ``groups`` apply) and eight heads of 16 (``flat`` /
``groups`` run as ``heads``), on a graph with a heavy destination (its in-edges split into chunks), a
heavy source (the backward's source pass splits its out-edges) and isolated nodes. Plus the CUDA
lowering of every variant, the default geometry, argument checks (the ``gnn-variants`` suite's
cells run in tests/test_bench.py).
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import sweep

import blocksparse as bs
import blocksparse.gnn as gnn
from blocksparse import hardware
from blocksparse.ops.gnn.attention import LAYOUTS, AttentionConfig
from blocksparse.ops.gnn.attention import pallas_triton as K

C = AttentionConfig
VARIANTS = {
    "default": C(),  # the measured rule: flat + be16 + deferred for one head of 128, heads + be16 otherwise
    "previous": C(layout="heads", edges_per_step=32, deferred=False),
    "flat": C(layout="flat", edges_per_step=32, deferred=False),
    "groups": C(layout="groups"),
    "deferred": C(layout="heads", deferred=True),
    "groups+deferred+w2": C(layout="groups", deferred=True, num_warps=2),
    "be8+w1": C(edges_per_step=8, num_warps=1),
    "be64+w8": C(edges_per_step=64, num_warps=8),
}
N = 16
ISOLATED = (14, 15)  # neither in- nor out-edges


@pytest.fixture(scope="module")
def graph():
    rng = np.random.default_rng(0)
    heavy_dst = np.stack([rng.integers(0, 14, 200), np.full(200, 3)])  # node 3: 200 in-edges
    heavy_src = np.stack([np.full(150, 5), rng.integers(0, 14, 150)])  # node 5: 150 out-edges
    rest = rng.integers(0, 14, (2, 40))
    src, dst = np.concatenate([heavy_dst, heavy_src, rest], axis=1)
    g = gnn.Graph.from_edges(src, dst, N, heavy_quantile=0.5)
    assert g.schedule.num_extra >= 1 and g.T.schedule.num_extra >= 1  # chunks in both passes
    assert all(g.in_degree[i] == 0 and g.out_degree[i] == 0 for i in ISOLATED)
    return g


def _inputs(h, d, seed):
    ks = jax.random.split(jax.random.key(seed), 5)
    xs, xd, ct = (jax.random.normal(k, (N, h, d), jnp.float32) for k in ks[:3])
    return xs, xd, jax.random.normal(ks[3], (h, d), jnp.float32), ct, jax.random.normal(ks[4], (N, h, d))


def _forward_and_vjp(op, g, a, b, c, ct, impl, config, eager):
    """``op``'s output and its VJP's three gradients, in one jitted function unless ``eager`` (eager calls compile
    the interpreted kernels' primitives one by one: several times slower)."""

    def run(a, b, c, ct):
        out, vjp = jax.vjp(lambda a, b, c: op(g, a, b, c, implementation=impl, config=config), a, b, c)
        return (out, *vjp(ct))

    return (run if eager else jax.jit(run))(a, b, c, ct)


def _gat(g, xs, xd, att, ct, impl, config=None, eager=False):
    return _forward_and_vjp(gnn.gatv2, g, xs, xd, att, ct, impl, config, eager)


def _dot(g, q, k, v, ct, impl, config=None, eager=False):
    return _forward_and_vjp(gnn.graph_attention, g, q, k, v, ct, impl, config, eager)


def _close(got, want, what):
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        a, b = np.asarray(a), np.asarray(b)
        assert np.isfinite(a).all(), f"{what} [{i}]"
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4, err_msg=f"{what} [{i}]")


@sweep(
    "name,shape",
    [(name, shape) for shape in [(1, 128), (8, 16)] for name in VARIANTS],
    quick=[("groups+deferred+w2", (1, 128))],  # the rest: slow (the default geometry: every other attention test)
    ids=lambda v: f"H{v[0]}xD{v[1]}" if isinstance(v, tuple) else None,
)
def test_gatv2_variant_matches_reference(graph, name, shape):
    h, d = shape
    xs, xd, att, ct, _ = _inputs(h, d, seed=h)
    want = _gat(graph, xs, xd, att, ct, "xla")
    with gnn.interpret():
        got = _gat(graph, xs, xd, att, ct, "pallas", VARIANTS[name])
    _close(got, want, f"gatv2 {name} H={h} D={d}")
    for i in ISOLATED:  # no in-edges: output 0; no edges at all: every gradient row 0
        assert not np.asarray(got[0][i]).any() and not np.asarray(got[1][i]).any()


@sweep("name", ["flat", "groups+deferred+w2", "deferred"], quick=1)
def test_graph_attention_variant_matches_reference(graph, name):
    q, k, _, ct, v = _inputs(1, 128, seed=7)
    want = _dot(graph, q, k, v, ct, "xla")
    with gnn.interpret():  # eager here (the others: jitted)
        got = _dot(graph, q, k, v, ct, "pallas", VARIANTS[name], eager=True)
    _close(got, want, f"graph_attention {name}")


@sweep("op", ["gatv2", "graph_attention"], quick=["gatv2"])
@sweep("shape", [(1, 128), (8, 16)], quick=[(1, 128)], ids=lambda s: f"H{s[0]}xD{s[1]}")
def test_narrow_loads_change_no_bit(graph, op, shape):
    # 2-byte rows gathered 4 features a lane: the same column ids, so the forward and all three gradients are
    # bit-identical to the wide loads' (and float32 inputs take the same kernel either way)
    h, d = shape
    xs, xd, att, ct, v = _inputs(h, d, seed=11)
    third = att if op == "gatv2" else v
    args = [a.astype(jnp.bfloat16) for a in (xs, xd, third, ct)]
    run = _gat if op == "gatv2" else _dot
    with gnn.interpret():
        wide = run(graph, *args, "pallas", C(narrow_loads=False))
        narrow = run(graph, *args, "pallas", C(narrow_loads=True))
    for i, (a, b) in enumerate(zip(narrow, wide, strict=True)):
        assert a.dtype == jnp.bfloat16, i
        np.testing.assert_array_equal(np.asarray(a.astype(jnp.float32)), np.asarray(b.astype(jnp.float32)), str(i))
    want = run(graph, *[a.astype(jnp.float32) for a in args], "xla")  # float32 on the same (rounded) inputs
    for i, (a, w) in enumerate(zip(narrow, want, strict=True)):
        w = np.asarray(w)
        np.testing.assert_allclose(np.asarray(a.astype(jnp.float32)), w, rtol=0, atol=0.03 * np.abs(w).max(),
                                   err_msg=f"{op} narrow bf16 [{i}]")  # fmt: skip
    assert K._Shape(h, d, C(narrow_loads=True)).view != K._Shape(h, d, C(narrow_loads=False)).view  # own kernels


@sweep("name", ["default", "groups"], quick=1)
def test_one_head_layouts_with_two_head_blocks_and_padding(graph, name):
    # H = 2 heads of 100 features: padded to 128, one head per program, two head blocks (nblk = 2), so
    # the flattened log-sum-exp is read at node * 2 + block
    xs, xd, att, ct, _ = _inputs(2, 100, seed=3)
    assert K._Shape(2, 128, VARIANTS[name]).nblk == 2
    want = _gat(graph, xs, xd, att, ct, "xla")
    with gnn.interpret():
        got = _gat(graph, xs, xd, att, ct, "pallas", VARIANTS[name])
    _close(got, want, f"gatv2 {name} H=2 D=100")


@pytest.fixture
def h200():
    with hardware.fake(hardware.H200):
        yield


def test_default_geometry_is_the_measured_rule(h200):
    # (heads, Dp) -> (hb, be, warps, layout, deferred): 16 edges per step at 128 features per program, the flat
    # layout with deferred reductions for one head per program; narrower programs keep the old formula
    cases = ((1, 128, 1, 16, 4, "flat", True), (8, 16, 8, 16, 4, "heads", False), (2, 8, 2, 128, 4, "heads", False),
             (1, 4, 1, 128, 2, "heads", False), (1, 256, 1, 16, 4, "flat", True))  # fmt: skip
    for heads, dp, hb, be, warps, layout, deferred in cases:
        sh = K._Shape(heads, dp)
        assert (sh.hb, sh.be, sh.warps, sh.layout, sh.deferred) == (hb, be, warps, layout, deferred), (heads, dp)
        assert vars(K._Shape(heads, dp, C())) == {k: v for k, v in vars(sh).items()}
    prev = K._Shape(1, 128, VARIANTS["previous"])  # every knob explicit: the geometry before the rule
    assert (prev.be, prev.warps, prev.layout, prev.deferred) == (32, 4, "heads", False)
    # flat / groups apply to one head per program only
    assert K._Shape(1, 128, C(layout="flat")).layout == "flat"
    assert K._Shape(8, 16, C(layout="flat")).layout == "heads"
    assert K._Shape(1, 256, C(layout="groups", edges_per_step=64, num_warps=8)).kw()["view"].tshape == (64, 16, 16)


def test_unmeasured_gpu_takes_the_plain_geometry():
    # a GPU without a tuned table (blocksparse.ops.gnn.tuned.DEFAULT): the (be, heads, Dp) view, the tile rule
    other = hardware.Device(kind="NVIDIA A100-SXM4-80GB", compute_capability="8.0", num_sms=108)
    with hardware.fake(other):
        sh = K._Shape(1, 128)
        assert (sh.be, sh.layout, sh.deferred) == (32, "heads", False)
        assert K._Shape(1, 128, C(layout="flat")).layout == "flat"  # a config still sets it


def test_config_is_checked():
    for bad in (dict(layout="rows"), dict(edges_per_step=24), dict(edges_per_step=True), dict(num_warps=3)):
        with pytest.raises(ValueError, match="Expected"):
            C(**bad)
    g, x, att = gnn.power_law(8, 16), jnp.ones((8, 1, 4)), jnp.ones((1, 4))
    with pytest.raises(TypeError, match="Expected config None or an AttentionConfig for gatv2. Got dict"):
        gnn.gatv2(g, x, x, att, config={})
    with pytest.raises(TypeError, match="an AttentionConfig for graph_attention. Got GatherConfig"):
        gnn.graph_attention(g, x, x, x, config=gnn.GatherConfig())
    with pytest.raises(ValueError, match="include 'pallas'"):
        gnn.gatv2(g, x, x, att, implementation="xla", config=C())
    with pytest.raises(TypeError, match="kernel_config"), pytest.warns(DeprecationWarning):
        gnn.gatv2(g, x, x, att, kernel_config={})
    assert C(layout="flat", edges_per_step=16, deferred=True).label == "flat+be16+deferred"
    assert C().label == "default" and C(layout="heads", deferred=False).label == "heads+eager"
    assert set(LAYOUTS) == {"heads", "flat", "groups"}
    assert hash(C()) == hash(C()) and C(num_warps=8) != C()


# Quick: every layout eager and deferred (eight heads run groups as heads: heads + deferred), 8 to 64 edges per
# step, 1 to 8 warps; make test-slow lowers the rest too.
@sweep("name", list(VARIANTS), quick=["default", "groups+deferred+w2"])
def test_every_variant_lowers_to_triton(name):
    from test_gnn_pallas import _lower_for_cuda, lowering_graph

    g = lowering_graph()
    n = g.num_nodes
    cfg = VARIANTS[name]

    def gat(a):
        return gnn.gatv2(g, a, a, jnp.ones(a.shape[1:]), implementation="pallas", config=cfg)

    def dot(a):
        return gnn.graph_attention(g, a, a, a, implementation="pallas", config=cfg)

    def everything(x1, x8):
        outs = [jax.vjp(f, x) for f, x in ((gat, x1), (gat, x8), (dot, x1))]
        return [vjp(o) for o, vjp in outs]

    txt = _lower_for_cuda(everything, jnp.ones((n, 1, 128)), jnp.ones((n, 8, 16)))
    # per call: forward, destination and source passes on main units, and on extra units but the last
    assert txt.count("__gpu$xla.gpu.triton") >= 3 * 5


def test_config_reaches_the_kernels_and_retraces(graph):
    # config= is part of the static argument: another config traces again, and its warps reach the kernels
    xs, xd, att, _, _ = _inputs(1, 16, seed=5)
    traces = []
    run = jax.jit(
        lambda xs, cfg: (traces.append(cfg), gnn.gatv2(graph, xs, xd, att, config=cfg))[1], static_argnames="cfg"
    )
    with gnn.interpret(), bs.dispatch_log() as log:
        jaxprs = [str(run.trace(xs, cfg=c).jaxpr) for c in (C(num_warps=1), C(num_warps=8), C(num_warps=8))]
    assert len(traces) == 2 and log == [("gatv2", "pallas")] * 2  # the third: a cache hit
    assert [set(re.findall(r"num_warps=\d+", j)) for j in jaxprs] == [{"num_warps=1"}, {"num_warps=8"}] * 1 + [
        {"num_warps=8"}
    ]


def test_config_runs_only_the_pallas_backend():
    # implementation=None with a config: the config's backend, no silent fallback (no GPU, no interpreter here)
    g = gnn.power_law(8, 16, seed=0)
    x, att = jnp.ones((8, 1, 4)), jnp.ones((1, 4))
    if jax.default_backend() != "gpu":
        with bs.interpret(False), pytest.raises(NotImplementedError, match="no GPU"):
            gnn.gatv2(g, x, x, att, config=C())
    with bs.interpret(False), bs.dispatch_log() as log:
        gnn.gatv2(g, x, x, att)  # no config: XLA where the kernel cannot run
    assert log[-1][1] == ("pallas" if jax.default_backend() == "gpu" else "xla")


def test_deprecated_kernel_config_warns_and_keeps_its_meaning():
    g = gnn.power_law(8, 16, seed=0)
    x, att = jnp.ones((8, 1, 4)), jnp.ones((1, 4))
    with pytest.warns(DeprecationWarning, match="config=AttentionConfig"), bs.dispatch_log() as log:
        y = gnn.graph_attention(g, x, x, x, implementation="xla", kernel_config=C(layout="flat"))
    assert log == [("graph_attention", "xla")]  # it tunes the kernels, never restricts the implementation
    np.testing.assert_array_equal(y, gnn.graph_attention(g, x, x, x, implementation="xla"))
    with pytest.raises(ValueError, match="not both"), pytest.warns(DeprecationWarning):
        gnn.gatv2(g, x, x, att, config=C(), kernel_config=C())
