"""What releasing memory costs, read from the spans that released it: the application's own
`torch.cuda.empty_cache()` calls and the cache guard's trims (torch's cache), and LMDeploy's own heap
trims (host memory), measured the same way.

vlmtrace times every application call (span `torch.cuda.empty_cache`, stage `empty_cache`), and the
cache guard records each trim (span `vlmtrace.cache.trim`, stage `cache.trim`). The cost is the call
itself plus the slower requests next to it: the first to start after it, which has to get its memory
from CUDA again, and the one it overlaps, whose work its device synchronisation and `cudaFree`s stall
(each 6–8 % slower than the same request without trimming on the H200, docs/gpu.md). Within one
trace only the first can be compared with the others: the guard trims as a heavy request's vision
stage ends, so the requests it overlaps are the heavy ones, slower anyway. The share of request time
measured here is therefore a lower bound (about half the trims' cost in that H200 run).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from vlmtrace import semconv as sc
from vlmtrace.analysis.rules import MIN_COMPARED_REQUESTS
from vlmtrace.analysis.step2_preparing.tables import Tables


@dataclasses.dataclass
class EmptyCacheCost:
    calls: int
    median_duration_s: float | None = None
    median_released_bytes: float | None = None
    latency_after_s: float | None = (
        None  # median of the first requests to start after a call (heap trims: in flight during one)
    )
    latency_other_s: float | None = None
    requests_after: int = 0
    requests_other: int = 0
    released_bytes: float | None = None  # summed over the calls

    @property
    def measured(self) -> bool:
        return self.calls > 0

    @property
    def latency_penalty_s(self) -> float | None:
        if self.latency_after_s is None or self.latency_other_s is None:
            return None
        return self.latency_after_s - self.latency_other_s

    @property
    def request_time_share(self) -> float | None:
        """What the requests after the calls lost, as a share of all requests' time: their share of all,
        times how much slower they were (medians). A lower bound: see the module's docstring."""
        if self.latency_penalty_s is None or self.latency_penalty_s <= 0 or not self.latency_other_s:
            return None  # no slower: nothing to count
        return (
            self.requests_after
            / (self.requests_after + self.requests_other)
            * self.latency_penalty_s
            / self.latency_other_s
        )

    def to_dict(self) -> dict:
        return {
            **dataclasses.asdict(self),
            "measured": self.measured,
            "latency_penalty_s": self.latency_penalty_s,
            "request_time_share": self.request_time_share,
        }


def _median(values: np.ndarray) -> float | None:
    values = values[np.isfinite(values)]
    return float(np.median(values)) if len(values) else None


def _release_cost(
    calls: pd.DataFrame, requests: pd.DataFrame, released_key: str = sc.MEM_TORCH_RESERVED, overlapped: bool = False
) -> EmptyCacheCost:
    """The cost of `calls`, spans that each released memory: their duration, the bytes their
    `released_key` reading (torch reserved; host RSS for LMDeploy's heap trims) dropped by, and the
    latency of the first request to start after each (`overlapped`: of the requests in flight during
    one) against the others' (where each side has MIN_COMPARED_REQUESTS)."""
    if calls.empty:
        return EmptyCacheCost(0)
    delta = released_key + sc.DELTA_SUFFIX
    released = -calls[delta].to_numpy() if delta in calls else np.full(len(calls), np.nan)
    finite = released[np.isfinite(released)]
    cost = EmptyCacheCost(
        len(calls),
        _median(calls["duration_s"].to_numpy()),
        _median(released),
        released_bytes=float(finite.sum()) if len(finite) else None,
    )
    requests = requests.sort_values("start_ns")
    if len(requests) >= 2:
        if overlapped:
            after = requests_overlapped(
                calls["start_ns"].to_numpy(),
                calls["end_ns"].to_numpy(),
                requests["start_ns"].to_numpy(),
                requests["end_ns"].to_numpy(),
            )
        else:
            after = requests_following(calls["end_ns"].to_numpy(), requests["start_ns"].to_numpy())
        durations = requests["duration_s"].to_numpy()
        if min(after.sum(), (~after).sum()) >= MIN_COMPARED_REQUESTS:
            cost.latency_after_s = _median(durations[after])
            cost.latency_other_s = _median(durations[~after])
            cost.requests_after, cost.requests_other = int(after.sum()), int((~after).sum())
    return cost


def requests_following(call_ends: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Per request (`starts` sorted): whether it is the first to start after a call ended."""
    after = np.zeros(len(starts), dtype=bool)
    following = np.searchsorted(starts, call_ends, "left")
    after[np.unique(following[following < len(starts)])] = True
    return after


def requests_overlapped(
    call_starts: np.ndarray, call_ends: np.ndarray, starts: np.ndarray, ends: np.ndarray
) -> np.ndarray:
    """Per request: whether a call ran while it did."""
    if len(call_starts) == 0:
        return np.zeros(len(starts), dtype=bool)
    order = np.argsort(call_starts, kind="stable")
    latest_end = np.maximum.accumulate(call_ends[order])  # of the calls started so far
    started = np.searchsorted(call_starts[order], ends, "left")  # calls that started before each request ended
    overlapped = started > 0
    overlapped[overlapped] = latest_end[started[overlapped] - 1] > starts[overlapped]
    return overlapped


def _spans_of(tables: Tables, stage: str, name: str) -> pd.DataFrame:
    spans = tables.spans
    return spans[(spans["stage"] == stage) | (spans["name"] == name)]


def empty_cache_cost(tables: Tables) -> EmptyCacheCost:
    """The application's own torch.cuda.empty_cache() calls."""
    return _release_cost(_spans_of(tables, sc.STAGE_EMPTY_CACHE, sc.SPAN_EMPTY_CACHE), tables.requests)


def cache_trims(tables: Tables) -> pd.DataFrame:
    """The cache guard's trims (trim_cache): their spans."""
    return _spans_of(tables, sc.STAGE_CACHE_TRIM, sc.SPAN_CACHE_TRIM)


def cache_trim_cost(tables: Tables) -> EmptyCacheCost:
    return _release_cost(cache_trims(tables), tables.requests)


def heap_trim_cost(tables: Tables) -> EmptyCacheCost:
    """LMDeploy's PyTorch engine trimming host memory (spans `lmdeploy.pytorch.heap_trim`): a full
    `gc.collect()` and `malloc_trim(0)` on the engine's thread every 128 multimodal sessions
    (`LMDEPLOY_MULTIMODAL_SESSION_TRIM_COUNT`), each stalling the engine, so the requests in flight
    during one are those it slows (`latency_after_s`); released: host RSS."""
    return _release_cost(
        _spans_of(tables, sc.STAGE_HEAP_TRIM, sc.SPAN_HEAP_TRIM), tables.requests, sc.MEM_HOST_RSS, overlapped=True
    )
