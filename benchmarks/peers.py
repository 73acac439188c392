"""What the peer scripts of ``benchmarks/`` share: torch on the GPU, timed with CUDA events (the one helper).

JAX is timed with :class:`blocksparse.bench.Timer` and every script runs its cells through
:func:`blocksparse.bench.run_cells` (the table, the JSON); torch's kernels are timed here, around the same
kind of loop: ``iters`` calls between two CUDA events, the median over ``trials``. A cell whose peer is
missing raises :class:`blocksparse.bench.CellSkipped` through :func:`require_torch`.

Run the scripts from the repository root with the package importable (``PYTHONPATH=.`` or installed):
``PYTHONPATH=. python benchmarks/bench_gnn.py --json out.json``.
"""

from __future__ import annotations

import functools
import statistics

from blocksparse.bench import CellSkipped


@functools.cache
def _torch():
    """``(torch, None)`` with a CUDA device, else ``(None, why)``."""
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - torch is optional
        return None, f"torch unavailable: {type(e).__name__}: {e}"
    if not torch.cuda.is_available():
        return None, f"torch {torch.__version__} sees no CUDA device"
    return torch, None


def torch_problem() -> str | None:
    """Why the torch cells cannot run here (no torch, no CUDA device), or ``None``."""
    return _torch()[1]


def require_torch():
    """torch with a CUDA device, or :class:`~blocksparse.bench.CellSkipped` naming what is missing."""
    torch, why = _torch()
    if torch is None:
        raise CellSkipped(why)
    return torch


def require_pyg():
    """``torch_geometric`` (with torch on CUDA), or :class:`~blocksparse.bench.CellSkipped`."""
    require_torch()
    try:
        import torch_geometric
    except Exception as e:  # noqa: BLE001
        raise CellSkipped(f"PyG unavailable: {type(e).__name__}: {e}") from None
    return torch_geometric


def torch_time(fn, *, iters: int = 20, trials: int = 3, warmup: int = 1) -> dict:
    """Median ms per call of ``fn()`` over ``trials`` runs of ``iters`` calls between two CUDA events.

    Returns ``peer_ms`` and ``peer_mem_bytes``: the peak memory allocated beyond what was allocated before
    (``max_memory_allocated`` minus ``memory_allocated``), the counterpart of a compiled JAX program's
    temporaries and output.
    """
    torch = require_torch()
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(trials):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / iters)
    return dict(peer_ms=statistics.median(times), peer_mem_bytes=torch.cuda.max_memory_allocated() - base)
