"""The GNN Pallas kernels against the XLA references: interpret mode on the CPU, real kernels on a GPU,
and a CPU check that every kernel lowers to Triton for CUDA."""

import functools

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import examples, sweep
from hypothesis import given, settings

import blocksparse as bs
import blocksparse.gnn as gnn
from blocksparse import hardware
from blocksparse.bench import check_close
from blocksparse.ops.gnn.spmm.api import accumulate as spmm_into
from blocksparse.testing.graphs import graphs

ON_GPU = jax.default_backend() == "gpu"


def _rand(key, shape, dtype=jnp.float32):
    return jax.random.normal(key, shape, jnp.float32).astype(dtype)


def _ops(g, feat, heads, dim, key):
    """name -> (fn(impl, *args), args, cotangent) for every op."""
    ks = jax.random.split(key, 8)
    x = _rand(ks[0], (g.num_nodes, feat))
    w = jax.random.uniform(ks[1], (g.num_edges,), minval=0.5, maxval=1.5)
    xs, xd, v = (_rand(k, (g.num_nodes, heads, dim)) for k in ks[2:5])
    att = _rand(ks[5], (heads, dim))
    ct = _rand(ks[6], (g.num_nodes, feat))
    cth = _rand(ks[7], (g.num_nodes, heads, dim))
    return {
        "spmm": (lambda impl, x, w: gnn.spmm(g, x, "sum", "both", w, implementation=impl), (x, w), ct),
        "spmm_unweighted": (lambda impl, x: gnn.spmm(g, x, "mean", implementation=impl), (x,), ct),
        "spmm_into": (lambda impl, x, i, w: spmm_into(g, x, i, w, implementation=impl), (x, ct * 0.5, w), ct),
        "max": (lambda impl, x: gnn.aggregate(g, x, "max", implementation=impl), (x,), ct),
        "min": (lambda impl, x: gnn.aggregate(g, x, "min", implementation=impl), (x,), ct),
        "gatv2": (lambda impl, a, b, c: gnn.gatv2(g, a, b, c, implementation=impl), (xs, xd, att), cth),
        "graph_attention": (lambda impl, q, k, v: gnn.graph_attention(g, q, k, v, implementation=impl), (xd, xs, v),
                            cth),
    }  # fmt: skip


@functools.partial(jax.jit, static_argnums=(0, 1))
def _outputs_and_grads(f, impl, args, ct):
    """``f(impl, *args)`` and its VJP of ``ct``, as one program whose arrays are its arguments (closed over, they
    would be constants, and XLA folds a whole reference computation over a large graph's constant indices while
    compiling: minutes on a GPU)."""
    out, vjp = jax.vjp(functools.partial(f, impl), *args)
    return out, vjp(ct)


def _compare(g, feat, heads, dim, key, names=None, rtol=1e-4, atol=1e-4):
    """Each op's outputs and input gradients, Pallas against XLA, each side one jitted function (eager calls
    compile the interpreted kernels' primitives one by one, several times slower; the eager path: test_interpret_bf16,
    test_interpret_forward_only_without_heavy_nodes, test_spmm_into_adds_init_in_the_kernel)."""
    ops = _ops(g, feat, heads, dim, key)
    for name in names or ops:
        f, args, ct = ops[name]
        ref = _outputs_and_grads(f, "xla", args, ct)
        with bs.dispatch_log() as log:
            got = _outputs_and_grads(f, "pallas", args, ct)
        assert {impl for _, impl in log} == {"pallas"}, log
        for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(got), strict=True):
            assert not np.isnan(np.asarray(b, np.float32)).any(), name
            np.testing.assert_allclose(
                np.asarray(b, np.float32), np.asarray(a, np.float32), rtol=rtol, atol=atol, err_msg=name
            )


@pytest.fixture
def interp():
    with gnn.interpret():
        yield


@pytest.mark.slow  # hubs of 129 to 200 in-edges, interpreted; quick: the heavy-chunk tests below
@given(graphs(max_nodes=10, hub_in_degree=(129, 200), heavy_quantile=0.5))
@settings(max_examples=examples(2, quick=1))
def test_interpret_matches_reference_on_awkward_graphs(g):
    with gnn.interpret():
        _compare(g, feat=5, heads=2, dim=3, key=jax.random.key(g.num_edges))


