"""Sizes and types refused up front: huge grids, non-integer shapes and capacities, malformed nnz.

Each refusal names the expected and the actual value and happens before anything of the refused size is
allocated: the property tests trace the host's allocations (NumPy reports to ``tracemalloc``) and bound them.
"""

import tracemalloc

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import blocksparse as bs
from blocksparse._pattern import MAX_BLOCK_ROWS, MAX_BLOCKS, MAX_DIM
from blocksparse.testing import strategies as bst

BLOCK = np.ones((1, 16, 16), np.float32)
#: What a refused call may allocate on the host: small, whatever the size it was asked for.
ALLOWANCE = 32 * 2**20


def _refused_small(fn, error):
    tracemalloc.start()
    try:
        with pytest.raises(error) as info:
            fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < ALLOWANCE, f"refusing allocated {peak / 2**20:.1f} MiB first"
    return str(info.value)


@settings(max_examples=15)
@given(bst.huge_shapes(16))
def test_huge_static_shapes_refused_before_allocating(shape):
    msg = _refused_small(lambda: bs.BlockSparseMatrix.from_blocks([0], [0], BLOCK, shape), ValueError)
    assert str(MAX_DIM) in msg or str(MAX_BLOCK_ROWS) in msg
    assert str(shape[0]) in msg or str(shape[1]) in msg or "grid" in msg


@settings(max_examples=10)
@given(bst.huge_shapes(16), st.sampled_from([1e-9, 0.5]))
def test_huge_random_refused_before_allocating(shape, density):
    _refused_small(lambda: bs.random(jax.random.key(0), shape, 16, density), ValueError)


def test_random_refuses_more_blocks_than_int32():
    msg = _refused_small(lambda: bs.random(jax.random.key(0), (2**20, 2**20), 1, 0.5), ValueError)
    assert str(MAX_BLOCKS) in msg and str(2**39) in msg


@settings(max_examples=10)
@given(bst.huge_shapes(16, grid=False))
def test_huge_dynamic_shapes_refused_at_construction(shape):
    msg = _refused_small(lambda: bs.DynamicBlockSparseMatrix.from_blocks([0], [0], BLOCK, shape=shape), ValueError)
    assert "shape" in msg


@settings(max_examples=20)
@given(bst.non_integer_shapes())
def test_non_integer_shapes_refused_not_truncated(shape):
    with pytest.raises((TypeError, ValueError), match="shape"):
        bs.BlockSparseMatrix.from_blocks([0], [0], BLOCK, shape)
    with pytest.raises((TypeError, ValueError), match="shape"):
        bs.DynamicBlockSparseMatrix.from_blocks([0], [0], BLOCK, shape=shape)
    with pytest.raises((TypeError, ValueError), match="shape"):
        bs.random(jax.random.key(0), shape, 16, 0.5)


def test_float_shape_named_in_the_error():
    with pytest.raises(TypeError, match=r"shape as a pair of ints\. Got \(64\.9, 32\)"):
        bs.BlockSparseMatrix.from_blocks([0], [0], BLOCK, (64.9, 32))


@settings(max_examples=20)
@given(bst.invalid_capacities())
def test_invalid_capacities_refused(capacity):
    with pytest.raises((TypeError, ValueError), match="capacity"):
        bs.DynamicBlockSparseMatrix.from_blocks([0], [0], BLOCK, shape=(64, 32), capacity=capacity)


def test_negative_capacity_says_it_must_be_non_negative():
    with pytest.raises(ValueError, match=r"capacity >= 0.*Got capacity=-1"):
        bs.DynamicBlockSparseMatrix.from_blocks([0], [0], BLOCK, shape=(64, 32), capacity=-1)


@pytest.mark.parametrize("nnz", [np.array([1]), np.array([[1]]), 1.0, np.float32(1)])
def test_nnz_must_be_an_integer_scalar(nnz):
    with pytest.raises(TypeError, match="nnz as an integer scalar"):
        bs.DynamicBlockSparseMatrix.from_blocks([0], [0], BLOCK, nnz=nnz, shape=(64, 32))


def test_integer_like_values_still_accepted():
    D = bs.DynamicBlockSparseMatrix.from_blocks(
        [0], [0], BLOCK, nnz=np.int64(1), shape=(np.int64(64), 32), capacity=np.int32(4)
    )
    assert D.shape == (64, 32) and D.capacity == 4
    W = bs.random(jax.random.key(0), (np.int64(64), 64), 16, 0.5)
    assert W.shape == (64, 64) and W.nnz_blocks == 8


