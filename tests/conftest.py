import os

# Several CPU devices, so sharding (shard_map over a mesh) is tested on a machine without GPUs.
# Must be set before JAX initialises its backends; a GPU machine keeps its own devices.
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4").strip()

import jax  # noqa: E402
import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

# Bounded example counts keep CI (2 CPU cores) fast; `HYPOTHESIS_PROFILE=thorough` for more.
settings.register_profile(
    "ci", max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
settings.register_profile("thorough", max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def has_gpu() -> bool:
    try:
        return any(d.platform == "gpu" for d in jax.devices())
    except RuntimeError:
        return False


def pytest_collection_modifyitems(config, items):
    if has_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def getkey():
    """A fresh PRNG key per call, seeded per test."""
    state = {"key": jax.random.key(0)}

    def next_key():
        state["key"], sub = jax.random.split(state["key"])
        return sub

    return next_key