@pytest.mark.slow  # quick: the heavy chunks of test_gnn_dynamic, test_gnn_invalid and the half-precision tests here
def test_interpret_heavy_chunks_and_wide_features(interp):
    # hub of 700 in-edges: 5 chunks of 128 + main; features over one 128-wide block; ties in max
    rng = np.random.default_rng(0)
    src = np.concatenate([rng.integers(0, 12, 700), rng.integers(0, 12, 40)])
    dst = np.concatenate([np.full(700, 3), rng.integers(0, 11, 40)])
    g = gnn.Graph.from_edges(src, dst, 12, heavy_quantile=0.5)
    assert g.schedule.num_extra >= 4 and g.T.schedule.num_extra == 0
    _compare(g, feat=130, heads=1, dim=20, key=jax.random.key(1), names=["spmm", "max", "gatv2"])
    xi = jnp.asarray(rng.integers(-1, 2, (12, 16)), jnp.float32)  # many ties across chunks
    for red in ("max", "min"):

        @jax.jit(static_argnums=1)
        def f(x, impl, red=red):
            out, vjp = jax.vjp(lambda x: gnn.aggregate(g, x, red, implementation=impl), x)
            return out, vjp(x)[0]

        (o1, v1), (o2, v2) = f(xi, "xla"), f(xi, "pallas")
        np.testing.assert_array_equal(o1, o2)
        np.testing.assert_array_equal(v1, v2)


@pytest.mark.slow
def test_interpret_transpose_heavy_sources(interp):
    # one source with a huge out-degree: the backward's source pass splits it into chunks
    rng = np.random.default_rng(1)
    src = np.concatenate([np.zeros(300, int), rng.integers(0, 16, 30)])
    dst = np.concatenate([rng.integers(0, 15, 300), rng.integers(0, 15, 30)])
    g = gnn.Graph.from_edges(src, dst, 16, heavy_quantile=0.5)
    assert g.T.schedule.num_extra >= 2
    _compare(g, feat=8, heads=2, dim=8, key=jax.random.key(2), names=["spmm", "gatv2", "graph_attention"])


@pytest.mark.slow
def test_interpret_bf16(interp):
    g = gnn.power_law(40, 500, seed=5, heavy_quantile=0.5)
    x = _rand(jax.random.key(4), (40, 16), jnp.bfloat16)
    xh = _rand(jax.random.key(5), (40, 2, 8), jnp.bfloat16)
    att = jnp.ones((2, 8), jnp.bfloat16)
    for f in (
        lambda impl: gnn.spmm(g, x, implementation=impl),
        lambda impl: gnn.aggregate(g, x, implementation=impl),
        lambda impl: gnn.gatv2(g, xh, xh, att, implementation=impl),
        lambda impl: jax.jit(  # jitted: eagerly the backward's glue compiles op by op (the forwards: eager)
            jax.grad(lambda q: gnn.graph_attention(g, q, xh, xh, implementation=impl).astype(jnp.float32).sum())
        )(xh),
    ):
        a, b = f("xla"), f("pallas")
        assert b.dtype == jnp.bfloat16
        np.testing.assert_allclose(np.asarray(b, np.float32), np.asarray(a, np.float32), rtol=3e-2, atol=3e-2)


