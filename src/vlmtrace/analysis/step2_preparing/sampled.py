"""Which readings are the background sampler's: a component read only every sampling interval charges
its changes to stages no finer than that interval (stages.py), and its settled levels come from the samples."""

from __future__ import annotations

import numpy as np
import pandas as pd

from vlmtrace import semconv as sc
from vlmtrace.analysis.rules import (
    MIN_SAMPLED_BOUNDARIES,
    RECORDED_READ_TIMES,
    STEPWISE_SHARE,
)
from vlmtrace.analysis.step2_preparing.tables import ORIGIN_SAMPLE

# Read by the background sampler (NVML, RSS); spans repeat the latest sample (docs/schema.md), so
# their settled levels come from the samples when the trace has them.
SAMPLED = ("native", "host")


def sampler_only(resource: dict) -> tuple[str, ...]:
    """The components a process read in the background sampler alone: NVML's always, RSS unless its
    resource says span boundaries read it too."""
    if resource.get(sc.RESOURCE_HOST_AT_BOUNDARIES) is True:
        return tuple(component for component in SAMPLED if component != "host")
    return SAMPLED


def sample_step(readings: pd.DataFrame, component: str, sampler_only: tuple[str, ...]) -> float | None:
    """The sampling interval (seconds) when the span readings of `component` are the background
    sampler's — then stage attribution is no finer than that; None when they are live.

    The components in `sampler_only` (`sampler_only`) are never read on the request path: in a trace
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
    if boundary.sum() < MIN_SAMPLED_BOUNDARIES:
        return None
    read_ns, t_ns = readings["read_ns"].to_numpy()[boundary], readings["t_ns"].to_numpy()[boundary]
    if step is not None and (read_ns != t_ns).mean() > RECORDED_READ_TIMES:  # read times recorded: vlmtrace's own probe
        if component in sampler_only:
            return step
        sample_reads = readings["read_ns"].to_numpy()[is_sample]
        # To the microsecond, as tables.py dedupes them: a start reading is end − delta in float64.
        return step if np.isin(read_ns // 1000, sample_reads // 1000).mean() >= STEPWISE_SHARE else None
    values = readings[component].to_numpy()[boundary]
    return step if component in SAMPLED and np.mean(np.diff(values) == 0) >= STEPWISE_SHARE else None
