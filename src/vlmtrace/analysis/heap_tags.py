"""The heap counter's large chunks by the stage that allocated them (heap_counter.c, in the sampler's
readings): how fast each stage's chunks still in use grew per request. A chunk is charged to the stage
whose work allocated it until it is freed, by whichever stage frees it, so a hand-off (one stage
allocates, another frees) leaves nothing behind and a leak stays with the stage that allocated it (the
stage follows the work into asyncio and uvloop tasks and executor jobs: probes/heap.py). Reported beside
the host verdict (`heap_allocated_by_stage`); naming.allocation_stage decides what they name
(docs/analysis.md, "Large chunks charged to the stage that allocated them")."""

from __future__ import annotations

import numpy as np
import pandas as pd

from vlmtrace import semconv as sc
from vlmtrace.analysis.column_keys import NO_SPAN
from vlmtrace.analysis.robust import theil_sen
from vlmtrace.analysis.settle import SettledSeries

# The stage names of the charges' positions (outside vlmtrace's spans: NO_SPAN, as the stage tables name it).
STAGES = tuple(stage or NO_SPAN for stage in sc.HEAP_STAGE_TAGS)
SHOWN = 5  # stages in the evidence, fastest-growing first
MIN_RATE = 1024  # bytes per request: below this, a stage's chunks did not grow (one buffer more at the end of a run)


def by_stage_samples(samples: pd.DataFrame, charges: list[tuple[int, list]]) -> pd.DataFrame:
    """The samples that carry the counter's charges by stage (`charges`: their rows in `samples`, with the
    bytes of each stage in sc.HEAP_STAGE_TAGS's order): `process`, `t_ns` and one column per stage. A list
    of another length or with other than numbers is left out. Empty where no process ran with the counter."""
    rows, values = [], []
    for row, charged in charges:
        if (isinstance(charged, list) and len(charged) == len(STAGES)
                and all(isinstance(value, (int, float)) for value in charged)):
            rows.append(row)
            values.append(charged)
    frame = samples.iloc[rows][["process", "t_ns"]].reset_index(drop=True) if rows else pd.DataFrame(columns=["process", "t_ns"])
    stages = pd.DataFrame(np.asarray(values, dtype=np.float64).reshape(len(values), len(STAGES)), columns=list(STAGES))
    return pd.concat([frame, stages], axis=1).sort_values(["process", "t_ns"], ignore_index=True)


def allocated_by_stage(samples: pd.DataFrame, series: SettledSeries) -> dict[str, float] | None:
    """Per stage whose chunks grew (MIN_RATE or more), the Theil–Sen slope (bytes per request) of its bytes
    still in use at the settled points, the latest sample before each; the SHOWN fastest. None without
    such samples."""
    if samples.empty:
        return None
    times = samples["t_ns"].to_numpy()
    rows = np.searchsorted(times, series.t_ns, side="right") - 1
    known = rows >= 0
    if known.sum() < 5:
        return None
    slopes = {}
    for stage in STAGES:
        fit = theil_sen(series.x[known], samples[stage].to_numpy()[rows[known]])
        if fit is not None and fit.slope >= MIN_RATE:
            slopes[stage] = float(fit.slope)
    return dict(sorted(slopes.items(), key=lambda item: -item[1])[:SHOWN])
