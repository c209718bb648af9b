"""The analysis tables: spans, requests and memory readings, with the four memory components derived.

Components (docs/analysis.md): `tensor` = torch allocated; `cache` = torch reserved − allocated;
`native` = NVML process memory − torch reserved (all of it when torch has no readings); `host` = RSS.
Readings come from journal samples and from every span's end (value) and start (value − delta).
"""

from __future__ import annotations

import ctypes
import dataclasses

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from vlmtrace import semconv as sc
from vlmtrace.analysis import registry
from vlmtrace.analysis.step1_loading.column_keys import FEATURE_KEYS, MISSING_TIME, SPAN_MEMORY_KEYS
from vlmtrace.analysis.step1_loading.span_features import SpanFeatures
from vlmtrace.analysis.step2_preparing.heap_readings import by_stage_samples, latest_survivors
from vlmtrace.analysis.trace_data import ProcessInfo, TraceData

COMPONENTS = tuple(component.name for component in registry.COMPONENTS)
# Short names for the raw readings in the readings table.
RAW = {
    sc.MEM_TORCH_ALLOCATED: "allocated",
    sc.MEM_TORCH_RESERVED: "reserved",
    sc.MEM_TORCH_INACTIVE_SPLIT: "inactive_split",
    sc.MEM_TORCH_ALLOC_RETRIES: "alloc_retries",
    sc.MEM_TORCH_OOMS: "ooms",
    sc.MEM_GPU_PROCESS: "gpu_process",
    sc.MEM_GPU_USED: "gpu_used",
    sc.MEM_GPU_TOTAL: "gpu_total",
    sc.MEM_NATIVE: "native_reported",
    sc.MEM_HOST_RSS: "host_rss",
    sc.MEM_HOST_HEAP: "heap",  # NaN throughout where the process ran without the heap counter
    sc.MEM_READ_TIME: "read_ns",
}
# Raw readings used only to make the components (`allocated` is `tensor`, `host_rss` is `host`) and the
# read time (a column of its own): not columns of the readings table.
RAW_NOT_KEPT = frozenset({"allocated", "native_reported", "host_rss", "read_ns"})
FEATURES = {
    "image_pixels": sc.REQUEST_IMAGE_PIXELS,
    "images": sc.REQUEST_IMAGES,
    "input_tokens": sc.GEN_AI_USAGE_INPUT_TOKENS,
    "output_tokens": sc.GEN_AI_USAGE_OUTPUT_TOKENS,
}
ORIGIN_SAMPLE, ORIGIN_SPAN_END, ORIGIN_SPAN_START, ORIGIN_PROMPT_END, ORIGIN_RESPONSE_END = 0, 1, 2, 3, 4
# The memory readings and input features of spans that the analysis reads from `Tables.spans` (stages:
# read times and the requests without stage detail; empty_cache and heap trims: what a call released; the
# batch-size advice); the others are in `readings`
# and `requests` and are not kept twice (at a million spans, 30 columns of 8 MB).
SPAN_KEPT = frozenset(
    {
        sc.MEM_READ_TIME,
        sc.MEM_READ_TIME + sc.DELTA_SUFFIX,
        sc.MEM_TORCH_RESERVED + sc.DELTA_SUFFIX,
        sc.VISION_MAX_BATCH_SIZE,
        sc.MEM_HOST_RSS + sc.DELTA_SUFFIX,  # what LMDeploy's heap trims released
        sc.REQUEST_DETAIL_SKIPPED,  # the requests the stage attribution reads as one stage of their own
    }
)
ANCESTOR_DEPTH = 12


@dataclasses.dataclass
class Tables:
    spans: pd.DataFrame
    requests: pd.DataFrame
    readings: pd.DataFrame
    devices: pd.DataFrame
    processes: list[ProcessInfo]
    prompt_ends: pd.DataFrame  # requests that recorded where their prompt processing ended (_prompt_ends)
    response_ends: pd.DataFrame  # requests that recorded a reading at their last output (_response_ends)
    heap_by_stage: pd.DataFrame  # the heap counter's large chunks by allocating stage, as sampled (heap_tags.py)
    # By process: when it was read (unix ns) and the last reading of what each stage kept by when (survivors.py).
    heap_survivors: dict[int, tuple[int, dict]] = dataclasses.field(default_factory=dict)


