"""Which stage retains the bytes, and which input feature drives how many.

Stages: between two settled points (one request, or one batch) every change of a component is given to
the span that owned the interval it happened in — the most recently started span still open, which is
the innermost one when nothing runs concurrently. Summing per stage over the windows gives each stage's
net change. A transient inside one span nets to zero; a hand-off (the vision stage allocates an
embedding that the request frees at its end) leaves the allocating stage positive and the freeing
stage negative by the same amount, window after window. Each negative stage is therefore cancelled
against the positive stage whose per-window changes mirror it (most negative correlation; closest
size when nothing varies). What stays positive is retained.

The cache (reserved − allocated) is attributed where torch *reserves*: a stage's retained reserved bytes
minus its retained tensor bytes. Freeing a tensor also raises the cache, but the stage that grew the
reservation is the one that made the cache hold more.

Input features: the retained bytes of each settled point (its level minus the previous one) are
compared with the point's inputs (image pixels, images, tokens) by rank correlation and a robust slope.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from vlmtrace.analysis.robust import theil_sen

NO_SPAN = "(outside any span)"
FEATURE_UNITS = {"image_pixels": "pixel", "images": "image", "input_tokens": "input token", "output_tokens": "output token"}
MIN_CORRELATION = 0.3
JUMP_LIMIT = 256


def _previous_longer(ends: np.ndarray) -> np.ndarray:
    """For each span (by start), the nearest earlier span that ends later (−1 if none)."""
    candidate = np.arange(len(ends)) - 1
    for _ in range(JUMP_LIMIT):
        active = candidate >= 0
        active[active] = ends[candidate[active]] <= ends[active]
        if not active.any():
            return candidate
        candidate[active] = candidate[candidate[active]]
    return candidate


def interval_owners(times: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Index (into spans sorted by start, innermost last on ties) of the span owning (t, next reading]."""
    previous = _previous_longer(ends)
    owner = np.searchsorted(starts, times, "right") - 1
    for _ in range(JUMP_LIMIT):
        closed = owner >= 0
        closed[closed] = ends[owner[closed]] <= times[closed]
        if not closed.any():
            break
        owner[closed] = previous[owner[closed]]
    return owner


def _correlations(matrix: np.ndarray, column: int) -> np.ndarray:
    """Pearson correlation of every column of `matrix` with one of them (0 where undefined)."""
    centred = matrix - matrix.mean(axis=0)
    norms = np.sqrt((centred**2).sum(axis=0))
    with np.errstate(invalid="ignore", divide="ignore"):
        result = (centred * centred[:, [column]]).sum(axis=0) / (norms * norms[column])
    return np.nan_to_num(result)


def _cancel_hand_offs(per_window: np.ndarray) -> np.ndarray:
    """Stage totals after cancelling each releasing stage against the stage it mirrors."""
    totals = per_window.sum(axis=0)
    while (totals < 0).any() and (totals > 0).any():
        releasing = int(np.argmin(totals))
        positive = np.flatnonzero(totals > 0)
        correlations = _correlations(per_window, releasing)[positive]
        if correlations.min() <= -MIN_CORRELATION:
            partner = int(positive[np.argmin(correlations)])
        else:
            partner = int(positive[np.argmin(np.abs(totals[positive] + totals[releasing]))])
        amount = min(-totals[releasing], totals[partner])
        totals[releasing] += amount
        totals[partner] -= amount
    return totals


def stage_labels(spans: pd.DataFrame) -> tuple[np.ndarray, list[str]]:
    """Each span's stage as a small integer code, and the names; a span without a stage goes by its name."""
    stage = pd.Categorical(spans["stage"])
    name = pd.Categorical(spans["name"])
    codes = np.where(stage.codes >= 0, stage.codes, len(stage.categories) + name.codes)
    used, compact = np.unique(codes, return_inverse=True)
    everything = [str(c) for c in stage.categories] + [str(c) for c in name.categories]
    return compact.astype(np.int64), [everything[code] for code in used]


CONTAINER_SAMPLE = 100_000  # spans (in start order) enough to tell which stages hold others


def _container_stages(spans: pd.DataFrame, stage_codes: np.ndarray, stage_count: int) -> np.ndarray:
    """Stages whose spans mostly have children (pipeline, request, preprocess): they hold work, not do it.

    `spans` are in start order, so a leading stretch holds whole traces: parents with their children.
    """
    head = spans.iloc[:CONTAINER_SAMPLE]
    has_child = head["span_id"].isin(head["parent_id"].dropna()).to_numpy(dtype=bool)
    codes = stage_codes[:CONTAINER_SAMPLE]
    with_child = np.bincount(codes, weights=has_child, minlength=stage_count)
    return with_child >= 0.5 * np.bincount(codes, minlength=stage_count)


