"""Which stage a verdict names, and why it names none: the stage that retained most of the growth where the
evidence separates it from the others, withheld where a rule says the trace cannot tell (docs/analysis.md,
"Where"). stages.py charges the bytes to stages; this module reads those charges."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from vlmtrace import semconv as sc
from vlmtrace.analysis.registry import INCONCLUSIVE
from vlmtrace.analysis.rules import (
    HANDED_SHARE,
    HEAP_EXPLAINS,
    MIN_SPORADIC_WINDOWS,
    QUIET_CHARGE_BYTES,
    RELEASER_GAINS,
    SAMPLED_STAGE_SHARE_MIN,
    SEPARATION,
    SHARED_CHARGE_SHARE,
    SPORADIC_SHARE,
    STAGE_SHARE_MIN,
)
from vlmtrace.analysis.step1_loading.column_keys import NO_SPAN
from vlmtrace.analysis.step2_preparing.settle import SettledSeries
from vlmtrace.analysis.step2_preparing.tables import ORIGIN_SAMPLE
from vlmtrace.analysis.step3_verdict.heap_tags import SHOWN
from vlmtrace.analysis.step3_verdict.leaks import ComponentGrowth
from vlmtrace.analysis.step3_verdict.site_stage import site_stage
from vlmtrace.analysis.step3_verdict.stage_rise import StageRise
from vlmtrace.analysis.units import format_bytes

# Stages that only give memory back (the application's empty_cache calls, the cache guard's trims, LMDeploy's
# heap trims): never the stage that holds memory, whatever the rounding or a concurrent change leaves them.
RELEASING_STAGES = (sc.STAGE_EMPTY_CACHE, sc.STAGE_CACHE_TRIM, sc.STAGE_HEAP_TRIM)
# The heap counter's two witnesses, as the evidence names them: its bytes in use, charged per window
# (host_stage), and its large chunks charged to the stage that allocated them (allocation_stage).
# `stage_withheld_by` names the one that withheld a host stage (its bytes in use); `stage_share_of`, the one
# whose shares stand for a stage it named where resident pages named another (its chunks).
WITHHELD_BY_HEAP = "heap_bytes_in_use"
HEAP_ALLOCATIONS = "heap_allocations"


def heap_places_host(readings: pd.DataFrame, series: SettledSeries) -> bool:
    """Whether the heap counter's readings place the process's host growth beside resident pages
    (host_stage): it ran with the counter read at span boundaries, and the heap's rise explains at least
    HEAP_EXPLAINS of the resident rise (a leak of pymalloc's small objects, or of pages mapped outside
    malloc, raises RSS alone: then resident pages are all there is)."""
    heap = readings["heap"].to_numpy()
    if not np.isfinite(heap[readings["origin"].to_numpy() != ORIGIN_SAMPLE]).any():
        return False
    heap, resident = heap[series.rows], readings["host"].to_numpy()[series.rows]
    resident_rise = float(np.nanmax(resident) - resident[0])
    return bool(np.isfinite(heap[[0, -1]]).all()) and (
        resident_rise <= 0 or heap[-1] - heap[0] >= HEAP_EXPLAINS * resident_rise
    )


def _overlap_share(row: pd.Series) -> float | None:
    """Share of the stage's net change charged in intervals that other stages could have run in too."""
    if row["net_bytes"] <= 0:
        return None
    return float(min(1.0, max(0.0, row["overlapped_bytes"] / row["net_bytes"])))


def _retained(mine: pd.DataFrame) -> pd.DataFrame:
    """The stages that retained memory, largest first, those that only release it left out."""
    return mine[(mine["retained_bytes"] > 0) & ~mine["stage"].isin(RELEASING_STAGES)]


def _separated(amounts: list[float], share_min: float = STAGE_SHARE_MIN) -> bool:
    """Whether the first of the stages' `amounts` (largest first) holds enough of them, and enough more than
    the second, to be named."""
    return amounts[0] >= share_min * sum(amounts) and (len(amounts) < 2 or amounts[0] >= SEPARATION * amounts[1])


