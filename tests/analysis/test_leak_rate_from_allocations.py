"""A host leak read from the large chunks its allocating stage keeps in use (heap_tags.from_allocations): where
they are what the heap grew by and resident memory has room for them, they give the leak's rate; the class
stays resident memory's (docs/analysis.md, "The leak's rate from its allocating stage")."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import CPU_RUNS, GPU_RUNS
from vlmtrace.analysis.pipeline import analyze
from vlmtrace.analysis.readers.detect import read_inputs
from vlmtrace.analysis.registry import INCONCLUSIVE
from vlmtrace.analysis.step2_preparing.settle import SettledSeries
from vlmtrace.analysis.step3_verdict import heap_tags
from vlmtrace.analysis.step3_verdict.leaks import component_growth
from vlmtrace.report.figures import growth_figure

MiB = 1 << 20
POINTS = 60
STREAM = "engine.stream"


def settled(points: int = POINTS) -> SettledSeries:
    """One settled point a request, a second apart, each after a sample; all inputs alike."""
    x = np.arange(1, points + 1, dtype=float)
    features = pd.DataFrame(
        {
            "image_pixels_max": np.full(points, 1e5),
            "images_max": np.ones(points),
            "input_tokens_max": np.full(points, 300.0),
        }
    )
    return SettledSeries("load", np.arange(points), x, (x * 1e9).astype(np.int64) + 500_000_000, features, 8.0)


def charges(per_request: dict[str, float], wobble: float = 0.0) -> pd.DataFrame:
    """Samples of the chunks in use by allocating stage, one before each settled point; `wobble`: bytes of work
    in flight that come and go between samples."""
    rng = np.random.default_rng(1)
    counted = np.arange(1, POINTS + 1)
    frame = pd.DataFrame({"process": 0, "t_ns": (np.arange(1, POINTS + 1) * 1e9).astype(np.int64)})
    for stage in heap_tags.STAGES:
        frame[stage] = counted * per_request.get(stage, 0.0) + rng.uniform(0, wobble, POINTS)
    return frame


def resident_growth(per_request: float, wobble: float, inconclusive: bool = False):
    """The resident rise as leaks.component_growth reads it: `per_request` plus the work in flight; made
    inconclusive by a first half twice as steep (what LMDeploy's warm-up does to a short run)."""
    rng = np.random.default_rng(3)
    x = settled().x
    rise = (
        np.where(x <= POINTS / 2, 2 * per_request * x, per_request * (x + POINTS / 2))
        if inconclusive
        else per_request * x
    )
    growth = component_growth(0, "host", 700 * MiB + rise + rng.uniform(0, wobble, POINTS), settled())
    assert growth.klass == (INCONCLUSIVE if inconclusive else "host_growth")
    return growth


def at_points(samples: pd.DataFrame) -> heap_tags.Charges | None:
    return heap_tags.at_settled_points(samples, settled())


def heap_levels(per_request: float, wobble: float = 0.0) -> np.ndarray:
    rng = np.random.default_rng(2)
    return 200 * MiB + settled().x * per_request + rng.uniform(0, wobble, POINTS)


def test_a_leaks_rate_is_its_allocating_stages_chunks_where_they_are_what_the_heap_grew_by():
    """Under load the settled levels carry the requests in flight: resident memory reads over the leak (an
    engine-stage leak at 8 in flight over 128 requests: 0.61 MiB for 0.5), the stream's chunks in use do not."""
    resident = resident_growth(0.6 * MiB, 6 * MiB)
    read = heap_tags.from_allocations(
        resident,
        at_points(charges({STREAM: 0.5 * MiB}, wobble=0.2 * MiB)),
        STREAM,
        heap_levels(0.5 * MiB, wobble=3 * MiB),
    )
    assert read is not None and abs(read.per_request.slope - 0.5 * MiB) < 0.02 * MiB
    assert read.per_request.low <= read.per_request.slope <= read.per_request.high
    # its line is drawn through the resident levels, not the chunks'
    x = read.x[read.first_point :]
    assert abs(np.median(read.y[read.first_point :] - (read.per_request.intercept + read.per_request.slope * x))) < MiB


def test_a_heap_that_grows_by_more_than_the_stages_chunks_leaves_resident_memory_the_reading():
    """Small blocks kept beside the chunks (a leak half of each): the chunks are half of what the heap grew by."""
    assert (
        heap_tags.from_allocations(
            resident_growth(1.05 * MiB, MiB), at_points(charges({STREAM: 0.55 * MiB})), STREAM, heap_levels(1.0 * MiB)
        )
        is None
    )


def test_chunks_above_what_resident_memory_allows_leave_it_the_reading():
    """Chunks malloc handed out that are not resident (never written): what the process holds is resident memory's."""
    assert (
        heap_tags.from_allocations(
            resident_growth(0.4 * MiB, 0.2 * MiB), at_points(charges({STREAM: 2 * MiB})), STREAM, heap_levels(2 * MiB)
        )
        is None
    )


def test_a_rise_resident_memory_left_inconclusive_stays_so_however_steady_the_chunks():
    """A cache warming up can rise in its chunks as steadily as a leak over a short run (docs/analysis.md):
    the chunks give the rate of a leak resident memory called, never the class."""
    resident = resident_growth(0.5 * MiB, MiB, inconclusive=True)
    assert (
        heap_tags.from_allocations(resident, at_points(charges({STREAM: 0.5 * MiB})), STREAM, heap_levels(0.5 * MiB))
        is None
    )


def test_no_allocating_stage_or_too_few_samples_gives_no_reading():
    resident = resident_growth(MiB, MiB)
    assert heap_tags.from_allocations(resident, at_points(charges({STREAM: MiB})), None, heap_levels(MiB)) is None
    few = charges({STREAM: MiB}).iloc[-3:]  # samples only before the last three points
    assert heap_tags.at_settled_points(few, settled()) is None


def test_a_recorded_run_reads_its_leak_from_the_streams_chunks_and_every_view_shows_that_rate():
    """0.5 MiB a request kept by the TurboMind stream at 16 in flight, recorded on the CPU with the heap counter:
    resident memory read 0.596 MiB a request, the stream's chunks 0.507."""
    journal = CPU_RUNS / "cpu-tm-host-engine-16x112-0.5MiB-heap"
    analysis = analyze(read_inputs([str(journal)]))
    verdict = next(v for v in analysis.summary.verdicts if v.component == "host")
    assert verdict.klass == "host_growth" and verdict.stage == STREAM
    assert abs(verdict.slope_bytes_per_request - 0.5 * MiB) <= 0.05 * MiB
    assert verdict.evidence["resident_slope_bytes_per_request"] > 0.55 * MiB
    assert "engine.stream" in verdict.evidence["slope_from_allocations"]
    low, high = verdict.slope_interval_bytes_per_request
    assert 0 < low <= verdict.slope_bytes_per_request <= high
    # `vlmtrace diff` and the growth figure read the same rise, and the figure shows the chunks it was read from
    growth = next(item for item in analysis.growth if item.component == "host")
    assert growth.per_request.slope == verdict.slope_bytes_per_request
    chunks = next(
        trace for trace in growth_figure(analysis).data if trace.name == "large heap chunks allocated in engine.stream"
    )
    kept = (chunks.y[-1] - chunks.y[0]) / (chunks.x[-1] - chunks.x[0])  # MiB per request
    assert abs(kept - 0.5) < 0.05


DATA = Path(__file__).parent / "data"
EIGHT_IN_FLIGHT = [  # 0.5 MiB a request of host memory kept at 8 prompts in flight
    GPU_RUNS / "pt-host-engine-8x144-0.5MiB.jsonl.gz",  # PyTorch engine, 144 requests
    GPU_RUNS / "tm-host-engine-8x120-0.5MiB.jsonl.gz",  # TurboMind, 120 requests
    GPU_RUNS / "tm-host-vision.preprocess-8x112-0.5MiB.jsonl.gz",
    CPU_RUNS / "cpu-tm-hostgiveback-vision.preprocess-8x120-0.5MiB-heap",  # given back and rebuilt
    CPU_RUNS / "cpu-tm-host-prompt-8x160-0.5MiB",  # resident memory alone, without the heap counter, 160 requests
]


@pytest.mark.parametrize("journal", EIGHT_IN_FLIGHT, ids=lambda path: path.name.split(".jsonl")[0])
def test_a_half_mib_host_leak_at_eight_in_flight_is_read_within_ten_percent_in_160_requests(journal: Path):
    analysis = analyze(read_inputs([str(journal)]))
    verdict = next(v for v in analysis.summary.verdicts if v.component == "host")
    assert analysis.summary.requests <= 160
    assert verdict.klass == "host_growth"
    assert abs(verdict.slope_bytes_per_request - 0.5 * MiB) <= 0.05 * MiB
