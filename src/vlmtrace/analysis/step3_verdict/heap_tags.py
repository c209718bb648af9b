"""The heap counter's large chunks by the stage that allocated them (heap_counter.c, in the sampler's
readings): how fast each stage's chunks still in use grew per request. A chunk is charged to the stage
whose work allocated it until it is freed, by whichever stage frees it, so a hand-off (one stage
allocates, another frees) leaves nothing behind and a leak stays with the stage that allocated it (the
stage follows the work into asyncio and uvloop tasks and executor jobs: probes/heap.py). Reported beside
the host verdict (`heap_allocated_by_stage`); naming.allocation_stage decides what they name
(docs/analysis.md, "Large chunks charged to the stage that allocated them")."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from vlmtrace.analysis.registry import BY_NAME, INCONCLUSIVE, NO_GROWTH
from vlmtrace.analysis.robust import theil_sen
from vlmtrace.analysis.rules import (
    HEAP_GROWTH_EXPLAINED,
    MIN_CHARGED_POINTS,
    MIN_GROWTH_BYTES,
    MIN_STAGE_RATE,
    MIN_TROUGHS,
    STEADY_RATIO,
)
from vlmtrace.analysis.step1_loading.column_keys import NO_SPAN
from vlmtrace.analysis.step2_preparing.heap_readings import STAGES
from vlmtrace.analysis.step2_preparing.settle import SettledSeries
from vlmtrace.analysis.step3_verdict.host_levels import level_falls, trough_points
from vlmtrace.analysis.step3_verdict.leaks import (
    ComponentGrowth,
    component_growth,
)
from vlmtrace.analysis.units import format_bytes

SHOWN = 5  # stages in the evidence, fastest-growing first


def _latest_samples(samples: pd.DataFrame, series: SettledSeries) -> np.ndarray:
    """For each settled point, the row in `samples` of the latest sample before it (-1 before the first)."""
    return np.searchsorted(samples["t_ns"].to_numpy(), series.t_ns, side="right") - 1


def _levels(samples: pd.DataFrame, rows: np.ndarray, stage: str) -> np.ndarray:
    """`stage`'s chunks in use at the sample rows `rows` (NaN at -1)."""
    return np.where(rows >= 0, samples[stage].to_numpy()[np.maximum(rows, 0)], np.nan).astype(np.float64)


def _sampled_points(samples: pd.DataFrame, series: SettledSeries) -> np.ndarray | None:
    """`_latest_samples`, where at least five settled points follow a sample (their requests completed); else None."""
    if samples.empty:
        return None
    rows = _latest_samples(samples, series)
    return rows if int((rows >= 0).sum()) >= MIN_CHARGED_POINTS else None


def charged_levels(samples: pd.DataFrame, series: SettledSeries, stage: str) -> np.ndarray:
    """`stage`'s chunks in use at each settled point, from the latest sample before it (NaN before the first)."""
    return _levels(samples, _latest_samples(samples, series), stage)


def allocated_where(stage: str) -> str:
    """Where a stage's chunks were allocated, in words: "in STAGE", or "outside any span"."""
    return "outside any span" if stage == NO_SPAN else f"in {stage}"


@dataclasses.dataclass(frozen=True)
class Charges:
    """A process's large chunks by allocating stage at its settled points (`levels`: per stage, from the latest
    sample before each point, NaN before the first), the stages whose chunks were given back (`_given_back`,
    in STAGES' order) and what each stage kept per request (`_kept_rate`; for a stage that gave its chunks back,
    what it kept by when they were allocated where the counter's last reading has it: survivors.with_kept_rates)."""

    series: SettledSeries
    levels: dict[str, np.ndarray]
    given_back: tuple[str, ...]
    kept: dict[str, float | None]


def at_settled_points(samples: pd.DataFrame, series: SettledSeries) -> Charges | None:
    """The charges of `samples` (one process's) at the settled points of `series`; None where fewer than five
    points follow a sample."""
    rows = _sampled_points(samples, series)
    if rows is None:
        return None
    levels = {stage: _levels(samples, rows, stage) for stage in STAGES}
    given_back = tuple(stage for stage in STAGES if _given_back(levels[stage]))
    return Charges(
        series,
        levels,
        given_back,
        {stage: _kept_rate(series.x, levels[stage], stage in given_back) for stage in STAGES},
    )


def allocated_by_stage(charges: Charges) -> dict[str, float]:
    """Per stage whose chunks grew (MIN_STAGE_RATE or more), what they kept per request; the SHOWN fastest."""
    slopes = {stage: rate for stage, rate in charges.kept.items() if rate is not None and rate >= MIN_STAGE_RATE}
    return dict(sorted(slopes.items(), key=lambda item: -item[1])[:SHOWN])


