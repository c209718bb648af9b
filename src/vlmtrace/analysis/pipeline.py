"""From what was read to verdicts: runs the analysis steps in order and assembles the summary.

`analyze(data)`, for a TraceData the readers filled (step 1: step1_loading/ and readers/):

2. preparing (step2_preparing/): `build_tables` (spans, requests, readings with the memory components),
   then per process `settle` (the level each request leaves behind), `sample_step` (which components
   only the background sampler read, and how often) and `retained_by_stage` (each change charged to
   the stage whose work ran);
3. the verdict (step3_verdict/): per process and component `component_growth` (the slope, the
   explanations weighed, the class), `steady_stage_rise` beside a young process's warm-up,
   `feature_drivers`; then `component_verdict` on what those read (`ProcessEvidence`): the heap
   counter's charges, the stage named, the rate and `evidence["decision"]`;
4. the outlook (step4_outlook/): `device_outlooks` (requests until a device runs out), the cost of
   cache releases and heap trims (`empty_cache`), `crashed_processes`, and `recommendations`.

The rules every step applies are in rules.py."""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Callable

import numpy as np
import pandas as pd

from vlmtrace import semconv as sc
from vlmtrace.analysis import copied
from vlmtrace.analysis.crash import CrashedProcess, crashed_processes, stage_of
from vlmtrace.analysis.endings import process_endings
from vlmtrace.analysis.registry import BY_NAME
from vlmtrace.analysis.step1_loading.column_keys import MISSING_TIME
from vlmtrace.analysis.step2_preparing.sampled import SAMPLED, sample_step, sampler_only
from vlmtrace.analysis.step2_preparing.settle import SettledSeries, read_after, settle
from vlmtrace.analysis.step2_preparing.span_events import with_prompt_spans
from vlmtrace.analysis.step2_preparing.stages import HAND_OFF_COLUMNS, retained_by_stage
from vlmtrace.analysis.step2_preparing.tables import (
    COMPONENTS,
    ORIGIN_SAMPLE,
    Tables,
    build_tables,
)
from vlmtrace.analysis.step3_verdict.drivers import FeatureDriver, feature_drivers
from vlmtrace.analysis.step3_verdict.leaks import ComponentGrowth, component_growth
from vlmtrace.analysis.step3_verdict.naming import heap_places_host
from vlmtrace.analysis.step3_verdict.stage_rise import StageRise, steady_stage_rise
from vlmtrace.analysis.step3_verdict.verdict import ProcessEvidence, component_verdict
from vlmtrace.analysis.step4_outlook.allocation_sites import attach_sites
from vlmtrace.analysis.step4_outlook.empty_cache import (
    EmptyCacheCost,
    cache_trim_cost,
    empty_cache_cost,
    heap_trim_cost,
)
from vlmtrace.analysis.step4_outlook.projection import DeviceOutlook, device_outlooks
from vlmtrace.analysis.step4_outlook.recommend import recommendations
from vlmtrace.analysis.summary import Summary
from vlmtrace.analysis.trace_data import TraceData

Step = Callable[[str], None]


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


def _in_flight(data: TraceData) -> tuple[list[dict], int]:
    """The oldest IN_FLIGHT_LISTED spans in flight, their names and attributes bounded; and how many
    spans were left out."""
    oldest = heapq.nsmallest(copied.IN_FLIGHT_LISTED, data.in_flight, key=lambda s: s.start_ns or 0)
    listed = []
    for span in oldest:
        attributes, cut = copied.attributes(span.attributes)
        listed.append(
            {
                "name": copied.cut(span.name, copied.VALUE_CHARS),
                "trace_id": span.trace_id,
                "span_id": span.span_id,
                "parent_id": span.parent_id,
                "stage": stage_of(span),
                "process": data.processes[span.process].label,
                "start_unix_nano": span.start_ns,
                "thread": span.thread,
                "attributes": attributes,
                **({"attributes_cut": cut} if cut else {}),
            }
        )
    return listed, len(data.in_flight) - len(listed)


def _crash_summary(crashed: list[CrashedProcess]) -> list[dict] | None:
    if not crashed:
        return None
    result = []
    for item in crashed:
        samples = item.last_samples[["t_ns", "tensor", "cache", "native", "host", "gpu_used", "gpu_total"]].rename(
            columns={"t_ns": "t_unix_nano"}
        )
        result.append(
            {
                "process": item.process,
                "ended": item.ending,
                "last_record_unix_nano": item.last_record_ns,
                "chains": [
                    [
                        {
                            "name": copied.cut(s.name, copied.VALUE_CHARS),
                            "span_id": s.span_id,
                            "stage": stage_of(s),
                            "start_unix_nano": s.start_ns,
                        }
                        for s in chain
                    ]
                    for chain in item.chains
                ],
                "chain_counts": [group.count for group in item.chain_groups],
                "chain_groups_left_out": item.chain_groups_left_out,
                "linked_requests": item.linked_requests,
                "last_samples": samples.astype(object).where(samples.notna(), None).to_dict("records"),
                "fatal": [
                    {
                        "source": f.source,
                        "line": f.line,
                        "title": f.title,
                        "threads": f.threads,
                        "lines_left_out": f.lines_left_out,
                    }
                    for f in item.fatal
                ],
                "fatal_left_out": item.fatal_left_out,
            }
        )
    return result


