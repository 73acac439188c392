"""The IPU model: PopSparse's planning of block-sparse products on Graphcore IPUs.

No GPU op depends on this package; it plans, costs and simulates ``Y = W X`` on an IPU's tiles.

Modules, one job each:
    machines: :class:`IPUMachine` and the presets :data:`MK2` and :data:`BOW`.
    cost: the cycle and memory model by phase (one per-tile compute formula,
        :func:`cost.compute_cycles`, for both kinds of plan) and the dense-matmul estimate.
    partition: the static partition search (column bands, tiles per band, tile statistics),
        :func:`plan` and its cache.
    buckets: dynamic sparsity: the :func:`dynamic_plan` search and the jit-able :func:`distribute`.
    plan: the :class:`Plan` and :class:`DynamicPlan` types, their shared estimates, :class:`NoValidPlanError`.
    report: the one formatter of both plan kinds' readable reports.
    simulate: :func:`simulate` (static) and :func:`simulate_dynamic`, plans executed tile by tile in JAX.
    _checks: argument checks shared by both planners, and the checked advice of :class:`NoValidPlanError`.

``bs.plan(W, n, ...)`` and ``bs.dynamic_plan(...)`` are the plain functions :func:`plan` and
:func:`dynamic_plan` re-exported at the top level.
"""

from __future__ import annotations

from . import cost, machines
from .buckets import Distribution, distribute, dynamic_plan
from .machines import BOW, MK2, IPUMachine, by_name
from .partition import cache_info, clear_cache, plan
from .plan import DynamicPlan, NoValidPlanError, Plan
from .simulate import simulate, simulate_dynamic

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
