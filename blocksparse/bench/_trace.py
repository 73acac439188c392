"""Kernel times from a ``jax.profiler`` trace of the Timer's loop: what ran on the GPU, per iteration.

The Timer's :meth:`~._core.Timer.loop` is one jitted ``fori_loop``; on a GPU each iteration also pays the loop's
own work (its predicate read back by the host, the probe's small kernels), which for a product of a few
microseconds is most of the iteration. :func:`trace_loop` runs the same loop under the profiler and reports the
span, the busy time (some kernel or copy running) and each kernel's time per iteration; :func:`kernel_us` the
time of the iteration's longest kernel: the product's own, for a product that is one launch.
"""

from __future__ import annotations

import glob
import os
import tempfile

import jax

__all__ = ["busy_time", "kernel_us", "trace_events", "trace_loop"]


def trace_events(xplane_path: str) -> tuple[list[tuple[str, float, float]], list[tuple[str, float, float]]]:
    """``(gpu, host)`` events of a ``jax.profiler`` trace as ``(name, start_us, end_us)``, sorted by start: every
    kernel and copy on the GPU's streams, and the runtime's own events on the host's threads (Python's left out)."""
    gpu, host = [], []
    for plane in jax.profiler.ProfileData.from_file(xplane_path).planes:
        on_gpu = plane.name.startswith("/device:GPU")
        if not on_gpu and plane.name != "/host:CPU":
            continue
        for line in plane.lines:
            # on the GPU the derived lines ("XLA Ops", ...) repeat the stream events
            if (on_gpu and not line.name.startswith("Stream")) or (not on_gpu and line.name == "python"):
                continue
            out = gpu if on_gpu else host
            out += [
                (e.name, e.start_ns / 1e3, (e.start_ns + e.duration_ns) / 1e3)
                for e in line.events
                if on_gpu or not e.name.startswith("$")
            ]  # "$file:line name": Python's tracer, on any thread
    return sorted(gpu, key=lambda e: e[1]), sorted(host, key=lambda e: e[1])


def _per_iteration(events, iters: int, top: int | None = None) -> dict:
    """``{name: [count per iteration, us per iteration]}``, the most time first."""
    per = {}
    for name, a, b in events:
        c = per.setdefault(name[:120], [0.0, 0.0])
        c[0] += 1 / iters
        c[1] += (b - a) / iters
    return dict(sorted(per.items(), key=lambda kv: -kv[1][1])[:top])


def busy_time(events: list[tuple[str, float, float]]) -> float:
    """The length of the union of the events' intervals (us): the time something ran on the GPU."""
    total, end = 0.0, float("-inf")
    for _, a, b in events:
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def trace_loop(fn, args, timer, iters: int) -> dict:
    """One run of :meth:`Timer.loop_function` under ``jax.profiler.trace``: per-iteration span, busy time, kernels
    and the host runtime's events (``{name: [count per iteration, us per iteration]}``)."""
    looped = timer.loop_function(fn, iters)
    jax.block_until_ready(looped(args))
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d):
            jax.block_until_ready(looped(args))
        paths = glob.glob(os.path.join(d, "**", "*.xplane.pb"), recursive=True)
        events, host = trace_events(paths[0]) if paths else ([], [])
    if not events:
        return {"error": "the trace holds no GPU stream events"}
    return {"iters": iters, "span_us": (events[-1][2] - events[0][1]) / iters, "busy_us": busy_time(events) / iters,
            "events": _per_iteration(events, iters), "host_events": _per_iteration(host, iters, top=25)}  # fmt: skip


def kernel_us(timer, fn, *args, iters: int | None = None) -> dict:
    """The Timer's loop of ``fn(*args)`` traced on a GPU: ``kernel_us``, the time per iteration of the kernel that
    took the most (``kernel``, its name: the product's own, for a product of one launch), ``busy_us`` and
    ``events_per_iter`` (every kernel and copy of an iteration, the loop's own included). ``{}`` where the trace
    holds no GPU event (a CPU)."""
    t = trace_loop(fn, args, timer, iters or timer.iters)
    if not t.get("events"):
        return {}
    name, (_, us) = next(iter(t["events"].items()))
    count = sum(c for c, _ in t["events"].values())
    return {"kernel_us": us, "kernel": name, "busy_us": t["busy_us"], "events_per_iter": count}