def _kernel_outputs(jaxpr, prefix):
    """The output dtypes of each ``pallas_call`` in ``jaxpr`` (nested jaxprs too) whose name starts with ``prefix``."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "pallas_call" and str(eqn.params.get("name", "")).startswith(prefix):
            found.append(tuple(str(v.aval.dtype) for v in eqn.outvars))
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            found += _kernel_outputs(sub, prefix)
    return found


def test_half_precision_outputs_are_written_in_their_dtype(interp):
    """With heavy nodes in bfloat16: SpMM, the attention forward and the attention backward's per-node gradients write
    bfloat16 rows from their main programs and float32 rows only from the heavy nodes' chunks (rounded once after)."""
    g = _heavy_both_ways()  # heavy nodes in g and in g.T
    x = _rand(jax.random.key(4), (24, 16), jnp.bfloat16)
    xh = _rand(jax.random.key(5), (24, 2, 8), jnp.bfloat16)
    att = jnp.ones((2, 8), jnp.bfloat16)
    spmm = jax.make_jaxpr(lambda x: gnn.spmm(g, x, implementation="pallas"))(x).jaxpr
    assert sorted(_kernel_outputs(spmm, "gnn_spmm")) == [("bfloat16",), ("float32",)], spmm
    loss = lambda a, b: gnn.gatv2(g, a, b, att, implementation="pallas").astype(jnp.float32).sum()  # noqa: E731
    grad = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(xh, xh).jaxpr
    # (out, and the log-sum-exp's two halves) of the main units
    assert sorted(_kernel_outputs(grad, "gnn_gat_fwd"))[0] == ("bfloat16", "float32", "float32")
    dst, src = _kernel_outputs(grad, "gnn_gat_bwd_dst"), _kernel_outputs(grad, "gnn_gat_bwd_src")
    # dxd and att's per-node rows from the main programs, float32 partial rows of both from the heavy chunks
    assert sorted(dst) == [("bfloat16", "float32"), ("float32", "float32")], dst
    assert sorted(src) == [("bfloat16",), ("float32",)], src  # dxs; g.T's heavy chunks
    loss = lambda q, k, v: gnn.graph_attention(g, q, k, v, implementation="pallas").astype(jnp.float32).sum()  # noqa: E731
    grad = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(xh, xh, xh).jaxpr
    assert sorted(_kernel_outputs(grad, "gnn_dot_fwd"))[0] == ("bfloat16", "float32", "float32")
    dst, src = _kernel_outputs(grad, "gnn_dot_bwd_dst"), _kernel_outputs(grad, "gnn_dot_bwd_src")
    assert sorted(dst) == [("bfloat16",), ("float32",)], dst  # dq
    assert sorted(src) == [("bfloat16", "bfloat16"), ("float32", "float32")], src  # dk, dv


def _heavy_both_ways(n=24):
    """Node 3 heavy in ``g`` (300 in-edges: three chunks), node 5 heavy in ``g.T`` (150 more out-edges: two)."""
    rng = np.random.default_rng(3)
    src = rng.integers(0, n, 480)
    src[-150:] = 5
    dst = np.concatenate([rng.integers(0, n, 180), np.full(300, 3)])
    g = gnn.Graph.from_edges(src, dst, n, heavy_quantile=0.9)
    assert g.schedule.num_extra and g.T.schedule.num_extra
    return g


@pytest.mark.parametrize("traced", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["static", "traced"])
def test_attention_backward_rounds_half_precision_gradients_once(interp, traced):
    """The backward in bfloat16 is the float32 backward of the same values rounded once, bit for bit, per node,
    heavy nodes included (in ``g``: ``dxd`` / ``dq``; in ``g.T``: ``dxs`` / ``dk``, ``dv``); ``att``'s gradient is
    float32 and the same."""
    from blocksparse.ops.gnn.attention import pallas_triton as PT

    g = _heavy_both_ways()
    if traced:  # spare capacity: unused heavy slots too
        g = gnn.DynamicGraph.from_graph(g, chunk=g.chunk, max_edges=1500, canonical=False)
    heads, dp, n = 2, 8, g.num_nodes
    keys = jax.random.split(jax.random.key(0), 4)
    xs, xd, dout = (_rand(k, (n, heads * dp), jnp.bfloat16) for k in keys[:3])
    for mode in ("gat", "dot"):
        third = _rand(keys[3], (heads * dp,) if mode == "gat" else (n, heads * dp), jnp.bfloat16)
        out, lse = jax.jit(lambda a, b, c, m=mode: PT.flat_forward(g, m, a, b, c, heads, 0.2, 0.3))(xs, xd, third)
        bwd = jax.jit(lambda a, b, c, o, s, d, m=mode: PT.flat_backward(g, m, a, b, c, o, s, d, heads, 0.2, 0.3))
        half = bwd(xs, xd, third, out, lse, dout)
        f32 = [t.astype(jnp.float32) for t in (xs, xd, third)]  # the same values in float32
        full = bwd(*f32, out, lse, dout.astype(jnp.float32))
        for i, (h, f) in enumerate(zip(half, full, strict=True)):
            if mode == "gat" and i == 2:  # att's gradient: float32 either way
                assert h.dtype == jnp.float32  # summed over edges: the order may differ on a GPU
                np.testing.assert_allclose(h, f, rtol=1e-6, atol=1e-6)
            else:
                assert h.dtype == jnp.bfloat16, (mode, i, h.dtype)
                np.testing.assert_array_equal(np.asarray(h, np.float32), np.asarray(f.astype(jnp.bfloat16), np.float32))


