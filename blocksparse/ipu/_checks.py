"""Argument checks shared by the static and the dynamic planner, and the advice of :class:`NoValidPlanError`.

Both planners validate ``n``, the machine, the dtypes and ``available_memory_proportion`` with
:func:`check_common`, so a bad value gets the same message from either. :func:`advice` turns a
failed plan into suggestions that were each checked by planning again.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import numpy as np

from .machines import IPUMachine

__all__ = ["advice", "check_common", "check_int", "check_machine", "check_proportion", "dtype_name"]

PARTIALS_DTYPES = ("float16", "float32")
#: Wall-clock budget of :func:`advice`: past it, no further plan is tried (what was verified stays).
#: Only huge patterns reach it (planning takes seconds there); smaller ones are bounded by the plan
#: count below, so their advice does not depend on the machine's speed.
ADVICE_BUDGET_S = 30.0
#: At most this many plans while searching the largest ``n`` that fits.
ADVICE_MAX_PLANS = 24


def check_int(name: str, v, lo: int = 1) -> int:
    """``v`` as an ``int >= lo`` (Python or NumPy integer, not bool); else a ValueError."""
    if isinstance(v, bool | np.bool_) or not isinstance(v, int | np.integer) or int(v) < lo:
        raise ValueError(f"Expected {name} as an integer >= {lo}. Got {v!r}.")
    return int(v)


def check_machine(machine) -> IPUMachine:
    if not isinstance(machine, IPUMachine):
        raise TypeError(f"Expected an IPUMachine such as bs.ipu.BOW or bs.ipu.MK2. Got {type(machine).__name__}.")
    return machine


def dtype_name(dtype) -> str:
    try:
        return np.dtype(dtype).name
    except TypeError:
        raise TypeError(f"Expected a NumPy/JAX dtype. Got {dtype!r}.") from None


def check_proportion(available_memory_proportion) -> float:
    """``available_memory_proportion`` as a float in ``(0, 1]``."""
    try:
        amp = float(available_memory_proportion)
    except (TypeError, ValueError):
        amp = math.nan
    if isinstance(available_memory_proportion, bool) or not 0.0 < amp <= 1.0:  # NaN fails too
        raise ValueError(f"Expected available_memory_proportion in (0, 1]. Got {available_memory_proportion!r}.")
    return amp


def check_common(n, machine, dtype, available_memory_proportion, partials_dtype) -> tuple[int, str, str, float]:
    """Validate what both planners take: ``(n, dtype name, partials dtype name, proportion)``."""
    n = check_int("n", n)
    machine = check_machine(machine)
    dt = machine.check_dtype(dtype_name(dtype))
    pdt = dtype_name(partials_dtype)
    if pdt not in PARTIALS_DTYPES:
        raise ValueError(f"Expected partials_dtype float16 or float32. Got {pdt}.")
    return n, dt, pdt, check_proportion(available_memory_proportion)


# --------------------------------------------------------------------------------------------------
# Advice for a product that does not fit
# --------------------------------------------------------------------------------------------------
def _round_up(x: float) -> float:
    """``x`` rounded up to two significant digits (0.5312 -> 0.54, 0.00312 -> 0.0032)."""
    e = math.floor(math.log10(x)) - 1
    return round(math.ceil(round(x / 10.0**e, 9)) * 10.0**e, 12)


class _Budget:
    def __init__(self, fits: Callable[[float, int], bool], seconds: float):
        self._fits, self._deadline, self.plans = fits, time.perf_counter() + seconds, 0

    def __call__(self, amp: float, n: int) -> bool | None:
        """Whether planning at ``(amp, n)`` succeeds; ``None`` once the budget is spent (not tried)."""
        if time.perf_counter() > self._deadline:
            return None
        self.plans += 1
        return self._fits(amp, n)


def _largest_n(fits: _Budget, amp: float, n: int, guess: int) -> int | None:
    """The largest ``n' < n`` that fits at ``amp`` (each step checked by planning), or ``None``."""
    hi = n  # known not to fit
    lo = None  # largest known to fit
    g = min(max(guess, 1), n - 1)
    while lo is None:  # gallop down from the guess until something fits
        ok = fits(amp, g)
        if ok is None:
            return None
        if ok:
            lo = g
        elif g == 1:
            return None
        else:
            hi, g = g, max(1, g // 2)
    start = fits.plans
    while hi - lo > 1 and fits.plans - start < ADVICE_MAX_PLANS:
        mid = (lo + hi) // 2
        ok = fits(amp, mid)
        if ok is None:
            break
        lo, hi = (mid, hi) if ok else (lo, mid)
    return lo


def advice(
    fits: Callable[[float, int], bool],
    *,
    n: int,
    amp: float,
    smallest_bytes: float,
    tile_memory_bytes: float,
    others: Sequence[tuple[str, dict, Callable[[], bool]]] = (),
    budget_s: float | None = None,
) -> tuple[str, list[dict], bool]:
    """What to change so that a plan fits, each suggestion checked by planning again.

    Arguments:
        fits: ``fits(amp, n)`` plans the same product with another proportion / ``n``; True if it fits.
        n, amp: the failed request. smallest_bytes: the smallest per-tile footprint seen at ``n``.
        others: ``(text, changes, check)`` further suggestions, each given only if ``check()`` is True.

    Returns:
        ``(text, suggestions, nothing_fits)``: the sentence for the error message; the suggestions
        as keyword changes (``{"available_memory_proportion": 0.79}``, ``{"n": 522}``, ...), each
        of which was planned and fits; and whether even ``n = 1`` at proportion 1.0 does not fit.
    """
    fits_b = _Budget(fits, ADVICE_BUDGET_S if budget_s is None else budget_s)
    lines, found = [], []
    if 0 < smallest_bytes <= tile_memory_bytes:  # else no proportion <= 1 fits at this n
        need = _round_up(smallest_bytes / tile_memory_bytes)
        for p in sorted({min(need, 1.0), 1.0}):
            if p > amp and fits_b(p, n):
                lines.append(f"raise available_memory_proportion to {p:g}")
                found.append({"available_memory_proportion": p})
                break
    if n > 1:
        guess = int(n * amp * tile_memory_bytes / smallest_bytes) if smallest_bytes > 0 else n - 1
        n_fit = _largest_n(fits_b, amp, n, guess)
        if n_fit is not None:
            lines.append(f"reduce n to at most {n_fit}")
            found.append({"n": n_fit})
    for text, changes, check in others:
        if fits_b.plans < ADVICE_MAX_PLANS and check():
            lines.append(text)
            found.append(dict(changes))
    if not found and amp < 1.0 and n > 1:
        guess = int(n * tile_memory_bytes / smallest_bytes) if smallest_bytes > 0 else n - 1
        both = _largest_n(fits_b, 1.0, n, guess)
        if both is not None:
            lines.append(f"raise available_memory_proportion to 1.0 and reduce n to at most {both}")
            found.append({"available_memory_proportion": 1.0, "n": both})
    if found:
        return "To fit (each checked by planning): " + "; or ".join(lines) + ".", found, False
    smallest_fits = False if (n == 1 and amp == 1.0) else fits_b(1.0, 1)
    if smallest_fits is False:
        text = (
            "Nothing fits on this machine: even n=1 with available_memory_proportion=1.0 exceeds a tile's "
            f"{tile_memory_bytes / 1024:g} KiB. Split the product over several IPUs (e.g. plan row blocks of W "
            "separately)."
        )
        return text, [], True
    if smallest_fits:
        text = "To fit: n=1 with available_memory_proportion=1.0 fits; or split the product over several IPUs."
        return text, [{"available_memory_proportion": 1.0, "n": 1}], False
    return "No fitting plan was found in the time allowed for advice; split the product over several IPUs.", [], False