def _working_stages(times: np.ndarray, starts: np.ndarray, ends: np.ndarray, stage_codes: np.ndarray, working: np.ndarray) -> np.ndarray:
    """How many different working stages had a span open at each time."""
    count = np.zeros(len(times), dtype=np.int32)
    for code in np.flatnonzero(working):
        mine = stage_codes == code
        open_spans = np.searchsorted(np.sort(starts[mine]), times, "right") - np.searchsorted(np.sort(ends[mine]), times, "right")
        count += open_spans > 0
    return count


def retained_by_stage(
    readings: pd.DataFrame, spans: pd.DataFrame, components: tuple[str, ...], edges_ns: np.ndarray
) -> pd.DataFrame:
    """Retained bytes per (stage, component) for one process, over the windows between settled points.

    `overlapped_bytes` is the part of a stage's net change that happened while another stage's work
    ran too: there the owner rule is a guess.
    """
    columns = ["stage", "component", "retained_bytes", "net_bytes", "overlapped_bytes"]
    times = readings["t_ns"].to_numpy()
    if len(times) < 2 or len(edges_ns) < 2:
        return pd.DataFrame(columns=columns)
    order = np.lexsort((-spans["end_ns"].to_numpy(), spans["start_ns"].to_numpy()))
    spans = spans[["start_ns", "end_ns", "stage", "name", "span_id", "parent_id"]].iloc[order]
    starts = spans["start_ns"].to_numpy()
    ends = spans["end_ns"].to_numpy()
    stage_codes, stage_names = stage_labels(spans)
    names = [str(name) for name in stage_names] + [NO_SPAN]
    window = np.searchsorted(edges_ns, times[1:], "left")
    inside = (window > 0) & (window < len(edges_ns))
    window = window[inside] - 1
    interval_start = times[:-1][inside]
    owner = interval_owners(interval_start, starts, ends) if len(starts) else np.full(len(interval_start), -1)
    label = np.where(owner >= 0, stage_codes[np.maximum(owner, 0)] if len(starts) else 0, len(names) - 1)
    working = ~_container_stages(spans, stage_codes, len(stage_names)) if len(starts) else np.zeros(0, bool)
    shared = _working_stages(interval_start, starts, ends, stage_codes, working) >= 2
    cells = window * len(names) + label
    shape = (len(edges_ns) - 1, len(names))
    results: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    for column in ("tensor", "reserved", "native", "host"):
        change = np.diff(readings[column].to_numpy())[inside]
        known = np.isfinite(change)
        if not known.any():
            continue
        per_window = np.bincount(cells[known], weights=change[known], minlength=shape[0] * shape[1]).reshape(shape)
        overlapped = np.bincount(label[known & shared], weights=change[known & shared], minlength=len(names))
        results[column] = (_cancel_hand_offs(per_window), per_window.sum(axis=0), overlapped)
    if "reserved" in results and "tensor" in results:
        reserved, tensor = results.pop("reserved"), results["tensor"]
        results["cache"] = tuple(r - t for r, t in zip(reserved, tensor))
    results.pop("reserved", None)
    touched = np.bincount(label, minlength=len(names)) > 0
    rows = [
        (names[index], component, float(retained[index]), float(net[index]), float(overlapped[index]))
        for component, (retained, net, overlapped) in results.items()
        if component in components
        for index in np.flatnonzero(touched)
    ]
    return pd.DataFrame(rows, columns=columns)


@dataclasses.dataclass
class FeatureDriver:
    feature: str
    correlation: float
    bytes_per_unit: float
    unit: str


def _rank_correlation(a: np.ndarray, b: np.ndarray) -> float:
    ranks_a = pd.Series(a).rank().to_numpy()
    ranks_b = pd.Series(b).rank().to_numpy()
    if np.std(ranks_a) == 0 or np.std(ranks_b) == 0:
        return 0.0
    return float(np.corrcoef(ranks_a, ranks_b)[0, 1])


def feature_drivers(levels: np.ndarray, features: pd.DataFrame) -> list[FeatureDriver]:
    """Input features whose value tracks the bytes each point retains, strongest first."""
    retained = np.diff(levels)
    drivers = []
    for feature, unit in FEATURE_UNITS.items():
        column = f"{feature}_sum"
        if column not in features:
            continue
        values = features[column].to_numpy(dtype=np.float64)[1:]
        keep = np.isfinite(values) & np.isfinite(retained)
        if keep.sum() < 10 or np.ptp(values[keep]) == 0:
            continue
        correlation = _rank_correlation(values[keep], retained[keep])
        threshold = max(MIN_CORRELATION, 2.6 / np.sqrt(keep.sum()))
        if correlation >= threshold:
            fit = theil_sen(values[keep], retained[keep])
            drivers.append(FeatureDriver(feature, correlation, fit.slope if fit else float("nan"), unit))
    return sorted(drivers, key=lambda driver: -driver.correlation)
