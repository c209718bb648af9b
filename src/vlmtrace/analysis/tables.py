"""The analysis tables: spans, requests and memory readings, with the four memory components derived.

Components (docs/analysis.md): `tensor` = torch allocated; `cache` = torch reserved − allocated;
`native` = NVML process memory − torch reserved (all of it when torch has no readings); `host` = RSS.
Readings come from journal samples and from every span's end (value) and start (value − delta).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from vlmtrace import semconv as sc
from vlmtrace.analysis.trace_data import MISSING_TIME, ProcessInfo, TraceData

COMPONENTS = ("tensor", "cache", "native", "host")
GPU_COMPONENTS = ("tensor", "cache", "native")
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
}
FEATURES = {
    "image_pixels": sc.REQUEST_IMAGE_PIXELS,
    "images": sc.REQUEST_IMAGES,
    "input_tokens": sc.GEN_AI_USAGE_INPUT_TOKENS,
    "output_tokens": sc.GEN_AI_USAGE_OUTPUT_TOKENS,
}
ORIGIN_SAMPLE, ORIGIN_SPAN_END, ORIGIN_SPAN_START = 0, 1, 2
ANCESTOR_DEPTH = 12


@dataclasses.dataclass
class Tables:
    spans: pd.DataFrame
    requests: pd.DataFrame
    readings: pd.DataFrame
    devices: pd.DataFrame
    processes: list[ProcessInfo]


def with_components(frame: pd.DataFrame) -> pd.DataFrame:
    """Add tensor / cache / native / host columns computed from the raw readings."""
    allocated = frame["allocated"].to_numpy()
    reserved = frame["reserved"].to_numpy()
    process = frame["gpu_process"].to_numpy()
    reported = frame["native_reported"].to_numpy()
    derived = np.where(np.isnan(reserved), process, process - reserved)
    frame["tensor"] = allocated
    frame["cache"] = reserved - allocated
    frame["native"] = np.where(np.isnan(reported), derived, reported)
    frame["host"] = frame["host_rss"].to_numpy()
    return frame


def _raw_frame(source: pd.DataFrame, times: np.ndarray, origin: int, subtract_delta: bool) -> pd.DataFrame:
    columns = {"process": source["process"].to_numpy(), "t_ns": times, "origin": np.full(len(source), origin, np.int8)}
    for key, short in RAW.items():
        values = source[key].to_numpy() if key in source else np.full(len(source), np.nan)
        if subtract_delta and key in sc.MEM_DELTA_KEYS:
            values = values - source[key + sc.DELTA_SUFFIX].to_numpy()
        columns[short] = values
    return pd.DataFrame(columns)


def _readings(spans: pd.DataFrame, samples: pd.DataFrame) -> pd.DataFrame:
    value_keys = [key for key in RAW if key in spans]
    has_memory = spans[value_keys].notna().any(axis=1).to_numpy() if len(spans) else np.zeros(0, bool)
    measured = spans.loc[has_memory]
    parts = [
        _raw_frame(samples, samples["t_ns"].to_numpy(), ORIGIN_SAMPLE, False),
        _raw_frame(measured, measured["end_ns"].to_numpy(), ORIGIN_SPAN_END, False),
        _raw_frame(measured, measured["start_ns"].to_numpy(), ORIGIN_SPAN_START, True),
    ]
    readings = pd.concat([part for part in parts if len(part)], ignore_index=True) if any(len(p) for p in parts) else parts[0]
    readings = readings[readings["t_ns"].to_numpy() != MISSING_TIME]
    readings = readings.sort_values(["process", "t_ns"], kind="stable", ignore_index=True)
    raw_columns = list(RAW.values())
    readings[raw_columns] = readings.groupby("process", sort=False)[raw_columns].ffill()
    return with_components(readings)


def nearest_request(spans: pd.DataFrame, is_request: np.ndarray) -> np.ndarray:
    """For each span, the row of its nearest enclosing request span by parentage (−1 if none)."""
    span_ids = spans["span_id"].to_numpy(dtype=object)
    parent_ids = spans["parent_id"].to_numpy(dtype=object)
    index = pd.Index(span_ids)
    if not index.is_unique:
        index = index.drop_duplicates()
        positions = pd.Series(np.arange(len(span_ids)), index=span_ids).groupby(level=0).first()
        parent = positions.reindex(parent_ids).to_numpy()
    else:
        parent = index.get_indexer(parent_ids).astype(np.float64)
        parent[parent < 0] = np.nan
    parent = np.where(np.isnan(parent), -1, parent).astype(np.int64)
    owner = np.where(is_request, np.arange(len(spans)), -1)
    current = parent
    for _ in range(ANCESTOR_DEPTH):
        unresolved = (owner < 0) & (current >= 0)
        if not unresolved.any():
            break
        hit = unresolved & is_request[np.maximum(current, 0)]
        owner[hit] = current[hit]
        current = np.where(unresolved & ~hit, parent[np.maximum(current, 0)], -1)
    return owner


def _requests(spans: pd.DataFrame, data: TraceData) -> tuple[pd.DataFrame, np.ndarray]:
    stage = spans["stage"]
    names = spans["name"].astype(str)
    is_request = (stage == sc.STAGE_REQUEST).to_numpy(dtype=bool) | (
        stage.isna().to_numpy() & names.str.startswith(sc.SPAN_REQUEST_OPERATION + " ").to_numpy(dtype=bool)
        & spans[sc.GEN_AI_USAGE_INPUT_TOKENS].notna().to_numpy()
    )
    owner = nearest_request(spans, is_request)
    requests = spans.loc[is_request, ["trace_id", "span_id", "name", "model", "process", "start_ns", "end_ns", "status"]].copy()
    for feature, key in FEATURES.items():
        requests[feature] = spans.loc[is_request, key].to_numpy()
    vision = (stage == sc.STAGE_VISION_PREPROCESS).to_numpy(dtype=bool) & (owner >= 0)
    if vision.any():
        by_request = pd.DataFrame(
            {"owner": owner[vision], "pixels": spans[sc.VISION_PIXELS].to_numpy()[vision], "images": spans[sc.VISION_IMAGES].to_numpy()[vision]}
        ).groupby("owner").sum(min_count=1)
        rows = requests.index.to_numpy()
        for feature, column in (("image_pixels", "pixels"), ("images", "images")):
            fallback = by_request[column].reindex(rows).to_numpy()
            requests[feature] = np.where(np.isnan(requests[feature].to_numpy()), fallback, requests[feature].to_numpy())
    requests["duration_s"] = (requests["end_ns"] - requests["start_ns"]) / 1e9
    valid = (requests["start_ns"] != MISSING_TIME) & (requests["end_ns"] != MISSING_TIME)
    return requests[valid].sort_values("end_ns", ignore_index=True), owner


def build_tables(data: TraceData) -> Tables:
    spans = data.spans.finish()
    samples = data.samples.finish()
    if len(data.inputs) > 1 and len(spans):
        before = len(spans)
        spans = spans.drop_duplicates(["trace_id", "span_id", "start_ns", "end_ns", "name"], ignore_index=True)
        if len(spans) < before:
            data.problem("(all inputs)", None, f"{before - len(spans)} spans appeared in more than one input; counted once", "note")
    untimed = int(((spans["start_ns"] == MISSING_TIME) | (spans["end_ns"] == MISSING_TIME)).sum()) if len(spans) else 0
    if untimed:
        data.problem("(all inputs)", None, f"{untimed} spans have no usable start or end time; left out of timelines", "note")
    spans["duration_s"] = np.where(
        (spans["start_ns"] != MISSING_TIME) & (spans["end_ns"] != MISSING_TIME),
        (spans["end_ns"] - spans["start_ns"]) / 1e9,
        np.nan,
    )
    requests, owner = _requests(spans, data)
    spans["request_row"] = owner
    devices = data.devices.finish()
    return Tables(spans, requests, _readings(spans, samples), devices, data.processes)