def from_allocations(
    growth: ComponentGrowth, charges: Charges, allocating: str | None, heap: np.ndarray
) -> ComponentGrowth | None:
    """A host leak read from the large chunks its allocating stage (`allocating`, as naming.allocating_stage
    separates it) keeps in use, where those are what the heap grew by: at least HEAP_GROWTH_EXPLAINED of the
    heap's bytes in use per request (`heap`, the process's readings at the settled points `series.rows`),
    and no more than the resident slope's interval allows. Resident pages, and the heap's bytes in use too,
    also carry the work in flight at each point (under load, the requests still running) and LMDeploy's
    warm-up; a stage's chunks still in use carry neither. A leak of small objects, or a heap that grows in
    several stages, leaves the charges short of the heap's growth; chunks above the resident interval are
    memory malloc handed out that is not resident. In those cases, and for what is no leak, None: resident
    memory's reading stands. Otherwise the leak, its rate the chunks' (its line drawn through the resident
    levels). The class is not read here (heap_tags.kept_rising reads it: docs/analysis.md, "The leak's rate from its
    allocating stage" and "The leak's class from its allocating stage")."""
    if not (growth.grows and growth.component == "host" and allocating):
        return None
    if allocating in charges.given_back:
        return None  # a line through what its give-backs left has no interval to set against resident memory's
    charged = theil_sen(charges.series.x, charges.levels[allocating])
    # Chunks another stage gave back within the run are not growth the leak's chunks must account for.
    grew = theil_sen(charges.series.x, _less_working_sets(charges, heap, besides=allocating))
    resident = growth.per_request
    if (
        charged is None
        or grew is None
        or not 0 < charged.slope <= resident.high
        or charged.slope < HEAP_GROWTH_EXPLAINED * grew.slope
    ):
        return None
    x, y = growth.x[growth.first_point :], growth.y[growth.first_point :]
    per_second = growth.per_second
    if per_second is not None:  # at the run's own request rate, as the resident slope's was
        per_second = dataclasses.replace(per_second, slope=per_second.slope * charged.slope / resident.slope)
    return dataclasses.replace(
        growth,
        trims=0,
        per_second=per_second,
        resident_fit=resident,
        per_request=dataclasses.replace(charged, intercept=float(np.median(y - charged.slope * x))),
    )


def kept_rising(growth: ComponentGrowth, charges: Charges, allocating: str | None) -> str | None:
    """Why a host rise that resident memory left `inconclusive` or called level is a leak, or None: its
    allocating stage's large chunks still in use, never given back, pass the leak tests themselves
    (leaks.component_growth: a rise at a leak's rate, not only at new input maxima, its second half as steep
    as its first). Under load each resident level also holds the work in flight at that moment, and over a
    short run that scatter hides a leak's rate or mimics warm-up; a stage's chunks still in use carry neither.
    A leak of small objects leaves no chunks and stays resident memory's to call (docs/analysis.md, "The
    leak's class from its allocating stage").
    Resident memory must have risen with 95 % confidence: a leak never stands beside an interval that holds zero."""
    if (
        growth.component != "host"
        or growth.klass not in (INCONCLUSIVE, NO_GROWTH)
        or growth.per_request.low <= 0
        or not allocating
        or allocating in charges.given_back
    ):
        return None
    chunks = component_growth(growth.process, "host", charges.levels[allocating], charges.series)
    if chunks is None or not chunks.grows:
        return None
    resident = growth.inconclusive_reason or growth.plateau_reason
    return (
        f"a leak by its large heap chunks, allocated {allocated_where(allocating)}, never given back and rising as "
        f"steeply in the run's second half as in its first, where resident memory, with the work in flight at each "
        f"reading, could not tell ({resident})"
    )


