"""The GNN ops' dispatch decisions (``blocksparse.ops.gnn.order``), their tuned data, and ``config=``.

The decisions are asked of ``order``'s public functions under a faked device (``hardware.fake``): the H200's
measured table, and a GPU without one (the documented conservative default). ``config=`` is checked on SpMM
and max / min (attention's ``AttentionConfig`` in test_gnn_attention_variants.py): it reaches the Pallas
kernel (in interpret mode, read off the traced jaxpr), another config traces again, and bad ones are refused.
"""

import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import blocksparse as bs
import blocksparse.gnn as gnn
from blocksparse import hardware
from blocksparse.gnn import GatherConfig, GatherVariant
from blocksparse.ops.gnn import order, registry, tuned

ROOT = Path(__file__).resolve().parent.parent
OTHER = hardware.Device(kind="NVIDIA A100-SXM4-80GB", compute_capability="8.0", num_sms=108)
BOTH = ("pallas", "xla")

# (op, implementation, dtype, config) -> the backends tried, on the H200 (and on any GPU: the orders agree)
ORDERS = [
    ("spmm", None, jnp.float32, None, BOTH),
    ("spmm", None, jnp.bfloat16, None, BOTH),
    ("spmm", None, jnp.float16, None, BOTH),
    ("aggregate", None, jnp.float32, None, BOTH),
    ("aggregate", None, jnp.bfloat16, None, BOTH),
    ("gatv2", None, None, None, BOTH),
    ("graph_attention", None, None, None, BOTH),
    ("spmm", "xla", jnp.float32, None, ("xla",)),
    ("aggregate", ("xla", "pallas"), jnp.float32, None, ("xla", "pallas")),
    ("spmm", None, jnp.float32, GatherConfig(), ("pallas",)),
    ("aggregate", None, jnp.bfloat16, GatherConfig(nodes_per_program=4), ("pallas",)),
    ("gatv2", None, None, gnn.AttentionConfig(), ("pallas",)),
    ("aggregate", ("xla", "pallas"), jnp.float32, GatherConfig(), ("xla", "pallas")),
]


@pytest.mark.parametrize("device", [hardware.H200, OTHER], ids=["h200", "unmeasured"])
@pytest.mark.parametrize("op, implementation, dtype, config, want", ORDERS)
def test_backend_order(device, op, implementation, dtype, config, want):
    with hardware.fake(device):
        assert order.implementations(op, implementation, dtype, config) == want


def test_max_with_arg_takes_four_nodes_within_the_measured_mean_in_degrees():
    """The kernel the max with the arg-max lowers to by default on the H200, by the graph's mean in-degree: bfloat16
    four nodes a program at a mean of 7 (the degree rule would take 8), the rule's 16 at a mean of 3 (outside the
    measured range); float32 the rule's count at both."""
    from blocksparse.ops.gnn.aggregate import pallas_triton as A

    rng = np.random.default_rng(0)
    n = 256
    kernels = {}
    for mean in (3, 7):
        g = gnn.Graph.from_edges(rng.integers(0, n, n * mean), np.repeat(np.arange(n), mean), n)
        for dtype in (jnp.bfloat16, jnp.float32):
            x = jnp.ones((n, 128), dtype)
            with hardware.fake(hardware.H200), bs.interpret():
                jaxpr = str(jax.make_jaxpr(lambda x, g=g: A.segment_extreme(g, x, True))(x))
            kernels[mean, jnp.dtype(dtype).name] = set(re.findall(r"gnn_aggregate_max_x(\d+)", jaxpr))
    assert order.aggregate_nodes_per_program(7) == 8 and order.aggregate_nodes_per_program(3) == 16
    assert kernels == {(7, "bfloat16"): {"4"}, (7, "float32"): {"8"}, (3, "bfloat16"): {"16"}, (3, "float32"): {"16"}}


