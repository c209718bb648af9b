"""The verdict on one component of one process, assembled from what the earlier steps read: the class
decided by the ordered rules (class_rules.py) over the growth's shape (leaks.py) and the heap counter's
readings (a stage's large heap chunks rising steadily, what a stage kept in both halves of the run, chunks
filling a bounded cache, the heap growing once), the stage named (naming.verdict_stage), the rate read where
it is truest (the fit, the allocating stage's chunks, what the stage kept, the levels LMDeploy's heap trims
left), the input feature driving it (drivers.py), and `evidence["decision"]`, which says which of these
decided."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from vlmtrace.analysis.readers.captures import Capture, latest_window
from vlmtrace.analysis.registry import BY_NAME
from vlmtrace.analysis.robust import theil_sen
from vlmtrace.analysis.step2_preparing.settle import SettledSeries
from vlmtrace.analysis.step2_preparing.tables import ORIGIN_SAMPLE
from vlmtrace.analysis.step3_verdict.class_rules import decide
from vlmtrace.analysis.step3_verdict.decision import (
    RATE_FROM_ALLOCATIONS,
    RATE_FROM_SURVIVORS,
    decision,
)
from vlmtrace.analysis.step3_verdict.drivers import FeatureDriver
from vlmtrace.analysis.step3_verdict.heap_tags import (
    SHOWN,
    allocated_by_stage,
    allocated_where,
    at_settled_points,
    filling,
    from_allocations,
    grew_once,
    kept_rising,
)
from vlmtrace.analysis.step3_verdict.leaks import ComponentGrowth
from vlmtrace.analysis.step3_verdict.naming import verdict_stage
from vlmtrace.analysis.step3_verdict.stage_rise import StageRise
from vlmtrace.analysis.step3_verdict.survivors import (
    kept_by_stage,
    rate_kept,
    read_from_survivors,
    slope_reason,
    survived,
    with_kept_rates,
)
from vlmtrace.analysis.summary import Verdict
from vlmtrace.analysis.units import format_bytes


@dataclasses.dataclass(frozen=True)
class ProcessEvidence:
    """What the earlier steps read of one process, which each verdict on its components draws on."""

    label: str  # the process as the summary names it
    series: SettledSeries  # its settled levels (settle.py)
    readings: pd.DataFrame  # its memory readings (tables.py)
    requests: pd.DataFrame  # its requests, for what each stage kept by when it was allocated (survivors.py)
    stages: pd.DataFrame  # bytes retained per stage and component (stages.py)
    hand_offs: pd.DataFrame  # HAND_OFF_COLUMNS: bytes one stage allocated and another freed (stages.py)
    heap_stages: (
        pd.DataFrame
    )  # the heap counter's bytes in use per stage, where it places host growth (naming.heap_places_host)
    host_windows: pd.DataFrame | None  # host bytes charged per stage in each window between settled points (stages.py)
    heap_by_stage: pd.DataFrame  # samples of its large heap chunks in use by allocating stage (heap_readings.py)
    survivors: tuple[int, dict] | None  # its last reading of what each stage kept by when it was allocated
    rise: StageRise | None  # a stage rising beside a young process's host warm-up (stage_rise.py)
    sample_steps: dict[str, float]  # the sampling interval of each component read only by the background sampler
    drivers: dict[str, list[FeatureDriver]]  # the input features each component's retained bytes follow
    captures: list[Capture]  # its capture windows' allocation sites (readers/captures.py)


def _cache_evidence(readings: pd.DataFrame, series: SettledSeries) -> dict:
    evidence: dict = {}
    split = readings["inactive_split"].to_numpy()[series.rows]
    fit = theil_sen(series.x, split)
    if fit is not None:
        evidence["inactive_split_slope_bytes_per_request"] = fit.slope
    for column, key in (("alloc_retries", "alloc_retries"), ("ooms", "torch_ooms")):
        values = readings[column].to_numpy()
        values = values[np.isfinite(values)]
        if len(values):
            evidence[key] = float(values[-1] - values[0])
    return evidence


def component_verdict(growth: ComponentGrowth, process: ProcessEvidence) -> tuple[Verdict, ComponentGrowth]:
    """The verdict, and the growth it reads (the heap's allocations or what a stage kept may have read its
    rate again). The heap counter's charges, windows and survivors are read for host verdicts only."""
    host = growth.component == "host"
    heap_by_stage = process.heap_by_stage if host else None
    survivors = process.survivors if host else None
    requests = process.requests
    series, readings = process.series, process.readings
    rise = process.rise if growth.beside_warmup else None
    drivers = process.drivers[growth.component]
    charges = at_settled_points(heap_by_stage, series) if heap_by_stage is not None else None
    if charges is not None:
        charges = with_kept_rates(charges, heap_by_stage, survivors, requests)
    allocated = allocated_by_stage(charges) if charges is not None else None
    mine = process.stages[process.stages["component"] == growth.component]
    mine = mine.sort_values("retained_bytes", ascending=False)
    stage, stage_evidence = verdict_stage(
        growth,
        mine,
        process.sample_steps.get(growth.component),
        rise,
        process.hand_offs,
        series,
        process.host_windows if host else None,
        process.heap_stages,
        allocated,
        window.sites if (window := latest_window(process.captures, growth.component)) is not None else None,
    )
    allocating = stage_evidence.get("allocating_stage")
    leaking = allocating or stage  # whose chunks still in use are read by when they were allocated
    kept = (
        kept_by_stage(heap_by_stage, leaking, survivors, requests)
        if charges is not None and survivors is not None and requests is not None
        else None
    )
    # The heap counter's readings, each where the one before it did not tell; then the class rules decide.
    rising = kept_rising(growth, charges, allocating) if charges is not None else None
    lasted = (
        survived(growth, kept, allocated_where(leaking)) if rising is None and kept is not None and leaking else None
    )
    filled = filling(growth, charges, allocating) if charges is not None and lasted is None else None
    # The one-jump test is for a leak, which the rising chunks make it.
    candidate = (
        dataclasses.replace(growth, klass=BY_NAME[growth.component].leak_class) if rising is not None else growth
    )
    once = (
        grew_once(candidate, charges, readings.loc[readings["origin"].to_numpy() == ORIGIN_SAMPLE, ["t_ns", "heap"]])
        if charges is not None and lasted is None and filled is None
        else None
    )
    assert growth.evidence is not None and growth.decision is not None  # leaks.classify decided the growth
    decided = decide(
        dataclasses.replace(
            growth.evidence, kept_by_stage=lasted, filling=filled, grew_once=once, allocations_rising=rising
        ),
        BY_NAME[growth.component].leak_class,
    )
    if decided.rule is not growth.decision.rule:
        leak = decided.klass == BY_NAME[growth.component].leak_class
        level = growth.plateau and not leak and rising is None  # rising chunks are no plateau, whatever they decide
        growth = dataclasses.replace(
            growth,
            klass=decided.klass,
            decision=decided,
            plateau=level,
            plateau_reason=growth.plateau_reason if level else None,
            inconclusive_reason=None if leak else filled or once,
        )
    read = (
        from_allocations(growth, charges, allocating, readings["heap"].to_numpy()[series.rows])
        if charges is not None and lasted is None
        else None
    )
    kept_rate = rate_kept(growth, kept) if read is None and lasted is None else None
    rate_from = (
        RATE_FROM_SURVIVORS
        if lasted is not None or kept_rate is not None
        else RATE_FROM_ALLOCATIONS
        if read is not None
        else None
    )
    evidence = {
        "points": growth.points,
        "settled_levels": series.mode,
        "growth_bytes": growth.growth_bytes,
        "noise_bytes": growth.per_request.noise,
        "retained_by_stage": {str(row.stage): float(row.retained_bytes) for row in mine.head(SHOWN).itertuples()},
        **stage_evidence,
        "driver": (
            {
                "feature": drivers[0].feature,
                "correlation": drivers[0].correlation,
                "bytes_per_unit": drivers[0].bytes_per_unit,
            }
            if drivers
            else None
        ),
        "plateau_reason": growth.plateau_reason,
        "inconclusive_reason": growth.inconclusive_reason,
        "rise_at_new_input_maxima": growth.record_increase_share,
    }
    if rising is not None and growth.grows:
        evidence["class_from_allocations"] = rising
    if lasted is not None or kept_rate is not None:
        assert kept is not None and leaking  # what the leaking stage kept decided the class or read the rate
        if lasted is not None:  # its words give the rate too
            evidence["class_from_survivors"] = lasted
        else:
            evidence["slope_from_survivors"] = slope_reason(kept, allocated_where(leaking), growth.per_request.slope)
        evidence["resident_slope_bytes_per_request"] = growth.per_request.slope
        evidence["survivors_stage"] = leaking
        growth = read_from_survivors(growth, kept)
    elif read is not None and allocating:  # from_allocations read the rate of the allocating stage's chunks
        evidence["resident_slope_bytes_per_request"] = growth.per_request.slope
        evidence["slope_from_allocations"] = (
            f"the rate is that of the large heap chunks allocated {allocated_where(allocating)} "
            f"and still in use, which are what the heap grew by; resident memory grew "
            f"{format_bytes(growth.per_request.slope, signed=True)} per request, "
            f"with the work in flight at each reading"
        )
        growth = read
    elif growth.trims:
        evidence["slope_from_trims"] = (
            f"the heap was trimmed {growth.trims} {'time' if growth.trims == 1 else 'times'}: the rate is what "
            + (
                "its first level and the lowest level after the trim"
                if growth.trims == 1
                else "the lowest levels after the trims"
            )
            + " kept, not the rise between them, which the next trim gives back"
        )
    if growth.component == "host" and allocated is not None:
        evidence["heap_allocated_by_stage"] = allocated
    evidence["decision"] = decision(growth, stage, evidence, rate_from)
    if growth.component == "cache":
        evidence.update(_cache_evidence(readings, series))
    fit = growth.per_request
    verdict = Verdict(
        component=growth.component,
        klass=growth.klass,
        slope_bytes_per_request=fit.slope,
        slope_interval_bytes_per_request=(fit.low, fit.high),
        slope_bytes_per_second=growth.per_second.slope if growth.per_second else None,
        stage=stage,
        process=process.label,
        plateau=growth.plateau,
        evidence=evidence,
        **(growth.change.to_dict() if growth.change is not None else {}),
    )
    return verdict, growth
