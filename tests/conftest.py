import os
import shutil
import tempfile
import time

# Several CPU devices, so sharding (shard_map over a mesh) is tested on a machine without GPUs.
# Must be set before JAX initialises its backends; a GPU machine keeps its own devices.
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4").strip()

# One XLA compilation cache on disk for the run (its xdist workers inherit the folder): the suite compiles many
# programs more than once (the same kernel at the same shapes from several tests, in both workers), and a hit skips
# XLA's compile: about a sixth of the GNN tests' time on 2 cores. A fresh folder per run, removed at its end (without
# a size limit: JAX's least-recently-used eviction rescans the folder at every write, slower than compiling).
# JAX_COMPILATION_CACHE_DIR set beforehand is used as it is.
_OWN_CACHE = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _OWN_CACHE = os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="blocksparse-tests-jax-")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")  # (default 1 s: most here take less)

import helpers  # noqa: E402
import jax  # noqa: E402
import pytest  # noqa: E402

# Quick (`make test`, the default) or full (`make test-slow`) hypothesis sweeps: tests/helpers.py.
helpers.load_profile()


def pytest_unconfigure(config):
    if _OWN_CACHE is not None:
        shutil.rmtree(_OWN_CACHE, ignore_errors=True)


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
