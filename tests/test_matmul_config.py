"""``bs.matmul(..., config=)`` and ``bs.sdd(..., config=)``: each backend's config reaches its kernel (read from
the kernel names of the traced program, in interpret mode: nothing runs but the cheap Triton checks), is part of
the ``jit`` cache key, applies to the forward product only, and is refused with a clear error where it cannot
apply."""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import blocksparse as bs
from blocksparse.ops._dispatch import NoImplementationError
from blocksparse.ops.matmul import BandConfig, DdsConfig, MosaicConfig, SddConfig, TritonConfig


def _matrix(block, shape, density=0.5, dtype=jnp.bfloat16, seed=0):
    return bs.random(jax.random.key(seed), shape, block, density, dtype)


def _kernels(fn, *args) -> list[str]:
    """The Pallas kernels a function would launch (their names in the traced program), in order."""
    return re.findall(r"bs_[a-z0-9_]+", str(jax.make_jaxpr(fn)(*args)))


def test_each_config_reaches_its_kernel():
    W16 = _matrix(16, (32, 64), dtype=jnp.float32)
    x = jnp.ones((64, 128), jnp.float32)  # more columns than the few-token kernel takes
    with bs.interpret():
        default = _kernels(lambda W, x: bs.matmul(W, x, implementation="pallas"), W16, x)
        forced = _kernels(lambda W, x: bs.matmul(W, x, config=TritonConfig(tn=16)), W16, x)
        assert "bs_dsd_16x16_tn64" in default and "bs_dsd_16x16_tn16" in forced
        few = _kernels(lambda W, x: bs.matmul(W, x, config=TritonConfig(tb=16, stream_group=2)), W16, x[:, :3])
        assert set(few) == {"bs_dsd_stream_16x16_t16_g2"}, few
        a, b = jnp.ones((32, 16 * 96)), jnp.ones((16 * 96, 64))
        split = _kernels(lambda a, b: bs.sdd(a, b, W16, config=TritonConfig(tk=16, sdd_splits=2)).data, a, b)
        assert any(k.startswith("bs_sdd_16x16_tk16_split2") for k in split), split

        W = _matrix(64, (128, 128))
        x = jnp.ones((128, 64), jnp.bfloat16)
        cfg = MosaicConfig(tn=64, grid_order="units", persistent=False)
        assert "bs_mgpu_dsd_64x64_tn64_units_fastest" in _kernels(lambda W, x: bs.matmul(W, x, config=cfg), W, x)
        xt = jnp.ones((64, 128), jnp.bfloat16)
        dcfg = DdsConfig(tm=64, grid_order="tiles", persistent=False)
        assert "bs_mgpu_dds_64x64_tm64_tiles_fastest" in _kernels(lambda W, x: bs.matmul(x, W, config=dcfg), W, xt)
        a, b = jnp.ones((128, 512), jnp.bfloat16), jnp.ones((512, 128), jnp.bfloat16)
        scfg = SddConfig(tk=128, splits=2)
        assert "bs_mgpu_sdd_64x64_tk128_nn_split2" in _kernels(lambda a, b: bs.sdd(a, b, W, config=scfg).data, a, b)
        W32 = _matrix(32, (128, 128))
        xb = jnp.ones((64, 128), jnp.bfloat16)
        bands = _kernels(lambda W, x: bs.matmul(x, W, config=BandConfig(tm=64, width=64)), W32, xb)
        assert "bs_mgpu_bands_32_tm64_w64" in bands, bands


def test_a_config_runs_its_backend_and_matches():
    W = _matrix(16, (32, 64), dtype=jnp.float32)
    x = jax.random.normal(jax.random.key(1), (64, 40))
    with bs.interpret(), bs.dispatch_log() as log:
        y = bs.matmul(W, x, config=TritonConfig(tn=16, max_len=1))  # split rows: the combine kernel too
    assert log == [("dsd", "pallas")]
    np.testing.assert_allclose(y, W.to_dense() @ x, rtol=2e-5, atol=2e-5)


