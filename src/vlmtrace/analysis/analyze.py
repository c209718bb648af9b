"""From what was read to verdicts: runs every analysis step and assembles the summary."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pandas as pd

from vlmtrace import semconv as sc
from vlmtrace.analysis.column_keys import MISSING_TIME
from vlmtrace.analysis.crash import CrashedProcess, crashed_processes, process_endings, stage_of
from vlmtrace.analysis.drivers import FeatureDriver, feature_drivers
from vlmtrace.analysis.empty_cache import (
    EmptyCacheCost,
    cache_trim_cost,
    empty_cache_cost,
    heap_trim_cost,
)
from vlmtrace.analysis.heap_tags import (
    allocated_by_stage,
    allocated_where,
    at_settled_points,
    filling,
    from_allocations,
    grew_once,
    kept_rising,
)
from vlmtrace.analysis.leaks import ComponentGrowth, component_growth
from vlmtrace.analysis.naming import heap_places_host, verdict_stage
from vlmtrace.analysis.projection import DeviceOutlook, device_outlooks
from vlmtrace.analysis.recommend import recommendations
from vlmtrace.analysis.registry import BY_NAME, INCONCLUSIVE
from vlmtrace.analysis.robust import theil_sen
from vlmtrace.analysis.settle import SettledSeries, read_after, settle
from vlmtrace.analysis.span_events import with_prompt_spans
from vlmtrace.analysis.stage_rise import StageRise, steady_stage_rise
from vlmtrace.analysis.stages import HAND_OFF_COLUMNS, retained_by_stage
from vlmtrace.analysis.summary import Summary, Verdict
from vlmtrace.analysis.survivors import (
    kept_by_stage,
    rate_kept,
    read_from_survivors,
    slope_reason,
    survived,
    with_kept_rates,
)
from vlmtrace.analysis.tables import COMPONENTS, ORIGIN_SAMPLE, Tables, build_tables
from vlmtrace.analysis.trace_data import TraceData
from vlmtrace.analysis.units import format_bytes

Step = Callable[[str], None]
# Read by the background sampler (NVML, RSS); spans repeat the latest sample (docs/schema.md), so
# their settled levels come from the samples when the trace has them.
SAMPLED = ("native", "host")
STEPWISE_SHARE = 0.8  # span readings repeating the previous one this often change only with the samples


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
    heap_by_stage: pd.DataFrame | None = None,
    survivors: tuple[int, dict] | None = None,
    requests: pd.DataFrame | None = None,
) -> tuple[Verdict, ComponentGrowth]:
    """The verdict, and the growth it reads (the heap's allocations may have read it again: heap_tags.from_allocations).
    `hand_offs`: HAND_OFF_COLUMNS of every process (stages.py); `windows`: host bytes charged per stage in
    each window between settled points (stages.py); `heap_stages`: the heap counter's retained bytes per
    stage, of the processes where it places host growth (naming.heap_places_host); `heap_by_stage`: the
    process's samples of its large heap chunks in use by allocating stage (heap_tags.py), for host verdicts;
    `survivors`: the process's last reading of what each stage kept by when it was allocated, and `requests` the
    process's requests (survivors.py)."""
    charges = at_settled_points(heap_by_stage, series) if heap_by_stage is not None else None
    if charges is not None:
        charges = with_kept_rates(charges, heap_by_stage, survivors, requests)
    allocated = allocated_by_stage(charges) if charges is not None else None
    mine = stages[(stages["process"] == growth.process) & (stages["component"] == growth.component)]
    mine = mine.sort_values("retained_bytes", ascending=False)
    stage, stage_evidence = verdict_stage(growth, mine, step_s, rise, hand_offs[hand_offs["process"] == growth.process], series, windows,
                                          heap_stages[heap_stages["process"] == growth.process] if heap_stages is not None else None,
                                          allocated)
    allocating = stage_evidence.get("allocating_stage")
    leaking = allocating or stage  # whose chunks still in use are read by when they were allocated
    kept = (kept_by_stage(heap_by_stage, leaking, survivors, requests)
            if charges is not None and survivors is not None and requests is not None else None)
    rising = kept_rising(growth, charges, allocating) if charges is not None else None
    lasted = survived(growth, kept, allocated_where(leaking)) if rising is None and kept is not None else None
    if rising is not None or lasted is not None:
        growth = dataclasses.replace(growth, klass=BY_NAME[growth.component].leak_class, plateau=False,
                                     plateau_reason=None, inconclusive_reason=None)
    settling = (filling(growth, charges, allocating)
                or grew_once(growth, charges, readings.loc[readings["origin"].to_numpy() == ORIGIN_SAMPLE, ["t_ns", "heap"]])
                if charges is not None and lasted is None else None)
    if settling is not None:
        growth = dataclasses.replace(growth, klass=INCONCLUSIVE, inconclusive_reason=settling)
    read = (from_allocations(growth, charges, allocating, readings["heap"].to_numpy()[series.rows])
            if charges is not None and lasted is None else None)
    kept_rate = rate_kept(growth, kept) if read is None and lasted is None else None
    evidence = {
        "points": growth.points,
        "settled_levels": series.mode,
        "growth_bytes": growth.growth_bytes,
        "noise_bytes": growth.per_request.noise,
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
    if rising is not None and growth.grows:
        evidence["class_from_allocations"] = rising
    if lasted is not None or kept_rate is not None:
        if lasted is not None:  # its words give the rate too
            evidence["class_from_survivors"] = lasted
        else:
            evidence["slope_from_survivors"] = slope_reason(kept, allocated_where(leaking), growth.per_request.slope)
        evidence["resident_slope_bytes_per_request"] = growth.per_request.slope
        evidence["survivors_stage"] = leaking
        growth = read_from_survivors(growth, kept)
    elif read is not None:
        evidence["resident_slope_bytes_per_request"] = growth.per_request.slope
        evidence["slope_from_allocations"] = (
            f"the rate is that of the large heap chunks allocated {allocated_where(allocating)} "
            f"and still in use, which are what the heap grew by; resident memory grew "
            f"{format_bytes(growth.per_request.slope, signed=True)} per request, with the work in flight at each reading")
        growth = read
    elif growth.trims:
        evidence["slope_from_trims"] = (
            f"the heap was trimmed {growth.trims} {'time' if growth.trims == 1 else 'times'}: the rate is what "
            f"{'its first level and the lowest level after the trim' if growth.trims == 1 else 'the lowest levels after the trims'} "
            "kept, not the rise between them, which the next trim gives back")
    if growth.component == "host" and allocated is not None:
        evidence["heap_allocated_by_stage"] = allocated
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
        process=label,
        plateau=growth.plateau,
        evidence=evidence,
    )
    return verdict, growth


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
                "ended": item.ending,
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


def _rows_where(frame: pd.DataFrame, keep: np.ndarray) -> pd.DataFrame:
    """The rows where `keep` holds; the frame itself where that is all of them (a million spans' frame
    copied for nothing would add a few hundred MB to the report's peak)."""
    return frame if keep.all() else frame[keep]


def _by_process(readings: pd.DataFrame) -> dict[int, pd.DataFrame]:
    """Each process's readings, a slice of the table each: the table is sorted by process (tables._readings),
    and a slice shares its columns where a group-by would copy them all."""
    process = readings["process"].to_numpy()
    firsts = np.flatnonzero(np.concatenate([[True], process[1:] != process[:-1]])) if len(process) else np.zeros(0, np.int64)
    ends = np.append(firsts[1:], len(process))
    return {int(process[first]): readings.iloc[first:end].reset_index(drop=True) for first, end in zip(firsts, ends)}


def analyze(data: TraceData, step: Step | None = None) -> Analysis:
    """Everything the report shows, computed from the traces alone."""
    report = step or (lambda _: None)
    report("building tables")
    tables = build_tables(data)
    labels = [info.label for info in data.processes]
    spans = tables.spans
    timed = _rows_where(spans, (spans["start_ns"] != MISSING_TIME).to_numpy() & (spans["end_ns"] != MISSING_TIME).to_numpy())
    series_by_process: dict[int, SettledSeries] = {}
    growth: list[ComponentGrowth] = []
    stage_frames = []
    drivers: dict[tuple[int, str], list[FeatureDriver]] = {}
    readings_by_process = _by_process(tables.readings)
    report("fitting growth per component")
    stepwise: dict[tuple[int, str], float] = {}
    rises: dict[int, StageRise] = {}  # host growth beside a young process's warm-up, per process
    host_windows: dict[int, pd.DataFrame] = {}  # host bytes charged per stage in each window between settled points
    hand_off_frames = [pd.DataFrame(columns=[*HAND_OFF_COLUMNS, "process"])]
    for process, readings in readings_by_process.items():
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
        mine = _rows_where(timed, timed["process"].to_numpy() == process)
        by_sampler = tuple(component for component in COMPONENTS if (process, component) in stepwise)
        prompt_ends = tables.prompt_ends[tables.prompt_ends["process"].to_numpy() == process]
        response_ends = tables.response_ends[tables.response_ends["process"].to_numpy() == process]
        # LMDeploy's host warm-up is the PyTorch engine's (TurboMind's is ~45 KiB per request, docs/gpu-runs.md)
        young_host_warmup = data.processes[process].from_journal and not (
            (mine["name"] == sc.SPAN_TURBOMIND_STREAM).any() and not (mine["name"] == sc.SPAN_PYTORCH_FORWARD).any())
        # Host charges per window are read by the stage rise (young processes) and by naming.sporadic (idle levels) only.
        host_windows_read = "host" not in by_sampler and (young_host_warmup or series.mode == "idle")
        by_heap = "host" not in by_sampler and heap_places_host(readings, series)
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
        heap_trim_ends = mine["end_ns"].to_numpy()[(mine["name"] == sc.SPAN_HEAP_TRIM).to_numpy()]  # by category code
        for component in COMPONENTS:
            source, points = (sampled, sampled_series) if component in SAMPLED and sampled_series else (readings, series)
            levels = source[component].to_numpy()[points.rows]
            rise = rises.get(process) if component == "host" else None
            item = component_growth(process, component, levels, points, young_host_warmup, rise.fit if rise else None,
                                    np.interp(points.x, rise.x, rise.levels) if rise else None,
                                    read_after(points, heap_trim_ends) if len(heap_trim_ends) else None)
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
    heap_stages = stages[stages["component"] == "heap"]  # the host verdicts' second witness only (naming.host_stage)
    stages = stages[stages["component"] != "heap"].reset_index(drop=True)
    read = [
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
            tables.heap_by_stage[tables.heap_by_stage["process"] == item.process] if item.component == "host" else None,
            tables.heap_survivors.get(item.process) if item.component == "host" else None,
            tables.requests[tables.requests["process"] == item.process],
        )
        for item in growth
    ]
    verdicts = [verdict for verdict, _ in read]
    growth = [item for _, item in read]  # as the verdicts read them: `vlmtrace diff` and the figures show the same slopes
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
                "ended": ended,
                "last_record_unix_nano": info.last_record_ns,
                "versions": info.versions,
            }
            for info, ended in zip(data.processes, process_endings(data))
        ],
        crashed=any(item.crashed for item in crashed),
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
