"""The settled memory level after each request: what a request leaves behind, without its transients.

Two regimes (docs/analysis.md, "Settled levels"):
- idle: requests come in busy periods (one request, or one pipeline call's batch) separated by
  moments with no request in flight. The settled level after a busy period is the last reading before
  the next one starts: the floor the next period begins from. Its x is the number of requests completed.
- load: requests overlap without pause (a server under steady load). The settled level after request i
  is the reading between its end and the next request's end with the fewest requests in flight.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from vlmtrace.analysis.rules import IDLE_COVERAGE, MIN_SETTLED_POINTS


@dataclasses.dataclass
class SettledSeries:
    mode: str  # "idle" or "load"
    rows: np.ndarray  # row positions in the process's readings frame
    x: np.ndarray  # requests completed at each point
    t_ns: np.ndarray
    features: pd.DataFrame  # per point: <feature>_max and <feature>_sum over the requests it closes
    concurrency: float  # median requests in flight at the chosen readings


def in_flight_at(times: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Requests running at each time: started strictly before it and not ended at or before it."""
    return np.searchsorted(starts, times, "left") - np.searchsorted(ends, times, "right")


def _features(requests: pd.DataFrame, group: np.ndarray, groups: int) -> pd.DataFrame:
    columns = ["image_pixels", "images", "input_tokens", "output_tokens"]
    frame = requests[columns].copy()
    frame["group"] = group
    grouped = frame.groupby("group")
    maxima = grouped.max().reindex(range(groups)).add_suffix("_max")
    sums = grouped.sum(min_count=1).reindex(range(groups)).add_suffix("_sum")
    return pd.concat([maxima, sums], axis=1).reset_index(drop=True)


def _idle(times: np.ndarray, quiet: np.ndarray, requests: pd.DataFrame) -> SettledSeries | None:
    by_start = requests.sort_values("start_ns", kind="stable")
    starts = by_start["start_ns"].to_numpy()
    running_end = np.maximum.accumulate(by_start["end_ns"].to_numpy())
    opens = np.concatenate([[True], starts[1:] > running_end[:-1]])
    period_of = np.cumsum(opens) - 1
    periods = int(period_of[-1]) + 1
    if periods < MIN_SETTLED_POINTS:
        return None
    period_end = running_end[np.flatnonzero(np.concatenate([opens[1:], [True]]))]
    next_start = np.append(starts[opens][1:], np.iinfo(np.int64).max)
    gaps = next_start[:-1] - period_end[:-1]
    last_window = int(np.median(gaps)) if len(gaps) else 0
    next_start[-1] = period_end[-1] + last_window
    period = np.searchsorted(period_end, times, "right") - 1
    valid = quiet & (period >= 0)
    valid[valid] = times[valid] <= next_start[period[valid]]
    candidates = np.flatnonzero(valid)
    if not len(candidates):
        return None
    chosen_period, first_from_end = np.unique(period[candidates][::-1], return_index=True)
    rows = candidates[::-1][first_from_end]
    if len(chosen_period) < max(MIN_SETTLED_POINTS, IDLE_COVERAGE * periods):
        return None
    completed = np.cumsum(np.bincount(period_of, minlength=periods))
    features = _features(by_start, period_of, periods).iloc[chosen_period].reset_index(drop=True)
    return SettledSeries("idle", rows, completed[chosen_period].astype(np.float64), times[rows], features, 0.0)


def _load(times: np.ndarray, flight: np.ndarray, requests: pd.DataFrame) -> SettledSeries | None:
    ends = requests["end_ns"].to_numpy()
    window = np.searchsorted(ends, times, "right") - 1
    usable = np.flatnonzero(window >= 0)
    if not len(usable):
        return None
    order = np.lexsort((times[usable], flight[usable], window[usable]))
    ordered = usable[order]
    chosen_window, first = np.unique(window[ordered], return_index=True)
    rows = ordered[first]
    if len(rows) < MIN_SETTLED_POINTS:
        return None
    features = _features(requests, np.arange(len(requests)), len(requests)).iloc[chosen_window].reset_index(drop=True)
    return SettledSeries(
        "load", rows, (chosen_window + 1).astype(np.float64), times[rows], features, float(np.median(flight[rows]))
    )


def settle(readings: pd.DataFrame, requests: pd.DataFrame) -> SettledSeries | None:
    """Settled points of one process's readings (sorted by time) against all requests (sorted by end)."""
    if len(requests) < MIN_SETTLED_POINTS or not len(readings):
        return None
    times = readings["t_ns"].to_numpy()
    starts = np.sort(requests["start_ns"].to_numpy())
    flight = in_flight_at(times, starts, requests["end_ns"].to_numpy())
    return _idle(times, flight <= 0, requests) or _load(times, flight, requests)


def read_after(series: SettledSeries, ends_ns: np.ndarray) -> np.ndarray:
    """Per settled point: whether one of the events that ended at `ends_ns` (LMDeploy's heap trims) ended
    since the point before it, so that its level is the first read after that event."""
    after = np.zeros(len(series.x), dtype=bool)
    points = np.searchsorted(series.t_ns, ends_ns)
    after[points[points < len(after)]] = True
    return after
