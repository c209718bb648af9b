"""What each stage kept, by when it was allocated: the heap counter's large chunks still in use at its last
reading, by the stage that allocated them and by the interval they were allocated in (heap_counter.c,
`vlmtrace.mem.host.heap.survivors`). A chunk that is still there long after it was made is what its stage
kept; what a stage holds at one moment also holds the work in flight and a working set not given back yet.
So where resident memory and the chunks' levels could not tell a leak from warm-up under load, what each
part of the run left behind can: a leak leaves the same share of every part, a cache that drops its oldest
entries leaves nothing of the early parts, warm-up and a cache filling towards its bound nothing of the late
ones, a buffer kept once one interval (docs/analysis.md, "What each stage kept").
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from vlmtrace.analysis.registry import BY_NAME, INCONCLUSIVE, NO_GROWTH
from vlmtrace.analysis.robust import Slope
from vlmtrace.analysis.rules import MIN_BIRTH_REQUESTS, MIN_GROWTH_BYTES, MIN_HALF_REQUESTS, STEADY_RATIO
from vlmtrace.analysis.step2_preparing.heap_readings import STAGES
from vlmtrace.analysis.step3_verdict.heap_tags import Charges
from vlmtrace.analysis.step3_verdict.leaks import ComponentGrowth
from vlmtrace.analysis.units import format_bytes

MS = 1_000_000
GIVE_BACK = "the stage's last give-back"  # Kept.cut_at where the window ends there


@dataclasses.dataclass(frozen=True)
class Kept:
    """What one stage's chunks born in the window (from the process's first request to `until_ns`) kept."""

    requests: int  # requests started in the window
    first: float  # bytes per request, of those born in the window's first half (by requests)
    second: float  # the same of its second half
    until_ns: int
    cut_at: str  # what ends the window, in words

    @property
    def rate(self) -> float:
        return (self.first + self.second) / 2

    def steady(self) -> bool:
        """Both halves kept at a leak's rate, each at least STEADY_RATIO of the other's, and MIN_GROWTH_BYTES in all."""
        least = BY_NAME["host"].min_leak_rate
        low, high = sorted((self.first, self.second))
        return low >= least and low >= STEADY_RATIO * high and self.rate * self.requests >= MIN_GROWTH_BYTES


def kept_by(
    stage_position: int, survivors: tuple[int, dict], requests: pd.DataFrame, given_back_ns: int | None
) -> Kept | None:
    """What the stage at `stage_position` (of heap_readings.STAGES) kept of what it allocated in each half of the
    run, in bytes per request started in that half (`_per_request`). The window starts at the process's first
    request (the model's load and LMDeploy's warm-up before it are not the run's) and ends at the reading, or
    earlier: where requests were still running at the reading, where the first of them started (their work is
    still in use); where the stage gave its chunks back (`given_back_ns`: last_give_back_ns), there, since chunks
    born after it may be a working set the next give-back frees. `Kept.cut_at` says which. None where the window
    holds fewer than four intervals or a half fewer than MIN_HALF_REQUESTS requests."""
    read_ns, reading = survivors
    row = reading["bytes"][stage_position]
    if not row:
        return None
    starts = np.sort(requests["start_ns"].to_numpy(dtype=np.int64))
    ends = requests["end_ns"].to_numpy(dtype=np.int64)
    if not len(starts):
        return None
    until, cut_at = read_ns, "the reading"
    running = requests["start_ns"].to_numpy(dtype=np.int64)[ends > read_ns]
    if len(running) and running.min() < until:
        until, cut_at = int(running.min()), "the first request still running at the reading"
    if given_back_ns is not None and given_back_ns < until:
        until, cut_at = given_back_ns, GIVE_BACK
    started, born = _born_by_boundary(reading, row, starts, until)
    if len(started) < MIN_BIRTH_REQUESTS:
        return None
    middle = int(np.argmin(np.abs(started - (started[0] + started[-1]) / 2)))
    halves = (started[middle] - started[0], started[-1] - started[middle])
    if min(halves) < MIN_HALF_REQUESTS or middle in (0, len(started) - 1):
        return None
    first, second = (
        _per_request(started[: middle + 1], born[: middle + 1]),
        _per_request(started[middle:], born[middle:]),
    )
    if first is None or second is None:
        return None
    return Kept(int(started[-1] - started[0]), first, second, int(until), cut_at)


def _born_by_boundary(reading: dict, row: list, starts: np.ndarray, until: int) -> tuple[np.ndarray, np.ndarray]:
    """At each interval boundary from the first request (`starts`: the requests' starts, sorted) to `until`: the
    requests started before it, and the bytes born before it still in use at the reading (`row`: one stage's)."""
    width, origin = reading["width_ms"] * MS, reading["origin_ms"] * MS
    first = max(int(np.ceil((starts[0] - origin) / width)), 0)
    last = min(int((until - origin) // width), len(row))
    boundaries = np.arange(first, last + 1)
    born = np.concatenate([[0.0], np.cumsum(np.asarray(row, dtype=np.float64))])[boundaries]
    return np.searchsorted(starts, origin + boundaries * width, side="left"), born


def _per_request(started: np.ndarray, born: np.ndarray) -> float | None:
    """Bytes kept per request started: the least-squares line through the boundaries' (requests started, bytes
    born), not the ends' difference. Under load a call's requests start together and allocate one after another,
    so the bytes lag the starts by up to a call; a lag shifts the line without tilting it."""
    if np.ptp(started) <= 0:
        return None
    return float(np.polyfit(started.astype(np.float64), born, 1)[0])


def kept_curve(
    stage_position: int, survivors: tuple[int, dict], requests: pd.DataFrame
) -> tuple[np.ndarray, np.ndarray]:
    """For the report: at each interval boundary from the process's first request to the reading, the requests
    started before it and the bytes the stage allocated since the first request that it still held at the
    reading. A leak is a straight line; a cache dropping its oldest entries rises only at the end."""
    read_ns, reading = survivors
    starts = np.sort(requests["start_ns"].to_numpy(dtype=np.int64))
    if not len(starts):
        return np.empty(0), np.empty(0)
    started, born = _born_by_boundary(reading, reading["bytes"][stage_position] or [0], starts, read_ns)
    return started.astype(np.float64), born - born[0] if len(born) else born


def last_give_back_ns(levels: np.ndarray, t_ns: np.ndarray) -> int | None:
    """When a stage's chunks were last given back (`levels`, read at `t_ns`; the sampler's, every 100 ms by default:
    settled points under load are too few to find each give-back): a fall of MIN_GROWTH_BYTES or more over
    consecutive falling readings (the stage allocates on while it gives back, so one give-back can show as two
    smaller falls). The time of the reading before the fall; None where they never fell so."""
    known = np.isfinite(levels)
    levels, t_ns = levels[known], t_ns[known]
    last = None
    start = 0
    for index in range(1, len(levels) + 1):
        if index < len(levels) and levels[index] < levels[index - 1]:
            continue
        if levels[start] - levels[index - 1] >= MIN_GROWTH_BYTES:
            last = int(t_ns[start])
        start = index
    return last


def kept_by_stage(
    sampled: pd.DataFrame, stage: str | None, survivors: tuple[int, dict], requests: pd.DataFrame
) -> Kept | None:
    """What `stage` (a name of heap_tags.STAGES) kept of each half of the run (kept_by), up to its last give-back in
    the sampler's readings (`sampled`: the process's charges by stage, as sampled: heap_readings.by_stage_samples)."""
    if not stage or stage not in STAGES:
        return None
    return kept_by(
        STAGES.index(stage),
        survivors,
        requests,
        last_give_back_ns(sampled[stage].to_numpy(dtype=np.float64), sampled["t_ns"].to_numpy()),
    )


def with_kept_rates(
    charges: Charges, sampled: pd.DataFrame, survivors: tuple[int, dict] | None, requests: pd.DataFrame | None
) -> Charges:
    """`charges`, with what each stage that gave its chunks back kept per request read by when its chunks were
    allocated (kept_by_stage, the mean of its halves), where the last reading has it. The line through what each
    give-back left (heap_tags._kept_rate) runs through the few settled points near the give-backs, each holding the
    work in flight at that moment, so under load it can fall under half the resident slope that the working set's
    pages raise, and the stage goes unnamed (docs/analysis.md, "What each stage kept"). What was born in
    each half and is still in use at the end holds neither."""
    if survivors is None or requests is None or not charges.given_back:
        return charges
    kept = dict(charges.kept)
    for stage in charges.given_back:
        read = kept_by_stage(sampled, stage, survivors, requests)
        if read is not None:
            kept[stage] = read.rate
    return dataclasses.replace(charges, kept=kept)


def rate_kept(growth: ComponentGrowth, kept: Kept | None) -> Kept | None:
    """`kept`, where a host leak's rate is what its stage kept: its stage gave its chunks back, so their level has
    no rate to read (heap_tags.from_allocations), and it kept steadily up to its last give-back."""
    if growth.component == "host" and growth.grows and kept is not None and kept.steady() and kept.cut_at == GIVE_BACK:
        return kept
    return None


def survived(growth: ComponentGrowth, kept: Kept | None, allocated_where: str) -> str | None:
    """Why a host rise that resident memory left `inconclusive` or called level is a leak, or None: what its
    allocating stage allocated in each half of the run is still in use, at a leak's rate and as much in one half
    as in the other. Resident memory must have risen with 95 % confidence: a leak never stands beside an
    interval that holds zero."""
    if (
        growth.component != "host"
        or growth.klass not in (INCONCLUSIVE, NO_GROWTH)
        or growth.per_request.low <= 0
        or kept is None
        or not kept.steady()
    ):
        return None
    resident = growth.inconclusive_reason or growth.plateau_reason
    return (
        f"a leak by what its large heap chunks, allocated {allocated_where}, kept of each half of the run up to "
        f"{kept.cut_at}: {format_bytes(kept.first)} and {format_bytes(kept.second)} per request, still in use, where "
        f"resident memory, with the work in flight at each reading, could not tell ({resident})"
    )


def slope_reason(kept: Kept, allocated_where: str, resident_slope: float) -> str:
    """The verdict's words for a rate read from what the stage kept (`slope_from_survivors`)."""
    return (
        f"the rate is what the large heap chunks allocated {allocated_where} kept of each half of the run up to "
        f"{kept.cut_at} ({format_bytes(kept.first)} and {format_bytes(kept.second)} per request, still in use); "
        f"resident memory grew {format_bytes(resident_slope, signed=True)} per request, with the work in flight "
        f"and the working sets not given back yet at each reading"
    )


def read_from_survivors(growth: ComponentGrowth, kept: Kept) -> ComponentGrowth:
    """The leak at the rate its stage's chunks kept over the window, the two halves' rates its interval."""
    fit = growth.per_request
    per_second = growth.per_second
    if per_second is not None and fit.slope > 0:  # at the run's own request rate, as the resident slope's was
        per_second = dataclasses.replace(per_second, slope=per_second.slope * kept.rate / fit.slope)
    x, y = growth.x[growth.first_point :], growth.y[growth.first_point :]
    slope = Slope(
        kept.rate,
        min(kept.first, kept.second),
        max(kept.first, kept.second),
        float(np.median(y - kept.rate * x)),
        fit.points,
        fit.noise,
    )
    return dataclasses.replace(growth, trims=0, per_second=per_second, resident_fit=fit, per_request=slope)