def derive_components(raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """tensor / cache / native / host from the raw readings."""
    allocated, reserved = raw["allocated"], raw["reserved"]
    process, reported = raw["gpu_process"], raw["native_reported"]
    derived = np.where(np.isnan(reserved), process, process - reserved)
    return {
        "tensor": allocated,
        "cache": reserved - allocated,
        "native": np.where(np.isnan(reported), derived, reported),
        "host": raw["host_rss"],
    }


def _carry_forward(values: np.ndarray, group_starts: np.ndarray) -> np.ndarray:
    """Each NaN replaced by the last value before it in the same group (rows sorted by group)."""
    if not np.isnan(values).any():
        return values
    index = np.where(np.isnan(values), 0, np.arange(len(values)))
    index[group_starts] = np.where(np.isnan(values[group_starts]), group_starts, index[group_starts])
    last = np.maximum.accumulate(index)
    filled = values[last]
    crossed = last < np.repeat(group_starts, np.diff(np.append(group_starts, len(values))))
    filled[crossed] = np.nan
    return filled


def _prompt_ends(spans: pd.DataFrame, features: SpanFeatures) -> pd.DataFrame:
    """Request spans that carry the reading taken where prompt processing ended (sc.PROMPT_END_KEYS),
    as rows with that reading under the plain memory keys and `prompt_end_ns` (docs/analysis.md)."""
    timed = features.rows(sc.REQUEST_PREPROCESS_DURATION)
    duration = features.at(sc.REQUEST_PREPROCESS_DURATION, timed)
    # any of the reading's keys: torch's only where torch is read
    read = np.isfinite(np.column_stack([features.at(key, timed) for key in sc.PROMPT_END_KEYS.values()])).any(axis=1)
    kept = read & np.isfinite(duration)
    rows = timed[kept]
    starts = spans["start_ns"].to_numpy()[rows]
    ends = starts + (duration[kept] * 1e9).astype(np.int64)
    return pd.DataFrame(
        {
            **_under_plain_keys(features, rows, sc.PROMPT_END_KEYS),
            "process": spans["process"].to_numpy()[rows],
            "start_ns": starts,
            "prompt_end_ns": ends,
            "span_id": spans["span_id"].to_numpy()[rows],
        }
    )


def _response_ends(spans: pd.DataFrame, features: SpanFeatures) -> pd.DataFrame:
    """Ended request spans that carry the reading taken at their last output (sc.RESPONSE_END_KEYS), as
    rows with that reading under the plain memory keys and `response_end_ns` (its read time)."""
    read_key = sc.RESPONSE_END_KEYS[sc.MEM_READ_TIME]
    read_rows = features.rows(read_key)
    read_at = features.at(read_key, read_rows)
    kept = np.isfinite(read_at) & (spans["end_ns"].to_numpy()[read_rows] != MISSING_TIME)
    rows = read_rows[kept]
    return pd.DataFrame(
        {
            **_under_plain_keys(features, rows, sc.RESPONSE_END_KEYS),
            "process": spans["process"].to_numpy()[rows],
            "response_end_ns": read_at[kept].astype(np.int64),
            "span_id": spans["span_id"].to_numpy()[rows],
        }
    )


def _under_plain_keys(features: SpanFeatures, rows: np.ndarray, names: dict[str, str]) -> dict[str, np.ndarray]:
    """The columns of one moment's reading (sc.PROMPT_END_KEYS, sc.RESPONSE_END_KEYS) under the plain memory keys."""
    return {key: features.at(name, rows) for key, name in names.items()}


def _readings(
    spans: pd.DataFrame, samples: pd.DataFrame, prompt_ends: pd.DataFrame, response_ends: pd.DataFrame
) -> pd.DataFrame:
    """Every reading, per process in time order: samples, span ends, span starts (end − delta),
    prompt-processing ends and requests' last outputs. `read_ns` is when the values were read (a reading reused by a later
    boundary keeps its first time); `fresh` marks the first row of each reading."""
    value_keys = [key for key in RAW if key in spans and key != sc.MEM_READ_TIME]
    has_memory = np.isfinite(spans[value_keys].to_numpy()).any(axis=1) if len(spans) else np.zeros(0, bool)
    measured = spans.loc[has_memory]
    sources = (
        (samples, samples["t_ns"], ORIGIN_SAMPLE),
        (measured, measured["end_ns"], ORIGIN_SPAN_END),
        (measured, measured["start_ns"], ORIGIN_SPAN_START),
        (prompt_ends, prompt_ends["prompt_end_ns"], ORIGIN_PROMPT_END),
        (response_ends, response_ends["response_end_ns"], ORIGIN_RESPONSE_END),
    )
    times = np.concatenate([column.to_numpy() for _, column, _ in sources])
    process = np.concatenate([frame["process"].to_numpy() for frame, _, _ in sources])
    origin = np.concatenate([np.full(len(frame), code, np.int8) for frame, _, code in sources])
    keep = np.flatnonzero(times != MISSING_TIME)
    single = len(process) == 0 or bool((process == process[0]).all())
    # Stable sorts by time: each source is nearly in time order already, so timsort merges a few runs.
    order = keep[np.argsort(times[keep], kind="stable") if single else np.lexsort((times[keep], process[keep]))]
    process = process[order]
    group_starts = (
        np.flatnonzero(np.concatenate([[True], process[1:] != process[:-1]])) if len(order) else np.zeros(0, np.int64)
    )
    # The read time is an int64 column of its own (ns since the epoch do not fit float64 exactly): not in
    # the float block, where the float column it replaced would stay allocated. The raw readings that are
    # components as they are, or only make one, are not kept beside it (2.15 M readings: 17 MB a column).
    names = [short for short in RAW.values() if short not in RAW_NOT_KEPT] + list(COMPONENTS)
    block = np.empty((len(order), len(names)), order="F")  # one block, a column at a time: no copy into pandas
    raw = {}
    for key, short in RAW.items():
        parts = []
        for frame, _, code in sources:
            values = frame[key].to_numpy() if key in frame else np.full(len(frame), np.nan)
            if code == ORIGIN_SPAN_START and key != sc.MEM_GPU_TOTAL:
                delta = key + sc.DELTA_SUFFIX
                values = values - frame[delta].to_numpy() if delta in frame else np.full(len(frame), np.nan)
            parts.append(values)
        values = np.concatenate(parts)[order]
        if key == sc.MEM_READ_TIME:
            raw[short] = values
        elif short in RAW_NOT_KEPT:
            raw[short] = _carry_forward(values, group_starts)
        else:
            position = names.index(short)
            block[:, position] = _carry_forward(values, group_starts)
            raw[short] = block[:, position]
    for component, values in derive_components(raw).items():
        block[:, names.index(component)] = values
    readings = pd.DataFrame(block, columns=names, copy=False)
    read_ns = times[order].copy()
    recorded = np.isfinite(raw["read_ns"])
    read_ns[recorded] = raw["read_ns"][recorded].astype(np.int64)
    readings.insert(list(RAW.values()).index("read_ns"), "read_ns", read_ns)
    # Within a microsecond: a start reading is rebuilt as end − delta in float64, a few hundred ns off.
    reading = pd.Series(read_ns // 1000) if single else pd.DataFrame({"p": process, "r": read_ns // 1000})
    readings["fresh"] = ~reading.duplicated().to_numpy()
    readings.insert(0, "origin", origin[order])
    readings.insert(0, "t_ns", times[order])
    readings.insert(0, "process", process)
    return readings


def rows_of(spans: pd.DataFrame, ids: pd.Series) -> np.ndarray:
    """The row of the span with each id (−1: none of these spans), from factorised ids: a million spans'
    ids stay Arrow strings, never Python objects."""
    count = len(spans)
    codes, _ = pd.factorize(pd.concat([spans["span_id"], ids], ignore_index=True), use_na_sentinel=True)
    row_of_code = np.full(codes.max() + 2 if len(codes) else 1, -1, dtype=np.int64)
    row_of_code[codes[:count][::-1]] = np.arange(count)[::-1]
    wanted = codes[count:]
    return np.where(wanted >= 0, row_of_code[wanted], -1)


def nearest_request(spans: pd.DataFrame, is_request: np.ndarray) -> np.ndarray:
    """For each span, the row of its nearest enclosing request span by parentage (−1 if none)."""
    count = len(spans)
    parent = rows_of(spans, spans["parent_id"])
    owner = np.where(is_request, np.arange(count), -1)
    current = parent
    for _ in range(ANCESTOR_DEPTH):
        unresolved = (owner < 0) & (current >= 0)
        if not unresolved.any():
            break
        hit = unresolved & is_request[np.maximum(current, 0)]
        owner[hit] = current[hit]
        current = np.where(unresolved & ~hit, parent[np.maximum(current, 0)], -1)
    return owner


def _requests(spans: pd.DataFrame, features: SpanFeatures) -> pd.DataFrame:
    stage = spans["stage"]
    is_request = (stage == sc.STAGE_REQUEST).to_numpy(dtype=bool)
    if not is_request.any():
        named = spans["name"].astype(str).str.startswith(sc.SPAN_REQUEST_OPERATION + " ").to_numpy(dtype=bool)
        tokens = np.zeros(len(spans), dtype=bool)
        tokens[features.rows(sc.GEN_AI_USAGE_INPUT_TOKENS)] = True
        is_request = named & stage.isna().to_numpy() & tokens
    requests = spans.loc[is_request, ["trace_id", "span_id", "name", "process", "start_ns", "end_ns", "status"]].copy()
    request_rows = np.flatnonzero(is_request)
    for feature, key in FEATURES.items():
        requests[feature] = features.at(key, request_rows)
    vision = (stage == sc.STAGE_VISION_PREPROCESS).to_numpy(dtype=bool)
    if vision.any() and requests["image_pixels"].isna().all():
        owner = nearest_request(spans, is_request)
        vision_rows = np.flatnonzero(vision & (owner >= 0))
        by_request = (
            pd.DataFrame(
                {
                    "owner": owner[vision_rows],
                    "pixels": features.at(sc.VISION_PIXELS, vision_rows),
                    "images": features.at(sc.VISION_IMAGES, vision_rows),
                }
            )
            .groupby("owner")
            .sum(min_count=1)
        )
        rows = requests.index.to_numpy()
        requests["image_pixels"] = by_request["pixels"].reindex(rows).to_numpy()
        requests["images"] = requests["images"].fillna(
            pd.Series(by_request["images"].reindex(rows).to_numpy(), index=requests.index)
        )
    requests["duration_s"] = (requests["end_ns"] - requests["start_ns"]) / 1e9
    valid = (requests["start_ns"] != MISSING_TIME) & (requests["end_ns"] != MISSING_TIME)
    return requests[valid].sort_values("end_ns", ignore_index=True)


def build_tables(data: TraceData) -> Tables:
    spans = data.spans.finish()
    features = data.spans.take_features()
    samples = data.samples.finish()
    give_back_freed_memory()  # the readers' blocks, copied into the frames
    # Several inputs may hold the same spans (a journal and an OTLP copy); a span id seen once everywhere
    # rules that out at a fraction of the cost of comparing five columns (a million spans in rotated files).
    if (
        len(data.inputs) > 1
        and len(spans)
        and pc.count_distinct(pa.array(spans["span_id"]), mode="all").as_py() < len(spans)
    ):
        repeated = spans.duplicated(["trace_id", "span_id", "start_ns", "end_ns", "name"]).to_numpy()
        if repeated.any():
            spans = spans[~repeated].reset_index(drop=True)
            features = features.kept(~repeated)
            data.problem(
                "(all inputs)",
                None,
                f"{int(repeated.sum())} spans appeared in more than one input; counted once",
                "note",
            )
    untimed = int(((spans["start_ns"] == MISSING_TIME) | (spans["end_ns"] == MISSING_TIME)).sum()) if len(spans) else 0
    if untimed:
        data.problem(
            "(all inputs)", None, f"{untimed} spans have no usable start or end time; left out of timelines", "note"
        )
    spans["duration_s"] = np.where(
        (spans["start_ns"] != MISSING_TIME) & (spans["end_ns"] != MISSING_TIME),
        (spans["end_ns"] - spans["start_ns"]) / 1e9,
        np.nan,
    )
    requests = _requests(spans, features)
    devices = data.devices.finish()
    prompt_ends, response_ends = _prompt_ends(spans, features), _response_ends(spans, features)
    for key in SPAN_KEPT.intersection(FEATURE_KEYS):  # the others are in `requests` now
        if key != sc.REQUEST_DETAIL_SKIPPED or len(features.rows(key)):  # that one only where detail was sampled
            spans[key] = features.dense(key, len(spans))
    del features
    readings = _readings(spans, samples, prompt_ends, response_ends)
    # In `readings` now. The few kept get arrays of their own: as views they would hold the whole float block.
    for key in SPAN_KEPT.intersection(SPAN_MEMORY_KEYS):
        spans[key] = spans[key].to_numpy().copy()
    spans = spans.drop(columns=[key for key in SPAN_MEMORY_KEYS if key not in SPAN_KEPT])
    give_back_freed_memory()
    return Tables(
        spans,
        requests,
        readings,
        devices,
        data.processes,
        prompt_ends,
        response_ends,
        by_stage_samples(samples, data.samples.carried(sc.MEM_HOST_HEAP_BY_STAGE)),
        latest_survivors(samples, data.samples.carried(sc.MEM_HOST_HEAP_SURVIVORS)),
    )


def give_back_freed_memory() -> None:
    """Hand the memory freed so far (the readers' blocks, the temporaries) back to the system. glibc
    keeps freed blocks of a few MB in its heap, where the analysis after could not always reuse them:
    at a million spans, a few hundred MB of the peak (docs/performance.md)."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return
    trim(0)
