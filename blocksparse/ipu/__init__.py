"""The IPU model: PopSparse's planning of block-sparse products on Graphcore IPUs.

No GPU op depends on this package; it plans, costs and simulates ``Y = W X`` on an IPU's tiles.

Modules:
    machines: :class:`IPUMachine` and the presets :data:`MK2` and :data:`BOW`.
    cost: the cycle and memory model by phase, and the dense-matmul estimate.
    planner: the static partition search, :class:`Plan` and the plan cache.
    simulate: :func:`simulate`, a static plan executed tile by tile in JAX.
    dynamic: dynamic sparsity: :func:`dynamic_plan`, :func:`distribute` (buckets) and
        :func:`simulate_dynamic`.

``bs.plan(W, n, ...)`` and ``bs.dynamic_plan(...)`` are the plain functions :func:`plan` and
:func:`dynamic_plan` re-exported at the top level.
"""

from __future__ import annotations

from . import cost, machines
from .dynamic import Distribution, DynamicPlan, distribute, dynamic_plan, simulate_dynamic
from .machines import BOW, MK2, IPUMachine, by_name
from .planner import NoValidPlanError, Plan, cache_info, clear_cache, plan
from .simulate import simulate

__all__ = [
    "BOW",
    "MK2",
    "Distribution",
    "DynamicPlan",
    "IPUMachine",
    "NoValidPlanError",
    "Plan",
    "by_name",
    "cache_info",
    "clear_cache",
    "cost",
    "distribute",
    "dynamic_plan",
    "machines",
    "plan",
    "simulate",
    "simulate_dynamic",
]
