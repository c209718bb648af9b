"""Growth regimes: a component's settled levels split where their rate per request changes.

A leak rarely runs from the first request: it starts after a deploy, a config change or a new kind of
input, and it may stop again. The levels are fitted with straight lines, one per regime, split greedily
(binary segmentation): each step adds the one split, of any regime at any point, that lowers the residual
most, and is kept while it lowers the Bayesian information criterion (as explanations.py weighs shapes:
n·ln(RSS/n) + k·ln(n), three parameters a regime: its level, its rate and where it starts) by REGIME_MARGIN
or more, up to MAX_REGIMES. Every split is read from running sums (stretch_sums.py) in O(n). Neighbouring
regimes whose rates the robust fits cannot tell apart (each one's Theil–Sen slope within the other's 95 %
interval), or that differ by less than REGIME_RATIO (a leak whose rate follows its inputs wanders that much),
are one: a level that jumped once keeps its rate. The current regime is the last one: where the
run's rate changed, its rate is the rate now, and its first request the onset.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools

import numpy as np

from vlmtrace.analysis.robust import Slope, theil_sen
from vlmtrace.analysis.rules import (
    EXACT_FIT,
    MAX_REGIMES,
    MIN_POINTS_TO_FIT,
    MIN_REGIME_SHARE,
    REGIME_MARGIN,
    REGIME_RATIO,
)
from vlmtrace.analysis.step3_verdict.significance import is_significant
from vlmtrace.analysis.step3_verdict.stretch_sums import StretchSums

REGIME_PARAMETERS = 3  # a level, a rate and where it starts


def _clock(t_ns: int) -> str:
    """The time of day (UTC) a regime began or ended, as the report's headline says it."""
    return datetime.datetime.fromtimestamp(t_ns / 1e9, tz=datetime.timezone.utc).strftime("%H:%M")


@dataclasses.dataclass(frozen=True)
class Regime:
    start: int  # first point (index into the fitted levels)
    stop: int  # one past its last point
    first_request: float  # requests completed at its first point
    last_request: float
    start_ns: int
    end_ns: int
    rate: Slope  # Theil–Sen over its points
    kept_bytes: float  # its level at its last point less its level at its first (the fit's line)

    def said_start(self) -> str:
        return f"request ~{int(self.first_request):,} ({_clock(self.start_ns)})"

    def said_end(self) -> str:
        return f"request ~{int(self.last_request):,} ({_clock(self.end_ns)})"

    def to_dict(self) -> dict:
        return {
            "start_request": int(self.first_request),
            "end_request": int(self.last_request),
            "start_time_ns": int(self.start_ns),
            "end_time_ns": int(self.end_ns),
            "slope_bytes_per_request": self.rate.slope,
            "slope_interval_bytes_per_request": [self.rate.low, self.rate.high],
            "points": self.stop - self.start,
            "rise_bytes": self.kept_bytes,
        }


def _bic(rss: float, n: int, regimes: int, floor: float) -> float:
    return n * float(np.log(max(rss / n, floor))) + REGIME_PARAMETERS * regimes * float(np.log(n))


def _best_split(sums: StretchSums, start: int, stop: int, shortest: int) -> tuple[float, int]:
    """The least residual of two lines over [start, stop) split at one point, and that point."""
    cuts = np.arange(start + shortest, stop - shortest + 1)
    if not len(cuts):
        return np.inf, -1
    left, _ = sums.line(np.full(len(cuts), start), cuts)
    right, _ = sums.line(cuts, np.full(len(cuts), stop))
    total = left + right
    best = int(np.argmin(total))
    return float(total[best]), int(cuts[best])


def _bounds(x: np.ndarray, y: np.ndarray) -> list[int]:
    """Where the regimes start, and the end: binary segmentation of least-squares lines, kept while the
    information criterion falls by REGIME_MARGIN or more."""
    n = len(x)
    shortest = max(int(MIN_POINTS_TO_FIT), int(np.ceil(MIN_REGIME_SHARE * n)))
    bounds = [0, n]
    if n < 2 * shortest:
        return bounds
    sums = StretchSums(x, y)
    floor = (EXACT_FIT * (float(np.ptp(y)) or 1.0)) ** 2
    rss = [float(sums.line(0, n)[0])]
    while len(bounds) - 1 < MAX_REGIMES:
        options = [
            (rss[i] - split, i, cut)
            for i in range(len(rss))
            for split, cut in [_best_split(sums, bounds[i], bounds[i + 1], shortest)]
            if cut >= 0
        ]
        if not options:
            break
        gain, i, cut = max(options)
        now = sum(rss)
        if _bic(now - gain, n, len(rss) + 1, floor) + REGIME_MARGIN > _bic(now, n, len(rss), floor):
            break
        left, right = float(sums.line(bounds[i], cut)[0]), float(sums.line(cut, bounds[i + 1])[0])
        bounds.insert(i + 1, cut)
        rss[i : i + 1] = [left, right]
    return bounds