@pytest.mark.parametrize("impl", ["xla", "pallas"])
def test_attention_gradients_exact_with_large_logits(kernels_here, impl):
    """Equal logits of 1e4 to 1e8 and of -1e6 to -1e35 (the log-sum-exp's rounding larger than the weights' digits)
    split the gradient evenly: into a light node (two in-edges) and a heavy one (300, its chunks merged), forward and
    backward. ``q . k = L`` exactly (one feature); the oracle: uniform weights in float64."""
    rng = np.random.default_rng(0)
    n, hub = 40, 7
    src = np.concatenate([[0, 2], rng.integers(0, n, 300)])
    dst = np.concatenate([[1, 1], np.full(300, hub)])
    g = gnn.Graph.from_edges(src, dst, n, heavy_quantile=0.5)
    assert g.schedule.num_extra  # the hub's chunks: merged after the kernel
    v = rng.standard_normal((n, 1, 1)).astype(np.float32)
    ct = np.zeros((n, 1, 1), np.float32)
    ct[1], ct[hub] = 1.5, -0.5
    deg = np.bincount(dst, minlength=n)
    mean_v = np.bincount(dst, v[src, 0, 0].astype(np.float64), minlength=n) / np.maximum(deg, 1)
    want_dv = np.bincount(src, (ct[dst, 0, 0] / deg[dst]).astype(np.float64), minlength=n)
    want_dk = np.bincount(src, ct[dst, 0, 0] / deg[dst] * (v[src, 0, 0] - mean_v[dst]), minlength=n)

    @jax.jit
    def run(q, k, v):
        out, vjp = jax.vjp(lambda k, v: gnn.graph_attention(g, q, k, v, 1.0, implementation=impl), k, v)
        return out, *vjp(jnp.asarray(ct))

    q = jnp.ones((n, 1, 1))
    for logit in (1e4, 1e6, 9e6, 1e8, -1e6, -1e35):  # (the kernels' running maximum once started at -1e30)
        out, dk, dv = run(q, jnp.full((n, 1, 1), logit), jnp.asarray(v))
        np.testing.assert_allclose(out[deg > 0, 0, 0], mean_v[deg > 0], rtol=1e-5, atol=1e-6, err_msg=str(logit))
        np.testing.assert_allclose(dv[:, 0, 0], want_dv, rtol=1e-5, atol=1e-7, err_msg=str(logit))
        np.testing.assert_allclose(dk[:, 0, 0], want_dk, rtol=1e-4, atol=1e-6, err_msg=str(logit))