def named_stage(mine: pd.DataFrame, step_s: float | None) -> tuple[str | None, dict]:
    """The stage named for a verdict (None unless the evidence separates it) and the evidence for it.
    `step_s`: the sampling interval when the component is read by the sampler alone."""
    retained = _retained(mine)
    total = float(retained["retained_bytes"].sum())
    sampled = (
        f"read about every {step_s * 1000:.0f} ms by the sampler, coarser than the spans"
        if step_s is not None
        else None
    )
    if not len(retained) or total <= 0:
        # Between samples the spans' shares of a change can cancel out: the sampler is still why no stage is named.
        return None, {"stage_share": None, "stage_overlap_share": None, "stage_uncertain": sampled, "runner_up": None}
    top = retained.iloc[0]
    share = float(top["retained_bytes"] / total)
    second = retained.iloc[1] if len(retained) > 1 else None
    runner_up = (
        {"stage": str(second["stage"]), "share": float(second["retained_bytes"] / total)}
        if second is not None
        else None
    )
    evidence: dict[str, Any] = {
        "stage_share": share,
        "stage_overlap_share": _overlap_share(top),
        "stage_uncertain": None,
        "runner_up": runner_up,
    }
    if step_s is not None:
        evidence["stage_uncertain"] = sampled
    if not _separated(
        retained["retained_bytes"].tolist(), STAGE_SHARE_MIN if step_s is None else SAMPLED_STAGE_SHARE_MIN
    ):
        assert runner_up is not None  # a single retaining stage is always separated (its share is 1)
        evidence["stage_uncertain"] = (
            f"{top['stage']} ({share:.0%}) or {runner_up['stage']} ({runner_up['share']:.0%}): "
            + (f"{evidence['stage_uncertain']}, so" if step_s is not None else "their spans ran together, and")
            + " the trace cannot tell which held the memory"
        )
        return None, evidence
    stage = str(top["stage"])
    return (None if stage == NO_SPAN else stage), evidence


def sporadic(stage: str | None, windows: pd.DataFrame | None, series: SettledSeries) -> str | None:
    """Why the stage holding most of a host rise is not named: it rose in too few of the calls. A leak
    allocates at every request, so its stage charges in every window between settled points; resident
    pages rise where the heap next needs fresh ones, which may be another stage's larger inputs (a small
    heap leak at one prompt in flight, placed in vision.preprocess: docs/analysis.md). Read between
    calls (`idle`) only: under load a window closes one request, and a call's charges fall in one of them."""
    if (
        stage is None
        or windows is None
        or series.mode != "idle"
        or stage not in windows
        or len(windows) < MIN_SPORADIC_WINDOWS
    ):
        return None
    quiet = float((np.abs(windows[stage].to_numpy()) < QUIET_CHARGE_BYTES).mean())
    if quiet < SPORADIC_SHARE:
        return None
    return (
        f"{stage} holds most of it, but its resident size did not move in {quiet:.0%} of the calls, where a leak's "
        "stage rises in every one: resident pages rise where the heap next needs fresh ones, which need not be "
        "where the memory was allocated"
    )


