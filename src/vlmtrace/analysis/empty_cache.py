"""What the `torch.cuda.empty_cache()` workaround costs, read from the application's own timed calls.

vlmtrace times every call (span `torch.cuda.empty_cache`, stage `empty_cache`). The cost is the call
itself plus the slower request that follows, which has to get its memory from CUDA again.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from vlmtrace import semconv as sc
from vlmtrace.analysis.tables import Tables


@dataclasses.dataclass
class EmptyCacheCost:
    calls: int
    median_duration_s: float | None = None
    median_released_bytes: float | None = None
    latency_after_s: float | None = None
    latency_other_s: float | None = None

    @property
    def measured(self) -> bool:
        return self.calls > 0

    @property
    def latency_penalty_s(self) -> float | None:
        if self.latency_after_s is None or self.latency_other_s is None:
            return None
        return self.latency_after_s - self.latency_other_s


def _median(values: np.ndarray) -> float | None:
    values = values[np.isfinite(values)]
    return float(np.median(values)) if len(values) else None


def empty_cache_cost(tables: Tables) -> EmptyCacheCost:
    spans = tables.spans
    calls = spans[(spans["stage"] == sc.STAGE_EMPTY_CACHE) | (spans["name"] == sc.SPAN_EMPTY_CACHE)]
    if calls.empty:
        return EmptyCacheCost(0)
    released = -calls[sc.MEM_TORCH_RESERVED + sc.DELTA_SUFFIX].to_numpy()
    requests = tables.requests.sort_values("start_ns")
    cost = EmptyCacheCost(len(calls), _median(calls["duration_s"].to_numpy()), _median(released))
    if len(requests) >= 2:
        following = np.searchsorted(requests["start_ns"].to_numpy(), calls["end_ns"].to_numpy(), "left")
        following = np.unique(following[following < len(requests)])
        after = np.zeros(len(requests), dtype=bool)
        after[following] = True
        durations = requests["duration_s"].to_numpy()
        cost.latency_after_s = _median(durations[after])
        cost.latency_other_s = _median(durations[~after])
    return cost
