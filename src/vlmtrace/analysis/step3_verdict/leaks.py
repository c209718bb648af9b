"""Growth of each memory component across requests: a slope, its uncertainty, its regimes, and the evidence
of its shape that the class rules (class_rules.py) decide on.

A component grows when the Theil–Sen slope of its settled level against requests completed is
positive with 95% confidence and adds up to more than noise over the run. Growth that happens only
at requests bringing a larger input than any before (a high-water mark: the caching allocator keeping
room for the biggest image so far), or that stops in the second half of the run, is a plateau, not a leak.
Where the rate changed within the run (regimes.py), a rise that began is read from its onset and a rise
that stopped says where.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd

from vlmtrace.analysis.registry import BY_NAME
from vlmtrace.analysis.robust import Slope, robust_sigma, theil_sen
from vlmtrace.analysis.rules import (
    GIVE_BACK_FREQUENCY,
    GIVE_BACK_SHARE,
    MAX_SETTLE_RUNS,
    MIN_GROWTH_BYTES,
    MIN_POINTS_TO_FIT,
    NOISE_MULTIPLE,
    STEADY_RATIO,
    TAIL_FLAT_RATIO,
    WARMUP_FRACTION,
    WARMUP_HOST_RATE,
)
from vlmtrace.analysis.step2_preparing.settle import SettledSeries
from vlmtrace.analysis.step3_verdict import explanations as ex
from vlmtrace.analysis.step3_verdict.class_rules import (
    LEVEL_REASON,
    RECORD_REASON,
    RELEASE_REASON,
    STOPPED_REASON,
    Decision,
    Evidence,
    decide,
)
from vlmtrace.analysis.step3_verdict.explanations import Weighed, new_maxima, weigh
from vlmtrace.analysis.step3_verdict.host_levels import (
    fell_back,
    kept_across_one_trim,
    kept_rate,
    kept_steadily,
    level_falls,
    young,
    young_host,
)
from vlmtrace.analysis.step3_verdict.regimes import Change, change
from vlmtrace.analysis.step3_verdict.significance import is_significant
from vlmtrace.analysis.units import format_bytes

YOUNG_HOST = "LMDeploy's host warm-up in a young process"


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
    trims: int = 0  # host falls the leak's rate was read across (kept_rate); 0: the fit's own slope
    # Where the rate was read from the allocating stage's heap chunks (heap_tags.from_allocations): resident
    # memory's own fit, for a comparison with a run read from resident memory alone.
    resident_fit: Slope | None = None
    weighed: Weighed | None = None  # the explanations fitted to a rising series, best first
    evidence: Evidence | None = None  # what the shape of the settled levels told (class_rules.py)
    decision: Decision | None = None  # the rule that decided the class
    change: Change | None = None  # its growth regimes, and where the current one began or the last rise stopped

    @property
    def decided_by(self) -> str:
        """The explanation and the rule that decided the class."""
        return self.decision.json if self.decision is not None else ""

    @property
    def grows(self) -> bool:
        return self.klass == BY_NAME[self.component].leak_class


def _plateau(
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


def _mark_or_line(weighed: Weighed, x: np.ndarray) -> tuple[str | None, str | None, str]:
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
        f"a working set that may be bounded; "
        f"about {math.ceil(x[-1] - x[0]):,} more requests would tell whether it keeps rising"
    )


def _rate_across_trims(
    component: str, x: np.ndarray, y: np.ndarray, fit: Slope, beside_warmup: bool
) -> tuple[Slope, int] | None:
    """A leak's fit moved to the rate the lowest levels after LMDeploy's heap trims kept (host_levels.kept_rate),
    its scatter kept, and the count of trims; None where the heap was not trimmed or that rate is no rise."""
    kept = kept_rate(component, x, y)
    if kept is None or (beside_warmup and kept[0] >= fit.slope):
        # Beside LMDeploy's warm-up the stage's own rate stands unless the troughs read less: the line
        # from the start also holds what the warm-up kept through the first fall, the stage's charges its
        # share of the working set rebuilt after each fall (given back in other stages' spans). Both
        # read more than the leak keeps; the lower is the nearer.
        return None
    shift = kept[0] - fit.slope
    if fit.low + shift <= 0:
        return None
    return dataclasses.replace(fit, slope=kept[0], low=fit.low + shift, high=fit.high + shift), kept[1]


def _per_second(fit: Slope, x: np.ndarray, t_ns: np.ndarray) -> Slope | None:
    """A per-request slope at the run's mean request rate."""
    seconds = (t_ns[-1] - t_ns[0]) / 1e9
    if seconds <= 0:
        return None
    rate = (x[-1] - x[0]) / seconds
    return dataclasses.replace(fit, slope=fit.slope * rate, low=fit.low * rate, high=fit.high * rate)