def charged_beside_others(stage: str | None, mine: pd.DataFrame) -> str | None:
    """Why the host stage resident pages named is not named: SHARED_CHARGE_SHARE or more of its net change was
    charged in intervals other stages ran in too, where the split follows each stage's rate from the intervals
    it ran alone (stages.py), and its charges in the intervals it ran alone (`net_bytes` − `overlapped_bytes`)
    do not separate it (STAGE_SHARE_MIN, SEPARATION). TurboMind's stream runs beside every other stage of a
    request, so the split charges it with most of what any stage kept: a leak in the vision preprocessing or
    the prompt processing is read as the stream's (docs/analysis.md, "Where: the stage")."""
    named = mine[mine["stage"] == stage]
    if stage is None or named.empty:
        return None
    share = _overlap_share(named.iloc[0])
    if share is None or share < SHARED_CHARGE_SHARE:
        return None
    working = mine[~mine["stage"].isin(RELEASING_STAGES)]
    alone = working["net_bytes"] - working["overlapped_bytes"]
    own = float(alone[working["stage"] == stage].sum())
    others = sorted(
        (float(a) for a, name in zip(alone, working["stage"], strict=True) if name != stage and a > 0), reverse=True
    )
    if own > 0 and _separated([own, *others]):
        return None
    where = max(zip(alone, working["stage"], strict=True))[1] if len(working) else stage
    return (
        f"{stage} was charged {share:.0%} of its change in intervals other stages ran in too, and in the intervals "
        f"each stage ran alone {'it rose most, but not twice as much as the next' if where == stage else f'{where} rose more'}: "
        "the stage that keeps the memory cannot be told from the stages running beside it"
    )


def host_stage(resident: str | None, evidence: dict, heap: pd.DataFrame, hand_offs: pd.DataFrame) -> str | None:
    """The host stage where the heap counter read too. Resident pages and the heap's bytes in use are two
    witnesses that fail differently: pages rise where the heap next needs fresh ones; the heap's charges
    mistake a stage that frees what it was handed and keeps its own (handed_over), and garbage that only
    LMDeploy's heap trims collect. The heap alone is no better a witness than resident pages (docs/gpu.md),
    so it only vetoes: where the two name different stages (`(outside any span)` included), none is
    named and `stage_uncertain` says both (docs/analysis.md, "The heap counter").
    `resident`: the stage resident pages named, None where withheld. `evidence` gains `heap_stage`, and
    where the two disagree `resident_stage` and `stage_withheld_by`."""
    named = _named(*named_stage(heap, None))
    if named is not None and handed_over(named, heap, hand_offs):
        named = None
    evidence["heap_stage"] = named
    evidence["heap_retained_by_stage"] = {
        str(row.stage): float(row.retained_bytes) for row in heap.head(SHOWN).itertuples()
    }
    if resident is None or named is None or named == resident:
        return None if resident == NO_SPAN else resident
    evidence["stage_uncertain"] = (
        f"resident pages rose in {resident}, the heap's bytes in use in {named}: pages rise "
        "where the heap next needs fresh ones, and the heap's own charges can mistake a stage "
        "that frees what it was handed, so neither is named"
    )
    evidence["resident_stage"], evidence["stage_withheld_by"] = resident, WITHHELD_BY_HEAP
    return None


def allocating_stage(allocated: dict[str, float] | None, slope: float) -> str | None:
    """The stage whose large heap chunks still in use grew, by the heap counter's charges to the stage that
    allocated them (heap_tags.py), where they separate it as named_stage's shares do and its growth is at
    least HEAP_EXPLAINS of the verdict's `slope` (a leak of small blocks leaves no large chunks behind)."""
    if not allocated:
        return None
    stage, top = next(iter(allocated.items()))
    return stage if _separated(sorted(allocated.values(), reverse=True)) and top >= HEAP_EXPLAINS * slope else None


