"""Growth worth a verdict: the test every rise, over a whole run or over one of its regimes, must pass."""

from __future__ import annotations

from typing import TypeGuard

from vlmtrace.analysis.robust import Slope
from vlmtrace.analysis.rules import MIN_GROWTH_BYTES, NOISE_MULTIPLE


def is_significant(fit: Slope | None, span_x: float, min_rate: float = 0.0) -> TypeGuard[Slope]:
    """Growth worth a verdict: above zero with 95% confidence, more than noise and MIN_GROWTH_BYTES over
    the run, and at least `min_rate` per request (the component's `min_leak_rate`)."""
    if fit is None or fit.low <= 0 or fit.slope < min_rate:
        return False
    growth = fit.slope * span_x
    return growth >= MIN_GROWTH_BYTES and growth >= NOISE_MULTIPLE * fit.noise
