"""Competing explanations of a rising memory series, each fitted to the settled levels and compared by
how well it fits with the number of points in view (the Bayesian information criterion: n·ln(RSS/n) +
k·ln(n), lower is better; a difference of FIT_MARGIN or more is a preference the points' scatter does
not explain).

- steady leak: a straight line; every request keeps the same bytes.
- warm-up (saturating): a + b·(1 − e^(−x/τ)); LMDeploy's warm-up, a cache filling towards its bound.
- high-water mark: a level that changes only at requests whose input beats every earlier one (torch's
  caching allocator keeping room for the largest image so far): one level per stretch between new
  maxima, so as many parameters as stretches.
- steady leak on a high-water mark: the high-water mark's levels, and a common rise within the stretches
  between new maxima (one parameter more): what a leak on top of a high-water mark looks like.
- plateau: a line that stops and stays level (rose, then stopped).
- one-off step: one jump at one request, level before and after (a buffer allocated once).

The shapes that give memory back (a working set returned, a bounded cache evicting) are read by rules on
the falls themselves (leaks.py), not fitted here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import numpy as np
import pandas as pd

from vlmtrace.analysis.rules import (
    EXACT_FIT,
    FIT_MARGIN,
    LONGEST_WARM_UP,
    MAX_STRETCH_SHARE,
    SHORTEST_WARM_UP,
)
from vlmtrace.analysis.step3_verdict.stretch_sums import StretchSums

STEADY_LEAK = "steady leak"
WARM_UP = "warm-up (saturating)"
HIGH_WATER_MARK = "high-water mark (rises only at new input maxima)"
LEAK_ON_MARK = "steady leak on a high-water mark"
PLATEAU = "plateau (rose, then level)"
ONE_OFF_STEP = "one-off step"
GIVEN_BACK = "working set given back"
BOUNDED_CACHE = "bounded cache (filling towards its bound)"
RECORD_FEATURES = ("image_pixels_max", "images_max", "input_tokens_max")
TIME_CONSTANT_STEPS = 16  # time constants tried for the saturating curve, evenly on a log scale
TIME_CONSTANTS = np.geomspace(SHORTEST_WARM_UP, LONGEST_WARM_UP, TIME_CONSTANT_STEPS)
SHAPE_PARAMETERS = 3  # a level, a height, and where or how fast it rises


@dataclasses.dataclass(frozen=True)
class Fit:
    name: str
    bic: float
    parameters: int

    def to_dict(self) -> dict:
        return {"explanation": self.name, "bic": round(self.bic, 2), "parameters": self.parameters}


@dataclasses.dataclass(frozen=True)
class Weighed:
    fits: tuple[Fit, ...]  # best first
    points: int
    exact_line: bool  # a straight line leaves no residual worth the name

    def of(self, name: str) -> Fit | None:
        return next((fit for fit in self.fits if fit.name == name), None)

    def prefers(self, better: str, worse: str) -> bool:
        """`better` fits by FIT_MARGIN or more over `worse` (False where either was not fitted)."""
        first, second = self.of(better), self.of(worse)
        return first is not None and second is not None and first.bic + FIT_MARGIN <= second.bic

    def runner_up(self, winner: str) -> Fit | None:
        """The best-fitting explanation that is not `winner` (nor a leak, where a leak won: a leak on a
        high-water mark is the same verdict)."""
        same = {winner, LEAK_ON_MARK} if winner == STEADY_LEAK else {winner}
        return next((fit for fit in self.fits if fit.name not in same), None)

    def to_dict(self) -> dict:
        return {"points": self.points, "fits": [fit.to_dict() for fit in self.fits]}


def new_maxima(x: np.ndarray, features: pd.DataFrame, tolerance: float) -> np.ndarray:
    """Points at (or up to `tolerance` requests before) a request whose input beats every earlier one:
    a request in flight beside the one with the new maximum may complete first."""
    record = np.zeros(len(features), dtype=bool)
    for column in RECORD_FEATURES:
        if column not in features:
            continue
        values = features[column].to_numpy(dtype=np.float64)
        filled = np.where(np.isnan(values), -np.inf, values)
        previous_max = np.concatenate([[-np.inf], np.maximum.accumulate(filled)[:-1]])
        record |= filled > previous_max
    if tolerance > 0 and record.any():
        # each point is a record if a record point lies at most `tolerance` requests after it
        next_record = np.searchsorted(x[record], x, "left")
        has_next = next_record < record.sum()
        record = has_next & (x[record][np.minimum(next_record, record.sum() - 1)] - x <= tolerance)
    return record


def _least_squares(design: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    coefficients, *_ = np.linalg.lstsq(design, y, rcond=None)
    residual = y - design @ coefficients
    return float(residual @ residual), coefficients


def _line(x: np.ndarray, y: np.ndarray) -> float:
    return _least_squares(np.column_stack([np.ones_like(x), x]), y)[0]


def _stretches(marks: np.ndarray) -> np.ndarray:
    """Each point's stretch: a new one starts at each point marked as a new input maximum."""
    return np.cumsum(marks) - (1 if marks[0] else 0)