def allocation_stage(
    stage: str | None,
    resident: str | None,
    evidence: dict,
    allocated: dict[str, float] | None,
    slope: float,
    handed: str | None = None,
) -> str | None:
    """The host stage the heap counter's large chunks name (heap_tags.py): where they separate the stage that
    allocated what grew (allocating_stage), that stage is named, whatever resident pages (`resident`, before
    any veto), the heap's bytes in use or a hand-off said. A chunk is charged to the stage that allocated it
    until it is freed, so the charges are fooled neither by hand-offs (the heap's bytes in use per window
    are) nor by where pages are first touched (resident pages are), nor by the requests in flight beside it.
    Where resident pages named another stage it stays in the evidence (`resident_stage`), and the chunks'
    shares stand for the stage's. Without them, `stage` stands (docs/analysis.md, "Large chunks charged to
    the stage that allocated them")."""
    allocating = allocating_stage(allocated, slope)
    if allocating is None or allocated is None:  # allocating_stage names none without charges
        return stage
    evidence["allocating_stage"] = allocating
    evidence["stage_uncertain"] = None  # the charges settle it
    evidence.pop("stage_withheld_by", None)  # the heap's bytes in use, overruled
    if resident is not None and resident != allocating:
        evidence["resident_stage"] = resident
    else:
        evidence.pop("resident_stage", None)
    if allocating not in (resident, handed):  # resident pages' shares are another stage's: the chunks' own stand in
        total = sum(allocated.values())
        second = next((other for other in allocated if other != allocating), None)
        evidence.update(
            stage_share=allocated[allocating] / total,
            stage_overlap_share=None,
            stage_share_of=HEAP_ALLOCATIONS,
            runner_up={"stage": second, "share": allocated[second] / total} if second else None,
        )
    return None if allocating == NO_SPAN else allocating


def handed_over(stage: str | None, mine: pd.DataFrame, hand_offs: pd.DataFrame) -> str | None:
    """Why `stage` is not named: a stage that freed part of what it allocated also gained memory of its own.
    Per window, "`stage` keeps what it allocated, the other frees the rest" and "the other frees all that
    `stage` handed it and keeps memory of its own" add up the same; only a releasing stage that never
    gains tells them apart (docs/analysis.md, "Hand-offs")."""
    named = mine[mine["stage"] == stage]["retained_bytes"]
    retained = float(named.iloc[0]) if len(named) else 0.0
    if stage is None or retained <= 0:
        return None
    mine = hand_offs[
        (hand_offs["stage"] == stage)
        & (hand_offs["bytes"] >= HANDED_SHARE * retained)
        & (hand_offs["releasing_gains"] >= RELEASER_GAINS)
    ]
    if mine.empty:
        return None
    other = mine.sort_values("bytes").iloc[-1]
    return (
        f"{stage} or {other['releasing']}: {other['releasing']} freed {format_bytes(other['bytes'])} of what {stage} "
        f"allocated and gained memory itself in {other['releasing_gains']:.0%} of the windows, so the memory kept may be "
        f"{other['releasing']}'s own"
    )


def risen_stage(rise: StageRise) -> tuple[str | None, dict]:
    """The stage that kept rising beside a young process's settling warm-up, and why it is the one."""
    evidence = {
        "stage_share": rise.share,
        "stage_overlap_share": None,
        "stage_uncertain": None,
        "runner_up": {"stage": rise.runner_up, "share": rise.runner_up_share} if rise.runner_up else None,
        "stage_rise": (
            f"{rise.stage} kept rising while the rest of the process settled from {format_bytes(rise.rest_first_rate)} "
            f"to {format_bytes(rise.rest_last_rate)} per request (LMDeploy's warm-up): the slope is {rise.stage}'s own"
            if rise.rest_settling
            else f"{rise.stage} kept rising, {rise.share:.0%} of the process's growth in the run's last third, while the rest of "
            f"the process, LMDeploy's warm-up spread over the other stages, went from {format_bytes(rise.rest_first_rate)} "
            f"to {format_bytes(rise.rest_last_rate)} per request: the slope is {rise.stage}'s own"
        ),
    }
    return (None if rise.stage == NO_SPAN else rise.stage), evidence


def _named(stage: str | None, evidence: dict) -> str | None:
    """The stage `named_stage` named, `(outside any span)` included (it returns None for that, with no doubt)."""
    if stage is None and evidence["stage_uncertain"] is None and evidence["stage_share"] is not None:
        return NO_SPAN
    return stage


