"""Which stage retains the bytes: every memory change charged to the work that ran when it happened.

Between two consecutive readings (placed where they were read: a reading reused by a later span
boundary keeps its own time) a component changes by some bytes. Its *candidates* are the stages whose
work ran in that interval (span_events.py).

Where an interval has several candidates, its change is split in proportion to each stage's typical
change in the intervals it ran in *alone* (the tightest bracket: nothing else could have made those),
so that a stage that merely ran beside the cause gets little. Summed per stage over the windows between
settled points, a transient inside one span nets to zero; a hand-off (the vision stage allocates an
embedding that the request frees at its end) leaves the allocating stage positive and the freeing stage
negative by the same amount, window after window: each negative stage is cancelled against the positive
stage whose per-window changes mirror it (most negative correlation; closest size when nothing varies).
What stays positive is retained. The cache (reserved − allocated) is attributed where torch *reserves*:
a stage's retained reserved bytes minus its retained tensor bytes. docs/analysis.md, "Where", has the why.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from vlmtrace import semconv as sc
from vlmtrace.analysis.rules import (
    GAIN_BYTES,
    GAIN_SHARE,
    MIN_CORRELATION,
    MIN_SOLE_INTERVALS,
    RATE_FLOOR,
)
from vlmtrace.analysis.step2_preparing.span_events import SpanEvents, span_counts
from vlmtrace.analysis.step2_preparing.tables import give_back_freed_memory

COLUMNS = ["stage", "component", "retained_bytes", "net_bytes", "overlapped_bytes"]
# A cancelled hand-off: `stage` allocated what `releasing` freed (`bytes`); `releasing_gains`: the share of the
# windows in which the releasing stage gained memory itself (0 for a container and for no span).
HAND_OFF_COLUMNS = ["component", "stage", "releasing", "bytes", "releasing_gains"]
BYTE_BITS, WORD_BITS = 8, 64  # a row's candidate stages packed as the bits of one int64
SAMPLED_AS = {"reserved": "cache"}  # the raw reading the cache is attributed by, when the cache is read by the sampler


@dataclasses.dataclass
class StageCharges:
    retained: pd.DataFrame  # COLUMNS: per (stage, component), over the whole run
    # Per component asked for: one row per window between consecutive settled points, one column per
    # stage: the bytes charged to it there, before hand-offs are cancelled (stage_rise.py reads their course).
    per_window: dict[str, pd.DataFrame]
    hand_offs: (
        pd.DataFrame
    )  # HAND_OFF_COLUMNS, of the components asked for (none for the cache: it is a difference of two readings)


def _correlations(table: np.ndarray, column: int) -> np.ndarray:
    """Pearson correlation of every column of `table` with one of them (0 where undefined)."""
    centred = table - table.mean(axis=0)
    norms = np.sqrt((centred**2).sum(axis=0))
    with np.errstate(invalid="ignore", divide="ignore"):
        result = (centred * centred[:, [column]]).sum(axis=0) / (norms * norms[column])
    return np.nan_to_num(result)


def _cancel_hand_offs(per_window: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Stage totals after cancelling each releasing stage against the stage it mirrors, and what was
    cancelled: (partner, releasing) → bytes."""
    totals = per_window.sum(axis=0)
    handed = np.zeros((len(totals), len(totals)))
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
        handed[partner, releasing] += amount
    return totals, handed


def _hand_offs(
    component: str,
    names: list[str],
    per_window: np.ndarray,
    handed: np.ndarray,
    retained: np.ndarray,
    working: np.ndarray,
) -> list[tuple]:
    """HAND_OFF_COLUMNS rows: each cancellation, with the share of windows where the releasing stage
    gained memory itself, counted where it does work (`working`, per name): a container's charges are its
    shares of intervals its children ran in, which gain and lose at random. A gain is more than GAIN_BYTES
    and more than GAIN_SHARE of what the allocating stage kept per window (`retained`, after cancelling):
    a stage that keeps memory of its own, the alternative a hand-off leaves open, gains on that scale,
    while the intervals a busy CPU makes the two stages share charge it a few hundred KiB either way."""
    rows = []
    for partner, releasing in zip(*np.nonzero(handed), strict=True):
        floor = max(GAIN_BYTES, GAIN_SHARE * retained[partner] / max(len(per_window), 1))
        gains = float((per_window[:, releasing] > floor).mean()) if working[releasing] and len(per_window) else 0.0
        rows.append((component, names[partner], names[releasing], float(handed[partner, releasing]), gains))
    return rows


