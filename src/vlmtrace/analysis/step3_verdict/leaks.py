"""Growth of each memory component across requests: a slope, its uncertainty, and a class.

A component grows when the Theil–Sen slope of its settled level against requests completed is
positive with 95% confidence and adds up to more than noise over the run. Growth that happens only
at requests bringing a larger input than any before (a high-water mark: the caching allocator keeping
room for the biggest image so far), or that stops in the second half of the run, is a plateau, not a leak.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd

from vlmtrace.analysis.registry import BELOW_THRESHOLD, BY_NAME, INCONCLUSIVE, NO_GROWTH
from vlmtrace.analysis.robust import Slope, robust_sigma, theil_sen
from vlmtrace.analysis.step2_preparing.settle import SettledSeries
from vlmtrace.analysis.units import format_bytes

MIN_GROWTH_BYTES = 8 * 1024 * 1024  # growth over the whole run below this is not worth a verdict
NOISE_MULTIPLE = 3.0  # ... nor is growth within a few noise standard deviations
WARMUP_FRACTION = 0.05  # first points left out of the fit: CUDA context, workspaces, first cache fill
TAIL_FLAT_RATIO = 0.25  # a tail slope below this share of the overall slope means growth stopped
# A leak keeps its rate: a second half rising at under this share of the first half's rate is slowing
# down (warm-up, a cache filling towards its bound: decaying with a time constant shorter than the run),
# and one whose interval reaches above it cannot tell yet. The same share separates a high-water mark's
# slope between new maxima from a leak's.
STEADY_RATIO = 0.6
GIVE_BACK_SHARE = 1 / 3  # a settled level falling this share of its rise below its high-water level gave memory back
# ... as did one that falls by MIN_GROWTH_BYTES between this share of its consecutive idle levels: a leak's
# never do (0 of 13 cache and tensor leaks), fragmentation's cache did in 23-39 % (docs/analysis.md).
GIVE_BACK_FREQUENCY = 0.1
# A rise at new input maxima is a high-water mark only when the marks leave most points unmarked: at 40
# prompts a call a leak's every step was "at a new maximum" (H200 fourth matrix: 27-50 % of the points
# marked; a high-water mark one request at a time, a few %).
MARKED_SHARE_MAX = 0.2
MAX_SETTLE_RUNS = 20  # the estimate of how many more requests would settle a slowing rise stops here
# A fresh LMDeploy process's host memory rises by up to ~1.2 MiB per request over its first requests,
# nearly steadily (PyTorch engine, H200 matrix, docs/gpu-runs.md): within a process's first
# YOUNG_REQUESTS requests, host growth under WARMUP_HOST_RATE per request names no stage, since the
# warm-up's stages hold as much. Its class is withheld only up to YOUNG_CLASS_REQUESTS: over longer runs
# the halves (_steadiness) and the plateau tests told every young negative from a leak (with the window
# at 100, two negatives of 120 requests were called leaks; at 120-199, none of any length).
YOUNG_REQUESTS = 200
YOUNG_CLASS_REQUESTS = 160
WARMUP_HOST_RATE = 2 * 1024 * 1024
# ... unless LMDeploy's first heap trim has run: its lowest level after the fall lay 4.5 ± 6 MiB above the
# start in the young negatives at 8-16 in flight (1 ± 5 at one), what the warm-up keeps; a leak keeps more.
KEPT_ACROSS_TRIM_BYTES = 24 * 1024 * 1024
RECORD_FEATURES = ("image_pixels_max", "images_max", "input_tokens_max")
RECORD_REASON = "rises only at requests with a larger input than any before (a high-water mark)"
RELEASE_REASON = "rises, then is released again (torch.cuda.empty_cache, the cache guard's trims, or the allocator freeing its cache)"
LEVEL_REASON = "rose, then stayed level"


@dataclasses.dataclass
class ComponentGrowth:
    process: int
    component: str
    klass: str
    per_request: Slope
    per_second: Slope | None
    growth_bytes: float
    plateau: bool
    plateau_reason: str | None
    points: int
    first_point: int
    record_increase_share: float | None
    tail: Slope | None
    x: np.ndarray  # every point with a reading, warm-up included (the fit starts at first_point)
    y: np.ndarray
    t_ns: np.ndarray
    features: pd.DataFrame  # inputs of each point, aligned with x and y

    inconclusive_reason: str | None = None
    beside_warmup: bool = False  # classified and fitted by a stage's own rise (stage_rise.py)
    like_warmup: bool = False  # in a young process, where it grew is LMDeploy's warm-up's too: no stage named
    trims: int = 0  # host falls the leak's rate was read across (_kept_rate); 0: the fit's own slope
    # Where the rate was read from the allocating stage's heap chunks (heap_tags.from_allocations): resident
    # memory's own fit, for a comparison with a run read from resident memory alone.
    resident_fit: Slope | None = None

    @property
    def grows(self) -> bool:
        return self.klass == BY_NAME[self.component].leak_class


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


def is_significant(fit: Slope | None, span_x: float, min_rate: float = 0.0) -> bool:
    """Growth worth a verdict: above zero with 95% confidence, more than noise and MIN_GROWTH_BYTES over
    the run, and at least `min_rate` per request (the component's `min_leak_rate`)."""
    if fit is None or fit.low <= 0 or fit.slope < min_rate:
        return False
    growth = fit.slope * span_x
    return growth >= MIN_GROWTH_BYTES and growth >= NOISE_MULTIPLE * fit.noise


def level_falls(y: np.ndarray) -> np.ndarray:
    """Per step between consecutive levels: whether the level fell by MIN_GROWTH_BYTES or more."""
    return np.diff(y) <= -MIN_GROWTH_BYTES


def _plateau(x: np.ndarray, y: np.ndarray, features: pd.DataFrame, tolerance: float, fit: Slope,
            cut_at_falls: bool = False) -> tuple[str | None, float | None, Slope | None]:
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
        return "stopped rising in the second half of the run", share, tail
    return None, share, tail


def _requests_to_settle(first: Slope, second: Slope, length: float) -> int:
    """How many more requests until a rise slowing as it did from the first half to the second would
    add less than MIN_GROWTH_BYTES over the whole run: the halves' ratio, repeated per half-run."""
    ratio = max(second.slope, 0.0) / first.slope if first.slope > 0 else 0.0
    half = length / 2
    slope = second.slope
    for halves in range(1, 2 * MAX_SETTLE_RUNS + 1):
        slope *= ratio
        if slope * (length + halves * half) < MIN_GROWTH_BYTES:
            return int(math.ceil(halves * half))
    return int(math.ceil(MAX_SETTLE_RUNS * length))


def _steadiness(x: np.ndarray, y: np.ndarray) -> str | None:
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
            f"slowing down: {format_bytes(second.slope, signed=True)} per request in the second half of the run against "
            f"{format_bytes(first.slope, signed=True)} in the first (warm-up, or a cache filling towards its bound); "
            f"about {more:,} more requests would settle it"
        )
    return (
        f"too short to tell a steady rise from warm-up ({format_bytes(second.slope, signed=True)} per request in the second half, "
        f"{format_bytes(first.slope, signed=True)} in the first); about {int(math.ceil(length)):,} more requests would settle it"
    )