def _stage_rows(stages: pd.DataFrame, labels: list[str]) -> tuple[list[dict], int]:
    """Per process and component, the copied.STAGES_LISTED stages that retained or gave back most, with
    their shares of what all its stages retained; and how many stages were left out."""
    if stages.empty:
        return [], 0
    retained = stages["retained_bytes"].clip(lower=0)  # shares of what was retained: a stage that gave back is < 0
    totals = retained.groupby([stages["process"], stages["component"]]).transform("sum")
    frame = stages.assign(
        share=(stages["retained_bytes"] / totals).where(totals > 0), size=stages["retained_bytes"].abs()
    )
    frame = frame.sort_values(["process", "component", "size"], ascending=[True, True, False])
    kept = frame.groupby(["process", "component"], sort=False).head(copied.STAGES_LISTED)
    kept = kept.sort_values(["process", "component", "retained_bytes"], ascending=[True, True, False])
    rows = [
        {
            "process": labels[row.process],
            "stage": copied.cut(row.stage, copied.VALUE_CHARS) if isinstance(row.stage, str) else row.stage,
            "component": row.component,
            "retained_bytes": row.retained_bytes,
            "share": row.share,
        }
        for row in kept.itertuples()
    ]
    return rows, len(frame) - len(kept)


def _rows_where(frame: pd.DataFrame, keep: np.ndarray) -> pd.DataFrame:
    """The rows where `keep` holds; the frame itself where that is all of them (a million spans' frame
    copied for nothing would add a few hundred MB to the report's peak)."""
    return frame if keep.all() else frame[keep]


def _by_process(readings: pd.DataFrame) -> dict[int, pd.DataFrame]:
    """Each process's readings, a slice of the table each: the table is sorted by process (tables._readings),
    and a slice shares its columns where a group-by would copy them all."""
    process = readings["process"].to_numpy()
    firsts = (
        np.flatnonzero(np.concatenate([[True], process[1:] != process[:-1]])) if len(process) else np.zeros(0, np.int64)
    )
    ends = np.append(firsts[1:], len(process))
    return {
        int(process[first]): readings.iloc[first:end].reset_index(drop=True)
        for first, end in zip(firsts, ends, strict=False)
    }


def _detail(resource: dict, spans: pd.DataFrame, process: int) -> dict | None:
    """How the process sampled its requests' stage detail, as its resource declares it (None: every request
    recorded it), and how many of its requests recorded none."""
    every, young = resource.get(sc.RESOURCE_DETAIL_EVERY), resource.get(sc.RESOURCE_DETAIL_YOUNG)
    if type(every) is not int or every <= 1:
        return None
    skipped = (spans["process"].to_numpy() == process) & (
        spans[sc.REQUEST_DETAIL_SKIPPED].to_numpy() == 1 if sc.REQUEST_DETAIL_SKIPPED in spans else False
    )
    return {
        "every": every,
        "young_requests": young if type(young) is int else None,
        "while_suspected": resource.get(sc.RESOURCE_DETAIL_WHILE_SUSPECTED) is True,
        "requests_without_detail": int(skipped.sum()),
    }


