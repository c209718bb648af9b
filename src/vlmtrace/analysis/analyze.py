"""From what was read to verdicts: runs every analysis step and assembles the summary."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pandas as pd

from vlmtrace import semconv as sc
from vlmtrace.analysis.column_keys import MISSING_TIME
from vlmtrace.analysis.drivers import FeatureDriver, feature_drivers
from vlmtrace.analysis.crash import CrashedProcess, crashed_processes, stage_of
from vlmtrace.analysis.empty_cache import EmptyCacheCost, cache_trim_cost, empty_cache_cost, heap_trim_cost
from vlmtrace.analysis.leaks import ComponentGrowth, component_growth
from vlmtrace.analysis.projection import DeviceOutlook, device_outlooks
from vlmtrace.analysis.recommend import recommendations
from vlmtrace.analysis.robust import theil_sen
from vlmtrace.analysis.registry import BY_NAME, INCONCLUSIVE
from vlmtrace.analysis.settle import SettledSeries, settle
from vlmtrace.analysis.stage_rise import StageRise, steady_stage_rise
from vlmtrace.analysis.stages import HAND_OFF_COLUMNS, NO_SPAN, SEPARATION, STAGE_SHARE_MIN, retained_by_stage, with_prompt_spans
from vlmtrace.analysis.summary import Summary, Verdict
from vlmtrace.analysis.tables import COMPONENTS, ORIGIN_SAMPLE, Tables, build_tables
from vlmtrace.analysis.trace_data import TraceData
from vlmtrace.analysis.units import format_bytes

Step = Callable[[str], None]
# Read by the background sampler (NVML, RSS); spans repeat the latest sample (docs/schema.md), so
# their settled levels come from the samples when the trace has them.
SAMPLED = ("native", "host")
STEPWISE_SHARE = 0.8  # span readings repeating the previous one this often change only with the samples
# Read by the sampler, a component's change per interval is split by how many spans of each stage ran
# in it: several requests' every stage per interval, so the share must be larger to name one.
SAMPLED_STAGE_SHARE_MIN = 2 / 3
# Stages that only give memory back (the application's empty_cache calls, the cache guard's trims, LMDeploy's
# heap trims): never the stage that holds memory, whatever the rounding or a concurrent change leaves them.
RELEASING_STAGES = (sc.STAGE_EMPTY_CACHE, sc.STAGE_CACHE_TRIM, sc.STAGE_HEAP_TRIM)
# A host rise's stage whose charge stayed within QUIET_CHARGE_BYTES of zero in SPORADIC_SHARE of the calls
# or more is not named (_sporadic): the leaks' stages of the H200 matrices stayed so in 0-2 % of them, the
# stages named wrong for small heap leaks at one prompt in flight in 36-48 % (docs/analysis.md).
QUIET_CHARGE_BYTES = 64 * 1024
SPORADIC_SHARE = 0.25
# A stage is not named when a stage that freed at least HANDED_SHARE of what it kept (a hand-off, cancelled)
# gained memory itself in RELEASER_GAINS of the windows or more (_handed_over).
HANDED_SHARE = 0.1
RELEASER_GAINS = 0.05
# The heap's rise over a run, as a share of the resident rise, from which the heap counter's readings place
# host growth beside resident pages (_heap_places_host).
HEAP_EXPLAINS = 0.5


@dataclasses.dataclass
class Analysis:
    data: TraceData
    tables: Tables
    series: dict[int, SettledSeries]
    growth: list[ComponentGrowth]
    stages: pd.DataFrame
    drivers: dict[tuple[int, str], list[FeatureDriver]]
    devices: list[DeviceOutlook]
    empty_cache: EmptyCacheCost
    cache_trims: EmptyCacheCost
    crashed: list[CrashedProcess]
    summary: Summary


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


def _heap_places_host(readings: pd.DataFrame, series: SettledSeries) -> bool:
    """Whether the heap counter's readings place the process's host growth beside resident pages
    (_host_stage): it ran with the counter read at span boundaries, and the heap's rise explains at least
    HEAP_EXPLAINS of the resident rise (a leak of pymalloc's small objects, or of pages mapped outside
    malloc, raises RSS alone: then resident pages are all there is)."""
    heap = readings["heap"].to_numpy()
    if not np.isfinite(heap[readings["origin"].to_numpy() != ORIGIN_SAMPLE]).any():
        return False
    heap, resident = heap[series.rows], readings["host"].to_numpy()[series.rows]
    resident_rise = float(np.nanmax(resident) - resident[0])
    return bool(np.isfinite(heap[[0, -1]]).all()) and (resident_rise <= 0 or heap[-1] - heap[0] >= HEAP_EXPLAINS * resident_rise)


def _sampler_only(resource: dict) -> tuple[str, ...]:
    """The components a process read in the background sampler alone: NVML's always, RSS unless its
    resource says span boundaries read it too."""
    if resource.get(sc.RESOURCE_HOST_AT_BOUNDARIES) is True:
        return tuple(component for component in SAMPLED if component != "host")
    return SAMPLED


def _sample_step(readings: pd.DataFrame, component: str, sampler_only: tuple[str, ...]) -> float | None:
    """The sampling interval (seconds) when the span readings of `component` are the background
    sampler's — then stage attribution is no finer than that; None when they are live.

    The components in `sampler_only` (`_sampler_only`) are never read on the request path: in a trace
    with samples and read times (vlmtrace's own), they are the samples.
    Torch is read live, except while its allocator holds nothing (TurboMind; a cache with no tensor in
    it), when a span reuses the latest sample: its read time says so. Without read times (older
    journals, OTLP copies without samples), a component whose span readings mostly repeat the previous
    one changes only with the samples."""
    origin = readings["origin"].to_numpy()
    is_sample = origin == ORIGIN_SAMPLE
    sample_times = readings["t_ns"].to_numpy()[is_sample]
    step = float(np.median(np.diff(sample_times)) / 1e9) if len(sample_times) > 1 else None
    boundary = ~is_sample & np.isfinite(readings[component].to_numpy())
    if boundary.sum() < 10:
        return None
    read_ns, t_ns = readings["read_ns"].to_numpy()[boundary], readings["t_ns"].to_numpy()[boundary]
    if step is not None and (read_ns != t_ns).mean() > 0.5:  # read times recorded: vlmtrace's own probe
        if component in sampler_only:
            return step
        sample_reads = readings["read_ns"].to_numpy()[is_sample]
        # To the microsecond, as tables.py dedupes them: a start reading is end − delta in float64.
        return step if np.isin(read_ns // 1000, sample_reads // 1000).mean() >= STEPWISE_SHARE else None
    values = readings[component].to_numpy()[boundary]
    return step if component in SAMPLED and np.mean(np.diff(values) == 0) >= STEPWISE_SHARE else None


def _overlap_share(row: pd.Series) -> float | None:
    """Share of the stage's net change charged in intervals that other stages could have run in too."""
    if row["net_bytes"] <= 0:
        return None
    return float(min(1.0, max(0.0, row["overlapped_bytes"] / row["net_bytes"])))


def _stage(mine: pd.DataFrame, step_s: float | None) -> tuple[str | None, dict]:
    """The stage named for a verdict (None unless the evidence separates it) and the evidence for it.
    `step_s`: the sampling interval when the component is read by the sampler alone."""
    retained = mine[(mine["retained_bytes"] > 0) & ~mine["stage"].isin(RELEASING_STAGES)]
    total = float(retained["retained_bytes"].sum())
    sampled = f"read about every {step_s * 1000:.0f} ms by the sampler, coarser than the spans" if step_s is not None else None
    if not len(retained) or total <= 0:
        # Between samples the spans' shares of a change can cancel out: the sampler is still why no stage is named.
        return None, {"stage_share": None, "stage_overlap_share": None, "stage_uncertain": sampled, "runner_up": None}
    top = retained.iloc[0]
    share = float(top["retained_bytes"] / total)
    second = retained.iloc[1] if len(retained) > 1 else None
    runner_up = {"stage": str(second["stage"]), "share": float(second["retained_bytes"] / total)} if second is not None else None
    separated = share >= (STAGE_SHARE_MIN if step_s is None else SAMPLED_STAGE_SHARE_MIN) and (second is None or top["retained_bytes"] >= SEPARATION * second["retained_bytes"])
    evidence = {"stage_share": share, "stage_overlap_share": _overlap_share(top), "stage_uncertain": None, "runner_up": runner_up}
    if step_s is not None:
        evidence["stage_uncertain"] = sampled
    if not separated:
        evidence["stage_uncertain"] = (
            f"{top['stage']} ({share:.0%}) or {runner_up['stage']} ({runner_up['share']:.0%}): "
            + (f"{evidence['stage_uncertain']}, so" if step_s is not None else "their spans ran together, and")
            + " the trace cannot tell which held the memory"
        )
        return None, evidence
    stage = str(top["stage"])
    return (None if stage == NO_SPAN else stage), evidence


def _sporadic(stage: str | None, windows: pd.DataFrame | None, series: SettledSeries) -> str | None:
    """Why the stage holding most of a host rise is not named: it rose in too few of the calls. A leak
    allocates at every request, so its stage charges in every window between settled points; resident
    pages rise where the heap next needs fresh ones, which may be another stage's larger inputs (a small
    heap leak at one prompt in flight, placed in vision.preprocess: docs/analysis.md). Read between
    calls (`idle`) only: under load a window closes one request, and a call's charges fall in one of them."""
    if stage is None or windows is None or series.mode != "idle" or stage not in windows or len(windows) < 8:
        return None
    quiet = float((np.abs(windows[stage].to_numpy()) < QUIET_CHARGE_BYTES).mean())
    if quiet < SPORADIC_SHARE:
        return None
    return (f"{stage} holds most of it, but its resident size did not move in {quiet:.0%} of the calls, where a leak's "
            "stage rises in every one: resident pages rise where the heap next needs fresh ones, which need not be "
            "where the memory was allocated")


def _host_stage(resident: str | None, evidence: dict, heap: pd.DataFrame, hand_offs: pd.DataFrame) -> str | None:
    """The host stage where the heap counter read too. Resident pages and the heap's bytes in use are two
    witnesses that fail differently: pages rise where the heap next needs fresh ones; the heap's charges
    mistake a stage that frees what it was handed and keeps its own (_handed_over), and garbage that only
    LMDeploy's heap trims collect. Measured on three H200 matrices, the heap alone named no more stages right
    than resident pages, so it only vetoes: where the two name different stages (`(outside any span)`
    included), none is named and `stage_uncertain` says both (docs/analysis.md, "The heap counter").
    `resident`: the stage resident pages named, None where withheld. `evidence` gains `heap_stage`."""
    top, heap_evidence = _stage(heap, None)
    named = top if top is not None else (NO_SPAN if heap_evidence["stage_uncertain"] is None and heap_evidence["stage_share"] is not None else None)
    if named is not None and _handed_over(named, heap, hand_offs):
        named = None
    evidence["heap_stage"] = named
    evidence["heap_retained_by_stage"] = {str(row.stage): float(row.retained_bytes) for row in heap.head(5).itertuples()}
    if resident is None or named is None or named == resident:
        return None if resident == NO_SPAN else resident
    evidence["stage_uncertain"] = (f"resident pages rose in {resident}, the heap's bytes in use in {named}: pages rise "
                                   "where the heap next needs fresh ones, and the heap's own charges can mistake a stage "
                                   "that frees what it was handed, so neither is named")
    return None


def _handed_over(stage: str | None, mine: pd.DataFrame, hand_offs: pd.DataFrame) -> str | None:
    """Why `stage` is not named: a stage that freed part of what it allocated also gained memory of its own.
    Per window, "`stage` keeps what it allocated, the other frees the rest" and "the other frees all that
    `stage` handed it and keeps memory of its own" add up the same; only a releasing stage that never
    gains tells them apart (docs/analysis.md, "Hand-offs")."""
    named = mine[mine["stage"] == stage]["retained_bytes"]
    retained = float(named.iloc[0]) if len(named) else 0.0
    if stage is None or retained <= 0:
        return None
    mine = hand_offs[(hand_offs["stage"] == stage) & (hand_offs["bytes"] >= HANDED_SHARE * retained)
                     & (hand_offs["releasing_gains"] >= RELEASER_GAINS)]
    if mine.empty:
        return None
    other = mine.sort_values("bytes").iloc[-1]
    return (f"{stage} or {other['releasing']}: {other['releasing']} freed {format_bytes(other['bytes'])} of what {stage} "
            f"allocated and gained memory itself in {other['releasing_gains']:.0%} of the windows, so the memory kept may be "
            f"{other['releasing']}'s own")


def _risen_stage(rise: StageRise) -> tuple[str | None, dict]:
    """The stage that kept rising beside a young process's settling warm-up, and why it is the one."""
    evidence = {
        "stage_share": rise.share, "stage_overlap_share": None, "stage_uncertain": None,
        "runner_up": {"stage": rise.runner_up, "share": rise.runner_up_share} if rise.runner_up else None,
        "stage_rise": (
            f"{rise.stage} kept rising while the rest of the process settled from {format_bytes(rise.rest_first_rate)} "
            f"to {format_bytes(rise.rest_last_rate)} per request (LMDeploy's warm-up): the slope is {rise.stage}'s own"
            if rise.rest_settling else
            f"{rise.stage} kept rising, {rise.share:.0%} of the process's growth in the run's last third, while the rest of "
            f"the process, LMDeploy's warm-up spread over the other stages, went from {format_bytes(rise.rest_first_rate)} "
            f"to {format_bytes(rise.rest_last_rate)} per request: the slope is {rise.stage}'s own"
        ),
    }
    return (None if rise.stage == NO_SPAN else rise.stage), evidence


def _verdict(
    growth: ComponentGrowth,
    label: str,
    series: SettledSeries,
    stages: pd.DataFrame,
    drivers: list[FeatureDriver],
    readings: pd.DataFrame,
    step_s: float | None,
    rise: StageRise | None,
    hand_offs: pd.DataFrame,
    windows: pd.DataFrame | None = None,
    heap_stages: pd.DataFrame | None = None,
) -> Verdict:
    """`hand_offs`: HAND_OFF_COLUMNS of every process (stages.py); `windows`: host bytes charged per stage in
    each window between settled points (stages.py); `heap_stages`: the heap counter's retained bytes per
    stage, of the processes where it places host growth (_heap_places_host)."""
    mine = stages[(stages["process"] == growth.process) & (stages["component"] == growth.component)]
    mine = mine.sort_values("retained_bytes", ascending=False)
    stage, stage_evidence = _stage(mine, step_s) if rise is None else _risen_stage(rise)
    sporadic = _sporadic(stage, windows, series)
    if sporadic:
        stage_evidence["stage_uncertain"], stage = sporadic, None
    if rise is None:
        mixed = _handed_over(stage, mine, hand_offs[(hand_offs["process"] == growth.process) & (hand_offs["component"] == growth.component)])
        if mixed:
            stage_evidence["stage_uncertain"], stage = mixed, None
    if growth.component == "host" and heap_stages is not None:
        heap = heap_stages[heap_stages["process"] == growth.process]
        if not heap.empty:
            named_outside = stage is None and stage_evidence["stage_uncertain"] is None and stage_evidence["stage_share"] is not None
            stage = _host_stage(NO_SPAN if named_outside else stage, stage_evidence, heap.sort_values("retained_bytes", ascending=False),
                                hand_offs[(hand_offs["process"] == growth.process) & (hand_offs["component"] == "heap")])
    if not (growth.grows or growth.plateau or growth.klass == INCONCLUSIVE):
        stage = None  # where a flat line's noise went is no finding
    elif growth.like_warmup and stage is not None:
        stage_evidence["stage_uncertain"] = (
            f"{stage} holds most of it, but so would LMDeploy's own warm-up in a process this young: "
            "no stage is named until the rise can be told from it")
        stage = None
    fit = growth.per_request
    evidence = {
        "points": growth.points,
        "settled_levels": series.mode,
        "growth_bytes": growth.growth_bytes,
        "noise_bytes": fit.noise,
        "retained_by_stage": {str(row.stage): float(row.retained_bytes) for row in mine.head(5).itertuples()},
        **stage_evidence,
        "driver": (
            {"feature": drivers[0].feature, "correlation": drivers[0].correlation, "bytes_per_unit": drivers[0].bytes_per_unit}
            if drivers
            else None
        ),
        "plateau_reason": growth.plateau_reason,
        "inconclusive_reason": growth.inconclusive_reason,
        "rise_at_new_input_maxima": growth.record_increase_share,
    }
    if growth.trims:
        evidence["slope_from_trims"] = (
            f"the heap was trimmed {growth.trims} {'time' if growth.trims == 1 else 'times'}: the rate is what "
            f"{'its first level and the lowest level after the trim' if growth.trims == 1 else 'the lowest levels after the trims'} "
            "kept, not the rise between them, which the next trim gives back")
    if growth.component == "cache":
        evidence.update(_cache_evidence(readings, series))
    return Verdict(
        component=growth.component,
        klass=growth.klass,
        slope_bytes_per_request=fit.slope,
        slope_interval_bytes_per_request=(fit.low, fit.high),
        slope_bytes_per_second=growth.per_second.slope if growth.per_second else None,
        stage=stage,
        process=label,
        plateau=growth.plateau,
        evidence=evidence,
    )


def _in_flight(data: TraceData) -> list[dict]:
    return [
        {
            "name": span.name,
            "trace_id": span.trace_id,
            "span_id": span.span_id,
            "parent_id": span.parent_id,
            "stage": stage_of(span),
            "process": data.processes[span.process].label,
            "start_unix_nano": span.start_ns,
            "thread": span.thread,
            "attributes": span.attributes,
        }
        for span in sorted(data.in_flight, key=lambda s: s.start_ns or 0)
    ]


def _crash_summary(crashed: list[CrashedProcess]) -> list[dict] | None:
    if not crashed:
        return None
    result = []
    for item in crashed:
        samples = item.last_samples[["t_ns", "tensor", "cache", "native", "host", "gpu_used", "gpu_total"]].rename(columns={"t_ns": "t_unix_nano"})
        result.append(
            {
                "process": item.process,
                "last_record_unix_nano": item.last_record_ns,
                "chains": [
                    [{"name": s.name, "span_id": s.span_id, "stage": stage_of(s), "start_unix_nano": s.start_ns} for s in chain]
                    for chain in item.chains
                ],
                "chain_counts": [group.count for group in item.chain_groups],
                "chain_groups_left_out": item.chain_groups_left_out,
                "linked_requests": item.linked_requests,
                "last_samples": samples.astype(object).where(samples.notna(), None).to_dict("records"),
                "fatal": [{"source": f.source, "line": f.line, "title": f.title, "threads": f.threads} for f in item.fatal],
            }
        )
    return result


def _stage_rows(stages: pd.DataFrame, labels: list[str]) -> list[dict]:
    if stages.empty:
        return []
    retained = stages["retained_bytes"].clip(lower=0)  # shares of what was retained: a stage that gave back is < 0
    totals = retained.groupby([stages["process"], stages["component"]]).transform("sum")
    frame = stages.assign(share=(stages["retained_bytes"] / totals).where(totals > 0))
    frame = frame.sort_values(["process", "component", "retained_bytes"], ascending=[True, True, False])
    return [
        {"process": labels[row.process], "stage": row.stage, "component": row.component, "retained_bytes": row.retained_bytes, "share": row.share}
        for row in frame.itertuples()
    ]


def analyze(data: TraceData, step: Step | None = None) -> Analysis:
    """Everything the report shows, computed from the traces alone."""
    report = step or (lambda _: None)
    report("building tables")
    tables = build_tables(data)
    labels = [info.label for info in data.processes]
    spans = tables.spans
    timed = spans[(spans["start_ns"] != MISSING_TIME) & (spans["end_ns"] != MISSING_TIME)]
    series_by_process: dict[int, SettledSeries] = {}
    growth: list[ComponentGrowth] = []
    stage_frames = []
    drivers: dict[tuple[int, str], list[FeatureDriver]] = {}
    readings_by_process = dict(tuple(tables.readings.groupby("process", sort=True)))
    report("fitting growth per component")
    stepwise: dict[tuple[int, str], float] = {}
    rises: dict[int, StageRise] = {}  # host growth beside a young process's warm-up, per process
    host_windows: dict[int, pd.DataFrame] = {}  # host bytes charged per stage in each window between settled points
    hand_off_frames = [pd.DataFrame(columns=[*HAND_OFF_COLUMNS, "process"])]
    for process, readings in readings_by_process.items():
        readings = readings.reset_index(drop=True)
        readings_by_process[process] = readings
        series = settle(readings, tables.requests)
        if series is None:
            continue
        series_by_process[process] = series
        # Torch's readings are the sampler's too while its allocator holds nothing (TurboMind, a cache
        # that keeps segments with no tensor in them): any component can be read only every interval.
        sampler_only = _sampler_only(data.processes[process].resource)
        for component in COMPONENTS:
            interval = _sample_step(readings, component, sampler_only)
            if interval is not None:
                stepwise[(process, component)] = interval
        mine = timed[timed["process"] == process]
        by_sampler = tuple(component for component in COMPONENTS if (process, component) in stepwise)
        prompt_ends = tables.prompt_ends[tables.prompt_ends["process"].to_numpy() == process]
        response_ends = tables.response_ends[tables.response_ends["process"].to_numpy() == process]
        # LMDeploy's host warm-up is the PyTorch engine's (TurboMind's is ~45 KiB per request, docs/gpu-runs.md)
        young_host_warmup = data.processes[process].from_journal and not (
            (mine["name"] == sc.SPAN_TURBOMIND_STREAM).any() and not (mine["name"] == sc.SPAN_PYTORCH_FORWARD).any())
        # Host charges per window are read by the stage rise (young processes) and by _sporadic (idle levels) only.
        host_windows_read = "host" not in by_sampler and (young_host_warmup or series.mode == "idle")
        by_heap = "host" not in by_sampler and _heap_places_host(readings, series)
        charges = retained_by_stage(readings, with_prompt_spans(mine, prompt_ends, response_ends),
                                    COMPONENTS + (("heap",) if by_heap else ()), series.t_ns, by_sampler,
                                    keep_windows=("host",) if host_windows_read else ())
        stage_frames.append(charges.retained.assign(process=process))
        hand_off_frames.append(charges.hand_offs.assign(process=process))
        if "host" in charges.per_window:
            host_windows[process] = charges.per_window["host"]
            rise = (steady_stage_rise(charges.per_window["host"], series.x, BY_NAME["host"].min_leak_rate)
                    if young_host_warmup else None)
            if rise is not None:
                rises[process] = rise
        sampled = readings[readings["origin"].to_numpy() == ORIGIN_SAMPLE].reset_index(drop=True)
        sampled_series = settle(sampled, tables.requests)
        for component in COMPONENTS:
            source, points = (sampled, sampled_series) if component in SAMPLED and sampled_series else (readings, series)
            levels = source[component].to_numpy()[points.rows]
            rise = rises.get(process) if component == "host" else None
            item = component_growth(process, component, levels, points, young_host_warmup, rise.fit if rise else None,
                                    np.interp(points.x, rise.x, rise.levels) if rise else None)
            if item is None:
                continue
            growth.append(item)
            drivers[(process, component)] = feature_drivers(item.y, item.features) if item.grows or item.plateau else []
    stages = (
        pd.concat(stage_frames, ignore_index=True)
        if stage_frames
        else pd.DataFrame(columns=["stage", "component", "retained_bytes", "net_bytes", "overlapped_bytes", "process"])
    )
    hand_offs = pd.concat(hand_off_frames, ignore_index=True)
    heap_stages = stages[stages["component"] == "heap"]  # the host verdicts' second witness only (_host_stage)
    stages = stages[stages["component"] != "heap"].reset_index(drop=True)
    verdicts = [
        _verdict(
            item,
            labels[item.process],
            series_by_process[item.process],
            stages,
            drivers[(item.process, item.component)],
            readings_by_process[item.process],
            stepwise.get((item.process, item.component)),
            rises.get(item.process) if item.beside_warmup else None,
            hand_offs,
            host_windows.get(item.process) if item.component == "host" else None,
            heap_stages,
        )
        for item in growth
    ]
    report("projecting out-of-memory")
    devices = device_outlooks(tables, series_by_process, growth)
    first = next((device for device in devices if device.runs_out_first), None)
    cost = empty_cache_cost(tables)
    trims = cache_trim_cost(tables)
    batch_sizes = spans[sc.VISION_MAX_BATCH_SIZE].dropna() if len(spans) else pd.Series(dtype=float)
    advice = recommendations(verdicts, cost, devices, int(batch_sizes.max()) if len(batch_sizes) else None, trims)
    crashed = crashed_processes(data, tables)
    in_flight_requests = sum(1 for span in data.in_flight if stage_of(span) == sc.STAGE_REQUEST)
    summary = Summary(
        inputs=[dataclasses.asdict(item) for item in data.inputs],
        spans=len(spans) + len(data.in_flight),
        spans_ended=len(spans),
        requests=len(tables.requests) + in_flight_requests,
        requests_completed=len(tables.requests),
        processes=[
            {
                "process": info.label,
                "host": info.host,
                "pid": info.pid,
                "service": info.service,
                "journal": info.from_journal,
                "clean_end": info.clean_end if info.from_journal else None,
                "last_record_unix_nano": info.last_record_ns,
                "versions": info.versions,
            }
            for info in data.processes
        ],
        crashed=bool(crashed),
        in_flight=_in_flight(data),
        crash=_crash_summary(crashed),
        verdicts=verdicts,
        stages=_stage_rows(stages, labels),
        devices=[{**dataclasses.asdict(device), "headroom_bytes": device.headroom_bytes} for device in devices],
        requests_to_oom=first.requests_to_oom if first else None,
        seconds_to_oom=first.seconds_to_oom if first else None,
        empty_cache=cost.to_dict(),
        cache_trims=trims.to_dict(),
        heap_trims=heap_trim_cost(tables).to_dict(),
        recommendations=advice,
        snapshots=[dataclasses.asdict(snapshot) for snapshot in data.snapshots],
        problems=[dataclasses.asdict(problem) for problem in data.problems],
        dropped=dict(data.dropped),
        warnings=list(data.warnings),
    )
    return Analysis(data, tables, series_by_process, growth, stages, drivers, devices, cost, trims, crashed, summary)