def test_kernel_defaults_on_the_h200_and_elsewhere():
    with hardware.fake(hardware.H200):
        assert order.spmm_variant(None) == order.spmm_variant(1) == GatherVariant(num_warps=1)
        assert order.aggregate_variant(jnp.float32, False) == (1, GatherVariant(key_reduce=True))
        assert order.aggregate_variant(jnp.bfloat16, False) == (2, GatherVariant(num_warps=2, narrow_loads=True))
        # the tuned two nodes a program, at most the rule's: one from a mean in-degree of 64 (twitch-views: 81)
        assert [order.aggregate_variant(jnp.bfloat16, False, m)[0] for m in (3.3, 6.9, 32, 81)] == [2, 2, 2, 1]
        # with the arg-max: 2-byte features four nodes a program, narrow, on the graphs of the measured range of mean
        # in-degrees (ogbn-arxiv's 6.887 to the power-law graph's 32), the rule's count elsewhere (city-roads-L: 3.3)
        w1n = GatherVariant(num_warps=1, narrow_loads=True)
        assert order.aggregate_variant(jnp.float16, True) == (4, w1n)
        means = (3.3, 6.88, 1_166_243 / 169_343, 32, 32.01)
        assert [order.aggregate_variant(jnp.bfloat16, True, m) for m in means] == [
            (None, w1n), (None, w1n), (4, w1n), (4, w1n), (None, w1n)]  # fmt: skip
        assert [order.aggregate_variant(jnp.float32, True, m) for m in (3.3, 32)] == [
            (None, GatherVariant(num_warps=1))
        ] * 2
        assert order.attention_layout(True) == "flat" and order.attention_edges_per_step(128) == 16
        assert order.attention_narrow_loads() is True
        h200 = [order.spmm_edges_per_step(e, 100, 128) for e in (3200, 3201)]
    assert h200 == [16, 32]
    with hardware.fake(OTHER):  # the plain kernels; the structural rules as measured
        assert order.spmm_variant(None) == GatherVariant()
        assert order.aggregate_variant(jnp.float32, False) == (None, GatherVariant())
        assert order.aggregate_variant(jnp.bfloat16, True) == (None, GatherVariant())
        assert order.attention_layout(True) == "heads" and order.attention_edges_per_step(128) == 32
        assert order.attention_narrow_loads() is False
        assert [order.spmm_edges_per_step(e, 100, 128) for e in (3200, 3201)] == h200
        assert order.aggregate_nodes_per_program(32) == 2 and order.aggregate_one_node_edges(128) == 16
    assert order.spmm_variant(2) is None and order.attention_layout(False) == "heads"
    assert order.attention_edges_per_step(128, gnn.AttentionConfig(edges_per_step=64)) == 64
    assert order.attention_narrow_loads(gnn.AttentionConfig(narrow_loads=False)) is False


def test_cpu_runs_the_planning_default():
    # off a GPU (Pallas' interpreter) the kernels take the planning default's table: the H200's
    assert hardware.gpu().kind == hardware.PLANNING_DEFAULT.kind or jax.default_backend() == "gpu"
    if jax.default_backend() != "gpu":
        assert tuned.entry("spmm.variant") is tuned.TABLES[hardware.PLANNING_DEFAULT.kind]["spmm.variant"]


def test_every_tuned_entry_names_its_benchmark():
    assert set(tuned.DEFAULT) == set(tuned.H200) and set(tuned.TABLES) == {"NVIDIA H200"}
    for name, e in tuned.H200.items():
        assert e.suite in ("gnn", "gnn-variants", "gnn-graphs"), name
        assert e.cell and e.note, name
        assert (ROOT / "benchmarks" / "results" / e.results).is_file(), (name, e.results)
        assert not re.search(r"\d\.\d+ ?ms", e.note), name  # numbers live in the JSON, not here
    with pytest.raises(KeyError, match="tuned GNN entry"):
        tuned.entry("spmm.nope")
    assert tuned.get("spmm.variant", kind="some GPU") == GatherVariant()