def _marks_everywhere(x: np.ndarray, features: pd.DataFrame, tolerance: float) -> str | None:
    """Why a rise at new input maxima cannot be called a high-water mark: the marks cover at least
    MARKED_SHARE_MAX of the points (a run of a few large calls: every request of a call lies within the
    concurrency of its largest input, so every rise is "at a new maximum", whatever its cause)."""
    marked = float(new_maxima(x, features, tolerance).mean())
    if marked < MARKED_SHARE_MAX:
        return None
    return (
        f"{marked:.0%} of its points lie within {tolerance:.0f} requests of a new input maximum: too many to tell a "
        f"high-water mark from steady growth; about {int(math.ceil(x[-1] - x[0])):,} more requests would tell"
    )


def _gives_back(x: np.ndarray, y: np.ndarray, mode: str) -> str | None:
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
        f"a working set that may be bounded; about {int(math.ceil(x[-1] - x[0])):,} more requests would tell whether it keeps rising"
    )


def _fell_back(component: str, x: np.ndarray, y: np.ndarray) -> str | None:
    """Why a host rise that fell, once, to near where it began is not yet a leak: what a leak holds it
    keeps, so the lowest level after its largest fall still holds all it leaked by then; a heap that
    grows and is given back at once (glibc trimming it in a fresh LMDeploy process) falls to near its
    start. Under load too: requests in flight raise a settled level, they cannot lower it below what is
    kept. Host memory only: torch's cache released by empty_cache() or the cache guard's trims falls
    the same way, and comes back (retention, with the release measured: empty_cache.py)."""
    if component != "host" or len(y) < 3:
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
        f"{where}: memory given back, not kept; about {int(math.ceil(x[-1] - x[0])):,} more requests would tell "
        f"whether it keeps rising"
    )


