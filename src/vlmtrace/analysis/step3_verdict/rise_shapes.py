"""Why a rise in a component's settled levels is not (yet) a leak, read from its shape: a plateau (a
high-water mark rising only at new input maxima, or a rise that stopped), a rise slowing down or too short
to tell, and a working set that gives memory back. leaks.py weighs these into the evidence the class rules
decide on.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from vlmtrace.analysis.robust import Slope, theil_sen
from vlmtrace.analysis.rules import (
    GIVE_BACK_FREQUENCY,
    GIVE_BACK_SHARE,
    MAX_SETTLE_RUNS,
    MIN_GROWTH_BYTES,
    STEADY_RATIO,
    TAIL_FLAT_RATIO,
)
from vlmtrace.analysis.step3_verdict import explanations as ex
from vlmtrace.analysis.step3_verdict.class_rules import RECORD_REASON, STOPPED_REASON
from vlmtrace.analysis.step3_verdict.explanations import Weighed, new_maxima
from vlmtrace.analysis.step3_verdict.host_levels import level_falls
from vlmtrace.analysis.step3_verdict.significance import is_significant
from vlmtrace.analysis.units import format_bytes


def plateau_reason(
    x: np.ndarray, y: np.ndarray, features: pd.DataFrame, tolerance: float, fit: Slope, cut_at_falls: bool = False
) -> tuple[str | None, float | None, Slope | None]:
    """Why this rising series is a plateau (or None), the share of its rise at new input maxima, the tail fit.

    A high-water mark rises only where an input beats every earlier one; between such requests it is
    flat. So the slope is measured again within the stretches between new maxima only: a leak keeps
    its slope there, a high-water mark has none. `cut_at_falls` (host memory): a fall of
    MIN_GROWTH_BYTES or more, glibc trimming the heap, starts a stretch too: a step in the level as a new
    maximum is, and a slope across it is neither's. So the second half's slope, too, is measured within
    the stretches a fall leaves: a leak's level that LMDeploy's heap trim lowered in the second half keeps
    rising after it. (Torch's cache under load falls as requests end, and its stretches stay whole.)
    """
    increments = np.diff(y, prepend=y[0])
    record = new_maxima(x, features, tolerance)
    rises = increments > 0
    total_rise = increments[rises].sum()
    share = float(increments[rises & record].sum() / total_rise) if total_rise > 0 else None
    falls = np.concatenate([[False], level_falls(y)]) if cut_at_falls else np.zeros(len(y), dtype=bool)
    if record[1:].any():
        within = theil_sen(x, y, groups=np.cumsum(record | falls))
        if within is not None and not is_significant(within, x[-1] - x[0]):
            return RECORD_REASON, share, None
    half = len(x) // 2
    tail = theil_sen(x[half:], y[half:], groups=np.cumsum(falls[half:]) if falls[half + 1 :].any() else None)
    if tail is not None and not tail.excludes_zero and abs(tail.slope) <= TAIL_FLAT_RATIO * max(fit.slope, 0.0):
        return STOPPED_REASON, share, tail
    return None, share, tail


def _requests_to_settle(first: Slope, second: Slope, length: float) -> int:
    """How many more requests until a rise slowing as it did from the first half to the second would
    add less than MIN_GROWTH_BYTES over the whole run: the halves' ratio, repeated per half-run."""
    ratio = max(second.slope, 0.0) / first.slope if first.slope > 0 else 0.0
    half = length / 2
    slope = second.slope
    for halves in range(1, 2 * int(MAX_SETTLE_RUNS) + 1):
        slope *= ratio
        if slope * (length + halves * half) < MIN_GROWTH_BYTES:
            return math.ceil(halves * half)
    return math.ceil(MAX_SETTLE_RUNS * length)


def steadiness(x: np.ndarray, y: np.ndarray) -> str | None:
    """Why a significant rise is not yet a leak (it slows down, or the run cannot tell), or None when
    its second half keeps the first half's rate."""
    half = len(x) // 2
    first, second = theil_sen(x[: half + 1], y[: half + 1]), theil_sen(x[half:], y[half:])
    if first is None or second is None or first.slope <= 0:
        return None
    length = float(x[-1] - x[0])
    if second.slope >= STEADY_RATIO * first.slope:
        return None  # keeps most of its rate: no sign of settling within the run
    if second.high < STEADY_RATIO * first.slope:
        more = _requests_to_settle(first, second, length)
        return (
            f"slowing down: {format_bytes(second.slope, signed=True)} per request in the second half of the run "
            f"against {format_bytes(first.slope, signed=True)} in the first "
            "(warm-up, or a cache filling towards its bound); "
            f"about {more:,} more requests would settle it"
        )
    return (
        f"too short to tell a steady rise from warm-up ({format_bytes(second.slope, signed=True)} per request "
        f"in the second half, {format_bytes(first.slope, signed=True)} in the first); "
        f"about {math.ceil(length):,} more requests would settle it"
    )


def mark_or_line(weighed: Weighed, x: np.ndarray) -> tuple[str | None, str | None, str]:
    """A rise whose robust slope within the stretches between new input maxima is not significant: a
    high-water mark (RECORD_REASON) unless a rise within those stretches fits the levels better than flat
    stretches do; a steady rise (None, None) where the line fits exactly, or the stretches rise and no other
    shape fits better than a line; otherwise why it cannot be told (another shape fits better, or nearly every
    point lies beside a new maximum: a run of a few large calls, where every request of a call lies within
    the concurrency of its largest input). Last, the explanation that decided."""
    if weighed.exact_line:
        return None, None, ex.STEADY_LEAK
    more = f"about {math.ceil(x[-1] - x[0]):,} more requests would tell"
    line = weighed.of(ex.STEADY_LEAK)
    # none where no rising shape fits (a reading far above the rest early on turns every rise into a fall)
    rival = next(
        (fit for fit in weighed.fits if fit.name not in (ex.STEADY_LEAK, ex.LEAK_ON_MARK, ex.HIGH_WATER_MARK)), None
    )
    if weighed.of(ex.HIGH_WATER_MARK) is not None and not weighed.prefers(ex.LEAK_ON_MARK, ex.HIGH_WATER_MARK):
        return RECORD_REASON, None, ex.HIGH_WATER_MARK
    if rival is not None and line is not None and weighed.prefers(rival.name, ex.STEADY_LEAK):
        return (
            None,
            (
                f"rises at new input maxima, and a {rival.name} fits its {weighed.points} points better than a steady "
                f"rise (information criterion {rival.bic:.1f} against {line.bic:.1f}); {more}"
            ),
            rival.name,
        )
    if weighed.of(ex.HIGH_WATER_MARK) is None:
        return (
            None,
            (
                f"nearly every one of its {weighed.points} points lies beside a new input maximum: too many to tell a "
                f"high-water mark from steady growth; {more}"
            ),
            ex.HIGH_WATER_MARK,
        )
    return None, None, ex.STEADY_LEAK


def gives_back(x: np.ndarray, y: np.ndarray, mode: str) -> str | None:
    """Why a rise that falls back is not yet a leak: a leak's level between requests never gives much
    back, a working set bounded by eviction (fragmentation, a cache of tensors) falls below its high-water
    level again and again. Only levels read between requests (`idle`) tell: under load they hold the
    requests in flight, which come and go."""
    if mode != "idle":
        return None
    falls = level_falls(y)
    drawdown = float((np.maximum.accumulate(y) - y).max())
    rise = float(y.max() - y[0])
    if falls.sum() < 2 or rise <= 0 or (drawdown < GIVE_BACK_SHARE * rise and falls.mean() < GIVE_BACK_FREQUENCY):
        return None
    return (
        f"rises, but fell back by up to {format_bytes(drawdown)} ({drawdown / rise:.0%} of its rise), "
        f"by {format_bytes(MIN_GROWTH_BYTES)} or more {int(falls.sum())} times between its {len(y)} settled readings: "
        f"a working set that may be bounded; "
        f"about {math.ceil(x[-1] - x[0]):,} more requests would tell whether it keeps rising"
    )