def test_the_h100_takes_the_h200s_entries_and_has_its_own_choices(monkeypatch):
    # the same SMs (SAME_SMS): the H200's variants, until the H100 has its own; its measured backends are its own run's
    h100, h200 = hardware.H100.kind, hardware.H200.kind
    assert tuned.SAME_SMS == {h100: h200} and h100 not in tuned.TABLES
    for name in tuned.H200:
        assert tuned.entry(name, kind=h100) is tuned.entry(name, kind=h200), name
    key = ("gatv2", "float32", "fwd+bwd")
    assert tuned.measured(*key, kind=h100) == tuned.CHOICES[h100][key] != tuned.CHOICES[h200][key]
    roads = order.GraphStats(nodes=142_257, edges=463_710, max_in_degree=4)
    got, want = (order.choice("gatv2", roads, 128, jnp.float32, "fwd+bwd", kind=k) for k in (h100, h200))
    assert got.impls == want.impls and got.measured.results == tuned.H100_RUN  # the reason names the H100's run
    assert want.measured.results == tuned.FULL_RUN
    with hardware.fake(hardware.H100):  # the kernels' defaults on an H100: the H200's variants
        assert order.spmm_variant(None) == tuned.H200["spmm.variant"].value
    # a table or choices of its own, partial: what it lacks comes from the H200, an entry (a key) at a time
    own = tuned.Entry(GatherVariant(num_warps=2))
    monkeypatch.setitem(tuned.TABLES, h100, {"spmm.variant": own})
    monkeypatch.setitem(tuned.CHOICES, h100, {("spmm", "float32", "fwd"): ()})
    assert tuned.entry("spmm.variant", kind=h100) is own
    assert tuned.entry("attention.narrow_loads", kind=h100) is tuned.H200["attention.narrow_loads"]
    assert tuned.measured("gatv2", "float32", "fwd+bwd", kind=h100) == tuned.measured("gatv2", "float32", "fwd+bwd")
    monkeypatch.undo()
    a100 = "NVIDIA A100-SXM4-80GB"  # other SMs: the plain kernels and the default order
    assert tuned.entry("spmm.variant", kind=a100) is tuned.DEFAULT["spmm.variant"]
    assert tuned.measured("gatv2", "float32", "fwd+bwd", kind=a100) == ()


def test_registry():
    assert tuple(registry.IMPLEMENTATIONS) == BOTH
    assert registry.module("spmm", "xla").__name__ == "blocksparse.ops.gnn.spmm.reference"
    assert registry.module("attention", "pallas").__name__ == "blocksparse.ops.gnn.attention.pallas_triton"
    with pytest.raises(ValueError, match="op folder"):
        registry.module("gatv2", "xla")
    with pytest.raises(ValueError, match="implementation"):
        registry.module("spmm", "mosaic")


# ---------------------------------------------------------------------------------- config=
@pytest.fixture(scope="module")
def graph():
    return gnn.power_law(32, 160, seed=1)


def _kernels(fn, *args):
    """The Pallas kernels ``fn`` traces (interpret mode): their names and warps."""
    with bs.interpret():
        text = str(jax.make_jaxpr(fn)(*args))
    return set(re.findall(r"name=(gnn_\w+)", text)), set(re.findall(r"num_warps=(\d+)", text))


def test_gather_config_reaches_spmm_and_aggregate(graph):
    x = jnp.ones((32, 8))
    assert _kernels(lambda x: gnn.spmm(graph, x, config=GatherConfig(nodes_per_program=4)), x)[0] == {"gnn_spmm_x4"}
    cfg = GatherConfig(variant=GatherVariant(num_warps=2, prefetch=True))
    assert _kernels(lambda x: gnn.spmm(graph, x, config=cfg), x) == ({"gnn_spmm_v_prefetch_w2"}, {"2"})
    names, _ = _kernels(lambda x: gnn.aggregate(graph, x, "min", config=GatherConfig(nodes_per_program=8)), x)
    assert names == {"gnn_aggregate_min_x8"}
    cfg = GatherConfig(nodes_per_program=1, variant=GatherVariant(key_reduce=True, num_warps=8))
    assert _kernels(lambda x: gnn.aggregate(graph, x, config=cfg), x) == ({"gnn_aggregate_max_v_key_w8"}, {"8"})
    x3 = jnp.ones((32, 2, 16))
    cfg = gnn.AttentionConfig(num_warps=2, edges_per_step=8)
    names, warps = _kernels(jax.grad(lambda q: gnn.graph_attention(graph, q, q, q, config=cfg).sum()), x3)
    assert names == {"gnn_dot_fwd", "gnn_dot_bwd_dst", "gnn_dot_bwd_src"} and warps == {"2"}  # forward and backward
    # the backward of SpMM takes the defaults (the one-node kernel, tuned entry spmm.variant), on Pallas
    grad = jax.grad(lambda x: gnn.spmm(graph, x, config=GatherConfig(nodes_per_program=2)).sum())
    with hardware.fake(hardware.H200):
        assert _kernels(grad, x)[0] == {"gnn_spmm_x2", "gnn_spmm_v_w1"}


