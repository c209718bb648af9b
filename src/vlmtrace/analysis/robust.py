"""Robust line fitting: the Theil–Sen slope with Sen's confidence interval, in numpy.

A median of pairwise slopes ignores the odd outlier (a request that loaded a huge image, a GC pause
in an RSS reading) that would drag a least-squares fit. Above MAX_PAIRS pairs a fixed-seed random
sample of pairs stands in for all of them; the interval's ranks are taken as fractions, widened by the
sampling error of those fractions, so it holds at any count of points (ten million and more).
With `groups`, only pairs within one group count (the seasonal Kendall slope of Hirsch et al. 1982,
whose variance is the sum of the groups'): the slope *within* stretches, whatever happens between them.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd

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


def _grouped_pair_indices(groups: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Pairs of points in the same group (groups given as sorted run labels)."""
    _, starts, sizes = np.unique(groups, return_index=True, return_counts=True)
    total = int((sizes * (sizes - 1) // 2).sum())
    if total <= MAX_PAIRS:
        pairs = [np.triu_indices(size, 1) for size in sizes if size > 1]
        offsets = [start for start, size in zip(starts, sizes, strict=True) if size > 1]
        if not pairs:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        return (
            np.concatenate([first + offset for (first, _), offset in zip(pairs, offsets, strict=True)]),
            np.concatenate([second + offset for (_, second), offset in zip(pairs, offsets, strict=True)]),
        )
    group_of = np.repeat(np.arange(len(sizes)), sizes)
    first = rng.integers(0, len(groups), MAX_PAIRS)
    second = starts[group_of[first]] + (rng.random(MAX_PAIRS) * sizes[group_of[first]]).astype(np.int64)
    keep = first != second
    return np.minimum(first, second)[keep], np.maximum(first, second)[keep]


def robust_sigma(values: np.ndarray) -> float:
    """1.4826 × median absolute deviation: the standard deviation, were the values normal."""
    if len(values) == 0:
        return 0.0
    return float(1.4826 * np.median(np.abs(values - np.median(values))))


def theil_sen(
    x: np.ndarray, y: np.ndarray, groups: np.ndarray | None = None, confidence_z: float = Z_95
) -> Slope | None:
    """Median pairwise slope of y against x, its ~95% interval (Sen 1968), intercept and noise.

    `groups` (non-decreasing labels, one per point) limits the pairs to points of the same group.
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    n = len(x)
    if n < 3:
        return None
    rng = np.random.default_rng(0)
    if groups is None:
        first, second = _pair_indices(n, rng)
        sizes = np.array([n], dtype=np.float64)
    else:
        groups = np.asarray(groups)[keep]
        first, second = _grouped_pair_indices(groups, rng)
        sizes = np.unique(groups, return_counts=True)[1].astype(np.float64)  # n³ passes int64 at ~1.7M points
    dx = x[second] - x[first]
    valid = dx != 0
    if not valid.any():
        return None
    slopes = np.sort((y[second] - y[first])[valid] / dx[valid])
    total_pairs = float((sizes * (sizes - 1) / 2).sum())
    spread = confidence_z * math.sqrt(float((sizes * (sizes - 1) * (2 * sizes + 5)).sum()) / 18)
    low_fraction = max(0.0, (total_pairs - spread) / (2 * total_pairs))
    high_fraction = min(1.0, (total_pairs + spread) / (2 * total_pairs))
    if len(slopes) < total_pairs:
        # A sample of the pairs: each rank fraction is itself estimated, with a binomial standard error;
        # the interval is widened by it, so a sampled interval is never narrower than the data allow.
        low_fraction = max(
            0.0, low_fraction - confidence_z * math.sqrt(low_fraction * (1 - low_fraction) / len(slopes))
        )
        high_fraction = min(
            1.0, high_fraction + confidence_z * math.sqrt(high_fraction * (1 - high_fraction) / len(slopes))
        )
    last = len(slopes) - 1
    slope = float(np.median(slopes))
    low = float(slopes[math.floor(low_fraction * last)])
    high = float(slopes[math.ceil(high_fraction * last)])
    detrended = y - slope * x
    intercept = float(np.median(detrended))
    if groups is None:
        noise = robust_sigma(detrended - intercept)
    else:
        # each group keeps its own level (the seasonal model): the steps between groups are not noise
        levels = pd.Series(detrended).groupby(groups).transform("median").to_numpy()
        noise = robust_sigma(detrended - levels)
    return Slope(slope, low, high, intercept, n, noise)
