"""Two analysed runs side by side: per memory component, each run's slope and interval, and whether the
change between them is a fix, a regression, no change, or more than the two runs can tell.

The rule (docs/analysis.md, "Comparing two runs") judges a difference only where both runs' 95%
intervals agree it exists (they are disjoint) and it is large enough to matter: over the shorter of the
two runs' fitted stretches it adds up to the analyzer's MIN_GROWTH_BYTES. Each run keeps its own class
(a rise the analyzer explains, as a plateau or warm-up, is not a leak in either run).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from vlmtrace.analysis import registry
from vlmtrace.analysis.pipeline import Analysis
from vlmtrace.analysis.step3_verdict.leaks import MIN_GROWTH_BYTES, ComponentGrowth
from vlmtrace.analysis.summary import Verdict

FIXED = "fixed"
REGRESSED = "regressed"
UNCHANGED = "unchanged"
INCONCLUSIVE = "inconclusive"
VERDICTS = (REGRESSED, FIXED, INCONCLUSIVE, UNCHANGED)  # most urgent first: the order of the table
SCHEMA = "vlmtrace.diff/1"


@dataclasses.dataclass(frozen=True)
class RunSlope:
    """One component of one run, as the analyzer judged it."""

    process: str
    klass: str
    slope: float  # bytes per request
    low: float
    high: float
    requests: float  # requests spanned by the fit (warm-up left out)
    stage: str | None
    growth: ComponentGrowth

    @property
    def leaks(self) -> bool:
        return registry.is_leak(self.klass)

    def to_dict(self) -> dict[str, Any]:
        return {
            "process": self.process,
            "class": self.klass,
            "slope_bytes_per_request": self.slope,
            "slope_interval_bytes_per_request": [self.low, self.high],
            "requests": self.requests,
            "stage": self.stage,
        }


@dataclasses.dataclass(frozen=True)
class ComponentChange:
    component: str
    verdict: str
    reason: str
    before: RunSlope | None
    after: RunSlope | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "component": self.component,
            "verdict": self.verdict,
            "reason": self.reason,
            "before": self.before.to_dict() if self.before else None,
            "after": self.after.to_dict() if self.after else None,
        }


@dataclasses.dataclass
class Comparison:
    before: Analysis
    after: Analysis
    changes: list[ComponentChange]
    stages: list[dict]  # per component and stage: what each run retained there, per request completed

    @property
    def regressed(self) -> bool:
        return any(change.verdict == REGRESSED for change in self.changes)

    def to_dict(self) -> dict[str, Any]:
        runs = {"before": self.before.summary, "after": self.after.summary}
        return {
            "schema": SCHEMA,
            "regressed": self.regressed,
            "min_growth_bytes": MIN_GROWTH_BYTES,
            "runs": {
                name: {
                    "inputs": [item["source"] for item in summary.inputs],
                    "requests": summary.requests_completed,
                    "processes": [item["process"] for item in summary.processes],
                    "leak_found": summary.leak_found,
                }
                for name, summary in runs.items()
            },
            "changes": [change.to_dict() for change in self.changes],
            "stages": self.stages,
        }


def judge(before: RunSlope, after: RunSlope) -> tuple[str, str]:
    """The verdict on one component's change between two runs, and why (the rule in docs/analysis.md)."""
    if INCONCLUSIVE in (before.klass, after.klass):
        which = "before" if before.klass == INCONCLUSIVE else "after"
        return INCONCLUSIVE, f"the {which} run alone cannot tell warm-up from a leak"
    disjoint = after.low > before.high or after.high < before.low
    difference = after.slope - before.slope
    shorter = min(before.requests, after.requests)
    material = abs(difference) * shorter >= MIN_GROWTH_BYTES
    if not (disjoint and material):
        why = (
            "the intervals overlap"
            if not disjoint
            else f"the difference adds less than {MIN_GROWTH_BYTES / 2**20:g} MiB over {shorter:,.0f} requests"
        )
        if before.leaks == after.leaks:
            return UNCHANGED, why + (", and both runs leak" if after.leaks else "")
        return INCONCLUSIVE, why + f", yet only the {'after' if after.leaks else 'before'} run is called a leak"
    if difference > 0:
        if after.leaks:
            return REGRESSED, "the after run grows faster, beyond both intervals"
        return INCONCLUSIVE, "the after run rises faster, but the analyzer explains its rise (not a leak)"
    if before.leaks and not after.leaks:
        return FIXED, "the before run leaks; the after run does not, and its slope is below the before run's interval"
    if after.leaks:
        return INCONCLUSIVE, "slower than before, but still a leak"
    return UNCHANGED, "slower than before; neither run is called a leak"


