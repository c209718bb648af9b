"""Growth of each memory component across requests: a slope, its uncertainty, its regimes, and the evidence
of its shape that the class rules (class_rules.py) decide on.

A component grows when the Theil–Sen slope of its settled level against requests completed is
positive with 95% confidence and adds up to more than noise over the run. Growth that happens only
at requests bringing a larger input than any before (a high-water mark: the caching allocator keeping
room for the biggest image so far), or that stops in the second half of the run, is a plateau, not a leak
(rise_shapes.py reads these shapes).
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
    MIN_GROWTH_BYTES,
    MIN_POINTS_TO_FIT,
    NOISE_MULTIPLE,
    WARMUP_FRACTION,
    WARMUP_HOST_RATE,
)
from vlmtrace.analysis.step2_preparing.settle import SettledSeries
from vlmtrace.analysis.step3_verdict import explanations as ex
from vlmtrace.analysis.step3_verdict.class_rules import (
    LEVEL_REASON,
    RECORD_REASON,
    RELEASE_REASON,
    Decision,
    Evidence,
    decide,
)
from vlmtrace.analysis.step3_verdict.explanations import Weighed, weigh
from vlmtrace.analysis.step3_verdict.host_levels import (
    fell_back,
    kept_across_one_trim,
    kept_rate,
    kept_steadily,
    young,
    young_host,
)
from vlmtrace.analysis.step3_verdict.regimes import Change, change
from vlmtrace.analysis.step3_verdict.rise_shapes import gives_back, mark_or_line, plateau_reason, steadiness
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
        plateau_reason(x, shape, features, tolerance, fit, component == "host") if grows else (None, None, None)
    )
    if not grows and np.ptp(y) >= MIN_GROWTH_BYTES:
        # Not growth, yet it moved: say why — when it moved for good (a blip is not worth a sentence).
        drop = max(MIN_GROWTH_BYTES, NOISE_MULTIPLE * robust_sigma(np.diff(y)))
        drops = int((np.diff(y) <= -drop).sum())
        if drops >= 2:
            reason = RELEASE_REASON
        elif np.median(y[len(y) // 2 :]) - y[0] >= MIN_GROWTH_BYTES:
            reason, share, tail = plateau_reason(x, y, features, tolerance, fit, component == "host")
            reason = reason or LEVEL_REASON
    weighed = weigh(x, shape, features, tolerance) if grows else None
    unsure, unsure_by = None, None
    if reason == RECORD_REASON and weighed is not None:  # weighed where it grows
        reason, unsure, unsure_by = mark_or_line(weighed, x)
        if reason is None:
            share, tail = None, None
    plateau = reason is not None
    unsteady, like_warmup, unsteady_by = None, False, None
    if grows and not plateau:
        # The process's own level: whatever any stage kept, its lowest level after a fall still holds.
        for explanation, why in (
            (unsure_by, unsure),
            (ex.GIVEN_BACK, gives_back(x, shape, series.mode)),
            (ex.GIVEN_BACK, fell_back(component, x, y)),
        ):
            if why:
                unsteady, unsteady_by = why, explanation
                break
        # Beside a settling warm-up, the process's halves slow down while the stage keeps its rate: the
        # stage's steadiness was the test (stage_rise.py).
        if not unsteady and not beside_warmup and not kept_steadily(component, x_all, y_all) and not kept_through_trim:
            for explanation, why in (
                (ex.WARM_UP, steadiness(x, y)),
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
        if gives_back(x[now:], shape[now:], series.mode) or fell_back(component, x[now:], y[now:]):
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