def _regime(x: np.ndarray, y: np.ndarray, t_ns: np.ndarray, start: int, stop: int) -> Regime | None:
    rate = theil_sen(x[start:stop], y[start:stop])
    if rate is None:
        return None
    return Regime(
        start,
        stop,
        float(x[start]),
        float(x[stop - 1]),
        int(t_ns[start]),
        int(t_ns[stop - 1]),
        rate,
        rate.slope * float(x[stop - 1] - x[start]),
    )


def _apart(first: Slope, second: Slope) -> bool:
    """Two rates the robust fits tell apart (neither lies within the other's 95 % interval) and far enough
    apart to be a change of regime: the slower does not rise, or the faster rises REGIME_RATIO times as fast."""
    if first.low <= second.slope <= first.high or second.low <= first.slope <= second.high:
        return False
    slower, faster = sorted((first.slope, second.slope))
    return slower <= 0 or faster >= REGIME_RATIO * slower


def split(x: np.ndarray, y: np.ndarray, t_ns: np.ndarray) -> list[Regime]:
    """The regimes of levels `y` at requests `x` (non-decreasing), read at `t_ns`, first to last; one where
    the rate never changed (none where no line can be fitted)."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    bounds = _bounds(x, y)
    merged = True
    while merged and len(bounds) > 2:
        merged = False
        regimes = [_regime(x, y, t_ns, start, stop) for start, stop in itertools.pairwise(bounds)]
        for i, (first, second) in enumerate(itertools.pairwise(regimes)):
            if first is None or second is None or not _apart(first.rate, second.rate):
                del bounds[i + 1]
                merged = True
                break
    found = [_regime(x, y, t_ns, start, stop) for start, stop in itertools.pairwise(bounds)]
    return [regime for regime in found if regime is not None]


def _rises(regime: Regime, min_rate: float) -> bool:
    """A regime that is growth worth a verdict on its own, over its own requests."""
    return is_significant(regime.rate, regime.last_request - regime.first_request, min_rate)


@dataclasses.dataclass(frozen=True)
class Change:
    """How the rate changed into the current regime, where it did."""

    regimes: tuple[Regime, ...]
    onset: Regime | None  # the current regime, where it rises and the one before rose slower: growing since its start
    stopped: Regime | None  # the last rising regime, where the current one does not rise: the leak stopped at its end

    @property
    def kept_bytes(self) -> float:
        """What the rising regimes kept, where the leak stopped."""
        return sum(regime.kept_bytes for regime in self.regimes if regime.rate.excludes_zero and regime.rate.slope > 0)

    def to_dict(self) -> dict:
        out: dict = {"regimes": [regime.to_dict() for regime in self.regimes], "onset": None, "stopped": None}
        if self.onset is not None:
            out["onset"] = {"request": int(self.onset.first_request), "time_ns": int(self.onset.start_ns)}
        if self.stopped is not None:
            out["stopped"] = {
                "request": int(self.stopped.last_request),
                "time_ns": int(self.stopped.end_ns),
                "kept_bytes": self.kept_bytes,
            }
        return out


def change(x: np.ndarray, y: np.ndarray, t_ns: np.ndarray, min_rate: float) -> Change:
    """The regimes of the levels, and whether the current one began a rise (an onset) or ended one (stopped)."""
    regimes = tuple(split(x, y, t_ns))
    if len(regimes) < 2:
        return Change(regimes, None, None)
    current, before = regimes[-1], regimes[-2]
    onset = current if _rises(current, min_rate) and current.rate.slope > before.rate.slope else None
    rising = [regime for regime in regimes[:-1] if _rises(regime, min_rate)]
    stopped = rising[-1] if rising and current.rate.low <= 0 and not _rises(current, min_rate) else None
    return Change(regimes, onset, stopped)