def test_a_config_of_another_kernel_is_ignored():
    """A backend applies a config only where it takes its type for the product: x @ W ignores a MosaicConfig (its
    kernel takes a DdsConfig), blocks of 64 ignore a BandConfig, the Triton backend every Mosaic config."""
    W = _matrix(64, (128, 128))
    xt = jnp.ones((64, 128), jnp.bfloat16)
    with bs.interpret():
        plain = _kernels(lambda W, x: bs.matmul(x, W, implementation="mosaic"), W, xt)
        for cfg in (MosaicConfig(tn=256), BandConfig(tm=64, width=64)):
            assert _kernels(lambda W, x, cfg=cfg: bs.matmul(x, W, config=cfg), W, xt) == plain
        triton = _kernels(lambda W, x: bs.matmul(x, W, implementation="pallas"), W, xt)
        cfg = DdsConfig(tm=64)
        assert _kernels(lambda W, x: bs.matmul(x, W, implementation=("pallas", "mosaic"), config=cfg), W, xt) == triton


def test_the_config_applies_to_the_forward_product_only():
    W = _matrix(16, (32, 64), dtype=jnp.float32)
    x = jnp.ones((64, 128), jnp.float32)

    def loss(x):
        return bs.matmul(W, x, config=TritonConfig(tn=16)).sum()

    with bs.interpret():
        names = set(_kernels(jax.grad(loss), x))
        _, pullback = jax.vjp(lambda x: bs.matmul(W, x, config=TritonConfig(tn=16)), x)
        backward = set(_kernels(pullback, jnp.ones((32, 128), jnp.float32)))
    assert "bs_dsd_16x16_tn16" in names  # the forward
    assert backward == {"bs_dsd_16x16_tn64", "bs_sdd_16x16_tk128"}  # dx = W^T @ g and dW on the default tiles


def test_the_config_is_part_of_the_jit_cache_key():
    W = _matrix(64, (128, 128))
    x = jnp.ones((128, 64), jnp.bfloat16)
    traced = []

    @functools.partial(jax.jit, static_argnums=2)
    def f(W, x, config):
        traced.append(config)
        return bs.matmul(W, x, config=config)

    with bs.interpret():
        for cfg in (MosaicConfig(tn=64), MosaicConfig(tn=128), MosaicConfig(tn=64)):
            jax.eval_shape(f, W, x, cfg)
    assert traced == [MosaicConfig(tn=64), MosaicConfig(tn=128)]  # equal configs share one trace


def test_config_errors():
    W = _matrix(16, (32, 64), dtype=jnp.float32)
    x = jnp.ones((64, 8), jnp.float32)
    with pytest.raises(TypeError, match="Expected config None or one of TritonConfig, MosaicConfig, DdsConfig"):
        bs.matmul(W, x, config={"tn": 16})
    with pytest.raises(TypeError, match="Got SddConfig"):
        bs.matmul(W, x, config=SddConfig())
    with pytest.raises(TypeError, match="one of TritonConfig, SddConfig. Got MosaicConfig"):
        bs.sdd(jnp.ones((32, 8)), jnp.ones((8, 64)), W, config=MosaicConfig())
    with pytest.raises(ValueError, match="include 'pallas', the backend of config TritonConfig.*'xla'"):
        bs.matmul(W, x, implementation="xla", config=TritonConfig())
    with pytest.raises(ValueError, match="include 'mosaic', the backend of config MosaicConfig"):
        bs.matmul(W, x, implementation=("pallas", "xla"), config=MosaicConfig())
    if jax.default_backend() != "gpu":  # implementation=None with a config: its backend alone, no silent fallback
        with pytest.raises(NoImplementationError, match="among \\('pallas',\\)"):
            bs.matmul(W, x, config=TritonConfig())
        with bs.dispatch_log() as log:  # an explicit fallback is the caller's choice
            bs.matmul(W, x, implementation=("pallas", "xla"), config=TritonConfig())
        assert log == [("dsd", "xla")]
    assert TritonConfig.backend == "pallas" and {
        c.backend for c in (MosaicConfig, DdsConfig, SddConfig, BandConfig)
    } == {"mosaic"}
