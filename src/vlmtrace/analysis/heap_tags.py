"""The heap counter's large chunks by the stage that allocated them (heap_counter.c, in the sampler's
readings): how fast each stage's chunks still in use grew per request. A chunk is charged to the stage
whose work allocated it until it is freed, by whichever stage frees it, so a hand-off (one stage
allocates, another frees) leaves nothing behind and a leak stays with the stage that allocated it (on an
event loop with many requests in flight, approximately: the stage is a thread's, not a task's). Reported beside the host verdict (`heap_allocated_by_stage`); no rule names a stage by them yet:
they only veto a stage named against them until a matrix recorded with these readings decides more
(docs/analysis.md, "Large chunks charged to the stage that allocated them")."""

from __future__ import annotations

import numpy as np
import pandas as pd

from vlmtrace import semconv as sc
from vlmtrace.analysis.column_keys import NO_SPAN
from vlmtrace.analysis.robust import theil_sen
from vlmtrace.analysis.settle import SettledSeries

# The samples' columns, by stage name (outside vlmtrace's spans: NO_SPAN, as the stage tables name it).
STAGE_COLUMNS = {key: stage or NO_SPAN for key, stage in zip(sc.HEAP_BY_STAGE_KEYS, sc.HEAP_STAGE_TAGS)}
SHOWN = 5  # stages in the evidence, fastest-growing first
MIN_RATE = 1024  # bytes per request: below this, a stage's chunks did not grow (one buffer more at the end of a run)


def by_stage_samples(samples: pd.DataFrame) -> pd.DataFrame:
    """The samples that carry the counter's stage charges: `process`, `t_ns` and one column per stage
    (bytes; a stage the sample left out held none). Empty where no process ran with the counter."""
    keys = [key for key in STAGE_COLUMNS if key in samples]
    if not keys:
        return pd.DataFrame(columns=["process", "t_ns", *STAGE_COLUMNS.values()])
    read = samples[keys].notna().any(axis=1).to_numpy() & samples[sc.MEM_HOST_HEAP].notna().to_numpy()
    frame = samples.loc[read, ["process", "t_ns", *keys]].rename(columns=STAGE_COLUMNS)
    return frame.fillna(0.0).sort_values(["process", "t_ns"], ignore_index=True)


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
    for stage in STAGE_COLUMNS.values():
        if stage not in samples:
            continue
        fit = theil_sen(series.x[known], samples[stage].to_numpy()[rows[known]])
        if fit is not None and fit.slope >= MIN_RATE:
            slopes[stage] = float(fit.slope)
    return dict(sorted(slopes.items(), key=lambda item: -item[1])[:SHOWN])
