"""One block-sparse matrix partitioned over the devices of a mesh axis (bs.shard): products and
gradients equal the single-device ones for every split, the outputs are sharded as documented, and
bad input gives errors naming the expected and the actual values. 4 CPU devices (see conftest.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import sweep
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import blocksparse as bs
from blocksparse import hardware

needs_4 = pytest.mark.skipif(len(jax.devices()) < 4, reason="needs 4 devices")
SPLITS = [("rows", None), ("cols", "psum"), ("cols", "psum_scatter"), (None, None)]


def _mesh(n=4, name="d"):
    return Mesh(np.array(jax.devices()[:n]), (name,))


def _matrix(key, kind, shape=(128, 96), block=(16, 8)):
    gm, gk = shape[0] // block[0], shape[1] // block[1]
    rng = np.random.default_rng(0)
    mask = np.zeros((gm, gk), bool)
    if kind == "random":
        mask = rng.random((gm, gk)) < 0.3
    elif kind == "one_row":  # every block in one block row: one device holds them all (rows split)
        mask[3] = True
    elif kind == "one_col":
        mask[:, 5] = True
    elif kind == "first_rows":  # the last devices get no block under either split
        mask[:2, :2] = True
    values = jax.random.normal(key, shape)
    return bs.BlockSparseMatrix.from_mask(mask, values, block)


def _loss(f):
    return lambda W, x: jnp.sum(jnp.sin(f(W, x)))


@needs_4
@sweep(
    "split,collective,kind",
    [(s, c, k) for s, c in SPLITS for k in ["random", "one_row", "one_col", "first_rows", "empty"]],
    quick=[("rows", None, "one_row"), ("cols", "psum_scatter", "first_rows")],
)  # fmt: skip
def test_products_and_gradients_match_one_device(getkey, kind, split, collective):
    mesh = _mesh()
    W = _matrix(getkey(), kind)
    Ws = bs.shard(W, mesh, "d", split=split, collective=collective)
    assert sum(Ws.plan.blocks_per_device) == W.nnz_blocks
    np.testing.assert_array_equal(Ws.to_dense(), W.to_dense())
    x = jax.random.normal(getkey(), (96, 12))
    xt = jax.random.normal(getkey(), (3, 2, 128))

    y = jax.jit(lambda Ws, x: bs.sharding.matmul(Ws, x))(Ws, x)
    np.testing.assert_allclose(y, W @ x, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(jax.jit(bs.matmul)(Ws, x), W @ x, rtol=1e-5, atol=1e-5)  # bs.matmul hands it on
    # Eagerly (shard_map runs op by op: seconds) for the random pattern, every split under make test-slow.
    left = bs.matmul if kind == "random" else jax.jit(bs.matmul)
    np.testing.assert_allclose(left(xt, Ws), xt @ W, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(jax.jit(lambda Ws, x: x @ Ws)(Ws, xt), xt @ W, rtol=1e-5, atol=1e-5)

    # Gradients w.r.t. x and the values, for W @ x and x @ W; the values' gradient is laid out like Ws.data.
    for product, dense in [(lambda W, x: W @ x, x), (lambda W, x: x @ W, xt)]:
        grads = lambda W, d, x, f=product: jax.grad(lambda d, x: _loss(f)(W.with_data(d), x), (0, 1))(d, x)  # noqa: E731
        gd, gx = jax.jit(grads)(Ws, Ws.data, dense)
        g1d, g1x = jax.jit(grads)(W, W.data, dense)
        np.testing.assert_allclose(gx, g1x, rtol=1e-5, atol=1e-5)
        expected = bs.shard(W.with_data(g1d), mesh, "d", split=Ws.split, collective=collective).data
        np.testing.assert_allclose(gd, expected, rtol=1e-5, atol=1e-5)


@needs_4
def test_shard_inside_jit_is_differentiable_wrt_static_values(getkey):
    mesh = _mesh()
    W = _matrix(getkey(), "random")
    x = jax.random.normal(getkey(), (96, 8))
    f = lambda d: jnp.sum(jnp.sin(bs.shard(W.with_data(d), mesh, "d", split="cols") @ x))  # noqa: E731
    expected = jax.grad(lambda d: jnp.sum(jnp.sin(W.with_data(d) @ x)))(W.data)
    np.testing.assert_allclose(jax.jit(jax.grad(f))(W.data), expected, rtol=1e-5, atol=1e-5)


@needs_4
def test_output_sharding(getkey):
    mesh = _mesh()
    x = jax.random.normal(getkey(), (96, 8))
    W = _matrix(getkey(), "random")
    f = jax.jit(lambda Ws, x: Ws @ x)
    by_rows, replicated = NamedSharding(mesh, P("d")), NamedSharding(mesh, P())
    assert f(bs.shard(W, mesh, "d", split="cols", collective="psum_scatter"), x).sharding.is_equivalent_to(by_rows, 2)
    assert f(bs.shard(W, mesh, "d", split="cols", collective="psum"), x).sharding.is_equivalent_to(replicated, 2)
    # Rows split: equal ranges of block rows keep the output sharded by rows; unequal ones gather it.
    uniform = _matrix(getkey(), "one_col")  # one block per block row: 2 block rows per device
    Ws = bs.shard(uniform, mesh, "d", split="rows")
    assert Ws.plan.uniform and Ws.collective is None
    assert f(Ws, x).sharding.is_equivalent_to(by_rows, 2)
    Ws = bs.shard(_matrix(getkey(), "one_row"), mesh, "d", split="rows", balance="blocks")
    assert Ws.collective == "all_gather" and Ws.plan.blocks_per_device.count(0) == 3
    assert f(Ws, x).sharding.is_equivalent_to(replicated, 2)
    # Any placement of x is accepted; the product reshards it.
    x_by_cols = jax.device_put(x, NamedSharding(mesh, P(None, "d")))
    np.testing.assert_allclose(f(bs.shard(W, mesh, "d"), x_by_cols), W @ x, rtol=1e-5, atol=1e-5)


@needs_4
def test_split_choice_is_the_fastest_estimate_and_blocks_balance(getkey):
    mesh = _mesh()
    W = _matrix(getkey(), "random")
    Ws = bs.shard(W, mesh, "d")
    plan = Ws.plan
    assert len(plan.candidates) == 4  # rows / cols x balanced by blocks / by lines
    assert plan.estimated_seconds == min(c.seconds for c in plan.candidates)
    chosen = next(c for c in plan.candidates if c.seconds == plan.estimated_seconds)
    assert (Ws.split, Ws.collective, Ws.estimated_bytes, plan.cuts) == (
        chosen.split, chosen.collective, chosen.bytes_received, chosen.cuts)  # fmt: skip
    assert Ws.plan.bytes_for(10) == 10 * Ws.estimated_bytes
    assert Ws.plan.seconds_for(10) == pytest.approx(10 * plan.estimated_seconds)
    # Balanced by blocks: devices differ by at most one block line's blocks.
    Wb = bs.shard(W, mesh, "d", split="cols", balance="blocks")
    assert max(Wb.blocks_per_device) - min(Wb.blocks_per_device) <= max(np.bincount(W.pattern.cols))
    # Equal numbers of block rows: no collective for the rows split, output sharded by rows.
    Wl = bs.shard(W, mesh, "d", split="rows", balance="lines")
    assert Wl.collective is None and Wl.plan.uniform and Wl.estimated_bytes == 0
    # x sharded by rows: the rows split must gather it, so it receives bytes for x.
    Wx = bs.shard(W, mesh, "d", split="rows", balance="lines", x_placement="sharded")
    assert Wx.estimated_bytes > 0
    with pytest.raises(ValueError, match="balance 'blocks', 'lines' or None. Got 'even'"):
        bs.shard(W, mesh, "d", balance="even")
    with pytest.raises(ValueError, match="x_placement 'replicated' or 'sharded'. Got 'P'"):
        bs.shard(W, mesh, "d", x_placement="P")
    # One full block column: the cols split puts every block on one device, the rows split is even.
    Ws = bs.shard(_matrix(getkey(), "one_col"), mesh, "d", split="rows")
    assert Ws.blocks_per_device == (2, 2, 2, 2)
    assert Ws.data.sharding.is_equivalent_to(NamedSharding(mesh, P("d")), 4)
    assert Ws.data.shape == (4, 2, 16, 8)


def test_any_number_of_devices(getkey):
    """The docs' promise: the same code with however many devices exist, one included."""
    for n in sorted({1, len(jax.devices())}):
        mesh = _mesh(n)
        W = _matrix(getkey(), "random")
        x = jax.random.normal(getkey(), (96, 8))
        for split, collective in SPLITS:
            Ws = bs.shard(W, mesh, "d", split=split, collective=collective)
            np.testing.assert_allclose(jax.jit(lambda Ws, x: Ws @ x)(Ws, x), W @ x, rtol=1e-5, atol=1e-5)