def _with_detail(
    mine: pd.DataFrame, hand_offs: pd.DataFrame, heap: pd.DataFrame | None, windows: pd.DataFrame | None
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame | None, pd.DataFrame | None]:
    """The charges, hand-offs and windows without the requests that recorded no stage detail: of the
    windows, those in which one was charged say nothing of what the stages did there, and are left out."""
    unseen = sc.STAGE_WITHOUT_DETAIL
    if not (mine["stage"] == unseen).any():
        return mine, hand_offs, heap, windows
    if windows is not None and unseen in windows:
        windows = windows[windows[unseen].to_numpy() == 0].drop(columns=[unseen])
    return (
        mine[mine["stage"] != unseen],
        hand_offs[(hand_offs["stage"] != unseen) & (hand_offs["releasing"] != unseen)],
        heap if heap is None else heap[heap["stage"] != unseen],
        windows,
    )


def verdict_stage(
    growth: ComponentGrowth,
    mine: pd.DataFrame,
    step_s: float | None,
    rise: StageRise | None,
    hand_offs: pd.DataFrame,
    series: SettledSeries,
    windows: pd.DataFrame | None,
    heap: pd.DataFrame | None,
    allocated: dict[str, float] | None = None,
    sites: list[dict] | None = None,
) -> tuple[str | None, dict]:
    """The stage a verdict names and the evidence for it. `mine`: the process's retained bytes per stage of
    the verdict's component, largest first; `step_s`: the sampling interval when the component is read by
    the sampler alone; `rise`: a young process's stage rise (stage_rise.py); `hand_offs`: the process's
    HAND_OFF_COLUMNS (stages.py); `windows`: host bytes charged per stage in each window between settled
    points; `heap`: the heap counter's retained bytes per stage, where it places host growth (heap_places_host);
    `allocated`: its large chunks' growth per request by allocating stage (heap_tags.py). What requests
    without stage detail did (sc.STAGE_WITHOUT_DETAIL) is no stage: the stages are told apart by the
    requests that recorded theirs. `sites`: the component's latest capture window's allocation sites, which
    name the stage where the spans cannot (site_stage.py)."""
    mine, hand_offs, heap, windows = _with_detail(mine, hand_offs, heap, windows)
    stage, evidence = named_stage(mine, step_s) if rise is None else risen_stage(rise)
    reason = sporadic(stage, windows, series)
    if reason:
        evidence["stage_uncertain"], stage = reason, None
    handed = None  # the stage a hand-off withheld
    if rise is None:
        reason = handed_over(stage, mine, hand_offs[hand_offs["component"] == growth.component])
        if reason:
            evidence["stage_uncertain"], stage, handed = reason, None, stage
    if growth.component == "host" and rise is None:
        reason = charged_beside_others(stage, mine)
        if reason:
            sampled = evidence["stage_uncertain"]  # the sampler's coarse readings, where they are why too
            evidence["stage_uncertain"], stage = f"{sampled}; {reason}" if sampled else reason, None
    resident = _named(stage, evidence)
    if growth.component == "host" and heap is not None and not heap.empty:
        stage = host_stage(
            resident,
            evidence,
            heap.sort_values("retained_bytes", ascending=False),
            hand_offs[hand_offs["component"] == "heap"],
        )
    if growth.component == "host":
        stage = allocation_stage(stage, resident, evidence, allocated, growth.per_request.slope, handed)
    if not (growth.grows or growth.plateau or growth.klass == INCONCLUSIVE):
        stage = None  # where a flat line's noise went is no finding
    elif growth.like_warmup and stage is not None and stage != evidence.get("allocating_stage"):
        # LMDeploy's warm-up raises resident pages in its own stages; its chunks kept are not a separated stage's leak
        evidence["stage_uncertain"] = (
            f"{stage} holds most of it, but so would LMDeploy's own warm-up in a process this young: "
            "no stage is named until the rise can be told from it"
        )
        stage = None
    if stage is None and growth.grows and sites and evidence.get("stage_uncertain"):
        found = site_stage(sites, growth.per_request.slope, mine)
        if found is not None:
            stage, named = found
            evidence["stage_from_sites"] = {**named, "spans_said": evidence["stage_uncertain"]}
            evidence["stage_uncertain"] = None
    return stage, evidence
