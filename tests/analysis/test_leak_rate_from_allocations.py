"""A host leak's rate from the large chunks its allocating stage keeps in use (heap_tags.leak_rate): where they
are what the heap grew by, and where resident memory has room for them (docs/analysis.md, "The leak's rate
from its allocating stage")."""

from __future__ import annotations

import numpy as np
import pandas as pd

from vlmtrace.analysis import heap_tags
from vlmtrace.analysis.robust import theil_sen
from vlmtrace.analysis.settle import SettledSeries

MiB = 1 << 20
POINTS = 40
STREAM = "engine.stream"


def settled(points: int = POINTS) -> SettledSeries:
    """One settled point a request, a second apart, each after a sample."""
    x = np.arange(1, points + 1, dtype=float)
    return SettledSeries("load", np.arange(points), x, (x * 1e9).astype(np.int64) + 500_000_000,
                         pd.DataFrame(index=range(points)), 8.0)


def charges(per_request: dict[str, float], points: int = POINTS, wobble: float = 0.0) -> pd.DataFrame:
    """Samples of the chunks in use by allocating stage, one before each settled point; `wobble`: the bytes
    of work in flight that come and go between samples."""
    rng = np.random.default_rng(1)
    frame = pd.DataFrame({"process": 0, "t_ns": (np.arange(1, points + 1) * 1e9).astype(np.int64)})
    for stage in heap_tags.STAGES:
        frame[stage] = np.arange(1, points + 1) * per_request.get(stage, 0.0) + rng.uniform(0, wobble, points)
    return frame


def resident(slope: float, spread: float):
    """A resident-memory fit: `slope` per request, its 95 % interval `spread` either side."""
    x = settled().x
    fit = theil_sen(x, 700 * MiB + slope * x)
    return type(fit)(slope, slope - spread, slope + spread, fit.intercept, fit.points, fit.noise)


def heap_levels(per_request: float, wobble: float = 0.0) -> np.ndarray:
    rng = np.random.default_rng(2)
    return 200 * MiB + settled().x * per_request + rng.uniform(0, wobble, POINTS)


def test_the_allocating_stages_chunks_give_the_rate_where_they_are_what_the_heap_grew_by():
    """Under load the settled levels carry the requests in flight: resident memory reads 0.61 MiB for a
    0.5 MiB leak (the fourth CPU table's engine-8x128), the stream's chunks in use 0.5."""
    fit = heap_tags.leak_rate(charges({STREAM: 0.5 * MiB}, wobble=0.2 * MiB), settled(), STREAM,
                              heap_levels(0.5 * MiB, wobble=3 * MiB), resident(0.61 * MiB, 0.05 * MiB))
    assert fit is not None and abs(fit.slope - 0.5 * MiB) < 0.02 * MiB
    assert fit.low <= fit.slope <= fit.high


def test_a_heap_that_grows_by_more_than_the_stages_chunks_leaves_resident_memory_the_rate():
    """Small blocks kept beside the chunks (a leak half of each): the chunks are half of what the heap grew by."""
    assert heap_tags.leak_rate(charges({STREAM: 0.55 * MiB}), settled(), STREAM, heap_levels(1.0 * MiB),
                               resident(1.05 * MiB, 0.05 * MiB)) is None


def test_chunks_above_what_resident_memory_allows_leave_it_the_rate():
    """Chunks malloc handed out that are not resident (never written): what the process holds is resident memory's."""
    assert heap_tags.leak_rate(charges({STREAM: 2 * MiB}), settled(), STREAM, heap_levels(2 * MiB),
                               resident(0.4 * MiB, 0.1 * MiB)) is None


def test_no_allocating_stage_or_too_few_samples_gives_no_rate():
    assert heap_tags.leak_rate(charges({STREAM: MiB}), settled(), None, heap_levels(MiB), resident(MiB, 0.1 * MiB)) is None
    few = charges({STREAM: MiB}).iloc[-3:]  # samples only after the first 37 points
    assert heap_tags.leak_rate(few, settled(), STREAM, heap_levels(MiB), resident(MiB, 0.1 * MiB)) is None