def component_growth(
    process: int,
    component: str,
    levels: np.ndarray,
    series: SettledSeries,
    young_host_warmup: bool = False,
    stage_fit: Slope | None = None,
    stage_levels: np.ndarray | None = None,
    after_heap_trim: np.ndarray | None = None,
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
    if keep.sum() < MIN_POINTS_TO_FIT:
        return None
    x_all, y_all, t_all = series.x[keep], levels[keep], series.t_ns[keep]
    features_all = series.features[keep].reset_index(drop=True)
    skip = max(1, math.ceil(WARMUP_FRACTION * len(x_all)))
    x, y, t = x_all[skip:], y_all[skip:], t_all[skip:]
    features = features_all.iloc[skip:].reset_index(drop=True)
    fit = theil_sen(x, y)
    if fit is None:
        return None
    beside_warmup = stage_fit is not None and component == "host" and young_host_warmup
    shape = y
    if beside_warmup and stage_fit is not None:
        fit = stage_fit  # the process's own slope holds LMDeploy's warm-up as well
        if stage_levels is not None:
            shape = stage_levels[keep][skip:]
    per_second = theil_sen((t - t[0]) / 1e9, y) if not beside_warmup else _per_second(fit, x, t)
    kept_through_trim = kept_across_one_trim(
        component, x_all, y_all, young_host_warmup, after_heap_trim[keep] if after_heap_trim is not None else None
    )
    # The heap's working set, given back at the trim, is scatter to a fit through every level (its noise can
    # exceed the rise): where the trim left a leak's worth, that is the test.
    grows = is_significant(fit, x[-1] - x[0], BY_NAME[component].min_leak_rate) or kept_through_trim
    tolerance = float(series.concurrency)
    reason, share, tail = (
        _plateau(x, shape, features, tolerance, fit, component == "host") if grows else (None, None, None)
    )
    if not grows and np.ptp(y) >= MIN_GROWTH_BYTES:
        # Not growth, yet it moved: say why — when it moved for good (a blip is not worth a sentence).
        drop = max(MIN_GROWTH_BYTES, NOISE_MULTIPLE * robust_sigma(np.diff(y)))
        drops = int((np.diff(y) <= -drop).sum())
        if drops >= 2:
            reason = RELEASE_REASON
        elif np.median(y[len(y) // 2 :]) - y[0] >= MIN_GROWTH_BYTES:
            reason, share, tail = _plateau(x, y, features, tolerance, fit, component == "host")
            reason = reason or LEVEL_REASON
    weighed = weigh(x, shape, features, tolerance) if grows else None
    unsure, unsure_by = None, None
    if reason == RECORD_REASON and weighed is not None:  # weighed where it grows
        reason, unsure, unsure_by = _mark_or_line(weighed, x)
        if reason is None:
            share, tail = None, None
    plateau = reason is not None
    unsteady, like_warmup, unsteady_by = None, False, None
    if grows and not plateau:
        # The process's own level: whatever any stage kept, its lowest level after a fall still holds.
        for explanation, why in (
            (unsure_by, unsure),
            (ex.GIVEN_BACK, _gives_back(x, shape, series.mode)),
            (ex.GIVEN_BACK, fell_back(component, x, y)),
        ):
            if why:
                unsteady, unsteady_by = why, explanation
                break
        # Beside a settling warm-up, the process's halves slow down while the stage keeps its rate: the
        # stage's steadiness was the test (stage_rise.py).
        if not unsteady and not beside_warmup and not kept_steadily(component, x_all, y_all) and not kept_through_trim:
            for explanation, why in (
                (ex.WARM_UP, _steadiness(x, y)),
                (YOUNG_HOST, young_host(component, fit, x_all, young_host_warmup)),
            ):
                if why:
                    unsteady, unsteady_by = why, explanation
                    break
        like_warmup = (
            not beside_warmup
            and young(component, x_all, young_host_warmup)
            and (unsteady is not None or fit.slope < WARMUP_HOST_RATE)
        )
    across_trims = _rate_across_trims(component, x_all, y_all, fit, beside_warmup)
    changed = change(x, y, t, BY_NAME[component].min_leak_rate) if not beside_warmup else Change((), None, None)
    if changed.onset is not None:
        # The current regime is what a leak that began within the run is judged by: what the levels did before it
        # (host memory given back while it was level) is no sign of a working set now.
        now = changed.onset.start
        if _gives_back(x[now:], shape[now:], series.mode) or fell_back(component, x[now:], y[now:]):
            changed = dataclasses.replace(changed, onset=None)
    evidence = Evidence(
        grows=grows,
        rises=fit.low > 0,
        plateau_reason=reason,
        unsteady=unsteady,
        unsteady_by=unsteady_by,
        beside_warmup=beside_warmup,
        kept_through_trim=kept_through_trim,
        host_warm_up=component == "host" and young_host_warmup,
        trims=across_trims[1] if across_trims is not None else 0,
        onset=changed.onset.said_start() if changed.onset else None,
        stopped=changed.stopped.said_end() if changed.stopped else None,
    )
    decision = decide(evidence, BY_NAME[component].leak_class)
    leak = decision.klass == BY_NAME[component].leak_class
    if leak and across_trims is not None:
        fit = across_trims[0]
        per_second = _per_second(fit, x, t)
    elif decision.rule.name == "GROWING_SINCE" and changed.onset is not None:  # the rate now: the current regime's
        fit, reason, unsteady = changed.onset.rate, None, None
        per_second = theil_sen((t[changed.onset.start :] - t[changed.onset.start]) / 1e9, y[changed.onset.start :])
    elif changed.stopped is not None and decision.rule.name in ("STOPPED_RISING", "STOPPED"):  # the rate now: none
        reason = f"stopped rising at {evidence.stopped}, having kept {format_bytes(changed.kept_bytes)}"
        fit, unsteady = changed.regimes[-1].rate, None
    return ComponentGrowth(
        process=process,
        component=component,
        klass=decision.klass,
        per_request=fit,
        per_second=per_second,
        growth_bytes=float(y[-1] - y[0]),
        plateau=reason is not None,
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
        trims=evidence.trims if leak else 0,
        weighed=weighed,
        evidence=evidence,
        decision=decision,
        change=changed,
    )
