"""Host memory's levels where LMDeploy or glibc gives the heap back: what a fall of MIN_GROWTH_BYTES or more
says about a rise (memory given back, or kept across the trims), the rate read from the levels that hold only
what was kept, and a young PyTorch-engine process's warm-up (docs/analysis.md, "Trimmed heaps")."""

from __future__ import annotations

import itertools
import math

import numpy as np

from vlmtrace.analysis.registry import BY_NAME
from vlmtrace.analysis.robust import Slope
from vlmtrace.analysis.rules import (
    KEPT_ACROSS_TRIM_BYTES,
    MIN_GROWTH_BYTES,
    MIN_TROUGHS,
    STEADY_RATIO,
    WARMUP_HOST_RATE,
    YOUNG_CLASS_REQUESTS,
    YOUNG_REQUESTS,
)
from vlmtrace.analysis.units import format_bytes


def level_falls(y: np.ndarray) -> np.ndarray:
    """Per step between consecutive levels: whether the level fell by MIN_GROWTH_BYTES or more."""
    return np.diff(y) <= -MIN_GROWTH_BYTES


def fell_back(component: str, x: np.ndarray, y: np.ndarray) -> str | None:
    """Why a host rise that fell, once, to near where it began is not yet a leak: what a leak holds it
    keeps, so the lowest level after its largest fall still holds all it leaked by then; a heap that
    grows and is given back at once (glibc trimming it in a fresh LMDeploy process) falls to near its
    start. Under load too: requests in flight raise a settled level, they cannot lower it below what is
    kept. Host memory only: torch's cache released by empty_cache() or the cache guard's trims falls
    the same way, and comes back (retention, with the release measured: empty_cache.py)."""
    if component != "host" or len(y) < MIN_TROUGHS:
        return None
    if not level_falls(y).any():
        return None
    largest = int(np.argmin(np.diff(y)))
    lowest = largest + 1 + int(np.argmin(y[largest + 1 :]))
    kept, span = float(y[lowest] - y[0]), float(x[lowest] - x[0])
    if kept >= MIN_GROWTH_BYTES and kept >= BY_NAME[component].min_leak_rate * span:
        return None
    where = f"{format_bytes(abs(kept))} {'above' if kept >= 0 else 'below'} where it began"
    return (
        f"rose by {format_bytes(float(y[largest] - y[0]))} over {int(x[largest] - x[0]):,} requests, then fell back to "
        f"{where}: memory given back, not kept; about {math.ceil(x[-1] - x[0]):,} more requests would tell "
        f"whether it keeps rising"
    )


def kept_rate(component: str, x: np.ndarray, y: np.ndarray) -> tuple[float, int] | None:
    """Host memory that fell by MIN_GROWTH_BYTES or more (its heap given back): the rate it keeps, read from
    the lowest level after each fall, and the number of falls; None otherwise. Between falls the level
    also holds the heap's working set, which the next fall gives back: a fit through every level reads it
    as growth (docs/analysis.md, "Trimmed heaps"). Right after a fall that working set is gone. After one
    fall the line starts at the first level, where no working set has been built yet; after two or more it
    runs through the troughs alone: the first level lacks what LMDeploy's warm-up keeps through the first
    trim, which a line through it reads as leak. `x`, `y`: every level, warm-up included."""
    if component != "host":
        return None
    troughs = trough_points(y)
    falls = len(troughs) - 1
    if falls < 1:
        return None
    if falls >= 2:
        troughs = troughs[1:]
    px, py = x[troughs].astype(np.float64), y[troughs].astype(np.float64)
    if px[-1] <= px[0]:
        return None
    return float(np.polyfit(px, py, 1)[0]), falls