def _known(x: np.ndarray, levels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The settled points where `levels` has a value (none before the first sample), x as floats."""
    known = np.isfinite(levels)
    return x[known].astype(np.float64), levels[known]


def _less_working_sets(charges: Charges, levels: np.ndarray, besides: str | None = None) -> np.ndarray:
    """`levels` (the heap's bytes in use) without the chunks of the stages that gave theirs back, other than
    `besides`: a working set (LMDeploy's image preprocessing on the PyTorch engine keeps ~1 MiB a request until
    a garbage collection or its heap trim frees it), not growth."""
    worked = [charges.levels[stage] for stage in charges.given_back if stage != besides]
    return levels - sum(worked) if worked else levels


def _given_back(levels: np.ndarray) -> bool:
    """Whether a stage's chunks fell by MIN_GROWTH_BYTES or more between two settled points."""
    return bool(level_falls(levels[np.isfinite(levels)]).any())


def _kept_rate(x: np.ndarray, levels: np.ndarray, given_back: bool) -> float | None:
    """Bytes per request a stage's chunks kept: where they were given back, the line through what each
    give-back left (the rest was a working set: LMDeploy's image preprocessing on the PyTorch engine keeps
    ~1 MiB a request until a garbage collection frees it); otherwise their Theil–Sen slope."""
    x, levels = _known(x, levels)
    if not given_back:
        fit = theil_sen(x, levels)
        return None if fit is None else float(fit.slope)
    kept = trough_points(levels, runs_as_one=True)
    return float(np.polyfit(x[kept], levels[kept], 1)[0]) if x[kept[-1]] > x[kept[0]] else None


def filling(growth: ComponentGrowth, charges: Charges, allocating: str | None) -> str | None:
    """Why a host leak whose rate was read across one fall of resident memory (host_levels.kept_rate, and the
    one-trim rule: LMDeploy's first heap trim on the PyTorch engine) is not yet a leak, or None. One fall
    leaves two troughs, and a line through two cannot tell a cache filled before the fall from a leak. The
    allocating stage's chunks are given back more often (each garbage collection that frees a working set
    of that stage), and what each give-back left is what the stage kept: where that rose, after the first,
    at less than STEADY_RATIO of its first rate, the stage's memory is settling (a cache filling towards its
    bound, or warm-up). Needs two or more falls of the stage's chunks (docs/analysis.md, "Give-backs")."""
    if not (growth.grows and growth.trims == 1 and allocating):
        return None
    x, levels = _known(charges.series.x, charges.levels[allocating])
    kept = trough_points(levels, runs_as_one=True)
    if len(kept) < MIN_TROUGHS or np.any(np.diff(x[kept]) <= 0):
        return None
    rates = np.diff(levels[kept]) / np.diff(x[kept])
    if rates[0] <= 0 or bool(np.all(rates[1:] >= STEADY_RATIO * rates[0])):
        return None
    return (
        f"the large heap chunks allocated {allocated_where(allocating)} kept {format_bytes(rates[0], signed=True)} per "
        f"request up to their first give-back and {format_bytes(float(rates[1:].min()), signed=True)} after it: "
        f"slowing (a cache filling towards its bound, or warm-up), where resident memory, given back once, cannot "
        f"tell; about {int(np.ceil(x[-1] - x[0])):,} more requests would settle it"
    )


def grew_once(growth: ComponentGrowth, charges: Charges, heap: pd.DataFrame) -> str | None:
    """Why a host leak is not one: the heap's bytes in use (`heap`: `t_ns` and `heap` of the sampler's readings,
    which carry the charges too), without the chunks of stages that gave theirs back (a working set), rose
    by one jump of MIN_GROWTH_BYTES or more between two settled points and less than a leak's rate on either
    side of it: memory kept once (a buffer, a table built on first use). Not where a stage's chunks kept a
    leak's rate across its own give-backs.
    Resident memory cannot tell this in a young PyTorch-engine process, where the one-trim rule reads all
    that the trim left as kept (docs/analysis.md, "Give-backs")."""
    if not (growth.grows and growth.component == "host"):
        return None
    leak_rate = BY_NAME["host"].min_leak_rate
    if any((charges.kept[stage] or 0.0) >= leak_rate for stage in charges.given_back):
        return None
    # The same samples as the charges': a working set freed between a span's reading and the next sample
    # would read as a fall and a jump of its own.
    latest = _latest_samples(heap, charges.series)
    in_use = np.where(latest >= 0, heap["heap"].to_numpy(dtype=np.float64)[np.maximum(latest, 0)], np.nan)
    x, kept = _known(charges.series.x, _less_working_sets(charges, in_use))
    if len(kept) < MIN_TROUGHS:
        return None
    steps = np.diff(kept)
    jump = int(np.argmax(steps))
    # The slope on either side of the jump, pairs across it left out: a leak rises on both sides.
    besides = theil_sen(x, kept, groups=np.arange(len(kept)) > jump)
    if steps[jump] < MIN_GROWTH_BYTES or besides is None or besides.slope >= leak_rate:
        return None
    return (
        f"the heap's bytes in use rose by {format_bytes(float(steps[jump]))} at once, by request {int(x[jump + 1]):,}, and "
        f"{format_bytes(besides.slope, signed=True)} per request before and after: memory kept once, not a leak; about "
        f"{int(np.ceil(x[-1] - x[0])):,} more requests would tell whether it keeps rising"
    )
