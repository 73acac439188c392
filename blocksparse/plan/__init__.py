"""Static planning: machine models, the PopSparse-style planner, its cost model and the tile simulator.

``blocksparse.plan`` is both this package and the planner: calling it plans, so
``bs.plan(W, n, machine=bs.ipu.BOW, dtype=jnp.float16, available_memory_proportion=0.6)`` works
while ``bs.plan.ipu``, ``bs.plan.cost`` and ``import blocksparse.plan.gpu`` keep working too.

Modules:
    ipu: :class:`~blocksparse.plan.ipu.IPUMachine` and the presets ``MK2`` and ``BOW``.
    cost: the cycle and memory model by phase, and the dense-matmul estimate.
    planner: the partition search, :class:`Plan` and the plan cache.
    simulate: :func:`simulate`, the plan executed tile by tile in JAX.
    dynamic: dynamic sparsity: :func:`dynamic_plan`, :func:`distribute` (buckets) and :func:`simulate_dynamic`.
    gpu: the GPU machine model and schedule lowering (loaded on first use).
"""

from __future__ import annotations

import importlib
import sys
import types

from . import cost, dynamic, ipu
from .dynamic import Distribution, DynamicPlan, distribute, dynamic_plan, simulate_dynamic
from .ipu import BOW, MK2, IPUMachine
from .planner import NoValidPlanError, Plan, cache_info, clear_cache
from .planner import plan as plan
from .simulate import simulate

__all__ = [
    "BOW",
    "MK2",
    "IPUMachine",
    "NoValidPlanError",
    "Plan",
    "cache_info",
    "clear_cache",
    "cost",
    "ipu",
    "plan",
    "simulate",
    "dynamic",
    "Distribution",
    "DynamicPlan",
    "distribute",
    "dynamic_plan",
    "simulate_dynamic",
]

_LAZY = ("gpu",)


def __getattr__(name: str):
    # The GPU lowering pulls in the kernel package; load it only when asked for.
    if name in _LAZY:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _CallablePackage(types.ModuleType):
    """This package, callable as the planner: ``blocksparse.plan(W, n, ...)`` is :func:`planner.plan`."""

    def __call__(self, W, n, machine=BOW, dtype="float16", available_memory_proportion=0.6, **options) -> Plan:
        return plan(W, n, machine, dtype, available_memory_proportion, **options)


sys.modules[__name__].__class__ = _CallablePackage