@pytest.mark.parametrize("mode", ["gat", "dot"])
def test_attention_gradients_of_weightless_destinations_match_xla(kernels_here, mode):
    """A destination whose every logit is ``-inf`` passes nothing back on both backends, heavy (node 0, 139 in-edges
    in chunks) or light (node 3), even with an infinite query or a NaN or infinite cotangent; the two backends'
    gradients agree everywhere, NaN where JAX's autodiff gives NaN too (a weight of 0 times an infinite feature).
    Only node 0's key (GATv2: ``x_src``) is finite; the queries are positive, so the other logits are ``-inf``."""
    n = 140
    src = np.concatenate([np.arange(1, n), [0, 1, 1, 0]])
    dst = np.concatenate([np.zeros(n - 1, int), [2, 2, 3, 4]])
    g = gnn.Graph.from_edges(src, dst, n, heavy_quantile=0.5)
    assert g.schedule.num_extra
    keys = jax.random.split(jax.random.key(3), 3)
    a, b, c = (_rand(k, (n, 2, 8)) for k in keys)
    a = jnp.full_like(a, -jnp.inf).at[0].set(a[0])
    b = jnp.abs(b) + 0.1
    if mode == "dot":
        b = b.at[3].set(jnp.inf)  # node 3 (weightless): an infinite query (GATv2's would make its logits NaN)
    third = jnp.ones((2, 8)) if mode == "gat" else c

    def op(impl, a, b, c):  # gat: x_src, x_dst, att; dot: k, q, v
        if mode == "gat":
            return gnn.gatv2(g, a, b, c, implementation=impl)
        return gnn.graph_attention(g, b, a, c, 1.0, implementation=impl)

    ct = jnp.ones((n, 2, 8)).at[0].set(jnp.nan).at[3].set(jnp.inf)  # what a norm of their 0 output may send back

    @functools.partial(jax.jit, static_argnums=0)
    def grads(impl, a, b, c):
        return jax.vjp(lambda *t: op(impl, *t), a, b, c)[1](ct)

    got = grads("pallas", a, b, third)
    for x, y in zip(got, grads("xla", a, b, third), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6, equal_nan=True)
    np.testing.assert_array_equal(got[1][np.array([0, 3])], 0)  # dx_dst / dq of the weightless
    if mode == "dot":  # dk and dv: no NaN (the weightless' infinite query and its sources' -inf keys meet nowhere)
        assert np.isfinite(got[0]).all() and np.isfinite(got[2]).all()


def test_interpret_forward_only_without_heavy_nodes(interp):
    g = gnn.power_law(30, 200, seed=9, heavy_quantile=1.0)
    assert g.schedule.num_extra == 0
    x = _rand(jax.random.key(6), (30, 16))
    for red in ("max", "min"):
        np.testing.assert_array_equal(
            gnn.aggregate(g, x, red, implementation="pallas"), gnn.aggregate(g, x, red, implementation="xla")
        )
    np.testing.assert_allclose(
        gnn.spmm(g, x, implementation="pallas"), gnn.spmm(g, x, implementation="xla"), rtol=1e-5, atol=1e-5
    )