def _patterns(design: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct rows of a design table (a handful of candidate sets for millions of intervals)
    and each interval's row among them."""
    if design.dtype == bool and design.shape[1] < WORD_BITS - 1:
        # Each row's bits as one int64, packed 8 to a byte (a dot product with the powers of two would first widen the whole
        # table to int64: 155 MB at 2 M intervals).
        packed = np.zeros((len(design), WORD_BITS // BYTE_BITS), np.uint8)
        packed[:, : (design.shape[1] + BYTE_BITS - 1) // BYTE_BITS] = np.packbits(design, axis=1, bitorder="little")
        keys = packed.view("<i8").ravel()
        # Hashed, not sorted as np.unique would (its permutation and sorted copy: 50 MB at 2 M intervals).
        inverse, unique_keys = pd.factorize(keys, sort=True)
        first_rows = pd.Series(inverse).drop_duplicates().index.to_numpy()
        first = np.empty(len(unique_keys), np.int64)
        first[inverse[first_rows]] = first_rows
        return design[first].astype(np.float64), inverse
    rows, inverse = np.unique(design, axis=0, return_inverse=True)
    return rows.astype(np.float64), inverse.reshape(-1)


def stage_rates(change: np.ndarray, rows: np.ndarray, inverse: np.ndarray) -> np.ndarray:
    """Each stage's typical change per interval, from the intervals it ran in alone (the tightest
    bracket there is: nothing else could have made that change); NaN for a stage never alone. Shared
    intervals do not set the rates: there, another thread's transient (activations allocated beside one
    neighbour and freed beside another) would be charged to whichever stage happened to run with it."""
    sole = rows.sum(axis=1) == 1
    counts = np.bincount(inverse, minlength=len(rows))
    sums = np.bincount(inverse, weights=change, minlength=len(rows))
    intervals = counts[sole] @ rows[sole]
    total = sums[sole] @ rows[sole]
    return np.where(intervals >= MIN_SOLE_INTERVALS, total / np.maximum(intervals, 1), np.nan)


def shares(change: np.ndarray, rows: np.ndarray, inverse: np.ndarray) -> np.ndarray:
    """For each candidate set: the part of an interval's change each stage is charged, in proportion to
    the stages' typical rates (equally where none has one)."""
    rates = np.abs(stage_rates(change, rows, inverse))
    known = rates[np.isfinite(rates)]
    rates = np.where(np.isfinite(rates), rates, np.median(known) if len(known) else 1.0)
    weighted = rows * np.maximum(rates, RATE_FLOOR * max(rates.max(), 1.0))
    total = weighted.sum(axis=1, keepdims=True)
    return np.divide(weighted, total, out=np.zeros_like(weighted), where=total > 0)


def _unseen_windows(
    per_window: np.ndarray, by_window: np.ndarray, rows: np.ndarray, names: list[str]
) -> tuple[int, np.ndarray] | None:
    """Where requests without stage detail ran (sc.STAGE_WITHOUT_DETAIL among an interval's candidates),
    the whole window between settled points is charged to them: their vision and engine work ran unseen
    there, and any part given to the stages beside them would be a guess the detail they did not record
    could not check. The stages are told apart in the other windows. `per_window` is changed in place;
    `by_window` is each window's change by candidate set. Returns the unseen column and the windows
    charged to it (None: no request without detail)."""
    if sc.STAGE_WITHOUT_DETAIL not in names:
        return None
    unseen = names.index(sc.STAGE_WITHOUT_DETAIL)
    touched = (by_window[:, rows[:, unseen] > 0] != 0).any(axis=1)
    per_window[touched] = 0.0
    per_window[touched, unseen] = by_window[touched].sum(axis=1)
    return unseen, touched


def _cancel_seen(per_window: np.ndarray, unseen: tuple[int, np.ndarray] | None) -> tuple[np.ndarray, np.ndarray]:
    """_cancel_hand_offs among the stages seen, over the windows seen: what requests without detail did
    is no stage's to mirror, and their windows say nothing of how the stages' changes mirror each other."""
    if unseen is None:
        return _cancel_hand_offs(per_window)
    column, touched = unseen
    seen = np.arange(per_window.shape[1]) != column
    retained, handed = per_window.sum(axis=0), np.zeros((per_window.shape[1],) * 2)
    retained[seen], handed[np.ix_(seen, seen)] = _cancel_hand_offs(per_window[np.ix_(~touched, seen)])
    return retained, handed


def retained_by_stage(
    readings: pd.DataFrame,
    spans: pd.DataFrame,
    components: tuple[str, ...],
    edges_ns: np.ndarray,
    sampled: tuple[str, ...] = (),
    keep_windows: tuple[str, ...] = (),
) -> StageCharges:
    """Retained bytes per (stage, component) for one process, over the windows between settled points.

    `readings` need `read_ns` and `fresh` (tables.py); `spans` are the process's timed spans as
    `span_events.with_prompt_spans` gives them. `sampled` components change only with the background samples: when there are
    samples, those alone are their readings. `overlapped_bytes` is the part of a stage's net change
    charged in intervals it shared with other candidates: there the split is an estimate.
    `keep_windows`: the components whose charges per window the result keeps. `components` may name
    `heap` too: the heap counter's readings (probes/heap.py), charged like a component's where a process has them.
    """
    if len(edges_ns) < 2 or spans.empty:
        return StageCharges(pd.DataFrame(columns=COLUMNS), {}, pd.DataFrame(columns=HAND_OFF_COLUMNS))
    events = SpanEvents(spans, readings["read_ns"].to_numpy()[readings["origin"].to_numpy() == 0])
    names = events.names
    # Masks, not a copy of the fresh readings: one column at a time is taken out (2 M readings: 16 MB each).
    fresh, is_sample, read_ns = (
        readings["fresh"].to_numpy(),
        readings["origin"].to_numpy() == 0,
        readings["read_ns"].to_numpy(),
    )
    has_samples = (fresh & is_sample).sum() >= 2
    results: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    windows: dict[str, pd.DataFrame] = {}
    hand_offs: list[tuple] = []
    for column in ("tensor", "reserved", "native", "host", "heap"):
        if column == "heap" and "heap" not in components:
            continue
        rows = fresh & is_sample if SAMPLED_AS.get(column, column) in sampled and has_samples else fresh
        values = readings[column].to_numpy()[rows]
        keep = np.isfinite(values)
        if keep.sum() < 2:
            continue
        order = np.argsort(read_ns[rows][keep], kind="stable")
        times = read_ns[rows][keep][order]
        values = values[keep][order]
        change = np.diff(values)
        window = np.searchsorted(edges_ns, times[1:], "left")
        inside = (window > 0) & (window < len(edges_ns))
        if not inside.any():
            continue
        by_samples = SAMPLED_AS.get(column, column) in sampled and has_samples
        candidates = span_counts(times, events) if by_samples else events.candidates(times)
        change, window = change[inside], window[inside] - 1
        rows_of_sets, inverse = _patterns(candidates[inside])
        split = shares(change, rows_of_sets, inverse)
        window_count = len(edges_ns) - 1
        by_window = np.bincount(
            window * len(rows_of_sets) + inverse, weights=change, minlength=window_count * len(rows_of_sets)
        ).reshape(window_count, len(rows_of_sets))
        per_window = by_window @ split
        unseen = _unseen_windows(per_window, by_window, rows_of_sets, names)
        shared = (rows_of_sets > 0).sum(axis=1) > 1
        overlapped = by_window.sum(axis=0)[shared] @ split[shared]
        retained, handed = _cancel_seen(per_window, unseen)
        results[column] = (retained, per_window.sum(axis=0), overlapped)
        if column in components:
            hand_offs += _hand_offs(column, names, per_window, handed, retained, np.append(~events.container, False))
        if column in keep_windows:
            windows[column] = pd.DataFrame(per_window, columns=names)
        give_back_freed_memory()  # each column's temporaries, a few hundred MB at a million spans
    if "reserved" in results and "tensor" in results:
        reserved, tensor = results.pop("reserved"), results["tensor"]
        results["cache"] = tuple(r - t for r, t in zip(reserved, tensor, strict=False))
    results.pop("reserved", None)
    rows = [
        (names[index], component, float(retained[index]), float(net[index]), float(overlapped[index]))
        for component, (retained, net, overlapped) in results.items()
        if component in components
        for index in range(len(names))
        if retained[index] != 0 or net[index] != 0
    ]
    return StageCharges(pd.DataFrame(rows, columns=COLUMNS), windows, pd.DataFrame(hand_offs, columns=HAND_OFF_COLUMNS))