def test_gather_config_is_static_and_retraces(graph):
    x = jnp.ones((32, 8))
    traces = []
    run = jax.jit(lambda x, cfg: (traces.append(cfg), gnn.spmm(graph, x, config=cfg))[1], static_argnames="cfg")
    with bs.interpret(), bs.dispatch_log() as log:
        for cfg in (GatherConfig(nodes_per_program=2), GatherConfig(nodes_per_program=4), GatherConfig(2)):
            run.trace(x, cfg=cfg)
    assert traces == [GatherConfig(2), GatherConfig(4)] and log == [("spmm", "pallas")] * 2
    agg = jax.jit(lambda x, cfg: (traces.append(cfg), gnn.aggregate(graph, x, config=cfg))[1], static_argnames="cfg")
    with bs.interpret():
        for cfg in (GatherConfig(1), GatherConfig(8), GatherConfig(1)):
            agg.trace(x, cfg=cfg)
    assert traces[2:] == [GatherConfig(1), GatherConfig(8)]
    assert hash(GatherConfig(2)) == hash(GatherConfig(nodes_per_program=2))
    with bs.interpret():  # every config computes the same sums
        want = gnn.spmm(graph, x, implementation="xla")
        for cfg in (GatherConfig(), GatherConfig(2), GatherConfig(variant=GatherVariant(pairs=True))):
            np.testing.assert_allclose(gnn.spmm(graph, x, config=cfg), want, rtol=1e-6)


def test_config_runs_only_its_backend(graph):
    x = jnp.ones((32, 8))
    if jax.default_backend() != "gpu":  # no GPU and no interpreter: the config's backend refuses, no fallback
        with bs.interpret(False), pytest.raises(NotImplementedError, match="no GPU"):
            gnn.spmm(graph, x, config=GatherConfig())
        with bs.interpret(False), pytest.raises(NotImplementedError, match="no GPU"):
            gnn.aggregate(graph, x, config=GatherConfig())
    with bs.dispatch_log() as log:  # an explicit implementation that includes it: XLA first ignores the config
        gnn.aggregate(graph, x, implementation=("xla", "pallas"), config=GatherConfig(4))
    assert log == [("aggregate", "xla")]


def test_config_errors(graph):
    x = jnp.ones((32, 8))
    with pytest.raises(TypeError, match="Expected config None or a GatherConfig for spmm. Got GatherVariant"):
        gnn.spmm(graph, x, config=GatherVariant())
    with pytest.raises(TypeError, match="a GatherConfig for aggregate. Got AttentionConfig"):
        gnn.aggregate(graph, x, config=gnn.AttentionConfig())
    with pytest.raises(ValueError, match="include 'pallas'"):
        gnn.spmm(graph, x, implementation="xla", config=GatherConfig())
    with pytest.raises(ValueError, match=r"one of \(1, 2, 4, 8, 16\) for spmm"):
        gnn.spmm(graph, x, config=GatherConfig(nodes_per_program=32))
    for bad in (3, 0, 64, True):
        with pytest.raises(ValueError, match="power of two"):
            GatherConfig(nodes_per_program=bad)
    with pytest.raises(TypeError, match="GatherVariant"):
        GatherConfig(variant={"pairs": True})
    with pytest.raises(ValueError, match="op"):
        order.implementations("matmul")
    assert GatherConfig().label == "default" and GatherConfig(2, GatherVariant(num_warps=1)).label == "G2+w1"
    assert GatherConfig(1, GatherVariant(narrow_loads=True)).label == "G1+narrow"
    assert gnn.AttentionConfig(narrow_loads=True).label == "default+narrow"
    with pytest.raises(ValueError, match="narrow_loads"):
        gnn.AttentionConfig(narrow_loads=1)
    assert GatherConfig.backend == gnn.AttentionConfig.backend == "pallas"