@sweep("split,collective", SPLITS)
def test_one_device_mesh(getkey, split, collective):
    """A mesh of one device: both products and their gradients are the one-device ones, with no
    collective in the program (one part holds every block; psum over one device is the identity)."""
    mesh = _mesh(1)
    W = _matrix(getkey(), "random")
    Ws = bs.shard(W, mesh, "d", split=split, collective=collective)
    assert Ws.plan.blocks_per_device == (W.nnz_blocks,) and Ws.plan.uniform
    x = jax.random.normal(getkey(), (96, 8))
    xt = jax.random.normal(getkey(), (3, 128))
    for product, dense in [(lambda W, x: W @ x, x), (lambda W, x: x @ W, xt)]:
        f = jax.jit(product)
        np.testing.assert_allclose(f(Ws, dense), product(W, dense), rtol=1e-5, atol=1e-5)
        text = f.lower(Ws, dense).as_text()
        assert not any(c in text for c in ("all_gather", "all_reduce", "reduce_scatter", "collective_permute"))
        grads = lambda W, d, x, f=product: jax.grad(lambda d, x: _loss(f)(W.with_data(d), x), (0, 1))(d, x)  # noqa: E731
        gd, gx = jax.jit(grads)(Ws, Ws.data, dense)
        g1d, g1x = grads(W, W.data, dense)
        np.testing.assert_allclose(gx, g1x, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(Ws.with_data(gd).to_static().data, g1d, rtol=1e-5, atol=1e-5)


@needs_4
def test_two_axis_mesh_and_batched_x(getkey):
    mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("data", "model"))
    W = _matrix(getkey(), "random")
    Ws = bs.shard(W, mesh, "model", split="cols")
    x = jax.random.normal(getkey(), (2, 96, 8))
    np.testing.assert_allclose(jax.jit(lambda Ws, x: Ws @ x)(Ws, x), W @ x, rtol=1e-5, atol=1e-5)
    v = jax.random.normal(getkey(), (96,))
    np.testing.assert_allclose(jax.jit(lambda Ws, v: Ws @ v)(Ws, v), W @ v, rtol=1e-5, atol=1e-5)  # eager: above