def _process_pairs(before: Analysis, after: Analysis) -> list[tuple[int | None, int | None]]:
    """Which process of one run stands for which of the other: each run's processes with growth fits,
    matched by service name, the busiest first; a lone process on each side is paired whatever its name."""
    sides = []
    for analysis in (before, after):
        points: dict[int, int] = {}
        for item in analysis.growth:
            points[item.process] = max(points.get(item.process, 0), item.points)
        sides.append(sorted(points, key=lambda process: -points[process]))
    if len(sides[0]) == 1 and len(sides[1]) == 1:
        return [(sides[0][0], sides[1][0])]
    pairs: list[tuple[int | None, int | None]] = []
    services = [
        [analysis.data.processes[p].service for p in side]
        for analysis, side in zip((before, after), sides, strict=True)
    ]
    for service in dict.fromkeys(services[0] + services[1]):
        mine = [
            [p for p, s in zip(side, names, strict=True) if s == service]
            for side, names in zip(sides, services, strict=True)
        ]
        pairs.extend(
            (mine[0][index] if index < len(mine[0]) else None, mine[1][index] if index < len(mine[1]) else None)
            for index in range(max(len(mine[0]), len(mine[1])))
        )
    return pairs


def _slopes(analysis: Analysis, process: int | None) -> dict[str, RunSlope]:
    if process is None:
        return {}
    label = analysis.data.processes[process].label
    verdicts: dict[str, Verdict] = {v.component: v for v in analysis.summary.verdicts if v.process == label}
    result = {}
    for item in analysis.growth:
        if item.process != process:
            continue
        fit = item.per_request
        stage = verdicts[item.component].stage if item.component in verdicts else None
        span = float(item.x[-1] - item.x[item.first_point])
        result[item.component] = RunSlope(label, item.klass, fit.slope, fit.low, fit.high, span, stage, item)
    return result


def _stage_rows(before: Analysis, after: Analysis) -> list[dict]:
    """What each stage retained per request completed, per component, in each run (all processes)."""
    rows: dict[tuple[str, str], dict] = {}
    for name, analysis in (("before", before), ("after", after)):
        requests = max(analysis.summary.requests_completed, 1)
        for row in analysis.summary.stages:
            key = (row["component"], row["stage"])
            entry = rows.setdefault(key, {"component": key[0], "stage": key[1], "before": 0.0, "after": 0.0})
            entry[name] += float(row["retained_bytes"]) / requests
    order = {component.name: index for index, component in enumerate(registry.COMPONENTS)}
    return sorted(
        rows.values(), key=lambda row: (order.get(row["component"], 9), -max(abs(row["before"]), abs(row["after"])))
    )


def _same_reading(before: RunSlope, after: RunSlope) -> tuple[RunSlope, RunSlope, str]:
    """The two runs' slopes read the same way: where only one run's host rate is its allocating stage's heap
    chunks (recorded with the heap counter), both are resident memory's. The chunks' interval is the
    narrower, and set against resident memory's it would call a change that is only the reading's."""
    if (before.growth.resident_fit is None) == (after.growth.resident_fit is None):
        return before, after, ""

    def resident(side: RunSlope) -> RunSlope:
        fit = side.growth.resident_fit
        return side if fit is None else dataclasses.replace(side, slope=fit.slope, low=fit.low, high=fit.high)

    return (resident(before), resident(after), " (resident memory in both runs: only one read its heap's allocations)")


def nothing_to_compare(before: Analysis, after: Analysis) -> str | None:
    """Why two runs cannot be compared at all (a run without a completed request has no growth per
    request to compare), or None."""
    empty = [name for name, run in (("before", before), ("after", after)) if not run.summary.requests_completed]
    if not empty:
        return None
    which = " and ".join(f"the {name} run" for name in empty)
    have = "they have" if len(empty) > 1 else "it has"
    return f"nothing to compare: {which} completed no requests, so {have} no growth per request"


def compare(before: Analysis, after: Analysis) -> Comparison:
    changes = []
    for process_before, process_after in _process_pairs(before, after):
        slopes_before, slopes_after = _slopes(before, process_before), _slopes(after, process_after)
        for component in (c.name for c in registry.COMPONENTS):
            first, second = slopes_before.get(component), slopes_after.get(component)
            if first is None and second is None:
                continue
            if first is None or second is None:
                missing = "before" if first is None else "after"
                changes.append(
                    ComponentChange(component, INCONCLUSIVE, f"no readings of it in the {missing} run", first, second)
                )
                continue
            first, second, note = _same_reading(first, second)
            verdict, reason = judge(first, second)
            changes.append(ComponentChange(component, verdict, reason + note, first, second))
    changes.sort(key=lambda change: VERDICTS.index(change.verdict))
    return Comparison(before, after, changes, _stage_rows(before, after))
