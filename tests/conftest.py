import os
import time

# Several CPU devices, so sharding (shard_map over a mesh) is tested on a machine without GPUs.
# Must be set before JAX initialises its backends; a GPU machine keeps its own devices.
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4").strip()

import helpers  # noqa: E402
import jax  # noqa: E402
import pytest  # noqa: E402

# Quick (`make test`, the default) or full (`make test-slow`) hypothesis sweeps: tests/helpers.py.
helpers.load_profile()


_START = time.monotonic()
_announced = False


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    """Under xdist (``make test``) a line once the first worker has collected: starting the workers (each imports
    JAX and every test module) is otherwise a silent stretch before the first dot."""
    global _announced
    if _announced:
        return
    _announced = True
    reporter = node.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"{len(ids)} tests collected in {time.monotonic() - _START:.0f} s; running them")


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
def kernels_here():
    """The Pallas kernels for real on a GPU, in the interpreter elsewhere (``pytestmark =
    pytest.mark.usefixtures("kernels_here")`` in a kernel's test module)."""
    from blocksparse.ops import _dispatch

    with _dispatch.interpret(not has_gpu()):
        yield


@pytest.fixture
def getkey():
    """A fresh PRNG key per call, seeded per test."""
    state = {"key": jax.random.key(0)}

    def next_key():
        state["key"], sub = jax.random.split(state["key"])
        return sub

    return next_key