def analyze(data: TraceData, step: Step | None = None) -> Analysis:
    """Everything the report shows, computed from the traces alone."""
    report = step or (lambda _: None)
    report("building tables")
    tables = build_tables(data)
    labels = [info.label for info in data.processes]
    spans = tables.spans
    timed = _rows_where(
        spans, (spans["start_ns"] != MISSING_TIME).to_numpy() & (spans["end_ns"] != MISSING_TIME).to_numpy()
    )
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
        only_sampled = sampler_only(data.processes[process].resource)
        for component in COMPONENTS:
            interval = sample_step(readings, component, only_sampled)
            if interval is not None:
                stepwise[(process, component)] = interval
        mine = _rows_where(timed, timed["process"].to_numpy() == process)
        by_sampler = tuple(component for component in COMPONENTS if (process, component) in stepwise)
        prompt_ends = tables.prompt_ends[tables.prompt_ends["process"].to_numpy() == process]
        response_ends = tables.response_ends[tables.response_ends["process"].to_numpy() == process]
        # LMDeploy's host warm-up is the PyTorch engine's (TurboMind's is ~45 KiB per request, docs/gpu.md)
        young_host_warmup = data.processes[process].from_journal and not (
            (mine["name"] == sc.SPAN_TURBOMIND_STREAM).any() and not (mine["name"] == sc.SPAN_PYTORCH_FORWARD).any()
        )
        # Host charges per window are read by the stage rise (young processes) and by naming.sporadic (idle levels) only.
        host_windows_read = "host" not in by_sampler and (young_host_warmup or series.mode == "idle")
        by_heap = "host" not in by_sampler and heap_places_host(readings, series)
        charges = retained_by_stage(
            readings,
            with_prompt_spans(mine, prompt_ends, response_ends),
            COMPONENTS + (("heap",) if by_heap else ()),
            series.t_ns,
            by_sampler,
            keep_windows=("host",) if host_windows_read else (),
        )
        stage_frames.append(charges.retained.assign(process=process))
        hand_off_frames.append(charges.hand_offs.assign(process=process))
        if "host" in charges.per_window:
            host_windows[process] = charges.per_window["host"]
            rise = (
                steady_stage_rise(charges.per_window["host"], series.x, BY_NAME["host"].min_leak_rate)
                if young_host_warmup
                else None
            )
            if rise is not None:
                rises[process] = rise
        sampled = readings[readings["origin"].to_numpy() == ORIGIN_SAMPLE].reset_index(drop=True)
        sampled_series = settle(sampled, tables.requests)
        heap_trim_ends = mine["end_ns"].to_numpy()[(mine["name"] == sc.SPAN_HEAP_TRIM).to_numpy()]  # by category code
        for component in COMPONENTS:
            source, points = (
                (sampled, sampled_series) if component in SAMPLED and sampled_series else (readings, series)
            )
            levels = source[component].to_numpy()[points.rows]
            rise = rises.get(process) if component == "host" else None
            item = component_growth(
                process,
                component,
                levels,
                points,
                young_host_warmup,
                rise.fit if rise else None,
                np.interp(points.x, rise.x, rise.levels) if rise else None,
                read_after(points, heap_trim_ends) if len(heap_trim_ends) else None,
            )
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
    evidence = {
        process: ProcessEvidence(
            label=labels[process],
            series=series,
            readings=readings_by_process[process],
            requests=tables.requests[tables.requests["process"] == process],
            stages=stages[stages["process"] == process],
            hand_offs=hand_offs[hand_offs["process"] == process],
            heap_stages=heap_stages[heap_stages["process"] == process],
            host_windows=host_windows.get(process),
            heap_by_stage=tables.heap_by_stage[tables.heap_by_stage["process"] == process],
            survivors=tables.heap_survivors.get(process),
            rise=rises.get(process),
            sample_steps={component: step_s for (owner, component), step_s in stepwise.items() if owner == process},
            drivers={component: found for (owner, component), found in drivers.items() if owner == process},
            captures=[capture for capture in data.captures if capture.process == process],
        )
        for process, series in series_by_process.items()
    }
    read = [component_verdict(item, evidence[item.process]) for item in growth]
    verdicts = [verdict for verdict, _ in read]
    growth = [
        item for _, item in read
    ]  # as the verdicts read them: `vlmtrace diff` and the figures show the same slopes
    attach_sites(verdicts, data.captures, labels)
    report("projecting out-of-memory")
    devices = device_outlooks(tables, series_by_process, growth)
    first = next((device for device in devices if device.runs_out_first), None)
    cost = empty_cache_cost(tables)
    trims = cache_trim_cost(tables)
    batch_sizes = spans[sc.VISION_MAX_BATCH_SIZE].dropna() if len(spans) else pd.Series(dtype=float)
    advice = recommendations(verdicts, cost, devices, int(batch_sizes.max()) if len(batch_sizes) else None, trims)
    crashed = crashed_processes(data, tables)
    in_flight_requests = sum(1 for span in data.in_flight if stage_of(span) == sc.STAGE_REQUEST)
    in_flight, in_flight_left_out = _in_flight(data)
    stage_rows, stages_left_out = _stage_rows(stages, labels)
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
                "versions": copied.attributes(info.versions)[0],
                "detail": _detail(info.resource, spans, process),
            }
            for process, (info, ended) in enumerate(zip(data.processes, process_endings(data), strict=True))
        ],
        crashed=any(item.crashed for item in crashed),
        in_flight=in_flight,
        in_flight_left_out=in_flight_left_out,
        crash=_crash_summary(crashed),
        verdicts=verdicts,
        stages=stage_rows,
        stages_left_out=stages_left_out,
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