def _lower_for_cuda(fn, *args):
    """Lower ``fn`` for CUDA on a CPU-only machine: runs the Pallas -> Triton lowering of every kernel.

    The real kernels (not interpreted) through the hardware seam: ``fn`` is traced as on an H200."""
    try:
        from jax._src.pallas.triton import gpu_info
        from jax._src.pallas.triton import pallas_call_registration as reg
    except ImportError:  # private API moved
        pytest.skip("jax internals changed")
    old = reg.gpu_info_lib.get_gpu_info
    reg.gpu_info_lib.get_gpu_info = lambda: gpu_info.get_gpu_info_from_version(gpu_info.GpuVersion.H200)
    try:
        with hardware.fake(hardware.H200), bs.interpret(False):
            exp = jax.export.export(
                jax.jit(fn),
                platforms=["cuda"],
                disabled_checks=[jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")],
            )(*args)
        return exp.mlir_module()
    finally:
        reg.gpu_info_lib.get_gpu_info = old


def lowering_graph(n: int = 40):
    """For CUDA-lowering tests on the CPU (:func:`_lower_for_cuda`): a graph of ``n`` nodes with heavy nodes'
    extra chunks (node 2 takes 300 in-edges). Skips on a GPU, which runs the kernels for real."""
    if ON_GPU:
        pytest.skip("the GPU runs the kernels for real")
    rng = np.random.default_rng(0)
    src = np.concatenate([rng.integers(0, n, 300), rng.integers(0, n, 300)])
    dst = np.concatenate([rng.integers(0, n, 300), np.full(300, 2)])
    g = gnn.Graph.from_edges(src, dst, n, heavy_quantile=0.5)
    assert g.schedule.num_extra > 0
    return g


@pytest.mark.skipif(ON_GPU, reason="the GPU runs the kernels for real")
def test_every_kernel_lowers_to_triton():
    rng = np.random.default_rng(0)
    src = np.concatenate([np.zeros(300, int), rng.integers(0, 16, 300)])
    dst = np.concatenate([rng.integers(0, 15, 300), np.full(300, 2)])
    g = gnn.Graph.from_edges(src, dst, 16, heavy_quantile=0.5)
    x = jnp.ones((16, 24))
    xh = jnp.ones((16, 4, 6), jnp.bfloat16)

    def everything(x, xh):
        outs = []
        for f in (
            lambda x: gnn.spmm(g, x, edge_weight=jnp.ones(g.num_edges), implementation="pallas"),
            lambda x: gnn.aggregate(g, x, "max", implementation="pallas"),
            lambda x: spmm_into(g, x, x, implementation="pallas"),
        ):
            outs.append(jax.vjp(f, x)[1](x))
        fa = lambda a: gnn.gatv2(g, a, a, jnp.ones((4, 6), jnp.bfloat16), implementation="pallas")
        fb = lambda a: gnn.graph_attention(g, a, a, a, implementation="pallas")
        outs += [jax.vjp(fa, xh)[1](xh), jax.vjp(fb, xh)[1](xh)]
        return outs

    txt = _lower_for_cuda(everything, x, xh)
    assert txt.count("__gpu$xla.gpu.triton") >= 12


# ------------------------------------------------------------------------------- real GPU
@pytest.mark.gpu
def test_gpu_matches_reference():
    g = gnn.power_law(3000, 60000, seed=7)
    assert g.schedule.num_extra > 0
    _compare(g, feat=64, heads=4, dim=16, key=jax.random.key(0), rtol=2e-3, atol=2e-3)
    _compare(g, feat=100, heads=3, dim=10, key=jax.random.key(1), rtol=2e-3, atol=2e-3)


@pytest.mark.gpu
def test_gpu_measured_defaults_match_reference():
    """The measured default tilings on the GPU: one head of 128 features (the flat layout, deferred
    reductions), values-only max / min (int32 keys in float32, two warps in bfloat16), max / min with the
    arg-max (one warp, through its gradient) and bfloat16 SpMM (one warp), against XLA."""
    g = gnn.power_law(3000, 60000, seed=7)
    _compare(g, feat=128, heads=1, dim=128, key=jax.random.key(2), names=["gatv2", "graph_attention"],
             rtol=2e-3, atol=2e-3)  # fmt: skip
    for dtype in (jnp.float32, jnp.bfloat16):
        x = _rand(jax.random.key(3), (g.num_nodes, 128)).astype(dtype)
        for reduce in ("max", "min"):
            want = gnn.aggregate(g, x, reduce, implementation="xla")
            got = jax.jit(lambda x, r=reduce: gnn.aggregate(g, x, r, implementation="pallas"))(x)
            np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
            grads = [jax.jit(jax.grad(lambda x, r=reduce, i=impl: gnn.aggregate(g, x, r, implementation=i)
                                      .astype(jnp.float32).sum()))(x) for impl in ("xla", "pallas")]  # fmt: skip
            np.testing.assert_array_equal(np.asarray(grads[1], np.float32), np.asarray(grads[0], np.float32))
    xb = _rand(jax.random.key(4), (g.num_nodes, 128)).astype(jnp.bfloat16)
    with bs.dispatch_log() as log:
        got = gnn.spmm(g, xb)
    assert log == [("spmm", "pallas")]
    want = gnn.spmm(g, xb, implementation="xla")
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=2e-2, atol=2e-2)