def _high_water_mark(y: np.ndarray, groups: np.ndarray) -> tuple[float, int]:
    """One level per stretch."""
    levels = pd.Series(y).groupby(groups).transform("mean").to_numpy()
    return float(((y - levels) ** 2).sum()), int(groups.max()) + 1


def _leak_on_mark(x: np.ndarray, y: np.ndarray, groups: np.ndarray) -> tuple[float, int]:
    """One level per stretch and a common slope within them: the slope of x and y less their stretch's means."""
    count = np.bincount(groups)
    within_x = x - (np.bincount(groups, x) / count)[groups]
    within_y = y - (np.bincount(groups, y) / count)[groups]
    sxx, sxy, syy = float(within_x @ within_x), float(within_x @ within_y), float(within_y @ within_y)
    slope = sxy / sxx if sxx > 0 else 0.0
    return max(syy - slope * sxy, 0.0), len(count) + 1


def _best_rising(x: np.ndarray, y: np.ndarray, columns: Iterable[np.ndarray]) -> float:
    """The least residual of a + b·f(x) over the candidate shapes f, with b ≥ 0 (a rise)."""
    best = np.inf
    for column in columns:
        rss, coefficients = _least_squares(np.column_stack([np.ones_like(x), column]), y)
        if coefficients[1] >= 0:
            best = min(best, rss)
    return best


def _by_x(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(x, kind="stable")
    return x[order], y[order]


def weigh(x: np.ndarray, y: np.ndarray, features: pd.DataFrame, tolerance: float) -> Weighed:
    """Every explanation fitted to the levels `y` at requests `x`, best first."""
    x = np.asarray(x, dtype=np.float64) - float(x[0])
    y = np.asarray(y, dtype=np.float64)
    n = len(x)
    span = float(x[-1]) or 1.0
    rise = float(np.ptp(y)) or 1.0
    floor = (EXACT_FIT * rise) ** 2  # a residual variance below this is an exact fit: log(0) is not a score
    line_rss = _line(x, y)
    interior = x[1:-1]
    candidates = {STEADY_LEAK: (line_rss, 2)}
    marks = new_maxima(x, features.reset_index(drop=True), tolerance)
    groups = _stretches(marks)
    if marks[1:].any() and groups.max() + 1 < MAX_STRETCH_SHARE * n:  # as many levels as that interpolate the points
        candidates[HIGH_WATER_MARK] = _high_water_mark(y, groups)
        candidates[LEAK_ON_MARK] = _leak_on_mark(x, y, groups)
    if len(interior):
        sums = StretchSums(x, y) if np.all(np.diff(x) >= 0) else StretchSums(*_by_x(x, y))
        candidates[WARM_UP] = (
            _best_rising(x, y, (1 - np.exp(-x / (share * span)) for share in TIME_CONSTANTS)),
            SHAPE_PARAMETERS,
        )
        candidates[PLATEAU] = (float(sums.plateaus().min()), SHAPE_PARAMETERS)
        candidates[ONE_OFF_STEP] = (float(sums.steps().min()), SHAPE_PARAMETERS)
    fits = [
        Fit(name, n * float(np.log(max(rss / n, floor))) + parameters * float(np.log(n)), parameters)
        for name, (rss, parameters) in candidates.items()
        if np.isfinite(rss)
    ]
    fits.sort(key=lambda fit: (fit.bic, fit.parameters))
    return Weighed(tuple(fits), n, line_rss / n <= floor)