def trough_points(y: np.ndarray, runs_as_one: bool = False) -> list[int]:
    """The levels that hold only what was kept (`kept_rate`): the first, and the lowest after each fall.
    `runs_as_one`: falls between consecutive levels are one fall (heap_tags: a garbage collection's frees
    can straddle a reading)."""
    fell = level_falls(y)
    if runs_as_one:
        fell &= ~np.concatenate([[False], fell[:-1]])
    falls = np.flatnonzero(fell)
    bounds = [*(falls + 1), len(y)]
    return [0] + [start + int(np.argmin(y[start:end])) for start, end in itertools.pairwise(bounds)]


def kept_steadily(component: str, x: np.ndarray, y: np.ndarray) -> bool:
    """Host memory given back twice or more (LMDeploy's heap trims): whether what it kept rose steadily
    across them, each stretch from one trough to the next keeping STEADY_RATIO of the first's rate, at a
    leak's rate (`min_leak_rate`) and by MIN_GROWTH_BYTES or more. The halves of the levels themselves
    cannot tell then: each holds a different part of the working set's saw-tooth, rebuilt after every trim."""
    if component != "host":
        return False
    troughs = trough_points(y)
    if len(troughs) < MIN_TROUGHS:
        return False
    px, py = x[troughs].astype(np.float64), y[troughs].astype(np.float64)
    if np.any(np.diff(px) <= 0):
        return False
    rates = np.diff(py) / np.diff(px)
    kept = float(np.polyfit(px, py, 1)[0])
    return (
        kept >= BY_NAME[component].min_leak_rate
        and py[-1] - py[0] >= MIN_GROWTH_BYTES
        and rates[0] > 0
        and bool(np.all(rates[1:] >= STEADY_RATIO * rates[0]))
    )


def young(component: str, x: np.ndarray, young_host_warmup: bool, window: int = YOUNG_REQUESTS) -> bool:
    """Host memory within the first `window` requests of a process that may run the PyTorch engine."""
    return component == "host" and young_host_warmup and x[-1] <= window


def kept_across_one_trim(
    component: str, x: np.ndarray, y: np.ndarray, young_host_warmup: bool, after_heap_trim: np.ndarray | None
) -> bool:
    """A young PyTorch-engine process's host memory that fell once, at LMDeploy's first heap trim: whether
    the lowest level after the fall lies KEPT_ACROSS_TRIM_BYTES or more above the first level, at a leak's
    rate (`min_leak_rate`). Neither the run's halves nor the young-process window can tell a leak there:
    the level holds the heap's working set, rising ~1 MiB a request until the trim's `gc.collect()` gives
    it back. What the trim left is what the process kept. A fall that is not the trim (glibc returning the
    top of its heap) gives back only part of that working set: the rest would read as kept. `x`, `y`:
    every level, warm-up included; `after_heap_trim`: per level, whether it was read first after a trim
    span (None: the trace has none)."""
    if after_heap_trim is None or not young(component, x, young_host_warmup, YOUNG_CLASS_REQUESTS):
        return False
    falls = np.flatnonzero(level_falls(y))
    if len(falls) != 1 or not after_heap_trim[falls[0] + 1]:
        return False
    troughs = trough_points(y)
    kept, span = float(y[troughs[1]] - y[0]), float(x[troughs[1]] - x[0])
    return span > 0 and kept >= KEPT_ACROSS_TRIM_BYTES and kept / span >= BY_NAME[component].min_leak_rate


def young_host(component: str, fit: Slope, x: np.ndarray, young_host_warmup: bool) -> str | None:
    if not young(component, x, young_host_warmup, YOUNG_CLASS_REQUESTS) or fit.slope >= WARMUP_HOST_RATE:
        return None
    more = int(YOUNG_CLASS_REQUESTS - x[-1]) + 1
    return (
        f"the process's first {int(x[-1]):,} requests: LMDeploy's own warm-up raises host memory by up to "
        f"{format_bytes(WARMUP_HOST_RATE // 2)} per request there; about {more:,} more "
        f"{'request' if more == 1 else 'requests'} would settle it"
    )
