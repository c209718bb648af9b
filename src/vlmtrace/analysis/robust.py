"""Robust line fitting: the Theil–Sen slope with Sen's confidence interval, in numpy.

A median of pairwise slopes ignores the odd outlier (a request that loaded a huge image, a GC pause
in an RSS reading) that would drag a least-squares fit. Above MAX_PAIRS pairs a fixed-seed random
sample of pairs stands in for all of them; the interval's ranks are taken as fractions, so it holds.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

MAX_PAIRS = 400_000
Z_95 = 1.959963984540054


@dataclasses.dataclass(frozen=True)
class Slope:
    slope: float
    low: float
    high: float
    intercept: float
    points: int
    noise: float  # robust standard deviation of the residuals

    @property
    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0


def _pair_indices(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    if n * (n - 1) // 2 <= MAX_PAIRS:
        return np.triu_indices(n, 1)
    first = rng.integers(0, n, MAX_PAIRS)
    second = rng.integers(0, n, MAX_PAIRS)
    return np.minimum(first, second), np.maximum(first, second)


def robust_sigma(values: np.ndarray) -> float:
    """1.4826 × median absolute deviation: the standard deviation, were the values normal."""
    if len(values) == 0:
        return 0.0
    return float(1.4826 * np.median(np.abs(values - np.median(values))))


def theil_sen(x: np.ndarray, y: np.ndarray, confidence_z: float = Z_95) -> Slope | None:
    """Median pairwise slope of y against x, its ~95% interval (Sen 1968), intercept and noise."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    n = len(x)
    if n < 3:
        return None
    first, second = _pair_indices(n, np.random.default_rng(0))
    dx = x[second] - x[first]
    valid = dx != 0
    if not valid.any():
        return None
    slopes = np.sort((y[second] - y[first])[valid] / dx[valid])
    total_pairs = n * (n - 1) / 2
    spread = confidence_z * math.sqrt(n * (n - 1) * (2 * n + 5) / 18)
    low_fraction = max(0.0, (total_pairs - spread) / (2 * total_pairs))
    high_fraction = min(1.0, (total_pairs + spread) / (2 * total_pairs))
    last = len(slopes) - 1
    slope = float(np.median(slopes))
    low = float(slopes[int(math.floor(low_fraction * last))])
    high = float(slopes[int(math.ceil(high_fraction * last))])
    intercept = float(np.median(y - slope * x))
    noise = robust_sigma(y - (intercept + slope * x))
    return Slope(slope, low, high, intercept, n, noise)