def test_pytree_round_trip(getkey):
    Ws = bs.shard(_matrix(getkey(), "random"), _mesh(1), "d")
    leaves, tree = jax.tree.flatten(Ws)
    assert len(leaves) == 4
    back = jax.tree.unflatten(tree, leaves)
    assert back.plan == Ws.plan and back.axis == "d" and back.shape == (128, 96)
    assert "split=" in repr(Ws)


def test_bad_input_names_expected_and_actual(getkey):
    mesh = _mesh(1)
    W = _matrix(getkey(), "random")
    with pytest.raises(ValueError, match=r"one of the mesh's axes \('d',\)\. Got 'model'"):
        bs.shard(W, mesh, "model")
    with pytest.raises(ValueError, match="Expected split 'rows', 'cols' or None. Got 'diag'"):
        bs.shard(W, mesh, "d", split="diag")
    with pytest.raises(TypeError, match="Expected a BlockSparseMatrix .* Got DynamicBlockSparseMatrix"):
        bs.shard(bs.DynamicBlockSparseMatrix.from_static(W), mesh, "d")
    with pytest.raises(TypeError, match="Expected a jax.sharding.Mesh. Got str"):
        bs.shard(W, "d", "d")
    Ws = bs.shard(W, mesh, "d")
    with pytest.raises(ValueError, match=r"contracting dimension to be 96 \(W is \(128, 96\)\). Got 64"):
        Ws @ jnp.ones((64, 4))
    with pytest.raises(ValueError, match=r"last dimension to be 128 \(W is \(128, 96\)\). Got shape \(4, 96\)"):
        jnp.ones((4, 96)) @ Ws
    cap = Ws.plan.capacity
    with pytest.raises(ValueError, match=rf"Expected data of shape \(1, {cap}, 16, 8\) .* Got \(2, 3, 16, 8\)"):
        Ws.with_data(jnp.ones((2, 3, 16, 8)))
    with pytest.raises(TypeError, match="exactly one ShardedBlockSparseMatrix"):
        bs.sharding.matmul(jnp.ones((4, 4)), jnp.ones((4, 4)))


@needs_4
def test_psum_scatter_needs_divisible_rows(getkey):
    W = bs.random(getkey(), (6, 32), (2, 8), 0.5)  # 6 rows (3 block rows) over 4 devices: not divisible
    with pytest.raises(ValueError, match="m divisible by the 4 devices .* Got m=6"):
        bs.shard(W, _mesh(), "d", split="cols", collective="psum_scatter")
    Ws = bs.shard(W, _mesh(), "d", split="cols")
    assert Ws.collective == "psum"
    x = jax.random.normal(getkey(), (32, 3))
    np.testing.assert_allclose(jax.jit(lambda Ws, x: Ws @ x)(Ws, x), W @ x, rtol=1e-5, atol=1e-5)