def _kept_rate(component: str, x: np.ndarray, y: np.ndarray) -> tuple[float, int] | None:
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
    """The levels that hold only what was kept (`_kept_rate`): the first, and the lowest after each fall.
    `runs_as_one`: falls between consecutive levels are one fall (heap_tags: a garbage collection's frees
    can straddle a reading)."""
    fell = level_falls(y)
    if runs_as_one:
        fell &= ~np.concatenate([[False], fell[:-1]])
    falls = np.flatnonzero(fell)
    bounds = [*(falls + 1), len(y)]
    return [0] + [start + int(np.argmin(y[start:end])) for start, end in zip(bounds[:-1], bounds[1:])]


def _kept_steadily(component: str, x: np.ndarray, y: np.ndarray) -> bool:
    """Host memory given back twice or more (LMDeploy's heap trims): whether what it kept rose steadily
    across them, each stretch from one trough to the next keeping STEADY_RATIO of the first's rate, at a
    leak's rate (`min_leak_rate`) and by MIN_GROWTH_BYTES or more. The halves of the levels themselves
    cannot tell then: each holds a different part of the working set's saw-tooth, rebuilt after every trim."""
    if component != "host":
        return False
    troughs = trough_points(y)
    if len(troughs) < 3:
        return False
    px, py = x[troughs].astype(np.float64), y[troughs].astype(np.float64)
    if np.any(np.diff(px) <= 0):
        return False
    rates = np.diff(py) / np.diff(px)
    kept = float(np.polyfit(px, py, 1)[0])
    return (kept >= BY_NAME[component].min_leak_rate and py[-1] - py[0] >= MIN_GROWTH_BYTES
            and rates[0] > 0 and bool(np.all(rates[1:] >= STEADY_RATIO * rates[0])))


def _young(component: str, x: np.ndarray, young_host_warmup: bool, window: int = YOUNG_REQUESTS) -> bool:
    """Host memory within the first `window` requests of a process that may run the PyTorch engine."""
    return component == "host" and young_host_warmup and x[-1] <= window