def test_largest_grid_allowed_scales_with_its_blocks():
    # The row index is built on first use: a pattern of one block on the largest grid holds only that block.
    shape = (MAX_BLOCK_ROWS * 16, 16)
    tracemalloc.start()
    try:
        W = bs.BlockSparseMatrix.from_blocks([0], [0], BLOCK, shape)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert W.shape == shape and W.nnz_blocks == 1
    assert peak < ALLOWANCE


@pytest.mark.parametrize("leaf", [lambda a: a.shape, lambda a: None, lambda a: 3, lambda a: "x"])
def test_matrices_print_with_any_leaves(leaf):
    W = bs.random(jax.random.key(0), (64, 64), 16, 0.5)
    D = bs.DynamicBlockSparseMatrix.from_static(W)
    layer = bs.nn.SparseLinear.init(jax.random.key(1), 64, 32, block_size=16, density=0.5)
    for tree in (W, D, layer):
        text = repr(jax.tree.map(leaf, tree, is_leaf=lambda x: x is None))
        assert "shape=(64, " in text


def test_flax_state_dict_of_a_layer():
    serialization = pytest.importorskip("flax.serialization")
    layer = bs.nn.SparseLinear.init(jax.random.key(1), 64, 32, block_size=16, density=0.5)
    state = serialization.to_state_dict(layer)
    assert jax.tree.leaves(state)


def test_from_scipy_refuses_a_dense_array():
    pytest.importorskip("scipy")
    with pytest.raises(TypeError, match="Expected a scipy.sparse array or matrix. Got ndarray"):
        bs.BlockSparseMatrix.from_scipy(np.ones((4, 4)))


@pytest.mark.parametrize("bad", ["scalar", 32.0, True, 0, -4])
def test_layer_features_named_when_wrong(bad):
    with pytest.raises((TypeError, ValueError), match="in_features as a positive int"):
        bs.nn.SparseLinear.init(jax.random.key(0), bad, 32, 16, 0.5)
    eqx = pytest.importorskip("equinox")  # noqa: F841
    with pytest.raises((TypeError, ValueError), match="in_features as a positive int"):
        bs.nn.equinox.SparseLinear(bad, 32, block_size=16, density=0.5, key=jax.random.key(0))


def test_flax_layer_under_eval_shape():
    nnx = pytest.importorskip("flax.nnx")
    # The pattern is host data: with a traced key the error says what to do; with the pattern given, it works.
    with pytest.raises(TypeError, match=r"Draw the pattern outside the trace.*pattern=pattern"):
        nnx.eval_shape(lambda: bs.nn.flax.SparseLinear(64, 32, block_size=16, density=0.5, rngs=nnx.Rngs(0)))
    pattern = bs.nn.random_pattern(jax.random.key(0), (64, 32), 16, 0.5)
    layer = nnx.eval_shape(
        lambda: bs.nn.flax.SparseLinear(64, 32, block_size=16, density=0.5, pattern=pattern, rngs=nnx.Rngs(0))
    )
    assert layer.pattern == pattern and layer.kernel.value.shape == (pattern.nnz_blocks, 16, 16)


@pytest.mark.parametrize("num_nodes", [2**40, 2**31 - 1])
def test_graph_node_counts_past_int32_refused_before_allocating(num_nodes):
    msg = _refused_small(lambda: bs.gnn.Graph.from_edges([0], [1], num_nodes), ValueError)
    assert "2**31 - 1" in msg and str(num_nodes) in msg


def test_graph_larger_than_the_host_refused_before_allocating():
    from blocksparse._util import host_memory_bytes

    memory = host_memory_bytes()
    if memory is None or memory // 24 >= 2**31 - 1:
        pytest.skip("this host could hold the row index of any int32 node count")
    n = memory // 24 + 1
    msg = _refused_small(lambda: bs.gnn.Graph.from_edges([0], [1], n), ValueError)
    assert "host's memory" in msg and str(n) in msg


@settings(max_examples=15)
@given(bst.invalid_node_counts())
def test_invalid_node_counts_refused_before_allocating(num_nodes):
    msg = _refused_small(lambda: bs.gnn.Graph.from_edges([0], [1], num_nodes), (TypeError, ValueError))
    assert "num_nodes" in msg
    with pytest.raises((TypeError, ValueError), match="num_nodes"):
        bs.gnn.DynamicGraph.from_edge_index(np.array([[0], [1]]), num_nodes=num_nodes)