# The forward of a rows split runs each device's own static work list (padded to one shape) on the
# static-schedule kernels; gradients go through the dynamic path.
@needs_4
@sweep("kind", ["random", "one_row", "first_rows"])
@sweep("balance", ["lines", "blocks"])
def test_rows_split_on_static_kernels(getkey, kind, balance):
    mesh = _mesh()
    W = _matrix(getkey(), kind, shape=(256, 96), block=(16, 16))
    x = jax.random.normal(getkey(), (96, 24))
    Ws = bs.shard(W, mesh, "d", split="rows", balance=balance)
    with bs.interpret(), bs.dispatch_log() as log:
        y = jax.jit(lambda Ws, x: Ws @ x)(Ws, x)
    assert ("sharded_dsd", "pallas") in log
    np.testing.assert_allclose(y, W.to_dense() @ x, rtol=1e-4, atol=1e-4)
    want = NamedSharding(mesh, P("d") if Ws.plan.uniform else P())
    assert y.sharding.is_equivalent_to(want, 2)


@needs_4
@pytest.mark.parametrize("kind", ["random", "one_row"])
def test_static_kernel_forward_with_dynamic_gradients(getkey, kind, monkeypatch):
    # The kernel's contract on the CPU: on a faked H200 the rows split takes the static kernels' path, whose
    # kernel its plain-JAX twin (execute_dsd) stands in for on the stacked work lists; the gradient path
    # (implementation "xla") must match dense gradients.
    from blocksparse.ops.matmul import schedule
    from blocksparse.ops.matmul import triton as pt

    def run_schedule(sched, m, data, x, out_dtype, tn, exact=False):
        return schedule.execute_dsd(sched, data, x, out_dtype)

    monkeypatch.setattr(pt, "run_schedule", run_schedule)
    mesh = _mesh()
    W = _matrix(getkey(), kind, shape=(256, 96), block=(16, 16))
    x = jax.random.normal(getkey(), (96, 24))
    Ws = bs.shard(W, mesh, "d", split="rows", balance="blocks")

    def loss(d, x):
        return jnp.sum(jnp.sin(bs.matmul(Ws.with_data(d), x, implementation="xla")))

    with hardware.fake(hardware.H200), bs.dispatch_log() as log:
        y = jax.jit(lambda Ws, x: Ws @ x)(Ws, x)
        gd, gx = jax.jit(jax.grad(loss, (0, 1)))(Ws.data, x)
    assert ("sharded_dsd", "pallas") in log
    np.testing.assert_allclose(y, W.to_dense() @ x, rtol=1e-4, atol=1e-4)
    wd, wx = jax.grad(lambda w, x: jnp.sum(jnp.sin(w @ x)), (0, 1))(W.to_dense(), x)
    np.testing.assert_allclose(gx, wx, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(Ws.with_data(gd).to_dense(), np.where(W.to_dense() != 0, wd, 0), rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("b", [16, 64])
def test_gpu_rows_split_static_kernels(getkey, b):
    mesh = Mesh(np.array(jax.devices()), ("d",))
    W = bs.random(getkey(), (1024, 512), b, 0.25, jnp.bfloat16)
    x = jax.random.normal(getkey(), (512, 300), jnp.bfloat16)
    for balance in ("lines", "blocks"):
        Ws = bs.shard(W, mesh, "d", split="rows", balance=balance)

        def loss(d, x, Ws=Ws):
            return jnp.sum(jnp.sin((Ws.with_data(d) @ x).astype(jnp.float32)))

        with bs.dispatch_log() as log:
            y = jax.jit(lambda Ws, x: Ws @ x)(Ws, x)
            g = jax.jit(jax.grad(loss, (0, 1)))(Ws.data, x)
        assert ("sharded_dsd", "pallas") in log
        ref = np.asarray(W.to_dense().astype(jnp.float32) @ x.astype(jnp.float32))
        np.testing.assert_allclose(np.asarray(y, np.float32), ref, rtol=3e-2, atol=3e-2 * np.abs(ref).max())
        wd, wx = jax.grad(lambda w, x: jnp.sum(jnp.sin(w @ x)), (0, 1))(W.to_dense().astype(jnp.float32),
                                                                        x.astype(jnp.float32))  # fmt: skip
        np.testing.assert_allclose(np.asarray(g[1], np.float32), wx, rtol=5e-2, atol=5e-2 * np.abs(wx).max())
