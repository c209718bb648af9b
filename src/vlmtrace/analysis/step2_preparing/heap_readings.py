"""The host heap counter's readings as tables (heap_counter.c, in the sampler's readings): the bytes of large
chunks in use by the stage that allocated them, at each sample, and per process the last reading of what
each stage kept by the interval it was allocated in."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from vlmtrace import semconv as sc
from vlmtrace.analysis.step1_loading.column_keys import NO_SPAN

# The stage names of the charges' positions (outside vlmtrace's spans: NO_SPAN, as the stage tables name it).
STAGES = tuple(stage or NO_SPAN for stage in sc.HEAP_STAGE_TAGS)


def by_stage_samples(samples: pd.DataFrame, charges: list[tuple[int, Any]]) -> pd.DataFrame:
    """The samples that carry the counter's charges by stage (`charges`: their rows in `samples`, with the
    bytes of each stage in sc.HEAP_STAGE_TAGS's order): `process`, `t_ns` and one column per stage. A list
    of another length or with other than numbers is left out. Empty where no process ran with the counter."""
    rows, values = [], []
    for row, charged in charges:
        if (
            isinstance(charged, list)
            and len(charged) == len(STAGES)
            and all(isinstance(value, (int, float)) for value in charged)
        ):
            rows.append(row)
            values.append(charged)
    frame = (
        samples.iloc[rows][["process", "t_ns"]].reset_index(drop=True)
        if rows
        else pd.DataFrame(columns=["process", "t_ns"])
    )
    stages = pd.DataFrame(np.asarray(values, dtype=np.float64).reshape(len(values), len(STAGES)), columns=list(STAGES))
    return pd.concat([frame, stages], axis=1).sort_values(["process", "t_ns"], ignore_index=True)


def latest_survivors(samples: pd.DataFrame, carried: list[tuple[int, dict]]) -> dict[int, tuple[int, dict]]:
    """Per process, the last sample's reading of what each stage kept (`carried`: rows of `samples` with it) and
    when it was read (unix ns). A reading of another shape is left out."""
    latest: dict[int, tuple[int, dict]] = {}
    for row, reading in carried:
        if not _well_formed(reading):
            continue
        process, t_ns = int(samples["process"].iat[row]), int(samples["t_ns"].iat[row])
        if process not in latest or t_ns >= latest[process][0]:
            latest[process] = (t_ns, reading)
    return latest


def _well_formed(reading: dict) -> bool:
    rows = reading.get("bytes")
    return (
        isinstance(reading.get("origin_ms"), int)
        and isinstance(reading.get("width_ms"), int)
        and reading["width_ms"] > 0
        and isinstance(rows, list)
        and len(rows) == len(sc.HEAP_STAGE_TAGS)
        and all(isinstance(row, list) and all(isinstance(value, (int, float)) for value in row) for row in rows)
    )