def _half_ops(g, att):
    """name -> fn(x (N, 64), implementation) of the ops whose heavy nodes' sums are rounded once (4 heads of 16)."""
    h = lambda x: x.reshape(g.num_nodes, 4, 16)  # noqa: E731
    return {
        "spmm": lambda x, i: gnn.spmm(g, x, implementation=i),
        "gcn": lambda x, i: gnn.spmm(g, x, norm="both", implementation=i),
        "gatv2": lambda x, i: gnn.gatv2(g, h(x), h(x)[::-1], att, implementation=i),
        "graph_attention": lambda x, i: gnn.graph_attention(g, h(x), h(x)[::-1], h(x) / 2, implementation=i),
    }


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_gpu_heavy_nodes_rounded_once_match_xla(dtype):
    """SpMM (plain and the GCN norm) and both attentions, forward and gradients, on graphs with heavy nodes (their
    chunks all float32 extra units, the main output in the features' dtype) and a traced graph with unused heavy
    slots: the kernels against XLA."""
    tol = 3e-3 if dtype == jnp.float32 else 1.5e-2
    for n, e, q in ((3000, 60000, 0.99), (2000, 30000, 0.5)):
        g = gnn.power_law(n, e, seed=3, heavy_quantile=q)
        assert g.schedule.num_extra > 0
        x = _rand(jax.random.key(n), (n, 64), dtype)
        for name, fn in _half_ops(g, _rand(jax.random.key(n + 1), (4, 16), dtype)).items():
            got = jax.jit(lambda x, fn=fn: fn(x, "pallas"))(x)
            assert got.dtype == dtype, (name, n)
            check_close(got, fn(x, "xla"), tol=tol, what=f"{name} on {n} nodes")
            # a random cotangent as an argument: a constant one would let XLA fold its whole backward over the
            # graph's constant indices while compiling (seconds to minutes at these sizes)
            ct = _rand(jax.random.key(n + 2), got.shape)
            grads = [jax.jit(jax.grad(lambda x, ct, fn=fn, i=i: (fn(x, i).astype(jnp.float32) * ct).sum()))(x, ct)
                     for i in ("pallas", "xla")]  # fmt: skip
            check_close(*grads, tol=tol, what=f"{name}'s gradient on {n} nodes")
    g = gnn.power_law(2000, 30000, seed=4)
    ei = np.stack([g.src, g.dst]).astype(np.int32)
    x = _rand(jax.random.key(9), (2000, 64), dtype)

    @jax.jit
    def both(ei, x):
        d = gnn.DynamicGraph.from_edge_index(ei, num_nodes=2000, max_edges=40000, chunk=128)
        return [gnn.spmm(d, x, implementation=i) for i in ("pallas", "xla")]

    check_close(*both(ei, x), tol=tol, what="SpMM on a traced graph")


@pytest.mark.gpu
def test_gpu_default_is_pallas():
    g = gnn.power_law(100, 1000, seed=1)
    x = jnp.ones((100, 32))
    with bs.dispatch_log() as log:
        gnn.aggregate(g, x)
        gnn.gatv2(g, x.reshape(100, 2, 16), x.reshape(100, 2, 16), jnp.ones((2, 16)))
    assert log == [("aggregate", "pallas"), ("gatv2", "pallas")]


@sweep("dynamic", [False, True])
def test_spmm_into_adds_init_in_the_kernel(dynamic):
    """``init + A x`` (the sharded graphs' second part adds itself to the first's rows): equal to the sum of
    ``init`` and the plain product, with gradient ``ct`` for ``init``; heavy nodes' chunks folded on top."""
    g = gnn.power_law(300, 4000, seed=3)
    if dynamic:
        g = gnn.DynamicGraph.from_edge_index(np.stack([g.src, g.dst]), num_nodes=g.num_nodes)
    x, init, ct = (_rand(k, (300, 24)) for k in jax.random.split(jax.random.key(5), 3))
    want = np.asarray(init, np.float64) + np.asarray(gnn.spmm(g, x, implementation="xla"), np.float64)
    for impl in ("xla", "pallas"):
        with gnn.interpret(not ON_GPU):
            out, vjp = jax.vjp(lambda x, i, impl=impl: spmm_into(g, x, i, implementation=impl), x, init)
            dx, dinit = vjp(ct)
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-4, err_msg=impl)
        np.testing.assert_array_equal(dinit, ct)
        np.testing.assert_allclose(dx, gnn.spmm(g.T, ct, implementation="xla"), rtol=1e-5, atol=1e-4)
    with pytest.raises(ValueError, match=r"init of shape \(300, 24\)"):
        spmm_into(g, x, init[:, :3])
    with pytest.raises(ValueError, match=r"edge_weight of shape \(4000,\)"):
        spmm_into(g, x, init, jnp.ones(3999))