def _kept_across_one_trim(component: str, x: np.ndarray, y: np.ndarray, young_host_warmup: bool,
                          after_heap_trim: np.ndarray | None) -> bool:
    """A young PyTorch-engine process's host memory that fell once, at LMDeploy's first heap trim: whether
    the lowest level after the fall lies KEPT_ACROSS_TRIM_BYTES or more above the first level, at a leak's
    rate (`min_leak_rate`). Neither the run's halves nor the young-process window can tell a leak there:
    the level holds the heap's working set, rising ~1 MiB a request until the trim's `gc.collect()` gives
    it back. What the trim left is what the process kept. A fall that is not the trim (glibc returning the
    top of its heap) gives back only part of that working set: the rest would read as kept. `x`, `y`:
    every level, warm-up included; `after_heap_trim`: per level, whether it was read first after a trim
    span (None: the trace has none)."""
    if after_heap_trim is None or not _young(component, x, young_host_warmup, YOUNG_CLASS_REQUESTS):
        return False
    falls = np.flatnonzero(level_falls(y))
    if len(falls) != 1 or not after_heap_trim[falls[0] + 1]:
        return False
    troughs = trough_points(y)
    kept, span = float(y[troughs[1]] - y[0]), float(x[troughs[1]] - x[0])
    return span > 0 and kept >= KEPT_ACROSS_TRIM_BYTES and kept / span >= BY_NAME[component].min_leak_rate


def _young_host(component: str, fit: Slope, x: np.ndarray, young_host_warmup: bool) -> str | None:
    if not _young(component, x, young_host_warmup, YOUNG_CLASS_REQUESTS) or fit.slope >= WARMUP_HOST_RATE:
        return None
    more = int(YOUNG_CLASS_REQUESTS - x[-1]) + 1
    return (
        f"the process's first {int(x[-1]):,} requests: LMDeploy's own warm-up raises host memory by up to "
        f"{format_bytes(WARMUP_HOST_RATE // 2)} per request there; about {more:,} more "
        f"{'request' if more == 1 else 'requests'} would settle it"
    )


def _per_second(fit: Slope, x: np.ndarray, t_ns: np.ndarray) -> Slope | None:
    """A per-request slope at the run's mean request rate."""
    seconds = (t_ns[-1] - t_ns[0]) / 1e9
    if seconds <= 0:
        return None
    rate = (x[-1] - x[0]) / seconds
    return dataclasses.replace(fit, slope=fit.slope * rate, low=fit.low * rate, high=fit.high * rate)


def component_growth(
    process: int, component: str, levels: np.ndarray, series: SettledSeries, young_host_warmup: bool = False,
    stage_fit: Slope | None = None, stage_levels: np.ndarray | None = None, after_heap_trim: np.ndarray | None = None,
) -> ComponentGrowth | None:
    """Classify one component's settled levels; None when too few points carry a reading.
    `young_host_warmup`: the trace holds the process's life from its first request (a journal) and the
    process may run LMDeploy's PyTorch engine, whose host warm-up the young-process rule is for.
    `stage_fit`: in such a process, the slope of a stage that kept rising while the rest of the process
    settled (stage_rise.py): it is the leak's rate however long the run (LMDeploy's warm-up at 8-16 in
    flight still rises past the young-process window, and is in the process's slope) and lifts that rule;
    `stage_levels`, that stage's accumulated charges at each point, are then what the shape tests (a
    plateau, memory given back) read: the process's level holds the warm-up's rise and its giving back.
    `after_heap_trim`: per level, whether it is the first read after LMDeploy's heap trim (None: no trim spans)."""
    keep = np.isfinite(levels)
    if keep.sum() < 5:
        return None
    x_all, y_all, t_all = series.x[keep], levels[keep], series.t_ns[keep]
    features_all = series.features[keep].reset_index(drop=True)
    skip = max(1, int(math.ceil(WARMUP_FRACTION * len(x_all))))
    x, y, t = x_all[skip:], y_all[skip:], t_all[skip:]
    features = features_all.iloc[skip:].reset_index(drop=True)
    fit = theil_sen(x, y)
    if fit is None:
        return None
    beside_warmup = stage_fit is not None and component == "host" and young_host_warmup
    shape = y
    if beside_warmup:
        fit = stage_fit  # the process's own slope holds LMDeploy's warm-up as well
        if stage_levels is not None:
            shape = stage_levels[keep][skip:]
    per_second = theil_sen((t - t[0]) / 1e9, y) if not beside_warmup else _per_second(fit, x, t)
    kept_through_trim = _kept_across_one_trim(component, x_all, y_all, young_host_warmup,
                                              after_heap_trim[keep] if after_heap_trim is not None else None)
    # The heap's working set, given back at the trim, is scatter to a fit through every level (its noise can
    # exceed the rise): where the trim left a leak's worth, that is the test.
    grows = is_significant(fit, x[-1] - x[0], BY_NAME[component].min_leak_rate) or kept_through_trim
    tolerance = float(series.concurrency)
    reason, share, tail = (_plateau(x, shape, features, tolerance, fit, component == "host") if grows
                           else (None, None, None))
    if not grows and np.ptp(y) >= MIN_GROWTH_BYTES:
        # Not growth, yet it moved: say why — when it moved for good (a blip is not worth a sentence).
        drop = max(MIN_GROWTH_BYTES, NOISE_MULTIPLE * robust_sigma(np.diff(y)))
        drops = int((np.diff(y) <= -drop).sum())
        if drops >= 2:
            reason = RELEASE_REASON
        elif np.median(y[len(y) // 2 :]) - y[0] >= MIN_GROWTH_BYTES:
            reason, share, tail = _plateau(x, y, features, tolerance, fit, component == "host")
            reason = reason or LEVEL_REASON
    if reason == RECORD_REASON and grows:
        unsure = _marks_everywhere(x, features, tolerance)
        if unsure:
            reason, share, tail = None, None, None
    else:
        unsure = None
    plateau = reason is not None
    unsteady, like_warmup = None, False
    if grows and not plateau:
        # The process's own level: whatever any stage kept, its lowest level after a fall still holds.
        unsteady = unsure or _gives_back(x, shape, series.mode) or _fell_back(component, x, y)
        # Beside a settling warm-up, the process's halves slow down while the stage keeps its rate: the
        # stage's steadiness was the test (stage_rise.py).
        if not unsteady and not beside_warmup and not _kept_steadily(component, x_all, y_all) and not kept_through_trim:
            unsteady = _steadiness(x, y) or _young_host(component, fit, x_all, young_host_warmup)
        like_warmup = (not beside_warmup and _young(component, x_all, young_host_warmup)
                       and (unsteady is not None or fit.slope < WARMUP_HOST_RATE))
    trims = 0
    if grows and not plateau and not unsteady:
        klass = BY_NAME[component].leak_class
        kept = _kept_rate(component, x_all, y_all)
        if kept is not None and beside_warmup and kept[0] >= fit.slope:
            # Beside LMDeploy's warm-up the stage's own rate stands unless the troughs read less: the line
            # from the start also holds what the warm-up kept through the first fall, the stage's charges its
            # share of the working set rebuilt after each fall (given back in other stages' spans). Both
            # read more than the leak keeps; the lower is the nearer.
            kept = None
        shift = kept[0] - fit.slope if kept is not None else 0.0
        # The fit's scatter stays; its line moves to what the troughs kept, where that is still a rise.
        if kept is not None and fit.low + shift > 0:
            fit = dataclasses.replace(fit, slope=kept[0], low=fit.low + shift, high=fit.high + shift)
            per_second, trims = _per_second(fit, x, t), kept[1]
    elif unsteady:
        klass = INCONCLUSIVE
    elif not plateau and fit.low > 0:
        klass = BELOW_THRESHOLD  # it does rise, by less than is worth a verdict: never called "no growth"
    else:
        klass = NO_GROWTH
    return ComponentGrowth(
        process=process,
        component=component,
        klass=klass,
        per_request=fit,
        per_second=per_second,
        growth_bytes=float(y[-1] - y[0]),
        plateau=plateau,
        plateau_reason=reason,
        points=len(x),
        first_point=skip,
        record_increase_share=share,
        tail=tail,
        x=x_all,
        y=y_all,
        t_ns=t_all,
        features=features_all,
        inconclusive_reason=unsteady,
        beside_warmup=beside_warmup,
        like_warmup=like_warmup,
        trims=trims,
    )
